/* norm.c - layer norm over the last dim, forward and fused backward. */
#include "kernels/ops/norm.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "kernels/autograd.h"
#include "kernels/ops/cpu/rowmath.h"
#include "kernels/ops/view.h"

/* Work below this many elements stays on one thread. */
#define PAR_MIN 32768

/* For each type: forward over R rows of D (y, mean, rstd) and backward
 * (dx, and dw/db summed over rows through per-thread partials part, which
 * holds 2 * D * threads zeroed elements). w and b may be NULL. */
#define LAYERNORM_DEFINE(T, S)                                                                         \
    static void ln_fwd_##S(const T *x, const T *w, const T *b, T *y, T *mean, T *rstd, int64_t R,     \
                           int64_t D, T eps) {                                                         \
        _Pragma("omp parallel for schedule(static) if (R * D > PAR_MIN)")                              \
        for (int64_t r = 0; r < R; r++) {                                                              \
            const T *xr = x + r * D;                                                                   \
            T *yr = y + r * D;                                                                         \
            T s = 0, v = 0;                                                                            \
            TS_SIMD_##S(reduction(+ : s)) for (int64_t j = 0; j < D; j++) s += xr[j];           \
            T mu = s / (T)D;                                                                           \
            TS_SIMD_##S(reduction(+ : v)) for (int64_t j = 0; j < D; j++) v +=                  \
                (xr[j] - mu) * (xr[j] - mu);                                                           \
            T rs = (T)1 / (T)sqrt((double)(v / (T)D + eps));                                           \
            mean[r] = mu;                                                                              \
            rstd[r] = rs;                                                                              \
            if (w && b) {                                                                              \
                TS_SIMD_##S() for (int64_t j = 0; j < D; j++) yr[j] = (xr[j] - mu) * rs * w[j] + b[j]; \
            } else {                                                                                   \
                TS_SIMD_##S() for (int64_t j = 0; j < D; j++) yr[j] =                            \
                    (xr[j] - mu) * rs * (w ? w[j] : (T)1) + (b ? b[j] : (T)0);                         \
            }                                                                                          \
        }                                                                                              \
    }                                                                                                  \
    static void ln_bwd_##S(const T *x, const T *w, const T *mean, const T *rstd, const T *g, T *dx,   \
                           T *part, int64_t R, int64_t D) {                                            \
        _Pragma("omp parallel if (R * D > PAR_MIN)") {                                                 \
            T *dw = part + (int64_t)omp_get_thread_num() * 2 * D, *db = dw + D;                        \
            _Pragma("omp for schedule(static)") for (int64_t r = 0; r < R; r++) {                      \
                const T *xr = x + r * D, *gr = g + r * D;                                              \
                T mu = mean[r], rs = rstd[r], a = 0, c = 0;                                            \
                TS_SIMD_##S(reduction(+ : a, c)) for (int64_t j = 0; j < D; j++) {              \
                    T xh = (xr[j] - mu) * rs, gw = gr[j] * (w ? w[j] : (T)1);                          \
                    a += gw;                                                                           \
                    c += gw * xh;                                                                      \
                    dw[j] += gr[j] * xh;                                                               \
                    db[j] += gr[j];                                                                    \
                }                                                                                      \
                a /= (T)D;                                                                             \
                c /= (T)D;                                                                             \
                if (dx) {                                                                              \
                    T *dr = dx + r * D;                                                                \
                    TS_SIMD_##S() for (int64_t j = 0; j < D; j++) {                              \
                        T xh = (xr[j] - mu) * rs;                                                      \
                        dr[j] = rs * (gr[j] * (w ? w[j] : (T)1) - a - xh * c);                         \
                    }                                                                                  \
                }                                                                                      \
            }                                                                                          \
        }                                                                                              \
    }                                                                                                  \
    /* Sums the per-thread partials into part's first slot. */                                       \
    static void ln_reduce_##S(T *part, int nthreads, int64_t D) {                                      \
        for (int t = 1; t < nthreads; t++) {                                                           \
            const T *src = part + (int64_t)t * 2 * D;                                                  \
            TS_SIMD_##S() for (int64_t j = 0; j < 2 * D; j++) part[j] += src[j];                 \
        }                                                                                              \
    }

LAYERNORM_DEFINE(float, f)
LAYERNORM_DEFINE(double, d)

/* Data pointer of an optional tensor. */
static void *opt_data(const ts_tensor *t) { return t ? ts_tensor_data(t) : NULL; }

/* saved: 0 x (contiguous), 1 weight (or NULL), 2 mean [R], 3 rstd [R]. */
static ts_status layernorm_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    ts_tensor *x = n->saved[0], *w = n->saved[1], *mean = n->saved[2], *rstd = n->saved[3];
    int64_t D = x->shape[x->ndim - 1], R = D ? ts_tensor_numel(x) / D : 0;
    int nthreads = omp_get_max_threads();
    ts_tensor *gc = ts_contiguous(g);
    ts_tensor *dx = gc && ts_node_wants(n, 0) ? ts_tensor_empty(x->dtype, x->ndim, x->shape) : NULL;
    ts_tensor *part = gc ? ts_tensor_zeros(x->dtype, 2, (int64_t[]){nthreads, 2 * D}) : NULL;
    if (!part || (ts_node_wants(n, 0) && !dx)) {
        ts_tensor_release(gc);
        ts_tensor_release(dx);
        ts_tensor_release(part);
        return ts_last_status();
    }
    if (x->dtype == TS_F32) {
        ln_bwd_f(ts_f32(x), opt_data(w), ts_f32(mean), ts_f32(rstd), ts_f32(gc), opt_data(dx), ts_f32(part), R, D);
        ln_reduce_f(ts_f32(part), nthreads, D);
    } else {
        ln_bwd_d(ts_f64(x), opt_data(w), ts_f64(mean), ts_f64(rstd), ts_f64(gc), opt_data(dx), ts_f64(part), R, D);
        ln_reduce_d(ts_f64(part), nthreads, D);
    }
    ts_tensor_release(gc);
    gin[0] = dx;
    const char *sums = ts_tensor_data(part); /* slot 0: dw [D] then db [D] */
    size_t esz = ts_dtype_size(x->dtype);
    ts_status st = TS_OK;
    for (int i = 1; i <= 2 && !st; i++) {
        if (!ts_node_wants(n, i)) continue;
        gin[i] = ts_tensor_from_data(x->dtype, 1, &D, sums + (size_t)(i - 1) * (size_t)D * esz);
        if (!gin[i]) st = ts_last_status();
    }
    ts_tensor_release(part);
    return st;
}

/* Checks an optional [D] parameter of x's dtype. */
static ts_status check_param(const char *arg, const ts_tensor *p, const ts_tensor *x, int64_t D) {
    if (!p) return TS_OK;
    if (ts_check_tensor("layernorm", arg, p, TS_MASK(x->dtype))) return ts_last_status();
    if (p->ndim != 1 || p->shape[0] != D)
        return ts_error(TS_ERR_SHAPE, "layernorm: %s %s does not match the last dim of x %s (expected [%lld])", arg,
                        ts_shape_str(p), ts_shape_str(x), (long long)D);
    return TS_OK;
}

ts_tensor *ts_layernorm(ts_tensor *x, ts_tensor *weight, ts_tensor *bias, double eps) {
    if (ts_check_tensor("layernorm", "x", x, TS_FLOATS)) return NULL;
    if (x->ndim < 1) {
        ts_error(TS_ERR_SHAPE, "layernorm: x %s needs at least one dim", ts_shape_str(x));
        return NULL;
    }
    int64_t D = x->shape[x->ndim - 1], R = D ? ts_tensor_numel(x) / D : 0;
    if (check_param("weight", weight, x, D) || check_param("bias", bias, x, D)) return NULL;
    if (!(eps >= 0) || isinf(eps)) {
        ts_error(TS_ERR_VALUE, "layernorm: eps %g must be finite and >= 0", eps);
        return NULL;
    }
    ts_tensor *xc = ts_tensor_dense(x);
    ts_tensor *wc = weight ? ts_tensor_copy_as(weight, x->dtype) : NULL;
    ts_tensor *bc = bias ? ts_tensor_copy_as(bias, x->dtype) : NULL;
    ts_tensor *y = ts_tensor_empty(x->dtype, x->ndim, x->shape);
    ts_tensor *mean = ts_tensor_empty(x->dtype, 1, &R), *rstd = ts_tensor_empty(x->dtype, 1, &R);
    ts_tensor *out = NULL;
    if (xc && y && mean && rstd && (wc || !weight) && (bc || !bias)) {
        if (x->dtype == TS_F32)
            ln_fwd_f(ts_f32(xc), opt_data(wc), opt_data(bc), ts_f32(y), ts_f32(mean), ts_f32(rstd), R, D,
                     (float)eps);
        else
            ln_fwd_d(ts_f64(xc), opt_data(wc), opt_data(bc), ts_f64(y), ts_f64(mean), ts_f64(rstd), R, D, eps);
        out = ts_tensor_retain(y);
        ts_node *n = ts_autograd_record(out, "layernorm", layernorm_backward, 3, (ts_tensor *[]){x, weight, bias});
        if (n) {
            mean->storage->no_pack = rstd->storage->no_pack = true; /* statistics stay f32 */
            ts_node_save(n, 0, xc);
            if (wc) ts_node_save(n, 1, wc);
            ts_node_save(n, 2, mean);
            ts_node_save(n, 3, rstd);
        }
    }
    ts_tensor_release(xc);
    ts_tensor_release(wc);
    ts_tensor_release(bc);
    ts_tensor_release(y);
    ts_tensor_release(mean);
    ts_tensor_release(rstd);
    return out;
}
