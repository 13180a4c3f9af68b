/* test_fit.c - the memory check before a model is built: a pipeline stage
 * is judged by what it holds (about 1/P of the model and its micro-batches
 * in flight), so a model too big for one process fits as stages. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

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
    assert_int_equal(ts_fit_check(&local, room, "test"), TS_ERR_MEMORY);
    assert_non_null(strstr(ts_last_error(), "needs about"));
    assert_int_equal(ts_fit_check(&stages, room, "test"), TS_OK);
    /* a quarter of the model is still too much in a tenth of it */
    assert_int_equal(ts_fit_check(&stages, (uint64_t)(0.1 * whole), "test"), TS_ERR_MEMORY);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pipeline_stage_share),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
