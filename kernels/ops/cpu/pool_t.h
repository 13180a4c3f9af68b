/* pool_t.h - max and average pooling of one dtype (a dtype template, see
 * cpu.h; included by pool.c). Planes are spread over the threads. */
#include "kernels/ops/cpu/dtype.h"

/* The common 2x2 window, stride 2, no padding: the same comparisons in the
 * same order as the general loop, with fixed trip counts. */
static void FN(max2)(const ts_pool_geom *g, const T *x, T *out, int32_t *idx) {
#pragma omp parallel for schedule(static) if (g->planes * g->Ho * g->Wo > POOL_OMP_MIN)
    for (int64_t p = 0; p < g->planes; p++) {
        const T *xp = x + p * g->H * g->W;
        for (int64_t oh = 0; oh < g->Ho; oh++) {
            const T *r0 = xp + 2 * oh * g->W, *r1 = r0 + g->W;
            T *o = out + (p * g->Ho + oh) * g->Wo;
            int32_t *io = idx ? idx + (p * g->Ho + oh) * g->Wo : NULL;
            int64_t base = 2 * oh * g->W;
#pragma omp simd
            for (int64_t ow = 0; ow < g->Wo; ow++) {
                T v[4] = {r0[2 * ow], r0[2 * ow + 1], r1[2 * ow], r1[2 * ow + 1]}, best = v[0];
                int64_t bi = 0;
                for (int k = 1; k < 4; k++) {
                    bool take = (v[k] > best) | (v[k] != v[k]);
                    bi = take ? k : bi;
                    best = take ? v[k] : best;
                }
                o[ow] = best;
                if (io) io[ow] = (int32_t)(base + (bi >> 1) * g->W + 2 * ow + (bi & 1));
            }
        }
    }
}

/* out = the max of each window, idx (when not NULL) its plane index. */
static void FN(max)(const ts_pool_geom *g, const T *x, T *out, int32_t *idx) {
    if (g->kh == 2 && g->kw == 2 && g->sh == 2 && g->sw == 2 && g->ph == 0 && g->pw == 0) {
        FN(max2)(g, x, out, idx);
        return;
    }
#pragma omp parallel for schedule(static) if (g->planes * g->Ho * g->Wo > POOL_OMP_MIN)
    for (int64_t p = 0; p < g->planes; p++) {
        const T *xp = x + p * g->H * g->W;
        for (int64_t oh = 0; oh < g->Ho; oh++)
            for (int64_t ow = 0; ow < g->Wo; ow++) {
                int64_t h0, h1, w0, w1, best_i;
                window(g, oh, ow, &h0, &h1, &w0, &w1);
                T best = -INFINITY;
                best_i = h0 * g->W + w0;
                for (int64_t ih = h0; ih < h1; ih++)
                    for (int64_t iw = w0; iw < w1; iw++) {
                        T v = xp[ih * g->W + iw];
                        bool take = (v > best) | (v != v); /* a NaN wins and stays; no branch */
                        best_i = take ? ih * g->W + iw : best_i;
                        best = take ? v : best;
                    }
                int64_t o = (p * g->Ho + oh) * g->Wo + ow;
                out[o] = best;
                if (idx) idx[o] = (int32_t)best_i;
            }
    }
}

/* dx = 0 plus each output gradient at its window's argmax. */
static void FN(max_backward)(const ts_pool_geom *g, const T *gout, const int32_t *idx, T *dx) {
#pragma omp parallel for schedule(static) if (g->planes * g->Ho * g->Wo > POOL_OMP_MIN)
    for (int64_t p = 0; p < g->planes; p++) {
        T *dp = dx + p * g->H * g->W;
        memset(dp, 0, sizeof(T) * (size_t)(g->H * g->W));
        for (int64_t o = p * g->Ho * g->Wo; o < (p + 1) * g->Ho * g->Wo; o++) dp[idx[o]] += gout[o];
    }
}

/* out = the sum of each window (clipped to the input) / (kh kw). */
static void FN(avg)(const ts_pool_geom *g, const T *x, T *out) {
    double scale = 1.0 / (double)(g->kh * g->kw);
#pragma omp parallel for schedule(static) if (g->planes * g->Ho * g->Wo > POOL_OMP_MIN)
    for (int64_t p = 0; p < g->planes; p++) {
        const T *xp = x + p * g->H * g->W;
        for (int64_t oh = 0; oh < g->Ho; oh++)
            for (int64_t ow = 0; ow < g->Wo; ow++) {
                int64_t h0, h1, w0, w1;
                window(g, oh, ow, &h0, &h1, &w0, &w1);
                double s = 0;
                for (int64_t ih = h0; ih < h1; ih++)
                    for (int64_t iw = w0; iw < w1; iw++) s += xp[ih * g->W + iw];
                out[(p * g->Ho + oh) * g->Wo + ow] = (T)(s * scale);
            }
    }
}

/* dx = each output gradient / (kh kw) spread over its window. */
static void FN(avg_backward)(const ts_pool_geom *g, const T *gout, T *dx) {
    T scale = (T)(1.0 / (double)(g->kh * g->kw));
#pragma omp parallel for schedule(static) if (g->planes * g->Ho * g->Wo > POOL_OMP_MIN)
    for (int64_t p = 0; p < g->planes; p++) {
        T *dp = dx + p * g->H * g->W;
        memset(dp, 0, sizeof(T) * (size_t)(g->H * g->W));
        for (int64_t oh = 0; oh < g->Ho; oh++)
            for (int64_t ow = 0; ow < g->Wo; ow++) {
                int64_t h0, h1, w0, w1;
                window(g, oh, ow, &h0, &h1, &w0, &w1);
                T v = gout[(p * g->Ho + oh) * g->Wo + ow] * scale;
                for (int64_t ih = h0; ih < h1; ih++)
                    for (int64_t iw = w0; iw < w1; iw++) dp[ih * g->W + iw] += v;
            }
    }
}
