/* test_model_torch.c - whole-model parity with PyTorch.
 *
 * Tessera builds a GPT (2 layers, C=64, 4 heads, T=32, vocab 256) and the
 * CNN (1x28x28, 8/16 channels, kernel 5, 10 classes), writes its initial
 * weights by parameter name and a few batches (safetensors), then its logits,
 * loss and every parameter gradient on batch 0, and the parameters after 5
 * AdamW steps and after 5 SGD-momentum steps (batch s at step s, weight decay
 * on parameters with ndim >= 2 only, through ts_optim_groups_build).
 * tests/kernels/model_torch.py (run with /usr/bin/python3) builds the same
 * modules in torch, loads the weights and checks all of it within 1e-5
 * relative; it prints one line per tensor. If torch cannot be imported the
 * test fails. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "kernels/autograd.h"
#include "kernels/io/safetensors.h"
#include "kernels/nn/models.h"
#include "kernels/ops/loss.h"
#include "kernels/ops/view.h"
#include "kernels/optim/optim.h"
#include "../test_util.h"

#define STEPS 5
#define ADAMW_LR 1e-3
#define SGD_LR 1e-2
#define SGD_MOMENTUM 0.9
#define WD 0.1 /* on matrices only */

static char dir[] = "/tmp/tessera_model_torch_XXXXXX";

typedef struct {
    const char *tag; /* "gpt" / "cnn", also the script's argument */
    ts_model_spec spec;
    int64_t batch;
    int64_t classes; /* logits' last dim */
} model_case;

static int setup(void **state) {
    (void)state;
    return tu_make_tmp_dir(dir, sizeof dir, "tessera_model_torch");
}

static int teardown(void **state) {
    (void)state;
    return tu_remove_dir(dir);
}

static void path_of(char *out, size_t n, const model_case *c, const char *what) {
    snprintf(out, n, "%s/%s_%s.safetensors", dir, c->tag, what);
}

/* Input and targets of batch s (deterministic, from Philox). */
static void make_batch(const model_case *c, int s, ts_tensor **x, ts_tensor **y) {
    ts_key key = ts_key_split(ts_key_from_seed(77), (uint64_t)s);
    int64_t shape[TS_MAX_DIMS];
    ts_dtype dt;
    int nd = ts_model_input_shape(&c->spec, c->batch, shape, &dt);
    ts_tensor *u = ts_tensor_rand(key, TS_F32, nd, shape);
    assert_non_null(u);
    if (dt == TS_I64) {
        *x = ts_tensor_empty(TS_I64, nd, shape);
        for (int64_t i = 0; i < ts_tensor_numel(u); i++)
            ts_tensor_set(*x, i, (double)(int64_t)(ts_tensor_get(u, i) * (double)c->classes));
        /* next-token targets over the same vocabulary */
        *y = ts_tensor_empty(TS_I64, nd, shape);
        for (int64_t i = 0; i < ts_tensor_numel(u); i++)
            ts_tensor_set(*y, i, (double)(((int64_t)ts_tensor_get(*x, i) * 31 + 7) % c->classes));
        ts_tensor_release(u);
    } else {
        *x = u;
        *y = ts_tensor_empty(TS_I64, 1, &c->batch);
        for (int64_t i = 0; i < c->batch; i++) ts_tensor_set(*y, i, (double)((i * 3 + (int64_t)s) % c->classes));
    }
}

/* Mean cross-entropy of the model on (x, y); logits returned in *logits. */
static ts_tensor *model_loss(ts_model *m, const model_case *c, ts_tensor *x, ts_tensor *y, ts_tensor **logits) {
    ts_tensor *out = ts_model_forward(m, x);
    assert_non_null(out);
    ts_tensor *flat = ts_reshape(out, 2, (int64_t[]){-1, c->classes});
    ts_tensor *tflat = ts_reshape(y, 1, (int64_t[]){-1});
    ts_tensor *loss = ts_cross_entropy(flat, tflat, -100, TS_REDUCTION_MEAN);
    assert_non_null(loss);
    ts_tensor_release(flat);
    ts_tensor_release(tflat);
    if (logits) *logits = out;
    else ts_tensor_release(out);
    return loss;
}

/* Writes every parameter (or its gradient) of m under its name, plus extra. */
static void write_params(const char *path, const ts_model *m, bool grads, int n_extra, const char **extra_names,
                         ts_tensor **extra, int nmeta, const char **mk, const char **mv) {
    int n = m->n_params + n_extra;
    const char **names = malloc(sizeof *names * (size_t)n);
    ts_tensor **ts = malloc(sizeof *ts * (size_t)n);
    for (int i = 0; i < m->n_params; i++) {
        names[i] = m->params[i].name;
        ts[i] = grads ? m->params[i].value->grad : m->params[i].value;
    }
    for (int i = 0; i < n_extra; i++) {
        names[m->n_params + i] = extra_names[i];
        ts[m->n_params + i] = extra[i];
    }
    assert_int_equal(ts_safetensors_write(path, n, names, ts, nmeta, mk, mv), TS_OK);
    free(names);
    free(ts);
}

/* Weight decay on parameters with ndim >= 2, none on biases and norms. */
static void decay_groups(const ts_model *m, ts_optim_groups *g) {
    ts_optim_named *named = malloc(sizeof *named * (size_t)m->n_params);
    for (int i = 0; i < m->n_params; i++)
        named[i] = (ts_optim_named){m->params[i].name, m->params[i].ndim, m->params[i].offset, m->params[i].numel};
    ts_optim_decay_rule rule = {.min_ndim = 2};
    assert_int_equal(ts_optim_groups_build(g, m->numel, named, m->n_params, &rule), TS_OK);
    free(named);
}

/* STEPS optimizer steps from the initial weights; writes the result. */
static void train(const model_case *c, const ts_optim_config *cfg, double lr, const char *what) {
    ts_model *m = ts_model_build(&c->spec, 0, -1, ts_key_from_seed(11), TS_F32);
    assert_non_null(m);
    assert_int_equal(ts_model_alloc_state(m, ts_optim_state_slots(cfg)), TS_OK);
    ts_optim_groups g;
    decay_groups(m, &g);
    for (int s = 0; s < STEPS; s++) {
        ts_tensor *x, *y;
        make_batch(c, s, &x, &y);
        ts_model_zero_grad(m);
        ts_tensor *loss = model_loss(m, c, x, y, NULL);
        assert_int_equal(ts_backward(loss, NULL), TS_OK);
        assert_int_equal(ts_optim_step_flat(cfg, s + 1, lr, &g, ts_f32(m->flat_params), ts_f32(m->flat_grads),
                                            m->state, m->numel, 0, m->numel),
                         TS_OK);
        ts_tensor_release(loss);
        ts_tensor_release(x);
        ts_tensor_release(y);
    }
    char path[300];
    path_of(path, sizeof path, c, what);
    write_params(path, m, false, 0, NULL, NULL, 0, NULL, NULL);
    ts_optim_groups_free(&g);
    ts_model_free(m);
}

static void run_case(const model_case *c) {
    ts_model *m = ts_model_build(&c->spec, 0, -1, ts_key_from_seed(11), TS_F32);
    assert_non_null(m);
    /* initial weights, with the model's and the optimizers' settings as metadata */
    const ts_gpt_config *g = &c->spec.gpt;
    char v[17][32];
    long long vals[] = {g->n_layer, g->n_head, g->n_embd, g->vocab, g->block_size, c->spec.in_ch, c->spec.img,
                        c->spec.ch1, c->spec.ch2, c->spec.kernel, c->spec.classes, STEPS};
    const char *mk[] = {"n_layer", "n_head", "n_embd", "vocab", "block_size", "in_ch", "img", "ch1", "ch2",
                        "kernel", "classes", "steps", "adamw_lr", "adamw_wd", "sgd_lr", "sgd_momentum", "sgd_wd"};
    for (int i = 0; i < 12; i++) snprintf(v[i], sizeof v[i], "%lld", vals[i]);
    snprintf(v[12], sizeof v[12], "%.17g", ADAMW_LR);
    snprintf(v[13], sizeof v[13], "%.17g", WD);
    snprintf(v[14], sizeof v[14], "%.17g", SGD_LR);
    snprintf(v[15], sizeof v[15], "%.17g", SGD_MOMENTUM);
    snprintf(v[16], sizeof v[16], "%.17g", WD);
    const char *mv[17];
    for (int i = 0; i < 17; i++) mv[i] = v[i];
    char path[300];
    path_of(path, sizeof path, c, "weights");
    write_params(path, m, false, 0, NULL, NULL, 17, mk, mv);

    /* the batches */
    const char *bnames[2 * STEPS];
    char bn[2 * STEPS][16];
    ts_tensor *bt[2 * STEPS];
    for (int s = 0; s < STEPS; s++) {
        make_batch(c, s, &bt[2 * s], &bt[2 * s + 1]);
        snprintf(bn[2 * s], sizeof bn[0], "x%d", s);
        snprintf(bn[2 * s + 1], sizeof bn[0], "y%d", s);
        bnames[2 * s] = bn[2 * s];
        bnames[2 * s + 1] = bn[2 * s + 1];
    }
    path_of(path, sizeof path, c, "batches");
    assert_int_equal(ts_safetensors_write(path, 2 * STEPS, bnames, bt, 0, NULL, NULL), TS_OK);

    /* logits, loss and gradients on batch 0 */
    ts_tensor *logits;
    ts_tensor *loss = model_loss(m, c, bt[0], bt[1], &logits);
    assert_int_equal(ts_backward(loss, NULL), TS_OK);
    ts_tensor *loss1 = ts_reshape(loss, 1, (int64_t[]){1});
    const char *en[] = {"__logits", "__loss"};
    ts_tensor *ev[] = {logits, loss1};
    path_of(path, sizeof path, c, "grads");
    write_params(path, m, true, 2, en, ev, 0, NULL, NULL);
    ts_tensor_release(loss1);
    ts_tensor_release(loss);
    ts_tensor_release(logits);
    for (int i = 0; i < 2 * STEPS; i++) ts_tensor_release(bt[i]);
    ts_model_free(m);

    ts_optim_config adamw = ts_optim_defaults(TS_OPTIM_ADAMW);
    adamw.weight_decay = WD;
    train(c, &adamw, ADAMW_LR, "adamw");
    ts_optim_config sgd = ts_optim_defaults(TS_OPTIM_SGD);
    sgd.momentum = SGD_MOMENTUM;
    sgd.weight_decay = WD;
    train(c, &sgd, SGD_LR, "sgd");

    char args[512];
    snprintf(args, sizeof args, "%s %s 2>&1", dir, c->tag);
    tu_run_python("tests/kernels/model_torch.py", args, 2);
}

static void test_gpt_matches_torch(void **state) {
    (void)state;
    model_case c = {.tag = "gpt", .batch = 2, .classes = 256};
    c.spec.arch = TS_ARCH_GPT;
    c.spec.gpt = (ts_gpt_config){.vocab = 256, .block_size = 32, .n_layer = 2, .n_head = 4, .n_embd = 64};
    run_case(&c);
}

static void test_cnn_matches_torch(void **state) {
    (void)state;
    model_case c = {.tag = "cnn", .batch = 4, .classes = 10};
    c.spec = (ts_model_spec){.arch = TS_ARCH_CNN, .in_ch = 1, .img = 28, .ch1 = 8, .ch2 = 16, .kernel = 5, .classes = 10};
    run_case(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt_matches_torch),
        cmocka_unit_test(test_cnn_matches_torch),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
