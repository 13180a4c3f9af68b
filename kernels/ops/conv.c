/* conv.c - conv2d: operand checks, the autograd node and the calls to the
 * device's conv kernels (the CPU's choose between a direct and an im2col +
 * GEMM implementation: kernels/ops/cpu/conv_cpu.h). */
#include "kernels/ops/conv.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/autograd.h"
#include "kernels/ops/backend.h"

ts_conv2d_opts ts_conv2d_default_opts(void) {
    return (ts_conv2d_opts){.stride_h = 1, .stride_w = 1, .pad_h = 0, .pad_w = 0, .dil_h = 1, .dil_w = 1, .groups = 1};
}

/* The input x of the first conv of a network needs no gradient, so only
 * the weight (and bias) gradients are computed for it. */
static ts_status conv2d_backward(ts_node *n, ts_tensor *grad, ts_tensor **gin) {
    ts_conv_geom g;
    memcpy(&g, n->ctx, sizeof g);
    ts_tensor *x = n->inputs[0], *w = n->inputs[1];
    bool want_x = ts_node_wants(n, 0), want_w = ts_node_wants(n, 1);
    const ts_backend *be = ts_backend_for("conv2d", 3, (ts_tensor *[]){x, w, grad});
    ts_tensor *gd = be ? ts_tensor_dense(grad) : NULL, *xd = NULL, *wd = NULL;
    ts_status st = gd ? TS_OK : ts_last_status();
    if (!st && (want_x || want_w)) {
        xd = want_w ? ts_tensor_dense(x) : NULL;
        wd = want_x ? ts_tensor_dense(w) : NULL;
        if (want_w && xd) gin[1] = ts_tensor_empty_like(w);
        if (want_x && wd) gin[0] = ts_tensor_empty_like(x);
        if ((want_w && !gin[1]) || (want_x && !gin[0])) st = ts_last_status();
        else
            st = be->conv->backward(x->dtype, &g, xd ? ts_tensor_data(xd) : NULL, wd ? ts_tensor_data(wd) : NULL,
                                    ts_tensor_data(gd), want_w ? ts_tensor_data(gin[1]) : NULL,
                                    want_x ? ts_tensor_data(gin[0]) : NULL);
    }
    if (!st && n->n_inputs > 2 && ts_node_wants(n, 2)) {
        gin[2] = ts_tensor_empty_on(ts_tensor_device(grad), grad->dtype, 1, (int64_t[]){g.O});
        st = gin[2] ? be->conv->bias_backward(grad->dtype, &g, ts_tensor_data(gd), ts_tensor_data(gin[2]))
                    : ts_last_status();
    }
    ts_tensor *tmp[] = {gd, xd, wd};
    for (size_t i = 0; i < sizeof tmp / sizeof tmp[0]; i++) ts_tensor_release(tmp[i]);
    return st;
}

/* Checks the operands and options and fills g; records the error if bad. */
static ts_status conv_check(const ts_tensor *x, const ts_tensor *w, const ts_tensor *bias, const ts_conv2d_opts *o,
                            ts_conv_geom *g) {
    const char *op = "conv2d";
    if (ts_check_arg(op, "input", x, TS_FLOATS) || ts_check_arg(op, "weight", w, TS_FLOATS) ||
        (bias && ts_check_arg(op, "bias", bias, TS_FLOATS)))
        return ts_last_status();
    if (w->dtype != x->dtype || (bias && bias->dtype != x->dtype))
        return ts_error(TS_ERR_DTYPE, "conv2d: dtypes differ (input %s, weight %s%s%s)", ts_dtype_name(x->dtype),
                        ts_dtype_name(w->dtype), bias ? ", bias " : "", bias ? ts_dtype_name(bias->dtype) : "");
    if (x->ndim != 4 || w->ndim != 4)
        return ts_error(TS_ERR_SHAPE, "conv2d: input %s must be [N,C,H,W] and weight %s [O,C,KH,KW]",
                        ts_shape_str(x), ts_shape_str(w));
    if (w->shape[1] != x->shape[1])
        return ts_error(TS_ERR_SHAPE, "conv2d: input %s has %lld channels but weight %s expects %lld",
                        ts_shape_str(x), (long long)x->shape[1], ts_shape_str(w), (long long)w->shape[1]);
    if (bias && (bias->ndim != 1 || bias->shape[0] != w->shape[0]))
        return ts_error(TS_ERR_SHAPE, "conv2d: bias %s must be [%lld] for weight %s", ts_shape_str(bias),
                        (long long)w->shape[0], ts_shape_str(w));
    if (o->groups != 1)
        return ts_error(TS_ERR_UNSUPPORTED, "conv2d: groups = %lld is not supported (only 1)", (long long)o->groups);
    if (o->stride_h < 1 || o->stride_w < 1 || o->dil_h < 1 || o->dil_w < 1 || o->pad_h < 0 || o->pad_w < 0)
        return ts_error(TS_ERR_VALUE,
                        "conv2d: stride (%lld,%lld) and dilation (%lld,%lld) must be >= 1, padding (%lld,%lld) >= 0",
                        (long long)o->stride_h, (long long)o->stride_w, (long long)o->dil_h, (long long)o->dil_w,
                        (long long)o->pad_h, (long long)o->pad_w);
    *g = (ts_conv_geom){.N = x->shape[0], .C = x->shape[1], .H = x->shape[2], .W = x->shape[3], .O = w->shape[0],
                     .KH = w->shape[2], .KW = w->shape[3], .sh = o->stride_h, .sw = o->stride_w, .ph = o->pad_h,
                     .pw = o->pad_w, .dh = o->dil_h, .dw = o->dil_w};
    int64_t eh = g->dh * (g->KH - 1) + 1, ew = g->dw * (g->KW - 1) + 1;
    int64_t ih = g->H + 2 * g->ph, iw = g->W + 2 * g->pw;
    if (g->KH < 1 || g->KW < 1 || eh > ih || ew > iw)
        return ts_error(TS_ERR_SHAPE,
                        "conv2d: kernel %lldx%lld (dilated %lldx%lld) does not fit input %s padded to %lldx%lld",
                        (long long)g->KH, (long long)g->KW, (long long)eh, (long long)ew, ts_shape_str(x),
                        (long long)ih, (long long)iw);
    g->Ho = (ih - eh) / g->sh + 1;
    g->Wo = (iw - ew) / g->sw + 1;
    return TS_OK;
}

ts_tensor *ts_conv2d(ts_tensor *x, ts_tensor *w, ts_tensor *bias, const ts_conv2d_opts *opts) {
    ts_conv2d_opts defaults = ts_conv2d_default_opts();
    ts_conv_geom g;
    if (conv_check(x, w, bias, opts ? opts : &defaults, &g)) return NULL;
    const ts_backend *be = ts_backend_for("conv2d", 3, (ts_tensor *[]){x, w, bias});
    if (!be) return NULL;
    ts_tensor *xd = ts_tensor_dense(x), *wd = ts_tensor_dense(w), *bd = bias ? ts_tensor_dense(bias) : NULL;
    ts_tensor *out = xd && wd && (!bias || bd)
                         ? ts_tensor_empty_on(ts_tensor_device(x), x->dtype, 4, (int64_t[]){g.N, g.O, g.Ho, g.Wo})
                         : NULL;
    if (out && be->conv->forward(x->dtype, &g, ts_tensor_data(xd), ts_tensor_data(wd), bd ? ts_tensor_data(bd) : NULL,
                                 ts_tensor_data(out))) {
        ts_tensor_release(out);
        out = NULL;
    }
    ts_tensor *tmp[] = {xd, wd, bd};
    for (size_t i = 0; i < sizeof tmp / sizeof tmp[0]; i++) ts_tensor_release(tmp[i]);
    if (!out) return NULL;
    ts_tensor *in[3] = {x, w, bias};
    ts_node *n = ts_autograd_record(out, "conv2d", conv2d_backward, bias ? 3 : 2, in);
    if (n) {
        n->ctx = malloc(sizeof g);
        if (!n->ctx) {
            ts_tensor_release(out);
            ts_error(TS_ERR_MEMORY, "conv2d: out of memory recording the node");
            return NULL;
        }
        memcpy(n->ctx, &g, sizeof g);
        n->ctx_free = free;
    }
    return out;
}
