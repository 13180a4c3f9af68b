/* rng.h - counter-based random numbers (Philox 4x32-10) with explicit keys.
 *
 * A ts_key is a value, like a JAX PRNG key: the same key gives the same
 * numbers on every rank, thread count and device, because element i of a
 * random tensor depends only on (key, i). Splitting a key yields independent
 * child keys; folding in an integer (a step, a rank, a layer index) derives a
 * key for that purpose. Never reuse one key for two different purposes.
 */
#ifndef TS_RNG_H
#define TS_RNG_H

#include <stdint.h>

typedef struct {
    uint32_t k[2];
} ts_key;

/* A key from a 64-bit seed. */
ts_key ts_key_from_seed(uint64_t seed);

/* The i-th of the independent children of key (i = 0, 1, ...). */
ts_key ts_key_split(ts_key key, uint64_t i);

/* A key derived from key and data (e.g. the step number). */
ts_key ts_key_fold_in(ts_key key, uint64_t data);

/* The 64-bit FNV-1a hash of text: the same on every machine and build
 * (a parameter's name folded into its key, a job's fingerprint). */
uint64_t ts_hash_text(const char *text);

/* One Philox 4x32-10 block: the four 32-bit words for counter ctr. */
void ts_philox(ts_key key, const uint32_t ctr[4], uint32_t out[4]);

/* The n values out[i] = U[0,1) for stream positions start .. start+n-1. */
void ts_rng_uniform_f32(ts_key key, uint64_t start, int64_t n, float *out);
void ts_rng_uniform_f64(ts_key key, uint64_t start, int64_t n, double *out);

/* Standard normal values for stream positions start .. start+n-1. */
void ts_rng_normal_f32(ts_key key, uint64_t start, int64_t n, float *out);
void ts_rng_normal_f64(ts_key key, uint64_t start, int64_t n, double *out);

/* A uniform random integer in [0, bound) for stream position i. */
uint64_t ts_rng_below(ts_key key, uint64_t i, uint64_t bound);

#endif
