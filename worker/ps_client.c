/* ps_client.c - the worker's parameter-server client (contract in
 * ps_client.h): connections to the primaries, pushes, commits, applies,
 * pulls, reductions, rollbacks, and the wait that follows the job. */
#include "worker/ps_client.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/clock.h"
#include "kernels/tensor.h"
#include "proto/secure.h"
#include "sharding/keys.h"

/* A shard's ready gradients go out once this many bytes are ready (or all
 * of its keys are). */
#define PS_PUSH_MIN_BYTES (1 << 20)
/* Ranges go on the wire as frames of at most this many keys (1 MiB of f32):
 * CURVE seals each frame on its own, so the sender seals the next frame
 * while the receiver opens the last one. */
#define PS_FRAME_KEYS (256 * 1024)
/* After a "retry" answer the step's messages go again this much later. */
#define PS_RETRY_MS 5
/* A wait looks at the membership at least this often. */
#define PS_POLL_MS 10

/* The ranges of one push, kept to send it again. */
typedef struct {
    ts_proto_range *r;
    size_t n;
} push_rec;

/* One shard as this worker sees it, and what the step sent it. */
typedef struct {
    int64_t off, len;
    int rank;                  /* its primary, -1 none */
    int last;                  /* the last primary this worker knew (at address), -1 none */
    uint64_t lost;             /* the generation since which it has had no live server, 0 while it has one */
    char address[TS_PROTO_ADDR_MAX + 1];
    void *sock;
    ts_range *pend;            /* ready ranges not pushed yet */
    int npend, cappend;
    int64_t pend_keys, ready;  /* keys pending; keys ready this step */
    push_rec *pushes;
    int npushes, cappushes;
    bool commit_sent, commit_done, apply_sent;
    double decided[TS_DECIDED_VALUES];
    bool pull_sent, pull_done;
    int64_t pull_want, pull_step;
    ts_loader_pos pull_pos;
    int pull_nvalues;          /* the answer's step values (0 or TS_STEP_VALUES) */
    double pull_values[TS_STEP_VALUES];
    bool reduce_sent, reduce_done;
    bool rollback_sent, rollback_done;
    int64_t rollback_at;
    double resend_at;          /* > 0: send the step's messages again then */
} shard_link;

struct ts_ps_client {
    ts_ps_client_config cfg;
    ts_secure_keys keys;
    bool curve;                 /* parallel.ps_security: the shard links are CURVE */
    void *zctx;
    int shards;
    shard_link *s;
    zmq_pollitem_t *items;     /* a poll of the shards' sockets (one per shard) */
    int *item_shard;           /* the shard of each item */
    uint16_t *wire16;          /* bf16 gradients on the wire, or NULL */
    int32_t me;
    uint64_t gen;              /* the roster's generation */
    int32_t *workers;          /* live worker ranks, ascending */
    int nworkers;
    int64_t step;
    uint64_t msg_gen;          /* the generation the step is computed in */
    double commit[TS_COMMIT_VALUES];
    double apply_sq;
    int64_t red_step, red_id, rb_to;
    double *red_vals;          /* the reduction's values, and where its sums go */
    int red_n;
    ts_ps_event ev;
    char ev_why[TS_PROTO_REASON_MAX + 1]; /* the shard's reason for ev */
    ts_status fatal;
    char fatal_msg[1024];
    ts_ps_times times;
    ts_proto_limits lim;
    ts_proto_rx rx;
};

static void no_free(void *data, void *hint) { (void)data, (void)hint; }

/* ---- sending ---- */

/* The frames a range of len keys goes in. */
static size_t frames_of(int64_t len) { return (size_t)((len + PS_FRAME_KEYS - 1) / PS_FRAME_KEYS); }

/* Appends [off, off + len) to r[*n..] as frames_of(len) ranges of at most
 * PS_FRAME_KEYS keys. */
static void cut_frames(ts_proto_range *r, size_t *n, int64_t off, int64_t len) {
    for (int64_t at = 0; at < len; at += PS_FRAME_KEYS)
        r[(*n)++] = (ts_proto_range){(uint64_t)(off + at), (uint64_t)(len - at < PS_FRAME_KEYS ? len - at : PS_FRAME_KEYS)};
}

/* A message of the step from this worker. */
static void msg_init(ts_ps_client *c, ts_proto_msg *m, ts_proto_type t, int64_t step) {
    ts_proto_msg_init(m, t, c->cfg.job->name, c->msg_gen, c->me);
    m->step = step;
}

/* Sends m to shard k; a failure (a primary that does not take messages)
 * sends the step's messages again a moment later. */
static void send_to(ts_ps_client *c, int k, const ts_proto_msg *m, const ts_proto_payload *p, size_t np) {
    shard_link *l = &c->s[k];
    if (!l->sock || ts_proto_send(l->sock, NULL, m, p, np, 0)) l->resend_at = ts_clock_ms() + PS_RETRY_MS;
}

static void send_values(ts_ps_client *c, int k, ts_proto_type t, int64_t step, int64_t id, const double *v, int n) {
    ts_proto_msg m;
    ts_proto_payload p;
    msg_init(c, &m, t, step);
    ts_proto_msg_values(&m, id, v, n, &p);
    send_to(c, k, &m, &p, 1);
}

static void send_push(ts_ps_client *c, int k, const push_rec *r) {
    ts_proto_msg m;
    msg_init(c, &m, TS_MSG_PUSH, c->step);
    m.dtype = c->wire16 ? TS_PROTO_DT_BF16 : TS_PROTO_DT_F32;
    ts_proto_payload *p = calloc(r->n, sizeof *p);
    if (!p || ts_proto_msg_set_ranges(&m, r->r, r->n)) {
        free(p);
        c->s[k].resend_at = ts_clock_ms() + PS_RETRY_MS;
        return;
    }
    for (size_t i = 0; i < r->n; i++) {
        size_t at = r->r[i].offset;
        p[i] = c->wire16 ? (ts_proto_payload){c->wire16 + at, r->r[i].len * 2, no_free, NULL}
                         : (ts_proto_payload){c->cfg.grads + at, r->r[i].len * 4, no_free, NULL};
    }
    send_to(c, k, &m, p, r->n);
    free(p);
    ts_proto_msg_free(&m);
}

/* Sends a message asking for ranges (PULL) or naming a step (ROLLBACK). */
static void send_ask(ts_ps_client *c, int k, ts_proto_type t, int64_t step) {
    ts_proto_msg m;
    msg_init(c, &m, t, step);
    shard_link *l = &c->s[k];
    if (t == TS_MSG_PULL) {
        m.dtype = TS_PROTO_DT_F32;
        m.ranges = malloc(frames_of(l->len) * sizeof *m.ranges);
        if (!m.ranges) {
            l->resend_at = ts_clock_ms() + PS_RETRY_MS;
            return;
        }
        cut_frames(m.ranges, &m.nranges, l->off, l->len);
    }
    send_to(c, k, &m, NULL, 0);
    ts_proto_msg_free(&m);
}

/* Sends shard k everything the step sent it so far, in order. */
static void resend(ts_ps_client *c, int k) {
    shard_link *l = &c->s[k];
    l->resend_at = 0;
    for (int i = 0; i < l->npushes; i++) send_push(c, k, &l->pushes[i]);
    if (l->commit_sent) send_values(c, k, TS_MSG_COMMIT, c->step, 0, c->commit, TS_COMMIT_VALUES);
    if (l->apply_sent) send_values(c, k, TS_MSG_APPLY, c->step, 0, &c->apply_sq, 1);
    if (l->pull_sent && !l->pull_done) send_ask(c, k, TS_MSG_PULL, l->pull_want);
    if (l->reduce_sent && !l->reduce_done)
        send_values(c, k, TS_MSG_REDUCE, c->red_step, c->red_id, c->red_vals, c->red_n);
    if (l->rollback_sent && !l->rollback_done) send_ask(c, k, TS_MSG_ROLLBACK, c->rb_to);
}

/* ---- following the roster ---- */

/* Connects shard k's socket to its primary at address. */
static ts_status connect_shard(ts_ps_client *c, int k, const char *address) {
    shard_link *l = &c->s[k];
    if (l->sock) zmq_close(l->sock);
    snprintf(l->address, sizeof l->address, "%s", address);
    int zero = 0, timeout = 1000;
    if (!(l->sock = zmq_socket(c->zctx, ZMQ_DEALER)))
        return ts_error(TS_ERR_IO, "ps client: zmq_socket(DEALER): %s", zmq_strerror(zmq_errno()));
    zmq_setsockopt(l->sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(l->sock, ZMQ_SNDTIMEO, &timeout, sizeof timeout);
    ts_status st = c->curve ? ts_secure_client(l->sock, &c->keys) : TS_OK;
    if (!st) st = ts_proto_limit_socket(l->sock, &c->lim);
    if (!st && zmq_connect(l->sock, address) != 0)
        st = ts_error(TS_ERR_IO, "ps client: cannot connect to shard %d at %s: %s", k, address,
                      zmq_strerror(zmq_errno()));
    return st;
}

/* Takes roster r of generation g: the primaries (a new one is connected
 * and sent the step's messages again) and the live workers. */
static void take_roster(ts_ps_client *c, uint64_t g, const ts_proto_member *r, size_t n) {
    c->gen = g;
    ts_keys_server *ps = calloc(n ? n : 1, sizeof *ps);
    int *primary = calloc((size_t)c->shards, sizeof *primary), *backup = calloc((size_t)c->shards, sizeof *backup);
    int32_t *w = malloc((n ? n : 1) * sizeof *w);
    if (!ps || !primary || !backup || !w) {
        free(ps), free(primary), free(backup), free(w);
        fprintf(stderr, "ps client: out of memory following generation %llu\n", (unsigned long long)g);
        return;
    }
    int nps = 0, nw = 0;
    for (size_t i = 0; i < n; i++) {
        if (!r[i].alive) continue;
        if (r[i].role == TS_ROLE_PS) ps[nps++] = (ts_keys_server){r[i].rank, r[i].joined_generation};
        if (r[i].role == TS_ROLE_WORKER) {
            int j = nw++;
            while (j > 0 && w[j - 1] > r[i].rank) w[j] = w[j - 1], j--;
            w[j] = r[i].rank;
        }
    }
    ts_keys_chains(ps, nps, c->shards, primary, backup);
    for (int k = 0; k < c->shards; k++) {
        shard_link *l = &c->s[k];
        const char *address = NULL;
        for (size_t i = 0; i < n; i++)
            if (r[i].rank == primary[k] && r[i].role == TS_ROLE_PS) address = r[i].address;
        if (primary[k] < 0) { /* no live server: sends wait for the next generation's */
            if (!l->lost) l->lost = g;
            l->rank = -1;
            continue;
        }
        if (primary[k] == l->rank && (!address || !strcmp(address, l->address))) continue;
        l->rank = l->last = primary[k];
        l->lost = 0;
        if (!address) continue;
        if (connect_shard(c, k, address)) {
            fprintf(stderr, "ps client: %s\n", ts_last_error());
            l->resend_at = ts_clock_ms() + PS_RETRY_MS;
            continue;
        }
        resend(c, k);
    }
    free(c->workers);
    c->workers = w;
    c->nworkers = nw;
    free(ps), free(primary), free(backup);
}

/* Takes a generation announced since the last look. */
static void follow(ts_ps_client *c) {
    uint64_t g;
    ts_proto_member *r = NULL;
    size_t n = 0;
    if (!ts_member_poll_membership(c->cfg.member, &g, &r, &n)) return;
    take_roster(c, g, r, n);
    free(r);
}

void ts_ps_client_workers(ts_ps_client *c, uint64_t *generation, int *index, int *workers) {
    follow(c);
    *generation = c->gen;
    *index = -1;
    for (int i = 0; i < c->nworkers; i++)
        if (c->workers[i] == c->me) *index = i;
    *workers = c->nworkers;
}

/* ---- answers ---- */

/* Writes what names shard k in a message into out: its primary's rank and
 * address, or since when it has had no live server and which was its last. */
static void shard_name(const ts_ps_client *c, int k, char *out, size_t cap) {
    const shard_link *l = &c->s[k];
    if (l->rank >= 0)
        snprintf(out, cap, "shard %d (rank %d at %s)", k, l->rank, l->address);
    else if (l->last >= 0)
        snprintf(out, cap, "shard %d has had no live server since generation %llu (its last, ps rank %d at %s, left "
                 "the job)", k, (unsigned long long)l->lost, l->last, l->address);
    else
        snprintf(out, cap, "shard %d has had no live server since generation %llu (this worker never saw one)", k,
                 (unsigned long long)l->lost);
}

/* Records that shard k failed for a reason no retry mends. */
static void fail(ts_ps_client *c, int k, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail(ts_ps_client *c, int k, const char *fmt, ...) {
    if (c->fatal) return;
    char what[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    char name[TS_PROTO_ADDR_MAX + 160];
    shard_name(c, k, name, sizeof name);
    snprintf(c->fatal_msg, sizeof c->fatal_msg, "%s: %s", name, what);
    c->fatal = TS_ERR_PEER;
}

/* Copies the values of a values message into out (want of them). */
static bool take_values(ts_ps_client *c, int k, const ts_proto_msg *m, double *out, int want) {
    if (m->nlengths != 1 || m->payload[0].size != (size_t)want * sizeof(double)) {
        fail(c, k, "%s with %zu bytes of values, expected %d", ts_proto_type_name(m->type),
             m->nlengths ? m->payload[0].size : 0, want);
        return false;
    }
    memcpy(out, m->payload[0].data, (size_t)want * sizeof(double));
    return true;
}

/* Writes a pull's answer (the shard's keys in the frames asked for) into
 * the parameters. */
static void take_pull(ts_ps_client *c, int k, const ts_proto_msg *m) {
    shard_link *l = &c->s[k];
    bool ok = m->dtype == TS_PROTO_DT_F32 && m->nranges == frames_of(l->len) && m->nlengths == m->nranges;
    for (size_t i = 0; ok && i < m->nranges; i++)
        ok = m->ranges[i].offset == (uint64_t)l->off + i * PS_FRAME_KEYS && m->lengths[i] == m->ranges[i].len * 4;
    if (!ok) {
        fail(c, k, "a pull answer that is not its keys [%lld, +%lld) in f32", (long long)l->off, (long long)l->len);
        return;
    }
    for (size_t i = 0; i < m->nranges; i++)
        memcpy(c->cfg.params + m->ranges[i].offset, m->payload[i].data, m->payload[i].size);
    l->pull_step = m->step;
    l->pull_pos = (ts_loader_pos){m->epoch, m->offset};
    l->pull_nvalues = (int)m->nstep_values;
    memcpy(l->pull_values, m->step_values, sizeof l->pull_values);
    l->pull_done = true;
}

/* Acts on one answer from shard k. */
static void handle(ts_ps_client *c, int k, const ts_proto_msg *m) {
    shard_link *l = &c->s[k];
    switch (m->type) {
    case TS_MSG_ACK:
        if (l->rollback_sent && !l->rollback_done) {
            l->rollback_at = m->step;
            l->rollback_done = true;
        }
        return;
    case TS_MSG_COMMIT_REPLY:
        if (l->commit_sent && m->step == c->step && take_values(c, k, m, l->decided, TS_DECIDED_VALUES))
            l->commit_done = true;
        return;
    case TS_MSG_PULL_REPLY:
        if (l->pull_sent && !l->pull_done) take_pull(c, k, m);
        return;
    case TS_MSG_REDUCE_REPLY:
        if (l->reduce_sent && m->step == c->red_step && m->barrier_id == c->red_id &&
            take_values(c, k, m, c->red_vals, c->red_n))
            l->reduce_done = true;
        return;
    case TS_MSG_ERROR:
        if (m->code == TS_PROTO_E_RETRY) {
            l->resend_at = ts_clock_ms() + PS_RETRY_MS;
        } else if (m->code == TS_PROTO_E_REDO || m->code == TS_PROTO_E_BEHIND || m->code == TS_PROTO_E_SKIP) {
            /* the first one counts; the step's other messages get the same answer */
            bool reducing = l->reduce_sent && !l->reduce_done && m->step == c->red_step;
            ts_ps_event_kind kind = m->code == TS_PROTO_E_REDO     ? TS_PS_REDO
                                    : m->code == TS_PROTO_E_BEHIND ? TS_PS_BEHIND
                                                                   : TS_PS_SKIP;
            if (c->ev.kind == TS_PS_NONE &&
                (kind == TS_PS_BEHIND || (kind == TS_PS_REDO && m->step == c->step) || reducing)) {
                c->ev = (ts_ps_event){kind, m->generation, m->step, k};
                snprintf(c->ev_why, sizeof c->ev_why, "%s", m->reason);
            }
        } else {
            fail(c, k, "%s [%s]", m->reason, ts_proto_error_name(m->code));
        }
        return;
    default: fail(c, k, "an unexpected %s message", ts_proto_type_name(m->type));
    }
}

/* Receives and handles what the shards' sockets hold, waiting up to ms. */
static void poll_shards(ts_ps_client *c, int ms) {
    zmq_pollitem_t *items = c->items;
    int *idx = c->item_shard, n = 0;
    for (int k = 0; k < c->shards; k++)
        if (c->s[k].sock) items[n] = (zmq_pollitem_t){c->s[k].sock, 0, ZMQ_POLLIN, 0}, idx[n++] = k;
    if (!n) {
        ts_sleep_ms(ms);
        return;
    }
    if (zmq_poll(items, n, ms) <= 0) return;
    for (int i = 0; i < n; i++) {
        if (!(items[i].revents & ZMQ_POLLIN)) continue;
        ts_proto_error e;
        while ((e = ts_proto_recv(items[i].socket, &c->lim, ZMQ_DONTWAIT, &c->rx)) != TS_PROTO_E_AGAIN) {
            if (e == TS_PROTO_OK) handle(c, idx[i], &c->rx.msg);
            else if (e != TS_PROTO_E_IO) fail(c, idx[i], "an answer that does not decode: %s", ts_last_error());
            else break;
        }
    }
}

/* What a wait waits for. */
typedef enum { WAIT_COMMIT, WAIT_PULL, WAIT_REDUCE, WAIT_ROLLBACK } wait_kind;
static const char *const WAIT_NAMES[] = {"commit", "pull", "reduction", "rollback"};

/* Whether shard k answered what the wait waits for. */
static bool answered(const shard_link *l, wait_kind w) {
    switch (w) {
    case WAIT_COMMIT: return !l->commit_sent || l->commit_done;
    case WAIT_PULL: return !l->pull_sent || l->pull_done;
    case WAIT_REDUCE: return !l->reduce_sent || l->reduce_done;
    default: return !l->rollback_sent || l->rollback_done;
    }
}

/* The first shard that has not answered, or -1. */
static int missing(const ts_ps_client *c, wait_kind w) {
    for (int k = 0; k < c->shards; k++)
        if (!answered(&c->s[k], w)) return k;
    return -1;
}

/* The first shard that has not answered w and has no live server, or -1. */
static int orphaned(const ts_ps_client *c, wait_kind w) {
    for (int k = 0; k < c->shards; k++)
        if (!answered(&c->s[k], w) && c->s[k].rank < 0) return k;
    return -1;
}

/* The longest a wait goes without progress. */
static double patience_ms(const ts_ps_client *c) {
    const ts_job_parallel *p = &c->cfg.job->parallel;
    double a = p->barrier_timeout_ms, b = 4.0 * p->heartbeat_timeout_ms;
    return a > b ? a : b;
}

/* Waits until every shard answered w, following the job meanwhile; the
 * time goes to *acc. */
static ts_status wait_for(ts_ps_client *c, wait_kind w, double *acc) {
    double t0 = ts_clock_ms(), deadline = t0 + patience_ms(c);
    c->ev.kind = TS_PS_NONE;
    ts_status st = TS_OK;
    int k;
    while ((k = missing(c, w)) >= 0) {
        if (c->fatal) {
            st = ts_error(c->fatal, "%s", c->fatal_msg);
            c->fatal = TS_OK;
            break;
        }
        if (c->ev.kind != TS_PS_NONE && w == WAIT_ROLLBACK) {
            c->ev.kind = TS_PS_NONE; /* answers to the step being undone */
        } else if (c->ev.kind != TS_PS_NONE) {
            const char *what = c->ev.kind == TS_PS_BEHIND ? "roll back to"
                               : c->ev.kind == TS_PS_SKIP ? "go on without the evaluation of"
                               : w == WAIT_REDUCE         ? "evaluate again"
                                                          : "compute again";
            st = ts_error(TS_ERR_STATE, "shard %d asked to %s step %lld (%s)", c->ev.shard, what,
                          (long long)c->ev.step, c->ev_why);
            break;
        }
        if (ts_member_shutdown_requested(c->cfg.member, NULL, NULL, 0)) {
            c->ev = (ts_ps_event){TS_PS_FINISHED, c->gen, c->step, k};
            st = ts_error(TS_ERR_STATE, "the job ended while waiting for the %s of step %lld", WAIT_NAMES[w],
                          (long long)c->step);
            break;
        }
        uint64_t g = c->gen;
        follow(c);
        double now = ts_clock_ms();
        if (c->gen != g) deadline = now + patience_ms(c);
        int lost = orphaned(c, w);
        char name[TS_PROTO_ADDR_MAX + 160];
        if (lost >= 0 && c->cfg.no_restarts) {
            shard_name(c, lost, name, sizeof name);
            st = ts_error(TS_ERR_PEER, "%s; nothing restarts a server under mpirun: the %s of step %lld has no one "
                          "to answer it", name, WAIT_NAMES[w], (long long)c->step);
            break;
        }
        if (now > deadline) {
            shard_name(c, lost >= 0 ? lost : k, name, sizeof name);
            st = lost >= 0 ? ts_error(TS_ERR_TIMEOUT, "%s; none came back within %.0f ms for the %s of step %lld", name,
                                      patience_ms(c), WAIT_NAMES[w], (long long)c->step)
                           : ts_error(TS_ERR_TIMEOUT, "%s did not answer the %s of step %lld within %.0f ms", name,
                                      WAIT_NAMES[w], (long long)c->step, patience_ms(c));
            break;
        }
        for (int j = 0; j < c->shards; j++)
            if (c->s[j].resend_at > 0 && now >= c->s[j].resend_at && c->s[j].sock) resend(c, j);
        poll_shards(c, PS_POLL_MS);
    }
    *acc += ts_clock_ms() - t0;
    return st;
}

ts_ps_event ts_ps_client_event(const ts_ps_client *c) { return c->ev; }

ts_status ts_ps_client_await_generation(ts_ps_client *c, uint64_t g) {
    double deadline = ts_clock_ms() + patience_ms(c);
    for (follow(c); c->gen < g; follow(c)) {
        if (ts_member_shutdown_requested(c->cfg.member, NULL, NULL, 0)) {
            c->ev = (ts_ps_event){TS_PS_FINISHED, c->gen, c->step, -1};
            return ts_error(TS_ERR_STATE, "the job ended while waiting for generation %llu", (unsigned long long)g);
        }
        if (ts_clock_ms() > deadline)
            return ts_error(TS_ERR_TIMEOUT, "generation %llu was not announced within %.0f ms (this worker is at %llu)",
                            (unsigned long long)g, patience_ms(c), (unsigned long long)c->gen);
        poll_shards(c, PS_POLL_MS);
    }
    return TS_OK;
}

/* ---- the step ---- */

void ts_ps_client_begin(ts_ps_client *c, int64_t step, uint64_t g) {
    c->step = step;
    c->msg_gen = g;
    for (int k = 0; k < c->shards; k++) {
        shard_link *l = &c->s[k];
        for (int i = 0; i < l->npushes; i++) free(l->pushes[i].r);
        l->npushes = l->npend = 0;
        l->pend_keys = l->ready = 0;
        l->commit_sent = l->commit_done = l->apply_sent = false;
    }
}

/* Pushes shard k's pending ranges as one message. */
static ts_status flush(ts_ps_client *c, int k) {
    shard_link *l = &c->s[k];
    if (!l->npend) return TS_OK;
    double t0 = ts_clock_ms();
    if (l->npushes == l->cappushes) {
        int cap = l->cappushes ? 2 * l->cappushes : 8;
        push_rec *p = realloc(l->pushes, (size_t)cap * sizeof *p);
        if (!p) return ts_error(TS_ERR_MEMORY, "ps client: out of memory for %d pushes", cap);
        l->pushes = p, l->cappushes = cap;
    }
    size_t frames = 0;
    for (int i = 0; i < l->npend; i++) frames += frames_of(l->pend[i].len);
    push_rec r = {malloc(frames * sizeof *r.r), 0};
    if (!r.r) return ts_error(TS_ERR_MEMORY, "ps client: out of memory for a push of %zu ranges", frames);
    for (int i = 0; i < l->npend; i++) {
        cut_frames(r.r, &r.n, l->pend[i].offset, l->pend[i].len);
        for (int64_t j = 0; c->wire16 && j < l->pend[i].len; j++)
            c->wire16[l->pend[i].offset + j] = ts_bf16_from_f32(c->cfg.grads[l->pend[i].offset + j]);
    }
    l->pushes[l->npushes++] = r;
    l->npend = 0;
    l->pend_keys = 0;
    send_push(c, k, &r);
    c->times.push_ms += ts_clock_ms() - t0;
    return TS_OK;
}

ts_status ts_ps_client_ready(ts_ps_client *c, int64_t offset, int64_t len) {
    for (int k = 0; k < c->shards; k++) {
        shard_link *l = &c->s[k];
        int64_t lo = offset > l->off ? offset : l->off, hi = offset + len < l->off + l->len ? offset + len : l->off + l->len;
        if (lo >= hi) continue;
        ts_range *last = l->npend ? &l->pend[l->npend - 1] : NULL;
        if (last && last->offset == hi) { /* backward runs from the last layer down */
            last->offset = lo, last->len += hi - lo;
        } else if (last && last->offset + last->len == lo) {
            last->len += hi - lo;
        } else {
            if (l->npend == l->cappend) {
                int cap = l->cappend ? 2 * l->cappend : 16;
                ts_range *p = realloc(l->pend, (size_t)cap * sizeof *p);
                if (!p) return ts_error(TS_ERR_MEMORY, "ps client: out of memory for %d ready ranges", cap);
                l->pend = p, l->cappend = cap;
            }
            l->pend[l->npend++] = (ts_range){lo, hi - lo};
        }
        l->pend_keys += hi - lo;
        l->ready += hi - lo;
        if (l->pend_keys * (int64_t)sizeof(float) >= PS_PUSH_MIN_BYTES || l->ready >= l->len) {
            ts_status st = flush(c, k);
            if (st) return st;
        }
    }
    return TS_OK;
}

ts_status ts_ps_client_commit(ts_ps_client *c, const double *values, bool wait, double *out) {
    memcpy(c->commit, values, sizeof c->commit);
    for (int k = 0; k < c->shards; k++) {
        ts_status st = flush(c, k);
        if (st) return st;
        c->s[k].commit_sent = true;
        c->s[k].commit_done = false;
        send_values(c, k, TS_MSG_COMMIT, c->step, 0, c->commit, TS_COMMIT_VALUES);
    }
    if (!wait) return TS_OK;
    ts_status st = wait_for(c, WAIT_COMMIT, &c->times.wait_ms);
    if (st) return st;
    memcpy(out, c->s[0].decided, sizeof c->s[0].decided);
    out[TS_DECIDED_SQ_NORM] = 0;
    for (int k = 0; k < c->shards; k++) out[TS_DECIDED_SQ_NORM] += c->s[k].decided[TS_DECIDED_SQ_NORM];
    return TS_OK;
}

ts_status ts_ps_client_apply(ts_ps_client *c, double sq_norm) {
    c->apply_sq = sq_norm;
    for (int k = 0; k < c->shards; k++) {
        c->s[k].apply_sent = true;
        send_values(c, k, TS_MSG_APPLY, c->step, 0, &c->apply_sq, 1);
    }
    return TS_OK;
}

ts_status ts_ps_client_pull(ts_ps_client *c, int64_t want) {
    for (int k = 0; k < c->shards; k++) {
        shard_link *l = &c->s[k];
        if (l->pull_sent && l->pull_want == want) continue; /* asked already */
        l->pull_sent = true;
        l->pull_done = false;
        l->pull_want = want;
        send_ask(c, k, TS_MSG_PULL, want);
    }
    return TS_OK;
}

bool ts_ps_client_pulling(const ts_ps_client *c) {
    for (int k = 0; k < c->shards; k++)
        if (c->s[k].pull_sent && !c->s[k].pull_done) return true;
    return false;
}

ts_status ts_ps_client_pull_wait(ts_ps_client *c, ts_ps_pulled *out) {
    bool sync = c->cfg.job->parallel.consistency == TS_CONSISTENCY_SYNC;
    for (;;) {
        ts_status st = wait_for(c, WAIT_PULL, &c->times.pull_ms);
        if (st) return st;
        int ahead = 0;
        for (int k = 1; k < c->shards; k++)
            if (c->s[k].pull_step > c->s[ahead].pull_step) ahead = k;
        const shard_link *a = &c->s[ahead]; /* the step as the shard ahead describes it */
        const double *v = a->pull_values;
        *out = (ts_ps_pulled){a->pull_step, a->pull_pos, a->pull_nvalues == TS_STEP_VALUES, v[TS_STEP_LOSS],
                              v[TS_STEP_LR], v[TS_STEP_GRAD_NORM]};
        bool behind = false;
        for (int k = 0; sync && k < c->shards; k++) {
            shard_link *l = &c->s[k];
            if (l->pull_step == out->step) continue;
            behind = true; /* it has not applied that step yet: ask it for it */
            l->pull_done = false;
            l->pull_want = out->step;
            send_ask(c, k, TS_MSG_PULL, out->step);
        }
        if (!behind) {
            for (int k = 0; k < c->shards; k++) c->s[k].pull_sent = false;
            return TS_OK;
        }
    }
}

ts_status ts_ps_client_reduce(ts_ps_client *c, int64_t step, int64_t id, uint64_t g, double *v, int n) {
    shard_link *l = &c->s[0];
    c->msg_gen = g;
    c->red_step = step, c->red_id = id, c->red_vals = v, c->red_n = n;
    l->reduce_sent = true;
    l->reduce_done = false;
    send_values(c, 0, TS_MSG_REDUCE, step, id, v, n);
    ts_status st = wait_for(c, WAIT_REDUCE, &c->times.wait_ms);
    l->reduce_sent = false;
    return st;
}

ts_status ts_ps_client_rollback(ts_ps_client *c, int64_t to, int64_t *at) {
    for (;;) {
        c->rb_to = to;
        for (int k = 0; k < c->shards; k++) {
            c->s[k].rollback_sent = true;
            c->s[k].rollback_done = false;
            send_ask(c, k, TS_MSG_ROLLBACK, to);
        }
        ts_status st = wait_for(c, WAIT_ROLLBACK, &c->times.wait_ms);
        int64_t low = to;
        for (int k = 0; k < c->shards; k++) {
            c->s[k].rollback_sent = false;
            if (c->s[k].rollback_at < low) low = c->s[k].rollback_at;
        }
        if (st) return st;
        if (low == to) {
            *at = to;
            for (int k = 0; k < c->shards; k++) c->s[k].pull_sent = false; /* their answers predate it */
            return TS_OK;
        }
        to = low; /* a shard is further back: everyone goes there */
    }
}

ts_ps_times ts_ps_client_times(ts_ps_client *c) {
    ts_ps_times t = c->times;
    c->times = (ts_ps_times){0};
    return t;
}

/* ---- life ---- */

ts_ps_client *ts_ps_client_create(const ts_ps_client_config *cfg) {
    ts_ps_client *c = calloc(1, sizeof *c);
    if (!c) {
        ts_error(TS_ERR_MEMORY, "ps client: out of memory");
        return NULL;
    }
    c->cfg = *cfg;
    c->shards = cfg->job->parallel.servers;
    size_t slots = (size_t)(c->shards > 0 ? c->shards : 1);
    c->s = calloc(slots, sizeof *c->s);
    c->items = calloc(slots, sizeof *c->items);
    c->item_shard = calloc(slots, sizeof *c->item_shard);
    ts_range *plan = calloc(slots, sizeof *plan);
    bool have = c->s && c->items && c->item_shard && plan;
    ts_status st = have ? TS_OK : ts_error(TS_ERR_MEMORY, "ps client: out of memory");
    if (!st && c->shards < 1) st = ts_error(TS_ERR_VALUE, "parallel.servers: strategy \"ps\" needs at least one shard");
    if (!st) st = ts_keys_plan(cfg->tensors, cfg->n_tensors, cfg->numel, c->shards, plan);
    for (int k = 0; !st && k < c->shards; k++) c->s[k] = (shard_link){.off = plan[k].offset, .len = plan[k].len,
                                                                       .rank = -1, .last = -1};
    free(plan);
    if (!st && cfg->job->parallel.wire_dtype && !(c->wire16 = malloc((size_t)cfg->numel * sizeof *c->wire16)))
        st = ts_error(TS_ERR_MEMORY, "ps client: out of memory for bf16 gradients of %lld keys", (long long)cfg->numel);
    c->curve = cfg->job->parallel.ps_security == TS_SECURITY_CURVE;
    if (!c->curve) ts_secure_warn_plain("parallel.ps_security", "this worker's parameter-server traffic");
    if (!st && c->curve) st = ts_secure_load(cfg->key_file, &c->keys);
    if (!st && !(c->zctx = zmq_ctx_new())) st = ts_error(TS_ERR_IO, "ps client: zmq_ctx_new failed");
    /* a shard's connection per I/O thread (up to 4): CURVE's work on the
     * pushes and pulls of different shards runs side by side */
    if (!st) zmq_ctx_set(c->zctx, ZMQ_IO_THREADS, c->shards < 4 ? c->shards : 4);
    ts_proto_rx_init(&c->rx);
    ts_proto_limits_default(&c->lim);
    c->lim.max_header_bytes = 256u * 1024u;
    c->lim.max_payload_bytes = (uint64_t)cfg->numel * sizeof(float) + 4096;
    c->lim.model_size = (uint64_t)cfg->numel;
    c->lim.job = cfg->job->name;
    if (!st) {
        ts_member_info info;
        ts_member_info_get(cfg->member, &info);
        c->me = info.rank;
        uint64_t g;
        ts_proto_member *r = NULL;
        size_t n = 0;
        if (!(st = ts_member_roster(cfg->member, &r, &n, &g))) {
            ts_member_poll_membership(cfg->member, NULL, NULL, NULL); /* the join's own generation */
            take_roster(c, g, r, n);
        }
        free(r);
    }
    if (st) {
        ts_ps_client_free(c);
        return NULL;
    }
    return c;
}

void ts_ps_client_free(ts_ps_client *c) {
    if (!c) return;
    for (int k = 0; c->s && k < c->shards; k++) {
        shard_link *l = &c->s[k];
        if (l->sock) zmq_close(l->sock);
        for (int i = 0; i < l->npushes; i++) free(l->pushes[i].r);
        free(l->pushes);
        free(l->pend);
    }
    ts_proto_rx_release(&c->rx);
    if (c->zctx) zmq_ctx_term(c->zctx);
    free(c->s);
    free(c->items);
    free(c->item_shard);
    free(c->wire16);
    free(c->workers);
    free(c);
}
