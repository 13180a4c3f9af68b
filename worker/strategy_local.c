/* strategy_local.c - strategy "local": one process trains the whole model.
 *
 * Its hooks are the building blocks the parallel strategies reuse: every
 * unit, the whole model as the one slice the optimizer steps, sums that
 * need no communication, and checkpoints of the whole model.
 */
#include "worker/strategy.h"

#include <stdio.h>
#include <stdlib.h>

#include "kernels/io/checkpoint.h"
#include "worker/checkpoint_parts.h"
#include "worker/fsdp_checkpoint.h"
#include "worker/trainer.h"

ts_status ts_strategy_all_units(ts_strategy *s, const ts_model_spec *spec, ts_unit_runs *runs) {
    (void)s;
    int units = ts_model_units(spec);
    if (units < 0) return ts_last_status();
    *runs = (ts_unit_runs){.n = 1, .first = {0}, .end = {units}};
    return TS_OK;
}

static ts_status local_attach(ts_strategy *s) {
    (void)s;
    return TS_OK;
}

static ts_status local_begin_step(ts_strategy *s, int64_t step) {
    (void)s, (void)step;
    return TS_OK;
}

static ts_status local_grads(ts_strategy *s, double *loss, int64_t *samples) {
    return ts_trainer_grads(s->trainer, loss, samples);
}

ts_status ts_strategy_ready_nothing(ts_strategy *s, int64_t offset, int64_t len) {
    (void)s, (void)offset, (void)len;
    return TS_OK;
}

void ts_strategy_whole_model(ts_strategy *s, const ts_optim_slice **slices, int *n) {
    *slices = &s->trainer->whole;
    *n = 1;
}

ts_status ts_strategy_slices_sq_norm(ts_strategy *s, double *sum) {
    const ts_optim_slice *sl;
    int n;
    s->ops->slices(s, &sl, &n);
    double part;
    ts_status st = TS_OK;
    *sum = 0;
    for (int i = 0; !st && i < n; i++) {
        st = ts_optim_slice_sq_norm(&sl[i], &part);
        *sum += part;
    }
    return st;
}

ts_status ts_strategy_sq_norm_here(ts_strategy *s, double *global) { return ts_strategy_slices_sq_norm(s, global); }

ts_status ts_strategy_sums_here(ts_strategy *s, double *v, int n) {
    (void)s, (void)v, (void)n;
    return TS_OK;
}

static ts_status local_end_step(ts_strategy *s, int64_t step) {
    (void)s, (void)step;
    return TS_OK;
}

/* The model's parameter names and master values, for checkpoint I/O
 * (*names and *values malloc'd; free both). */
static ts_status param_table(const ts_model *m, const char ***names, ts_tensor ***values) {
    *names = calloc((size_t)m->n_params, sizeof **names);
    *values = calloc((size_t)m->n_params, sizeof **values);
    if (!*names || !*values) {
        free(*names);
        free(*values);
        return ts_error(TS_ERR_MEMORY, "checkpoint: out of memory for %d parameter names", m->n_params);
    }
    for (int i = 0; i < m->n_params; i++) {
        (*names)[i] = m->params[i].name;
        (*values)[i] = m->params[i].value;
    }
    return TS_OK;
}

ts_status ts_strategy_save_whole(ts_strategy *s, char *path, size_t cap) {
    char root[1100];
    snprintf(root, sizeof root, "%s/checkpoints", s->trainer->run_dir);
    return ts_strategy_save_whole_in(s, root, s->trainer->job.train.keep_checkpoints, path, cap);
}

ts_status ts_strategy_save_whole_in(ts_strategy *s, const char *root, int keep, char *path, size_t cap) {
    ts_trainer *t = s->trainer;
    ts_model *m = t->model;
    const char **names;
    ts_tensor **values;
    ts_status st = param_table(m, &names, &values);
    if (st) return st;
    ts_tensor *state = m->n_state ? ts_model_state_tensor(m) : NULL;
    const char *sname = "state";
    ts_checkpoint_data d = {
        .step = t->step,
        .n_model = m->n_params,
        .model_names = names,
        .model = values,
        .n_optim = state ? 1 : 0,
        .optim_names = &sname,
        .optim = &state,
        .loader = ts_loader_position(t->loader),
        .config = t->job_text,
    };
    st = ts_checkpoint_save(root, &d, keep, path, cap);
    ts_tensor_release(state);
    free(names);
    free(values);
    return st;
}

/* The weights of a whole checkpoint into m. */
static ts_status load_model(const ts_checkpoint *ck, ts_model *m) {
    const char **names;
    ts_tensor **values;
    ts_status st = param_table(m, &names, &values);
    if (!st) {
        st = ts_safetensors_load_into(ck->model, m->n_params, names, values, true);
        free(names);
        free(values);
    }
    return st;
}

bool ts_strategy_no_optim_state(const ts_checkpoint *ck) {
    return !ts_parts_is_index(ck) && !(ck->extra && json_object_get(ck->extra, "fsdp")) &&
           ts_safetensors_find(ck->optim, "state") < 0;
}

ts_status ts_strategy_read_model(const ts_checkpoint *ck, ts_model *m) {
    if (ts_parts_is_index(ck)) return ts_parts_read_model(ck, m); /* a pipeline's stages */
    ts_status st = ts_parts_refuse_part(ck);
    if (st) return st;
    ts_fsdp_layout l;
    bool sharded;
    st = ts_fsdp_layout_read(ck, &l, &sharded);
    if (st) return st;
    if (sharded) {
        ts_fsdp_layout_free(&l);
        return ts_fsdp_read_model(ck, m);
    }
    st = load_model(ck, m);
    if (!st && m->n_state && ts_strategy_no_optim_state(ck))
        return ts_error(TS_ERR_FORMAT,
                        "checkpoint %s holds no optimizer state (a ps job's shards keep theirs, or its optimizer had "
                        "none) to resume this job's from; start another from its weights with "
                        "model.init_from=%s/model.safetensors",
                        ck->path, ck->path);
    if (!st && m->n_state) {
        ts_tensor *state = ts_model_state_tensor(m);
        const char *sname = "state";
        st = state ? ts_safetensors_load_into(ck->optim, 1, &sname, &state, true) : ts_last_status();
        ts_tensor_release(state);
    }
    return st;
}

/* Checkpoint ck of the whole model (whole or sharded) into t's part of it,
 * through a whole model built to read it into. */
static ts_status read_into_part(const ts_checkpoint *ck, ts_trainer *t) {
    ts_model *whole = ts_model_build(&t->spec, 0, -1, ts_key_from_seed((uint64_t)t->job.seed), TS_F32);
    ts_status st = whole ? TS_OK : ts_last_status();
    if (!st && t->model->n_state) st = ts_model_alloc_state(whole, t->model->n_state);
    if (!st) st = ts_strategy_read_model(ck, whole);
    if (!st) st = ts_parts_copy_model(t->model, whole);
    ts_model_free(whole);
    return st;
}

ts_status ts_strategy_load_whole(ts_strategy *s, const char *dir) {
    ts_trainer *t = s->trainer;
    ts_checkpoint *ck = ts_checkpoint_open(dir);
    if (!ck) return ts_last_status();
    ts_status st = t->part && !ts_parts_is_index(ck) ? read_into_part(ck, t) : ts_strategy_read_model(ck, t->model);
    if (!st) st = ts_loader_set_position(t->loader, ck->loader);
    if (!st) t->step = ck->step;
    if (!st) st = ts_model_sync_compute(t->model); /* the bf16 copy follows the loaded master */
    ts_checkpoint_close(ck);
    return st;
}

static void local_free(ts_strategy *s) { free(s); }

static const ts_strategy_ops local_ops = {
    .units = ts_strategy_all_units,
    .attach = local_attach,
    .begin_step = local_begin_step,
    .grads = local_grads,
    .grads_ready = ts_strategy_ready_nothing,
    .slices = ts_strategy_whole_model,
    .reduce_sq_norm = ts_strategy_sq_norm_here,
    .reduce_sums = ts_strategy_sums_here,
    .end_step = local_end_step,
    .save = ts_strategy_save_whole,
    .load = ts_strategy_load_whole,
    .free = local_free,
};

ts_strategy *ts_strategy_local_new(const ts_strategy_options *o) {
    (void)o;
    ts_strategy *s = calloc(1, sizeof *s);
    if (!s) {
        ts_error(TS_ERR_MEMORY, "strategy local: out of memory");
        return NULL;
    }
    s->ops = &local_ops;
    s->group = (ts_group){.rank = 0, .world = 1, .generation = 0, .leader = true};
    return s;
}
