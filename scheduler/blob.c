/* blob.c - the blob relay: small named byte strings all ranks need (an NCCL
 * unique id, say). BLOB_PUT stores (replacing), BLOB_GET answers at once when
 * the key exists, else waits for the put until the barrier timeout and then
 * answers found=false. */
#include "scheduler/internal.h"

#include <stdlib.h>
#include <string.h>

#include "scheduler/log.h"

#define SCHED_MAX_BLOB (64u * 1024u)
#define SCHED_MAX_BLOBS 1024u
#define SCHED_MAX_BLOB_WAITS 4096u

struct sched_blob {
    char key[TS_PROTO_KEY_MAX + 1];
    void *data;
    size_t size;
    sched_blob *next;
};

struct sched_blob_wait {
    ts_proto_identity id;
    char key[TS_PROTO_KEY_MAX + 1];
    uint64_t deadline_ms;
    sched_blob_wait *next;
};

static sched_blob *find(ts_sched *s, const char *key)
{
    for (sched_blob *b = s->blobs; b; b = b->next)
        if (strcmp(b->key, key) == 0)
            return b;
    return NULL;
}

/* BLOB_REPLY(key, found, one payload frame) to one peer: the blob's bytes,
 * or an empty frame acknowledging a put (with_bytes false). */
static void reply(ts_sched *s, const ts_proto_identity *to, const char *key, const sched_blob *b,
                  bool with_bytes)
{
    ts_proto_msg m;
    sched_msg_init(s, &m, TS_MSG_BLOB_REPLY);
    ts_proto_set_str(m.key, sizeof m.key, key);
    m.found = b != NULL;
    ts_proto_payload p = {b && with_bytes ? b->data : "", b && with_bytes ? b->size : 0, NULL, NULL};
    sched_send(s, to, &m, &p, b ? 1 : 0);
    ts_proto_msg_free(&m);
}

void sched_on_blob_put(ts_sched *s, sched_node *n, const ts_proto_msg *m)
{
    if (m->nlengths != 1 || m->lengths[0] > SCHED_MAX_BLOB) {
        sched_reject(s, &n->id, n, TS_PROTO_E_PAYLOAD_SIZE, "BLOB_PUT '%s' needs exactly one "
                     "payload frame of at most %u bytes (got %zu frames, %llu bytes)", m->key,
                     SCHED_MAX_BLOB, m->nlengths,
                     (unsigned long long)(m->nlengths ? m->lengths[0] : 0));
        return;
    }
    sched_blob *b = find(s, m->key);
    if (!b && s->nblobs >= SCHED_MAX_BLOBS) {
        sched_reject(s, &n->id, n, TS_PROTO_E_REFUSED, "BLOB_PUT '%s': the relay already holds "
                     "%u blobs", m->key, SCHED_MAX_BLOBS);
        return;
    }
    void *copy = malloc(m->payload[0].size ? m->payload[0].size : 1);
    if (!copy || (!b && !(b = calloc(1, sizeof *b)))) {
        free(copy);
        sched_send_error(s, &n->id, TS_PROTO_E_INTERNAL, "BLOB_PUT '%s': out of memory", m->key);
        return;
    }
    if (b->data) {
        free(b->data);
    } else {
        memcpy(b->key, m->key, sizeof b->key);
        b->next = s->blobs;
        s->blobs = b;
        s->nblobs++;
    }
    memcpy(copy, m->payload[0].data, m->payload[0].size);
    b->data = copy;
    b->size = m->payload[0].size;
    reply(s, &n->id, b->key, b, false);
    for (sched_blob_wait **p = &s->blob_waits; *p;) {
        sched_blob_wait *w = *p;
        if (strcmp(w->key, b->key) == 0) {
            reply(s, &w->id, b->key, b, true);
            *p = w->next;
            free(w);
        } else {
            p = &w->next;
        }
    }
}

void sched_on_blob_get(ts_sched *s, sched_node *n, const ts_proto_msg *m)
{
    sched_blob *b = find(s, m->key);
    if (b) {
        reply(s, &n->id, b->key, b, true);
        return;
    }
    size_t waits = 0;
    for (sched_blob_wait *w = s->blob_waits; w; w = w->next)
        waits++;
    sched_blob_wait *w = waits < SCHED_MAX_BLOB_WAITS ? calloc(1, sizeof *w) : NULL;
    if (!w) {
        reply(s, &n->id, m->key, NULL, false);
        return;
    }
    w->id = n->id;
    memcpy(w->key, m->key, sizeof w->key);
    w->deadline_ms = sched_now_ms(s) + (uint64_t)s->cfg.barrier_timeout_ms;
    w->next = s->blob_waits;
    s->blob_waits = w;
}

void sched_blob_expire(ts_sched *s)
{
    uint64_t now = sched_now_ms(s);
    for (sched_blob_wait **p = &s->blob_waits; *p;) {
        sched_blob_wait *w = *p;
        if (now >= w->deadline_ms) {
            sched_node *n = sched_node_find(s, &w->id);
            ts_sched_log(TS_SCHED_WARN, "blob '%s' was not put within %d ms (asked by rank %d)",
                         w->key, s->cfg.barrier_timeout_ms, n ? n->rank : -1);
            reply(s, &w->id, w->key, NULL, false);
            *p = w->next;
            free(w);
        } else {
            p = &w->next;
        }
    }
}

void sched_blobs_free(ts_sched *s)
{
    while (s->blobs) {
        sched_blob *b = s->blobs;
        s->blobs = b->next;
        free(b->data);
        free(b);
    }
    while (s->blob_waits) {
        sched_blob_wait *w = s->blob_waits;
        s->blob_waits = w->next;
        free(w);
    }
    s->nblobs = 0;
}
