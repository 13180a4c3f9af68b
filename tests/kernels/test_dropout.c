/* test_dropout.c - key-driven dropout: the mask is a function of (key,
 * index) only (same key -> same mask at any thread count and for strided
 * inputs, other key -> other mask), keep rate and scaling, eval mode,
 * gradcheck through the regenerated mask, and argument errors. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "kernels/ops/dropout.h"
#include "kernels/threads.h"
#include "op_testing.h"

static void test_mask_from_key(void **state) {
    (void)state;
    const int64_t n = 100000; /* threaded path */
    ts_tensor *x = ts_tensor_ones(TS_F32, SHAPE(250, 400));
    ts_key k = ts_key_from_seed(11);
    ts_tensor *y1 = ts_dropout(x, 0.25, k, true);
    int prev = ts_threads_get();
    ts_threads_set(1);
    ts_tensor *y2 = ts_dropout(x, 0.25, k, true);
    ts_threads_set(prev);
    ts_tensor *y3 = ts_dropout(x, 0.25, ts_key_split(k, 1), true);
    assert_memory_equal(ts_f32(y1), ts_f32(y2), (size_t)n * 4);
    assert_memory_not_equal(ts_f32(y1), ts_f32(y3), (size_t)n * 4);
    /* element i kept exactly when U_i >= p, and scaled by 1/(1-p) */
    float *u = malloc(sizeof(float) * (size_t)n);
    ts_rng_uniform_f32(k, 0, n, u);
    int64_t kept = 0;
    for (int64_t i = 0; i < n; i++) {
        float want = u[i] >= 0.25f ? 1.0f / 0.75f : 0.0f;
        assert_true(ts_f32(y1)[i] == want);
        kept += want != 0;
    }
    free(u);
    assert_true(kept > 74000 && kept < 76000);
    ts_tensor *all[] = {x, y1, y2, y3};
    release_all(4, all);
}

static void test_strided_and_dtypes(void **state) {
    (void)state;
    ts_key k = ts_key_from_seed(5);
    ts_tensor *base = ts_tensor_randn(ts_key_from_seed(6), TS_F64, SHAPE(6, 5));
    ts_tensor *xt = ts_transpose(base, 0, 1), *xc = ts_tensor_copy_as(xt, TS_F64); /* [5,6] */
    ts_tensor *a = ts_dropout(xt, 0.5, k, true), *b = ts_dropout(xc, 0.5, k, true);
    expect_close(a, b, 0);
    ts_tensor *h = ts_tensor_ones(TS_BF16, SHAPE(8));
    ts_tensor *hy = ts_dropout(h, 0.5, k, true);
    assert_int_equal(hy->dtype, TS_F32);
    for (int i = 0; i < 8; i++) assert_true(ts_tensor_get(hy, i) == 0.0 || ts_tensor_get(hy, i) == 2.0);
    /* eval mode and p = 0 return the input; p = 1 drops everything */
    ts_tensor *e = ts_dropout(xc, 0.5, k, false), *z = ts_dropout(xc, 0, k, true), *one = ts_dropout(xc, 1, k, true);
    assert_ptr_equal(e, xc);
    assert_ptr_equal(z, xc);
    for (int i = 0; i < 30; i++) assert_true(ts_tensor_get(one, i) == 0.0);
    ts_tensor *all[] = {base, xt, xc, a, b, h, hy, e, z, one};
    release_all(10, all);
}

static ts_tensor *call_dropout(ts_tensor *const *in, void *ctx) {
    return ts_dropout(in[0], *(double *)ctx, ts_key_from_seed(99), true);
}

static void test_gradcheck(void **state) {
    (void)state;
    double ps[] = {0.1, 0.5, 0.9};
    for (int p = 0; p < 3; p++) {
        ts_tensor *in[] = {leaf(1, SHAPE(40)), leaf(2, SHAPE(3, 4, 5)), leaf_t(3, 6, 7)};
        for (int c = 0; c < 3; c++) check_grad(call_dropout, &ps[p], 1, &in[c]);
        release_all(3, in);
    }
    /* backward regenerates exactly the forward mask */
    ts_tensor *x = leaf(4, SHAPE(1000));
    ts_tensor *y = ts_dropout(x, 0.3, ts_key_from_seed(8), true);
    ts_tensor *g = ts_tensor_ones(TS_F64, SHAPE(1000));
    assert_int_equal(ts_backward(y, g), TS_OK);
    for (int i = 0; i < 1000; i++) {
        double yi = ts_tensor_get(y, i), gi = ts_tensor_get(x->grad, i);
        assert_true(yi == 0.0 ? gi == 0.0 : fabs(gi - 1 / 0.7) < 1e-12);
    }
    ts_tensor *all[] = {x, y, g};
    release_all(3, all);
}

static void test_errors(void **state) {
    (void)state;
    ts_tensor *x = ts_tensor_ones(TS_F32, SHAPE(4)), *i = ts_tensor_zeros(TS_I64, SHAPE(4));
    ts_key k = ts_key_from_seed(1);
    expect_error(ts_dropout(x, 1.5, k, true), "dropout: probability 1.5 is outside [0, 1]");
    assert_int_equal(ts_last_status(), TS_ERR_VALUE);
    expect_error(ts_dropout(x, NAN, k, true), "dropout: probability nan is outside [0, 1]");
    expect_error(ts_dropout(i, 0.5, k, true), "dropout: input has dtype i64 (shape [4])");
    ts_tensor_release(x);
    ts_tensor_release(i);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mask_from_key),
        cmocka_unit_test(test_strided_and_dtypes),
        cmocka_unit_test(test_gradcheck),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
