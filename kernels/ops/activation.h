/* activation.h - differentiable pointwise activations.
 *
 * Follows the contract of elementwise.h: f32/f64 inputs (bf16 is computed
 * as f32 and gives an f32 result), any strides, contiguous new results,
 * autograd recorded (each backward uses the saved input and output).
 */
#ifndef TS_OPS_ACTIVATION_H
#define TS_OPS_ACTIVATION_H

#include "kernels/tensor.h"

/* max(x, 0); the gradient at 0 is 0. */
ts_tensor *ts_relu(ts_tensor *x);
/* GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as
 * torch.nn.functional.gelu(x, approximate="tanh"). */
ts_tensor *ts_gelu(ts_tensor *x);
/* 1 / (1 + exp(-x)), computed without overflow for large |x|. */
ts_tensor *ts_sigmoid(ts_tensor *x);
/* tanh(x). */
ts_tensor *ts_tanh(ts_tensor *x);

#endif
