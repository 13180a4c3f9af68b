/* generate.c - temperature / top-k sampling from a GPT. */
#include "kernels/nn/generate.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/autograd.h"

/* Samples an index from logits (vocab entries) into *pick with
 * temperature, top_k (exactly the top_k largest, ties broken by the lower
 * index; 0: all) and the uniform number u in [0, 1). Logits that are not
 * finite (a diverged model) are an error, not a draw. */
static ts_status sample(const float *logits, int vocab, double temperature, int top_k, double u, int *pick) {
    double max = -INFINITY;
    for (int i = 0; i < vocab; i++) {
        if (!isfinite(logits[i]))
            return ts_error(TS_ERR_VALUE, "generate: the model's logit for byte %d is %g (a diverged model?)", i,
                            logits[i]);
        max = fmax(max, logits[i]);
    }
    double *p = malloc(sizeof(double) * (size_t)vocab);
    if (!p) return ts_error(TS_ERR_MEMORY, "generate: out of memory for %d probabilities", vocab);
    bool all = top_k <= 0 || top_k >= vocab;
    for (int i = 0; i < vocab; i++) p[i] = all ? 1 : 0; /* 1: among the top_k */
    for (int k = 0; !all && k < top_k; k++) { /* partial selection, vocab is small */
        int best = -1;
        for (int i = 0; i < vocab; i++)
            if (p[i] == 0 && (best < 0 || logits[i] > logits[best])) best = i;
        p[best] = 1;
    }
    double sum = 0;
    for (int i = 0; i < vocab; i++) {
        p[i] = p[i] > 0 ? exp((logits[i] - max) / temperature) : 0;
        sum += p[i];
    }
    double target = u * sum, acc = 0;
    *pick = -1;
    for (int i = 0; i < vocab && *pick < 0; i++) {
        acc += p[i];
        if (p[i] > 0 && acc > target) *pick = i;
    }
    for (int i = vocab - 1; *pick < 0; i--) /* rounding left u at the very end: the last one kept */
        if (p[i] > 0) *pick = i;
    free(p);
    return TS_OK;
}

struct ts_generator {
    ts_model *m;
    int64_t block_size;
    double temperature;
    int top_k, n, made;
    ts_key key;
    char *text; /* prompt + the bytes made so far, NUL-terminated */
    size_t len;
};

ts_generator *ts_generator_new(ts_model *m, int64_t block_size, const char *prompt, int n, double temperature,
                               int top_k, ts_key key) {
    if (!m || !prompt) {
        ts_error(TS_ERR_VALUE, "generate: the %s is NULL", m ? "prompt" : "model");
        return NULL;
    }
    size_t plen = strlen(prompt);
    if (block_size < 1 || top_k < 0) { /* a step samples from its last position */
        ts_error(TS_ERR_VALUE, block_size < 1 ? "generate: block_size %lld must be at least 1"
                                              : "generate: top_k %lld must be >= 0 (0: all bytes)",
                 (long long)(block_size < 1 ? block_size : top_k));
        return NULL;
    }
    if (!(temperature > 0)) {
        ts_error(TS_ERR_VALUE, "generate: temperature %g must be positive", temperature);
        return NULL;
    }
    if (plen == 0 || n < 0) {
        ts_error(TS_ERR_VALUE, "generate: %s", plen ? "the number of bytes is negative" : "the prompt is empty");
        return NULL;
    }
    ts_generator *g = calloc(1, sizeof *g);
    char *text = g ? malloc(plen + (size_t)n + 1) : NULL;
    if (!text) {
        free(g);
        ts_error(TS_ERR_MEMORY, "generate: out of memory for %zu + %d bytes", plen, n);
        return NULL;
    }
    memcpy(text, prompt, plen + 1);
    *g = (ts_generator){m, block_size, temperature, top_k, n, 0, key, text, plen};
    return g;
}

void ts_generator_free(ts_generator *g) {
    if (!g) return;
    free(g->text);
    free(g);
}

ts_status ts_generator_next(ts_generator *g, char *c, bool *done) {
    *done = g->made >= g->n;
    if (*done) return TS_OK;
    int64_t T = (int64_t)g->len < g->block_size ? (int64_t)g->len : g->block_size;
    ts_tensor *idx = ts_tensor_empty(TS_I64, 2, (int64_t[]){1, T});
    if (!idx) return ts_last_status();
    for (int64_t j = 0; j < T; j++) ts_tensor_set(idx, j, (unsigned char)g->text[g->len - (size_t)T + (size_t)j]);
    bool prev_grad = ts_grad_set_enabled(false), prev_train = g->m->training;
    ts_model_train(g->m, false);
    ts_tensor *in = ts_tensor_to(idx, g->m->device), *out = in ? ts_model_forward(g->m, in) : NULL;
    ts_tensor *logits = out ? ts_tensor_to(out, TS_CPU) : NULL; /* sampled on the host */
    ts_model_train(g->m, prev_train);
    ts_grad_set_enabled(prev_grad);
    ts_tensor_release(idx);
    ts_tensor_release(in);
    ts_tensor_release(out);
    if (!logits) return ts_last_status();
    int vocab = (int)logits->shape[2];
    float u;
    ts_rng_uniform_f32(g->key, (uint64_t)g->made, 1, &u);
    int k = 0;
    ts_status st = sample(ts_f32(logits) + (T - 1) * vocab, vocab, g->temperature, g->top_k, u, &k);
    ts_tensor_release(logits);
    if (st) return st;
    *c = (char)(k ? k : ' '); /* a NUL byte would end the text */
    g->text[g->len++] = *c;
    g->text[g->len] = '\0';
    g->made++;
    return TS_OK;
}

ts_status ts_generate(ts_model *m, int64_t block_size, const char *prompt, int n, double temperature, int top_k,
                      ts_key key, char *out, size_t cap) {
    ts_generator *g = ts_generator_new(m, block_size, prompt, n, temperature, top_k, key);
    if (!g) return ts_last_status();
    size_t plen = g->len;
    if (plen + (size_t)n + 1 > cap) {
        ts_generator_free(g);
        return ts_error(TS_ERR_VALUE, "generate: %zu + %d bytes do not fit in %zu", plen, n, cap);
    }
    memcpy(out, prompt, plen + 1);
    ts_status st = TS_OK;
    char c;
    bool done = false;
    while (!st && !done) {
        st = ts_generator_next(g, &c, &done);
        if (!st && !done) {
            out[plen++] = c;
            out[plen] = '\0';
        }
    }
    ts_generator_free(g);
    return st;
}
