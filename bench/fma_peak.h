/* fma_peak.h - the machine's measured multiply-add peak: every thread runs
 * a short loop of independent vector FMAs (12 chains, enough to hide the
 * latency of two FMA ports) on the widest vectors the CPU has (AVX-512,
 * else AVX2 + FMA; other CPUs: plain float code the compiler vectorises),
 * counted as 2 flops per lane per FMA. Header only, for the benchmarks. */
#ifndef TS_BENCH_FMA_PEAK_H
#define TS_BENCH_FMA_PEAK_H

#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "bench_util.h"

#define FMA_CHAINS 12

#if defined(__x86_64__)
#include <immintrin.h>

/* iters x 12 FMAs of 16 floats; returns a value that depends on them all. */
__attribute__((target("avx512f"))) static inline float fma_loop_avx512(int64_t iters) {
    __m512 acc[FMA_CHAINS], a = _mm512_set1_ps(0.9999f), b = _mm512_set1_ps(1e-7f);
    for (int j = 0; j < FMA_CHAINS; j++) acc[j] = _mm512_set1_ps((float)j);
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < FMA_CHAINS; j++) acc[j] = _mm512_fmadd_ps(acc[j], a, b);
    float s = 0, lane[16];
    for (int j = 0; j < FMA_CHAINS; j++) {
        _mm512_storeu_ps(lane, acc[j]);
        s += lane[0];
    }
    return s;
}

/* iters x 12 FMAs of 8 floats. */
__attribute__((target("avx2,fma"))) static inline float fma_loop_avx2(int64_t iters) {
    __m256 acc[FMA_CHAINS], a = _mm256_set1_ps(0.9999f), b = _mm256_set1_ps(1e-7f);
    for (int j = 0; j < FMA_CHAINS; j++) acc[j] = _mm256_set1_ps((float)j);
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < FMA_CHAINS; j++) acc[j] = _mm256_fmadd_ps(acc[j], a, b);
    float s = 0, lane[8];
    for (int j = 0; j < FMA_CHAINS; j++) {
        _mm256_storeu_ps(lane, acc[j]);
        s += lane[0];
    }
    return s;
}
#endif

/* iters x 12 multiply-adds of 8 floats in portable code. */
static inline float fma_loop_plain(int64_t iters) {
    float acc[FMA_CHAINS][8];
    for (int j = 0; j < FMA_CHAINS; j++)
        for (int l = 0; l < 8; l++) acc[j][l] = (float)j;
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < FMA_CHAINS; j++)
            for (int l = 0; l < 8; l++) acc[j][l] = acc[j][l] * 0.9999f + 1e-7f;
    float s = 0;
    for (int j = 0; j < FMA_CHAINS; j++) s += acc[j][0];
    return s;
}

/* The vector ISA fma_peak_gflops uses: "avx512", "avx2" or "plain". */
static inline const char *fma_peak_isa(void) {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx512f")) return "avx512";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "avx2";
#endif
    return "plain";
}

/* GFLOP/s of `threads` threads each running the loop (best of 3 runs of
 * 480 M FMAs per thread, about 0.1 s on a 2.5 GHz core with two FMA
 * ports). */
static inline double fma_peak_gflops(int threads) {
    const char *isa = fma_peak_isa();
    int lanes = !strcmp(isa, "avx512") ? 16 : 8;
    const int64_t iters = 40 * 1000 * 1000;
    double best = 0;
    volatile float sink = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = bench_now_ms();
#pragma omp parallel num_threads(threads)
        {
            float s;
#if defined(__x86_64__)
            if (!strcmp(isa, "avx512")) s = fma_loop_avx512(iters);
            else if (!strcmp(isa, "avx2")) s = fma_loop_avx2(iters);
            else
#endif
                s = fma_loop_plain(iters);
#pragma omp atomic
            sink += s;
        }
        double secs = (bench_now_ms() - t0) / 1e3;
        double gflops = (double)threads * (double)iters * FMA_CHAINS * lanes * 2 / secs / 1e9;
        if (gflops > best) best = gflops;
    }
    (void)sink;
    return best;
}

#endif
