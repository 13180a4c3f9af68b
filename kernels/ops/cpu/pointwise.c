/* pointwise.c - CPU kernels of the pointwise ops: binary arithmetic, the
 * maps (arithmetic and activations) and their derivatives, where. The
 * loops are in pointwise_t.h, once per dtype; threads take even shares of
 * the elements (rows, tiles) once there are more than TS_PAR_MIN. */
#include <tgmath.h>

#include "kernels/ops/cpu/cpu.h"

/* Square tiles of the last two dims (TS_WALK_TILED). */
#define TS_TILE 32

/* gelu, tanh form: y = x (1 + tanh u) / 2 with u = k (x + a x^3). */
#define GELU_K 0.7978845608028654 /* sqrt(2 / pi) */
#define GELU_A 0.044715

/* The units a binary walk splits among threads: elements, rows or tiles. */
static int64_t binary_units(const ts_binary_plan *pl) {
    int nd = pl->ndim;
    switch (pl->walk) {
    case TS_WALK_A_ROW:
    case TS_WALK_B_ROW: return pl->period ? pl->n / pl->period : 0;
    case TS_WALK_STRIDED: return nd && pl->shape[nd - 1] ? pl->n / pl->shape[nd - 1] : (nd ? 0 : 1);
    case TS_WALK_TILED: {
        int64_t R = pl->shape[nd - 2], L = pl->shape[nd - 1];
        return R * L != 0 ? pl->n / (R * L) * ((R + TS_TILE - 1) / TS_TILE) * ((L + TS_TILE - 1) / TS_TILE) : 0;
    }
    default: return pl->n;
    }
}

/* What a map kernel works on: forward x into out; backward g, x and y
 * into out (x or y may be g again when the derivative does not read it). */
typedef struct {
    ts_map_kind kind;
    const void *g, *x, *y;
    void *out;
    double p;
} map_args;

typedef struct {
    int ndim;
    const int64_t *shape;
    ts_operand mask, a, b;
    void *out;
} where_args;

#define TS_DT 32
#include "kernels/ops/cpu/pointwise_t.h"
#undef TS_DT
#define TS_DT 64
#include "kernels/ops/cpu/pointwise_t.h"
#undef TS_DT

static ts_status cpu_binary(ts_binary_kind kind, ts_dtype dt, const ts_binary_plan *plan) {
    if (dt == TS_F32) binary_f32(kind, plan);
    else binary_f64(kind, plan);
    return TS_OK;
}

static ts_status cpu_map(ts_map_kind kind, ts_dtype dt, const void *x, void *y, int64_t n, double p) {
    map_args a = {.kind = kind, .x = x, .out = y, .p = p};
    ts_cpu_split(n, n, dt == TS_F32 ? map_range_f32 : map_range_f64, &a);
    return TS_OK;
}

static ts_status cpu_map_backward(ts_map_kind kind, ts_dtype dt, const void *g, const void *x, const void *y,
                                  void *gx, int64_t n, double p) {
    map_args a = {.kind = kind, .g = g, .x = x, .y = y, .out = gx, .p = p};
    ts_cpu_split(n, n, dt == TS_F32 ? map_backward_range_f32 : map_backward_range_f64, &a);
    return TS_OK;
}

static ts_status cpu_where(int ndim, const int64_t *shape, ts_operand mask, ts_operand a, ts_operand b, void *out) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    int64_t rows = ndim && shape[ndim - 1] ? n / shape[ndim - 1] : (ndim ? 0 : 1);
    where_args w = {ndim, shape, mask, a, b, out};
    ts_cpu_split(rows, n, a.dtype == TS_F32 ? where_range_f32 : where_range_f64, &w);
    return TS_OK;
}

const ts_pointwise_kernels TS_VARIANT(ts_cpu_pointwise) = {cpu_binary, cpu_map, cpu_map_backward, cpu_where};
