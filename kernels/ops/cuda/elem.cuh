/* elem.cuh - device helpers of the CUDA kernels: an element of any dtype
 * read as double and written back (converting, bf16 rounded to nearest
 * even as on the CPU), a strided walk over up to TS_MAX_DIMS dims, and
 * block-wide sums. */
#ifndef TS_OPS_CUDA_ELEM_CUH
#define TS_OPS_CUDA_ELEM_CUH

#include <cuda_bf16.h>
#include <stdint.h>

#include "kernels/ops/cuda/cuda.h"

/* Element i of an array of dtype dt at base, as double. */
__device__ inline double elem_get(const void *base, ts_dtype dt, int64_t i) {
    switch (dt) {
    case TS_F32: return ((const float *)base)[i];
    case TS_F64: return ((const double *)base)[i];
    case TS_BF16: return __bfloat162float(((const __nv_bfloat16 *)base)[i]);
    case TS_I32: return ((const int32_t *)base)[i];
    case TS_I64: return (double)((const int64_t *)base)[i];
    case TS_U8: return ((const uint8_t *)base)[i];
    default: return 0;
    }
}

/* Element i of base = v, converted to dt. */
__device__ inline void elem_set(void *base, ts_dtype dt, int64_t i, double v) {
    switch (dt) {
    case TS_F32: ((float *)base)[i] = (float)v; break;
    case TS_F64: ((double *)base)[i] = v; break;
    case TS_BF16: ((__nv_bfloat16 *)base)[i] = __float2bfloat16_rn((float)v); break;
    case TS_I32: ((int32_t *)base)[i] = (int32_t)v; break;
    case TS_I64: ((int64_t *)base)[i] = (int64_t)v; break;
    case TS_U8: ((uint8_t *)base)[i] = (uint8_t)v; break;
    default: break;
    }
}

/* A shape and one operand's strides, passed to kernels by value. */
struct walk {
    int ndim;
    int64_t shape[TS_MAX_DIMS], strides[TS_MAX_DIMS];
};

/* A walk over shape with strides (NULL: contiguous). */
static inline walk make_walk(int ndim, const int64_t *shape, const int64_t *strides) {
    walk w;
    w.ndim = ndim;
    int64_t st = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        w.shape[d] = shape[d];
        w.strides[d] = strides ? strides[d] : st;
        st *= shape[d];
    }
    return w;
}

/* The element offset of row-major index i under w. */
__device__ inline int64_t walk_offset(const walk &w, int64_t i) {
    int64_t off = 0;
    for (int d = w.ndim - 1; d >= 0; d--) {
        int64_t s = w.shape[d];
        off += (i % s) * w.strides[d];
        i /= s;
    }
    return off;
}

/* Grid-stride loop over [0, n). */
#define FOR_EACH(i, n) for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
                            i += (int64_t)gridDim.x * blockDim.x)

/* Sum of v over the block (every thread gets it); blockDim.x a multiple
 * of 32, at most 1024. */
template <typename A> __device__ inline A block_sum(A v) {
    __shared__ A part[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) part[wid] = v;
    __syncthreads();
    A s = lane < nw ? part[lane] : (A)0;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    return s;
}

/* Max of v over the block (every thread gets it). */
template <typename A> __device__ inline A block_max(A v) {
    __shared__ A part[32];
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) part[wid] = v;
    __syncthreads();
    A s = lane < nw ? part[lane] : part[0];
    for (int o = 16; o > 0; o >>= 1) s = max(s, __shfl_xor_sync(0xffffffffu, s, o));
    return s;
}

#endif
