/* attention.c - fused scaled dot-product attention, forward and backward.
 *
 * Per head h (of B*H): S = scale Q K^T [Tq, Tk], P = softmax(S) with the
 * causal mask, O = P V; the forward keeps lse = log sum exp S per row. The
 * backward recomputes P = exp(S - lse), then with dP = dO V^T and
 * Dr = sum(dO * O) per row: dS = P (dP - Dr) scale, dV = P^T dO,
 * dQ = dS K, dK = dS^T Q. GEMMs are issued head by head (OpenBLAS threads
 * inside each); the row work of a whole group of heads is one OpenMP loop.
 */
#include "kernels/ops/attention.h"

#include <cblas.h>
#include <math.h>

#include "kernels/autograd.h"
#include "kernels/ops/cpu/rowmath.h"
#include "kernels/ops/view.h"

/* Elements of one scratch score buffer (a group holds this many scores). */
#define SCRATCH_MAX (4 << 20)
/* Row work below this many elements stays on one thread. */
#define PAR_MIN 32768

/* Problem geometry. */
typedef struct {
    int64_t BH, Tq, Tk, D, Dv;
    bool causal;
    double scale;
} geom;

/* Keys visible to query i. */
static inline int64_t visible(const geom *g, int64_t i) { return g->causal && i + 1 < g->Tk ? i + 1 : g->Tk; }

/* Heads per group so a group's Tq x Tk scores fit SCRATCH_MAX. */
static int64_t group_heads(const geom *g) {
    int64_t n = SCRATCH_MAX / (g->Tq * g->Tk);
    n = n < 1 ? 1 : n;
    return n < g->BH ? n : g->BH;
}

/* For each type T (suffix S, GEMM the cblas routine):
 *   gemm_S      row-major C = alpha op(A) op(B) + beta C
 *   attn_fwd_S  out and lse from q, k, v (all contiguous)
 *   attn_bwd_S  dq, dk, dv (each may be NULL) from dout and the saved state */
#define ATTENTION_DEFINE(T, S, GEMM)                                                                   \
    static void gemm_##S(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T *A, int64_t lda, \
                         const T *B, int64_t ldb, T beta, T *C, int64_t ldc) {                         \
        GEMM(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N, \
             (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);                              \
    }                                                                                                  \
    static void attn_fwd_##S(const geom *g, const T *q, const T *k, const T *v, T *out, T *lse, T *sc) { \
        int64_t Tq = g->Tq, Tk = g->Tk, D = g->D, Dv = g->Dv, G = group_heads(g);                      \
        for (int64_t h0 = 0; h0 < g->BH; h0 += G) {                                                    \
            int64_t nh = h0 + G < g->BH ? G : g->BH - h0, rows = nh * Tq;                              \
            for (int64_t h = 0; h < nh; h++)                                                           \
                gemm_##S(false, true, Tq, Tk, D, (T)g->scale, q + (h0 + h) * Tq * D, D, k + (h0 + h) * Tk * D, D, \
                         0, sc + h * Tq * Tk, Tk);                                                     \
            _Pragma("omp parallel for schedule(static) if (rows * Tk > PAR_MIN)")                      \
            for (int64_t r = 0; r < rows; r++) {                                                       \
                T *row = sc + r * Tk;                                                                  \
                int64_t L = visible(g, r % Tq);                                                        \
                T m = ts_row_max_##S(row, L), s = ts_row_exp_##S(row, row, L, m), inv = (T)1 / s;      \
                TS_SIMD_##S() for (int64_t j = 0; j < L; j++) row[j] *= inv;                           \
                for (int64_t j = L; j < Tk; j++) row[j] = 0;                                           \
                lse[h0 * Tq + r] = m + (T)log((double)s);                                              \
            }                                                                                          \
            for (int64_t h = 0; h < nh; h++)                                                           \
                gemm_##S(false, false, Tq, Dv, Tk, 1, sc + h * Tq * Tk, Tk, v + (h0 + h) * Tk * Dv, Dv, 0, \
                         out + (h0 + h) * Tq * Dv, Dv);                                                \
        }                                                                                              \
    }                                                                                                  \
    static void attn_bwd_##S(const geom *g, const T *q, const T *k, const T *v, const T *out, const T *lse, \
                             const T *dout, T *dq, T *dk, T *dv, T *sc, T *dp) {                       \
        int64_t Tq = g->Tq, Tk = g->Tk, D = g->D, Dv = g->Dv, G = group_heads(g);                      \
        T scale = (T)g->scale;                                                                         \
        for (int64_t h0 = 0; h0 < g->BH; h0 += G) {                                                    \
            int64_t nh = h0 + G < g->BH ? G : g->BH - h0, rows = nh * Tq;                              \
            for (int64_t h = 0; h < nh; h++) {                                                         \
                int64_t H = h0 + h;                                                                    \
                gemm_##S(false, true, Tq, Tk, D, scale, q + H * Tq * D, D, k + H * Tk * D, D, 0, sc + h * Tq * Tk, Tk); \
                gemm_##S(false, true, Tq, Tk, Dv, 1, dout + H * Tq * Dv, Dv, v + H * Tk * Dv, Dv, 0, dp + h * Tq * Tk, \
                         Tk);                                                                          \
            }                                                                                          \
            _Pragma("omp parallel for schedule(static) if (rows * Tk > PAR_MIN)")                      \
            for (int64_t r = 0; r < rows; r++) {                                                       \
                T *row = sc + r * Tk, *drow = dp + r * Tk, l = lse[h0 * Tq + r], dr = 0;               \
                const T *o = out + (h0 * Tq + r) * Dv, *go = dout + (h0 * Tq + r) * Dv;                \
                int64_t L = visible(g, r % Tq);                                                        \
                TS_SIMD_##S(reduction(+ : dr)) for (int64_t j = 0; j < Dv; j++) dr += o[j] * go[j];    \
                TS_SIMD_##S() for (int64_t j = 0; j < L; j++) {                                        \
                    T p = ts_exp_##S(row[j] - l);                                                      \
                    row[j] = p;                                                                        \
                    drow[j] = p * (drow[j] - dr) * scale;                                              \
                }                                                                                      \
                for (int64_t j = L; j < Tk; j++) row[j] = drow[j] = 0;                                 \
            }                                                                                          \
            for (int64_t h = 0; h < nh; h++) {                                                         \
                int64_t H = h0 + h;                                                                    \
                const T *P = sc + h * Tq * Tk, *dS = dp + h * Tq * Tk;                                 \
                if (dv) gemm_##S(true, false, Tk, Dv, Tq, 1, P, Tk, dout + H * Tq * Dv, Dv, 0, dv + H * Tk * Dv, Dv); \
                if (dq) gemm_##S(false, false, Tq, D, Tk, 1, dS, Tk, k + H * Tk * D, D, 0, dq + H * Tq * D, D); \
                if (dk) gemm_##S(true, false, Tk, D, Tq, 1, dS, Tk, q + H * Tq * D, D, 0, dk + H * Tk * D, D); \
            }                                                                                          \
        }                                                                                              \
    }

ATTENTION_DEFINE(float, f, cblas_sgemm)
ATTENTION_DEFINE(double, d, cblas_dgemm)

/* Geometry stored in a node: iargs 0..4 = BH, Tq, Tk, D, Dv; 5 = causal;
 * fargs[0] = scale. */
static geom node_geom(const ts_node *n) {
    return (geom){n->iargs[0], n->iargs[1], n->iargs[2], n->iargs[3], n->iargs[4], n->iargs[5] != 0, n->fargs[0]};
}

/* A scratch score buffer for one group of heads. */
static ts_tensor *scratch(ts_dtype dt, const geom *g) {
    int64_t n = group_heads(g) * g->Tq * g->Tk;
    return ts_tensor_empty(dt, 1, &n);
}

/* Data pointer of an optional tensor. */
static void *opt_data(const ts_tensor *t) { return t ? ts_tensor_data(t) : NULL; }

/* saved: 0 q, 1 k, 2 v (contiguous), 3 out, 4 lse [BH * Tq]. */
static ts_status attention_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    geom ge = node_geom(n);
    ts_tensor *q = n->saved[0], *k = n->saved[1], *v = n->saved[2], *out = n->saved[3], *lse = n->saved[4];
    ts_tensor *dout = ts_contiguous(g), *sc = scratch(q->dtype, &ge), *dp = scratch(q->dtype, &ge);
    ts_status st = dout && sc && dp ? TS_OK : ts_last_status();
    for (int i = 0; i < 3 && !st; i++) {
        ts_tensor *x = n->saved[i];
        if (ts_node_wants(n, i) && !(gin[i] = ts_tensor_empty(x->dtype, x->ndim, x->shape))) st = ts_last_status();
    }
    if (!st) {
        if (q->dtype == TS_F32)
            attn_bwd_f(&ge, ts_f32(q), ts_f32(k), ts_f32(v), ts_f32(out), ts_f32(lse), ts_f32(dout), opt_data(gin[0]),
                       opt_data(gin[1]), opt_data(gin[2]), ts_f32(sc), ts_f32(dp));
        else
            attn_bwd_d(&ge, ts_f64(q), ts_f64(k), ts_f64(v), ts_f64(out), ts_f64(lse), ts_f64(dout), opt_data(gin[0]),
                       opt_data(gin[1]), opt_data(gin[2]), ts_f64(sc), ts_f64(dp));
    }
    ts_tensor_release(dout);
    ts_tensor_release(sc);
    ts_tensor_release(dp);
    return st;
}

/* Checks shapes and dtypes; fills the geometry. */
static ts_status check_inputs(const ts_tensor *q, const ts_tensor *k, const ts_tensor *v, bool causal, double scale,
                              geom *g) {
    if (ts_check_tensor("attention", "q", q, TS_FLOATS) || ts_check_tensor("attention", "k", k, TS_FLOATS) ||
        ts_check_tensor("attention", "v", v, TS_FLOATS))
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
    *g = (geom){q->shape[0] * q->shape[1], q->shape[2], k->shape[2], q->shape[3], v->shape[3], causal,
                scale != 0 ? scale : 1.0 / sqrt((double)q->shape[3])};
    return TS_OK;
}

/* A contiguous tensor with t's values (t retained when already contiguous). */
static ts_tensor *dense(ts_tensor *t) {
    return ts_tensor_is_contiguous(t) ? ts_tensor_retain(t) : ts_tensor_copy_as(t, t->dtype);
}

ts_tensor *ts_attention(ts_tensor *q, ts_tensor *k, ts_tensor *v, bool causal, double scale) {
    geom ge;
    if (check_inputs(q, k, v, causal, scale, &ge)) return NULL;
    int64_t oshape[4] = {q->shape[0], q->shape[1], ge.Tq, ge.Dv}, nl = ge.BH * ge.Tq;
    ts_tensor *qc = dense(q), *kc = dense(k), *vc = dense(v), *sc = scratch(q->dtype, &ge);
    ts_tensor *out = ts_tensor_empty(q->dtype, 4, oshape), *lse = ts_tensor_empty(q->dtype, 1, &nl);
    if (qc && kc && vc && sc && out && lse) {
        if (q->dtype == TS_F32)
            attn_fwd_f(&ge, ts_f32(qc), ts_f32(kc), ts_f32(vc), ts_f32(out), ts_f32(lse), ts_f32(sc));
        else
            attn_fwd_d(&ge, ts_f64(qc), ts_f64(kc), ts_f64(vc), ts_f64(out), ts_f64(lse), ts_f64(sc));
        ts_node *n = ts_autograd_record(out, "attention", attention_backward, 3, (ts_tensor *[]){q, k, v});
        if (n) {
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
    ts_tensor_release(sc);
    ts_tensor_release(lse);
    return out;
}
