/* model.h: the Qwen3 weights and forward pass (family-owned; called through family/family.h).
 *
 * Reference: transformers' models/qwen3/modeling_qwen3.py (Qwen3ForCausalLM, eager attention):
 * pre-norm decoder layers with RMSNorm, grouped-query attention with per-head RMSNorm on q and
 * k before rotary embedding, SwiGLU MLP, no biases; lm_head tied to embed_tokens or separate. */
#ifndef LM_FAMILY_QWEN3_MODEL_H
#define LM_FAMILY_QWEN3_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "family/family.h"

/* Checks config.json's Qwen3-specific keys (hidden_act silu, no attention_bias, default RoPE,
 * no sliding window: LM_ERR_UNSUPPORTED otherwise) and loads the tensors by name, shapes
 * checked (LM_ERR_MISSING / LM_ERR_SHAPE). *state: struct lm_qwen3, freed by lm_qwen3_unload. */
lm_status lm_qwen3_load(const struct lm_family_load_args *args, void **state);
void lm_qwen3_unload(void *state);

/* A sequence: KV cache float32 [layer][pos < max_tokens][kv_head][head_dim] for K and for V, and
 * scratch for a chunk of up to 256 tokens. LM_ERR_NOMEM. */
lm_status lm_qwen3_seq_create(void *state, int max_tokens, void **seq);
void lm_qwen3_seq_destroy(void *seq);

/* Runs ids[0..n) at positions pos..pos+n-1, in chunks of at most 256 tokens (prefill as
 * matrix-matrix products; n = 1 is a decode step). Writes K/V to the cache. logits: [n, vocab]
 * when all_logits, else [1, vocab] (last position). No allocation. */
lm_status lm_qwen3_forward(void *state, void *seq, int pos, const int32_t *ids, int n,
                           float *logits, bool all_logits);

#endif
