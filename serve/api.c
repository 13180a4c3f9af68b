/* api.c - requests and responses of the endpoints as JSON. */
#include "serve/api.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ts_serve_reply ts_serve_json(unsigned code, json_t *doc) {
    ts_serve_reply r = {code, doc ? json_dumps(doc, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL, 0};
    json_decref(doc);
    if (!r.body) return (ts_serve_reply){500, strdup("{\"error\":{\"code\":500,\"message\":\"out of memory\"}}"), 0};
    r.len = strlen(r.body);
    return r;
}

ts_serve_reply ts_serve_error(unsigned code, const char *field, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ts_serve_json(code, json_pack("{s:{s:i, s:s, s:s}}", "error", "code", (int)code, "field", field,
                                         "message", msg));
}

static const char *arch_name(ts_arch a) { return a == TS_ARCH_MLP ? "mlp" : a == TS_ARCH_CNN ? "cnn" : "gpt"; }

ts_serve_reply ts_serve_list(ts_serve_model *const *models, int n) {
    json_t *list = json_array();
    for (int i = 0; i < n; i++) {
        const ts_serve_model *m = models[i];
        json_t *shape = json_array();
        for (int d = 0; d < m->sample_ndim; d++) json_array_append_new(shape, json_integer(m->sample_shape[d]));
        json_array_append_new(list, json_pack("{s:s, s:s, s:s, s:o, s:I, s:I, s:i}", "name", m->name, "arch",
                                              arch_name(m->spec.arch), "input",
                                              m->spec.arch == TS_ARCH_GPT ? "token ids (up to input_shape[0])" : "floats",
                                              "input_shape", shape, "outputs", (json_int_t)m->outputs, "parameters",
                                              (json_int_t)m->model->numel, "max_batch", m->batching.max_batch));
    }
    return ts_serve_json(200, json_pack("{s:o}", "models", list));
}

/* The request document: a JSON object whose keys are all in allowed. */
static json_t *parse_object(const char *body, size_t len, const char *const *allowed, ts_serve_reply *err) {
    json_error_t je;
    json_t *doc = json_loadb(body, len, 0, &je);
    if (!doc) {
        *err = ts_serve_error(400, "body", "invalid JSON at line %d, column %d: %s", je.line, je.column, je.text);
        return NULL;
    }
    if (!json_is_object(doc)) {
        *err = ts_serve_error(400, "body", "expected a JSON object");
        json_decref(doc);
        return NULL;
    }
    const char *key;
    json_t *v;
    json_object_foreach(doc, key, v) {
        int k = 0;
        while (allowed[k] && strcmp(allowed[k], key)) k++;
        if (!allowed[k]) {
            *err = ts_serve_error(400, key, "unknown field");
            json_decref(doc);
            return NULL;
        }
    }
    return doc;
}

static const char *type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER:
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* Reads v, nested arrays of shape[0..nd) numbers, into out (advancing it);
 * path is v's JSON path. */
static bool read_floats(const json_t *v, const int64_t *shape, int nd, float **out, char *path, size_t cap,
                        ts_serve_reply *err) {
    if (nd == 0) {
        if (!json_is_number(v) || !isfinite(json_number_value(v))) {
            *err = ts_serve_error(400, path, "expected a finite number, got %s", type_name(v));
            return false;
        }
        float x = (float)json_number_value(v);
        if (!isfinite(x)) { /* the model computes in f32: 1e39 would be inf */
            *err = ts_serve_error(400, path, "expected a number within float32's range (|x| < 3.4e38), got %g",
                                  json_number_value(v));
            return false;
        }
        *(*out)++ = x;
        return true;
    }
    if (!json_is_array(v) || (int64_t)json_array_size(v) != shape[0]) {
        char dims[64] = "";
        for (int d = 0; d < nd; d++)
            snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "%s%lld", d ? "," : "", (long long)shape[d]);
        if (json_is_array(v))
            *err = ts_serve_error(400, path, "wrong shape: %zu entries where the model's input takes %lld (shape [%s])",
                                  json_array_size(v), (long long)shape[0], dims);
        else
            *err = ts_serve_error(400, path, "expected an array of shape [%s], got %s", dims, type_name(v));
        return false;
    }
    size_t len = strlen(path);
    for (int64_t i = 0; i < shape[0]; i++) {
        snprintf(path + len, cap - len, "[%lld]", (long long)i);
        if (!read_floats(json_array_get(v, (size_t)i), shape + 1, nd - 1, out, path, cap, err)) return false;
    }
    path[len] = '\0';
    return true;
}

/* Reads instance v (GPT: token ids) into ids[0..*T); the first instance
 * sets *T, the others must match it. path is v's JSON path (cap bytes); a
 * bad token id is named by its own path, path[i]. */
static bool read_ids(const ts_serve_model *m, const json_t *v, int64_t *ids, int64_t *T, char *path, size_t cap,
                     ts_serve_reply *err) {
    int64_t block = m->spec.gpt.block_size, vocab = m->spec.gpt.vocab, n = (int64_t)json_array_size(v);
    if (!json_is_array(v)) {
        *err = ts_serve_error(400, path, "expected an array of 1 to %lld token ids, got %s", (long long)block,
                              type_name(v));
        return false;
    }
    if (n < 1 || n > block) {
        *err = ts_serve_error(400, path, "wrong shape: %lld token ids, the model takes 1 to %lld", (long long)n,
                              (long long)block);
        return false;
    }
    if (*T && n != *T) {
        *err = ts_serve_error(400, path, "wrong shape: %lld token ids where instances[0] has %lld (a request's sequences share one length)",
                              (long long)n, (long long)*T);
        return false;
    }
    *T = n;
    for (int64_t i = 0; i < n; i++) {
        const json_t *t = json_array_get(v, (size_t)i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= vocab) {
            size_t len = strlen(path);
            snprintf(path + len, cap - len, "[%lld]", (long long)i);
            if (json_is_integer(t))
                *err = ts_serve_error(400, path, "expected a token id in [0, %lld), got %lld", (long long)vocab,
                                      (long long)json_integer_value(t));
            else
                *err = ts_serve_error(400, path, "expected a token id in [0, %lld), got %s", (long long)vocab,
                                      type_name(t));
            return false;
        }
        ids[i] = json_integer_value(t);
    }
    return true;
}

/* The response of a prediction over n samples with logits out. */
static ts_serve_reply predictions(const ts_serve_model *m, int64_t n, const float *out) {
    json_t *list = json_array();
    for (int64_t i = 0; i < n; i++) {
        const float *row = out + i * m->outputs;
        json_t *logits = json_array();
        int64_t best = 0;
        for (int64_t k = 0; k < m->outputs; k++) {
            json_array_append_new(logits, json_real(row[k]));
            if (row[k] > row[best]) best = k;
        }
        json_array_append_new(list, json_pack("{s:I, s:o}", m->spec.arch == TS_ARCH_GPT ? "next_token" : "class",
                                              (json_int_t)best, "logits", logits));
    }
    return ts_serve_json(200, json_pack("{s:s, s:o}", "model", m->name, "predictions", list));
}

ts_serve_reply ts_serve_predict(ts_serve_model *m, const char *body, size_t len) {
    static const char *const fields[] = {"instances", NULL};
    ts_serve_reply r = {0};
    json_t *doc = parse_object(body, len, fields, &r);
    if (!doc) return r;
    json_t *inst = json_object_get(doc, "instances");
    int64_t n = json_is_array(inst) ? (int64_t)json_array_size(inst) : 0, per = 1, T = 0;
    for (int d = 0; d < m->sample_ndim; d++) per *= m->sample_shape[d];
    float *x = NULL, *out = NULL;
    int64_t *ids = NULL;
    if (!inst) r = ts_serve_error(400, "instances", "missing: expected an array of inputs");
    else if (!json_is_array(inst) || n == 0) r = ts_serve_error(400, "instances", "expected a non-empty array, got %s", json_is_array(inst) ? "an empty one" : type_name(inst));
    else if (n > TS_SERVE_MAX_INSTANCES) r = ts_serve_error(413, "instances", "%lld instances, at most %d per request", (long long)n, TS_SERVE_MAX_INSTANCES);
    else if (!(out = malloc(sizeof(float) * (size_t)(n * m->outputs))) ||
             !(m->spec.arch == TS_ARCH_GPT ? (void *)(ids = malloc(sizeof(int64_t) * (size_t)(n * per)))
                                           : (void *)(x = malloc(sizeof(float) * (size_t)(n * per)))))
        r = ts_serve_error(500, "instances", "out of memory for %lld instances", (long long)n);
    char path[256];
    float *at = x;
    for (int64_t i = 0; !r.body && i < n; i++) {
        snprintf(path, sizeof path, "instances[%lld]", (long long)i);
        if (ids) read_ids(m, json_array_get(inst, (size_t)i), ids + i * T, &T, path, sizeof path, &r);
        else read_floats(json_array_get(inst, (size_t)i), m->sample_shape, m->sample_ndim, &at, path, sizeof path, &r);
    }
    if (!r.body) {
        if (ts_serve_model_predict(m, n, T, x, ids, out)) r = ts_serve_error(500, "model", "%s", ts_last_error());
        else r = predictions(m, n, out);
    }
    free(x);
    free(ids);
    free(out);
    json_decref(doc);
    return r;
}

/* Integer field key of doc in [lo, hi], or def when absent. */
static bool int_field(const json_t *doc, const char *key, long long lo, long long hi, long long def, long long *v,
                      ts_serve_reply *err) {
    const json_t *j = json_object_get(doc, key);
    *v = def;
    if (!j) return true;
    if (!json_is_integer(j) || json_integer_value(j) < lo || json_integer_value(j) > hi) {
        *err = ts_serve_error(400, key, "expected an integer in [%lld, %lld], got %s", lo, hi,
                              json_is_integer(j) ? "one outside" : type_name(j));
        return false;
    }
    *v = json_integer_value(j);
    return true;
}

ts_generator *ts_serve_generate_begin(ts_serve_model *m, const char *body, size_t len, int max_tokens,
                                      ts_serve_reply *err) {
    static const char *const fields[] = {"prompt", "max_tokens", "temperature", "top_k", "seed", NULL};
    if (m->spec.arch != TS_ARCH_GPT) {
        *err = ts_serve_error(400, "model", "%s is a%s %s: :generate needs a GPT", m->name,
                              m->spec.arch == TS_ARCH_MLP ? "n" : "", arch_name(m->spec.arch));
        return NULL;
    }
    json_t *doc = parse_object(body, len, fields, err);
    if (!doc) return NULL;
    const json_t *prompt = json_object_get(doc, "prompt"), *temp = json_object_get(doc, "temperature");
    long long tokens, top_k, seed;
    ts_generator *g = NULL;
    size_t plen = json_string_length(prompt); /* no NUL inside: the parser refuses \u0000 */
    char got[64];
    if (!json_is_string(prompt)) snprintf(got, sizeof got, "%s", prompt ? type_name(prompt) : "nothing");
    else snprintf(got, sizeof got, plen ? "one of %zu bytes" : "an empty one", plen);
    if (!json_is_string(prompt) || plen == 0 || plen > TS_SERVE_MAX_PROMPT)
        *err = ts_serve_error(400, "prompt", "expected a non-empty string of at most %d bytes, got %s",
                              TS_SERVE_MAX_PROMPT, got);
    else if (temp && (!json_is_number(temp) || !(json_number_value(temp) > 0) || json_number_value(temp) > 100))
        *err = ts_serve_error(400, "temperature", "expected a number in (0, 100], got %s",
                              json_is_number(temp) ? "one outside" : type_name(temp));
    else if (int_field(doc, "max_tokens", 1, max_tokens, 64 < max_tokens ? 64 : max_tokens, &tokens, err) &&
             int_field(doc, "top_k", 0, m->spec.gpt.vocab, 0, &top_k, err) &&
             int_field(doc, "seed", 0, INT64_MAX, 0, &seed, err)) {
        g = ts_generator_new(m->model, m->spec.gpt.block_size, json_string_value(prompt), (int)tokens,
                             temp ? json_number_value(temp) : 0.8, (int)top_k, ts_key_from_seed((uint64_t)seed));
        if (!g) *err = ts_serve_error(400, "prompt", "%s", ts_last_error());
    }
    json_decref(doc);
    return g;
}
