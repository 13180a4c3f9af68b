/* fsdp_checkpoint.h - sharded checkpoints: what each FSDP rank writes, and
 * reading any part of the model back from them at any world size.
 *
 * A sharded checkpoint is an ordinary checkpoint folder (kernels/io/
 * checkpoint.h: state.json with the step, loader position and job, and
 * model/optim weights files, empty here) whose state.json lists one more
 * file per rank, shard-<r>.safetensors, with its size and CRC, and whose
 * "extra" holds the layout: {"fsdp": {"world": W, "numel": N, "slots": k,
 * "units": [[lo, hi], ...]}}. Rank r's file holds "params" [n_r] and
 * "state" [k, n_r] (AdamW m then v): the real elements of its shard of
 * every unit, unit after unit (ts_plan_shard_range of each unit with W
 * shards). From the layout any flat range [lo, hi) can be read back, so a
 * run resumes at another world size (or in one process) and
 * `tessera-run --consolidate` writes the whole model.
 */
#ifndef TS_WORKER_FSDP_CHECKPOINT_H
#define TS_WORKER_FSDP_CHECKPOINT_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/io/checkpoint.h"
#include "kernels/nn/model.h"
#include "sharding/plan.h"

/* The units and world a sharded checkpoint was written with. */
typedef struct {
    int world;
    int slots;       /* optimizer state floats per element */
    int64_t numel;
    int n_units;
    ts_range *units; /* [offset, offset + len) of the flat buffer each */
} ts_fsdp_layout;

/* The "extra" object's text for layout l (malloc'd; free it). */
char *ts_fsdp_layout_json(const ts_fsdp_layout *l);

/* Reads the layout of checkpoint ck into *l (free with
 * ts_fsdp_layout_free); *sharded false (and nothing read) when ck is a
 * whole checkpoint. A bad layout is an error naming the field. */
ts_status ts_fsdp_layout_read(const ts_checkpoint *ck, ts_fsdp_layout *l, bool *sharded);

void ts_fsdp_layout_free(ts_fsdp_layout *l);

/* The name of rank r's file ("shard-<r>.safetensors") into name (cap bytes). */
void ts_fsdp_shard_name(int r, char *name, size_t cap);

/* Writes rank r's file into folder dir: the real elements of its shards,
 * unit after unit, taken from params (and state, slot s of element i at
 * state[s * stride + i]) by the offsets given per unit in at (where unit
 * u's shard starts in the buffers). */
ts_status ts_fsdp_write_shard(const char *dir, const ts_fsdp_layout *l, int r, int64_t step, const float *params,
                              const float *state, int64_t stride, const int64_t *at);

/* Reads flat elements [lo, lo + len) of the parameters into params and of
 * the state into state (slot s at state[s * stride + i]; NULL: none) from
 * sharded checkpoint ck of layout l. */
ts_status ts_fsdp_read_range(const ts_checkpoint *ck, const ts_fsdp_layout *l, int64_t lo, int64_t len,
                             float *params, float *state, int64_t stride);

/* Reads the whole model (master values) and, when m->state is there, its
 * optimizer state from sharded checkpoint ck, on any device (through host
 * memory); its numel must match. */
ts_status ts_fsdp_read_model(const ts_checkpoint *ck, ts_model *m);

#endif
