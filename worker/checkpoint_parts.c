/* checkpoint_parts.c - per-stage checkpoints, their index, and loading by
 * name from them. */
#include "worker/checkpoint_parts.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kernels/io/atomic.h"
#include "kernels/ops/view.h"

/* Parameter names, master values and optimizer-state views ([slots,
 * numel] of each parameter, or NULL without state) of model m; free with
 * table_free. */
typedef struct {
    int n;
    const char **names;
    ts_tensor **values, **state;
    ts_tensor *whole_state;
} table;

static void table_free(table *tb) {
    for (int i = 0; tb->state && i < tb->n; i++) ts_tensor_release(tb->state[i]);
    ts_tensor_release(tb->whole_state);
    free(tb->names);
    free(tb->values);
    free(tb->state);
}

static ts_status table_make(ts_model *m, table *tb) {
    memset(tb, 0, sizeof *tb);
    tb->n = m->n_params;
    tb->names = calloc((size_t)m->n_params + 1, sizeof *tb->names);
    tb->values = calloc((size_t)m->n_params + 1, sizeof *tb->values);
    tb->state = calloc((size_t)m->n_params + 1, sizeof *tb->state);
    if (!tb->names || !tb->values || !tb->state) {
        table_free(tb);
        return ts_error(TS_ERR_MEMORY, "checkpoint parts: out of memory for %d parameters", m->n_params);
    }
    tb->whole_state = m->n_state ? ts_model_state_tensor(m) : NULL;
    for (int i = 0; i < m->n_params; i++) {
        tb->names[i] = m->params[i].name;
        tb->values[i] = m->params[i].value;
        if (tb->whole_state &&
            !(tb->state[i] = ts_narrow(tb->whole_state, 1, m->params[i].offset, m->params[i].numel))) {
            ts_status st = ts_last_status();
            table_free(tb);
            return st;
        }
    }
    return TS_OK;
}

ts_status ts_parts_save_part(ts_trainer *t, int part) {
    char extra[64], root[1200];
    snprintf(extra, sizeof extra, "{\"stage\": %d}", part);
    snprintf(root, sizeof root, "%s/checkpoints/stages/stage-%d", t->run_dir, part);
    table tb;
    ts_status st = table_make(t->model, &tb);
    if (st) return st;
    ts_checkpoint_data d = {
        .step = t->step,
        .n_model = tb.n,
        .model_names = tb.names,
        .model = tb.values,
        .n_optim = tb.whole_state ? tb.n : 0,
        .optim_names = tb.names,
        .optim = tb.state,
        .loader = ts_loader_position(t->loader),
        .config = t->job_text,
        .extra = extra,
    };
    st = ts_checkpoint_save(root, &d, t->job.train.keep_checkpoints + 1, NULL, 0);
    table_free(&tb);
    return st;
}

/* The part folders that the indexes kept under root list, as they list
 * them, into *refs (a JSON array); *refs NULL when a checkpoint there
 * cannot be read, so that no part is known to be unused. */
static ts_status kept_parts(const char *root, json_t **refs) {
    int64_t *steps;
    int n;
    ts_status st = ts_checkpoint_list(root, &steps, &n);
    *refs = st ? NULL : json_array();
    if (!st && !*refs) st = ts_error(TS_ERR_MEMORY, "checkpoint parts: out of memory");
    for (int i = 0; !st && *refs && i < n; i++) {
        char path[1300];
        snprintf(path, sizeof path, "%s/step-%lld/state.json", root, (long long)steps[i]);
        json_t *state = json_load_file(path, 0, NULL);
        json_t *list = json_object_get(json_object_get(state, "extra"), "parts");
        if (!state) {
            json_decref(*refs);
            *refs = NULL;
        } else if (json_is_array(list)) {
            json_array_extend(*refs, list);
        }
        json_decref(state);
    }
    free(steps);
    return st;
}

/* Whether refs lists the part name, or with prefix set a part whose name
 * starts with name. */
static bool listed(json_t *refs, const char *name, bool prefix) {
    size_t i, n = strlen(name);
    json_t *v;
    json_array_foreach(refs, i, v) {
        const char *r = json_string_value(v);
        if (r && (prefix ? !strncmp(r, name, n) : !strcmp(r, name))) return true;
    }
    return false;
}

/* Removes from root/stages/stage-<s> the parts no kept index lists (refs),
 * or the whole folder when none lists anything in it. */
static ts_status prune_stage(const char *root, int s, json_t *refs) {
    char name[128], dir[1300], path[1600];
    snprintf(name, sizeof name, "stages/stage-%d/", s);
    snprintf(dir, sizeof dir, "%s/stages/stage-%d", root, s);
    if (!listed(refs, name, true)) return ts_io_remove_tree(dir);
    DIR *d = opendir(dir);
    if (!d) return ts_error(TS_ERR_IO, "checkpoint parts: cannot list %s: %s", dir, strerror(errno));
    ts_status st = TS_OK;
    struct dirent *e;
    while (!st && (e = readdir(d))) {
        snprintf(name, sizeof name, "stages/stage-%d/%.64s", s, e->d_name);
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (!strncmp(e->d_name, "step-", 5) && !listed(refs, name, false)) st = ts_io_remove_tree(path);
    }
    closedir(d);
    return st;
}

/* Prunes the folders of the stages that this job, of `parts` stages, does
 * not have (stages/stage-<s>, s >= parts: left by a run with more stages,
 * which this one resumed): each keeps only the parts that an index kept
 * under root lists, and goes once none does. The folders of this job's
 * stages prune themselves as they save. */
static ts_status prune_old_stages(const char *root, int parts) {
    json_t *refs;
    ts_status st = kept_parts(root, &refs);
    if (st || !refs) return st;
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/stages", root);
    DIR *d = opendir(dir);
    if (!d) st = errno == ENOENT ? TS_OK : ts_error(TS_ERR_IO, "checkpoint parts: cannot list %s: %s", dir,
                                                     strerror(errno));
    struct dirent *e;
    while (d && !st && (e = readdir(d))) {
        int s = -1, end = 0;
        if (sscanf(e->d_name, "stage-%d%n", &s, &end) == 1 && !e->d_name[end] && s >= parts)
            st = prune_stage(root, s, refs);
    }
    if (d) closedir(d);
    json_decref(refs);
    return st;
}

ts_status ts_parts_save_index(ts_trainer *t, int parts, char *path, size_t cap) {
    json_t *list = json_array(), *extra = json_object();
    for (int i = 0; list && i < parts; i++) {
        char part[64];
        snprintf(part, sizeof part, "stages/stage-%d/step-%lld", i, (long long)t->step);
        json_array_append_new(list, json_string(part));
    }
    char *text = NULL;
    if (list && extra && !json_object_set(extra, "parts", list)) text = json_dumps(extra, JSON_COMPACT);
    json_decref(list);
    json_decref(extra);
    if (!text) return ts_error(TS_ERR_MEMORY, "checkpoint parts: out of memory for the index of %d parts", parts);
    ts_checkpoint_data d = {.step = t->step, .loader = ts_loader_position(t->loader), .config = t->job_text,
                            .extra = text};
    char root[1100];
    snprintf(root, sizeof root, "%s/checkpoints", t->run_dir);
    ts_status st = ts_checkpoint_save(root, &d, t->job.train.keep_checkpoints, path, cap);
    free(text);
    if (!st && t->job.train.keep_checkpoints > 0) st = prune_old_stages(root, parts);
    return st;
}

bool ts_parts_is_index(const ts_checkpoint *ck) { return ck->extra && json_object_get(ck->extra, "parts"); }

/* The folder that holds path, as text (its last component cut; "." for a
 * bare name, path/.. when it ends in . or ..), into out (cap bytes). */
static void parent_of(const char *path, char *out, size_t cap) {
    snprintf(out, cap, "%s", path);
    size_t n = strlen(out);
    while (n > 1 && out[n - 1] == '/') out[--n] = '\0';
    char *slash = strrchr(out, '/');
    const char *last = slash ? slash + 1 : out;
    if (!strcmp(last, ".") || !strcmp(last, "..")) snprintf(out + n, cap - n, "/..");
    else if (!slash) snprintf(out, cap, ".");
    else if (slash == out) out[1] = '\0';
    else *slash = '\0';
}

/* Whether the last component of path is name (trailing slashes aside). */
static bool named(const char *path, const char *name) {
    size_t n = strlen(path), k = strlen(name);
    while (n > 1 && path[n - 1] == '/') n--;
    return n >= k && !strncmp(path + n - k, name, k) && (n == k || path[n - k - 1] == '/');
}

/* The stage whose part ck is: its extra's "stage", or for a part saved
 * without it, s of its folder stages/stage-<s>/step-<k>; -1 when ck is no
 * part. */
static int part_stage(const ts_checkpoint *ck) {
    json_t *s = ck->extra ? json_object_get(ck->extra, "stage") : NULL;
    if (json_is_integer(s)) return (int)json_integer_value(s);
    char stage[2400], stages[2400];
    parent_of(ck->path, stage, sizeof stage);
    parent_of(stage, stages, sizeof stages);
    const char *slash = strrchr(stage, '/'), *last = slash ? slash + 1 : stage;
    int k = -1, end = 0;
    if (named(stages, "stages") && sscanf(last, "stage-%d%n", &k, &end) == 1 && !last[end]) return k;
    return -1;
}

ts_status ts_parts_refuse_part(const ts_checkpoint *ck) {
    int s = part_stage(ck);
    if (s < 0) return TS_OK;
    char stage[2400], stages[2400], root[2400], index[2500];
    parent_of(ck->path, stage, sizeof stage);
    parent_of(stage, stages, sizeof stages);
    parent_of(stages, root, sizeof root);
    if (named(stages, "stages"))
        snprintf(index, sizeof index, "%s/step-%lld", root, (long long)ck->step);
    else
        snprintf(index, sizeof index, "checkpoints/step-%lld of the run folder it comes from", (long long)ck->step);
    return ts_error(TS_ERR_VALUE,
                    "checkpoint %s is stage %d's part of a pipeline checkpoint (that stage's parameters only); give "
                    "its index %s instead, which loads every stage's part",
                    ck->path, s, index);
}

/* Copies into the table's entries not yet loaded (done[i]) those that the
 * part at dir holds: values from its model file, state from its optim
 * file. */
static ts_status load_part(const char *dir, const table *tb, bool *done) {
    ts_checkpoint *ck = ts_checkpoint_open(dir);
    if (!ck) return ts_last_status();
    const char **names = calloc((size_t)tb->n + 1, sizeof *names);
    ts_tensor **values = calloc((size_t)tb->n + 1, sizeof *values), **state = calloc((size_t)tb->n + 1, sizeof *state);
    ts_status st = names && values && state ? TS_OK : ts_error(TS_ERR_MEMORY, "checkpoint parts: out of memory");
    int k = 0;
    for (int i = 0; !st && i < tb->n; i++) {
        if (done[i] || ts_safetensors_find(ck->model, tb->names[i]) < 0) continue;
        if (tb->state[i] && ts_safetensors_find(ck->optim, tb->names[i]) < 0)
            st = ts_error(TS_ERR_FORMAT, "checkpoint %s: no optimizer state for %s", dir, tb->names[i]);
        names[k] = tb->names[i];
        values[k] = tb->values[i];
        state[k++] = tb->state[i];
    }
    if (!st) st = ts_safetensors_load_into(ck->model, k, names, values, false);
    if (!st && k && tb->whole_state) st = ts_safetensors_load_into(ck->optim, k, names, state, false);
    for (int i = 0, j = 0; !st && i < tb->n && j < k; i++)
        if (tb->names[i] == names[j]) done[i] = true, j++;
    free(names);
    free(values);
    free(state);
    ts_checkpoint_close(ck);
    return st;
}

ts_status ts_parts_read_model(const ts_checkpoint *ck, ts_model *m) {
    json_t *parts = json_object_get(ck->extra, "parts");
    if (!json_is_array(parts) || json_array_size(parts) == 0)
        return ts_error(TS_ERR_FORMAT, "checkpoint %s: extra.parts is not a list of part folders", ck->path);
    table tb;
    ts_status st = table_make(m, &tb);
    if (st) return st;
    bool *done = calloc((size_t)tb.n + 1, sizeof *done);
    if (!done) st = ts_error(TS_ERR_MEMORY, "checkpoint parts: out of memory");
    size_t i;
    json_t *v;
    json_array_foreach(parts, i, v) {
        const char *rel = json_string_value(v);
        if (st) break;
        if (!rel || strstr(rel, "..") || rel[0] == '/') {
            st = ts_error(TS_ERR_FORMAT, "checkpoint %s: part %zu is not a folder under checkpoints/", ck->path, i);
            break;
        }
        char up[2400], dir[2600];
        struct stat sb;
        parent_of(ck->path, up, sizeof up);
        snprintf(dir, sizeof dir, "%s/%s", up, rel);
        if (stat(dir, &sb) != 0)
            st = ts_error(TS_ERR_IO,
                          "checkpoint %s is the index of a pipeline checkpoint saved in %zu stage parts, and its part "
                          "%s is missing (%s: %s): copy the run's checkpoints/stages/ folder beside the index, as "
                          "%s/stages",
                          ck->path, json_array_size(parts), rel, dir, strerror(errno), up);
        else
            st = load_part(dir, &tb, done);
    }
    for (int k = 0; !st && k < tb.n; k++)
        if (!done[k]) st = ts_error(TS_ERR_FORMAT, "checkpoint %s: no part holds %s", ck->path, tb.names[k]);
    free(done);
    table_free(&tb);
    return st;
}

ts_status ts_parts_copy_model(ts_model *dst, ts_model *src) {
    table d, s;
    ts_status st = table_make(dst, &d);
    if (st) return st;
    if ((st = table_make(src, &s))) {
        table_free(&d);
        return st;
    }
    for (int i = 0; !st && i < d.n; i++) {
        int j = ts_model_find(src, d.names[i]);
        st = j < 0 ? ts_last_status() : ts_tensor_copy_(d.values[i], s.values[j]);
        if (!st && d.state[i]) st = s.state[j] ? ts_tensor_copy_(d.state[i], s.state[j])
                                               : ts_error(TS_ERR_STATE, "checkpoint parts: no optimizer state to copy");
    }
    table_free(&d);
    table_free(&s);
    return st;
}
