/* spec.c: see spec.h. */
#include "engine/spec.h"

#include <assert.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

lm_status lm_spec_check(const struct lm_spec_params *p) {
    if (p->num_speculative_tokens < 0 || p->num_speculative_tokens > LM_SPEC_MAX_TOKENS)
        return lm_errorf(LM_ERR_INVALID, "speculative config: num_speculative_tokens: %d is not in 0..%d",
                         p->num_speculative_tokens, LM_SPEC_MAX_TOKENS);
    if (p->disable_by_batch_size < 0)
        return lm_errorf(LM_ERR_INVALID, "speculative config: disable_by_batch_size: %d is negative",
                         p->disable_by_batch_size);
    if (p->num_speculative_tokens == 0) return LM_OK;
    if (p->prompt_lookup_min < 1 || p->prompt_lookup_min > 64)
        return lm_errorf(LM_ERR_INVALID, "speculative config: prompt_lookup_min: %d is not in 1..64",
                         p->prompt_lookup_min);
    if (p->prompt_lookup_max < p->prompt_lookup_min || p->prompt_lookup_max > 64)
        return lm_errorf(LM_ERR_INVALID,
                         "speculative config: prompt_lookup_max: %d is not in prompt_lookup_min "
                         "(%d)..64",
                         p->prompt_lookup_max, p->prompt_lookup_min);
    return LM_OK;
}

/* An integer member of o into *v; *present says whether it was there (null counts as absent). */
static lm_status int_key(json_t *o, const char *key, int *v, bool *present) {
    json_t *x = json_object_get(o, key);
    *present = x != NULL && !json_is_null(x); /* null: unset, as vLLM's None */
    if (!*present) return LM_OK;
    if (!json_is_integer(x) || json_integer_value(x) < -1000000 || json_integer_value(x) > 1000000)
        return lm_errorf(LM_ERR_INVALID, "speculative config: %s must be an integer", key);
    *v = (int)json_integer_value(x);
    return LM_OK;
}

lm_status lm_spec_parse(const char *json, struct lm_spec_params *out) {
    memset(out, 0, sizeof *out);
    json_error_t err;
    json_t *o = json_loads(json, JSON_REJECT_DUPLICATES, &err);
    if (!o || !json_is_object(o)) {
        lm_status rc = o ? lm_errorf(LM_ERR_INVALID, "speculative config: not a JSON object")
                         : lm_errorf(LM_ERR_INVALID, "speculative config: bad JSON at column %d: %s",
                                     err.column, err.text);
        json_decref(o);
        return rc;
    }
    lm_status rc = LM_OK;
    const char *key;
    json_t *val;
    json_object_foreach(o, key, val) {
        if (!strcmp(key, "method")) {
            if (!json_is_null(val) && (!json_is_string(val) || strcmp(json_string_value(val), "ngram"))) {
                rc = lm_errorf(LM_ERR_INVALID,
                               "speculative config: method must be \"ngram\" (n-gram prompt "
                               "lookup; lumen has no draft-model method)");
                break;
            }
        } else if (strcmp(key, "num_speculative_tokens") && strcmp(key, "prompt_lookup_max") &&
                   strcmp(key, "prompt_lookup_min") && strcmp(key, "disable_by_batch_size")) {
            rc = lm_errorf(LM_ERR_INVALID,
                           "speculative config: unknown key \"%s\" (known: method, "
                           "num_speculative_tokens, prompt_lookup_max, prompt_lookup_min, "
                           "disable_by_batch_size)",
                           key);
            break;
        }
    }
    /* vLLM's rules: the method is required without a draft model (lumen has none), and
     * num_speculative_tokens is a positive integer (0 would be "off": leave the option out). */
    json_t *method = json_object_get(o, "method");
    if (!rc && (!method || json_is_null(method)))
        rc = lm_errorf(LM_ERR_INVALID, "speculative config: method is required (\"ngram\")");
    bool has_n = false, has_max = false, has_min = false;
    if (!rc) rc = int_key(o, "num_speculative_tokens", &out->num_speculative_tokens, &has_n);
    if (!rc && !has_n)
        rc = lm_errorf(LM_ERR_INVALID, "speculative config: num_speculative_tokens is required");
    if (!rc && (out->num_speculative_tokens < 1 || out->num_speculative_tokens > LM_SPEC_MAX_TOKENS))
        rc = lm_errorf(LM_ERR_INVALID, "speculative config: num_speculative_tokens: %d is not in 1..%d",
                       out->num_speculative_tokens, LM_SPEC_MAX_TOKENS);
    if (!rc) rc = int_key(o, "prompt_lookup_max", &out->prompt_lookup_max, &has_max);
    if (!rc && has_max && (out->prompt_lookup_max < 1 || out->prompt_lookup_max > 64))
        rc = lm_errorf(LM_ERR_INVALID, "speculative config: prompt_lookup_max: %d is not in 1..64",
                       out->prompt_lookup_max);
    if (!rc) rc = int_key(o, "prompt_lookup_min", &out->prompt_lookup_min, &has_min);
    bool has_dis;
    if (!rc) rc = int_key(o, "disable_by_batch_size", &out->disable_by_batch_size, &has_dis);
    json_decref(o);
    if (rc) return rc;
    if (!has_max && !has_min)
        out->prompt_lookup_max = out->prompt_lookup_min = LM_SPEC_DEFAULT_LOOKUP;
    else if (!has_min)
        out->prompt_lookup_min = out->prompt_lookup_max;
    else if (!has_max)
        out->prompt_lookup_max = out->prompt_lookup_min;
    return lm_spec_check(out);
}

/* The draft after a match ending at position e (tokens[e + 1 ..]). */
static int copy_draft(const int32_t *tokens, int n, int e, int max_draft, int32_t *draft) {
    int k = 0;
    while (k < max_draft && e + 1 + k < n) {
        draft[k] = tokens[e + 1 + k];
        k++;
    }
    return k;
}

/* How many tokens before and at e equal those before and at n - 1, up to cap. */
static int match_len(const int32_t *tokens, int n, int e, int cap) {
    int len = 0;
    while (len < cap && e - len >= 0 && tokens[e - len] == tokens[n - 1 - len])
        len++;
    return len;
}

static int draft_cap(const struct lm_spec_params *p, int max_draft) {
    if (max_draft > p->num_speculative_tokens) max_draft = p->num_speculative_tokens;
    return max_draft > LM_SPEC_MAX_TOKENS ? LM_SPEC_MAX_TOKENS : max_draft;
}

static uint32_t slot_of(int32_t v, int hcap) {
    return ((uint32_t)v * 2654435761u) & (uint32_t)(hcap - 1);
}

/* The slot of value v in x's table: where it is, or the empty slot where it would go. */
static uint32_t slot_find(const struct lm_spec_index *x, int32_t v) {
    uint32_t h = slot_of(v, x->hcap);
    while (x->key[h] >= 0 && x->key[h] != v)
        h = (h + 1) & (uint32_t)(x->hcap - 1);
    return h;
}

static lm_status rehash(struct lm_spec_index *x, int hcap) {
    int32_t *key = malloc(sizeof *key * (size_t)hcap), *first = malloc(sizeof *first * (size_t)hcap),
            *last = malloc(sizeof *last * (size_t)hcap);
    if (!key || !first || !last) {
        free(key);
        free(first);
        free(last);
        return lm_errorf(LM_ERR_NOMEM, "speculative index: out of memory");
    }
    for (int i = 0; i < hcap; i++)
        key[i] = -1;
    for (int i = 0; i < x->hcap; i++) {
        if (x->key[i] < 0) continue;
        uint32_t h = slot_of(x->key[i], hcap);
        while (key[h] >= 0)
            h = (h + 1) & (uint32_t)(hcap - 1);
        key[h] = x->key[i];
        first[h] = x->first[i];
        last[h] = x->last[i];
    }
    free(x->key);
    free(x->first);
    free(x->last);
    x->key = key;
    x->first = first;
    x->last = last;
    x->hcap = hcap;
    return LM_OK;
}

lm_status lm_spec_index_extend(struct lm_spec_index *x, const int32_t *tokens, int n) {
    if (n <= x->n) return LM_OK;
    if (n > x->cap) {
        int cap = x->cap ? x->cap : 256;
        while (cap < n)
            cap *= 2;
        int32_t *next = realloc(x->next, sizeof *next * (size_t)cap);
        if (!next) return lm_errorf(LM_ERR_NOMEM, "speculative index: out of memory");
        x->next = next;
        x->cap = cap;
    }
    for (int i = x->n; i < n; i++) {
        if (2 * (x->hn + 1) > x->hcap) {
            lm_status rc = rehash(x, x->hcap ? 2 * x->hcap : 256);
            if (rc) {
                x->n = i; /* positions before i are indexed; a later call goes on from i */
                return rc;
            }
        }
        const int32_t v = tokens[i];
        assert(v >= 0); /* vocabulary ids; -1 marks an empty slot */
        const uint32_t h = slot_find(x, v);
        if (x->key[h] < 0) {
            x->key[h] = v;
            x->hn++;
            x->first[h] = i;
        } else {
            x->next[x->last[h]] = i;
        }
        x->next[i] = -1;
        x->last[h] = i;
    }
    x->n = n;
    return LM_OK;
}

void lm_spec_index_free(struct lm_spec_index *x) {
    free(x->next);
    free(x->key);
    free(x->first);
    free(x->last);
    memset(x, 0, sizeof *x);
}

/* Visits the candidate ends e (the earlier occurrences of tokens[n - 1]) earliest first and keeps
 * the first with the longest match, stopping at one of the longest size possible: the earliest
 * start of the largest matching n-gram size, as spec.h words it (and vLLM's
 * _find_longest_matched_ngram_and_propose_tokens chooses). In a repeating text the earliest
 * match has the most tokens after it, and it is found at once. */
int lm_spec_propose_indexed(const struct lm_spec_params *p, const struct lm_spec_index *x,
                            const int32_t *tokens, int n, int max_draft, int32_t *draft) {
    max_draft = draft_cap(p, max_draft);
    if (p->num_speculative_tokens <= 0 || max_draft <= 0 || n < 2 || x->n != n) return 0;
    const int cap = p->prompt_lookup_max < n - 1 ? p->prompt_lookup_max : n - 1;
    int best = 0, best_e = -1;
    /* tokens[n - 1] is indexed, so its value has a slot; its own position ends the chain */
    for (int e = x->first[slot_find(x, tokens[n - 1])]; e != n - 1 && best < cap; e = x->next[e]) {
        int len = match_len(tokens, n, e, cap);
        if (len > best) best = len, best_e = e;
    }
    if (best < p->prompt_lookup_min) return 0;
    return copy_draft(tokens, n, best_e, max_draft, draft);
}
