/* test_text.c - byte-level corpora: folder walk (sorted, index files
 * skipped), per-file validation tail, T+1 windows, bits per byte, the
 * Debian fortunes default and the errors. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "kernels/data/loader.h"
#include "kernels/data/text.h"
#include "kernels/io/atomic.h"
#include "../test_util.h"

static char dir[256];

static int setup(void **state) {
    (void)state;
    return tu_make_tmp_dir(dir, sizeof dir, "ts_text");
}

static int teardown(void **state) {
    (void)state;
    return tu_remove_dir(dir);
}

static void put(const char *rel, const char *text) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, rel);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_folder_corpus(void **state) {
    (void)state;
    char p[512];
    snprintf(p, sizeof p, "%s/sub", dir);
    assert_int_equal(mkdir(p, 0777), 0);
    put("b", "0123456789abcdefghij");  /* 20 bytes: 15 train, 5 validation */
    put("sub/c", "ABCDEFGH");          /* 8 bytes: 6 train, 2 validation */
    put("b.dat", "INDEX");             /* fortune index: skipped */
    put(".hidden", "HIDDEN");          /* skipped */
    snprintf(p, sizeof p, "%s/b.u8", dir);
    assert_int_equal(symlink("b", p), 0); /* the .u8 link: skipped */
    ts_text_corpus *c = ts_text_load(dir, 0.25);
    assert_non_null(c);
    assert_int_equal(c->nfiles, 2);
    assert_int_equal(c->n_train, 21);
    assert_int_equal(c->n_val, 7);
    assert_memory_equal(c->train, "0123456789abcdeABCDEF", 21);
    assert_memory_equal(c->val, "fghijGH", 7);
    /* windows of T+1 bytes every T bytes */
    ts_dataset *d = ts_text_dataset(c, false, 4, 0);
    assert_non_null(d);
    assert_int_equal(d->length(d), 5); /* starts 0,4,8,12,16 (16+5 = 21) */
    int64_t x[4], y[4];
    assert_int_equal(d->get(d, 4, x, y), TS_OK);
    assert_int_equal(x[0], 'B'); /* crosses from file b into sub/c */
    assert_int_equal(x[3], 'E');
    assert_int_equal(y[0], 'C');
    assert_int_equal(y[3], 'F');
    assert_int_equal(d->get(d, 3, x, y), TS_OK);
    assert_int_equal(x[0], 'c');
    assert_int_equal(y[3], 'B');
    assert_int_equal(d->get(d, 5, x, y), TS_ERR_INDEX);
    ts_dataset *overlap = ts_text_dataset(c, false, 4, 1);
    assert_int_equal(overlap->length(overlap), 17);
    ts_dataset *val = ts_text_dataset(c, true, 3, 0);
    assert_int_equal(val->length(val), 2);
    assert_null(ts_text_dataset(c, true, 7, 0));
    assert_non_null(strstr(ts_last_error(), "validation part has 7 bytes, too few for windows of T+1 = 8"));
    /* through the loader: [B, T] i64 batches */
    ts_loader_config cfg = {.batch_size = 2};
    ts_loader *l = ts_loader_create(d, &cfg);
    ts_batch b;
    assert_int_equal(ts_loader_next(l, &b), TS_OK);
    assert_int_equal(b.x->ndim, 2);
    assert_int_equal(b.x->shape[1], 4);
    assert_int_equal(b.y->dtype, TS_I64);
    assert_true(ts_tensor_get(b.x, 4) == '4' && ts_tensor_get(b.y, 7) == '8');
    ts_batch_release(&b);
    ts_loader_free(l);
    ts_dataset_free(d);
    ts_dataset_free(overlap);
    ts_dataset_free(val);
    ts_text_free(c);
    /* one file */
    snprintf(p, sizeof p, "%s/b", dir);
    c = ts_text_load(p, 0);
    assert_int_equal(c->n_train, 20);
    assert_int_equal(c->n_val, 0);
    ts_text_free(c);
}

static void test_errors_and_bpb(void **state) {
    (void)state;
    assert_null(ts_text_load("/nonexistent/corpus", 0.1));
    assert_non_null(strstr(ts_last_error(), "text /nonexistent/corpus: cannot open"));
    assert_null(ts_text_load(dir, 1.0));
    assert_non_null(strstr(ts_last_error(), "validation fraction 1 is not in [0, 1)"));
    char p[512];
    snprintf(p, sizeof p, "%s/empty", dir);
    assert_int_equal(mkdir(p, 0777), 0);
    assert_null(ts_text_load(p, 0.1));
    assert_non_null(strstr(ts_last_error(), "no text found"));
    assert_true(fabs(ts_text_bits_per_byte(log(2.0)) - 1.0) < 1e-12);
    assert_true(fabs(ts_text_bits_per_byte(log(256.0)) - 8.0) < 1e-12);
}

static void test_fortunes_default(void **state) {
    (void)state;
    ts_text_corpus *c = ts_text_load(NULL, 0.1);
    assert_non_null(c);
    assert_true(c->nfiles >= 10);
    assert_true(c->n_train > 1000000);
    double frac = (double)c->n_val / (double)(c->n_train + c->n_val);
    assert_true(frac > 0.099 && frac <= 0.1);
    /* the binary .dat index files start with zero bytes; fortune text has none */
    assert_null(memchr(c->train, 0, (size_t)c->n_train));
    assert_null(memchr(c->val, 0, (size_t)c->n_val));
    /* mostly letters and spaces */
    int64_t letters = 0;
    for (int64_t i = 0; i < c->n_train; i++) {
        uint8_t b = c->train[i];
        letters += (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || b == ' ';
    }
    assert_true(letters > c->n_train * 7 / 10);
    ts_text_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_folder_corpus),
        cmocka_unit_test(test_errors_and_bpb),
        cmocka_unit_test(test_fortunes_default),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
