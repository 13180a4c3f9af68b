/* test_malformed.c - bad messages sent to the real tessera-scheduler over a
 * raw CURVE DEALER socket (random bytes, truncated msgpack, wrong field
 * types, huge declared lengths, too many frames, unknown type and version,
 * wrong job, stale and future generations, forged ranks): each gets an ERROR
 * reply with the matching code and is counted, and the scheduler still
 * answers a valid STATUS afterwards. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <msgpack.h>

#include "harness.h"

/* Sends n frames as one multipart message. */
static void send_frames(void *sock, const void *const *data, const size_t *size, size_t n)
{
    for (size_t i = 0; i < n; i++)
        assert_true(zmq_send(sock, data[i], size[i], i + 1 < n ? ZMQ_SNDMORE : 0) >= 0);
}

static void send_bytes(void *sock, const void *data, size_t size)
{
    send_frames(sock, &data, &size, 1);
}

/* Encodes m's header (m->lengths as "ln") into *buf; returns its size. */
static size_t encode(const ts_proto_msg *m, void **buf)
{
    size_t size = 0;
    if (ts_proto_encode(m, buf, &size) != TS_OK)
        fail_msg("encode: %s", ts_last_error());
    return size;
}

/* Receives until a message of type want arrives (skipping MEMBERSHIP and
 * the like); fails after 3 s. */
static void recv_type(void *sock, ts_proto_type want, ts_proto_rx *rx)
{
    ts_proto_limits lim;
    ts_proto_limits_default(&lim);
    long long deadline = th_now_ms() + 3000;
    while (th_now_ms() < deadline) {
        ts_proto_error e = ts_proto_recv(sock, &lim, 0, rx);
        if (e == TS_PROTO_OK && rx->msg.type == want)
            return;
        ts_proto_rx_release(rx);
    }
    fail_msg("no %s reply from the scheduler within 3 s", ts_proto_type_name(want));
}

static int bad_sent;

/* Receives the ERROR for the last bad message: code want and the count. */
static void expect_error(void *sock, uint32_t want)
{
    bad_sent++;
    ts_proto_rx rx;
    ts_proto_rx_init(&rx);
    recv_type(sock, TS_MSG_ERROR, &rx);
    if (rx.msg.code != want)
        fail_msg("expected error %s, got %s: %s", ts_proto_error_name(want),
                 ts_proto_error_name(rx.msg.code), rx.msg.reason);
    char count[64];
    snprintf(count, sizeof count, "(rejected message %d)", bad_sent);
    if (!strstr(rx.msg.reason, count))
        fail_msg("error reason '%s' does not count '%s'", rx.msg.reason, count);
    ts_proto_rx_release(&rx);
}

/* Sends a header-only message built from m. */
static void send_msg(void *sock, const ts_proto_msg *m)
{
    void *buf = NULL;
    size_t n = encode(m, &buf);
    send_bytes(sock, buf, n);
    free(buf);
}

/* A header map with the common keys where one key's value has the wrong
 * msgpack type (a string, or an integer for the job id). */
static size_t pack_wrong_type(const char *bad_key, msgpack_sbuffer *sb)
{
    msgpack_sbuffer_init(sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    const char *keys[] = {"v", "t", "job", "g", "s", "r", "ln"};
    msgpack_pack_map(&pk, 7);
    for (int i = 0; i < 7; i++) {
        msgpack_pack_str_with_body(&pk, keys[i], strlen(keys[i]));
        if (strcmp(keys[i], bad_key) == 0 && strcmp(bad_key, "job") == 0)
            msgpack_pack_int(&pk, 5);
        else if (strcmp(keys[i], bad_key) == 0)
            msgpack_pack_str_with_body(&pk, "oops", 4);
        else if (strcmp(keys[i], "job") == 0)
            msgpack_pack_str_with_body(&pk, "test", 4);
        else if (strcmp(keys[i], "ln") == 0)
            msgpack_pack_array(&pk, 0);
        else if (strcmp(keys[i], "t") == 0)
            msgpack_pack_uint32(&pk, TS_MSG_HEARTBEAT);
        else if (strcmp(keys[i], "r") == 0)
            msgpack_pack_int32(&pk, 0);
        else
            msgpack_pack_uint32(&pk, strcmp(keys[i], "v") == 0 ? TS_PROTO_VERSION : 0);
    }
    return sb->size;
}

static void malformed_messages_get_errors(void **state)
{
    (void)state;
    bad_sent = 0;
    th_sched s;
    th_start(&s, "--min-workers", "1", "--max-workers", "3", "--heartbeat-ms", "1000",
             "--heartbeat-timeout-ms", "20000", NULL);
    void *ctx = zmq_ctx_new();
    void *sock = th_raw_socket(ctx, &s);
    ts_proto_msg m;

    /* random bytes */
    unsigned char junk[97];
    srand(5);
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (unsigned char)rand();
    junk[0] = 0xc1; /* never valid msgpack */
    send_bytes(sock, junk, sizeof junk);
    expect_error(sock, TS_PROTO_E_MSGPACK);

    /* an empty frame */
    send_bytes(sock, "", 0);
    expect_error(sock, TS_PROTO_E_MSGPACK);

    /* truncated msgpack: half a valid STATUS header */
    ts_proto_msg_init(&m, TS_MSG_STATUS, "test", 0, TS_PROTO_RANK_NONE);
    void *buf = NULL;
    size_t n = encode(&m, &buf);
    send_bytes(sock, buf, n / 2);
    free(buf);
    expect_error(sock, TS_PROTO_E_MSGPACK);

    /* msgpack but not a map */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 2);
    msgpack_pack_int(&pk, 1);
    msgpack_pack_int(&pk, 2);
    send_bytes(sock, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    expect_error(sock, TS_PROTO_E_NOT_MAP);

    /* wrong field types */
    const char *typed[] = {"g", "s", "r", "job"};
    for (int i = 0; i < 4; i++) {
        pack_wrong_type(typed[i], &sb);
        send_bytes(sock, sb.data, sb.size);
        msgpack_sbuffer_destroy(&sb);
        expect_error(sock, TS_PROTO_E_FIELD_TYPE);
    }

    /* a huge declared payload length with no payload */
    uint64_t huge = (uint64_t)1 << 40;
    m.lengths = &huge;
    m.nlengths = 1;
    n = encode(&m, &buf);
    m.lengths = NULL;
    m.nlengths = 0;
    send_bytes(sock, buf, n);
    free(buf);
    expect_error(sock, TS_PROTO_E_PAYLOAD_SIZE);

    /* a declared length that disagrees with the frame */
    uint64_t four = 4;
    ts_proto_msg_init(&m, TS_MSG_BLOB_PUT, "test", 0, TS_PROTO_RANK_NONE);
    ts_proto_set_str(m.key, sizeof m.key, "k");
    m.lengths = &four;
    m.nlengths = 1;
    n = encode(&m, &buf);
    m.lengths = NULL;
    m.nlengths = 0;
    const void *fr[2] = {buf, "12345678"};
    size_t fs[2] = {n, 8};
    send_frames(sock, fr, fs, 2);
    free(buf);
    expect_error(sock, TS_PROTO_E_PAYLOAD_LEN);

    /* too many frames */
    const void *many[12];
    size_t many_size[12];
    for (int i = 0; i < 12; i++) {
        many[i] = "x";
        many_size[i] = 1;
    }
    send_frames(sock, many, many_size, 12);
    expect_error(sock, TS_PROTO_E_FRAMES);

    /* unknown type and version */
    ts_proto_msg_init(&m, TS_MSG_STATUS, "test", 0, TS_PROTO_RANK_NONE);
    m.version = 7;
    send_msg(sock, &m);
    expect_error(sock, TS_PROTO_E_VERSION);

    /* another job's message, and a request before joining */
    ts_proto_msg_init(&m, TS_MSG_JOIN, "other-job", 0, TS_PROTO_RANK_NONE);
    m.role = TS_ROLE_WORKER;
    send_msg(sock, &m);
    expect_error(sock, TS_PROTO_E_JOB);
    ts_proto_msg_init(&m, TS_MSG_BARRIER, "test", 0, TS_PROTO_RANK_NONE);
    m.barrier_id = 1;
    send_msg(sock, &m);
    expect_error(sock, TS_PROTO_E_UNEXPECTED);

    /* join for real, then let two more workers join: generation 3 */
    ts_proto_msg_init(&m, TS_MSG_JOIN, "test", 0, TS_PROTO_RANK_NONE);
    m.role = TS_ROLE_WORKER;
    send_msg(sock, &m);
    ts_proto_rx rx;
    ts_proto_rx_init(&rx);
    recv_type(sock, TS_MSG_JOIN_ACK, &rx);
    int32_t rank = rx.msg.assigned_rank;
    assert_int_equal(rx.msg.generation, 1);
    ts_proto_rx_release(&rx);
    ts_member *w1 = th_join(&s, TS_ROLE_WORKER, -1, 5000);
    ts_member *w2 = th_join(&s, TS_ROLE_WORKER, -1, 5000);
    assert_non_null(w1);
    assert_non_null(w2);
    ts_member_info info;
    ts_member_info_get(w2, &info);
    assert_int_equal(info.generation, 3);

    /* stale and future generations, a forged sender rank */
    ts_proto_msg_init(&m, TS_MSG_HEARTBEAT, "test", 1, rank);
    send_msg(sock, &m);
    expect_error(sock, TS_PROTO_E_GENERATION);
    ts_proto_msg_init(&m, TS_MSG_STEP_DONE, "test", 9, rank);
    m.step = 1;
    send_msg(sock, &m);
    expect_error(sock, TS_PROTO_E_GENERATION);
    ts_proto_msg_init(&m, TS_MSG_HEARTBEAT, "test", 3, rank + 1);
    send_msg(sock, &m);
    expect_error(sock, TS_PROTO_E_UNEXPECTED);
    /* a message type the scheduler never takes */
    ts_proto_msg_init(&m, TS_MSG_JOIN_ACK, "test", 3, rank);
    m.assigned_rank = rank;
    send_msg(sock, &m);
    expect_error(sock, TS_PROTO_E_UNEXPECTED);

    /* still serving: a valid STATUS from this socket and from the library */
    ts_proto_msg_init(&m, TS_MSG_STATUS, "test", 0, TS_PROTO_RANK_NONE);
    send_msg(sock, &m);
    recv_type(sock, TS_MSG_STATUS_REPLY, &rx);
    assert_string_equal(rx.msg.phase, "running");
    assert_int_equal(rx.msg.generation, 3);
    assert_int_equal(rx.msg.nroster, 3);
    ts_proto_rx_release(&rx);
    ts_proto_msg st;
    assert_int_equal(ts_member_status_query(s.endpoint, s.key, 3000, &st), TS_OK);
    assert_int_equal(st.generation, 3);
    ts_proto_msg_free(&st);
    char counted[64];
    snprintf(counted, sizeof counted, "rejected message %d ", bad_sent);
    assert_true(th_log_contains(&s, counted));

    zmq_close(sock);
    zmq_ctx_term(ctx);
    ts_member_leave(w1, NULL);
    ts_member_leave(w2, NULL);
    assert_int_equal(th_stop(&s), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(malformed_messages_get_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
