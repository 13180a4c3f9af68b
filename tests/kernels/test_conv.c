/* test_conv.c - conv2d against a direct loop, gradcheck over strides,
 * padding, dilation, with and without bias, non-contiguous inputs, f32
 * gradients of shapes that cover every block size of both implementations
 * against the definition, and the error messages. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "kernels/autograd.h"
#include "kernels/ops/conv.h"
#include "kernels/ops/view.h"
#include "kernels/tensor.h"
#include "kernels/threads.h"
#include "op_testing.h"

static ts_conv2d_opts opts(int64_t s, int64_t p, int64_t d) {
    ts_conv2d_opts o = ts_conv2d_default_opts();
    o.stride_h = o.stride_w = s;
    o.pad_h = o.pad_w = p;
    o.dil_h = o.dil_w = d;
    return o;
}

/* y[n,o,i,j] by the definition */
static double direct(const ts_tensor *x, const ts_tensor *w, const ts_tensor *b, const ts_conv2d_opts *o,
                     int64_t n, int64_t oc, int64_t i, int64_t j) {
    int64_t C = x->shape[1], H = x->shape[2], W = x->shape[3], KH = w->shape[2], KW = w->shape[3];
    double s = b ? ts_tensor_get(b, oc) : 0;
    for (int64_t c = 0; c < C; c++)
        for (int64_t kh = 0; kh < KH; kh++)
            for (int64_t kw = 0; kw < KW; kw++) {
                int64_t ih = i * o->stride_h - o->pad_h + kh * o->dil_h, iw = j * o->stride_w - o->pad_w + kw * o->dil_w;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                s += ts_tensor_get(x, ((n * C + c) * H + ih) * W + iw) *
                     ts_tensor_get(w, ((oc * C + c) * KH + kh) * KW + kw);
            }
    return s;
}

static void check_values(int64_t N, int64_t C, int64_t H, int64_t W, int64_t O, int64_t KH, int64_t KW,
                         ts_conv2d_opts o, bool bias) {
    ts_tensor *x = ts_tensor_randn(ts_key_from_seed(1), TS_F32, SHAPE(N, C, H, W));
    ts_tensor *w = ts_tensor_randn(ts_key_from_seed(2), TS_F32, SHAPE(O, C, KH, KW));
    ts_tensor *b = bias ? ts_tensor_randn(ts_key_from_seed(3), TS_F32, SHAPE(O)) : NULL;
    ts_tensor *y = ts_conv2d(x, w, b, &o);
    assert_non_null(y);
    int64_t Ho = (H + 2 * o.pad_h - o.dil_h * (KH - 1) - 1) / o.stride_h + 1;
    int64_t Wo = (W + 2 * o.pad_w - o.dil_w * (KW - 1) - 1) / o.stride_w + 1;
    assert_int_equal(y->shape[2], Ho);
    assert_int_equal(y->shape[3], Wo);
    for (int64_t n = 0; n < N; n++)
        for (int64_t oc = 0; oc < O; oc++)
            for (int64_t i = 0; i < Ho; i++)
                for (int64_t j = 0; j < Wo; j++) {
                    double want = direct(x, w, b, &o, n, oc, i, j);
                    double got = ts_tensor_get(y, ((n * O + oc) * Ho + i) * Wo + j);
                    assert_true(got - want < 1e-4 && want - got < 1e-4);
                }
    ts_tensor_release(x);
    ts_tensor_release(w);
    ts_tensor_release(b);
    ts_tensor_release(y);
}

static void test_values(void **state) {
    (void)state;
    check_values(2, 3, 7, 6, 4, 3, 3, opts(1, 0, 1), true);
    check_values(1, 2, 8, 9, 3, 3, 2, opts(2, 1, 1), false);
    check_values(2, 1, 9, 9, 2, 3, 3, opts(1, 2, 2), true);
    check_values(3, 2, 5, 5, 2, 1, 1, opts(3, 0, 1), true);
    check_values(1, 2, 4, 4, 3, 4, 4, opts(1, 0, 1), false); /* 1x1 output */
    check_values(4, 8, 16, 16, 4, 3, 3, opts(1, 1, 1), true); /* big enough for the OpenMP loops */
}

typedef struct {
    ts_conv2d_opts o;
    bool bias, transpose_x;
} conv_ctx;

static ts_tensor *conv_fn(ts_tensor *const *in, void *vctx) {
    const conv_ctx *c = vctx;
    ts_tensor *x = c->transpose_x ? ts_transpose(in[0], 2, 3) : ts_tensor_retain(in[0]);
    ts_tensor *y = ts_conv2d(x, in[1], c->bias ? in[2] : NULL, &c->o);
    ts_tensor_release(x);
    return y;
}

static void gradcheck_conv(int64_t N, int64_t C, int64_t H, int64_t W, int64_t O, int64_t KH, int64_t KW,
                           ts_conv2d_opts o, bool bias, bool transpose_x) {
    ts_tensor *in[3] = {leaf_of(5, TS_F64, SHAPE(N, C, H, W)), leaf_of(6, TS_F64, SHAPE(O, C, KH, KW)),
                        leaf_of(7, TS_F64, SHAPE(O))};
    conv_ctx c = {o, bias, transpose_x};
    ts_status st = ts_gradcheck(conv_fn, &c, bias ? 3 : 2, in, 1e-6, 1e-7, 1e-6);
    if (st) print_error("%s\n", ts_last_error());
    assert_int_equal(st, TS_OK);
    for (int i = 0; i < 3; i++) ts_tensor_release(in[i]);
}

static void test_gradcheck(void **state) {
    (void)state;
    gradcheck_conv(2, 2, 5, 5, 3, 3, 3, opts(1, 0, 1), true, false);
    gradcheck_conv(1, 2, 6, 5, 2, 3, 3, opts(2, 1, 1), true, false);
    gradcheck_conv(2, 1, 7, 7, 2, 3, 2, opts(1, 2, 2), false, false);
    gradcheck_conv(1, 3, 4, 4, 2, 1, 1, opts(1, 0, 1), true, false);
    gradcheck_conv(2, 2, 5, 6, 2, 2, 3, opts(2, 1, 1), true, true); /* x [2,2,6,5] transposed */
}

/* only some operands need gradients: each backward branch alone */
static void test_partial_grads(void **state) {
    (void)state;
    for (int want = 0; want < 6; want++) {
        ts_tensor *in[3] = {ts_tensor_randn(ts_key_from_seed(5), TS_F64, SHAPE(2, 2, 5, 5)),
                            ts_tensor_randn(ts_key_from_seed(6), TS_F64, SHAPE(3, 2, 3, 3)),
                            ts_tensor_randn(ts_key_from_seed(7), TS_F64, SHAPE(3))};
        ts_set_requires_grad(in[want % 3], true);
        conv_ctx c = {opts(want < 3 ? 2 : 1, 1, 1), true, false}; /* im2col + GEMM, then direct */
        assert_int_equal(ts_gradcheck(conv_fn, &c, 3, in, 1e-6, 1e-7, 1e-6), TS_OK);
        for (int i = 0; i < 3; i++) {
            if (i != want % 3) assert_null(in[i]->grad);
            ts_tensor_release(in[i]);
        }
    }
}

/* The f32 gradients of conv2d for output gradient r against the
 * definition summed in double: dw = sum r x, dx = sum r w, db = sum r. */
static void check_grads(int64_t N, int64_t C, int64_t H, int64_t W, int64_t O, int64_t KH, int64_t KW,
                        ts_conv2d_opts o) {
    ts_tensor *x = leaf_of(11, TS_F32, SHAPE(N, C, H, W)), *w = leaf_of(12, TS_F32, SHAPE(O, C, KH, KW));
    ts_tensor *b = leaf_of(13, TS_F32, SHAPE(O));
    ts_tensor *y = ts_conv2d(x, w, b, &o);
    assert_non_null(y);
    int64_t Ho = y->shape[2], Wo = y->shape[3];
    ts_tensor *r = ts_tensor_randn(ts_key_from_seed(14), TS_F32, 4, y->shape);
    assert_int_equal(ts_backward(y, r), TS_OK);
    ts_tensor *dx = ts_tensor_zeros(TS_F64, SHAPE(N, C, H, W)), *dw = ts_tensor_zeros(TS_F64, SHAPE(O, C, KH, KW));
    ts_tensor *db = ts_tensor_zeros(TS_F64, SHAPE(O));
    double *gx = ts_f64(dx), *gw = ts_f64(dw), *gb = ts_f64(db);
    for (int64_t n = 0; n < N; n++)
        for (int64_t oc = 0; oc < O; oc++)
            for (int64_t i = 0; i < Ho; i++)
                for (int64_t j = 0; j < Wo; j++) {
                    double g = ts_tensor_get(r, ((n * O + oc) * Ho + i) * Wo + j);
                    gb[oc] += g;
                    for (int64_t c = 0; c < C; c++)
                        for (int64_t kh = 0; kh < KH; kh++)
                            for (int64_t kw = 0; kw < KW; kw++) {
                                int64_t ih = i * o.stride_h - o.pad_h + kh * o.dil_h;
                                int64_t iw = j * o.stride_w - o.pad_w + kw * o.dil_w;
                                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                                int64_t xi = ((n * C + c) * H + ih) * W + iw, wi = ((oc * C + c) * KH + kh) * KW + kw;
                                gw[wi] += g * ts_tensor_get(x, xi);
                                gx[xi] += g * ts_tensor_get(w, wi);
                            }
                }
    const ts_tensor *want[] = {dx, dw, db}, *got[] = {x->grad, w->grad, b->grad};
    for (int k = 0; k < 3; k++) {
        assert_non_null(got[k]);
        for (int64_t i = 0; i < ts_tensor_numel(want[k]); i++) {
            double a = ts_tensor_get(want[k], i), e = ts_tensor_get(got[k], i) - a;
            assert_true(e < 1e-4 * (1 + (a < 0 ? -a : a)) && -e < 1e-4 * (1 + (a < 0 ? -a : a)));
        }
    }
    ts_tensor *all[] = {x, w, b, y, r, dx, dw, db};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ts_tensor_release(all[i]);
}

static void test_grads_f32(void **state) {
    (void)state;
    /* stride 1: rows of 17 (blocks of 14, 2, 1), 40 channels (a pair of
     * vectors and a single), 27 taps, 10 images in 8 groups */
    check_grads(10, 3, 20, 17, 40, 3, 3, opts(1, 1, 1));
    ts_conv2d_opts o = opts(1, 2, 1);
    o.pad_w = 1;
    o.dil_w = 2;
    check_grads(3, 5, 9, 11, 7, 5, 3, o); /* rectangular kernel, padding and dilation */
    check_grads(4, 2, 10, 10, 5, 3, 3, opts(2, 1, 1)); /* stride 2: im2col + GEMM */
    check_grads(2, 3, 6, 6, 4, 1, 1, opts(1, 1, 1));   /* padding beyond a 1x1 kernel: im2col + GEMM */
}

/* The direct path's gradients are the same bits at any thread count, also
 * when there are fewer image groups than threads (the taps are split). */
static void test_threads_same_bits(void **state) {
    (void)state;
    ts_tensor *got[2][2];
    int counts[2] = {1, 4}, before = ts_threads_get();
    for (int k = 0; k < 2; k++) {
        ts_threads_set(counts[k]);
        ts_tensor *x = leaf_of(21, TS_F32, SHAPE(2, 8, 16, 16)), *w = leaf_of(22, TS_F32, SHAPE(16, 8, 3, 3));
        ts_conv2d_opts o = opts(1, 1, 1);
        ts_tensor *y = ts_conv2d(x, w, NULL, &o);
        ts_tensor *r = ts_tensor_randn(ts_key_from_seed(23), TS_F32, 4, y->shape);
        assert_int_equal(ts_backward(y, r), TS_OK);
        got[k][0] = ts_tensor_retain(x->grad);
        got[k][1] = ts_tensor_retain(w->grad);
        ts_tensor *all[] = {x, w, y, r};
        for (int i = 0; i < 4; i++) ts_tensor_release(all[i]);
    }
    ts_threads_set(before);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ts_tensor_nbytes(got[0][i]), ts_tensor_nbytes(got[1][i]));
        assert_memory_equal(ts_tensor_data(got[0][i]), ts_tensor_data(got[1][i]), ts_tensor_nbytes(got[0][i]));
        ts_tensor_release(got[0][i]);
        ts_tensor_release(got[1][i]);
    }
}

static void test_rectangular_options(void **state) {
    (void)state;
    ts_conv2d_opts o = ts_conv2d_default_opts();
    o.stride_h = 2;
    o.stride_w = 1;
    o.pad_h = 0;
    o.pad_w = 2;
    o.dil_h = 1;
    o.dil_w = 2;
    check_values(2, 2, 7, 6, 3, 2, 3, o, true);
    gradcheck_conv(1, 2, 7, 6, 2, 2, 3, o, true, false);
}

static void test_errors(void **state) {
    (void)state;
    ts_tensor *x = ts_tensor_zeros(TS_F32, SHAPE(2, 3, 8, 8));
    ts_tensor *w = ts_tensor_zeros(TS_F32, SHAPE(4, 2, 3, 3));
    assert_null(ts_conv2d(x, w, NULL, NULL));
    assert_string_equal(ts_last_error(), "conv2d: input [2,3,8,8] has 3 channels but weight [4,2,3,3] expects 2");
    ts_tensor *w2 = ts_tensor_zeros(TS_F32, SHAPE(4, 3, 9, 9));
    assert_null(ts_conv2d(x, w2, NULL, NULL));
    assert_non_null(strstr(ts_last_error(), "conv2d: kernel 9x9 (dilated 9x9) does not fit input [2,3,8,8]"));
    ts_tensor *w3 = ts_tensor_zeros(TS_F32, SHAPE(4, 3, 3, 3));
    ts_tensor *b = ts_tensor_zeros(TS_F32, SHAPE(5));
    assert_null(ts_conv2d(x, w3, b, NULL));
    assert_non_null(strstr(ts_last_error(), "conv2d: bias [5] must be [4] for weight [4,3,3,3]"));
    ts_conv2d_opts o = ts_conv2d_default_opts();
    o.groups = 3;
    assert_null(ts_conv2d(x, w3, NULL, &o));
    assert_non_null(strstr(ts_last_error(), "groups = 3 is not supported"));
    o = ts_conv2d_default_opts();
    o.stride_w = 0;
    assert_null(ts_conv2d(x, w3, NULL, &o));
    assert_non_null(strstr(ts_last_error(), "conv2d: stride (1,0)"));
    ts_tensor *wd = ts_tensor_zeros(TS_F64, SHAPE(4, 3, 3, 3));
    assert_null(ts_conv2d(x, wd, NULL, NULL));
    assert_non_null(strstr(ts_last_error(), "conv2d: dtypes differ (input f32, weight f64)"));
    ts_tensor *x3 = ts_tensor_zeros(TS_F32, SHAPE(3, 8, 8));
    assert_null(ts_conv2d(x3, w3, NULL, NULL));
    assert_non_null(strstr(ts_last_error(), "conv2d: input [3,8,8] must be [N,C,H,W]"));
    ts_tensor *xi = ts_tensor_zeros(TS_I32, SHAPE(2, 3, 8, 8));
    assert_null(ts_conv2d(xi, w3, NULL, NULL));
    assert_non_null(strstr(ts_last_error(), "conv2d: input has dtype i32"));
    ts_tensor *all[] = {x, w, w2, w3, b, wd, x3, xi};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ts_tensor_release(all[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_gradcheck),
        cmocka_unit_test(test_partial_grads),
        cmocka_unit_test(test_grads_f32),
        cmocka_unit_test(test_threads_same_bits),
        cmocka_unit_test(test_rectangular_options),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
