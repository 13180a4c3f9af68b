/* gpu_gpt.c - GPT training steps on one GPU: the GPT-2 124M shape (12
 * layers, C = 768, 12 heads, T = 1024, vocab 50304), bf16 compute copy
 * with f32 master weights and AdamW, TF32 GEMMs.
 *
 * Step = zero grads, forward, mean cross-entropy, backward, fold of the
 * bf16 gradients into the f32 master, AdamW over the whole flat buffer
 * (weight decay on matrices), bf16 copy refreshed. Timed with CUDA events
 * after warm-up; median of the steps. Prints tokens/s, MFU = (6 N + 12 L C
 * T) FLOPs per token (PaLM's count: the weights' products forward and
 * backward plus attention's) over the dense bf16 peak given by --peak-tflops
 * (989 for an H100/H200 SXM), and the caching allocator's peak.
 *
 * Usage: bench_gpu_gpt [--batch B] [--steps N] [--warmup N] [--layers L]
 *        [--seq T] [--f32] [--no-tf32] [--peak-tflops P]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if TESSERA_WITH_CUDA

#include "kernels/autograd.h"
#include "kernels/nn/models.h"
#include "kernels/ops/cuda/runtime.h"
#include "kernels/ops/loss.h"
#include "kernels/ops/view.h"
#include "kernels/optim/optim.h"

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Exits with the last error after naming what failed. */
static void check(ts_status st, const char *what) {
    if (!st) return;
    fprintf(stderr, "gpu_gpt: %s: %s\n", what, ts_last_error());
    exit(1);
}

/* One training step of m on tokens x, targets y (device); *loss its loss. */
static ts_status step(ts_model *m, ts_tensor *x, ts_tensor *y, const ts_optim_config *cfg, const ts_optim_groups *g,
                      int64_t t, double *loss) {
    ts_model_zero_grad(m);
    ts_tensor *logits = ts_model_forward(m, x);
    ts_tensor *flat = logits ? ts_reshape(logits, 2, (int64_t[]){-1, logits->shape[2]}) : NULL;
    ts_tensor *l = flat ? ts_cross_entropy(flat, y, -100, TS_REDUCTION_MEAN) : NULL;
    ts_tensor_release(flat);
    ts_tensor_release(logits);
    ts_status st = l ? ts_backward(l, NULL) : ts_last_status();
    if (!st) *loss = ts_tensor_item(l);
    ts_tensor_release(l);
    if (!st) st = ts_model_fold_compute_grads(m, 1);
    ts_optim_slice sl = {.params = ts_f32(m->flat_params), .grads = ts_f32(m->flat_grads), .state = m->state,
                         .stride = m->numel, .len = m->numel, .device = m->device};
    if (!st) st = ts_optim_step_range(cfg, t, 6e-4, g, &sl);
    if (!st) st = ts_model_sync_compute(m);
    return st;
}

int main(int argc, char **argv) {
    int64_t batch = 8, steps = 10, warmup = 3, layers = 12, seq = 1024;
    bool bf16 = true, tf32 = true;
    double peak_tflops = 989.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "0";
        if (!strcmp(a, "--batch")) batch = atoll(v), i++;
        else if (!strcmp(a, "--steps")) steps = atoll(v), i++;
        else if (!strcmp(a, "--warmup")) warmup = atoll(v), i++;
        else if (!strcmp(a, "--layers")) layers = atoll(v), i++;
        else if (!strcmp(a, "--seq")) seq = atoll(v), i++;
        else if (!strcmp(a, "--peak-tflops")) peak_tflops = atof(v), i++;
        else if (!strcmp(a, "--f32")) bf16 = false;
        else if (!strcmp(a, "--no-tf32")) tf32 = false;
        else {
            fprintf(stderr, "usage: %s [--batch B] [--steps N] [--warmup N] [--layers L] [--seq T] [--f32] "
                            "[--no-tf32] [--peak-tflops P]\n", argv[0]);
            return 2;
        }
    }
    if (ts_cuda_device_count() == 0) {
        printf("no CUDA device: skipped\n");
        return 0;
    }
    if (steps < 1) steps = 1;
    ts_cuda_set_tf32(tf32);
    check(ts_cuda_set_device(0), "device");
    ts_model_spec s = {.arch = TS_ARCH_GPT,
                       .gpt = {.vocab = 50304, .block_size = seq, .n_layer = layers, .n_head = 12, .n_embd = 768}};
    ts_model *m = ts_model_build(&s, 0, -1, ts_key_from_seed(1), TS_F32);
    if (!m) check(ts_last_status(), "model");
    check(ts_model_to(m, ts_cuda(0)), "model to cuda:0");
    if (bf16) check(ts_model_set_compute_dtype(m, TS_BF16), "bf16 compute");
    ts_optim_config cfg = ts_optim_defaults(TS_OPTIM_ADAMW);
    cfg.weight_decay = 0.1;
    check(ts_model_alloc_state(m, ts_optim_state_slots(&cfg)), "optimizer state");
    ts_optim_named *named = malloc(sizeof *named * (size_t)m->n_params);
    for (int i = 0; i < m->n_params; i++)
        named[i] = (ts_optim_named){m->params[i].name, m->params[i].ndim, m->params[i].offset, m->params[i].numel};
    ts_optim_groups groups;
    check(ts_optim_groups_build(&groups, m->numel, named, m->n_params, &(ts_optim_decay_rule){.min_ndim = 2}),
          "groups");
    free(named);
    /* one fixed batch of random tokens; targets the next token */
    ts_tensor *xh = ts_tensor_empty(TS_I64, 2, (int64_t[]){batch, seq});
    ts_tensor *yh = ts_tensor_empty(TS_I64, 1, (int64_t[]){batch * seq});
    for (int64_t i = 0; i < batch * seq; i++) {
        ts_tensor_set(xh, i, (double)ts_rng_below(ts_key_from_seed(2), (uint64_t)i, 50257));
        ts_tensor_set(yh, i, (double)ts_rng_below(ts_key_from_seed(2), (uint64_t)i + 1, 50257));
    }
    ts_tensor *x = ts_tensor_to(xh, ts_cuda(0)), *y = ts_tensor_to(yh, ts_cuda(0));
    if (!x || !y) check(ts_last_status(), "batch");
    ts_cuda_event *e0 = ts_cuda_event_new(), *e1 = ts_cuda_event_new();
    float *ms = calloc((size_t)steps, sizeof *ms);
    double loss = 0, first_loss = 0;
    for (int64_t it = 0; it < warmup + steps; it++) {
        if (it == warmup) ts_cuda_reset_peak(0);
        check(ts_cuda_event_record(e0, NULL), "event");
        check(step(m, x, y, &cfg, &groups, it + 1, &loss), "step");
        check(ts_cuda_event_record(e1, NULL), "event");
        check(ts_cuda_event_synchronize(e1), "synchronize");
        if (it == 0) first_loss = loss;
        if (it >= warmup) check(ts_cuda_event_elapsed_ms(e0, e1, &ms[it - warmup]), "timing");
    }
    qsort(ms, (size_t)steps, sizeof *ms, cmp_float);
    double med = ms[steps / 2], tokens = (double)(batch * seq);
    double flops_per_token = 6.0 * (double)m->numel + 12.0 * (double)(layers * 768 * seq);
    double tok_s = tokens / (med / 1e3), mfu = tok_s * flops_per_token / (peak_tflops * 1e12);
    ts_alloc_stats a = ts_cuda_memory_stats(0);
    printf("gpu_gpt: GPT L=%lld C=768 H=12 T=%lld vocab=50304, %lld parameters, batch %lld, %s compute, TF32 %s\n",
           (long long)layers, (long long)seq, (long long)m->numel, (long long)batch, bf16 ? "bf16" : "f32",
           tf32 ? "on" : "off");
    printf("gpu_gpt: step %.1f ms (median of %lld, min %.1f, max %.1f), %.0f tokens/s, MFU %.1f%% of %.0f TFLOPS, "
           "peak memory %.2f GiB (reserved %.2f GiB), loss %.3f -> %.3f\n",
           med, (long long)steps, ms[0], ms[steps - 1], tok_s, 100 * mfu, peak_tflops, a.peak / 1073741824.0,
           a.reserved / 1073741824.0, first_loss, loss);
    ts_cuda_event_free(e0);
    ts_cuda_event_free(e1);
    free(ms);
    ts_tensor_release(x);
    ts_tensor_release(y);
    ts_tensor_release(xh);
    ts_tensor_release(yh);
    ts_optim_groups_free(&groups);
    ts_model_free(m);
    return 0;
}

#else

int main(void) {
    printf("gpu_gpt: built without CUDA: skipped\n");
    return 0;
}

#endif
