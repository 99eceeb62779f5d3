/* qwen3.h: a Qwen3 model on one CUDA device (qwen3.cu): the weights uploaded once as bf16, a
 * paged KV cache in device memory, and a batched forward step that the serving engine drives.
 *
 * The forward pass is transformers' Qwen3ForCausalLM (models/qwen3/modeling_qwen3.py), the same
 * as src/family/qwen3/model.c on the CPU: embed -> [RMSNorm -> q/k/v -> q_norm/k_norm -> RoPE ->
 * attention -> o_proj -> residual -> RMSNorm -> SwiGLU MLP -> residual] x layers -> RMSNorm ->
 * lm_head -> sampling. What differs, and why:
 * - q/k/v are one [q + 2 kv, hidden] matrix and gate/up one [2 * intermediate, hidden] matrix with
 *   interleaved rows, so a step is 4 matrix kernels a layer and SwiGLU is fused into one.
 * - K/V are stored in bf16 (halves the cache bytes; the CPU keeps float32): logits then differ
 *   from the CPU's by bf16 rounding (about 1e-3 relative), not by float32 rounding.
 * - Up to gemv_max_rows tokens a call (decode at batch 1-4) run the linear layers as GEMV with
 *   float32 activations, each output's sum in a fixed order: a sequence's logits are bit-identical
 *   whatever else is in the batch. There the MLP is one kernel (lm_cuda_mlp1, or lm_cuda_mlp1_q8
 *   over a Q8_0 checkpoint's quants from 2 tokens a call; params.mlp1):
 *   down_proj is split over the intermediate dimension and its partial sums are added as 64-bit
 *   fixed point (deterministic; bf16: within float32 rounding of the two-launch MLP; Q8_0: the
 *   same bits as the two launches that serve one token, whose down_proj sums the same way), which the next
 *   GEMV folds into the residual stream: 3 kernels a layer besides the attention. Larger calls
 *   (prefill, large batches) use bf16 activations and float32 accumulation (lm_cuda_gemm: the
 *   tensor-core kernel up to 64 rows, cuBLAS above), like other GPU engines: results then match
 *   at bf16 tolerance, not bit for bit. Where the model's shapes take the tensor-core kernel and
 *   the GEMV would read bf16 weights, decode steps from one token take it too, the RMSNorms
 *   carried by the GEMMs around them (lm_cuda_qwen3_info.tc_decode, params.norm_link).
 * - A decode step (every token its own sequence) is captured once per batch size bucket as a CUDA
 *   graph (every kernel, the last storing the chosen ids into page-locked host memory), so a step
 *   is one launch; its inputs are copied on a second stream first (lm_cuda_qwen3_forward).
 *
 * Plugging into the serving engine (`lumen serve --device cuda`, family/qwen3/gpu.c): the engine keeps
 * its paged KV allocator on the host and hands this model block ids in [0, n_blocks) with the
 * same block_size (lm_cuda_qwen3_info); each engine step becomes one lm_cuda_qwen3_forward with
 * every running sequence's token (decode) and the prefill chunks of new ones, out_tokens naming
 * the last token of each sequence that needs a choice, per-row sampling parameters (seed and
 * token counter per request), and only the chosen ids coming back. The family fills
 * lm_cuda_qwen3_weights from its own tensors (row-major; the CPU's packed layouts are refused).
 *
 * Threads: one thread at a time per model. Errors: LM_ERR_UNSUPPORTED (no CUDA device, or a model
 * shape the kernels cannot take), LM_ERR_NOMEM (device memory), LM_ERR_INVALID / LM_ERR_RANGE
 * (a batch that breaks the limits below), LM_ERR_IO (a CUDA failure, with its message). */
#ifndef LM_BACKEND_CUDA_QWEN3_H
#define LM_BACKEND_CUDA_QWEN3_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "backend/cpu/ops.h" /* enum lm_dtype */
#include "base/status.h"

/* config.json values (Hugging Face names in the comments). */
struct lm_cuda_qwen3_config {
    int hidden;        /* hidden_size */
    int intermediate;  /* intermediate_size */
    int n_layers;      /* num_hidden_layers */
    int n_heads;       /* num_attention_heads */
    int n_kv_heads;    /* num_key_value_heads */
    int head_dim;      /* head_dim: 16, 32, 64, 128 or 256 */
    int vocab;         /* vocab_size */
    float rms_norm_eps;
    double rope_theta;
};

/* A host matrix [rows, cols], row-major, in its stored dtype: f32, f16, bf16 or Q8_0 (all
 * converted to bf16 on upload; Q8_0 is dequantized, so it saves no device memory yet). */
struct lm_cuda_matrix {
    const void *data; /* borrowed for the duration of lm_cuda_qwen3_create */
    enum lm_dtype dtype;
    int rows, cols;
};

/* One decoder layer's host weights; float vectors are [hidden] or [head_dim]. */
struct lm_cuda_qwen3_layer_weights {
    const float *input_layernorm;
    struct lm_cuda_matrix q_proj, k_proj, v_proj; /* [heads * D, hidden], [kv * D, hidden] x 2 */
    const float *q_norm, *k_norm;                 /* [head_dim] */
    struct lm_cuda_matrix o_proj;                 /* [hidden, heads * D] */
    const float *post_attention_layernorm;
    struct lm_cuda_matrix gate_proj, up_proj;     /* [intermediate, hidden] */
    struct lm_cuda_matrix down_proj;              /* [hidden, intermediate] */
};

/* The host-side model, laid out as family/qwen3/model.c holds it (struct lm_mat converts to
 * struct lm_cuda_matrix field by field). Everything is borrowed during create only. */
struct lm_cuda_qwen3_weights {
    struct lm_cuda_qwen3_config cfg;
    struct lm_cuda_matrix embed_tokens; /* [vocab, hidden] */
    struct lm_cuda_matrix lm_head;      /* [vocab, hidden]; data == embed_tokens.data when tied
                                           (uploaded once) */
    const float *norm;                  /* [hidden] final RMSNorm */
    const struct lm_cuda_qwen3_layer_weights *layers; /* [n_layers] */
};

struct lm_cuda_qwen3_params {
    int device;        /* CUDA device index (default 0) */
    int max_tokens;    /* tokens one forward call may carry (a prefill chunk); default 2048 */
    int max_seqs;      /* sequences (block-table rows) and logits rows one call may carry, and the
                          largest decode graph; default 256 */
    int max_context;   /* positions a sequence may reach; default 4096 */
    int block_size;    /* tokens per KV block; default 16 */
    int n_blocks;      /* KV blocks in the pool (ids 0 .. n_blocks-1 are the caller's); 0: as many
                          as kv_mib holds */
    int kv_mib;        /* KV pool size when n_blocks is 0; default 4096 */
    bool graphs;       /* capture decode steps as CUDA graphs (default true) */
    bool pdl;          /* programmatic dependent launch between kernels (default true) */
    int gemv_max_rows; /* calls of up to this many tokens use the float32 GEMV path (default 4,
                          at most 8; 0 = cuBLAS always) */
    bool mlp1;         /* steps on the GEMV path (up to gemv_max_rows tokens) run each layer's MLP
                          as one kernel (lm_cuda_mlp1: split-K down_proj with fixed-point atomics)
                          where the shape fits, over the bf16 rows or (lm_cuda_mlp1_q8, from 2
                          tokens: lm_cuda_qwen3_info.mlp1_min_rows) a Q8_0 checkpoint's quants
                          (default true; LM_CUDA_MLP1=0 in
                          the environment: false, for A/B) */
    bool norm_link;    /* batched steps whose four layer GEMMs all take the tensor-core kernel
                          carry the RMSNorms through them (lm_cuda_norm_link: o_proj and down_proj
                          write the next norm's input, gate/up and q/k/v scale by it) instead of
                          running the norm kernel twice a layer (default true; LM_CUDA_NORM_LINK=0
                          in the environment: false, for A/B; perf-notes v23) */
    bool lm_screen;    /* greedy steps of up to gemv_max_rows outputs whose logits the caller does not
                          ask for (lm_cuda_batch.out_logits NULL, no sampling) choose their tokens
                          from a 6-bit screen of a bf16 lm_head and sum only the rows it cannot rule
                          out (lm_cuda_gemv_screen, lm_cuda_argmax_screened: the same ids as the
                          full lm_head, 0.41x its bytes; 0.81 bytes a weight more device memory,
                          built at load). Default true; LM_CUDA_LM_SCREEN=0 in the environment:
                          false, for A/B (perf-notes v33, v40) */
    bool quantize_q8;  /* lm_cuda_qwen3_open_dir only: quantize every matrix to Q8_0 on load (as
                          `lumen build --dtype q8_0`), for `lumen cudabench --q8` (default false) */
};
struct lm_cuda_qwen3_params lm_cuda_qwen3_default_params(void);

struct lm_cuda_qwen3;

/* Uploads the weights (bf16; q/k/v and gate/up concatenated as above) and allocates the KV pool
 * and the scratch for max_tokens. *out is caller-owned (lm_cuda_qwen3_destroy). */
lm_status lm_cuda_qwen3_create(const struct lm_cuda_qwen3_weights *w,
                               const struct lm_cuda_qwen3_params *params, struct lm_cuda_qwen3 **out);

/* Reads a Hugging Face model folder (config.json, model.safetensors or shards; model_type qwen3)
 * and calls lm_cuda_qwen3_create. Errors name the file and key or tensor. */
lm_status lm_cuda_qwen3_open_dir(const char *dir, const struct lm_cuda_qwen3_params *params,
                                 struct lm_cuda_qwen3 **out);

void lm_cuda_qwen3_destroy(struct lm_cuda_qwen3 *m); /* accepts NULL */

struct lm_cuda_qwen3_info {
    struct lm_cuda_qwen3_config cfg;
    char device[128];
    int n_blocks, block_size, bt_width;  /* bt_width = ceil(max_context / block_size) */
    int max_tokens, max_seqs;
    size_t weight_bytes;                 /* bf16 bytes of weights on the device */
    size_t step_bytes;                   /* weight bytes a decode step reads (every matrix once,
                                            one embedding row): the bandwidth floor's numerator */
    size_t kv_bytes_per_block;           /* K and V, all layers */
    int mlp1_min_rows;                   /* steps on the GEMV path of at least this many tokens
                                            run each MLP as one kernel: 1 (bf16, lm_cuda_mlp1),
                                            2 (Q8_0 quants, lm_cuda_mlp1_q8; one token runs the two
                                            launches, which sum down_proj the same way), or 0
                                            (never: params.mlp1 off, or the shape does not fit) */
    bool tc_decode;                      /* decode steps of 1 to 64 tokens (plain or carrying
                                            speculative runs) run the layer GEMMs on the
                                            tensor-core kernel with the norm link (perf-notes
                                            v23), not the GEMV: the model's shapes take it, its
                                            weights are bf16 for the GEMV, params.norm_link is on
                                            and neither LM_CUDA_GEMV_PLAIN_ROWS nor
                                            lm_cuda_qwen3_set_tc_decode(false) chose the GEMV */
    bool lm_screen;                      /* params.lm_screen is on and the lm_head's screen was
                                            built (bf16 lm_head, lm_cuda_screen_fits(hidden)) */
    long screened_steps;                 /* forward calls so far whose tokens came from the
                                            screen (lm_cuda_gemv_screen) */
    size_t screen_step_bytes;            /* with lm_screen: the weight bytes a screened greedy
                                            step reads (step_bytes with the screen's quants,
                                            scales and row norms in place of the bf16 lm_head:
                                            lm_cuda_screen_bytes + 8 bytes a row),
                                            else 0 */
};
void lm_cuda_qwen3_info(const struct lm_cuda_qwen3 *m, struct lm_cuda_qwen3_info *out);

/* Drops the captured step graphs, so later steps capture new ones: after a context setting that
 * graphs keep (lm_cuda_ctx_trace, the attention and GEMM choices in cuda.h) changed. */
void lm_cuda_qwen3_drop_graphs(struct lm_cuda_qwen3 *m);
/* Changes how later steps run (drops captured graphs): graphs on/off, PDL on/off, GEMV limit. */
void lm_cuda_qwen3_set_options(struct lm_cuda_qwen3 *m, bool graphs, bool pdl, int gemv_max_rows);
/* Lets decode steps take the tensor-core GEMM from one token where the model allows it
 * (lm_cuda_qwen3_info.tc_decode; on by default), or keeps them on the GEMV rule (false), for A/B
 * measurements. Drops the captured graphs. */
void lm_cuda_qwen3_set_tc_decode(struct lm_cuda_qwen3 *m, bool on);
/* Turns lm_cuda_qwen3_params.mlp1 on or off for later steps (drops the captured graphs). */
void lm_cuda_qwen3_set_mlp1(struct lm_cuda_qwen3 *m, bool on);
/* Turns params.lm_screen on or off for later steps (drops the captured graphs); on takes effect
 * only where the model built the screen at load (lm_cuda_qwen3_info.lm_screen). */
void lm_cuda_qwen3_set_lm_screen(struct lm_cuda_qwen3 *m, bool on);
/* Turns lm_cuda_qwen3_params.norm_link on or off for later steps (drops the captured graphs). */
void lm_cuda_qwen3_set_norm_link(struct lm_cuda_qwen3 *m, bool on);
/* Whether the GEMV reads a Q8_0 checkpoint's quants (true, the default) or its bf16 copy, for
 * A/B measurements (`lumen cudabench --q8 --variants`). Drops the captured graphs. */
void lm_cuda_qwen3_set_q8(struct lm_cuda_qwen3 *m, bool on);

/* The model's CUDA context (stream, kernel options such as lm_cuda_ctx_set_gemv_rows). Borrowed,
 * valid until destroy. */
struct lm_cuda_ctx *lm_cuda_qwen3_ctx(struct lm_cuda_qwen3 *m);

/* Kernel timing on this model's weights, for benchmarks: `what` is a linear layer (0 q/k/v with
 * its RMSNorm, 1 o_proj + residual, 2 gate/up + SwiGLU with its RMSNorm, 3 down_proj + residual,
 * 4 lm_head with the final RMSNorm) for `n` activation rows, or 5 the fused decode attention of
 * the last decode step of n sequences (run one first), or 6 the argmax of n logits rows, or 7-10
 * the batched path's lm_cuda_gemm of q/k/v, o_proj (+ residual), gate/up, down_proj (+ residual)
 * over bf16 activations (n up to 64; bf16 weights); one launch per layer (lm_head, attention,
 * argmax: 8 launches) captured as a graph and replayed `reps` times after a warm-up. *us: median
 * microseconds per launch; *bytes: weight bytes one launch reads (0 for 5 and 6). */
lm_status lm_cuda_qwen3_bench_linear(struct lm_cuda_qwen3 *m, int what, int n, int reps, double *us,
                                     double *bytes);

/* GPU time of a decode step alone: replays the graph the last decode step ran, which must have
 * been of batch bucket `n` (run a decode step of n sequences first; the replays repeat it with
 * the same inputs: its context class, sampling and attention work list) `reps` times back to back
 * between two events. *us: median microseconds per replay. LM_ERR_INVALID when the last decode
 * step was not a graph of that bucket. */
lm_status lm_cuda_qwen3_bench_step(struct lm_cuda_qwen3 *m, int n, int reps, double *us);

/* Per-row sampling: struct lm_cuda_sampling of backend/cuda/cuda.h. */
struct lm_cuda_sampling;

/* One forward step over n_tokens tokens of up to max_seqs sequences (host arrays, borrowed):
 * token i has id ids[i] at position pos[i] of the sequence whose block table is row seq[i] of
 * block_tables. Each token attends to positions 0..pos[i] of its sequence: the caller has run
 * every earlier position (in an earlier call or earlier in this one) and its row names a block for
 * each of them (ids < n_blocks). Tokens of one sequence may appear in any order within a call.
 * A call with n_out == n_tokens and out_tokens[i] == i whose sequences each hold one run of
 * consecutive tokens (rows i, i + 1, ... at positions p, p + 1, ...) is a decode step and runs as
 * a captured graph: a plain decode step (one token a sequence), or the verification of
 * speculative drafts (runs of up to LM_CUDA_DEC_RUN tokens, where the decode attention kernel
 * fits the step: lm_cuda_attn.run_prev). Each token of a run then gets the bits it would get in
 * a step of its own after the earlier ones (tests/test_cuda_engine.c, verify vs decode). */
struct lm_cuda_batch {
    int n_tokens;                 /* 1 .. max_tokens */
    const int32_t *ids;           /* [n_tokens] in [0, vocab) */
    const int32_t *pos;           /* [n_tokens] in [0, max_context) */
    const int32_t *seq;           /* [n_tokens] in [0, n_seqs) */
    int n_seqs;                   /* 1 .. max_seqs */
    const int32_t *block_tables;  /* [n_seqs][bt_width] */
    int n_out;                    /* 1 .. min(n_tokens, max_seqs): tokens that produce a choice */
    const int32_t *out_tokens;    /* [n_out] indices into the tokens */
    const struct lm_cuda_sampling *sampling; /* [n_out] (host) or NULL: greedy */
    int32_t *out_ids;             /* [n_out] written: the chosen next ids (not written by a queued
                                     step: lm_cuda_qwen3_collect gives them) */
    float *out_logits;            /* NULL, or [n_out, vocab] written (float32) */
    /* The next decode step queued before the host has the last one's ids (vLLM's asynchronous
     * scheduling: the GPU runs step N + 1 while the host takes step N's tokens, instead of
     * waiting for the host between steps). feed: NULL, or [n_tokens]: -1, token i's id is
     * ids[i]; r >= 0, it is the id the previous call chose for its output r (r below that call's
     * n_out), read on the device when this step runs (ids[i] is not read). async: queue the step
     * and return once it is queued; out_logits must be NULL. */
    const int32_t *feed;
    bool async;
};

/* Runs (or, with b->async, queues) one step. Besides the range checks above: LM_ERR_INVALID for
 * a feed outside the previous call's outputs, and for a call while steps are queued and not
 * collected: a queued step may follow one queued step, a plain one none. */
lm_status lm_cuda_qwen3_forward(struct lm_cuda_qwen3 *m, const struct lm_cuda_batch *b);

/* Waits for the oldest queued step that was not collected and writes its n_out chosen ids to
 * out_ids (*n_out, when not NULL, gets the count). LM_ERR_INVALID with none queued; LM_ERR_IO
 * when the step failed on the device (a step queued after it is then dropped too). */
lm_status lm_cuda_qwen3_collect(struct lm_cuda_qwen3 *m, int32_t *out_ids, int *n_out);

/* Copies the K/V of the first n_rows (0..block_size) positions of block src into block dst, every
 * layer, K and V (one kernel on the model's stream, not waited for: the steps queued after it
 * see the copy; an asynchronous failure shows at the next step): a sequence reusing
 * part of a cached block gets its own copy to extend (family/model.h, lm_kv_cache_copy).
 * LM_ERR_INVALID for a block outside [0, n_blocks) or n_rows outside [0, block_size]; LM_ERR_IO
 * for a CUDA failure. */
lm_status lm_cuda_qwen3_kv_copy(struct lm_cuda_qwen3 *m, int src, int dst, int n_rows);

#ifdef __cplusplus
}
#endif

#endif
