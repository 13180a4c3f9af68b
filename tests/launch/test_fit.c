/* test_fit.c - the memory check before a model is built: a pipeline stage
 * is judged by what it holds (about 1/P of the model and its micro-batches
 * in flight), so a model too big for one process fits as stages; the data
 * set counts too (Fashion-MNIST's images as f32 dwarf a small MLP; a text
 * corpus by its bytes). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/optim/optim.h"
#include "proto/job_model.h"
#include "worker/fit.h"

/* The whole model's training estimate of job, in bytes. */
static double whole_bytes(const ts_job *job) {
    ts_model_spec spec;
    ts_optim_config oc;
    ts_model_memory e;
    assert_int_equal(ts_job_model_spec(job, &spec), TS_OK);
    assert_int_equal(ts_job_optim_config(job, &oc), TS_OK);
    assert_int_equal(ts_model_estimate(&spec, job->train.batch_size, ts_optim_state_slots(&oc), false, &e), TS_OK);
    return e.total_bytes;
}

static void test_pipeline_stage_share(void **state) {
    (void)state;
    const char *text = "{\"model\": {\"arch\": \"gpt\", \"n_layer\": 8, \"n_embd\": 256, \"n_head\": 4}, "
                       "\"data\": {\"kind\": \"text\"}, \"train\": {\"batch_size\": 64}}";
    const char *pipe[] = {"parallel.strategy=pipeline", "parallel.stages=4", "parallel.micro_batches=8"};
    ts_job local, stages;
    assert_int_equal(ts_job_parse(text, NULL, 0, &local), TS_OK);
    assert_int_equal(ts_job_parse(text, pipe, 3, &stages), TS_OK);
    double whole = whole_bytes(&local);
    uint64_t room = (uint64_t)(0.4 * whole); /* less than half the model */
    assert_int_equal(ts_fit_check(&local, 1, room, "test"), TS_ERR_MEMORY);
    assert_non_null(strstr(ts_last_error(), "needs about"));
    assert_int_equal(ts_fit_check(&stages, 1, room, "test"), TS_OK);
    /* a quarter of the model is still too much in a tenth of it */
    assert_int_equal(ts_fit_check(&stages, 1, (uint64_t)(0.1 * whole), "test"), TS_ERR_MEMORY);
}

/* The workers of a cluster on one machine share its memory: a model that
 * fits one of them alone does not fit two (once each checked its own
 * share only, and together they were killed by the OOM killer). */
static void test_workers_share_the_machine(void **state) {
    (void)state;
    const char *text = "{\"model\": {\"arch\": \"gpt\", \"n_layer\": 4, \"n_embd\": 128, \"n_head\": 4}, "
                       "\"data\": {\"kind\": \"text\"}, \"train\": {\"batch_size\": 16}}";
    ts_job job;
    assert_int_equal(ts_job_parse(text, NULL, 0, &job), TS_OK);
    uint64_t lo = 0, hi = (uint64_t)1 << 40; /* the least room one worker fits in */
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        *(ts_fit_check(&job, 1, mid, "test") == TS_OK ? &hi : &lo) = mid;
    }
    uint64_t room = hi + hi / 2;
    assert_int_equal(ts_fit_check(&job, 1, room, "test"), TS_OK);
    assert_int_equal(ts_fit_check(&job, 2, 2 * hi, "test"), TS_OK);
    assert_int_equal(ts_fit_check(&job, 2, room, "test"), TS_ERR_MEMORY);
    const char *e = ts_last_error();
    if (!strstr(e, "in each of its 2 workers on this machine") || !strstr(e, "run fewer workers here"))
        fail_msg("the refusal does not say the workers share the machine: %s", e);
}

/* Writes dir/name, an IDX file of n zero bytes of dims n (labels) or
 * n x 28 x 28 (images). */
static void write_idx(const char *dir, const char *name, uint32_t n, bool images) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    int ndim = images ? 3 : 1;
    uint32_t dims[3] = {n, 28, 28};
    unsigned char head[16] = {0, 0, 0x08, (unsigned char)ndim};
    for (int i = 0; i < ndim; i++)
        for (int b = 0; b < 4; b++) head[4 + 4 * i + b] = (unsigned char)(dims[i] >> (24 - 8 * b));
    assert_int_equal(fwrite(head, 1, 4 + 4 * (size_t)ndim, f), 4 + 4 * (size_t)ndim);
    for (uint32_t i = 0; i < n * (images ? 784 : 1); i++) fputc(0, f);
    assert_int_equal(fclose(f), 0);
}

/* The job of doc with data.path dir: its model alone is under 1 MiB, but
 * with its data set it does not fit in 4 MiB (the message says data_set),
 * while it fits in room; then removes dir. */
static void expect_data_set(const char *dir, const char *doc, const char *data_set, uint64_t room) {
    char set[300], cmd[300];
    snprintf(set, sizeof set, "data.path=%s", dir);
    const char *sets[] = {set};
    ts_job job;
    assert_int_equal(ts_job_parse(doc, sets, 1, &job), TS_OK);
    assert_true(whole_bytes(&job) < 1 << 20);
    assert_int_equal(ts_fit_check(&job, 1, 4 << 20, "test"), TS_ERR_MEMORY);
    if (!strstr(ts_last_error(), data_set)) fail_msg("expected \"%s\" in: %s", data_set, ts_last_error());
    assert_int_equal(ts_fit_check(&job, 1, room, "test"), TS_OK);
    snprintf(cmd, sizeof cmd, "rm -r %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* 2000 + 500 images of 28 x 28 take about 9 MiB as f32 (and the bytes they
 * are read from), a 784-16-10 MLP at batch 8 a few hundred KiB: 4 MiB is
 * too little, which the model alone would not show. */
static void test_data_set_counts(void **state) {
    (void)state;
    char dir[] = "/tmp/tessera-fit-XXXXXX";
    assert_non_null(mkdtemp(dir));
    write_idx(dir, "train-images-idx3-ubyte", 2000, true);
    write_idx(dir, "train-labels-idx1-ubyte", 2000, false);
    write_idx(dir, "t10k-images-idx3-ubyte", 500, true);
    write_idx(dir, "t10k-labels-idx1-ubyte", 500, false);
    expect_data_set(dir, "{\"model\": {\"arch\": \"mlp\", \"hidden\": [16]}, \"train\": {\"batch_size\": 8}}",
                    "data set 9.4 MiB", 16 << 20);
}

/* Writes n bytes of 'a' to dir/name. */
static void write_bytes(const char *dir, const char *name, size_t n) {
    char path[300];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    for (size_t i = 0; i < n; i++) fputc('a', f);
    assert_int_equal(fclose(f), 0);
}

/* A text corpus counts by its bytes, as its loading reads them (a fortune
 * index file "*.dat" is skipped): 6 MiB of text beside a GPT of a few KiB
 * do not fit in 4 MiB. */
static void test_text_corpus_counts(void **state) {
    (void)state;
    char dir[] = "/tmp/tessera-fit-XXXXXX";
    assert_non_null(mkdtemp(dir));
    write_bytes(dir, "a.txt", 4 << 20);
    write_bytes(dir, "b.txt", 2 << 20);
    write_bytes(dir, "b.dat", 8 << 20);
    expect_data_set(dir, "{\"model\": {\"arch\": \"gpt\", \"n_layer\": 1, \"n_head\": 1, \"n_embd\": 8, "
                    "\"block_size\": 8}, \"data\": {\"kind\": \"text\"}, \"train\": {\"batch_size\": 2}}",
                    "data set 6.0 MiB", 8 << 20);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pipeline_stage_share),
        cmocka_unit_test(test_workers_share_the_machine),
        cmocka_unit_test(test_data_set_counts),
        cmocka_unit_test(test_text_corpus_counts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
