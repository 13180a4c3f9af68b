/* comm_ring.c - backend "ring": collectives over ZeroMQ (see ring.h).
 *
 * An operation becomes a plan: for each flow (the ring towards the next
 * rank, the ring towards the previous one, or a pair's stream) the chunks
 * it sends, each waiting for the received chunk it forwards, and the chunks
 * it receives, in order, each reduced into or copied to the working buffer.
 * One loop runs every flow of the plan: it sends what is ready without
 * blocking, then waits on the port (and on full send queues and the peers'
 * connection monitors) and applies what arrives. Chunks that belong to a
 * later operation or to another pair are kept aside until their turn.
 */
#include "collective/ring.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "kernels/clock.h"
#include "proto/secure.h"
#include "proto/wire.h"

/* How often a waiting operation looks at the abort flag (ms). */
#define POLL_SLICE_MS 50
/* Bytes of chunks of later operations kept aside before giving up. */
#define STASH_MAX_BYTES ((size_t)256 << 20)
/* Messages queued per socket before sends wait. */
#define QUEUE_MESSAGES 64
/* A closed communicator's queued chunks are still delivered this long. */
#define LINGER_MS 2000
/* What may still arrive from a peer after its connection dropped (ms). */
#define GONE_GRACE_MS 200
/* How long an operation still waits for progress once a peer has moved to
 * a newer generation (ms): the chunks that peer sent before arrived first,
 * but other peers may still be forwarding theirs. */
#define MOVED_GRACE_MS 500

enum { FLOW_NEXT = 0, FLOW_PREV = 1, FLOW_PAIR = 2 };

/* One connection to a peer's port. It lives as long as the port, across
 * generations, so that what this process sends a peer arrives in the
 * order it was sent: a new generation's chunks after the old one's. */
typedef struct {
    char endpoint[TS_PROTO_ADDR_MAX + 1];
    void *out, *mon; /* PUSH socket and the monitor of its connection */
    double gone;     /* when the connection dropped, 0: it did not */
    int users;       /* communicators holding it */
} peer_conn;

/* A chunk that arrived before its operation (or its generation), kept. */
typedef struct stashed {
    struct stashed *next;
    uint64_t generation;
    int32_t from;
    uint32_t flow;
    uint64_t seq, lo, n;
    void *data;
    size_t size;
} stashed;

struct ts_ring_port {
    void *ctx, *in;
    ts_secure_zap *zap;
    ts_secure_keys keys;
    bool curve; /* sockets CURVE-secured with keys */
    char job[TS_PROTO_JOB_MAX + 1];
    char endpoint[TS_PROTO_ADDR_MAX + 1];
    /* chunks kept for a later operation: the port outlives a generation's
     * communicator, and a peer may start the next generation first */
    stashed *stash;
    size_t stash_bytes;
    peer_conn **conns; /* the connections to peers' ports */
    int nconns, cap_conns;
};

/* ---- the port ---- */

/* Grows the arrays p[0] (elements of a bytes) and, when b > 0, p[1] (of b
 * bytes) of capacity *cap to hold need elements. */
static bool grow(void **p, int *cap, int need, size_t a, size_t b) {
    if (need <= *cap) return true;
    int cap2 = *cap ? *cap * 2 : 64;
    while (cap2 < need) cap2 *= 2;
    void *q = realloc(p[0], (size_t)cap2 * a);
    if (!q) return false;
    p[0] = q;
    if (b) {
        void *r = realloc(p[1], (size_t)cap2 * b);
        if (!r) return false;
        p[1] = r;
    }
    *cap = cap2;
    return true;
}

/* Drops the kept chunks of generations before g (all: g = UINT64_MAX). */
static void drop_kept(ts_ring_port *p, uint64_t g) {
    for (stashed **q = &p->stash; *q;) {
        stashed *x = *q;
        if (x->generation >= g) {
            q = &x->next;
            continue;
        }
        *q = x->next;
        p->stash_bytes -= x->size;
        free(x->data);
        free(x);
    }
}

/* Closes the sockets of a connection. Monitoring stops first: an event
 * sent to a closed monitor would block ZeroMQ's I/O thread for good (a
 * connection that lingers may still drop while it is reaped). */
static void conn_shut(peer_conn *l) {
    if (l->out) zmq_socket_monitor(l->out, NULL, 0);
    if (l->mon) zmq_close(l->mon);
    if (l->out) zmq_close(l->out);
    l->out = l->mon = NULL;
}

/* Closes a connection and frees it. */
static void conn_close(peer_conn *l) {
    conn_shut(l);
    free(l);
}

/* Connects l afresh to its endpoint, with a monitor that reports the
 * connection's drop. */
static ts_status conn_connect(ts_ring_port *p, peer_conn *l) {
    static _Atomic unsigned monitors; /* inproc names outlive a closing socket: never reuse one */
    char mon[64];
    snprintf(mon, sizeof mon, "inproc://ring-monitor-%u", ++monitors);
    conn_shut(l);
    l->gone = 0;
    int hwm = QUEUE_MESSAGES, zero = 0, linger = LINGER_MS;
    if (!(l->out = zmq_socket(p->ctx, ZMQ_PUSH)))
        return ts_error(TS_ERR_IO, "ring: zmq_socket: %s", zmq_strerror(zmq_errno()));
    zmq_setsockopt(l->out, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(l->out, ZMQ_LINGER, &linger, sizeof linger);
    ts_status st = p->curve ? ts_secure_client(l->out, &p->keys) : TS_OK;
    if (!st && (zmq_socket_monitor(l->out, mon, ZMQ_EVENT_DISCONNECTED) != 0 ||
                !(l->mon = zmq_socket(p->ctx, ZMQ_PAIR)) || zmq_connect(l->mon, mon) != 0))
        st = ts_error(TS_ERR_IO, "ring: cannot watch the connection to %s: %s", l->endpoint, zmq_strerror(zmq_errno()));
    if (!st) zmq_setsockopt(l->mon, ZMQ_LINGER, &zero, sizeof zero);
    if (!st && zmq_connect(l->out, l->endpoint) != 0)
        st = ts_error(TS_ERR_IO, "ring: cannot connect to %s: %s", l->endpoint, zmq_strerror(zmq_errno()));
    if (st) conn_shut(l);
    return st;
}

/* The port's connection to endpoint, opened on first use; one that
 * dropped is connected afresh (the peer may be back). */
static peer_conn *port_conn(ts_ring_port *p, const char *endpoint) {
    int i = 0;
    while (i < p->nconns && strcmp(p->conns[i]->endpoint, endpoint) != 0) i++;
    if (i == p->nconns) {
        peer_conn *l = calloc(1, sizeof *l);
        if (!l || !grow((void **)&p->conns, &p->cap_conns, p->nconns + 1, sizeof *p->conns, 0)) {
            free(l);
            ts_error(TS_ERR_MEMORY, "ring: out of memory for a connection to %s", endpoint);
            return NULL;
        }
        snprintf(l->endpoint, sizeof l->endpoint, "%s", endpoint);
        p->conns[p->nconns++] = l;
    }
    peer_conn *l = p->conns[i];
    if ((!l->out || l->gone) && conn_connect(p, l)) return NULL;
    return l;
}

/* Closes the connections no communicator holds to endpoints not among
 * peers (processes that left the job). */
static void prune_conns(ts_ring_port *p, const char *const *peers, int npeers) {
    for (int i = 0; i < p->nconns;) {
        bool wanted = p->conns[i]->users > 0;
        for (int k = 0; !wanted && peers && k < npeers; k++) wanted = strcmp(peers[k], p->conns[i]->endpoint) == 0;
        if (wanted) {
            i++;
            continue;
        }
        conn_close(p->conns[i]);
        p->conns[i] = p->conns[--p->nconns];
    }
}

ts_ring_port *ts_ring_port_open(const char *endpoint, const char *key_file, const char *job, bool curve) {
    ts_ring_port *p = calloc(1, sizeof *p);
    if (!p) {
        ts_error(TS_ERR_MEMORY, "ring port: out of memory");
        return NULL;
    }
    snprintf(p->job, sizeof p->job, "%s", job ? job : "");
    p->curve = curve;
    ts_status st = curve ? ts_secure_load(key_file ? key_file : getenv("TESSERA_KEY_FILE"), &p->keys) : TS_OK;
    if (!st && !(p->ctx = zmq_ctx_new())) st = ts_error(TS_ERR_IO, "ring port: zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
    if (!st && curve && !(p->zap = ts_secure_zap_start(p->ctx, &p->keys))) st = ts_last_status();
    if (!st && !(p->in = zmq_socket(p->ctx, ZMQ_PULL)))
        st = ts_error(TS_ERR_IO, "ring port: zmq_socket: %s", zmq_strerror(zmq_errno()));
    if (!st) {
        int hwm = QUEUE_MESSAGES, zero = 0;
        ts_proto_limits lim;
        ts_proto_limits_default(&lim);
        lim.max_frames = 1;
        lim.max_payload_bytes = TS_RING_CHUNK_BYTES;
        zmq_setsockopt(p->in, ZMQ_RCVHWM, &hwm, sizeof hwm);
        zmq_setsockopt(p->in, ZMQ_LINGER, &zero, sizeof zero);
        st = ts_proto_limit_socket(p->in, &lim);
    }
    if (!st && curve) st = ts_secure_server(p->in, &p->keys);
    if (!st && zmq_bind(p->in, endpoint) != 0)
        st = ts_error(TS_ERR_IO, "ring port: cannot bind %s: %s", endpoint, zmq_strerror(zmq_errno()));
    char bound[TS_PROTO_ADDR_MAX + 1];
    size_t len = sizeof bound;
    if (!st && zmq_getsockopt(p->in, ZMQ_LAST_ENDPOINT, bound, &len) != 0)
        st = ts_error(TS_ERR_IO, "ring port: ZMQ_LAST_ENDPOINT: %s", zmq_strerror(zmq_errno()));
    if (!st) ts_proto_public_endpoint(bound, p->endpoint, sizeof p->endpoint);
    if (st) {
        ts_ring_port_close(p);
        return NULL;
    }
    return p;
}

ts_ring_port *ts_ring_port_for_job(const ts_job *job, const char *key_file, const char *tag) {
    char ep[TS_JOB_BIND_MAX + 32];
    if (job->parallel.transport == TS_TRANSPORT_IPC)
        snprintf(ep, sizeof ep, "ipc:///tmp/tessera-%s-%d-%s.ring", job->name, (int)getpid(), tag);
    else
        snprintf(ep, sizeof ep, "tcp://%s:0", job->parallel.bind);
    bool curve = job->parallel.ring_security == TS_SECURITY_CURVE;
    if (!curve) ts_secure_warn_plain("parallel.ring_security", "the workers' collective traffic");
    return ts_ring_port_open(ep, key_file, job->name, curve);
}

const char *ts_ring_port_endpoint(const ts_ring_port *p) { return p->endpoint; }

void ts_ring_port_close(ts_ring_port *p) {
    if (!p) return;
    drop_kept(p, UINT64_MAX);
    for (int i = 0; i < p->nconns; i++) conn_close(p->conns[i]);
    free(p->conns);
    if (p->in) zmq_close(p->in);
    ts_secure_zap_stop(p->zap);
    if (p->ctx) zmq_ctx_term(p->ctx);
    free(p);
}

/* ---- a communicator's state ---- */

typedef struct {
    ts_ring_port *port;
    int rank, size;
    peer_conn **to;          /* the connection to each peer, or NULL: not used yet */
    ts_proto_limits lim;
    uint64_t coll_seq;        /* collectives run so far */
    uint64_t *sent, *recvd;   /* pair streams: messages sent to / received from each peer */
    struct {
        double at;            /* when this communicator first heard of a newer generation, 0: not */
        int rank;
        uint64_t generation;
    } moved;
} ring;

/* The wire dtype of a tensor dtype. */
static ts_proto_dtype wire_dtype(ts_dtype dt) {
    switch (dt) {
    case TS_F32: return TS_PROTO_DT_F32;
    case TS_F64: return TS_PROTO_DT_F64;
    case TS_BF16: return TS_PROTO_DT_BF16;
    case TS_I32: return TS_PROTO_DT_I32;
    case TS_I64: return TS_PROTO_DT_I64;
    default: return TS_PROTO_DT_U8;
    }
}

static const char *peer_endpoint(const ts_comm *c, int peer) {
    const ts_comm_config *cfg = ts_comm_config_of(c);
    return cfg->peers ? cfg->peers[peer] : "?";
}

/* The connection to peer, taken from the port on first use. */
static peer_conn *rank_conn(ts_comm *c, ring *rg, int peer) {
    if (rg->to[peer]) return rg->to[peer];
    peer_conn *l = port_conn(rg->port, peer_endpoint(c, peer));
    if (!l) {
        ts_error(ts_last_status(), "rank %d: %s", peer, ts_last_error());
        return NULL;
    }
    int timeout = ts_comm_config_of(c)->timeout_ms;
    zmq_setsockopt(l->out, ZMQ_SNDTIMEO, &timeout, sizeof timeout);
    l->users++;
    return rg->to[peer] = l;
}

static void ring_close(ts_comm *c) {
    ring *rg = ts_comm_impl(c);
    if (!rg) return;
    for (int i = 0; rg->to && i < rg->size; i++)
        if (rg->to[i]) rg->to[i]->users--;
    free(rg->to);
    free(rg->sent);
    free(rg->recvd);
    free(rg);
    ts_comm_set_impl(c, NULL);
}

static ts_status ring_open(ts_comm *c) {
    const ts_comm_config *cfg = ts_comm_config_of(c);
    if (!cfg->native) return ts_error(TS_ERR_VALUE, "communicator ring: no port (cfg.native)");
    if (!cfg->peers && cfg->size > 1) return ts_error(TS_ERR_VALUE, "communicator ring: no peer endpoints");
    ring *rg = calloc(1, sizeof *rg);
    if (!rg) return ts_error(TS_ERR_MEMORY, "communicator ring: out of memory");
    ts_comm_set_impl(c, rg);
    rg->port = cfg->native;
    rg->rank = cfg->rank;
    rg->size = cfg->size;
    rg->to = calloc((size_t)cfg->size, sizeof *rg->to);
    rg->sent = calloc((size_t)cfg->size, sizeof *rg->sent);
    rg->recvd = calloc((size_t)cfg->size, sizeof *rg->recvd);
    if (!rg->to || !rg->sent || !rg->recvd) {
        ring_close(c);
        return ts_error(TS_ERR_MEMORY, "communicator ring: out of memory for %d ranks", cfg->size);
    }
    ts_proto_limits_default(&rg->lim);
    rg->lim.max_frames = 1;
    rg->lim.max_payload_bytes = TS_RING_CHUNK_BYTES;
    rg->lim.max_ranges = 1;
    rg->lim.max_roster = 0;
    rg->lim.generation = cfg->generation;
    rg->lim.job = rg->port->job;
    drop_kept(rg->port, cfg->generation);
    prune_conns(rg->port, cfg->peers, cfg->size);
    /* the neighbours are connected now, so that their handshakes overlap */
    int next = (cfg->rank + 1) % cfg->size, prev = (cfg->rank + cfg->size - 1) % cfg->size;
    if (cfg->size > 1 && (!rank_conn(c, rg, next) || !rank_conn(c, rg, prev))) {
        ts_status st = ts_last_status();
        ring_close(c);
        return st;
    }
    return TS_OK;
}

/* ---- plans ---- */

typedef enum { APPLY_REDUCE, APPLY_COPY, APPLY_REDUCE_LAST } apply_kind;

typedef struct {
    int64_t lo, n; /* elements of the working buffer */
} span;

/* Chunks in order, each with a number: for a send, the receive it
 * forwards (-1: none); for a receive, its apply_kind. */
typedef struct {
    span *at;
    int *tag;
    int n, done, cap;    /* done: sent or received so far */
} chunk_list;

/* What one flow of an operation sends to `to` and receives from `from`. */
typedef struct {
    int to, from;        /* ranks, -1: none */
    uint32_t flow;
    uint64_t seq;
    chunk_list send, recv;
} flow_plan;

/* The k-th of parts balanced pieces of [lo, lo + n). */
static span piece(int64_t lo, int64_t n, int parts, int k) {
    int64_t base = n / parts, extra = n % parts;
    return (span){lo + k * base + (k < extra ? k : extra), base + (k < extra)};
}

static int chunks_of(span s, int64_t chunk) { return s.n ? (int)((s.n + chunk - 1) / chunk) : 0; }

static span chunk_at(span s, int64_t chunk, int k) {
    int64_t lo = s.lo + (int64_t)k * chunk;
    return (span){lo, s.lo + s.n - lo < chunk ? s.lo + s.n - lo : chunk};
}

/* Appends the chunks of segment s to l, chunk i numbered tag + i * step;
 * *first (may be NULL) is the index of the first. */
static ts_status add_chunks(chunk_list *l, span s, int64_t chunk, int tag, int step, int *first) {
    int k = chunks_of(s, chunk);
    void *pp[2] = {l->at, l->tag};
    if (!grow(pp, &l->cap, l->n + k, sizeof(span), sizeof(int)))
        return ts_error(TS_ERR_MEMORY, "ring: out of memory for a plan of %d chunks", l->n + k);
    l->at = pp[0];
    l->tag = pp[1];
    if (first) *first = l->n;
    for (int i = 0; i < k; i++) {
        l->at[l->n] = chunk_at(s, chunk, i);
        l->tag[l->n++] = tag + i * step;
    }
    return TS_OK;
}

/* Appends the chunks of segment s as sends; chunk k forwards receive
 * first_dep + k (first_dep < 0: none). */
static ts_status plan_send(flow_plan *f, span s, int64_t chunk, int first_dep) {
    return add_chunks(&f->send, s, chunk, first_dep < 0 ? -1 : first_dep, first_dep < 0 ? 0 : 1, NULL);
}

/* Appends the chunks of segment s as receives applied with how; returns
 * the index of the first in *first. */
static ts_status plan_recv(flow_plan *f, span s, int64_t chunk, apply_kind how, int *first) {
    return add_chunks(&f->recv, s, chunk, (int)how, 0, first);
}

/* Whether flow f has a send left whose chunk is here: one it forwards
 * was received, or it forwards none. */
static bool send_ready(const flow_plan *f) {
    if (f->send.done >= f->send.n) return false;
    int dep = f->send.tag[f->send.done];
    return dep < 0 || dep < f->recv.done;
}

static void plan_free(flow_plan *f) {
    free(f->send.at);
    free(f->send.tag);
    free(f->recv.at);
    free(f->recv.tag);
}

/* Segment s (mod N) of flow d: for flow 0 the first half of each of the
 * N blocks, for flow 1 the second half. A "block" is the rank-th of N
 * balanced pieces of [0, total) for allreduce, or a count-long block of
 * blocked operations (reduce_scatter, allgather). */
typedef struct {
    int64_t total, block; /* block > 0: blocks of that length, else balanced pieces */
    int n;
} layout;

static span segment(const layout *l, int d, int s) {
    s = ((s % l->n) + l->n) % l->n;
    span b = l->block > 0 ? (span){(int64_t)s * l->block, l->block} : piece(0, l->total, l->n, s);
    return piece(b.lo, b.n, 2, d);
}

/* The ring steps of flow d of rank r: reduce-scatter steps (rs of them,
 * N - 1 or 0) then all-gather steps (ag of them). At reduce-scatter step j
 * rank r sends segment r - j - 1 and receives r - j - 2 (towards the next
 * rank; mirrored towards the previous one), so it ends owning segment r;
 * at all-gather step i it sends r - i and receives r - i - 1. Each sent
 * segment is the one received at the step before. */
static ts_status plan_ring(flow_plan *f, const layout *l, int r, int d, bool rs, bool ag, int64_t chunk) {
    int n = l->n, sign = d == 0 ? -1 : 1, prev_first = -1;
    int steps = (rs ? n - 1 : 0) + (ag ? n - 1 : 0);
    for (int j = 0; j < steps; j++) {
        bool reducing = rs && j < n - 1;
        int i = reducing ? j : j - (rs ? n - 1 : 0); /* the step within its phase */
        int send_s = reducing ? r + sign * (i + 1) : r + sign * i;
        int recv_s = reducing ? r + sign * (i + 2) : r + sign * (i + 1);
        apply_kind how = !reducing ? APPLY_COPY : j == n - 2 ? APPLY_REDUCE_LAST : APPLY_REDUCE;
        int first;
        ts_status st = plan_send(f, segment(l, d, send_s), chunk, j == 0 ? -1 : prev_first);
        if (!st) st = plan_recv(f, segment(l, d, recv_s), chunk, how, &first);
        if (st) return st;
        prev_first = first;
    }
    return TS_OK;
}

/* Flow d of a broadcast from root: the chain root -> root+1 -> ... (flow
 * 0) or root -> root-1 -> ... (flow 1), each rank forwarding every chunk it
 * received unless its successor is the root. */
static ts_status plan_broadcast(flow_plan *f, span half, int r, int root, int64_t chunk) {
    int succ = f->to, first = -1;
    ts_status st = TS_OK;
    if (r != root) st = plan_recv(f, half, chunk, APPLY_COPY, &first);
    if (!st && succ != root) st = plan_send(f, half, chunk, first);
    if (r == root) f->from = -1;
    if (succ == root) f->to = -1;
    return st;
}

/* ---- the loop ---- */

/* Sends chunk s of flow f without blocking; TS_ERR_TIMEOUT when the
 * socket's queue is full. */
static ts_status send_chunk(ts_comm *c, ring *rg, const ts_comm_op *op, const flow_plan *f, span s,
                            const char *buf, size_t esize) {
    const ts_comm_config *cfg = ts_comm_config_of(c);
    ts_proto_msg h;
    ts_proto_msg_init(&h, TS_MSG_COLLECTIVE, rg->port->job, cfg->generation, rg->rank);
    h.step = op->step;
    h.dtype = wire_dtype(op->dtype);
    h.sequence = f->seq;
    h.flow = f->flow;
    ts_proto_range range = {(uint64_t)s.lo, (uint64_t)s.n};
    ts_status st = ts_proto_msg_set_ranges(&h, &range, 1);
    ts_proto_payload p = {buf + (size_t)s.lo * esize, (size_t)s.n * esize, NULL, NULL};
    if (!st) st = ts_proto_send(rg->to[f->to]->out, NULL, &h, &p, 1, ZMQ_DONTWAIT);
    if (!st) ts_comm_count_sent(c, (uint64_t)s.n * esize);
    ts_proto_msg_free(&h);
    return st;
}

/* Applies a received chunk to the working buffer. */
static void apply_chunk(const ts_comm_op *op, int size, char *buf, span s, apply_kind how, const void *data) {
    size_t esize = ts_dtype_size(op->dtype);
    char *dst = buf + (size_t)s.lo * esize;
    if (how == APPLY_COPY) {
        memcpy(dst, data, (size_t)s.n * esize);
        return;
    }
    ts_comm_reduce_into(dst, data, s.n, op->dtype, op->op);
    if (how == APPLY_REDUCE_LAST && op->op == TS_REDUCE_AVG) ts_comm_finish_avg(dst, s.n, op->dtype, size);
}

/* Applies data as flow f's next receive. */
static void apply_next(const ts_comm_op *op, int size, char *buf, flow_plan *f, const void *data) {
    apply_chunk(op, size, buf, f->recv.at[f->recv.done], (apply_kind)f->recv.tag[f->recv.done], data);
    f->recv.done++;
}

/* Whether a chunk (from, flow, seq, lo, n) is the next one flow f expects;
 * a chunk of f's stream at the wrong place is a protocol error. */
static ts_status matches(const flow_plan *f, int32_t from, uint32_t flow, uint64_t seq, uint64_t lo, uint64_t n,
                         bool *yes) {
    *yes = false;
    if (f->from != from || f->flow != flow || f->seq != seq || f->recv.done >= f->recv.n) return TS_OK;
    span want = f->recv.at[f->recv.done];
    if (lo != (uint64_t)want.lo || n != (uint64_t)want.n)
        return ts_error(TS_ERR_FORMAT, "rank %d sent elements [%llu, +%llu) where [%lld, +%lld) was due", from,
                        (unsigned long long)lo, (unsigned long long)n, (long long)want.lo, (long long)want.n);
    *yes = true;
    return TS_OK;
}

/* Whether a chunk belongs to an operation that has not run yet (kept)
 * rather than one that is over (dropped). */
static bool is_later(const ring *rg, int32_t from, uint32_t flow, uint64_t seq) {
    return flow == FLOW_PAIR ? seq >= rg->recvd[from] : seq >= rg->coll_seq;
}

/* Keeps a copy of chunk m in the port for a later operation. */
static ts_status keep(ts_ring_port *p, const ts_proto_msg *m) {
    size_t size = m->payload[0].size;
    if (p->stash_bytes + size > STASH_MAX_BYTES)
        return ts_error(TS_ERR_MEMORY, "rank %d sent more than %zu MiB ahead of this rank's operations", m->rank,
                        STASH_MAX_BYTES >> 20);
    stashed *x = calloc(1, sizeof *x);
    void *data = malloc(size ? size : 1);
    if (!x || !data) {
        free(x);
        free(data);
        return ts_error(TS_ERR_MEMORY, "ring: out of memory keeping %zu bytes from rank %d", size, m->rank);
    }
    memcpy(data, m->payload[0].data, size);
    *x = (stashed){NULL, m->generation, m->rank, m->flow, m->sequence, m->ranges[0].offset, m->ranges[0].len,
                   data, size};
    stashed **tail = &p->stash;
    while (*tail) tail = &(*tail)->next;
    *tail = x;
    p->stash_bytes += size;
    return TS_OK;
}

/* Takes one received message: applies it to the flow expecting it, keeps
 * it aside when it is early, or drops it when it is late. *applied says
 * whether it was used now. */
static ts_status take(ts_comm *c, ring *rg, const ts_comm_op *op, flow_plan *fl, int nflows, char *buf,
                      const ts_proto_msg *m, bool *applied) {
    *applied = false;
    uint64_t g = ts_comm_config_of(c)->generation;
    bool chunk = m->type == TS_MSG_COLLECTIVE && m->nranges == 1 && m->nlengths == 1 && m->flow <= FLOW_PAIR &&
                 m->rank >= 0;
    if (chunk && m->generation > g) { /* the sender moved on (its world may be larger): keep the chunk for
                                       * the next communicator, and note the move */
        if (!rg->moved.at) {
            rg->moved.at = ts_clock_ms();
            rg->moved.rank = m->rank;
            rg->moved.generation = m->generation;
        }
        return keep(rg->port, m);
    }
    if (m->rank < 0 || m->rank >= rg->size || m->rank == rg->rank) return TS_OK; /* not a peer: ignored */
    if (m->type == TS_MSG_ERROR && m->generation == g)
        return ts_error(TS_ERR_PEER, "rank %d gave up: %s", m->rank, m->reason);
    if (!chunk) return TS_OK; /* not a chunk of this communicator: ignored */
    uint64_t lo = m->ranges[0].offset, n = m->ranges[0].len;
    for (int i = 0; i < nflows; i++) {
        flow_plan *f = &fl[i];
        bool yes;
        ts_status st = matches(f, m->rank, m->flow, m->sequence, lo, n, &yes);
        if (st) return st;
        if (!yes) continue;
        if (m->dtype != wire_dtype(op->dtype) || m->payload[0].size != n * ts_dtype_size(op->dtype))
            return ts_error(TS_ERR_FORMAT, "rank %d sent %zu bytes of dtype %u for %llu elements of %s", m->rank,
                            m->payload[0].size, m->dtype, (unsigned long long)n, ts_dtype_name(op->dtype));
        apply_next(op, rg->size, buf, f, m->payload[0].data);
        *applied = true;
        return TS_OK;
    }
    return is_later(rg, m->rank, m->flow, m->sequence) ? keep(rg->port, m) : TS_OK;
}

/* Applies the first kept chunk that a flow expects now; *applied says if
 * there was one. */
static ts_status take_kept(ring *rg, uint64_t generation, const ts_comm_op *op, flow_plan *fl, int nflows,
                           char *buf, bool *applied) {
    *applied = false;
    for (stashed **p = &rg->port->stash; *p; p = &(*p)->next) {
        stashed *x = *p;
        for (int i = 0; x->generation == generation && i < nflows; i++) {
            bool yes;
            ts_status st = matches(&fl[i], x->from, x->flow, x->seq, x->lo, x->n, &yes);
            if (st) return st;
            if (!yes) continue;
            if (x->size != x->n * ts_dtype_size(op->dtype))
                return ts_error(TS_ERR_FORMAT, "rank %d sent %zu bytes for %llu elements of %s", x->from, x->size,
                                (unsigned long long)x->n, ts_dtype_name(op->dtype));
            apply_next(op, rg->size, buf, &fl[i], x->data);
            *p = x->next;
            rg->port->stash_bytes -= x->size;
            free(x->data);
            free(x);
            *applied = true;
            return TS_OK;
        }
    }
    return TS_OK;
}

/* The peer an unfinished plan waits for (for messages). */
static int waiting_for(const flow_plan *fl, int nflows) {
    for (int i = 0; i < nflows; i++)
        if (fl[i].recv.done < fl[i].recv.n) return fl[i].from;
    for (int i = 0; i < nflows; i++)
        if (fl[i].send.done < fl[i].send.n) return fl[i].to;
    return -1;
}

/* Reads one event from the monitor of a connection and notes when it
 * dropped (the peer's process died or closed its port). */
static void read_monitor(peer_conn *l) {
    zmq_msg_t ev, addr;
    zmq_msg_init(&ev);
    zmq_msg_init(&addr);
    uint16_t event = 0;
    if (zmq_msg_recv(&ev, l->mon, ZMQ_DONTWAIT) >= 6) {
        memcpy(&event, zmq_msg_data(&ev), 2);
        zmq_msg_recv(&addr, l->mon, 0); /* the event's second frame */
    }
    zmq_msg_close(&ev);
    zmq_msg_close(&addr);
    if (event == ZMQ_EVENT_DISCONNECTED && !l->gone) l->gone = ts_clock_ms();
}

/* A plan cannot finish when it still has to send to, or receive from, a
 * peer whose connection dropped more than the grace period ago (what the
 * peer sent before going, its reason included, has arrived by then). */
static ts_status check_gone(ts_comm *c, const ring *rg, const flow_plan *fl, int nflows) {
    double now = ts_clock_ms();
    for (int i = 0; i < nflows; i++) {
        const flow_plan *f = &fl[i];
        int peers[2] = {f->send.done < f->send.n ? f->to : -1, f->recv.done < f->recv.n ? f->from : -1};
        for (int k = 0; k < 2; k++)
            if (peers[k] >= 0 && rg->to[peers[k]] && rg->to[peers[k]]->gone &&
                now - rg->to[peers[k]]->gone > GONE_GRACE_MS)
                return ts_error(TS_ERR_PEER, "the connection to rank %d (%s) dropped", peers[k],
                                peer_endpoint(c, peers[k]));
    }
    return TS_OK;
}

/* The error of an operation that heard of a newer generation and cannot
 * finish: its peers have moved on. */
static ts_status moved_error(ts_comm *c, const ring *rg) {
    return ts_error(TS_ERR_STATE, "a peer is in generation %llu already (as its rank %d), and generation %llu "
                    "stopped making progress", (unsigned long long)rg->moved.generation, rg->moved.rank,
                    (unsigned long long)ts_comm_config_of(c)->generation);
}

/* Adds the monitors of the peers the plan talks to (once each). */
static int watch_peers(const ring *rg, const flow_plan *fl, int nflows, zmq_pollitem_t *items, int nitems, int cap) {
    for (int i = 0; i < nflows; i++) {
        int peers[2] = {fl[i].to, fl[i].from};
        for (int k = 0; k < 2; k++) {
            int p = peers[k];
            bool seen = p < 0 || !rg->to[p];
            for (int j = 0; !seen && j < nitems; j++) seen = items[j].socket == rg->to[p]->mon;
            if (!seen && nitems < cap) items[nitems++] = (zmq_pollitem_t){rg->to[p]->mon, 0, ZMQ_POLLIN, 0};
        }
    }
    return nitems;
}

/* Whether every flow of a plan received all it expects. */
static bool all_received(const flow_plan *fl, int nflows) {
    for (int i = 0; i < nflows; i++)
        if (fl[i].recv.done < fl[i].recv.n) return false;
    return true;
}

/* Runs the flows of a plan to the end. Once they have received all they
 * expect, the port is no longer read: what waits there belongs to later
 * operations and stays in ZeroMQ's queues (a root of a broadcast may be
 * far ahead) instead of the port's stash. */
static ts_status run_plan(ts_comm *c, ring *rg, const ts_comm_op *op, flow_plan *fl, int nflows, char *buf) {
    size_t esize = ts_dtype_size(op->dtype);
    int timeout = ts_comm_config_of(c)->timeout_ms;
    double last = ts_clock_ms();
    ts_proto_rx rx;
    ts_proto_rx_init(&rx);
    if (op->timeout_ms > 0) timeout = op->timeout_ms;
    ts_status st = TS_OK;
    zmq_pollitem_t items[8];
    for (;;) {
        bool done = true, progress = false;
        int nitems = 0;
        bool reading = !all_received(fl, nflows);
        if (reading) items[nitems++] = (zmq_pollitem_t){rg->port->in, 0, ZMQ_POLLIN, 0};
        for (int i = 0; !st && i < nflows; i++) {
            flow_plan *f = &fl[i];
            while (!st && send_ready(f)) {
                st = send_chunk(c, rg, op, f, f->send.at[f->send.done], buf, esize);
                if (st == TS_ERR_TIMEOUT) { /* queue full: wait until it drains */
                    st = TS_OK;
                    items[nitems++] = (zmq_pollitem_t){rg->to[f->to]->out, 0, ZMQ_POLLOUT, 0};
                    break;
                }
                if (!st) {
                    f->send.done++;
                    progress = true;
                }
            }
            done = done && f->send.done == f->send.n && f->recv.done == f->recv.n;
        }
        if (st || done) break;
        bool kept;
        if ((st = take_kept(rg, ts_comm_config_of(c)->generation, op, fl, nflows, buf, &kept))) break;
        if (kept) {
            last = ts_clock_ms();
            continue;
        }
        int first_mon = nitems;
        nitems = watch_peers(rg, fl, nflows, items, nitems, 8);
        if (zmq_poll(items, nitems, POLL_SLICE_MS) < 0 && zmq_errno() != EINTR) {
            st = ts_error(TS_ERR_IO, "ring: poll: %s", zmq_strerror(zmq_errno()));
            break;
        }
        for (int k = first_mon; k < nitems; k++)
            if (items[k].revents & ZMQ_POLLIN)
                for (int p = 0; p < rg->size; p++)
                    if (rg->to[p] && rg->to[p]->mon == items[k].socket) {
                        read_monitor(rg->to[p]);
                        break;
                    }
        while (!st && reading && !all_received(fl, nflows)) {
            ts_proto_error e = ts_proto_recv(rg->port->in, &rg->lim, ZMQ_DONTWAIT, &rx);
            if (e == TS_PROTO_E_AGAIN) break;
            if (e == TS_PROTO_OK) {
                bool applied;
                st = take(c, rg, op, fl, nflows, buf, &rx.msg, &applied);
                progress = progress || applied;
            } else if (e == TS_PROTO_E_IO) {
                st = ts_error(TS_ERR_IO, "ring: receive: %s", ts_last_error());
            } /* else: a stale or malformed message, dropped */
        }
        /* a peer that moved to a newer generation, then left, is named for the move */
        if (!st && check_gone(c, rg, fl, nflows)) st = rg->moved.at ? moved_error(c, rg) : ts_last_status();
        if (!st && !progress && rg->moved.at &&
            ts_clock_ms() - (last > rg->moved.at ? last : rg->moved.at) > MOVED_GRACE_MS)
            st = moved_error(c, rg);
        if (st) break;
        if (ts_comm_aborted(c)) {
            st = ts_error(TS_ERR_STATE, "abandoned");
            break;
        }
        if (progress) {
            last = ts_clock_ms();
        } else if (ts_clock_ms() - last > timeout) {
            int p = waiting_for(fl, nflows);
            st = ts_error(TS_ERR_TIMEOUT, "no progress with rank %d (%s) for %d ms", p, p >= 0 ? peer_endpoint(c, p) : "?",
                          timeout);
            break;
        }
    }
    ts_proto_rx_release(&rx);
    return st;
}

/* ---- the operations ---- */

/* Element count of a chunk for dtype. */
static int64_t chunk_elems(ts_dtype dt) { return (int64_t)(TS_RING_CHUNK_BYTES / ts_dtype_size(dt)); }

/* The two flows of a ring collective, empty: towards the next rank and
 * towards the previous one. */
static void two_flows(const ring *rg, flow_plan fl[2]) {
    int r = rg->rank, n = rg->size;
    fl[0] = (flow_plan){.to = (r + 1) % n, .from = (r + n - 1) % n, .flow = FLOW_NEXT, .seq = rg->coll_seq};
    fl[1] = (flow_plan){.to = (r + n - 1) % n, .from = (r + 1) % n, .flow = FLOW_PREV, .seq = rg->coll_seq};
}

/* The two ring flows of a collective over layout l in buf. */
static ts_status run_rings(ts_comm *c, ring *rg, const ts_comm_op *op, const layout *l, bool rs, bool ag,
                           char *buf) {
    int r = rg->rank;
    flow_plan fl[2];
    two_flows(rg, fl);
    ts_status st = TS_OK;
    for (int d = 0; !st && d < 2; d++) st = plan_ring(&fl[d], l, r, d, rs, ag, chunk_elems(op->dtype));
    if (!st) st = run_plan(c, rg, op, fl, 2, buf);
    plan_free(&fl[0]);
    plan_free(&fl[1]);
    return st;
}

static ts_status run_allreduce(ts_comm *c, ring *rg, const ts_comm_op *op) {
    size_t bytes = (size_t)op->count * ts_dtype_size(op->dtype);
    if (op->send != op->recv && bytes) memmove(op->recv, op->send, bytes);
    layout l = {op->count, 0, rg->size};
    return run_rings(c, rg, op, &l, true, true, op->recv);
}

/* Reduces in a copy of send, or in send itself when in place (recv is its
 * own slot), where the ring leaves the rank's reduced block. */
static ts_status run_reduce_scatter(ts_comm *c, ring *rg, const ts_comm_op *op) {
    size_t esize = ts_dtype_size(op->dtype), block = (size_t)op->count * esize;
    layout l = {op->count * rg->size, op->count, rg->size};
    if ((const char *)op->recv == (const char *)op->send + block * (size_t)rg->rank)
        return run_rings(c, rg, op, &l, true, false, (char *)op->recv - block * (size_t)rg->rank);
    char *work = malloc(block * (size_t)rg->size + 1);
    if (!work) return ts_error(TS_ERR_MEMORY, "ring: out of memory for %zu bytes of reduce_scatter", block * rg->size);
    memcpy(work, op->send, block * (size_t)rg->size);
    ts_status st = run_rings(c, rg, op, &l, true, false, work);
    if (!st) memmove(op->recv, work + block * (size_t)rg->rank, block);
    free(work);
    return st;
}

static ts_status run_allgather(ts_comm *c, ring *rg, const ts_comm_op *op) {
    size_t block = (size_t)op->count * ts_dtype_size(op->dtype);
    char *own = (char *)op->recv + block * (size_t)rg->rank;
    if (op->send != own && block) memmove(own, op->send, block);
    layout l = {op->count * rg->size, op->count, rg->size};
    return run_rings(c, rg, op, &l, false, true, op->recv);
}

static ts_status run_broadcast(ts_comm *c, ring *rg, const ts_comm_op *op) {
    int r = rg->rank;
    flow_plan fl[2];
    two_flows(rg, fl);
    ts_status st = TS_OK;
    for (int d = 0; !st && d < 2; d++)
        st = plan_broadcast(&fl[d], piece(0, op->count, 2, d), r, op->peer, chunk_elems(op->dtype));
    if (!st) st = run_plan(c, rg, op, fl, 2, op->recv);
    plan_free(&fl[0]);
    plan_free(&fl[1]);
    return st;
}

static ts_status run_pair(ts_comm *c, ring *rg, const ts_comm_op *op) {
    bool sending = op->kind == TS_COMM_SEND;
    flow_plan f = {.to = sending ? op->peer : -1,
                   .from = sending ? -1 : op->peer,
                   .flow = FLOW_PAIR,
                   .seq = sending ? rg->sent[op->peer] : rg->recvd[op->peer]};
    span all = {0, op->count};
    int first;
    ts_status st = sending ? plan_send(&f, all, chunk_elems(op->dtype), -1)
                           : plan_recv(&f, all, chunk_elems(op->dtype), APPLY_COPY, &first);
    if (!st && sending && !rank_conn(c, rg, op->peer)) st = ts_last_status();
    if (!st) st = run_plan(c, rg, op, &f, 1, sending ? (char *)op->send : op->recv);
    if (!st) (sending ? rg->sent : rg->recvd)[op->peer]++;
    plan_free(&f);
    return st;
}

/* Tells the neighbours why this rank gave up an operation, so that they
 * stop waiting for it at once and name the cause (best effort). */
static void tell_neighbours(ts_comm *c, ring *rg) {
    if (ts_comm_aborted(c) || rg->size < 2) return;
    char reason[TS_PROTO_REASON_MAX + 1];
    snprintf(reason, sizeof reason, "%s", ts_last_error());
    int near[2] = {(rg->rank + 1) % rg->size, (rg->rank + rg->size - 1) % rg->size};
    for (int k = 0; k < 2; k++)
        if (rg->to[near[k]] && !rg->to[near[k]]->gone)
            ts_proto_send_error(rg->to[near[k]]->out, NULL, rg->port->job, ts_comm_config_of(c)->generation, rg->rank,
                                TS_PROTO_E_INTERNAL, reason);
    ts_error(ts_last_status() ? ts_last_status() : TS_ERR_PEER, "%s", reason);
}

static ts_status ring_run(ts_comm *c, const ts_comm_op *op) {
    ring *rg = ts_comm_impl(c);
    ts_status st;
    if (op->kind == TS_COMM_SEND || op->kind == TS_COMM_RECV) {
        st = run_pair(c, rg, op);
    } else {
        if (rg->size == 1) { /* one rank: the data is the result */
            size_t bytes = (size_t)op->count * ts_dtype_size(op->dtype);
            if (op->kind != TS_COMM_BROADCAST && op->kind != TS_COMM_BARRIER && op->send != op->recv && bytes)
                memmove(op->recv, op->send, bytes);
            rg->coll_seq++;
            return TS_OK;
        }
        ts_comm_op o = *op;
        float token = 0;
        switch (op->kind) {
        case TS_COMM_ALLREDUCE: st = run_allreduce(c, rg, &o); break;
        case TS_COMM_REDUCE_SCATTER: st = run_reduce_scatter(c, rg, &o); break;
        case TS_COMM_ALLGATHER: st = run_allgather(c, rg, &o); break;
        case TS_COMM_BROADCAST: st = run_broadcast(c, rg, &o); break;
        default: /* barrier: a one-element allreduce */
            o = (ts_comm_op){.kind = TS_COMM_ALLREDUCE, .send = &token, .recv = &token, .count = 1,
                             .dtype = TS_F32, .op = TS_REDUCE_SUM, .step = op->step, .timeout_ms = op->timeout_ms};
            st = run_allreduce(c, rg, &o);
        }
        rg->coll_seq++;
    }
    if (st) tell_neighbours(c, rg);
    return st;
}

const ts_comm_backend ts_comm_ring_backend = {
    .name = "ring",
    .open = ring_open,
    .run = ring_run,
    .close = ring_close,
};
