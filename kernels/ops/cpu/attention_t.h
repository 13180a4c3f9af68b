/* attention_t.h - fused attention of one dtype (a dtype template, see
 * cpu.h; included by attention.c): the register-tiled matrix kernel, the
 * blocked transpose, and one head forward and backward. */
#include "kernels/ops/cpu/dtype.h"

/* A vector of this target's width. */
typedef T FN(vec) __attribute__((vector_size(TS_VEC_BYTES)));

/* C[mr, NR] = A[mr, K] B[K, NR] for mr <= MR rows: the register tile,
 * mr x NV vectors of accumulators. A(i, k) is at A[i * ars + k * acs] (so
 * A may be read transposed), or with PACK_A a whole vector of it at
 * A + (k * mr + i) * W; B and C are row-major with leading dims. Inlined
 * with mr constant, so the accumulators stay in registers. */
static inline __attribute__((always_inline)) void FN(tile)(int mr, int64_t K, const T *A, int64_t ars, int64_t acs,
                                                            const T *B, int64_t ldb, T *C, int64_t ldc) {
    enum { W = TS_VEC_BYTES / sizeof(T) };
    FN(vec) acc[MR][NV];
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < NV; v++) acc[r][v] = (FN(vec)){0};
    for (int64_t k = 0; k < K; k++) {
        FN(vec) b[NV];
        for (int v = 0; v < NV; v++) memcpy(&b[v], B + k * ldb + v * W, sizeof b[v]);
        for (int r = 0; r < mr; r++) {
#if PACK_A
            FN(vec) a;
            memcpy(&a, A + (k * mr + r) * W, sizeof a);
            (void)ars, (void)acs;
#else
            T a = A[r * ars + k * acs];
#endif
            for (int v = 0; v < NV; v++) acc[r][v] += a * b[v];
        }
    }
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < NV; v++) memcpy(C + r * ldc + v * W, &acc[r][v], sizeof acc[r][v]);
}

/* Columns [j0, N) of rows [i0, i1) of the product, a row at a time (the
 * edge a whole tile does not cover). */
static void FN(mm_edge)(int64_t i0, int64_t i1, int64_t j0, int64_t N, int64_t K, const T *A, int64_t ars,
                        int64_t acs, const T *B, int64_t ldb, T *C, int64_t ldc) {
    for (int64_t i = i0; i < i1; i++) {
        T *c = C + i * ldc;
        for (int64_t j = j0; j < N; j++) c[j] = 0;
        for (int64_t k = 0; k < K; k++) {
            T a = A[i * ars + k * acs];
            const T *b = B + k * ldb;
            for (int64_t j = j0; j < N; j++) c[j] += a * b[j];
        }
    }
}

/* Rows [i0, i0 + mr) of C = A B: the tiles, then the column edge, within
 * the causal limits of the product (see mm). With PACK_A the tiles read
 * the rows' A from pk, each element repeated over a vector. */
static inline __attribute__((always_inline)) void FN(tile_rows)(int mr, int64_t i0, int64_t N, int64_t K,
                                                                 const T *A, int64_t ars, int64_t acs, const T *B,
                                                                 int64_t ldb, T *C, int64_t ldc, const tri *t, T *pk) {
    enum { NR = NV * TS_VEC_BYTES / sizeof(T) };
    int64_t reach = i0 + mr + t->off, k0 = 0, Nf = N / NR * NR;
    if (t->mode == TRI_COLS && reach < N) N = reach; /* columns past N stay unwritten */
    if (t->mode == TRI_INNER_END && reach < K) K = reach;
    if (t->mode == TRI_INNER_BEGIN) k0 = i0 + t->off < 0 ? 0 : i0 + t->off < K ? i0 + t->off : K;
    A += k0 * acs;
    B += k0 * ldb;
    K -= k0;
    const T *At = A + i0 * ars;
#if PACK_A
    enum { W = TS_VEC_BYTES / sizeof(T) };
    for (int64_t k = 0; k < K; k++)
        for (int r = 0; r < mr; r++)
            for (int l = 0; l < W; l++) pk[(k * mr + r) * W + l] = At[r * ars + k * acs];
    At = pk;
#else
    (void)pk;
#endif
    for (int64_t j0 = 0; j0 < N && j0 + NR <= Nf; j0 += NR)
        FN(tile)(mr, K, At, ars, acs, B + j0, ldb, C + i0 * ldc + j0, ldc);
    if (Nf < N) FN(mm_edge)(i0, i0 + mr, Nf, N, K, A, ars, acs, B, ldb, C, ldc);
}

/* C[M, N] = A[M, K] B[K, N] (K = 0 gives zeros): tiles of MR rows, the
 * remaining rows in tiles of 4, 2 and 1. Under a causal limit t, each tile
 * computes only what its rows need (the row passes zero the rest). pk:
 * the thread's packing buffer (PACK_A). */
static void FN(mm)(int64_t M, int64_t N, int64_t K, const T *A, int64_t ars, int64_t acs, const T *B, int64_t ldb,
                   T *C, int64_t ldc, tri t, T *pk) {
    int64_t i0 = 0;
    for (; i0 + MR <= M; i0 += MR) FN(tile_rows)(MR, i0, N, K, A, ars, acs, B, ldb, C, ldc, &t, pk);
    for (; i0 + 4 <= M; i0 += 4) FN(tile_rows)(4, i0, N, K, A, ars, acs, B, ldb, C, ldc, &t, pk);
    for (; i0 + 2 <= M; i0 += 2) FN(tile_rows)(2, i0, N, K, A, ars, acs, B, ldb, C, ldc, &t, pk);
    for (; i0 < M; i0++) FN(tile_rows)(1, i0, N, K, A, ars, acs, B, ldb, C, ldc, &t, pk);
}

/* dst[c, r] = src[r, c] for a rows x cols matrix with rows lds apart, in
 * square tiles. */
static void FN(transpose)(const T *src, int64_t rows, int64_t cols, int64_t lds, T *dst) {
    for (int64_t r0 = 0; r0 < rows; r0 += TR_TILE)
        for (int64_t c0 = 0; c0 < cols; c0 += TR_TILE) {
            int64_t r1 = r0 + TR_TILE < rows ? r0 + TR_TILE : rows, c1 = c0 + TR_TILE < cols ? c0 + TR_TILE : cols;
            for (int64_t c = c0; c < c1; c++)
                for (int64_t r = r0; r < r1; r++) dst[c * rows + r] = src[r * lds + c];
        }
}

/* out and lse of one head (q, k, v, out, lse at the head, rows as the
 * geometry's layouts say), with the thread's scratch ws: K^T, then one
 * row block of scores. */
static void FN(head_forward)(const ts_attention_geom *g, const T *q, const T *k, const T *v, T *out, T *lse, T *ws) {
    int64_t Tq = g->Tq, Tk = g->Tk, D = g->D, Dv = g->Dv, sq = g->q.sr, so = g->o.sr;
    T scale = (T)g->scale, *kt = ws, *sc = kt + D * Tk, *pk = sc + (Tq < ROW_BLOCK ? Tq : ROW_BLOCK) * Tk;
    FN(transpose)(k, Tk, D, g->k.sr, kt);
    for (int64_t i0 = 0; i0 < Tq; i0 += ROW_BLOCK) {
        int64_t i1 = i0 + ROW_BLOCK < Tq ? i0 + ROW_BLOCK : Tq, n = block_width(g, i1);
        FN(mm)(i1 - i0, n, D, q + i0 * sq, sq, 1, kt, Tk, sc, Tk, causal(g, TRI_COLS, i0), pk);
        for (int64_t i = i0; i < i1; i++) {
            T *row = sc + (i - i0) * Tk;
            int64_t L = visible(g, i);
            SIMD() for (int64_t j = 0; j < L; j++) row[j] *= scale;
            T m = ROW_MAX(row, L), s = ROW_EXP(row, row, L, m), inv = (T)1 / s;
            SIMD() for (int64_t j = 0; j < L; j++) row[j] *= inv;
            for (int64_t j = L; j < n; j++) row[j] = 0;
            lse[i] = m + (T)log((double)s);
        }
        FN(mm)(i1 - i0, Dv, n, sc, Tk, 1, v, g->v.sr, out + i0 * so, so, causal(g, TRI_INNER_END, i0), pk);
    }
}

/* dq, dk, dv of one head (each may be NULL), with the thread's scratch ws:
 * K^T, V^T, then the probabilities P and score gradients dS of the head. */
static void FN(head_backward)(const ts_attention_geom *g, const T *q, const T *k, const T *v, const T *out,
                              const T *lse, const T *dout, T *dq, T *dk, T *dv, T *ws) {
    int64_t Tq = g->Tq, Tk = g->Tk, D = g->D, Dv = g->Dv, sq = g->q.sr, sk = g->k.sr, sv = g->v.sr, so = g->o.sr;
    T scale = (T)g->scale, *kt = ws, *vt = kt + D * Tk, *P = vt + Dv * Tk, *dS = P + Tq * Tk, *pk = dS + Tq * Tk;
    FN(transpose)(k, Tk, D, sk, kt);
    FN(transpose)(v, Tk, Dv, sv, vt);
    for (int64_t i0 = 0; i0 < Tq; i0 += ROW_BLOCK) {
        int64_t i1 = i0 + ROW_BLOCK < Tq ? i0 + ROW_BLOCK : Tq, n = block_width(g, i1);
        FN(mm)(i1 - i0, n, D, q + i0 * sq, sq, 1, kt, Tk, P + i0 * Tk, Tk, causal(g, TRI_COLS, i0), pk);
        FN(mm)(i1 - i0, n, Dv, dout + i0 * so, so, 1, vt, Tk, dS + i0 * Tk, Tk, causal(g, TRI_COLS, i0), pk);
        for (int64_t i = i0; i < i1; i++) {
            T *p = P + i * Tk, *ds = dS + i * Tk, l = lse[i], dr = 0;
            const T *o = out + i * so, *go = dout + i * so;
            int64_t L = visible(g, i);
            SIMD(reduction(+ : dr)) for (int64_t j = 0; j < Dv; j++) dr += o[j] * go[j];
            SIMD() for (int64_t j = 0; j < L; j++) {
                T e = EXP(p[j] * scale - l);
                p[j] = e;
                ds[j] = e * (ds[j] - dr) * scale;
            }
            for (int64_t j = L; j < Tk; j++) p[j] = ds[j] = 0;
        }
        if (dq) FN(mm)(i1 - i0, D, n, dS + i0 * Tk, Tk, 1, k, sk, dq + i0 * sq, sq, causal(g, TRI_INNER_END, i0), pk);
    }
    /* dV = P^T dO and dK = dS^T Q, reading P and dS transposed; when causal,
     * key rows j0.. see only queries j0.., and each tile of key rows only
     * the queries from its first key on */
    for (int64_t j0 = 0; j0 < Tk; j0 += ROW_BLOCK) {
        int64_t j1 = j0 + ROW_BLOCK < Tk ? j0 + ROW_BLOCK : Tk, ks = g->causal ? (j0 < Tq ? j0 : Tq) : 0;
        tri t = causal(g, TRI_INNER_BEGIN, j0 - ks);
        if (dv) FN(mm)(j1 - j0, Dv, Tq - ks, P + ks * Tk + j0, 1, Tk, dout + ks * so, so, dv + j0 * sv, sv, t, pk);
        if (dk) FN(mm)(j1 - j0, D, Tq - ks, dS + ks * Tk + j0, 1, Tk, q + ks * sq, sq, dk + j0 * sk, sk, t, pk);
    }
}

/* Where head h of an operand of layout l starts. */
static inline int64_t FN(head_at)(const ts_attention_geom *g, ts_attention_layout l, int64_t h) {
    return h / g->H * l.sb + h % g->H * l.sh;
}

/* Every head, spread over the threads, each with its slice of ws. */
static void FN(attention)(const ts_attention_geom *g, const T *q, const T *k, const T *v, T *out, T *lse, T *ws) {
    int64_t per = scratch_per_thread(g);
#pragma omp parallel for schedule(static) if (g->BH * g->Tq * g->Tk * g->D > TS_PAR_MIN)
    for (int64_t h = 0; h < g->BH; h++)
        FN(head_forward)(g, q + FN(head_at)(g, g->q, h), k + FN(head_at)(g, g->k, h), v + FN(head_at)(g, g->v, h),
                         out + FN(head_at)(g, g->o, h), lse + h * g->Tq, ws + omp_get_thread_num() * per);
}

static void FN(attention_backward)(const ts_attention_geom *g, const T *q, const T *k, const T *v, const T *out,
                                   const T *lse, const T *dout, T *dq, T *dk, T *dv, T *ws) {
    int64_t per = scratch_per_thread(g);
#pragma omp parallel for schedule(static) if (g->BH * g->Tq * g->Tk * g->D > TS_PAR_MIN)
    for (int64_t h = 0; h < g->BH; h++) {
        int64_t oq = FN(head_at)(g, g->q, h), ok = FN(head_at)(g, g->k, h), ov = FN(head_at)(g, g->v, h),
                oo = FN(head_at)(g, g->o, h);
        FN(head_backward)(g, q + oq, k + ok, v + ov, out + oo, lse + h * g->Tq, dout + oo, dq ? dq + oq : NULL,
                          dk ? dk + ok : NULL, dv ? dv + ov : NULL, ws + omp_get_thread_num() * per);
    }
}
