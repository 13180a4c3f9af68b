/* norm.c - layer norm over the last dim, forward and fused backward, on
 * the device's layernorm kernels. */
#include "kernels/ops/norm.h"

#include <math.h>
#include <stdlib.h>

#include "kernels/autograd.h"
#include "kernels/ops/backend.h"
#include "kernels/ops/view.h"

/* Data pointer of an optional tensor. */
static void *opt_data(const ts_tensor *t) { return t ? ts_tensor_data(t) : NULL; }

/* saved: 0 x (contiguous), 1 weight (or NULL), 2 mean [R], 3 rstd [R]. */
static ts_status layernorm_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    ts_tensor *x = n->saved[0], *w = n->saved[1], *mean = n->saved[2], *rstd = n->saved[3];
    int64_t D = x->shape[x->ndim - 1], R = D ? ts_tensor_numel(x) / D : 0;
    const ts_backend *be = ts_backend_for("layernorm", 2, (ts_tensor *[]){x, g});
    ts_tensor *gc = be ? ts_contiguous(g) : NULL;
    ts_status st = gc ? TS_OK : ts_last_status();
    for (int i = 0; i < 3 && !st; i++) /* dx, dw, db as wanted */
        if (ts_node_wants(n, i) &&
            !(gin[i] = i ? ts_tensor_empty_on(ts_tensor_device(x), x->dtype, 1, &D) : ts_tensor_empty_like(x)))
            st = ts_last_status();
    if (!st)
        st = be->layernorm->backward(x->dtype, ts_tensor_data(x), opt_data(w), ts_tensor_data(mean), ts_tensor_data(rstd),
                                     ts_tensor_data(gc), opt_data(gin[0]), opt_data(gin[1]), opt_data(gin[2]), R, D);
    ts_tensor_release(gc);
    return st;
}

/* Checks an optional [D] parameter of x's dtype. */
static ts_status check_param(const char *arg, const ts_tensor *p, const ts_tensor *x, int64_t D) {
    if (!p) return TS_OK;
    if (ts_check_arg("layernorm", arg, p, TS_MASK(x->dtype))) return ts_last_status();
    if (p->ndim != 1 || p->shape[0] != D)
        return ts_error(TS_ERR_SHAPE, "layernorm: %s %s does not match the last dim of x %s (expected [%lld])", arg,
                        ts_shape_str(p), ts_shape_str(x), (long long)D);
    return TS_OK;
}

ts_tensor *ts_layernorm(ts_tensor *x, ts_tensor *weight, ts_tensor *bias, double eps) {
    if (ts_check_arg("layernorm", "x", x, TS_FLOATS)) return NULL;
    if (x->ndim < 1) {
        ts_error(TS_ERR_SHAPE, "layernorm: x %s needs at least one dim", ts_shape_str(x));
        return NULL;
    }
    int64_t D = x->shape[x->ndim - 1], R = D ? ts_tensor_numel(x) / D : 0;
    if (check_param("weight", weight, x, D) || check_param("bias", bias, x, D)) return NULL;
    if (!(eps > 0) || isinf(eps)) { /* eps 0 turns a constant row into NaN */
        ts_error(TS_ERR_VALUE, "layernorm: eps %g must be finite and > 0", eps);
        return NULL;
    }
    const ts_backend *be = ts_backend_for("layernorm", 3, (ts_tensor *[]){x, weight, bias});
    if (!be) return NULL;
    ts_device dev = ts_tensor_device(x);
    ts_tensor *xc = ts_tensor_dense(x);
    ts_tensor *wc = weight ? ts_tensor_copy_as(weight, x->dtype) : NULL;
    ts_tensor *bc = bias ? ts_tensor_copy_as(bias, x->dtype) : NULL;
    ts_tensor *y = ts_tensor_empty_like(x);
    ts_tensor *mean = ts_tensor_empty_on(dev, x->dtype, 1, &R), *rstd = ts_tensor_empty_on(dev, x->dtype, 1, &R);
    ts_tensor *out = NULL;
    if (xc && y && mean && rstd && (wc || !weight) && (bc || !bias) &&
        !be->layernorm->forward(x->dtype, ts_tensor_data(xc), opt_data(wc), opt_data(bc), ts_tensor_data(y),
                                ts_tensor_data(mean), ts_tensor_data(rstd), R, D, eps)) {
        out = ts_tensor_retain(y);
        ts_node *n = ts_autograd_record(out, "layernorm", layernorm_backward, 3, (ts_tensor *[]){x, weight, bias});
        if (n) {
            mean->storage->no_pack = rstd->storage->no_pack = true; /* statistics stay f32 */
            ts_node_save(n, 0, xc);
            if (wc) ts_node_save(n, 1, wc);
            ts_node_save(n, 2, mean);
            ts_node_save(n, 3, rstd);
        }
    }
    ts_tensor_release(xc);
    ts_tensor_release(wc);
    ts_tensor_release(bc);
    ts_tensor_release(y);
    ts_tensor_release(mean);
    ts_tensor_release(rstd);
    return out;
}
