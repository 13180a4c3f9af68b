/* alloc.c - size-class caching allocator. */
#include "kernels/alloc.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels/status.h"

/* Size classes: 64-byte granules up to 4 KiB, then 8 classes per power of
 * two. A free block stores the next pointer in its first bytes. */
#define SMALL_LIMIT 4096
#define N_CLASSES (SMALL_LIMIT / 64 + 8 * 48)

typedef struct free_block {
    struct free_block *next;
} free_block;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static free_block *free_lists[N_CLASSES];
static ts_alloc_stats stats;

/* Maps a request to its size class index and the class's block size. */
static int size_class(size_t n, size_t *block) {
    if (n == 0) n = 1;
    if (n <= SMALL_LIMIT) {
        size_t g = (n + 63) / 64;
        *block = g * 64;
        return (int)g - 1;
    }
    int log2 = 63 - __builtin_clzll((unsigned long long)(n - 1));  /* 2^log2 < n <= 2^(log2+1) */
    size_t base = (size_t)1 << log2;
    size_t step = base / 8;
    size_t k = (n - base + step - 1) / step;                          /* 1..8 */
    *block = base + k * step;
    return SMALL_LIMIT / 64 + (log2 - 12) * 8 + (int)k - 1;
}

void *ts_alloc(size_t nbytes) {
    size_t block;
    int c = size_class(nbytes, &block);
    if (c < 0 || c >= N_CLASSES) {
        ts_error(TS_ERR_MEMORY, "alloc: %zu bytes is beyond the allocator's range", nbytes);
        return NULL;
    }
    pthread_mutex_lock(&lock);
    stats.n_allocs++;
    free_block *b = free_lists[c];
    if (b) {
        free_lists[c] = b->next;
        stats.n_cache_hits++;
    }
    pthread_mutex_unlock(&lock);
    if (!b) {
        b = aligned_alloc(64, block);
        if (!b) {
            ts_error(TS_ERR_MEMORY, "alloc: out of memory allocating %zu bytes", block);
            return NULL;
        }
        pthread_mutex_lock(&lock);
        stats.reserved += block;
        pthread_mutex_unlock(&lock);
    }
    pthread_mutex_lock(&lock);
    stats.allocated += block;
    if (stats.allocated > stats.peak) stats.peak = stats.allocated;
    pthread_mutex_unlock(&lock);
    return b;
}

void ts_free(void *ptr, size_t nbytes) {
    if (!ptr) return;
    size_t block;
    int c = size_class(nbytes, &block);
    free_block *b = ptr;
    pthread_mutex_lock(&lock);
    b->next = free_lists[c];
    free_lists[c] = b;
    stats.allocated -= block;
    pthread_mutex_unlock(&lock);
}

ts_alloc_stats ts_alloc_get_stats(void) {
    pthread_mutex_lock(&lock);
    ts_alloc_stats s = stats;
    pthread_mutex_unlock(&lock);
    return s;
}

void ts_alloc_reset_peak(void) {
    pthread_mutex_lock(&lock);
    stats.peak = stats.allocated;
    pthread_mutex_unlock(&lock);
}

void ts_alloc_empty_cache(void) {
    pthread_mutex_lock(&lock);
    for (int c = 0; c < N_CLASSES; c++) {
        size_t block;
        /* Recover the class's block size from any request inside it. */
        size_t probe = c < SMALL_LIMIT / 64 ? (size_t)(c + 1) * 64 : 0;
        if (!probe) {
            int rel = c - SMALL_LIMIT / 64;
            size_t base = (size_t)1 << (rel / 8 + 12);
            probe = base + (size_t)(rel % 8 + 1) * (base / 8);
        }
        size_class(probe, &block);
        while (free_lists[c]) {
            free_block *b = free_lists[c];
            free_lists[c] = b->next;
            stats.reserved -= block;
            free(b);
        }
    }
    pthread_mutex_unlock(&lock);
}
