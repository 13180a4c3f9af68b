/* select.h - differentiable selection and joining: where / masked_fill,
 * concat, split, stack.
 *
 * where and masked_fill follow elementwise.h (f32/f64 values, bf16 computed
 * as f32 giving f32, NumPy broadcasting, contiguous results, shape errors
 * naming both shapes); their mask is a u8 tensor (nonzero = true) of any
 * strides, and gradients flow to the values, never to the mask.
 * concat, split and stack move data only: they accept every dtype (all
 * operands of one dtype) and gradients flow to float inputs. split returns
 * views of x; concat and stack return new contiguous tensors. Every result
 * is a new reference; on failure NULL (or a ts_status) with a message naming
 * the op, the offending tensor's position, shapes and dtypes.
 */
#ifndef TS_OPS_SELECT_H
#define TS_OPS_SELECT_H

#include "kernels/tensor.h"

/* mask ? a : b elementwise; mask, a and b broadcast together. */
ts_tensor *ts_where(ts_tensor *mask, ts_tensor *a, ts_tensor *b);
/* a with the elements where mask is nonzero set to value; mask must
 * broadcast to a's shape, which is the result's. */
ts_tensor *ts_masked_fill(ts_tensor *a, ts_tensor *mask, double value);

/* The n >= 1 tensors joined along dim (negative counts from the end); all
 * dims but dim must agree. */
ts_tensor *ts_concat(int n, ts_tensor *const *tensors, int dim);
/* Splits x along dim into n views stored in out[0..n-1] (new references):
 * with sizes NULL, n equal parts (the dim size must divide by n); else
 * part i has sizes[i] elements and the sizes sum to the dim size. On
 * failure every out[i] is NULL. */
ts_status ts_split(ts_tensor *x, int dim, int n, const int64_t *sizes, ts_tensor **out);
/* The n >= 1 same-shaped tensors stacked along a new dim at position dim
 * (0 .. ndim, negative counts from the end: -1 appends). */
ts_tensor *ts_stack(int n, ts_tensor *const *tensors, int dim);

#endif
