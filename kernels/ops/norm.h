/* norm.h - layer normalisation over the last dim.
 *
 * x [..., D] f32/f64, any strides; weight and bias [D] of x's dtype, each
 * optional (NULL: 1 and 0). y = (x - mean) * rstd * weight + bias with
 * rstd = 1 / sqrt(var + eps), var the biased variance (as PyTorch). The
 * forward saves mean and rstd per row; the backward is fused (one pass over
 * each row for dx, per-thread partial sums for dweight and dbias).
 */
#ifndef TS_OPS_NORM_H
#define TS_OPS_NORM_H

#include "kernels/tensor.h"

/* Layer norm of x over its last dim; eps > 0 (PyTorch's default is 1e-5). */
ts_tensor *ts_layernorm(ts_tensor *x, ts_tensor *weight, ts_tensor *bias, double eps);

#endif
