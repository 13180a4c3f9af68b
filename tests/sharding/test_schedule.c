/* test_schedule.c - gpipe and 1f1b orders: every micro-batch forward then
 * backward once, backwards in order, 1f1b holds at most P - s micro-batches
 * at stage s and gpipe M; the P stages together finish (no stage waits for
 * what a later op of another would give) and, with equal costs per
 * micro-batch, spend exactly (P - 1) / (M + P - 1) of the time idle. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "sharding/schedule.h"

enum { MAXP = 8, MAXM = 32 };

static void test_orders(void **state) {
    (void)state;
    for (int f1b = 0; f1b < 2; f1b++)
        for (int P = 1; P <= MAXP; P++)
            for (int M = 1; M <= MAXM; M++)
                for (int s = 0; s < P; s++) {
                    ts_pipe_op ops[2 * MAXM];
                    assert_int_equal(ts_pipe_schedule(f1b, P, s, M, ops), TS_OK);
                    int fwd = 0, bwd = 0, live = 0, peak = 0;
                    for (int i = 0; i < 2 * M; i++) {
                        if (ops[i].kind == TS_PIPE_FORWARD) {
                            assert_int_equal(ops[i].micro, fwd++);
                            live++;
                        } else {
                            assert_int_equal(ops[i].micro, bwd++);
                            assert_true(bwd <= fwd);
                            live--;
                        }
                        if (live > peak) peak = live;
                    }
                    assert_int_equal(fwd, M);
                    assert_int_equal(bwd, M);
                    int want = f1b ? (P - s < M ? P - s : M) : M;
                    assert_int_equal(peak, want);
                }
}

/* The bubble of the P stages' orders played out with forward cost 1 and
 * backward cost 2 on every stage, no hand-off. */
static double simulated(bool f1b, int P, int M) {
    double fwd[MAXP], bwd[MAXP], bubble = -1;
    for (int s = 0; s < P; s++) fwd[s] = 1, bwd[s] = 2;
    assert_int_equal(ts_pipe_simulate(f1b, P, M, fwd, bwd, 0, &bubble), TS_OK);
    return bubble;
}

/* Both schedules' orders, with equal costs, have the theory's bubble. */
static void test_bubble(void **state) {
    (void)state;
    for (int f1b = 0; f1b < 2; f1b++)
        for (int P = 1; P <= MAXP; P++)
            for (int M = 1; M <= MAXM; M++)
                assert_true(fabs(simulated(f1b, P, M) - ts_pipe_bubble(P, M)) < 1e-12);
    /* a hand-off of 0.5 between 2 stages, M = 1: F 0-1 | F 1.5-2.5, B
     * 2.5-4.5 | B 5-7: each stage busy 3 of 7 */
    double fwd[2] = {1, 1}, bwd[2] = {2, 2}, bubble;
    assert_int_equal(ts_pipe_simulate(true, 2, 1, fwd, bwd, 0.5, &bubble), TS_OK);
    assert_true(fabs(bubble - 4.0 / 7) < 1e-12);
    assert_int_not_equal(ts_pipe_simulate(true, 2, 0, fwd, bwd, 0, &bubble), TS_OK);
}

static void test_bad_arguments(void **state) {
    (void)state;
    ts_pipe_op ops[2];
    assert_int_not_equal(ts_pipe_schedule(true, 2, 2, 1, ops), TS_OK);
    assert_non_null(strstr(ts_last_error(), "stage 2 of 2 stages"));
    assert_int_not_equal(ts_pipe_schedule(false, 2, 0, 0, ops), TS_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_orders),
        cmocka_unit_test(test_bubble),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
