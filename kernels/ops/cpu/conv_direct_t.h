/* conv_direct_t.h - the direct convolution of one dtype (a dtype
 * template, see cpu.h; included by conv_direct.c): the register blocks,
 * the per-image loops and the three passes. */
#include "kernels/ops/cpu/dtype.h"

typedef T FN(vec) __attribute__((vector_size(TS_VEC_BYTES)));

/* An input element of a padded image at element offset off: with PACK_X
 * the image holds each element as a whole vector (XS lanes apart), read
 * as one; else a scalar, broadcast by the multiply. */
enum { FN(XS) = PACK_X ? TS_VEC_BYTES / sizeof(T) : 1 };
#if PACK_X
static inline FN(vec) FN(xload)(const T *x, int64_t off) {
    FN(vec) v;
    memcpy(&v, x + off * FN(XS), sizeof v);
    return v;
}
#else
static inline T FN(xload)(const T *x, int64_t off) { return x[off]; }
#endif

/* One forward block: a run of pixels of an output row times channel
 * vectors, summed over every tap. */
typedef struct {
    const T *x;           /* the block's first pixel in the padded input */
    const int64_t *toff;  /* tap offsets */
    int64_t ntap;
    const T *wt;          /* weights [tap][ld] at the block's first channel */
    int64_t ld;
    const T *bias;        /* at the block's first channel, or NULL */
    T *out;               /* the block's first output */
    int64_t ostride;      /* between output channels */
    int64_t nvalid;       /* channels from the first that exist */
} FN(fwd_args);

/* The forward block of pb pixels x ov channel vectors; inlined with both
 * constant, so the pb x ov accumulators stay in registers. */
static inline __attribute__((always_inline)) void FN(fwd_block)(int pb, int ov, const FN(fwd_args) *a) {
    enum { VL = TS_VEC_BYTES / sizeof(T) };
    FN(vec) acc[PIX_BLOCK][2], b[2];
    for (int v = 0; v < ov; v++) {
        b[v] = (FN(vec)){0};
        if (a->bias) memcpy(&b[v], a->bias + v * VL, TS_VEC_BYTES);
    }
    for (int p = 0; p < pb; p++)
        for (int v = 0; v < ov; v++) acc[p][v] = b[v];
    for (int64_t t = 0; t < a->ntap; t++) {
        const T *xt = a->x + a->toff[t] * FN(XS);
        FN(vec) wv[2];
        for (int v = 0; v < ov; v++) memcpy(&wv[v], a->wt + t * a->ld + v * VL, TS_VEC_BYTES);
        for (int p = 0; p < pb; p++) {
            __typeof__(FN(xload)(xt, 0)) s = FN(xload)(xt, p);
            for (int v = 0; v < ov; v++) acc[p][v] += wv[v] * s;
        }
    }
    for (int v = 0; v < ov; v++)
        for (int l = 0; l < VL && v * VL + l < a->nvalid; l++)
            for (int p = 0; p < pb; p++) a->out[(v * VL + l) * a->ostride + p] = acc[p][v][l];
}

/* The forward block of pix_menu[m] pixels and ov vectors. */
static void FN(fwd_pick)(int m, int ov, const FN(fwd_args) *a) {
    switch (m * 2 + ov - 1) {
    case 0: FN(fwd_block)(PIX_BLOCK, 1, a); break;
    case 1: FN(fwd_block)(PIX_BLOCK, 2, a); break;
    case 2: FN(fwd_block)(4, 1, a); break;
    case 3: FN(fwd_block)(4, 2, a); break;
    case 4: FN(fwd_block)(2, 1, a); break;
    case 5: FN(fwd_block)(2, 2, a); break;
    case 6: FN(fwd_block)(1, 1, a); break;
    default: FN(fwd_block)(1, 2, a); break;
    }
}

/* One weight-gradient block: dw[t * ld + o] += sum over the hout x wout
 * pixels of g[pixel * ld + o] x[toff[t] + oh * wp + ow], for tb taps and
 * ov channel vectors at g and dw. */
typedef struct {
    const T *x;          /* the padded image */
    const int64_t *toff; /* the block's first tap offset */
    const T *g;          /* the transposed output gradient at the block's first channel */
    int64_t ld, hout, wout, wp;
    T *dw;               /* at the block's first tap and channel */
} FN(dw_args);

static inline __attribute__((always_inline)) void FN(dw_block)(int tb, int ov, const FN(dw_args) *a) {
    enum { VL = TS_VEC_BYTES / sizeof(T) };
    FN(vec) acc[TAP_BLOCK][2];
    for (int t = 0; t < tb; t++)
        for (int v = 0; v < ov; v++) memcpy(&acc[t][v], a->dw + t * a->ld + v * VL, TS_VEC_BYTES);
    for (int64_t oh = 0; oh < a->hout; oh++) {
        const T *xr = a->x + oh * a->wp * FN(XS), *gr = a->g + oh * a->wout * a->ld;
        for (int64_t ow = 0; ow < a->wout; ow++) {
            FN(vec) gv[2];
            for (int v = 0; v < ov; v++) memcpy(&gv[v], gr + ow * a->ld + v * VL, TS_VEC_BYTES);
            const T *xp = xr + ow * FN(XS);
            for (int t = 0; t < tb; t++) {
                __typeof__(FN(xload)(xp, 0)) s = FN(xload)(xp, a->toff[t]);
                for (int v = 0; v < ov; v++) acc[t][v] += gv[v] * s;
            }
        }
    }
    for (int t = 0; t < tb; t++)
        for (int v = 0; v < ov; v++) memcpy(a->dw + t * a->ld + v * VL, &acc[t][v], TS_VEC_BYTES);
}

/* The weight-gradient block of tap_menu[m] taps and ov vectors. */
static void FN(dw_pick)(int m, int ov, const FN(dw_args) *a) {
    switch (m * 2 + ov - 1) {
    case 0: FN(dw_block)(TAP_BLOCK, 1, a); break;
    case 1: FN(dw_block)(TAP_BLOCK, 2, a); break;
    case 2: FN(dw_block)(4, 1, a); break;
    case 3: FN(dw_block)(4, 2, a); break;
    case 4: FN(dw_block)(1, 1, a); break;
    default: FN(dw_block)(1, 2, a); break;
    }
}

/* dst [cin][hp][wp] = src [cin][hin][win] with pc's zero padding (with
 * PACK_X each element repeated over a vector). */
static void FN(pad)(const plane *pc, const T *src, T *dst) {
    memset(dst, 0, sizeof(T) * (size_t)padded(pc, sizeof(T)));
    for (int64_t c = 0; c < pc->cin; c++)
        for (int64_t h = 0; h < pc->hin; h++) {
            T *d = dst + ((c * pc->hp + h + pc->ph) * pc->wp + pc->pw) * FN(XS);
            const T *s = src + (c * pc->hin + h) * pc->win;
            if (FN(XS) == 1) memcpy(d, s, sizeof(T) * (size_t)pc->win);
            else
                for (int64_t w = 0; w < pc->win; w++)
                    for (int l = 0; l < FN(XS); l++) d[w * FN(XS) + l] = s[w];
        }
}

/* out [cout][hout][wout] of one padded image xp: each row covered by pixel
 * blocks from the menu, the channels by blocks of two vectors (one for an
 * odd last vector). */
static void FN(plane_forward)(const plane *pc, const T *xp, const T *wt, const T *bias, T *out) {
    enum { VL = TS_VEC_BYTES / sizeof(T) };
    int64_t L = pc->hout * pc->wout;
    for (int64_t oh = 0; oh < pc->hout; oh++)
        for (int64_t ob = 0; ob < pc->cout;) {
            int ov = pc->cpad - ob >= 2 * VL ? 2 : 1;
            for (int64_t ow = 0, m = 0; ow < pc->wout; ow += pix_menu[m]) {
                while (pix_menu[m] > pc->wout - ow) m++;
                FN(fwd_args) a = {xp + (oh * pc->wp + ow) * FN(XS), pc->toff, pc->ntap, wt + ob, pc->cpad, bias ? bias + ob : NULL,
                                  out + ob * L + oh * pc->wout + ow, L, pc->cout - ob};
                FN(fwd_pick)((int)m, ov, &a);
            }
            ob += ov * VL;
        }
}

/* out [n][cout][hout][wout] for the n images in [n][cin][hin][win], one
 * image per thread at a time; xp holds one padded image per thread. */
static void FN(planes_forward)(const plane *pc, int64_t n, const T *in, const T *wt, const T *bias, T *out, T *xp) {
    int64_t per_in = pc->cin * pc->hin * pc->win, per_out = pc->cout * pc->hout * pc->wout;
    int64_t per_pad = padded(pc, sizeof(T));
#pragma omp parallel if (n * per_out * pc->ntap > DIRECT_OMP_MIN)
    {
        T *mine = xp + omp_get_thread_num() * per_pad;
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n; i++) {
            FN(pad)(pc, in + i * per_in, mine);
            FN(plane_forward)(pc, mine, wt, bias, out + i * per_out);
        }
    }
}

/* The weight gradient of taps [t0, t1) of one padded image xp and its
 * output gradient gt [hout * wout][cpad], accumulated into part
 * [ntap][cpad]. */
static void FN(plane_dw)(const plane *pc, const T *xp, const T *gt, int64_t t0, int64_t t1, T *part) {
    enum { VL = TS_VEC_BYTES / sizeof(T) };
    for (int64_t ob = 0; ob < pc->cout;) {
        int ov = pc->cpad - ob >= 2 * VL ? 2 : 1;
        for (int64_t t = t0, m = 0; t < t1; t += tap_menu[m]) {
            while (tap_menu[m] > t1 - t) m++;
            FN(dw_args) a = {xp, pc->toff + t, gt + ob, pc->cpad, pc->hout, pc->wout, pc->wp, part + t * pc->cpad + ob};
            FN(dw_pick)((int)m, ov, &a);
        }
        ob += ov * VL;
    }
}

/* dw (PyTorch's [O][C][KH][KW]) = sum over images, by image groups (see
 * conv_direct.c). The work items are (group, chunk of taps): with fewer
 * groups than threads each group's taps are split too (each item pads and
 * transposes its images itself); every (tap, channel) sum still runs over
 * the same pixels in the same order, so the split does not change the
 * result. scr holds the partials, then per thread one padded image and
 * one transposed output gradient. */
static void FN(weight_grad)(const plane *pc, int64_t n, int64_t groups, int64_t nthr, const T *x, const T *dout,
                            T *dw, T *scr) {
    int64_t L = pc->hout * pc->wout, per_in = pc->cin * pc->hin * pc->win, per_out = pc->cout * L;
    int64_t part_n = pc->ntap * pc->cpad, per_thr = padded(pc, sizeof(T)) + L * pc->cpad;
    int64_t blocks = (pc->ntap + TAP_BLOCK - 1) / TAP_BLOCK, chunks = (nthr + groups - 1) / groups;
    if (chunks > blocks) chunks = blocks;
    T *parts = scr;
#pragma omp parallel if (n * per_out * pc->ntap > DIRECT_OMP_MIN)
    {
        T *xp = scr + groups * part_n + omp_get_thread_num() * per_thr, *gt = xp + padded(pc, sizeof(T));
#pragma omp for schedule(static)
        for (int64_t item = 0; item < groups * chunks; item++) {
            int64_t gi = item / chunks, c = item % chunks;
            int64_t t0 = c * blocks / chunks * TAP_BLOCK, t1 = (c + 1) * blocks / chunks * TAP_BLOCK;
            if (t1 > pc->ntap) t1 = pc->ntap;
            T *part = parts + gi * part_n;
            memset(part + t0 * pc->cpad, 0, sizeof(T) * (size_t)((t1 - t0) * pc->cpad));
            for (int64_t i = gi * n / groups; i < (gi + 1) * n / groups; i++) {
                FN(pad)(pc, x + i * per_in, xp);
                const T *d = dout + i * per_out;
                for (int64_t l = 0; l < L; l++) {
                    for (int64_t o = 0; o < pc->cout; o++) gt[l * pc->cpad + o] = d[o * L + l];
                    for (int64_t o = pc->cout; o < pc->cpad; o++) gt[l * pc->cpad + o] = 0;
                }
                FN(plane_dw)(pc, xp, gt, t0, t1, part);
            }
        }
#pragma omp for schedule(static)
        for (int64_t t = 0; t < pc->ntap; t++)
            for (int64_t o = 0; o < pc->cout; o++) {
                T s = 0;
                for (int64_t gi = 0; gi < groups; gi++) s += parts[gi * part_n + t * pc->cpad + o];
                dw[o * pc->ntap + t] = s;
            }
    }
}

/* The forward pass: weights to wt [tap][channel], the bias padded, then
 * the images. scr: see ts_conv_direct_forward. */
static void FN(forward)(const ts_conv_geom *g, const plane *pc, const T *x, const T *w, const T *bias, T *out, T *scr) {
    T *wt = scr, *bp = wt + pc->ntap * pc->cpad, *xp = bp + pc->cpad;
    for (int64_t t = 0; t < pc->ntap; t++)
        for (int64_t o = 0; o < pc->cpad; o++) wt[t * pc->cpad + o] = o < g->O ? w[o * pc->ntap + t] : 0;
    for (int64_t o = 0; o < pc->cpad; o++) bp[o] = bias && o < g->O ? bias[o] : 0;
    FN(planes_forward)(pc, g->N, x, wt, bias ? bp : NULL, out, xp);
}

/* The input gradient: the forward loop over the padded output gradient
 * with wt[(o * KH + kh) * KW + kw][c] = w[o][c][KH - 1 - kh][KW - 1 - kw]. */
static void FN(input_grad)(const ts_conv_geom *g, const plane *pc, const T *w, const T *dout, T *dx, T *scr) {
    T *wt = scr, *xp = wt + pc->ntap * pc->cpad;
    for (int64_t o = 0; o < g->O; o++)
        for (int64_t kh = 0; kh < g->KH; kh++)
            for (int64_t kw = 0; kw < g->KW; kw++)
                for (int64_t c = 0; c < pc->cpad; c++)
                    wt[((o * g->KH + kh) * g->KW + kw) * pc->cpad + c] =
                        c < g->C ? w[((o * g->C + c) * g->KH + g->KH - 1 - kh) * g->KW + g->KW - 1 - kw] : 0;
    FN(planes_forward)(pc, g->N, dout, wt, NULL, dx, xp);
}
