/* weights.c - model parameters from a foreign safetensors file and a name map. */
#include "kernels/io/weights.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/io/safetensors.h"

enum { MAX_CAPTURES = 4, CAPTURE_LEN = 24, NAME_LEN = 256 };

typedef struct {
    char *from, *to;
} rename_rule;

struct ts_name_map {
    char *path;
    int n_prefix, n_rename, n_transpose, n_ignore;
    char **prefix;
    rename_rule *rename;
    char **transpose, **ignore;
};

/* ---- patterns: "{i}" matches a decimal number ---- */

/* Matches name against pattern; the numbers "{i}" matched go to cap[] (in
 * order), their count to *n. */
static bool pattern_match(const char *pattern, const char *name, char cap[MAX_CAPTURES][CAPTURE_LEN], int *n) {
    *n = 0;
    while (*pattern) {
        if (strncmp(pattern, "{i}", 3) == 0) {
            size_t len = strspn(name, "0123456789");
            if (len == 0 || len >= CAPTURE_LEN || *n == MAX_CAPTURES) return false;
            memcpy(cap[*n], name, len);
            cap[(*n)++][len] = '\0';
            name += len;
            pattern += 3;
        } else if (*pattern++ != *name++) {
            return false;
        }
    }
    return *name == '\0';
}

/* Writes pattern with its "{i}"s replaced by cap[0..n) into dst; -1 when it
 * does not fit or asks for more numbers than were matched. */
static int pattern_fill(const char *pattern, char cap[MAX_CAPTURES][CAPTURE_LEN], int n, char *dst, size_t size) {
    size_t k = 0;
    int used = 0;
    for (const char *p = pattern; *p;) {
        const char *piece = p;
        size_t len = 1;
        if (strncmp(p, "{i}", 3) == 0) {
            if (used == n) return -1;
            piece = cap[used++];
            len = strlen(piece);
            p += 3;
        } else {
            p++;
        }
        if (k + len >= size) return -1;
        memcpy(dst + k, piece, len);
        k += len;
    }
    dst[k] = '\0';
    return 0;
}

static bool matches_any(char **patterns, int n, const char *name) {
    char cap[MAX_CAPTURES][CAPTURE_LEN];
    int nc;
    for (int i = 0; i < n; i++)
        if (pattern_match(patterns[i], name, cap, &nc)) return true;
    return false;
}

int ts_name_map_apply(const ts_name_map *map, const char *src, char *dst, size_t size, bool *transpose) {
    *transpose = false;
    if (!map) return snprintf(dst, size, "%s", src) < (int)size ? 1 : -1;
    for (int i = 0; i < map->n_prefix; i++) {
        size_t len = strlen(map->prefix[i]);
        if (strncmp(src, map->prefix[i], len) == 0) {
            src += len;
            break;
        }
    }
    if (matches_any(map->ignore, map->n_ignore, src)) return 0;
    char cap[MAX_CAPTURES][CAPTURE_LEN];
    int nc, done = 0;
    for (int i = 0; i < map->n_rename && !done; i++)
        if (pattern_match(map->rename[i].from, src, cap, &nc)) {
            if (pattern_fill(map->rename[i].to, cap, nc, dst, size)) return -1;
            done = 1;
        }
    if (!done && snprintf(dst, size, "%s", src) >= (int)size) return -1;
    *transpose = matches_any(map->transpose, map->n_transpose, dst);
    return 1;
}

/* ---- loading the map ---- */

void ts_name_map_free(ts_name_map *map) {
    if (!map) return;
    for (int i = 0; i < map->n_prefix; i++) free(map->prefix[i]);
    for (int i = 0; i < map->n_rename; i++) {
        free(map->rename[i].from);
        free(map->rename[i].to);
    }
    for (int i = 0; i < map->n_transpose; i++) free(map->transpose[i]);
    for (int i = 0; i < map->n_ignore; i++) free(map->ignore[i]);
    free(map->prefix);
    free(map->rename);
    free(map->transpose);
    free(map->ignore);
    free(map->path);
    free(map);
}

/* Copies the array of strings doc[key] (absent: empty) into *out. */
static ts_status string_list(const char *path, json_t *doc, const char *key, char ***out, int *n) {
    json_t *a = json_object_get(doc, key);
    *n = 0;
    if (!a) return TS_OK;
    if (!json_is_array(a)) return ts_error(TS_ERR_FORMAT, "name map %s: %s: expected an array of strings", path, key);
    *out = calloc(json_array_size(a) + 1, sizeof **out);
    if (!*out) return ts_error(TS_ERR_MEMORY, "name map %s: out of memory", path);
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v) {
        if (!json_is_string(v) || json_string_length(v) == 0)
            return ts_error(TS_ERR_FORMAT, "name map %s: %s[%zu]: expected a non-empty string", path, key, i);
        if (!((*out)[(*n)++] = strdup(json_string_value(v))))
            return ts_error(TS_ERR_MEMORY, "name map %s: out of memory", path);
    }
    return TS_OK;
}

static ts_status rename_rules(ts_name_map *map, json_t *doc) {
    json_t *o = json_object_get(doc, "rename");
    if (!o) return TS_OK;
    if (!json_is_object(o))
        return ts_error(TS_ERR_FORMAT, "name map %s: rename: expected an object of name patterns", map->path);
    map->rename = calloc(json_object_size(o) + 1, sizeof *map->rename);
    if (!map->rename) return ts_error(TS_ERR_MEMORY, "name map %s: out of memory", map->path);
    const char *from;
    json_t *to;
    json_object_foreach(o, from, to) {
        if (!json_is_string(to) || json_string_length(to) == 0 || !*from)
            return ts_error(TS_ERR_FORMAT, "name map %s: rename.%s: expected a non-empty string", map->path, from);
        rename_rule *r = &map->rename[map->n_rename++];
        r->from = strdup(from);
        r->to = strdup(json_string_value(to));
        if (!r->from || !r->to) return ts_error(TS_ERR_MEMORY, "name map %s: out of memory", map->path);
    }
    return TS_OK;
}

ts_name_map *ts_name_map_load(const char *path) {
    json_error_t jerr;
    json_t *doc = json_load_file(path, 0, &jerr);
    if (!doc) {
        ts_error(TS_ERR_FORMAT, "name map %s: line %d: %s", path, jerr.line, jerr.text);
        return NULL;
    }
    ts_name_map *map = calloc(1, sizeof *map);
    ts_status st = map && (map->path = strdup(path)) ? TS_OK : ts_error(TS_ERR_MEMORY, "name map: out of memory");
    const char *fmt = json_string_value(json_object_get(doc, "format"));
    if (!st && !json_is_object(doc)) st = ts_error(TS_ERR_FORMAT, "name map %s: not a JSON object", path);
    if (!st && (!fmt || strcmp(fmt, "tessera-name-map") != 0))
        st = ts_error(TS_ERR_FORMAT, "name map %s: format: expected \"tessera-name-map\"", path);
    if (!st && json_integer_value(json_object_get(doc, "version")) != 1)
        st = ts_error(TS_ERR_FORMAT, "name map %s: version: expected 1", path);
    const char *key;
    json_t *v;
    json_object_foreach(doc, key, v) {
        if (!st && strcmp(key, "format") && strcmp(key, "version") && strcmp(key, "description") &&
            strcmp(key, "strip_prefix") && strcmp(key, "rename") && strcmp(key, "transpose") && strcmp(key, "ignore"))
            st = ts_error(TS_ERR_FORMAT, "name map %s: unknown field '%s'", path, key);
    }
    if (!st) st = string_list(path, doc, "strip_prefix", &map->prefix, &map->n_prefix);
    if (!st) st = rename_rules(map, doc);
    if (!st) st = string_list(path, doc, "transpose", &map->transpose, &map->n_transpose);
    if (!st) st = string_list(path, doc, "ignore", &map->ignore, &map->n_ignore);
    json_decref(doc);
    if (st) {
        ts_name_map_free(map);
        return NULL;
    }
    return map;
}

/* ---- loading the weights ---- */

/* Where each model parameter's values come from. */
typedef struct {
    int entry;      /* index into the file's entries */
    bool transpose; /* the file holds its transpose */
} source;

/* The error for file tensor `file_name` of st, `name` after the map, that
 * names no parameter of the model. */
static ts_status not_a_parameter(const ts_safetensors *st, const char *file_name, const char *name) {
    bool mapped = strcmp(name, file_name) != 0;
    return ts_error(TS_ERR_VALUE, "init_from %s: tensor '%s'%s%s%s is not a parameter of the model", st->path,
                    file_name, mapped ? " (mapped to '" : "", mapped ? name : "", mapped ? "')" : "");
}

/* The error for file tensor e of st, parameter `name` of the model, whose
 * element at row-major index i has the value v, not a finite f32. */
static ts_status not_finite(const ts_safetensors *st, const ts_safetensors_entry *e, const char *name, int64_t i,
                            double v) {
    int64_t at[TS_MAX_DIMS];
    for (int d = e->ndim - 1; d >= 0; d--) {
        at[d] = i % e->shape[d];
        i /= e->shape[d];
    }
    return ts_error(TS_ERR_VALUE,
                    "init_from %s: tensor '%s' (%s %s, for the model's '%s') holds %g at %s, not a finite f32: a "
                    "parameter must be finite", st->path, e->name, ts_safetensors_dtype_str(e->dtype),
                    ts_dims_str(e->ndim, e->shape), name, v, ts_dims_str(e->ndim, at));
}

/* Finds the source of every parameter of m in st through map; checks names,
 * shapes and dtypes. */
static ts_status match_entries(const ts_model *m, const ts_safetensors *st, const ts_name_map *map, bool strict,
                               source *src) {
    const char *via = map ? " (after the name map)" : "";
    if (st->n == 0 && m->n_params > 0) /* e.g. the index of a checkpoint in parts */
        return ts_error(TS_ERR_VALUE, "init_from %s holds no tensors (a checkpoint saved in parts, a pipeline's "
                        "stages or an fsdp run's shards, keeps none there: tessera-run --consolidate its folder "
                        "writes them in one)", st->path);
    for (int i = 0; i < m->n_params; i++) src[i].entry = -1;
    for (int k = 0; k < st->n; k++) {
        const ts_safetensors_entry *e = &st->entries[k];
        char name[NAME_LEN];
        bool tr;
        int r = ts_name_map_apply(map, e->name, name, sizeof name, &tr);
        if (r < 0) return ts_error(TS_ERR_VALUE, "init_from %s: tensor '%s': the mapped name is too long", st->path, e->name);
        if (r == 0) continue;
        int p = -1;
        for (int i = 0; i < m->n_params && p < 0; i++)
            if (strcmp(m->params[i].name, name) == 0) p = i;
        if (p < 0) {
            if (!strict) continue;
            return not_a_parameter(st, e->name, name);
        }
        if (src[p].entry >= 0)
            return ts_error(TS_ERR_VALUE, "init_from %s: tensors '%s' and '%s' both give parameter '%s'", st->path,
                            st->entries[src[p].entry].name, e->name, name);
        const ts_param *pa = &m->params[p];
        int64_t shape[TS_MAX_DIMS];
        for (int d = 0; d < e->ndim; d++) shape[d] = e->shape[tr ? e->ndim - 1 - d : d];
        if (tr && e->ndim != 2)
            return ts_error(TS_ERR_SHAPE, "init_from %s: tensor '%s' %s is to be transposed into '%s' but is not a matrix",
                            st->path, e->name, ts_dims_str(e->ndim, e->shape), name);
        if (e->ndim != pa->ndim || memcmp(shape, pa->shape, sizeof(int64_t) * (size_t)pa->ndim))
            return ts_error(TS_ERR_SHAPE, "init_from %s: tensor '%s' has shape %s%s in the file but the model's '%s' is %s",
                            st->path, e->name, ts_dims_str(e->ndim, e->shape), tr ? " (transposed)" : "", name,
                            ts_dims_str(pa->ndim, pa->shape));
        if (e->dtype != TS_F32 && e->dtype != TS_F64 && e->dtype != TS_BF16 && e->dtype != TS_SAFETENSORS_F16)
            return ts_error(TS_ERR_DTYPE,
                            "init_from %s: tensor '%s' has dtype %s, not a floating type (F32, F64, BF16, F16)",
                            st->path, e->name, ts_safetensors_dtype_str(e->dtype));
        double v;
        int64_t bad = ts_safetensors_nonfinite(st, k, &v);
        if (bad >= 0) return not_finite(st, e, name, bad, v);
        src[p] = (source){k, tr};
    }
    int first = -1, missing = 0;
    for (int i = 0; i < m->n_params; i++)
        if (src[i].entry < 0 && missing++ == 0) first = i;
    if (missing == 1)
        return ts_error(TS_ERR_VALUE, "init_from %s: no tensor%s for the model's parameter '%s' %s", st->path, via,
                        m->params[first].name, ts_dims_str(m->params[first].ndim, m->params[first].shape));
    if (missing > 1)
        return ts_error(TS_ERR_VALUE, "init_from %s: no tensor%s for the model's parameter '%s' %s nor for %d more: "
                        "the file gives %d of the model's %d parameters (a part of a checkpoint saved in parts, "
                        "such as a pipeline stage's, holds only its own: tessera-run --consolidate its checkpoint "
                        "folder writes them in one)", st->path, via, m->params[first].name,
                        ts_dims_str(m->params[first].ndim, m->params[first].shape), missing - 1,
                        m->n_params - missing, m->n_params);
    return TS_OK;
}

/* Copies entry e (transposed when asked; F16 as f32) into parameter p. */
static ts_status copy_entry(const ts_safetensors *st, const source *s, ts_param *p) {
    ts_tensor *t = ts_safetensors_tensor(st, s->entry);
    if (t && s->transpose) { /* a [b, a] view of the [a, b] data */
        int64_t shape[2] = {t->shape[1], t->shape[0]}, strides[2] = {1, t->shape[1]};
        ts_tensor *view = ts_tensor_from_storage(t->storage, t->dtype, 0, 2, shape, strides);
        ts_tensor_release(t);
        t = view;
    }
    if (!t) return ts_last_status();
    ts_status st2 = ts_tensor_copy_(p->value, t);
    ts_tensor_release(t);
    return st2;
}

ts_status ts_weights_load(ts_model *m, const char *path, const char *map_path, bool strict) {
    if (!m->finalized) return ts_error(TS_ERR_STATE, "init_from %s: the model is not finalized", path);
    ts_name_map *map = NULL;
    if (map_path && *map_path && !(map = ts_name_map_load(map_path))) return ts_last_status();
    ts_safetensors *st = ts_safetensors_open(path);
    source *src = calloc((size_t)m->n_params + 1, sizeof *src);
    ts_status s = !st ? ts_last_status() : src ? TS_OK : ts_error(TS_ERR_MEMORY, "init_from %s: out of memory", path);
    if (!s) s = match_entries(m, st, map, strict, src);
    for (int i = 0; !s && i < m->n_params; i++) s = copy_entry(st, &src[i], &m->params[i]);
    if (!s) s = ts_model_sync_compute(m);
    free(src);
    ts_safetensors_close(st);
    ts_name_map_free(map);
    return s;
}

ts_status ts_weights_check_names(const char *path, const char *map_path, char *const *names, int n) {
    ts_name_map *map = NULL;
    if (map_path && *map_path && !(map = ts_name_map_load(map_path))) return ts_last_status();
    ts_safetensors *st = ts_safetensors_open(path);
    ts_status s = st ? TS_OK : ts_last_status();
    for (int k = 0; !s && k < st->n; k++) {
        char name[NAME_LEN];
        bool tr, known = false;
        int r = ts_name_map_apply(map, st->entries[k].name, name, sizeof name, &tr);
        for (int i = 0; r > 0 && i < n && !known; i++) known = strcmp(names[i], name) == 0;
        if (r > 0 && !known) s = not_a_parameter(st, st->entries[k].name, name);
    }
    ts_safetensors_close(st);
    ts_name_map_free(map);
    return s;
}
