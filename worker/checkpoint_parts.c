/* checkpoint_parts.c - per-stage checkpoints, their index, and loading by
 * name from them. */
#include "worker/checkpoint_parts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    };
    char root[1200];
    snprintf(root, sizeof root, "%s/checkpoints/stages/stage-%d", t->run_dir, part);
    st = ts_checkpoint_save(root, &d, t->job.train.keep_checkpoints + 1, NULL, 0);
    table_free(&tb);
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
    return st;
}

bool ts_parts_is_index(const ts_checkpoint *ck) { return ck->extra && json_object_get(ck->extra, "parts"); }

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
        char dir[2400];
        snprintf(dir, sizeof dir, "%s/../%s", ck->path, rel);
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
