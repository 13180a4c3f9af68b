/* pointwise.cu - binary arithmetic over a plan's walk, the maps and their
 * derivatives, where; one thread per output element, f32 and f64. */
#include "kernels/ops/cuda/elem.cuh"

#define GELU_K 0.7978845608028654 /* sqrt(2 / pi) */
#define GELU_A 0.044715

/* ---- binary ---- */

/* Offsets into a and b of output element i under the plan's walk. */
__device__ inline void binary_offsets(const ts_binary_plan &pl, int64_t i, int64_t *oa, int64_t *ob) {
    switch (pl.walk) {
    case TS_WALK_SAME: *oa = *ob = i; break;
    case TS_WALK_A_SCALAR: *oa = 0, *ob = i; break;
    case TS_WALK_B_SCALAR: *oa = i, *ob = 0; break;
    case TS_WALK_A_ROW: *oa = i % pl.period, *ob = i; break;
    case TS_WALK_B_ROW: *oa = i, *ob = i % pl.period; break;
    default: { /* strided, tiled: the full walk */
        int64_t a = 0, b = 0;
        for (int d = pl.ndim - 1; d >= 0; d--) {
            int64_t s = pl.shape[d], k = i % s;
            a += k * pl.sa[d];
            b += k * pl.sb[d];
            i /= s;
        }
        *oa = a, *ob = b;
    }
    }
}

template <typename T> __global__ void binary_kernel(ts_binary_kind kind, ts_binary_plan pl) {
    const T *A = (const T *)pl.a, *B = (const T *)pl.b;
    T *O = (T *)pl.out;
    FOR_EACH(i, pl.n) {
        int64_t oa, ob;
        binary_offsets(pl, i, &oa, &ob);
        T x = A[oa], y = B[ob];
        O[i] = kind == TS_BIN_ADD ? x + y : kind == TS_BIN_SUB ? x - y : kind == TS_BIN_MUL ? x * y : x / y;
    }
}

static ts_status cuda_binary(ts_binary_kind kind, ts_dtype dt, const ts_binary_plan *plan) {
    if (plan->n == 0) return TS_OK;
    if (dt == TS_F32) binary_kernel<float><<<ts_cuda_blocks(plan->n), 256>>>(kind, *plan);
    else binary_kernel<double><<<ts_cuda_blocks(plan->n), 256>>>(kind, *plan);
    return ts_cuda_launched("binary");
}

/* ---- maps ---- */

/* tanh of the gelu's inner term, as the CPU kernels compute it. */
template <typename T> __device__ inline T gelu_tanh(T x) {
    return (T)1 - (T)2 / ((T)1 + exp((T)(2 * GELU_K) * (x + (T)GELU_A * x * x * x)));
}

template <typename T> __device__ inline T map_one(ts_map_kind kind, T x, T p) {
    switch (kind) {
    case TS_MAP_NEG: return -x;
    case TS_MAP_ADD_SCALAR: return x + p;
    case TS_MAP_MUL_SCALAR: return x * p;
    case TS_MAP_POW: return pow(x, p);
    case TS_MAP_EXP: return exp(x);
    case TS_MAP_LOG: return log(x);
    case TS_MAP_SQRT: return sqrt(x);
    case TS_MAP_ABS: return fabs(x);
    case TS_MAP_RELU: return x > 0 ? x : (T)0;
    case TS_MAP_GELU: return (T)0.5 * x * ((T)1 + gelu_tanh(x));
    case TS_MAP_SIGMOID: return x >= 0 ? (T)1 / ((T)1 + exp(-x)) : exp(x) / ((T)1 + exp(x));
    case TS_MAP_TANH: return tanh(x);
    default: return x;
    }
}

/* g f'(x) given the output y = f(x). */
template <typename T> __device__ inline T map_grad(ts_map_kind kind, T g, T x, T y, T p) {
    switch (kind) {
    case TS_MAP_NEG: return -g;
    case TS_MAP_ADD_SCALAR: return g;
    case TS_MAP_MUL_SCALAR: return g * p;
    case TS_MAP_POW: return p == 0 ? (T)0 : g * p * pow(x, p - (T)1);
    case TS_MAP_EXP: return g * y;
    case TS_MAP_LOG: return g / x;
    case TS_MAP_SQRT: return g / ((T)2 * y);
    case TS_MAP_ABS: return x > 0 ? g : x < 0 ? -g : (T)0;
    case TS_MAP_RELU: return y > 0 ? g : (T)0;
    case TS_MAP_GELU: {
        T t = gelu_tanh(x);
        return g * ((T)0.5 * ((T)1 + t) + (T)0.5 * x * ((T)1 - t * t) * (T)GELU_K * ((T)1 + (T)(3 * GELU_A) * x * x));
    }
    case TS_MAP_SIGMOID: return g * y * ((T)1 - y);
    case TS_MAP_TANH: return g * ((T)1 - y * y);
    default: return g;
    }
}

template <typename T> __global__ void map_kernel(ts_map_kind kind, const T *x, T *y, int64_t n, T p) {
    FOR_EACH(i, n) y[i] = map_one(kind, x[i], p);
}

template <typename T>
__global__ void map_backward_kernel(ts_map_kind kind, const T *g, const T *x, const T *y, T *gx, int64_t n, T p) {
    FOR_EACH(i, n) gx[i] = map_grad(kind, g[i], x[i], y[i], p);
}

static ts_status cuda_map(ts_map_kind kind, ts_dtype dt, const void *x, void *y, int64_t n, double p) {
    if (n == 0) return TS_OK;
    if (dt == TS_F32) map_kernel<float><<<ts_cuda_blocks(n), 256>>>(kind, (const float *)x, (float *)y, n, (float)p);
    else map_kernel<double><<<ts_cuda_blocks(n), 256>>>(kind, (const double *)x, (double *)y, n, p);
    return ts_cuda_launched("map");
}

static ts_status cuda_map_backward(ts_map_kind kind, ts_dtype dt, const void *g, const void *x, const void *y,
                                   void *gx, int64_t n, double p) {
    if (n == 0) return TS_OK;
    if (dt == TS_F32)
        map_backward_kernel<float><<<ts_cuda_blocks(n), 256>>>(kind, (const float *)g, (const float *)x,
                                                                (const float *)y, (float *)gx, n, (float)p);
    else
        map_backward_kernel<double><<<ts_cuda_blocks(n), 256>>>(kind, (const double *)g, (const double *)x,
                                                                 (const double *)y, (double *)gx, n, p);
    return ts_cuda_launched("map backward");
}

/* ---- where ---- */

template <typename T>
__global__ void where_kernel(int64_t n, const uint8_t *m, walk wm, const T *a, walk wa, const T *b, walk wb, T *out) {
    FOR_EACH(i, n) out[i] = m[walk_offset(wm, i)] ? a[walk_offset(wa, i)] : b[walk_offset(wb, i)];
}

static ts_status cuda_where(int ndim, const int64_t *shape, ts_operand mask, ts_operand a, ts_operand b, void *out) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    if (n == 0) return TS_OK;
    walk wm = make_walk(ndim, shape, mask.strides), wa = make_walk(ndim, shape, a.strides),
         wb = make_walk(ndim, shape, b.strides);
    if (a.dtype == TS_F32)
        where_kernel<float><<<ts_cuda_blocks(n), 256>>>(n, (const uint8_t *)mask.data, wm, (const float *)a.data, wa,
                                                         (const float *)b.data, wb, (float *)out);
    else
        where_kernel<double><<<ts_cuda_blocks(n), 256>>>(n, (const uint8_t *)mask.data, wm, (const double *)a.data,
                                                          wa, (const double *)b.data, wb, (double *)out);
    return ts_cuda_launched("where");
}

extern "C" const ts_pointwise_kernels ts_cuda_pointwise = {cuda_binary, cuda_map, cuda_map_backward, cuda_where};
