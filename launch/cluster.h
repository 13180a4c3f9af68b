/* cluster.h - tessera-run's local cluster: one scheduler, S ps, W workers.
 *
 * ts_cluster_run() makes the run folder (job.json as resolved, job.key
 * unless parallel.key_file is given, scheduler.addr once known, cluster.log
 * with every child line), starts tessera-scheduler on port 0, reads its
 * "listening ENDPOINT" line, then starts the ps and worker processes,
 * supervises them (restarting failed nodes within parallel.max_restarts,
 * asking for their old rank; a restarted ps resumes from its checkpoint; a
 * pipeline, which cannot lose a stage, is restarted whole from the run's
 * last checkpoint once all of its workers have stopped)
 * and stops everything on completion or failure. SIGINT/SIGTERM while the
 * job runs goes to the scheduler, which has the workers stop after a step
 * they agree on and save it (exit 128 + the signal); a second one kills
 * every process. Every
 * exit path leaves no child running. With resume every node continues from
 * the checkpoints of run_dir.
 */
#ifndef TS_CLUSTER_H
#define TS_CLUSTER_H

#include <stdbool.h>

#include "launch/argv.h"
#include "proto/job.h"

typedef struct {
    const char *job_path;     /* the job file as given (children re-read it) */
    char *const *sets;        /* --set overrides, passed on to children */
    int nsets;
    const char *run_dir;      /* --run-dir or train.run_dir; NULL = runs/<name>-<timestamp> */
    bool resume;              /* continue the job in run_dir from its checkpoints */
    bool force;               /* workers train even when the memory estimate exceeds what is available */
    ts_job job;               /* the job, overrides applied */
} ts_cluster_opts;

/* Runs the job to its end; returns tessera-run's exit status (0 when the job
 * completed) after printing the outcome as the last "[run]" line. */
int ts_cluster_run(const ts_cluster_opts *o);

/* Scheduler flags for job (endpoint bind_endpoint, key file key_file),
 * appended to a. */
void ts_cluster_scheduler_args(ts_argv *a, const ts_job *job,
                               const char *bind_endpoint, const char *key_file);

/* Writes run_dir/job.json: job as resolved, every field, through a temp
 * file (a failure leaves an earlier one whole and names the reason). */
ts_status ts_cluster_write_job(const char *run_dir, const ts_job *job);

/* Flags of a node (ps or worker) joining the scheduler at addr, appended to
 * a: --scheduler ADDR --key-file KEY --job JOB [--set S]... */
void ts_cluster_node_args(ts_argv *a, const char *addr, const char *key_file,
                          const char *job_path, char *const *sets, int nsets);

#endif
