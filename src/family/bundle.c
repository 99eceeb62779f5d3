/* bundle.c: GGUF bundles (see bundle.h). */
#include "family/bundle.h"

#include <assert.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/quant.h"
#include "base/buf.h"
#include "base/file.h"
#include "family/family.h"
#include "format/safetensors.h"

/* GGUF tokenizer.ggml.token_type values (llama.cpp's llama_token_type / gguf-py TokenType). */
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_UNUSED = 5, TT_BYTE = 6 };

/* llama_ftype values of general.file_type. */
enum { FT_ALL_F32 = 0, FT_MOSTLY_F16 = 1, FT_MOSTLY_Q8_0 = 7, FT_MOSTLY_BF16 = 32 };

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* ---- reading: config ---- */

lm_status lm_bundle_gguf_config(const struct lm_gguf *g, struct lm_hf_config *out) {
    memset(out, 0, sizeof *out);
    const char *file = base_name(g->map.path);
    struct lm_gguf_str arch;
    lm_status rc = lm_gguf_get_str(g, "general.architecture", &arch);
    if (rc) return rc;
    if (arch.len == 0 || arch.len >= 32 || memchr(arch.p, 0, arch.len))
        return lm_errorf(LM_ERR_FORMAT, "%s: general.architecture '%.*s' is not a valid name", file,
                         (int)(arch.len > 64 ? 64 : arch.len), arch.p);
    char a[32], key[128];
    memcpy(a, arch.p, arch.len);
    a[arch.len] = 0;
    json_t *o = json_object();
    if (!o) abort();
    json_object_set_new(o, "model_type", json_string(a));
    static const struct {
        const char *suffix, *hf;
        bool required;
    } k_ints[] = {
        {"block_count", "num_hidden_layers", true},
        {"embedding_length", "hidden_size", true},
        {"feed_forward_length", "intermediate_size", true},
        {"attention.head_count", "num_attention_heads", true},
        {"attention.head_count_kv", "num_key_value_heads", false},
        {"attention.key_length", "head_dim", false},
        {"context_length", "max_position_embeddings", true},
    };
    int64_t head_dim = -1, value_len = -1, v;
    for (size_t i = 0; i < sizeof k_ints / sizeof *k_ints; i++) {
        snprintf(key, sizeof key, "%s.%s", a, k_ints[i].suffix);
        v = -1;
        rc = k_ints[i].required ? lm_gguf_get_int(g, key, 1, 1L << 30, &v)
                                : lm_gguf_get_int_opt(g, key, 1, 1L << 30, &v);
        if (rc) goto fail;
        if (v >= 0) json_object_set_new(o, k_ints[i].hf, json_integer(v));
        if (!strcmp(k_ints[i].hf, "head_dim")) head_dim = v;
    }
    snprintf(key, sizeof key, "%s.attention.value_length", a);
    if ((rc = lm_gguf_get_int_opt(g, key, 1, 1L << 30, &value_len))) goto fail;
    if (value_len >= 0) {
        if (head_dim < 0) {
            int64_t h = json_integer_value(json_object_get(o, "hidden_size")),
                    n = json_integer_value(json_object_get(o, "num_attention_heads"));
            head_dim = h / n;
        }
        if (value_len != head_dim) {
            rc = lm_errorf(LM_ERR_UNSUPPORTED, "%s: %s %lld differs from the key length %lld (not "
                           "supported)", file, key, (long long)value_len, (long long)head_dim);
            goto fail;
        }
    }
    double eps, theta = 10000.0; /* llama.cpp's default freq_base */
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", a);
    if ((rc = lm_gguf_get_number(g, key, &eps))) goto fail;
    json_object_set_new(o, "rms_norm_eps", json_real(eps));
    snprintf(key, sizeof key, "%s.rope.freq_base", a);
    if ((rc = lm_gguf_get_number_opt(g, key, &theta))) goto fail;
    json_object_set_new(o, "rope_theta", json_real(theta));
    struct lm_gguf_str scaling = {"none", 4};
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    if ((rc = lm_gguf_get_str_opt(g, key, &scaling))) goto fail;
    if (!(scaling.len == 4 && !memcmp(scaling.p, "none", 4))) {
        json_t *rs = json_object();
        json_object_set_new(rs, "type", json_stringn(scaling.p, scaling.len));
        json_object_set_new(o, "rope_scaling", rs);
    }
    /* Vocabulary: the architecture's vocab_size, else the token list, else the embedding. */
    int64_t vocab = -1;
    snprintf(key, sizeof key, "%s.vocab_size", a);
    if ((rc = lm_gguf_get_int_opt(g, key, 1, 1L << 30, &vocab))) goto fail;
    const struct lm_gguf_kv *toks = lm_gguf_kv(g, "tokenizer.ggml.tokens");
    if (vocab < 0 && toks && toks->type == LM_GGUF_ARRAY) vocab = (int64_t)toks->arr_n;
    const struct lm_gguf_tensor *emb = lm_gguf_tensor(g, "token_embd.weight");
    if (vocab < 0 && emb && emb->ndim == 2) vocab = emb->ne[1];
    if (vocab < 1) {
        rc = lm_errorf(LM_ERR_MISSING, "%s: no vocabulary size (%s.vocab_size, tokenizer.ggml.tokens "
                       "or token_embd.weight)", file, a);
        goto fail;
    }
    json_object_set_new(o, "vocab_size", json_integer(vocab));
    json_object_set_new(o, "tie_word_embeddings", json_boolean(!lm_gguf_tensor(g, "output.weight")));
    int64_t bos = -1;
    if ((rc = lm_gguf_get_int_opt(g, "tokenizer.ggml.bos_token_id", 0, INT32_MAX, &bos))) goto fail;
    if (bos >= 0) json_object_set_new(o, "bos_token_id", json_integer(bos));
    out->root = o;
    out->name = strdup(file);
    if (!out->name) abort();
    return LM_OK;
fail:
    json_decref(o);
    return rc;
}

/* ---- reading: generation defaults ---- */

static void add_eos(struct lm_gen_defaults *g, int64_t id) {
    for (int i = 0; i < g->n_eos; i++)
        if (g->eos_token_ids[i] == id) return;
    if (g->n_eos < LM_MAX_EOS) g->eos_token_ids[g->n_eos++] = (int32_t)id;
}

lm_status lm_bundle_gguf_generation(const struct lm_gguf *g, struct lm_gen_defaults *out) {
    memset(out, 0, sizeof *out);
    out->temperature = out->top_p = -1;
    out->top_k = -1;
    lm_status rc;
    if (lm_gguf_kv(g, "lumen.generation.eos_token_ids")) {
        const struct lm_gguf_kv *kv;
        if ((rc = lm_gguf_get_array(g, "lumen.generation.eos_token_ids", LM_GGUF_INT32, &kv))) return rc;
        for (uint64_t i = 0; i < kv->arr_n; i++) {
            int64_t id = lm_gguf_array_int(kv, i);
            if (id < 0 || id > INT32_MAX)
                return lm_errorf(LM_ERR_FORMAT, "%s: lumen.generation.eos_token_ids[%llu] is %lld",
                                 base_name(g->map.path), (unsigned long long)i, (long long)id);
            add_eos(out, id);
        }
    }
    const char *ids[] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"};
    for (int i = 0; i < 2; i++) {
        int64_t id = -1;
        if ((rc = lm_gguf_get_int_opt(g, ids[i], 0, INT32_MAX, &id))) return rc;
        if (id >= 0) add_eos(out, id);
    }
    double t = -1, p = -1;
    int64_t k = -1;
    if ((rc = lm_gguf_get_number_opt(g, "general.sampling.temp", &t)) ||
        (rc = lm_gguf_get_number_opt(g, "general.sampling.top_p", &p)) ||
        (rc = lm_gguf_get_int_opt(g, "general.sampling.top_k", -1, INT32_MAX, &k)))
        return rc;
    out->temperature = (float)t;
    out->top_p = (float)p;
    out->top_k = (int)k;
    return LM_OK;
}

/* ---- reading: tokenizer ---- */

/* Copies n strings of a GGUF string array into one NUL-separated block; ptrs[i] = its i-th. */
static char *copy_strings(const struct lm_gguf_kv *kv, const char **ptrs) {
    size_t total = 0;
    for (uint64_t i = 0; i < kv->arr_n; i++) total += kv->strs[i].len + 1;
    char *block = malloc(total ? total : 1), *o = block;
    if (!block) return NULL;
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        memcpy(o, kv->strs[i].p, kv->strs[i].len);
        o[kv->strs[i].len] = 0;
        ptrs[i] = o;
        o += kv->strs[i].len + 1;
    }
    return block;
}

lm_status lm_bundle_gguf_tokenizer(const struct lm_gguf *g, struct lm_tokenizer **out) {
    *out = NULL;
    const char *file = base_name(g->map.path);
    struct lm_gguf_str model, pre = {"default", 7};
    lm_status rc = lm_gguf_get_str(g, "tokenizer.ggml.model", &model);
    if (rc) return rc;
    if (!(model.len == 4 && !memcmp(model.p, "gpt2", 4)))
        return lm_errorf(LM_ERR_UNSUPPORTED,
                         "%s: tokenizer.ggml.model '%.*s' is not supported (lumen reads \"gpt2\", "
                         "byte-level BPE)", file, (int)(model.len > 64 ? 64 : model.len), model.p);
    if ((rc = lm_gguf_get_str_opt(g, "tokenizer.ggml.pre", &pre))) return rc;
    char pre_name[64];
    snprintf(pre_name, sizeof pre_name, "%.*s", (int)(pre.len > 63 ? 63 : pre.len), pre.p);
    const char *regex = lm_tokenizer_pre_regex(pre_name);
    if (!regex)
        return lm_errorf(LM_ERR_UNSUPPORTED, "%s: tokenizer.ggml.pre '%s' is not supported (qwen2, "
                         "deepseek-r1-qwen, gpt2, default are)", file, pre_name);
    const struct lm_gguf_kv *tk, *mg, *tt = NULL;
    if ((rc = lm_gguf_get_array(g, "tokenizer.ggml.tokens", LM_GGUF_STRING, &tk)) ||
        (rc = lm_gguf_get_array(g, "tokenizer.ggml.merges", LM_GGUF_STRING, &mg)))
        return rc;
    if (lm_gguf_kv(g, "tokenizer.ggml.token_type") &&
        (rc = lm_gguf_get_array(g, "tokenizer.ggml.token_type", LM_GGUF_INT32, &tt)))
        return rc;
    if (tt && tt->arr_n != tk->arr_n)
        return lm_errorf(LM_ERR_SHAPE, "%s: tokenizer.ggml.token_type has %llu entries, "
                         "tokenizer.ggml.tokens %llu", file, (unsigned long long)tt->arr_n,
                         (unsigned long long)tk->arr_n);
    size_t n = (size_t)tk->arr_n, nm = (size_t)mg->arr_n;
    const char **toks = calloc(n ? n : 1, sizeof *toks), **merges = calloc(nm ? nm : 1, sizeof *merges);
    uint8_t *kinds = calloc(n ? n : 1, 1);
    char *tblock = NULL, *mblock = NULL;
    if (!toks || !merges || !kinds || !(tblock = copy_strings(tk, toks)) ||
        !(mblock = copy_strings(mg, merges))) {
        rc = lm_errorf(LM_ERR_NOMEM, "%s: out of memory for the tokenizer", file);
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        int64_t t = tt ? lm_gguf_array_int(tt, i) : TT_NORMAL;
        switch (t) {
        case TT_NORMAL:
        case TT_UNKNOWN:
        case TT_BYTE: kinds[i] = LM_TOKEN_NORMAL; break;
        case TT_CONTROL: kinds[i] = LM_TOKEN_SPECIAL; break;
        case TT_USER_DEFINED: kinds[i] = LM_TOKEN_ADDED; break;
        case TT_UNUSED:
            kinds[i] = LM_TOKEN_UNUSED;
            toks[i] = NULL;
            break;
        default:
            rc = lm_errorf(LM_ERR_FORMAT, "%s: tokenizer.ggml.token_type[%zu] is %lld (1 to 6 allowed)",
                           file, i, (long long)t);
            goto done;
        }
    }
    struct lm_tokenizer_parts parts = {
        .source = g->map.path,
        .tokens_field = "tokenizer.ggml.tokens",
        .merges_field = "tokenizer.ggml.merges",
        .n_tokens = n,
        .tokens = toks,
        .kinds = kinds,
        .n_merges = nm,
        .merges = merges,
        /* The Qwen2/Qwen3 tokenizer.json normalizes to NFC; GGUF has no key for it, so it
         * follows from the pre-tokenizer's name. */
        .nfc = !strcmp(pre_name, "qwen2") || !strcmp(pre_name, "deepseek-r1-qwen"),
        .n_split_regexes = 1,
        .split_regexes = &regex,
    };
    rc = lm_tokenizer_create(&parts, out);
done:
    free(toks);
    free(merges);
    free(kinds);
    free(tblock);
    free(mblock);
    return rc;
}

/* ---- writing ---- */

/* SHA-256 of a file, as 64 hex digits. */
static lm_status sha256_file(const char *path, char hex[65]) {
    struct lm_file_map fm;
    lm_status rc = lm_file_map_open(&fm, path);
    if (rc) return rc;
    unsigned char md[32];
    unsigned int len = 0;
    int ok = EVP_Digest(fm.data ? (const void *)fm.data : "", fm.size, md, &len, EVP_sha256(), NULL);
    lm_file_map_close(&fm);
    if (!ok || len != 32) return lm_errorf(LM_ERR_IO, "%s: SHA-256 failed", path);
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
    return LM_OK;
}

static lm_status put_sha256(struct lm_gguf_writer *w, const char *path) {
    char hex[65], key[256];
    lm_status rc = sha256_file(path, hex);
    if (rc) return rc;
    snprintf(key, sizeof key, "lumen.source.sha256.%s", base_name(path));
    lm_gguf_put_str(w, key, hex, 64);
    return LM_OK;
}

/* A special token of tokenizer_config.json ("eos_token": "<|im_end|>" or {"content": ...}) as an
 * id of the vocabulary, or -1. */
static int64_t special_id(json_t *tcfg, const char *field, json_t *vocab, json_t *added) {
    json_t *v = json_object_get(tcfg, field);
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v)) return -1;
    const char *s = json_string_value(v);
    size_t i;
    json_t *a;
    json_array_foreach(added, i, a) {
        json_t *c = json_object_get(a, "content");
        if (json_is_string(c) && !strcmp(json_string_value(c), s))
            return json_integer_value(json_object_get(a, "id"));
    }
    json_t *id = json_object_get(vocab, s);
    return json_is_integer(id) ? json_integer_value(id) : -1;
}

/* llama.cpp's TextModel.does_token_look_special. */
static bool looks_special(const char *t) {
    size_t n = strlen(t);
    if (!strcmp(t, "<pad>") || !strcmp(t, "<mask>") || !strcmp(t, "<2mass>") || !strcmp(t, "[@BOS@]"))
        return true;
    if (n >= 4 && !strncmp(t, "<|", 2) && !strcmp(t + n - 2, "|>")) return true;
    if (n >= 8 && !strncmp(t, "<\xef\xbd\x9c", 4) && !strcmp(t + n - 4, "\xef\xbd\x9c>")) return true;
    if (n >= 8 && !strncmp(t, "<unused", 7) && t[n - 1] == '>') return true;
    return false;
}

static json_t *load_json(const char *dir, const char *name, lm_status *rc) {
    char *path = lm_path_join(dir, name);
    json_error_t e;
    json_t *j = NULL;
    if (!lm_file_exists(path)) {
        *rc = lm_errorf(LM_ERR_MISSING, "%s: file not found", path);
    } else if (!(j = json_load_file(path, 0, &e)) || !json_is_object(j)) {
        *rc = lm_errorf(LM_ERR_FORMAT, "%s: line %d: %s", path, e.line, j ? "not a JSON object" : e.text);
        json_decref(j);
        j = NULL;
    } else {
        *rc = LM_OK;
    }
    free(path);
    return j;
}

/* The tokenizer part of the metadata, from tokenizer.json and, when have_tc, tokenizer_config.json
 * (its special tokens and chat template; without it the special ids come from config.json, as
 * llama.cpp's SpecialVocab does, and the GGUF carries no tokenizer.chat_template: lumen renders
 * Qwen3's template itself). */
static lm_status put_tokenizer(struct lm_gguf_writer *w, const char *tdir, bool have_tc,
                               const struct lm_model_config *cfg, const struct lm_hf_config *hf) {
    lm_status rc;
    json_t *tj = load_json(tdir, "tokenizer.json", &rc);
    if (!tj) return rc;
    json_t *tc = NULL; /* json_object_get(NULL, ...) is NULL: every lookup below takes it */
    if (have_tc && !(tc = load_json(tdir, "tokenizer_config.json", &rc))) {
        json_decref(tj);
        return rc;
    }
    char **tokens = NULL, **merges = NULL;
    size_t *tlen = NULL, *mlen = NULL, n_merges = 0;
    int32_t *types = NULL;
    const size_t n = (size_t)cfg->vocab_size;
    json_t *model = json_object_get(tj, "model"), *vocab = json_object_get(model, "vocab"),
           *jm = json_object_get(model, "merges"), *added = json_object_get(tj, "added_tokens");
    if (!json_is_object(model) || strcmp(json_string_value(json_object_get(model, "type")) ?
                                             json_string_value(json_object_get(model, "type")) : "", "BPE") ||
        !json_is_object(vocab) || !json_is_array(jm)) {
        rc = lm_errorf(LM_ERR_UNSUPPORTED, "tokenizer.json: model is not a BPE with a vocab and merges "
                       "(GGUF's \"gpt2\" tokenizer)");
        goto done;
    }
    /* The pre-tokenizer must be the one tokenizer.ggml.pre "qwen2" names, with NFC. */
    {
        char *pt = json_dumps(json_object_get(tj, "pre_tokenizer"), JSON_COMPACT);
        json_t *nz = json_object_get(tj, "normalizer");
        bool nfc = json_is_object(nz) && json_string_value(json_object_get(nz, "type")) &&
                   !strcmp(json_string_value(json_object_get(nz, "type")), "NFC");
        json_t *want = json_string(LM_TOKENIZER_REGEX_QWEN2);
        char *ws = json_dumps(want, JSON_ENCODE_ANY);
        bool qwen2 = pt && ws && strstr(pt, ws);
        free(pt);
        free(ws);
        json_decref(want);
        if (!qwen2 || !nfc) {
            rc = lm_errorf(LM_ERR_UNSUPPORTED,
                           "tokenizer.json: the normalizer and pre-tokenizer are not Qwen2's (NFC and "
                           "its Split regex), the only ones GGUF's tokenizer.ggml.pre \"qwen2\" names "
                           "that lumen writes");
            goto done;
        }
    }
    tokens = calloc(n, sizeof *tokens);
    tlen = calloc(n, sizeof *tlen);
    types = calloc(n, sizeof *types);
    n_merges = json_array_size(jm);
    merges = calloc(n_merges ? n_merges : 1, sizeof *merges);
    mlen = calloc(n_merges ? n_merges : 1, sizeof *mlen);
    if (!tokens || !tlen || !types || !merges || !mlen) abort();
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        json_int_t id = json_integer_value(val);
        if (!json_is_integer(val) || id < 0 || (size_t)id >= n) {
            rc = lm_errorf(LM_ERR_FORMAT, "tokenizer.json: model.vocab['%s'] is not an id below "
                           "vocab_size %zu", key, n);
            goto done;
        }
        if (!tokens[id]) tokens[id] = strdup(key), types[id] = TT_NORMAL;
    }
    size_t i;
    json_array_foreach(added, i, val) {
        json_t *c = json_object_get(val, "content");
        json_int_t id = json_integer_value(json_object_get(val, "id"));
        if (!json_is_string(c) || id < 0 || (size_t)id >= n) {
            rc = lm_errorf(LM_ERR_FORMAT, "tokenizer.json: added_tokens[%zu] has no content or an id "
                           "outside vocab_size %zu", i, n);
            goto done;
        }
        free(tokens[id]);
        tokens[id] = strdup(json_string_value(c));
        types[id] = json_is_true(json_object_get(val, "special")) || looks_special(tokens[id])
                        ? TT_CONTROL
                        : TT_USER_DEFINED;
    }
    for (size_t id = 0; id < n; id++) {
        if (!tokens[id]) {
            char pad[32];
            snprintf(pad, sizeof pad, "[PAD%zu]", id);
            tokens[id] = strdup(pad);
            types[id] = TT_UNUSED;
        }
        if (!tokens[id]) abort();
        tlen[id] = strlen(tokens[id]);
    }
    json_array_foreach(jm, i, val) {
        if (json_is_string(val)) {
            merges[i] = strdup(json_string_value(val));
        } else if (json_is_array(val) && json_array_size(val) == 2 &&
                   json_is_string(json_array_get(val, 0)) && json_is_string(json_array_get(val, 1))) {
            struct lm_buf b = {0};
            lm_buf_printf(&b, "%s %s", json_string_value(json_array_get(val, 0)),
                          json_string_value(json_array_get(val, 1)));
            merges[i] = lm_buf_take(&b);
        } else {
            rc = lm_errorf(LM_ERR_FORMAT, "tokenizer.json: model.merges[%zu] is not a string or a pair", i);
            goto done;
        }
        if (!merges[i]) abort();
        mlen[i] = strlen(merges[i]);
    }
    lm_gguf_put_str(w, "tokenizer.ggml.model", "gpt2", 4);
    lm_gguf_put_str(w, "tokenizer.ggml.pre", "qwen2", 5);
    lm_gguf_put_str_array(w, "tokenizer.ggml.tokens", (const char *const *)tokens, tlen, n);
    lm_gguf_put_i32_array(w, "tokenizer.ggml.token_type", types, n);
    lm_gguf_put_str_array(w, "tokenizer.ggml.merges", (const char *const *)merges, mlen, n_merges);
    /* Special ids as llama.cpp's SpecialVocab finds them: tokenizer_config.json's tokens, else
     * config.json's ids. */
    int64_t eos = special_id(tc, "eos_token", vocab, added), bos = special_id(tc, "bos_token", vocab, added),
            pad = special_id(tc, "pad_token", vocab, added);
    if (bos < 0) bos = cfg->bos_token_id;
    if (eos < 0) {
        int32_t ids[LM_MAX_EOS];
        int ne = 0;
        if (lm_hf_config_ids_opt(hf, "eos_token_id", ids, &ne, LM_MAX_EOS) == LM_OK && ne > 0) eos = ids[0];
    }
    if (eos >= 0) lm_gguf_put_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos);
    if (pad >= 0) lm_gguf_put_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)pad);
    if (bos >= 0) lm_gguf_put_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)bos);
    lm_gguf_put_bool(w, "tokenizer.ggml.add_bos_token",
                     json_is_true(json_object_get(tc, "add_bos_token")));
    json_t *tmpl = json_object_get(tc, "chat_template");
    if (json_is_string(tmpl))
        lm_gguf_put_str(w, "tokenizer.chat_template", json_string_value(tmpl), json_string_length(tmpl));
    rc = LM_OK;
done:
    for (size_t id = 0; tokens && id < n; id++) free(tokens[id]);
    for (size_t j = 0; merges && j < n_merges; j++) free(merges[j]);
    free(tokens);
    free(tlen);
    free(types);
    free(merges);
    free(mlen);
    json_decref(tj);
    json_decref(tc);
    return rc;
}

/* Converts `rows` rows of `cols` source elements (dtype src) to `dst` in GGUF type `type`. */
static void convert_rows(void *dst, uint32_t type, const void *src, enum lm_st_dtype sdt, long rows,
                         long cols, float *tmp) {
    const size_t ssz = lm_st_dtype_size(sdt);
    for (long r = 0; r < rows; r++) {
        const unsigned char *s = (const unsigned char *)src + (size_t)r * cols * ssz;
        if ((type == LM_GGML_BF16 && sdt == LM_ST_BF16) || (type == LM_GGML_F16 && sdt == LM_ST_F16) ||
            (type == LM_GGML_F32 && sdt == LM_ST_F32)) {
            memcpy((unsigned char *)dst + (size_t)r * cols * ssz, s, (size_t)cols * ssz);
            continue;
        }
        for (long c = 0; c < cols; c++) {
            if (sdt == LM_ST_F32) {
                memcpy(&tmp[c], s + 4 * c, 4);
            } else {
                uint16_t h;
                memcpy(&h, s + 2 * c, 2);
                tmp[c] = sdt == LM_ST_BF16 ? lm_bf16_to_f32(h) : lm_f16_to_f32(h);
            }
        }
        switch (type) {
        case LM_GGML_F32: memcpy((float *)dst + r * cols, tmp, sizeof(float) * (size_t)cols); break;
        case LM_GGML_F16:
            for (long c = 0; c < cols; c++) ((uint16_t *)dst)[r * cols + c] = lm_f32_to_f16(tmp[c]);
            break;
        case LM_GGML_BF16:
            for (long c = 0; c < cols; c++) ((uint16_t *)dst)[r * cols + c] = lm_f32_to_bf16(tmp[c]);
            break;
        case LM_GGML_Q8_0:
            lm_q8_0_quantize_row(tmp, (struct lm_block_q8_0 *)dst + r * (cols / LM_Q8_0_BLOCK), cols);
            break;
        default: assert(0);
        }
    }
}

lm_status lm_bundle_build(const char *dir, const char *out_path, const struct lm_bundle_build_params *p,
                          struct lm_bundle_build_stats *stats) {
    struct lm_bundle_build_stats st0 = {0};
    if (!stats) stats = &st0;
    memset(stats, 0, sizeof *stats);
    uint32_t mtype, ftype;
    switch (p->dtype) {
    case LM_DTYPE_F32: mtype = LM_GGML_F32, ftype = FT_ALL_F32; break;
    case LM_DTYPE_F16: mtype = LM_GGML_F16, ftype = FT_MOSTLY_F16; break;
    case LM_DTYPE_BF16: mtype = LM_GGML_BF16, ftype = FT_MOSTLY_BF16; break;
    case LM_DTYPE_Q8_0: mtype = LM_GGML_Q8_0, ftype = FT_MOSTLY_Q8_0; break;
    default: return lm_errorf(LM_ERR_INVALID, "unknown dtype");
    }
    if (!lm_dir_exists(dir)) return lm_errorf(LM_ERR_IO, "%s: not a folder", dir);
    const char *tdir = p->tokenizer_dir ? p->tokenizer_dir : dir;
    struct lm_hf_config hf = {0};
    struct lm_model_config cfg;
    struct lm_gen_defaults gen;
    struct lm_safetensors sts = {0};
    struct lm_gguf_writer w;
    lm_gguf_writer_init(&w, LM_GGUF_DEFAULT_ALIGNMENT);
    float *tmp = NULL;
    void *buf = NULL;
    lm_status rc = lm_hf_config_load(&hf, dir, "config.json");
    if (!rc) rc = lm_model_parse_config(&hf, &cfg);
    if (!rc) rc = lm_model_parse_generation(dir, &hf, &gen);
    if (!rc) rc = lm_st_open_dir(&sts, dir);
    if (rc) goto done;

    /* general.* and the architecture's hyperparameters */
    const char *arch = cfg.model_type;
    char key[160], *name = NULL;
    {
        const char *b = base_name(dir);
        size_t bl = strlen(b);
        while (bl > 1 && b[bl - 1] == '/') bl--;
        if (!bl) b = dir, bl = strlen(dir);
        name = strndup(b, bl);
        if (!name) abort();
    }
    lm_gguf_put_str(&w, "general.architecture", arch, strlen(arch));
    lm_gguf_put_str(&w, "general.type", "model", 5);
    lm_gguf_put_str(&w, "general.name", name, strlen(name));
    free(name);
#define ARCH_U32(suffix, v)                                                                      \
    do {                                                                                         \
        snprintf(key, sizeof key, "%s.%s", arch, suffix);                                        \
        lm_gguf_put_u32(&w, key, (uint32_t)(v));                                                 \
    } while (0)
    ARCH_U32("block_count", cfg.num_hidden_layers);
    ARCH_U32("context_length", cfg.max_position_embeddings);
    ARCH_U32("embedding_length", cfg.hidden_size);
    ARCH_U32("feed_forward_length", cfg.intermediate_size);
    ARCH_U32("attention.head_count", cfg.num_attention_heads);
    ARCH_U32("attention.head_count_kv", cfg.num_key_value_heads);
    snprintf(key, sizeof key, "%s.rope.freq_base", arch);
    lm_gguf_put_f32(&w, key, (float)cfg.rope_theta);
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
    lm_gguf_put_f32(&w, key, cfg.rms_norm_eps);
    ARCH_U32("attention.key_length", cfg.head_dim);
    ARCH_U32("attention.value_length", cfg.head_dim);
#undef ARCH_U32
    lm_gguf_put_u32(&w, "general.file_type", ftype);
    lm_gguf_put_u32(&w, "general.quantization_version", 2);
    char *tc_path = lm_path_join(tdir, "tokenizer_config.json");
    const bool have_tc = lm_file_exists(tc_path); /* optional: put_tokenizer */
    free(tc_path);
    if ((rc = put_tokenizer(&w, tdir, have_tc, &cfg, &hf))) goto done;
    if (gen.temperature >= 0) lm_gguf_put_f32(&w, "general.sampling.temp", gen.temperature);
    if (gen.top_p >= 0) lm_gguf_put_f32(&w, "general.sampling.top_p", gen.top_p);
    if (gen.top_k >= 0) lm_gguf_put_i32(&w, "general.sampling.top_k", gen.top_k);
    if (gen.n_eos) lm_gguf_put_i32_array(&w, "lumen.generation.eos_token_ids", gen.eos_token_ids, (size_t)gen.n_eos);
    lm_gguf_put_str(&w, "lumen.version", LM_VERSION, strlen(LM_VERSION));
    {
        const char *files[] = {"config.json", "generation_config.json", "model.safetensors.index.json"};
        for (int i = 0; i < 3; i++) {
            char *path = lm_path_join(dir, files[i]);
            if (lm_file_exists(path)) rc = put_sha256(&w, path);
            free(path);
            if (rc) goto done;
        }
        for (int i = 0; i < sts.n_files && !rc; i++) rc = put_sha256(&w, sts.files[i].path);
        const char *tfiles[] = {"tokenizer.json", "tokenizer_config.json"};
        for (int i = 0; i < (have_tc ? 2 : 1) && !rc; i++) {
            char *path = lm_path_join(tdir, tfiles[i]);
            rc = put_sha256(&w, path);
            free(path);
        }
        if (rc) goto done;
    }

    /* The tensor table: every tensor of the checkpoint under its llama.cpp name. */
    uint32_t *types = calloc(sts.n_tensors ? sts.n_tensors : 1, sizeof *types);
    if (!types) abort();
    long max_cols = 1;
    for (size_t i = 0; i < sts.n_tensors && !rc; i++) {
        const struct lm_st_tensor *t = &sts.tensors[i];
        char gname[160];
        if (!lm_gguf_name_from_hf(t->name, gname, sizeof gname)) {
            rc = lm_errorf(LM_ERR_UNSUPPORTED, "%s: tensor '%s' has no GGUF name lumen knows",
                           base_name(lm_st_tensor_path(&sts, t)), t->name);
            break;
        }
        if (t->dtype != LM_ST_F32 && t->dtype != LM_ST_F16 && t->dtype != LM_ST_BF16) {
            rc = lm_errorf(LM_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s (F32, F16 or BF16 needed)",
                           base_name(lm_st_tensor_path(&sts, t)), t->name, lm_st_dtype_name(t->dtype));
            break;
        }
        if (t->ndim < 1 || t->ndim > 2) {
            rc = lm_errorf(LM_ERR_UNSUPPORTED, "%s: tensor '%s' has %d dimensions (1 or 2 needed)",
                           base_name(lm_st_tensor_path(&sts, t)), t->name, t->ndim);
            break;
        }
        int64_t ne[2] = {t->shape[t->ndim - 1], t->ndim == 2 ? t->shape[0] : 1};
        uint32_t type = t->ndim == 1 ? LM_GGML_F32 : mtype;
        if (type == LM_GGML_Q8_0 && ne[0] % LM_Q8_0_BLOCK) {
            type = LM_GGML_F16;
            stats->n_fallback_f16++;
        }
        types[i] = type;
        if (ne[0] > max_cols) max_cols = ne[0];
        stats->data_bytes += lm_gguf_add_tensor(&w, gname, type, t->ndim, ne);
        stats->n_tensors++;
    }
    if (!rc) rc = lm_gguf_writer_begin(&w, out_path);
    /* Tensor data, converted in chunks of rows. */
    enum { CHUNK_BYTES = 8 << 20 };
    tmp = malloc(sizeof(float) * (size_t)max_cols);
    buf = malloc(CHUNK_BYTES + 64 * (size_t)max_cols);
    if (!tmp || !buf) abort();
    for (size_t i = 0; i < sts.n_tensors && !rc; i++) {
        const struct lm_st_tensor *t = &sts.tensors[i];
        long cols = (long)t->shape[t->ndim - 1], rows = t->ndim == 2 ? (long)t->shape[0] : 1;
        int be, bb;
        lm_ggml_type_block(types[i], &be, &bb);
        size_t row_out = (size_t)(cols / be) * (size_t)bb;
        long per = (long)(CHUNK_BYTES / (row_out ? row_out : 1));
        if (per < 1) per = 1;
        for (long r = 0; r < rows && !rc; r += per) {
            long nr = rows - r < per ? rows - r : per;
            convert_rows(buf, types[i], (const unsigned char *)t->data + (size_t)r * cols * lm_st_dtype_size(t->dtype),
                         t->dtype, nr, cols, tmp);
            rc = lm_gguf_writer_tensor(&w, buf, (size_t)nr * row_out);
        }
    }
    free(types);
    if (!rc) rc = lm_gguf_writer_finish(&w);
done:
    free(tmp);
    free(buf);
    lm_gguf_writer_free(&w);
    lm_st_close(&sts);
    lm_hf_config_free(&hf);
    return rc;
}
