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
 * makes the views and initialises every parameter from key (parameter i uses
 * ts_key_split(key, i)), so the same seed builds the same model everywhere.
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
} ts_param;

typedef struct ts_module ts_module;

typedef struct ts_model {
    ts_param *params;
    int n_params, cap_params;
    int64_t numel;
    ts_dtype dtype;         /* of the flat buffers: f32, or f64 for gradcheck */
    ts_tensor *flat_params; /* [numel] */
    ts_tensor *flat_grads;  /* [numel] */
    float *state;           /* optimizer state, n_state * numel floats, or NULL */
    int n_state;
    bool finalized;
    bool training;
    ts_key dropout_key;     /* set per step by the training loop */
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

/* The parameter tensor of index i (borrowed). */
ts_tensor *ts_model_param(const ts_model *m, int i);

/* Index of the parameter called name, or -1 with an error naming it. */
int ts_model_find(const ts_model *m, const char *name);

/* Zeros the whole gradient buffer. */
void ts_model_zero_grad(ts_model *m);

/* Allocates (zeroed) k floats of optimizer state per parameter element. */
ts_status ts_model_alloc_state(ts_model *m, int k);

/* The optimizer state as an f32 tensor [n_state, numel] viewing m->state
 * (new reference; the model must outlive it), or NULL without state. */
ts_tensor *ts_model_state_tensor(ts_model *m);

/* Train or eval mode (dropout off in eval). */
void ts_model_train(ts_model *m, bool on);

/* Runs the root module on x (see module.h). */
ts_tensor *ts_model_forward(ts_model *m, ts_tensor *x);

/* Copies every parameter of src whose name exists in dst (same shape
 * required) into dst; returns how many were copied in *n_copied. */
ts_status ts_model_copy_params(ts_model *dst, const ts_model *src, int *n_copied);

/* Prints what Keras's model.summary() shows: each module with its output
 * shape (found by running a no-grad forward on zeros of input shape) and
 * parameter count, then the totals with their bytes. */
ts_status ts_model_summary(ts_model *m, FILE *f, ts_dtype in_dtype, int in_ndim, const int64_t *in_shape);

#endif
