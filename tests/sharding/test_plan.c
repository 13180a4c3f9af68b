/* test_plan.c - balanced ranges cover [0, n) exactly once; FSDP shards
 * are equal, padded, and their real parts cover a unit once; stage cuts are
 * contiguous, non-empty and minimise the largest stage. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "sharding/plan.h"

static void test_ranges_cover_once(void **state) {
    (void)state;
    int64_t sizes[] = {0, 1, 7, 100, 1000003};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++)
        for (int parts = 1; parts <= 8; parts++)
            for (int64_t align = 1; align <= 64; align *= 4) {
                ts_range r[8];
                assert_int_equal(ts_plan_ranges(sizes[k], parts, align, r), TS_OK);
                int64_t next = 0, lo = INT64_MAX, hi = 0;
                for (int p = 0; p < parts; p++) {
                    assert_int_equal(r[p].offset, next);
                    if (p < parts - 1 && r[p].len) assert_int_equal(r[p].offset % align, 0);
                    next += r[p].len;
                    if (r[p].len < lo) lo = r[p].len;
                    if (r[p].len > hi) hi = r[p].len;
                }
                assert_int_equal(next, sizes[k]);
                assert_true(hi - lo <= align);
                for (int64_t i = 0; i < sizes[k]; i += 1 + sizes[k] / 97) {
                    int o = ts_plan_owner(r, parts, i);
                    assert_true(o >= 0 && i >= r[o].offset && i < r[o].offset + r[o].len);
                }
                assert_int_equal(ts_plan_owner(r, parts, sizes[k]), -1);
            }
    ts_range r[2];
    assert_int_not_equal(ts_plan_ranges(10, 0, 1, r), TS_OK);
    assert_non_null(strstr(ts_last_error(), "into 0 parts"));
}

static void test_fsdp_shards(void **state) {
    (void)state;
    int64_t lens[] = {1, 3, 4, 7, 1000003};
    for (size_t k = 0; k < sizeof lens / sizeof *lens; k++)
        for (int n = 1; n <= 8; n++) {
            int64_t s = ts_plan_shard_len(lens[k], n), next = 0;
            assert_true(s * n >= lens[k] && s * n - lens[k] < n);
            for (int r = 0; r < n; r++) {
                ts_range x = ts_plan_shard_range(lens[k], n, r);
                assert_true(x.len >= 0 && x.len <= s);
                if (x.len) assert_int_equal(x.offset, r * s);
                if (x.len) assert_int_equal(x.offset, next);
                next += x.len;
            }
            assert_int_equal(next, lens[k]);
        }
    assert_int_equal(ts_plan_shard_range(3, 4, 3).len, 0); /* 4 shards of 1 for 3 elements */
}

static void test_stages_balance(void **state) {
    (void)state;
    double even[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    int first[8];
    assert_int_equal(ts_plan_stages(even, 8, 4, first), TS_OK);
    int want[] = {0, 2, 4, 6};
    assert_memory_equal(first, want, sizeof want);
    /* embedding + 4 blocks + head: the best largest stage costs 7 */
    double gpt[6] = {5, 2, 2, 2, 2, 5};
    assert_int_equal(ts_plan_stages(gpt, 6, 3, first), TS_OK);
    double worst = 0;
    for (int s = 0; s < 3; s++) {
        double c = 0;
        int end = s < 2 ? first[s + 1] : 6;
        assert_true(end > first[s]);
        for (int u = first[s]; u < end; u++) c += gpt[u];
        if (c > worst) worst = c;
    }
    assert_true(worst == 7);
    assert_int_equal(ts_plan_stages(gpt, 6, 6, first), TS_OK);
    for (int s = 0; s < 6; s++) assert_int_equal(first[s], s);
    assert_int_not_equal(ts_plan_stages(gpt, 6, 7, first), TS_OK);
    assert_non_null(strstr(ts_last_error(), "6 units into 7 pipeline stages"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ranges_cover_once),
        cmocka_unit_test(test_fsdp_shards),
        cmocka_unit_test(test_stages_balance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
