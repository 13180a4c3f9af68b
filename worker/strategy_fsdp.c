/* strategy_fsdp.c - strategy "fsdp": fully-sharded data parallelism, like
 * PyTorch FSDP and DeepSpeed ZeRO-3.
 *
 * The model is cut into units (parallel.fsdp_unit "block": the embedding,
 * each GPT block, the head, or each MLP/CNN layer; "model": one unit), each
 * a contiguous range of the flat buffer. Each unit is padded to a multiple
 * of the shard count and cut into equal shards (sharding/plan.h); rank r
 * owns shard r of every unit: its f32 master parameters, gradients and
 * optimizer state (AdamW m and v) live in this strategy's shard buffers,
 * and the optimizer steps on them only (slices).
 *
 * parallel.fsdp_mode, one implementation with three settings:
 *   full      parameters too are sharded: a unit is all-gathered into its
 *             range of the model's flat buffer just before its forward (the
 *             next unit's all-gather runs meanwhile: prefetch), its pages
 *             are given back after the forward (ts_alloc_decommit), and it
 *             is gathered again when its backward starts (the previous
 *             unit prefetched). The first and last units (the GPT
 *             embedding, whose weight the head reuses, and the head) stay
 *             gathered from their forward to the end of their backward, as
 *             PyTorch's root unit.
 *   grad_op   parameters stay whole: a unit is gathered once per step
 *             (before its first forward) and never given back.
 *   no_shard  one shard of everything per rank; gradients are all-reduced
 *             (DDP); "gathering" is a copy.
 * The model's gradients are detached (ts_model_detach_grads): backward
 * gives each parameter its own, and as soon as all of a unit's are final
 * (grads_ready, on the step's last micro-batch) they are packed and
 * reduce-scattered (averaged) into the rank's gradient shard while backward
 * goes on, and released. With bf16 compute the gathers carry bf16 copies
 * (half the bytes) into the model's bf16 buffer; parallel.wire_dtype bf16
 * sends the gradients as bf16 (reduced in f32). The global gradient norm
 * for clipping is summed over the shards with the step's loss.
 *
 * Generations (dp_group.h): a new one (a join, a death) abandons the step
 * in flight. The ranks then agree on their state: when every shard of the
 * previous generation is alive and all its holders are at one step, the
 * shards move to the new layout (broadcast per old shard; each rank keeps
 * its old shards until the move is agreed on, and takes them back when the
 * world changes again meanwhile); when one was lost, every rank reloads the
 * newest checkpoint, resharded (a whole one too: the job resumed from a
 * local run's, say), or the model the job starts from when there is none,
 * and the job redoes the steps since.
 * With parallel.fsdp_neighbour_copy, rank r also keeps a copy of shard
 * r + 1 (shard_copy): filled after each new layout, then kept in step by
 * receiving that rank's reduced gradients in each step (before the step's
 * sums, so that a failed exchange abandons the step on every rank) and
 * letting the optimizer step the copy with the rank's own shards (the
 * copy's slices follow them; clipping scales both by the global norm of
 * the own shards). A shard whose holder died is then moved from its copy,
 * at the step the survivors reached. A death inside a step's sums can let
 * some survivors take the step and not the others: the ones behind take
 * it in the regroup from the gradients they hold (roll_forward).
 * Checkpoints are sharded (fsdp_checkpoint.h): every rank writes its file
 * into the step's temp folder, the leader commits it once all have.
 *
 * A model on a GPU is refused by name: the shards, the gathers and the
 * gradients' packing work in host memory.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/alloc.h"
#include "kernels/autograd.h"
#include "kernels/io/atomic.h"
#include "kernels/io/checkpoint.h"
#include "kernels/nn/module.h"
#include "kernels/optim/clip.h"
#include "proto/job_model.h"
#include "sharding/plan.h"
#include "worker/dp_group.h"
#include "worker/fsdp_checkpoint.h"
#include "worker/strategy.h"
#include "worker/trainer.h"

typedef struct fsdp_strategy fsdp_strategy;

/* This rank's shards of every unit, one after the other (from the
 * allocator, so its statistics count them). */
typedef struct {
    int64_t total;           /* elements (each unit's shard padded) */
    int slots;               /* optimizer state floats per element */
    float *params, *grads;   /* [total] */
    float *state;            /* [slots * total], or NULL */
    uint16_t *send16;        /* bf16 copy of params (bf16 compute), or NULL */
} shard_buffers;

/* Zeroed memory from the allocator (bytes > 0), or NULL. */
static void *zeroed(size_t bytes) {
    void *p = ts_alloc(bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

/* Allocates b for total elements (zeroed). */
static ts_status buffers_alloc(shard_buffers *b, int64_t total, int slots, bool bf16) {
    size_t n = (size_t)total + 1;
    *b = (shard_buffers){.total = total, .slots = slots};
    b->params = zeroed(n * sizeof(float));
    b->grads = zeroed(n * sizeof(float));
    b->state = slots ? zeroed(n * (size_t)slots * sizeof(float)) : NULL;
    b->send16 = bf16 ? zeroed(n * sizeof(uint16_t)) : NULL;
    if (b->params && b->grads && (!slots || b->state) && (!bf16 || b->send16)) return TS_OK;
    return ts_error(TS_ERR_MEMORY, "fsdp: out of memory for shards of %lld elements", (long long)total);
}

static void buffers_free(shard_buffers *b) {
    size_t n = (size_t)b->total + 1;
    ts_free(b->params, n * sizeof(float));
    ts_free(b->grads, n * sizeof(float));
    ts_free(b->state, n * (size_t)b->slots * sizeof(float));
    ts_free(b->send16, n * sizeof(uint16_t));
    *b = (shard_buffers){0};
}

/* The copy of its ring neighbour's shards that a rank keeps with
 * parallel.fsdp_neighbour_copy: shard `of` of the layout (-1: none), laid
 * out as the rank's own. valid: it holds that shard at this rank's step
 * (the optimizer steps it with the rank's own). */
typedef struct {
    shard_buffers b;
    int of;
    bool valid;
} shard_copy;

typedef struct {
    fsdp_strategy *f;
    int index;
    int64_t lo, len;         /* range of the flat buffer */
    int p0, p1;              /* its parameters [p0, p1) */
    int c0, c1;              /* the root's children that make it [c0, c1) */
    int64_t shard;           /* elements per shard (padded) */
    ts_range own;            /* this rank's real elements, relative to lo */
    int64_t at;              /* where its shard starts in the shard buffers */
    bool kept;               /* stays gathered from forward to backward's end */
    bool gathered;           /* the flat range holds this step's values */
    bool resident;           /* its pages of the compute buffer are committed (full mode) */
    ts_comm_req *gather;     /* its all-gather in flight */
    void *staging;           /* the gathered unit, or the gradients sent */
    size_t staging_bytes;
    ts_comm_req *reduce;     /* its gradients' reduction in flight */
    int64_t reduce_order;    /* when it started (reductions so far) */
    int ready;               /* parameters whose gradients are final */
} unit;

struct fsdp_strategy {
    ts_strategy base;
    ts_dp_group g;
    ts_job_fsdp_mode mode;
    ts_job_fsdp_unit policy;
    bool bf16_wire;
    unit *units;
    int n_units;
    int shards, me;          /* shard count and this rank's shard */
    shard_buffers b;
    shard_buffers prev;      /* the previous generation's, while a move is agreed on */
    int prev_shards, prev_shard;
    bool copying;            /* parallel.fsdp_neighbour_copy */
    shard_copy copy, prev_copy;
    ts_optim_slice *slices;  /* this rank's shards', then the copy's */
    int n_slices, n_copy_slices;
    int *unit_of;            /* per parameter: its unit */
    double sq_norm;          /* the global squared gradient norm of the step summed last */
    double loss;             /* and its loss */
    bool holds_next;         /* the step's sums failed: the shards' gradients are step + 1's, reduced */
    int64_t reductions;      /* reductions started so far */
    bool sharded;            /* the shard buffers hold the state (else the model does) */
    bool invalid;            /* a failed reload left them holding nothing of use */
    int64_t shard_generation; /* the generation the shards were laid out in */
};

/* ---- units ---- */

/* The parameters [*p0, *p1) of module mod and its descendants. */
static void module_params(const ts_module *mod, int *p0, int *p1) {
    if (mod->n_params) {
        if (mod->param0 < *p0) *p0 = mod->param0;
        if (mod->param0 + mod->n_params > *p1) *p1 = mod->param0 + mod->n_params;
    }
    for (int i = 0; i < mod->n_children; i++) module_params(mod->children[i], p0, p1);
}

/* Cuts the model into units: the root's children that hold parameters,
 * each with the children without parameters after it (policy "block"), or
 * the whole model (policy "model"); the units cover [0, numel). */
static ts_status make_units(fsdp_strategy *f) {
    ts_model *m = f->base.trainer->model;
    ts_module *root = m->root;
    int n = root->n_children;
    f->units = calloc((size_t)n + 1, sizeof *f->units);
    f->unit_of = calloc((size_t)m->n_params + 1, sizeof *f->unit_of);
    if (!f->units || !f->unit_of) return ts_error(TS_ERR_MEMORY, "fsdp: out of memory for %d units", n);
    for (int c = 0; c < n; c++) {
        int p0 = m->n_params, p1 = -1;
        module_params(root->children[c], &p0, &p1);
        bool alone = f->policy == TS_FSDP_UNIT_BLOCK || f->n_units == 0;
        if (p1 > p0 && alone) {
            f->units[f->n_units++] = (unit){.f = f, .p0 = p0, .p1 = p1, .c0 = c, .c1 = c + 1};
        } else if (f->n_units) {
            unit *u = &f->units[f->n_units - 1];
            u->c1 = c + 1;
            if (p1 > p0) u->p1 = p1;
        }
    }
    if (!f->n_units) return ts_error(TS_ERR_VALUE, "fsdp: the model has no parameters to shard");
    for (int k = 0; k < f->n_units; k++) {
        unit *u = &f->units[k];
        u->index = k;
        u->lo = k == 0 ? 0 : m->params[u->p0].offset;
        int64_t hi = k + 1 < f->n_units ? m->params[f->units[k + 1].p0].offset : m->numel;
        u->len = hi - u->lo;
        u->kept = f->mode == TS_FSDP_FULL ? (k == 0 || k == f->n_units - 1) : true;
        for (int p = u->p0; p < u->p1; p++) f->unit_of[p] = k;
    }
    f->units[0].c0 = 0;
    return TS_OK;
}

/* Places the units' shards for a world of w (this rank r): their sizes
 * and where each starts in the shard buffers; returns the elements in all. */
static int64_t place_units(fsdp_strategy *f, int w, int r) {
    f->shards = f->mode == TS_FSDP_NO_SHARD ? 1 : w;
    f->me = f->mode == TS_FSDP_NO_SHARD ? 0 : r;
    int64_t total = 0;
    for (int k = 0; k < f->n_units; k++) {
        unit *u = &f->units[k];
        u->shard = ts_plan_shard_len(u->len, f->shards);
        u->own = ts_plan_shard_range(u->len, f->shards, f->me);
        u->at = total;
        total += u->shard;
    }
    return total;
}

/* The optimizer's slice of the elements [offset, offset + len) of the
 * flat buffer, kept at position at of the shard buffers b. */
static ts_optim_slice slice_at(const shard_buffers *b, int64_t at, int64_t offset, int64_t len) {
    return (ts_optim_slice){.params = b->params + at, .grads = b->grads + at,
                            .state = b->state ? b->state + at : NULL, .stride = b->total, .offset = offset,
                            .len = len};
}

/* Points the optimizer's slices at the units' shards in f->b, then at the
 * copy's (its shard's ranges of the same units). */
static void point_slices(fsdp_strategy *f) {
    f->n_slices = f->n_copy_slices = 0;
    for (int k = 0; f->slices && f->b.params && k < f->n_units; k++) {
        unit *u = &f->units[k];
        if (u->own.len) f->slices[f->n_slices++] = slice_at(&f->b, u->at, u->lo + u->own.offset, u->own.len);
    }
    for (int k = 0; f->slices && f->copy.b.params && k < f->n_units; k++) {
        unit *u = &f->units[k];
        ts_range c = ts_plan_shard_range(u->len, f->shards, f->copy.of);
        if (c.len) f->slices[f->n_slices + f->n_copy_slices++] = slice_at(&f->copy.b, u->at, u->lo + c.offset, c.len);
    }
}

/* Lays the units' shards out for a world of w (this rank r): sizes and
 * places in the shard buffers, which are (re)allocated zeroed, and with
 * copying the (not yet valid) copy of shard r + 1's. */
static ts_status lay_out(fsdp_strategy *f, int w, int r) {
    ts_model *m = f->base.trainer->model;
    int64_t total = place_units(f, w, r);
    int slots = ts_optim_state_slots(&f->base.trainer->optim);
    f->n_slices = f->n_copy_slices = 0;
    buffers_free(&f->b);
    buffers_free(&f->copy.b);
    f->copy = (shard_copy){.of = f->copying && f->shards > 1 ? (f->me + 1) % f->shards : -1};
    free(f->slices);
    f->slices = calloc(2 * (size_t)f->n_units + 1, sizeof *f->slices);
    if (!f->slices) return ts_error(TS_ERR_MEMORY, "fsdp: out of memory for %d slices", f->n_units);
    ts_status st = buffers_alloc(&f->b, total, slots, m->compute_dtype == TS_BF16);
    if (!st && f->copy.of >= 0) st = buffers_alloc(&f->copy.b, total, slots, false);
    if (!st) point_slices(f);
    return st;
}

/* Sends n floats of send to the rank that keeps this rank's copy (r - 1)
 * and receives n into recv from the rank whose copy this one keeps (r + 1);
 * with two ranks both are the other. The communicator runs its operations
 * one after the other, so even ranks send first and odd ones receive
 * first: no two neighbours both send, each waiting for the other to read.
 * timeout_ms 0: the step's. */
static ts_status swap_with_neighbours(fsdp_strategy *f, const float *send, float *recv, int64_t n, int timeout_ms) {
    int w = f->shards;
    int64_t step = f->base.trainer->step + 1;
    ts_comm_op out = {.kind = TS_COMM_SEND, .send = send, .count = n, .dtype = TS_F32, .peer = (f->me + w - 1) % w,
                      .step = step, .timeout_ms = timeout_ms};
    ts_comm_op in = {.kind = TS_COMM_RECV, .recv = recv, .count = n, .dtype = TS_F32, .peer = (f->me + 1) % w,
                     .step = step, .timeout_ms = timeout_ms};
    bool send_first = f->me % 2 == 0;
    ts_comm_req *a = NULL, *b = NULL;
    ts_status st = ts_comm_start(f->g.comm, send_first ? &out : &in, &a);
    if (!st) st = ts_comm_start(f->g.comm, send_first ? &in : &out, &b);
    ts_status first = a ? ts_dp_group_finish(&f->g, a) : TS_OK, second = b ? ts_dp_group_finish(&f->g, b) : TS_OK;
    return st ? st : first ? first : second;
}

/* Fills the copy from the neighbour it copies (parameters and optimizer
 * state), sending this rank's shards to the one that copies them: after
 * each new layout. The optimizer then keeps it in step. */
static ts_status fill_copy(fsdp_strategy *f) {
    ts_member_info info;
    ts_member_info_get(f->base.member, &info);
    int slots = ts_optim_state_slots(&f->base.trainer->optim);
    int64_t n = f->b.total;
    ts_status st = swap_with_neighbours(f, f->b.params, f->copy.b.params, n, (int)info.barrier_timeout_ms);
    for (int j = 0; !st && j < slots; j++)
        st = swap_with_neighbours(f, f->b.state + j * n, f->copy.b.state + j * n, n, (int)info.barrier_timeout_ms);
    f->copy.valid = st == TS_OK;
    return st;
}

/* The buffer the forward computes with: the bf16 copy or the f32 master. */
static char *compute_base(const fsdp_strategy *f, size_t *es) {
    ts_model *m = f->base.trainer->model;
    bool bf16 = m->compute_dtype == TS_BF16;
    *es = bf16 ? 2 : 4;
    return ts_tensor_data(bf16 ? m->flat_params16 : m->flat_params);
}

/* ---- gathering and giving back ---- */

/* Counts unit u's pages of the compute buffer as in use again before they
 * are written (full mode gave them back). */
static void commit_pages(unit *u) {
    if (u->f->mode != TS_FSDP_FULL || u->resident) return;
    size_t es;
    char *base = compute_base(u->f, &es);
    ts_alloc_recommit(base + u->lo * es, (size_t)u->len * es);
    u->resident = true;
}

/* Gives unit u's pages of the compute buffer back (full mode). */
static void release(unit *u) {
    u->gathered = false;
    if (u->f->mode != TS_FSDP_FULL || !u->resident) return;
    size_t es;
    char *base = compute_base(u->f, &es);
    ts_alloc_decommit(base + u->lo * es, (size_t)u->len * es);
    u->resident = false;
}

/* Starts the all-gather of unit u (f32, or bf16 with bf16 compute), unless
 * it is there or on its way: straight into its range of the compute
 * buffer when its shards have no padding (which would spill into the next
 * unit's range), else into a staging buffer. */
static ts_status start_gather(unit *u) {
    fsdp_strategy *f = u->f;
    if (u->gathered || u->gather) return TS_OK;
    size_t es;
    char *base = compute_base(f, &es);
    if (f->shards == 1) return TS_OK; /* a copy, made when it is needed */
    void *recv = base + u->lo * es;
    if (u->shard * f->shards == u->len) {
        commit_pages(u);
    } else {
        u->staging_bytes = (size_t)(u->shard * f->shards) * es;
        recv = u->staging = ts_alloc(u->staging_bytes);
        if (!u->staging) return ts_last_status();
    }
    const void *send = f->b.params + u->at;
    if (es == 2) {
        for (int64_t i = 0; i < u->shard; i++) f->b.send16[u->at + i] = ts_bf16_from_f32(f->b.params[u->at + i]);
        send = f->b.send16 + u->at;
    }
    ts_comm_op op = {.kind = TS_COMM_ALLGATHER, .send = send, .recv = recv, .count = u->shard,
                     .dtype = es == 2 ? TS_BF16 : TS_F32, .step = f->base.trainer->step + 1};
    return ts_comm_start(f->g.comm, &op, &u->gather);
}

/* Frees unit u's staging buffer. */
static void drop_staging(unit *u) {
    ts_free(u->staging, u->staging_bytes);
    u->staging = NULL;
    u->staging_bytes = 0;
}

/* Makes unit u's range of the compute buffer hold its whole parameters:
 * waits for its all-gather (started now when it was not) and copies it in
 * from staging, or from the one shard. */
static ts_status gather(unit *u) {
    fsdp_strategy *f = u->f;
    if (u->gathered) return TS_OK;
    ts_status st = start_gather(u);
    if (!st && u->gather) {
        st = ts_dp_group_finish(&f->g, u->gather);
        u->gather = NULL;
    }
    size_t es;
    char *base = compute_base(f, &es);
    if (!st) commit_pages(u);
    if (!st && f->shards == 1 && es == 4) memcpy(base + u->lo * 4, f->b.params + u->at, (size_t)u->len * 4);
    else if (!st && f->shards == 1)
        for (int64_t i = 0; i < u->len; i++) ((uint16_t *)base)[u->lo + i] = ts_bf16_from_f32(f->b.params[u->at + i]);
    else if (!st && u->staging) memcpy(base + u->lo * es, u->staging, (size_t)u->len * es);
    drop_staging(u);
    if (!st) u->gathered = true;
    return st;
}

/* ---- the units' hooks ---- */

/* Before a unit's forward: its parameters, and the next unit's on the way. */
static ts_status before_forward(ts_module *mod, ts_tensor *x, void *ctx) {
    (void)mod, (void)x;
    unit *u = ctx;
    ts_status st = gather(u);
    if (!st && u->index + 1 < u->f->n_units) st = start_gather(&u->f->units[u->index + 1]);
    return st;
}

/* After a unit's forward: gives its parameters back unless they are kept
 * for its backward (the first and last units in full mode). */
static ts_status after_forward(ts_module *mod, ts_tensor *y, void *ctx) {
    (void)mod, (void)y;
    unit *u = ctx;
    if (!u->kept) release(u);
    return TS_OK;
}

/* After the model's forward without gradients (no backward follows):
 * nothing stays gathered. */
static ts_status after_model(ts_module *mod, ts_tensor *y, void *ctx) {
    (void)mod, (void)y;
    fsdp_strategy *f = ctx;
    if (!ts_grad_enabled() && f->mode == TS_FSDP_FULL)
        for (int k = 0; k < f->n_units; k++) release(&f->units[k]);
    return TS_OK;
}

/* When a unit's backward starts: its parameters, the previous unit's on
 * the way. */
static ts_status before_backward(ts_module *mod, ts_tensor *g, void *ctx) {
    (void)mod, (void)g;
    unit *u = ctx;
    ts_status st = gather(u);
    if (!st && u->index > 0) st = start_gather(&u->f->units[u->index - 1]);
    return st;
}

/* Hooks every unit's first and last module and the root. */
static ts_status hook_units(fsdp_strategy *f) {
    ts_module *root = f->base.trainer->model->root;
    ts_status st = ts_module_add_hook(root, TS_HOOK_POST_FORWARD, after_model, f);
    for (int k = 0; !st && k < f->n_units; k++) {
        unit *u = &f->units[k];
        ts_module *first = root->children[u->c0], *last = root->children[u->c1 - 1];
        st = ts_module_add_hook(first, TS_HOOK_PRE_FORWARD, before_forward, u);
        if (!st) st = ts_module_add_hook(last, TS_HOOK_POST_FORWARD, after_forward, u);
        if (!st) st = ts_module_add_hook(last, TS_HOOK_PRE_BACKWARD, before_backward, u);
    }
    return st;
}

/* ---- gradients ---- */

/* Packs unit u's parameters' gradients (released as they are taken) into
 * g[0 .. n): zeros where a parameter had none this step, between
 * parameters and in the padding. */
static void pack_grads(unit *u, float *g, int64_t n) {
    ts_model *m = u->f->base.trainer->model;
    int64_t filled = 0;
    for (int p = u->p0; p < u->p1; p++) {
        ts_tensor *leaf = m->params[p].value;
        int64_t at = m->params[p].offset - u->lo, numel = m->params[p].numel;
        memset(g + filled, 0, (size_t)(at - filled) * sizeof(float));
        if (leaf->grad) {
            memcpy(g + at, ts_f32(leaf->grad), (size_t)numel * sizeof(float));
            ts_tensor_release(leaf->grad);
            leaf->grad = NULL;
        } else {
            memset(g + at, 0, (size_t)numel * sizeof(float));
        }
        filled = at + numel;
    }
    memset(g + filled, 0, (size_t)(n - filled) * sizeof(float));
}

/* Packs unit u's gradients and starts their reduction into the gradient
 * shard: a reduce-scatter in place in a staging buffer (reduce_done copies
 * the rank's slot out), or with one shard an all-reduce in the shard
 * itself; bf16 on the wire (staged) when asked. */
static ts_status start_reduce(unit *u) {
    fsdp_strategy *f = u->f;
    int64_t n = u->shard * f->shards;
    float *g = f->b.grads + u->at;
    if (f->shards > 1 || f->bf16_wire) {
        u->staging_bytes = (size_t)n * (sizeof(float) + (f->bf16_wire ? 2 : 0));
        g = u->staging = ts_alloc(u->staging_bytes);
        if (!u->staging) return ts_last_status();
    }
    pack_grads(u, g, n);
    int64_t mine = f->shards == 1 ? 0 : (int64_t)f->me * u->shard;
    ts_comm_op op = {.kind = f->shards == 1 ? TS_COMM_ALLREDUCE : TS_COMM_REDUCE_SCATTER, .send = g,
                     .recv = g + mine, .count = u->shard, .dtype = TS_F32,
                     .op = TS_REDUCE_AVG, .step = f->base.trainer->step + 1};
    if (f->bf16_wire) {
        uint16_t *w = (uint16_t *)(g + n);
        for (int64_t i = 0; i < n; i++) w[i] = ts_bf16_from_f32(g[i]);
        op.send = w;
        op.recv = w + mine;
        op.dtype = TS_BF16;
    }
    ts_status st = ts_comm_start(f->g.comm, &op, &u->reduce);
    if (st) drop_staging(u);
    return st;
}

/* Puts unit u's reduced gradients into its gradient shard once its
 * reduction ended with status st, and frees its staging. */
static ts_status reduce_done(unit *u, ts_status st) {
    fsdp_strategy *f = u->f;
    u->reduce = NULL;
    float *g = u->staging, *out = f->b.grads + u->at;
    int64_t n = u->shard * f->shards, mine = (int64_t)f->me * u->shard;
    if (!st && f->bf16_wire) {
        const uint16_t *w = (const uint16_t *)(g + n) + (f->shards == 1 ? 0 : mine);
        for (int64_t i = 0; i < u->shard; i++) out[i] = ts_f32_from_bf16(w[i]);
    } else if (!st && f->shards > 1) {
        memcpy(out, g + mine, (size_t)u->shard * sizeof(float));
    }
    drop_staging(u);
    return st;
}

/* Waits for unit u's reduction, if one is in flight (reduce_done). */
static ts_status finish_reduce(unit *u) {
    return u->reduce ? reduce_done(u, ts_dp_group_finish(&u->f->g, u->reduce)) : TS_OK;
}

/* Each reduction in flight holds a unit of gradients: the ones that ended
 * are finished, and while more than REDUCES_IN_FLIGHT remain the oldest is
 * waited for, so backward never holds every unit's gradients at once. */
#define REDUCES_IN_FLIGHT 2
static ts_status settle_reduces(fsdp_strategy *f) {
    ts_status first = TS_OK;
    for (;;) {
        int in_flight = 0;
        unit *oldest = NULL;
        for (int k = 0; k < f->n_units; k++) {
            unit *u = &f->units[k];
            bool done = false;
            ts_status st = u->reduce ? ts_comm_wait_ms(u->reduce, 0, &done) : TS_OK;
            if (done) st = reduce_done(u, st);
            if (st && !first) first = st;
            if (!u->reduce) continue;
            in_flight++;
            if (!oldest || u->reduce_order < oldest->reduce_order) oldest = u;
        }
        if (first || in_flight <= REDUCES_IN_FLIGHT) return first;
        first = finish_reduce(oldest);
    }
}

static ts_status fsdp_grads_ready(ts_strategy *s, int64_t offset, int64_t len) {
    (void)len;
    fsdp_strategy *f = (fsdp_strategy *)s;
    ts_model *m = s->trainer->model;
    int lo = 0, hi = m->n_params - 1;
    while (lo < hi) { /* the parameter at offset */
        int mid = (lo + hi + 1) / 2;
        if (m->params[mid].offset <= offset) lo = mid;
        else hi = mid - 1;
    }
    unit *u = &f->units[f->unit_of[lo]];
    if (++u->ready < u->p1 - u->p0) return TS_OK;
    u->reduce_order = ++f->reductions;
    ts_status st = start_reduce(u);
    if (!st) st = settle_reduces(f);
    /* its backward is done: full mode gives the parameters back */
    if (f->mode == TS_FSDP_FULL) release(u);
    return st;
}

/* After an optimizer step the shards changed: every gathered unit is old.
 * With bf16 compute the optimizer's sync of the bf16 copy wrote the whole
 * compute buffer, whose units are given back: their pages go again. */
static void units_stale(fsdp_strategy *f) {
    for (int k = 0; k < f->n_units; k++) release(&f->units[k]);
    size_t es;
    char *base = compute_base(f, &es);
    for (int k = 0; f->mode == TS_FSDP_FULL && es == 2 && k < f->n_units; k++) {
        ts_alloc_recommit(base + f->units[k].lo * es, (size_t)f->units[k].len * es);
        ts_alloc_decommit(base + f->units[k].lo * es, (size_t)f->units[k].len * es);
    }
}

/* ---- generations and state ---- */

/* Waits for the units' collectives (the communicator was aborted), frees
 * staging, gives the gathered units and the parameters' gradients back
 * (hooks.drop). */
static void drop_units(ts_strategy *s) {
    fsdp_strategy *f = (fsdp_strategy *)s;
    for (int k = 0; k < f->n_units; k++) {
        unit *u = &f->units[k];
        if (u->gather) ts_comm_wait(u->gather);
        if (u->reduce) ts_comm_wait(u->reduce);
        u->gather = u->reduce = NULL;
        drop_staging(u);
        release(u);
    }
    if (s->trainer->model) ts_model_zero_grad(s->trainer->model);
}

/* What each rank brings to a regroup (8-byte fields: gathered as i64). */
typedef struct {
    int64_t generation;     /* of its shards (0: it holds the whole model) */
    int64_t shard, shards;  /* its shard and the shard count then */
    int64_t copy_of;        /* the shard its valid copy holds, or -1 */
    int64_t step, total_steps, epoch, offset;
    int64_t holds_next;     /* 1: its sums of step + 1 failed, its reduced gradients are kept */
    double loss, sq_norm;   /* the sums of its last step taken */
} rank_state;

/* The most shards a regroup moves. */
#define MAX_SHARDS 1024

/* Who brings each shard q of the newest generation's old_shards to a move:
 * a rank of that generation that holds it, else one that keeps a valid
 * copy of it (from_copy[q]). Returns whether every shard has one. */
static bool find_holders(const rank_state *all, int world, int64_t newest, int old_shards, int *holder,
                         bool *from_copy) {
    if (newest <= 0 || old_shards > MAX_SHARDS) return false;
    for (int q = 0; q < old_shards; q++) holder[q] = -1;
    for (int r = 0; r < world; r++)
        if (all[r].generation == newest && all[r].shard >= 0 && all[r].shard < old_shards) {
            holder[all[r].shard] = r;
            from_copy[all[r].shard] = false;
        }
    for (int r = 0; r < world; r++) {
        int64_t q = all[r].copy_of;
        if (all[r].generation == newest && q >= 0 && q < old_shards && holder[q] < 0) {
            holder[q] = r;
            from_copy[q] = true;
        }
    }
    for (int q = 0; q < old_shards; q++)
        if (holder[q] < 0) return false;
    return true;
}

/* A death inside a step's sums (the last collective of try_step) can let
 * some ranks finish the step while the sums fail on the others: ranks of
 * the newest generation then stand a step apart. The ones behind still
 * hold that step's reduced gradients (their shards' and their copy's), and
 * a rank ahead brought the step's loss and global norm: they take the step
 * now, as it would have ended (rank_state holds_next), and every rank
 * counts them as ahead (their step and data position). */
static ts_status roll_forward(fsdp_strategy *f, rank_state *all, int world, int64_t newest) {
    ts_trainer *t = f->base.trainer;
    int ahead = -1;
    for (int r = 0; r < world; r++)
        if (all[r].generation == newest && (ahead < 0 || all[r].step > all[ahead].step)) ahead = r;
    for (int r = 0; ahead >= 0 && r < world; r++) {
        rank_state *a = &all[r];
        if (a->generation != newest || !a->holds_next || a->step + 1 != all[ahead].step) continue;
        a->step = all[ahead].step;
        a->epoch = all[ahead].epoch;
        a->offset = all[ahead].offset;
        if (r != f->base.group.rank) continue;
        ts_step_stats s = {.loss = all[ahead].loss};
        f->sq_norm = all[ahead].sq_norm;
        f->holds_next = false;
        ts_status st = ts_trainer_apply(t, &s.lr, &s.grad_norm);
        if (st) return st;
        units_stale(f);
        printf("fsdp: step %lld taken from the reduced gradients this rank held (its sums failed; a peer's "
               "completed)\n", (long long)t->step);
        s.step = t->step;
        s.mem_bytes = ts_alloc_get_stats().allocated;
        if ((st = ts_trainer_log_step(t, &s))) return st;
    }
    return TS_OK;
}

/* Cuts this rank's shards out of the model's whole buffers (parameters and
 * optimizer state). */
static void cut_shards(fsdp_strategy *f) {
    ts_model *m = f->base.trainer->model;
    int slots = ts_optim_state_slots(&f->base.trainer->optim);
    for (int k = 0; k < f->n_units; k++) {
        unit *u = &f->units[k];
        int64_t from = u->lo + u->own.offset;
        memcpy(f->b.params + u->at, ts_f32(m->flat_params) + from, (size_t)u->own.len * sizeof(float));
        for (int j = 0; m->state && j < slots; j++)
            memcpy(f->b.state + j * f->b.total + u->at, m->state + j * m->numel + from, (size_t)u->own.len * sizeof(float));
    }
}

/* Moves the shards of the previous generation into the new layout: per
 * unit and old shard q, its holder (find_holders) broadcasts parameters
 * and state from its shards or its copy, and each rank keeps its part.
 * The old shards and copy stay in f->prev and f->prev_copy until the new
 * generation is agreed on (settle_previous). */
static ts_status move_shards(fsdp_strategy *f, const int *holder, const bool *from_copy, int world, int old_shards) {
    int slots = ts_optim_state_slots(&f->base.trainer->optim);
    /* the old layout, before lay_out replaces it: each holder's own buffers */
    f->prev = f->b;
    f->prev_shards = f->shards;
    f->prev_shard = f->me;
    f->prev_copy = f->copy;
    f->b = f->copy.b = (shard_buffers){0};
    int64_t *old_at = calloc((size_t)f->n_units + 1, sizeof *old_at);
    if (!old_at) return ts_error(TS_ERR_MEMORY, "fsdp: out of memory moving shards");
    int64_t at = 0;
    for (int k = 0; k < f->n_units; k++) {
        old_at[k] = at;
        at += ts_plan_shard_len(f->units[k].len, old_shards);
    }
    ts_status st = lay_out(f, world, f->base.group.rank);
    for (int k = 0; !st && k < f->n_units; k++) {
        unit *u = &f->units[k];
        int64_t olen = ts_plan_shard_len(u->len, old_shards);
        float *buf = malloc((size_t)(olen * (1 + slots) + 1) * sizeof(float));
        if (!buf) st = ts_error(TS_ERR_MEMORY, "fsdp: out of memory moving unit %d", k);
        for (int q = 0; !st && q < old_shards; q++) {
            ts_range real = ts_plan_shard_range(u->len, old_shards, q);
            if (!real.len) continue;
            if (holder[q] == f->base.group.rank) {
                const shard_buffers *old = from_copy[q] ? &f->prev_copy.b : &f->prev;
                memcpy(buf, old->params + old_at[k], (size_t)real.len * sizeof(float));
                for (int j = 0; j < slots; j++)
                    memcpy(buf + (1 + j) * olen, old->state + j * old->total + old_at[k], (size_t)real.len * sizeof(float));
            }
            ts_member_info info;
            ts_member_info_get(f->base.member, &info);
            ts_comm_op op = {.kind = TS_COMM_BROADCAST, .send = buf, .recv = buf, .count = olen * (1 + slots),
                             .dtype = TS_F32, .peer = holder[q], .step = f->base.trainer->step,
                             .timeout_ms = (int)info.barrier_timeout_ms};
            st = ts_dp_group_run(&f->g, &op);
            /* the part of old shard q in this rank's new shard */
            int64_t a = real.offset, b = real.offset + real.len;
            int64_t x = a > u->own.offset ? a : u->own.offset, y = b < u->own.offset + u->own.len ? b : u->own.offset + u->own.len;
            if (!st && y > x) {
                memcpy(f->b.params + u->at + (x - u->own.offset), buf + (x - a), (size_t)(y - x) * sizeof(float));
                for (int j = 0; j < slots; j++)
                    memcpy(f->b.state + j * f->b.total + u->at + (x - u->own.offset), buf + (1 + j) * olen + (x - a),
                           (size_t)(y - x) * sizeof(float));
            }
        }
        free(buf);
    }
    free(old_at);
    for (int q = 0; !st && q < old_shards; q++)
        if (from_copy[q] && holder[q] == f->base.group.rank)
            printf("fsdp: shard %d of %d, whose rank was lost, rebuilt from this rank's copy at step %lld (no step "
                   "lost)\n", q, old_shards, (long long)f->base.trainer->step);
    return st;
}

/* After a move: once the generation was agreed on (ok) the old shards and
 * copy go; when it failed (the world changed again) every rank takes them
 * back, so that the next generation can move them. */
static void settle_previous(fsdp_strategy *f, bool ok) {
    if (!f->prev.params) return;
    if (!ok) {
        buffers_free(&f->b);
        buffers_free(&f->copy.b);
        f->b = f->prev;
        f->copy = f->prev_copy;
        f->prev = f->prev_copy.b = (shard_buffers){0};
        place_units(f, f->prev_shards, f->prev_shard);
        point_slices(f);
    }
    buffers_free(&f->prev);
    buffers_free(&f->prev_copy.b);
    f->prev_copy = (shard_copy){.of = -1};
}

/* This rank's shards of whole model m: its parameters, and its optimizer
 * state from m's (zero when m has none). */
static void shards_from(fsdp_strategy *f, const ts_model *m) {
    if (f->b.state && !m->state) memset(f->b.state, 0, (size_t)f->b.total * (size_t)f->b.slots * sizeof(float));
    for (int k = 0; k < f->n_units; k++) {
        unit *u = &f->units[k];
        int64_t lo = u->lo + u->own.offset;
        memcpy(f->b.params + u->at, ts_f32(m->flat_params) + lo, (size_t)u->own.len * sizeof(float));
        for (int j = 0; f->b.state && m->state && j < f->b.slots; j++)
            memcpy(f->b.state + (int64_t)j * f->b.total + u->at, m->state + (int64_t)j * m->numel + lo,
                   (size_t)u->own.len * sizeof(float));
    }
}

/* A checkpoint that is not sharded (a local, ddp or pipeline run's, which
 * this job resumed from) into this rank's shards, through a whole model
 * read from it. */
static ts_status reload_whole(fsdp_strategy *f, const ts_checkpoint *ck) {
    ts_trainer *t = f->base.trainer;
    ts_model *whole = ts_model_build(&t->spec, 0, -1, ts_key_from_seed((uint64_t)t->job.seed), TS_F32);
    ts_status st = whole ? TS_OK : ts_last_status();
    if (!st && f->b.state) st = ts_model_alloc_state(whole, f->b.slots);
    if (!st) st = ts_strategy_read_model(ck, whole);
    if (!st) shards_from(f, whole);
    ts_model_free(whole);
    return st;
}

/* The newest checkpoint of the run, resharded into this rank's shards, or
 * the model the job starts from (model.init_from, else its seed's) when
 * there is none; *from gets its step and position. */
static ts_status reload(fsdp_strategy *f, rank_state *from) {
    ts_trainer *t = f->base.trainer;
    char root[1100], dir[1200];
    int64_t step = -1;
    snprintf(root, sizeof root, "%s/checkpoints", t->run_dir);
    ts_status st = t->run_dir[0] ? ts_checkpoint_latest(root, dir, sizeof dir, &step) : TS_OK;
    if (st) return st;
    if (step < 0) { /* no checkpoint: the job's first model at step 0 */
        ts_model *seed = ts_job_model_build(&t->job, &t->spec, NULL);
        if (!seed) return ts_last_status();
        shards_from(f, seed);
        ts_model_free(seed);
        from->step = 0;
        from->epoch = from->offset = 0;
        printf("fsdp: a shard was lost and no checkpoint was kept: starting again from the job's first model\n");
        return TS_OK;
    }
    ts_checkpoint *ck = ts_checkpoint_open(dir);
    if (!ck) return ts_last_status();
    ts_fsdp_layout l;
    bool sharded;
    st = ts_fsdp_layout_read(ck, &l, &sharded);
    if (!st && !sharded) st = reload_whole(f, ck);
    for (int k = 0; !st && sharded && k < f->n_units; k++) {
        unit *u = &f->units[k];
        st = ts_fsdp_read_range(ck, &l, u->lo + u->own.offset, u->own.len, f->b.params + u->at,
                                f->b.state ? f->b.state + u->at : NULL, f->b.total);
    }
    if (!st) {
        from->step = ck->step;
        from->epoch = ck->loader.epoch;
        from->offset = ck->loader.offset;
        printf("fsdp: a shard was lost: every rank reloads checkpoint %s (step %lld) at world size %d\n", dir,
               (long long)ck->step, f->base.group.world);
    }
    if (sharded) ts_fsdp_layout_free(&l);
    ts_checkpoint_close(ck);
    return st;
}

/* Brings the ranks of the new generation to one state: shards cut from the
 * whole model everybody holds at one step, moved from the previous
 * generation's holders, or reloaded (hooks.agree). */
static ts_status agree(ts_strategy *s) {
    fsdp_strategy *f = (fsdp_strategy *)s;
    ts_trainer *t = s->trainer;
    int world = s->group.world, me = s->group.rank;
    ts_loader_pos pos = ts_dp_group_position(&f->g);
    rank_state mine = {.generation = f->invalid ? -1 : f->sharded ? f->shard_generation : 0, .shard = f->me,
                       .shards = f->shards, .copy_of = f->copy.valid ? f->copy.of : -1,
                       .step = t->step, .total_steps = t->total_steps, .epoch = pos.epoch, .offset = pos.offset,
                       .holds_next = f->holds_next, .loss = f->loss, .sq_norm = f->sq_norm};
    rank_state *all = calloc((size_t)world, sizeof *all);
    if (!all) return ts_error(TS_ERR_MEMORY, "fsdp: out of memory for %d ranks' states", world);
    enum { N = sizeof(rank_state) / sizeof(int64_t) };
    ts_status st = ts_dp_group_meet(&f->g, TS_COMM_ALLGATHER, &mine, all, N, TS_I64);
    int64_t newest = 0;
    for (int r = 0; r < world; r++)
        if (all[r].generation > newest) newest = all[r].generation;
    int holder[MAX_SHARDS];
    bool from_copy[MAX_SHARDS];
    int old_shards = 0;
    for (int r = 0; r < world; r++)
        if (all[r].generation == newest) old_shards = (int)all[r].shards;
    bool complete = find_holders(all, world, newest, old_shards, holder, from_copy);
    /* ranks a step apart, every shard there to move: the ones behind catch up */
    if (!st && complete) st = roll_forward(f, all, world, newest);
    /* who holds what: the whole model at one step (a start), or every shard
     * of the newest generation (its holder's, or a copy) at one step */
    bool whole = true, same = true;
    int first = -1;
    for (int r = 0; r < world; r++) {
        if (all[r].generation != newest) continue;
        if (first < 0) first = r;
        same = same && all[r].step == all[first].step;
        whole = whole && all[r].generation == 0;
    }
    bool any_invalid = false;
    for (int r = 0; r < world; r++) any_invalid = any_invalid || all[r].generation < 0;
    whole = whole && first >= 0 && same && !any_invalid;
    rank_state from = first >= 0 ? all[first] : mine;
    if (!st && newest == 0 && !whole && !any_invalid)
        st = ts_error(TS_ERR_STATE, "fsdp: the ranks start from different steps");
    bool reloaded = false;
    if (!st && whole) {
        st = lay_out(f, world, me);
        if (!st) cut_shards(f);
    } else if (!st && complete && same) {
        st = move_shards(f, holder, from_copy, world, old_shards);
    } else if (!st) {
        st = lay_out(f, world, me);
        if (!st) st = reload(f, &from);
        reloaded = !st;
        f->invalid = st != TS_OK;
    }
    free(all);
    if (!st && f->copy.of >= 0) st = fill_copy(f);
    if (!st) st = ts_dp_group_meet(&f->g, TS_COMM_BARRIER, NULL, NULL, 0, TS_U8);
    settle_previous(f, !st);
    /* a reload stands even when the world changed again before all were
     * done: this rank's shards are its part of the generation's layout at
     * the checkpoint's step, and the next regroup sees them as such; a
     * regroup that fails otherwise keeps the step's gradients for the next
     * (the world may change again before every rank holding them caught up) */
    if (st && !reloaded) return st;
    f->holds_next = false;
    f->sharded = true;
    f->invalid = false;
    f->shard_generation = (int64_t)f->base.group.generation;
    t->step = from.step;
    t->total_steps = from.total_steps ? from.total_steps : t->total_steps;
    f->g.step_start = (ts_loader_pos){from.epoch, from.offset};
    ts_status placed = ts_loader_set_position(t->loader, f->g.step_start);
    if (st) return st;
    st = placed;
    /* the model's whole copies are no longer used: their pages go */
    ts_model *m = t->model;
    if (!st && m->state) st = ts_model_alloc_state(m, 0);
    return st;
}

/* Gives back the model's buffers that sharding leaves unused: the flat
 * gradients (detached), the f32 master with bf16 compute, and in full mode
 * the compute buffer (gathered unit by unit). */
static void give_back_model(fsdp_strategy *f) {
    ts_model *m = f->base.trainer->model;
    ts_alloc_decommit(ts_tensor_data(m->flat_grads), ts_tensor_nbytes(m->flat_grads));
    if (m->flat_grads16) ts_alloc_decommit(ts_tensor_data(m->flat_grads16), ts_tensor_nbytes(m->flat_grads16));
    if (f->mode != TS_FSDP_FULL) return;
    if (m->compute_dtype == TS_BF16) ts_alloc_decommit(ts_tensor_data(m->flat_params), ts_tensor_nbytes(m->flat_params));
    size_t es;
    char *base = compute_base(f, &es);
    for (int k = 0; k < f->n_units; k++) ts_alloc_decommit(base + f->units[k].lo * es, (size_t)f->units[k].len * es);
}

/* ---- the hooks ---- */

static ts_status fsdp_attach(ts_strategy *s) {
    fsdp_strategy *f = (fsdp_strategy *)s;
    ts_model *m = s->trainer->model;
    if (m->device.type != TS_DEVICE_CPU) /* shards, gathers and packing are in host memory */
        return ts_error(TS_ERR_UNSUPPORTED, "fsdp: a model on %s is not supported yet (device \"cpu\" only)",
                        ts_device_name(m->device));
    ts_status st = make_units(f);
    if (!st) st = hook_units(f);
    if (st) return st;
    ts_model_detach_grads(m);
    s->shared_forward = f->mode != TS_FSDP_NO_SHARD;
    if ((st = ts_dp_group_attach(&f->g))) return st;
    give_back_model(f);
    return TS_OK;
}

static ts_status fsdp_begin_step(ts_strategy *s, int64_t step) {
    (void)step;
    return ts_dp_group_begin_step(&((fsdp_strategy *)s)->g);
}

/* One try at the step's gradient shards, the loss, samples and stop votes
 * summed over the ranks and the global squared gradient norm
 * (hooks.try_step). */
static ts_status try_step(ts_strategy *s, double *loss, int64_t *samples) {
    fsdp_strategy *f = (fsdp_strategy *)s;
    for (int k = 0; k < f->n_units; k++) f->units[k].ready = 0;
    ts_status st = ts_trainer_grads(s->trainer, loss, samples);
    ts_status waited = TS_OK;
    for (int k = 0; k < f->n_units; k++) {
        ts_status w = finish_reduce(&f->units[k]);
        if (w && !waited) waited = w;
    }
    if (st) return st;
    if (waited) return waited;
    /* the copy's gradients, for the optimizer to step it with this rank's shards */
    if (f->copy.of >= 0 && (st = swap_with_neighbours(f, f->b.grads, f->copy.b.grads, f->b.total, 0))) return st;
    double sq = 0; /* over this rank's shards only */
    for (int i = 0; i < f->n_slices; i++) sq += ts_clip_sq_norm(f->slices[i].grads, f->slices[i].len);
    double sums[4] = {*loss, (double)*samples, f->shards == 1 ? 0 : sq, ts_strategy_stop_vote(s)};
    ts_comm_op op = {.kind = TS_COMM_ALLREDUCE, .send = sums, .recv = sums, .count = 4, .dtype = TS_F64,
                     .op = TS_REDUCE_SUM, .step = s->trainer->step + 1};
    /* the optimizer steps next: when the sums fail here, a peer may have them and step */
    f->holds_next = true;
    st = ts_dp_group_run(&f->g, &op);
    if (!st) st = ts_dp_group_fault(&f->g);
    if (st) return st;
    f->holds_next = false;
    *loss = f->loss = sums[0] / s->group.world;
    *samples = (int64_t)sums[1];
    f->sq_norm = f->shards == 1 ? sq : sums[2];
    s->stop_agreed = sums[3] > 0;
    return TS_OK;
}

static ts_status fsdp_grads(ts_strategy *s, double *loss, int64_t *samples) {
    return ts_dp_group_grads(&((fsdp_strategy *)s)->g, loss, samples);
}

static void fsdp_slices(ts_strategy *s, const ts_optim_slice **slices, int *n) {
    fsdp_strategy *f = (fsdp_strategy *)s;
    *slices = f->slices;
    *n = f->n_slices + f->n_copy_slices;
}

/* The global norm was summed with the step's loss (a collective here could
 * not be redone when a peer dies). */
static ts_status fsdp_reduce_sq_norm(ts_strategy *s, double *global) {
    *global = ((fsdp_strategy *)s)->sq_norm;
    return TS_OK;
}

static ts_status fsdp_reduce_sums(ts_strategy *s, double *v, int n) {
    return ts_dp_group_sums(&((fsdp_strategy *)s)->g, v, n);
}

static ts_status fsdp_recover(ts_strategy *s, ts_status failed, bool test, bool *again) {
    return ts_dp_group_recover(&((fsdp_strategy *)s)->g, failed, test, again);
}

static ts_status fsdp_end_step(ts_strategy *s, int64_t step) {
    units_stale((fsdp_strategy *)s);
    return ts_dp_group_end_step(&((fsdp_strategy *)s)->g, step);
}

/* The leader's commit once every rank wrote its file: the checkpoint of
 * step t->step with the shard files as its parts and l as its layout. */
static ts_status commit(ts_trainer *t, const char *root, const ts_fsdp_layout *l, char *path, size_t cap) {
    char *extra = ts_fsdp_layout_json(l);
    const char **parts = calloc((size_t)l->world + 1, sizeof *parts);
    char (*names)[64] = calloc((size_t)l->world + 1, sizeof *names);
    ts_status st = extra ? TS_OK : ts_last_status();
    if (!st && (!parts || !names)) st = ts_error(TS_ERR_MEMORY, "fsdp: out of memory saving");
    for (int r = 0; !st && r < l->world; r++) {
        ts_fsdp_shard_name(r, names[r], sizeof names[r]);
        parts[r] = names[r];
    }
    ts_checkpoint_data d = {.step = t->step, .loader = ts_loader_position(t->loader), .config = t->job_text,
                            .extra = extra, .n_parts = l->world, .parts = parts};
    if (!st) st = ts_checkpoint_save(root, &d, t->job.train.keep_checkpoints, path, cap);
    free(parts);
    free(names);
    free(extra);
    return st;
}

/* The leader's temp folder of step `step` (named by its pid, owner),
 * emptied: a save of the step abandoned before (the world changed in it)
 * left its ranks' files there - shards of the old world, a dead rank's
 * half-written one - which the commit would keep beside the new shards.
 * Called before the others learn the folder's name. */
static ts_status clear_temp_dir(const char *root, int64_t step, long owner) {
    char tmp[1200];
    ts_status st = ts_checkpoint_temp_dir(root, step, owner, tmp, sizeof tmp);
    return st ? st : ts_io_remove_tree(tmp);
}

/* Every rank writes its shard file into the step's temp folder (named by
 * the leader's pid); once all did, the leader commits the checkpoint. When
 * a collective of the save fails (the world changes under it), the
 * checkpoint is abandoned, not the run: the next step regroups. */
static ts_status fsdp_save(ts_strategy *s, char *path, size_t cap) {
    fsdp_strategy *f = (fsdp_strategy *)s;
    ts_trainer *t = s->trainer;
    if (cap) path[0] = '\0';
    char root[1100], tmp[1200] = "";
    snprintf(root, sizeof root, "%s/checkpoints", t->run_dir);
    int64_t owner = s->group.leader ? (int64_t)getpid() : 0;
    ts_status cleared = s->group.leader ? clear_temp_dir(root, t->step, (long)owner) : TS_OK;
    ts_status lost = ts_dp_group_meet(&f->g, TS_COMM_BROADCAST, &owner, &owner, 1, TS_I64);
    ts_fsdp_layout l = {.world = f->shards, .slots = ts_optim_state_slots(&t->optim), .numel = t->model->numel,
                        .n_units = f->n_units, .units = calloc((size_t)f->n_units + 1, sizeof(ts_range))};
    int64_t *at = calloc((size_t)f->n_units + 1, sizeof *at);
    ts_status st = !l.units || !at ? ts_error(TS_ERR_MEMORY, "fsdp: out of memory saving") : cleared;
    for (int k = 0; !st && k < f->n_units; k++) {
        l.units[k] = (ts_range){f->units[k].lo, f->units[k].len};
        at[k] = f->units[k].at;
    }
    if (!st && !lost) st = ts_checkpoint_temp_dir(root, t->step, (long)owner, tmp, sizeof tmp);
    if (!st && !lost && (f->shards > 1 || s->group.leader))
        st = ts_fsdp_write_shard(tmp, &l, f->me, t->step, f->b.params, f->b.state, f->b.total, at);
    if (!st && !lost) ts_dp_group_save_fault(&f->g);
    /* everybody's outcome: the leader commits only a complete folder */
    double fails = st != TS_OK;
    if (!lost) lost = ts_dp_group_meet(&f->g, TS_COMM_ALLREDUCE, &fails, &fails, 1, TS_F64);
    if (!st && !lost && fails > 0)
        st = ts_error(TS_ERR_IO, "fsdp: a rank could not write its shard of step %lld", (long long)t->step);
    if (!st && !lost && s->group.leader) st = commit(t, root, &l, path, cap);
    free(l.units);
    free(at);
    /* the others wait for the commit, so the checkpoint exists when they go on */
    int64_t ok = st == TS_OK;
    if (!lost) lost = ts_dp_group_meet(&f->g, TS_COMM_BROADCAST, &ok, &ok, 1, TS_I64);
    if (lost) {
        fprintf(stderr, "checkpoint of step %lld abandoned: %s\n", (long long)t->step, ts_last_error());
        s->save_abandoned = true;
        if (cap) path[0] = '\0';
        return TS_OK;
    }
    if (!st && !ok) st = ts_error(TS_ERR_IO, "fsdp: the leader could not commit the checkpoint of step %lld",
                                  (long long)t->step);
    /* every rank is done with the folder: a failed save leaves no half (a full disk stays full otherwise) */
    if (!ok && s->group.leader && tmp[0] && ts_io_remove_tree(tmp) != TS_OK)
        fprintf(stderr, "fsdp: %s\n", ts_last_error());
    return st;
}

static void fsdp_free(ts_strategy *s) {
    fsdp_strategy *f = (fsdp_strategy *)s;
    ts_dp_group_close(&f->g);
    free(f->units);
    free(f->unit_of);
    buffers_free(&f->b);
    buffers_free(&f->prev);
    buffers_free(&f->copy.b);
    buffers_free(&f->prev_copy.b);
    free(f->slices);
    free(f);
}

static const ts_strategy_ops fsdp_ops = {
    .units = ts_strategy_all_units,
    .attach = fsdp_attach,
    .begin_step = fsdp_begin_step,
    .grads = fsdp_grads,
    .grads_ready = fsdp_grads_ready,
    .slices = fsdp_slices,
    .reduce_sq_norm = fsdp_reduce_sq_norm,
    .reduce_sums = fsdp_reduce_sums,
    .end_step = fsdp_end_step,
    .save = fsdp_save,
    .load = ts_strategy_load_whole, /* before attach: the whole model, cut by attach */
    .recover = fsdp_recover,
    .free = fsdp_free,
};

ts_strategy *ts_strategy_fsdp_new(const ts_strategy_options *o) {
    fsdp_strategy *f = calloc(1, sizeof *f);
    if (!f) {
        ts_error(TS_ERR_MEMORY, "strategy fsdp: out of memory");
        return NULL;
    }
    f->base.ops = &fsdp_ops;
    f->mode = o->job->parallel.fsdp_mode;
    f->policy = o->job->parallel.fsdp_unit;
    f->bf16_wire = o->job->parallel.wire_dtype == TS_WIRE_BF16;
    /* under mpirun a death ends the job: a copy would never be used */
    f->copying = o->job->parallel.fsdp_neighbour_copy && !o->mpi_comm;
    f->copy.of = f->prev_copy.of = -1;
    static const ts_dp_group_hooks hooks = {.drop = drop_units, .agree = agree, .try_step = try_step};
    if (ts_dp_group_open(&f->g, &f->base, "fsdp", o, &hooks)) {
        free(f);
        return NULL;
    }
    return &f->base;
}
