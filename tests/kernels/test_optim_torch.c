/* test_optim_torch.c - parity with torch.optim: the same flat parameters and
 * gradient sequence go through Tessera's step kernels and through
 * tests/kernels/optim_torch.py (run with /usr/bin/python3), 5 steps each of
 * AdamW (with groups, clip_grad_norm_ and a warmup+cosine lr), Adam (L2),
 * SGD with momentum and dampening (step lr) and Nesterov SGD; parameters
 * after every step must agree within 1e-5 relative. If torch cannot be
 * imported the test fails. */
#include <math.h>
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

#include "kernels/optim/clip.h"
#include "kernels/optim/optim.h"
#include "kernels/optim/schedule.h"
#include "kernels/rng.h"
#include "../test_util.h"

#define STEPS 5
#define TOL 1e-5

typedef struct {
    const char *name;
    int64_t offset;
    int ndim;
    int64_t shape[2];
} layout_entry;

/* A linear layer, a LayerNorm and a head, packed without gaps. */
static const layout_entry layout[] = {
    {"fc.weight", 0, 2, {12, 8}},   {"fc.bias", 96, 1, {12}}, {"ln.weight", 108, 1, {12}},
    {"ln.bias", 120, 1, {12}},      {"head.weight", 132, 2, {3, 12}}, {"head.bias", 168, 1, {3}},
};
#define NPARAM (int)(sizeof layout / sizeof layout[0])
#define N 171

typedef struct {
    const char *name;
    ts_optim_config cfg;
    ts_schedule sched;
    double max_norm; /* 0: no clipping */
} parity_case;

static char dir[] = "/tmp/tessera_optim_XXXXXX";
static float params0[N], grads[STEPS][N];

static void write_file(const char *name, const void *data, size_t n) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

static int setup(void **state) {
    (void)state;
    if (tu_make_tmp_dir(dir, sizeof dir, "tessera_optim")) return -1;
    ts_rng_normal_f32(ts_key_from_seed(2024), 0, N, params0);
    for (int t = 0; t < STEPS; t++) {
        ts_rng_normal_f32(ts_key_split(ts_key_from_seed(2025), (uint64_t)t), 0, N, grads[t]);
        for (int i = 0; i < N; i++) grads[t][i] *= 0.5f;
    }
    char path[256];
    snprintf(path, sizeof path, "%s/layout.txt", dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    for (int i = 0; i < NPARAM; i++) {
        fprintf(f, "%s %lld", layout[i].name, (long long)layout[i].offset);
        for (int d = 0; d < layout[i].ndim; d++) fprintf(f, " %lld", (long long)layout[i].shape[d]);
        fprintf(f, "\n");
    }
    fclose(f);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return tu_remove_dir(dir);
}

/* Runs optim_torch.py for case c; fills want[STEPS][N]. */
static void run_torch(const parity_case *c, const double *lrs, float want[STEPS][N]) {
    write_file("params.f32", params0, sizeof params0);
    write_file("grads.f32", grads, sizeof grads);
    write_file("lrs.f64", lrs, sizeof(double) * STEPS);
    char text[512];
    int len = snprintf(text, sizeof text,
                       "weight_decay %.17g\nmomentum %.17g\ndampening %.17g\nbeta1 %.17g\nbeta2 %.17g\neps %.17g\n"
                       "max_norm %.17g\n",
                       c->cfg.weight_decay, c->cfg.momentum, c->cfg.dampening, c->cfg.beta1, c->cfg.beta2,
                       c->cfg.eps, c->max_norm);
    write_file("case.txt", text, (size_t)len);
    char args[512];
    snprintf(args, sizeof args, "%s %s", dir, c->name);
    tu_run_python("tests/kernels/optim_torch.py", args, 3);
    char path[256];
    snprintf(path, sizeof path, "%s/torch_%s.f32", dir, c->name);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fread(want, sizeof(float), STEPS * N, f), STEPS * N);
    fclose(f);
}

static void run_case(const parity_case *c) {
    double lrs[STEPS];
    for (int t = 0; t < STEPS; t++) {
        lrs[t] = ts_schedule_lr(&c->sched, t);
        assert_false(isnan(lrs[t]));
    }
    static float want[STEPS][N];
    run_torch(c, lrs, want);

    ts_optim_named named[NPARAM];
    for (int i = 0; i < NPARAM; i++) {
        int64_t numel = 1;
        for (int d = 0; d < layout[i].ndim; d++) numel *= layout[i].shape[d];
        named[i] = (ts_optim_named){layout[i].name, layout[i].ndim, layout[i].offset, numel};
    }
    static const char *const no_decay[] = {"*bias*", "*ln*"};
    ts_optim_decay_rule rule = {.min_ndim = 2, .no_decay = no_decay, .n_no_decay = 2};
    ts_optim_groups groups;
    assert_int_equal(ts_optim_groups_build(&groups, N, named, NPARAM, &rule), TS_OK);

    float p[N], g[N], st[2 * N] = {0};
    memcpy(p, params0, sizeof p);
    double worst = 0;
    for (int t = 1; t <= STEPS; t++) {
        memcpy(g, grads[t - 1], sizeof g);
        if (c->max_norm > 0) assert_int_equal(ts_clip_grad_norm(g, N, c->max_norm, true, NULL), TS_OK);
        assert_int_equal(ts_optim_step_flat(&c->cfg, t, lrs[t - 1], &groups, p, g, st, N, 0, N), TS_OK);
        for (int i = 0; i < N; i++) {
            double w = want[t - 1][i], err = fabs((double)p[i] - w) / fmax(fabs(w), 1e-3);
            if (err > worst) worst = err;
            if (err > TOL)
                fail_msg("%s step %d element %d: tessera %.9g, torch %.9g (relative error %.3g)", c->name, t, i,
                         p[i], w, err);
        }
        /* the parameters really moved */
        assert_memory_not_equal(p, params0, sizeof p);
    }
    printf("%s: %d steps, worst relative error %.3g\n", c->name, STEPS, worst);
    ts_optim_groups_free(&groups);
}

static void test_adamw(void **state) {
    (void)state;
    parity_case c = {"adamw", ts_optim_defaults(TS_OPTIM_ADAMW),
                     {.kind = TS_SCHEDULE_COSINE, .base_lr = 0.01, .warmup_steps = 2, .total_steps = 5,
                      .min_lr = 0.001},
                     1.0};
    c.cfg.weight_decay = 0.1;
    run_case(&c);
}

static void test_adam(void **state) {
    (void)state;
    parity_case c = {"adam", ts_optim_defaults(TS_OPTIM_ADAM), {.kind = TS_SCHEDULE_CONSTANT, .base_lr = 0.003}, 0};
    c.cfg.weight_decay = 0.01;
    c.cfg.beta1 = 0.8;
    c.cfg.beta2 = 0.99;
    c.cfg.eps = 1e-6;
    run_case(&c);
}

static void test_sgd_momentum(void **state) {
    (void)state;
    parity_case c = {"sgd", ts_optim_defaults(TS_OPTIM_SGD),
                     {.kind = TS_SCHEDULE_STEP, .base_lr = 0.1, .step_size = 2, .gamma = 0.5}, 0};
    c.cfg.momentum = 0.9;
    c.cfg.dampening = 0.1;
    c.cfg.weight_decay = 1e-3;
    run_case(&c);
}

static void test_sgd_nesterov(void **state) {
    (void)state;
    parity_case c = {"nesterov", ts_optim_defaults(TS_OPTIM_SGD), {.kind = TS_SCHEDULE_CONSTANT, .base_lr = 0.05},
                     2.0};
    c.cfg.momentum = 0.9;
    c.cfg.nesterov = true;
    c.cfg.weight_decay = 1e-2;
    run_case(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_adam),
        cmocka_unit_test(test_sgd_momentum),
        cmocka_unit_test(test_sgd_nesterov),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
