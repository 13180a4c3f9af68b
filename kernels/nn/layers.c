/* layers.c - Linear, Embedding, LayerNorm, Dropout, activations, Flatten,
 * Conv2d, MaxPool2d. */
#include "kernels/nn/layers.h"

#include <math.h>

#include "kernels/ops/activation.h"
#include "kernels/ops/conv.h"
#include "kernels/ops/dropout.h"
#include "kernels/ops/embedding.h"
#include "kernels/ops/matmul.h"
#include "kernels/ops/norm.h"
#include "kernels/ops/pool.h"
#include "kernels/ops/view.h"

/* The module, or NULL after freeing it when any registration failed. */
static ts_module *checked(ts_module *mod, bool ok) {
    if (mod && !ok) {
        ts_module_free(mod);
        return NULL;
    }
    return mod;
}

/* ---- Linear ---- */

static ts_tensor *linear_forward(ts_module *mod, ts_tensor *x) {
    ts_tensor *w = ts_module_weight(mod, 0), *b = mod->n_params > 1 ? ts_module_weight(mod, 1) : NULL;
    if (!w || (mod->n_params > 1 && !b)) return NULL;
    if (x->ndim < 1 || x->shape[x->ndim - 1] != w->shape[1]) {
        ts_error(TS_ERR_SHAPE, "Linear %s: input %s does not end in %lld features", mod->name, ts_shape_str(x),
                 (long long)w->shape[1]);
        return NULL;
    }
    return ts_linear(x, w, b);
}

static const ts_module_ops linear_ops = {"Linear", linear_forward, NULL};

ts_module *ts_linear_new(ts_model *m, const ts_module *parent, const char *name, int64_t in, int64_t out,
                         bool bias, const ts_init *winit) {
    if (in <= 0 || out <= 0) {
        ts_error(TS_ERR_SHAPE, "Linear %s: features %lld -> %lld must be positive", name, (long long)in, (long long)out);
        return NULL;
    }
    ts_module *mod = ts_module_new(m, &linear_ops, parent, name);
    if (!mod) return NULL;
    double bound = 1.0 / sqrt((double)in);
    ts_init w = winit ? *winit : (ts_init){TS_INIT_UNIFORM, bound};
    ts_init b = winit ? (ts_init){TS_INIT_ZEROS, 0} : (ts_init){TS_INIT_UNIFORM, bound};
    bool ok = ts_module_param(mod, "weight", 2, (int64_t[]){out, in}, w, true) >= 0;
    if (ok && bias) ok = ts_module_param(mod, "bias", 1, (int64_t[]){out}, b, false) >= 0;
    return checked(mod, ok);
}

/* ---- Embedding ---- */

static ts_tensor *embedding_forward(ts_module *mod, ts_tensor *x) {
    return ts_embedding(ts_module_weight(mod, 0), x);
}

static const ts_module_ops embedding_ops = {"Embedding", embedding_forward, NULL};

ts_module *ts_embedding_new(ts_model *m, const ts_module *parent, const char *name, int64_t num, int64_t dim,
                            double std) {
    ts_module *mod = ts_module_new(m, &embedding_ops, parent, name);
    if (!mod) return NULL;
    bool ok = ts_module_param(mod, "weight", 2, (int64_t[]){num, dim}, (ts_init){TS_INIT_NORMAL, std}, true) >= 0;
    return checked(mod, ok);
}

/* ---- LayerNorm ---- */

static ts_tensor *layernorm_forward(ts_module *mod, ts_tensor *x) {
    return ts_layernorm(x, ts_module_weight(mod, 0), ts_module_weight(mod, 1), mod->fargs[0]);
}

static const ts_module_ops layernorm_ops = {"LayerNorm", layernorm_forward, NULL};

ts_module *ts_layernorm_new(ts_model *m, const ts_module *parent, const char *name, int64_t dim, double eps) {
    if (!(eps > 0) || isinf(eps)) {
        ts_error(TS_ERR_VALUE, "LayerNorm %s: eps = %g must be finite and > 0", name, eps);
        return NULL;
    }
    ts_module *mod = ts_module_new(m, &layernorm_ops, parent, name);
    if (!mod) return NULL;
    mod->fargs[0] = eps;
    bool ok = ts_module_param(mod, "weight", 1, &dim, (ts_init){TS_INIT_ONES, 0}, false) >= 0 &&
              ts_module_param(mod, "bias", 1, &dim, (ts_init){TS_INIT_ZEROS, 0}, false) >= 0;
    return checked(mod, ok);
}

/* ---- Dropout, activations, Flatten ---- */

static ts_tensor *dropout_forward(ts_module *mod, ts_tensor *x) {
    return ts_dropout(x, mod->fargs[0], ts_module_dropout_key(mod), mod->model->training);
}

static const ts_module_ops dropout_ops = {"Dropout", dropout_forward, NULL};

ts_module *ts_dropout_new(ts_model *m, const ts_module *parent, const char *name, double p) {
    if (!(p >= 0 && p < 1)) {
        ts_error(TS_ERR_VALUE, "Dropout %s: p = %g is outside [0, 1)", name, p);
        return NULL;
    }
    ts_module *mod = ts_module_new(m, &dropout_ops, parent, name);
    if (mod) mod->fargs[0] = p;
    return mod;
}

static ts_tensor *relu_forward(ts_module *mod, ts_tensor *x) {
    (void)mod;
    return ts_relu(x);
}

static ts_tensor *gelu_forward(ts_module *mod, ts_tensor *x) {
    (void)mod;
    return ts_gelu(x);
}

static ts_tensor *flatten_forward(ts_module *mod, ts_tensor *x) {
    (void)mod;
    return ts_flatten(x, 1, -1);
}

static const ts_module_ops relu_ops = {"ReLU", relu_forward, NULL};
static const ts_module_ops gelu_ops = {"GELU", gelu_forward, NULL};
static const ts_module_ops flatten_ops = {"Flatten", flatten_forward, NULL};

ts_module *ts_relu_new(ts_model *m, const ts_module *parent, const char *name) {
    return ts_module_new(m, &relu_ops, parent, name);
}

ts_module *ts_gelu_new(ts_model *m, const ts_module *parent, const char *name) {
    return ts_module_new(m, &gelu_ops, parent, name);
}

ts_module *ts_flatten_new(ts_model *m, const ts_module *parent, const char *name) {
    return ts_module_new(m, &flatten_ops, parent, name);
}

/* ---- Conv2d, MaxPool2d ---- */

static ts_tensor *conv2d_forward(ts_module *mod, ts_tensor *x) {
    ts_conv2d_opts o = ts_conv2d_default_opts();
    o.stride_h = o.stride_w = mod->iargs[0];
    o.pad_h = o.pad_w = mod->iargs[1];
    return ts_conv2d(x, ts_module_weight(mod, 0), ts_module_weight(mod, 1), &o);
}

static const ts_module_ops conv2d_ops = {"Conv2d", conv2d_forward, NULL};

ts_module *ts_conv2d_new(ts_model *m, const ts_module *parent, const char *name, int64_t in_ch, int64_t out_ch,
                         int64_t kernel, int64_t stride, int64_t padding) {
    if (in_ch <= 0 || out_ch <= 0 || kernel <= 0 || stride <= 0 || padding < 0) {
        ts_error(TS_ERR_VALUE, "Conv2d %s: channels %lld -> %lld, kernel %lld, stride %lld, padding %lld are invalid",
                 name, (long long)in_ch, (long long)out_ch, (long long)kernel, (long long)stride, (long long)padding);
        return NULL;
    }
    ts_module *mod = ts_module_new(m, &conv2d_ops, parent, name);
    if (!mod) return NULL;
    mod->iargs[0] = stride;
    mod->iargs[1] = padding;
    double bound = 1.0 / sqrt((double)(in_ch * kernel * kernel));
    bool ok = ts_module_param(mod, "weight", 4, (int64_t[]){out_ch, in_ch, kernel, kernel},
                              (ts_init){TS_INIT_UNIFORM, bound}, true) >= 0 &&
              ts_module_param(mod, "bias", 1, &out_ch, (ts_init){TS_INIT_UNIFORM, bound}, false) >= 0;
    return checked(mod, ok);
}

static ts_tensor *maxpool2d_forward(ts_module *mod, ts_tensor *x) {
    int64_t k = mod->iargs[0], s = mod->iargs[1];
    return ts_max_pool2d(x, k, k, s, s, 0, 0);
}

static const ts_module_ops maxpool2d_ops = {"MaxPool2d", maxpool2d_forward, NULL};

ts_module *ts_maxpool2d_new(ts_model *m, const ts_module *parent, const char *name, int64_t kernel,
                            int64_t stride) {
    if (kernel <= 0 || stride <= 0) {
        ts_error(TS_ERR_VALUE, "MaxPool2d %s: kernel %lld and stride %lld must be positive", name, (long long)kernel,
                 (long long)stride);
        return NULL;
    }
    ts_module *mod = ts_module_new(m, &maxpool2d_ops, parent, name);
    if (mod) {
        mod->iargs[0] = kernel;
        mod->iargs[1] = stride;
    }
    return mod;
}
