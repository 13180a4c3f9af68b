/* model.h - a model: modules over one flat parameter buffer.
 *
 * Every parameter is a named view (PyTorch-style dotted name) at an offset
 * into one contiguous f32 buffer `params`; its gradient is the view at the
 * same offset into `grads`, so backward accumulates straight into the flat
 * gradient buffer. Optimizer state lives in `state` (k * numel floats, k set
 * by the optimizer). A PS key range, a DDP bucket, an FSDP shard and a
 * checkpoint are all ranges or walks of these buffers.
 *
 * Life cycle: ts_model_new(); modules register parameters while being built
 * (ts_model_add_param); ts_model_finalize(model, key) allocates the buffers,
 * makes the views and initialises every parameter from key folded with its
 * name, so the same seed builds the same model everywhere, and a model of a
 * slice of the units (a pipeline stage) holds the same values as the whole.
 *
 * Mixed precision (ts_model_set_compute_dtype(m, TS_BF16)): the model gains
 * a second pair of flat buffers with the same layout in real 2-byte bf16,
 * `flat_params16` (a rounded copy of the master) and `flat_grads16`. Each
 * parameter gets a bf16 leaf view `value16` whose grad is its view of
 * flat_grads16. The forward reads weights through ts_model_param(), which
 * then hands out an f32 tensor converted from the bf16 leaf by the recorded
 * ts_to_dtype: ops compute in f32 on bf16-rounded values, and backward
 * rounds each parameter's gradient to bf16 into flat_grads16.
 *   What is bf16: the parameters the forward computes with and their
 *   gradients (flat_params16, flat_grads16), and the activations kept for
 *   backward: ts_model_forward turns on ts_autograd_set_pack_bf16, so each
 *   op's saved inputs and outputs are held as bf16 copies between forward
 *   and backward (statistics such as layernorm's mean and rstd and the
 *   log-sum-exp of attention stay f32).
 *   What stays f32: the master weights (flat_params), the master gradients
 *   the optimizer reads (flat_grads), the optimizer state, and the
 *   arithmetic - the CPU ops compute in f32 (Debian's OpenBLAS has no bf16
 *   GEMM), so each op reads bf16 values widened to f32. The weights the
 *   forward uses are f32 conversions of the bf16 leaves (one tensor per
 *   parameter, so a tied weight's gradient is rounded once); the nodes
 *   keep bf16 views of flat_params16 instead, and each module frees its
 *   weights' converted values when its forward is done (they are converted
 *   again on the next use; the tensors themselves go at the next sync or
 *   fold).
 * Per step: ts_model_zero_grad; per micro-batch forward, backward of the
 * loss scaled by 1/k, ts_model_fold_compute_grads(m, 1); clip and step on
 * the f32 buffers; ts_model_sync_compute. Folding after every backward keeps
 * micro-batch sums in f32 (bf16 sums would lose precision). In the last
 * micro-batch's backward a parameter may be folded alone as soon as its
 * gradient is final (ts_model_fold_param_grad, from its leaf's grad hook),
 * so that its master gradient can be sent while backward goes on.
 */
#ifndef TS_NN_MODEL_H
#define TS_NN_MODEL_H

#include <stdbool.h>

#include "kernels/tensor.h"

typedef enum { TS_INIT_ZEROS, TS_INIT_ONES, TS_INIT_UNIFORM, TS_INIT_NORMAL } ts_init_kind;

typedef struct {
    ts_init_kind kind;
    double a; /* uniform: bound (U[-a, a]); normal: std */
} ts_init;

typedef struct {
    char name[96];
    int ndim;
    int64_t shape[TS_MAX_DIMS];
    int64_t offset, numel; /* range in the flat buffers */
    ts_init init;
    bool decay;            /* weight decay applies (matrices, not biases/norms) */
    ts_tensor *value;      /* view into params; a leaf with requires_grad */
    ts_tensor *value16;    /* bf16 compute: view into flat_params16 (leaf), else NULL */
    ts_tensor *compute;    /* bf16 compute: the f32 tensor made from value16 that
                            * forwards use, cached until sync or fold, or NULL */
    uint64_t compute_forward; /* the forward with gradients it was made in */
    bool folded;           /* bf16 compute: its gradient was folded during the
                            * backward (ts_model_fold_param_grad) that the next
                            * ts_model_fold_compute_grads closes */
} ts_param;

typedef struct ts_module ts_module;

typedef struct ts_model {
    ts_param *params;
    int n_params, cap_params;
    int64_t numel;
    ts_dtype dtype;         /* of the flat buffers: f32, or f64 for gradcheck */
    ts_tensor *flat_params; /* [numel] */
    ts_tensor *flat_grads;  /* [numel] */
    ts_dtype compute_dtype; /* TS_F32 (compute on the master) or TS_BF16 */
    ts_tensor *flat_params16; /* bf16 [numel] rounded master, or NULL */
    ts_tensor *flat_grads16;  /* bf16 [numel] gradients of the compute copy, or NULL */
    float *state;           /* optimizer state, n_state * numel floats (on device), or NULL */
    int n_state;
    ts_tensor *state_buf;   /* owns state: [n_state * numel] f32 */
    ts_device device;       /* where the buffers live (the CPU until ts_model_to) */
    bool finalized;
    bool training;
    uint64_t forwards;      /* forwards with gradients so far (bf16: a conversion
                             * serves the forward it was made in, so that
                             * micro-batches in flight at once - a pipeline's -
                             * each have their own to backward through) */
    ts_key dropout_key;     /* set per step by the training loop */
    bool grads_detached;    /* each parameter has a gradient of its own
                             * (ts_model_detach_grads), not a flat-buffer view */
    ts_module *root;        /* owned */
    int n_modules;          /* modules created so far (their index) */
} ts_model;

/* An empty model in training mode with f32 buffers (set m->dtype = TS_F64
 * before finalize for gradient checks). */
ts_model *ts_model_new(void);

/* Frees the model, its modules and its buffers. */
void ts_model_free(ts_model *m);

/* Registers a parameter; returns its index or -1 (duplicate name, bad shape,
 * model already finalized). */
int ts_model_add_param(ts_model *m, const char *name, int ndim, const int64_t *shape, ts_init init, bool decay);

/* Allocates the flat buffers, makes the views and initialises parameters. */
ts_status ts_model_finalize(ts_model *m, ts_key key);

/* Moves a finalized model's buffers (parameters, gradients, bf16 copies,
 * optimizer state) to device d: every parameter view is remade there, so
 * forwards run on d and inputs must be moved there too. Call before
 * anything holds the old views (optimizer hooks, graphs) or the gradients
 * are detached (refused); a no-op when already there. */
ts_status ts_model_to(ts_model *m, ts_device d);

/* The tensor a forward computes with for parameter i (borrowed): the master
 * view m->params[i].value, or with bf16 compute the f32 tensor converted
 * (recorded) from the bf16 leaf, made once and shared until the next sync or
 * fold, and remade when its graph was used by a backward. NULL on failure.
 * Read and write master values through m->params[i].value. */
ts_tensor *ts_model_param(const ts_model *m, int i);

/* The leaf whose .grad backward fills for parameter i (borrowed): value16
 * with bf16 compute, else value. Leaf gradient hooks attach here. */
ts_tensor *ts_model_grad_leaf(const ts_model *m, int i);

/* Selects the precision of the forward/backward: TS_F32 (the default;
 * frees any bf16 buffers) or TS_BF16 (allocates flat_params16 and
 * flat_grads16, makes the bf16 leaves and syncs them from the master).
 * Needs a finalized model with f32 master buffers; any other dtype is an
 * error naming it. */
ts_status ts_model_set_compute_dtype(ts_model *m, ts_dtype dt);

/* Lets go of the values of the cached f32 conversions of parameters
 * [first, first + n) (bf16 compute): the cache keeps an empty tensor with
 * the same autograd history, filled again by the next ts_model_param; a
 * node still holding the old tensor keeps it whole. */
void ts_model_empty_conversions(ts_model *m, int first, int n);

/* Rounds the f32 master into the bf16 copy (nearest even). Call after each
 * optimizer step and after anything else writes master values (loading a
 * checkpoint, receiving parameters); ts_model_copy_params does it itself.
 * A no-op with f32 compute. */
ts_status ts_model_sync_compute(ts_model *m);

/* Adds scale * (bf16 gradients) into the f32 master gradients and zeros the
 * bf16 ones (those of the parameters not folded alone during the backward,
 * ts_model_fold_param_grad), so the optimizer sees f32 gradients; scale
 * 1/k after each of k micro-batches (ts_mixed_micro_scale) makes their
 * mean. With f32 compute it does nothing (backward already wrote the
 * master gradients), so a loop that scales each micro-batch loss by 1/k
 * and folds with scale 1 is the same in both precisions. */
ts_status ts_model_fold_compute_grads(ts_model *m, float scale);

/* Folds parameter i's gradient alone, as ts_model_fold_compute_grads would
 * (the same additions), as soon as backward has finished it - from the
 * grad hook of its leaf (ts_model_grad_leaf) - so that its f32 master
 * gradient is final while backward goes on. The next
 * ts_model_fold_compute_grads, which must close that backward before any
 * other reaches parameter i, then leaves it alone (it neither reads nor
 * writes its master gradient, which a strategy may be sending by then).
 * Folding it twice in one backward does nothing; with f32 compute it does
 * nothing at all. */
ts_status ts_model_fold_param_grad(ts_model *m, int i, float scale);

/* Index of the parameter called name, or -1 with an error naming it. */
int ts_model_find(const ts_model *m, const char *name);

/* Zeros the whole gradient buffer (and the bf16 one with bf16 compute);
 * with detached gradients releases every parameter's gradient. Forgets
 * which parameters a backward that was not closed folded alone. */
void ts_model_zero_grad(ts_model *m);

/* Detaches the parameters' gradients from the flat gradient buffers, for a
 * strategy that shards them (FSDP): from now on backward gives each
 * parameter's leaf a gradient of its own (on the model's device) at its
 * first contribution (NULL before), which the strategy takes once backward
 * finished it (it reduce-scatters and releases it); ts_model_zero_grad
 * releases them all. The flat gradient buffers stay allocated but are no
 * longer written (the strategy may give their pages back,
 * ts_alloc_decommit). With bf16 compute ts_model_fold_compute_grads adds
 * each parameter's bf16 gradient into its f32 one (made when missing) and
 * releases the bf16 one. A model with detached gradients no longer moves
 * (ts_model_to refuses it). */
void ts_model_detach_grads(ts_model *m);

/* Allocates (zeroed) k floats of optimizer state per parameter element,
 * on the model's device. */
ts_status ts_model_alloc_state(ts_model *m, int k);

/* The optimizer state as an f32 tensor [n_state, numel] viewing m->state
 * (new reference; the model must outlive it), or NULL without state. */
ts_tensor *ts_model_state_tensor(ts_model *m);

/* Train or eval mode (dropout off in eval). */
void ts_model_train(ts_model *m, bool on);

/* Runs the root module on x (see module.h). */
ts_tensor *ts_model_forward(ts_model *m, ts_tensor *x);

/* Runs the root's children [first, end) on x (the root a Sequential, its
 * hooks not run): one chunk of a model that holds several. */
ts_tensor *ts_model_forward_units(ts_model *m, ts_tensor *x, int first, int end);

/* Copies every parameter of src whose name exists in dst (same shape
 * required) into dst; returns how many were copied in *n_copied. */
ts_status ts_model_copy_params(ts_model *dst, const ts_model *src, int *n_copied);

/* Prints what Keras's model.summary() shows: each module with its output
 * shape (found by running a no-grad forward on zeros of input shape) and
 * parameter count, then the totals with their bytes. */
ts_status ts_model_summary(ts_model *m, FILE *f, ts_dtype in_dtype, int in_ndim, const int64_t *in_shape);

#endif
