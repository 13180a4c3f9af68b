/* members.c - the node table: rendezvous, ranks, generations, step
 * boundaries, elastic admission, failure detection and the end of the job. */
#include "scheduler/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler/log.h"

/* Nodes kept at most; dead and departed entries are recycled beyond it. */
#define SCHED_MAX_NODES 4096
/* A joiner waiting for admission re-sends JOIN; silent this long it is dropped. */
#define SCHED_PENDING_TIMEOUT_MIN_MS 2000

sched_node *sched_node_find(ts_sched *s, const ts_proto_identity *id)
{
    for (size_t i = 0; i < s->nnodes; i++)
        if (s->nodes[i].id.size == id->size && memcmp(s->nodes[i].id.data, id->data, id->size) == 0)
            return &s->nodes[i];
    return NULL;
}

sched_node *sched_node_by_rank(ts_sched *s, int32_t rank)
{
    for (size_t i = 0; i < s->nnodes; i++)
        if (s->nodes[i].state == NODE_MEMBER && s->nodes[i].rank == rank)
            return &s->nodes[i];
    return NULL;
}

size_t sched_count(const ts_sched *s, sched_node_state st, ts_proto_role role)
{
    size_t c = 0;
    for (size_t i = 0; i < s->nnodes; i++)
        if (s->nodes[i].state == st && (role == TS_ROLE_NONE || s->nodes[i].role == role))
            c++;
    return c;
}

int64_t sched_job_step(const ts_sched *s)
{
    int64_t lo = -1;
    bool any = false;
    for (size_t i = 0; i < s->nnodes; i++) {
        const sched_node *n = &s->nodes[i];
        if (n->state == NODE_MEMBER && n->role == TS_ROLE_WORKER) {
            if (!any || n->last_step < lo)
                lo = n->last_step;
            any = true;
        }
    }
    return lo;
}

/* True when every live worker reported the same last step (or none lives). */
static bool at_step_boundary(const ts_sched *s)
{
    int64_t lo = sched_job_step(s);
    for (size_t i = 0; i < s->nnodes; i++) {
        const sched_node *n = &s->nodes[i];
        if (n->state == NODE_MEMBER && n->role == TS_ROLE_WORKER && n->last_step != lo)
            return false;
    }
    return true;
}

/* A free slot in the node table (recycling an old dead entry when full). */
static sched_node *new_node(ts_sched *s)
{
    if (s->nnodes == s->cap_nodes && s->nnodes < SCHED_MAX_NODES) {
        size_t cap = s->cap_nodes ? s->cap_nodes * 2 : 16;
        sched_node *p = realloc(s->nodes, cap * sizeof *p);
        if (!p)
            return NULL;
        s->nodes = p;
        s->cap_nodes = cap;
    }
    if (s->nnodes < s->cap_nodes)
        return &s->nodes[s->nnodes++];
    for (size_t i = 0; i < s->nnodes; i++)
        if (s->nodes[i].state == NODE_DEAD || s->nodes[i].state == NODE_LEFT)
            return &s->nodes[i];
    return NULL;
}

/* The rank a node gets on admission: its previous one when it asks for it,
 * held it with the same role and nobody holds it now; else a fresh one. */
static int32_t choose_rank(ts_sched *s, const sched_node *n)
{
    int32_t r = n->prev_rank;
    if (r >= 0 && r < s->next_rank && !sched_node_by_rank(s, r)) {
        for (size_t i = 0; i < s->nnodes; i++) {
            const sched_node *o = &s->nodes[i];
            if (o != n && o->rank == r && o->role == n->role &&
                (o->state == NODE_DEAD || o->state == NODE_LEFT))
                return r;
        }
    }
    return s->next_rank++;
}

ts_status sched_roster(ts_sched *s, bool all, ts_proto_member **out, size_t *count)
{
    size_t n = 0;
    for (size_t i = 0; i < s->nnodes; i++)
        if (all || s->nodes[i].state == NODE_MEMBER)
            n++;
    ts_proto_member *r = calloc(n ? n : 1, sizeof *r);
    if (!r)
        return ts_error(TS_ERR_MEMORY, "scheduler: roster of %zu entries: out of memory", n);
    uint64_t now = sched_now_ms(s);
    size_t k = 0;
    for (size_t i = 0; i < s->nnodes; i++) {
        const sched_node *o = &s->nodes[i];
        if (!all && o->state != NODE_MEMBER)
            continue;
        r[k].rank = o->rank;
        r[k].role = o->role;
        memcpy(r[k].address, o->address, sizeof r[k].address);
        r[k].alive = o->state == NODE_MEMBER || o->state == NODE_PENDING;
        r[k].last_step = o->last_step;
        r[k].last_barrier = o->last_barrier;
        r[k].heartbeat_age_ms = (int64_t)(now - o->last_seen_ms);
        r[k].joined_generation = o->joined_generation;
        k++;
    }
    *out = r;
    *count = n;
    return TS_OK;
}

/* JOIN_ACK to the members admitted in this generation, MEMBERSHIP to the
 * others, each with the roster of live members. */
static void announce(ts_sched *s)
{
    ts_proto_member *ros = NULL;
    size_t nros = 0;
    if (sched_roster(s, false, &ros, &nros) != TS_OK) {
        ts_sched_log(TS_SCHED_ERROR, "generation %llu: %s", (unsigned long long)s->generation,
                     ts_last_error());
        return;
    }
    int64_t step = sched_job_step(s);
    for (size_t i = 0; i < s->nnodes; i++) {
        sched_node *n = &s->nodes[i];
        if (n->state != NODE_MEMBER)
            continue;
        bool fresh = n->joined_generation == s->generation;
        ts_proto_msg m;
        sched_msg_init(s, &m, fresh ? TS_MSG_JOIN_ACK : TS_MSG_MEMBERSHIP);
        m.step = step;
        if (fresh) {
            m.assigned_rank = n->rank;
            m.steps = s->cfg.steps;
            m.heartbeat_ms = (uint32_t)s->cfg.heartbeat_ms;
            m.heartbeat_timeout_ms = (uint32_t)s->cfg.heartbeat_timeout_ms;
            m.barrier_timeout_ms = (uint32_t)s->cfg.barrier_timeout_ms;
        }
        if (ts_proto_msg_set_roster(&m, ros, nros) == TS_OK)
            sched_send(s, &n->id, &m, NULL, 0);
        else
            ts_sched_log(TS_SCHED_ERROR, "roster for rank %d: %s", n->rank, ts_last_error());
        ts_proto_msg_free(&m);
    }
    free(ros);
}

/* Makes a pending node a member of the (new) current generation. */
static void admit(ts_sched *s, sched_node *n, int64_t step)
{
    n->rank = choose_rank(s, n);
    n->state = NODE_MEMBER;
    n->joined_generation = s->generation;
    n->last_seen_ms = sched_now_ms(s);
    n->last_step = n->role == TS_ROLE_WORKER ? step : -1;
    /* the step is the group's, reported before this generation: the
     * joiner may go back with the group in this one (to a checkpoint) */
    n->step_generation = s->generation - 1;
    n->last_barrier = -1;
    ts_sched_log(TS_SCHED_INFO, "generation %llu: %s rank %d admitted (address '%s', caps '%s'%s)",
                 (unsigned long long)s->generation, ts_proto_role_name(n->role), n->rank,
                 n->address, n->caps, n->prev_rank >= 0 && n->prev_rank == n->rank ?
                 ", its previous rank" : "");
}

/* Admits the pending nodes of one role, in join order, up to limit members. */
static void admit_role(ts_sched *s, ts_proto_role role, size_t limit, int64_t step)
{
    for (;;) {
        sched_node *best = NULL;
        for (size_t i = 0; i < s->nnodes; i++) {
            sched_node *n = &s->nodes[i];
            if (n->state == NODE_PENDING && n->role == role &&
                (!best || n->join_order < best->join_order))
                best = n;
        }
        if (!best || sched_count(s, NODE_MEMBER, role) >= limit)
            return;
        admit(s, best, step);
    }
}

static void log_generation(ts_sched *s)
{
    char ranks[1024];
    size_t o = 0;
    ranks[0] = '\0';
    for (size_t i = 0; i < s->nnodes && o + 16 < sizeof ranks; i++)
        if (s->nodes[i].state == NODE_MEMBER)
            o += (size_t)snprintf(ranks + o, sizeof ranks - o, "%s%s%d", o ? " " : "",
                                  s->nodes[i].role == TS_ROLE_PS ? "ps" : "w", s->nodes[i].rank);
    ts_sched_log(TS_SCHED_INFO, "generation %llu at step %lld: %zu servers, %zu workers [%s]",
                 (unsigned long long)s->generation, (long long)sched_job_step(s),
                 sched_count(s, NODE_MEMBER, TS_ROLE_PS),
                 sched_count(s, NODE_MEMBER, TS_ROLE_WORKER), ranks);
}

/* Rendezvous complete: generation 1 with servers first, then workers, once
 * the servers and the minimum of workers are pending. Fewer than the
 * workers started with the job (one still loading its data) get a last
 * call of one heartbeat timeout from the moment the minimum was there, so
 * that the job does not start with the minimum only to change its world a
 * moment later. */
static void try_start(ts_sched *s)
{
    size_t workers = sched_count(s, NODE_PENDING, TS_ROLE_WORKER);
    if (sched_count(s, NODE_PENDING, TS_ROLE_PS) < (size_t)s->cfg.servers ||
        workers < (size_t)s->cfg.min_workers)
        return;
    if (workers < (size_t)s->cfg.expect_workers) {
        uint64_t now = sched_now_ms(s);
        if (!s->last_call_ms) {
            s->last_call_ms = now ? now : 1;
            ts_sched_log(TS_SCHED_INFO, "%zu of %d workers joined, the minimum: waiting up to %d ms "
                         "for the rest", workers, s->cfg.expect_workers, s->cfg.heartbeat_timeout_ms);
        }
        if (now - s->last_call_ms < (uint64_t)s->cfg.heartbeat_timeout_ms)
            return;
    }
    s->generation = 1;
    s->phase = PHASE_RUNNING;
    uv_timer_stop(&s->rendezvous);
    admit_role(s, TS_ROLE_PS, (size_t)s->cfg.servers, -1);
    admit_role(s, TS_ROLE_WORKER, (size_t)s->cfg.max_workers, -1);
    s->change_pending = s->workers_changed = false;
    ts_sched_log(TS_SCHED_INFO, "rendezvous complete after %llu ms",
                 (unsigned long long)(sched_now_ms(s) - s->started_ms));
    log_generation(s);
    announce(s);
}

void sched_advance(ts_sched *s)
{
    if (s->phase != PHASE_RUNNING || s->stopping)
        return;
    if (s->change_pending && (!s->workers_changed || !s->cfg.change_at_boundary || at_step_boundary(s))) {
        s->generation++;
        int64_t step = sched_job_step(s);
        admit_role(s, TS_ROLE_PS, (size_t)s->cfg.servers, step);
        admit_role(s, TS_ROLE_WORKER, (size_t)s->cfg.max_workers, step);
        s->change_pending = s->workers_changed = false;
        log_generation(s);
        size_t w = sched_count(s, NODE_MEMBER, TS_ROLE_WORKER);
        if (w < (size_t)s->cfg.min_workers)
            ts_sched_log(TS_SCHED_WARN, "only %zu workers alive, below the minimum of %d; "
                         "waiting for workers to join", w, s->cfg.min_workers);
        announce(s);
    }
    sched_stop_check(s);
    if (s->cfg.steps <= 0 || sched_barriers_open(s))
        return;
    size_t live = 0;
    for (size_t i = 0; i < s->nnodes; i++) {
        const sched_node *n = &s->nodes[i];
        if (n->state == NODE_MEMBER && n->role == TS_ROLE_WORKER) {
            if (n->last_step < s->cfg.steps)
                return;
            live++;
        }
    }
    if (live > 0 || s->worker_completed) {
        char reason[128];
        snprintf(reason, sizeof reason, "job finished: all workers completed %lld steps",
                 s->cfg.steps);
        sched_shutdown(s, 0, reason);
    }
}

/* True when a joining worker's capabilities are the job's: those of the
 * first worker that asked to join (a worker of another strategy, model,
 * optimizer or schedule would fail every collective of its generation and
 * the next, and hold up the job). Refuses it when not. */
static bool same_job(ts_sched *s, const ts_proto_identity *id, const ts_proto_msg *m)
{
    if (m->role != TS_ROLE_WORKER || strcmp(m->caps, s->worker_caps) == 0)
        return true;
    if (!s->worker_caps[0]) {
        memcpy(s->worker_caps, m->caps, sizeof s->worker_caps);
        return true;
    }
    ts_sched_log(TS_SCHED_WARN, "refused a worker join: capabilities '%s', the job's are '%s'", m->caps,
                 s->worker_caps);
    sched_send_error(s, id, TS_PROTO_E_REFUSED, "job %s runs workers of '%s', this worker is '%s': its strategy, "
                     "model, optimizer or schedule differ", s->cfg.job, s->worker_caps, m->caps);
    return false;
}

void sched_on_join(ts_sched *s, const ts_proto_identity *id, const ts_proto_msg *m)
{
    sched_node *n = sched_node_find(s, id);
    if (n && (n->state == NODE_PENDING || n->state == NODE_MEMBER)) {
        n->last_seen_ms = sched_now_ms(s); /* repeated JOIN: the joiner is alive */
        return;
    }
    if (m->role != TS_ROLE_PS && m->role != TS_ROLE_WORKER) {
        sched_reject(s, id, n, TS_PROTO_E_FIELD_VALUE, "JOIN role must be ps or worker, got %s",
                     ts_proto_role_name(m->role));
        return;
    }
    if (s->stop_signal && m->role == TS_ROLE_WORKER) {
        sched_stop_refuse(s, id);
        return;
    }
    if (!same_job(s, id, m))
        return;
    size_t have = sched_count(s, NODE_PENDING, m->role) + sched_count(s, NODE_MEMBER, m->role);
    size_t limit = m->role == TS_ROLE_PS ? (size_t)s->cfg.servers : (size_t)s->cfg.max_workers;
    if (have >= limit) {
        ts_sched_log(TS_SCHED_WARN, "refused a %s join: the job already has %zu of %zu",
                     ts_proto_role_name(m->role), have, limit);
        sched_send_error(s, id, TS_PROTO_E_REFUSED, "job %s is full: it has %zu of %zu %s",
                         s->cfg.job, have, limit, m->role == TS_ROLE_PS ? "servers" : "workers");
        return;
    }
    if (!n)
        n = new_node(s);
    if (!n) {
        sched_send_error(s, id, TS_PROTO_E_INTERNAL, "scheduler node table is full (%d nodes)",
                         SCHED_MAX_NODES);
        return;
    }
    memset(n, 0, sizeof *n);
    n->id = *id;
    n->state = NODE_PENDING;
    n->rank = -1;
    n->prev_rank = m->prev_rank;
    n->role = m->role;
    memcpy(n->address, m->address, sizeof n->address);
    memcpy(n->caps, m->caps, sizeof n->caps);
    n->last_seen_ms = sched_now_ms(s);
    n->last_step = -1;
    n->last_barrier = -1;
    n->join_order = ++s->join_counter;
    ts_sched_log(TS_SCHED_INFO, "join request: %s (address '%s', previous rank %d); "
                 "%zu of %d servers and %zu of %d workers waiting or joined",
                 ts_proto_role_name(n->role), n->address, n->prev_rank,
                 sched_count(s, NODE_PENDING, TS_ROLE_PS) + sched_count(s, NODE_MEMBER, TS_ROLE_PS),
                 s->cfg.servers,
                 sched_count(s, NODE_PENDING, TS_ROLE_WORKER) +
                     sched_count(s, NODE_MEMBER, TS_ROLE_WORKER),
                 s->cfg.min_workers);
    if (s->phase == PHASE_RENDEZVOUS) {
        try_start(s);
    } else {
        s->change_pending = true;
        s->workers_changed |= n->role == TS_ROLE_WORKER;
        sched_advance(s);
    }
}

void sched_on_step_done(ts_sched *s, sched_node *n, const ts_proto_msg *m)
{
    if (n->role != TS_ROLE_WORKER) {
        sched_reject(s, &n->id, n, TS_PROTO_E_UNEXPECTED, "STEP_DONE from %s rank %d: only "
                     "workers report steps", ts_proto_role_name(n->role), n->rank);
        return;
    }
    /* a step goes back only in a later generation than the one it was
     * reported in: the workers moved back to a checkpoint (a lost shard) */
    if (m->step < 0 || (m->step < n->last_step && m->generation <= n->step_generation)) {
        sched_reject(s, &n->id, n, TS_PROTO_E_FIELD_VALUE, "STEP_DONE step %lld from rank %d "
                     "goes back from step %lld in generation %llu", (long long)m->step, n->rank,
                     (long long)n->last_step, (unsigned long long)n->step_generation);
        return;
    }
    n->last_step = m->step;
    n->step_generation = m->generation;
    if (s->cfg.steps > 0 && n->last_step >= s->cfg.steps)
        s->worker_completed = true;
    sched_advance(s);
}

/* Takes a member out of the job (dead or departed) and starts the change.
 * A dead one is also named on stdout ("dead ps 1"): its process may still
 * run, stopped, and a supervisor (tessera-run) ends it. */
static void remove_member(ts_sched *s, sched_node *n, sched_node_state st)
{
    if (st == NODE_DEAD) {
        printf("dead %s %d\n", ts_proto_role_name(n->role), n->rank);
        fflush(stdout);
        s->declared_dead++;
    }
    n->state = st;
    if (n->role == TS_ROLE_WORKER && s->cfg.steps > 0 && n->last_step >= s->cfg.steps)
        s->worker_completed = true;
    s->change_pending = true;
    s->workers_changed |= n->role == TS_ROLE_WORKER;
}

/* Live members of a role the job needs at least: every server, and
 * --min-workers workers. */
static size_t role_minimum(const ts_sched *s, ts_proto_role role)
{
    return role == TS_ROLE_PS ? (size_t)s->cfg.servers : (size_t)s->cfg.min_workers;
}

bool sched_evict(ts_sched *s, sched_node *const *stuck, size_t n, const char *why)
{
    if (n == 0)
        return true;
    ts_proto_role role = stuck[0]->role;
    size_t live = sched_count(s, NODE_MEMBER, role);
    if (live < n || live - n < role_minimum(s, role))
        return false;
    for (size_t i = 0; i < n; i++) {
        sched_node *v = stuck[i];
        ts_sched_log(TS_SCHED_WARN, "%s rank %d (address '%s') evicted: %s; the job goes on "
                     "with %zu %ss", ts_proto_role_name(v->role), v->rank, v->address, why,
                     live - n, ts_proto_role_name(role));
        sched_send_error(s, &v->id, TS_PROTO_E_REFUSED, "rank %d evicted: %s", v->rank, why);
        remove_member(s, v, NODE_DEAD);
    }
    return true;
}

void sched_on_leave(ts_sched *s, sched_node *n, const ts_proto_msg *m)
{
    ts_sched_log(TS_SCHED_INFO, "%s rank %d left at step %lld: %s", ts_proto_role_name(n->role),
                 n->rank, (long long)n->last_step, m->reason[0] ? m->reason : "(no reason)");
    remove_member(s, n, NODE_LEFT);
    sched_barriers_recheck(s);
    sched_advance(s);
}

void sched_on_regroup(ts_sched *s, sched_node *n, const ts_proto_msg *m)
{
    if (n->role != TS_ROLE_WORKER) {
        sched_reject(s, &n->id, n, TS_PROTO_E_UNEXPECTED, "REGROUP from %s rank %d: only workers regroup",
                     ts_proto_role_name(n->role), n->rank);
        return;
    }
    if (m->generation < s->generation || s->change_pending)
        return; /* a newer generation is out, or on its way */
    ts_sched_log(TS_SCHED_WARN, "worker rank %d asks for a new generation: %s", n->rank, m->reason);
    s->change_pending = true;
    s->workers_changed = true;
    sched_advance(s);
}

void sched_check_liveness(ts_sched *s)
{
    if (s->stopping)
        return;
    uint64_t now = sched_now_ms(s);
    uint64_t timeout = (uint64_t)s->cfg.heartbeat_timeout_ms;
    uint64_t pending_timeout = timeout > SCHED_PENDING_TIMEOUT_MIN_MS ? timeout
                                                                     : SCHED_PENDING_TIMEOUT_MIN_MS;
    bool died = false;
    for (size_t i = 0; i < s->nnodes; i++) {
        sched_node *n = &s->nodes[i];
        uint64_t silent = now - n->last_seen_ms;
        if (n->state == NODE_MEMBER && silent > timeout) {
            ts_sched_log(TS_SCHED_WARN, "%s rank %d (address '%s') silent for %llu ms "
                         "(timeout %llu ms): declared dead; last step %lld, last barrier %lld",
                         ts_proto_role_name(n->role), n->rank, n->address,
                         (unsigned long long)silent, (unsigned long long)timeout,
                         (long long)n->last_step, (long long)n->last_barrier);
            remove_member(s, n, NODE_DEAD);
            died = true;
        } else if (n->state == NODE_PENDING && silent > pending_timeout) {
            ts_sched_log(TS_SCHED_WARN, "%s joiner (address '%s') silent for %llu ms while "
                         "waiting: dropped", ts_proto_role_name(n->role), n->address,
                         (unsigned long long)silent);
            n->state = NODE_LEFT;
        }
    }
    if (died) {
        sched_barriers_recheck(s);
        sched_advance(s);
    }
}

void sched_rendezvous_tick(ts_sched *s)
{
    if (s->phase == PHASE_RENDEZVOUS && s->last_call_ms)
        try_start(s);
}

/* Text like "2 of 4 workers and 1 of 2 servers joined". */
static void rendezvous_text(ts_sched *s, char *buf, size_t cap)
{
    snprintf(buf, cap, "%zu of %d workers and %zu of %d servers joined",
             sched_count(s, NODE_PENDING, TS_ROLE_WORKER), s->cfg.min_workers,
             sched_count(s, NODE_PENDING, TS_ROLE_PS), s->cfg.servers);
}

void sched_rendezvous_warn(ts_sched *s)
{
    char what[160];
    rendezvous_text(s, what, sizeof what);
    ts_sched_log(TS_SCHED_WARN, "rendezvous half-way to its %d ms timeout: %s",
                 s->cfg.rendezvous_timeout_ms, what);
}

void sched_rendezvous_expired(ts_sched *s)
{
    char what[160], reason[TS_PROTO_REASON_MAX + 1];
    rendezvous_text(s, what, sizeof what);
    snprintf(reason, sizeof reason, "rendezvous timed out after %d ms: %s",
             s->cfg.rendezvous_timeout_ms, what);
    for (size_t i = 0; i < s->nnodes; i++)
        if (s->nodes[i].state == NODE_PENDING)
            sched_send_error(s, &s->nodes[i].id, TS_PROTO_E_RENDEZVOUS_TIMEOUT, "%s", reason);
    sched_shutdown(s, 1, reason);
}
