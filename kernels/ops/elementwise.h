/* elementwise.h - differentiable elementwise arithmetic.
 *
 * Contract (shared by reduce.h, activation.h, select.h, dropout.h):
 * - Inputs are CPU tensors of dtype f32 or f64; bf16 inputs are converted to
 *   f32 (a recorded ts_to_dtype, so gradients flow back as bf16) and the
 *   result is f32. Other dtypes fail with TS_ERR_DTYPE naming op, argument,
 *   dtype and shape. Binary ops need both operands of one dtype (after the
 *   bf16 conversion): "add: dtypes f32 and f64 differ (shapes [2,3] and [3])".
 * - Binary ops broadcast with NumPy rules; a mismatch fails with
 *   TS_ERR_SHAPE naming both shapes. Any strides are accepted.
 * - Results are new contiguous tensors (new references; NULL on failure with
 *   the reason in ts_last_error()). Each op records its autograd node when an
 *   input requires grad; backward of a broadcasting op returns the gradient
 *   at the broadcast shape and the engine reduces it.
 * - Loops run with OpenMP once a tensor has more than 32768 elements.
 *
 * The second half of this header is for op implementers: the unary "map"
 * driver every pointwise op (here, in activation.c, ...) is built on, and
 * broadcasting stride helpers.
 */
#ifndef TS_OPS_ELEMENTWISE_H
#define TS_OPS_ELEMENTWISE_H

#include "kernels/tensor.h"

/* a + b, a - b, a * b, a / b with broadcasting. */
ts_tensor *ts_add(ts_tensor *a, ts_tensor *b);
ts_tensor *ts_sub(ts_tensor *a, ts_tensor *b);
ts_tensor *ts_mul(ts_tensor *a, ts_tensor *b);
ts_tensor *ts_div(ts_tensor *a, ts_tensor *b);

/* -a. */
ts_tensor *ts_neg(ts_tensor *a);
/* a + s and a * s for a double scalar s (use ts_add_scalar(a, -s) for a - s
 * and ts_mul_scalar(a, 1 / s) for a / s). */
ts_tensor *ts_add_scalar(ts_tensor *a, double s);
ts_tensor *ts_mul_scalar(ts_tensor *a, double s);
/* a ^ p elementwise (real power; negative a with fractional p gives NaN). */
ts_tensor *ts_pow_scalar(ts_tensor *a, double p);
/* exp(a), log(a) (log of a <= 0 gives -inf/NaN, as in IEEE), sqrt(a), |a|
 * (the gradient of |a| at 0 is 0). */
ts_tensor *ts_exp(ts_tensor *a);
ts_tensor *ts_log(ts_tensor *a);
ts_tensor *ts_sqrt(ts_tensor *a);
ts_tensor *ts_abs(ts_tensor *a);

/* ---- for op implementers ---------------------------------------------- */

/* Validates x as a float input of op (f32/f64/bf16) and returns it ready
 * for math: x itself retained, or a recorded bf16 -> f32 conversion. */
ts_tensor *ts_float_input(const char *op, const char *arg, ts_tensor *x);

/* A pointwise op: array kernels per dtype (index 0 f32, 1 f64).
 * fwd: y[i] = f(x[i]; p). bwd: gx[i] = g[i] * f'(x[i]) written from
 * (g, x, y, p) where y is the forward output; `uses` says which of x and y
 * it reads (TS_MAP_USES_X | TS_MAP_USES_Y), and only those are kept for
 * backward (an unused one is passed as g). */
#define TS_MAP_USES_X 1u
#define TS_MAP_USES_Y 2u
typedef void (*ts_map_fwd_fn)(const void *x, void *y, int64_t n, double p);
typedef void (*ts_map_bwd_fn)(const void *g, const void *x, const void *y, void *gx, int64_t n, double p);
typedef struct {
    const char *op;
    ts_map_fwd_fn fwd[2];
    ts_map_bwd_fn bwd[2];
    unsigned uses;
} ts_map_op;

/* Applies a pointwise op to x (any strides, f32/f64/bf16) with parameter p,
 * recording backward (which keeps x and/or the output, as op->uses says). */
ts_tensor *ts_map_apply(const ts_map_op *op, ts_tensor *x, double p);

/* Defines the kernels of pointwise op `name` from two element macros
 * FWD(T, x, p) and BWD(T, g, x, y, p) (expressions of type T; include
 * <tgmath.h> so exp/tanh/... pick the float or double function), and
 * `static const ts_map_op name##_map`; USES: what BWD reads of x and y. */
#define TS_MAP_KERNELS(name, FWD, BWD, USES)                                                        \
    TS_MAP_KERNELS_T_(name, float, f32, FWD, BWD)                                                   \
    TS_MAP_KERNELS_T_(name, double, f64, FWD, BWD)                                                  \
    static const ts_map_op name##_map = {#name, {name##_fwd_f32, name##_fwd_f64},                  \
                                         {name##_bwd_f32, name##_bwd_f64}, (USES)};

#define TS_MAP_KERNELS_T_(name, T, S, FWD, BWD)                                                     \
    static void name##_fwd_##S(const void *xv, void *yv, int64_t n, double pd) {                    \
        const T *xs = xv;                                                                           \
        T *ys = yv;                                                                                 \
        const T p = (T)pd;                                                                          \
        (void)p;                                                                                    \
        _Pragma("omp parallel for if (n > 32768)") for (int64_t i = 0; i < n; i++) {                \
            const T x = xs[i];                                                                      \
            ys[i] = FWD(T, x, p);                                                                   \
        }                                                                                           \
    }                                                                                               \
    static void name##_bwd_##S(const void *gv, const void *xv, const void *yv, void *ov, int64_t n, \
                               double pd) {                                                         \
        const T *gs = gv, *xs = xv, *ys = yv;                                                       \
        T *os = ov;                                                                                 \
        const T p = (T)pd;                                                                          \
        (void)p;                                                                                    \
        _Pragma("omp parallel for if (n > 32768)") for (int64_t i = 0; i < n; i++) {                \
            const T g = gs[i], x = xs[i], y = ys[i];                                                \
            (void)x;                                                                                \
            (void)y;                                                                                \
            os[i] = BWD(T, g, x, y, p);                                                             \
        }                                                                                           \
    }

/* Element strides of t viewed at the broadcast shape (ndim, shape): 0 along
 * the dims t is broadcast over. t must broadcast to shape. */
void ts_broadcast_strides(const ts_tensor *t, int ndim, const int64_t *shape, int64_t *strides);

/* Offset (elements) of the first element of row `row`, where rows are the
 * last dim of shape, for a view with the given strides. */
int64_t ts_row_offset(int ndim, const int64_t *shape, const int64_t *strides, int64_t row);

#endif
