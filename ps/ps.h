/* ps.h - one parameter-server process of a job, from start to exit status.
 *
 * ts_ps_run() is what tessera-ps and each ps rank under mpirun do: it binds
 * a CURVE ROUTER socket (tcp://<parallel.bind>:0), joins the job at the
 * scheduler as role ps with that endpoint as its address, takes shard
 * rank % parallel.servers of the key table (shard.h), restores the shard's
 * newest checkpoint when resuming, and serves the workers until the
 * scheduler's SHUTDOWN, after which it writes a last checkpoint.
 *
 * Replicas (parallel.ps_replicas 2): the processes of one shard form a
 * chain (sharding/keys.h: primary and backup). The primary decides the
 * order of everything that changes the shard - each worker request and
 * each change of the live workers - forwards it to the backup, and acts on
 * it only when the backup acknowledged it; a backup acts on what the
 * primary forwards and answers nobody else. When the scheduler declares
 * the primary dead the backup becomes primary with the same bits; workers
 * send it again what was not answered. A process that joins a shard with
 * a live primary (a restart) is a spare until it is the last one left.
 *
 * Output (stdout): "joined rank=R generation=G" (tessera-run reads it),
 * "shard K of S: keys [A, B) ...", role changes, checkpoints, and at the end
 * "shutdown (code C): REASON" with the shard's counts. Refused requests are
 * logged on stderr.
 */
#ifndef TS_PS_PS_H
#define TS_PS_PS_H

#include <stdbool.h>

#include "proto/job.h"

typedef struct {
    const ts_job *job;
    const char *scheduler; /* endpoint of the job's scheduler */
    const char *key_file;  /* the job key file */
    int rank;              /* rank asked for (a restart), -1 = any */
    const char *run_dir;   /* checkpoints go to <run_dir>/ps/shard-<k>; NULL: none */
    bool resume;           /* restore the shard's newest checkpoint */
} ts_ps_options;

/* Runs the process to the end; returns the exit status (the code of the
 * scheduler's SHUTDOWN, or 1 with the reason on stderr). */
int ts_ps_run(const ts_ps_options *o);

#endif
