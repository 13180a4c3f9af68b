/* loss.c - cross-entropy fused with log_softmax, and MSE; forward and
 * backward side by side, on the device's loss kernels. */
#include "kernels/ops/loss.h"

#include <math.h>

#include "kernels/autograd.h"
#include "kernels/ops/backend.h"
#include "kernels/ops/view.h"

/* ---- cross-entropy ---- */

/* saved: 0 logits [N, C], 1 targets i64 [N], 2 lse [N]; iargs: 0 ignore_index,
 * 1 reduction; fargs[0] = count of non-ignored targets. */
static ts_status cross_entropy_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    if (!ts_node_wants(n, 0)) return TS_OK;
    ts_tensor *x = n->saved[0], *t = n->saved[1], *lse = n->saved[2], *logits = n->inputs[0];
    int64_t N = x->shape[0], C = x->shape[1];
    const ts_backend *be = ts_backend_for("cross_entropy", 2, (ts_tensor *[]){x, g});
    double scale = ts_tensor_item(g) / (n->iargs[1] == TS_REDUCTION_MEAN ? n->fargs[0] : 1.0);
    ts_tensor *gx = be ? ts_tensor_empty_like(x) : NULL;
    if (!gx || be->loss->cross_entropy_backward(x->dtype, ts_tensor_data(x), ts_tensor_data(t), ts_tensor_data(lse),
                                                ts_tensor_data(gx), N, C, n->iargs[0], scale)) {
        ts_tensor_release(gx);
        return ts_last_status();
    }
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
    if (ts_check_arg("cross_entropy", "logits", logits, TS_FLOATS) ||
        ts_check_arg("cross_entropy", "targets", targets, TS_INTS))
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
    const ts_backend *be = ts_backend_for("cross_entropy", 2, (ts_tensor *[]){logits, targets});
    if (!be) return NULL;
    ts_device dev = ts_tensor_device(logits);
    int64_t C = logits->shape[logits->ndim - 1], N = ts_tensor_numel(targets);
    ts_tensor *x = ts_tensor_dense(logits), *t = ts_tensor_copy_as(targets, TS_I64);
    ts_tensor *host = t ? ts_tensor_to(t, TS_CPU) : NULL; /* checked and counted on the host */
    ts_tensor *x2 = x ? ts_tensor_from_storage(x->storage, x->dtype, x->offset, 2, (int64_t[]){N, C}, NULL) : NULL;
    ts_tensor *lse = ts_tensor_empty_on(dev, logits->dtype, 1, &N), *out = NULL;
    if (!x2 || !host || !lse) goto done;
    const int64_t *tp = ts_tensor_data(host);
    if (check_targets(logits, targets, tp, N, C, ignore_index)) goto done;
    int64_t count = 0;
    for (int64_t r = 0; r < N; r++) count += tp[r] != ignore_index;
    double total;
    if (be->loss->cross_entropy(logits->dtype, ts_tensor_data(x2), ts_tensor_data(t), ts_tensor_data(lse), N, C,
                                ignore_index, &total))
        goto done;
    out = ts_tensor_full_on(dev, logits->dtype, 0, NULL, reduction == TS_REDUCTION_MEAN ? total / (double)count : total);
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
    ts_tensor_release(host);
    ts_tensor_release(lse);
    return out;
}

/* ---- mse ---- */

/* saved: 0 a, 1 b (contiguous); iargs[0] = reduction. */
static ts_status mse_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    ts_tensor *a = n->saved[0], *b = n->saved[1];
    int64_t m = ts_tensor_numel(a);
    const ts_backend *be = ts_backend_for("mse", 3, (ts_tensor *[]){a, b, g});
    if (!be) return ts_last_status();
    double scale = ts_tensor_item(g) / (n->iargs[0] == TS_REDUCTION_MEAN ? (double)m : 1.0);
    for (int i = 0; i < 2; i++) {
        if (!ts_node_wants(n, i)) continue;
        gin[i] = ts_tensor_empty_like(a);
        if (!gin[i]) return ts_last_status();
    }
    void *ga = gin[0] ? ts_tensor_data(gin[0]) : NULL, *gb = gin[1] ? ts_tensor_data(gin[1]) : NULL;
    return be->loss->mse_backward(a->dtype, ts_tensor_data(a), ts_tensor_data(b), ga, gb, m, scale);
}

ts_tensor *ts_mse(ts_tensor *a, ts_tensor *b, ts_reduction reduction) {
    if (ts_check_arg("mse", "a", a, TS_FLOATS) || ts_check_arg("mse", "b", b, TS_FLOATS)) return NULL;
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
    const ts_backend *be = ts_backend_for("mse", 2, (ts_tensor *[]){a, b});
    if (!be) return NULL;
    ts_tensor *ac = ts_tensor_dense(a), *bc = ts_tensor_dense(b), *out = NULL;
    int64_t m = ts_tensor_numel(a);
    double total;
    if (ac && bc && !be->loss->mse(a->dtype, ts_tensor_data(ac), ts_tensor_data(bc), m, &total)) {
        out = ts_tensor_full_on(ts_tensor_device(a), a->dtype, 0, NULL,
                                reduction == TS_REDUCTION_MEAN ? total / (double)m : total);
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
