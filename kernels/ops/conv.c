/* conv.c - conv2d via im2col + GEMM, backward via GEMM + col2im. */
#include "kernels/ops/conv.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/autograd.h"
#include "kernels/ops/matmul.h"

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

/* im2col: col[n][(c*KH + kh)*KW + kw][oh*Wo + ow] = x[n][c][ih][iw] (0 in the
 * padding). col2im: the adjoint, dx[n][c][ih][iw] += dcol[...]. Each (n, c)
 * pair owns its rows of col and its plane of x, so both run in parallel over
 * (n, c). */
#define CONV_KERNELS(T)                                                                                  \
    static void im2col_##T(const conv_geom *g, const T *x, T *col) {                                     \
        int64_t L = g->Ho * g->Wo, planes = g->N * g->C;                                                 \
        _Pragma("omp parallel for schedule(static) if (planes * g->KH * g->KW * L > CONV_OMP_MIN)")      \
        for (int64_t p = 0; p < planes; p++) {                                                           \
            const T *xp = x + p * g->H * g->W;                                                           \
            T *cp = col + p * g->KH * g->KW * L; /* (n, c) rows are adjacent: n*C*KK + c*KK */           \
            for (int64_t kh = 0; kh < g->KH; kh++)                                                       \
                for (int64_t kw = 0; kw < g->KW; kw++) {                                                 \
                    T *row = cp + (kh * g->KW + kw) * L;                                                 \
                    int64_t lo, hi;                                                                      \
                    valid_range(kw, g->sw, g->pw, g->dw, g->W, g->Wo, &lo, &hi);                         \
                    for (int64_t oh = 0; oh < g->Ho; oh++) {                                             \
                        T *r = row + oh * g->Wo;                                                         \
                        int64_t ih = oh * g->sh - g->ph + kh * g->dh;                                    \
                        if (ih < 0 || ih >= g->H) {                                                      \
                            memset(r, 0, sizeof(T) * (size_t)g->Wo);                                     \
                            continue;                                                                    \
                        }                                                                                \
                        const T *xr = xp + ih * g->W;                                                    \
                        int64_t off = kw * g->dw - g->pw;                                                \
                        for (int64_t ow = 0; ow < lo; ow++) r[ow] = 0;                                   \
                        for (int64_t ow = lo; ow < hi; ow++) r[ow] = xr[ow * g->sw + off];               \
                        for (int64_t ow = hi; ow < g->Wo; ow++) r[ow] = 0;                               \
                    }                                                                                    \
                }                                                                                        \
        }                                                                                                \
    }                                                                                                    \
    static void col2im_##T(const conv_geom *g, const T *col, T *dx) {                                    \
        int64_t L = g->Ho * g->Wo, planes = g->N * g->C;                                                 \
        _Pragma("omp parallel for schedule(static) if (planes * g->KH * g->KW * L > CONV_OMP_MIN)")      \
        for (int64_t p = 0; p < planes; p++) {                                                           \
            T *xp = dx + p * g->H * g->W;                                                                \
            const T *cp = col + p * g->KH * g->KW * L;                                                   \
            memset(xp, 0, sizeof(T) * (size_t)(g->H * g->W));                                            \
            for (int64_t kh = 0; kh < g->KH; kh++)                                                       \
                for (int64_t kw = 0; kw < g->KW; kw++) {                                                 \
                    const T *row = cp + (kh * g->KW + kw) * L;                                           \
                    int64_t lo, hi;                                                                      \
                    valid_range(kw, g->sw, g->pw, g->dw, g->W, g->Wo, &lo, &hi);                         \
                    for (int64_t oh = 0; oh < g->Ho; oh++) {                                             \
                        int64_t ih = oh * g->sh - g->ph + kh * g->dh;                                    \
                        if (ih < 0 || ih >= g->H) continue;                                              \
                        const T *r = row + oh * g->Wo;                                                   \
                        T *xr = xp + ih * g->W;                                                          \
                        int64_t off = kw * g->dw - g->pw;                                                \
                        for (int64_t ow = lo; ow < hi; ow++) xr[ow * g->sw + off] += r[ow];              \
                    }                                                                                    \
                }                                                                                        \
        }                                                                                                \
    }                                                                                                    \
    /* out[n][o][l] += bias[o] */                                                                        \
    static void add_bias_##T(const conv_geom *g, const T *bias, T *out) {                                \
        int64_t L = g->Ho * g->Wo, rows = g->N * g->O;                                                   \
        _Pragma("omp parallel for schedule(static) if (rows * L > CONV_OMP_MIN)")                        \
        for (int64_t r = 0; r < rows; r++) {                                                             \
            T b = bias[r % g->O], *o = out + r * L;                                                      \
            for (int64_t l = 0; l < L; l++) o[l] += b;                                                   \
        }                                                                                                \
    }                                                                                                    \
    /* db[o] = sum over n, l of dout[n][o][l] */                                                         \
    static void bias_grad_##T(const conv_geom *g, const T *dout, T *db) {                                \
        int64_t L = g->Ho * g->Wo;                                                                       \
        _Pragma("omp parallel for schedule(static) if (g->N * g->O * L > CONV_OMP_MIN)")                 \
        for (int64_t o = 0; o < g->O; o++) {                                                             \
            double s = 0;                                                                                \
            for (int64_t n = 0; n < g->N; n++) {                                                         \
                const T *r = dout + (n * g->O + o) * L;                                                  \
                for (int64_t l = 0; l < L; l++) s += r[l];                                               \
            }                                                                                            \
            db[o] = (T)s;                                                                                \
        }                                                                                                \
    }

CONV_KERNELS(float)
CONV_KERNELS(double)

#define DISPATCH(dt, fn, ...) ((dt) == TS_F32 ? fn##_float(__VA_ARGS__) : fn##_double(__VA_ARGS__))

ts_conv2d_opts ts_conv2d_default_opts(void) {
    return (ts_conv2d_opts){.stride_h = 1, .stride_w = 1, .pad_h = 0, .pad_w = 0, .dil_h = 1, .dil_w = 1, .groups = 1};
}

/* t itself (retained) when contiguous, else a contiguous copy (no history). */
static ts_tensor *dense(const ts_tensor *t) {
    return ts_tensor_is_contiguous(t) ? ts_tensor_retain((ts_tensor *)t) : ts_tensor_copy_as(t, t->dtype);
}

/* A history-free view of contiguous t with another shape. */
static ts_tensor *as_shape(const ts_tensor *t, int nd, const int64_t *shape) {
    return ts_tensor_from_storage(t->storage, t->dtype, t->offset, nd, shape, NULL);
}

/* The columns of contiguous x: a new [N, C*KH*KW, Ho*Wo] tensor. */
static ts_tensor *unfold(const conv_geom *g, const ts_tensor *x) {
    ts_tensor *col = ts_tensor_empty(x->dtype, 3, (int64_t[]){g->N, g->C * g->KH * g->KW, g->Ho * g->Wo});
    if (col) DISPATCH(x->dtype, im2col, g, ts_tensor_data(x), ts_tensor_data(col));
    return col;
}

static void geom_from_node(const ts_node *n, conv_geom *g) { memcpy(g, n->ctx, sizeof *g); }

static ts_status conv2d_backward(ts_node *n, ts_tensor *grad, ts_tensor **gin) {
    conv_geom g;
    geom_from_node(n, &g);
    ts_tensor *x = n->inputs[0], *w = n->inputs[1];
    int64_t CKK = g.C * g.KH * g.KW, L = g.Ho * g.Wo;
    ts_tensor *gd = dense(grad), *g3 = NULL, *col = NULL, *colT = NULL, *wd = NULL, *w2 = NULL, *wT = NULL;
    ts_tensor *dcol = NULL;
    ts_status st = gd ? TS_OK : ts_last_status();
    if (!st) g3 = as_shape(gd, 3, (int64_t[]){g.N, g.O, L});
    if (!st && !g3) st = ts_last_status();
    if (!st && ts_node_wants(n, 1)) { /* dW [O, CKK] = sum_n g_n · col_nᵀ */
        ts_tensor *xd = dense(x);
        col = xd ? unfold(&g, xd) : NULL;
        ts_tensor_release(xd);
        colT = col ? ts_tensor_from_storage(col->storage, col->dtype, 0, 3, (int64_t[]){g.N, L, CKK},
                                            (int64_t[]){CKK * L, 1, L})
                   : NULL;
        gin[1] = colT ? ts_tensor_empty(w->dtype, 4, w->shape) : NULL;
        ts_tensor *dw2 = gin[1] ? as_shape(gin[1], 2, (int64_t[]){g.O, CKK}) : NULL;
        st = dw2 ? ts_matmul_into(dw2, g3, colT, false) : ts_last_status();
        ts_tensor_release(dw2);
        /* free the columns before dcol (same size) is allocated */
        ts_tensor_release(colT);
        ts_tensor_release(col);
        colT = col = NULL;
    }
    if (!st && ts_node_wants(n, 0)) { /* dcol = Wᵀ · g_n, then col2im */
        wd = dense(w);
        w2 = wd ? as_shape(wd, 2, (int64_t[]){g.O, CKK}) : NULL;
        wT = w2 ? ts_tensor_from_storage(w2->storage, w2->dtype, w2->offset, 2, (int64_t[]){CKK, g.O},
                                         (int64_t[]){1, CKK})
                : NULL;
        dcol = wT ? ts_tensor_empty(x->dtype, 3, (int64_t[]){g.N, CKK, L}) : NULL;
        st = dcol ? ts_matmul_into(dcol, wT, g3, false) : ts_last_status();
        if (!st) gin[0] = ts_tensor_empty(x->dtype, 4, x->shape);
        if (!st && !gin[0]) st = ts_last_status();
        if (!st) DISPATCH(x->dtype, col2im, &g, ts_tensor_data(dcol), ts_tensor_data(gin[0]));
    }
    if (!st && n->n_inputs > 2 && ts_node_wants(n, 2)) {
        gin[2] = ts_tensor_empty(grad->dtype, 1, (int64_t[]){g.O});
        if (gin[2]) DISPATCH(grad->dtype, bias_grad, &g, ts_tensor_data(gd), ts_tensor_data(gin[2]));
        else st = ts_last_status();
    }
    ts_tensor *tmp[] = {gd, g3, col, colT, wd, w2, wT, dcol};
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
    int64_t CKK = g.C * g.KH * g.KW, L = g.Ho * g.Wo;
    ts_tensor *xd = dense(x), *wd = dense(w);
    ts_tensor *col = xd ? unfold(&g, xd) : NULL;
    ts_tensor *w2 = wd ? as_shape(wd, 2, (int64_t[]){g.O, CKK}) : NULL;
    ts_tensor *out = col && w2 ? ts_tensor_empty(x->dtype, 4, (int64_t[]){g.N, g.O, g.Ho, g.Wo}) : NULL;
    ts_tensor *o3 = out ? as_shape(out, 3, (int64_t[]){g.N, g.O, L}) : NULL;
    ts_status st = o3 ? ts_matmul_into(o3, w2, col, false) : ts_last_status();
    ts_tensor *bd = !st && bias ? dense(bias) : NULL;
    if (bd) DISPATCH(x->dtype, add_bias, &g, ts_tensor_data(bd), ts_tensor_data(out));
    else if (bias && !st) st = ts_last_status();
    ts_tensor *tmp[] = {xd, wd, col, w2, o3, bd};
    for (size_t i = 0; i < sizeof tmp / sizeof tmp[0]; i++) ts_tensor_release(tmp[i]);
    if (st) {
        ts_tensor_release(out);
        return NULL;
    }
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
