/* conv_gemm_t.h - the im2col + GEMM convolution of one dtype (a dtype
 * template, see cpu.h; included by conv_gemm.c).
 *
 * im2col of images [n0, n0 + nb): col[r][s*L + l] = x[n0 + s][c][ih][iw]
 * (0 in the padding); ld = nb*L. col2im: the adjoint, dx[...] = sum of the
 * dcol entries that read it (dx planes of the chunk are overwritten). Each
 * (image, channel) pair owns its rows of col and its plane of x, so both
 * run in parallel over them; stride-1 rows are plain vector loops. */
#include "kernels/ops/cpu/dtype.h"

static void FN(im2col)(const ts_conv_geom *g, const T *x, int64_t n0, int64_t nb, T *col) {
    int64_t L = g->Ho * g->Wo, ld = nb * L, work = nb * g->C;
#pragma omp parallel for schedule(static) if (work * g->KH * g->KW * L > TS_PAR_MIN)
    for (int64_t p = 0; p < work; p++) {
        int64_t s = p / g->C, c = p % g->C;
        const T *xp = x + ((n0 + s) * g->C + c) * g->H * g->W;
        for (int64_t kh = 0; kh < g->KH; kh++)
            for (int64_t kw = 0; kw < g->KW; kw++) {
                T *row = col + ((c * g->KH + kh) * g->KW + kw) * ld + s * L;
                int64_t lo, hi, off = kw * g->dw - g->pw;
                valid_range(kw, g->sw, g->pw, g->dw, g->W, g->Wo, &lo, &hi);
                for (int64_t oh = 0; oh < g->Ho; oh++) {
                    T *r = row + oh * g->Wo;
                    int64_t ih = oh * g->sh - g->ph + kh * g->dh;
                    if (ih < 0 || ih >= g->H || lo >= hi) {
                        memset(r, 0, sizeof(T) * (size_t)g->Wo);
                        continue;
                    }
                    const T *xr = xp + ih * g->W + off;
                    for (int64_t ow = 0; ow < lo; ow++) r[ow] = 0;
                    if (g->sw == 1) {
#pragma omp simd
                        for (int64_t ow = lo; ow < hi; ow++) r[ow] = xr[ow];
                    } else {
                        for (int64_t ow = lo; ow < hi; ow++) r[ow] = xr[ow * g->sw];
                    }
                    for (int64_t ow = hi; ow < g->Wo; ow++) r[ow] = 0;
                }
            }
    }
}

static void FN(col2im)(const ts_conv_geom *g, const T *col, int64_t n0, int64_t nb, T *dx) {
    int64_t L = g->Ho * g->Wo, ld = nb * L, work = nb * g->C;
#pragma omp parallel for schedule(static) if (work * g->KH * g->KW * L > TS_PAR_MIN)
    for (int64_t p = 0; p < work; p++) {
        int64_t s = p / g->C, c = p % g->C;
        T *xp = dx + ((n0 + s) * g->C + c) * g->H * g->W;
        memset(xp, 0, sizeof(T) * (size_t)(g->H * g->W));
        for (int64_t kh = 0; kh < g->KH; kh++)
            for (int64_t kw = 0; kw < g->KW; kw++) {
                const T *row = col + ((c * g->KH + kh) * g->KW + kw) * ld + s * L;
                int64_t lo, hi, off = kw * g->dw - g->pw;
                valid_range(kw, g->sw, g->pw, g->dw, g->W, g->Wo, &lo, &hi);
                for (int64_t oh = 0; oh < g->Ho; oh++) {
                    int64_t ih = oh * g->sh - g->ph + kh * g->dh;
                    if (ih < 0 || ih >= g->H) continue;
                    const T *r = row + oh * g->Wo;
                    T *xr = xp + ih * g->W + off;
                    if (g->sw == 1) {
#pragma omp simd
                        for (int64_t ow = lo; ow < hi; ow++) xr[ow] += r[ow];
                    } else {
                        for (int64_t ow = lo; ow < hi; ow++) xr[ow * g->sw] += r[ow];
                    }
                }
            }
    }
}

/* out[n0 + s][o][l] = y[o][s*L + l] (+ bias[o]): the chunk's GEMM result
 * moved to NCHW. */
static void FN(scatter_out)(const ts_conv_geom *g, const T *y, const T *bias, int64_t n0, int64_t nb, T *out) {
    int64_t L = g->Ho * g->Wo, rows = nb * g->O;
#pragma omp parallel for schedule(static) if (rows * L > TS_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        int64_t s = r / g->O, o = r % g->O;
        const T *src = y + o * nb * L + s * L;
        T *dst = out + ((n0 + s) * g->O + o) * L, b = bias ? bias[o] : (T)0;
        for (int64_t l = 0; l < L; l++) dst[l] = src[l] + b;
    }
}

/* gt[o][s*L + l] = dout[n0 + s][o][l]: the chunk's output gradient as a
 * GEMM operand. */
static void FN(gather_grad)(const ts_conv_geom *g, const T *dout, int64_t n0, int64_t nb, T *gt) {
    int64_t L = g->Ho * g->Wo, rows = nb * g->O;
#pragma omp parallel for schedule(static) if (rows * L > TS_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        int64_t s = r / g->O, o = r % g->O;
        memcpy(gt + o * nb * L + s * L, dout + ((n0 + s) * g->O + o) * L, sizeof(T) * (size_t)L);
    }
}

/* out = conv(x, w) + bias, chunk by chunk; work holds the columns and the
 * GEMM result of one chunk. */
static void FN(conv_gemm_forward)(const ts_conv_geom *g, const T *x, const T *w, const T *bias, T *out, T *work) {
    int64_t L = g->Ho * g->Wo, CKK = g->C * g->KH * g->KW, nb = chunk_images(g, sizeof(T));
    for (int64_t n0 = 0; n0 < g->N; n0 += nb) {
        int64_t m = g->N - n0 < nb ? g->N - n0 : nb;
        T *col = work, *y = work + CKK * m * L;
        FN(im2col)(g, x, n0, m, col);
        gemm(DT, false, false, g->O, m * L, CKK, 1, w, CKK, col, m * L, 0, y, m * L);
        FN(scatter_out)(g, y, bias, n0, m, out);
    }
}

/* dw = sum over images of dout_n col_n^T (when dw), dx = col2im(w^T dout_n)
 * (when dx), chunk by chunk; work as in the forward. */
static void FN(conv_gemm_backward)(const ts_conv_geom *g, const T *x, const T *w, const T *dout, T *dw, T *dx,
                                   T *work) {
    int64_t L = g->Ho * g->Wo, CKK = g->C * g->KH * g->KW, nb = chunk_images(g, sizeof(T));
    for (int64_t n0 = 0; n0 < g->N; n0 += nb) {
        int64_t m = g->N - n0 < nb ? g->N - n0 : nb;
        T *col = work, *gt = work + CKK * m * L;
        FN(gather_grad)(g, dout, n0, m, gt);
        if (dw) {
            FN(im2col)(g, x, n0, m, col);
            gemm(DT, false, true, g->O, CKK, m * L, 1, gt, m * L, col, m * L, n0 ? 1 : 0, dw, CKK);
        }
        if (dx) {
            gemm(DT, true, false, CKK, m * L, g->O, 1, w, CKK, gt, m * L, 0, col, m * L);
            FN(col2im)(g, col, n0, m, dx);
        }
    }
}
