/* rows.c - CPU kernels that take rows whole: softmax, layernorm, the
 * losses, embedding and dropout (rows_t.h, once per dtype). */
#include <string.h>

#include "kernels/ops/cpu/cpu.h"

#define MSE_CHUNK 4096     /* elements summed in the input's precision before adding into a double */
#define DROPOUT_CHUNK 4096 /* random numbers drawn at a time */

#define TS_DT 32
#include "kernels/ops/cpu/rows_t.h"
#undef TS_DT
#define TS_DT 64
#include "kernels/ops/cpu/rows_t.h"
#undef TS_DT

static ts_status cpu_softmax(ts_dtype dt, const void *x, void *y, int64_t R, int64_t n, bool lg) {
    if (dt == TS_F32) softmax_f32(x, y, R, n, lg);
    else softmax_f64(x, y, R, n, lg);
    return TS_OK;
}

static ts_status cpu_softmax_backward(ts_dtype dt, const void *y, const void *g, void *gx, int64_t R, int64_t n,
                                      bool lg) {
    if (dt == TS_F32) softmax_backward_f32(y, g, gx, R, n, lg);
    else softmax_backward_f64(y, g, gx, R, n, lg);
    return TS_OK;
}

static ts_status cpu_layernorm(ts_dtype dt, const void *x, const void *w, const void *b, void *y, void *mean,
                               void *rstd, int64_t R, int64_t D, double eps) {
    if (dt == TS_F32) layernorm_f32(x, w, b, y, mean, rstd, R, D, (float)eps);
    else layernorm_f64(x, w, b, y, mean, rstd, R, D, eps);
    return TS_OK;
}

/* Per-thread partial sums of dw and db in scratch from the allocator. */
static ts_status cpu_layernorm_backward(ts_dtype dt, const void *x, const void *w, const void *mean,
                                        const void *rstd, const void *g, void *dx, void *dw, void *db, int64_t R,
                                        int64_t D) {
    int nthreads = omp_get_max_threads();
    int64_t n = (int64_t)nthreads * 2 * D;
    void *part = ts_cpu_scratch("layernorm", n, ts_dtype_size(dt));
    if (!part) return ts_last_status();
    memset(part, 0, (size_t)n * ts_dtype_size(dt));
    if (dt == TS_F32) {
        layernorm_rows_f32(x, w, mean, rstd, g, dx, part, R, D);
        layernorm_sums_f32(part, nthreads, dw, db, D);
    } else {
        layernorm_rows_f64(x, w, mean, rstd, g, dx, part, R, D);
        layernorm_sums_f64(part, nthreads, dw, db, D);
    }
    ts_cpu_scratch_free(part, n, ts_dtype_size(dt));
    return TS_OK;
}

static ts_status cpu_cross_entropy(ts_dtype dt, const void *x, const int64_t *t, void *lse, int64_t N, int64_t C,
                                   int64_t ign, double *total) {
    *total = dt == TS_F32 ? cross_entropy_f32(x, t, lse, N, C, ign) : cross_entropy_f64(x, t, lse, N, C, ign);
    return TS_OK;
}

static ts_status cpu_cross_entropy_backward(ts_dtype dt, const void *x, const int64_t *t, const void *lse, void *gx,
                                            int64_t N, int64_t C, int64_t ign, double scale) {
    if (dt == TS_F32) cross_entropy_backward_f32(x, t, lse, gx, N, C, ign, (float)scale);
    else cross_entropy_backward_f64(x, t, lse, gx, N, C, ign, scale);
    return TS_OK;
}

static ts_status cpu_mse(ts_dtype dt, const void *a, const void *b, int64_t n, double *total) {
    *total = dt == TS_F32 ? mse_f32(a, b, n) : mse_f64(a, b, n);
    return TS_OK;
}

static ts_status cpu_mse_backward(ts_dtype dt, const void *a, const void *b, void *ga, void *gb, int64_t n,
                                  double scale) {
    if (dt == TS_F32) mse_backward_f32(a, b, ga, gb, n, (float)scale);
    else mse_backward_f64(a, b, ga, gb, n, scale);
    return TS_OK;
}

/* out[i] = table[idx[i]]: row copies, any dtype. */
static ts_status cpu_embedding(ts_dtype dt, const void *table, const int64_t *idx, void *out, int64_t n, int64_t D) {
    size_t row = (size_t)D * ts_dtype_size(dt);
#pragma omp parallel for schedule(static) if (n * D > TS_PAR_MIN)
    for (int64_t i = 0; i < n; i++) memcpy((char *)out + (size_t)i * row, (const char *)table + (size_t)idx[i] * row, row);
    return TS_OK;
}

static ts_status cpu_embedding_backward(ts_dtype dt, const int64_t *idx, const void *g, void *gtable, int64_t n,
                                        int64_t V, int64_t D) {
    if (dt == TS_F32) embedding_backward_f32(idx, g, gtable, n, V, D);
    else embedding_backward_f64(idx, g, gtable, n, V, D);
    return TS_OK;
}

static ts_status cpu_dropout(ts_dtype dt, ts_key key, const void *x, void *y, int64_t n, double p) {
    double scale = p < 1 ? 1 / (1 - p) : 0;
    if (dt == TS_F32) dropout_f32(key, x, y, n, (float)p, (float)scale);
    else dropout_f64(key, x, y, n, (float)p, scale);
    return TS_OK;
}

const ts_softmax_kernels TS_VARIANT(ts_cpu_softmax) = {cpu_softmax, cpu_softmax_backward};
const ts_layernorm_kernels TS_VARIANT(ts_cpu_layernorm) = {cpu_layernorm, cpu_layernorm_backward};
const ts_loss_kernels TS_VARIANT(ts_cpu_loss) = {cpu_cross_entropy, cpu_cross_entropy_backward, cpu_mse, cpu_mse_backward};
const ts_embedding_kernels TS_VARIANT(ts_cpu_embedding) = {cpu_embedding, cpu_embedding_backward};
const ts_dropout_kernels TS_VARIANT(ts_cpu_dropout) = {cpu_dropout};
