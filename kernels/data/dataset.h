/* dataset.h - the dataset interface the DataLoader reads from.
 *
 * A dataset has a length and a fixed per-sample shape and dtype for its
 * input x and target y; get(i) writes sample i's x and y into two row
 * buffers of x_bytes / y_bytes bytes (one row of a contiguous batch). get
 * may be called from the loader's prefetch thread, so it must not touch
 * state other than its own read-only data. destroy frees the dataset (NULL
 * for none). ts_dataset_tensors builds an in-memory dataset from two tensors
 * whose first dim indexes samples.
 */
#ifndef TS_DATA_DATASET_H
#define TS_DATA_DATASET_H

#include "kernels/tensor.h"

typedef struct ts_dataset ts_dataset;
struct ts_dataset {
    char name[64]; /* for messages */
    int64_t (*length)(const ts_dataset *d);
    ts_status (*get)(const ts_dataset *d, int64_t i, void *x_row, void *y_row);
    void (*destroy)(ts_dataset *d);
    ts_dtype x_dtype, y_dtype;
    int x_ndim, y_ndim; /* per-sample dims (y_ndim 0: a scalar target) */
    int64_t x_shape[TS_MAX_DIMS - 1], y_shape[TS_MAX_DIMS - 1];
    void *ctx;
};

/* Bytes of one sample's x / y. */
size_t ts_dataset_x_bytes(const ts_dataset *d);
size_t ts_dataset_y_bytes(const ts_dataset *d);

/* A dataset over rows of x [N, ...] and y [N, ...] (CPU, any dtypes; made
 * contiguous internally; retained). Sample i = (x[i], y[i]). */
ts_dataset *ts_dataset_tensors(const char *name, ts_tensor *x, ts_tensor *y);

/* Frees d via its destroy function (NULL is a no-op). */
void ts_dataset_free(ts_dataset *d);

#endif
