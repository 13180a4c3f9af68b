/* train.c - local training, checkpoint evaluation and text generation. */
#include "launch/train.h"

#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/io/checkpoint.h"
#include "worker/generate.h"
#include "worker/trainer.h"

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig) {
    (void)sig;
    stop_requested = 1;
}

void ts_launch_passive_threads(char **argv) {
    bool omp = !getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT"), blas = !getenv("OPENBLAS_THREAD_TIMEOUT");
    if (!omp && !blas) return;
    if (omp && setenv("OMP_WAIT_POLICY", "passive", 1)) return;
    if (blas && setenv("OPENBLAS_THREAD_TIMEOUT", "4", 1)) return;
    execv("/proc/self/exe", argv);
    /* exec failed: carry on with the libraries' default policies */
}

/* The job as complete JSON text (malloc'd), saved with every checkpoint. */
static char *job_text(const ts_job *job) {
    json_t *j = ts_job_to_json(job);
    char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    json_decref(j);
    return text;
}

int ts_launch_train(const ts_job *job, const char *run_dir, bool resume) {
    char dir[1024];
    if (run_dir) snprintf(dir, sizeof dir, "%s", run_dir);
    else if (job->train.run_dir[0]) snprintf(dir, sizeof dir, "%s", job->train.run_dir);
    else {
        mkdir("runs", 0755);
        snprintf(dir, sizeof dir, "runs/%s", job->name);
    }
    char *text = job_text(job);
    ts_trainer *t = ts_trainer_create(job, text, dir, resume);
    free(text);
    if (!t) {
        fprintf(stderr, "tessera-run: %s\n", ts_last_error());
        return 1;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    ts_status st = ts_trainer_run(t, &stop_requested);
    int code = 0;
    if (st) {
        fprintf(stderr, "tessera-run: %s\n", ts_last_error());
        code = stop_requested ? 130 : 1;
    } else {
        char png[1200];
        if (ts_launch_plot(dir, png, sizeof png) == 0) printf("chart: %s\n", png);
        printf("run folder: %s\n", dir);
    }
    ts_trainer_free(t);
    return code;
}

/* A trainer for the job saved in checkpoint ckpt, with its weights. */
static ts_trainer *trainer_from_checkpoint(const char *ckpt) {
    ts_checkpoint *ck = ts_checkpoint_open(ckpt);
    if (!ck) return NULL;
    if (!ck->config) {
        ts_error(TS_ERR_FORMAT, "%s: the checkpoint holds no job config", ckpt);
        ts_checkpoint_close(ck);
        return NULL;
    }
    ts_job job;
    ts_status st = ts_job_parse(ck->config, NULL, 0, &job);
    ts_trainer *t = NULL;
    if (!st) {
        job.data.prefetch = 0;
        t = ts_trainer_create(&job, ck->config, NULL, false);
    }
    ts_checkpoint_close(ck);
    if (t && ts_trainer_load(t, ckpt)) {
        ts_trainer_free(t);
        t = NULL;
    }
    return t;
}

int ts_launch_eval(const char *ckpt) {
    ts_trainer *t = trainer_from_checkpoint(ckpt);
    ts_eval_stats e;
    if (!t || ts_trainer_eval(t, true, 0, &e)) {
        fprintf(stderr, "tessera-run --eval: %s\n", ts_last_error());
        ts_trainer_free(t);
        return 1;
    }
    const char *split = t->test_set ? "test" : "validation";
    if (e.accuracy >= 0)
        printf("%s: step %lld, %s loss %.4f, accuracy %.2f%% (%lld samples)\n", ckpt, (long long)t->step, split,
               e.loss, 100 * e.accuracy, (long long)e.samples);
    else
        printf("%s: step %lld, %s loss %.4f, %.3f bits/byte (%lld sequences, %lld tokens)\n", ckpt,
               (long long)t->step, split, e.loss, e.bits_per_byte, (long long)e.samples, (long long)e.predictions);
    ts_trainer_free(t);
    return 0;
}

int ts_launch_generate(const char *ckpt, const char *prompt, int n, double temperature, int top_k, uint64_t seed) {
    ts_trainer *t = trainer_from_checkpoint(ckpt);
    if (t && t->spec.arch != TS_ARCH_GPT) {
        ts_error(TS_ERR_VALUE, "%s: --generate needs a GPT checkpoint", ckpt);
        ts_trainer_free(t);
        t = NULL;
    }
    size_t cap = strlen(prompt) + (size_t)n + 1;
    char *out = t ? malloc(cap) : NULL;
    if (!t || !out ||
        ts_generate(t->model, t->spec.gpt.block_size, prompt, n, temperature, top_k, ts_key_from_seed(seed), out,
                    cap)) {
        fprintf(stderr, "tessera-run --generate: %s\n", ts_last_error());
        free(out);
        ts_trainer_free(t);
        return 1;
    }
    printf("%s\n", out);
    free(out);
    ts_trainer_free(t);
    return 0;
}
