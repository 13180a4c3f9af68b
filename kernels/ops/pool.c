/* pool.c - max_pool2d and avg_pool2d, forward and backward. */
#include "kernels/ops/pool.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "kernels/autograd.h"

/* `omp simd` is a hint: sanitizer and -O1 builds of clang cannot always
 * vectorize and would otherwise turn that into an error under -Werror. */
#ifdef __clang__
#pragma clang diagnostic ignored "-Wpass-failed"
#endif

/* Sizes of one pooling. */
typedef struct {
    int64_t planes, H, W, Ho, Wo, kh, kw, sh, sw, ph, pw;
} pool_geom;

/* Serial below this many output elements. */
#define POOL_OMP_MIN 16384

/* The window of output (oh, ow) clipped to the input: rows [*h0, *h1),
 * columns [*w0, *w1). */
static inline void window(const pool_geom *g, int64_t oh, int64_t ow, int64_t *h0, int64_t *h1, int64_t *w0,
                          int64_t *w1) {
    int64_t hs = oh * g->sh - g->ph, ws = ow * g->sw - g->pw;
    *h0 = hs < 0 ? 0 : hs;
    *w0 = ws < 0 ? 0 : ws;
    *h1 = hs + g->kh < g->H ? hs + g->kh : g->H;
    *w1 = ws + g->kw < g->W ? ws + g->kw : g->W;
}

/* Max: out = max over the window, idx = its plane index (ih * W + iw, in
 * 32 bits: pool_check bounds the plane) when idx is not NULL; backward adds each gradient at its index. Avg: out = sum
 * / (kh * kw); backward spreads gradient / (kh * kw) over the window. */
#define POOL_KERNELS(T)                                                                                   \
    /* The common 2x2 window, stride 2, no padding: the same comparisons in                           \
     * the same order as the general loop, with fixed trip counts. */                                    \
    static void max_fwd2_##T(const pool_geom *g, const T *x, T *out, int32_t *idx) {                      \
        _Pragma("omp parallel for schedule(static) if (g->planes * g->Ho * g->Wo > POOL_OMP_MIN)")        \
        for (int64_t p = 0; p < g->planes; p++) {                                                         \
            const T *xp = x + p * g->H * g->W;                                                            \
            for (int64_t oh = 0; oh < g->Ho; oh++) {                                                      \
                const T *r0 = xp + 2 * oh * g->W, *r1 = r0 + g->W;                                        \
                T *o = out + (p * g->Ho + oh) * g->Wo;                                                    \
                int32_t *io = idx ? idx + (p * g->Ho + oh) * g->Wo : NULL;                                \
                int64_t base = 2 * oh * g->W;                                                             \
                _Pragma("omp simd") for (int64_t ow = 0; ow < g->Wo; ow++) {                              \
                    T v[4] = {r0[2 * ow], r0[2 * ow + 1], r1[2 * ow], r1[2 * ow + 1]}, best = v[0];       \
                    int64_t bi = 0;                                                                       \
                    for (int k = 1; k < 4; k++) {                                                         \
                        bool take = (v[k] > best) | (v[k] != v[k]);                                       \
                        bi = take ? k : bi;                                                               \
                        best = take ? v[k] : best;                                                        \
                    }                                                                                     \
                    o[ow] = best;                                                                         \
                    if (io) io[ow] = (int32_t)(base + (bi >> 1) * g->W + 2 * ow + (bi & 1));              \
                }                                                                                         \
            }                                                                                             \
        }                                                                                                 \
    }                                                                                                     \
    static void max_fwd_##T(const pool_geom *g, const T *x, T *out, int32_t *idx) {                       \
        if (g->kh == 2 && g->kw == 2 && g->sh == 2 && g->sw == 2 && g->ph == 0 && g->pw == 0) {           \
            max_fwd2_##T(g, x, out, idx);                                                                 \
            return;                                                                                       \
        }                                                                                                 \
        _Pragma("omp parallel for schedule(static) if (g->planes * g->Ho * g->Wo > POOL_OMP_MIN)")        \
        for (int64_t p = 0; p < g->planes; p++) {                                                         \
            const T *xp = x + p * g->H * g->W;                                                            \
            for (int64_t oh = 0; oh < g->Ho; oh++)                                                        \
                for (int64_t ow = 0; ow < g->Wo; ow++) {                                                  \
                    int64_t h0, h1, w0, w1, best_i;                                                       \
                    window(g, oh, ow, &h0, &h1, &w0, &w1);                                                \
                    T best = -INFINITY;                                                                   \
                    best_i = h0 * g->W + w0;                                                              \
                    for (int64_t ih = h0; ih < h1; ih++)                                                  \
                        for (int64_t iw = w0; iw < w1; iw++) {                                            \
                            T v = xp[ih * g->W + iw];                                                     \
                            bool take = (v > best) | (v != v); /* a NaN wins and stays; no branch */      \
                            best_i = take ? ih * g->W + iw : best_i;                                      \
                            best = take ? v : best;                                                       \
                        }                                                                                 \
                    int64_t o = (p * g->Ho + oh) * g->Wo + ow;                                            \
                    out[o] = best;                                                                        \
                    if (idx) idx[o] = (int32_t)best_i;                                                    \
                }                                                                                         \
        }                                                                                                 \
    }                                                                                                     \
    static void max_bwd_##T(const pool_geom *g, const T *gout, const int32_t *idx, T *dx) {               \
        _Pragma("omp parallel for schedule(static) if (g->planes * g->Ho * g->Wo > POOL_OMP_MIN)")        \
        for (int64_t p = 0; p < g->planes; p++) {                                                         \
            T *dp = dx + p * g->H * g->W;                                                                 \
            memset(dp, 0, sizeof(T) * (size_t)(g->H * g->W));                                            \
            for (int64_t o = p * g->Ho * g->Wo; o < (p + 1) * g->Ho * g->Wo; o++) dp[idx[o]] += gout[o];  \
        }                                                                                                 \
    }                                                                                                     \
    static void avg_fwd_##T(const pool_geom *g, const T *x, T *out) {                                     \
        double scale = 1.0 / (double)(g->kh * g->kw);                                                     \
        _Pragma("omp parallel for schedule(static) if (g->planes * g->Ho * g->Wo > POOL_OMP_MIN)")        \
        for (int64_t p = 0; p < g->planes; p++) {                                                         \
            const T *xp = x + p * g->H * g->W;                                                            \
            for (int64_t oh = 0; oh < g->Ho; oh++)                                                        \
                for (int64_t ow = 0; ow < g->Wo; ow++) {                                                  \
                    int64_t h0, h1, w0, w1;                                                               \
                    window(g, oh, ow, &h0, &h1, &w0, &w1);                                                \
                    double s = 0;                                                                         \
                    for (int64_t ih = h0; ih < h1; ih++)                                                  \
                        for (int64_t iw = w0; iw < w1; iw++) s += xp[ih * g->W + iw];                     \
                    out[(p * g->Ho + oh) * g->Wo + ow] = (T)(s * scale);                                  \
                }                                                                                         \
        }                                                                                                 \
    }                                                                                                     \
    static void avg_bwd_##T(const pool_geom *g, const T *gout, T *dx) {                                   \
        T scale = (T)(1.0 / (double)(g->kh * g->kw));                                                     \
        _Pragma("omp parallel for schedule(static) if (g->planes * g->Ho * g->Wo > POOL_OMP_MIN)")        \
        for (int64_t p = 0; p < g->planes; p++) {                                                         \
            T *dp = dx + p * g->H * g->W;                                                                 \
            memset(dp, 0, sizeof(T) * (size_t)(g->H * g->W));                                            \
            for (int64_t oh = 0; oh < g->Ho; oh++)                                                        \
                for (int64_t ow = 0; ow < g->Wo; ow++) {                                                  \
                    int64_t h0, h1, w0, w1;                                                               \
                    window(g, oh, ow, &h0, &h1, &w0, &w1);                                                \
                    T v = gout[(p * g->Ho + oh) * g->Wo + ow] * scale;                                    \
                    for (int64_t ih = h0; ih < h1; ih++)                                                  \
                        for (int64_t iw = w0; iw < w1; iw++) dp[ih * g->W + iw] += v;                     \
                }                                                                                         \
        }                                                                                                 \
    }

POOL_KERNELS(float)
POOL_KERNELS(double)

#define DISPATCH(dt, fn, ...) ((dt) == TS_F32 ? fn##_float(__VA_ARGS__) : fn##_double(__VA_ARGS__))

/* The geometry of a window k = {kh, kw, sh, sw, ph, pw} over an input of
 * shape [N,C,H,W] (already checked). */
static void pool_geometry(const int64_t *shape, const int64_t *k, pool_geom *g) {
    *g = (pool_geom){.planes = shape[0] * shape[1], .H = shape[2], .W = shape[3], .kh = k[0], .kw = k[1],
                     .sh = k[2], .sw = k[3], .ph = k[4], .pw = k[5]};
    g->Ho = (g->H + 2 * g->ph - g->kh) / g->sh + 1;
    g->Wo = (g->W + 2 * g->pw - g->kw) / g->sw + 1;
}

/* Checks x and the window for op and fills g. k = {kh, kw, sh, sw, ph, pw}. */
static ts_status pool_check(const char *op, const ts_tensor *x, const int64_t *k, pool_geom *g) {
    if (ts_check_tensor(op, "input", x, TS_FLOATS)) return ts_last_status();
    if (x->ndim != 4) return ts_error(TS_ERR_SHAPE, "%s: input %s must be [N,C,H,W]", op, ts_shape_str(x));
    if (k[0] < 1 || k[1] < 1 || k[2] < 1 || k[3] < 1 || k[4] < 0 || k[5] < 0 || 2 * k[4] > k[0] ||
        2 * k[5] > k[1])
        return ts_error(TS_ERR_VALUE,
                        "%s: kernel %lldx%lld, stride %lldx%lld, padding %lldx%lld on input %s: kernel and stride "
                        "must be >= 1, padding between 0 and half the kernel",
                        op, (long long)k[0], (long long)k[1], (long long)k[2], (long long)k[3], (long long)k[4],
                        (long long)k[5], ts_shape_str(x));
    if (x->shape[2] * x->shape[3] > INT32_MAX)
        return ts_error(TS_ERR_SHAPE, "%s: input %s has planes of more than 2^31 - 1 elements", op, ts_shape_str(x));
    if (x->shape[2] + 2 * k[4] < k[0] || x->shape[3] + 2 * k[5] < k[1])
        return ts_error(TS_ERR_SHAPE, "%s: kernel %lldx%lld does not fit input %s padded by %lldx%lld", op,
                        (long long)k[0], (long long)k[1], ts_shape_str(x), (long long)k[4], (long long)k[5]);
    pool_geometry(x->shape, k, g);
    return TS_OK;
}

/* The geometry a node was recorded with (window in iargs[0..5]); the input
 * is only its shape (see ts_node_forget_input_data). */
static void node_geom(const ts_node *n, pool_geom *g) { pool_geometry(n->inputs[0]->shape, n->iargs, g); }

static ts_status pool_backward(ts_node *n, ts_tensor *grad, ts_tensor **gin) {
    if (!ts_node_wants(n, 0)) return TS_OK;
    pool_geom g;
    node_geom(n, &g);
    ts_tensor *x = n->inputs[0], *gd = ts_tensor_dense(grad);
    ts_tensor *dx = gd ? ts_tensor_empty(x->dtype, 4, x->shape) : NULL;
    if (!dx) {
        ts_tensor_release(gd);
        return ts_last_status();
    }
    if (n->saved[0])
        DISPATCH(x->dtype, max_bwd, &g, ts_tensor_data(gd), (const int32_t *)ts_tensor_data(n->saved[0]),
                 ts_tensor_data(dx));
    else
        DISPATCH(x->dtype, avg_bwd, &g, ts_tensor_data(gd), ts_tensor_data(dx));
    ts_tensor_release(gd);
    gin[0] = dx;
    return TS_OK;
}

/* Shared body of both pools: max when is_max. */
static ts_tensor *pool2d(const char *op, bool is_max, ts_tensor *x, const int64_t *k) {
    pool_geom g;
    if (pool_check(op, x, k, &g)) return NULL;
    int64_t shape[4] = {x->shape[0], x->shape[1], g.Ho, g.Wo};
    ts_tensor *xd = ts_tensor_dense(x);
    ts_tensor *out = xd ? ts_tensor_empty(x->dtype, 4, shape) : NULL;
    ts_tensor *idx = out && is_max && ts_autograd_needed(1, &x) ? ts_tensor_empty(TS_I32, 4, shape) : NULL;
    if (!out || (is_max && ts_autograd_needed(1, &x) && !idx)) {
        ts_tensor_release(xd);
        ts_tensor_release(out);
        return NULL;
    }
    if (is_max)
        DISPATCH(x->dtype, max_fwd, &g, ts_tensor_data(xd), ts_tensor_data(out),
                 idx ? (int32_t *)ts_tensor_data(idx) : NULL);
    else
        DISPATCH(x->dtype, avg_fwd, &g, ts_tensor_data(xd), ts_tensor_data(out));
    ts_tensor_release(xd);
    /* backward reads the saved indices (max) or nothing (average) of x */
    ts_node *n = ts_autograd_record(out, op, pool_backward, 1, &x);
    ts_node_forget_input_data(n, 0);
    if (n) {
        memcpy(n->iargs, k, 6 * sizeof *k);
        if (idx) ts_node_save(n, 0, idx);
    }
    ts_tensor_release(idx);
    return out;
}

ts_tensor *ts_max_pool2d(ts_tensor *x, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
    return pool2d("max_pool2d", true, x, (int64_t[]){kh, kw, sh, sw, ph, pw});
}

ts_tensor *ts_avg_pool2d(ts_tensor *x, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
    return pool2d("avg_pool2d", false, x, (int64_t[]){kh, kw, sh, sw, ph, pw});
}
