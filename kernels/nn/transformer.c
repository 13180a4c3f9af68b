/* transformer.c - attention, block, GPT embedding and head modules. */
#include "kernels/nn/transformer.h"

#include <math.h>
#include <string.h>

#include "kernels/nn/layers.h"
#include "kernels/ops/attention.h"
#include "kernels/ops/elementwise.h"
#include "kernels/ops/embedding.h"
#include "kernels/ops/matmul.h"
#include "kernels/ops/norm.h"
#include "kernels/ops/select.h"
#include "kernels/ops/view.h"

ts_status ts_gpt_config_check(const ts_gpt_config *c) {
    if (c->vocab <= 0 || c->block_size <= 0 || c->n_layer <= 0 || c->n_head <= 0 || c->n_embd <= 0)
        return ts_error(TS_ERR_VALUE, "gpt: vocab %lld, block_size %lld, n_layer %lld, n_head %lld, n_embd %lld must be positive",
                        (long long)c->vocab, (long long)c->block_size, (long long)c->n_layer, (long long)c->n_head,
                        (long long)c->n_embd);
    if (c->n_embd % c->n_head)
        return ts_error(TS_ERR_VALUE, "gpt: n_embd %lld is not divisible by n_head %lld", (long long)c->n_embd,
                        (long long)c->n_head);
    if (!(c->dropout >= 0 && c->dropout < 1))
        return ts_error(TS_ERR_VALUE, "gpt: dropout %g is outside [0, 1)", c->dropout);
    return TS_OK;
}

/* Releases n tensors. */
static void release_all(int n, ts_tensor **t) {
    for (int i = 0; i < n; i++) ts_tensor_release(t[i]);
}

/* ---- attention ---- */

static ts_tensor *attention_forward(ts_module *mod, ts_tensor *x) {
    if (x->ndim != 3) {
        ts_error(TS_ERR_SHAPE, "attention %s: input %s is not [B, T, C]", mod->name, ts_shape_str(x));
        return NULL;
    }
    ts_tensor *qkv = ts_module_forward(mod->children[0], x);                          /* [B, T, 3C] */
    ts_tensor *h = qkv ? ts_attention_qkv(qkv, mod->iargs[0], true, 0.0) : NULL;      /* [B, T, C] */
    ts_tensor *y = h ? ts_module_forward(mod->children[1], h) : NULL;                 /* proj */
    ts_tensor *out = y ? ts_module_forward(mod->children[2], y) : NULL;               /* dropout */
    ts_tensor_release(qkv);
    ts_tensor_release(h);
    ts_tensor_release(y);
    return out;
}

static const ts_module_ops attention_ops = {"CausalSelfAttention", attention_forward, NULL};

/* GPT-2's normal(0, 0.02) init, and the residual projection's scaled one. */
static ts_init gpt_init(void) { return (ts_init){TS_INIT_NORMAL, 0.02}; }

static ts_init residual_init(const ts_gpt_config *c) {
    return (ts_init){TS_INIT_NORMAL, 0.02 / sqrt(2.0 * (double)c->n_layer)};
}

/* Adds child to mod; false (and mod freed) on failure. */
static bool adopt(ts_module **mod, ts_module *child) {
    if (!*mod) {
        ts_module_free(child);
        return false;
    }
    if (ts_module_add_child(*mod, child)) {
        ts_module_free(*mod);
        *mod = NULL;
        return false;
    }
    return true;
}

ts_module *ts_attention_new(ts_model *m, const ts_module *parent, const char *name, const ts_gpt_config *c) {
    ts_module *mod = ts_module_new(m, &attention_ops, parent, name);
    if (!mod) return NULL;
    mod->iargs[0] = c->n_head;
    ts_init w = gpt_init(), r = residual_init(c);
    if (adopt(&mod, ts_linear_new(m, mod, "qkv", c->n_embd, 3 * c->n_embd, true, &w)) &&
        adopt(&mod, ts_linear_new(m, mod, "proj", c->n_embd, c->n_embd, true, &r)))
        adopt(&mod, ts_dropout_new(m, mod, "drop", c->dropout));
    return mod;
}

/* ---- block ---- */

/* x + f(ln(x)), where ln and f are children i and i + 1 of mod. */
static ts_tensor *prenorm_residual(ts_module *mod, int i, ts_tensor *x) {
    ts_tensor *n = ts_module_forward(mod->children[i], x);
    ts_tensor *f = n ? ts_module_forward(mod->children[i + 1], n) : NULL;
    ts_tensor *r = f ? ts_add(x, f) : NULL;
    ts_tensor_release(n);
    ts_tensor_release(f);
    return r;
}

/* children: ln1, attn, ln2, mlp */
static ts_tensor *block_forward(ts_module *mod, ts_tensor *x) {
    ts_tensor *h = prenorm_residual(mod, 0, x);
    ts_tensor *out = h ? prenorm_residual(mod, 2, h) : NULL;
    ts_tensor_release(h);
    return out;
}

static const ts_module_ops block_ops = {"Block", block_forward, NULL};

ts_module *ts_block_new(ts_model *m, const ts_module *parent, const char *name, const ts_gpt_config *c) {
    ts_module *mod = ts_module_new(m, &block_ops, parent, name);
    if (!mod) return NULL;
    ts_init w = gpt_init(), r = residual_init(c);
    ts_module *mlp = NULL;
    if (adopt(&mod, ts_layernorm_new(m, mod, "ln1", c->n_embd, 1e-5)) &&
        adopt(&mod, ts_attention_new(m, mod, "attn", c)) &&
        adopt(&mod, ts_layernorm_new(m, mod, "ln2", c->n_embd, 1e-5))) {
        mlp = ts_sequential_new(m, mod, "mlp");
        if (adopt(&mlp, ts_linear_new(m, mlp, "fc", c->n_embd, 4 * c->n_embd, true, &w)) &&
            adopt(&mlp, ts_gelu_new(m, mlp, "gelu")) &&
            adopt(&mlp, ts_linear_new(m, mlp, "proj", 4 * c->n_embd, c->n_embd, true, &r)))
            adopt(&mlp, ts_dropout_new(m, mlp, "drop", c->dropout));
        adopt(&mod, mlp);
    }
    return mod;
}

/* ---- embedding and head ---- */

/* own params: wte.weight [V, C], wpe.weight [block_size, C]; child: dropout */
static ts_tensor *gpt_embed_forward(ts_module *mod, ts_tensor *idx) {
    ts_tensor *wte = ts_module_weight(mod, 0), *wpe = ts_module_weight(mod, 1);
    if (idx->ndim != 2) {
        ts_error(TS_ERR_SHAPE, "gpt: token ids %s are not [B, T]", ts_shape_str(idx));
        return NULL;
    }
    int64_t T = idx->shape[1];
    if (T > wpe->shape[0]) {
        ts_error(TS_ERR_SHAPE, "gpt: sequence length %lld exceeds block_size %lld", (long long)T,
                 (long long)wpe->shape[0]);
        return NULL;
    }
    ts_tensor *tok = ts_embedding(wte, idx);
    ts_tensor *pos = tok ? ts_narrow(wpe, 0, 0, T) : NULL;
    ts_tensor *x = pos ? ts_add(tok, pos) : NULL;
    ts_tensor *out = x ? ts_module_forward(mod->children[0], x) : NULL;
    ts_tensor *t[] = {tok, pos, x};
    release_all(3, t);
    return out;
}

static const ts_module_ops gpt_embed_ops = {"GPTEmbedding", gpt_embed_forward, NULL};

ts_module *ts_gpt_embed_new(ts_model *m, const ts_module *parent, const ts_gpt_config *c) {
    ts_module *mod = ts_module_new(m, &gpt_embed_ops, parent, "");
    if (!mod) return NULL;
    ts_init w = gpt_init();
    if (ts_module_param(mod, "wte.weight", 2, (int64_t[]){c->vocab, c->n_embd}, w, true) < 0 ||
        ts_module_param(mod, "wpe.weight", 2, (int64_t[]){c->block_size, c->n_embd}, w, true) < 0) {
        ts_module_free(mod);
        return NULL;
    }
    adopt(&mod, ts_dropout_new(m, mod, "drop", c->dropout));
    return mod;
}

/* own params: [wte.weight when not shared,] ln_f.weight, ln_f.bias;
 * iargs[0] = model index of wte.weight, iargs[1] = index of ln_f.weight */
static ts_tensor *gpt_head_forward(ts_module *mod, ts_tensor *x) {
    ts_model *m = mod->model;
    ts_tensor *wte = ts_model_param(m, (int)mod->iargs[0]);
    ts_tensor *lnw = ts_model_param(m, (int)mod->iargs[1]), *lnb = ts_model_param(m, (int)mod->iargs[1] + 1);
    if (x->ndim != 3) {
        ts_error(TS_ERR_SHAPE, "gpt head: input %s is not [B, T, C]", ts_shape_str(x));
        return NULL;
    }
    ts_tensor *h = ts_layernorm(x, lnw, lnb, 1e-5);
    ts_tensor *out = h ? ts_linear(h, wte, NULL) : NULL; /* [B, T, V] */
    ts_tensor_release(h);
    return out;
}

static const ts_module_ops gpt_head_ops = {"GPTHead", gpt_head_forward, NULL};

ts_module *ts_gpt_head_new(ts_model *m, const ts_module *parent, const ts_gpt_config *c) {
    ts_module *mod = ts_module_new(m, &gpt_head_ops, parent, "");
    if (!mod) return NULL;
    int wte = -1;
    for (int i = 0; i < m->n_params; i++)
        if (!strcmp(m->params[i].name, "wte.weight")) wte = i;
    if (wte < 0) wte = ts_module_param(mod, "wte.weight", 2, (int64_t[]){c->vocab, c->n_embd}, gpt_init(), true);
    int lnw = ts_module_param(mod, "ln_f.weight", 1, &c->n_embd, (ts_init){TS_INIT_ONES, 0}, false);
    int lnb = ts_module_param(mod, "ln_f.bias", 1, &c->n_embd, (ts_init){TS_INIT_ZEROS, 0}, false);
    if (wte < 0 || lnw < 0 || lnb < 0) {
        ts_module_free(mod);
        return NULL;
    }
    mod->iargs[0] = wte;
    mod->iargs[1] = lnw;
    return mod;
}
