/* snapshot.c - a shard's whole state as three flat arrays, and a shard made
 * from them: how a spare takes its primary's state and becomes its backup
 * (contract in shard.h).
 *
 * The record (int64): the fixed fields below, then per worker its
 * bookkeeping and coverage. The values (f64): the decided step's values and
 * learning rate, the last decided values, the last reduction's sums, then
 * per worker its commit values and open reduction. The stream (f32): the
 * parameters, the optimizer state, the decided gradient (sync, decided
 * only), then each staged worker's staging. Staging buffers that hold no
 * step are not sent; a worker's `who` is not either (the next message from
 * it says where it is).
 */
#include <stdlib.h>
#include <string.h>

#include "ps/internal.h"

/* The record's fixed fields. */
enum {
    R_MAGIC, R_OFFSET, R_LEN, R_SLOTS, R_NW, R_FLOATS, R_STEP, R_UPDATES, R_SAVED, R_EPOCH, R_POS,
    R_WSET_GEN, R_DECIDED, R_DECIDED_STEP, R_DECIDED_GEN, R_DECIDED_EPOCH, R_DECIDED_POS, R_LAST_DECIDED,
    R_REDUCING, R_RED_STEP, R_RED_ID, R_RED_N, R_RED_GEN, R_LEFT_GEN, R_LAST_RED_STEP, R_LAST_RED_ID, R_LAST_RED_N,
    R_FIXED
};
/* A worker's fields, followed by 2 * ncover span bounds. */
enum { W_RANK, W_LIVE, W_STEP, W_COMMITTED, W_WAITING, W_DONE, W_JOINED_AT, W_JOINED_GEN, W_COVERED, W_STAGED, W_REDUCED,
       W_RED_WAITING, W_NCOVER, W_FIXED };
/* "TSS2": a snapshot of this layout. */
#define SNAP_MAGIC 0x54535332
/* Limits a record is checked against: workers, values of a reduction, spans. */
#define SNAP_MAX 0x100000

/* Whether worker w's staging holds a step (and so travels). */
static bool staged(const shard_worker *w) { return w->stage && w->step >= 0; }

static int slots_of(const ts_shard *s) { return ts_optim_state_slots(&s->optim); }

void ts_shard_snapshot_size(const ts_shard *s, ts_shard_state *st) {
    st->nhead = R_FIXED;
    st->nvalues = 2 * TS_DECIDED_VALUES + 1 + (size_t)s->last_red_n;
    st->ndata = (1 + slots_of(s) + (s->decided ? 1 : 0)) * s->len;
    for (int i = 0; i < s->nw; i++) {
        const shard_worker *w = &s->w[i];
        st->nhead += W_FIXED + 2 * (size_t)w->ncover;
        st->nvalues += TS_COMMIT_VALUES + (w->reduced ? (size_t)s->red_n : 0);
        if (staged(w)) st->ndata += s->len;
    }
}

void ts_shard_snapshot(const ts_shard *s, const ts_shard_state *st) {
    int64_t *h = st->head;
    double *v = st->values;
    float *d = st->data;
    int64_t fixed[R_FIXED] = {
        [R_MAGIC] = SNAP_MAGIC, [R_OFFSET] = s->offset, [R_LEN] = s->len, [R_SLOTS] = slots_of(s),
        [R_NW] = s->nw, [R_FLOATS] = st->ndata, [R_STEP] = s->step, [R_UPDATES] = s->updates,
        [R_SAVED] = s->saved_step, [R_EPOCH] = s->pos.epoch, [R_POS] = s->pos.offset,
        [R_WSET_GEN] = (int64_t)s->wset_gen, [R_DECIDED] = s->decided, [R_DECIDED_STEP] = s->decided_step,
        [R_DECIDED_GEN] = (int64_t)s->decided_gen, [R_DECIDED_EPOCH] = s->decided_pos.epoch,
        [R_DECIDED_POS] = s->decided_pos.offset, [R_LAST_DECIDED] = s->last_decided_step,
        [R_REDUCING] = s->reducing, [R_RED_STEP] = s->red_step, [R_RED_ID] = s->red_id, [R_RED_N] = s->red_n,
        [R_RED_GEN] = (int64_t)s->red_gen, [R_LEFT_GEN] = (int64_t)s->left_gen,
        [R_LAST_RED_STEP] = s->last_red_step, [R_LAST_RED_ID] = s->last_red_id, [R_LAST_RED_N] = s->last_red_n};
    memcpy(h, fixed, sizeof fixed);
    h += R_FIXED;
    memcpy(v, s->decided_values, sizeof s->decided_values);
    v[TS_DECIDED_VALUES] = s->decided_lr;
    memcpy(v + TS_DECIDED_VALUES + 1, s->last_decided, sizeof s->last_decided);
    v += 2 * TS_DECIDED_VALUES + 1;
    if (s->last_red_n) memcpy(v, s->last_red, (size_t)s->last_red_n * sizeof *v);
    v += s->last_red_n;
    int64_t len = s->len;
    memcpy(d, ts_f32(s->params), (size_t)len * sizeof *d);
    d += len;
    if (s->state) memcpy(d, ts_f32(s->state), (size_t)(slots_of(s) * len) * sizeof *d);
    d += slots_of(s) * len;
    if (s->decided) memcpy(d, s->sum, (size_t)len * sizeof *d), d += len;
    for (int i = 0; i < s->nw; i++) {
        const shard_worker *w = &s->w[i];
        int64_t rec[W_FIXED] = {[W_RANK] = w->rank, [W_LIVE] = w->live, [W_STEP] = w->step,
                                [W_COMMITTED] = w->committed, [W_WAITING] = w->waiting, [W_DONE] = w->done,
                                [W_JOINED_AT] = w->joined_at, [W_JOINED_GEN] = (int64_t)w->joined_gen,
                                [W_COVERED] = w->covered, [W_STAGED] = staged(w), [W_REDUCED] = w->reduced != NULL,
                                [W_RED_WAITING] = w->reduce_waiting, [W_NCOVER] = w->ncover};
        memcpy(h, rec, sizeof rec);
        h += W_FIXED;
        for (int k = 0; k < w->ncover; k++) *h++ = w->cover[k].lo, *h++ = w->cover[k].hi;
        memcpy(v, w->values, sizeof w->values);
        v += TS_COMMIT_VALUES;
        if (w->reduced) memcpy(v, w->reduced, (size_t)s->red_n * sizeof *v), v += s->red_n;
        if (staged(w)) memcpy(d, w->stage, (size_t)len * sizeof *d), d += len;
    }
}

/* Refuses a snapshot: the field and what is wrong with it. */
#define BAD(...) ts_error(TS_ERR_FORMAT, "shard state: " __VA_ARGS__)

/* Whether x is a flag (0 or 1). */
static bool flag(int64_t x) { return x == 0 || x == 1; }

/* Checks worker record w (after the worker of rank prev, -1 none). */
static ts_status check_worker(const ts_shard *s, const int64_t *w, int64_t prev) {
    if (w[W_RANK] <= prev || w[W_RANK] > INT32_MAX)
        return BAD("worker rank %lld after rank %lld: not ascending", (long long)w[W_RANK], (long long)prev);
    if (!flag(w[W_LIVE]) || !flag(w[W_COMMITTED]) || !flag(w[W_WAITING]) || !flag(w[W_STAGED]) ||
        !flag(w[W_REDUCED]) || !flag(w[W_RED_WAITING]) || w[W_COVERED] < 0 || w[W_COVERED] > s->len)
        return BAD("worker rank %lld: a flag is not 0 or 1, or %lld keys covered of %lld", (long long)w[W_RANK],
                   (long long)w[W_COVERED], (long long)s->len);
    const int64_t *span = w + W_FIXED;
    int64_t last = s->offset;
    for (int64_t k = 0; k < w[W_NCOVER]; k++, span += 2)
        if (span[0] < last || span[1] <= span[0] || span[1] > s->offset + s->len)
            return BAD("worker rank %lld: covered span %lld = [%lld, %lld) is not in order inside [%lld, %lld)",
                       (long long)w[W_RANK], (long long)k, (long long)span[0], (long long)span[1], (long long)last,
                       (long long)(s->offset + s->len));
        else
            last = span[1];
    return TS_OK;
}

ts_status ts_shard_state_check(const ts_shard *s, const int64_t *h, size_t nhead, size_t nvalues, int64_t *ndata) {
    if (nhead < R_FIXED || h[R_MAGIC] != SNAP_MAGIC)
        return BAD("a record of %zu fields%s is not one of this version", nhead,
                   nhead >= R_FIXED ? " with another magic number" : "");
    if (h[R_OFFSET] != s->offset || h[R_LEN] != s->len)
        return BAD("keys [%lld, +%lld) where this shard holds [%lld, +%lld)", (long long)h[R_OFFSET],
                   (long long)h[R_LEN], (long long)s->offset, (long long)s->len);
    if (h[R_SLOTS] != slots_of(s))
        return BAD("%lld optimizer state slots where this shard's optimizer has %d", (long long)h[R_SLOTS],
                   slots_of(s));
    if (h[R_NW] < 0 || h[R_NW] > SNAP_MAX || h[R_RED_N] < 0 || h[R_RED_N] > SNAP_MAX || h[R_LAST_RED_N] < 0 ||
        h[R_LAST_RED_N] > SNAP_MAX)
        return BAD("%lld workers, reductions of %lld and %lld values: out of range", (long long)h[R_NW],
                   (long long)h[R_RED_N], (long long)h[R_LAST_RED_N]);
    if (!flag(h[R_DECIDED]) || !flag(h[R_REDUCING]) || h[R_STEP] < 0 || h[R_UPDATES] < 0)
        return BAD("decided %lld, reducing %lld, step %lld, updates %lld: out of range", (long long)h[R_DECIDED],
                   (long long)h[R_REDUCING], (long long)h[R_STEP], (long long)h[R_UPDATES]);
    size_t at = R_FIXED, values = 2 * TS_DECIDED_VALUES + 1 + (size_t)h[R_LAST_RED_N];
    int64_t floats = (1 + h[R_SLOTS] + h[R_DECIDED]) * s->len, prev = -1;
    for (int64_t i = 0; i < h[R_NW]; i++) {
        const int64_t *w = h + at;
        if (at + W_FIXED > nhead || w[W_NCOVER] < 0 || w[W_NCOVER] > SNAP_MAX ||
            at + W_FIXED + 2 * (size_t)w[W_NCOVER] > nhead)
            return BAD("the record of worker %lld runs past the record's %zu fields", (long long)i, nhead);
        ts_status st = check_worker(s, w, prev);
        if (st) return st;
        prev = w[W_RANK];
        at += W_FIXED + 2 * (size_t)w[W_NCOVER];
        values += TS_COMMIT_VALUES + (w[W_REDUCED] ? (size_t)h[R_RED_N] : 0);
        floats += w[W_STAGED] ? s->len : 0;
    }
    if (at != nhead || values != nvalues || floats != h[R_FLOATS])
        return BAD("%zu record fields, %zu values and %lld floats where its workers make %zu, %zu and %lld", nhead,
                   nvalues, (long long)h[R_FLOATS], at, values, (long long)floats);
    *ndata = floats;
    return TS_OK;
}

/* Frees the buffers of workers w[0..n). */
static void free_workers(shard_worker *w, int n) {
    for (int i = 0; w && i < n; i++) free(w[i].stage), free(w[i].cover), free(w[i].reduced);
    free(w);
}

/* Makes the workers of record h (checked) with their buffers; NULL when
 * memory ran out. */
static shard_worker *make_workers(const ts_shard *s, const int64_t *h) {
    int nw = (int)h[R_NW];
    shard_worker *ws = calloc(nw ? (size_t)nw : 1, sizeof *ws);
    const int64_t *w = h + R_FIXED;
    for (int i = 0; ws && i < nw; w += W_FIXED + 2 * w[W_NCOVER], i++) {
        shard_worker *x = &ws[i];
        x->ncover = x->capcover = (int)w[W_NCOVER];
        bool ok = (!x->ncover || (x->cover = malloc((size_t)x->ncover * sizeof *x->cover))) &&
                  (!w[W_STAGED] || (x->stage = malloc((size_t)(s->len ? s->len : 1) * sizeof *x->stage))) &&
                  (!w[W_REDUCED] || (x->reduced = malloc((size_t)(h[R_RED_N] ? h[R_RED_N] : 1) * sizeof(double))));
        if (!ok) {
            free_workers(ws, i + 1);
            return NULL;
        }
    }
    return ws;
}

ts_status ts_shard_install(ts_shard *s, const int64_t *h, size_t nhead, const double *v, size_t nvalues,
                           const float *d, int64_t ndata) {
    int64_t want;
    ts_status st = ts_shard_state_check(s, h, nhead, nvalues, &want);
    if (st) return st;
    if (ndata != want) return BAD("%lld floats arrived where its record says %lld", (long long)ndata, (long long)want);
    shard_worker *ws = make_workers(s, h);
    double *last_red = h[R_LAST_RED_N] ? malloc((size_t)h[R_LAST_RED_N] * sizeof *last_red) : NULL;
    if (!ws || (h[R_LAST_RED_N] && !last_red)) {
        free_workers(ws, ws ? (int)h[R_NW] : 0);
        free(last_red);
        return ts_error(TS_ERR_MEMORY, "shard state: out of memory for %lld workers", (long long)h[R_NW]);
    }
    /* nothing fails from here: the shard becomes the snapshot's */
    s->step = h[R_STEP], s->updates = h[R_UPDATES], s->saved_step = h[R_SAVED];
    s->pos = (ts_loader_pos){h[R_EPOCH], h[R_POS]};
    s->wset_gen = (uint64_t)h[R_WSET_GEN];
    s->decided = h[R_DECIDED], s->decided_step = h[R_DECIDED_STEP], s->decided_gen = (uint64_t)h[R_DECIDED_GEN];
    s->decided_pos = (ts_loader_pos){h[R_DECIDED_EPOCH], h[R_DECIDED_POS]};
    s->last_decided_step = h[R_LAST_DECIDED];
    s->reducing = h[R_REDUCING], s->red_step = h[R_RED_STEP], s->red_id = h[R_RED_ID], s->red_n = (int)h[R_RED_N];
    s->red_gen = (uint64_t)h[R_RED_GEN], s->left_gen = (uint64_t)h[R_LEFT_GEN];
    s->last_red_step = h[R_LAST_RED_STEP], s->last_red_id = h[R_LAST_RED_ID], s->last_red_n = (int)h[R_LAST_RED_N];
    memcpy(s->decided_values, v, sizeof s->decided_values);
    s->decided_lr = v[TS_DECIDED_VALUES];
    memcpy(s->last_decided, v + TS_DECIDED_VALUES + 1, sizeof s->last_decided);
    v += 2 * TS_DECIDED_VALUES + 1;
    if (last_red) memcpy(last_red, v, (size_t)s->last_red_n * sizeof *v);
    v += s->last_red_n;
    free(s->last_red);
    s->last_red = last_red;
    int64_t len = s->len;
    memcpy(ts_f32(s->params), d, (size_t)len * sizeof *d);
    d += len;
    if (s->state) memcpy(ts_f32(s->state), d, (size_t)(slots_of(s) * len) * sizeof *d);
    d += slots_of(s) * len;
    if (s->decided) memcpy(s->sum, d, (size_t)len * sizeof *d), d += len;
    const int64_t *w = h + R_FIXED;
    for (int i = 0; i < (int)h[R_NW]; w += W_FIXED + 2 * w[W_NCOVER], i++) {
        shard_worker *x = &ws[i];
        x->rank = (int32_t)w[W_RANK], x->live = w[W_LIVE], x->step = w[W_STEP];
        x->committed = w[W_COMMITTED], x->waiting = w[W_WAITING], x->done = w[W_DONE];
        x->joined_at = w[W_JOINED_AT], x->joined_gen = (uint64_t)w[W_JOINED_GEN];
        x->covered = w[W_COVERED], x->reduce_waiting = w[W_RED_WAITING];
        for (int k = 0; k < x->ncover; k++) x->cover[k] = (shard_span){w[W_FIXED + 2 * k], w[W_FIXED + 2 * k + 1]};
        memcpy(x->values, v, sizeof x->values);
        v += TS_COMMIT_VALUES;
        if (x->reduced) memcpy(x->reduced, v, (size_t)s->red_n * sizeof *v), v += s->red_n;
        if (x->stage) memcpy(x->stage, d, (size_t)len * sizeof *d), d += len;
    }
    free_workers(s->w, s->nw);
    s->w = ws;
    s->nw = s->capw = (int)h[R_NW];
    for (int i = 0; i < s->npulls; i++) free(s->pulls[i].ranges);
    s->npulls = 0;
    return TS_OK;
}

ts_proto_member *ts_shard_live_workers(const ts_shard *s, int *n) {
    ts_proto_member *r = calloc((size_t)(s->nw ? s->nw : 1), sizeof *r);
    *n = 0;
    for (int i = 0; r && i < s->nw; i++)
        if (s->w[i].live)
            r[(*n)++] = (ts_proto_member){.rank = s->w[i].rank, .role = TS_ROLE_WORKER, .alive = true,
                                          .last_step = -1, .last_barrier = -1, .heartbeat_age_ms = -1,
                                          .joined_generation = s->w[i].joined_gen};
    return r;
}
