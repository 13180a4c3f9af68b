/* conv_cpu.h - the two CPU implementations behind the conv kernels
 * (conv.c chooses). Private to kernels/ops/cpu.
 *
 * Both take contiguous NCHW input x [N,C,H,W], weight [O,C,KH,KW],
 * optional bias [O] and output [N,O,Ho,Wo] of one float dtype (f32 or f64)
 * and the geometry the op checked. Each allocates its own scratch from the
 * caching allocator and returns TS_ERR_MEMORY, with a message naming
 * conv2d, when that fails.
 *
 * - direct (conv_direct.c): stride 1 with padding at most the dilated
 *   kernel's reach (pad <= dil (K - 1)), the usual "same" and "valid"
 *   convolutions. Register-blocked loops over padded images, no column
 *   matrix; the input gradient is the same loop run over the padded output
 *   gradient with the flipped weights.
 * - gemm (conv_gemm.c): every other geometry. im2col of chunks of images,
 *   one GEMM per chunk; backward by GEMM and col2im.
 */
#ifndef TS_OPS_CPU_CONV_CPU_H
#define TS_OPS_CPU_CONV_CPU_H

#include "kernels/ops/cpu/cpu.h"

/* True when the direct path handles g. */
bool TS_VARIANT(ts_conv_direct_fits)(const ts_conv_geom *g);

/* out = conv(x, w) + bias (bias may be NULL). */
ts_status TS_VARIANT(ts_conv_direct_forward)(const ts_conv_geom *g, ts_dtype dt, const void *x, const void *w,
                                         const void *bias, void *out);
ts_status TS_VARIANT(ts_conv_gemm_forward)(const ts_conv_geom *g, ts_dtype dt, const void *x, const void *w,
                                       const void *bias, void *out);

/* From the output gradient dout: the weight gradient into dw (overwritten;
 * skipped when dw is NULL, and then x may be NULL) and the input gradient
 * into dx (overwritten; skipped when dx is NULL, and then w may be NULL). */
ts_status TS_VARIANT(ts_conv_direct_backward)(const ts_conv_geom *g, ts_dtype dt, const void *x, const void *w,
                                          const void *dout, void *dw, void *dx);
ts_status TS_VARIANT(ts_conv_gemm_backward)(const ts_conv_geom *g, ts_dtype dt, const void *x, const void *w,
                                        const void *dout, void *dw, void *dx);

#endif
