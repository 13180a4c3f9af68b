/* barrier.c - named barriers among the live members of one role.
 *
 * A barrier (role, id) opens when its first member arrives; it expects the
 * members of that role alive at that moment (plus any later member that
 * arrives). It is released when every expected member still alive arrived.
 * At half the barrier timeout a warning names the missing ranks; at the
 * timeout those that are alive are evicted when the job keeps its minimum
 * of that role without them (sched_evict), and the barrier is released;
 * otherwise every waiting rank gets an ERROR naming them and their last step.
 * A member admitted after a barrier opened was not expected there; if it
 * arrives once the barrier was released, it is released at once.
 */
#include "scheduler/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler/log.h"

struct sched_barrier {
    ts_sched *s;
    ts_proto_role role;
    int64_t id;
    uint64_t generation; /* when it opened */
    int32_t *ranks;
    bool *arrived;
    size_t n, cap;
    uint64_t started_ms;
    bool warned;
    uv_timer_t timer;
    sched_barrier *next;
};

static void free_barrier(uv_handle_t *h)
{
    sched_barrier *b = h->data;
    free(b->ranks);
    free(b->arrived);
    free(b);
}

/* Unlinks b and frees it once its timer handle is closed. */
static void drop(ts_sched *s, sched_barrier *b)
{
    for (sched_barrier **p = &s->barriers; *p; p = &(*p)->next) {
        if (*p == b) {
            *p = b->next;
            break;
        }
    }
    uv_timer_stop(&b->timer);
    uv_close((uv_handle_t *)&b->timer, free_barrier);
}

static bool add_rank(sched_barrier *b, int32_t rank, bool arrived)
{
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 8;
        int32_t *r = realloc(b->ranks, cap * sizeof *r);
        if (!r)
            return false;
        b->ranks = r;
        bool *a = realloc(b->arrived, cap * sizeof *a);
        if (!a)
            return false;
        b->arrived = a;
        b->cap = cap;
    }
    b->ranks[b->n] = rank;
    b->arrived[b->n] = arrived;
    b->n++;
    return true;
}

/* "rank 3 finished step 182 but did not reach barrier 183; ..." for the
 * expected members still alive that have not arrived; returns how many. */
static size_t missing_text(ts_sched *s, const sched_barrier *b, char *buf, size_t cap)
{
    size_t o = 0, count = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < b->n; i++) {
        sched_node *n = sched_node_by_rank(s, b->ranks[i]);
        if (b->arrived[i] || !n)
            continue;
        count++;
        if (o + 1 >= cap)
            continue;
        int w;
        if (n->last_step >= 0)
            w = snprintf(buf + o, cap - o, "%srank %d finished step %lld but did not reach "
                         "barrier %lld", count > 1 ? "; " : "", n->rank,
                         (long long)n->last_step, (long long)b->id);
        else
            w = snprintf(buf + o, cap - o, "%srank %d reported no finished step and did not "
                         "reach barrier %lld", count > 1 ? "; " : "", n->rank, (long long)b->id);
        o = w < 0 ? cap : o + (size_t)w;
    }
    return count;
}

/* Releases b when nobody alive is missing; true when it did. */
static bool try_release(ts_sched *s, sched_barrier *b)
{
    for (size_t i = 0; i < b->n; i++) {
        const sched_node *o = sched_node_by_rank(s, b->ranks[i]);
        if (!b->arrived[i] && o && !o->stopped)
            return false;
    }
    ts_proto_msg m;
    sched_msg_init(s, &m, TS_MSG_BARRIER_RELEASE);
    m.barrier_id = b->id;
    size_t released = 0;
    for (size_t i = 0; i < b->n; i++) {
        sched_node *n = sched_node_by_rank(s, b->ranks[i]);
        if (b->arrived[i] && n) {
            sched_send(s, &n->id, &m, NULL, 0);
            released++;
        }
    }
    ts_proto_msg_free(&m);
    sched_released *r = &s->released[s->nreleased++ % SCHED_RELEASED_KEPT];
    *r = (sched_released){b->role, b->id, b->generation};
    uint64_t ms = sched_now_ms(s) - b->started_ms;
    if (ms * 4 > (uint64_t)s->cfg.barrier_timeout_ms)
        ts_sched_log(TS_SCHED_INFO, "barrier %lld released %zu %ss after %llu ms",
                     (long long)b->id, released, ts_proto_role_name(b->role),
                     (unsigned long long)ms);
    drop(s, b);
    return true;
}

/* At the timeout: the expected members still alive that did not arrive are
 * evicted (sched_evict) when the job keeps its minimum without them; then
 * the barrier is released for the others. False when nobody was evicted. */
static bool evict_missing(ts_sched *s, sched_barrier *b, const char *missing)
{
    sched_node **stuck = malloc(b->n * sizeof *stuck);
    size_t n = 0;
    for (size_t i = 0; stuck && i < b->n; i++) {
        sched_node *v = sched_node_by_rank(s, b->ranks[i]);
        if (!b->arrived[i] && v)
            stuck[n++] = v;
    }
    char why[TS_PROTO_REASON_MAX - 100];
    snprintf(why, sizeof why, "kept heartbeating but did not reach %s barrier %lld within %d ms",
             ts_proto_role_name(b->role), (long long)b->id, s->cfg.barrier_timeout_ms);
    bool evicted = stuck && n > 0 && sched_evict(s, stuck, n, why);
    free(stuck);
    if (!evicted)
        return false;
    ts_sched_log(TS_SCHED_WARN, "barrier %lld timed out after %d ms: %s; evicted, the barrier "
                 "goes on without them", (long long)b->id, s->cfg.barrier_timeout_ms, missing);
    sched_barriers_recheck(s); /* releases b */
    sched_advance(s);
    return true;
}

/* Half the barrier timeout: a warning; all of it: the timeout. Judged on the
 * scheduler's clock (the uv timer may fire early after a stall). */
static void on_barrier_timer(uv_timer_t *h)
{
    sched_barrier *b = h->data;
    ts_sched *s = b->s;
    if (s->stopping)
        return;
    uint64_t t = (uint64_t)s->cfg.barrier_timeout_ms;
    uint64_t left = ts_zloop_remaining_ms(&s->zloop, b->started_ms, b->warned ? t : t / 2);
    if (left > 0) {
        uv_timer_start(&b->timer, on_barrier_timer, left, 0);
        return;
    }
    char missing[TS_PROTO_REASON_MAX - 100];
    size_t count = missing_text(s, b, missing, sizeof missing);
    if (!b->warned) {
        b->warned = true;
        ts_sched_log(TS_SCHED_WARN, "barrier %lld half-way to its %d ms timeout, %zu missing: %s",
                     (long long)b->id, s->cfg.barrier_timeout_ms, count, missing);
        uv_timer_start(&b->timer, on_barrier_timer, t - t / 2, 0);
        return;
    }
    if (evict_missing(s, b, missing))
        return;
    char reason[TS_PROTO_REASON_MAX + 1];
    snprintf(reason, sizeof reason, "barrier %lld timed out after %d ms: %s", (long long)b->id,
             s->cfg.barrier_timeout_ms, missing);
    ts_sched_log(TS_SCHED_ERROR, "%s", reason);
    for (size_t i = 0; i < b->n; i++) {
        sched_node *n = sched_node_by_rank(s, b->ranks[i]);
        if (b->arrived[i] && n)
            sched_send_error(s, &n->id, TS_PROTO_E_BARRIER_TIMEOUT, "%s", reason);
    }
    drop(s, b);
    sched_advance(s);
}

void sched_on_barrier(ts_sched *s, sched_node *n, const ts_proto_msg *m)
{
    if (m->barrier_id < 0) {
        sched_reject(s, &n->id, n, TS_PROTO_E_FIELD_VALUE, "BARRIER id %lld is negative",
                     (long long)m->barrier_id);
        return;
    }
    if (m->barrier_id > n->last_barrier)
        n->last_barrier = m->barrier_id;
    sched_barrier *b = s->barriers;
    while (b && !(b->role == n->role && b->id == m->barrier_id))
        b = b->next;
    size_t kept = s->nreleased < SCHED_RELEASED_KEPT ? s->nreleased : SCHED_RELEASED_KEPT;
    for (size_t i = 0; !b && i < kept; i++) {
        const sched_released *r = &s->released[i];
        if (r->role == n->role && r->id == m->barrier_id && r->generation < n->joined_generation) {
            ts_proto_msg rel;
            sched_msg_init(s, &rel, TS_MSG_BARRIER_RELEASE);
            rel.barrier_id = m->barrier_id;
            sched_send(s, &n->id, &rel, NULL, 0);
            ts_proto_msg_free(&rel);
            return;
        }
    }
    if (!b) {
        b = calloc(1, sizeof *b);
        if (!b) {
            sched_send_error(s, &n->id, TS_PROTO_E_INTERNAL, "barrier %lld: out of memory",
                             (long long)m->barrier_id);
            return;
        }
        b->s = s;
        b->role = n->role;
        b->id = m->barrier_id;
        b->generation = s->generation;
        b->started_ms = sched_now_ms(s);
        for (size_t i = 0; i < s->nnodes; i++) {
            const sched_node *o = &s->nodes[i];
            if (o->state == NODE_MEMBER && o->role == n->role && !o->stopped && !add_rank(b, o->rank, false)) {
                free_barrier(&(uv_handle_t){.data = b});
                sched_send_error(s, &n->id, TS_PROTO_E_INTERNAL, "barrier %lld: out of memory",
                                 (long long)m->barrier_id);
                return;
            }
        }
        uv_timer_init(&s->loop, &b->timer);
        b->timer.data = b;
        uv_timer_start(&b->timer, on_barrier_timer, (uint64_t)s->cfg.barrier_timeout_ms / 2, 0);
        b->next = s->barriers;
        s->barriers = b;
    }
    size_t i = 0;
    while (i < b->n && b->ranks[i] != n->rank)
        i++;
    if (i == b->n) {
        if (!add_rank(b, n->rank, true)) {
            sched_send_error(s, &n->id, TS_PROTO_E_INTERNAL, "barrier %lld: out of memory",
                             (long long)b->id);
            return;
        }
    } else {
        b->arrived[i] = true;
    }
    if (try_release(s, b))
        sched_advance(s);
}

void sched_barriers_recheck(ts_sched *s)
{
    sched_barrier *b = s->barriers;
    while (b) {
        sched_barrier *next = b->next;
        try_release(s, b);
        b = next;
    }
}

bool sched_barriers_open(const ts_sched *s) { return s->barriers != NULL; }

void sched_barriers_free(ts_sched *s)
{
    while (s->barriers)
        drop(s, s->barriers);
}
