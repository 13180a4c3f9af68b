/* reduce.c - sum, mean and max over dims, forward and backward, on the
 * device's reduce kernels.
 *
 * Every reduction runs on a contiguous tensor seen as [outer, red, inner]:
 * when the reduced dims (ignoring size-1 dims) are one run, the input is
 * used as it is; otherwise it is first permuted so the reduced dims come
 * last (inner = 1). The autograd node is recorded on that contiguous tensor
 * and the permute/contiguous view ops carry the gradient the rest of the way.
 */
#include "kernels/ops/reduce.h"

#include <math.h>
#include <string.h>

#include "kernels/autograd.h"
#include "kernels/ops/elementwise.h"
#include "kernels/ops/view.h"

typedef enum { R_SUM, R_MEAN, R_MAX } rkind;

static const char *const rnames[] = {"sum", "mean", "max"};

/* ---- backward ---- */

/* g reshaped to the node input's shape with the reduced dims (bit mask
 * iargs[0]) as 1, then broadcast back over them, times scale. */
static ts_status sum_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    ts_tensor *x = n->inputs[0];
    int64_t kshape[TS_MAX_DIMS];
    for (int d = 0; d < x->ndim; d++) kshape[d] = (n->iargs[0] >> d) & 1 ? 1 : x->shape[d];
    ts_tensor *gr = ts_reshape(g, x->ndim, kshape);
    if (gr && n->fargs[0] != 1.0) {
        ts_tensor *s = ts_mul_scalar(gr, n->fargs[0]);
        ts_tensor_release(gr);
        gr = s;
    }
    gin[0] = gr ? ts_expand(gr, x->ndim, x->shape) : NULL;
    ts_tensor_release(gr);
    return gin[0] ? TS_OK : ts_last_status();
}

static ts_status max_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    ts_tensor *x = n->inputs[0], *idx = n->saved[0];
    const ts_backend *be = ts_backend_for("max", 2, (ts_tensor *[]){g, idx});
    ts_tensor *gc = be ? ts_to_dtype(g, x->dtype) : NULL;
    ts_tensor *gx = gc ? ts_tensor_empty_like(x) : NULL;
    ts_status st = gx ? be->reduce->max_backward(x->dtype, ts_tensor_data(gc), ts_tensor_data(idx), ts_tensor_data(gx),
                                                 n->iargs[1], n->iargs[2], n->iargs[3])
                      : ts_last_status();
    ts_tensor_release(gc);
    if (st) ts_tensor_release(gx);
    else gin[0] = gx;
    return st;
}

/* ---- forward ---- */

/* The reduced-dim bit mask of dims for a tensor of ndim dims. */
static ts_status dims_mask(const char *op, const ts_tensor *a, int ndims, const int *dims, unsigned *mask) {
    *mask = 0;
    if (ndims == 0 || !dims) {
        *mask = (1u << a->ndim) - 1;
        return TS_OK;
    }
    if (ndims < 0 || ndims > TS_MAX_DIMS)
        return ts_error(TS_ERR_SHAPE, "%s: %d dims listed for %s", op, ndims, ts_shape_str(a));
    for (int i = 0; i < ndims; i++) {
        int d = ts_dim_index(dims[i], a->ndim);
        if (d < 0) return ts_error(TS_ERR_SHAPE, "%s: dim %d out of range for %s", op, dims[i], ts_shape_str(a));
        if (*mask & (1u << d))
            return ts_error(TS_ERR_SHAPE, "%s: dim %d listed twice for %s", op, dims[i], ts_shape_str(a));
        *mask |= 1u << d;
    }
    return TS_OK;
}

static ts_tensor *reduce(rkind kind, ts_tensor *a0, int ndims, const int *dims, bool keepdim) {
    const char *op = rnames[kind];
    ts_tensor *a = ts_float_input(op, "input", a0);
    const ts_backend *be = a ? ts_backend_for(op, 1, &a) : NULL;
    if (!be) {
        ts_tensor_release(a);
        return NULL;
    }
    unsigned mask;
    ts_tensor *xc = NULL, *out = NULL, *idx = NULL;
    if (dims_mask(op, a, ndims, dims, &mask)) goto done;
    int nd = a->ndim, ond = 0;
    int64_t oshape[TS_MAX_DIMS], outer = 1, red = 1, inner = 1;
    for (int d = 0; d < nd; d++) {
        if (!((mask >> d) & 1)) oshape[ond++] = a->shape[d];
        else if (keepdim) oshape[ond++] = 1;
    }
    /* the reduced dims of size != 1: one run lo..hi, or scattered */
    int lo = -1, hi = -1;
    bool one_run = true, kept_after = false;
    for (int d = 0; d < nd; d++) {
        if (a->shape[d] == 1) continue;
        if ((mask >> d) & 1) {
            if (lo < 0) lo = d;
            else if (kept_after) one_run = false;
            hi = d;
        } else if (lo >= 0) {
            kept_after = true;
        }
    }
    unsigned xmask = mask;
    if (one_run) {
        xc = ts_contiguous(a);
        if (lo < 0) lo = hi = nd; /* nothing of size > 1 reduced */
        for (int d = 0; d < nd; d++) {
            if (d < lo) outer *= a->shape[d];
            else if (d > hi) inner *= a->shape[d];
            else red *= a->shape[d];
        }
    } else {
        int perm[TS_MAX_DIMS], k = 0;
        for (int d = 0; d < nd; d++)
            if (!((mask >> d) & 1)) perm[k++] = d, outer *= a->shape[d];
        xmask = 0;
        for (int d = 0; d < nd; d++)
            if ((mask >> d) & 1) xmask |= 1u << k, perm[k++] = d, red *= a->shape[d];
        ts_tensor *p = ts_permute(a, perm);
        xc = p ? ts_contiguous(p) : NULL;
        ts_tensor_release(p);
    }
    if (!xc) goto done;
    if (kind == R_MAX && red == 0) {
        ts_error(TS_ERR_SHAPE, "max: cannot reduce %s over an empty dim", ts_shape_str(a));
        goto done;
    }
    ts_device dev = ts_tensor_device(a);
    out = ts_tensor_empty_on(dev, a->dtype, ond, oshape);
    if (!out) goto done;
    ts_status st = TS_OK;
    if (kind == R_MAX) {
        idx = ts_tensor_empty_on(dev, TS_I64, ond, oshape);
        st = idx ? be->reduce->max(a->dtype, ts_tensor_data(xc), ts_tensor_data(out), ts_tensor_data(idx), outer, red,
                                   inner)
                 : ts_last_status();
    } else if (outer * inner > 0) {
        double scale = kind == R_MEAN ? (red ? 1.0 / (double)red : NAN) : 1.0;
        st = be->reduce->sum(a->dtype, ts_tensor_data(xc), ts_tensor_data(out), outer, red, inner, scale);
    }
    if (st) {
        ts_tensor_release(out);
        out = NULL;
        goto done;
    }
    ts_node *n = ts_autograd_record(out, op, kind == R_MAX ? max_backward : sum_backward, 1, &xc);
    if (kind != R_MAX) ts_node_forget_input_data(n, 0); /* sum and mean backward need only the shape */
    if (n) {
        n->iargs[0] = xmask;
        n->iargs[1] = outer;
        n->iargs[2] = red;
        n->iargs[3] = inner;
        n->fargs[0] = kind == R_MEAN ? (red ? 1.0 / (double)red : 0.0) : 1.0;
        if (idx) ts_node_save(n, 0, idx);
    }
done:
    ts_tensor_release(idx);
    ts_tensor_release(xc);
    ts_tensor_release(a);
    return out;
}

ts_tensor *ts_sum(ts_tensor *a, int ndims, const int *dims, bool keepdim) {
    return reduce(R_SUM, a, ndims, dims, keepdim);
}
ts_tensor *ts_mean(ts_tensor *a, int ndims, const int *dims, bool keepdim) {
    return reduce(R_MEAN, a, ndims, dims, keepdim);
}
ts_tensor *ts_max(ts_tensor *a, int ndims, const int *dims, bool keepdim) {
    return reduce(R_MAX, a, ndims, dims, keepdim);
}
ts_tensor *ts_sum_all(ts_tensor *a) { return reduce(R_SUM, a, 0, NULL, false); }
ts_tensor *ts_mean_all(ts_tensor *a) { return reduce(R_MEAN, a, 0, NULL, false); }
ts_tensor *ts_max_all(ts_tensor *a) { return reduce(R_MAX, a, 0, NULL, false); }
