/* conv.h - 2-D convolution (cross-correlation, as in PyTorch), NCHW.
 *
 * x [N, C, H, W] and weight [O, C, KH, KW] of one float dtype (f32 or f64;
 * bf16 is rejected), an optional bias [O]. The output is
 * [N, O, Ho, Wo] with Ho = (H + 2 pad_h - dil_h (KH - 1) - 1) / stride_h + 1
 * (likewise Wo). Only groups = 1. The batch is processed in chunks of
 * images whose columns fit about 1 MiB: forward unfolds a chunk (im2col,
 * OpenMP over images and channels), multiplies it by the weight in one GEMM
 * and adds the bias while moving the result to NCHW; backward recomputes
 * each chunk's columns for the weight gradient (GEMMs accumulated over
 * chunks), gets the input gradient from a GEMM then col2im only when the
 * input needs one, and the bias gradient by summing. Inputs of any strides
 * are accepted (copied to contiguous first).
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
