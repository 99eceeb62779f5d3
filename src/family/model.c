/* model.c: lm_model_open and the lm_model_* / lm_seq_* functions of family/model.h.
 *
 * Opening a model folder: config.json (generic decoder keys, model_type -> family),
 * generation_config.json (optional), tokenizer.json (folder or tokenizer_dir), the safetensors
 * checkpoint (single or sharded), then the family loads its tensors into the weight store.
 * Unless weights are mapped, the file maps are closed after load. */
#include "family/model.h"

#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/threadpool.h"
#include "family/bundle.h"
#include "family/family.h"
#include "format/hf_config.h"
#include "format/safetensors.h"

#ifdef LM_HAVE_CUDA
#include "backend/cuda/cuda.h"
#endif

struct lm_model {
    struct lm_model_config cfg;
    struct lm_gen_defaults gen;
    const struct lm_family *family;
    void *state;                    /* the family's weights and tables */
    struct lm_weight_store ws;      /* owns the weight copies */
    struct lm_safetensors st;       /* open only while weights are mapped */
    struct lm_gguf gguf;            /* a GGUF bundle: open only while weights are mapped */
    bool is_gguf;                   /* opened from a GGUF file */
    struct lm_tokenizer *tok;
    struct lm_pool *pool;
    const struct lm_cpu_ops *ops;
    pthread_mutex_t forward_mu;     /* one forward at a time: the pool has one caller */
    char *name;                     /* the folder's base name */
    bool cuda;                      /* runs on CUDA device cuda_device (open params' device) */
    int cuda_device;
    char device[16];                /* "cpu" or "cuda:N" */
    char device_name[128];          /* "cpu" or the GPU's name */
    size_t device_free;             /* CUDA: device memory free at open */
};

struct lm_kv_cache {
    struct lm_model *m;
    void *state; /* the family's pool and scratch */
    int n_blocks, max_batch, max_ctx;
};

/* Tokens per lm_seq_forward chunk: bounds a private sequence's scratch. On CUDA the chunk is
 * llama.cpp's default micro-batch (n_ubatch 512): a GPU needs larger steps to fill it. */
enum { SEQ_CHUNK = 256, SEQ_CHUNK_CUDA = 512 };

struct lm_seq {
    struct lm_model *m;
    struct lm_kv_cache *kv; /* private: blocks 0..n-1 in order */
    int32_t *blocks;        /* [ceil(cap / LM_KV_BLOCK)] identity block table */
    int len, cap;
};

struct lm_model_open_params lm_model_default_open_params(void) {
    return (struct lm_model_open_params){
        .tokenizer_dir = NULL, .tokenizer_optional = false, .n_threads = 0, .map_weights = false,
        .scalar_kernels = false, .device = NULL};
}

/* Parses params->device ("cpu", "cuda", "cuda:N") into m and checks that the device exists. */
static lm_status choose_device(struct lm_model *m, const char *dev) {
    snprintf(m->device, sizeof m->device, "cpu");
    snprintf(m->device_name, sizeof m->device_name, "cpu");
    if (!dev || !strcmp(dev, "cpu")) return LM_OK;
    int n = 0;
    if (!strcmp(dev, "cuda")) {
        n = 0;
    } else {
        char *end;
        long v = strncmp(dev, "cuda:", 5) ? -1 : strtol(dev + 5, &end, 10);
        if (v < 0 || v > 1023 || !dev[5] || *end)
            return lm_errorf(LM_ERR_INVALID, "device '%s': expected cpu, cuda or cuda:N", dev);
        n = (int)v;
    }
    snprintf(m->device, sizeof m->device, "cuda:%d", n);
#ifndef LM_HAVE_CUDA
    return lm_errorf(LM_ERR_UNSUPPORTED, "device %s: this lumen was built without CUDA (configure "
                     "with nvcc on the PATH and -DLM_CUDA=ON)", m->device);
#else
    int count = lm_cuda_device_count();
    if (count == 0)
        return lm_errorf(LM_ERR_UNSUPPORTED, "device %s: no CUDA device found (no GPU, no driver, "
                         "or a driver older than the CUDA runtime)", m->device);
    if (n >= count)
        return lm_errorf(LM_ERR_UNSUPPORTED, "device %s: no such CUDA device (%d found: cuda:0 to "
                         "cuda:%d)", m->device, count, count - 1);
    struct lm_cuda_device_info info;
    lm_status rc = lm_cuda_device_info(n, &info);
    if (rc) return rc;
    if (info.cc_major < 9)
        return lm_errorf(LM_ERR_UNSUPPORTED, "device %s (%s) has compute capability %d.%d; the CUDA "
                         "backend needs 9.0 or newer (H100, H200)", m->device, info.name,
                         info.cc_major, info.cc_minor);
    snprintf(m->device_name, sizeof m->device_name, "%s", info.name);
    m->cuda = true;
    m->cuda_device = n;
    m->device_free = info.free_mem;
    return LM_OK;
#endif
}

/* ---- config.json and generation_config.json ---- */

lm_status lm_model_parse_config(const struct lm_hf_config *hf, struct lm_model_config *c) {
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

lm_status lm_model_parse_generation(const char *dir, const struct lm_hf_config *cfg,
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
    lm_gguf_close(&m->gguf);
    if (m->tok) lm_tokenizer_destroy(m->tok);
    lm_pool_destroy(m->pool);
    pthread_mutex_destroy(&m->forward_mu);
    free(m->name);
    free(m);
}

/* Checks the tokenizer's ids against the model's vocabulary. */
static lm_status check_vocab(const struct lm_model *m, const char *what) {
    size_t tv = lm_tokenizer_vocab_size(m->tok);
    if (tv > (size_t)m->cfg.vocab_size)
        return lm_errorf(LM_ERR_SHAPE, "%s has %zu ids but the model's vocab_size is %d", what, tv,
                         m->cfg.vocab_size);
    return LM_OK;
}

/* The thread pool, the kernels and the family's weights from the store's source (m->ws.st or
 * m->ws.gguf set by the caller). */
static lm_status load_weights(struct lm_model *m, const struct lm_hf_config *hf,
                              const struct lm_model_open_params *p) {
    /* On CUDA the host runs no kernels: one thread, and the checkpoint's matrices used in place
     * (row-major, as the CUDA loader takes them). */
    lm_status rc = lm_pool_create(m->cuda ? 1 : p->n_threads, &m->pool);
    if (rc) return rc;
    m->ops = p->scalar_kernels ? lm_cpu_ops_scalar() : lm_cpu_ops_fast();
    m->ws.map = p->map_weights || m->cuda;
    struct lm_family_load_args args = {&m->cfg, hf, &m->ws, m->pool, m->ops, m->cuda, m->cuda_device};
    rc = m->family->load(&args, &m->state);
    m->ws.st = NULL;
    m->ws.gguf = NULL;
    return rc;
}

/* The end of an open (rc its status so far): frees hf; on success closes the weight files when
 * nothing stays mapped from them (everything was copied) and hands m out, else closes m. */
static lm_status finish_open(struct lm_model *m, struct lm_hf_config *hf, lm_status rc,
                             struct lm_model **out) {
    lm_hf_config_free(hf);
    if (rc) {
        lm_model_close(m);
        return rc;
    }
    if (m->ws.bytes_mapped == 0) {
        lm_st_close(&m->st);
        lm_gguf_close(&m->gguf);
    }
    *out = m;
    return LM_OK;
}

/* Opens a GGUF bundle (bundle.h): config, generation defaults and tokenizer from its metadata
 * (or tokenizer.json from tokenizer_dir), weights from its tensors. */
static lm_status open_gguf(const char *path, const struct lm_model_open_params *p,
                           struct lm_model **out) {
    struct lm_model *m = calloc(1, sizeof *m);
    if (!m) return lm_errorf(LM_ERR_NOMEM, "%s: out of memory", path);
    pthread_mutex_init(&m->forward_mu, NULL);
    m->name = folder_name(path);
    m->is_gguf = true;
    lm_status drc = choose_device(m, p->device);
    if (drc) {
        lm_model_close(m);
        return drc;
    }
    size_t nl = strlen(m->name);
    if (nl > 5 && !strcmp(m->name + nl - 5, ".gguf")) m->name[nl - 5] = 0;
    struct lm_hf_config hf = {0};
    lm_status rc = lm_gguf_open(&m->gguf, path);
    if (!rc) rc = lm_bundle_gguf_config(&m->gguf, &hf);
    if (!rc) rc = lm_model_parse_config(&hf, &m->cfg);
    if (!rc) rc = lm_bundle_gguf_generation(&m->gguf, &m->gen);
    if (rc) goto done;
    m->family = lm_family_find(m->cfg.model_type);
    if (p->tokenizer_dir) {
        char *tpath = lm_path_join(p->tokenizer_dir, "tokenizer.json");
        rc = lm_file_exists(tpath) ? lm_tokenizer_load(tpath, &m->tok)
                                   : lm_errorf(LM_ERR_MISSING, "%s: file not found", tpath);
        free(tpath);
    } else {
        rc = lm_bundle_gguf_tokenizer(&m->gguf, &m->tok);
    }
    if (!rc) rc = check_vocab(m, p->tokenizer_dir ? "tokenizer.json" : "tokenizer.ggml.tokens");
    if (rc) goto done;
    m->ws.gguf = &m->gguf;
    rc = load_weights(m, &hf, p);
done:
    return finish_open(m, &hf, rc, out);
}

lm_status lm_model_missing_tokenizer(const char *dir) {
    return lm_errorf(LM_ERR_MISSING,
                     "%s: the model folder has no tokenizer.json; pass --tokenizer DIR with a folder "
                     "that holds one",
                     dir);
}

lm_status lm_model_open(const char *dir, const struct lm_model_open_params *params,
                        struct lm_model **out) {
    *out = NULL;
    struct lm_model_open_params p = params ? *params : lm_model_default_open_params();
    if (!lm_dir_exists(dir)) {
        if (lm_file_exists(dir)) return open_gguf(dir, &p, out);
        return lm_errorf(LM_ERR_IO, "%s: not a model folder or a GGUF file", dir);
    }
    struct lm_model *m = calloc(1, sizeof *m);
    if (!m) return lm_errorf(LM_ERR_NOMEM, "%s: out of memory", dir);
    pthread_mutex_init(&m->forward_mu, NULL);
    m->name = folder_name(dir);
    struct lm_hf_config hf = {0};
    lm_status rc = choose_device(m, p.device);
    if (!rc) rc = lm_hf_config_load(&hf, dir, "config.json");
    if (!rc) rc = lm_model_parse_config(&hf, &m->cfg);
    if (!rc) rc = lm_model_parse_generation(dir, &hf, &m->gen);
    if (rc) goto done;
    m->family = lm_family_find(m->cfg.model_type);

    /* Tokenizer: DIR/tokenizer.json, or tokenizer_dir's (none when optional and absent). */
    {
        const char *tdir = p.tokenizer_dir ? p.tokenizer_dir : dir;
        char *tpath = lm_path_join(tdir, "tokenizer.json");
        if (!lm_file_exists(tpath) && p.tokenizer_optional && !p.tokenizer_dir) {
            free(tpath);
        } else if (!lm_file_exists(tpath)) {
            rc = p.tokenizer_dir ? lm_errorf(LM_ERR_MISSING, "%s: file not found", tpath)
                                 : lm_model_missing_tokenizer(dir);
            free(tpath);
            goto done;
        } else {
            rc = lm_tokenizer_load(tpath, &m->tok);
            free(tpath);
            if (!rc) rc = check_vocab(m, "tokenizer.json");
            if (rc) goto done;
        }
    }

    /* Weights. */
    if ((rc = lm_st_open_dir(&m->st, dir))) goto done;
    m->ws.st = &m->st;
    rc = load_weights(m, &hf, &p);
done:
    return finish_open(m, &hf, rc, out);
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
    out->weights_locked = m->ws.bytes_mapped > 0 && m->ws.locked;
    out->format = m->is_gguf ? "gguf" : "safetensors";
    out->weight_bytes = m->ws.bytes_copied + m->ws.bytes_mapped;
    out->n_params = m->ws.n_params;
    out->n_threads = lm_pool_size(m->pool);
    out->device = m->device;
    out->device_name = m->device_name;
    out->device_memory_free = m->cuda ? m->device_free : 0;
    out->device_weight_bytes = m->cuda ? 2 * (size_t)m->ws.n_params : 0;
    if (m->cuda) {
        out->kernels = "cuda";
        out->weight_dtype = "bf16";
#ifdef LM_HAVE_CUDA
        /* A Q8_0 checkpoint keeps its quants beside the bf16 copy (backend/cuda/qwen3.cu). */
        if (!m->ws.mixed_dtypes && m->ws.matrix_dtype == LM_DTYPE_Q8_0 && lm_cuda_q8_enabled()) {
            out->weight_dtype = "q8_0";
            out->device_weight_bytes += (size_t)m->ws.n_params * 17 / 16;
        }
#endif
    }
}

lm_status lm_model_render_chat(const struct lm_model *m, const struct lm_chat_msg *msgs, size_t n,
                               const struct lm_chat_opts *opts, struct lm_buf *out) {
    return m->family->render_chat(msgs, n, opts, out);
}

/* ---- paged KV cache and the batched forward ---- */

size_t lm_model_kv_bytes_per_token(const struct lm_model *m) {
    return 2u * (m->cuda ? 2u : sizeof(float)) * (size_t)m->cfg.num_hidden_layers *
           (size_t)m->cfg.num_key_value_heads * (size_t)m->cfg.head_dim;
}

lm_status lm_kv_cache_create(struct lm_model *m, int n_blocks, int max_batch, int max_ctx,
                             struct lm_kv_cache **out) {
    *out = NULL;
    if (n_blocks < 1 || max_batch < 1 || max_ctx < 1)
        return lm_errorf(LM_ERR_INVALID, "KV cache of %d blocks, %d tokens a step, %d positions: "
                         "each must be at least 1", n_blocks, max_batch, max_ctx);
    if (max_ctx > m->cfg.max_position_embeddings)
        return lm_errorf(LM_ERR_RANGE,
                         "context of %d positions exceeds the model's max_position_embeddings %d",
                         max_ctx, m->cfg.max_position_embeddings);
    struct lm_kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv) return lm_errorf(LM_ERR_NOMEM, "out of memory for a KV cache");
    lm_status rc = m->family->kv_create(m->state, n_blocks, max_batch, max_ctx, &kv->state);
    if (rc) {
        free(kv);
        return rc;
    }
    kv->m = m;
    kv->n_blocks = n_blocks;
    kv->max_batch = max_batch;
    kv->max_ctx = max_ctx;
    *out = kv;
    return LM_OK;
}

void lm_kv_cache_destroy(struct lm_kv_cache *kv) {
    if (!kv) return;
    kv->m->family->kv_destroy(kv->state);
    free(kv);
}

int lm_kv_cache_blocks(const struct lm_kv_cache *kv) { return kv->n_blocks; }
int lm_kv_cache_max_batch(const struct lm_kv_cache *kv) { return kv->max_batch; }
int lm_kv_cache_max_ctx(const struct lm_kv_cache *kv) { return kv->max_ctx; }

void lm_kv_cache_copy(struct lm_kv_cache *kv, int src, int dst, int n_rows) {
    assert(src >= 0 && src < kv->n_blocks && dst >= 0 && dst < kv->n_blocks && src != dst);
    assert(n_rows >= 0 && n_rows <= LM_KV_BLOCK);
    if (n_rows) kv->m->family->kv_copy(kv->state, src, dst, n_rows);
}

/* Checks a step (model.h, lm_model_forward); *rows gets its output rows. feed: NULL, or per
 * sequence -1 or the output row its one token is fed from (lm_model_queue_sample: ids unread). */
static lm_status check_step(const struct lm_model *m, const struct lm_kv_cache *kv,
                            const struct lm_batch_seq *seqs, int n_seqs, const int32_t *feed, long *rows_out) {
    if (n_seqs < 1) return lm_errorf(LM_ERR_INVALID, "forward step of %d sequences", n_seqs);
    long tokens = 0, rows = 0;
    for (int s = 0; s < n_seqs; s++) {
        const struct lm_batch_seq *b = &seqs[s];
        if (b->n < 1 || b->pos < 0)
            return lm_errorf(LM_ERR_INVALID, "forward step: sequence %d has %d tokens at position %d",
                             s, b->n, b->pos);
        if ((long)b->pos + b->n > kv->max_ctx)
            return lm_errorf(LM_ERR_RANGE,
                             "%d positions in the cache plus %d new tokens exceed its capacity of %d",
                             b->pos, b->n, kv->max_ctx);
        for (int i = 0; i < b->n && !(feed && feed[s] >= 0); i++)
            if (b->ids[i] < 0 || b->ids[i] >= m->cfg.vocab_size)
                return lm_errorf(LM_ERR_INVALID,
                                 "token id %d at index %d of sequence %d is outside the vocabulary "
                                 "[0, %d)", b->ids[i], i, s, m->cfg.vocab_size);
        int nb = (b->pos + b->n + LM_KV_BLOCK - 1) / LM_KV_BLOCK;
        for (int i = 0; i < nb; i++) assert(b->blocks[i] >= 0 && b->blocks[i] < kv->n_blocks);
        tokens += b->n;
        rows += b->logits == LM_LOGITS_ALL ? b->n : b->logits == LM_LOGITS_LAST ? 1 : 0;
    }
    if (tokens > kv->max_batch)
        return lm_errorf(LM_ERR_RANGE, "forward step of %ld tokens exceeds the scratch for %d",
                         tokens, kv->max_batch);
    *rows_out = rows;
    return LM_OK;
}

lm_status lm_model_forward(struct lm_model *m, struct lm_kv_cache *kv, const struct lm_batch_seq *seqs,
                           int n_seqs, float *logits) {
    long rows = 0;
    lm_status rc = check_step(m, kv, seqs, n_seqs, NULL, &rows);
    if (rc) return rc;
    assert(rows == 0 || logits);
    pthread_mutex_lock(&m->forward_mu);
    rc = m->family->forward(m->state, kv->state, seqs, n_seqs, logits);
    pthread_mutex_unlock(&m->forward_mu);
    return rc;
}

bool lm_model_samples_on_device(const struct lm_model *m) {
    return m->cuda && m->family->forward_sample;
}

int lm_model_max_run(const struct lm_model *m) {
#ifdef LM_HAVE_CUDA
    if (m->cuda) return LM_CUDA_DEC_RUN;
#endif
    (void)m;
    return 1 << 20;
}

lm_status lm_model_forward_sample(struct lm_model *m, struct lm_kv_cache *kv,
                                  const struct lm_batch_seq *seqs, int n_seqs,
                                  const struct lm_device_sampling *sampling, int32_t *ids,
                                  float *logits) {
    if (!lm_model_samples_on_device(m))
        return lm_errorf(LM_ERR_UNSUPPORTED, "choosing tokens in the forward step needs a model on "
                         "a CUDA device (this one runs on %s)", m->device);
    long rows = 0;
    lm_status rc = check_step(m, kv, seqs, n_seqs, NULL, &rows);
    if (rc) return rc;
    assert(rows == 0 || (sampling && ids));
    pthread_mutex_lock(&m->forward_mu);
    rc = m->family->forward_sample(m->state, kv->state, seqs, n_seqs, sampling, ids, logits);
    pthread_mutex_unlock(&m->forward_mu);
    return rc;
}

bool lm_model_can_queue(const struct lm_model *m) {
    return lm_model_samples_on_device(m) && m->family->queue_sample && m->family->collect;
}

lm_status lm_model_queue_sample(struct lm_model *m, struct lm_kv_cache *kv, const struct lm_batch_seq *seqs,
                                int n_seqs, const struct lm_device_sampling *sampling, const int32_t *feed) {
    if (!lm_model_can_queue(m))
        return lm_errorf(LM_ERR_UNSUPPORTED, "queued steps need a model on a CUDA device (this one runs on %s)",
                         m->device);
    long rows = 0;
    lm_status rc = check_step(m, kv, seqs, n_seqs, feed, &rows);
    if (rc) return rc;
    assert(sampling);
    pthread_mutex_lock(&m->forward_mu);
    rc = m->family->queue_sample(m->state, kv->state, seqs, n_seqs, sampling, feed);
    pthread_mutex_unlock(&m->forward_mu);
    return rc;
}

lm_status lm_model_collect(struct lm_model *m, struct lm_kv_cache *kv, int32_t *ids, int *n_ids) {
    if (!lm_model_can_queue(m))
        return lm_errorf(LM_ERR_UNSUPPORTED, "queued steps need a model on a CUDA device (this one runs on %s)",
                         m->device);
    pthread_mutex_lock(&m->forward_mu);
    lm_status rc = m->family->collect(m->state, kv->state, ids, n_ids);
    pthread_mutex_unlock(&m->forward_mu);
    return rc;
}

/* ---- one sequence on its own cache ---- */

lm_status lm_seq_create(struct lm_model *m, int max_tokens, struct lm_seq **out) {
    *out = NULL;
    if (max_tokens < 1) return lm_errorf(LM_ERR_INVALID, "sequence capacity %d is below 1", max_tokens);
    if (max_tokens > m->cfg.max_position_embeddings)
        return lm_errorf(LM_ERR_RANGE,
                         "sequence capacity %d exceeds the model's max_position_embeddings %d",
                         max_tokens, m->cfg.max_position_embeddings);
    struct lm_seq *s = calloc(1, sizeof *s);
    if (!s) return lm_errorf(LM_ERR_NOMEM, "out of memory for a sequence");
    int nb = (max_tokens + LM_KV_BLOCK - 1) / LM_KV_BLOCK;
    s->blocks = malloc(sizeof *s->blocks * (size_t)nb);
    if (!s->blocks) {
        free(s);
        return lm_errorf(LM_ERR_NOMEM, "out of memory for a sequence");
    }
    for (int i = 0; i < nb; i++) s->blocks[i] = i;
    int most = m->cuda ? SEQ_CHUNK_CUDA : SEQ_CHUNK;
    int chunk = max_tokens < most ? max_tokens : most;
    lm_status rc = lm_kv_cache_create(m, nb, chunk, max_tokens, &s->kv);
    if (rc) {
        free(s->blocks);
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
    lm_kv_cache_destroy(s->kv);
    free(s->blocks);
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
    const int chunk = s->kv->max_batch;
    const size_t vocab = (size_t)m->cfg.vocab_size;
    for (int done = 0; done < n;) {
        int c = n - done < chunk ? n - done : chunk;
        bool last = done + c == n;
        struct lm_batch_seq b = {ids + done, c, s->len, s->blocks,
                                 all_logits ? LM_LOGITS_ALL : last ? LM_LOGITS_LAST : LM_LOGITS_NONE};
        lm_status rc = lm_model_forward(m, s->kv, &b, 1, all_logits ? logits + done * vocab : logits);
        if (rc) return rc;
        s->len += c;
        done += c;
    }
    return LM_OK;
}
