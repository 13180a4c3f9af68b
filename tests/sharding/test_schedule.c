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

/* Runs the P stages' orders with forward cost 1 and backward cost 2 (a
 * forward waits for the previous stage's forward of its micro-batch, a
 * backward for the next stage's backward) and returns the busy fraction. */
static double simulate(bool f1b, int P, int M) {
    ts_pipe_op ops[MAXP][2 * MAXM];
    double fdone[MAXP][MAXM], bdone[MAXP][MAXM], clock[MAXP] = {0};
    int next[MAXP] = {0};
    for (int s = 0; s < P; s++) assert_int_equal(ts_pipe_schedule(f1b, P, s, M, ops[s]), TS_OK);
    for (int s = 0; s < P; s++)
        for (int m = 0; m < M; m++) fdone[s][m] = bdone[s][m] = -1;
    for (int progress = 1; progress;) {
        progress = 0;
        for (int s = 0; s < P; s++) {
            if (next[s] == 2 * M) continue;
            ts_pipe_op op = ops[s][next[s]];
            double ready = clock[s];
            if (op.kind == TS_PIPE_FORWARD && s > 0) {
                if (fdone[s - 1][op.micro] < 0) continue;
                ready = fmax(ready, fdone[s - 1][op.micro]);
            }
            if (op.kind == TS_PIPE_BACKWARD && s < P - 1) {
                if (bdone[s + 1][op.micro] < 0) continue;
                ready = fmax(ready, bdone[s + 1][op.micro]);
            }
            clock[s] = ready + (op.kind == TS_PIPE_FORWARD ? 1 : 2);
            (op.kind == TS_PIPE_FORWARD ? fdone : bdone)[s][op.micro] = clock[s];
            next[s]++;
            progress = 1;
        }
    }
    double end = 0;
    for (int s = 0; s < P; s++) {
        assert_int_equal(next[s], 2 * M); /* no stage was left waiting */
        end = fmax(end, clock[s]);
    }
    return 3.0 * M / end;
}

static void test_bubble(void **state) {
    (void)state;
    for (int f1b = 0; f1b < 2; f1b++)
        for (int P = 1; P <= MAXP; P++)
            for (int M = 1; M <= MAXM; M++)
                assert_true(fabs((1 - simulate(f1b, P, M)) - ts_pipe_bubble(P, M)) < 1e-12);
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
