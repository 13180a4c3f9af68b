/* trainer.h - the training loop of one process (strategy "local").
 *
 * A trainer owns what a job needs to train: the data sets and loader, the
 * model with its flat buffers, the optimizer config, groups and schedule,
 * and the run folder (metrics.jsonl, checkpoints/). Every step is
 * deterministic given the job: batches come from the seeded loader,
 * dropout keys are folded from the seed and the step, so a run resumed from
 * a checkpoint produces the same losses as one that never stopped.
 *
 * The distributed strategies reuse the pieces: ts_trainer_grads() computes
 * one step's gradients into the model's flat gradient buffer,
 * ts_trainer_apply() runs the optimizer kernel on it.
 */
#ifndef TS_WORKER_TRAINER_H
#define TS_WORKER_TRAINER_H

#include <signal.h>
#include <stdbool.h>

#include "kernels/data/loader.h"
#include "kernels/nn/models.h"
#include "kernels/optim/optim.h"
#include "kernels/optim/schedule.h"
#include "proto/job.h"

typedef struct {
    int64_t step;          /* optimizer steps taken after this one */
    double loss;           /* mean over the step's micro-batches */
    double lr;
    double grad_norm;      /* before clipping */
    double step_ms;
    double samples_per_s;
    double tokens_per_s;   /* GPT only, else 0 */
    size_t mem_bytes;      /* allocator bytes in use */
    size_t peak_bytes;
} ts_step_stats;

typedef struct {
    double loss;           /* mean per sample (per token for GPT) */
    double accuracy;       /* classification; -1 for GPT */
    double bits_per_byte;  /* GPT; -1 otherwise */
    int64_t samples;       /* images or sequences */
    int64_t predictions;   /* targets scored: samples, or tokens for GPT */
} ts_eval_stats;

typedef struct ts_trainer {
    ts_job job;
    char *job_text;        /* the job as JSON, saved with checkpoints */
    char run_dir[1024];
    ts_model_spec spec;
    ts_model *model;
    ts_dataset *train_set, *val_set, *test_set;
    void *corpus;          /* text corpus the text data sets read */
    ts_tensor *data[6];    /* tensors the image data sets keep */
    ts_loader *loader;
    ts_optim_config optim;
    ts_optim_groups groups;
    ts_schedule schedule;
    int64_t step, total_steps;
    FILE *metrics;
} ts_trainer;

/* Builds everything for job (job_text: its JSON) in run_dir, resuming from
 * the newest checkpoint in run_dir/checkpoints when resume is set and one
 * exists. run_dir NULL: no run folder (evaluation, generation). */
ts_trainer *ts_trainer_create(const ts_job *job, const char *job_text, const char *run_dir, bool resume);

void ts_trainer_free(ts_trainer *t);

/* One micro-batch forward + backward: adds this batch's gradient, scaled by
 * scale, into the model's gradient buffer and returns its mean loss. */
ts_status ts_trainer_micro(ts_trainer *t, const ts_batch *b, double scale, double *loss);

/* The gradients of one optimizer step (accum_steps micro-batches from the
 * loader) into the zeroed gradient buffer; mean loss in *loss. */
ts_status ts_trainer_grads(ts_trainer *t, double *loss, int64_t *samples);

/* Clips and applies the optimizer to the whole model; advances t->step. */
ts_status ts_trainer_apply(ts_trainer *t, double *lr, double *grad_norm);

/* ts_trainer_grads + ts_trainer_apply, timed. */
ts_status ts_trainer_step(ts_trainer *t, ts_step_stats *s);

/* Loss and accuracy (or bits per byte) on the validation set, or the test
 * set, in eval mode and without gradients; max_batches 0 = all. */
ts_status ts_trainer_eval(ts_trainer *t, bool test, int64_t max_batches, ts_eval_stats *e);

/* Loads model weights, optimizer state, step and loader position from the
 * checkpoint folder dir (validated; names and shapes must match). */
ts_status ts_trainer_load(ts_trainer *t, const char *dir);

/* Saves a checkpoint of the current step; its folder goes to path. */
ts_status ts_trainer_save(ts_trainer *t, char *path, size_t cap);

/* The whole loop: steps with a log line each, evals, checkpoints, a final
 * checkpoint and test evaluation. Stops early, after saving a checkpoint,
 * when *stop becomes non-zero (SIGINT). */
ts_status ts_trainer_run(ts_trainer *t, volatile sig_atomic_t *stop);

/* Builds the model spec a job describes. */
ts_status ts_trainer_spec(const ts_job *job, ts_model_spec *spec);

#endif
