/* autograd.c - the tape: nodes, the backward engine, gradcheck. */
#include "kernels/autograd.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops/reduce.h"
#include "kernels/ops/view.h"

static _Thread_local bool grad_off; /* grad mode is on unless set */

bool ts_grad_enabled(void) { return !grad_off; }

bool ts_grad_set_enabled(bool on) {
    bool prev = !grad_off;
    grad_off = !on;
    return prev;
}

bool ts_autograd_needed(int n, ts_tensor *const *inputs) {
    if (grad_off) return false;
    for (int i = 0; i < n; i++)
        if (inputs[i] && inputs[i]->requires_grad) return true;
    return false;
}

/* The version of t's storage (0 without a tensor or storage). */
static unsigned version_of(const ts_tensor *t) {
    return t && t->storage ? atomic_load_explicit(&t->storage->version, memory_order_relaxed) : 0;
}

ts_node *ts_node_new(const char *op, ts_backward_fn backward, int n, ts_tensor *const *inputs) {
    ts_node *node = calloc(1, sizeof *node);
    ts_tensor **ins = calloc((size_t)(n ? n : 1), sizeof *ins);
    unsigned *versions = calloc((size_t)(n ? n : 1), sizeof *versions);
    if (!node || !ins || !versions) {
        free(node);
        free(ins);
        free(versions);
        ts_error(TS_ERR_MEMORY, "%s: out of memory recording the autograd node", op);
        return NULL;
    }
    node->op = op;
    node->backward = backward;
    node->n_inputs = n;
    node->inputs = ins;
    node->input_versions = versions;
    for (int i = 0; i < n; i++) {
        ins[i] = ts_tensor_retain(inputs[i]);
        versions[i] = version_of(inputs[i]);
    }
    node->refcount = 1;
    return node;
}

/* Slot i of node n: input i, or saved tensor i - n_inputs; with the
 * version it had when the op kept it. */
static ts_tensor **slot_at(ts_node *n, int i, unsigned **version) {
    bool input = i < n->n_inputs;
    *version = input ? &n->input_versions[i] : &n->saved_versions[i - n->n_inputs];
    return input ? &n->inputs[i] : &n->saved[i - n->n_inputs];
}

void ts_node_attach(ts_tensor *out, ts_node *node) {
    out->grad_fn = node;
    out->requires_grad = true;
    node->out_ndim = out->ndim;
    memcpy(node->out_shape, out->shape, sizeof out->shape);
    node->out_dtype = out->dtype;
}

/* dst takes src's autograd history: requires_grad and grad_fn (retained). */
static void take_history(ts_tensor *dst, const ts_tensor *src) {
    dst->requires_grad = src->requires_grad;
    dst->grad_fn = src->grad_fn;
    ts_node_retain(dst->grad_fn);
}

/* ---- packing saved activations to bf16 ---- */

#define PACK_MIN 4096

/* One tensor packed during this packing session: the original's storage
 * id and view, and its bf16 copy (retained). A whole entry (from
 * ts_autograd_pack_as) stands for every view of the storage. */
typedef struct {
    uint64_t storage;
    int64_t offset;
    int ndim;
    int64_t shape[TS_MAX_DIMS], strides[TS_MAX_DIMS];
    ts_tensor *copy;
    bool whole;
} pack_entry;

static _Thread_local bool pack_on;
static _Thread_local ts_node *pack_pending; /* retained; packed at the next record or flush */
static _Thread_local pack_entry *pack_memo; /* what this session packed, so each view is copied once */
static _Thread_local int pack_n, pack_cap;

/* Whether t is kept as a bf16 copy: f32 data of PACK_MIN elements or more
 * that is not a parameter; an input also needs history (a leaf input
 * belongs to the caller, who keeps it anyway). */
static bool packable(const ts_tensor *t, bool input) {
    return !t->storage->no_pack && ts_tensor_numel(t) >= PACK_MIN && (!input || t->grad_fn);
}

/* A new bf16 view with t's values made from an earlier copy of this
 * session, or NULL. */
static ts_tensor *memo_view(const ts_tensor *t) {
    for (int i = 0; i < pack_n; i++) {
        const pack_entry *e = &pack_memo[i];
        if (e->storage != t->storage->id) continue;
        if (e->whole)
            return ts_tensor_from_storage(e->copy->storage, TS_BF16, e->copy->offset + t->offset - e->offset, t->ndim,
                                          t->shape, t->strides);
        if (e->offset == t->offset && e->ndim == t->ndim &&
            !memcmp(e->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim) &&
            !memcmp(e->strides, t->strides, sizeof(int64_t) * (size_t)t->ndim))
            return ts_tensor_alias(e->copy);
    }
    return NULL;
}

/* Remembers that t was packed to copy (silently not, if out of memory). */
static void memo_add(const ts_tensor *t, ts_tensor *copy, bool whole) {
    if (pack_n == pack_cap) {
        int cap = pack_cap ? 2 * pack_cap : 64;
        pack_entry *m = realloc(pack_memo, sizeof *m * (size_t)cap);
        if (!m) return;
        pack_memo = m;
        pack_cap = cap;
    }
    pack_entry *e = &pack_memo[pack_n++];
    *e = (pack_entry){.storage = t->storage->id, .offset = t->offset, .ndim = t->ndim, .copy = ts_tensor_retain(copy),
                      .whole = whole};
    memcpy(e->shape, t->shape, sizeof e->shape);
    memcpy(e->strides, t->strides, sizeof e->strides);
}

void ts_autograd_pack_as(const ts_tensor *f32, ts_tensor *bf16) {
    if (!pack_on || !f32->storage || !bf16->storage) return;
    for (int i = 0; i < pack_n; i++)
        if (pack_memo[i].whole && pack_memo[i].storage == f32->storage->id) return; /* already there */
    memo_add(f32, bf16, true);
}

/* Replaces *slot by a bf16 tensor with the same values - a view of an
 * earlier copy or of a ts_autograd_pack_as tensor, else (when packable) a
 * new copy - and the slot's history; keeps it on failure (f32 is still
 * correct) and when it was written in place since the op kept it (at
 * *version: the backward refuses it then). */
static void pack_slot(ts_tensor **slot, unsigned *version, bool input) {
    ts_tensor *t = *slot;
    if (!t || !t->storage || t->packed || t->dtype != TS_F32 || version_of(t) != *version) return;
    ts_tensor *p = memo_view(t);
    if (!p && packable(t, input) && (p = ts_tensor_copy_as(t, TS_BF16))) memo_add(t, p, false);
    if (!p) return;
    p->packed = true;
    take_history(p, t);
    *slot = p;
    *version = version_of(p);
    ts_tensor_release(t);
}

/* Packs the pending node's inputs and saved tensors. */
static void pack_flush(void) {
    ts_node *n = pack_pending;
    pack_pending = NULL;
    if (!n) return;
    for (int i = 0; i < n->n_inputs + TS_NODE_MAX_SAVED; i++) {
        unsigned *version;
        ts_tensor **slot = slot_at(n, i, &version);
        pack_slot(slot, version, i < n->n_inputs);
    }
    ts_node_release(n);
}

bool ts_autograd_packing(void) { return pack_on; }

bool ts_autograd_set_pack_bf16(bool on) {
    bool prev = pack_on;
    if (!on) {
        pack_flush();
        for (int i = 0; i < pack_n; i++) ts_tensor_release(pack_memo[i].copy);
        pack_n = 0;
    }
    pack_on = on;
    return prev;
}

/* The f32 values of packed view p laid out with p's strides, so a
 * backward sees the layout it would have seen unpacked (and its GEMMs sum
 * in the same order): the span of storage p covers, widened. */
static ts_tensor *widen(const ts_tensor *p) {
    int64_t span = 1;
    for (int d = 0; d < p->ndim; d++) {
        if (p->shape[d] == 0 || p->strides[d] < 0) return ts_tensor_copy_as(p, TS_F32);
        span += (p->shape[d] - 1) * p->strides[d];
    }
    if (ts_tensor_is_contiguous(p)) return ts_tensor_copy_as(p, TS_F32);
    ts_tensor *src = ts_tensor_from_storage(p->storage, TS_BF16, p->offset, 1, &span, NULL);
    ts_tensor *base = src ? ts_tensor_empty_on(ts_tensor_device(p), TS_F32, 1, &span) : NULL;
    ts_tensor *u = base && !ts_tensor_copy_(base, src)
                       ? ts_tensor_from_storage(base->storage, TS_F32, 0, p->ndim, p->shape, p->strides)
                       : NULL;
    ts_tensor_release(src);
    ts_tensor_release(base);
    return u;
}

/* Refuses slot i of n when what it holds was written in place since the
 * op kept it; else makes a packed slot the f32 tensor it stands for, with
 * its history. */
static ts_status unpack_slot(ts_node *n, int i) {
    unsigned *version;
    ts_tensor **slot = slot_at(n, i, &version), *p = *slot;
    if (p && p->storage && version_of(p) != *version)
        return ts_error(TS_ERR_STATE, "backward of %s: its %s %d %s was written in place (copy_, add_, fill_ or set) "
                        "after %s kept it, so its gradient cannot be computed: write into a copy, or after the "
                        "backward", n->op, i < n->n_inputs ? "input" : "saved tensor",
                        i < n->n_inputs ? i : i - n->n_inputs, ts_shape_str(p), n->op);
    if (!p || !p->packed) return TS_OK;
    ts_tensor *u = widen(p);
    if (!u) return ts_last_status();
    take_history(u, p);
    ts_tensor_release(p);
    *slot = u;
    *version = version_of(u);
    return TS_OK;
}

ts_node *ts_autograd_record(ts_tensor *out, const char *op, ts_backward_fn backward, int n,
                            ts_tensor *const *inputs) {
    if (!out || !ts_autograd_needed(n, inputs)) return NULL;
    pack_flush();
    ts_node *node = ts_node_new(op, backward, n, inputs);
    if (node) ts_node_attach(out, node);
    if (node && pack_on) {
        ts_node_retain(node);
        pack_pending = node;
    }
    return node;
}

void ts_node_save(ts_node *node, int i, const ts_tensor *t) {
    ts_tensor_release(node->saved[i]);
    node->saved[i] = t ? ts_tensor_alias(t) : NULL;
    node->saved_versions[i] = version_of(t);
}

ts_tensor *ts_autograd_meta(const ts_tensor *t) {
    ts_tensor *meta = calloc(1, sizeof *meta);
    if (!meta) return NULL;
    meta->ndim = t->ndim;
    memcpy(meta->shape, t->shape, sizeof t->shape);
    memcpy(meta->strides, t->strides, sizeof t->strides);
    meta->dtype = t->dtype;
    meta->refcount = 1;
    take_history(meta, t);
    return meta;
}

void ts_node_forget_input_data(ts_node *node, int i) {
    ts_tensor *x = node ? node->inputs[i] : NULL;
    if (!x || !x->grad_fn) return; /* a leaf or a constant: kept */
    ts_tensor *meta = ts_autograd_meta(x);
    if (!meta) return; /* keeping the full input is still correct */
    node->inputs[i] = meta;
    ts_tensor_release(x);
}

bool ts_node_wants(const ts_node *node, int i) {
    return node->inputs[i] && node->inputs[i]->requires_grad;
}

ts_tensor *ts_node_grad_sink(const ts_node *node, int i) {
    const ts_tensor *x = node->inputs[i];
    ts_tensor *g = x ? x->grad : NULL;
    if (!g || x->grad_fn || !x->requires_grad || !x->storage || !g->storage) return NULL;
    if (g->dtype != x->dtype || !ts_tensor_same_shape(g, x) || !ts_tensor_is_contiguous(g) ||
        !ts_device_equal(ts_tensor_device(g), ts_tensor_device(x)))
        return NULL;
    return g;
}

void ts_node_retain(ts_node *node) {
    if (node) node->refcount++;
}

/* Releases what the node holds for backward: inputs, saved tensors, ctx. */
static void node_free_state(ts_node *node) {
    for (int i = 0; i < node->n_inputs; i++) {
        ts_tensor_release(node->inputs[i]);
        node->inputs[i] = NULL;
    }
    for (int i = 0; i < TS_NODE_MAX_SAVED; i++) {
        ts_tensor_release(node->saved[i]);
        node->saved[i] = NULL;
    }
    if (node->ctx_free) node->ctx_free(node->ctx);
    node->ctx = NULL;
    node->ctx_free = NULL;
    ts_tensor_release(node->grad);
    node->grad = NULL;
}

void ts_node_release(ts_node *node) {
    if (!node || --node->refcount > 0) return;
    node_free_state(node);
    free(node->inputs);
    free(node->input_versions);
    free(node);
}

/* ---- gradient arithmetic used by the engine ---- */

ts_status ts_grad_accumulate(ts_tensor **slot, const ts_tensor *src) {
    if (*slot) {
        if (!ts_tensor_same_shape(*slot, src))
            return ts_error(TS_ERR_SHAPE, "backward: gradient %s does not match .grad %s", ts_shape_str(src),
                            ts_shape_str(*slot));
        return ts_tensor_add_(*slot, src);
    }
    *slot = ts_tensor_copy_as(src, src->dtype);
    return *slot ? TS_OK : ts_last_status();
}

/* Pending (non-leaf) gradients may alias tensors the engine does not own
 * (the same tensor pending for two nodes, a view of another gradient), so
 * a second arrival adds in place only into a sum nothing else can see (one
 * reference to it and to its storage), else makes a fresh sum. */
static ts_status accumulate_pending(ts_tensor **slot, ts_tensor *src) {
    ts_tensor *s = *slot;
    if (!s) {
        *slot = ts_tensor_retain(src);
        return TS_OK;
    }
    if (s->refcount == 1 && s->storage->refcount == 1 && ts_tensor_is_contiguous(s)) return ts_tensor_add_(s, src);
    ts_tensor *sum = ts_tensor_copy_as(s, s->dtype);
    if (!sum) return ts_last_status();
    ts_status st = ts_tensor_add_(sum, src);
    if (st) {
        ts_tensor_release(sum);
        return st;
    }
    ts_tensor_release(s);
    *slot = sum;
    return TS_OK;
}

ts_tensor *ts_sum_to(ts_tensor *g, int ndim, const int64_t *shape) {
    int lead = g->ndim - ndim;
    bool same = lead == 0;
    for (int d = 0; same && d < ndim; d++) same = g->shape[d] == shape[d];
    if (same) return ts_tensor_retain(g);
    if (lead < 0) goto mismatch;
    for (int d = 0; d < ndim; d++)
        if (shape[d] != 1 && shape[d] != g->shape[lead + d]) goto mismatch;
    /* sum over the leading dims and the dims stretched from 1, then drop them */
    int dims[TS_MAX_DIMS], n = 0;
    for (int d = 0; d < g->ndim; d++)
        if (d < lead || (shape[d - lead] == 1 && g->shape[d] != 1)) dims[n++] = d;
    ts_tensor *s = n ? ts_sum(g, n, dims, false) : ts_tensor_retain(g);
    ts_tensor *out = s ? ts_reshape(s, ndim, shape) : NULL;
    ts_tensor_release(s);
    return out;
mismatch:
    ts_error(TS_ERR_SHAPE, "backward: gradient of shape %s cannot be reduced to %s", ts_shape_str(g),
             ts_dims_str(ndim, shape));
    return NULL;
}

/* The view of t that is x's narrow window of node n (no history). */
static ts_tensor *window_of(const ts_node *n, ts_tensor *t, const ts_tensor *part) {
    return ts_tensor_from_storage(t->storage, t->dtype, t->offset + n->window_start * t->strides[n->window_dim], t->ndim,
                                  part->shape, t->strides);
}

/* Adds part, the gradient of node n's window of input x, into *slot (x's
 * pending gradient, or a leaf's .grad when leaf): into a zero gradient
 * made for it when there is none, in place when nothing else can see the
 * slot (a leaf's grad always), else into a fresh copy. */
static ts_status accumulate_window(const ts_node *n, ts_tensor **slot, const ts_tensor *x, ts_tensor *part,
                                   bool leaf) {
    ts_tensor *s = *slot, *sum = NULL;
    if (!s)
        sum = ts_tensor_zeros_on(ts_tensor_device(part), x->dtype, x->ndim, x->shape);
    else if (!leaf && !(s->refcount == 1 && s->storage->refcount == 1 && ts_tensor_is_contiguous(s)))
        sum = ts_tensor_copy_as(s, s->dtype);
    if (!s || sum != NULL) {
        if (!sum) return ts_last_status();
        ts_tensor_release(s);
        *slot = s = sum;
    }
    ts_tensor *w = window_of(n, s, part);
    ts_status st = w ? ts_tensor_add_(w, part) : ts_last_status();
    ts_tensor_release(w);
    return st;
}

/* Brings a gradient to input x's shape and dtype (new reference). */
static ts_tensor *fit_grad(const char *op, ts_tensor *g, const ts_tensor *x) {
    ts_tensor *r = ts_sum_to(g, x->ndim, x->shape);
    if (!r) {
        ts_error(ts_last_status(), "backward of %s: %s", op, ts_last_error());
        return NULL;
    }
    if (r->dtype != x->dtype) {
        ts_tensor *c = ts_tensor_copy_as(r, x->dtype);
        ts_tensor_release(r);
        r = c;
    }
    return r;
}

/* ---- the engine ---- */

typedef struct {
    ts_node **items;
    int n, cap;
} node_list;

static ts_status list_push(node_list *l, ts_node *n) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 64;
        ts_node **items = realloc(l->items, sizeof *items * (size_t)cap);
        if (!items) return ts_error(TS_ERR_MEMORY, "backward: out of memory");
        l->items = items;
        l->cap = cap;
    }
    l->items[l->n++] = n;
    return TS_OK;
}

/* Collects every node reachable from root into all, counting for each the
 * number of its consumers in the graph (pending). */
static ts_status collect(ts_node *root, unsigned stamp, node_list *all) {
    node_list stack = {0};
    ts_status st = list_push(&stack, root);
    root->visit = stamp;
    root->pending = 0;
    while (!st && stack.n) {
        ts_node *n = stack.items[--stack.n];
        if ((st = list_push(all, n))) break;
        ts_node_retain(n);
        for (int i = 0; i < n->n_inputs; i++) {
            ts_tensor *x = n->inputs[i];
            if (x && !x->grad_fn && x->requires_grad && x->grad_hook) { /* a hooked leaf: count its gradients */
                if (x->hook_pass != stamp) {
                    x->hook_pass = stamp;
                    x->hook_due = 0;
                }
                x->hook_due++;
            }
            if (!x || !x->grad_fn || !x->requires_grad) continue;
            ts_node *c = x->grad_fn;
            if (c->freed) {
                st = ts_error(TS_ERR_STATE,
                              "backward: the graph through %s was already freed by an earlier backward", c->op);
                break;
            }
            if (c->visit != stamp) {
                c->visit = stamp;
                c->pending = 0;
                if ((st = list_push(&stack, c))) break;
            }
            c->pending++;
        }
    }
    free(stack.items);
    return st;
}

/* Runs one node's backward and routes the input gradients. Pushes inputs
 * whose gradients are complete onto ready, and runs the hook of a leaf
 * whose gradients of this pass are all in. */
static ts_status run_node(ts_node *n, node_list *ready) {
    ts_status st = TS_OK;
    ts_tensor *g = n->grad;
    n->grad = NULL;
    ts_tensor **gin = calloc((size_t)(n->n_inputs ? n->n_inputs : 1), sizeof *gin);
    if (!gin) return ts_error(TS_ERR_MEMORY, "backward: out of memory");
    for (int i = 0; i < n->n_inputs + TS_NODE_MAX_SAVED && !st; i++) st = unpack_slot(n, i);
    if (g && !st) {
        if (g->ndim != n->out_ndim || memcmp(g->shape, n->out_shape, sizeof(int64_t) * (size_t)g->ndim))
            st = ts_error(TS_ERR_SHAPE, "backward of %s: gradient %s does not match output %s", n->op,
                          ts_shape_str(g), ts_dims_str(n->out_ndim, n->out_shape));
        else
            st = n->backward(n, g, gin);
    }
    for (int i = 0; i < n->n_inputs; i++) {
        ts_tensor *x = n->inputs[i];
        if (!st && gin[i] && x && x->requires_grad) {
            bool window = n->window && i == 0;
            ts_tensor *fit = window ? ts_tensor_retain(gin[i]) : fit_grad(n->op, gin[i], x);
            ts_tensor **slot = x->grad_fn ? &x->grad_fn->grad : &x->grad;
            if (!fit) st = ts_last_status();
            else if (window) st = accumulate_window(n, slot, x, fit, !x->grad_fn);
            else if (x->grad_fn) st = accumulate_pending(slot, fit);
            else st = ts_grad_accumulate(slot, fit);
            ts_tensor_release(fit);
        }
        ts_tensor_release(gin[i]);
        /* a hooked leaf's last gradient of the pass (or one it will not get) */
        if (!st && x && !x->grad_fn && x->grad_hook && x->hook_pass == n->visit && --x->hook_due == 0 && x->grad)
            st = x->grad_hook(x, x->grad_hook_ctx);
        if (x && x->grad_fn && x->requires_grad && x->grad_fn->visit == n->visit && --x->grad_fn->pending == 0 &&
            !st)
            st = list_push(ready, x->grad_fn);
    }
    free(gin);
    ts_tensor_release(g);
    node_free_state(n); /* saved activations go as soon as they are used */
    n->freed = true;
    return st;
}

ts_status ts_backward(ts_tensor *t, ts_tensor *grad) {
    static _Atomic unsigned stamps;
    if (!t) return ts_error(TS_ERR_VALUE, "backward: tensor is NULL");
    if (!t->requires_grad)
        return ts_error(TS_ERR_STATE, "backward: tensor of shape %s does not require grad", ts_shape_str(t));
    if (grad && ts_check_arg("backward", "gradient", grad, TS_MASK(t->dtype))) return ts_last_status();
    if (grad && !ts_tensor_same_shape(grad, t))
        return ts_error(TS_ERR_SHAPE, "backward: gradient %s does not match tensor %s", ts_shape_str(grad),
                        ts_shape_str(t));
    if (!grad && ts_tensor_numel(t) != 1)
        return ts_error(TS_ERR_SHAPE, "backward: tensor of shape %s is not a scalar; pass its gradient",
                        ts_shape_str(t));
    pack_flush();
    ts_tensor *seed = grad ? ts_tensor_retain(grad) : ts_tensor_full_on(ts_tensor_device(t), t->dtype, t->ndim, t->shape, 1.0);
    if (!seed) return ts_last_status();
    if (!t->grad_fn) { /* a leaf: d t / d t */
        ts_status st = ts_grad_accumulate(&t->grad, seed);
        ts_tensor_release(seed);
        if (!st && t->grad_hook) st = t->grad_hook(t, t->grad_hook_ctx);
        return st;
    }
    if (t->grad_fn->freed) {
        ts_tensor_release(seed);
        return ts_error(TS_ERR_STATE, "backward: the graph through %s was already freed by an earlier backward",
                        t->grad_fn->op);
    }
    bool prev = ts_grad_set_enabled(false);
    node_list all = {0}, ready = {0};
    unsigned stamp = ++stamps;
    ts_status st = collect(t->grad_fn, stamp, &all);
    if (!st) st = accumulate_pending(&t->grad_fn->grad, seed);
    if (!st) st = list_push(&ready, t->grad_fn);
    while (!st && ready.n) st = run_node(ready.items[--ready.n], &ready);
    for (int i = 0; i < all.n; i++) {
        node_free_state(all.items[i]);
        all.items[i]->freed = true;
        ts_node_release(all.items[i]);
    }
    free(all.items);
    free(ready.items);
    ts_tensor_release(seed);
    ts_grad_set_enabled(prev);
    return st;
}

ts_status ts_set_requires_grad(ts_tensor *t, bool on) {
    if (!t) return ts_error(TS_ERR_VALUE, "requires_grad: tensor is NULL");
    if (t->grad_fn)
        return ts_error(TS_ERR_STATE, "requires_grad: tensor %s is the result of %s, not a leaf", ts_shape_str(t),
                        t->grad_fn->op);
    if (on && !ts_dtype_is_float(t->dtype))
        return ts_error(TS_ERR_DTYPE, "requires_grad: dtype %s cannot have gradients", ts_dtype_name(t->dtype));
    t->requires_grad = on;
    return TS_OK;
}

void ts_zero_grad(ts_tensor *t) {
    if (t->grad) ts_tensor_fill_(t->grad, 0.0);
}

/* ---- gradcheck ---- */

/* sum_i y_i * w_i, in double. */
static double weighted_sum(const ts_tensor *y, const ts_tensor *w) {
    double s = 0;
    int64_t n = ts_tensor_numel(y);
    for (int64_t i = 0; i < n; i++) s += ts_tensor_get(y, i) * ts_tensor_get(w, i);
    return s;
}

/* fn evaluated with grad mode off, reduced with weights w. */
static ts_status probe(ts_gradcheck_fn fn, void *ctx, ts_tensor *const *inputs, const ts_tensor *w, double *out) {
    bool prev = ts_grad_set_enabled(false);
    ts_tensor *y = fn(inputs, ctx);
    ts_grad_set_enabled(prev);
    if (!y) return ts_last_status();
    *out = weighted_sum(y, w);
    ts_tensor_release(y);
    return TS_OK;
}

ts_status ts_gradcheck(ts_gradcheck_fn fn, void *ctx, int n, ts_tensor *const *inputs, double eps, double atol,
                       double rtol) {
    for (int i = 0; i < n; i++) {
        if (ts_check_tensor("gradcheck", "input", inputs[i], TS_MASK(TS_F64) | TS_INTS | TS_MASK(TS_U8)))
            return ts_last_status();
        if (inputs[i]->requires_grad && inputs[i]->grad_fn)
            return ts_error(TS_ERR_STATE, "gradcheck: input %d is not a leaf", i);
        ts_zero_grad(inputs[i]); /* keeps a preset .grad view (flat buffers) */
    }
    ts_tensor *y = fn(inputs, ctx);
    if (!y) return ts_last_status();
    if (!y->requires_grad) {
        ts_tensor_release(y);
        return ts_error(TS_ERR_STATE, "gradcheck: output does not depend on any input with requires_grad");
    }
    ts_tensor *w = ts_tensor_randn(ts_key_from_seed(0x6772616463686b), TS_F64, y->ndim, y->shape);
    ts_status st = w ? ts_backward(y, w) : ts_last_status();
    ts_tensor_release(y);
    for (int i = 0; !st && i < n; i++) {
        ts_tensor *x = inputs[i];
        if (!x->requires_grad) continue;
        int64_t m = ts_tensor_numel(x);
        for (int64_t j = 0; !st && j < m; j++) {
            double orig = ts_tensor_get(x, j), fp = 0, fm = 0;
            ts_tensor_set(x, j, orig + eps);
            st = probe(fn, ctx, inputs, w, &fp);
            ts_tensor_set(x, j, orig - eps);
            if (!st) st = probe(fn, ctx, inputs, w, &fm);
            ts_tensor_set(x, j, orig);
            if (st) break;
            double num = (fp - fm) / (2 * eps);
            double ana = x->grad ? ts_tensor_get(x->grad, j) : 0.0;
            if (!(fabs(ana - num) <= atol + rtol * fabs(num)))
                st = ts_error(TS_ERR_VALUE,
                              "gradcheck: input %d %s element %lld: analytic %.10g vs numeric %.10g", i,
                              ts_shape_str(x), (long long)j, ana, num);
        }
    }
    ts_tensor_release(w);
    return st;
}
