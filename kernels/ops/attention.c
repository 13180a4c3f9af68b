/* attention.c - fused scaled dot-product attention, forward and backward.
 *
 * Per head h (of B*H): S = scale Q K^T [Tq, Tk], P = softmax(S) with the
 * causal mask, O = P V; the forward keeps lse = log sum exp S per row. The
 * backward recomputes P = exp(S - lse), then with dP = dO V^T and
 * Dr = sum(dO * O) per row: dS = P (dP - Dr) scale, dV = P^T dO,
 * dQ = dS K, dK = dS^T Q.
 *
 * Threads take whole heads (OpenMP over B*H); inside a head everything is
 * serial and cache-sized: query rows go in blocks of ROW_BLOCK, the products
 * are a register-tiled matrix kernel of our own rather than OpenBLAS, since
 * OpenBLAS may not be called inside an OpenMP region and calling it per
 * head from outside (with its threads) left both thread pools spinning
 * against each other. With the causal mask, blocks skip the keys no query
 * of the block sees (about half the work).
 */
#include "kernels/ops/attention.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "kernels/autograd.h"
#include "kernels/ops/cpu/rowmath.h"
#include "kernels/ops/view.h"

/* Query rows per block: the scores of one block are computed, normalised
 * and multiplied by V while they are in cache. */
#define ROW_BLOCK 64
/* Register tile of the matrix kernel: MR rows x NV vectors of C. Vectors are
 * 64-byte GNU vector types (AVX-512 registers where the target has them,
 * pairs of AVX2 registers otherwise), so NR = NV * 64 / sizeof(T) columns. */
#define MR 8
#define NV 2
typedef float ts_vec_f __attribute__((vector_size(64)));
typedef double ts_vec_d __attribute__((vector_size(64)));
/* gcc in ISO C mode does not fuse a * b + c into FMA instructions; the
 * matrix kernel asks for it (clang fuses within an expression by default). */
#if defined(__GNUC__) && !defined(__clang__)
#define FUSED_MULTIPLY_ADD __attribute__((optimize("fp-contract=fast")))
#else
#define FUSED_MULTIPLY_ADD
#endif
/* Tile of the blocked transpose. */
#define TR_TILE 16
/* Heads are spread over threads when there is at least this much work. */
#define PAR_MIN 32768

/* Problem geometry. */
typedef struct {
    int64_t BH, Tq, Tk, D, Dv;
    bool causal;
    double scale;
} geom;

/* Keys visible to query i. */
static inline int64_t visible(const geom *g, int64_t i) { return g->causal && i + 1 < g->Tk ? i + 1 : g->Tk; }

/* Keys any query of rows [i0, i1) sees: the width of that block's scores. */
static inline int64_t block_width(const geom *g, int64_t i1) { return visible(g, i1 - 1); }

/* Scratch elements per thread: K^T, V^T, the probabilities and the score
 * gradients of a head (the backward needs all; the forward less). */
static int64_t scratch_per_thread(const geom *g) {
    return g->Tk * (g->D + g->Dv) + 2 * g->Tq * g->Tk;
}

/* For each type T (suffix S):
 *   mm_S        C[M,N] = alpha A[M,K] B[K,N]; A(i,k) at A[i*ars + k*acs] (so
 *               A may be read transposed), B and C row-major with leading
 *               dims: MR x NV register tiles of vectors, row-axpy loops
 *               for the edges; K = 0 gives zeros
 *   tr_S        dst[c, r] = src[r, c] for a rows x cols matrix, in tiles
 *   attn_fwd_S  out and lse of one head (q, k, v, out at the head)
 *   attn_bwd_S  dq, dk, dv of one head (each may be NULL)
 * A head is computed by one thread with its own scratch (ws). */
#define ATTENTION_DEFINE(T, S)                                                                         \
    FUSED_MULTIPLY_ADD static void mm_edge_##S(int64_t i0, int64_t i1, int64_t j0, int64_t N, int64_t K, T alpha, const T *A, \
                            int64_t ars, int64_t acs, const T *B, int64_t ldb, T *C, int64_t ldc) {    \
        for (int64_t i = i0; i < i1; i++) {                                                            \
            T *c = C + i * ldc;                                                                        \
            for (int64_t j = j0; j < N; j++) c[j] = 0;                                                 \
            for (int64_t k = 0; k < K; k++) {                                                          \
                T a = alpha * A[i * ars + k * acs];                                                    \
                const T *b = B + k * ldb;                                                              \
                for (int64_t j = j0; j < N; j++) c[j] += a * b[j];                                     \
            }                                                                                          \
        }                                                                                              \
    }                                                                                                  \
    FUSED_MULTIPLY_ADD static void mm_##S(int64_t M, int64_t N, int64_t K, T alpha, const T *A, int64_t ars, int64_t acs,  \
                       const T *B, int64_t ldb, T *C, int64_t ldc) {                                   \
        enum { W = sizeof(ts_vec_##S) / sizeof(T), NR = NV * W };                                      \
        int64_t Mf = M / MR * MR, Nf = N / NR * NR;                                                    \
        for (int64_t i0 = 0; i0 < Mf; i0 += MR) {                                                      \
            for (int64_t j0 = 0; j0 < Nf; j0 += NR) {                                                  \
                ts_vec_##S acc[MR][NV];                                                                \
                for (int r = 0; r < MR; r++)                                                           \
                    for (int v = 0; v < NV; v++) acc[r][v] = (ts_vec_##S){0};                          \
                for (int64_t k = 0; k < K; k++) {                                                      \
                    ts_vec_##S b[NV];                                                                  \
                    for (int v = 0; v < NV; v++) memcpy(&b[v], B + k * ldb + j0 + v * W, sizeof b[v]); \
                    for (int r = 0; r < MR; r++) {                                                     \
                        T a = A[(i0 + r) * ars + k * acs];                                             \
                        for (int v = 0; v < NV; v++) acc[r][v] += a * b[v];                            \
                    }                                                                                  \
                }                                                                                      \
                for (int r = 0; r < MR; r++)                                                           \
                    for (int v = 0; v < NV; v++) {                                                     \
                        ts_vec_##S o = alpha * acc[r][v];                                              \
                        memcpy(C + (i0 + r) * ldc + j0 + v * W, &o, sizeof o);                         \
                    }                                                                                  \
            }                                                                                          \
            if (Nf < N) mm_edge_##S(i0, i0 + MR, Nf, N, K, alpha, A, ars, acs, B, ldb, C, ldc);        \
        }                                                                                              \
        if (Mf < M) mm_edge_##S(Mf, M, 0, N, K, alpha, A, ars, acs, B, ldb, C, ldc);                   \
    }                                                                                                  \
    static void tr_##S(const T *src, int64_t rows, int64_t cols, T *dst) {                             \
        for (int64_t r0 = 0; r0 < rows; r0 += TR_TILE)                                                 \
            for (int64_t c0 = 0; c0 < cols; c0 += TR_TILE) {                                           \
                int64_t r1 = r0 + TR_TILE < rows ? r0 + TR_TILE : rows;                                \
                int64_t c1 = c0 + TR_TILE < cols ? c0 + TR_TILE : cols;                                \
                for (int64_t c = c0; c < c1; c++)                                                      \
                    for (int64_t r = r0; r < r1; r++) dst[c * rows + r] = src[r * cols + c];           \
            }                                                                                          \
    }                                                                                                  \
    static void head_fwd_##S(const geom *g, const T *q, const T *k, const T *v, T *out, T *lse, T *ws) { \
        int64_t Tq = g->Tq, Tk = g->Tk, D = g->D, Dv = g->Dv;                                          \
        T *kt = ws, *sc = kt + D * Tk;                                                                 \
        tr_##S(k, Tk, D, kt);                                                                          \
        for (int64_t i0 = 0; i0 < Tq; i0 += ROW_BLOCK) {                                               \
            int64_t i1 = i0 + ROW_BLOCK < Tq ? i0 + ROW_BLOCK : Tq, n = block_width(g, i1);            \
            mm_##S(i1 - i0, n, D, (T)g->scale, q + i0 * D, D, 1, kt, Tk, sc, Tk);                      \
            for (int64_t i = i0; i < i1; i++) {                                                        \
                T *row = sc + (i - i0) * Tk;                                                           \
                int64_t L = visible(g, i);                                                             \
                T m = ts_row_max_##S(row, L), s = ts_row_exp_##S(row, row, L, m), inv = (T)1 / s;      \
                TS_SIMD_##S() for (int64_t j = 0; j < L; j++) row[j] *= inv;                           \
                for (int64_t j = L; j < n; j++) row[j] = 0;                                            \
                lse[i] = m + (T)log((double)s);                                                        \
            }                                                                                          \
            mm_##S(i1 - i0, Dv, n, 1, sc, Tk, 1, v, Dv, out + i0 * Dv, Dv);                            \
        }                                                                                              \
    }                                                                                                  \
    static void head_bwd_##S(const geom *g, const T *q, const T *k, const T *v, const T *out, const T *lse, \
                             const T *dout, T *dq, T *dk, T *dv, T *ws) {                              \
        int64_t Tq = g->Tq, Tk = g->Tk, D = g->D, Dv = g->Dv;                                          \
        T scale = (T)g->scale, *kt = ws, *vt = kt + D * Tk, *P = vt + Dv * Tk, *dS = P + Tq * Tk;      \
        tr_##S(k, Tk, D, kt);                                                                          \
        tr_##S(v, Tk, Dv, vt);                                                                         \
        for (int64_t i0 = 0; i0 < Tq; i0 += ROW_BLOCK) {                                               \
            int64_t i1 = i0 + ROW_BLOCK < Tq ? i0 + ROW_BLOCK : Tq, n = block_width(g, i1);            \
            mm_##S(i1 - i0, n, D, scale, q + i0 * D, D, 1, kt, Tk, P + i0 * Tk, Tk);                   \
            mm_##S(i1 - i0, n, Dv, 1, dout + i0 * Dv, Dv, 1, vt, Tk, dS + i0 * Tk, Tk);                \
            for (int64_t i = i0; i < i1; i++) {                                                        \
                T *p = P + i * Tk, *ds = dS + i * Tk, l = lse[i], dr = 0;                              \
                const T *o = out + i * Dv, *go = dout + i * Dv;                                        \
                int64_t L = visible(g, i);                                                             \
                TS_SIMD_##S(reduction(+ : dr)) for (int64_t j = 0; j < Dv; j++) dr += o[j] * go[j];    \
                TS_SIMD_##S() for (int64_t j = 0; j < L; j++) {                                        \
                    T e = ts_exp_##S(p[j] - l);                                                        \
                    p[j] = e;                                                                          \
                    ds[j] = e * (ds[j] - dr) * scale;                                                  \
                }                                                                                      \
                for (int64_t j = L; j < Tk; j++) p[j] = ds[j] = 0;                                     \
            }                                                                                          \
            if (dq) mm_##S(i1 - i0, D, n, 1, dS + i0 * Tk, Tk, 1, k, D, dq + i0 * D, D);               \
        }                                                                                              \
        /* dV = P^T dO and dK = dS^T Q, reading P and dS transposed; when causal,     \
         * key rows j0.. see only queries j0.. */                                                  \
        for (int64_t j0 = 0; j0 < Tk; j0 += ROW_BLOCK) {                                               \
            int64_t j1 = j0 + ROW_BLOCK < Tk ? j0 + ROW_BLOCK : Tk, ks = g->causal ? (j0 < Tq ? j0 : Tq) : 0; \
            if (dv) mm_##S(j1 - j0, Dv, Tq - ks, 1, P + ks * Tk + j0, 1, Tk, dout + ks * Dv, Dv, dv + j0 * Dv, Dv); \
            if (dk) mm_##S(j1 - j0, D, Tq - ks, 1, dS + ks * Tk + j0, 1, Tk, q + ks * D, D, dk + j0 * D, D); \
        }                                                                                              \
    }                                                                                                  \
    static void attn_fwd_##S(const geom *g, const T *q, const T *k, const T *v, T *out, T *lse, T *ws) {   \
        int64_t per = scratch_per_thread(g);                                                           \
        _Pragma("omp parallel for schedule(static) if (g->BH * g->Tq * g->Tk * g->D > PAR_MIN)")        \
        for (int64_t h = 0; h < g->BH; h++)                                                            \
            head_fwd_##S(g, q + h * g->Tq * g->D, k + h * g->Tk * g->D, v + h * g->Tk * g->Dv,         \
                         out + h * g->Tq * g->Dv, lse + h * g->Tq, ws + omp_get_thread_num() * per);   \
    }                                                                                                  \
    static void attn_bwd_##S(const geom *g, const T *q, const T *k, const T *v, const T *out, const T *lse, \
                             const T *dout, T *dq, T *dk, T *dv, T *ws) {                              \
        int64_t per = scratch_per_thread(g), nq = g->Tq * g->D, nk = g->Tk * g->D, nv = g->Tk * g->Dv;  \
        _Pragma("omp parallel for schedule(static) if (g->BH * g->Tq * g->Tk * g->D > PAR_MIN)")        \
        for (int64_t h = 0; h < g->BH; h++)                                                            \
            head_bwd_##S(g, q + h * nq, k + h * nk, v + h * nv, out + h * g->Tq * g->Dv, lse + h * g->Tq, \
                         dout + h * g->Tq * g->Dv, dq ? dq + h * nq : NULL, dk ? dk + h * nk : NULL,   \
                         dv ? dv + h * nv : NULL, ws + omp_get_thread_num() * per);                    \
    }

ATTENTION_DEFINE(float, f)
ATTENTION_DEFINE(double, d)

/* Geometry stored in a node: iargs 0..4 = BH, Tq, Tk, D, Dv; 5 = causal;
 * fargs[0] = scale. */
static geom node_geom(const ts_node *n) {
    return (geom){n->iargs[0], n->iargs[1], n->iargs[2], n->iargs[3], n->iargs[4], n->iargs[5] != 0, n->fargs[0]};
}

/* Scratch for every thread of the team. */
static ts_tensor *scratch(ts_dtype dt, const geom *g) {
    int64_t n = (int64_t)omp_get_max_threads() * scratch_per_thread(g);
    return ts_tensor_empty(dt, 1, &n);
}

/* Data pointer of an optional tensor. */
static void *opt_data(const ts_tensor *t) { return t ? ts_tensor_data(t) : NULL; }

/* saved: 0 q, 1 k, 2 v (contiguous), 3 out, 4 lse [BH * Tq]. */
static ts_status attention_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    geom ge = node_geom(n);
    ts_tensor *q = n->saved[0], *k = n->saved[1], *v = n->saved[2], *out = n->saved[3], *lse = n->saved[4];
    ts_tensor *dout = ts_contiguous(g), *ws = scratch(q->dtype, &ge);
    ts_status st = dout && ws ? TS_OK : ts_last_status();
    for (int i = 0; i < 3 && !st; i++) {
        ts_tensor *x = n->saved[i];
        if (ts_node_wants(n, i) && !(gin[i] = ts_tensor_empty(x->dtype, x->ndim, x->shape))) st = ts_last_status();
    }
    if (!st) {
        if (q->dtype == TS_F32)
            attn_bwd_f(&ge, ts_f32(q), ts_f32(k), ts_f32(v), ts_f32(out), ts_f32(lse), ts_f32(dout), opt_data(gin[0]),
                       opt_data(gin[1]), opt_data(gin[2]), ts_f32(ws));
        else
            attn_bwd_d(&ge, ts_f64(q), ts_f64(k), ts_f64(v), ts_f64(out), ts_f64(lse), ts_f64(dout), opt_data(gin[0]),
                       opt_data(gin[1]), opt_data(gin[2]), ts_f64(ws));
    }
    ts_tensor_release(dout);
    ts_tensor_release(ws);
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

ts_tensor *ts_attention(ts_tensor *q, ts_tensor *k, ts_tensor *v, bool causal, double scale) {
    geom ge;
    if (check_inputs(q, k, v, causal, scale, &ge)) return NULL;
    int64_t oshape[4] = {q->shape[0], q->shape[1], ge.Tq, ge.Dv}, nl = ge.BH * ge.Tq;
    ts_tensor *qc = ts_tensor_dense(q), *kc = ts_tensor_dense(k), *vc = ts_tensor_dense(v), *sc = scratch(q->dtype, &ge);
    ts_tensor *out = ts_tensor_empty(q->dtype, 4, oshape), *lse = ts_tensor_empty(q->dtype, 1, &nl);
    if (qc && kc && vc && sc && out && lse) {
        if (q->dtype == TS_F32)
            attn_fwd_f(&ge, ts_f32(qc), ts_f32(kc), ts_f32(vc), ts_f32(out), ts_f32(lse), ts_f32(sc));
        else
            attn_fwd_d(&ge, ts_f64(qc), ts_f64(kc), ts_f64(vc), ts_f64(out), ts_f64(lse), ts_f64(sc));
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
    ts_tensor_release(sc);
    ts_tensor_release(lse);
    return out;
}
