/* module.c - module tree, hooks, activation checkpointing, Sequential. */
#include "kernels/nn/module.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/autograd.h"

ts_module *ts_module_new(ts_model *m, const ts_module_ops *ops, const ts_module *parent, const char *name) {
    ts_module *mod = calloc(1, sizeof *mod);
    if (!mod) {
        ts_error(TS_ERR_MEMORY, "module: out of memory");
        return NULL;
    }
    mod->ops = ops;
    mod->model = m;
    char full[256];
    int len = snprintf(full, sizeof full, "%s%s%s", parent && parent->name[0] ? parent->name : "",
                       parent && parent->name[0] ? "." : "", name ? name : "");
    if (len >= (int)sizeof mod->name) {
        ts_error(TS_ERR_VALUE, "module: name %s is too long", full);
        free(mod);
        return NULL;
    }
    memcpy(mod->name, full, (size_t)len + 1);
    mod->param0 = m->n_params;
    mod->index = m->n_modules++;
    return mod;
}

ts_status ts_module_add_child(ts_module *parent, ts_module *child) {
    if (!child) return ts_last_status();
    ts_module **c = realloc(parent->children, sizeof *c * (size_t)(parent->n_children + 1));
    if (!c) {
        ts_module_free(child);
        return ts_error(TS_ERR_MEMORY, "module: out of memory");
    }
    parent->children = c;
    c[parent->n_children++] = child;
    return TS_OK;
}

int ts_module_param(ts_module *mod, const char *pname, int ndim, const int64_t *shape, ts_init init, bool decay) {
    char full[256];
    snprintf(full, sizeof full, "%s%s%s", mod->name, mod->name[0] ? "." : "", pname);
    if (mod->n_params == 0) mod->param0 = mod->model->n_params;
    if (mod->param0 + mod->n_params != mod->model->n_params) {
        ts_error(TS_ERR_STATE, "module %s: parameters must be registered together", mod->name);
        return -1;
    }
    int i = ts_model_add_param(mod->model, full, ndim, shape, init, decay);
    if (i >= 0) mod->n_params++;
    return i;
}

ts_tensor *ts_module_weight(const ts_module *mod, int k) { return ts_model_param(mod->model, mod->param0 + k); }

void ts_module_free(ts_module *mod) {
    if (!mod) return;
    for (int i = 0; i < mod->n_children; i++) ts_module_free(mod->children[i]);
    free(mod->children);
    if (mod->ops->free) mod->ops->free(mod);
    free(mod);
}

ts_status ts_module_add_hook(ts_module *mod, ts_hook_kind kind, ts_hook_fn fn, void *ctx) {
    if ((unsigned)kind >= TS_HOOK_KINDS || mod->n_hooks[kind] == TS_MODULE_MAX_HOOKS)
        return ts_error(TS_ERR_VALUE, "module %s: no room for another hook of kind %d", mod->name, (int)kind);
    int k = mod->n_hooks[kind]++;
    mod->hooks[kind][k].fn = fn;
    mod->hooks[kind][k].ctx = ctx;
    return TS_OK;
}

void ts_module_walk(ts_module *mod, void (*fn)(ts_module *m, void *ctx), void *ctx) {
    fn(mod, ctx);
    for (int i = 0; i < mod->n_children; i++) ts_module_walk(mod->children[i], fn, ctx);
}

ts_key ts_module_dropout_key(const ts_module *mod) {
    return ts_key_fold_in(mod->model->dropout_key, (uint64_t)mod->index);
}

static ts_status run_hooks(ts_module *mod, ts_hook_kind kind, ts_tensor *t) {
    for (int k = 0; k < mod->n_hooks[kind]; k++) {
        ts_status st = mod->hooks[kind][k].fn(mod, t, mod->hooks[kind][k].ctx);
        if (st) return st;
    }
    return TS_OK;
}

/* ---- backward hooks: identity nodes that call the module's hooks ---- */

static ts_status hook_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    ts_module *mod = n->ctx;
    ts_status st = run_hooks(mod, (ts_hook_kind)n->iargs[0], g);
    if (st) return st;
    gin[0] = ts_tensor_retain(g);
    return TS_OK;
}

/* x itself, or when x carries gradient and mod has hooks of kind, an alias
 * of x whose backward runs them. */
static ts_tensor *wrap_for_hooks(ts_module *mod, ts_tensor *x, ts_hook_kind kind) {
    if (!mod->n_hooks[kind] || !ts_autograd_needed(1, &x)) return ts_tensor_retain(x);
    ts_tensor *a = ts_tensor_alias(x);
    ts_node *n = a ? ts_autograd_record(a, "backward_hook", hook_backward, 1, &x) : NULL;
    if (n) {
        n->ctx = mod;
        n->iargs[0] = kind;
    }
    return a;
}

/* ---- activation checkpointing ---- */

static ts_status checkpoint_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    ts_module *mod = n->ctx;
    ts_tensor *x = ts_tensor_alias(n->inputs[0]);
    if (!x) return ts_last_status();
    x->requires_grad = n->inputs[0]->requires_grad;
    bool prev = ts_grad_set_enabled(true);
    ts_tensor *y = mod->ops->forward(mod, x);
    ts_status st = y ? TS_OK : ts_last_status();
    if (!st && y->requires_grad) st = ts_backward(y, g);
    ts_grad_set_enabled(prev);
    if (!st && ts_node_wants(n, 0) && x->grad) gin[0] = ts_tensor_retain(x->grad);
    ts_tensor_release(y);
    ts_tensor_release(x);
    return st;
}

/* True when any parameter of mod or its children requires grad. */
static bool has_trainable(const ts_module *mod) {
    for (int i = 0; i < mod->n_params; i++)
        if (mod->model->params[mod->param0 + i].value->requires_grad) return true;
    for (int i = 0; i < mod->n_children; i++)
        if (has_trainable(mod->children[i])) return true;
    return false;
}

/* mod's forward without recording, plus one node that recomputes it. */
static ts_tensor *checkpointed_forward(ts_module *mod, ts_tensor *x) {
    bool prev = ts_grad_set_enabled(false);
    ts_tensor *y = mod->ops->forward(mod, x);
    ts_grad_set_enabled(prev);
    if (!y) return NULL;
    ts_node *n = ts_node_new("checkpoint", checkpoint_backward, 1, &x);
    if (!n) {
        ts_tensor_release(y);
        return NULL;
    }
    n->ctx = mod;
    ts_node_attach(y, n);
    return y;
}

ts_tensor *ts_module_forward(ts_module *mod, ts_tensor *x) {
    if (!x) {
        ts_error(TS_ERR_VALUE, "module %s: input is NULL", mod->name);
        return NULL;
    }
    if (run_hooks(mod, TS_HOOK_PRE_FORWARD, x)) return NULL;
    ts_tensor *in = wrap_for_hooks(mod, x, TS_HOOK_POST_BACKWARD);
    if (!in) return NULL;
    bool record = ts_grad_enabled() && (x->requires_grad || has_trainable(mod));
    ts_tensor *y = mod->checkpoint && record ? checkpointed_forward(mod, in) : mod->ops->forward(mod, in);
    ts_tensor_release(in);
    if (!y) {
        /* name the innermost failing module once */
        if (mod->name[0] && !strstr(ts_last_error(), mod->name)) {
            char inner[900];
            snprintf(inner, sizeof inner, "%s", ts_last_error());
            ts_error(ts_last_status(), "%s (%s): %s", mod->name, mod->ops->kind, inner);
        }
        return NULL;
    }
    /* with packing the nodes keep bf16 views of the weights: the f32
     * conversions of this module's own parameters can go */
    if (ts_autograd_packing()) ts_model_empty_conversions(mod->model, mod->param0, mod->n_params);
    mod->out_ndim = y->ndim;
    memcpy(mod->out_shape, y->shape, sizeof y->shape);
    if (run_hooks(mod, TS_HOOK_POST_FORWARD, y)) {
        ts_tensor_release(y);
        return NULL;
    }
    ts_tensor *out = wrap_for_hooks(mod, y, TS_HOOK_PRE_BACKWARD);
    ts_tensor_release(y);
    return out;
}

/* ---- Sequential ---- */

ts_tensor *ts_sequential_forward_range(ts_module *seq, ts_tensor *x, int first, int end) {
    ts_tensor *h = ts_tensor_retain(x);
    for (int i = first; i < end && h; i++) {
        ts_tensor *next = ts_module_forward(seq->children[i], h);
        ts_tensor_release(h);
        h = next;
    }
    return h;
}

static ts_tensor *sequential_forward(ts_module *mod, ts_tensor *x) {
    return ts_sequential_forward_range(mod, x, 0, mod->n_children);
}

static const ts_module_ops sequential_ops = {"Sequential", sequential_forward, NULL};

ts_module *ts_sequential_new(ts_model *m, const ts_module *parent, const char *name) {
    return ts_module_new(m, &sequential_ops, parent, name);
}
