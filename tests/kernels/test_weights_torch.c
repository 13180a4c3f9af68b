/* test_weights_torch.c - weights written by PyTorch start Tessera models.
 *
 * tests/kernels/import_torch.py (run with /usr/bin/python3) writes a GPT
 * and a CNN initialised by torch, under PyTorch's names and (the GPT) under
 * Hugging Face GPT-2's names with Conv1D weights stored transposed, plus an
 * input and torch's logits on it. Loaded with ts_weights_load (the GPT-2
 * names through examples/maps/gpt2_hf.json), Tessera's models give torch's
 * logits within 1e-5 (relative to the largest). The GPT saved by torch in
 * half precision (F16, subnormals included) loads through the map to the
 * very bits torch's float() of it gives. A wrong shape, a missing tensor,
 * foreign names without the map and a malformed map are refused with
 * messages naming the tensor and both shapes; a weight that is inf with one
 * naming it; a file without tensors (a checkpoint index's) with one that
 * says so and how to get them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "kernels/autograd.h"
#include "kernels/io/safetensors.h"
#include "kernels/io/weights.h"
#include "kernels/nn/models.h"
#include "../test_util.h"

static char dir[64];

static int setup(void **state) {
    (void)state;
    if (tu_make_tmp_dir(dir, sizeof dir, "tessera_weights_torch")) return -1;
    char args[128];
    snprintf(args, sizeof args, "%s", dir);
    tu_run_python("tests/kernels/import_torch.py", args, 2);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return tu_remove_dir(dir);
}

static ts_model_spec gpt_spec(int64_t n_embd) {
    ts_model_spec s = {.arch = TS_ARCH_GPT};
    s.gpt = (ts_gpt_config){256, 16, 2, 2, n_embd, 0.0};
    return s;
}

static ts_model_spec cnn_spec(void) {
    return (ts_model_spec){.arch = TS_ARCH_CNN, .in_ch = 1, .img = 28, .ch1 = 4, .ch2 = 8, .kernel = 5, .classes = 10};
}

static void path_of(char *out, size_t n, const char *file) { snprintf(out, n, "%s/%s.safetensors", dir, file); }

/* Loads weights (through map, or NULL) into a model of spec and checks its
 * logits on <tag>_io's input against torch's. */
static void check_logits(const ts_model_spec *spec, const char *weights, const char *map, const char *tag) {
    char path[256], io_path[256], io_name[32];
    path_of(path, sizeof path, weights);
    snprintf(io_name, sizeof io_name, "%s_io", tag);
    path_of(io_path, sizeof io_path, io_name);
    ts_model *m = ts_model_build(spec, 0, -1, ts_key_from_seed(5), TS_F32);
    assert_non_null(m);
    if (ts_weights_load(m, path, map, true)) fail_msg("%s", ts_last_error());
    ts_safetensors *io = ts_safetensors_open(io_path);
    assert_non_null(io);
    ts_tensor *x = ts_safetensors_get(io, "input"), *want = ts_safetensors_get(io, "logits");
    assert_non_null(x);
    assert_non_null(want);
    ts_model_train(m, false);
    bool prev = ts_grad_set_enabled(false);
    ts_tensor *y = ts_model_forward(m, x);
    ts_grad_set_enabled(prev);
    assert_non_null(y);
    assert_int_equal(ts_tensor_numel(y), ts_tensor_numel(want));
    double maxref = 1e-6, maxdiff = 0;
    for (int64_t i = 0; i < ts_tensor_numel(want); i++) {
        maxref = fmax(maxref, fabs(ts_tensor_get(want, i)));
        maxdiff = fmax(maxdiff, fabs(ts_tensor_get(y, i) - ts_tensor_get(want, i)));
    }
    printf("  %-10s %-26s max |tessera - torch| / max|torch| = %.2e\n", tag, weights, maxdiff / maxref);
    assert_true(maxdiff / maxref <= 1e-5);
    ts_tensor_release(x);
    ts_tensor_release(want);
    ts_tensor_release(y);
    ts_safetensors_close(io);
    ts_model_free(m);
}

static void test_gpt_pytorch_names(void **state) {
    (void)state;
    ts_model_spec s = gpt_spec(32);
    check_logits(&s, "gpt_torch", NULL, "gpt");
}

/* The path of the shipped GPT-2 name map into out. */
static void gpt2_map(char *out, size_t n) {
    const char *src = getenv("TESSERA_SOURCE_DIR");
    snprintf(out, n, "%s/examples/maps/gpt2_hf.json", src ? src : ".");
}

static void test_gpt_hf_names(void **state) {
    (void)state;
    ts_model_spec s = gpt_spec(32);
    char map[512];
    gpt2_map(map, sizeof map);
    check_logits(&s, "gpt_hf", map, "gpt");
}

/* A GPT of spec with seed, loaded from file through the GPT-2 map. */
static ts_model *gpt_from(const ts_model_spec *spec, uint64_t seed, const char *file) {
    char path[256], map[512];
    path_of(path, sizeof path, file);
    gpt2_map(map, sizeof map);
    ts_model *m = ts_model_build(spec, 0, -1, ts_key_from_seed(seed), TS_F32);
    assert_non_null(m);
    if (ts_weights_load(m, path, map, true)) fail_msg("%s", ts_last_error());
    return m;
}

/* F16 weights (transposed ones among them) give every parameter the bits of
 * torch's own f16 -> f32 conversion of them; before, F16 was refused. */
static void test_gpt_f16(void **state) {
    (void)state;
    ts_model_spec s = gpt_spec(32);
    ts_model *half = gpt_from(&s, 5, "gpt_hf_f16"), *ref = gpt_from(&s, 6, "gpt_hf_f16_f32");
    assert_int_equal(ts_tensor_numel(half->flat_params), ts_tensor_numel(ref->flat_params));
    assert_memory_equal(ts_f32(half->flat_params), ts_f32(ref->flat_params), ts_tensor_nbytes(ref->flat_params));
    const float *wte = ts_f32(half->params[0].value);
    assert_string_equal(half->params[0].name, "wte.weight");
    assert_true(wte[0] == 0x1p-24f && wte[1] == -1023 * 0x1p-24f && wte[2] == 0 && signbit(wte[2]));
    ts_model_free(half);
    ts_model_free(ref);
}

static void test_cnn(void **state) {
    (void)state;
    ts_model_spec s = cnn_spec();
    check_logits(&s, "cnn_torch", NULL, "cnn");
}

/* Loading file into a model of spec fails with a message holding every
 * string of want (NULL-terminated); nothing is written. */
static void expect_refusal(const ts_model_spec *spec, const char *file, const char *map, const char *const *want) {
    char path[256];
    path_of(path, sizeof path, file);
    ts_model *m = ts_model_build(spec, 0, -1, ts_key_from_seed(5), TS_F32);
    assert_non_null(m);
    float before = ts_f32(m->flat_params)[0];
    assert_int_not_equal(ts_weights_load(m, path, map, true), TS_OK);
    printf("  refused: %s\n", ts_last_error());
    for (; *want; want++)
        if (!strstr(ts_last_error(), *want)) fail_msg("'%s' not in: %s", *want, ts_last_error());
    assert_true(ts_f32(m->flat_params)[0] == before);
    ts_model_free(m);
}

static void test_refusals(void **state) {
    (void)state;
    ts_model_spec wide = gpt_spec(48), gpt = gpt_spec(32);
    expect_refusal(&wide, "gpt_torch", NULL, (const char *[]){"'wte.weight'", "[256,32]", "[256,48]", NULL});
    expect_refusal(&gpt, "gpt_missing", NULL, (const char *[]){"'ln_f.bias'", "[32]", NULL});
    expect_refusal(&gpt, "gpt_stage0", NULL,
                   (const char *[]){"'blocks.1.", "nor for", "more: the file gives", "--consolidate", NULL});
    expect_refusal(&gpt, "gpt_hf", NULL, (const char *[]){"transformer.", "is not a parameter", NULL});
    char gpt2[512];
    gpt2_map(gpt2, sizeof gpt2);
    expect_refusal(&gpt, "gpt_hf_f16_inf", gpt2,
                   (const char *[]){"'transformer.h.1.mlp.c_fc.weight' (F16 [32,128], for the model's "
                                    "'blocks.1.mlp.fc.weight') holds inf at [0,5]", "must be finite", NULL});
    /* a file without tensors, as a pipeline's or fsdp run's checkpoint index holds */
    char empty[256];
    path_of(empty, sizeof empty, "empty");
    assert_int_equal(ts_safetensors_write(empty, 0, NULL, NULL, 0, NULL, NULL), TS_OK);
    expect_refusal(&gpt, "empty", NULL, (const char *[]){"empty.safetensors holds no tensors", "--consolidate", NULL});
    char map[256];
    snprintf(map, sizeof map, "%s/bad_map.json", dir);
    FILE *f = fopen(map, "w");
    assert_non_null(f);
    fputs("{\"format\": \"tessera-name-map\", \"version\": 1, \"renames\": {}}", f);
    fclose(f);
    expect_refusal(&gpt, "gpt_hf", map, (const char *[]){"bad_map.json", "unknown field 'renames'", NULL});
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt_pytorch_names),
        cmocka_unit_test(test_gpt_hf_names),
        cmocka_unit_test(test_gpt_f16),
        cmocka_unit_test(test_cnn),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
