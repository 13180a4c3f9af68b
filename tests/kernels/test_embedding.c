/* test_embedding.c - embedding lookup with i32/i64 indices, scatter-add
 * gradient with repeated indices, non-contiguous tables, range errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "fused_util.h"
#include "kernels/ops/embedding.h"

static void test_lookup(void **state) {
    (void)state;
    ts_tensor *tab = ts_tensor_arange(TS_F32, 0, 12, 1);
    ts_tensor *t2 = ts_tensor_from_storage(tab->storage, TS_F32, 0, SHAPE(4, 3), NULL);
    int32_t i32[4] = {3, 0, 3, 1};
    int64_t i64[4] = {3, 0, 3, 1};
    ts_tensor *a = ts_tensor_from_data(TS_I32, SHAPE(2, 2), i32), *b = ts_tensor_from_data(TS_I64, SHAPE(4), i64);
    ts_tensor *ya = ts_embedding(t2, a), *yb = ts_embedding(t2, b);
    assert_int_equal(ya->ndim, 3);
    assert_int_equal(ya->shape[2], 3);
    assert_int_equal(yb->ndim, 2);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++) {
            assert_true(ts_tensor_get(ya, i * 3 + j) == i32[i] * 3 + j);
            assert_true(ts_tensor_get(yb, i * 3 + j) == i64[i] * 3 + j);
        }
    ts_tensor *s = ts_tensor_scalar(TS_I64, 2), *ys = ts_embedding(t2, s); /* 0-dim index -> [3] */
    assert_int_equal(ys->ndim, 1);
    assert_true(ts_tensor_get(ys, 0) == 6.0);
    ts_tensor *arr[] = {tab, t2, a, b, ya, yb, s, ys};
    for (size_t i = 0; i < sizeof arr / sizeof arr[0]; i++) ts_tensor_release(arr[i]);
}

static ts_tensor *emb_fn(ts_tensor *const *in, void *ctx) { return ts_embedding(in[0], ctx); }

static void test_gradcheck(void **state) {
    (void)state;
    int64_t idx[6] = {1, 4, 1, 1, 0, 4}; /* repeats accumulate; rows 2, 3 get none */
    ts_tensor *ind = ts_tensor_from_data(TS_I64, SHAPE(2, 3), idx);
    ts_tensor *tab = leaf(3, SHAPE(5, 4));
    assert_int_equal(check_grads(emb_fn, ind, 1, &tab), TS_OK);
    ts_tensor *tt = leaf_transposed(4, SHAPE(5, 4));
    assert_int_equal(check_grads(emb_fn, ind, 1, &tt), TS_OK);
    /* the gradient of row 1 is the sum of three output rows */
    ts_zero_grad(tab); /* gradcheck left its analytic gradient there */
    ts_tensor *y = ts_embedding(tab, ind), *g = ts_tensor_ones(TS_F64, SHAPE(2, 3, 4));
    assert_int_equal(ts_backward(y, g), TS_OK);
    assert_true(ts_tensor_get(tab->grad, 1 * 4 + 2) == 3.0);
    assert_true(ts_tensor_get(tab->grad, 2 * 4 + 0) == 0.0);
    ts_tensor_release(y);
    ts_tensor_release(g);
    ts_tensor_release(ind);
    ts_tensor_release(tab);
    ts_tensor_release(tt);
}

static void test_errors(void **state) {
    (void)state;
    ts_tensor *tab = ts_tensor_zeros(TS_F32, SHAPE(10, 4));
    int32_t bad[3] = {1, 10, 2};
    ts_tensor *ind = ts_tensor_from_data(TS_I32, SHAPE(3), bad);
    assert_null(ts_embedding(tab, ind));
    assert_non_null(strstr(ts_last_error(), "embedding: index 10 at position 1 is out of range for a table of 10 rows"));
    int64_t neg[1] = {-1};
    ts_tensor *n = ts_tensor_from_data(TS_I64, SHAPE(1), neg);
    assert_null(ts_embedding(tab, n));
    assert_non_null(strstr(ts_last_error(), "index -1 at position 0"));
    ts_tensor *f = ts_tensor_zeros(TS_F32, SHAPE(3));
    assert_null(ts_embedding(tab, f));
    assert_non_null(strstr(ts_last_error(), "embedding: indices has dtype f32"));
    ts_tensor *t3 = ts_tensor_zeros(TS_F32, SHAPE(2, 2, 2));
    assert_null(ts_embedding(t3, n));
    assert_non_null(strstr(ts_last_error(), "must be 2-D"));
    ts_tensor *arr[] = {tab, ind, n, f, t3};
    for (size_t i = 0; i < sizeof arr / sizeof arr[0]; i++) ts_tensor_release(arr[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lookup),
        cmocka_unit_test(test_gradcheck),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
