/* test_elementwise.c - broadcasting binary ops (every kernel path against a
 * direct reference), unary arithmetic, gradchecks and error messages. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kernels/ops/elementwise.h"
#include "op_testing.h"

typedef ts_tensor *(*binop)(ts_tensor *, ts_tensor *);
typedef ts_tensor *(*unop)(ts_tensor *);

static double apply(char op, double x, double y) {
    switch (op) {
    case '+': return x + y;
    case '-': return x - y;
    case '*': return x * y;
    default: return x / y;
    }
}

/* Element of t at output multi-index idx of an nd-dim broadcast result. */
static double at_broadcast(const ts_tensor *t, int nd, const int64_t *idx) {
    int64_t off = t->offset;
    for (int d = 0; d < t->ndim; d++) {
        int64_t i = idx[nd - t->ndim + d];
        off += (t->shape[d] == 1 ? 0 : i) * t->strides[d];
    }
    return t->dtype == TS_F64 ? ((double *)t->storage->data)[off] : ((float *)t->storage->data)[off];
}

/* Checks fn(a, b) against the op applied element by element. */
static void check_binary(binop fn, char op, ts_tensor *a, ts_tensor *b, double tol) {
    ts_tensor *o = fn(a, b);
    assert_non_null(o);
    assert_true(ts_tensor_is_contiguous(o));
    int64_t n = ts_tensor_numel(o), idx[TS_MAX_DIMS] = {0};
    for (int64_t i = 0; i < n; i++) {
        double want = apply(op, at_broadcast(a, o->ndim, idx), at_broadcast(b, o->ndim, idx));
        double got = ts_tensor_get(o, i);
        if (fabs(got - want) > tol * (1 + fabs(want))) {
            print_message("%c: element %lld got %.9g want %.9g\n", op, (long long)i, got, want);
            fail();
        }
        for (int d = o->ndim - 1; d >= 0; d--) {
            if (++idx[d] < o->shape[d]) break;
            idx[d] = 0;
        }
    }
    ts_tensor_release(o);
}

static ts_tensor *rnd(ts_dtype dt, uint64_t seed, int nd, const int64_t *shape) {
    return ts_tensor_uniform(ts_key_from_seed(seed), dt, nd, shape, 0.5, 2.0);
}

/* Every plan: same shape, scalar either side, row either side, strided
 * broadcast, non-contiguous, 0-dim, empty; f32 and f64; big enough for
 * OpenMP in some. */
static void test_binary_paths(void **state) {
    (void)state;
    binop fns[4] = {ts_add, ts_sub, ts_mul, ts_div};
    const char ops[4] = {'+', '-', '*', '/'};
    for (int dt = 0; dt < 2; dt++) {
        ts_dtype t = dt ? TS_F64 : TS_F32;
        double tol = dt ? 1e-14 : 1e-6;
        ts_tensor *m = rnd(t, 1, SHAPE(5, 7)), *m2 = rnd(t, 2, SHAPE(5, 7)), *row = rnd(t, 3, SHAPE(7)),
                  *row1 = rnd(t, 4, SHAPE(1, 1, 7)), *sc = rnd(t, 5, SHAPE0), *col = rnd(t, 6, SHAPE(5, 1)),
                  *cube = rnd(t, 7, SHAPE(2, 1, 7)), *big = rnd(t, 8, SHAPE(300, 257)),
                  *brow = rnd(t, 9, SHAPE(257)), *empty = rnd(t, 10, SHAPE(0, 7));
        ts_tensor *mbase = rnd(t, 11, SHAPE(7, 5)), *mt = ts_transpose(mbase, 0, 1); /* [5,7] strided */
        ts_tensor_release(mbase);
        /* transposed operands spanning several tiles, 2-d and batched 3-d */
        ts_tensor *tb = rnd(t, 12, SHAPE(45, 70)), *tt = ts_transpose(tb, 0, 1), *tc = rnd(t, 13, SHAPE(70, 45));
        ts_tensor *pb = rnd(t, 14, SHAPE(3, 33, 40)), *pt = ts_transpose(pb, 1, 2), *pr = rnd(t, 15, SHAPE(33));
        ts_tensor *pairs[][2] = {{m, m2},   {m, sc},    {sc, m},  {m, row},   {row, m},   {m, row1},
                                 {col, m},  {cube, col}, {mt, m}, {mt, row},  {col, row}, {sc, sc},
                                 {big, big}, {big, brow}, {brow, big}, {big, sc}, {empty, row},
                                 {tt, tc},  {tc, tt},    {tt, tt}, {pt, pr},  {pr, pt}};
        for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++)
            for (int k = 0; k < 4; k++) check_binary(fns[k], ops[k], pairs[p][0], pairs[p][1], tol);
        ts_tensor *all[] = {m, m2, row, row1, sc, col, cube, big, brow, empty, mt, tb, tt, tc, pb, pt, pr};
        release_all(17, all);
    }
}

static ts_tensor *call_bin(ts_tensor *const *in, void *ctx) { return (*(binop *)ctx)(in[0], in[1]); }
static ts_tensor *call_un(ts_tensor *const *in, void *ctx) { return (*(unop *)ctx)(in[0]); }

static void test_binary_gradcheck(void **state) {
    (void)state;
    binop fns[4] = {ts_add, ts_sub, ts_mul, ts_div};
    for (int k = 0; k < 4; k++) {
        /* b stays away from 0 so div is smooth */
        ts_tensor *cases[][2] = {
            {leaf(1, SHAPE(3, 4)), leaf_in(2, SHAPE(3, 4), 0.5, 2)},
            {leaf(3, SHAPE(3, 4)), leaf_in(4, SHAPE(4), 0.5, 2)},
            {leaf(5, SHAPE(4)), leaf_in(6, SHAPE(3, 4), 0.5, 2)},
            {leaf(7, SHAPE(2, 1, 3)), leaf_in(8, SHAPE(4, 1), 0.5, 2)},
            {leaf(9, SHAPE0), leaf_in(10, SHAPE(2, 3), 0.5, 2)},
            {leaf_t(11, 3, 4), leaf_in(12, SHAPE(3, 1), 0.5, 2)},
            {leaf(13, SHAPE(3, 4)), leaf_in(14, SHAPE(1), 0.5, 2)},
        };
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            check_grad(call_bin, &fns[k], 2, cases[c]);
            release_all(2, cases[c]);
        }
    }
}

/* the same input on both sides: gradients from both uses add up */
static void test_input_used_twice(void **state) {
    (void)state;
    binop f = ts_mul;
    ts_tensor *x = leaf(20, SHAPE(2, 3));
    ts_tensor *in[2] = {x, x};
    check_grad(call_bin, &f, 2, in);
    ts_tensor *y = ts_mul(x, x);
    ts_tensor_release(x->grad);
    x->grad = NULL;
    ts_tensor *w = ts_tensor_ones(TS_F64, SHAPE(2, 3));
    assert_int_equal(ts_backward(y, w), TS_OK);
    for (int i = 0; i < 6; i++) assert_true(fabs(ts_tensor_get(x->grad, i) - 2 * ts_tensor_get(x, i)) < 1e-15);
    ts_tensor_release(w);
    ts_tensor_release(y);
    ts_tensor_release(x);
}

static ts_tensor *pow3(ts_tensor *x) { return ts_pow_scalar(x, 3); }
static ts_tensor *pow_half(ts_tensor *x) { return ts_pow_scalar(x, 0.5); }
static ts_tensor *pow_m2(ts_tensor *x) { return ts_pow_scalar(x, -2); }
static ts_tensor *add_s(ts_tensor *x) { return ts_add_scalar(x, -1.5); }
static ts_tensor *mul_s(ts_tensor *x) { return ts_mul_scalar(x, 2.5); }

static void test_unary_values(void **state) {
    (void)state;
    ts_tensor *x = ts_tensor_from_data(TS_F32, SHAPE(4), (float[]){-2, 0.25f, 1, 4});
    struct {
        unop f;
        double want[4];
    } cases[] = {
        {ts_neg, {2, -0.25, -1, -4}},
        {ts_abs, {2, 0.25, 1, 4}},
        {ts_exp, {exp(-2), exp(0.25), exp(1), exp(4)}},
        {pow3, {-8, 1.0 / 64, 1, 64}},
        {add_s, {-3.5, -1.25, -0.5, 2.5}},
        {mul_s, {-5, 0.625, 2.5, 10}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ts_tensor *y = cases[c].f(x);
        assert_int_equal(y->dtype, TS_F32);
        for (int i = 0; i < 4; i++) assert_true(fabs(ts_tensor_get(y, i) - cases[c].want[i]) < 1e-5 * (1 + fabs(cases[c].want[i])));
        ts_tensor_release(y);
    }
    ts_tensor *l = ts_log(x), *s = ts_sqrt(x);
    assert_true(isnan(ts_tensor_get(l, 0)) && fabs(ts_tensor_get(l, 3) - log(4)) < 1e-6);
    assert_true(isnan(ts_tensor_get(s, 0)) && fabs(ts_tensor_get(s, 1) - 0.5) < 1e-7);
    ts_tensor_release(l);
    ts_tensor_release(s);
    ts_tensor_release(x);
}

static void test_unary_gradcheck(void **state) {
    (void)state;
    /* functions defined on all reals */
    unop any[] = {ts_neg, ts_exp, ts_abs, add_s, mul_s, pow3};
    /* functions that need positive inputs */
    unop pos[] = {ts_log, ts_sqrt, pow_half, pow_m2};
    for (size_t k = 0; k < sizeof any / sizeof any[0]; k++) {
        ts_tensor *in[] = {leaf(30, SHAPE(5)), leaf(31, SHAPE(2, 3, 2)), leaf_t(32, 3, 4), leaf(33, SHAPE0)};
        for (int c = 0; c < 4; c++) check_grad(call_un, &any[k], 1, &in[c]);
        release_all(4, in);
    }
    for (size_t k = 0; k < sizeof pos / sizeof pos[0]; k++) {
        ts_tensor *in[] = {leaf_in(34, SHAPE(5), 0.2, 3), leaf_in(35, SHAPE(2, 3, 2), 0.2, 3)};
        for (int c = 0; c < 2; c++) check_grad(call_un, &pos[k], 1, &in[c]);
        release_all(2, in);
    }
}

static void test_bf16_computes_in_f32(void **state) {
    (void)state;
    ts_tensor *a = ts_tensor_full(TS_BF16, SHAPE(2, 3), 1.5), *b = ts_tensor_full(TS_F32, SHAPE(3), 0.25);
    ts_tensor *c = ts_add(a, b), *e = ts_exp(a);
    assert_int_equal(c->dtype, TS_F32);
    assert_true(ts_tensor_get(c, 5) == 1.75);
    assert_int_equal(e->dtype, TS_F32);
    ts_tensor *all[] = {a, b, c, e};
    release_all(4, all);
}

static void test_errors(void **state) {
    (void)state;
    ts_tensor *a = ts_tensor_zeros(TS_F32, SHAPE(2, 3)), *b = ts_tensor_zeros(TS_F32, SHAPE(4));
    ts_tensor *d = ts_tensor_zeros(TS_F64, SHAPE(3)), *i = ts_tensor_zeros(TS_I32, SHAPE(2, 3));
    expect_error(ts_add(a, b), "add: shapes [2,3] and [4] do not broadcast");
    assert_int_equal(ts_last_status(), TS_ERR_SHAPE);
    expect_error(ts_div(b, a), "div: shapes [4] and [2,3] do not broadcast");
    expect_error(ts_sub(a, d), "sub: dtypes f32 and f64 differ (shapes [2,3] and [3])");
    assert_int_equal(ts_last_status(), TS_ERR_DTYPE);
    expect_error(ts_mul(i, a), "mul: a has dtype i32 (shape [2,3])");
    expect_error(ts_mul(a, i), "mul: b has dtype i32");
    expect_error(ts_exp(i), "exp: input has dtype i32");
    expect_error(ts_add(a, NULL), "add: b is NULL");
    ts_tensor *all[] = {a, b, d, i};
    release_all(4, all);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_binary_paths),      cmocka_unit_test(test_binary_gradcheck),
        cmocka_unit_test(test_input_used_twice),  cmocka_unit_test(test_unary_values),
        cmocka_unit_test(test_unary_gradcheck),   cmocka_unit_test(test_bf16_computes_in_f32),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
