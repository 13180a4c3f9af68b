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
#include "proto/job_model.h"
#include "kernels/nn/generate.h"
#include "worker/model_open.h"
#include "worker/node.h"
#include "worker/trainer.h"

int ts_launch_train(const ts_job *job, const char *run_dir, bool resume, bool force) {
    char dir[TS_JOB_PATH_MAX + 16];
    ts_worker_run_dir(job, run_dir, dir, sizeof dir);
    ts_worker_options o = {.job = job, .rank = -1, .run_dir = dir, .resume = resume, .force = force,
                           .prog = "tessera-run"};
    int code = ts_worker_run(&o);
    if (code == 0) {
        char png[1200];
        if (ts_launch_plot(dir, png, sizeof png) == 0) printf("chart: %s\n", png);
        printf("run folder: %s\n", dir);
    }
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
        ts_job_forget_init(&job); /* the checkpoint's weights replace the first ones */
        ts_strategy *s = ts_strategy_local_new(NULL);
        if (s) s->no_optim_state = ts_strategy_no_optim_state(ck); /* nor does its trainer, nor a consolidated copy */
        t = ts_trainer_create(&job, ck->config, NULL, false, s);
    }
    ts_checkpoint_close(ck);
    if (t && ts_trainer_load(t, ckpt)) {
        ts_trainer_free(t);
        t = NULL;
    }
    return t;
}

/* A trainer for src: a checkpoint folder, or a weights file the job's model
 * starts from (model.init_from). */
static ts_trainer *trainer_from(const ts_launch_source *src) {
    ts_job job;
    bool ck;
    if (ts_job_for_weights(src->path, src->job_path, src->sets, src->nsets, &job, &ck)) return NULL;
    if (ck) return trainer_from_checkpoint(src->path);
    job.data.prefetch = 0;
    json_t *doc = ts_job_to_json(&job);
    char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    ts_trainer *t = text ? ts_trainer_create(&job, text, NULL, false, ts_strategy_local_new(NULL)) : NULL;
    if (!text) ts_error(TS_ERR_MEMORY, "%s: out of memory", src->job_path);
    free(text);
    return t;
}

int ts_launch_eval(const ts_launch_source *src) {
    const char *ckpt = src->path;
    ts_trainer *t = trainer_from(src);
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

int ts_launch_consolidate(const char *ckpt, const char *out) {
    ts_trainer *t = trainer_from_checkpoint(ckpt);
    char path[1200] = "";
    if (!t || ts_strategy_save_whole_in(t->strategy, out, 0, path, sizeof path)) {
        fprintf(stderr, "tessera-run --consolidate: %s\n", ts_last_error());
        ts_trainer_free(t);
        return 1;
    }
    printf("%s: step %lld, %lld parameters in one checkpoint: %s\n", ckpt, (long long)t->step,
           (long long)t->model->numel, path);
    ts_trainer_free(t);
    return 0;
}

int ts_launch_generate(const ts_launch_source *src, const char *prompt, int n, double temperature, int top_k,
                       uint64_t seed) {
    ts_job job;
    ts_model_spec spec;
    ts_model *m = ts_worker_open_model(src->path, src->job_path, src->sets, src->nsets, &job, &spec);
    if (m && spec.arch != TS_ARCH_GPT) {
        ts_error(TS_ERR_VALUE, "%s: --generate needs a GPT, this is %s", src->path,
                 spec.arch == TS_ARCH_MLP ? "an MLP" : "a CNN");
        ts_model_free(m);
        m = NULL;
    }
    size_t cap = strlen(prompt) + (size_t)n + 1;
    char *out = m ? malloc(cap) : NULL;
    if (!m || !out ||
        ts_generate(m, spec.gpt.block_size, prompt, n, temperature, top_k, ts_key_from_seed(seed), out, cap)) {
        fprintf(stderr, "tessera-run --generate: %s\n", m && !out ? "out of memory" : ts_last_error());
        free(out);
        ts_model_free(m);
        return 1;
    }
    printf("%s\n", out);
    free(out);
    ts_model_free(m);
    return 0;
}
