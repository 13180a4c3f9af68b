/* embedding.h - embedding lookup.
 *
 * table [V, D] f32/f64 (any strides), indices of any shape [...] with dtype
 * i32 or i64; the result [..., D] holds table row indices[i] for each i. An
 * index outside [0, V) is an error naming the index, its position and V.
 * Backward scatter-adds the output gradient into a [V, D] table gradient
 * (repeated indices accumulate).
 */
#ifndef TS_OPS_EMBEDDING_H
#define TS_OPS_EMBEDDING_H

#include "kernels/tensor.h"

/* Rows of table picked by indices. */
ts_tensor *ts_embedding(ts_tensor *table, ts_tensor *indices);

#endif
