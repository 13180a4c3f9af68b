/* test_safetensors_torch.c - interop with PyTorch by the format's spec: a
 * file Tessera writes is read by /usr/bin/python3 with json + struct +
 * torch.frombuffer and gives the same values, and a file written that way
 * from PyTorch loads in Tessera. Fails (not skips) when torch is missing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "kernels/io/atomic.h"
#include "kernels/io/safetensors.h"
#include "../test_util.h"

#define SHAPE(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}

static ts_tensor *filled(ts_dtype dt, int ndim, const int64_t *shape, double (*f)(int64_t)) {
    ts_tensor *t = ts_tensor_empty(dt, ndim, shape);
    for (int64_t i = 0; i < ts_tensor_numel(t); i++) ts_tensor_set(t, i, f(i));
    return t;
}
static double f_w(int64_t i) { return (double)i * 0.25 - 1; }
static double f_f64(int64_t i) { return (double)i / 3; }
static double f_bf(int64_t i) { return (double)i * 0.5 - 2; }
static double f_i32(int64_t i) { return (double)(i * -7); }
static double f_i64(int64_t i) { return (double)(i * (1LL << 40) + 1); }
static double f_u8(int64_t i) { return (double)(i * 37 % 256); }

static void expect(const ts_safetensors *st, const char *name, ts_dtype dt, int ndim, const int64_t *shape,
                   const double *values) {
    ts_tensor *t = ts_safetensors_get(st, name);
    assert_non_null(t);
    assert_int_equal(t->dtype, dt);
    assert_int_equal(t->ndim, ndim);
    assert_memory_equal(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
    for (int64_t i = 0; i < ts_tensor_numel(t); i++)
        if (ts_tensor_get(t, i) != values[i]) fail_msg("%s[%lld] = %g, want %g", name, (long long)i, ts_tensor_get(t, i), values[i]);
    ts_tensor_release(t);
}

static void test_torch_interop(void **state) {
    (void)state;
    char dir[64];
    assert_int_equal(tu_make_tmp_dir(dir, sizeof dir, "ts_st_torch"), 0);
    char ours[128], theirs[128];
    snprintf(ours, sizeof ours, "%s/tessera.safetensors", dir);
    snprintf(theirs, sizeof theirs, "%s/torch.safetensors", dir);
    ts_tensor *ts[] = {
        filled(TS_F32, SHAPE(3, 4), f_w), filled(TS_F64, SHAPE(2, 3), f_f64), filled(TS_BF16, SHAPE(8), f_bf),
        filled(TS_I32, SHAPE(5), f_i32),  filled(TS_I64, SHAPE(4), f_i64),    filled(TS_U8, SHAPE(10), f_u8),
        ts_tensor_scalar(TS_F32, 2.5),    ts_tensor_zeros(TS_F32, SHAPE(0, 3)),
    };
    const char *names[] = {"encoder.layers.0.weight", "f64", "bf16", "i32", "i64", "u8", "scalar", "empty"};
    const char *mk[] = {"written_by"}, *mv[] = {"tessera"};
    assert_int_equal(ts_safetensors_write(ours, 8, names, ts, 1, mk, mv), TS_OK);
    for (int i = 0; i < 8; i++) ts_tensor_release(ts[i]);
    char args[300];
    snprintf(args, sizeof args, "%s %s", ours, theirs);
    tu_run_python("tests/kernels/safetensors_torch.py", args, 3); /* fails too when PyTorch cannot read our file */
    ts_safetensors *st = ts_safetensors_open(theirs);
    if (!st) fail_msg("%s", ts_last_error());
    assert_int_equal(st->n, 6);
    assert_non_null(strstr(ts_safetensors_meta(st, "written_by"), "torch"));
    expect(st, "decoder.proj.weight", TS_F32, SHAPE(3, 2), (double[]){0, 4.5, 1.5, 6, 3, 7.5});
    expect(st, "h", TS_F64, SHAPE(3), (double[]){1, -2, 1e-300});
    expect(st, "b", TS_BF16, SHAPE(3), (double[]){0.5, -3, 256});
    expect(st, "i", TS_I64, SHAPE(2, 3), (double[]){-1, 2, 3, 4, 5, (double)-(1LL << 50)});
    expect(st, "idx", TS_I32, SHAPE(3), (double[]){7, -8, 9});
    expect(st, "m", TS_U8, SHAPE(3), (double[]){0, 128, 255});
    /* and into existing tensors by name */
    ts_tensor *w = ts_tensor_zeros(TS_F32, SHAPE(3, 2));
    const char *wn[] = {"decoder.proj.weight"};
    assert_int_equal(ts_safetensors_load_into(st, 1, wn, &w, false), TS_OK);
    assert_true(ts_tensor_get(w, 5) == 7.5);
    ts_tensor_release(w);
    ts_safetensors_close(st);
    assert_int_equal(ts_io_remove_tree(dir), TS_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_torch_interop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
