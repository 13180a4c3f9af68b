/* rowmath.h - shared inner loops of the row-wise fused ops (softmax,
 * layernorm, cross-entropy, embedding, attention): the maximum of a row, exp of a shifted row and
 * a vectorisable single-precision exp.
 *
 * Private to kernels/ops: static inline helpers, instantiated for float (_f)
 * and double (_d), on contiguous rows.
 */
#ifndef TS_OPS_CPU_ROWMATH_H
#define TS_OPS_CPU_ROWMATH_H

#include <math.h>
#include <stdint.h>

/* exp(x) for float, in plain arithmetic so a loop of it vectorises (libm's
 * expf does not without -ffast-math). x = n ln2 + r with |r| <= ln2/2, a
 * degree-6 polynomial for e^r, then 2^n through the exponent bits. Relative
 * error about 2 ulp on [-87.3, 88.3]; below that it returns 0, above +inf;
 * NaN stays NaN. */
static inline float ts_expf_fast(float x) {
    const float lo = -87.3365f, hi = 88.3762f;
    float xc = x < lo ? lo : (x > hi ? hi : x);
    /* round to nearest by the 1.5 * 2^23 trick (floorf would not vectorise) */
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = xc - n * 0.693359375f;  /* ln2 split: high part exact in float */
    r = r + n * 2.12194440e-4f;       /* minus (ln2 - 0.693359375) */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union {
        int32_t i;
        float f;
    } s = {.i = ((int32_t)n + 127) << 23}; /* a union, not memcpy: it vectorises */
    float y = p * s.f;
    y = x < lo ? 0.0f : y;
    y = x > hi ? INFINITY : y;
    return x != x ? x : y;
}

/* The exp each instantiation uses: fast for float, libm for double. */
static inline float ts_exp_f(float x) { return ts_expf_fast(x); }
static inline double ts_exp_d(double x) { return exp(x); }

/* TS_SIMD_S(clauses): "omp simd clauses" for float loops (S = f), nothing
 * for double (S = d), whose loops call libm's exp and only serve gradient
 * checks; so every requested vectorisation can be honoured. */
#define TS_PRAGMA(x) _Pragma(#x)
/* The simd requests are hints: under sanitizer instrumentation clang cannot
 * honour them and would report each loop (-Wpass-failed). */
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wpass-failed"
#endif
#define TS_SIMD_f(...) TS_PRAGMA(omp simd __VA_ARGS__)
#define TS_SIMD_d(...)

/* Instantiates, for type T with suffix S (f or d) and exp function EXP, on
 * rows of n contiguous elements:
 *   T ts_row_max_S(x, n)           max of the row (-inf when n == 0), in 16
 *                                  lanes so it vectorises without a pragma
 *   T ts_row_exp_S(x, y, n, m)     y[i] = exp(x[i] - m), returns their sum
 * x and y may alias (in-place). */
#define TS_ROWMATH_DEFINE(T, S, EXP)                                                                  \
    static inline T ts_row_max_##S(const T *x, int64_t n) {                                           \
        T part[16];                                                                                   \
        for (int j = 0; j < 16; j++) part[j] = -INFINITY;                                             \
        int64_t i = 0;                                                                                \
        for (; i + 16 <= n; i += 16)                                                                  \
            for (int j = 0; j < 16; j++) part[j] = x[i + j] > part[j] ? x[i + j] : part[j];           \
        T m = -INFINITY;                                                                              \
        for (; i < n; i++) m = x[i] > m ? x[i] : m;                                                   \
        for (int j = 0; j < 16; j++) m = part[j] > m ? part[j] : m;                                   \
        return m;                                                                                     \
    }                                                                                                 \
    static inline T ts_row_exp_##S(const T *x, T *y, int64_t n, T m) {                                \
        T s = 0;                                                                                      \
        TS_SIMD_##S(reduction(+ : s)) for (int64_t i = 0; i < n; i++) {                               \
            T e = EXP(x[i] - m);                                                                      \
            y[i] = e;                                                                                 \
            s += e;                                                                                   \
        }                                                                                             \
        return s;                                                                                     \
    }

TS_ROWMATH_DEFINE(float, f, ts_exp_f)
TS_ROWMATH_DEFINE(double, d, ts_exp_d)

#endif
