/* block_cache.h - a caching allocator over another allocator's blocks
 * (device memory: cudaMalloc is slow and synchronises the device).
 *
 * A cache takes blocks from its source (raw_alloc / raw_free, e.g.
 * cudaMalloc / cudaFree on one GPU) and keeps freed ones for reuse, like
 * PyTorch's CUDA caching allocator. Requests are rounded up: under 1 MiB
 * to 512 bytes, larger ones to 2 MiB; a free block serves the next request
 * of its rounded size. When the source
 * runs out, the cache returns its free blocks to it and tries once more.
 * Thread safe. Stats as alloc.h's: allocated (rounded sizes in use), peak
 * and reserved (allocated + cached).
 */
#ifndef TS_BLOCK_CACHE_H
#define TS_BLOCK_CACHE_H

#include <stddef.h>

#include "kernels/alloc.h"

typedef struct {
    /* a block of nbytes, or NULL (the source may record why with ts_error) */
    void *(*raw_alloc)(size_t nbytes, void *ctx);
    void (*raw_free)(void *block, size_t nbytes, void *ctx);
    void *ctx;
} ts_block_source;

typedef struct ts_block_cache ts_block_cache;

/* A cache over src, or NULL when out of host memory. */
ts_block_cache *ts_block_cache_new(ts_block_source src);

/* Returns the cached blocks to the source and frees c (release the
 * blocks in use first: they are not tracked). NULL is fine. */
void ts_block_cache_free_all(ts_block_cache *c);

/* A block of at least nbytes (0 is fine), or NULL with the source's error
 * (or "out of memory") when even an emptied cache cannot get one. */
void *ts_block_cache_alloc(ts_block_cache *c, size_t nbytes);

/* Gives back a block of ts_block_cache_alloc(c, nbytes) (same nbytes). */
void ts_block_cache_release(ts_block_cache *c, void *block, size_t nbytes);

ts_alloc_stats ts_block_cache_stats(ts_block_cache *c);
void ts_block_cache_reset_peak(ts_block_cache *c);

/* Returns the cached (free) blocks to the source. */
void ts_block_cache_empty(ts_block_cache *c);

#endif
