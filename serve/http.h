/* http.h - tessera-serve's HTTP/1.1 server (libmicrohttpd).
 *
 * One thread per connection (a request blocks in its model's batcher);
 * at most max_connections at once. Routes: GET /healthz (no token), GET
 * /v1/models, POST /v1/models/NAME:predict, POST /v1/models/NAME:generate
 * (the text streamed with chunked encoding as it is sampled), GET
 * /metrics. Every route but /healthz needs "Authorization: Bearer TOKEN"
 * (compared in constant time); a missing or wrong token is a 401. A body
 * over max_body bytes is refused with 413 as soon as its Content-Length (or
 * the bytes received) says so, without reading the rest; a connection
 * silent for request_timeout_s seconds (a client that sends half a request
 * and stalls) is closed. With tls_cert and tls_key (PEM text) it speaks
 * HTTPS only. Errors are JSON (api.h).
 */
#ifndef TS_SERVE_HTTP_H
#define TS_SERVE_HTTP_H

#include <stddef.h>

#include "serve/metrics.h"
#include "serve/model.h"

typedef struct {
    const char *bind;          /* IPv4 or IPv6 address to listen on */
    int port;                  /* 0: any free port */
    const char *token;         /* the bearer token */
    const char *tls_cert;      /* PEM text, or NULL for plain HTTP */
    const char *tls_key;
    size_t max_body;           /* bytes */
    int request_timeout_s;
    int max_connections;
    int max_tokens;            /* longest :generate */
    ts_serve_model *const *models;
    int n_models;
    ts_serve_metrics *metrics;
} ts_serve_config;

typedef struct ts_server ts_server;

/* Starts serving; NULL with a message (address in use, bad TLS files...). */
ts_server *ts_server_start(const ts_serve_config *c);

/* The port it listens on. */
int ts_server_port(const ts_server *s);

/* Stops accepting connections, lets the requests in flight finish (the
 * models stop waiting for company) for up to request_timeout_s seconds,
 * then closes every connection, waits for their threads and frees it. */
void ts_server_stop(ts_server *s);

#endif
