/* model_open.h - a trained model for inference or export, from a
 * checkpoint folder of any strategy or from a weights file with its job.
 *
 * A checkpoint folder brings its own job; its weights are read the way
 * its strategy wrote them (ts_strategy_read_model: whole, FSDP shards or
 * a pipeline's parts), not from the job's model.init_from. A weights file
 * starts the model of the job file given with it (ts_job_for_weights).
 */
#ifndef TS_WORKER_MODEL_OPEN_H
#define TS_WORKER_MODEL_OPEN_H

#include "kernels/nn/models.h"
#include "proto/job.h"

/* The whole model of path (a checkpoint folder, or a weights file with
 * the job file job_path and nsets overrides) in eval mode; the job goes to
 * *job, its spec to *spec. NULL with the reason on error. */
ts_model *ts_worker_open_model(const char *path, const char *job_path, const char *const *sets, int nsets,
                               ts_job *job, ts_model_spec *spec);

#endif
