/* rows_t.h - the row kernels of one dtype (a dtype template, see cpu.h;
 * included by rows.c): softmax, layernorm, cross-entropy, mse, embedding
 * and dropout. Rows are spread over the threads; each is done whole, its
 * inner loops vectorised. */
#include "kernels/ops/cpu/dtype.h"

/* ---- softmax ---- */

/* y = softmax (or log_softmax when lg) of R contiguous rows of n. */
static void FN(softmax)(const T *x, T *y, int64_t R, int64_t n, bool lg) {
#pragma omp parallel for schedule(static) if (R * n > TS_PAR_MIN)
    for (int64_t r = 0; r < R; r++) {
        const T *xr = x + r * n;
        T *yr = y + r * n;
        T m = ROW_MAX(xr, n), s = ROW_EXP(xr, yr, n, m);
        if (lg) {
            T l = m + (T)log((double)s);
            SIMD() for (int64_t j = 0; j < n; j++) yr[j] = xr[j] - l;
        } else {
            T inv = (T)1 / s;
            SIMD() for (int64_t j = 0; j < n; j++) yr[j] *= inv;
        }
    }
}

/* gx from the output gradient g and the saved output y. */
static void FN(softmax_backward)(const T *y, const T *g, T *gx, int64_t R, int64_t n, bool lg) {
#pragma omp parallel for schedule(static) if (R * n > TS_PAR_MIN)
    for (int64_t r = 0; r < R; r++) {
        const T *yr = y + r * n, *gr = g + r * n;
        T *dr = gx + r * n, acc = 0;
        if (lg) {
            SIMD(reduction(+ : acc)) for (int64_t j = 0; j < n; j++) acc += gr[j];
            SIMD() for (int64_t j = 0; j < n; j++) dr[j] = gr[j] - EXP(yr[j]) * acc;
        } else {
            SIMD(reduction(+ : acc)) for (int64_t j = 0; j < n; j++) acc += gr[j] * yr[j];
            SIMD() for (int64_t j = 0; j < n; j++) dr[j] = yr[j] * (gr[j] - acc);
        }
    }
}

/* ---- layernorm ---- */

/* y = (x - mean) rstd w + b over R rows of D (w and b may be NULL). */
static void FN(layernorm)(const T *x, const T *w, const T *b, T *y, T *mean, T *rstd, int64_t R, int64_t D, T eps) {
#pragma omp parallel for schedule(static) if (R * D > TS_PAR_MIN)
    for (int64_t r = 0; r < R; r++) {
        const T *xr = x + r * D;
        T *yr = y + r * D;
        T s = 0, v = 0;
        SIMD(reduction(+ : s)) for (int64_t j = 0; j < D; j++) s += xr[j];
        T mu = s / (T)D;
        SIMD(reduction(+ : v)) for (int64_t j = 0; j < D; j++) v += (xr[j] - mu) * (xr[j] - mu);
        T rs = (T)1 / (T)sqrt((double)(v / (T)D + eps));
        mean[r] = mu;
        rstd[r] = rs;
        if (w && b) {
            SIMD() for (int64_t j = 0; j < D; j++) yr[j] = (xr[j] - mu) * rs * w[j] + b[j];
        } else {
            SIMD() for (int64_t j = 0; j < D; j++) yr[j] = (xr[j] - mu) * rs * (w ? w[j] : (T)1) + (b ? b[j] : (T)0);
        }
    }
}

/* dx (when wanted) row by row, and each thread's sums of g * xhat and g
 * into its slot of part ([threads][2][D], zeroed). */
static void FN(layernorm_rows)(const T *x, const T *w, const T *mean, const T *rstd, const T *g, T *dx, T *part,
                               int64_t R, int64_t D) {
#pragma omp parallel if (R * D > TS_PAR_MIN)
    {
        T *dw = part + (int64_t)omp_get_thread_num() * 2 * D, *db = dw + D;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < R; r++) {
            const T *xr = x + r * D, *gr = g + r * D;
            T mu = mean[r], rs = rstd[r], a = 0, c = 0;
            SIMD(reduction(+ : a, c)) for (int64_t j = 0; j < D; j++) {
                T xh = (xr[j] - mu) * rs, gw = gr[j] * (w ? w[j] : (T)1);
                a += gw;
                c += gw * xh;
                dw[j] += gr[j] * xh;
                db[j] += gr[j];
            }
            a /= (T)D;
            c /= (T)D;
            if (dx) {
                T *dr = dx + r * D;
                SIMD() for (int64_t j = 0; j < D; j++) {
                    T xh = (xr[j] - mu) * rs;
                    dr[j] = rs * (gr[j] * (w ? w[j] : (T)1) - a - xh * c);
                }
            }
        }
    }
}

/* dw and db (either may be NULL) = the threads' partial sums, added in
 * thread order. */
static void FN(layernorm_sums)(const T *part, int nthreads, T *dw, T *db, int64_t D) {
    for (int k = 0; k < 2; k++) {
        T *out = k ? db : dw;
        if (!out) continue;
        memcpy(out, part + k * D, sizeof(T) * (size_t)D);
        for (int t = 1; t < nthreads; t++) {
            const T *src = part + ((int64_t)t * 2 + k) * D;
            SIMD() for (int64_t j = 0; j < D; j++) out[j] += src[j];
        }
    }
}

/* ---- losses ---- */

/* lse per row of N x C and the summed loss of rows whose target is not ign. */
static double FN(cross_entropy)(const T *x, const int64_t *t, T *lse, int64_t N, int64_t C, int64_t ign) {
    double total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total) if (N * C > TS_PAR_MIN)
    for (int64_t r = 0; r < N; r++) {
        const T *xr = x + r * C;
        T m = ROW_MAX(xr, C), s = 0;
        SIMD(reduction(+ : s)) for (int64_t j = 0; j < C; j++) s += EXP(xr[j] - m);
        lse[r] = m + (T)log((double)s);
        if (t[r] != ign) total += (double)(lse[r] - xr[t[r]]);
    }
    return total;
}

/* gx = (softmax - onehot) scale, zero rows for ignored targets. */
static void FN(cross_entropy_backward)(const T *x, const int64_t *t, const T *lse, T *gx, int64_t N, int64_t C,
                                       int64_t ign, T scale) {
#pragma omp parallel for schedule(static) if (N * C > TS_PAR_MIN)
    for (int64_t r = 0; r < N; r++) {
        const T *xr = x + r * C;
        T *gr = gx + r * C, l = lse[r];
        if (t[r] == ign) {
            for (int64_t j = 0; j < C; j++) gr[j] = 0;
            continue;
        }
        SIMD() for (int64_t j = 0; j < C; j++) gr[j] = EXP(xr[j] - l) * scale;
        gr[t[r]] -= scale;
    }
}

/* Sum of squared differences: chunks summed in T, added in double. */
static double FN(mse)(const T *a, const T *b, int64_t n) {
    double total = 0;
    int64_t chunks = (n + MSE_CHUNK - 1) / MSE_CHUNK;
#pragma omp parallel for schedule(static) reduction(+ : total) if (n > TS_PAR_MIN)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t lo = c * MSE_CHUNK, hi = lo + MSE_CHUNK < n ? lo + MSE_CHUNK : n;
        T part = 0;
        SIMD(reduction(+ : part)) for (int64_t i = lo; i < hi; i++) part += (a[i] - b[i]) * (a[i] - b[i]);
        total += (double)part;
    }
    return total;
}

/* ga = 2 (a - b) scale, gb = -ga (either may be NULL). */
static void FN(mse_backward)(const T *a, const T *b, T *ga, T *gb, int64_t n, T scale) {
#pragma omp parallel for schedule(static) if (n > TS_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        T d = 2 * (a[i] - b[i]) * scale;
        if (ga) ga[i] = d;
        if (gb) gb[i] = -d;
    }
}

/* ---- embedding, dropout ---- */

/* gt = 0 plus g[i] at row idx[i]: serial over the indices (repeated ones
 * would race), each row's D vectorised. */
static void FN(embedding_backward)(const int64_t *idx, const T *g, T *gt, int64_t n, int64_t V, int64_t D) {
    memset(gt, 0, sizeof(T) * (size_t)(V * D));
    for (int64_t i = 0; i < n; i++) {
        T *dst = gt + idx[i] * D;
        const T *src = g + i * D;
        SIMD() for (int64_t j = 0; j < D; j++) dst[j] += src[j];
    }
}

/* y = x keep(key, i) scale, the random stream drawn a chunk at a time. */
static void FN(dropout)(ts_key key, const T *x, T *y, int64_t n, float p, T scale) {
    int64_t nc = (n + DROPOUT_CHUNK - 1) / DROPOUT_CHUNK;
#pragma omp parallel for if (n > TS_PAR_MIN)
    for (int64_t c = 0; c < nc; c++) {
        float u[DROPOUT_CHUNK];
        int64_t i0 = c * DROPOUT_CHUNK, m = n - i0 < DROPOUT_CHUNK ? n - i0 : DROPOUT_CHUNK;
        ts_rng_uniform_f32(key, (uint64_t)i0, m, u);
        for (int64_t j = 0; j < m; j++) y[i0 + j] = u[j] >= p ? x[i0 + j] * scale : (T)0;
    }
}
