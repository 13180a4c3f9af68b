/* embedding.c - embedding lookup, forward and scatter-add backward, on the
 * device's embedding kernels. */
#include "kernels/ops/embedding.h"

#include <string.h>

#include "kernels/autograd.h"
#include "kernels/ops/backend.h"
#include "kernels/ops/view.h"

/* saved[0] = indices as contiguous i64. */
static ts_status embedding_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    if (!ts_node_wants(n, 0)) return TS_OK;
    ts_tensor *table = n->inputs[0], *idx = n->saved[0];
    int64_t V = table->shape[0], D = table->shape[1], m = ts_tensor_numel(idx);
    const ts_backend *be = ts_backend_for("embedding", 2, (ts_tensor *[]){g, idx});
    ts_tensor *gc = be ? ts_contiguous(g) : NULL;
    ts_tensor *gt = gc ? ts_tensor_empty_on(ts_tensor_device(g), g->dtype, 2, (int64_t[]){V, D}) : NULL;
    ts_status st = gt ? be->embedding->backward(g->dtype, ts_tensor_data(idx), ts_tensor_data(gc), ts_tensor_data(gt), m,
                                                V, D)
                      : ts_last_status();
    ts_tensor_release(gc);
    if (st) ts_tensor_release(gt);
    else gin[0] = gt;
    return st;
}

ts_tensor *ts_embedding(ts_tensor *table, ts_tensor *indices) {
    if (ts_check_arg("embedding", "table", table, TS_FLOATS) ||
        ts_check_arg("embedding", "indices", indices, TS_INTS))
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
    const ts_backend *be = ts_backend_for("embedding", 2, (ts_tensor *[]){table, indices});
    if (!be) return NULL;
    int64_t V = table->shape[0], D = table->shape[1], m = ts_tensor_numel(indices);
    ts_tensor *idx = ts_tensor_copy_as(indices, TS_I64);
    ts_tensor *host = idx ? ts_tensor_to(idx, TS_CPU) : NULL; /* checked on the host */
    if (!host) {
        ts_tensor_release(idx);
        return NULL;
    }
    const int64_t *ip = ts_tensor_data(host);
    for (int64_t i = 0; i < m; i++)
        if (ip[i] < 0 || ip[i] >= V) {
            ts_error(TS_ERR_INDEX, "embedding: index %lld at position %lld is out of range for a table of %lld rows "
                     "(table %s, indices %s)", (long long)ip[i], (long long)i, (long long)V, ts_shape_str(table),
                     ts_shape_str(indices));
            ts_tensor_release(host);
            ts_tensor_release(idx);
            return NULL;
        }
    ts_tensor_release(host);
    int64_t shape[TS_MAX_DIMS];
    memcpy(shape, indices->shape, sizeof(int64_t) * (size_t)indices->ndim);
    shape[indices->ndim] = D;
    ts_tensor *tab = ts_tensor_dense(table);
    ts_tensor *out = tab ? ts_tensor_empty_on(ts_tensor_device(table), table->dtype, indices->ndim + 1, shape) : NULL;
    if (out && be->embedding->forward(table->dtype, ts_tensor_data(tab), ts_tensor_data(idx), ts_tensor_data(out), m,
                                      D)) {
        ts_tensor_release(out);
        out = NULL;
    }
    ts_node *n = out ? ts_autograd_record(out, "embedding", embedding_backward, 1, &table) : NULL;
    if (n) ts_node_save(n, 0, idx);
    ts_tensor_release(tab);
    ts_tensor_release(idx);
    return out;
}
