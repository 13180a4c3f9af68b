/* comm.h - the communicator: collectives among the ranks of one generation.
 *
 * A communicator joins `size` processes (ranks 0..size-1) of one generation
 * of a job. It offers, like NCCL and MPI:
 *   allreduce      recv[i] = op over ranks of send[i], i < count
 *   reduce_scatter recv[i] = op over ranks of send[rank * count + i]
 *                  (send holds size * count elements)
 *   allgather      recv[r * count + i] = send[i] of rank r
 *   broadcast      buf of root to every rank (send = recv = buf)
 *   send / recv    count elements to / from one peer, in order per pair;
 *                  as MPI_Send, a send may wait until the peer receives
 *                  (one larger than the queues between them), so two
 *                  peers that both send first, each then receiving, wait
 *                  on each other until the timeout: order them
 *   barrier        returns once every rank entered it
 * Reductions are sum, avg (sum / size) and max over f32, f64 and bf16 (bf16
 * values are added in f32; a backend may round partial sums to bf16 between
 * hops, as NCCL does); broadcast, allgather and send/recv carry any dtype.
 * In place is send == recv (for allgather: send is recv's own slot rank *
 * count; for reduce_scatter: recv is send's slot rank * count, and the
 * other slots of send are left undefined, as in NCCL).
 *
 * Every operation has a blocking form and a non-blocking one: ts_comm_start
 * queues it on the communicator's progress thread, which runs queued
 * operations one at a time in the order they were started (the same order
 * on every rank, as in NCCL), and ts_comm_wait returns its outcome, so that
 * a caller computes while the operation runs. The buffers belong to the
 * operation until its wait returns.
 *
 * No operation waits forever: a backend gives up after the communicator's
 * timeout with an error naming the operation, the step it was tagged with
 * and the peer that died or went silent; a communicator that failed once
 * fails every later operation (rebuild one for the next generation).
 *
 * Backends (ts_comm_backend) implement one blocking `run` for every
 * operation; this file's generic layer checks arguments, queues and waits.
 * "self" (a world of one rank) is always there; the ZeroMQ ring, MPI and
 * NCCL come with their builds.
 */
#ifndef TS_COLLECTIVE_COMM_H
#define TS_COLLECTIVE_COMM_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/status.h"
#include "kernels/tensor.h"

typedef enum { TS_COMM_ALLREDUCE, TS_COMM_REDUCE_SCATTER, TS_COMM_ALLGATHER, TS_COMM_BROADCAST,
               TS_COMM_SEND, TS_COMM_RECV, TS_COMM_BARRIER } ts_comm_kind;

typedef enum { TS_REDUCE_SUM, TS_REDUCE_AVG, TS_REDUCE_MAX } ts_reduce_op;

/* One operation. count is in elements: per rank for reduce_scatter (what
 * each rank receives) and allgather (what each rank sends). */
typedef struct {
    ts_comm_kind kind;
    const void *send;
    void *recv;
    int64_t count;
    ts_dtype dtype;
    ts_reduce_op op; /* allreduce, reduce_scatter */
    int peer;        /* broadcast: the root; send/recv: the other rank */
    int64_t step;    /* the training step, named in errors (-1: none) */
    int timeout_ms;  /* > 0: this operation's own limit (else the communicator's) */
} ts_comm_op;

typedef struct ts_comm ts_comm;
typedef struct ts_comm_req ts_comm_req;

/* What a backend is told when a communicator is made. */
typedef struct {
    int rank, size;
    uint64_t generation;
    int timeout_ms;          /* <= 0: 30000 */
    const char *const *peers; /* each rank's endpoint (ring backends) */
    const char *key_file;    /* the job key (CURVE) */
    void *native;            /* a backend's own handle (an MPI_Comm *) */
} ts_comm_config;

typedef struct {
    const char *name;
    /* Sets up c->impl for c->cfg; the message names what failed. */
    ts_status (*open)(ts_comm *c);
    /* Runs one checked operation to its end (on the progress thread); the
     * generic layer puts the operation's name and step before its message. */
    ts_status (*run)(ts_comm *c, const ts_comm_op *op);
    void (*close)(ts_comm *c);
} ts_comm_backend;

/* The backends (comm_<name>.c). */
extern const ts_comm_backend ts_comm_self_backend;

/* The backend called name ("self", ...), or NULL with an error listing the
 * backends of this build. */
const ts_comm_backend *ts_comm_backend_find(const char *name);

/* Makes a communicator over backend be for cfg (0 <= rank < size); cfg and
 * what it points to are copied. Free with ts_comm_free. */
ts_comm *ts_comm_create(const ts_comm_backend *be, const ts_comm_config *cfg);

/* Waits for the operations in flight, stops the progress thread and closes
 * the backend. NULL is fine. */
void ts_comm_free(ts_comm *c);

int ts_comm_rank(const ts_comm *c);
int ts_comm_size(const ts_comm *c);
uint64_t ts_comm_generation(const ts_comm *c);

/* Checks op against this communicator (kind, count >= 0, buffers, dtype
 * for reductions, peer range) and queues it; *req is its handle for
 * ts_comm_wait. A check that fails queues nothing. */
ts_status ts_comm_start(ts_comm *c, const ts_comm_op *op, ts_comm_req **req);

/* Waits until the operation of req ended and frees req; returns its
 * status, with its message for this thread's ts_last_error(). */
ts_status ts_comm_wait(ts_comm_req *req);

/* Waits at most ms for the operation of req: when it ended, *done is set
 * and the result is ts_comm_wait's (req is freed); otherwise *done is
 * false, TS_OK is returned and req stays valid, so that a caller can look
 * at other things (a new generation) while it waits. */
ts_status ts_comm_wait_ms(ts_comm_req *req, int ms, bool *done);

/* Makes the operation in flight and every queued one fail soon (status
 * TS_ERR_STATE, "abandoned"), e.g. when the generation changed under it;
 * the communicator stays failed. Safe from any thread. */
void ts_comm_abort(ts_comm *c);

/* ts_comm_start + ts_comm_wait. */
ts_status ts_comm_run(ts_comm *c, const ts_comm_op *op);

/* The blocking forms, for readability at call sites (step -1). */
ts_status ts_comm_allreduce(ts_comm *c, const void *send, void *recv, int64_t count, ts_dtype dt,
                            ts_reduce_op op);
ts_status ts_comm_reduce_scatter(ts_comm *c, const void *send, void *recv, int64_t count, ts_dtype dt,
                                 ts_reduce_op op);
ts_status ts_comm_allgather(ts_comm *c, const void *send, void *recv, int64_t count, ts_dtype dt);
ts_status ts_comm_broadcast(ts_comm *c, void *buf, int64_t count, ts_dtype dt, int root);
ts_status ts_comm_send(ts_comm *c, const void *buf, int64_t count, ts_dtype dt, int peer);
ts_status ts_comm_recv(ts_comm *c, void *buf, int64_t count, ts_dtype dt, int peer);
ts_status ts_comm_barrier(ts_comm *c);

/* Payload bytes this rank sent over c so far, as its backend counts them
 * (the ring counts every chunk; a backend that does not count says 0). */
uint64_t ts_comm_sent_bytes(const ts_comm *c);

/* "allreduce", "send", ... */
const char *ts_comm_kind_name(ts_comm_kind k);

/* For backends: the communicator's config and private state, and whether
 * ts_comm_abort was called (a backend's run checks it while it waits). */
const ts_comm_config *ts_comm_config_of(const ts_comm *c);
bool ts_comm_aborted(const ts_comm *c);
void ts_comm_count_sent(ts_comm *c, uint64_t bytes); /* adds to ts_comm_sent_bytes */
void *ts_comm_impl(const ts_comm *c);
void ts_comm_set_impl(ts_comm *c, void *impl);

/* For backends: dst[i] = dst[i] op src[i] for n elements of dt (f32, f64;
 * bf16 widened to f32 and rounded back), and the final step of avg
 * (buf[i] /= size). The reference every backend reduces with. */
void ts_comm_reduce_into(void *dst, const void *src, int64_t n, ts_dtype dt, ts_reduce_op op);
void ts_comm_finish_avg(void *buf, int64_t n, ts_dtype dt, int size);

#endif
