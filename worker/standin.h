/* standin.h - the cluster stand-in loop of tessera-worker.
 *
 * Until the parallel strategies exist, a worker joins the job as role
 * worker, then for each step draws job->standin.size normal values (Philox,
 * keyed by seed, step and rank) and reduces them (a small real computation),
 * reports STEP_DONE and waits at the step's barrier; it logs every new
 * generation's world size and exits with the scheduler's code on SHUTDOWN.
 * A barrier that fails (some rank never reached it) ends the worker with
 * status 1 and the scheduler's reason on stderr.
 *
 * Output (stdout): "joined rank=R generation=G world=W start_step=S", one
 * line per step, one per generation change; tessera-run reads "joined".
 */
#ifndef TS_WORKER_STANDIN_H
#define TS_WORKER_STANDIN_H

#include "proto/job.h"

/* Runs the stand-in worker of job against the scheduler at address with the
 * key file; rank = the rank to ask for (rejoin), -1 = any. Returns the
 * process exit status. */
int ts_worker_standin_run(const char *address, const char *key_file,
                          const ts_job *job, int rank);

#endif
