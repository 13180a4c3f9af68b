/* cluster_latency.c - scheduler round trips with 8 nodes: median and p99.
 *
 * One process: the scheduler (scheduler/sched.h) runs on a thread, 8 worker
 * members (membership/member.h) on 8 more threads, all over CURVE on
 * loopback while every member heartbeats every 100 ms. Measured:
 *   - request/reply round trip on the heartbeat path: a member's message
 *     to the scheduler and the scheduler's answer (BLOB_PUT of 8 bytes and
 *     its acknowledgement; HEARTBEAT itself has no reply), 8 members at once;
 *   - barrier round trip: all 8 call ts_member_barrier(id) together; the
 *     time from a member's call to its release;
 *   - the peer: bare ZeroMQ DEALER/ROUTER ping-pongs with the same CURVE
 *     keys and ZAP gate, 8 clients at once against one echo thread, no
 *     Tessera code in the loop.
 * Prints median and p99 of each and the ratio to the peer.
 *
 * Usage: bench_cluster_latency [ROUNDS]   (default 300)
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "bench_util.h"
#include "membership/member.h"
#include "proto/secure.h"
#include "scheduler/sched.h"

enum { NODES = 8 };

static int rounds = 300;
static char key_path[256];
static char endpoint[256];
static pthread_barrier_t start_line;
static double *put_ms, *barrier_ms; /* [NODES * rounds] */

/* Sorts v[n] and writes its median and p99. */
static void summarize(double *v, size_t n, double *median, double *p99) {
    *median = bench_upper_median(v, n);
    *p99 = v[(size_t)((double)(n - 1) * 0.99)];
}

static void *run_scheduler(void *arg) {
    ts_sched_run(arg);
    return NULL;
}

static void *run_member(void *arg) {
    int idx = (int)(intptr_t)arg;
    ts_member_options opt = {.scheduler = endpoint, .job = "bench", .key_file = key_path,
                             .role = TS_ROLE_WORKER, .caps = "bench", .prev_rank = -1,
                             .timeout_ms = 20000};
    ts_member *m;
    if (ts_member_join(&opt, &m) != TS_OK) {
        fprintf(stderr, "bench: node %d: %s\n", idx, ts_last_error());
        exit(1);
    }
    char key[32];
    snprintf(key, sizeof key, "node-%d", idx);
    uint64_t payload = 0;
    pthread_barrier_wait(&start_line);
    for (int i = 0; i < rounds; i++) {
        payload = (uint64_t)i;
        double t0 = bench_now_ms();
        if (ts_member_blob_put(m, key, &payload, sizeof payload) != TS_OK) {
            fprintf(stderr, "bench: node %d: put: %s\n", idx, ts_last_error());
            exit(1);
        }
        put_ms[idx * rounds + i] = bench_now_ms() - t0;
    }
    pthread_barrier_wait(&start_line);
    for (int i = 0; i < rounds; i++) {
        double t0 = bench_now_ms();
        if (ts_member_barrier(m, i + 1, 0) != TS_OK) {
            fprintf(stderr, "bench: node %d: barrier: %s\n", idx, ts_last_error());
            exit(1);
        }
        barrier_ms[idx * rounds + i] = bench_now_ms() - t0;
    }
    ts_member_step_done(m, 1); /* the job has 1 step: the scheduler shuts down */
    while (!ts_member_shutdown_requested(m, NULL, NULL, 0)) usleep(1000);
    ts_member_close(m);
    return NULL;
}

/* The peer: NODES CURVE DEALERs ping-pong with one ROUTER echo thread, at
 * once, like the members with the scheduler. */
typedef struct {
    void *ctx;
    ts_secure_keys keys;
    char ep[256];
    double *v; /* [NODES * rounds] */
} echo_args;

static void *echo_server(void *arg) {
    echo_args *a = arg;
    void *r = zmq_socket(a->ctx, ZMQ_ROUTER);
    ts_secure_server(r, &a->keys);
    zmq_bind(r, "tcp://127.0.0.1:0");
    size_t len = sizeof a->ep;
    zmq_getsockopt(r, ZMQ_LAST_ENDPOINT, a->ep, &len);
    pthread_barrier_wait(&start_line);
    for (int i = 0; i < NODES * rounds; i++) {
        zmq_msg_t id, body;
        zmq_msg_init(&id);
        zmq_msg_init(&body);
        zmq_msg_recv(&id, r, 0);
        zmq_msg_recv(&body, r, 0);
        zmq_msg_send(&id, r, ZMQ_SNDMORE);
        zmq_msg_send(&body, r, 0);
    }
    zmq_close(r);
    return NULL;
}

typedef struct {
    echo_args *a;
    int idx;
} echo_client_args;

static void *echo_client(void *arg) {
    echo_client_args *c = arg;
    pthread_barrier_wait(&start_line); /* the server is bound */
    void *d = zmq_socket(c->a->ctx, ZMQ_DEALER);
    ts_secure_client(d, &c->a->keys);
    zmq_connect(d, c->a->ep);
    char msg[64] = {0}, back[64];
    zmq_send(d, msg, sizeof msg, 0); /* handshake outside the timing */
    zmq_recv(d, back, sizeof back, 0);
    for (int i = 0; i < rounds - 1; i++) {
        double t0 = bench_now_ms();
        zmq_send(d, msg, sizeof msg, 0);
        zmq_recv(d, back, sizeof back, 0);
        c->a->v[c->idx * (rounds - 1) + i] = bench_now_ms() - t0;
    }
    zmq_close(d);
    return NULL;
}

/* Fills v[NODES * (rounds - 1)] with the peer's round trips. */
static void zmq_peer(const ts_secure_keys *keys, double *v) {
    echo_args a = {.ctx = zmq_ctx_new(), .keys = *keys, .v = v};
    ts_secure_zap *zap = ts_secure_zap_start(a.ctx, keys);
    pthread_t server, clients[NODES];
    echo_client_args ca[NODES];
    pthread_barrier_init(&start_line, NULL, NODES + 1);
    pthread_create(&server, NULL, echo_server, &a);
    for (int i = 0; i < NODES; i++) {
        ca[i] = (echo_client_args){&a, i};
        pthread_create(&clients[i], NULL, echo_client, &ca[i]);
    }
    for (int i = 0; i < NODES; i++) pthread_join(clients[i], NULL);
    pthread_join(server, NULL);
    pthread_barrier_destroy(&start_line);
    ts_secure_zap_stop(zap);
    zmq_ctx_term(a.ctx);
}

int main(int argc, char **argv) {
    if (argc > 1) rounds = atoi(argv[1]);
    if (rounds < 10) rounds = 10;
    char dir[] = "/tmp/tessera-bench-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(key_path, sizeof key_path, "%s/job.key", dir);
    ts_secure_keys keys;
    if (ts_secure_keygen(key_path, &keys) != TS_OK) {
        fprintf(stderr, "bench: %s\n", ts_last_error());
        return 1;
    }
    char *sargv[] = {"tessera-scheduler", "--bind", "tcp://127.0.0.1:0", "--job", "bench",
                     "--key-file", key_path, "--min-workers", "8", "--heartbeat-ms", "100",
                     "--heartbeat-timeout-ms", "5000", "--barrier-timeout-ms", "10000",
                     "--steps", "1", NULL};
    ts_sched_config cfg;
    int help = 0;
    ts_sched *s = NULL;
    if (ts_sched_config_parse(17, sargv, &cfg, &help) != TS_OK || !(s = ts_sched_create(&cfg))) {
        fprintf(stderr, "bench: scheduler: %s\n", ts_last_error());
        return 1;
    }
    snprintf(endpoint, sizeof endpoint, "%s", ts_sched_endpoint(s));
    put_ms = calloc((size_t)NODES * rounds, sizeof *put_ms);
    barrier_ms = calloc((size_t)NODES * rounds, sizeof *barrier_ms);
    pthread_barrier_init(&start_line, NULL, NODES);
    pthread_t st, nodes[NODES];
    pthread_create(&st, NULL, run_scheduler, s);
    for (int i = 0; i < NODES; i++)
        pthread_create(&nodes[i], NULL, run_member, (void *)(intptr_t)i);
    for (int i = 0; i < NODES; i++) pthread_join(nodes[i], NULL);
    pthread_join(st, NULL);
    ts_sched_destroy(s);
    pthread_barrier_destroy(&start_line);

    double *peer = calloc((size_t)rounds * NODES, sizeof *peer);
    zmq_peer(&keys, peer);

    double pm, p99, bm, b99, zm, z99;
    summarize(put_ms, (size_t)NODES * rounds, &pm, &p99);
    summarize(barrier_ms, (size_t)NODES * rounds, &bm, &b99);
    summarize(peer, (size_t)NODES * (rounds - 1), &zm, &z99);
    printf("\ncluster latency, %d nodes, %d rounds each, CURVE on loopback\n", NODES, rounds);
    printf("%-44s %10s %10s %12s\n", "measure", "median ms", "p99 ms", "median/peer");
    printf("%-44s %10.3f %10.3f %12.1f\n", "peer: bare zmq ping-pong, 8 DEALERs at once", zm,
           z99, 1.0);
    printf("%-44s %10.3f %10.3f %12.1f\n", "heartbeat path round trip (8 B put + ack)", pm, p99,
           pm / zm);
    printf("%-44s %10.3f %10.3f %12.1f\n", "barrier round trip (8 nodes)", bm, b99, bm / zm);
    unlink(key_path);
    rmdir(dir);
    free(put_ms);
    free(barrier_ms);
    free(peer);
    return 0;
}
