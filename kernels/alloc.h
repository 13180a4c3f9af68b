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

/* Gives the physical pages wholly inside [ptr, ptr + nbytes) of a live
 * large block (from ts_alloc) back to the system: they read as zeros when
 * next touched, and no longer count as allocated, as CUDA's virtual memory
 * unmaps pages under a reserved range (FSDP releases a gathered unit this
 * way; the views over it stay valid). Returns the bytes given back (0 for
 * a range without a whole page, or not in a large block). The caller gives
 * a range back once, then counts it again with ts_alloc_recommit before it
 * writes it; freeing the block settles what is still given back. */
size_t ts_alloc_decommit(void *ptr, size_t nbytes);

/* Counts the pages of a range given back by ts_alloc_decommit as allocated
 * again (they read as zeros until written). */
void ts_alloc_recommit(void *ptr, size_t nbytes);

/* The process's resident set: now and its peak since the last
 * ts_alloc_reset_rss_peak (VmRSS, VmHWM of /proc/self/status; 0 where
 * unreadable). */
void ts_alloc_rss(size_t *now, size_t *peak);

/* Sets the resident peak to the current resident set (Linux's
 * /proc/self/clear_refs "5"); a no-op where it cannot. */
void ts_alloc_reset_rss_peak(void);

/* Returns cached memory to the system: small blocks and wholly free
 * segments are freed, the pages of free blocks inside used segments
 * released (madvise MADV_DONTNEED). */
void ts_alloc_empty_cache(void);

#endif
