/* test_loss.c - cross-entropy (values, ignore_index, mean/sum, [..., C]
 * logits, gradients, errors) and mse. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <string.h>
#include <cmocka.h>

#include "fused_util.h"
#include "kernels/ops/loss.h"

/* -log softmax(row)[t], directly. */
static double ce_row(const ts_tensor *x, int64_t r, int64_t C, int64_t t) {
    double z = 0;
    for (int64_t j = 0; j < C; j++) z += exp(ts_tensor_get(x, r * C + j));
    return log(z) - ts_tensor_get(x, r * C + t);
}

static void test_values_ignore_index(void **state) {
    (void)state;
    ts_tensor *x = ts_tensor_randn(ts_key_from_seed(1), TS_F32, SHAPE(4, 5));
    int64_t t[4] = {2, -100, 4, 0};
    ts_tensor *tg = ts_tensor_from_data(TS_I64, SHAPE(4), t);
    double want = ce_row(x, 0, 5, 2) + ce_row(x, 2, 5, 4) + ce_row(x, 3, 5, 0);
    ts_tensor *mean = ts_cross_entropy(x, tg, -100, TS_REDUCTION_MEAN);
    ts_tensor *sum = ts_cross_entropy(x, tg, -100, TS_REDUCTION_SUM);
    assert_int_equal(mean->ndim, 0);
    assert_float_equal(ts_tensor_item(mean), want / 3, 1e-5); /* divides by the 3 counted targets */
    assert_float_equal(ts_tensor_item(sum), want, 1e-5);
    int32_t all[4] = {7, 7, 7, 7};
    ts_tensor *ti = ts_tensor_from_data(TS_I32, SHAPE(4), all);
    ts_tensor *none = ts_cross_entropy(x, ti, 7, TS_REDUCTION_MEAN); /* all ignored: NaN like PyTorch */
    assert_true(isnan(ts_tensor_item(none)));
    ts_tensor *arr[] = {x, tg, mean, sum, ti, none};
    for (size_t i = 0; i < sizeof arr / sizeof arr[0]; i++) ts_tensor_release(arr[i]);
}

typedef struct {
    ts_tensor *targets;
    ts_reduction red;
} ce_args;

static ts_tensor *ce_fn(ts_tensor *const *in, void *ctx) {
    ce_args *a = ctx;
    return ts_cross_entropy(in[0], a->targets, 1, a->red);
}

static void test_gradcheck(void **state) {
    (void)state;
    int64_t t6[6] = {0, 1, 2, 3, 2, 0}; /* 1 is ignore_index */
    for (int red = 0; red < 2; red++) {
        ce_args a = {ts_tensor_from_data(TS_I64, SHAPE(6), t6), red};
        ts_tensor *x = leaf(2, SHAPE(6, 4));
        assert_int_equal(check_grads(ce_fn, &a, 1, &x), TS_OK);
        ts_tensor *xt = leaf_transposed(3, SHAPE(6, 4));
        assert_int_equal(check_grads(ce_fn, &a, 1, &xt), TS_OK);
        ts_tensor_release(a.targets);
        /* [2, 3, C] logits with [2, 3] targets */
        a.targets = ts_tensor_from_data(TS_I64, SHAPE(2, 3), t6);
        ts_tensor *x3 = leaf(4, SHAPE(2, 3, 4));
        assert_int_equal(check_grads(ce_fn, &a, 1, &x3), TS_OK);
        ts_tensor_release(a.targets);
        ts_tensor_release(x);
        ts_tensor_release(xt);
        ts_tensor_release(x3);
    }
}

static void test_ce_errors(void **state) {
    (void)state;
    ts_tensor *x = ts_tensor_zeros(TS_F32, SHAPE(3, 5));
    int64_t bad[3] = {0, 5, 1};
    ts_tensor *tb = ts_tensor_from_data(TS_I64, SHAPE(3), bad);
    assert_null(ts_cross_entropy(x, tb, -100, TS_REDUCTION_MEAN));
    assert_non_null(strstr(ts_last_error(), "cross_entropy: target 5 at position 1 is out of range for 5 classes"));
    ts_tensor *t4 = ts_tensor_zeros(TS_I64, SHAPE(4));
    assert_null(ts_cross_entropy(x, t4, -100, TS_REDUCTION_SUM));
    assert_non_null(strstr(ts_last_error(), "cross_entropy: targets [4] do not match logits [3,5]"));
    ts_tensor *tf = ts_tensor_zeros(TS_F32, SHAPE(3));
    assert_null(ts_cross_entropy(x, tf, -100, TS_REDUCTION_SUM));
    assert_non_null(strstr(ts_last_error(), "cross_entropy: targets has dtype f32"));
    ts_tensor *arr[] = {x, tb, t4, tf};
    for (size_t i = 0; i < sizeof arr / sizeof arr[0]; i++) ts_tensor_release(arr[i]);
}

static ts_tensor *mse_fn(ts_tensor *const *in, void *ctx) { return ts_mse(in[0], in[1], *(ts_reduction *)ctx); }

static void test_mse(void **state) {
    (void)state;
    for (int red = 0; red < 2; red++) {
        ts_reduction r = red;
        ts_tensor *in[2] = {leaf(5, SHAPE(3, 4)), leaf_transposed(6, SHAPE(3, 4))};
        assert_int_equal(check_grads(mse_fn, &r, 2, in), TS_OK);
        ts_tensor *y = ts_mse(in[0], in[1], r);
        double want = 0;
        for (int i = 0; i < 12; i++) want += pow(ts_tensor_get(in[0], i) - ts_tensor_get(in[1], i), 2);
        assert_float_equal(ts_tensor_item(y), r == TS_REDUCTION_MEAN ? want / 12 : want, 1e-12);
        ts_tensor_release(y);
        ts_tensor_release(in[0]);
        ts_tensor_release(in[1]);
    }
    ts_tensor *a = ts_tensor_zeros(TS_F32, SHAPE(2, 3)), *b = ts_tensor_zeros(TS_F32, SHAPE(3, 2));
    ts_tensor *c = ts_tensor_zeros(TS_F64, SHAPE(2, 3));
    assert_null(ts_mse(a, b, TS_REDUCTION_MEAN));
    assert_non_null(strstr(ts_last_error(), "mse: shapes [2,3] and [3,2] differ"));
    assert_null(ts_mse(a, c, TS_REDUCTION_MEAN));
    assert_non_null(strstr(ts_last_error(), "mse: dtypes f32 and f64 differ"));
    ts_tensor_release(a);
    ts_tensor_release(b);
    ts_tensor_release(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values_ignore_index),
        cmocka_unit_test(test_gradcheck),
        cmocka_unit_test(test_ce_errors),
        cmocka_unit_test(test_mse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
