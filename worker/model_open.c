/* model_open.c - a trained whole model from a checkpoint or weights file. */
#include "worker/model_open.h"

#include "kernels/io/checkpoint.h"
#include "proto/job_model.h"
#include "worker/strategy.h"

ts_model *ts_worker_open_model(const char *path, const char *job_path, const char *const *sets, int nsets,
                               ts_job *job, ts_model_spec *spec) {
    bool is_checkpoint;
    ts_status st = ts_job_for_weights(path, job_path, sets, nsets, job, &is_checkpoint);
    if (!st && is_checkpoint) ts_job_forget_init(job); /* the checkpoint's weights replace the first ones */
    if (!st) st = ts_job_model_spec(job, spec);
    ts_model *m = st ? NULL : ts_job_model_build(job, spec, NULL);
    if (m && is_checkpoint) {
        ts_checkpoint *ck = ts_checkpoint_open(path);
        st = ck ? ts_strategy_read_model(ck, m) : ts_last_status();
        ts_checkpoint_close(ck);
        if (!st) st = ts_model_sync_compute(m);
        if (st) {
            ts_model_free(m);
            m = NULL;
        }
    }
    if (m) ts_model_train(m, false);
    return m;
}
