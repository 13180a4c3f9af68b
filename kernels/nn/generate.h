/* generate.h - sampling text from a byte-level GPT.
 *
 * Each new byte is drawn from softmax(logits / temperature) of the last
 * position, restricted to the top_k most likely bytes (top_k 0: all;
 * exactly k when logits tie, the lower bytes first; a logit that is not
 * finite is an error), with
 * the uniform number for byte i taken from key at position i, so the same
 * key and prompt give the same text. The context is the last block_size
 * bytes. A generator hands out one byte per call (a server streams them
 * and lets other work use the model in between); ts_generate runs one to
 * the end.
 */
#ifndef TS_NN_GENERATE_H
#define TS_NN_GENERATE_H

#include "kernels/nn/model.h"

typedef struct ts_generator ts_generator;

/* A generator of n bytes after prompt (non-empty) from m; block_size >= 1,
 * temperature > 0, top_k >= 0.
 * m is used only inside ts_generator_next and must outlive the generator. */
ts_generator *ts_generator_new(ts_model *m, int64_t block_size, const char *prompt, int n, double temperature,
                               int top_k, ts_key key);

/* The next byte into *c (a sampled NUL becomes a space), or *done set once
 * n bytes were made. Runs one no-grad forward in eval mode. */
ts_status ts_generator_next(ts_generator *g, char *c, bool *done);

void ts_generator_free(ts_generator *g);

/* Writes prompt followed by n sampled bytes into out (NUL-terminated,
 * cap bytes). temperature > 0. */
ts_status ts_generate(ts_model *m, int64_t block_size, const char *prompt, int n, double temperature, int top_k,
                      ts_key key, char *out, size_t cap);

#endif
