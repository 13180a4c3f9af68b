/* test_job.c - job JSON: defaults, overrides, strict errors naming fields. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "proto/job.h"

/* Asserts that parsing text with the overrides fails with a message
 * containing want. */
static void expect_error(const char *text, const char *const *sets, int nsets,
                         const char *want) {
    ts_job job;
    ts_status st = ts_job_parse(text, sets, nsets, &job);
    assert_int_not_equal(st, TS_OK);
    if (!strstr(ts_last_error(), want)) {
        fail_msg("error \"%s\" does not contain \"%s\"", ts_last_error(), want);
    }
}

static void test_defaults(void **state) {
    (void)state;
    ts_job job;
    assert_int_equal(ts_job_parse("{}", NULL, 0, &job), TS_OK);
    assert_string_equal(job.name, "job");
    assert_int_equal(job.steps, 10);
    assert_int_equal(job.parallel.strategy, TS_STRATEGY_LOCAL);
    assert_int_equal(job.parallel.workers, 1);
    assert_int_equal(job.parallel.min_workers, 1);
    assert_int_equal(job.parallel.max_workers, 1);
    assert_string_equal(job.parallel.bind, "127.0.0.1");
    assert_string_equal(job.parallel.key_file, "");
    assert_int_equal(job.parallel.join_timeout_ms, 60000);
    assert_int_equal(job.standin.step_ms, 0);
    /* bounded staleness 0 is sync */
    assert_int_equal(ts_job_parse("{\"parallel\": {\"consistency\": \"bounded\", \"staleness\": 0}}", NULL, 0, &job),
                     TS_OK);
    assert_int_equal(job.parallel.consistency, TS_CONSISTENCY_SYNC);
    assert_int_equal(ts_job_parse("{\"parallel\": {\"consistency\": \"bounded\", \"staleness\": 1}}", NULL, 0, &job),
                     TS_OK);
    assert_int_equal(job.parallel.consistency, TS_CONSISTENCY_BOUNDED);
}

static void test_full_section(void **state) {
    (void)state;
    const char *text =
        "{\"name\": \"demo-1\", \"seed\": 7, \"steps\": 30, \"parallel\": {"
        "\"strategy\": \"standin\", \"workers\": 4, \"servers\": 2,"
        "\"min_workers\": 3, \"max_workers\": 6, \"max_restarts\": 1,"
        "\"heartbeat_ms\": 100, \"heartbeat_timeout_ms\": 1000,"
        "\"barrier_timeout_ms\": 2000, \"bind\": \"0.0.0.0\","
        "\"key_file\": \"/tmp/k\"}, \"standin\": {\"step_ms\": 20}}";
    ts_job job;
    assert_int_equal(ts_job_parse(text, NULL, 0, &job), TS_OK);
    assert_string_equal(job.name, "demo-1");
    assert_int_equal(job.seed, 7);
    assert_int_equal(job.steps, 30);
    assert_int_equal(job.parallel.strategy, TS_STRATEGY_STANDIN);
    assert_int_equal(job.parallel.workers, 4);
    assert_int_equal(job.parallel.servers, 2);
    assert_int_equal(job.parallel.min_workers, 3);
    assert_int_equal(job.parallel.max_workers, 6);
    assert_int_equal(job.parallel.max_restarts, 1);
    assert_int_equal(job.parallel.heartbeat_ms, 100);
    assert_int_equal(job.parallel.heartbeat_timeout_ms, 1000);
    assert_int_equal(job.parallel.barrier_timeout_ms, 2000);
    assert_string_equal(job.parallel.bind, "0.0.0.0");
    assert_string_equal(job.parallel.key_file, "/tmp/k");
    assert_string_equal(ts_job_strategy_name(job.parallel.strategy), "standin");
    assert_int_equal(job.standin.step_ms, 20);
}

static void test_overrides(void **state) {
    (void)state;
    const char *sets[] = {"parallel.workers=3", "name=from-cli",
                          "parallel.bind=10.0.0.5", "steps=5", "steps=6",
                          "parallel.strategy=standin"};
    ts_job job;
    assert_int_equal(ts_job_parse("{\"parallel\": {\"workers\": 8}}", sets, 6,
                                  &job), TS_OK);
    assert_int_equal(job.parallel.workers, 3);
    assert_string_equal(job.name, "from-cli"); /* not JSON -> string */
    assert_string_equal(job.parallel.bind, "10.0.0.5");
    assert_int_equal(job.steps, 6); /* the later override wins */
    assert_int_equal(job.parallel.strategy, TS_STRATEGY_STANDIN);

    /* an override of steps on a job of epochs trains those steps, unless
     * the epochs are overridden too; steps in the document do not drop them */
    const char *by_epochs = "{\"steps\": 50, \"train\": {\"epochs\": 8}}";
    const char *steps[] = {"steps=7", "train.epochs=2", "train={\"epochs\": 3}"};
    assert_int_equal(ts_job_parse(by_epochs, NULL, 0, &job), TS_OK);
    assert_int_equal(job.train.epochs, 8);
    assert_int_equal(ts_job_parse(by_epochs, steps, 1, &job), TS_OK);
    assert_int_equal(job.steps, 7);
    assert_int_equal(job.train.epochs, 0);
    assert_int_equal(ts_job_parse(by_epochs, steps, 2, &job), TS_OK);
    assert_int_equal(job.train.epochs, 2);
    const char *whole[] = {steps[0], steps[2]};
    assert_int_equal(ts_job_parse(by_epochs, whole, 2, &job), TS_OK);
    assert_int_equal(job.train.epochs, 3);

    /* a quoted JSON string stays a string, a bare number is an integer */
    const char *quoted[] = {"parallel.workers=\"3\""};
    expect_error("{}", quoted, 1, "parallel.workers: expected integer, got string");
}

static void test_errors_name_the_field(void **state) {
    (void)state;
    expect_error("{\"parallel\": {\"workers\": \"4\"}}", NULL, 0,
                 "parallel.workers: expected integer, got string");
    expect_error("{\"parallel\": {\"wrkers\": 4}}", NULL, 0,
                 "parallel.wrkers: unknown field");
    expect_error("{\"modle\": {}}", NULL, 0, "modle: unknown field");
    expect_error("{\"parallel\": 3}", NULL, 0,
                 "parallel: expected object, got integer");
    expect_error("{\"steps\": 2.5}", NULL, 0, "steps: expected integer, got real");
    expect_error("{\"parallel\": {\"workers\": 0}}", NULL, 0,
                 "parallel.workers: 0 out of range");
    expect_error("{\"parallel\": {\"strategy\": \"mpi\"}}", NULL, 0,
                 "parallel.strategy: \"mpi\" is not one of: local, standin");
    expect_error("{\"name\": \"a b\"}", NULL, 0, "name: \"a b\" has a character");
    expect_error("{\"name\": \"\"}", NULL, 0, "name: must not be empty");
    expect_error("{\"parallel\": {\"bind\": true}}", NULL, 0,
                 "parallel.bind: expected string, got boolean");
    expect_error("{\"parallel\": {\"workers\": 2, \"min_workers\": 3}}", NULL, 0,
                 "parallel.min_workers: 3 exceeds parallel.workers (2)");
    expect_error("{\"parallel\": {\"workers\": 4, \"max_workers\": 3}}", NULL, 0,
                 "parallel.max_workers: 3 is below parallel.workers (4)");
    expect_error("{\"parallel\": {\"heartbeat_ms\": 500, "
                 "\"heartbeat_timeout_ms\": 400}}", NULL, 0,
                 "parallel.heartbeat_timeout_ms: 400 must exceed");
    expect_error("{\"steps\": 100, \"schedule\": {\"kind\": \"cosine\", \"warmup_steps\": 100}}", NULL, 0,
                 "schedule.warmup_steps: 100 must be below steps (100)");
    expect_error("{\"schedule\": {\"kind\": \"cosine\", \"min_lr\": 0.01}}", NULL, 0,
                 "schedule.min_lr: 0.01 exceeds optimizer.lr (0.001)");
    expect_error("{\"parallel\": {\"strategy\": \"pipeline\", \"servers\": 1}}", NULL, 0,
                 "parallel.servers: 1, but strategy \"pipeline\" has no parameter servers (set it to 0)");
    expect_error("{\"parallel\": {\"bucket_mb\": 0}}", NULL, 0,
                 "parallel.bucket_mb: 0 out of range [0.0001, 4096]");
    expect_error("{\"optimizer\": {\"momentum\": 1.5}}", NULL, 0, "optimizer.momentum: 1.5 out of range [0, 1]");
    expect_error("[1, 2]", NULL, 0, "expected a JSON object, got array");
    expect_error("{\"steps\": ", NULL, 0, "JSON error at line 1");
}

/* parallel.placement: node indices of a virtual cluster, empty by default. */
static void test_placement(void **state) {
    (void)state;
    ts_job job;
    assert_int_equal(ts_job_parse("{}", NULL, 0, &job), TS_OK);
    assert_int_equal(job.parallel.placement.n, 0);
    const char *sets[] = {"parallel.placement=[0, 3, 255]"};
    assert_int_equal(ts_job_parse("{}", sets, 1, &job), TS_OK);
    assert_int_equal(job.parallel.placement.n, 3);
    assert_int_equal(job.parallel.placement.v[1], 3);
    assert_int_equal(job.parallel.placement.v[2], 255);
    expect_error("{\"parallel\": {\"placement\": [0, 256]}}", NULL, 0,
                 "parallel.placement[1]: 256 out of range [0, 255]");
    expect_error("{\"parallel\": {\"placement\": [\"n1\"]}}", NULL, 0,
                 "parallel.placement[0]: expected integer, got string");
    expect_error("{\"parallel\": {\"placement\": 1}}", NULL, 0,
                 "parallel.placement: expected array, got integer");
}

/* strategy "pipeline": its workers are stages x replicas, the batch splits
 * into the micro-batches, the listed cut has one entry per piece (stage x
 * chunk) and holds the model's units, a piece has one unit at least,
 * interleaving wants micro-batches in multiples of the stages. */
static void test_pipeline(void **state) {
    (void)state;
    ts_job job;
    const char *ok = "{\"parallel\": {\"strategy\": \"pipeline\", \"stages\": 3, \"data_parallel\": 2, "
                     "\"micro_batches\": 4, \"schedule\": \"gpipe\"}, \"train\": {\"batch_size\": 32}}";
    assert_int_equal(ts_job_parse(ok, NULL, 0, &job), TS_OK);
    assert_int_equal(job.parallel.strategy, TS_STRATEGY_PIPELINE);
    assert_int_equal(job.parallel.workers, 6);
    assert_int_equal(job.parallel.min_workers, 6);
    assert_int_equal(job.parallel.max_workers, 6);
    assert_int_equal(job.parallel.schedule, TS_PIPE_GPIPE);
    assert_int_equal(ts_job_parse("{}", NULL, 0, &job), TS_OK);
    assert_int_equal(job.parallel.schedule, TS_PIPE_1F1B);
    expect_error("{\"parallel\": {\"strategy\": \"pipeline\", \"stages\": 2, \"workers\": 3}}", NULL, 0,
                 "parallel.workers: 3, but a pipeline of 2 stages x 1 replicas (parallel.data_parallel) has 2 workers");
    expect_error("{\"parallel\": {\"strategy\": \"pipeline\", \"stages\": 1}}", NULL, 0,
                 "parallel.stages: strategy \"pipeline\" needs at least 2 stages, got 1");
    expect_error("{\"parallel\": {\"strategy\": \"pipeline\", \"micro_batches\": 3}, \"train\": {\"batch_size\": 32}}",
                 NULL, 0, "parallel.micro_batches: train.batch_size 32 does not split into 3 micro-batches");
    expect_error("{\"parallel\": {\"strategy\": \"pipeline\", \"stages\": 2, \"pipeline_stages\": [1, 2, 3]}}", NULL, 0,
                 "parallel.pipeline_stages: 3 pieces listed but parallel.stages 2 x parallel.chunks_per_stage 1 is 2");
    /* interleaved: a piece per stage and chunk, M a multiple of P */
    const char *interleaved = "{\"parallel\": {\"strategy\": \"pipeline\", \"stages\": 2, \"chunks_per_stage\": 2, "
                              "\"micro_batches\": 4, \"pipeline_stages\": [1, 2, 1, 1]}, \"train\": {\"batch_size\": 8}}";
    assert_int_equal(ts_job_parse(interleaved, NULL, 0, &job), TS_OK);
    assert_int_equal(job.parallel.chunks_per_stage, 2);
    assert_int_equal(job.parallel.workers, 2);
    expect_error("{\"parallel\": {\"strategy\": \"pipeline\", \"stages\": 2, \"chunks_per_stage\": 2, "
                 "\"pipeline_stages\": [8, 9]}}", NULL, 0,
                 "parallel.pipeline_stages: 2 pieces listed but parallel.stages 2 x parallel.chunks_per_stage 2 is 4");
    expect_error("{\"parallel\": {\"strategy\": \"pipeline\", \"stages\": 4, \"chunks_per_stage\": 2, "
                 "\"micro_batches\": 6}, \"train\": {\"batch_size\": 12}}", NULL, 0,
                 "parallel.micro_batches: 6; interleaving 2 chunks per stage needs a multiple of parallel.stages (4)");
    expect_error("{\"parallel\": {\"chunks_per_stage\": 0}}", NULL, 0, "parallel.chunks_per_stage");
    /* the pieces against the model's units (the default MLP's 5: three
     * layers and two activations; a GPT of 2 blocks has 4) */
    expect_error("{\"parallel\": {\"strategy\": \"pipeline\", \"stages\": 3, \"chunks_per_stage\": 2, "
                 "\"micro_batches\": 3}, \"train\": {\"batch_size\": 6}}", NULL, 0,
                 "parallel.stages: 3 stages x 2 chunks (parallel.chunks_per_stage) are 6 pieces, but the model has 5 "
                 "units");
    expect_error("{\"parallel\": {\"strategy\": \"pipeline\", \"stages\": 2, \"pipeline_stages\": [3, 3]}}", NULL,
                 0, "parallel.pipeline_stages: the pieces hold 6 units but the model has 5");
    expect_error("{\"model\": {\"arch\": \"gpt\", \"n_layer\": 2}, \"data\": {\"kind\": \"text\"}, "
                 "\"parallel\": {\"strategy\": \"pipeline\", \"stages\": 5}}", NULL, 0,
                 "parallel.stages: 5 stages x 1 chunks (parallel.chunks_per_stage) are 5 pieces, but the model has 4");
    assert_int_equal(ts_job_parse("{\"model\": {\"arch\": \"gpt\", \"n_layer\": 2}, \"data\": {\"kind\": "
                                  "\"text\"}, \"parallel\": {\"strategy\": \"pipeline\", \"stages\": 4}}",
                                  NULL, 0, &job),
                     TS_OK);
    expect_error("{\"parallel\": {\"strategy\": \"pipeline\"}, \"train\": {\"accum_steps\": 2}}", NULL, 0,
                 "train.accum_steps: 2; a pipeline accumulates its micro-batches");
    expect_error("{\"parallel\": {\"schedule\": \"zb\"}}", NULL, 0, "parallel.schedule");
}

/* A model on a GPU under a strategy whose buffers are in host memory is
 * refused at validation, naming the fields; ddp and ps take it. */
static void test_device_strategy(void **state) {
    (void)state;
    expect_error("{\"device\": \"cuda\", \"parallel\": {\"strategy\": \"fsdp\", \"workers\": 2}}", NULL, 0,
                 "device: \"cuda\" with parallel.strategy \"fsdp\" is not supported yet");
    expect_error("{\"device\": \"cuda\", \"parallel\": {\"strategy\": \"pipeline\"}}", NULL, 0,
                 "device: \"cuda\" with parallel.strategy \"pipeline\" is not supported yet");
    expect_error("{\"device\": \"cuda\", \"parallel\": {\"strategy\": \"ddp\", \"wire_dtype\": \"bf16\"}}", NULL, 0,
                 "parallel.wire_dtype: \"bf16\" with device \"cuda\" under strategy \"ddp\"");
    ts_job job;
    assert_int_equal(ts_job_parse("{\"device\": \"cuda\", \"parallel\": {\"strategy\": \"ddp\"}}", NULL, 0, &job), TS_OK);
    assert_int_equal(ts_job_parse("{\"device\": \"cuda\", \"parallel\": {\"strategy\": \"ps\", \"servers\": 1, "
                                  "\"wire_dtype\": \"bf16\"}}", NULL, 0, &job), TS_OK);
    assert_int_equal(ts_job_parse("{\"parallel\": {\"strategy\": \"fsdp\", \"wire_dtype\": \"bf16\"}}", NULL, 0, &job), TS_OK);
}

static void test_override_errors(void **state) {
    (void)state;
    const char *noeq[] = {"parallel.workers"};
    expect_error("{}", noeq, 1, "expected key.path=value");
    const char *empty_seg[] = {"parallel..workers=2"};
    expect_error("{}", empty_seg, 1, "empty path segment");
    const char *through_leaf[] = {"steps.x=2"};
    expect_error("{\"steps\": 3}", through_leaf, 1,
                 "steps is not a section (got integer)");
    expect_error("{}", through_leaf, 1, "steps: expected integer, got object");
    const char *unknown[] = {"parallel.nope=1"};
    expect_error("{}", unknown, 1, "parallel.nope: unknown field");
}

/* Numbers JSON cannot hold are "out of range" naming the field, not strings;
 * a whole number written as a real fits an integer field. */
static void test_override_numbers(void **state) {
    (void)state;
    const char *lr[] = {"optimizer.lr=1e999"};
    expect_error("{}", lr, 1, "optimizer.lr: 1e999 out of range");
    const char *steps[] = {"steps=1e20"};
    expect_error("{}", steps, 1, "steps: 1e+20 out of range [0, 9223372036854775807]");
    const char *big[] = {"steps=100000000000000000000"};
    expect_error("{}", big, 1, "steps: 1e+20 out of range [0, 9223372036854775807]");
    const char *edge[] = {"steps=9223372036854775808.0"};
    expect_error("{}", edge, 1, "out of range");
    const char *half[] = {"steps=2.5"};
    expect_error("{}", half, 1, "steps: expected integer, got real 2.5");
    ts_job job;
    const char *whole[] = {"steps=1e3", "data.path=1e999x"};
    assert_int_equal(ts_job_parse("{}", whole, 2, &job), TS_OK);
    assert_int_equal(job.steps, 1000);
    assert_string_equal(job.data.path, "1e999x"); /* not a number: a string */
}

static void test_load_file_and_round_trip(void **state) {
    (void)state;
    char path[] = "/tmp/test_job_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *text = "{\"name\": \"rt\", \"parallel\": {\"workers\": \"x\"}}";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);

    ts_job job;
    assert_int_not_equal(ts_job_load(path, NULL, 0, &job), TS_OK);
    assert_non_null(strstr(ts_last_error(), path)); /* names the file */
    assert_non_null(strstr(ts_last_error(), "parallel.workers"));

    const char *fix[] = {"parallel.workers=2", "parallel.strategy=standin"};
    assert_int_equal(ts_job_load(path, fix, 2, &job), TS_OK);
    unlink(path);

    /* the full document parses back to the same job */
    json_t *doc = ts_job_to_json(&job);
    assert_non_null(doc);
    char *dumped = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    ts_job again;
    assert_int_equal(ts_job_parse(dumped, NULL, 0, &again), TS_OK);
    free(dumped);
    assert_memory_equal(&job, &again, sizeof job);

    assert_int_not_equal(ts_job_load("/nonexistent/job.json", NULL, 0, &job), TS_OK);
    assert_non_null(strstr(ts_last_error(), "/nonexistent/job.json"));
}

static void test_node_args(void **state) {
    (void)state;
    char path[] = "/tmp/test_job_node_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *text = "{\"name\": \"n\", \"parallel\": {\"strategy\": \"standin\"}}";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);

    char *ok[] = {"w", "--scheduler", "tcp://127.0.0.1:5", "--key-file=/k",
                  "--job", path, "--set", "parallel.workers=3", "--rank=2", NULL};
    ts_job_node_args a;
    assert_int_equal(ts_job_node_args_parse(9, ok, true, &a), TS_OK);
    assert_string_equal(a.scheduler, "tcp://127.0.0.1:5");
    assert_string_equal(a.key_file, "/k");
    assert_int_equal(a.rank, 2);
    assert_int_equal(a.job.parallel.workers, 3);
    assert_string_equal(a.job.name, "n");

    char *unknown[] = {"w", "--schedular", "x", NULL};
    assert_int_not_equal(ts_job_node_args_parse(3, unknown, true, &a), TS_OK);
    assert_non_null(strstr(ts_last_error(), "unknown argument --schedular"));
    char *novalue[] = {"w", "--scheduler", NULL};
    assert_int_not_equal(ts_job_node_args_parse(2, novalue, true, &a), TS_OK);
    assert_non_null(strstr(ts_last_error(), "--scheduler needs a value"));
    char *badrank[] = {"w", "--rank", "-3", NULL};
    assert_int_not_equal(ts_job_node_args_parse(3, badrank, true, &a), TS_OK);
    assert_non_null(strstr(ts_last_error(), "--rank: \"-3\" is not a rank"));
    unsetenv("TESSERA_KEY_FILE");
    char *nokey[] = {"w", "--scheduler", "tcp://x:1", "--job", path, NULL};
    assert_int_not_equal(ts_job_node_args_parse(5, nokey, true, &a), TS_OK);
    assert_non_null(strstr(ts_last_error(), "--key-file PATH"));
    char *badset[] = {"w", "--scheduler", "a", "--key-file", "k", "--job", path,
                      "--set", "parallel.workers=x", NULL};
    assert_int_not_equal(ts_job_node_args_parse(9, badset, true, &a), TS_OK);
    assert_non_null(strstr(ts_last_error(), "parallel.workers: expected integer"));
    /* a node that trains alone: the job file alone, no scheduler */
    char *alone[] = {"w", path, "--run-dir", "/r", "--resume", NULL};
    assert_int_equal(ts_job_node_args_parse(5, alone, false, &a), TS_OK);
    assert_string_equal(a.scheduler, "");
    assert_string_equal(a.run_dir, "/r");
    assert_true(a.resume);
    assert_int_not_equal(ts_job_node_args_parse(5, alone, true, &a), TS_OK);
    assert_non_null(strstr(ts_last_error(), "--scheduler ADDR is required"));
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_full_section),
        cmocka_unit_test(test_overrides),
        cmocka_unit_test(test_errors_name_the_field),
        cmocka_unit_test(test_placement),
        cmocka_unit_test(test_pipeline),
        cmocka_unit_test(test_device_strategy),
        cmocka_unit_test(test_override_errors),
        cmocka_unit_test(test_override_numbers),
        cmocka_unit_test(test_load_file_and_round_trip),
        cmocka_unit_test(test_node_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
