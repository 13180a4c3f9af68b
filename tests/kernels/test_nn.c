/* test_nn.c - modules, models, flat buffers, hooks, checkpointing, split. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>
#include <math.h>

#include "kernels/autograd.h"
#include "kernels/nn/layers.h"
#include "kernels/nn/models.h"
#include "kernels/nn/module.h"
#include "kernels/ops/loss.h"
#include "kernels/ops/reduce.h"
#include "kernels/ops/view.h"
#include "../test_util.h"

static ts_model_spec tiny_gpt(bool checkpoint) {
    ts_model_spec s = {.arch = TS_ARCH_GPT, .checkpoint = checkpoint};
    s.gpt = (ts_gpt_config){.vocab = 32, .block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = 16, .dropout = 0.0};
    return s;
}

static ts_tensor *token_ids(int64_t B, int64_t T, int64_t vocab) {
    ts_tensor *idx = ts_tensor_empty(TS_I64, 2, (int64_t[]){B, T});
    for (int64_t i = 0; i < B * T; i++) ts_tensor_set(idx, i, (double)((i * 7 + 3) % vocab));
    return idx;
}

/* loss of a GPT on fixed tokens, next-token targets */
static ts_tensor *gpt_loss(ts_model *m, int64_t B, int64_t T) {
    ts_tensor *idx = token_ids(B, T, 32), *tgt = token_ids(B, T, 31);
    ts_tensor *logits = ts_model_forward(m, idx);
    assert_non_null(logits);
    ts_tensor *flat = ts_reshape(logits, 2, (int64_t[]){B * T, 32});
    ts_tensor *tflat = ts_reshape(tgt, 1, (int64_t[]){B * T});
    ts_tensor *loss = ts_cross_entropy(flat, tflat, -100, TS_REDUCTION_MEAN);
    ts_tensor *all[] = {idx, tgt, logits, flat, tflat};
    for (int i = 0; i < 5; i++) ts_tensor_release(all[i]);
    return loss;
}

static void test_gpt_names_grads_and_summary(void **state) {
    (void)state;
    ts_model_spec s = tiny_gpt(false);
    ts_model *m = ts_model_build(&s, 0, -1, ts_key_from_seed(1), TS_F32);
    assert_non_null(m);
    assert_true(ts_model_find(m, "blocks.1.attn.qkv.weight") >= 0);
    assert_true(ts_model_find(m, "ln_f.bias") >= 0);
    assert_int_equal(ts_model_find(m, "blocks.2.attn.qkv.weight"), -1);
    assert_non_null(strstr(ts_last_error(), "no parameter named blocks.2.attn.qkv.weight"));
    /* 16*32 + 8*16 + 2 * (4*16 + 16*48+48 + 16*16+16 + 16*64+64 + 64*16+16) + 2*16 */
    assert_int_equal(m->numel, 512 + 128 + 2 * (64 + 816 + 272 + 1088 + 1040) + 32);
    ts_tensor *loss = gpt_loss(m, 2, 8);
    assert_int_equal(ts_backward(loss, NULL), TS_OK);
    /* gradients landed in the flat buffer, at the parameters' offsets */
    int qkv = ts_model_find(m, "blocks.0.attn.qkv.weight");
    double g = 0;
    for (int64_t i = 0; i < m->params[qkv].numel; i++) g += ts_f32(m->flat_grads)[m->params[qkv].offset + i] != 0;
    assert_true(g > 0);
    ts_tensor_release(loss);
    FILE *f = tmpfile();
    assert_int_equal(ts_model_summary(m, f, TS_I64, 2, (int64_t[]){2, 8}), TS_OK);
    char buf[8192] = {0};
    tu_read_back(f, buf, sizeof buf);
    assert_non_null(strstr(buf, "blocks.0.attn"));
    assert_non_null(strstr(buf, "[2,8,32]"));
    assert_non_null(strstr(buf, "Total params: 7232"));
    ts_model_free(m);
}

static void test_checkpointing_gives_same_gradients(void **state) {
    (void)state;
    ts_model_spec plain = tiny_gpt(false), ckpt = tiny_gpt(true);
    ts_model *a = ts_model_build(&plain, 0, -1, ts_key_from_seed(3), TS_F32);
    ts_model *b = ts_model_build(&ckpt, 0, -1, ts_key_from_seed(3), TS_F32);
    ts_tensor *la = gpt_loss(a, 2, 8), *lb = gpt_loss(b, 2, 8);
    assert_true(ts_tensor_item(la) == ts_tensor_item(lb));
    assert_int_equal(ts_backward(la, NULL), TS_OK);
    assert_int_equal(ts_backward(lb, NULL), TS_OK);
    for (int64_t i = 0; i < a->numel; i++)
        assert_true(fabsf(ts_f32(a->flat_grads)[i] - ts_f32(b->flat_grads)[i]) <= 1e-6f);
    ts_tensor_release(la);
    ts_tensor_release(lb);
    ts_model_free(a);
    ts_model_free(b);
}

static void test_split_matches_whole(void **state) {
    (void)state;
    ts_model_spec s = tiny_gpt(false);
    ts_model *whole = ts_model_build(&s, 0, -1, ts_key_from_seed(5), TS_F32);
    ts_model *parts[2];
    int cut = 2;
    assert_int_equal(ts_model_split(whole, &s, 2, &cut, parts), TS_OK);
    assert_true(ts_model_find(parts[1], "blocks.1.mlp.fc.weight") >= 0);
    assert_int_equal(ts_model_find(parts[0], "blocks.1.mlp.fc.weight"), -1);
    assert_true(ts_model_find(parts[1], "wte.weight") >= 0); /* tied head copy */
    ts_tensor *idx = token_ids(2, 8, 32);
    ts_tensor *y = ts_model_forward(whole, idx);
    ts_tensor *h = ts_model_forward(parts[0], idx);
    ts_tensor *y2 = ts_model_forward(parts[1], h);
    for (int64_t i = 0; i < ts_tensor_numel(y); i++) assert_true(ts_tensor_get(y, i) == ts_tensor_get(y2, i));
    int bad = 9;
    assert_int_not_equal(ts_model_split(whole, &s, 2, &bad, parts), TS_OK);
    assert_non_null(strstr(ts_last_error(), "boundary 0 (= 9)"));
    ts_tensor *all[] = {idx, y, h, y2};
    for (int i = 0; i < 4; i++) ts_tensor_release(all[i]);
    ts_model_free(parts[0]);
    ts_model_free(parts[1]);
    ts_model_free(whole);
}

/* A model built for a run of units from the seed holds the whole model's
 * values for them, and computes that part of the whole's forward and
 * backward: the same outputs, and the same gradients for its parameters
 * and for its input. */
static void test_slice_built_from_seed(void **state) {
    (void)state;
    ts_model_spec s = tiny_gpt(false);
    ts_key key = ts_key_from_seed(11);
    ts_model *whole = ts_model_build(&s, 0, -1, key, TS_F32);
    ts_model *head = ts_model_build(&s, 0, 2, key, TS_F32), *tail = ts_model_build(&s, 2, -1, key, TS_F32);
    assert_non_null(whole);
    assert_non_null(head);
    assert_non_null(tail);
    ts_model *parts[2] = {head, tail};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < parts[k]->n_params; i++) {
            const ts_param *p = &parts[k]->params[i];
            int w = ts_model_find(whole, p->name);
            assert_true(w >= 0);
            assert_memory_equal(ts_tensor_data(p->value), ts_tensor_data(whole->params[w].value),
                                (size_t)p->numel * sizeof(float));
        }
    /* forward and backward of the whole, and of head then tail through a
     * leaf that stands for the activation between them */
    ts_tensor *idx = token_ids(2, 8, 32);
    ts_tensor *y = ts_model_forward(whole, idx);
    ts_tensor *yl = ts_sum_all(y);
    assert_int_equal(ts_backward(yl, NULL), TS_OK);
    ts_tensor *h = ts_model_forward(head, idx);
    ts_tensor *hl = ts_tensor_alias(h);
    hl->requires_grad = true;
    ts_tensor *y2 = ts_model_forward(tail, hl);
    ts_tensor *y2l = ts_sum_all(y2);
    assert_int_equal(ts_backward(y2l, NULL), TS_OK);
    assert_int_equal(ts_backward(h, hl->grad), TS_OK);
    for (int64_t i = 0; i < ts_tensor_numel(y); i++) assert_true(ts_tensor_get(y, i) == ts_tensor_get(y2, i));
    /* the tied embedding gets gradients in both parts; their sum is the whole's */
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < parts[k]->n_params; i++) {
            const ts_param *p = &parts[k]->params[i];
            const ts_param *q = &whole->params[ts_model_find(whole, p->name)];
            bool tied = strcmp(p->name, "wte.weight") == 0;
            for (int64_t e = 0; e < p->numel; e++) {
                double g = ts_tensor_get(p->value->grad, e), want = ts_tensor_get(q->value->grad, e);
                if (tied) g += ts_tensor_get(parts[1 - k]->params[ts_model_find(parts[1 - k], p->name)].value->grad, e);
                assert_true(fabs(g - want) <= 1e-5 * (1 + fabs(want)));
            }
        }
    ts_tensor *all[] = {idx, y, yl, h, hl, y2, y2l};
    for (int i = 0; i < 7; i++) ts_tensor_release(all[i]);
    ts_model_free(whole);
    ts_model_free(head);
    ts_model_free(tail);
}

/* Checks that module a and its descendants have the indices of their
 * counterparts b in the whole model (what their dropout keys fold in). */
static void expect_same_indices(const ts_module *a, const ts_module *b) {
    assert_string_equal(a->name, b->name);
    assert_int_equal(a->index, b->index);
    assert_int_equal(a->n_children, b->n_children);
    for (int i = 0; i < a->n_children; i++) expect_same_indices(a->children[i], b->children[i]);
}

/* Runs of units [0, 1) and [2, 4) (an interleaved pipeline stage's chunks)
 * in one model: the whole model's values, its modules' indices, and each
 * chunk run alone (ts_model_forward_units) computes what the whole's units
 * compute. */
static void test_runs_of_units(void **state) {
    (void)state;
    ts_model_spec s = tiny_gpt(false);
    ts_key key = ts_key_from_seed(13);
    ts_model *whole = ts_model_build(&s, 0, -1, key, TS_F32);
    ts_unit_runs runs = {.n = 2, .first = {0, 2}, .end = {1, 4}};
    ts_model *part = ts_model_build_runs(&s, &runs, key, TS_F32);
    assert_non_null(whole);
    assert_non_null(part);
    assert_int_equal(part->root->n_children, 3);
    const int unit_of[3] = {0, 2, 3};
    for (int k = 0; k < 3; k++) expect_same_indices(part->root->children[k], whole->root->children[unit_of[k]]);
    for (int i = 0; i < part->n_params; i++) {
        const ts_param *p = &part->params[i];
        int w = ts_model_find(whole, p->name);
        assert_true(w >= 0);
        assert_memory_equal(ts_tensor_data(p->value), ts_tensor_data(whole->params[w].value),
                            (size_t)p->numel * sizeof(float));
    }
    ts_tensor *idx = token_ids(2, 8, 32);
    ts_tensor *x0 = ts_model_forward_units(whole, idx, 0, 1), *want = ts_model_forward_units(part, idx, 0, 1);
    for (int64_t i = 0; i < ts_tensor_numel(x0); i++) assert_true(ts_tensor_get(x0, i) == ts_tensor_get(want, i));
    ts_tensor *x1 = ts_model_forward_units(whole, x0, 1, 2);
    ts_tensor *y = ts_model_forward_units(whole, x1, 2, 4), *y2 = ts_model_forward_units(part, x1, 1, 3);
    for (int64_t i = 0; i < ts_tensor_numel(y); i++) assert_true(ts_tensor_get(y, i) == ts_tensor_get(y2, i));
    /* bad runs and unit ranges are refused by name */
    ts_unit_runs bad = {.n = 2, .first = {2, 1}, .end = {3, 2}};
    assert_null(ts_model_build_runs(&s, &bad, key, TS_F32));
    assert_non_null(strstr(ts_last_error(), "unit range [1, 2) is not inside [3, 4)"));
    assert_null(ts_model_forward_units(part, x1, 2, 5));
    assert_non_null(strstr(ts_last_error(), "units [2, 5) of a model of 3"));
    ts_tensor *all[] = {idx, x0, want, x1, y, y2};
    for (int i = 0; i < 6; i++) ts_tensor_release(all[i]);
    ts_model_free(whole);
    ts_model_free(part);
}

static int hook_calls[4];

static ts_status count_hook(ts_module *m, ts_tensor *t, void *ctx) {
    (void)m;
    (void)t;
    hook_calls[(intptr_t)ctx]++;
    return TS_OK;
}

static void test_hooks_fire(void **state) {
    (void)state;
    ts_model_spec s = tiny_gpt(false);
    ts_model *m = ts_model_build(&s, 0, -1, ts_key_from_seed(1), TS_F32);
    ts_module *blk = m->root->children[1];
    for (intptr_t k = 0; k < 4; k++) ts_module_add_hook(blk, (ts_hook_kind)k, count_hook, (void *)k);
    ts_tensor *loss = gpt_loss(m, 1, 4);
    assert_int_equal(hook_calls[TS_HOOK_PRE_FORWARD], 1);
    assert_int_equal(hook_calls[TS_HOOK_POST_FORWARD], 1);
    assert_int_equal(hook_calls[TS_HOOK_PRE_BACKWARD], 0);
    ts_backward(loss, NULL);
    assert_int_equal(hook_calls[TS_HOOK_PRE_BACKWARD], 1);
    assert_int_equal(hook_calls[TS_HOOK_POST_BACKWARD], 1);
    ts_tensor_release(loss);
    ts_model_free(m);
}

static void test_bad_inputs(void **state) {
    (void)state;
    ts_model_spec s = {.arch = TS_ARCH_MLP, .n_widths = 3, .widths = {10, 8, 3}};
    ts_model *m = ts_model_build(&s, 0, -1, ts_key_from_seed(1), TS_F32);
    ts_tensor *x = ts_tensor_zeros(TS_F32, 2, (int64_t[]){4, 9});
    assert_null(ts_model_forward(m, x));
    assert_non_null(strstr(ts_last_error(), "fc0"));
    assert_non_null(strstr(ts_last_error(), "[4,9]"));
    ts_tensor_release(x);
    ts_model_spec g = tiny_gpt(false);
    g.gpt.n_head = 3;
    assert_null(ts_model_build(&g, 0, -1, ts_key_from_seed(1), TS_F32));
    assert_non_null(strstr(ts_last_error(), "not divisible by n_head 3"));
    ts_model_free(m);
    ts_model *lm = ts_model_new(); /* refused when built, not at its first forward */
    assert_null(ts_layernorm_new(lm, NULL, "ln", 4, 0));
    assert_non_null(strstr(ts_last_error(), "LayerNorm ln: eps = 0 must be finite and > 0"));
    ts_model_free(lm);
}

/* ---- gradcheck through a transformer block and the CNN (f64) ---- */

typedef struct {
    ts_model *m;
    ts_tensor *x;
} fwd_ctx;

static ts_tensor *model_fn(ts_tensor *const *in, void *vctx) {
    (void)in;
    fwd_ctx *c = vctx;
    return ts_model_forward(c->m, c->x);
}

static void gradcheck_model(ts_model *m, ts_tensor *x) {
    ts_tensor *inputs[64];
    int n = 0;
    for (int i = 0; i < m->n_params && n < 63; i++) inputs[n++] = m->params[i].value;
    if (x->dtype == TS_F64) {
        ts_set_requires_grad(x, true);
        inputs[n++] = x;
    }
    fwd_ctx c = {m, x};
    ts_status st = ts_gradcheck(model_fn, &c, n, inputs, 1e-6, 1e-6, 1e-5);
    if (st) fail_msg("%s", ts_last_error());
}

static void test_gradcheck_block(void **state) {
    (void)state;
    ts_model_spec s = tiny_gpt(false);
    s.gpt.n_embd = 8;
    s.gpt.n_layer = 1;
    ts_model *m = ts_model_build(&s, 1, 2, ts_key_from_seed(7), TS_F64); /* blocks.0 alone */
    assert_non_null(m);
    ts_tensor *x = ts_tensor_randn(ts_key_from_seed(8), TS_F64, 3, (int64_t[]){2, 3, 8});
    gradcheck_model(m, x);
    ts_tensor_release(x);
    ts_model_free(m);
}

static void test_gradcheck_cnn(void **state) {
    (void)state;
    ts_model_spec s = {.arch = TS_ARCH_CNN, .in_ch = 1, .img = 8, .ch1 = 2, .ch2 = 3, .kernel = 3, .classes = 3};
    ts_model *m = ts_model_build(&s, 0, -1, ts_key_from_seed(9), TS_F64);
    assert_non_null(m);
    ts_tensor *x = ts_tensor_randn(ts_key_from_seed(10), TS_F64, 4, (int64_t[]){2, 1, 8, 8});
    gradcheck_model(m, x);
    ts_tensor_release(x);
    ts_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt_names_grads_and_summary),
        cmocka_unit_test(test_checkpointing_gives_same_gradients),
        cmocka_unit_test(test_split_matches_whole),
        cmocka_unit_test(test_slice_built_from_seed),
        cmocka_unit_test(test_runs_of_units),
        cmocka_unit_test(test_hooks_fire),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_gradcheck_block),
        cmocka_unit_test(test_gradcheck_cnn),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
