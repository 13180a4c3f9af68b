/* test_attention.c - fused attention: values against a direct computation
 * (causal and not, Tq != Tk, Dv != D, several head groups), gradients of q,
 * k and v including non-contiguous inputs, errors; the packed-qkv op
 * against the same through views, its gradients and errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <string.h>
#include <cmocka.h>

#include "fused_util.h"
#include "kernels/ops/attention.h"
#include "kernels/alloc.h"
#include "kernels/ops/view.h"

/* Row (head h, query i) of attention computed directly; err = max abs diff
 * against out. */
static double row_error(const ts_tensor *q, const ts_tensor *k, const ts_tensor *v, const ts_tensor *out, int64_t h,
                        int64_t i, bool causal, double scale) {
    int64_t Tq = q->shape[2], Tk = k->shape[2], D = q->shape[3], Dv = v->shape[3];
    double s[2048], m = -INFINITY, z = 0, err = 0;
    int64_t L = causal && i + 1 < Tk ? i + 1 : Tk;
    for (int64_t j = 0; j < L; j++) {
        s[j] = 0;
        for (int64_t d = 0; d < D; d++) s[j] += ts_tensor_get(q, (h * Tq + i) * D + d) * ts_tensor_get(k, (h * Tk + j) * D + d);
        s[j] *= scale;
        m = s[j] > m ? s[j] : m;
    }
    for (int64_t j = 0; j < L; j++) z += (s[j] = exp(s[j] - m));
    for (int64_t e = 0; e < Dv; e++) {
        double o = 0;
        for (int64_t j = 0; j < L; j++) o += s[j] / z * ts_tensor_get(v, (h * Tk + j) * Dv + e);
        double d = fabs(o - ts_tensor_get(out, (h * Tq + i) * Dv + e));
        err = d > err ? d : err;
    }
    return err;
}

static void check_forward(int64_t B, int64_t H, int64_t Tq, int64_t Tk, int64_t D, int64_t Dv, bool causal,
                          double scale, int row_step) {
    ts_tensor *q = ts_tensor_randn(ts_key_from_seed(1), TS_F32, SHAPE(B, H, Tq, D));
    ts_tensor *k = ts_tensor_randn(ts_key_from_seed(2), TS_F32, SHAPE(B, H, Tk, D));
    ts_tensor *v = ts_tensor_randn(ts_key_from_seed(3), TS_F32, SHAPE(B, H, Tk, Dv));
    ts_tensor *o = ts_attention(q, k, v, causal, scale);
    assert_non_null(o);
    assert_int_equal(o->shape[3], Dv);
    double sc = scale != 0 ? scale : 1 / sqrt((double)D);
    for (int64_t h = 0; h < B * H; h++)
        for (int64_t i = h % row_step; i < Tq; i += row_step) assert_true(row_error(q, k, v, o, h, i, causal, sc) < 2e-5);
    ts_tensor_release(q);
    ts_tensor_release(k);
    ts_tensor_release(v);
    ts_tensor_release(o);
}

static void test_forward_values(void **state) {
    (void)state;
    check_forward(2, 3, 5, 5, 4, 4, false, 0, 1);
    check_forward(2, 3, 5, 5, 4, 4, true, 0, 1);
    check_forward(1, 2, 7, 4, 3, 5, true, 0.7, 1);  /* Tq > Tk: late queries see all keys */
    check_forward(1, 2, 3, 9, 6, 2, false, 0.25, 1);
    check_forward(2, 2, 1100, 1100, 8, 8, true, 0, 97); /* 3 heads per scratch group: 2 groups */
}

typedef struct {
    bool causal;
    double scale;
} attn_args;

static ts_tensor *attn_fn(ts_tensor *const *in, void *ctx) {
    attn_args *a = ctx;
    return ts_attention(in[0], in[1], in[2], a->causal, a->scale);
}

static void test_gradcheck(void **state) {
    (void)state;
    struct {
        int64_t B, H, Tq, Tk, D, Dv;
    } cases[] = {{1, 1, 4, 4, 3, 3}, {2, 2, 3, 3, 2, 4}, {1, 2, 5, 3, 2, 2}, {1, 1, 2, 6, 3, 2},
                 {1, 2, 91, 91, 2, 2}}; /* the last: threaded path, two row blocks, full tiles */
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int causal = 0; causal < 2; causal++) {
            ts_tensor *in[3] = {leaf(10 + c, SHAPE(cases[c].B, cases[c].H, cases[c].Tq, cases[c].D)),
                                leaf(20 + c, SHAPE(cases[c].B, cases[c].H, cases[c].Tk, cases[c].D)),
                                leaf(30 + c, SHAPE(cases[c].B, cases[c].H, cases[c].Tk, cases[c].Dv))};
            attn_args a = {causal, c == 2 ? 0.6 : 0};
            assert_int_equal(check_grads(attn_fn, &a, 3, in), TS_OK);
            for (int i = 0; i < 3; i++) ts_tensor_release(in[i]);
        }
}

/* q, k, v as [B, T, H, D] buffers permuted to [B, H, T, D] (the layout a
 * fused qkv projection produces), and transposed last dims. */
static void test_non_contiguous(void **state) {
    (void)state;
    ts_tensor *base[3], *in[3];
    for (int i = 0; i < 3; i++) {
        base[i] = ts_tensor_randn(ts_key_from_seed(40 + i), TS_F64, SHAPE(2, 4, 2, 3));
        in[i] = ts_tensor_from_storage(base[i]->storage, TS_F64, 0, SHAPE(2, 2, 4, 3), (int64_t[]){24, 3, 6, 1});
        ts_set_requires_grad(in[i], true);
    }
    assert_false(ts_tensor_is_contiguous(in[0]));
    for (int causal = 0; causal < 2; causal++) {
        attn_args a = {causal, 0};
        assert_int_equal(check_grads(attn_fn, &a, 3, in), TS_OK);
    }
    ts_tensor_release(in[1]);
    in[1] = leaf_transposed(50, SHAPE(2, 2, 4, 3));
    attn_args a = {true, 0};
    assert_int_equal(check_grads(attn_fn, &a, 3, in), TS_OK);
    for (int i = 0; i < 3; i++) {
        ts_tensor_release(base[i]);
        ts_tensor_release(in[i]);
    }
}

static void test_errors(void **state) {
    (void)state;
    ts_tensor *q = ts_tensor_zeros(TS_F32, SHAPE(2, 4, 8, 16)), *k = ts_tensor_zeros(TS_F32, SHAPE(2, 4, 8, 15));
    ts_tensor *v = ts_tensor_zeros(TS_F32, SHAPE(2, 4, 8, 16)), *v64 = ts_tensor_zeros(TS_F64, SHAPE(2, 4, 8, 16));
    ts_tensor *q3 = ts_tensor_zeros(TS_F32, SHAPE(4, 8, 16));
    assert_null(ts_attention(q, k, v, false, 0));
    assert_non_null(strstr(ts_last_error(), "attention: shapes q [2,4,8,16], k [2,4,8,15], v [2,4,8,16] do not fit"));
    assert_null(ts_attention(q3, q, v, false, 0));
    assert_non_null(strstr(ts_last_error(), "q [4,8,16]"));
    assert_null(ts_attention(q, q, v64, true, 0));
    assert_non_null(strstr(ts_last_error(), "attention: dtypes of q, k, v differ (f32, f32, f64)"));
    assert_null(ts_attention(q, q, v, true, INFINITY));
    assert_non_null(strstr(ts_last_error(), "scale inf is not finite"));
    ts_tensor *arr[] = {q, k, v, v64, q3};
    for (size_t i = 0; i < sizeof arr / sizeof arr[0]; i++) ts_tensor_release(arr[i]);
}

/* ---- packed qkv ---- */

/* ts_attention_qkv through views and ts_attention: the heads split out of
 * qkv [B, T, 3C] as [B, H, T, D], their outputs merged back to [B, T, C]. */
static ts_tensor *qkv_by_views(ts_tensor *qkv, int64_t H, bool causal) {
    int64_t B = qkv->shape[0], T = qkv->shape[1], C = qkv->shape[2] / 3;
    ts_tensor *r = ts_reshape(qkv, 5, (int64_t[]){B, T, 3, H, C / H}), *p = ts_permute(r, (int[]){2, 0, 3, 1, 4});
    ts_tensor *part[3];
    for (int i = 0; i < 3; i++) {
        ts_tensor *s = ts_narrow(p, 0, i, 1);
        part[i] = ts_squeeze(s, 0);
        ts_tensor_release(s);
    }
    ts_tensor *o = ts_attention(part[0], part[1], part[2], causal, 0), *ot = ts_transpose(o, 1, 2);
    ts_tensor *out = ts_reshape(ot, 3, (int64_t[]){B, T, C});
    ts_tensor *t[] = {r, p, part[0], part[1], part[2], o, ot};
    for (int i = 0; i < 7; i++) ts_tensor_release(t[i]);
    return out;
}

/* The largest |a[i] - b[i]| (same shapes). */
static double max_diff(const ts_tensor *a, const ts_tensor *b) {
    assert_true(ts_tensor_same_shape(a, b));
    double m = 0;
    for (int64_t i = 0; i < ts_tensor_numel(a); i++) m = fmax(m, fabs(ts_tensor_get(a, i) - ts_tensor_get(b, i)));
    return m;
}

/* Output and qkv gradient equal those of the views (the kernels read the
 * heads inside the qkv rows and write out and the gradient in place),
 * over row blocks and edge tiles; the forward allocates only its output,
 * the row statistics and the kernel's scratch (no head copies). */
static void test_qkv_matches_views(void **state) {
    (void)state;
    int64_t B = 2, T = 130, H = 3, D = 5;
    for (int causal = 0; causal < 2; causal++) {
        ts_tensor *x[2], *o[2], *w = ts_tensor_randn(ts_key_from_seed(61), TS_F32, SHAPE(B, T, H * D));
        for (int i = 0; i < 2; i++) {
            x[i] = ts_tensor_randn(ts_key_from_seed(60), TS_F32, SHAPE(B, T, 3 * H * D));
            ts_set_requires_grad(x[i], true);
            size_t n0 = ts_alloc_get_stats().n_allocs;
            o[i] = i ? qkv_by_views(x[i], H, causal) : ts_attention_qkv(x[i], H, causal, 0);
            assert_non_null(o[i]);
            if (!i) assert_int_equal(ts_alloc_get_stats().n_allocs - n0, 3);
            assert_int_equal(ts_backward(o[i], w), TS_OK);
        }
        assert_true(max_diff(o[0], o[1]) < 1e-6);
        assert_true(max_diff(x[0]->grad, x[1]->grad) < 1e-6);
        ts_tensor *t[] = {x[0], x[1], o[0], o[1], w};
        for (int i = 0; i < 5; i++) ts_tensor_release(t[i]);
    }
}

typedef struct {
    int64_t H;
    bool causal;
} qkv_args;

static ts_tensor *qkv_fn(ts_tensor *const *in, void *ctx) {
    qkv_args *a = ctx;
    return ts_attention_qkv(in[0], a->H, a->causal, 0);
}

/* gradients by finite differences, of a dense qkv and of a transposed
 * view (copied densely first) */
static void test_qkv_gradcheck(void **state) {
    (void)state;
    for (int causal = 0; causal < 2; causal++) {
        qkv_args a = {2, causal};
        ts_tensor *in[1] = {leaf(70, SHAPE(2, 5, 12))};
        assert_int_equal(check_grads(qkv_fn, &a, 1, in), TS_OK);
        ts_tensor_release(in[0]);
        in[0] = leaf_transposed(71, SHAPE(2, 4, 6));
        a.H = 1;
        assert_int_equal(check_grads(qkv_fn, &a, 1, in), TS_OK);
        ts_tensor_release(in[0]);
    }
}

static void test_qkv_errors(void **state) {
    (void)state;
    ts_tensor *x = ts_tensor_zeros(TS_F32, SHAPE(2, 4, 12)), *x2 = ts_tensor_zeros(TS_F32, SHAPE(4, 12));
    ts_tensor *xi = ts_tensor_zeros(TS_I64, SHAPE(2, 4, 12));
    assert_null(ts_attention_qkv(x, 3, true, 0));
    assert_non_null(strstr(ts_last_error(),
                           "attention_qkv: qkv [2,4,12] is not a non-empty [B, T, 3 C] with C a multiple of 3 heads"));
    assert_null(ts_attention_qkv(x2, 1, true, 0));
    assert_non_null(strstr(ts_last_error(), "qkv [4,12] is not"));
    assert_null(ts_attention_qkv(x, 0, true, 0));
    assert_non_null(strstr(ts_last_error(), "with C a multiple of 0 heads"));
    assert_null(ts_attention_qkv(x, 2, true, NAN));
    assert_non_null(strstr(ts_last_error(), "attention_qkv: scale nan is not finite"));
    assert_null(ts_attention_qkv(xi, 2, true, 0));
    assert_non_null(strstr(ts_last_error(), "attention_qkv: qkv has dtype i64"));
    ts_tensor *t[] = {x, x2, xi};
    for (int i = 0; i < 3; i++) ts_tensor_release(t[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_values),
        cmocka_unit_test(test_gradcheck),
        cmocka_unit_test(test_non_contiguous),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_qkv_matches_views),
        cmocka_unit_test(test_qkv_gradcheck),
        cmocka_unit_test(test_qkv_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
