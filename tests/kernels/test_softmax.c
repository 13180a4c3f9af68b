/* test_softmax.c - softmax and log_softmax: values, stability, gradients
 * along every dim and for non-contiguous inputs, errors; the fast float exp. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <string.h>
#include <cmocka.h>

#include "fused_util.h"
#include "kernels/ops/cpu/rowmath.h"
#include "kernels/ops/softmax.h"

static void test_values_and_stability(void **state) {
    (void)state;
    float v[6] = {1, 2, 3, 1000, 1001, 1002}; /* second row would overflow without the max shift */
    ts_tensor *x = ts_tensor_from_data(TS_F32, SHAPE(2, 3), v);
    ts_tensor *y = ts_softmax(x, -1), *l = ts_log_softmax(x, 1);
    double z = exp(0) + exp(1) + exp(2);
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 3; j++) {
            assert_float_equal(ts_tensor_get(y, r * 3 + j), exp(j) / z, 1e-6);
            assert_float_equal(ts_tensor_get(l, r * 3 + j), j - log(z), 1e-4);
        }
    ts_tensor *c = ts_softmax(x, 0); /* columns: [1, 1000] etc. */
    assert_float_equal(ts_tensor_get(c, 0), 0.0, 1e-6);
    assert_float_equal(ts_tensor_get(c, 3), 1.0, 1e-6);
    ts_tensor_release(x);
    ts_tensor_release(y);
    ts_tensor_release(l);
    ts_tensor_release(c);
}

typedef struct {
    int dim;
    int log;
} sm_args;

static ts_tensor *sm_fn(ts_tensor *const *in, void *ctx) {
    sm_args *a = ctx;
    return a->log ? ts_log_softmax(in[0], a->dim) : ts_softmax(in[0], a->dim);
}

static void test_gradcheck(void **state) {
    (void)state;
    struct {
        int ndim;
        int64_t shape[3];
        int dim;
    } cases[] = {{1, {7}, 0}, {2, {3, 5}, -1}, {2, {3, 5}, 0}, {3, {2, 3, 4}, 1}, {3, {2, 3, 4}, 2}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int lg = 0; lg < 2; lg++) {
            ts_tensor *x = leaf(10 + c, cases[c].ndim, cases[c].shape);
            sm_args a = {cases[c].dim, lg};
            assert_int_equal(check_grads(sm_fn, &a, 1, &x), TS_OK);
            ts_tensor_release(x);
        }
}

static void test_non_contiguous(void **state) {
    (void)state;
    for (int lg = 0; lg < 2; lg++)
        for (int dim = 0; dim < 3; dim++) {
            ts_tensor *x = leaf_transposed(30 + dim, SHAPE(2, 4, 3));
            assert_false(ts_tensor_is_contiguous(x));
            sm_args a = {dim, lg};
            assert_int_equal(check_grads(sm_fn, &a, 1, &x), TS_OK);
            /* same values as on a contiguous copy */
            ts_tensor *xc = ts_tensor_copy_as(x, TS_F64);
            ts_tensor *y1 = sm_fn(&x, &a), *y2 = sm_fn(&xc, &a);
            for (int i = 0; i < 24; i++) assert_float_equal(ts_tensor_get(y1, i), ts_tensor_get(y2, i), 1e-15);
            ts_tensor_release(x);
            ts_tensor_release(xc);
            ts_tensor_release(y1);
            ts_tensor_release(y2);
        }
}

static void test_large_parallel_rows(void **state) {
    (void)state;
    ts_tensor *x = ts_tensor_randn(ts_key_from_seed(5), TS_F32, SHAPE(300, 257));
    ts_tensor *y = ts_softmax(x, 1);
    for (int r = 0; r < 300; r += 37) {
        double s = 0;
        for (int j = 0; j < 257; j++) s += ts_tensor_get(y, r * 257 + j);
        assert_float_equal(s, 1.0, 1e-5);
    }
    ts_tensor_release(x);
    ts_tensor_release(y);
}

static void test_errors(void **state) {
    (void)state;
    ts_tensor *x = ts_tensor_zeros(TS_F32, SHAPE(2, 3));
    assert_null(ts_softmax(x, 2));
    assert_non_null(strstr(ts_last_error(), "softmax: dim 2 out of range for [2,3]"));
    ts_tensor *i = ts_tensor_zeros(TS_I32, SHAPE(2, 3));
    assert_null(ts_log_softmax(i, 0));
    assert_non_null(strstr(ts_last_error(), "log_softmax: x has dtype i32"));
    ts_tensor_release(x);
    ts_tensor_release(i);
}

static void test_fast_exp(void **state) {
    (void)state;
    double worst = 0;
    for (double x = -87.0; x < 88.3; x += 0.0137) {
        double want = exp((double)(float)x), got = ts_expf_fast((float)x);
        double rel = fabs(got - want) / want;
        if (rel > worst) worst = rel;
    }
    assert_true(worst < 4e-7);
    assert_true(ts_expf_fast(-INFINITY) == 0.0f);
    assert_true(ts_expf_fast(-200.0f) == 0.0f);
    assert_true(isinf(ts_expf_fast(100.0f)));
    assert_true(isnan(ts_expf_fast(NAN)));
    assert_true(ts_expf_fast(0.0f) == 1.0f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values_and_stability), cmocka_unit_test(test_gradcheck),
        cmocka_unit_test(test_non_contiguous),       cmocka_unit_test(test_large_parallel_rows),
        cmocka_unit_test(test_errors),               cmocka_unit_test(test_fast_exp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
