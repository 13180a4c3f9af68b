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
 * The communicator is the ring over each worker's port (collective/ring.h;
 * its endpoint is the address the worker joins with), or MPI's under
 * mpirun. A generation is one communicator. When the scheduler announces a
 * new one (a join, a death, a departure), every worker abandons the step in
 * flight, builds the new ring, and takes the state of the new rank 0 -
 * parameters, optimizer state, step and data position - so that all agree
 * again: a worker either applied the whole averaged gradient of a step or
 * nothing of it, and rank 0's state is the one everybody continues from. A
 * collective that fails (a peer died or went silent, named within the
 * heartbeat timeout) leads to the same: the worker waits for the scheduler's
 * next generation and redoes the step at the new world size.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "collective/mpi.h"
#include "collective/ring.h"
#include "kernels/clock.h"
#include "worker/buckets.h"
#include "worker/strategy.h"
#include "worker/trainer.h"

/* How often a waiting worker looks for a new generation (ms). */
#define LOOK_MS 20

typedef struct {
    ts_strategy base;
    ts_ring_port *port;      /* ring backend: this worker's port */
    void *mpi_comm;          /* MPI backend: the workers' MPI_Comm * */
    ts_comm *comm;           /* this generation's communicator */
    ts_buckets *buckets;
    /* the next generation, when the scheduler announced one */
    bool pending;
    uint64_t next_generation;
    ts_proto_member *next_roster;
    size_t next_n;
    /* the step in flight */
    bool in_step;
    ts_loader_pos step_start;
} ddp_strategy;

/* ---- generations ---- */

/* Notes a generation the scheduler announced since the last look. */
static void look(ddp_strategy *d) {
    uint64_t g;
    ts_proto_member *r = NULL;
    size_t n = 0;
    if (!d->base.member || !ts_member_poll_membership(d->base.member, &g, &r, &n)) return;
    free(d->next_roster);
    d->next_roster = r;
    d->next_n = n;
    d->next_generation = g;
    d->pending = true;
}

/* Waits (up to the time the scheduler needs to declare a silent worker
 * dead, and more) for the generation after the current one. */
static ts_status await_generation(ddp_strategy *d) {
    ts_member_info info;
    ts_member_info_get(d->base.member, &info);
    double deadline = ts_clock_ms() + 2.0 * info.heartbeat_timeout_ms + info.barrier_timeout_ms;
    while (!d->pending) {
        if (ts_member_shutdown_requested(d->base.member, NULL, NULL, 0)) {
            d->base.finished = true;
            return TS_OK;
        }
        if (ts_clock_ms() > deadline)
            return ts_error(TS_ERR_TIMEOUT, "ddp: no new generation from the scheduler after the collective failed");
        ts_sleep_ms(LOOK_MS);
        look(d);
    }
    return TS_OK;
}

/* Step, total steps and data position of the state a generation starts
 * from: rank 0's, as of its last applied step. */
typedef struct {
    int64_t step, total_steps, epoch, offset;
} sync_header;

/* Waits for req, looking for a new generation while it waits: one
 * abandons the operation (the others have moved on, or will). */
static ts_status finish(ddp_strategy *d, ts_comm_req *req) {
    for (;;) {
        bool done;
        ts_status st = ts_comm_wait_ms(req, LOOK_MS, &done);
        if (done) return st;
        look(d);
        if (d->pending) ts_comm_abort(d->comm);
    }
}

/* A collective of the regroup: kind (a broadcast from rank 0, or the
 * barrier that ends it) over count elements of buf. Peers meet here after a
 * membership change, some still finishing a step or just started: they get
 * the job's barrier timeout to arrive, not the heartbeat timeout of a
 * step. */
static ts_status meet(ddp_strategy *d, ts_comm_kind kind, void *buf, int64_t count, ts_dtype dt) {
    ts_member_info info;
    ts_member_info_get(d->base.member, &info);
    ts_comm_op op = {.kind = kind, .send = buf, .recv = buf, .count = count, .dtype = dt, .peer = 0,
                     .step = d->base.trainer->step, .timeout_ms = (int)info.barrier_timeout_ms};
    ts_comm_req *req;
    ts_status st = ts_comm_start(d->comm, &op, &req);
    return st ? st : finish(d, req);
}

/* Makes every rank take rank 0's parameters, optimizer state, step, total
 * and data position. */
static ts_status sync_state(ddp_strategy *d) {
    ts_trainer *t = d->base.trainer;
    ts_model *m = t->model;
    ts_loader_pos pos = d->in_step ? d->step_start : ts_loader_position(t->loader);
    sync_header h = {t->step, t->total_steps, pos.epoch, pos.offset};
    ts_status st = meet(d, TS_COMM_BROADCAST, &h, 4, TS_I64);
    if (!st) st = meet(d, TS_COMM_BROADCAST, ts_f32(m->flat_params), m->numel, TS_F32);
    if (!st && m->n_state) st = meet(d, TS_COMM_BROADCAST, m->state, (int64_t)m->n_state * m->numel, TS_F32);
    /* rank 0 is done as soon as it has sent: all leave together, so that the
     * next step's collectives start even */
    if (!st) st = meet(d, TS_COMM_BARRIER, NULL, 0, TS_U8);
    if (st) return st;
    t->step = h.step;
    t->total_steps = h.total_steps;
    d->step_start = (ts_loader_pos){h.epoch, h.offset};
    st = ts_loader_set_position(t->loader, d->step_start);
    if (!st) st = ts_model_sync_compute(m);
    return st;
}

static int by_rank(const void *a, const void *b) {
    int32_t x = (*(const ts_proto_member *const *)a)->rank, y = (*(const ts_proto_member *const *)b)->rank;
    return (x > y) - (x < y);
}

/* The roster's live workers, ranks ascending: their endpoints into peers
 * and this node's place into *index (-1: not among them). Returns their
 * number. */
static int live_workers(const ts_proto_member *r, size_t n, int32_t me, const char **peers, int *index) {
    const ts_proto_member **w = calloc(n + 1, sizeof *w);
    int k = 0;
    *index = -1;
    if (!w) return 0;
    for (size_t i = 0; i < n; i++)
        if (r[i].role == TS_ROLE_WORKER && r[i].alive) w[k++] = &r[i];
    qsort(w, (size_t)k, sizeof *w, by_rank);
    for (int i = 0; i < k; i++) {
        peers[i] = w[i]->address;
        if (w[i]->rank == me) *index = i;
    }
    free(w);
    return k;
}

/* Builds the communicator of the pending generation and takes rank 0's
 * state. */
static ts_status regroup_ring(ddp_strategy *d) {
    const char **peers = calloc(d->next_n + 1, sizeof *peers);
    if (!peers) return ts_error(TS_ERR_MEMORY, "ddp: out of memory for %zu peers", d->next_n);
    ts_member_info info;
    ts_member_info_get(d->base.member, &info);
    int index, world = live_workers(d->next_roster, d->next_n, info.rank, peers, &index);
    ts_status st = TS_OK;
    if (world == 0) st = ts_error(TS_ERR_MEMORY, "ddp: out of memory reading generation %llu",
                                  (unsigned long long)d->next_generation);
    else if (index < 0) st = ts_error(TS_ERR_STATE, "ddp: generation %llu does not list this worker (rank %d)",
                                      (unsigned long long)d->next_generation, info.rank);
    for (int i = 0; !st && i < world; i++)
        if (!peers[i][0]) st = ts_error(TS_ERR_PEER, "ddp: worker %d of generation %llu has no address", i,
                                        (unsigned long long)d->next_generation);
    if (!st) {
        ts_comm_config cfg = {.rank = index, .size = world, .generation = d->next_generation,
                              .timeout_ms = (int)info.heartbeat_timeout_ms, .peers = peers, .native = d->port};
        d->comm = ts_comm_create(&ts_comm_ring_backend, &cfg);
        if (!d->comm) st = ts_last_status();
    }
    free(peers);
    if (st) return st;
    ts_group before = d->base.group;
    d->base.group = (ts_group){.rank = index, .world = world, .generation = d->next_generation, .leader = index == 0};
    d->pending = false;
    if (before.generation)
        printf("generation %llu: world size %d -> %d workers\n", (unsigned long long)d->next_generation, before.world,
               world);
    return TS_OK;
}

/* The MPI communicator of a job started by mpirun (one generation). */
static ts_status regroup_mpi(ddp_strategy *d) {
    if (d->base.group.generation)
        return ts_error(TS_ERR_UNSUPPORTED, "ddp: the workers of a job started by mpirun changed (generation %llu); "
                                            "mpirun jobs keep their size", (unsigned long long)d->next_generation);
    int rank = 0, size = 1;
    ts_status st = ts_comm_mpi_place(d->mpi_comm, &rank, &size);
    if (st) return st;
    ts_member_info info;
    ts_member_info_get(d->base.member, &info);
    ts_comm_config cfg = {.rank = rank, .size = size, .generation = 1,
                          .timeout_ms = (int)info.heartbeat_timeout_ms, .native = d->mpi_comm};
    const ts_comm_backend *be = ts_comm_backend_find("mpi");
    d->comm = be ? ts_comm_create(be, &cfg) : NULL;
    if (!d->comm) return ts_last_status();
    d->base.group = (ts_group){.rank = rank, .world = size, .generation = 1, .leader = rank == 0};
    d->pending = false;
    return TS_OK;
}

/* Abandons what the current communicator still does and frees it. */
static void drop_comm(ddp_strategy *d) {
    if (!d->comm) return;
    ts_comm_abort(d->comm);
    if (d->buckets) ts_buckets_drop(d->buckets);
    ts_comm_free(d->comm);
    d->comm = NULL;
}

/* Leaves the current generation and starts the pending one: a new
 * communicator, rank 0's state, the data re-sharded. A failure on the way
 * waits for the generation after and tries again. */
static ts_status regroup(ddp_strategy *d) {
    for (;;) {
        drop_comm(d);
        ts_status st = d->mpi_comm ? regroup_mpi(d) : regroup_ring(d);
        if (!st) st = sync_state(d);
        if (!st) st = ts_trainer_follow_group(d->base.trainer);
        if (!st || d->mpi_comm) return st;
        fprintf(stderr, "generation %llu: %s; waiting for the next one\n", (unsigned long long)d->next_generation,
                ts_last_error());
        look(d);
        if ((st = await_generation(d)) || d->base.finished) return st;
    }
}

/* ---- buckets ---- */

/* A bucket's wait: finish, looking for a new generation. */
static ts_status bucket_wait(void *ctx, ts_comm_req *req) { return finish(ctx, req); }

/* ---- the hooks ---- */

static ts_status ddp_attach(ts_strategy *s) {
    ddp_strategy *d = (ddp_strategy *)s;
    const ts_job_parallel *p = &s->trainer->job.parallel;
    if (!(d->buckets = ts_buckets_new(s->trainer->model, p->bucket_mb, p->wire_dtype == TS_WIRE_BF16)))
        return ts_last_status();
    ts_status st;
    if (!d->mpi_comm) {
        st = ts_member_roster(s->member, &d->next_roster, &d->next_n, &d->next_generation);
        ts_member_poll_membership(s->member, NULL, NULL, NULL); /* the join's own generation */
        if (st) return st;
    }
    d->pending = true;
    return regroup(d);
}

static ts_status ddp_begin_step(ts_strategy *s, int64_t step) {
    (void)step;
    ddp_strategy *d = (ddp_strategy *)s;
    if (ts_member_shutdown_requested(s->member, NULL, NULL, 0)) {
        s->finished = true;
        return TS_OK;
    }
    look(d);
    d->in_step = false;
    ts_status st = d->pending ? regroup(d) : TS_OK;
    d->in_step = true;
    d->step_start = ts_loader_position(s->trainer->loader);
    return st;
}

static ts_status ddp_grads_ready(ts_strategy *s, int64_t offset, int64_t len) {
    ddp_strategy *d = (ddp_strategy *)s;
    return ts_buckets_ready(d->buckets, d->comm, ts_f32(s->trainer->model->flat_grads), offset, len,
                            s->trainer->step + 1);
}

/* One try at the step's gradients, averaged over the workers, and its
 * loss and sample count summed over them. The time spent waiting after
 * backward - communication that compute did not hide - is the step's
 * wait_ms. */
static ts_status try_step(ddp_strategy *d, double *loss, int64_t *samples) {
    ts_buckets_reset(d->buckets);
    ts_status st = ts_trainer_grads(d->base.trainer, loss, samples);
    double t0 = ts_clock_ms();
    ts_status waited = ts_buckets_wait(d->buckets, ts_f32(d->base.trainer->model->flat_grads), bucket_wait, d);
    if (st) return st;
    if (waited) return waited;
    double sums[2] = {*loss, (double)*samples};
    ts_comm_op op = {.kind = TS_COMM_ALLREDUCE, .send = sums, .recv = sums, .count = 2, .dtype = TS_F64,
                     .op = TS_REDUCE_SUM, .step = d->base.trainer->step + 1};
    ts_comm_req *req;
    st = ts_comm_start(d->comm, &op, &req);
    if (!st) st = finish(d, req);
    d->base.times.wait_ms += ts_clock_ms() - t0;
    *loss = sums[0] / d->base.group.world;
    *samples = (int64_t)sums[1];
    return st;
}

static ts_status ddp_grads(ts_strategy *s, double *loss, int64_t *samples) {
    ddp_strategy *d = (ddp_strategy *)s;
    for (;;) {
        ts_status st = try_step(d, loss, samples);
        if (!st || d->mpi_comm) return st;
        if (!d->pending && (st == TS_ERR_SHAPE || st == TS_ERR_DTYPE || st == TS_ERR_MEMORY)) return st;
        fprintf(stderr, "step %lld abandoned: %s\n", (long long)s->trainer->step + 1, ts_last_error());
        if ((st = await_generation(d)) || s->finished) return st;
        if ((st = regroup(d))) return st;
        if (s->trainer->step >= s->trainer->total_steps) return TS_OK;
    }
}

static ts_status ddp_reduce_sums(ts_strategy *s, double *v, int n) {
    ddp_strategy *d = (ddp_strategy *)s;
    return ts_comm_allreduce(d->comm, v, v, n, TS_F64, TS_REDUCE_SUM);
}

static ts_status ddp_end_step(ts_strategy *s, int64_t step) {
    ((ddp_strategy *)s)->in_step = false;
    return ts_member_step_done(s->member, step);
}

/* The leader keeps the run's checkpoints (every worker holds the same). */
static ts_status ddp_save(ts_strategy *s, char *path, size_t cap) {
    if (s->group.leader) return ts_strategy_save_whole(s, path, cap);
    if (cap) path[0] = '\0';
    return TS_OK;
}

static void ddp_free(ts_strategy *s) {
    ddp_strategy *d = (ddp_strategy *)s;
    drop_comm(d);
    ts_ring_port_close(d->port);
    ts_buckets_free(d->buckets);
    free(d->next_roster);
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
    .free = ddp_free,
};

ts_strategy *ts_strategy_ddp_new(const ts_strategy_options *o) {
    ddp_strategy *d = calloc(1, sizeof *d);
    if (!d) {
        ts_error(TS_ERR_MEMORY, "strategy ddp: out of memory");
        return NULL;
    }
    d->base.ops = &ddp_ops;
    /* the loader is made before the join: shard it for the job's workers
     * (its steps per epoch), attach takes the live group */
    d->base.group = (ts_group){.rank = 0, .world = o->job->parallel.workers};
    d->mpi_comm = o->mpi_comm;
    if (!d->mpi_comm) {
        if (!(d->port = ts_ring_port_for_job(o->job, o->key_file, "ddp"))) {
            free(d);
            return NULL;
        }
        snprintf(d->base.address, sizeof d->base.address, "%s", ts_ring_port_endpoint(d->port));
    }
    return &d->base;
}
