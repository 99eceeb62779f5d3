/* tokenizer_json.c: lm_tokenizer_load, reading HF tokenizer.json (the serde format of
 * `tokenizers`) into struct lm_tokenizer_parts for lm_tokenizer_create. Anything that would
 * change the ids and is not implemented is refused with LM_ERR_UNSUPPORTED naming the field,
 * never silently ignored. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "text/tokenizer.h"

#define MAX_REGEXES 8

struct loader {
    const char *path;
    const char *regexes[MAX_REGEXES];
    char *owned_regexes[MAX_REGEXES]; /* quoted String patterns */
    size_t n_regexes;
    bool byte_level; /* a ByteLevel pre-tokenizer step was seen */
    bool nfc;
};

static lm_status bad(lm_status st, const struct loader *L, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static lm_status bad(lm_status st, const struct loader *L, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return lm_errorf(st, "%s: %s", L->path, msg);
}

/* A boolean field that is absent, null, or `want` (anything else is refused). */
static lm_status expect_bool(const struct loader *L, json_t *obj, const char *key, bool want,
                             const char *field) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return LM_OK;
    if (!json_is_boolean(v)) return bad(LM_ERR_FORMAT, L, "%s.%s is not a boolean", field, key);
    if (json_is_true(v) != want)
        return bad(LM_ERR_UNSUPPORTED, L, "%s.%s = %s is not supported", field, key,
                   json_is_true(v) ? "true" : "false");
    return LM_OK;
}

/* A boolean field with a default; LM_ERR_FORMAT when present and not a boolean. */
static lm_status get_bool(const struct loader *L, json_t *obj, const char *key, bool dflt,
                          const char *field, bool *out) {
    json_t *v = json_object_get(obj, key);
    *out = dflt;
    if (!v || json_is_null(v)) return LM_OK;
    if (!json_is_boolean(v)) return bad(LM_ERR_FORMAT, L, "%s.%s is not a boolean", field, key);
    *out = json_is_true(v);
    return LM_OK;
}

static const char *type_of(json_t *obj) {
    json_t *t = json_object_get(obj, "type");
    return json_is_string(t) ? json_string_value(t) : NULL;
}

static lm_status load_normalizer(struct loader *L, json_t *n) {
    if (!n || json_is_null(n)) return LM_OK;
    if (!json_is_object(n)) return bad(LM_ERR_FORMAT, L, "normalizer is not an object");
    const char *type = type_of(n);
    if (!type) return bad(LM_ERR_FORMAT, L, "normalizer.type is missing");
    if (!strcmp(type, "NFC")) {
        L->nfc = true;
        return LM_OK;
    }
    if (strcmp(type, "Sequence"))
        return bad(LM_ERR_UNSUPPORTED, L,
                   "normalizer.type %s is not supported (null, NFC, or a Sequence of NFC)", type);
    json_t *arr = json_object_get(n, "normalizers");
    if (!json_is_array(arr)) return bad(LM_ERR_FORMAT, L, "normalizer.normalizers is not an array");
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v) {
        if (!json_is_object(v))
            return bad(LM_ERR_FORMAT, L, "normalizer.normalizers[%zu] is not an object", i);
        const char *t = type_of(v);
        if (!t || strcmp(t, "NFC"))
            return bad(LM_ERR_UNSUPPORTED, L,
                       "normalizer.normalizers[%zu].type %s is not supported (only NFC)", i,
                       t ? t : "(missing)");
        L->nfc = true;
    }
    return LM_OK;
}

static lm_status add_regex(struct loader *L, const char *field, const char *re, char *owned) {
    if (L->n_regexes == MAX_REGEXES) {
        free(owned);
        return bad(LM_ERR_UNSUPPORTED, L, "%s: more than %d Split steps", field, MAX_REGEXES);
    }
    L->owned_regexes[L->n_regexes] = owned;
    L->regexes[L->n_regexes++] = re;
    return LM_OK;
}

static lm_status load_pretok_step(struct loader *L, json_t *p, const char *field) {
    if (!json_is_object(p)) return bad(LM_ERR_FORMAT, L, "%s is not an object", field);
    const char *type = type_of(p);
    if (!type) return bad(LM_ERR_FORMAT, L, "%s.type is missing", field);
    lm_status st;
    if (!strcmp(type, "Split")) {
        if (L->byte_level)
            return bad(LM_ERR_UNSUPPORTED, L,
                       "%s: a Split after the ByteLevel step is not supported", field);
        json_t *pat = json_object_get(p, "pattern");
        json_t *re = json_object_get(pat, "Regex"), *str = json_object_get(pat, "String");
        if (!json_is_object(pat) || (!json_is_string(re) && !json_is_string(str)))
            return bad(LM_ERR_FORMAT, L,
                       "%s.pattern is not {\"Regex\": string} or {\"String\": string}", field);
        json_t *beh = json_object_get(p, "behavior");
        if (!json_is_string(beh))
            return bad(LM_ERR_FORMAT, L, "%s.behavior is not a string", field);
        if (strcmp(json_string_value(beh), "Isolated"))
            return bad(LM_ERR_UNSUPPORTED, L, "%s.behavior %s is not supported (only Isolated)",
                       field, json_string_value(beh));
        if ((st = expect_bool(L, p, "invert", false, field))) return st;
        if (json_is_string(re)) return add_regex(L, field, json_string_value(re), NULL);
        const char *s = json_string_value(str); /* a literal: quote it for PCRE2 */
        if (strstr(s, "\\E"))
            return bad(LM_ERR_UNSUPPORTED, L, "%s.pattern.String contains \\E", field);
        size_t n = strlen(s);
        char *q = malloc(n + 5);
        if (!q) return bad(LM_ERR_NOMEM, L, "out of memory");
        memcpy(q, "\\Q", 2);
        memcpy(q + 2, s, n);
        memcpy(q + 2 + n, "\\E", 3);
        return add_regex(L, field, q, q);
    }
    if (!strcmp(type, "ByteLevel")) {
        if (L->byte_level) return bad(LM_ERR_UNSUPPORTED, L, "%s: a second ByteLevel step", field);
        if ((st = expect_bool(L, p, "add_prefix_space", false, field))) return st;
        bool use_regex;
        if ((st = get_bool(L, p, "use_regex", true, field, &use_regex))) return st;
        if (use_regex && (st = add_regex(L, field, LM_TOKENIZER_REGEX_GPT2, NULL))) return st;
        L->byte_level = true;
        return LM_OK;
    }
    return bad(LM_ERR_UNSUPPORTED, L,
               "%s.type %s is not supported (Split, ByteLevel, or a Sequence of them)", field,
               type);
}

static lm_status load_pretok(struct loader *L, json_t *p) {
    if (!p || json_is_null(p))
        return bad(LM_ERR_UNSUPPORTED, L,
                   "pre_tokenizer is null (a ByteLevel pre-tokenizer is required)");
    if (!json_is_object(p)) return bad(LM_ERR_FORMAT, L, "pre_tokenizer is not an object");
    const char *type = type_of(p);
    lm_status st;
    if (type && !strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(p, "pretokenizers");
        if (!json_is_array(arr))
            return bad(LM_ERR_FORMAT, L, "pre_tokenizer.pretokenizers is not an array");
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) {
            char sub[64];
            snprintf(sub, sizeof sub, "pre_tokenizer.pretokenizers[%zu]", i);
            if ((st = load_pretok_step(L, v, sub))) return st;
        }
    } else if ((st = load_pretok_step(L, p, "pre_tokenizer"))) {
        return st;
    }
    if (!L->byte_level)
        return bad(LM_ERR_UNSUPPORTED, L,
                   "pre_tokenizer has no ByteLevel step (only byte-level BPE is supported)");
    return LM_OK;
}

static lm_status check_byte_level(const struct loader *L, json_t *d, const char *field,
                                  bool null_ok) {
    if (!d || json_is_null(d)) {
        if (null_ok) return LM_OK;
        return bad(LM_ERR_UNSUPPORTED, L, "%s is null (ByteLevel is required)", field);
    }
    if (!json_is_object(d)) return bad(LM_ERR_FORMAT, L, "%s is not an object", field);
    const char *type = type_of(d);
    if (!type || strcmp(type, "ByteLevel"))
        return bad(LM_ERR_UNSUPPORTED, L, "%s.type %s is not supported (only ByteLevel)", field,
                   type ? type : "(missing)");
    return LM_OK;
}

static lm_status check_model_options(const struct loader *L, json_t *m,
                                     struct lm_tokenizer_parts *P) {
    const char *type = type_of(m);
    if (type && strcmp(type, "BPE"))
        return bad(LM_ERR_UNSUPPORTED, L, "model.type %s is not supported (only BPE)", type);
    json_t *v = json_object_get(m, "dropout");
    if (v && !json_is_null(v) && !(json_is_number(v) && json_number_value(v) == 0.0))
        return bad(LM_ERR_UNSUPPORTED, L, "model.dropout is not supported (must be null)");
    static const char *const affix[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        v = json_object_get(m, affix[i]);
        if (v && !json_is_null(v) && !(json_is_string(v) && !*json_string_value(v)))
            return bad(LM_ERR_UNSUPPORTED, L, "model.%s is not supported (must be null or \"\")",
                       affix[i]);
    }
    lm_status st;
    if ((st = expect_bool(L, m, "byte_fallback", false, "model"))) return st;
    if ((st = get_bool(L, m, "ignore_merges", false, "model", &P->ignore_merges))) return st;
    if ((st = get_bool(L, m, "fuse_unk", false, "model", &P->fuse_unk))) return st;
    return LM_OK;
}

lm_status lm_tokenizer_load(const char *path, struct lm_tokenizer **out) {
    *out = NULL;
    json_t *root = NULL;
    lm_status st = lm_json_load_file(path, &root);
    if (st) return st;
    struct loader L = {.path = path};
    struct lm_tokenizer_parts P = {
        .source = path, .tokens_field = "model.vocab", .merges_field = "model.merges"};
    const char **tokens = NULL, **merges = NULL;
    uint8_t *kinds = NULL, *flags = NULL;

    if (!json_is_object(root)) {
        st = bad(LM_ERR_FORMAT, &L, "the top level is not an object");
        goto done;
    }
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) {
        st = bad(LM_ERR_FORMAT, &L, "model is missing or not an object");
        goto done;
    }
    if ((st = check_model_options(&L, model, &P))) goto done;
    json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab)) {
        st = bad(LM_ERR_FORMAT, &L, "model.vocab is missing or not an object");
        goto done;
    }
    json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_null(added) && !json_is_array(added)) {
        st = bad(LM_ERR_FORMAT, &L, "added_tokens is not an array");
        goto done;
    }

    /* Ids: the vocabulary and the added tokens together; max id + 1 of them. */
    size_t n = 0;
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= INT32_MAX) {
            st = bad(LM_ERR_FORMAT, &L, "model.vocab[\"%s\"] is not a token id", key);
            goto done;
        }
        if ((size_t)json_integer_value(v) + 1 > n) n = (size_t)json_integer_value(v) + 1;
    }
    size_t i;
    json_array_foreach(added, i, v) {
        json_t *id = json_object_get(v, "id"), *content = json_object_get(v, "content");
        if (!json_is_object(v) || !json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= INT32_MAX || !json_is_string(content)) {
            st = bad(LM_ERR_FORMAT, &L,
                     "added_tokens[%zu] is not an object with an id and a content", i);
            goto done;
        }
        if ((size_t)json_integer_value(id) + 1 > n) n = (size_t)json_integer_value(id) + 1;
    }
    if (!n) {
        st = bad(LM_ERR_FORMAT, &L, "model.vocab is empty");
        goto done;
    }
    tokens = calloc(n, sizeof *tokens);
    kinds = calloc(n, 1);
    flags = calloc(n, 1);
    if (!tokens || !kinds || !flags) {
        st = bad(LM_ERR_NOMEM, &L, "out of memory for %zu tokens", n);
        goto done;
    }
    json_object_foreach(vocab, key, v) {
        size_t id = (size_t)json_integer_value(v);
        if (tokens[id]) {
            st = bad(LM_ERR_FORMAT, &L, "model.vocab[\"%s\"]: id %zu is also \"%s\"", key, id,
                     tokens[id]);
            goto done;
        }
        tokens[id] = key;
    }
    json_array_foreach(added, i, v) {
        size_t id = (size_t)json_integer_value(json_object_get(v, "id"));
        char field[48];
        snprintf(field, sizeof field, "added_tokens[%zu]", i);
        bool special, lstrip, rstrip, single_word, normalized;
        if ((st = get_bool(&L, v, "special", false, field, &special)) ||
            (st = get_bool(&L, v, "lstrip", false, field, &lstrip)) ||
            (st = get_bool(&L, v, "rstrip", false, field, &rstrip)) ||
            (st = get_bool(&L, v, "single_word", false, field, &single_word)) ||
            (st = get_bool(&L, v, "normalized", !special, field, &normalized)))
            goto done;
        /* An added token replaces a vocabulary entry of the same id (HF looks added tokens up
         * first when decoding). */
        tokens[id] = json_string_value(json_object_get(v, "content"));
        kinds[id] = special ? LM_TOKEN_SPECIAL : LM_TOKEN_ADDED;
        flags[id] = (uint8_t)((lstrip ? LM_ADDED_LSTRIP : 0) | (rstrip ? LM_ADDED_RSTRIP : 0) |
                              (single_word ? LM_ADDED_SINGLE_WORD : 0) |
                              (normalized ? LM_ADDED_NORMALIZED : 0));
    }
    for (size_t k = 0; k < n; k++)
        if (!tokens[k]) kinds[k] = LM_TOKEN_UNUSED;

    /* Merges: all "a b" strings, or all [a, b] pairs (tokenizers >= 0.20 writes pairs). */
    json_t *jm = json_object_get(model, "merges");
    if (!json_is_array(jm)) {
        st = bad(LM_ERR_FORMAT, &L, "model.merges is missing or not an array");
        goto done;
    }
    size_t nm = json_array_size(jm);
    bool as_pairs = nm && json_is_array(json_array_get(jm, 0));
    merges = calloc(as_pairs ? 2 * nm + 1 : nm + 1, sizeof *merges);
    if (!merges) {
        st = bad(LM_ERR_NOMEM, &L, "out of memory for %zu merges", nm);
        goto done;
    }
    json_array_foreach(jm, i, v) {
        if (as_pairs) {
            json_t *a = json_array_get(v, 0), *b = json_array_get(v, 1);
            if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_string(a) ||
                !json_is_string(b)) {
                st = bad(LM_ERR_FORMAT, &L, "model.merges[%zu] is not a pair of strings", i);
                goto done;
            }
            merges[2 * i] = json_string_value(a);
            merges[2 * i + 1] = json_string_value(b);
        } else {
            if (!json_is_string(v)) {
                st = bad(LM_ERR_FORMAT, &L, "model.merges[%zu] is not a string \"a b\"", i);
                goto done;
            }
            merges[i] = json_string_value(v);
        }
    }

    json_t *unk = json_object_get(model, "unk_token");
    if (unk && !json_is_null(unk)) {
        if (!json_is_string(unk)) {
            st = bad(LM_ERR_FORMAT, &L, "model.unk_token is not a string");
            goto done;
        }
        P.unk_token = json_string_value(unk);
    }

    if ((st = load_normalizer(&L, json_object_get(root, "normalizer"))) ||
        (st = load_pretok(&L, json_object_get(root, "pre_tokenizer"))) ||
        (st = check_byte_level(&L, json_object_get(root, "decoder"), "decoder", false)) ||
        (st =
             check_byte_level(&L, json_object_get(root, "post_processor"), "post_processor", true)))
        goto done;

    P.n_tokens = n;
    P.tokens = tokens;
    P.kinds = kinds;
    P.added_flags = flags;
    P.n_merges = nm;
    if (as_pairs)
        P.merge_pairs = merges;
    else
        P.merges = merges;
    P.nfc = L.nfc;
    P.n_split_regexes = L.n_regexes;
    P.split_regexes = L.regexes;
    st = lm_tokenizer_create(&P, out);

done:
    for (size_t k = 0; k < L.n_regexes; k++)
        free(L.owned_regexes[k]);
    free(tokens);
    free(merges);
    free(kinds);
    free(flags);
    json_decref(root);
    return st;
}
