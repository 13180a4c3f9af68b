/* pipeline_plan.c - the stage cut of a pipeline: given, or profiled on rank
 * 0 and shared through the scheduler. */
#include "worker/pipeline_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/autograd.h"
#include "kernels/clock.h"
#include "sharding/plan.h"

enum { PROFILE_RUNS = 3 };

/* Forward + backward of unit model m on x (a leaf; requires grad unless it
 * holds token ids): the best time of PROFILE_RUNS in *ms and the output,
 * detached, in *y (new reference). */
static ts_status time_unit(ts_model *m, ts_tensor *x, double *ms, ts_tensor **y) {
    *ms = 1e300;
    *y = NULL;
    ts_status st = TS_OK;
    for (int r = 0; !st && r < PROFILE_RUNS; r++) {
        double t0 = ts_clock_ms();
        ts_tensor *out = ts_model_forward(m, x), *g = out ? ts_tensor_ones(out->dtype, out->ndim, out->shape) : NULL;
        st = g ? ts_backward(out, g) : ts_last_status();
        double t = ts_clock_ms() - t0;
        if (t < *ms) *ms = t;
        if (!st && r == PROFILE_RUNS - 1 && !(*y = ts_tensor_copy_as(out, out->dtype))) st = ts_last_status();
        ts_tensor_release(out);
        ts_tensor_release(g);
        ts_model_zero_grad(m);
        ts_zero_grad(x);
    }
    return st;
}

ts_status ts_pipeline_profile(const ts_model_spec *spec, int64_t b, int units, double *costs) {
    int64_t shape[TS_MAX_DIMS];
    ts_dtype dt;
    int nd = ts_model_input_shape(spec, b, shape, &dt);
    ts_tensor *x = ts_tensor_zeros(dt, nd, shape);
    ts_status st = x ? TS_OK : ts_last_status();
    for (int u = 0; !st && u < units; u++) {
        if (dt != TS_I64) st = ts_set_requires_grad(x, true);
        ts_model *m = st ? NULL : ts_model_build(spec, u, u + 1, ts_key_from_seed(1), TS_F32);
        ts_tensor *y = NULL;
        if (!st && !m) st = ts_last_status();
        if (!st) st = time_unit(m, x, &costs[u], &y);
        ts_model_free(m);
        ts_tensor_release(x);
        x = y;
        dt = TS_F32;
    }
    ts_tensor_release(x);
    return st;
}

/* The cut from parallel.pipeline_stages (units per piece; the job's
 * validation made them add up to the model's units). */
static void given_cut(const ts_job_parallel *p, int pieces, int *cut) {
    cut[0] = 0;
    for (int s = 0; s < pieces; s++) cut[s + 1] = cut[s] + (int)p->pipeline_stages.v[s];
}

/* Profiles, cuts and prints the costs. */
static ts_status profiled_cut(const ts_job *job, const ts_model_spec *spec, int pieces, int units, int *cut) {
    const ts_job_parallel *p = &job->parallel;
    double *costs = calloc((size_t)units, sizeof *costs);
    if (!costs) return ts_error(TS_ERR_MEMORY, "pipeline: out of memory for %d unit costs", units);
    ts_status st = ts_pipeline_profile(spec, job->train.batch_size / p->micro_batches, units, costs);
    if (!st) st = ts_plan_stages(costs, units, pieces, cut);
    if (!st) {
        cut[pieces] = units;
        printf("pipeline: profiled forward + backward ms per unit:");
        for (int u = 0; u < units; u++) printf(" %.2f", costs[u]);
        printf("\n");
    }
    free(costs);
    return st;
}

ts_status ts_pipeline_check_cut(const int *cut, int pieces, int units) {
    for (int s = 0; s <= pieces; s++)
        if ((s == 0 && cut[s] != 0) || (s > 0 && cut[s] <= cut[s - 1]) || (s == pieces && cut[s] != units))
            return ts_error(TS_ERR_FORMAT, "pipeline: the cut (piece %d starts at unit %d) is not one of %d "
                            "units into %d pieces", s, cut[s], units, pieces);
    return TS_OK;
}

ts_status ts_pipeline_plan(const ts_job *job, const ts_model_spec *spec, int *cut) {
    const ts_job_parallel *p = &job->parallel;
    int units = ts_model_units(spec);
    if (units < 0) return ts_last_status();
    int pieces = p->stages * p->chunks_per_stage; /* no more than the units: the job's validation */
    ts_status st = TS_OK;
    if (p->pipeline_stages.n) given_cut(p, pieces, cut);
    else st = profiled_cut(job, spec, pieces, units, cut);
    return st ? st : ts_pipeline_check_cut(cut, pieces, units);
}
