/* reduce.c - sum, mean and max over dims, forward and backward.
 *
 * Every reduction runs on a contiguous tensor seen as [outer, red, inner]:
 * when the reduced dims (ignoring size-1 dims) are one run, the input is
 * used as it is; otherwise it is first permuted so the reduced dims come
 * last (inner = 1). The autograd node is recorded on that contiguous tensor
 * and the permute/contiguous view ops carry the gradient the rest of the way.
 */
#include "kernels/ops/reduce.h"

#include <math.h>
#include <string.h>

#include "kernels/autograd.h"
#include "kernels/ops/elementwise.h"
#include "kernels/ops/view.h"

/* `omp simd` is a hint: sanitizer and -O1 builds of clang cannot always
 * vectorize and would otherwise turn that into an error under -Werror. */
#ifdef __clang__
#pragma clang diagnostic ignored "-Wpass-failed"
#endif

#define BLOCK 256 /* inner elements one task accumulates at a time */

typedef enum { R_SUM, R_MEAN, R_MAX } rkind;

static const char *const rnames[] = {"sum", "mean", "max"};

/* ---- kernels ---- */

#define REDUCE_KERNELS_T(T, S)                                                                               \
    /* o[oi, i] = scale * sum_r x[oi, r, i], accumulated in double */                                        \
    static void sum_##S(const T *x, T *o, int64_t outer, int64_t red, int64_t inner, double scale) {         \
        if (inner == 1 && outer == 1) {                                                                      \
            double s = 0;                                                                                    \
            _Pragma("omp parallel for reduction(+ : s) if (red > 32768)") for (int64_t r = 0; r < red;  \
                                                                                     r++) s += x[r];         \
            o[0] = (T)(s * scale);                                                                           \
            return;                                                                                          \
        }                                                                                                    \
        if (inner == 1) {                                                                                    \
            _Pragma("omp parallel for if (outer * red > 32768)") for (int64_t oi = 0; oi < outer; oi++) {    \
                const T *src = x + oi * red;                                                                 \
                double s = 0;                                                                                \
                _Pragma("omp simd reduction(+ : s)") for (int64_t r = 0; r < red; r++) s += src[r];          \
                o[oi] = (T)(s * scale);                                                                      \
            }                                                                                                \
            return;                                                                                          \
        }                                                                                                    \
        int64_t nb = (inner + BLOCK - 1) / BLOCK;                                                            \
        _Pragma("omp parallel for if (outer * red * inner > 32768)") for (int64_t t = 0; t < outer * nb;     \
                                                                          t++) {                             \
            int64_t oi = t / nb, i0 = (t % nb) * BLOCK, m = inner - i0 < BLOCK ? inner - i0 : BLOCK;         \
            const T *src = x + oi * red * inner + i0;                                                        \
            double acc[BLOCK];                                                                               \
            for (int64_t i = 0; i < m; i++) acc[i] = 0;                                                      \
            for (int64_t r = 0; r < red; r++) {                                                              \
                const T *row = src + r * inner;                                                              \
                _Pragma("omp simd") for (int64_t i = 0; i < m; i++) acc[i] += row[i];                        \
            }                                                                                                \
            T *dst = o + oi * inner + i0;                                                                    \
            for (int64_t i = 0; i < m; i++) dst[i] = (T)(acc[i] * scale);                                    \
        }                                                                                                    \
    }                                                                                                        \
    /* o[oi, i] = max_r x[oi, r, i] and idx = the first r reaching it (red >= 1) */                          \
    static void max_##S(const T *x, T *o, int64_t *idx, int64_t outer, int64_t red, int64_t inner) {         \
        int64_t nb = (inner + BLOCK - 1) / BLOCK;                                                            \
        _Pragma("omp parallel for if (outer * red * inner > 32768)") for (int64_t t = 0; t < outer * nb;     \
                                                                          t++) {                             \
            int64_t oi = t / nb, i0 = (t % nb) * BLOCK, m = inner - i0 < BLOCK ? inner - i0 : BLOCK;         \
            const T *src = x + oi * red * inner + i0;                                                        \
            T *best = o + oi * inner + i0;                                                                   \
            int64_t *at = idx + oi * inner + i0;                                                             \
            for (int64_t i = 0; i < m; i++) {                                                                \
                best[i] = src[i];                                                                            \
                at[i] = 0;                                                                                   \
            }                                                                                                \
            for (int64_t r = 1; r < red; r++) {                                                              \
                const T *row = src + r * inner;                                                              \
                for (int64_t i = 0; i < m; i++) {                                                            \
                    T v = row[i];                                                                            \
                    if (v > best[i] || (v != v && best[i] == best[i])) {                                     \
                        best[i] = v;                                                                         \
                        at[i] = r;                                                                           \
                    }                                                                                        \
                }                                                                                            \
            }                                                                                                \
        }                                                                                                    \
    }                                                                                                        \
    /* gx = 0 except gx[oi, idx, i] = g[oi, i] */                                                            \
    static void max_back_##S(const T *g, const int64_t *idx, T *gx, int64_t outer, int64_t red,             \
                             int64_t inner) {                                                                \
        memset(gx, 0, sizeof(T) * (size_t)(outer * red * inner));                                           \
        _Pragma("omp parallel for if (outer * inner > 32768)") for (int64_t k = 0; k < outer * inner;       \
                                                                     k++) {                                  \
            int64_t oi = k / inner, i = k % inner;                                                           \
            gx[(oi * red + idx[k]) * inner + i] = g[k];                                                      \
        }                                                                                                    \
    }

REDUCE_KERNELS_T(float, f32)
REDUCE_KERNELS_T(double, f64)

/* ---- backward ---- */

/* g reshaped to the node input's shape with the reduced dims (bit mask
 * iargs[0]) as 1, then broadcast back over them, times scale. */
static ts_status sum_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    ts_tensor *x = n->inputs[0];
    int64_t kshape[TS_MAX_DIMS];
    for (int d = 0; d < x->ndim; d++) kshape[d] = (n->iargs[0] >> d) & 1 ? 1 : x->shape[d];
    ts_tensor *gr = ts_reshape(g, x->ndim, kshape);
    if (gr && n->fargs[0] != 1.0) {
        ts_tensor *s = ts_mul_scalar(gr, n->fargs[0]);
        ts_tensor_release(gr);
        gr = s;
    }
    gin[0] = gr ? ts_expand(gr, x->ndim, x->shape) : NULL;
    ts_tensor_release(gr);
    return gin[0] ? TS_OK : ts_last_status();
}

static ts_status max_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    ts_tensor *x = n->inputs[0], *idx = n->saved[0];
    ts_tensor *gc = ts_to_dtype(g, x->dtype);
    ts_tensor *gx = gc ? ts_tensor_empty(x->dtype, x->ndim, x->shape) : NULL;
    if (gx) {
        int64_t outer = n->iargs[1], red = n->iargs[2], inner = n->iargs[3];
        if (x->dtype == TS_F64) max_back_f64(ts_f64(gc), ts_tensor_data(idx), ts_f64(gx), outer, red, inner);
        else max_back_f32(ts_f32(gc), ts_tensor_data(idx), ts_f32(gx), outer, red, inner);
    }
    ts_tensor_release(gc);
    gin[0] = gx;
    return gx ? TS_OK : ts_last_status();
}

/* ---- forward ---- */

/* The reduced-dim bit mask of dims for a tensor of ndim dims. */
static ts_status dims_mask(const char *op, const ts_tensor *a, int ndims, const int *dims, unsigned *mask) {
    *mask = 0;
    if (ndims == 0 || !dims) {
        *mask = (1u << a->ndim) - 1;
        return TS_OK;
    }
    if (ndims < 0 || ndims > TS_MAX_DIMS)
        return ts_error(TS_ERR_SHAPE, "%s: %d dims listed for %s", op, ndims, ts_shape_str(a));
    for (int i = 0; i < ndims; i++) {
        int d = ts_dim_index(dims[i], a->ndim);
        if (d < 0) return ts_error(TS_ERR_SHAPE, "%s: dim %d out of range for %s", op, dims[i], ts_shape_str(a));
        if (*mask & (1u << d))
            return ts_error(TS_ERR_SHAPE, "%s: dim %d listed twice for %s", op, dims[i], ts_shape_str(a));
        *mask |= 1u << d;
    }
    return TS_OK;
}

static ts_tensor *reduce(rkind kind, ts_tensor *a0, int ndims, const int *dims, bool keepdim) {
    const char *op = rnames[kind];
    ts_tensor *a = ts_float_input(op, "input", a0);
    if (!a) return NULL;
    unsigned mask;
    ts_tensor *xc = NULL, *out = NULL, *idx = NULL;
    if (dims_mask(op, a, ndims, dims, &mask)) goto done;
    int nd = a->ndim, ond = 0;
    int64_t oshape[TS_MAX_DIMS], outer = 1, red = 1, inner = 1;
    for (int d = 0; d < nd; d++) {
        if (!((mask >> d) & 1)) oshape[ond++] = a->shape[d];
        else if (keepdim) oshape[ond++] = 1;
    }
    /* the reduced dims of size != 1: one run lo..hi, or scattered */
    int lo = -1, hi = -1;
    bool one_run = true, kept_after = false;
    for (int d = 0; d < nd; d++) {
        if (a->shape[d] == 1) continue;
        if ((mask >> d) & 1) {
            if (lo < 0) lo = d;
            else if (kept_after) one_run = false;
            hi = d;
        } else if (lo >= 0) {
            kept_after = true;
        }
    }
    unsigned xmask = mask;
    if (one_run) {
        xc = ts_contiguous(a);
        if (lo < 0) lo = hi = nd; /* nothing of size > 1 reduced */
        for (int d = 0; d < nd; d++) {
            if (d < lo) outer *= a->shape[d];
            else if (d > hi) inner *= a->shape[d];
            else red *= a->shape[d];
        }
    } else {
        int perm[TS_MAX_DIMS], k = 0;
        for (int d = 0; d < nd; d++)
            if (!((mask >> d) & 1)) perm[k++] = d, outer *= a->shape[d];
        xmask = 0;
        for (int d = 0; d < nd; d++)
            if ((mask >> d) & 1) xmask |= 1u << k, perm[k++] = d, red *= a->shape[d];
        ts_tensor *p = ts_permute(a, perm);
        xc = p ? ts_contiguous(p) : NULL;
        ts_tensor_release(p);
    }
    if (!xc) goto done;
    if (kind == R_MAX && red == 0) {
        ts_error(TS_ERR_SHAPE, "max: cannot reduce %s over an empty dim", ts_shape_str(a));
        goto done;
    }
    out = ts_tensor_empty(a->dtype, ond, oshape);
    if (!out) goto done;
    bool f64 = a->dtype == TS_F64;
    if (kind == R_MAX) {
        if (!(idx = ts_tensor_empty(TS_I64, ond, oshape))) {
            ts_tensor_release(out);
            out = NULL;
            goto done;
        }
        if (f64) max_f64(ts_f64(xc), ts_f64(out), ts_tensor_data(idx), outer, red, inner);
        else max_f32(ts_f32(xc), ts_f32(out), ts_tensor_data(idx), outer, red, inner);
    } else {
        double scale = kind == R_MEAN ? (red ? 1.0 / (double)red : NAN) : 1.0;
        if (outer * inner > 0) {
            if (f64) sum_f64(ts_f64(xc), ts_f64(out), outer, red, inner, scale);
            else sum_f32(ts_f32(xc), ts_f32(out), outer, red, inner, scale);
        }
    }
    ts_node *n = ts_autograd_record(out, op, kind == R_MAX ? max_backward : sum_backward, 1, &xc);
    if (kind != R_MAX) ts_node_forget_input_data(n, 0); /* sum and mean backward need only the shape */
    if (n) {
        n->iargs[0] = xmask;
        n->iargs[1] = outer;
        n->iargs[2] = red;
        n->iargs[3] = inner;
        n->fargs[0] = kind == R_MEAN ? (red ? 1.0 / (double)red : 0.0) : 1.0;
        if (idx) ts_node_save(n, 0, idx);
    }
done:
    ts_tensor_release(idx);
    ts_tensor_release(xc);
    ts_tensor_release(a);
    return out;
}

ts_tensor *ts_sum(ts_tensor *a, int ndims, const int *dims, bool keepdim) {
    return reduce(R_SUM, a, ndims, dims, keepdim);
}
ts_tensor *ts_mean(ts_tensor *a, int ndims, const int *dims, bool keepdim) {
    return reduce(R_MEAN, a, ndims, dims, keepdim);
}
ts_tensor *ts_max(ts_tensor *a, int ndims, const int *dims, bool keepdim) {
    return reduce(R_MAX, a, ndims, dims, keepdim);
}
ts_tensor *ts_sum_all(ts_tensor *a) { return reduce(R_SUM, a, 0, NULL, false); }
ts_tensor *ts_mean_all(ts_tensor *a) { return reduce(R_MEAN, a, 0, NULL, false); }
ts_tensor *ts_max_all(ts_tensor *a) { return reduce(R_MAX, a, 0, NULL, false); }
