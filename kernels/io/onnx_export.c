/* onnx_export.c - an MLP, CNN or GPT as an ONNX graph (protobuf-c). */
#include "kernels/io/onnx.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/io/atomic.h"

#if TESSERA_WITH_ONNX
#include "onnx/onnx.pb-c.h"

bool ts_onnx_available(void) { return true; }

/* ---- the graph builder: everything it allocates is freed together ---- */

typedef struct {
    void **allocs; /* every allocation, freed by builder_free */
    int n_allocs, cap_allocs;
    Onnx__NodeProto **nodes;
    int n_nodes, cap_nodes;
    Onnx__TensorProto **inits;
    int n_inits, cap_inits;
    int counter;   /* for unique value names */
    ts_status st;  /* first failure; later calls do nothing */
} builder;

/* Grows the array *v of *cap elements of size sz to hold n + 1. */
static bool grow(builder *b, void **v, int *cap, int n, size_t sz) {
    if (n < *cap) return true;
    int nc = *cap ? 2 * *cap : 64;
    void *p = realloc(*v, (size_t)nc * sz);
    if (!p) {
        b->st = ts_error(TS_ERR_MEMORY, "onnx export: out of memory");
        return false;
    }
    *v = p;
    *cap = nc;
    return true;
}

/* Zeroed memory owned by the builder, or NULL (b->st set). */
static void *balloc(builder *b, size_t n) {
    if (b->st || !grow(b, (void **)&b->allocs, &b->cap_allocs, b->n_allocs, sizeof(void *))) return NULL;
    void *p = calloc(1, n ? n : 1);
    if (!p) {
        b->st = ts_error(TS_ERR_MEMORY, "onnx export: out of memory");
        return NULL;
    }
    return b->allocs[b->n_allocs++] = p;
}

/* A formatted string owned by the builder. */
static char *bstr(builder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static char *bstr(builder *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = balloc(b, (size_t)n + 1);
    if (s) {
        va_start(ap, fmt);
        vsnprintf(s, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    return s;
}

static void builder_free(builder *b) {
    for (int i = 0; i < b->n_allocs; i++) free(b->allocs[i]);
    free(b->allocs);
    free(b->nodes);
    free(b->inits);
}

/* ---- attributes ---- */

static Onnx__AttributeProto *attr_new(builder *b, const char *name, Onnx__AttributeProto__AttributeType type) {
    Onnx__AttributeProto *a = balloc(b, sizeof *a);
    if (!a) return NULL;
    onnx__attribute_proto__init(a);
    a->name = bstr(b, "%s", name);
    a->has_type = 1;
    a->type = type;
    return a;
}

static Onnx__AttributeProto *attr_int(builder *b, const char *name, int64_t v) {
    Onnx__AttributeProto *a = attr_new(b, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT);
    if (a) a->has_i = 1, a->i = v;
    return a;
}

static Onnx__AttributeProto *attr_float(builder *b, const char *name, float v) {
    Onnx__AttributeProto *a = attr_new(b, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT);
    if (a) a->has_f = 1, a->f = v;
    return a;
}

/* n integers v[]. */
static Onnx__AttributeProto *attr_ints(builder *b, const char *name, int n, const int64_t *v) {
    Onnx__AttributeProto *a = attr_new(b, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS);
    int64_t *copy = balloc(b, sizeof(int64_t) * (size_t)n);
    if (!a || !copy) return NULL;
    memcpy(copy, v, sizeof(int64_t) * (size_t)n);
    a->n_ints = (size_t)n;
    a->ints = copy;
    return a;
}

/* ---- tensors, nodes ---- */

/* A tensor proto of type dt with dims shape[0..nd) over nbytes of data
 * (borrowed: it must outlive the packing). */
static Onnx__TensorProto *tensor_new(builder *b, const char *name, int32_t dt, int nd, const int64_t *shape,
                                     const void *data, size_t nbytes) {
    Onnx__TensorProto *t = balloc(b, sizeof *t);
    int64_t *dims = balloc(b, sizeof(int64_t) * (size_t)(nd ? nd : 1));
    if (!t || !dims) return NULL;
    onnx__tensor_proto__init(t);
    memcpy(dims, shape, sizeof(int64_t) * (size_t)nd);
    t->name = bstr(b, "%s", name);
    t->n_dims = (size_t)nd;
    t->dims = dims;
    t->has_data_type = 1;
    t->data_type = dt;
    t->has_raw_data = 1;
    t->raw_data.len = nbytes;
    t->raw_data.data = (uint8_t *)data;
    return t;
}

/* A node of type op over the NULL-terminated inputs, with the
 * NULL-terminated attributes, and n_out outputs; their names go to out[]
 * (unique, "<op>_<k>" or "<label>" for the graph's outputs). */
static void node_n(builder *b, const char *op, const char *const *in, Onnx__AttributeProto *const *attrs, int n_out,
                   const char **out, const char *label) {
    Onnx__NodeProto *n = balloc(b, sizeof *n);
    int n_in = 0, n_attr = 0;
    while (in[n_in]) n_in++;
    while (attrs && attrs[n_attr]) n_attr++;
    char **ins = balloc(b, sizeof(char *) * (size_t)n_in), **outs = balloc(b, sizeof(char *) * (size_t)n_out);
    Onnx__AttributeProto **as = balloc(b, sizeof *as * (size_t)(n_attr + 1));
    if (!n || !ins || !outs || !as) return;
    onnx__node_proto__init(n);
    for (int i = 0; i < n_in; i++) ins[i] = bstr(b, "%s", in[i]);
    for (int i = 0; i < n_out; i++) out[i] = outs[i] = label ? bstr(b, "%s", label) : bstr(b, "%s_%d", op, ++b->counter);
    memcpy(as, attrs, sizeof *as * (size_t)n_attr);
    n->name = bstr(b, "%s_node_%d", op, b->n_nodes);
    n->op_type = bstr(b, "%s", op);
    n->n_input = (size_t)n_in;
    n->input = ins;
    n->n_output = (size_t)n_out;
    n->output = outs;
    n->n_attribute = (size_t)n_attr;
    n->attribute = as;
    if (!b->st && grow(b, (void **)&b->nodes, &b->cap_nodes, b->n_nodes, sizeof *b->nodes)) b->nodes[b->n_nodes++] = n;
}

/* One-output node; returns its output's name (NULL after a failure). */
static const char *node(builder *b, const char *op, const char *const *in, Onnx__AttributeProto *const *attrs) {
    const char *out = NULL;
    node_n(b, op, in, attrs, 1, &out, NULL);
    return b->st ? NULL : out;
}

#define IN(...) ((const char *const[]){__VA_ARGS__, NULL})
#define ATTRS(...) ((Onnx__AttributeProto *const[]){__VA_ARGS__, NULL})

/* A Constant node holding the tensor; returns its output. */
static const char *constant(builder *b, int32_t dt, int nd, const int64_t *shape, const void *data, size_t nbytes) {
    void *copy = balloc(b, nbytes);
    if (!copy) return NULL;
    memcpy(copy, data, nbytes);
    Onnx__AttributeProto *a = attr_new(b, "value", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR);
    if (a) a->t = tensor_new(b, "", dt, nd, shape, copy, nbytes);
    return a && a->t ? node(b, "Constant", (const char *const[]){NULL}, ATTRS(a)) : NULL;
}

/* A constant 1-D int64 tensor of n values. */
static const char *const_ints(builder *b, int n, const int64_t *v) {
    return constant(b, ONNX__TENSOR_PROTO__DATA_TYPE__INT64, 1, (int64_t[]){n}, v, sizeof(int64_t) * (size_t)n);
}

/* A constant float scalar. */
static const char *const_float(builder *b, float v) {
    return constant(b, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 0, NULL, &v, sizeof v);
}

/* Parameter name as an initializer (its values borrowed from the model). */
static const char *param(builder *b, const ts_model *m, const char *name) {
    if (b->st) return NULL;
    int i = ts_model_find(m, name);
    if (i < 0) {
        b->st = ts_last_status();
        return NULL;
    }
    const ts_param *p = &m->params[i];
    for (int k = 0; k < b->n_inits; k++) /* a tied weight is one initializer */
        if (!strcmp(b->inits[k]->name, p->name)) return b->inits[k]->name;
    Onnx__TensorProto *t = tensor_new(b, p->name, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, p->ndim, p->shape,
                                      ts_f32(p->value), sizeof(float) * (size_t)p->numel);
    if (t && grow(b, (void **)&b->inits, &b->cap_inits, b->n_inits, sizeof *b->inits)) b->inits[b->n_inits++] = t;
    return b->st ? NULL : t->name;
}

/* ---- layers ---- */

/* x [..., in] -> x W^T + b for the Linear called name: Gemm on a matrix,
 * else MatMul with the transposed weight. */
static const char *linear(builder *b, const ts_model *m, const char *name, const char *x, bool matrix) {
    const char *w = param(b, m, bstr(b, "%s.weight", name)), *bias = param(b, m, bstr(b, "%s.bias", name));
    if (matrix) return node(b, "Gemm", IN(x, w, bias), ATTRS(attr_int(b, "transB", 1)));
    const char *wt = node(b, "Transpose", IN(w), ATTRS(attr_ints(b, "perm", 2, (int64_t[]){1, 0})));
    return node(b, "Add", IN(node(b, "MatMul", IN(x, wt), NULL), bias), NULL);
}

static const char *layernorm(builder *b, const ts_model *m, const char *name, const char *x) {
    const char *w = param(b, m, bstr(b, "%s.weight", name)), *bias = param(b, m, bstr(b, "%s.bias", name));
    return node(b, "LayerNormalization", IN(x, w, bias),
                ATTRS(attr_int(b, "axis", -1), attr_float(b, "epsilon", 1e-5f)));
}

/* GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (opset
 * 17 has no Gelu). */
static const char *gelu_tanh(builder *b, const char *x) {
    const char *x3 = node(b, "Mul", IN(node(b, "Mul", IN(x, x), NULL), x), NULL);
    const char *inner = node(b, "Add", IN(x, node(b, "Mul", IN(x3, const_float(b, 0.044715f)), NULL)), NULL);
    const char *t = node(b, "Tanh", IN(node(b, "Mul", IN(inner, const_float(b, (float)sqrt(2.0 / M_PI))), NULL)), NULL);
    const char *half_x = node(b, "Mul", IN(x, const_float(b, 0.5f)), NULL);
    return node(b, "Mul", IN(half_x, node(b, "Add", IN(t, const_float(b, 1.0f)), NULL)), NULL);
}

static const char *mlp_graph(builder *b, const ts_model *m, const ts_model_spec *s) {
    const char *x = "input";
    for (int i = 0; i + 1 < s->n_widths; i++) {
        x = linear(b, m, bstr(b, "fc%d", i), x, true);
        if (i + 2 < s->n_widths) x = node(b, "Relu", IN(x), NULL);
    }
    return x;
}

/* Conv (same padding) -> Relu -> MaxPool 2x2 of the conv called name. */
static const char *conv_stage(builder *b, const ts_model *m, const ts_model_spec *s, const char *name, const char *x) {
    int64_t k = s->kernel, p = s->kernel / 2;
    const char *w = param(b, m, bstr(b, "%s.weight", name)), *bias = param(b, m, bstr(b, "%s.bias", name));
    const char *c = node(b, "Conv", IN(x, w, bias),
                         ATTRS(attr_ints(b, "kernel_shape", 2, (int64_t[]){k, k}),
                               attr_ints(b, "pads", 4, (int64_t[]){p, p, p, p}),
                               attr_ints(b, "strides", 2, (int64_t[]){1, 1})));
    return node(b, "MaxPool", IN(node(b, "Relu", IN(c), NULL)),
                ATTRS(attr_ints(b, "kernel_shape", 2, (int64_t[]){2, 2}), attr_ints(b, "strides", 2, (int64_t[]){2, 2})));
}

static const char *cnn_graph(builder *b, const ts_model *m, const ts_model_spec *s) {
    const char *x = conv_stage(b, m, s, "conv2", conv_stage(b, m, s, "conv1", "input"));
    x = node(b, "Flatten", IN(x), ATTRS(attr_int(b, "axis", 1)));
    return linear(b, m, "fc", x, true);
}

/* What every GPT block shares: the sliced causal mask and shape constants. */
typedef struct {
    const char *mask;      /* [T, T]: 0 on and below the diagonal, -inf above */
    const char *split;     /* [C, C, C] */
    const char *heads;     /* [0, 0, H, D] */
    const char *merge;     /* [0, 0, C] */
    const char *scale;     /* 1 / sqrt(D) */
} gpt_consts;

/* Causal self-attention of block i on h [B, T, C]. */
static const char *attention(builder *b, const ts_model *m, const gpt_consts *g, int i, const char *h) {
    const char *qkv = linear(b, m, bstr(b, "blocks.%d.attn.qkv", i), h, false), *part[3] = {0};
    node_n(b, "Split", IN(qkv, g->split), ATTRS(attr_int(b, "axis", 2)), 3, part, NULL);
    const char *head[3];
    static const int64_t to_bhtd[] = {0, 2, 1, 3}, to_bhdt[] = {0, 2, 3, 1};
    for (int j = 0; j < 3; j++)
        head[j] = node(b, "Transpose", IN(node(b, "Reshape", IN(part[j], g->heads), NULL)),
                       ATTRS(attr_ints(b, "perm", 4, j == 1 ? to_bhdt : to_bhtd)));
    const char *s = node(b, "Mul", IN(node(b, "MatMul", IN(head[0], head[1]), NULL), g->scale), NULL);
    const char *p = node(b, "Softmax", IN(node(b, "Add", IN(s, g->mask), NULL)), ATTRS(attr_int(b, "axis", -1)));
    const char *y = node(b, "Transpose", IN(node(b, "MatMul", IN(p, head[2]), NULL)),
                         ATTRS(attr_ints(b, "perm", 4, to_bhtd)));
    return linear(b, m, bstr(b, "blocks.%d.attn.proj", i), node(b, "Reshape", IN(y, g->merge), NULL), false);
}

static const char *block(builder *b, const ts_model *m, const gpt_consts *g, int i, const char *x) {
    x = node(b, "Add", IN(x, attention(b, m, g, i, layernorm(b, m, bstr(b, "blocks.%d.ln1", i), x))), NULL);
    const char *h = layernorm(b, m, bstr(b, "blocks.%d.ln2", i), x);
    h = gelu_tanh(b, linear(b, m, bstr(b, "blocks.%d.mlp.fc", i), h, false));
    return node(b, "Add", IN(x, linear(b, m, bstr(b, "blocks.%d.mlp.proj", i), h, false)), NULL);
}

/* The [block_size, block_size] causal mask as a constant, sliced to [T, T]
 * with T the sequence length of input_ids. */
static const char *causal_mask(builder *b, int64_t n, const char *t1) {
    float *mask = balloc(b, sizeof(float) * (size_t)(n * n));
    if (!mask) return NULL;
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < n; c++) mask[r * n + c] = c > r ? -INFINITY : 0.0f;
    const char *full = constant(b, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 2, (int64_t[]){n, n}, mask,
                                sizeof(float) * (size_t)(n * n));
    const char *tt = node(b, "Concat", IN(t1, t1), ATTRS(attr_int(b, "axis", 0)));
    const int64_t zeros[2] = {0, 0}, axes[2] = {0, 1};
    return node(b, "Slice", IN(full, const_ints(b, 2, zeros), tt, const_ints(b, 2, axes)), NULL);
}

static const char *gpt_graph(builder *b, const ts_model *m, const ts_model_spec *s) {
    const ts_gpt_config *c = &s->gpt;
    int64_t C = c->n_embd, H = c->n_head, D = C / H;
    const char *wte = param(b, m, "wte.weight"), *wpe = param(b, m, "wpe.weight");
    const char *t1 = node(b, "Shape", IN("input_ids"), ATTRS(attr_int(b, "start", 1), attr_int(b, "end", 2)));
    const char *zero = const_ints(b, 1, (int64_t[]){0});
    const char *pos = node(b, "Slice", IN(wpe, zero, t1, zero), NULL); /* wpe[0:T] */
    const char *x = node(b, "Add", IN(node(b, "Gather", IN(wte, "input_ids"), ATTRS(attr_int(b, "axis", 0))), pos), NULL);
    gpt_consts g = {
        .mask = causal_mask(b, c->block_size, t1),
        .split = const_ints(b, 3, (int64_t[]){C, C, C}),
        .heads = const_ints(b, 4, (int64_t[]){0, 0, H, D}),
        .merge = const_ints(b, 3, (int64_t[]){0, 0, C}),
        .scale = const_float(b, (float)(1.0 / sqrt((double)D))),
    };
    for (int i = 0; i < c->n_layer; i++) x = block(b, m, &g, i, x);
    x = layernorm(b, m, "ln_f", x);
    const char *wte_t = node(b, "Transpose", IN(wte), ATTRS(attr_ints(b, "perm", 2, (int64_t[]){1, 0})));
    return node(b, "MatMul", IN(x, wte_t), NULL);
}

/* ---- the model ---- */

/* A graph input or output: elem type dt, nd dims, each a size or (when
 * names[d] is set) a dynamic dimension of that name. */
static Onnx__ValueInfoProto *value_info(builder *b, const char *name, int32_t dt, int nd, const int64_t *shape,
                                        const char *const *names) {
    Onnx__ValueInfoProto *v = balloc(b, sizeof *v);
    Onnx__TypeProto *t = balloc(b, sizeof *t);
    Onnx__TypeProto__Tensor *tt = balloc(b, sizeof *tt);
    Onnx__TensorShapeProto *sh = balloc(b, sizeof *sh);
    Onnx__TensorShapeProto__Dimension **dims = balloc(b, sizeof *dims * (size_t)nd);
    if (!v || !t || !tt || !sh || !dims) return NULL;
    onnx__value_info_proto__init(v);
    onnx__type_proto__init(t);
    onnx__type_proto__tensor__init(tt);
    onnx__tensor_shape_proto__init(sh);
    for (int d = 0; d < nd; d++) {
        Onnx__TensorShapeProto__Dimension *dim = dims[d] = balloc(b, sizeof *dim);
        if (!dim) return NULL;
        onnx__tensor_shape_proto__dimension__init(dim);
        if (names[d]) {
            dim->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
            dim->dim_param = bstr(b, "%s", names[d]);
        } else {
            dim->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
            dim->dim_value = shape[d];
        }
    }
    sh->n_dim = (size_t)nd;
    sh->dim = dims;
    tt->has_elem_type = 1;
    tt->elem_type = dt;
    tt->shape = sh;
    t->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    t->tensor_type = tt;
    v->name = bstr(b, "%s", name);
    v->type = t;
    return v;
}

/* The graph of m: its input, nodes, initializers and the "logits" output. */
static Onnx__GraphProto *graph(builder *b, const ts_model *m, const ts_model_spec *s) {
    Onnx__GraphProto *g = balloc(b, sizeof *g);
    Onnx__ValueInfoProto **in = balloc(b, sizeof *in), **out = balloc(b, sizeof *out);
    if (!g || !in || !out) return NULL;
    onnx__graph_proto__init(g);
    static const char *const batch[] = {"batch", NULL, NULL, NULL}, *const seq[] = {"batch", "sequence", NULL};
    int64_t shape[4];
    ts_dtype dt;
    int nd = ts_model_input_shape(s, 1, shape, &dt);
    const char *last;
    if (s->arch == TS_ARCH_GPT) {
        in[0] = value_info(b, "input_ids", ONNX__TENSOR_PROTO__DATA_TYPE__INT64, 2, shape, seq);
        out[0] = value_info(b, "logits", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 3,
                            (int64_t[]){1, 1, s->gpt.vocab}, seq);
        last = gpt_graph(b, m, s);
    } else {
        in[0] = value_info(b, "input", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, nd, shape, batch);
        int64_t classes = s->arch == TS_ARCH_MLP ? s->widths[s->n_widths - 1] : s->classes;
        out[0] = value_info(b, "logits", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 2, (int64_t[]){1, classes}, batch);
        last = s->arch == TS_ARCH_MLP ? mlp_graph(b, m, s) : cnn_graph(b, m, s);
    }
    node_n(b, "Identity", IN(last ? last : ""), NULL, 1, &last, "logits");
    if (b->st) return NULL;
    g->name = bstr(b, "tessera_%s", s->arch == TS_ARCH_MLP ? "mlp" : s->arch == TS_ARCH_CNN ? "cnn" : "gpt");
    g->n_node = (size_t)b->n_nodes;
    g->node = b->nodes;
    g->n_initializer = (size_t)b->n_inits;
    g->initializer = b->inits;
    g->n_input = 1;
    g->input = in;
    g->n_output = 1;
    g->output = out;
    return g;
}

ts_status ts_onnx_export(const ts_model *m, const ts_model_spec *s, const char *path) {
    if (ts_model_units(s) < 0) return ts_last_status();
    if (m->dtype != TS_F32 || m->root->n_children != ts_model_units(s))
        return ts_error(TS_ERR_VALUE, "onnx export %s: needs the whole f32 model of its spec (%d of %d units)", path,
                        m->root->n_children, ts_model_units(s));
    builder b = {0};
    Onnx__ModelProto model = ONNX__MODEL_PROTO__INIT;
    Onnx__OperatorSetIdProto opset = ONNX__OPERATOR_SET_ID_PROTO__INIT, *opsets[] = {&opset};
    opset.domain = "";
    opset.has_version = 1;
    opset.version = TS_ONNX_OPSET;
    model.has_ir_version = 1;
    model.ir_version = TS_ONNX_IR_VERSION;
    model.n_opset_import = 1;
    model.opset_import = opsets;
    model.producer_name = "tessera";
    model.producer_version = TESSERA_VERSION;
    model.graph = graph(&b, m, s);
    uint8_t *buf = NULL;
    size_t len = 0;
    ts_status st = b.st;
    if (!st) {
        len = onnx__model_proto__get_packed_size(&model);
        buf = malloc(len ? len : 1);
        st = buf ? TS_OK : ts_error(TS_ERR_MEMORY, "onnx export %s: out of memory for %zu bytes", path, len);
    }
    if (!st && onnx__model_proto__pack(&model, buf) != len)
        st = ts_error(TS_ERR_FORMAT, "onnx export %s: the packed size changed", path);
    if (!st) st = ts_onnx_check(buf, len, path);
    ts_io_atomic a;
    if (!st) st = ts_io_atomic_open(&a, path);
    if (!st) {
        if (fwrite(buf, 1, len, a.f) != len) {
            ts_io_atomic_abort(&a);
            st = ts_error(TS_ERR_IO, "onnx export %s: write failed", path);
        } else {
            st = ts_io_atomic_commit(&a);
        }
    }
    free(buf);
    builder_free(&b);
    return st;
}

#else

bool ts_onnx_available(void) { return false; }

ts_status ts_onnx_export(const ts_model *m, const ts_model_spec *s, const char *path) {
    (void)m;
    (void)s;
    return ts_error(TS_ERR_UNSUPPORTED, "onnx export %s: this build has no ONNX support (install protobuf-c-compiler, "
                                        "libprotobuf-c-dev and libonnx-dev with scripts/install-deps.sh, then rebuild)",
                    path);
}

#endif
