/* job_model.h - a job's model and optimizer in the kernel library's terms.
 *
 * Every process that holds parameters reads them from the job the same way:
 * the trainer (the whole model) and a parameter-server shard (its key range)
 * build the same model spec, the same optimizer config and the same
 * weight-decay groups, so their updates agree bit for bit.
 */
#ifndef TS_PROTO_JOB_MODEL_H
#define TS_PROTO_JOB_MODEL_H

#include "kernels/nn/models.h"
#include "kernels/optim/optim.h"
#include "proto/job.h"

/* The model spec the job's "model" and "data" sections describe; the error
 * names the field when they do not fit together (mlp needs fashion_mnist). */
ts_status ts_job_model_spec(const ts_job *job, ts_model_spec *spec);

/* The optimizer config of the job's "optimizer" section, checked. */
ts_status ts_job_optim_config(const ts_job *job, ts_optim_config *cfg);

/* The weight-decay groups of model m: no decay on biases and LayerNorm
 * parameters (names "*.bias", "*ln*") nor on vectors. Free with
 * ts_optim_groups_free. */
ts_status ts_job_optim_groups(const ts_model *m, ts_optim_groups *out);

#endif
