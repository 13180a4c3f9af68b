/* test_comm.c - the communicator interface over the "self" backend and a
 * backend that fails: checks, blocking and non-blocking forms, order,
 * sticky failure, and the reference reductions backends use. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "collective/comm.h"

static ts_comm *self_comm(void) {
    ts_comm_config cfg = {.rank = 0, .size = 1, .generation = 7};
    ts_comm *c = ts_comm_create(ts_comm_backend_find("self"), &cfg);
    assert_non_null(c);
    return c;
}

static void test_find_and_create(void **state) {
    (void)state;
    assert_non_null(ts_comm_backend_find("self"));
    assert_null(ts_comm_backend_find("carrier-pigeon"));
    assert_non_null(strstr(ts_last_error(), "no backend \"carrier-pigeon\""));
    assert_non_null(strstr(ts_last_error(), "self"));
    ts_comm_config bad = {.rank = 2, .size = 2};
    assert_null(ts_comm_create(&ts_comm_self_backend, &bad));
    assert_non_null(strstr(ts_last_error(), "rank 2 is not in a world of 2"));
    ts_comm_config two = {.rank = 0, .size = 2};
    assert_null(ts_comm_create(&ts_comm_self_backend, &two));
    assert_non_null(strstr(ts_last_error(), "a world of 2 ranks"));
    ts_comm *c = self_comm();
    assert_int_equal(ts_comm_rank(c), 0);
    assert_int_equal(ts_comm_size(c), 1);
    assert_int_equal(ts_comm_generation(c), 7);
    ts_comm_free(c);
    ts_comm_free(NULL);
}

/* Every collective of one rank, in place and out of place, f32 and bf16. */
static void test_self_collectives(void **state) {
    (void)state;
    ts_comm *c = self_comm();
    float a[5] = {1, -2, 3.5f, 4, 5}, b[5] = {0};
    assert_int_equal(ts_comm_allreduce(c, a, b, 5, TS_F32, TS_REDUCE_SUM), TS_OK);
    assert_memory_equal(a, b, sizeof a);
    assert_int_equal(ts_comm_allreduce(c, a, a, 5, TS_F32, TS_REDUCE_AVG), TS_OK);
    assert_true(a[2] == 3.5f);
    memset(b, 0, sizeof b);
    assert_int_equal(ts_comm_reduce_scatter(c, a, b, 5, TS_F32, TS_REDUCE_MAX), TS_OK);
    assert_memory_equal(a, b, sizeof a);
    memset(b, 0, sizeof b);
    assert_int_equal(ts_comm_allgather(c, a, b, 5, TS_F32), TS_OK);
    assert_memory_equal(a, b, sizeof a);
    assert_int_equal(ts_comm_broadcast(c, a, 5, TS_F32, 0), TS_OK);
    assert_true(a[4] == 5.0f);
    uint16_t h[3] = {ts_bf16_from_f32(1.5f), ts_bf16_from_f32(-2), ts_bf16_from_f32(0.25f)}, g[3] = {0};
    assert_int_equal(ts_comm_allreduce(c, h, g, 3, TS_BF16, TS_REDUCE_SUM), TS_OK);
    assert_memory_equal(h, g, sizeof h);
    int64_t ids[2] = {3, 9};
    assert_int_equal(ts_comm_broadcast(c, ids, 2, TS_I64, 0), TS_OK);
    assert_int_equal(ts_comm_barrier(c), TS_OK);
    assert_int_equal(ts_comm_allreduce(c, NULL, NULL, 0, TS_F32, TS_REDUCE_SUM), TS_OK);
    ts_comm_free(c);
}

/* Bad operations are refused before anything is queued, naming the op,
 * the step and what was wrong. */
static void test_checks(void **state) {
    (void)state;
    ts_comm *c = self_comm();
    float x[4] = {0};
    ts_comm_req *r = (ts_comm_req *)1;
    ts_comm_op neg = {.kind = TS_COMM_ALLREDUCE, .send = x, .recv = x, .count = -3, .dtype = TS_F32, .step = 12};
    assert_int_equal(ts_comm_start(c, &neg, &r), TS_ERR_VALUE);
    assert_null(r);
    assert_non_null(strstr(ts_last_error(), "allreduce (step 12): count -3 is negative"));
    int64_t ints[4] = {0};
    assert_int_equal(ts_comm_allreduce(c, ints, ints, 4, TS_I64, TS_REDUCE_SUM), TS_ERR_DTYPE);
    assert_non_null(strstr(ts_last_error(), "allreduce: cannot reduce i64"));
    assert_int_equal(ts_comm_allreduce(c, x, x, 4, TS_F32, (ts_reduce_op)9), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "unknown reduction 9"));
    assert_int_equal(ts_comm_allgather(c, NULL, x, 4, TS_F32), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "allgather: no send buffer for 4 elements"));
    assert_int_equal(ts_comm_recv(c, NULL, 4, TS_F32, 0), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "recv: no receive buffer"));
    assert_int_equal(ts_comm_send(c, x, 4, TS_F32, 0), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "send: peer 0 is this rank itself"));
    assert_int_equal(ts_comm_send(c, x, 4, TS_F32, 3), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "send: peer 3 is not a rank of this communicator of 1"));
    assert_int_equal(ts_comm_broadcast(c, x, 4, TS_F32, -1), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "broadcast: root -1"));
    assert_int_equal(ts_comm_allgather(c, x, x, INT64_MAX / 2, TS_F32), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "overflow"));
    /* the communicator is still good */
    assert_int_equal(ts_comm_allreduce(c, x, x, 4, TS_F32, TS_REDUCE_SUM), TS_OK);
    ts_comm_free(c);
}

/* A backend that records the order it runs operations in, and holds each
 * one until the test releases it, so the caller provably computes while
 * operations are in flight. */
typedef struct {
    int order[16];
    _Atomic int n, released;
} slow_state;

static ts_status slow_open(ts_comm *c) {
    ts_comm_set_impl(c, (void *)ts_comm_config_of(c)->native);
    return TS_OK;
}

static ts_status slow_run(ts_comm *c, const ts_comm_op *op) {
    slow_state *s = ts_comm_impl(c);
    while (s->n >= s->released) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    s->order[s->n++] = (int)op->step;
    if (op->step == 3) return ts_error(TS_ERR_PEER, "rank 1 went silent");
    return TS_OK;
}

static void slow_close(ts_comm *c) { (void)c; }

static const ts_comm_backend slow_backend = {.name = "slow", .open = slow_open, .run = slow_run, .close = slow_close};

static void test_nonblocking_order_and_failure(void **state) {
    (void)state;
    slow_state s = {0};
    ts_comm_config cfg = {.rank = 0, .size = 2, .native = &s};
    ts_comm *c = ts_comm_create(&slow_backend, &cfg);
    assert_non_null(c);
    float x[2] = {0};
    ts_comm_req *req[5];
    for (int i = 0; i < 5; i++) {
        ts_comm_op op = {.kind = TS_COMM_ALLREDUCE, .send = x, .recv = x, .count = 2, .dtype = TS_F32, .step = i};
        assert_int_equal(ts_comm_start(c, &op, &req[i]), TS_OK);
    }
    assert_int_equal(s.n, 0); /* nothing ran yet: the caller is free */
    s.released = 5;
    assert_int_equal(ts_comm_wait(req[0]), TS_OK);
    assert_int_equal(ts_comm_wait(req[1]), TS_OK);
    assert_int_equal(ts_comm_wait(req[2]), TS_OK);
    assert_int_equal(ts_comm_wait(req[3]), TS_ERR_PEER);
    assert_non_null(strstr(ts_last_error(), "rank 1 went silent"));
    /* after a failure every later operation fails, naming the first one */
    assert_int_equal(ts_comm_wait(req[4]), TS_ERR_PEER);
    assert_non_null(strstr(ts_last_error(), "allreduce (step 4): the communicator failed earlier"));
    assert_non_null(strstr(ts_last_error(), "rank 1 went silent"));
    for (int i = 0; i < 4; i++) assert_int_equal(s.order[i], i);
    assert_int_equal(s.n, 4); /* step 4 never reached the backend */
    ts_comm_free(c);
}

static void test_reference_reductions(void **state) {
    (void)state;
    float a[3] = {1, 5, -1}, b[3] = {2, -3, 0.5f};
    ts_comm_reduce_into(a, b, 3, TS_F32, TS_REDUCE_SUM);
    assert_true(a[0] == 3 && a[1] == 2 && a[2] == -0.5f);
    ts_comm_reduce_into(a, b, 3, TS_F32, TS_REDUCE_MAX);
    assert_true(a[0] == 3 && a[1] == 2 && a[2] == 0.5f);
    ts_comm_finish_avg(a, 3, TS_F32, 2);
    assert_true(a[0] == 1.5f && a[1] == 1 && a[2] == 0.25f);
    double d[2] = {1, 2}, e[2] = {0.5, 8};
    ts_comm_reduce_into(d, e, 2, TS_F64, TS_REDUCE_MAX);
    assert_true(d[0] == 1 && d[1] == 8);
    /* bf16: added in f32, rounded to nearest even */
    uint16_t h[2] = {ts_bf16_from_f32(1.0f), ts_bf16_from_f32(256.0f)}, k[2] = {ts_bf16_from_f32(1.0f / 512),
                                                                             ts_bf16_from_f32(1.0f)};
    ts_comm_reduce_into(h, k, 2, TS_BF16, TS_REDUCE_SUM);
    assert_true(ts_f32_from_bf16(h[0]) == 1.0f);   /* 1 + 2^-9 rounds back to 1 */
    assert_true(ts_f32_from_bf16(h[1]) == 256.0f); /* 257 is a tie: rounds to even 256 */
    ts_comm_finish_avg(h, 2, TS_BF16, 4);
    assert_true(ts_f32_from_bf16(h[0]) == 0.25f && ts_f32_from_bf16(h[1]) == 64.0f);
}

/* The NCCL backend is in NCCL builds; without a CUDA device it refuses
 * to open with a clear error (tests/gpu runs it on a GPU). Several ranks
 * without the ring port to share the unique id are refused too. */
static void test_nccl_without_device(void **state) {
    (void)state;
#if TESSERA_WITH_NCCL
    const ts_comm_backend *be = ts_comm_backend_find("nccl");
    assert_non_null(be);
    ts_comm_config one = {.rank = 0, .size = 1, .generation = 1, .timeout_ms = 5000};
    ts_comm *c = ts_comm_create(be, &one);
    if (c) {
        print_message("a CUDA device is present: the GPU tests cover nccl\n");
        ts_comm_free(c);
        return;
    }
    assert_non_null(strstr(ts_last_error(), "communicator nccl: no CUDA device"));
#else
    assert_null(ts_comm_backend_find("nccl"));
    assert_non_null(strstr(ts_last_error(), "no backend \"nccl\" in this build"));
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_find_and_create),
        cmocka_unit_test(test_self_collectives),
        cmocka_unit_test(test_checks),
        cmocka_unit_test(test_nonblocking_order_and_failure),
        cmocka_unit_test(test_reference_reductions),
        cmocka_unit_test(test_nccl_without_device),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
