/* server.c - the scheduler's CURVE ROUTER socket, its loop and dispatch.
 *
 * The socket is served by a proto/zloop.h loop: every queued message goes
 * through ts_proto_recv (decode and validate) and reaches on_message; a bad
 * one is counted and answered with an ERROR, and the loop goes on. The
 * zloop's tick runs the liveness check after the queue was read, on a clock
 * that leaves out the time the scheduler itself was stalled.
 */
#include "scheduler/internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "scheduler/log.h"

/* Largest payload the scheduler accepts (blobs are small). */
#define SCHED_MAX_PAYLOAD (1u << 20)

/* What the scheduler receives: node messages with at most 4 payload frames
 * and 1 MiB of payload; job and generation are checked per sender in
 * admissible(). */
static void sched_limits(ts_proto_limits *lim)
{
    ts_proto_limits_default(lim);
    lim->max_frames = 4;
    lim->max_payload_bytes = SCHED_MAX_PAYLOAD;
    lim->job = NULL;
    lim->generation = 0;
}

/* STATUS -> STATUS_REPLY with every node, the phase and the settings. */
static void reply_status(ts_sched *s, const ts_proto_identity *to)
{
    ts_proto_msg m;
    sched_msg_init(s, &m, TS_MSG_STATUS_REPLY);
    ts_proto_member *ros = NULL;
    size_t n = 0;
    if (sched_roster(s, true, &ros, &n) != TS_OK ||
        ts_proto_msg_set_roster(&m, ros, n) != TS_OK) {
        free(ros);
        sched_send_error(s, to, TS_PROTO_E_INTERNAL, "status: %s", ts_last_error());
        return;
    }
    free(ros);
    static const char *const PHASES[] = {"rendezvous", "running", "done"};
    ts_proto_set_str(m.phase, sizeof m.phase, PHASES[s->phase]);
    m.steps = s->cfg.steps;
    m.min_workers = (uint32_t)s->cfg.min_workers;
    m.max_workers = (uint32_t)s->cfg.max_workers;
    m.step = sched_job_step(s);
    sched_send(s, to, &m, NULL, 0);
    ts_proto_msg_free(&m);
}

/* HEARTBEAT back to a member (the job's step in "s"): how nodes know the
 * scheduler is alive (membership/member.h). */
static void answer_heartbeat(ts_sched *s, const sched_node *n)
{
    ts_proto_msg m;
    sched_msg_init(s, &m, TS_MSG_HEARTBEAT);
    m.step = sched_job_step(s);
    sched_send(s, &n->id, &m, NULL, 0);
    ts_proto_msg_free(&m);
}

/* Checks job, sender rank and generation of a decoded message from a known
 * node (or a stranger); returns false after rejecting it. */
static bool admissible(ts_sched *s, const ts_proto_identity *id, const sched_node *n,
                       const ts_proto_msg *m)
{
    if (m->type == TS_MSG_STATUS)
        return true;
    if (strcmp(m->job, s->cfg.job) != 0) {
        sched_reject(s, id, n, TS_PROTO_E_JOB, "job id '%s' is not this job's ('%s')", m->job,
                     s->cfg.job);
        return false;
    }
    if (m->type == TS_MSG_JOIN)
        return true;
    if (!n || n->state == NODE_PENDING) {
        sched_reject(s, id, n, TS_PROTO_E_UNEXPECTED,
                     "%s from a peer that has not joined (send JOIN first)",
                     ts_proto_type_name(m->type));
        return false;
    }
    if (n->state != NODE_MEMBER) {
        sched_reject(s, id, n, TS_PROTO_E_REFUSED, "rank %d was declared %s; join again",
                     n->rank, n->state == NODE_DEAD ? "dead" : "departed");
        return false;
    }
    if (m->rank != n->rank) {
        sched_reject(s, id, n, TS_PROTO_E_UNEXPECTED,
                     "sender rank %d does not match rank %d of this connection", m->rank, n->rank);
        return false;
    }
    /* One generation of grace: a MEMBERSHIP may still be on its way. */
    uint64_t oldest = s->generation > 0 ? s->generation - 1 : 0;
    if (oldest < n->joined_generation)
        oldest = n->joined_generation;
    if (m->generation < oldest || m->generation > s->generation) {
        sched_reject(s, id, n, TS_PROTO_E_GENERATION, "%s generation %llu (current generation %llu)",
                     m->generation < oldest ? "stale" : "unknown future",
                     (unsigned long long)m->generation, (unsigned long long)s->generation);
        return false;
    }
    return true;
}

/* Acts on one validated message. */
static void dispatch(ts_sched *s, const ts_proto_identity *id, const ts_proto_msg *m)
{
    sched_node *n = sched_node_find(s, id);
    if (!admissible(s, id, n, m))
        return;
    if (n && n->state == NODE_MEMBER)
        n->last_seen_ms = sched_now_ms(s);
    switch (m->type) {
    case TS_MSG_STATUS:
        reply_status(s, id);
        return;
    case TS_MSG_JOIN:
        sched_on_join(s, id, m);
        return;
    case TS_MSG_HEARTBEAT:
        if (m->step > n->last_step)
            n->last_step = m->step;
        if (m->last_barrier > n->last_barrier)
            n->last_barrier = m->last_barrier;
        answer_heartbeat(s, n);
        return;
    case TS_MSG_STEP_DONE:
        sched_on_step_done(s, n, m);
        return;
    case TS_MSG_STOPPED:
        sched_on_stopped(s, n, m);
        return;
    case TS_MSG_REGROUP:
        sched_on_regroup(s, n, m);
        return;
    case TS_MSG_BARRIER:
        sched_on_barrier(s, n, m);
        return;
    case TS_MSG_SHUTDOWN:
        sched_on_leave(s, n, m);
        return;
    case TS_MSG_BLOB_PUT:
        sched_on_blob_put(s, n, m);
        return;
    case TS_MSG_BLOB_GET:
        sched_on_blob_get(s, n, m);
        return;
    case TS_MSG_ERROR:
        ts_sched_log(TS_SCHED_WARN, "rank %d reports error %s: %s", n->rank,
                     ts_proto_error_name(m->code), m->reason);
        return;
    default:
        sched_reject(s, id, n, TS_PROTO_E_UNEXPECTED, "the scheduler does not accept %s messages",
                     ts_proto_type_name(m->type));
        return;
    }
}

/* zloop: one received message, valid or not. */
static void on_message(void *owner, ts_proto_error e, ts_proto_rx *rx)
{
    ts_sched *s = owner;
    if (e == TS_PROTO_OK)
        dispatch(s, &rx->identity, &rx->msg);
    else if (e == TS_PROTO_E_IO)
        ts_sched_log(TS_SCHED_ERROR, "receive failed: %s", ts_last_error());
    else
        sched_reject(s, &rx->identity, sched_node_find(s, &rx->identity), (uint32_t)e, "%s",
                     ts_last_error());
}

/* zloop: periodic, after the queued messages were read. */
static void on_tick(void *owner)
{
    ts_sched *s = owner;
    sched_check_liveness(s);
    sched_blob_expire(s);
    sched_rendezvous_tick(s);
    sched_stop_check(s);
}

/* Half the rendezvous timeout: a warning; all of it: the job fails. Judged
 * on the scheduler's clock (the uv timer may fire early after a stall). */
static void on_rendezvous_timer(uv_timer_t *h)
{
    ts_sched *s = h->data;
    if (s->phase != PHASE_RENDEZVOUS)
        return;
    uint64_t timeout = (uint64_t)s->cfg.rendezvous_timeout_ms;
    uint64_t left = ts_zloop_remaining_ms(&s->zloop, s->started_ms,
                                          s->rendezvous_warned ? timeout : timeout / 2);
    if (left > 0) {
        uv_timer_start(h, on_rendezvous_timer, left, 0);
    } else if (!s->rendezvous_warned) {
        s->rendezvous_warned = true;
        sched_rendezvous_warn(s);
        uv_timer_start(h, on_rendezvous_timer, timeout - timeout / 2, 0);
    } else {
        sched_rendezvous_expired(s);
    }
}

static void on_signal(uv_signal_t *h, int signum) { sched_stop_begin(h->data, signum); }

static void close_handle(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

const char *ts_sched_endpoint(const ts_sched *s) { return s->endpoint; }

int ts_sched_declared_dead(const ts_sched *s) { return s->declared_dead; }

/* Socket, keys and ZAP gate; the loop comes in init_loop. */
static ts_status init_socket(ts_sched *s)
{
    ts_status st = ts_secure_available();
    if (st != TS_OK)
        return st;
    if ((st = ts_secure_load(s->cfg.key_file, &s->keys)) != TS_OK)
        return st;
    s->zctx = zmq_ctx_new();
    if (!s->zctx)
        return ts_error(TS_ERR_IO, "scheduler: zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
    s->zap = ts_secure_zap_start(s->zctx, &s->keys);
    if (!s->zap)
        return ts_last_status() != TS_OK ? ts_last_status() : TS_ERR_IO;
    s->sock = zmq_socket(s->zctx, ZMQ_ROUTER);
    if (!s->sock)
        return ts_error(TS_ERR_IO, "scheduler: zmq_socket(ROUTER): %s", zmq_strerror(zmq_errno()));
    int one = 1, linger = 1000;
    zmq_setsockopt(s->sock, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    zmq_setsockopt(s->sock, ZMQ_LINGER, &linger, sizeof linger);
    ts_proto_limits lim;
    sched_limits(&lim);
    if ((st = ts_secure_server(s->sock, &s->keys)) != TS_OK ||
        (st = ts_proto_limit_socket(s->sock, &lim)) != TS_OK)
        return st;
    if (zmq_bind(s->sock, s->cfg.bind) != 0)
        return ts_error(TS_ERR_IO, "scheduler: cannot bind %s: %s", s->cfg.bind,
                        zmq_strerror(zmq_errno()));
    size_t len = sizeof s->endpoint;
    if (zmq_getsockopt(s->sock, ZMQ_LAST_ENDPOINT, s->endpoint, &len) != 0)
        return ts_error(TS_ERR_IO, "scheduler: ZMQ_LAST_ENDPOINT: %s", zmq_strerror(zmq_errno()));
    return TS_OK;
}

/* The tick: at most a quarter of the heartbeat timeout, 5..250 ms. */
static uint64_t tick_period(const ts_sched_config *c)
{
    uint64_t period = (uint64_t)c->heartbeat_timeout_ms / 4;
    if (period > (uint64_t)c->heartbeat_ms)
        period = (uint64_t)c->heartbeat_ms;
    if (period < 5)
        period = 5;
    if (period > 250)
        period = 250;
    return period;
}

static ts_status init_loop(ts_sched *s)
{
    int rc = uv_loop_init(&s->loop);
    if (rc != 0)
        return ts_error(TS_ERR_IO, "scheduler: uv_loop_init: %s", uv_strerror(rc));
    s->loop_ready = true;
    ts_proto_limits lim;
    sched_limits(&lim);
    ts_status st = ts_zloop_init(&s->zloop, &s->loop, s->sock, &lim, tick_period(&s->cfg),
                                 on_message, on_tick, s);
    if (st != TS_OK)
        return st;
    if ((rc = uv_timer_init(&s->loop, &s->rendezvous)) != 0 ||
        (rc = uv_signal_init(&s->loop, &s->sigint)) != 0 ||
        (rc = uv_signal_init(&s->loop, &s->sigterm)) != 0)
        return ts_error(TS_ERR_IO, "scheduler: libuv handle init: %s", uv_strerror(rc));
    s->rendezvous.data = s->sigint.data = s->sigterm.data = s;
    /* before the endpoint is announced: a SIGINT that comes once a
     * supervisor knows the scheduler listens stops the job, not the
     * process (libuv holds it until the loop runs) */
    uv_signal_start(&s->sigint, on_signal, SIGINT);
    uv_signal_start(&s->sigterm, on_signal, SIGTERM);
    return TS_OK;
}

ts_sched *ts_sched_create(const ts_sched_config *cfg)
{
    ts_sched *s = calloc(1, sizeof *s);
    if (!s) {
        ts_error(TS_ERR_MEMORY, "scheduler: out of memory");
        return NULL;
    }
    s->cfg = *cfg;
    s->next_rank = 0;
    if (init_socket(s) != TS_OK || init_loop(s) != TS_OK) {
        ts_status st = ts_last_status();
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ts_last_error());
        ts_sched_destroy(s);
        ts_error(st != TS_OK ? st : TS_ERR_IO, "%s", msg);
        return NULL;
    }
    return s;
}

int ts_sched_run(ts_sched *s)
{
    ts_zloop_start(&s->zloop);
    s->started_ms = sched_now_ms(s);
    uv_timer_start(&s->rendezvous, on_rendezvous_timer, (uint64_t)s->cfg.rendezvous_timeout_ms / 2, 0);
    ts_sched_log(TS_SCHED_INFO,
                 "job %s listening on %s: waiting for %d servers and %d..%d workers, "
                 "heartbeat %d ms, timeout %d ms, barrier timeout %d ms, %lld steps",
                 s->cfg.job, s->endpoint, s->cfg.servers, s->cfg.min_workers,
                 s->cfg.max_workers, s->cfg.heartbeat_ms, s->cfg.heartbeat_timeout_ms,
                 s->cfg.barrier_timeout_ms, s->cfg.steps);
    uv_run(&s->loop, UV_RUN_DEFAULT);
    return s->exit_code;
}

void ts_sched_destroy(ts_sched *s)
{
    if (!s)
        return;
    if (s->loop_ready) {
        ts_zloop_stop(&s->zloop);
        sched_barriers_free(s);
        uv_walk(&s->loop, close_handle, NULL);
        uv_run(&s->loop, UV_RUN_DEFAULT);
        uv_loop_close(&s->loop);
    }
    ts_zloop_free(&s->zloop);
    sched_blobs_free(s);
    if (s->sock)
        zmq_close(s->sock);
    ts_secure_zap_stop(s->zap);
    if (s->zctx)
        zmq_ctx_term(s->zctx);
    free(s->nodes);
    free(s);
}
