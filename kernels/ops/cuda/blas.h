/* blas.h - cuBLAS for the CUDA backend, opened at the first GEMM instead of
 * linked: cuBLAS's start-up costs every process that loads it a few tenths
 * of a second, which the ps, the scheduler's peers and every CPU-only run
 * would pay without ever touching a GPU (TESSERA_WITH_CUDA builds only). */
#ifndef TS_OPS_CUDA_BLAS_H
#define TS_OPS_CUDA_BLAS_H

#include <cublas_v2.h>

#include "kernels/ops/cuda/cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The cuBLAS functions the backend calls. */
typedef struct ts_cuda_blas_fns {
    cublasStatus_t (*gemm_ex)(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                              const void *alpha, const void *A, cudaDataType ta_type, int lda, const void *B,
                              cudaDataType tb_type, int ldb, const void *beta, void *C, cudaDataType tc_type,
                              int ldc, cublasComputeType_t compute, cublasGemmAlgo_t algo);
    const char *(*status_string)(cublasStatus_t s);
} ts_cuda_blas_fns;

/* The cuBLAS functions and, in *handle, the calling thread's cuBLAS handle
 * on its current device (made at its first use); NULL with an error naming
 * op when cuBLAS cannot be opened or started. */
const ts_cuda_blas_fns *ts_cuda_blas(const char *op, cublasHandle_t *handle);

#ifdef __cplusplus
}
#endif

#endif
