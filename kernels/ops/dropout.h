/* dropout.h - key-driven dropout.
 *
 * The mask depends only on (key, element index in row-major order): element
 * i is kept when ts_rng_uniform_f32(key, i) >= p, and kept elements are
 * scaled by 1 / (1 - p). The same key therefore gives the same mask on
 * every rank and thread count, and backward (or an activation recomputation)
 * regenerates the mask from the key instead of storing it. Follows the
 * contract of elementwise.h for dtypes (f32/f64; bf16 computed as f32),
 * strides and autograd. Derive a fresh key per call site and step
 * (ts_key_fold_in) - reusing a key reuses the mask.
 */
#ifndef TS_OPS_DROPOUT_H
#define TS_OPS_DROPOUT_H

#include <stdbool.h>

#include "kernels/rng.h"
#include "kernels/tensor.h"

/* Dropout of x with drop probability p in [0, 1]. With train false or p 0,
 * returns x itself (retained; a bf16 x comes back converted to f32); with
 * p 1 the result is all zeros. p outside
 * [0, 1] (or NaN) fails with TS_ERR_VALUE. */
ts_tensor *ts_dropout(ts_tensor *x, double p, ts_key key, bool train);

#endif
