/* test_gpt_eval.c - a tiny GPT job trained by the real tessera-run on a
 * copy of one fortunes file: its validation loss falls below the uniform
 * byte model's, eval lines count sequences and tokens apart, --eval of the
 * checkpoint agrees with the run's own final validation pass, and
 * --generate prints the prompt followed by the requested number of bytes,
 * also once the corpus is gone (sampling needs only the weights). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BATCH 4
#define BLOCK 16
#define EVAL_BATCHES 3

static char run_dir[256];

static const char *bin_dir(void) {
    const char *b = getenv("TESSERA_BIN_DIR");
    return b ? b : "build/bin";
}

/* Runs cmd, its stdout into out (cap bytes); returns the exit status. */
static int run(const char *cmd, char *out, size_t cap) {
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    return pclose(p);
}

static int setup(void **state) {
    (void)state;
    snprintf(run_dir, sizeof run_dir, "/tmp/tessera_gpt_eval_%d", (int)getpid());
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", run_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_train_eval_generate(void **state) {
    (void)state;
    static char out[1 << 16];
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp /usr/share/games/fortunes/computers %s/corpus", run_dir, run_dir);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd,
             "%s/tessera-run examples/gpt_fortunes.json --run-dir %s --set data.path=%s/corpus --set steps=60 "
             "--set model.n_layer=1 --set model.n_head=2 --set model.n_embd=32 --set model.block_size=%d "
             "--set train.batch_size=%d --set train.eval_every=0 --set train.eval_batches=%d "
             "--set train.checkpoint_every=0 --set train.log_every=20 --set schedule.warmup_steps=5 2>&1",
             bin_dir(), run_dir, run_dir, BLOCK, BATCH, EVAL_BATCHES);
    assert_int_equal(run(cmd, out, sizeof out), 0);
    /* the final validation pass: EVAL_BATCHES batches of BATCH sequences */
    const char *ev = strstr(out, "eval val at step 60 |");
    assert_non_null(ev);
    double loss = 0, bpb = 0;
    long seqs = 0, toks = 0;
    assert_int_equal(sscanf(ev, "eval val at step 60 | loss %lf | %lf bits/byte (%ld sequences, %ld tokens)", &loss,
                            &bpb, &seqs, &toks),
                     4);
    assert_int_equal(seqs, EVAL_BATCHES * BATCH);
    assert_int_equal(toks, EVAL_BATCHES * BATCH * BLOCK);
    assert_true(loss < log(256.0) - 1.0); /* well below the uniform byte model */
    assert_true(fabs(bpb - loss / log(2.0)) < 1e-2);

    /* --eval on the final checkpoint: the whole validation split, same
     * weights, so the same loss up to the batches it covers */
    snprintf(cmd, sizeof cmd, "%s/tessera-run --eval %s/checkpoints/step-60 2>&1", bin_dir(), run_dir);
    assert_int_equal(run(cmd, out, sizeof out), 0);
    const char *line = strstr(out, "step 60, validation loss ");
    assert_non_null(line);
    double eloss = 0;
    long eseqs = 0, etoks = 0;
    assert_int_equal(sscanf(line, "step 60, validation loss %lf, %lf bits/byte (%ld sequences, %ld tokens)", &eloss,
                            &bpb, &eseqs, &etoks),
                     4);
    assert_true(eseqs >= seqs);
    assert_int_equal(etoks, eseqs * BLOCK);
    assert_true(fabs(eloss - loss) < 0.5);

    /* --generate: the prompt, then exactly 40 sampled bytes */
    snprintf(cmd, sizeof cmd, "%s/tessera-run --generate %s/checkpoints/step-60 --prompt 'The ' --tokens 40 --seed 3",
             bin_dir(), run_dir);
    assert_int_equal(run(cmd, out, sizeof out), 0);
    assert_int_equal(strncmp(out, "The ", 4), 0);
    assert_int_equal(strlen(out), 4 + 40 + 1); /* + the final newline */

    /* the same text with the training corpus gone */
    static char again[1 << 16];
    snprintf(cmd, sizeof cmd, "rm %s/corpus", run_dir);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd,
             "%s/tessera-run --generate %s/checkpoints/step-60 --prompt 'The ' --tokens 40 --seed 3 2>&1", bin_dir(),
             run_dir);
    int rc = run(cmd, again, sizeof again);
    printf("%s", again);
    assert_int_equal(rc, 0);
    assert_string_equal(again, out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_train_eval_generate),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
