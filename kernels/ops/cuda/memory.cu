/* memory.cu - CUDA storage (the caching allocator of runtime.h), copies
 * between host and device, and copies and fills of strided views,
 * converting dtypes. */
#include <cuda_runtime.h>

#include "kernels/ops/cuda/elem.cuh"
#include "kernels/ops/cuda/runtime.h"

static void *cuda_alloc(int index, size_t nbytes) { return ts_cuda_alloc(index, nbytes); }

static void cuda_free(int index, void *data, size_t nbytes) { ts_cuda_free(index, data, nbytes); }

static ts_status cuda_upload(int index, void *dst, const void *host, size_t nbytes) {
    ts_status st = ts_cuda_set_device(index);
    return st ? st : ts_cuda_status(cudaMemcpy(dst, host, nbytes, cudaMemcpyHostToDevice), "upload");
}

static ts_status cuda_download(int index, void *host, const void *src, size_t nbytes) {
    ts_status st = ts_cuda_set_device(index);
    return st ? st : ts_cuda_status(cudaMemcpy(host, src, nbytes, cudaMemcpyDeviceToHost), "download");
}

/* dst = src (or += when acc) elementwise over the walks' shape. */
__global__ void copy_kernel(int64_t n, void *dst, ts_dtype ddt, walk dw, const void *src, ts_dtype sdt, walk sw,
                            bool acc) {
    FOR_EACH(i, n) {
        int64_t d = walk_offset(dw, i);
        double v = elem_get(src, sdt, walk_offset(sw, i));
        elem_set(dst, ddt, d, acc ? elem_get(dst, ddt, d) + v : v);
    }
}

static ts_status cuda_copy(int ndim, const int64_t *shape, ts_operand dst, ts_operand src, bool accumulate) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    if (n == 0) return TS_OK;
    if (!accumulate && dst.dtype == src.dtype && ts_dense_strides(ndim, shape, dst.strides) &&
        ts_dense_strides(ndim, shape, src.strides))
        return ts_cuda_status(
            cudaMemcpyAsync(dst.data, src.data, (size_t)n * ts_dtype_size(dst.dtype), cudaMemcpyDeviceToDevice, 0),
            "copy");
    copy_kernel<<<ts_cuda_blocks(n), 256>>>(n, dst.data, dst.dtype, make_walk(ndim, shape, dst.strides), src.data,
                                            src.dtype, make_walk(ndim, shape, src.strides), accumulate);
    return ts_cuda_launched("copy");
}

/* Every element of dst over the walk's shape = v. */
__global__ void fill_kernel(int64_t n, void *dst, ts_dtype dt, walk w, double v) {
    FOR_EACH(i, n) elem_set(dst, dt, walk_offset(w, i), v);
}

static ts_status cuda_fill(int ndim, const int64_t *shape, ts_operand dst, double value) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    if (n == 0) return TS_OK;
    if (value == 0 && !signbit(value) && ts_dense_strides(ndim, shape, dst.strides))
        return ts_cuda_status(cudaMemsetAsync(dst.data, 0, (size_t)n * ts_dtype_size(dst.dtype), 0), "fill");
    fill_kernel<<<ts_cuda_blocks(n), 256>>>(n, dst.data, dst.dtype, make_walk(ndim, shape, dst.strides), value);
    return ts_cuda_launched("fill");
}

extern "C" const ts_memory_kernels ts_cuda_memory = {cuda_alloc, cuda_free, cuda_upload, cuda_download,
                                                     cuda_copy, cuda_fill};
