/* pipeline_plan.h - where a pipeline cuts the model: the first unit of
 * each piece (P pieces, one per stage, or P x V with V chunks per stage:
 * stage s holds pieces s, s + P, ...).
 *
 * Given by parallel.pipeline_stages (units per piece), or measured: forward
 * + backward of every unit alone on one micro-batch on this machine (a
 * short profiling pass, one unit built at a time, so a model too large for
 * one process is profiled too), the costs cut with ts_plan_stages. One
 * process plans and hands the cut to the others (strategy_pipeline.c), so
 * that every stage builds on the same cut.
 */
#ifndef TS_WORKER_PIPELINE_PLAN_H
#define TS_WORKER_PIPELINE_PLAN_H

#include "kernels/nn/models.h"
#include "proto/job.h"

/* Fills cut[0 .. pieces] (cut[k] the first unit of piece k, cut[pieces]
 * the number of units) for job's model spec, profiling when the job gives
 * no cut (and printing the costs). */
ts_status ts_pipeline_plan(const ts_job *job, const ts_model_spec *spec, int *cut);

/* Checks that cut[0 .. pieces] cuts units units into pieces non-empty
 * runs (a cut received from another process). */
ts_status ts_pipeline_check_cut(const int *cut, int pieces, int units);

/* Times forward + backward of each of units units of spec on a batch of b
 * samples into costs (ms, the best of a few runs). */
ts_status ts_pipeline_profile(const ts_model_spec *spec, int64_t b, int units, double *costs);

#endif
