/* conv.c - the CPU's conv2d kernels: the direct path where it fits, else
 * im2col + GEMM (conv_cpu.h), and the bias gradient. */
#include "kernels/ops/cpu/conv_cpu.h"

/* db[o] = sum over images n and pixels l of dout[n][o][l]: per-image sums
 * in T (vectorised), their total in double. */
#define TS_DT 32
#include "kernels/ops/cpu/conv_bias_t.h"
#undef TS_DT
#define TS_DT 64
#include "kernels/ops/cpu/conv_bias_t.h"
#undef TS_DT

static ts_status cpu_conv2d(ts_dtype dt, const ts_conv_geom *g, const void *x, const void *w, const void *bias,
                            void *out) {
    return (TS_VARIANT(ts_conv_direct_fits)(g) ? TS_VARIANT(ts_conv_direct_forward) : TS_VARIANT(ts_conv_gemm_forward))(
        g, dt, x, w, bias, out);
}

static ts_status cpu_conv2d_backward(ts_dtype dt, const ts_conv_geom *g, const void *x, const void *w,
                                     const void *dout, void *dw, void *dx) {
    return (TS_VARIANT(ts_conv_direct_fits)(g) ? TS_VARIANT(ts_conv_direct_backward) : TS_VARIANT(ts_conv_gemm_backward))(
        g, dt, x, w, dout, dw, dx);
}

static ts_status cpu_conv2d_bias_backward(ts_dtype dt, const ts_conv_geom *g, const void *dout, void *db) {
    if (dt == TS_F32) bias_grad_f32(g, dout, db);
    else bias_grad_f64(g, dout, db);
    return TS_OK;
}

const ts_conv_kernels TS_VARIANT(ts_cpu_conv) = {cpu_conv2d, cpu_conv2d_backward, cpu_conv2d_bias_backward};
