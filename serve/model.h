/* model.h - a model the server holds, and its dynamic batcher.
 *
 * A served model is built from a checkpoint folder or a weights file with
 * its job (proto/job_model.h), in eval mode. Each has one batcher thread:
 * ts_serve_model_predict queues the caller's samples and blocks until they
 * have run. The batcher takes the oldest request, waits up to
 * batch_timeout_ms from its arrival for more (until max_batch samples are
 * queued), then runs every queued request of the same sample shape that
 * fits in max_batch samples as one forward pass, and hands each its rows of
 * the logits. A request with more than max_batch samples runs alone.
 * max_batch 1 turns batching off. Forward passes of one model are
 * serialised (run_lock); text generation takes the same lock per byte, so
 * predictions go on between the bytes of a long generation.
 */
#ifndef TS_SERVE_MODEL_H
#define TS_SERVE_MODEL_H

#include <pthread.h>
#include <stdbool.h>

#include "kernels/nn/generate.h"
#include "kernels/nn/models.h"
#include "proto/job.h"
#include "serve/metrics.h"

typedef struct {
    int max_batch;        /* samples per forward pass; 1 = no batching */
    int batch_timeout_ms; /* how long the oldest request waits for company */
    ts_serve_metrics *metrics;
} ts_serve_batching;

typedef struct ts_serve_request ts_serve_request;

typedef struct {
    char name[64];
    ts_job job;
    ts_model_spec spec;
    ts_model *model;
    int sample_ndim;        /* a sample's dims: MLP [784], CNN [C, H, W]; GPT: [T] token ids */
    int64_t sample_shape[3];
    int64_t outputs;        /* logits per sample (the GPT's: of its last position) */
    ts_serve_batching batching;
    pthread_mutex_t run_lock; /* one forward at a time */
    pthread_mutex_t lock;     /* the queue */
    pthread_cond_t work, done;
    ts_serve_request *head, *tail;
    bool stop;
    bool draining; /* the server is stopping: run what is queued without waiting for company */
    pthread_t thread;
} ts_serve_model;

/* Loads the model called name from path (checkpoint folder, or weights
 * file with job_path) and starts its batcher; NULL with a message. */
ts_serve_model *ts_serve_model_load(const char *name, const char *path, const char *job_path,
                                    const ts_serve_batching *b);

/* The server is stopping: the batcher runs what is queued at once, and
 * what comes later, without waiting batch_timeout_ms for company. */
void ts_serve_model_drain(ts_serve_model *m);

/* Stops the batcher (failing what is queued) and frees the model. */
void ts_serve_model_free(ts_serve_model *m);

/* Runs n samples through the model, batched with concurrent callers: for
 * MLP/CNN x holds n samples of sample_shape floats; for the GPT ids holds n
 * sequences of T token ids (1 <= T <= block_size, each < vocab). The n *
 * outputs logits go to out. Blocks until done. */
ts_status ts_serve_model_predict(ts_serve_model *m, int64_t n, int64_t T, const float *x, const int64_t *ids,
                                 float *out);

/* The next byte of g, a generator over m's GPT, under m's run lock. */
ts_status ts_serve_model_next_byte(ts_serve_model *m, ts_generator *g, char *c, bool *done);

#endif
