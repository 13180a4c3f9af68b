/* test_membership.c - rendezvous (with its last call for the workers
 * started with the job), failure detection, rejoin, elastic join at a step
 * boundary and the orderly end of a job, against the real
 * tessera-scheduler. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <pthread.h>
#include <signal.h>

#include <cmocka.h>

#include "harness.h"

/* Waits up to timeout_ms for m to announce a new generation; 0 on timeout. */
static uint64_t wait_generation(ts_member *m, uint64_t above, int timeout_ms, size_t *nroster,
                                ts_proto_member **roster)
{
    long long deadline = th_now_ms() + timeout_ms;
    while (th_now_ms() < deadline) {
        uint64_t g = 0;
        ts_proto_member *r = NULL;
        size_t n = 0;
        if (ts_member_poll_membership(m, &g, &r, &n) && g > above) {
            if (roster)
                *roster = r;
            else
                free(r);
            if (nroster)
                *nroster = n;
            return g;
        }
        free(r);
        usleep(10000);
    }
    return 0;
}

static bool roster_has(const ts_proto_member *r, size_t n, int32_t rank)
{
    for (size_t i = 0; i < n; i++)
        if (r[i].rank == rank)
            return true;
    return false;
}

static void rendezvous_two_servers_four_workers(void **state)
{
    (void)state;
    th_sched s;
    th_start(&s, "--servers", "2", "--min-workers", "4", "--max-workers", "4", "--steps", "0",
             NULL);
    ts_proto_role roles[6] = {TS_ROLE_WORKER, TS_ROLE_PS, TS_ROLE_WORKER,
                              TS_ROLE_WORKER, TS_ROLE_PS, TS_ROLE_WORKER};
    ts_member *m[6];
    th_join_many(&s, roles, 6, m);
    bool seen[6] = {false};
    for (int i = 0; i < 6; i++) {
        ts_member_info info;
        ts_member_info_get(m[i], &info);
        assert_int_equal(info.generation, 1);
        assert_true(info.rank >= 0 && info.rank < 6);
        /* servers hold ranks 0 and 1, workers 2..5 */
        if (roles[i] == TS_ROLE_PS)
            assert_true(info.rank < 2);
        else
            assert_true(info.rank >= 2);
        assert_false(seen[info.rank]);
        seen[info.rank] = true;
        ts_proto_member *ros = NULL;
        size_t n = 0;
        uint64_t g = 0;
        assert_int_equal(ts_member_roster(m[i], &ros, &n, &g), TS_OK);
        assert_int_equal(n, 6);
        assert_int_equal(g, 1);
        for (size_t k = 0; k < n; k++) {
            assert_true(ros[k].alive);
            assert_int_equal(ros[k].role, ros[k].rank < 2 ? TS_ROLE_PS : TS_ROLE_WORKER);
        }
        free(ros);
    }
    ts_proto_msg st;
    assert_int_equal(ts_member_status_query(s.endpoint, s.key, 3000, &st), TS_OK);
    assert_string_equal(st.phase, "running");
    assert_int_equal(st.generation, 1);
    assert_int_equal(st.nroster, 6);
    ts_proto_msg_free(&st);
    for (int i = 0; i < 6; i++)
        ts_member_leave(m[i], "test over");
    assert_int_equal(th_stop(&s), 0);
}

static void silent_member_declared_dead_then_rejoins(void **state)
{
    (void)state;
    th_sched s;
    th_start(&s, "--min-workers", "3", "--max-workers", "4", "--heartbeat-ms", "50",
             "--heartbeat-timeout-ms", "400", NULL);
    ts_proto_role roles[3] = {TS_ROLE_WORKER, TS_ROLE_WORKER, TS_ROLE_WORKER};
    ts_member *m[3];
    th_join_many(&s, roles, 3, m);
    ts_member_info info;
    ts_member_info_get(m[1], &info);
    int32_t victim = info.rank;
    long long t0 = th_now_ms();
    ts_member_close(m[1]); /* stops heartbeating without a word */
    size_t n = 0;
    ts_proto_member *ros = NULL;
    uint64_t g = wait_generation(m[0], 1, 3000, &n, &ros);
    assert_int_equal(g, 2);
    assert_true(th_now_ms() - t0 < 2000);
    assert_int_equal(n, 2);
    assert_false(roster_has(ros, n, victim));
    free(ros);
    assert_int_equal(wait_generation(m[2], 1, 1000, NULL, NULL), 2);
    assert_true(th_log_contains(&s, "declared dead"));

    /* the restarted process asks for its rank back and gets it */
    ts_member *back = th_join(&s, TS_ROLE_WORKER, victim, 5000);
    assert_non_null(back);
    ts_member_info_get(back, &info);
    assert_int_equal(info.rank, victim);
    assert_int_equal(info.generation, 3);
    assert_int_equal(wait_generation(m[0], 2, 2000, &n, &ros), 3);
    assert_int_equal(n, 3);
    assert_true(roster_has(ros, n, victim));
    free(ros);

    /* a newcomer without a previous rank gets a fresh one */
    ts_member *fresh = th_join(&s, TS_ROLE_WORKER, -1, 5000);
    assert_non_null(fresh);
    ts_member_info_get(fresh, &info);
    assert_int_equal(info.rank, 3);
    /* the world is full now: a fifth worker is refused */
    long long t1 = th_now_ms();
    ts_member *extra = th_join(&s, TS_ROLE_WORKER, -1, 5000);
    assert_null(extra);
    assert_true(th_now_ms() - t1 < 3000);
    ts_member_leave(fresh, NULL);
    ts_member_leave(back, NULL);
    ts_member_leave(m[0], NULL);
    ts_member_leave(m[2], NULL);
    assert_int_equal(th_stop(&s), 0);
}

typedef struct {
    const th_sched *s;
    ts_member *m;
    long long joined_at;
} late_join;

static void *late_join_thread(void *p)
{
    late_join *j = p;
    j->m = th_join(j->s, TS_ROLE_WORKER, -1, 10000);
    j->joined_at = th_now_ms();
    return NULL;
}

static ts_member *b0_member;
static ts_status b0_status;

static void *barrier3_thread(void *p)
{
    (void)p;
    b0_status = ts_member_barrier(b0_member, 3, 5000);
    return NULL;
}

/* A scheduler for 2..3 workers (heartbeat timeout 2 s) and its first two,
 * joined into m[0] and m[1]. */
static void start_two_of_three(th_sched *s, ts_member **m)
{
    th_start(s, "--min-workers", "2", "--max-workers", "3", "--heartbeat-ms", "50",
             "--heartbeat-timeout-ms", "2000", NULL);
    ts_proto_role roles[2] = {TS_ROLE_WORKER, TS_ROLE_WORKER};
    th_join_many(s, roles, 2, m);
}

static void elastic_join_waits_for_step_boundary(void **state)
{
    (void)state;
    th_sched s;
    ts_member *m[2];
    start_two_of_three(&s, m);
    assert_int_equal(ts_member_step_done(m[0], 1), TS_OK);
    assert_int_equal(ts_member_step_done(m[1], 1), TS_OK);
    assert_int_equal(ts_member_step_done(m[0], 2), TS_OK); /* m[1] still in step 2 */
    pthread_t b0;
    b0_member = m[0];
    pthread_create(&b0, NULL, barrier3_thread, NULL);
    usleep(200000);
    late_join j = {&s, NULL, 0};
    pthread_t t;
    pthread_create(&t, NULL, late_join_thread, &j);
    usleep(700000);
    long long released = th_now_ms();
    assert_int_equal(ts_member_step_done(m[1], 2), TS_OK); /* the step boundary */
    pthread_join(t, NULL);
    assert_non_null(j.m);
    assert_true(j.joined_at >= released);
    ts_member_info info;
    ts_member_info_get(j.m, &info);
    assert_int_equal(info.generation, 2);
    assert_int_equal(info.start_step, 2);
    size_t n = 0;
    assert_int_equal(wait_generation(m[0], 1, 2000, &n, NULL), 2);
    assert_int_equal(n, 3);
    /* barrier 3 opened (by m[0]) before the joiner came in: the old workers
     * pass it, and the joiner's own barrier 3 is then released at once */
    assert_int_equal(ts_member_barrier(m[1], 3, 3000), TS_OK);
    pthread_join(b0, NULL);
    assert_int_equal(b0_status, TS_OK);
    long long tb = th_now_ms();
    assert_int_equal(ts_member_barrier(j.m, 3, 3000), TS_OK);
    assert_true(th_now_ms() - tb < 1000);
    ts_member_leave(j.m, NULL);
    ts_member_leave(m[0], NULL);
    ts_member_leave(m[1], NULL);
    assert_int_equal(th_stop(&s), 0);
}

/* Polls STATUS until every worker of the roster reports last step
 * `step`; whether they did within timeout_ms. */
static bool workers_at(const th_sched *s, int64_t step, int timeout_ms)
{
    long long deadline = th_now_ms() + timeout_ms;
    while (th_now_ms() < deadline) {
        ts_proto_msg st;
        if (ts_member_status_query(s->endpoint, s->key, 1000, &st) == TS_OK) {
            bool all = st.nroster > 0;
            for (size_t i = 0; all && i < st.nroster; i++)
                all = st.roster[i].role != TS_ROLE_WORKER || st.roster[i].last_step == step;
            ts_proto_msg_free(&st);
            if (all)
                return true;
        }
        usleep(20000);
    }
    return false;
}

/* A worker admitted at step 5 whose group then goes back to a checkpoint
 * (a lost fsdp shard) in the generation that admitted it takes the earlier
 * steps with the others. Before, the scheduler held the joiner at the step
 * it was admitted at in that generation and refused each of its earlier
 * steps as going back. */
static void joiner_goes_back_with_the_group(void **state)
{
    (void)state;
    th_sched s;
    ts_member *m[3];
    start_two_of_three(&s, m);
    for (int step = 1; step <= 5; step++)
        for (int i = 0; i < 2; i++)
            assert_int_equal(ts_member_step_done(m[i], step), TS_OK);
    assert_true(workers_at(&s, 5, 3000));
    m[2] = th_join(&s, TS_ROLE_WORKER, -1, 5000);
    assert_non_null(m[2]);
    ts_member_info info;
    ts_member_info_get(m[2], &info);
    assert_int_equal(info.start_step, 5);
    for (int i = 0; i < 2; i++)
        assert_int_equal(wait_generation(m[i], 1, 2000, NULL, NULL), info.generation);
    for (int i = 0; i < 3; i++) /* back to the checkpoint of step 2 */
        assert_int_equal(ts_member_step_done(m[i], 3), TS_OK);
    if (!workers_at(&s, 3, 3000))
        fail_msg("the joiner's step 3 was not taken (goes back: %d)", th_log_contains(&s, "goes back"));
    for (int i = 0; i < 3; i++)
        ts_member_leave(m[i], NULL);
    assert_int_equal(th_stop(&s), 0);
}

/* Steps reported faster than the I/O thread sends them reach the
 * scheduler in order, heartbeats among them: a heartbeat carries the last
 * step sent. Before, it carried the last step queued, overtook the
 * reports queued before it, and the scheduler refused each of those as
 * going back. */
static void heartbeats_do_not_overtake_steps(void **state)
{
    (void)state;
    th_sched s;
    th_start(&s, "--heartbeat-ms", "1", "--heartbeat-timeout-ms", "5000", NULL);
    ts_member *m = th_join(&s, TS_ROLE_WORKER, -1, 5000);
    assert_non_null(m);
    enum { STEPS = 20000 };
    for (int step = 1; step <= STEPS; step++) {
        assert_int_equal(ts_member_step_done(m, step), TS_OK);
        if (step % 64 == 0)
            usleep(100); /* let heartbeats go out between the reports */
    }
    assert_true(workers_at(&s, STEPS, 10000));
    if (th_log_contains(&s, "goes back"))
        fail_msg("the scheduler refused steps as going back");
    ts_member_leave(m, NULL);
    assert_int_equal(th_stop(&s), 0);
}

/* SIGINT right after the endpoint was announced (what tessera-run forwards
 * on Ctrl-C during the rendezvous) shuts the job down in order. Before,
 * the handlers were installed after the announcement, and a signal in
 * between killed the scheduler. */
static void signal_after_announcement(void **state)
{
    (void)state;
    for (int i = 0; i < 5; i++) {
        th_sched s;
        th_start(&s, "--min-workers", "2", NULL);
        kill(s.pid, SIGINT);
        assert_int_equal(th_wait_exit(&s, 5000), 0);
        assert_true(th_log_contains(&s, "scheduler received SIGINT: shutting the job down"));
        th_stop(&s);
    }
}

static void job_ends_when_workers_finish(void **state)
{
    (void)state;
    th_sched s;
    th_start(&s, "--min-workers", "2", "--servers", "1", "--steps", "3", NULL);
    ts_proto_role roles[3] = {TS_ROLE_PS, TS_ROLE_WORKER, TS_ROLE_WORKER};
    ts_member *m[3];
    th_join_many(&s, roles, 3, m);
    ts_member_info info;
    ts_member_info_get(m[1], &info);
    assert_int_equal(info.steps, 3);
    for (int step = 1; step <= 3; step++) {
        assert_int_equal(ts_member_step_done(m[1], step), TS_OK);
        assert_int_equal(ts_member_step_done(m[2], step), TS_OK);
    }
    assert_int_equal(th_wait_exit(&s, 5000), 0);
    for (int i = 0; i < 3; i++) {
        int code = -1;
        char reason[256];
        long long deadline = th_now_ms() + 2000;
        while (!ts_member_shutdown_requested(m[i], &code, reason, sizeof reason) &&
               th_now_ms() < deadline)
            usleep(10000);
        assert_int_equal(code, 0);
        assert_non_null(strstr(reason, "finished"));
        ts_member_close(m[i]);
    }
    th_stop(&s);
}

/* Waits up to timeout_ms for m's shutdown; its code, reason into why. */
static int wait_shutdown(ts_member *m, char *why, size_t cap, int timeout_ms)
{
    int code = -1;
    long long deadline = th_now_ms() + timeout_ms;
    while (!ts_member_shutdown_requested(m, &code, why, cap) && th_now_ms() < deadline)
        usleep(10000);
    return code;
}

/* SIGTERM while workers train: each gets STOP, a worker may not join, a
 * stopped worker holds up no barrier of the others, and the job ends (exit
 * 0) once every live worker sent STOPPED, naming their step. */
static void signal_stops_workers_together(void **state)
{
    (void)state;
    th_sched s;
    th_start(&s, "--min-workers", "2", "--max-workers", "3", "--servers", "1", "--steps", "100", NULL);
    ts_proto_role roles[3] = {TS_ROLE_PS, TS_ROLE_WORKER, TS_ROLE_WORKER};
    ts_member *m[3];
    th_join_many(&s, roles, 3, m);
    for (int step = 1; step <= 4; step++) {
        assert_int_equal(ts_member_step_done(m[1], step), TS_OK);
        assert_int_equal(ts_member_step_done(m[2], step), TS_OK);
    }
    kill(s.pid, SIGTERM);
    long long deadline = th_now_ms() + 3000;
    char why[256];
    while (!(ts_member_stop_asked(m[1], why, sizeof why) && ts_member_stop_asked(m[2], NULL, 0)) &&
           th_now_ms() < deadline)
        usleep(10000);
    assert_true(ts_member_stop_asked(m[2], NULL, 0));
    assert_non_null(strstr(why, "SIGTERM"));
    assert_false(ts_member_stop_asked(m[0], NULL, 0)); /* servers are not asked */
    assert_null(th_join(&s, TS_ROLE_WORKER, -1, 3000));
    assert_int_equal(ts_last_status(), TS_ERR_STATE); /* not to be asked again */
    assert_non_null(strstr(ts_last_error(), "is stopping"));

    assert_int_equal(ts_member_stopped(m[1], 5), TS_OK);
    assert_int_equal(ts_member_barrier(m[2], 5, 3000), TS_OK); /* not held by the stopped worker */
    assert_false(ts_member_shutdown_requested(m[2], NULL, NULL, 0)); /* still waiting for m[2] */
    assert_int_equal(ts_member_stopped(m[2], 5), TS_OK);
    assert_int_equal(th_wait_exit(&s, 5000), 0);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(wait_shutdown(m[i], why, sizeof why, 2000), 0);
        assert_non_null(strstr(why, "job stopped by SIGTERM after step 5"));
        ts_member_close(m[i]);
    }
    th_stop(&s);
}

/* A second SIGTERM shuts the job down although the workers did not stop. */
static void second_signal_shuts_down(void **state)
{
    (void)state;
    th_sched s;
    th_start(&s, "--min-workers", "1", "--steps", "100", NULL);
    ts_member *m = th_join(&s, TS_ROLE_WORKER, -1, 5000);
    assert_non_null(m);
    kill(s.pid, SIGTERM);
    long long deadline = th_now_ms() + 3000;
    while (!ts_member_stop_asked(m, NULL, 0) && th_now_ms() < deadline)
        usleep(10000);
    assert_true(ts_member_stop_asked(m, NULL, 0));
    kill(s.pid, SIGTERM);
    assert_int_equal(th_wait_exit(&s, 5000), 0);
    char why[256];
    assert_int_equal(wait_shutdown(m, why, sizeof why, 2000), 0);
    assert_non_null(strstr(why, "second SIGTERM"));
    ts_member_close(m);
    th_stop(&s);
}


/* Asked to stop, the only worker leaves instead (a signal of its own, as
 * mpirun sends every rank): the job ends at once, saying no worker is
 * left. */
static void stop_ends_when_workers_leave(void **state)
{
    (void)state;
    th_sched s;
    th_start(&s, "--min-workers", "1", "--servers", "1", "--steps", "100", NULL);
    ts_proto_role roles[2] = {TS_ROLE_PS, TS_ROLE_WORKER};
    ts_member *m[2];
    th_join_many(&s, roles, 2, m);
    kill(s.pid, SIGTERM);
    long long deadline = th_now_ms() + 3000;
    while (!ts_member_stop_asked(m[1], NULL, 0) && th_now_ms() < deadline)
        usleep(10000);
    assert_true(ts_member_stop_asked(m[1], NULL, 0));
    ts_member_leave(m[1], "stopped by a signal");
    assert_int_equal(th_wait_exit(&s, 5000), 0);
    char why[256];
    assert_int_equal(wait_shutdown(m[0], why, sizeof why, 2000), 0);
    assert_non_null(strstr(why, "no worker is left"));
    ts_member_close(m[0]);
    th_stop(&s);
}

/* A worker's REGROUP makes the next generation of the same members (a
 * peer paused and went on, declared dead by nobody). */
static void regroup_makes_next_generation(void **state)
{
    (void)state;
    th_sched s;
    th_start(&s, "--min-workers", "2", "--steps", "0", NULL);
    ts_proto_role roles[2] = {TS_ROLE_WORKER, TS_ROLE_WORKER};
    ts_member *m[2];
    th_join_many(&s, roles, 2, m);
    assert_int_equal(ts_member_ask_regroup(m[0], "allreduce failed"), TS_OK);
    for (int i = 0; i < 2; i++) {
        size_t n = 0;
        assert_int_equal(wait_generation(m[i], 1, 5000, &n, NULL), 2);
        assert_int_equal(n, 2);
    }
    assert_true(th_log_contains(&s, "asks for a new generation: allreduce failed"));
    for (int i = 0; i < 2; i++)
        ts_member_close(m[i]);
    assert_int_equal(th_stop(&s), 0);
}

static void rendezvous_times_out(void **state)
{
    (void)state;
    th_sched s;
    th_start(&s, "--min-workers", "2", "--rendezvous-timeout-ms", "800", NULL);
    long long t0 = th_now_ms();
    ts_member *m = th_join(&s, TS_ROLE_WORKER, -1, 5000);
    assert_null(m);
    assert_non_null(strstr(ts_last_error(), "1 of 2 workers"));
    assert_true(th_now_ms() - t0 < 3000);
    assert_int_equal(th_wait_exit(&s, 3000), 1);
    assert_true(th_log_contains(&s, "half-way"));
    th_stop(&s);
}

typedef struct {
    const th_sched *s;
    ts_member *m;
} joiner;

static void *join_worker(void *p)
{
    joiner *j = p;
    j->m = th_join(j->s, TS_ROLE_WORKER, -1, 15000);
    return NULL;
}

/* The minimum (1) joined, the second of the two workers started with the
 * job comes 400 ms later, within the last call: both are in generation 1,
 * and no second generation follows. */
static void last_call_gathers_late_worker(void **state)
{
    (void)state;
    th_sched s;
    th_start(&s, "--min-workers", "1", "--max-workers", "2", "--expect-workers", "2", "--heartbeat-ms", "100",
             "--heartbeat-timeout-ms", "3000", NULL);
    joiner first = {&s, NULL};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, join_worker, &first), 0);
    usleep(400 * 1000);
    ts_member *second = th_join(&s, TS_ROLE_WORKER, -1, 15000);
    pthread_join(t, NULL);
    assert_non_null(first.m);
    assert_non_null(second);
    ts_member *both[2] = {first.m, second};
    for (int i = 0; i < 2; i++) {
        ts_member_info info;
        ts_member_info_get(both[i], &info);
        assert_int_equal(info.generation, 1);
        ts_proto_member *ros = NULL;
        size_t n = 0;
        uint64_t g = 0;
        assert_int_equal(ts_member_roster(both[i], &ros, &n, &g), TS_OK);
        assert_int_equal(n, 2);
        free(ros);
    }
    assert_true(th_log_contains(&s, "1 of 2 workers joined, the minimum: waiting up to 3000 ms"));
    assert_false(th_log_contains(&s, "generation 2"));
    for (int i = 0; i < 2; i++)
        ts_member_close(both[i]);
    th_stop(&s);
}

/* The second expected worker never comes: the job starts with the minimum
 * once the last call (one heartbeat timeout) ran out. */
static void last_call_runs_out(void **state)
{
    (void)state;
    th_sched s;
    th_start(&s, "--min-workers", "1", "--max-workers", "2", "--expect-workers", "2", "--heartbeat-ms", "100",
             "--heartbeat-timeout-ms", "800", NULL);
    long long t0 = th_now_ms();
    ts_member *m = th_join(&s, TS_ROLE_WORKER, -1, 15000);
    long long took = th_now_ms() - t0;
    assert_non_null(m);
    assert_true(took >= 700 && took < 5000);
    ts_member_info info;
    ts_member_info_get(m, &info);
    assert_int_equal(info.generation, 1);
    ts_member_close(m);
    th_stop(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rendezvous_two_servers_four_workers),
        cmocka_unit_test(silent_member_declared_dead_then_rejoins),
        cmocka_unit_test(elastic_join_waits_for_step_boundary),
        cmocka_unit_test(joiner_goes_back_with_the_group),
        cmocka_unit_test(heartbeats_do_not_overtake_steps),
        cmocka_unit_test(signal_after_announcement),
        cmocka_unit_test(job_ends_when_workers_finish),
        cmocka_unit_test(signal_stops_workers_together),
        cmocka_unit_test(second_signal_shuts_down),
        cmocka_unit_test(stop_ends_when_workers_leave),
        cmocka_unit_test(regroup_makes_next_generation),
        cmocka_unit_test(rendezvous_times_out),
        cmocka_unit_test(last_call_gathers_late_worker),
        cmocka_unit_test(last_call_runs_out),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
