/* attention.c - fused scaled dot-product attention, forward and backward:
 * the checks, the autograd nodes and the calls to the device's attention
 * kernels (the CPU's: kernels/ops/cpu/attention.c), for separate q, k, v
 * heads (ts_attention) and for a GPT's packed qkv rows
 * (ts_attention_qkv). The forward keeps only the log-sum-exp of each score
 * row; the backward recomputes the probabilities from it. */
#include "kernels/ops/attention.h"

#include <math.h>
#include <stdlib.h>

#include "kernels/autograd.h"
#include "kernels/ops/backend.h"
#include "kernels/ops/select.h"
#include "kernels/ops/view.h"

/* The layout of dense [B, H, T, D] heads. */
static ts_attention_layout dense_heads(int64_t H, int64_t T, int64_t D) {
    return (ts_attention_layout){H * T * D, T * D, D};
}

/* Element pointer at offset off of t's data. */
static void *at(const ts_tensor *t, int64_t off) {
    return t ? (char *)ts_tensor_data(t) + off * (int64_t)ts_dtype_size(t->dtype) : NULL;
}

/* Saves keep[0..nk) in the node's slots - the last one the row
 * statistics, which stay f32 when activations are packed - and a copy of
 * the geometry in its ctx (when out of memory none: its backward then
 * fails with an error). */
static void keep_state(ts_node *n, int nk, ts_tensor *const *keep, const ts_attention_geom *g) {
    keep[nk - 1]->storage->no_pack = true;
    for (int i = 0; i < nk; i++) ts_node_save(n, i, keep[i]);
    ts_attention_geom *c = malloc(sizeof *c);
    if (!c) return;
    *c = *g;
    n->ctx = c;
    n->ctx_free = free;
}

/* Runs the backward kernel: gradients of q, k, v at dq, dk, dv (NULL: not
 * wanted), from g (the output's gradient, laid out like the output:
 * made dense when the output is). */
static ts_status run_backward(const ts_node *n, const ts_tensor *g, const void *q, const void *k, const void *v,
                              const ts_tensor *out, const ts_tensor *lse, void *dq, void *dk, void *dv) {
    const ts_attention_geom *ge = n->ctx;
    if (!ge) return ts_error(TS_ERR_MEMORY, "%s backward: out of memory when the forward ran", n->op);
    const ts_backend *be = ts_backend_for(n->op, 2, (ts_tensor *[]){(ts_tensor *)out, (ts_tensor *)g});
    ts_tensor *dout = be ? ts_tensor_dense(g) : NULL;
    ts_status st = dout ? be->attention->backward(out->dtype, ge, q, k, v, ts_tensor_data(out), ts_tensor_data(lse),
                                                  ts_tensor_data(dout), dq, dk, dv)
                        : ts_last_status();
    ts_tensor_release(dout);
    return st;
}

/* ---- separate heads: q [B, H, Tq, D], k, v ---- */

/* saved: 0 q, 1 k, 2 v (dense), 3 out, 4 lse [BH * Tq]. */
static ts_status attention_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    ts_status st = TS_OK;
    for (int i = 0; i < 3 && !st; i++)
        if (ts_node_wants(n, i) && !(gin[i] = ts_tensor_empty_like(n->saved[i]))) st = ts_last_status();
    if (!st)
        st = run_backward(n, g, ts_tensor_data(n->saved[0]), ts_tensor_data(n->saved[1]), ts_tensor_data(n->saved[2]),
                          n->saved[3], n->saved[4], at(gin[0], 0), at(gin[1], 0), at(gin[2], 0));
    return st;
}

/* Checks shapes and dtypes; fills the geometry (dense heads). */
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
    int64_t H = q->shape[1], Tq = q->shape[2], Tk = k->shape[2], D = q->shape[3], Dv = v->shape[3];
    *g = (ts_attention_geom){q->shape[0] * H, H, Tq, Tk, D, Dv, causal, scale != 0 ? scale : 1.0 / sqrt((double)D),
                             dense_heads(H, Tq, D), dense_heads(H, Tk, D), dense_heads(H, Tk, Dv),
                             dense_heads(H, Tq, Dv)};
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
        if (n) keep_state(n, 5, (ts_tensor *[]){qc, kc, vc, out, lse}, &ge);
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

/* ---- packed rows: qkv [B, T, 3C] -> [B, T, C] ---- */

/* saved: 0 qkv (dense), 1 out [B, T, C], 2 lse; the gradient is one
 * [B, T, 3C] tensor the kernel writes q's, k's and v's parts of. */
static ts_status attention_qkv_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    ts_tensor *qkv = n->saved[0];
    int64_t C = qkv->shape[2] / 3;
    if (!(gin[0] = ts_tensor_empty_like(qkv))) return ts_last_status();
    return run_backward(n, g, at(qkv, 0), at(qkv, C), at(qkv, 2 * C), n->saved[1], n->saved[2], at(gin[0], 0),
                        at(gin[0], C), at(gin[0], 2 * C));
}

/* The same through views and ts_attention, for kernels that take dense
 * heads only: q, k, v copied out as [B, H, T, D], the output back. */
static ts_tensor *attention_qkv_dense(ts_tensor *qkv, int64_t H, bool causal, double scale) {
    int64_t B = qkv->shape[0], T = qkv->shape[1], C = qkv->shape[2] / 3;
    ts_tensor *t[10] = {0}, *out = NULL;
    t[0] = ts_reshape(qkv, 5, (int64_t[]){B, T, 3, H, C / H});
    if (t[0]) t[1] = ts_permute(t[0], (int[]){2, 0, 3, 1, 4}); /* [3, B, H, T, D] */
    if (t[1]) t[2] = ts_contiguous(t[1]);
    if (t[2] && !ts_split(t[2], 0, 3, NULL, &t[3])) {
        for (int i = 0; i < 3; i++) t[6 + i] = ts_squeeze(t[3 + i], 0);
        ts_tensor *o = t[8] ? ts_attention(t[6], t[7], t[8], causal, scale) : NULL;
        ts_tensor *ot = o ? ts_transpose(o, 1, 2) : NULL;
        out = ot ? ts_reshape(ot, 3, (int64_t[]){B, T, C}) : NULL;
        ts_tensor_release(o);
        ts_tensor_release(ot);
    }
    for (int i = 0; i < 10; i++) ts_tensor_release(t[i]);
    return out;
}

ts_tensor *ts_attention_qkv(ts_tensor *qkv, int64_t n_head, bool causal, double scale) {
    const char *op = "attention_qkv";
    if (ts_check_arg(op, "qkv", qkv, TS_FLOATS)) return NULL;
    if (n_head < 1 || qkv->ndim != 3 || qkv->shape[2] % (3 * n_head) || ts_tensor_numel(qkv) == 0) {
        ts_error(TS_ERR_SHAPE, "%s: qkv %s is not a non-empty [B, T, 3 C] with C a multiple of %lld heads", op,
                 ts_shape_str(qkv), (long long)n_head);
        return NULL;
    }
    if (!isfinite(scale)) {
        ts_error(TS_ERR_VALUE, "%s: scale %g is not finite", op, scale);
        return NULL;
    }
    const ts_backend *be = ts_backend_for(op, 1, &qkv);
    if (!be) return NULL;
    if (!be->attention->strided) return attention_qkv_dense(qkv, n_head, causal, scale);
    int64_t B = qkv->shape[0], T = qkv->shape[1], C = qkv->shape[2] / 3, H = n_head, D = C / H, nl = B * H * T;
    ts_attention_layout in = {T * 3 * C, D, 3 * C};
    ts_attention_geom ge = {B * H, H, T, T, D, D, causal, scale != 0 ? scale : 1.0 / sqrt((double)D), in, in, in,
                            {T * C, D, C}};
    ts_device dev = ts_tensor_device(qkv);
    ts_tensor *qc = ts_tensor_dense(qkv), *out = ts_tensor_empty_on(dev, qkv->dtype, 3, (int64_t[]){B, T, C});
    ts_tensor *lse = ts_tensor_empty_on(dev, qkv->dtype, 1, &nl);
    if (qc && out && lse &&
        !be->attention->forward(qkv->dtype, &ge, at(qc, 0), at(qc, C), at(qc, 2 * C), ts_tensor_data(out),
                                ts_tensor_data(lse))) {
        ts_node *n = ts_autograd_record(out, op, attention_qkv_backward, 1, &qkv);
        if (n) {
            ts_node_forget_input_data(n, 0); /* backward reads the dense copy (qkv itself when dense) */
            keep_state(n, 3, (ts_tensor *[]){qc, out, lse}, &ge);
        }
    } else {
        ts_tensor_release(out);
        out = NULL;
    }
    ts_tensor_release(qc);
    ts_tensor_release(lse);
    return out;
}
