/* matmul.cu - GEMM through cuBLAS: f32 (TF32 tensor cores when
 * ts_cuda_tf32(), accumulation in f32) and f64. Row-major C = alpha op(A)
 * op(B) + beta C is column-major C^T = op(B)^T op(A)^T, so cuBLAS is
 * called with the operands swapped and the same transpose flags. */
#include "kernels/ops/cuda/blas.h"
#include "kernels/ops/cuda/runtime.h"

static ts_status cuda_gemm(ts_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha,
                           const void *A, int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc) {
    if (M == 0 || N == 0) return TS_OK;
    if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || lda > INT32_MAX || ldb > INT32_MAX || ldc > INT32_MAX)
        return ts_error(TS_ERR_UNSUPPORTED, "matmul: [%lld,%lld] x [%lld,%lld] exceeds cuBLAS's int sizes",
                        (long long)M, (long long)K, (long long)K, (long long)N);
    cublasHandle_t h;
    const ts_cuda_blas_fns *blas = ts_cuda_blas("matmul", &h);
    if (!blas) return ts_last_status();
    cublasOperation_t oa = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, ob = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t s;
    if (dt == TS_F64) {
        s = blas->gemm_ex(h, ob, oa, (int)N, (int)M, (int)K, &alpha, B, CUDA_R_64F, (int)ldb, A, CUDA_R_64F, (int)lda,
                         &beta, C, CUDA_R_64F, (int)ldc, CUBLAS_COMPUTE_64F, CUBLAS_GEMM_DEFAULT);
    } else {
        float a = (float)alpha, b = (float)beta;
        cublasComputeType_t ct = ts_cuda_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
        s = blas->gemm_ex(h, ob, oa, (int)N, (int)M, (int)K, &a, B, CUDA_R_32F, (int)ldb, A, CUDA_R_32F, (int)lda, &b,
                         C, CUDA_R_32F, (int)ldc, ct, CUBLAS_GEMM_DEFAULT);
    }
    if (s != CUBLAS_STATUS_SUCCESS)
        return ts_error(TS_ERR_DEVICE, "matmul: cuBLAS says %s for [%lld,%lld] x [%lld,%lld] (%s)",
                        blas->status_string(s), (long long)M, (long long)K, (long long)K, (long long)N,
                        ts_dtype_name(dt));
    return TS_OK;
}

extern "C" const ts_matmul_kernels ts_cuda_matmul = {cuda_gemm};
