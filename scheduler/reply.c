/* reply.c - what the scheduler sends: stamped messages, ERROR replies,
 * rejections and the SHUTDOWN that ends the job. Uses nothing of the other
 * scheduler files, so members.c, barrier.c and blob.c answer peers without
 * depending on the loop in server.c. */
#include "scheduler/internal.h"

#include <stdarg.h>
#include <stdio.h>

#include "scheduler/log.h"

const char *sched_id_text(const ts_proto_identity *id, char *buf, size_t cap)
{
    size_t n = id->size < 8 ? id->size : 8;
    size_t o = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && o + 3 < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%02x", id->data[i]);
    if (id->size > n && o + 3 < cap)
        snprintf(buf + o, cap - o, "..");
    return buf;
}

void sched_msg_init(ts_sched *s, ts_proto_msg *m, ts_proto_type type)
{
    ts_proto_msg_init(m, type, s->cfg.job, s->generation, TS_PROTO_RANK_SCHEDULER);
}

void sched_send(ts_sched *s, const ts_proto_identity *to, const ts_proto_msg *m,
                const ts_proto_payload *payloads, size_t npayloads)
{
    if (ts_proto_send(s->sock, to, m, payloads, npayloads, ZMQ_DONTWAIT) != TS_OK) {
        char idt[24];
        ts_sched_log(TS_SCHED_WARN, "could not send %s to peer %s: %s",
                     ts_proto_type_name(m->type), sched_id_text(to, idt, sizeof idt),
                     ts_last_error());
    }
}

void sched_send_error(ts_sched *s, const ts_proto_identity *to, uint32_t code,
                      const char *fmt, ...)
{
    char reason[TS_PROTO_REASON_MAX + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    ts_proto_msg m;
    ts_proto_msg_error(&m, s->cfg.job, s->generation, TS_PROTO_RANK_SCHEDULER, code, reason);
    sched_send(s, to, &m, NULL, 0);
    ts_proto_msg_free(&m);
}

void sched_reject(ts_sched *s, const ts_proto_identity *id, const sched_node *n,
                  uint32_t code, const char *fmt, ...)
{
    char reason[TS_PROTO_REASON_MAX + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    s->bad_messages++;
    char idt[24];
    ts_sched_log(TS_SCHED_WARN, "rejected message %llu from peer %s (rank %d): %s: %s",
                 (unsigned long long)s->bad_messages, sched_id_text(id, idt, sizeof idt),
                 n ? n->rank : -1, ts_proto_error_name(code), reason);
    if (id->size > 0)
        sched_send_error(s, id, code, "%s (rejected message %llu)", reason,
                         (unsigned long long)s->bad_messages);
}

void sched_shutdown(ts_sched *s, int code, const char *reason)
{
    if (s->stopping)
        return;
    ts_proto_msg m;
    sched_msg_init(s, &m, TS_MSG_SHUTDOWN);
    m.code = (uint32_t)code;
    ts_proto_set_str(m.reason, sizeof m.reason, reason);
    size_t sent = 0;
    for (size_t i = 0; i < s->nnodes; i++) {
        if (s->nodes[i].state == NODE_MEMBER || s->nodes[i].state == NODE_PENDING) {
            sched_send(s, &s->nodes[i].id, &m, NULL, 0);
            sent++;
        }
    }
    ts_proto_msg_free(&m);
    ts_sched_log(code == 0 ? TS_SCHED_INFO : TS_SCHED_ERROR,
                 "SHUTDOWN (code %d) sent to %zu nodes: %s; %llu rejected messages",
                 code, sent, reason, (unsigned long long)s->bad_messages);
    s->phase = PHASE_DONE;
    s->stopping = true;
    s->exit_code = code;
    ts_zloop_stop(&s->zloop);
    uv_stop(&s->loop);
}
