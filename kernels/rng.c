/* rng.c - Philox 4x32-10 and the uniform/normal streams built on it. */
#include "kernels/rng.h"

#include <math.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

/* Domain tags keep split, fold-in and sampling counters apart. */
#define TAG_SPLIT 0x53504C54u
#define TAG_FOLD 0x464F4C44u
#define TAG_SEED 0x53454544u

void ts_philox(ts_key key, const uint32_t ctr[4], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key.k[0], k1 = key.k[1];
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0;
        c1 = (uint32_t)p1;
        c2 = n2;
        c3 = (uint32_t)p0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* A new key from one Philox block over (a, b, tag). */
static ts_key derive(ts_key key, uint64_t data, uint32_t tag) {
    uint32_t ctr[4] = {(uint32_t)data, (uint32_t)(data >> 32), 0, tag};
    uint32_t out[4];
    ts_philox(key, ctr, out);
    ts_key k = {{out[0], out[1]}};
    return k;
}

ts_key ts_key_from_seed(uint64_t seed) {
    ts_key base = {{(uint32_t)seed, (uint32_t)(seed >> 32)}};
    return derive(base, 0, TAG_SEED);
}

ts_key ts_key_split(ts_key key, uint64_t i) { return derive(key, i, TAG_SPLIT); }

ts_key ts_key_fold_in(ts_key key, uint64_t data) { return derive(key, data, TAG_FOLD); }

uint64_t ts_hash_text(const char *text) {
    uint64_t h = 14695981039346656037ULL;
    for (const unsigned char *c = (const unsigned char *)text; *c; c++) h = (h ^ *c) * 1099511628211ULL;
    return h;
}

/* The four words of block b of key's sampling stream. */
static void block(ts_key key, uint64_t b, uint32_t out[4]) {
    uint32_t ctr[4] = {(uint32_t)b, (uint32_t)(b >> 32), 0, 0};
    ts_philox(key, ctr, out);
}

static float u32_to_unit_f32(uint32_t x) { return (float)(x >> 8) * (1.0f / 16777216.0f); }

static double u64_to_unit_f64(uint32_t hi, uint32_t lo) {
    uint64_t x = ((uint64_t)hi << 32 | lo) >> 11;
    return (double)x * (1.0 / 9007199254740992.0);
}

void ts_rng_uniform_f32(ts_key key, uint64_t start, int64_t n, float *out) {
#pragma omp parallel for if (n > 65536)
    for (int64_t j = 0; j < n; j++) {
        uint64_t i = start + (uint64_t)j;
        uint32_t w[4];
        block(key, i / 4, w);
        out[j] = u32_to_unit_f32(w[i % 4]);
    }
}

void ts_rng_uniform_f64(ts_key key, uint64_t start, int64_t n, double *out) {
#pragma omp parallel for if (n > 65536)
    for (int64_t j = 0; j < n; j++) {
        uint64_t i = start + (uint64_t)j;
        uint32_t w[4];
        block(key, i / 2, w);
        out[j] = i % 2 ? u64_to_unit_f64(w[2], w[3]) : u64_to_unit_f64(w[0], w[1]);
    }
}

/* Box-Muller: block i/2 gives two uniforms per pair; element i takes the
 * cosine or sine branch of its pair. Computed in double for both dtypes. */
static double normal_at(ts_key key, uint64_t i) {
    uint32_t w[4];
    block(key, i / 2, w);
    double u1 = u64_to_unit_f64(w[0], w[1]);
    double u2 = u64_to_unit_f64(w[2], w[3]);
    double r = sqrt(-2.0 * log(1.0 - u1));
    double t = 2.0 * M_PI * u2;
    return i % 2 ? r * sin(t) : r * cos(t);
}

void ts_rng_normal_f32(ts_key key, uint64_t start, int64_t n, float *out) {
#pragma omp parallel for if (n > 65536)
    for (int64_t j = 0; j < n; j++) out[j] = (float)normal_at(key, start + (uint64_t)j);
}

void ts_rng_normal_f64(ts_key key, uint64_t start, int64_t n, double *out) {
#pragma omp parallel for if (n > 65536)
    for (int64_t j = 0; j < n; j++) out[j] = normal_at(key, start + (uint64_t)j);
}

uint64_t ts_rng_below(ts_key key, uint64_t i, uint64_t bound) {
    uint32_t w[4];
    block(key, i, w);
    uint64_t x = (uint64_t)w[0] << 32 | w[1];
    return bound ? x % bound : 0;
}
