/* comm.c - the communicator's generic layer: checks, the progress thread
 * that runs queued operations in order, and the reference reductions. */
#include "collective/comm.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "collective/mpi.h"
#include "collective/nccl.h"
#include "collective/ring.h"

struct ts_comm_req {
    ts_comm *comm;
    ts_comm_op op;
    ts_comm_req *next;
    bool done;
    ts_status status;
    char message[1024];
};

struct ts_comm {
    const ts_comm_backend *be;
    ts_comm_config cfg;
    char **peers;      /* cfg.peers, copied */
    char *key_file;    /* cfg.key_file, copied */
    void *impl;
    pthread_mutex_t mu;
    pthread_cond_t cv;        /* queue changed or an operation ended */
    ts_comm_req *head, *tail; /* queued, not yet running */
    int in_flight;            /* queued or running */
    bool stopping, thread_started;
    _Atomic bool aborted;
    _Atomic uint64_t sent;    /* payload bytes the backend counted */
    pthread_t thread;
    ts_status failed;         /* sticky: the first failure */
    char failed_message[1024];
};

static const ts_comm_backend *const backends[] = {
    &ts_comm_self_backend,
    &ts_comm_ring_backend,
#if TESSERA_WITH_MPI
    &ts_comm_mpi_backend,
#endif
#if TESSERA_WITH_NCCL
    &ts_comm_nccl_backend,
#endif
};

enum { N_BACKENDS = sizeof backends / sizeof backends[0] };

const ts_comm_backend *ts_comm_backend_find(const char *name) {
    char list[256] = "";
    for (int i = 0; i < N_BACKENDS; i++) {
        if (strcmp(backends[i]->name, name) == 0) return backends[i];
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", backends[i]->name);
    }
    ts_error(TS_ERR_UNSUPPORTED, "communicator: no backend \"%s\" in this build (it has %s)", name, list);
    return NULL;
}

const char *ts_comm_kind_name(ts_comm_kind k) {
    static const char *names[] = {"allreduce", "reduce_scatter", "allgather", "broadcast", "send", "recv", "barrier"};
    return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "unknown";
}

/* ---- making and freeing ---- */

static void free_comm(ts_comm *c) {
    if (c->peers)
        for (int i = 0; i < c->cfg.size; i++) free(c->peers[i]);
    free(c->peers);
    free(c->key_file);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}

/* Copies cfg's strings into c. */
static ts_status copy_config(ts_comm *c, const ts_comm_config *cfg) {
    c->cfg = *cfg;
    if (c->cfg.timeout_ms <= 0) c->cfg.timeout_ms = 30000;
    if (cfg->key_file && !(c->key_file = strdup(cfg->key_file)))
        return ts_error(TS_ERR_MEMORY, "communicator: out of memory");
    c->cfg.key_file = c->key_file;
    if (!cfg->peers) return TS_OK;
    if (!(c->peers = calloc((size_t)cfg->size, sizeof *c->peers)))
        return ts_error(TS_ERR_MEMORY, "communicator: out of memory for %d peers", cfg->size);
    for (int i = 0; i < cfg->size; i++)
        if (!cfg->peers[i] || !(c->peers[i] = strdup(cfg->peers[i])))
            return ts_error(cfg->peers[i] ? TS_ERR_MEMORY : TS_ERR_VALUE, "communicator: %s for the endpoint of rank %d",
                            cfg->peers[i] ? "out of memory" : "no address", i);
    c->cfg.peers = (const char *const *)c->peers;
    return TS_OK;
}

ts_comm *ts_comm_create(const ts_comm_backend *be, const ts_comm_config *cfg) {
    if (!be) return NULL; /* ts_comm_backend_find said why */
    if (cfg->size < 1 || cfg->rank < 0 || cfg->rank >= cfg->size) {
        ts_error(TS_ERR_VALUE, "communicator %s: rank %d is not in a world of %d", be->name, cfg->rank, cfg->size);
        return NULL;
    }
    ts_comm *c = calloc(1, sizeof *c);
    if (!c) {
        ts_error(TS_ERR_MEMORY, "communicator: out of memory");
        return NULL;
    }
    c->be = be;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    ts_status st = copy_config(c, cfg);
    if (!st) st = be->open(c);
    if (st) {
        free_comm(c);
        return NULL;
    }
    return c;
}

void ts_comm_free(ts_comm *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    while (c->in_flight) pthread_cond_wait(&c->cv, &c->mu);
    c->stopping = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (c->thread_started) pthread_join(c->thread, NULL);
    c->be->close(c);
    free_comm(c);
}

int ts_comm_rank(const ts_comm *c) { return c->cfg.rank; }
int ts_comm_size(const ts_comm *c) { return c->cfg.size; }
uint64_t ts_comm_generation(const ts_comm *c) { return c->cfg.generation; }
const ts_comm_config *ts_comm_config_of(const ts_comm *c) { return &c->cfg; }
void *ts_comm_impl(const ts_comm *c) { return c->impl; }
bool ts_comm_aborted(const ts_comm *c) { return c->aborted; }

void ts_comm_abort(ts_comm *c) {
    pthread_mutex_lock(&c->mu);
    c->aborted = true;
    if (!c->failed) {
        c->failed = TS_ERR_STATE;
        snprintf(c->failed_message, sizeof c->failed_message, "abandoned (generation %llu)",
                 (unsigned long long)c->cfg.generation);
    }
    pthread_mutex_unlock(&c->mu);
}
void ts_comm_set_impl(ts_comm *c, void *impl) { c->impl = impl; }

/* ---- checks ---- */

/* "allreduce" or "allreduce (step 12)" into buf. */
static const char *op_label(const ts_comm_op *op, char *buf, size_t cap) {
    if (op->step >= 0)
        snprintf(buf, cap, "%s (step %lld)", ts_comm_kind_name(op->kind), (long long)op->step);
    else
        snprintf(buf, cap, "%s", ts_comm_kind_name(op->kind));
    return buf;
}

static bool reducible(ts_dtype dt) { return dt == TS_F32 || dt == TS_F64 || dt == TS_BF16; }

/* The checks every backend may rely on. */
static ts_status check_op(const ts_comm *c, const ts_comm_op *op) {
    char what[64];
    if ((unsigned)op->kind > TS_COMM_BARRIER) return ts_error(TS_ERR_VALUE, "communicator: unknown operation %d", op->kind);
    op_label(op, what, sizeof what);
    if (op->kind == TS_COMM_BARRIER) return TS_OK;
    if (op->count < 0) return ts_error(TS_ERR_VALUE, "%s: count %lld is negative", what, (long long)op->count);
    if ((unsigned)op->dtype >= TS_NDTYPES) return ts_error(TS_ERR_DTYPE, "%s: unknown dtype %d", what, op->dtype);
    int64_t esize = (int64_t)ts_dtype_size(op->dtype), world = c->cfg.size;
    if (op->count > INT64_MAX / world / esize)
        return ts_error(TS_ERR_VALUE, "%s: %lld elements of %s from %d ranks overflow a byte count", what,
                        (long long)op->count, ts_dtype_name(op->dtype), c->cfg.size);
    bool reduces = op->kind == TS_COMM_ALLREDUCE || op->kind == TS_COMM_REDUCE_SCATTER;
    if (reduces && !reducible(op->dtype))
        return ts_error(TS_ERR_DTYPE, "%s: cannot reduce %s (f32, f64 and bf16 reduce)", what, ts_dtype_name(op->dtype));
    if (reduces && (unsigned)op->op > TS_REDUCE_MAX)
        return ts_error(TS_ERR_VALUE, "%s: unknown reduction %d (sum, avg or max)", what, op->op);
    bool needs_send = op->kind != TS_COMM_RECV && op->kind != TS_COMM_BROADCAST;
    bool needs_recv = op->kind != TS_COMM_SEND;
    if (op->count > 0 && ((needs_send && !op->send) || (needs_recv && !op->recv)))
        return ts_error(TS_ERR_VALUE, "%s: no %s buffer for %lld elements", what,
                        needs_send && !op->send ? "send" : "receive", (long long)op->count);
    bool pairwise = op->kind == TS_COMM_SEND || op->kind == TS_COMM_RECV;
    if ((pairwise || op->kind == TS_COMM_BROADCAST) && (op->peer < 0 || op->peer >= c->cfg.size))
        return ts_error(TS_ERR_VALUE, "%s: %s %d is not a rank of this communicator of %d", what,
                        pairwise ? "peer" : "root", op->peer, c->cfg.size);
    if (pairwise && op->peer == c->cfg.rank)
        return ts_error(TS_ERR_VALUE, "%s: peer %d is this rank itself", what, op->peer);
    return TS_OK;
}

/* ---- the progress thread ---- */

static void *progress_main(void *arg) {
    ts_comm *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->head && !c->stopping) pthread_cond_wait(&c->cv, &c->mu);
        if (!c->head) break;
        ts_comm_req *r = c->head;
        c->head = r->next;
        if (!c->head) c->tail = NULL;
        ts_status failed = c->failed;
        pthread_mutex_unlock(&c->mu);
        char what[64];
        op_label(&r->op, what, sizeof what);
        if (failed) {
            r->status = failed;
            snprintf(r->message, sizeof r->message, "%s: the communicator failed earlier: %.900s", what,
                     c->failed_message);
        } else {
            ts_clear_error();
            r->status = c->be->run(c, &r->op);
            if (r->status) snprintf(r->message, sizeof r->message, "%s: %.900s", what, ts_last_error());
        }
        pthread_mutex_lock(&c->mu);
        if (r->status && !c->failed) {
            c->failed = r->status;
            snprintf(c->failed_message, sizeof c->failed_message, "%s", r->message);
        }
        r->done = true;
        c->in_flight--;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

ts_status ts_comm_start(ts_comm *c, const ts_comm_op *op, ts_comm_req **req) {
    *req = NULL;
    ts_status st = check_op(c, op);
    if (st) return st;
    ts_comm_req *r = calloc(1, sizeof *r);
    if (!r) return ts_error(TS_ERR_MEMORY, "%s: out of memory", ts_comm_kind_name(op->kind));
    r->comm = c;
    r->op = *op;
    pthread_mutex_lock(&c->mu);
    if (!c->thread_started && pthread_create(&c->thread, NULL, progress_main, c) == 0) c->thread_started = true;
    if (!c->thread_started) {
        pthread_mutex_unlock(&c->mu);
        free(r);
        return ts_error(TS_ERR_MEMORY, "%s: cannot start the communicator's progress thread",
                        ts_comm_kind_name(op->kind));
    }
    if (c->tail) c->tail->next = r;
    else c->head = r;
    c->tail = r;
    c->in_flight++;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    *req = r;
    return TS_OK;
}

ts_status ts_comm_wait(ts_comm_req *r) {
    ts_comm *c = r->comm;
    pthread_mutex_lock(&c->mu);
    while (!r->done) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    ts_status st = r->status;
    if (st) ts_error(st, "%s", r->message);
    free(r);
    return st;
}

ts_status ts_comm_wait_ms(ts_comm_req *r, int ms, bool *done) {
    ts_comm *c = r->comm;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    long long ns = until.tv_nsec + (long long)ms * 1000000LL;
    until.tv_sec += (time_t)(ns / 1000000000LL);
    until.tv_nsec = (long)(ns % 1000000000LL);
    pthread_mutex_lock(&c->mu);
    while (!r->done && pthread_cond_timedwait(&c->cv, &c->mu, &until) == 0) {
    }
    *done = r->done;
    pthread_mutex_unlock(&c->mu);
    return *done ? ts_comm_wait(r) : TS_OK;
}

ts_status ts_comm_run(ts_comm *c, const ts_comm_op *op) {
    ts_comm_req *r;
    ts_status st = ts_comm_start(c, op, &r);
    return st ? st : ts_comm_wait(r);
}

/* ---- the blocking forms ---- */

ts_status ts_comm_allreduce(ts_comm *c, const void *send, void *recv, int64_t count, ts_dtype dt,
                            ts_reduce_op op) {
    ts_comm_op o = {.kind = TS_COMM_ALLREDUCE, .send = send, .recv = recv, .count = count, .dtype = dt, .op = op,
                    .step = -1};
    return ts_comm_run(c, &o);
}

ts_status ts_comm_reduce_scatter(ts_comm *c, const void *send, void *recv, int64_t count, ts_dtype dt,
                                 ts_reduce_op op) {
    ts_comm_op o = {.kind = TS_COMM_REDUCE_SCATTER, .send = send, .recv = recv, .count = count, .dtype = dt,
                    .op = op, .step = -1};
    return ts_comm_run(c, &o);
}

ts_status ts_comm_allgather(ts_comm *c, const void *send, void *recv, int64_t count, ts_dtype dt) {
    ts_comm_op o = {.kind = TS_COMM_ALLGATHER, .send = send, .recv = recv, .count = count, .dtype = dt, .step = -1};
    return ts_comm_run(c, &o);
}

ts_status ts_comm_broadcast(ts_comm *c, void *buf, int64_t count, ts_dtype dt, int root) {
    ts_comm_op o = {.kind = TS_COMM_BROADCAST, .send = buf, .recv = buf, .count = count, .dtype = dt, .peer = root,
                    .step = -1};
    return ts_comm_run(c, &o);
}

ts_status ts_comm_send(ts_comm *c, const void *buf, int64_t count, ts_dtype dt, int peer) {
    ts_comm_op o = {.kind = TS_COMM_SEND, .send = buf, .count = count, .dtype = dt, .peer = peer, .step = -1};
    return ts_comm_run(c, &o);
}

ts_status ts_comm_recv(ts_comm *c, void *buf, int64_t count, ts_dtype dt, int peer) {
    ts_comm_op o = {.kind = TS_COMM_RECV, .recv = buf, .count = count, .dtype = dt, .peer = peer, .step = -1};
    return ts_comm_run(c, &o);
}

ts_status ts_comm_barrier(ts_comm *c) {
    ts_comm_op o = {.kind = TS_COMM_BARRIER, .dtype = TS_U8, .step = -1};
    return ts_comm_run(c, &o);
}

/* ---- reference reductions ---- */

void ts_comm_reduce_into(void *dst, const void *src, int64_t n, ts_dtype dt, ts_reduce_op op) {
    bool max = op == TS_REDUCE_MAX;
    if (dt == TS_F32) {
        float *d = dst;
        const float *s = src;
        for (int64_t i = 0; i < n; i++) d[i] = max ? (s[i] > d[i] ? s[i] : d[i]) : d[i] + s[i];
    } else if (dt == TS_F64) {
        double *d = dst;
        const double *s = src;
        for (int64_t i = 0; i < n; i++) d[i] = max ? (s[i] > d[i] ? s[i] : d[i]) : d[i] + s[i];
    } else {
        uint16_t *d = dst;
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++) {
            float a = ts_f32_from_bf16(d[i]), b = ts_f32_from_bf16(s[i]);
            d[i] = ts_bf16_from_f32(max ? (b > a ? b : a) : a + b);
        }
    }
}

void ts_comm_finish_avg(void *buf, int64_t n, ts_dtype dt, int size) {
    if (dt == TS_F32) {
        float *b = buf;
        for (int64_t i = 0; i < n; i++) b[i] /= (float)size;
    } else if (dt == TS_F64) {
        double *b = buf;
        for (int64_t i = 0; i < n; i++) b[i] /= size;
    } else {
        uint16_t *b = buf;
        for (int64_t i = 0; i < n; i++) b[i] = ts_bf16_from_f32(ts_f32_from_bf16(b[i]) / (float)size);
    }
}

uint64_t ts_comm_sent_bytes(const ts_comm *c) { return c ? c->sent : 0; }

void ts_comm_count_sent(ts_comm *c, uint64_t bytes) { c->sent += bytes; }
