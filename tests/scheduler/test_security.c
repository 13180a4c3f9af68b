/* test_security.c - only holders of the job key file join: a client with
 * another job's keys, one with the right server key but a foreign client
 * key, and a plain (non-CURVE) socket all fail; the same client code with
 * the job's key file joins. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

static ts_member *join_with(const th_sched *s, const char *key_file, int timeout_ms,
                            ts_status *st)
{
    ts_member_options o = {.scheduler = s->endpoint, .job = "test", .key_file = key_file,
                           .role = TS_ROLE_WORKER, .prev_rank = -1, .timeout_ms = timeout_ms};
    ts_member *m = NULL;
    *st = ts_member_join(&o, &m);
    if (*st != TS_OK)
        fprintf(stderr, "expected refusal: %s\n", ts_last_error());
    return m;
}

static void only_the_job_key_joins(void **state)
{
    (void)state;
    th_sched s;
    th_start(&s, "--min-workers", "1", "--max-workers", "2", NULL);

    /* another job's key file: the handshake never completes */
    char other[400];
    snprintf(other, sizeof other, "%s/other.key", s.dir);
    ts_secure_keys ok;
    assert_int_equal(ts_secure_keygen(other, &ok), TS_OK);
    ts_status st;
    long long t0 = th_now_ms();
    assert_null(join_with(&s, other, 1500, &st));
    assert_true(st == TS_ERR_TIMEOUT || st == TS_ERR_PEER);
    assert_non_null(strstr(ts_last_error(), s.endpoint));
    assert_true(th_now_ms() - t0 < 4000);

    /* the job's server key but a foreign client key: ZAP refuses it */
    char hybrid[400];
    snprintf(hybrid, sizeof hybrid, "%s/hybrid.key", s.dir);
    FILE *f = fopen(hybrid, "w");
    assert_non_null(f);
    fprintf(f, "server-public: %s\nserver-secret: %s\nclient-public: %s\nclient-secret: %s\n",
            s.keys.server_public, s.keys.server_secret, ok.client_public, ok.client_secret);
    fclose(f);
    chmod(hybrid, 0600);
    assert_null(join_with(&s, hybrid, 3000, &st));
    assert_true(st == TS_ERR_TIMEOUT || st == TS_ERR_PEER);

    /* a plain socket gets nothing back, not even for STATUS */
    void *ctx = zmq_ctx_new();
    void *plain = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0, timeout = 1000;
    zmq_setsockopt(plain, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(plain, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    assert_int_equal(zmq_connect(plain, s.endpoint), 0);
    ts_proto_msg q;
    ts_proto_msg_init(&q, TS_MSG_STATUS, "test", 0, TS_PROTO_RANK_NONE);
    ts_proto_send(plain, NULL, &q, NULL, 0, ZMQ_DONTWAIT);
    char buf[64];
    assert_int_equal(zmq_recv(plain, buf, sizeof buf, 0), -1);
    zmq_close(plain);
    zmq_ctx_term(ctx);

    /* nobody got in: the scheduler is still waiting for its first worker */
    ts_proto_msg reply;
    assert_int_equal(ts_member_status_query(s.endpoint, s.key, 3000, &reply), TS_OK);
    assert_string_equal(reply.phase, "rendezvous");
    assert_int_equal(reply.nroster, 0);
    ts_proto_msg_free(&reply);

    /* the same code with the job's key file joins */
    ts_member *m = join_with(&s, s.key, 5000, &st);
    assert_int_equal(st, TS_OK);
    assert_non_null(m);
    ts_member_info info;
    ts_member_info_get(m, &info);
    assert_int_equal(info.rank, 0);
    assert_int_equal(info.generation, 1);
    ts_member_leave(m, NULL);
    assert_int_equal(th_stop(&s), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(only_the_job_key_joins),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
