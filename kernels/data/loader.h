/* loader.h - DataLoader: batches, per-epoch shuffle, sharding, prefetch.
 *
 * Each epoch e orders the N samples by a permutation drawn from the Philox
 * key fold_in(key_from_seed(seed), e) (identity without shuffle). Sharding
 * follows PyTorch's DistributedSampler: rank r of W takes global positions
 * p + r, p + r + W, ...; without drop_last the tail is padded by wrapping
 * (position g beyond N reads sample perm[g mod N]) so every rank gets
 * ceil(remaining / W) samples and the same number of batches, and across
 * ranks every sample is seen once per epoch (plus the wrapped pad); with
 * drop_last every rank gets floor(remaining / W) (DistributedSampler's
 * drop_last), so that W ranks at batch b take the very batches of one rank
 * at batch W * b, none padded.
 *
 * The position is (epoch, offset): offset counts samples consumed globally
 * in this epoch (it grows by batch * W per step of all ranks), so it is the
 * same on every rank. A loader restored to a position, or re-sharded to a
 * new (rank, world), continues with the remaining samples perm[offset..N)
 * of the same epoch. Batches run on across epochs; the batch that ends an
 * epoch says so. drop_last drops each rank's final incomplete batch.
 *
 * With prefetch > 0 a thread fills a queue of that many batches ahead; the
 * batches are identical to those without it. The loader borrows the dataset.
 */
#ifndef TS_DATA_LOADER_H
#define TS_DATA_LOADER_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/data/dataset.h"

typedef struct {
    int64_t epoch;
    int64_t offset; /* samples consumed globally in this epoch */
} ts_loader_pos;

typedef struct {
    int64_t batch_size; /* per rank */
    bool shuffle;
    uint64_t seed;
    bool drop_last;
    int rank, world; /* world 0 means 1 */
    int prefetch;    /* batches prepared ahead by a thread; 0: no thread */
} ts_loader_config;

typedef struct {
    ts_tensor *x, *y;    /* [size, sample shape...] contiguous */
    int64_t size;        /* rows (batch_size, or fewer for a last batch) */
    ts_loader_pos start; /* position before this batch */
    ts_loader_pos next;  /* position after it */
    bool last_in_epoch;
} ts_batch;

typedef struct ts_loader ts_loader;

/* A loader over ds (borrowed; must outlive the loader) at position (0, 0). */
ts_loader *ts_loader_create(const ts_dataset *ds, const ts_loader_config *cfg);
/* Stops the prefetch thread and frees the loader (NULL is a no-op). */
void ts_loader_free(ts_loader *l);

/* The next batch for this rank; the caller releases it with ts_batch_release. */
ts_status ts_loader_next(ts_loader *l, ts_batch *b);
void ts_batch_release(ts_batch *b);

/* Position after the last batch handed out (what a checkpoint saves). */
ts_loader_pos ts_loader_position(const ts_loader *l);
/* Continues from pos (0 <= offset <= N); queued batches are discarded. */
ts_status ts_loader_set_position(ts_loader *l, ts_loader_pos pos);
/* Switches to a new (rank, world) keeping the position. */
ts_status ts_loader_reshard(ts_loader *l, int rank, int world);

/* Batches this rank gets in a whole epoch / in the rest of the current one. */
int64_t ts_loader_batches_per_epoch(const ts_loader *l);
int64_t ts_loader_batches_left(const ts_loader *l);

/* Number of samples in the dataset. */
int64_t ts_loader_length(const ts_loader *l);

#endif
