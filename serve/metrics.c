/* metrics.c - request counters and histograms, rendered for Prometheus. */
#include "serve/metrics.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_SERIES = 64 };

static const double latency_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
static const double batch_bounds[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
#define N_LATENCY (sizeof latency_bounds / sizeof *latency_bounds)
#define N_BATCH (sizeof batch_bounds / sizeof *batch_bounds)

/* Counts per bucket (not cumulative; the last is +Inf), sum and count. */
typedef struct {
    uint64_t buckets[16];
    double sum;
    uint64_t count;
} histogram;

struct ts_serve_metrics {
    pthread_mutex_t lock;
    struct {
        char endpoint[16];
        unsigned code;
        uint64_t n;
    } series[MAX_SERIES];
    int n_series;
    uint64_t errors;
    int64_t in_flight;
    histogram latency, batch;
};

ts_serve_metrics *ts_serve_metrics_new(void) {
    ts_serve_metrics *m = calloc(1, sizeof *m);
    if (m) pthread_mutex_init(&m->lock, NULL);
    return m;
}

void ts_serve_metrics_free(ts_serve_metrics *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->lock);
    free(m);
}

static void observe(histogram *h, const double *bounds, size_t n, double v) {
    size_t i = 0;
    while (i < n && v > bounds[i]) i++;
    h->buckets[i]++;
    h->sum += v;
    h->count++;
}

void ts_serve_metrics_begin(ts_serve_metrics *m) {
    pthread_mutex_lock(&m->lock);
    m->in_flight++;
    pthread_mutex_unlock(&m->lock);
}

int64_t ts_serve_metrics_in_flight(ts_serve_metrics *m) {
    pthread_mutex_lock(&m->lock);
    int64_t n = m->in_flight;
    pthread_mutex_unlock(&m->lock);
    return n;
}

void ts_serve_metrics_request(ts_serve_metrics *m, const char *endpoint, unsigned code, double seconds) {
    pthread_mutex_lock(&m->lock);
    m->in_flight--;
    int i = 0;
    while (i < m->n_series && (m->series[i].code != code || strcmp(m->series[i].endpoint, endpoint))) i++;
    if (i == m->n_series && i < MAX_SERIES) {
        snprintf(m->series[i].endpoint, sizeof m->series[i].endpoint, "%s", endpoint);
        m->series[i].code = code;
        m->n_series++;
    }
    if (i < MAX_SERIES) m->series[i].n++;
    if (code >= 400) m->errors++;
    observe(&m->latency, latency_bounds, N_LATENCY, seconds);
    pthread_mutex_unlock(&m->lock);
}

void ts_serve_metrics_batch(ts_serve_metrics *m, int64_t n) {
    pthread_mutex_lock(&m->lock);
    observe(&m->batch, batch_bounds, N_BATCH, (double)n);
    pthread_mutex_unlock(&m->lock);
}

/* A growing text buffer. */
typedef struct {
    char *s;
    size_t len, cap;
    int failed;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...) {
    va_list ap;
    for (int attempt = 0; attempt < 2 && !t->failed; attempt++) {
        va_start(ap, fmt);
        int n = vsnprintf(t->s ? t->s + t->len : NULL, t->s ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) break;
        if (t->s && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = (t->cap + (size_t)n + 1) * 2;
        char *s = realloc(t->s, cap);
        if (!s) break;
        t->s = s;
        t->cap = cap;
    }
    t->failed = 1;
}

static void put_histogram(text *t, const char *name, const char *help, const histogram *h, const double *bounds,
                          size_t n) {
    put(t, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (size_t i = 0; i < n; i++) {
        cum += h->buckets[i];
        put(t, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i], (unsigned long long)cum);
    }
    put(t, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name, (unsigned long long)h->count, name,
        h->sum, name, (unsigned long long)h->count);
}

char *ts_serve_metrics_render(ts_serve_metrics *m, size_t *len) {
    text t = {0};
    pthread_mutex_lock(&m->lock);
    put(&t, "# HELP tessera_requests_total HTTP requests answered, by endpoint and status code.\n"
            "# TYPE tessera_requests_total counter\n");
    for (int i = 0; i < m->n_series; i++)
        put(&t, "tessera_requests_total{endpoint=\"%s\",code=\"%u\"} %llu\n", m->series[i].endpoint,
            m->series[i].code, (unsigned long long)m->series[i].n);
    put(&t, "# HELP tessera_request_errors_total HTTP requests answered with a status of 400 or more.\n"
            "# TYPE tessera_request_errors_total counter\ntessera_request_errors_total %llu\n",
        (unsigned long long)m->errors);
    put(&t, "# HELP tessera_requests_in_flight HTTP requests arrived and not yet answered.\n"
            "# TYPE tessera_requests_in_flight gauge\ntessera_requests_in_flight %lld\n", (long long)m->in_flight);
    put_histogram(&t, "tessera_request_duration_seconds", "Time from a request's arrival to the end of its response.",
                  &m->latency, latency_bounds, N_LATENCY);
    put_histogram(&t, "tessera_batch_size", "Samples per forward pass (dynamic batching).", &m->batch, batch_bounds,
                  N_BATCH);
    pthread_mutex_unlock(&m->lock);
    if (t.failed) {
        free(t.s);
        return NULL;
    }
    *len = t.len;
    return t.s;
}
