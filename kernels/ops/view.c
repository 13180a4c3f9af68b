/* view.c - differentiable views and copies, forward and backward. */
#include "kernels/ops/view.h"

#include <string.h>

#include "kernels/autograd.h"

/* Checks op's input x is a tensor (any dtype) and, when ndim > 0, that the
 * array giving its new geometry (named what) is there. */
static bool bad_args(const char *op, const ts_tensor *x, int ndim, const void *array, const char *what) {
    if (ts_check_arg(op, "x", x, TS_ANY_DTYPE)) return true;
    if (ndim > 0 && !array) {
        ts_error(TS_ERR_VALUE, "%s: %s is NULL for %d dims (x %s)", op, what, ndim, ts_shape_str(x));
        return true;
    }
    return false;
}

/* Checks op's input x is a tensor (any dtype). */
static bool bad_input(const char *op, const ts_tensor *x) { return bad_args(op, x, 0, NULL, NULL); }

/* A view of x with the given geometry (shares storage; no history). */
static ts_tensor *raw_view(ts_tensor *x, int64_t offset, int ndim, const int64_t *shape, const int64_t *strides) {
    return ts_tensor_from_storage(x->storage, x->dtype, offset, ndim, shape, strides);
}

/* ---- reshape ---- */

static ts_status reshape_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    ts_tensor *x = n->inputs[0];
    gin[0] = ts_reshape(g, x->ndim, x->shape);
    return gin[0] ? TS_OK : ts_last_status();
}

/* Adds x's dim k to a chunk being merged: size-1 dims are free; every other
 * dim must sit exactly `*next` elements apart from the chunk's previous
 * non-1 dim. *inner gets the stride of the chunk's innermost non-1 dim. */
static bool take_dim(const ts_tensor *x, int k, int64_t *n, int64_t *inner, int64_t *next) {
    *n *= x->shape[k];
    if (x->shape[k] == 1) return true;
    if (*next >= 0 && x->strides[k] != *next) return false;
    if (*next < 0) *inner = x->strides[k];
    *next = x->strides[k] * x->shape[k];
    return true;
}

/* Strides for viewing x as shape without a copy, if possible. Splits and
 * merges are allowed within runs of x's dims that are laid out contiguously
 * relative to each other (size-1 dims never break a run). */
static bool view_strides(const ts_tensor *x, int ndim, const int64_t *shape, int64_t *strides) {
    int xd = x->ndim - 1, od = ndim - 1;
    while (od >= 0 || xd >= 0) {
        /* take one chunk: a run of x dims and a run of out dims of equal numel */
        int64_t xn = 1, on = 1, st = 1, next = -1;
        int os = od;
        if (xd >= 0 && !take_dim(x, xd--, &xn, &st, &next)) return false;
        if (od >= 0) on = shape[od--];
        while (xn != on) {
            if (xn < on) {
                if (xd < 0 || !take_dim(x, xd--, &xn, &st, &next)) return false;
            } else {
                if (od < 0) return false;
                on *= shape[od--];
            }
        }
        for (int d = os; d > od; d--) {
            strides[d] = st;
            st *= shape[d];
        }
    }
    return true;
}

ts_tensor *ts_reshape(ts_tensor *x, int ndim, const int64_t *shape) {
    if (bad_args("reshape", x, ndim, shape, "shape")) return NULL;
    if (ndim < 0 || ndim > TS_MAX_DIMS) {
        ts_error(TS_ERR_SHAPE, "reshape: %d dims is outside 0..%d", ndim, TS_MAX_DIMS);
        return NULL;
    }
    int64_t want[TS_MAX_DIMS], known = 1, n = ts_tensor_numel(x);
    int infer = -1;
    for (int d = 0; d < ndim; d++) {
        want[d] = shape[d];
        if (shape[d] == -1 && infer < 0) infer = d;
        else if (shape[d] < 0) goto bad;
        else known *= shape[d];
    }
    if (infer >= 0) {
        if (known == 0 || n % known) goto bad;
        want[infer] = n / known;
        known *= want[infer];
    }
    if (known != n) goto bad;
    int64_t strides[TS_MAX_DIMS];
    ts_tensor *out;
    if (n > 0 && view_strides(x, ndim, want, strides)) {
        out = raw_view(x, x->offset, ndim, want, strides);
    } else {
        ts_tensor *c = ts_tensor_copy_as(x, x->dtype);
        if (!c) return NULL;
        out = raw_view(c, 0, ndim, want, NULL);
        ts_tensor_release(c);
    }
    if (out) ts_node_forget_input_data(ts_autograd_record(out, "reshape", reshape_backward, 1, &x), 0);
    return out;
bad:
    ts_error(TS_ERR_SHAPE, "reshape: cannot view %s (%lld elements) as %s", ts_shape_str(x), (long long)n,
             ts_dims_str(ndim, shape));
    return NULL;
}

ts_tensor *ts_flatten(ts_tensor *x, int start, int end) {
    if (bad_input("flatten", x)) return NULL;
    int s = ts_dim_index(start, x->ndim), e = ts_dim_index(end, x->ndim);
    if (x->ndim == 0) return ts_reshape(x, 1, (int64_t[]){1});
    if (s < 0 || e < 0 || s > e) {
        ts_error(TS_ERR_SHAPE, "flatten: dims %d..%d invalid for %s", start, end, ts_shape_str(x));
        return NULL;
    }
    int64_t shape[TS_MAX_DIMS];
    int nd = 0;
    for (int d = 0; d < s; d++) shape[nd++] = x->shape[d];
    int64_t m = 1;
    for (int d = s; d <= e; d++) m *= x->shape[d];
    shape[nd++] = m;
    for (int d = e + 1; d < x->ndim; d++) shape[nd++] = x->shape[d];
    return ts_reshape(x, nd, shape);
}

/* ---- permute / transpose ---- */

static ts_status permute_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    int inv[TS_MAX_DIMS];
    for (int d = 0; d < g->ndim; d++) inv[n->iargs[d]] = d;
    gin[0] = ts_permute(g, inv);
    return gin[0] ? TS_OK : ts_last_status();
}

ts_tensor *ts_permute(ts_tensor *x, const int *perm) {
    if (bad_args("permute", x, x ? x->ndim : 0, perm, "perm")) return NULL;
    int64_t shape[TS_MAX_DIMS], strides[TS_MAX_DIMS];
    bool seen[TS_MAX_DIMS] = {false};
    for (int d = 0; d < x->ndim; d++) {
        int p = perm[d];
        if (p < 0 || p >= x->ndim || seen[p]) {
            ts_error(TS_ERR_SHAPE, "permute: entry %d (= %d) is not a permutation of the %d dims of %s", d, p,
                     x->ndim, ts_shape_str(x));
            return NULL;
        }
        seen[p] = true;
        shape[d] = x->shape[p];
        strides[d] = x->strides[p];
    }
    ts_tensor *out = raw_view(x, x->offset, x->ndim, shape, strides);
    ts_node *node = out ? ts_autograd_record(out, "permute", permute_backward, 1, &x) : NULL;
    ts_node_forget_input_data(node, 0); /* views: backward needs only shapes */
    if (node)
        for (int d = 0; d < x->ndim; d++) node->iargs[d] = perm[d];
    return out;
}

ts_tensor *ts_transpose(ts_tensor *x, int d0, int d1) {
    if (bad_input("transpose", x)) return NULL;
    int a = ts_dim_index(d0, x->ndim), b = ts_dim_index(d1, x->ndim);
    if (a < 0 || b < 0) {
        ts_error(TS_ERR_SHAPE, "transpose: dims %d, %d out of range for %s", d0, d1, ts_shape_str(x));
        return NULL;
    }
    int perm[TS_MAX_DIMS];
    for (int d = 0; d < x->ndim; d++) perm[d] = d;
    perm[a] = b;
    perm[b] = a;
    return ts_permute(x, perm);
}

/* ---- narrow ---- */

/* The gradient of the slice; the engine adds it into the input's
 * gradient at the node's window (see ts_node). */
static ts_status narrow_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    (void)n;
    gin[0] = ts_tensor_retain(g);
    return TS_OK;
}

ts_tensor *ts_narrow(ts_tensor *x, int dim, int64_t start, int64_t len) {
    if (bad_input("narrow", x)) return NULL;
    int d = ts_dim_index(dim, x->ndim);
    if (d < 0) {
        ts_error(TS_ERR_SHAPE, "narrow: dim %d out of range for %s", dim, ts_shape_str(x));
        return NULL;
    }
    if (start < 0 || len < 0 || start + len > x->shape[d]) {
        ts_error(TS_ERR_INDEX, "narrow: range [%lld, %lld) out of bounds for dim %d of %s", (long long)start,
                 (long long)(start + len), d, ts_shape_str(x));
        return NULL;
    }
    int64_t shape[TS_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[d] = len;
    ts_tensor *out = raw_view(x, x->offset + start * x->strides[d], x->ndim, shape, x->strides);
    ts_node *node = out ? ts_autograd_record(out, "narrow", narrow_backward, 1, &x) : NULL;
    ts_node_forget_input_data(node, 0);
    if (node) {
        node->window = true;
        node->window_dim = d;
        node->window_start = start;
    }
    return out;
}

/* ---- expand / squeeze / unsqueeze ---- */

static ts_status expand_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    (void)n;
    gin[0] = ts_tensor_retain(g); /* the engine sums over the broadcast dims */
    return TS_OK;
}

ts_tensor *ts_expand(ts_tensor *x, int ndim, const int64_t *shape) {
    if (bad_args("expand", x, ndim, shape, "shape")) return NULL;
    int lead = ndim - x->ndim;
    if (lead < 0 || ndim > TS_MAX_DIMS) goto bad;
    int64_t strides[TS_MAX_DIMS], want[TS_MAX_DIMS];
    for (int d = 0; d < ndim; d++) {
        int xd = d - lead;
        want[d] = shape[d];
        if (xd < 0) {
            if (shape[d] < 0) goto bad;
            strides[d] = 0;
        } else if (shape[d] == -1 || shape[d] == x->shape[xd]) {
            want[d] = x->shape[xd];
            strides[d] = x->strides[xd];
        } else if (x->shape[xd] == 1 && shape[d] >= 0) {
            strides[d] = 0;
        } else {
            goto bad;
        }
    }
    ts_tensor *out = raw_view(x, x->offset, ndim, want, strides);
    if (out) ts_node_forget_input_data(ts_autograd_record(out, "expand", expand_backward, 1, &x), 0);
    return out;
bad:
    ts_error(TS_ERR_SHAPE, "expand: cannot broadcast %s to %s", ts_shape_str(x), ts_dims_str(ndim, shape));
    return NULL;
}

ts_tensor *ts_squeeze(ts_tensor *x, int dim) {
    if (bad_input("squeeze", x)) return NULL;
    int d = ts_dim_index(dim, x->ndim);
    if (d < 0 || x->shape[d] != 1) {
        ts_error(TS_ERR_SHAPE, d < 0 ? "squeeze: dim %d out of range for %s" : "squeeze: dim %d of %s is not of size 1",
                 dim, ts_shape_str(x));
        return NULL;
    }
    int64_t shape[TS_MAX_DIMS];
    int nd = 0;
    for (int i = 0; i < x->ndim; i++)
        if (i != d) shape[nd++] = x->shape[i];
    return ts_reshape(x, nd, shape);
}

ts_tensor *ts_unsqueeze(ts_tensor *x, int dim) {
    if (bad_input("unsqueeze", x)) return NULL;
    int d = dim < 0 ? dim + x->ndim + 1 : dim;
    if (d < 0 || d > x->ndim || x->ndim == TS_MAX_DIMS) {
        if (x->ndim == TS_MAX_DIMS)
            ts_error(TS_ERR_SHAPE, "unsqueeze: %s already has the most dims a tensor can have (%d)",
                     ts_shape_str(x), TS_MAX_DIMS);
        else
            ts_error(TS_ERR_SHAPE, "unsqueeze: dim %d out of range for %s", dim, ts_shape_str(x));
        return NULL;
    }
    int64_t shape[TS_MAX_DIMS];
    int nd = 0;
    for (int i = 0; i <= x->ndim; i++) {
        if (i == d) shape[nd++] = 1;
        if (i < x->ndim) shape[nd++] = x->shape[i];
    }
    return ts_reshape(x, nd, shape);
}

/* ---- copies ---- */

static ts_status identity_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    (void)n;
    gin[0] = ts_tensor_retain(g); /* the engine converts dtype if needed */
    return TS_OK;
}

/* A contiguous copy of x in dtype dt, recorded as op. */
static ts_tensor *copy_op(ts_tensor *x, ts_dtype dt, const char *op) {
    ts_tensor *out = ts_tensor_copy_as(x, dt);
    if (out) {
        if (ts_dtype_is_float(dt)) ts_node_forget_input_data(ts_autograd_record(out, op, identity_backward, 1, &x), 0);
    }
    return out;
}

ts_tensor *ts_contiguous(ts_tensor *x) {
    if (bad_input("contiguous", x)) return NULL;
    if (ts_tensor_is_contiguous(x)) return ts_tensor_retain(x);
    return copy_op(x, x->dtype, "contiguous");
}

ts_tensor *ts_clone(ts_tensor *x) { return bad_input("clone", x) ? NULL : copy_op(x, x->dtype, "clone"); }

ts_tensor *ts_to_dtype(ts_tensor *x, ts_dtype dt) {
    if (bad_input("to_dtype", x)) return NULL;
    if (x->dtype == dt && ts_tensor_is_contiguous(x)) return ts_tensor_retain(x);
    return copy_op(x, dt, "to_dtype");
}

ts_tensor *ts_detach(ts_tensor *x) { return bad_input("detach", x) ? NULL : ts_tensor_alias(x); }

/* The gradient goes back to the input's device (iargs 0, 1). */
static ts_status to_device_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    gin[0] = ts_tensor_to(g, (ts_device){(ts_device_type)n->iargs[0], (int)n->iargs[1]});
    return gin[0] ? TS_OK : ts_last_status();
}

ts_tensor *ts_to_device(ts_tensor *x, ts_device d) {
    if (bad_input("to_device", x)) return NULL;
    ts_device from = ts_tensor_device(x);
    if (ts_device_equal(from, d)) return ts_contiguous(x);
    ts_tensor *out = ts_tensor_to(x, d);
    ts_node *n = out && ts_dtype_is_float(x->dtype) ? ts_autograd_record(out, "to_device", to_device_backward, 1, &x)
                                                    : NULL;
    ts_node_forget_input_data(n, 0);
    if (n) {
        n->iargs[0] = from.type;
        n->iargs[1] = from.index;
    }
    return out;
}

ts_status ts_broadcast_shape(const char *op, const ts_tensor *a, const ts_tensor *b, int *ndim, int64_t *shape) {
    int nd = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (int d = 0; d < nd; d++) {
        int ad = d - (nd - a->ndim), bd = d - (nd - b->ndim);
        int64_t as = ad >= 0 ? a->shape[ad] : 1, bs = bd >= 0 ? b->shape[bd] : 1;
        if (as != bs && as != 1 && bs != 1)
            return ts_error(TS_ERR_SHAPE, "%s: shapes %s and %s do not broadcast (dim %d: %lld vs %lld)", op,
                            ts_shape_str(a), ts_shape_str(b), d, (long long)as, (long long)bs);
        shape[d] = as == 1 ? bs : as;
    }
    *ndim = nd;
    return TS_OK;
}
