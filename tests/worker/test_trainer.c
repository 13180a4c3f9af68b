/* test_trainer.c - the training loop's dropout keys: every micro-batch of
 * a step and every data-parallel rank draws masks of its own, the same in
 * every run of the seed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "kernels/nn/module.h"
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dropout_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
