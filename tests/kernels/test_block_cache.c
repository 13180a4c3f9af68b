/* test_block_cache.c - the caching allocator of device memory, over a
 * host source that counts its calls and can run out: rounding, reuse,
 * stats, emptying, and the retry after a failed source allocation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kernels/block_cache.h"
#include "kernels/status.h"

typedef struct {
    int allocs, frees;
    size_t live, limit; /* bytes the source has handed out, and may */
} source;

static void *src_alloc(size_t n, void *ctx) {
    source *s = ctx;
    if (s->live + n > s->limit) return NULL;
    s->allocs++;
    s->live += n;
    return malloc(n);
}

static void src_free(void *p, size_t n, void *ctx) {
    source *s = ctx;
    s->frees++;
    s->live -= n;
    free(p);
}

static ts_block_cache *cache_over(source *s) {
    ts_block_cache *c = ts_block_cache_new((ts_block_source){src_alloc, src_free, s});
    assert_non_null(c);
    return c;
}

static void test_rounding_and_reuse(void **state) {
    (void)state;
    source s = {.limit = (size_t)64 << 20};
    ts_block_cache *c = cache_over(&s);
    void *a = ts_block_cache_alloc(c, 1000); /* 1024 */
    void *b = ts_block_cache_alloc(c, (3u << 20) + 1); /* 4 MiB */
    void *z = ts_block_cache_alloc(c, 0);    /* 512 */
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(z);
    memset(b, 1, (3u << 20) + 1);
    ts_alloc_stats st = ts_block_cache_stats(c);
    assert_int_equal(st.allocated, 1024 + (4u << 20) + 512);
    assert_int_equal(st.reserved, st.allocated);
    assert_int_equal(st.peak, st.allocated);
    assert_int_equal(s.allocs, 3);
    ts_block_cache_release(c, a, 1000);
    ts_block_cache_release(c, b, (3u << 20) + 1);
    st = ts_block_cache_stats(c);
    assert_int_equal(st.allocated, 512);
    assert_int_equal(st.reserved, 1024 + (4u << 20) + 512);
    assert_int_equal(st.peak, 1024 + (4u << 20) + 512);
    /* the same rounded sizes come from the cache, not the source */
    void *a2 = ts_block_cache_alloc(c, 1020), *b2 = ts_block_cache_alloc(c, 4u << 20);
    assert_ptr_equal(a2, a);
    assert_ptr_equal(b2, b);
    assert_int_equal(s.allocs, 3);
    st = ts_block_cache_stats(c);
    assert_int_equal(st.n_allocs, 5);
    assert_int_equal(st.n_cache_hits, 2);
    ts_block_cache_release(c, a2, 1020);
    ts_block_cache_reset_peak(c);
    assert_int_equal(ts_block_cache_stats(c).peak, (4u << 20) + 512);
    /* emptying returns only the free blocks */
    ts_block_cache_empty(c);
    assert_int_equal(s.frees, 1);
    st = ts_block_cache_stats(c);
    assert_int_equal(st.reserved, st.allocated);
    ts_block_cache_release(c, b2, 4u << 20);
    ts_block_cache_release(c, z, 0);
    ts_block_cache_free_all(c);
    assert_int_equal(s.live, 0);
    assert_int_equal(s.allocs, s.frees);
    ts_block_cache_free_all(NULL);
}

/* A source that is full gets its cached blocks back before the cache
 * gives up; when even that is not enough the error says so. */
static void test_out_of_memory(void **state) {
    (void)state;
    source s = {.limit = (size_t)6 << 20};
    ts_block_cache *c = cache_over(&s);
    void *a = ts_block_cache_alloc(c, 4u << 20);
    assert_non_null(a);
    ts_block_cache_release(c, a, 4u << 20);
    void *b = ts_block_cache_alloc(c, 6u << 20); /* fits only once a is returned */
    assert_non_null(b);
    assert_int_equal(s.frees, 1);
    ts_clear_error();
    assert_null(ts_block_cache_alloc(c, 1u << 20));
    assert_int_equal(ts_last_status(), TS_ERR_MEMORY);
    assert_non_null(strstr(ts_last_error(), "out of memory for a block of 1048576 bytes"));
    ts_alloc_stats st = ts_block_cache_stats(c);
    assert_int_equal(st.allocated, 6u << 20);
    ts_block_cache_release(c, b, 6u << 20);
    ts_block_cache_free_all(c);
    assert_int_equal(s.live, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rounding_and_reuse),
        cmocka_unit_test(test_out_of_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
