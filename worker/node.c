/* node.c - a worker process's life: join, make the strategy, train, leave. */
#include "worker/node.h"

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/clock.h"
#include "kernels/io/atomic.h"
#include "membership/member.h"
#include "worker/fit.h"
#include "worker/strategy.h"
#include "worker/trainer.h"

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig) {
    (void)sig;
    stop_requested = 1;
}

void ts_worker_run_dir(const ts_job *job, const char *given, char *dir, size_t cap) {
    if (given && given[0]) {
        snprintf(dir, cap, "%s", given);
    } else if (job->train.run_dir[0]) {
        snprintf(dir, cap, "%s", job->train.run_dir);
    } else {
        mkdir("runs", 0755);
        snprintf(dir, cap, "runs/%s", job->name);
    }
}

/* The job as complete JSON text (malloc'd), saved with every checkpoint. */
static char *job_text(const ts_job *job) {
    json_t *j = ts_job_to_json(job);
    char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    json_decref(j);
    return text;
}

/* Joins the job at o->scheduler. A restarted worker may ask for its old
 * rank before the scheduler has declared its old process dead (the job
 * looks full): it asks again until that must have happened. */
static ts_member *join(const ts_worker_options *o, const char *address) {
    const ts_job_parallel *p = &o->job->parallel;
    char caps[TS_PROTO_CAPS_MAX + 1];
    if (ts_job_caps(o->job, caps, sizeof caps)) {
        fprintf(stderr, "join failed: %s\n", ts_last_error());
        return NULL;
    }
    ts_member_options opt = {.scheduler = o->scheduler,
                             .job = o->job->name,
                             .key_file = o->key_file,
                             .role = TS_ROLE_WORKER,
                             .address = address[0] ? address : NULL,
                             .caps = caps,
                             .prev_rank = o->rank,
                             .timeout_ms = p->join_timeout_ms};
    ts_member *m = NULL;
    double give_up = ts_clock_ms() + 2.0 * p->heartbeat_timeout_ms + 1000;
    ts_status st;
    while ((st = ts_member_join(&opt, &m)) == TS_ERR_PEER && o->rank >= 0 && ts_clock_ms() < give_up) {
        fprintf(stderr, "join refused (%s); asking again\n", ts_last_error());
        ts_sleep_ms(p->heartbeat_ms);
    }
    if (st) {
        fprintf(stderr, "join failed: %s\n", ts_last_error());
        return NULL;
    }
    ts_member_info info;
    ts_member_info_get(m, &info);
    ts_proto_member *r = NULL;
    size_t n = 0;
    int world = 0;
    if (ts_member_roster(m, &r, &n, NULL) == TS_OK)
        for (size_t i = 0; i < n; i++) world += r[i].role == TS_ROLE_WORKER && r[i].alive;
    free(r);
    printf("joined rank=%d generation=%llu world=%d start_step=%lld\n", info.rank,
           (unsigned long long)info.generation, world, (long long)info.start_step);
    return m;
}

/* After the last step: waits (up to the heartbeat plus the barrier timeout)
 * for the scheduler's SHUTDOWN and returns its code. A failed job's reason
 * (code 1: a silent scheduler, ranks that did not stop) goes to stderr,
 * whose last line a launcher gives as the node's error. */
static int await_shutdown(ts_member *m) {
    ts_member_info info;
    ts_member_info_get(m, &info);
    double deadline = ts_clock_ms() + info.heartbeat_timeout_ms + info.barrier_timeout_ms;
    int code = 0;
    char reason[TS_PROTO_REASON_MAX + 1];
    while (!ts_member_shutdown_requested(m, &code, reason, sizeof reason)) {
        if (ts_clock_ms() > deadline) {
            fprintf(stderr, "no SHUTDOWN from the scheduler after the last step; leaving the job\n");
            ts_member_leave(m, "finished every step, no shutdown received");
            return 0;
        }
        ts_sleep_ms(5);
    }
    fprintf(code ? stderr : stdout, "shutdown (code %d): %s\n", code, reason);
    ts_member_close(m);
    return code;
}

int ts_worker_run(const ts_worker_options *o) {
    if (!o->force && ts_fit_check_here(o->job, 1)) {
        fprintf(stderr, "%s: %s\n", o->prog, ts_last_error());
        return 1;
    }
    ts_strategy_options so = {.job = o->job, .in_job = o->scheduler != NULL, .key_file = o->key_file,
                              .mpi_comm = o->mpi_comm};
    ts_strategy *s = ts_strategy_create(&so);
    ts_member *m = NULL;
    bool refused = false; /* the join failed and said why */
    /* a strategy whose units depend on the rank joins first; the others
     * build data and model first, so that they take part at once */
    if (s && s->join_first && o->scheduler) {
        if ((m = join(o, s->address))) {
            s->member = m;
        } else {
            ts_strategy_free(s);
            s = NULL;
            refused = true;
            ts_error(TS_ERR_PEER, "join failed");
        }
    }
    char *text = s ? job_text(o->job) : NULL;
    ts_trainer *t = s ? ts_trainer_create(o->job, text, o->run_dir, o->resume, s) : NULL;
    free(text);
    ts_status st = t ? TS_OK : ts_last_status();
    int lock = -1; /* a job of its own holds its run folder; a cluster's launcher holds it for its workers */
    if (!st && !o->scheduler && o->run_dir) st = ts_io_lock_run_dir(o->run_dir, &lock);
    if (!st && o->scheduler && !m && !(m = join(o, s->address))) {
        st = TS_ERR_PEER;
        refused = true;
    }
    if (!st) {
        s->member = m;
        st = ts_trainer_attach(t);
    }
    struct sigaction sa = {.sa_handler = on_signal};
    if (!o->mpi_comm) { /* under mpirun the scheduler's rank takes the signals and stops the job */
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
    }
    if (!st) st = ts_trainer_run(t, &stop_requested);
    int code = 0;
    if (refused) {
        code = 1;
    } else if (st) {
        fprintf(stderr, "%s: %s\n", o->prog, ts_last_error());
        code = stop_requested ? 130 : 1;
    } else if (m && !t->strategy->finished && t->strategy->stop_agreed) {
        ts_member_stopped(m, t->step); /* the job's STOP: saved, the job may end */
    } else if (m && !t->strategy->finished) {
        ts_member_step_done(m, t->step); /* done, evaluation included: the job may end */
    }
    ts_trainer_free(t);
    if (lock >= 0) close(lock);
    if (!m) return code;
    if (code) {
        ts_member_leave(m, code == 130 ? "stopped by a signal" : "training failed");
        return code;
    }
    return await_shutdown(m);
}
