/* fsdp_checkpoint.c - the files of sharded checkpoints and reading them at
 * any world size. */
#include "worker/fsdp_checkpoint.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/io/safetensors.h"

char *ts_fsdp_layout_json(const ts_fsdp_layout *l) {
    json_t *units = json_array();
    for (int u = 0; u < l->n_units; u++)
        json_array_append_new(units, json_pack("[I,I]", (json_int_t)l->units[u].offset,
                                               (json_int_t)(l->units[u].offset + l->units[u].len)));
    json_t *root = json_pack("{s:{s:i, s:I, s:i, s:o}}", "fsdp", "world", l->world, "numel", (json_int_t)l->numel,
                             "slots", l->slots, "units", units);
    char *text = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    if (!text) ts_error(TS_ERR_MEMORY, "fsdp checkpoint: out of memory for the layout of %d units", l->n_units);
    return text;
}

void ts_fsdp_layout_free(ts_fsdp_layout *l) {
    free(l->units);
    l->units = NULL;
    l->n_units = 0;
}

/* Checks that the units lie in [0, numel) in order without overlaps. */
static ts_status check_units(const ts_fsdp_layout *l, const char *path) {
    int64_t end = 0;
    for (int u = 0; u < l->n_units; u++) {
        const ts_range *r = &l->units[u];
        if (r->offset < end || r->len < 0 || r->offset + r->len > l->numel)
            return ts_error(TS_ERR_FORMAT, "checkpoint %s: fsdp unit %d [%lld, %lld) is out of order or outside [0, %lld)",
                            path, u, (long long)r->offset, (long long)(r->offset + r->len), (long long)l->numel);
        end = r->offset + r->len;
    }
    return TS_OK;
}

ts_status ts_fsdp_layout_read(const ts_checkpoint *ck, ts_fsdp_layout *l, bool *sharded) {
    memset(l, 0, sizeof *l);
    json_t *f = ck->extra ? json_object_get(ck->extra, "fsdp") : NULL;
    *sharded = f != NULL;
    if (!f) return TS_OK;
    json_t *units = json_object_get(f, "units");
    json_int_t world = json_integer_value(json_object_get(f, "world"));
    json_int_t slots = json_integer_value(json_object_get(f, "slots"));
    json_int_t numel = json_integer_value(json_object_get(f, "numel"));
    if (!json_is_array(units) || world < 1 || world > 1 << 20 || slots < 0 || slots > 8 || numel < 0)
        return ts_error(TS_ERR_FORMAT, "checkpoint %s: extra.fsdp needs world >= 1, slots, numel and units", ck->path);
    l->world = (int)world;
    l->slots = (int)slots;
    l->numel = numel;
    l->n_units = (int)json_array_size(units);
    l->units = calloc((size_t)l->n_units + 1, sizeof *l->units);
    if (!l->units) return ts_error(TS_ERR_MEMORY, "checkpoint %s: out of memory for %d units", ck->path, l->n_units);
    for (int u = 0; u < l->n_units; u++) {
        json_t *r = json_array_get(units, (size_t)u);
        json_t *a = json_array_get(r, 0), *b = json_array_get(r, 1);
        if (json_array_size(r) != 2 || !json_is_integer(a) || !json_is_integer(b)) {
            ts_fsdp_layout_free(l);
            return ts_error(TS_ERR_FORMAT, "checkpoint %s: extra.fsdp.units[%d] is not [lo, hi]", ck->path, u);
        }
        l->units[u] = (ts_range){json_integer_value(a), json_integer_value(b) - json_integer_value(a)};
    }
    ts_status st = check_units(l, ck->path);
    if (st) ts_fsdp_layout_free(l);
    return st;
}

void ts_fsdp_shard_name(int r, char *name, size_t cap) { snprintf(name, cap, "shard-%d.safetensors", r); }

/* The real elements of rank r's shards over all units. */
static int64_t shard_total(const ts_fsdp_layout *l, int r) {
    int64_t n = 0;
    for (int u = 0; u < l->n_units; u++) n += ts_plan_shard_range(l->units[u].len, l->world, r).len;
    return n;
}

ts_status ts_fsdp_write_shard(const char *dir, const ts_fsdp_layout *l, int r, int64_t step, const float *params,
                              const float *state, int64_t stride, const int64_t *at) {
    int64_t n = shard_total(l, r);
    ts_tensor *p = ts_tensor_zeros(TS_F32, 1, (int64_t[]){n ? n : 1});
    ts_tensor *s = ts_tensor_zeros(TS_F32, 2, (int64_t[]){l->slots ? l->slots : 1, n ? n : 1});
    if (!p || !s) {
        ts_tensor_release(p);
        ts_tensor_release(s);
        return ts_last_status();
    }
    float *pd = ts_f32(p), *sd = ts_f32(s);
    int64_t k = 0;
    for (int u = 0; u < l->n_units; u++) {
        int64_t len = ts_plan_shard_range(l->units[u].len, l->world, r).len;
        memcpy(pd + k, params + at[u], (size_t)len * sizeof(float));
        for (int j = 0; state && j < l->slots; j++)
            memcpy(sd + (int64_t)j * n + k, state + j * stride + at[u], (size_t)len * sizeof(float));
        k += len;
    }
    char name[64], path[1200], stepv[32], rankv[16];
    ts_fsdp_shard_name(r, name, sizeof name);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(stepv, sizeof stepv, "%lld", (long long)step);
    snprintf(rankv, sizeof rankv, "%d", r);
    const char *names[2] = {"params", "state"}, *mk[2] = {"step", "rank"}, *mv[2] = {stepv, rankv};
    ts_tensor *t[2] = {p, s};
    ts_status st = ts_safetensors_write(path, 2, names, t, 2, mk, mv);
    ts_tensor_release(p);
    ts_tensor_release(s);
    return st;
}

/* Opens rank r's file of ck and finds its params and state entries,
 * checking their sizes against the layout. */
static ts_status open_shard(const ts_checkpoint *ck, const ts_fsdp_layout *l, int r, ts_safetensors **out,
                            const float **params, const float **state) {
    char name[64], path[1200];
    ts_fsdp_shard_name(r, name, sizeof name);
    snprintf(path, sizeof path, "%s/%s", ck->path, name);
    ts_safetensors *sf = ts_safetensors_open(path);
    if (!sf) return ts_last_status();
    int64_t n = shard_total(l, r);
    int ip = ts_safetensors_find(sf, "params"), is = ts_safetensors_find(sf, "state");
    if (ip < 0 || is < 0 || sf->entries[ip].dtype != TS_F32 || sf->entries[is].dtype != TS_F32 ||
        sf->entries[ip].end - sf->entries[ip].begin < (uint64_t)n * 4 ||
        sf->entries[is].end - sf->entries[is].begin < (uint64_t)(n * l->slots) * 4) {
        ts_safetensors_close(sf);
        return ts_error(TS_ERR_FORMAT, "checkpoint: %s does not hold f32 params [%lld] and state [%d, %lld]", path,
                        (long long)n, l->slots, (long long)n);
    }
    *out = sf;
    *params = (const float *)(sf->data + sf->entries[ip].begin);
    *state = (const float *)(sf->data + sf->entries[is].begin);
    return TS_OK;
}

ts_status ts_fsdp_read_range(const ts_checkpoint *ck, const ts_fsdp_layout *l, int64_t lo, int64_t len,
                             float *params, float *state, int64_t stride) {
    ts_status st = TS_OK;
    int64_t hi = lo + len;
    for (int r = 0; !st && r < l->world; r++) {
        ts_safetensors *sf = NULL;
        const float *sp = NULL, *ss = NULL;
        int64_t n = shard_total(l, r), k = 0; /* k: where unit u's part starts in the file */
        for (int u = 0; !st && u < l->n_units; u++) {
            ts_range own = ts_plan_shard_range(l->units[u].len, l->world, r);
            int64_t a = l->units[u].offset + own.offset, b = a + own.len;
            int64_t x = a > lo ? a : lo, y = b < hi ? b : hi;
            if (y > x && !sf) st = open_shard(ck, l, r, &sf, &sp, &ss);
            if (y > x && !st) {
                memcpy(params + (x - lo), sp + k + (x - a), (size_t)(y - x) * sizeof(float));
                for (int j = 0; state && j < l->slots; j++)
                    memcpy(state + j * stride + (x - lo), ss + j * n + k + (x - a), (size_t)(y - x) * sizeof(float));
            }
            k += own.len;
        }
        ts_safetensors_close(sf);
    }
    return st;
}

ts_status ts_fsdp_read_model(const ts_checkpoint *ck, ts_model *m) {
    ts_fsdp_layout l;
    bool sharded;
    ts_status st = ts_fsdp_layout_read(ck, &l, &sharded);
    if (st) return st;
    if (!sharded) return ts_error(TS_ERR_FORMAT, "checkpoint %s is not sharded", ck->path);
    if (l.numel != m->numel)
        st = ts_error(TS_ERR_SHAPE, "checkpoint %s: the shards hold %lld parameters, the model has %lld", ck->path,
                      (long long)l.numel, (long long)m->numel);
    else if (m->state && l.slots != m->n_state)
        st = ts_error(TS_ERR_SHAPE, "checkpoint %s: %d optimizer state slots, the optimizer has %d", ck->path, l.slots,
                      m->n_state);
    /* read in host memory: the model's buffers, or copies of them for a
     * model on a GPU, which then go up */
    bool host = m->device.type == TS_DEVICE_CPU;
    int64_t n_state = (int64_t)m->n_state * m->numel;
    ts_tensor *p = NULL, *s = NULL;
    if (!st) {
        p = host ? ts_tensor_retain(m->flat_params) : ts_tensor_empty(TS_F32, 1, &m->numel);
        s = !m->state ? NULL : host ? ts_tensor_retain(m->state_buf) : ts_tensor_empty(TS_F32, 1, &n_state);
        if (!p || (m->state && !s)) st = ts_last_status();
    }
    if (!st) st = ts_fsdp_read_range(ck, &l, 0, m->numel, ts_f32(p), s ? ts_f32(s) : NULL, m->numel);
    if (!st && !host) st = ts_tensor_copy_(m->flat_params, p);
    if (!st && !host && s) st = ts_tensor_copy_(m->state_buf, s);
    ts_tensor_release(p);
    ts_tensor_release(s);
    ts_fsdp_layout_free(&l);
    return st;
}
