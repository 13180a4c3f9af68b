/* harness.h - helpers for the scheduler tests: a temporary job directory
 * with a key file, the real tessera-scheduler binary started as a child
 * process (from $TESSERA_BIN_DIR), members joined on threads, and raw CURVE
 * DEALER sockets for speaking to the scheduler byte by byte. */
#ifndef TS_TEST_SCHED_HARNESS_H
#define TS_TEST_SCHED_HARNESS_H

#include <stdbool.h>
#include <sys/types.h>

#include "membership/member.h"
#include "proto/secure.h"

typedef struct {
    char dir[256];      /* temporary job directory */
    char key[320];      /* dir/job.key */
    char log[320];      /* dir/scheduler.log: the scheduler's stderr */
    char endpoint[512]; /* from the "listening ..." line */
    pid_t pid;
    ts_secure_keys keys;
} th_sched;

/* Makes the job directory and key file and starts tessera-scheduler with
 * "--bind tcp://127.0.0.1:0 --job test --key-file KEY" plus the given
 * NULL-terminated extra arguments; fails the test when it does not print
 * its endpoint within 10 s. */
void th_start(th_sched *s, ...);

/* Waits up to timeout_ms for the scheduler to exit; returns its exit status
 * (-1 when it did not exit, then it is killed). */
int th_wait_exit(th_sched *s, int timeout_ms);

/* SIGTERM twice (the second shuts down a job whose workers were asked to
 * stop), then th_wait_exit(5000); removes the job directory. */
int th_stop(th_sched *s);

/* Joins as role (TS_ROLE_PS / TS_ROLE_WORKER); NULL on failure. */
ts_member *th_join(const th_sched *s, ts_proto_role role, int prev_rank, int timeout_ms);

/* Joins n members on n threads at once (ps first, then workers, in the
 * order of roles[]); fails the test unless all join. */
void th_join_many(const th_sched *s, const ts_proto_role *roles, int n, ts_member **out);

/* True when the scheduler's log contains needle. */
bool th_log_contains(const th_sched *s, const char *needle);

/* A raw CURVE DEALER (job keys) connected to the scheduler, on ctx. */
void *th_raw_socket(void *ctx, const th_sched *s);

/* Milliseconds of CLOCK_MONOTONIC. */
long long th_now_ms(void);

#endif
