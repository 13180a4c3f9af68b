/* api.h - the JSON side of the endpoints, apart from HTTP.
 *
 *   GET  /v1/models                 {"models": [{"name", "arch", "input",
 *                                   "input_shape", "outputs", "parameters"}]}
 *   POST /v1/models/NAME:predict    {"instances": [x, ...]}: each x one image
 *        (nested arrays of the model's input shape, e.g. [784] or [1,28,28])
 *        or one sequence of token ids (GPT, 1..block_size ids, all of one
 *        length) -> {"model", "predictions": [{"class", "logits"}]}, the
 *        GPT's {"next_token", "logits"} of the last position
 *   POST /v1/models/NAME:generate   {"prompt": text, "max_tokens": n,
 *        "temperature": t, "top_k": k, "seed": s} -> the continuation, streamed
 *
 * Every refusal is a 4xx whose body is {"error": {"code", "field",
 * "message"}}, the field being a JSON path into the request ("instances[2][5]",
 * "prompt") or what else was wrong ("model", "Authorization", "body").
 */
#ifndef TS_SERVE_API_H
#define TS_SERVE_API_H

#include <jansson.h>
#include <stddef.h>

#include "kernels/nn/generate.h"
#include "serve/model.h"

enum { TS_SERVE_MAX_INSTANCES = 4096, TS_SERVE_MAX_PROMPT = 65536 };

/* A response: status code and a malloc'd body (JSON unless said). */
typedef struct {
    unsigned code;
    char *body;
    size_t len;
} ts_serve_reply;

/* An error reply naming field. */
ts_serve_reply ts_serve_error(unsigned code, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A reply with the JSON text of doc (stolen). */
ts_serve_reply ts_serve_json(unsigned code, json_t *doc);

/* GET /v1/models. */
ts_serve_reply ts_serve_list(ts_serve_model *const *models, int n);

/* POST :predict with body[len]. */
ts_serve_reply ts_serve_predict(ts_serve_model *m, const char *body, size_t len);

/* POST :generate: a generator for the request in body[len] (max_tokens at
 * most max_tokens), or NULL with the error reply in *err. */
ts_generator *ts_serve_generate_begin(ts_serve_model *m, const char *body, size_t len, int max_tokens,
                                      ts_serve_reply *err);

#endif
