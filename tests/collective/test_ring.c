/* test_ring.c - the ZeroMQ ring backend between real processes: every
 * collective against a serial reference, N = 2, 3, 4 and 8 ranks, sizes
 * from 1 element to 64 MiB (odd sizes included), f32 and bf16, over tcp
 * and ipc; a rank that dies mid-operation is named by the others within
 * the timeout; a rank that moves to the next generation first loses
 * nothing it sent there; a root far ahead of its peer overruns nothing;
 * a peer that drops while its closed connection lingers leaves the port
 * working.
 * Each rank is a forked process with its own port;
 * endpoints meet through files in a temporary folder. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "collective/ring.h"
#include "collective_check.h"
#include "kernels/clock.h"
#include "proto/secure.h"
#include "../test_util.h"

static char dir[256], key[300];

/* Writes text to the file name in the test folder, whole or not at all. */
static void publish(const char *name, const char *text) {
    char path[512], done[512];
    snprintf(path, sizeof path, "%s/%s.tmp", dir, name);
    snprintf(done, sizeof done, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    CHECK(f, "cannot write %s", path);
    fprintf(f, "%s", text);
    fclose(f);
    rename(path, done);
}

/* Reads the file name of the test folder into out once it is there. */
static void await_file(const char *name, char *out, int cap) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    for (int tries = 0; access(path, F_OK) != 0 && tries < 3000; tries++) usleep(2000);
    FILE *f = fopen(path, "r");
    CHECK(f, "no %s", path);
    CHECK(fgets(out, cap, f), "empty %s", path);
    fclose(f);
}

/* Opens this rank's port, publishes its endpoint and builds the
 * communicator once every rank published. */
static ts_comm *join_ring(int r, int n, const char *transport, ts_ring_port **port, int timeout_ms) {
    char ep[512], name[64];
    if (strcmp(transport, "ipc") == 0) snprintf(ep, sizeof ep, "ipc://%s/port-%d", dir, r);
    else snprintf(ep, sizeof ep, "tcp://127.0.0.1:0");
    *port = ts_ring_port_open(ep, key, "ringtest", strcmp(transport, "tcp-plain") != 0);
    CHECK(*port, "rank %d: port: %s", r, ts_last_error());
    snprintf(name, sizeof name, "ep-%d-%d", n, r);
    publish(name, ts_ring_port_endpoint(*port));
    char *peers[8];
    for (int p = 0; p < n; p++) {
        peers[p] = calloc(1, 512);
        CHECK(peers[p], "out of memory");
        snprintf(name, sizeof name, "ep-%d-%d", n, p);
        await_file(name, peers[p], 512);
    }
    ts_comm_config cfg = {.rank = r, .size = n, .generation = 1, .timeout_ms = timeout_ms,
                          .peers = (const char *const *)peers, .native = *port};
    ts_comm *c = ts_comm_create(&ts_comm_ring_backend, &cfg);
    CHECK(c, "rank %d: communicator: %s", r, ts_last_error());
    for (int p = 0; p < n; p++) free(peers[p]);
    return c;
}

/* Forks n ranks running body(rank); fails unless all exit 0 within limit. */
static void run_ranks(int n, void (*body)(int r, int n, const char *t), const char *transport) {
    pid_t pids[8];
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            body(r, n, transport);
            _exit(0);
        }
    }
    int failed = 0;
    for (int r = 0; r < n; r++) {
        int status;
        waitpid(pids[r], &status, 0);
        failed += !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -f %s/ep-*", dir);
    if (system(cmd) != 0) fail_msg("cannot clean %s", dir);
    assert_int_equal(failed, 0);
}

static void sizes_body(int r, int n, const char *transport) {
    ts_ring_port *port;
    ts_comm *c = join_ring(r, n, transport, &port, 20000);
    static const int64_t counts[] = {1, 2, 7, 1001, 131075, 262147};
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        check_all(c, r, n, counts[k], TS_F32);
        check_all(c, r, n, counts[k], TS_BF16);
    }
    check_all(c, r, n, ((int64_t)16 << 20) + 3, TS_F32);  /* 64 MiB + 12 bytes */
    check_all(c, r, n, ((int64_t)32 << 20) + 3, TS_BF16); /* 64 MiB + 6 bytes */
    ts_comm_free(c);
    ts_ring_port_close(port);
}

static void test_two(void **state) { (void)state; run_ranks(2, sizes_body, "tcp"); }
static void test_three(void **state) { (void)state; run_ranks(3, sizes_body, "tcp"); }
static void test_four_ipc(void **state) { (void)state; run_ranks(4, sizes_body, "ipc"); }

static void small_body(int r, int n, const char *transport) {
    ts_ring_port *port;
    ts_comm *c = join_ring(r, n, transport, &port, 20000);
    static const int64_t counts[] = {1, 9, 4099, 300001};
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        check_all(c, r, n, counts[k], TS_F32);
        check_all(c, r, n, counts[k], TS_BF16);
    }
    ts_comm_free(c);
    ts_ring_port_close(port);
}

static void test_eight(void **state) { (void)state; run_ranks(8, sizes_body, "tcp"); }
/* parallel.ring_security "none": the same ring without CURVE */
static void test_three_plain(void **state) { (void)state; run_ranks(3, small_body, "tcp-plain"); }

/* Rank 2 of 4 exits in the middle of a large allreduce: every other rank
 * fails within the timeout with a message naming a rank and the step. */
static void death_body(int r, int n, const char *transport) {
    ts_ring_port *port;
    ts_comm *c = join_ring(r, n, transport, &port, 3000);
    int64_t count = (int64_t)8 << 20;
    float *a = malloc((size_t)count * sizeof *a);
    CHECK(a, "out of memory");
    fill(a, TS_F32, r, count);
    CHECK(!ts_comm_barrier(c), "rank %d: barrier: %s", r, ts_last_error());
    if (r == 2) {
        usleep(20000);
        _exit(0); /* gone without a word, as after kill -9 */
    }
    ts_comm_op op = {.kind = TS_COMM_ALLREDUCE, .send = a, .recv = a, .count = count, .dtype = TS_F32,
                     .op = TS_REDUCE_SUM, .step = 41};
    double t0 = ts_clock_ms();
    ts_status st = ts_comm_run(c, &op);
    double dt = ts_clock_ms() - t0;
    CHECK(st != TS_OK, "rank %d: the allreduce succeeded without rank 2", r);
    CHECK(strstr(ts_last_error(), "allreduce (step 41)") && strstr(ts_last_error(), "rank "),
          "rank %d: message does not name the op, step and a rank: %s", r, ts_last_error());
    CHECK(dt < 3000 + 2000, "rank %d: failed after %.0f ms (timeout 3000)", r, dt);
    fprintf(stderr, "rank %d after %.0f ms: %s\n", r, dt, ts_last_error());
    /* a failed communicator stays failed */
    CHECK(ts_comm_barrier(c) != TS_OK && strstr(ts_last_error(), "failed earlier"), "rank %d: not sticky: %s", r,
          ts_last_error());
    ts_comm_free(c);
    ts_ring_port_close(port);
    free(a);
}

static void test_death(void **state) { (void)state; run_ranks(4, death_body, "tcp"); }

/* Rank 0 moves to generation 2 while rank 1 still waits in an operation
 * of generation 1: rank 1's operation fails naming the move, and what rank
 * 0 sent in generation 2 reaches rank 1's generation-2 communicator. */
static void generation_body(int r, int n, const char *transport) {
    ts_ring_port *port;
    ts_comm *c = join_ring(r, n, transport, &port, 5000);
    const ts_comm_config *cfg = ts_comm_config_of(c);
    const char *peers[2] = {cfg->peers[0], cfg->peers[1]};
    char keep[2][512];
    snprintf(keep[0], 512, "%s", peers[0]);
    snprintf(keep[1], 512, "%s", peers[1]);
    peers[0] = keep[0];
    peers[1] = keep[1];
    CHECK(!ts_comm_barrier(c), "rank %d: barrier: %s", r, ts_last_error());
    float x[1000];
    fill(x, TS_F32, r, 1000);
    if (r == 1) {
        ts_status st = ts_comm_allreduce(c, x, x, 1000, TS_F32, TS_REDUCE_SUM);
        CHECK(st && strstr(ts_last_error(), "generation 2"), "rank 1: the old allreduce did not see the move: %s",
              ts_last_error());
    }
    ts_comm_free(c);
    ts_comm_config next = {.rank = r, .size = n, .generation = 2, .timeout_ms = 5000, .peers = peers, .native = port};
    c = ts_comm_create(&ts_comm_ring_backend, &next);
    CHECK(c, "rank %d: generation 2: %s", r, ts_last_error());
    fill(x, TS_F32, r, 1000);
    CHECK(!ts_comm_broadcast(c, x, 1000, TS_F32, 0), "rank %d: broadcast in generation 2: %s", r, ts_last_error());
    for (int i = 0; i < 1000; i++) CHECK(x[i] == value(0, i), "rank %d: broadcast [%d]", r, i);
    ts_comm_free(c);
    ts_ring_port_close(port);
}

static void test_next_generation(void **state) { (void)state; run_ranks(2, generation_body, "tcp"); }

/* A world that grows while one rank lags: ranks 0 and 1 run generation 1
 * (2 ranks), rank 2 generation 2 (3 ranks) alone, rank 3 joins at
 * generation 3 (4 ranks) and everybody meets there. Rank 2 hears of
 * generation 3 first from a rank its own generation does not have: that
 * chunk too is kept for generation 3. */
static void growing_body(int r, int n, const char *transport) {
    ts_ring_port *port;
    ts_comm *c = join_ring(r, n, transport, &port, 5000);
    const ts_comm_config *cfg = ts_comm_config_of(c);
    char keep[4][512];
    const char *peers[4];
    for (int i = 0; i < n; i++) peers[i] = strcpy(keep[i], cfg->peers[i]);
    CHECK(!ts_comm_barrier(c), "rank %d: barrier: %s", r, ts_last_error());
    ts_comm_free(c);
    float *x = calloc(100000, sizeof *x);
    CHECK(x, "out of memory");
    if (r < 2) {
        ts_comm_config g1 = {.rank = r, .size = 2, .generation = 1, .timeout_ms = 5000, .peers = peers, .native = port};
        c = ts_comm_create(&ts_comm_ring_backend, &g1);
        CHECK(c && !ts_comm_broadcast(c, x, 100, TS_F32, 0), "rank %d: generation 1: %s", r, ts_last_error());
        ts_comm_free(c);
    } else if (r == 2) {
        ts_comm_config g2 = {.rank = r, .size = 3, .generation = 2, .timeout_ms = 5000, .peers = peers, .native = port};
        c = ts_comm_create(&ts_comm_ring_backend, &g2);
        CHECK(c && ts_comm_broadcast(c, x, 100, TS_F32, 0) != TS_OK && strstr(ts_last_error(), "generation 3"),
              "rank 2: generation 2 did not learn of generation 3: %s", ts_last_error());
        ts_comm_free(c);
    }
    if (r == 0)
        for (int i = 0; i < 100000; i++) x[i] = (float)i;
    ts_comm_config g3 = {.rank = r, .size = n, .generation = 3, .timeout_ms = 5000, .peers = peers, .native = port};
    c = ts_comm_create(&ts_comm_ring_backend, &g3);
    CHECK(c, "rank %d: generation 3: %s", r, ts_last_error());
    CHECK(!ts_comm_broadcast(c, x, 100000, TS_F32, 0) && !ts_comm_barrier(c), "rank %d: generation 3: %s", r,
          ts_last_error());
    for (int i = 0; i < 100000; i++) CHECK(x[i] == (float)i, "rank %d: generation 3 broadcast [%d]", r, i);
    free(x);
    ts_comm_free(c);
    ts_ring_port_close(port);
}

static void test_growing_world(void **state) { (void)state; run_ranks(4, growing_body, "tcp"); }

/* The root of three broadcasts of 160 MiB each sends them all before its
 * peer starts the first (the peer is late): the later ones wait in the
 * transport, not in the peer's stash (256 MiB at most), and all arrive
 * whole. Without CURVE, so that the root is as fast as it can be. */
static void ahead_body(int r, int n, const char *transport) {
    ts_ring_port *port;
    ts_comm *c = join_ring(r, n, transport, &port, 20000);
    enum { OPS = 3, COUNT = 40 << 20 };
    float *x = malloc((size_t)OPS * COUNT * sizeof *x);
    CHECK(x, "out of memory");
    for (int64_t i = 0; r == 0 && i < (int64_t)OPS * COUNT; i++) x[i] = (float)(i % 1000 + i / COUNT);
    if (r == 1) usleep(1000 * 1000);
    for (int k = 0; k < OPS; k++)
        CHECK(!ts_comm_broadcast(c, x + (int64_t)k * COUNT, COUNT, TS_F32, 0), "rank %d: broadcast %d: %s", r, k,
              ts_last_error());
    for (int64_t i = 0; r == 1 && i < (int64_t)OPS * COUNT; i++)
        CHECK(x[i] == (float)(i % 1000 + i / COUNT), "rank 1: [%lld] of the broadcasts", (long long)i);
    CHECK(!ts_comm_barrier(c), "rank %d: barrier: %s", r, ts_last_error());
    free(x);
    ts_comm_free(c);
    ts_ring_port_close(port);
}

static void test_root_ahead(void **state) { (void)state; run_ranks(2, ahead_body, "tcp-plain"); }

/* Rank 1 stops (SIGSTOP) while rank 0 runs a large allreduce, which
 * fails on the timeout with chunks still queued to rank 1. Rank 0 leaves
 * rank 1 out of its next generation, which closes that connection while
 * it lingers, and rank 1 is killed inside the linger: the drop comes
 * after the connection closed. Rank 0's port must still carry the next
 * generation with a new rank 1, and close. */
static void linger_body(int r, int n, const char *transport) {
    char text[512];
    if (r == 1) {
        pid_t stopped = fork();
        if (stopped == 0) {
            ts_ring_port *port;
            ts_comm *c = join_ring(r, n, transport, &port, 3000);
            CHECK(!ts_comm_barrier(c), "rank 1: barrier: %s", ts_last_error());
            raise(SIGSTOP);
            _exit(1);
        }
        snprintf(text, sizeof text, "%d", (int)stopped);
        publish("ep-stopped-pid", text);
        int status = 0, waited = 0;
        while (waitpid(stopped, &status, WNOHANG) == 0 && waited++ < 3000) usleep(10000);
        if (waited > 3000) {
            kill(stopped, SIGKILL);
            waitpid(stopped, &status, 0);
        }
        CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "rank 1: the stopped rank was not killed by rank 0");
    }
    ts_ring_port *port = NULL;
    if (r == 0) {
        alarm(60); /* a port that cannot close any more ends the rank */
        ts_comm *c = join_ring(r, n, transport, &port, 3000);
        CHECK(!ts_comm_barrier(c), "rank 0: barrier: %s", ts_last_error());
        await_file("ep-stopped-pid", text, sizeof text);
        int64_t count = (int64_t)8 << 20;
        float *a = malloc((size_t)count * sizeof *a);
        CHECK(a, "out of memory");
        fill(a, TS_F32, r, count);
        CHECK(ts_comm_allreduce(c, a, a, count, TS_F32, TS_REDUCE_SUM) != TS_OK,
              "rank 0: the allreduce succeeded with rank 1 stopped");
        free(a);
        ts_comm_free(c);
        const char *alone[1] = {ts_ring_port_endpoint(port)};
        ts_comm_config solo = {.rank = 0, .size = 1, .generation = 2, .timeout_ms = 3000, .peers = alone, .native = port};
        c = ts_comm_create(&ts_comm_ring_backend, &solo);
        CHECK(c, "rank 0: generation 2: %s", ts_last_error());
        CHECK(kill((pid_t)atoi(text), SIGKILL) == 0, "rank 0: cannot kill the stopped rank %s", text);
        ts_comm_free(c);
        publish("ep-back-0", ts_ring_port_endpoint(port));
    } else {
        port = ts_ring_port_open("tcp://127.0.0.1:0", key, "ringtest", true);
        CHECK(port, "rank 1: port: %s", ts_last_error());
        publish("ep-back-1", ts_ring_port_endpoint(port));
    }
    char eps[2][512];
    await_file("ep-back-0", eps[0], 512);
    await_file("ep-back-1", eps[1], 512);
    const char *peers[2] = {eps[0], eps[1]};
    ts_comm_config g3 = {.rank = r, .size = n, .generation = 3, .timeout_ms = 5000, .peers = peers, .native = port};
    ts_comm *c = ts_comm_create(&ts_comm_ring_backend, &g3);
    CHECK(c, "rank %d: generation 3: %s", r, ts_last_error());
    float x[100000];
    fill(x, TS_F32, r, 100000);
    CHECK(!ts_comm_allreduce(c, x, x, 100000, TS_F32, TS_REDUCE_SUM), "rank %d: allreduce in generation 3: %s", r,
          ts_last_error());
    for (int i = 0; i < 100000; i++) CHECK(x[i] == reduced(TS_REDUCE_SUM, n, i, TS_F32), "rank %d: [%d]", r, i);
    ts_comm_free(c);
    ts_ring_port_close(port);
}

static void test_linger_drop(void **state) { (void)state; run_ranks(2, linger_body, "tcp"); }

static int setup(void **state) {
    (void)state;
    if (tu_make_tmp_dir(dir, sizeof dir, "tessera_ring") != 0) return -1;
    snprintf(key, sizeof key, "%s/job.key", dir);
    return ts_secure_keygen(key, NULL) == TS_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    return tu_remove_dir(dir);
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two),   cmocka_unit_test(test_three), cmocka_unit_test(test_four_ipc),
        cmocka_unit_test(test_eight), cmocka_unit_test(test_death), cmocka_unit_test(test_next_generation),
        cmocka_unit_test(test_growing_world), cmocka_unit_test(test_three_plain), cmocka_unit_test(test_root_ahead),
        cmocka_unit_test(test_linger_drop),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, setup, teardown);
}
