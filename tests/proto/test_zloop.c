/* test_zloop.c - the poll-and-drain loop: every queued message is handed
 * over before the tick judges anything, a callback may send without
 * draining, bad frames reach on_msg with their decode error, and the clock
 * leaves out the time the loop was away. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>
#include <time.h>

#include "proto/zloop.h"

typedef struct {
    ts_zloop z;
    uv_loop_t loop;
    int ok, bad, at_first_tick, ticks;
    uint64_t clock_before, clock_after, stall_ms;
} fixture;

static void on_msg(void *owner, ts_proto_error e, ts_proto_rx *rx) {
    fixture *f = owner;
    (void)rx;
    if (e == TS_PROTO_OK) f->ok++;
    else f->bad++;
}

static void sleep_ms(uint64_t ms) {
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* First tick: counts what was handed over, then "stalls" for stall_ms;
 * second tick: reads the clock and stops. */
static void on_tick(void *owner) {
    fixture *f = owner;
    if (f->ticks++ == 0) {
        f->at_first_tick = f->ok + f->bad;
        f->clock_before = ts_zloop_now_ms(&f->z);
        sleep_ms(f->stall_ms);
        return;
    }
    f->clock_after = ts_zloop_now_ms(&f->z);
    ts_zloop_stop(&f->z);
}

/* A ROUTER bound on inproc and a DEALER that queued n good and one bad
 * message before the loop starts. */
static void *pair(void *ctx, void **dealer, int n) {
    void *router = zmq_socket(ctx, ZMQ_ROUTER);
    assert_int_equal(zmq_bind(router, "inproc://zloop-test"), 0);
    *dealer = zmq_socket(ctx, ZMQ_DEALER);
    assert_int_equal(zmq_connect(*dealer, "inproc://zloop-test"), 0);
    for (int i = 0; i < n; i++) {
        ts_proto_msg m;
        ts_proto_msg_init(&m, TS_MSG_HEARTBEAT, "job", 1, 0);
        assert_int_equal(ts_proto_send(*dealer, NULL, &m, NULL, 0, 0), TS_OK);
        ts_proto_msg_free(&m);
    }
    assert_int_equal(zmq_send(*dealer, "\xc1", 1, 0), 1); /* not msgpack */
    return router;
}

static void run(fixture *f, int n, uint64_t stall_ms) {
    memset(f, 0, sizeof *f);
    f->stall_ms = stall_ms;
    void *ctx = zmq_ctx_new(), *dealer = NULL;
    void *router = pair(ctx, &dealer, n);
    sleep_ms(50); /* inproc: everything is queued at the router */
    assert_int_equal(uv_loop_init(&f->loop), 0);
    ts_proto_limits lim;
    ts_proto_limits_default(&lim);
    assert_int_equal(ts_zloop_init(&f->z, &f->loop, router, &lim, 20, on_msg, on_tick, f), TS_OK);
    ts_zloop_start(&f->z);
    uv_run(&f->loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&f->loop), 0);
    ts_zloop_free(&f->z);
    int zero = 0;
    zmq_setsockopt(dealer, ZMQ_LINGER, &zero, sizeof zero);
    zmq_close(dealer);
    zmq_close(router);
    zmq_ctx_term(ctx);
}

static void test_queue_read_before_tick(void **state) {
    (void)state;
    fixture f;
    run(&f, 50, 0);
    assert_int_equal(f.ok, 50);
    assert_int_equal(f.bad, 1);
    assert_int_equal(f.at_first_tick, 51);
}

static void test_clock_leaves_out_a_stall(void **state) {
    (void)state;
    fixture f;
    run(&f, 1, 1500);
    /* the loop was away 1.5 s inside a callback: that time is left out */
    assert_true(ts_zloop_stalled_ms(&f.z) >= 1500 - TS_ZLOOP_SLACK_MS);
    assert_true(f.clock_after - f.clock_before < 1500 - TS_ZLOOP_SLACK_MS);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_queue_read_before_tick),
        cmocka_unit_test(test_clock_leaves_out_a_stall),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
