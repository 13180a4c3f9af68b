/* attention.h - fused scaled dot-product attention.
 *
 * q [B, H, Tq, D], k [B, H, Tk, D], v [B, H, Tk, Dv], one float dtype
 * (f32/f64), any strides. out [B, H, Tq, Dv] = softmax(scale * q k^T + mask) v
 * where the causal mask hides key j from query i when j > i (PyTorch's
 * is_causal, top-left aligned: query i sees keys 0..min(i, Tk-1)). scale 0
 * means 1/sqrt(D); it must be finite. One op with its own backward: the
 * forward keeps only the log-sum-exp of each score row; the backward
 * recomputes the probabilities from it. OpenMP spreads the B*H heads over
 * the threads; each head runs serially in cache-sized row blocks.
 *
 * ts_attention_qkv is the same for a GPT's packed projections: qkv
 * [B, T, 3C] holds each token's q, k and v side by side, each H heads of
 * D = C / H; the result [B, T, C] holds the heads' outputs side by side
 * (the input of the output projection). Where the device's kernels follow
 * strided layouts (the CPU's), they read the heads inside the qkv rows and
 * write the output and the [B, T, 3C] gradient in place: no head split or
 * merge is ever copied. Elsewhere the op copies the heads out densely.
 */
#ifndef TS_OPS_ATTENTION_H
#define TS_OPS_ATTENTION_H

#include <stdbool.h>

#include "kernels/tensor.h"

/* softmax(scale * q k^T (causally masked when causal)) v. */
ts_tensor *ts_attention(ts_tensor *q, ts_tensor *k, ts_tensor *v, bool causal, double scale);

/* Causal (or not) self-attention of n_head heads over packed qkv [B, T,
 * 3C] (C a multiple of n_head), scale as above: [B, T, C]. */
ts_tensor *ts_attention_qkv(ts_tensor *qkv, int64_t n_head, bool causal, double scale);

#endif
