/* reduce.c - CPU kernels of sum, mean and max over [outer, red, inner]
 * (reduce_t.h, once per dtype). */
#include <string.h>

#include "kernels/ops/cpu/cpu.h"

#define BLOCK 256 /* inner elements one task accumulates at a time */

#define TS_DT 32
#include "kernels/ops/cpu/reduce_t.h"
#undef TS_DT
#define TS_DT 64
#include "kernels/ops/cpu/reduce_t.h"
#undef TS_DT

static ts_status cpu_sum(ts_dtype dt, const void *x, void *out, int64_t outer, int64_t red, int64_t inner,
                         double scale) {
    if (dt == TS_F32) sum_f32(x, out, outer, red, inner, scale);
    else sum_f64(x, out, outer, red, inner, scale);
    return TS_OK;
}

static ts_status cpu_max(ts_dtype dt, const void *x, void *out, int64_t *idx, int64_t outer, int64_t red,
                         int64_t inner) {
    if (dt == TS_F32) max_f32(x, out, idx, outer, red, inner);
    else max_f64(x, out, idx, outer, red, inner);
    return TS_OK;
}

static ts_status cpu_max_backward(ts_dtype dt, const void *g, const int64_t *idx, void *gx, int64_t outer,
                                  int64_t red, int64_t inner) {
    if (dt == TS_F32) max_backward_f32(g, idx, gx, outer, red, inner);
    else max_backward_f64(g, idx, gx, outer, red, inner);
    return TS_OK;
}

const ts_reduce_kernels TS_VARIANT(ts_cpu_reduce) = {cpu_sum, cpu_max, cpu_max_backward};
