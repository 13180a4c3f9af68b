/* store.c - a shard's checkpoints: its keys, their optimizer state, its step,
 * updates and data position, in the kernel library's atomic checkpoint
 * format (contract in shard.h). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/io/checkpoint.h"
#include "kernels/nn/models.h"
#include "proto/job_model.h"
#include "ps/internal.h"

/* The shard's tensors under their checkpoint names. */
static const char *const KEYS_NAME = "keys";
static const char *const STATE_NAME = "state";

ts_status ts_shard_save(ts_shard *s, char *path, size_t cap) {
    json_t *extra = json_pack("{s:i, s:i, s:I, s:I, s:I, s:I}", "shard", s->cfg.shard, "shards", s->cfg.shards,
                              "offset", (json_int_t)s->offset, "len", (json_int_t)s->len, "numel",
                              (json_int_t)s->numel, "updates", (json_int_t)s->updates);
    char *text = extra ? json_dumps(extra, JSON_COMPACT) : NULL;
    json_decref(extra);
    if (!text) return ts_error(TS_ERR_MEMORY, "shard %d checkpoint: out of memory", s->cfg.shard);
    ts_checkpoint_data d = {
        .step = s->step,
        .n_model = 1,
        .model_names = &KEYS_NAME,
        .model = &s->params,
        .n_optim = s->state ? 1 : 0,
        .optim_names = &STATE_NAME,
        .optim = &s->state,
        .loader = s->pos,
        .extra = text,
    };
    int keep = s->cfg.job->train.keep_checkpoints > 2 ? s->cfg.job->train.keep_checkpoints : 2;
    ts_status st = ts_checkpoint_save(s->root, &d, keep, path, cap);
    if (!st) s->saved_step = s->step;
    free(text);
    return st;
}

void ts_shard_checkpoint(ts_shard *s) {
    if (!s->writer || !s->root || s->saved_step == s->step) return;
    char path[1200];
    if (ts_shard_save(s, path, sizeof path))
        fprintf(stderr, "shard %d: checkpoint of step %lld failed: %s\n", s->cfg.shard, (long long)s->step,
                ts_last_error());
    else
        printf("shard %d: checkpoint %s\n", s->cfg.shard, path);
}

/* Reads integer field key of the checkpoint's extra object into *v. */
static ts_status extra_int(const ts_checkpoint *ck, const char *key, int64_t *v) {
    json_t *x = ck->extra ? json_object_get(ck->extra, key) : NULL;
    if (!json_is_integer(x))
        return ts_error(TS_ERR_FORMAT, "%s: not a shard checkpoint (no integer \"%s\" in its extra state)", ck->path,
                        key);
    *v = json_integer_value(x);
    return TS_OK;
}

/* Checks that checkpoint ck holds this shard's keys of this model. */
static ts_status check_same(const ts_shard *s, const ts_checkpoint *ck) {
    int64_t shard = 0, shards = 0, offset = 0, len = 0, numel = 0;
    ts_status st = extra_int(ck, "shard", &shard);
    if (!st) st = extra_int(ck, "shards", &shards);
    if (!st) st = extra_int(ck, "offset", &offset);
    if (!st) st = extra_int(ck, "len", &len);
    if (!st) st = extra_int(ck, "numel", &numel);
    if (st) return st;
    if (shard != s->cfg.shard || shards != s->cfg.shards || offset != s->offset || len != s->len || numel != s->numel)
        return ts_error(TS_ERR_VALUE, "%s holds shard %lld of %lld, keys [%lld, +%lld) of a %lld-key model; this is "
                        "shard %d of %d, keys [%lld, +%lld) of %lld", ck->path, (long long)shard, (long long)shards,
                        (long long)offset, (long long)len, (long long)numel, s->cfg.shard, s->cfg.shards,
                        (long long)s->offset, (long long)s->len, (long long)s->numel);
    return TS_OK;
}

/* The folder of the checkpoint of step (-1: the newest) into dir ("" when
 * there is none). */
static ts_status find_checkpoint(const ts_shard *s, int64_t step, char *dir, size_t cap) {
    dir[0] = '\0';
    if (step < 0) {
        int64_t at;
        return ts_checkpoint_latest(s->root, dir, cap, &at);
    }
    int64_t *steps = NULL;
    int n = 0;
    ts_status st = ts_checkpoint_list(s->root, &steps, &n);
    for (int i = 0; !st && i < n; i++)
        if (steps[i] == step) snprintf(dir, cap, "%s/step-%lld", s->root, (long long)step);
    free(steps);
    return st;
}

/* Step 0 needs no checkpoint: the shard's keys as the job's seed makes
 * them, with empty optimizer state. */
static ts_status restore_seed(ts_shard *s) {
    ts_model_spec spec;
    ts_model *m = NULL;
    ts_status st = ts_job_model_spec(s->cfg.job, &spec);
    if (!st && !(m = ts_job_model_build(s->cfg.job, &spec, NULL)))
        st = ts_last_status();
    if (!st) {
        memcpy(ts_f32(s->params), ts_f32(m->flat_params) + s->offset, (size_t)s->len * sizeof(float));
        if (s->state) memset(ts_f32(s->state), 0, ts_tensor_nbytes(s->state));
        s->step = s->updates = 0;
        s->pos = (ts_loader_pos){0, 0};
        s->last_decided_step = -1;
        shard_clear_stagings(s);
    }
    ts_model_free(m);
    return st;
}

ts_status ts_shard_restore(ts_shard *s, int64_t step, bool *found) {
    *found = false;
    char dir[1200] = "";
    ts_status st = s->root ? find_checkpoint(s, step, dir, sizeof dir) : TS_OK;
    if (st) return st;
    if (!dir[0]) {
        if (step != 0) return TS_OK;
        st = restore_seed(s);
        *found = !st;
        return st;
    }
    ts_checkpoint *ck = ts_checkpoint_open(dir);
    if (!ck) return ts_last_status();
    int64_t updates = 0;
    st = check_same(s, ck);
    if (!st) st = extra_int(ck, "updates", &updates);
    if (!st) st = ts_safetensors_load_into(ck->model, 1, &KEYS_NAME, &s->params, true);
    if (!st && s->state) st = ts_safetensors_load_into(ck->optim, 1, &STATE_NAME, &s->state, true);
    if (!st) {
        s->step = ck->step;
        s->updates = updates;
        s->pos = ck->loader;
        s->saved_step = ck->step;
        s->last_decided_step = -1;
        shard_clear_stagings(s);
        *found = true;
    }
    ts_checkpoint_close(ck);
    return st;
}
