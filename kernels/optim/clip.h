/* clip.h - gradient clipping by global L2 norm over flat ranges.
 *
 * The norm of a sharded gradient is the square root of the sum of the
 * shards' partial squared norms: each shard or rank calls ts_clip_sq_norm on
 * its range, the partials are summed (all-reduce, or at the scheduler), and
 * every holder scales its range by ts_clip_coef(sqrt(sum), max_norm).
 * ts_clip_grad_norm does all of that for one buffer, like
 * torch.nn.utils.clip_grad_norm_ (norm_type 2): it always multiplies by
 * min(1, max_norm / (norm + 1e-6)) and returns the norm before clipping.
 * Sums are accumulated in double.
 */
#ifndef TS_OPTIM_CLIP_H
#define TS_OPTIM_CLIP_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/status.h"

/* Sum of squares of g[0..len) in double (0 for len 0). OpenMP over the range;
 * the result depends only on the data and the thread count. */
double ts_clip_sq_norm(const float *g, int64_t len);

/* g[i] *= factor for i in [0, len). OpenMP over the range. */
void ts_clip_scale(float *g, int64_t len, float factor);

/* The factor clip_grad_norm_ applies: min(1, max_norm / (total_norm + 1e-6)). */
double ts_clip_coef(double total_norm, double max_norm);

/* Clips g[0..len) to global norm max_norm (> 0) and stores the norm before
 * clipping in *total_norm (may be NULL). With error_if_nonfinite a NaN or
 * infinite norm is an error and g is left untouched; without it g is scaled
 * as PyTorch does (by 0 for an infinite norm, NaN for a NaN norm). */
ts_status ts_clip_grad_norm(float *g, int64_t len, double max_norm, bool error_if_nonfinite, double *total_norm);

#endif
