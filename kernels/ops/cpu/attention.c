/* attention.c - CPU kernels of fused scaled dot-product attention.
 *
 * Per head (of B*H): S = scale Q K^T [Tq, Tk], P = softmax(S) with the
 * causal mask, O = P V; the forward keeps lse = log sum exp S per row. The
 * backward recomputes P = exp(S - lse), then with dP = dO V^T and
 * Dr = sum(dO * O) per row: dS = P (dP - Dr) scale, dV = P^T dO,
 * dQ = dS K, dK = dS^T Q.
 *
 * Threads take whole heads (OpenMP over B*H); inside a head everything is
 * serial and cache-sized: query rows go in blocks of ROW_BLOCK, the
 * products are a register-tiled matrix kernel of our own rather than
 * OpenBLAS, since OpenBLAS may not be called inside an OpenMP region and
 * calling it per head from outside (with its threads) left both thread
 * pools spinning against each other. With the causal mask, blocks skip the
 * keys no query of the block sees (about half the work). The kernels are
 * in attention_t.h, once per dtype.
 */
#include <math.h>
#include <string.h>

#include "kernels/ops/cpu/cpu.h"

/* Query rows per block: the scores of one block are computed, normalised
 * and multiplied by V while they are in cache. */
#define ROW_BLOCK 64
/* The register tile of the matrix kernel, MR rows x NV vectors of
 * accumulators, sized for the register file: with 32 registers 8 x 2 (16
 * accumulators, the B vectors and the broadcast A values alongside); with
 * 16, 6 x 2 (12 + 2 + 1, the classic AVX2 tile). */
#if TS_VEC_REGS >= 32
#define MR 8
#define NV 2
#else
#define MR 6
#define NV 2
#endif
/* Tile of the blocked transpose. */
#define TR_TILE 16

/* Keys visible to query i. */
static inline int64_t visible(const ts_attention_geom *g, int64_t i) {
    return g->causal && i + 1 < g->Tk ? i + 1 : g->Tk;
}

/* Keys any query of rows [i0, i1) sees: the width of that block's scores. */
static inline int64_t block_width(const ts_attention_geom *g, int64_t i1) { return visible(g, i1 - 1); }

/* Scratch elements per thread: K^T, V^T, the probabilities and the score
 * gradients of a head (the backward needs all; the forward less). */
static int64_t scratch_per_thread(const ts_attention_geom *g) {
    return g->Tk * (g->D + g->Dv) + 2 * g->Tq * g->Tk;
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

const ts_attention_kernels TS_VARIANT(ts_cpu_attention) = {cpu_attention, cpu_attention_backward};
