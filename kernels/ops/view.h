/* view.h - differentiable views and copies.
 *
 * reshape, permute, transpose, narrow, expand, squeeze, unsqueeze and
 * flatten return views sharing the input's storage (reshape copies only when
 * the strides make a view impossible); contiguous, clone, to_dtype and
 * to_device copy (on the input's device, except to_device).
 * All record autograd nodes, so gradients flow back through views.
 */
#ifndef TS_OPS_VIEW_H
#define TS_OPS_VIEW_H

#include "kernels/tensor.h"

/* New shape with the same numel; one size may be -1 (inferred). */
ts_tensor *ts_reshape(ts_tensor *x, int ndim, const int64_t *shape);
/* Dims start..end (inclusive, negative allowed) merged into one. */
ts_tensor *ts_flatten(ts_tensor *x, int start, int end);
/* Dims reordered: out dim i is x dim perm[i]. */
ts_tensor *ts_permute(ts_tensor *x, const int *perm);
ts_tensor *ts_transpose(ts_tensor *x, int d0, int d1);
/* Elements start .. start+len-1 along dim. */
ts_tensor *ts_narrow(ts_tensor *x, int dim, int64_t start, int64_t len);
/* Broadcast to shape (size-1 dims stretch, new leading dims added). */
ts_tensor *ts_expand(ts_tensor *x, int ndim, const int64_t *shape);
ts_tensor *ts_squeeze(ts_tensor *x, int dim);
ts_tensor *ts_unsqueeze(ts_tensor *x, int dim);
/* x itself (retained) when contiguous, else a contiguous copy. */
ts_tensor *ts_contiguous(ts_tensor *x);
/* Always a fresh contiguous copy. */
ts_tensor *ts_clone(ts_tensor *x);
/* A contiguous copy converted to dtype dt (x retained if already dt and contiguous). */
ts_tensor *ts_to_dtype(ts_tensor *x, ts_dtype dt);
/* A view of x with no autograd history. */
ts_tensor *ts_detach(ts_tensor *x);
/* A contiguous copy of x on device d (ts_contiguous(x) when x is already
 * there); the gradient is copied back to x's device. */
ts_tensor *ts_to_device(ts_tensor *x, ts_device d);

/* The shape two operands broadcast to (NumPy rules), or an error naming op
 * and both shapes. */
ts_status ts_broadcast_shape(const char *op, const ts_tensor *a, const ts_tensor *b, int *ndim, int64_t *shape);

#endif
