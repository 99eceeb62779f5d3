/* family.h: the model-family registry, and the weight store the families load into.
 *
 * A family owns its semantics: the names and shapes of its weights, its forward pass, its chat
 * template and the tasks it can run. model.c finds the family by config.json's model_type
 * (lm_family_find) and calls it only through struct lm_family; nothing outside a family tests a
 * family's name. Adding a family: write family/<name>/family.c defining a `const struct
 * lm_family lm_family_<name>` and list it in family.c's registry.
 *
 * The weight store (struct lm_weight_store) hands a family its tensors looked up by name with
 * shape and dtype checked at load (as calm's tensors.c does). Matrices stay in their file dtype
 * (bf16/f16/f32, or Q8_0 from a GGUF; the matmul widens on the fly); vectors (norm weights) are
 * widened to float32. By default every tensor is copied into anonymous memory (huge pages), so
 * the decode loop never faults on a file page the kernel evicted, and matrices are stored in the
 * kernels' packed layout (ops.h, lm_cpu_pack; same numbers, faster streams); with `map` set,
 * matrices are used in place from the file map when aligned (row-major). */
#ifndef LM_FAMILY_FAMILY_H
#define LM_FAMILY_FAMILY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cpu/ops.h"
#include "base/buf.h"
#include "base/status.h"
#include "base/threadpool.h"
#include "family/chat.h"
#include "family/model.h"
#include "format/gguf.h"
#include "format/hf_config.h"
#include "format/safetensors.h"

/* A weight matrix [rows, cols], row-major, in its stored dtype. */
struct lm_mat {
    const void *data;    /* borrowed from the weight store */
    enum lm_dtype dtype;
    int rows, cols;
};

struct lm_weight_store {
    const struct lm_safetensors *st; /* borrowed during load; or */
    const struct lm_gguf *gguf;      /* borrowed during load: tensors named as llama.cpp does
                                        (lm_gguf_name_from_hf), extents reversed */
    bool map;                        /* use matrices in place from the map where aligned */
    bool locked;                     /* mapped matrices were locked resident (mlock) */
    unsigned char *arena;            /* copies are bump-allocated here (huge pages) */
    size_t arena_size, arena_used;
    void **allocs;                   /* owned copies, freed by lm_weight_store_free */
    size_t n_allocs, cap_allocs;
    size_t bytes_copied;             /* bytes held in anonymous memory */
    size_t bytes_mapped;             /* bytes used in place from the file maps */
    int n_matrices;                  /* matrices handed out */
    long n_params;                   /* elements of the tensors handed out */
    enum lm_dtype matrix_dtype;      /* dtype of the first matrix */
    bool mixed_dtypes;               /* matrices of more than one dtype */
};

/* Looks up matrix `name` (a Hugging Face tensor name) of shape [rows, cols] with dtype F32, F16,
 * BF16 or (GGUF only) Q8_0. LM_ERR_MISSING when absent, LM_ERR_SHAPE for another shape or dtype
 * (message names the file, tensor, expected and found), LM_ERR_NOMEM. out->data is valid until
 * lm_weight_store_free (and, when mapped, while the safetensors or GGUF file stay open). Mapped
 * matrices are prefaulted (MADV_WILLNEED) and locked with mlock where the limit allows, so the
 * decode loop does not fault on evicted file pages; `locked` says whether every one was. */
lm_status lm_weight_store_matrix(struct lm_weight_store *ws, const char *name, int rows, int cols,
                                 struct lm_mat *out);
/* Looks up vector `name` of shape [n] (F32, F16 or BF16) and returns a float32 copy owned by the
 * store. Errors as lm_weight_store_matrix. */
/* True when the source holds a tensor called `name` (a Hugging Face name). */
bool lm_weight_store_has(const struct lm_weight_store *ws, const char *name);
lm_status lm_weight_store_vector(struct lm_weight_store *ws, const char *name, int n, float **out);
/* Allocates `bytes` of zeroed, 64-byte aligned memory owned by the store (family tables). */
void *lm_weight_store_alloc(struct lm_weight_store *ws, size_t bytes);
/* Frees every copy; accepts a zeroed store. */
void lm_weight_store_free(struct lm_weight_store *ws);

/* Anonymous memory for large tables read in the decode loop (weights, KV caches): mapped
 * zero-filled, 64-byte aligned, with transparent huge pages requested (madvise), since a 4 KiB
 * page TLB walk per page of a streamed weight matrix costs a third of the memory bandwidth.
 * NULL when the memory cannot be had. Free with lm_huge_free and the same size. */
void *lm_huge_alloc(size_t bytes);
void lm_huge_free(void *p, size_t bytes);

/* What a family's load receives. All borrowed for the duration of the call, except `ws`, `pool`
 * and `ops`, which outlive the family's state (the model owns them). */
struct lm_family_load_args {
    const struct lm_model_config *cfg; /* parsed config.json */
    const struct lm_hf_config *hf;     /* the raw config.json, for family-specific keys */
    struct lm_weight_store *ws;        /* where tensors come from */
    struct lm_pool *pool;              /* the model's thread pool */
    const struct lm_cpu_ops *ops;      /* the kernels to run with */
    bool cuda;                         /* run on CUDA device cuda_device (model.h, `device`):
                                          the store maps the matrices row-major (ws->map) */
    int cuda_device;
};

/* A family's reasoning parser: splits a chat completion's generated text into reasoning (the
 * `reasoning_content` of OpenAI-compatible servers) and the answer (`content`) as the text
 * streams in. The server keeps one struct lm_reasoning per choice and feeds it every piece of
 * released text in order. The pieces that come out do not depend on how the text was cut:
 * feeding it whole gives the same two concatenations as feeding it in any pieces, because the
 * parser holds back bytes that may still turn out to be part of a tag. */
struct lm_reasoning {
    const struct lm_reasoning_ops *ops; /* borrowed, static */
    int state;                          /* the family's state machine */
    struct lm_buf held;                 /* text held back; owned (lm_reasoning_free) */
};

struct lm_reasoning_ops {
    /* Starts a completion of `prompt` (the rendered prompt text, `len` bytes): whether the
     * generation begins inside the reasoning block, may open one, or holds none follows from
     * how the prompt ends (enable_thinking=false renders an empty, closed block). */
    void (*begin)(struct lm_reasoning *r, const char *prompt, size_t len);
    /* Feeds `len` bytes of generated text; appends what is decided to `reasoning` and
     * `content` (UTF-8 in, whole characters out). */
    void (*push)(struct lm_reasoning *r, const char *text, size_t len, struct lm_buf *reasoning,
                 struct lm_buf *content);
    /* The text ended: appends what was held back. */
    void (*end)(struct lm_reasoning *r, struct lm_buf *reasoning, struct lm_buf *content);
};

/* Wrappers (family/reasoning.c). init starts `r` with `ops` for a completion of `prompt`;
 * free releases the held text and accepts a zeroed struct. */
void lm_reasoning_init(struct lm_reasoning *r, const struct lm_reasoning_ops *ops,
                       const char *prompt, size_t len);
void lm_reasoning_push(struct lm_reasoning *r, const char *text, size_t len,
                       struct lm_buf *reasoning, struct lm_buf *content);
void lm_reasoning_end(struct lm_reasoning *r, struct lm_buf *reasoning, struct lm_buf *content);
void lm_reasoning_free(struct lm_reasoning *r);

struct lm_family {
    const char *model_type; /* config.json model_type, e.g. "qwen3" */
    unsigned tasks;         /* enum lm_task bits */

    /* Checks the family-specific config keys and loads the weights; *state is the family's
     * (freed by unload). Errors name the file and key or tensor. */
    lm_status (*load)(const struct lm_family_load_args *args, void **state);
    void (*unload)(void *state);

    /* The paged KV pool and forward scratch (model.h, lm_kv_cache_create; all allocation
     * happens here, the forward never allocates). LM_ERR_NOMEM. */
    lm_status (*kv_create)(void *state, int n_blocks, int max_batch, int max_ctx, void **kv);
    void (*kv_destroy)(void *kv);
    /* Copies the first n_rows positions of block src into block dst, every layer. */
    void (*kv_copy)(void *kv, int src, int dst, int n_rows);

    /* One batched forward step (model.h, lm_model_forward; the caller checked ids, sizes and
     * block tables). logits: the sequences' requested rows in order. */
    lm_status (*forward)(void *state, void *kv, const struct lm_batch_seq *seqs, int n_seqs,
                         float *logits);
    /* Optional (NULL: none): the same step returning the chosen ids of the output rows, and the
     * logits too when `logits` is not NULL (model.h, lm_model_forward_sample);
     * LM_ERR_UNSUPPORTED when this state cannot (runs on the CPU). */
    lm_status (*forward_sample)(void *state, void *kv, const struct lm_batch_seq *seqs, int n_seqs,
                                const struct lm_device_sampling *sampling, int32_t *ids,
                                float *logits);
    /* Optional (NULL: none): a step queued without waiting, its fed tokens taken from the last
     * step's choices on the device, and the oldest queued step's ids (model.h,
     * lm_model_queue_sample, lm_model_collect). LM_ERR_UNSUPPORTED when this state cannot. */
    lm_status (*queue_sample)(void *state, void *kv, const struct lm_batch_seq *seqs, int n_seqs,
                              const struct lm_device_sampling *sampling, const int32_t *feed);
    lm_status (*collect)(void *state, void *kv, int32_t *ids, int *n_ids);

    /* Renders a conversation with the family's chat template (see model.h). */
    lm_status (*render_chat)(const struct lm_chat_msg *msgs, size_t n,
                             const struct lm_chat_opts *opts, struct lm_buf *out);

    /* The reasoning parser of the family's chat output, or NULL when it has none (everything
     * is content). */
    const struct lm_reasoning_ops *reasoning;
};

/* The family serving `model_type`, or NULL. Borrowed (static). */
const struct lm_family *lm_family_find(const char *model_type);
/* Appends the supported model_types, comma-separated ("qwen3"), for messages. */
void lm_family_list(struct lm_buf *out);

#endif
