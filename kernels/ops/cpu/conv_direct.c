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
 * swapped.
 *
 * Threads: forward and input gradient split the images; the weight
 * gradient splits the batch into a fixed number of image groups (set by
 * the geometry alone, so the sums do not depend on the thread count), each
 * summed into its own partial, the partials added in group order; with
 * fewer groups than threads the taps of each group are split as well.
 */
#include <omp.h>
#include <string.h>

#include "kernels/ops/cpu/conv_cpu.h"

/* Vector width, and the register blocks its register file affords: with
 * 32 vector registers a block of 14 pixels x 2 vectors (28 accumulators)
 * or 12 taps x 2 vectors; with 16, blocks of 6. */
#if defined(__AVX512F__)
#define VEC_BYTES 64
#elif defined(__AVX__)
#define VEC_BYTES 32
#else
#define VEC_BYTES 16
#endif
#if defined(__AVX512F__) || defined(__aarch64__)
#define PIX_BLOCK 14
#define TAP_BLOCK 12
#else
#define PIX_BLOCK 6
#define TAP_BLOCK 6
#endif

typedef float vec_float __attribute__((vector_size(VEC_BYTES)));
typedef double vec_double __attribute__((vector_size(VEC_BYTES)));

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

bool ts_conv_direct_fits(const ts_conv_geom *g) {
    return g->sh == 1 && g->sw == 1 && g->ph <= g->dh * (g->KH - 1) && g->pw <= g->dw * (g->KW - 1);
}

/* toff[t] for t = (c * KH + kh) * KW + kw over cin channels of hp x wp. */
static void tap_offsets(int64_t cin, const ts_conv_geom *g, int64_t hp, int64_t wp, int64_t *toff) {
    for (int64_t c = 0; c < cin; c++)
        for (int64_t kh = 0; kh < g->KH; kh++)
            for (int64_t kw = 0; kw < g->KW; kw++)
                toff[(c * g->KH + kh) * g->KW + kw] = (c * hp + kh * g->dh) * wp + kw * g->dw;
}

/* A scratch tensor of n elements of dt; NULL with a conv2d error if the
 * allocator fails. */
static ts_tensor *scratch(ts_dtype dt, int64_t n) {
    ts_tensor *t = ts_tensor_empty(dt, 1, (int64_t[]){n > 0 ? n : 1});
    if (!t) ts_error(TS_ERR_MEMORY, "conv2d: out of memory for %lld scratch elements", (long long)n);
    return t;
}

/* The forward block kernel of PB pixels x OV channel vectors (see above). */
#define FWD_BLOCK(T, PB, OV)                                                                               \
    static void fwd_##T##_##PB##_##OV(const T *x, const int64_t *toff, int64_t ntap, const T *wt, int64_t ld,  \
                                      const T *bias, T *out, int64_t ostride, int64_t nvalid) {            \
        vec_##T acc[PB][OV], b[OV];                                                                        \
        for (int v = 0; v < OV; v++) {                                                                     \
            b[v] = (vec_##T){0};                                                                           \
            if (bias) memcpy(&b[v], bias + v * VL_##T, VEC_BYTES);                                         \
        }                                                                                                  \
        for (int p = 0; p < PB; p++)                                                                       \
            for (int v = 0; v < OV; v++) acc[p][v] = b[v];                                                 \
        for (int64_t t = 0; t < ntap; t++) {                                                               \
            const T *xt = x + toff[t];                                                                     \
            vec_##T wv[OV];                                                                                \
            for (int v = 0; v < OV; v++) memcpy(&wv[v], wt + t * ld + v * VL_##T, VEC_BYTES);              \
            for (int p = 0; p < PB; p++) {                                                                 \
                T s = xt[p];                                                                               \
                for (int v = 0; v < OV; v++) acc[p][v] += wv[v] * s;                                       \
            }                                                                                              \
        }                                                                                                  \
        for (int v = 0; v < OV; v++)                                                                       \
            for (int l = 0; l < VL_##T && v * VL_##T + l < nvalid; l++)                                    \
                for (int p = 0; p < PB; p++) out[(v * VL_##T + l) * ostride + p] = acc[p][v][l];           \
    }

/* The weight-gradient block kernel: dw[t * ld + o] += sum over the
 * hout x wout pixels of g[pixel * ld + o] x[toff[t] + oh * wp + ow] for TB
 * taps and the OV channel vectors at g and dw. */
#define DW_BLOCK(T, TB, OV)                                                                                \
    static void dw_##T##_##TB##_##OV(const T *x, const int64_t *toff, const T *g, int64_t ld, int64_t hout, \
                                     int64_t wout, int64_t wp, T *dw) {                                    \
        vec_##T acc[TB][OV];                                                                               \
        for (int t = 0; t < TB; t++)                                                                       \
            for (int v = 0; v < OV; v++) memcpy(&acc[t][v], dw + t * ld + v * VL_##T, VEC_BYTES);          \
        for (int64_t oh = 0; oh < hout; oh++) {                                                            \
            const T *xr = x + oh * wp, *gr = g + oh * wout * ld;                                           \
            for (int64_t ow = 0; ow < wout; ow++) {                                                        \
                vec_##T gv[OV];                                                                            \
                for (int v = 0; v < OV; v++) memcpy(&gv[v], gr + ow * ld + v * VL_##T, VEC_BYTES);         \
                const T *xp = xr + ow;                                                                     \
                for (int t = 0; t < TB; t++) {                                                             \
                    T s = xp[toff[t]];                                                                     \
                    for (int v = 0; v < OV; v++) acc[t][v] += gv[v] * s;                                   \
                }                                                                                          \
            }                                                                                              \
        }                                                                                                  \
        for (int t = 0; t < TB; t++)                                                                       \
            for (int v = 0; v < OV; v++) memcpy(dw + t * ld + v * VL_##T, &acc[t][v], VEC_BYTES);          \
    }

/* The block kernels of one dtype, tables indexed [OV - 1][menu entry], and
 * the drivers. */
#define DIRECT_PATH(T)                                                                                     \
    enum { VL_##T = VEC_BYTES / sizeof(T) };                                                               \
    FWD_BLOCK(T, PIX_BLOCK, 1) FWD_BLOCK(T, 4, 1) FWD_BLOCK(T, 2, 1) FWD_BLOCK(T, 1, 1)                    \
    FWD_BLOCK(T, PIX_BLOCK, 2) FWD_BLOCK(T, 4, 2) FWD_BLOCK(T, 2, 2) FWD_BLOCK(T, 1, 2)                    \
    DW_BLOCK(T, TAP_BLOCK, 1) DW_BLOCK(T, 4, 1) DW_BLOCK(T, 1, 1)                                          \
    DW_BLOCK(T, TAP_BLOCK, 2) DW_BLOCK(T, 4, 2) DW_BLOCK(T, 1, 2)                                          \
    typedef void (*fwd_fn_##T)(const T *, const int64_t *, int64_t, const T *, int64_t, const T *, T *,     \
                               int64_t, int64_t);                                                          \
    typedef void (*dw_fn_##T)(const T *, const int64_t *, const T *, int64_t, int64_t, int64_t, int64_t,    \
                              T *);                                                                        \
    static const fwd_fn_##T fwd_table_##T[2][4] = {                                                        \
        {fwd_##T##_PIX_BLOCK_1, fwd_##T##_4_1, fwd_##T##_2_1, fwd_##T##_1_1},                              \
        {fwd_##T##_PIX_BLOCK_2, fwd_##T##_4_2, fwd_##T##_2_2, fwd_##T##_1_2}};                             \
    static const dw_fn_##T dw_table_##T[2][3] = {{dw_##T##_TAP_BLOCK_1, dw_##T##_4_1, dw_##T##_1_1},        \
                                                 {dw_##T##_TAP_BLOCK_2, dw_##T##_4_2, dw_##T##_1_2}};      \
    /* dst [cin][hp][wp] = src [cin][hin][win] with pc's zero padding. */                                 \
    static void pad_##T(const plane *pc, const T *src, T *dst) {                                           \
        memset(dst, 0, sizeof(T) * (size_t)(pc->cin * pc->hp * pc->wp));                                   \
        for (int64_t c = 0; c < pc->cin; c++)                                                              \
            for (int64_t h = 0; h < pc->hin; h++)                                                          \
                memcpy(dst + (c * pc->hp + h + pc->ph) * pc->wp + pc->pw, src + (c * pc->hin + h) * pc->win,  \
                       sizeof(T) * (size_t)pc->win);                                                       \
    }                                                                                                      \
    /* out [cout][hout][wout] of one padded image xp: each row covered by pixel blocks from the menu,      \
     * the channels by blocks of two vectors (one for an odd last vector). */                             \
    static void plane_forward_##T(const plane *pc, const T *xp, const T *wt, const T *bias, T *out) {      \
        int64_t L = pc->hout * pc->wout;                                                                   \
        for (int64_t oh = 0; oh < pc->hout; oh++)                                                          \
            for (int64_t ob = 0; ob < pc->cout;) {                                                         \
                int ov = pc->cpad - ob >= 2 * VL_##T ? 2 : 1;                                              \
                for (int64_t ow = 0, m = 0; ow < pc->wout; ow += pix_menu[m]) {                            \
                    while (pix_menu[m] > pc->wout - ow) m++;                                               \
                    fwd_table_##T[ov - 1][m](xp + oh * pc->wp + ow, pc->toff, pc->ntap, wt + ob, pc->cpad,  \
                                             bias ? bias + ob : NULL, out + ob * L + oh * pc->wout + ow, L,  \
                                             pc->cout - ob);                                               \
                }                                                                                          \
                ob += ov * VL_##T;                                                                         \
            }                                                                                              \
    }                                                                                                      \
    /* out [n][cout][hout][wout] for the n images in [n][cin][hin][win], one image per thread at a time;  \
     * xp holds one padded image per thread. */                                                            \
    static void planes_forward_##T(const plane *pc, int64_t n, const T *in, const T *wt, const T *bias,    \
                                   T *out, T *xp) {                                                        \
        int64_t per_in = pc->cin * pc->hin * pc->win, per_out = pc->cout * pc->hout * pc->wout;             \
        int64_t per_pad = pc->cin * pc->hp * pc->wp;                                                       \
        _Pragma("omp parallel if (n * per_out * pc->ntap > DIRECT_OMP_MIN)") {                             \
            T *mine = xp + omp_get_thread_num() * per_pad;                                                 \
            _Pragma("omp for schedule(static)") for (int64_t i = 0; i < n; i++) {                          \
                pad_##T(pc, in + i * per_in, mine);                                                        \
                plane_forward_##T(pc, mine, wt, bias, out + i * per_out);                                  \
            }                                                                                              \
        }                                                                                                  \
    }                                                                                                      \
    /* The weight gradient of taps [t0, t1) of one padded image xp and its output gradient gt             \
     * [hout * wout][cpad], accumulated into part [ntap][cpad]. */                                         \
    static void plane_dw_##T(const plane *pc, const T *xp, const T *gt, int64_t t0, int64_t t1, T *part) { \
        for (int64_t ob = 0; ob < pc->cout;) {                                                             \
            int ov = pc->cpad - ob >= 2 * VL_##T ? 2 : 1;                                                  \
            for (int64_t t = t0, m = 0; t < t1; t += tap_menu[m]) {                                        \
                while (tap_menu[m] > t1 - t) m++;                                                          \
                dw_table_##T[ov - 1][m](xp, pc->toff + t, gt + ob, pc->cpad, pc->hout, pc->wout, pc->wp,   \
                                        part + t * pc->cpad + ob);                                         \
            }                                                                                              \
            ob += ov * VL_##T;                                                                             \
        }                                                                                                  \
    }                                                                                                      \
    /* dw (PyTorch's [O][C][KH][KW]) = sum over images, by image groups (see the top of the file). The    \
     * work items are (group, chunk of taps): with fewer groups than threads each group's taps are split \
     * too (each item pads and transposes its images itself); every (tap, channel) sum still runs over   \
     * the same pixels in the same order, so the split does not change the result. scratch holds the     \
     * partials, then per thread one padded image and one transposed output gradient. */                  \
    static void weight_grad_##T(const plane *pc, int64_t n, int64_t groups, int64_t nthr, const T *x,       \
                                const T *dout, T *dw, T *scr) {                                            \
        int64_t L = pc->hout * pc->wout, per_in = pc->cin * pc->hin * pc->win, per_out = pc->cout * L;     \
        int64_t part_n = pc->ntap * pc->cpad, per_thr = pc->cin * pc->hp * pc->wp + L * pc->cpad;         \
        int64_t blocks = (pc->ntap + TAP_BLOCK - 1) / TAP_BLOCK, chunks = (nthr + groups - 1) / groups;    \
        if (chunks > blocks) chunks = blocks;                                                              \
        T *parts = scr;                                                                                    \
        _Pragma("omp parallel if (n * per_out * pc->ntap > DIRECT_OMP_MIN)") {                             \
            T *xp = scr + groups * part_n + omp_get_thread_num() * per_thr, *gt = xp + pc->cin * pc->hp * pc->wp; \
            _Pragma("omp for schedule(static)") for (int64_t item = 0; item < groups * chunks; item++) {   \
                int64_t gi = item / chunks, c = item % chunks;                                             \
                int64_t t0 = c * blocks / chunks * TAP_BLOCK, t1 = (c + 1) * blocks / chunks * TAP_BLOCK;  \
                if (t1 > pc->ntap) t1 = pc->ntap;                                                          \
                T *part = parts + gi * part_n;                                                             \
                memset(part + t0 * pc->cpad, 0, sizeof(T) * (size_t)((t1 - t0) * pc->cpad));              \
                for (int64_t i = gi * n / groups; i < (gi + 1) * n / groups; i++) {                        \
                    pad_##T(pc, x + i * per_in, xp);                                                       \
                    const T *d = dout + i * per_out;                                                       \
                    for (int64_t l = 0; l < L; l++) {                                                      \
                        for (int64_t o = 0; o < pc->cout; o++) gt[l * pc->cpad + o] = d[o * L + l];         \
                        for (int64_t o = pc->cout; o < pc->cpad; o++) gt[l * pc->cpad + o] = 0;             \
                    }                                                                                      \
                    plane_dw_##T(pc, xp, gt, t0, t1, part);                                                \
                }                                                                                          \
            }                                                                                              \
            _Pragma("omp for schedule(static)") for (int64_t t = 0; t < pc->ntap; t++)                     \
                for (int64_t o = 0; o < pc->cout; o++) {                                                   \
                    T s = 0;                                                                               \
                    for (int64_t gi = 0; gi < groups; gi++) s += parts[gi * part_n + t * pc->cpad + o];    \
                    dw[o * pc->ntap + t] = s;                                                              \
                }                                                                                          \
        }                                                                                                  \
    }                                                                                                      \
    /* The forward pass: weights to wt [tap][channel], the bias padded, then the images. scr: see     \
     * ts_conv_direct_forward. */                                                                         \
    static void forward_##T(const ts_conv_geom *g, const plane *pc, const T *x, const T *w, const T *bias, \
                            T *out, T *scr) {                                                              \
        T *wt = scr, *bp = wt + pc->ntap * pc->cpad, *xp = bp + pc->cpad;                                  \
        for (int64_t t = 0; t < pc->ntap; t++)                                                             \
            for (int64_t o = 0; o < pc->cpad; o++) wt[t * pc->cpad + o] = o < g->O ? w[o * pc->ntap + t] : 0; \
        for (int64_t o = 0; o < pc->cpad; o++) bp[o] = bias && o < g->O ? bias[o] : 0;                    \
        planes_forward_##T(pc, g->N, x, wt, bias ? bp : NULL, out, xp);                                    \
    }                                                                                                      \
    /* The input gradient: the forward loop over the padded output gradient with                        \
     * wt[(o * KH + kh) * KW + kw][c] = w[o][c][KH - 1 - kh][KW - 1 - kw]. */                              \
    static void input_grad_##T(const ts_conv_geom *g, const plane *pc, const T *w, const T *dout, T *dx,  \
                               T *scr) {                                                                   \
        T *wt = scr, *xp = wt + pc->ntap * pc->cpad;                                                       \
        for (int64_t o = 0; o < g->O; o++)                                                                 \
            for (int64_t kh = 0; kh < g->KH; kh++)                                                         \
                for (int64_t kw = 0; kw < g->KW; kw++)                                                     \
                    for (int64_t c = 0; c < pc->cpad; c++)                                                 \
                        wt[((o * g->KH + kh) * g->KW + kw) * pc->cpad + c] =                               \
                            c < g->C ? w[((o * g->C + c) * g->KH + g->KH - 1 - kh) * g->KW + g->KW - 1 - kw] : 0; \
        planes_forward_##T(pc, g->N, dout, wt, NULL, dx, xp);                                              \
    }

DIRECT_PATH(float)
DIRECT_PATH(double)

#define DISPATCH(dt, fn, ...) ((dt) == TS_F32 ? fn##_float(__VA_ARGS__) : fn##_double(__VA_ARGS__))

/* c rounded up to whole vectors of elem-byte lanes. */
static int64_t round_lanes(int64_t c, size_t elem) {
    int64_t vl = VEC_BYTES / (int64_t)elem;
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

/* The tap offsets of pc as an i64 tensor (pc->toff points into it); NULL
 * with a conv2d error if the allocator fails. */
static ts_tensor *offsets(const ts_conv_geom *g, plane *pc) {
    ts_tensor *t = ts_tensor_empty(TS_I64, 1, (int64_t[]){pc->ntap});
    if (!t) {
        ts_error(TS_ERR_MEMORY, "conv2d: out of memory for %lld tap offsets", (long long)pc->ntap);
        return NULL;
    }
    tap_offsets(pc->cin, g, pc->hp, pc->wp, ts_tensor_data(t));
    pc->toff = ts_tensor_data(t);
    return t;
}

/* Scratch: the transposed weights, the padded bias, one padded image per
 * thread. */
ts_status ts_conv_direct_forward(const ts_conv_geom *g, ts_dtype dt, const void *x, const void *w, const void *bias,
                                 void *out) {
    size_t es = ts_dtype_size(dt);
    plane pc = forward_plane(g, es);
    ts_tensor *toff = offsets(g, &pc);
    ts_tensor *scr = toff ? scratch(dt, pc.ntap * pc.cpad + pc.cpad + omp_get_max_threads() * pc.cin * pc.hp * pc.wp)
                          : NULL;
    if (scr) DISPATCH(dt, forward, g, &pc, x, w, bias, out, ts_tensor_data(scr));
    ts_tensor_release(toff);
    ts_tensor_release(scr);
    return scr ? TS_OK : ts_last_status();
}

/* Weight-gradient scratch: the group partials, then per thread a padded
 * image and a transposed output gradient; input-gradient scratch: the
 * flipped weights and one padded output gradient per thread. */
ts_status ts_conv_direct_backward(const ts_conv_geom *g, ts_dtype dt, const void *x, const void *w, const void *dout,
                                  void *dw, void *dx) {
    size_t es = ts_dtype_size(dt);
    int64_t nthr = omp_get_max_threads();
    if (dw) {
        plane pc = forward_plane(g, es);
        int64_t part = pc.ntap * pc.cpad, groups = g->N < DW_GROUPS ? g->N : DW_GROUPS;
        while (groups > 1 && groups * part * (int64_t)es > DW_PARTIAL_BYTES) groups--;
        ts_tensor *toff = offsets(g, &pc);
        ts_tensor *scr =
            toff ? scratch(dt, groups * part + nthr * (pc.cin * pc.hp * pc.wp + pc.hout * pc.wout * pc.cpad)) : NULL;
        if (scr) DISPATCH(dt, weight_grad, &pc, g->N, groups, nthr, x, dout, dw, ts_tensor_data(scr));
        ts_tensor_release(toff);
        ts_tensor_release(scr);
        if (!scr) return ts_last_status();
    }
    if (dx) {
        plane pc = input_grad_plane(g, es);
        ts_tensor *toff = offsets(g, &pc);
        ts_tensor *scr = toff ? scratch(dt, pc.ntap * pc.cpad + nthr * pc.cin * pc.hp * pc.wp) : NULL;
        if (scr) DISPATCH(dt, input_grad, g, &pc, w, dout, dx, ts_tensor_data(scr));
        ts_tensor_release(toff);
        ts_tensor_release(scr);
        if (!scr) return ts_last_status();
    }
    return TS_OK;
}
