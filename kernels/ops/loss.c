/* loss.c - cross-entropy fused with log_softmax, and MSE; forward and
 * backward side by side. */
#include "kernels/ops/loss.h"

#include <math.h>

#include "kernels/autograd.h"
#include "kernels/ops/cpu/rowmath.h"
#include "kernels/ops/view.h"

/* Work below this many elements stays on one thread. */
#define PAR_MIN 32768

/* ---- cross-entropy ---- */

/* For each type: forward over N rows of C (lse per row, returns the summed
 * loss of the non-ignored rows) and backward (gx = (softmax - onehot) *
 * scale, zero rows for ignored targets). */
#define CROSS_ENTROPY_DEFINE(T, S)                                                                     \
    static double ce_fwd_##S(const T *x, const int64_t *t, T *lse, int64_t N, int64_t C, int64_t ign) { \
        double total = 0;                                                                              \
        _Pragma("omp parallel for schedule(static) reduction(+ : total) if (N * C > PAR_MIN)")         \
        for (int64_t r = 0; r < N; r++) {                                                              \
            const T *xr = x + r * C;                                                                   \
            T m = ts_row_max_##S(xr, C), s = 0;                                                     \
            TS_SIMD_##S(reduction(+ : s)) for (int64_t j = 0; j < C; j++) s += ts_exp_##S(xr[j] - m); \
            lse[r] = m + (T)log((double)s);                                                            \
            if (t[r] != ign) total += (double)(lse[r] - xr[t[r]]);                                     \
        }                                                                                              \
        return total;                                                                                  \
    }                                                                                                  \
    static void ce_bwd_##S(const T *x, const int64_t *t, const T *lse, T *gx, int64_t N, int64_t C,    \
                           int64_t ign, T scale) {                                                     \
        _Pragma("omp parallel for schedule(static) if (N * C > PAR_MIN)")                              \
        for (int64_t r = 0; r < N; r++) {                                                              \
            const T *xr = x + r * C;                                                                   \
            T *gr = gx + r * C, l = lse[r];                                                            \
            if (t[r] == ign) {                                                                         \
                for (int64_t j = 0; j < C; j++) gr[j] = 0;                                             \
                continue;                                                                              \
            }                                                                                          \
            TS_SIMD_##S() for (int64_t j = 0; j < C; j++) gr[j] = ts_exp_##S(xr[j] - l) * scale; \
            gr[t[r]] -= scale;                                                                         \
        }                                                                                              \
    }

CROSS_ENTROPY_DEFINE(float, f)
CROSS_ENTROPY_DEFINE(double, d)

/* saved: 0 logits [N, C], 1 targets i64 [N], 2 lse [N]; iargs: 0 ignore_index,
 * 1 reduction; fargs[0] = count of non-ignored targets. */
static ts_status cross_entropy_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    if (!ts_node_wants(n, 0)) return TS_OK;
    ts_tensor *x = n->saved[0], *t = n->saved[1], *lse = n->saved[2], *logits = n->inputs[0];
    int64_t N = x->shape[0], C = x->shape[1];
    double scale = ts_tensor_item(g) / (n->iargs[1] == TS_REDUCTION_MEAN ? n->fargs[0] : 1.0);
    ts_tensor *gx = ts_tensor_empty(x->dtype, 2, x->shape);
    if (!gx) return ts_last_status();
    const int64_t *tp = ts_tensor_data(t);
    if (x->dtype == TS_F32) ce_bwd_f(ts_f32(x), tp, ts_f32(lse), ts_f32(gx), N, C, n->iargs[0], (float)scale);
    else ce_bwd_d(ts_f64(x), tp, ts_f64(lse), ts_f64(gx), N, C, n->iargs[0], scale);
    gin[0] = ts_reshape(gx, logits->ndim, logits->shape);
    ts_tensor_release(gx);
    return gin[0] ? TS_OK : ts_last_status();
}

/* Checks targets fit logits: leading shape and class range. */
static ts_status check_targets(const ts_tensor *logits, const ts_tensor *targets, const int64_t *t, int64_t N,
                               int64_t C, int64_t ign) {
    for (int64_t r = 0; r < N; r++)
        if (t[r] != ign && (t[r] < 0 || t[r] >= C))
            return ts_error(TS_ERR_INDEX,
                            "cross_entropy: target %lld at position %lld is out of range for %lld classes "
                            "(logits %s, targets %s, ignore_index %lld)",
                            (long long)t[r], (long long)r, (long long)C, ts_shape_str(logits),
                            ts_shape_str(targets), (long long)ign);
    return TS_OK;
}

ts_tensor *ts_cross_entropy(ts_tensor *logits, ts_tensor *targets, int64_t ignore_index, ts_reduction reduction) {
    if (ts_check_tensor("cross_entropy", "logits", logits, TS_FLOATS) ||
        ts_check_tensor("cross_entropy", "targets", targets, TS_INTS))
        return NULL;
    if (reduction != TS_REDUCTION_MEAN && reduction != TS_REDUCTION_SUM) {
        ts_error(TS_ERR_VALUE, "cross_entropy: unknown reduction %d (expected mean or sum)", (int)reduction);
        return NULL;
    }
    bool fits = logits->ndim >= 1 && targets->ndim == logits->ndim - 1;
    for (int d = 0; fits && d < targets->ndim; d++) fits = targets->shape[d] == logits->shape[d];
    if (!fits) {
        ts_error(TS_ERR_SHAPE, "cross_entropy: targets %s do not match logits %s (expected the logits' shape "
                 "without its last, class dim)", ts_shape_str(targets), ts_shape_str(logits));
        return NULL;
    }
    int64_t C = logits->shape[logits->ndim - 1], N = ts_tensor_numel(targets);
    ts_tensor *x = ts_tensor_dense(logits), *t = ts_tensor_copy_as(targets, TS_I64);
    ts_tensor *x2 = x ? ts_tensor_from_storage(x->storage, x->dtype, x->offset, 2, (int64_t[]){N, C}, NULL) : NULL;
    ts_tensor *lse = ts_tensor_empty(logits->dtype, 1, &N), *out = NULL;
    if (!x2 || !t || !lse) goto done;
    const int64_t *tp = ts_tensor_data(t);
    if (check_targets(logits, targets, tp, N, C, ignore_index)) goto done;
    int64_t count = 0;
    for (int64_t r = 0; r < N; r++) count += tp[r] != ignore_index;
    double total = logits->dtype == TS_F32 ? ce_fwd_f(ts_f32(x2), tp, ts_f32(lse), N, C, ignore_index)
                                           : ce_fwd_d(ts_f64(x2), tp, ts_f64(lse), N, C, ignore_index);
    out = ts_tensor_scalar(logits->dtype, reduction == TS_REDUCTION_MEAN ? total / (double)count : total);
    ts_node *n = out ? ts_autograd_record(out, "cross_entropy", cross_entropy_backward, 1, &logits) : NULL;
    if (n) {
        lse->storage->no_pack = true; /* statistics stay f32 */
        ts_node_save(n, 0, x2);
        ts_node_save(n, 1, t);
        ts_node_save(n, 2, lse);
        n->iargs[0] = ignore_index;
        n->iargs[1] = reduction;
        n->fargs[0] = (double)count;
    }
done:
    ts_tensor_release(x);
    ts_tensor_release(x2);
    ts_tensor_release(t);
    ts_tensor_release(lse);
    return out;
}

/* ---- mse ---- */

/* Elements summed in the input's precision before adding into a double. */
#define MSE_CHUNK 4096

/* For each type: sum of squared differences, and the gradients +-2 (a - b)
 * scale (ga or gb NULL: not wanted). */
#define MSE_DEFINE(T, S)                                                                               \
    static double mse_fwd_##S(const T *a, const T *b, int64_t n) {                                     \
        double total = 0;                                                                              \
        int64_t chunks = (n + MSE_CHUNK - 1) / MSE_CHUNK;                                              \
        _Pragma("omp parallel for schedule(static) reduction(+ : total) if (n > PAR_MIN)")             \
        for (int64_t c = 0; c < chunks; c++) {                                                         \
            int64_t lo = c * MSE_CHUNK, hi = lo + MSE_CHUNK < n ? lo + MSE_CHUNK : n;                  \
            T part = 0;                                                                                \
            TS_SIMD_##S(reduction(+ : part)) for (int64_t i = lo; i < hi; i++) part += (a[i] - b[i]) * (a[i] - b[i]); \
            total += (double)part;                                                                     \
        }                                                                                              \
        return total;                                                                                  \
    }                                                                                                  \
    static void mse_bwd_##S(const T *a, const T *b, T *ga, T *gb, int64_t n, T scale) {               \
        _Pragma("omp parallel for simd schedule(static) if (n > PAR_MIN)")                             \
        for (int64_t i = 0; i < n; i++) {                                                              \
            T d = 2 * (a[i] - b[i]) * scale;                                                           \
            if (ga) ga[i] = d;                                                                         \
            if (gb) gb[i] = -d;                                                                        \
        }                                                                                              \
    }

MSE_DEFINE(float, f)
MSE_DEFINE(double, d)

/* saved: 0 a, 1 b (contiguous); iargs[0] = reduction. */
static ts_status mse_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    ts_tensor *a = n->saved[0], *b = n->saved[1];
    int64_t m = ts_tensor_numel(a);
    double scale = ts_tensor_item(g) / (n->iargs[0] == TS_REDUCTION_MEAN ? (double)m : 1.0);
    for (int i = 0; i < 2; i++) {
        if (!ts_node_wants(n, i)) continue;
        gin[i] = ts_tensor_empty(a->dtype, a->ndim, a->shape);
        if (!gin[i]) return ts_last_status();
    }
    void *ga = gin[0] ? ts_tensor_data(gin[0]) : NULL, *gb = gin[1] ? ts_tensor_data(gin[1]) : NULL;
    if (a->dtype == TS_F32) mse_bwd_f(ts_f32(a), ts_f32(b), ga, gb, m, (float)scale);
    else mse_bwd_d(ts_f64(a), ts_f64(b), ga, gb, m, scale);
    return TS_OK;
}

ts_tensor *ts_mse(ts_tensor *a, ts_tensor *b, ts_reduction reduction) {
    if (ts_check_tensor("mse", "a", a, TS_FLOATS) || ts_check_tensor("mse", "b", b, TS_FLOATS)) return NULL;
    if (a->dtype != b->dtype) {
        ts_error(TS_ERR_DTYPE, "mse: dtypes %s and %s differ (shapes %s, %s)", ts_dtype_name(a->dtype),
                 ts_dtype_name(b->dtype), ts_shape_str(a), ts_shape_str(b));
        return NULL;
    }
    if (!ts_tensor_same_shape(a, b)) {
        ts_error(TS_ERR_SHAPE, "mse: shapes %s and %s differ", ts_shape_str(a), ts_shape_str(b));
        return NULL;
    }
    if (reduction != TS_REDUCTION_MEAN && reduction != TS_REDUCTION_SUM) {
        ts_error(TS_ERR_VALUE, "mse: unknown reduction %d (expected mean or sum)", (int)reduction);
        return NULL;
    }
    ts_tensor *ac = ts_tensor_dense(a), *bc = ts_tensor_dense(b), *out = NULL;
    if (ac && bc) {
        int64_t m = ts_tensor_numel(a);
        double total = a->dtype == TS_F32 ? mse_fwd_f(ts_f32(ac), ts_f32(bc), m) : mse_fwd_d(ts_f64(ac), ts_f64(bc), m);
        out = ts_tensor_scalar(a->dtype, reduction == TS_REDUCTION_MEAN ? total / (double)m : total);
        ts_node *n = out ? ts_autograd_record(out, "mse", mse_backward, 2, (ts_tensor *[]){a, b}) : NULL;
        if (n) {
            ts_node_save(n, 0, ac);
            ts_node_save(n, 1, bc);
            n->iargs[0] = reduction;
        }
    }
    ts_tensor_release(ac);
    ts_tensor_release(bc);
    return out;
}
