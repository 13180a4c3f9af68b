/* optim.c - CPU kernels of the optimizer steps and of flat-buffer
 * arithmetic (clipping, mixed precision), over f32 ranges. OpenMP over a
 * range once it is longer than TS_PAR_MIN. */
#include <math.h>

#include "kernels/ops/cpu/cpu.h"

/* torch.optim.SGD: weight decay into the gradient, the momentum buffer
 * started with the first gradient, Nesterov optional. */
static ts_status cpu_sgd(const ts_optim_run *r) {
    const float lr = r->lr, wd = r->weight_decay, mom = r->momentum, damp = r->damp_keep;
    const bool first = r->first, nesterov = r->nesterov, use_buf = r->s0 != NULL;
    float *restrict p = r->params, *restrict buf = r->s0;
    const float *restrict g = r->grads;
    const int64_t n = r->n;
#pragma omp parallel for if (n > TS_PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float d = g[i];
        if (wd != 0) d = d + wd * p[i];
        if (use_buf) {
            float b = first ? d : mom * buf[i] + damp * d;
            buf[i] = b;
            d = nesterov ? d + mom * b : b;
        }
        p[i] = p[i] - lr * d;
    }
    return TS_OK;
}

/* torch.optim.Adam / AdamW: L2 decay into the gradient (l2) or decoupled
 * (shrink), bias-corrected moments. */
static ts_status cpu_adam(const ts_optim_run *r) {
    const float step_size = r->step_size, bc2_sqrt = r->bc2_sqrt, b1 = r->beta1, b2 = r->beta2, eps = r->eps;
    const float c1 = r->one_minus_beta1, c2 = r->one_minus_beta2, l2 = r->l2, shrink = r->shrink;
    float *restrict p = r->params, *restrict m = r->s0, *restrict v = r->s1;
    const float *restrict g = r->grads;
    const int64_t n = r->n;
#pragma omp parallel for if (n > TS_PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float pi = p[i] * shrink;
        float gi = g[i] + l2 * pi;
        float mi = b1 * m[i] + c1 * gi;
        float vi = b2 * v[i] + c2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        p[i] = pi - step_size * (mi / denom);
    }
    return TS_OK;
}

static ts_status cpu_sq_norm(const float *g, int64_t n, double *sum) {
    double s = 0;
#pragma omp parallel for simd if (n > TS_PAR_MIN) schedule(static) reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += (double)g[i] * (double)g[i];
    *sum = s;
    return TS_OK;
}

static ts_status cpu_scale(float *g, int64_t n, float factor) {
#pragma omp parallel for if (n > TS_PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) g[i] *= factor;
    return TS_OK;
}

static ts_status cpu_to_bf16(const float *x, uint16_t *y, int64_t n) {
#pragma omp parallel for if (n > TS_PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) y[i] = ts_bf16_from_f32(x[i]);
    return TS_OK;
}

static ts_status cpu_accumulate(float *acc, const void *g, ts_dtype dt, int64_t n, float scale) {
    if (dt == TS_F32) {
        const float *gf = g;
#pragma omp parallel for if (n > TS_PAR_MIN) schedule(static)
        for (int64_t i = 0; i < n; i++) acc[i] += scale * gf[i];
    } else {
        const uint16_t *gb = g;
#pragma omp parallel for if (n > TS_PAR_MIN) schedule(static)
        for (int64_t i = 0; i < n; i++) acc[i] += scale * ts_f32_from_bf16(gb[i]);
    }
    return TS_OK;
}

const ts_optim_kernels TS_VARIANT(ts_cpu_optim) = {cpu_sgd, cpu_adam, cpu_sq_norm, cpu_scale, cpu_to_bf16, cpu_accumulate};
