/* alloc.h - caching host allocator with memory statistics.
 *
 * Tensor storage comes from here. Freed blocks are kept in size-class free
 * lists and reused, like PyTorch's caching allocator; ts_alloc_empty_cache()
 * returns them to the system. Sizes are rounded up to a size class (at most
 * 1/8 larger than asked). Thread safe. Blocks are 64-byte aligned.
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

/* Frees every cached block back to the system. */
void ts_alloc_empty_cache(void);

#endif
