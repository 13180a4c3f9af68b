/* embedding.c - embedding lookup, forward and scatter-add backward. */
#include "kernels/ops/embedding.h"

#include <string.h>

#include "kernels/autograd.h"
#include "kernels/ops/cpu/rowmath.h"
#include "kernels/ops/view.h"

/* Work below this many elements stays on one thread. */
#define PAR_MIN 32768

/* For each type: out[i] = table[idx[i]] (rows of D), and the backward
 * gt[idx[i]] += g[i]. The backward runs serially over indices (repeated
 * indices would race) with the D loop vectorised. */
#define EMBEDDING_DEFINE(T, S)                                                                         \
    static void emb_fwd_##S(const T *tab, const int64_t *idx, T *out, int64_t n, int64_t D) {          \
        _Pragma("omp parallel for schedule(static) if (n * D > PAR_MIN)")                              \
        for (int64_t i = 0; i < n; i++) memcpy(out + i * D, tab + idx[i] * D, (size_t)D * sizeof(T));  \
    }                                                                                                  \
    static void emb_bwd_##S(const int64_t *idx, const T *g, T *gt, int64_t n, int64_t D) {             \
        for (int64_t i = 0; i < n; i++) {                                                              \
            T *dst = gt + idx[i] * D;                                                                  \
            const T *src = g + i * D;                                                                  \
            TS_SIMD_##S() for (int64_t j = 0; j < D; j++) dst[j] += src[j];                      \
        }                                                                                              \
    }

EMBEDDING_DEFINE(float, f)
EMBEDDING_DEFINE(double, d)

/* saved[0] = indices as contiguous i64. */
static ts_status embedding_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    if (!ts_node_wants(n, 0)) return TS_OK;
    ts_tensor *table = n->inputs[0], *idx = n->saved[0];
    int64_t V = table->shape[0], D = table->shape[1], m = ts_tensor_numel(idx);
    ts_tensor *gc = ts_contiguous(g);
    ts_tensor *gt = gc ? ts_tensor_zeros(g->dtype, 2, (int64_t[]){V, D}) : NULL;
    if (gt) {
        if (g->dtype == TS_F32) emb_bwd_f(ts_tensor_data(idx), ts_f32(gc), ts_f32(gt), m, D);
        else emb_bwd_d(ts_tensor_data(idx), ts_f64(gc), ts_f64(gt), m, D);
    }
    ts_tensor_release(gc);
    gin[0] = gt;
    return gt ? TS_OK : ts_last_status();
}

ts_tensor *ts_embedding(ts_tensor *table, ts_tensor *indices) {
    if (ts_check_tensor("embedding", "table", table, TS_FLOATS) ||
        ts_check_tensor("embedding", "indices", indices, TS_INTS))
        return NULL;
    if (table->ndim != 2) {
        ts_error(TS_ERR_SHAPE, "embedding: table %s must be 2-D [num_embeddings, dim]", ts_shape_str(table));
        return NULL;
    }
    if (indices->ndim >= TS_MAX_DIMS) {
        ts_error(TS_ERR_SHAPE, "embedding: indices %s leave no room for the embedding dim (at most %d dims)",
                 ts_shape_str(indices), TS_MAX_DIMS - 1);
        return NULL;
    }
    int64_t V = table->shape[0], D = table->shape[1], m = ts_tensor_numel(indices);
    ts_tensor *idx = ts_tensor_copy_as(indices, TS_I64);
    if (!idx) return NULL;
    const int64_t *ip = ts_tensor_data(idx);
    for (int64_t i = 0; i < m; i++)
        if (ip[i] < 0 || ip[i] >= V) {
            ts_error(TS_ERR_INDEX, "embedding: index %lld at position %lld is out of range for a table of %lld rows "
                     "(table %s, indices %s)", (long long)ip[i], (long long)i, (long long)V, ts_shape_str(table),
                     ts_shape_str(indices));
            ts_tensor_release(idx);
            return NULL;
        }
    int64_t shape[TS_MAX_DIMS];
    memcpy(shape, indices->shape, sizeof(int64_t) * (size_t)indices->ndim);
    shape[indices->ndim] = D;
    ts_tensor *tab = ts_tensor_is_contiguous(table) ? ts_tensor_retain(table) : ts_tensor_copy_as(table, table->dtype);
    ts_tensor *out = tab ? ts_tensor_empty(table->dtype, indices->ndim + 1, shape) : NULL;
    if (out) {
        if (table->dtype == TS_F32) emb_fwd_f(ts_f32(tab), ip, ts_f32(out), m, D);
        else emb_fwd_d(ts_f64(tab), ip, ts_f64(out), m, D);
        ts_node *n = ts_autograd_record(out, "embedding", embedding_backward, 1, &table);
        if (n) ts_node_save(n, 0, idx);
    }
    ts_tensor_release(tab);
    ts_tensor_release(idx);
    return out;
}
