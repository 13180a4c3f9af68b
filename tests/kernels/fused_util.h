/* fused_util.h - helpers shared by the fused-op tests (softmax, norm,
 * embedding, loss, attention): shape literals, keyed f64 leaves, transposed
 * (non-contiguous) leaves and a gradcheck wrapper. */
#ifndef TS_TESTS_FUSED_UTIL_H
#define TS_TESTS_FUSED_UTIL_H

#include <stdio.h>

#include "kernels/autograd.h"
#include "kernels/tensor.h"

#define SHAPE(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}

/* A randn f64 leaf with requires_grad. */
static inline ts_tensor *leaf(uint64_t seed, int ndim, const int64_t *shape) {
    ts_tensor *t = ts_tensor_randn(ts_key_from_seed(seed), TS_F64, ndim, shape);
    ts_set_requires_grad(t, true);
    return t;
}

/* A randn f64 leaf of shape [..., a, b] whose last two dims are stored
 * transposed (strides [..., 1, a]): not contiguous. */
static inline ts_tensor *leaf_transposed(uint64_t seed, int ndim, const int64_t *shape) {
    int64_t st[TS_MAX_DIMS], base_shape[TS_MAX_DIMS];
    for (int d = 0; d < ndim; d++) base_shape[d] = shape[d];
    base_shape[ndim - 2] = shape[ndim - 1];
    base_shape[ndim - 1] = shape[ndim - 2];
    ts_tensor *base = ts_tensor_randn(ts_key_from_seed(seed), TS_F64, ndim, base_shape);
    ts_contiguous_strides(ndim, base_shape, st);
    int64_t s = st[ndim - 1];
    st[ndim - 1] = st[ndim - 2];
    st[ndim - 2] = s;
    ts_tensor *t = ts_tensor_from_storage(base->storage, TS_F64, 0, ndim, shape, st);
    ts_tensor_release(base);
    ts_set_requires_grad(t, true);
    return t;
}

/* ts_gradcheck with the tolerances all fused-op tests use; prints the
 * failure. */
static inline ts_status check_grads(ts_gradcheck_fn fn, void *ctx, int n, ts_tensor *const *in) {
    ts_status st = ts_gradcheck(fn, ctx, n, in, 1e-6, 1e-7, 1e-5);
    if (st) fprintf(stderr, "%s\n", ts_last_error());
    return st;
}

#endif
