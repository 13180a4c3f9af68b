/* mixed.h - mixed precision and gradient accumulation over flat ranges.
 *
 * Compute runs on bf16 copies of the parameters while the optimizer keeps
 * f32 master weights and f32 state (optim.h). After each step the master
 * range is rounded (nearest even) into the bf16 buffer; the gradients that
 * backward produces (bf16 or f32) are accumulated into the f32 gradient
 * buffer, each micro-batch with scale 1/k when k micro-batches make one step,
 * so the accumulated gradient is the mean over the micro-batches - the same
 * as one batch k times larger with a mean loss.
 */
#ifndef TS_OPTIM_MIXED_H
#define TS_OPTIM_MIXED_H

#include <stdint.h>

#include "kernels/ops/backend.h"
#include "kernels/status.h"
#include "kernels/tensor.h"

/* The CPU's kernels for flat f32 ranges (clipping and mixed precision use
 * them too): those of the capability in use, or the default ones when
 * TESSERA_CPU_CAPABILITY was refused - these functions have no error
 * channel of their own, and every op reports the refusal. */
const ts_optim_kernels *ts_mixed_kernels(void);

/* out[i] = bf16(master[i]) for i in [0, len), round to nearest even. */
ts_status ts_mixed_to_bf16(const float *master, uint16_t *out, int64_t len);

/* acc[i] += scale * g[i] for i in [0, len); g holds dtype TS_F32 or TS_BF16
 * elements (math in f32). Other dtypes are an error naming the dtype. */
ts_status ts_mixed_accumulate(float *acc, const void *g, ts_dtype dtype, int64_t len, float scale);

/* The scale of one of k micro-batches (1/k); 0 with an error if k < 1. */
float ts_mixed_micro_scale(int k);

/* Turns a gradient summed over k micro-batches into their mean
 * (acc *= 1/k), for backward passes that accumulated in place. */
ts_status ts_mixed_average(float *acc, int64_t len, int k);

#endif
