/* conv_gemm.c - conv2d via chunked im2col + GEMM, backward via GEMM +
 * col2im: the path for the geometries the direct path does not take
 * (strides above 1, padding beyond the kernel's reach). */
#include <cblas.h>
#include <string.h>

#include "kernels/ops/cpu/conv_cpu.h"

/* `omp simd` is a hint: sanitizer and -O1 builds of clang cannot always
 * vectorize and would otherwise turn that into an error under -Werror. */
#ifdef __clang__
#pragma clang diagnostic ignored "-Wpass-failed"
#endif

/* Serial below this many column elements. */
#define CONV_OMP_MIN 32768

/* Output columns ow whose input column ow*sw - pw + kw*dw lies in [0, W):
 * [*lo, *hi). */
static void valid_range(int64_t k, int64_t s, int64_t p, int64_t d, int64_t in, int64_t out, int64_t *lo,
                        int64_t *hi) {
    int64_t off = k * d - p; /* input index = o*s + off */
    int64_t l = off >= 0 ? 0 : (-off + s - 1) / s;
    int64_t h = in - off <= 0 ? 0 : (in - off + s - 1) / s;
    if (h > out) h = out;
    if (l > h) l = h;
    *lo = l;
    *hi = h;
}

/* The batch is processed in chunks of nb images so the column buffer stays
 * small and in cache: the columns of a chunk are one [CKK, nb*L] matrix
 * (row (c*KH + kh)*KW + kw, column s*L + oh*Wo + ow for image s of the
 * chunk), so each chunk is one GEMM with a wide inner size. */
#define CONV_CHUNK_BYTES (1 << 20)

/* Images per chunk: as many as fit CONV_CHUNK_BYTES of columns, >= 1. */
static int64_t chunk_images(const ts_conv_geom *g, size_t elem) {
    int64_t per = g->C * g->KH * g->KW * g->Ho * g->Wo * (int64_t)elem;
    int64_t nb = CONV_CHUNK_BYTES / (per > 0 ? per : 1);
    return nb < 1 ? 1 : nb > g->N ? g->N : nb;
}

/* im2col of images [n0, n0 + nb): col[r][s*L + l] = x[n0 + s][c][ih][iw]
 * (0 in the padding); ld = nb*L. col2im: the adjoint, dx[...] = sum of the
 * dcol entries that read it (dx planes of the chunk are overwritten). Each
 * (image, channel) pair owns its rows of col and its plane of x, so both run
 * in parallel over them; stride-1 rows are plain vector loops. */
#define CONV_KERNELS(T, GEMM)                                                                            \
    static void im2col_##T(const ts_conv_geom *g, const T *x, int64_t n0, int64_t nb, T *col) {             \
        int64_t L = g->Ho * g->Wo, ld = nb * L, work = nb * g->C;                                        \
        _Pragma("omp parallel for schedule(static) if (work * g->KH * g->KW * L > CONV_OMP_MIN)")        \
        for (int64_t p = 0; p < work; p++) {                                                             \
            int64_t s = p / g->C, c = p % g->C;                                                          \
            const T *xp = x + ((n0 + s) * g->C + c) * g->H * g->W;                                       \
            for (int64_t kh = 0; kh < g->KH; kh++)                                                       \
                for (int64_t kw = 0; kw < g->KW; kw++) {                                                 \
                    T *row = col + ((c * g->KH + kh) * g->KW + kw) * ld + s * L;                         \
                    int64_t lo, hi, off = kw * g->dw - g->pw;                                            \
                    valid_range(kw, g->sw, g->pw, g->dw, g->W, g->Wo, &lo, &hi);                         \
                    for (int64_t oh = 0; oh < g->Ho; oh++) {                                             \
                        T *r = row + oh * g->Wo;                                                         \
                        int64_t ih = oh * g->sh - g->ph + kh * g->dh;                                    \
                        if (ih < 0 || ih >= g->H || lo >= hi) {                                          \
                            memset(r, 0, sizeof(T) * (size_t)g->Wo);                                     \
                            continue;                                                                    \
                        }                                                                                \
                        const T *xr = xp + ih * g->W + off;                                              \
                        for (int64_t ow = 0; ow < lo; ow++) r[ow] = 0;                                   \
                        if (g->sw == 1)                                                                  \
                            _Pragma("omp simd") for (int64_t ow = lo; ow < hi; ow++) r[ow] = xr[ow];     \
                        else                                                                             \
                            for (int64_t ow = lo; ow < hi; ow++) r[ow] = xr[ow * g->sw];                 \
                        for (int64_t ow = hi; ow < g->Wo; ow++) r[ow] = 0;                               \
                    }                                                                                    \
                }                                                                                        \
        }                                                                                                \
    }                                                                                                    \
    static void col2im_##T(const ts_conv_geom *g, const T *col, int64_t n0, int64_t nb, T *dx) {            \
        int64_t L = g->Ho * g->Wo, ld = nb * L, work = nb * g->C;                                        \
        _Pragma("omp parallel for schedule(static) if (work * g->KH * g->KW * L > CONV_OMP_MIN)")        \
        for (int64_t p = 0; p < work; p++) {                                                             \
            int64_t s = p / g->C, c = p % g->C;                                                          \
            T *xp = dx + ((n0 + s) * g->C + c) * g->H * g->W;                                            \
            memset(xp, 0, sizeof(T) * (size_t)(g->H * g->W));                                            \
            for (int64_t kh = 0; kh < g->KH; kh++)                                                       \
                for (int64_t kw = 0; kw < g->KW; kw++) {                                                 \
                    const T *row = col + ((c * g->KH + kh) * g->KW + kw) * ld + s * L;                   \
                    int64_t lo, hi, off = kw * g->dw - g->pw;                                            \
                    valid_range(kw, g->sw, g->pw, g->dw, g->W, g->Wo, &lo, &hi);                         \
                    for (int64_t oh = 0; oh < g->Ho; oh++) {                                             \
                        int64_t ih = oh * g->sh - g->ph + kh * g->dh;                                    \
                        if (ih < 0 || ih >= g->H) continue;                                              \
                        const T *r = row + oh * g->Wo;                                                   \
                        T *xr = xp + ih * g->W + off;                                                    \
                        if (g->sw == 1)                                                                  \
                            _Pragma("omp simd") for (int64_t ow = lo; ow < hi; ow++) xr[ow] += r[ow];    \
                        else                                                                             \
                            for (int64_t ow = lo; ow < hi; ow++) xr[ow * g->sw] += r[ow];                \
                    }                                                                                    \
                }                                                                                        \
        }                                                                                                \
    }                                                                                                    \
    /* out[n0 + s][o][l] = y[o][s*L + l] (+ bias[o]): the chunk's GEMM result                         \
     * moved to NCHW. */                                                                                 \
    static void scatter_out_##T(const ts_conv_geom *g, const T *y, const T *bias, int64_t n0, int64_t nb,   \
                                T *out) {                                                                \
        int64_t L = g->Ho * g->Wo, rows = nb * g->O;                                                     \
        _Pragma("omp parallel for schedule(static) if (rows * L > CONV_OMP_MIN)")                        \
        for (int64_t r = 0; r < rows; r++) {                                                             \
            int64_t s = r / g->O, o = r % g->O;                                                          \
            const T *src = y + o * nb * L + s * L;                                                       \
            T *dst = out + ((n0 + s) * g->O + o) * L, b = bias ? bias[o] : (T)0;                         \
            for (int64_t l = 0; l < L; l++) dst[l] = src[l] + b;                                         \
        }                                                                                                \
    }                                                                                                    \
    /* gt[o][s*L + l] = dout[n0 + s][o][l]: the chunk's output gradient as a                          \
     * GEMM operand. */                                                                                  \
    static void gather_grad_##T(const ts_conv_geom *g, const T *dout, int64_t n0, int64_t nb, T *gt) {      \
        int64_t L = g->Ho * g->Wo, rows = nb * g->O;                                                     \
        _Pragma("omp parallel for schedule(static) if (rows * L > CONV_OMP_MIN)")                        \
        for (int64_t r = 0; r < rows; r++) {                                                             \
            int64_t s = r / g->O, o = r % g->O;                                                          \
            memcpy(gt + o * nb * L + s * L, dout + ((n0 + s) * g->O + o) * L, sizeof(T) * (size_t)L);   \
        }                                                                                                \
    }                                                                                                    \
    /* out = conv(x, w) + bias, chunk by chunk; work holds the columns and                             \
     * the GEMM result of one chunk. */                                                                  \
    static void conv_fwd_##T(const ts_conv_geom *g, const T *x, const T *w, const T *bias, T *out, T *work) { \
        int64_t L = g->Ho * g->Wo, CKK = g->C * g->KH * g->KW, nb = chunk_images(g, sizeof(T));          \
        for (int64_t n0 = 0; n0 < g->N; n0 += nb) {                                                      \
            int64_t m = g->N - n0 < nb ? g->N - n0 : nb;                                                 \
            T *col = work, *y = work + CKK * m * L;                                                      \
            im2col_##T(g, x, n0, m, col);                                                                \
            GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)g->O, (int)(m * L), (int)CKK, 1, w,      \
                 (int)CKK, col, (int)(m * L), 0, y, (int)(m * L));                                       \
            scatter_out_##T(g, y, bias, n0, m, out);                                                     \
        }                                                                                                \
    }                                                                                                    \
    /* dw = sum_n dout_n · col_nᵀ (when dw), dx = col2im(wᵀ · dout_n) (when                            \
     * dx), chunk by chunk; work as in conv_fwd. */                                                      \
    static void conv_bwd_##T(const ts_conv_geom *g, const T *x, const T *w, const T *dout, T *dw, T *dx,    \
                             T *work) {                                                                  \
        int64_t L = g->Ho * g->Wo, CKK = g->C * g->KH * g->KW, nb = chunk_images(g, sizeof(T));          \
        for (int64_t n0 = 0; n0 < g->N; n0 += nb) {                                                      \
            int64_t m = g->N - n0 < nb ? g->N - n0 : nb;                                                 \
            T *col = work, *gt = work + CKK * m * L;                                                     \
            gather_grad_##T(g, dout, n0, m, gt);                                                         \
            if (dw) {                                                                                    \
                im2col_##T(g, x, n0, m, col);                                                            \
                GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)g->O, (int)CKK, (int)(m * L), 1, gt,   \
                     (int)(m * L), col, (int)(m * L), n0 ? 1 : 0, dw, (int)CKK);                         \
            }                                                                                            \
            if (dx) {                                                                                    \
                GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (int)CKK, (int)(m * L), (int)g->O, 1, w,    \
                     (int)CKK, gt, (int)(m * L), 0, col, (int)(m * L));                                  \
                col2im_##T(g, col, n0, m, dx);                                                           \
            }                                                                                            \
        }                                                                                                \
    }

CONV_KERNELS(float, cblas_sgemm)
CONV_KERNELS(double, cblas_dgemm)

#define DISPATCH(dt, fn, ...) ((dt) == TS_F32 ? fn##_float(__VA_ARGS__) : fn##_double(__VA_ARGS__))

/* The per-chunk work buffer (columns + GEMM result of a chunk) as a
 * tensor, so the allocator counts it; NULL with a conv2d error if it
 * fails. */
static ts_tensor *work_buffer(const ts_conv_geom *g, ts_dtype dt) {
    int64_t nb = chunk_images(g, ts_dtype_size(dt)), n = (g->C * g->KH * g->KW + g->O) * nb * g->Ho * g->Wo;
    ts_tensor *t = ts_tensor_empty(dt, 1, &n);
    if (!t) ts_error(TS_ERR_MEMORY, "conv2d: out of memory for a %lld-element column buffer", (long long)n);
    return t;
}

ts_status ts_conv_gemm_forward(const ts_conv_geom *g, ts_dtype dt, const void *x, const void *w, const void *bias,
                               void *out) {
    ts_tensor *work = work_buffer(g, dt);
    if (!work) return ts_last_status();
    DISPATCH(dt, conv_fwd, g, x, w, bias, out, ts_tensor_data(work));
    ts_tensor_release(work);
    return TS_OK;
}

ts_status ts_conv_gemm_backward(const ts_conv_geom *g, ts_dtype dt, const void *x, const void *w, const void *dout,
                                void *dw, void *dx) {
    ts_tensor *work = work_buffer(g, dt);
    if (!work) return ts_last_status();
    DISPATCH(dt, conv_bwd, g, x, w, dout, dw, dx, ts_tensor_data(work));
    ts_tensor_release(work);
    return TS_OK;
}
