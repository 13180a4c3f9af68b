/* zloop.h - a libuv loop around one ZeroMQ server socket (the scheduler now,
 * tessera-ps next).
 *
 * Contract:
 * - The socket's ZMQ_FD is watched on the owner's uv loop. ZMQ_FD is edge
 *   triggered and any zmq call on the socket (a send included) may consume
 *   the edge, so the zloop drains the socket — receives every queued message
 *   with ts_proto_recv(lim) and hands each to on_msg — when the fd wakes and
 *   again before the loop blocks (a uv_prepare_t). Callbacks of the owner may
 *   therefore send at any time without draining themselves.
 * - on_tick runs every period_ms, after the socket was drained: a judgement
 *   made there ("peer silent too long") has seen every message that was
 *   queued before it.
 * - ts_zloop_now_ms() is a monotonic clock that leaves out the time this
 *   process did not run: whenever the loop comes back later than it planned
 *   to (blocked past its poll timeout, or a callback away for longer) by more
 *   than TS_ZLOOP_SLACK_MS, the excess is not counted. SIGSTOP, a debugger,
 *   swapping, a VM pause or a starved CPU look the same. Deadlines judged
 *   against peers (heartbeats, barrier and request timeouts) use this clock,
 *   so a stall of this process is never held against them. uv timers run on
 *   libuv's clock: a timer that judges peers re-checks with this clock when
 *   it fires (see ts_zloop_remaining_ms).
 * - ts_zloop_stop() stops draining at once (also inside on_msg) and closes
 *   the zloop's handles; the owner closes its own handles and lets uv_run
 *   return.
 * All calls are made on the loop's thread.
 */
#ifndef TS_PROTO_ZLOOP_H
#define TS_PROTO_ZLOOP_H

#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

#include "proto/wire.h"

/* Lateness of the loop that still counts as running (scheduling noise). */
#define TS_ZLOOP_SLACK_MS 100

/* One received message: e is the decode result (TS_PROTO_OK: rx->msg is
 * valid); rx->identity is the sender on a ROUTER socket even when decoding
 * failed. rx is released after the call. */
typedef void ts_zloop_msg_fn(void *owner, ts_proto_error e, ts_proto_rx *rx);
typedef void ts_zloop_tick_fn(void *owner);

/* Embedded in its owner; fields are private. */
typedef struct {
    void *sock;
    ts_proto_limits lim;
    ts_zloop_msg_fn *on_msg;
    ts_zloop_tick_fn *on_tick;
    void *owner;
    uint64_t period_ms;
    uv_loop_t *loop;
    uv_poll_t poll;
    uv_prepare_t prepare;
    uv_timer_t tick;
    ts_proto_rx rx;
    bool ready, stopped, draining;
    uint64_t deadline_ms; /* raw clock by which the loop should be back */
    uint64_t stalled_ms;  /* raw time left out of ts_zloop_now_ms */
} ts_zloop;

/* Prepares z on loop for sock (its handles are made, nothing runs yet).
 * lim is copied; lim->job may be NULL, else it must outlive z. */
ts_status ts_zloop_init(ts_zloop *z, uv_loop_t *loop, void *sock, const ts_proto_limits *lim,
                        uint64_t period_ms, ts_zloop_msg_fn *on_msg, ts_zloop_tick_fn *on_tick,
                        void *owner);

/* Starts watching the socket and ticking, and drains what is queued. */
void ts_zloop_start(ts_zloop *z);

/* Receives and hands over every message queued on the socket now. */
void ts_zloop_drain(ts_zloop *z);

/* The clock without the time the process was stalled, in ms. */
uint64_t ts_zloop_now_ms(ts_zloop *z);

/* Total time left out of the clock so far, in ms. */
uint64_t ts_zloop_stalled_ms(const ts_zloop *z);

/* Milliseconds left until since_ms + timeout_ms on the zloop clock (0: due). */
uint64_t ts_zloop_remaining_ms(ts_zloop *z, uint64_t since_ms, uint64_t timeout_ms);

/* Stops draining and ticking and closes the zloop's handles. Idempotent. */
void ts_zloop_stop(ts_zloop *z);

/* Releases what the zloop holds once its handles are closed (after uv_run
 * returned). A zeroed, never-initialised z is fine. */
void ts_zloop_free(ts_zloop *z);

#endif
