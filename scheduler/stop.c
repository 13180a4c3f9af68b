/* stop.c - the orderly stop of a running job (SIGINT, SIGTERM).
 *
 * The first signal while workers train sends each of them STOP. A worker
 * votes it into the sums of the step it computes next; every worker of
 * that step sees the same sum, so all of them take it as their last, save
 * a checkpoint there together and send STOPPED. Once every live worker
 * did, the scheduler says so on stdout ("stopped 812 812": the first and
 * last step they stopped after), every node gets SHUTDOWN (code 0) and the
 * scheduler exits. A worker
 * that stopped holds up no barrier, one that dies meanwhile is not waited
 * for, and no worker joins a stopping job.
 * The workers get the heartbeat timeout plus the barrier timeout; after
 * that (code 1), or at a second signal (code 0, as asked), the job is shut
 * down at once. Before the
 * job runs, or with no worker left, a signal shuts it down at once.
 */
#include <signal.h>
#include <stdio.h>

#include "scheduler/internal.h"
#include "scheduler/log.h"

static const char *signal_name(int signum) { return signum == SIGINT ? "SIGINT" : "SIGTERM"; }

void sched_stop_refuse(ts_sched *s, const ts_proto_identity *id)
{
    ts_proto_msg m;
    sched_msg_init(s, &m, TS_MSG_SHUTDOWN);
    ts_proto_set_str(m.reason, sizeof m.reason, "the job is stopping: no worker joins it");
    sched_send(s, id, &m, NULL, 0);
    ts_proto_msg_free(&m);
}

/* Sends STOP to every live worker and refuses the waiting joiners;
 * returns how many workers were asked. */
static size_t ask_workers(ts_sched *s, const char *reason)
{
    ts_proto_msg m;
    sched_msg_init(s, &m, TS_MSG_STOP);
    ts_proto_set_str(m.reason, sizeof m.reason, reason);
    size_t asked = 0;
    for (size_t i = 0; i < s->nnodes; i++) {
        sched_node *n = &s->nodes[i];
        if (n->role != TS_ROLE_WORKER)
            continue;
        if (n->state == NODE_MEMBER) {
            sched_send(s, &n->id, &m, NULL, 0);
            asked++;
        } else if (n->state == NODE_PENDING) {
            sched_stop_refuse(s, &n->id);
            n->state = NODE_LEFT;
        }
    }
    ts_proto_msg_free(&m);
    return asked;
}

void sched_stop_begin(ts_sched *s, int signum)
{
    char reason[128];
    if (s->stop_signal) {
        snprintf(reason, sizeof reason, "scheduler received a second %s while the workers stopped",
                 signal_name(signum));
        ts_sched_log(TS_SCHED_WARN, "%s: shutting the job down now", reason);
        sched_shutdown(s, 0, reason);
        return;
    }
    snprintf(reason, sizeof reason, "scheduler received %s", signal_name(signum));
    size_t asked = s->phase == PHASE_RUNNING ? ask_workers(s, reason) : 0;
    if (asked == 0) {
        ts_sched_log(TS_SCHED_INFO, "%s: shutting the job down", reason);
        sched_shutdown(s, 0, reason);
        return;
    }
    s->stop_signal = signum;
    s->stop_deadline_ms = sched_now_ms(s) + (uint64_t)s->cfg.heartbeat_timeout_ms +
                          (uint64_t)s->cfg.barrier_timeout_ms;
    ts_sched_log(TS_SCHED_INFO, "%s: STOP sent to %zu workers; they stop after a step they agree on "
                 "and save it (within %d ms)", reason, asked,
                 s->cfg.heartbeat_timeout_ms + s->cfg.barrier_timeout_ms);
}

void sched_on_stopped(ts_sched *s, sched_node *n, const ts_proto_msg *m)
{
    if (n->role != TS_ROLE_WORKER || !s->stop_signal) {
        sched_reject(s, &n->id, n, TS_PROTO_E_UNEXPECTED, "STOPPED from %s rank %d: %s",
                     ts_proto_role_name(n->role), n->rank,
                     n->role != TS_ROLE_WORKER ? "only workers stop" : "no STOP was sent");
        return;
    }
    n->stopped = true;
    n->last_step = m->step;
    n->step_generation = m->generation;
    ts_sched_log(TS_SCHED_INFO, "worker rank %d stopped after step %lld", n->rank, (long long)m->step);
    sched_barriers_recheck(s);
    sched_advance(s);
}

void sched_stop_check(ts_sched *s)
{
    if (!s->stop_signal || s->stopping)
        return;
    size_t live = 0, stopped = 0;
    int64_t first = -1, last = -1; /* the steps they stopped after */
    char missing[256] = "";
    size_t o = 0;
    for (size_t i = 0; i < s->nnodes; i++) {
        const sched_node *n = &s->nodes[i];
        if (n->state != NODE_MEMBER || n->role != TS_ROLE_WORKER)
            continue;
        live++;
        if (n->stopped) {
            if (!stopped++ || n->last_step < first)
                first = n->last_step;
            if (n->last_step > last)
                last = n->last_step;
        } else if (o + 16 < sizeof missing) {
            o += (size_t)snprintf(missing + o, sizeof missing - o, "%s%d", o ? ", " : "", n->rank);
        }
    }
    char reason[TS_PROTO_REASON_MAX + 1];
    if (live == 0) { /* they left (each stopped by a signal of its own) or died */
        snprintf(reason, sizeof reason, "job stopped by %s: no worker is left", signal_name(s->stop_signal));
        sched_shutdown(s, 0, reason);
        return;
    }
    if (stopped == live) {
        printf("stopped %lld %lld\n", (long long)first, (long long)last);
        fflush(stdout);
        if (first == last)
            snprintf(reason, sizeof reason, "job stopped by %s after step %lld", signal_name(s->stop_signal),
                     (long long)last);
        else /* async workers, each at its own step */
            snprintf(reason, sizeof reason, "job stopped by %s after steps %lld..%lld",
                     signal_name(s->stop_signal), (long long)first, (long long)last);
        sched_shutdown(s, 0, reason);
    } else if (sched_now_ms(s) > s->stop_deadline_ms) {
        snprintf(reason, sizeof reason, "job stopped by %s: worker ranks %s did not stop within %d ms",
                 signal_name(s->stop_signal), missing,
                 s->cfg.heartbeat_timeout_ms + s->cfg.barrier_timeout_ms);
        sched_shutdown(s, 1, reason);
    }
}
