/* wire_zmq.c - sending and receiving whole messages on DEALER/ROUTER sockets.
 *
 * Send: [identity] header payload... ; the header buffer and payloads with a
 * free function go to ZeroMQ zero-copy. Recv: every frame of a multipart
 * message is taken off the socket (so the next recv starts at a message
 * boundary) and the frames are handed to ts_proto_decode as views.
 */
#include "proto/wire.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* zmq free callback for malloc'd header buffers. */
static void free_buffer(void *data, void *hint) {
    (void)hint;
    free(data);
}

/* Hands payloads [from, n) back to their owners (those with a free_fn). */
static void release_payloads(const ts_proto_payload *p, size_t from, size_t n) {
    for (size_t i = from; i < n; i++)
        if (p[i].free_fn) p[i].free_fn((void *)p[i].data, p[i].hint);
}

/* Maps a failed zmq send to a status naming what was being sent. */
static ts_status send_failed(const char *what, const ts_proto_msg *m) {
    int err = zmq_errno();
    ts_status s = err == EAGAIN ? TS_ERR_TIMEOUT : err == EHOSTUNREACH ? TS_ERR_PEER : TS_ERR_IO;
    return ts_error(s, "proto send %s: %s frame: %s", ts_proto_type_name(m->type), what,
                    zmq_strerror(err));
}

/* Builds the zmq message for payload p (zero-copy when it has a free_fn). */
static int payload_msg(zmq_msg_t *z, const ts_proto_payload *p) {
    if (!p->free_fn) {
        if (zmq_msg_init_size(z, p->size)) return -1;
        if (p->size) memcpy(zmq_msg_data(z), p->data, p->size);
        return 0;
    }
    if (p->size == 0) {
        p->free_fn((void *)p->data, p->hint);
        return zmq_msg_init(z);
    }
    return zmq_msg_init_data(z, (void *)p->data, p->size, p->free_fn, p->hint);
}

ts_status ts_proto_send(void *sock, const ts_proto_identity *to, const ts_proto_msg *m,
                        const ts_proto_payload *payloads, size_t npayloads, int flags) {
    ts_proto_msg h = *m;
    uint64_t *lens = NULL;
    void *buf = NULL;
    size_t size = 0;
    ts_status s = TS_OK;
    if (npayloads) {
        lens = malloc(npayloads * sizeof *lens);
        if (!lens) {
            release_payloads(payloads, 0, npayloads);
            return ts_error(TS_ERR_MEMORY, "proto send: cannot allocate %zu lengths", npayloads);
        }
        for (size_t i = 0; i < npayloads; i++) lens[i] = payloads[i].size;
    }
    h.lengths = lens;
    h.nlengths = npayloads;
    s = ts_proto_encode(&h, &buf, &size);
    free(lens);
    if (s) {
        release_payloads(payloads, 0, npayloads);
        return s;
    }
    /* Only the first frame may wait or refuse (flags); ZeroMQ then accepts
     * the rest of the message as a whole. */
    int more = npayloads ? ZMQ_SNDMORE : 0;
    if (to && zmq_send(sock, to->data, to->size, ZMQ_SNDMORE | flags) < 0) {
        free(buf);
        release_payloads(payloads, 0, npayloads);
        return send_failed("identity", m);
    }
    zmq_msg_t z;
    if (zmq_msg_init_data(&z, buf, size, free_buffer, NULL)) {
        free(buf);
        release_payloads(payloads, 0, npayloads);
        return send_failed("header", m);
    }
    if (zmq_msg_send(&z, sock, more | (to ? 0 : flags)) < 0) {
        s = send_failed("header", m);
        zmq_msg_close(&z);
        release_payloads(payloads, 0, npayloads);
        return s;
    }
    for (size_t i = 0; i < npayloads; i++) {
        if (payload_msg(&z, &payloads[i])) {
            s = send_failed("payload", m);
            release_payloads(payloads, i + 1, npayloads);
            return s;
        }
        if (zmq_msg_send(&z, sock, i + 1 < npayloads ? ZMQ_SNDMORE : 0) < 0) {
            s = send_failed("payload", m);
            zmq_msg_close(&z);
            release_payloads(payloads, i + 1, npayloads);
            return s;
        }
    }
    return TS_OK;
}

ts_status ts_proto_send_error(void *sock, const ts_proto_identity *to, const char *job,
                              uint64_t generation, int32_t rank, uint32_t code,
                              const char *reason) {
    ts_proto_msg m;
    ts_proto_msg_error(&m, job, generation, rank, code, reason);
    return ts_proto_send(sock, to, &m, NULL, 0, 0);
}

ts_status ts_proto_limit_socket(void *sock, const ts_proto_limits *lim) {
    uint64_t frame = lim->max_header_bytes;
    if (lim->max_frames > 0 && lim->max_payload_bytes > frame) frame = lim->max_payload_bytes;
    int64_t max = frame > (uint64_t)INT64_MAX - TS_PROTO_FRAME_OVERHEAD
                      ? INT64_MAX
                      : (int64_t)(frame + TS_PROTO_FRAME_OVERHEAD);
    int handshake = TS_PROTO_HANDSHAKE_MS;
    if (zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &max, sizeof max) != 0)
        return ts_error(TS_ERR_IO, "proto: ZMQ_MAXMSGSIZE %lld: %s", (long long)max,
                        zmq_strerror(zmq_errno()));
    if (zmq_setsockopt(sock, ZMQ_HANDSHAKE_IVL, &handshake, sizeof handshake) != 0)
        return ts_error(TS_ERR_IO, "proto: ZMQ_HANDSHAKE_IVL %d: %s", handshake,
                        zmq_strerror(zmq_errno()));
    return TS_OK;
}

void ts_proto_rx_init(ts_proto_rx *rx) { memset(rx, 0, sizeof *rx); }

void ts_proto_rx_release(ts_proto_rx *rx) {
    ts_proto_msg_free(&rx->msg);
    for (size_t i = 0; i < rx->nparts; i++) zmq_msg_close(&rx->parts[i]);
    free(rx->parts);
    free(rx->views);
    memset(rx, 0, sizeof *rx);
}

/* Makes room for one more part; moves the held parts with zmq_msg_move. */
static bool rx_grow(ts_proto_rx *rx) {
    if (rx->nparts < rx->cap) return true;
    size_t cap = rx->cap ? 2 * rx->cap : 8;
    zmq_msg_t *parts = malloc(cap * sizeof *parts);
    ts_proto_frame *views = malloc(cap * sizeof *views);
    if (!parts || !views) {
        free(parts);
        free(views);
        return false;
    }
    for (size_t i = 0; i < rx->nparts; i++) {
        zmq_msg_init(&parts[i]);
        zmq_msg_move(&parts[i], &rx->parts[i]);
        zmq_msg_close(&rx->parts[i]);
    }
    free(rx->parts);
    free(rx->views);
    rx->parts = parts;
    rx->views = views;
    rx->cap = cap;
    return true;
}

ts_proto_error ts_proto_recv(void *sock, const ts_proto_limits *lim, int flags,
                             ts_proto_rx *rx) {
    ts_proto_limits dl;
    if (!lim) {
        ts_proto_limits_default(&dl);
        lim = &dl;
    }
    ts_proto_rx_release(rx);
    int type = 0;
    size_t tsz = sizeof type;
    if (zmq_getsockopt(sock, ZMQ_TYPE, &type, &tsz)) {
        ts_error(TS_ERR_IO, "proto recv: not a socket: %s", zmq_strerror(zmq_errno()));
        return TS_PROTO_E_IO;
    }
    size_t skip = type == ZMQ_ROUTER ? 1 : 0;
    size_t keep = lim->max_frames > SIZE_MAX - 2 ? SIZE_MAX : lim->max_frames + 1 + skip;
    bool oom = false;
    int more = 1;
    while (more) {
        zmq_msg_t part;
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, sock, rx->nparts + rx->dropped_frames == 0 ? flags : 0) < 0) {
            int err = zmq_errno();
            zmq_msg_close(&part);
            if (rx->nparts + rx->dropped_frames == 0 && err == EAGAIN) {
                ts_error(TS_ERR_TIMEOUT, "proto recv: no message");
                return TS_PROTO_E_AGAIN;
            }
            ts_error(TS_ERR_IO, "proto recv: %s", zmq_strerror(err));
            ts_proto_rx_release(rx);
            return TS_PROTO_E_IO;
        }
        more = zmq_msg_more(&part);
        if (rx->nparts < keep && !oom && rx_grow(rx)) {
            zmq_msg_init(&rx->parts[rx->nparts]);
            zmq_msg_move(&rx->parts[rx->nparts], &part);
            rx->nparts++;
        } else {
            oom = oom || rx->nparts < keep;
            rx->dropped_frames++;
        }
        zmq_msg_close(&part);
    }
    if (skip && rx->nparts) {
        size_t n = zmq_msg_size(&rx->parts[0]);
        if (n > sizeof rx->identity.data) n = sizeof rx->identity.data;
        memcpy(rx->identity.data, zmq_msg_data(&rx->parts[0]), n);
        rx->identity.size = n;
    }
    if (oom) {
        ts_error(TS_ERR_MEMORY, "proto recv: cannot hold %zu frames", rx->nparts + rx->dropped_frames);
        return TS_PROTO_E_MEMORY;
    }
    if (rx->dropped_frames) {
        ts_error(TS_ERR_FORMAT, "proto decode: message has %zu payload frames, limit %zu [%s]",
                 rx->nparts + rx->dropped_frames - 1 - skip, lim->max_frames,
                 ts_proto_error_name(TS_PROTO_E_FRAMES));
        return TS_PROTO_E_FRAMES;
    }
    for (size_t i = skip; i < rx->nparts; i++) {
        rx->views[i - skip].data = zmq_msg_data(&rx->parts[i]);
        rx->views[i - skip].size = zmq_msg_size(&rx->parts[i]);
    }
    return ts_proto_decode(rx->views, rx->nparts - skip, lim, &rx->msg);
}

void ts_proto_public_endpoint(const char *bound, char *out, size_t cap) {
    const char *host = strstr(bound, "://");
    host = host ? host + 3 : bound;
    const char *port = strrchr(host, ':');
    if (port && (strncmp(host, "0.0.0.0:", 8) == 0 || strncmp(host, "*:", 2) == 0)) {
        char name[256];
        if (gethostname(name, sizeof name) == 0) {
            name[sizeof name - 1] = '\0';
            snprintf(out, cap, "tcp://%s%s", name, port);
            return;
        }
    }
    snprintf(out, cap, "%s", bound);
}
