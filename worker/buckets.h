/* buckets.h - gradient buckets averaged over a data-parallel group while
 * backward goes on (PyTorch DDP's reducer).
 *
 * The flat gradient buffer is cut into buckets of about bucket_mb from its
 * end, at parameter boundaries (backward finishes the last parameters
 * first). As the trainer announces ranges of gradients final (grads_ready),
 * a bucket whose every element is final starts its all-reduce (average) on
 * the group's communicator, in bf16 on the wire when asked (reduced in
 * f32); waiting for the buckets leaves the averaged gradients in the
 * buffer. DDP averages over all workers, a pipeline stage over its
 * replicas.
 */
#ifndef TS_WORKER_BUCKETS_H
#define TS_WORKER_BUCKETS_H

#include <stdbool.h>

#include "collective/comm.h"
#include "kernels/nn/model.h"

typedef struct ts_buckets ts_buckets;

/* Buckets over model m's flat gradients (on m's device: the communicator
 * must reduce memory there; bf16 on the wire only from the CPU); NULL with
 * a message on failure. */
ts_buckets *ts_buckets_new(const ts_model *m, double bucket_mb, bool bf16_wire);

/* Waits for what is in flight (abort the communicator first to hurry it)
 * and frees b. NULL is fine. */
void ts_buckets_free(ts_buckets *b);

/* Forgets which gradients were announced (at the start of each step). */
void ts_buckets_reset(ts_buckets *b);

/* Notes [offset, offset + len) of grads final and starts the all-reduce of
 * each bucket that became complete on c, tagged with step. */
ts_status ts_buckets_ready(ts_buckets *b, ts_comm *c, float *grads, int64_t offset, int64_t len, int64_t step);

/* How to wait for one bucket's request (ctx given to ts_buckets_wait). */
typedef ts_status (*ts_buckets_wait_fn)(void *ctx, ts_comm_req *req);

/* Waits (with wait, or ts_comm_wait when NULL) for every bucket started;
 * the averaged gradients are in grads after. The first failure is
 * returned, the other requests are still waited for. */
ts_status ts_buckets_wait(ts_buckets *b, float *grads, ts_buckets_wait_fn wait, void *ctx);

/* Waits for every request in flight and forgets them, their results
 * dropped (after the communicator was aborted). */
void ts_buckets_drop(ts_buckets *b);

#endif
