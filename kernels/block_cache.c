/* block_cache.c - free blocks kept in one list, reused by rounded size. */
#include "kernels/block_cache.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

#include "kernels/status.h"

#define SMALL_LIMIT ((size_t)1 << 20)
#define SMALL_ROUND ((size_t)512)
#define LARGE_ROUND ((size_t)2 << 20)

typedef struct block {
    void *data;
    size_t size; /* rounded */
    struct block *next;
} block;

struct ts_block_cache {
    ts_block_source src;
    pthread_mutex_t lock;
    block *free_list;
    ts_alloc_stats stats;
};

static size_t rounded(size_t n) {
    size_t r = n < SMALL_LIMIT ? SMALL_ROUND : LARGE_ROUND;
    return n == 0 ? SMALL_ROUND : (n + r - 1) / r * r;
}

ts_block_cache *ts_block_cache_new(ts_block_source src) {
    ts_block_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->src = src;
    pthread_mutex_init(&c->lock, NULL);
    return c;
}

/* Takes a cached block of exactly size out of the list (NULL if none). */
static block *take(ts_block_cache *c, size_t size) {
    for (block **p = &c->free_list; *p; p = &(*p)->next)
        if ((*p)->size == size) {
            block *b = *p;
            *p = b->next;
            return b;
        }
    return NULL;
}

/* Returns the free blocks to the source (lock held). */
static void empty_locked(ts_block_cache *c) {
    while (c->free_list) {
        block *b = c->free_list;
        c->free_list = b->next;
        c->src.raw_free(b->data, b->size, c->src.ctx);
        c->stats.reserved -= b->size;
        free(b);
    }
}

void *ts_block_cache_alloc(ts_block_cache *c, size_t nbytes) {
    size_t size = rounded(nbytes);
    pthread_mutex_lock(&c->lock);
    c->stats.n_allocs++;
    block *b = take(c, size);
    void *data = NULL;
    if (b) {
        c->stats.n_cache_hits++;
        data = b->data;
        free(b);
    } else {
        data = c->src.raw_alloc(size, c->src.ctx);
        if (!data && c->free_list) {
            empty_locked(c);
            data = c->src.raw_alloc(size, c->src.ctx);
        }
        if (data) c->stats.reserved += size;
    }
    if (data) {
        c->stats.allocated += size;
        if (c->stats.allocated > c->stats.peak) c->stats.peak = c->stats.allocated;
    }
    pthread_mutex_unlock(&c->lock);
    if (!data && ts_last_status() == TS_OK)
        ts_error(TS_ERR_MEMORY, "out of memory for a block of %zu bytes", nbytes);
    return data;
}

void ts_block_cache_release(ts_block_cache *c, void *data, size_t nbytes) {
    if (!data) return;
    block *b = malloc(sizeof *b);
    pthread_mutex_lock(&c->lock);
    size_t size = rounded(nbytes);
    c->stats.allocated -= size;
    if (b) {
        b->data = data;
        b->size = size;
        b->next = c->free_list;
        c->free_list = b;
    } else {
        c->src.raw_free(data, size, c->src.ctx);
        c->stats.reserved -= size;
    }
    pthread_mutex_unlock(&c->lock);
}

ts_alloc_stats ts_block_cache_stats(ts_block_cache *c) {
    pthread_mutex_lock(&c->lock);
    ts_alloc_stats s = c->stats;
    pthread_mutex_unlock(&c->lock);
    return s;
}

void ts_block_cache_reset_peak(ts_block_cache *c) {
    pthread_mutex_lock(&c->lock);
    c->stats.peak = c->stats.allocated;
    pthread_mutex_unlock(&c->lock);
}

void ts_block_cache_empty(ts_block_cache *c) {
    pthread_mutex_lock(&c->lock);
    empty_locked(c);
    pthread_mutex_unlock(&c->lock);
}

void ts_block_cache_free_all(ts_block_cache *c) {
    if (!c) return;
    ts_block_cache_empty(c);
    pthread_mutex_destroy(&c->lock);
    free(c);
}
