/* layers.h - the standard layers as modules.
 *
 * Each constructor registers the layer's parameters in the model (under
 * parent.name + "." + name) with PyTorch's default initialisation unless an
 * init is given, and returns the module (NULL with an error on bad
 * arguments). Shapes follow PyTorch: Linear maps [..., in] -> [..., out]
 * with weight [out, in]; Conv2d and pools take NCHW.
 */
#ifndef TS_NN_LAYERS_H
#define TS_NN_LAYERS_H

#include "kernels/nn/module.h"

/* y = x W^T + b. Kaiming-uniform weight (bound 1/sqrt(in)) and bias, like
 * torch.nn.Linear, unless winit is given (then the bias is zero). */
ts_module *ts_linear_new(ts_model *m, const ts_module *parent, const char *name, int64_t in, int64_t out,
                         bool bias, const ts_init *winit);

/* Rows of a [num, dim] table for integer indices; normal(0, std) init. */
ts_module *ts_embedding_new(ts_model *m, const ts_module *parent, const char *name, int64_t num, int64_t dim,
                            double std);

/* LayerNorm over the last dim of size dim, weight ones, bias zeros; eps
 * finite and > 0. */
ts_module *ts_layernorm_new(ts_model *m, const ts_module *parent, const char *name, int64_t dim, double eps);

/* Dropout with probability p, active in training mode only. */
ts_module *ts_dropout_new(ts_model *m, const ts_module *parent, const char *name, double p);

ts_module *ts_relu_new(ts_model *m, const ts_module *parent, const char *name);
ts_module *ts_gelu_new(ts_model *m, const ts_module *parent, const char *name);

/* Flattens all dims after the first: [N, ...] -> [N, prod(...)]. */
ts_module *ts_flatten_new(ts_model *m, const ts_module *parent, const char *name);

/* Conv2d over NCHW with a square kernel, stride and padding (dilation 1). */
ts_module *ts_conv2d_new(ts_model *m, const ts_module *parent, const char *name, int64_t in_ch, int64_t out_ch,
                         int64_t kernel, int64_t stride, int64_t padding);

/* MaxPool2d with a square window and stride. */
ts_module *ts_maxpool2d_new(ts_model *m, const ts_module *parent, const char *name, int64_t kernel,
                            int64_t stride);

#endif
