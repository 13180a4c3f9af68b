/* node.h - one worker process of a job, from start to exit status.
 *
 * ts_worker_run() is what tessera-worker, tessera-run's local mode and each
 * worker rank under mpirun do: first it refuses a model that does not fit in
 * memory (worker/fit.h) unless forced; without a scheduler it trains the job in this
 * process (strategy "local"); with one it joins the job (asking again while
 * a restarted worker's old rank is still held), makes the job's strategy on
 * that membership, trains through it, reports its last step once the run
 * (final evaluation included) is over, and ends with the scheduler's
 * SHUTDOWN. SIGINT and SIGTERM stop after the current step with a
 * checkpoint.
 *
 * Output (stdout): in a job, "joined rank=R generation=G world=W
 * start_step=S" (tessera-run reads it) and at the end "shutdown (code C):
 * REASON" (on stderr when C is not 0, so that tessera-run's failure names
 * the reason, a silent scheduler among them); then the strategy's and the
 * trainer's lines.
 */
#ifndef TS_WORKER_NODE_H
#define TS_WORKER_NODE_H

#include <stdbool.h>
#include <stddef.h>

#include "proto/job.h"

typedef struct {
    const ts_job *job;
    const char *scheduler; /* endpoint; NULL: train alone in this process */
    const char *key_file;  /* with scheduler: the job key file */
    int rank;              /* rank asked for on a rejoin, -1 = any */
    const char *run_dir;   /* the run folder (see ts_worker_run_dir) */
    bool resume;           /* continue from the run folder's newest checkpoint */
    bool force;            /* skip the memory check (worker/fit.h) */
    const char *prog;      /* program name for messages */
    void *mpi_comm;        /* the workers' MPI_Comm * under mpirun, else NULL */
} ts_worker_options;

/* The run folder: given, else the job's train.run_dir, else runs/<name>
 * (runs/ is created). */
void ts_worker_run_dir(const ts_job *job, const char *given, char *dir, size_t cap);

/* Runs the worker to the end; returns the exit status: 0 when the job
 * finished, 1 when it failed (the reason on stderr), 130 when stopped by a
 * signal, or the code of the scheduler's SHUTDOWN. */
int ts_worker_run(const ts_worker_options *o);

#endif
