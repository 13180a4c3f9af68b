/* test_norm.c - layernorm: values against a direct computation, gradients
 * of x, weight and bias (optional ones absent, non-contiguous x), errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <string.h>
#include <cmocka.h>

#include "fused_util.h"
#include "kernels/ops/norm.h"

static void test_values(void **state) {
    (void)state;
    ts_tensor *x = ts_tensor_randn(ts_key_from_seed(1), TS_F32, SHAPE(37, 300));
    ts_tensor *w = ts_tensor_randn(ts_key_from_seed(2), TS_F32, SHAPE(300));
    ts_tensor *b = ts_tensor_randn(ts_key_from_seed(3), TS_F32, SHAPE(300));
    ts_tensor *y = ts_layernorm(x, w, b, 1e-5);
    assert_non_null(y);
    for (int r = 0; r < 37; r += 6) {
        double mu = 0, var = 0;
        for (int j = 0; j < 300; j++) mu += ts_tensor_get(x, r * 300 + j) / 300;
        for (int j = 0; j < 300; j++) var += pow(ts_tensor_get(x, r * 300 + j) - mu, 2) / 300;
        for (int j = 0; j < 300; j += 17) {
            double want = (ts_tensor_get(x, r * 300 + j) - mu) / sqrt(var + 1e-5) * ts_tensor_get(w, j) +
                          ts_tensor_get(b, j);
            assert_float_equal(ts_tensor_get(y, r * 300 + j), want, 1e-5);
        }
    }
    ts_tensor_release(x);
    ts_tensor_release(w);
    ts_tensor_release(b);
    ts_tensor_release(y);
}

/* which: bit 0 weight present, bit 1 bias present. */
static ts_tensor *ln_fn(ts_tensor *const *in, void *ctx) {
    int which = *(int *)ctx;
    return ts_layernorm(in[0], which & 1 ? in[1] : NULL, which & 2 ? in[2] : NULL, 1e-5);
}

static void test_gradcheck(void **state) {
    (void)state;
    struct {
        int ndim;
        int64_t shape[3];
    } cases[] = {{1, {6}}, {2, {4, 5}}, {3, {2, 3, 7}}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int which = 0; which < 4; which++) {
            int64_t D = cases[c].shape[cases[c].ndim - 1];
            ts_tensor *in[3] = {leaf(20 + c, cases[c].ndim, cases[c].shape), leaf(40 + c, 1, &D),
                                leaf(60 + c, 1, &D)};
            assert_int_equal(check_grads(ln_fn, &which, 3, in), TS_OK);
            for (int i = 0; i < 3; i++) ts_tensor_release(in[i]);
        }
}

static void test_non_contiguous(void **state) {
    (void)state;
    int which = 3;
    ts_tensor *in[3] = {leaf_transposed(7, SHAPE(2, 5, 4)), leaf(8, SHAPE(4)), leaf(9, SHAPE(4))};
    assert_false(ts_tensor_is_contiguous(in[0]));
    assert_int_equal(check_grads(ln_fn, &which, 3, in), TS_OK);
    for (int i = 0; i < 3; i++) ts_tensor_release(in[i]);
}

static void test_large_backward_parallel(void **state) {
    (void)state;
    /* enough rows for the threaded path: dweight must equal the serial sum */
    ts_tensor *x = ts_tensor_randn(ts_key_from_seed(11), TS_F64, SHAPE(256, 200));
    ts_tensor *w = leaf(12, SHAPE(200));
    ts_tensor *y = ts_layernorm(x, w, NULL, 1e-5);
    ts_tensor *g = ts_tensor_ones(TS_F64, SHAPE(256, 200));
    assert_int_equal(ts_backward(y, g), TS_OK);
    for (int j = 0; j < 200; j += 23) {
        double want = 0;
        for (int r = 0; r < 256; r++) want += (ts_tensor_get(y, r * 200 + j)) / ts_tensor_get(w, j);
        assert_float_equal(ts_tensor_get(w->grad, j), want, 1e-8);
    }
    ts_tensor_release(x);
    ts_tensor_release(w);
    ts_tensor_release(y);
    ts_tensor_release(g);
}

static void test_errors(void **state) {
    (void)state;
    ts_tensor *x = ts_tensor_zeros(TS_F32, SHAPE(4, 8));
    ts_tensor *w5 = ts_tensor_ones(TS_F32, SHAPE(5));
    ts_tensor *w64 = ts_tensor_ones(TS_F64, SHAPE(8));
    assert_null(ts_layernorm(x, w5, NULL, 1e-5));
    assert_non_null(strstr(ts_last_error(), "layernorm: weight [5] does not match the last dim of x [4,8]"));
    assert_null(ts_layernorm(x, NULL, w64, 1e-5));
    assert_non_null(strstr(ts_last_error(), "layernorm: bias has dtype f64"));
    assert_null(ts_layernorm(x, NULL, NULL, -1));
    assert_non_null(strstr(ts_last_error(), "layernorm: eps -1 must be finite and > 0"));
    /* eps 0 was taken: a constant row (x is zeros) then has rstd = inf and
     * normalises to NaN */
    assert_null(ts_layernorm(x, NULL, NULL, 0));
    assert_non_null(strstr(ts_last_error(), "layernorm: eps 0 must be finite and > 0"));
    ts_tensor *s = ts_tensor_scalar(TS_F32, 1);
    assert_null(ts_layernorm(s, NULL, NULL, 1e-5));
    assert_non_null(strstr(ts_last_error(), "at least one dim"));
    ts_tensor_release(x);
    ts_tensor_release(w5);
    ts_tensor_release(w64);
    ts_tensor_release(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values),         cmocka_unit_test(test_gradcheck),
        cmocka_unit_test(test_non_contiguous), cmocka_unit_test(test_large_backward_parallel),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
