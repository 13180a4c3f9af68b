/* comm_mpi.c - backend "mpi": the communicator over an MPI communicator,
 * for jobs started by mpirun (built with TESSERA_WITH_MPI).
 *
 * cfg.native points at the MPI_Comm of the ranks (rank and size must match
 * it). Every operation is MPI's own non-blocking collective or point-to-
 * point call, tested until it completes, so that it can give up after the
 * communicator's timeout or when aborted (MPI cannot cancel a collective:
 * the communicator is failed from then on, as every backend's is). bf16 is
 * widened to f32, reduced by MPI in f32 and rounded once. Counts above
 * MPI's int range are cut into pieces where the operation allows it.
 */
#include "collective/mpi.h"

#if TESSERA_WITH_MPI

#include <limits.h>
#include <mpi.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/clock.h"

/* Elements per MPI call (MPI counts are ints). */
#define PIECE ((int64_t)1 << 30)

typedef struct {
    MPI_Comm comm;
} mpi_state;

static ts_status mpi_open(ts_comm *c) {
    const ts_comm_config *cfg = ts_comm_config_of(c);
    if (!cfg->native) return ts_error(TS_ERR_VALUE, "communicator mpi: no MPI communicator (cfg.native)");
    int inited = 0, rank = -1, size = 0;
    MPI_Initialized(&inited);
    if (!inited) return ts_error(TS_ERR_STATE, "communicator mpi: MPI is not initialised (not under mpirun?)");
    MPI_Comm comm = *(const MPI_Comm *)cfg->native;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    if (rank != cfg->rank || size != cfg->size)
        return ts_error(TS_ERR_VALUE, "communicator mpi: rank %d of %d given, the MPI communicator says %d of %d",
                        cfg->rank, cfg->size, rank, size);
    mpi_state *m = calloc(1, sizeof *m);
    if (!m) return ts_error(TS_ERR_MEMORY, "communicator mpi: out of memory");
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    m->comm = comm;
    ts_comm_set_impl(c, m);
    return TS_OK;
}

static void mpi_close(ts_comm *c) {
    free(ts_comm_impl(c));
    ts_comm_set_impl(c, NULL);
}

/* Waits for req of op, giving up after op's time limit (or the
 * communicator's) or on abort. */
static ts_status wait_request(ts_comm *c, const ts_comm_op *op, MPI_Request *req, int rc) {
    if (rc != MPI_SUCCESS) {
        char text[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, text, &len);
        return ts_error(TS_ERR_PEER, "MPI: %s", text);
    }
    int timeout = op->timeout_ms > 0 ? op->timeout_ms : ts_comm_config_of(c)->timeout_ms;
    double deadline = ts_clock_ms() + timeout;
    for (int done = 0;;) {
        rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return wait_request(c, op, req, rc);
        if (done) return TS_OK;
        if (ts_comm_aborted(c)) return ts_error(TS_ERR_STATE, "abandoned");
        if (ts_clock_ms() > deadline)
            return ts_error(TS_ERR_TIMEOUT, "MPI did not complete within %d ms (a rank died or went silent)", timeout);
        sched_yield(); /* MPI progresses only inside MPI calls: test again soon */
    }
}

static MPI_Datatype mpi_type(ts_dtype dt) { return dt == TS_F64 ? MPI_DOUBLE : MPI_FLOAT; }
static MPI_Op mpi_op(ts_reduce_op op) { return op == TS_REDUCE_MAX ? MPI_MAX : MPI_SUM; }

/* An f32 copy of n bf16 values (malloc'd), or NULL when out of memory. */
static float *widened(const void *src, int64_t n) {
    float *w = malloc((size_t)(n ? n : 1) * sizeof *w);
    if (w)
        for (int64_t i = 0; i < n; i++) w[i] = ts_f32_from_bf16(((const uint16_t *)src)[i]);
    return w;
}

static void narrow_into(void *dst, const float *w, int64_t n) {
    for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = ts_bf16_from_f32(w[i]);
}

static ts_status run_allreduce(ts_comm *c, MPI_Comm comm, const ts_comm_op *op) {
    size_t es = ts_dtype_size(op->dtype);
    if (op->send != op->recv && op->count) memmove(op->recv, op->send, (size_t)op->count * es);
    bool bf16 = op->dtype == TS_BF16;
    float *w = bf16 ? widened(op->recv, op->count) : NULL;
    if (bf16 && !w) return ts_error(TS_ERR_MEMORY, "out of memory widening %lld bf16 values", (long long)op->count);
    char *buf = bf16 ? (char *)w : op->recv;
    size_t wes = bf16 ? sizeof(float) : es;
    ts_status st = TS_OK;
    for (int64_t at = 0; !st && at < op->count; at += PIECE) {
        int n = (int)(op->count - at < PIECE ? op->count - at : PIECE);
        MPI_Request req;
        int rc = MPI_Iallreduce(MPI_IN_PLACE, buf + (size_t)at * wes, n, bf16 ? MPI_FLOAT : mpi_type(op->dtype),
                                mpi_op(op->op), comm, &req);
        st = wait_request(c, op, &req, rc);
    }
    if (!st && op->op == TS_REDUCE_AVG)
        ts_comm_finish_avg(buf, op->count, bf16 ? TS_F32 : op->dtype, ts_comm_config_of(c)->size);
    if (!st && bf16) narrow_into(op->recv, w, op->count);
    free(w);
    return st;
}

static ts_status run_reduce_scatter(ts_comm *c, MPI_Comm comm, const ts_comm_op *op) {
    int size = ts_comm_config_of(c)->size;
    if (op->count > INT_MAX) return ts_error(TS_ERR_VALUE, "%lld elements per rank exceed MPI's counts", (long long)op->count);
    bool bf16 = op->dtype == TS_BF16;
    float *w = bf16 ? widened(op->send, op->count * size) : NULL, *out = bf16 ? malloc((size_t)(op->count + 1) * 4) : NULL;
    if (bf16 && (!w || !out)) {
        free(w);
        free(out);
        return ts_error(TS_ERR_MEMORY, "out of memory widening %lld bf16 values", (long long)op->count * size);
    }
    /* in place (recv is send's own slot): MPI's in place takes the input
     * from the whole buffer and leaves the result at its start */
    size_t block = (size_t)op->count * ts_dtype_size(op->dtype);
    char *whole = (char *)op->recv - block * (size_t)ts_comm_config_of(c)->rank;
    bool in_place = !bf16 && whole == (const char *)op->send;
    void *res = bf16 ? (void *)out : in_place ? (void *)whole : op->recv;
    MPI_Request req;
    int rc = MPI_Ireduce_scatter_block(bf16 ? (const void *)w : in_place ? MPI_IN_PLACE : op->send, res,
                                       (int)op->count, bf16 ? MPI_FLOAT : mpi_type(op->dtype), mpi_op(op->op), comm,
                                       &req);
    ts_status st = wait_request(c, op, &req, rc);
    if (!st && op->op == TS_REDUCE_AVG) ts_comm_finish_avg(res, op->count, bf16 ? TS_F32 : op->dtype, size);
    if (!st && bf16) narrow_into(op->recv, out, op->count);
    if (!st && in_place) memmove(op->recv, whole, block);
    free(w);
    free(out);
    return st;
}

static ts_status run_allgather(ts_comm *c, MPI_Comm comm, const ts_comm_op *op) {
    int64_t bytes = op->count * (int64_t)ts_dtype_size(op->dtype);
    if (bytes > INT_MAX) return ts_error(TS_ERR_VALUE, "%lld bytes per rank exceed MPI's counts", (long long)bytes);
    const char *own = (const char *)op->recv + bytes * ts_comm_config_of(c)->rank;
    MPI_Request req;
    int rc = MPI_Iallgather(op->send == own ? MPI_IN_PLACE : op->send, (int)bytes, MPI_BYTE, op->recv, (int)bytes,
                            MPI_BYTE, comm, &req);
    return wait_request(c, op, &req, rc);
}

/* Broadcast, send and recv move bytes, in pieces of at most PIECE. */
static ts_status run_bytes(ts_comm *c, MPI_Comm comm, const ts_comm_op *op) {
    int64_t bytes = op->count * (int64_t)ts_dtype_size(op->dtype);
    char *buf = op->kind == TS_COMM_SEND ? (char *)op->send : op->recv;
    ts_status st = TS_OK;
    for (int64_t at = 0; !st && at < bytes; at += PIECE) {
        int n = (int)(bytes - at < PIECE ? bytes - at : PIECE);
        MPI_Request req;
        int rc = op->kind == TS_COMM_BROADCAST ? MPI_Ibcast(buf + at, n, MPI_BYTE, op->peer, comm, &req)
                 : op->kind == TS_COMM_SEND    ? MPI_Isend(buf + at, n, MPI_BYTE, op->peer, 0, comm, &req)
                                               : MPI_Irecv(buf + at, n, MPI_BYTE, op->peer, 0, comm, &req);
        st = wait_request(c, op, &req, rc);
    }
    return st;
}

static ts_status mpi_run(ts_comm *c, const ts_comm_op *op) {
    MPI_Comm comm = ((mpi_state *)ts_comm_impl(c))->comm;
    switch (op->kind) {
    case TS_COMM_ALLREDUCE: return run_allreduce(c, comm, op);
    case TS_COMM_REDUCE_SCATTER: return run_reduce_scatter(c, comm, op);
    case TS_COMM_ALLGATHER: return run_allgather(c, comm, op);
    case TS_COMM_BARRIER: {
        MPI_Request req;
        int rc = MPI_Ibarrier(comm, &req);
        return wait_request(c, op, &req, rc);
    }
    default: return run_bytes(c, comm, op);
    }
}

ts_status ts_comm_mpi_place(void *mpi_comm, int *rank, int *size) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) return ts_error(TS_ERR_STATE, "communicator mpi: MPI is not initialised (not under mpirun?)");
    MPI_Comm_rank(*(MPI_Comm *)mpi_comm, rank);
    MPI_Comm_size(*(MPI_Comm *)mpi_comm, size);
    return TS_OK;
}

int ts_comm_mpi_init(int *argc, char ***argv) {
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "ring", 0);
    int provided = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    return provided;
}

ts_status ts_comm_mpi_split(void *mpi_comm, int color, int key, void **out) {
    MPI_Comm *c = malloc(sizeof *c);
    if (!c) return ts_error(TS_ERR_MEMORY, "communicator mpi: out of memory");
    int rc = MPI_Comm_split(*(MPI_Comm *)mpi_comm, color, key, c);
    if (rc != MPI_SUCCESS) {
        free(c);
        return ts_error(TS_ERR_PEER, "communicator mpi: MPI_Comm_split (color %d, key %d) failed with code %d", color,
                        key, rc);
    }
    *out = c;
    return TS_OK;
}

void ts_comm_mpi_free(void *mpi_comm) {
    if (!mpi_comm) return;
    MPI_Comm_free((MPI_Comm *)mpi_comm);
    free(mpi_comm);
}

const ts_comm_backend ts_comm_mpi_backend = {
    .name = "mpi",
    .open = mpi_open,
    .run = mpi_run,
    .close = mpi_close,
};

#else

ts_status ts_comm_mpi_place(void *mpi_comm, int *rank, int *size) {
    (void)mpi_comm, (void)rank, (void)size;
    return ts_error(TS_ERR_UNSUPPORTED, "communicator mpi: this build has no MPI (TESSERA_WITH_MPI=OFF)");
}

ts_status ts_comm_mpi_split(void *mpi_comm, int color, int key, void **out) {
    (void)mpi_comm, (void)color, (void)key, (void)out;
    return ts_error(TS_ERR_UNSUPPORTED, "communicator mpi: this build has no MPI (TESSERA_WITH_MPI=OFF)");
}

void ts_comm_mpi_free(void *mpi_comm) { (void)mpi_comm; }

#endif
