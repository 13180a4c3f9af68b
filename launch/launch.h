/* launch.h - tessera-run's modes besides the local cluster (cluster.h).
 *
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

/* Prints the status of the job whose scheduler is at address (key file
 * key_file) to stdout. Returns the exit status (1 when refused or silent). */
int ts_launch_status(const char *address, const char *key_file);

/* Runs this MPI process's node of job o (role NULL = by MPI rank); argc/argv
 * go to MPI_Init. Returns the exit status. */
int ts_launch_mpi(const ts_cluster_opts *o, const char *role, int argc,
                  char **argv);

#endif
