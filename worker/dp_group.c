/* dp_group.c - generations and communicators of the all-reduce strategies. */
#include "worker/dp_group.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "collective/mpi.h"
#include "kernels/clock.h"
#include "kernels/ops/backend.h"
#include "worker/trainer.h"

/* How often a waiting worker looks for a new generation (ms). */
#define LOOK_MS 20
/* The longest tick of the scheduler's liveness check (scheduler/server.c). */
#define REGROUP_TICK_MS 250

ts_status ts_dp_group_open(ts_dp_group *g, ts_strategy *s, const char *what, const ts_strategy_options *o,
                           const ts_dp_group_hooks *hooks) {
    *g = (ts_dp_group){.s = s, .what = what, .mpi_comm = o->mpi_comm, .hooks = *hooks};
    /* the loader is made before the join: shard it for the job's workers
     * (its steps per epoch), the first generation takes the live group */
    s->group = (ts_group){.rank = 0, .world = ts_strategy_data_world(o->job)};
    const char *fault = getenv("TESSERA_FAULT");
    long long k;
    g->split_at = fault && sscanf(fault, "sums_split@%lld", &k) == 1 && k > 0 ? k : -1;
    g->exit_at = fault && sscanf(fault, "leader_exit@%lld", &k) == 1 && k > 0 ? k : -1;
    g->save_exit_at = fault && sscanf(fault, "save_exit@%lld", &k) == 1 && k > 0 ? k : -1;
    if (g->mpi_comm) return TS_OK;
    if (!(g->port = ts_ring_port_for_job(o->job, o->key_file, what))) return ts_last_status();
    snprintf(s->address, sizeof s->address, "%s", ts_ring_port_endpoint(g->port));
    return TS_OK;
}

void ts_dp_group_close(ts_dp_group *g) {
    ts_dp_group_drop(g);
    ts_ring_port_close(g->port);
    ts_tensor_release(g->stage);
    free(g->next_roster);
    g->port = NULL;
    g->stage = NULL;
    g->next_roster = NULL;
}

/* Takes the join's roster as the pending generation. */
static ts_status first_generation(ts_dp_group *g) {
    if (!g->mpi_comm) {
        ts_status st = ts_member_roster(g->s->member, &g->next_roster, &g->next_n, &g->next_generation);
        ts_member_poll_membership(g->s->member, NULL, NULL, NULL); /* the join's own generation */
        if (st) return st;
    }
    g->pending = true;
    return TS_OK;
}

void ts_dp_group_look(ts_dp_group *g) {
    uint64_t gen;
    ts_proto_member *r = NULL;
    size_t n = 0;
    if (!g->s->member || !ts_member_poll_membership(g->s->member, &gen, &r, &n)) return;
    free(g->next_roster);
    g->next_roster = r;
    g->next_n = n;
    g->next_generation = gen;
    g->pending = true;
}

ts_status ts_dp_group_await(ts_dp_group *g) {
    ts_member_info info;
    ts_member_info_get(g->s->member, &info);
    double now = ts_clock_ms(), deadline = now + 2.0 * info.heartbeat_timeout_ms + info.barrier_timeout_ms;
    /* a dead peer is declared within the heartbeat timeout (and a tick of
     * the scheduler's); a peer that paused about that long is not, and
     * nobody would announce the next generation: ask for it */
    double ask_at = now + info.heartbeat_timeout_ms + info.heartbeat_ms + REGROUP_TICK_MS;
    bool asked = false;
    while (!g->pending) {
        if (ts_member_shutdown_requested(g->s->member, NULL, NULL, 0)) {
            g->s->finished = true;
            return TS_OK;
        }
        if (!asked && ts_clock_ms() > ask_at) {
            char why[128];
            snprintf(why, sizeof why, "%s: a collective of generation %llu failed and no new generation came",
                     g->what, (unsigned long long)g->s->group.generation);
            ts_status st = ts_member_ask_regroup(g->s->member, why);
            if (st) return st;
            asked = true;
        }
        if (ts_clock_ms() > deadline)
            return ts_error(TS_ERR_TIMEOUT, "%s: no new generation from the scheduler after the collective failed",
                            g->what);
        ts_sleep_ms(LOOK_MS);
        ts_dp_group_look(g);
    }
    return TS_OK;
}

ts_status ts_dp_group_finish(ts_dp_group *g, ts_comm_req *req) {
    for (;;) {
        bool done;
        ts_status st = ts_comm_wait_ms(req, LOOK_MS, &done);
        if (done) return st;
        ts_dp_group_look(g);
        if (g->pending) ts_comm_abort(g->comm);
    }
}

ts_status ts_dp_group_run(ts_dp_group *g, ts_comm_op *op) {
    ts_comm_req *req;
    ts_status st = ts_comm_start(g->comm, op, &req);
    return st ? st : ts_dp_group_finish(g, req);
}

/* The buffer a collective over `bytes` of host values v runs on: v
 * itself with the model on the CPU, or with a model on a GPU (NCCL reads
 * device memory only) the group's staging buffer there, loaded with v.
 * NULL with an error. */
static void *stage_in(ts_dp_group *g, void *v, size_t bytes) {
    ts_device d = g->s->trainer->model->device;
    if (d.type == TS_DEVICE_CPU) return v;
    if (!g->stage || ts_tensor_nbytes(g->stage) < bytes) {
        ts_tensor_release(g->stage);
        int64_t n = (int64_t)(bytes + 7) / 8;
        if (!(g->stage = ts_tensor_empty_on(d, TS_F64, 1, &n))) return NULL;
    }
    const ts_backend *b = ts_backend_of(g->what, d);
    return b && !b->memory->upload(d.index, ts_tensor_data(g->stage), v, bytes) ? ts_tensor_data(g->stage) : NULL;
}

/* Copies a staged collective's result back into v (a no-op on the CPU). */
static ts_status stage_out(ts_dp_group *g, void *v, size_t bytes) {
    ts_device d = g->s->trainer->model->device;
    if (d.type == TS_DEVICE_CPU) return TS_OK;
    const ts_backend *b = ts_backend_of(g->what, d);
    return b ? b->memory->download(d.index, v, ts_tensor_data(g->stage), bytes) : ts_last_status();
}

ts_status ts_dp_group_run_host(ts_dp_group *g, ts_comm_op *op) {
    void *host = op->recv;
    size_t bytes = (size_t)op->count * ts_dtype_size(op->dtype);
    void *buf = stage_in(g, host, bytes);
    if (!buf) return ts_last_status();
    op->send = op->recv = buf;
    ts_status st = ts_dp_group_run(g, op);
    return st ? st : stage_out(g, host, bytes);
}

ts_status ts_dp_group_sums(ts_dp_group *g, double *v, int n) {
    ts_comm_op op = {.kind = TS_COMM_ALLREDUCE, .send = v, .recv = v, .count = n, .dtype = TS_F64,
                     .op = TS_REDUCE_SUM, .step = g->s->trainer->step};
    return ts_dp_group_run_host(g, &op);
}

/* The operation of a regroup's collective (ts_dp_group_meet). */
static ts_comm_op meet_op(ts_dp_group *g, ts_comm_kind kind, const void *send, void *recv, int64_t count,
                          ts_dtype dt) {
    ts_member_info info;
    ts_member_info_get(g->s->member, &info);
    return (ts_comm_op){.kind = kind, .send = send, .recv = recv, .count = count, .dtype = dt, .peer = 0,
                        .op = TS_REDUCE_SUM, .step = g->s->trainer->step, .timeout_ms = (int)info.barrier_timeout_ms};
}

ts_status ts_dp_group_meet(ts_dp_group *g, ts_comm_kind kind, const void *send, void *recv, int64_t count,
                           ts_dtype dt) {
    ts_comm_op op = meet_op(g, kind, send, recv, count, dt);
    return ts_dp_group_run(g, &op);
}

/* The rank furthest on: a maximum over every rank's (step, reversed rank). */
ts_status ts_dp_group_furthest(ts_dp_group *g, int *root) {
    int world = g->s->group.world;
    /* exact in f64 below 2^53 */
    double key = (double)g->s->trainer->step * world + (world - 1 - g->s->group.rank);
    ts_comm_op op = meet_op(g, TS_COMM_ALLREDUCE, &key, &key, 1, TS_F64);
    op.op = TS_REDUCE_MAX;
    ts_status st = ts_dp_group_run_host(g, &op);
    if (!st) *root = world - 1 - (int)((int64_t)key % world);
    return st;
}

/* A regroup's broadcast from root, staged or not. */
ts_status ts_dp_group_broadcast(ts_dp_group *g, int root, void *buf, int64_t count, ts_dtype dt, bool host) {
    ts_comm_op op = meet_op(g, TS_COMM_BROADCAST, buf, buf, count, dt);
    op.peer = root;
    return host ? ts_dp_group_run_host(g, &op) : ts_dp_group_run(g, &op);
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

/* The ring (or NCCL) communicator of the pending generation. */
static ts_status start_ring(ts_dp_group *g) {
    const char **peers = calloc(g->next_n + 1, sizeof *peers);
    if (!peers) return ts_error(TS_ERR_MEMORY, "%s: out of memory for %zu peers", g->what, g->next_n);
    ts_member_info info;
    ts_member_info_get(g->s->member, &info);
    int index, world = live_workers(g->next_roster, g->next_n, info.rank, peers, &index);
    unsigned long long gen = (unsigned long long)g->next_generation;
    ts_status st = TS_OK;
    if (world == 0) st = ts_error(TS_ERR_MEMORY, "%s: out of memory reading generation %llu", g->what, gen);
    else if (index < 0) st = ts_error(TS_ERR_STATE, "%s: generation %llu does not list this worker (rank %d)",
                                      g->what, gen, info.rank);
    for (int i = 0; !st && i < world; i++)
        if (!peers[i][0]) st = ts_error(TS_ERR_PEER, "%s: worker %d of generation %llu has no address", g->what, i, gen);
    if (!st) {
        ts_comm_config cfg = {.rank = index, .size = world, .generation = g->next_generation,
                              .timeout_ms = (int)info.heartbeat_timeout_ms, .peers = peers, .native = g->port};
        g->comm = ts_comm_create(g->backend, &cfg);
        if (!g->comm) st = ts_last_status();
    }
    free(peers);
    if (st) return st;
    ts_group before = g->s->group;
    g->s->group = (ts_group){.rank = index, .world = world, .generation = g->next_generation, .leader = index == 0};
    g->pending = false;
    if (before.generation)
        printf("generation %llu: world size %d -> %d workers\n", gen, before.world, world);
    return TS_OK;
}

/* The MPI communicator of a job started by mpirun (one generation). */
static ts_status start_mpi(ts_dp_group *g) {
    if (g->s->group.generation)
        return ts_error(TS_ERR_UNSUPPORTED, "%s: the workers of a job started by mpirun changed (generation %llu); "
                                            "mpirun jobs keep their size", g->what,
                        (unsigned long long)g->next_generation);
    int rank = 0, size = 1;
    ts_status st = ts_comm_mpi_place(g->mpi_comm, &rank, &size);
    if (st) return st;
    ts_member_info info;
    ts_member_info_get(g->s->member, &info);
    ts_comm_config cfg = {.rank = rank, .size = size, .generation = 1,
                          .timeout_ms = (int)info.heartbeat_timeout_ms, .native = g->mpi_comm};
    const ts_comm_backend *be = ts_comm_backend_find("mpi");
    g->comm = be ? ts_comm_create(be, &cfg) : NULL;
    if (!g->comm) return ts_last_status();
    g->s->group = (ts_group){.rank = rank, .world = size, .generation = 1, .leader = rank == 0};
    g->pending = false;
    return TS_OK;
}

void ts_dp_group_drop(ts_dp_group *g) {
    if (!g->comm) return;
    ts_comm_abort(g->comm);
    g->hooks.drop(g->s);
    ts_comm_free(g->comm);
    g->comm = NULL;
}

ts_loader_pos ts_dp_group_position(const ts_dp_group *g) {
    return g->in_step ? g->step_start : ts_loader_position(g->s->trainer->loader);
}

ts_status ts_dp_group_regroup(ts_dp_group *g) {
    for (;;) {
        ts_dp_group_drop(g);
        ts_status st = g->mpi_comm ? start_mpi(g) : start_ring(g);
        if (!st) st = g->hooks.agree(g->s);
        if (!st) st = ts_trainer_follow_group(g->s->trainer);
        /* the evaluation pass of each rank: a pass is redone when all
         * were in it (ts_dp_group_recover) */
        double votes[2] = {g->pass, -g->pass};
        ts_comm_op op = meet_op(g, TS_COMM_ALLREDUCE, votes, votes, 2, TS_F64);
        op.op = TS_REDUCE_MAX;
        if (!st) st = ts_dp_group_run_host(g, &op);
        g->most_pass = st ? 0 : (int)votes[0];
        g->least_pass = st ? 0 : (int)-votes[1];
        if (!st || g->mpi_comm) return st;
        fprintf(stderr, "generation %llu: %s; waiting for the next one\n", (unsigned long long)g->next_generation,
                ts_last_error());
        ts_dp_group_look(g);
        if ((st = ts_dp_group_await(g)) || g->s->finished) return st;
    }
}

ts_status ts_dp_group_attach(ts_dp_group *g) {
    ts_device d = g->s->trainer->model->device;
    g->backend = &ts_comm_ring_backend;
    if (d.type != TS_DEVICE_CPU && g->mpi_comm)
        return ts_error(TS_ERR_UNSUPPORTED, "%s: a model on %s under mpirun is not supported yet (NCCL bootstraps "
                                            "over the workers' ring ports: start the job with tessera-run)",
                        g->what, ts_device_name(d));
    if (d.type != TS_DEVICE_CPU && !(g->backend = ts_comm_backend_find("nccl")))
        return ts_error(ts_last_status(), "%s: a model on %s: %s", g->what, ts_device_name(d), ts_last_error());
    ts_status st = first_generation(g);
    return st ? st : ts_dp_group_regroup(g);
}

/* Exits for TESSERA_FAULT (ts_dp_group_fault), once the chunks this rank
 * queued have gone out: the step it took is taken by its peers too. (A
 * bare _exit may lose the last chunk of the step's collective in the
 * ZeroMQ I/O thread, and a slower peer then fails the step instead.) */
static void fault_exit(ts_dp_group *g) {
    printf("%s: TESSERA_FAULT: rank %d exits after step %lld\n", g->what, g->s->group.rank,
           (long long)g->s->trainer->step);
    fflush(stdout);
    ts_dp_group_close(g);
    _exit(3);
}

ts_status ts_dp_group_fault(ts_dp_group *g) {
    const ts_group *r = &g->s->group;
    int64_t taken = g->s->trainer->step;
    if (g->split_at < 0 || r->world < 3 || r->rank != 0 || taken + 1 != g->split_at) return TS_OK;
    g->split_at = -1;
    return ts_error(TS_ERR_PEER, "%s: TESSERA_FAULT: rank 0 drops its sums of step %lld", g->what,
                    (long long)taken + 1);
}

void ts_dp_group_save_fault(ts_dp_group *g) {
    const ts_group *r = &g->s->group;
    if (g->s->trainer->step == g->save_exit_at && r->world >= 3 && r->rank == r->world - 1) fault_exit(g);
}

ts_status ts_dp_group_begin_step(ts_dp_group *g) {
    const ts_group *r = &g->s->group;
    if (g->split_at >= 0 && r->world >= 3 && r->rank == r->world - 1 && g->s->trainer->step == g->split_at)
        fault_exit(g);
    if (ts_member_shutdown_requested(g->s->member, NULL, NULL, 0)) {
        g->s->finished = true;
        return TS_OK;
    }
    ts_dp_group_look(g);
    g->in_step = false;
    ts_status st = g->pending ? ts_dp_group_regroup(g) : TS_OK;
    g->in_step = true;
    g->step_start = ts_loader_position(g->s->trainer->loader);
    g->sent_at_start = ts_comm_sent_bytes(g->comm);
    return st;
}

/* Whether an operation that failed with st is worth redoing in the next
 * generation: a peer's failure, not this process's own. */
static bool peers_failure(const ts_dp_group *g, ts_status st) {
    return !g->mpi_comm && (g->pending || (st != TS_ERR_SHAPE && st != TS_ERR_DTYPE && st != TS_ERR_MEMORY));
}

/* Waits for the next generation and takes part in it, voting the
 * evaluation pass this rank was in (0: none). */
static ts_status rejoin(ts_dp_group *g, int pass) {
    ts_status st = ts_dp_group_await(g);
    if (st || g->s->finished) return st;
    g->pass = pass;
    st = ts_dp_group_regroup(g);
    g->pass = 0;
    return st;
}

ts_status ts_dp_group_recover(ts_dp_group *g, ts_status failed, bool test, bool *again) {
    *again = false;
    if (!peers_failure(g, failed)) return failed;
    int pass = test ? 2 : 1;
    ts_status st = rejoin(g, pass);
    const ts_trainer *t = g->s->trainer;
    bool last = t->step >= t->total_steps;
    *again = !st && !g->s->finished && pass == g->most_pass && (g->least_pass == pass || last);
    return st;
}

ts_status ts_dp_group_grads(ts_dp_group *g, double *loss, int64_t *samples) {
    ts_trainer *t = g->s->trainer;
    for (;;) {
        ts_status st = g->hooks.try_step(g->s, loss, samples);
        if (!st || !peers_failure(g, st)) return st;
        fprintf(stderr, "step %lld abandoned: %s\n", (long long)t->step + 1, ts_last_error());
        if ((st = rejoin(g, 0)) || g->s->finished) return st;
        if (t->step >= t->total_steps) return TS_OK;
    }
}

ts_status ts_dp_group_end_step(ts_dp_group *g, int64_t step) {
    g->in_step = false;
    if (step == g->exit_at && g->s->group.rank == 0) fault_exit(g);
    uint64_t now = ts_comm_sent_bytes(g->comm);
    if (now >= g->sent_at_start) g->s->times.sent_bytes = now - g->sent_at_start; /* one communicator all step */
    return ts_strategy_step_done(g->s, step);
}
