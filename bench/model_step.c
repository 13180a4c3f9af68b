/* model_step.c - one training step of a GPT and of the CNN, Tessera vs
 * PyTorch (bench/model_step_torch.py under /usr/bin/python3), at 1 and 2
 * threads, with peak memory.
 *
 * Step = zero grads, forward, mean cross-entropy, backward, AdamW over the
 * whole flat buffer (weight decay on matrices only). A second table runs
 * the same steps with bf16 compute (ts_model_set_compute_dtype) against
 * Tessera's f32 figures of the first. GPT: L=4, C=256, 4
 * heads, T=128, B=8, vocab 256. CNN: B=64 1x28x28, 16/32 channels, kernel 5.
 *
 * Every (framework, model, threads) runs in a fresh process ("--one MODEL
 * THREADS" for Tessera), so memory is measured the same way on both sides:
 * - peak RSS growth: VmHWM at the end minus VmRSS before the model was built
 *   (model, gradients, optimizer state, activations, allocator caches);
 * - step peak: before the last step, caches emptied (ts_alloc_empty_cache /
 *   nothing to empty for torch on CPU) and malloc_trim(0), the high-water
 *   mark reset (echo 5 > /proc/self/clear_refs); then VmHWM after the step
 *   minus VmRSS before it;
 * - Tessera also reports its allocator's peak of live tensor bytes in the
 *   step (ts_alloc_get_stats().peak after ts_alloc_reset_peak()).
 * Time: median of the steps after warm-up. Ratio = Tessera / PyTorch.
 * Each row is one CPU capability this machine offers: Tessera with
 * TESSERA_CPU_CAPABILITY, PyTorch with its own kernels held to the same
 * vector ISA (bench_torch_isa_env). The first line gives the CPU model and its measured FMA
 * peak (fma_peak.h); each GPT row gives the step's matrix-product work
 * over its time, and that as a share of the peak.
 * Both children run with OMP_WAIT_POLICY=passive and
 * OPENBLAS_THREAD_TIMEOUT=4, as tessera-run starts its processes (see
 * ts_threads_passive): idle workers of either pool then sleep
 * instead of spinning on the cores the other pool's threads need.
 *
 * Usage: bench_model_step [--steps N] [--warmup N] [--capabilities default,avx2,avx512] [--cpu-time]
 *                         [--torch-native]
 * (--torch-native: PyTorch keeps its best vector ISA in every row)
 * (--cpu-time: steps timed by process CPU time, both sides; for a loaded
 * machine, meaningful at one thread)
 */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "fma_peak.h"
#include "kernels/alloc.h"
#include "kernels/autograd.h"
#include "kernels/nn/models.h"
#include "kernels/ops/cpu/capability.h"
#include "kernels/ops/loss.h"
#include "kernels/ops/view.h"
#include "kernels/optim/optim.h"
#include "kernels/threads.h"

typedef struct {
    double ms, rss_mb, step_rss_mb, alloc_mb;
} result;


/* A "VmRSS:" / "VmHWM:" field of /proc/self/status, in MiB. */
static double proc_mb(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = -1;
    size_t n = strlen(field);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, field, n)) kb = atof(line + n);
    if (f) fclose(f);
    return kb / 1024.0;
}

static void reset_hwm(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) {
        fputs("5", f);
        fclose(f);
    }
}

static ts_model_spec spec_of(const char *model, int64_t *batch, int64_t *classes) {
    ts_model_spec s = {0};
    if (!strncmp(model, "gpt", 3)) {
        s.arch = TS_ARCH_GPT;
        s.gpt = (ts_gpt_config){.vocab = 256, .block_size = 128, .n_layer = 4, .n_head = 4, .n_embd = 256};
        *batch = 8;
        *classes = 256;
    } else {
        s = (ts_model_spec){.arch = TS_ARCH_CNN, .in_ch = 1, .img = 28, .ch1 = 16, .ch2 = 32, .kernel = 5, .classes = 10};
        *batch = 64;
        *classes = 10;
    }
    return s;
}

/* Runs warmup + steps training steps of model ("gpt" or "cnn", with
 * "-bf16": bf16 compute on f32 master weights) in this process. */
static int run_one(const char *model, int threads, int warmup, int steps, result *r) {
    ts_threads_set(threads);
    double rss0 = proc_mb("VmRSS:");
    int64_t batch, classes;
    bool bf16 = strstr(model, "-bf16") != NULL;
    ts_model_spec s = spec_of(model, &batch, &classes);
    ts_model *m = ts_model_build(&s, 0, -1, ts_key_from_seed(1), TS_F32);
    ts_optim_config cfg = ts_optim_defaults(TS_OPTIM_ADAMW);
    if (!m || (bf16 && ts_model_set_compute_dtype(m, TS_BF16)) || ts_model_alloc_state(m, ts_optim_state_slots(&cfg))) {
        fprintf(stderr, "model_step: %s\n", ts_last_error());
        return 1;
    }
    ts_optim_named *named = malloc(sizeof *named * (size_t)m->n_params);
    for (int i = 0; i < m->n_params; i++)
        named[i] = (ts_optim_named){m->params[i].name, m->params[i].ndim, m->params[i].offset, m->params[i].numel};
    ts_optim_decay_rule rule = {.min_ndim = 2};
    ts_optim_groups groups;
    if (ts_optim_groups_build(&groups, m->numel, named, m->n_params, &rule)) {
        fprintf(stderr, "model_step: %s\n", ts_last_error());
        return 1;
    }
    free(named);
    /* one fixed batch */
    int64_t shape[TS_MAX_DIMS];
    ts_dtype dt;
    int nd = ts_model_input_shape(&s, batch, shape, &dt);
    ts_tensor *x = ts_tensor_rand(ts_key_from_seed(2), TS_F32, nd, shape), *y;
    if (dt == TS_I64) {
        ts_tensor *ids = ts_tensor_empty(TS_I64, nd, shape);
        for (int64_t i = 0; i < ts_tensor_numel(x); i++) ts_tensor_set(ids, i, (double)(int64_t)(ts_tensor_get(x, i) * 256));
        ts_tensor_release(x);
        x = ids;
        y = ts_tensor_empty(TS_I64, 1, (int64_t[]){batch * shape[1]});
        for (int64_t i = 0; i < batch * shape[1]; i++) ts_tensor_set(y, i, (double)((i * 7) % classes));
    } else {
        y = ts_tensor_empty(TS_I64, 1, &batch);
        for (int64_t i = 0; i < batch; i++) ts_tensor_set(y, i, (double)(i % classes));
    }
    double *times = malloc(sizeof(double) * (size_t)steps);
    double step_rss = 0, alloc_peak = 0, hwm_before_last = 0;
    for (int it = 0; it < warmup + steps; it++) {
        bool last = it == warmup + steps - 1;
        double rss_before = 0;
        if (last) {
            hwm_before_last = proc_mb("VmHWM:");
            ts_alloc_empty_cache();
            malloc_trim(0);
            reset_hwm();
            rss_before = proc_mb("VmRSS:");
            ts_alloc_reset_peak();
        }
        double t0 = bench_clock_ms();
        ts_model_zero_grad(m);
        ts_tensor *logits = ts_model_forward(m, x);
        ts_tensor *flat = logits ? ts_reshape(logits, 2, (int64_t[]){-1, classes}) : NULL;
        ts_tensor *loss = flat ? ts_cross_entropy(flat, y, -100, TS_REDUCTION_MEAN) : NULL;
        ts_tensor_release(flat);
        ts_tensor_release(logits);
        ts_status st = loss ? ts_backward(loss, NULL) : ts_last_status();
        ts_tensor_release(loss);
        if (!st) st = ts_model_fold_compute_grads(m, 1); /* bf16 gradients into the f32 master's */
        if (!st)
            st = ts_optim_step_flat(&cfg, it + 1, 1e-3, &groups, ts_f32(m->flat_params), ts_f32(m->flat_grads),
                                    m->state, m->numel, 0, m->numel);
        if (!st) st = ts_model_sync_compute(m);
        if (st) {
            fprintf(stderr, "model_step: %s\n", ts_last_error());
            return 1;
        }
        double t1 = bench_clock_ms();
        if (it >= warmup) times[it - warmup] = t1 - t0;
        if (last) {
            step_rss = proc_mb("VmHWM:") - rss_before;
            alloc_peak = (double)ts_alloc_get_stats().peak / (1 << 20);
        }
    }
    r->ms = bench_upper_median(times, (size_t)steps);
    double hwm = proc_mb("VmHWM:");
    r->rss_mb = (hwm > hwm_before_last ? hwm : hwm_before_last) - rss0;
    r->step_rss_mb = step_rss;
    r->alloc_mb = alloc_peak;
    free(times);
    ts_tensor_release(x);
    ts_tensor_release(y);
    ts_optim_groups_free(&groups);
    ts_model_free(m);
    return 0;
}

/* Parses a child's "RESULT ms=.. rss_mb=.. step_rss_mb=.. [alloc_mb=..]" line. */
static int parse_result(const char *line, void *out) {
    result *r = out;
    return sscanf(line, "RESULT ms=%lf rss_mb=%lf step_rss_mb=%lf alloc_mb=%lf", &r->ms, &r->rss_mb, &r->step_rss_mb,
                  &r->alloc_mb) >= 3;
}

/* Runs cmd and reads its result line into r (alloc_mb -1 when the child
 * does not report it); nonzero on failure. */
static int run_child(const char *cmd, result *r) {
    r->alloc_mb = -1;
    return bench_run_child("model_step", cmd, parse_result, r);
}

/* Runs model in a fresh Tessera process at threads threads under CPU
 * capability cap. */
static int run_tessera(const char *model, const char *cap, int threads, int steps, int warmup, result *r) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "OMP_WAIT_POLICY=passive OPENBLAS_THREAD_TIMEOUT=4 TESSERA_CPU_CAPABILITY=%s TESSERA_NUM_THREADS=%d "
             "/proc/%d/exe --steps %d --warmup %d --one %s %d",
             cap, threads, (int)getpid(), steps, warmup, model, threads);
    return run_child(cmd, r);
}

/* The GPT step's matrix-product work in flops: every Linear weight (the
 * blocks' qkv, proj, fc, fc proj and the head) 6 flops per weight per
 * token (forward, input and weight gradients), and attention's four
 * products forward and eight backward, 12 L H D T^2 B, counted whole as
 * the usual MFU formula does (the causal kernels skip about half). */
static double gpt_matmul_flops(void) {
    const double L = 4, C = 256, H = 4, T = 128, B = 8, V = 256;
    double linear = L * 12 * C * C + C * V;
    return 6 * linear * B * T + 12 * L * H * (C / H) * T * T * B;
}

int main(int argc, char **argv) {
    int steps = 7, warmup = 2;
    const char *caps = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--one") && i + 2 < argc) {
            result r;
            if (!strncmp(argv[i + 1], "gpt", 3) || !strncmp(argv[i + 1], "cnn", 3)) {
                /* --steps / --warmup come before --one */
                if (run_one(argv[i + 1], atoi(argv[i + 2]), warmup, steps, &r)) return 1;
                printf("RESULT ms=%.3f rss_mb=%.1f step_rss_mb=%.1f alloc_mb=%.1f\n", r.ms, r.rss_mb, r.step_rss_mb,
                       r.alloc_mb);
                return 0;
            }
        } else if (!strcmp(argv[i], "--steps") && i + 1 < argc) {
            steps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) {
            warmup = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--capabilities") && i + 1 < argc) {
            caps = argv[++i];
        } else if (!strcmp(argv[i], "--cpu-time")) {
            setenv("BENCH_CLOCK", "cpu", 1);
        } else if (!strcmp(argv[i], "--torch-native")) {
            setenv("BENCH_TORCH_NATIVE", "1", 1);
        } else {
            fprintf(stderr, "usage: %s [--steps N] [--warmup N] [--capabilities default,avx2,avx512] [--cpu-time] [--torch-native]\n",
                    argv[0]);
            return 2;
        }
    }
    if (steps < 1 || warmup < 1) {
        fprintf(stderr, "model_step: --steps and --warmup must be >= 1\n");
        return 2;
    }
    /* the capabilities to run: those asked for (refused ones say why), else every one this CPU offers */
    const char *run_caps[TS_NCPU_CAPS];
    int ncaps = 0;
    for (int c = 0; c < TS_NCPU_CAPS; c++) {
        const char *name = ts_cpu_capability_name((ts_cpu_capability)c);
        if (caps ? !strstr(caps, name) : !ts_cpu_capability_supported((ts_cpu_capability)c)) continue;
        ts_cpu_capability parsed;
        if (ts_cpu_capability_parse(name, &parsed)) printf("%s: skipped: %s\n", name, ts_last_error());
        else run_caps[ncaps++] = name;
    }
    char cpu[128];
    bench_cpu_model(cpu, sizeof cpu);
    double peak[2] = {fma_peak_gflops(1), fma_peak_gflops(2)};
    printf("CPU: %s; FMA peak (%s, a loop of independent FMAs): %.1f GFLOP/s at 1 thread, %.1f at 2\n", cpu,
           fma_peak_isa(), peak[0], peak[1]);
    printf("one training step (forward, cross-entropy, backward, AdamW), median of %d after %d warm-up\n", steps,
           warmup);
    printf("GPT: L=4 C=256 H=4 T=128 B=8 V=256 (%.2f GFLOP of matrix products a step); CNN: B=64 1x28x28 16/32 ch k5.\n"
           "ratio = Tessera / PyTorch; caps = TESSERA_CPU_CAPABILITY of the Tessera run, and %s;\n"
           "GFLOP/s = the GPT's matrix products over the whole step time, and that as a share of the FMA peak at\n"
           "the same thread count\n",
           gpt_matmul_flops() / 1e9,
           getenv("BENCH_TORCH_NATIVE") ? "PyTorch at its best ISA in every row (--torch-native)"
                                        : "the ISA PyTorch's own kernels were held to (ATEN_CPU_CAPABILITY, "
                                          "ONEDNN_MAX_CPU_ISA)");
    printf("%-4s %-7s %3s | %10s %10s %6s | %9s %9s %6s | %9s %9s %6s | %9s | %7s %6s\n", "", "caps", "thr",
           "tessera ms", "torch ms", "ratio", "ts rssMB", "pt rssMB", "ratio", "ts stepMB", "pt stepMB", "ratio",
           "ts allocMB", "GFLOP/s", "%peak");
    const char *models[] = {"gpt", "cnn"};
    result f32[2][2][TS_NCPU_CAPS];
    for (int mi = 0; mi < 2; mi++)
        for (int threads = 1; threads <= 2; threads++)
            for (int ci = 0; ci < ncaps; ci++) {
                char cmd[1024], isa[128];
                result pt, *ts = &f32[mi][threads - 1][ci];
                bench_torch_isa_env(run_caps[ci], isa, sizeof isa);
                snprintf(cmd, sizeof cmd,
                         "OMP_WAIT_POLICY=passive OPENBLAS_THREAD_TIMEOUT=4 %s /usr/bin/python3 "
                         "%s/bench/model_step_torch.py %s %d %d %d",
                         isa, TESSERA_SOURCE_DIR, models[mi], threads, warmup, steps);
                if (run_child(cmd, &pt) || run_tessera(models[mi], run_caps[ci], threads, steps, warmup, ts)) return 1;
                printf("%-4s %-7s %3d | %10.2f %10.2f %6.2f | %9.1f %9.1f %6.2f | %9.1f %9.1f %6.2f | %9.1f", models[mi],
                       run_caps[ci], threads, ts->ms, pt.ms, ts->ms / pt.ms, ts->rss_mb, pt.rss_mb,
                       ts->rss_mb / pt.rss_mb, ts->step_rss_mb, pt.step_rss_mb, ts->step_rss_mb / pt.step_rss_mb,
                       ts->alloc_mb);
                if (mi == 0) {
                    double gflops = gpt_matmul_flops() / (ts->ms / 1e3) / 1e9;
                    printf(" | %7.1f %5.0f%%\n", gflops, 100 * gflops / peak[threads - 1]);
                } else {
                    printf(" | %7s %6s\n", "-", "-");
                }
                fflush(stdout);
            }
    printf("\nbf16 compute (f32 master weights and AdamW state, activations saved for backward in bf16) vs f32,\n"
           "Tessera in both columns; ratio = bf16 / f32\n");
    printf("%-4s %-7s %3s | %10s %10s %6s | %9s %9s %6s | %9s %9s %6s\n", "", "caps", "thr", "f32 ms", "bf16 ms",
           "ratio", "f32 stepMB", "bf16 stepMB", "ratio", "f32 alloc", "bf16 alloc", "ratio");
    for (int mi = 0; mi < 2; mi++)
        for (int threads = 1; threads <= 2; threads++)
            for (int ci = 0; ci < ncaps; ci++) {
                char name[16];
                result b, *f = &f32[mi][threads - 1][ci];
                snprintf(name, sizeof name, "%s-bf16", models[mi]);
                if (run_tessera(name, run_caps[ci], threads, steps, warmup, &b)) return 1;
                printf("%-4s %-7s %3d | %10.2f %10.2f %6.2f | %9.1f %9.1f %6.2f | %9.1f %9.1f %6.2f\n", models[mi],
                       run_caps[ci], threads, f->ms, b.ms, b.ms / f->ms, f->step_rss_mb, b.step_rss_mb,
                       b.step_rss_mb / f->step_rss_mb, f->alloc_mb, b.alloc_mb, b.alloc_mb / f->alloc_mb);
                fflush(stdout);
            }
    return 0;
}
