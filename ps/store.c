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

/* The range of keys a shard checkpoint holds, and its updates. */
typedef struct {
    int64_t shard, shards, offset, len, numel, updates;
} saved_range;

static ts_status read_range(const ts_checkpoint *ck, saved_range *r) {
    ts_status st = extra_int(ck, "shard", &r->shard);
    if (!st) st = extra_int(ck, "shards", &r->shards);
    if (!st) st = extra_int(ck, "offset", &r->offset);
    if (!st) st = extra_int(ck, "len", &r->len);
    if (!st) st = extra_int(ck, "numel", &r->numel);
    if (!st) st = extra_int(ck, "updates", &r->updates);
    if (!st && (r->shards < 1 || r->shards > 1 << 16 || r->shard < 0 || r->shard >= r->shards || r->offset < 0 ||
                r->len < 0 || r->offset + r->len > r->numel))
        st = ts_error(TS_ERR_FORMAT, "%s: shard %lld of %lld, keys [%lld, +%lld) of %lld: out of range", ck->path,
                      (long long)r->shard, (long long)r->shards, (long long)r->offset, (long long)r->len,
                      (long long)r->numel);
    return st;
}

/* Checks that checkpoint ck, of range r, holds this shard's keys of this
 * model. */
static ts_status check_same(const ts_shard *s, const ts_checkpoint *ck, const saved_range *r) {
    if (r->shard != s->cfg.shard || r->shards != s->cfg.shards || r->offset != s->offset || r->len != s->len ||
        r->numel != s->numel)
        return ts_error(TS_ERR_VALUE, "%s holds shard %lld of %lld, keys [%lld, +%lld) of a %lld-key model; this is "
                        "shard %d of %d, keys [%lld, +%lld) of %lld", ck->path, (long long)r->shard,
                        (long long)r->shards, (long long)r->offset, (long long)r->len, (long long)r->numel,
                        s->cfg.shard, s->cfg.shards, (long long)s->offset, (long long)s->len, (long long)s->numel);
    return TS_OK;
}

/* The folder of shard j's checkpoints, beside this shard's (shard.h). */
static void sibling_root(const ts_shard *s, int j, char *out, size_t cap) {
    const char *slash = strrchr(s->root, '/');
    snprintf(out, cap, "%.*sshard-%d", slash ? (int)(slash - s->root) + 1 : 0, s->root, j);
}

/* Whether the sorted steps[0..n) hold step. */
static bool has_step(const int64_t *steps, int n, int64_t step) {
    for (int i = 0; i < n; i++)
        if (steps[i] == step) return true;
    return false;
}

/* The newest step, at most `upto`, of which each of the shards folders
 * holds a checkpoint; -1 when none. */
static ts_status common_step(const ts_shard *s, int shards, int64_t upto, int64_t *common) {
    *common = -1;
    char root[1200];
    int64_t **steps = calloc((size_t)shards, sizeof *steps);
    int *n = calloc((size_t)shards, sizeof *n);
    ts_status st = steps && n ? TS_OK : ts_error(TS_ERR_MEMORY, "ps: out of memory for %d shards' steps", shards);
    for (int j = 0; !st && j < shards; j++) {
        sibling_root(s, j, root, sizeof root);
        st = ts_checkpoint_list(root, &steps[j], &n[j]);
    }
    for (int i = st ? -1 : n[0] - 1; i >= 0 && *common < 0; i--) {
        bool all = steps[0][i] <= upto;
        for (int j = 1; all && j < shards; j++) all = has_step(steps[j], n[j], steps[0][i]);
        if (all) *common = steps[0][i];
    }
    for (int j = 0; steps && j < shards; j++) free(steps[j]);
    free(steps);
    free(n);
    return st;
}

/* Copies into this shard the keys (and optimizer state) of [lo, hi) that
 * the checkpoint ck of range r holds. */
static ts_status take_overlap(ts_shard *s, const ts_checkpoint *ck, const saved_range *r, int64_t lo, int64_t hi) {
    int64_t n = r->len ? r->len : 1;
    int slots = s->state ? (int)s->state->shape[0] : 0;
    ts_tensor *keys = ts_tensor_zeros(TS_F32, 1, &n);
    ts_tensor *state = slots ? ts_tensor_zeros(TS_F32, 2, (int64_t[]){slots, n}) : NULL;
    ts_status st = !keys || (slots && !state) ? ts_last_status() : TS_OK;
    if (!st) st = ts_safetensors_load_into(ck->model, 1, &KEYS_NAME, &keys, true);
    if (!st && slots)
        st = ck->optim ? ts_safetensors_load_into(ck->optim, 1, &STATE_NAME, &state, true)
                       : ts_error(TS_ERR_VALUE, "%s holds no optimizer state", ck->path);
    if (!st) {
        size_t bytes = (size_t)(hi - lo) * sizeof(float);
        memcpy(ts_f32(s->params) + (lo - s->offset), ts_f32(keys) + (lo - r->offset), bytes);
        for (int k = 0; k < slots; k++)
            memcpy(ts_f32(s->state) + k * s->state->shape[1] + (lo - s->offset),
                   ts_f32(state) + k * n + (lo - r->offset), bytes);
    }
    ts_tensor_release(keys);
    ts_tensor_release(state);
    return st;
}

/* Rebuilds this shard's keys, optimizer state, step, updates and data
 * position from the checkpoints that `shards` shards (another count than
 * the job's) wrote of the newest step at most `upto` they all hold: a job
 * resumed with another parallel.servers. */
static ts_status restore_resharded(ts_shard *s, int shards, int64_t upto, bool *found) {
    int64_t step;
    ts_status st = common_step(s, shards, upto, &step);
    if (st || step < 0)
        return st ? st : ts_error(TS_ERR_STATE, "shard %d: no step of which each of the %d shards of the run's "
                                  "checkpoints holds one", s->cfg.shard, shards);
    char root[1200], dir[1300];
    int64_t covered = 0, updates = -1;
    ts_loader_pos pos = {0, 0};
    for (int j = 0; !st && j < shards; j++) {
        sibling_root(s, j, root, sizeof root);
        snprintf(dir, sizeof dir, "%s/step-%lld", root, (long long)step);
        ts_checkpoint *ck = ts_checkpoint_open(dir);
        saved_range r;
        st = ck ? read_range(ck, &r) : ts_last_status();
        if (!st && (r.shard != j || r.shards != shards || r.numel != s->numel))
            st = ts_error(TS_ERR_VALUE, "%s holds shard %lld of %lld of a %lld-key model, not shard %d of %d of %lld",
                          dir, (long long)r.shard, (long long)r.shards, (long long)r.numel, j, shards,
                          (long long)s->numel);
        if (!st && updates >= 0 && r.updates != updates)
            st = ts_error(TS_ERR_STATE, "%s: %lld optimizer updates, but shard 0's checkpoint of step %lld has %lld",
                          dir, (long long)r.updates, (long long)step, (long long)updates);
        int64_t lo = st ? 0 : r.offset > s->offset ? r.offset : s->offset;
        int64_t hi = st ? 0 : r.offset + r.len < s->offset + s->len ? r.offset + r.len : s->offset + s->len;
        if (!st && hi > lo) st = take_overlap(s, ck, &r, lo, hi);
        if (!st && hi > lo) covered += hi - lo;
        if (!st && j == 0) pos = ck->loader, updates = r.updates;
        ts_checkpoint_close(ck);
    }
    if (!st && covered != s->len)
        st = ts_error(TS_ERR_STATE, "shard %d: the %d shards' checkpoints of step %lld cover %lld of its %lld keys",
                      s->cfg.shard, shards, (long long)step, (long long)covered, (long long)s->len);
    if (st) return st;
    s->step = step;
    s->updates = updates;
    s->pos = pos;
    s->saved_step = step;
    s->last_decided_step = -1;
    shard_clear_stagings(s);
    *found = true;
    printf("shard %d of %d: keys [%lld, %lld) rebuilt from the checkpoints of %d shards of step %lld\n", s->cfg.shard,
           s->cfg.shards, (long long)s->offset, (long long)(s->offset + s->len), shards, (long long)step);
    return TS_OK;
}

/* The folder of the checkpoint of step (-1: the newest) under root into
 * dir ("" when there is none). */
static ts_status find_checkpoint(const char *root, int64_t step, char *dir, size_t cap) {
    dir[0] = '\0';
    if (step < 0) {
        int64_t at;
        return ts_checkpoint_latest(root, dir, cap, &at);
    }
    int64_t *steps = NULL;
    int n = 0;
    ts_status st = ts_checkpoint_list(root, &steps, &n);
    for (int i = 0; !st && i < n; i++)
        if (steps[i] == step) snprintf(dir, cap, "%s/step-%lld", root, (long long)step);
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

/* The shard count of the checkpoint of step (-1: the newest) in root and
 * its step; 0 when root has none. */
static ts_status saved_shards(const char *root, int64_t step, int64_t *shards, int64_t *at) {
    char dir[1200];
    *shards = 0;
    ts_status st = find_checkpoint(root, step, dir, sizeof dir);
    if (st || !dir[0]) return st;
    ts_checkpoint *ck = ts_checkpoint_open(dir);
    saved_range r;
    st = ck ? read_range(ck, &r) : ts_last_status();
    if (!st) *shards = r.shards, *at = ck->step;
    ts_checkpoint_close(ck);
    return st;
}

ts_status ts_shard_restore(ts_shard *s, int64_t step, bool *found) {
    *found = false;
    char dir[1200] = "";
    ts_status st = s->root ? find_checkpoint(s->root, step, dir, sizeof dir) : TS_OK;
    if (st) return st;
    if (!dir[0]) {
        /* this shard's folder has none: the run may have had fewer shards */
        char first[1200];
        int64_t shards = 0, at = -1;
        if (s->root && step != 0) sibling_root(s, 0, first, sizeof first);
        if (s->root && step != 0 && (st = saved_shards(first, step, &shards, &at))) return st;
        if (shards > 0 && shards != s->cfg.shards) return restore_resharded(s, (int)shards, at, found);
        if (step != 0) return TS_OK;
        st = restore_seed(s);
        *found = !st;
        return st;
    }
    ts_checkpoint *ck = ts_checkpoint_open(dir);
    if (!ck) return ts_last_status();
    saved_range r;
    st = read_range(ck, &r);
    if (!st && r.shards != s->cfg.shards) {
        int64_t at = ck->step;
        ts_checkpoint_close(ck);
        return restore_resharded(s, (int)r.shards, at, found);
    }
    if (!st) st = check_same(s, ck, &r);
    if (!st) st = ts_safetensors_load_into(ck->model, 1, &KEYS_NAME, &s->params, true);
    if (!st && s->state) st = ts_safetensors_load_into(ck->optim, 1, &STATE_NAME, &s->state, true);
    if (!st) {
        s->step = ck->step;
        s->updates = r.updates;
        s->pos = ck->loader;
        s->saved_step = ck->step;
        s->last_decided_step = -1;
        shard_clear_stagings(s);
        *found = true;
    }
    ts_checkpoint_close(ck);
    return st;
}
