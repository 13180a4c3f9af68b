/* model.c - loading a served model; the batcher thread. */
#include "serve/model.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/autograd.h"
#include "worker/model_open.h"

struct ts_serve_request {
    int64_t n, T;         /* samples; tokens per sample (GPT) or 0 */
    const float *x;
    const int64_t *ids;
    float *out;
    struct timespec arrived;
    ts_status st;
    char err[512];
    bool done;
    ts_serve_request *next;
};

/* Samples queued that could share a batch with the head (same T). */
static int64_t compatible(const ts_serve_model *m) {
    int64_t n = 0;
    for (const ts_serve_request *r = m->head; r; r = r->next)
        if (r->T == m->head->T) n += r->n;
    return n;
}

/* Waits (lock held) until max_batch samples like the head's are queued or
 * batch_timeout_ms have passed since the head arrived. */
static void wait_for_company(ts_serve_model *m) {
    if (m->batching.max_batch <= 1 || m->batching.batch_timeout_ms <= 0) return;
    struct timespec deadline = m->head->arrived;
    deadline.tv_nsec += (long)m->batching.batch_timeout_ms * 1000000L;
    deadline.tv_sec += deadline.tv_nsec / 1000000000L;
    deadline.tv_nsec %= 1000000000L;
    while (!m->stop && !m->draining && compatible(m) < m->batching.max_batch)
        if (pthread_cond_timedwait(&m->work, &m->lock, &deadline) == ETIMEDOUT) break;
}

/* Unlinks the head and every later request of its shape that still fits
 * into max_batch samples; returns them as a list. */
static ts_serve_request *take_batch(ts_serve_model *m, int64_t *samples) {
    ts_serve_request *batch = m->head, **tail = &batch->next, **link = &m->head;
    m->head = batch->next;
    batch->next = NULL;
    *samples = batch->n;
    while (*link) {
        ts_serve_request *r = *link;
        if (r->T == batch->T && *samples + r->n <= m->batching.max_batch) {
            *link = r->next;
            r->next = NULL;
            *tail = r;
            tail = &r->next;
            *samples += r->n;
        } else {
            link = &r->next;
        }
    }
    m->tail = NULL;
    for (ts_serve_request *r = m->head; r; r = r->next) m->tail = r;
    return batch;
}

/* The batch's input: [N, sample shape] floats or [N, T] token ids. */
static ts_tensor *batch_input(const ts_serve_model *m, const ts_serve_request *batch, int64_t N) {
    bool gpt = m->spec.arch == TS_ARCH_GPT;
    int64_t shape[4] = {N}, per = 1;
    int nd = gpt ? 2 : 1 + m->sample_ndim;
    for (int d = 1; d < nd; d++) per *= shape[d] = gpt ? batch->T : m->sample_shape[d - 1];
    ts_tensor *x = ts_tensor_empty(gpt ? TS_I64 : TS_F32, nd, shape);
    if (!x) return NULL;
    size_t at = 0, esize = gpt ? sizeof(int64_t) : sizeof(float);
    for (const ts_serve_request *r = batch; r; r = r->next) {
        size_t bytes = (size_t)(r->n * per) * esize;
        memcpy((char *)ts_tensor_data(x) + at, gpt ? (const void *)r->ids : (const void *)r->x, bytes);
        at += bytes;
    }
    return x;
}

/* One forward pass over the batch; each request gets its logits. */
static ts_status run_batch(ts_serve_model *m, ts_serve_request *batch, int64_t N) {
    ts_tensor *x = batch_input(m, batch, N);
    if (!x) return ts_last_status();
    pthread_mutex_lock(&m->run_lock);
    bool prev = ts_grad_set_enabled(false);
    ts_tensor *y = ts_model_forward(m->model, x);
    ts_grad_set_enabled(prev);
    pthread_mutex_unlock(&m->run_lock);
    ts_tensor_release(x);
    if (!y) return ts_last_status();
    const float *logits = ts_f32(y);
    int64_t row = 0, T = batch->T, V = m->outputs;
    for (ts_serve_request *r = batch; r; r = r->next)
        for (int64_t i = 0; i < r->n; i++, row++)
            memcpy(r->out + i * V, T ? logits + (row * T + T - 1) * V : logits + row * V, sizeof(float) * (size_t)V);
    ts_tensor_release(y);
    if (m->batching.metrics) ts_serve_metrics_batch(m->batching.metrics, N);
    return TS_OK;
}

static void *batcher(void *arg) {
    ts_serve_model *m = arg;
    pthread_mutex_lock(&m->lock);
    for (;;) {
        while (!m->stop && !m->head) pthread_cond_wait(&m->work, &m->lock);
        if (m->stop) break;
        wait_for_company(m);
        int64_t N;
        ts_serve_request *batch = take_batch(m, &N);
        pthread_mutex_unlock(&m->lock);
        ts_status st = run_batch(m, batch, N);
        pthread_mutex_lock(&m->lock);
        for (ts_serve_request *r = batch, *next; r; r = next) {
            next = r->next;
            r->st = st;
            if (st) snprintf(r->err, sizeof r->err, "%s", ts_last_error());
            r->done = true;
        }
        pthread_cond_broadcast(&m->done);
    }
    for (ts_serve_request *r = m->head; r; r = r->next) { /* stopping: nothing queued runs */
        r->st = ts_error(TS_ERR_STATE, "model %s: the server is shutting down", m->name);
        snprintf(r->err, sizeof r->err, "%s", ts_last_error());
        r->done = true;
    }
    m->head = m->tail = NULL;
    pthread_cond_broadcast(&m->done);
    pthread_mutex_unlock(&m->lock);
    return NULL;
}

ts_status ts_serve_model_predict(ts_serve_model *m, int64_t n, int64_t T, const float *x, const int64_t *ids,
                                 float *out) {
    ts_serve_request r = {.n = n, .T = T, .x = x, .ids = ids, .out = out};
    clock_gettime(CLOCK_MONOTONIC, &r.arrived);
    pthread_mutex_lock(&m->lock);
    if (m->stop) {
        pthread_mutex_unlock(&m->lock);
        return ts_error(TS_ERR_STATE, "model %s: the server is shutting down", m->name);
    }
    if (m->tail) m->tail->next = &r;
    else m->head = &r;
    m->tail = &r;
    pthread_cond_signal(&m->work);
    while (!r.done) pthread_cond_wait(&m->done, &m->lock);
    pthread_mutex_unlock(&m->lock);
    return r.st ? ts_error(r.st, "%s", r.err) : TS_OK;
}

ts_status ts_serve_model_next_byte(ts_serve_model *m, ts_generator *g, char *c, bool *done) {
    pthread_mutex_lock(&m->run_lock);
    ts_status st = ts_generator_next(g, c, done);
    pthread_mutex_unlock(&m->run_lock);
    return st;
}

/* Fills the sample shape and output count from the spec. */
static void describe(ts_serve_model *m) {
    const ts_model_spec *s = &m->spec;
    if (s->arch == TS_ARCH_MLP) {
        m->sample_ndim = 1;
        m->sample_shape[0] = s->widths[0];
        m->outputs = s->widths[s->n_widths - 1];
    } else if (s->arch == TS_ARCH_CNN) {
        m->sample_ndim = 3;
        m->sample_shape[0] = s->in_ch;
        m->sample_shape[1] = m->sample_shape[2] = s->img;
        m->outputs = s->classes;
    } else {
        m->sample_ndim = 1;
        m->sample_shape[0] = s->gpt.block_size;
        m->outputs = s->gpt.vocab;
    }
}

ts_serve_model *ts_serve_model_load(const char *name, const char *path, const char *job_path,
                                    const ts_serve_batching *b) {
    ts_serve_model *m = calloc(1, sizeof *m);
    if (!m) {
        ts_error(TS_ERR_MEMORY, "model %s: out of memory", name);
        return NULL;
    }
    snprintf(m->name, sizeof m->name, "%s", name);
    m->batching = *b;
    m->model = ts_worker_open_model(path, job_path, NULL, 0, &m->job, &m->spec);
    if (!m->model) {
        ts_error(ts_last_status(), "model %s: %s", name, ts_last_error());
        free(m);
        return NULL;
    }
    describe(m);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&m->work, &ca);
    pthread_cond_init(&m->done, NULL);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&m->lock, NULL);
    pthread_mutex_init(&m->run_lock, NULL);
    if (pthread_create(&m->thread, NULL, batcher, m)) {
        ts_error(TS_ERR_STATE, "model %s: cannot start its batcher thread", name);
        ts_model_free(m->model);
        free(m);
        return NULL;
    }
    return m;
}

void ts_serve_model_drain(ts_serve_model *m) {
    pthread_mutex_lock(&m->lock);
    m->draining = true;
    pthread_cond_broadcast(&m->work);
    pthread_mutex_unlock(&m->lock);
}

void ts_serve_model_free(ts_serve_model *m) {
    if (!m) return;
    pthread_mutex_lock(&m->lock);
    m->stop = true;
    pthread_cond_broadcast(&m->work);
    pthread_mutex_unlock(&m->lock);
    pthread_join(m->thread, NULL);
    pthread_cond_destroy(&m->work);
    pthread_cond_destroy(&m->done);
    pthread_mutex_destroy(&m->lock);
    pthread_mutex_destroy(&m->run_lock);
    ts_model_free(m->model);
    free(m);
}
