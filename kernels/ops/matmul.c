/* matmul.c - matmul forward and backward as (folded, batched) GEMM calls
 * to the device's matmul kernel. */
#include "kernels/ops/matmul.h"

#include <limits.h>
#include <string.h>

#include "kernels/autograd.h"
#include "kernels/ops/backend.h"
#include "kernels/ops/reduce.h"
#include "kernels/ops/view.h"

/* One operand of a batched GEMM: a matrix of rows x cols with element
 * strides rs, cs at base, and its stride along each iteration batch dim
 * (0 where the operand is broadcast or summed over). */
typedef struct {
    char *base;
    int64_t rows, cols, rs, cs;
    int64_t bst[TS_MAX_DIMS];
} gemm_mat;

/* How m can be passed to BLAS (row-major API): untransposed with rows ld
 * apart, or transposed (a column-major matrix) with columns ld apart. */
static bool mat_layout(const gemm_mat *m, bool *trans, int64_t *ld) {
    int64_t need_n = m->cols > 1 ? m->cols : 1, need_t = m->rows > 1 ? m->rows : 1;
    if (m->cs == 1 || m->cols <= 1) {
        int64_t l = m->rows <= 1 ? need_n : m->rs;
        if (l >= need_n && l <= INT_MAX) {
            *trans = false;
            *ld = l;
            return true;
        }
    }
    if (m->rs == 1 || m->rows <= 1) {
        int64_t l = m->cols <= 1 ? need_t : m->cs;
        if (l >= need_t && l <= INT_MAX) {
            *trans = true;
            *ld = l;
            return true;
        }
    }
    return false;
}

/* The matrix view of t's last two dims, its batch dims aligned to the right
 * of the nb iteration batch dims. */
static void mat_of(const ts_tensor *t, int nb, const int64_t *bshape, gemm_mat *m) {
    int nd = t->ndim;
    m->base = (char *)ts_tensor_data(t);
    m->rows = t->shape[nd - 2];
    m->cols = t->shape[nd - 1];
    m->rs = t->strides[nd - 2];
    m->cs = t->strides[nd - 1];
    for (int d = 0; d < nb; d++) {
        int td = d - (nb - (nd - 2));
        m->bst[d] = (td >= 0 && t->shape[td] == bshape[d] && bshape[d] > 1) ? t->strides[td] : 0;
    }
}

/* Whether the last two dims of t can go to BLAS without a copy. */
static bool gemmable(const ts_tensor *t) {
    gemm_mat m;
    mat_of(t, 0, NULL, &m);
    bool tr = false;
    int64_t ld = 1;
    return mat_layout(&m, &tr, &ld);
}

/* Merges batch dim d (the innermost left) of the three operands into the
 * rows of a and c (when b is broadcast along it) or into the inner dim of
 * a and b (when c is summed along it), if the strides allow and the merged
 * matrices stay BLAS-compatible. Returns whether it merged. */
static bool fold_dim(gemm_mat *a, gemm_mat *b, gemm_mat *c, int64_t n, int d) {
    bool tr = false;
    int64_t ld = 1;
    gemm_mat a2 = *a, b2 = *b, c2 = *c;
    if (b->bst[d] == 0 && a->bst[d] == a->rows * a->rs && c->bst[d] == c->rows * c->rs) {
        a2.rows *= n;
        c2.rows *= n;
    } else if (c->bst[d] == 0 && a->bst[d] == a->cols * a->cs && b->bst[d] == b->rows * b->rs) {
        a2.cols *= n;
        b2.rows *= n;
    } else {
        return false;
    }
    if (!mat_layout(&a2, &tr, &ld) || !mat_layout(&b2, &tr, &ld) || !mat_layout(&c2, &tr, &ld)) return false;
    if (a2.rows > INT_MAX || a2.cols > INT_MAX || c2.cols > INT_MAX) return false;
    *a = a2;
    *b = b2;
    *c = c2;
    return true;
}

/* One GEMM c = a·b + beta c on matrices already checked by mat_layout. */
static ts_status gemm_call(const ts_backend *be, ts_dtype dt, const gemm_mat *a, const gemm_mat *b,
                           const gemm_mat *c, int64_t off_a, int64_t off_b, int64_t off_c, double beta) {
    bool ta = false, tb = false, tc = false;
    int64_t lda = 1, ldb = 1, ldc = 1;
    mat_layout(a, &ta, &lda);
    mat_layout(b, &tb, &ldb);
    mat_layout(c, &tc, &ldc);
    size_t es = ts_dtype_size(dt);
    return be->matmul->gemm(dt, ta, tb, c->rows, c->cols, a->cols, 1.0, a->base + off_a * (int64_t)es, lda,
                            b->base + off_b * (int64_t)es, ldb, beta, c->base + off_c * (int64_t)es, ldc);
}

/* Broadcast batch shape of a and b (dims before the last two). */
static ts_status batch_shape(const char *op, const ts_tensor *a, const ts_tensor *b, int *nb, int64_t *bshape) {
    int na = a->ndim - 2, nbb = b->ndim - 2, n = na > nbb ? na : nbb;
    for (int d = 0; d < n; d++) {
        int ad = d - (n - na), bd = d - (n - nbb);
        int64_t as = ad >= 0 ? a->shape[ad] : 1, bs = bd >= 0 ? b->shape[bd] : 1;
        if (as != bs && as != 1 && bs != 1)
            return ts_error(TS_ERR_SHAPE, "%s: batch dims of %s and %s do not broadcast (batch dim %d: %lld vs %lld)",
                            op, ts_shape_str(a), ts_shape_str(b), d, (long long)as, (long long)bs);
        bshape[d] = as == 1 ? bs : as;
    }
    *nb = n;
    return TS_OK;
}

ts_status ts_matmul_into(ts_tensor *out, const ts_tensor *a, const ts_tensor *b, bool accumulate) {
    const char *op = "matmul_into";
    if (ts_check_arg(op, "a", a, TS_FLOATS) || ts_check_arg(op, "b", b, TS_FLOATS) ||
        ts_check_arg(op, "out", out, TS_FLOATS))
        return ts_last_status();
    if (a->dtype != b->dtype || a->dtype != out->dtype)
        return ts_error(TS_ERR_DTYPE, "%s: dtypes %s x %s -> %s differ", op, ts_dtype_name(a->dtype),
                        ts_dtype_name(b->dtype), ts_dtype_name(out->dtype));
    if (a->ndim < 2 || b->ndim < 2 || out->ndim < 2)
        return ts_error(TS_ERR_SHAPE, "%s: operands %s x %s -> %s must be at least 2-D", op, ts_shape_str(a),
                        ts_shape_str(b), ts_shape_str(out));
    int64_t M = a->shape[a->ndim - 2], K = a->shape[a->ndim - 1], N = b->shape[b->ndim - 1];
    if (b->shape[b->ndim - 2] != K || out->shape[out->ndim - 2] != M || out->shape[out->ndim - 1] != N)
        return ts_error(TS_ERR_SHAPE, "%s: shapes %s x %s -> %s do not align", op, ts_shape_str(a), ts_shape_str(b),
                        ts_shape_str(out));
    int nb;
    int64_t bshape[TS_MAX_DIMS];
    if (batch_shape(op, a, b, &nb, bshape)) return ts_last_status();
    int no = out->ndim - 2;
    bool reduced = false;
    for (int d = 0; d < no; d++) {
        int bd = d + nb - no;
        if (bd < 0 || (out->shape[d] != bshape[bd] && out->shape[d] != 1))
            return ts_error(TS_ERR_SHAPE, "%s: out %s does not match the batch of %s x %s", op, ts_shape_str(out),
                            ts_shape_str(a), ts_shape_str(b));
    }
    for (int d = 0; d < nb; d++) {
        int od = d - (nb - no);
        if (bshape[d] > 1 && (od < 0 || out->shape[od] == 1)) reduced = true;
    }
    gemm_mat cm;
    mat_of(out, nb, bshape, &cm);
    bool tr = false;
    int64_t ld = 1;
    if (!mat_layout(&cm, &tr, &ld) || tr)
        return ts_error(TS_ERR_SHAPE, "%s: out %s needs unit column stride (strides end %lld,%lld)", op,
                        ts_shape_str(out), (long long)cm.rs, (long long)cm.cs);
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX)
        return ts_error(TS_ERR_SHAPE, "%s: shapes %s x %s exceed the BLAS int range", op, ts_shape_str(a),
                        ts_shape_str(b));
    const ts_backend *be = ts_backend_for(op, 3, (ts_tensor *[]){(ts_tensor *)a, (ts_tensor *)b, out});
    if (!be) return ts_last_status();
    double beta = accumulate ? 1.0 : 0.0;
    if (reduced && !accumulate) {
        if (ts_tensor_fill_(out, 0.0)) return ts_last_status();
        beta = 1.0;
    }
    int64_t total = 1;
    for (int d = 0; d < nb; d++) total *= bshape[d];
    if (M == 0 || N == 0 || total == 0) return TS_OK;
    if (K == 0) return beta == 0.0 ? ts_tensor_fill_(out, 0.0) : TS_OK;

    /* operands BLAS cannot take as they are get one contiguous copy */
    ts_tensor *ca = gemmable(a) ? NULL : ts_tensor_copy_as(a, a->dtype);
    ts_tensor *cb = gemmable(b) ? NULL : ts_tensor_copy_as(b, b->dtype);
    if ((!gemmable(a) && !ca) || (!gemmable(b) && !cb)) {
        ts_tensor_release(ca);
        ts_tensor_release(cb);
        return ts_last_status();
    }
    gemm_mat am, bm;
    mat_of(ca ? ca : a, nb, bshape, &am);
    mat_of(cb ? cb : b, nb, bshape, &bm);

    /* drop size-1 batch dims, then fold the innermost ones into the GEMM */
    int k = 0;
    for (int d = 0; d < nb; d++) {
        if (bshape[d] == 1) continue;
        am.bst[k] = am.bst[d];
        bm.bst[k] = bm.bst[d];
        cm.bst[k] = cm.bst[d];
        bshape[k++] = bshape[d];
    }
    nb = k;
    while (nb > 0 && fold_dim(&am, &bm, &cm, bshape[nb - 1], nb - 1)) nb--;

    int64_t idx[TS_MAX_DIMS] = {0}, oa = 0, ob = 0, oc = 0;
    total = 1;
    for (int d = 0; d < nb; d++) total *= bshape[d];
    ts_status st = TS_OK;
    for (int64_t it = 0; it < total && !st; it++) {
        st = gemm_call(be, out->dtype, &am, &bm, &cm, oa, ob, oc, beta);
        for (int d = nb - 1; d >= 0; d--) { /* next batch index, offsets updated */
            oa += am.bst[d];
            ob += bm.bst[d];
            oc += cm.bst[d];
            if (++idx[d] < bshape[d]) break;
            oa -= am.bst[d] * bshape[d];
            ob -= bm.bst[d] * bshape[d];
            oc -= cm.bst[d] * bshape[d];
            idx[d] = 0;
        }
    }
    ts_tensor_release(ca);
    ts_tensor_release(cb);
    return st;
}

/* A view of t with its last two dims swapped (no history, no copy). */
static ts_tensor *raw_mT(const ts_tensor *t) {
    int64_t shape[TS_MAX_DIMS], strides[TS_MAX_DIMS];
    int nd = t->ndim;
    memcpy(shape, t->shape, sizeof shape);
    memcpy(strides, t->strides, sizeof strides);
    shape[nd - 2] = t->shape[nd - 1];
    shape[nd - 1] = t->shape[nd - 2];
    strides[nd - 2] = t->strides[nd - 1];
    strides[nd - 1] = t->strides[nd - 2];
    return ts_tensor_from_storage(t->storage, t->dtype, t->offset, nd, shape, strides);
}

/* The gradient of one operand: out (x's shape) = l·r summed over broadcast
 * batch dims, where l, r are given transposed or not. When x is a
 * transposed view (column-major last two dims: a Linear's Wᵀ), the gradient
 * gets x's layout, computed as (l·r)ᵀ = rᵀ·lᵀ into a contiguous buffer, so
 * that the transpose's backward hands W's gradient on contiguous and it
 * accumulates as a plain add, not a strided walk over the whole matrix. */
static ts_tensor *grad_gemm(const ts_tensor *x, const ts_tensor *l, bool lT, const ts_tensor *r, bool rT) {
    int nd = x->ndim;
    bool colmajor = x->shape[nd - 2] > 1 && x->shape[nd - 1] > 1 && x->strides[nd - 2] == 1 &&
                    x->strides[nd - 1] == x->shape[nd - 2];
    if (colmajor) {
        const ts_tensor *t = l;
        bool tT = lT;
        l = r;
        lT = !rT;
        r = t;
        rT = !tT;
    }
    int64_t shape[TS_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    if (colmajor) {
        shape[nd - 2] = x->shape[nd - 1];
        shape[nd - 1] = x->shape[nd - 2];
    }
    ts_tensor *lt = lT ? raw_mT(l) : ts_tensor_alias(l), *rt = rT ? raw_mT(r) : ts_tensor_alias(r);
    ts_tensor *g = lt && rt ? ts_tensor_empty_on(ts_tensor_device(l), x->dtype, nd, shape) : NULL;
    if (g && ts_matmul_into(g, lt, rt, false)) {
        ts_tensor_release(g);
        g = NULL;
    }
    ts_tensor_release(lt);
    ts_tensor_release(rt);
    if (g && colmajor) {
        ts_tensor *gt = raw_mT(g);
        ts_tensor_release(g);
        g = gt;
    }
    return g;
}

/* C = A·B: dA = dC·Bᵀ, dB = Aᵀ·dC (the engine converts nothing: same dtype). */
static ts_status matmul_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    ts_tensor *a = n->inputs[0], *b = n->inputs[1];
    if (ts_node_wants(n, 0) && !(gin[0] = grad_gemm(a, g, false, b, true))) return ts_last_status();
    if (ts_node_wants(n, 1) && !(gin[1] = grad_gemm(b, a, true, g, false))) return ts_last_status();
    return TS_OK;
}

/* a·b for operands of at least 2 dims, recorded for autograd. */
static ts_tensor *matmul_nd(ts_tensor *a, ts_tensor *b) {
    int nb;
    int64_t shape[TS_MAX_DIMS];
    if (batch_shape("matmul", a, b, &nb, shape)) return NULL;
    shape[nb] = a->shape[a->ndim - 2];
    shape[nb + 1] = b->shape[b->ndim - 1];
    ts_tensor *out = ts_tensor_empty_on(ts_tensor_device(a), a->dtype, nb + 2, shape);
    if (!out) return NULL;
    if (ts_matmul_into(out, a, b, false)) {
        ts_tensor_release(out);
        return NULL;
    }
    ts_tensor *in[2] = {a, b};
    ts_autograd_record(out, "matmul", matmul_backward, 2, in);
    return out;
}

ts_tensor *ts_matmul(ts_tensor *a, ts_tensor *b) {
    if (ts_check_arg("matmul", "a", a, TS_FLOATS) || ts_check_arg("matmul", "b", b, TS_FLOATS) ||
        !ts_backend_for("matmul", 2, (ts_tensor *[]){a, b}))
        return NULL;
    if (a->dtype != b->dtype) {
        ts_error(TS_ERR_DTYPE, "matmul: dtypes differ (%s %s x %s %s)", ts_dtype_name(a->dtype), ts_shape_str(a),
                 ts_dtype_name(b->dtype), ts_shape_str(b));
        return NULL;
    }
    if (a->ndim < 1 || b->ndim < 1) {
        ts_error(TS_ERR_SHAPE, "matmul: shapes %s x %s: operands must have at least 1 dim", ts_shape_str(a),
                 ts_shape_str(b));
        return NULL;
    }
    int ka = a->ndim - 1, kb = b->ndim >= 2 ? b->ndim - 2 : 0;
    if (a->shape[ka] != b->shape[kb]) {
        ts_error(TS_ERR_SHAPE, "matmul: shapes %s x %s do not align (dim %d = %lld vs dim %d = %lld)",
                 ts_shape_str(a), ts_shape_str(b), ka, (long long)a->shape[ka], kb, (long long)b->shape[kb]);
        return NULL;
    }
    if (a->ndim >= 2 && b->ndim >= 2) return matmul_nd(a, b);
    /* vectors: a row [1,K] on the left, a column [K,1] on the right */
    ts_tensor *a2 = a->ndim == 1 ? ts_unsqueeze(a, 0) : ts_tensor_retain(a);
    ts_tensor *b2 = b->ndim == 1 ? ts_unsqueeze(b, 1) : ts_tensor_retain(b);
    ts_tensor *r = a2 && b2 ? matmul_nd(a2, b2) : NULL, *out = NULL;
    if (r) { /* drop the added dims: rows when a was 1-D, cols when b was */
        int64_t shape[TS_MAX_DIMS];
        int nd = 0;
        for (int d = 0; d < r->ndim; d++)
            if (!(d == r->ndim - 2 && a->ndim == 1) && !(d == r->ndim - 1 && b->ndim == 1)) shape[nd++] = r->shape[d];
        out = ts_reshape(r, nd, shape);
    }
    ts_tensor_release(r);
    ts_tensor_release(a2);
    ts_tensor_release(b2);
    return out;
}

/* ---- linear: x Wᵀ + b ---- */

/* t as a [rows, last dim] matrix without history: a view of t when it is
 * contiguous, else of a dense copy. */
static ts_tensor *as_rows(const ts_tensor *t) {
    ts_tensor *d = ts_tensor_dense(t);
    if (!d) return NULL;
    int64_t shape[2] = {1, t->shape[t->ndim - 1]};
    for (int i = 0; i < t->ndim - 1; i++) shape[0] *= t->shape[i];
    ts_tensor *r = ts_tensor_from_storage(d->storage, d->dtype, d->offset, 2, shape, NULL);
    ts_tensor_release(d);
    return r;
}

/* Adds the gradient got for input i (a [rows, cols] matrix, from
 * make(out)) into the leaf's .grad directly when the engine allows
 * (ts_node_grad_sink), else hands a new one back in *gin. make computes
 * into out, adding to it when accumulate. */
typedef ts_status (*grad_maker)(ts_tensor *out, bool accumulate, ts_tensor *const *args);

static ts_status grad_into(ts_node *n, int i, grad_maker make, ts_tensor *const *args, ts_tensor **gin) {
    const ts_tensor *x = n->inputs[i];
    ts_tensor *sink = ts_node_grad_sink(n, i);
    ts_tensor *out = sink ? ts_tensor_retain(sink) : ts_tensor_empty_on(ts_tensor_device(x), x->dtype, x->ndim, x->shape);
    ts_status st = out ? make(out, sink != NULL, args) : ts_last_status();
    if (!st && !sink) *gin = ts_tensor_retain(out);
    ts_tensor_release(out);
    return st;
}

/* dW (+)= gᵀ x: args g [N, out], x [N, in]. */
static ts_status weight_grad(ts_tensor *out, bool accumulate, ts_tensor *const *args) {
    ts_tensor *gt = raw_mT(args[0]);
    ts_status st = gt ? ts_matmul_into(out, gt, args[1], accumulate) : ts_last_status();
    ts_tensor_release(gt);
    return st;
}

/* db (+)= the column sums of g [N, out]. */
static ts_status bias_grad(ts_tensor *out, bool accumulate, ts_tensor *const *args) {
    ts_tensor *s = ts_sum(args[0], 1, (int[]){0}, false);
    ts_status st = !s ? ts_last_status() : accumulate ? ts_tensor_add_(out, s) : ts_tensor_copy_(out, s);
    ts_tensor_release(s);
    return st;
}

/* y = x Wᵀ + b: dx = g W, dW = gᵀ x, db = g summed over rows; the last
 * two straight into the parameters' .grad when the engine allows. */
static ts_status linear_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    ts_tensor *x = n->inputs[0], *w = n->inputs[1];
    ts_tensor *g2 = as_rows(g), *x2 = NULL, *dx = NULL;
    ts_status st = g2 ? TS_OK : ts_last_status();
    if (!st && ts_node_wants(n, 0)) {
        gin[0] = ts_tensor_empty_on(ts_tensor_device(x), x->dtype, x->ndim, x->shape);
        dx = gin[0] ? as_rows(gin[0]) : NULL;
        st = dx ? ts_matmul_into(dx, g2, w, false) : ts_last_status();
    }
    if (!st && ts_node_wants(n, 1)) {
        x2 = as_rows(x);
        st = x2 ? grad_into(n, 1, weight_grad, (ts_tensor *[]){g2, x2}, &gin[1]) : ts_last_status();
    }
    if (!st && n->inputs[2] && ts_node_wants(n, 2)) st = grad_into(n, 2, bias_grad, (ts_tensor *[]){g2}, &gin[2]);
    ts_tensor_release(g2);
    ts_tensor_release(x2);
    ts_tensor_release(dx);
    return st;
}

/* Checks linear's operands; the error names the shapes. */
static ts_status linear_check(const ts_tensor *x, const ts_tensor *w, const ts_tensor *b) {
    const char *op = "linear";
    if (ts_check_arg(op, "x", x, TS_FLOATS) || ts_check_arg(op, "weight", w, TS_FLOATS) ||
        (b && ts_check_arg(op, "bias", b, TS_FLOATS)))
        return ts_last_status();
    if (w->dtype != x->dtype || (b && b->dtype != x->dtype))
        return ts_error(TS_ERR_DTYPE, "%s: dtypes of x %s, weight %s%s%s differ", op, ts_dtype_name(x->dtype),
                        ts_dtype_name(w->dtype), b ? ", bias " : "", b ? ts_dtype_name(b->dtype) : "");
    if (w->ndim != 2 || x->ndim < 1 || x->shape[x->ndim - 1] != w->shape[1])
        return ts_error(TS_ERR_SHAPE, "%s: x %s does not end in the in-features of weight %s ([out, in])", op,
                        ts_shape_str(x), ts_shape_str(w));
    if (b && (b->ndim != 1 || b->shape[0] != w->shape[0]))
        return ts_error(TS_ERR_SHAPE, "%s: bias %s is not [%lld], the out-features of weight %s", op, ts_shape_str(b),
                        (long long)w->shape[0], ts_shape_str(w));
    return TS_OK;
}

ts_tensor *ts_linear(ts_tensor *x, ts_tensor *w, ts_tensor *b) {
    if (linear_check(x, w, b) || !ts_backend_for("linear", 3, (ts_tensor *[]){x, w, b})) return NULL;
    int64_t shape[TS_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = w->shape[0];
    ts_tensor *y = ts_tensor_empty_on(ts_tensor_device(x), x->dtype, x->ndim, shape);
    ts_tensor *x2 = y ? as_rows(x) : NULL, *y2 = x2 ? as_rows(y) : NULL, *wt = y2 ? raw_mT(w) : NULL, *bs = NULL;
    ts_status st = wt ? TS_OK : ts_last_status();
    if (!st && b) { /* the bias in every row, then the GEMM adds onto it */
        bs = ts_tensor_from_storage(b->storage, b->dtype, b->offset, 2, y2->shape, (int64_t[]){0, b->strides[0]});
        st = bs ? ts_tensor_copy_(y2, bs) : ts_last_status();
    }
    if (!st) st = ts_matmul_into(y2, x2, wt, b != NULL);
    ts_tensor *tmp[] = {x2, y2, wt, bs};
    for (int i = 0; i < 4; i++) ts_tensor_release(tmp[i]);
    if (st) {
        ts_tensor_release(y);
        return NULL;
    }
    ts_autograd_record(y, "linear", linear_backward, 3, (ts_tensor *[]){x, w, b});
    return y;
}
