/* gemm.c - the CPU's matrix product: OpenBLAS's sgemm and dgemm (which
 * pick their own kernels for the CPU at run time). */
#include <cblas.h>

#include "kernels/ops/cpu/cpu.h"

/* The op has checked every size fits an int (BLAS's). */
static ts_status cpu_gemm(ts_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha,
                          const void *A, int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc) {
    enum CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
    if (dt == TS_F32)
        cblas_sgemm(CblasRowMajor, ta, tb, (int)M, (int)N, (int)K, (float)alpha, A, (int)lda, B, (int)ldb,
                    (float)beta, C, (int)ldc);
    else
        cblas_dgemm(CblasRowMajor, ta, tb, (int)M, (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C,
                    (int)ldc);
    return TS_OK;
}

const ts_matmul_kernels TS_VARIANT(ts_cpu_matmul) = {cpu_gemm};
