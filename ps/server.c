/* server.c - the parameter-server process: its socket, its place in the
 * job, and the order in which requests reach the shard (contract in ps.h).
 *
 * One libuv loop serves the CURVE ROUTER socket through a proto/zloop.h
 * poll-and-drain loop. Requests that change the shard pass through a queue:
 * with a backup, each is forwarded to it (the primary's DEALER announces
 * itself with the routing id "fwd<rank>") and handed to the shard once the
 * backup acknowledged it; pulls wait behind them so a worker's pull sees
 * its own apply. Without a backup the queue is empty and requests go
 * straight to the shard, zero-copy from the received frames. A primary
 * without a backup of its own start sends a spare of its shard (a restart)
 * its whole state first; the spare is its backup once it acknowledged it.
 */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/io/checkpoint.h"
#include "kernels/nn/models.h"
#include "membership/member.h"
#include "proto/job_model.h"
#include "proto/secure.h"
#include "proto/zloop.h"
#include "ps/ps.h"
#include "ps/shard.h"
#include "sharding/keys.h"

/* How often the loop looks at the membership and the shutdown flag. */
#define PS_TICK_MS 10
/* A reply that cannot leave within this long is dropped (the peer is gone). */
#define PS_SEND_TIMEOUT_MS 10000

typedef enum { ROLE_SPARE, ROLE_PRIMARY, ROLE_BACKUP } ps_role;
static const char *const ROLE_NAMES[] = {"spare", "primary", "backup"};

/* Payload bytes shared by the queue and a zero-copy forward. */
typedef struct {
    atomic_int refs;
    unsigned char bytes[];
} ps_blob;

/* A queued request, or a change of the live workers (is_workers). */
typedef struct ps_entry {
    struct ps_entry *next;
    ts_proto_identity from;
    ts_proto_msg msg;       /* owns its ranges and lengths; payload views into blob */
    ts_proto_frame *frames;
    ps_blob *blob;
    bool is_workers;
    bool forwarded, acked;
} ps_entry;

/* The DEALER to the backup, on its own zloop. A link that closed stays
 * allocated (its handles close on the loop) until the process ends. */
typedef struct ps_link {
    struct ps_link *next;    /* the closed links */
    void *sock;
    ts_zloop zl;
    int to;                  /* the backup's rank */
    bool syncing;            /* a spare: its answer to the state sent first is due */
} ps_link;

/* The state a spare is receiving from its primary, part by part. */
typedef struct {
    int from;                /* the primary's rank, -1: none under way */
    int64_t part;            /* the next part expected */
    int64_t have;            /* floats of the stream received */
    ts_shard_state st;
} ps_incoming;

typedef struct {
    const ts_ps_options *o;
    ts_secure_keys keys;
    bool curve;              /* parallel.ps_security: the data sockets are CURVE */
    void *zctx, *sock;
    ts_secure_zap *zap;
    char endpoint[TS_PROTO_ADDR_MAX + 1];
    ts_proto_limits lim;
    ts_member *member;
    int rank, shard, shards;
    ts_shard *sh;
    uv_loop_t loop;
    bool loop_ready;
    ts_zloop zl;
    ps_link *fwd;            /* the link to the backup, NULL none */
    ps_link *closed;
    ps_role role;
    int primary, backup;     /* ranks in this shard's chain, -1 none */
    int synced_to;           /* a spare that holds the state of this primary (rank), -1 none */
    int refused;             /* a spare that refused this primary's state (rank), -1 none */
    uint64_t refused_joined; /* and the generation it joined in */
    uint64_t resync_ms;      /* when to offer a spare the state again (zloop clock), 0 not */
    ps_incoming in;
    int64_t numel;           /* the model's keys */
    uint64_t gen;            /* newest generation the member announced */
    ts_proto_member *roster; /* its roster */
    size_t nroster;
    ts_proto_member *workers;/* live workers as the shard last got them */
    int nworkers;
    ps_entry *head, *tail;
    uint64_t handled, bad;
    int code;
    char reason[TS_PROTO_REASON_MAX + 1];
} ps_server;

/* ---- payloads shared with ZeroMQ ---- */

static void blob_unref(void *data, void *hint) {
    (void)data;
    ps_blob *b = hint;
    if (b && atomic_fetch_sub(&b->refs, 1) == 1) free(b);
}

/* ---- replies ---- */

static void reply(void *ctx, const ts_proto_identity *to, const ts_proto_msg *m, const ts_proto_payload *p,
                  size_t np) {
    ps_server *sv = ctx;
    if (ts_proto_send(sv->sock, to, m, p, np, 0))
        fprintf(stderr, "shard %d: %s of step %lld not sent: %s\n", sv->shard, ts_proto_type_name(m->type),
                (long long)m->step, ts_last_error());
}

/* Answers an ERROR to a request the server itself turns away. */
static void turn_away(ps_server *sv, const ts_proto_identity *to, uint32_t code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void turn_away(ps_server *sv, const ts_proto_identity *to, uint32_t code, const char *fmt, ...) {
    char why[TS_PROTO_REASON_MAX + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    if (code != TS_PROTO_E_RETRY) {
        sv->bad++;
        fprintf(stderr, "shard %d: refused a request: %s [%s]\n", sv->shard, why, ts_proto_error_name(code));
    }
    ts_proto_send_error(sv->sock, to, sv->o->job->name, sv->gen, sv->rank, code, why);
}

/* ---- the queue ---- */

/* Hands one entry to the shard. */
static void dispatch(ps_server *sv, const ps_entry *e) {
    if (!e->is_workers) {
        ts_shard_handle(sv->sh, &e->from, &e->msg);
        sv->handled++;
        return;
    }
    ts_shard_workers(sv->sh, e->msg.generation, e->msg.roster, (int)e->msg.nroster);
}

static void entry_free(ps_entry *e) {
    ts_proto_msg_free(&e->msg);
    free(e->frames);
    if (e->blob) blob_unref(NULL, e->blob);
    free(e);
}

/* Hands the shard every entry at the head whose forward was acknowledged. */
static void run_queue(ps_server *sv) {
    while (sv->head && (!sv->head->forwarded || sv->head->acked)) {
        ps_entry *e = sv->head;
        sv->head = e->next;
        if (!sv->head) sv->tail = NULL;
        dispatch(sv, e);
        entry_free(e);
    }
}

/* Sends entry e to the backup (its payload zero-copy from the blob). */
static ts_status forward(ps_server *sv, ps_entry *e) {
    size_t np = e->msg.nlengths;
    ts_proto_payload *p = np ? calloc(np, sizeof *p) : NULL;
    if (np && !p) return ts_error(TS_ERR_MEMORY, "shard %d: out of memory forwarding", sv->shard);
    for (size_t i = 0; i < np; i++) {
        atomic_fetch_add(&e->blob->refs, 1);
        p[i] = (ts_proto_payload){e->frames[i].data, e->frames[i].size, blob_unref, e->blob};
    }
    ts_status st = ts_proto_send(sv->fwd->sock, NULL, &e->msg, p, np, 0);
    free(p);
    if (!st) e->forwarded = true;
    return st;
}

/* Copies a request (or a workers change) into a queue entry. */
static ps_entry *entry_copy(const ts_proto_identity *from, const ts_proto_msg *m, bool is_workers) {
    ps_entry *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    if (from) e->from = *from;
    e->is_workers = is_workers;
    e->msg = *m;
    e->msg.ranges = NULL, e->msg.lengths = NULL, e->msg.roster = NULL, e->msg.payload = NULL;
    e->msg.nranges = e->msg.nlengths = e->msg.nroster = 0;
    size_t bytes = 0;
    for (size_t i = 0; i < m->nlengths; i++) bytes += m->lengths[i];
    bool ok = !ts_proto_msg_set_ranges(&e->msg, m->ranges, m->nranges) &&
              !ts_proto_msg_set_roster(&e->msg, m->roster, m->nroster);
    if (ok && m->nlengths) {
        e->msg.lengths = malloc(m->nlengths * sizeof *m->lengths);
        e->frames = calloc(m->nlengths, sizeof *e->frames);
        e->blob = malloc(sizeof *e->blob + bytes);
        ok = e->msg.lengths && e->frames && e->blob;
    }
    if (!ok) {
        entry_free(e);
        return NULL;
    }
    if (e->blob) atomic_init(&e->blob->refs, 1);
    size_t at = 0;
    for (size_t i = 0; i < m->nlengths; i++) {
        e->msg.lengths[i] = m->lengths[i];
        memcpy(e->blob->bytes + at, m->payload[i].data, m->lengths[i]);
        e->frames[i] = (ts_proto_frame){e->blob->bytes + at, m->lengths[i]};
        at += m->lengths[i];
    }
    e->msg.nlengths = m->nlengths;
    e->msg.payload = e->frames;
    return e;
}

/* Whether a request changes the shard (and so goes to the backup first). */
static bool changes_shard(ts_proto_type t) {
    return t == TS_MSG_PUSH || t == TS_MSG_COMMIT || t == TS_MSG_APPLY || t == TS_MSG_REDUCE ||
           t == TS_MSG_ROLLBACK;
}

/* Puts a request (from != NULL) or a workers change into the order: at once
 * when nothing waits and there is no backup, else queued (and forwarded). */
static void enqueue(ps_server *sv, const ts_proto_identity *from, const ts_proto_msg *m, bool is_workers) {
    if (!sv->head && !sv->fwd) {
        ps_entry direct = {.is_workers = is_workers, .msg = *m};
        if (from) direct.from = *from;
        dispatch(sv, &direct);
        return;
    }
    ps_entry *e = entry_copy(from, m, is_workers);
    if (!e) {
        if (from) turn_away(sv, from, TS_PROTO_E_INTERNAL, "shard %d: out of memory queueing a request", sv->shard);
        else fprintf(stderr, "shard %d: out of memory queueing a workers change\n", sv->shard);
        return;
    }
    if (sv->fwd && (is_workers || changes_shard(m->type)) && forward(sv, e))
        fprintf(stderr, "shard %d: forwarding to backup rank %d failed: %s\n", sv->shard, sv->backup, ts_last_error());
    if (sv->tail) sv->tail->next = e;
    else sv->head = e;
    sv->tail = e;
    run_queue(sv);
}

/* ---- the backup link ---- */

static void on_tick_none(void *owner) { (void)owner; }

static void link_close(ps_server *sv);

/* The generation in which ps rank `rank` of the roster joined, 0 none. */
static uint64_t joined_of(const ps_server *sv, int rank) {
    for (size_t i = 0; i < sv->nroster; i++)
        if (sv->roster[i].rank == rank && sv->roster[i].role == TS_ROLE_PS) return sv->roster[i].joined_generation;
    return 0;
}

/* The spare answered the state sent to it: with an ACK it is the backup
 * from now on; refused, the link closes and what waited goes ahead (a spare
 * that had not seen this primary yet is offered the state again later). */
static void on_state_answer(ps_server *sv, ts_proto_error e, const ts_proto_msg *m) {
    ps_link *l = sv->fwd;
    l->syncing = false;
    if (e == TS_PROTO_OK && m->type == TS_MSG_ACK) {
        printf("shard %d: spare rank %d holds the state of step %lld: it is the backup\n", sv->shard, l->to,
               (long long)m->step);
        return;
    }
    bool again = e == TS_PROTO_OK && m->type == TS_MSG_ERROR && m->code == TS_PROTO_E_RETRY;
    fprintf(stderr, "shard %d: spare rank %d did not take the state: %s: %.300s%s\n", sv->shard, l->to,
            e ? ts_proto_error_name(e) : ts_proto_type_name(m->type), e ? ts_last_error() : m->reason,
            again ? "; offering it again" : "; it stays a spare");
    if (again) sv->resync_ms = ts_zloop_now_ms(&sv->zl) + (uint64_t)sv->o->job->parallel.heartbeat_ms;
    else sv->refused = l->to, sv->refused_joined = joined_of(sv, l->to);
    link_close(sv);
}

/* The backup acknowledged the oldest forward (or refused it: then the chain
 * is broken and this process stops). */
static void on_backup_msg(void *owner, ts_proto_error e, ts_proto_rx *rx) {
    ps_server *sv = owner;
    if (sv->fwd && sv->fwd->syncing) {
        on_state_answer(sv, e, &rx->msg);
        return;
    }
    if (e != TS_PROTO_OK || rx->msg.type != TS_MSG_ACK) {
        snprintf(sv->reason, sizeof sv->reason, "backup rank %d answered a forward with %s: %.300s", sv->backup,
                 e ? ts_proto_error_name(e) : ts_proto_type_name(rx->msg.type),
                 e ? ts_last_error() : rx->msg.reason);
        fprintf(stderr, "shard %d: %s; stopping\n", sv->shard, sv->reason);
        sv->code = 1;
        ts_member_leave(sv->member, sv->reason);
        sv->member = NULL;
        ts_zloop_stop(&sv->zl);
        link_close(sv);
        return;
    }
    for (ps_entry *x = sv->head; x; x = x->next)
        if (x->forwarded && !x->acked) {
            x->acked = true;
            break;
        }
    run_queue(sv);
}

/* Connects a DEALER to backup `rank` at address: the new sv->fwd. */
static ts_status link_open(ps_server *sv, int rank, const char *address) {
    ps_link *l = calloc(1, sizeof *l);
    if (!l) return ts_error(TS_ERR_MEMORY, "shard %d: out of memory for the link to rank %d", sv->shard, rank);
    char id[32];
    int idlen = snprintf(id, sizeof id, "fwd%d", sv->rank);
    int linger = 1000, timeout = PS_SEND_TIMEOUT_MS;
    ts_proto_limits lim;
    ts_proto_limits_default(&lim);
    lim.max_frames = 0;
    l->to = rank;
    l->sock = zmq_socket(sv->zctx, ZMQ_DEALER);
    ts_status st = l->sock ? TS_OK
                           : ts_error(TS_ERR_IO, "shard %d: zmq_socket(DEALER): %s", sv->shard, zmq_strerror(zmq_errno()));
    if (!st) {
        zmq_setsockopt(l->sock, ZMQ_ROUTING_ID, id, (size_t)idlen);
        zmq_setsockopt(l->sock, ZMQ_LINGER, &linger, sizeof linger);
        zmq_setsockopt(l->sock, ZMQ_SNDTIMEO, &timeout, sizeof timeout);
        st = sv->curve ? ts_secure_client(l->sock, &sv->keys) : TS_OK;
    }
    if (!st) st = ts_proto_limit_socket(l->sock, &lim);
    if (!st && zmq_connect(l->sock, address) != 0)
        st = ts_error(TS_ERR_IO, "shard %d: cannot connect to rank %d at %s: %s", sv->shard, rank, address,
                      zmq_strerror(zmq_errno()));
    if (!st) st = ts_zloop_init(&l->zl, &sv->loop, l->sock, &lim, 1000, on_backup_msg, on_tick_none, sv);
    if (st) {
        if (l->sock) zmq_close(l->sock);
        free(l);
        return st;
    }
    ts_zloop_start(&l->zl);
    sv->fwd = l;
    return TS_OK;
}

/* The backup is gone (or refused): what waited for its acknowledgement
 * goes ahead; the socket closes now, dropping what it still held. */
static void link_close(ps_server *sv) {
    ps_link *l = sv->fwd;
    if (!l) return;
    sv->fwd = NULL;
    ts_zloop_stop(&l->zl);
    int zero = 0;
    zmq_setsockopt(l->sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_close(l->sock);
    l->sock = NULL;
    l->next = sv->closed;
    sv->closed = l;
    for (ps_entry *e = sv->head; e; e = e->next) e->acked = true;
    run_queue(sv);
}

/* ---- the state, sent to a spare ---- */

/* The frames of a part of the state: at most 1 MiB each (the size the ps
 * client sends), at most this many to a part. */
#define STATE_FRAME_BYTES ((int64_t)1 << 20)
#define STATE_PART_FRAMES 16

/* Sends part `part` of the state (frames p[0..np), their bytes from blob,
 * which each frame holds a reference to) to the spare. */
static ts_status send_part(ps_server *sv, int64_t part, int64_t from, const ts_proto_payload *p, size_t np) {
    ts_proto_msg m;
    ts_proto_msg_init(&m, TS_MSG_SNAPSHOT, sv->o->job->name, sv->gen, sv->rank);
    m.step = ts_shard_step(sv->sh);
    m.barrier_id = part;
    m.offset = from;
    ts_status st = ts_proto_send(sv->fwd->sock, NULL, &m, p, np, 0);
    ts_proto_msg_free(&m);
    return st;
}

/* Sends the shard's whole state to the spare at the other end of the new
 * link: part 0 the record and the values, then the float stream in parts
 * that fit the spare's limits (a pull's worth of bytes at most). Forwards
 * follow it on the same link, so the spare replays them on that state. */
static ts_status send_state(ps_server *sv) {
    ts_shard_state st;
    ts_shard_snapshot_size(sv->sh, &st);
    size_t bytes = st.nhead * 8 + st.nvalues * 8 + (size_t)st.ndata * 4;
    ps_blob *blob = malloc(sizeof *blob + bytes);
    if (!blob) return ts_error(TS_ERR_MEMORY, "shard %d: out of memory for its state (%zu bytes)", sv->shard, bytes);
    atomic_init(&blob->refs, 1);
    st.head = (int64_t *)blob->bytes;
    st.values = (double *)(blob->bytes + st.nhead * 8);
    st.data = (float *)(blob->bytes + st.nhead * 8 + st.nvalues * 8);
    ts_shard_snapshot(sv->sh, &st);
    atomic_fetch_add(&blob->refs, 2);
    ts_proto_payload head[2] = {{st.head, st.nhead * 8, blob_unref, blob}, {st.values, st.nvalues * 8, blob_unref, blob}};
    ts_status s = send_part(sv, 0, 0, head, 2);
    int64_t frame = STATE_FRAME_BYTES / 4 < sv->numel ? STATE_FRAME_BYTES / 4 : sv->numel;
    ts_proto_payload p[STATE_PART_FRAMES];
    for (int64_t at = 0, part = 1; !s && at < st.ndata; part++) {
        int64_t from = at;
        size_t np = 0;
        for (; np < STATE_PART_FRAMES && at < st.ndata && (at - from) + frame <= sv->numel; np++) {
            int64_t n = st.ndata - at < frame ? st.ndata - at : frame;
            atomic_fetch_add(&blob->refs, 1);
            p[np] = (ts_proto_payload){st.data + at, (size_t)n * 4, blob_unref, blob};
            at += n;
        }
        s = send_part(sv, part, from, p, np);
    }
    blob_unref(NULL, blob);
    if (!s) {
        sv->fwd->syncing = true;
        printf("shard %d: sending spare rank %d the state of step %lld (%.1f MiB)\n", sv->shard, sv->fwd->to,
               (long long)ts_shard_step(sv->sh), (double)bytes / (1 << 20));
    }
    return s;
}

/* ---- following the job ---- */

/* The live workers of roster r, by ascending rank; *n of them (malloc'd);
 * *formed (may be NULL) is the generation the last of them joined in. */
static ts_proto_member *live_workers(const ts_proto_member *r, size_t n, int *count, uint64_t *formed) {
    ts_proto_member *w = malloc((n ? n : 1) * sizeof *w);
    int k = 0;
    if (formed) *formed = 0;
    for (size_t i = 0; w && i < n; i++) {
        if (r[i].role != TS_ROLE_WORKER || !r[i].alive) continue;
        if (formed && r[i].joined_generation > *formed) *formed = r[i].joined_generation;
        int j = k++;
        while (j > 0 && w[j - 1].rank > r[i].rank) w[j] = w[j - 1], j--;
        w[j] = r[i];
    }
    *count = k;
    return w;
}

/* Gives the shard the live workers (through the queue, so the backup sees
 * the change at the same point) when they differ from what it has. */
static void give_workers(ps_server *sv, uint64_t g, ts_proto_member *w, int n) {
    bool same = n == sv->nworkers;
    for (int i = 0; same && i < n; i++)
        same = w[i].rank == sv->workers[i].rank && w[i].joined_generation == sv->workers[i].joined_generation;
    if (same) {
        free(w);
        return;
    }
    free(sv->workers);
    sv->workers = w;
    sv->nworkers = n;
    ts_proto_msg m;
    ts_proto_msg_init(&m, TS_MSG_MEMBERSHIP, sv->o->job->name, g, sv->rank);
    ts_proto_member *ros = calloc(n ? (size_t)n : 1, sizeof *ros);
    for (int i = 0; ros && i < n; i++)
        ros[i] = (ts_proto_member){.rank = w[i].rank, .role = TS_ROLE_WORKER, .alive = true, .last_step = -1,
                                   .last_barrier = -1, .heartbeat_age_ms = -1,
                                   .joined_generation = w[i].joined_generation};
    if (!ros || ts_proto_msg_set_roster(&m, ros, (size_t)n)) {
        fprintf(stderr, "shard %d: out of memory for the workers of generation %llu\n", sv->shard,
                (unsigned long long)g);
    } else {
        printf("shard %d: generation %llu: %d workers\n", sv->shard, (unsigned long long)g, n);
        enqueue(sv, NULL, &m, true);
    }
    free(ros);
    ts_proto_msg_free(&m);
}

/* The address of live ps rank `rank` in the roster, NULL when none. */
static const char *ps_address(const ps_server *sv, int rank) {
    for (size_t i = 0; i < sv->nroster; i++)
        if (sv->roster[i].rank == rank && sv->roster[i].role == TS_ROLE_PS && sv->roster[i].alive)
            return sv->roster[i].address;
    return NULL;
}

/* The spare a primary without a backup replicates to: the live ps of its
 * shard that joined first (then the lowest rank), other than itself and
 * the process that refused its state; -1 none. */
static int first_spare(const ps_server *sv) {
    const ts_proto_member *best = NULL;
    for (size_t i = 0; i < sv->nroster; i++) {
        const ts_proto_member *x = &sv->roster[i];
        if (x->role != TS_ROLE_PS || !x->alive || x->rank == sv->rank || x->rank % sv->shards != sv->shard ||
            (x->rank == sv->refused && x->joined_generation == sv->refused_joined))
            continue;
        if (!best || x->joined_generation < best->joined_generation ||
            (x->joined_generation == best->joined_generation && x->rank < best->rank))
            best = x;
    }
    return best ? best->rank : -1;
}

/* The primary's link: to backup b (same start) when there is one, else to
 * the first spare, which is sent the state before anything is forwarded. */
static void link_chain(ps_server *sv, int b) {
    int want = b >= 0 ? b : first_spare(sv);
    if (sv->fwd && sv->fwd->to == want) return;
    link_close(sv);
    const char *address = want >= 0 ? ps_address(sv, want) : NULL;
    if (!address) return;
    ts_status st = link_open(sv, want, address);
    if (!st && b < 0 && (st = send_state(sv))) link_close(sv);
    if (st) fprintf(stderr, "shard %d: no link to rank %d: %s\n", sv->shard, want, ts_last_error());
}

/* Drops a state being received. */
static void drop_incoming(ps_server *sv) {
    free(sv->in.st.head), free(sv->in.st.values), free(sv->in.st.data);
    sv->in = (ps_incoming){.from = -1};
}

/* Takes this process's role in its shard's chain from the roster: the
 * backup link and (primary) the live workers. */
static void place(ps_server *sv) {
    const ts_proto_member *r = sv->roster;
    size_t n = sv->nroster;
    uint64_t g = sv->gen;
    ts_keys_server *ps = calloc(n ? n : 1, sizeof *ps);
    int *primary = calloc((size_t)sv->shards, sizeof *primary), *backup = calloc((size_t)sv->shards, sizeof *backup);
    if (!ps || !primary || !backup) {
        fprintf(stderr, "shard %d: out of memory following generation %llu\n", sv->shard, (unsigned long long)g);
        free(ps), free(primary), free(backup);
        return;
    }
    int nps = 0;
    for (size_t i = 0; i < n; i++)
        if (r[i].role == TS_ROLE_PS && r[i].alive) ps[nps++] = (ts_keys_server){r[i].rank, r[i].joined_generation};
    ts_keys_chains(ps, nps, sv->shards, primary, backup);
    int p = primary[sv->shard], b = backup[sv->shard];
    free(ps), free(primary), free(backup);
    /* a spare that took the primary's state is its backup while it lives */
    ps_role role = p == sv->rank                                     ? ROLE_PRIMARY
                   : b == sv->rank || (p >= 0 && sv->synced_to == p) ? ROLE_BACKUP
                                                                     : ROLE_SPARE;
    if (role != ROLE_BACKUP) sv->synced_to = -1;
    if (sv->in.from >= 0 && sv->in.from != p) drop_incoming(sv);
    if (role != sv->role || p != sv->primary || b != sv->backup) {
        printf("shard %d: generation %llu: rank %d is %s (primary rank %d, backup rank %d)\n", sv->shard,
               (unsigned long long)g, sv->rank, ROLE_NAMES[role], p, b);
    }
    if (sv->role == ROLE_BACKUP && role == ROLE_PRIMARY)
        printf("shard %d: promoted to primary at step %lld: primary rank %d is gone\n", sv->shard,
               (long long)ts_shard_step(sv->sh), sv->primary);
    sv->role = role;
    sv->primary = p;
    ts_shard_set_replies(sv->sh, role == ROLE_PRIMARY);
    ts_shard_set_writer(sv->sh, role == ROLE_PRIMARY);
    if (role == ROLE_PRIMARY) link_chain(sv, b);
    else link_close(sv);
    sv->backup = role == ROLE_PRIMARY ? (sv->fwd ? sv->fwd->to : -1) : role == ROLE_BACKUP ? b : -1;
    if (role == ROLE_PRIMARY) {
        int nw;
        uint64_t formed;
        ts_proto_member *w = live_workers(r, n, &nw, &formed);
        /* a shard that knew no workers (a restart) takes them as of the
         * generation they were complete in: their messages are not stale */
        if (w) give_workers(sv, sv->workers ? g : formed, w, nw);
    }
}

/* Takes roster r (owned from now on) of generation g. */
static void take_roster(ps_server *sv, uint64_t g, ts_proto_member *r, size_t n) {
    sv->gen = g;
    free(sv->roster);
    sv->roster = r;
    sv->nroster = n;
    place(sv);
}

/* Takes a generation the scheduler announced since the last look. */
static void follow(ps_server *sv) {
    uint64_t g;
    ts_proto_member *r = NULL;
    size_t n = 0;
    if (ts_member_poll_membership(sv->member, &g, &r, &n)) take_roster(sv, g, r, n);
}

/* ---- requests ---- */

/* Whether identity id is a primary's forwarding link; its rank in *rank. */
static bool forwarded(const ts_proto_identity *id, int *rank) {
    if (id->size < 4 || id->size > 16 || memcmp(id->data, "fwd", 3) != 0) return false;
    char text[17];
    memcpy(text, id->data + 3, id->size - 3);
    text[id->size - 3] = '\0';
    char *end;
    long r = strtol(text, &end, 10);
    *rank = (int)r;
    return *end == '\0' && r >= 0;
}

/* Takes part 0 of a state from primary `rank`: the record and the values,
 * checked against this shard; the stream's floats follow. */
static ts_status take_record(ps_server *sv, int rank, const ts_proto_msg *m) {
    if (m->nlengths != 2 || m->lengths[0] % 8 || m->lengths[1] % 8)
        return ts_error(TS_ERR_FORMAT, "part 0 of the state has %zu frames (the record and the values, whole "
                        "64-bit numbers, expected)", m->nlengths);
    ts_shard_state *st = &sv->in.st;
    st->nhead = m->lengths[0] / 8, st->nvalues = m->lengths[1] / 8;
    st->head = malloc(m->lengths[0] ? m->lengths[0] : 1);
    st->values = malloc(m->lengths[1] ? m->lengths[1] : 1);
    if (!st->head || !st->values) return ts_error(TS_ERR_MEMORY, "out of memory for the state's record");
    memcpy(st->head, m->payload[0].data, m->lengths[0]);
    memcpy(st->values, m->payload[1].data, m->lengths[1]);
    ts_status s = ts_shard_state_check(sv->sh, st->head, st->nhead, st->nvalues, &st->ndata);
    if (s) return s;
    if (!(st->data = malloc((size_t)(st->ndata ? st->ndata : 1) * sizeof *st->data)))
        return ts_error(TS_ERR_MEMORY, "out of memory for the state's %lld floats", (long long)st->ndata);
    sv->in.from = rank, sv->in.part = 1, sv->in.have = 0;
    return TS_OK;
}

/* Takes the next part of the stream. */
static ts_status take_floats(ps_server *sv, const ts_proto_msg *m) {
    ps_incoming *in = &sv->in;
    if (m->barrier_id != in->part || m->offset != in->have)
        return ts_error(TS_ERR_FORMAT, "part %lld of the state starts at float %lld; part %lld from float %lld was due",
                        (long long)m->barrier_id, (long long)m->offset, (long long)in->part, (long long)in->have);
    for (size_t i = 0; i < m->nlengths; i++) {
        if (m->lengths[i] % 4 || (int64_t)(m->lengths[i] / 4) > in->st.ndata - in->have)
            return ts_error(TS_ERR_FORMAT, "part %lld of the state: frame %zu of %llu bytes runs past the %lld floats "
                            "of the stream", (long long)in->part, i, (unsigned long long)m->lengths[i],
                            (long long)in->st.ndata);
        memcpy(in->st.data + in->have, m->payload[i].data, m->lengths[i]);
        in->have += (int64_t)(m->lengths[i] / 4);
    }
    in->part++;
    return TS_OK;
}

/* A spare takes its primary's state part by part; with the last one the
 * shard becomes that state, the spare its backup, and the primary gets an
 * ACK. A state from a rank this process does not see as its primary is
 * turned away "retry"; a bad one is refused naming what is wrong. */
static void on_state(ps_server *sv, const ts_proto_identity *from, int rank, const ts_proto_msg *m) {
    if (rank != sv->primary || sv->role == ROLE_PRIMARY || (sv->role == ROLE_BACKUP && sv->synced_to != rank)) {
        drop_incoming(sv);
        turn_away(sv, from, TS_PROTO_E_RETRY, "shard %d: rank %d is %s with primary rank %d, not a spare of rank %d",
                  sv->shard, sv->rank, ROLE_NAMES[sv->role], sv->primary, rank);
        return;
    }
    ts_status st;
    if (m->barrier_id == 0) {
        drop_incoming(sv);
        st = take_record(sv, rank, m);
    } else if (sv->in.from != rank) {
        st = ts_error(TS_ERR_STATE, "part %lld of a state whose record did not come", (long long)m->barrier_id);
    } else {
        st = take_floats(sv, m);
    }
    if (!st && sv->in.have == sv->in.st.ndata) {
        const ts_shard_state *x = &sv->in.st;
        int n;
        ts_proto_member *w = NULL;
        if (!(st = ts_shard_install(sv->sh, x->head, x->nhead, x->values, x->nvalues, x->data, x->ndata)) &&
            (w = ts_shard_live_workers(sv->sh, &n))) {
            free(sv->workers);
            sv->workers = w, sv->nworkers = n;
        }
        drop_incoming(sv);
        if (!st) {
            sv->synced_to = rank;
            sv->role = ROLE_BACKUP;
            printf("shard %d: rank %d took the state of step %lld from primary rank %d: it is its backup\n", sv->shard,
                   sv->rank, (long long)ts_shard_step(sv->sh), rank);
            ts_proto_msg a;
            ts_proto_msg_init(&a, TS_MSG_ACK, sv->o->job->name, sv->gen, sv->rank);
            a.step = ts_shard_step(sv->sh);
            reply(sv, from, &a, NULL, 0);
        }
    }
    if (st) {
        drop_incoming(sv);
        turn_away(sv, from, TS_PROTO_E_REFUSED, "shard %d: the state from rank %d: %s", sv->shard, rank,
                  ts_last_error());
    }
}

/* A backup takes what its primary forwarded and acknowledges it. */
static void on_forward(ps_server *sv, const ts_proto_identity *from, int rank, const ts_proto_msg *m) {
    if (m->type == TS_MSG_SNAPSHOT) {
        on_state(sv, from, rank, m);
        return;
    }
    if (sv->role != ROLE_BACKUP || rank != sv->primary) {
        turn_away(sv, from, TS_PROTO_E_REFUSED, "shard %d: rank %d is %s, not the backup of rank %d", sv->shard,
                  sv->rank, ROLE_NAMES[sv->role], rank);
        return;
    }
    if (m->type == TS_MSG_MEMBERSHIP) {
        int n;
        ts_proto_member *w = live_workers(m->roster, m->nroster, &n, NULL);
        if (w) {
            free(sv->workers);
            sv->workers = w;
            sv->nworkers = n;
            ts_shard_workers(sv->sh, m->generation, w, n);
        }
    } else {
        ts_shard_handle(sv->sh, from, m);
        sv->handled++;
    }
    ts_proto_msg a;
    ts_proto_msg_init(&a, TS_MSG_ACK, sv->o->job->name, sv->gen, sv->rank);
    a.step = m->step;
    reply(sv, from, &a, NULL, 0);
}

static void on_msg(void *owner, ts_proto_error e, ts_proto_rx *rx) {
    ps_server *sv = owner;
    if (e != TS_PROTO_OK) {
        sv->bad++;
        fprintf(stderr, "shard %d: refused a message: %s\n", sv->shard, ts_last_error());
        if (rx->identity.size && e != TS_PROTO_E_IO)
            ts_proto_send_error(sv->sock, &rx->identity, sv->o->job->name, sv->gen, sv->rank, e, ts_last_error());
        return;
    }
    follow(sv);
    const ts_proto_msg *m = &rx->msg;
    int from_rank;
    if (forwarded(&rx->identity, &from_rank)) {
        on_forward(sv, &rx->identity, from_rank, m);
    } else if (sv->role != ROLE_PRIMARY) {
        turn_away(sv, &rx->identity, TS_PROTO_E_RETRY, "shard %d: rank %d is its %s, not its primary", sv->shard,
                  sv->rank, ROLE_NAMES[sv->role]);
    } else if (m->generation > sv->gen) {
        turn_away(sv, &rx->identity, TS_PROTO_E_RETRY, "shard %d has not seen generation %llu yet (it is at %llu)",
                  sv->shard, (unsigned long long)m->generation, (unsigned long long)sv->gen);
    } else {
        enqueue(sv, &rx->identity, m, false);
    }
}

/* The tick: new generations, and the end of the job. */
static void on_tick(void *owner) {
    ps_server *sv = owner;
    follow(sv);
    if (sv->resync_ms && ts_zloop_now_ms(&sv->zl) >= sv->resync_ms) {
        sv->resync_ms = 0;
        place(sv);
    }
    int code = 0;
    if (!ts_member_shutdown_requested(sv->member, &code, sv->reason, sizeof sv->reason)) return;
    sv->code = code;
    link_close(sv);
    ts_shard_checkpoint(sv->sh);
    ts_zloop_stop(&sv->zl);
}

/* ---- start and end ---- */

/* Socket, keys and ZAP gate (without CURVE: neither); binds
 * tcp://<bind>:0 with limits for pushes of up to numel keys. */
static ts_status open_socket(ps_server *sv, int64_t numel) {
    sv->curve = sv->o->job->parallel.ps_security == TS_SECURITY_CURVE;
    if (!sv->curve) ts_secure_warn_plain("parallel.ps_security", "the parameter-server traffic");
    ts_status st = sv->curve ? ts_secure_load(sv->o->key_file, &sv->keys) : TS_OK;
    if (st) return st;
    if (!(sv->zctx = zmq_ctx_new())) return ts_error(TS_ERR_IO, "ps: zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
    if (sv->curve && !(sv->zap = ts_secure_zap_start(sv->zctx, &sv->keys))) return ts_last_status();
    if (!(sv->sock = zmq_socket(sv->zctx, ZMQ_ROUTER)))
        return ts_error(TS_ERR_IO, "ps: zmq_socket(ROUTER): %s", zmq_strerror(zmq_errno()));
    int one = 1, linger = 1000, timeout = PS_SEND_TIMEOUT_MS;
    zmq_setsockopt(sv->sock, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    zmq_setsockopt(sv->sock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(sv->sock, ZMQ_SNDTIMEO, &timeout, sizeof timeout);
    ts_proto_limits_default(&sv->lim);
    sv->lim.max_header_bytes = 256u * 1024u;
    sv->lim.max_payload_bytes = (uint64_t)numel * sizeof(float) + 4096;
    sv->lim.model_size = (uint64_t)numel;
    sv->lim.job = sv->o->job->name;
    if ((sv->curve && (st = ts_secure_server(sv->sock, &sv->keys))) || (st = ts_proto_limit_socket(sv->sock, &sv->lim)))
        return st;
    char bind[TS_JOB_BIND_MAX + 16];
    snprintf(bind, sizeof bind, "tcp://%s:0", sv->o->job->parallel.bind);
    if (zmq_bind(sv->sock, bind) != 0)
        return ts_error(TS_ERR_IO, "ps: cannot bind %s: %s", bind, zmq_strerror(zmq_errno()));
    char bound[TS_PROTO_ADDR_MAX + 1];
    size_t len = sizeof bound;
    if (zmq_getsockopt(sv->sock, ZMQ_LAST_ENDPOINT, bound, &len) != 0)
        return ts_error(TS_ERR_IO, "ps: ZMQ_LAST_ENDPOINT: %s", zmq_strerror(zmq_errno()));
    /* bound to every interface (0.0.0.0): the workers of other hosts reach
     * it by this host's name */
    ts_proto_public_endpoint(bound, sv->endpoint, sizeof sv->endpoint);
    return TS_OK;
}

/* Joins the job; asks again while a restarted process's old rank is still
 * held by the process the scheduler has not yet declared dead. */
static ts_status join(ps_server *sv) {
    const ts_job_parallel *p = &sv->o->job->parallel;
    ts_member_options opt = {.scheduler = sv->o->scheduler, .job = sv->o->job->name, .key_file = sv->o->key_file,
                             .role = TS_ROLE_PS, .address = sv->endpoint, .caps = "ps",
                             .prev_rank = sv->o->rank, .timeout_ms = p->join_timeout_ms};
    ts_status st;
    for (int tries = 0; (st = ts_member_join(&opt, &sv->member)) == TS_ERR_PEER && sv->o->rank >= 0 && tries < 20;
         tries++) {
        fprintf(stderr, "join refused (%s); asking again\n", ts_last_error());
        uv_sleep((unsigned)p->heartbeat_ms);
    }
    if (st) return st;
    ts_member_info info;
    ts_member_info_get(sv->member, &info);
    sv->rank = info.rank;
    sv->shard = info.rank % sv->shards;
    printf("joined rank=%d generation=%llu\n", info.rank, (unsigned long long)info.generation);
    return TS_OK;
}

/* Refuses to resume a run folder whose newest checkpoint a job of another
 * strategy wrote (a local, ddp, fsdp or pipeline run): no shard has a
 * checkpoint of it, so the job would train again from the seed while
 * looking resumed. */
static ts_status refuse_other_run(const ps_server *sv) {
    char root[TS_JOB_PATH_MAX + 64], path[TS_JOB_PATH_MAX + 128];
    int64_t step;
    if (!sv->o->run_dir || sv->o->job->parallel.strategy != TS_STRATEGY_PS) return TS_OK;
    snprintf(root, sizeof root, "%s/checkpoints", sv->o->run_dir);
    if (ts_checkpoint_latest(root, path, sizeof path, &step) != TS_OK || step < 0) return TS_OK;
    ts_checkpoint *ck = ts_checkpoint_open(path);
    ts_job job;
    bool other = ck && ck->config && ts_job_parse(ck->config, NULL, 0, &job) == TS_OK &&
                 job.parallel.strategy != TS_STRATEGY_PS;
    ts_checkpoint_close(ck);
    if (!other) return TS_OK;
    return ts_error(TS_ERR_STATE,
                    "shard %d: --resume: no checkpoint of this shard in %s/ps, and %s was written by a \"%s\" job: "
                    "a ps job resumes only from its shards' checkpoints; to start from its weights, run without "
                    "--resume with model.init_from=%s/model.safetensors",
                    sv->shard, sv->o->run_dir, path, ts_job_strategy_name(job.parallel.strategy), path);
}

/* The shard of this process, from the seed or its newest checkpoint. */
static ts_status make_shard(ps_server *sv, const ts_model *m) {
    char root[TS_JOB_PATH_MAX + 64];
    /* a job of another strategy only exercises the cluster: nothing to keep */
    bool keep = sv->o->run_dir && sv->o->job->parallel.strategy == TS_STRATEGY_PS;
    if (keep) snprintf(root, sizeof root, "%s/ps/shard-%d", sv->o->run_dir, sv->shard);
    ts_shard_config c = {.job = sv->o->job, .shard = sv->shard, .shards = sv->shards, .rank = sv->rank,
                         .root = keep ? root : NULL, .reply = reply, .ctx = sv};
    if (!(sv->sh = ts_shard_create(&c, m))) return ts_last_status();
    int64_t off, len;
    ts_shard_range(sv->sh, &off, &len);
    printf("shard %d of %d: keys [%lld, %lld) of %lld (%.2f MiB), %s\n", sv->shard, sv->shards, (long long)off,
           (long long)(off + len), (long long)m->numel, (double)len * 4 / (1 << 20),
           ts_job_consistency_name(sv->o->job->parallel.consistency));
    if (!sv->o->resume) return TS_OK;
    bool found;
    ts_status st = ts_shard_restore(sv->sh, -1, &found);
    if (!st && found)
        printf("shard %d: restored to step %lld from the run's checkpoints\n", sv->shard,
               (long long)ts_shard_step(sv->sh));
    else if (!st && !(st = refuse_other_run(sv)))
        printf("shard %d: no checkpoint in %s: starting from the seed\n", sv->shard, root);
    return st;
}

static void close_handle(uv_handle_t *h, void *arg) {
    (void)arg;
    if (!uv_is_closing(h)) uv_close(h, NULL);
}

static void server_free(ps_server *sv) {
    while (sv->head) {
        ps_entry *e = sv->head;
        sv->head = e->next;
        entry_free(e);
    }
    link_close(sv);
    if (sv->loop_ready) {
        ts_zloop_stop(&sv->zl);
        uv_walk(&sv->loop, close_handle, NULL);
        uv_run(&sv->loop, UV_RUN_DEFAULT);
        uv_loop_close(&sv->loop);
    }
    ts_zloop_free(&sv->zl);
    while (sv->closed) {
        ps_link *l = sv->closed;
        sv->closed = l->next;
        ts_zloop_free(&l->zl);
        free(l);
    }
    drop_incoming(sv);
    free(sv->roster);
    if (sv->sock) zmq_close(sv->sock);
    ts_secure_zap_stop(sv->zap);
    if (sv->zctx) zmq_ctx_term(sv->zctx);
    ts_shard_free(sv->sh);
    free(sv->workers);
}

int ts_ps_run(const ts_ps_options *o) {
    ps_server sv = {.o = o, .shards = o->job->parallel.servers, .primary = -1, .backup = -1, .role = ROLE_SPARE,
                    .synced_to = -1, .refused = -1, .in.from = -1};
    ts_model_spec spec;
    ts_model *m = NULL;
    ts_status st = sv.shards >= 1 ? TS_OK
                                  : ts_error(TS_ERR_VALUE, "parallel.servers: a parameter server needs at least one shard");
    if (!st) st = ts_job_model_spec(o->job, &spec);
    if (!st && !(m = ts_job_model_build(o->job, &spec, NULL)))
        st = ts_last_status();
    if (!st) sv.numel = m->numel, st = open_socket(&sv, m->numel);
    if (!st) st = join(&sv);
    if (!st) st = make_shard(&sv, m);
    ts_model_free(m);
    if (!st) {
        int rc = uv_loop_init(&sv.loop);
        if (rc) st = ts_error(TS_ERR_IO, "ps: uv_loop_init: %s", uv_strerror(rc));
        sv.loop_ready = !rc;
    }
    if (!st) st = ts_zloop_init(&sv.zl, &sv.loop, sv.sock, &sv.lim, PS_TICK_MS, on_msg, on_tick, &sv);
    if (!st) {
        uint64_t g;
        ts_proto_member *r = NULL;
        size_t n = 0;
        if (!(st = ts_member_roster(sv.member, &r, &n, &g))) {
            ts_member_poll_membership(sv.member, NULL, NULL, NULL); /* the join's own generation */
            take_roster(&sv, g, r, n);
        } else {
            free(r);
        }
    }
    if (st) {
        fprintf(stderr, "tessera-ps: %s\n", ts_last_error());
        if (sv.member) ts_member_leave(sv.member, "the parameter server could not start");
        server_free(&sv);
        return 1;
    }
    ts_zloop_start(&sv.zl);
    uv_run(&sv.loop, UV_RUN_DEFAULT);
    /* a failed job's reason on stderr, whose last line a launcher gives as the node's error */
    fprintf(sv.code ? stderr : stdout, "shutdown (code %d): %s\n", sv.code, sv.reason);
    printf("shard %d: %llu requests handled, %llu refused, step %lld, %lld updates\n", sv.shard,
           (unsigned long long)sv.handled, (unsigned long long)(sv.bad + ts_shard_refused(sv.sh)),
           (long long)ts_shard_step(sv.sh), (long long)ts_shard_updates(sv.sh));
    if (sv.member) ts_member_close(sv.member);
    server_free(&sv);
    return sv.code;
}
