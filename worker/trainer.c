/* trainer.c - data, model, optimizer and the loop of a local training run. */
#include "worker/trainer.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kernels/alloc.h"
#include "kernels/clock.h"
#include "kernels/autograd.h"
#include "kernels/data/idx.h"
#include "kernels/data/text.h"
#include "kernels/io/atomic.h"
#include "kernels/io/checkpoint.h"
#include "kernels/ops/elementwise.h"
#include "kernels/ops/loss.h"
#include "kernels/ops/view.h"
#include "kernels/optim/clip.h"
#include "proto/job_model.h"
#if TESSERA_WITH_CUDA
#include "kernels/ops/cuda/runtime.h"
#endif
#include "worker/metrics.h"

/* ---- data ---- */

static ts_status load_images(ts_trainer *t) {
    const char *dir = t->job.data.path[0] ? t->job.data.path : NULL;
    ts_tensor *x, *y, *tx, *ty;
    ts_status st = ts_idx_load_fashion_mnist(dir, true, &x, &y);
    if (st) return st;
    st = ts_idx_split(x, y, -1, t->job.data.val_fraction, &t->data[0], &t->data[1], &t->data[2], &t->data[3]);
    ts_tensor_release(x);
    ts_tensor_release(y);
    if (st) return st;
    if ((st = ts_idx_load_fashion_mnist(dir, false, &tx, &ty))) return st;
    t->data[4] = tx;
    t->data[5] = ty;
    t->train_set = ts_dataset_tensors("fashion-mnist train", t->data[0], t->data[1]);
    if (t->data[2]->shape[0] > 0) t->val_set = ts_dataset_tensors("fashion-mnist validation", t->data[2], t->data[3]);
    t->test_set = ts_dataset_tensors("fashion-mnist test", t->data[4], t->data[5]);
    return t->train_set && (t->val_set || !t->data[2]->shape[0]) && t->test_set ? TS_OK : ts_last_status();
}

static ts_status load_text(ts_trainer *t) {
    ts_text_corpus *c = ts_text_load(t->job.data.path[0] ? t->job.data.path : NULL, t->job.data.val_fraction);
    if (!c) return ts_last_status();
    t->corpus = c;
    int64_t T = t->job.model.block_size;
    t->train_set = ts_text_dataset(c, false, T, T);
    if (t->job.data.val_fraction > 0) t->val_set = ts_text_dataset(c, true, T, T);
    return t->train_set && (t->val_set || t->job.data.val_fraction == 0) ? TS_OK : ts_last_status();
}

/* Prefixes the last data error with the job fields that shape the data. */
static ts_status data_error(const ts_job *job) {
    char block[64] = "";
    if (job->model.arch == TS_JOB_GPT) snprintf(block, sizeof block, ", model.block_size %d", job->model.block_size);
    return ts_error(ts_last_status(), "data.path %s, data.val_fraction %g, train.batch_size %lld%s: %s",
                    job->data.path[0] ? job->data.path : "(default)", job->data.val_fraction,
                    (long long)job->train.batch_size, block, ts_last_error());
}

/* Loads the job's data sets into t. */
static ts_status load_data(ts_trainer *t) {
    ts_status st = t->job.data.kind == TS_JOB_FASHION_MNIST ? load_images(t) : load_text(t);
    return st ? data_error(&t->job) : TS_OK;
}

/* The loader of t's training set for (rank, world) of group g. */
static ts_loader *make_loader(const ts_trainer *t, const ts_group *g) {
    const ts_job *job = &t->job;
    ts_loader_config lc = {.batch_size = job->train.batch_size,
                           .shuffle = job->data.shuffle,
                           .seed = (uint64_t)job->seed,
                           .drop_last = true,
                           .rank = g->rank,
                           .world = g->world,
                           .prefetch = job->data.prefetch};
    ts_loader *l = ts_loader_create(t->train_set, &lc);
    if (!l) data_error(job);
    return l;
}

/* The steps of the job's train.epochs over loader l (its batches per
 * epoch, at l's world, in steps of train.accum_steps batches); an epoch
 * too short for one step is an error naming the fields, not a job of no
 * set length. */
static ts_status epoch_steps(const ts_job *job, const ts_loader *l, int64_t *steps) {
    int64_t batches = ts_loader_batches_per_epoch(l);
    *steps = job->train.epochs * (batches / job->train.accum_steps);
    if (*steps > 0) return TS_OK;
    return ts_error(TS_ERR_VALUE, "train.epochs %lld: an epoch of %lld samples gives %lld batches of "
                    "train.batch_size %lld per worker, fewer than one step of train.accum_steps %d batches",
                    (long long)job->train.epochs, (long long)ts_loader_length(l), (long long)batches,
                    (long long)job->train.batch_size, job->train.accum_steps);
}

/* ---- setup ---- */

/* Optimizer config, schedule and weight-decay groups from the job; the
 * optimizer state unless the strategy keeps none. */
static ts_status setup_optimizer(ts_trainer *t) {
    ts_status st = ts_job_optim_config(&t->job, &t->optim);
    if (st) return st;
    const ts_job_schedule *s = &t->job.schedule;
    static const ts_schedule_kind skinds[] = {TS_SCHEDULE_CONSTANT, TS_SCHEDULE_STEP, TS_SCHEDULE_COSINE};
    t->schedule = (ts_schedule){skinds[s->kind], t->job.optimizer.lr, s->step_size, s->gamma, s->warmup_steps,
                                t->total_steps, s->min_lr};
    if ((st = ts_schedule_check(&t->schedule))) return st;
    st = ts_job_optim_groups(t->model, &t->groups);
    if (!st && !t->strategy->no_optim_state) st = ts_model_alloc_state(t->model, ts_optim_state_slots(&t->optim));
    return st;
}

ts_status ts_trainer_load(ts_trainer *t, const char *dir) { return t->strategy->ops->load(t->strategy, dir); }

/* A parameter's gradient hook: on the step's last micro-batch, tells the
 * strategy that the parameter's range of the flat gradients is final (a
 * data-parallel strategy starts sending it while backward goes on). With
 * bf16 compute it first folds the parameter's bf16 gradient into its f32
 * master one, with the scale ts_trainer_grads and the pipeline fold by. */
static ts_status param_ready(ts_tensor *leaf, void *ctx) {
    (void)leaf;
    const ts_param_hook *h = ctx;
    ts_trainer *t = h->trainer;
    if (!t->last_micro || t->ready[h->index]) return TS_OK;
    t->ready[h->index] = true;
    const ts_param *p = &t->model->params[h->index];
    ts_status st = ts_model_fold_param_grad(t->model, h->index, 1.0f);
    return st ? st : t->strategy->ops->grads_ready(t->strategy, p->offset, p->numel);
}

/* Hooks every parameter's gradient leaf (the bf16 one with bf16 compute:
 * set the compute dtype first). */
static ts_status hook_params(ts_trainer *t) {
    ts_model *m = t->model;
    t->ready = calloc((size_t)m->n_params + 1, sizeof *t->ready);
    t->hooks = calloc((size_t)m->n_params + 1, sizeof *t->hooks);
    if (!t->ready || !t->hooks) return ts_error(TS_ERR_MEMORY, "trainer: out of memory for %d hooks", m->n_params);
    for (int i = 0; i < m->n_params; i++) {
        t->hooks[i] = (ts_param_hook){t, i};
        ts_tensor *leaf = ts_model_grad_leaf(m, i);
        leaf->grad_hook = param_ready;
        leaf->grad_hook_ctx = &t->hooks[i];
    }
    return TS_OK;
}

/* The optimizer's slice over a model's whole flat buffers. */
static ts_optim_slice whole_slice(ts_model *m) {
    return (ts_optim_slice){.params = ts_f32(m->flat_params),
                            .grads = ts_f32(m->flat_grads),
                            .state = m->state,
                            .stride = m->numel,
                            .offset = 0,
                            .len = m->numel,
                            .device = m->device};
}

/* The device job puts this worker's model on: the CPU, or the GPU of the
 * worker's local rank (TESSERA_LOCAL_RANK, else Open MPI's
 * OMPI_COMM_WORLD_LOCAL_RANK, else its rank in group g) among the GPUs of
 * this machine. A build without CUDA gets cuda:0, which it refuses. */
static ts_device job_device(const ts_job *job, const ts_group *g) {
    if (job->device == TS_JOB_DEVICE_CPU) return TS_CPU;
    const char *env = getenv("TESSERA_LOCAL_RANK");
    if (!env) env = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    int local = env ? atoi(env) : g->rank, count = 1;
#if TESSERA_WITH_CUDA
    count = ts_cuda_device_count();
#endif
    return ts_cuda(count > 0 && local >= 0 ? local % count : 0);
}

/* The optimizer's state as a checkpoint holds it: 0 none (SGD without
 * momentum), 1 momentum (SGD), 2 moments (Adam and AdamW alike). */
static int state_kind(const ts_job_optimizer *o) {
    return o->kind == TS_JOB_SGD ? o->momentum > 0 : 2;
}

/* "adamw", "sgd with momentum", ... for o. */
static const char *optimizer_text(const ts_job_optimizer *o) {
    return o->kind == TS_JOB_SGD && o->momentum > 0 ? "sgd with momentum" : ts_job_optimizer_name(o->kind);
}

/* Refuses a job whose optimizer state is not the one of job `was`, that
 * trained checkpoint dir (its moments or momentum do not carry over, or
 * would be dropped unsaid). */
static ts_status same_optimizer(const ts_job *job, const ts_job *was, const char *dir) {
    if (state_kind(&was->optimizer) == state_kind(&job->optimizer)) return TS_OK;
    return ts_error(TS_ERR_VALUE, "optimizer.kind: %s, but checkpoint %s was trained with %s, whose state does not "
                    "carry over: resume with its optimizer, or start a new run from its weights (model.init_from)",
                    optimizer_text(&job->optimizer), dir, optimizer_text(&was->optimizer));
}

/* Refuses a job that orders the training samples otherwise than job
 * `was`, that trained checkpoint ck (at dir), when ck stopped inside an
 * epoch: its data position counts the samples of that epoch in the old
 * order, and the rest of the epoch would repeat some and skip others. */
static ts_status same_data_order(const ts_job *job, const ts_job *was, const ts_checkpoint *ck, const char *dir) {
    if (ck->loader.offset == 0) return TS_OK; /* at an epoch's start: nothing of it seen yet */
    char now[64], then[64];
    const char *field = NULL;
    if (job->seed != was->seed) {
        field = "seed";
        snprintf(now, sizeof now, "%lld", (long long)job->seed);
        snprintf(then, sizeof then, "%lld", (long long)was->seed);
    } else if (job->data.val_fraction != was->data.val_fraction) {
        field = "data.val_fraction";
        snprintf(now, sizeof now, "%g", job->data.val_fraction);
        snprintf(then, sizeof then, "%g", was->data.val_fraction);
    } else if (job->data.shuffle != was->data.shuffle) {
        field = "data.shuffle";
        snprintf(now, sizeof now, "%s", job->data.shuffle ? "true" : "false");
        snprintf(then, sizeof then, "%s", was->data.shuffle ? "true" : "false");
    }
    if (!field) return TS_OK;
    return ts_error(TS_ERR_VALUE, "%s: %s, but checkpoint %s was trained with %s and stopped inside epoch %lld "
                    "(%lld samples of it used, in that order): resume with %s %s, or start a new run from its "
                    "weights (model.init_from)", field, now, dir, then, (long long)ck->loader.epoch,
                    (long long)ck->loader.offset, field, then);
}

/* Refuses to resume checkpoint dir with a job its state does not fit:
 * another optimizer's, or another order of the samples mid-epoch. A
 * config that does not parse is not judged. */
static ts_status resumable(const ts_job *job, const char *dir) {
    ts_checkpoint *ck = ts_checkpoint_open(dir);
    if (!ck) return ts_last_status();
    ts_job was;
    ts_status st = TS_OK;
    if (ck->config && ts_job_parse(ck->config, NULL, 0, &was) == TS_OK) {
        st = same_optimizer(job, &was, dir);
        if (!st) st = same_data_order(job, &was, ck, dir);
    }
    ts_checkpoint_close(ck);
    return st;
}

ts_trainer *ts_trainer_create(const ts_job *job, const char *job_text, const char *run_dir, bool resume,
                              ts_strategy *s) {
    if (!s) return NULL; /* its constructor said why */
    ts_trainer *t = calloc(1, sizeof *t);
    if (!t) {
        ts_strategy_free(s);
        ts_error(TS_ERR_MEMORY, "trainer: out of memory");
        return NULL;
    }
    t->strategy = s;
    s->trainer = t;
    t->job = *job;
    t->job_text = strdup(job_text ? job_text : "{}");
    snprintf(t->run_dir, sizeof t->run_dir, "%s", run_dir ? run_dir : "");
    ts_unit_runs runs = {0};
    char ckpt[1200] = ""; /* the checkpoint resumed from, if any */
    ts_status st = TS_OK;
    if (run_dir && resume) {
        char root[1100];
        int64_t step;
        snprintf(root, sizeof root, "%s/checkpoints", t->run_dir);
        st = ts_checkpoint_latest(root, ckpt, sizeof ckpt, &step);
        t->no_checkpoint = !ckpt[0];
    }
    if (!st) st = ts_job_model_spec(job, &t->spec);
    if (!st) st = s->ops->units(s, &t->spec, &runs);
    if (!st) st = load_data(t);
    if (!st) {
        t->loader = make_loader(t, &s->group);
        if (!t->loader) st = ts_last_status();
        t->shard = s->group;
    }
    if (!st && job->train.epochs > 0) {
        st = epoch_steps(job, t->loader, &t->total_steps);
    } else if (!st) {
        t->total_steps = job->steps;
        if (t->total_steps < 1 && s->in_job)
            t->total_steps = INT64_MAX; /* a job of no set length runs until the scheduler ends it */
        else if (t->total_steps < 1)
            st = ts_error(TS_ERR_VALUE, "steps: the job has no steps to run");
    }
    if (!st) {
        ts_job first = *job;
        if (ckpt[0]) ts_job_forget_init(&first); /* the checkpoint's weights replace the first ones */
        t->model = ts_job_model_build(&first, &t->spec, &runs);
        t->part = !ts_unit_runs_all(&runs, &t->spec);
        if (!t->model) st = ts_last_status();
        if (!st) st = ts_model_to(t->model, job_device(job, &s->group));
        if (!st && job->train.bf16) st = ts_model_set_compute_dtype(t->model, TS_BF16);
    }
    if (!st) st = setup_optimizer(t);
    if (!st) st = hook_params(t);
    if (!st) t->whole = whole_slice(t->model);
    if (!st && run_dir) st = ts_io_make_run_dir(t->run_dir);
    if (!st && ckpt[0]) st = resumable(job, ckpt);
    if (!st && ckpt[0]) st = ts_trainer_load(t, ckpt);
    if (st) {
        ts_trainer_free(t);
        return NULL;
    }
    return t;
}

ts_status ts_trainer_steps(const ts_job *job, int64_t *steps) {
    *steps = job->steps;
    if (job->train.epochs <= 0) return TS_OK;
    ts_trainer *t = calloc(1, sizeof *t);
    if (!t) return ts_error(TS_ERR_MEMORY, "trainer: out of memory");
    t->job = *job;
    t->job.data.prefetch = 0;
    ts_status st = load_data(t);
    if (!st && !(t->loader = make_loader(t, &(ts_group){.rank = 0, .world = ts_strategy_data_world(job)})))
        st = ts_last_status();
    if (!st) st = epoch_steps(job, t->loader, steps);
    ts_trainer_free(t);
    return st;
}

ts_status ts_trainer_attach(ts_trainer *t) {
    ts_strategy *s = t->strategy;
    ts_status st = s->ops->attach(s);
    if (!st && t->run_dir[0] && s->group.leader && !t->metrics) {
        t->metrics = ts_metrics_open(t->run_dir, t->step, &t->logged_step);
        if (!t->metrics) st = ts_last_status();
    }
    return st;
}

void ts_trainer_free(ts_trainer *t) {
    if (!t) return;
    ts_strategy_free(t->strategy); /* first: it may still let go of what it holds in the model */
    ts_loader_free(t->loader);
    ts_dataset_free(t->train_set);
    ts_dataset_free(t->val_set);
    ts_dataset_free(t->test_set);
    ts_text_free(t->corpus);
    for (int i = 0; i < 6; i++) ts_tensor_release(t->data[i]);
    ts_model_free(t->model);
    ts_optim_groups_free(&t->groups);
    if (t->metrics) fclose(t->metrics);
    free(t->ready);
    free(t->hooks);
    free(t->job_text);
    free(t);
}

/* ---- one step ---- */

/* The model's logits for batch input x, reshaped to [rows, classes], and
 * targets reshaped to [rows], both on the model's device; in evaluation
 * (eval set) through the strategy's forward when it has one, which may
 * leave *logits NULL (this process does not see the logits). */
static ts_status logits_for(ts_trainer *t, ts_tensor *x, ts_tensor *y, bool eval, ts_tensor **logits,
                            ts_tensor **targets) {
    ts_strategy *s = t->strategy;
    ts_device d = t->model->device;
    ts_tensor *xd = ts_tensor_to(x, d), *yd = xd ? ts_tensor_to(y, d) : NULL;
    ts_tensor *in = !yd ? NULL : t->spec.arch == TS_ARCH_MLP ? ts_flatten(xd, 1, -1) : ts_tensor_retain(xd);
    ts_tensor *out = NULL;
    ts_status st = in ? TS_OK : ts_last_status();
    if (!st && eval && s->ops->forward) st = s->ops->forward(s, in, &out);
    else if (!st && !(out = ts_model_forward(t->model, in))) st = ts_last_status();
    ts_tensor_release(in);
    ts_tensor_release(xd);
    *logits = *targets = NULL;
    if (st || !out) {
        ts_tensor_release(yd);
        return st;
    }
    int64_t classes = out->shape[out->ndim - 1];
    *logits = ts_reshape(out, 2, (int64_t[]){-1, classes});
    *targets = ts_reshape(yd, 1, (int64_t[]){-1});
    ts_tensor_release(out);
    ts_tensor_release(yd);
    return *logits && *targets ? TS_OK : ts_last_status();
}

ts_status ts_trainer_micro(ts_trainer *t, const ts_batch *b, double scale, double *loss) {
    ts_tensor *logits = NULL, *targets = NULL, *l = NULL, *ls = NULL;
    ts_status st = logits_for(t, b->x, b->y, false, &logits, &targets);
    if (!st) l = ts_cross_entropy(logits, targets, -100, TS_REDUCTION_MEAN);
    if (!st && !l) st = ts_last_status();
    if (!st) {
        *loss = ts_tensor_item(l);
        ls = scale == 1.0 ? ts_tensor_retain(l) : ts_mul_scalar(l, scale);
        st = ls ? ts_backward(ls, NULL) : ts_last_status();
    }
    ts_tensor_release(logits);
    ts_tensor_release(targets);
    ts_tensor_release(l);
    ts_tensor_release(ls);
    return st;
}

void ts_trainer_grads_begin(ts_trainer *t) {
    ts_model *m = t->model;
    ts_model_zero_grad(m);
    ts_model_train(m, true);
    memset(t->ready, 0, (size_t)m->n_params * sizeof *t->ready);
}

void ts_trainer_dropout_key(ts_trainer *t, int micro) {
    ts_key k = ts_key_fold_in(ts_key_from_seed((uint64_t)t->job.seed ^ 0x64726f70ULL), (uint64_t)t->step);
    k = ts_key_fold_in(k, (uint64_t)micro);
    t->model->dropout_key = ts_key_fold_in(k, (uint64_t)t->strategy->group.rank);
}

ts_status ts_trainer_grads_end(ts_trainer *t) {
    /* what backward did not announce (unused parameters) is final now */
    ts_model *m = t->model;
    ts_status st = TS_OK;
    for (int i = 0; !st && i < m->n_params; i++)
        if (!t->ready[i]) st = t->strategy->ops->grads_ready(t->strategy, m->params[i].offset, m->params[i].numel);
    return st;
}

ts_status ts_trainer_grads(ts_trainer *t, double *loss, int64_t *samples) {
    int k = t->job.train.accum_steps;
    ts_model *m = t->model;
    ts_trainer_grads_begin(t);
    *loss = 0;
    *samples = 0;
    for (int i = 0; i < k; i++) {
        ts_batch b;
        ts_status st = ts_loader_next(t->loader, &b);
        if (st) return st;
        double l = 0;
        t->last_micro = i == k - 1;
        ts_trainer_dropout_key(t, i);
        st = ts_trainer_micro(t, &b, 1.0 / k, &l);
        t->last_micro = false;
        /* bf16 compute: add this micro-batch's gradients to the f32 master */
        if (!st) st = ts_model_fold_compute_grads(m, 1.0f);
        *samples += b.size;
        ts_batch_release(&b);
        if (st) return st;
        *loss += l / k;
    }
    return ts_trainer_grads_end(t);
}

ts_status ts_trainer_apply(ts_trainer *t, double *lr, double *grad_norm) {
    ts_strategy *s = t->strategy;
    const ts_optim_slice *sl;
    int n;
    s->ops->slices(s, &sl, &n);
    double sq;
    ts_status st = s->ops->reduce_sq_norm(s, &sq);
    if (st) return st;
    *grad_norm = sqrt(sq);
    double clip = t->job.optimizer.clip_norm;
    if (clip > 0) {
        if (!isfinite(*grad_norm))
            return ts_error(TS_ERR_VALUE, "step %lld: the gradient norm is %g; optimizer.clip_norm cannot clip it",
                            (long long)t->step + 1, *grad_norm);
        float coef = (float)ts_clip_coef(*grad_norm, clip);
        for (int i = 0; !st && i < n; i++) st = ts_optim_slice_scale(&sl[i], coef);
    }
    *lr = ts_schedule_lr(&t->schedule, t->step);
    for (int i = 0; !st && i < n; i++) st = ts_optim_step_range(&t->optim, t->step + 1, *lr, &t->groups, &sl[i]);
    if (!st) st = ts_model_sync_compute(t->model);
    if (!st) t->step++;
    return st;
}

ts_status ts_trainer_follow_group(ts_trainer *t) {
    const ts_group *g = &t->strategy->group;
    if (g->rank == t->shard.rank && g->world == t->shard.world) return TS_OK;
    ts_status st = ts_loader_reshard(t->loader, g->rank, g->world);
    if (!st) t->shard = *g;
    return st;
}

ts_status ts_trainer_step(ts_trainer *t, ts_step_stats *s) {
    ts_strategy *sg = t->strategy;
    double t0 = ts_clock_ms();
    int64_t samples = 0;
    s->taken = s->adopted = false;
    ts_alloc_reset_peak();
    ts_alloc_reset_rss_peak();
    sg->times = (ts_comm_times){0};
    ts_status st = sg->ops->begin_step(sg, t->step);
    if (st || sg->finished) return st;
    st = ts_trainer_follow_group(t);
    if (!st) st = sg->ops->grads(sg, &s->loss, &samples);
    /* a strategy that adopted a peer's later state may have reached the end */
    if (!st && t->step >= t->total_steps) {
        memset(s, 0, sizeof *s);
        s->step = t->step;
        return TS_OK;
    }
    if (!st) st = ts_trainer_apply(t, &s->lr, &s->grad_norm);
    if (!st) st = sg->ops->end_step(sg, t->step);
    if (st) return st;
    s->step = t->step;
    s->step_ms = ts_clock_ms() - t0;
    s->comm = sg->times;
    s->samples_per_s = samples / (s->step_ms / 1e3);
    s->tokens_per_s = t->spec.arch == TS_ARCH_GPT ? s->samples_per_s * t->spec.gpt.block_size : 0;
    ts_alloc_stats a = ts_alloc_get_stats();
    s->mem_bytes = a.allocated;
    s->peak_bytes = a.peak;
    size_t rss;
    ts_alloc_rss(&rss, &s->rss_peak_bytes);
    s->taken = true;
    return TS_OK;
}

/* Writes step s's line where train.log_every (or the last step) asks for it. */
static ts_status log_line(ts_trainer *t, const ts_step_stats *s) {
    t->logged_step = s->step;
    if (s->step % t->job.train.log_every == 0 || s->step == t->total_steps)
        return ts_metrics_step(t->metrics, t->run_dir, s, t->total_steps);
    return TS_OK;
}

/* Says which steps before `first`, the next this leader logs, have no line
 * that train.log_every asked for: every worker that took them left before
 * logging them, and the state this one adopted did not say their loss (a
 * ps step its shards restored from a checkpoint; async, the steps before
 * the one the shards describe). */
static void say_unlogged(const ts_trainer *t, int64_t first) {
    int64_t every = t->job.train.log_every, from = (t->logged_step / every + 1) * every;
    if (from >= first) return;
    int64_t to = (first - 1) / every * every;
    if (from == to)
        printf("metrics.jsonl: step %lld has no line: every worker that took it left before logging it\n",
               (long long)from);
    else
        printf("metrics.jsonl: steps %lld to %lld have no lines: every worker that took them left before logging "
               "them\n", (long long)from, (long long)to);
}

/* Keeps s as the last step this rank took, and among its recent ones. */
static void keep_step(ts_trainer *t, const ts_step_stats *s) {
    int i = (int)(s->step % TS_TRAINER_RECENT);
    t->last_taken = *s;
    t->recent[i] = *s;
    t->recent_seq[i] = ++t->kept;
}

/* The first of the steps before `step` (itself kept last) that this rank
 * kept one after the other up to it and that no line has yet. */
static int64_t first_unlogged_kept(const ts_trainer *t, int64_t step) {
    int64_t first = step, seq = t->kept;
    while (first - 1 > t->logged_step && step - first + 1 < TS_TRAINER_RECENT) {
        int i = (int)((first - 1) % TS_TRAINER_RECENT);
        if (t->recent[i].step != first - 1 || !t->recent[i].taken || t->recent_seq[i] != seq - 1) break;
        first--, seq--;
    }
    return first;
}

void ts_trainer_adopt_step(ts_trainer *t, int64_t step, double loss, double lr, double grad_norm) {
    if (step > t->step)
        keep_step(t, &(ts_step_stats){.step = step, .loss = loss, .lr = lr, .grad_norm = grad_norm, .taken = true,
                                      .adopted = true});
}

/* Logs kept step s, and the steps it kept before that no line has yet,
 * where this rank leads (ts_trainer_log_step). */
static ts_status log_kept(ts_trainer *t, const ts_step_stats *s) {
    if (!t->strategy->group.leader) {
        /* a rank that lost the lead lets go of the file: the next leader
         * replaces it (ts_metrics_open), and should the lead come back,
         * lines written through this handle would go to the replaced one */
        if (t->metrics) fclose(t->metrics);
        t->metrics = NULL;
        return TS_OK;
    }
    /* a step adopted from the shards keeps the line a leader before wrote
     * of it (this rank took the lead by joining, say, while that one
     * lived); a step this rank took replaces it */
    int64_t keep_to = s->adopted ? s->step : s->step - 1;
    if (t->metrics && keep_to < t->logged_step) {
        fclose(t->metrics);
        t->metrics = NULL;
    }
    if (!t->metrics && t->run_dir[0] && !(t->metrics = ts_metrics_open(t->run_dir, keep_to, &t->logged_step)))
        return ts_last_status();
    if (s->adopted && t->logged_step >= s->step) return TS_OK;
    /* the steps before, which this rank took (or adopted) and no leader
     * logged: the one that took them left before it could */
    int64_t first = first_unlogged_kept(t, s->step);
    say_unlogged(t, first);
    ts_status st = TS_OK;
    for (int64_t k = first; k < s->step && !st; k++) st = log_line(t, &t->recent[k % TS_TRAINER_RECENT]);
    return st ? st : log_line(t, s);
}

ts_status ts_trainer_log_step(ts_trainer *t, const ts_step_stats *s) {
    keep_step(t, s);
    return log_kept(t, s);
}

/* ---- evaluation ---- */

/* Adds the batch's summed loss, correct predictions, scored targets and
 * samples, where this process sees the logits. */
static ts_status eval_batch(ts_trainer *t, const ts_batch *b, double *loss_sum, int64_t *correct, int64_t *rows,
                            int64_t *samples) {
    ts_tensor *logits = NULL, *targets = NULL;
    ts_status st = logits_for(t, b->x, b->y, true, &logits, &targets);
    if (!st && !logits) return TS_OK;
    ts_tensor *l = st ? NULL : ts_cross_entropy(logits, targets, -100, TS_REDUCTION_SUM);
    if (!st && !l) st = ts_last_status();
    if (!st) {
        *loss_sum += ts_tensor_item(l);
        /* predictions are read on the host */
        ts_tensor *c = ts_tensor_to(logits, TS_CPU), *y = c ? ts_tensor_to(targets, TS_CPU) : NULL;
        if (!y) st = ts_last_status();
        int64_t n = y ? c->shape[0] : 0, k = y ? c->shape[1] : 0;
        const float *p = y ? ts_f32(c) : NULL;
        for (int64_t i = 0; i < n; i++) {
            int64_t best = 0;
            for (int64_t j = 1; j < k; j++)
                if (p[i * k + j] > p[i * k + best]) best = j;
            *correct += best == (int64_t)ts_tensor_get(y, i);
        }
        *rows += n;
        *samples += b->size;
        ts_tensor_release(c);
        ts_tensor_release(y);
    }
    ts_tensor_release(l);
    ts_tensor_release(logits);
    ts_tensor_release(targets);
    return st;
}

/* ts_trainer_eval, or, alone, the same batches scored by this rank alone
 * and not added over the group (a leader that writes the run's end
 * after the others finished theirs). */
static ts_status eval_pass(ts_trainer *t, bool test, int64_t max_batches, bool alone, ts_eval_stats *e) {
    const ts_dataset *ds = test && t->test_set ? t->test_set : t->val_set;
    if (!ds) return ts_error(TS_ERR_VALUE, "evaluation: the job holds no validation data (data.val_fraction 0)");
    ts_loader_config lc = {.batch_size = t->job.train.batch_size, .world = 1};
    ts_loader *l = ts_loader_create(ds, &lc);
    if (!l) return ts_last_status();
    const ts_group *group = &t->strategy->group, *g = alone ? &(ts_group){.rank = 0, .world = 1} : group;
    /* max_batches per rank: the samples one process scores in max_batches
     * batches of the group's whole batch */
    int64_t batches = ts_loader_batches_per_epoch(l);
    if (max_batches > 0 && max_batches < (batches + group->world - 1) / group->world)
        batches = max_batches * group->world;
    bool prev = ts_grad_set_enabled(false);
    ts_model_train(t->model, false);
    double loss_sum = 0;
    int64_t correct = 0, rows = 0, samples = 0;
    ts_status st = TS_OK;
    /* the group's ranks take turns by batch, so together they score each
     * sample once, in the same batches as one process would; with a shared
     * forward every rank runs one per round, a rank past the last batch on
     * the round's first, unscored */
    int64_t rounds = (batches + g->world - 1) / g->world;
    ts_batch head = {0};
    for (int64_t i = 0; !st && i < rounds * g->world; i++) {
        ts_batch b = {0};
        if (i < batches) st = ts_loader_next(l, &b);
        bool mine = i % g->world == g->rank;
        if (!st && mine && i < batches) {
            st = eval_batch(t, &b, &loss_sum, &correct, &rows, &samples);
        } else if (!st && mine && t->strategy->shared_forward) {
            double ignored = 0;
            int64_t none = 0;
            st = eval_batch(t, &head, &ignored, &none, &none, &none);
        }
        if (i % g->world == 0 && i < batches && !st) {
            ts_batch_release(&head);
            head = b;
        } else {
            ts_batch_release(&b);
        }
    }
    ts_batch_release(&head);
    ts_model_train(t->model, true);
    ts_grad_set_enabled(prev);
    ts_loader_free(l);
    double sums[4] = {loss_sum, (double)correct, (double)rows, (double)samples};
    if (!st && !alone) st = t->strategy->ops->reduce_sums(t->strategy, sums, 4);
    if (st) return st;
    e->samples = (int64_t)sums[3];
    e->predictions = (int64_t)sums[2];
    e->loss = sums[2] ? sums[0] / sums[2] : 0;
    bool gpt = t->spec.arch == TS_ARCH_GPT;
    e->accuracy = gpt ? -1 : sums[1] / (sums[2] ? sums[2] : 1);
    e->bits_per_byte = gpt ? ts_text_bits_per_byte(e->loss) : -1;
    return TS_OK;
}

ts_status ts_trainer_eval(ts_trainer *t, bool test, int64_t max_batches, ts_eval_stats *e) {
    return eval_pass(t, test, max_batches, false, e);
}

/* ---- checkpoints ---- */

ts_status ts_trainer_save(ts_trainer *t, char *path, size_t cap) { return t->strategy->ops->save(t->strategy, path, cap); }

/* ---- the loop ---- */

/* Validation (or test) pass with its log and metrics lines (the
 * leader's). An evaluation that fails because the world changed under it
 * (a peer died or joined) runs again in the next generation when every
 * rank there was in the same pass, or after the last step unless a rank
 * was in a later pass (a rank that was still in the step evaluates next);
 * otherwise the group went on without it (with the next step, or with the
 * final test pass). When the regroup moved the job back to an earlier step
 * it is moot, and the loop trains on. Alone: scored by this rank alone
 * (eval_pass). */
static ts_status run_eval(ts_trainer *t, bool test, bool alone) {
    int64_t at = t->step;
    if (!test && !t->val_set) return TS_OK; /* data.val_fraction 0: nothing to validate on */
    for (;;) {
        ts_eval_stats e;
        ts_status st = eval_pass(t, test, test ? 0 : t->job.train.eval_batches, alone, &e);
        /* a rank that took the lead in the pass (the leader left) logs the
         * step's line first, which the one before may have left unwritten */
        if (!st && t->strategy->group.leader && !t->metrics && t->last_taken.step == t->step)
            st = log_kept(t, &t->last_taken);
        if (!st && t->strategy->group.leader)
            return ts_metrics_eval(t->metrics, t->run_dir, t->step, test ? "test" : "val", &e);
        if (!st || !t->strategy->ops->recover) return st;
        fprintf(stderr, "evaluation at step %lld abandoned: %s\n", (long long)at, ts_last_error());
        bool again;
        if ((st = t->strategy->ops->recover(t->strategy, st, test, &again)) || t->strategy->finished ||
            t->step != at)
            return st;
        if (!again) {
            fprintf(stderr, "evaluation at step %lld skipped: the group went on with the %s\n", (long long)at,
                    t->step < t->total_steps ? "next step" : "test pass");
            return TS_OK;
        }
    }
}

/* Whether the loop goes on: steps left, no stop asked (by a signal, or by
 * the job's STOP the group agreed on), the job not ended. */
static bool more_steps(const ts_trainer *t, volatile sig_atomic_t *stop) {
    return t->step < t->total_steps && !(stop && *stop) && !t->strategy->finished && !t->strategy->stop_agreed;
}

/* Whether the job is short of its last step again after a regroup in its
 * final evaluation moved it back (a lost shard reloaded): it trains on. */
static bool moved_back(const ts_trainer *t) { return t->step < t->total_steps && !t->strategy->finished; }

/* A checkpoint of the current step into path, unless *saved says that
 * one of it was already written (its path is still there); *saved becomes
 * the step once the save went through (not when the strategy abandoned
 * it because the world changed in it). */
static ts_status save_once(ts_trainer *t, char *path, size_t cap, int64_t *saved) {
    if (*saved == t->step) return TS_OK;
    t->strategy->save_abandoned = false;
    ts_status st = ts_trainer_save(t, path, cap);
    if (!st && !t->strategy->save_abandoned) *saved = t->step;
    return st;
}

/* The run's end after its last step: the checkpoint (into path, as
 * save_once) and the evaluations; then the strategy's finish. When this
 * rank took the lead from a leader that left before writing the end, it
 * writes it again: the lines of the steps it kept that have none, the
 * checkpoint, and the evaluations, scored alone (the others are done). */
static ts_status write_end(ts_trainer *t, char *path, size_t cap, int64_t *saved) {
    bool again = false;
    for (;;) {
        uint64_t generation = t->strategy->group.generation;
        ts_status st = save_once(t, path, cap, saved);
        if (!st) st = run_eval(t, false, again);
        if (!st && t->test_set && !t->strategy->finished && !moved_back(t)) st = run_eval(t, true, again);
        if (st || moved_back(t) || t->strategy->finished) return st;
        /* the group changed in the evaluations (a peer left; the leader,
         * whose checkpoint this rank cannot tell was written): again, in
         * the new one */
        if (t->strategy->group.generation != generation) {
            *saved = -1;
            if ((st = save_once(t, path, cap, saved))) return st;
        }
        if (!t->strategy->ops->finish) return st;
        if ((st = t->strategy->ops->finish(t->strategy, &again)) || !again) return st;
        if (t->last_taken.step == t->step && (st = log_kept(t, &t->last_taken))) return st;
        *saved = -1; /* as another rank, this one wrote no checkpoint */
    }
}

ts_status ts_trainer_run(ts_trainer *t, volatile sig_atomic_t *stop) {
    const ts_job_train *tr = &t->job.train;
    if (t->strategy->group.leader) ts_metrics_banner(t);
    ts_status st = TS_OK;
    char ckpt[1200] = "";
    int64_t saved = -1; /* the step of ckpt */
    for (;;) {
        while (!st && more_steps(t, stop)) {
            ts_step_stats s;
            st = ts_trainer_step(t, &s);
            /* failed, or the job ended before a step (a regroup may also
             * have moved the job back, so the step count tells nothing) */
            if (st || !s.taken) break;
            if (t->step <= saved) saved = -1; /* moved back: ckpt is of another path */
            if ((st = ts_trainer_log_step(t, &s))) break;
            if (tr->eval_every && t->step % tr->eval_every == 0 && t->step < t->total_steps)
                st = run_eval(t, false, false);
            if (!st && tr->checkpoint_every && t->step % tr->checkpoint_every == 0)
                st = save_once(t, ckpt, sizeof ckpt, &saved);
        }
        if (t->strategy->group.leader) ts_metrics_end_progress();
        if (st || t->strategy->finished) return st;
        if (t->strategy->stop_agreed) {
            st = save_once(t, ckpt, sizeof ckpt, &saved);
            if (!st && ckpt[0]) printf("stopped after step %lld as the job was asked to; checkpoint %s\n",
                                      (long long)t->step, ckpt);
            return st;
        }
        if (stop && *stop) {
            st = save_once(t, ckpt, sizeof ckpt, &saved);
            if (!st && ckpt[0]) printf("interrupted at step %lld; checkpoint %s\n", (long long)t->step, ckpt);
            return st ? st : ts_error(TS_ERR_STATE, "training interrupted at step %lld", (long long)t->step);
        }
        st = write_end(t, ckpt, sizeof ckpt, &saved);
        if (st || !moved_back(t)) break;
    }
    if (!st && ckpt[0]) printf("checkpoint: %s\n", ckpt);
    return st;
}
