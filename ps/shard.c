/* shard.c - a shard's requests: push, commit, apply, pull, reduce, rollback,
 * and the live workers (contract in shard.h). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/optim/clip.h"
#include "proto/job_model.h"
#include "ps/internal.h"
#include "sharding/keys.h"

/* ---- making the shard ---- */

/* Plans the key table of model m and takes shard k's range. */
static ts_status plan_range(const ts_model *m, int k, int shards, int64_t *offset, int64_t *len) {
    ts_range *tensors = malloc((size_t)m->n_params * sizeof *tensors);
    ts_range *parts = malloc((size_t)shards * sizeof *parts);
    ts_status st = tensors && parts ? TS_OK : ts_error(TS_ERR_MEMORY, "ps: out of memory planning keys");
    for (int i = 0; !st && i < m->n_params; i++) tensors[i] = (ts_range){m->params[i].offset, m->params[i].numel};
    if (!st) st = ts_keys_plan(tensors, m->n_params, m->numel, shards, parts);
    if (!st) *offset = parts[k].offset, *len = parts[k].len;
    free(tensors);
    free(parts);
    return st;
}

ts_shard *ts_shard_create(const ts_shard_config *c, const ts_model *m) {
    ts_shard *s = calloc(1, sizeof *s);
    if (!s) {
        ts_error(TS_ERR_MEMORY, "ps: out of memory");
        return NULL;
    }
    s->cfg = *c;
    s->root = c->root ? strdup(c->root) : NULL;
    s->mode = c->job->parallel.consistency;
    s->staleness = s->mode == TS_CONSISTENCY_BOUNDED ? c->job->parallel.staleness : 0;
    s->clip = c->job->optimizer.clip_norm;
    s->replies = true;
    s->last_decided_step = s->last_red_step = s->saved_step = s->applied_step = -1;
    ts_status st = c->root && !s->root ? ts_error(TS_ERR_MEMORY, "ps: out of memory") : TS_OK;
    if (!st) st = ts_job_optim_config(c->job, &s->optim);
    if (!st) st = plan_range(m, c->shard, c->shards, &s->offset, &s->len);
    if (!st) st = ts_job_optim_groups(m, &s->groups);
    if (!st) {
        s->numel = m->numel;
        int slots = ts_optim_state_slots(&s->optim);
        int64_t n = s->len ? s->len : 1;
        s->params = ts_tensor_from_data(TS_F32, 1, &n, ts_f32(m->flat_params) + s->offset);
        s->sum = calloc((size_t)n, sizeof *s->sum);
        s->state = slots ? ts_tensor_zeros(TS_F32, 2, (int64_t[]){slots, n}) : NULL;
        if (!s->params || (slots && !s->state)) st = ts_last_status();
        else if (!s->sum) st = ts_error(TS_ERR_MEMORY, "ps: out of memory for %lld keys", (long long)n);
    }
    if (st) {
        ts_shard_free(s);
        return NULL;
    }
    return s;
}

/* Drops a worker's open reduction. */
static void drop_reduced(shard_worker *w) {
    free(w->reduced);
    w->reduced = NULL;
    w->reduce_waiting = false;
}

void ts_shard_free(ts_shard *s) {
    if (!s) return;
    for (int i = 0; i < s->nw; i++) {
        free(s->w[i].stage);
        free(s->w[i].cover);
        drop_reduced(&s->w[i]);
    }
    for (int i = 0; i < s->npulls; i++) free(s->pulls[i].ranges);
    free(s->pulls);
    free(s->w);
    free(s->last_red);
    ts_tensor_release(s->params);
    ts_tensor_release(s->state);
    free(s->sum);
    ts_optim_groups_free(&s->groups);
    free(s->root);
    free(s);
}

void ts_shard_range(const ts_shard *s, int64_t *offset, int64_t *len) {
    *offset = s->offset;
    *len = s->len;
}

int64_t ts_shard_step(const ts_shard *s) { return s->step; }
int64_t ts_shard_updates(const ts_shard *s) { return s->updates; }
uint64_t ts_shard_refused(const ts_shard *s) { return s->refused; }
uint64_t ts_shard_workers_generation(const ts_shard *s) { return s->wset_gen; }
void ts_shard_set_replies(ts_shard *s, bool on) { s->replies = on; }
void ts_shard_set_writer(ts_shard *s, bool on) { s->writer = on; }

/* ---- replies ---- */

static void send(ts_shard *s, const ts_proto_identity *to, const ts_proto_msg *m, const ts_proto_payload *p,
                 size_t np) {
    if (s->replies) s->cfg.reply(s->cfg.ctx, to, m, p, np);
}

/* A message from this shard: its job, the workers' generation, its rank. */
static void msg_init(ts_shard *s, ts_proto_msg *m, ts_proto_type type, int64_t step) {
    ts_proto_msg_init(m, type, s->cfg.job->name, s->wset_gen, s->cfg.rank);
    m->step = step;
}

/* Answers an ERROR (code, step, generation) without counting it. */
static void answer_error(ts_shard *s, const ts_proto_identity *to, uint32_t code, int64_t step, uint64_t g,
                         const char *reason) {
    ts_proto_msg m;
    ts_proto_msg_error(&m, s->cfg.job->name, g, s->cfg.rank, code, reason);
    m.step = step;
    send(s, to, &m, NULL, 0);
}

/* Refuses request m: counts it, logs it and answers an ERROR naming why. */
static void refuse(ts_shard *s, const ts_proto_identity *to, const ts_proto_msg *m, uint32_t code, const char *fmt,
                   ...) __attribute__((format(printf, 5, 6)));
static void refuse(ts_shard *s, const ts_proto_identity *to, const ts_proto_msg *m, uint32_t code, const char *fmt,
                   ...) {
    char why[TS_PROTO_REASON_MAX + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    s->refused++;
    if (s->replies)
        fprintf(stderr, "shard %d: refused %s of step %lld from rank %d: %s [%s]\n", s->cfg.shard,
                ts_proto_type_name(m->type), (long long)m->step, m->rank, why, ts_proto_error_name(code));
    answer_error(s, to, code, s->step, s->wset_gen, why);
}

/* An ACK of a rollback: the step the shard is at. */
static void ack(ts_shard *s, const ts_proto_identity *to, int64_t step) {
    ts_proto_msg a;
    msg_init(s, &a, TS_MSG_ACK, step);
    send(s, to, &a, NULL, 0);
}

/* Sends n f64 values as a message of type t. */
static void send_values(ts_shard *s, const ts_proto_identity *to, ts_proto_type t, int64_t step, int64_t id,
                        const double *v, int n) {
    ts_proto_msg m;
    ts_proto_payload p;
    msg_init(s, &m, t, step);
    ts_proto_msg_values(&m, id, v, n, &p);
    send(s, to, &m, &p, 1);
}

/* ---- workers ---- */

static shard_worker *find_worker(ts_shard *s, int32_t rank) {
    for (int i = 0; i < s->nw; i++)
        if (s->w[i].rank == rank) return &s->w[i];
    return NULL;
}

/* Forgets what a worker staged. */
static void clear_staging(shard_worker *w) {
    w->step = -1;
    w->ncover = 0;
    w->covered = 0;
    w->committed = false;
    w->waiting = false;
}

void shard_clear_stagings(ts_shard *s) {
    for (int i = 0; i < s->nw; i++) clear_staging(&s->w[i]);
    s->decided = false;
}

/* The live worker that sent m, or NULL after refusing m. */
static shard_worker *live_sender(ts_shard *s, const ts_proto_identity *from, const ts_proto_msg *m) {
    shard_worker *w = find_worker(s, m->rank);
    if (!w || !w->live) {
        refuse(s, from, m, TS_PROTO_E_REFUSED, "rank %d is not a live worker of generation %llu", m->rank,
               (unsigned long long)s->wset_gen);
        return NULL;
    }
    w->who = *from;
    return w;
}

/* Sync: whether m was computed by an older set of workers; then it is
 * answered "redo" with the current generation. */
static bool stale_workers(ts_shard *s, const ts_proto_identity *from, const ts_proto_msg *m) {
    if (s->mode != TS_CONSISTENCY_SYNC || m->generation >= s->wset_gen) return false;
    char why[160];
    snprintf(why, sizeof why, "shard %d: the workers changed in generation %llu; compute step %lld again",
             s->cfg.shard, (unsigned long long)s->wset_gen, (long long)m->step);
    answer_error(s, from, TS_PROTO_E_REDO, m->step, s->wset_gen, why);
    return true;
}

/* Sync: whether m, of the decided step, repeats what decided it (a worker
 * sending its step again to a new primary). Only a change of the workers
 * makes them compute a decided step again; a message's generation also
 * grows with changes of the servers alone, so a newer one is a redo only
 * once the workers changed since the decision. */
static bool repeats_decided(const ts_shard *s, const ts_proto_msg *m) {
    return s->decided && (m->generation <= s->decided_gen || s->wset_gen == s->decided_gen);
}

/* Sync: whether m is for a step beyond the next one: this shard restarted
 * from an older checkpoint; the sender is told where it is. */
static bool behind(ts_shard *s, const ts_proto_identity *from, const ts_proto_msg *m, int64_t next) {
    if (m->step <= next) return false;
    char why[160];
    snprintf(why, sizeof why, "shard %d is at step %lld (restarted from its checkpoint); step %lld cannot follow",
             s->cfg.shard, (long long)s->step, (long long)m->step);
    answer_error(s, from, TS_PROTO_E_BEHIND, s->step, s->wset_gen, why);
    return true;
}

/* The smallest finished step among the live workers (async, bounded). */
static int64_t slowest(const ts_shard *s) {
    int64_t lo = -1;
    bool any = false;
    for (int i = 0; i < s->nw; i++)
        if (s->w[i].live && (!any || s->w[i].done < lo)) lo = s->w[i].done, any = true;
    return any ? lo : s->step;
}

/* ---- checks shared by the requests ---- */

/* Checks that every range of m lies in the shard and, with frames, that
 * each range has its own payload frame of len * dtype size bytes. */
static bool check_ranges(ts_shard *s, const ts_proto_identity *from, const ts_proto_msg *m, bool frames) {
    if (m->nranges == 0) {
        refuse(s, from, m, TS_PROTO_E_MISSING, "no ranges (\"rg\")");
        return false;
    }
    if (frames && m->nlengths != m->nranges) {
        refuse(s, from, m, TS_PROTO_E_PAYLOAD_LEN, "%zu ranges but %zu payload frames (one per range)", m->nranges,
               m->nlengths);
        return false;
    }
    for (size_t i = 0; i < m->nranges; i++) {
        const ts_proto_range *r = &m->ranges[i];
        if (r->offset < (uint64_t)s->offset || r->offset + r->len > (uint64_t)(s->offset + s->len)) {
            refuse(s, from, m, TS_PROTO_E_RANGE, "range rg[%zu] = [%llu, %llu) is outside shard %d's keys [%lld, %lld)",
                   i, (unsigned long long)r->offset, (unsigned long long)(r->offset + r->len), s->cfg.shard,
                   (long long)s->offset, (long long)(s->offset + s->len));
            return false;
        }
        if (frames && m->lengths[i] != r->len * ts_proto_dtype_size(m->dtype)) {
            refuse(s, from, m, TS_PROTO_E_PAYLOAD_LEN, "frame %zu has %llu bytes for range rg[%zu] of %llu keys", i,
                   (unsigned long long)m->lengths[i], i, (unsigned long long)r->len);
            return false;
        }
    }
    return true;
}

/* Checks that m carries exactly n f64 values (n 0: any number, at least one). */
static bool check_values(ts_shard *s, const ts_proto_identity *from, const ts_proto_msg *m, int n) {
    if (m->dtype != TS_PROTO_DT_F64 || (n && m->payload[0].size != (size_t)n * sizeof(double))) {
        refuse(s, from, m, TS_PROTO_E_PAYLOAD_LEN, "expected %d f64 values, got %zu bytes of dtype %s", n,
               m->payload[0].size, m->dtype == TS_PROTO_DT_F64 ? "f64" : "other than f64");
        return false;
    }
    return true;
}

static void serve_pulls(ts_shard *s);

/* ---- push ---- */

/* Adds [lo, hi) to a worker's coverage. */
static ts_status cover(shard_worker *w, int64_t lo, int64_t hi) {
    int i = 0;
    while (i < w->ncover && w->cover[i].hi < lo) i++;
    int j = i;
    while (j < w->ncover && w->cover[j].lo <= hi) {
        if (w->cover[j].lo < lo) lo = w->cover[j].lo;
        if (w->cover[j].hi > hi) hi = w->cover[j].hi;
        w->covered -= w->cover[j].hi - w->cover[j].lo;
        j++;
    }
    if (i == j && w->ncover == w->capcover) { /* a new span: make room */
        int cap = w->capcover ? 2 * w->capcover : 8;
        shard_span *p = realloc(w->cover, (size_t)cap * sizeof *p);
        if (!p) return ts_error(TS_ERR_MEMORY, "ps: out of memory for %d spans", cap);
        w->cover = p, w->capcover = cap;
    }
    memmove(w->cover + i + 1, w->cover + j, (size_t)(w->ncover - j) * sizeof *w->cover);
    w->cover[i] = (shard_span){lo, hi};
    w->ncover += 1 - (j - i);
    w->covered += hi - lo;
    return TS_OK;
}

/* Copies the pushed ranges of m into w's staging of step m->step. */
static ts_status stage(ts_shard *s, shard_worker *w, const ts_proto_msg *m) {
    if (!w->stage && !(w->stage = malloc((size_t)(s->len ? s->len : 1) * sizeof *w->stage)))
        return ts_error(TS_ERR_MEMORY, "ps: out of memory for the staging of rank %d", w->rank);
    if (w->step != m->step) {
        clear_staging(w);
        w->step = m->step;
    }
    for (size_t i = 0; i < m->nranges; i++) {
        const ts_proto_range *r = &m->ranges[i];
        float *dst = w->stage + (r->offset - (uint64_t)s->offset);
        if (m->dtype == TS_PROTO_DT_F32) {
            memcpy(dst, m->payload[i].data, r->len * sizeof(float));
        } else {
            const uint16_t *src = m->payload[i].data;
            for (uint64_t k = 0; k < r->len; k++) dst[k] = ts_f32_from_bf16(src[k]);
        }
        ts_status st = cover(w, (int64_t)r->offset, (int64_t)(r->offset + r->len));
        if (st) return st;
    }
    return TS_OK;
}

/* Stages a push. It is answered only when refused: the reply to the
 * step's COMMIT acknowledges its pushes. */
static void on_push(ts_shard *s, const ts_proto_identity *from, const ts_proto_msg *m) {
    if (m->dtype != TS_PROTO_DT_F32 && m->dtype != TS_PROTO_DT_BF16) {
        refuse(s, from, m, TS_PROTO_E_FIELD_VALUE, "gradients must be f32 or bf16 (dtype %u)", (unsigned)m->dtype);
        return;
    }
    shard_worker *w;
    if (!check_ranges(s, from, m, true) || !(w = live_sender(s, from, m))) return;
    if (s->mode == TS_CONSISTENCY_SYNC) {
        if (stale_workers(s, from, m) || behind(s, from, m, s->step + 1)) return;
        if (m->step <= s->step) return;                                 /* a repeat of an applied step */
        if (repeats_decided(s, m)) return;                              /* ... or of the decided one */
        if (s->decided) { /* the workers redo the decided step in a new generation */
            shard_clear_stagings(s);
            serve_pulls(s);
        }
    } else if (m->step <= w->done) {
        return;
    }
    if (stage(s, w, m)) refuse(s, from, m, TS_PROTO_E_INTERNAL, "%s", ts_last_error());
}

/* ---- pulls ---- */

static void no_free(void *data, void *hint) { (void)data, (void)hint; }

static void free_copy(void *data, void *hint) {
    (void)hint;
    free(data);
}

/* Answers a pull of ranges with the parameters of the current step. In
 * sync mode the frames point at the parameters (nothing writes them before
 * every worker received them: the next step needs every worker's push);
 * otherwise they are copies. */
static void serve(ts_shard *s, const ts_proto_identity *to, const ts_proto_range *ranges, size_t n) {
    ts_proto_msg m;
    msg_init(s, &m, TS_MSG_PULL_REPLY, s->step);
    m.dtype = TS_PROTO_DT_F32;
    m.epoch = s->pos.epoch;
    m.offset = s->pos.offset;
    if (s->applied_step == s->step) { /* what a worker that adopts the step logs of it */
        memcpy(m.step_values, s->applied, sizeof s->applied);
        m.nstep_values = TS_STEP_VALUES;
    }
    ts_proto_payload *p = calloc(n, sizeof *p);
    if (!p || ts_proto_msg_set_ranges(&m, ranges, n)) {
        free(p);
        ts_proto_msg_free(&m);
        answer_error(s, to, TS_PROTO_E_INTERNAL, s->step, s->wset_gen, "shard: out of memory for a pull reply");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const float *src = ts_f32(s->params) + (ranges[i].offset - (uint64_t)s->offset);
        size_t bytes = ranges[i].len * sizeof(float);
        void *copy = s->mode == TS_CONSISTENCY_SYNC ? NULL : malloc(bytes);
        if (copy) memcpy(copy, src, bytes);
        p[i] = copy ? (ts_proto_payload){copy, bytes, free_copy, NULL} : (ts_proto_payload){src, bytes, no_free, NULL};
    }
    send(s, to, &m, p, n);
    free(p);
    ts_proto_msg_free(&m);
}

/* Whether a pull wanting step `want` may be answered now. */
static bool pull_ready(const ts_shard *s, int64_t want) {
    switch (s->mode) {
    case TS_CONSISTENCY_SYNC: return want <= s->step && !s->decided; /* a decided step is applied next */
    case TS_CONSISTENCY_BOUNDED: return slowest(s) >= want - s->staleness;
    default: return true;
    }
}

/* Answers the waiting pulls that may be answered now. */
static void serve_pulls(ts_shard *s) {
    int k = 0;
    for (int i = 0; i < s->npulls; i++) {
        shard_pull *p = &s->pulls[i];
        if (pull_ready(s, p->want)) {
            serve(s, &p->who, p->ranges, p->nranges);
            free(p->ranges);
        } else {
            s->pulls[k++] = *p;
        }
    }
    s->npulls = k;
}

static void on_pull(ts_shard *s, const ts_proto_identity *from, const ts_proto_msg *m) {
    if (m->dtype != TS_PROTO_DT_F32 && m->dtype != TS_PROTO_DT_NONE) {
        refuse(s, from, m, TS_PROTO_E_FIELD_VALUE, "parameters are sent as f32 (dtype %u asked)", (unsigned)m->dtype);
        return;
    }
    if (m->nlengths) {
        refuse(s, from, m, TS_PROTO_E_PAYLOAD_LEN, "a pull carries no payload (%zu frames)", m->nlengths);
        return;
    }
    if (!check_ranges(s, from, m, false)) return;
    if (s->mode == TS_CONSISTENCY_SYNC && behind(s, from, m, s->step + 1)) return;
    if (pull_ready(s, m->step)) {
        serve(s, from, m->ranges, m->nranges);
        return;
    }
    if (s->npulls == s->cappulls) {
        int cap = s->cappulls ? 2 * s->cappulls : 8;
        shard_pull *p = realloc(s->pulls, (size_t)cap * sizeof *p);
        if (!p) {
            refuse(s, from, m, TS_PROTO_E_INTERNAL, "out of memory for %d waiting pulls", cap);
            return;
        }
        s->pulls = p, s->cappulls = cap;
    }
    shard_pull *p = &s->pulls[s->npulls];
    *p = (shard_pull){*from, m->rank, m->step, malloc(m->nranges * sizeof *m->ranges), m->nranges};
    if (!p->ranges) {
        refuse(s, from, m, TS_PROTO_E_INTERNAL, "out of memory for a waiting pull");
        return;
    }
    memcpy(p->ranges, m->ranges, m->nranges * sizeof *m->ranges);
    s->npulls++;
}

/* ---- commit and apply ---- */

/* Writes a checkpoint after `step` when one is due (writer only). */
static void maybe_checkpoint(ts_shard *s, int64_t before) {
    int64_t k = s->cfg.job->train.checkpoint_every;
    if (k > 0 && s->step / k != before / k) ts_shard_checkpoint(s);
}

/* Makes worker w's staging the gradient to step (s->sum), and the old sum
 * its staging buffer: no copy. */
static void take_staging(ts_shard *s, shard_worker *w) {
    float *g = s->sum;
    s->sum = w->stage;
    w->stage = g;
}

/* One optimizer step over the shard's keys with gradient s->sum, clipped
 * by the global squared norm sq (clip_norm > 0), at learning rate lr. */
static ts_status step_optimizer(ts_shard *s, double sq, double lr) {
    float *g = s->sum;
    if (s->clip > 0) {
        double norm = sqrt(sq);
        if (!isfinite(norm))
            return ts_error(TS_ERR_VALUE, "the gradient norm is %g; optimizer.clip_norm cannot clip it", norm);
        ts_clip_scale(g, s->len, (float)ts_clip_coef(norm, s->clip));
    }
    ts_optim_slice sl = {.params = ts_f32(s->params),
                         .grads = g,
                         .state = s->state ? ts_f32(s->state) : NULL,
                         .stride = s->len,
                         .offset = s->offset,
                         .len = s->len};
    ts_status st = s->len ? ts_optim_step_range(&s->optim, s->updates + 1, lr, &s->groups, &sl) : TS_OK;
    if (!st) s->updates++;
    return st;
}

/* Sync: once every live worker committed the next step, sums their
 * gradients in rank order, averages them, and answers each commit with the
 * step's loss, samples and this shard's partial squared norm. */
static void try_decide(ts_shard *s) {
    if (s->mode != TS_CONSISTENCY_SYNC || s->decided) return;
    int live = 0;
    for (int i = 0; i < s->nw; i++) {
        shard_worker *w = &s->w[i];
        if (!w->live) continue;
        if (!w->committed || w->step != s->step + 1) return;
        live++;
    }
    if (!live) return;
    double loss = 0, samples = 0, stop = 0;
    bool first = true;
    for (int i = 0; i < s->nw; i++) {
        shard_worker *w = &s->w[i];
        if (!w->live) continue;
        if (first) {
            take_staging(s, w);
            s->decided_lr = w->values[TS_COMMIT_LR];
            s->decided_pos = (ts_loader_pos){(int64_t)w->values[TS_COMMIT_EPOCH], (int64_t)w->values[TS_COMMIT_OFFSET]};
        } else {
            for (int64_t k = 0; k < s->len; k++) s->sum[k] += w->stage[k];
        }
        first = false;
        loss += w->values[TS_COMMIT_LOSS_SUM];
        samples += w->values[TS_COMMIT_SAMPLES];
        stop += w->values[TS_COMMIT_STOP];
    }
    if (live > 1) ts_clip_scale(s->sum, s->len, 1.0f / (float)live);
    s->decided = true;
    s->decided_step = s->step + 1;
    s->decided_gen = s->wset_gen;
    double *v = s->decided_values;
    v[TS_DECIDED_LOSS_SUM] = loss;
    v[TS_DECIDED_SAMPLES] = samples;
    v[TS_DECIDED_SQ_NORM] = ts_clip_sq_norm(s->sum, s->len);
    v[TS_DECIDED_WORKERS] = live;
    v[TS_DECIDED_STOP] = stop;
    s->last_decided_step = s->decided_step;
    memcpy(s->last_decided, v, sizeof s->last_decided);
    for (int i = 0; i < s->nw; i++) {
        shard_worker *w = &s->w[i];
        if (w->live && w->waiting)
            send_values(s, &w->who, TS_MSG_COMMIT_REPLY, s->decided_step, 0, v, TS_DECIDED_VALUES);
        w->waiting = false;
    }
}

/* Async, bounded: the reply to a commit of values c, one worker's own. */
static void own_decision(const double *c, double *v) {
    v[TS_DECIDED_LOSS_SUM] = c[TS_COMMIT_LOSS_SUM];
    v[TS_DECIDED_SAMPLES] = c[TS_COMMIT_SAMPLES];
    v[TS_DECIDED_SQ_NORM] = c[TS_COMMIT_SQ_NORM];
    v[TS_DECIDED_WORKERS] = 1;
    v[TS_DECIDED_STOP] = c[TS_COMMIT_STOP];
}

/* Keeps what a worker that adopts step `step` logs of it: the loss of
 * loss_sum over samples, the learning rate and the norm of sq_norm. */
static void keep_applied(ts_shard *s, int64_t step, double loss_sum, double samples, double lr, double sq_norm) {
    s->applied_step = step;
    s->applied[TS_STEP_LOSS] = samples > 0 ? loss_sum / samples : 0;
    s->applied[TS_STEP_LR] = lr;
    s->applied[TS_STEP_GRAD_NORM] = sqrt(sq_norm);
}

/* Async, bounded: applies w's gradient of its committed step at once. The
 * step the shard is at (every live worker's) is described by the commit
 * that finished it, as the worker that sent it logs it. */
static void apply_one(ts_shard *s, const ts_proto_identity *from, const ts_proto_msg *m, shard_worker *w) {
    take_staging(s, w);
    ts_status st = step_optimizer(s, w->values[TS_COMMIT_SQ_NORM], w->values[TS_COMMIT_LR]);
    if (st) {
        refuse(s, from, m, TS_PROTO_E_INTERNAL, "%s", ts_last_error());
        return;
    }
    int64_t before = s->step;
    w->done = m->step;
    clear_staging(w);
    s->step = slowest(s);
    const double *c = w->values;
    if (m->step == s->step)
        keep_applied(s, m->step, c[TS_COMMIT_LOSS_SUM], c[TS_COMMIT_SAMPLES], c[TS_COMMIT_LR], c[TS_COMMIT_SQ_NORM]);
    s->pos = (ts_loader_pos){(int64_t)c[TS_COMMIT_EPOCH], (int64_t)c[TS_COMMIT_OFFSET]};
    double v[TS_DECIDED_VALUES];
    own_decision(w->values, v);
    send_values(s, from, TS_MSG_COMMIT_REPLY, m->step, 0, v, TS_DECIDED_VALUES);
    maybe_checkpoint(s, before);
    serve_pulls(s);
}

static void on_commit(ts_shard *s, const ts_proto_identity *from, const ts_proto_msg *m) {
    shard_worker *w;
    if (!check_values(s, from, m, TS_COMMIT_VALUES) || !(w = live_sender(s, from, m))) return;
    const double *v = m->payload[0].data;
    if (s->mode == TS_CONSISTENCY_SYNC) {
        if (stale_workers(s, from, m) || behind(s, from, m, s->step + 1)) return;
        if (m->step == s->last_decided_step &&
            (m->step <= s->step || repeats_decided(s, m))) { /* a repeat */
            send_values(s, from, TS_MSG_COMMIT_REPLY, m->step, 0, s->last_decided, TS_DECIDED_VALUES);
            return;
        }
        if (m->step <= s->step) {
            refuse(s, from, m, TS_PROTO_E_UNEXPECTED, "step %lld was applied long ago (the shard is at step %lld)",
                   (long long)m->step, (long long)s->step);
            return;
        }
    } else if (m->step <= w->done) {
        double own[TS_DECIDED_VALUES];
        own_decision(v, own);
        send_values(s, from, TS_MSG_COMMIT_REPLY, m->step, 0, own, TS_DECIDED_VALUES);
        return;
    }
    if (w->step != m->step || w->covered != s->len) {
        refuse(s, from, m, TS_PROTO_E_UNEXPECTED, "its pushes of step %lld cover %lld of shard %d's %lld keys",
               (long long)m->step, (long long)(w->step == m->step ? w->covered : 0), s->cfg.shard, (long long)s->len);
        return;
    }
    double lr = v[TS_COMMIT_LR];
    if (!(lr >= 0) || isinf(lr)) {
        refuse(s, from, m, TS_PROTO_E_FIELD_VALUE, "its learning rate %g is not finite and >= 0", lr);
        return;
    }
    if (v[TS_COMMIT_STOP] != 0 && v[TS_COMMIT_STOP] != 1) {
        refuse(s, from, m, TS_PROTO_E_FIELD_VALUE, "its stop vote %g is not 0 or 1", v[TS_COMMIT_STOP]);
        return;
    }
    memcpy(w->values, v, sizeof w->values);
    w->committed = true;
    if (s->mode != TS_CONSISTENCY_SYNC) {
        apply_one(s, from, m, w);
        return;
    }
    w->waiting = true;
    try_decide(s);
}

static void on_apply(ts_shard *s, const ts_proto_identity *from, const ts_proto_msg *m) {
    if (s->mode != TS_CONSISTENCY_SYNC) {
        refuse(s, from, m, TS_PROTO_E_UNEXPECTED, "apply is for sync steps (consistency %s)",
               ts_job_consistency_name(s->mode));
        return;
    }
    if (!check_values(s, from, m, 1) || !live_sender(s, from, m) || behind(s, from, m, s->step + 1)) return;
    if (m->step <= s->step) return; /* applied already: a repeat */
    if (!s->decided || m->step != s->decided_step) {
        refuse(s, from, m, TS_PROTO_E_UNEXPECTED, "step %lld is not decided (the shard is at step %lld%s)",
               (long long)m->step, (long long)s->step, s->decided ? ", deciding the next" : "");
        return;
    }
    double sq_norm = ((const double *)m->payload[0].data)[0];
    ts_status st = step_optimizer(s, sq_norm, s->decided_lr);
    if (st) {
        refuse(s, from, m, TS_PROTO_E_INTERNAL, "%s", ts_last_error());
        return;
    }
    int64_t before = s->step;
    const double *v = s->decided_values;
    keep_applied(s, s->decided_step, v[TS_DECIDED_LOSS_SUM], v[TS_DECIDED_SAMPLES], s->decided_lr, sq_norm);
    s->step = s->decided_step;
    s->pos = s->decided_pos;
    shard_clear_stagings(s);
    maybe_checkpoint(s, before);
    serve_pulls(s);
}

/* ---- reductions ---- */

/* Whether a live worker joined before step, and so trained it. */
static bool step_trained(const ts_shard *s, int64_t step) {
    for (int i = 0; i < s->nw; i++)
        if (s->w[i].live && s->w[i].joined_at < step) return true;
    return false;
}

/* Whether w takes part in reduction id of step: it was live in that step
 * (one that joined after it trains on from the next and does not
 * evaluate it), or the reduction is of the job's last step, after which
 * every worker evaluates (TS_REDUCE_FINAL), or no live worker trained the
 * step (!trained, step_trained: the shards resumed at it). */
static bool in_reduction(const shard_worker *w, int64_t step, int64_t id, bool trained) {
    return w->live && (w->joined_at < step || (id & TS_REDUCE_FINAL) || !trained);
}

/* A live worker that does not take part in reduction id of step and was
 * live in generation g (a group of g counts it), or NULL. */
static const shard_worker *late_joiner(const ts_shard *s, int64_t step, int64_t id, uint64_t g) {
    bool trained = step_trained(s, step);
    for (int i = 0; i < s->nw; i++)
        if (s->w[i].live && s->w[i].joined_gen <= g && !in_reduction(&s->w[i], step, id, trained)) return &s->w[i];
    return NULL;
}

/* Whether two ROUTER identities name the same peer. */
static bool same_peer(const ts_proto_identity *a, const ts_proto_identity *b) {
    return a->size == b->size && memcmp(a->data, b->data, a->size) == 0;
}

/* Answers reduction id of step, which the group of generation g cannot
 * compute (late joined after the step and does not evaluate it, but the
 * group counts it): "skip", the workers go on without it. The worker so
 * answered never gives its part, so every worker waiting in that
 * reduction is answered the same, and it is kept as the last reduction,
 * without sums, for those that send it later. */
static void skip_reduction(ts_shard *s, const ts_proto_identity *to, int64_t step, int64_t id, uint64_t g,
                           const shard_worker *late) {
    char why[240];
    snprintf(why, sizeof why, "shard %d: worker rank %d, in the group of generation %llu, joined after step %lld "
             "and does not evaluate it; the workers go on without this evaluation",
             s->cfg.shard, late->rank, (unsigned long long)g, (long long)step);
    answer_error(s, to, TS_PROTO_E_SKIP, step, s->wset_gen, why);
    bool open = s->reducing && s->red_step == step && s->red_id == id;
    for (int i = 0; open && i < s->nw; i++) {
        shard_worker *w = &s->w[i];
        if (w->live && w->reduce_waiting && !same_peer(&w->who, to))
            answer_error(s, &w->who, TS_PROTO_E_SKIP, step, s->wset_gen, why);
        drop_reduced(w);
    }
    if (open) s->reducing = false;
    free(s->last_red);
    s->last_red = NULL;
    s->last_red_n = 0;
    s->last_red_step = step;
    s->last_red_id = id;
}

/* Once every worker in the reduction gave its values, answers each with
 * the sums (in rank order) and keeps them for repeats. */
static void try_reduce(ts_shard *s) {
    if (!s->reducing) return;
    bool trained = step_trained(s, s->red_step);
    int n = 0;
    for (int i = 0; i < s->nw; i++) {
        if (!in_reduction(&s->w[i], s->red_step, s->red_id, trained)) continue;
        if (!s->w[i].reduced) return;
        n++;
    }
    if (!n) return;
    double *sum = calloc((size_t)s->red_n, sizeof *sum);
    if (!sum) return; /* the next request tries again */
    for (int i = 0; i < s->nw; i++)
        if (in_reduction(&s->w[i], s->red_step, s->red_id, trained))
            for (int k = 0; k < s->red_n; k++) sum[k] += s->w[i].reduced[k];
    for (int i = 0; i < s->nw; i++) {
        shard_worker *w = &s->w[i];
        if (w->live && w->reduce_waiting) send_values(s, &w->who, TS_MSG_REDUCE_REPLY, s->red_step, s->red_id, sum,
                                                      s->red_n);
        drop_reduced(w);
    }
    free(s->last_red);
    s->last_red = sum;
    s->last_red_n = s->red_n;
    s->last_red_step = s->red_step;
    s->last_red_id = s->red_id;
    s->reducing = false;
}

/* Answers reduction id of step, whose values were computed in a world
 * that changed in generation gen (a worker left, or the others' values
 * are of a newer one): "redo", in the current generation; "skip" when the
 * current group cannot compute it (skip_reduction). */
static void redo_reduction(ts_shard *s, const ts_proto_identity *to, int64_t step, int64_t id, bool left,
                           uint64_t gen) {
    const shard_worker *late = late_joiner(s, step, id, s->wset_gen);
    if (late) {
        skip_reduction(s, to, step, id, s->wset_gen, late);
        return;
    }
    char why[160];
    snprintf(why, sizeof why, "shard %d: %s in generation %llu; evaluate step %lld again", s->cfg.shard,
             left ? "a worker left" : "the workers changed", (unsigned long long)gen, (long long)step);
    answer_error(s, to, TS_PROTO_E_REDO, step, s->wset_gen, why);
}

/* Gives up the open reduction, whose values are of a world that changed
 * in generation gen (as redo_reduction): a worker that left took its part
 * with it, or the values came from two generations, whose shares of the
 * batches do not add up. Every worker that waits is answered; it
 * evaluates again in the new generation and sends the same reduction. */
static void abandon_reduction(ts_shard *s, bool left, uint64_t gen) {
    for (int i = 0; i < s->nw; i++) {
        shard_worker *w = &s->w[i];
        if (w->live && w->reduce_waiting) redo_reduction(s, &w->who, s->red_step, s->red_id, left, gen);
        drop_reduced(w);
    }
    s->reducing = false;
}

static void on_reduce(ts_shard *s, const ts_proto_identity *from, const ts_proto_msg *m) {
    shard_worker *w;
    if (!check_values(s, from, m, 0) || !(w = live_sender(s, from, m))) return;
    int n = (int)(m->payload[0].size / sizeof(double));
    if (m->step == s->last_red_step && m->barrier_id == s->last_red_id) { /* a repeat: the same answer */
        if (s->last_red_n)
            send_values(s, from, TS_MSG_REDUCE_REPLY, m->step, m->barrier_id, s->last_red, s->last_red_n);
        else
            refuse(s, from, m, TS_PROTO_E_SKIP, "reduction %lld of step %lld was skipped: a worker counted in it "
                   "joined after the step; the workers go on without this evaluation",
                   (long long)(m->barrier_id & ~TS_REDUCE_FINAL), (long long)m->step);
        return;
    }
    if (m->step == s->last_red_step && m->barrier_id < s->last_red_id) {
        /* the others went past it before this worker sent it: one that
         * joined after the job's last step, as they finished its end */
        char why[160];
        snprintf(why, sizeof why, "shard %d: the workers finished reduction %lld of step %lld before rank %d sent it",
                 s->cfg.shard, (long long)(m->barrier_id & ~TS_REDUCE_FINAL), (long long)m->step, m->rank);
        answer_error(s, from, TS_PROTO_E_SKIP, m->step, s->wset_gen, why);
        return;
    }
    if (m->generation < s->left_gen) {
        redo_reduction(s, from, m->step, m->barrier_id, true, s->left_gen);
        return;
    }
    const shard_worker *late = late_joiner(s, m->step, m->barrier_id, m->generation);
    if (late) {
        skip_reduction(s, from, m->step, m->barrier_id, m->generation, late);
        return;
    }
    if (s->reducing && (m->step != s->red_step || m->barrier_id != s->red_id)) {
        refuse(s, from, m, TS_PROTO_E_RETRY, "reduction %lld of step %lld is open; %lld of step %lld must wait",
               (long long)s->red_id, (long long)s->red_step, (long long)m->barrier_id, (long long)m->step);
        return;
    }
    /* values computed by two sets of workers do not add up: the older evaluate again */
    bool mixed = s->reducing && m->generation != s->red_gen &&
                 (m->generation < s->wset_gen || s->red_gen < s->wset_gen);
    if (mixed && m->generation < s->red_gen) {
        redo_reduction(s, from, m->step, m->barrier_id, false, s->wset_gen);
        return;
    }
    if (mixed) abandon_reduction(s, false, s->wset_gen);
    if (s->reducing && n != s->red_n) {
        refuse(s, from, m, TS_PROTO_E_FIELD_VALUE, "%d values where the other workers gave %d", n, s->red_n);
        return;
    }
    double *v = malloc((size_t)n * sizeof *v);
    if (!v) {
        refuse(s, from, m, TS_PROTO_E_INTERNAL, "out of memory for %d values", n);
        return;
    }
    memcpy(v, m->payload[0].data, (size_t)n * sizeof *v);
    drop_reduced(w);
    w->reduced = v;
    w->reduce_waiting = true;
    if (!s->reducing) s->red_gen = m->generation;
    s->reducing = true;
    s->red_step = m->step, s->red_id = m->barrier_id, s->red_n = n;
    try_reduce(s);
}

/* ---- rollback ---- */

static void on_rollback(ts_shard *s, const ts_proto_identity *from, const ts_proto_msg *m) {
    if (!live_sender(s, from, m)) return;
    if (m->step >= s->step) { /* there already, or it cannot go forward: say where it is */
        ack(s, from, s->step);
        return;
    }
    bool found = false;
    int64_t was = s->step;
    ts_status st = ts_shard_restore(s, m->step, &found);
    if (st || !found) {
        refuse(s, from, m, TS_PROTO_E_INTERNAL, "shard %d cannot return to step %lld: %s", s->cfg.shard,
               (long long)m->step, st ? ts_last_error() : "no checkpoint of that step");
        return;
    }
    if (s->replies)
        printf("shard %d: rolled back from step %lld to its checkpoint of step %lld\n", s->cfg.shard, (long long)was,
               (long long)s->step);
    for (int i = 0; i < s->nw; i++) { /* every worker takes the steps after it again */
        s->w[i].done = s->step;
        if (s->w[i].joined_at > s->step) s->w[i].joined_at = s->step;
    }
    /* waiting pulls belong to the steps undone: their workers pull again */
    for (int i = 0; i < s->npulls; i++) free(s->pulls[i].ranges);
    s->npulls = 0;
    ack(s, from, s->step);
}

/* ---- dispatch ---- */

void ts_shard_handle(ts_shard *s, const ts_proto_identity *from, const ts_proto_msg *m) {
    switch (m->type) {
    case TS_MSG_PUSH: on_push(s, from, m); break;
    case TS_MSG_COMMIT: on_commit(s, from, m); break;
    case TS_MSG_APPLY: on_apply(s, from, m); break;
    case TS_MSG_PULL: on_pull(s, from, m); break;
    case TS_MSG_REDUCE: on_reduce(s, from, m); break;
    case TS_MSG_ROLLBACK: on_rollback(s, from, m); break;
    default:
        refuse(s, from, m, TS_PROTO_E_UNEXPECTED, "a parameter server does not take %s messages",
               ts_proto_type_name(m->type));
    }
}

/* Adds a worker of rank r (kept in ascending rank order). */
static shard_worker *add_worker(ts_shard *s, int32_t r) {
    if (s->nw == s->capw) {
        int cap = s->capw ? 2 * s->capw : 8;
        shard_worker *p = realloc(s->w, (size_t)cap * sizeof *p);
        if (!p) return NULL;
        s->w = p, s->capw = cap;
    }
    int i = s->nw;
    while (i > 0 && s->w[i - 1].rank > r) i--;
    memmove(s->w + i + 1, s->w + i, (size_t)(s->nw - i) * sizeof *s->w);
    s->nw++;
    memset(&s->w[i], 0, sizeof s->w[i]);
    s->w[i].rank = r;
    s->w[i].step = -1;
    return &s->w[i];
}

void ts_shard_workers(ts_shard *s, uint64_t g, const ts_proto_member *ws, int n) {
    bool changed = false, left = false;
    int64_t joined_at = s->decided ? s->decided_step : s->step; /* a joiner's first step follows it */
    for (int i = 0; i < s->nw; i++) {
        shard_worker *w = &s->w[i];
        const ts_proto_member *m = NULL;
        for (int k = 0; k < n; k++)
            if (ws[k].rank == w->rank) m = &ws[k];
        /* a new process under the rank: its stagings and values died with the old one */
        bool again = m && w->live && m->joined_generation > w->joined_gen;
        if ((m != NULL) == w->live && !again) continue;
        changed = true;
        left |= !m || again;
        w->live = m != NULL;
        w->done = s->step;
        w->joined_at = joined_at, w->joined_gen = m && m->joined_generation ? m->joined_generation : g;
        clear_staging(w);
        drop_reduced(w);
    }
    for (int k = 0; k < n; k++) {
        if (find_worker(s, ws[k].rank)) continue;
        shard_worker *w = add_worker(s, ws[k].rank);
        if (!w) {
            fprintf(stderr, "shard %d: out of memory for worker %d\n", s->cfg.shard, ws[k].rank);
            continue;
        }
        w->live = true;
        w->done = s->step;
        w->joined_at = joined_at, w->joined_gen = ws[k].joined_generation ? ws[k].joined_generation : g;
        changed = true;
    }
    if (!changed) return;
    s->wset_gen = g;
    if (left) s->left_gen = g;
    if (left && s->reducing) abandon_reduction(s, true, g);
    if (s->mode == TS_CONSISTENCY_SYNC && !s->decided) {
        /* the step in flight was computed by other workers: everyone redoes it */
        for (int i = 0; i < s->nw; i++) {
            shard_worker *w = &s->w[i];
            if (w->live && w->waiting) {
                char why[160];
                snprintf(why, sizeof why, "shard %d: the workers changed in generation %llu; compute step %lld again",
                         s->cfg.shard, (unsigned long long)g, (long long)w->step);
                answer_error(s, &w->who, TS_PROTO_E_REDO, w->step, g, why);
            }
        }
        shard_clear_stagings(s);
    }
    if (s->mode != TS_CONSISTENCY_SYNC) s->step = slowest(s);
    try_reduce(s);
    serve_pulls(s);
}
