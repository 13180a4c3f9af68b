/* elementwise.c - broadcasting binary arithmetic, the pointwise map driver
 * and the unary arithmetic ops, forward and backward; the loops are the
 * device's pointwise kernels (ops/backend.h). */
#include "kernels/ops/elementwise.h"

#include <string.h>

#include "kernels/autograd.h"
#include "kernels/ops/view.h"

/* ---- shared helpers ---- */

ts_tensor *ts_float_input(const char *op, const char *arg, ts_tensor *x) {
    if (ts_check_arg(op, arg, x, TS_FLOATS | TS_MASK(TS_BF16))) return NULL;
    return x->dtype == TS_BF16 ? ts_to_dtype(x, TS_F32) : ts_tensor_retain(x);
}

void ts_broadcast_strides(const ts_tensor *t, int ndim, const int64_t *shape, int64_t *strides) {
    int lead = ndim - t->ndim;
    for (int d = 0; d < ndim; d++) {
        int td = d - lead;
        strides[d] = (td < 0 || (t->shape[td] == 1 && shape[d] != 1)) ? 0 : t->strides[td];
    }
}

/* g in dtype dt (g retained when it already is). */
static ts_tensor *grad_in_dtype(ts_tensor *g, ts_dtype dt) {
    return g->dtype == dt ? ts_tensor_retain(g) : ts_tensor_copy_as(g, dt);
}

/* ---- binary ops: plan + kernels ---- */

typedef struct {
    const char *name;
    ts_binary_kind kind;
    ts_backward_fn backward;
    bool save_out;
    bool grad_without_inputs; /* backward reads neither input's values */
} bin_op;

/* t is contiguous with exactly the output shape. */
static bool is_full(const ts_tensor *t, int nd, const int64_t *shape) {
    return t->ndim == nd && !memcmp(t->shape, shape, sizeof(int64_t) * (size_t)nd) && ts_tensor_is_contiguous(t);
}

/* t is contiguous and, padded to nd dims, is 1s followed by the trailing
 * dims of shape: broadcasting repeats t as a row of numel(t) elements. */
static bool is_row(const ts_tensor *t, int nd, const int64_t *shape) {
    if (!ts_tensor_is_contiguous(t)) return false;
    int lead = nd - t->ndim, d = nd - 1;
    while (d >= 0 && d - lead >= 0 && t->shape[d - lead] == shape[d]) d--;
    for (; d >= 0; d--)
        if (d - lead >= 0 && t->shape[d - lead] != 1) return false;
    return true;
}

/* How the kernel walks a, b and out (see ts_walk). */
static void plan_binary(ts_binary_plan *pl, const ts_tensor *a, const ts_tensor *b, ts_tensor *out) {
    int nd = out->ndim;
    const int64_t *shape = out->shape;
    pl->a = ts_tensor_data(a);
    pl->b = ts_tensor_data(b);
    pl->out = ts_tensor_data(out);
    pl->n = ts_tensor_numel(out);
    bool fa = is_full(a, nd, shape), fb = is_full(b, nd, shape);
    if (fa && fb) pl->walk = TS_WALK_SAME;
    else if (fa && ts_tensor_numel(b) == 1) pl->walk = TS_WALK_B_SCALAR;
    else if (fb && ts_tensor_numel(a) == 1) pl->walk = TS_WALK_A_SCALAR;
    else if (fa && is_row(b, nd, shape)) pl->walk = TS_WALK_B_ROW, pl->period = ts_tensor_numel(b);
    else if (fb && is_row(a, nd, shape)) pl->walk = TS_WALK_A_ROW, pl->period = ts_tensor_numel(a);
    else {
        pl->ndim = nd;
        memcpy(pl->shape, shape, sizeof(int64_t) * (size_t)nd);
        ts_broadcast_strides(a, nd, shape, pl->sa);
        ts_broadcast_strides(b, nd, shape, pl->sb);
        bool across = nd >= 2 && ((pl->sa[nd - 1] != 0 && pl->sa[nd - 1] != 1) || (pl->sb[nd - 1] != 0 && pl->sb[nd - 1] != 1));
        pl->walk = across ? TS_WALK_TILED : TS_WALK_STRIDED;
    }
}

static ts_tensor *binary(const bin_op *op, ts_tensor *a0, ts_tensor *b0) {
    ts_tensor *a = ts_float_input(op->name, "a", a0);
    ts_tensor *b = a ? ts_float_input(op->name, "b", b0) : NULL;
    ts_tensor *out = NULL;
    int nd;
    int64_t shape[TS_MAX_DIMS];
    if (!b) goto done;
    if (a->dtype != b->dtype) {
        ts_error(TS_ERR_DTYPE, "%s: dtypes %s and %s differ (shapes %s and %s)", op->name, ts_dtype_name(a->dtype),
                 ts_dtype_name(b->dtype), ts_shape_str(a), ts_shape_str(b));
        goto done;
    }
    if (ts_broadcast_shape(op->name, a, b, &nd, shape)) goto done;
    const ts_backend *be = ts_backend_for(op->name, 2, (ts_tensor *[]){a, b});
    if (!be || !(out = ts_tensor_empty_on(ts_tensor_device(a), a->dtype, nd, shape))) goto done;
    ts_binary_plan pl = {0};
    plan_binary(&pl, a, b, out);
    if (pl.n > 0 && be->pointwise->binary(op->kind, a->dtype, &pl)) {
        ts_tensor_release(out);
        out = NULL;
        goto done;
    }
    ts_node *n = ts_autograd_record(out, op->name, op->backward, 2, (ts_tensor *[]){a, b});
    if (n && op->save_out) ts_node_save(n, 0, out);
    if (n && op->grad_without_inputs) {
        ts_node_forget_input_data(n, 0);
        ts_node_forget_input_data(n, 1);
    }
done:
    ts_tensor_release(a);
    ts_tensor_release(b);
    return out;
}

/* ---- add / sub / mul / div backward (gradients at the broadcast shape) ---- */

static ts_status add_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    if (ts_node_wants(n, 0)) gin[0] = ts_tensor_retain(g);
    if (ts_node_wants(n, 1)) gin[1] = ts_tensor_retain(g);
    return TS_OK;
}

static ts_status sub_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    if (ts_node_wants(n, 0)) gin[0] = ts_tensor_retain(g);
    if (ts_node_wants(n, 1) && !(gin[1] = ts_neg(g))) return ts_last_status();
    return TS_OK;
}

static ts_status mul_backward(ts_node *n, ts_tensor *g0, ts_tensor **gin) {
    ts_tensor *g = grad_in_dtype(g0, n->out_dtype);
    if (!g) return ts_last_status();
    if (ts_node_wants(n, 0)) gin[0] = ts_mul(g, n->inputs[1]);
    if (ts_node_wants(n, 1)) gin[1] = ts_mul(g, n->inputs[0]);
    ts_tensor_release(g);
    if ((ts_node_wants(n, 0) && !gin[0]) || (ts_node_wants(n, 1) && !gin[1])) return ts_last_status();
    return TS_OK;
}

/* d(a/b)/da = 1/b, d(a/b)/db = -(a/b)/b = -(g/b) * out. */
static ts_status div_backward(ts_node *n, ts_tensor *g0, ts_tensor **gin) {
    ts_tensor *g = grad_in_dtype(g0, n->out_dtype);
    ts_tensor *q = g ? ts_div(g, n->inputs[1]) : NULL;
    ts_tensor_release(g);
    if (!q) return ts_last_status();
    ts_status st = TS_OK;
    if (ts_node_wants(n, 1)) {
        ts_tensor *t = ts_mul(q, n->saved[0]);
        gin[1] = t ? ts_neg(t) : NULL;
        ts_tensor_release(t);
        if (!gin[1]) st = ts_last_status();
    }
    if (ts_node_wants(n, 0)) gin[0] = q;
    else ts_tensor_release(q);
    return st;
}

static const bin_op add_op = {"add", TS_BIN_ADD, add_backward, false, true};
static const bin_op sub_op = {"sub", TS_BIN_SUB, sub_backward, false, true};
static const bin_op mul_op = {"mul", TS_BIN_MUL, mul_backward, false, false};
static const bin_op div_op = {"div", TS_BIN_DIV, div_backward, true, false};

ts_tensor *ts_add(ts_tensor *a, ts_tensor *b) { return binary(&add_op, a, b); }
ts_tensor *ts_sub(ts_tensor *a, ts_tensor *b) { return binary(&sub_op, a, b); }
ts_tensor *ts_mul(ts_tensor *a, ts_tensor *b) { return binary(&mul_op, a, b); }
ts_tensor *ts_div(ts_tensor *a, ts_tensor *b) { return binary(&div_op, a, b); }

/* ---- the pointwise map driver ---- */

/* What backward of each map reads: x, the output y, or neither. */
#define USES_X 1u
#define USES_Y 2u
static const struct {
    const char *name;
    unsigned uses;
} maps[TS_NMAPS] = {
    [TS_MAP_NEG] = {"neg", 0},
    [TS_MAP_ADD_SCALAR] = {"add_scalar", 0},
    [TS_MAP_MUL_SCALAR] = {"mul_scalar", 0},
    [TS_MAP_POW] = {"pow_scalar", USES_X},
    [TS_MAP_EXP] = {"exp", USES_Y},
    [TS_MAP_LOG] = {"log", USES_X},
    [TS_MAP_SQRT] = {"sqrt", USES_Y},
    [TS_MAP_ABS] = {"abs", USES_X},
    [TS_MAP_RELU] = {"relu", USES_Y}, /* y > 0 exactly where x > 0 */
    [TS_MAP_GELU] = {"gelu", USES_X},
    [TS_MAP_SIGMOID] = {"sigmoid", USES_Y},
    [TS_MAP_TANH] = {"tanh", USES_Y},
};

/* iargs[0] = kind, fargs[0] = p; saved[0] = the output when it is read;
 * the input may be only its shape (then g stands in for it). */
static ts_status map_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    ts_map_kind kind = (ts_map_kind)n->iargs[0];
    ts_tensor *x = n->inputs[0], *y = n->saved[0];
    const ts_backend *be = ts_backend_for(maps[kind].name, 2, (ts_tensor *[]){g, y});
    ts_tensor *gc = be ? ts_to_dtype(g, x->dtype) : NULL;
    ts_tensor *gx = gc ? ts_tensor_empty_on(ts_tensor_device(g), x->dtype, x->ndim, x->shape) : NULL;
    ts_status st = gx ? TS_OK : ts_last_status();
    if (!st) {
        const void *gd = ts_tensor_data(gc);
        st = be->pointwise->map_backward(kind, x->dtype, gd, maps[kind].uses & USES_X ? ts_tensor_data(x) : gd,
                                         maps[kind].uses & USES_Y ? ts_tensor_data(y) : gd, ts_tensor_data(gx),
                                         ts_tensor_numel(x), n->fargs[0]);
    }
    ts_tensor_release(gc);
    if (st) ts_tensor_release(gx);
    else gin[0] = gx;
    return st;
}

ts_tensor *ts_map_apply(ts_map_kind kind, ts_tensor *x0, double p) {
    const char *op = maps[kind].name;
    ts_tensor *xf = ts_float_input(op, "input", x0);
    const ts_backend *be = xf ? ts_backend_for(op, 1, &xf) : NULL;
    ts_tensor *x = be ? ts_contiguous(xf) : NULL;
    ts_tensor_release(xf);
    ts_tensor *out = x ? ts_tensor_empty_like(x) : NULL;
    if (out && be->pointwise->map(kind, x->dtype, ts_tensor_data(x), ts_tensor_data(out), ts_tensor_numel(x), p)) {
        ts_tensor_release(out);
        out = NULL;
    }
    ts_node *n = out ? ts_autograd_record(out, op, map_backward, 1, &x) : NULL;
    if (n) {
        n->iargs[0] = kind;
        n->fargs[0] = p;
        if (maps[kind].uses & USES_Y) ts_node_save(n, 0, out);
        if (!(maps[kind].uses & USES_X)) ts_node_forget_input_data(n, 0);
    }
    ts_tensor_release(x);
    return out;
}

ts_tensor *ts_neg(ts_tensor *a) { return ts_map_apply(TS_MAP_NEG, a, 0); }
ts_tensor *ts_add_scalar(ts_tensor *a, double s) { return ts_map_apply(TS_MAP_ADD_SCALAR, a, s); }
ts_tensor *ts_mul_scalar(ts_tensor *a, double s) { return ts_map_apply(TS_MAP_MUL_SCALAR, a, s); }
ts_tensor *ts_pow_scalar(ts_tensor *a, double p) { return ts_map_apply(TS_MAP_POW, a, p); }
ts_tensor *ts_exp(ts_tensor *a) { return ts_map_apply(TS_MAP_EXP, a, 0); }
ts_tensor *ts_log(ts_tensor *a) { return ts_map_apply(TS_MAP_LOG, a, 0); }
ts_tensor *ts_sqrt(ts_tensor *a) { return ts_map_apply(TS_MAP_SQRT, a, 0); }
ts_tensor *ts_abs(ts_tensor *a) { return ts_map_apply(TS_MAP_ABS, a, 0); }
