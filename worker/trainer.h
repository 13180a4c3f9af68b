/* trainer.h - the training loop of one process, whatever the strategy.
 *
 * A trainer owns what a job needs to train: the data sets and loader, the
 * model (the units its strategy builds) with its flat buffers, the
 * optimizer config, groups and schedule, the strategy, and the run folder
 * (metrics.jsonl, checkpoints/). It runs the loop, evaluation, checkpoints
 * and metrics, and calls the strategy (strategy.h) where parallel training
 * differs. Every step is deterministic given the job: batches come from the
 * seeded loader sharded by the strategy's (rank, world), dropout keys are
 * folded from the seed and the step, so a run resumed from a checkpoint
 * produces the same losses as one that never stopped.
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
#include "worker/strategy.h"

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
    size_t rss_peak_bytes; /* resident set's peak during the step */
    ts_comm_times comm;    /* the strategy's communication; the rest of step_ms computes */
    bool taken;            /* an optimizer step was applied (false: the job ended first) */
    bool adopted;          /* taken by ranks that left: only step, loss, lr and grad_norm are known */
} ts_step_stats;

typedef struct {
    double loss;           /* mean per sample (per token for GPT) */
    double accuracy;       /* classification; -1 for GPT */
    double bits_per_byte;  /* GPT; -1 otherwise */
    int64_t samples;       /* images or sequences */
    int64_t predictions;   /* targets scored: samples, or tokens for GPT */
} ts_eval_stats;

/* How many of its latest steps a rank keeps for a new leader to log. */
#define TS_TRAINER_RECENT 64

/* The context of one parameter's gradient hook. */
typedef struct {
    struct ts_trainer *trainer;
    int index;
} ts_param_hook;

struct ts_trainer {
    ts_job job;
    char *job_text;        /* the job as JSON, saved with checkpoints */
    char run_dir[1024];
    bool no_checkpoint;    /* asked to continue from the run folder's newest checkpoint, which has none */
    ts_model_spec spec;
    ts_model *model;
    bool part;             /* the model holds some of the units only (a pipeline stage) */
    ts_dataset *train_set, *val_set, *test_set; /* val_set NULL with data.val_fraction 0 */
    void *corpus;          /* text corpus the text data sets read */
    ts_tensor *data[6];    /* tensors the image data sets keep */
    ts_loader *loader;
    ts_optim_slice whole;  /* the model's whole flat buffers as one slice */
    ts_optim_config optim;
    ts_optim_groups groups;
    ts_schedule schedule;
    int64_t step, total_steps;
    FILE *metrics;         /* the leader's metrics.jsonl, else NULL */
    int64_t logged_step;   /* the leader's last step logged (or passed over by log_every) */
    ts_step_stats last_taken; /* the last step this rank took or adopted from a peer (step 0: none) */
    ts_step_stats recent[TS_TRAINER_RECENT]; /* the steps it took or adopted lately, at step % TS_TRAINER_RECENT */
    int64_t recent_seq[TS_TRAINER_RECENT];   /* ... each one's place in the order they were kept */
    int64_t kept;          /* steps kept in recent so far */
    ts_strategy *strategy; /* owned */
    ts_group shard;        /* the (rank, world) the loader is sharded by */
    bool last_micro;       /* backward of the step's last micro-batch runs */
    bool *ready;           /* per parameter: announced final this step */
    ts_param_hook *hooks;  /* the parameters' gradient hooks */
};

/* Builds everything for job (job_text: its JSON) in run_dir with strategy
 * s (owned from now on, also on failure): the units s builds, the loader
 * sharded by s's group; resumes from the newest checkpoint in
 * run_dir/checkpoints when resume is set and one exists. run_dir NULL: no
 * run folder (evaluation, generation). The strategy is attached by
 * ts_trainer_attach, once the process is ready to meet its peers. */
ts_trainer *ts_trainer_create(const ts_job *job, const char *job_text, const char *run_dir, bool resume,
                              ts_strategy *s);

/* Attaches the strategy (in a job, after joining it: communicators, the
 * peers' state) and opens the leader's metrics file. Before ts_trainer_run. */
ts_status ts_trainer_attach(ts_trainer *t);

void ts_trainer_free(ts_trainer *t);

/* The optimizer steps job takes: job->steps, or with train.epochs that
 * many epochs of the training set sharded as its strategy shards it at
 * the start (ts_strategy_data_world; the data set is loaded to count
 * them). */
ts_status ts_trainer_steps(const ts_job *job, int64_t *steps);

/* One micro-batch forward + backward: adds this batch's gradient, scaled by
 * scale, into the model's gradient buffer and returns its mean loss. */
ts_status ts_trainer_micro(ts_trainer *t, const ts_batch *b, double scale, double *loss);

/* The gradients of one optimizer step (accum_steps micro-batches from the
 * loader) into the zeroed gradient buffer; mean loss in *loss. During the
 * last micro-batch's backward it tells the strategy (grads_ready) which
 * parameter's gradients are final, as soon as they are (with bf16 compute
 * once folded into the f32 master gradients); whatever was not announced
 * then (unused parameters) right after. */
ts_status ts_trainer_grads(ts_trainer *t, double *loss, int64_t *samples);

/* The two ends of ts_trainer_grads, for a strategy that runs its own
 * micro-batches (a pipeline stage): begin zeros the gradients and forgets
 * which parameters were announced; a backward that runs with
 * t->last_micro set announces each parameter as its gradient becomes
 * final; end announces the ones that were not. */
void ts_trainer_grads_begin(ts_trainer *t);
ts_status ts_trainer_grads_end(ts_trainer *t);

/* Sets the key the model's dropout masks are drawn from for micro-batch
 * micro of the coming step on this process's data-parallel rank: one of
 * its own for each (step, micro-batch, rank), so that no two micro-batches
 * or ranks share masks, and the same in every run of the job's seed (and
 * after a resume). Before the micro-batch's forward, and again before its
 * backward where other forwards ran in between (a recomputed block draws
 * the masks of its forward). */
void ts_trainer_dropout_key(ts_trainer *t, int micro);

/* Clips the strategy's slices by the job's global gradient norm (reduced by
 * the strategy), steps the optimizer on them and advances t->step. */
ts_status ts_trainer_apply(ts_trainer *t, double *lr, double *grad_norm);

/* Re-shards the loader, at the same position of the epoch, to the
 * strategy's group when its (rank, world) changed since the last call. */
ts_status ts_trainer_follow_group(ts_trainer *t);

/* One step through the strategy (begin_step, grads, apply, end_step), timed. */
ts_status ts_trainer_step(ts_trainer *t, ts_step_stats *s);

/* Logs step s (stdout and metrics.jsonl) where this rank leads the group,
 * every train.log_every steps and the last. A worker that became the
 * leader since the metrics were opened (the old one left) takes them over,
 * cut after the step before s (the old leader may have logged s); so does a
 * leader whose job went back (a checkpoint reloaded, steps replayed): the
 * lines of the steps taken again go, as on --resume. Every rank keeps s
 * (last_taken, recent): a leader that finds the lines of the steps before
 * s missing (the old leader left before logging them: inside a step the
 * group took, or, async, while this rank went on) logs first those of them
 * it took or adopted one after the other up to s, as it kept them. A rank that is not the leader closes the metrics it held, so
 * that it takes them over afresh should the lead come back to it. */
ts_status ts_trainer_log_step(ts_trainer *t, const ts_step_stats *s);

/* A strategy that adopted a peer's state of step `step` ahead of this
 * rank's, with what was logged of it, keeps that as the last step taken
 * (adopted), for ts_trainer_log_step to log should its leader have left
 * first. Call before the trainer's step moves to it. */
void ts_trainer_adopt_step(ts_trainer *t, int64_t step, double loss, double lr, double grad_norm);

/* Loss and accuracy (or bits per byte) on the validation set, or the test
 * set, in eval mode and without gradients, scored in batches of
 * train.batch_size that the group's ranks take in turn; at most
 * max_batches for each rank (those of one process at the group's whole
 * batch, W * train.batch_size), 0 = all. */
ts_status ts_trainer_eval(ts_trainer *t, bool test, int64_t max_batches, ts_eval_stats *e);

/* Loads what the strategy holds (for "local": model weights, optimizer
 * state, step and loader position) from the checkpoint folder dir
 * (validated; names and shapes must match). */
ts_status ts_trainer_load(ts_trainer *t, const char *dir);

/* Saves a checkpoint of the current step through the strategy; its folder
 * goes to path. */
ts_status ts_trainer_save(ts_trainer *t, char *path, size_t cap);

/* The whole loop: steps with a log line each, evals, checkpoints, a final
 * checkpoint and test evaluation (logs and metrics from the group's leader
 * only). Stops early, after saving a checkpoint, when *stop becomes
 * non-zero (SIGINT), with an error; or when the group agreed to stop the
 * job (the strategy's stop_agreed), returning TS_OK without the final
 * evaluation. A rank that takes the lead from a leader that left before
 * writing the run's end writes it: in the final evaluations (a regroup)
 * the last step's line and the checkpoint; after them (the strategy's
 * finish) also the evaluations, scored alone. */
ts_status ts_trainer_run(ts_trainer *t, volatile sig_atomic_t *stop);

#endif
