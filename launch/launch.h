/* launch.h - tessera-run's modes besides the local cluster (cluster.h).
 *
 * ts_launch_join: tessera-run --join, one worker more for a running job.
 * ts_launch_status: one STATUS query to a running job's scheduler, printed
 * as a table (roster, generation, phase, last heartbeats).
 * ts_launch_mpi: the process's part of a job launched by mpirun; each MPI
 * process is one node (rank 0 the scheduler, the next parallel.servers ranks
 * ps, the rest workers, unless --role says otherwise), the scheduler address
 * and job key travel by MPI_Bcast. Built only with TESSERA_WITH_MPI; without
 * it ts_launch_mpi reports that and fails.
 */
#ifndef TS_LAUNCH_H
#define TS_LAUNCH_H

#include "launch/cluster.h"

/* --join: one more worker against the running job's scheduler. */
typedef struct {
    const char *address, *key_file;
    const char *job_path;
    char **sets;
    int nsets;
    int rank;              /* the rank asked for, -1 = any */
    bool force;            /* train even when the memory estimate exceeds what is available */
    const char *run_dir;   /* --run-dir or train.run_dir, else NULL */
    const ts_job *job;     /* job_path with the sets, loaded */
} ts_launch_join_opts;

/* Replaces this process with a tessera-worker that joins the job (returns
 * only on failure, with the exit status). Its run folder is o->run_dir,
 * else the key file's folder when it is a run folder (it holds
 * scheduler.addr), else the worker's default. A folder that is not the
 * job's (its job.key is not the key file) is refused for an fsdp worker,
 * which writes its shards of every checkpoint there (exit 2), and warned
 * of otherwise (the worker writes there should it come to lead). */
int ts_launch_join(const ts_launch_join_opts *o);

/* Prints the status of the job whose scheduler is at address (key file
 * key_file) to stdout. Returns the exit status (1 when refused or silent). */
int ts_launch_status(const char *address, const char *key_file);

/* Runs this MPI process's node of job o (role NULL = by MPI rank); argc/argv
 * go to MPI_Init. Returns the exit status. */
int ts_launch_mpi(const ts_cluster_opts *o, const char *role, int argc,
                  char **argv);

#endif
