/* dropout.c - key-driven dropout, forward and backward. Both directions run
 * the device's same kernel: y = x * keep(key, i) / (1 - p), regenerating
 * the random stream, so no mask is stored. */
#include "kernels/ops/dropout.h"

#include <math.h>

#include "kernels/autograd.h"
#include "kernels/ops/backend.h"
#include "kernels/ops/elementwise.h"
#include "kernels/ops/view.h"

/* Runs the kernel on contiguous x (dtype f32/f64) into a new tensor. */
static ts_tensor *apply_mask(ts_tensor *x, ts_key key, double p) {
    const ts_backend *be = ts_backend_for("dropout", 1, &x);
    ts_tensor *y = be ? ts_tensor_empty_like(x) : NULL;
    if (y && be->dropout->apply(x->dtype, key, ts_tensor_data(x), ts_tensor_data(y), ts_tensor_numel(x), p)) {
        ts_tensor_release(y);
        y = NULL;
    }
    return y;
}

static ts_key node_key(const ts_node *n) { return (ts_key){{(uint32_t)n->iargs[0], (uint32_t)n->iargs[1]}}; }

static ts_status dropout_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    ts_tensor *gc = ts_to_dtype(g, n->inputs[0]->dtype);
    gin[0] = gc ? apply_mask(gc, node_key(n), n->fargs[0]) : NULL;
    ts_tensor_release(gc);
    return gin[0] ? TS_OK : ts_last_status();
}

ts_tensor *ts_dropout(ts_tensor *x0, double p, ts_key key, bool train) {
    if (!(p >= 0 && p <= 1)) {
        ts_error(TS_ERR_VALUE, "dropout: probability %g is outside [0, 1]", p);
        return NULL;
    }
    ts_tensor *xf = ts_float_input("dropout", "input", x0);
    if (!xf || !train || p == 0) return xf;
    ts_tensor *x = ts_contiguous(xf);
    ts_tensor_release(xf);
    ts_tensor *y = x ? apply_mask(x, key, p) : NULL;
    ts_node *n = y ? ts_autograd_record(y, "dropout", dropout_backward, 1, &x) : NULL;
    if (n) {
        n->iargs[0] = key.k[0];
        n->iargs[1] = key.k[1];
        n->fargs[0] = p;
    }
    ts_tensor_release(x);
    return y;
}
