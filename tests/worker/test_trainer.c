/* test_trainer.c - the training loop: (1) dropout keys: every micro-batch
 * of a step and every data-parallel rank draws masks of its own, the same
 * in every run of the seed; (2) with bf16 compute each parameter is
 * announced to the strategy once, during the last micro-batch's backward,
 * with its f32 master gradient then already what the whole-buffer fold
 * gives (a GPT with a tied embedding and head; flat and detached
 * gradients); (3) a resumed run's metrics.jsonl drops a last line that a
 * failed write cut short; (4) a run whose last step is a checkpoint step
 * saves that checkpoint once, not again as its final one. */
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kernels/io/atomic.h"
#include "kernels/nn/module.h"
#include "worker/metrics.h"
#include "worker/strategy.h"
#include "worker/trainer.h"

/* The keys the model's forwards ran with, in order. */
typedef struct {
    ts_key keys[8];
    int n;
} seen_keys;

/* Pre-forward hook of the model's root: notes the dropout key. */
static ts_status note_key(ts_module *mod, ts_tensor *x, void *ctx) {
    (void)x;
    seen_keys *s = ctx;
    if (s->n < 8) s->keys[s->n++] = mod->model->dropout_key;
    return TS_OK;
}

/* The keys of one step's two micro-batches on data-parallel rank into
 * out (s: the hook's notes). */
static void step_keys(ts_trainer *t, int rank, seen_keys *s, ts_key *out) {
    s->n = 0;
    t->strategy->group.rank = rank;
    double loss;
    int64_t samples;
    assert_int_equal(ts_trainer_grads(t, &loss, &samples), TS_OK);
    assert_int_equal(s->n, 2);
    memcpy(out, s->keys, 2 * sizeof *out);
}

static void test_dropout_keys(void **state) {
    (void)state;
    const char *text = "{\"seed\": 3, \"model\": {\"arch\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 8, "
                       "\"block_size\": 8, \"dropout\": 0.1}, \"data\": {\"kind\": \"text\", \"prefetch\": 0}, "
                       "\"train\": {\"batch_size\": 2, \"accum_steps\": 2}}";
    ts_job job;
    assert_int_equal(ts_job_parse(text, NULL, 0, &job), TS_OK);
    ts_trainer *t = ts_trainer_create(&job, text, NULL, false, ts_strategy_create(&(ts_strategy_options){.job = &job}));
    assert_non_null(t);
    seen_keys s;
    assert_int_equal(ts_module_add_hook(t->model->root, TS_HOOK_PRE_FORWARD, note_key, &s), TS_OK);
    ts_key a[2], b[2], again[2];
    step_keys(t, 0, &s, a);
    /* the step's two micro-batches draw different masks */
    assert_memory_not_equal(&a[0], &a[1], sizeof(ts_key));
    step_keys(t, 1, &s, b);
    /* another rank, at the same step, others again */
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) assert_memory_not_equal(&a[i], &b[j], sizeof(ts_key));
    step_keys(t, 0, &s, again);
    /* and the same ones each time */
    assert_memory_equal(a, again, sizeof a);
    ts_trainer_free(t);
}

/* (2) What a strategy was told during one step, per parameter. */
typedef struct {
    ts_trainer *t;
    int count[64];        /* announcements */
    bool in_backward[64]; /* the last one came during the last micro-batch */
    float *grads;         /* the master gradients as they were then (flat layout) */
} announced;

static announced *seen;

/* grads_ready that notes the parameter at offset and its master gradient. */
static ts_status note_ready(ts_strategy *s, int64_t offset, int64_t len) {
    (void)s;
    ts_model *m = seen->t->model;
    int i = 0;
    while (m->params[i].offset != offset) i++;
    assert_int_equal(len, m->params[i].numel);
    const ts_tensor *g = m->grads_detached ? m->params[i].value->grad : NULL;
    assert_true(!m->grads_detached || g);
    memcpy(seen->grads + offset, g ? ts_f32(g) : ts_f32(m->flat_grads) + offset, (size_t)len * sizeof(float));
    seen->count[i]++;
    seen->in_backward[i] = seen->t->last_micro; /* set only around the last micro-batch */
    return TS_OK;
}

static const char *const bf16_job =
    "{\"seed\": 3, \"model\": {\"arch\": \"gpt\", \"n_layer\": 2, \"n_head\": 2, \"n_embd\": 8, "
    "\"block_size\": 8}, \"data\": {\"kind\": \"text\", \"prefetch\": 0}, "
    "\"train\": {\"batch_size\": 2, \"accum_steps\": 2, \"precision\": \"bf16\"}}";

static ts_trainer *bf16_trainer(const ts_job *job) {
    ts_trainer *t = ts_trainer_create(job, bf16_job, NULL, false, ts_strategy_create(&(ts_strategy_options){.job = job}));
    assert_non_null(t);
    assert_int_equal(t->model->compute_dtype, TS_BF16);
    assert_true(t->model->n_params <= 64);
    return t;
}

static void test_bf16_announced_folded(void **state) {
    (void)state;
    ts_job job;
    assert_int_equal(ts_job_parse(bf16_job, NULL, 0, &job), TS_OK);
    /* the reference: no hooks, every gradient folded after each backward */
    ts_trainer *ref = bf16_trainer(&job);
    for (int i = 0; i < ref->model->n_params; i++) ts_model_grad_leaf(ref->model, i)->grad_hook = NULL;
    double loss, ref_loss;
    int64_t samples;
    assert_int_equal(ts_trainer_grads(ref, &ref_loss, &samples), TS_OK);
    const float *want = ts_f32(ref->model->flat_grads);
    for (int detached = 0; detached < 2; detached++) {
        ts_trainer *t = bf16_trainer(&job);
        ts_model *m = t->model;
        if (detached) ts_model_detach_grads(m);
        announced a = {.t = t, .grads = calloc((size_t)m->numel, sizeof(float))};
        assert_non_null(a.grads);
        seen = &a;
        ts_strategy_ops ops = *t->strategy->ops;
        ops.grads_ready = note_ready;
        t->strategy->ops = &ops;
        assert_int_equal(ts_trainer_grads(t, &loss, &samples), TS_OK);
        assert_true(loss == ref_loss);
        for (int i = 0; i < m->n_params; i++) {
            const ts_param *p = &m->params[i];
            if (a.count[i] != 1 || !a.in_backward[i])
                fail_msg("%s: announced %d times, %s backward", p->name, a.count[i],
                         a.in_backward[i] ? "in" : "after");
            assert_memory_equal(a.grads + p->offset, want + p->offset, (size_t)p->numel * sizeof(float));
        }
        if (!detached) assert_memory_equal(ts_f32(m->flat_grads), want, (size_t)m->numel * sizeof(float));
        free(a.grads);
        ts_trainer_free(t);
    }
    ts_trainer_free(ref);
}

/* (3) A run resumed from step 2 keeps the whole lines of steps 1 and 2
 * and drops the half line a full disk left (it names step 1: the "12" of
 * step 12 was cut), so that the lines appended after it stay JSON. */
static void test_metrics_cut_short(void **state) {
    (void)state;
    const char *whole = "{\"kind\":\"step\",\"step\":1,\"loss\":2.5}\n"
                        "{\"kind\":\"step\",\"step\":2,\"loss\":2.25}\n";
    const char *next = "{\"kind\":\"step\",\"step\":3,\"loss\":2.125}\n";
    char dir[] = "/tmp/tessera-metrics-XXXXXX", path[64], text[512];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "%s{\"kind\":\"step\",\"step\":1", whole);
    fclose(f);
    int64_t last;
    assert_non_null(f = ts_metrics_open(dir, 2, &last));
    assert_int_equal(last, 2);
    fputs(next, f);
    fclose(f);
    assert_non_null(f = fopen(path, "r"));
    text[fread(text, 1, sizeof text - 1, f)] = '\0';
    fclose(f);
    assert_true(strncmp(text, whole, strlen(whole)) == 0);
    assert_string_equal(text + strlen(whole), next);
    assert_int_equal(remove(path), 0);
    assert_int_equal(rmdir(dir), 0);
}

/* (4) The steps the strategy was asked to save, in order. */
static struct {
    int64_t steps[8];
    int n;
    ts_status (*save)(ts_strategy *s, char *path, size_t cap);
} saves;

/* save that notes the step and saves as the strategy does. */
static ts_status note_save(ts_strategy *s, char *path, size_t cap) {
    if (saves.n < 8) saves.steps[saves.n] = s->trainer->step;
    saves.n++;
    return saves.save(s, path, cap);
}

static void test_last_checkpoint_once(void **state) {
    (void)state;
    const char *text = "{\"seed\": 3, \"steps\": 4, \"model\": {\"arch\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, "
                       "\"n_embd\": 8, \"block_size\": 8}, \"data\": {\"kind\": \"text\", \"prefetch\": 0}, "
                       "\"train\": {\"batch_size\": 2, \"checkpoint_every\": 2}}";
    char dir[] = "/tmp/tessera-save-once-XXXXXX";
    assert_non_null(mkdtemp(dir));
    ts_job job;
    assert_int_equal(ts_job_parse(text, NULL, 0, &job), TS_OK);
    ts_trainer *t = ts_trainer_create(&job, text, dir, false, ts_strategy_create(&(ts_strategy_options){.job = &job}));
    assert_non_null(t);
    assert_int_equal(ts_trainer_attach(t), TS_OK);
    ts_strategy_ops ops = *t->strategy->ops;
    saves.save = ops.save;
    saves.n = 0;
    ops.save = note_save;
    t->strategy->ops = &ops;
    assert_int_equal(ts_trainer_run(t, NULL), TS_OK);
    if (saves.n != 2) fail_msg("%d saves, of steps %lld, %lld, %lld", saves.n, (long long)saves.steps[0],
                               (long long)saves.steps[1], (long long)saves.steps[2]);
    assert_int_equal(saves.steps[0], 2);
    assert_int_equal(saves.steps[1], 4);
    ts_trainer_free(t);
    assert_int_equal(ts_io_remove_tree(dir), TS_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dropout_keys),
        cmocka_unit_test(test_bf16_announced_folded),
        cmocka_unit_test(test_metrics_cut_short),
        cmocka_unit_test(test_last_checkpoint_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
