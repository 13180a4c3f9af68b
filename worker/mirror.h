/* mirror.h - a model's flat parameters and gradients as host memory, for
 * a strategy that sends them from the host (the PS client).
 *
 * For a model on the CPU the mirror is the model's own buffers. For a
 * model on a GPU it is a pair of pinned host buffers: a gradient range
 * that backward has finished (ts_mirror_grads_ready) is copied down on a
 * side stream while backward goes on, and handed to the mirror's `ready`
 * callback once its copy has ended (ranges in the order they were given);
 * parameters written into the host buffer (a pull) are copied up to the
 * model by ts_mirror_params_arrived.
 */
#ifndef TS_WORKER_MIRROR_H
#define TS_WORKER_MIRROR_H

#include "kernels/nn/model.h"

typedef struct ts_mirror ts_mirror;

/* Called with each gradient range once it is in host memory. */
typedef ts_status (*ts_mirror_ready_fn)(void *ctx, int64_t offset, int64_t len);

/* A mirror of m (which must outlive it), or NULL with an error. */
ts_mirror *ts_mirror_new(ts_model *m, ts_mirror_ready_fn ready, void *ctx);
void ts_mirror_free(ts_mirror *mr);

/* The host buffers (numel floats each). */
float *ts_mirror_params(const ts_mirror *mr);
float *ts_mirror_grads(const ts_mirror *mr);

/* Gradients [offset, offset + len) are final on the model's device:
 * starts their copy down, and passes on every range whose copy ended. */
ts_status ts_mirror_grads_ready(ts_mirror *mr, int64_t offset, int64_t len);

/* Waits for the copies in flight and passes their ranges on. */
ts_status ts_mirror_flush(ts_mirror *mr);

/* The host parameters were rewritten: copies them up to the model. */
ts_status ts_mirror_params_arrived(ts_mirror *mr);

#endif
