/* optim.cu - fused optimizer steps over flat f32 ranges in device memory
 * (one thread per element reads the gradient and state once and writes
 * parameter and state once), and the flat-buffer arithmetic of clipping
 * and mixed precision: squared norm, scale, bf16 rounding, accumulation. */
#include <cuda_bf16.h>

#include "kernels/ops/cuda/elem.cuh"
#include "kernels/ops/cuda/runtime.h"

/* torch.optim.SGD, as the CPU kernel. */
__global__ void sgd_kernel(ts_optim_run r) {
    FOR_EACH(i, r.n) {
        float d = r.grads[i];
        if (r.weight_decay != 0) d = d + r.weight_decay * r.params[i];
        if (r.s0) {
            float b = r.first ? d : r.momentum * r.s0[i] + r.damp_keep * d;
            r.s0[i] = b;
            d = r.nesterov ? d + r.momentum * b : b;
        }
        r.params[i] = r.params[i] - r.lr * d;
    }
}

/* torch.optim.Adam / AdamW, as the CPU kernel. */
__global__ void adam_kernel(ts_optim_run r) {
    FOR_EACH(i, r.n) {
        float pi = r.params[i] * r.shrink;
        float gi = r.grads[i] + r.l2 * pi;
        float mi = r.beta1 * r.s0[i] + r.one_minus_beta1 * gi;
        float vi = r.beta2 * r.s1[i] + r.one_minus_beta2 * gi * gi;
        r.s0[i] = mi;
        r.s1[i] = vi;
        r.params[i] = pi - r.step_size * (mi / (sqrtf(vi) / r.bc2_sqrt + r.eps));
    }
}

static ts_status cuda_sgd(const ts_optim_run *r) {
    if (r->n == 0) return TS_OK;
    sgd_kernel<<<ts_cuda_blocks(r->n), 256>>>(*r);
    return ts_cuda_launched("optim sgd");
}

static ts_status cuda_adam(const ts_optim_run *r) {
    if (r->n == 0) return TS_OK;
    adam_kernel<<<ts_cuda_blocks(r->n), 256>>>(*r);
    return ts_cuda_launched("optim adam");
}

__global__ void sq_norm_kernel(const float *g, int64_t n, double *total) {
    double s = 0;
    FOR_EACH(i, n) s += (double)g[i] * (double)g[i];
    s = block_sum(s);
    if (threadIdx.x == 0) atomicAdd(total, s);
}

static ts_status cuda_sq_norm(const float *g, int64_t n, double *sum) {
    *sum = 0;
    if (n == 0) return TS_OK;
    int dev;
    if (ts_cuda_status(cudaGetDevice(&dev), "grad norm")) return ts_last_status();
    double *t = (double *)ts_cuda_alloc(dev, sizeof(double));
    if (!t) return ts_last_status();
    ts_status st = ts_cuda_status(cudaMemsetAsync(t, 0, sizeof(double), 0), "grad norm");
    if (!st) {
        unsigned blocks = ts_cuda_blocks(n) < 1024 ? ts_cuda_blocks(n) : 1024;
        sq_norm_kernel<<<blocks, 256>>>(g, n, t);
        st = ts_cuda_launched("grad norm");
    }
    if (!st) st = ts_cuda_status(cudaMemcpy(sum, t, sizeof(double), cudaMemcpyDeviceToHost), "grad norm");
    ts_cuda_free(dev, t, sizeof(double));
    return st;
}

__global__ void scale_kernel(float *g, int64_t n, float factor) { FOR_EACH(i, n) g[i] *= factor; }

static ts_status cuda_scale(float *g, int64_t n, float factor) {
    if (n == 0) return TS_OK;
    scale_kernel<<<ts_cuda_blocks(n), 256>>>(g, n, factor);
    return ts_cuda_launched("scale");
}

__global__ void to_bf16_kernel(const float *x, __nv_bfloat16 *y, int64_t n) {
    FOR_EACH(i, n) y[i] = __float2bfloat16_rn(x[i]);
}

static ts_status cuda_to_bf16(const float *x, uint16_t *y, int64_t n) {
    if (n == 0) return TS_OK;
    to_bf16_kernel<<<ts_cuda_blocks(n), 256>>>(x, (__nv_bfloat16 *)y, n);
    return ts_cuda_launched("to bf16");
}

__global__ void accumulate_kernel(float *acc, const void *g, ts_dtype dt, int64_t n, float scale) {
    FOR_EACH(i, n) acc[i] += scale * (dt == TS_F32 ? ((const float *)g)[i]
                                                   : __bfloat162float(((const __nv_bfloat16 *)g)[i]));
}

static ts_status cuda_accumulate(float *acc, const void *g, ts_dtype dt, int64_t n, float scale) {
    if (n == 0) return TS_OK;
    accumulate_kernel<<<ts_cuda_blocks(n), 256>>>(acc, g, dt, n, scale);
    return ts_cuda_launched("accumulate");
}

extern "C" const ts_optim_kernels ts_cuda_optim = {cuda_sgd,     cuda_adam,       cuda_sq_norm,
                                                   cuda_scale,   cuda_to_bf16,    cuda_accumulate};
