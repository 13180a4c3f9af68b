/* test_attention.c - fused attention: values against a direct computation
 * (causal and not, Tq != Tk, Dv != D, several head groups), gradients of q,
 * k and v including non-contiguous inputs, errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <string.h>
#include <cmocka.h>

#include "fused_util.h"
#include "kernels/ops/attention.h"
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_values),
        cmocka_unit_test(test_gradcheck),
        cmocka_unit_test(test_non_contiguous),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
