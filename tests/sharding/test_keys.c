/* test_keys.c - the parameter servers' key table: balanced, cut at tensor
 * boundaries where one is close; re-planning moves only the fair share and
 * keeps every key held exactly once; chains pick the first joiners. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "sharding/keys.h"

/* The MLP 784-256-128-10: weights and biases in registration order. */
static int mlp_tensors(ts_range *t) {
    int64_t sizes[] = {784 * 256, 256, 256 * 128, 128, 128 * 10, 10};
    int64_t off = 0;
    for (int i = 0; i < 6; i++) {
        t[i] = (ts_range){off, sizes[i]};
        off += sizes[i];
    }
    return 6;
}

static void test_plan_balanced_at_boundaries(void **state) {
    (void)state;
    ts_range t[6], r[4];
    int n = mlp_tensors(t);
    int64_t numel = t[5].offset + t[5].len;
    for (int shards = 1; shards <= 4; shards++) {
        assert_int_equal(ts_keys_plan(t, n, numel, shards, r), TS_OK);
        int64_t next = 0;
        for (int k = 0; k < shards; k++) {
            assert_int_equal(r[k].offset, next);
            next += r[k].len;
            /* within an eighth of a fair share of balance, plus the 16 alignment */
            int64_t fair = numel / shards;
            assert_true(llabs(r[k].len - fair) <= 2 * (fair / 8) + 16);
        }
        assert_int_equal(next, numel);
    }
    /* 2 shards: the balanced cut lies inside fc0.weight, far from any boundary */
    assert_int_equal(ts_keys_plan(t, n, numel, 2, r), TS_OK);
    assert_int_equal(r[0].len % 16, 0);
    /* a boundary close to the balanced cut is taken: two equal tensors */
    ts_range two[3] = {{0, 1000}, {1000, 990}, {1990, 10}};
    assert_int_equal(ts_keys_plan(two, 3, 2000, 2, r), TS_OK);
    assert_int_equal(r[0].len, 1000);
    ts_range near[2] = {{0, 1100}, {1100, 900}};
    assert_int_equal(ts_keys_plan(near, 2, 2000, 2, r), TS_OK);
    assert_int_equal(r[0].len, 1100); /* 100 from the cut, within 1000 / 8 */
    ts_range far[2] = {{0, 1300}, {1300, 700}};
    assert_int_equal(ts_keys_plan(far, 2, 2000, 2, r), TS_OK);
    assert_int_equal(r[0].len, 992); /* 1000 rounded down to 16 */
    /* more shards than keys: empty ranges, still a cover */
    ts_range tiny[1] = {{0, 3}};
    assert_int_equal(ts_keys_plan(tiny, 1, 3, 4, r), TS_OK);
    assert_int_equal(r[0].len + r[1].len + r[2].len + r[3].len, 3);
    /* overlapping tensors are refused with their index */
    ts_range bad[2] = {{0, 10}, {5, 10}};
    assert_int_not_equal(ts_keys_plan(bad, 2, 20, 2, r), TS_OK);
    assert_non_null(strstr(ts_last_error(), "tensor 1"));
}

/* Checks a table covers [0, numel) once, in order, and returns each shard's total. */
static void check_cover(const ts_keys_piece *p, int n, int64_t numel, int shards, int64_t *totals) {
    memset(totals, 0, (size_t)shards * sizeof *totals);
    int64_t next = 0;
    for (int i = 0; i < n; i++) {
        assert_int_equal(p[i].offset, next);
        assert_true(p[i].len > 0);
        assert_true(p[i].shard >= 0 && p[i].shard < shards);
        totals[p[i].shard] += p[i].len;
        next += p[i].len;
    }
    assert_int_equal(next, numel);
}

static void test_add_and_remove_move_the_fair_share(void **state) {
    (void)state;
    const int64_t numel = 1000003;
    ts_range r[3];
    assert_int_equal(ts_keys_plan(NULL, 0, numel, 3, r), TS_OK);
    ts_keys_piece table[3];
    for (int k = 0; k < 3; k++) table[k] = (ts_keys_piece){r[k].offset, r[k].len, k};
    ts_keys_piece *grown, *shrunk;
    ts_keys_move *moves;
    int n, nm;
    assert_int_equal(ts_keys_add_shard(table, 3, 3, &grown, &n, &moves, &nm), TS_OK);
    int64_t tot[4], moved = 0;
    check_cover(grown, n, numel, 4, tot);
    for (int i = 0; i < nm; i++) {
        assert_int_equal(moves[i].to, 3);
        moved += moves[i].len;
    }
    /* the new shard gets only what the others held above the fair share */
    assert_int_equal(moved, tot[3]);
    for (int k = 0; k < 3; k++) assert_int_equal(tot[k], numel / 4);
    assert_true(moved <= numel / 4 + 3);
    free(moves);
    /* now shard 1 leaves: only its keys move, to the others */
    int n2;
    assert_int_equal(ts_keys_remove_shard(grown, n, 4, 1, &shrunk, &n2, &moves, &nm), TS_OK);
    check_cover(shrunk, n2, numel, 3, tot);
    moved = 0;
    for (int i = 0; i < nm; i++) {
        assert_int_equal(moves[i].from, 1);
        assert_int_not_equal(moves[i].to, 1);
        moved += moves[i].len;
    }
    assert_int_equal(moved, numel / 4);
    for (int k = 0; k < 3; k++) assert_true(llabs(tot[k] - numel / 3) <= 2);
    free(moves);
    free(grown);
    free(shrunk);
    /* a table with a gap is refused */
    ts_keys_piece gap[2] = {{0, 10, 0}, {11, 5, 1}};
    assert_int_not_equal(ts_keys_add_shard(gap, 2, 2, &grown, &n, &moves, &nm), TS_OK);
    assert_non_null(strstr(ts_last_error(), "piece 1"));
    assert_int_not_equal(ts_keys_remove_shard(gap, 2, 1, 0, &grown, &n, &moves, &nm), TS_OK);
}

static void test_chains(void **state) {
    (void)state;
    int primary[2], backup[2];
    /* 2 shards x 2 replicas, all from generation 1 */
    ts_keys_server all[4] = {{0, 1}, {1, 1}, {2, 1}, {3, 1}};
    ts_keys_chains(all, 4, 2, primary, backup);
    assert_int_equal(primary[0], 0);
    assert_int_equal(backup[0], 2);
    assert_int_equal(primary[1], 1);
    assert_int_equal(backup[1], 3);
    /* rank 0 died: its backup is promoted; its restart (generation 3) is a spare */
    ts_keys_server after[4] = {{1, 1}, {2, 1}, {3, 1}, {0, 3}};
    ts_keys_chains(after, 4, 2, primary, backup);
    assert_int_equal(primary[0], 2);
    assert_int_equal(backup[0], -1);
    /* shard 1 without any live process */
    ts_keys_chains(all, 1, 2, primary, backup);
    assert_int_equal(primary[1], -1);
    assert_int_equal(backup[1], -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_balanced_at_boundaries),
        cmocka_unit_test(test_add_and_remove_move_the_fair_share),
        cmocka_unit_test(test_chains),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
