/* test_barrier.c - barrier release, barrier timeout naming the missing rank
 * and its last step, eviction of a member that skips barriers, and the blob
 * relay, against the real tessera-scheduler. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

typedef struct {
    ts_member *m;
    int64_t id;
    ts_status st;
    char error[1024];
    long long done_at;
} barrier_arg;

static void *barrier_thread(void *p)
{
    barrier_arg *a = p;
    a->st = ts_member_barrier(a->m, a->id, 10000);
    snprintf(a->error, sizeof a->error, "%s", a->st == TS_OK ? "" : ts_last_error());
    a->done_at = th_now_ms();
    return NULL;
}

static void barrier_releases_when_all_arrive(void **state)
{
    (void)state;
    th_sched s;
    th_start(&s, "--min-workers", "3", "--servers", "1", NULL);
    ts_proto_role roles[4] = {TS_ROLE_PS, TS_ROLE_WORKER, TS_ROLE_WORKER, TS_ROLE_WORKER};
    ts_member *m[4];
    th_join_many(&s, roles, 4, m);
    for (int64_t id = 1; id <= 3; id++) {
        pthread_t t[3];
        barrier_arg a[3];
        for (int i = 0; i < 2; i++) {
            a[i] = (barrier_arg){.m = m[1 + i], .id = id};
            pthread_create(&t[i], NULL, barrier_thread, &a[i]);
        }
        usleep(150000); /* the first two wait for the third */
        long long last = th_now_ms();
        a[2] = (barrier_arg){.m = m[3], .id = id};
        pthread_create(&t[2], NULL, barrier_thread, &a[2]);
        for (int i = 0; i < 3; i++) {
            pthread_join(t[i], NULL);
            assert_int_equal(a[i].st, TS_OK);
            assert_true(a[i].done_at >= last);
        }
    }
    /* a barrier among the servers involves only the server */
    assert_int_equal(ts_member_barrier(m[0], 1, 3000), TS_OK);
    for (int i = 0; i < 4; i++)
        ts_member_leave(m[i], NULL);
    assert_int_equal(th_stop(&s), 0);
}

static void barrier_timeout_names_missing_rank(void **state)
{
    (void)state;
    th_sched s;
    th_start(&s, "--min-workers", "3", "--barrier-timeout-ms", "1000", "--heartbeat-ms", "50",
             "--heartbeat-timeout-ms", "5000", NULL);
    ts_proto_role roles[3] = {TS_ROLE_WORKER, TS_ROLE_WORKER, TS_ROLE_WORKER};
    ts_member *m[3];
    th_join_many(&s, roles, 3, m);
    for (int i = 0; i < 3; i++)
        for (int64_t step = 1; step <= 182; step++)
            assert_int_equal(ts_member_step_done(m[i], step), TS_OK);
    ts_member_info info;
    ts_member_info_get(m[2], &info);
    char expect[128];
    snprintf(expect, sizeof expect, "rank %d finished step 182 but did not reach barrier 183",
             info.rank);
    usleep(200000);
    long long t0 = th_now_ms();
    pthread_t t[2];
    barrier_arg a[2];
    for (int i = 0; i < 2; i++) {
        a[i] = (barrier_arg){.m = m[i], .id = 183};
        pthread_create(&t[i], NULL, barrier_thread, &a[i]);
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(a[i].st, TS_ERR_TIMEOUT);
        if (!strstr(a[i].error, expect))
            fail_msg("barrier error '%s' does not say '%s'", a[i].error, expect);
        assert_true(a[i].done_at - t0 >= 900);
        assert_true(a[i].done_at - t0 < 3000);
    }
    assert_true(th_log_contains(&s, "barrier 183 half-way"));
    assert_true(th_log_contains(&s, expect));
    /* the scheduler keeps serving: the next barrier with everyone works */
    barrier_arg b[3];
    pthread_t bt[3];
    for (int i = 0; i < 3; i++) {
        b[i] = (barrier_arg){.m = m[i], .id = 184};
        pthread_create(&bt[i], NULL, barrier_thread, &b[i]);
    }
    for (int i = 0; i < 3; i++) {
        pthread_join(bt[i], NULL);
        assert_int_equal(b[i].st, TS_OK);
    }
    for (int i = 0; i < 3; i++)
        ts_member_leave(m[i], NULL);
    assert_int_equal(th_stop(&s), 0);
}

typedef struct {
    ts_member *m;
    int steps;
    ts_status st;
    char error[1024];
} loop_arg;

/* The stand-in loop: barrier(step), then step_done(step). */
static void *loop_thread(void *p)
{
    loop_arg *a = p;
    a->st = TS_OK;
    for (int64_t step = 1; step <= a->steps && a->st == TS_OK; step++) {
        a->st = ts_member_barrier(a->m, step, 10000);
        if (a->st == TS_OK)
            a->st = ts_member_step_done(a->m, step);
    }
    snprintf(a->error, sizeof a->error, "%s", a->st == TS_OK ? "" : ts_last_error());
    return NULL;
}

/* A key holder joins as an extra worker, heartbeats and never reaches a
 * barrier: at the barrier timeout it is evicted like a dead member (the job
 * keeps its 2 workers), the others go on and the job finishes. */
static void member_that_skips_barriers_is_evicted(void **state)
{
    (void)state;
    th_sched s;
    th_start(&s, "--min-workers", "2", "--max-workers", "3", "--barrier-timeout-ms", "1000",
             "--heartbeat-ms", "50", "--heartbeat-timeout-ms", "5000", "--steps", "4", NULL);
    ts_proto_role roles[2] = {TS_ROLE_WORKER, TS_ROLE_WORKER};
    ts_member *m[2];
    th_join_many(&s, roles, 2, m);
    ts_member *rogue = th_join(&s, TS_ROLE_WORKER, -1, 5000);
    assert_non_null(rogue);
    ts_member_info info;
    ts_member_info_get(rogue, &info);
    pthread_t t[2];
    loop_arg a[2];
    for (int i = 0; i < 2; i++) {
        a[i] = (loop_arg){.m = m[i], .steps = 4};
        pthread_create(&t[i], NULL, loop_thread, &a[i]);
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(t[i], NULL);
        if (a[i].st != TS_OK)
            fail_msg("worker %d: %s", i, a[i].error);
    }
    assert_int_equal(th_wait_exit(&s, 10000), 0);
    char expect[128];
    snprintf(expect, sizeof expect, "rank %d (address '') evicted", info.rank);
    assert_true(th_log_contains(&s, expect));
    assert_true(th_log_contains(&s, "job finished: all workers completed 4 steps"));
    char reason[512];
    int code = 0;
    assert_true(ts_member_shutdown_requested(rogue, &code, reason, sizeof reason));
    assert_int_equal(code, 1);
    snprintf(expect, sizeof expect, "rank %d evicted: kept heartbeating but did not reach worker "
             "barrier 1", info.rank);
    if (!strstr(reason, expect))
        fail_msg("the evicted member was told '%s', not '%s'", reason, expect);
    for (int i = 0; i < 2; i++)
        ts_member_close(m[i]);
    ts_member_close(rogue);
    th_stop(&s);
}

typedef struct {
    ts_member *m;
    void *data;
    size_t size;
    ts_status st;
} get_arg;

static void *get_thread(void *p)
{
    get_arg *a = p;
    a->st = ts_member_blob_get(a->m, "nccl-unique-id", 5000, &a->data, &a->size);
    if (a->st != TS_OK)
        fprintf(stderr, "blob_get: %s\n", ts_last_error());
    return NULL;
}

static void blob_relay(void **state)
{
    (void)state;
    th_sched s;
    th_start(&s, "--min-workers", "2", "--barrier-timeout-ms", "800", NULL);
    ts_proto_role roles[2] = {TS_ROLE_WORKER, TS_ROLE_WORKER};
    ts_member *m[2];
    th_join_many(&s, roles, 2, m);
    /* a get that comes before the put waits for it */
    get_arg g = {.m = m[1]};
    pthread_t t;
    pthread_create(&t, NULL, get_thread, &g);
    usleep(200000);
    unsigned char id[128];
    for (size_t i = 0; i < sizeof id; i++)
        id[i] = (unsigned char)(i * 7 + 3);
    assert_int_equal(ts_member_blob_put(m[0], "nccl-unique-id", id, sizeof id), TS_OK);
    pthread_join(t, NULL);
    assert_int_equal(g.st, TS_OK);
    assert_int_equal(g.size, sizeof id);
    assert_memory_equal(g.data, id, sizeof id);
    free(g.data);
    /* a get after the put answers at once, also for the putter */
    void *d = NULL;
    size_t n = 0;
    assert_int_equal(ts_member_blob_get(m[0], "nccl-unique-id", 2000, &d, &n), TS_OK);
    assert_int_equal(n, sizeof id);
    free(d);
    /* nobody puts this one: not found after the scheduler's wait */
    long long t0 = th_now_ms();
    assert_int_equal(ts_member_blob_get(m[0], "never-put", 5000, &d, &n), TS_ERR_INDEX);
    assert_non_null(strstr(ts_last_error(), "never-put"));
    assert_true(th_now_ms() - t0 < 3000);
    /* too big for the relay */
    static unsigned char big[70000];
    assert_int_equal(ts_member_blob_put(m[0], "big", big, sizeof big), TS_ERR_VALUE);
    for (int i = 0; i < 2; i++)
        ts_member_leave(m[i], NULL);
    assert_int_equal(th_stop(&s), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(barrier_releases_when_all_arrive),
        cmocka_unit_test(barrier_timeout_names_missing_rank),
        cmocka_unit_test(member_that_skips_barriers_is_evicted),
        cmocka_unit_test(blob_relay),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
