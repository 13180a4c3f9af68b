/* test_parity.c - Tessera against PyTorch on the same inputs.
 *
 * For each case (matmul, layernorm, softmax, cross-entropy, conv2d,
 * max_pool2d, attention) the inputs come from fixed Philox keys; Tessera runs
 * the forward and the backward with a fixed upstream gradient. Inputs,
 * upstream gradient, output and input gradients go to a temporary folder as
 * raw little-endian files (f32, or i64 for class indices) described by
 * manifest.json; tests/kernels/parity_torch.py recomputes everything with
 * torch (float32) and prints, per case and tensor, the relative error
 * max|tessera - torch| / max|torch| (the largest deviation measured against
 * the tensor's scale, so near-zero entries do not inflate it). The test fails
 * if any exceeds 1e-5, or if /usr/bin/python3 cannot import torch.
 */
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
#include <jansson.h>

#include "kernels/autograd.h"
#include "kernels/ops/attention.h"
#include "kernels/ops/conv.h"
#include "kernels/ops/loss.h"
#include "kernels/ops/matmul.h"
#include "kernels/ops/norm.h"
#include "kernels/ops/pool.h"
#include "kernels/ops/softmax.h"
#include "../test_util.h"

#define SHAPE(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}
#define MAX_IN 4

typedef struct {
    char dir[64];
    int nfiles;
    json_t *cases;
} manifest;

/* Writes t (contiguous copy) to a new file; returns its description. */
static json_t *save(manifest *m, const ts_tensor *t) {
    char name[32], path[128];
    snprintf(name, sizeof name, "t%03d.bin", m->nfiles++);
    snprintf(path, sizeof path, "%s/%s", m->dir, name);
    ts_tensor *c = ts_tensor_copy_as(t, t->dtype);
    FILE *f = fopen(path, "wb");
    assert_non_null(c);
    assert_non_null(f);
    assert_int_equal(fwrite(ts_tensor_data(c), 1, ts_tensor_nbytes(c), f), ts_tensor_nbytes(c));
    fclose(f);
    ts_tensor_release(c);
    json_t *shape = json_array();
    for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
    return json_pack("{s:s, s:o, s:s}", "file", name, "shape", shape, "dtype", ts_dtype_name(t->dtype));
}

typedef ts_tensor *(*case_fn)(ts_tensor *const *in, const json_t *attrs);

/* Runs one case: fn on inputs (float ones get requires_grad), backward with
 * a keyed upstream gradient, everything saved under the case name. */
static void run_case(manifest *m, const char *name, const char *op, json_t *attrs, case_fn fn, int n,
                     const char *const *names, ts_tensor *const *in) {
    for (int i = 0; i < n; i++)
        if (ts_dtype_is_float(in[i]->dtype)) assert_int_equal(ts_set_requires_grad(in[i], true), TS_OK);
    ts_tensor *out = fn(in, attrs);
    if (!out) fail_msg("%s: %s", name, ts_last_error());
    ts_tensor *up = ts_tensor_randn(ts_key_from_seed(0x7570 + (uint64_t)m->nfiles), TS_F32, out->ndim, out->shape);
    assert_int_equal(ts_backward(out, up), TS_OK);
    json_t *inputs = json_object(), *grads = json_object();
    for (int i = 0; i < n; i++) {
        json_object_set_new(inputs, names[i], save(m, in[i]));
        if (in[i]->grad) json_object_set_new(grads, names[i], save(m, in[i]->grad));
    }
    json_array_append_new(m->cases, json_pack("{s:s, s:s, s:o, s:o, s:o, s:o, s:o}", "name", name, "op", op,
                                              "attrs", attrs, "inputs", inputs, "upstream", save(m, up),
                                              "output", save(m, out), "grads", grads));
    ts_tensor_release(up);
    ts_tensor_release(out);
}

static ts_tensor *randn(uint64_t seed, int ndim, const int64_t *shape) {
    return ts_tensor_randn(ts_key_from_seed(seed), TS_F32, ndim, shape);
}

static int64_t attr_int(const json_t *attrs, const char *key) {
    return json_integer_value(json_object_get(attrs, key));
}

static ts_tensor *matmul_fn(ts_tensor *const *in, const json_t *a) {
    (void)a;
    return ts_matmul(in[0], in[1]);
}

static ts_tensor *layernorm_fn(ts_tensor *const *in, const json_t *a) {
    return ts_layernorm(in[0], in[1], in[2], json_real_value(json_object_get(a, "eps")));
}

static ts_tensor *softmax_fn(ts_tensor *const *in, const json_t *a) {
    return json_is_true(json_object_get(a, "log")) ? ts_log_softmax(in[0], (int)attr_int(a, "dim")) : ts_softmax(in[0], (int)attr_int(a, "dim"));
}

static ts_tensor *cross_entropy_fn(ts_tensor *const *in, const json_t *a) {
    const char *red = json_string_value(json_object_get(a, "reduction"));
    return ts_cross_entropy(in[0], in[1], attr_int(a, "ignore_index"),
                            strcmp(red, "mean") ? TS_REDUCTION_SUM : TS_REDUCTION_MEAN);
}

static ts_tensor *conv2d_fn(ts_tensor *const *in, const json_t *a) {
    ts_conv2d_opts o = ts_conv2d_default_opts();
    o.stride_h = o.stride_w = attr_int(a, "stride");
    o.pad_h = o.pad_w = attr_int(a, "padding");
    o.dil_h = o.dil_w = attr_int(a, "dilation");
    return ts_conv2d(in[0], in[1], in[2], &o);
}

static ts_tensor *max_pool2d_fn(ts_tensor *const *in, const json_t *a) {
    int64_t k = attr_int(a, "kernel"), s = attr_int(a, "stride"), p = attr_int(a, "padding");
    return ts_max_pool2d(in[0], k, k, s, s, p, p);
}

static ts_tensor *attention_fn(ts_tensor *const *in, const json_t *a) {
    return ts_attention(in[0], in[1], in[2], json_is_true(json_object_get(a, "causal")),
                        json_real_value(json_object_get(a, "scale")));
}

/* Releases the n case inputs. */
static void release_all(int n, ts_tensor **t) {
    for (int i = 0; i < n; i++) ts_tensor_release(t[i]);
}

static void build_cases(manifest *m) {
    {
        const char *nm[] = {"a", "b"};
        ts_tensor *in[] = {randn(1, SHAPE(37, 64)), randn(2, SHAPE(64, 29))};
        run_case(m, "matmul 2d", "matmul", json_object(), matmul_fn, 2, nm, in);
        release_all(2, in);
        ts_tensor *bt[] = {randn(3, SHAPE(2, 5, 16)), randn(4, SHAPE(16, 7))};
        run_case(m, "matmul batched", "matmul", json_object(), matmul_fn, 2, nm, bt);
        release_all(2, bt);
    }
    {
        const char *nm[] = {"x", "weight", "bias"};
        ts_tensor *in[] = {randn(5, SHAPE(4, 16, 96)), randn(6, SHAPE(96)), randn(7, SHAPE(96))};
        run_case(m, "layernorm", "layernorm", json_pack("{s:f}", "eps", 1e-5), layernorm_fn, 3, nm, in);
        release_all(3, in);
    }
    {
        const char *nm[] = {"x"};
        struct {
            const char *name;
            int dim, log;
        } sc[] = {{"softmax last", -1, 0}, {"softmax dim 1", 1, 0}, {"log_softmax last", -1, 1}};
        for (int c = 0; c < 3; c++) {
            ts_tensor *x = ts_tensor_normal(ts_key_from_seed(8 + c), TS_F32, SHAPE(4, 6, 50), 0, 3);
            run_case(m, sc[c].name, "softmax", json_pack("{s:i, s:b}", "dim", sc[c].dim, "log", sc[c].log), softmax_fn,
                     1, nm, &x);
            ts_tensor_release(x);
        }
    }
    {
        const char *nm[] = {"logits", "targets"};
        int64_t t[32];
        for (int i = 0; i < 32; i++) t[i] = i % 7 == 3 ? -100 : (i * 5) % 10;
        const char *reds[] = {"mean", "sum"};
        for (int r = 0; r < 2; r++) {
            ts_tensor *in[] = {ts_tensor_normal(ts_key_from_seed(12), TS_F32, SHAPE(32, 10), 0, 2),
                               ts_tensor_from_data(TS_I64, SHAPE(32), t)};
            char name[40];
            snprintf(name, sizeof name, "cross_entropy %s", reds[r]);
            run_case(m, name, "cross_entropy", json_pack("{s:i, s:s}", "ignore_index", -100, "reduction", reds[r]),
                     cross_entropy_fn, 2, nm, in);
            release_all(2, in);
        }
    }
    {
        const char *nm[] = {"x", "weight", "bias"};
        int64_t cfg[2][3] = {{2, 1, 1}, {1, 2, 2}}; /* stride, padding, dilation */
        for (int c = 0; c < 2; c++) {
            ts_tensor *in[] = {randn(13, SHAPE(2, 3, 11, 9)), randn(14, SHAPE(4, 3, 3, 3)), randn(15, SHAPE(4))};
            char name[40];
            snprintf(name, sizeof name, "conv2d s%lld p%lld d%lld", (long long)cfg[c][0], (long long)cfg[c][1],
                     (long long)cfg[c][2]);
            run_case(m, name, "conv2d",
                     json_pack("{s:I, s:I, s:I}", "stride", (json_int_t)cfg[c][0], "padding", (json_int_t)cfg[c][1],
                               "dilation", (json_int_t)cfg[c][2]),
                     conv2d_fn, 3, nm, in);
            release_all(3, in);
        }
    }
    {
        const char *nm[] = {"x"};
        ts_tensor *x = randn(16, SHAPE(2, 3, 9, 8));
        run_case(m, "max_pool2d k3 s2 p1", "max_pool2d", json_pack("{s:i, s:i, s:i}", "kernel", 3, "stride", 2,
                                                                   "padding", 1),
                 max_pool2d_fn, 1, nm, &x);
        ts_tensor_release(x);
    }
    {
        const char *nm[] = {"q", "k", "v"};
        struct {
            const char *name;
            int64_t tq, tk, d;
            int causal;
        } ac[] = {{"attention", 33, 33, 16, 0},
                  {"attention causal", 33, 33, 16, 1},
                  {"attention causal T130", 130, 130, 24, 1}, /* several row blocks */
                  {"attention Tq 20 Tk 70", 20, 70, 8, 0}};
        for (int c = 0; c < 4; c++) {
            ts_tensor *in[] = {randn(17, SHAPE(2, 3, ac[c].tq, ac[c].d)), randn(18, SHAPE(2, 3, ac[c].tk, ac[c].d)),
                               randn(19, SHAPE(2, 3, ac[c].tk, ac[c].d))};
            run_case(m, ac[c].name, "attention", json_pack("{s:b, s:f}", "causal", ac[c].causal, "scale", 0.0),
                     attention_fn, 3, nm, in);
            release_all(3, in);
        }
    }
}

/* The temporary folder is made and removed by the group setup/teardown, so
 * a failing case leaves nothing behind. */
static char parity_dir[64];

static int make_dir(void **state) {
    (void)state;
    return tu_make_tmp_dir(parity_dir, sizeof parity_dir, "tessera-parity");
}

static int remove_dir(void **state) {
    (void)state;
    return tu_remove_dir(parity_dir);
}

static void test_against_torch(void **state) {
    (void)state;
    manifest m = {.cases = json_array()};
    strcpy(m.dir, parity_dir);
    build_cases(&m);
    char path[128];
    snprintf(path, sizeof path, "%s/manifest.json", m.dir);
    json_t *root = json_pack("{s:o}", "cases", m.cases);
    assert_int_equal(json_dump_file(root, path, JSON_INDENT(1)), 0);
    json_decref(root);
    tu_run_python("tests/kernels/parity_torch.py", m.dir, 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_against_torch)};
    return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
