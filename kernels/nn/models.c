/* models.c - MLP, CNN and GPT built unit by unit; splitting; the memory
 * estimate of training one. */
#include "kernels/nn/models.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/nn/layers.h"
#include "kernels/nn/module.h"

int ts_model_units(const ts_model_spec *s) {
    switch (s->arch) {
    case TS_ARCH_MLP:
        if (s->n_widths < 2 || s->n_widths > 16) {
            ts_error(TS_ERR_VALUE, "mlp: %d widths given, need 2..16 (inputs, hidden..., outputs)", s->n_widths);
            return -1;
        }
        for (int i = 0; i < s->n_widths; i++)
            if (s->widths[i] <= 0) {
                ts_error(TS_ERR_VALUE, "mlp: width %d is %lld", i, (long long)s->widths[i]);
                return -1;
            }
        return 2 * (s->n_widths - 1) - 1; /* fc, relu pairs; no relu after the last */
    case TS_ARCH_CNN:
        if (s->in_ch <= 0 || s->img <= 0 || s->img % 4 || s->ch1 <= 0 || s->ch2 <= 0 || s->kernel <= 0 ||
            s->kernel % 2 == 0 || s->classes <= 0) {
            ts_error(TS_ERR_VALUE, "cnn: in_ch %lld, img %lld (multiple of 4), ch1 %lld, ch2 %lld, kernel %lld (odd), classes %lld",
                     (long long)s->in_ch, (long long)s->img, (long long)s->ch1, (long long)s->ch2,
                     (long long)s->kernel, (long long)s->classes);
            return -1;
        }
        return 8;
    case TS_ARCH_GPT:
        if (ts_gpt_config_check(&s->gpt)) return -1;
        return (int)s->gpt.n_layer + 2;
    }
    ts_error(TS_ERR_VALUE, "model: unknown architecture %d", (int)s->arch);
    return -1;
}

bool ts_unit_runs_all(const ts_unit_runs *runs, const ts_model_spec *s) {
    return runs->n == 1 && runs->first[0] == 0 && runs->end[0] == ts_model_units(s);
}

/* Unit u of an MLP: fc<u/2> for even u, relu<u/2> for odd. */
static ts_module *mlp_unit(ts_model *m, const ts_module *root, const ts_model_spec *s, int u) {
    char name[32];
    snprintf(name, sizeof name, "%s%d", u % 2 ? "relu" : "fc", u / 2);
    if (u % 2) return ts_relu_new(m, root, name);
    return ts_linear_new(m, root, name, s->widths[u / 2], s->widths[u / 2 + 1], true, NULL);
}

static ts_module *cnn_unit(ts_model *m, const ts_module *root, const ts_model_spec *s, int u) {
    int64_t pad = s->kernel / 2, flat = s->ch2 * (s->img / 4) * (s->img / 4);
    switch (u) {
    case 0: return ts_conv2d_new(m, root, "conv1", s->in_ch, s->ch1, s->kernel, 1, pad);
    case 1: return ts_relu_new(m, root, "relu1");
    case 2: return ts_maxpool2d_new(m, root, "pool1", 2, 2);
    case 3: return ts_conv2d_new(m, root, "conv2", s->ch1, s->ch2, s->kernel, 1, pad);
    case 4: return ts_relu_new(m, root, "relu2");
    case 5: return ts_maxpool2d_new(m, root, "pool2", 2, 2);
    case 6: return ts_flatten_new(m, root, "flatten");
    default: return ts_linear_new(m, root, "fc", flat, s->classes, true, NULL);
    }
}

static ts_module *gpt_unit(ts_model *m, const ts_module *root, const ts_model_spec *s, int u) {
    if (u == 0) return ts_gpt_embed_new(m, root, &s->gpt);
    if (u == s->gpt.n_layer + 1) return ts_gpt_head_new(m, root, &s->gpt);
    char name[32];
    snprintf(name, sizeof name, "blocks.%d", u - 1);
    ts_module *b = ts_block_new(m, root, name, &s->gpt);
    if (b) b->checkpoint = s->checkpoint;
    return b;
}

/* Unit u of spec s, a child of m's root. */
static ts_module *unit_new(ts_model *m, const ts_model_spec *s, int u) {
    return s->arch == TS_ARCH_MLP   ? mlp_unit(m, m->root, s, u)
           : s->arch == TS_ARCH_CNN ? cnn_unit(m, m->root, s, u)
                                    : gpt_unit(m, m->root, s, u);
}

/* Counts the modules unit u has in the whole model into m's, without
 * building it into m (*skip: a scratch model whose parameters are never
 * allocated), so that the units m does build get the module indices - and
 * so the dropout keys - they have in the whole model. */
static ts_status skip_unit(ts_model *m, ts_model **skip, const ts_model_spec *s, int u) {
    if (!*skip && (!(*skip = ts_model_new()) || !((*skip)->root = ts_sequential_new(*skip, NULL, ""))))
        return ts_last_status();
    int before = (*skip)->n_modules;
    ts_status st = ts_module_add_child((*skip)->root, unit_new(*skip, s, u));
    m->n_modules += (*skip)->n_modules - before;
    return st;
}

ts_model *ts_model_build(const ts_model_spec *s, int first, int end, ts_key key, ts_dtype dtype) {
    ts_unit_runs one = {.n = 1, .first = {first}, .end = {end}};
    if (end < 0 && (one.end[0] = ts_model_units(s)) < 0) return NULL;
    return ts_model_build_runs(s, &one, key, dtype);
}

ts_model *ts_model_build_runs(const ts_model_spec *s, const ts_unit_runs *runs, ts_key key, ts_dtype dtype) {
    int units = ts_model_units(s);
    if (units < 0) return NULL;
    if (runs->n < 1 || runs->n > TS_MAX_UNIT_RUNS) {
        ts_error(TS_ERR_VALUE, "model: %d runs of units (1 to %d)", runs->n, TS_MAX_UNIT_RUNS);
        return NULL;
    }
    for (int i = 0; i < runs->n; i++) {
        int first = runs->first[i], end = runs->end[i], after = i ? runs->end[i - 1] : 0;
        if (first < after || first >= end || end > units) {
            ts_error(TS_ERR_VALUE, "model: unit range [%d, %d) is not inside [%d, %d)", first, end, after, units);
            return NULL;
        }
    }
    ts_model *m = ts_model_new();
    if (!m) return NULL;
    m->dtype = dtype;
    m->root = ts_sequential_new(m, NULL, "");
    ts_status st = m->root ? TS_OK : ts_last_status();
    ts_model *skip = NULL;
    for (int i = 0, next = 0; !st && i < runs->n; next = runs->end[i++]) {
        for (int u = next; !st && u < runs->first[i]; u++) st = skip_unit(m, &skip, s, u);
        for (int u = runs->first[i]; !st && u < runs->end[i]; u++) st = ts_module_add_child(m->root, unit_new(m, s, u));
    }
    ts_model_free(skip);
    if (!st) st = ts_model_finalize(m, key);
    if (st) {
        ts_model_free(m);
        return NULL;
    }
    return m;
}

ts_status ts_model_split(const ts_model *whole, const ts_model_spec *s, int n, const int *boundaries,
                         ts_model **parts) {
    int units = ts_model_units(s);
    if (units < 0) return ts_last_status();
    if (whole->root->n_children != units)
        return ts_error(TS_ERR_VALUE, "split: the model has %d units but its spec has %d", whole->root->n_children, units);
    if (n < 1 || n > units)
        return ts_error(TS_ERR_VALUE, "split: %d parts for a model of %d units", n, units);
    for (int i = 0; i < n - 1; i++)
        if (boundaries[i] <= (i ? boundaries[i - 1] : 0) || boundaries[i] >= units)
            return ts_error(TS_ERR_VALUE, "split: boundary %d (= %d) must be increasing and inside (0, %d)", i,
                            boundaries[i], units);
    for (int i = 0; i < n; i++) parts[i] = NULL;
    for (int i = 0; i < n; i++) {
        int first = i ? boundaries[i - 1] : 0, end = i < n - 1 ? boundaries[i] : units;
        parts[i] = ts_model_build(s, first, end, ts_key_from_seed(0), whole->dtype);
        ts_status st = parts[i] ? ts_model_copy_params(parts[i], whole, NULL) : ts_last_status();
        if (st) {
            for (int j = 0; j <= i; j++) {
                ts_model_free(parts[j]);
                parts[j] = NULL;
            }
            return st;
        }
    }
    return TS_OK;
}

/* ---- memory estimate: parameters and saved activations per sample ---- */

/* fc_i: w_i x w_i+1 weights + biases; each fc and relu output is kept. */
static void mlp_size(const ts_model_spec *s, double *params, double *saved) {
    *saved = (double)s->widths[0];
    for (int i = 0; i + 1 < s->n_widths; i++) {
        double in = (double)s->widths[i], out = (double)s->widths[i + 1];
        *params += in * out + out;
        *saved += 2 * out;
    }
}

/* conv1, relu1, pool1, conv2, relu2, pool2, flatten, fc; the im2col columns
 * of the larger conv for one image on top. */
static void cnn_size(const ts_model_spec *s, double *params, double *saved, double *workspace) {
    double k2 = (double)(s->kernel * s->kernel), hw = (double)(s->img * s->img);
    double c1 = (double)s->ch1, c2 = (double)s->ch2, flat = c2 * hw / 16;
    *params += c1 * (double)s->in_ch * k2 + c1 + c2 * c1 * k2 + c2 + flat * (double)s->classes + (double)s->classes;
    *saved = (double)s->in_ch * hw + 2 * c1 * hw + c1 * hw / 4 + 2 * c2 * hw / 4 + 2 * flat + (double)s->classes;
    double cols1 = (double)s->in_ch * k2 * hw, cols2 = c1 * k2 * hw / 4;
    *workspace = cols1 > cols2 ? cols1 : cols2;
}

/* Embedding V x C + T x C, per block 12 C^2 + 13 C, ln_f 2 C (the head is
 * tied to the embedding). Saved per token: each block's 17 C of outputs
 * and 2 H T of attention probabilities (only its C input when blocks are
 * checkpointed, plus one block in full), the embedding, and the logits. */
static void gpt_size(const ts_model_spec *s, double *params, double *saved) {
    const ts_gpt_config *g = &s->gpt;
    double C = (double)g->n_embd, T = (double)g->block_size, L = (double)g->n_layer, V = (double)g->vocab;
    *params += V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;
    double block = 17 * C + 2 * (double)g->n_head * T;
    double blocks = s->checkpoint ? L * C + block : L * block;
    *saved = T * (C + blocks + 2 * V);
}

ts_status ts_model_estimate(const ts_model_spec *s, int64_t b, int optim_slots, bool bf16, ts_model_memory *out) {
    memset(out, 0, sizeof *out);
    if (ts_model_units(s) < 0) return ts_last_status();
    if (b < 1 || optim_slots < 0)
        return ts_error(TS_ERR_VALUE, "model estimate: batch %lld and %d optimizer slots are invalid", (long long)b,
                        optim_slots);
    double p = 0, saved = 0, workspace = 0;
    if (s->arch == TS_ARCH_MLP) mlp_size(s, &p, &saved);
    else if (s->arch == TS_ARCH_CNN) cnn_size(s, &p, &saved, &workspace);
    else gpt_size(s, &p, &saved);
    out->parameters = p;
    out->param_bytes = 4 * p + (bf16 ? 2 * p : 0);
    out->grad_bytes = 4 * p;
    out->optim_bytes = 4 * p * optim_slots;
    out->activation_bytes = 4 * (2 * saved * (double)b + workspace);
    out->total_bytes = out->param_bytes + out->grad_bytes + out->optim_bytes + out->activation_bytes;
    return TS_OK;
}

int ts_model_input_shape(const ts_model_spec *s, int64_t b, int64_t *shape, ts_dtype *dtype) {
    switch (s->arch) {
    case TS_ARCH_MLP:
        shape[0] = b;
        shape[1] = s->widths[0];
        *dtype = TS_F32;
        return 2;
    case TS_ARCH_CNN:
        shape[0] = b;
        shape[1] = s->in_ch;
        shape[2] = shape[3] = s->img;
        *dtype = TS_F32;
        return 4;
    default:
        shape[0] = b;
        shape[1] = s->gpt.block_size;
        *dtype = TS_I64;
        return 2;
    }
}
