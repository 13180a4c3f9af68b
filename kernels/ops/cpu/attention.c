/* attention.c - CPU kernels of fused scaled dot-product attention.
 *
 * Per head (of B*H): S = scale Q K^T [Tq, Tk], P = softmax(S) with the
 * causal mask, O = P V; the forward keeps lse = log sum exp S per row. The
 * backward recomputes P = exp(S - lse), then with dP = dO V^T and
 * Dr = sum(dO * O) per row: dS = P (dP - Dr) scale, dV = P^T dO,
 * dQ = dS K, dK = dS^T Q. Heads and their rows are read and written where
 * the geometry's layouts put them (a GPT's q, k, v inside its packed qkv
 * rows; the output heads side by side in each token's row): the products
 * take leading dimensions, so no head is copied out or back.
 *
 * Threads take whole heads (OpenMP over B*H); inside a head everything is
 * serial and cache-sized: query rows go in blocks of ROW_BLOCK, the
 * products are a register-tiled matrix kernel of our own rather than
 * OpenBLAS, since OpenBLAS may not be called inside an OpenMP region and
 * calling it per head from outside (with its threads) left both thread
 * pools spinning against each other. With the causal mask, each register
 * tile skips the keys its queries do not see (about half the work). The
 * kernels are in attention_t.h, once per dtype.
 */
#include <math.h>
#include <string.h>

#include "kernels/ops/cpu/cpu.h"

/* Query rows per block: the scores of one block are computed, normalised
 * and multiplied by V while they are in cache. */
#define ROW_BLOCK 64
/* SSE has no broadcast load: a scalar times a vector costs a shuffle per
 * element, on the ports the multiplies and adds need. There each row tile
 * of A is packed once into vectors of one element repeated (reused by
 * every column tile); with AVX and NEON the broadcast is free. */
#if defined(__SSE2__) && !defined(__AVX__)
#define PACK_A 1
#else
#define PACK_A 0
#endif
/* The register tile of the matrix kernel, MR rows x NV vectors of
 * accumulators, sized for the register file: with 32 registers 8 x 2 (16
 * accumulators, the B vectors and the broadcast A values alongside); with
 * 16, 6 x 2 (12 + 2 + 1, the classic AVX2 tile); with 16 and no FMA (SSE),
 * where a product needs a register of its own, 4 x 2. */
#if TS_VEC_REGS >= 32
#define MR 8
#elif PACK_A
#define MR 4
#else
#define MR 6
#endif
#define NV 2
/* Tile of the blocked transpose. */
#define TR_TILE 16

/* Keys visible to query i. */
static inline int64_t visible(const ts_attention_geom *g, int64_t i) {
    return g->causal && i + 1 < g->Tk ? i + 1 : g->Tk;
}

/* Keys any query of rows [i0, i1) sees: the width of that block's scores. */
static inline int64_t block_width(const ts_attention_geom *g, int64_t i1) { return visible(g, i1 - 1); }

/* What a product's tiles may skip under the causal mask: nothing; the
 * columns past a row's visible keys (scores: row i of the tile, global row
 * i + off, needs columns < i + off + 1); the inner terms past them (P V,
 * dS K: the probabilities beyond are 0); or the inner terms before them
 * (P^T dO, dS^T Q: key row i + off sees queries from inner index i + off
 * on). Skipped terms are zeros, so the sums are unchanged. */
typedef enum { TRI_NONE, TRI_COLS, TRI_INNER_END, TRI_INNER_BEGIN } tri_mode;
typedef struct {
    tri_mode mode;
    int64_t off;
} tri;

/* mode when g is causal, else none. */
static inline tri causal(const ts_attention_geom *g, tri_mode mode, int64_t off) {
    return (tri){g->causal ? mode : TRI_NONE, off};
}

/* Scratch elements per thread: K^T, V^T, the probabilities and the score
 * gradients of a head (the backward needs all; the forward less), and a
 * packed row tile of A (PACK_A: MR rows of the longest inner dim, an
 * element a vector). */
static int64_t scratch_per_thread(const ts_attention_geom *g) {
    int64_t inner = g->Tq > g->Tk ? g->Tq : g->Tk;
    inner = inner > g->D ? inner : g->D;
    inner = inner > g->Dv ? inner : g->Dv;
    return g->Tk * (g->D + g->Dv) + 2 * g->Tq * g->Tk + (PACK_A ? MR * inner * TS_VEC_BYTES / 4 : 0);
}

#define TS_DT 32
#include "kernels/ops/cpu/attention_t.h"
#undef TS_DT
#define TS_DT 64
#include "kernels/ops/cpu/attention_t.h"
#undef TS_DT

static ts_status cpu_attention(ts_dtype dt, const ts_attention_geom *g, const void *q, const void *k, const void *v,
                               void *out, void *lse) {
    int64_t n = omp_get_max_threads() * scratch_per_thread(g); /* for every thread of the team */
    void *ws = ts_cpu_scratch("attention", n, ts_dtype_size(dt));
    if (!ws) return ts_last_status();
    if (dt == TS_F32) attention_f32(g, q, k, v, out, lse, ws);
    else attention_f64(g, q, k, v, out, lse, ws);
    ts_cpu_scratch_free(ws, n, ts_dtype_size(dt));
    return TS_OK;
}

static ts_status cpu_attention_backward(ts_dtype dt, const ts_attention_geom *g, const void *q, const void *k,
                                        const void *v, const void *out, const void *lse, const void *dout, void *dq,
                                        void *dk, void *dv) {
    int64_t n = omp_get_max_threads() * scratch_per_thread(g);
    void *ws = ts_cpu_scratch("attention", n, ts_dtype_size(dt));
    if (!ws) return ts_last_status();
    if (dt == TS_F32) attention_backward_f32(g, q, k, v, out, lse, dout, dq, dk, dv, ws);
    else attention_backward_f64(g, q, k, v, out, lse, dout, dq, dk, dv, ws);
    ts_cpu_scratch_free(ws, n, ts_dtype_size(dt));
    return TS_OK;
}

const ts_attention_kernels TS_VARIANT(ts_cpu_attention) = {cpu_attention, cpu_attention_backward, true};
