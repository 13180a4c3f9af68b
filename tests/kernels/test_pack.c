/* test_pack.c - activations saved for backward as bf16 copies
 * (ts_autograd_set_pack_bf16): which slots are packed, one copy per view,
 * gradients close to the unpacked run's but not equal to them, the forward
 * freeing the f32 originals, and a bf16-compute GPT whose activations are
 * packed and whose weights' f32 conversions are gone after the forward,
 * giving gradients close to the f32 model's. (test_mixed checks that the
 * packed weights still give gradients equal to bf16 of the f32 gradients
 * computed with bf16-rounded weights.) */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "kernels/alloc.h"
#include "kernels/autograd.h"
#include "kernels/ops/activation.h"
#include "kernels/ops/matmul.h"
#include "kernels/ops/reduce.h"
#include "model_testing.h"
#include "op_testing.h"

typedef struct {
    ts_tensor *x, *w1, *w2;
} leaves;

static leaves make_leaves(int64_t n) {
    return (leaves){leaf_of(1, TS_F32, SHAPE(n, 64)), leaf_of(2, TS_F32, SHAPE(64, 80)),
                    leaf_of(3, TS_F32, SHAPE(80, 96))};
}

static void free_leaves(leaves *l) {
    ts_tensor *all[] = {l->x, l->w1, l->w2};
    for (int i = 0; i < 3; i++) {
        ts_zero_grad(all[i]);
        ts_tensor_release(all[i]);
    }
}

/* y = relu(x w1) w2 and its loss sum(y); *r gets relu's output. */
static ts_tensor *forward(const leaves *l, ts_tensor **r) {
    ts_tensor *h = ts_matmul(l->x, l->w1);
    *r = ts_relu(h);
    ts_tensor *y = ts_matmul(*r, l->w2);
    ts_tensor *loss = ts_sum(y, 0, NULL, false);
    ts_tensor_release(h);
    ts_tensor_release(y);
    return loss;
}

static float max_rel_diff(const ts_tensor *a, const ts_tensor *b) {
    double d = 0, s = 0;
    for (int64_t i = 0; i < ts_tensor_numel(a); i++) {
        d = fmax(d, fabs(ts_tensor_get(a, i) - ts_tensor_get(b, i)));
        s = fmax(s, fabs(ts_tensor_get(b, i)));
    }
    return (float)(d / s);
}

static void test_slots_and_gradients(void **state) {
    (void)state;
    leaves plain = make_leaves(96), packed = make_leaves(96);
    ts_tensor *r0, *r1;
    ts_tensor *loss0 = forward(&plain, &r0);
    bool prev = ts_autograd_set_pack_bf16(true);
    ts_tensor *loss1 = forward(&packed, &r1);
    assert_true(ts_autograd_set_pack_bf16(prev)); /* it was on */

    /* relu keeps its output, the second matmul its input r: one bf16 copy */
    ts_node *relu = r1->grad_fn, *mm2 = loss1->grad_fn->inputs[0]->grad_fn;
    assert_string_equal(mm2->op, "matmul");
    ts_tensor *saved = relu->saved[0], *in = mm2->inputs[0];
    assert_true(saved->packed && in->packed);
    assert_int_equal(saved->dtype, TS_BF16);
    assert_int_equal(in->dtype, TS_BF16);
    assert_ptr_equal(saved->storage, in->storage);
    assert_ptr_equal(in->grad_fn, relu); /* the packed input keeps its history */
    assert_true(in->requires_grad);
    /* leaves (x, the weights) belong to the caller and stay as they are */
    assert_ptr_equal(mm2->inputs[1], packed.w2);
    assert_false(relu->inputs[0] && relu->inputs[0]->packed);

    assert_int_equal(ts_backward(loss0, NULL), TS_OK);
    assert_int_equal(ts_backward(loss1, NULL), TS_OK);
    const ts_tensor *g0[] = {plain.x->grad, plain.w1->grad, plain.w2->grad};
    const ts_tensor *g1[] = {packed.x->grad, packed.w1->grad, packed.w2->grad};
    for (int i = 0; i < 3; i++) {
        float e = max_rel_diff(g1[i], g0[i]);
        print_message("gradient %d: max relative difference %.3g\n", i, e);
        assert_true(e < 1e-2f);
    }
    /* only w2's gradient reads r, so only it sees the rounding */
    assert_true(max_rel_diff(g1[2], g0[2]) > 0);
    ts_tensor *all[] = {loss0, loss1, r0, r1};
    for (int i = 0; i < 4; i++) ts_tensor_release(all[i]);
    free_leaves(&plain);
    free_leaves(&packed);
}

/* Below 4096 elements, for storages marked no_pack and with packing off,
 * tensors stay f32. */
static void test_small_and_exempt(void **state) {
    (void)state;
    leaves l = make_leaves(8); /* r is 8 x 80 */
    ts_tensor *r;
    bool prev = ts_autograd_set_pack_bf16(true);
    ts_tensor *loss = forward(&l, &r);
    ts_autograd_set_pack_bf16(prev);
    assert_false(r->grad_fn->saved[0]->packed);
    ts_tensor_release(loss);
    ts_tensor_release(r);
    free_leaves(&l);

    leaves m = make_leaves(96);
    ts_tensor *h = ts_matmul(m.x, m.w1); /* 96 x 80, with history */
    h->storage->no_pack = true;
    prev = ts_autograd_set_pack_bf16(true);
    ts_tensor *g = ts_gelu(h); /* gelu keeps its input */
    ts_autograd_set_pack_bf16(prev);
    assert_ptr_equal(g->grad_fn->inputs[0], h);
    h->storage->no_pack = false;
    ts_tensor *g2 = ts_gelu(h);
    assert_ptr_equal(g2->grad_fn->inputs[0], h);
    ts_tensor *all[] = {h, g, g2};
    for (int i = 0; i < 3; i++) ts_tensor_release(all[i]);
    free_leaves(&m);
}

/* With packing, the f32 activations go once the forward drops them. */
static void test_forward_memory(void **state) {
    (void)state;
    size_t live[2];
    for (int p = 0; p < 2; p++) {
        leaves l = make_leaves(1024); /* relu output: 1024 x 80 f32 = 320 KiB */
        ts_tensor *r;
        size_t before = ts_alloc_get_stats().allocated;
        bool prev = ts_autograd_set_pack_bf16(p == 1);
        ts_tensor *loss = forward(&l, &r);
        ts_autograd_set_pack_bf16(prev);
        ts_tensor_release(r);
        live[p] = ts_alloc_get_stats().allocated - before;
        assert_int_equal(ts_backward(loss, NULL), TS_OK);
        ts_tensor_release(loss);
        free_leaves(&l);
    }
    /* relu's output r (1024 x 80) is the one activation both keep */
    print_message("live after forward: %zu bytes f32, %zu bytes packed\n", live[0], live[1]);
    assert_true(live[1] + 1024 * 80 * 2 <= live[0]);
}

/* A GPT with bf16 compute packs its activations; its master gradients stay
 * close to the f32 model's. */
static void test_gpt_bf16_packed(void **state) {
    (void)state;
    ts_model_spec spec = {.arch = TS_ARCH_GPT};
    spec.gpt = (ts_gpt_config){.vocab = 32, .block_size = 16, .n_layer = 2, .n_head = 4, .n_embd = 64};
    ts_tensor *x, *y;
    synth_data(&spec, 4, 32, &x, &y); /* 4 x 16 x 64 activations: 4096 elements */
    ts_model *m[2];
    for (int i = 0; i < 2; i++) {
        m[i] = ts_model_build(&spec, 0, -1, ts_key_from_seed(4), TS_F32);
        assert_non_null(m[i]);
        assert_int_equal(ts_model_set_compute_dtype(m[i], i ? TS_BF16 : TS_F32), TS_OK);
        ts_model_zero_grad(m[i]);
        ts_tensor *loss = slice_loss(m[i], x, y, 32, 0, 4);
        assert_non_null(loss);
        if (i) { /* the first block's attention saved bf16 copies */
            int packed = 0;
            for (ts_node *n = loss->grad_fn; n; n = n->n_inputs && n->inputs[0] ? n->inputs[0]->grad_fn : NULL)
                for (int k = 0; k < TS_NODE_MAX_SAVED; k++) packed += n->saved[k] && n->saved[k]->packed;
            print_message("packed saved tensors along the first-input chain: %d\n", packed);
            assert_true(packed > 0);
            /* the weights' f32 conversions went with the forward */
            for (int k = 0; k < m[i]->n_params; k++)
                assert_true(!m[i]->params[k].compute || !m[i]->params[k].compute->storage);
        }
        assert_int_equal(ts_backward(loss, NULL), TS_OK);
        ts_tensor_release(loss);
        assert_int_equal(ts_model_fold_compute_grads(m[i], 1), TS_OK);
    }
    const float *g32 = ts_f32(m[0]->flat_grads), *g16 = ts_f32(m[1]->flat_grads);
    double d = 0, s = 0;
    for (int64_t i = 0; i < m[0]->numel; i++) {
        d = fmax(d, fabs(g16[i] - g32[i]));
        s = fmax(s, fabs(g32[i]));
    }
    print_message("max |g_bf16 - g_f32| = %.3g (gradient scale %.3g)\n", d, s);
    assert_true(s > 0 && d <= 2e-2 * s);
    ts_model_free(m[0]);
    ts_model_free(m[1]);
    ts_tensor_release(x);
    ts_tensor_release(y);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slots_and_gradients),
        cmocka_unit_test(test_small_and_exempt),
        cmocka_unit_test(test_forward_memory),
        cmocka_unit_test(test_gpt_bf16_packed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
