/* rowmath.h - shared inner loops of the row-wise CPU kernels (softmax,
 * cross-entropy, attention): a vectorisable single-precision exp, the
 * maximum of a row and exp of a shifted row.
 *
 * Private to kernels/ops/cpu: static inline helpers on contiguous rows,
 * for float (_f32) and double (_f64).
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
    float xc = x >= lo ? (x > hi ? hi : x) : lo; /* NaN too goes to lo: (int32_t)NaN below is undefined */
    /* round to nearest by the 1.5 * 2^23 trick (floorf would not vectorise) */
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = xc - n * 0.693359375f;  /* ln2 split: high part exact in float */
    r = r + n * 2.12194440e-4f;       /* minus (ln2 - 0.693359375) */
    /* e^r = 1 + r + r^2 q(r), q of degree 5 in Estrin's form: three
     * independent pairs, so the chain of dependent operations is 6 long
     * rather than Horner's 12 (the loops are latency bound) */
    float r2 = r * r, r4 = r2 * r2;
    float q01 = 1.6666665459e-1f * r + 5.0000001201e-1f;
    float q23 = 8.3334519073e-3f * r + 4.1665795894e-2f;
    float q45 = 1.9875691500e-4f * r + 1.3981999507e-3f;
    float q = (q23 * r2 + q01) + q45 * r4;
    float p = q * r2 + r + 1.0f;
    union {
        int32_t i;
        float f;
    } s = {.i = ((int32_t)n + 127) << 23}; /* a union, not memcpy: it vectorises */
    float y = p * s.f;
    y = x < lo ? 0.0f : y;
    y = x > hi ? INFINITY : y;
    return x != x ? x : y;
}

/* "_Pragma" of its argument, for pragmas built by macros. */
#define TS_PRAGMA(x) _Pragma(#x)
/* The simd requests are hints: under sanitizer instrumentation clang cannot
 * honour them and would report each loop (-Wpass-failed). */
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wpass-failed"
#endif

/* The maximum of a row of n floats (-inf when n == 0), in 16 lanes so it
 * vectorises without a pragma; NaN never wins. */
static inline float ts_row_max_f32(const float *x, int64_t n) {
    float part[16];
    for (int j = 0; j < 16; j++) part[j] = -INFINITY;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) part[j] = x[i + j] > part[j] ? x[i + j] : part[j];
    float m = -INFINITY;
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    for (int j = 0; j < 16; j++) m = part[j] > m ? part[j] : m;
    return m;
}

/* y[i] = exp(x[i] - m) over a row of n floats; returns their sum. x and y
 * may alias. */
static inline float ts_row_exp_f32(const float *x, float *y, int64_t n, float m) {
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) {
        float e = ts_expf_fast(x[i] - m);
        y[i] = e;
        s += e;
    }
    return s;
}

/* The same two for doubles (gradient checks): plain loops and libm. */
static inline double ts_row_max_f64(const double *x, int64_t n) {
    double m = -INFINITY;
    for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

static inline double ts_row_exp_f64(const double *x, double *y, int64_t n, double m) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += y[i] = exp(x[i] - m);
    return s;
}

#endif
