/* test_oversized.c - a peer cannot make the scheduler hold more memory than
 * its largest message: a raw TCP client without the key that opens a CURVE
 * handshake with a frame declaring 1 GiB and streams zeros, and a client with
 * the key that sends a 200 MiB payload frame, are both cut off at the frame's
 * size. The scheduler's RSS (from /proc) is sampled while the bytes stream
 * in and must stay within a bound; the scheduler keeps serving afterwards. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

/* The RSS may grow this much at most (the largest scheduler frame is 1 MiB). */
#define RSS_BOUND (48ll << 20)

/* Resident bytes of pid from /proc/<pid>/status (VmRSS). */
static long long rss_bytes(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    long long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %lld kB", &kb) == 1)
            break;
    fclose(f);
    assert_true(kb > 0);
    return kb * 1024;
}

/* Raises *peak to pid's RSS now. */
static void track_peak(pid_t pid, long long *peak)
{
    long long r = rss_bytes(pid);
    if (r > *peak)
        *peak = r;
}

/* The scheduler still answers STATUS. */
static void still_serving(const th_sched *s)
{
    ts_proto_msg st;
    assert_int_equal(ts_member_status_query(s->endpoint, s->key, 5000, &st), TS_OK);
    ts_proto_msg_free(&st);
}

/* A plain TCP connection to the scheduler's port. */
static int tcp_connect(const th_sched *s)
{
    const char *colon = strrchr(s->endpoint, ':');
    assert_non_null(colon);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

static void no_key_handshake_frame_of_1_gib(void **state)
{
    (void)state;
    th_sched s;
    th_start(&s, NULL);
    still_serving(&s);
    long long base = rss_bytes(s.pid), peak = base;
    int fd = tcp_connect(&s);
    /* ZMTP 3.0 greeting asking for CURVE, as a client */
    unsigned char greeting[64] = {0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 0};
    memcpy(greeting + 12, "CURVE", 5);
    assert_int_equal(send(fd, greeting, sizeof greeting, MSG_NOSIGNAL), (ssize_t)sizeof greeting);
    /* a command frame (the HELLO should come) declaring 1 GiB */
    unsigned char head[9] = {0x06, 0, 0, 0, 0, 0x40, 0, 0, 0};
    assert_int_equal(send(fd, head, sizeof head, MSG_NOSIGNAL), (ssize_t)sizeof head);
    static unsigned char zeros[1 << 20];
    long long sent = 0;
    while (sent < (400ll << 20)) {
        ssize_t w = send(fd, zeros, sizeof zeros, MSG_NOSIGNAL);
        if (w < 0)
            break; /* the scheduler hung up: what the fix does */
        sent += w;
        track_peak(s.pid, &peak);
    }
    close(fd);
    track_peak(s.pid, &peak);
    fprintf(stderr, "no key: sent %lld MiB of a 1 GiB frame; scheduler RSS %lld -> peak %lld MiB\n",
            sent >> 20, base >> 20, peak >> 20);
    assert_true(peak - base < RSS_BOUND);
    still_serving(&s);
    assert_int_equal(th_stop(&s), 0);
}

static void with_key_payload_of_200_mib(void **state)
{
    (void)state;
    th_sched s;
    th_start(&s, NULL);
    still_serving(&s);
    long long base = rss_bytes(s.pid), peak = base;
    void *ctx = zmq_ctx_new();
    void *sock = th_raw_socket(ctx, &s);
    assert_int_equal(zmq_socket_monitor(sock, "inproc://oversized-mon", ZMQ_EVENT_DISCONNECTED), 0);
    void *mon = zmq_socket(ctx, ZMQ_PAIR);
    assert_int_equal(zmq_connect(mon, "inproc://oversized-mon"), 0);

    size_t size = 200u << 20;
    char *big = calloc(1, size);
    assert_non_null(big);
    ts_proto_msg m;
    ts_proto_msg_init(&m, TS_MSG_BLOB_PUT, "test", 0, TS_PROTO_RANK_NONE);
    ts_proto_set_str(m.key, sizeof m.key, "big");
    ts_proto_payload p = {big, size, NULL, NULL};
    assert_int_equal(ts_proto_send(sock, NULL, &m, &p, 1, 0), TS_OK);
    ts_proto_msg_free(&m);
    free(big);

    /* until the scheduler hangs up or answers (after taking it all in) */
    bool ended = false;
    long long deadline = th_now_ms() + 60000;
    while (!ended && th_now_ms() < deadline) {
        zmq_pollitem_t items[2] = {{sock, 0, ZMQ_POLLIN, 0}, {mon, 0, ZMQ_POLLIN, 0}};
        zmq_poll(items, 2, 20);
        ended = items[0].revents || items[1].revents;
        track_peak(s.pid, &peak);
    }
    usleep(200000);
    track_peak(s.pid, &peak);
    fprintf(stderr, "with key: 200 MiB frame %s; scheduler RSS %lld -> peak %lld MiB\n",
            ended ? "ended" : "still streaming after 60 s", base >> 20, peak >> 20);
    assert_true(ended);
    assert_true(peak - base < RSS_BOUND);
    zmq_close(mon);
    zmq_close(sock);
    zmq_ctx_term(ctx);
    still_serving(&s);
    assert_int_equal(th_stop(&s), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(no_key_handshake_frame_of_1_gib),
        cmocka_unit_test(with_key_payload_of_200_mib),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
