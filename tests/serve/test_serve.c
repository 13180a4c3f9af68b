/* test_serve.c - the real tessera-serve against real HTTP clients.
 *
 * The server loads an MLP and a GPT from weights files and their jobs; curl
 * and a raw socket client then check: /healthz needs no token, every other
 * endpoint answers 401 without the token or with a wrong one; predictions
 * (several concurrent requests, batched) equal the model's own forward pass
 * and generation streams exactly what ts_generate samples with the same
 * seed; malformed JSON, wrong shapes and types, unknown fields and models
 * get a 4xx naming the field; a 100 MB body gets 413 without being read, a
 * chunked one past the limit 413 once it is in; a
 * client that sends half a request and stalls is cut off after the request
 * timeout while others are served; /metrics counts all of it; and with a
 * certificate the server speaks HTTPS; SIGTERM answers the request in
 * flight before the server exits. After each refusal the next request
 * is answered. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/autograd.h"
#include "kernels/clock.h"
#include "kernels/io/checkpoint.h"
#include "kernels/io/safetensors.h"
#include "kernels/nn/generate.h"
#include "proto/job_model.h"
#include "../test_util.h"

#define TOKEN "test-token-0123456789"
#define TIMEOUT_S 2 /* the server's request timeout */

static char dir[64];
static pid_t server = -1, tls_server = -1;
static int port, tls_port;
static ts_model *mlp, *gpt;
static ts_model_spec gpt_spec;
static char body[1 << 20];

/* Writes the weights of a model built from job file job (with sets) into
 * dir/<tag>.safetensors and returns the model. */
static ts_model *make_weights(const char *job, const char *const *sets, int nsets, const char *tag,
                              ts_model_spec *spec) {
    ts_job j;
    assert_int_equal(ts_job_load(job, sets, nsets, &j), TS_OK);
    assert_int_equal(ts_job_model_spec(&j, spec), TS_OK);
    ts_model *m = ts_model_build(spec, 0, -1, ts_key_from_seed(9), TS_F32);
    assert_non_null(m);
    ts_model_train(m, false);
    const char *names[64];
    ts_tensor *values[64];
    for (int i = 0; i < m->n_params; i++) {
        names[i] = m->params[i].name;
        values[i] = m->params[i].value;
    }
    char path[256];
    snprintf(path, sizeof path, "%s/%s.safetensors", dir, tag);
    assert_int_equal(ts_safetensors_write(path, m->n_params, names, values, 0, NULL, NULL), TS_OK);
    /* the same weights as a checkpoint folder <tag>_ckpt/step-7 with its job */
    json_t *doc = ts_job_to_json(&j);
    char *text = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    ts_checkpoint_data d = {.step = 7, .n_model = m->n_params, .model_names = names, .model = values, .config = text};
    snprintf(path, sizeof path, "%s/%s_ckpt", dir, tag);
    assert_int_equal(ts_checkpoint_save(path, &d, 1, NULL, 0), TS_OK);
    free(text);
    return m;
}

/* Starts tessera-serve with extra flags, its output in dir/<tag>.log;
 * returns its pid and the port it printed. */
static pid_t start_server(const char *tag, const char *extra, int *port_out) {
    char log[256], cmd[2048];
    snprintf(log, sizeof log, "%s/%s.log", dir, tag);
    const char *bin = getenv("TESSERA_BIN_DIR");
    snprintf(cmd, sizeof cmd,
             "exec %s/tessera-serve --model mlp=%s/mlp.safetensors:%s/mlp.json --model gpt=%s/gpt.safetensors:%s/gpt.json "
             "--model ckpt=%s/mlp_ckpt/step-7 "
             "--token-file %s/token --port 0 --max-batch 8 --batch-timeout-ms 20 --request-timeout-s %d "
             "--max-body-bytes 1048576 %s > %s 2>&1",
             bin ? bin : "build/bin", dir, dir, dir, dir, dir, dir, TIMEOUT_S, extra, log);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 600; i++) { /* up to a minute on a loaded machine */
        FILE *f = fopen(log, "r");
        char line[512];
        while (f && fgets(line, sizeof line, f)) {
            const char *at = strstr(line, "listening on ");
            if (at && sscanf(strrchr(at, ':') + 1, "%d", port_out) == 1) {
                fclose(f);
                return pid;
            }
        }
        if (f) fclose(f);
        if (waitpid(pid, NULL, WNOHANG) == pid) break;
        ts_sleep_ms(100);
    }
    snprintf(cmd, sizeof cmd, "cat %s", log);
    (void)!system(cmd);
    fail_msg("tessera-serve did not start");
    return -1;
}

static int setup(void **state) {
    (void)state;
    if (tu_make_tmp_dir(dir, sizeof dir, "tessera_serve")) return -1;
    char path[256];
    snprintf(path, sizeof path, "%s/token", dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "%s\n", TOKEN);
    fclose(f);
    snprintf(path, sizeof path, "%s/mlp.json", dir);
    f = fopen(path, "w");
    fputs("{\"name\": \"mlp\", \"model\": {\"arch\": \"mlp\", \"hidden\": [32]}}", f);
    fclose(f);
    snprintf(path, sizeof path, "%s/gpt.json", dir);
    f = fopen(path, "w");
    fputs("{\"name\": \"gpt\", \"model\": {\"arch\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16, "
          "\"block_size\": 16}, \"data\": {\"kind\": \"text\"}}", f);
    fclose(f);
    ts_model_spec spec;
    snprintf(path, sizeof path, "%s/mlp.json", dir);
    mlp = make_weights(path, NULL, 0, "mlp", &spec);
    snprintf(path, sizeof path, "%s/gpt.json", dir);
    gpt = make_weights(path, NULL, 0, "gpt", &gpt_spec);
    server = start_server("plain", "", &port);
    return 0;
}

static void stop(pid_t pid) {
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
}

static int teardown(void **state) {
    (void)state;
    stop(server);
    stop(tls_server);
    ts_model_free(mlp);
    ts_model_free(gpt);
    return tu_remove_dir(dir);
}

/* Runs curl with args (printf-style; the URL may use %%PORT as the plain
 * server's port written in); the body goes to body[], returns the status. */
static int curl(const char *fmt, ...) {
    char args[4096], cmd[8192], out[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(out, sizeof out, "%s/curl.out", dir);
    unlink(out);
    snprintf(cmd, sizeof cmd, "curl -s -m 60 -o %s -w '%%{http_code}' %s", out, args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    int code = 0;
    if (fscanf(p, "%d", &code) != 1) code = -1;
    pclose(p);
    FILE *f = fopen(out, "r");
    size_t n = f ? fread(body, 1, sizeof body - 1, f) : 0;
    body[n] = '\0';
    if (f) fclose(f);
    printf("  curl %.120s%s -> %d %.200s\n", args, strlen(args) > 120 ? "..." : "", code, body);
    return code;
}

#define AUTH "-H 'Authorization: Bearer " TOKEN "'"

/* The error body's field must be want. */
static void expect_field(const char *want) {
    json_error_t je;
    json_t *doc = json_loads(body, 0, &je);
    assert_non_null(doc);
    const char *field = json_string_value(json_object_get(json_object_get(doc, "error"), "field"));
    if (!field || strcmp(field, want)) fail_msg("field '%s', expected '%s' in %s", field ? field : "(none)", want, body);
    json_decref(doc);
}

static void test_auth(void **state) {
    (void)state;
    assert_int_equal(curl("http://127.0.0.1:%d/healthz", port), 200);
    assert_non_null(strstr(body, "\"ok\""));
    assert_int_equal(curl("http://127.0.0.1:%d/v1/models", port), 401);
    expect_field("Authorization");
    assert_int_equal(curl("-H 'Authorization: Bearer wrong-token' http://127.0.0.1:%d/v1/models", port), 401);
    expect_field("Authorization");
    assert_int_equal(curl("-d '{\"instances\": []}' http://127.0.0.1:%d/v1/models/mlp:predict", port), 401);
    assert_int_equal(curl("http://127.0.0.1:%d/metrics", port), 401);
    assert_int_equal(curl(AUTH " http://127.0.0.1:%d/v1/models", port), 200);
    assert_non_null(strstr(body, "\"name\":\"mlp\""));
    assert_non_null(strstr(body, "\"name\":\"gpt\""));
}

/* A request file of n MLP inputs (sample i: element k = sin(i + k)). */
static void write_instances(const char *path, int n) {
    FILE *f = fopen(path, "w");
    fputs("{\"instances\": [", f);
    for (int i = 0; i < n; i++) {
        fputs(i ? ",[" : "[", f);
        for (int k = 0; k < 784; k++) fprintf(f, "%s%.6f", k ? "," : "", sin(i + k));
        fputs("]", f);
    }
    fputs("]}", f);
    fclose(f);
}

/* Checks a predictions body against the MLP's own forward on the inputs of
 * write_instances(n). */
static void check_predictions(const char *text, int n) {
    json_error_t je;
    json_t *doc = json_loads(text, 0, &je), *preds = json_object_get(doc, "predictions");
    assert_int_equal(json_array_size(preds), n);
    ts_tensor *x = ts_tensor_empty(TS_F32, 2, (int64_t[]){n, 784});
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 784; k++) {
            char s[32];
            snprintf(s, sizeof s, "%.6f", sin(i + k));
            ts_f32(x)[i * 784 + k] = (float)atof(s);
        }
    bool prev = ts_grad_set_enabled(false);
    ts_tensor *y = ts_model_forward(mlp, x);
    ts_grad_set_enabled(prev);
    for (int i = 0; i < n; i++) {
        json_t *p = json_array_get(preds, (size_t)i), *logits = json_object_get(p, "logits");
        int best = 0;
        for (int k = 0; k < 10; k++) {
            double want = ts_f32(y)[i * 10 + k], got = json_number_value(json_array_get(logits, (size_t)k));
            if (fabs(got - want) > 1e-5 * fmax(1, fabs(want))) fail_msg("sample %d logit %d: %g vs %g", i, k, got, want);
            if (ts_f32(y)[i * 10 + k] > ts_f32(y)[i * 10 + best]) best = k;
        }
        assert_int_equal(json_integer_value(json_object_get(p, "class")), best);
    }
    ts_tensor_release(x);
    ts_tensor_release(y);
    json_decref(doc);
}

static void test_predict(void **state) {
    (void)state;
    char req[256];
    snprintf(req, sizeof req, "%s/three.json", dir);
    write_instances(req, 3);
    assert_int_equal(curl(AUTH " -d @%s http://127.0.0.1:%d/v1/models/mlp:predict", req, port), 200);
    check_predictions(body, 3);
    /* the same weights served from a checkpoint folder */
    assert_int_equal(curl(AUTH " -d @%s http://127.0.0.1:%d/v1/models/ckpt:predict", req, port), 200);
    check_predictions(body, 3);
    /* 12 concurrent clients: each gets its own rows back from the batches */
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "for i in $(seq 12); do curl -s -m 60 " AUTH " -d @%s -o %s/par.$i http://127.0.0.1:%d/v1/models/mlp:predict & done; wait",
             req, dir, port);
    assert_int_equal(system(cmd), 0);
    for (int i = 1; i <= 12; i++) {
        char path[256];
        snprintf(path, sizeof path, "%s/par.%d", dir, i);
        FILE *f = fopen(path, "r");
        assert_non_null(f);
        size_t n = fread(body, 1, sizeof body - 1, f);
        body[n] = '\0';
        fclose(f);
        check_predictions(body, 3);
    }
    /* the GPT: next-token logits of the last position */
    assert_int_equal(curl(AUTH " -d '{\"instances\": [[84, 104, 101], [32, 97, 98]]}' http://127.0.0.1:%d/v1/models/gpt:predict", port), 200);
    assert_non_null(strstr(body, "\"next_token\""));
}

static void test_generate(void **state) {
    (void)state;
    assert_int_equal(curl(AUTH " -N -d '{\"prompt\": \"The \", \"max_tokens\": 24, \"seed\": 5, \"temperature\": 0.9}' "
                          "http://127.0.0.1:%d/v1/models/gpt:generate", port), 200);
    char want[64];
    assert_int_equal(ts_generate(gpt, gpt_spec.gpt.block_size, "The ", 24, 0.9, 0, ts_key_from_seed(5), want, sizeof want),
                     TS_OK);
    assert_int_equal(strlen(body), 24);
    assert_string_equal(body, want + 4);
    assert_int_equal(curl(AUTH " -d '{\"prompt\": \"x\"}' http://127.0.0.1:%d/v1/models/mlp:generate", port), 400);
    expect_field("model");
    assert_int_equal(curl(AUTH " -d '{\"prompt\": 7}' http://127.0.0.1:%d/v1/models/gpt:generate", port), 400);
    expect_field("prompt");
    assert_non_null(strstr(body, "got a number"));
    /* an empty prompt, or one past the limit: the message says which */
    assert_int_equal(curl(AUTH " -d '{\"prompt\": \"\"}' http://127.0.0.1:%d/v1/models/gpt:generate", port), 400);
    expect_field("prompt");
    assert_non_null(strstr(body, "got an empty one"));
    char req[256];
    snprintf(req, sizeof req, "%s/long_prompt.json", dir);
    FILE *f = fopen(req, "w");
    fputs("{\"prompt\": \"", f);
    for (int i = 0; i < 65537; i++) fputc('a', f);
    fputs("\"}", f);
    fclose(f);
    assert_int_equal(curl(AUTH " -d @%s http://127.0.0.1:%d/v1/models/gpt:generate", req, port), 400);
    expect_field("prompt");
    assert_non_null(strstr(body, "got one of 65537 bytes"));
    assert_int_equal(curl(AUTH " -d '{\"prompt\": \"a\", \"max_tokens\": 100000}' http://127.0.0.1:%d/v1/models/gpt:generate", port), 400);
    expect_field("max_tokens");
}

static void test_bad_requests(void **state) {
    (void)state;
    const char *url = "http://127.0.0.1:%d/v1/models/mlp:predict";
    char args[512];
    snprintf(args, sizeof args, AUTH " -d '{\"instances\": [[1, 2' %s", url);
    assert_int_equal(curl(args, port), 400);
    expect_field("body");
    snprintf(args, sizeof args, AUTH " -d '[1, 2]' %s", url);
    assert_int_equal(curl(args, port), 400);
    expect_field("body");
    snprintf(args, sizeof args, AUTH " -d '{\"inputs\": []}' %s", url);
    assert_int_equal(curl(args, port), 400);
    expect_field("inputs");
    snprintf(args, sizeof args, AUTH " -d '{}' %s", url);
    assert_int_equal(curl(args, port), 400);
    expect_field("instances");
    snprintf(args, sizeof args, AUTH " -d '{\"instances\": [[1, 2, 3]]}' %s", url);
    assert_int_equal(curl(args, port), 400);
    expect_field("instances[0]");
    assert_non_null(strstr(body, "784"));
    /* a string where a number goes, or a number past float32's range (the
     * model would see inf): the field is the element's path */
    char req[256];
    const char *odd[] = {"\"x\"", "1e39"};
    for (int i = 0; i < 2; i++) {
        snprintf(req, sizeof req, "%s/typed.json", dir);
        FILE *f = fopen(req, "w");
        fputs("{\"instances\": [[", f);
        for (int k = 0; k < 784; k++) fprintf(f, "%s%s", k ? "," : "", k == 5 ? odd[i] : "0");
        fputs("]]}", f);
        fclose(f);
        assert_int_equal(curl(AUTH " -d @%s http://127.0.0.1:%d/v1/models/mlp:predict", req, port), 400);
        expect_field("instances[0][5]");
    }
    assert_int_equal(curl(AUTH " -d '{\"instances\": [[1, 2], [3]]}' http://127.0.0.1:%d/v1/models/gpt:predict", port), 400);
    expect_field("instances[1]");
    /* a token id outside the vocabulary, or not an integer: the field is the
     * token's own path, as for the MLP's numbers */
    assert_int_equal(curl(AUTH " -d '{\"instances\": [[300]]}' http://127.0.0.1:%d/v1/models/gpt:predict", port), 400);
    expect_field("instances[0][0]");
    assert_non_null(strstr(body, "got 300"));
    assert_int_equal(curl(AUTH " -d '{\"instances\": [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, -1]]}' "
                          "http://127.0.0.1:%d/v1/models/gpt:predict", port), 400);
    expect_field("instances[1][5]");
    assert_int_equal(curl(AUTH " -d '{\"instances\": [[1, \"a\"]]}' http://127.0.0.1:%d/v1/models/gpt:predict", port),
                     400);
    expect_field("instances[0][1]");
    assert_int_equal(curl(AUTH " -d '{}' http://127.0.0.1:%d/v1/models/nope:predict", port), 404);
    expect_field("model");
    assert_int_equal(curl(AUTH " http://127.0.0.1:%d/v1/models/mlp:predict", port), 405);
    assert_int_equal(curl(AUTH " http://127.0.0.1:%d/nowhere", port), 404);
    /* 100 MB: refused from its Content-Length, the body never read */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "head -c 100000000 /dev/zero > %s/big", dir);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(curl(AUTH " -H 'Content-Type: application/json' --data-binary @%s/big http://127.0.0.1:%d/v1/models/mlp:predict", dir, port), 413);
    expect_field("body");
    /* 2 MB chunked, with no Content-Length: 413 once the body is in, not
     * a dropped connection */
    snprintf(cmd, sizeof cmd, "head -c 2000000 /dev/zero > %s/big", dir);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(curl(AUTH " -H 'Transfer-Encoding: chunked' --data-binary @%s/big http://127.0.0.1:%d/v1/models/mlp:predict", dir, port), 413);
    expect_field("body");
    snprintf(cmd, sizeof cmd, "rm -f %s/big", dir);
    assert_int_equal(system(cmd), 0);
    /* and it still answers */
    snprintf(req, sizeof req, "%s/one.json", dir);
    write_instances(req, 1);
    assert_int_equal(curl(AUTH " -d @%s http://127.0.0.1:%d/v1/models/mlp:predict", req, port), 200);
    check_predictions(body, 1);
}

/* A TCP connection to the plain server. */
/* A connection to the server on port to. */
static int connect_to(int to) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)to)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    struct timeval tv = {60, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static int connect_server(void) { return connect_to(port); }

static void test_stalled_client(void **state) {
    (void)state;
    /* half a request: headers promising 1000 bytes, then 10 of them */
    int fd = connect_server();
    const char *half = "POST /v1/models/mlp:predict HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " TOKEN
                       "\r\nContent-Length: 1000\r\n\r\n{\"instance";
    assert_int_equal(send(fd, half, strlen(half), 0), (ssize_t)strlen(half));
    /* a second one that stops in the middle of its headers */
    int fd2 = connect_server();
    const char *headers = "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthor";
    assert_int_equal(send(fd2, headers, strlen(headers), 0), (ssize_t)strlen(headers));
    /* others are served meanwhile */
    assert_int_equal(curl("http://127.0.0.1:%d/healthz", port), 200);
    assert_int_equal(curl(AUTH " http://127.0.0.1:%d/v1/models", port), 200);
    /* the stalled connections are closed after the request timeout */
    double t0 = ts_clock_ms();
    char buf[256];
    ssize_t n = recv(fd, buf, sizeof buf, 0), n2 = recv(fd2, buf, sizeof buf, 0);
    double waited = (ts_clock_ms() - t0) / 1000;
    printf("  stalled clients: recv %zd and %zd after %.1f s (request timeout %d s)\n", n, n2, waited, TIMEOUT_S);
    assert_true(n <= 0 && n2 <= 0); /* closed (or reset), not answered after a minute */
    assert_true(waited < 59);
    close(fd);
    close(fd2);
    assert_int_equal(curl("http://127.0.0.1:%d/healthz", port), 200);
}

/* SIGTERM with a prediction in flight, which the batcher holds waiting
 * 10 s for company (the drain waits 2): the server stops accepting, runs
 * it at once, answers it and exits 0. Before, its connection was closed
 * unanswered. */
static void test_sigterm_in_flight(void **state) {
    (void)state;
    int p;
    pid_t pid = start_server("drain", "--batch-timeout-ms 10000", &p);
    char json[8192] = "{\"instances\": [[0", req[9000];
    for (int i = 1; i < 784; i++) strcat(json, ",0.5");
    strcat(json, "]]}");
    snprintf(req, sizeof req, "POST /v1/models/mlp:predict HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " TOKEN
             "\r\nContent-Length: %zu\r\n\r\n%s", strlen(json), json);
    int fd = connect_to(p);
    assert_int_equal(send(fd, req, strlen(req), 0), (ssize_t)strlen(req));
    /* in flight: the prediction and the /metrics request that sees it */
    for (int i = 0; i < 600 && !strstr(body, "tessera_requests_in_flight 2\n"); i++) {
        if (i) ts_sleep_ms(100);
        assert_int_equal(curl(AUTH " http://127.0.0.1:%d/metrics", p), 200);
    }
    if (!strstr(body, "tessera_requests_in_flight 2\n")) fail_msg("the prediction is not in flight:\n%s", body);
    kill(pid, SIGTERM);
    char reply[65536];
    size_t n = 0;
    ssize_t got;
    while (n < sizeof reply - 1 && (got = recv(fd, reply + n, sizeof reply - 1 - n, 0)) > 0) n += (size_t)got;
    reply[n] = '\0';
    close(fd);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    printf("  in flight at SIGTERM: %.60s ... (server exit %d)\n", reply, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    if (strncmp(reply, "HTTP/1.1 200", 12) || !strstr(reply, "\"predictions\""))
        fail_msg("the request in flight was not answered: '%s'", reply);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void test_metrics(void **state) {
    (void)state;
    assert_int_equal(curl(AUTH " http://127.0.0.1:%d/metrics", port), 200);
    const char *want[] = {"tessera_requests_total{endpoint=\"predict\",code=\"200\"}",
                          "tessera_requests_total{endpoint=\"predict\",code=\"413\"}",
                          "tessera_requests_total{endpoint=\"models\",code=\"401\"}",
                          "tessera_requests_total{endpoint=\"generate\",code=\"200\"}",
                          "tessera_request_errors_total ", "tessera_request_duration_seconds_bucket{le=\"+Inf\"}",
                          "tessera_batch_size_count ", NULL};
    for (int i = 0; want[i]; i++)
        if (!strstr(body, want[i])) fail_msg("/metrics lacks %s:\n%s", want[i], body);
    /* the batches held every predicted sample: 3 + 3 + 12 x 3 + 1 MLP, 2 GPT */
    const char *sum = strstr(body, "tessera_batch_size_sum ");
    assert_non_null(sum);
    assert_int_equal((int)atof(sum + strlen("tessera_batch_size_sum ")), 3 + 3 + 36 + 1 + 2);
}

static void test_tls(void **state) {
    (void)state;
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "openssl req -x509 -newkey rsa:2048 -nodes -keyout %s/key.pem -out %s/cert.pem -days 1 "
             "-subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 2>/dev/null",
             dir, dir);
    assert_int_equal(system(cmd), 0);
    char extra[512];
    snprintf(extra, sizeof extra, "--tls-cert %s/cert.pem --tls-key %s/key.pem", dir, dir);
    tls_server = start_server("tls", extra, &tls_port);
    assert_int_equal(curl("--cacert %s/cert.pem https://127.0.0.1:%d/healthz", dir, tls_port), 200);
    assert_int_equal(curl("--cacert %s/cert.pem " AUTH " https://127.0.0.1:%d/v1/models", dir, tls_port), 200);
    assert_int_equal(curl("--cacert %s/cert.pem https://127.0.0.1:%d/v1/models", dir, tls_port), 401);
    assert_int_not_equal(curl("http://127.0.0.1:%d/healthz", tls_port), 200); /* no plain HTTP */
}

/* Runs tessera-serve with args; it must exit non-zero saying want. */
static void expect_refused_start(const char *args, const char *want) {
    char cmd[2048], out[4096];
    const char *bin = getenv("TESSERA_BIN_DIR");
    snprintf(cmd, sizeof cmd, "timeout 120 %s/tessera-serve %s 2>&1", bin ? bin : "build/bin", args);
    FILE *p = popen(cmd, "r");
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    int rc = pclose(p);
    printf("  tessera-serve %s -> exit %d: %s", args, WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, out);
    assert_true(WIFEXITED(rc) && WEXITSTATUS(rc) != 0);
    if (!strstr(out, want)) fail_msg("'%s' not in: %s", want, out);
}

static void test_command_line(void **state) {
    (void)state;
    char args[1024];
    snprintf(args, sizeof args, "--model mlp=%s/mlp.safetensors:%s/mlp.json --token %s", dir, dir, TOKEN);
    expect_refused_start(args, "never on the command line");
    snprintf(args, sizeof args, "--model mlp=%s/mlp.safetensors:%s/mlp.json", dir, dir);
    expect_refused_start(args, "--token-file");
    snprintf(args, sizeof args, "--model mlp=%s/missing.safetensors:%s/mlp.json --token-file %s/token", dir, dir, dir);
    expect_refused_start(args, "missing.safetensors");
    snprintf(args, sizeof args, "--model mlp=%s/mlp.safetensors --token-file %s/token", dir, dir);
    expect_refused_start(args, "give the job");
    snprintf(args, sizeof args, "--model gpt=%s/gpt.safetensors:%s/mlp.json --token-file %s/token", dir, dir, dir);
    expect_refused_start(args, "tensor 'wte.weight' is not a parameter of the model");
    snprintf(args, sizeof args, "--model mlp=%s/mlp.safetensors:%s/mlp.json --token-file %s/token --bind localhost", dir,
             dir, dir);
    expect_refused_start(args, "not an IPv4 or IPv6 address");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auth),       cmocka_unit_test(test_predict), cmocka_unit_test(test_generate),
        cmocka_unit_test(test_bad_requests), cmocka_unit_test(test_stalled_client), cmocka_unit_test(test_metrics),
        cmocka_unit_test(test_tls),         cmocka_unit_test(test_command_line),
        cmocka_unit_test(test_sigterm_in_flight),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
