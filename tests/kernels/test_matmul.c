/* test_matmul.c - matmul values against a naive loop, gradcheck over 2-D,
 * vector, batched and broadcast shapes with transposed and strided operands,
 * no copies for transposed views, ts_matmul_into, the error messages, and
 * ts_linear (values, gradients, adding into .grad slots in place). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "kernels/alloc.h"
#include "kernels/autograd.h"
#include "kernels/ops/elementwise.h"
#include "kernels/ops/matmul.h"
#include "kernels/ops/view.h"
#include "kernels/tensor.h"
#include "op_testing.h"

/* out[i,j] == sum_k a[i,k] b[k,j] for 2-D tensors of any strides */
static void check_product(const ts_tensor *a, const ts_tensor *b, const ts_tensor *c, double tol) {
    int64_t M = a->shape[0], K = a->shape[1], N = b->shape[1];
    assert_int_equal(c->ndim, 2);
    assert_int_equal(c->shape[0], M);
    assert_int_equal(c->shape[1], N);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++) s += ts_tensor_get(a, i * K + k) * ts_tensor_get(b, k * N + j);
            double got = ts_tensor_get(c, i * N + j);
            assert_true(got - s < tol && s - got < tol);
        }
}

static void test_values_2d(void **state) {
    (void)state;
    ts_tensor *a = ts_tensor_randn(ts_key_from_seed(1), TS_F32, SHAPE(5, 7));
    ts_tensor *b = ts_tensor_randn(ts_key_from_seed(2), TS_F32, SHAPE(7, 3));
    ts_tensor *c = ts_matmul(a, b);
    assert_non_null(c);
    check_product(a, b, c, 1e-4);
    /* the same with a transposed right operand: w [3,7] viewed as [7,3] */
    ts_tensor *w = ts_tensor_randn(ts_key_from_seed(3), TS_F32, SHAPE(3, 7));
    ts_tensor *wt = ts_transpose(w, 0, 1);
    ts_tensor *c2 = ts_matmul(a, wt);
    check_product(a, wt, c2, 1e-4);
    ts_tensor_release(a);
    ts_tensor_release(b);
    ts_tensor_release(c);
    ts_tensor_release(w);
    ts_tensor_release(wt);
    ts_tensor_release(c2);
}

/* context for gradcheck functions: which operands to transpose first */
typedef struct {
    bool ta, tb;
} mm_ctx;

static ts_tensor *mm_fn(ts_tensor *const *in, void *vctx) {
    const mm_ctx *ctx = vctx;
    ts_tensor *a = ctx && ctx->ta ? ts_transpose(in[0], -1, -2) : ts_tensor_retain(in[0]);
    ts_tensor *b = ctx && ctx->tb ? ts_transpose(in[1], -1, -2) : ts_tensor_retain(in[1]);
    ts_tensor *c = ts_matmul(a, b);
    ts_tensor_release(a);
    ts_tensor_release(b);
    return c;
}

static void gradcheck_pair(int na, const int64_t *sa, int nb, const int64_t *sb, bool ta, bool tb) {
    ts_tensor *in[2] = {leaf_of(11, TS_F64, na, sa), leaf_of(12, TS_F64, nb, sb)};
    mm_ctx ctx = {ta, tb};
    ts_status st = ts_gradcheck(mm_fn, &ctx, 2, in, 1e-6, 1e-7, 1e-6);
    if (st) print_error("%s\n", ts_last_error());
    assert_int_equal(st, TS_OK);
    ts_tensor_release(in[0]);
    ts_tensor_release(in[1]);
}

static void test_gradcheck_2d_and_vectors(void **state) {
    (void)state;
    gradcheck_pair(SHAPE(3, 4), SHAPE(4, 5), false, false);
    gradcheck_pair(SHAPE(1, 1), SHAPE(1, 1), false, false);
    gradcheck_pair(SHAPE(6, 1), SHAPE(1, 4), false, false);
    gradcheck_pair(SHAPE(2, 7), SHAPE(7, 1), false, false);
    gradcheck_pair(SHAPE(4), SHAPE(4, 3), false, false);
    gradcheck_pair(SHAPE(3, 4), SHAPE(4), false, false);
    gradcheck_pair(SHAPE(5), SHAPE(5), false, false);
    gradcheck_pair(SHAPE(2, 3, 4), SHAPE(4), false, false);
}

static void test_gradcheck_transposed(void **state) {
    (void)state;
    gradcheck_pair(SHAPE(4, 3), SHAPE(4, 5), true, false); /* Aᵀ·B */
    gradcheck_pair(SHAPE(3, 4), SHAPE(5, 4), false, true); /* A·Bᵀ (Linear) */
    gradcheck_pair(SHAPE(4, 3), SHAPE(5, 4), true, true);
    gradcheck_pair(SHAPE(2, 4, 3), SHAPE(2, 5, 4), true, true);
    gradcheck_pair(SHAPE(2, 3, 4), SHAPE(6, 4), false, true); /* [B,T,K]·Wᵀ */
}

static void test_gradcheck_batched_broadcast(void **state) {
    (void)state;
    gradcheck_pair(SHAPE(2, 3, 4), SHAPE(2, 4, 5), false, false);
    gradcheck_pair(SHAPE(2, 3, 4), SHAPE(4, 5), false, false);    /* folds into one GEMM */
    gradcheck_pair(SHAPE(3, 4), SHAPE(2, 4, 5), false, false);    /* left operand broadcast */
    gradcheck_pair(SHAPE(2, 1, 3, 4), SHAPE(5, 4, 2), false, false); /* [2,5,3,2] */
    gradcheck_pair(SHAPE(1, 3, 2, 4), SHAPE(2, 1, 3, 4), false, true);
    gradcheck_pair(SHAPE(2, 2, 3, 4), SHAPE(4, 2), false, false); /* two batch dims folded */
}

/* only one operand needs a gradient */
static void test_partial_grads(void **state) {
    (void)state;
    for (int want = 0; want < 2; want++) {
        ts_tensor *in[2] = {ts_tensor_randn(ts_key_from_seed(51), TS_F64, SHAPE(2, 3, 4)),
                            ts_tensor_randn(ts_key_from_seed(52), TS_F64, SHAPE(4, 5))};
        ts_set_requires_grad(in[want], true);
        assert_int_equal(ts_gradcheck(mm_fn, NULL, 2, in, 1e-6, 1e-7, 1e-6), TS_OK);
        assert_null(in[1 - want]->grad);
        ts_tensor_release(in[0]);
        ts_tensor_release(in[1]);
    }
}

/* a leaf whose storage is laid out so no BLAS layout fits: every other
 * element of a [rows, 2*cols] buffer */
static ts_tensor *strided_leaf(uint64_t seed, int64_t rows, int64_t cols) {
    ts_tensor *base = ts_tensor_randn(ts_key_from_seed(seed), TS_F64, SHAPE(rows, 2 * cols));
    ts_tensor *t = ts_tensor_from_storage(base->storage, TS_F64, 1, SHAPE(rows, cols), (int64_t[]){2 * cols, 2});
    ts_tensor_release(base);
    assert_non_null(t);
    assert_false(ts_tensor_is_contiguous(t));
    assert_int_equal(ts_set_requires_grad(t, true), TS_OK);
    return t;
}

static void test_gradcheck_strided(void **state) {
    (void)state;
    ts_tensor *in[2] = {strided_leaf(21, 3, 4), strided_leaf(22, 4, 2)};
    assert_int_equal(ts_gradcheck(mm_fn, NULL, 2, in, 1e-6, 1e-7, 1e-6), TS_OK);
    /* a transposed-stride leaf goes to BLAS directly */
    ts_tensor *base = ts_tensor_randn(ts_key_from_seed(23), TS_F64, SHAPE(5, 4));
    ts_tensor *tl = ts_tensor_from_storage(base->storage, TS_F64, 0, SHAPE(4, 5), (int64_t[]){1, 4});
    ts_set_requires_grad(tl, true);
    ts_tensor *in2[2] = {in[0], tl};
    assert_int_equal(ts_gradcheck(mm_fn, NULL, 2, in2, 1e-6, 1e-7, 1e-6), TS_OK);
    ts_tensor_release(base);
    ts_tensor_release(tl);
    ts_tensor_release(in[0]);
    ts_tensor_release(in[1]);
}

/* forward and backward with a transposed weight allocate only the output and
 * the two gradients: the transposed view is never copied */
static void test_transposed_view_not_copied(void **state) {
    (void)state;
    ts_tensor *x = leaf_of(31, TS_F32, SHAPE(4, 6, 32));
    ts_tensor *w = leaf_of(32, TS_F32, SHAPE(16, 32));
    ts_tensor *wt = ts_transpose(w, 0, 1);
    size_t n0 = ts_alloc_get_stats().n_allocs;
    ts_tensor *y = ts_matmul(x, wt);
    assert_non_null(y);
    assert_int_equal(ts_alloc_get_stats().n_allocs - n0, 1);
    ts_tensor *g = ts_tensor_ones(TS_F32, SHAPE(4, 6, 16));
    n0 = ts_alloc_get_stats().n_allocs;
    assert_int_equal(ts_backward(y, g), TS_OK);
    /* dx, dwᵀ (then transposed back by the view's backward, as a view) and
     * the leaf gradient slots */
    size_t used = ts_alloc_get_stats().n_allocs - n0;
    assert_true(used <= 4);
    /* dw = sum over batch of gᵀ·x: every row equals the column sums of x */
    for (int64_t j = 0; j < 32; j++) {
        double s = 0;
        for (int64_t i = 0; i < 24; i++) s += ts_tensor_get(x, i * 32 + j);
        double got = ts_tensor_get(w->grad, 5 * 32 + j);
        assert_true(got - s < 1e-3 && s - got < 1e-3);
    }
    ts_tensor_release(x);
    ts_tensor_release(w);
    ts_tensor_release(wt);
    ts_tensor_release(y);
    ts_tensor_release(g);
}

static void test_matmul_into(void **state) {
    (void)state;
    ts_tensor *a = ts_tensor_randn(ts_key_from_seed(41), TS_F64, SHAPE(3, 2, 4));
    ts_tensor *b = ts_tensor_randn(ts_key_from_seed(42), TS_F64, SHAPE(3, 4, 5));
    ts_tensor *full = ts_matmul(a, b);
    ts_tensor *sum = ts_tensor_full(TS_F64, SHAPE(2, 5), 1.0);
    assert_int_equal(ts_matmul_into(sum, a, b, true), TS_OK); /* 1 + sum over the batch */
    for (int64_t i = 0; i < 10; i++) {
        double s = 1.0;
        for (int64_t k = 0; k < 3; k++) s += ts_tensor_get(full, k * 10 + i);
        double got = ts_tensor_get(sum, i);
        assert_true(got - s < 1e-12 && s - got < 1e-12);
    }
    ts_tensor *bad = ts_tensor_zeros(TS_F64, SHAPE(2, 6));
    assert_int_not_equal(ts_matmul_into(bad, a, b, false), TS_OK);
    assert_non_null(strstr(ts_last_error(), "matmul_into: shapes [3,2,4] x [3,4,5] -> [2,6] do not align"));
    ts_tensor_release(a);
    ts_tensor_release(b);
    ts_tensor_release(full);
    ts_tensor_release(sum);
    ts_tensor_release(bad);
}

static void test_errors(void **state) {
    (void)state;
    ts_tensor *a = ts_tensor_zeros(TS_F32, SHAPE(4, 8));
    ts_tensor *b = ts_tensor_zeros(TS_F32, SHAPE(9, 2));
    assert_null(ts_matmul(a, b));
    assert_string_equal(ts_last_error(), "matmul: shapes [4,8] x [9,2] do not align (dim 1 = 8 vs dim 0 = 9)");
    ts_tensor *c = ts_tensor_zeros(TS_F32, SHAPE(2, 3, 8, 8));
    ts_tensor *d = ts_tensor_zeros(TS_F32, SHAPE(4, 8, 8));
    assert_null(ts_matmul(c, d));
    assert_non_null(strstr(ts_last_error(), "matmul: batch dims of [2,3,8,8] and [4,8,8] do not broadcast"));
    ts_tensor *e = ts_tensor_zeros(TS_F64, SHAPE(8, 2));
    assert_null(ts_matmul(a, e));
    assert_non_null(strstr(ts_last_error(), "matmul: dtypes differ (f32 [4,8] x f64 [8,2])"));
    ts_tensor *f = ts_tensor_zeros(TS_I64, SHAPE(8, 2));
    assert_null(ts_matmul(a, f));
    assert_non_null(strstr(ts_last_error(), "matmul: b has dtype i64"));
    ts_tensor *s = ts_tensor_full(TS_F32, 0, (int64_t[]){1}, 1.0); /* 0-dim */
    assert_null(ts_matmul(s, a));
    assert_non_null(strstr(ts_last_error(), "at least 1 dim"));
    ts_tensor_release(a);
    ts_tensor_release(b);
    ts_tensor_release(c);
    ts_tensor_release(d);
    ts_tensor_release(e);
    ts_tensor_release(f);
    ts_tensor_release(s);
}

static void test_empty_inner_dim(void **state) {
    (void)state;
    ts_tensor *a = ts_tensor_ones(TS_F32, SHAPE(3, 0));
    ts_tensor *b = ts_tensor_ones(TS_F32, SHAPE(0, 2));
    ts_tensor *c = ts_matmul(a, b);
    assert_non_null(c);
    for (int i = 0; i < 6; i++) assert_true(ts_tensor_get(c, i) == 0.0);
    ts_tensor_release(a);
    ts_tensor_release(b);
    ts_tensor_release(c);
}

/* ---- linear ---- */

static ts_tensor *linear_fn(ts_tensor *const *in, void *ctx) {
    return ts_linear(in[0], in[1], ctx ? NULL : in[2]);
}

/* Gives each leaf a zero .grad that is a view of one flat buffer, as a
 * model's parameters have (so linear's backward adds into them itself). */
static ts_tensor *preset_grads(int n, ts_tensor *const *t) {
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += ts_tensor_numel(t[i]);
    ts_tensor *flat = ts_tensor_zeros(TS_F64, SHAPE(total));
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        t[i]->grad = ts_tensor_from_storage(flat->storage, TS_F64, off, t[i]->ndim, t[i]->shape, NULL);
        off += ts_tensor_numel(t[i]);
    }
    return flat;
}

/* values against matmul + add, gradients by finite differences, with and
 * without a bias, with and without .grad slots already there */
static void test_linear_values_and_grads(void **state) {
    (void)state;
    for (int preset = 0; preset < 2; preset++)
        for (int bias = 0; bias < 2; bias++) {
            ts_tensor *in[3] = {leaf(61, SHAPE(2, 3, 5)), leaf(62, SHAPE(4, 5)), leaf(63, SHAPE(4))};
            ts_tensor *flat = preset ? preset_grads(3, in) : NULL;
            ts_tensor *y = linear_fn(in, bias ? NULL : in);
            ts_tensor *wt = ts_transpose(in[1], 0, 1), *p = ts_matmul(in[0], wt);
            ts_tensor *ref = bias ? ts_add(p, in[2]) : ts_tensor_retain(p);
            expect_close(y, ref, 1e-12);
            check_grad(linear_fn, bias ? NULL : in, bias ? 3 : 2, in);
            if (preset) assert_true(in[1]->grad->storage == flat->storage); /* added in place */
            ts_tensor *t[] = {in[0], in[1], in[2], flat, y, wt, p, ref};
            release_all(8, t);
        }
    ts_tensor *in1[3] = {leaf(64, SHAPE(5)), leaf(65, SHAPE(3, 5)), leaf(66, SHAPE(3))}; /* 1-D input */
    check_grad(linear_fn, NULL, 3, in1);
    release_all(3, in1);
}

static int hook_calls;
static ts_status count_hook(ts_tensor *t, void *ctx) {
    (void)t, (void)ctx;
    hook_calls++;
    return TS_OK;
}

/* a second backward adds onto the first in the .grad slots, each slot's
 * hook runs once a pass, and no temporary is made for the parameters'
 * gradients: one pass allocates only dx (added into x's .grad by the
 * engine) and the bias's column sums */
static void test_linear_adds_into_grads(void **state) {
    (void)state;
    ts_tensor *in[3] = {leaf_of(71, TS_F32, SHAPE(6, 8)), leaf_of(72, TS_F32, SHAPE(3, 8)), leaf_of(73, TS_F32, SHAPE(3))};
    for (int i = 0; i < 3; i++) {
        in[i]->grad = ts_tensor_zeros(TS_F32, in[i]->ndim, in[i]->shape);
        in[i]->grad_hook = i ? count_hook : NULL;
    }
    hook_calls = 0;
    ts_tensor *g = ts_tensor_ones(TS_F32, SHAPE(6, 3));
    for (int pass = 0; pass < 2; pass++) {
        ts_tensor *y = ts_linear(in[0], in[1], in[2]);
        size_t n0 = ts_alloc_get_stats().n_allocs;
        assert_int_equal(ts_backward(y, g), TS_OK);
        if (pass == 0) assert_int_equal(ts_alloc_get_stats().n_allocs - n0, 2); /* dx, and the bias's column sums */
        ts_tensor_release(y);
    }
    assert_int_equal(hook_calls, 4);
    for (int64_t o = 0; o < 3; o++) {
        assert_true(ts_tensor_get(in[2]->grad, o) == 12.0); /* 2 passes x 6 rows */
        for (int64_t j = 0; j < 8; j++) {
            double s = 0;
            for (int64_t r = 0; r < 6; r++) s += 2 * ts_tensor_get(in[0], r * 8 + j);
            double got = ts_tensor_get(in[1]->grad, o * 8 + j);
            assert_true(got - s < 1e-4 && s - got < 1e-4);
        }
    }
    release_all(3, in);
    ts_tensor_release(g);
}

static void test_linear_errors(void **state) {
    (void)state;
    ts_tensor *x = ts_tensor_zeros(TS_F32, SHAPE(4, 8)), *w = ts_tensor_zeros(TS_F32, SHAPE(3, 9));
    ts_tensor *w2 = ts_tensor_zeros(TS_F32, SHAPE(3, 8)), *b = ts_tensor_zeros(TS_F32, SHAPE(4));
    ts_tensor *wd = ts_tensor_zeros(TS_F64, SHAPE(3, 8)), *wi = ts_tensor_zeros(TS_I64, SHAPE(3, 8));
    expect_error(ts_linear(x, w, NULL), "linear: x [4,8] does not end in the in-features of weight [3,9] ([out, in])");
    expect_error(ts_linear(x, w2, b), "linear: bias [4] is not [3], the out-features of weight [3,8]");
    expect_error(ts_linear(x, wd, NULL), "linear: dtypes of x f32, weight f64 differ");
    expect_error(ts_linear(x, wi, NULL), "linear: weight has dtype i64");
    ts_tensor *t[] = {x, w, w2, b, wd, wi};
    release_all(6, t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values_2d),
        cmocka_unit_test(test_gradcheck_2d_and_vectors),
        cmocka_unit_test(test_gradcheck_transposed),
        cmocka_unit_test(test_gradcheck_batched_broadcast),
        cmocka_unit_test(test_partial_grads),
        cmocka_unit_test(test_gradcheck_strided),
        cmocka_unit_test(test_transposed_view_not_copied),
        cmocka_unit_test(test_matmul_into),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_empty_inner_dim),
        cmocka_unit_test(test_linear_values_and_grads),
        cmocka_unit_test(test_linear_adds_into_grads),
        cmocka_unit_test(test_linear_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
