/* model.h: a loaded model (config, weights, tokenizer, generation defaults, family) and the
 * per-sequence state (KV cache) that its forward pass runs over.
 *
 * lm_model_open reads a Hugging Face model folder: config.json, model.safetensors or a sharded set
 * (model.safetensors.index.json), generation_config.json (optional), tokenizer.json and
 * tokenizer_config.json (from the folder or from `tokenizer_dir`). The family is chosen by
 * config.json's model_type through the family registry (family.h); the engine and server never
 * test a family's name, they ask the family what it can do. */
#ifndef LM_FAMILY_MODEL_H
#define LM_FAMILY_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "family/chat.h"
#include "text/tokenizer.h"

#define LM_MAX_EOS 8

/* Hugging Face config.json keys for a decoder-only transformer (Qwen3 names). */
struct lm_model_config {
    char model_type[32];         /* "qwen3" */
    int hidden_size;             /* d_model */
    int intermediate_size;       /* MLP width */
    int num_hidden_layers;       /* layers */
    int num_attention_heads;     /* query heads */
    int num_key_value_heads;     /* KV heads (GQA) */
    int head_dim;                /* per-head width; q width = heads * head_dim may differ from hidden */
    float rms_norm_eps;          /* RMSNorm epsilon */
    double rope_theta;           /* rope_theta or rope_parameters.rope_theta */
    int max_position_embeddings; /* context limit in tokens */
    bool tie_word_embeddings;    /* lm_head shares embed_tokens */
    int vocab_size;              /* rows of embed_tokens / lm_head */
    int bos_token_id;            /* -1 when absent */
};

/* Generation defaults from generation_config.json (and config.json's eos_token_id). */
struct lm_gen_defaults {
    int32_t eos_token_ids[LM_MAX_EOS]; /* generation stops at any of these */
    int n_eos;
    float temperature; /* < 0 when generation_config.json sets none */
    float top_p;       /* < 0 when unset */
    int top_k;         /* < 0 when unset */
};

/* Tasks a family can run; the server dispatches on these. */
enum lm_task {
    LM_TASK_TEXT_GENERATION = 1u << 0,   /* /v1/completions */
    LM_TASK_TEXT_CONVERSATION = 1u << 1, /* /v1/chat/completions */
};

struct lm_model;
struct lm_seq;

struct lm_model_open_params {
    const char *tokenizer_dir; /* NULL: the model folder holds tokenizer.json */
    bool tokenizer_optional;   /* a model folder without tokenizer.json (and no tokenizer_dir)
                                  opens with no tokenizer: lm_model_tokenizer returns NULL. For
                                  callers that feed token ids only (`lumen perf`); default false:
                                  the missing file is an LM_ERR_MISSING naming it */
    int n_threads;             /* CPU threads for the forward pass; 0 = all online cores */
    bool map_weights;          /* false (default): weights are read into anonymous memory;
                                  true: matrices are used in place from the file map */
    bool scalar_kernels;       /* run the plain scalar reference kernels (tests) */
    const char *device;        /* where the forward pass runs: NULL or "cpu" (default), "cuda"
                                  (device 0) or "cuda:N". On CUDA the weights are uploaded as
                                  bf16 (backend/cuda/qwen3.h) when the first KV cache is created,
                                  the KV cache lives in device memory (bf16) and the host keeps
                                  the checkpoint mapped, row-major. Errors: LM_ERR_INVALID for
                                  another string; LM_ERR_UNSUPPORTED when lumen was built without
                                  CUDA, when no such device is found, or when its compute
                                  capability is below 9.0 (the message names the device). */
};
struct lm_model_open_params lm_model_default_open_params(void);

/* Opens the model folder `dir`. *out is caller-owned (lm_model_close). Errors name the file and
 * the problem: LM_ERR_IO, LM_ERR_FORMAT (truncated or corrupt), LM_ERR_MISSING (a tensor or key),
 * LM_ERR_SHAPE (a tensor's shape or dtype), LM_ERR_UNSUPPORTED (model_type). */
lm_status lm_model_open(const char *dir, const struct lm_model_open_params *params,
                        struct lm_model **out);
void lm_model_close(struct lm_model *m);
/* The error lm_model_open gives for a model folder `dir` without tokenizer.json (and no
 * tokenizer_dir): records "DIR: the model folder has no tokenizer.json; pass --tokenizer DIR ..."
 * as the thread's error and returns LM_ERR_MISSING. For the CLI's checks before opening. */
lm_status lm_model_missing_tokenizer(const char *dir);

/* Borrowed views, valid until lm_model_close. */
const struct lm_model_config *lm_model_config(const struct lm_model *m);
const struct lm_gen_defaults *lm_model_gen_defaults(const struct lm_model *m);
/* NULL only for a folder opened with tokenizer_optional that holds no tokenizer.json. */
const struct lm_tokenizer *lm_model_tokenizer(const struct lm_model *m);
unsigned lm_model_tasks(const struct lm_model *m);  /* enum lm_task bits */
const char *lm_model_name(const struct lm_model *m); /* the folder's base name, for /v1/models */

/* How the model runs, for `lumen perf` and logs. Strings are static or borrowed until close. */
struct lm_model_info {
    const char *weight_dtype; /* dtype of the weight matrices: "bf16", "f16", "f32", "q8_0" or
                                 "mixed"; on CUDA what the decode GEMV reads: "q8_0" or "bf16" */
    const char *kernels;      /* the CPU kernels in use: "avx512", "avx2", "generic", "scalar" */
    bool weights_mapped;      /* true: used in place from the file map; false: read into memory */
    bool weights_locked;      /* mapped weights were prefaulted and locked resident (mlock) */
    const char *format;       /* "safetensors" (a model folder) or "gguf" */
    size_t weight_bytes;      /* bytes of weights held (copied plus mapped) */
    long n_params;            /* parameters held (lm_head counted once when tied) */
    int n_threads;            /* threads of the forward pass (1 on CUDA) */
    const char *device;       /* "cpu", or "cuda:N" (CUDA) */
    const char *device_name;  /* "cpu", or the GPU's name ("NVIDIA H200") */
    size_t device_memory_free;  /* CUDA: bytes of device memory free when the model was opened
                                   (before its weights were uploaded); 0 on the CPU */
    size_t device_weight_bytes; /* CUDA: bytes the weights take on the device (2 per parameter,
                                   bf16, plus 17/16 for a Q8_0 checkpoint's quants and
                                   scales); 0 on the CPU */
};
void lm_model_info(const struct lm_model *m, struct lm_model_info *out);

/* Renders a conversation with the family's chat template into `out` (appended).
 * LM_ERR_UNSUPPORTED for tool roles/calls; LM_ERR_INVALID for a malformed conversation. */
lm_status lm_model_render_chat(const struct lm_model *m, const struct lm_chat_msg *msgs, size_t n,
                               const struct lm_chat_opts *opts, struct lm_buf *out);

/* ---- paged KV cache and the batched forward step ----
 *
 * The serving engine keeps every sequence's keys and values in one pool of fixed-size blocks
 * (vLLM's PagedAttention, Kwon et al. 2023): a sequence owns a block table, and position t of it
 * lives in slot t % LM_KV_BLOCK of block table[t / LM_KV_BLOCK]. Which blocks belong to whom,
 * prefix sharing and eviction are the engine's business (engine/kv.h); the model only stores
 * and reads the rows. A forward step runs the new tokens of many sequences at once, so each
 * weight matrix is read once per step; every row is computed exactly as it would be alone
 * (batch invariance: the kernels' order of operations does not depend on the batch), so a
 * sequence's logits are the same bits alone, batched, or prefilled in chunks. */

#define LM_KV_BLOCK 16 /* positions per KV block */

struct lm_kv_cache;

/* Bytes of K and V one position takes over all layers: float32 on the CPU, bf16 on CUDA. */
size_t lm_model_kv_bytes_per_token(const struct lm_model *m);

/* A pool of `n_blocks` KV blocks plus the scratch of a forward step of up to `max_batch`
 * tokens over sequences of up to `max_ctx` positions (at most max_position_embeddings).
 * Memory is mapped lazily (pages never written cost nothing). Caller-owned
 * (lm_kv_cache_destroy). LM_ERR_INVALID for a size below 1, LM_ERR_RANGE for max_ctx beyond
 * the model's, LM_ERR_NOMEM with the sizes in the message.
 * On CUDA the pool is device memory (bf16) and the model's weights are uploaded on the first
 * call (again only when a later cache needs larger sizes); a model holds at most one live cache
 * there (LM_ERR_INVALID while another exists). */
lm_status lm_kv_cache_create(struct lm_model *m, int n_blocks, int max_batch, int max_ctx,
                             struct lm_kv_cache **out);
void lm_kv_cache_destroy(struct lm_kv_cache *kv); /* accepts NULL */
int lm_kv_cache_blocks(const struct lm_kv_cache *kv);
int lm_kv_cache_max_batch(const struct lm_kv_cache *kv);
int lm_kv_cache_max_ctx(const struct lm_kv_cache *kv);
/* Copies the K/V of the first n_rows (<= LM_KV_BLOCK) positions of block `src` into block
 * `dst`, every layer: a sequence reusing part of a cached block gets its own copy to extend.
 * (On CUDA a device-to-device copy; a CUDA failure there is reported by the next forward.) */
void lm_kv_cache_copy(struct lm_kv_cache *kv, int src, int dst, int n_rows);

enum lm_logits_want {
    LM_LOGITS_NONE, /* no logits for this sequence (a prefill chunk that does not end the prompt) */
    LM_LOGITS_LAST, /* one row: the last new token's */
    LM_LOGITS_ALL,  /* n rows: every new token's */
};

/* One sequence's part of a forward step. */
struct lm_batch_seq {
    const int32_t *ids;    /* [n] new token ids, each in [0, vocab_size); borrowed */
    int n;                 /* >= 1 */
    int pos;               /* position of ids[0]: K/V of positions 0..pos-1 are in the cache */
    const int32_t *blocks; /* block table, ceil((pos + n) / LM_KV_BLOCK) entries, each a block
                              of the cache; borrowed. Blocks of positions before pos are only
                              read; the rows of pos..pos+n-1 are written. */
    enum lm_logits_want logits;
};

/* Runs one step: every sequence's new tokens at their positions, writing their K/V into the
 * cache and attending causally over their own earlier positions. logits: float32
 * [rows, vocab_size], the sequences' rows in order (1 for LAST, n for ALL, 0 for NONE); may be
 * NULL when no sequence wants any. Two sequences must not write the same block slot.
 * LM_ERR_RANGE when the tokens exceed max_batch or a sequence passes max_ctx; LM_ERR_INVALID for
 * an id outside the vocabulary (message names the sequence and index). The cache is unchanged
 * on an error. One step at a time per model (other steps wait). */
lm_status lm_model_forward(struct lm_model *m, struct lm_kv_cache *kv, const struct lm_batch_seq *seqs,
                           int n_seqs, float *logits);

/* ---- choosing tokens on the device ----
 *
 * On a GPU, copying a 151,936-float logits row per sequence to the host and sampling there costs
 * more than the forward step itself at 64+ sequences. A model whose device samples
 * (lm_model_samples_on_device) can instead return only the chosen ids: greedy, or temperature,
 * top_k and top_p, in that order (backend/cuda/cuda.h, struct lm_cuda_sampling). Penalties,
 * min_p and logprobs need the logits: the same call can return them too, for those rows.
 * A draw is a function of (seed, counter) alone, so a seeded request is reproducible and
 * independent of what it is batched with on that device; it draws from a different random
 * stream than the CPU sampler (engine/sampler.h), so seeded CPU and CUDA runs differ. */
struct lm_device_sampling {
    float temperature; /* <= 0: greedy (argmax; ties to the lowest id) */
    float top_p;       /* (0, 1); >= 1: off */
    int top_k;         /* 0: off */
    uint64_t seed;     /* the request's seed */
    uint64_t counter;  /* index of the token being drawn in its request (0 = the first) */
};

/* True when lm_model_forward_sample can run (the model runs on CUDA). */
bool lm_model_samples_on_device(const struct lm_model *m);

/* The most tokens of one sequence a step should carry when all of them want logits and their
 * positions follow each other (speculative decoding's verification, engine/spec.h): on CUDA the
 * decode kernel's run limit (LM_CUDA_DEC_RUN, 8), beyond which the whole step leaves the decode
 * graph; on the CPU there is no such limit (a large number). */
int lm_model_max_run(const struct lm_model *m);

/* lm_model_forward, but returns ids[r] = the token chosen for output row r with sampling[r]
 * (rows as lm_model_forward's: 1 for LAST, n for ALL, 0 for NONE); logits: NULL, or float32
 * [rows, vocab] also written, as lm_model_forward writes them, for a step where some rows are
 * sampled on the host (penalties, logprobs) and the others keep their device draws. Errors as
 * lm_model_forward; LM_ERR_UNSUPPORTED when lm_model_samples_on_device is false. */
lm_status lm_model_forward_sample(struct lm_model *m, struct lm_kv_cache *kv,
                                  const struct lm_batch_seq *seqs, int n_seqs,
                                  const struct lm_device_sampling *sampling, int32_t *ids,
                                  float *logits);

/* ---- decode steps queued ahead ----
 *
 * lm_model_forward_sample waits for its step, so the GPU idles while the host takes the step's
 * tokens and builds the next one (~10 us a step on an H200: perf-notes v34). A decode loop whose
 * next step carries the tokens this one chooses can queue that step first: its tokens are taken
 * from this step's choices on the device, and the host collects this step's ids while the GPU
 * runs the next (vLLM's asynchronous scheduling). Steps are collected in the order queued, at
 * most two queued at a time; lm_model_forward and lm_model_forward_sample need none queued. */

/* True when lm_model_queue_sample can run (the model runs on CUDA). */
bool lm_model_can_queue(const struct lm_model *m);

/* Queues a step as lm_model_forward_sample would run it, without logits, and returns once it is
 * queued: every sequence one token (n 1, LM_LOGITS_LAST). feed: NULL, or [n_seqs]: -1, the
 * token is seqs[i].ids[0]; r >= 0, it is the id the step queued just before this one chose for
 * its output row r (seqs[i].ids is not read). sampling: [n_seqs]. The tokens' K/V are written
 * to the blocks as by lm_model_forward, in queue order, before anything queued later reads them.
 * Errors as lm_model_forward_sample; LM_ERR_RANGE for a step that is not one token a sequence
 * or has more sequences than one device call takes; LM_ERR_INVALID for a feed outside the last
 * step's rows, or with two steps queued already. */
lm_status lm_model_queue_sample(struct lm_model *m, struct lm_kv_cache *kv, const struct lm_batch_seq *seqs,
                                int n_seqs, const struct lm_device_sampling *sampling, const int32_t *feed);

/* Waits for the oldest queued step and writes its ids, one a sequence in order (*n_ids of them,
 * when n_ids is not NULL). LM_ERR_INVALID with none queued; LM_ERR_IO when it failed on the
 * device. */
lm_status lm_model_collect(struct lm_model *m, struct lm_kv_cache *kv, int32_t *ids, int *n_ids);

/* ---- one sequence on its own cache (run, perf, logits, tests) ---- */

/* A sequence with a private paged cache of `max_tokens` positions (blocks in order) and the
 * scratch for chunks of up to 256 tokens (512 on CUDA). Caller-owned (lm_seq_destroy). LM_ERR_NOMEM when the
 * cache cannot be allocated; LM_ERR_RANGE when max_tokens exceeds max_position_embeddings. */
lm_status lm_seq_create(struct lm_model *m, int max_tokens, struct lm_seq **out);
void lm_seq_destroy(struct lm_seq *s);
int lm_seq_len(const struct lm_seq *s);      /* positions held in the cache */
int lm_seq_capacity(const struct lm_seq *s); /* max_tokens given at create */
void lm_seq_truncate(struct lm_seq *s, int n); /* keep the first n positions (n <= len) */

/* Runs `n` new tokens at positions len..len+n-1, appending their K/V to the cache (through
 * lm_model_forward, in chunks of up to 256 tokens, 512 on CUDA).
 * logits: float32 [n, vocab_size] when all_logits, else [1, vocab_size] for the last position.
 * LM_ERR_RANGE when len + n exceeds the capacity; LM_ERR_INVALID for an id outside the vocab. */
lm_status lm_seq_forward(struct lm_seq *s, const int32_t *ids, int n, float *logits, bool all_logits);

#endif
