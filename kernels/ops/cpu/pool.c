/* pool.c - CPU kernels of max_pool2d and avg_pool2d, forward and backward
 * (pool_t.h, once per dtype). */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "kernels/ops/cpu/cpu.h"

/* Serial below this many output elements. */
#define POOL_OMP_MIN 16384

/* The window of output (oh, ow) clipped to the input: rows [*h0, *h1),
 * columns [*w0, *w1). */
static inline void window(const ts_pool_geom *g, int64_t oh, int64_t ow, int64_t *h0, int64_t *h1, int64_t *w0,
                          int64_t *w1) {
    int64_t hs = oh * g->sh - g->ph, ws = ow * g->sw - g->pw;
    *h0 = hs < 0 ? 0 : hs;
    *w0 = ws < 0 ? 0 : ws;
    *h1 = hs + g->kh < g->H ? hs + g->kh : g->H;
    *w1 = ws + g->kw < g->W ? ws + g->kw : g->W;
}

#define TS_DT 32
#include "kernels/ops/cpu/pool_t.h"
#undef TS_DT
#define TS_DT 64
#include "kernels/ops/cpu/pool_t.h"
#undef TS_DT

static ts_status cpu_max(ts_dtype dt, const ts_pool_geom *g, const void *x, void *out, int32_t *idx) {
    if (dt == TS_F32) max_f32(g, x, out, idx);
    else max_f64(g, x, out, idx);
    return TS_OK;
}

static ts_status cpu_max_backward(ts_dtype dt, const ts_pool_geom *g, const void *dout, const int32_t *idx,
                                  void *dx) {
    if (dt == TS_F32) max_backward_f32(g, dout, idx, dx);
    else max_backward_f64(g, dout, idx, dx);
    return TS_OK;
}

static ts_status cpu_avg(ts_dtype dt, const ts_pool_geom *g, const void *x, void *out) {
    if (dt == TS_F32) avg_f32(g, x, out);
    else avg_f64(g, x, out);
    return TS_OK;
}

static ts_status cpu_avg_backward(ts_dtype dt, const ts_pool_geom *g, const void *dout, void *dx) {
    if (dt == TS_F32) avg_backward_f32(g, dout, dx);
    else avg_backward_f64(g, dout, dx);
    return TS_OK;
}

const ts_pool_kernels TS_VARIANT(ts_cpu_pool) = {cpu_max, cpu_max_backward, cpu_avg, cpu_avg_backward};
