/* standin.c - the stand-in worker loop: compute, STEP_DONE, barrier. */
#include "worker/standin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "membership/member.h"
#include "kernels/rng.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void sleep_ms(double ms) {
    if (ms <= 0) return;
    long long ns = (long long)(ms * 1e6);
    struct timespec ts = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    nanosleep(&ts, NULL);
}

/* Workers in a roster. */
static int count_workers(const ts_proto_member *r, size_t n) {
    int w = 0;
    for (size_t i = 0; i < n; i++) w += r[i].role == TS_ROLE_WORKER && r[i].alive;
    return w;
}

/* Logs a new generation, if one was announced; updates *world. */
static void note_membership(ts_member *m, int *world) {
    uint64_t g;
    ts_proto_member *r = NULL;
    size_t n = 0;
    if (!ts_member_poll_membership(m, &g, &r, &n)) return;
    int w = count_workers(r, n);
    if (w != *world)
        printf("generation %llu: world size %d -> %d workers\n",
               (unsigned long long)g, *world, w);
    else
        printf("generation %llu: world size %d workers\n", (unsigned long long)g, w);
    *world = w;
    free(r);
}

/* The step's computation: mean square of size normal values keyed by
 * (seed, step, rank); about 1. */
static double compute(ts_key seed, int64_t step, int32_t rank, float *buf, int size) {
    ts_key key = ts_key_fold_in(ts_key_fold_in(seed, (uint64_t)step), (uint64_t)rank);
    ts_rng_normal_f32(key, 0, size, buf);
    double acc = 0;
    for (int i = 0; i < size; i++) acc += (double)buf[i] * buf[i];
    return acc / size;
}

/* Waits (up to wait_ms) for the scheduler's SHUTDOWN; returns the exit code. */
static int await_shutdown(ts_member *m, int *world, int wait_ms) {
    int code = 0;
    char reason[TS_PROTO_REASON_MAX + 1];
    double deadline = now_ms() + wait_ms;
    while (!ts_member_shutdown_requested(m, &code, reason, sizeof reason)) {
        if (now_ms() > deadline) {
            fprintf(stderr, "no SHUTDOWN from the scheduler %d ms after the last "
                            "step; leaving the job\n", wait_ms);
            ts_member_leave(m, "finished every step, no shutdown received");
            return 0;
        }
        note_membership(m, world);
        sleep_ms(5);
    }
    printf("shutdown (code %d): %s\n", code, reason);
    ts_member_close(m);
    return code;
}

int ts_worker_standin_run(const char *address, const char *key_file,
                          const ts_job *job, int rank) {
    ts_member_options opt = {
        .scheduler = address, .job = job->name, .key_file = key_file,
        .role = TS_ROLE_WORKER, .caps = "standin", .prev_rank = rank,
        .timeout_ms = job->parallel.join_timeout_ms};
    ts_member *m = NULL;
    /* A restarted worker may ask before the scheduler has declared its old
     * process dead (the job looks full): ask again until that must have
     * happened. */
    double give_up = now_ms() + 2.0 * job->parallel.heartbeat_timeout_ms + 1000;
    ts_status st;
    while ((st = ts_member_join(&opt, &m)) == TS_ERR_PEER && rank >= 0 &&
           now_ms() < give_up) {
        fprintf(stderr, "join refused (%s); asking again\n", ts_last_error());
        sleep_ms(job->parallel.heartbeat_ms);
    }
    if (st != TS_OK) {
        fprintf(stderr, "join failed: %s\n", ts_last_error());
        return 1;
    }
    ts_member_info info;
    ts_member_info_get(m, &info);
    ts_proto_member *r = NULL;
    size_t n = 0;
    int world = 0;
    if (ts_member_roster(m, &r, &n, NULL) == TS_OK) world = count_workers(r, n);
    free(r);
    printf("joined rank=%d generation=%llu world=%d start_step=%lld\n", info.rank,
           (unsigned long long)info.generation, world, (long long)info.start_step);
    ts_member_poll_membership(m, NULL, NULL, NULL); /* the join's own generation */

    float *buf = malloc((size_t)job->standin.size * sizeof *buf);
    if (!buf) {
        fprintf(stderr, "out of memory for %d values\n", job->standin.size);
        ts_member_leave(m, "out of memory");
        return 1;
    }
    ts_key seed = ts_key_from_seed((uint64_t)job->seed);
    int64_t steps = info.steps;
    int wait_ms = (int)(info.heartbeat_timeout_ms + info.barrier_timeout_ms);
    for (int64_t step = (info.start_step < 0 ? 0 : info.start_step) + 1;
         steps == 0 || step <= steps; step++) {
        if (ts_member_shutdown_requested(m, NULL, NULL, 0)) break;
        note_membership(m, &world);
        double t0 = now_ms();
        double value = compute(seed, step, info.rank, buf, job->standin.size);
        ts_member_step_done(m, step);
        printf("step %lld world %d value %.4f compute_ms %.2f\n", (long long)step,
               world, value, now_ms() - t0);
        st = ts_member_barrier(m, step, 0);
        if (st != TS_OK) {
            if (ts_member_shutdown_requested(m, NULL, NULL, 0)) break;
            fprintf(stderr, "barrier %lld failed: %s\n", (long long)step, ts_last_error());
            free(buf);
            ts_member_close(m);
            return 1;
        }
        sleep_ms(job->standin.step_ms - (now_ms() - t0));
    }
    free(buf);
    return await_shutdown(m, &world, wait_ms);
}
