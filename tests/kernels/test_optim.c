/* test_optim.c - optimizer step kernels over flat ranges, groups, schedules,
 * clipping and mixed-precision helpers. Expected values of the hand tests
 * were worked out by hand from the PyTorch update rules (and agree with
 * torch.optim in f64). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kernels/optim/clip.h"
#include "kernels/optim/mixed.h"
#include "kernels/optim/optim.h"
#include "kernels/optim/schedule.h"
#include "kernels/rng.h"

#define NEAR(a, b, tol) assert_true(fabs((double)(a) - (double)(b)) <= (tol))

/* Three steps of one scalar parameter p0 = 1 with grads 0.5, 0.25, -0.5. */
static void scalar_run(const ts_optim_config *cfg, double lr, const double want[3]) {
    float p = 1.0f, st[2] = {0, 0};
    const float gs[3] = {0.5f, 0.25f, -0.5f};
    for (int t = 1; t <= 3; t++) {
        ts_optim_slice sl = {.params = &p, .grads = &gs[t - 1], .state = st, .stride = 1, .offset = 0, .len = 1};
        assert_int_equal(ts_optim_step_range(cfg, t, lr, NULL, &sl), TS_OK);
        NEAR(p, want[t - 1], 2e-6);
    }
}

static void test_sgd_by_hand(void **state) {
    (void)state;
    ts_optim_config c = ts_optim_defaults(TS_OPTIM_SGD);
    assert_int_equal(ts_optim_state_slots(&c), 0);
    /* plain: p -= 0.1 g */
    scalar_run(&c, 0.1, (double[]){0.95, 0.925, 0.975});
    /* momentum 0.9, wd 0.1: d1 = 0.5 + 0.1 = 0.6 = buf, p = 0.94;
     * d2 = 0.25 + 0.094 = 0.344, buf = 0.54 + 0.344 = 0.884, p = 0.8516;
     * d3 = -0.5 + 0.08516, buf = 0.7956 - 0.41484 = 0.38076, p = 0.813524 */
    c.momentum = 0.9;
    c.weight_decay = 0.1;
    assert_int_equal(ts_optim_state_slots(&c), 1);
    scalar_run(&c, 0.1, (double[]){0.94, 0.8516, 0.813524});
    /* nesterov: step 1 d = 0.6 + 0.9 * 0.6 = 1.14, p = 0.886 */
    c.nesterov = true;
    scalar_run(&c, 0.1, (double[]){0.886, 0.773066, 0.782211146});
    /* dampening 0.5 (no wd): buf1 = 0.5 (no dampening on the first step),
     * buf2 = 0.45 + 0.125 = 0.575, p2 = 0.95 - 0.0575 = 0.8925 */
    c = ts_optim_defaults(TS_OPTIM_SGD);
    c.momentum = 0.9;
    c.dampening = 0.5;
    scalar_run(&c, 0.1, (double[]){0.95, 0.8925, 0.86575});
}

static void test_adam_by_hand(void **state) {
    (void)state;
    /* Adam, L2 wd 0.1, lr 0.01: step 1 g' = 0.5 + 0.1 = 0.6, m^ = g', v^ = g'^2,
     * p = 1 - 0.01 * 0.6 / (0.6 + 1e-8) */
    ts_optim_config c = ts_optim_defaults(TS_OPTIM_ADAM);
    c.weight_decay = 0.1;
    assert_int_equal(ts_optim_state_slots(&c), 2);
    scalar_run(&c, 0.01, (double[]){0.99, 0.980465827519045, 0.9772928152861048});
    /* AdamW: step 1 p = 1 * (1 - 0.001) - 0.01 = 0.989; step 2 m = 0.07,
     * v = 0.00031225, bias corrections 0.19 and 0.001999 */
    c.kind = TS_OPTIM_ADAMW;
    scalar_run(&c, 0.01, (double[]){0.989, 0.9786892040475462, 0.9766026841558618});
}

static void test_config_errors(void **state) {
    (void)state;
    ts_optim_config c = ts_optim_defaults(TS_OPTIM_SGD);
    c.nesterov = true;
    assert_int_equal(ts_optim_check(&c), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "nesterov needs momentum > 0"));
    c = ts_optim_defaults(TS_OPTIM_ADAMW);
    c.beta2 = 1.0;
    assert_int_equal(ts_optim_check(&c), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "adamw beta2 = 1"));
    c = ts_optim_defaults(TS_OPTIM_ADAM);
    c.eps = -1;
    assert_int_equal(ts_optim_check(&c), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "eps = -1"));
    c = ts_optim_defaults(TS_OPTIM_ADAMW);
    assert_true(c.weight_decay == 0.01 && c.beta1 == 0.9 && c.beta2 == 0.999 && c.eps == 1e-8);
    assert_int_equal(ts_optim_kind_parse("adamw"), TS_OPTIM_ADAMW);
    assert_int_equal(ts_optim_kind_parse("lion"), -1);
    assert_string_equal(ts_optim_kind_name(TS_OPTIM_SGD), "sgd");

    float p[4] = {0}, g[4] = {0}, s[8] = {0};
    ts_optim_slice sl = {.params = p, .grads = g, .state = s, .stride = 4, .offset = 0, .len = 4};
    assert_int_equal(ts_optim_step_range(&c, 0, 0.1, NULL, &sl), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "step t = 0 must be >= 1"));
    assert_int_equal(ts_optim_step_range(&c, 1, -0.1, NULL, &sl), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "lr = -0.1"));
    sl.stride = 3;
    assert_int_equal(ts_optim_step_range(&c, 1, 0.1, NULL, &sl), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "state stride 3 is shorter than the range length 4"));
    sl.stride = 4;
    sl.state = NULL;
    assert_int_equal(ts_optim_step_range(&c, 1, 0.1, NULL, &sl), TS_ERR_STATE);
    assert_non_null(strstr(ts_last_error(), "needs 2 state slot(s)"));
    assert_int_equal(ts_optim_step_flat(&c, 1, 0.1, NULL, p, g, s, 4, 2, 3), TS_ERR_INDEX);
    assert_non_null(strstr(ts_last_error(), "range [2, +3) is outside the flat buffer of 4"));
    ts_optim_groups gr;
    assert_int_equal(ts_optim_groups_uniform(&gr, 3, 1.0f), TS_OK);
    assert_int_equal(ts_optim_step_flat(&c, 1, 0.1, &gr, p, g, s, 4, 0, 4), TS_ERR_INDEX);
    assert_non_null(strstr(ts_last_error(), "outside the groups' [0, 3)"));
    ts_optim_groups_free(&gr);
}

/* A small "model": named parameters of a 2-layer net with a LayerNorm. */
static const ts_optim_named model_params[] = {
    {"fc1.weight", 2, 0, 60},  {"fc1.bias", 1, 60, 12}, {"ln.weight", 1, 72, 12},
    {"ln.bias", 1, 84, 12},    {"fc2.weight", 2, 96, 36}, {"fc2.bias", 1, 132, 3},
    {"head.scale", 1, 140, 5}, /* 135..140 is padding */
};
#define MODEL_N 145
#define MODEL_P (int)(sizeof model_params / sizeof model_params[0])
static const char *const no_decay[] = {"*.bias", "*ln*"};
static const ts_optim_decay_rule rule = {.min_ndim = 2, .no_decay = no_decay, .n_no_decay = 2};

static void test_groups_build(void **state) {
    (void)state;
    ts_optim_groups g;
    /* list given out of order */
    ts_optim_named shuffled[MODEL_P];
    for (int i = 0; i < MODEL_P; i++) shuffled[i] = model_params[(i * 3) % MODEL_P];
    assert_int_equal(ts_optim_groups_build(&g, MODEL_N, shuffled, MODEL_P, &rule), TS_OK);
    /* fc1.weight decays; bias, ln.weight, ln.bias merge into one no-decay range;
     * fc2.weight decays; fc2.bias + padding + head.scale (ndim 1) merge */
    assert_int_equal(g.n, 4);
    assert_int_equal(g.ranges[0].offset, 0);
    assert_int_equal(g.ranges[0].len, 60);
    assert_true(g.ranges[0].wd_scale == 1.0f);
    assert_int_equal(g.ranges[1].offset, 60);
    assert_int_equal(g.ranges[1].len, 36);
    assert_true(g.ranges[1].wd_scale == 0.0f);
    assert_int_equal(g.ranges[2].offset, 96);
    assert_true(g.ranges[2].wd_scale == 1.0f);
    assert_int_equal(g.ranges[3].offset, 132);
    assert_int_equal(g.ranges[3].len, 13);
    assert_true(ts_optim_groups_wd_at(&g, 59) == 1.0f);
    assert_true(ts_optim_groups_wd_at(&g, 60) == 0.0f);
    assert_true(ts_optim_groups_wd_at(&g, 131) == 1.0f);
    assert_true(ts_optim_groups_wd_at(&g, 145) == -1.0f);
    ts_optim_groups_free(&g);
    /* no rule: everything decays except padding */
    assert_int_equal(ts_optim_groups_build(&g, MODEL_N, model_params, MODEL_P, NULL), TS_OK);
    assert_int_equal(g.n, 3);
    assert_true(ts_optim_groups_wd_at(&g, 136) == 0.0f);
    ts_optim_groups_free(&g);
    /* overlap and out-of-range are errors naming the parameter */
    ts_optim_named bad[2] = {{"a.weight", 2, 0, 10}, {"b.weight", 2, 8, 4}};
    assert_int_equal(ts_optim_groups_build(&g, 20, bad, 2, &rule), TS_ERR_INDEX);
    assert_non_null(strstr(ts_last_error(), "'b.weight' at [8, 12) overlaps"));
    assert_null(g.ranges);
    bad[1].offset = 15;
    assert_int_equal(ts_optim_groups_build(&g, 18, bad, 2, &rule), TS_ERR_INDEX);
    assert_non_null(strstr(ts_last_error(), "'b.weight' range [15, 19) is outside [0, 18)"));
}

static void fill(uint64_t seed, float *x, int64_t n, float scale) {
    ts_rng_normal_f32(ts_key_from_seed(seed), 0, n, x);
    for (int64_t i = 0; i < n; i++) x[i] *= scale;
}

/* Groups honoured: with zero gradients AdamW only shrinks decayed elements. */
static void test_groups_honoured(void **state) {
    (void)state;
    ts_optim_groups g;
    assert_int_equal(ts_optim_groups_build(&g, MODEL_N, model_params, MODEL_P, &rule), TS_OK);
    g.ranges[2].lr_scale = 2.0f; /* fc2.weight: twice the lr */
    float p[MODEL_N], p0[MODEL_N], gr[MODEL_N] = {0}, st[2 * MODEL_N] = {0};
    fill(1, p, MODEL_N, 1.0f);
    memcpy(p0, p, sizeof p);
    ts_optim_config c = ts_optim_defaults(TS_OPTIM_ADAMW);
    c.weight_decay = 0.1;
    assert_int_equal(ts_optim_step_flat(&c, 1, 0.01, &g, p, gr, st, MODEL_N, 0, MODEL_N), TS_OK);
    for (int i = 0; i < MODEL_N; i++) {
        float wd = ts_optim_groups_wd_at(&g, i), lrs = i >= 96 && i < 132 ? 2.0f : 1.0f;
        float want = wd > 0 ? p0[i] * (float)(1.0 - 0.01 * lrs * 0.1) : p0[i];
        assert_true(p[i] == want);
    }
    ts_optim_groups_free(&g);
}

/* One step over [0, N) equals the same step over any split into sub-ranges,
 * including shard-local buffers (stride = shard length) as a PS shard holds. */
static void split_check(ts_optim_config c, const ts_optim_groups *g) {
    enum { N = MODEL_N, STEPS = 4 };
    float p_full[N], s_full[2 * N], p_split[N], grads[STEPS][N];
    fill(7, p_full, N, 1.0f);
    memcpy(p_split, p_full, sizeof p_full);
    memset(s_full, 0, sizeof s_full);
    for (int t = 0; t < STEPS; t++) fill(100 + (uint64_t)t, grads[t], N, 0.3f);
    const int64_t cuts[] = {0, 1, 37, 60, 61, 100, 133, 139, 145}; /* straddle parameter boundaries */
    const int ncut = (int)(sizeof cuts / sizeof cuts[0]);
    int k = ts_optim_state_slots(&c);
    float *shard_state[8];
    for (int s = 0; s + 1 < ncut; s++) shard_state[s] = calloc((size_t)(2 * (cuts[s + 1] - cuts[s])), sizeof(float));
    for (int t = 1; t <= STEPS; t++) {
        double lr = 0.05 / t;
        assert_int_equal(ts_optim_step_flat(&c, t, lr, g, p_full, grads[t - 1], s_full, N, 0, N), TS_OK);
        for (int s = 0; s + 1 < ncut; s++) {
            int64_t off = cuts[s], len = cuts[s + 1] - cuts[s];
            ts_optim_slice sl = {.params = p_split + off, .grads = grads[t - 1] + off,
                                 .state = k ? shard_state[s] : NULL, .stride = len, .offset = off, .len = len};
            assert_int_equal(ts_optim_step_range(&c, t, lr, g, &sl), TS_OK);
        }
        assert_memory_equal(p_full, p_split, sizeof p_full);
    }
    /* and the shard-local state equals the full state's slices */
    for (int s = 0; s + 1 < ncut; s++) {
        int64_t off = cuts[s], len = cuts[s + 1] - cuts[s];
        for (int j = 0; j < k; j++)
            assert_memory_equal(shard_state[s] + j * len, s_full + j * N + off, (size_t)len * sizeof(float));
        free(shard_state[s]);
    }
}

static void test_split_equals_full(void **state) {
    (void)state;
    ts_optim_groups g;
    assert_int_equal(ts_optim_groups_build(&g, MODEL_N, model_params, MODEL_P, &rule), TS_OK);
    ts_optim_config c = ts_optim_defaults(TS_OPTIM_ADAMW);
    c.weight_decay = 0.1;
    split_check(c, &g);
    c.kind = TS_OPTIM_ADAM;
    split_check(c, &g);
    c = ts_optim_defaults(TS_OPTIM_SGD);
    c.momentum = 0.9;
    c.weight_decay = 1e-3;
    split_check(c, &g);
    c.nesterov = true;
    split_check(c, NULL);
    c = ts_optim_defaults(TS_OPTIM_SGD);
    split_check(c, &g);
    ts_optim_groups_free(&g);
}

/* A range large enough for the OpenMP path gives the same bits as stepping
 * it in small serial pieces. */
static void test_parallel_equals_serial(void **state) {
    (void)state;
    enum { N = 100003 };
    float *p1 = malloc(N * sizeof(float)), *p2 = malloc(N * sizeof(float)), *g = malloc(N * sizeof(float));
    float *s1 = calloc(2 * N, sizeof(float)), *s2 = calloc(2 * N, sizeof(float));
    fill(3, p1, N, 1.0f);
    fill(4, g, N, 0.1f);
    memcpy(p2, p1, N * sizeof(float));
    ts_optim_config c = ts_optim_defaults(TS_OPTIM_ADAMW);
    for (int t = 1; t <= 2; t++) {
        assert_int_equal(ts_optim_step_flat(&c, t, 1e-3, NULL, p1, g, s1, N, 0, N), TS_OK);
        for (int64_t off = 0; off < N; off += 1000) {
            int64_t len = off + 1000 <= N ? 1000 : N - off;
            assert_int_equal(ts_optim_step_flat(&c, t, 1e-3, NULL, p2, g, s2, N, off, len), TS_OK);
        }
    }
    assert_memory_equal(p1, p2, N * sizeof(float));
    assert_memory_equal(s1, s2, 2 * N * sizeof(float));
    free(p1), free(p2), free(g), free(s1), free(s2);
}

static void test_schedules(void **state) {
    (void)state;
    ts_schedule s = {.kind = TS_SCHEDULE_CONSTANT, .base_lr = 0.1};
    assert_true(ts_schedule_lr(&s, 0) == 0.1 && ts_schedule_lr(&s, 12345) == 0.1);
    s = (ts_schedule){.kind = TS_SCHEDULE_STEP, .base_lr = 0.1, .step_size = 3, .gamma = 0.5};
    NEAR(ts_schedule_lr(&s, 0), 0.1, 1e-15);
    NEAR(ts_schedule_lr(&s, 2), 0.1, 1e-15);
    NEAR(ts_schedule_lr(&s, 3), 0.05, 1e-15);
    NEAR(ts_schedule_lr(&s, 7), 0.025, 1e-15);
    s = (ts_schedule){.kind = TS_SCHEDULE_COSINE, .base_lr = 1.0, .warmup_steps = 10, .total_steps = 110,
                      .min_lr = 0.1};
    NEAR(ts_schedule_lr(&s, 0), 0.1, 1e-12);  /* 1/10 of base */
    NEAR(ts_schedule_lr(&s, 4), 0.5, 1e-12);
    NEAR(ts_schedule_lr(&s, 9), 1.0, 1e-12);  /* end of warmup */
    NEAR(ts_schedule_lr(&s, 10), 1.0, 1e-12); /* cosine starts at the top */
    NEAR(ts_schedule_lr(&s, 60), 0.55, 1e-12); /* halfway: (base + min) / 2 */
    NEAR(ts_schedule_lr(&s, 35), 0.1 + 0.9 * 0.5 * (1 + cos(M_PI / 4)), 1e-12);
    NEAR(ts_schedule_lr(&s, 110), 0.1, 1e-12);
    NEAR(ts_schedule_lr(&s, 1000), 0.1, 1e-12);
    assert_true(isnan(ts_schedule_lr(&s, -1)));
    /* no warmup: step 0 is base_lr */
    s.warmup_steps = 0;
    NEAR(ts_schedule_lr(&s, 0), 1.0, 1e-12);
    assert_int_equal(ts_schedule_check(&s), TS_OK);
    s.total_steps = 0;
    assert_int_equal(ts_schedule_check(&s), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "0 <= warmup_steps < total_steps"));
    assert_true(isnan(ts_schedule_lr(&s, 3)));
    s = (ts_schedule){.kind = TS_SCHEDULE_STEP, .base_lr = 0.1, .step_size = 0, .gamma = 0.5};
    assert_int_equal(ts_schedule_check(&s), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "step_size = 0 must be >= 1"));
    assert_int_equal(ts_schedule_kind_parse("cosine"), TS_SCHEDULE_COSINE);
    assert_int_equal(ts_schedule_kind_parse("linear"), -1);
}

static void test_clip(void **state) {
    (void)state;
    float g[2] = {3, 4};
    double norm = 0;
    assert_int_equal(ts_clip_grad_norm(g, 2, 1.0, true, &norm), TS_OK);
    NEAR(norm, 5.0, 1e-12);
    NEAR(g[0], 3.0 / (5 + 1e-6), 1e-7);
    NEAR(g[1], 4.0 / (5 + 1e-6), 1e-7);
    /* below the threshold: unchanged */
    float h[2] = {3, 4};
    assert_int_equal(ts_clip_grad_norm(h, 2, 10.0, true, &norm), TS_OK);
    assert_true(h[0] == 3 && h[1] == 4);
    /* partial squared norms of shards add up to the whole */
    enum { N = 1000 };
    float x[N];
    fill(9, x, N, 1.0f);
    double whole = ts_clip_sq_norm(x, N), parts = ts_clip_sq_norm(x, 333) + ts_clip_sq_norm(x + 333, N - 333);
    NEAR(whole, parts, 1e-9 * whole);
    double ref = 0;
    for (int i = 0; i < N; i++) ref += (double)x[i] * x[i];
    NEAR(whole, ref, 1e-9 * ref);
    NEAR(ts_clip_coef(sqrt(whole), 1.0), 1.0 / (sqrt(whole) + 1e-6), 1e-15);
    assert_true(ts_clip_coef(0.5, 1.0) == 1.0);
    /* non-finite norms */
    float bad[2] = {INFINITY, 1};
    assert_int_equal(ts_clip_grad_norm(bad, 2, 1.0, true, &norm), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "total norm of 2 gradients is inf"));
    assert_true(bad[1] == 1); /* untouched */
    assert_int_equal(ts_clip_grad_norm(bad, 2, 1.0, false, &norm), TS_OK);
    assert_true(bad[1] == 0); /* PyTorch: scaled by max_norm / inf = 0 */
    assert_int_equal(ts_clip_grad_norm(g, 2, 0.0, false, NULL), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "max_norm = 0 must be finite and > 0"));
}

static void test_mixed(void **state) {
    (void)state;
    float master[3] = {1.0f, 1.0f + 3.0f / 256, -2.5f};
    uint16_t b[3];
    assert_int_equal(ts_mixed_to_bf16(master, b, 3), TS_OK);
    assert_true(ts_f32_from_bf16(b[0]) == 1.0f);
    assert_true(ts_f32_from_bf16(b[1]) == 1.0f + 1.0f / 64); /* rounded to the nearest bf16 */
    assert_true(ts_f32_from_bf16(b[2]) == -2.5f);
    float acc[3] = {0};
    assert_int_equal(ts_mixed_accumulate(acc, b, TS_BF16, 3, 0.5f), TS_OK);
    assert_int_equal(ts_mixed_accumulate(acc, master, TS_F32, 3, 0.5f), TS_OK);
    assert_true(acc[0] == 1.0f && acc[2] == -2.5f);
    assert_int_equal(ts_mixed_accumulate(acc, master, TS_I32, 3, 1.0f), TS_ERR_DTYPE);
    assert_non_null(strstr(ts_last_error(), "gradient dtype i32 is not f32 or bf16"));
    assert_true(ts_mixed_micro_scale(4) == 0.25f);
    assert_int_equal(ts_mixed_average(acc, 3, 0), TS_ERR_VALUE);
    assert_non_null(strstr(ts_last_error(), "k = 0 must be >= 1"));
    assert_int_equal(ts_mixed_average(acc, 3, 2), TS_OK);
    assert_true(acc[0] == 0.5f);
}

/* Gradient accumulation: for y = w.x with loss mean((y - t)^2) over a batch,
 * the mean of k micro-batch gradients (accumulated with scale 1/k) equals the
 * gradient over the whole batch. */
static void linear_grad(const float *w, const float *x, const float *t, int n, int d, float *grad) {
    memset(grad, 0, sizeof(float) * (size_t)d);
    for (int i = 0; i < n; i++) {
        float y = 0;
        for (int j = 0; j < d; j++) y += w[j] * x[i * d + j];
        for (int j = 0; j < d; j++) grad[j] += 2.0f * (y - t[i]) * x[i * d + j] / (float)n;
    }
}

static void test_grad_accumulation(void **state) {
    (void)state;
    enum { D = 6, B = 16, K = 4 };
    float w[D], x[B * D], t[B], whole[D], micro[D], acc[D] = {0};
    fill(11, w, D, 1.0f);
    fill(12, x, B * D, 1.0f);
    fill(13, t, B, 1.0f);
    linear_grad(w, x, t, B, D, whole);
    for (int k = 0; k < K; k++) {
        linear_grad(w, x + k * (B / K) * D, t + k * (B / K), B / K, D, micro);
        assert_int_equal(ts_mixed_accumulate(acc, micro, TS_F32, D, ts_mixed_micro_scale(K)), TS_OK);
    }
    for (int j = 0; j < D; j++) NEAR(acc[j], whole[j], 1e-5 * (fabs(whole[j]) + 1));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgd_by_hand),
        cmocka_unit_test(test_adam_by_hand),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_groups_build),
        cmocka_unit_test(test_groups_honoured),
        cmocka_unit_test(test_split_equals_full),
        cmocka_unit_test(test_parallel_equals_serial),
        cmocka_unit_test(test_schedules),
        cmocka_unit_test(test_clip),
        cmocka_unit_test(test_mixed),
        cmocka_unit_test(test_grad_accumulation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
