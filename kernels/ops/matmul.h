/* matmul.h - matrix products on OpenBLAS GEMM, forward and backward.
 *
 * ts_matmul follows NumPy/PyTorch matmul: 2-D x 2-D is a matrix product;
 * N-D operands are stacks of matrices in their last two dims whose leading
 * (batch) dims broadcast; a 1-D left operand is a row vector, a 1-D right
 * operand a column vector (the added dim is removed from the result).
 * Operands are f32 or f64 (both the same; bf16 is rejected: convert with
 * ts_to_dtype first). A matrix whose last two dims are row-major or
 * column-major with a leading dimension (e.g. ts_transpose(w, 0, 1) of a
 * contiguous weight) goes to cblas_?gemm as is, with CblasTrans where
 * needed - it is never copied; other layouts (expanded inner dims, steps)
 * are copied once. Stacks whose batch folds into one GEMM (a [B,T,K] input
 * times a [K,N] weight; the weight gradient summed over the batch) are done
 * as one call. The backward passes dA = dC·Bᵀ and dB = Aᵀ·dC are the same
 * folded GEMMs, summed over broadcast batch dims inside the GEMM.
 */
#ifndef TS_OPS_MATMUL_H
#define TS_OPS_MATMUL_H

#include <stdbool.h>

#include "kernels/tensor.h"

/* a·b with broadcast batch dims; differentiable in both operands. Errors
 * name the shapes, e.g. "matmul: shapes [4,8] x [9,2] do not align (dim 1 =
 * 8 vs dim 0 = 9)". Returns a new contiguous tensor or NULL. */
ts_tensor *ts_matmul(ts_tensor *a, ts_tensor *b);

/* out = a·b (accumulate: out += a·b), not differentiable. a and b are at
 * least 2-D with broadcasting batch dims; out is [..., M, N] whose batch dims
 * each equal the broadcast batch dim, are 1, or are missing: those are summed
 * over. out's last two dims must be row-major (unit column stride); a and b
 * may have any strides. Same float dtype for all three. Used by the
 * backward passes here and in conv2d, and by ops that need a raw GEMM. */
ts_status ts_matmul_into(ts_tensor *out, const ts_tensor *a, const ts_tensor *b, bool accumulate);

/* A fully connected layer: y = x·wᵀ + b, x [..., in], w [out, in], b
 * [out] or NULL, one float dtype; y [..., out]. One GEMM over all leading
 * dims of x onto the bias laid down in every row (no separate add).
 * Differentiable in all three; backward's weight and bias gradients go
 * straight into w's and b's .grad when they are leaves that have one (a
 * model's flat gradient buffer: ts_node_grad_sink), with no temporary.
 * Errors name the shapes, e.g. "linear: x [4,8] does not end in the
 * in-features of weight [3,9] ([out, in])". */
ts_tensor *ts_linear(ts_tensor *x, ts_tensor *w, ts_tensor *b);

#endif
