/* test_generate.c - sampling from a GPT: top_k keeps exactly k bytes when
 * logits tie, logits that are not finite are an error, not a byte, and
 * arguments out of range are refused naming them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>
#include <math.h>

#include "kernels/nn/generate.h"
#include "kernels/nn/models.h"
#include "kernels/status.h"

/* A byte-level GPT whose parameters all equal value: every logit
 * is the same (zero) for value 0, NaN for value NAN. */
static ts_model *flat_gpt(float value) {
    ts_model_spec s = {.arch = TS_ARCH_GPT};
    s.gpt = (ts_gpt_config){.vocab = 256, .block_size = 8, .n_layer = 1, .n_head = 2, .n_embd = 16, .dropout = 0.0};
    ts_model *m = ts_model_build(&s, 0, -1, ts_key_from_seed(1), TS_F32);
    assert_non_null(m);
    float *p = ts_f32(m->flat_params);
    for (int64_t i = 0; i < m->numel; i++) p[i] = value;
    return m;
}

static void test_top_k_ties(void **state) {
    (void)state;
    ts_model *m = flat_gpt(0);
    char out[64];
    /* 256 tied bytes: top_k 1 is the first (byte 0, written as a space) every time */
    assert_int_equal(ts_generate(m, 8, "\x01\x02", 20, 1.0, 1, ts_key_from_seed(7), out, sizeof out), TS_OK);
    for (int i = 2; i < 22; i++) assert_int_equal(out[i], ' ');
    /* top_k 3: bytes 0, 1 and 2 only */
    assert_int_equal(ts_generate(m, 8, "\x01\x02", 40, 1.0, 3, ts_key_from_seed(7), out, sizeof out), TS_OK);
    for (int i = 2; i < 42; i++) assert_true(out[i] == ' ' || out[i] == 1 || out[i] == 2);
    ts_model_free(m);
}

static void test_diverged_model(void **state) {
    (void)state;
    ts_model *m = flat_gpt(NAN);
    char out[64];
    assert_int_equal(ts_generate(m, 8, "\x01\x02", 4, 1.0, 0, ts_key_from_seed(7), out, sizeof out), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "a diverged model?"));
    ts_model_free(m);
}

/* Arguments out of range are refused naming them: block_size 0 once ran the
 * model on no tokens (an error about attention's qkv shape) and a negative
 * top_k sampled from every byte. */
static void test_bad_arguments(void **state) {
    (void)state;
    ts_model *m = flat_gpt(0);
    char out[64];
    ts_key key = ts_key_from_seed(7);
    assert_int_equal(ts_generate(m, 0, "ab", 4, 1.0, 0, key, out, sizeof out), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "generate: block_size 0 must be at least 1"));
    assert_int_equal(ts_generate(m, 8, "ab", 4, 1.0, -3, key, out, sizeof out), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "generate: top_k -3 must be >= 0"));
    assert_int_equal(ts_generate(m, 8, NULL, 4, 1.0, 0, key, out, sizeof out), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "generate: the prompt is NULL"));
    assert_int_equal(ts_generate(NULL, 8, "ab", 4, 1.0, 0, key, out, sizeof out), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "generate: the model is NULL"));
    assert_int_equal(ts_generate(m, 8, "ab", 62, 1.0, 0, key, out, sizeof out), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "generate: 2 + 62 bytes do not fit in 64"));
    ts_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_top_k_ties),
        cmocka_unit_test(test_diverged_model),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
