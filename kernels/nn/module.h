/* module.h - modules: a forward function, children, parameters, hooks.
 *
 * A module belongs to one model and refers to its parameters by index into
 * the model's registry. Its forward takes one tensor and returns one.
 * ts_module_forward() runs, in order: pre-forward hooks, the forward, and
 * post-forward hooks; when gradients are on it also wraps the output so that
 * pre-backward hooks fire when the gradient of the output arrives, and wraps
 * the input so that post-backward hooks fire when the gradient reaching the
 * module's input is complete (for a module whose input carries no gradient
 * they do not fire; use leaf gradient hooks there). Strategies (DDP buckets,
 * FSDP gather/free) attach through hooks without the module knowing.
 *
 * Activation checkpointing: with checkpoint set, the module's forward runs
 * without recording a graph and is recomputed during backward.
 */
#ifndef TS_NN_MODULE_H
#define TS_NN_MODULE_H

#include "kernels/nn/model.h"

typedef enum { TS_HOOK_PRE_FORWARD, TS_HOOK_POST_FORWARD, TS_HOOK_PRE_BACKWARD, TS_HOOK_POST_BACKWARD, TS_HOOK_KINDS } ts_hook_kind;

/* A hook sees the module and, for forward hooks, the input or output. */
typedef ts_status (*ts_hook_fn)(ts_module *m, ts_tensor *t, void *ctx);

typedef struct {
    const char *kind; /* "Linear", "LayerNorm", ... */
    ts_tensor *(*forward)(ts_module *m, ts_tensor *x);
    void (*free)(ts_module *m); /* frees module-specific data (may be NULL) */
} ts_module_ops;

#define TS_MODULE_MAX_HOOKS 4

struct ts_module {
    const ts_module_ops *ops;
    char name[96]; /* dotted path, "" for the root */
    ts_model *model;
    ts_module **children;
    int n_children;
    int param0, n_params; /* own parameters: indices param0 .. param0+n_params-1 */
    int64_t iargs[8];     /* module attributes */
    double fargs[4];
    void *data;           /* module-specific data */
    bool checkpoint;
    int index;            /* creation order in the model, for dropout keys */
    struct {
        ts_hook_fn fn;
        void *ctx;
    } hooks[TS_HOOK_KINDS][TS_MODULE_MAX_HOOKS];
    int n_hooks[TS_HOOK_KINDS];
    /* the last output shape, recorded for summaries */
    int out_ndim;
    int64_t out_shape[TS_MAX_DIMS];
};

/* A module of ops in model m, named parent.name + "." + name. */
ts_module *ts_module_new(ts_model *m, const ts_module_ops *ops, const ts_module *parent, const char *name);

/* Appends child to parent (parent owns it). */
ts_status ts_module_add_child(ts_module *parent, ts_module *child);

/* Registers a parameter of module mod called mod.name + "." + pname. */
int ts_module_param(ts_module *mod, const char *pname, int ndim, const int64_t *shape, ts_init init, bool decay);

/* The module's k-th own parameter as the forward computes with it
 * (borrowed; ts_model_param: the master view, or with bf16 compute the f32
 * tensor converted from the bf16 copy). */
ts_tensor *ts_module_weight(const ts_module *mod, int k);

/* Frees mod and its children. */
void ts_module_free(ts_module *mod);

/* Runs mod on x with hooks and checkpointing (see the top of this file). */
ts_tensor *ts_module_forward(ts_module *mod, ts_tensor *x);

/* Adds a hook of kind to mod. */
ts_status ts_module_add_hook(ts_module *mod, ts_hook_kind kind, ts_hook_fn fn, void *ctx);

/* Calls fn on mod and every descendant, parents first. */
void ts_module_walk(ts_module *mod, void (*fn)(ts_module *m, void *ctx), void *ctx);

/* The dropout key of this module for the model's current step. */
ts_key ts_module_dropout_key(const ts_module *mod);

/* Sequential: runs children in order. */
ts_module *ts_sequential_new(ts_model *m, const ts_module *parent, const char *name);

/* Runs children [first, end) of Sequential seq on x, in order, without
 * seq's own hooks (a part of the chain: a pipeline stage's chunk). */
ts_tensor *ts_sequential_forward_range(ts_module *seq, ts_tensor *x, int first, int end);

#endif
