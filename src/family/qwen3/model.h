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

/* The paged KV pool: float32 K and V, each [layer][n_blocks * LM_KV_BLOCK][kv_heads * head_dim]
 * (lm_huge_alloc, touched lazily), and the scratch of a forward step of up to max_batch tokens
 * over sequences of up to max_ctx positions. LM_ERR_NOMEM. */
lm_status lm_qwen3_kv_create(void *state, int n_blocks, int max_batch, int max_ctx, void **kv);
void lm_qwen3_kv_destroy(void *kv);
void lm_qwen3_kv_copy(void *kv, int src, int dst, int n_rows);

/* One batched step (model.h, lm_model_forward): the new tokens of every sequence run as one
 * [tokens, hidden] activation through every matrix (prefill chunks as matrix-matrix products,
 * decode tokens as rows of the same product); RoPE, the K/V scatter into the blocks and the
 * attention go sequence by sequence. No allocation. */
lm_status lm_qwen3_forward(void *state, void *kv, const struct lm_batch_seq *seqs, int n_seqs,
                           float *logits);
/* Whether the CPU forward (lm_qwen3_forward without `cuda`) rounds each new key and value to
 * bf16 (lm_f32_to_bf16) as it enters the float32 cache, as the CUDA cache stores them; off by
 * default. For tests that compare the two devices: a Q8_0 decode step quantizes its activations
 * to int8 per 32-element block, so a K/V rounding difference can move a quant by one step and
 * the logits by more than the rounding itself (perf-notes v32). Process-wide; set it before
 * the sequences it should apply to start. */
void lm_qwen3_set_cpu_kv_bf16(bool on);
bool lm_qwen3_cpu_kv_bf16(void);
/* The same step on CUDA returning the chosen ids, and the logits when `logits` is not NULL
 * (model.h, lm_model_forward_sample);
 * LM_ERR_UNSUPPORTED on the CPU. On CUDA (load args `cuda`) every function here runs on the
 * device through qwen3/gpu.h: weights uploaded as bf16, the KV pool in device memory. */
lm_status lm_qwen3_forward_sample(void *state, void *kv, const struct lm_batch_seq *seqs, int n_seqs,
                                  const struct lm_device_sampling *sampling, int32_t *ids,
                                  float *logits);
/* A queued step and the oldest queued step's ids on CUDA (model.h, lm_model_queue_sample,
 * lm_model_collect; qwen3/gpu.h); LM_ERR_UNSUPPORTED on the CPU. */
lm_status lm_qwen3_queue_sample(void *state, void *kv, const struct lm_batch_seq *seqs, int n_seqs,
                                const struct lm_device_sampling *sampling, const int32_t *feed);
lm_status lm_qwen3_collect(void *state, void *kv, int32_t *ids, int *n_ids);

#endif
