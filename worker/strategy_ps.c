/* strategy_ps.c - strategy "ps": data parallelism through parameter servers.
 *
 * Each worker holds the whole model but no optimizer step: per step it
 * pushes its gradients to the shards as backward finishes them (the
 * trainer's grads_ready, coalesced per shard by ps_client.c), commits the
 * step, and pulls the parameters the shards computed. Its data shard is
 * (its place among the live workers, their number) of the generation the
 * step is computed in.
 *
 * sync: the commit waits until every live worker committed; the replies
 * carry the job's loss and samples (the log's samples/s are the job's), the
 * workers' stop votes and
 * the shards' partial squared norms of the averaged gradient, whose sum is the norm the trainer logs and the shards
 * clip by; then APPLY and the pull of the step. "redo" (the workers
 * changed before the step was decided) rewinds the loader to the step's
 * start, re-shards it and computes the step again; "behind" (a shard
 * restarted from an older checkpoint) rolls every shard back to it and
 * replays the steps since, the leader saying how many.
 * async, bounded: the commit is applied by each shard at once, with this
 * worker's own loss and norm; the pull of the next step's parameters goes
 * out with it and is waited for when that step begins (bounded: the shards
 * hold it while this worker is more than parallel.staleness steps ahead
 * of the slowest).
 *
 * The leader (the lowest live worker) writes the run's log, metrics and
 * whole-model checkpoints (for --eval, --generate); the shards keep the
 * optimizer state and the data position, so a resumed job restarts from
 * the shards' checkpoints and every worker takes the step and position of
 * its first pull. Evaluation sums go through shard 0.
 *
 * The client sends and receives host memory: a model on a GPU is mirrored
 * in pinned host buffers (mirror.h), its gradient ranges copied down on a
 * side stream as backward finishes them and pushed once there, the pulled
 * parameters copied up.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/clock.h"
#include "kernels/optim/clip.h"
#include "worker/mirror.h"
#include "worker/ps_client.h"
#include "worker/strategy.h"
#include "worker/trainer.h"

typedef struct {
    ts_strategy base;
    ts_ps_client *c;
    ts_mirror *mirror;    /* the model's buffers in host memory */
    const char *key_file;
    bool mpi;             /* under mpirun: nothing restarts a shard's server */
    bool sync;
    ts_loader_pos start;  /* the loader's position when the step began */
    double sq_norm;       /* the squared norm of the step's gradient */
    int64_t have;         /* the step of the parameters in the model, -1 none */
    int64_t reported;     /* the last step reported to the scheduler */
    int64_t rollback_to;  /* a rollback found at the end of a step, done when the next begins; -1 none */
    int reductions;       /* reduce_sums calls at this step */
    int64_t reduce_step;
    bool took_lead;       /* this rank became the leader: save_owed looks for a checkpoint it owes the run */
    int64_t exit_at;      /* TESSERA_FAULT's step (fault_exit), or -1 */
    bool all_exit;        /* ... at which every worker exits, not the leader alone */
    bool exit_end;        /* TESSERA_FAULT ends the leader in ps_finish */
    int64_t hold_at;      /* TESSERA_FAULT's step whose evaluation rank 1 holds (hold_for_join), or -1 */
    bool hold_exit;       /* ... and then ends, not sends its part */
    int64_t end_hold_at;  /* TESSERA_FAULT's step whose end rank 1 holds (async, bounded), or -1 */
} ps_strategy;

/* Takes the live workers of the client's roster as this worker's group;
 * the (new) leader says so when their number changed. */
static void take_group(ps_strategy *d) {
    uint64_t g;
    int index, workers;
    ts_ps_client_workers(d->c, &g, &index, &workers);
    ts_group *gr = &d->base.group;
    if (index == 0 && !gr->leader) d->took_lead = true;
    if (gr->generation && workers != gr->world && index == 0) /* a change, not the join's own group */
        printf("generation %llu: world size %d -> %d workers\n", (unsigned long long)g, gr->world, workers);
    *gr = (ts_group){.rank = index < 0 ? 0 : index, .world = workers > 0 ? workers : 1, .generation = g,
                     .leader = index == 0};
}

/* Pulls the parameters of step >= want into the model; the trainer's step
 * and the loader follow the shards' step and data position when adopt is
 * set, and a step adopted that this worker did not take is its last taken
 * as the shards describe it, for the log. */
static ts_status pull(ps_strategy *d, int64_t want, bool adopt) {
    ts_trainer *t = d->base.trainer;
    ts_status st = ts_ps_client_pull(d->c, want);
    ts_ps_pulled p;
    if (!st) st = ts_ps_client_pull_wait(d->c, &p);
    if (!st) st = ts_mirror_params_arrived(d->mirror);
    if (!st && adopt && p.logged) ts_trainer_adopt_step(t, p.step, p.loss, p.lr, p.grad_norm);
    if (!st && adopt && (p.step != t->step || p.pos.epoch != ts_loader_position(t->loader).epoch ||
                         p.pos.offset != ts_loader_position(t->loader).offset)) {
        t->step = p.step;
        st = ts_loader_set_position(t->loader, p.pos);
    }
    if (!st) st = ts_model_sync_compute(t->model); /* the bf16 copy follows the pulled master */
    if (!st) d->have = adopt ? p.step : t->step;
    return st;
}

/* A shard restarted from its checkpoint of step `to`: takes every shard
 * there and continues from its parameters and data position. */
static ts_status roll_back(ps_strategy *d, int64_t to) {
    ts_trainer *t = d->base.trainer;
    int64_t from = t->step, at;
    ts_status st = ts_ps_client_rollback(d->c, to, &at);
    if (!st) st = pull(d, at, true);
    if (!st && d->base.group.leader && from > at)
        printf("a shard restarted from its checkpoint of step %lld: the job goes back from step %lld and replays "
               "%lld steps\n", (long long)at, (long long)from, (long long)(from - at));
    else if (!st && d->base.group.leader) /* joining: a shard resumed from an older checkpoint than the others */
        printf("the shards were at different steps: every shard went back to step %lld, the earliest\n",
               (long long)at);
    if (!st) d->start = ts_loader_position(t->loader);
    return st;
}

/* Reacts to the event that ended a wait with TS_ERR_STATE: redo the step,
 * roll back, or end. *again says whether the step is computed again. */
static ts_status recover(ps_strategy *d, ts_status st, bool *again) {
    ts_trainer *t = d->base.trainer;
    ts_ps_event ev = ts_ps_client_event(d->c);
    *again = false;
    if (st != TS_ERR_STATE) return st;
    if (ev.kind == TS_PS_FINISHED) {
        d->base.finished = true;
        return TS_OK;
    }
    if (ev.kind == TS_PS_BEHIND) {
        *again = true;
        return roll_back(d, ev.step);
    }
    if (ev.kind != TS_PS_REDO) return st;
    *again = true;
    if ((st = ts_ps_client_await_generation(d->c, ev.generation))) return recover(d, st, again);
    take_group(d);
    st = ts_loader_set_position(t->loader, d->start);
    return st ? st : ts_trainer_follow_group(t);
}

/* A gradient range in host memory goes to the client. */
static ts_status push_ready(void *ctx, int64_t offset, int64_t len) {
    return ts_ps_client_ready(((ps_strategy *)ctx)->c, offset, len);
}

static ts_status ps_attach(ts_strategy *s) {
    ps_strategy *d = (ps_strategy *)s;
    ts_trainer *t = s->trainer;
    ts_model *m = t->model;
    if (!(d->mirror = ts_mirror_new(m, push_ready, d))) return ts_last_status();
    ts_range *tensors = malloc((size_t)m->n_params * sizeof *tensors);
    if (!tensors) return ts_error(TS_ERR_MEMORY, "strategy ps: out of memory");
    for (int i = 0; i < m->n_params; i++) tensors[i] = (ts_range){m->params[i].offset, m->params[i].numel};
    d->sync = t->job.parallel.consistency == TS_CONSISTENCY_SYNC;
    ts_ps_client_config cfg = {.job = &t->job, .member = s->member, .key_file = d->key_file, .tensors = tensors,
                               .n_tensors = m->n_params, .numel = m->numel, .params = ts_mirror_params(d->mirror),
                               .grads = ts_mirror_grads(d->mirror), .no_restarts = d->mpi};
    d->c = ts_ps_client_create(&cfg);
    free(tensors);
    if (!d->c) return ts_last_status();
    take_group(d);
    ts_status st = ts_trainer_follow_group(t);
    bool again;
    if (!st) st = recover(d, pull(d, 0, true), &again);
    if (!st && t->step > 0) d->exit_at = d->hold_at = -1, d->exit_end = false; /* a joiner: the fault is for the first workers */
    return st;
}

/* Brings the model to the parameters of the trainer's step: a rollback
 * found at the end of the last step, or a prefetched pull. */
static ts_status settle(ps_strategy *d) {
    ts_trainer *t = d->base.trainer;
    bool again;
    if (d->rollback_to >= 0) {
        int64_t to = d->rollback_to;
        d->rollback_to = -1;
        return recover(d, roll_back(d, to), &again);
    }
    if (d->have == t->step && !ts_ps_client_pulling(d->c)) return TS_OK;
    return recover(d, pull(d, t->step, false), &again);
}

static ts_status ps_begin_step(ts_strategy *s, int64_t step) {
    (void)step;
    ps_strategy *d = (ps_strategy *)s;
    if (ts_member_shutdown_requested(s->member, NULL, NULL, 0)) {
        s->finished = true;
        return TS_OK;
    }
    take_group(d);
    ts_ps_client_times(d->c); /* the step's times start here */
    ts_status st = settle(d);
    d->start = ts_loader_position(s->trainer->loader);
    return st;
}

/* A rank that took the lead saves the run's whole-model checkpoint of the
 * step whose parameters it holds when train.checkpoint_every asked for one
 * there and the run has none: the leader before it left between the step
 * and its save (the shards saved theirs), or every worker left and this
 * one adopted the step. Called where the model holds the trainer's step
 * and the loader stands at its end. */
static ts_status save_owed(ps_strategy *d) {
    ts_trainer *t = d->base.trainer;
    int64_t every = t->job.train.checkpoint_every, k = t->step;
    if (!d->took_lead || !d->base.group.leader || d->have != k) return TS_OK;
    d->took_lead = false;
    if (!every || k <= 0 || k % every || !t->run_dir[0] || d->base.finished) return TS_OK;
    char path[1200];
    snprintf(path, sizeof path, "%s/checkpoints/step-%lld", t->run_dir, (long long)k);
    if (access(path, F_OK) == 0) return TS_OK;
    ts_status st = ts_strategy_save_whole(&d->base, path, sizeof path);
    if (!st) printf("step %lld was due a checkpoint that the leader before this one left without writing: %s\n",
                    (long long)k, path);
    return st;
}

/* Computes the step's gradients, pushes and commits them; in sync mode
 * waits for the decision. */
static ts_status compute(ps_strategy *d, double *loss, int64_t *samples) {
    ts_trainer *t = d->base.trainer;
    ts_status st = save_owed(d);
    if (st) return st;
    ts_ps_client_begin(d->c, t->step + 1, d->base.group.generation);
    st = ts_trainer_grads(t, loss, samples);
    if (!st) st = ts_mirror_flush(d->mirror); /* every range pushed */
    if (st) return st;
    ts_loader_pos next = ts_loader_position(t->loader);
    double own = d->sync ? 0 : ts_clip_sq_norm(ts_mirror_grads(d->mirror), t->model->numel);
    double v[TS_COMMIT_VALUES] = {*loss * (double)*samples, (double)*samples, own,
                                  ts_schedule_lr(&t->schedule, t->step), (double)next.epoch, (double)next.offset,
                                  ts_strategy_stop_vote(&d->base)};
    double out[TS_DECIDED_VALUES];
    st = ts_ps_client_commit(d->c, v, d->sync, out);
    if (st) return st;
    /* sync: the step's workers' votes; async: this worker's own */
    d->base.stop_agreed = d->sync ? out[TS_DECIDED_STOP] > 0 : v[TS_COMMIT_STOP] > 0;
    if (!d->sync) {
        d->sq_norm = own;
        return ts_ps_client_pull(d->c, t->step + 1); /* the next step's parameters, fetched meanwhile */
    }
    /* the job's: its loss and samples (the log's samples/s is the job's) */
    *loss = out[TS_DECIDED_SAMPLES] > 0 ? out[TS_DECIDED_LOSS_SUM] / out[TS_DECIDED_SAMPLES] : 0;
    *samples = (int64_t)out[TS_DECIDED_SAMPLES];
    d->sq_norm = out[TS_DECIDED_SQ_NORM];
    return TS_OK;
}

static ts_status ps_grads(ts_strategy *s, double *loss, int64_t *samples) {
    ps_strategy *d = (ps_strategy *)s;
    for (;;) {
        bool again;
        ts_status st = recover(d, compute(d, loss, samples), &again);
        if (st || !again || s->finished) return st;
    }
}

static ts_status ps_grads_ready(ts_strategy *s, int64_t offset, int64_t len) {
    return ts_mirror_grads_ready(((ps_strategy *)s)->mirror, offset, len);
}

static void ps_slices(ts_strategy *s, const ts_optim_slice **slices, int *n) {
    (void)s;
    *slices = NULL;
    *n = 0; /* the shards step */
}

static ts_status ps_sq_norm(ts_strategy *s, double *global) {
    *global = ((ps_strategy *)s)->sq_norm;
    return TS_OK;
}

/* Fault injection for the tests, from TESSERA_FAULT, for deaths a kill -9
 * hits only by chance: "leader_exit@K" ends the leader, "workers_exit@K"
 * every worker, once it took step K (sync: applied and pulled it; async
 * and bounded: its commit applied), before it logs or saves it;
 * "leader_exit@end" ends the leader once it wrote the run's end, before
 * it says so (ps_finish); "eval_hold@K" makes rank 1 hold its part of
 * step K's first evaluation until a worker joined, then send it, and
 * "eval_exit@K" end then (hold_for_join); "end_hold@K" (async, bounded)
 * holds rank 1 so after its commit of step K, before it takes the group
 * for the step's log and evaluation. Workers that join the running
 * job (a restart) are not hit. */
static bool fault_due(const ps_strategy *d, int64_t step) {
    return step == d->exit_at && (d->all_exit || d->base.group.leader);
}

/* Ends this worker, after step, for TESSERA_FAULT. */
static void exit_for_fault(const ps_strategy *d, int64_t step) {
    printf("ps: TESSERA_FAULT: rank %d exits after step %lld\n", d->base.group.rank, (long long)step);
    fflush(stdout);
    _exit(3);
}

/* Ends this worker when the fault is due at step. */
static void fault_exit(const ps_strategy *d, int64_t step) {
    if (fault_due(d, step)) exit_for_fault(d, step);
}

/* Holds this worker at what (its part of the evaluation, the end) of step
 * until the job has more workers than its group (up to a minute), for
 * TESSERA_FAULT; then ends the worker (eval_exit) or lets it go on. */
static void hold_for_join(ps_strategy *d, int64_t step, const char *what) {
    printf("ps: TESSERA_FAULT: rank %d holds %s of step %lld until a worker joins\n", d->base.group.rank, what,
           (long long)step);
    fflush(stdout);
    d->hold_at = -1;
    for (int i = 0; i < 1200; i++) {
        uint64_t g;
        int index, workers;
        ts_ps_client_workers(d->c, &g, &index, &workers);
        if (workers > d->base.group.world) break;
        ts_sleep_ms(50);
    }
    if (d->hold_exit) exit_for_fault(d, step);
}

/* Sync: applies the step at the shards, pulls its parameters and reports
 * the step to the scheduler (once per step, not again when replaying).
 * Async, bounded: the commit is applied already; only a fault due waits. */
static ts_status ps_end_step(ts_strategy *s, int64_t step) {
    ps_strategy *d = (ps_strategy *)s;
    ts_status st = TS_OK;
    if (d->sync) {
        bool again;
        st = ts_ps_client_apply(d->c, d->sq_norm);
        if (!st) st = pull(d, step, false);
        if (st == TS_ERR_STATE && ts_ps_client_event(d->c).kind == TS_PS_BEHIND) {
            d->rollback_to = ts_ps_client_event(d->c).step; /* this step is undone: the next begins there */
            st = TS_OK;
        } else {
            st = recover(d, st, &again);
        }
        if (!st && d->rollback_to < 0) fault_exit(d, step);
    } else if (fault_due(d, step)) {
        ts_ps_pulled p; /* the commit went out unanswered: the shards answer this pull after applying it */
        st = ts_ps_client_pull_wait(d->c, &p);
        if (!st) fault_exit(d, step);
    }
    /* async, bounded: each worker steps on its own, so a group taken at
     * the step's start may name a leader that a change of workers replaced
     * meanwhile; the step is logged (and evaluated) with the group of now */
    if (!st && !d->sync && step == d->end_hold_at && s->group.rank == 1) hold_for_join(d, step, "the end");
    if (!st && !d->sync) take_group(d);
    /* async workers report no step but the last (ts_strategy_step_done,
     * by the node): they are never all at one step, and a change of
     * workers (a death, a join) waits for that at the scheduler */
    if (!st && d->sync && !s->finished && d->rollback_to < 0 && step > d->reported) {
        st = ts_strategy_step_done(s, step);
        d->reported = step;
    }
    ts_ps_times tm = ts_ps_client_times(d->c);
    s->times = (ts_comm_times){.push_ms = tm.push_ms, .pull_ms = tm.pull_ms, .wait_ms = tm.wait_ms};
    return st;
}

/* An evaluation's sums through shard 0; the step's reductions are
 * numbered, a reduction given up (a worker left) keeping its number for
 * the pass computed again (ps_recover); those of the job's last step say
 * so (every worker evaluates there, one that joined after it too). */
static ts_status ps_reduce_sums(ts_strategy *s, double *v, int n) {
    ps_strategy *d = (ps_strategy *)s;
    int64_t step = s->trainer->step;
    if (step != d->reduce_step) d->reduce_step = step, d->reductions = 0;
    if (step == d->hold_at && s->group.rank == 1) hold_for_join(d, step, "its evaluation");
    int64_t id = d->reductions + (step >= s->trainer->total_steps ? TS_REDUCE_FINAL : 0);
    ts_status st = ts_ps_client_reduce(d->c, step, id, s->group.generation, v, n);
    if (!st) d->reductions++;
    return st;
}

/* An evaluation's reduction failed: when the workers changed (REDO),
 * takes the new group and *again: every worker that was in the reduction
 * evaluates again at the new world size. When that world counts a worker
 * that joined after the step (SKIP), the group goes on without the
 * evaluation, its number spent. A shard that restarted moves the job back
 * (roll_back); the job's end finishes it. */
static ts_status ps_recover(ts_strategy *s, ts_status failed, bool test, bool *again) {
    ps_strategy *d = (ps_strategy *)s;
    (void)test;
    ts_ps_event ev = ts_ps_client_event(d->c);
    if (failed == TS_ERR_STATE && ev.kind == TS_PS_SKIP) {
        d->reductions++;
        take_group(d);
        *again = false;
        return ts_trainer_follow_group(s->trainer);
    }
    if (failed != TS_ERR_STATE || ev.kind != TS_PS_REDO) return recover(d, failed, again);
    ts_status st = ts_ps_client_await_generation(d->c, ev.generation);
    if (st) return recover(d, st, again);
    take_group(d);
    *again = true;
    return ts_trainer_follow_group(s->trainer);
}

/* The leader saves the whole model as the run's checkpoint (the parameters
 * of its step, settled first); the shards save their own. */
static ts_status ps_save(ts_strategy *s, char *path, size_t cap) {
    ps_strategy *d = (ps_strategy *)s;
    if (cap) path[0] = '\0';
    ts_status st = settle(d);
    if (!st && s->group.leader && !s->finished) st = ts_strategy_save_whole(s, path, cap);
    return st;
}

/* The scheduler's blob by which the leader says the run's end is written. */
#define END_KEY "ps/end-written"

/* After the run's end: the leader says through the scheduler that it is
 * written. Another worker waits for that (it has not reported its last
 * step yet, so the job cannot end before); when the leader left first
 * and this worker took the lead, *again: the trainer writes the end. */
static ts_status ps_finish(ts_strategy *s, bool *again) {
    ps_strategy *d = (ps_strategy *)s;
    *again = false;
    ts_member_info info;
    ts_member_info_get(s->member, &info);
    /* the leader's death shows after the heartbeat timeout; the
     * scheduler holds a wait for the barrier timeout, so few are open */
    int poll_ms = (int)info.heartbeat_timeout_ms / 2;
    for (;;) {
        if (s->group.leader) {
            int64_t step = s->trainer->step;
            if (d->exit_end) exit_for_fault(d, step);
            ts_status st = ts_member_blob_put(s->member, END_KEY, &step, sizeof step);
            return st == TS_ERR_STATE ? TS_OK : st; /* TS_ERR_STATE: the job is shut down */
        }
        void *data = NULL;
        size_t size = 0;
        ts_status st = ts_member_blob_get(s->member, END_KEY, poll_ms, &data, &size);
        free(data);
        if (st == TS_OK || st == TS_ERR_STATE) return TS_OK;
        if (st != TS_ERR_TIMEOUT && st != TS_ERR_INDEX) return st;
        take_group(d);
        if (s->group.leader) {
            printf("worker rank %d took the lead after the last step from a leader that left before writing "
                   "the run's end: it writes it\n", info.rank);
            *again = true;
            d->exit_end = false; /* the fault ends the run's first leader only */
            return TS_OK;
        }
    }
}

/* The shards hold the job's state: the first pull says where it is. */
static ts_status ps_load(ts_strategy *s, const char *dir) {
    (void)s, (void)dir;
    return TS_OK;
}

static void ps_free(ts_strategy *s) {
    ts_ps_client_free(((ps_strategy *)s)->c);
    ts_mirror_free(((ps_strategy *)s)->mirror);
    free(s);
}

static const ts_strategy_ops ps_ops = {
    .units = ts_strategy_all_units,
    .attach = ps_attach,
    .begin_step = ps_begin_step,
    .grads = ps_grads,
    .grads_ready = ps_grads_ready,
    .slices = ps_slices,
    .reduce_sq_norm = ps_sq_norm,
    .reduce_sums = ps_reduce_sums,
    .end_step = ps_end_step,
    .save = ps_save,
    .load = ps_load,
    .recover = ps_recover,
    .finish = ps_finish,
    .free = ps_free,
};

ts_strategy *ts_strategy_ps_new(const ts_strategy_options *o) {
    ps_strategy *d = calloc(1, sizeof *d);
    if (!d) {
        ts_error(TS_ERR_MEMORY, "strategy ps: out of memory");
        return NULL;
    }
    d->base.ops = &ps_ops;
    d->base.no_optim_state = true; /* the shards keep it */
    d->key_file = o->key_file;
    d->mpi = o->mpi_comm != NULL;
    d->have = d->reported = d->reduce_step = d->rollback_to = -1;
    const char *fault = getenv("TESSERA_FAULT");
    long long k;
    d->exit_at = -1;
    if (fault && sscanf(fault, "leader_exit@%lld", &k) == 1 && k > 0) d->exit_at = k;
    if (fault && sscanf(fault, "workers_exit@%lld", &k) == 1 && k > 0) d->exit_at = k, d->all_exit = true;
    d->exit_end = fault && strcmp(fault, "leader_exit@end") == 0;
    d->hold_at = -1;
    if (fault && sscanf(fault, "eval_hold@%lld", &k) == 1 && k > 0) d->hold_at = k;
    if (fault && sscanf(fault, "eval_exit@%lld", &k) == 1 && k > 0) d->hold_at = k, d->hold_exit = true;
    d->end_hold_at = -1;
    if (fault && sscanf(fault, "end_hold@%lld", &k) == 1 && k > 0) d->end_hold_at = k;
    /* the loader is made before the join: shard it for the job's workers
     * (its steps per epoch), attach takes the live group */
    d->base.group = (ts_group){.rank = 0, .world = ts_strategy_data_world(o->job)};
    return &d->base;
}
