/* dataset.c - sample sizes and the in-memory tensor dataset. */
#include "kernels/data/dataset.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t sample_bytes(ts_dtype dt, int ndim, const int64_t *shape) {
    size_t n = ts_dtype_size(dt);
    for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
    return n;
}

size_t ts_dataset_x_bytes(const ts_dataset *d) { return sample_bytes(d->x_dtype, d->x_ndim, d->x_shape); }
size_t ts_dataset_y_bytes(const ts_dataset *d) { return sample_bytes(d->y_dtype, d->y_ndim, d->y_shape); }

void ts_dataset_free(ts_dataset *d) {
    if (d && d->destroy) d->destroy(d);
}

typedef struct {
    ts_tensor *x, *y; /* contiguous */
    size_t xb, yb;
} tensor_ctx;

static int64_t tensors_length(const ts_dataset *d) { return ((tensor_ctx *)d->ctx)->x->shape[0]; }

static ts_status tensors_get(const ts_dataset *d, int64_t i, void *x_row, void *y_row) {
    const tensor_ctx *c = d->ctx;
    if (i < 0 || i >= c->x->shape[0])
        return ts_error(TS_ERR_INDEX, "dataset %s: sample %lld out of range [0, %lld)", d->name, (long long)i,
                        (long long)c->x->shape[0]);
    memcpy(x_row, (const char *)ts_tensor_data(c->x) + (size_t)i * c->xb, c->xb);
    memcpy(y_row, (const char *)ts_tensor_data(c->y) + (size_t)i * c->yb, c->yb);
    return TS_OK;
}

static void tensors_destroy(ts_dataset *d) {
    tensor_ctx *c = d->ctx;
    ts_tensor_release(c->x);
    ts_tensor_release(c->y);
    free(c);
    free(d);
}

ts_dataset *ts_dataset_tensors(const char *name, ts_tensor *x, ts_tensor *y) {
    if (ts_check_tensor("dataset", "x", x, ~0u) || ts_check_tensor("dataset", "y", y, ~0u)) return NULL;
    if (x->ndim < 1 || y->ndim < 1 || x->shape[0] != y->shape[0]) {
        ts_error(TS_ERR_SHAPE, "dataset %s: x %s and y %s must share their first (sample) dim", name, ts_shape_str(x),
                 ts_shape_str(y));
        return NULL;
    }
    ts_dataset *d = calloc(1, sizeof *d);
    tensor_ctx *c = calloc(1, sizeof *c);
    if (!d || !c) {
        free(d);
        free(c);
        ts_error(TS_ERR_MEMORY, "dataset %s: out of memory", name);
        return NULL;
    }
    c->x = ts_tensor_is_contiguous(x) ? ts_tensor_alias(x) : ts_tensor_copy_as(x, x->dtype);
    c->y = ts_tensor_is_contiguous(y) ? ts_tensor_alias(y) : ts_tensor_copy_as(y, y->dtype);
    snprintf(d->name, sizeof d->name, "%s", name);
    d->length = tensors_length;
    d->get = tensors_get;
    d->destroy = tensors_destroy;
    d->x_dtype = x->dtype;
    d->y_dtype = y->dtype;
    d->x_ndim = x->ndim - 1;
    d->y_ndim = y->ndim - 1;
    memcpy(d->x_shape, x->shape + 1, sizeof(int64_t) * (size_t)d->x_ndim);
    memcpy(d->y_shape, y->shape + 1, sizeof(int64_t) * (size_t)d->y_ndim);
    d->ctx = c;
    if (!c->x || !c->y) {
        tensors_destroy(d);
        return NULL;
    }
    c->xb = ts_dataset_x_bytes(d);
    c->yb = ts_dataset_y_bytes(d);
    return d;
}
