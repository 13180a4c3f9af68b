/* rows.cu - row kernels: softmax, layernorm, cross-entropy, mse,
 * embedding and dropout. A row (softmax, layernorm, a sample's logits) is
 * one block of 256 threads with block-wide sums; sums over rows
 * (layernorm's dw and db, a loss's total) are added atomically into
 * zeroed outputs, so their order (not their value) varies run to run. */
#include <cuda_runtime.h>
#include <math.h>

#include "kernels/ops/cuda/elem.cuh"
#include "kernels/ops/cuda/runtime.h"

#define ROW_THREADS 256

/* A one-element double on the current device, zeroed, for a total
 * summed by a kernel; NULL with an error naming op. */
static double *device_total(const char *op, int *dev) {
    if (ts_cuda_status(cudaGetDevice(dev), op)) return NULL;
    double *t = (double *)ts_cuda_alloc(*dev, sizeof(double));
    if (t && ts_cuda_status(cudaMemsetAsync(t, 0, sizeof(double), 0), op)) {
        ts_cuda_free(*dev, t, sizeof(double));
        t = NULL;
    }
    return t;
}

/* *out = the device total once the kernels before are done; frees it. */
static ts_status take_total(const char *op, int dev, double *t, double *out) {
    ts_status st = ts_cuda_launched(op);
    if (!st) st = ts_cuda_status(cudaMemcpy(out, t, sizeof(double), cudaMemcpyDeviceToHost), op);
    ts_cuda_free(dev, t, sizeof(double));
    return st;
}

/* ---- softmax ---- */

/* The max *m of a row of n (the whole block reads it) and the sum *s of
 * exp(x - max); every thread gets both. */
template <typename T> __device__ inline void row_max_sumexp(const T *xr, int64_t n, T *m, T *s) {
    T mx = -INFINITY, sum = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mx = max(mx, xr[j]);
    mx = block_max(mx);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += exp(xr[j] - mx);
    *m = mx;
    *s = block_sum(sum);
}

/* One row per block: y = softmax (or log_softmax) of x. */
template <typename T> __global__ void softmax_kernel(const T *x, T *y, int64_t n, bool lg) {
    const T *xr = x + (int64_t)blockIdx.x * n;
    T *yr = y + (int64_t)blockIdx.x * n;
    T m, s;
    row_max_sumexp(xr, n, &m, &s);
    T l = m + log(s), inv = (T)1 / s;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) yr[j] = lg ? xr[j] - l : exp(xr[j] - m) * inv;
}

/* gx from g and the saved output y, one row per block. */
template <typename T> __global__ void softmax_backward_kernel(const T *y, const T *g, T *gx, int64_t n, bool lg) {
    int64_t off = (int64_t)blockIdx.x * n;
    const T *yr = y + off, *gr = g + off;
    T *dr = gx + off, acc = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) acc += lg ? gr[j] : gr[j] * yr[j];
    acc = block_sum(acc);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) dr[j] = lg ? gr[j] - exp(yr[j]) * acc : yr[j] * (gr[j] - acc);
}

static ts_status cuda_softmax(ts_dtype dt, const void *x, void *y, int64_t R, int64_t n, bool lg) {
    if (R == 0 || n == 0) return TS_OK;
    if (dt == TS_F32)
        softmax_kernel<float><<<(unsigned)R, ROW_THREADS>>>((const float *)x, (float *)y, n, lg);
    else
        softmax_kernel<double><<<(unsigned)R, ROW_THREADS>>>((const double *)x, (double *)y, n, lg);
    return ts_cuda_launched("softmax");
}

static ts_status cuda_softmax_backward(ts_dtype dt, const void *y, const void *g, void *gx, int64_t R, int64_t n,
                                       bool lg) {
    if (R == 0 || n == 0) return TS_OK;
    if (dt == TS_F32)
        softmax_backward_kernel<float>
            <<<(unsigned)R, ROW_THREADS>>>((const float *)y, (const float *)g, (float *)gx, n, lg);
    else
        softmax_backward_kernel<double>
            <<<(unsigned)R, ROW_THREADS>>>((const double *)y, (const double *)g, (double *)gx, n, lg);
    return ts_cuda_launched("softmax backward");
}

/* ---- layernorm ---- */

/* One row per block: mean, rstd (two passes over the row) and y. */
template <typename T>
__global__ void layernorm_kernel(const T *x, const T *w, const T *b, T *y, T *mean, T *rstd, int64_t D, T eps) {
    const T *xr = x + (int64_t)blockIdx.x * D;
    T *yr = y + (int64_t)blockIdx.x * D;
    T s = 0;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) s += xr[j];
    T mu = block_sum(s) / (T)D, v = 0;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) v += (xr[j] - mu) * (xr[j] - mu);
    T rs = (T)1 / sqrt(block_sum(v) / (T)D + eps);
    if (threadIdx.x == 0) mean[blockIdx.x] = mu, rstd[blockIdx.x] = rs;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
        yr[j] = (xr[j] - mu) * rs * (w ? w[j] : (T)1) + (b ? b[j] : (T)0);
}

/* dx of one row per block. */
template <typename T>
__global__ void layernorm_dx_kernel(const T *x, const T *w, const T *mean, const T *rstd, const T *g, T *dx,
                                    int64_t D) {
    int64_t off = (int64_t)blockIdx.x * D;
    const T *xr = x + off, *gr = g + off;
    T mu = mean[blockIdx.x], rs = rstd[blockIdx.x], a = 0, c = 0;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
        T gw = gr[j] * (w ? w[j] : (T)1);
        a += gw;
        c += gw * (xr[j] - mu) * rs;
    }
    a = block_sum(a) / (T)D;
    c = block_sum(c) / (T)D;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
        dx[off + j] = rs * (gr[j] * (w ? w[j] : (T)1) - a - (xr[j] - mu) * rs * c);
}

/* dw += sum over a chunk of rows of g xhat, db += sum of g: 32 columns by
 * 8 row lanes per block, blockIdx.y picks the chunk of rows. */
template <typename T>
__global__ void layernorm_dwdb_kernel(const T *x, const T *mean, const T *rstd, const T *g, T *dw, T *db, int64_t R,
                                      int64_t D, int64_t rows_per_chunk) {
    __shared__ T sw[8][33], sb[8][33];
    int64_t j = (int64_t)blockIdx.x * 32 + threadIdx.x;
    int64_t r0 = (int64_t)blockIdx.y * rows_per_chunk, r1 = min(R, r0 + rows_per_chunk);
    T aw = 0, ab = 0;
    if (j < D)
        for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
            T gv = g[r * D + j];
            aw += gv * (x[r * D + j] - mean[r]) * rstd[r];
            ab += gv;
        }
    sw[threadIdx.y][threadIdx.x] = aw;
    sb[threadIdx.y][threadIdx.x] = ab;
    __syncthreads();
    if (threadIdx.y == 0 && j < D) {
        for (int k = 1; k < 8; k++) aw += sw[k][threadIdx.x], ab += sb[k][threadIdx.x];
        if (dw) atomicAdd(dw + j, aw);
        if (db) atomicAdd(db + j, ab);
    }
}

static ts_status cuda_layernorm(ts_dtype dt, const void *x, const void *w, const void *b, void *y, void *mean,
                                void *rstd, int64_t R, int64_t D, double eps) {
    if (R == 0 || D == 0) return TS_OK;
    if (dt == TS_F32)
        layernorm_kernel<float><<<(unsigned)R, ROW_THREADS>>>((const float *)x, (const float *)w, (const float *)b,
                                                              (float *)y, (float *)mean, (float *)rstd, D, (float)eps);
    else
        layernorm_kernel<double><<<(unsigned)R, ROW_THREADS>>>((const double *)x, (const double *)w, (const double *)b,
                                                               (double *)y, (double *)mean, (double *)rstd, D, eps);
    return ts_cuda_launched("layernorm");
}

template <typename T>
static ts_status layernorm_backward_typed(const T *x, const T *w, const T *mean, const T *rstd, const T *g, T *dx,
                                          T *dw, T *db, int64_t R, int64_t D) {
    if (dx) layernorm_dx_kernel<T><<<(unsigned)R, ROW_THREADS>>>(x, w, mean, rstd, g, dx, D);
    if (!dw && !db) return ts_cuda_launched("layernorm backward");
    if (dw && ts_cuda_status(cudaMemsetAsync(dw, 0, sizeof(T) * (size_t)D, 0), "layernorm backward"))
        return ts_last_status();
    if (db && ts_cuda_status(cudaMemsetAsync(db, 0, sizeof(T) * (size_t)D, 0), "layernorm backward"))
        return ts_last_status();
    int64_t chunks = (R + 255) / 256 < 64 ? (R + 255) / 256 : 64, per = (R + chunks - 1) / chunks;
    dim3 grid((unsigned)((D + 31) / 32), (unsigned)chunks), block(32, 8);
    layernorm_dwdb_kernel<T><<<grid, block>>>(x, mean, rstd, g, dw, db, R, D, per);
    return ts_cuda_launched("layernorm backward");
}

static ts_status cuda_layernorm_backward(ts_dtype dt, const void *x, const void *w, const void *mean, const void *rstd,
                                         const void *g, void *dx, void *dw, void *db, int64_t R, int64_t D) {
    if (D == 0) return TS_OK;
    if (R == 0) { /* dw and db are sums over no rows */
        size_t es = ts_dtype_size(dt);
        if (dw && ts_cuda_status(cudaMemsetAsync(dw, 0, es * (size_t)D, 0), "layernorm backward")) return TS_ERR_DEVICE;
        if (db && ts_cuda_status(cudaMemsetAsync(db, 0, es * (size_t)D, 0), "layernorm backward")) return TS_ERR_DEVICE;
        return TS_OK;
    }
    if (dt == TS_F32)
        return layernorm_backward_typed<float>((const float *)x, (const float *)w, (const float *)mean,
                                               (const float *)rstd, (const float *)g, (float *)dx, (float *)dw,
                                               (float *)db, R, D);
    return layernorm_backward_typed<double>((const double *)x, (const double *)w, (const double *)mean,
                                            (const double *)rstd, (const double *)g, (double *)dx, (double *)dw,
                                            (double *)db, R, D);
}

/* ---- losses ---- */

/* One row of logits per block: its log-sum-exp, and its loss added into
 * total unless its target is ign. */
template <typename T>
__global__ void cross_entropy_kernel(const T *x, const int64_t *t, T *lse, int64_t C, int64_t ign, double *total) {
    const T *xr = x + (int64_t)blockIdx.x * C;
    T m, s;
    row_max_sumexp(xr, C, &m, &s);
    if (threadIdx.x == 0) {
        T l = m + log(s);
        lse[blockIdx.x] = l;
        int64_t tr = t[blockIdx.x];
        if (tr != ign) atomicAdd(total, (double)(l - xr[tr]));
    }
}

/* gx = (softmax - onehot) scale, zero rows for ignored targets. */
template <typename T>
__global__ void cross_entropy_backward_kernel(const T *x, const int64_t *t, const T *lse, T *gx, int64_t C, int64_t ign,
                                              T scale) {
    int64_t off = (int64_t)blockIdx.x * C, tr = t[blockIdx.x];
    T l = lse[blockIdx.x];
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
        gx[off + j] = tr == ign ? (T)0 : (exp(x[off + j] - l) - (j == tr ? (T)1 : (T)0)) * scale;
}

static ts_status cuda_cross_entropy(ts_dtype dt, const void *x, const int64_t *t, void *lse, int64_t N, int64_t C,
                                    int64_t ign, double *total) {
    *total = 0;
    if (N == 0) return TS_OK;
    int dev;
    double *tot = device_total("cross_entropy", &dev);
    if (!tot) return ts_last_status();
    if (dt == TS_F32)
        cross_entropy_kernel<float><<<(unsigned)N, ROW_THREADS>>>((const float *)x, t, (float *)lse, C, ign, tot);
    else
        cross_entropy_kernel<double><<<(unsigned)N, ROW_THREADS>>>((const double *)x, t, (double *)lse, C, ign, tot);
    return take_total("cross_entropy", dev, tot, total);
}

static ts_status cuda_cross_entropy_backward(ts_dtype dt, const void *x, const int64_t *t, const void *lse, void *gx,
                                             int64_t N, int64_t C, int64_t ign, double scale) {
    if (N == 0 || C == 0) return TS_OK;
    if (dt == TS_F32)
        cross_entropy_backward_kernel<float>
            <<<(unsigned)N, ROW_THREADS>>>((const float *)x, t, (const float *)lse, (float *)gx, C, ign, (float)scale);
    else
        cross_entropy_backward_kernel<double>
            <<<(unsigned)N, ROW_THREADS>>>((const double *)x, t, (const double *)lse, (double *)gx, C, ign, scale);
    return ts_cuda_launched("cross_entropy backward");
}

/* total += sum of (a - b)^2, a block-wide sum per block. */
template <typename T> __global__ void mse_kernel(const T *a, const T *b, int64_t n, double *total) {
    double s = 0;
    FOR_EACH(i, n) s += (double)(a[i] - b[i]) * (double)(a[i] - b[i]);
    s = block_sum(s);
    if (threadIdx.x == 0) atomicAdd(total, s);
}

template <typename T> __global__ void mse_backward_kernel(const T *a, const T *b, T *ga, T *gb, int64_t n, T scale) {
    FOR_EACH(i, n) {
        T d = 2 * (a[i] - b[i]) * scale;
        if (ga) ga[i] = d;
        if (gb) gb[i] = -d;
    }
}

static ts_status cuda_mse(ts_dtype dt, const void *a, const void *b, int64_t n, double *total) {
    *total = 0;
    if (n == 0) return TS_OK;
    int dev;
    double *tot = device_total("mse", &dev);
    if (!tot) return ts_last_status();
    unsigned blocks = ts_cuda_blocks(n) < 1024 ? ts_cuda_blocks(n) : 1024;
    if (dt == TS_F32)
        mse_kernel<float><<<blocks, 256>>>((const float *)a, (const float *)b, n, tot);
    else
        mse_kernel<double><<<blocks, 256>>>((const double *)a, (const double *)b, n, tot);
    return take_total("mse", dev, tot, total);
}

static ts_status cuda_mse_backward(ts_dtype dt, const void *a, const void *b, void *ga, void *gb, int64_t n,
                                   double scale) {
    if (n == 0) return TS_OK;
    if (dt == TS_F32)
        mse_backward_kernel<float>
            <<<ts_cuda_blocks(n), 256>>>((const float *)a, (const float *)b, (float *)ga, (float *)gb, n, (float)scale);
    else
        mse_backward_kernel<double>
            <<<ts_cuda_blocks(n), 256>>>((const double *)a, (const double *)b, (double *)ga, (double *)gb, n, scale);
    return ts_cuda_launched("mse backward");
}

/* ---- embedding ---- */

template <typename T>
__global__ void embedding_kernel(const T *table, const int64_t *idx, T *out, int64_t n, int64_t D) {
    FOR_EACH(k, n * D) out[k] = table[idx[k / D] * D + k % D];
}

/* gt[idx[i]] += g[i], atomically (indices repeat). */
template <typename T>
__global__ void embedding_backward_kernel(const int64_t *idx, const T *g, T *gt, int64_t n, int64_t D) {
    FOR_EACH(k, n * D) atomicAdd(gt + idx[k / D] * D + k % D, g[k]);
}

static ts_status cuda_embedding(ts_dtype dt, const void *table, const int64_t *idx, void *out, int64_t n, int64_t D) {
    if (n * D == 0) return TS_OK;
    if (dt == TS_F32)
        embedding_kernel<float><<<ts_cuda_blocks(n * D), 256>>>((const float *)table, idx, (float *)out, n, D);
    else
        embedding_kernel<double><<<ts_cuda_blocks(n * D), 256>>>((const double *)table, idx, (double *)out, n, D);
    return ts_cuda_launched("embedding");
}

static ts_status cuda_embedding_backward(ts_dtype dt, const int64_t *idx, const void *g, void *gtable, int64_t n,
                                         int64_t V, int64_t D) {
    if (ts_cuda_status(cudaMemsetAsync(gtable, 0, ts_dtype_size(dt) * (size_t)(V * D), 0), "embedding backward"))
        return ts_last_status();
    if (n * D == 0) return TS_OK;
    if (dt == TS_F32)
        embedding_backward_kernel<float><<<ts_cuda_blocks(n * D), 256>>>(idx, (const float *)g, (float *)gtable, n, D);
    else
        embedding_backward_kernel<double>
            <<<ts_cuda_blocks(n * D), 256>>>(idx, (const double *)g, (double *)gtable, n, D);
    return ts_cuda_launched("embedding backward");
}

/* ---- dropout ---- */

/* One Philox 4x32-10 block, as rng.c computes it. */
__device__ inline void philox(uint32_t k0, uint32_t k1, uint64_t b, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)b, c1 = (uint32_t)(b >> 32), c2 = 0, c3 = 0;
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0, c1 = (uint32_t)p1, c2 = n2, c3 = (uint32_t)p0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* y = x keep(key, i) scale: the same uniform stream as ts_rng_uniform_f32. */
template <typename T> __global__ void dropout_kernel(ts_key key, const T *x, T *y, int64_t n, float p, T scale) {
    FOR_EACH(i, n) {
        uint32_t w[4];
        philox(key.k[0], key.k[1], (uint64_t)i / 4, w);
        float u = (float)(w[i % 4] >> 8) * (1.0f / 16777216.0f);
        y[i] = u >= p ? x[i] * scale : (T)0;
    }
}

static ts_status cuda_dropout(ts_dtype dt, ts_key key, const void *x, void *y, int64_t n, double p) {
    if (n == 0) return TS_OK;
    double scale = p < 1 ? 1 / (1 - p) : 0;
    if (dt == TS_F32)
        dropout_kernel<float><<<ts_cuda_blocks(n), 256>>>(key, (const float *)x, (float *)y, n, (float)p, (float)scale);
    else
        dropout_kernel<double><<<ts_cuda_blocks(n), 256>>>(key, (const double *)x, (double *)y, n, (float)p, scale);
    return ts_cuda_launched("dropout");
}

extern "C" const ts_softmax_kernels ts_cuda_softmax = {cuda_softmax, cuda_softmax_backward};
extern "C" const ts_layernorm_kernels ts_cuda_layernorm = {cuda_layernorm, cuda_layernorm_backward};
extern "C" const ts_loss_kernels ts_cuda_loss = {cuda_cross_entropy, cuda_cross_entropy_backward, cuda_mse,
                                                 cuda_mse_backward};
extern "C" const ts_embedding_kernels ts_cuda_embedding = {cuda_embedding, cuda_embedding_backward};
extern "C" const ts_dropout_kernels ts_cuda_dropout = {cuda_dropout};
