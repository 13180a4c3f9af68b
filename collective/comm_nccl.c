/* comm_nccl.c - backend "nccl": the communicator over NCCL on device
 * buffers (see nccl.h). */
#include "collective/nccl.h"

#if TESSERA_WITH_NCCL

#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "collective/ring.h"
#include "kernels/clock.h"

typedef struct {
    ncclComm_t comm;
    cudaStream_t stream;
    cudaEvent_t done;
    cudaEvent_t compute; /* marks the work queued on the compute stream */
    int device;
    float *scratch; /* one float on the device, for barrier */
    bool broken;    /* aborted: every later operation fails */
} nccl_state;

/* Records "what: NCCL says ..." for result r of comm (NULL before one). */
static ts_status nccl_error(ncclComm_t comm, ncclResult_t r, const char *what) {
    const char *detail = comm ? ncclGetLastError(comm) : "";
    return ts_error(r == ncclRemoteError || r == ncclSystemError ? TS_ERR_PEER : TS_ERR_DEVICE, "%s: NCCL says %s%s%s",
                    what, ncclGetErrorString(r), detail && *detail ? ": " : "", detail ? detail : "");
}

static ts_status cuda_error(cudaError_t e, const char *what) {
    return ts_error(TS_ERR_DEVICE, "%s: CUDA says %s", what, cudaGetErrorString(e));
}

/* Waits until comm's non-blocking call (init or an enqueue) settled,
 * giving up after timeout_ms or on abort. */
static ts_status settle(ts_comm *c, ncclComm_t comm, ncclResult_t r, int timeout_ms, const char *what) {
    double deadline = ts_clock_ms() + timeout_ms;
    while (r == ncclInProgress) {
        if (ts_comm_aborted(c)) return ts_error(TS_ERR_STATE, "abandoned");
        if (ts_clock_ms() > deadline)
            return ts_error(TS_ERR_TIMEOUT, "%s did not finish within %d ms (a rank died or went silent)", what,
                            timeout_ms);
        sched_yield();
        ncclResult_t q = ncclCommGetAsyncError(comm, &r);
        if (q != ncclSuccess) r = q;
    }
    return r == ncclSuccess ? TS_OK : nccl_error(comm, r, what);
}

/* Rank 0's ncclUniqueId, on every rank: made here on rank 0 and sent to
 * the others over a ring communicator of the same generation. */
static ts_status share_id(ts_comm *c, ncclUniqueId *id) {
    const ts_comm_config *cfg = ts_comm_config_of(c);
    if (cfg->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(id);
        if (r != ncclSuccess) return nccl_error(NULL, r, "communicator nccl: making the unique id");
    }
    if (cfg->size == 1) return TS_OK;
    if (!cfg->native || !cfg->peers)
        return ts_error(TS_ERR_VALUE, "communicator nccl: %d ranks need the ring port (cfg.native) and the "
                                      "peers' endpoints to share the unique id", cfg->size);
    ts_comm *ring = ts_comm_create(&ts_comm_ring_backend, cfg);
    if (!ring) return ts_error(ts_last_status(), "communicator nccl: bootstrap ring: %s", ts_last_error());
    ts_status st = ts_comm_broadcast(ring, id, (int64_t)sizeof *id, TS_U8, 0);
    ts_comm_free(ring);
    if (st) return ts_error(st, "communicator nccl: sharing the unique id: %s", ts_last_error());
    return TS_OK;
}

static void free_state(nccl_state *s) {
    if (!s) return;
    if (s->comm) {
        if (s->broken) ncclCommAbort(s->comm);
        else ncclCommDestroy(s->comm);
    }
    if (s->scratch) cudaFree(s->scratch);
    if (s->done) cudaEventDestroy(s->done);
    if (s->compute) cudaEventDestroy(s->compute);
    if (s->stream) cudaStreamDestroy(s->stream);
    free(s);
}

static ts_status nccl_open(ts_comm *c) {
    const ts_comm_config *cfg = ts_comm_config_of(c);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        return ts_error(TS_ERR_DEVICE, "communicator nccl: no CUDA device (%s)",
                        e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    nccl_state *s = calloc(1, sizeof *s);
    if (!s) return ts_error(TS_ERR_MEMORY, "communicator nccl: out of memory");
    ts_status st = TS_OK;
    if ((e = cudaGetDevice(&s->device)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&s->compute, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaMalloc((void **)&s->scratch, sizeof(float))) != cudaSuccess)
        st = cuda_error(e, "communicator nccl: setting up the device");
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (!st) st = share_id(c, &id);
    if (!st) {
        ncclConfig_t conf = NCCL_CONFIG_INITIALIZER;
        conf.blocking = 0;
        ncclResult_t r = ncclCommInitRankConfig(&s->comm, cfg->size, id, cfg->rank, &conf);
        st = s->comm ? settle(c, s->comm, r, cfg->timeout_ms, "communicator nccl: joining the ranks")
                     : nccl_error(NULL, r, "communicator nccl: joining the ranks");
        if (st) s->broken = true;
    }
    if (st) {
        free_state(s);
        return st;
    }
    ts_comm_set_impl(c, s);
    return TS_OK;
}

static void nccl_close(ts_comm *c) {
    free_state(ts_comm_impl(c));
    ts_comm_set_impl(c, NULL);
}

static ncclDataType_t nccl_type(ts_dtype dt) {
    switch (dt) {
    case TS_F32: return ncclFloat32;
    case TS_F64: return ncclFloat64;
    case TS_BF16: return ncclBfloat16;
    case TS_I32: return ncclInt32;
    case TS_I64: return ncclInt64;
    default: return ncclUint8;
    }
}

static ncclRedOp_t nccl_op(ts_reduce_op op) {
    return op == TS_REDUCE_MAX ? ncclMax : op == TS_REDUCE_AVG ? ncclAvg : ncclSum;
}

/* Enqueues op on the state's stream (NCCL's call, possibly in progress). */
static ncclResult_t enqueue(nccl_state *s, const ts_comm_op *op) {
    size_t n = (size_t)op->count;
    ncclDataType_t t = nccl_type(op->dtype);
    switch (op->kind) {
    case TS_COMM_ALLREDUCE: return ncclAllReduce(op->send, op->recv, n, t, nccl_op(op->op), s->comm, s->stream);
    case TS_COMM_REDUCE_SCATTER:
        return ncclReduceScatter(op->send, op->recv, n, t, nccl_op(op->op), s->comm, s->stream);
    case TS_COMM_ALLGATHER: /* in place (send = recv's own slot) is NCCL's in place too */
        return ncclAllGather(op->send, op->recv, n, t, s->comm, s->stream);
    case TS_COMM_BROADCAST: return ncclBroadcast(op->send, op->recv, n, t, op->peer, s->comm, s->stream);
    case TS_COMM_SEND: return ncclSend(op->send, n, t, op->peer, s->comm, s->stream);
    case TS_COMM_RECV: return ncclRecv(op->recv, n, t, op->peer, s->comm, s->stream);
    case TS_COMM_BARRIER: return ncclAllReduce(s->scratch, s->scratch, 1, ncclFloat32, ncclSum, s->comm, s->stream);
    }
    return ncclInvalidArgument;
}

/* Polls the stream's event and NCCL's asynchronous error until op is
 * done, giving up after the timeout or on abort. */
static ts_status wait_done(ts_comm *c, nccl_state *s, int timeout_ms) {
    double deadline = ts_clock_ms() + timeout_ms;
    for (;;) {
        cudaError_t e = cudaEventQuery(s->done);
        if (e == cudaSuccess) return TS_OK;
        if (e != cudaErrorNotReady) return cuda_error(e, "waiting for NCCL");
        ncclResult_t r = ncclSuccess;
        if (ncclCommGetAsyncError(s->comm, &r) == ncclSuccess && r != ncclSuccess && r != ncclInProgress)
            return nccl_error(s->comm, r, "NCCL failed");
        if (ts_comm_aborted(c)) return ts_error(TS_ERR_STATE, "abandoned");
        if (ts_clock_ms() > deadline)
            return ts_error(TS_ERR_TIMEOUT, "NCCL did not complete within %d ms (a rank died or went silent)",
                            timeout_ms);
        sched_yield();
    }
}

static ts_status nccl_run(ts_comm *c, const ts_comm_op *op) {
    nccl_state *s = ts_comm_impl(c);
    if (s->broken) return ts_error(TS_ERR_STATE, "the NCCL communicator was aborted");
    int timeout = op->timeout_ms > 0 ? op->timeout_ms : ts_comm_config_of(c)->timeout_ms;
    cudaError_t e = cudaSetDevice(s->device);
    if (e != cudaSuccess) return cuda_error(e, "selecting the communicator's device");
    bool empty = op->kind != TS_COMM_BARRIER && op->count == 0;
    ts_status st = TS_OK;
    /* the buffers were written by kernels on the compute stream (the
     * legacy default stream, which this non-blocking stream does not
     * follow by itself): wait for what is queued there now */
    if (!empty && ((e = cudaEventRecord(s->compute, 0)) != cudaSuccess ||
                   (e = cudaStreamWaitEvent(s->stream, s->compute, 0)) != cudaSuccess))
        st = cuda_error(e, "ordering after compute");
    if (!st && !empty) st = settle(c, s->comm, enqueue(s, op), timeout, "enqueueing");
    if (!st && !empty && (e = cudaEventRecord(s->done, s->stream)) != cudaSuccess) st = cuda_error(e, "recording");
    if (!st && !empty) st = wait_done(c, s, timeout);
    if (st) {
        s->broken = true;
        ncclCommAbort(s->comm);
        s->comm = NULL;
    }
    return st;
}

const ts_comm_backend ts_comm_nccl_backend = {
    .name = "nccl",
    .open = nccl_open,
    .run = nccl_run,
    .close = nccl_close,
};

#endif
