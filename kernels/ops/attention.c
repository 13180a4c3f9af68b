/* attention.c - fused scaled dot-product attention, forward and backward:
 * the checks, the autograd node and the calls to the device's attention
 * kernels (the CPU's: kernels/ops/cpu/attention.c). The forward keeps only
 * the log-sum-exp of each score row; the backward recomputes the
 * probabilities from it. */
#include "kernels/ops/attention.h"

#include <math.h>

#include "kernels/autograd.h"
#include "kernels/ops/backend.h"
#include "kernels/ops/view.h"

/* Geometry stored in a node: iargs 0..4 = BH, Tq, Tk, D, Dv; 5 = causal;
 * fargs[0] = scale. */
static ts_attention_geom node_geom(const ts_node *n) {
    return (ts_attention_geom){n->iargs[0], n->iargs[1], n->iargs[2], n->iargs[3], n->iargs[4], n->iargs[5] != 0,
                               n->fargs[0]};
}

/* Data pointer of an optional tensor. */
static void *opt_data(const ts_tensor *t) { return t ? ts_tensor_data(t) : NULL; }

/* saved: 0 q, 1 k, 2 v (contiguous), 3 out, 4 lse [BH * Tq]. */
static ts_status attention_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    ts_attention_geom ge = node_geom(n);
    ts_tensor *q = n->saved[0], *k = n->saved[1], *v = n->saved[2], *out = n->saved[3], *lse = n->saved[4];
    const ts_backend *be = ts_backend_for("attention", 2, (ts_tensor *[]){q, g});
    ts_tensor *dout = be ? ts_contiguous(g) : NULL;
    ts_status st = dout ? TS_OK : ts_last_status();
    for (int i = 0; i < 3 && !st; i++)
        if (ts_node_wants(n, i) && !(gin[i] = ts_tensor_empty_like(n->saved[i]))) st = ts_last_status();
    if (!st)
        st = be->attention->backward(q->dtype, &ge, ts_tensor_data(q), ts_tensor_data(k), ts_tensor_data(v),
                                     ts_tensor_data(out), ts_tensor_data(lse), ts_tensor_data(dout), opt_data(gin[0]),
                                     opt_data(gin[1]), opt_data(gin[2]));
    ts_tensor_release(dout);
    return st;
}

/* Checks shapes and dtypes; fills the geometry. */
static ts_status check_inputs(const ts_tensor *q, const ts_tensor *k, const ts_tensor *v, bool causal, double scale,
                              ts_attention_geom *g) {
    if (ts_check_arg("attention", "q", q, TS_FLOATS) || ts_check_arg("attention", "k", k, TS_FLOATS) ||
        ts_check_arg("attention", "v", v, TS_FLOATS))
        return ts_last_status();
    if (k->dtype != q->dtype || v->dtype != q->dtype)
        return ts_error(TS_ERR_DTYPE, "attention: dtypes of q, k, v differ (%s, %s, %s)", ts_dtype_name(q->dtype),
                        ts_dtype_name(k->dtype), ts_dtype_name(v->dtype));
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4 || k->shape[0] != q->shape[0] || v->shape[0] != q->shape[0] ||
        k->shape[1] != q->shape[1] || v->shape[1] != q->shape[1] || k->shape[3] != q->shape[3] ||
        v->shape[2] != k->shape[2])
        return ts_error(TS_ERR_SHAPE,
                        "attention: shapes q %s, k %s, v %s do not fit (expected [B,H,Tq,D], [B,H,Tk,D], [B,H,Tk,Dv])",
                        ts_shape_str(q), ts_shape_str(k), ts_shape_str(v));
    for (int d = 0; d < 4; d++)
        if (!q->shape[d] || !k->shape[d] || !v->shape[d])
            return ts_error(TS_ERR_SHAPE, "attention: empty dim in q %s, k %s, v %s (all sizes must be >= 1)",
                            ts_shape_str(q), ts_shape_str(k), ts_shape_str(v));
    if (!isfinite(scale))
        return ts_error(TS_ERR_VALUE, "attention: scale %g is not finite", scale);
    *g = (ts_attention_geom){q->shape[0] * q->shape[1], q->shape[2], k->shape[2], q->shape[3], v->shape[3], causal,
                             scale != 0 ? scale : 1.0 / sqrt((double)q->shape[3])};
    return TS_OK;
}

ts_tensor *ts_attention(ts_tensor *q, ts_tensor *k, ts_tensor *v, bool causal, double scale) {
    ts_attention_geom ge;
    if (check_inputs(q, k, v, causal, scale, &ge)) return NULL;
    const ts_backend *be = ts_backend_for("attention", 3, (ts_tensor *[]){q, k, v});
    if (!be) return NULL;
    ts_device dev = ts_tensor_device(q);
    int64_t oshape[4] = {q->shape[0], q->shape[1], ge.Tq, ge.Dv}, nl = ge.BH * ge.Tq;
    ts_tensor *qc = ts_tensor_dense(q), *kc = ts_tensor_dense(k), *vc = ts_tensor_dense(v);
    ts_tensor *out = ts_tensor_empty_on(dev, q->dtype, 4, oshape), *lse = ts_tensor_empty_on(dev, q->dtype, 1, &nl);
    if (qc && kc && vc && out && lse &&
        !be->attention->forward(q->dtype, &ge, ts_tensor_data(qc), ts_tensor_data(kc), ts_tensor_data(vc),
                                ts_tensor_data(out), ts_tensor_data(lse))) {
        ts_node *n = ts_autograd_record(out, "attention", attention_backward, 3, (ts_tensor *[]){q, k, v});
        if (n) {
            lse->storage->no_pack = true; /* statistics stay f32 */
            ts_tensor *keep[5] = {qc, kc, vc, out, lse};
            for (int i = 0; i < 5; i++) ts_node_save(n, i, keep[i]);
            int64_t ia[6] = {ge.BH, ge.Tq, ge.Tk, ge.D, ge.Dv, causal};
            for (int i = 0; i < 6; i++) n->iargs[i] = ia[i];
            n->fargs[0] = ge.scale;
        }
    } else {
        ts_tensor_release(out);
        out = NULL;
    }
    ts_tensor_release(qc);
    ts_tensor_release(kc);
    ts_tensor_release(vc);
    ts_tensor_release(lse);
    return out;
}
