/* test_idx.c - IDX files: the real Fashion-MNIST from the Debian package,
 * generated plain and gzipped files, and the errors for a missing file, a
 * wrong magic number, truncated or over-long files and labels out of range. */
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
#include <zlib.h>
#include <cmocka.h>

#include "kernels/data/idx.h"
#include "kernels/io/atomic.h"
#include "../test_util.h"

static char dir[256];

static int setup(void **state) {
    (void)state;
    return tu_make_tmp_dir(dir, sizeof dir, "ts_idx");
}

static int teardown(void **state) {
    (void)state;
    return tu_remove_dir(dir);
}

/* IDX bytes: magic (0, 0, type, ndim), big-endian dims, then count data
 * bytes (the values i*7 mod 256, or labels[i] when given). */
static size_t idx_bytes(uint8_t *out, uint8_t type, int ndim, const uint32_t *dims, size_t count,
                        const uint8_t *labels) {
    size_t n = 0;
    out[n++] = 0;
    out[n++] = 0;
    out[n++] = type;
    out[n++] = (uint8_t)ndim;
    for (int i = 0; i < ndim; i++)
        for (int b = 3; b >= 0; b--) out[n++] = (uint8_t)(dims[i] >> (8 * b));
    for (size_t i = 0; i < count; i++) out[n++] = labels ? labels[i] : (uint8_t)(i * 7);
    return n;
}

static void write_file(const char *name, const uint8_t *b, size_t n, bool gz, char *path) {
    snprintf(path, 512, "%s/%s", dir, name);
    if (gz) {
        gzFile g = gzopen(path, "wb");
        assert_non_null(g);
        assert_int_equal(gzwrite(g, b, (unsigned)n), (int)n);
        gzclose(g);
    } else {
        FILE *f = fopen(path, "wb");
        assert_int_equal(fwrite(b, 1, n, f), n);
        fclose(f);
    }
}

static void expect_error(const char *path, ts_status code, const char *msg) {
    ts_tensor *t = ts_idx_read(path);
    if (t || ts_last_status() != code || !strstr(ts_last_error(), msg) || !strstr(ts_last_error(), path))
        fail_msg("%s: expected %s error with '%s', got '%s'", path, ts_status_name(code), msg,
                 t ? "(read)" : ts_last_error());
}

static void test_generated_plain_and_gzip(void **state) {
    (void)state;
    uint8_t buf[256];
    uint32_t dims[3] = {5, 2, 3};
    size_t n = idx_bytes(buf, 0x08, 3, dims, 30, NULL);
    char plain[512], gz[512];
    write_file("img", buf, n, false, plain);
    write_file("img.gz", buf, n, true, gz);
    ts_tensor *a = ts_idx_read(plain), *b = ts_idx_read(gz);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(a->dtype, TS_U8);
    assert_int_equal(a->ndim, 3);
    assert_int_equal(a->shape[0], 5);
    assert_int_equal(a->shape[2], 3);
    assert_memory_equal(ts_tensor_data(a), ts_tensor_data(b), 30);
    assert_int_equal(((uint8_t *)ts_tensor_data(a))[29], (29 * 7) % 256);
    /* normalisation: (x/255 - mean)/std into [N, 1, R, C] */
    ts_tensor *f = ts_idx_images(a, 0.5f, 0.25f);
    assert_non_null(f);
    assert_int_equal(f->ndim, 4);
    assert_int_equal(f->shape[1], 1);
    assert_true(fabs(ts_f32(f)[3] - ((21.0 / 255 - 0.5) / 0.25)) < 1e-6);
    assert_null(ts_idx_images(a, 0.5f, 0.0f));
    assert_non_null(strstr(ts_last_error(), "std > 0"));
    ts_tensor_release(a);
    ts_tensor_release(b);
    ts_tensor_release(f);
}

static void test_bad_files(void **state) {
    (void)state;
    uint8_t buf[256];
    char p[512];
    uint32_t dims[3] = {5, 2, 3};
    size_t n = idx_bytes(buf, 0x08, 3, dims, 30, NULL);
    snprintf(p, sizeof p, "%s/absent-idx3-ubyte", dir);
    expect_error(p, TS_ERR_IO, "cannot open: No such file");
    /* wrong magic */
    uint8_t bad[256];
    memcpy(bad, buf, n);
    bad[0] = 0x1f;
    write_file("magic", bad, n, false, p);
    expect_error(p, TS_ERR_FORMAT, "wrong magic number 0x1f000803");
    memcpy(bad, buf, n);
    bad[2] = 0x0d; /* float data: a valid IDX type, not one we read */
    write_file("float", bad, n, false, p);
    expect_error(p, TS_ERR_UNSUPPORTED, "element type 0x0d");
    /* truncated: plain and gzipped */
    write_file("short", buf, n - 10, false, p);
    expect_error(p, TS_ERR_FORMAT, "truncated: dims [5,2,3] need 46 bytes, the file has 36");
    write_file("short.gz", buf, n - 10, true, p);
    expect_error(p, TS_ERR_FORMAT, "truncated: dims [5,2,3] need 46 bytes (uncompressed), the file has 36");
    write_file("hdr", buf, 9, false, p);
    expect_error(p, TS_ERR_FORMAT, "truncated in the header: 3 dims need 16 bytes, file has 9");
    write_file("tiny", buf, 2, false, p);
    expect_error(p, TS_ERR_FORMAT, "shorter than the 4-byte magic");
    /* a gzip stream cut in the middle */
    uint8_t big[4096];
    uint32_t bd[1] = {4000};
    size_t bn = idx_bytes(big, 0x08, 1, bd, 4000, NULL);
    write_file("cut.gz", big, bn, true, p);
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal(truncate(p, sb.st_size / 2), 0);
    expect_error(p, TS_ERR_FORMAT, "truncated");
    /* over-long */
    memcpy(bad, buf, n);
    bad[n] = 1;
    bad[n + 1] = 2;
    write_file("long", bad, n + 2, false, p);
    expect_error(p, TS_ERR_FORMAT, "need 46 bytes (uncompressed), the file has 48");
}

static void test_labels_and_split(void **state) {
    (void)state;
    uint8_t ib[256], lb[64];
    uint32_t idims[3] = {5, 2, 3}, ldims[1] = {5};
    uint8_t good[5] = {0, 9, 3, 3, 1}, badl[5] = {0, 1, 12, 3, 4};
    char ip[512], lp[512], lbad[512], lshort[512];
    write_file("i", ib, idx_bytes(ib, 0x08, 3, idims, 30, NULL), false, ip);
    write_file("l.gz", lb, idx_bytes(lb, 0x08, 1, ldims, 5, good), true, lp);
    write_file("lbad", lb, idx_bytes(lb, 0x08, 1, ldims, 5, badl), false, lbad);
    ldims[0] = 4;
    write_file("lshort", lb, idx_bytes(lb, 0x08, 1, ldims, 4, good), false, lshort);
    ts_tensor *x, *y;
    assert_int_equal(ts_idx_load(ip, lp, 10, 0, 1, &x, &y), TS_OK);
    assert_int_equal(y->dtype, TS_I64);
    assert_int_equal(((int64_t *)ts_tensor_data(y))[1], 9);
    assert_int_equal(ts_idx_load(ip, lbad, 10, 0, 1, &(ts_tensor *){NULL}, &(ts_tensor *){NULL}), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "label 12 at index 2 is out of range [0, 10)"));
    assert_non_null(strstr(ts_last_error(), lbad));
    assert_int_equal(ts_idx_load(ip, lshort, 10, 0, 1, &(ts_tensor *){NULL}, &(ts_tensor *){NULL}), TS_ERR_SHAPE);
    assert_non_null(strstr(ts_last_error(), "dims [5,2,3] but labels"));
    /* deterministic split: the last k rows */
    ts_tensor *tx, *ty, *vx, *vy;
    assert_int_equal(ts_idx_split(x, y, 2, 0, &tx, &ty, &vx, &vy), TS_OK);
    assert_int_equal(tx->shape[0], 3);
    assert_int_equal(vx->shape[0], 2);
    assert_true(ts_tensor_get(vy, 0) == 3 && ts_tensor_get(vy, 1) == 1);
    assert_true(ts_tensor_get(vx, 0) == ts_tensor_get(x, 18));
    ts_tensor *all[] = {tx, ty, vx, vy};
    for (int i = 0; i < 4; i++) ts_tensor_release(all[i]);
    assert_int_equal(ts_idx_split(x, y, -1, 0.4, &tx, &ty, &vx, &vy), TS_OK);
    assert_int_equal(vy->shape[0], 2);
    ts_tensor *all2[] = {tx, ty, vx, vy};
    for (int i = 0; i < 4; i++) ts_tensor_release(all2[i]);
    assert_int_equal(ts_idx_split(x, y, 6, 0, &tx, &ty, &vx, &vy), TS_ERR_VALUE);
    ts_tensor_release(x);
    ts_tensor_release(y);
}

static void test_configured_folder(void **state) {
    (void)state;
    char im[4096], lb[4096], p[512];
    assert_int_equal(ts_idx_fashion_mnist_paths("/nonexistent", true, im, lb, sizeof im), TS_ERR_IO);
    assert_non_null(strstr(ts_last_error(), "dataset-fashion-mnist"));
    uint8_t b[64];
    uint32_t d[1] = {3};
    write_file("t10k-images-idx3-ubyte", b, idx_bytes(b, 0x08, 1, d, 3, NULL), false, p);
    write_file("t10k-labels-idx1-ubyte.gz", b, idx_bytes(b, 0x08, 1, d, 3, NULL), true, p);
    assert_int_equal(ts_idx_fashion_mnist_paths(dir, false, im, lb, sizeof im), TS_OK);
    assert_non_null(strstr(im, "t10k-images-idx3-ubyte"));
    assert_null(strstr(im, ".gz"));
    assert_non_null(strstr(lb, "t10k-labels-idx1-ubyte.gz"));
}

static void check_fashion(bool train, int64_t n, const int64_t *first, uint64_t pixel_sum) {
    char im[4096], lb[4096];
    assert_int_equal(ts_idx_fashion_mnist_paths(NULL, train, im, lb, sizeof im), TS_OK);
    ts_tensor *raw = ts_idx_read(im);
    assert_non_null(raw);
    assert_int_equal(raw->ndim, 3);
    assert_int_equal(raw->shape[0], n);
    assert_int_equal(raw->shape[1], 28);
    assert_int_equal(raw->shape[2], 28);
    uint64_t sum = 0;
    const uint8_t *px = ts_tensor_data(raw);
    for (int64_t i = 0; i < n * 784; i++) sum += px[i];
    assert_int_equal(sum, pixel_sum);
    ts_tensor_release(raw);
    ts_tensor *x, *y;
    assert_int_equal(ts_idx_load_fashion_mnist(NULL, train, &x, &y), TS_OK);
    assert_int_equal(x->ndim, 4);
    assert_int_equal(x->shape[0], n);
    assert_int_equal(x->shape[1], 1);
    assert_int_equal(y->shape[0], n);
    int64_t counts[10] = {0};
    const int64_t *lab = ts_tensor_data(y);
    for (int64_t i = 0; i < n; i++) counts[lab[i]]++;
    for (int c = 0; c < 10; c++) assert_int_equal(counts[c], n / 10); /* balanced classes */
    assert_memory_equal(lab, first, 10 * sizeof(int64_t));
    if (train) { /* the default mean/std are the training set's */
        double m = 0, v = 0;
        const float *f = ts_f32(x);
        for (int64_t i = 0; i < n * 784; i++) m += f[i];
        m /= (double)(n * 784);
        for (int64_t i = 0; i < n * 784; i++) v += (f[i] - m) * (f[i] - m);
        v /= (double)(n * 784);
        assert_true(fabs(m) < 2e-3);
        assert_true(fabs(sqrt(v) - 1) < 2e-3);
    }
    ts_tensor_release(x);
    ts_tensor_release(y);
}

static void test_real_fashion_mnist(void **state) {
    (void)state;
    const int64_t train_first[10] = {9, 0, 0, 3, 0, 2, 7, 2, 5, 5};
    const int64_t test_first[10] = {9, 2, 1, 1, 6, 1, 4, 6, 5, 7};
    check_fashion(true, 60000, train_first, 3431114169ull);
    check_fashion(false, 10000, test_first, 573469082ull);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generated_plain_and_gzip),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_labels_and_split),
        cmocka_unit_test(test_configured_folder),
        cmocka_unit_test(test_real_fashion_mnist),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
