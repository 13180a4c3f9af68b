/* test_core.c - tensors, allocator, Philox keys, views and the autograd
 * engine (with view ops only; op families have their own tests). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "kernels/alloc.h"
#include "kernels/autograd.h"
#include "kernels/ops/elementwise.h"
#include "kernels/ops/reduce.h"
#include "kernels/ops/select.h"
#include "kernels/ops/view.h"
#include "../test_util.h"
#include "kernels/tensor.h"

#define SHAPE(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}

static void test_creation_and_access(void **state) {
    (void)state;
    ts_tensor *t = ts_tensor_arange(TS_F32, 0, 6, 1);
    assert_non_null(t);
    assert_int_equal(ts_tensor_numel(t), 6);
    assert_true(ts_tensor_get(t, 5) == 5.0);
    ts_tensor *f = ts_tensor_full(TS_I64, SHAPE(2, 3), 7);
    assert_true(ts_tensor_get(f, 4) == 7.0);
    ts_tensor *b = ts_tensor_copy_as(t, TS_BF16);
    assert_true(ts_tensor_get(b, 3) == 3.0);
    assert_null(ts_tensor_empty(TS_F32, SHAPE(2, -1)));
    assert_non_null(strstr(ts_last_error(), "negative size"));
    ts_tensor_release(t);
    ts_tensor_release(f);
    ts_tensor_release(b);
}

static void test_bf16_rounding(void **state) {
    (void)state;
    assert_true(ts_f32_from_bf16(ts_bf16_from_f32(1.0f)) == 1.0f);
    /* 1 + 2^-8 is halfway between bf16 neighbours 1 and 1+2^-7: ties to even -> 1 */
    assert_true(ts_f32_from_bf16(ts_bf16_from_f32(1.0f + 1.0f / 256)) == 1.0f);
    assert_true(ts_f32_from_bf16(ts_bf16_from_f32(1.0f + 3.0f / 256)) == 1.0f + 1.0f / 64);
}

static void test_keys_are_reproducible(void **state) {
    (void)state;
    ts_key k = ts_key_from_seed(42);
    ts_tensor *a = ts_tensor_randn(k, TS_F32, SHAPE(1000));
    ts_tensor *b = ts_tensor_randn(k, TS_F32, SHAPE(10, 100));
    ts_tensor *c = ts_tensor_randn(ts_key_split(k, 1), TS_F32, SHAPE(1000));
    assert_memory_equal(ts_f32(a), ts_f32(b), 4000);
    assert_memory_not_equal(ts_f32(a), ts_f32(c), 4000);
    double mean = 0, var = 0;
    for (int i = 0; i < 1000; i++) mean += ts_tensor_get(a, i) / 1000;
    for (int i = 0; i < 1000; i++) var += (ts_tensor_get(a, i) - mean) * (ts_tensor_get(a, i) - mean) / 1000;
    assert_true(mean > -0.1 && mean < 0.1);
    assert_true(var > 0.85 && var < 1.15);
    /* a prefix of the stream equals the stream of a shorter tensor */
    float part[10];
    ts_rng_normal_f32(k, 0, 10, part);
    assert_memory_equal(part, ts_f32(a), sizeof part);
    ts_tensor_release(a);
    ts_tensor_release(b);
    ts_tensor_release(c);
}

static void test_allocator_stats(void **state) {
    (void)state;
    ts_alloc_reset_peak();
    ts_alloc_stats s0 = ts_alloc_get_stats();
    ts_tensor *t = ts_tensor_zeros(TS_F32, SHAPE(1 << 20));
    ts_alloc_stats s1 = ts_alloc_get_stats();
    assert_true(s1.allocated >= s0.allocated + (4u << 20));
    ts_tensor_release(t);
    ts_alloc_stats s2 = ts_alloc_get_stats();
    assert_int_equal(s2.allocated, s0.allocated);
    assert_true(s2.peak >= s0.allocated + (4u << 20));
    assert_true(s2.reserved >= s2.allocated + (4u << 20)); /* cached */
    t = ts_tensor_zeros(TS_F32, SHAPE(1 << 20));
    assert_true(ts_alloc_get_stats().n_cache_hits > s2.n_cache_hits);
    ts_tensor_release(t);
    ts_alloc_empty_cache();
    assert_true(ts_alloc_get_stats().reserved < s2.reserved);
}

/* Pages given back inside a live block stop counting and read as zeros;
 * counted again, they can be written; freeing the block settles it. */
static void test_allocator_decommit(void **state) {
    (void)state;
    size_t bytes = 1 << 20;
    size_t a0 = ts_alloc_get_stats().allocated;
    char *p = ts_alloc(bytes);
    assert_non_null(p);
    memset(p, 5, bytes);
    size_t a1 = ts_alloc_get_stats().allocated;
    /* a range that starts and ends inside pages: only its whole pages go */
    size_t n = ts_alloc_decommit(p + 100, bytes - 200);
    assert_int_equal(n, bytes - 2 * 4096);
    assert_int_equal(ts_alloc_get_stats().allocated, a1 - n);
    assert_int_equal(p[99], 5);
    assert_int_equal(p[4096], 0);
    assert_int_equal(p[bytes - 4097], 0);
    assert_int_equal(p[bytes - 1], 5);
    assert_int_equal(ts_alloc_decommit(p + 10, 100), 0); /* no whole page */
    ts_alloc_reset_peak();
    ts_alloc_recommit(p + 100, bytes - 200);
    assert_int_equal(ts_alloc_get_stats().allocated, a1);
    assert_int_equal(ts_alloc_get_stats().peak, a1);
    memset(p, 6, bytes);
    assert_int_equal(ts_alloc_decommit(p, bytes), bytes);
    ts_free(p, bytes);
    assert_int_equal(ts_alloc_get_stats().allocated, a0);
}

/* Large blocks: two freed neighbours serve one request of their joint size
 * without new memory; random sizes never overlap; empty_cache returns
 * everything. */
static void test_allocator_large_pool(void **state) {
    (void)state;
    ts_alloc_empty_cache();
    size_t r0 = ts_alloc_get_stats().reserved;
    char *a = ts_alloc(1 << 20), *b = ts_alloc(1 << 20);
    assert_non_null(a);
    assert_non_null(b);
    assert_ptr_equal(b, a + (1 << 20)); /* the rest of a's segment */
    size_t r1 = ts_alloc_get_stats().reserved;
    ts_free(a, 1 << 20);
    ts_free(b, 1 << 20);
    char *c = ts_alloc(2 << 20);
    assert_ptr_equal(c, a);
    assert_int_equal(ts_alloc_get_stats().reserved, r1);
    memset(c, 7, 2 << 20);
    ts_free(c, 2 << 20);

    enum { SLOTS = 16 };
    char *p[SLOTS] = {0};
    size_t n[SLOTS] = {0};
    uint64_t x = 12345;
    for (int it = 0; it < 400; it++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int k = (int)(x >> 60);
        if (p[k]) {
            for (size_t i = 0; i < n[k]; i += 4093) assert_int_equal(p[k][i], (char)k);
            ts_free(p[k], n[k]);
            p[k] = NULL;
        } else {
            n[k] = (128 << 10) + (size_t)(x >> 40) % (3 << 20);
            p[k] = ts_alloc(n[k]);
            assert_non_null(p[k]);
            memset(p[k], k, n[k]);
        }
    }
    for (int k = 0; k < SLOTS; k++) ts_free(p[k], n[k]);
    ts_alloc_empty_cache();
    assert_int_equal(ts_alloc_get_stats().reserved, r0);
}

static void test_views_share_storage(void **state) {
    (void)state;
    ts_tensor *x = ts_tensor_arange(TS_F32, 0, 24, 1);
    ts_tensor *r = ts_reshape(x, SHAPE(2, 3, 4));
    ts_tensor *p = ts_transpose(r, 0, 2); /* [4,3,2] */
    assert_false(ts_tensor_is_contiguous(p));
    assert_ptr_equal(p->storage, x->storage);
    assert_true(ts_tensor_get(p, 1) == 12.0); /* p[0,0,1] = r[1,0,0] */
    ts_tensor *n = ts_narrow(p, 0, 1, 2);     /* [2,3,2] */
    assert_true(ts_tensor_get(n, 0) == 1.0);
    ts_tensor *c = ts_contiguous(n);
    assert_true(ts_tensor_is_contiguous(c));
    assert_true(ts_tensor_get(c, 1) == 13.0);
    ts_tensor *bad = ts_reshape(x, SHAPE(5, 5));
    assert_null(bad);
    assert_non_null(strstr(ts_last_error(), "cannot view [24] (24 elements) as [5,5]"));
    assert_null(ts_squeeze(r, 5));
    assert_non_null(strstr(ts_last_error(), "squeeze: dim 5 out of range for [2,3,4]"));
    ts_tensor *ones8 = ts_tensor_ones(TS_F32, SHAPE(1, 1, 1, 1, 1, 1, 1, 1));
    assert_null(ts_unsqueeze(ones8, 0));
    assert_non_null(strstr(ts_last_error(), "unsqueeze: [1,1,1,1,1,1,1,1] already has the most dims"));
    ts_tensor_release(ones8);
    ts_tensor *col = ts_reshape(x, SHAPE(24, 1));
    ts_tensor *e = ts_expand(col, SHAPE(24, 3));
    assert_true(e->strides[1] == 0);
    ts_tensor *flat = ts_reshape(p, SHAPE(-1)); /* needs a copy */
    assert_true(ts_tensor_get(flat, 1) == 12.0);
    ts_tensor *r2 = ts_reshape(r, SHAPE(6, 4)); /* a view */
    assert_ptr_equal(r2->storage, x->storage);
    ts_tensor_release(x);
    ts_tensor_release(r);
    ts_tensor_release(p);
    ts_tensor_release(n);
    ts_tensor_release(c);
    ts_tensor_release(col);
    ts_tensor_release(e);
    ts_tensor_release(flat);
    ts_tensor_release(r2);
}

/* fn: narrow(transpose(reshape(x))) expanded - exercises the view backwards */
static ts_tensor *view_chain(ts_tensor *const *in, void *ctx) {
    (void)ctx;
    ts_tensor *r = ts_reshape(in[0], SHAPE(3, 4));
    ts_tensor *t = ts_transpose(r, 0, 1);
    ts_tensor *n = ts_narrow(t, 0, 1, 2);
    ts_tensor *u = ts_unsqueeze(n, 0);
    ts_tensor *e = ts_expand(u, SHAPE(2, 2, 3));
    ts_tensor *c = ts_contiguous(e);
    ts_tensor_release(r);
    ts_tensor_release(t);
    ts_tensor_release(n);
    ts_tensor_release(u);
    ts_tensor_release(e);
    return c;
}

static void test_gradcheck_views(void **state) {
    (void)state;
    ts_tensor *x = ts_tensor_randn(ts_key_from_seed(1), TS_F64, SHAPE(12));
    ts_set_requires_grad(x, true);
    ts_status st = ts_gradcheck(view_chain, NULL, 1, &x, 1e-6, 1e-7, 1e-6);
    assert_int_equal(st, TS_OK);
    ts_tensor_release(x);
}

static void test_backward_errors_and_accumulation(void **state) {
    (void)state;
    ts_tensor *x = ts_tensor_ones(TS_F32, SHAPE(4));
    assert_int_not_equal(ts_backward(x, NULL), TS_OK);
    assert_non_null(strstr(ts_last_error(), "does not require grad"));
    ts_set_requires_grad(x, true);
    ts_tensor *y = ts_reshape(x, SHAPE(2, 2));
    assert_int_not_equal(ts_backward(y, NULL), TS_OK);
    assert_non_null(strstr(ts_last_error(), "not a scalar"));
    ts_tensor *g = ts_tensor_full(TS_F32, SHAPE(2, 2), 2.0);
    assert_int_equal(ts_backward(y, g), TS_OK);
    assert_int_not_equal(ts_backward(y, g), TS_OK); /* graph freed */
    assert_non_null(strstr(ts_last_error(), "already freed"));
    ts_tensor *y2 = ts_reshape(x, SHAPE(2, 2));
    assert_int_equal(ts_backward(y2, g), TS_OK);
    assert_true(ts_tensor_get(x->grad, 3) == 4.0); /* accumulated */
    ts_zero_grad(x);
    assert_true(ts_tensor_get(x->grad, 3) == 0.0);
    bool prev = ts_grad_set_enabled(false);
    ts_tensor *z = ts_reshape(x, SHAPE(4));
    assert_false(z->requires_grad);
    ts_grad_set_enabled(prev);
    ts_tensor_release(x);
    ts_tensor_release(y);
    ts_tensor_release(y2);
    ts_tensor_release(g);
    ts_tensor_release(z);
}

/* s = sum(exp(x) * exp(x)) with exp(x) (saved by exp and kept by mul)
 * written in place before the backward (through write, on a view of its
 * storage when view is set) after mul: the backward is refused naming the
 * op, and x gets no gradient (once it silently got the gradient of the new
 * values). With packing on, the write comes before mul's node is packed
 * (at the next op), which then keeps the f32 tensor for the check. */
static void expect_stale(void (*write)(ts_tensor *), bool view, bool pack) {
    ts_tensor *x = ts_tensor_full(TS_F32, SHAPE(4096), 0.5); /* packable */
    ts_set_requires_grad(x, true);
    bool prev = ts_autograd_set_pack_bf16(pack);
    ts_tensor *y = ts_exp(x), *z = ts_mul(y, y);
    ts_tensor *part = view ? ts_narrow(y, 0, 1, 1) : ts_tensor_retain(y);
    write(part);
    ts_tensor *s = ts_sum_all(z);
    ts_autograd_set_pack_bf16(prev);
    assert_int_equal(ts_backward(s, NULL), TS_ERR_STATE);
    printf("  refused: %s\n", ts_last_error());
    assert_non_null(strstr(ts_last_error(), "backward of mul: its input 0 [4096] was written in place"));
    assert_null(x->grad);
    ts_tensor *tensors[] = {x, y, z, s, part};
    for (int i = 0; i < 5; i++) ts_tensor_release(tensors[i]);
}

static void fill_zero(ts_tensor *t) { assert_int_equal(ts_tensor_fill_(t, 0), TS_OK); }
static void set_first(ts_tensor *t) { ts_tensor_set(t, 0, 7.0); }
static void add_self(ts_tensor *t) { assert_int_equal(ts_tensor_add_(t, t), TS_OK); }

/* A tensor an op kept for backward and then written in place makes the
 * backward fail instead of giving a wrong gradient; a write before the op
 * kept it, or after the backward, is fine. */
static void test_backward_refuses_tensors_written_in_place(void **state) {
    (void)state;
    expect_stale(fill_zero, false, false);
    expect_stale(set_first, true, false);
    expect_stale(add_self, false, true);
    ts_tensor *x = ts_tensor_full(TS_F32, SHAPE(3), 0.5), *c = ts_tensor_ones(TS_F32, SHAPE(3));
    ts_set_requires_grad(x, true);
    assert_int_equal(ts_tensor_fill_(c, 2.0), TS_OK); /* before mul keeps it */
    ts_tensor *m = ts_mul(x, c), *s = ts_sum_all(m);
    assert_int_equal(ts_backward(s, NULL), TS_OK);
    assert_true(ts_tensor_get(x->grad, 0) == 2.0);
    assert_int_equal(ts_tensor_fill_(c, 3.0), TS_OK); /* after the backward */
    ts_tensor *tensors[] = {x, c, m, s};
    for (int i = 0; i < 4; i++) ts_tensor_release(tensors[i]);
}

/* Shapes whose element count or view extent overflows int64 are refused:
 * once they wrapped around to a small storage that the shape far exceeds. */
static void test_overflowing_shapes_refused(void **state) {
    (void)state;
    int64_t big = (INT64_C(1) << 62) + 1; /* big * 4 wraps to 4 */
    assert_null(ts_tensor_zeros(TS_F32, SHAPE(big, 4)));
    assert_non_null(strstr(ts_last_error(), "shape [4611686018427387905,4] has too many elements"));
    assert_null(ts_tensor_empty(TS_F32, SHAPE(0, INT64_C(1) << 40, INT64_C(1) << 40)));
    assert_non_null(strstr(ts_last_error(), "too many elements"));
    ts_tensor *x = ts_tensor_zeros(TS_F32, SHAPE(6));
    /* (2 - 1) * 2^62 + 1 elements of 4 bytes wraps to 4 bytes */
    assert_null(ts_tensor_from_storage(x->storage, TS_F32, 1, SHAPE(2), (int64_t[]){INT64_C(1) << 62}));
    assert_non_null(strstr(ts_last_error(), "view: shape [2] at offset 1 does not fit storage of 24 bytes"));
    assert_null(ts_tensor_from_storage(x->storage, TS_F32, 0, SHAPE(3, 2), (int64_t[]){INT64_MAX, 1}));
    assert_non_null(strstr(ts_last_error(), "does not fit storage"));
    ts_tensor *v = ts_tensor_from_storage(x->storage, TS_F32, 5, SHAPE(2, 3), (int64_t[]){-1, -2});
    assert_non_null(v); /* negative strides inside the storage still make a view */
    ts_tensor_release(v);
    ts_tensor_release(x);
}

/* NULL tensors and data give errors naming the op, not a crash. */
static void test_null_arguments_refused(void **state) {
    (void)state;
    assert_null(ts_tensor_from_data(TS_F32, SHAPE(2), NULL));
    assert_non_null(strstr(ts_last_error(), "from_data: data is NULL for shape [2]"));
    ts_tensor *e = ts_tensor_from_data(TS_F32, SHAPE(0, 3), NULL); /* nothing to copy */
    assert_non_null(e);
    assert_int_equal(ts_backward(NULL, NULL), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "backward: tensor is NULL"));
    assert_int_equal(ts_set_requires_grad(NULL, true), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "requires_grad: tensor is NULL"));
    assert_int_equal(ts_tensor_copy_(e, NULL), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "copy: source is NULL"));
    assert_int_equal(ts_tensor_add_(NULL, e), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "add_: destination is NULL"));
    assert_int_equal(ts_tensor_fill_(NULL, 1), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "fill: tensor is NULL"));
    ts_tensor_release(e);
}

/* Expects call to return NULL with an error containing want. */
#define REFUSED(call, want)                                  \
    do {                                                     \
        ts_clear_error();                                    \
        assert_null(call);                                   \
        assert_non_null(strstr(ts_last_error(), want));      \
    } while (0)

/* Every view and copy op, and the ops built on them, refuse a NULL tensor
 * (or shape / permutation array) naming the op and the argument: once they
 * read x->ndim of the NULL and crashed. */
static void test_view_ops_refuse_null(void **state) {
    (void)state;
    ts_tensor *x = ts_tensor_zeros(TS_F32, SHAPE(2, 3));
    REFUSED(ts_reshape(NULL, SHAPE(6)), "reshape: x is NULL");
    REFUSED(ts_reshape(x, 2, NULL), "reshape: shape is NULL for 2 dims");
    REFUSED(ts_flatten(NULL, 0, -1), "flatten: x is NULL");
    REFUSED(ts_permute(NULL, (int[]){1, 0}), "permute: x is NULL");
    REFUSED(ts_permute(x, NULL), "permute: perm is NULL for 2 dims (x [2,3])");
    REFUSED(ts_transpose(NULL, 0, 1), "transpose: x is NULL");
    REFUSED(ts_narrow(NULL, 0, 0, 1), "narrow: x is NULL");
    REFUSED(ts_expand(NULL, SHAPE(2, 3)), "expand: x is NULL");
    REFUSED(ts_expand(x, 2, NULL), "expand: shape is NULL for 2 dims");
    REFUSED(ts_squeeze(NULL, 0), "squeeze: x is NULL");
    REFUSED(ts_unsqueeze(NULL, 0), "unsqueeze: x is NULL");
    REFUSED(ts_contiguous(NULL), "contiguous: x is NULL");
    REFUSED(ts_clone(NULL), "clone: x is NULL");
    REFUSED(ts_to_dtype(NULL, TS_F64), "to_dtype: x is NULL");
    REFUSED(ts_detach(NULL), "detach: x is NULL");
    REFUSED(ts_to_device(NULL, TS_CPU), "to_device: x is NULL");
    REFUSED(ts_concat(2, (ts_tensor *[]){NULL, x}, 0), "concat: tensors[0] is NULL");
    REFUSED(ts_concat(2, (ts_tensor *[]){x, NULL}, 0), "concat: tensors[1] is NULL");
    REFUSED(ts_add(x, NULL), "add: b is NULL");
    REFUSED(ts_sum_all(NULL), "sum: input is NULL");
    ts_tensor_release(x);
}

/* A gradient given to backward must have the output's dtype (as in
 * PyTorch): an f64 gradient for an f32 output was once taken without a
 * word. */
static void test_backward_refuses_gradient_of_other_dtype(void **state) {
    (void)state;
    ts_tensor *x = ts_tensor_ones(TS_F32, SHAPE(3));
    ts_set_requires_grad(x, true);
    ts_tensor *y = ts_mul_scalar(x, 2.0), *g64 = ts_tensor_ones(TS_F64, SHAPE(3));
    assert_int_equal(ts_backward(y, g64), TS_ERR_DTYPE);
    assert_non_null(strstr(ts_last_error(), "backward: gradient has dtype f64 (shape [3]), expected f32"));
    assert_null(x->grad);
    assert_int_equal(ts_backward(x, g64), TS_ERR_DTYPE); /* a leaf too */
    assert_null(x->grad);
    ts_tensor *g = ts_tensor_ones(TS_F32, SHAPE(3));
    assert_int_equal(ts_backward(y, g), TS_OK);
    assert_true(ts_tensor_get(x->grad, 2) == 2.0);
    ts_tensor *all[] = {x, y, g64, g};
    for (int i = 0; i < 4; i++) ts_tensor_release(all[i]);
}

static void test_print_shows_dtype_shape_device_values(void **state) {
    (void)state;
    ts_tensor *small = ts_tensor_arange(TS_F32, 0, 4, 1);
    ts_tensor *big = ts_tensor_arange(TS_I64, 0, 1000, 1);
    char buf[4096] = {0};
    FILE *f = tmpfile();
    ts_tensor_print(f, small, "x");
    ts_tensor_print(f, big, NULL);
    tu_read_back(f, buf, sizeof buf);
    assert_non_null(strstr(buf, "x = tensor(dtype=f32, shape=[4], device=cpu)"));
    assert_non_null(strstr(buf, "0 1 2 3"));
    assert_non_null(strstr(buf, "tensor(dtype=i64, shape=[1000], device=cpu)"));
    assert_non_null(strstr(buf, "0 1 2 ... 997 998 999")); /* summarised */
    ts_tensor_release(small);
    ts_tensor_release(big);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_creation_and_access),
        cmocka_unit_test(test_bf16_rounding),
        cmocka_unit_test(test_keys_are_reproducible),
        cmocka_unit_test(test_allocator_stats),
        cmocka_unit_test(test_allocator_large_pool),
        cmocka_unit_test(test_allocator_decommit),
        cmocka_unit_test(test_views_share_storage),
        cmocka_unit_test(test_gradcheck_views),
        cmocka_unit_test(test_backward_errors_and_accumulation),
        cmocka_unit_test(test_backward_refuses_tensors_written_in_place),
        cmocka_unit_test(test_overflowing_shapes_refused),
        cmocka_unit_test(test_null_arguments_refused),
        cmocka_unit_test(test_view_ops_refuse_null),
        cmocka_unit_test(test_backward_refuses_gradient_of_other_dtype),
        cmocka_unit_test(test_print_shows_dtype_shape_device_values),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
