/* conv.h - 2-D convolution (cross-correlation, as in PyTorch), NCHW.
 *
 * x [N, C, H, W] and weight [O, C, KH, KW] of one float dtype (f32 or f64;
 * bf16 is rejected), an optional bias [O]. The output is
 * [N, O, Ho, Wo] with Ho = (H + 2 pad_h - dil_h (KH - 1) - 1) / stride_h + 1
 * (likewise Wo). Only groups = 1. Stride-1 convolutions whose padding is
 * at most the dilated kernel's reach run as register-blocked direct loops
 * over zero-padded images (no column matrix; the input gradient is the
 * same loop over the padded output gradient with flipped weights); other
 * geometries unfold chunks of images (im2col) for one GEMM per chunk, with
 * GEMM + col2im backward. See kernels/ops/cpu/conv_cpu.h. Inputs of any
 * strides are accepted (copied to contiguous first); the input gradient is
 * computed only when the input needs one.
 */
#ifndef TS_OPS_CONV_H
#define TS_OPS_CONV_H

#include <stdint.h>

#include "kernels/tensor.h"

typedef struct {
    int64_t stride_h, stride_w; /* >= 1 */
    int64_t pad_h, pad_w;       /* >= 0, zero padding on both sides */
    int64_t dil_h, dil_w;       /* >= 1 */
    int64_t groups;             /* must be 1 */
} ts_conv2d_opts;

/* stride 1, padding 0, dilation 1, groups 1. */
ts_conv2d_opts ts_conv2d_default_opts(void);

/* conv2d of x with weight w plus bias (NULL: none); opts NULL means the
 * defaults. Differentiable in x, w and bias. Errors name the op, the shapes
 * and the offending option. */
ts_tensor *ts_conv2d(ts_tensor *x, ts_tensor *w, ts_tensor *bias, const ts_conv2d_opts *opts);

#endif
