/* test_loader.c - DataLoader: DistributedSampler coverage for several world
 * sizes, seeded shuffle, drop_last (W ranks at b as one rank at W * b),
 * re-sharding mid-epoch, position save/restore, prefetch thread
 * equivalence and error propagation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kernels/data/loader.h"

#define SHAPE(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}

/* Sample i: x = (i, 10 i) f32, y = i i64. */
static ts_dataset *make_ds(int64_t n) {
    ts_tensor *x = ts_tensor_empty(TS_F32, SHAPE(n, 2));
    ts_tensor *y = ts_tensor_arange(TS_I64, 0, (double)n, 1);
    for (int64_t i = 0; i < n; i++) {
        ts_f32(x)[2 * i] = (float)i;
        ts_f32(x)[2 * i + 1] = (float)(10 * i);
    }
    ts_dataset *d = ts_dataset_tensors("ids", x, y);
    ts_tensor_release(x);
    ts_tensor_release(y);
    return d;
}

static ts_loader *make_loader(ts_dataset *d, int64_t b, bool shuffle, uint64_t seed, bool drop, int rank, int world,
                              int prefetch) {
    ts_loader_config c = {.batch_size = b, .shuffle = shuffle, .seed = seed, .drop_last = drop, .rank = rank,
                          .world = world, .prefetch = prefetch};
    ts_loader *l = ts_loader_create(d, &c);
    assert_non_null(l);
    return l;
}

/* Next batch's sample ids into ids (returns the count), checking x agrees. */
static int64_t next_ids(ts_loader *l, int64_t *ids, ts_batch *keep) {
    ts_batch b;
    assert_int_equal(ts_loader_next(l, &b), TS_OK);
    for (int64_t k = 0; k < b.size; k++) {
        ids[k] = ((int64_t *)ts_tensor_data(b.y))[k];
        assert_true(ts_f32(b.x)[2 * k] == (float)ids[k] && ts_f32(b.x)[2 * k + 1] == (float)(10 * ids[k]));
    }
    int64_t n = b.size;
    if (keep) *keep = b;
    else ts_batch_release(&b);
    return n;
}

static void test_every_sample_once_per_epoch(void **state) {
    (void)state;
    const int64_t N = 50, B = 4;
    ts_dataset *d = make_ds(N);
    int worlds[] = {1, 2, 3, 4, 7};
    for (int wi = 0; wi < 5; wi++) {
        int W = worlds[wi];
        int64_t per = (N + W - 1) / W, nb = (per + B - 1) / B;
        int seen[50] = {0};
        int64_t total = 0;
        for (int r = 0; r < W; r++) {
            ts_loader *l = make_loader(d, B, true, 11, false, r, W, 0);
            assert_int_equal(ts_loader_batches_per_epoch(l), nb);
            int64_t got = 0, ids[4];
            for (int64_t k = 0; k < nb; k++) {
                ts_batch b;
                int64_t n = next_ids(l, ids, &b);
                assert_int_equal(b.last_in_epoch, k == nb - 1);
                assert_int_equal(b.start.epoch, 0);
                ts_batch_release(&b);
                for (int64_t j = 0; j < n; j++) seen[ids[j]]++;
                got += n;
            }
            assert_int_equal(got, per); /* every rank the same count */
            assert_int_equal(ts_loader_position(l).epoch, 1);
            total += got;
            ts_loader_free(l);
        }
        assert_int_equal(total, per * W);
        int64_t dups = 0;
        for (int i = 0; i < N; i++) {
            assert_true(seen[i] >= 1);
            dups += seen[i] - 1;
        }
        assert_int_equal(dups, per * W - N); /* only the wrapped pad repeats */
    }
    ts_dataset_free(d);
}

static void collect_epoch(ts_loader *l, int64_t *out, int64_t n) {
    int64_t got = 0;
    while (got < n) got += next_ids(l, out + got, NULL);
    assert_int_equal(got, n);
}

static void test_shuffle_by_seed(void **state) {
    (void)state;
    const int64_t N = 40;
    ts_dataset *d = make_ds(N);
    int64_t a[80], b[80], c[40], plain[40];
    ts_loader *la = make_loader(d, 5, true, 3, false, 0, 1, 0);
    ts_loader *lb = make_loader(d, 8, true, 3, false, 0, 1, 0); /* batch size does not change the order */
    ts_loader *lc = make_loader(d, 5, true, 4, false, 0, 1, 0);
    ts_loader *lp = make_loader(d, 5, false, 3, false, 0, 1, 0);
    collect_epoch(la, a, 80);
    collect_epoch(lb, b, 80);
    collect_epoch(lc, c, 40);
    collect_epoch(lp, plain, 40);
    assert_memory_equal(a, b, sizeof a);
    assert_memory_not_equal(a, c, sizeof c);
    assert_memory_not_equal(a, a + 40, sizeof c); /* a new order each epoch */
    int in_order = 1, seen[40] = {0};
    for (int i = 0; i < 40; i++) {
        in_order &= a[i] == i;
        seen[a[i]]++;
        assert_int_equal(plain[i], i);
    }
    assert_false(in_order);
    for (int i = 0; i < 40; i++) assert_int_equal(seen[i], 1);
    ts_loader_free(la);
    ts_loader_free(lb);
    ts_loader_free(lc);
    ts_loader_free(lp);
    ts_dataset_free(d);
}

static void test_drop_last(void **state) {
    (void)state;
    ts_dataset *d = make_ds(50);
    ts_loader *keep = make_loader(d, 8, false, 0, false, 0, 1, 0);
    ts_loader *drop = make_loader(d, 8, false, 0, true, 0, 1, 0);
    assert_int_equal(ts_loader_batches_per_epoch(keep), 7);
    assert_int_equal(ts_loader_batches_per_epoch(drop), 6);
    int64_t ids[8];
    for (int k = 0; k < 7; k++) assert_int_equal(next_ids(keep, ids, NULL), k < 6 ? 8 : 2);
    assert_int_equal(ids[1], 49);
    for (int k = 0; k < 6; k++) {
        ts_batch b;
        assert_int_equal(next_ids(drop, ids, &b), 8);
        assert_int_equal(b.last_in_epoch, k == 5);
        ts_batch_release(&b);
    }
    assert_int_equal(ts_loader_position(drop).epoch, 1);
    assert_int_equal(next_ids(drop, ids, NULL), 8); /* epoch 1 starts over */
    assert_int_equal(ids[0], 0);
    ts_loader_free(keep);
    ts_loader_free(drop);
    /* with drop_last, ranks that would get fewer samples than a batch are refused */
    ts_loader_config c = {.batch_size = 8, .drop_last = true, .rank = 0, .world = 8};
    assert_null(ts_loader_create(d, &c));
    assert_non_null(strstr(ts_last_error(), "50 samples over 8 ranks give 6 per rank, fewer than batch 8"));
    c.world = 2;
    c.rank = 2;
    assert_null(ts_loader_create(d, &c));
    assert_non_null(strstr(ts_last_error(), "rank 2 is not in [0, world 2)"));
    ts_dataset_free(d);
}

/* With drop_last, W ranks at batch b take, step by step and across
 * epochs, the samples of one rank at batch W * b: as many steps per epoch
 * and no sample padded in (26 samples at 3 x 3: 2 steps, not 3). */
static void test_drop_last_ranks_as_one(void **state) {
    (void)state;
    const int64_t N = 26, B = 3;
    ts_dataset *d = make_ds(N);
    for (int W = 2; W <= 4; W++) {
        ts_loader *one = make_loader(d, W * B, true, 7, true, 0, 1, 0), *ls[4];
        for (int r = 0; r < W; r++) ls[r] = make_loader(d, B, true, 7, true, r, W, 0);
        int64_t steps = ts_loader_batches_per_epoch(one);
        assert_int_equal(ts_loader_batches_per_epoch(ls[0]), steps);
        for (int64_t s = 0; s < 2 * steps; s++) {
            int want[26] = {0}, got[26] = {0};
            int64_t ids[12];
            int64_t n = next_ids(one, ids, NULL);
            for (int64_t j = 0; j < n; j++) want[ids[j]]++;
            for (int r = 0; r < W; r++) {
                int64_t m = next_ids(ls[r], ids, NULL);
                assert_int_equal(m, B);
                for (int64_t j = 0; j < m; j++) got[ids[j]]++;
            }
            assert_memory_equal(got, want, sizeof want);
            assert_int_equal(ts_loader_position(ls[W - 1]).epoch, ts_loader_position(one).epoch);
        }
        ts_loader_free(one);
        for (int r = 0; r < W; r++) ts_loader_free(ls[r]);
    }
    ts_dataset_free(d);
}

/* Runs W loaders in lockstep for steps steps, marking seen ids. */
static void lockstep(ts_loader **ls, int W, int steps, int *seen) {
    int64_t ids[16];
    for (int s = 0; s < steps; s++)
        for (int r = 0; r < W; r++) {
            int64_t n = next_ids(ls[r], ids, NULL);
            for (int64_t j = 0; j < n; j++) seen[ids[j]]++;
        }
}

static void reshard_case(int64_t N, bool via_reshard) {
    const int64_t B = 3;
    ts_dataset *d = make_ds(N);
    ts_loader *ls[3];
    for (int r = 0; r < 3; r++) ls[r] = make_loader(d, B, true, 5, false, r, 3, r == 1 ? 2 : 0);
    int before[64] = {0}, after[64] = {0};
    lockstep(ls, 3, 2, before);
    ts_loader_pos pos = ts_loader_position(ls[0]);
    assert_int_equal(pos.epoch, 0);
    assert_int_equal(pos.offset, 2 * B * 3);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(ts_loader_position(ls[r]).epoch, pos.epoch);
        assert_int_equal(ts_loader_position(ls[r]).offset, pos.offset);
    }
    /* the world shrinks to 2: rank 2 leaves, the others continue the same epoch */
    ts_loader_free(ls[2]);
    for (int r = 0; r < 2; r++) {
        if (via_reshard) {
            assert_int_equal(ts_loader_reshard(ls[r], r, 2), TS_OK);
        } else {
            ts_loader_free(ls[r]);
            ls[r] = make_loader(d, B, true, 5, false, r, 2, 0);
            assert_int_equal(ts_loader_set_position(ls[r], pos), TS_OK);
        }
    }
    int64_t remaining = N - pos.offset, per = (remaining + 1) / 2, nb = (per + B - 1) / B;
    assert_int_equal(ts_loader_batches_left(ls[0]), nb);
    lockstep(ls, 2, (int)nb, after);
    assert_int_equal(ts_loader_position(ls[0]).epoch, 1);
    assert_int_equal(ts_loader_position(ls[1]).offset, 0);
    int64_t total = 0;
    for (int i = 0; i < N; i++) {
        assert_true(before[i] + after[i] >= 1);    /* every sample this epoch */
        total += after[i];
    }
    assert_int_equal(total, 2 * per);
    if (remaining % 2 == 0)
        for (int i = 0; i < N; i++) assert_int_equal(before[i] + after[i], 1); /* exactly once */
    ts_loader_free(ls[0]);
    ts_loader_free(ls[1]);
    ts_dataset_free(d);
}

static void test_reshard_mid_epoch(void **state) {
    (void)state;
    reshard_case(60, true);
    reshard_case(60, false);
    reshard_case(61, true); /* 43 remaining over 2 ranks: one wrapped pad */
}

/* Compares the next n batches of a and b byte for byte. */
static void assert_same_batches(ts_loader *a, ts_loader *b, int n) {
    for (int k = 0; k < n; k++) {
        ts_batch x, y;
        assert_int_equal(ts_loader_next(a, &x), TS_OK);
        assert_int_equal(ts_loader_next(b, &y), TS_OK);
        assert_int_equal(x.size, y.size);
        assert_memory_equal(ts_tensor_data(x.x), ts_tensor_data(y.x), ts_tensor_nbytes(x.x));
        assert_memory_equal(ts_tensor_data(x.y), ts_tensor_data(y.y), ts_tensor_nbytes(x.y));
        assert_memory_equal(&x.next, &y.next, sizeof x.next);
        assert_int_equal(x.last_in_epoch, y.last_in_epoch);
        ts_batch_release(&x);
        ts_batch_release(&y);
    }
}

static void test_position_save_restore(void **state) {
    (void)state;
    ts_dataset *d = make_ds(37);
    ts_loader *a = make_loader(d, 4, true, 9, false, 1, 2, 0);
    int64_t ids[4];
    for (int k = 0; k < 7; k++) next_ids(a, ids, NULL); /* 5 batches per epoch: into epoch 1 */
    ts_loader_pos pos = ts_loader_position(a);
    assert_int_equal(pos.epoch, 1);
    assert_int_equal(pos.offset, 2 * 4 * 2);
    ts_loader *b = make_loader(d, 4, true, 9, false, 1, 2, 0);
    assert_int_equal(ts_loader_set_position(b, pos), TS_OK);
    assert_same_batches(a, b, 12);
    assert_int_equal(ts_loader_set_position(b, (ts_loader_pos){0, 38}), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "offset 38) outside [0, 37]"));
    ts_loader_free(a);
    ts_loader_free(b);
    ts_dataset_free(d);
}

static void test_prefetch_same_batches(void **state) {
    (void)state;
    ts_dataset *d = make_ds(45);
    ts_loader *plain = make_loader(d, 4, true, 2, false, 0, 3, 0);
    ts_loader *pre = make_loader(d, 4, true, 2, false, 0, 3, 3);
    assert_same_batches(plain, pre, 10);
    /* moving both keeps them equal (queued batches are dropped) */
    ts_loader_pos p = {5, 12};
    assert_int_equal(ts_loader_set_position(plain, p), TS_OK);
    assert_int_equal(ts_loader_set_position(pre, p), TS_OK);
    assert_same_batches(plain, pre, 6);
    assert_int_equal(ts_loader_reshard(plain, 1, 2), TS_OK);
    assert_int_equal(ts_loader_reshard(pre, 1, 2), TS_OK);
    assert_same_batches(plain, pre, 9);
    ts_loader_free(plain);
    ts_loader_free(pre); /* stops a thread blocked on a full queue */
    ts_dataset_free(d);
}

/* A dataset whose sample 13 cannot be read. */
static int64_t bad_len(const ts_dataset *d) {
    (void)d;
    return 20;
}
static ts_status bad_get(const ts_dataset *d, int64_t i, void *x, void *y) {
    (void)d;
    if (i == 13) return ts_error(TS_ERR_IO, "bad dataset: sample %lld is unreadable", (long long)i);
    *(float *)x = (float)i;
    *(int64_t *)y = i;
    return TS_OK;
}

static void test_dataset_error_through_prefetch(void **state) {
    (void)state;
    ts_dataset d = {.name = "bad", .length = bad_len, .get = bad_get, .x_dtype = TS_F32, .y_dtype = TS_I64};
    ts_loader *l = make_loader(&d, 5, false, 0, false, 0, 1, 2);
    ts_batch b;
    assert_int_equal(ts_loader_next(l, &b), TS_OK);
    ts_batch_release(&b);
    assert_int_equal(ts_loader_next(l, &b), TS_OK);
    ts_batch_release(&b);
    assert_int_equal(ts_loader_next(l, &b), TS_ERR_IO);
    assert_non_null(strstr(ts_last_error(), "sample 13 is unreadable"));
    assert_int_equal(ts_loader_position(l).offset, 10); /* the failed batch was not consumed */
    assert_int_equal(ts_loader_next(l, &b), TS_ERR_IO); /* and fails again, not hangs */
    assert_int_equal(ts_loader_set_position(l, (ts_loader_pos){0, 15}), TS_OK);
    assert_int_equal(ts_loader_next(l, &b), TS_OK);
    assert_true(ts_f32(b.x)[0] == 15.0f);
    ts_batch_release(&b);
    ts_loader_free(l);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_sample_once_per_epoch),
        cmocka_unit_test(test_shuffle_by_seed),
        cmocka_unit_test(test_drop_last),
        cmocka_unit_test(test_drop_last_ranks_as_one),
        cmocka_unit_test(test_reshard_mid_epoch),
        cmocka_unit_test(test_position_save_restore),
        cmocka_unit_test(test_prefetch_same_batches),
        cmocka_unit_test(test_dataset_error_through_prefetch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
