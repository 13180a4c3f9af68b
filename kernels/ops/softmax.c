/* softmax.c - softmax and log_softmax along a dim, forward and backward,
 * on the device's softmax kernels. */
#include "kernels/ops/softmax.h"

#include <stdbool.h>

#include "kernels/autograd.h"
#include "kernels/ops/backend.h"
#include "kernels/ops/view.h"

/* Rows of the last dim: count and length. */
static void last_dim_rows(const ts_tensor *t, int64_t *R, int64_t *n) {
    *n = t->ndim ? t->shape[t->ndim - 1] : 1;
    *R = *n ? ts_tensor_numel(t) / *n : 0;
}

/* iargs[0] = log; saved[0] = output. */
static ts_status softmax_backward(ts_node *node, ts_tensor *g, ts_tensor **gin) {
    if (!ts_node_wants(node, 0)) return TS_OK;
    ts_tensor *y = node->saved[0];
    const ts_backend *be = ts_backend_for(node->op, 2, (ts_tensor *[]){y, g});
    ts_tensor *gc = be ? ts_contiguous(g) : NULL;
    ts_tensor *gx = gc ? ts_tensor_empty_like(y) : NULL;
    int64_t R, n;
    last_dim_rows(y, &R, &n);
    ts_status st = gx ? be->softmax->backward(y->dtype, ts_tensor_data(y), ts_tensor_data(gc), ts_tensor_data(gx), R, n,
                                              node->iargs[0])
                      : ts_last_status();
    ts_tensor_release(gc);
    if (st) ts_tensor_release(gx);
    else gin[0] = gx;
    return st;
}

/* softmax (lg false) or log_softmax (lg true) of x along its last dim. */
static ts_tensor *softmax_last(const ts_backend *be, ts_tensor *x, bool lg, const char *op) {
    ts_tensor *xc = ts_tensor_dense(x);
    ts_tensor *y = xc ? ts_tensor_empty_like(x) : NULL;
    int64_t R, n;
    last_dim_rows(x, &R, &n);
    if (y && be->softmax->forward(x->dtype, ts_tensor_data(xc), ts_tensor_data(y), R, n, lg)) {
        ts_tensor_release(y);
        y = NULL;
    }
    ts_tensor_release(xc);
    if (!y) return NULL;
    ts_node *node = ts_autograd_record(y, op, softmax_backward, 1, &x);
    if (node) {
        node->iargs[0] = lg;
        ts_node_save(node, 0, y);
    }
    return y;
}

/* Along another dim: that dim is swapped to the end and back (differentiable
 * views), and the result made contiguous. */
static ts_tensor *softmax_op(ts_tensor *x, int dim, bool lg) {
    const char *op = lg ? "log_softmax" : "softmax";
    if (ts_check_arg(op, "x", x, TS_FLOATS)) return NULL;
    const ts_backend *be = ts_backend_for(op, 1, &x);
    if (!be) return NULL;
    int d = x->ndim == 0 && (dim == 0 || dim == -1) ? 0 : ts_dim_index(dim, x->ndim);
    if (d < 0) {
        ts_error(TS_ERR_SHAPE, "%s: dim %d out of range for %s (%d dims)", op, dim, ts_shape_str(x), x->ndim);
        return NULL;
    }
    if (x->ndim == 0 || d == x->ndim - 1) return softmax_last(be, x, lg, op);
    ts_tensor *t = ts_transpose(x, d, -1);
    ts_tensor *s = t ? softmax_last(be, t, lg, op) : NULL;
    ts_tensor *back = s ? ts_transpose(s, d, -1) : NULL;
    ts_tensor *out = back ? ts_contiguous(back) : NULL;
    ts_tensor_release(t);
    ts_tensor_release(s);
    ts_tensor_release(back);
    return out;
}

ts_tensor *ts_softmax(ts_tensor *x, int dim) { return softmax_op(x, dim, false); }

ts_tensor *ts_log_softmax(ts_tensor *x, int dim) { return softmax_op(x, dim, true); }
