/* conv_gemm.c - conv2d via chunked im2col + GEMM, backward via GEMM +
 * col2im: the path for the geometries the direct path does not take
 * (strides above 1, padding beyond the kernel's reach). The loops are in
 * conv_gemm_t.h, once per dtype. */
#include <string.h>

#include "kernels/ops/cpu/conv_cpu.h"

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

/* The backend's GEMM (sizes within BLAS's int range: conv2d checks). */
static void gemm(ts_dtype dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const void *A,
                 int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc) {
    TS_VARIANT(ts_cpu_matmul).gemm(dt, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

#define TS_DT 32
#include "kernels/ops/cpu/conv_gemm_t.h"
#undef TS_DT
#define TS_DT 64
#include "kernels/ops/cpu/conv_gemm_t.h"
#undef TS_DT

/* The per-chunk work buffer: the columns and GEMM result of a chunk. */
static int64_t work_elements(const ts_conv_geom *g, ts_dtype dt) {
    return (g->C * g->KH * g->KW + g->O) * chunk_images(g, ts_dtype_size(dt)) * g->Ho * g->Wo;
}

ts_status TS_VARIANT(ts_conv_gemm_forward)(const ts_conv_geom *g, ts_dtype dt, const void *x, const void *w,
                                       const void *bias, void *out) {
    int64_t n = work_elements(g, dt);
    void *work = ts_cpu_scratch("conv2d", n, ts_dtype_size(dt));
    if (!work) return ts_last_status();
    if (dt == TS_F32) conv_gemm_forward_f32(g, x, w, bias, out, work);
    else conv_gemm_forward_f64(g, x, w, bias, out, work);
    ts_cpu_scratch_free(work, n, ts_dtype_size(dt));
    return TS_OK;
}

ts_status TS_VARIANT(ts_conv_gemm_backward)(const ts_conv_geom *g, ts_dtype dt, const void *x, const void *w,
                                        const void *dout, void *dw, void *dx) {
    int64_t n = work_elements(g, dt);
    void *work = ts_cpu_scratch("conv2d", n, ts_dtype_size(dt));
    if (!work) return ts_last_status();
    if (dt == TS_F32) conv_gemm_backward_f32(g, x, w, dout, dw, dx, work);
    else conv_gemm_backward_f64(g, x, w, dout, dw, dx, work);
    ts_cpu_scratch_free(work, n, ts_dtype_size(dt));
    return TS_OK;
}
