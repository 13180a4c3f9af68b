/* cluster.c - the local cluster run of tessera-run. */
#include "launch/cluster.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kernels/io/atomic.h"
#include "kernels/io/checkpoint.h"
#include "launch/netsim.h"
#include "launch/supervise.h"
#include "launch/train.h"
#include "membership/member.h"
#include "proto/secure.h"

enum {
    STARTUP_TIMEOUT_MS = 20000, /* scheduler must report its endpoint */
    STOP_GRACE_MS = 2000,       /* SIGTERM -> SIGKILL */
    DRAIN_MS = 3000,            /* every node finished: the scheduler may exit by itself */
    SETTLE_MS = 500,            /* a node failed: the others may report first */
    STATUS_WAIT_MS = 1000,      /* one STATUS query of a regrouping pipeline */
};

typedef enum { PHASE_STARTING, PHASE_RUNNING, PHASE_DONE, PHASE_FAILED } phase;

/* One place in the job (the scheduler, a ps, a worker) across restarts. */
typedef struct {
    ts_proto_role role;
    int rank;         /* rank the scheduler assigned, -1 unknown */
    ts_child *child;  /* current process, NULL when none */
    int finished;     /* exited with status 0 */
    int joined;       /* its current process said "joined rank=" */
    int declared_dead; /* the scheduler declared its current process dead ("dead worker 3"): out of the job */
    int node;         /* virtual-cluster node it runs on, -1 this machine */
} slot;

typedef struct {
    const ts_cluster_opts *o;
    uv_loop_t loop;
    ts_super super;
    uv_timer_t startup_timer, drain_timer, regroup_timer, stop_timer;
    char run_dir[PATH_MAX];
    char key_file[PATH_MAX + 16];
    char job_path[PATH_MAX];
    char addr[TS_PROTO_ADDR_MAX + 1];
    slot sched;
    slot *ps, *workers;
    ts_netsim *netsim;  /* the virtual cluster (TESSERA_NETSIM), or NULL */
    int restarts_used;
    int regrouping;     /* a pipeline waits for its workers to exit to restart them all */
    char regroup_what[256]; /* the failure that started the regrouping ("worker 1 exited with signal 9") */
    double regroup_deadline; /* restart then even if the scheduler still lists a worker */
    int resume_workers; /* workers start from the run's checkpoints (a restarted pipeline) */
    phase phase;
    int interrupted;  /* the signal the scheduler got to stop the job (0: none) */
    int saved;        /* the scheduler said every worker stopped and saved ("stopped A B") */
    int late;         /* the signal came after the scheduler ended the job */
    int stop_signal;  /* sent to the children when stopping */
    int exit_code;
    char reason[2048];
    char unfinished[2048]; /* a node failed after the job's last step: what (its end may not be saved) */
    int lock_fd;          /* holds the run folder for this job (ts_io_lock_run_dir), -1 before */
} cluster;

void ts_cluster_scheduler_args(ts_argv *a, const ts_job *job,
                               const char *bind_endpoint, const char *key_file) {
    const ts_job_parallel *p = &job->parallel;
    ts_argv_push(a, "--bind");
    ts_argv_push(a, bind_endpoint);
    ts_argv_push(a, "--job");
    ts_argv_push(a, job->name);
    ts_argv_push(a, "--key-file");
    ts_argv_push(a, key_file);
    ts_argv_pushf(a, "--min-workers=%d", p->min_workers);
    ts_argv_pushf(a, "--max-workers=%d", p->max_workers);
    ts_argv_pushf(a, "--expect-workers=%d", p->workers);
    ts_argv_pushf(a, "--servers=%d", ts_job_ps_processes(job));
    ts_argv_pushf(a, "--heartbeat-ms=%d", p->heartbeat_ms);
    ts_argv_pushf(a, "--heartbeat-timeout-ms=%d", p->heartbeat_timeout_ms);
    ts_argv_pushf(a, "--barrier-timeout-ms=%d", p->barrier_timeout_ms);
    ts_argv_pushf(a, "--steps=%lld", (long long)job->steps);
    /* stand-in workers meet at barriers; the others resynchronise */
    ts_argv_pushf(a, "--change-at-boundary=%d", p->strategy == TS_STRATEGY_STANDIN);
}

void ts_cluster_node_args(ts_argv *a, const char *addr, const char *key_file,
                          const char *job_path, char *const *sets, int nsets) {
    ts_argv_push(a, "--scheduler");
    ts_argv_push(a, addr);
    ts_argv_push(a, "--key-file");
    ts_argv_push(a, key_file);
    ts_argv_push(a, "--job");
    ts_argv_push(a, job_path);
    for (int i = 0; i < nsets; i++) {
        ts_argv_push(a, "--set");
        ts_argv_push(a, sets[i]);
    }
}

static void drain_expired(uv_timer_t *t);

/* Ends the job as failed (first reason wins) and stops every child, after
 * settle_ms (so that the other nodes can report what they saw) or now. */
static void failv(cluster *cl, int code, unsigned settle_ms, const char *fmt,
                  va_list ap) {
    if (cl->phase == PHASE_FAILED) return;
    vsnprintf(cl->reason, sizeof cl->reason, fmt, ap);
    cl->phase = PHASE_FAILED;
    cl->exit_code = code;
    fprintf(stderr, "[run] stopping every process: %s\n", cl->reason); /* the job's end says it failed */
    if (settle_ms == 0) {
        ts_super_stop(&cl->super, cl->stop_signal, STOP_GRACE_MS);
    } else {
        uv_timer_stop(&cl->drain_timer);
        uv_timer_start(&cl->drain_timer, drain_expired, settle_ms, 0);
    }
}

/* Fails the job and stops everything now. */
static void fail(cluster *cl, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail(cluster *cl, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    failv(cl, code, 0, fmt, ap);
    va_end(ap);
}

/* Fails the job because a node failed: the others get SETTLE_MS to finish
 * reporting (a barrier error reaches every waiting rank at once). */
static void fail_node(cluster *cl, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void fail_node(cluster *cl, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    failv(cl, 1, SETTLE_MS, fmt, ap);
    va_end(ap);
}

/* " on n<i>" for a process placed on a virtual-cluster node, else "". */
static const char *where(const slot *sl, char *buf, size_t cap) {
    if (sl->node < 0) return "";
    snprintf(buf, cap, " on n%d", sl->node);
    return buf;
}

/* Starts prog with args (NULL-terminated) as slot sl's process: directly, or
 * on its node through "tessera-netsim exec". NULL with a message on failure. */
static ts_child *spawn_slot(cluster *cl, slot *sl, const char *prog,
                            char *const *args) {
    if (sl->node < 0) return ts_super_spawn(&cl->super, sl->role, sl->rank, prog, args);
    ts_argv a = {0};
    ts_argv_push(&a, "--name");
    ts_argv_push(&a, cl->netsim->name);
    ts_argv_push(&a, "exec");
    ts_argv_pushf(&a, "n%d", sl->node);
    ts_argv_pushf(&a, "%s/%s", cl->super.bin_dir, prog);
    for (int i = 0; args[i]; i++) ts_argv_push(&a, args[i]);
    ts_child *c = NULL;
    if (ts_argv_ok(&a))
        c = ts_super_spawn(&cl->super, sl->role, sl->rank, "tessera-netsim", a.v);
    else
        ts_error(TS_ERR_MEMORY, "tessera-run: out of memory");
    ts_argv_free(&a);
    return c;
}

/* Starts (or restarts) the ps or worker of slot sl. */
static void spawn_node(cluster *cl, slot *sl) {
    ts_argv a = {0};
    ts_cluster_node_args(&a, cl->addr, cl->key_file, cl->job_path,
                         cl->o->sets, cl->o->nsets);
    ts_argv_push(&a, "--run-dir");
    ts_argv_push(&a, cl->run_dir);
    if (sl->node >= 0) /* it binds its own node's address */
        ts_argv_pushf(&a, "--set=parallel.bind=%s", cl->netsim->addr[sl->node]);
    if (sl->rank >= 0) ts_argv_pushf(&a, "--rank=%d", sl->rank);
    /* a restarted ps, a restarted worker of an all-reduce job (a group that
     * lives on hands it the state it trained to; with none left alive, it
     * goes on from the newest checkpoint instead of from the first step) and
     * every worker of a restarted pipeline take their checkpoint */
    int strategy = cl->o->job.parallel.strategy, restarted = sl->rank >= 0;
    int all_reduce = strategy == TS_STRATEGY_DDP || strategy == TS_STRATEGY_FSDP;
    if (cl->o->resume || (sl->role == TS_ROLE_PS && restarted) ||
        (sl->role == TS_ROLE_WORKER && (cl->resume_workers || (restarted && all_reduce))))
        ts_argv_push(&a, "--resume");
    if (sl->role == TS_ROLE_WORKER && cl->o->force) ts_argv_push(&a, "--force");
    ts_child *c = NULL;
    if (ts_argv_ok(&a)) {
        const char *prog = sl->role == TS_ROLE_PS ? "tessera-ps" : "tessera-worker";
        c = spawn_slot(cl, sl, prog, a.v);
    } else {
        ts_error(TS_ERR_MEMORY, "tessera-run: out of memory");
    }
    ts_argv_free(&a);
    sl->child = c;
    sl->joined = 0;
    sl->declared_dead = 0;
    if (c) {
        char on[32];
        c->user = sl;
        if (sl->rank >= 0)
            fprintf(stderr, "[run] %s %d: restarted as pid %d%s\n",
                    ts_proto_role_name(sl->role), sl->rank, c->proc.pid,
                    where(sl, on, sizeof on));
    } else {
        fail(cl, 1, "%s", ts_last_error());
    }
}

/* Writes text to path atomically (temporary file + rename). */
static int write_atomic(const char *path, const char *text) {
    char tmp[PATH_MAX + 64];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return -1;
    int ok = fputs(text, f) >= 0;
    ok = (fclose(f) == 0) && ok;
    return ok && rename(tmp, path) == 0 ? 0 : -1;
}

/* The scheduler told us where it listens: record it, start the nodes. */
static void scheduler_ready(cluster *cl, const char *endpoint) {
    snprintf(cl->addr, sizeof cl->addr, "%s", endpoint);
    uv_timer_stop(&cl->startup_timer);
    char path[PATH_MAX + 32], text[TS_PROTO_ADDR_MAX + 2];
    snprintf(path, sizeof path, "%s/scheduler.addr", cl->run_dir);
    snprintf(text, sizeof text, "%s\n", cl->addr);
    if (write_atomic(path, text) != 0)
        fprintf(stderr, "[run] warning: cannot write %s: %s\n", path,
                strerror(errno));
    fprintf(stderr, "[run] scheduler at %s; starting %d ps and %d workers\n",
            cl->addr, ts_job_ps_processes(&cl->o->job), cl->o->job.parallel.workers);
    cl->phase = PHASE_RUNNING;
    for (int i = 0; i < ts_job_ps_processes(&cl->o->job) && cl->phase == PHASE_RUNNING; i++)
        spawn_node(cl, &cl->ps[i]);
    for (int i = 0; i < cl->o->job.parallel.workers && cl->phase == PHASE_RUNNING; i++)
        spawn_node(cl, &cl->workers[i]);
}

/* The scheduler declared ROLE rank dead ("dead ps 1"): the process of
 * that rank that joined is out of the job for good (a partitioned one
 * that exits later does not fail the job); a stopped one (SIGSTOP) would
 * hold its place until the end, and is killed, so that it restarts like
 * one that died. (A restarted process of the rank, running and not joined
 * yet, is neither.) */
static void on_declared_dead(cluster *cl, const char *role, int rank) {
    for (ts_child *c = cl->super.children; c; c = c->next) {
        slot *sl = c->user;
        if (c->role == TS_ROLE_SCHEDULER || c->rank != rank || strcmp(ts_proto_role_name(c->role), role) != 0)
            continue;
        if (sl->joined) sl->declared_dead = 1;
        if (!ts_super_stopped(c)) continue;
        fprintf(stderr, "[run] the scheduler declared %s %d dead and its process %d is stopped: killing it\n", role,
                rank, c->proc.pid);
        ts_super_signal(c, SIGKILL);
    }
}

static int on_line(ts_child *c, const char *line) {
    cluster *cl = c->super->user;
    slot *sl = c->user;
    if (c->role == TS_ROLE_SCHEDULER) {
        char role[16];
        int rank;
        if (cl->addr[0] == '\0' && cl->phase == PHASE_STARTING &&
            strncmp(line, "listening ", 10) == 0)
            scheduler_ready(cl, line + 10);
        else if (sscanf(line, "dead %15s %d", role, &rank) == 2)
            on_declared_dead(cl, role, rank);
        else if (strncmp(line, "stopped ", 8) == 0)
            cl->saved = 1;
    } else if (sl) {
        int rank;
        if (sscanf(line, "joined rank=%d", &rank) == 1 && rank >= 0) {
            char on[32];
            c->rank = sl->rank = rank;
            sl->joined = 1;
            fprintf(stderr, "[run] %s rank %d is pid %d%s\n", ts_proto_role_name(c->role),
                    rank, c->proc.pid, where(sl, on, sizeof on));
        }
    }
    return 1;
}

/* True when no ps or worker process is running any more. */
static int nodes_gone(const cluster *cl) {
    for (int i = 0; i < ts_job_ps_processes(&cl->o->job); i++)
        if (cl->ps[i].child) return 0;
    for (int i = 0; i < cl->o->job.parallel.workers; i++)
        if (cl->workers[i].child) return 0;
    return 1;
}

/* How long the nodes may take to exit by themselves once the job ended:
 * the workers still write the final checkpoint and run the final
 * evaluation, as long as the job's barrier timeout allows. */
static int drain_ms(const cluster *cl) {
    int barrier = (int)cl->o->job.parallel.barrier_timeout_ms;
    return cl->phase == PHASE_DONE && barrier > DRAIN_MS ? barrier : DRAIN_MS;
}

static void drain_expired(uv_timer_t *t) {
    cluster *cl = t->data;
    if (cl->phase == PHASE_RUNNING) {
        fail(cl, 1, "every node finished but the scheduler did not exit within %d ms",
             DRAIN_MS);
    } else if (cl->phase == PHASE_FAILED) {
        ts_super_stop(&cl->super, cl->stop_signal, STOP_GRACE_MS);
    } else if (ts_super_live(&cl->super) > 0) {
        fprintf(stderr, "[run] warning: stopping the processes still running "
                        "%d ms after the job ended\n", drain_ms(cl));
        ts_super_stop(&cl->super, cl->stop_signal, STOP_GRACE_MS);
    }
}

static void startup_expired(uv_timer_t *t) {
    cluster *cl = t->data;
    fail(cl, 1, "scheduler did not report its address within %d ms",
         STARTUP_TIMEOUT_MS);
}

/* Number of worker processes running now. */
static int workers_running(const cluster *cl) {
    int n = 0;
    for (int i = 0; i < cl->o->job.parallel.workers; i++)
        if (cl->workers[i].child) n++;
    return n;
}

/* Starts every worker of a stopped pipeline again, from the checkpoints. */
static void respawn_pipeline(cluster *cl) {
    cl->regrouping = 0;
    cl->resume_workers = 1;
    fprintf(stderr, "[run] starting the %d workers of the pipeline again\n", cl->o->job.parallel.workers);
    for (int i = 0; i < cl->o->job.parallel.workers && cl->phase == PHASE_RUNNING; i++)
        spawn_node(cl, &cl->workers[i]);
}

/* Whether the scheduler still lists a live worker (one that died is
 * listed until its heartbeat timeout has passed there; a restarted worker
 * gets its rank back only after that). */
static int scheduler_lists_workers(cluster *cl) {
    ts_proto_msg r;
    if (ts_member_status_query(cl->addr, cl->key_file, STATUS_WAIT_MS, &r) != TS_OK) return 0;
    int alive = 0;
    for (size_t i = 0; i < r.nroster; i++) alive += r.roster[i].role == TS_ROLE_WORKER && r.roster[i].alive;
    ts_proto_msg_free(&r);
    return alive > 0;
}

/* Regrouping a pipeline: the workers that outlived the timeout are killed;
 * once none runs and the scheduler has declared the dead ones dead (their
 * ranks are free again), the pipeline starts again. */
static void regroup_expired(uv_timer_t *t) {
    cluster *cl = t->data;
    if (workers_running(cl) == 0) {
        if (scheduler_lists_workers(cl) && uv_now(&cl->loop) < cl->regroup_deadline) {
            uv_timer_start(&cl->regroup_timer, regroup_expired, (uint64_t)cl->o->job.parallel.heartbeat_ms, 0);
            return;
        }
        respawn_pipeline(cl);
        return;
    }
    for (int i = 0; i < cl->o->job.parallel.workers; i++)
        if (cl->workers[i].child) {
            fprintf(stderr, "[run] worker %d has not stopped; killing it\n", cl->workers[i].rank);
            ts_super_signal(cl->workers[i].child, SIGKILL);
        }
}

/* A worker of a pipeline failed: a pipeline cannot go on without one of
 * its stages, and the others stop by themselves within the heartbeat
 * timeout (or are killed after twice that and the barrier timeout); once
 * every worker has exited and the scheduler has declared the dead ones
 * dead, all of them start again from the run's last checkpoint (one
 * restart of parallel.max_restarts). */
static void restart_pipeline(cluster *cl, const char *what, const char *reason) {
    const ts_job_parallel *p = &cl->o->job.parallel;
    if (!cl->regrouping) {
        if (cl->restarts_used >= p->max_restarts) {
            fail_node(cl, "%s, restart budget %d used up%s", what, p->max_restarts, reason);
            return;
        }
        cl->restarts_used++;
        cl->regrouping = 1;
        snprintf(cl->regroup_what, sizeof cl->regroup_what, "%s", what);
        fprintf(stderr, "[run] %s%s; a pipeline cannot go on without a stage: restarting every stage from the "
                        "last checkpoint once all have stopped (restart %d of %d)\n",
                what, reason, cl->restarts_used, p->max_restarts);
        uv_timer_start(&cl->regroup_timer, regroup_expired,
                       2 * (uint64_t)p->heartbeat_timeout_ms + (uint64_t)p->barrier_timeout_ms, 0);
    } else {
        fprintf(stderr, "[run] %s%s\n", what, reason);
    }
    if (workers_running(cl) > 0) return;
    /* a worker that died is declared dead by the scheduler a heartbeat
     * timeout after its last heartbeat (later on a loaded machine): its rank
     * is free after that; the restart waits for it, up to the barrier
     * timeout */
    fprintf(stderr, "[run] every stage stopped; the pipeline starts again once the scheduler has let them go\n");
    cl->regroup_deadline = (double)uv_now(&cl->loop) + p->heartbeat_timeout_ms + p->barrier_timeout_ms;
    uv_timer_stop(&cl->regroup_timer);
    uv_timer_start(&cl->regroup_timer, regroup_expired, (uint64_t)p->heartbeat_ms, 0);
}

/* The job ended: a ps or worker that never joined it (one that came late,
 * on a loaded machine, or a restarted one that had not joined again) has
 * nothing to finish, and is stopped now instead of after the drain. */
static void stop_unjoined(cluster *cl) {
    for (ts_child *c = cl->super.children; c; c = c->next) {
        const slot *sl = c->user;
        if (c->role == TS_ROLE_SCHEDULER || sl->joined) continue;
        char name[64];
        ts_super_name(c, name, sizeof name);
        fprintf(stderr, "[run] %s never joined the job, which has ended: stopping it\n", name);
        ts_super_signal(c, SIGTERM);
    }
}

/* A node failed on its own after the job's last step, or a pipeline's
 * restart was pending when the job ended: the job's final checkpoint or
 * evaluation may be missing, so it does not complete (first reason wins).
 * The others go on with theirs. */
static void note_unfinished(cluster *cl, const char *what, const char *reason) {
    if (cl->unfinished[0]) return;
    snprintf(cl->unfinished, sizeof cl->unfinished, "%s after the job's last step%s", what, reason);
    fprintf(stderr, "[run] %s\n", cl->unfinished);
}

static void on_done(ts_child *c) {
    cluster *cl = c->super->user;
    slot *sl = c->user;
    char what[256], reason[TS_LINE_MAX + 512];
    ts_super_describe_exit(c, what, sizeof what);
    /* its last stderr line says why it exited, or crashed; not why it was killed from outside */
    bool killed = c->term_signal == SIGKILL || c->term_signal == SIGTERM || c->term_signal == SIGINT;
    if (c->last_err[0] && !killed)
        snprintf(reason, sizeof reason, ": %s", c->last_err);
    else
        reason[0] = '\0';
    int ok = c->term_signal == 0 && c->exit_status == 0;
    sl->child = NULL;
    sl->finished = ok;

    if (sl->role == TS_ROLE_SCHEDULER) {
        if (ok && cl->phase != PHASE_FAILED) {
            cl->phase = PHASE_DONE;
            if (cl->regrouping) note_unfinished(cl, cl->regroup_what, ", before the pipeline restarted");
            stop_unjoined(cl);
        } else if (cl->phase == PHASE_STARTING || cl->phase == PHASE_RUNNING) {
            fail(cl, cl->interrupted ? 128 + cl->interrupted : 1, "%s%s", what, reason);
        }
    } else if (!ok && cl->phase == PHASE_RUNNING && !cl->interrupted) {
        const ts_job_parallel *p = &cl->o->job.parallel;
        if (sl->role == TS_ROLE_WORKER && p->strategy == TS_STRATEGY_PIPELINE) {
            restart_pipeline(cl, what, reason);
        } else if (cl->restarts_used < p->max_restarts) {
            cl->restarts_used++;
            fprintf(stderr, "[run] %s%s; restarting it (restart %d of %d)\n",
                    what, reason, cl->restarts_used, p->max_restarts);
            spawn_node(cl, sl);
        } else if (sl->role == TS_ROLE_WORKER && workers_running(cl) >= p->min_workers) {
            fprintf(stderr,
                    "[run] %s, restart budget %d used up; the job goes on with "
                    "%d workers (min_workers %d)\n",
                    what, p->max_restarts, workers_running(cl), p->min_workers);
        } else if (sl->role == TS_ROLE_WORKER) {
            fail_node(cl, "%s, restart budget %d used up%s", what, p->max_restarts,
                      reason);
        } else if (sl->role == TS_ROLE_PS && p->ps_replicas > 1) {
            fprintf(stderr, "[run] %s, restart budget %d used up; its shard goes on "
                            "with its replica\n", what, p->max_restarts);
        } else {
            fail_node(cl, "%s%s", what, reason);
        }
    } else if (!ok && cl->phase == PHASE_DONE && sl->joined && !cl->super.stopping) {
        if (sl->declared_dead) /* the job went on and ended without it */
            fprintf(stderr, "[run] %s after the job's last step%s; the scheduler had declared it dead: "
                            "the job ended without it\n", what, reason);
        else
            note_unfinished(cl, what, reason);
    }
    /* the scheduler ended the job, or every node finished: give the rest
     * time to exit by themselves */
    if ((cl->phase == PHASE_DONE || (cl->phase == PHASE_RUNNING && nodes_gone(cl) && !cl->regrouping)) &&
        !uv_is_active((uv_handle_t *)&cl->drain_timer))
        uv_timer_start(&cl->drain_timer, drain_expired, (uint64_t)drain_ms(cl), 0);
}

static const char *signal_name(int signum) { return signum == SIGINT ? "SIGINT" : "SIGTERM"; }

/* How long a stopping job may take: the scheduler's time for the
 * workers, then its own drain. */
static int stop_ms(const cluster *cl) {
    const ts_job_parallel *p = &cl->o->job.parallel;
    return (int)(p->heartbeat_timeout_ms + p->barrier_timeout_ms) + DRAIN_MS;
}

static void stop_expired(uv_timer_t *t) {
    cluster *cl = t->data;
    if (cl->phase == PHASE_RUNNING)
        fail(cl, 128 + cl->interrupted, "interrupted by %s: the job did not stop within %d ms",
             signal_name(cl->interrupted), stop_ms(cl));
}

/* Whether a pipeline is still being put together: a stage process runs
 * that has not joined (yet, or again after a restart). A stage that did
 * cannot take a step without the others, which the stopping job refuses. */
static int pipeline_assembling(const cluster *cl) {
    if (cl->o->job.parallel.strategy != TS_STRATEGY_PIPELINE) return 0;
    if (cl->regrouping) return 1;
    for (int i = 0; i < cl->o->job.parallel.workers; i++)
        if (cl->workers[i].child && !cl->workers[i].joined) return 1;
    return 0;
}

/* The first signal while the job runs goes to the scheduler alone: the
 * workers stop after a step they all take and save it there
 * (scheduler/stop.c), and the scheduler ends the job. Before that, while
 * a pipeline is put together (at the start or after a restart), after the
 * scheduler ended the job (the final checkpoint and evaluation), or at a
 * second signal every process is stopped (the second: killed). */
static void on_signal(ts_super *s, int signum) {
    cluster *cl = s->user;
    if (cl->phase == PHASE_FAILED || s->stopping || cl->interrupted) {
        fprintf(stderr, "[run] second signal: killing every process now\n");
        for (ts_child *c = s->children; c; c = c->next) ts_super_signal(c, SIGKILL);
        return;
    }
    cl->stop_signal = signum; /* forwarded as it came */
    if (cl->phase == PHASE_DONE) { /* the workers write the final checkpoint and evaluate */
        cl->interrupted = signum;
        cl->late = 1;
        fprintf(stderr, "[run] %s after the job's last step: stopping its final checkpoint and evaluation\n",
                signal_name(signum));
        ts_super_stop(&cl->super, signum, STOP_GRACE_MS);
        return;
    }
    if (cl->phase == PHASE_RUNNING && cl->sched.child && !pipeline_assembling(cl)) {
        cl->interrupted = signum;
        fprintf(stderr, "[run] %s: the workers stop after a step they all take and save a checkpoint there; "
                        "a second signal kills every process\n", signal_name(signum));
        ts_super_signal(cl->sched.child, signum);
        uv_timer_start(&cl->stop_timer, stop_expired, (uint64_t)stop_ms(cl), 0);
        return;
    }
    fail(cl, 128 + signum, "interrupted by %s", signal_name(signum));
}

/* Draws the run's metrics.png when its workers wrote metrics (a stand-in
 * job writes none) and says where. */
static void draw_chart(const char *run_dir) {
    char path[PATH_MAX + 32], png[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    if (access(path, R_OK) == 0 && ts_launch_plot(run_dir, png, sizeof png) == 0)
        fprintf(stderr, "[run] chart: %s\n", png);
}

/* What an interrupted job leaves to go on from, into out (cap bytes): its
 * run folder's newest checkpoint and the command to resume it, or that
 * the folder holds none. */
static void resume_hint(const cluster *cl, char *out, size_t cap) {
    char root[PATH_MAX + 32], path[PATH_MAX + 64];
    int64_t step = -1;
    snprintf(root, sizeof root, "%s/checkpoints", cl->run_dir);
    if (ts_checkpoint_latest(root, path, sizeof path, &step) == TS_OK && step >= 0)
        snprintf(out, cap, "the newest checkpoint, of step %lld, is %s: go on from it with --resume --run-dir %s",
                 (long long)step, path, cl->run_dir);
    else
        snprintf(out, cap, "the run folder %s holds no checkpoint", cl->run_dir);
}

/* Creates the run folder into cl->run_dir. */
static ts_status make_run_dir(cluster *cl) {
    if (cl->o->run_dir) {
        snprintf(cl->run_dir, sizeof cl->run_dir, "%s", cl->o->run_dir);
        return ts_io_make_run_dir(cl->run_dir);
    }
    if (mkdir("runs", 0755) != 0 && errno != EEXIST)
        return ts_error(TS_ERR_IO, "cannot create runs/: %s",
                        strerror(errno));
    char stamp[32];
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    for (int n = 1; n < 1000; n++) {
        if (n == 1)
            snprintf(cl->run_dir, sizeof cl->run_dir, "runs/%s-%s", cl->o->job.name,
                     stamp);
        else
            snprintf(cl->run_dir, sizeof cl->run_dir, "runs/%s-%s-%d",
                     cl->o->job.name, stamp, n);
        if (mkdir(cl->run_dir, 0755) == 0) return TS_OK;
        if (errno != EEXIST) break;
    }
    return ts_error(TS_ERR_IO, "run folder %s: cannot create it: %s", cl->run_dir,
                    strerror(errno));
}

/* With TESSERA_NETSIM set: loads the virtual cluster and puts every slot
 * on its node (and says where). */
static ts_status place(cluster *cl) {
    const ts_job_parallel *p = &cl->o->job.parallel;
    const char *name = getenv("TESSERA_NETSIM");
    if (!name || !name[0]) {
        if (p->placement.n > 0)
            return ts_error(TS_ERR_VALUE, "parallel.placement: needs a virtual "
                            "cluster (TESSERA_NETSIM, see tessera-netsim run)");
        return TS_OK;
    }
    cl->netsim = malloc(sizeof *cl->netsim);
    if (!cl->netsim) return ts_error(TS_ERR_MEMORY, "out of memory");
    ts_status st = ts_netsim_load(name, &p->placement, cl->netsim);
    if (st != TS_OK) return st;
    int k = 0;
    cl->sched.node = ts_netsim_node(cl->netsim, &p->placement, k++);
    fprintf(stderr, "[run] on virtual cluster %s (%d nodes): scheduler n%d", name,
            cl->netsim->n, cl->sched.node);
    for (int i = 0; i < ts_job_ps_processes(&cl->o->job); i++) {
        cl->ps[i].node = ts_netsim_node(cl->netsim, &p->placement, k++);
        fprintf(stderr, "%s n%d", i ? "" : ", ps", cl->ps[i].node);
    }
    for (int i = 0; i < p->workers; i++) {
        cl->workers[i].node = ts_netsim_node(cl->netsim, &p->placement, k++);
        fprintf(stderr, "%s n%d", i ? "" : ", workers", cl->workers[i].node);
    }
    fprintf(stderr, "\n");
    return TS_OK;
}

ts_status ts_cluster_write_job(const char *run_dir, const ts_job *job) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/job.json", run_dir);
    json_t *doc = ts_job_to_json(job);
    if (!doc) return ts_error(TS_ERR_MEMORY, "write %s: out of memory", path);
    ts_status st = ts_io_atomic_write_json(path, doc, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(doc);
    return st;
}

/* Run folder, resolved job.json, key file, placement. */
static ts_status prepare(cluster *cl) {
    const ts_job *job = &cl->o->job;
    ts_status st = place(cl);
    if (st != TS_OK) return st;
    if (!realpath(cl->o->job_path, cl->job_path))
        return ts_error(TS_ERR_IO, "%s: %s", cl->o->job_path,
                        strerror(errno));
    st = make_run_dir(cl);
    if (st == TS_OK) st = ts_io_lock_run_dir(cl->run_dir, &cl->lock_fd);
    if (st != TS_OK) return st;

    if ((st = ts_cluster_write_job(cl->run_dir, job)) != TS_OK) return st;

    if (job->parallel.key_file[0]) {
        snprintf(cl->key_file, sizeof cl->key_file, "%s", job->parallel.key_file);
        ts_secure_keys keys;
        return ts_secure_load(cl->key_file, &keys);
    }
    snprintf(cl->key_file, sizeof cl->key_file, "%s/job.key", cl->run_dir);
    if (unlink(cl->key_file) != 0 && errno != ENOENT) /* a reused --run-dir */
        return ts_error(TS_ERR_IO, "cannot replace %s: %s",
                        cl->key_file, strerror(errno));
    return ts_secure_keygen(cl->key_file, NULL);
}

/* Starts the scheduler child. */
static ts_status start_scheduler(cluster *cl) {
    ts_argv a = {0};
    char endpoint[TS_JOB_BIND_MAX + 16], on[32];
    snprintf(endpoint, sizeof endpoint, "tcp://%s:0",
             cl->sched.node >= 0 ? cl->netsim->addr[cl->sched.node]
                                 : cl->o->job.parallel.bind);
    ts_cluster_scheduler_args(&a, &cl->o->job, endpoint, cl->key_file);
    if (!ts_argv_ok(&a)) {
        ts_argv_free(&a);
        return ts_error(TS_ERR_MEMORY, "tessera-run: out of memory");
    }
    ts_child *c = spawn_slot(cl, &cl->sched, "tessera-scheduler", a.v);
    ts_argv_free(&a);
    if (!c) return ts_last_status();
    c->user = &cl->sched;
    cl->sched.child = c;
    fprintf(stderr, "[run] scheduler is pid %d%s\n", c->proc.pid,
            where(&cl->sched, on, sizeof on));
    uv_timer_start(&cl->startup_timer, startup_expired, STARTUP_TIMEOUT_MS, 0);
    return TS_OK;
}

int ts_cluster_run(const ts_cluster_opts *o) {
    const ts_job_parallel *p = &o->job.parallel;
    int nps = ts_job_ps_processes(&o->job);
    cluster *cl = calloc(1, sizeof *cl);
    slot *slots = calloc((size_t)(nps + p->workers), sizeof *slots);
    if (!cl || !slots) {
        fprintf(stderr, "tessera-run: out of memory\n");
        free(cl);
        free(slots);
        return 1;
    }
    cl->o = o;
    cl->lock_fd = -1;
    cl->stop_signal = SIGTERM;
    cl->ps = slots;
    cl->workers = slots + nps;
    cl->sched = (slot){.role = TS_ROLE_SCHEDULER, .rank = -1, .node = -1};
    for (int i = 0; i < nps; i++) cl->ps[i] = (slot){.role = TS_ROLE_PS, .rank = -1, .node = -1};
    for (int i = 0; i < p->workers; i++)
        cl->workers[i] = (slot){.role = TS_ROLE_WORKER, .rank = -1, .node = -1};

    int code = 1;
    ts_status st = prepare(cl);
    if (st != TS_OK) {
        fprintf(stderr, "tessera-run: %s\n", ts_last_error());
        goto out;
    }
    uv_loop_init(&cl->loop);
    st = ts_super_init(&cl->super, &cl->loop);
    if (st != TS_OK) {
        fprintf(stderr, "%s\n", ts_last_error());
        uv_loop_close(&cl->loop);
        goto out;
    }
    char log_path[PATH_MAX + 32];
    snprintf(log_path, sizeof log_path, "%s/cluster.log", cl->run_dir);
    ts_super_open_log(&cl->super, log_path); /* the job goes on without it */
    cl->super.user = cl;
    cl->super.on_line = on_line;
    cl->super.on_done = on_done;
    cl->super.on_signal = on_signal;
    uv_timer_init(&cl->loop, &cl->startup_timer);
    uv_timer_init(&cl->loop, &cl->drain_timer);
    uv_timer_init(&cl->loop, &cl->regroup_timer);
    uv_timer_init(&cl->loop, &cl->stop_timer);
    cl->startup_timer.data = cl->drain_timer.data = cl->regroup_timer.data = cl->stop_timer.data = cl;
    uv_unref((uv_handle_t *)&cl->startup_timer);
    uv_unref((uv_handle_t *)&cl->drain_timer);
    uv_unref((uv_handle_t *)&cl->regroup_timer);
    uv_unref((uv_handle_t *)&cl->stop_timer);

    fprintf(stderr, "[run] job %s (%s): %d ps, %d workers, %lld steps; run folder %s\n",
            o->job.name, ts_job_strategy_name(p->strategy), nps, p->workers,
            (long long)o->job.steps, cl->run_dir);
    if (start_scheduler(cl) != TS_OK) fail(cl, 1, "%s", ts_last_error());
    uv_run(&cl->loop, UV_RUN_DEFAULT);

    uv_close((uv_handle_t *)&cl->startup_timer, NULL);
    uv_close((uv_handle_t *)&cl->drain_timer, NULL);
    uv_close((uv_handle_t *)&cl->regroup_timer, NULL);
    uv_close((uv_handle_t *)&cl->stop_timer, NULL);
    ts_super_close(&cl->super);
    uv_loop_close(&cl->loop);
    if (cl->super.log) fclose(cl->super.log);

    char hint[2 * PATH_MAX + 160];
    resume_hint(cl, hint, sizeof hint);
    if (cl->phase == PHASE_FAILED) {
        bool signalled = cl->exit_code > 128; /* stopped by SIGINT / SIGTERM */
        fprintf(stderr, "[run] job %s failed: %s (run folder %s)%s%s\n", o->job.name, cl->reason, cl->run_dir,
                signalled ? "; " : "", signalled ? hint : "");
        code = cl->exit_code;
    } else if (cl->unfinished[0] && !cl->interrupted) {
        fprintf(stderr, "[run] job %s failed: %s; its final checkpoint or evaluation may be missing (run folder %s; "
                        "go on with --resume --run-dir %s)\n", o->job.name, cl->unfinished, cl->run_dir, cl->run_dir);
        code = 1;
    } else if (cl->late) {
        fprintf(stderr, "[run] job %s interrupted by %s after its last step, in its final checkpoint or "
                        "evaluation (run folder %s)\n", o->job.name, signal_name(cl->interrupted), cl->run_dir);
        code = 128 + cl->interrupted;
    } else if (cl->interrupted && cl->saved) {
        draw_chart(cl->run_dir);
        fprintf(stderr, "[run] job %s interrupted by %s: its workers stopped and saved a checkpoint "
                        "(run folder %s; go on with --resume --run-dir %s)\n",
                o->job.name, signal_name(cl->interrupted), cl->run_dir, cl->run_dir);
        code = 128 + cl->interrupted;
    } else if (cl->interrupted) {
        fprintf(stderr, "[run] job %s interrupted by %s: its workers saved nothing now (none was in the job yet, "
                        "or one had failed); %s\n",
                o->job.name, signal_name(cl->interrupted), hint);
        code = 128 + cl->interrupted;
    } else {
        draw_chart(cl->run_dir);
        fprintf(stderr, "[run] job %s completed (run folder %s)\n", o->job.name,
                cl->run_dir);
        code = 0;
    }
out:
    if (cl->lock_fd >= 0) close(cl->lock_fd);
    free(cl->netsim);
    free(slots);
    free(cl);
    return code;
}
