/* runtime.h - CUDA devices as the kernel library sees them: device
 * memory through a caching allocator (with stats), pinned host buffers,
 * streams and events (TESSERA_WITH_CUDA builds only).
 *
 * Tensors on cuda:N live in device N's memory, taken from that device's
 * block cache (block_cache.h) so that a training step does not call
 * cudaMalloc. Every kernel of the CUDA backend runs on the calling
 * thread's current device, on its compute stream (CUDA's legacy default
 * stream, so kernels, copies and the host see one order); copies to and
 * from the host are synchronous. Side streams (ts_cuda_stream_*) let a
 * caller overlap device-to-host copies with compute: a side stream first
 * waits for the compute work queued so far, then copies into pinned host
 * memory, and an event tells when the copy is done.
 *
 * Without a device (no GPU, no driver), every function that needs one
 * fails with "cuda:N: no CUDA device (CUDA says ...)"; ts_cuda_device_count
 * is then 0.
 */
#ifndef TS_OPS_CUDA_RUNTIME_H
#define TS_OPS_CUDA_RUNTIME_H

#include <stdbool.h>
#include <stddef.h>

#include "kernels/alloc.h"
#include "kernels/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* CUDA devices this process can use (0 when none). */
int ts_cuda_device_count(void);

/* Makes cuda:index the calling thread's current device; an error naming
 * it when there is no such device. */
ts_status ts_cuda_set_device(int index);

/* Waits until every kernel and copy queued on cuda:index finished; the
 * error of the first one that failed. */
ts_status ts_cuda_synchronize(int index);

/* Device memory of cuda:index from its block cache, or NULL with an
 * error; give it back with ts_cuda_free (same nbytes). */
void *ts_cuda_alloc(int index, size_t nbytes);
void ts_cuda_free(int index, void *data, size_t nbytes);

/* The caching allocator's stats of cuda:index (allocated / peak /
 * reserved, zeros before its first allocation), resetting the peak and
 * returning cached blocks to the device. */
ts_alloc_stats ts_cuda_memory_stats(int index);
void ts_cuda_reset_peak(int index);
void ts_cuda_empty_cache(int index);

/* Page-locked host memory (fast, asynchronous copies), or NULL with an
 * error; free with ts_cuda_host_free (NULL is fine). */
void *ts_cuda_host_alloc(size_t nbytes);
void ts_cuda_host_free(void *p);

/* TF32 tensor cores for f32 GEMMs (off by default, as in PyTorch: TF32
 * keeps 10 mantissa bits); env TESSERA_CUDA_TF32=1 turns it on too. */
void ts_cuda_set_tf32(bool on);
bool ts_cuda_tf32(void);

/* ---- streams and events ---- */

typedef struct ts_cuda_stream ts_cuda_stream;
typedef struct ts_cuda_event ts_cuda_event;

/* A side stream on cuda:index, or NULL with an error. */
ts_cuda_stream *ts_cuda_stream_new(int index);
void ts_cuda_stream_free(ts_cuda_stream *s);

/* Makes s wait (on the device, not the host) for everything queued on
 * the compute stream so far. */
ts_status ts_cuda_stream_wait_compute(ts_cuda_stream *s);

/* Queues a copy of nbytes from device memory to host memory (pinned, for
 * the copy to be asynchronous) on s. */
ts_status ts_cuda_stream_download(ts_cuda_stream *s, void *host, const void *device, size_t nbytes);

/* Waits until everything queued on s finished. */
ts_status ts_cuda_stream_synchronize(ts_cuda_stream *s);

/* An event with timing, or NULL with an error. */
ts_cuda_event *ts_cuda_event_new(void);
void ts_cuda_event_free(ts_cuda_event *e);

/* Records e on s (NULL: the compute stream). */
ts_status ts_cuda_event_record(ts_cuda_event *e, ts_cuda_stream *s);

/* Whether the work before e's record has finished (*done), without
 * waiting; and waiting for it. */
ts_status ts_cuda_event_query(ts_cuda_event *e, bool *done);
ts_status ts_cuda_event_synchronize(ts_cuda_event *e);

/* Milliseconds between two recorded, finished events. */
ts_status ts_cuda_event_elapsed_ms(ts_cuda_event *start, ts_cuda_event *end, float *ms);

#ifdef __cplusplus
}
#endif

#endif
