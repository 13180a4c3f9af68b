/* mpi.h - backend "mpi": the communicator over an MPI communicator, in
 * processes started by mpirun (TESSERA_WITH_MPI builds only).
 *
 * ts_comm_create(&ts_comm_mpi_backend, cfg) with cfg.native pointing at
 * the MPI_Comm whose rank and size are cfg.rank and cfg.size (MPI must be
 * initialised with MPI_THREAD_MULTIPLE, or at least SERIALIZED, since the
 * communicator's progress thread calls MPI). Operations are MPI's own,
 * given up after the communicator's timeout (see comm_mpi.c).
 */
#ifndef TS_COLLECTIVE_MPI_H
#define TS_COLLECTIVE_MPI_H

#include "collective/comm.h"

#if TESSERA_WITH_MPI
extern const ts_comm_backend ts_comm_mpi_backend;

/* MPI_Init_thread for a Tessera process: MPI_THREAD_MULTIPLE (the
 * communicator's progress thread calls MPI) and, unless the environment
 * says otherwise, Open MPI's ring algorithm for its non-blocking
 * all-reduce (the one its default picks for large buffers on 2 ranks runs
 * at 0.6x of MPI_Allreduce). Returns the thread level MPI provides. */
int ts_comm_mpi_init(int *argc, char ***argv);
#endif

/* This process's rank in the MPI_Comm at mpi_comm and its size, for
 * filling a ts_comm_config; TS_ERR_UNSUPPORTED in builds without MPI. */
ts_status ts_comm_mpi_place(void *mpi_comm, int *rank, int *size);

/* MPI_Comm_split of the MPI_Comm at mpi_comm (every process of it calls
 * it): *out points at a new MPI_Comm of the processes with the same color,
 * ranked by key; free it with ts_comm_mpi_free once its communicators are
 * freed. TS_ERR_UNSUPPORTED in builds without MPI. */
ts_status ts_comm_mpi_split(void *mpi_comm, int color, int key, void **out);

/* MPI_Comm_free of a communicator made by ts_comm_mpi_split; NULL is fine. */
void ts_comm_mpi_free(void *mpi_comm);

#endif
