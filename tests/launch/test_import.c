/* test_import.c - weights trained in PyTorch, used through the real
 * tessera-run with nothing but a job: --eval of a CNN's safetensors, --generate
 * from a GPT under Hugging Face GPT-2 names with the shipped name map, a
 * training job starting from them (model.init_from) whose checkpoints
 * evaluate and resume once that file is gone, a GPT saved in half precision
 * (F16) that trains as its values saved as F32 do, and the messages a
 * mismatch gets (the tensor and both shapes). Weights come from
 * tests/kernels/import_torch.py (/usr/bin/python3 with torch). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "../test_util.h"

#define HANG_S 300
#define CNN_JOB "examples/cnn_fashion.json --set model.ch1=4 --set model.ch2=8 --set model.kernel=5"
#define GPT_JOB "examples/gpt_fortunes.json --set model.n_layer=2 --set model.n_head=2 --set model.n_embd=32 " \
                "--set model.block_size=16"

static char dir[64];
static char out[1 << 16];

static int setup(void **state) {
    (void)state;
    if (tu_make_tmp_dir(dir, sizeof dir, "tessera_import")) return -1;
    tu_run_python("tests/kernels/import_torch.py", dir, 2);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return tu_remove_dir(dir);
}

/* Runs tessera-run with args (printf-style) under timeout, stdout and
 * stderr into out; returns the exit status. */
static int run(const char *fmt, ...) {
    char args[2048], cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    const char *bin = getenv("TESSERA_BIN_DIR");
    snprintf(cmd, sizeof cmd, "timeout %d %s/tessera-run %s 2>&1", HANG_S, bin ? bin : "build/bin", args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    int rc = pclose(p);
    printf("$ tessera-run %s\n%s", args, out);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void test_eval_weights(void **state) {
    (void)state;
    assert_int_equal(run("--eval %s/cnn_torch.safetensors " CNN_JOB, dir), 0);
    assert_non_null(strstr(out, "test loss"));
    assert_non_null(strstr(out, "accuracy"));
    /* a weights file needs its job; a checkpoint folder brings its own */
    assert_int_not_equal(run("--eval %s/cnn_torch.safetensors", dir), 0);
    assert_non_null(strstr(out, "give the job"));
}

static void test_generate_hf_names(void **state) {
    (void)state;
    assert_int_equal(run("--generate %s/gpt_hf.safetensors " GPT_JOB
                         " --set model.init_map=examples/maps/gpt2_hf.json --prompt 'The ' --tokens 12 --seed 1",
                         dir),
                     0);
    assert_int_equal(strncmp(out, "The ", 4), 0);
    assert_int_equal(strlen(out), 4 + 12 + 1);
    /* without the map the names are refused, naming one */
    assert_int_not_equal(run("--generate %s/gpt_hf.safetensors " GPT_JOB " --prompt 'The '", dir), 0);
    assert_non_null(strstr(out, "'transformer."));
}

static void test_train_from_weights(void **state) {
    (void)state;
    char cmd[256];
    snprintf(cmd, sizeof cmd, "cp %s/cnn_torch.safetensors %s/init.safetensors", dir, dir);
    assert_int_equal(system(cmd), 0);
#define FINE_TUNE CNN_JOB " --set model.init_from=%s/init.safetensors --set train.epochs=0 --set schedule.warmup_steps=0 " \
                          "--set train.eval_batches=1 --run-dir %s/run"
    assert_int_equal(run(FINE_TUNE " --set steps=2", dir, dir), 0);
    /* its checkpoints hold the weights: the file it started from may go */
    snprintf(cmd, sizeof cmd, "%s/init.safetensors", dir);
    assert_int_equal(remove(cmd), 0);
    assert_int_equal(run("--eval %s/run/checkpoints/step-2", dir), 0);
    assert_non_null(strstr(out, "step 2, test loss"));
    assert_int_equal(run("--consolidate %s/run/checkpoints/step-2 --out %s/whole", dir, dir), 0);
    assert_int_equal(run(FINE_TUNE " --set steps=3 --resume", dir, dir), 0);
    assert_non_null(strstr(out, "resumed at step 2"));
#undef FINE_TUNE
    /* a job whose model differs from the file: the tensor and both shapes */
    assert_int_not_equal(run(CNN_JOB " --set model.ch1=6 --set model.init_from=%s/cnn_torch.safetensors "
                                     "--set train.epochs=0 --set steps=2 --set schedule.warmup_steps=0 --run-dir %s/run2",
                             dir, dir),
                         0);
    assert_non_null(strstr(out, "'conv1.weight'"));
    assert_non_null(strstr(out, "[4,1,5,5]"));
    assert_non_null(strstr(out, "[6,1,5,5]"));
    assert_int_not_equal(run(CNN_JOB " --set model.init_map=x.json --set steps=1", dir), 0);
    assert_non_null(strstr(out, "model.init_map"));
}

/* The loss values of out's lines, in order, into buf. */
static void losses(char *buf, size_t n) {
    size_t k = 0;
    buf[0] = '\0';
    for (const char *p = out; (p = strstr(p, "loss ")); p += 5) {
        int len = (int)strcspn(p + 5, " ,\n");
        k += (size_t)snprintf(buf + k, n - k, "%.*s ", len, p + 5);
        assert_true(k < n);
    }
}

/* A GPT that torch saved in half precision, under GPT-2's names, starts a
 * training job (model.init_from, through the shipped map) that goes step
 * by step as one from the same values saved as F32: the same losses. Before,
 * the F16 file was refused ("unsupported dtype 'F16'"). */
static void test_train_from_f16(void **state) {
    (void)state;
    char f16[1024], f32[1024];
#define F16_JOB                                                                                                  \
    GPT_JOB " --set model.init_map=examples/maps/gpt2_hf.json --set model.init_from=%s/%s.safetensors "         \
            "--set steps=3 --set train.log_every=1 --set schedule.warmup_steps=0 --set train.eval_batches=1 "       \
            "--run-dir %s/%s"
    assert_int_equal(run(F16_JOB, dir, "gpt_hf_f16", dir, "f16"), 0);
    losses(f16, sizeof f16);
    assert_int_equal(run(F16_JOB, dir, "gpt_hf_f16_f32", dir, "f32"), 0);
    losses(f32, sizeof f32);
#undef F16_JOB
    printf("losses from F16: %s\nlosses from F32: %s\n", f16, f32);
    assert_non_null(strchr(f16, '.'));
    assert_string_equal(f16, f32);
}

/* A pipeline's stages each load their part of the file; a tensor of it
 * that belongs to no stage (a file of 2 blocks, a job of 1) is refused as
 * a local run refuses it. Before, the stages ignored it. */
static void test_pipeline_from_weights(void **state) {
    (void)state;
#define PIPE_JOB                                                                                                 \
    GPT_JOB " --set model.init_map=examples/maps/gpt2_hf.json --set model.init_from=%s/gpt_hf.safetensors "     \
            "--set steps=2 --set schedule.warmup_steps=0 --set train.eval_batches=1 "                              \
            "--set parallel.strategy='\"pipeline\"' --set parallel.stages=2 --run-dir %s/%s"
    assert_int_equal(run(PIPE_JOB, dir, dir, "pipe-2"), 0);
    assert_int_not_equal(run(PIPE_JOB " --set model.n_layer=1", dir, dir, "pipe-1"), 0);
    assert_non_null(strstr(out, "'transformer.h.1.ln_1.weight' (mapped to 'blocks.1.ln1.weight') is not a parameter"));
#undef PIPE_JOB
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_eval_weights),
        cmocka_unit_test(test_generate_hf_names),
        cmocka_unit_test(test_train_from_weights),
        cmocka_unit_test(test_train_from_f16),
        cmocka_unit_test(test_pipeline_from_weights),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
