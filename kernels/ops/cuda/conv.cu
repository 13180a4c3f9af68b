/* conv.cu - 2-d convolution as im2col + cuBLAS GEMM, image by image:
 * out[n] = w [O, C KH KW] x col [C KH KW, Ho Wo] + bias; backward dw =
 * sum over images of dout[n] x col^T and dx = col2im(w^T x dout[n]), where
 * col2im gathers (a thread per input element sums the columns that read
 * it, so nothing is written twice). */
#include <cuda_runtime.h>

#include "kernels/ops/cuda/elem.cuh"
#include "kernels/ops/cuda/runtime.h"

/* col[(c KH + kh) KW + kw][oh Wo + ow] = x[c][ih][iw] of one image, 0 in
 * the padding. */
template <typename T> __global__ void im2col_kernel(ts_conv_geom g, const T *x, T *col) {
    int64_t L = g.Ho * g.Wo;
    FOR_EACH(e, g.C * g.KH * g.KW * L) {
        int64_t l = e % L, r = e / L, kw = r % g.KW, kh = r / g.KW % g.KH, c = r / (g.KW * g.KH);
        int64_t ih = l / g.Wo * g.sh - g.ph + kh * g.dh, iw = l % g.Wo * g.sw - g.pw + kw * g.dw;
        col[e] = ih >= 0 && ih < g.H && iw >= 0 && iw < g.W ? x[(c * g.H + ih) * g.W + iw] : (T)0;
    }
}

/* dx[c][ih][iw] of one image = the sum of the dcol entries that read it. */
template <typename T> __global__ void col2im_kernel(ts_conv_geom g, const T *dcol, T *dx) {
    int64_t L = g.Ho * g.Wo;
    FOR_EACH(e, g.C * g.H * g.W) {
        int64_t iw = e % g.W, ih = e / g.W % g.H, c = e / (g.W * g.H);
        T s = 0;
        for (int64_t kh = 0; kh < g.KH; kh++) {
            int64_t t = ih + g.ph - kh * g.dh;
            if (t < 0 || t % g.sh || t / g.sh >= g.Ho) continue;
            for (int64_t kw = 0; kw < g.KW; kw++) {
                int64_t u = iw + g.pw - kw * g.dw;
                if (u < 0 || u % g.sw || u / g.sw >= g.Wo) continue;
                s += dcol[((c * g.KH + kh) * g.KW + kw) * L + t / g.sh * g.Wo + u / g.sw];
            }
        }
        dx[e] = s;
    }
}

/* out[n][o][l] += bias[o]. */
template <typename T> __global__ void add_bias_kernel(ts_conv_geom g, const T *bias, T *out) {
    int64_t L = g.Ho * g.Wo;
    FOR_EACH(e, g.N * g.O * L) out[e] += bias[e / L % g.O];
}

/* db[o] = sum over images and pixels of dout[n][o][.], a block per o. */
template <typename T> __global__ void bias_backward_kernel(ts_conv_geom g, const T *dout, T *db) {
    int64_t L = g.Ho * g.Wo, o = blockIdx.x;
    double s = 0;
    for (int64_t e = threadIdx.x; e < g.N * L; e += blockDim.x) s += (double)dout[(e / L * g.O + o) * L + e % L];
    s = block_sum(s);
    if (threadIdx.x == 0) db[o] = (T)s;
}

/* A column buffer for one image on the current device (NULL with an error). */
static void *col_buffer(const char *op, const ts_conv_geom *g, size_t es, int *dev, size_t *bytes) {
    if (ts_cuda_status(cudaGetDevice(dev), op)) return NULL;
    *bytes = es * (size_t)(g->C * g->KH * g->KW * g->Ho * g->Wo);
    return ts_cuda_alloc(*dev, *bytes ? *bytes : 1);
}

template <typename T>
static ts_status forward_typed(ts_dtype dt, const ts_conv_geom *g, const T *x, const T *w, const T *bias, T *out) {
    int dev;
    size_t bytes;
    T *col = (T *)col_buffer("conv2d", g, sizeof(T), &dev, &bytes);
    if (!col) return ts_last_status();
    int64_t CKK = g->C * g->KH * g->KW, L = g->Ho * g->Wo;
    ts_status st = TS_OK;
    for (int64_t n = 0; n < g->N && !st; n++) {
        im2col_kernel<T><<<ts_cuda_blocks(CKK * L), 256>>>(*g, x + n * g->C * g->H * g->W, col);
        st = ts_cuda_launched("conv2d");
        if (!st)
            st = ts_cuda_matmul.gemm(dt, false, false, g->O, L, CKK, 1.0, w, CKK, col, L, 0.0, out + n * g->O * L, L);
    }
    if (!st && bias) {
        add_bias_kernel<T><<<ts_cuda_blocks(g->N * g->O * L), 256>>>(*g, bias, out);
        st = ts_cuda_launched("conv2d");
    }
    ts_cuda_free(dev, col, bytes ? bytes : 1);
    return st;
}

template <typename T>
static ts_status backward_typed(ts_dtype dt, const ts_conv_geom *g, const T *x, const T *w, const T *dout, T *dw,
                                T *dx) {
    int dev;
    size_t bytes;
    T *col = (T *)col_buffer("conv2d backward", g, sizeof(T), &dev, &bytes);
    if (!col) return ts_last_status();
    int64_t CKK = g->C * g->KH * g->KW, L = g->Ho * g->Wo;
    ts_status st = TS_OK;
    if (dw && g->N == 0)
        st = ts_cuda_status(cudaMemsetAsync(dw, 0, sizeof(T) * (size_t)(g->O * CKK), 0), "conv2d backward");
    for (int64_t n = 0; n < g->N && !st; n++) {
        const T *go = dout + n * g->O * L;
        if (dw) {
            im2col_kernel<T><<<ts_cuda_blocks(CKK * L), 256>>>(*g, x + n * g->C * g->H * g->W, col);
            st = ts_cuda_launched("conv2d backward");
            if (!st)
                st = ts_cuda_matmul.gemm(dt, false, true, g->O, CKK, L, 1.0, go, L, col, L, n ? 1.0 : 0.0, dw, CKK);
        }
        if (dx && !st) {
            st = ts_cuda_matmul.gemm(dt, true, false, CKK, L, g->O, 1.0, w, CKK, go, L, 0.0, col, L);
            if (!st)
                col2im_kernel<T><<<ts_cuda_blocks(g->C * g->H * g->W), 256>>>(*g, col, dx + n * g->C * g->H * g->W);
            if (!st) st = ts_cuda_launched("conv2d backward");
        }
    }
    ts_cuda_free(dev, col, bytes ? bytes : 1);
    return st;
}

static ts_status cuda_conv_forward(ts_dtype dt, const ts_conv_geom *g, const void *x, const void *w, const void *bias,
                                   void *out) {
    if (dt == TS_F32)
        return forward_typed<float>(dt, g, (const float *)x, (const float *)w, (const float *)bias, (float *)out);
    return forward_typed<double>(dt, g, (const double *)x, (const double *)w, (const double *)bias, (double *)out);
}

static ts_status cuda_conv_backward(ts_dtype dt, const ts_conv_geom *g, const void *x, const void *w, const void *dout,
                                    void *dw, void *dx) {
    if (dt == TS_F32)
        return backward_typed<float>(dt, g, (const float *)x, (const float *)w, (const float *)dout, (float *)dw,
                                     (float *)dx);
    return backward_typed<double>(dt, g, (const double *)x, (const double *)w, (const double *)dout, (double *)dw,
                                  (double *)dx);
}

static ts_status cuda_conv_bias_backward(ts_dtype dt, const ts_conv_geom *g, const void *dout, void *db) {
    if (g->O == 0) return TS_OK;
    if (dt == TS_F32)
        bias_backward_kernel<float><<<(unsigned)g->O, 256>>>(*g, (const float *)dout, (float *)db);
    else
        bias_backward_kernel<double><<<(unsigned)g->O, 256>>>(*g, (const double *)dout, (double *)db);
    return ts_cuda_launched("conv2d bias backward");
}

extern "C" const ts_conv_kernels ts_cuda_conv = {cuda_conv_forward, cuda_conv_backward, cuda_conv_bias_backward};
