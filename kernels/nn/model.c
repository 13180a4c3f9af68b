/* model.c - the parameter registry, flat buffers, init, summary. */
#include "kernels/nn/model.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/autograd.h"
#include "kernels/nn/module.h"
#include "kernels/ops/view.h"
#include "kernels/optim/mixed.h"
#include "kernels/rng.h"

ts_model *ts_model_new(void) {
    ts_model *m = calloc(1, sizeof *m);
    if (!m) {
        ts_error(TS_ERR_MEMORY, "model: out of memory");
        return NULL;
    }
    m->training = true;
    m->dtype = TS_F32;
    m->compute_dtype = TS_F32;
    m->dropout_key = ts_key_from_seed(0);
    return m;
}

static void drop_compute(ts_model *m);

/* Frees the optimizer state (a tensor on the model's device; on the CPU
 * its storage comes from the allocator, so its statistics count it). */
static void free_state(ts_model *m) {
    ts_tensor_release(m->state_buf);
    m->state_buf = NULL;
    m->state = NULL;
    m->n_state = 0;
}

void ts_model_free(ts_model *m) {
    if (!m) return;
    ts_module_free(m->root);
    drop_compute(m);
    for (int i = 0; i < m->n_params; i++) ts_tensor_release(m->params[i].value);
    free(m->params);
    ts_tensor_release(m->flat_params);
    ts_tensor_release(m->flat_grads);
    free_state(m);
    free(m);
}

int ts_model_add_param(ts_model *m, const char *name, int ndim, const int64_t *shape, ts_init init, bool decay) {
    if (m->finalized) {
        ts_error(TS_ERR_STATE, "model: cannot add parameter %s after finalize", name);
        return -1;
    }
    if (strlen(name) >= sizeof m->params[0].name) {
        ts_error(TS_ERR_VALUE, "model: parameter name %s is too long", name);
        return -1;
    }
    for (int i = 0; i < m->n_params; i++)
        if (!strcmp(m->params[i].name, name)) {
            ts_error(TS_ERR_VALUE, "model: parameter %s registered twice", name);
            return -1;
        }
    if (ndim < 1 || ndim > TS_MAX_DIMS) {
        ts_error(TS_ERR_SHAPE, "model: parameter %s has %d dims", name, ndim);
        return -1;
    }
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] <= 0) {
            ts_error(TS_ERR_SHAPE, "model: parameter %s has shape %s", name, ts_dims_str(ndim, shape));
            return -1;
        }
        numel *= shape[d];
    }
    if (m->n_params == m->cap_params) {
        int cap = m->cap_params ? 2 * m->cap_params : 32;
        ts_param *p = realloc(m->params, sizeof *p * (size_t)cap);
        if (!p) {
            ts_error(TS_ERR_MEMORY, "model: out of memory");
            return -1;
        }
        m->params = p;
        m->cap_params = cap;
    }
    ts_param *p = &m->params[m->n_params];
    memset(p, 0, sizeof *p);
    strcpy(p->name, name);
    p->ndim = ndim;
    memcpy(p->shape, shape, sizeof(int64_t) * (size_t)ndim);
    p->offset = m->numel;
    p->numel = numel;
    p->init = init;
    p->decay = decay;
    m->numel += numel;
    return m->n_params++;
}

/* Fills a parameter view according to its init rule (drawn in f32, so an
 * f64 model starts from the same values as its f32 twin). */
static ts_status init_param(ts_param *p, ts_key key) {
    float *v = malloc(sizeof(float) * (size_t)p->numel);
    if (!v) return ts_error(TS_ERR_MEMORY, "model: out of memory initialising %s", p->name);
    switch (p->init.kind) {
    case TS_INIT_ZEROS:
        for (int64_t i = 0; i < p->numel; i++) v[i] = 0.0f;
        break;
    case TS_INIT_ONES:
        for (int64_t i = 0; i < p->numel; i++) v[i] = 1.0f;
        break;
    case TS_INIT_UNIFORM:
        ts_rng_uniform_f32(key, 0, p->numel, v);
        for (int64_t i = 0; i < p->numel; i++) v[i] = (float)((2.0 * v[i] - 1.0) * p->init.a);
        break;
    case TS_INIT_NORMAL:
        ts_rng_normal_f32(key, 0, p->numel, v);
        for (int64_t i = 0; i < p->numel; i++) v[i] = (float)(v[i] * p->init.a);
        break;
    }
    /* one copy (converting to the model's dtype), not a write per element */
    ts_tensor *drawn = ts_tensor_from_data(TS_F32, p->ndim, p->shape, v);
    free(v);
    ts_status st = drawn ? ts_tensor_copy_(p->value, drawn) : ts_last_status();
    ts_tensor_release(drawn);
    return st;
}

/* A parameter's own key: key folded with a hash (FNV-1a) of its name, so
 * that a model built for a slice of the units initialises each parameter
 * exactly as the whole model does. */
static ts_key param_key(ts_key key, const char *name) { return ts_key_fold_in(key, ts_hash_text(name)); }

ts_status ts_model_finalize(ts_model *m, ts_key key) {
    if (m->finalized) return ts_error(TS_ERR_STATE, "model: finalize called twice");
    int64_t n = m->numel ? m->numel : 1;
    if (m->dtype != TS_F32 && m->dtype != TS_F64)
        return ts_error(TS_ERR_DTYPE, "model: flat buffers must be f32 or f64, not %s", ts_dtype_name(m->dtype));
    m->flat_params = ts_tensor_zeros(m->dtype, 1, &n);
    m->flat_grads = ts_tensor_zeros(m->dtype, 1, &n);
    if (!m->flat_params || !m->flat_grads) return ts_last_status();
    for (int i = 0; i < m->n_params; i++) {
        ts_param *p = &m->params[i];
        p->value = ts_tensor_from_storage(m->flat_params->storage, m->dtype, p->offset, p->ndim, p->shape, NULL);
        ts_tensor *g = ts_tensor_from_storage(m->flat_grads->storage, m->dtype, p->offset, p->ndim, p->shape, NULL);
        if (!p->value || !g) {
            ts_tensor_release(g);
            return ts_last_status();
        }
        p->value->requires_grad = true;
        p->value->grad = g;
        ts_status st = init_param(p, param_key(key, p->name));
        if (st) return st;
    }
    m->finalized = true;
    return TS_OK;
}

/* Remakes parameter p's master view and its gradient view over the
 * model's flat buffers (after they moved). */
static ts_status review_param(ts_model *m, ts_param *p) {
    ts_tensor *v = ts_tensor_from_storage(m->flat_params->storage, m->dtype, p->offset, p->ndim, p->shape, NULL);
    ts_tensor *g = ts_tensor_from_storage(m->flat_grads->storage, m->dtype, p->offset, p->ndim, p->shape, NULL);
    if (!v || !g) {
        ts_tensor_release(v);
        ts_tensor_release(g);
        return ts_last_status();
    }
    v->requires_grad = true;
    v->grad = g;
    ts_tensor_release(p->value);
    p->value = v;
    return TS_OK;
}

ts_status ts_model_to(ts_model *m, ts_device d) {
    if (!m->finalized) return ts_error(TS_ERR_STATE, "model: moved to %s before finalize", ts_device_name(d));
    if (ts_device_equal(m->device, d)) return TS_OK;
    if (m->grads_detached) /* the parameters' own gradients would stay behind */
        return ts_error(TS_ERR_STATE, "model: moved to %s after its gradients were detached", ts_device_name(d));
    ts_tensor *params = ts_tensor_to(m->flat_params, d), *grads = params ? ts_tensor_to(m->flat_grads, d) : NULL;
    ts_tensor *state = grads && m->state_buf ? ts_tensor_to(m->state_buf, d) : NULL;
    if (!grads || (m->state_buf && !state)) {
        ts_tensor_release(params);
        ts_tensor_release(grads);
        return ts_error(ts_last_status(), "model: moving %lld parameters to %s: %s", (long long)m->numel,
                        ts_device_name(d), ts_last_error());
    }
    ts_dtype compute = m->compute_dtype;
    drop_compute(m);
    ts_tensor_release(m->flat_params);
    ts_tensor_release(m->flat_grads);
    m->flat_params = params;
    m->flat_grads = grads;
    if (state) {
        ts_tensor_release(m->state_buf);
        m->state_buf = state;
        m->state = ts_f32(state);
    }
    m->device = d;
    ts_status st = TS_OK;
    for (int i = 0; !st && i < m->n_params; i++) st = review_param(m, &m->params[i]);
    if (!st && compute != TS_F32) st = ts_model_set_compute_dtype(m, compute);
    return st;
}

/* ---- bf16 compute copy ---- */

/* Releases the cached f32 tensors the forwards used. */
static void release_cached(ts_model *m) {
    for (int i = 0; i < m->n_params; i++) {
        ts_tensor_release(m->params[i].compute);
        m->params[i].compute = NULL;
    }
}

/* Frees the bf16 buffers, leaves and caches: back to f32 compute. */
static void drop_compute(ts_model *m) {
    release_cached(m);
    for (int i = 0; i < m->n_params; i++) {
        ts_tensor_release(m->params[i].value16);
        m->params[i].value16 = NULL;
        m->params[i].folded = false;
    }
    ts_tensor_release(m->flat_params16);
    ts_tensor_release(m->flat_grads16);
    m->flat_params16 = m->flat_grads16 = NULL;
    m->compute_dtype = TS_F32;
}

ts_status ts_model_set_compute_dtype(ts_model *m, ts_dtype dt) {
    if (dt != TS_F32 && dt != TS_BF16)
        return ts_error(TS_ERR_DTYPE, "model: compute dtype %s is not supported (f32 or bf16)", ts_dtype_name(dt));
    if (!m->finalized) return ts_error(TS_ERR_STATE, "model: set_compute_dtype before finalize");
    if (dt == TS_BF16 && m->dtype != TS_F32)
        return ts_error(TS_ERR_DTYPE, "model: bf16 compute needs f32 master buffers, not %s", ts_dtype_name(m->dtype));
    drop_compute(m);
    if (dt == TS_F32) return TS_OK;
    int64_t n = ts_tensor_numel(m->flat_params);
    m->flat_params16 = ts_tensor_zeros_on(m->device, TS_BF16, 1, &n);
    m->flat_grads16 = ts_tensor_zeros_on(m->device, TS_BF16, 1, &n);
    ts_status st = m->flat_params16 && m->flat_grads16 ? TS_OK : ts_last_status();
    for (int i = 0; !st && i < m->n_params; i++) {
        ts_param *p = &m->params[i];
        p->value16 = ts_tensor_from_storage(m->flat_params16->storage, TS_BF16, p->offset, p->ndim, p->shape, NULL);
        ts_tensor *g = ts_tensor_from_storage(m->flat_grads16->storage, TS_BF16, p->offset, p->ndim, p->shape, NULL);
        if (!p->value16 || !g) {
            ts_tensor_release(g);
            st = ts_last_status();
            break;
        }
        p->value16->requires_grad = true;
        p->value16->grad = g;
    }
    m->compute_dtype = TS_BF16;
    if (!st) st = ts_model_sync_compute(m);
    if (st) drop_compute(m);
    return st;
}

/* The flat-buffer kernels of the model's device (the CPU's: mixed.h's). */
static const ts_optim_kernels *flat_kernels(const ts_model *m) {
    if (m->device.type == TS_DEVICE_CPU) return ts_mixed_kernels();
    const ts_backend *b = ts_backend_of("model", m->device);
    return b ? b->optim : NULL;
}

ts_status ts_model_sync_compute(ts_model *m) {
    if (m->compute_dtype != TS_BF16) return TS_OK;
    release_cached(m); /* the values they were made from change */
    const ts_optim_kernels *k = flat_kernels(m);
    return k ? k->to_bf16(ts_f32(m->flat_params), ts_tensor_data(m->flat_params16), m->numel) : ts_last_status();
}

/* Adds scale * the bf16 gradients of parameters [a, b), one run of the
 * flat buffers, into their f32 master gradients with the device's flat
 * kernels k, and zeros them. */
static ts_status fold_flat(ts_model *m, const ts_optim_kernels *k, int a, int b, float scale) {
    int64_t off = m->params[a].offset, n = m->params[b - 1].offset + m->params[b - 1].numel - off;
    ts_status st = k->accumulate(ts_f32(m->flat_grads) + off, (const uint16_t *)ts_tensor_data(m->flat_grads16) + off,
                                 TS_BF16, n, scale);
    ts_tensor *g16 = st ? NULL : ts_tensor_from_storage(m->flat_grads16->storage, TS_BF16, off, 1, &n, NULL);
    if (!st && !g16) st = ts_last_status();
    if (!st) st = ts_tensor_fill_(g16, 0);
    ts_tensor_release(g16);
    return st;
}

/* Detached gradients: adds scale * parameter p's bf16 gradient, when it
 * has one, into its f32 one (made zeroed on the model's device when
 * missing) with the device's flat kernels k, and releases the bf16 one. */
static ts_status fold_own(ts_model *m, const ts_optim_kernels *k, ts_param *p, float scale) {
    ts_tensor *g16 = p->value16->grad;
    if (!g16) return TS_OK;
    if (!p->value->grad && !(p->value->grad = ts_tensor_zeros_on(m->device, TS_F32, p->ndim, p->shape)))
        return ts_last_status();
    ts_status st = k->accumulate(ts_f32(p->value->grad), ts_tensor_data(g16), TS_BF16, p->numel, scale);
    if (st) return st;
    ts_tensor_release(g16);
    p->value16->grad = NULL;
    return TS_OK;
}

ts_status ts_model_fold_param_grad(ts_model *m, int i, float scale) {
    if (m->compute_dtype != TS_BF16 || m->params[i].folded) return TS_OK;
    const ts_optim_kernels *k = flat_kernels(m);
    if (!k) return ts_last_status();
    ts_status st = m->grads_detached ? fold_own(m, k, &m->params[i], scale) : fold_flat(m, k, i, i + 1, scale);
    if (!st) m->params[i].folded = true;
    return st;
}

ts_status ts_model_fold_compute_grads(ts_model *m, float scale) {
    if (m->compute_dtype != TS_BF16) return TS_OK;
    release_cached(m); /* their graphs were used by the backward */
    const ts_optim_kernels *k = flat_kernels(m);
    if (!k) return ts_last_status();
    /* the parameters not folded during the backward, each run of them in
     * the flat buffers at once (when none was: the whole buffers) */
    ts_status st = TS_OK;
    for (int i = 0, end; i < m->n_params; i = end) {
        end = i + 1;
        if (m->params[i].folded) {
            m->params[i].folded = false;
            continue;
        }
        if (m->grads_detached) {
            if (!st) st = fold_own(m, k, &m->params[i], scale);
            continue;
        }
        while (end < m->n_params && !m->params[end].folded) end++;
        if (!st) st = fold_flat(m, k, i, end, scale);
    }
    return st;
}

/* Gives cached conversion c (emptied by ts_model_empty_conversions) the f32
 * values of p's bf16 copy again in a new storage, keeping c's history (the
 * same conversion node), so every use of a parameter in one forward (a
 * tied weight) goes through one node and its gradient is rounded to bf16
 * once. */
static ts_status refill(const ts_param *p, ts_tensor *c) {
    ts_tensor *f = ts_tensor_copy_as(p->value16, TS_F32);
    if (!f) return ts_last_status();
    c->storage = f->storage;
    ts_storage_retain(c->storage);
    ts_tensor_release(f);
    return TS_OK;
}

ts_tensor *ts_model_param(const ts_model *m, int i) {
    ts_param *p = &m->params[i];
    if (m->compute_dtype != TS_BF16) return p->value;
    /* a cached conversion serves the forward it was made in, until a
     * backward consumed its graph; one made without gradients does not
     * serve a forward that records */
    ts_tensor *c = p->compute;
    bool stale = c && ts_grad_enabled() &&
                 (!c->grad_fn || c->grad_fn->freed || p->compute_forward != m->forwards);
    if (!c || stale) {
        c = ts_to_dtype(p->value16, TS_F32);
        if (!c) return NULL;
        ts_tensor_release(p->compute);
        p->compute = c;
        p->compute_forward = m->forwards;
    } else if (!c->storage && refill(p, c)) {
        return NULL;
    }
    ts_autograd_pack_as(c, p->value16); /* nodes keep bf16 views, not the f32 copy */
    return c;
}

ts_tensor *ts_model_grad_leaf(const ts_model *m, int i) {
    return m->compute_dtype == TS_BF16 ? m->params[i].value16 : m->params[i].value;
}

int ts_model_find(const ts_model *m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (!strcmp(m->params[i].name, name)) return i;
    ts_error(TS_ERR_VALUE, "model: no parameter named %s", name);
    return -1;
}

/* Releases every parameter's own gradients (detached gradients). */
static void release_leaf_grads(ts_model *m) {
    for (int i = 0; i < m->n_params; i++) {
        ts_param *p = &m->params[i];
        ts_tensor_release(p->value->grad);
        p->value->grad = NULL;
        if (p->value16) {
            ts_tensor_release(p->value16->grad);
            p->value16->grad = NULL;
        }
    }
}

void ts_model_zero_grad(ts_model *m) {
    for (int i = 0; i < m->n_params; i++) m->params[i].folded = false;
    if (m->grads_detached) {
        release_leaf_grads(m);
        return;
    }
    if (m->flat_grads) ts_tensor_fill_(m->flat_grads, 0);
    if (m->flat_grads16) ts_tensor_fill_(m->flat_grads16, 0);
}

void ts_model_detach_grads(ts_model *m) {
    m->grads_detached = true;
    release_leaf_grads(m);
}

ts_status ts_model_alloc_state(ts_model *m, int k) {
    free_state(m);
    if (k <= 0) return TS_OK;
    int64_t n = (int64_t)k * m->numel;
    m->state_buf = ts_tensor_zeros_on(m->device, TS_F32, 1, &n);
    if (!m->state_buf)
        return ts_error(ts_last_status(), "model: %d x %lld optimizer state on %s: %s", k, (long long)m->numel,
                        ts_device_name(m->device), ts_last_error());
    m->state = ts_f32(m->state_buf);
    m->n_state = k;
    return TS_OK;
}

ts_tensor *ts_model_state_tensor(ts_model *m) {
    if (!m->state) {
        ts_error(TS_ERR_STATE, "model: no optimizer state allocated");
        return NULL;
    }
    return ts_tensor_from_storage(m->state_buf->storage, TS_F32, 0, 2, (int64_t[]){m->n_state, m->numel}, NULL);
}

void ts_model_train(ts_model *m, bool on) { m->training = on; }

/* The root on x (end < 0), or its children [first, end). */
static ts_tensor *forward(ts_model *m, ts_tensor *x, int first, int end) {
    if (!m->finalized || !m->root) {
        ts_error(TS_ERR_STATE, "model: forward before the model was built and finalized");
        return NULL;
    }
    /* bf16 compute keeps what backward needs in bf16: activations as
     * copies, weights as views of the bf16 parameter copy (each module
     * empties its weights' f32 conversions when its forward is done; this
     * catches the weights used outside their module, like a tied head) */
    bool pack = m->compute_dtype == TS_BF16 && ts_grad_enabled();
    if (pack) m->forwards++;
    bool prev = pack && ts_autograd_set_pack_bf16(true);
    ts_tensor *y = end < 0 ? ts_module_forward(m->root, x) : ts_sequential_forward_range(m->root, x, first, end);
    if (!pack) return y;
    ts_autograd_set_pack_bf16(prev);
    ts_model_empty_conversions(m, 0, m->n_params);
    return y;
}

ts_tensor *ts_model_forward(ts_model *m, ts_tensor *x) { return forward(m, x, 0, -1); }

ts_tensor *ts_model_forward_units(ts_model *m, ts_tensor *x, int first, int end) {
    if (m->root && (first < 0 || first >= end || end > m->root->n_children)) {
        ts_error(TS_ERR_INDEX, "model: units [%d, %d) of a model of %d", first, end, m->root->n_children);
        return NULL;
    }
    return forward(m, x, first, end);
}

void ts_model_empty_conversions(ts_model *m, int first, int n) {
    for (int i = first; i < first + n && i < m->n_params; i++) {
        ts_tensor *c = m->params[i].compute;
        if (!c || !c->storage) continue;
        /* the cache gets an empty tensor with c's shape and history; c
         * itself stays whole for any node still holding it */
        ts_tensor *e = ts_autograd_meta(c);
        if (!e) continue;
        m->params[i].compute = e;
        ts_tensor_release(c);
    }
}

ts_status ts_model_copy_params(ts_model *dst, const ts_model *src, int *n_copied) {
    int copied = 0;
    for (int i = 0; i < dst->n_params; i++) {
        const ts_param *d = &dst->params[i];
        for (int j = 0; j < src->n_params; j++) {
            const ts_param *s = &src->params[j];
            if (strcmp(d->name, s->name)) continue;
            if (d->numel != s->numel || d->ndim != s->ndim || memcmp(d->shape, s->shape, sizeof(int64_t) * (size_t)d->ndim))
                return ts_error(TS_ERR_SHAPE, "model: parameter %s is %s here but %s in the source", d->name,
                                ts_dims_str(d->ndim, d->shape), ts_dims_str(s->ndim, s->shape));
            ts_status st = ts_tensor_copy_(d->value, s->value);
            if (st) return st;
            copied++;
        }
    }
    if (n_copied) *n_copied = copied;
    return ts_model_sync_compute(dst);
}

/* ---- summary ---- */

typedef struct {
    FILE *f;
    const ts_model *model;
} summary_ctx;

static void summary_row(ts_module *mod, void *vctx) {
    summary_ctx *c = vctx;
    int64_t count = 0;
    for (int i = 0; i < mod->n_params; i++) count += c->model->params[mod->param0 + i].numel;
    int depth = 0;
    for (const char *s = mod->name; *s; s++) depth += *s == '.';
    char label[160];
    snprintf(label, sizeof label, "%*s%s%s(%s)", 2 * depth, "", mod->name, mod->name[0] ? " " : "", mod->ops->kind);
    fprintf(c->f, "%-48s %-22s %12lld\n", label, mod->out_ndim ? ts_dims_str(mod->out_ndim, mod->out_shape) : "-",
            (long long)count);
}

ts_status ts_model_summary(ts_model *m, FILE *f, ts_dtype in_dtype, int in_ndim, const int64_t *in_shape) {
    ts_tensor *x = ts_tensor_zeros_on(m->device, in_dtype, in_ndim, in_shape);
    if (!x) return ts_last_status();
    bool prev = ts_grad_set_enabled(false);
    ts_tensor *y = ts_model_forward(m, x);
    ts_grad_set_enabled(prev);
    ts_tensor_release(x);
    if (!y) return ts_last_status();
    ts_tensor_release(y);
    fprintf(f, "%-48s %-22s %12s\n", "Module (kind)", "Output shape", "Params");
    fprintf(f, "%.*s\n", 84, "------------------------------------------------------------------------------------------");
    summary_ctx c = {f, m};
    ts_module_walk(m->root, summary_row, &c);
    int64_t decay = 0;
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i].decay) decay += m->params[i].numel;
    fprintf(f, "%.*s\n", 84, "------------------------------------------------------------------------------------------");
    fprintf(f, "Total params: %lld (%.2f MiB as f32) in %d tensors\n", (long long)m->numel,
            (double)m->numel * 4 / (1 << 20), m->n_params);
    fprintf(f, "Trainable params: %lld, with weight decay: %lld\n", (long long)m->numel, (long long)decay);
    fprintf(f, "Gradient buffer: %.2f MiB; optimizer state: %.2f MiB\n", (double)m->numel * 4 / (1 << 20),
            (double)m->numel * 4 * m->n_state / (1 << 20));
    if (m->compute_dtype == TS_BF16)
        fprintf(f, "bf16 compute copy: %.2f MiB parameters + %.2f MiB gradients\n", (double)m->numel * 2 / (1 << 20),
                (double)m->numel * 2 / (1 << 20));
    return TS_OK;
}
