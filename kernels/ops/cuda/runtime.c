/* runtime.c - devices, the per-device block caches, pinned memory,
 * streams and events of the CUDA backend. */
#include "kernels/ops/cuda/runtime.h"

#include <cuda_runtime.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/block_cache.h"
#include "kernels/ops/cuda/cuda.h"

ts_status ts_cuda_status(int err, const char *op) {
    if (err == cudaSuccess) return TS_OK;
    return ts_error(err == cudaErrorMemoryAllocation ? TS_ERR_MEMORY : TS_ERR_DEVICE, "%s: CUDA says %s", op,
                    cudaGetErrorString((cudaError_t)err));
}

ts_status ts_cuda_launched(const char *op) { return ts_cuda_status(cudaGetLastError(), op); }

int ts_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* not sticky: forget it */
        return 0;
    }
    return n;
}

/* TS_OK when cuda:index exists, else "cuda:N: no CUDA device (...)". */
static ts_status check_device(int index) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return ts_error(TS_ERR_DEVICE, "cuda:%d: no CUDA device (CUDA says %s)", index, cudaGetErrorString(e));
    }
    if (index < 0 || index >= n || index >= TS_CUDA_MAX_DEVICES)
        return ts_error(TS_ERR_DEVICE, "cuda:%d: no CUDA device (this machine has %d)", index, n);
    return TS_OK;
}

ts_status ts_cuda_set_device(int index) {
    ts_status st = check_device(index);
    return st ? st : ts_cuda_status(cudaSetDevice(index), "set device");
}

ts_status ts_cuda_synchronize(int index) {
    ts_status st = ts_cuda_set_device(index);
    return st ? st : ts_cuda_status(cudaDeviceSynchronize(), "synchronize");
}

/* ---- device memory ---- */

static void *raw_alloc(size_t nbytes, void *ctx) {
    int index = (int)(intptr_t)ctx;
    void *p = NULL;
    if (cudaSetDevice(index) != cudaSuccess || cudaMalloc(&p, nbytes) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

static void raw_free(void *p, size_t nbytes, void *ctx) {
    (void)nbytes;
    cudaSetDevice((int)(intptr_t)ctx);
    cudaFree(p);
}

static pthread_mutex_t caches_lock = PTHREAD_MUTEX_INITIALIZER;
static ts_block_cache *caches[TS_CUDA_MAX_DEVICES];

/* Device index's cache (made at its first use), or NULL with an error. */
static ts_block_cache *cache_of(int index, bool make) {
    if (index < 0 || index >= TS_CUDA_MAX_DEVICES) return NULL;
    pthread_mutex_lock(&caches_lock);
    if (!caches[index] && make)
        caches[index] = ts_block_cache_new((ts_block_source){raw_alloc, raw_free, (void *)(intptr_t)index});
    ts_block_cache *c = caches[index];
    pthread_mutex_unlock(&caches_lock);
    return c;
}

void *ts_cuda_alloc(int index, size_t nbytes) {
    if (check_device(index)) return NULL;
    ts_block_cache *c = cache_of(index, true);
    void *p = c ? ts_block_cache_alloc(c, nbytes) : NULL;
    if (!p) {
        size_t free_b = 0, total = 0;
        cudaMemGetInfo(&free_b, &total);
        ts_alloc_stats s = c ? ts_block_cache_stats(c) : (ts_alloc_stats){0};
        ts_error(TS_ERR_MEMORY,
                 "cuda:%d: out of memory for %zu bytes (%zu MiB allocated, %zu MiB reserved, %zu of %zu MiB free)",
                 index, nbytes, s.allocated >> 20, s.reserved >> 20, free_b >> 20, total >> 20);
    }
    return p;
}

void ts_cuda_free(int index, void *data, size_t nbytes) {
    ts_block_cache *c = cache_of(index, false);
    if (c) ts_block_cache_release(c, data, nbytes);
}

ts_alloc_stats ts_cuda_memory_stats(int index) {
    ts_block_cache *c = cache_of(index, false);
    return c ? ts_block_cache_stats(c) : (ts_alloc_stats){0};
}

void ts_cuda_reset_peak(int index) {
    ts_block_cache *c = cache_of(index, false);
    if (c) ts_block_cache_reset_peak(c);
}

void ts_cuda_empty_cache(int index) {
    ts_block_cache *c = cache_of(index, false);
    if (c) ts_block_cache_empty(c);
}

void *ts_cuda_host_alloc(size_t nbytes) {
    void *p = NULL;
    cudaError_t e = cudaMallocHost(&p, nbytes ? nbytes : 1);
    if (e != cudaSuccess) {
        cudaGetLastError();
        ts_error(TS_ERR_MEMORY, "pinned host memory: %zu bytes refused (CUDA says %s)", nbytes, cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

void ts_cuda_host_free(void *p) {
    if (p) cudaFreeHost(p);
}

static atomic_int tf32 = -1; /* -1: not yet read from the environment */

void ts_cuda_set_tf32(bool on) { atomic_store(&tf32, on); }

bool ts_cuda_tf32(void) {
    int v = atomic_load(&tf32);
    if (v < 0) {
        const char *e = getenv("TESSERA_CUDA_TF32");
        v = e && strcmp(e, "1") == 0;
        atomic_store(&tf32, v);
    }
    return v;
}

/* ---- streams and events ---- */

struct ts_cuda_stream {
    cudaStream_t stream;
    cudaEvent_t compute_mark; /* recorded on the compute stream by wait_compute */
    int index;
};

struct ts_cuda_event {
    cudaEvent_t event;
};

ts_cuda_stream *ts_cuda_stream_new(int index) {
    if (ts_cuda_set_device(index)) return NULL;
    ts_cuda_stream *s = calloc(1, sizeof *s);
    if (!s) {
        ts_error(TS_ERR_MEMORY, "stream: out of memory");
        return NULL;
    }
    s->index = index;
    if (ts_cuda_status(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking), "stream") ||
        ts_cuda_status(cudaEventCreateWithFlags(&s->compute_mark, cudaEventDisableTiming), "stream")) {
        ts_cuda_stream_free(s);
        return NULL;
    }
    return s;
}

void ts_cuda_stream_free(ts_cuda_stream *s) {
    if (!s) return;
    if (s->compute_mark) cudaEventDestroy(s->compute_mark);
    if (s->stream) cudaStreamDestroy(s->stream);
    free(s);
}

ts_status ts_cuda_stream_wait_compute(ts_cuda_stream *s) {
    ts_status st = ts_cuda_status(cudaEventRecord(s->compute_mark, 0), "stream wait");
    return st ? st : ts_cuda_status(cudaStreamWaitEvent(s->stream, s->compute_mark, 0), "stream wait");
}

ts_status ts_cuda_stream_download(ts_cuda_stream *s, void *host, const void *device, size_t nbytes) {
    return ts_cuda_status(cudaMemcpyAsync(host, device, nbytes, cudaMemcpyDeviceToHost, s->stream), "stream download");
}

ts_status ts_cuda_stream_synchronize(ts_cuda_stream *s) {
    return ts_cuda_status(cudaStreamSynchronize(s->stream), "stream synchronize");
}

ts_cuda_event *ts_cuda_event_new(void) {
    ts_cuda_event *e = calloc(1, sizeof *e);
    if (!e) {
        ts_error(TS_ERR_MEMORY, "event: out of memory");
        return NULL;
    }
    if (ts_cuda_status(cudaEventCreate(&e->event), "event")) {
        free(e);
        return NULL;
    }
    return e;
}

void ts_cuda_event_free(ts_cuda_event *e) {
    if (!e) return;
    cudaEventDestroy(e->event);
    free(e);
}

ts_status ts_cuda_event_record(ts_cuda_event *e, ts_cuda_stream *s) {
    return ts_cuda_status(cudaEventRecord(e->event, s ? s->stream : 0), "event record");
}

ts_status ts_cuda_event_query(ts_cuda_event *e, bool *done) {
    cudaError_t r = cudaEventQuery(e->event);
    *done = r == cudaSuccess;
    return r == cudaErrorNotReady ? TS_OK : ts_cuda_status(r, "event query");
}

ts_status ts_cuda_event_synchronize(ts_cuda_event *e) {
    return ts_cuda_status(cudaEventSynchronize(e->event), "event synchronize");
}

ts_status ts_cuda_event_elapsed_ms(ts_cuda_event *start, ts_cuda_event *end, float *ms) {
    return ts_cuda_status(cudaEventElapsedTime(ms, start->event, end->event), "event elapsed");
}
