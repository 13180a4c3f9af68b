/* reduce.h - differentiable sum, mean and max over all or some dims.
 *
 * Follows the contract of elementwise.h: f32/f64 inputs (bf16 is computed
 * as f32 and gives an f32 result), any strides, contiguous new results,
 * autograd recorded. `dims` lists ndims distinct dims (negative counts from
 * the end); ndims == 0 (or dims NULL) means all dims. keepdim keeps the
 * reduced dims as size 1; otherwise they are removed (all dims reduced:
 * a 0-dim result). A dim out of range or listed twice fails with
 * TS_ERR_SHAPE naming the op, the dim and the shape.
 *
 * Sums of f32 rows accumulate in double. Sum over an empty dim gives 0, mean
 * gives NaN, max fails (TS_ERR_SHAPE). Max's gradient goes to the first
 * maximal element of each reduced group; NaN propagates.
 */
#ifndef TS_OPS_REDUCE_H
#define TS_OPS_REDUCE_H

#include <stdbool.h>

#include "kernels/tensor.h"

/* Sum of a over dims. */
ts_tensor *ts_sum(ts_tensor *a, int ndims, const int *dims, bool keepdim);
/* Mean of a over dims. */
ts_tensor *ts_mean(ts_tensor *a, int ndims, const int *dims, bool keepdim);
/* Maximum of a over dims. */
ts_tensor *ts_max(ts_tensor *a, int ndims, const int *dims, bool keepdim);

/* The same over every element: 0-dim results. */
ts_tensor *ts_sum_all(ts_tensor *a);
ts_tensor *ts_mean_all(ts_tensor *a);
ts_tensor *ts_max_all(ts_tensor *a);

#endif
