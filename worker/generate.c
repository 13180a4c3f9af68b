/* generate.c - temperature / top-k sampling from a GPT. */
#include "worker/generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/autograd.h"

/* Samples an index from logits (vocab entries) with temperature, top_k and
 * the uniform number u in [0, 1). */
static int sample(const float *logits, int vocab, double temperature, int top_k, double u) {
    double *p = malloc(sizeof(double) * (size_t)vocab);
    if (!p) return 0;
    double max = -INFINITY;
    for (int i = 0; i < vocab; i++) max = fmax(max, logits[i]);
    /* threshold: the top_k-th largest logit */
    double cut = -INFINITY;
    if (top_k > 0 && top_k < vocab) {
        for (int i = 0; i < vocab; i++) p[i] = logits[i];
        for (int k = 0; k < top_k; k++) { /* partial selection, vocab is small */
            int best = -1;
            for (int i = 0; i < vocab; i++)
                if (p[i] != -INFINITY && (best < 0 || p[i] > p[best])) best = i;
            cut = p[best];
            p[best] = -INFINITY;
        }
    }
    double sum = 0;
    for (int i = 0; i < vocab; i++) {
        p[i] = logits[i] >= cut ? exp((logits[i] - max) / temperature) : 0;
        sum += p[i];
    }
    double target = u * sum, acc = 0;
    int pick = vocab - 1;
    for (int i = 0; i < vocab; i++) {
        acc += p[i];
        if (p[i] > 0 && acc > target) {
            pick = i;
            break;
        }
    }
    free(p);
    return pick;
}

ts_status ts_generate(ts_model *m, int64_t block_size, const char *prompt, int n, double temperature, int top_k,
                      ts_key key, char *out, size_t cap) {
    size_t plen = strlen(prompt);
    if (!(temperature > 0)) return ts_error(TS_ERR_VALUE, "generate: temperature %g must be positive", temperature);
    if (plen == 0) return ts_error(TS_ERR_VALUE, "generate: the prompt is empty");
    if (plen + (size_t)n + 1 > cap) return ts_error(TS_ERR_VALUE, "generate: %zu + %d bytes do not fit", plen, n);
    memcpy(out, prompt, plen + 1);
    bool prev_grad = ts_grad_set_enabled(false), prev_train = m->training;
    ts_model_train(m, false);
    ts_status st = TS_OK;
    for (int i = 0; i < n && !st; i++) {
        size_t len = strlen(out);
        int64_t T = (int64_t)len < block_size ? (int64_t)len : block_size;
        ts_tensor *idx = ts_tensor_empty(TS_I64, 2, (int64_t[]){1, T});
        if (!idx) return ts_last_status();
        for (int64_t j = 0; j < T; j++) ts_tensor_set(idx, j, (unsigned char)out[len - (size_t)T + (size_t)j]);
        ts_tensor *logits = ts_model_forward(m, idx);
        ts_tensor_release(idx);
        if (!logits) {
            st = ts_last_status();
            break;
        }
        int vocab = (int)logits->shape[2];
        float u;
        ts_rng_uniform_f32(key, (uint64_t)i, 1, &u);
        int c = sample(ts_f32(logits) + (T - 1) * vocab, vocab, temperature, top_k, u);
        ts_tensor_release(logits);
        out[len] = (char)(c ? c : ' '); /* a NUL byte would end the text */
        out[len + 1] = '\0';
    }
    ts_model_train(m, prev_train);
    ts_grad_set_enabled(prev_grad);
    return st;
}
