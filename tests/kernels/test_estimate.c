/* test_estimate.c - the memory estimate of training a model: its parameter
 * count equals the built model's for every architecture, the parts add up,
 * activations grow with the batch and shrink with checkpointing, and a model
 * far too big to build (the 3.8e9-parameter CNN) is judged without building. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kernels/nn/models.h"

/* Builds s and checks the estimate's count and sums against it. */
static void check_against_build(const ts_model_spec *s) {
    ts_model *m = ts_model_build(s, 0, -1, ts_key_from_seed(1), TS_F32);
    assert_non_null(m);
    double n = (double)m->numel;
    ts_model_free(m);
    ts_model_memory e, big, bf;
    assert_int_equal(ts_model_estimate(s, 8, 2, false, &e), TS_OK);
    assert_true(e.parameters == n);
    assert_true(e.param_bytes == 4 * n && e.grad_bytes == 4 * n && e.optim_bytes == 8 * n);
    assert_true(e.activation_bytes > 0);
    assert_true(e.total_bytes == e.param_bytes + e.grad_bytes + e.optim_bytes + e.activation_bytes);
    assert_int_equal(ts_model_estimate(s, 16, 0, true, &bf), TS_OK);
    assert_true(bf.param_bytes == 6 * n && bf.optim_bytes == 0);
    assert_int_equal(ts_model_estimate(s, 64, 2, false, &big), TS_OK);
    assert_true(big.activation_bytes > e.activation_bytes);
}

static void test_parameters_match_the_built_model(void **state) {
    (void)state;
    ts_model_spec mlp = {.arch = TS_ARCH_MLP, .n_widths = 4, .widths = {784, 64, 32, 10}};
    check_against_build(&mlp);
    ts_model_spec cnn = {.arch = TS_ARCH_CNN, .in_ch = 1, .img = 28, .ch1 = 4, .ch2 = 8, .kernel = 5, .classes = 10};
    check_against_build(&cnn);
    ts_model_spec gpt = {.arch = TS_ARCH_GPT};
    gpt.gpt = (ts_gpt_config){.vocab = 256, .block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 32};
    check_against_build(&gpt);
    ts_model_memory full, ck;
    assert_int_equal(ts_model_estimate(&gpt, 8, 2, false, &full), TS_OK);
    gpt.checkpoint = true;
    check_against_build(&gpt);
    assert_int_equal(ts_model_estimate(&gpt, 8, 2, false, &ck), TS_OK);
    assert_true(ck.activation_bytes < full.activation_bytes);
}

static void test_huge_cnn_without_building(void **state) {
    (void)state;
    ts_model_spec cnn = {.arch = TS_ARCH_CNN, .in_ch = 1, .img = 28, .ch1 = 4096, .ch2 = 4096, .kernel = 15,
                         .classes = 10};
    ts_model_memory e;
    assert_int_equal(ts_model_estimate(&cnn, 128, 2, false, &e), TS_OK);
    /* conv1 4096*225 + 4096, conv2 4096*4096*225 + 4096, fc 4096*49*10 + 10 */
    assert_true(e.parameters == 925696.0 + 3774877696.0 + 2007050.0);
    assert_true(e.total_bytes > 16 * e.parameters);
    cnn.kernel = 4; /* even: not a valid spec */
    assert_int_not_equal(ts_model_estimate(&cnn, 128, 2, false, &e), TS_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parameters_match_the_built_model),
        cmocka_unit_test(test_huge_cnn_without_building),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
