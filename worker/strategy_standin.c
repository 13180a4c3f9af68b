/* strategy_standin.c - strategy "standin": a cluster exercise in lock step.
 *
 * Every worker trains its own replica of the job's model on the whole data
 * set (nothing is exchanged between processes), and after each step
 * reports STEP_DONE to the scheduler and waits at that step's barrier, so
 * the job's membership, generations, barriers, failure detection, restarts
 * and joins run as they will under the parallel strategies. A step lasts at
 * least standin.step_ms. The lowest-ranked live worker is the leader.
 *
 * Output (stdout), read by tests: one line per step "step N world W loss L
 * step_ms T", one per generation change. When the scheduler shuts the job
 * down the loop ends without error; a barrier that fails otherwise fails
 * the step with the scheduler's reason (it names the missing ranks).
 */
#include <stdio.h>
#include <stdlib.h>

#include "kernels/clock.h"
#include "worker/strategy.h"
#include "worker/trainer.h"

typedef struct {
    ts_strategy base;
    int index, workers; /* place among the live workers, and their number */
    double t0, loss;    /* the step's start (ms) and loss */
} standin_strategy;

/* Takes a new generation, if one was announced: the leader is the lowest
 * live worker. */
static void follow(standin_strategy *d) {
    if (ts_strategy_poll_workers(&d->base, &d->index, &d->workers)) d->base.group.leader = d->index == 0;
}

/* A joiner enters at the step the job had reached. */
static ts_status standin_attach(ts_strategy *s) {
    standin_strategy *d = (standin_strategy *)s;
    ts_member_info info;
    ts_member_info_get(s->member, &info);
    if (info.start_step > s->trainer->step) s->trainer->step = info.start_step;
    follow(d);
    return TS_OK;
}

static ts_status standin_begin_step(ts_strategy *s, int64_t step) {
    (void)step;
    standin_strategy *d = (standin_strategy *)s;
    if (ts_member_shutdown_requested(s->member, NULL, NULL, 0)) {
        s->finished = true;
        return TS_OK;
    }
    follow(d);
    d->t0 = ts_clock_ms();
    return TS_OK;
}

static ts_status standin_grads(ts_strategy *s, double *loss, int64_t *samples) {
    standin_strategy *d = (standin_strategy *)s;
    ts_status st = ts_trainer_grads(s->trainer, loss, samples);
    d->loss = *loss;
    return st;
}

/* Reports the finished step and waits for every live worker at its
 * barrier. */
static ts_status standin_end_step(ts_strategy *s, int64_t step) {
    standin_strategy *d = (standin_strategy *)s;
    ts_sleep_ms((double)s->trainer->job.standin.step_ms - (ts_clock_ms() - d->t0));
    ts_status st = ts_member_step_done(s->member, step);
    if (st) return st;
    printf("step %lld world %d loss %.4f step_ms %.1f\n", (long long)step, d->workers, d->loss, ts_clock_ms() - d->t0);
    st = ts_member_barrier(s->member, step, 0);
    if (st && ts_member_shutdown_requested(s->member, NULL, NULL, 0)) {
        s->finished = true;
        return TS_OK;
    }
    /* each stand-in trains its own replica: it stops alone (a stopped
     * worker holds up no barrier of the others) */
    s->stop_agreed = ts_strategy_stop_vote(s) > 0;
    return st ? ts_error(st, "barrier %lld failed: %s", (long long)step, ts_last_error()) : TS_OK;
}

/* The leader keeps the run's checkpoints; the others' replicas are not
 * saved (path ""). */
static ts_status standin_save(ts_strategy *s, char *path, size_t cap) {
    if (s->group.leader) return ts_strategy_save_whole(s, path, cap);
    if (cap) path[0] = '\0';
    return TS_OK;
}

static void standin_free(ts_strategy *s) { free(s); }

static const ts_strategy_ops standin_ops = {
    .units = ts_strategy_all_units,
    .attach = standin_attach,
    .begin_step = standin_begin_step,
    .grads = standin_grads,
    .grads_ready = ts_strategy_ready_nothing,
    .slices = ts_strategy_whole_model,
    .reduce_sq_norm = ts_strategy_sq_norm_here,
    .reduce_sums = ts_strategy_sums_here,
    .end_step = standin_end_step,
    .save = standin_save,
    .load = ts_strategy_load_whole,
    .free = standin_free,
};

ts_strategy *ts_strategy_standin_new(const ts_strategy_options *o) {
    standin_strategy *d = calloc(1, sizeof *d);
    if (!d) {
        ts_error(TS_ERR_MEMORY, "strategy standin: out of memory");
        return NULL;
    }
    d->base.ops = &standin_ops;
    /* independent replicas: each trains on all the data */
    d->base.group = (ts_group){.rank = 0, .world = ts_strategy_data_world(o->job), .generation = 0, .leader = false};
    return &d->base;
}
