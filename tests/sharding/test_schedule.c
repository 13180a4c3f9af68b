/* test_schedule.c - gpipe, 1f1b and interleaved orders: every micro-batch
 * forward then backward once (per chunk), backwards in order, 1f1b holds
 * at most P - s micro-batches at stage s and gpipe M (interleaved: its
 * warm-up plus one); the P stages together finish (no stage waits for
 * what a later op of another would give) and, with equal costs per
 * micro-batch, spend exactly (P - 1) / (VM + P - 1) of the time idle. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "sharding/schedule.h"

enum { MAXP = 8, MAXM = 32, MAXV = 4 };

static void test_orders(void **state) {
    (void)state;
    for (int f1b = 0; f1b < 2; f1b++)
        for (int P = 1; P <= MAXP; P++)
            for (int M = 1; M <= MAXM; M++)
                for (int s = 0; s < P; s++) {
                    ts_pipe_op ops[2 * MAXM];
                    ts_pipe_shape sh = {f1b, P, 1, M};
                    assert_int_equal(ts_pipe_schedule(&sh, s, ops), TS_OK);
                    int fwd = 0, bwd = 0, live = 0, peak = 0;
                    for (int i = 0; i < 2 * M; i++) {
                        assert_int_equal(ops[i].chunk, 0);
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

/* Interleaved: every (chunk, micro-batch) forward once and then backward
 * once on the same stage, each chunk's backwards in micro-batch order, and
 * 1f1b's warm-up bounds what a stage holds. */
static void test_interleaved_orders(void **state) {
    (void)state;
    for (int f1b = 0; f1b < 2; f1b++)
        for (int P = 1; P <= MAXP; P++)
            for (int V = 2; V <= MAXV; V++)
                for (int M = P; M <= MAXM; M += P)
                    for (int s = 0; s < P; s++) {
                        ts_pipe_op ops[2 * MAXV * MAXM];
                        ts_pipe_shape sh = {f1b, P, V, M};
                        assert_int_equal(ts_pipe_schedule(&sh, s, ops), TS_OK);
                        bool fwd[MAXV][MAXM] = {{false}};
                        int bwd_next[MAXV] = {0}, live = 0, peak = 0;
                        for (int i = 0; i < 2 * V * M; i++) {
                            int c = ops[i].chunk, m = ops[i].micro;
                            assert_true(c >= 0 && c < V && m >= 0 && m < M);
                            if (ops[i].kind == TS_PIPE_FORWARD) {
                                assert_false(fwd[c][m]);
                                fwd[c][m] = true;
                                live++;
                            } else {
                                assert_true(fwd[c][m]);
                                assert_int_equal(m, bwd_next[c]++);
                                live--;
                            }
                            if (live > peak) peak = live;
                        }
                        for (int c = 0; c < V; c++) assert_int_equal(bwd_next[c], M);
                        int warm = 2 * (P - s - 1) + (V - 1) * P;
                        int want = !f1b || warm >= V * M ? V * M : warm + 1;
                        assert_int_equal(peak, want);
                    }
}

/* The bubble of the P stages' orders played out with forward cost 1 and
 * backward cost 2 on every stage, no hand-off. */
static double simulated(bool f1b, int P, int V, int M) {
    double fwd[MAXP], bwd[MAXP], bubble = -1;
    for (int s = 0; s < P; s++) fwd[s] = 1, bwd[s] = 2;
    ts_pipe_shape sh = {f1b, P, V, M};
    assert_int_equal(ts_pipe_simulate(&sh, fwd, bwd, 0, &bubble), TS_OK);
    return bubble;
}

/* Every schedule's orders, with equal costs, finish (no stage is left
 * waiting) and have the theory's bubble, (P - 1) / (VM + P - 1). */
static void test_bubble(void **state) {
    (void)state;
    for (int f1b = 0; f1b < 2; f1b++)
        for (int P = 1; P <= MAXP; P++)
            for (int V = 1; V <= MAXV; V++)
                for (int M = V > 1 ? P : 1; M <= MAXM; M += V > 1 ? P : 1) {
                    ts_pipe_shape sh = {f1b, P, V, M};
                    double got = simulated(f1b, P, V, M), want = ts_pipe_bubble(&sh);
                    if (fabs(got - want) > 1e-12)
                        fail_msg("%s P %d V %d M %d: bubble %.6f, theory %.6f", f1b ? "1f1b" : "gpipe", P, V, M,
                                 got, want);
                }
    /* a hand-off of 0.5 between 2 stages, M = 1: F 0-1 | F 1.5-2.5, B
     * 2.5-4.5 | B 5-7: each stage busy 3 of 7 */
    double fwd[2] = {1, 1}, bwd[2] = {2, 2}, bubble;
    ts_pipe_shape sh = {true, 2, 1, 1};
    assert_int_equal(ts_pipe_simulate(&sh, fwd, bwd, 0.5, &bubble), TS_OK);
    assert_true(fabs(bubble - 4.0 / 7) < 1e-12);
    sh.micro = 0;
    assert_int_not_equal(ts_pipe_simulate(&sh, fwd, bwd, 0, &bubble), TS_OK);
}

static void test_bad_arguments(void **state) {
    (void)state;
    ts_pipe_op ops[16];
    ts_pipe_shape sh = {true, 2, 1, 1};
    assert_int_not_equal(ts_pipe_schedule(&sh, 2, ops), TS_OK);
    assert_non_null(strstr(ts_last_error(), "stage 2 of 2 stages"));
    sh.micro = 0;
    assert_int_not_equal(ts_pipe_schedule(&sh, 0, ops), TS_OK);
    ts_pipe_shape odd = {true, 2, 2, 3};
    assert_int_not_equal(ts_pipe_schedule(&odd, 0, ops), TS_OK);
    assert_non_null(strstr(ts_last_error(), "3 micro-batches with 2 chunks per stage"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_orders),
        cmocka_unit_test(test_interleaved_orders),
        cmocka_unit_test(test_bubble),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
