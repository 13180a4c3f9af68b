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

/* Builds the units of runs (NULL: all) of spec, job's model, from the
 * job's seed, then, when model.init_from names a weights file, loads those
 * weights through model.init_map (ts_weights_load; strict for the whole
 * model, a part takes its own parameters from the file, and every other
 * tensor there must name a parameter of another part). */
ts_model *ts_job_model_build(const ts_job *job, const ts_model_spec *spec, const ts_unit_runs *runs);

/* Drops the job's model.init_from and model.init_map: its model's weights
 * come from a checkpoint instead (which holds them whole, so the file the
 * run started from need not exist any more). */
void ts_job_forget_init(ts_job *job);

/* The job of the weights at path: a checkpoint folder's own saved job
 * (*is_checkpoint true; job_path must be NULL and nsets 0), or the job
 * file job_path whose model starts from the weights file path
 * (model.init_from = path, applied before the nsets overrides, so they may
 * name model.init_map). */
ts_status ts_job_for_weights(const char *path, const char *job_path, const char *const *sets, int nsets, ts_job *job,
                             bool *is_checkpoint);

/* The optimizer config of the job's "optimizer" section, checked. */
ts_status ts_job_optim_config(const ts_job *job, ts_optim_config *cfg);

/* The weight-decay groups of model m: no decay on biases and LayerNorm
 * parameters (names "*.bias", "*ln*") nor on vectors. Free with
 * ts_optim_groups_free. */
ts_status ts_job_optim_groups(const ts_model *m, ts_optim_groups *out);

#endif
