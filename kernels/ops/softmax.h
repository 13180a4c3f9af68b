/* softmax.h - softmax and log_softmax along one dim.
 *
 * x is f32 or f64, any strides (read through a contiguous copy when needed;
 * another dim than the last goes through a transposed copy);
 * dim may be negative. The output is contiguous with x's shape and dtype.
 * Both are differentiable: backward uses the saved output
 * (softmax: y * (g - sum(g * y)); log_softmax: g - exp(y) * sum(g)).
 * Rows are computed with the maximum subtracted, so large inputs do not
 * overflow; OpenMP spreads the rows over the threads.
 */
#ifndef TS_OPS_SOFTMAX_H
#define TS_OPS_SOFTMAX_H

#include "kernels/tensor.h"

/* exp(x - max) / sum exp(x - max) along dim. */
ts_tensor *ts_softmax(ts_tensor *x, int dim);
/* x - max - log(sum exp(x - max)) along dim. */
ts_tensor *ts_log_softmax(ts_tensor *x, int dim);

#endif
