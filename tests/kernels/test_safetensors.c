/* test_safetensors.c - safetensors round trips for every dtype, loading
 * into existing tensors, F16 entries (written elsewhere) read as f32 bit for
 * bit, refusal of corrupt/truncated/overlapping files with the right
 * message, and atomic writes that never leave a partial file. */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "kernels/io/atomic.h"
#include "kernels/io/safetensors.h"
#include "kernels/ops/view.h"
#include "../test_util.h"

#define SHAPE(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}

static char dir[256];

static int setup(void **state) {
    (void)state;
    return tu_make_tmp_dir(dir, sizeof dir, "ts_safetensors");
}

static int teardown(void **state) {
    (void)state;
    return tu_remove_dir(dir);
}

static void path_in(char *out, const char *name) { snprintf(out, 512, "%s/%s", dir, name); }

/* Number of entries in dir other than . and .. */
static int count_files(void) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static void assert_same_values(const ts_tensor *a, const ts_tensor *b) {
    assert_int_equal(a->dtype, b->dtype);
    assert_true(ts_tensor_same_shape(a, b));
    for (int64_t i = 0; i < ts_tensor_numel(a); i++) assert_true(ts_tensor_get(a, i) == ts_tensor_get(b, i));
}

static void test_round_trip_all_dtypes(void **state) {
    (void)state;
    ts_key k = ts_key_from_seed(7);
    ts_tensor *f32 = ts_tensor_randn(k, TS_F32, SHAPE(3, 4));
    ts_tensor *f64 = ts_tensor_randn(ts_key_split(k, 1), TS_F64, SHAPE(2, 3));
    ts_tensor *bf = ts_tensor_copy_as(f32, TS_BF16);
    ts_tensor *i32 = ts_tensor_arange(TS_I32, -5, 5, 1);
    ts_tensor *i64 = ts_tensor_full(TS_I64, SHAPE(2, 2), 0);
    ts_tensor_set(i64, 0, (double)(1LL << 40));
    ts_tensor_set(i64, 3, -123456789);
    ts_tensor *u8 = ts_tensor_arange(TS_U8, 250, 256, 1);
    ts_tensor *scalar = ts_tensor_scalar(TS_F32, 3.5);
    ts_tensor *empty = ts_tensor_empty(TS_F32, SHAPE(0, 3));
    ts_tensor *tr = ts_transpose(f32, 0, 1); /* non-contiguous [4,3] */
    const char *names[] = {"layer.weight", "f64", "bf16", "i32", "i64", "u8", "scalar", "empty", "transposed"};
    ts_tensor *ts[] = {f32, f64, bf, i32, i64, u8, scalar, empty, tr};
    const char *mk[] = {"format", "note"}, *mv[] = {"pt", "hello \"world\""};
    char p[512];
    path_in(p, "all.safetensors");
    assert_int_equal(ts_safetensors_write(p, 9, names, ts, 2, mk, mv), TS_OK);
    ts_safetensors *st = ts_safetensors_open(p);
    assert_non_null(st);
    assert_int_equal(st->n, 9);
    assert_string_equal(ts_safetensors_meta(st, "note"), "hello \"world\"");
    assert_string_equal(ts_safetensors_meta(st, "format"), "pt");
    assert_null(ts_safetensors_meta(st, "absent"));
    for (int i = 0; i < 9; i++) {
        ts_tensor *got = ts_safetensors_get(st, names[i]);
        assert_non_null(got);
        assert_same_values(got, ts[i]);
        ts_tensor_release(got);
    }
    /* raw bytes of the bf16 entry are the bf16 bits */
    const ts_safetensors_entry *e = &st->entries[ts_safetensors_find(st, "bf16")];
    assert_int_equal(e->end - e->begin, 24);
    assert_memory_equal(st->data + e->begin, ts_tensor_data(bf), 24);
    /* the header length is a multiple of 8 and the data starts aligned */
    assert_int_equal(((uintptr_t)st->data - (uintptr_t)st->map) % 8, 0);
    /* load into existing tensors, one of them a strided view */
    ts_tensor *dst_f32 = ts_tensor_zeros(TS_F32, SHAPE(4, 3));
    ts_tensor *dst_t = ts_transpose(dst_f32, 0, 1); /* [3,4] non-contiguous */
    ts_tensor *dst_u8 = ts_tensor_zeros(TS_U8, SHAPE(6));
    const char *ln[] = {"layer.weight", "u8"};
    ts_tensor *lt[] = {dst_t, dst_u8};
    assert_int_equal(ts_safetensors_load_into(st, 2, ln, lt, false), TS_OK);
    assert_same_values(dst_t, f32);
    assert_same_values(dst_u8, u8);
    /* strict: the file holds entries the caller did not ask for */
    assert_int_equal(ts_safetensors_load_into(st, 2, ln, lt, true), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "'f64' in the file is not in the model"));
    ts_safetensors_close(st);
    ts_tensor *all[] = {f32, f64, bf, i32, i64, u8, scalar, empty, tr, dst_f32, dst_t, dst_u8};
    for (int i = 0; i < 12; i++) ts_tensor_release(all[i]);
}

static void test_load_into_checks(void **state) {
    (void)state;
    ts_tensor *w = ts_tensor_ones(TS_F32, SHAPE(4, 8));
    const char *names[] = {"fc.weight"};
    char p[512];
    path_in(p, "one.safetensors");
    assert_int_equal(ts_safetensors_write(p, 1, names, &w, 0, NULL, NULL), TS_OK);
    ts_safetensors *st = ts_safetensors_open(p);
    assert_non_null(st);
    ts_tensor *wrong = ts_tensor_full(TS_F32, SHAPE(8, 4), 5);
    assert_int_equal(ts_safetensors_load_into(st, 1, names, &wrong, true), TS_ERR_SHAPE);
    assert_non_null(strstr(ts_last_error(), "'fc.weight' has shape [4,8] in the file but [8,4] in the model"));
    assert_true(ts_tensor_get(wrong, 0) == 5); /* untouched */
    ts_tensor *wd = ts_tensor_zeros(TS_F64, SHAPE(4, 8));
    assert_int_equal(ts_safetensors_load_into(st, 1, names, &wd, true), TS_ERR_DTYPE);
    assert_non_null(strstr(ts_last_error(), "dtype F32 in the file but F64"));
    const char *missing[] = {"fc.bias"};
    assert_int_equal(ts_safetensors_load_into(st, 1, missing, &w, false), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "no tensor named 'fc.bias'"));
    assert_null(ts_safetensors_get(st, "nope"));
    ts_safetensors_close(st);
    /* writer refuses duplicate names */
    const char *dup[] = {"a", "a"};
    ts_tensor *two[] = {w, w};
    path_in(p, "dup.safetensors");
    assert_int_equal(ts_safetensors_write(p, 2, dup, two, 0, NULL, NULL), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "name 'a' given twice"));
    assert_null(ts_safetensors_open(p));
    assert_non_null(strstr(ts_last_error(), "cannot open"));
    const char *bad_utf8[] = {"caf\xc3"};
    assert_int_equal(ts_safetensors_write(p, 1, bad_utf8, &w, 0, NULL, NULL), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "is not valid UTF-8"));
    ts_tensor_release(w);
    ts_tensor_release(wrong);
    ts_tensor_release(wd);
}

/* Writes a file with the given header text (padded) and n data bytes. */
static void write_raw(const char *p, const char *header, const void *data, size_t n, int64_t hlen_override) {
    FILE *f = fopen(p, "wb");
    size_t len = strlen(header), padded = (len + 7) / 8 * 8;
    uint64_t hl = hlen_override >= 0 ? (uint64_t)hlen_override : padded;
    uint8_t lb[8];
    for (int i = 0; i < 8; i++) lb[i] = (uint8_t)(hl >> (8 * i));
    fwrite(lb, 1, 8, f);
    fwrite(header, 1, len, f);
    for (size_t i = len; i < padded; i++) fputc(' ', f);
    if (n) fwrite(data, 1, n, f);
    fclose(f);
}

/* The value the half with bits h stands for, by the format's definition:
 * (-1)^s * m * 2^-24 when the exponent field e is 0, (-1)^s * (1024 + m) *
 * 2^(e - 25) up to 30, and infinity (m = 0) or NaN at 31. */
static double half_value(unsigned h) {
    unsigned e = (h >> 10) & 31, m = h & 1023;
    double v = e == 31 ? (m ? NAN : INFINITY) : e == 0 ? ldexp(m, -24) : ldexp(1024 + m, (int)e - 25);
    return h & 0x8000 ? -v : v;
}

/* A file holding every one of the 65536 F16 values and a [2,3] F16 entry
 * reads as f32 bit for bit (subnormals, -0, infinities; a NaN stays a NaN of
 * its sign); the first value that is not finite is found; loading F16 by
 * name into an f32 tensor, as a checkpoint's entries load, is refused naming
 * both dtypes. Before, opening the file failed on the dtype. */
static void test_f16_read(void **state) {
    (void)state;
    enum { N = 65536 };
    static uint16_t data[N + 6];
    for (unsigned i = 0; i < N; i++) data[i] = (uint16_t)i;
    const uint16_t m[6] = {0x0001, 0x83ff, 0x0400, 0x3c00, 0xc000, 0x7bff};
    memcpy(data + N, m, sizeof m);
    char p[512];
    path_in(p, "f16.safetensors");
    write_raw(p,
              "{\"all\":{\"dtype\":\"F16\",\"shape\":[65536],\"data_offsets\":[0,131072]},"
              "\"m\":{\"dtype\":\"F16\",\"shape\":[2,3],\"data_offsets\":[131072,131084]}}",
              data, sizeof data, -1);
    ts_safetensors *st = ts_safetensors_open(p);
    if (!st) fail_msg("%s", ts_last_error());
    assert_int_equal(st->entries[ts_safetensors_find(st, "all")].dtype, TS_SAFETENSORS_F16);
    ts_tensor *all = ts_safetensors_get(st, "all"), *mt = ts_safetensors_get(st, "m");
    assert_non_null(all);
    assert_non_null(mt);
    assert_int_equal(all->dtype, TS_F32);
    for (unsigned i = 0; i < N; i++) {
        float want = (float)half_value(i), got = ts_f32(all)[i];
        if (isnan(want) ? !isnan(got) || signbit(got) != signbit(want) : memcmp(&got, &want, 4) != 0)
            fail_msg("half 0x%04x read as %a, want %a", i, (double)got, (double)want);
    }
    assert_int_equal(mt->dtype, TS_F32);
    assert_int_equal(mt->ndim, 2);
    assert_int_equal(mt->shape[1], 3);
    const float mv[6] = {0x1p-24f, -1023 * 0x1p-24f, 0x1p-14f, 1.0f, -2.0f, 65504.0f};
    assert_memory_equal(ts_f32(mt), mv, sizeof mv);
    double v = 0;
    assert_int_equal(ts_safetensors_nonfinite(st, ts_safetensors_find(st, "m"), &v), -1);
    assert_int_equal(ts_safetensors_nonfinite(st, ts_safetensors_find(st, "all"), &v), 0x7c00);
    assert_true(v == INFINITY);
    ts_tensor *dst = ts_tensor_zeros(TS_F32, SHAPE(2, 3));
    const char *mn[] = {"m"};
    assert_int_equal(ts_safetensors_load_into(st, 1, mn, &dst, false), TS_ERR_DTYPE);
    assert_non_null(strstr(ts_last_error(), "'m' has dtype F16 in the file but F32 in the model"));
    ts_tensor_release(dst);
    ts_tensor_release(all);
    ts_tensor_release(mt);
    ts_safetensors_close(st);
}

static void expect_refused(const char *header, size_t ndata, int64_t hlen, const char *msg) {
    char p[512];
    path_in(p, "bad.safetensors");
    uint8_t data[64] = {0};
    write_raw(p, header, data, ndata, hlen);
    ts_safetensors *st = ts_safetensors_open(p);
    if (st || !strstr(ts_last_error(), msg) || !strstr(ts_last_error(), p))
        fail_msg("header %s: expected an error with '%s', got '%s'", header, msg, st ? "(opened)" : ts_last_error());
}

static void test_corrupt_files_refused(void **state) {
    (void)state;
    const char *a8 = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    char p[512];
    path_in(p, "bad.safetensors");
    uint8_t zeros[8] = {0};
    write_raw(p, a8, zeros, 8, -1);
    ts_safetensors *ok = ts_safetensors_open(p); /* the control case opens */
    assert_non_null(ok);
    ts_safetensors_close(ok);
    expect_refused(a8, 4, -1, "lies past the end of the data section (4 bytes; file truncated?)");
    expect_refused(a8, 8, 4096, "header length 4096 exceeds");
    expect_refused(a8, 12, -1, "data section has 12 bytes but the tensors cover 8");
    expect_refused("[1,2,3]", 0, -1, "does not start with '{'");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 8, -1, "JSON header invalid");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                   12, -1, "tensor 'b' data [4, 12) overlaps tensor 'a'");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, -1,
                   "tensor 'a' (F32 [3]) needs 12 bytes but data_offsets [0, 8) hold 8");
    expect_refused("{\"a\":{\"dtype\":\"I16\",\"shape\":[4],\"data_offsets\":[0,8]}}", 8, -1,
                   "unsupported dtype 'I16'");
    expect_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                   "\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]}}",
                   8, -1, "duplicate");
    expect_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]}}", 8, -1,
                   "unused bytes [0, 4) before tensor 'a'");
    expect_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[-4],\"data_offsets\":[0,4]}}", 4, -1, "shape dim 0");
    expect_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,0]}}", 4, -1, "begin <= end");
    expect_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4],\"x\":1}}", 4, -1,
                   "unknown field 'x'");
    expect_refused("{\"__metadata__\":{\"k\":3}}", 0, -1, "metadata 'k' is not a string");
    /* shorter than the length prefix */
    FILE *f = fopen(p, "wb");
    fwrite("abc", 1, 3, f);
    fclose(f);
    assert_null(ts_safetensors_open(p));
    assert_non_null(strstr(ts_last_error(), "shorter than the 8-byte header length"));
    /* a real file truncated by one byte */
    ts_tensor *t = ts_tensor_ones(TS_F64, SHAPE(10));
    const char *n1[] = {"x"};
    assert_int_equal(ts_safetensors_write(p, 1, n1, &t, 0, NULL, NULL), TS_OK);
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal(truncate(p, sb.st_size - 1), 0);
    assert_null(ts_safetensors_open(p));
    assert_non_null(strstr(ts_last_error(), "file truncated?"));
    ts_tensor_release(t);
}

static void test_atomic_write(void **state) {
    (void)state;
    char p[512];
    path_in(p, "keep.safetensors");
    ts_tensor *small = ts_tensor_full(TS_F32, SHAPE(4), 1.25);
    const char *n1[] = {"w"};
    assert_int_equal(ts_safetensors_write(p, 1, n1, &small, 0, NULL, NULL), TS_OK);
    int before = count_files();
    /* a write that fails halfway (file size limit) leaves the old file and no temp file */
    ts_tensor *big = ts_tensor_zeros(TS_F32, SHAPE(1 << 16));
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 4096;
    signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    ts_status s = ts_safetensors_write(p, 1, n1, &big, 0, NULL, NULL);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    assert_int_equal(s, TS_ERR_IO);
    assert_non_null(strstr(ts_last_error(), p));
    assert_int_equal(count_files(), before);
    ts_safetensors *st = ts_safetensors_open(p);
    assert_non_null(st);
    ts_tensor *got = ts_safetensors_get(st, "w");
    assert_same_values(got, small);
    ts_tensor_release(got);
    ts_safetensors_close(st);
    /* a folder that does not exist: an error naming the path, nothing written */
    assert_int_equal(ts_safetensors_write("/nonexistent-dir/x.safetensors", 1, n1, &small, 0, NULL, NULL), TS_ERR_IO);
    assert_non_null(strstr(ts_last_error(), "/nonexistent-dir/x.safetensors"));
    /* overwriting replaces the content */
    assert_int_equal(ts_safetensors_write(p, 1, n1, &big, 0, NULL, NULL), TS_OK);
    st = ts_safetensors_open(p);
    assert_non_null(st);
    assert_int_equal(st->entries[0].shape[0], 1 << 16);
    ts_safetensors_close(st);
    assert_int_equal(count_files(), before);
    ts_tensor_release(small);
    ts_tensor_release(big);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_all_dtypes),
        cmocka_unit_test(test_load_into_checks),
        cmocka_unit_test(test_f16_read),
        cmocka_unit_test(test_corrupt_files_refused),
        cmocka_unit_test(test_atomic_write),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
