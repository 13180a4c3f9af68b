/* metrics.h - the server's counters in Prometheus text format.
 *
 * Requests by endpoint and status code, errors (status >= 400), requests
 * in flight, a latency
 * histogram (seconds from the first byte of a request to its response's
 * end) and a histogram of the batch sizes the models ran. Every function is
 * thread safe (one mutex); ts_serve_metrics_render writes exposition format
 * 0.0.4 (# HELP / # TYPE, cumulative le buckets, _sum, _count).
 */
#ifndef TS_SERVE_METRICS_H
#define TS_SERVE_METRICS_H

#include <stddef.h>
#include <stdint.h>

typedef struct ts_serve_metrics ts_serve_metrics;

ts_serve_metrics *ts_serve_metrics_new(void);
void ts_serve_metrics_free(ts_serve_metrics *m);

/* A request arrived (it is in flight until ts_serve_metrics_request). */
void ts_serve_metrics_begin(ts_serve_metrics *m);

/* Requests arrived and not finished. */
int64_t ts_serve_metrics_in_flight(ts_serve_metrics *m);

/* One finished request: its endpoint ("predict", "generate", "models",
 * "healthz", "metrics", "other"), status code and duration. */
void ts_serve_metrics_request(ts_serve_metrics *m, const char *endpoint, unsigned code, double seconds);

/* One forward pass over a batch of n samples. */
void ts_serve_metrics_batch(ts_serve_metrics *m, int64_t n);

/* The exposition text, malloc'd (free it); NULL when out of memory. */
char *ts_serve_metrics_render(ts_serve_metrics *m, size_t *len);

#endif
