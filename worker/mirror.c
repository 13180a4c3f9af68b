/* mirror.c - host buffers of a model's flat parameters and gradients:
 * the model's own on the CPU, pinned copies of a GPU model's. */
#include "worker/mirror.h"

#include <stdlib.h>

#include "kernels/ops/backend.h"
#if TESSERA_WITH_CUDA
#include "kernels/ops/cuda/runtime.h"
#endif

/* A gradient range whose copy down is in flight, and the event that
 * says when it ended. */
typedef struct {
    int64_t offset, len;
    void *done; /* ts_cuda_event * */
} copy;

struct ts_mirror {
    ts_model *m;
    ts_mirror_ready_fn ready;
    void *ctx;
    float *params, *grads; /* the model's (CPU) or pinned copies (GPU) */
    bool device;           /* the model is on a GPU */
    void *stream;          /* ts_cuda_stream * of the copies down */
    copy *queue;           /* in flight, oldest first */
    int head, count, cap;
};

ts_mirror *ts_mirror_new(ts_model *m, ts_mirror_ready_fn ready, void *ctx) {
    ts_mirror *mr = calloc(1, sizeof *mr);
    if (!mr) {
        ts_error(TS_ERR_MEMORY, "mirror: out of memory");
        return NULL;
    }
    mr->m = m;
    mr->ready = ready;
    mr->ctx = ctx;
    mr->device = m->device.type != TS_DEVICE_CPU;
    if (!mr->device) {
        mr->params = ts_f32(m->flat_params);
        mr->grads = ts_f32(m->flat_grads);
        return mr;
    }
#if TESSERA_WITH_CUDA
    size_t bytes = sizeof(float) * (size_t)m->numel;
    mr->cap = m->n_params + 1;
    mr->params = ts_cuda_host_alloc(bytes);
    mr->grads = mr->params ? ts_cuda_host_alloc(bytes) : NULL;
    mr->stream = mr->grads ? ts_cuda_stream_new(m->device.index) : NULL;
    mr->queue = mr->stream ? calloc((size_t)mr->cap, sizeof *mr->queue) : NULL;
    for (int i = 0; mr->queue && i < mr->cap; i++)
        if (!(mr->queue[i].done = ts_cuda_event_new())) break;
    if (mr->queue && mr->queue[mr->cap - 1].done) return mr;
    if (mr->stream && !mr->queue) ts_error(TS_ERR_MEMORY, "mirror: out of memory for %d copies", mr->cap);
#else
    ts_error(TS_ERR_DEVICE, "mirror: no host mirror for %s in this build", ts_device_name(m->device));
#endif
    ts_mirror_free(mr);
    return NULL;
}

void ts_mirror_free(ts_mirror *mr) {
    if (!mr) return;
#if TESSERA_WITH_CUDA
    if (mr->device) {
        if (mr->stream) ts_cuda_stream_synchronize(mr->stream);
        for (int i = 0; mr->queue && i < mr->cap; i++) ts_cuda_event_free(mr->queue[i].done);
        ts_cuda_stream_free(mr->stream);
        ts_cuda_host_free(mr->params);
        ts_cuda_host_free(mr->grads);
    }
#endif
    free(mr->queue);
    free(mr);
}

float *ts_mirror_params(const ts_mirror *mr) { return mr->params; }
float *ts_mirror_grads(const ts_mirror *mr) { return mr->grads; }

#if TESSERA_WITH_CUDA
/* Passes on the oldest copies in flight that ended (all of them, waiting,
 * when wait is set). */
static ts_status drain(ts_mirror *mr, bool wait) {
    while (mr->count > 0) {
        copy *c = &mr->queue[mr->head];
        bool done = false;
        ts_status st = wait ? ts_cuda_event_synchronize(c->done) : ts_cuda_event_query(c->done, &done);
        if (st) return st;
        if (!wait && !done) return TS_OK;
        mr->head = (mr->head + 1) % mr->cap;
        mr->count--;
        if ((st = mr->ready(mr->ctx, c->offset, c->len))) return st;
    }
    return TS_OK;
}
#endif

ts_status ts_mirror_grads_ready(ts_mirror *mr, int64_t offset, int64_t len) {
    if (!mr->device) return mr->ready(mr->ctx, offset, len);
#if TESSERA_WITH_CUDA
    ts_status st = drain(mr, false);
    if (!st && mr->count == mr->cap) st = drain(mr, true); /* every event in use: wait for them */
    if (st) return st;
    copy *c = &mr->queue[(mr->head + mr->count) % mr->cap];
    c->offset = offset;
    c->len = len;
    const float *src = ts_f32(mr->m->flat_grads) + offset;
    st = ts_cuda_stream_wait_compute(mr->stream);
    if (!st) st = ts_cuda_stream_download(mr->stream, mr->grads + offset, src, sizeof(float) * (size_t)len);
    if (!st) st = ts_cuda_event_record(c->done, mr->stream);
    if (!st) mr->count++;
    return st;
#else
    return TS_ERR_DEVICE;
#endif
}

ts_status ts_mirror_flush(ts_mirror *mr) {
    if (!mr->device) return TS_OK;
#if TESSERA_WITH_CUDA
    return drain(mr, true);
#else
    return TS_OK;
#endif
}

ts_status ts_mirror_params_arrived(ts_mirror *mr) {
    if (!mr->device) return TS_OK;
    ts_tensor *m = mr->m->flat_params;
    const ts_backend *b = ts_backend_of("mirror", ts_tensor_device(m));
    return b ? b->memory->upload(ts_tensor_device(m).index, ts_tensor_data(m), mr->params,
                                 sizeof(float) * (size_t)mr->m->numel)
             : ts_last_status();
}
