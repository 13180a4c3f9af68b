/* member.c - the node side of the scheduler conversation.
 *
 * One I/O thread owns the DEALER socket (ZeroMQ sockets are not thread safe).
 * Callers talk to it through shared state under a mutex: they queue outgoing
 * requests and wake the thread through a pipe (polled by zmq_poll next to the
 * socket); the thread stamps each message with the current rank and
 * generation, sends it, and posts replies back through a condition variable.
 * Before JOIN_ACK the thread re-sends JOIN every JOIN_RESEND_MS (the
 * scheduler takes it as "still waiting"); after it, HEARTBEAT every
 * heartbeat_ms, which the scheduler answers with its own. A socket monitor
 * turns a refused CURVE handshake into an immediate join error and tells
 * whether the connection is up; with both the thread judges the scheduler
 * lost (see scheduler_lost).
 */
#include "membership/member.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "proto/secure.h"

#define JOIN_RESEND_MS 500
#define DEFAULT_JOIN_TIMEOUT_MS 60000
#define WAIT_MARGIN_MS 2000
#define MSG_TEXT 640
/* A scheduler whose connection stays open (its host acknowledges: a stopped,
 * paused or swapping process) may stay silent this many heartbeat timeouts,
 * and at least STALL_MIN_MS, before it is given up. */
#define STALL_TIMEOUTS 10
#define STALL_MIN_MS 30000

typedef enum { REQ_NONE, REQ_BARRIER, REQ_BLOB_PUT, REQ_BLOB_GET } req_kind;

/* A message queued by a caller for the I/O thread. */
typedef struct outmsg {
    ts_proto_type type;
    int64_t step;
    int64_t barrier_id;
    char key[TS_PROTO_KEY_MAX + 1];
    char reason[TS_PROTO_REASON_MAX + 1];
    void *data;
    size_t size;
    struct outmsg *next;
} outmsg;

struct ts_member {
    char endpoint[TS_PROTO_ADDR_MAX + 1];
    char job[TS_PROTO_JOB_MAX + 1];
    char address[TS_PROTO_ADDR_MAX + 1];
    char caps[TS_PROTO_CAPS_MAX + 1];
    ts_proto_role role;
    int32_t prev_rank;
    void *ctx, *sock, *mon; /* sock and mon belong to the I/O thread once it runs */
    int wake[2];
    pthread_t io;
    bool io_started;
    pthread_mutex_t call_mu; /* one blocking request at a time */

    pthread_mutex_t mu;      /* guards everything below */
    pthread_cond_t cv;
    bool stop;
    bool joined, join_failed;
    ts_status join_status;
    char join_error[MSG_TEXT];
    ts_member_info info;
    ts_proto_member *roster;
    size_t nroster;
    bool news;
    /* heartbeats carry last_step, the step of the latest STEP_DONE or
     * STOPPED sent (lower after the job moved back to a checkpoint): one
     * only queued would overtake the reports queued before it */
    int64_t last_step, last_barrier;
    bool shutdown;
    int shutdown_code;
    char shutdown_reason[MSG_TEXT];
    bool stop_asked; /* the scheduler sent STOP */
    char stop_reason[MSG_TEXT];
    outmsg *outq, **outq_tail;
    req_kind req;
    int64_t req_barrier;
    char req_key[TS_PROTO_KEY_MAX + 1];
    bool req_done;
    ts_status req_status;
    char req_error[MSG_TEXT];
    void *req_data;
    size_t req_size;

    /* I/O thread only */
    uint64_t last_heard_ms; /* last message from the scheduler (or join) */
    bool link_down;         /* the connection dropped and is not back */
};

/* snprintf into a fixed field; truncation of long peer text is intended. */
static void textf(char *dst, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void textf(char *dst, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst, cap, fmt, ap);
    va_end(ap);
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void wake_io(ts_member *m)
{
    char c = 1;
    ssize_t w = write(m->wake[1], &c, 1);
    (void)w; /* a full pipe already wakes the thread */
}

/* Copies a roster into the member's (caller holds mu). */
static void store_roster(ts_member *m, const ts_proto_member *r, size_t n)
{
    ts_proto_member *copy = malloc((n ? n : 1) * sizeof *copy);
    if (!copy)
        return; /* keep the old roster; the generation number still moves */
    memcpy(copy, r, n * sizeof *copy);
    free(m->roster);
    m->roster = copy;
    m->nroster = n;
}

/* Finishes the pending request (caller holds mu). */
static void finish_req(ts_member *m, ts_status st, const char *text)
{
    m->req_done = true;
    m->req_status = st;
    textf(m->req_error, sizeof m->req_error, "%s", text ? text : "");
}

/* I/O thread: acts on one message from the scheduler. */
static void on_message(ts_member *m, const ts_proto_msg *msg)
{
    char text[MSG_TEXT];
    pthread_mutex_lock(&m->mu);
    switch (msg->type) {
    case TS_MSG_JOIN_ACK:
        if (!m->joined && !m->join_failed) {
            m->joined = true;
            m->info.rank = msg->assigned_rank;
            m->info.generation = msg->generation;
            m->info.start_step = msg->step;
            m->info.steps = msg->steps;
            m->info.heartbeat_ms = msg->heartbeat_ms ? msg->heartbeat_ms : 1000;
            m->info.heartbeat_timeout_ms = msg->heartbeat_timeout_ms;
            m->info.barrier_timeout_ms = msg->barrier_timeout_ms;
            if (msg->step > m->last_step)
                m->last_step = msg->step;
            store_roster(m, msg->roster, msg->nroster);
        }
        break;
    case TS_MSG_MEMBERSHIP:
        if (m->joined && msg->generation > m->info.generation) {
            m->info.generation = msg->generation;
            store_roster(m, msg->roster, msg->nroster);
            m->news = true;
        }
        break;
    case TS_MSG_BARRIER_RELEASE:
        if (m->req == REQ_BARRIER && !m->req_done && msg->barrier_id == m->req_barrier)
            finish_req(m, TS_OK, NULL);
        break;
    case TS_MSG_BLOB_REPLY:
        if ((m->req == REQ_BLOB_PUT || m->req == REQ_BLOB_GET) && !m->req_done &&
            strcmp(msg->key, m->req_key) == 0) {
            if (m->req == REQ_BLOB_PUT) {
                finish_req(m, TS_OK, NULL);
            } else if (!msg->found) {
                textf(text, sizeof text, "blob_get: no rank put blob '%s' at scheduler %s "
                         "in time", msg->key, m->endpoint);
                finish_req(m, TS_ERR_INDEX, text);
            } else {
                size_t size = msg->nlengths ? msg->payload[0].size : 0;
                void *copy = malloc(size ? size : 1);
                if (!copy) {
                    finish_req(m, TS_ERR_MEMORY, "blob_get: out of memory");
                } else {
                    if (size)
                        memcpy(copy, msg->payload[0].data, size);
                    m->req_data = copy;
                    m->req_size = size;
                    finish_req(m, TS_OK, NULL);
                }
            }
        }
        break;
    case TS_MSG_ERROR:
        textf(text, sizeof text, "scheduler %s: %s: %s", m->endpoint,
                 ts_proto_error_name(msg->code), msg->reason);
        if (!m->joined) {
            m->join_failed = true;
            m->join_status = TS_ERR_PEER;
            textf(m->join_error, sizeof m->join_error, "join: %s", text);
        } else if (msg->code == TS_PROTO_E_REFUSED && !m->shutdown) {
            /* the scheduler no longer counts this node as a member */
            m->shutdown = true;
            m->shutdown_code = 1;
            textf(m->shutdown_reason, sizeof m->shutdown_reason, "%s", text);
        }
        if (m->req != REQ_NONE && !m->req_done)
            finish_req(m, msg->code == TS_PROTO_E_BARRIER_TIMEOUT ? TS_ERR_TIMEOUT : TS_ERR_PEER,
                       text);
        break;
    case TS_MSG_SHUTDOWN:
        if (!m->shutdown) {
            m->shutdown = true;
            m->shutdown_code = (int)msg->code;
            textf(m->shutdown_reason, sizeof m->shutdown_reason, "%s", msg->reason);
        }
        if (!m->joined && !m->join_failed) { /* the job ends: joining again will not help */
            m->join_failed = true;
            m->join_status = TS_ERR_STATE;
            textf(m->join_error, sizeof m->join_error, "join: scheduler %s shut the job "
                     "down: %s", m->endpoint, msg->reason);
        }
        if (m->req != REQ_NONE && !m->req_done) {
            textf(text, sizeof text, "scheduler %s shut the job down: %s", m->endpoint,
                     msg->reason);
            finish_req(m, TS_ERR_STATE, text);
        }
        break;
    case TS_MSG_STOP:
        if (!m->stop_asked) {
            m->stop_asked = true;
            textf(m->stop_reason, sizeof m->stop_reason, "%s", msg->reason);
        }
        break;
    default:
        break;
    }
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
}

/* I/O thread: reads socket-monitor events; a refused handshake fails the
 * join; a dropped connection is noted until a handshake succeeds again. */
static void on_monitor(ts_member *m)
{
    for (;;) {
        zmq_msg_t ev, addr;
        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, m->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            return;
        }
        uint16_t event = 0;
        uint32_t value = 0;
        if (zmq_msg_size(&ev) >= 6) {
            memcpy(&event, zmq_msg_data(&ev), 2);
            memcpy(&value, (char *)zmq_msg_data(&ev) + 2, 4);
        }
        bool more = zmq_msg_more(&ev);
        zmq_msg_close(&ev);
        if (more) {
            zmq_msg_init(&addr);
            zmq_msg_recv(&addr, m->mon, 0);
            zmq_msg_close(&addr);
        }
        if (event == ZMQ_EVENT_DISCONNECTED)
            m->link_down = true;
        else if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED)
            m->link_down = false;
        pthread_mutex_lock(&m->mu);
        if (!m->joined && !m->join_failed &&
            (event & (ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL))) {
            m->join_failed = true;
            m->join_status = TS_ERR_PEER;
            textf(m->join_error, sizeof m->join_error,
                     "join: scheduler %s refused the CURVE handshake (%s, code %u): the key "
                     "file is not this job's", m->endpoint,
                     event & ZMQ_EVENT_HANDSHAKE_FAILED_AUTH ? "authentication" : "protocol",
                     (unsigned)value);
            pthread_cond_broadcast(&m->cv);
        }
        pthread_mutex_unlock(&m->mu);
    }
}

/* I/O thread: sends one message stamped with the current rank and generation. */
static void send_stamped(ts_member *m, const outmsg *o)
{
    pthread_mutex_lock(&m->mu);
    if (o->type == TS_MSG_STEP_DONE || o->type == TS_MSG_STOPPED)
        m->last_step = o->step;
    int32_t rank = m->joined ? m->info.rank : TS_PROTO_RANK_NONE;
    uint64_t gen = m->joined ? m->info.generation : 0;
    int64_t last_step = m->last_step, last_barrier = m->last_barrier;
    pthread_mutex_unlock(&m->mu);
    ts_proto_msg msg;
    ts_proto_msg_init(&msg, o->type, m->job, gen, rank);
    msg.step = o->type == TS_MSG_HEARTBEAT ? last_step : o->step;
    msg.barrier_id = o->barrier_id;
    msg.last_barrier = last_barrier;
    memcpy(msg.key, o->key, sizeof msg.key);
    memcpy(msg.reason, o->reason, sizeof msg.reason);
    if (o->type == TS_MSG_JOIN) {
        msg.role = m->role;
        memcpy(msg.address, m->address, sizeof msg.address);
        memcpy(msg.caps, m->caps, sizeof msg.caps);
        msg.prev_rank = m->prev_rank;
    }
    ts_proto_payload p = {o->data, o->size, NULL, NULL};
    ts_status st = ts_proto_send(m->sock, NULL, &msg, &p, o->type == TS_MSG_BLOB_PUT ? 1 : 0,
                                 ZMQ_DONTWAIT);
    ts_proto_msg_free(&msg);
    if (st != TS_OK && o->type != TS_MSG_HEARTBEAT && o->type != TS_MSG_JOIN) {
        char text[MSG_TEXT];
        textf(text, sizeof text, "could not send %s to scheduler %s: %s",
                 ts_proto_type_name(o->type), m->endpoint, ts_last_error());
        pthread_mutex_lock(&m->mu);
        if (m->req != REQ_NONE && !m->req_done)
            finish_req(m, TS_ERR_IO, text);
        pthread_cond_broadcast(&m->cv);
        pthread_mutex_unlock(&m->mu);
    }
}

/* I/O thread: after the join, gives the scheduler up when it was silent
 * past the heartbeat timeout with its connection down (the process died or
 * its host closed the connection), or past the stall allowance with the
 * connection up (nothing answers; a stopped or stalled scheduler whose host
 * still holds the connection is waited for that long). Then the node is told
 * to shut down (code 1) and a waiting request fails, both naming the
 * scheduler and how long it was silent. */
static void check_scheduler(ts_member *m, uint64_t now)
{
    pthread_mutex_lock(&m->mu);
    uint64_t timeout = m->info.heartbeat_timeout_ms ? m->info.heartbeat_timeout_ms : 5000;
    uint64_t allowance = STALL_TIMEOUTS * timeout > STALL_MIN_MS ? STALL_TIMEOUTS * timeout
                                                                 : STALL_MIN_MS;
    uint64_t silent = now > m->last_heard_ms ? now - m->last_heard_ms : 0;
    if (m->joined && !m->shutdown &&
        ((m->link_down && silent > timeout) || silent > allowance)) {
        char text[MSG_TEXT];
        textf(text, sizeof text, "scheduler %s silent for %llu ms (%s, heartbeat timeout %llu "
              "ms): the job cannot go on", m->endpoint, (unsigned long long)silent,
              m->link_down ? "connection lost" : "connection open but no answer",
              (unsigned long long)timeout);
        m->shutdown = true;
        m->shutdown_code = 1;
        textf(m->shutdown_reason, sizeof m->shutdown_reason, "%s", text);
        if (m->req != REQ_NONE && !m->req_done)
            finish_req(m, TS_ERR_PEER, text);
        pthread_cond_broadcast(&m->cv);
    }
    pthread_mutex_unlock(&m->mu);
}

/* What a member receives from the scheduler: at most 4 payload frames and
 * 1 MiB of payload (blobs); job = NULL accepts any job id. */
static void member_limits(ts_proto_limits *lim, const char *job)
{
    ts_proto_limits_default(lim);
    lim->job = job;
    lim->max_frames = 4;
    lim->max_payload_bytes = 1u << 20;
}

static void *io_main(void *arg)
{
    ts_member *m = arg;
    ts_proto_limits lim;
    member_limits(&lim, m->job);
    ts_proto_rx rx;
    ts_proto_rx_init(&rx);
    uint64_t next_beat = now_ms();
    m->last_heard_ms = next_beat;
    bool was_joined = false;
    for (;;) {
        pthread_mutex_lock(&m->mu);
        bool joined = m->joined, stop = m->stop, down = m->shutdown;
        uint32_t interval = joined ? m->info.heartbeat_ms : JOIN_RESEND_MS;
        outmsg *q = m->outq;
        m->outq = NULL;
        m->outq_tail = &m->outq;
        pthread_mutex_unlock(&m->mu);
        while (q) {
            outmsg *next = q->next;
            send_stamped(m, q);
            free(q->data);
            free(q);
            q = next;
        }
        if (stop)
            break;
        uint64_t now = now_ms();
        if (joined && !was_joined) {
            was_joined = true;
            next_beat = now; /* first heartbeat right after JOIN_ACK */
        }
        check_scheduler(m, now);
        if (down) {
            next_beat = now + 1000; /* shut down or evicted: nothing more to say */
        } else if (now >= next_beat) {
            outmsg beat = {.type = joined ? TS_MSG_HEARTBEAT : TS_MSG_JOIN, .barrier_id = -1};
            send_stamped(m, &beat);
            next_beat = now + interval;
        }
        zmq_pollitem_t items[3] = {{m->sock, 0, ZMQ_POLLIN, 0},
                                   {NULL, m->wake[0], ZMQ_POLLIN, 0},
                                   {m->mon, 0, ZMQ_POLLIN, 0}};
        long wait = (long)(next_beat - now_ms());
        if (wait < 0)
            wait = 0;
        if (zmq_poll(items, m->mon ? 3 : 2, wait) < 0 && zmq_errno() != EINTR)
            break;
        if (items[1].revents & ZMQ_POLLIN) {
            char buf[64];
            while (read(m->wake[0], buf, sizeof buf) > 0) {
            }
        }
        for (;;) {
            ts_proto_error e = ts_proto_recv(m->sock, &lim, ZMQ_DONTWAIT, &rx);
            if (e == TS_PROTO_E_AGAIN || e == TS_PROTO_E_IO)
                break;
            m->last_heard_ms = now_ms();
            if (e == TS_PROTO_OK)
                on_message(m, &rx.msg);
            ts_proto_rx_release(&rx);
        }
        if (m->mon && (items[2].revents & ZMQ_POLLIN))
            on_monitor(m);
    }
    ts_proto_rx_release(&rx);
    return NULL;
}

/* Queues a message for the I/O thread (caller holds mu). */
static void enqueue(ts_member *m, outmsg *o)
{
    o->next = NULL;
    *m->outq_tail = o;
    m->outq_tail = &o->next;
}

static outmsg *new_out(ts_proto_type type)
{
    outmsg *o = calloc(1, sizeof *o);
    if (o) {
        o->type = type;
        o->barrier_id = -1;
    }
    return o;
}

static void free_member(ts_member *m)
{
    if (m->io_started) {
        pthread_mutex_lock(&m->mu);
        m->stop = true;
        pthread_mutex_unlock(&m->mu);
        wake_io(m);
        pthread_join(m->io, NULL);
    }
    while (m->outq) {
        outmsg *o = m->outq;
        m->outq = o->next;
        free(o->data);
        free(o);
    }
    /* monitoring stops before its socket closes: an event sent to a
     * closed monitor would block ZeroMQ's I/O thread, and with it
     * zmq_ctx_term, forever */
    if (m->sock)
        zmq_socket_monitor(m->sock, NULL, 0);
    if (m->mon)
        zmq_close(m->mon);
    if (m->sock)
        zmq_close(m->sock);
    if (m->ctx)
        zmq_ctx_term(m->ctx);
    if (m->wake[0] >= 0)
        close(m->wake[0]);
    if (m->wake[1] >= 0)
        close(m->wake[1]);
    pthread_mutex_destroy(&m->mu);
    pthread_mutex_destroy(&m->call_mu);
    pthread_cond_destroy(&m->cv);
    free(m->roster);
    free(m);
}

/* Key file from the argument or TESSERA_KEY_FILE. */
static ts_status load_keys(const char *key_file, ts_secure_keys *keys, const char *what)
{
    const char *path = key_file ? key_file : getenv("TESSERA_KEY_FILE");
    if (!path || !*path)
        return ts_error(TS_ERR_VALUE, "%s: no key file (pass one or set TESSERA_KEY_FILE)", what);
    return ts_secure_load(path, keys);
}

/* A CURVE client DEALER connected to endpoint, with a random identity and
 * bounded by lim (ts_proto_limit_socket). */
static void *client_socket(void *ctx, const ts_secure_keys *keys, const ts_proto_limits *lim,
                           const char *endpoint, const char *what, void **mon)
{
    void *sock = zmq_socket(ctx, ZMQ_DEALER);
    if (!sock) {
        ts_error(TS_ERR_IO, "%s: zmq_socket: %s", what, zmq_strerror(zmq_errno()));
        return NULL;
    }
    unsigned char id[16];
    if (getrandom(id, sizeof id, 0) != (ssize_t)sizeof id) {
        for (size_t i = 0; i < sizeof id; i++)
            id[i] = (unsigned char)(rand() ^ (int)getpid() ^ (int)i);
    }
    id[0] |= 1; /* identities starting with a zero byte are reserved */
    int linger = 500;
    zmq_setsockopt(sock, ZMQ_ROUTING_ID, id, sizeof id);
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    if (ts_secure_client(sock, keys) != TS_OK || ts_proto_limit_socket(sock, lim) != TS_OK) {
        zmq_close(sock);
        return NULL;
    }
    if (mon) {
        char ep[64];
        snprintf(ep, sizeof ep, "inproc://ts-member-monitor-%p", (void *)sock);
        *mon = NULL;
        if (zmq_socket_monitor(sock, ep, ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                                             ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                             ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                                             ZMQ_EVENT_DISCONNECTED) == 0) {
            *mon = zmq_socket(ctx, ZMQ_PAIR);
            if (!*mon || zmq_connect(*mon, ep) != 0) { /* unread, a monitor would block */
                zmq_socket_monitor(sock, NULL, 0);
                if (*mon)
                    zmq_close(*mon);
                *mon = NULL;
            }
        }
    }
    if (zmq_connect(sock, endpoint) != 0) {
        ts_error(TS_ERR_VALUE, "%s: cannot connect to scheduler %s: %s", what, endpoint,
                 zmq_strerror(zmq_errno()));
        if (mon && *mon) {
            zmq_socket_monitor(sock, NULL, 0);
            zmq_close(*mon);
            *mon = NULL;
        }
        zmq_close(sock);
        return NULL;
    }
    return sock;
}

/* Absolute CLOCK_MONOTONIC deadline timeout_ms from now (for the condvar). */
static struct timespec deadline_in(int timeout_ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

static ts_status copy_field(char *dst, size_t cap, const char *src, const char *name)
{
    if (ts_proto_set_str(dst, cap, src ? src : "") != TS_OK)
        return ts_error(TS_ERR_VALUE, "join: %s '%s' is longer than %zu bytes", name, src, cap - 1);
    return TS_OK;
}

ts_status ts_member_join(const ts_member_options *opt, ts_member **out)
{
    *out = NULL;
    if (!opt || !opt->scheduler || !opt->job)
        return ts_error(TS_ERR_VALUE, "join: the scheduler endpoint and job id are required");
    if (opt->role != TS_ROLE_PS && opt->role != TS_ROLE_WORKER)
        return ts_error(TS_ERR_VALUE, "join: role must be ps or worker, got %s",
                        ts_proto_role_name(opt->role));
    ts_member *m = calloc(1, sizeof *m);
    if (!m)
        return ts_error(TS_ERR_MEMORY, "join: out of memory");
    m->wake[0] = m->wake[1] = -1;
    pthread_mutex_init(&m->mu, NULL);
    pthread_mutex_init(&m->call_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&m->cv, &ca);
    pthread_condattr_destroy(&ca);
    m->outq_tail = &m->outq;
    m->last_step = -1;
    m->last_barrier = -1;
    m->info.rank = TS_PROTO_RANK_NONE;
    m->role = opt->role;
    m->prev_rank = opt->prev_rank;
    ts_secure_keys keys;
    ts_status st;
    if ((st = copy_field(m->endpoint, sizeof m->endpoint, opt->scheduler, "scheduler")) != TS_OK ||
        (st = copy_field(m->job, sizeof m->job, opt->job, "job")) != TS_OK ||
        (st = copy_field(m->address, sizeof m->address, opt->address, "address")) != TS_OK ||
        (st = copy_field(m->caps, sizeof m->caps, opt->caps, "caps")) != TS_OK ||
        (st = load_keys(opt->key_file, &keys, "join")) != TS_OK)
        goto fail;
    if (pipe2(m->wake, O_NONBLOCK | O_CLOEXEC) != 0) {
        st = ts_error(TS_ERR_IO, "join: pipe: %s", strerror(errno));
        goto fail;
    }
    if (!(m->ctx = zmq_ctx_new())) {
        st = ts_error(TS_ERR_IO, "join: zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    ts_proto_limits lim;
    member_limits(&lim, m->job);
    if (!(m->sock = client_socket(m->ctx, &keys, &lim, m->endpoint, "join", &m->mon))) {
        st = ts_last_status();
        goto fail;
    }
    if (pthread_create(&m->io, NULL, io_main, m) != 0) {
        st = ts_error(TS_ERR_IO, "join: cannot start the I/O thread");
        goto fail;
    }
    m->io_started = true;

    int timeout = opt->timeout_ms > 0 ? opt->timeout_ms : DEFAULT_JOIN_TIMEOUT_MS;
    struct timespec dl = deadline_in(timeout);
    pthread_mutex_lock(&m->mu);
    while (!m->joined && !m->join_failed)
        if (pthread_cond_timedwait(&m->cv, &m->mu, &dl) == ETIMEDOUT)
            break;
    if (m->joined) {
        pthread_mutex_unlock(&m->mu);
        *out = m;
        return TS_OK;
    }
    if (m->join_failed)
        st = ts_error(m->join_status, "%s", m->join_error);
    else
        st = ts_error(TS_ERR_TIMEOUT, "join: no JOIN_ACK from scheduler %s within %d ms (is "
                      "it running, is the job '%s' and is the key file the job's?)",
                      m->endpoint, timeout, m->job);
    m->joined = true; /* stop re-sending JOIN while closing */
    pthread_mutex_unlock(&m->mu);
fail:;
    char msg[MSG_TEXT];
    textf(msg, sizeof msg, "%s", ts_last_error());
    free_member(m);
    return ts_error(st, "%s", msg);
}

void ts_member_info_get(ts_member *m, ts_member_info *info)
{
    pthread_mutex_lock(&m->mu);
    *info = m->info;
    pthread_mutex_unlock(&m->mu);
}

/* Copies the roster (caller holds mu). */
static ts_status roster_copy(ts_member *m, ts_proto_member **roster, size_t *n)
{
    ts_proto_member *copy = malloc((m->nroster ? m->nroster : 1) * sizeof *copy);
    if (!copy)
        return ts_error(TS_ERR_MEMORY, "roster: out of memory");
    memcpy(copy, m->roster, m->nroster * sizeof *copy);
    *roster = copy;
    *n = m->nroster;
    return TS_OK;
}

ts_status ts_member_roster(ts_member *m, ts_proto_member **roster, size_t *n, uint64_t *generation)
{
    pthread_mutex_lock(&m->mu);
    ts_status st = roster_copy(m, roster, n);
    if (generation)
        *generation = m->info.generation;
    pthread_mutex_unlock(&m->mu);
    return st;
}

bool ts_member_poll_membership(ts_member *m, uint64_t *generation, ts_proto_member **roster,
                               size_t *n)
{
    pthread_mutex_lock(&m->mu);
    bool news = m->news;
    if (news) {
        m->news = false;
        if (generation)
            *generation = m->info.generation;
        if (roster && n && roster_copy(m, roster, n) != TS_OK) {
            *roster = NULL;
            *n = 0;
        }
    }
    pthread_mutex_unlock(&m->mu);
    return news;
}

/* Queues a message of type for the I/O thread: a STEP_DONE or STOPPED of
 * step (the node's last step from then on), or a REGROUP with reason;
 * does not wait. */
static ts_status post(ts_member *m, ts_proto_type type, int64_t step, const char *reason)
{
    outmsg *o = new_out(type);
    if (!o)
        return ts_error(TS_ERR_MEMORY, "%s: out of memory", ts_proto_type_name(type));
    o->step = step;
    if (reason)
        ts_proto_set_str(o->reason, sizeof o->reason, reason);
    pthread_mutex_lock(&m->mu);
    enqueue(m, o);
    pthread_mutex_unlock(&m->mu);
    wake_io(m);
    return TS_OK;
}

ts_status ts_member_step_done(ts_member *m, int64_t step) { return post(m, TS_MSG_STEP_DONE, step, NULL); }

bool ts_member_stop_asked(ts_member *m, char *reason, size_t cap)
{
    pthread_mutex_lock(&m->mu);
    bool asked = m->stop_asked;
    if (asked && reason && cap)
        textf(reason, cap, "%s", m->stop_reason);
    pthread_mutex_unlock(&m->mu);
    return asked;
}

ts_status ts_member_stopped(ts_member *m, int64_t step) { return post(m, TS_MSG_STOPPED, step, NULL); }

ts_status ts_member_ask_regroup(ts_member *m, const char *reason) { return post(m, TS_MSG_REGROUP, 0, reason); }

/* Sends o and waits for the I/O thread to finish the request of kind k. */
static ts_status request(ts_member *m, req_kind k, outmsg *o, int timeout_ms, const char *what,
                         void **data, size_t *size)
{
    pthread_mutex_lock(&m->call_mu);
    pthread_mutex_lock(&m->mu);
    ts_status st;
    if (m->shutdown) {
        st = ts_error(TS_ERR_STATE, "%s: the job was shut down: %s", what, m->shutdown_reason);
        pthread_mutex_unlock(&m->mu);
        pthread_mutex_unlock(&m->call_mu);
        free(o->data);
        free(o);
        return st;
    }
    if (timeout_ms <= 0)
        timeout_ms = (int)(m->info.barrier_timeout_ms + m->info.heartbeat_timeout_ms) +
                     WAIT_MARGIN_MS;
    m->req = k;
    m->req_barrier = o->barrier_id;
    memcpy(m->req_key, o->key, sizeof m->req_key);
    m->req_done = false;
    m->req_data = NULL;
    m->req_size = 0;
    if (k == REQ_BARRIER && o->barrier_id > m->last_barrier)
        m->last_barrier = o->barrier_id;
    enqueue(m, o);
    wake_io(m);
    struct timespec dl = deadline_in(timeout_ms);
    while (!m->req_done)
        if (pthread_cond_timedwait(&m->cv, &m->mu, &dl) == ETIMEDOUT)
            break;
    if (!m->req_done)
        st = ts_error(TS_ERR_TIMEOUT, "%s: no answer from scheduler %s within %d ms", what,
                      m->endpoint, timeout_ms);
    else if (m->req_status != TS_OK)
        st = ts_error(m->req_status, "%s: %s", what, m->req_error);
    else
        st = TS_OK;
    if (st == TS_OK && data) {
        *data = m->req_data;
        *size = m->req_size;
    } else {
        free(m->req_data);
    }
    m->req_data = NULL;
    m->req = REQ_NONE;
    pthread_mutex_unlock(&m->mu);
    pthread_mutex_unlock(&m->call_mu);
    return st;
}

ts_status ts_member_barrier(ts_member *m, int64_t id, int timeout_ms)
{
    if (id < 0)
        return ts_error(TS_ERR_VALUE, "barrier: id %lld is negative", (long long)id);
    outmsg *o = new_out(TS_MSG_BARRIER);
    if (!o)
        return ts_error(TS_ERR_MEMORY, "barrier: out of memory");
    o->barrier_id = id;
    char what[64];
    textf(what, sizeof what, "barrier %lld", (long long)id);
    return request(m, REQ_BARRIER, o, timeout_ms, what, NULL, NULL);
}

/* A blob request with its key checked and copied. */
static outmsg *blob_out(ts_proto_type type, const char *key, const char *what)
{
    if (!key || !*key || strlen(key) > TS_PROTO_KEY_MAX) {
        ts_error(TS_ERR_VALUE, "%s: key must be 1..%d bytes", what, TS_PROTO_KEY_MAX);
        return NULL;
    }
    outmsg *o = new_out(type);
    if (!o) {
        ts_error(TS_ERR_MEMORY, "%s: out of memory", what);
        return NULL;
    }
    memcpy(o->key, key, strlen(key) + 1);
    return o;
}

ts_status ts_member_blob_put(ts_member *m, const char *key, const void *data, size_t size)
{
    if (size > 64u * 1024u)
        return ts_error(TS_ERR_VALUE, "blob_put '%s': %zu bytes is over the 65536-byte limit",
                        key ? key : "", size);
    outmsg *o = blob_out(TS_MSG_BLOB_PUT, key, "blob_put");
    if (!o)
        return ts_last_status();
    o->data = malloc(size ? size : 1);
    if (!o->data) {
        free(o);
        return ts_error(TS_ERR_MEMORY, "blob_put: out of memory");
    }
    if (size)
        memcpy(o->data, data, size);
    o->size = size;
    return request(m, REQ_BLOB_PUT, o, 0, "blob_put", NULL, NULL);
}

ts_status ts_member_blob_get(ts_member *m, const char *key, int timeout_ms, void **data,
                             size_t *size)
{
    outmsg *o = blob_out(TS_MSG_BLOB_GET, key, "blob_get");
    if (!o)
        return ts_last_status();
    return request(m, REQ_BLOB_GET, o, timeout_ms, "blob_get", data, size);
}

bool ts_member_shutdown_requested(ts_member *m, int *code, char *reason, size_t cap)
{
    pthread_mutex_lock(&m->mu);
    bool down = m->shutdown;
    if (down) {
        if (code)
            *code = m->shutdown_code;
        if (reason && cap)
            textf(reason, cap, "%s", m->shutdown_reason);
    }
    pthread_mutex_unlock(&m->mu);
    return down;
}

void ts_member_leave(ts_member *m, const char *reason)
{
    if (!m)
        return;
    outmsg *o = new_out(TS_MSG_SHUTDOWN);
    pthread_mutex_lock(&m->mu);
    if (o && !m->shutdown) {
        ts_proto_set_str(o->reason, sizeof o->reason, reason ? reason : "leaving");
        enqueue(m, o);
        o = NULL;
    }
    pthread_mutex_unlock(&m->mu);
    free(o);
    ts_member_close(m);
}

void ts_member_close(ts_member *m)
{
    if (m)
        free_member(m);
}

ts_status ts_member_status_query(const char *scheduler, const char *key_file, int timeout_ms,
                                 ts_proto_msg *reply)
{
    memset(reply, 0, sizeof *reply);
    ts_secure_keys keys;
    ts_status st = load_keys(key_file, &keys, "status");
    if (st != TS_OK)
        return st;
    void *ctx = zmq_ctx_new();
    if (!ctx)
        return ts_error(TS_ERR_IO, "status: zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
    ts_proto_limits lim;
    member_limits(&lim, NULL);
    lim.max_frames = 0; /* STATUS_REPLY is a header only */
    void *sock = client_socket(ctx, &keys, &lim, scheduler, "status", NULL);
    if (!sock) {
        st = ts_last_status();
        zmq_ctx_term(ctx);
        return st;
    }
    if (timeout_ms <= 0)
        timeout_ms = 5000;
    zmq_setsockopt(sock, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
    ts_proto_msg q;
    ts_proto_msg_init(&q, TS_MSG_STATUS, "", 0, TS_PROTO_RANK_NONE);
    st = ts_proto_send(sock, NULL, &q, NULL, 0, 0);
    ts_proto_msg_free(&q);
    ts_proto_rx rx;
    ts_proto_rx_init(&rx);
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    while (st == TS_OK) {
        ts_proto_error e = ts_proto_recv(sock, &lim, 0, &rx);
        if (e == TS_PROTO_OK && rx.msg.type == TS_MSG_STATUS_REPLY) {
            *reply = rx.msg;
            reply->payload = NULL;
            memset(&rx.msg, 0, sizeof rx.msg);
            break;
        }
        if (e == TS_PROTO_OK && rx.msg.type == TS_MSG_ERROR) {
            st = ts_error(TS_ERR_PEER, "status: scheduler %s: %s: %s", scheduler,
                          ts_proto_error_name(rx.msg.code), rx.msg.reason);
        } else if (e == TS_PROTO_E_AGAIN || now_ms() >= deadline) {
            st = ts_error(TS_ERR_TIMEOUT, "status: no STATUS_REPLY from scheduler %s within "
                          "%d ms (is it running and is the key file the job's?)", scheduler,
                          timeout_ms);
        }
        ts_proto_rx_release(&rx);
    }
    ts_proto_rx_release(&rx);
    int zero = 0;
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_close(sock);
    zmq_ctx_term(ctx);
    return st;
}
