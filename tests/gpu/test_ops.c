/* test_ops.c - every op of the kernel library forward and backward on
 * cuda:0 against the CPU backend: the same inputs, the loss sum(out * w)
 * with the same random w, and the output and every input's gradient
 * compared within f32 tolerance (1e-4 relative; TF32 is off). Also the
 * optimizer kernels over flat device ranges, and the caching allocator's
 * stats. Skips with one line where there is no CUDA device. */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "gpu_testing.h"
#include "kernels/autograd.h"
#include "kernels/ops/activation.h"
#include "kernels/ops/attention.h"
#include "kernels/ops/backend.h"
#include "kernels/ops/conv.h"
#include "kernels/ops/dropout.h"
#include "kernels/ops/elementwise.h"
#include "kernels/ops/embedding.h"
#include "kernels/ops/loss.h"
#include "kernels/ops/matmul.h"
#include "kernels/ops/norm.h"
#include "kernels/ops/pool.h"
#include "kernels/ops/reduce.h"
#include "kernels/ops/select.h"
#include "kernels/ops/softmax.h"
#include "kernels/ops/view.h"

#define MAXIN 4
#define TOL 1e-4

/* What an input is: random normal values (with gradient), positive ones
 * (log, sqrt, div), class indices below `hi`, or a 0/1 mask. */
typedef enum { IN_NORMAL, IN_POSITIVE, IN_INDEX, IN_MASK } in_kind;

typedef struct {
    in_kind kind;
    int ndim;
    int64_t shape[4];
    int64_t hi; /* IN_INDEX: indices in [0, hi) */
} in_spec;

typedef ts_tensor *(*op_fn)(ts_tensor *const *in);

typedef struct {
    const char *name;
    op_fn fn;
    int n;
    in_spec in[MAXIN];
} op_case;

/* ---- the ops under test ---- */

static ts_tensor *f_add_row(ts_tensor *const *in) { return ts_add(in[0], in[1]); }
static ts_tensor *f_sub(ts_tensor *const *in) { return ts_sub(in[0], in[1]); }
static ts_tensor *f_mul_t(ts_tensor *const *in) {
    ts_tensor *t = ts_transpose(in[1], 0, 1), *y = ts_mul(in[0], t);
    ts_tensor_release(t);
    return y;
}
static ts_tensor *f_div(ts_tensor *const *in) { return ts_div(in[0], in[1]); }
static ts_tensor *f_neg(ts_tensor *const *in) { return ts_neg(in[0]); }
static ts_tensor *f_add_scalar(ts_tensor *const *in) { return ts_add_scalar(in[0], 0.75); }
static ts_tensor *f_mul_scalar(ts_tensor *const *in) { return ts_mul_scalar(in[0], -1.5); }
static ts_tensor *f_pow(ts_tensor *const *in) { return ts_pow_scalar(in[0], 2.5); }
static ts_tensor *f_exp(ts_tensor *const *in) { return ts_exp(in[0]); }
static ts_tensor *f_log(ts_tensor *const *in) { return ts_log(in[0]); }
static ts_tensor *f_sqrt(ts_tensor *const *in) { return ts_sqrt(in[0]); }
static ts_tensor *f_abs(ts_tensor *const *in) { return ts_abs(in[0]); }
static ts_tensor *f_relu(ts_tensor *const *in) { return ts_relu(in[0]); }
static ts_tensor *f_gelu(ts_tensor *const *in) { return ts_gelu(in[0]); }
static ts_tensor *f_sigmoid(ts_tensor *const *in) { return ts_sigmoid(in[0]); }
static ts_tensor *f_tanh(ts_tensor *const *in) { return ts_tanh(in[0]); }
static ts_tensor *f_sum_dim(ts_tensor *const *in) { return ts_sum(in[0], 1, (int[]){1}, false); }
static ts_tensor *f_sum_inner(ts_tensor *const *in) { return ts_sum(in[0], 1, (int[]){0}, true); }
static ts_tensor *f_mean_all(ts_tensor *const *in) { return ts_mean_all(in[0]); }
static ts_tensor *f_max_dim(ts_tensor *const *in) { return ts_max(in[0], 1, (int[]){0}, false); }
static ts_tensor *f_softmax(ts_tensor *const *in) { return ts_softmax(in[0], -1); }
static ts_tensor *f_log_softmax(ts_tensor *const *in) { return ts_log_softmax(in[0], -1); }
static ts_tensor *f_layernorm(ts_tensor *const *in) { return ts_layernorm(in[0], in[1], in[2], 1e-5); }
static ts_tensor *f_cross_entropy(ts_tensor *const *in) {
    return ts_cross_entropy(in[0], in[1], 3, TS_REDUCTION_MEAN); /* class 3 ignored */
}
static ts_tensor *f_mse(ts_tensor *const *in) { return ts_mse(in[0], in[1], TS_REDUCTION_MEAN); }
static ts_tensor *f_matmul(ts_tensor *const *in) { return ts_matmul(in[0], in[1]); }
static ts_tensor *f_matmul_t(ts_tensor *const *in) {
    ts_tensor *t = ts_transpose(in[1], -1, -2), *y = ts_matmul(in[0], t);
    ts_tensor_release(t);
    return y;
}
static ts_tensor *f_attention_causal(ts_tensor *const *in) { return ts_attention(in[0], in[1], in[2], true, 0); }
static ts_tensor *f_attention_full(ts_tensor *const *in) { return ts_attention(in[0], in[1], in[2], false, 0.3); }
static ts_tensor *f_embedding(ts_tensor *const *in) { return ts_embedding(in[0], in[1]); }
static ts_tensor *f_dropout(ts_tensor *const *in) { return ts_dropout(in[0], 0.3, ts_key_from_seed(5), true); }
static ts_tensor *f_conv(ts_tensor *const *in) {
    ts_conv2d_opts o = {.stride_h = 2, .stride_w = 1, .pad_h = 1, .pad_w = 2, .dil_h = 1, .dil_w = 2, .groups = 1};
    return ts_conv2d(in[0], in[1], in[2], &o);
}
static ts_tensor *f_max_pool(ts_tensor *const *in) { return ts_max_pool2d(in[0], 3, 2, 2, 2, 1, 0); }
static ts_tensor *f_avg_pool(ts_tensor *const *in) { return ts_avg_pool2d(in[0], 2, 3, 1, 2, 1, 1); }
static ts_tensor *f_where(ts_tensor *const *in) { return ts_where(in[2], in[0], in[1]); }
static ts_tensor *f_permute_copy(ts_tensor *const *in) {
    ts_tensor *t = ts_permute(in[0], (int[]){2, 0, 1}), *y = t ? ts_contiguous(t) : NULL;
    ts_tensor_release(t);
    return y;
}
static ts_tensor *f_bf16_roundtrip(ts_tensor *const *in) {
    ts_tensor *h = ts_to_dtype(in[0], TS_BF16), *y = h ? ts_to_dtype(h, TS_F32) : NULL;
    ts_tensor_release(h);
    return y;
}

#define IN(k, ...) \
    { k, sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t), {__VA_ARGS__}, 0 }
#define IDX(hi, ...) \
    { IN_INDEX, sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t), {__VA_ARGS__}, hi }

static const op_case cases[] = {
    {"add (row broadcast)", f_add_row, 2, {IN(IN_NORMAL, 33, 70), IN(IN_NORMAL, 70)}},
    {"sub (scalar)", f_sub, 2, {IN(IN_NORMAL, 5, 9), IN(IN_NORMAL, 1)}},
    {"mul (transposed operand)", f_mul_t, 2, {IN(IN_NORMAL, 40, 24), IN(IN_NORMAL, 24, 40)}},
    {"div", f_div, 2, {IN(IN_NORMAL, 3, 4, 5), IN(IN_POSITIVE, 3, 4, 5)}},
    {"neg", f_neg, 1, {IN(IN_NORMAL, 300)}},
    {"add_scalar", f_add_scalar, 1, {IN(IN_NORMAL, 300)}},
    {"mul_scalar", f_mul_scalar, 1, {IN(IN_NORMAL, 300)}},
    {"pow", f_pow, 1, {IN(IN_POSITIVE, 300)}},
    {"exp", f_exp, 1, {IN(IN_NORMAL, 300)}},
    {"log", f_log, 1, {IN(IN_POSITIVE, 300)}},
    {"sqrt", f_sqrt, 1, {IN(IN_POSITIVE, 300)}},
    {"abs", f_abs, 1, {IN(IN_NORMAL, 300)}},
    {"relu", f_relu, 1, {IN(IN_NORMAL, 300)}},
    {"gelu", f_gelu, 1, {IN(IN_NORMAL, 3000)}},
    {"sigmoid", f_sigmoid, 1, {IN(IN_NORMAL, 300)}},
    {"tanh", f_tanh, 1, {IN(IN_NORMAL, 300)}},
    {"sum over a dim", f_sum_dim, 1, {IN(IN_NORMAL, 7, 1000, 3)}},
    {"sum over rows", f_sum_inner, 1, {IN(IN_NORMAL, 513, 65)}},
    {"mean of all", f_mean_all, 1, {IN(IN_NORMAL, 100000)}},
    {"max over a dim", f_max_dim, 1, {IN(IN_NORMAL, 17, 30)}},
    {"softmax", f_softmax, 1, {IN(IN_NORMAL, 6, 1030)}},
    {"log_softmax", f_log_softmax, 1, {IN(IN_NORMAL, 9, 33)}},
    {"layernorm", f_layernorm, 3, {IN(IN_NORMAL, 2, 300, 768), IN(IN_NORMAL, 768), IN(IN_NORMAL, 768)}},
    {"cross_entropy", f_cross_entropy, 2, {IN(IN_NORMAL, 64, 50304), IDX(8, 64)}},
    {"mse", f_mse, 2, {IN(IN_NORMAL, 4, 77), IN(IN_NORMAL, 4, 77)}},
    {"matmul", f_matmul, 2, {IN(IN_NORMAL, 37, 129), IN(IN_NORMAL, 129, 65)}},
    {"matmul (batched, transposed)", f_matmul_t, 2, {IN(IN_NORMAL, 2, 3, 16, 24), IN(IN_NORMAL, 2, 3, 20, 24)}},
    {"attention (causal)",
     f_attention_causal,
     3,
     {IN(IN_NORMAL, 2, 3, 100, 64), IN(IN_NORMAL, 2, 3, 100, 64), IN(IN_NORMAL, 2, 3, 100, 64)}},
    {"attention (full, Tq != Tk, D != Dv)",
     f_attention_full,
     3,
     {IN(IN_NORMAL, 1, 2, 45, 40), IN(IN_NORMAL, 1, 2, 70, 40), IN(IN_NORMAL, 1, 2, 70, 24)}},
    {"embedding", f_embedding, 2, {IN(IN_NORMAL, 20, 48), IDX(20, 6, 7)}},
    {"dropout", f_dropout, 1, {IN(IN_NORMAL, 10001)}},
    {"conv2d", f_conv, 3, {IN(IN_NORMAL, 2, 3, 11, 9), IN(IN_NORMAL, 4, 3, 3, 2), IN(IN_NORMAL, 4)}},
    {"max_pool2d", f_max_pool, 1, {IN(IN_NORMAL, 2, 3, 9, 8)}},
    {"avg_pool2d", f_avg_pool, 1, {IN(IN_NORMAL, 2, 3, 9, 8)}},
    {"where", f_where, 3, {IN(IN_NORMAL, 6, 7), IN(IN_NORMAL, 7), IN(IN_MASK, 6, 7)}},
    {"permute + contiguous", f_permute_copy, 1, {IN(IN_NORMAL, 3, 5, 7)}},
    {"bf16 round trip", f_bf16_roundtrip, 1, {IN(IN_NORMAL, 999)}},
};

/* A host input of spec s drawn from key. */
static ts_tensor *make_input(const in_spec *s, ts_key key) {
    ts_tensor *t;
    if (s->kind == IN_INDEX || s->kind == IN_MASK) {
        int64_t bound = s->kind == IN_INDEX ? s->hi : 2;
        t = ts_tensor_zeros(s->kind == IN_INDEX ? TS_I64 : TS_U8, s->ndim, s->shape);
        for (int64_t i = 0; t && i < ts_tensor_numel(t); i++)
            ts_tensor_set(t, i, (double)ts_rng_below(key, (uint64_t)i, (uint64_t)bound));
        return t;
    }
    t = ts_tensor_randn(key, TS_F32, s->ndim, s->shape);
    if (t && s->kind == IN_POSITIVE)
        for (int64_t i = 0; i < ts_tensor_numel(t); i++) ts_tensor_set(t, i, 0.2 + fabs(ts_tensor_get(t, i)));
    if (t) t->requires_grad = true;
    return t;
}

/* Runs c on inputs (any device): *out, and the gradients of sum(out * w)
 * left in the inputs; w is made on the host from key and moved. */
static ts_status run_case(const op_case *c, ts_tensor *const *in, ts_key key, ts_tensor **out) {
    *out = c->fn(in);
    if (!*out) return ts_last_status();
    ts_tensor *wh = ts_tensor_randn(key, TS_F32, (*out)->ndim, (*out)->shape);
    ts_tensor *w = wh ? ts_tensor_to(wh, ts_tensor_device(in[0])) : NULL;
    ts_tensor *prod = w ? ts_mul(*out, w) : NULL, *loss = prod ? ts_sum_all(prod) : NULL;
    ts_status st = loss ? ts_backward(loss, NULL) : ts_last_status();
    ts_tensor_release(wh);
    ts_tensor_release(w);
    ts_tensor_release(prod);
    ts_tensor_release(loss);
    return st;
}

static int check_case(const op_case *c, int k) {
    ts_tensor *host[MAXIN] = {0}, *dev[MAXIN] = {0}, *ho = NULL, *go = NULL;
    ts_key key = ts_key_fold_in(ts_key_from_seed(17), (uint64_t)k);
    for (int i = 0; i < c->n; i++) {
        host[i] = make_input(&c->in[i], ts_key_split(key, (uint64_t)i));
        dev[i] = gpu_leaf(host[i]);
    }
    ts_key wkey = ts_key_split(key, 99);
    int bad = 0;
    if (run_case(c, host, wkey, &ho)) {
        printf("FAIL %-36s cpu: %s\n", c->name, ts_last_error());
        bad = 1;
    } else if (run_case(c, dev, wkey, &go)) {
        printf("FAIL %-36s cuda: %s\n", c->name, ts_last_error());
        bad = 1;
    } else {
        double worst = gpu_max_rel(go, ho);
        char what[64] = "output";
        for (int i = 0; i < c->n; i++) {
            if (!host[i]->requires_grad) continue;
            double e = !dev[i]->grad || !host[i]->grad ? INFINITY : gpu_max_rel(dev[i]->grad, host[i]->grad);
            if (e > worst) {
                worst = e;
                snprintf(what, sizeof what, "gradient of input %d", i);
            }
        }
        bad = !(worst <= TOL);
        printf("%s %-36s max rel diff %.2e (%s)\n", bad ? "FAIL" : "ok  ", c->name, worst, what);
    }
    for (int i = 0; i < c->n; i++) {
        ts_tensor_release(host[i]);
        ts_tensor_release(dev[i]);
    }
    ts_tensor_release(ho);
    ts_tensor_release(go);
    return bad;
}

/* ---- the optimizer kernels over flat device ranges ---- */

/* One AdamW and one SGD-with-momentum run on the host and on the device
 * over the same values; 1e-6 relative apart. */
static int check_optim(void) {
    const int64_t n = 100003;
    ts_key key = ts_key_from_seed(3);
    ts_tensor *h[4], *d[4];
    for (int i = 0; i < 4; i++) {
        h[i] = ts_tensor_randn(ts_key_split(key, (uint64_t)i), TS_F32, 1, &n);
        if (i >= 2)
            for (int64_t j = 0; j < n; j++) ts_tensor_set(h[i], j, fabs(ts_tensor_get(h[i], j)) * (i == 3 ? 1e-3 : 1));
        d[i] = gpu_leaf(h[i]);
    }
    const ts_backend *cpu = ts_backend_cpu(), *gpu = ts_backend_of("optim", ts_cuda(0));
    ts_optim_run r = {.n = n,
                      .step_size = 1e-3f / 0.1f,
                      .bc2_sqrt = 0.03f,
                      .beta1 = 0.9f,
                      .beta2 = 0.999f,
                      .one_minus_beta1 = 0.1f,
                      .one_minus_beta2 = 0.001f,
                      .eps = 1e-8f,
                      .shrink = 1 - 1e-5f,
                      .lr = 0.01f,
                      .momentum = 0.9f,
                      .damp_keep = 1,
                      .weight_decay = 0.01f};
    int bad = 0;
    for (int pass = 0; pass < 2; pass++) {
        ts_optim_run rh = r, rd = r;
        rh.params = ts_f32(h[0]), rh.grads = ts_f32(h[1]), rh.s0 = ts_f32(h[2]), rh.s1 = ts_f32(h[3]);
        rd.params = ts_f32(d[0]), rd.grads = ts_f32(d[1]), rd.s0 = ts_f32(d[2]), rd.s1 = ts_f32(d[3]);
        if (pass == 1) rh.s1 = rd.s1 = NULL;
        ts_status st = pass ? cpu->optim->sgd(&rh) : cpu->optim->adam(&rh);
        if (!st) st = pass ? gpu->optim->sgd(&rd) : gpu->optim->adam(&rd);
        double e = st ? INFINITY : gpu_max_rel(d[0], h[0]), e2 = st ? INFINITY : gpu_max_rel(d[2], h[2]);
        if (e2 > e) e = e2;
        bool fail = !(e <= 1e-6);
        bad |= fail;
        printf("%s %-36s max rel diff %.2e%s%s\n", fail ? "FAIL" : "ok  ", pass ? "sgd (momentum, decay)" : "adamw", e,
               st ? ": " : "", st ? ts_last_error() : "");
    }
    double hs = 0, ds = 0;
    ts_status st = cpu->optim->sq_norm(ts_f32(h[1]), n, &hs);
    if (!st) st = gpu->optim->sq_norm(ts_f32(d[1]), n, &ds);
    bool fail = st || fabs(hs - ds) > 1e-9 * hs;
    bad |= fail;
    printf("%s %-36s %.10g vs %.10g\n", fail ? "FAIL" : "ok  ", "squared norm", ds, hs);
    for (int i = 0; i < 4; i++) {
        ts_tensor_release(h[i]);
        ts_tensor_release(d[i]);
    }
    return bad;
}

/* The allocator: what tensors hold is allocated, freed memory stays
 * reserved, the peak remembers. */
static int check_allocator(void) {
    ts_cuda_empty_cache(0);
    ts_alloc_stats before = ts_cuda_memory_stats(0);
    int64_t n = 1 << 22;
    ts_tensor *t = ts_tensor_zeros_on(ts_cuda(0), TS_F32, 1, &n);
    ts_alloc_stats during = ts_cuda_memory_stats(0);
    ts_tensor_release(t);
    ts_alloc_stats after = ts_cuda_memory_stats(0);
    bool ok = t && during.allocated >= before.allocated + (16u << 20) && after.allocated == before.allocated &&
              after.reserved >= during.allocated && after.peak >= during.allocated;
    printf("%s %-36s allocated %zu -> %zu -> %zu, reserved %zu, peak %zu\n", ok ? "ok  " : "FAIL", "caching allocator",
           before.allocated, during.allocated, after.allocated, after.reserved, after.peak);
    return !ok;
}

int main(void) {
    gpu_require_device();
    ts_cuda_set_tf32(false);
    int failed = 0, n = (int)(sizeof cases / sizeof cases[0]);
    for (int k = 0; k < n; k++) failed += check_case(&cases[k], k);
    failed += check_optim();
    failed += check_allocator();
    printf("%s: %d of %d op checks failed\n", failed ? "FAILED" : "passed", failed, n + 4);
    return failed ? 1 : 0;
}
