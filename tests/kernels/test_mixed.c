/* test_mixed.c - bf16 compute with f32 master weights on the flat buffers.
 *
 * (1) the bf16 parameter copy is ts_bf16_from_f32 of the master, refreshed
 * by sync, and zero_grad clears both gradient buffers; (2) MLP, CNN and GPT
 * gradients with bf16 compute are close to the f32 model's and equal, up to
 * the bf16 rounding of the gradient, to the f32 gradients computed with
 * bf16-rounded weights (also with activation checkpointing); (3) 50 AdamW
 * steps of an MLP with bf16 compute track the f32 run's losses; (4) k
 * micro-batches folded with scale 1/k equal one big batch; (5) bad compute
 * dtypes and orders are errors naming what was wrong; (6) detached
 * gradients (each parameter its own, as FSDP takes them) equal the flat
 * buffer's, f32 and bf16, over micro-batches, and zero_grad releases them. */
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
#include "kernels/optim/optim.h"
#include "model_testing.h"

typedef struct {
    ts_model_spec spec;
    int64_t classes, n; /* classes, samples */
    ts_tensor *x, *y;
} mixed_case;

static mixed_case mlp_case(int64_t n) {
    mixed_case c = {.classes = 5, .n = n};
    c.spec = (ts_model_spec){.arch = TS_ARCH_MLP, .n_widths = 3, .widths = {12, 16, 5}};
    return c;
}

static mixed_case gpt_case(bool checkpoint) {
    mixed_case c = {.classes = 32, .n = 4};
    c.spec.arch = TS_ARCH_GPT;
    c.spec.gpt = (ts_gpt_config){.vocab = 32, .block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = 16};
    c.spec.checkpoint = checkpoint;
    return c;
}

/* Fixed synthetic data: random inputs (or tokens) and labels by a rule. */
static void make_data(mixed_case *c) { synth_data(&c->spec, c->n, c->classes, &c->x, &c->y); }

static void free_data(mixed_case *c) {
    ts_tensor_release(c->x);
    ts_tensor_release(c->y);
}

static ts_model *build(const mixed_case *c, ts_dtype compute) {
    ts_model *m = ts_model_build(&c->spec, 0, -1, ts_key_from_seed(9), TS_F32);
    assert_non_null(m);
    assert_int_equal(ts_model_set_compute_dtype(m, compute), TS_OK);
    return m;
}

/* Mean cross-entropy over samples [first, first + n), times scale. */
static ts_tensor *loss_on(ts_model *m, const mixed_case *c, int64_t first, int64_t n, float scale) {
    ts_tensor *loss = slice_loss(m, c->x, c->y, c->classes, first, n);
    if (scale != 1.0f) {
        ts_tensor *s = ts_mul_scalar(loss, scale);
        ts_tensor_release(loss);
        loss = s;
    }
    return loss;
}

/* Zero grads, k micro-batches of the whole data each folded with fold_scale
 * after a backward of its loss times loss_scale; returns the mean loss. */
static double accumulate(ts_model *m, const mixed_case *c, int k, float loss_scale, float fold_scale) {
    ts_model_zero_grad(m);
    double total = 0;
    int64_t b = c->n / k;
    for (int i = 0; i < k; i++) {
        ts_tensor *loss = loss_on(m, c, i * b, b, loss_scale);
        total += ts_tensor_get(loss, 0);
        assert_int_equal(ts_backward(loss, NULL), TS_OK);
        ts_tensor_release(loss);
        assert_int_equal(ts_model_fold_compute_grads(m, fold_scale), TS_OK);
    }
    return total / k;
}

static float max_abs(const float *a, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s = fmaxf(s, fabsf(a[i]));
    return s;
}

static float max_diff(const float *a, const float *b, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s = fmaxf(s, fabsf(a[i] - b[i]));
    return s;
}

static float bf16_round(float v) { return ts_f32_from_bf16(ts_bf16_from_f32(v)); }

/* (1) */
static void test_bf16_copy(void **state) {
    (void)state;
    mixed_case c = mlp_case(6);
    make_data(&c);
    ts_model *m = build(&c, TS_BF16);
    assert_int_equal(m->compute_dtype, TS_BF16);
    assert_int_equal(m->flat_params16->dtype, TS_BF16);
    assert_int_equal(ts_tensor_nbytes(m->flat_params16), 2 * (size_t)m->numel);
    assert_int_equal(ts_tensor_nbytes(m->flat_grads16), 2 * (size_t)m->numel);
    const float *master = ts_f32(m->flat_params);
    const uint16_t *copy = ts_tensor_data(m->flat_params16);
    for (int64_t i = 0; i < m->numel; i++) assert_int_equal(copy[i], ts_bf16_from_f32(master[i]));

    /* each parameter's bf16 leaf views its range; the forward gets f32 */
    for (int i = 0; i < m->n_params; i++) {
        const ts_param *p = &m->params[i];
        assert_true(p->value16->requires_grad);
        assert_int_equal(p->value16->offset, p->offset);
        assert_ptr_equal(ts_model_grad_leaf(m, i), p->value16);
        ts_tensor *w = ts_model_param(m, i);
        assert_non_null(w);
        assert_int_equal(w->dtype, TS_F32);
        assert_non_null(w->grad_fn);
        assert_ptr_equal(ts_model_param(m, i), w); /* one conversion shared */
        for (int64_t j = 0; j < p->numel; j++)
            assert_true((float)ts_tensor_get(w, j) == ts_f32_from_bf16(copy[p->offset + j]));
    }

    /* a master write shows in the copy after sync */
    float *mw = ts_f32(m->flat_params);
    mw[3] = 1.2345678f;
    assert_int_equal(ts_model_sync_compute(m), TS_OK);
    assert_int_equal(copy[3], ts_bf16_from_f32(1.2345678f));
    assert_true((float)ts_tensor_get(ts_model_param(m, 0), 3) == bf16_round(1.2345678f));

    /* backward fills the bf16 gradients only; zero_grad clears both */
    ts_tensor *loss = loss_on(m, &c, 0, c.n, 1.0f);
    assert_int_equal(ts_backward(loss, NULL), TS_OK);
    ts_tensor_release(loss);
    const uint16_t *g16 = ts_tensor_data(m->flat_grads16);
    float *g = ts_f32(m->flat_grads);
    int64_t nonzero = 0;
    for (int64_t i = 0; i < m->numel; i++) nonzero += g16[i] != 0;
    assert_true(nonzero > m->numel / 2);
    assert_true(max_abs(g, m->numel) == 0.0f);
    for (int64_t i = 0; i < m->numel; i++) g[i] = 1.0f;
    ts_model_zero_grad(m);
    for (int64_t i = 0; i < m->numel; i++) assert_true(g16[i] == 0 && g[i] == 0.0f);

    /* back to f32 compute: the bf16 buffers go, forwards use the master */
    assert_int_equal(ts_model_set_compute_dtype(m, TS_F32), TS_OK);
    assert_null(m->flat_params16);
    assert_null(m->params[0].value16);
    assert_ptr_equal(ts_model_param(m, 0), m->params[0].value);
    ts_model_free(m);
    free_data(&c);
}

/* (2) for one case: master gradients of the bf16 model against the f32
 * model and against the f32 model with bf16-rounded weights. */
static void check_gradients(mixed_case *c) {
    make_data(c);
    ts_model *f32 = build(c, TS_F32), *b16 = build(c, TS_BF16), *rounded = build(c, TS_F32);
    int64_t n = f32->numel;
    float *rw = ts_f32(rounded->flat_params);
    for (int64_t i = 0; i < n; i++) rw[i] = bf16_round(rw[i]);
    accumulate(f32, c, 1, 1.0f, 1.0f);
    accumulate(b16, c, 1, 1.0f, 1.0f);
    accumulate(rounded, c, 1, 1.0f, 1.0f);
    const float *g32 = ts_f32(f32->flat_grads), *g16 = ts_f32(b16->flat_grads), *gr = ts_f32(rounded->flat_grads);
    float scale = max_abs(g32, n), worst = max_diff(g16, g32, n);
    print_message("max |g_bf16 - g_f32| = %.3g (gradient scale %.3g)\n", worst, scale);
    assert_true(scale > 0);
    assert_true(worst <= 1e-2f * scale);
    int64_t exact = 0;
    for (int64_t i = 0; i < n; i++) exact += g16[i] == bf16_round(gr[i]);
    print_message("%lld of %lld gradients equal bf16(f32 gradient with bf16 weights)\n", (long long)exact,
                  (long long)n);
    assert_int_equal(exact, n);
    ts_model_free(f32);
    ts_model_free(b16);
    ts_model_free(rounded);
    free_data(c);
}

static void test_mlp_gradients(void **state) {
    (void)state;
    mixed_case c = mlp_case(6);
    check_gradients(&c);
}

static void test_gpt_gradients(void **state) {
    (void)state;
    mixed_case c = gpt_case(false);
    check_gradients(&c);
    c = gpt_case(true);
    check_gradients(&c);
}

/* a conv keeps its weight tensor itself (not a view), which must survive
 * the module dropping its converted weights */
static void test_cnn_gradients(void **state) {
    (void)state;
    mixed_case c = {.classes = 5, .n = 4};
    c.spec = (ts_model_spec){.arch = TS_ARCH_CNN, .in_ch = 1, .img = 8, .ch1 = 2, .ch2 = 4, .kernel = 3, .classes = 5};
    check_gradients(&c);
}

/* (3) */
static void test_adamw_tracks_f32(void **state) {
    (void)state;
    mixed_case c = mlp_case(32);
    make_data(&c);
    ts_model *ms[2] = {build(&c, TS_F32), build(&c, TS_BF16)};
    ts_optim_config cfg = ts_optim_defaults(TS_OPTIM_ADAMW);
    double losses[2][50];
    for (int r = 0; r < 2; r++) {
        ts_model *m = ms[r];
        assert_int_equal(ts_model_alloc_state(m, ts_optim_state_slots(&cfg)), TS_OK);
        for (int t = 1; t <= 50; t++) {
            losses[r][t - 1] = accumulate(m, &c, 1, 1.0f, 1.0f);
            assert_int_equal(ts_optim_step_flat(&cfg, t, 3e-2, NULL, ts_f32(m->flat_params), ts_f32(m->flat_grads),
                                                m->state, m->numel, 0, m->numel),
                             TS_OK);
            assert_int_equal(ts_model_sync_compute(m), TS_OK);
        }
    }
    double worst = 0;
    for (int t = 0; t < 50; t++) worst = fmax(worst, fabs(losses[1][t] - losses[0][t]));
    print_message("loss f32 %.4f -> %.4f, bf16 %.4f -> %.4f, max |difference| %.3g\n", losses[0][0], losses[0][49],
                  losses[1][0], losses[1][49], worst);
    for (int r = 0; r < 2; r++) assert_true(losses[r][49] < 0.5 * losses[r][0]);
    assert_true(worst <= 1e-2 * losses[0][0]);
    /* the bf16 run's master weights stay f32: they are not all bf16 values */
    int64_t off_grid = 0;
    const float *w = ts_f32(ms[1]->flat_params);
    for (int64_t i = 0; i < ms[1]->numel; i++) off_grid += w[i] != bf16_round(w[i]);
    assert_true(off_grid > ms[1]->numel / 2);
    ts_model_free(ms[0]);
    ts_model_free(ms[1]);
    free_data(&c);
}

/* (4) */
static void test_micro_batches(void **state) {
    (void)state;
    enum { K = 4 };
    mixed_case c = mlp_case(12);
    make_data(&c);
    ts_model *whole = build(&c, TS_BF16), *folded = build(&c, TS_BF16), *scaled = build(&c, TS_BF16);
    ts_model *f32_whole = build(&c, TS_F32), *f32_scaled = build(&c, TS_F32);
    float k1 = ts_mixed_micro_scale(K);
    accumulate(whole, &c, 1, 1.0f, 1.0f);
    accumulate(folded, &c, K, 1.0f, k1);  /* unscaled losses, fold with 1/k */
    accumulate(scaled, &c, K, k1, 1.0f);  /* losses scaled by 1/k, fold with 1 */
    accumulate(f32_whole, &c, 1, 1.0f, 1.0f);
    accumulate(f32_scaled, &c, K, k1, 1.0f); /* the same loop with f32 compute */
    int64_t n = whole->numel;
    const float *gw = ts_f32(whole->flat_grads);
    float scale = max_abs(gw, n);
    float d_fold = max_diff(ts_f32(folded->flat_grads), gw, n), d_scaled = max_diff(ts_f32(scaled->flat_grads), gw, n);
    float d_f32 = max_diff(ts_f32(f32_scaled->flat_grads), ts_f32(f32_whole->flat_grads), n);
    print_message("k=%d: folded %.3g, scaled %.3g, f32 loop %.3g (scale %.3g)\n", K, d_fold, d_scaled, d_f32, scale);
    assert_true(scale > 0);
    assert_true(d_fold <= 1e-2f * scale);
    assert_true(d_scaled <= 1e-2f * scale);
    assert_true(d_f32 <= 1e-5f * scale);
    ts_model *all[] = {whole, folded, scaled, f32_whole, f32_scaled};
    for (int i = 0; i < 5; i++) ts_model_free(all[i]);
    free_data(&c);
}

/* (5) */
/* (6) */
static void check_detached(mixed_case *c, ts_dtype compute) {
    ts_model *flat = build(c, compute), *own = build(c, compute);
    ts_model_detach_grads(own);
    for (int i = 0; i < own->n_params; i++) assert_null(own->params[i].value->grad);
    double lf = accumulate(flat, c, 2, 0.5f, 1.0f), lo = accumulate(own, c, 2, 0.5f, 1.0f);
    assert_true(lf == lo);
    const float *g = ts_f32(flat->flat_grads);
    for (int i = 0; i < own->n_params; i++) {
        const ts_param *p = &own->params[i];
        assert_non_null(p->value->grad);
        if (p->value16) assert_null(p->value16->grad); /* folded and released */
        assert_true(max_diff(ts_f32(p->value->grad), g + p->offset, p->numel) == 0.0f);
    }
    /* nothing was written into the flat buffer */
    assert_true(max_abs(ts_f32(own->flat_grads), own->numel) == 0.0f);
    ts_model_zero_grad(own);
    for (int i = 0; i < own->n_params; i++) assert_null(own->params[i].value->grad);
    ts_model_free(flat);
    ts_model_free(own);
}

static void test_detached_gradients(void **state) {
    (void)state;
    mixed_case c = gpt_case(false);
    make_data(&c);
    check_detached(&c, TS_F32);
    check_detached(&c, TS_BF16);
    free_data(&c);
}

static void test_errors(void **state) {
    (void)state;
    mixed_case c = mlp_case(6);
    ts_model *m = ts_model_build(&c.spec, 0, -1, ts_key_from_seed(9), TS_F32);
    assert_non_null(m);
    assert_int_equal(ts_model_set_compute_dtype(m, TS_F64), TS_ERR_DTYPE);
    assert_non_null(strstr(ts_last_error(), "compute dtype f64 is not supported"));
    assert_int_equal(ts_model_set_compute_dtype(m, TS_I32), TS_ERR_DTYPE);
    assert_non_null(strstr(ts_last_error(), "i32"));
    assert_int_equal(m->compute_dtype, TS_F32);
    assert_null(m->flat_params16);
    ts_model_free(m);

    ts_model *m64 = ts_model_build(&c.spec, 0, -1, ts_key_from_seed(9), TS_F64);
    assert_non_null(m64);
    assert_int_equal(ts_model_set_compute_dtype(m64, TS_BF16), TS_ERR_DTYPE);
    assert_non_null(strstr(ts_last_error(), "f32 master buffers, not f64"));
    ts_model_free(m64);

    ts_model *raw = ts_model_new();
    assert_non_null(raw);
    assert_int_equal(ts_model_set_compute_dtype(raw, TS_BF16), TS_ERR_STATE);
    assert_non_null(strstr(ts_last_error(), "before finalize"));
    ts_model_free(raw);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_copy),     cmocka_unit_test(test_mlp_gradients), cmocka_unit_test(test_gpt_gradients),
        cmocka_unit_test(test_cnn_gradients),
        cmocka_unit_test(test_adamw_tracks_f32), cmocka_unit_test(test_micro_batches), cmocka_unit_test(test_errors),
        cmocka_unit_test(test_detached_gradients),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
