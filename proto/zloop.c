/* zloop.c - the poll-and-drain loop over a ZeroMQ socket, and its clock
 * without stalls (contract in zloop.h). */
#include "proto/zloop.h"

#include <time.h>

/* CLOCK_MONOTONIC in ms: counts everything, stalls included. */
static uint64_t raw_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t ts_zloop_now_ms(ts_zloop *z) {
    uint64_t raw = raw_ms();
    if (raw > z->deadline_ms) z->stalled_ms += raw - z->deadline_ms;
    if (z->deadline_ms < raw + TS_ZLOOP_SLACK_MS) z->deadline_ms = raw + TS_ZLOOP_SLACK_MS;
    return raw - z->stalled_ms;
}

uint64_t ts_zloop_stalled_ms(const ts_zloop *z) { return z->stalled_ms; }

uint64_t ts_zloop_remaining_ms(ts_zloop *z, uint64_t since_ms, uint64_t timeout_ms) {
    uint64_t now = ts_zloop_now_ms(z);
    uint64_t elapsed = now > since_ms ? now - since_ms : 0;
    return elapsed >= timeout_ms ? 0 : timeout_ms - elapsed;
}

void ts_zloop_drain(ts_zloop *z) {
    if (z->draining) return; /* on_msg called something that drains */
    z->draining = true;
    while (!z->stopped) {
        int events = 0;
        size_t sz = sizeof events;
        if (zmq_getsockopt(z->sock, ZMQ_EVENTS, &events, &sz) != 0 || !(events & ZMQ_POLLIN)) break;
        ts_proto_error e = ts_proto_recv(z->sock, &z->lim, ZMQ_DONTWAIT, &z->rx);
        if (e == TS_PROTO_E_AGAIN) break;
        z->on_msg(z->owner, e, &z->rx);
        ts_proto_rx_release(&z->rx);
        if (e == TS_PROTO_E_IO) break;
    }
    z->draining = false;
}

static void on_poll(uv_poll_t *h, int status, int events) {
    (void)status;
    (void)events;
    ts_zloop_drain(h->data);
}

/* Before the loop blocks: drain (a callback may have consumed the edge), then
 * note by when the loop must be back. */
static void on_prepare(uv_prepare_t *h) {
    ts_zloop *z = h->data;
    ts_zloop_drain(z);
    ts_zloop_now_ms(z); /* accounts for a stall before this point */
    int timeout = uv_backend_timeout(z->loop);
    z->deadline_ms = timeout < 0 ? UINT64_MAX : raw_ms() + (uint64_t)timeout + TS_ZLOOP_SLACK_MS;
}

static void on_tick(uv_timer_t *h) {
    ts_zloop *z = h->data;
    ts_zloop_drain(z);
    if (!z->stopped) z->on_tick(z->owner);
}

ts_status ts_zloop_init(ts_zloop *z, uv_loop_t *loop, void *sock, const ts_proto_limits *lim,
                        uint64_t period_ms, ts_zloop_msg_fn *on_msg, ts_zloop_tick_fn *on_tick,
                        void *owner) {
    *z = (ts_zloop){.sock = sock, .lim = *lim, .on_msg = on_msg, .on_tick = on_tick, .owner = owner,
                    .period_ms = period_ms ? period_ms : 1, .loop = loop, .deadline_ms = UINT64_MAX};
    ts_proto_rx_init(&z->rx);
    int fd = -1;
    size_t sz = sizeof fd;
    if (zmq_getsockopt(sock, ZMQ_FD, &fd, &sz) != 0)
        return ts_error(TS_ERR_IO, "zloop: ZMQ_FD: %s", zmq_strerror(zmq_errno()));
    int rc;
    if ((rc = uv_poll_init(loop, &z->poll, fd)) != 0)
        return ts_error(TS_ERR_IO, "zloop: uv_poll_init: %s", uv_strerror(rc));
    uv_prepare_init(loop, &z->prepare);
    uv_timer_init(loop, &z->tick);
    z->poll.data = z->prepare.data = z->tick.data = z;
    z->ready = true;
    return TS_OK;
}

void ts_zloop_start(ts_zloop *z) {
    z->deadline_ms = raw_ms() + TS_ZLOOP_SLACK_MS;
    uv_poll_start(&z->poll, UV_READABLE, on_poll);
    uv_prepare_start(&z->prepare, on_prepare);
    uv_timer_start(&z->tick, on_tick, z->period_ms, z->period_ms);
    ts_zloop_drain(z);
}

static void close_once(uv_handle_t *h) {
    if (!uv_is_closing(h)) uv_close(h, NULL);
}

void ts_zloop_stop(ts_zloop *z) {
    z->stopped = true;
    if (!z->ready) return;
    close_once((uv_handle_t *)&z->poll);
    close_once((uv_handle_t *)&z->prepare);
    close_once((uv_handle_t *)&z->tick);
}

void ts_zloop_free(ts_zloop *z) { ts_proto_rx_release(&z->rx); }
