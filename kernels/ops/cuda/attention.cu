/* attention.cu - fused attention forward and backward that never write
 * the Tq x Tk score matrix (flash-attention style): scores are made tile
 * by tile in shared memory and folded into an online softmax.
 *
 * A warp owns one row (a query in the forward and in dq, a key in dk/dv);
 * a block of ROWS warps shares tiles of TILE keys (or queries) loaded
 * into shared memory. Within a tile lane t owns element t (its score),
 * and each lane holds the output dims lane, lane + 32, ... of its row, so
 * D and Dv go up to 32 * DIMS_PER_LANE. Causal (top-left aligned): query
 * i sees keys j <= i. */
#include <cuda_runtime.h>
#include <math.h>

#include "kernels/ops/cuda/elem.cuh"
#include "kernels/ops/cuda/runtime.h"

#define ROWS 8
#define TILE 32
#define DIMS_PER_LANE 8
#define MAX_DIM (32 * DIMS_PER_LANE)

template <typename T> __device__ inline T warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <typename T> __device__ inline T warp_max(T v) {
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* a . b over n elements of shared memory. */
template <typename T> __device__ inline T dot(const T *a, const T *b, int64_t n) {
    T s = 0;
    for (int64_t d = 0; d < n; d++) s += a[d] * b[d];
    return s;
}

/* Copies rows [r0, r0 + TILE) of src (rows of n, count rows in all) into
 * dst with row stride ld, zeros past the end; the whole block helps. */
template <typename T>
__device__ inline void load_tile(T *dst, int64_t ld, const T *src, int64_t r0, int64_t count, int64_t n) {
    for (int64_t e = threadIdx.x; e < TILE * n; e += blockDim.x) {
        int64_t r = e / n, d = e % n;
        dst[r * ld + d] = r0 + r < count ? src[(r0 + r) * n + d] : (T)0;
    }
}

/* ---- forward ---- */

/* Grid (query blocks, heads); warp w of block b owns query b * ROWS + w. */
template <typename T>
__global__ void attention_forward_kernel(ts_attention_geom g, const T *q, const T *k, const T *v, T *out, T *lse) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *qs = (T *)smem_raw, *ks = qs + ROWS * g.D, *vs = ks + TILE * (g.D + 1);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int64_t h = blockIdx.y, i = (int64_t)blockIdx.x * ROWS + warp;
    const T *qh = q + h * g.Tq * g.D, *kh = k + h * g.Tk * g.D, *vh = v + h * g.Tk * g.Dv;
    for (int64_t d = lane; d < g.D; d += 32) qs[warp * g.D + d] = i < g.Tq ? qh[i * g.D + d] * (T)g.scale : (T)0;
    int64_t last = (int64_t)blockIdx.x * ROWS + ROWS - 1; /* the block's last query */
    int64_t kend = g.causal ? min(g.Tk, last + 1) : g.Tk;
    T m = -INFINITY, l = 0, acc[DIMS_PER_LANE];
    for (int c = 0; c < DIMS_PER_LANE; c++) acc[c] = 0;
    for (int64_t j0 = 0; j0 < kend; j0 += TILE) {
        __syncthreads();
        load_tile(ks, g.D + 1, kh, j0, g.Tk, g.D);
        load_tile(vs, g.Dv, vh, j0, g.Tk, g.Dv);
        __syncthreads();
        if (i >= g.Tq) continue;
        int64_t j = j0 + lane;
        bool seen = j < g.Tk && (!g.causal || j <= i);
        T s = seen ? dot(qs + warp * g.D, ks + lane * (g.D + 1), g.D) : (T)-INFINITY;
        T mnew = max(m, warp_max(s));
        if (mnew == (T)-INFINITY) continue; /* every key of the tile hidden */
        T p = seen ? exp(s - mnew) : (T)0, corr = exp(m - mnew);
        l = l * corr + warp_sum(p);
        for (int c = 0; c < DIMS_PER_LANE; c++) acc[c] *= corr;
        for (int t = 0; t < TILE; t++) {
            T pt = __shfl_sync(0xffffffffu, p, t);
            for (int c = 0; c < DIMS_PER_LANE; c++) {
                int64_t d = lane + 32 * c;
                if (d < g.Dv) acc[c] += pt * vs[t * g.Dv + d];
            }
        }
        m = mnew;
    }
    if (i >= g.Tq) return;
    T *o = out + (h * g.Tq + i) * g.Dv;
    for (int c = 0; c < DIMS_PER_LANE; c++) {
        int64_t d = lane + 32 * c;
        if (d < g.Dv) o[d] = l > 0 ? acc[c] / l : (T)0;
    }
    if (lane == 0) lse[h * g.Tq + i] = l > 0 ? m + log(l) : (T)-INFINITY;
}

/* ---- backward ---- */

/* delta[r] = dout[r] . out[r] for every query row, a warp per row. */
template <typename T>
__global__ void attention_delta_kernel(const T *out, const T *dout, T *delta, int64_t rows, int64_t Dv) {
    int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (r >= rows) return;
    T s = 0;
    for (int64_t d = lane; d < Dv; d += 32) s += out[r * Dv + d] * dout[r * Dv + d];
    s = warp_sum(s);
    if (lane == 0) delta[r] = s;
}

/* dq: a warp per query, over tiles of keys: ds = p (dout . v - delta),
 * dq = scale sum over keys of ds k. */
template <typename T>
__global__ void attention_dq_kernel(ts_attention_geom g, const T *q, const T *k, const T *v, const T *lse,
                                    const T *delta, const T *dout, T *dq) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *qs = (T *)smem_raw, *gs = qs + ROWS * g.D, *ks = gs + ROWS * g.Dv, *vs = ks + TILE * (g.D + 1);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int64_t h = blockIdx.y, i = (int64_t)blockIdx.x * ROWS + warp, row = h * g.Tq + i;
    const T *kh = k + h * g.Tk * g.D, *vh = v + h * g.Tk * g.Dv;
    for (int64_t d = lane; d < g.D; d += 32) qs[warp * g.D + d] = i < g.Tq ? q[row * g.D + d] * (T)g.scale : (T)0;
    for (int64_t d = lane; d < g.Dv; d += 32) gs[warp * g.Dv + d] = i < g.Tq ? dout[row * g.Dv + d] : (T)0;
    T li = i < g.Tq ? lse[row] : (T)0, di = i < g.Tq ? delta[row] : (T)0, acc[DIMS_PER_LANE];
    for (int c = 0; c < DIMS_PER_LANE; c++) acc[c] = 0;
    int64_t last = (int64_t)blockIdx.x * ROWS + ROWS - 1;
    int64_t kend = g.causal ? min(g.Tk, last + 1) : g.Tk;
    for (int64_t j0 = 0; j0 < kend; j0 += TILE) {
        __syncthreads();
        load_tile(ks, g.D + 1, kh, j0, g.Tk, g.D);
        load_tile(vs, g.Dv + 1, vh, j0, g.Tk, g.Dv);
        __syncthreads();
        if (i >= g.Tq) continue;
        int64_t j = j0 + lane;
        T ds = 0;
        if (j < g.Tk && (!g.causal || j <= i) && li != (T)-INFINITY) {
            T p = exp(dot(qs + warp * g.D, ks + lane * (g.D + 1), g.D) - li);
            ds = p * (dot(gs + warp * g.Dv, vs + lane * (g.Dv + 1), g.Dv) - di);
        }
        for (int t = 0; t < TILE; t++) {
            T dt = __shfl_sync(0xffffffffu, ds, t);
            for (int c = 0; c < DIMS_PER_LANE; c++) {
                int64_t d = lane + 32 * c;
                if (d < g.D) acc[c] += dt * ks[t * (g.D + 1) + d];
            }
        }
    }
    if (i >= g.Tq) return;
    for (int c = 0; c < DIMS_PER_LANE; c++) {
        int64_t d = lane + 32 * c;
        if (d < g.D) dq[row * g.D + d] = acc[c] * (T)g.scale;
    }
}

/* dk, dv: a warp per key, over tiles of queries: dv = sum over queries
 * of p dout, dk = scale sum of ds q. */
template <typename T>
__global__ void attention_dkdv_kernel(ts_attention_geom g, const T *q, const T *k, const T *v, const T *lse,
                                      const T *delta, const T *dout, T *dk, T *dv) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *kk = (T *)smem_raw, *vv = kk + ROWS * g.D, *qs = vv + ROWS * g.Dv, *gs = qs + TILE * (g.D + 1);
    T *ls = gs + TILE * (g.Dv + 1), *dl = ls + TILE;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int64_t h = blockIdx.y, j = (int64_t)blockIdx.x * ROWS + warp, krow = h * g.Tk + j;
    const T *qh = q + h * g.Tq * g.D, *gh = dout + h * g.Tq * g.Dv;
    for (int64_t d = lane; d < g.D; d += 32) kk[warp * g.D + d] = j < g.Tk ? k[krow * g.D + d] : (T)0;
    for (int64_t d = lane; d < g.Dv; d += 32) vv[warp * g.Dv + d] = j < g.Tk ? v[krow * g.Dv + d] : (T)0;
    T ak[DIMS_PER_LANE], av[DIMS_PER_LANE];
    for (int c = 0; c < DIMS_PER_LANE; c++) ak[c] = av[c] = 0;
    int64_t first = (int64_t)blockIdx.x * ROWS; /* the block's first key */
    int64_t qbeg = g.causal ? first / TILE * TILE : 0;
    for (int64_t i0 = qbeg; i0 < g.Tq; i0 += TILE) {
        __syncthreads();
        load_tile(qs, g.D + 1, qh, i0, g.Tq, g.D);
        load_tile(gs, g.Dv + 1, gh, i0, g.Tq, g.Dv);
        if (threadIdx.x < TILE) {
            int64_t i = i0 + threadIdx.x;
            ls[threadIdx.x] = i < g.Tq ? lse[h * g.Tq + i] : (T)-INFINITY;
            dl[threadIdx.x] = i < g.Tq ? delta[h * g.Tq + i] : (T)0;
        }
        __syncthreads();
        if (j >= g.Tk) continue;
        int64_t i = i0 + lane;
        T p = 0, ds = 0;
        if (i < g.Tq && (!g.causal || j <= i) && ls[lane] != (T)-INFINITY) {
            p = exp(dot(qs + lane * (g.D + 1), kk + warp * g.D, g.D) * (T)g.scale - ls[lane]);
            ds = p * (dot(gs + lane * (g.Dv + 1), vv + warp * g.Dv, g.Dv) - dl[lane]);
        }
        for (int t = 0; t < TILE; t++) {
            T pt = __shfl_sync(0xffffffffu, p, t), st = __shfl_sync(0xffffffffu, ds, t);
            for (int c = 0; c < DIMS_PER_LANE; c++) {
                int64_t d = lane + 32 * c;
                if (d < g.Dv) av[c] += pt * gs[t * (g.Dv + 1) + d];
                if (d < g.D) ak[c] += st * qs[t * (g.D + 1) + d];
            }
        }
    }
    if (j >= g.Tk) return;
    for (int c = 0; c < DIMS_PER_LANE; c++) {
        int64_t d = lane + 32 * c;
        if (dv && d < g.Dv) dv[krow * g.Dv + d] = av[c];
        if (dk && d < g.D) dk[krow * g.D + d] = ak[c] * (T)g.scale;
    }
}

/* ---- launches ---- */

/* Launches kernel over grid with smem bytes of dynamic shared memory
 * (raising the kernel's limit past the default 48 KiB when needed). */
template <typename K, typename... A>
static ts_status launch(const char *op, K kernel, dim3 grid, size_t smem, A... args) {
    if (smem > 48 * 1024 &&
        ts_cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), op))
        return ts_last_status();
    kernel<<<grid, ROWS * 32, smem>>>(args...);
    return ts_cuda_launched(op);
}

static ts_status check_geom(const char *op, const ts_attention_geom *g) {
    if (g->D > MAX_DIM || g->Dv > MAX_DIM)
        return ts_error(TS_ERR_UNSUPPORTED, "%s: head sizes D = %lld, Dv = %lld on cuda (at most %d)", op,
                        (long long)g->D, (long long)g->Dv, MAX_DIM);
    if (g->BH > 65535)
        return ts_error(TS_ERR_UNSUPPORTED, "%s: %lld heads on cuda (at most 65535)", op, (long long)g->BH);
    return TS_OK;
}

template <typename T>
static ts_status forward_typed(const ts_attention_geom *g, const void *q, const void *k, const void *v, void *out,
                               void *lse) {
    dim3 grid((unsigned)((g->Tq + ROWS - 1) / ROWS), (unsigned)g->BH);
    size_t smem = sizeof(T) * (size_t)(ROWS * g->D + TILE * (g->D + 1) + TILE * g->Dv);
    return launch("attention", attention_forward_kernel<T>, grid, smem, *g, (const T *)q, (const T *)k, (const T *)v,
                  (T *)out, (T *)lse);
}

static ts_status cuda_attention_forward(ts_dtype dt, const ts_attention_geom *g, const void *q, const void *k,
                                        const void *v, void *out, void *lse) {
    if (check_geom("attention", g)) return ts_last_status();
    if (g->BH == 0 || g->Tq == 0) return TS_OK;
    return dt == TS_F32 ? forward_typed<float>(g, q, k, v, out, lse) : forward_typed<double>(g, q, k, v, out, lse);
}

template <typename T>
static ts_status backward_typed(const ts_attention_geom *g, const void *q, const void *k, const void *v,
                                const void *out, const void *lse, const void *dout, void *dq, void *dk, void *dv) {
    int dev = 0;
    if (ts_cuda_status(cudaGetDevice(&dev), "attention backward")) return ts_last_status();
    int64_t rows = g->BH * g->Tq;
    size_t dbytes = sizeof(T) * (size_t)(rows ? rows : 1);
    T *delta = (T *)ts_cuda_alloc(dev, dbytes);
    if (!delta) return ts_last_status();
    if (rows > 0)
        attention_delta_kernel<T>
            <<<(unsigned)((rows * 32 + 255) / 256), 256>>>((const T *)out, (const T *)dout, delta, rows, g->Dv);
    ts_status st = ts_cuda_launched("attention backward");
    if (!st && dq && g->Tq > 0) {
        dim3 grid((unsigned)((g->Tq + ROWS - 1) / ROWS), (unsigned)g->BH);
        size_t smem = sizeof(T) * (size_t)(ROWS * (g->D + g->Dv) + TILE * (g->D + 1) + TILE * (g->Dv + 1));
        st = launch("attention backward", attention_dq_kernel<T>, grid, smem, *g, (const T *)q, (const T *)k,
                    (const T *)v, (const T *)lse, (const T *)delta, (const T *)dout, (T *)dq);
    }
    if (!st && (dk || dv) && g->Tk > 0) {
        dim3 grid((unsigned)((g->Tk + ROWS - 1) / ROWS), (unsigned)g->BH);
        size_t smem = sizeof(T) * (size_t)(ROWS * (g->D + g->Dv) + TILE * (g->D + 1) + TILE * (g->Dv + 1) + 2 * TILE);
        st = launch("attention backward", attention_dkdv_kernel<T>, grid, smem, *g, (const T *)q, (const T *)k,
                    (const T *)v, (const T *)lse, (const T *)delta, (const T *)dout, (T *)dk, (T *)dv);
    }
    ts_cuda_free(dev, delta, dbytes); /* stream-ordered: later kernels cannot see it reused early */
    return st;
}

static ts_status cuda_attention_backward(ts_dtype dt, const ts_attention_geom *g, const void *q, const void *k,
                                         const void *v, const void *out, const void *lse, const void *dout, void *dq,
                                         void *dk, void *dv) {
    if (check_geom("attention backward", g)) return ts_last_status();
    if (g->BH == 0) return TS_OK;
    return dt == TS_F32 ? backward_typed<float>(g, q, k, v, out, lse, dout, dq, dk, dv)
                        : backward_typed<double>(g, q, k, v, out, lse, dout, dq, dk, dv);
}

/* dense heads only (strided: false): ops lay q, k, v and out out densely for these kernels */
extern "C" const ts_attention_kernels ts_cuda_attention = {cuda_attention_forward, cuda_attention_backward, false};
