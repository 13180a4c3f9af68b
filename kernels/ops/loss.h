/* loss.h - losses: cross-entropy fused with log_softmax, mean squared error.
 *
 * Both return a 0-dim tensor of the input's dtype (f32/f64) and are
 * differentiable in their float inputs.
 *
 * cross_entropy: logits [..., C] (any strides; the leading dims are
 * flattened to N rows), targets [...] of i32/i64 class indices with the
 * logits' leading shape ([N] for [N, C]). Targets equal to ignore_index add
 * nothing; any other target outside [0, C) is an error naming it. MEAN
 * divides by the number of non-ignored targets, like PyTorch (NaN when all
 * are ignored, as PyTorch). Backward: (softmax - onehot) * g / count, zero
 * on ignored rows.
 *
 * mse: a and b of the same shape and dtype; mean or sum of (a - b)^2.
 */
#ifndef TS_OPS_LOSS_H
#define TS_OPS_LOSS_H

#include <stdint.h>

#include "kernels/tensor.h"

typedef enum { TS_REDUCTION_MEAN, TS_REDUCTION_SUM } ts_reduction;

/* Mean or sum over rows of -log_softmax(logits)[row, target[row]]. */
ts_tensor *ts_cross_entropy(ts_tensor *logits, ts_tensor *targets, int64_t ignore_index, ts_reduction reduction);

/* Mean or sum of (a - b)^2. */
ts_tensor *ts_mse(ts_tensor *a, ts_tensor *b, ts_reduction reduction);

#endif
