/* strategy_pipeline.c - strategy "pipeline": the model cut by layers into P
 * stage processes, like GPipe, PipeDream-flush (1F1B) and Megatron.
 *
 * The job's workers are P stages x D replicas (parallel.stages,
 * parallel.data_parallel): job rank r (under mpirun: the rank among the
 * workers' MPI processes) is stage r % P of replica r / P. A
 * worker joins before it builds anything (its units depend on its rank),
 * then builds only its stage's units (pipeline_plan.h: a given or profiled
 * cut), so it holds only their flat buffers, gradients and optimizer state.
 * With parallel.chunks_per_stage V > 1 (interleaved 1F1B) the model is cut
 * into P x V pieces and stage s holds pieces s, s + P, ... as the chunks
 * 0 .. V-1 of one model (ts_model_build_runs), each run alone
 * (ts_model_forward_units): a micro-batch passes through the stages V
 * times, the last stage handing chunk c's output to stage 0's chunk c + 1.
 *
 * Every step, each stage reads the step's batch (train.batch_size) and cuts
 * it into M micro-batches (parallel.micro_batches); stage 0 feeds their
 * inputs, the last stage their targets. Activations go forward and their
 * gradients backward between neighbouring stages over the replica's
 * communicator (send/recv, in order per pair; the ring over ZeroMQ, or MPI
 * under mpirun; with V > 1 the gradients have a communicator of their own,
 * since the activations then flow both ways between two stages too, and
 * under mpirun the sends queue apart from the receives): a
 * forward's output is sent (its shape first for each chunk's first
 * micro-batch of the step only: every micro-batch of a step has its rows
 * and shape, so the next stage expects it and a hand-off is one message)
 * while the stage goes on with its next operation, and what a neighbour
 * sends is received by the port's I/O thread while the stage computes. A
 * micro-batch's output goes with its backward, its received input (and
 * that input's gradient) once the gradient's send has ended, so a stage
 * holds the micro-batches in flight only. The
 * order of a stage's forwards and backwards is parallel.schedule's (gpipe
 * or 1f1b, interleaved with V > 1: sharding/schedule.h); each chunk's last
 * backward announces each parameter as its gradient is final (the
 * trainer's hooks), and with D > 1
 * its buckets are averaged over the stage's replicas on their own
 * communicator while backward goes on (buckets.h, as DDP does). A GPT's
 * embedding (stage 0) and head (the last stage) hold one tied weight each:
 * the two stages add each other's gradient to theirs before the step, so
 * the two copies stay equal. Then every stage steps its own parameters; the
 * gradient norm for clipping is summed over the stages (the tied weight
 * once), the step's loss is the last stage's, shared with every stage.
 *
 * A pipeline cannot route around a dead stage: a send or receive that fails
 * (a dropped connection) or a new generation that lacks one of the job's
 * workers (the scheduler's heartbeat timeout) stops the stage with an error
 * naming the stage, the step, the micro-batch and the peer. A live stage
 * may be silent for long while its neighbours compute (the bubble, a
 * stage's first step after a restart), so an operation gives up on a
 * silent peer only after parallel.barrier_timeout_ms; tessera-run
 * then restarts every stage from the last checkpoint. Checkpoints are per
 * stage plus an index (checkpoint_parts.h), loadable into a local run or
 * another cut. With parallel.timeline each stage appends its forward and
 * backward intervals per step to <run>/timeline/stage-<s>-replica-<d>.jsonl,
 * each with the allocator's bytes in use after it ("held": once the step's
 * batch is in): what the micro-batches in flight hold.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "collective/mpi.h"
#include "collective/ring.h"
#include "kernels/alloc.h"
#include "kernels/autograd.h"
#include "kernels/clock.h"
#include "kernels/ops/elementwise.h"
#include "kernels/ops/loss.h"
#include "kernels/ops/view.h"
#include "kernels/optim/clip.h"
#include "sharding/schedule.h"
#include "worker/buckets.h"
#include "worker/checkpoint_parts.h"
#include "worker/metrics.h"
#include "worker/pipeline_plan.h"
#include "worker/strategy.h"
#include "worker/trainer.h"

/* How often a waiting stage looks for a new generation (ms). */
#define LOOK_MS 20
/* The most elements one activation may have (a header asking for more is
 * refused). */
#define MAX_ACTIVATION ((int64_t)1 << 31)
/* An activation's header: ndim, then its shape. */
enum { HEADER = 1 + TS_MAX_DIMS };

/* One micro-batch in flight at this stage. */
typedef struct {
    ts_tensor *in;          /* stage > 0: the activation received (a leaf) */
    ts_tensor *out;         /* the output, graph kept for backward; the last
                             * stage: the loss scaled by 1/M */
    int64_t header[HEADER]; /* the shape of the output sent on */
    ts_comm_req *sent[3];   /* header and output sent on, gradient sent back */
} micro;

/* One interval of compute, for the timeline. */
typedef struct {
    char kind; /* 'F' or 'B' */
    int micro, chunk;
    double start, end;
    size_t held; /* allocator bytes in use after it */
} interval;

typedef struct {
    ts_strategy base;
    int P, D, V, stage, replica, M;
    int *cut;                  /* first unit of each of the P x V pieces, then the unit count */
    int chunk_at[TS_MAX_UNIT_RUNS + 1]; /* the first of the stage model's units of each chunk */
    int64_t shape_out[TS_MAX_UNIT_RUNS][HEADER]; /* per chunk: the last activation header sent ... */
    int64_t shape_in[TS_MAX_UNIT_RUNS][HEADER];  /* ... and received: the step's shape */
    ts_ring_port *pipe_port;   /* the replica's pipeline communicator's port */
    ts_ring_port *back_port;   /* V > 1: the port of its gradients' communicator */
    ts_ring_port *dp_port;     /* the stage's replicas' port (D > 1) */
    void *mpi_world;           /* under mpirun: the workers' MPI_Comm *, else NULL */
    void *mpi_split[3];        /* the MPI communicators of pipe, back and dp */
    ts_comm *pipe;             /* rank = stage: activations forward, collectives */
    ts_comm *back;             /* rank = stage: gradients backward; pipe itself
                                * on the ring when V = 1, its own under MPI
                                * (where a send waits for its receive, the
                                * directions must not queue behind each other)
                                * and with V > 1 (a pair's stream must carry
                                * one kind of data) */
    ts_comm *pipe_tx, *back_tx; /* where pipe's and back's sends queue: themselves,
                                * but under mpirun with V > 1 queues of their own
                                * on the same MPI communicators (a looped
                                * pipeline sends both ways between two stages,
                                * and an MPI send waits for its receive: queued
                                * before a receive it would wait on itself) */
    ts_comm *dp;               /* rank = replica; NULL when D = 1 */
    ts_buckets *buckets;       /* D > 1: the gradient buckets averaged over dp */
    ts_pipe_op *ops;           /* this stage's order, 2VM operations */
    micro *mb;                 /* chunk c's micro-batch m at c * M + m */
    micro *sending_back;       /* the last backward whose input's gradient is on its way */
    ts_batch batch;            /* the step's batch */
    bool have_batch;
    int tied;                  /* model index of the tied wte.weight (first and
                                * last stage of a GPT), else -1 */
    float *tied_other;         /* the other stage's gradient of it */
    double loss;               /* the step's loss (the last stage's) */
    char lost[512];            /* why the pipeline broke, "" while it holds */
    /* where the stage is, for error messages (the ranks of its
     * communicators' messages are stages, and replicas) */
    bool in_step;
    int at_micro, at_chunk;
    const char *at_what;
    FILE *timeline;
    interval *iv;
    int niv;
    double step_start;
    size_t step_held;          /* allocator bytes in use once the step's batch is in */
} pipe_strategy;

/* ---- errors ---- */

/* Rewrites the last error as "pipeline stage S of P (replica R), step K,
 * micro-batch M (what): <error>" (outside a step's micro-batches "step K,
 * after its micro-batch M-1" or "after step K") and returns its status. */
static ts_status stage_error(pipe_strategy *p) {
    ts_status st = ts_last_status() ? ts_last_status() : TS_ERR_STATE;
    char msg[1600];
    snprintf(msg, sizeof msg, "%s%s%s%s", ts_last_error(), p->lost[0] ? " (" : "", p->lost, p->lost[0] ? ")" : "");
    long long step = (long long)p->base.trainer->step;
    char where[96];
    if (p->at_micro >= 0 && p->V > 1)
        snprintf(where, sizeof where, "step %lld, micro-batch %d, chunk %d", step + 1, p->at_micro, p->at_chunk);
    else if (p->at_micro >= 0) snprintf(where, sizeof where, "step %lld, micro-batch %d", step + 1, p->at_micro);
    else if (p->in_step) snprintf(where, sizeof where, "step %lld, after its micro-batch %d", step + 1, p->M - 1);
    else snprintf(where, sizeof where, "after step %lld", step);
    return ts_error(st, "pipeline stage %d of %d (replica %d), %s (%s): %s", p->stage, p->P, p->replica, where,
                    p->at_what ? p->at_what : "step", msg);
}

/* Stage and replica of job rank r, as people read it. */
static void describe_rank(const pipe_strategy *p, int r, char *out, size_t cap) {
    snprintf(out, cap, "rank %d (stage %d, replica %d)", r, r % p->P, r / p->P);
}

/* The piece of the model chunk c of this stage is; the stages after and
 * before this one around the loop (with V = 1 the ends are never used). */
static int piece_of(const pipe_strategy *p, int c) { return c * p->P + p->stage; }
static int next_stage(const pipe_strategy *p) { return (p->stage + 1) % p->P; }
static int prev_stage(const pipe_strategy *p) { return (p->stage + p->P - 1) % p->P; }

/* Notes (once) that the pipeline broke when the scheduler announced a
 * generation without one of the job's workers or stopped the job. */
static void look(pipe_strategy *p) {
    ts_member *m = p->base.member;
    if (p->lost[0] || !m) return;
    char reason[256];
    int code = 0;
    /* a job that finished (code 0) still evaluates and saves */
    if (ts_member_shutdown_requested(m, &code, reason, sizeof reason) && code != 0) {
        snprintf(p->lost, sizeof p->lost, "the job was stopped: %s", reason);
        return;
    }
    uint64_t g;
    ts_proto_member *r = NULL;
    size_t n = 0;
    if (!ts_member_poll_membership(m, &g, &r, &n)) return;
    int W = p->P * p->D;
    for (int want = 0; want < W && !p->lost[0]; want++) {
        bool there = false;
        for (size_t i = 0; i < n; i++) there |= r[i].role == TS_ROLE_WORKER && r[i].alive && r[i].rank == want;
        if (!there) {
            char who[64];
            describe_rank(p, want, who, sizeof who);
            snprintf(p->lost, sizeof p->lost, "worker %s left the job (generation %llu); a pipeline cannot go on "
                     "without it", who, (unsigned long long)g);
        }
    }
    free(r);
}

/* Aborts every communicator of the stage (the pipeline broke, or ends). */
static void abort_all(pipe_strategy *p) {
    ts_comm *all[] = {p->pipe, p->back, p->pipe_tx, p->back_tx, p->dp};
    for (int k = 0; k < 5; k++)
        if (all[k]) ts_comm_abort(all[k]);
}

/* Waits for req, looking at the job while it waits: a broken pipeline
 * abandons the operation (and every other). The time goes to the step's
 * wait_ms. */
static ts_status finish(pipe_strategy *p, ts_comm_req *req) {
    double t0 = ts_clock_ms();
    for (;;) {
        bool done;
        ts_status st = ts_comm_wait_ms(req, LOOK_MS, &done);
        if (done) {
            p->base.times.wait_ms += ts_clock_ms() - t0; /* the step log's "wait": bubble and transfer */
            return st;
        }
        look(p);
        if (p->lost[0]) abort_all(p);
    }
}

/* Starts a send or receive of count elements of buf with the stage peer on
 * c (p->pipe: activations, forward; p->back: gradients, backward; a send
 * queues on c's pipe_tx or back_tx). */
static ts_status start_pair(pipe_strategy *p, ts_comm *c, ts_comm_kind kind, void *buf, int64_t count, ts_dtype dt,
                            int peer, ts_comm_req **req) {
    ts_comm_op op = {.kind = kind, .send = buf, .recv = buf, .count = count, .dtype = dt, .peer = peer,
                     .step = p->base.trainer->step + 1};
    if (kind == TS_COMM_SEND) c = c == p->pipe ? p->pipe_tx : c == p->back ? p->back_tx : c;
    return ts_comm_start(c, &op, req);
}

/* Receives count elements from stage peer on c into buf (blocking); what
 * names the data in errors. */
static ts_status recv_from(pipe_strategy *p, ts_comm *c, void *buf, int64_t count, ts_dtype dt, int peer,
                           const char *what) {
    ts_comm_req *req;
    ts_status st = start_pair(p, c, TS_COMM_RECV, buf, count, dt, peer, &req);
    if (!st) st = finish(p, req);
    if (st) return ts_error(st, "%s from stage %d: %s", what, peer, ts_last_error());
    return TS_OK;
}

/* Waits for a send started earlier (*req NULL: none). */
static ts_status settle(pipe_strategy *p, ts_comm_req **req, const char *what, int peer) {
    if (!*req) return TS_OK;
    ts_status st = finish(p, *req);
    *req = NULL;
    if (st) return ts_error(st, "%s to stage %d: %s", what, peer, ts_last_error());
    return TS_OK;
}

/* ---- activations between stages ---- */

/* Starts sending activation y (contiguous f32) of chunk c to the next
 * stage: with header, its shape first, else only its data, whose shape
 * must be that of the chunk's last header sent (every micro-batch of a
 * step has the rows and the shape of the first: the next stage expects
 * it); u keeps the header and the requests. */
static ts_status send_activation(pipe_strategy *p, int c, micro *u, ts_tensor *y, bool header) {
    int64_t *shape = p->shape_out[c];
    u->header[0] = y->ndim;
    for (int d = 0; d < TS_MAX_DIMS; d++) u->header[1 + d] = d < y->ndim ? y->shape[d] : 0;
    ts_status st = TS_OK;
    if (header) {
        memcpy(shape, u->header, sizeof p->shape_out[c]);
        st = start_pair(p, p->pipe, TS_COMM_SEND, u->header, HEADER, TS_I64, next_stage(p), &u->sent[0]);
    } else if (memcmp(shape, u->header, sizeof p->shape_out[c]) != 0) {
        return ts_error(TS_ERR_SHAPE, "the stage's output is %s, but the step's first micro-batch gave %s: every "
                        "micro-batch of a step must give the same shape", ts_shape_str(y),
                        ts_dims_str((int)shape[0], shape + 1));
    }
    if (!st)
        st = start_pair(p, p->pipe, TS_COMM_SEND, ts_f32(y), ts_tensor_numel(y), TS_F32, next_stage(p), &u->sent[1]);
    return st;
}

/* Receives the previous stage's activation for chunk c: a new f32 tensor
 * shaped by the header received first (checked against its limits) or,
 * without header, by the chunk's last one received (send_activation's
 * rule). */
static ts_status recv_activation(pipe_strategy *p, int c, ts_tensor **x, bool header) {
    int64_t *h = p->shape_in[c];
    if (header) {
        ts_status st = recv_from(p, p->pipe, h, HEADER, TS_I64, prev_stage(p), "activation header");
        if (st) return st;
    }
    int64_t numel = 1;
    bool ok = h[0] >= 1 && h[0] <= TS_MAX_DIMS;
    for (int d = 0; ok && d < h[0]; d++) {
        ok = h[1 + d] >= 1 && h[1 + d] <= MAX_ACTIVATION / numel;
        if (ok) numel *= h[1 + d];
    }
    if (!ok)
        return ts_error(TS_ERR_FORMAT, "stage %d sent an activation header of %lld dimensions [%lld, %lld, ...]; "
                        "at most %d dimensions of %lld elements in all", prev_stage(p), (long long)h[0],
                        (long long)h[1], (long long)h[2], TS_MAX_DIMS, (long long)MAX_ACTIVATION);
    *x = ts_tensor_empty(TS_F32, (int)h[0], h + 1);
    if (!*x) return ts_last_status();
    ts_status st = recv_from(p, p->pipe, ts_f32(*x), numel, TS_F32, prev_stage(p), "activation");
    if (st) {
        ts_tensor_release(*x);
        *x = NULL;
    }
    return st;
}

/* ---- one micro-batch ---- */

/* Rows [m * b, (m + 1) * b) of batch tensor t (b = the micro-batch size). */
static ts_tensor *rows(pipe_strategy *p, ts_tensor *t, int m) {
    int64_t b = t->shape[0] / p->M;
    return ts_narrow(t, 0, m * b, b);
}

/* Stage 0's input of micro-batch m (images flattened for the MLP). */
static ts_tensor *first_input(pipe_strategy *p, int m) {
    ts_tensor *x = rows(p, p->batch.x, m);
    if (!x || p->base.trainer->spec.arch != TS_ARCH_MLP) return x;
    ts_tensor *flat = ts_flatten(x, 1, -1);
    ts_tensor_release(x);
    return flat;
}

/* The last stage: micro-batch m's mean loss for logits, into *loss, and
 * that loss scaled by 1/M (what its backward starts from). */
static ts_tensor *scaled_loss(pipe_strategy *p, ts_tensor *logits, int m, double *loss) {
    ts_tensor *y = rows(p, p->batch.y, m);
    ts_tensor *l2 = ts_reshape(logits, 2, (int64_t[]){-1, logits->shape[logits->ndim - 1]});
    ts_tensor *target = y ? ts_reshape(y, 1, (int64_t[]){-1}) : NULL;
    ts_tensor *l = l2 && target ? ts_cross_entropy(l2, target, -100, TS_REDUCTION_MEAN) : NULL;
    ts_tensor *scaled = NULL;
    if (l) {
        *loss = ts_tensor_item(l);
        scaled = p->M == 1 ? ts_tensor_retain(l) : ts_mul_scalar(l, 1.0 / p->M);
    }
    ts_tensor *t[] = {y, l2, target, l};
    for (int i = 0; i < 4; i++) ts_tensor_release(t[i]);
    return scaled;
}

/* Notes a compute interval for the timeline. */
static void note(pipe_strategy *p, char kind, int c, int m, double start) {
    if (p->iv) p->iv[p->niv++] = (interval){kind, m, c, start, ts_clock_ms(), ts_alloc_get_stats().allocated};
}

/* Runs chunk c of the stage on x. */
static ts_tensor *run_chunk(pipe_strategy *p, int c, ts_tensor *x) {
    return ts_model_forward_units(p->base.trainer->model, x, p->chunk_at[c], p->chunk_at[c + 1]);
}

/* Forward of micro-batch m through chunk c: receive (or take) the input,
 * run the chunk, send the output on (or, the model's last piece, keep the
 * loss). */
static ts_status forward_micro(pipe_strategy *p, int c, int m) {
    micro *u = &p->mb[c * p->M + m];
    int piece = piece_of(p, c);
    ts_status st = TS_OK;
    ts_tensor *x;
    p->at_what = "forward";
    ts_trainer_dropout_key(p->base.trainer, m);
    if (piece == 0) {
        x = first_input(p, m);
        if (!x) return ts_last_status();
    } else {
        if ((st = recv_activation(p, c, &u->in, m == 0))) return st;
        if ((st = ts_set_requires_grad(u->in, true))) return st;
        x = ts_tensor_retain(u->in);
    }
    double t0 = ts_clock_ms();
    ts_tensor *y = run_chunk(p, c, x);
    ts_tensor_release(x);
    if (!y) return ts_last_status();
    if (piece == p->P * p->V - 1) {
        double l = 0;
        u->out = scaled_loss(p, y, m, &l);
        ts_tensor_release(y);
        if (!u->out) return ts_last_status();
        p->loss += l / p->M;
        note(p, 'F', c, m, t0);
        return TS_OK;
    }
    u->out = y;
    note(p, 'F', c, m, t0);
    if (!ts_tensor_is_contiguous(y)) return ts_error(TS_ERR_STATE, "the stage's output is not contiguous");
    return send_activation(p, c, u, y, m == 0);
}

/* Backward of micro-batch m through chunk c: receive the gradient of the
 * output (unless the model's last piece), run backward, send the input's
 * gradient back (unless the first piece). last: the chunk's last backward
 * of the step (its parameters' gradients become final). */
static ts_status backward_micro(pipe_strategy *p, int c, int m, bool last) {
    micro *u = &p->mb[c * p->M + m];
    int piece = piece_of(p, c);
    ts_trainer *t = p->base.trainer;
    ts_tensor *g = NULL;
    ts_status st = TS_OK;
    p->at_what = "backward";
    if (piece < p->P * p->V - 1) {
        g = ts_tensor_empty(TS_F32, u->out->ndim, u->out->shape);
        if (!g) return ts_last_status();
        st = recv_from(p, p->back, ts_f32(g), ts_tensor_numel(g), TS_F32, next_stage(p), "gradient");
    }
    double t0 = ts_clock_ms();
    t->last_micro = last;
    ts_trainer_dropout_key(t, m); /* a recomputed block draws its forward's masks */
    if (!st) st = ts_backward(u->out, g);
    t->last_micro = false;
    /* bf16 compute: this micro-batch's gradients into the f32 master */
    if (!st) st = ts_model_fold_compute_grads(t->model, 1.0f);
    ts_tensor_release(g);
    if (st) return st;
    note(p, 'B', c, m, t0);
    /* its output was sent long ago: let it go with its graph */
    if ((st = settle(p, &u->sent[0], "activation header", next_stage(p))) ||
        (st = settle(p, &u->sent[1], "activation", next_stage(p))))
        return st;
    ts_tensor_release(u->out);
    u->out = NULL;
    if (piece == 0) return TS_OK;
    ts_tensor *dx = u->in->grad;
    if (!dx || dx->dtype != TS_F32 || !ts_tensor_is_contiguous(dx))
        return ts_error(TS_ERR_STATE, "backward left no contiguous f32 gradient for the stage's input");
    st = start_pair(p, p->back, TS_COMM_SEND, ts_f32(dx), ts_tensor_numel(dx), TS_F32, prev_stage(p), &u->sent[2]);
    /* the previous backward's input and its gradient, sent by now as a
     * rule: let them go, so that a stage holds only the micro-batches in
     * flight (without waiting: an MPI send ends only once received; one
     * still going is settled with the step) */
    micro *v = p->sending_back;
    p->sending_back = u;
    if (!st && v && v->sent[2]) {
        bool done = false;
        st = ts_comm_wait_ms(v->sent[2], 0, &done);
        if (done) v->sent[2] = NULL; /* (freed, whatever its outcome) */
        if (st) return ts_error(st, "gradient to stage %d: %s", prev_stage(p), ts_last_error());
    }
    if (!st && v && !v->sent[2]) {
        ts_tensor_release(v->in);
        v->in = NULL;
    }
    return st;
}

/* Waits for what the step still sends and lets its tensors go. */
static ts_status settle_step(pipe_strategy *p) {
    ts_status first = TS_OK;
    p->sending_back = NULL;
    for (int k = 0; k < p->V * p->M; k++) {
        micro *u = &p->mb[k];
        p->at_chunk = k / p->M;
        p->at_micro = k % p->M;
        ts_status st = settle(p, &u->sent[0], "activation header", next_stage(p));
        if (!st) st = settle(p, &u->sent[1], "activation", next_stage(p));
        if (!st) st = settle(p, &u->sent[2], "gradient", prev_stage(p));
        if (st && !first) first = stage_error(p);
        ts_tensor_release(u->in);
        ts_tensor_release(u->out);
        u->in = u->out = NULL;
    }
    p->at_micro = -1;
    return first;
}

/* ---- after the backwards ---- */

/* The tied weight's gradient: the first and the last stage send theirs to
 * each other and add the other's, so both step the same sum. Stage 0 sends
 * on the forward communicator and the last stage on the backward one, so
 * that neither send waits behind the other where sends wait for their
 * receive (MPI). */
static ts_status tie_grads(pipe_strategy *p) {
    if (p->tied < 0) return TS_OK;
    const ts_param *w = &p->base.trainer->model->params[p->tied];
    float *g = ts_f32(p->base.trainer->model->flat_grads) + w->offset;
    int other = p->stage == 0 ? p->P - 1 : 0;
    ts_comm_req *req;
    p->at_what = "tied weights";
    ts_comm *out = p->stage == 0 ? p->pipe : p->back, *in = p->stage == 0 ? p->back : p->pipe;
    ts_status st = start_pair(p, out, TS_COMM_SEND, g, w->numel, TS_F32, other, &req);
    if (!st) st = recv_from(p, in, p->tied_other, w->numel, TS_F32, other, "gradient of the tied wte.weight");
    if (!st) st = settle(p, &req, "gradient of the tied wte.weight", other);
    for (int64_t i = 0; !st && i < w->numel; i++) g[i] += p->tied_other[i];
    return st;
}

/* The step's loss from the last stage, averaged over the replicas, and
 * the stop votes of every stage and replica. */
static ts_status share_loss(pipe_strategy *p, double *loss) {
    double v[2] = {p->stage == p->P - 1 ? p->loss : 0, ts_strategy_stop_vote(&p->base)};
    p->at_what = "loss";
    ts_status st = ts_comm_allreduce(p->pipe, v, v, 2, TS_F64, TS_REDUCE_SUM);
    if (!st && p->dp) st = ts_comm_allreduce(p->dp, v, v, 2, TS_F64, TS_REDUCE_SUM);
    *loss = v[0] / p->D;
    p->base.stop_agreed = !st && v[1] > 0;
    return st;
}

/* Appends the step's intervals to the timeline file. */
static void write_timeline(pipe_strategy *p) {
    if (!p->timeline) return;
    fprintf(p->timeline, "{\"step\":%lld,\"stage\":%d,\"replica\":%d,\"stages\":%d,\"chunks\":%d,"
            "\"micro_batches\":%d,\"start\":%.3f,\"end\":%.3f,\"held\":%zu,\"ops\":[",
            (long long)p->base.trainer->step + 1, p->stage, p->replica, p->P, p->V, p->M, p->step_start, ts_clock_ms(),
            p->step_held);
    for (int i = 0; i < p->niv; i++)
        fprintf(p->timeline, "%s[\"%c\",%d,%.3f,%.3f,%zu,%d]", i ? "," : "", p->iv[i].kind, p->iv[i].micro,
                p->iv[i].start, p->iv[i].end, p->iv[i].held, p->iv[i].chunk);
    fprintf(p->timeline, "]}\n");
    fflush(p->timeline);
}

/* A bucket's wait over the replicas' communicator. */
static ts_status bucket_wait(void *ctx, ts_comm_req *req) {
    pipe_strategy *p = ctx;
    return finish(p, req);
}

/* ---- the hooks ---- */

/* The roster of the first generation that holds every worker of the job
 * with an address: waits (up to the barrier timeout) for the ones that
 * still join. */
static ts_status await_everyone(pipe_strategy *p, ts_proto_member **r, size_t *n, uint64_t *g) {
    ts_member_info info;
    ts_member_info_get(p->base.member, &info);
    double deadline = ts_clock_ms() + info.barrier_timeout_ms;
    int W = p->P * p->D, missing = -1;
    for (;;) {
        ts_status st = ts_member_roster(p->base.member, r, n, g);
        if (st) return st;
        missing = -1;
        for (int want = 0; want < W && missing < 0; want++) {
            bool there = false;
            for (size_t i = 0; i < *n; i++)
                there |= (*r)[i].role == TS_ROLE_WORKER && (*r)[i].alive && (*r)[i].rank == want && (*r)[i].address[0];
            if (!there) missing = want;
        }
        if (missing < 0) break;
        free(*r);
        *r = NULL;
        if (ts_member_shutdown_requested(p->base.member, NULL, NULL, 0))
            return ts_error(TS_ERR_STATE, "the job was stopped before its %d workers were there", W);
        if (ts_clock_ms() > deadline) {
            char who[64];
            describe_rank(p, missing, who, sizeof who);
            return ts_error(TS_ERR_TIMEOUT, "waited %u ms for the job's %d workers; %s is not there",
                            info.barrier_timeout_ms, W, who);
        }
        ts_sleep_ms(LOOK_MS);
    }
    ts_member_poll_membership(p->base.member, NULL, NULL, NULL); /* this generation is seen */
    return TS_OK;
}

/* The ports a worker announces, in this order: the pipeline's, the
 * gradients' (V > 1), the replicas' (D > 1). */
enum { PORT_PIPE, PORT_BACK, PORT_DP };

/* Field `which` (enum above) of the address a worker announced ("PIPE
 * [BACK] [DP]"), into out. */
static void endpoint_of(const pipe_strategy *p, const char *address, int which, char *out, size_t cap) {
    int field = which == PORT_PIPE ? 0 : which == PORT_BACK ? 1 : p->V > 1 ? 2 : 1;
    for (int k = 0; k < field && address; k++)
        if ((address = strchr(address, ' '))) address++;
    if (!address) address = "";
    const char *sp = strchr(address, ' ');
    snprintf(out, cap, "%.*s", (int)(sp ? sp - address : (long)strlen(address)), address);
}

/* The communicator over the job ranks first, first + stride, ... (count of
 * them) of roster r, on endpoint which (PORT_*) of their addresses; rank =
 * this process's place among them. */
static ts_comm *make_comm(pipe_strategy *p, const ts_proto_member *r, size_t n, uint64_t g, int first, int stride,
                          int count, int which, ts_ring_port *port, int rank) {
    char (*eps)[TS_PROTO_ADDR_MAX + 1] = calloc((size_t)count, sizeof *eps);
    const char **peers = calloc((size_t)count, sizeof *peers);
    ts_comm *c = NULL;
    if (eps && peers) {
        for (int k = 0; k < count; k++) {
            for (size_t i = 0; i < n; i++)
                if (r[i].role == TS_ROLE_WORKER && r[i].alive && r[i].rank == first + k * stride)
                    endpoint_of(p, r[i].address, which, eps[k], sizeof eps[k]);
            peers[k] = eps[k];
        }
        ts_member_info info;
        ts_member_info_get(p->base.member, &info);
        ts_comm_config cfg = {.rank = rank, .size = count, .generation = g,
                              .timeout_ms = (int)info.barrier_timeout_ms, .peers = peers, .native = port};
        c = ts_comm_create(&ts_comm_ring_backend, &cfg);
    } else {
        ts_error(TS_ERR_MEMORY, "strategy pipeline: out of memory for %d peers", count);
    }
    free(eps);
    free(peers);
    return c;
}

/* Under mpirun: the communicators over MPI communicators split from the
 * workers' (every worker splits the same three, in order). */
static ts_status make_mpi_comms(pipe_strategy *p) {
    const ts_comm_backend *be = ts_comm_backend_find("mpi");
    if (!be) return ts_last_status();
    ts_member_info info;
    ts_member_info_get(p->base.member, &info);
    int color[3] = {p->replica, p->replica, p->stage}, key[3] = {p->stage, p->stage, p->replica};
    int size[3] = {p->P, p->P, p->D};
    ts_comm **out[3] = {&p->pipe, &p->back, &p->dp};
    ts_status st = TS_OK;
    for (int k = 0; !st && k < (p->D > 1 ? 3 : 2); k++) {
        st = ts_comm_mpi_split(p->mpi_world, color[k], key[k], &p->mpi_split[k]);
        ts_comm_config cfg = {.rank = key[k], .size = size[k], .generation = info.generation,
                              .timeout_ms = (int)info.barrier_timeout_ms, .native = p->mpi_split[k]};
        if (!st && !(*out[k] = ts_comm_create(be, &cfg))) st = ts_last_status();
        /* the pipeline's two: their sends' own queues when interleaved */
        ts_comm **tx = k == 0 ? &p->pipe_tx : &p->back_tx;
        if (!st && k < 2 && !(*tx = p->V > 1 ? ts_comm_create(be, &cfg) : *out[k])) st = ts_last_status();
    }
    p->base.group.generation = info.generation;
    return st;
}

/* Makes the replica's pipeline communicator and the stage's replicas'
 * communicator, once every worker of the job is there (their ports), or
 * over MPI under mpirun. */
static ts_status make_comms(pipe_strategy *p) {
    if (p->mpi_world) return make_mpi_comms(p);
    ts_proto_member *r = NULL;
    size_t n = 0;
    uint64_t g = 0;
    ts_status st = await_everyone(p, &r, &n, &g);
    if (!st && !(p->pipe = make_comm(p, r, n, g, p->replica * p->P, 1, p->P, PORT_PIPE, p->pipe_port, p->stage)))
        st = ts_last_status();
    p->back = p->pipe;
    if (!st && p->V > 1 &&
        !(p->back = make_comm(p, r, n, g, p->replica * p->P, 1, p->P, PORT_BACK, p->back_port, p->stage)))
        st = ts_last_status();
    if (!st && p->D > 1 && !(p->dp = make_comm(p, r, n, g, p->stage, p->P, p->D, PORT_DP, p->dp_port, p->replica)))
        st = ts_last_status();
    free(r);
    p->pipe_tx = p->pipe; /* the ring's sends never wait for their receives */
    p->back_tx = p->back;
    p->base.group.generation = g;
    return st;
}

/* Broadcasts count int32 of buf from rank 0 of c (rank 0 may be profiling:
 * the others wait up to the communicator's barrier timeout). */
static ts_status share(pipe_strategy *p, ts_comm *c, int32_t *buf, int count) {
    ts_comm_op op = {.kind = TS_COMM_BROADCAST, .send = buf, .recv = buf, .count = count, .dtype = TS_I32,
                     .peer = 0, .step = -1};
    ts_comm_req *req;
    ts_status st = ts_comm_start(c, &op, &req);
    return st ? st : finish(p, req);
}

/* The stage cut: planned by the job's rank 0 (given, or profiled), then
 * broadcast along its pipeline and from each stage to its replicas. */
static ts_status plan_cut(pipe_strategy *p, const ts_model_spec *spec) {
    int units = ts_model_units(spec), pieces = p->P * p->V;
    int32_t *wire = calloc((size_t)pieces + 1, sizeof *wire);
    if (units < 0 || !wire) {
        free(wire);
        return units < 0 ? ts_last_status() : ts_error(TS_ERR_MEMORY, "strategy pipeline: out of memory");
    }
    ts_status st = TS_OK;
    if (p->stage == 0 && p->replica == 0) {
        st = ts_pipeline_plan(&p->base.trainer->job, spec, p->cut);
        for (int i = 0; i <= pieces; i++) wire[i] = st ? -1 : p->cut[i]; /* -1: the others stop too */
    }
    if (p->replica == 0) {
        ts_status shared = share(p, p->pipe, wire, pieces + 1);
        if (!st) st = shared;
    }
    if (p->dp) {
        ts_status shared = share(p, p->dp, wire, pieces + 1);
        if (!st) st = shared;
    }
    for (int i = 0; i <= pieces; i++) p->cut[i] = wire[i];
    if (!st && wire[0] < 0) st = ts_error(TS_ERR_STATE, "stage 0 of replica 0 could not plan the stages");
    if (!st) st = ts_pipeline_check_cut(p->cut, pieces, units);
    free(wire);
    return st;
}

/* The stage's units: its pieces' runs, the first unit of each chunk in its
 * model (chunk_at), and a line on the plan from the job's rank 0. */
static ts_status pipe_units(ts_strategy *s, const ts_model_spec *spec, ts_unit_runs *runs) {
    pipe_strategy *p = (pipe_strategy *)s;
    const ts_job *job = &s->trainer->job;
    if (!s->member) return ts_error(TS_ERR_STATE, "strategy pipeline: the worker has not joined its job");
    ts_member_info info;
    ts_member_info_get(s->member, &info);
    int rank = info.rank, size = p->P * p->D;
    ts_status st = p->mpi_world ? ts_comm_mpi_place(p->mpi_world, &rank, &size) : TS_OK; /* mpirun's order */
    if (st) return st;
    if (rank < 0 || rank >= p->P * p->D || size != p->P * p->D)
        return ts_error(TS_ERR_VALUE, "strategy pipeline: worker rank %d of %d is not one of the %d stages x %d "
                        "replicas", rank, size, p->P, p->D);
    p->stage = rank % p->P;
    p->replica = rank / p->P;
    if (!(p->cut = calloc((size_t)(p->P * p->V) + 1, sizeof *p->cut)))
        return ts_error(TS_ERR_MEMORY, "strategy pipeline: out of memory");
    st = make_comms(p);
    if (!st) st = plan_cut(p, spec);
    if (st) return ts_error(st, "pipeline stage %d of %d (replica %d): %s", p->stage, p->P, p->replica,
                            ts_last_error());
    runs->n = p->V;
    for (int c = 0; c < p->V; c++) {
        runs->first[c] = p->cut[piece_of(p, c)];
        runs->end[c] = p->cut[piece_of(p, c) + 1];
        p->chunk_at[c + 1] = p->chunk_at[c] + runs->end[c] - runs->first[c];
    }
    s->group = (ts_group){.rank = p->replica, .world = p->D, .generation = s->group.generation, .leader = rank == 0};
    if (rank == 0) {
        printf("pipeline: %d stages x %d replicas, %d micro-batches of %lld, schedule %s%s; %s start at units",
               p->P, p->D, p->M, (long long)(job->train.batch_size / p->M),
               job->parallel.schedule == TS_PIPE_GPIPE ? "gpipe" : "1f1b", p->V > 1 ? " interleaved" : "",
               p->V > 1 ? "pieces" : "stages");
        for (int i = 0; i < p->P * p->V; i++) printf(" %d", p->cut[i]);
        printf(" (of %d)\n", p->cut[p->P * p->V]);
    }
    return TS_OK;
}

/* The index of wte.weight in a GPT's first or last stage, else -1. */
static int tied_index(const pipe_strategy *p) {
    const ts_trainer *t = p->base.trainer;
    if (t->spec.arch != TS_ARCH_GPT || (p->stage != 0 && p->stage != p->P - 1)) return -1;
    for (int i = 0; i < t->model->n_params; i++)
        if (!strcmp(t->model->params[i].name, "wte.weight")) return i;
    return -1;
}

/* Opens the stage's timeline file (parallel.timeline); a stage resumed
 * from step k's checkpoint keeps the lines of steps up to k (the later
 * ones are run again), as the run's metrics do. */
static ts_status open_timeline(pipe_strategy *p) {
    const ts_trainer *t = p->base.trainer;
    if (!t->job.parallel.timeline || !t->run_dir[0]) return TS_OK;
    char path[1200];
    snprintf(path, sizeof path, "%s/timeline", t->run_dir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/timeline/stage-%d-replica-%d.jsonl", t->run_dir, p->stage, p->replica);
    if (!(p->timeline = ts_metrics_open_lines(path, t->step, NULL))) return ts_last_status();
    if (!(p->iv = calloc((size_t)(2 * p->V * p->M), sizeof *p->iv)))
        return ts_error(TS_ERR_MEMORY, "strategy pipeline: out of memory for the timeline of %d operations",
                        2 * p->V * p->M);
    return TS_OK;
}

static ts_status pipe_attach(ts_strategy *s) {
    pipe_strategy *p = (pipe_strategy *)s;
    ts_trainer *t = s->trainer;
    ts_model *m = t->model;
    if (m->device.type != TS_DEVICE_CPU) /* activations and gradients travel from host memory */
        return ts_error(TS_ERR_UNSUPPORTED, "pipeline: stages on %s are not supported yet (device \"cpu\" only)",
                        ts_device_name(m->device));
    p->tied = tied_index(p);
    int n = p->V * p->M;
    p->ops = calloc((size_t)2 * n, sizeof *p->ops);
    p->mb = calloc((size_t)n, sizeof *p->mb);
    if (p->tied >= 0) p->tied_other = malloc((size_t)m->params[p->tied].numel * sizeof(float));
    if (!p->ops || !p->mb || (p->tied >= 0 && !p->tied_other))
        return ts_error(TS_ERR_MEMORY, "strategy pipeline: out of memory for %d micro-batches", p->M);
    ts_pipe_shape shape = {t->job.parallel.schedule == TS_PIPE_1F1B, p->P, p->V, p->M};
    ts_status st = ts_pipe_schedule(&shape, p->stage, p->ops);
    if (!st) st = open_timeline(p);
    if (!st && p->D > 1 &&
        !(p->buckets = ts_buckets_new(m, t->job.parallel.bucket_mb, t->job.parallel.wire_dtype == TS_WIRE_BF16)))
        st = ts_last_status();
    if (st) return ts_error(st, "pipeline stage %d of %d (replica %d): %s", p->stage, p->P, p->replica,
                            ts_last_error());
    char units[512] = "";
    for (int c = 0, at = 0; c < p->V && at < (int)sizeof units; c++)
        at += snprintf(units + at, sizeof units - (size_t)at, "%s[%d, %d)", c ? " " : "", p->cut[piece_of(p, c)],
                       p->cut[piece_of(p, c) + 1]);
    printf("pipeline stage %d of %d (replica %d of %d): units %s, %lld parameters%s\n", p->stage, p->P, p->replica,
           p->D, units, (long long)m->numel, p->tied >= 0 ? ", wte.weight tied across the first and last stage" : "");
    return TS_OK;
}

static ts_status pipe_begin_step(ts_strategy *s, int64_t step) {
    (void)step;
    if (ts_member_shutdown_requested(s->member, NULL, NULL, 0)) s->finished = true;
    return TS_OK;
}

/* The schedule's operations for this step's batch. */
static ts_status run_schedule(pipe_strategy *p) {
    ts_status st = TS_OK;
    for (int i = 0; !st && i < 2 * p->V * p->M; i++) {
        ts_pipe_op op = p->ops[i];
        p->at_micro = op.micro;
        p->at_chunk = op.chunk;
        st = op.kind == TS_PIPE_FORWARD ? forward_micro(p, op.chunk, op.micro)
                                        : backward_micro(p, op.chunk, op.micro, op.micro == p->M - 1);
    }
    return st;
}

static ts_status pipe_grads(ts_strategy *s, double *loss, int64_t *samples) {
    pipe_strategy *p = (pipe_strategy *)s;
    ts_trainer *t = s->trainer;
    p->loss = 0;
    p->niv = 0;
    p->at_micro = -1;
    p->at_what = "batch";
    p->step_start = ts_clock_ms();
    p->in_step = true;
    ts_trainer_grads_begin(t);
    if (p->buckets) ts_buckets_reset(p->buckets);
    ts_status st = ts_loader_next(t->loader, &p->batch);
    p->have_batch = !st;
    p->step_held = ts_alloc_get_stats().allocated;
    if (!st) st = run_schedule(p);
    if (!st) {
        p->at_micro = -1;
        p->at_what = "gradients";
        st = ts_trainer_grads_end(t);
    }
    if (st) st = stage_error(p); /* named where it happened */
    ts_status settled = settle_step(p);
    if (!st) st = settled;
    if (p->buckets) {
        p->at_what = "average over the replicas";
        ts_status waited = ts_buckets_wait(p->buckets, ts_f32(t->model->flat_grads), bucket_wait, p);
        if (!st && waited) st = stage_error(p);
    }
    if (!st && (st = tie_grads(p))) st = stage_error(p);
    if (!st && (st = share_loss(p, loss))) st = stage_error(p);
    if (p->have_batch) ts_batch_release(&p->batch);
    p->have_batch = false;
    if (st) return st;
    p->in_step = false;
    write_timeline(p);
    *samples = t->job.train.batch_size * p->D;
    return TS_OK;
}

static ts_status pipe_grads_ready(ts_strategy *s, int64_t offset, int64_t len) {
    pipe_strategy *p = (pipe_strategy *)s;
    if (!p->buckets) return TS_OK;
    return ts_buckets_ready(p->buckets, p->dp, ts_f32(s->trainer->model->flat_grads), offset, len,
                            s->trainer->step + 1);
}

/* The job's gradient norm: the stages' squares summed (the tied weight
 * counted once, on stage 0); replicas hold the same averaged gradients. */
static ts_status pipe_sq_norm(ts_strategy *s, double *global) {
    pipe_strategy *p = (pipe_strategy *)s;
    double local;
    ts_status st = ts_strategy_slices_sq_norm(s, &local);
    if (st) return st;
    if (p->tied >= 0 && p->stage == p->P - 1) {
        const ts_param *w = &s->trainer->model->params[p->tied];
        local -= ts_clip_sq_norm(ts_f32(s->trainer->model->flat_grads) + w->offset, w->numel);
    }
    *global = local;
    st = ts_comm_allreduce(p->pipe, global, global, 1, TS_F64, TS_REDUCE_SUM);
    if (st) {
        p->at_what = "gradient norm";
        p->in_step = true;
        return stage_error(p);
    }
    return TS_OK;
}

/* Evaluation sums: over the stages (only the last one scored), then over
 * the replicas (each scored its share of the batches). */
static ts_status pipe_reduce_sums(ts_strategy *s, double *v, int n) {
    pipe_strategy *p = (pipe_strategy *)s;
    ts_status st = ts_comm_allreduce(p->pipe, v, v, n, TS_F64, TS_REDUCE_SUM);
    if (!st && p->dp) st = ts_comm_allreduce(p->dp, v, v, n, TS_F64, TS_REDUCE_SUM);
    return st;
}

/* Evaluation's forward through the stages (through each V times): the
 * logits on the last one. */
static ts_status pipe_forward(ts_strategy *s, ts_tensor *x, ts_tensor **out) {
    pipe_strategy *p = (pipe_strategy *)s;
    p->at_what = "evaluation";
    p->at_micro = -1;
    *out = NULL;
    ts_status st = TS_OK;
    for (int c = 0; !st && c < p->V; c++) {
        int piece = piece_of(p, c);
        ts_tensor *in = NULL, *y = NULL;
        st = piece == 0 ? TS_OK : recv_activation(p, c, &in, true);
        if (!st && !(y = run_chunk(p, c, piece == 0 ? x : in))) st = ts_last_status();
        ts_tensor_release(in);
        if (!st && piece == p->P * p->V - 1) {
            *out = y;
            return TS_OK;
        }
        micro u = {0};
        if (!st) st = send_activation(p, c, &u, y, true);
        if (!st) st = settle(p, &u.sent[0], "activation header", next_stage(p));
        if (!st) st = settle(p, &u.sent[1], "activation", next_stage(p));
        ts_tensor_release(y);
    }
    return st ? stage_error(p) : TS_OK;
}

static ts_status pipe_end_step(ts_strategy *s, int64_t step) { return ts_strategy_step_done(s, step); }

/* Replica 0's stages save their parts, then the leader the index; the
 * barriers make the index appear only once every part is written. */
static ts_status pipe_save(ts_strategy *s, char *path, size_t cap) {
    pipe_strategy *p = (pipe_strategy *)s;
    if (cap) path[0] = '\0';
    p->at_what = "checkpoint";
    p->at_micro = -1;
    ts_status st = p->replica == 0 ? ts_parts_save_part(s->trainer, p->stage) : TS_OK;
    ts_status met = ts_comm_barrier(p->pipe);
    if (!st) st = met;
    if (!st && p->replica == 0 && p->stage == 0) st = ts_parts_save_index(s->trainer, p->P, path, cap);
    if (!st && p->dp) st = ts_comm_barrier(p->dp);
    return st ? stage_error(p) : TS_OK;
}

static ts_status pipe_load(ts_strategy *s, const char *dir) { return ts_strategy_load_whole(s, dir); }

static void pipe_free(ts_strategy *s) {
    pipe_strategy *p = (pipe_strategy *)s;
    if (p->have_batch) ts_batch_release(&p->batch);
    abort_all(p);
    if (p->buckets) ts_buckets_free(p->buckets);
    for (int m = 0; p->mb && m < p->V * p->M; m++) {
        for (int k = 0; k < 3; k++)
            if (p->mb[m].sent[k]) ts_comm_wait(p->mb[m].sent[k]);
        ts_tensor_release(p->mb[m].in);
        ts_tensor_release(p->mb[m].out);
    }
    if (p->pipe_tx != p->pipe) ts_comm_free(p->pipe_tx);
    if (p->back_tx != p->back) ts_comm_free(p->back_tx);
    if (p->back != p->pipe) ts_comm_free(p->back);
    ts_comm_free(p->pipe);
    ts_comm_free(p->dp);
    for (int k = 0; k < 3; k++) ts_comm_mpi_free(p->mpi_split[k]);
    ts_ring_port_close(p->pipe_port);
    ts_ring_port_close(p->back_port);
    ts_ring_port_close(p->dp_port);
    if (p->timeline) fclose(p->timeline);
    free(p->iv);
    free(p->cut);
    free(p->ops);
    free(p->mb);
    free(p->tied_other);
    free(p);
}

static const ts_strategy_ops pipe_ops = {
    .units = pipe_units,
    .attach = pipe_attach,
    .begin_step = pipe_begin_step,
    .grads = pipe_grads,
    .grads_ready = pipe_grads_ready,
    .slices = ts_strategy_whole_model,
    .reduce_sq_norm = pipe_sq_norm,
    .reduce_sums = pipe_reduce_sums,
    .forward = pipe_forward,
    .end_step = pipe_end_step,
    .save = pipe_save,
    .load = pipe_load,
    .free = pipe_free,
};

ts_strategy *ts_strategy_pipeline_new(const ts_strategy_options *o) {
    pipe_strategy *p = calloc(1, sizeof *p);
    if (!p) {
        ts_error(TS_ERR_MEMORY, "strategy pipeline: out of memory");
        return NULL;
    }
    const ts_job_parallel *jp = &o->job->parallel;
    p->base.ops = &pipe_ops;
    p->base.join_first = true;
    p->base.group = (ts_group){.rank = 0, .world = ts_strategy_data_world(o->job)};
    p->P = jp->stages;
    p->D = jp->data_parallel;
    p->M = jp->micro_batches;
    p->V = jp->chunks_per_stage;
    p->tied = -1;
    p->at_micro = -1;
    p->mpi_world = o->mpi_comm;
    if (p->mpi_world) return &p->base; /* MPI carries it all */
    if (!(p->pipe_port = ts_ring_port_for_job(o->job, o->key_file, "pipe")) ||
        (p->V > 1 && !(p->back_port = ts_ring_port_for_job(o->job, o->key_file, "back"))) ||
        (p->D > 1 && !(p->dp_port = ts_ring_port_for_job(o->job, o->key_file, "dp")))) {
        pipe_free(&p->base);
        return NULL;
    }
    snprintf(p->base.address, sizeof p->base.address, "%s%s%s%s%s", ts_ring_port_endpoint(p->pipe_port),
             p->back_port ? " " : "", p->back_port ? ts_ring_port_endpoint(p->back_port) : "",
             p->dp_port ? " " : "", p->dp_port ? ts_ring_port_endpoint(p->dp_port) : "");
    return &p->base;
}
