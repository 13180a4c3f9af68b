/* memory.c - CPU storage (the caching allocator), and copies and fills of
 * strided views, converting dtypes. */
#include <string.h>

#include "kernels/alloc.h"
#include "kernels/ops/cpu/cpu.h"

static void *cpu_alloc(int index, size_t nbytes) {
    (void)index;
    return ts_alloc(nbytes);
}

static void cpu_free(int index, void *data, size_t nbytes) {
    (void)index;
    ts_free(data, nbytes);
}

/* Host and "device" are the same memory. */
static ts_status cpu_move(int index, void *dst, const void *src, size_t nbytes) {
    (void)index;
    memmove(dst, src, nbytes);
    return TS_OK;
}

/* n contiguous elements between f32 and bf16 (either way). */
static void convert_bf16(ts_operand dst, ts_operand src, int64_t n) {
    if (dst.dtype == TS_BF16) {
        uint16_t *d = dst.data;
        const float *s = src.data;
#pragma omp parallel for simd if (n > 2 * TS_PAR_MIN)
        for (int64_t i = 0; i < n; i++) d[i] = ts_bf16_from_f32(s[i]);
    } else {
        float *d = dst.data;
        const uint16_t *s = src.data;
#pragma omp parallel for simd if (n > 2 * TS_PAR_MIN)
        for (int64_t i = 0; i < n; i++) d[i] = ts_f32_from_bf16(s[i]);
    }
}

/* One row of n elements at element offsets d and s, stepping dstep and
 * sstep: dst = src, or dst += src. A copy of contiguous rows of one dtype
 * is a memcpy; f32 and f64 pairs run in typed loops, others through
 * double. */
static void copy_row(ts_operand dst, ts_operand src, int64_t d, int64_t s, int64_t n, int64_t dstep, int64_t sstep,
                     bool acc) {
    size_t es = ts_dtype_size(dst.dtype);
    if (!acc && dst.dtype == src.dtype && dstep == 1 && sstep == 1) {
        memcpy((char *)dst.data + (size_t)d * es, (const char *)src.data + (size_t)s * es, (size_t)n * es);
    } else if (dst.dtype == TS_F32 && src.dtype == TS_F32) {
        float *dp = (float *)dst.data + d;
        const float *sp = (const float *)src.data + s;
        if (acc)
            for (int64_t j = 0; j < n; j++) dp[j * dstep] += sp[j * sstep];
        else
            for (int64_t j = 0; j < n; j++) dp[j * dstep] = sp[j * sstep];
    } else if (dst.dtype == TS_F64 && src.dtype == TS_F64 && acc) {
        double *dp = (double *)dst.data + d;
        const double *sp = (const double *)src.data + s;
        for (int64_t j = 0; j < n; j++) dp[j * dstep] += sp[j * sstep];
    } else {
        for (int64_t j = 0; j < n; j++, d += dstep, s += sstep) {
            double v = ts_elem_get(src.data, src.dtype, s);
            ts_elem_set(dst.data, dst.dtype, d, acc ? ts_elem_get(dst.data, dst.dtype, d) + v : v);
        }
    }
}

/* Contiguous fast paths: a memmove, the bf16 conversions, an f32 add. */
static bool copy_dense(int64_t n, ts_operand dst, ts_operand src, bool acc) {
    if (!acc && dst.dtype == src.dtype) {
        memmove(dst.data, src.data, (size_t)n * ts_dtype_size(src.dtype));
    } else if (!acc && ((dst.dtype == TS_BF16 && src.dtype == TS_F32) || (dst.dtype == TS_F32 && src.dtype == TS_BF16))) {
        convert_bf16(dst, src, n);
    } else if (acc && dst.dtype == TS_F32 && src.dtype == TS_F32) {
        float *d = dst.data;
        const float *s = src.data;
#pragma omp parallel for simd if (n > 2 * TS_PAR_MIN)
        for (int64_t i = 0; i < n; i++) d[i] += s[i];
    } else {
        return false;
    }
    return true;
}

static ts_status cpu_copy(int ndim, const int64_t *shape, ts_operand dst, ts_operand src, bool acc) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    if (n == 0) return TS_OK;
    if (ts_dense_strides(ndim, shape, dst.strides) && ts_dense_strides(ndim, shape, src.strides) &&
        copy_dense(n, dst, src, acc))
        return TS_OK;
    /* row by row of the last dim: one div/mod walk per row, then steps */
    int64_t last = ndim ? shape[ndim - 1] : 1, rows = n / last;
    int64_t dstep = ndim ? dst.strides[ndim - 1] : 0, sstep = ndim ? src.strides[ndim - 1] : 0;
#pragma omp parallel for if (n > TS_PAR_MIN)
    for (int64_t r = 0; r < rows; r++)
        copy_row(dst, src, ts_cpu_row_offset(ndim, shape, dst.strides, r),
                 ts_cpu_row_offset(ndim, shape, src.strides, r), last, dstep, sstep, acc);
    return TS_OK;
}

static ts_status cpu_fill(int ndim, const int64_t *shape, ts_operand dst, double v) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    bool flat = ts_dense_strides(ndim, shape, dst.strides);
    if (flat && v == 0.0 && !signbit(v)) {
        memset(dst.data, 0, (size_t)n * ts_dtype_size(dst.dtype));
    } else if (flat && dst.dtype == TS_F32) {
        float *p = dst.data, f = (float)v;
        for (int64_t i = 0; i < n; i++) p[i] = f;
    } else {
        for (int64_t i = 0; i < n; i++) {
            int64_t off = 0, rest = i;
            for (int d = ndim - 1; d >= 0; d--) {
                off += rest % shape[d] * dst.strides[d];
                rest /= shape[d];
            }
            ts_elem_set(dst.data, dst.dtype, off, v);
        }
    }
    return TS_OK;
}

const ts_memory_kernels TS_VARIANT(ts_cpu_memory) = {cpu_alloc, cpu_free, cpu_move, cpu_move, cpu_copy, cpu_fill};
