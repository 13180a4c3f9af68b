/* onnx_check.c - structural validation of a serialized ONNX model. */
#include "kernels/io/onnx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#if TESSERA_WITH_ONNX
#include "onnx/onnx.pb-c.h"

/* The operators of the default domain the exporter emits. */
static const char *const known_ops[] = {
    "Add", "Concat", "Constant", "Conv", "Flatten", "Gather", "Gemm", "Identity", "LayerNormalization", "MatMul",
    "MaxPool", "Mul", "Relu", "Reshape", "Shape", "Slice", "Softmax", "Split", "Tanh", "Transpose", NULL,
};

/* The names defined so far (graph inputs, initializers, node outputs). */
typedef struct {
    const char **v;
    size_t n;
} names;

static bool defined(const names *d, const char *s) {
    for (size_t i = 0; i < d->n; i++)
        if (!strcmp(d->v[i], s)) return true;
    return false;
}

/* Adds s, which must be new and non-empty; role says what defines it. */
static ts_status define(names *d, const char *s, const char *what, const char *role) {
    if (!s || !*s) return ts_error(TS_ERR_FORMAT, "onnx %s: %s has no name", what, role);
    if (defined(d, s)) return ts_error(TS_ERR_FORMAT, "onnx %s: '%s' (%s) is defined twice", what, s, role);
    d->v[d->n++] = s;
    return TS_OK;
}

/* An initializer's data must be exactly its dims' worth. */
static ts_status check_initializer(const Onnx__TensorProto *t, const char *what) {
    int64_t numel = 1;
    for (size_t d = 0; d < t->n_dims; d++) {
        if (t->dims[d] < 0) return ts_error(TS_ERR_FORMAT, "onnx %s: initializer '%s' has dim %zu = %lld", what, t->name, d, (long long)t->dims[d]);
        numel *= t->dims[d];
    }
    size_t size = t->data_type == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT ? 4
                  : t->data_type == ONNX__TENSOR_PROTO__DATA_TYPE__INT64 ? 8 : 0;
    if (!t->has_data_type || !size)
        return ts_error(TS_ERR_FORMAT, "onnx %s: initializer '%s' has data type %d (expected FLOAT or INT64)", what,
                        t->name, t->data_type);
    size_t have = t->has_raw_data ? t->raw_data.len / size
                  : size == 4     ? t->n_float_data
                                  : t->n_int64_data;
    if ((t->has_raw_data && t->raw_data.len % size) || have != (size_t)numel)
        return ts_error(TS_ERR_FORMAT, "onnx %s: initializer '%s' holds %zu values for %lld elements", what, t->name,
                        have, (long long)numel);
    return TS_OK;
}

static ts_status check_node(const Onnx__NodeProto *n, size_t k, names *d, const char *what) {
    const char *op = n->op_type ? n->op_type : "";
    bool known = false;
    for (int i = 0; known_ops[i] && !known; i++) known = !strcmp(known_ops[i], op);
    if (!known || (n->domain && *n->domain))
        return ts_error(TS_ERR_FORMAT, "onnx %s: node %zu ('%s') has operator '%s%s%s', not one of opset %d's the exporter uses",
                        what, k, n->name ? n->name : "", n->domain && *n->domain ? n->domain : "",
                        n->domain && *n->domain ? "." : "", op, TS_ONNX_OPSET);
    for (size_t i = 0; i < n->n_input; i++)
        if (*n->input[i] && !defined(d, n->input[i]))
            return ts_error(TS_ERR_FORMAT,
                            "onnx %s: node %zu ('%s', %s) reads '%s', which is no graph input, initializer or output "
                            "of an earlier node",
                            what, k, n->name ? n->name : "", op, n->input[i]);
    if (!strcmp(op, "Constant") &&
        !(n->n_attribute == 1 && n->attribute[0]->t && !strcmp(n->attribute[0]->name, "value")))
        return ts_error(TS_ERR_FORMAT, "onnx %s: Constant node %zu ('%s') has no tensor 'value'", what, k,
                        n->name ? n->name : "");
    if (n->n_output == 0) return ts_error(TS_ERR_FORMAT, "onnx %s: node %zu ('%s', %s) has no output", what, k, n->name ? n->name : "", op);
    for (size_t i = 0; i < n->n_output; i++) {
        ts_status st = define(d, n->output[i], what, "a node output");
        if (st) return st;
    }
    return TS_OK;
}

static ts_status check_graph(const Onnx__GraphProto *g, const char *what) {
    size_t outs = 0;
    for (size_t k = 0; k < g->n_node; k++) outs += g->node[k]->n_output;
    names d = {0};
    d.v = calloc(g->n_input + g->n_initializer + outs + 1, sizeof(char *));
    if (!d.v) return ts_error(TS_ERR_MEMORY, "onnx %s: out of memory", what);
    ts_status st = TS_OK;
    for (size_t i = 0; !st && i < g->n_input; i++) {
        const Onnx__ValueInfoProto *v = g->input[i];
        if (!v->type || v->type->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE)
            st = ts_error(TS_ERR_FORMAT, "onnx %s: graph input '%s' has no tensor type", what, v->name ? v->name : "");
        if (!st) st = define(&d, v->name, what, "a graph input");
    }
    for (size_t i = 0; !st && i < g->n_initializer; i++) {
        st = check_initializer(g->initializer[i], what);
        if (!st && !defined(&d, g->initializer[i]->name)) st = define(&d, g->initializer[i]->name, what, "an initializer");
    }
    for (size_t k = 0; !st && k < g->n_node; k++) st = check_node(g->node[k], k, &d, what);
    if (!st && g->n_output == 0) st = ts_error(TS_ERR_FORMAT, "onnx %s: the graph has no output", what);
    for (size_t i = 0; !st && i < g->n_output; i++)
        if (!g->output[i]->name || !defined(&d, g->output[i]->name))
            st = ts_error(TS_ERR_FORMAT, "onnx %s: graph output '%s' is produced by no node", what,
                          g->output[i]->name ? g->output[i]->name : "");
    free(d.v);
    return st;
}

ts_status ts_onnx_check(const uint8_t *buf, size_t len, const char *what) {
    Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, len, buf);
    if (!m) return ts_error(TS_ERR_FORMAT, "onnx %s: not an ONNX model (%zu bytes do not parse as a ModelProto)", what, len);
    ts_status st = TS_OK;
    bool opset = false;
    for (size_t i = 0; i < m->n_opset_import; i++)
        if ((!m->opset_import[i]->domain || !*m->opset_import[i]->domain) && m->opset_import[i]->has_version)
            opset = true;
    if (!m->has_ir_version || m->ir_version < 3)
        st = ts_error(TS_ERR_FORMAT, "onnx %s: no IR version (or one below 3)", what);
    else if (!opset)
        st = ts_error(TS_ERR_FORMAT, "onnx %s: no opset of the default domain is imported", what);
    else if (!m->graph)
        st = ts_error(TS_ERR_FORMAT, "onnx %s: the model has no graph", what);
    else
        st = check_graph(m->graph, what);
    onnx__model_proto__free_unpacked(m, NULL);
    return st;
}

#else

ts_status ts_onnx_check(const uint8_t *buf, size_t len, const char *what) {
    (void)buf;
    (void)len;
    return ts_error(TS_ERR_UNSUPPORTED, "onnx %s: this build has no ONNX support (install protobuf-c-compiler, "
                                        "libprotobuf-c-dev and libonnx-dev with scripts/install-deps.sh, then rebuild)",
                    what);
}

#endif

ts_status ts_onnx_check_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return ts_error(TS_ERR_IO, "onnx %s: cannot open", path);
    struct stat sb;
    uint8_t *buf = NULL;
    ts_status st = fstat(fileno(f), &sb) || !S_ISREG(sb.st_mode) ? ts_error(TS_ERR_IO, "onnx %s: not a regular file", path)
                                                                  : TS_OK;
    if (!st && !(buf = malloc((size_t)sb.st_size + 1)))
        st = ts_error(TS_ERR_MEMORY, "onnx %s: out of memory for %lld bytes", path, (long long)sb.st_size);
    if (!st && fread(buf, 1, (size_t)sb.st_size, f) != (size_t)sb.st_size)
        st = ts_error(TS_ERR_IO, "onnx %s: read failed", path);
    fclose(f);
    if (!st) st = ts_onnx_check(buf, (size_t)sb.st_size, path);
    free(buf);
    return st;
}
