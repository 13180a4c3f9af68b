/* conv_direct.c - stride-1 conv2d without a column matrix.
 *
 * Each image is copied once into a zero-padded buffer; every output pixel
 * (oh, ow) then reads tap t = (c, kh, kw) of the kernel at a fixed offset
 * toff[t] = (c * hp + kh * dh) * wp + kw * dw from the padded pixel
 * (oh, ow). The loops are vectorised over output channels (weights stored
 * [tap][channel], channels rounded up to whole vectors with zeros) and
 * register-blocked: the forward block is a run of pixels of one output row
 * times one or two channel vectors, summed over all taps; the weight
 * gradient block is a run of taps times one or two channel vectors, summed
 * over all pixels of an image. The input gradient of a stride-1
 * convolution is the forward loop run over the output gradient padded by
 * dil (K - 1) - pad with the weights flipped and their in/out channels
 * swapped. The loops are in conv_direct_t.h, once per dtype.
 *
 * Threads: forward and input gradient split the images; the weight
 * gradient splits the batch into a fixed number of image groups (set by
 * the geometry alone, so the sums do not depend on the thread count), each
 * summed into its own partial, the partials added in group order; with
 * fewer groups than threads the taps of each group are split as well.
 */
#include <string.h>

#include "kernels/ops/cpu/conv_cpu.h"

/* The register blocks the register file affords: with 32 vector
 * registers a block of 14 pixels x 2 vectors (28 accumulators) or 12 taps
 * x 2 vectors; with 16, blocks of 6. */
#if TS_VEC_REGS >= 32
#define PIX_BLOCK 14
#define TAP_BLOCK 12
#else
#define PIX_BLOCK 6
#define TAP_BLOCK 6
#endif

/* SSE has no broadcast load: a scalar times a vector costs a shuffle, on
 * the ports the multiplies and adds need. There each padded image holds
 * its elements as whole vectors (one element repeated), so the blocks load
 * them as they are; with AVX and NEON the broadcast is free. */
#if defined(__SSE2__) && !defined(__AVX__)
#define PACK_X 1
#else
#define PACK_X 0
#endif

/* Block sizes tried largest first to cover a row (pixels) or the taps. */
static const int64_t pix_menu[4] = {PIX_BLOCK, 4, 2, 1};
static const int64_t tap_menu[3] = {TAP_BLOCK, 4, 1};

/* Serial below this many multiply-adds. */
#define DIRECT_OMP_MIN (1 << 18)
/* Image groups of the weight gradient: at most this many, and their
 * partial sums within this many bytes. */
#define DW_GROUPS 8
#define DW_PARTIAL_BYTES (4 << 20)

/* One stride-1 convolution of zero-padded images of cin channels, hp x wp,
 * into cout channels of hout x wout: ntap taps read at toff[t] from the
 * output pixel's padded origin, weights wt[t][cpad] (cpad = cout rounded up
 * to whole vectors). */
typedef struct {
    int64_t cin, hin, win, ph, pw; /* the unpadded input and its padding */
    int64_t hp, wp, cout, cpad, hout, wout, ntap;
    const int64_t *toff;
} plane;

/* Elements of one padded image of pc (of es bytes; whole vectors with
 * PACK_X). */
static int64_t padded(const plane *pc, size_t es) {
    return pc->cin * pc->hp * pc->wp * (PACK_X ? TS_VEC_BYTES / (int64_t)es : 1);
}

#define TS_DT 32
#include "kernels/ops/cpu/conv_direct_t.h"
#undef TS_DT
#define TS_DT 64
#include "kernels/ops/cpu/conv_direct_t.h"
#undef TS_DT

bool TS_VARIANT(ts_conv_direct_fits)(const ts_conv_geom *g) {
    return g->sh == 1 && g->sw == 1 && g->ph <= g->dh * (g->KH - 1) && g->pw <= g->dw * (g->KW - 1);
}

/* c rounded up to whole vectors of elem-byte lanes. */
static int64_t round_lanes(int64_t c, size_t elem) {
    int64_t vl = TS_VEC_BYTES / (int64_t)elem;
    return (c + vl - 1) / vl * vl;
}

/* The plane of the forward pass (and of the weight gradient). */
static plane forward_plane(const ts_conv_geom *g, size_t elem) {
    return (plane){.cin = g->C, .hin = g->H, .win = g->W, .ph = g->ph, .pw = g->pw, .hp = g->H + 2 * g->ph,
                   .wp = g->W + 2 * g->pw, .cout = g->O, .cpad = round_lanes(g->O, elem), .hout = g->Ho,
                   .wout = g->Wo, .ntap = g->C * g->KH * g->KW};
}

/* The plane of the input gradient: the output gradient [O][Ho][Wo] padded
 * by dil (K - 1) - pad, read into C channels of H x W. */
static plane input_grad_plane(const ts_conv_geom *g, size_t elem) {
    int64_t ph = g->dh * (g->KH - 1) - g->ph, pw = g->dw * (g->KW - 1) - g->pw;
    return (plane){.cin = g->O, .hin = g->Ho, .win = g->Wo, .ph = ph, .pw = pw, .hp = g->Ho + 2 * ph,
                   .wp = g->Wo + 2 * pw, .cout = g->C, .cpad = round_lanes(g->C, elem), .hout = g->H,
                   .wout = g->W, .ntap = g->O * g->KH * g->KW};
}

/* The tap offsets of pc, toff[t] for t = (c * KH + kh) * KW + kw over
 * pc's cin channels, in scratch (pc->toff points at it); NULL with a
 * conv2d error if the allocator fails. */
static int64_t *offsets(const ts_conv_geom *g, plane *pc) {
    int64_t *toff = ts_cpu_scratch("conv2d", pc->ntap, sizeof(int64_t));
    if (!toff) return NULL;
    for (int64_t c = 0; c < pc->cin; c++)
        for (int64_t kh = 0; kh < g->KH; kh++)
            for (int64_t kw = 0; kw < g->KW; kw++)
                toff[(c * g->KH + kh) * g->KW + kw] = (c * pc->hp + kh * g->dh) * pc->wp + kw * g->dw;
    pc->toff = toff;
    return toff;
}

/* Scratch: the transposed weights, the padded bias, one padded image per
 * thread. */
ts_status TS_VARIANT(ts_conv_direct_forward)(const ts_conv_geom *g, ts_dtype dt, const void *x, const void *w,
                                         const void *bias, void *out) {
    size_t es = ts_dtype_size(dt);
    plane pc = forward_plane(g, es);
    int64_t *toff = offsets(g, &pc), n = pc.ntap * pc.cpad + pc.cpad + omp_get_max_threads() * padded(&pc, es);
    void *scr = toff ? ts_cpu_scratch("conv2d", n, es) : NULL;
    if (scr && dt == TS_F32) forward_f32(g, &pc, x, w, bias, out, scr);
    else if (scr) forward_f64(g, &pc, x, w, bias, out, scr);
    ts_cpu_scratch_free(toff, pc.ntap, sizeof(int64_t));
    ts_cpu_scratch_free(scr, n, es);
    return scr ? TS_OK : ts_last_status();
}

/* Weight-gradient scratch: the group partials, then per thread a padded
 * image and a transposed output gradient. */
static ts_status weight_grad(const ts_conv_geom *g, ts_dtype dt, const void *x, const void *dout, void *dw) {
    size_t es = ts_dtype_size(dt);
    int64_t nthr = omp_get_max_threads();
    plane pc = forward_plane(g, es);
    int64_t part = pc.ntap * pc.cpad, groups = g->N < DW_GROUPS ? g->N : DW_GROUPS;
    while (groups > 1 && groups * part * (int64_t)es > DW_PARTIAL_BYTES) groups--;
    int64_t *toff = offsets(g, &pc), n = groups * part + nthr * (padded(&pc, es) + pc.hout * pc.wout * pc.cpad);
    void *scr = toff ? ts_cpu_scratch("conv2d", n, es) : NULL;
    if (scr && dt == TS_F32) weight_grad_f32(&pc, g->N, groups, nthr, x, dout, dw, scr);
    else if (scr) weight_grad_f64(&pc, g->N, groups, nthr, x, dout, dw, scr);
    ts_cpu_scratch_free(toff, pc.ntap, sizeof(int64_t));
    ts_cpu_scratch_free(scr, n, es);
    return scr ? TS_OK : ts_last_status();
}

/* Input-gradient scratch: the flipped weights and one padded output
 * gradient per thread. */
static ts_status input_grad(const ts_conv_geom *g, ts_dtype dt, const void *w, const void *dout, void *dx) {
    size_t es = ts_dtype_size(dt);
    plane pc = input_grad_plane(g, es);
    int64_t *toff = offsets(g, &pc), n = pc.ntap * pc.cpad + omp_get_max_threads() * padded(&pc, es);
    void *scr = toff ? ts_cpu_scratch("conv2d", n, es) : NULL;
    if (scr && dt == TS_F32) input_grad_f32(g, &pc, w, dout, dx, scr);
    else if (scr) input_grad_f64(g, &pc, w, dout, dx, scr);
    ts_cpu_scratch_free(toff, pc.ntap, sizeof(int64_t));
    ts_cpu_scratch_free(scr, n, es);
    return scr ? TS_OK : ts_last_status();
}

ts_status TS_VARIANT(ts_conv_direct_backward)(const ts_conv_geom *g, ts_dtype dt, const void *x, const void *w,
                                          const void *dout, void *dw, void *dx) {
    ts_status st = dw ? weight_grad(g, dt, x, dout, dw) : TS_OK;
    if (!st && dx) st = input_grad(g, dt, w, dout, dx);
    return st;
}
