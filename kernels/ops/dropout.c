/* dropout.c - key-driven dropout, forward and backward. Both directions run
 * the same kernel: y = x * keep(key, i) / (1 - p), regenerating the random
 * stream chunk by chunk, so no mask is stored. */
#include "kernels/ops/dropout.h"

#include <math.h>

#include "kernels/autograd.h"
#include "kernels/ops/elementwise.h"
#include "kernels/ops/view.h"

#define CHUNK 4096 /* random numbers drawn at a time */

#define DROPOUT_KERNEL_T(T, S)                                                                   \
    static void dropout_##S(ts_key key, const T *x, T *y, int64_t n, float p, T scale) {         \
        int64_t nc = (n + CHUNK - 1) / CHUNK;                                                    \
        _Pragma("omp parallel for if (n > 32768)") for (int64_t c = 0; c < nc; c++) {            \
            float u[CHUNK];                                                                      \
            int64_t i0 = c * CHUNK, m = n - i0 < CHUNK ? n - i0 : CHUNK;                         \
            ts_rng_uniform_f32(key, (uint64_t)i0, m, u);                                         \
            for (int64_t j = 0; j < m; j++) y[i0 + j] = u[j] >= p ? x[i0 + j] * scale : (T)0;   \
        }                                                                                        \
    }
DROPOUT_KERNEL_T(float, f32)
DROPOUT_KERNEL_T(double, f64)

/* Runs the kernel on contiguous x (dtype f32/f64) into a new tensor. */
static ts_tensor *apply_mask(ts_tensor *x, ts_key key, double p) {
    ts_tensor *y = ts_tensor_empty(x->dtype, x->ndim, x->shape);
    if (!y) return NULL;
    int64_t n = ts_tensor_numel(x);
    double scale = p < 1 ? 1 / (1 - p) : 0;
    if (x->dtype == TS_F64) dropout_f64(key, ts_f64(x), ts_f64(y), n, (float)p, scale);
    else dropout_f32(key, ts_f32(x), ts_f32(y), n, (float)p, (float)scale);
    return y;
}

static ts_key node_key(const ts_node *n) { return (ts_key){{(uint32_t)n->iargs[0], (uint32_t)n->iargs[1]}}; }

static ts_status dropout_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    ts_tensor *gc = ts_to_dtype(g, n->inputs[0]->dtype);
    gin[0] = gc ? apply_mask(gc, node_key(n), n->fargs[0]) : NULL;
    ts_tensor_release(gc);
    return gin[0] ? TS_OK : ts_last_status();
}

ts_tensor *ts_dropout(ts_tensor *x0, double p, ts_key key, bool train) {
    if (!(p >= 0 && p <= 1)) {
        ts_error(TS_ERR_VALUE, "dropout: probability %g is outside [0, 1]", p);
        return NULL;
    }
    ts_tensor *xf = ts_float_input("dropout", "input", x0);
    if (!xf || !train || p == 0) return xf;
    ts_tensor *x = ts_contiguous(xf);
    ts_tensor_release(xf);
    ts_tensor *y = x ? apply_mask(x, key, p) : NULL;
    ts_node *n = y ? ts_autograd_record(y, "dropout", dropout_backward, 1, &x) : NULL;
    if (n) {
        n->iargs[0] = key.k[0];
        n->iargs[1] = key.k[1];
        n->fargs[0] = p;
    }
    ts_tensor_release(x);
    return y;
}
