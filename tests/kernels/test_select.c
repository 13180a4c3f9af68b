/* test_select.c - where / masked_fill (broadcast masks, strided operands),
 * concat, split, stack (values, gradients through each, dtypes) and error
 * messages. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kernels/ops/elementwise.h"
#include "kernels/ops/select.h"
#include "op_testing.h"

static ts_tensor *mask_of(int nd, const int64_t *shape, const uint8_t *bits) {
    return ts_tensor_from_data(TS_U8, nd, shape, bits);
}

static void test_where_values(void **state) {
    (void)state;
    ts_tensor *m = mask_of(SHAPE(2, 1), (uint8_t[]){1, 0});
    ts_tensor *a = ts_tensor_arange(TS_F32, 0, 3, 1); /* [3] */
    ts_tensor *b = ts_tensor_full(TS_F32, SHAPE0, -1);
    ts_tensor *y = ts_where(m, a, b); /* [2,3] */
    assert_int_equal(y->ndim, 2);
    float want[6] = {0, 1, 2, -1, -1, -1};
    for (int i = 0; i < 6; i++) assert_true(ts_tensor_get(y, i) == want[i]);
    /* strided mask: transpose of a [3,2] mask */
    ts_tensor *mb = mask_of(SHAPE(3, 2), (uint8_t[]){1, 0, 0, 1, 1, 1});
    ts_tensor *mt = ts_transpose(mb, 0, 1); /* [2,3]: rows 1,0,1 / 0,1,1 */
    ts_tensor *f = ts_masked_fill(y, mt, 9);
    float wf[6] = {9, 1, 9, -1, 9, 9};
    for (int i = 0; i < 6; i++) assert_true(ts_tensor_get(f, i) == wf[i]);
    /* threaded size */
    ts_tensor *big = ts_tensor_randn(ts_key_from_seed(2), TS_F64, SHAPE(300, 200));
    ts_tensor *bm = ts_tensor_empty(TS_U8, SHAPE(300, 1));
    for (int i = 0; i < 300; i++) ts_tensor_set(bm, i, i % 3 == 0);
    ts_tensor *bf = ts_masked_fill(big, bm, -INFINITY);
    for (int64_t i = 0; i < 60000; i += 97)
        assert_true(ts_tensor_get(bf, i) == ((i / 200) % 3 == 0 ? -INFINITY : ts_tensor_get(big, i)));
    ts_tensor *all[] = {m, a, b, y, mb, mt, f, big, bm, bf};
    release_all(10, all);
}

typedef struct {
    ts_tensor *mask;
} wctx;

static ts_tensor *call_where(ts_tensor *const *in, void *ctx) { return ts_where(((wctx *)ctx)->mask, in[0], in[1]); }
static ts_tensor *call_fill(ts_tensor *const *in, void *ctx) { return ts_masked_fill(in[0], ((wctx *)ctx)->mask, 3.5); }

static void test_where_gradcheck(void **state) {
    (void)state;
    ts_tensor *m34 = ts_tensor_empty(TS_U8, SHAPE(3, 4)), *m4 = mask_of(SHAPE(4), (uint8_t[]){0, 1, 1, 0});
    for (int i = 0; i < 12; i++) ts_tensor_set(m34, i, (i * 7) % 3 == 0);
    struct {
        ts_tensor *mask, *a, *b;
        int fill; /* the input masked_fill is checked on (-1: none has the full shape) */
    } cases[] = {
        {m34, leaf(1, SHAPE(3, 4)), leaf(2, SHAPE(3, 4)), 0},
        {m34, leaf(3, SHAPE(4)), leaf(4, SHAPE0), -1},
        {m4, leaf_t(5, 3, 4), leaf(6, SHAPE(3, 1)), 0},
        {m4, leaf(7, SHAPE(2, 1, 1)), leaf(8, SHAPE(3, 4)), 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        wctx ctx = {cases[c].mask};
        ts_tensor *in[2] = {cases[c].a, cases[c].b};
        check_grad(call_where, &ctx, 2, in);
        if (cases[c].fill >= 0) check_grad(call_fill, &ctx, 1, &in[cases[c].fill]);
        release_all(2, in);
    }
    ts_tensor_release(m34);
    ts_tensor_release(m4);
}

typedef struct {
    int n, dim;
} jctx;

static ts_tensor *call_concat(ts_tensor *const *in, void *ctx) {
    jctx *j = ctx;
    return ts_concat(j->n, in, j->dim);
}
static ts_tensor *call_stack(ts_tensor *const *in, void *ctx) {
    jctx *j = ctx;
    return ts_stack(j->n, in, j->dim);
}

/* split into unequal parts, weight each part differently, concat back */
static ts_tensor *call_split(ts_tensor *const *in, void *ctx) {
    (void)ctx;
    ts_tensor *p[3];
    if (ts_split(in[0], 1, 3, (int64_t[]){1, 3, 1}, p)) return NULL;
    ts_tensor *q = ts_mul_scalar(p[1], 2), *e = ts_exp(p[2]);
    ts_tensor *parts[3] = {e, p[0], q};
    ts_tensor *out = ts_concat(3, parts, 1);
    release_all(3, p);
    ts_tensor_release(q);
    ts_tensor_release(e);
    return out;
}

static void test_join_values(void **state) {
    (void)state;
    ts_tensor *a = ts_tensor_arange(TS_I64, 0, 6, 1), *b = ts_tensor_arange(TS_I64, 6, 10, 1);
    ts_tensor *a2 = ts_reshape(a, SHAPE(2, 3)), *b2 = ts_reshape(b, SHAPE(2, 2));
    ts_tensor *ab[2] = {a2, b2};
    ts_tensor *c = ts_concat(2, ab, -1); /* [2,5] */
    int64_t wc[10] = {0, 1, 2, 6, 7, 3, 4, 5, 8, 9};
    assert_int_equal(c->dtype, TS_I64);
    for (int i = 0; i < 10; i++) assert_true(ts_tensor_get(c, i) == wc[i]);
    ts_tensor *parts[5];
    assert_int_equal(ts_split(c, 1, 5, NULL, parts), TS_OK);
    assert_int_equal(parts[3]->shape[1], 1);
    assert_true(ts_tensor_get(parts[3], 1) == 8);
    release_all(5, parts);
    /* stack of a transposed view and a contiguous tensor at the end */
    ts_tensor *t = ts_transpose(a2, 0, 1), *tc = ts_tensor_copy_as(t, TS_I64); /* [3,2] */
    ts_tensor *tt[2] = {t, tc};
    ts_tensor *s = ts_stack(2, tt, -1); /* [3,2,2] */
    assert_int_equal(s->ndim, 3);
    assert_int_equal(s->shape[2], 2);
    for (int i = 0; i < 6; i++) {
        assert_true(ts_tensor_get(s, 2 * i) == ts_tensor_get(t, i));
        assert_true(ts_tensor_get(s, 2 * i + 1) == ts_tensor_get(t, i));
    }
    ts_tensor *s0 = ts_stack(2, tt, 0);
    assert_int_equal(s0->shape[0], 2);
    assert_true(ts_tensor_get(s0, 7) == ts_tensor_get(t, 1));
    ts_tensor *all[] = {a, b, a2, b2, c, t, tc, s, s0};
    release_all(9, all);
}

static void test_join_gradcheck(void **state) {
    (void)state;
    {
        ts_tensor *in[3] = {leaf(10, SHAPE(2, 3)), leaf_t(11, 2, 4), leaf(12, SHAPE(2, 1))};
        jctx j = {3, 1};
        check_grad(call_concat, &j, 3, in);
        release_all(3, in);
    }
    {
        ts_tensor *in[2] = {leaf(13, SHAPE(2, 3, 2)), leaf(14, SHAPE(1, 3, 2))};
        jctx j = {2, 0};
        check_grad(call_concat, &j, 2, in);
        release_all(2, in);
    }
    for (int dim = -3; dim <= 2; dim++) {
        ts_tensor *in[3] = {leaf(15, SHAPE(3, 2)), leaf_t(16, 3, 2), leaf(17, SHAPE(3, 2))};
        jctx j = {3, dim};
        check_grad(call_stack, &j, 3, in);
        release_all(3, in);
    }
    ts_tensor *x = leaf(18, SHAPE(2, 5)), *xt = leaf_t(19, 3, 5);
    check_grad(call_split, NULL, 1, &x);
    check_grad(call_split, NULL, 1, &xt);
    ts_tensor_release(x);
    ts_tensor_release(xt);
}

static void test_errors(void **state) {
    (void)state;
    ts_tensor *a = ts_tensor_zeros(TS_F32, SHAPE(2, 3)), *b = ts_tensor_zeros(TS_F32, SHAPE(4, 3));
    ts_tensor *c = ts_tensor_zeros(TS_F32, SHAPE(2, 4)), *d = ts_tensor_zeros(TS_F64, SHAPE(2, 3));
    ts_tensor *mf = ts_tensor_zeros(TS_F32, SHAPE(2, 3)), *m4 = ts_tensor_zeros(TS_U8, SHAPE(4));
    ts_tensor *m23 = ts_tensor_zeros(TS_U8, SHAPE(2, 3)), *i = ts_tensor_zeros(TS_I32, SHAPE(2, 3));
    expect_error(ts_where(mf, a, a), "where: mask has dtype f32 (shape [2,3]), expected u8");
    expect_error(ts_where(m4, a, a), "where: shapes [4] and [2,3] do not broadcast");
    expect_error(ts_where(m23, a, b), "where: shapes [2,3] and [4,3] do not broadcast");
    expect_error(ts_where(m23, a, d), "where: dtypes f32 and f64 differ");
    expect_error(ts_where(m23, i, a), "where: a has dtype i32");
    ts_tensor *m2 = ts_tensor_zeros(TS_U8, SHAPE(3, 2, 3));
    expect_error(ts_masked_fill(a, m2, 0), "masked_fill: mask [3,2,3] does not broadcast to input [2,3]");
    ts_tensor *ac[2] = {a, b}, *ad[2] = {a, d}, *acc[2] = {a, c};
    expect_error(ts_concat(2, ac, 1), "concat: tensors[1] has shape [4,3] but tensors[0] has [2,3] (all dims but 1 must match)");
    assert_int_equal(ts_last_status(), TS_ERR_SHAPE);
    expect_error(ts_concat(2, ad, 0), "concat: tensors[1] has dtype f64 but tensors[0] has f32");
    expect_error(ts_concat(2, ac, 2), "concat: dim 2 out of range for [2,3]");
    expect_error(ts_concat(0, ac, 0), "concat: needs at least one tensor (got 0)");
    expect_error(ts_stack(2, acc, 0), "stack: tensors[1] has shape [2,4] but tensors[0] has [2,3]");
    expect_error(ts_stack(1, ac, 3), "stack: dim 3 out of range for stacking [2,3] tensors");
    ts_tensor *out[4] = {a, a, a, a};
    assert_int_not_equal(ts_split(a, 1, 2, NULL, out), TS_OK);
    assert_non_null(strstr(ts_last_error(), "split: dim 1 of [2,3] (size 3) does not divide into 2 equal parts"));
    assert_null(out[0]);
    assert_int_not_equal(ts_split(a, 1, 2, (int64_t[]){1, 1}, out), TS_OK);
    assert_non_null(strstr(ts_last_error(), "split: sizes [1,1] sum to 2 but dim 1 of [2,3] has 3"));
    assert_int_not_equal(ts_split(a, -3, 1, NULL, out), TS_OK);
    assert_non_null(strstr(ts_last_error(), "split: dim -3 out of range for [2,3]"));
    ts_tensor *all[] = {a, b, c, d, mf, m4, m23, i, m2};
    release_all(9, all);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_where_values), cmocka_unit_test(test_where_gradcheck),
        cmocka_unit_test(test_join_values),  cmocka_unit_test(test_join_gradcheck),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
