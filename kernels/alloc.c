/* alloc.c - caching allocator: size classes for small blocks, a
 * coalescing segment pool for large ones. */
#include "kernels/alloc.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

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

/* ---- large blocks ----
 *
 * Requests of LARGE_MIN bytes or more come from segments mapped with mmap
 * (page aligned; RSS counts only the pages a tensor has touched). A segment
 * is a list of blocks in address order; a request takes the smallest free
 * block that fits (best fit over all segments), split when the rest is at
 * least SPLIT_MIN, else a new segment of the request rounded up to
 * SEGMENT_ROUND. A freed block merges with its free neighbours, so memory
 * freed by one size serves the next size (a training step's activations
 * change size layer by layer); segments go back to the system only in
 * ts_alloc_empty_cache(). The pool holds a few hundred blocks at most, so
 * the searches are linear. Segments are large (SEGMENT_ROUND) because
 * untouched pages cost no memory and one long free run fragments less than
 * many short ones. Segments of HUGE_MIN or more (model buffers, FSDP's
 * units) ask for transparent huge pages: a range given back and touched
 * again (ts_alloc_decommit) then faults in 2 MiB at a time. */
#define LARGE_MIN ((size_t)128 << 10)
#define LARGE_ROUND ((size_t)4 << 10)
#define SPLIT_MIN ((size_t)64 << 10)
#define SEGMENT_ROUND ((size_t)8 << 20)
#define HUGE_MIN ((size_t)32 << 20)

typedef struct lblock {
    char *ptr;
    size_t size;
    size_t released; /* bytes of its pages given back by ts_alloc_decommit */
    bool free;
    struct lblock *prev, *next; /* neighbours in the segment, by address */
} lblock;

typedef struct segment {
    char *base;
    size_t size;
    lblock *first;
    struct segment *next;
} segment;

static segment *segments;

/* The smallest free block of at least n bytes, or NULL. */
static lblock *best_fit(size_t n) {
    lblock *best = NULL;
    for (segment *s = segments; s; s = s->next)
        for (lblock *b = s->first; b; b = b->next)
            if (b->free && b->size >= n && (!best || b->size < best->size)) best = b;
    return best;
}

/* A new segment of at least n bytes holding one free block; NULL if the
 * system refuses. */
static lblock *new_segment(size_t n) {
    size_t size = (n + SEGMENT_ROUND - 1) / SEGMENT_ROUND * SEGMENT_ROUND;
    segment *s = malloc(sizeof *s);
    lblock *b = malloc(sizeof *b);
    void *base = s && b ? mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) : MAP_FAILED;
    if (base == MAP_FAILED) {
        free(s);
        free(b);
        return NULL;
    }
    if (size >= HUGE_MIN) madvise(base, size, MADV_HUGEPAGE);
    *b = (lblock){.ptr = base, .size = size, .free = true};
    *s = (segment){.base = base, .size = size, .first = b, .next = segments};
    segments = s;
    stats.reserved += size;
    return b;
}

/* Takes n bytes (a multiple of LARGE_ROUND) from the pool; the block size
 * handed out in *got. Caller holds the lock. */
static void *large_alloc(size_t n, size_t *got) {
    lblock *b = best_fit(n);
    if (!b) b = new_segment(n);
    if (!b) return NULL;
    if (b->size - n >= SPLIT_MIN) {
        lblock *rest = malloc(sizeof *rest);
        if (rest) {
            *rest = (lblock){.ptr = b->ptr + n, .size = b->size - n, .free = true, .prev = b, .next = b->next};
            if (b->next) b->next->prev = rest;
            b->next = rest;
            b->size = n;
        }
    }
    b->free = false;
    *got = b->size;
    return b->ptr;
}

/* Merges free block b into its predecessor a (adjacent, both free). */
static void merge_into(lblock *a, lblock *b) {
    a->size += b->size;
    a->next = b->next;
    if (b->next) b->next->prev = a;
    free(b);
}

/* Returns ptr to the pool, merging it with free neighbours; the bytes it
 * counted in *freed (0 if ptr is not a large block). Caller holds the lock. */
static void large_free(void *ptr, size_t *freed) {
    *freed = 0;
    for (segment *s = segments; s; s = s->next) {
        if ((char *)ptr < s->base || (char *)ptr >= s->base + s->size) continue;
        lblock *b = s->first;
        while (b && b->ptr != (char *)ptr) b = b->next;
        if (!b || b->free) return;
        *freed = b->size - b->released; /* released pages no longer count */
        b->released = 0;
        b->free = true;
        if (b->next && b->next->free) merge_into(b, b->next);
        if (b->prev && b->prev->free) merge_into(b->prev, b);
        return;
    }
}

/* Unmaps every segment that is one free block and gives the pages of the
 * free blocks of the others back (MADV_DONTNEED: they read as zeros when
 * next touched), as malloc_trim does for malloc's heap. Caller holds the
 * lock. */
static void large_empty(void) {
    for (segment **sp = &segments; *sp;) {
        segment *s = *sp;
        if (s->first->free && !s->first->next) {
            *sp = s->next;
            munmap(s->base, s->size);
            stats.reserved -= s->size;
            free(s->first);
            free(s);
            continue;
        }
        for (lblock *b = s->first; b; b = b->next)
            if (b->free) madvise(b->ptr, b->size, MADV_DONTNEED);
        sp = &s->next;
    }
}

/* Counts an allocation of block bytes. Caller holds the lock. */
static void count_alloc(size_t block) {
    stats.allocated += block;
    if (stats.allocated > stats.peak) stats.peak = stats.allocated;
}

void *ts_alloc(size_t nbytes) {
    if (nbytes >= LARGE_MIN) {
        size_t n = (nbytes + LARGE_ROUND - 1) / LARGE_ROUND * LARGE_ROUND, got = 0;
        pthread_mutex_lock(&lock);
        stats.n_allocs++;
        size_t reserved = stats.reserved;
        void *p = large_alloc(n, &got);
        if (p) {
            if (stats.reserved == reserved) stats.n_cache_hits++;
            count_alloc(got);
        }
        pthread_mutex_unlock(&lock);
        if (!p) ts_error(TS_ERR_MEMORY, "alloc: out of memory allocating %zu bytes", n);
        return p;
    }
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
        count_alloc(block);
    }
    pthread_mutex_unlock(&lock);
    if (b) return b;
    b = aligned_alloc(64, block);
    if (!b) {
        ts_error(TS_ERR_MEMORY, "alloc: out of memory allocating %zu bytes", block);
        return NULL;
    }
    pthread_mutex_lock(&lock);
    stats.reserved += block;
    count_alloc(block);
    pthread_mutex_unlock(&lock);
    return b;
}

void ts_free(void *ptr, size_t nbytes) {
    if (!ptr) return;
    if (nbytes >= LARGE_MIN) {
        size_t freed;
        pthread_mutex_lock(&lock);
        large_free(ptr, &freed);
        stats.allocated -= freed;
        pthread_mutex_unlock(&lock);
        return;
    }
    size_t block;
    int c = size_class(nbytes, &block);
    free_block *b = ptr;
    pthread_mutex_lock(&lock);
    b->next = free_lists[c];
    free_lists[c] = b;
    stats.allocated -= block;
    pthread_mutex_unlock(&lock);
}

/* The live large block holding address p, or NULL. Caller holds the lock. */
static lblock *live_block_at(const char *p) {
    for (segment *s = segments; s; s = s->next) {
        if (p < s->base || p >= s->base + s->size) continue;
        for (lblock *b = s->first; b; b = b->next)
            if (p >= b->ptr && p < b->ptr + b->size) return b->free ? NULL : b;
    }
    return NULL;
}

/* The whole pages inside [ptr, ptr + nbytes) of a live large block:
 * their start in *first and their bytes (0: none). Caller holds the lock. */
static size_t whole_pages(void *ptr, size_t nbytes, char **first, lblock **block) {
    uintptr_t lo = ((uintptr_t)ptr + LARGE_ROUND - 1) / LARGE_ROUND * LARGE_ROUND;
    uintptr_t hi = ((uintptr_t)ptr + nbytes) / LARGE_ROUND * LARGE_ROUND;
    *block = nbytes ? live_block_at(ptr) : NULL;
    if (!*block || hi <= lo || (char *)hi > (*block)->ptr + (*block)->size) return 0;
    *first = (char *)lo;
    return hi - lo;
}

size_t ts_alloc_decommit(void *ptr, size_t nbytes) {
    char *first;
    lblock *b;
    pthread_mutex_lock(&lock);
    size_t n = whole_pages(ptr, nbytes, &first, &b);
    if (n && madvise(first, n, MADV_DONTNEED) == 0) {
        b->released += n;
        stats.allocated -= n;
    } else {
        n = 0;
    }
    pthread_mutex_unlock(&lock);
    return n;
}

void ts_alloc_recommit(void *ptr, size_t nbytes) {
    char *first;
    lblock *b;
    pthread_mutex_lock(&lock);
    size_t n = whole_pages(ptr, nbytes, &first, &b);
    if (n && n <= b->released) {
        b->released -= n;
        count_alloc(n);
    }
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
    large_empty();
    pthread_mutex_unlock(&lock);
}

void ts_alloc_rss(size_t *now, size_t *peak) {
    *now = *peak = 0;
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (sscanf(line, "VmRSS: %llu kB", &kb) == 1) *now = (size_t)kb << 10;
        if (sscanf(line, "VmHWM: %llu kB", &kb) == 1) *peak = (size_t)kb << 10;
    }
    if (f) fclose(f);
}

void ts_alloc_reset_rss_peak(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return;
    fputs("5", f);
    fclose(f);
}
