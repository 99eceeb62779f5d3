/* spec.c: see spec.h. */
#include "engine/spec.h"

#include <jansson.h>
#include <string.h>

lm_status lm_spec_check(const struct lm_spec_params *p) {
    if (p->num_speculative_tokens < 0 || p->num_speculative_tokens > LM_SPEC_MAX_TOKENS)
        return lm_errorf(LM_ERR_INVALID, "num_speculative_tokens: %d is not in 0..%d",
                         p->num_speculative_tokens, LM_SPEC_MAX_TOKENS);
    if (p->num_speculative_tokens == 0) return LM_OK;
    if (p->prompt_lookup_min < 1 || p->prompt_lookup_min > 64)
        return lm_errorf(LM_ERR_INVALID, "prompt_lookup_min: %d is not in 1..64",
                         p->prompt_lookup_min);
    if (p->prompt_lookup_max < p->prompt_lookup_min || p->prompt_lookup_max > 64)
        return lm_errorf(LM_ERR_INVALID, "prompt_lookup_max: %d is not in prompt_lookup_min (%d)..64",
                         p->prompt_lookup_max, p->prompt_lookup_min);
    return LM_OK;
}

/* An integer member of o: LM_OK with *v set, or unchanged when absent. */
static lm_status int_key(json_t *o, const char *key, int *v) {
    json_t *x = json_object_get(o, key);
    if (!x) return LM_OK;
    if (!json_is_integer(x) || json_integer_value(x) < -1000000 || json_integer_value(x) > 1000000)
        return lm_errorf(LM_ERR_INVALID, "speculative config: %s must be an integer", key);
    *v = (int)json_integer_value(x);
    return LM_OK;
}

lm_status lm_spec_parse(const char *json, struct lm_spec_params *out) {
    memset(out, 0, sizeof *out);
    json_error_t err;
    json_t *o = json_loads(json, 0, &err);
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
            if (!json_is_string(val) || strcmp(json_string_value(val), "ngram")) {
                rc = lm_errorf(LM_ERR_INVALID,
                               "speculative config: method must be \"ngram\" (n-gram prompt "
                               "lookup; lumen has no draft-model method)");
                break;
            }
        } else if (strcmp(key, "num_speculative_tokens") && strcmp(key, "prompt_lookup_max") &&
                   strcmp(key, "prompt_lookup_min")) {
            rc = lm_errorf(LM_ERR_INVALID,
                           "speculative config: unknown key \"%s\" (known: method, "
                           "num_speculative_tokens, prompt_lookup_max, prompt_lookup_min)",
                           key);
            break;
        }
    }
    out->prompt_lookup_max = -1;
    out->prompt_lookup_min = -1;
    if (!rc) rc = int_key(o, "num_speculative_tokens", &out->num_speculative_tokens);
    if (!rc && !json_object_get(o, "num_speculative_tokens"))
        rc = lm_errorf(LM_ERR_INVALID, "speculative config: num_speculative_tokens is required");
    if (!rc) rc = int_key(o, "prompt_lookup_max", &out->prompt_lookup_max);
    if (!rc) rc = int_key(o, "prompt_lookup_min", &out->prompt_lookup_min);
    json_decref(o);
    if (rc) return rc;
    /* A lone bound pulls the other default along so that min <= max stays true. */
    if (out->prompt_lookup_min < 0)
        out->prompt_lookup_min = out->prompt_lookup_max >= 1 &&
                                         out->prompt_lookup_max < LM_SPEC_DEFAULT_LOOKUP_MIN
                                     ? out->prompt_lookup_max
                                     : LM_SPEC_DEFAULT_LOOKUP_MIN;
    if (out->prompt_lookup_max < 0)
        out->prompt_lookup_max = out->prompt_lookup_min > LM_SPEC_DEFAULT_LOOKUP_MAX
                                     ? out->prompt_lookup_min
                                     : LM_SPEC_DEFAULT_LOOKUP_MAX;
    return lm_spec_check(out);
}

int lm_spec_propose(const struct lm_spec_params *p, const int32_t *tokens, int n, int max_draft,
                    int32_t *draft) {
    if (max_draft > p->num_speculative_tokens) max_draft = p->num_speculative_tokens;
    if (max_draft > LM_SPEC_MAX_TOKENS) max_draft = LM_SPEC_MAX_TOKENS;
    if (p->num_speculative_tokens <= 0 || max_draft <= 0) return 0;
    for (int g = p->prompt_lookup_max; g >= p->prompt_lookup_min; g--) {
        if (g >= n) continue;
        const int32_t *suffix = tokens + n - g;
        /* The latest earlier start first: recent context predicts best (a loop, the last turn). */
        for (int j = n - g - 1; j >= 0; j--) {
            if (tokens[j] != suffix[0] || memcmp(tokens + j, suffix, sizeof *tokens * (size_t)g))
                continue;
            int k = 0;
            while (k < max_draft && j + g + k < n) {
                draft[k] = tokens[j + g + k];
                k++;
            }
            return k;
        }
    }
    return 0;
}
