/* pointwise_t.h - the pointwise kernels of one dtype (a dtype template,
 * see cpu.h; included by pointwise.c): binary arithmetic over a plan's
 * walk, the maps with their derivatives, where. Math through <tgmath.h>,
 * so exp, tanh, ... are the float functions for float. */
#include "kernels/ops/cpu/dtype.h"

/* ---- binary ---- */

static inline T FN(add)(T x, T y) { return x + y; }
static inline T FN(sub)(T x, T y) { return x - y; }
static inline T FN(mul)(T x, T y) { return x * y; }
static inline T FN(div)(T x, T y) { return x / y; }

/* out = op(a, b) over units [lo, hi) of the plan's walk: elements (same,
 * scalar), rows (row, strided) or tiles (tiled). Inlined into one function
 * per op, so op is a direct call and the loops vectorise. */
static inline __attribute__((always_inline)) void FN(binary_walk)(T (*op)(T, T), const ts_binary_plan *pl,
                                                                   int64_t lo, int64_t hi) {
    const T *A = pl->a, *B = pl->b;
    T *O = pl->out;
    const int64_t P = pl->period, nd = pl->ndim;
    switch (pl->walk) {
    case TS_WALK_SAME:
#pragma omp simd
        for (int64_t i = lo; i < hi; i++) O[i] = op(A[i], B[i]);
        break;
    case TS_WALK_A_SCALAR:
#pragma omp simd
        for (int64_t i = lo; i < hi; i++) O[i] = op(A[0], B[i]);
        break;
    case TS_WALK_B_SCALAR:
#pragma omp simd
        for (int64_t i = lo; i < hi; i++) O[i] = op(A[i], B[0]);
        break;
    case TS_WALK_A_ROW:
        for (int64_t r = lo; r < hi; r++)
#pragma omp simd
            for (int64_t j = 0; j < P; j++) O[r * P + j] = op(A[j], B[r * P + j]);
        break;
    case TS_WALK_B_ROW:
        for (int64_t r = lo; r < hi; r++)
#pragma omp simd
            for (int64_t j = 0; j < P; j++) O[r * P + j] = op(A[r * P + j], B[j]);
        break;
    case TS_WALK_STRIDED: {
        const int64_t L = nd ? pl->shape[nd - 1] : 1, la = nd ? pl->sa[nd - 1] : 0, lb = nd ? pl->sb[nd - 1] : 0;
        for (int64_t r = lo; r < hi; r++) {
            const T *Ar = A + ts_cpu_row_offset(nd, pl->shape, pl->sa, r);
            const T *Br = B + ts_cpu_row_offset(nd, pl->shape, pl->sb, r);
            for (int64_t j = 0; j < L; j++) O[r * L + j] = op(Ar[j * la], Br[j * lb]);
        }
    } break;
    case TS_WALK_TILED: {
        const int64_t R = pl->shape[nd - 2], L = pl->shape[nd - 1], ra = pl->sa[nd - 2], rb = pl->sb[nd - 2];
        const int64_t la = pl->sa[nd - 1], lb = pl->sb[nd - 1];
        const int64_t tr = (R + TS_TILE - 1) / TS_TILE, tc = (L + TS_TILE - 1) / TS_TILE;
        for (int64_t t = lo; t < hi; t++) {
            const int64_t p = t / (tr * tc), r0 = (t / tc) % tr * TS_TILE, c0 = t % tc * TS_TILE;
            const int64_t r1 = r0 + TS_TILE < R ? r0 + TS_TILE : R, c1 = c0 + TS_TILE < L ? c0 + TS_TILE : L;
            const T *Ap = A + ts_cpu_row_offset(nd - 1, pl->shape, pl->sa, p);
            const T *Bp = B + ts_cpu_row_offset(nd - 1, pl->shape, pl->sb, p);
            T *Op = O + p * R * L;
            for (int64_t r = r0; r < r1; r++)
                for (int64_t j = c0; j < c1; j++) Op[r * L + j] = op(Ap[r * ra + j * la], Bp[r * rb + j * lb]);
        }
    } break;
    }
}

static void FN(add_range)(const void *pl, int64_t lo, int64_t hi) { FN(binary_walk)(FN(add), pl, lo, hi); }
static void FN(sub_range)(const void *pl, int64_t lo, int64_t hi) { FN(binary_walk)(FN(sub), pl, lo, hi); }
static void FN(mul_range)(const void *pl, int64_t lo, int64_t hi) { FN(binary_walk)(FN(mul), pl, lo, hi); }
static void FN(div_range)(const void *pl, int64_t lo, int64_t hi) { FN(binary_walk)(FN(div), pl, lo, hi); }

static void FN(binary)(ts_binary_kind kind, const ts_binary_plan *pl) {
    static void (*const ranges[])(const void *, int64_t, int64_t) = {FN(add_range), FN(sub_range), FN(mul_range),
                                                                       FN(div_range)};
    ts_cpu_split(binary_units(pl), pl->n, ranges[kind], pl);
}

/* ---- maps ---- */

/* d = 1 + e^(-2u) for the gelu, u = k (x + a x^3), e^ the vectorisable
 * ts_expf_fast for float, libm for double: (1 + tanh u) / 2 = 1 / d, so
 * y = x / d, with no tanh and no cancellation for negative x (d goes to
 * +inf and y to -0 there, to 1 and x for large x). */
static inline T FN(gelu_den)(T x) {
    return (T)1 + EXP(x * ((T)(-2 * GELU_K) + (T)(-2 * GELU_K * GELU_A) * x * x));
}

/* y = f(x; p) over [lo, hi) of a map_args. */
static void FN(map_range)(const void *ctx, int64_t lo, int64_t hi) {
    const map_args *a = ctx;
    const T *x = a->x, p = (T)a->p;
    T *y = a->out;
    switch (a->kind) {
    case TS_MAP_NEG: SIMD() for (int64_t i = lo; i < hi; i++) y[i] = -x[i]; break;
    case TS_MAP_ADD_SCALAR: SIMD() for (int64_t i = lo; i < hi; i++) y[i] = x[i] + p; break;
    case TS_MAP_MUL_SCALAR: SIMD() for (int64_t i = lo; i < hi; i++) y[i] = x[i] * p; break;
    case TS_MAP_POW: for (int64_t i = lo; i < hi; i++) y[i] = pow(x[i], p); break;
    case TS_MAP_EXP: for (int64_t i = lo; i < hi; i++) y[i] = exp(x[i]); break;
    case TS_MAP_LOG: for (int64_t i = lo; i < hi; i++) y[i] = log(x[i]); break;
    case TS_MAP_SQRT: SIMD() for (int64_t i = lo; i < hi; i++) y[i] = sqrt(x[i]); break;
    case TS_MAP_ABS: SIMD() for (int64_t i = lo; i < hi; i++) y[i] = fabs(x[i]); break;
    case TS_MAP_RELU: SIMD() for (int64_t i = lo; i < hi; i++) y[i] = x[i] > 0 ? x[i] : (T)0; break;
    case TS_MAP_GELU:
        SIMD() for (int64_t i = lo; i < hi; i++) y[i] = x[i] / FN(gelu_den)(x[i]);
        break;
    case TS_MAP_SIGMOID: /* exp of -|x| only, so neither branch overflows */
        for (int64_t i = lo; i < hi; i++)
            y[i] = x[i] >= 0 ? (T)1 / ((T)1 + exp(-x[i])) : exp(x[i]) / ((T)1 + exp(x[i]));
        break;
    case TS_MAP_TANH: for (int64_t i = lo; i < hi; i++) y[i] = tanh(x[i]); break;
    default: break;
    }
}

/* gx = g f'(x) over [lo, hi) of a map_args, from g, x and the output y. */
static void FN(map_backward_range)(const void *ctx, int64_t lo, int64_t hi) {
    const map_args *a = ctx;
    const T *g = a->g, *x = a->x, *y = a->y, p = (T)a->p;
    T *gx = a->out;
    switch (a->kind) {
    case TS_MAP_NEG: SIMD() for (int64_t i = lo; i < hi; i++) gx[i] = -g[i]; break;
    case TS_MAP_ADD_SCALAR: SIMD() for (int64_t i = lo; i < hi; i++) gx[i] = g[i]; break;
    case TS_MAP_MUL_SCALAR: SIMD() for (int64_t i = lo; i < hi; i++) gx[i] = g[i] * p; break;
    case TS_MAP_POW: for (int64_t i = lo; i < hi; i++) gx[i] = p == 0 ? (T)0 : g[i] * p * pow(x[i], p - (T)1); break;
    case TS_MAP_EXP: SIMD() for (int64_t i = lo; i < hi; i++) gx[i] = g[i] * y[i]; break;
    case TS_MAP_LOG: SIMD() for (int64_t i = lo; i < hi; i++) gx[i] = g[i] / x[i]; break;
    case TS_MAP_SQRT: SIMD() for (int64_t i = lo; i < hi; i++) gx[i] = g[i] / ((T)2 * y[i]); break;
    case TS_MAP_ABS: SIMD() for (int64_t i = lo; i < hi; i++) gx[i] = x[i] > 0 ? g[i] : x[i] < 0 ? -g[i] : (T)0; break;
    /* y > 0 exactly where x > 0 (NaN gives 0 either way) */
    case TS_MAP_RELU: SIMD() for (int64_t i = lo; i < hi; i++) gx[i] = y[i] > 0 ? g[i] : (T)0; break;
    case TS_MAP_GELU: /* s (1 + 2 x (1 - s) k (1 + 3 a x^2)), s = (1 + tanh u) / 2 */
        SIMD() for (int64_t i = lo; i < hi; i++) {
            T s = (T)1 / FN(gelu_den)(x[i]);
            gx[i] = g[i] * (s * ((T)1 + x[i] * ((T)1 - s) * (T)(2 * GELU_K) * ((T)1 + (T)(3 * GELU_A) * x[i] * x[i])));
        }
        break;
    case TS_MAP_SIGMOID: SIMD() for (int64_t i = lo; i < hi; i++) gx[i] = g[i] * y[i] * ((T)1 - y[i]); break;
    case TS_MAP_TANH: SIMD() for (int64_t i = lo; i < hi; i++) gx[i] = g[i] * ((T)1 - y[i] * y[i]); break;
    default: break;
    }
}

/* ---- where ---- */

/* out = mask ? a : b over rows [lo, hi) of a where_args. */
static void FN(where_range)(const void *ctx, int64_t lo, int64_t hi) {
    const where_args *w = ctx;
    const int nd = w->ndim;
    const int64_t *shape = w->shape, *sm = w->mask.strides, *sa = w->a.strides, *sb = w->b.strides;
    const int64_t L = nd ? shape[nd - 1] : 1, lm = nd ? sm[nd - 1] : 0, la = nd ? sa[nd - 1] : 0,
                  lb = nd ? sb[nd - 1] : 0;
    for (int64_t r = lo; r < hi; r++) {
        const uint8_t *M = (const uint8_t *)w->mask.data + ts_cpu_row_offset(nd, shape, sm, r);
        const T *A = (const T *)w->a.data + ts_cpu_row_offset(nd, shape, sa, r);
        const T *B = (const T *)w->b.data + ts_cpu_row_offset(nd, shape, sb, r);
        T *O = (T *)w->out + r * L;
        for (int64_t j = 0; j < L; j++) O[j] = M[j * lm] ? A[j * la] : B[j * lb];
    }
}
