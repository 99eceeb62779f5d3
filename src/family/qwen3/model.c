/* model.c: the Qwen3 weights and forward pass. Reads top to bottom like the model:
 * embed -> [RMSNorm -> q/k/v -> q_norm/k_norm -> RoPE -> attention -> o_proj -> residual ->
 * RMSNorm -> SwiGLU MLP -> residual] x layers -> RMSNorm -> lm_head.
 * Reference: transformers models/qwen3/modeling_qwen3.py. */
#include "family/qwen3/model.h"

#include <assert.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "family/qwen3/gpu.h"

/* lm_qwen3_set_cpu_kv_bf16 (model.h); atomic: a test thread sets it while no forward runs. */
static _Atomic bool g_cpu_kv_bf16;
void lm_qwen3_set_cpu_kv_bf16(bool on) { g_cpu_kv_bf16 = on; }
bool lm_qwen3_cpu_kv_bf16(void) { return g_cpu_kv_bf16; }

struct qwen3_layer {
    float *input_layernorm;          /* [hidden] */
    struct lm_mat q_proj;            /* [heads * head_dim, hidden] */
    struct lm_mat k_proj;            /* [kv_heads * head_dim, hidden] */
    struct lm_mat v_proj;            /* [kv_heads * head_dim, hidden] */
    float *q_norm;                   /* [head_dim], RMSNorm over each query head */
    float *k_norm;                   /* [head_dim], RMSNorm over each key head */
    struct lm_mat o_proj;            /* [hidden, heads * head_dim] */
    float *post_attention_layernorm; /* [hidden] */
    struct lm_mat gate_proj;         /* [intermediate, hidden] */
    struct lm_mat up_proj;           /* [intermediate, hidden] */
    struct lm_mat down_proj;         /* [hidden, intermediate] */
};

struct lm_qwen3 {
    struct lm_model_config cfg;
    int hidden, q_dim, kv_dim, head_dim, n_heads, n_kv_heads, inter, vocab, n_layers;
    struct lm_mat embed_tokens;  /* [vocab, hidden] */
    struct qwen3_layer *layers;  /* [n_layers] */
    float *norm;                 /* [hidden], final RMSNorm */
    struct lm_mat lm_head;       /* [vocab, hidden]; embed_tokens when tied */
    float *inv_freq;             /* [head_dim / 2] RoPE inverse frequencies, float32 as HF */
    struct lm_pool *pool;        /* borrowed from the model */
    const struct lm_cpu_ops *ops;
    struct lm_weight_store *ws;  /* borrowed; owns the tensors above */
    /* On CUDA (load args `cuda`): the host weights described for the backend (pointers into the
     * store, row-major) and the device side; the forward runs there. NULL on the CPU. */
    struct lm_cuda_qwen3_weights cw;
    struct lm_cuda_qwen3_layer_weights *cw_layers; /* [n_layers] */
    struct lm_qwen3_gpu *gpu;
};

struct lm_qwen3_kv {
    struct lm_qwen3 *m;
    struct lm_qwen3_gpu *gpu; /* on CUDA: the device holds the pool; nothing below is allocated */
    int n_blocks;       /* blocks of LM_KV_BLOCK positions in the pool */
    int max_batch;      /* tokens per forward step (scratch rows) */
    int max_ctx;        /* positions a sequence may reach */
    size_t cache_bytes; /* of each of k_cache and v_cache */
    float *k_cache;     /* [n_layers][n_blocks * LM_KV_BLOCK][kv_dim] (lm_huge_alloc) */
    float *v_cache;     /* [n_layers][n_blocks * LM_KV_BLOCK][kv_dim] (lm_huge_alloc) */
    float *x;           /* [max_batch, hidden] residual stream */
    float *xb;          /* [max_batch, hidden] normalised input of a block */
    float *xo;          /* [max_batch, hidden] output of o_proj / down_proj */
    float *q;           /* [max_batch, q_dim] queries */
    float *k, *v;       /* [max_batch, kv_dim] new keys and values, before the scatter */
    float *att;         /* [max_batch, q_dim] attention output */
    float *gate;        /* [max_batch, intermediate] */
    float *up;          /* [max_batch, intermediate] */
    float *scores;      /* [threads, max_ctx] attention scratch */
    struct lm_attn_seq *attn; /* [max_batch] the step's sequences, for the attention op */
};

/* ---- load ---- */

static lm_status check_config(const struct lm_hf_config *hf, const struct lm_model_config *c) {
    char s[64] = "silu";
    lm_status rc = lm_hf_config_string_opt(hf, "hidden_act", s, sizeof s);
    if (rc) return rc;
    if (strcmp(s, "silu"))
        return lm_errorf(LM_ERR_UNSUPPORTED, "%s: hidden_act '%s' is not supported (qwen3 uses silu)",
                         hf->name, s);
    bool flag = false;
    if ((rc = lm_hf_config_bool_opt(hf, "attention_bias", &flag))) return rc;
    if (flag)
        return lm_errorf(LM_ERR_UNSUPPORTED, "%s: attention_bias true is not supported", hf->name);
    flag = false;
    if ((rc = lm_hf_config_bool_opt(hf, "use_sliding_window", &flag))) return rc;
    if (flag)
        return lm_errorf(LM_ERR_UNSUPPORTED, "%s: use_sliding_window true is not supported", hf->name);
    const char *keys[] = {"rope_parameters.rope_type", "rope_scaling.rope_type", "rope_scaling.type"};
    for (int i = 0; i < 3; i++) {
        s[0] = 0;
        if ((rc = lm_hf_config_string_opt(hf, keys[i], s, sizeof s))) return rc;
        if (s[0] && strcmp(s, "default"))
            return lm_errorf(LM_ERR_UNSUPPORTED,
                             "%s: %s '%s' is not supported (only default RoPE)", hf->name, keys[i], s);
    }
    if (c->head_dim % 2 || c->head_dim > 512)
        return lm_errorf(LM_ERR_UNSUPPORTED, "%s: head_dim %d is not supported (even, at most 512)",
                         hf->name, c->head_dim);
    if (c->num_attention_heads % c->num_key_value_heads)
        return lm_errorf(LM_ERR_FORMAT,
                         "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                         hf->name, c->num_attention_heads, c->num_key_value_heads);
    return LM_OK;
}

/* A matrix as the CUDA backend takes it: row-major. The store maps matrices in place for CUDA;
 * one it had to copy (unaligned in the file) is in the CPU's packed layout and is unpacked here
 * into a bf16 copy the store owns (exact: every source dtype's values are what the backend would
 * round to bf16 itself). */
static lm_status cuda_matrix(struct lm_weight_store *ws, const struct lm_mat *x,
                             struct lm_cuda_matrix *out) {
    *out = (struct lm_cuda_matrix){x->data, x->dtype, x->rows, x->cols};
    if (!lm_dtype_is_packed(x->dtype)) return LM_OK;
    uint16_t *p = lm_weight_store_alloc(ws, (size_t)x->rows * (size_t)x->cols * 2);
    float *row = malloc(sizeof(float) * (size_t)x->cols);
    if (!p || !row) {
        free(row);
        return lm_errorf(LM_ERR_NOMEM, "qwen3: out of memory for a [%d, %d] matrix", x->rows, x->cols);
    }
    for (long r = 0; r < x->rows; r++) {
        lm_cpu_matrix_row(row, x->data, x->dtype, x->cols, r);
        for (int c = 0; c < x->cols; c++) p[r * x->cols + c] = lm_f32_to_bf16(row[c]);
    }
    free(row);
    *out = (struct lm_cuda_matrix){p, LM_DTYPE_BF16, x->rows, x->cols};
    return LM_OK;
}

/* Describes the loaded weights for the CUDA backend and opens the device side (gpu.h). */
static lm_status gpu_open(struct lm_qwen3 *m, int device) {
    struct lm_cuda_qwen3_weights *w = &m->cw;
    const struct lm_model_config *c = &m->cfg;
    w->cfg = (struct lm_cuda_qwen3_config){c->hidden_size, c->intermediate_size,
                                           c->num_hidden_layers, c->num_attention_heads,
                                           c->num_key_value_heads, c->head_dim, c->vocab_size,
                                           c->rms_norm_eps, c->rope_theta};
    m->cw_layers = calloc((size_t)m->n_layers, sizeof *m->cw_layers);
    if (!m->cw_layers) return lm_errorf(LM_ERR_NOMEM, "qwen3: out of memory");
    lm_status rc;
    struct lm_weight_store *ws = m->ws;
    if ((rc = cuda_matrix(ws, &m->embed_tokens, &w->embed_tokens))) return rc;
    if (m->lm_head.data == m->embed_tokens.data)
        w->lm_head = w->embed_tokens;
    else if ((rc = cuda_matrix(ws, &m->lm_head, &w->lm_head)))
        return rc;
    w->norm = m->norm;
    for (int l = 0; l < m->n_layers; l++) {
        const struct qwen3_layer *L = &m->layers[l];
        struct lm_cuda_qwen3_layer_weights *d = &m->cw_layers[l];
        d->input_layernorm = L->input_layernorm;
        d->post_attention_layernorm = L->post_attention_layernorm;
        d->q_norm = L->q_norm;
        d->k_norm = L->k_norm;
        if ((rc = cuda_matrix(ws, &L->q_proj, &d->q_proj)) ||
            (rc = cuda_matrix(ws, &L->k_proj, &d->k_proj)) ||
            (rc = cuda_matrix(ws, &L->v_proj, &d->v_proj)) ||
            (rc = cuda_matrix(ws, &L->o_proj, &d->o_proj)) ||
            (rc = cuda_matrix(ws, &L->gate_proj, &d->gate_proj)) ||
            (rc = cuda_matrix(ws, &L->up_proj, &d->up_proj)) ||
            (rc = cuda_matrix(ws, &L->down_proj, &d->down_proj)))
            return rc;
    }
    w->layers = m->cw_layers;
    return lm_qwen3_gpu_open(w, device, &m->gpu);
}

lm_status lm_qwen3_load(const struct lm_family_load_args *a, void **state) {
    *state = NULL;
    const struct lm_model_config *c = a->cfg;
    lm_status rc = check_config(a->hf, c);
    if (rc) return rc;
    struct lm_weight_store *ws = a->ws;
    struct lm_qwen3 *m = calloc(1, sizeof *m);
    if (!m) return lm_errorf(LM_ERR_NOMEM, "qwen3: out of memory");
    m->cfg = *c;
    m->hidden = c->hidden_size;
    m->head_dim = c->head_dim;
    m->n_heads = c->num_attention_heads;
    m->n_kv_heads = c->num_key_value_heads;
    m->q_dim = m->n_heads * m->head_dim;
    m->kv_dim = m->n_kv_heads * m->head_dim;
    m->inter = c->intermediate_size;
    m->vocab = c->vocab_size;
    m->n_layers = c->num_hidden_layers;
    m->pool = a->pool;
    m->ops = a->ops;
    m->ws = ws;
    m->layers = calloc((size_t)m->n_layers, sizeof *m->layers);
    if (!m->layers) {
        free(m);
        return lm_errorf(LM_ERR_NOMEM, "qwen3: out of memory");
    }
    const int H = m->hidden, Q = m->q_dim, KV = m->kv_dim, D = m->head_dim, I = m->inter;
    char name[128];
#define MAT(field, rows, cols, ...)                                                              \
    do {                                                                                         \
        snprintf(name, sizeof name, __VA_ARGS__);                                                \
        if ((rc = lm_weight_store_matrix(ws, name, rows, cols, &(field)))) goto fail;            \
    } while (0)
#define VEC(field, len, ...)                                                                     \
    do {                                                                                         \
        snprintf(name, sizeof name, __VA_ARGS__);                                                \
        if ((rc = lm_weight_store_vector(ws, name, len, &(field)))) goto fail;                   \
    } while (0)
    MAT(m->embed_tokens, m->vocab, H, "model.embed_tokens.weight");
    for (int l = 0; l < m->n_layers; l++) {
        struct qwen3_layer *L = &m->layers[l];
        VEC(L->input_layernorm, H, "model.layers.%d.input_layernorm.weight", l);
        MAT(L->q_proj, Q, H, "model.layers.%d.self_attn.q_proj.weight", l);
        MAT(L->k_proj, KV, H, "model.layers.%d.self_attn.k_proj.weight", l);
        MAT(L->v_proj, KV, H, "model.layers.%d.self_attn.v_proj.weight", l);
        VEC(L->q_norm, D, "model.layers.%d.self_attn.q_norm.weight", l);
        VEC(L->k_norm, D, "model.layers.%d.self_attn.k_norm.weight", l);
        MAT(L->o_proj, H, Q, "model.layers.%d.self_attn.o_proj.weight", l);
        VEC(L->post_attention_layernorm, H, "model.layers.%d.post_attention_layernorm.weight", l);
        MAT(L->gate_proj, I, H, "model.layers.%d.mlp.gate_proj.weight", l);
        MAT(L->up_proj, I, H, "model.layers.%d.mlp.up_proj.weight", l);
        MAT(L->down_proj, H, I, "model.layers.%d.mlp.down_proj.weight", l);
    }
    VEC(m->norm, H, "model.norm.weight");
    if (lm_weight_store_has(ws, "lm_head.weight") || !c->tie_word_embeddings)
        MAT(m->lm_head, m->vocab, H, "lm_head.weight");
    else
        m->lm_head = m->embed_tokens;
#undef MAT
#undef VEC
    /* inv_freq = 1 / theta^(2i / head_dim), computed in float32 as transformers'
     * _compute_default_rope_parameters does: the exponent is a float32 division, the power is
     * rounded to float32, then the reciprocal is taken in float32. */
    m->inv_freq = lm_weight_store_alloc(ws, sizeof(float) * (size_t)(D / 2));
    if (!m->inv_freq) {
        rc = lm_errorf(LM_ERR_NOMEM, "qwen3: out of memory");
        goto fail;
    }
    for (int i = 0; i < D / 2; i++) {
        float e = (float)(2 * i) / (float)D;
        float p = (float)pow((double)(float)c->rope_theta, (double)e);
        m->inv_freq[i] = 1.0f / p;
    }
    if (a->cuda && (rc = gpu_open(m, a->cuda_device))) goto fail;
    *state = m;
    return LM_OK;
fail:
    lm_qwen3_gpu_close(m->gpu);
    free(m->cw_layers);
    free(m->layers);
    free(m);
    return rc;
}

void lm_qwen3_unload(void *state) {
    struct lm_qwen3 *m = state;
    if (!m) return;
    lm_qwen3_gpu_close(m->gpu);
    free(m->cw_layers);
    free(m->layers);
    free(m);
}

/* ---- KV pool ---- */

void lm_qwen3_kv_destroy(void *kvp) {
    struct lm_qwen3_kv *kv = kvp;
    if (!kv) return;
    if (kv->gpu) lm_qwen3_gpu_kv_close(kv->gpu);
    lm_huge_free(kv->k_cache, kv->cache_bytes);
    lm_huge_free(kv->v_cache, kv->cache_bytes);
    free(kv->x);
    free(kv->xb);
    free(kv->xo);
    free(kv->q);
    free(kv->k);
    free(kv->v);
    free(kv->att);
    free(kv->gate);
    free(kv->up);
    free(kv->scores);
    free(kv->attn);
    free(kv);
}

static float *falloc(size_t n) {
    size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
    return aligned_alloc(64, bytes ? bytes : 64);
}

lm_status lm_qwen3_kv_create(void *state, int n_blocks, int max_batch, int max_ctx, void **out) {
    struct lm_qwen3 *m = state;
    *out = NULL;
    struct lm_qwen3_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return lm_errorf(LM_ERR_NOMEM, "qwen3: out of memory for a KV cache");
    kv->m = m;
    kv->n_blocks = n_blocks;
    kv->max_batch = max_batch;
    kv->max_ctx = max_ctx;
    if (m->gpu) { /* the pool and the scratch live on the device */
        lm_status rc = lm_qwen3_gpu_kv_open(m->gpu, n_blocks, max_batch, max_ctx);
        if (rc) {
            free(kv);
            return rc;
        }
        kv->gpu = m->gpu;
        *out = kv;
        return LM_OK;
    }
    size_t rows = (size_t)n_blocks * LM_KV_BLOCK;
    kv->cache_bytes = (size_t)m->n_layers * rows * (size_t)m->kv_dim * sizeof(float);
    kv->k_cache = lm_huge_alloc(kv->cache_bytes);
    kv->v_cache = lm_huge_alloc(kv->cache_bytes);
    size_t B = (size_t)max_batch;
    kv->x = falloc(B * m->hidden);
    kv->xb = falloc(B * m->hidden);
    kv->xo = falloc(B * m->hidden);
    kv->q = falloc(B * m->q_dim);
    kv->k = falloc(B * m->kv_dim);
    kv->v = falloc(B * m->kv_dim);
    kv->att = falloc(B * m->q_dim);
    kv->gate = falloc(B * m->inter);
    kv->up = falloc(B * m->inter);
    kv->scores = falloc((size_t)lm_pool_size(m->pool) * (size_t)max_ctx);
    kv->attn = calloc(B, sizeof *kv->attn);
    if (!kv->k_cache || !kv->v_cache || !kv->x || !kv->xb || !kv->xo || !kv->q || !kv->k ||
        !kv->v || !kv->att || !kv->gate || !kv->up || !kv->scores || !kv->attn) {
        lm_qwen3_kv_destroy(kv);
        return lm_errorf(LM_ERR_NOMEM,
                         "qwen3: cannot allocate a KV cache of %d blocks (%.1f MiB) with scratch "
                         "for %d tokens",
                         n_blocks, 2.0 * (double)kv->cache_bytes / (1024.0 * 1024.0), max_batch);
    }
    *out = kv;
    return LM_OK;
}

void lm_qwen3_kv_copy(void *kvp, int src, int dst, int n_rows) {
    struct lm_qwen3_kv *kv = kvp;
    const struct lm_qwen3 *m = kv->m;
    if (kv->gpu) {
        /* A CUDA failure here leaves the device in error: the next forward reports it. */
        lm_status rc = lm_qwen3_gpu_kv_copy(kv->gpu, src, dst, n_rows);
        assert(rc != LM_ERR_INVALID);
        (void)rc;
        return;
    }
    size_t layer = (size_t)kv->n_blocks * LM_KV_BLOCK * m->kv_dim;
    size_t bytes = (size_t)n_rows * m->kv_dim * sizeof(float);
    for (int l = 0; l < m->n_layers; l++) {
        size_t so = l * layer + (size_t)src * LM_KV_BLOCK * m->kv_dim;
        size_t d = l * layer + (size_t)dst * LM_KV_BLOCK * m->kv_dim;
        memcpy(kv->k_cache + d, kv->k_cache + so, bytes);
        memcpy(kv->v_cache + d, kv->v_cache + so, bytes);
    }
}

/* ---- forward ---- */

/* y[0..n) += x[0..n): the residual connection. */
static void residual_add(float *y, const float *x, long n) {
    for (long i = 0; i < n; i++) y[i] += x[i];
}

lm_status lm_qwen3_forward(void *state, void *kvp, const struct lm_batch_seq *seqs, int n_seqs,
                           float *logits) {
    struct lm_qwen3 *m = state;
    struct lm_qwen3_kv *kv = kvp;
    if (kv->gpu) return lm_qwen3_gpu_forward(kv->gpu, seqs, n_seqs, logits, NULL, NULL);
    const struct lm_cpu_ops *ops = m->ops;
    struct lm_pool *pool = m->pool;
    const int H = m->hidden, Q = m->q_dim, KV = m->kv_dim, D = m->head_dim, I = m->inter;
    const float eps = m->cfg.rms_norm_eps, scale = 1.0f / sqrtf((float)D);
    const size_t layer_rows = (size_t)kv->n_blocks * LM_KV_BLOCK;
    float *x = kv->x, *xb = kv->xb, *xo = kv->xo;

    /* Token embeddings, the sequences' tokens one after another: x[r] = embed_tokens[id]. */
    int T = 0;
    for (int s = 0; s < n_seqs; s++) {
        const struct lm_batch_seq *b = &seqs[s];
        for (int i = 0; i < b->n; i++, T++)
            lm_cpu_matrix_row(x + (long)T * H, m->embed_tokens.data, m->embed_tokens.dtype, H,
                              b->ids[i]);
        kv->attn[s] = (struct lm_attn_seq){b->n, b->pos, b->blocks};
    }

    for (int l = 0; l < m->n_layers; l++) {
        const struct qwen3_layer *L = &m->layers[l];
        float *kc = kv->k_cache + (size_t)l * layer_rows * KV; /* this layer's cache rows */
        float *vc = kv->v_cache + (size_t)l * layer_rows * KV;

        /* Self-attention block: xb = RMSNorm(x); q, k, v projections of every token. */
        ops->rmsnorm(pool, xb, x, L->input_layernorm, T, H, eps);
        ops->matmul(pool, kv->q, xb, L->q_proj.data, L->q_proj.dtype, T, H, Q);
        ops->matmul(pool, kv->k, xb, L->k_proj.data, L->k_proj.dtype, T, H, KV);
        ops->matmul(pool, kv->v, xb, L->v_proj.data, L->v_proj.dtype, T, H, KV);
        /* Per-head RMSNorm of q and k, then rotary embedding at each sequence's positions, then
         * the new keys and values into their block slots. */
        ops->rmsnorm(pool, kv->q, kv->q, L->q_norm, T * m->n_heads, D, eps);
        ops->rmsnorm(pool, kv->k, kv->k, L->k_norm, T * m->n_kv_heads, D, eps);
        const bool kv_bf16 = g_cpu_kv_bf16;
        for (int s = 0, r = 0; s < n_seqs; r += seqs[s].n, s++) {
            const struct lm_batch_seq *b = &seqs[s];
            ops->rope(pool, kv->q + (long)r * Q, b->n, m->n_heads, D, b->pos, m->inv_freq);
            ops->rope(pool, kv->k + (long)r * KV, b->n, m->n_kv_heads, D, b->pos, m->inv_freq);
            for (int i = 0; i < b->n; i++) {
                int p = b->pos + i;
                size_t row = (size_t)b->blocks[p / LM_KV_BLOCK] * LM_KV_BLOCK + p % LM_KV_BLOCK;
                memcpy(kc + row * KV, kv->k + (long)(r + i) * KV, sizeof(float) * KV);
                memcpy(vc + row * KV, kv->v + (long)(r + i) * KV, sizeof(float) * KV);
                if (kv_bf16)
                    for (int e = 0; e < KV; e++) {
                        kc[row * KV + e] = lm_bf16_to_f32(lm_f32_to_bf16(kc[row * KV + e]));
                        vc[row * KV + e] = lm_bf16_to_f32(lm_f32_to_bf16(vc[row * KV + e]));
                    }
            }
        }
        /* Causal grouped-query attention of each sequence over its own positions, then o_proj
         * and the residual. */
        ops->attention_paged(pool, kv->att, kv->q, kc, vc, kv->attn, n_seqs, m->n_heads,
                             m->n_kv_heads, D, KV, LM_KV_BLOCK, scale, kv->scores);
        ops->matmul(pool, xo, kv->att, L->o_proj.data, L->o_proj.dtype, T, Q, H);
        residual_add(x, xo, (long)T * H);

        /* MLP block: xb = RMSNorm(x); down(silu(gate(xb)) * up(xb)); residual. */
        ops->rmsnorm(pool, xb, x, L->post_attention_layernorm, T, H, eps);
        ops->matmul(pool, kv->gate, xb, L->gate_proj.data, L->gate_proj.dtype, T, H, I);
        ops->matmul(pool, kv->up, xb, L->up_proj.data, L->up_proj.dtype, T, H, I);
        ops->swiglu(pool, kv->gate, kv->gate, kv->up, (long)T * I);
        ops->matmul(pool, xo, kv->gate, L->down_proj.data, L->down_proj.dtype, T, I, H);
        residual_add(x, xo, (long)T * H);
    }

    /* Final norm and lm_head over the rows that want logits, gathered in order. */
    int rows = 0;
    for (int s = 0, r = 0; s < n_seqs; r += seqs[s].n, s++) {
        const struct lm_batch_seq *b = &seqs[s];
        int first = b->logits == LM_LOGITS_ALL ? 0 : b->n - 1;
        if (b->logits == LM_LOGITS_NONE) continue;
        for (int i = first; i < b->n; i++, rows++)
            memcpy(xb + (long)rows * H, x + (long)(r + i) * H, sizeof(float) * H);
    }
    if (rows == 0) return LM_OK;
    ops->rmsnorm(pool, xb, xb, m->norm, rows, H, eps);
    ops->matmul(pool, logits, xb, m->lm_head.data, m->lm_head.dtype, rows, H, m->vocab);
    return LM_OK;
}

lm_status lm_qwen3_forward_sample(void *state, void *kvp, const struct lm_batch_seq *seqs, int n_seqs,
                                  const struct lm_device_sampling *sampling, int32_t *ids,
                                  float *logits) {
    struct lm_qwen3_kv *kv = kvp;
    if (!kv->gpu)
        return lm_errorf(LM_ERR_UNSUPPORTED, "qwen3: choosing tokens in the forward step needs a "
                                             "CUDA device (the model runs on the CPU)");
    return lm_qwen3_gpu_forward(kv->gpu, seqs, n_seqs, logits, sampling, ids);
}

lm_status lm_qwen3_queue_sample(void *state, void *kvp, const struct lm_batch_seq *seqs, int n_seqs,
                                const struct lm_device_sampling *sampling, const int32_t *feed) {
    struct lm_qwen3_kv *kv = kvp;
    (void)state;
    if (!kv->gpu)
        return lm_errorf(LM_ERR_UNSUPPORTED, "qwen3: queued steps need a CUDA device (the model runs on the CPU)");
    return lm_qwen3_gpu_queue(kv->gpu, seqs, n_seqs, sampling, feed);
}

lm_status lm_qwen3_collect(void *state, void *kvp, int32_t *ids, int *n_ids) {
    struct lm_qwen3_kv *kv = kvp;
    (void)state;
    if (!kv->gpu)
        return lm_errorf(LM_ERR_UNSUPPORTED, "qwen3: queued steps need a CUDA device (the model runs on the CPU)");
    return lm_qwen3_gpu_collect(kv->gpu, ids, n_ids);
}
