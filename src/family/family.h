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
 * (bf16/f16/f32; the matmul widens on the fly); vectors (norm weights) are widened to float32.
 * By default every tensor is copied into anonymous memory, so the decode loop never faults on a
 * file page the kernel evicted; with `map` set, matrices are used in place from the file map
 * when aligned. */
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
#include "format/hf_config.h"
#include "format/safetensors.h"

/* A weight matrix [rows, cols], row-major, in its stored dtype. */
struct lm_mat {
    const void *data;    /* borrowed from the weight store */
    enum lm_dtype dtype;
    int rows, cols;
};

struct lm_weight_store {
    const struct lm_safetensors *st; /* borrowed during load */
    bool map;                        /* use matrices in place from the map where aligned */
    void **allocs;                   /* owned copies, freed by lm_weight_store_free */
    size_t n_allocs, cap_allocs;
    size_t bytes_copied;             /* bytes held in anonymous memory */
    size_t bytes_mapped;             /* bytes used in place from the file maps */
    int n_matrices;                  /* matrices handed out */
    long n_params;                   /* elements of the tensors handed out */
    enum lm_dtype matrix_dtype;      /* dtype of the first matrix */
    bool mixed_dtypes;               /* matrices of more than one dtype */
};

/* Looks up matrix `name` of shape [rows, cols] with dtype F32, F16 or BF16. LM_ERR_MISSING when
 * absent, LM_ERR_SHAPE for another shape or dtype (message names the file, tensor, expected and
 * found), LM_ERR_NOMEM. out->data is valid until lm_weight_store_free (and, when mapped, while
 * the safetensors stay open). */
lm_status lm_weight_store_matrix(struct lm_weight_store *ws, const char *name, int rows, int cols,
                                 struct lm_mat *out);
/* Looks up vector `name` of shape [n] (F32, F16 or BF16) and returns a float32 copy owned by the
 * store. Errors as lm_weight_store_matrix. */
lm_status lm_weight_store_vector(struct lm_weight_store *ws, const char *name, int n, float **out);
/* Allocates `bytes` of zeroed, 64-byte aligned memory owned by the store (family tables). */
void *lm_weight_store_alloc(struct lm_weight_store *ws, size_t bytes);
/* Frees every copy; accepts a zeroed store. */
void lm_weight_store_free(struct lm_weight_store *ws);

/* What a family's load receives. All borrowed for the duration of the call, except `ws`, `pool`
 * and `ops`, which outlive the family's state (the model owns them). */
struct lm_family_load_args {
    const struct lm_model_config *cfg; /* parsed config.json */
    const struct lm_hf_config *hf;     /* the raw config.json, for family-specific keys */
    struct lm_weight_store *ws;        /* where tensors come from */
    struct lm_pool *pool;              /* the model's thread pool */
    const struct lm_cpu_ops *ops;      /* the kernels to run with */
};

struct lm_family {
    const char *model_type; /* config.json model_type, e.g. "qwen3" */
    unsigned tasks;         /* enum lm_task bits */

    /* Checks the family-specific config keys and loads the weights; *state is the family's
     * (freed by unload). Errors name the file and key or tensor. */
    lm_status (*load)(const struct lm_family_load_args *args, void **state);
    void (*unload)(void *state);

    /* Per-sequence state: KV cache for max_tokens positions and forward scratch, all allocated
     * here (the forward never allocates). LM_ERR_NOMEM. */
    lm_status (*seq_create)(void *state, int max_tokens, void **seq);
    void (*seq_destroy)(void *seq);

    /* Runs ids[0..n) at positions pos..pos+n-1 (the caller checked ids and capacity).
     * logits: [n, vocab] float32 when all_logits, else [1, vocab] for the last position. */
    lm_status (*forward)(void *state, void *seq, int pos, const int32_t *ids, int n, float *logits,
                         bool all_logits);

    /* Renders a conversation with the family's chat template (see model.h). */
    lm_status (*render_chat)(const struct lm_chat_msg *msgs, size_t n,
                             const struct lm_chat_opts *opts, struct lm_buf *out);
};

/* The family serving `model_type`, or NULL. Borrowed (static). */
const struct lm_family *lm_family_find(const char *model_type);
/* Appends the supported model_types, comma-separated ("qwen3"), for messages. */
void lm_family_list(struct lm_buf *out);

#endif
