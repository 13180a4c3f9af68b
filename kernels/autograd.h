/* autograd.h - define-by-run reverse-mode differentiation.
 *
 * An op that sees an input with requires_grad (while grad mode is on) records
 * a ts_node: its backward function, its inputs (retained) and whatever it
 * saved. The output tensor owns the node through grad_fn. ts_backward()
 * walks the graph from a tensor in reverse topological order, calls each
 * node's backward once all gradients of its output have arrived, and
 * accumulates leaf gradients into .grad (adding to what is there, until
 * ts_zero_grad). The engine itself reduces a gradient over broadcast
 * dimensions and converts it to the input's dtype, so op backward functions
 * return gradients of the broadcast shape. After backward the graph's saved
 * state is freed; a second backward through it is an error, and so is a
 * backward through a node whose inputs or saved tensors were written in
 * place (ts_tensor_copy_, _add_, _fill_, _set on any view of their
 * storage) after the op kept them: its gradient would be computed from the
 * new values.
 *
 * Backward functions run with grad mode off. Saving an op's own output must
 * use ts_tensor_alias() (no grad_fn) to avoid a reference cycle.
 */
#ifndef TS_AUTOGRAD_H
#define TS_AUTOGRAD_H

#include <stdbool.h>

#include "kernels/tensor.h"

#define TS_NODE_MAX_SAVED 8

/* Fills grad_in[i] (new references) for each input i that needs a gradient
 * (ts_node_wants(node, i)); others stay NULL. grad_out is the gradient of
 * the node's output, with the output's shape. */
typedef ts_status (*ts_backward_fn)(ts_node *node, ts_tensor *grad_out, ts_tensor **grad_in);

struct ts_node {
    const char *op;
    ts_backward_fn backward;
    int n_inputs;
    ts_tensor **inputs;                  /* retained */
    ts_tensor *saved[TS_NODE_MAX_SAVED]; /* retained, no history */
    /* the storage versions of inputs and saved as the op kept them: the
     * engine refuses the backward when one was written in place since */
    unsigned *input_versions;
    unsigned saved_versions[TS_NODE_MAX_SAVED];
    int64_t iargs[16];                   /* op attributes */
    double fargs[8];
    void *ctx;                           /* op-owned extra state */
    void (*ctx_free)(void *ctx);
    /* set by an op whose input 0 gets a gradient on one slice only
     * (narrow): the backward returns that slice's gradient, and the engine
     * adds it into input 0's gradient at window_start along window_dim
     * (zeros elsewhere) without making a zero tensor per slice */
    bool window;
    int window_dim;
    int64_t window_start;
    /* engine state */
    _Atomic int refcount;
    int out_ndim;
    int64_t out_shape[TS_MAX_DIMS];
    ts_dtype out_dtype;
    ts_tensor *grad; /* pending gradient during backward */
    int pending;     /* consumers not yet processed during backward */
    bool freed;      /* backward already ran and released saved state */
    unsigned visit;  /* stamp of the last backward pass that reached it */
};

/* Grad mode: on by default, per thread. ts_grad_set_enabled returns the
 * previous state so scopes nest: bool prev = ts_grad_set_enabled(false);
 * ...; ts_grad_set_enabled(prev); */
bool ts_grad_enabled(void);
bool ts_grad_set_enabled(bool on);

/* Packing of saved activations, per thread, off by default (the bf16
 * compute mode of a model turns it on for its forward): while on, each
 * node recorded through ts_autograd_record keeps its f32 inputs with
 * history and its f32 saved tensors of at least 4096 elements as bf16
 * copies (half the memory; each view copied once per packing session),
 * except storages marked no_pack (statistics that stay exact). Packing happens once the op has
 * finished recording (at the next record, when packing is turned off, or
 * at ts_backward); the engine converts the copies back to f32 just before
 * the node's backward, which therefore sees bf16-rounded activations.
 * Returns the previous state. */
bool ts_autograd_set_pack_bf16(bool on);

/* Whether packing is on in this thread. */
bool ts_autograd_packing(void);

/* While packing is on (until it is turned off), every view of f32's
 * storage that a node keeps is packed as the same view of bf16's storage
 * instead of a copy, whatever its size: bf16 holds f32's values rounded,
 * laid out alike (both contiguous, same shape) - a parameter's f32
 * conversion and its bf16 compute copy. Registering a storage again is a
 * no-op. The engine widens such a view with its strides kept. */
void ts_autograd_pack_as(const ts_tensor *f32, ts_tensor *bf16);

/* True when grad mode is on and any of the n inputs requires grad. */
bool ts_autograd_needed(int n, ts_tensor *const *inputs);

/* A node for op with n inputs (each retained; NULL entries allowed). */
ts_node *ts_node_new(const char *op, ts_backward_fn backward, int n, ts_tensor *const *inputs);

/* Makes node the grad_fn of out (out takes the caller's node reference). */
void ts_node_attach(ts_tensor *out, ts_node *node);

/* Records op on out when needed: ts_autograd_needed(n, inputs) ? a new node
 * attached to out : NULL. The returned node is borrowed (owned by out), so the
 * op can save tensors and attributes into it. */
ts_node *ts_autograd_record(ts_tensor *out, const char *op, ts_backward_fn backward, int n,
                            ts_tensor *const *inputs);

/* Saves an alias of t (no history) in slot i of node. */
void ts_node_save(ts_node *node, int i, const ts_tensor *t);

/* A tensor with t's shape, strides, dtype and autograd history but no
 * storage (NULL if out of memory). */
ts_tensor *ts_autograd_meta(const ts_tensor *t);

/* Declares that node's backward never reads the values of input i (add,
 * sub, copies, reshape): when that input has history, the node keeps only
 * what the engine needs (shape, dtype, grad_fn) in place of the tensor, so
 * its storage can be freed as soon as the forward pass drops it. Leaves are
 * kept as they are. Call right after ts_autograd_record. */
void ts_node_forget_input_data(ts_node *node, int i);

/* Whether input i of node needs a gradient. */
bool ts_node_wants(const ts_node *node, int i);

/* The .grad a backward may add input i's gradient into itself, instead
 * of returning it for the engine to add: input i is a leaf that requires
 * grad and already has a dense .grad of its shape, dtype and device (a
 * model's parameter, whose .grad is a view of the flat gradient buffer);
 * else NULL. A backward that adds into it leaves grad_in[i] NULL; the
 * engine still runs the leaf's grad_hook once the pass is done with it.
 * For a GEMM this saves the temporary, its zeroing and the add. */
ts_tensor *ts_node_grad_sink(const ts_node *node, int i);

void ts_node_retain(ts_node *node);
void ts_node_release(ts_node *node);

/* Backpropagates from t. With grad NULL, t must hold one element (grad 1);
 * else grad has t's shape and dtype. Fails if t does not require grad, or its graph
 * was already consumed by an earlier backward. Once the pass has added the
 * last of its gradients into a leaf's .grad, the leaf's grad_hook
 * (tensor.h) runs, once per pass; the first hook that fails stops the
 * pass, and ts_backward returns that hook's status and message. */
ts_status ts_backward(ts_tensor *t, ts_tensor *grad);

/* Sets requires_grad on a leaf (fails on a tensor with history). */
ts_status ts_set_requires_grad(ts_tensor *t, bool on);

/* Zeros t->grad in place if present. */
void ts_zero_grad(ts_tensor *t);

/* Adds src into the gradient slot *slot (allocating a copy if *slot is
 * NULL), converting dtype; shapes must match. */
ts_status ts_grad_accumulate(ts_tensor **slot, const ts_tensor *src);

/* Reduces g (broadcast result) to the given shape by summing over the
 * broadcast dimensions. Returns a new reference (g itself retained when the
 * shapes already match). */
ts_tensor *ts_sum_to(ts_tensor *g, int ndim, const int64_t *shape);

/* A scalar function of tensors for gradcheck: returns a new tensor. */
typedef ts_tensor *(*ts_gradcheck_fn)(ts_tensor *const *inputs, void *ctx);

/* Checks fn's analytic gradients against central finite differences.
 * Inputs must be f64 leaves; those with requires_grad are checked. The
 * output is reduced with fixed random weights so every output element
 * counts. Returns TS_OK, or an error naming the input, the element and both
 * values when |analytic - numeric| > atol + rtol * |numeric|. */
ts_status ts_gradcheck(ts_gradcheck_fn fn, void *ctx, int n, ts_tensor *const *inputs, double eps,
                       double atol, double rtol);

#endif
