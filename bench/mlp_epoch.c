/* mlp_epoch.c - one Fashion-MNIST training epoch of the MLP job, Tessera vs
 * PyTorch (bench/mlp_epoch_torch.py under /usr/bin/python3), at 1 and 2
 * threads.
 *
 * Tessera runs the real training path: the job examples/mlp_fashion.json
 * (784-256-128-10, ReLU, AdamW, cosine schedule, batch 128, 10% validation
 * split, shuffled drop_last loader with its prefetch thread) goes through
 * ts_job_load + ts_trainer_create, and the epoch is the loop of
 * ts_trainer_step over ts_loader_batches_per_epoch() steps - exactly what
 * tessera-run does between its log lines. PyTorch reads the same IDX files
 * (gzip + numpy), normalises with the same mean/std, holds out the same
 * last 10%, shuffles each epoch, and runs the same model, loss and AdamW
 * (weight decay on matrices only), calling loss.item() each step as the
 * trainer does.
 *
 * Like tessera-run, the bench first makes idle OpenMP and OpenBLAS workers sleep
 * (OMP_WAIT_POLICY=passive and OPENBLAS_THREAD_TIMEOUT=4, see
 * ts_threads_passive); both children
 * inherit it, PyTorch included (it uses the same libgomp and OpenBLAS).
 *
 * Each (framework, threads) repetition is a fresh process started by this
 * one, Tessera and PyTorch alternating, so load from other processes hits
 * both alike. Per process: data loading is timed apart (not in the epoch),
 * a few warm-up steps run first, then one full epoch of steps is timed.
 * Figure: the median epoch over the repetitions. Ratio = Tessera / PyTorch.
 *
 * Usage: bench_mlp_epoch [--reps N] [--threads 1,2]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "kernels/threads.h"
#include "worker/trainer.h"

enum { WARMUP_STEPS = 5, MAX_REPS = 15 };

typedef struct {
    double epoch_ms, load_ms, loss;
    long steps;
} result;

/* One Tessera epoch of the MLP job in this process. */
static int run_one(int threads, result *r) {
    ts_threads_set(threads);
    char path[1024];
    snprintf(path, sizeof path, "%s/examples/mlp_fashion.json", TESSERA_SOURCE_DIR);
    ts_job job;
    double t0 = bench_now_ms();
    ts_trainer *t = ts_job_load(path, NULL, 0, &job) ? NULL : ts_trainer_create(&job, "{}", NULL, false, ts_strategy_local_new(NULL));
    if (!t) {
        fprintf(stderr, "mlp_epoch: %s\n", ts_last_error());
        return 1;
    }
    r->load_ms = bench_now_ms() - t0;
    int64_t steps = ts_loader_batches_per_epoch(t->loader);
    ts_step_stats s;
    double t1 = 0;
    for (int64_t i = 0; i < WARMUP_STEPS + steps; i++) {
        if (i == WARMUP_STEPS) t1 = bench_now_ms();
        if (ts_trainer_step(t, &s)) {
            fprintf(stderr, "mlp_epoch: %s\n", ts_last_error());
            ts_trainer_free(t);
            return 1;
        }
    }
    r->epoch_ms = bench_now_ms() - t1;
    r->loss = s.loss;
    r->steps = (long)steps;
    ts_trainer_free(t);
    return 0;
}

/* Parses a child's "RESULT epoch_ms=.. load_ms=.. steps=.. loss=.." line. */
static int parse_result(const char *line, void *out) {
    result *r = out;
    return sscanf(line, "RESULT epoch_ms=%lf load_ms=%lf steps=%ld loss=%lf", &r->epoch_ms, &r->load_ms, &r->steps,
                  &r->loss) == 4;
}

/* Runs cmd and reads its result line into r; nonzero on failure. */
static int run_child(const char *cmd, result *r) { return bench_run_child("mlp_epoch", cmd, parse_result, r); }

int main(int argc, char **argv) {
    ts_threads_passive(argv); /* as tessera-run does; inherited by both children */
    int reps = 3, threads[8] = {1, 2}, n_threads = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--one") && i + 1 < argc) {
            result r;
            if (run_one(atoi(argv[i + 1]), &r)) return 1;
            printf("RESULT epoch_ms=%.3f load_ms=%.3f steps=%ld loss=%.4f\n", r.epoch_ms, r.load_ms, r.steps, r.loss);
            return 0;
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            n_threads = 0;
            for (char *tok = strtok(argv[++i], ","); tok && n_threads < 8; tok = strtok(NULL, ","))
                threads[n_threads++] = atoi(tok);
        } else {
            fprintf(stderr, "usage: %s [--reps N] [--threads 1,2]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1 || reps > MAX_REPS || n_threads < 1) {
        fprintf(stderr, "mlp_epoch: --reps must be in [1, %d] and --threads non-empty\n", MAX_REPS);
        return 2;
    }
    for (int k = 0; k < n_threads; k++)
        if (threads[k] < 1) {
            fprintf(stderr, "mlp_epoch: thread counts must be >= 1\n");
            return 2;
        }
    printf("one Fashion-MNIST epoch of examples/mlp_fashion.json (784-256-128-10 ReLU, AdamW, batch 128),\n"
           "median of %d fresh processes per side, interleaved; ratio = Tessera / PyTorch\n",
           reps);
    printf("%3s | %6s | %11s %11s %6s | %9s %9s | %8s %8s\n", "thr", "steps", "tessera ms", "torch ms", "ratio",
           "ts load", "pt load", "ts loss", "pt loss");
    for (int k = 0; k < n_threads; k++) {
        double ts_ms[MAX_REPS], pt_ms[MAX_REPS], ts_load[MAX_REPS], pt_load[MAX_REPS];
        result ts, pt;
        for (int rep = 0; rep < reps; rep++) {
            char cmd[1024];
            snprintf(cmd, sizeof cmd, "TESSERA_NUM_THREADS=%d /proc/%d/exe --one %d", threads[k], (int)getpid(),
                     threads[k]);
            if (run_child(cmd, &ts)) return 1;
            snprintf(cmd, sizeof cmd, "OPENBLAS_NUM_THREADS=%d OMP_NUM_THREADS=%d /usr/bin/python3 %s/bench/mlp_epoch_torch.py %d %d",
                     threads[k], threads[k], TESSERA_SOURCE_DIR, threads[k], WARMUP_STEPS);
            if (run_child(cmd, &pt)) return 1;
            ts_ms[rep] = ts.epoch_ms;
            pt_ms[rep] = pt.epoch_ms;
            ts_load[rep] = ts.load_ms;
            pt_load[rep] = pt.load_ms;
        }
        double a = bench_upper_median(ts_ms, (size_t)reps), b = bench_upper_median(pt_ms, (size_t)reps);
        printf("%3d | %6ld | %11.1f %11.1f %6.3f | %9.1f %9.1f | %8.4f %8.4f\n", threads[k], ts.steps, a, b, a / b,
               bench_upper_median(ts_load, (size_t)reps), bench_upper_median(pt_load, (size_t)reps), ts.loss, pt.loss);
        fflush(stdout);
    }
    return 0;
}
