/* model.c: lm_model_open and the lm_model_* / lm_seq_* functions of family/model.h.
 *
 * Opening a model folder: config.json (generic decoder keys, model_type -> family),
 * generation_config.json (optional), tokenizer.json (folder or tokenizer_dir), the safetensors
 * checkpoint (single or sharded), then the family loads its tensors into the weight store.
 * Unless weights are mapped, the file maps are closed after load. */
#include "family/model.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/threadpool.h"
#include "family/family.h"
#include "format/hf_config.h"
#include "format/safetensors.h"

struct lm_model {
    struct lm_model_config cfg;
    struct lm_gen_defaults gen;
    const struct lm_family *family;
    void *state;                    /* the family's weights and tables */
    struct lm_weight_store ws;      /* owns the weight copies */
    struct lm_safetensors st;       /* open only while weights are mapped */
    struct lm_tokenizer *tok;
    struct lm_pool *pool;
    const struct lm_cpu_ops *ops;
    pthread_mutex_t forward_mu;     /* one forward at a time: the pool has one caller */
    char *name;                     /* the folder's base name */
};

struct lm_seq {
    struct lm_model *m;
    void *state; /* the family's cache and scratch */
    int len, cap;
};

struct lm_model_open_params lm_model_default_open_params(void) {
    return (struct lm_model_open_params){
        .tokenizer_dir = NULL, .n_threads = 0, .map_weights = false, .scalar_kernels = false};
}

/* ---- config.json and generation_config.json ---- */

static lm_status parse_config(const struct lm_hf_config *hf, struct lm_model_config *c) {
    memset(c, 0, sizeof *c);
    lm_status rc;
    if (!lm_hf_config_get(hf, "model_type"))
        return lm_errorf(LM_ERR_MISSING, "%s: missing key 'model_type'", hf->name);
    if ((rc = lm_hf_config_string_opt(hf, "model_type", c->model_type, sizeof c->model_type)))
        return rc;
    if (!lm_family_find(c->model_type)) {
        struct lm_buf list = {0};
        lm_family_list(&list);
        rc = lm_errorf(LM_ERR_UNSUPPORTED, "%s: model_type '%s' is not supported (supported: %s)",
                       hf->name, c->model_type, list.p);
        lm_buf_free(&list);
        return rc;
    }
    const long big = 1L << 30;
    if ((rc = lm_hf_config_int(hf, "hidden_size", 1, 1 << 20, &c->hidden_size)) ||
        (rc = lm_hf_config_int(hf, "intermediate_size", 1, 1 << 22, &c->intermediate_size)) ||
        (rc = lm_hf_config_int(hf, "num_hidden_layers", 1, 4096, &c->num_hidden_layers)) ||
        (rc = lm_hf_config_int(hf, "num_attention_heads", 1, 4096, &c->num_attention_heads)) ||
        (rc = lm_hf_config_int(hf, "vocab_size", 1, big, &c->vocab_size)) ||
        (rc = lm_hf_config_int(hf, "max_position_embeddings", 1, big, &c->max_position_embeddings)))
        return rc;
    c->num_key_value_heads = c->num_attention_heads;
    if ((rc = lm_hf_config_int_opt(hf, "num_key_value_heads", 1, 4096, &c->num_key_value_heads)))
        return rc;
    c->head_dim = c->hidden_size / c->num_attention_heads;
    if ((rc = lm_hf_config_int_opt(hf, "head_dim", 1, 1 << 16, &c->head_dim))) return rc;
    double eps = 1e-6;
    if ((rc = lm_hf_config_number_opt(hf, "rms_norm_eps", &eps))) return rc;
    c->rms_norm_eps = (float)eps;
    c->rope_theta = -1;
    if ((rc = lm_hf_config_number_opt(hf, "rope_theta", &c->rope_theta)) ||
        (rc = lm_hf_config_number_opt(hf, "rope_parameters.rope_theta", &c->rope_theta)))
        return rc;
    if (c->rope_theta < 0)
        return lm_errorf(LM_ERR_MISSING, "%s: missing key 'rope_theta' (or rope_parameters.rope_theta)",
                         hf->name);
    if (!(c->rope_theta > 1))
        return lm_errorf(LM_ERR_FORMAT, "%s: rope_theta %g is not above 1", hf->name, c->rope_theta);
    c->tie_word_embeddings = false;
    if ((rc = lm_hf_config_bool_opt(hf, "tie_word_embeddings", &c->tie_word_embeddings))) return rc;
    c->bos_token_id = -1;
    if ((rc = lm_hf_config_int_opt(hf, "bos_token_id", 0, INT32_MAX, &c->bos_token_id))) return rc;
    if (c->num_key_value_heads > c->num_attention_heads)
        return lm_errorf(LM_ERR_FORMAT, "%s: num_key_value_heads %d exceeds num_attention_heads %d",
                         hf->name, c->num_key_value_heads, c->num_attention_heads);
    return LM_OK;
}

static lm_status parse_generation(const char *dir, const struct lm_hf_config *cfg,
                                  struct lm_gen_defaults *g) {
    memset(g, 0, sizeof *g);
    g->temperature = -1;
    g->top_p = -1;
    g->top_k = -1;
    struct lm_hf_config gc;
    lm_status rc = lm_hf_config_load(&gc, dir, "generation_config.json");
    if (rc == LM_ERR_MISSING) {
        rc = LM_OK;
    } else if (rc) {
        return rc;
    } else {
        double t = -1, p = -1;
        int k = -1;
        if (!(rc = lm_hf_config_ids_opt(&gc, "eos_token_id", g->eos_token_ids, &g->n_eos, LM_MAX_EOS)) &&
            !(rc = lm_hf_config_number_opt(&gc, "temperature", &t)) &&
            !(rc = lm_hf_config_number_opt(&gc, "top_p", &p)) &&
            !(rc = lm_hf_config_int_opt(&gc, "top_k", 0, INT32_MAX, &k))) {
            g->temperature = (float)t;
            g->top_p = (float)p;
            g->top_k = k;
        }
        lm_hf_config_free(&gc);
        if (rc) return rc;
    }
    return lm_hf_config_ids_opt(cfg, "eos_token_id", g->eos_token_ids, &g->n_eos, LM_MAX_EOS);
}

/* ---- open / close ---- */

static char *folder_name(const char *dir) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/') b--;
    char *s = strndup(dir + b, n - b);
    if (!s) abort();
    return s;
}

void lm_model_close(struct lm_model *m) {
    if (!m) return;
    if (m->family && m->state) m->family->unload(m->state);
    lm_weight_store_free(&m->ws);
    lm_st_close(&m->st);
    if (m->tok) lm_tokenizer_destroy(m->tok);
    lm_pool_destroy(m->pool);
    pthread_mutex_destroy(&m->forward_mu);
    free(m->name);
    free(m);
}

lm_status lm_model_open(const char *dir, const struct lm_model_open_params *params,
                        struct lm_model **out) {
    *out = NULL;
    struct lm_model_open_params p = params ? *params : lm_model_default_open_params();
    if (!lm_dir_exists(dir)) return lm_errorf(LM_ERR_IO, "%s: not a folder", dir);
    struct lm_model *m = calloc(1, sizeof *m);
    if (!m) return lm_errorf(LM_ERR_NOMEM, "%s: out of memory", dir);
    pthread_mutex_init(&m->forward_mu, NULL);
    m->name = folder_name(dir);
    struct lm_hf_config hf = {0};
    lm_status rc = lm_hf_config_load(&hf, dir, "config.json");
    if (!rc) rc = parse_config(&hf, &m->cfg);
    if (!rc) rc = parse_generation(dir, &hf, &m->gen);
    if (rc) goto fail;
    m->family = lm_family_find(m->cfg.model_type);

    /* Tokenizer: DIR/tokenizer.json, or tokenizer_dir's. */
    {
        const char *tdir = p.tokenizer_dir ? p.tokenizer_dir : dir;
        char *tpath = lm_path_join(tdir, "tokenizer.json");
        if (!lm_file_exists(tpath)) {
            rc = p.tokenizer_dir
                     ? lm_errorf(LM_ERR_MISSING, "%s: file not found", tpath)
                     : lm_errorf(LM_ERR_MISSING,
                                 "%s: the model folder has no tokenizer.json; pass --tokenizer DIR "
                                 "with a folder that holds one",
                                 dir);
            free(tpath);
            goto fail;
        }
        rc = lm_tokenizer_load(tpath, &m->tok);
        free(tpath);
        if (rc) goto fail;
        size_t tv = lm_tokenizer_vocab_size(m->tok);
        if (tv > (size_t)m->cfg.vocab_size) {
            rc = lm_errorf(LM_ERR_SHAPE,
                           "tokenizer.json has %zu ids but config.json vocab_size is %d", tv,
                           m->cfg.vocab_size);
            goto fail;
        }
    }

    /* Weights. */
    if ((rc = lm_st_open_dir(&m->st, dir))) goto fail;
    if ((rc = lm_pool_create(p.n_threads, &m->pool))) goto fail;
    m->ops = p.scalar_kernels ? lm_cpu_ops_scalar() : lm_cpu_ops_fast();
    m->ws.st = &m->st;
    m->ws.map = p.map_weights;
    struct lm_family_load_args args = {&m->cfg, &hf, &m->ws, m->pool, m->ops};
    if ((rc = m->family->load(&args, &m->state))) goto fail;
    m->ws.st = NULL;
    if (m->ws.bytes_mapped == 0) lm_st_close(&m->st); /* everything was copied */
    lm_hf_config_free(&hf);
    *out = m;
    return LM_OK;
fail:
    lm_hf_config_free(&hf);
    lm_model_close(m);
    return rc;
}

const struct lm_model_config *lm_model_config(const struct lm_model *m) { return &m->cfg; }
const struct lm_gen_defaults *lm_model_gen_defaults(const struct lm_model *m) { return &m->gen; }
const struct lm_tokenizer *lm_model_tokenizer(const struct lm_model *m) { return m->tok; }
unsigned lm_model_tasks(const struct lm_model *m) { return m->family->tasks; }
const char *lm_model_name(const struct lm_model *m) { return m->name; }

void lm_model_info(const struct lm_model *m, struct lm_model_info *out) {
    out->weight_dtype = m->ws.mixed_dtypes ? "mixed" : lm_dtype_name(m->ws.matrix_dtype);
    out->kernels = m->ops->name;
    out->weights_mapped = m->ws.bytes_mapped > 0;
    out->weight_bytes = m->ws.bytes_copied + m->ws.bytes_mapped;
    out->n_params = m->ws.n_params;
    out->n_threads = lm_pool_size(m->pool);
}

lm_status lm_model_render_chat(const struct lm_model *m, const struct lm_chat_msg *msgs, size_t n,
                               const struct lm_chat_opts *opts, struct lm_buf *out) {
    return m->family->render_chat(msgs, n, opts, out);
}

/* ---- sequences ---- */

lm_status lm_seq_create(struct lm_model *m, int max_tokens, struct lm_seq **out) {
    *out = NULL;
    if (max_tokens < 1) return lm_errorf(LM_ERR_INVALID, "sequence capacity %d is below 1", max_tokens);
    if (max_tokens > m->cfg.max_position_embeddings)
        return lm_errorf(LM_ERR_RANGE,
                         "sequence capacity %d exceeds the model's max_position_embeddings %d",
                         max_tokens, m->cfg.max_position_embeddings);
    struct lm_seq *s = calloc(1, sizeof *s);
    if (!s) return lm_errorf(LM_ERR_NOMEM, "out of memory for a sequence");
    lm_status rc = m->family->seq_create(m->state, max_tokens, &s->state);
    if (rc) {
        free(s);
        return rc;
    }
    s->m = m;
    s->cap = max_tokens;
    *out = s;
    return LM_OK;
}

void lm_seq_destroy(struct lm_seq *s) {
    if (!s) return;
    s->m->family->seq_destroy(s->state);
    free(s);
}

int lm_seq_len(const struct lm_seq *s) { return s->len; }
int lm_seq_capacity(const struct lm_seq *s) { return s->cap; }

void lm_seq_truncate(struct lm_seq *s, int n) {
    if (n < 0) n = 0;
    if (n < s->len) s->len = n;
}

lm_status lm_seq_forward(struct lm_seq *s, const int32_t *ids, int n, float *logits,
                         bool all_logits) {
    struct lm_model *m = s->m;
    if (n < 1) return lm_errorf(LM_ERR_INVALID, "forward of %d tokens", n);
    if (n > s->cap - s->len)
        return lm_errorf(LM_ERR_RANGE,
                         "%d positions in the cache plus %d new tokens exceed its capacity of %d",
                         s->len, n, s->cap);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= m->cfg.vocab_size)
            return lm_errorf(LM_ERR_INVALID, "token id %d at index %d is outside the vocabulary [0, %d)",
                             ids[i], i, m->cfg.vocab_size);
    pthread_mutex_lock(&m->forward_mu);
    lm_status rc = m->family->forward(m->state, s->state, s->len, ids, n, logits, all_logits);
    pthread_mutex_unlock(&m->forward_mu);
    if (!rc) s->len += n;
    return rc;
}
