/* blas.c - cuBLAS opened with dlopen at the first GEMM, and one handle per
 * thread and device. */
#include "kernels/ops/cuda/blas.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static ts_cuda_blas_fns fns;
static cublasStatus_t (*create)(cublasHandle_t *h);
static char open_error[512]; /* why cuBLAS could not be opened, "" when it was */

/* Opens cuBLAS: the file found at configure time first (TS_CUBLAS_PATH),
 * then its soname through the loader's search path. */
static void open_cublas(void) {
    void *lib = dlopen(TS_CUBLAS_PATH, RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen(TS_CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(open_error, sizeof open_error, "cannot open %s: %s", TS_CUBLAS_SONAME, dlerror());
        return;
    }
    /* POSIX lets a data pointer carry a function's address (dlsym) */
    *(void **)&create = dlsym(lib, "cublasCreate_v2");
    *(void **)&fns.gemm_ex = dlsym(lib, "cublasGemmEx");
    *(void **)&fns.status_string = dlsym(lib, "cublasGetStatusString");
    if (!create || !fns.gemm_ex || !fns.status_string)
        snprintf(open_error, sizeof open_error, "%s lacks cublasCreate_v2, cublasGemmEx or cublasGetStatusString",
                 TS_CUBLAS_SONAME);
}

static _Thread_local cublasHandle_t handles[TS_CUDA_MAX_DEVICES];

const ts_cuda_blas_fns *ts_cuda_blas(const char *op, cublasHandle_t *handle) {
    pthread_once(&once, open_cublas);
    if (open_error[0]) {
        ts_error(TS_ERR_DEVICE, "%s: cuBLAS: %s", op, open_error);
        return NULL;
    }
    int dev = 0;
    if (ts_cuda_status(cudaGetDevice(&dev), op)) return NULL;
    if (dev < 0 || dev >= TS_CUDA_MAX_DEVICES) {
        ts_error(TS_ERR_DEVICE, "%s: device %d is beyond the %d this build handles", op, dev, TS_CUDA_MAX_DEVICES);
        return NULL;
    }
    if (!handles[dev] && create(&handles[dev]) != CUBLAS_STATUS_SUCCESS) {
        handles[dev] = NULL;
        ts_error(TS_ERR_DEVICE, "%s: cuBLAS could not start on cuda:%d", op, dev);
        return NULL;
    }
    *handle = handles[dev];
    return &fns;
}
