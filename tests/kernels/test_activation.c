/* test_activation.c - relu, gelu (tanh form), sigmoid, tanh: values against
 * closed forms (f32 and f64, threaded sizes, extreme inputs), gradchecks on
 * several shapes incl. non-contiguous and 0-dim, and dtype errors. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kernels/ops/activation.h"
#include "op_testing.h"

typedef ts_tensor *(*unop)(ts_tensor *);

static double ref_relu(double x) { return x > 0 ? x : 0; }
static double ref_gelu(double x) { return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
static double ref_sigmoid(double x) { return 1 / (1 + exp(-x)); }

static void test_values(void **state) {
    (void)state;
    unop fns[4] = {ts_relu, ts_gelu, ts_sigmoid, ts_tanh};
    double (*refs[4])(double) = {ref_relu, ref_gelu, ref_sigmoid, tanh};
    for (int dt = 0; dt < 2; dt++) {
        /* 70000 elements: the threaded path; values in [-8, 8) */
        ts_tensor *x = ts_tensor_uniform(ts_key_from_seed(7), dt ? TS_F64 : TS_F32, SHAPE(70, 1000), -8, 8);
        for (int f = 0; f < 4; f++) {
            ts_tensor *y = fns[f](x);
            assert_int_equal(y->dtype, x->dtype);
            for (int64_t i = 0; i < 70000; i += 7) {
                double want = refs[f](ts_tensor_get(x, i));
                if (fabs(ts_tensor_get(y, i) - want) > (dt ? 1e-14 : 2e-6)) {
                    print_message("fn %d elem %lld: %.9g vs %.9g\n", f, (long long)i, ts_tensor_get(y, i), want);
                    fail();
                }
            }
            ts_tensor_release(y);
        }
        ts_tensor_release(x);
    }
    /* no overflow for large |x| */
    ts_tensor *big = ts_tensor_from_data(TS_F32, SHAPE(4), (float[]){-1000, -90, 90, 1000});
    ts_tensor *s = ts_sigmoid(big), *g = ts_gelu(big), *t = ts_tanh(big);
    double ws[4] = {0, 0, 1, 1}, wg[4] = {0, 0, 90, 1000}, wt[4] = {-1, -1, 1, 1};
    for (int i = 0; i < 4; i++) {
        assert_true(ts_tensor_get(s, i) == ws[i] || fabs(ts_tensor_get(s, i) - ws[i]) < 1e-30);
        assert_true(fabs(ts_tensor_get(g, i) - wg[i]) < 1e-30 + 1e-6 * wg[i]);
        assert_true(ts_tensor_get(t, i) == wt[i]);
    }
    ts_tensor *all[] = {big, s, g, t};
    release_all(4, all);
}

static ts_tensor *call_un(ts_tensor *const *in, void *ctx) { return (*(unop *)ctx)(in[0]); }

static void test_gradcheck(void **state) {
    (void)state;
    unop fns[4] = {ts_relu, ts_gelu, ts_sigmoid, ts_tanh};
    for (int f = 0; f < 4; f++) {
        ts_tensor *in[] = {leaf(1, SHAPE(7)), leaf(2, SHAPE(2, 3, 4)), leaf_t(3, 4, 3), leaf(4, SHAPE0),
                           leaf_in(5, SHAPE(3, 3), -6, 6)};
        for (int c = 0; c < 5; c++) check_grad(call_un, &fns[f], 1, &in[c]);
        release_all(5, in);
    }
}

static void test_dtypes(void **state) {
    (void)state;
    ts_tensor *b = ts_tensor_full(TS_BF16, SHAPE(3), 2.0), *i = ts_tensor_zeros(TS_U8, SHAPE(2, 2));
    ts_tensor *y = ts_relu(b);
    assert_int_equal(y->dtype, TS_F32);
    assert_true(ts_tensor_get(y, 2) == 2.0);
    expect_error(ts_gelu(i), "gelu: input has dtype u8 (shape [2,2]), expected f32/f64/bf16");
    expect_error(ts_sigmoid(NULL), "sigmoid: input is NULL");
    ts_tensor *all[] = {b, i, y};
    release_all(3, all);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_gradcheck),
        cmocka_unit_test(test_dtypes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
