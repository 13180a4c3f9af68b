/* alloc.h - caching host allocator with memory statistics.
 *
 * Tensor storage comes from here, like PyTorch's caching allocator: freed
 * memory is kept and reused, and ts_alloc_empty_cache() returns what is
 * unused to the system. Small requests (under 128 KiB) are rounded up to a
 * size class (at most 1/8 larger) with one free list per class. Large ones
 * are rounded up to 4 KiB and carved best-fit out of mmap'd segments; freed
 * neighbours merge, so memory one tensor size frees serves the next size.
 * Thread safe. Blocks are 64-byte aligned (large ones page aligned).
 *
 * Statistics (bytes): allocated = in use by live blocks (rounded sizes, as
 * torch.cuda.memory_allocated reports), peak = highest allocated since start
 * or the last ts_alloc_reset_peak(), reserved = allocated + cached.
 */
#ifndef TS_ALLOC_H
#define TS_ALLOC_H

#include <stddef.h>

typedef struct {
    size_t allocated;
    size_t peak;
    size_t reserved;
    size_t n_allocs;   /* calls to ts_alloc since start */
    size_t n_cache_hits;
} ts_alloc_stats;

/* Returns a 64-byte aligned block of at least nbytes (nbytes may be 0), or
 * NULL with an error message when the system is out of memory. */
void *ts_alloc(size_t nbytes);

/* Returns a block obtained from ts_alloc(nbytes) (same nbytes) to the cache. */
void ts_free(void *ptr, size_t nbytes);

/* Current statistics. */
ts_alloc_stats ts_alloc_get_stats(void);

/* Sets the peak to the current allocated bytes. */
void ts_alloc_reset_peak(void);

/* Returns cached memory to the system: small blocks and wholly free
 * segments are freed, the pages of free blocks inside used segments
 * released (madvise MADV_DONTNEED). */
void ts_alloc_empty_cache(void);

#endif
