/* test_accum.c - gradient accumulation over k micro-batches.
 *
 * For the MLP and the GPT, k micro-batches of b samples give the same
 * gradient as one batch of k*b samples (mean loss), in all three ways a
 * training loop can accumulate: the micro-batch loss scaled by 1/k with
 * backward accumulating into the flat gradient buffer; unscaled losses then
 * ts_mixed_average; and each micro-batch's gradient added into a separate
 * f32 buffer with ts_mixed_accumulate(scale 1/k). f32 tolerance. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kernels/autograd.h"
#include "kernels/nn/models.h"
#include "kernels/ops/elementwise.h"
#include "kernels/ops/loss.h"
#include "kernels/ops/view.h"
#include "kernels/optim/mixed.h"
#include "model_testing.h"

#define K 4
#define B 3

typedef enum { SCALE_LOSS, AVERAGE_AFTER, ACCUMULATE_COPY } accum_way;

typedef struct {
    ts_model_spec spec;
    int64_t classes;
    ts_tensor *x, *y; /* the whole batch of K*B samples */
} accum_case;

static void make_data(accum_case *c) { synth_data(&c->spec, K * B, c->classes, &c->x, &c->y); }

/* Mean cross-entropy over samples [first, first + n) of the case's data. */
static ts_tensor *loss_on(ts_model *m, const accum_case *c, int64_t first, int64_t n) {
    return slice_loss(m, c->x, c->y, c->classes, first, n);
}

/* The gradient of the whole batch, accumulated over K micro-batches in way w
 * (or in one batch when w < 0), into out[numel]. */
static void gradient(const accum_case *c, int w, float *out) {
    ts_model *m = ts_model_build(&c->spec, 0, -1, ts_key_from_seed(9), TS_F32);
    assert_non_null(m);
    ts_model_zero_grad(m);
    float *grads = ts_f32(m->flat_grads);
    if (w < 0) {
        ts_tensor *loss = loss_on(m, c, 0, K * B);
        assert_int_equal(ts_backward(loss, NULL), TS_OK);
        ts_tensor_release(loss);
        memcpy(out, grads, sizeof(float) * (size_t)m->numel);
        ts_model_free(m);
        return;
    }
    if (w == ACCUMULATE_COPY) memset(out, 0, sizeof(float) * (size_t)m->numel);
    for (int k = 0; k < K; k++) {
        ts_tensor *loss = loss_on(m, c, k * B, B);
        if (w == SCALE_LOSS) {
            ts_tensor *scaled = ts_mul_scalar(loss, ts_mixed_micro_scale(K));
            ts_tensor_release(loss);
            loss = scaled;
        }
        if (w == ACCUMULATE_COPY) ts_model_zero_grad(m);
        assert_int_equal(ts_backward(loss, NULL), TS_OK);
        ts_tensor_release(loss);
        if (w == ACCUMULATE_COPY)
            assert_int_equal(ts_mixed_accumulate(out, grads, TS_F32, m->numel, ts_mixed_micro_scale(K)), TS_OK);
    }
    if (w == AVERAGE_AFTER) assert_int_equal(ts_mixed_average(grads, m->numel, K), TS_OK);
    if (w != ACCUMULATE_COPY) memcpy(out, grads, sizeof(float) * (size_t)m->numel);
    ts_model_free(m);
}

static void check_case(accum_case *c) {
    make_data(c);
    ts_model *probe = ts_model_build(&c->spec, 0, -1, ts_key_from_seed(9), TS_F32);
    assert_non_null(probe);
    int64_t n = probe->numel;
    ts_model_free(probe);
    float *whole = malloc(sizeof(float) * (size_t)n), *acc = malloc(sizeof(float) * (size_t)n);
    gradient(c, -1, whole);
    float scale = 0;
    for (int64_t i = 0; i < n; i++) scale = fmaxf(scale, fabsf(whole[i]));
    assert_true(scale > 0);
    for (int w = SCALE_LOSS; w <= ACCUMULATE_COPY; w++) {
        gradient(c, w, acc);
        float worst = 0;
        for (int64_t i = 0; i < n; i++) worst = fmaxf(worst, fabsf(acc[i] - whole[i]));
        print_message("way %d: max |accumulated - whole| = %.3g (gradient scale %.3g)\n", w, worst, scale);
        assert_true(worst <= 1e-5f * scale);
    }
    /* a wrong micro-batch count is an error, not a silent 1/0 */
    assert_true(ts_mixed_micro_scale(0) == 0.0f);
    assert_non_null(strstr(ts_last_error(), "k = 0"));
    free(whole);
    free(acc);
    ts_tensor_release(c->x);
    ts_tensor_release(c->y);
}

static void test_mlp_accumulation(void **state) {
    (void)state;
    accum_case c = {.classes = 5};
    c.spec = (ts_model_spec){.arch = TS_ARCH_MLP, .n_widths = 3, .widths = {12, 16, 5}};
    check_case(&c);
}

static void test_gpt_accumulation(void **state) {
    (void)state;
    accum_case c = {.classes = 32};
    c.spec.arch = TS_ARCH_GPT;
    c.spec.gpt = (ts_gpt_config){.vocab = 32, .block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = 16};
    check_case(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_accumulation),
        cmocka_unit_test(test_gpt_accumulation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
