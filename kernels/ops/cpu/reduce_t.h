/* reduce_t.h - sum and max over the middle of [outer, red, inner] for one
 * dtype (a dtype template, see cpu.h; included by reduce.c). Sums are
 * accumulated in double. */
#include "kernels/ops/cpu/dtype.h"

/* out[o, i] = scale * sum over r of x[o, r, i]. */
static void FN(sum)(const T *x, T *out, int64_t outer, int64_t red, int64_t inner, double scale) {
    if (inner == 1 && outer == 1) {
        double s = 0;
#pragma omp parallel for reduction(+ : s) if (red > TS_PAR_MIN)
        for (int64_t r = 0; r < red; r++) s += x[r];
        out[0] = (T)(s * scale);
        return;
    }
    if (inner == 1) {
#pragma omp parallel for if (outer * red > TS_PAR_MIN)
        for (int64_t o = 0; o < outer; o++) {
            const T *src = x + o * red;
            double s = 0;
#pragma omp simd reduction(+ : s)
            for (int64_t r = 0; r < red; r++) s += src[r];
            out[o] = (T)(s * scale);
        }
        return;
    }
    /* blocks of BLOCK inner elements, each summed over red in registers */
    int64_t nb = (inner + BLOCK - 1) / BLOCK;
#pragma omp parallel for if (outer * red * inner > TS_PAR_MIN)
    for (int64_t t = 0; t < outer * nb; t++) {
        int64_t o = t / nb, i0 = (t % nb) * BLOCK, m = inner - i0 < BLOCK ? inner - i0 : BLOCK;
        const T *src = x + o * red * inner + i0;
        double acc[BLOCK];
        for (int64_t i = 0; i < m; i++) acc[i] = 0;
        for (int64_t r = 0; r < red; r++) {
            const T *row = src + r * inner;
#pragma omp simd
            for (int64_t i = 0; i < m; i++) acc[i] += row[i];
        }
        T *dst = out + o * inner + i0;
        for (int64_t i = 0; i < m; i++) dst[i] = (T)(acc[i] * scale);
    }
}

/* out[o, i] = max over r of x[o, r, i] (red >= 1) and idx the first r
 * reaching it; a NaN wins and stays. */
static void FN(max)(const T *x, T *out, int64_t *idx, int64_t outer, int64_t red, int64_t inner) {
    int64_t nb = (inner + BLOCK - 1) / BLOCK;
#pragma omp parallel for if (outer * red * inner > TS_PAR_MIN)
    for (int64_t t = 0; t < outer * nb; t++) {
        int64_t o = t / nb, i0 = (t % nb) * BLOCK, m = inner - i0 < BLOCK ? inner - i0 : BLOCK;
        const T *src = x + o * red * inner + i0;
        T *best = out + o * inner + i0;
        int64_t *at = idx + o * inner + i0;
        for (int64_t i = 0; i < m; i++) {
            best[i] = src[i];
            at[i] = 0;
        }
        for (int64_t r = 1; r < red; r++) {
            const T *row = src + r * inner;
            for (int64_t i = 0; i < m; i++) {
                T v = row[i];
                if (v > best[i] || (v != v && best[i] == best[i])) {
                    best[i] = v;
                    at[i] = r;
                }
            }
        }
    }
}

/* gx = 0 except gx[o, idx[o, i], i] = g[o, i]. */
static void FN(max_backward)(const T *g, const int64_t *idx, T *gx, int64_t outer, int64_t red, int64_t inner) {
    memset(gx, 0, sizeof(T) * (size_t)(outer * red * inner));
#pragma omp parallel for if (outer * inner > TS_PAR_MIN)
    for (int64_t k = 0; k < outer * inner; k++) {
        int64_t o = k / inner, i = k % inner;
        gx[(o * red + idx[k]) * inner + i] = g[k];
    }
}
