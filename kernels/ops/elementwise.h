/* elementwise.h - differentiable elementwise arithmetic.
 *
 * Contract (shared by reduce.h, activation.h, select.h, dropout.h):
 * - Inputs are tensors of dtype f32 or f64 on one device (else "add:
 *   expected all tensors on the same device, got cpu and cuda:0"), and
 *   results are made on that device; bf16 inputs are converted to
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
 * - The CPU kernels run with OpenMP once a tensor has more than 32768
 *   elements.
 *
 * The second half of this header is for op implementers: the unary "map"
 * driver every pointwise op (here, in activation.c) is built on, and a
 * broadcasting stride helper.
 */
#ifndef TS_OPS_ELEMENTWISE_H
#define TS_OPS_ELEMENTWISE_H

#include "kernels/ops/backend.h"
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

/* Applies the pointwise op `kind` (ops/backend.h) with parameter p to x
 * (any strides, f32/f64/bf16), recording backward, which keeps what the
 * op's derivative reads: x, the output, or neither. */
ts_tensor *ts_map_apply(ts_map_kind kind, ts_tensor *x, double p);

/* Element strides of t viewed at the broadcast shape (ndim, shape): 0 along
 * the dims t is broadcast over. t must broadcast to shape. */
void ts_broadcast_strides(const ts_tensor *t, int ndim, const int64_t *shape, int64_t *strides);

#endif
