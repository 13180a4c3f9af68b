/* http.c - routing, authentication and limits over libmicrohttpd. */
#include "serve/http.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/clock.h"
#include "serve/api.h"

struct ts_server {
    ts_serve_config c;
    struct MHD_Daemon *d;
    int port;
};

typedef enum { EP_HEALTHZ, EP_MODELS, EP_PREDICT, EP_GENERATE, EP_METRICS, EP_OTHER } endpoint;
static const char *const endpoint_names[] = {"healthz", "models", "predict", "generate", "metrics", "other"};

/* One request's state across the handler's calls (MHD's con_cls). */
typedef struct {
    double start_ms;
    endpoint ep;
    ts_serve_model *model;
    char *body;
    size_t len, cap;
    bool answered;  /* a response is queued */
    unsigned code;  /* its status */
    ts_serve_reply refused; /* the error to answer once the body is in (none: body NULL) */
} request;

/* A generation being streamed. */
typedef struct {
    ts_serve_model *model;
    ts_generator *g;
} stream;

/* Queues resp (taken) with status code and its Content-Type. */
static enum MHD_Result respond(struct MHD_Connection *c, request *r, struct MHD_Response *resp, unsigned code,
                               const char *type) {
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (code == 401) MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (code == 405)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, r->ep == EP_PREDICT || r->ep == EP_GENERATE ? "POST" : "GET");
    enum MHD_Result ok = MHD_queue_response(c, code, resp);
    MHD_destroy_response(resp);
    r->answered = true;
    r->code = code;
    return ok;
}

/* Queues a JSON reply (its body taken). */
static enum MHD_Result queue(struct MHD_Connection *c, request *r, ts_serve_reply rep) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(rep.len, rep.body, MHD_RESPMEM_MUST_FREE);
    if (!resp) free(rep.body);
    return respond(c, r, resp, rep.code, "application/json");
}

/* Equal strings, in time that depends only on their lengths. */
static bool same_secret(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    unsigned char diff = la != lb;
    for (size_t i = 0; i < la; i++) diff |= (unsigned char)a[i] ^ (unsigned char)b[i % (lb ? lb : 1)];
    return diff == 0;
}

/* Sets r's endpoint and model from the URL; an error reply when there is
 * none. */
static bool route(ts_server *s, request *r, const char *url, const char *method, ts_serve_reply *err) {
    static const char prefix[] = "/v1/models/";
    bool post = false;
    if (!strcmp(url, "/healthz")) r->ep = EP_HEALTHZ;
    else if (!strcmp(url, "/v1/models")) r->ep = EP_MODELS;
    else if (!strcmp(url, "/metrics")) r->ep = EP_METRICS;
    else if (!strncmp(url, prefix, sizeof prefix - 1) && strrchr(url, ':')) {
        const char *name = url + sizeof prefix - 1, *action = strrchr(url, ':') + 1;
        size_t len = (size_t)(action - 1 - name);
        r->ep = !strcmp(action, "predict") ? EP_PREDICT : !strcmp(action, "generate") ? EP_GENERATE : EP_OTHER;
        for (int i = 0; i < s->c.n_models && !r->model; i++)
            if (strlen(s->c.models[i]->name) == len && !strncmp(s->c.models[i]->name, name, len))
                r->model = s->c.models[i];
        if (r->ep == EP_OTHER) {
            *err = ts_serve_error(404, "path", "unknown action ':%s' (:predict or :generate)", action);
            return false;
        }
        if (!r->model) {
            char names[512] = "";
            for (int i = 0; i < s->c.n_models; i++)
                snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", s->c.models[i]->name);
            *err = ts_serve_error(404, "model", "no model named '%.*s' (loaded: %s)", (int)len, name, names);
            return false;
        }
        post = true;
    } else {
        r->ep = EP_OTHER;
        *err = ts_serve_error(404, "path", "no such endpoint %s", url);
        return false;
    }
    if (strcmp(method, post ? "POST" : "GET")) {
        *err = ts_serve_error(405, "method", "%s takes %s, not %s", url, post ? "POST" : "GET", method);
        return false;
    }
    return true;
}

/* The first call of a request: route, token and declared size. */
static enum MHD_Result begin(ts_server *s, struct MHD_Connection *c, request *r, const char *url, const char *method) {
    ts_serve_reply err;
    if (!route(s, r, url, method, &err)) return queue(c, r, err);
    if (r->ep != EP_HEALTHZ) {
        const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
        if (!auth) return queue(c, r, ts_serve_error(401, "Authorization", "missing: send \"Authorization: Bearer TOKEN\""));
        if (strncmp(auth, "Bearer ", 7) || !same_secret(auth + 7, s->c.token))
            return queue(c, r, ts_serve_error(401, "Authorization", "wrong bearer token"));
    }
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl && strtoull(cl, NULL, 10) > s->c.max_body)
        return queue(c, r, ts_serve_error(413, "body", "Content-Length %s exceeds the limit of %zu bytes", cl, s->c.max_body));
    return MHD_YES;
}

/* Appends a piece of the body; once it passes the limit (or memory runs
 * out) the body is dropped and the rest read without keeping it: the
 * refusal is answered when the body is all in, as no response can be queued
 * while a body is being received. */
static void take_body(ts_server *s, request *r, const char *data, size_t n) {
    if (r->refused.body) return;
    if (r->len + n > s->c.max_body)
        r->refused = ts_serve_error(413, "body", "the body exceeds the limit of %zu bytes", s->c.max_body);
    else if (r->len + n + 1 > r->cap) {
        size_t cap = (r->len + n + 1) * 2 < s->c.max_body + 1 ? (r->len + n + 1) * 2 : s->c.max_body + 1;
        char *b = realloc(r->body, cap);
        if (b) {
            r->body = b;
            r->cap = cap;
        } else {
            r->refused = ts_serve_error(500, "body", "out of memory");
        }
    }
    if (r->refused.body) {
        free(r->body);
        r->body = NULL;
        r->len = r->cap = 0;
        return;
    }
    memcpy(r->body + r->len, data, n);
    r->len += n;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    (void)max;
    stream *st = cls;
    bool done;
    if (ts_serve_model_next_byte(st->model, st->g, buf, &done)) {
        fprintf(stderr, "tessera-serve: %s: generation failed: %s\n", st->model->name, ts_last_error());
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    return done ? MHD_CONTENT_READER_END_OF_STREAM : 1;
}

static void stream_free(void *cls) {
    stream *st = cls;
    ts_generator_free(st->g);
    free(st);
}

/* A :generate request: its text, streamed. */
static enum MHD_Result generate(ts_server *s, struct MHD_Connection *c, request *r) {
    ts_serve_reply err = {0};
    stream *st = calloc(1, sizeof *st);
    if (!st) return queue(c, r, ts_serve_error(500, "body", "out of memory"));
    st->model = r->model;
    st->g = ts_serve_generate_begin(r->model, r->body ? r->body : "", r->len, s->c.max_tokens, &err);
    if (!st->g) {
        free(st);
        return queue(c, r, err);
    }
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64, stream_read, st, stream_free);
    if (!resp) stream_free(st);
    return respond(c, r, resp, 200, "text/plain; charset=utf-8");
}

/* The whole request is in: answer it. */
static enum MHD_Result answer(ts_server *s, struct MHD_Connection *c, request *r) {
    switch (r->ep) {
    case EP_HEALTHZ: return queue(c, r, ts_serve_json(200, json_pack("{s:s}", "status", "ok")));
    case EP_MODELS: return queue(c, r, ts_serve_list(s->c.models, s->c.n_models));
    case EP_PREDICT: return queue(c, r, ts_serve_predict(r->model, r->body ? r->body : "", r->len));
    case EP_GENERATE: return generate(s, c, r);
    case EP_METRICS: {
        size_t len = 0;
        char *text = ts_serve_metrics_render(s->c.metrics, &len);
        if (!text) return queue(c, r, ts_serve_error(500, "metrics", "out of memory"));
        struct MHD_Response *resp = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
        if (!resp) free(text);
        return respond(c, r, resp, 200, "text/plain; version=0.0.4");
    }
    default: return queue(c, r, ts_serve_error(404, "path", "no such endpoint"));
    }
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    ts_server *s = cls;
    request *r = *con_cls;
    if (!r) {
        if (!(r = calloc(1, sizeof *r))) return MHD_NO;
        r->start_ms = ts_clock_ms();
        *con_cls = r;
        ts_serve_metrics_begin(s->c.metrics);
        return begin(s, c, r, url, method);
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (!r->answered) take_body(s, r, upload, n);
        return MHD_YES;
    }
    if (r->answered) return MHD_YES;
    if (r->refused.body) {
        ts_serve_reply refusal = r->refused;
        r->refused.body = NULL;
        return queue(c, r, refusal);
    }
    return answer(s, c, r);
}

/* The request is over (answered, timed out or dropped): count it, free it. */
static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode why) {
    (void)c;
    ts_server *s = cls;
    request *r = *con_cls;
    if (!r) return;
    unsigned code = r->answered ? r->code : why == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED ? 408 : 499;
    ts_serve_metrics_request(s->c.metrics, endpoint_names[r->ep], code, (ts_clock_ms() - r->start_ms) / 1000);
    free(r->body);
    free(r->refused.body);
    free(r);
    *con_cls = NULL;
}

ts_server *ts_server_start(const ts_serve_config *c) {
    ts_server *s = calloc(1, sizeof *s);
    if (!s) {
        ts_error(TS_ERR_MEMORY, "serve: out of memory");
        return NULL;
    }
    s->c = *c;
    struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = htons((uint16_t)c->port)};
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)c->port)};
    bool v6 = false;
    if (inet_pton(AF_INET, c->bind, &a4.sin_addr) != 1) {
        v6 = inet_pton(AF_INET6, c->bind, &a6.sin6_addr) == 1;
        if (!v6) {
            free(s);
            ts_error(TS_ERR_VALUE, "serve: --bind %s is not an IPv4 or IPv6 address", c->bind);
            return NULL;
        }
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG | MHD_USE_ITC |
                     (v6 ? MHD_USE_IPv6 : 0) | (c->tls_cert ? MHD_USE_TLS : 0);
    struct MHD_OptionItem opts[] = {
        {MHD_OPTION_SOCK_ADDR, 0, v6 ? (void *)&a6 : (void *)&a4},
        {MHD_OPTION_CONNECTION_TIMEOUT, c->request_timeout_s, NULL},
        {MHD_OPTION_CONNECTION_LIMIT, c->max_connections, NULL},
        {MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)completed, s},
        {c->tls_cert ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END, 0, (void *)c->tls_cert},
        {MHD_OPTION_HTTPS_MEM_KEY, 0, (void *)c->tls_key},
        {MHD_OPTION_END, 0, NULL},
    };
    s->d = MHD_start_daemon(flags, (uint16_t)c->port, NULL, NULL, handle, s, MHD_OPTION_ARRAY, opts, MHD_OPTION_END);
    if (!s->d) {
        free(s);
        ts_error(TS_ERR_IO, "serve: cannot listen on %s port %d%s", c->bind, c->port,
                 c->tls_cert ? " with TLS (is the certificate and key a matching PEM pair?)" : " (in use?)");
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? info->port : c->port;
    return s;
}

int ts_server_port(const ts_server *s) { return s->port; }

void ts_server_stop(ts_server *s) {
    if (!s) return;
    MHD_socket listener = MHD_quiesce_daemon(s->d);
    for (int i = 0; i < s->c.n_models; i++) ts_serve_model_drain(s->c.models[i]);
    double deadline = ts_clock_ms() + 1000.0 * s->c.request_timeout_s;
    int64_t left;
    while ((left = ts_serve_metrics_in_flight(s->c.metrics)) > 0 && ts_clock_ms() < deadline) ts_sleep_ms(10);
    if (left > 0)
        fprintf(stderr, "tessera-serve: %lld requests still in flight after %d s: closing their connections\n",
                (long long)left, s->c.request_timeout_s);
    MHD_stop_daemon(s->d);
    if (listener != MHD_INVALID_SOCKET) close(listener);
    free(s);
}
