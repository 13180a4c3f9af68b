/* server.c - the parameter-server process: its socket, its place in the
 * job, and the order in which requests reach the shard (contract in ps.h).
 *
 * One libuv loop serves the CURVE ROUTER socket through a proto/zloop.h
 * poll-and-drain loop. Requests that change the shard pass through a queue:
 * with a backup, each is forwarded to it (the primary's DEALER announces
 * itself with the routing id "fwd<rank>") and handed to the shard once the
 * backup acknowledged it; pulls wait behind them so a worker's pull sees
 * its own apply. Without a backup the queue is empty and requests go
 * straight to the shard, zero-copy from the received frames.
 */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* The DEALER to the backup, on its own zloop. */
typedef struct {
    void *sock;
    ts_zloop zl;
    bool open;
} ps_link;

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
    ps_link fwd;
    ps_role role;
    int primary, backup;     /* ranks in this shard's chain, -1 none */
    uint64_t gen;            /* newest generation the member announced */
    int32_t *workers;        /* live workers as the shard last got them */
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
    int32_t *ranks = malloc((e->msg.nroster ? e->msg.nroster : 1) * sizeof *ranks);
    int n = 0;
    for (size_t i = 0; ranks && i < e->msg.nroster; i++) ranks[n++] = e->msg.roster[i].rank;
    if (ranks) ts_shard_workers(sv->sh, e->msg.generation, ranks, n);
    free(ranks);
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
    ts_status st = ts_proto_send(sv->fwd.sock, NULL, &e->msg, p, np, 0);
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
    if (!sv->head && !sv->fwd.open) {
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
    if (sv->fwd.open && (is_workers || changes_shard(m->type)) && forward(sv, e))
        fprintf(stderr, "shard %d: forwarding to backup rank %d failed: %s\n", sv->shard, sv->backup, ts_last_error());
    if (sv->tail) sv->tail->next = e;
    else sv->head = e;
    sv->tail = e;
    run_queue(sv);
}

/* ---- the backup link ---- */

static void on_tick_none(void *owner) { (void)owner; }

/* The backup acknowledged the oldest forward (or refused it: then the chain
 * is broken and this process stops). */
static void on_backup_msg(void *owner, ts_proto_error e, ts_proto_rx *rx) {
    ps_server *sv = owner;
    if (e != TS_PROTO_OK || rx->msg.type != TS_MSG_ACK) {
        snprintf(sv->reason, sizeof sv->reason, "backup rank %d answered a forward with %s: %.300s", sv->backup,
                 e ? ts_proto_error_name(e) : ts_proto_type_name(rx->msg.type),
                 e ? ts_last_error() : rx->msg.reason);
        fprintf(stderr, "shard %d: %s; stopping\n", sv->shard, sv->reason);
        sv->code = 1;
        ts_member_leave(sv->member, sv->reason);
        sv->member = NULL;
        ts_zloop_stop(&sv->zl);
        ts_zloop_stop(&sv->fwd.zl);
        return;
    }
    for (ps_entry *x = sv->head; x; x = x->next)
        if (x->forwarded && !x->acked) {
            x->acked = true;
            break;
        }
    run_queue(sv);
}

/* Connects the DEALER to the backup at address. */
static ts_status link_open(ps_server *sv, const char *address) {
    ps_link *l = &sv->fwd;
    char id[32];
    int idlen = snprintf(id, sizeof id, "fwd%d", sv->rank);
    int linger = 1000, timeout = PS_SEND_TIMEOUT_MS;
    ts_proto_limits lim;
    ts_proto_limits_default(&lim);
    lim.max_frames = 0;
    l->sock = zmq_socket(sv->zctx, ZMQ_DEALER);
    if (!l->sock) return ts_error(TS_ERR_IO, "shard %d: zmq_socket(DEALER): %s", sv->shard, zmq_strerror(zmq_errno()));
    zmq_setsockopt(l->sock, ZMQ_ROUTING_ID, id, (size_t)idlen);
    zmq_setsockopt(l->sock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(l->sock, ZMQ_SNDTIMEO, &timeout, sizeof timeout);
    ts_status st = sv->curve ? ts_secure_client(l->sock, &sv->keys) : TS_OK;
    if (!st) st = ts_proto_limit_socket(l->sock, &lim);
    if (!st && zmq_connect(l->sock, address) != 0)
        st = ts_error(TS_ERR_IO, "shard %d: cannot connect to backup %s: %s", sv->shard, address,
                      zmq_strerror(zmq_errno()));
    if (!st) st = ts_zloop_init(&l->zl, &sv->loop, l->sock, &lim, 1000, on_backup_msg, on_tick_none, sv);
    if (st) {
        zmq_close(l->sock);
        l->sock = NULL;
        return st;
    }
    ts_zloop_start(&l->zl);
    l->open = true;
    return TS_OK;
}

/* The backup is gone: what waited for its acknowledgement goes ahead. */
static void link_close(ps_server *sv) {
    if (!sv->fwd.open) return;
    ts_zloop_stop(&sv->fwd.zl);
    sv->fwd.open = false;
    for (ps_entry *e = sv->head; e; e = e->next) e->acked = true;
    run_queue(sv);
}

/* ---- following the job ---- */

/* The live worker ranks of roster r, ascending; *n of them (malloc'd);
 * *formed (may be NULL) is the generation the last of them joined in. */
static int32_t *live_workers(const ts_proto_member *r, size_t n, int *count, uint64_t *formed) {
    int32_t *w = malloc((n ? n : 1) * sizeof *w);
    int k = 0;
    if (formed) *formed = 0;
    for (size_t i = 0; w && i < n; i++) {
        if (r[i].role != TS_ROLE_WORKER || !r[i].alive) continue;
        if (formed && r[i].joined_generation > *formed) *formed = r[i].joined_generation;
        int j = k++;
        while (j > 0 && w[j - 1] > r[i].rank) w[j] = w[j - 1], j--;
        w[j] = r[i].rank;
    }
    *count = k;
    return w;
}

/* Gives the shard the live workers (through the queue, so the backup sees
 * the change at the same point) when they differ from what it has. */
static void give_workers(ps_server *sv, uint64_t g, int32_t *w, int n) {
    if (n == sv->nworkers && (!n || !memcmp(w, sv->workers, (size_t)n * sizeof *w))) {
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
        ros[i] = (ts_proto_member){.rank = w[i], .role = TS_ROLE_WORKER, .alive = true, .last_step = -1,
                                   .last_barrier = -1, .heartbeat_age_ms = -1, .joined_generation = g};
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

/* Takes roster r of generation g: this process's role in its shard's
 * chain, the backup link, and (primary) the live workers. */
static void take_roster(ps_server *sv, uint64_t g, const ts_proto_member *r, size_t n) {
    sv->gen = g;
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
    ps_role role = p == sv->rank ? ROLE_PRIMARY : b == sv->rank ? ROLE_BACKUP : ROLE_SPARE;
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
    if (role == ROLE_PRIMARY && b != sv->backup) {
        link_close(sv);
        const char *address = NULL;
        for (size_t i = 0; i < n; i++)
            if (r[i].rank == b && r[i].role == TS_ROLE_PS) address = r[i].address;
        if (b >= 0 && !sv->fwd.sock && address && link_open(sv, address))
            fprintf(stderr, "shard %d: no link to backup rank %d: %s\n", sv->shard, b, ts_last_error());
    } else if (role != ROLE_PRIMARY) {
        link_close(sv);
    }
    sv->backup = role == ROLE_PRIMARY && sv->fwd.open ? b : role == ROLE_BACKUP ? b : -1;
    if (role == ROLE_PRIMARY) {
        int nw;
        uint64_t formed;
        int32_t *w = live_workers(r, n, &nw, &formed);
        /* a shard that knew no workers (a restart) takes them as of the
         * generation they were complete in: their messages are not stale */
        if (w) give_workers(sv, sv->workers ? g : formed, w, nw);
    }
}

/* Takes a generation the scheduler announced since the last look. */
static void follow(ps_server *sv) {
    uint64_t g;
    ts_proto_member *r = NULL;
    size_t n = 0;
    if (!ts_member_poll_membership(sv->member, &g, &r, &n)) return;
    take_roster(sv, g, r, n);
    free(r);
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

/* A backup takes what its primary forwarded and acknowledges it. */
static void on_forward(ps_server *sv, const ts_proto_identity *from, int rank, const ts_proto_msg *m) {
    if (sv->role != ROLE_BACKUP || rank != sv->primary) {
        turn_away(sv, from, TS_PROTO_E_REFUSED, "shard %d: rank %d is %s, not the backup of rank %d", sv->shard,
                  sv->rank, ROLE_NAMES[sv->role], rank);
        return;
    }
    if (m->type == TS_MSG_MEMBERSHIP) {
        int n;
        int32_t *w = live_workers(m->roster, m->nroster, &n, NULL);
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
    int code = 0;
    if (!ts_member_shutdown_requested(sv->member, &code, sv->reason, sizeof sv->reason)) return;
    sv->code = code;
    ts_shard_checkpoint(sv->sh);
    ts_zloop_stop(&sv->zl);
    if (sv->fwd.open) ts_zloop_stop(&sv->fwd.zl);
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
    size_t len = sizeof sv->endpoint;
    if (zmq_getsockopt(sv->sock, ZMQ_LAST_ENDPOINT, sv->endpoint, &len) != 0)
        return ts_error(TS_ERR_IO, "ps: ZMQ_LAST_ENDPOINT: %s", zmq_strerror(zmq_errno()));
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
        printf("shard %d: restored from its checkpoint of step %lld\n", sv->shard, (long long)ts_shard_step(sv->sh));
    else if (!st)
        printf("shard %d: no checkpoint in %s: starting from the seed\n", sv->shard, root);
    return st;
}

static void close_handle(uv_handle_t *h, void *arg) {
    (void)arg;
    if (!uv_is_closing(h)) uv_close(h, NULL);
}

static void server_free(ps_server *sv) {
    if (sv->loop_ready) {
        ts_zloop_stop(&sv->zl);
        if (sv->fwd.sock) ts_zloop_stop(&sv->fwd.zl);
        uv_walk(&sv->loop, close_handle, NULL);
        uv_run(&sv->loop, UV_RUN_DEFAULT);
        uv_loop_close(&sv->loop);
    }
    ts_zloop_free(&sv->zl);
    ts_zloop_free(&sv->fwd.zl);
    while (sv->head) {
        ps_entry *e = sv->head;
        sv->head = e->next;
        entry_free(e);
    }
    if (sv->fwd.sock) zmq_close(sv->fwd.sock);
    if (sv->sock) zmq_close(sv->sock);
    ts_secure_zap_stop(sv->zap);
    if (sv->zctx) zmq_ctx_term(sv->zctx);
    ts_shard_free(sv->sh);
    free(sv->workers);
}

int ts_ps_run(const ts_ps_options *o) {
    ps_server sv = {.o = o, .shards = o->job->parallel.servers, .primary = -1, .backup = -1, .role = ROLE_SPARE};
    ts_model_spec spec;
    ts_model *m = NULL;
    ts_status st = sv.shards >= 1 ? TS_OK
                                  : ts_error(TS_ERR_VALUE, "parallel.servers: a parameter server needs at least one shard");
    if (!st) st = ts_job_model_spec(o->job, &spec);
    if (!st && !(m = ts_job_model_build(o->job, &spec, 0, -1)))
        st = ts_last_status();
    if (!st) st = open_socket(&sv, m->numel);
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
        }
        free(r);
    }
    if (st) {
        fprintf(stderr, "tessera-ps: %s\n", ts_last_error());
        if (sv.member) ts_member_leave(sv.member, "the parameter server could not start");
        server_free(&sv);
        return 1;
    }
    ts_zloop_start(&sv.zl);
    uv_run(&sv.loop, UV_RUN_DEFAULT);
    printf("shutdown (code %d): %s\n", sv.code, sv.reason);
    printf("shard %d: %llu requests handled, %llu refused, step %lld, %lld updates\n", sv.shard,
           (unsigned long long)sv.handled, (unsigned long long)(sv.bad + ts_shard_refused(sv.sh)),
           (long long)ts_shard_step(sv.sh), (long long)ts_shard_updates(sv.sh));
    if (sv.member) ts_member_close(sv.member);
    server_free(&sv);
    return sv.code;
}
