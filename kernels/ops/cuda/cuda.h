/* cuda.h - what the CUDA backend's files share (the .cu files of ops/cuda and backend.c):
 * the kernel tables of each family and the launch helpers. Included from C
 * and from CUDA C++.
 *
 * Kernels run on the calling thread's current device and its compute
 * stream (runtime.h); they check the launch and return without waiting,
 * except those that hand a value to the host (losses, norms), which wait
 * for it. Float kernels take f32 or f64 (bf16 reaches kernels only in
 * copies and the optimizer's conversions, as on the CPU).
 */
#ifndef TS_OPS_CUDA_CUDA_H
#define TS_OPS_CUDA_CUDA_H

#ifdef __cplusplus
/* tensor.h's storage and tensor declare C11 _Atomic counters, which C++
 * does not parse; the CUDA files only use the kernel-table types of
 * backend.h and never touch those structs. */
#define _Atomic volatile
extern "C" {
#endif

#include "kernels/ops/backend.h"

/* The table (backend.c), built into ops/backend.c's list. */
extern const ts_backend ts_cuda_backend;

extern const ts_memory_kernels ts_cuda_memory;
extern const ts_pointwise_kernels ts_cuda_pointwise;
extern const ts_reduce_kernels ts_cuda_reduce;
extern const ts_softmax_kernels ts_cuda_softmax;
extern const ts_layernorm_kernels ts_cuda_layernorm;
extern const ts_loss_kernels ts_cuda_loss;
extern const ts_embedding_kernels ts_cuda_embedding;
extern const ts_dropout_kernels ts_cuda_dropout;
extern const ts_matmul_kernels ts_cuda_matmul;
extern const ts_attention_kernels ts_cuda_attention;
extern const ts_conv_kernels ts_cuda_conv;
extern const ts_pool_kernels ts_cuda_pool;
extern const ts_optim_kernels ts_cuda_optim;

/* TS_OK after a launch that went well, else an error "op: CUDA says ...". */
ts_status ts_cuda_launched(const char *op);

/* err as "op: CUDA says ..." (TS_OK for cudaSuccess, given as an int so
 * that this header needs no CUDA header). */
ts_status ts_cuda_status(int err, const char *op);

/* The most devices the backend's per-device tables hold. */
#define TS_CUDA_MAX_DEVICES 64

/* Blocks of a 1-d launch of n threads, 256 per block, capped. */
static inline unsigned ts_cuda_blocks(int64_t n) {
    int64_t b = (n + 255) / 256;
    return (unsigned)(b < 1 ? 1 : b > 65535 * 16 ? 65535 * 16 : b);
}

#ifdef __cplusplus
}
#endif

#endif
