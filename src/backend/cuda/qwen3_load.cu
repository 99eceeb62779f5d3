/* qwen3_load.cu: lm_cuda_qwen3_open_dir, reading a Hugging Face Qwen3 folder (config.json and
 * safetensors) straight into the host weight description of qwen3.h. Host code only; a .cu file
 * so that the CPU library's *.c glob of src/backend does not pick it up. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "backend/cuda/qwen3.h"

extern "C" {
#include "backend/cpu/quant.h"
#include "format/hf_config.h"
#include "format/safetensors.h"
}

namespace {

struct loader {
    lm_safetensors st;
    std::vector<float *> vecs; /* float32 copies of the norm vectors */
    std::vector<void *> quants; /* Q8_0 copies of the matrices (quantize_q8) */
    bool q8 = false;
    ~loader() {
        for (float *v : vecs) free(v);
        for (void *q : quants) free(q);
        lm_st_close(&st);
    }
};

lm_status st_dtype(const lm_safetensors *st, const lm_st_tensor *t, enum lm_dtype *out) {
    switch (t->dtype) {
    case LM_ST_F32: *out = LM_DTYPE_F32; return LM_OK;
    case LM_ST_F16: *out = LM_DTYPE_F16; return LM_OK;
    case LM_ST_BF16: *out = LM_DTYPE_BF16; return LM_OK;
    default:
        return lm_errorf(LM_ERR_SHAPE, "%s: tensor '%s' has dtype %s (F32, F16 or BF16 expected)",
                         lm_st_tensor_path(st, t), t->name, lm_st_dtype_name(t->dtype));
    }
}

lm_status get_matrix(loader &ld, const char *name, int rows, int cols, lm_cuda_matrix *out) {
    const int64_t shape[2] = {rows, cols};
    const lm_st_tensor *t;
    lm_status rc = lm_st_get(&ld.st, name, 2, shape, &t);
    if (rc) return rc;
    out->data = t->data;
    out->rows = rows;
    out->cols = cols;
    if ((rc = st_dtype(&ld.st, t, &out->dtype)) || !ld.q8) return rc;
    if (cols % 32)
        return lm_errorf(LM_ERR_SHAPE, "%s: [%d, %d]: Q8_0 needs rows of whole 32-weight blocks", name,
                         rows, cols);
    /* Quantized as `lumen build --dtype q8_0` does (backend/cpu/quant.h, ggml's rounding). */
    const size_t rb = lm_dtype_row_bytes(LM_DTYPE_Q8_0, cols);
    char *q = (char *)malloc(rb * (size_t)rows);
    std::vector<float> row(cols);
    if (!q) return lm_errorf(LM_ERR_NOMEM, "out of memory quantizing '%s'", name);
    ld.quants.push_back(q);
    for (int r = 0; r < rows; r++) {
        const char *in = (const char *)t->data + (size_t)r * lm_dtype_row_bytes(out->dtype, cols);
        for (int c = 0; c < cols; c++) {
            const uint16_t *h = (const uint16_t *)in;
            row[c] = out->dtype == LM_DTYPE_F32 ? ((const float *)in)[c]
                     : out->dtype == LM_DTYPE_F16 ? lm_f16_to_f32(h[c])
                                                  : lm_bf16_to_f32(h[c]);
        }
        lm_q8_0_quantize_row(row.data(), (struct lm_block_q8_0 *)(q + (size_t)r * rb), cols);
    }
    out->data = q;
    out->dtype = LM_DTYPE_Q8_0;
    return LM_OK;
}

lm_status get_vector(loader &ld, const char *name, int n, const float **out) {
    const int64_t shape[1] = {n};
    const lm_st_tensor *t;
    lm_status rc = lm_st_get(&ld.st, name, 1, shape, &t);
    if (rc) return rc;
    enum lm_dtype dt = LM_DTYPE_F32;
    if ((rc = st_dtype(&ld.st, t, &dt))) return rc;
    float *v = (float *)malloc(sizeof(float) * (size_t)n);
    if (!v) return lm_errorf(LM_ERR_NOMEM, "out of memory for '%s'", name);
    ld.vecs.push_back(v);
    for (int i = 0; i < n; i++) {
        const uint16_t *h = (const uint16_t *)t->data;
        v[i] = dt == LM_DTYPE_F32 ? ((const float *)t->data)[i]
               : dt == LM_DTYPE_F16 ? lm_f16_to_f32(h[i])
                                    : lm_bf16_to_f32(h[i]);
    }
    *out = v;
    return LM_OK;
}

lm_status read_config(const lm_hf_config *hf, lm_cuda_qwen3_config *c, bool *tied) {
    char type[32] = "";
    lm_status rc = lm_hf_config_string_opt(hf, "model_type", type, sizeof type);
    if (rc) return rc;
    if (strcmp(type, "qwen3"))
        return lm_errorf(LM_ERR_UNSUPPORTED, "%s: model_type '%s' is not qwen3", hf->name, type);
    if ((rc = lm_hf_config_int(hf, "hidden_size", 1, 1 << 20, &c->hidden)) ||
        (rc = lm_hf_config_int(hf, "intermediate_size", 1, 1 << 22, &c->intermediate)) ||
        (rc = lm_hf_config_int(hf, "num_hidden_layers", 1, 4096, &c->n_layers)) ||
        (rc = lm_hf_config_int(hf, "num_attention_heads", 1, 4096, &c->n_heads)) ||
        (rc = lm_hf_config_int(hf, "vocab_size", 1, 1 << 30, &c->vocab)))
        return rc;
    c->n_kv_heads = c->n_heads;
    c->head_dim = c->hidden / c->n_heads;
    if ((rc = lm_hf_config_int_opt(hf, "num_key_value_heads", 1, 4096, &c->n_kv_heads)) ||
        (rc = lm_hf_config_int_opt(hf, "head_dim", 1, 1 << 16, &c->head_dim)))
        return rc;
    double eps = 1e-6, theta = -1;
    if ((rc = lm_hf_config_number_opt(hf, "rms_norm_eps", &eps)) ||
        (rc = lm_hf_config_number_opt(hf, "rope_theta", &theta)) ||
        (rc = lm_hf_config_number_opt(hf, "rope_parameters.rope_theta", &theta)))
        return rc;
    if (!(theta > 1))
        return lm_errorf(LM_ERR_MISSING, "%s: missing or bad rope_theta", hf->name);
    c->rms_norm_eps = (float)eps;
    c->rope_theta = theta;
    *tied = false;
    return lm_hf_config_bool_opt(hf, "tie_word_embeddings", tied);
}

} // namespace

extern "C" lm_status lm_cuda_qwen3_open_dir(const char *dir, const struct lm_cuda_qwen3_params *params,
                                            struct lm_cuda_qwen3 **out) {
    *out = NULL;
    lm_hf_config hf;
    memset(&hf, 0, sizeof hf);
    lm_status rc = lm_hf_config_load(&hf, dir, "config.json");
    if (rc) return rc;
    lm_cuda_qwen3_weights w;
    memset(&w, 0, sizeof w);
    bool tied = false;
    rc = read_config(&hf, &w.cfg, &tied);
    lm_hf_config_free(&hf);
    if (rc) return rc;

    loader ld;
    memset(&ld.st, 0, sizeof ld.st);
    ld.q8 = params && params->quantize_q8;
    if ((rc = lm_st_open_dir(&ld.st, dir))) return rc;
    const lm_cuda_qwen3_config &c = w.cfg;
    const int H = c.hidden, Q = c.n_heads * c.head_dim, KV = c.n_kv_heads * c.head_dim, I = c.intermediate;
    std::vector<lm_cuda_qwen3_layer_weights> layers(c.n_layers);
    char name[160];
#define MAT(field, rows, cols, ...)                                                               \
    do {                                                                                          \
        snprintf(name, sizeof name, __VA_ARGS__);                                                 \
        if ((rc = get_matrix(ld, name, rows, cols, &(field)))) return rc;                         \
    } while (0)
#define VEC(field, len, ...)                                                                      \
    do {                                                                                          \
        snprintf(name, sizeof name, __VA_ARGS__);                                                 \
        if ((rc = get_vector(ld, name, len, &(field)))) return rc;                                \
    } while (0)
    MAT(w.embed_tokens, c.vocab, H, "model.embed_tokens.weight");
    for (int l = 0; l < c.n_layers; l++) {
        lm_cuda_qwen3_layer_weights &L = layers[l];
        VEC(L.input_layernorm, H, "model.layers.%d.input_layernorm.weight", l);
        MAT(L.q_proj, Q, H, "model.layers.%d.self_attn.q_proj.weight", l);
        MAT(L.k_proj, KV, H, "model.layers.%d.self_attn.k_proj.weight", l);
        MAT(L.v_proj, KV, H, "model.layers.%d.self_attn.v_proj.weight", l);
        VEC(L.q_norm, c.head_dim, "model.layers.%d.self_attn.q_norm.weight", l);
        VEC(L.k_norm, c.head_dim, "model.layers.%d.self_attn.k_norm.weight", l);
        MAT(L.o_proj, H, Q, "model.layers.%d.self_attn.o_proj.weight", l);
        VEC(L.post_attention_layernorm, H, "model.layers.%d.post_attention_layernorm.weight", l);
        MAT(L.gate_proj, I, H, "model.layers.%d.mlp.gate_proj.weight", l);
        MAT(L.up_proj, I, H, "model.layers.%d.mlp.up_proj.weight", l);
        MAT(L.down_proj, H, I, "model.layers.%d.mlp.down_proj.weight", l);
    }
    VEC(w.norm, H, "model.norm.weight");
    if (lm_st_find(&ld.st, "lm_head.weight") || !tied)
        MAT(w.lm_head, c.vocab, H, "lm_head.weight");
    else
        w.lm_head = w.embed_tokens;
#undef MAT
#undef VEC
    w.layers = layers.data();
    return lm_cuda_qwen3_create(&w, params, out);
}
