/* transformer.h - GPT pieces: causal self-attention, the pre-LN block, the
 * token/position embedding and the tied LM head.
 *
 * Parameter names: wte.weight, wpe.weight, blocks.<i>.ln1.{weight,bias},
 * blocks.<i>.attn.qkv.{weight,bias}, blocks.<i>.attn.proj.{weight,bias},
 * blocks.<i>.ln2.*, blocks.<i>.mlp.fc.*, blocks.<i>.mlp.proj.*,
 * ln_f.{weight,bias}. The LM head reuses wte.weight (tied); a head built
 * without the embedding in its model (a pipeline's last stage) registers its
 * own wte.weight, which the strategy keeps in sync with the first stage.
 * Init follows GPT-2: normal(0, 0.02), residual projections scaled by
 * 1/sqrt(2 n_layer), zero biases.
 */
#ifndef TS_NN_TRANSFORMER_H
#define TS_NN_TRANSFORMER_H

#include "kernels/nn/module.h"

typedef struct {
    int64_t vocab;      /* 256 for bytes */
    int64_t block_size; /* longest sequence */
    int64_t n_layer, n_head, n_embd;
    double dropout;
} ts_gpt_config;

/* Checks the config (positive sizes, n_embd divisible by n_head). */
ts_status ts_gpt_config_check(const ts_gpt_config *c);

/* Multi-head causal self-attention over [B, T, C] (fused qkv projection). */
ts_module *ts_attention_new(ts_model *m, const ts_module *parent, const char *name, const ts_gpt_config *c);

/* x + attn(ln1(x)), then + mlp(ln2(.)) with a 4C GELU MLP. */
ts_module *ts_block_new(ts_model *m, const ts_module *parent, const char *name, const ts_gpt_config *c);

/* [B, T] token ids -> wte[ids] + wpe[0..T) (+ dropout): [B, T, C]. */
ts_module *ts_gpt_embed_new(ts_model *m, const ts_module *parent, const ts_gpt_config *c);

/* [B, T, C] -> ln_f -> logits [B, T, vocab] through the tied wte. */
ts_module *ts_gpt_head_new(ts_model *m, const ts_module *parent, const ts_gpt_config *c);

#endif
