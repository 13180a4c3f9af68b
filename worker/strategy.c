/* strategy.c - making a strategy by name, and what cluster strategies share:
 * following the scheduler's generations, voting on its STOP. */
#include "worker/strategy.h"
#include "worker/trainer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The strategies of this build, in the order of ts_job_strategy; cluster
 * ones run only in a job. */
static const struct {
    ts_strategy *(*make)(const ts_strategy_options *o);
    bool cluster;
} strategies[] = {
    [TS_STRATEGY_LOCAL] = {ts_strategy_local_new, false},
    [TS_STRATEGY_STANDIN] = {ts_strategy_standin_new, true},
    [TS_STRATEGY_PS] = {ts_strategy_ps_new, true},
    [TS_STRATEGY_DDP] = {ts_strategy_ddp_new, true},
    [TS_STRATEGY_PIPELINE] = {ts_strategy_pipeline_new, true},
    [TS_STRATEGY_FSDP] = {ts_strategy_fsdp_new, true},
};

enum { N_STRATEGIES = sizeof strategies / sizeof strategies[0] };

ts_strategy *ts_strategy_create(const ts_strategy_options *o) {
    ts_job_strategy k = o->job->parallel.strategy;
    const char *name = ts_job_strategy_name(k);
    if ((unsigned)k >= N_STRATEGIES || !strategies[k].make) {
        ts_error(TS_ERR_UNSUPPORTED, "parallel.strategy: \"%s\" is not built into this worker", name);
        return NULL;
    }
    if (strategies[k].cluster && !o->in_job) {
        ts_error(TS_ERR_VALUE, "strategy \"%s\" runs in a job's cluster: start it with tessera-run or join a "
                               "scheduler (--scheduler)", name);
        return NULL;
    }
    if (!strategies[k].cluster && o->in_job) {
        ts_error(TS_ERR_VALUE, "strategy \"%s\" trains in one process: run it without a scheduler", name);
        return NULL;
    }
    ts_strategy *s = strategies[k].make(o);
    if (s) s->in_job = o->in_job;
    return s;
}

void ts_strategy_free(ts_strategy *s) {
    if (s) s->ops->free(s);
}

ts_status ts_strategy_step_done(ts_strategy *s, int64_t step) {
    return step >= s->trainer->total_steps ? TS_OK : ts_member_step_done(s->member, step);
}

int ts_strategy_data_world(const ts_job *job) {
    switch (job->parallel.strategy) {
    case TS_STRATEGY_LOCAL:
    case TS_STRATEGY_STANDIN: return 1;
    case TS_STRATEGY_PIPELINE: return job->parallel.data_parallel;
    default: return job->parallel.workers;
    }
}

double ts_strategy_stop_vote(const ts_strategy *s) {
    return s->member && ts_member_stop_asked(s->member, NULL, 0) ? 1.0 : 0.0;
}

/* This node's index among the live workers of roster r (ranks ascending),
 * and their number. */
static void worker_place(const ts_proto_member *r, size_t n, int32_t me, int *index, int *workers) {
    *index = -1;
    *workers = 0;
    for (size_t i = 0; i < n; i++) {
        if (r[i].role != TS_ROLE_WORKER || !r[i].alive) continue;
        if (r[i].rank == me) *index = 0;
        *workers += 1;
    }
    for (size_t i = 0; *index >= 0 && i < n; i++)
        *index += r[i].role == TS_ROLE_WORKER && r[i].alive && r[i].rank < me;
}

bool ts_strategy_poll_workers(ts_strategy *s, int *index, int *workers) {
    uint64_t g;
    ts_proto_member *r = NULL;
    size_t n = 0;
    bool fresh = *workers == 0; /* the first call reads the join's roster */
    if (fresh ? ts_member_roster(s->member, &r, &n, &g) != TS_OK
              : !ts_member_poll_membership(s->member, &g, &r, &n))
        return false;
    ts_member_info info;
    ts_member_info_get(s->member, &info);
    int before = *workers;
    worker_place(r, n, info.rank, index, workers);
    free(r);
    if (fresh) {
        ts_member_poll_membership(s->member, NULL, NULL, NULL); /* the join's own generation */
    } else if (*workers != before) {
        printf("generation %llu: world size %d -> %d workers\n", (unsigned long long)g, before, *workers);
    } else {
        printf("generation %llu: world size %d workers\n", (unsigned long long)g, *workers);
    }
    return true;
}
