/* softmax.c - softmax and log_softmax along a dim, forward and backward. */
#include "kernels/ops/softmax.h"

#include <stdbool.h>

#include "kernels/autograd.h"
#include "kernels/ops/cpu/rowmath.h"
#include "kernels/ops/view.h"

/* Work below this many elements stays on one thread. */
#define PAR_MIN 32768

/* For each type, over R contiguous rows of n: forward (y = softmax or, with
 * lg, log_softmax of x) and backward (gx from the output gradient g and the
 * saved y). */
#define SOFTMAX_DEFINE(T, S)                                                                           \
    static void softmax_fwd_##S(const T *x, T *y, int64_t R, int64_t n, bool lg) {                     \
        _Pragma("omp parallel for schedule(static) if (R * n > PAR_MIN)")                              \
        for (int64_t r = 0; r < R; r++) {                                                              \
            const T *xr = x + r * n;                                                                   \
            T *yr = y + r * n;                                                                         \
            T m = ts_row_max_##S(xr, n);                                                               \
            T s = ts_row_exp_##S(xr, yr, n, m);                                                        \
            if (lg) {                                                                                  \
                T l = m + (T)log((double)s);                                                           \
                TS_SIMD_##S() for (int64_t j = 0; j < n; j++) yr[j] = xr[j] - l;                       \
            } else {                                                                                   \
                T inv = (T)1 / s;                                                                      \
                TS_SIMD_##S() for (int64_t j = 0; j < n; j++) yr[j] *= inv;                            \
            }                                                                                          \
        }                                                                                              \
    }                                                                                                  \
    static void softmax_bwd_##S(const T *y, const T *g, T *gx, int64_t R, int64_t n, bool lg) {        \
        _Pragma("omp parallel for schedule(static) if (R * n > PAR_MIN)")                              \
        for (int64_t r = 0; r < R; r++) {                                                              \
            const T *yr = y + r * n, *gr = g + r * n;                                                  \
            T *dr = gx + r * n, acc = 0;                                                               \
            if (lg) {                                                                                  \
                TS_SIMD_##S(reduction(+ : acc)) for (int64_t j = 0; j < n; j++) acc += gr[j];          \
                TS_SIMD_##S() for (int64_t j = 0; j < n; j++) dr[j] = gr[j] - ts_exp_##S(yr[j]) * acc; \
            } else {                                                                                   \
                TS_SIMD_##S(reduction(+ : acc)) for (int64_t j = 0; j < n; j++) acc += gr[j] * yr[j];  \
                TS_SIMD_##S() for (int64_t j = 0; j < n; j++) dr[j] = yr[j] * (gr[j] - acc);           \
            }                                                                                          \
        }                                                                                              \
    }

SOFTMAX_DEFINE(float, f)
SOFTMAX_DEFINE(double, d)

/* Rows of the last dim: count and length. */
static void last_dim_rows(const ts_tensor *t, int64_t *R, int64_t *n) {
    *n = t->ndim ? t->shape[t->ndim - 1] : 1;
    *R = *n ? ts_tensor_numel(t) / *n : 0;
}

/* iargs[0] = log; saved[0] = output. */
static ts_status softmax_backward(ts_node *node, ts_tensor *g, ts_tensor **gin) {
    if (!ts_node_wants(node, 0)) return TS_OK;
    ts_tensor *y = node->saved[0];
    ts_tensor *gc = ts_contiguous(g);
    ts_tensor *gx = gc ? ts_tensor_empty(y->dtype, y->ndim, y->shape) : NULL;
    if (!gx) {
        ts_tensor_release(gc);
        return ts_last_status();
    }
    int64_t R, n;
    last_dim_rows(y, &R, &n);
    if (y->dtype == TS_F32) softmax_bwd_f(ts_f32(y), ts_f32(gc), ts_f32(gx), R, n, node->iargs[0]);
    else softmax_bwd_d(ts_f64(y), ts_f64(gc), ts_f64(gx), R, n, node->iargs[0]);
    ts_tensor_release(gc);
    gin[0] = gx;
    return TS_OK;
}

/* softmax (lg false) or log_softmax (lg true) of x along its last dim. */
static ts_tensor *softmax_last(ts_tensor *x, bool lg, const char *op) {
    ts_tensor *xc = ts_tensor_dense(x);
    ts_tensor *y = xc ? ts_tensor_empty(x->dtype, x->ndim, x->shape) : NULL;
    if (!y) {
        ts_tensor_release(xc);
        return NULL;
    }
    int64_t R, n;
    last_dim_rows(x, &R, &n);
    if (x->dtype == TS_F32) softmax_fwd_f(ts_f32(xc), ts_f32(y), R, n, lg);
    else softmax_fwd_d(ts_f64(xc), ts_f64(y), R, n, lg);
    ts_tensor_release(xc);
    ts_node *node = ts_autograd_record(y, op, softmax_backward, 1, &x);
    if (node) {
        node->iargs[0] = lg;
        ts_node_save(node, 0, y);
    }
    return y;
}

/* Along another dim: that dim is swapped to the end and back (differentiable
 * views), and the result made contiguous. */
static ts_tensor *softmax_op(ts_tensor *x, int dim, bool lg) {
    const char *op = lg ? "log_softmax" : "softmax";
    if (ts_check_tensor(op, "x", x, TS_FLOATS)) return NULL;
    int d = x->ndim == 0 && (dim == 0 || dim == -1) ? 0 : ts_dim_index(dim, x->ndim);
    if (d < 0) {
        ts_error(TS_ERR_SHAPE, "%s: dim %d out of range for %s (%d dims)", op, dim, ts_shape_str(x), x->ndim);
        return NULL;
    }
    if (x->ndim == 0 || d == x->ndim - 1) return softmax_last(x, lg, op);
    ts_tensor *t = ts_transpose(x, d, -1);
    ts_tensor *s = t ? softmax_last(t, lg, op) : NULL;
    ts_tensor *back = s ? ts_transpose(s, d, -1) : NULL;
    ts_tensor *out = back ? ts_contiguous(back) : NULL;
    ts_tensor_release(t);
    ts_tensor_release(s);
    ts_tensor_release(back);
    return out;
}

ts_tensor *ts_softmax(ts_tensor *x, int dim) { return softmax_op(x, dim, false); }

ts_tensor *ts_log_softmax(ts_tensor *x, int dim) { return softmax_op(x, dim, true); }
