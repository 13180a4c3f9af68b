/* elementwise.c - broadcasting binary arithmetic, the pointwise map driver
 * and the unary arithmetic ops, forward and backward. */
#include "kernels/ops/elementwise.h"

#include <string.h>
#include <tgmath.h>

#include "kernels/autograd.h"
#include "kernels/ops/view.h"

/* `omp simd` is a hint: sanitizer and -O1 builds of clang cannot always
 * vectorize and would otherwise turn that into an error under -Werror. */
#ifdef __clang__
#pragma clang diagnostic ignored "-Wpass-failed"
#endif

/* ---- shared helpers ---- */

ts_tensor *ts_float_input(const char *op, const char *arg, ts_tensor *x) {
    if (ts_check_tensor(op, arg, x, TS_FLOATS | TS_MASK(TS_BF16))) return NULL;
    return x->dtype == TS_BF16 ? ts_to_dtype(x, TS_F32) : ts_tensor_retain(x);
}

void ts_broadcast_strides(const ts_tensor *t, int ndim, const int64_t *shape, int64_t *strides) {
    int lead = ndim - t->ndim;
    for (int d = 0; d < ndim; d++) {
        int td = d - lead;
        strides[d] = (td < 0 || (t->shape[td] == 1 && shape[d] != 1)) ? 0 : t->strides[td];
    }
}

int64_t ts_row_offset(int ndim, const int64_t *shape, const int64_t *strides, int64_t row) {
    int64_t off = 0;
    for (int d = ndim - 2; d >= 0; d--) {
        off += (row % shape[d]) * strides[d];
        row /= shape[d];
    }
    return off;
}

/* g in dtype dt (g retained when it already is). */
static ts_tensor *grad_in_dtype(ts_tensor *g, ts_dtype dt) {
    return g->dtype == dt ? ts_tensor_retain(g) : ts_tensor_copy_as(g, dt);
}

/* ---- binary ops: plan + kernels ---- */

typedef enum { BIN_SAME, BIN_A_SCALAR, BIN_B_SCALAR, BIN_A_ROW, BIN_B_ROW, BIN_STRIDED, BIN_TILED } bin_kind;

#define TILE 32 /* BIN_TILED: square tiles of the last two dims, for operands read across their rows */

/* How one binary kernel call walks its operands. a and b point at the first
 * element of each view; `period` is the length of the repeated row operand;
 * the strides (broadcast to the output shape) serve BIN_STRIDED, which
 * walks rows, and BIN_TILED, which walks tiles so that an operand whose last
 * dim is not its fastest (a transposed view) is still read cache-friendly. */
typedef struct {
    bin_kind kind;
    const void *a, *b;
    void *o;
    int64_t n, period;
    int nd;
    int64_t shape[TS_MAX_DIMS], sa[TS_MAX_DIMS], sb[TS_MAX_DIMS];
} bin_plan;

#define BIN_KERNEL_T(name, T, S, EXPR)                                                                   \
    static void name##_##S(const bin_plan *pl) {                                                         \
        const T *A = pl->a, *B = pl->b;                                                                  \
        T *O = pl->o;                                                                                    \
        const int64_t n = pl->n, P = pl->period;                                                         \
        switch (pl->kind) {                                                                              \
        case BIN_SAME:                                                                                   \
            _Pragma("omp parallel for simd if (n > 32768)") for (int64_t i = 0; i < n; i++) {            \
                const T x = A[i], y = B[i];                                                              \
                O[i] = EXPR;                                                                             \
            }                                                                                            \
            break;                                                                                       \
        case BIN_A_SCALAR: {                                                                             \
            const T x = A[0];                                                                            \
            _Pragma("omp parallel for simd if (n > 32768)") for (int64_t i = 0; i < n; i++) {            \
                const T y = B[i];                                                                        \
                O[i] = EXPR;                                                                             \
            }                                                                                            \
        } break;                                                                                         \
        case BIN_B_SCALAR: {                                                                             \
            const T y = B[0];                                                                            \
            _Pragma("omp parallel for simd if (n > 32768)") for (int64_t i = 0; i < n; i++) {            \
                const T x = A[i];                                                                        \
                O[i] = EXPR;                                                                             \
            }                                                                                            \
        } break;                                                                                         \
        case BIN_A_ROW:                                                                                  \
            _Pragma("omp parallel for if (n > 32768)") for (int64_t r = 0; r < n / P; r++) {             \
                const T *Br = B + r * P;                                                                 \
                T *Or = O + r * P;                                                                       \
                _Pragma("omp simd") for (int64_t j = 0; j < P; j++) {                                    \
                    const T x = A[j], y = Br[j];                                                         \
                    Or[j] = EXPR;                                                                        \
                }                                                                                        \
            }                                                                                            \
            break;                                                                                       \
        case BIN_B_ROW:                                                                                  \
            _Pragma("omp parallel for if (n > 32768)") for (int64_t r = 0; r < n / P; r++) {             \
                const T *Ar = A + r * P;                                                                 \
                T *Or = O + r * P;                                                                       \
                _Pragma("omp simd") for (int64_t j = 0; j < P; j++) {                                    \
                    const T x = Ar[j], y = B[j];                                                         \
                    Or[j] = EXPR;                                                                        \
                }                                                                                        \
            }                                                                                            \
            break;                                                                                       \
        case BIN_STRIDED: {                                                                              \
            const int nd = pl->nd;                                                                       \
            const int64_t L = nd ? pl->shape[nd - 1] : 1, la = nd ? pl->sa[nd - 1] : 0,                  \
                          lb = nd ? pl->sb[nd - 1] : 0;                                                  \
            _Pragma("omp parallel for if (n > 32768)") for (int64_t r = 0; r < n / L; r++) {             \
                const T *Ar = A + ts_row_offset(nd, pl->shape, pl->sa, r);                               \
                const T *Br = B + ts_row_offset(nd, pl->shape, pl->sb, r);                               \
                T *Or = O + r * L;                                                                       \
                for (int64_t j = 0; j < L; j++) {                                                        \
                    const T x = Ar[j * la], y = Br[j * lb];                                              \
                    Or[j] = EXPR;                                                                        \
                }                                                                                        \
            }                                                                                            \
        } break;                                                                                         \
        case BIN_TILED: {                                                                                \
            const int nd = pl->nd;                                                                       \
            const int64_t R = pl->shape[nd - 2], L = pl->shape[nd - 1], ra = pl->sa[nd - 2],             \
                          rb = pl->sb[nd - 2], la = pl->sa[nd - 1], lb = pl->sb[nd - 1];                 \
            const int64_t tr = (R + TILE - 1) / TILE, tc = (L + TILE - 1) / TILE, nt = n / (R * L) * tr * tc; \
            _Pragma("omp parallel for if (n > 32768)") for (int64_t t = 0; t < nt; t++) {                \
                const int64_t p = t / (tr * tc), r0 = (t / tc) % tr * TILE, c0 = t % tc * TILE;          \
                const int64_t r1 = r0 + TILE < R ? r0 + TILE : R, c1 = c0 + TILE < L ? c0 + TILE : L;    \
                const T *Ap = A + ts_row_offset(nd - 1, pl->shape, pl->sa, p);                           \
                const T *Bp = B + ts_row_offset(nd - 1, pl->shape, pl->sb, p);                           \
                T *Op = O + p * R * L;                                                                   \
                for (int64_t r = r0; r < r1; r++)                                                        \
                    for (int64_t j = c0; j < c1; j++) {                                                  \
                        const T x = Ap[r * ra + j * la], y = Bp[r * rb + j * lb];                        \
                        Op[r * L + j] = EXPR;                                                            \
                    }                                                                                    \
            }                                                                                            \
        } break;                                                                                         \
        }                                                                                                \
    }
#define BIN_KERNEL(name, EXPR) BIN_KERNEL_T(name, float, f32, EXPR) BIN_KERNEL_T(name, double, f64, EXPR)

BIN_KERNEL(add_k, x + y)
BIN_KERNEL(sub_k, x - y)
BIN_KERNEL(mul_k, x *y)
BIN_KERNEL(div_k, x / y)

typedef void (*bin_kernel)(const bin_plan *pl);

typedef struct {
    const char *name;
    bin_kernel kern[2]; /* f32, f64 */
    ts_backward_fn backward;
    bool save_out;
    bool grad_without_inputs; /* backward reads neither input's values */
} bin_op;

/* t is contiguous with exactly the output shape. */
static bool is_full(const ts_tensor *t, int nd, const int64_t *shape) {
    return t->ndim == nd && !memcmp(t->shape, shape, sizeof(int64_t) * (size_t)nd) && ts_tensor_is_contiguous(t);
}

/* t is contiguous and, padded to nd dims, is 1s followed by the trailing
 * dims of shape: broadcasting repeats t as a row of numel(t) elements. */
static bool is_row(const ts_tensor *t, int nd, const int64_t *shape) {
    if (!ts_tensor_is_contiguous(t)) return false;
    int lead = nd - t->ndim, d = nd - 1;
    while (d >= 0 && d - lead >= 0 && t->shape[d - lead] == shape[d]) d--;
    for (; d >= 0; d--)
        if (d - lead >= 0 && t->shape[d - lead] != 1) return false;
    return true;
}

static void plan_binary(bin_plan *pl, const ts_tensor *a, const ts_tensor *b, ts_tensor *out) {
    int nd = out->ndim;
    const int64_t *shape = out->shape;
    pl->a = ts_tensor_data(a);
    pl->b = ts_tensor_data(b);
    pl->o = ts_tensor_data(out);
    pl->n = ts_tensor_numel(out);
    bool fa = is_full(a, nd, shape), fb = is_full(b, nd, shape);
    if (fa && fb) pl->kind = BIN_SAME;
    else if (fa && ts_tensor_numel(b) == 1) pl->kind = BIN_B_SCALAR;
    else if (fb && ts_tensor_numel(a) == 1) pl->kind = BIN_A_SCALAR;
    else if (fa && is_row(b, nd, shape)) pl->kind = BIN_B_ROW, pl->period = ts_tensor_numel(b);
    else if (fb && is_row(a, nd, shape)) pl->kind = BIN_A_ROW, pl->period = ts_tensor_numel(a);
    else {
        pl->nd = nd;
        memcpy(pl->shape, shape, sizeof(int64_t) * (size_t)nd);
        ts_broadcast_strides(a, nd, shape, pl->sa);
        ts_broadcast_strides(b, nd, shape, pl->sb);
        bool across = nd >= 2 && ((pl->sa[nd - 1] != 0 && pl->sa[nd - 1] != 1) || (pl->sb[nd - 1] != 0 && pl->sb[nd - 1] != 1));
        pl->kind = across ? BIN_TILED : BIN_STRIDED;
    }
}

static ts_tensor *binary(const bin_op *op, ts_tensor *a0, ts_tensor *b0) {
    ts_tensor *a = ts_float_input(op->name, "a", a0);
    ts_tensor *b = a ? ts_float_input(op->name, "b", b0) : NULL;
    ts_tensor *out = NULL;
    int nd;
    int64_t shape[TS_MAX_DIMS];
    if (!b) goto done;
    if (a->dtype != b->dtype) {
        ts_error(TS_ERR_DTYPE, "%s: dtypes %s and %s differ (shapes %s and %s)", op->name, ts_dtype_name(a->dtype),
                 ts_dtype_name(b->dtype), ts_shape_str(a), ts_shape_str(b));
        goto done;
    }
    if (ts_broadcast_shape(op->name, a, b, &nd, shape)) goto done;
    out = ts_tensor_empty(a->dtype, nd, shape);
    if (!out) goto done;
    bin_plan pl;
    plan_binary(&pl, a, b, out);
    if (pl.n > 0) op->kern[a->dtype == TS_F64](&pl);
    ts_tensor *ins[2] = {a, b};
    ts_node *n = ts_autograd_record(out, op->name, op->backward, 2, ins);
    if (n && op->save_out) ts_node_save(n, 0, out);
    if (n && op->grad_without_inputs) {
        ts_node_forget_input_data(n, 0);
        ts_node_forget_input_data(n, 1);
    }
done:
    ts_tensor_release(a);
    ts_tensor_release(b);
    return out;
}

/* ---- add / sub / mul / div backward (gradients at the broadcast shape) ---- */

static ts_status add_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    if (ts_node_wants(n, 0)) gin[0] = ts_tensor_retain(g);
    if (ts_node_wants(n, 1)) gin[1] = ts_tensor_retain(g);
    return TS_OK;
}

static ts_status sub_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    if (ts_node_wants(n, 0)) gin[0] = ts_tensor_retain(g);
    if (ts_node_wants(n, 1) && !(gin[1] = ts_neg(g))) return ts_last_status();
    return TS_OK;
}

static ts_status mul_backward(ts_node *n, ts_tensor *g0, ts_tensor **gin) {
    ts_tensor *g = grad_in_dtype(g0, n->out_dtype);
    if (!g) return ts_last_status();
    if (ts_node_wants(n, 0)) gin[0] = ts_mul(g, n->inputs[1]);
    if (ts_node_wants(n, 1)) gin[1] = ts_mul(g, n->inputs[0]);
    ts_tensor_release(g);
    if ((ts_node_wants(n, 0) && !gin[0]) || (ts_node_wants(n, 1) && !gin[1])) return ts_last_status();
    return TS_OK;
}

/* d(a/b)/da = 1/b, d(a/b)/db = -(a/b)/b = -(g/b) * out. */
static ts_status div_backward(ts_node *n, ts_tensor *g0, ts_tensor **gin) {
    ts_tensor *g = grad_in_dtype(g0, n->out_dtype);
    ts_tensor *q = g ? ts_div(g, n->inputs[1]) : NULL;
    ts_tensor_release(g);
    if (!q) return ts_last_status();
    ts_status st = TS_OK;
    if (ts_node_wants(n, 1)) {
        ts_tensor *t = ts_mul(q, n->saved[0]);
        gin[1] = t ? ts_neg(t) : NULL;
        ts_tensor_release(t);
        if (!gin[1]) st = ts_last_status();
    }
    if (ts_node_wants(n, 0)) gin[0] = q;
    else ts_tensor_release(q);
    return st;
}

static const bin_op add_op = {"add", {add_k_f32, add_k_f64}, add_backward, false, true};
static const bin_op sub_op = {"sub", {sub_k_f32, sub_k_f64}, sub_backward, false, true};
static const bin_op mul_op = {"mul", {mul_k_f32, mul_k_f64}, mul_backward, false, false};
static const bin_op div_op = {"div", {div_k_f32, div_k_f64}, div_backward, true, false};

ts_tensor *ts_add(ts_tensor *a, ts_tensor *b) { return binary(&add_op, a, b); }
ts_tensor *ts_sub(ts_tensor *a, ts_tensor *b) { return binary(&sub_op, a, b); }
ts_tensor *ts_mul(ts_tensor *a, ts_tensor *b) { return binary(&mul_op, a, b); }
ts_tensor *ts_div(ts_tensor *a, ts_tensor *b) { return binary(&div_op, a, b); }

/* ---- the pointwise map driver ---- */

static ts_status map_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    const ts_map_op *op = n->ctx;
    ts_tensor *x = n->inputs[0], *y = n->saved[0];
    ts_tensor *gc = ts_to_dtype(g, x->dtype);
    if (!gc) return ts_last_status();
    ts_tensor *gx = ts_tensor_empty(x->dtype, x->ndim, x->shape);
    const void *gd = ts_tensor_data(gc);
    if (gx)
        op->bwd[x->dtype == TS_F64](gd, op->uses & TS_MAP_USES_X ? ts_tensor_data(x) : gd,
                                    op->uses & TS_MAP_USES_Y ? ts_tensor_data(y) : gd, ts_tensor_data(gx),
                                    ts_tensor_numel(x), n->fargs[0]);
    ts_tensor_release(gc);
    gin[0] = gx;
    return gx ? TS_OK : ts_last_status();
}

ts_tensor *ts_map_apply(const ts_map_op *op, ts_tensor *x0, double p) {
    ts_tensor *xf = ts_float_input(op->op, "input", x0);
    ts_tensor *x = xf ? ts_contiguous(xf) : NULL;
    ts_tensor_release(xf);
    if (!x) return NULL;
    ts_tensor *out = ts_tensor_empty(x->dtype, x->ndim, x->shape);
    if (out) {
        op->fwd[x->dtype == TS_F64](ts_tensor_data(x), ts_tensor_data(out), ts_tensor_numel(x), p);
        ts_node *n = ts_autograd_record(out, op->op, map_backward, 1, &x);
        if (n) {
            n->ctx = (void *)op; /* static, never freed */
            n->fargs[0] = p;
            if (op->uses & TS_MAP_USES_Y) ts_node_save(n, 0, out);
            if (!(op->uses & TS_MAP_USES_X)) ts_node_forget_input_data(n, 0);
        }
    }
    ts_tensor_release(x);
    return out;
}

/* ---- unary arithmetic ---- */

#define NEG_F(T, x, p) (-(x))
#define NEG_B(T, g, x, y, p) (-(g))
TS_MAP_KERNELS(neg, NEG_F, NEG_B, 0)

#define ADDS_F(T, x, p) ((x) + (p))
#define ADDS_B(T, g, x, y, p) (g)
TS_MAP_KERNELS(add_scalar, ADDS_F, ADDS_B, 0)

#define MULS_F(T, x, p) ((x) * (p))
#define MULS_B(T, g, x, y, p) ((g) * (p))
TS_MAP_KERNELS(mul_scalar, MULS_F, MULS_B, 0)

#define POW_F(T, x, p) pow(x, p)
#define POW_B(T, g, x, y, p) ((p) == 0 ? (T)0 : (g) * (p)*pow(x, (p) - (T)1))
TS_MAP_KERNELS(pow_scalar, POW_F, POW_B, TS_MAP_USES_X)

#define EXP_F(T, x, p) exp(x)
#define EXP_B(T, g, x, y, p) ((g) * (y))
TS_MAP_KERNELS(exp, EXP_F, EXP_B, TS_MAP_USES_Y)

#define LOG_F(T, x, p) log(x)
#define LOG_B(T, g, x, y, p) ((g) / (x))
TS_MAP_KERNELS(log, LOG_F, LOG_B, TS_MAP_USES_X)

#define SQRT_F(T, x, p) sqrt(x)
#define SQRT_B(T, g, x, y, p) ((g) / ((T)2 * (y)))
TS_MAP_KERNELS(sqrt, SQRT_F, SQRT_B, TS_MAP_USES_Y)

#define ABS_F(T, x, p) fabs(x)
#define ABS_B(T, g, x, y, p) ((x) > 0 ? (g) : (x) < 0 ? -(g) : (T)0)
TS_MAP_KERNELS(abs, ABS_F, ABS_B, TS_MAP_USES_X)

ts_tensor *ts_neg(ts_tensor *a) { return ts_map_apply(&neg_map, a, 0); }
ts_tensor *ts_add_scalar(ts_tensor *a, double s) { return ts_map_apply(&add_scalar_map, a, s); }
ts_tensor *ts_mul_scalar(ts_tensor *a, double s) { return ts_map_apply(&mul_scalar_map, a, s); }
ts_tensor *ts_pow_scalar(ts_tensor *a, double p) { return ts_map_apply(&pow_scalar_map, a, p); }
ts_tensor *ts_exp(ts_tensor *a) { return ts_map_apply(&exp_map, a, 0); }
ts_tensor *ts_log(ts_tensor *a) { return ts_map_apply(&log_map, a, 0); }
ts_tensor *ts_sqrt(ts_tensor *a) { return ts_map_apply(&sqrt_map, a, 0); }
ts_tensor *ts_abs(ts_tensor *a) { return ts_map_apply(&abs_map, a, 0); }
