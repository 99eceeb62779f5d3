/* gpu.h: the Qwen3 family on a CUDA device (family-private; used by qwen3/model.c).
 *
 * The family keeps its host weights row-major (the store maps the checkpoint) and describes them
 * to the CUDA backend (backend/cuda/qwen3.h, struct lm_cuda_qwen3_weights). The device model,
 * which holds the bf16 weights and the device KV pool together, is created when the engine
 * creates a KV cache (lm_qwen3_gpu_kv_open), because only then are the pool's sizes known; it is
 * kept after the cache closes and reused by a later cache of the same or smaller sizes. Each
 * forward step becomes one lm_cuda_qwen3_forward (more only when a step has more output rows or
 * sequences than the device model's max_seqs).
 *
 * Built without CUDA (LM_HAVE_CUDA undefined) every function here answers LM_ERR_UNSUPPORTED
 * "built without CUDA". Not thread-safe: the model serialises forward steps. */
#ifndef LM_FAMILY_QWEN3_GPU_H
#define LM_FAMILY_QWEN3_GPU_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/cuda/qwen3.h"
#include "family/model.h"

struct lm_qwen3_gpu;

/* Takes the host weights `w` (borrowed: its pointers, layers included, must stay valid until
 * lm_qwen3_gpu_close) for CUDA device `device`; checks the shapes the kernels take
 * (LM_ERR_UNSUPPORTED, naming the field) but uploads nothing yet. Caller closes *out. */
lm_status lm_qwen3_gpu_open(const struct lm_cuda_qwen3_weights *w, int device,
                            struct lm_qwen3_gpu **out);
void lm_qwen3_gpu_close(struct lm_qwen3_gpu *g); /* accepts NULL */

/* Opens the one KV cache: n_blocks blocks of LM_KV_BLOCK positions, steps of up to max_batch
 * tokens, sequences of up to max_ctx positions. Uploads the weights when no device model of at
 * least these sizes exists. LM_ERR_INVALID while a cache is open; errors of
 * lm_cuda_qwen3_create (LM_ERR_NOMEM with the sizes, LM_ERR_UNSUPPORTED, LM_ERR_IO). */
lm_status lm_qwen3_gpu_kv_open(struct lm_qwen3_gpu *g, int n_blocks, int max_batch, int max_ctx);
void lm_qwen3_gpu_kv_close(struct lm_qwen3_gpu *g);
/* lm_kv_cache_copy on the device pool. */
lm_status lm_qwen3_gpu_kv_copy(struct lm_qwen3_gpu *g, int src, int dst, int n_rows);

/* One step (model.h, lm_model_forward; the caller checked it). logits: NULL or float32
 * [rows, vocab] written for the output rows; sampling: NULL (greedy) or [rows]; ids: NULL or
 * [rows] written with the chosen ids. */
lm_status lm_qwen3_gpu_forward(struct lm_qwen3_gpu *g, const struct lm_batch_seq *seqs, int n_seqs,
                               float *logits, const struct lm_device_sampling *sampling,
                               int32_t *ids);

/* A step queued, not waited for (model.h, lm_model_queue_sample; the caller checked the step):
 * one device call (lm_cuda_batch.async) whose token i is fed the previous call's output feed[i]
 * where feed is not NULL and feed[i] >= 0. LM_ERR_RANGE when the step does not fit one call
 * (more than max_seqs sequences, or a sequence of more than one token or without LAST logits). */
lm_status lm_qwen3_gpu_queue(struct lm_qwen3_gpu *g, const struct lm_batch_seq *seqs, int n_seqs,
                             const struct lm_device_sampling *sampling, const int32_t *feed);
/* The oldest queued step's ids (lm_cuda_qwen3_collect): *n_ids of them into ids. */
lm_status lm_qwen3_gpu_collect(struct lm_qwen3_gpu *g, int32_t *ids, int *n_ids);

#endif
