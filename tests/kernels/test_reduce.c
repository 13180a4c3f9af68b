/* test_reduce.c - sum/mean/max over all and over dims (one run, scattered
 * dims, keepdim, negative dims), values against direct loops, gradchecks on
 * contiguous, transposed and broadcast inputs, and error messages. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kernels/ops/elementwise.h"
#include "kernels/ops/reduce.h"
#include "op_testing.h"

typedef ts_tensor *(*reduce_fn)(ts_tensor *, int, const int *, bool);

/* Reference reduction of a [2,3,4] tensor over the dims in mask: returns
 * the value at output position (i0,i1,i2) with reduced coords free. */
static double ref(const ts_tensor *x, unsigned mask, int kind, const int64_t *at) {
    double acc = kind == 2 ? -INFINITY : 0;
    int64_t cnt = 0;
    for (int64_t i = 0; i < 2; i++)
        for (int64_t j = 0; j < 3; j++)
            for (int64_t k = 0; k < 4; k++) {
                int64_t c[3] = {i, j, k};
                bool in = true;
                for (int d = 0; d < 3; d++)
                    if (!((mask >> d) & 1) && c[d] != at[d]) in = false;
                if (!in) continue;
                double v = ts_tensor_get(x, (i * 3 + j) * 4 + k);
                acc = kind == 2 ? (v > acc ? v : acc) : acc + v;
                cnt++;
            }
    return kind == 1 ? acc / (double)cnt : acc;
}

static void test_values_over_dims(void **state) {
    (void)state;
    reduce_fn fns[3] = {ts_sum, ts_mean, ts_max};
    int dimsets[][3] = {{0}, {1}, {2}, {-1}, {0, 1}, {1, 2}, {0, 2}, {2, 0}, {0, 1, 2}};
    int ndims[] = {1, 1, 1, 1, 2, 2, 2, 2, 3};
    for (int dt = 0; dt < 2; dt++) {
        ts_tensor *x = ts_tensor_randn(ts_key_from_seed(3), dt ? TS_F64 : TS_F32, SHAPE(2, 3, 4));
        ts_tensor *base = ts_tensor_randn(ts_key_from_seed(4), dt ? TS_F64 : TS_F32, SHAPE(4, 3, 2));
        ts_tensor *xt = ts_permute(base, (int[]){2, 1, 0}); /* [2,3,4] strided */
        ts_tensor *inputs[2] = {x, xt};
        for (int in = 0; in < 2; in++)
            for (int f = 0; f < 3; f++)
                for (size_t s = 0; s < sizeof ndims / sizeof ndims[0]; s++)
                    for (int keep = 0; keep < 2; keep++) {
                        ts_tensor *y = fns[f](inputs[in], ndims[s], dimsets[s], keep);
                        assert_non_null(y);
                        unsigned mask = 0;
                        for (int i = 0; i < ndims[s]; i++) mask |= 1u << ((dimsets[s][i] + 3) % 3);
                        int expect_nd = keep ? 3 : 3 - __builtin_popcount(mask);
                        assert_int_equal(y->ndim, expect_nd);
                        /* walk output positions */
                        int64_t n = ts_tensor_numel(y);
                        for (int64_t e = 0; e < n; e++) {
                            int64_t at[3] = {0, 0, 0}, rem = e;
                            for (int d = 2; d >= 0; d--) {
                                if ((mask >> d) & 1) continue;
                                int64_t sz = d == 0 ? 2 : d == 1 ? 3 : 4;
                                at[d] = rem % sz;
                                rem /= sz;
                            }
                            /* reference reads x row-major through ts_tensor_get */
                            double want = ref(inputs[in], mask, f, at), got = ts_tensor_get(y, e);
                            if (fabs(got - want) > 1e-5 * (1 + fabs(want))) {
                                print_message("fn %d dims set %zu keep %d elem %lld: %g vs %g\n", f, s, keep,
                                              (long long)e, got, want);
                                fail();
                            }
                        }
                        ts_tensor_release(y);
                    }
        ts_tensor *all[] = {x, base, xt};
        release_all(3, all);
    }
}

static void test_all_and_big(void **state) {
    (void)state;
    /* 1..n sums exactly; big enough for the threaded paths */
    ts_tensor *r = ts_tensor_arange(TS_F32, 1, 200001, 1);
    ts_tensor *s = ts_sum_all(r), *m = ts_mean_all(r), *mx = ts_max_all(r);
    assert_int_equal(s->ndim, 0);
    /* accumulated in double: only the final rounding to f32 remains */
    assert_true(fabs(ts_tensor_item(s) / (200000.0 * 200001.0 / 2) - 1) < 1e-7);
    assert_true(fabs(ts_tensor_item(m) - 100000.5) < 1e-2);
    assert_true(ts_tensor_item(mx) == 200000.0);
    ts_tensor *r2 = ts_reshape(r, SHAPE(400, 500));
    ts_tensor *c = ts_sum(r2, 1, (int[]){0}, false), *rr = ts_sum(r2, 1, (int[]){1}, true);
    assert_int_equal(c->shape[0], 500);
    assert_true(ts_tensor_get(c, 0) == 400.0 * 1 + 500.0 * (399 * 400 / 2));
    assert_int_equal(rr->ndim, 2);
    assert_int_equal(rr->shape[1], 1);
    assert_true(ts_tensor_get(rr, 1) == 500.0 * 501 + 500.0 * 499 / 2);
    ts_tensor *e = ts_tensor_zeros(TS_F32, SHAPE(0, 3));
    ts_tensor *se = ts_sum(e, 1, (int[]){0}, false), *me = ts_mean(e, 1, (int[]){0}, false);
    assert_true(ts_tensor_get(se, 2) == 0.0);
    assert_true(isnan(ts_tensor_get(me, 2)));
    ts_tensor *all[] = {r, s, m, mx, r2, c, rr, e, se, me};
    release_all(10, all);
}

static void test_max_routes_to_first_argmax(void **state) {
    (void)state;
    ts_tensor *x = ts_tensor_from_data(TS_F64, SHAPE(2, 3), (double[]){1, 5, 5, 7, 2, 7});
    ts_set_requires_grad(x, true);
    ts_tensor *y = ts_max(x, 1, (int[]){1}, false);
    assert_true(ts_tensor_get(y, 0) == 5 && ts_tensor_get(y, 1) == 7);
    ts_tensor *g = ts_tensor_from_data(TS_F64, SHAPE(2), (double[]){10, 20});
    assert_int_equal(ts_backward(y, g), TS_OK);
    double want[6] = {0, 10, 0, 20, 0, 0};
    for (int i = 0; i < 6; i++) assert_true(ts_tensor_get(x->grad, i) == want[i]);
    ts_tensor *all[] = {x, y, g};
    release_all(3, all);
}

typedef struct {
    reduce_fn f;
    int nd;
    int dims[3];
    bool keep;
} rcase;

static ts_tensor *call_reduce(ts_tensor *const *in, void *ctx) {
    rcase *c = ctx;
    return c->f(in[0], c->nd, c->dims, c->keep);
}

/* x + b broadcast, then reduced: the gradient flows back through both */
static ts_tensor *call_bias_reduce(ts_tensor *const *in, void *ctx) {
    ts_tensor *s = ts_add(in[0], in[1]);
    ts_tensor *y = call_reduce(&s, ctx);
    ts_tensor_release(s);
    return y;
}

static void test_gradcheck(void **state) {
    (void)state;
    reduce_fn fns[3] = {ts_sum, ts_mean, ts_max};
    rcase shapes[] = {{NULL, 0, {0}, false}, {NULL, 1, {0}, false}, {NULL, 1, {-1}, true},
                      {NULL, 2, {0, 2}, true}, {NULL, 2, {2, 0}, false}, {NULL, 1, {1}, false}};
    rcase flat[] = {{NULL, 0, {0}, false}, {NULL, 1, {0}, false}, {NULL, 1, {1}, true}, {NULL, 2, {1, 0}, false}};
    for (int f = 0; f < 3; f++) {
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            rcase c = shapes[s];
            c.f = fns[f];
            ts_tensor *x = leaf(40 + s, SHAPE(3, 4, 5));
            check_grad(call_reduce, &c, 1, &x);
            ts_tensor_release(x);
        }
        for (size_t s = 0; s < sizeof flat / sizeof flat[0]; s++) {
            rcase c = flat[s];
            c.f = fns[f];
            ts_tensor *xt = leaf_t(50 + s, 4, 5); /* non-contiguous */
            check_grad(call_reduce, &c, 1, &xt);
            ts_tensor_release(xt);
        }
    }
    for (int f = 0; f < 3; f++) {
        rcase c = {fns[f], 1, {0}, false};
        ts_tensor *in[2] = {leaf(60, SHAPE(3, 4)), leaf(61, SHAPE(4))};
        check_grad(call_bias_reduce, &c, 2, in);
        release_all(2, in);
        ts_tensor *sc = leaf(62, SHAPE0);
        rcase all = {fns[f], 0, {0}, false};
        check_grad(call_reduce, &all, 1, &sc);
        ts_tensor_release(sc);
    }
}

static void test_errors(void **state) {
    (void)state;
    ts_tensor *x = ts_tensor_zeros(TS_F32, SHAPE(2, 3)), *i = ts_tensor_zeros(TS_I64, SHAPE(4));
    ts_tensor *e = ts_tensor_zeros(TS_F32, SHAPE(2, 0));
    expect_error(ts_sum(x, 1, (int[]){2}, false), "sum: dim 2 out of range for [2,3]");
    expect_error(ts_mean(x, 2, (int[]){1, -1}, false), "mean: dim -1 listed twice for [2,3]");
    expect_error(ts_max_all(i), "max: input has dtype i64 (shape [4])");
    expect_error(ts_max(e, 1, (int[]){1}, false), "max: cannot reduce [2,0] over an empty dim");
    ts_tensor *all[] = {x, i, e};
    release_all(3, all);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values_over_dims), cmocka_unit_test(test_all_and_big),
        cmocka_unit_test(test_max_routes_to_first_argmax), cmocka_unit_test(test_gradcheck),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
