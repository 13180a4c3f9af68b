/* pool.c - max_pool2d and avg_pool2d, forward and backward, on the
 * device's pool kernels. */
#include "kernels/ops/pool.h"

#include <stdbool.h>
#include <string.h>

#include "kernels/autograd.h"
#include "kernels/ops/backend.h"

/* The geometry of a window k = {kh, kw, sh, sw, ph, pw} over an input of
 * shape [N,C,H,W] (already checked). */
static void ts_pool_geometry(const int64_t *shape, const int64_t *k, ts_pool_geom *g) {
    *g = (ts_pool_geom){.planes = shape[0] * shape[1], .H = shape[2], .W = shape[3], .kh = k[0], .kw = k[1],
                     .sh = k[2], .sw = k[3], .ph = k[4], .pw = k[5]};
    g->Ho = (g->H + 2 * g->ph - g->kh) / g->sh + 1;
    g->Wo = (g->W + 2 * g->pw - g->kw) / g->sw + 1;
}

/* Checks x and the window for op and fills g. k = {kh, kw, sh, sw, ph, pw}. */
static ts_status pool_check(const char *op, const ts_tensor *x, const int64_t *k, ts_pool_geom *g) {
    if (ts_check_arg(op, "input", x, TS_FLOATS)) return ts_last_status();
    if (x->ndim != 4) return ts_error(TS_ERR_SHAPE, "%s: input %s must be [N,C,H,W]", op, ts_shape_str(x));
    if (k[0] < 1 || k[1] < 1 || k[2] < 1 || k[3] < 1 || k[4] < 0 || k[5] < 0 || 2 * k[4] > k[0] ||
        2 * k[5] > k[1])
        return ts_error(TS_ERR_VALUE,
                        "%s: kernel %lldx%lld, stride %lldx%lld, padding %lldx%lld on input %s: kernel and stride "
                        "must be >= 1, padding between 0 and half the kernel",
                        op, (long long)k[0], (long long)k[1], (long long)k[2], (long long)k[3], (long long)k[4],
                        (long long)k[5], ts_shape_str(x));
    if (x->shape[2] * x->shape[3] > INT32_MAX)
        return ts_error(TS_ERR_SHAPE, "%s: input %s has planes of more than 2^31 - 1 elements", op, ts_shape_str(x));
    if (x->shape[2] + 2 * k[4] < k[0] || x->shape[3] + 2 * k[5] < k[1])
        return ts_error(TS_ERR_SHAPE, "%s: kernel %lldx%lld does not fit input %s padded by %lldx%lld", op,
                        (long long)k[0], (long long)k[1], ts_shape_str(x), (long long)k[4], (long long)k[5]);
    ts_pool_geometry(x->shape, k, g);
    return TS_OK;
}

/* The geometry a node was recorded with (window in iargs[0..5]); the input
 * is only its shape (see ts_node_forget_input_data). */
static void node_geom(const ts_node *n, ts_pool_geom *g) { ts_pool_geometry(n->inputs[0]->shape, n->iargs, g); }

static ts_status pool_backward(ts_node *n, ts_tensor *grad, ts_tensor **gin) {
    if (!ts_node_wants(n, 0)) return TS_OK;
    ts_pool_geom g;
    node_geom(n, &g);
    ts_tensor *x = n->inputs[0]; /* only its shape */
    const ts_backend *be = ts_backend_for(n->op, 2, (ts_tensor *[]){grad, n->saved[0]});
    ts_tensor *gd = be ? ts_tensor_dense(grad) : NULL;
    ts_tensor *dx = gd ? ts_tensor_empty_on(ts_tensor_device(grad), x->dtype, 4, x->shape) : NULL;
    ts_status st = !dx                ? ts_last_status()
                   : n->saved[0] ? be->pool->max_backward(x->dtype, &g, ts_tensor_data(gd), ts_tensor_data(n->saved[0]),
                                                          ts_tensor_data(dx))
                                 : be->pool->avg_backward(x->dtype, &g, ts_tensor_data(gd), ts_tensor_data(dx));
    ts_tensor_release(gd);
    if (st) ts_tensor_release(dx);
    else gin[0] = dx;
    return st;
}

/* Shared body of both pools: max when is_max. */
static ts_tensor *pool2d(const char *op, bool is_max, ts_tensor *x, const int64_t *k) {
    ts_pool_geom g;
    if (pool_check(op, x, k, &g)) return NULL;
    const ts_backend *be = ts_backend_for(op, 1, &x);
    if (!be) return NULL;
    ts_device dev = ts_tensor_device(x);
    int64_t shape[4] = {x->shape[0], x->shape[1], g.Ho, g.Wo};
    ts_tensor *xd = ts_tensor_dense(x);
    ts_tensor *out = xd ? ts_tensor_empty_on(dev, x->dtype, 4, shape) : NULL;
    ts_tensor *idx = out && is_max && ts_autograd_needed(1, &x) ? ts_tensor_empty_on(dev, TS_I32, 4, shape) : NULL;
    ts_status st = !out || (is_max && ts_autograd_needed(1, &x) && !idx) ? ts_last_status()
                   : is_max ? be->pool->max(x->dtype, &g, ts_tensor_data(xd), ts_tensor_data(out), idx ? ts_tensor_data(idx) : NULL)
                            : be->pool->avg(x->dtype, &g, ts_tensor_data(xd), ts_tensor_data(out));
    ts_tensor_release(xd);
    if (st) {
        ts_tensor_release(out);
        ts_tensor_release(idx);
        return NULL;
    }
    /* backward reads the saved indices (max) or nothing (average) of x */
    ts_node *n = ts_autograd_record(out, op, pool_backward, 1, &x);
    ts_node_forget_input_data(n, 0);
    if (n) {
        memcpy(n->iargs, k, 6 * sizeof *k);
        if (idx) ts_node_save(n, 0, idx);
    }
    ts_tensor_release(idx);
    return out;
}

ts_tensor *ts_max_pool2d(ts_tensor *x, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
    return pool2d("max_pool2d", true, x, (int64_t[]){kh, kw, sh, sw, ph, pw});
}

ts_tensor *ts_avg_pool2d(ts_tensor *x, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
    return pool2d("avg_pool2d", false, x, (int64_t[]){kh, kw, sh, sw, ph, pw});
}
