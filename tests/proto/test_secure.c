/* test_secure.c - job key files and CURVE + ZAP over real tcp sockets:
 * the job's key works, a stranger's key or no CURVE gets nothing processed. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "proto/secure.h"
#include "proto/wire.h"
#include "../test_util.h"

static char dir[256];

static int setup(void **state) {
    (void)state;
    return tu_make_tmp_dir(dir, sizeof dir, "tessera-secure");
}

static int teardown(void **state) {
    (void)state;
    return tu_remove_dir(dir);
}

static void path_in(char *out, size_t cap, const char *name) {
    snprintf(out, cap, "%s/%s", dir, name);
}

static void write_file(const char *path, const char *text, mode_t mode) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    chmod(path, mode);
}

static void test_keygen_and_load(void **state) {
    (void)state;
    assert_int_equal(ts_secure_available(), TS_OK);
    char p[300];
    path_in(p, sizeof p, "job.key");
    ts_secure_keys made, loaded;
    assert_int_equal(ts_secure_keygen(p, &made), TS_OK);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(ts_secure_load(p, &loaded), TS_OK);
    assert_memory_equal(&made, &loaded, sizeof made);
    assert_string_not_equal(made.server_public, made.client_public);
    /* never overwrites */
    assert_int_equal(ts_secure_keygen(p, NULL), TS_ERR_IO);
    assert_non_null(strstr(ts_last_error(), p));
}

static void test_wide_permissions_refused(void **state) {
    (void)state;
    char p[300];
    path_in(p, sizeof p, "wide.key");
    ts_secure_keys k;
    assert_int_equal(ts_secure_keygen(p, NULL), TS_OK);
    chmod(p, 0644);
    assert_int_equal(ts_secure_load(p, &k), TS_ERR_STATE);
    assert_non_null(strstr(ts_last_error(), "0644"));
    chmod(p, 0640);
    assert_int_equal(ts_secure_load(p, &k), TS_ERR_STATE);
    chmod(p, 0400);
    assert_int_equal(ts_secure_load(p, &k), TS_OK);
    assert_int_equal(ts_secure_load(dir, &k), TS_ERR_STATE); /* a directory (0700) */
    char missing[300];
    path_in(missing, sizeof missing, "absent.key");
    assert_int_equal(ts_secure_load(missing, &k), TS_ERR_IO);
}

static void test_bad_content_refused(void **state) {
    (void)state;
    char good[300], text[1024];
    path_in(good, sizeof good, "good.key");
    ts_secure_keys g, k;
    assert_int_equal(ts_secure_keygen(good, &g), TS_OK);
    struct {
        const char *what;
        const char *needle;
    } cases[] = {
        {"short", "server-secret is not a 40-char Z85 key"},
        {"badchar", "client-public is not a 40-char Z85 key"},
        {"missing", "has no client-secret"},
        {"twice", "server-public given twice"},
        {"swapped", "client-public does not belong to client-secret"},
        {"unknown", "unknown name 'color'"},
        {"nocolon", "expected 'name: key'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *w = cases[i].what;
        char cs[TS_SECURE_KEY_TEXT];
        strcpy(cs, g.client_public);
        cs[5] = '~';
        if (!strcmp(w, "short"))
            snprintf(text, sizeof text, "server-public: %s\nserver-secret: %.39s\n", g.server_public,
                     g.server_secret);
        else if (!strcmp(w, "badchar"))
            snprintf(text, sizeof text, "server-public: %s\nserver-secret: %s\nclient-public: %s\n",
                     g.server_public, g.server_secret, cs);
        else if (!strcmp(w, "missing"))
            snprintf(text, sizeof text, "# comment\n\nserver-public: %s\nserver-secret: %s\n"
                     "client-public: %s\n", g.server_public, g.server_secret, g.client_public);
        else if (!strcmp(w, "twice"))
            snprintf(text, sizeof text, "server-public: %s\nserver-public: %s\n", g.server_public,
                     g.server_public);
        else if (!strcmp(w, "swapped"))
            snprintf(text, sizeof text, "server-public: %s\nserver-secret: %s\nclient-public: %s\n"
                     "client-secret: %s\n", g.server_public, g.server_secret, g.server_public,
                     g.client_secret);
        else if (!strcmp(w, "unknown"))
            snprintf(text, sizeof text, "color: %s\n", g.server_public);
        else
            snprintf(text, sizeof text, "server-public %s\n", g.server_public);
        char p[300];
        snprintf(p, sizeof p, "%s/%s.key", dir, w);
        write_file(p, text, 0600);
        assert_int_equal(ts_secure_load(p, &k), TS_ERR_FORMAT);
        if (!strstr(ts_last_error(), cases[i].needle) || !strstr(ts_last_error(), p))
            fail_msg("%s: message \"%s\" lacks \"%s\"", w, ts_last_error(), cases[i].needle);
    }
}

/* A CURVE ROUTER server on tcp://127.0.0.1 with the job's ZAP handler. */
typedef struct {
    void *ctx, *router;
    ts_secure_zap *zap;
    char endpoint[128];
} server;

static void server_start(server *s, const ts_secure_keys *k) {
    s->ctx = zmq_ctx_new();
    s->zap = ts_secure_zap_start(s->ctx, k);
    if (!s->zap) fail_msg("%s", ts_last_error());
    s->router = zmq_socket(s->ctx, ZMQ_ROUTER);
    assert_int_equal(ts_secure_server(s->router, k), TS_OK);
    assert_int_equal(zmq_bind(s->router, "tcp://127.0.0.1:*"), 0);
    size_t n = sizeof s->endpoint;
    zmq_getsockopt(s->router, ZMQ_LAST_ENDPOINT, s->endpoint, &n);
}

static void server_stop(server *s) {
    int zero = 0;
    zmq_setsockopt(s->router, ZMQ_LINGER, &zero, sizeof zero);
    zmq_close(s->router);
    ts_secure_zap_stop(s->zap);
    zmq_ctx_term(s->ctx);
}

/* A DEALER in its own context (like another process), CURVE with k, or
 * plain when k is NULL, that sends one JOIN to the server. */
static void *client_send_join(void **ctx_out, const char *endpoint, const ts_secure_keys *k) {
    void *ctx = zmq_ctx_new();
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0, to = 2000;
    zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(d, ZMQ_RCVTIMEO, &to, sizeof to);
    if (k) assert_int_equal(ts_secure_client(d, k), TS_OK);
    assert_int_equal(zmq_connect(d, endpoint), 0);
    ts_proto_msg m;
    ts_proto_msg_init(&m, TS_MSG_JOIN, "job-s", 0, TS_PROTO_RANK_NONE);
    m.role = TS_ROLE_WORKER;
    assert_int_equal(ts_proto_send(d, NULL, &m, NULL, 0, ZMQ_DONTWAIT), TS_OK);
    *ctx_out = ctx;
    return d;
}

static void client_close(void *ctx, void *d) {
    zmq_close(d);
    zmq_ctx_term(ctx);
}

static void test_curve_with_job_key(void **state) {
    (void)state;
    char p[300];
    path_in(p, sizeof p, "curve.key");
    ts_secure_keys k;
    assert_int_equal(ts_secure_keygen(p, NULL), TS_OK);
    assert_int_equal(ts_secure_load(p, &k), TS_OK);
    server s;
    server_start(&s, &k);
    void *cctx;
    void *d = client_send_join(&cctx, s.endpoint, &k);
    int to = 5000;
    zmq_setsockopt(s.router, ZMQ_RCVTIMEO, &to, sizeof to);
    ts_proto_rx rx;
    ts_proto_rx_init(&rx);
    ts_proto_error e = ts_proto_recv(s.router, NULL, 0, &rx);
    if (e) fail_msg("%s", ts_last_error());
    assert_int_equal(rx.msg.type, TS_MSG_JOIN);
    assert_string_equal(rx.msg.job, "job-s");
    /* and the reply comes back through the encrypted channel */
    assert_int_equal(ts_proto_send_error(s.router, &rx.identity, "job-s", 1,
                                         TS_PROTO_RANK_SCHEDULER, TS_PROTO_E_REFUSED, "full"),
                     TS_OK);
    ts_proto_rx crx;
    ts_proto_rx_init(&crx);
    e = ts_proto_recv(d, NULL, 0, &crx);
    if (e) fail_msg("%s", ts_last_error());
    assert_string_equal(crx.msg.reason, "full");
    assert_true(ts_secure_zap_admitted(s.zap) >= 1);
    assert_int_equal(ts_secure_zap_refused(s.zap), 0);
    ts_proto_rx_release(&rx);
    ts_proto_rx_release(&crx);
    client_close(cctx, d);
    server_stop(&s);
}

/* Waits up to ms for the refusal count to pass `above`. */
static bool refused_above(const ts_secure_zap *z, uint64_t above, int ms) {
    for (int i = 0; i < ms / 10; i++) {
        if (ts_secure_zap_refused(z) > above) return true;
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    return false;
}

static void test_strangers_refused(void **state) {
    (void)state;
    char p[300], q[300];
    path_in(p, sizeof p, "job-a.key");
    path_in(q, sizeof q, "job-b.key");
    ts_secure_keys job, other;
    assert_int_equal(ts_secure_keygen(p, &job), TS_OK);
    assert_int_equal(ts_secure_keygen(q, &other), TS_OK);
    server s;
    server_start(&s, &job);
    int to = 700;
    zmq_setsockopt(s.router, ZMQ_RCVTIMEO, &to, sizeof to);
    ts_proto_rx rx;
    ts_proto_rx_init(&rx);

    /* knows the server's public key but holds another client keypair:
     * the ZAP handler refuses it */
    ts_secure_keys half = other;
    strcpy(half.server_public, job.server_public);
    void *c1;
    void *d1 = client_send_join(&c1, s.endpoint, &half);
    assert_true(refused_above(s.zap, 0, 3000));
    assert_int_equal(ts_proto_recv(s.router, NULL, 0, &rx), TS_PROTO_E_AGAIN);

    /* another job's keys altogether: the handshake cannot complete */
    void *c2;
    void *d2 = client_send_join(&c2, s.endpoint, &other);
    assert_int_equal(ts_proto_recv(s.router, NULL, 0, &rx), TS_PROTO_E_AGAIN);

    /* no CURVE at all */
    void *c3;
    void *d3 = client_send_join(&c3, s.endpoint, NULL);
    assert_int_equal(ts_proto_recv(s.router, NULL, 0, &rx), TS_PROTO_E_AGAIN);
    assert_int_equal(ts_secure_zap_admitted(s.zap), 0);

    /* the job's own client still gets through afterwards */
    void *c4;
    void *d4 = client_send_join(&c4, s.endpoint, &job);
    to = 5000;
    zmq_setsockopt(s.router, ZMQ_RCVTIMEO, &to, sizeof to);
    assert_int_equal(ts_proto_recv(s.router, NULL, 0, &rx), TS_PROTO_OK);
    assert_int_equal(rx.msg.type, TS_MSG_JOIN);
    assert_int_equal(ts_secure_zap_admitted(s.zap), 1);
    ts_proto_rx_release(&rx);
    client_close(c1, d1);
    client_close(c2, d2);
    client_close(c3, d3);
    client_close(c4, d4);
    server_stop(&s);
}

static void test_server_needs_zap(void **state) {
    (void)state;
    char p[300];
    path_in(p, sizeof p, "nozap.key");
    ts_secure_keys k;
    assert_int_equal(ts_secure_keygen(p, &k), TS_OK);
    void *ctx = zmq_ctx_new();
    void *r = zmq_socket(ctx, ZMQ_ROUTER);
    assert_int_equal(ts_secure_server(r, &k), TS_ERR_STATE);
    assert_non_null(strstr(ts_last_error(), "ZAP"));
    /* one handler per context */
    ts_secure_zap *z = ts_secure_zap_start(ctx, &k);
    assert_non_null(z);
    assert_null(ts_secure_zap_start(ctx, &k));
    assert_non_null(strstr(ts_last_error(), "zeromq.zap.01"));
    zmq_close(r);
    ts_secure_zap_stop(z);
    zmq_ctx_term(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keygen_and_load),
        cmocka_unit_test(test_wide_permissions_refused),
        cmocka_unit_test(test_bad_content_refused),
        cmocka_unit_test(test_curve_with_job_key),
        cmocka_unit_test(test_strangers_refused),
        cmocka_unit_test(test_server_needs_zap),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
