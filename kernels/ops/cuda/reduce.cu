/* reduce.cu - sum and max over the middle dim of [outer, red, inner], and
 * max's backward. A reduction along contiguous memory (inner == 1) takes a
 * block per output; otherwise a thread per output walks red (neighbouring
 * threads read neighbouring elements). Sums accumulate in double. */
#include <math.h>

#include "kernels/ops/cuda/elem.cuh"

template <typename T>
__global__ void sum_rows_kernel(const T *x, T *out, int64_t red, double scale) {
    const T *row = x + (int64_t)blockIdx.x * red;
    double s = 0;
    for (int64_t r = threadIdx.x; r < red; r += blockDim.x) s += (double)row[r];
    s = block_sum(s);
    if (threadIdx.x == 0) out[blockIdx.x] = (T)(s * scale);
}

template <typename T>
__global__ void sum_strided_kernel(const T *x, T *out, int64_t outer, int64_t red, int64_t inner, double scale) {
    FOR_EACH(k, outer * inner) {
        int64_t o = k / inner, i = k % inner;
        const T *p = x + o * red * inner + i;
        double s = 0;
        for (int64_t r = 0; r < red; r++) s += (double)p[r * inner];
        out[k] = (T)(s * scale);
    }
}

template <typename T>
static ts_status sum_typed(const void *x, void *out, int64_t outer, int64_t red, int64_t inner, double scale) {
    int64_t n = outer * inner;
    if (n == 0) return TS_OK;
    if (inner == 1 && n <= 2147483647)
        sum_rows_kernel<T><<<(unsigned)n, 256>>>((const T *)x, (T *)out, red, scale);
    else
        sum_strided_kernel<T><<<ts_cuda_blocks(n), 256>>>((const T *)x, (T *)out, outer, red, inner, scale);
    return ts_cuda_launched("sum");
}

static ts_status cuda_sum(ts_dtype dt, const void *x, void *out, int64_t outer, int64_t red, int64_t inner,
                          double scale) {
    return dt == TS_F32 ? sum_typed<float>(x, out, outer, red, inner, scale)
                        : sum_typed<double>(x, out, outer, red, inner, scale);
}

/* The first r reaching the max (a NaN wins), one thread per output. */
template <typename T>
__global__ void max_kernel(const T *x, T *out, int64_t *idx, int64_t outer, int64_t red, int64_t inner) {
    FOR_EACH(k, outer * inner) {
        int64_t o = k / inner, i = k % inner;
        const T *p = x + o * red * inner + i;
        T best = p[0];
        int64_t at = 0;
        for (int64_t r = 1; r < red && !isnan(best); r++) {
            T v = p[r * inner];
            if (v > best || isnan(v)) best = v, at = r;
        }
        out[k] = best;
        if (idx) idx[k] = at;
    }
}

static ts_status cuda_max(ts_dtype dt, const void *x, void *out, int64_t *idx, int64_t outer, int64_t red,
                          int64_t inner) {
    int64_t n = outer * inner;
    if (n == 0) return TS_OK;
    if (dt == TS_F32)
        max_kernel<float><<<ts_cuda_blocks(n), 256>>>((const float *)x, (float *)out, idx, outer, red, inner);
    else
        max_kernel<double><<<ts_cuda_blocks(n), 256>>>((const double *)x, (double *)out, idx, outer, red, inner);
    return ts_cuda_launched("max");
}

/* gx[o, r, i] = r == idx[o, i] ? g[o, i] : 0, one thread per element of gx. */
template <typename T>
__global__ void max_backward_kernel(const T *g, const int64_t *idx, T *gx, int64_t outer, int64_t red, int64_t inner) {
    FOR_EACH(k, outer * red * inner) {
        int64_t i = k % inner, r = k / inner % red, o = k / (inner * red);
        gx[k] = idx[o * inner + i] == r ? g[o * inner + i] : (T)0;
    }
}

static ts_status cuda_max_backward(ts_dtype dt, const void *g, const int64_t *idx, void *gx, int64_t outer,
                                   int64_t red, int64_t inner) {
    int64_t n = outer * red * inner;
    if (n == 0) return TS_OK;
    if (dt == TS_F32)
        max_backward_kernel<float><<<ts_cuda_blocks(n), 256>>>((const float *)g, idx, (float *)gx, outer, red, inner);
    else
        max_backward_kernel<double><<<ts_cuda_blocks(n), 256>>>((const double *)g, idx, (double *)gx, outer, red,
                                                                 inner);
    return ts_cuda_launched("max backward");
}

extern "C" const ts_reduce_kernels ts_cuda_reduce = {cuda_sum, cuda_max, cuda_max_backward};
