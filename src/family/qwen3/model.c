/* model.c: the Qwen3 weights and forward pass. Reads top to bottom like the model:
 * embed -> [RMSNorm -> q/k/v -> q_norm/k_norm -> RoPE -> attention -> o_proj -> residual ->
 * RMSNorm -> SwiGLU MLP -> residual] x layers -> RMSNorm -> lm_head.
 * Reference: transformers models/qwen3/modeling_qwen3.py. */
#include "family/qwen3/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tokens per forward chunk: bounds the scratch; longer inputs run chunk by chunk. */
enum { CHUNK = 256 };

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
};

struct lm_qwen3_seq {
    struct lm_qwen3 *m;
    int cap;        /* positions the cache holds */
    int chunk;      /* tokens per forward chunk (scratch rows) */
    float *k_cache; /* [n_layers][cap][kv_dim] */
    float *v_cache; /* [n_layers][cap][kv_dim] */
    float *x;       /* [chunk, hidden] residual stream */
    float *xb;      /* [chunk, hidden] normalised input of a block */
    float *xo;      /* [chunk, hidden] output of o_proj / down_proj */
    float *q;       /* [chunk, q_dim] queries */
    float *att;     /* [chunk, q_dim] attention output */
    float *gate;    /* [chunk, intermediate] */
    float *up;      /* [chunk, intermediate] */
    float *scores;  /* [threads, cap] attention scratch */
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
    if (lm_st_find(ws->st, "lm_head.weight") || !c->tie_word_embeddings)
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
    *state = m;
    return LM_OK;
fail:
    free(m->layers);
    free(m);
    return rc;
}

void lm_qwen3_unload(void *state) {
    struct lm_qwen3 *m = state;
    if (!m) return;
    free(m->layers);
    free(m);
}

/* ---- sequences ---- */

void lm_qwen3_seq_destroy(void *seq) {
    struct lm_qwen3_seq *s = seq;
    if (!s) return;
    free(s->k_cache);
    free(s->v_cache);
    free(s->x);
    free(s->xb);
    free(s->xo);
    free(s->q);
    free(s->att);
    free(s->gate);
    free(s->up);
    free(s->scores);
    free(s);
}

static float *falloc(size_t n) {
    size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
    return aligned_alloc(64, bytes ? bytes : 64);
}

lm_status lm_qwen3_seq_create(void *state, int max_tokens, void **seq) {
    struct lm_qwen3 *m = state;
    *seq = NULL;
    struct lm_qwen3_seq *s = calloc(1, sizeof *s);
    if (!s) return lm_errorf(LM_ERR_NOMEM, "qwen3: out of memory for a sequence");
    s->m = m;
    s->cap = max_tokens;
    s->chunk = max_tokens < CHUNK ? max_tokens : CHUNK;
    size_t cache = (size_t)m->n_layers * (size_t)max_tokens * (size_t)m->kv_dim;
    size_t C = (size_t)s->chunk;
    s->k_cache = falloc(cache);
    s->v_cache = falloc(cache);
    s->x = falloc(C * m->hidden);
    s->xb = falloc(C * m->hidden);
    s->xo = falloc(C * m->hidden);
    s->q = falloc(C * m->q_dim);
    s->att = falloc(C * m->q_dim);
    s->gate = falloc(C * m->inter);
    s->up = falloc(C * m->inter);
    s->scores = falloc((size_t)lm_pool_size(m->pool) * (size_t)max_tokens);
    if (!s->k_cache || !s->v_cache || !s->x || !s->xb || !s->xo || !s->q || !s->att || !s->gate ||
        !s->up || !s->scores) {
        lm_qwen3_seq_destroy(s);
        return lm_errorf(LM_ERR_NOMEM,
                         "qwen3: cannot allocate a KV cache of %d positions (%.1f MiB)", max_tokens,
                         2.0 * cache * sizeof(float) / (1024.0 * 1024.0));
    }
    *seq = s;
    return LM_OK;
}

/* ---- forward ---- */

/* y[0..n) += x[0..n): the residual connection. */
static void residual_add(float *y, const float *x, long n) {
    for (long i = 0; i < n; i++) y[i] += x[i];
}

/* One chunk of n <= s->chunk tokens at positions pos..pos+n-1. When logits is non-NULL it
 * receives [n, vocab] (all) or [1, vocab] for the chunk's last token. */
static void forward_chunk(struct lm_qwen3 *m, struct lm_qwen3_seq *s, int pos, const int32_t *ids,
                          int n, float *logits, bool all) {
    const struct lm_cpu_ops *ops = m->ops;
    struct lm_pool *pool = m->pool;
    const int H = m->hidden, Q = m->q_dim, KV = m->kv_dim, D = m->head_dim, I = m->inter;
    const float eps = m->cfg.rms_norm_eps, scale = 1.0f / sqrtf((float)D);
    float *x = s->x, *xb = s->xb, *xo = s->xo;

    /* Token embeddings: x[i] = embed_tokens[ids[i]]. */
    for (int i = 0; i < n; i++)
        ops->convert_row(x + (long)i * H,
                         (const char *)m->embed_tokens.data +
                             (size_t)ids[i] * H * lm_dtype_size(m->embed_tokens.dtype),
                         m->embed_tokens.dtype, H);

    for (int l = 0; l < m->n_layers; l++) {
        const struct qwen3_layer *L = &m->layers[l];
        float *kc = s->k_cache + (size_t)l * s->cap * KV; /* this layer's cache [cap, kv_dim] */
        float *vc = s->v_cache + (size_t)l * s->cap * KV;
        float *k_new = kc + (size_t)pos * KV, *v_new = vc + (size_t)pos * KV;

        /* Self-attention block: xb = RMSNorm(x); q, k, v projections (k, v straight into the
         * cache rows of these positions). */
        ops->rmsnorm(pool, xb, x, L->input_layernorm, n, H, eps);
        ops->matmul(pool, s->q, xb, L->q_proj.data, L->q_proj.dtype, n, H, Q);
        ops->matmul(pool, k_new, xb, L->k_proj.data, L->k_proj.dtype, n, H, KV);
        ops->matmul(pool, v_new, xb, L->v_proj.data, L->v_proj.dtype, n, H, KV);
        /* Per-head RMSNorm of q and k, then rotary embedding of both. */
        ops->rmsnorm(pool, s->q, s->q, L->q_norm, n * m->n_heads, D, eps);
        ops->rmsnorm(pool, k_new, k_new, L->k_norm, n * m->n_kv_heads, D, eps);
        ops->rope(pool, s->q, n, m->n_heads, D, pos, m->inv_freq);
        ops->rope(pool, k_new, n, m->n_kv_heads, D, pos, m->inv_freq);
        /* Causal grouped-query attention over positions 0..pos+i, then o_proj and residual. */
        ops->attention(pool, s->att, s->q, kc, vc, n, pos, m->n_heads, m->n_kv_heads, D, KV, scale,
                       s->scores);
        ops->matmul(pool, xo, s->att, L->o_proj.data, L->o_proj.dtype, n, Q, H);
        residual_add(x, xo, (long)n * H);

        /* MLP block: xb = RMSNorm(x); down(silu(gate(xb)) * up(xb)); residual. */
        ops->rmsnorm(pool, xb, x, L->post_attention_layernorm, n, H, eps);
        ops->matmul(pool, s->gate, xb, L->gate_proj.data, L->gate_proj.dtype, n, H, I);
        ops->matmul(pool, s->up, xb, L->up_proj.data, L->up_proj.dtype, n, H, I);
        ops->swiglu(pool, s->gate, s->gate, s->up, (long)n * I);
        ops->matmul(pool, xo, s->gate, L->down_proj.data, L->down_proj.dtype, n, I, H);
        residual_add(x, xo, (long)n * H);
    }
    if (!logits) return;

    /* Final norm and lm_head: every position, or only the last. */
    int first = all ? 0 : n - 1, rows = n - first;
    ops->rmsnorm(pool, xb, x + (long)first * H, m->norm, rows, H, eps);
    ops->matmul(pool, logits, xb, m->lm_head.data, m->lm_head.dtype, rows, H, m->vocab);
}

lm_status lm_qwen3_forward(void *state, void *seq, int pos, const int32_t *ids, int n,
                           float *logits, bool all_logits) {
    struct lm_qwen3 *m = state;
    struct lm_qwen3_seq *s = seq;
    for (int done = 0; done < n;) {
        int c = n - done < s->chunk ? n - done : s->chunk;
        bool last = done + c == n;
        float *out = NULL;
        if (all_logits)
            out = logits + (size_t)done * m->vocab;
        else if (last)
            out = logits;
        forward_chunk(m, s, pos + done, ids + done, c, out, all_logits);
        done += c;
    }
    return LM_OK;
}
