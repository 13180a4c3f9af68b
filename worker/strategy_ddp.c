/* strategy_ddp.c - strategy "ddp": all-reduce data parallelism, like
 * PyTorch DDP and Horovod.
 *
 * Every worker holds the whole model and trains on its shard of each step's
 * data. The flat gradient buffer is cut into buckets (parallel.bucket_mb,
 * buckets.h) from its end, in reverse registration order; as soon as
 * backward has finished a bucket's gradients on the step's last
 * micro-batch, the bucket is averaged over the workers by the
 * communicator's progress thread while backward goes on; then every worker
 * applies the same optimizer step. parallel.wire_dtype "bf16" sends bf16
 * copies (reduced in f32).
 *
 * The group (dp_group.h) is one communicator per generation. When the
 * scheduler announces a new one (a join, a death, a departure), every
 * worker abandons the step in flight, builds the new ring, and takes the
 * state of the rank furthest on (the most steps; the lowest rank of those)
 * - parameters, optimizer state, step and data position - so that all
 * agree again: a worker either applied the whole averaged gradient of a
 * step or nothing of it, and that state is the one everybody continues
 * from. (Not rank 0's: a restarted worker gets its previous rank back,
 * maybe 0, with nothing trained.) A collective that fails (a peer died or
 * went silent, named within the heartbeat timeout) leads to the same: the
 * worker waits for the scheduler's next generation and redoes the step at
 * the new world size.
 *
 * A model on a GPU (job device "cuda") all-reduces its device buffers over
 * the group's NCCL communicator; the host values of its collectives go
 * through the group's staging buffer (dp_group.h).
 */
#include <stdlib.h>

#include "kernels/clock.h"
#include "worker/buckets.h"
#include "worker/dp_group.h"
#include "worker/strategy.h"
#include "worker/trainer.h"

typedef struct {
    ts_strategy base;
    ts_dp_group g;           /* the communicator of each generation */
    ts_buckets *buckets;
} ddp_strategy;

/* ---- generations ---- */

/* Step, total steps and data position of the state a generation starts
 * from: the furthest rank's, as of its last applied step, and, when that
 * rank took the step itself (taken), its loss, learning rate and gradient
 * norm, for a leader that adopts the step to log. 8-byte fields:
 * broadcast as i64. */
typedef struct {
    int64_t step, total_steps, epoch, offset, taken;
    double loss, lr, grad_norm;
} sync_header;

/* Makes every rank take the parameters, optimizer state, step, total and
 * data position of the rank furthest on (hooks.agree). */
static ts_status sync_state(ts_strategy *s) {
    ddp_strategy *d = (ddp_strategy *)s;
    ts_trainer *t = s->trainer;
    ts_model *m = t->model;
    ts_loader_pos pos = ts_dp_group_position(&d->g);
    const ts_step_stats *last = &t->last_taken;
    sync_header h = {t->step, t->total_steps, pos.epoch, pos.offset, last->step == t->step,
                     last->loss, last->lr, last->grad_norm};
    float *p = ts_f32(m->flat_params);
    int root = 0;
    ts_status st = ts_dp_group_furthest(&d->g, &root);
    if (!st) st = ts_dp_group_broadcast(&d->g, root, &h, sizeof h / sizeof(int64_t), TS_I64, true);
    if (!st) st = ts_dp_group_broadcast(&d->g, root, p, m->numel, TS_F32, false);
    if (!st && m->n_state)
        st = ts_dp_group_broadcast(&d->g, root, m->state, (int64_t)m->n_state * m->numel, TS_F32, false);
    /* the root is done as soon as it has sent: all leave together, so that
     * the next step's collectives start even */
    if (!st) st = ts_dp_group_meet(&d->g, TS_COMM_BARRIER, NULL, NULL, 0, TS_U8);
    if (st) return st;
    if (h.taken) ts_trainer_adopt_step(t, h.step, h.loss, h.lr, h.grad_norm);
    t->step = h.step;
    t->total_steps = h.total_steps;
    d->g.step_start = (ts_loader_pos){h.epoch, h.offset};
    st = ts_loader_set_position(t->loader, d->g.step_start);
    if (!st) st = ts_model_sync_compute(m);
    return st;
}

/* The buckets' requests, abandoned (hooks.drop). */
static void drop_buckets(ts_strategy *s) {
    ddp_strategy *d = (ddp_strategy *)s;
    if (d->buckets) ts_buckets_drop(d->buckets);
}

/* A bucket's wait: finish, looking for a new generation. */
static ts_status bucket_wait(void *ctx, ts_comm_req *req) { return ts_dp_group_finish(ctx, req); }

/* ---- the hooks ---- */

static ts_status ddp_attach(ts_strategy *s) {
    ddp_strategy *d = (ddp_strategy *)s;
    const ts_job_parallel *p = &s->trainer->job.parallel;
    if (!(d->buckets = ts_buckets_new(s->trainer->model, p->bucket_mb, p->wire_dtype == TS_WIRE_BF16)))
        return ts_last_status();
    return ts_dp_group_attach(&d->g);
}

static ts_status ddp_begin_step(ts_strategy *s, int64_t step) {
    (void)step;
    return ts_dp_group_begin_step(&((ddp_strategy *)s)->g);
}

static ts_status ddp_grads_ready(ts_strategy *s, int64_t offset, int64_t len) {
    ddp_strategy *d = (ddp_strategy *)s;
    return ts_buckets_ready(d->buckets, d->g.comm, ts_f32(s->trainer->model->flat_grads), offset, len,
                            s->trainer->step + 1);
}

/* One try at the step's gradients, averaged over the workers, and its
 * loss, sample count and stop votes summed over them (hooks.try_step). The time spent
 * waiting after backward - communication that compute did not hide - is
 * the step's wait_ms. */
static ts_status try_step(ts_strategy *s, double *loss, int64_t *samples) {
    ddp_strategy *d = (ddp_strategy *)s;
    ts_buckets_reset(d->buckets);
    ts_status st = ts_trainer_grads(s->trainer, loss, samples);
    double t0 = ts_clock_ms();
    ts_status waited = ts_buckets_wait(d->buckets, ts_f32(s->trainer->model->flat_grads), bucket_wait, &d->g);
    if (st) return st;
    if (waited) return waited;
    double sums[3] = {*loss, (double)*samples, ts_strategy_stop_vote(s)};
    ts_comm_op op = {.kind = TS_COMM_ALLREDUCE, .send = sums, .recv = sums, .count = 3, .dtype = TS_F64,
                     .op = TS_REDUCE_SUM, .step = s->trainer->step + 1};
    st = ts_dp_group_run_host(&d->g, &op);
    if (!st) st = ts_dp_group_fault(&d->g);
    s->times.wait_ms += ts_clock_ms() - t0;
    *loss = sums[0] / s->group.world;
    *samples = (int64_t)sums[1];
    s->stop_agreed = !st && sums[2] > 0;
    return st;
}

static ts_status ddp_grads(ts_strategy *s, double *loss, int64_t *samples) {
    return ts_dp_group_grads(&((ddp_strategy *)s)->g, loss, samples);
}

static ts_status ddp_reduce_sums(ts_strategy *s, double *v, int n) {
    return ts_dp_group_sums(&((ddp_strategy *)s)->g, v, n);
}

static ts_status ddp_recover(ts_strategy *s, ts_status failed, bool test, bool *again) {
    return ts_dp_group_recover(&((ddp_strategy *)s)->g, failed, test, again);
}

static ts_status ddp_end_step(ts_strategy *s, int64_t step) { return ts_dp_group_end_step(&((ddp_strategy *)s)->g, step); }

/* The leader keeps the run's checkpoints (every worker holds the same). */
static ts_status ddp_save(ts_strategy *s, char *path, size_t cap) {
    if (s->group.leader) return ts_strategy_save_whole(s, path, cap);
    if (cap) path[0] = '\0';
    return TS_OK;
}

static void ddp_free(ts_strategy *s) {
    ddp_strategy *d = (ddp_strategy *)s;
    ts_dp_group_close(&d->g);
    ts_buckets_free(d->buckets);
    free(d);
}

static const ts_strategy_ops ddp_ops = {
    .units = ts_strategy_all_units,
    .attach = ddp_attach,
    .begin_step = ddp_begin_step,
    .grads = ddp_grads,
    .grads_ready = ddp_grads_ready,
    .slices = ts_strategy_whole_model,
    .reduce_sq_norm = ts_strategy_sq_norm_here,
    .reduce_sums = ddp_reduce_sums,
    .end_step = ddp_end_step,
    .save = ddp_save,
    .load = ts_strategy_load_whole,
    .recover = ddp_recover,
    .free = ddp_free,
};

ts_strategy *ts_strategy_ddp_new(const ts_strategy_options *o) {
    ddp_strategy *d = calloc(1, sizeof *d);
    if (!d) {
        ts_error(TS_ERR_MEMORY, "strategy ddp: out of memory");
        return NULL;
    }
    d->base.ops = &ddp_ops;
    static const ts_dp_group_hooks hooks = {.drop = drop_buckets, .agree = sync_state, .try_step = try_step};
    if (ts_dp_group_open(&d->g, &d->base, "ddp", o, &hooks)) {
        free(d);
        return NULL;
    }
    return &d->base;
}
