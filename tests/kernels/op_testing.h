/* op_testing.h - small helpers shared by the op tests: random leaves
 * (f64 contiguous and transposed, or of any dtype), gradcheck with a readable failure, and
 * error-message checks. Include after <cmocka.h>. */
#ifndef TS_TESTS_OP_TESTING_H
#define TS_TESTS_OP_TESTING_H

#include <stdio.h>
#include <string.h>

#include "kernels/autograd.h"
#include "kernels/ops/view.h"
#include "kernels/tensor.h"

#define SHAPE(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}
#define SHAPE0 0, (int64_t[]){0}

/* A standard-normal f64 leaf requiring grad. */
static inline ts_tensor *leaf(uint64_t seed, int nd, const int64_t *shape) {
    ts_tensor *t = ts_tensor_randn(ts_key_from_seed(seed), TS_F64, nd, shape);
    ts_set_requires_grad(t, true);
    return t;
}

/* A standard-normal leaf of dtype dt requiring grad (asserts it was made). */
static inline ts_tensor *leaf_of(uint64_t seed, ts_dtype dt, int nd, const int64_t *shape) {
    ts_tensor *t = ts_tensor_randn(ts_key_from_seed(seed), dt, nd, shape);
    assert_non_null(t);
    assert_int_equal(ts_set_requires_grad(t, true), TS_OK);
    return t;
}

/* An f64 leaf with values in [lo, hi). */
static inline ts_tensor *leaf_in(uint64_t seed, int nd, const int64_t *shape, double lo, double hi) {
    ts_tensor *t = ts_tensor_uniform(ts_key_from_seed(seed), TS_F64, nd, shape, lo, hi);
    ts_set_requires_grad(t, true);
    return t;
}

/* A non-contiguous f64 leaf of shape [rows, cols] (column-major strides). */
static inline ts_tensor *leaf_t(uint64_t seed, int64_t rows, int64_t cols) {
    ts_tensor *base = ts_tensor_randn(ts_key_from_seed(seed), TS_F64, 2, (int64_t[]){cols, rows});
    ts_tensor *t = ts_tensor_from_storage(base->storage, TS_F64, 0, 2, (int64_t[]){rows, cols},
                                          (int64_t[]){1, rows});
    ts_tensor_release(base);
    ts_set_requires_grad(t, true);
    return t;
}

/* gradcheck in f64 with eps 1e-6; prints the engine's reason on failure. */
static inline void check_grad(ts_gradcheck_fn fn, void *ctx, int n, ts_tensor *const *in) {
    ts_status st = ts_gradcheck(fn, ctx, n, in, 1e-6, 1e-6, 1e-5);
    if (st) print_message("gradcheck failed: %s\n", ts_last_error());
    assert_int_equal(st, TS_OK);
}

/* r is NULL and the last error contains needle. */
static inline void expect_error(ts_tensor *r, const char *needle) {
    assert_null(r);
    if (!strstr(ts_last_error(), needle)) print_message("error was: %s\nexpected: %s\n", ts_last_error(), needle);
    assert_non_null(strstr(ts_last_error(), needle));
}

/* |a[i] - b[i]| <= tol * (1 + |b[i]|) for all i (same shape required). */
static inline void expect_close(const ts_tensor *a, const ts_tensor *b, double tol) {
    assert_non_null(a);
    assert_non_null(b);
    assert_true(ts_tensor_same_shape(a, b));
    int64_t n = ts_tensor_numel(a);
    for (int64_t i = 0; i < n; i++) {
        double x = ts_tensor_get(a, i), y = ts_tensor_get(b, i), d = x - y;
        if (!(d <= tol * (1 + (y < 0 ? -y : y)) && -d <= tol * (1 + (y < 0 ? -y : y)))) {
            print_message("element %lld: %.9g vs %.9g\n", (long long)i, x, y);
            fail();
        }
    }
}

/* Releases n tensors. */
static inline void release_all(int n, ts_tensor **t) {
    for (int i = 0; i < n; i++) ts_tensor_release(t[i]);
}

#endif
