/* backend.c - the CUDA backend: the kernel tables of the family files
 * (the .cu files of ops/cuda), gathered. */
#include "kernels/ops/cuda/cuda.h"

const ts_backend ts_cuda_backend = {
    .name = "cuda",
    .capability = "sm_90",
    .memory = &ts_cuda_memory,
    .pointwise = &ts_cuda_pointwise,
    .reduce = &ts_cuda_reduce,
    .softmax = &ts_cuda_softmax,
    .layernorm = &ts_cuda_layernorm,
    .loss = &ts_cuda_loss,
    .embedding = &ts_cuda_embedding,
    .dropout = &ts_cuda_dropout,
    .matmul = &ts_cuda_matmul,
    .attention = &ts_cuda_attention,
    .conv = &ts_cuda_conv,
    .pool = &ts_cuda_pool,
    .optim = &ts_cuda_optim,
};
