/* select.c - where / masked_fill, concat, split, stack; forward and
 * backward. */
#include "kernels/ops/select.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/autograd.h"
#include "kernels/ops/elementwise.h"
#include "kernels/ops/view.h"

/* ---- where ---- */

/* gradient of a: g where the mask holds, else 0; of b the other way. */
static ts_status where_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    ts_tensor *zero = ts_tensor_zeros_on(ts_tensor_device(g), g->dtype, 0, NULL);
    if (!zero) return ts_last_status();
    if (ts_node_wants(n, 0)) gin[0] = ts_where(n->saved[0], g, zero);
    if (ts_node_wants(n, 1)) gin[1] = ts_where(n->saved[0], zero, g);
    ts_tensor_release(zero);
    if ((ts_node_wants(n, 0) && !gin[0]) || (ts_node_wants(n, 1) && !gin[1])) return ts_last_status();
    return TS_OK;
}

/* where for op (a and b already float inputs). */
static ts_tensor *where_impl(const char *op, ts_tensor *mask, ts_tensor *a, ts_tensor *b) {
    if (ts_check_arg(op, "mask", mask, TS_MASK(TS_U8))) return NULL;
    if (a->dtype != b->dtype) {
        ts_error(TS_ERR_DTYPE, "%s: dtypes %s and %s differ (shapes %s and %s)", op, ts_dtype_name(a->dtype),
                 ts_dtype_name(b->dtype), ts_shape_str(a), ts_shape_str(b));
        return NULL;
    }
    int nd, md;
    int64_t shape[TS_MAX_DIMS], full[TS_MAX_DIMS];
    if (ts_broadcast_shape(op, a, b, &nd, shape)) return NULL;
    ts_tensor ab = {.ndim = nd}; /* only its shape: for broadcasting the mask */
    memcpy(ab.shape, shape, sizeof shape);
    if (ts_broadcast_shape(op, mask, &ab, &md, full)) return NULL;
    const ts_backend *be = ts_backend_for(op, 3, (ts_tensor *[]){mask, a, b});
    ts_tensor *out = be ? ts_tensor_empty_on(ts_tensor_device(a), a->dtype, md, full) : NULL;
    if (!out) return NULL;
    int64_t sm[TS_MAX_DIMS], sa[TS_MAX_DIMS], sb[TS_MAX_DIMS];
    ts_broadcast_strides(mask, md, full, sm);
    ts_broadcast_strides(a, md, full, sa);
    ts_broadcast_strides(b, md, full, sb);
    if (ts_tensor_numel(out) > 0 &&
        be->pointwise->where(md, full, (ts_operand){ts_tensor_data(mask), TS_U8, sm},
                             (ts_operand){ts_tensor_data(a), a->dtype, sa}, (ts_operand){ts_tensor_data(b), b->dtype, sb},
                             ts_tensor_data(out))) {
        ts_tensor_release(out);
        return NULL;
    }
    ts_tensor *ins[2] = {a, b};
    ts_node *node = ts_autograd_record(out, op, where_backward, 2, ins);
    if (node) ts_node_save(node, 0, mask);
    return out;
}

ts_tensor *ts_where(ts_tensor *mask, ts_tensor *a0, ts_tensor *b0) {
    ts_tensor *a = ts_float_input("where", "a", a0);
    ts_tensor *b = a ? ts_float_input("where", "b", b0) : NULL;
    ts_tensor *out = b ? where_impl("where", mask, a, b) : NULL;
    ts_tensor_release(a);
    ts_tensor_release(b);
    return out;
}

ts_tensor *ts_masked_fill(ts_tensor *a0, ts_tensor *mask, double value) {
    ts_tensor *a = ts_float_input("masked_fill", "input", a0), *v = NULL, *out = NULL;
    if (!a || ts_check_arg("masked_fill", "mask", mask, TS_MASK(TS_U8))) goto done;
    int nd;
    int64_t shape[TS_MAX_DIMS];
    if (ts_broadcast_shape("masked_fill", mask, a, &nd, shape)) goto done;
    if (nd != a->ndim || memcmp(shape, a->shape, sizeof(int64_t) * (size_t)nd)) {
        ts_error(TS_ERR_SHAPE, "masked_fill: mask %s does not broadcast to input %s", ts_shape_str(mask),
                 ts_shape_str(a));
        goto done;
    }
    if ((v = ts_tensor_full_on(ts_tensor_device(a), a->dtype, 0, NULL, value))) out = where_impl("masked_fill", mask, v, a);
done:
    ts_tensor_release(v);
    ts_tensor_release(a);
    return out;
}

/* ---- concat ---- */

static ts_status concat_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    int dim = (int)n->iargs[0];
    int64_t off = 0;
    for (int i = 0; i < n->n_inputs; i++) {
        int64_t len = n->inputs[i]->shape[dim];
        if (ts_node_wants(n, i) && !(gin[i] = ts_narrow(g, dim, off, len))) return ts_last_status();
        off += len;
    }
    return TS_OK;
}

/* Checks the n tensors agree in dtype and in every dim but `dim` (or in
 * every dim when dim < 0), naming op. */
static ts_status check_same(const char *op, int n, ts_tensor *const *t, int dim) {
    if (n < 1 || !t) return ts_error(TS_ERR_VALUE, "%s: needs at least one tensor (got %d)", op, n);
    for (int i = 0; i < n; i++) {
        char arg[32];
        snprintf(arg, sizeof arg, "tensors[%d]", i);
        if (ts_check_arg(op, arg, t[i], TS_ANY_DTYPE)) return ts_last_status();
        if (t[i]->dtype != t[0]->dtype)
            return ts_error(TS_ERR_DTYPE, "%s: tensors[%d] has dtype %s but tensors[0] has %s", op, i,
                            ts_dtype_name(t[i]->dtype), ts_dtype_name(t[0]->dtype));
        bool same = t[i]->ndim == t[0]->ndim;
        for (int d = 0; same && d < t[0]->ndim; d++) same = d == dim || t[i]->shape[d] == t[0]->shape[d];
        if (!same) {
            if (dim >= 0)
                return ts_error(TS_ERR_SHAPE, "%s: tensors[%d] has shape %s but tensors[0] has %s (all dims but %d must match)",
                                op, i, ts_shape_str(t[i]), ts_shape_str(t[0]), dim);
            return ts_error(TS_ERR_SHAPE, "%s: tensors[%d] has shape %s but tensors[0] has %s", op, i,
                            ts_shape_str(t[i]), ts_shape_str(t[0]));
        }
    }
    return ts_backend_for(op, n, t) ? TS_OK : ts_last_status();
}

ts_tensor *ts_concat(int n, ts_tensor *const *t, int dim) {
    if (n < 1 || !t) {
        ts_error(TS_ERR_VALUE, "concat: needs at least one tensor (got %d)", n);
        return NULL;
    }
    if (ts_check_arg("concat", "tensors[0]", t[0], TS_ANY_DTYPE)) return NULL;
    int d = ts_dim_index(dim, t[0]->ndim);
    if (d < 0) {
        ts_error(TS_ERR_SHAPE, "concat: dim %d out of range for %s", dim, ts_shape_str(t[0]));
        return NULL;
    }
    if (check_same("concat", n, t, d)) return NULL;
    int64_t shape[TS_MAX_DIMS], total = 0;
    memcpy(shape, t[0]->shape, sizeof shape);
    for (int i = 0; i < n; i++) total += t[i]->shape[d];
    shape[d] = total;
    ts_tensor *out = ts_tensor_empty_on(ts_tensor_device(t[0]), t[0]->dtype, t[0]->ndim, shape);
    if (!out) return NULL;
    int64_t off = 0;
    for (int i = 0; i < n; i++) { /* each input into its slice of out */
        ts_tensor *part = ts_tensor_from_storage(out->storage, out->dtype, off * out->strides[d], out->ndim,
                                                 t[i]->shape, out->strides);
        ts_status st = part ? ts_tensor_copy_(part, t[i]) : ts_last_status();
        ts_tensor_release(part);
        if (st) {
            ts_tensor_release(out);
            return NULL;
        }
        off += t[i]->shape[d];
    }
    ts_node *node = ts_autograd_record(out, "concat", concat_backward, n, t);
    for (int i = 0; i < n && node; i++) ts_node_forget_input_data(node, i); /* backward needs only shapes */
    if (node) node->iargs[0] = d;
    return out;
}

/* ---- split / stack ---- */

ts_status ts_split(ts_tensor *x, int dim, int n, const int64_t *sizes, ts_tensor **out) {
    if (!out) return ts_error(TS_ERR_VALUE, "split: out array is NULL");
    if (ts_check_arg("split", "input", x, TS_ANY_DTYPE)) return ts_last_status();
    for (int i = 0; i < n; i++) out[i] = NULL;
    int d = ts_dim_index(dim, x->ndim);
    if (d < 0) return ts_error(TS_ERR_SHAPE, "split: dim %d out of range for %s", dim, ts_shape_str(x));
    if (n < 1) return ts_error(TS_ERR_VALUE, "split: %d parts requested for %s", n, ts_shape_str(x));
    int64_t size = x->shape[d], sum = 0;
    if (!sizes && size % n)
        return ts_error(TS_ERR_SHAPE, "split: dim %d of %s (size %lld) does not divide into %d equal parts", d,
                        ts_shape_str(x), (long long)size, n);
    for (int i = 0; sizes && i < n; i++) {
        if (sizes[i] < 0)
            return ts_error(TS_ERR_VALUE, "split: part %d has negative size %lld", i, (long long)sizes[i]);
        sum += sizes[i];
    }
    if (sizes && sum != size)
        return ts_error(TS_ERR_SHAPE, "split: sizes %s sum to %lld but dim %d of %s has %lld", ts_dims_str(n, sizes),
                        (long long)sum, d, ts_shape_str(x), (long long)size);
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        int64_t len = sizes ? sizes[i] : size / n;
        if (!(out[i] = ts_narrow(x, d, off, len))) {
            ts_status st = ts_last_status();
            for (int k = 0; k < i; k++) {
                ts_tensor_release(out[k]);
                out[k] = NULL;
            }
            return st;
        }
        off += len;
    }
    return TS_OK;
}

ts_tensor *ts_stack(int n, ts_tensor *const *t, int dim) {
    if (check_same("stack", n, t, -1)) return NULL;
    int nd = t[0]->ndim, d = dim < 0 ? dim + nd + 1 : dim;
    if (d < 0 || d > nd || nd == TS_MAX_DIMS) {
        ts_error(TS_ERR_SHAPE, "stack: dim %d out of range for stacking %s tensors", dim, ts_shape_str(t[0]));
        return NULL;
    }
    ts_tensor **u = calloc((size_t)n, sizeof *u);
    if (!u) {
        ts_error(TS_ERR_MEMORY, "stack: out of memory for %d tensors", n);
        return NULL;
    }
    ts_tensor *out = NULL;
    int i = 0;
    while (i < n && (u[i] = ts_unsqueeze(t[i], d))) i++;
    if (i == n) out = ts_concat(n, u, d);
    for (int k = 0; k < i; k++) ts_tensor_release(u[k]);
    free(u);
    return out;
}
