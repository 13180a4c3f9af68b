/* pool.h - 2-D max and average pooling, NCHW.
 *
 * x [N, C, H, W] (f32 or f64; bf16 is rejected) pooled over kh x kw windows
 * taken every sh, sw positions, with ph, pw implicit padding on both sides;
 * the output is [N, C, Ho, Wo], Ho = (H + 2 ph - kh) / sh + 1 (floor), like
 * PyTorch with ceil_mode off. Windows, strides >= 1; padding at most half
 * the window (0 <= ph <= kh / 2), so every window sees real input. Max pooling
 * ignores the padding (a NaN in a window wins); its backward routes each
 * output gradient to the argmax saved in forward. Average pooling counts
 * the padding in the divisor (kh * kw, PyTorch's count_include_pad).
 * OpenMP over the N*C planes.
 */
#ifndef TS_OPS_POOL_H
#define TS_OPS_POOL_H

#include <stdint.h>

#include "kernels/tensor.h"

/* Max over each window; differentiable in x. */
ts_tensor *ts_max_pool2d(ts_tensor *x, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw);

/* Mean over each window (padding counts as zeros); differentiable in x. */
ts_tensor *ts_avg_pool2d(ts_tensor *x, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw);

#endif
