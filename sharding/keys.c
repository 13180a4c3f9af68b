/* keys.c - the parameter servers' key table, its re-planning, and chains. */
#include "sharding/keys.h"

#include <stdlib.h>
#include <string.h>

ts_status ts_keys_plan(const ts_range *tensors, int n, int64_t numel, int shards, ts_range *out) {
    if (numel < 0 || shards < 1 || n < 0)
        return ts_error(TS_ERR_VALUE, "keys: cannot split %lld keys of %d tensors over %d shards", (long long)numel, n,
                        shards);
    for (int i = 0; i < n; i++) {
        const ts_range *t = &tensors[i];
        if (t->offset < (i ? tensors[i - 1].offset + tensors[i - 1].len : 0) || t->len < 0 ||
            t->offset + t->len > numel)
            return ts_error(TS_ERR_VALUE, "keys: tensor %d [%lld, +%lld) overlaps the one before or leaves [0, %lld)",
                            i, (long long)t->offset, (long long)t->len, (long long)numel);
    }
    int64_t fair = numel / shards, tol = fair / 8, prev = 0;
    for (int b = 1; b < shards; b++) {
        int64_t ideal = numel / shards * b + numel % shards * b / shards, best = -1, dist = INT64_MAX;
        for (int i = 0; i < n; i++) {
            int64_t edges[2] = {tensors[i].offset, tensors[i].offset + tensors[i].len};
            for (int e = 0; e < 2; e++) {
                int64_t d = edges[e] > ideal ? edges[e] - ideal : ideal - edges[e];
                if (d < dist && edges[e] > prev) best = edges[e], dist = d;
            }
        }
        int64_t cut = best >= 0 && dist <= tol ? best : ideal & ~(int64_t)15;
        if (cut < prev) cut = prev;
        out[b - 1] = (ts_range){prev, cut - prev};
        prev = cut;
    }
    out[shards - 1] = (ts_range){prev, numel - prev};
    return TS_OK;
}

/* ---- re-planning ---- */

/* A growable list of pieces or moves. */
typedef struct {
    ts_keys_piece *p;
    int n, cap;
    ts_keys_move *m;
    int nm, capm;
} plan_out;

static ts_status add_piece(plan_out *o, int64_t offset, int64_t len, int shard) {
    if (len <= 0) return TS_OK;
    if (o->n == o->cap) {
        int cap = o->cap ? 2 * o->cap : 16;
        ts_keys_piece *p = realloc(o->p, (size_t)cap * sizeof *p);
        if (!p) return ts_error(TS_ERR_MEMORY, "keys: out of memory for %d pieces", cap);
        o->p = p, o->cap = cap;
    }
    o->p[o->n++] = (ts_keys_piece){offset, len, shard};
    return TS_OK;
}

static ts_status add_move(plan_out *o, int64_t offset, int64_t len, int from, int to) {
    if (o->nm == o->capm) {
        int cap = o->capm ? 2 * o->capm : 16;
        ts_keys_move *m = realloc(o->m, (size_t)cap * sizeof *m);
        if (!m) return ts_error(TS_ERR_MEMORY, "keys: out of memory for %d moves", cap);
        o->m = m, o->capm = cap;
    }
    o->m[o->nm++] = (ts_keys_move){offset, len, from, to};
    return TS_OK;
}

static int by_offset(const void *a, const void *b) {
    int64_t x = ((const ts_keys_piece *)a)->offset, y = ((const ts_keys_piece *)b)->offset;
    return x < y ? -1 : x > y;
}

/* Ends a re-planning that came to st: on success sorts the pieces by
 * offset, joins neighbours held by one shard and hands the result to the
 * caller; on failure frees it. */
static ts_status finish(ts_status st, plan_out *o, ts_keys_piece **out, int *n_out, ts_keys_move **moves,
                        int *n_moves) {
    if (st) {
        free(o->p);
        free(o->m);
        return st;
    }
    qsort(o->p, (size_t)o->n, sizeof *o->p, by_offset);
    int k = 0;
    for (int i = 0; i < o->n; i++) {
        if (k && o->p[k - 1].shard == o->p[i].shard && o->p[k - 1].offset + o->p[k - 1].len == o->p[i].offset)
            o->p[k - 1].len += o->p[i].len;
        else
            o->p[k++] = o->p[i];
    }
    *out = o->p, *n_out = k, *moves = o->m, *n_moves = o->nm;
    return TS_OK;
}

/* Checks that table covers [0, numel) in order with shards in [0, shards);
 * returns numel through *numel and each shard's total in totals. */
static ts_status check_table(const ts_keys_piece *t, int n, int shards, int64_t *numel, int64_t *totals) {
    int64_t next = 0;
    memset(totals, 0, (size_t)shards * sizeof *totals);
    for (int i = 0; i < n; i++) {
        if (t[i].offset != next || t[i].len < 0 || t[i].shard < 0 || t[i].shard >= shards)
            return ts_error(TS_ERR_VALUE, "keys: piece %d [%lld, +%lld) of shard %d does not follow key %lld of a "
                            "table of %d shards", i, (long long)t[i].offset, (long long)t[i].len, t[i].shard,
                            (long long)next, shards);
        next += t[i].len;
        totals[t[i].shard] += t[i].len;
    }
    *numel = next;
    return TS_OK;
}

ts_status ts_keys_add_shard(const ts_keys_piece *table, int n, int shards, ts_keys_piece **out, int *n_out,
                            ts_keys_move **moves, int *n_moves) {
    if (shards < 1) return ts_error(TS_ERR_VALUE, "keys: a table of %d shards cannot grow", shards);
    int64_t numel, *excess = malloc((size_t)shards * sizeof *excess);
    if (!excess) return ts_error(TS_ERR_MEMORY, "keys: out of memory");
    ts_status st = check_table(table, n, shards, &numel, excess);
    int64_t fair = numel / (shards + 1);
    for (int s = 0; s < shards; s++) excess[s] = excess[s] > fair ? excess[s] - fair : 0;
    plan_out o = {0};
    /* walk from the top: each shard gives the highest keys of its excess */
    for (int i = n - 1; !st && i >= 0; i--) {
        const ts_keys_piece *p = &table[i];
        int64_t give = p->len < excess[p->shard] ? p->len : excess[p->shard];
        excess[p->shard] -= give;
        st = add_piece(&o, p->offset, p->len - give, p->shard);
        if (!st && give) st = add_piece(&o, p->offset + p->len - give, give, shards);
        if (!st && give) st = add_move(&o, p->offset + p->len - give, give, p->shard, shards);
    }
    free(excess);
    return finish(st, &o, out, n_out, moves, n_moves);
}

ts_status ts_keys_remove_shard(const ts_keys_piece *table, int n, int shards, int gone, ts_keys_piece **out,
                               int *n_out, ts_keys_move **moves, int *n_moves) {
    if (shards < 2 || gone < 0 || gone >= shards)
        return ts_error(TS_ERR_VALUE, "keys: cannot remove shard %d of %d", gone, shards);
    int64_t numel, *deficit = malloc((size_t)shards * sizeof *deficit);
    if (!deficit) return ts_error(TS_ERR_MEMORY, "keys: out of memory");
    ts_status st = check_table(table, n, shards, &numel, deficit);
    int64_t fair = (numel + shards - 2) / (shards - 1); /* rounded up: the deficits hold every key */
    for (int s = 0; s < shards; s++) deficit[s] = s == gone || deficit[s] >= fair ? 0 : fair - deficit[s];
    plan_out o = {0};
    int to = 0;
    for (int i = 0; !st && i < n; i++) {
        const ts_keys_piece *p = &table[i];
        if (p->shard != gone) {
            st = add_piece(&o, p->offset, p->len, p->shard - (p->shard > gone));
            continue;
        }
        for (int64_t at = p->offset, left = p->len; !st && left > 0;) {
            while (to < shards && deficit[to] == 0) to++;
            if (to == shards) { /* an unbalanced table can leave keys over: the last shard takes them */
                to = gone == shards - 1 ? shards - 2 : shards - 1;
                deficit[to] = left;
            }
            int64_t take = left < deficit[to] ? left : deficit[to];
            deficit[to] -= take;
            st = add_piece(&o, at, take, to - (to > gone));
            if (!st) st = add_move(&o, at, take, gone, to);
            at += take, left -= take;
        }
    }
    free(deficit);
    return finish(st, &o, out, n_out, moves, n_moves);
}

/* ---- chains ---- */

/* Whether a joined before b (generation, then rank). */
static bool earlier(const ts_keys_server *a, const ts_keys_server *b) {
    return a->joined < b->joined || (a->joined == b->joined && a->rank < b->rank);
}

void ts_keys_chains(const ts_keys_server *servers, int n, int shards, int *primary, int *backup) {
    for (int k = 0; k < shards; k++) {
        const ts_keys_server *first = NULL, *second = NULL;
        for (int i = 0; i < n; i++) {
            const ts_keys_server *s = &servers[i];
            if (s->rank < 0 || s->rank % shards != k) continue;
            if (!first || earlier(s, first)) {
                second = first;
                first = s;
            } else if (!second || earlier(s, second)) {
                second = s;
            }
        }
        primary[k] = first ? first->rank : -1;
        backup[k] = second && second->joined == first->joined ? second->rank : -1;
    }
}
