/* cpu.h - what the CPU kernel files share. Private to kernels/ops/cpu.
 *
 * Every file here but capability.c is compiled once per CPU capability
 * (capability.h) with that target's flags and -DTS_CPU_CAP=default, avx2
 * or avx512; TS_VARIANT(name) gives a symbol of this variant its suffix
 * (ts_cpu_layernorm_avx2), so the variants link side by side. Each file
 * ends with the kernel table of its op family; backend.c gathers them
 * into the variant's ts_backend.
 *
 * The vector width and register count of the variant's target (what the
 * register tiles are sized by) come from the compiler's target macros.
 *
 * Kernels with a float and a double version are written once, in a
 * dtype template `<family>_t.h`: the family's .c file includes it once
 * with TS_DT 32 and once with TS_DT 64, and the template starts by
 * including dtype.h, which defines T (the element type), FN(name) (name_f32
 * or name_f64) and the helpers whose float and double forms differ.
 */
#ifndef TS_OPS_CPU_CPU_H
#define TS_OPS_CPU_CPU_H

#include <omp.h>

#include "kernels/alloc.h"
#include "kernels/ops/backend.h"

#ifndef TS_CPU_CAP
#error "the CPU kernels are compiled with -DTS_CPU_CAP=<capability> (see kernels/CMakeLists.txt)"
#endif

#define TS_CPU_PASTE(a, b) a##_##b
#define TS_CPU_NAME(a, b) TS_CPU_PASTE(a, b)
#define TS_VARIANT(name) TS_CPU_NAME(name, TS_CPU_CAP)
#define TS_CPU_QUOTE(x) #x
#define TS_CPU_STRING(x) TS_CPU_QUOTE(x)

/* Bytes per vector register and how many there are. */
#if defined(__AVX512F__)
#define TS_VEC_BYTES 64
#define TS_VEC_REGS 32
#elif defined(__AVX__)
#define TS_VEC_BYTES 32
#define TS_VEC_REGS 16
#elif defined(__aarch64__)
#define TS_VEC_BYTES 16
#define TS_VEC_REGS 32
#else
#define TS_VEC_BYTES 16
#define TS_VEC_REGS 16
#endif

/* Loops of at most this many elements (or multiply-adds) stay on one
 * thread. */
#define TS_PAR_MIN 32768

/* Offset (elements) of the first element of row `row`, the rows being the
 * last dim of shape, in a view with the given strides. */
static inline int64_t ts_cpu_row_offset(int ndim, const int64_t *shape, const int64_t *strides, int64_t row) {
    int64_t off = 0;
    for (int d = ndim - 2; d >= 0; d--) {
        off += (row % shape[d]) * strides[d];
        row /= shape[d];
    }
    return off;
}

/* Calls fn(ctx, lo, hi) on ranges covering [0, n): the whole of it when
 * work is at most TS_PAR_MIN, else one even share per OpenMP thread (as a
 * static schedule would). */
static inline void ts_cpu_split(int64_t n, int64_t work, void (*fn)(const void *ctx, int64_t lo, int64_t hi),
                                const void *ctx) {
    if (work <= TS_PAR_MIN) {
        fn(ctx, 0, n);
        return;
    }
#pragma omp parallel
    {
        int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
        fn(ctx, n * t / nt, n * (t + 1) / nt);
    }
}

/* Scratch of n elements of es bytes from the caching allocator (so its
 * statistics count it); NULL with "op: out of memory ..." when it fails.
 * Freed with ts_cpu_scratch_free(p, n, es). */
static inline void *ts_cpu_scratch(const char *op, int64_t n, size_t es) {
    void *p = ts_alloc((size_t)n * es);
    if (!p) ts_error(TS_ERR_MEMORY, "%s: out of memory for %zu bytes of scratch", op, (size_t)n * es);
    return p;
}
static inline void ts_cpu_scratch_free(void *p, int64_t n, size_t es) {
    if (p) ts_free(p, (size_t)n * es);
}

extern const ts_memory_kernels TS_VARIANT(ts_cpu_memory);
extern const ts_pointwise_kernels TS_VARIANT(ts_cpu_pointwise);
extern const ts_reduce_kernels TS_VARIANT(ts_cpu_reduce);
extern const ts_softmax_kernels TS_VARIANT(ts_cpu_softmax);
extern const ts_layernorm_kernels TS_VARIANT(ts_cpu_layernorm);
extern const ts_loss_kernels TS_VARIANT(ts_cpu_loss);
extern const ts_embedding_kernels TS_VARIANT(ts_cpu_embedding);
extern const ts_dropout_kernels TS_VARIANT(ts_cpu_dropout);
extern const ts_matmul_kernels TS_VARIANT(ts_cpu_matmul);
extern const ts_attention_kernels TS_VARIANT(ts_cpu_attention);
extern const ts_conv_kernels TS_VARIANT(ts_cpu_conv);
extern const ts_pool_kernels TS_VARIANT(ts_cpu_pool);
extern const ts_optim_kernels TS_VARIANT(ts_cpu_optim);

#endif
