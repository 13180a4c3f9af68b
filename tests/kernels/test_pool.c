/* test_pool.c - max_pool2d and avg_pool2d values against a direct loop,
 * gradcheck over windows, strides and padding (incl. non-contiguous input),
 * argmax routing, and the error messages. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "kernels/autograd.h"
#include "kernels/ops/pool.h"
#include "kernels/ops/view.h"
#include "kernels/tensor.h"

#define SHAPE(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}

typedef struct {
    int64_t k[6]; /* kh, kw, sh, sw, ph, pw */
    bool is_max, transpose_x;
} pool_ctx;

static ts_tensor *pool_fn(ts_tensor *const *in, void *vctx) {
    const pool_ctx *c = vctx;
    ts_tensor *x = c->transpose_x ? ts_transpose(in[0], 2, 3) : ts_tensor_retain(in[0]);
    const int64_t *k = c->k;
    ts_tensor *y = c->is_max ? ts_max_pool2d(x, k[0], k[1], k[2], k[3], k[4], k[5])
                             : ts_avg_pool2d(x, k[0], k[1], k[2], k[3], k[4], k[5]);
    ts_tensor_release(x);
    return y;
}

/* pooled value at (p, i, j) by the definition */
static double direct(const ts_tensor *x, const pool_ctx *c, int64_t p, int64_t i, int64_t j) {
    int64_t H = x->shape[2], W = x->shape[3];
    double best = -INFINITY, sum = 0;
    for (int64_t a = 0; a < c->k[0]; a++)
        for (int64_t b = 0; b < c->k[1]; b++) {
            int64_t ih = i * c->k[2] - c->k[4] + a, iw = j * c->k[3] - c->k[5] + b;
            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
            double v = ts_tensor_get(x, (p * H + ih) * W + iw);
            sum += v;
            if (v > best) best = v;
        }
    return c->is_max ? best : sum / (double)(c->k[0] * c->k[1]);
}

static void check_pool(int64_t N, int64_t C, int64_t H, int64_t W, pool_ctx c) {
    ts_tensor *x = ts_tensor_randn(ts_key_from_seed(9), TS_F32, SHAPE(N, C, H, W));
    ts_tensor *y = pool_fn(&x, &c);
    assert_non_null(y);
    int64_t Ho = (H + 2 * c.k[4] - c.k[0]) / c.k[2] + 1, Wo = (W + 2 * c.k[5] - c.k[1]) / c.k[3] + 1;
    assert_int_equal(y->shape[2], Ho);
    assert_int_equal(y->shape[3], Wo);
    for (int64_t p = 0; p < N * C; p++)
        for (int64_t i = 0; i < Ho; i++)
            for (int64_t j = 0; j < Wo; j++) {
                double want = direct(x, &c, p, i, j), got = ts_tensor_get(y, (p * Ho + i) * Wo + j);
                assert_true(fabs(got - want) < 1e-5);
            }
    ts_tensor_release(x);
    ts_tensor_release(y);
}

static void test_values(void **state) {
    (void)state;
    for (int m = 0; m < 2; m++) {
        check_pool(2, 3, 8, 8, (pool_ctx){{2, 2, 2, 2, 0, 0}, m, false});
        check_pool(1, 2, 7, 9, (pool_ctx){{3, 3, 2, 2, 1, 1}, m, false});
        check_pool(2, 1, 6, 5, (pool_ctx){{3, 2, 1, 2, 1, 0}, m, false});
        check_pool(1, 1, 5, 5, (pool_ctx){{5, 5, 1, 1, 0, 0}, m, false});
        check_pool(4, 16, 32, 32, (pool_ctx){{2, 2, 1, 1, 1, 1}, m, false}); /* OpenMP loops */
    }
}

static void gradcheck_pool(int64_t N, int64_t C, int64_t H, int64_t W, pool_ctx c) {
    ts_tensor *x = ts_tensor_randn(ts_key_from_seed(13), TS_F64, SHAPE(N, C, H, W));
    ts_set_requires_grad(x, true);
    ts_status st = ts_gradcheck(pool_fn, &c, 1, &x, 1e-6, 1e-7, 1e-6);
    if (st) print_error("%s\n", ts_last_error());
    assert_int_equal(st, TS_OK);
    ts_tensor_release(x);
}

static void test_gradcheck(void **state) {
    (void)state;
    for (int m = 0; m < 2; m++) { /* random normal inputs: no ties within a window */
        gradcheck_pool(2, 2, 6, 6, (pool_ctx){{2, 2, 2, 2, 0, 0}, m, false});
        gradcheck_pool(1, 2, 7, 5, (pool_ctx){{3, 3, 2, 2, 1, 1}, m, false});
        gradcheck_pool(1, 1, 6, 6, (pool_ctx){{3, 3, 1, 1, 1, 1}, m, false}); /* overlapping windows */
        gradcheck_pool(2, 1, 5, 6, (pool_ctx){{2, 3, 1, 2, 1, 1}, m, true});  /* x [2,1,6,5] transposed */
    }
}

/* max backward puts each output gradient at its window's argmax, summing
 * where overlapping windows share one */
static void test_argmax_routing(void **state) {
    (void)state;
    double v[] = {1, 9, 2, 3, 4, 5, 6, 7, 8};
    ts_tensor *x = ts_tensor_from_data(TS_F64, SHAPE(1, 1, 3, 3), v);
    ts_set_requires_grad(x, true);
    ts_tensor *y = ts_max_pool2d(x, 2, 2, 1, 1, 0, 0); /* [[9,5],[7,8]] */
    assert_true(ts_tensor_get(y, 0) == 9 && ts_tensor_get(y, 1) == 9);
    assert_true(ts_tensor_get(y, 2) == 7 && ts_tensor_get(y, 3) == 8);
    ts_tensor *g = ts_tensor_from_data(TS_F64, SHAPE(1, 1, 2, 2), (double[]){1, 2, 3, 4});
    assert_int_equal(ts_backward(y, g), TS_OK);
    double want[] = {0, 3, 0, 0, 0, 0, 0, 3, 4};
    for (int i = 0; i < 9; i++) assert_true(ts_tensor_get(x->grad, i) == want[i]);
    ts_tensor_release(x);
    ts_tensor_release(y);
    ts_tensor_release(g);
}

/* a NaN in a window gives NaN, like PyTorch */
static void test_nan_propagates(void **state) {
    (void)state;
    float v[] = {1, NAN, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    ts_tensor *x = ts_tensor_from_data(TS_F32, SHAPE(1, 1, 4, 4), v);
    ts_tensor *y = ts_max_pool2d(x, 2, 2, 2, 2, 0, 0);
    assert_true(isnan(ts_tensor_get(y, 0)));
    assert_true(ts_tensor_get(y, 1) == 7 && ts_tensor_get(y, 3) == 15);
    ts_tensor_release(x);
    ts_tensor_release(y);
}

static void test_errors(void **state) {
    (void)state;
    ts_tensor *x = ts_tensor_zeros(TS_F32, SHAPE(2, 3, 4, 4));
    assert_null(ts_max_pool2d(x, 2, 2, 0, 2, 0, 0));
    assert_non_null(strstr(ts_last_error(), "max_pool2d: kernel 2x2, stride 0x2, padding 0x0 on input [2,3,4,4]"));
    assert_null(ts_avg_pool2d(x, 2, 2, 2, 2, 2, 0));
    assert_non_null(strstr(ts_last_error(), "avg_pool2d: kernel 2x2, stride 2x2, padding 2x0"));
    assert_null(ts_max_pool2d(x, 5, 5, 1, 1, 0, 0));
    assert_string_equal(ts_last_error(), "max_pool2d: kernel 5x5 does not fit input [2,3,4,4] padded by 0x0");
    ts_tensor *x3 = ts_tensor_zeros(TS_F32, SHAPE(3, 4, 4));
    assert_null(ts_max_pool2d(x3, 2, 2, 2, 2, 0, 0));
    assert_string_equal(ts_last_error(), "max_pool2d: input [3,4,4] must be [N,C,H,W]");
    ts_tensor *xb = ts_tensor_zeros(TS_BF16, SHAPE(1, 1, 4, 4));
    assert_null(ts_avg_pool2d(xb, 2, 2, 2, 2, 0, 0));
    assert_non_null(strstr(ts_last_error(), "avg_pool2d: input has dtype bf16"));
    ts_tensor_release(x);
    ts_tensor_release(x3);
    ts_tensor_release(xb);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_gradcheck),
        cmocka_unit_test(test_argmax_routing),
        cmocka_unit_test(test_nan_propagates),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
