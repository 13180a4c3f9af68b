/* pool.cu - max and average pooling of NCHW planes, forward and backward,
 * one thread per output element (forward) or input element (backward, so
 * no two threads write one element). */
#include <math.h>

#include "kernels/ops/cuda/elem.cuh"

/* The window of output (oh, ow) clipped to the input, as the CPU's. */
__device__ inline void window(const ts_pool_geom &g, int64_t oh, int64_t ow, int64_t *h0, int64_t *h1, int64_t *w0,
                              int64_t *w1) {
    int64_t hs = oh * g.sh - g.ph, ws = ow * g.sw - g.pw;
    *h0 = hs < 0 ? 0 : hs;
    *w0 = ws < 0 ? 0 : ws;
    *h1 = hs + g.kh < g.H ? hs + g.kh : g.H;
    *w1 = ws + g.kw < g.W ? ws + g.kw : g.W;
}

/* Max of each window (a NaN wins), idx its plane index, or the sum / kh kw. */
template <typename T> __global__ void pool_kernel(ts_pool_geom g, const T *x, T *out, int32_t *idx, bool is_max) {
    FOR_EACH(o, g.planes * g.Ho * g.Wo) {
        int64_t ow = o % g.Wo, oh = o / g.Wo % g.Ho, p = o / (g.Wo * g.Ho), h0, h1, w0, w1;
        window(g, oh, ow, &h0, &h1, &w0, &w1);
        const T *xp = x + p * g.H * g.W;
        T best = -INFINITY;
        int64_t bi = h0 * g.W + w0;
        double s = 0;
        for (int64_t ih = h0; ih < h1; ih++)
            for (int64_t iw = w0; iw < w1; iw++) {
                T v = xp[ih * g.W + iw];
                s += v;
                if (v > best || v != v) best = v, bi = ih * g.W + iw; /* a NaN wins, as on the CPU */
            }
        out[o] = is_max ? best : (T)(s / (double)(g.kh * g.kw));
        if (idx) idx[o] = (int32_t)bi;
    }
}

/* The outputs whose windows hold input row ih: [*lo, *hi). */
__device__ inline void covering(int64_t i, int64_t k, int64_t s, int64_t pad, int64_t n_out, int64_t *lo, int64_t *hi) {
    int64_t a = i + pad - k + 1; /* first start reaching i */
    *lo = a <= 0 ? 0 : (a + s - 1) / s;
    int64_t b = (i + pad) / s + 1;
    *hi = b < n_out ? b : n_out;
}

/* dx of each input element: the output gradients whose argmax it is, or
 * which average over it. */
template <typename T>
__global__ void pool_backward_kernel(ts_pool_geom g, const T *dout, const int32_t *idx, T *dx, bool is_max) {
    FOR_EACH(e, g.planes * g.H * g.W) {
        int64_t iw = e % g.W, ih = e / g.W % g.H, p = e / (g.W * g.H), oh0, oh1, ow0, ow1;
        covering(ih, g.kh, g.sh, g.ph, g.Ho, &oh0, &oh1);
        covering(iw, g.kw, g.sw, g.pw, g.Wo, &ow0, &ow1);
        T s = 0;
        for (int64_t oh = oh0; oh < oh1; oh++)
            for (int64_t ow = ow0; ow < ow1; ow++) {
                int64_t o = (p * g.Ho + oh) * g.Wo + ow;
                if (!is_max)
                    s += dout[o];
                else if (idx[o] == ih * g.W + iw)
                    s += dout[o];
            }
        dx[e] = is_max ? s : s * (T)(1.0 / (double)(g.kh * g.kw));
    }
}

template <typename T> static ts_status pool(const ts_pool_geom *g, const void *x, void *out, int32_t *idx, bool mx) {
    int64_t n = g->planes * g->Ho * g->Wo;
    if (n) pool_kernel<T><<<ts_cuda_blocks(n), 256>>>(*g, (const T *)x, (T *)out, idx, mx);
    return ts_cuda_launched(mx ? "max_pool2d" : "avg_pool2d");
}

template <typename T>
static ts_status pool_backward(const ts_pool_geom *g, const void *dout, const int32_t *idx, void *dx, bool mx) {
    int64_t n = g->planes * g->H * g->W;
    if (n) pool_backward_kernel<T><<<ts_cuda_blocks(n), 256>>>(*g, (const T *)dout, idx, (T *)dx, mx);
    return ts_cuda_launched(mx ? "max_pool2d backward" : "avg_pool2d backward");
}

static ts_status cuda_max(ts_dtype dt, const ts_pool_geom *g, const void *x, void *out, int32_t *idx) {
    return dt == TS_F32 ? pool<float>(g, x, out, idx, true) : pool<double>(g, x, out, idx, true);
}
static ts_status cuda_max_backward(ts_dtype dt, const ts_pool_geom *g, const void *dout, const int32_t *idx, void *dx) {
    return dt == TS_F32 ? pool_backward<float>(g, dout, idx, dx, true) : pool_backward<double>(g, dout, idx, dx, true);
}
static ts_status cuda_avg(ts_dtype dt, const ts_pool_geom *g, const void *x, void *out) {
    return dt == TS_F32 ? pool<float>(g, x, out, NULL, false) : pool<double>(g, x, out, NULL, false);
}
static ts_status cuda_avg_backward(ts_dtype dt, const ts_pool_geom *g, const void *dout, void *dx) {
    return dt == TS_F32 ? pool_backward<float>(g, dout, NULL, dx, false)
                        : pool_backward<double>(g, dout, NULL, dx, false);
}

extern "C" const ts_pool_kernels ts_cuda_pool = {cuda_max, cuda_max_backward, cuda_avg, cuda_avg_backward};
