/* sched.h - the Tessera scheduler as a library (tessera-scheduler's core).
 *
 * ts_sched_create() loads the job key file, starts the ZAP gate, binds a
 * CURVE ROUTER socket at cfg->bind and prepares a libuv loop around it;
 * ts_sched_run() serves the conversation described in scheduler/README.md
 * (rendezvous, heartbeats and failure detection, generations, elastic join
 * at step boundaries, barriers, blob relay, status, shutdown) until the job
 * ends, SIGINT/SIGTERM arrives or the rendezvous times out. The scheduler is
 * single-threaded apart from the ZAP handler; it never exits on bad input.
 */
#ifndef TS_SCHED_H
#define TS_SCHED_H

#include "kernels/status.h"
#include "scheduler/config.h"

typedef struct ts_sched ts_sched;

/* Builds a scheduler bound to cfg->bind; NULL with a message naming the key
 * file or endpoint on failure. */
ts_sched *ts_sched_create(const ts_sched_config *cfg);

/* The endpoint actually bound (port resolved), e.g. tcp://127.0.0.1:40123. */
const char *ts_sched_endpoint(const ts_sched *s);

/* Runs the event loop until the job ends; returns the process exit code
 * (0: job finished or stopped by a signal, 1: the job failed). */
int ts_sched_run(ts_sched *s);

/* Members declared dead so far (silent past the heartbeat timeout, or
 * evicted): processes that may still run, stopped, which the scheduler
 * cannot end; their supervisor ends them once the job is over. */
int ts_sched_declared_dead(const ts_sched *s);

/* Closes the socket, stops the ZAP gate and frees everything. NULL is fine. */
void ts_sched_destroy(ts_sched *s);

#endif
