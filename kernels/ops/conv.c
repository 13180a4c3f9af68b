/* conv.c - conv2d via chunked im2col + GEMM, backward via GEMM + col2im. */
#include "kernels/ops/conv.h"

#include <cblas.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/autograd.h"

/* `omp simd` is a hint: sanitizer and -O1 builds of clang cannot always
 * vectorize and would otherwise turn that into an error under -Werror. */
#ifdef __clang__
#pragma clang diagnostic ignored "-Wpass-failed"
#endif

/* Sizes of one convolution. */
typedef struct {
    int64_t N, C, H, W, O, KH, KW, sh, sw, ph, pw, dh, dw, Ho, Wo;
} conv_geom;

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
static int64_t chunk_images(const conv_geom *g, size_t elem) {
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
    static void im2col_##T(const conv_geom *g, const T *x, int64_t n0, int64_t nb, T *col) {             \
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
    static void col2im_##T(const conv_geom *g, const T *col, int64_t n0, int64_t nb, T *dx) {            \
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
    static void scatter_out_##T(const conv_geom *g, const T *y, const T *bias, int64_t n0, int64_t nb,   \
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
    static void gather_grad_##T(const conv_geom *g, const T *dout, int64_t n0, int64_t nb, T *gt) {      \
        int64_t L = g->Ho * g->Wo, rows = nb * g->O;                                                     \
        _Pragma("omp parallel for schedule(static) if (rows * L > CONV_OMP_MIN)")                        \
        for (int64_t r = 0; r < rows; r++) {                                                             \
            int64_t s = r / g->O, o = r % g->O;                                                          \
            memcpy(gt + o * nb * L + s * L, dout + ((n0 + s) * g->O + o) * L, sizeof(T) * (size_t)L);   \
        }                                                                                                \
    }                                                                                                    \
    /* db[o] = sum over n, l of dout[n][o][l] */                                                         \
    static void bias_grad_##T(const conv_geom *g, const T *dout, T *db) {                                \
        int64_t L = g->Ho * g->Wo;                                                                       \
        _Pragma("omp parallel for schedule(static) if (g->N * g->O * L > CONV_OMP_MIN)")                 \
        for (int64_t o = 0; o < g->O; o++) {                                                             \
            double s = 0; /* per-image sums in T (vectorised), their total in double */              \
            for (int64_t n = 0; n < g->N; n++) {                                                         \
                const T *r = dout + (n * g->O + o) * L;                                                  \
                T sn = 0;                                                                                \
                _Pragma("omp simd reduction(+ : sn)") for (int64_t l = 0; l < L; l++) sn += r[l];        \
                s += sn;                                                                                 \
            }                                                                                            \
            db[o] = (T)s;                                                                                \
        }                                                                                                \
    }                                                                                                    \
    /* out = conv(x, w) + bias, chunk by chunk; work holds the columns and                             \
     * the GEMM result of one chunk. */                                                                  \
    static void conv_fwd_##T(const conv_geom *g, const T *x, const T *w, const T *bias, T *out, T *work) { \
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
    static void conv_bwd_##T(const conv_geom *g, const T *x, const T *w, const T *dout, T *dw, T *dx,    \
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

/* Elements of the per-chunk work buffer: columns + GEMM result of a chunk. */
static int64_t work_elems(const conv_geom *g, size_t elem) {
    int64_t nb = chunk_images(g, elem), L = g->Ho * g->Wo;
    return (g->C * g->KH * g->KW + g->O) * nb * L;
}

ts_conv2d_opts ts_conv2d_default_opts(void) {
    return (ts_conv2d_opts){.stride_h = 1, .stride_w = 1, .pad_h = 0, .pad_w = 0, .dil_h = 1, .dil_w = 1, .groups = 1};
}

/* t itself (retained) when contiguous, else a contiguous copy (no history). */
static ts_tensor *dense(const ts_tensor *t) {
    return ts_tensor_is_contiguous(t) ? ts_tensor_retain((ts_tensor *)t) : ts_tensor_copy_as(t, t->dtype);
}

/* One work buffer (see conv_fwd) for g, as a tensor so the allocator
 * counts it. */
static ts_tensor *work_buffer(const conv_geom *g, ts_dtype dt) {
    return ts_tensor_empty(dt, 1, (int64_t[]){work_elems(g, ts_dtype_size(dt))});
}

static void geom_from_node(const ts_node *n, conv_geom *g) { memcpy(g, n->ctx, sizeof *g); }

/* The input x of the first conv of a network needs no gradient, so no
 * input-gradient GEMM or col2im runs for it. */
static ts_status conv2d_backward(ts_node *n, ts_tensor *grad, ts_tensor **gin) {
    conv_geom g;
    geom_from_node(n, &g);
    ts_tensor *x = n->inputs[0], *w = n->inputs[1];
    bool want_x = ts_node_wants(n, 0), want_w = ts_node_wants(n, 1);
    ts_tensor *gd = dense(grad), *xd = NULL, *wd = NULL, *work = NULL;
    ts_status st = TS_OK;
    if (gd && (want_x || want_w)) {
        xd = want_w ? dense(x) : NULL;
        wd = want_x ? dense(w) : NULL;
        work = (!want_w || xd) && (!want_x || wd) ? work_buffer(&g, x->dtype) : NULL;
        if (work && want_w) gin[1] = ts_tensor_empty(w->dtype, 4, w->shape);
        if (work && want_x) gin[0] = ts_tensor_empty(x->dtype, 4, x->shape);
        if (!work || (want_w && !gin[1]) || (want_x && !gin[0])) st = ts_last_status();
        else
            DISPATCH(x->dtype, conv_bwd, &g, xd ? ts_tensor_data(xd) : NULL, wd ? ts_tensor_data(wd) : NULL,
                     ts_tensor_data(gd), want_w ? ts_tensor_data(gin[1]) : NULL,
                     want_x ? ts_tensor_data(gin[0]) : NULL, ts_tensor_data(work));
    } else if (!gd) {
        st = ts_last_status();
    }
    if (!st && n->n_inputs > 2 && ts_node_wants(n, 2)) {
        gin[2] = ts_tensor_empty(grad->dtype, 1, (int64_t[]){g.O});
        if (gin[2]) DISPATCH(grad->dtype, bias_grad, &g, ts_tensor_data(gd), ts_tensor_data(gin[2]));
        else st = ts_last_status();
    }
    ts_tensor *tmp[] = {gd, xd, wd, work};
    for (size_t i = 0; i < sizeof tmp / sizeof tmp[0]; i++) ts_tensor_release(tmp[i]);
    return st;
}

/* Checks the operands and options and fills g; records the error if bad. */
static ts_status conv_check(const ts_tensor *x, const ts_tensor *w, const ts_tensor *bias, const ts_conv2d_opts *o,
                            conv_geom *g) {
    const char *op = "conv2d";
    if (ts_check_tensor(op, "input", x, TS_FLOATS) || ts_check_tensor(op, "weight", w, TS_FLOATS) ||
        (bias && ts_check_tensor(op, "bias", bias, TS_FLOATS)))
        return ts_last_status();
    if (w->dtype != x->dtype || (bias && bias->dtype != x->dtype))
        return ts_error(TS_ERR_DTYPE, "conv2d: dtypes differ (input %s, weight %s%s%s)", ts_dtype_name(x->dtype),
                        ts_dtype_name(w->dtype), bias ? ", bias " : "", bias ? ts_dtype_name(bias->dtype) : "");
    if (x->ndim != 4 || w->ndim != 4)
        return ts_error(TS_ERR_SHAPE, "conv2d: input %s must be [N,C,H,W] and weight %s [O,C,KH,KW]",
                        ts_shape_str(x), ts_shape_str(w));
    if (w->shape[1] != x->shape[1])
        return ts_error(TS_ERR_SHAPE, "conv2d: input %s has %lld channels but weight %s expects %lld",
                        ts_shape_str(x), (long long)x->shape[1], ts_shape_str(w), (long long)w->shape[1]);
    if (bias && (bias->ndim != 1 || bias->shape[0] != w->shape[0]))
        return ts_error(TS_ERR_SHAPE, "conv2d: bias %s must be [%lld] for weight %s", ts_shape_str(bias),
                        (long long)w->shape[0], ts_shape_str(w));
    if (o->groups != 1)
        return ts_error(TS_ERR_UNSUPPORTED, "conv2d: groups = %lld is not supported (only 1)", (long long)o->groups);
    if (o->stride_h < 1 || o->stride_w < 1 || o->dil_h < 1 || o->dil_w < 1 || o->pad_h < 0 || o->pad_w < 0)
        return ts_error(TS_ERR_VALUE,
                        "conv2d: stride (%lld,%lld) and dilation (%lld,%lld) must be >= 1, padding (%lld,%lld) >= 0",
                        (long long)o->stride_h, (long long)o->stride_w, (long long)o->dil_h, (long long)o->dil_w,
                        (long long)o->pad_h, (long long)o->pad_w);
    *g = (conv_geom){.N = x->shape[0], .C = x->shape[1], .H = x->shape[2], .W = x->shape[3], .O = w->shape[0],
                     .KH = w->shape[2], .KW = w->shape[3], .sh = o->stride_h, .sw = o->stride_w, .ph = o->pad_h,
                     .pw = o->pad_w, .dh = o->dil_h, .dw = o->dil_w};
    int64_t eh = g->dh * (g->KH - 1) + 1, ew = g->dw * (g->KW - 1) + 1;
    int64_t ih = g->H + 2 * g->ph, iw = g->W + 2 * g->pw;
    if (g->KH < 1 || g->KW < 1 || eh > ih || ew > iw)
        return ts_error(TS_ERR_SHAPE,
                        "conv2d: kernel %lldx%lld (dilated %lldx%lld) does not fit input %s padded to %lldx%lld",
                        (long long)g->KH, (long long)g->KW, (long long)eh, (long long)ew, ts_shape_str(x),
                        (long long)ih, (long long)iw);
    g->Ho = (ih - eh) / g->sh + 1;
    g->Wo = (iw - ew) / g->sw + 1;
    return TS_OK;
}

ts_tensor *ts_conv2d(ts_tensor *x, ts_tensor *w, ts_tensor *bias, const ts_conv2d_opts *opts) {
    ts_conv2d_opts defaults = ts_conv2d_default_opts();
    conv_geom g;
    if (conv_check(x, w, bias, opts ? opts : &defaults, &g)) return NULL;
    ts_tensor *xd = dense(x), *wd = dense(w), *bd = bias ? dense(bias) : NULL;
    ts_tensor *work = xd && wd && (!bias || bd) ? work_buffer(&g, x->dtype) : NULL;
    ts_tensor *out = work ? ts_tensor_empty(x->dtype, 4, (int64_t[]){g.N, g.O, g.Ho, g.Wo}) : NULL;
    if (out)
        DISPATCH(x->dtype, conv_fwd, &g, ts_tensor_data(xd), ts_tensor_data(wd), bd ? ts_tensor_data(bd) : NULL,
                 ts_tensor_data(out), ts_tensor_data(work));
    ts_tensor *tmp[] = {xd, wd, bd, work};
    for (size_t i = 0; i < sizeof tmp / sizeof tmp[0]; i++) ts_tensor_release(tmp[i]);
    if (!out) return NULL;
    ts_tensor *in[3] = {x, w, bias};
    ts_node *n = ts_autograd_record(out, "conv2d", conv2d_backward, bias ? 3 : 2, in);
    if (n) {
        n->ctx = malloc(sizeof g);
        if (!n->ctx) {
            ts_tensor_release(out);
            ts_error(TS_ERR_MEMORY, "conv2d: out of memory recording the node");
            return NULL;
        }
        memcpy(n->ctx, &g, sizeof g);
        n->ctx_free = free;
    }
    return out;
}
