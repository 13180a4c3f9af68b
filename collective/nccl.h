/* nccl.h - backend "nccl": the communicator over NCCL, for buffers in GPU
 * memory (TESSERA_WITH_NCCL builds only).
 *
 * ts_comm_create(&ts_comm_nccl_backend, cfg) makes an NCCL communicator of
 * cfg.size ranks on the CUDA device current in the calling thread
 * (cudaSetDevice first; a worker uses the GPU of its local rank). Rank 0
 * makes the ncclUniqueId and hands it to the others over the job's ZeroMQ
 * ring: cfg.native is this process's ts_ring_port and cfg.peers every
 * rank's port endpoint, as for the ring backend (a world of one rank needs
 * neither).
 *
 * Every operation's send and recv are device addresses on that GPU. They
 * run on the communicator's own CUDA stream, after the work queued on the
 * compute stream (runtime.h) when they start; the progress thread waits for
 * them by polling the stream's event and ncclCommGetAsyncError, so that an
 * operation whose peer died or went silent gives up after the timeout (or
 * when ts_comm_abort is called): the NCCL communicator is then aborted
 * (ncclCommAbort) and every later operation fails; rebuild for the next
 * generation. bf16 is reduced by NCCL (partial sums rounded between hops),
 * avg is NCCL's ncclAvg.
 */
#ifndef TS_COLLECTIVE_NCCL_H
#define TS_COLLECTIVE_NCCL_H

#include "collective/comm.h"

#if TESSERA_WITH_NCCL
extern const ts_comm_backend ts_comm_nccl_backend;
#endif

#endif
