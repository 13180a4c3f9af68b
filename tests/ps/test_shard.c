/* test_shard.c - one parameter-server shard as a state machine, without
 * sockets: a sync step gives a local run's update bit for bit; a change of
 * workers makes the step be computed again; a restarted shard says where
 * it is and rolls back to its checkpoint; async applies each commit; bad
 * requests are refused, answered and counted; sums are reduced; a spare
 * that takes a shard's whole state mid-step goes on exactly as it does,
 * and a damaged state is refused without touching the spare. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/io/atomic.h"
#include "kernels/nn/models.h"
#include "kernels/optim/clip.h"
#include "proto/job_model.h"
#include "ps/shard.h"

/* ---- the replies the shard sends ---- */

typedef struct {
    ts_proto_type type;
    uint32_t code;
    int64_t step;
    uint64_t generation;
    double values[8];
    int nvalues;
    float *data; /* a pull's parameters */
    size_t nfloats;
    unsigned char to; /* the first byte of the peer's identity */
} reply_rec;

static reply_rec replies[64];
static int nreplies;

static void capture(void *ctx, const ts_proto_identity *to, const ts_proto_msg *m, const ts_proto_payload *p,
                    size_t np) {
    (void)ctx;
    assert_true(nreplies < 64);
    reply_rec *r = &replies[nreplies++];
    memset(r, 0, sizeof *r);
    r->to = to->data[0];
    r->type = m->type, r->code = m->code, r->step = m->step, r->generation = m->generation;
    if (m->type == TS_MSG_PULL_REPLY) {
        for (size_t i = 0; i < np; i++) r->nfloats += p[i].size / 4;
        r->data = malloc(r->nfloats * 4);
        size_t at = 0;
        for (size_t i = 0; i < np; i++) {
            memcpy(r->data + at, p[i].data, p[i].size);
            at += p[i].size / 4;
        }
    } else if (np == 1 && m->dtype == TS_PROTO_DT_F64) {
        r->nvalues = (int)(p[0].size / 8);
        memcpy(r->values, p[0].data, p[0].size);
    }
    for (size_t i = 0; i < np; i++)
        if (p[i].free_fn) p[i].free_fn((void *)p[i].data, p[i].hint);
}

static void forget_replies(void) {
    for (int i = 0; i < nreplies; i++) free(replies[i].data);
    nreplies = 0;
}

/* ---- a job and its shard ---- */

static ts_job job;
static ts_model *model;
static const ts_proto_identity who = {{'w'}, 1};

/* The live workers are ranks[0..n) from generation g (their joined
 * generations not known). */
static void set_workers(ts_shard *s, uint64_t g, const int32_t *ranks, int n) {
    ts_proto_member w[8] = {{0}};
    assert_true(n <= 8);
    for (int i = 0; i < n; i++) w[i] = (ts_proto_member){.rank = ranks[i], .role = TS_ROLE_WORKER, .alive = true};
    ts_shard_workers(s, g, w, n);
}

static ts_shard *make_shard(const char *consistency, double clip, const char *root) {
    char text[512];
    snprintf(text, sizeof text,
             "{\"name\": \"t\", \"seed\": 3, \"model\": {\"arch\": \"mlp\", \"hidden\": [8]},"
             " \"optimizer\": {\"kind\": \"adamw\", \"lr\": 0.01, \"weight_decay\": 0.1, \"clip_norm\": %g},"
             " \"train\": {\"checkpoint_every\": 0},"
             " \"parallel\": {\"strategy\": \"ps\", \"servers\": 2, \"consistency\": \"%s\"}}",
             clip, consistency);
    assert_int_equal(ts_job_parse(text, NULL, 0, &job), TS_OK);
    ts_model_spec spec;
    assert_int_equal(ts_job_model_spec(&job, &spec), TS_OK);
    ts_model_free(model);
    model = ts_model_build(&spec, 0, -1, ts_key_from_seed(3), TS_F32);
    assert_non_null(model);
    ts_shard_config c = {.job = &job, .shard = 1, .shards = 2, .rank = 1, .root = root, .reply = capture};
    ts_shard *s = ts_shard_create(&c, model);
    assert_non_null(s);
    set_workers(s, 1, (int32_t[]){2, 3}, 2);
    forget_replies();
    return s;
}

/* A request of type t from worker rank, step, generation g. */
static ts_proto_msg request(ts_proto_type t, int32_t rank, int64_t step, uint64_t g) {
    ts_proto_msg m;
    ts_proto_msg_init(&m, t, "t", g, rank);
    m.step = step;
    return m;
}

/* Pushes g[0..len) for keys [off, off + len) of step. */
static void push(ts_shard *s, int32_t rank, int64_t step, uint64_t g, int64_t off, int64_t len, const float *grad) {
    ts_proto_msg m = request(TS_MSG_PUSH, rank, step, g);
    m.dtype = TS_PROTO_DT_F32;
    ts_proto_range r = {(uint64_t)off, (uint64_t)len};
    ts_proto_msg_set_ranges(&m, &r, 1);
    uint64_t bytes = (uint64_t)len * 4;
    ts_proto_frame f = {grad, bytes};
    m.lengths = &bytes, m.nlengths = 1, m.payload = &f;
    ts_shard_handle(s, &who, &m);
    m.lengths = NULL, m.nlengths = 0;
    ts_proto_msg_free(&m);
}

/* Sends a values message (COMMIT, APPLY, REDUCE) of n values. */
static void values(ts_shard *s, ts_proto_type t, int32_t rank, int64_t step, uint64_t g, const double *v, int n) {
    ts_proto_msg m = request(t, rank, step, g);
    m.dtype = TS_PROTO_DT_F64;
    uint64_t bytes = (uint64_t)n * 8;
    ts_proto_frame f = {v, bytes};
    m.lengths = &bytes, m.nlengths = 1, m.payload = &f;
    ts_shard_handle(s, &who, &m);
}

static void commit(ts_shard *s, int32_t rank, int64_t step, uint64_t g, double loss) {
    double v[TS_COMMIT_VALUES] = {loss, 4, 0, 0.01, 0, 4 * step};
    values(s, TS_MSG_COMMIT, rank, step, g, v, TS_COMMIT_VALUES);
}

static void pull(ts_shard *s, int64_t step, int64_t off, int64_t len) {
    ts_proto_msg m = request(TS_MSG_PULL, 2, step, 1);
    m.dtype = TS_PROTO_DT_F32;
    ts_proto_range r = {(uint64_t)off, (uint64_t)len};
    ts_proto_msg_set_ranges(&m, &r, 1);
    ts_shard_handle(s, &who, &m);
    ts_proto_msg_free(&m);
}

/* A gradient for the whole model, different per worker. */
static float *gradient(int worker) {
    float *g = malloc((size_t)model->numel * sizeof *g);
    for (int64_t i = 0; i < model->numel; i++) g[i] = (float)((i * 7 + worker * 13) % 29) / 29.0f - 0.4f;
    return g;
}

/* The average of two workers' gradients as the shard makes it: rank
 * order, then 1/2. */
static float *average(const float *a, const float *b) {
    float *avg = malloc((size_t)model->numel * sizeof *avg);
    for (int64_t i = 0; i < model->numel; i++) avg[i] = a[i] + b[i];
    ts_clip_scale(avg, model->numel, 0.5f);
    return avg;
}

/* The local run's first step of the whole model on gradient g (lr 0.01),
 * and that the pull reply r carries its keys [off, off + len). */
static void assert_local_step(const reply_rec *r, float *g, int64_t off, int64_t len) {
    ts_optim_config oc;
    ts_optim_groups groups;
    assert_int_equal(ts_job_optim_config(&job, &oc), TS_OK);
    assert_int_equal(ts_job_optim_groups(model, &groups), TS_OK);
    assert_int_equal(ts_model_alloc_state(model, ts_optim_state_slots(&oc)), TS_OK);
    assert_int_equal(ts_optim_step_flat(&oc, 1, 0.01, &groups, ts_f32(model->flat_params), g, model->state,
                                        model->numel, 0, model->numel),
                     TS_OK);
    ts_optim_groups_free(&groups);
    assert_int_equal(r->type, TS_MSG_PULL_REPLY);
    assert_int_equal(r->nfloats, (size_t)len);
    assert_memory_equal(r->data, ts_f32(model->flat_params) + off, (size_t)len * 4);
}

/* Workers first..last push gradient g for the whole shard and commit
 * step in generation gen. */
static void commit_all(ts_shard *s, int32_t first, int32_t last, int64_t step, uint64_t gen, const float *g) {
    int64_t off, len;
    ts_shard_range(s, &off, &len);
    for (int32_t r = first; r <= last; r++) {
        push(s, r, step, gen, off, len, g + off);
        commit(s, r, step, gen, 1.0);
    }
}

/* A sync shard (clip_norm clip) whose step 1 workers 2 and 3 decided in
 * generation 1 with gradient *g (made here): the two commit replies in,
 * nothing applied. */
static ts_shard *decided_shard(double clip, float **g) {
    ts_shard *s = make_shard("sync", clip, NULL);
    *g = gradient(2);
    commit_all(s, 2, 3, 1, 1, *g);
    assert_int_equal(nreplies, 2);
    assert_int_equal(ts_shard_step(s), 0);
    return s;
}

/* One sync step of both workers with gradient g. */
static void sync_step(ts_shard *s, int64_t step, const float *g) {
    commit_all(s, 2, 3, step, 1, g);
    double sq = 1;
    values(s, TS_MSG_APPLY, 2, step, 1, &sq, 1);
}

/* ---- tests ---- */

static void test_sync_step_is_the_local_update(void **state) {
    (void)state;
    ts_shard *s = make_shard("sync", 0.5, NULL);
    int64_t off, len;
    ts_shard_range(s, &off, &len);
    assert_true(off > 0 && off + len == model->numel);
    float *g2 = gradient(2), *g3 = gradient(3);
    /* worker 2 pushes in two ranges, worker 3 in one */
    push(s, 2, 1, 1, off, len / 2, g2 + off);
    push(s, 2, 1, 1, off + len / 2, len - len / 2, g2 + off + len / 2);
    push(s, 3, 1, 1, off, len, g3 + off);
    assert_int_equal(nreplies, 0); /* the commits' replies acknowledge the pushes */
    commit(s, 2, 1, 1, 8.0);
    assert_int_equal(nreplies, 0); /* undecided until worker 3 commits */
    commit(s, 3, 1, 1, 4.0);
    assert_int_equal(nreplies, 2);
    float *avg = average(g2, g3);
    double sq = ts_clip_sq_norm(avg + off, len);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(replies[i].type, TS_MSG_COMMIT_REPLY);
        assert_true(replies[i].values[TS_DECIDED_LOSS_SUM] == 12.0);
        assert_true(replies[i].values[TS_DECIDED_SAMPLES] == 8.0);
        assert_true(replies[i].values[TS_DECIDED_SQ_NORM] == sq);
        assert_true(replies[i].values[TS_DECIDED_WORKERS] == 2);
    }
    /* a pull of step 1 waits for the apply */
    pull(s, 1, off, len);
    assert_int_equal(nreplies, 2);
    double total = sq + 0.75; /* the other shard's part, as the workers sum it */
    values(s, TS_MSG_APPLY, 2, 1, 1, &total, 1);
    assert_int_equal(nreplies, 3);
    assert_int_equal(replies[2].type, TS_MSG_PULL_REPLY);
    assert_int_equal(replies[2].step, 1);
    /* the local run: clip the whole gradient by the global norm and step */
    ts_clip_scale(avg, model->numel, (float)ts_clip_coef(sqrt(total), 0.5));
    assert_local_step(&replies[2], avg, off, len);
    /* a repeated commit of the applied step is answered again; a repeated apply is ignored */
    commit(s, 3, 1, 1, 4.0);
    assert_int_equal(replies[3].type, TS_MSG_COMMIT_REPLY);
    values(s, TS_MSG_APPLY, 3, 1, 1, &total, 1);
    assert_int_equal(nreplies, 4);
    assert_int_equal(ts_shard_step(s), 1);
    assert_int_equal(ts_shard_refused(s), 0);
    free(g2), free(g3), free(avg);
    forget_replies();
    ts_shard_free(s);
}

/* A decided step is not stepped before APPLY: when the workers change
 * meanwhile (another shard may have been told first and asked for the
 * step again), the new workers' pushes replace it, and the step is taken
 * once, from them. */
static void test_decided_step_is_redone_by_new_workers(void **state) {
    (void)state;
    float *g;
    ts_shard *s = decided_shard(0, &g);
    int64_t off, len;
    ts_shard_range(s, &off, &len);
    pull(s, 1, off, len);
    assert_int_equal(nreplies, 2); /* decided, not applied: the pull waits */
    set_workers(s, 2, (int32_t[]){2, 3, 4}, 3);
    assert_int_equal(ts_shard_step(s), 0);
    commit_all(s, 2, 4, 1, 2, g);
    assert_int_equal(nreplies, 5);
    assert_int_equal(replies[4].type, TS_MSG_COMMIT_REPLY);
    assert_true(replies[4].values[TS_DECIDED_WORKERS] == 3);
    double sq = 1;
    values(s, TS_MSG_APPLY, 2, 1, 2, &sq, 1);
    assert_int_equal(ts_shard_step(s), 1);
    assert_int_equal(replies[nreplies - 1].type, TS_MSG_PULL_REPLY);
    assert_int_equal(ts_shard_refused(s), 0);
    free(g);
    forget_replies();
    ts_shard_free(s);
}

/* A new primary gets a decided step's messages again from workers whose
 * generation grew with changes of the servers alone: repeats, not a redo,
 * so the step stays decided and the APPLY after them steps it. */
static void test_resent_decided_step_after_server_changes(void **state) {
    (void)state;
    float *g;
    ts_shard *s = decided_shard(0.5, &g);
    set_workers(s, 3, (int32_t[]){2, 3}, 2); /* generations 2 and 3 changed the servers only */
    commit_all(s, 2, 2, 1, 3, g);
    assert_int_equal(nreplies, 3);
    assert_int_equal(replies[2].type, TS_MSG_COMMIT_REPLY);
    double sq = 1;
    values(s, TS_MSG_APPLY, 2, 1, 3, &sq, 1);
    assert_int_equal(ts_shard_step(s), 1);
    assert_int_equal(ts_shard_refused(s), 0);
    free(g);
    forget_replies();
    ts_shard_free(s);
}

static void test_changed_workers_redo_the_step(void **state) {
    (void)state;
    ts_shard *s = make_shard("sync", 0, NULL);
    int64_t off, len;
    ts_shard_range(s, &off, &len);
    float *g2 = gradient(2);
    push(s, 2, 1, 1, off, len, g2 + off);
    commit(s, 2, 1, 1, 1.0);
    push(s, 3, 1, 1, off, len / 2, g2 + off); /* half pushed when it dies */
    forget_replies();
    set_workers(s, 2, (int32_t[]){2}, 1);
    /* the waiting commit is told to compute step 1 again in generation 2 */
    assert_int_equal(nreplies, 1);
    assert_int_equal(replies[0].code, TS_PROTO_E_REDO);
    assert_int_equal(replies[0].generation, 2);
    assert_int_equal(replies[0].step, 1);
    /* a message of the old workers gets the same answer */
    push(s, 2, 1, 1, off, len, g2 + off);
    assert_int_equal(replies[1].code, TS_PROTO_E_REDO);
    /* the dead worker's half is gone: worker 2 alone decides the step */
    push(s, 2, 1, 2, off, len, g2 + off);
    commit(s, 2, 1, 2, 1.0);
    assert_int_equal(replies[nreplies - 1].type, TS_MSG_COMMIT_REPLY);
    assert_true(replies[nreplies - 1].values[TS_DECIDED_WORKERS] == 1);
    assert_true(replies[nreplies - 1].values[TS_DECIDED_SQ_NORM] == ts_clip_sq_norm(g2 + off, len));
    /* a rank that is not a live worker is refused */
    commit(s, 3, 1, 2, 1.0);
    assert_int_equal(replies[nreplies - 1].code, TS_PROTO_E_REFUSED);
    assert_int_equal(ts_shard_refused(s), 1);
    free(g2);
    forget_replies();
    ts_shard_free(s);
}

static void test_restart_behind_and_rollback(void **state) {
    (void)state;
    char root[] = "/tmp/test-shard-XXXXXX";
    assert_non_null(mkdtemp(root));
    ts_shard *s = make_shard("sync", 0, root);
    int64_t off, len;
    ts_shard_range(s, &off, &len);
    float *g = gradient(2);
    sync_step(s, 1, g);
    ts_shard_set_writer(s, true);
    ts_shard_checkpoint(s);
    forget_replies();
    pull(s, 1, off, len);
    float *at1 = replies[0].data;
    replies[0].data = NULL;
    sync_step(s, 2, g);
    assert_int_equal(ts_shard_step(s), 2);
    /* a shard that restarted from step 1 refuses step 3 saying where it is */
    ts_shard *r = make_shard("sync", 0, root);
    bool found;
    assert_int_equal(ts_shard_restore(r, -1, &found), TS_OK);
    assert_true(found);
    assert_int_equal(ts_shard_step(r), 1);
    push(r, 2, 3, 1, off, len, g + off);
    assert_int_equal(replies[0].code, TS_PROTO_E_BEHIND);
    assert_int_equal(replies[0].step, 1);
    /* the others roll back to its step: the parameters of step 1 again */
    forget_replies();
    ts_proto_msg m = request(TS_MSG_ROLLBACK, 2, 1, 1);
    ts_shard_handle(s, &who, &m);
    assert_int_equal(replies[0].type, TS_MSG_ACK);
    assert_int_equal(replies[0].step, 1);
    assert_int_equal(ts_shard_step(s), 1);
    pull(s, 1, off, len);
    assert_memory_equal(replies[1].data, at1, (size_t)len * 4);
    /* step 0 needs no checkpoint: the seed's keys, empty optimizer state */
    m.step = 0;
    ts_shard_handle(s, &who, &m);
    assert_int_equal(replies[2].type, TS_MSG_ACK);
    assert_int_equal(ts_shard_step(s), 0);
    assert_int_equal(ts_shard_updates(s), 0);
    pull(s, 0, off, len);
    assert_memory_equal(replies[3].data, ts_f32(model->flat_params) + off, (size_t)len * 4);
    /* a step without a checkpoint cannot be returned to */
    sync_step(s, 1, g);
    sync_step(s, 2, g);
    assert_int_equal(ts_io_remove_tree(root), TS_OK);
    m.step = 1;
    ts_shard_handle(s, &who, &m);
    assert_int_equal(replies[nreplies - 1].code, TS_PROTO_E_INTERNAL);
    free(g), free(at1);
    forget_replies();
    ts_shard_free(s);
    ts_shard_free(r);
}

static void test_async_applies_each_commit(void **state) {
    (void)state;
    ts_shard *s = make_shard("async", 0, NULL);
    int64_t off, len;
    ts_shard_range(s, &off, &len);
    float *g = gradient(3);
    push(s, 3, 1, 1, off, len, g + off);
    commit(s, 3, 1, 1, 2.0);
    assert_int_equal(ts_shard_updates(s), 1); /* applied without waiting for worker 2 */
    assert_int_equal(replies[0].type, TS_MSG_COMMIT_REPLY);
    assert_true(replies[0].values[TS_DECIDED_LOSS_SUM] == 2.0);
    push(s, 3, 2, 1, off, len, g + off);
    commit(s, 3, 2, 1, 2.0);
    commit(s, 3, 2, 1, 2.0); /* a repeat is answered, not applied */
    assert_int_equal(ts_shard_updates(s), 2);
    assert_int_equal(ts_shard_step(s), 0); /* worker 2 finished no step yet */
    free(g);
    forget_replies();
    ts_shard_free(s);
}

static void test_bad_requests_are_refused(void **state) {
    (void)state;
    ts_shard *s = make_shard("sync", 0, NULL);
    int64_t off, len;
    ts_shard_range(s, &off, &len);
    float *g = gradient(2);
    /* keys of the other shard */
    push(s, 2, 1, 1, 0, 4, g);
    assert_int_equal(replies[0].code, TS_PROTO_E_RANGE);
    /* a commit before the pushes cover the shard */
    push(s, 2, 1, 1, off, 4, g + off);
    commit(s, 2, 1, 1, 1.0);
    assert_int_equal(replies[1].code, TS_PROTO_E_UNEXPECTED);
    /* a commit with too few values */
    double v[2] = {1, 2};
    values(s, TS_MSG_COMMIT, 2, 1, 1, v, 2);
    assert_int_equal(replies[2].code, TS_PROTO_E_PAYLOAD_LEN);
    /* apply of a step nobody decided */
    values(s, TS_MSG_APPLY, 2, 1, 1, v, 1);
    assert_int_equal(replies[3].code, TS_PROTO_E_UNEXPECTED);
    /* a commit whose learning rate is not finite, its pushes complete */
    push(s, 2, 1, 1, off, len, g + off);
    values(s, TS_MSG_COMMIT, 2, 1, 1, (double[TS_COMMIT_VALUES]){1, 4, 0, NAN, 0, 4}, TS_COMMIT_VALUES);
    assert_int_equal(replies[4].code, TS_PROTO_E_FIELD_VALUE);
    /* a type a shard does not take */
    ts_proto_msg m = request(TS_MSG_BARRIER, 2, 1, 1);
    ts_shard_handle(s, &who, &m);
    assert_int_equal(replies[5].code, TS_PROTO_E_UNEXPECTED);
    assert_int_equal(ts_shard_refused(s), 6);
    assert_int_equal(ts_shard_step(s), 0); /* nothing touched the parameters */
    free(g);
    forget_replies();
    ts_shard_free(s);
}

static void test_reduce_sums_over_workers(void **state) {
    (void)state;
    ts_shard *s = make_shard("sync", 0, NULL);
    double a[3] = {1, 2, 3}, b[3] = {10, 20, 30};
    values(s, TS_MSG_REDUCE, 3, 5, 0, a, 3);
    assert_int_equal(nreplies, 0);
    values(s, TS_MSG_REDUCE, 2, 5, 0, b, 3);
    assert_int_equal(nreplies, 2);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(replies[i].type, TS_MSG_REDUCE_REPLY);
        assert_true(replies[i].values[0] == 11 && replies[i].values[1] == 22 && replies[i].values[2] == 33);
    }
    values(s, TS_MSG_REDUCE, 3, 5, 0, a, 3); /* a repeat gets the same sums */
    assert_true(replies[2].values[2] == 33);
    forget_replies();
    ts_shard_free(s);
}

/* REDUCE id of step from worker rank in generation g: values a[0..3),
 * sent from an identity of its own (its first byte the rank). */
static void reduce(ts_shard *s, int32_t rank, int64_t step, int64_t id, uint64_t g, const double *a) {
    ts_proto_msg m = request(TS_MSG_REDUCE, rank, step, g);
    m.barrier_id = id;
    m.dtype = TS_PROTO_DT_F64;
    uint64_t bytes = 3 * 8;
    ts_proto_frame f = {a, bytes};
    m.lengths = &bytes, m.nlengths = 1, m.payload = &f;
    ts_proto_identity from = {{(unsigned char)rank}, 1};
    ts_shard_handle(s, &from, &m);
}

/* A worker that joined after step 1 takes no part in its evaluations: the
 * two that trained it sum theirs; a group that counts the joiner is told
 * to go on without one (it would wait for the joiner's part); at the
 * job's last step every worker evaluates, the joiner too. */
static void test_reduce_leaves_out_a_late_joiner(void **state) {
    (void)state;
    ts_shard *s = make_shard("sync", 0, NULL);
    float *g = gradient(2);
    sync_step(s, 1, g);
    forget_replies();
    double a[3] = {1, 2, 3}, b[3] = {10, 20, 30};
    reduce(s, 2, 1, 0, 1, a);
    set_workers(s, 2, (int32_t[]){2, 3, 4}, 3); /* rank 4 joins after step 1 */
    reduce(s, 3, 1, 0, 1, b);
    assert_int_equal(nreplies, 2);
    assert_int_equal(replies[1].type, TS_MSG_REDUCE_REPLY);
    assert_true(replies[1].values[0] == 11 && replies[1].values[2] == 33);
    reduce(s, 2, 1, 1, 2, a); /* computed by the group of generation 2: 2, 3 and 4 */
    assert_int_equal(nreplies, 3);
    assert_int_equal(replies[2].code, TS_PROTO_E_SKIP);
    reduce(s, 2, 1, 2 + TS_REDUCE_FINAL, 2, a);
    reduce(s, 3, 1, 2 + TS_REDUCE_FINAL, 2, a);
    assert_int_equal(nreplies, 3);
    reduce(s, 4, 1, 2 + TS_REDUCE_FINAL, 2, b);
    assert_int_equal(nreplies, 6);
    assert_true(replies[5].values[0] == 12);
    reduce(s, 4, 1, 1 + TS_REDUCE_FINAL, 2, b); /* one the others finished */
    assert_int_equal(replies[6].code, TS_PROTO_E_SKIP);
    /* a worker leaves an open reduction: the new group counts rank 4 */
    reduce(s, 2, 1, 3, 1, a);
    set_workers(s, 3, (int32_t[]){2, 4}, 2);
    assert_int_equal(nreplies, 8);
    assert_int_equal(replies[7].code, TS_PROTO_E_SKIP);
    reduce(s, 2, 1, 3, 3, a);
    assert_int_equal(replies[8].code, TS_PROTO_E_SKIP);
    free(g);
    forget_replies();
    ts_shard_free(s);
}

/* Async: worker 3 took step 1 and waits in its evaluation; rank 4 joins
 * once both workers took it, and worker 2's group counts it: the
 * evaluation is skipped for both (worker 3 would wait for worker 2's
 * part), and for a repeat of it. */
static void test_skip_answers_every_worker_in_it(void **state) {
    (void)state;
    ts_shard *s = make_shard("async", 0, NULL);
    float *g = gradient(2);
    commit_all(s, 2, 3, 1, 1, g);
    assert_int_equal(ts_shard_step(s), 1);
    forget_replies();
    double a[3] = {1, 2, 3};
    reduce(s, 3, 1, 0, 1, a);
    assert_int_equal(nreplies, 0);
    set_workers(s, 2, (int32_t[]){2, 3, 4}, 3);
    reduce(s, 2, 1, 0, 2, a);
    assert_int_equal(nreplies, 2);
    assert_int_equal(replies[0].code, TS_PROTO_E_SKIP);
    assert_int_equal(replies[0].to, 2);
    assert_int_equal(replies[1].code, TS_PROTO_E_SKIP);
    assert_int_equal(replies[1].to, 3);
    reduce(s, 3, 1, 0, 1, a);
    assert_int_equal(nreplies, 3);
    assert_int_equal(replies[2].code, TS_PROTO_E_SKIP);
    free(g);
    forget_replies();
    ts_shard_free(s);
}

/* A worker back under its rank (a restart the shard saw no roster
 * without) left and joined: its part of the open evaluation died with
 * the old process, and the new one joined after the step. */
static void test_worker_back_under_its_rank_left(void **state) {
    (void)state;
    ts_shard *s = make_shard("sync", 0, NULL);
    float *g = gradient(2);
    sync_step(s, 1, g);
    forget_replies();
    double a[3] = {1, 2, 3};
    reduce(s, 2, 1, 0, 1, a);
    ts_proto_member w[2] = {{.rank = 2, .role = TS_ROLE_WORKER, .alive = true, .joined_generation = 1},
                            {.rank = 3, .role = TS_ROLE_WORKER, .alive = true, .joined_generation = 2}};
    ts_shard_workers(s, 2, w, 2);
    assert_int_equal(nreplies, 1);
    assert_int_equal(replies[0].code, TS_PROTO_E_SKIP);
    free(g);
    forget_replies();
    ts_shard_free(s);
}

/* Values of two sets of workers do not add up: the older computes again. */
static void test_reduce_of_two_worker_sets_is_redone(void **state) {
    (void)state;
    ts_shard *s = make_shard("async", 0, NULL);
    double a[3] = {1, 2, 3};
    reduce(s, 2, 5, 0, 1, a);                        /* rank 4 trains step 5 with them: */
    set_workers(s, 2, (int32_t[]){2, 3, 4}, 3); /* it joins at step 0 */
    reduce(s, 3, 5, 0, 2, a);
    assert_int_equal(nreplies, 1);
    assert_int_equal(replies[0].code, TS_PROTO_E_REDO);
    assert_int_equal(replies[0].generation, 2);
    reduce(s, 2, 5, 0, 2, a);
    reduce(s, 4, 5, 0, 2, a);
    assert_int_equal(nreplies, 4);
    assert_true(replies[3].values[0] == 3);
    forget_replies();
    ts_shard_free(s);
}

static int teardown(void **state) {
    (void)state;
    ts_model_free(model);
    model = NULL;
    return 0;
}

/* The shard's whole state, malloc'd (free with free_state). */
static ts_shard_state state_of(const ts_shard *s) {
    ts_shard_state st;
    ts_shard_snapshot_size(s, &st);
    st.head = malloc(st.nhead * sizeof *st.head);
    st.values = malloc(st.nvalues * sizeof *st.values);
    st.data = malloc((size_t)(st.ndata ? st.ndata : 1) * sizeof *st.data);
    assert_true(st.head && st.values && st.data);
    ts_shard_snapshot(s, &st);
    return st;
}

static void free_state(ts_shard_state *st) { free(st->head), free(st->values), free(st->data); }

static ts_status install(ts_shard *s, const ts_shard_state *st) {
    return ts_shard_install(s, st->head, st->nhead, st->values, st->nvalues, st->data, st->ndata);
}

static void same_state(const ts_shard *a, const ts_shard *b) {
    ts_shard_state x = state_of(a), y = state_of(b);
    assert_int_equal(x.nhead, y.nhead);
    assert_int_equal(x.nvalues, y.nvalues);
    assert_int_equal(x.ndata, y.ndata);
    assert_memory_equal(x.head, y.head, x.nhead * sizeof *x.head);
    assert_memory_equal(x.values, y.values, x.nvalues * sizeof *x.values);
    assert_memory_equal(x.data, y.data, (size_t)x.ndata * sizeof *x.data);
    free_state(&x), free_state(&y);
}

static void test_spare_takes_the_state(void **state) {
    (void)state;
    ts_shard *a = make_shard("sync", 0, NULL), *b = make_shard("sync", 0, NULL);
    int64_t off, len;
    ts_shard_range(a, &off, &len);
    float *g = gradient(2);
    sync_step(a, 1, g);
    /* mid-step 2: worker 2 pushed and committed, worker 3 pushed half */
    push(a, 2, 2, 1, off, len, g + off);
    commit(a, 2, 2, 1, 1.0);
    push(a, 3, 2, 1, off, len / 2, g + off);
    ts_shard_state st = state_of(a);
    /* damaged states are refused, naming what is wrong, and change nothing */
    int64_t was = st.head[1];
    st.head[1] = off + 1;
    assert_int_equal(install(b, &st), TS_ERR_FORMAT);
    assert_non_null(strstr(ts_last_error(), "keys"));
    st.head[1] = was;
    assert_int_equal(ts_shard_install(b, st.head, st.nhead, st.values, st.nvalues, st.data, st.ndata - 1),
                     TS_ERR_FORMAT);
    assert_non_null(strstr(ts_last_error(), "floats"));
    assert_int_equal(ts_shard_install(b, st.head, st.nhead - 1, st.values, st.nvalues, st.data, st.ndata),
                     TS_ERR_FORMAT);
    assert_int_equal(ts_shard_step(b), 0);
    /* the whole state: b is a, and the rest of the step keeps them equal */
    assert_int_equal(install(b, &st), TS_OK);
    free_state(&st);
    assert_int_equal(ts_shard_step(b), 1);
    same_state(a, b);
    ts_shard_set_replies(b, false);
    for (ts_shard *s = a; s; s = s == a ? b : NULL) {
        push(s, 3, 2, 1, off + len / 2, len - len / 2, g + off + len / 2);
        commit(s, 3, 2, 1, 1.0);
        double sq = 1;
        values(s, TS_MSG_APPLY, 2, 2, 1, &sq, 1);
    }
    assert_int_equal(ts_shard_step(b), 2);
    same_state(a, b);
    free(g);
    forget_replies();
    ts_shard_free(a);
    ts_shard_free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sync_step_is_the_local_update),
        cmocka_unit_test(test_changed_workers_redo_the_step),
        cmocka_unit_test(test_decided_step_is_redone_by_new_workers),
        cmocka_unit_test(test_resent_decided_step_after_server_changes),
        cmocka_unit_test(test_restart_behind_and_rollback),
        cmocka_unit_test(test_async_applies_each_commit),
        cmocka_unit_test(test_bad_requests_are_refused),
        cmocka_unit_test(test_reduce_sums_over_workers),
        cmocka_unit_test(test_reduce_leaves_out_a_late_joiner),
        cmocka_unit_test(test_reduce_of_two_worker_sets_is_redone),
        cmocka_unit_test(test_worker_back_under_its_rank_left),
        cmocka_unit_test(test_skip_answers_every_worker_in_it),
        cmocka_unit_test(test_spare_takes_the_state),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}
