/* generate.h - sampling text from a byte-level GPT.
 *
 * Each new byte is drawn from softmax(logits / temperature) of the last
 * position, restricted to the top_k most likely bytes (top_k 0: all), with
 * the uniform number for byte i taken from key at position i, so the same
 * key and prompt give the same text. The context is the last block_size
 * bytes.
 */
#ifndef TS_WORKER_GENERATE_H
#define TS_WORKER_GENERATE_H

#include "kernels/nn/model.h"

/* Writes prompt followed by n sampled bytes into out (NUL-terminated,
 * cap bytes). temperature > 0. */
ts_status ts_generate(ts_model *m, int64_t block_size, const char *prompt, int n, double temperature, int top_k,
                      ts_key key, char *out, size_t cap);

#endif
