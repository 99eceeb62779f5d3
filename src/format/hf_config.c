/* hf_config.c: see hf_config.h. */
#include "format/hf_config.h"

#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"

lm_status lm_hf_config_load(struct lm_hf_config *c, const char *dir, const char *name) {
    memset(c, 0, sizeof *c);
    char *path = lm_path_join(dir, name);
    if (!lm_file_exists(path)) {
        lm_status rc = lm_errorf(LM_ERR_MISSING, "%s: file not found", path);
        free(path);
        return rc;
    }
    json_t *root;
    lm_status rc = lm_json_load_file(path, &root);
    free(path);
    if (rc) return rc;
    if (!json_is_object(root)) {
        json_decref(root);
        return lm_errorf(LM_ERR_FORMAT, "%s: not a JSON object", name);
    }
    c->root = root;
    c->name = strdup(name);
    if (!c->name) abort();
    return LM_OK;
}

void lm_hf_config_free(struct lm_hf_config *c) {
    if (!c) return;
    json_decref(c->root);
    free(c->name);
    memset(c, 0, sizeof *c);
}

json_t *lm_hf_config_get(const struct lm_hf_config *c, const char *key) {
    json_t *v = c->root;
    const char *p = key;
    for (;;) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        if (!json_is_object(v)) return NULL;
        v = json_object_getn(v, p, n);
        if (!v || json_is_null(v)) return NULL;
        if (!dot) return v;
        p = dot + 1;
    }
}

static lm_status get_int(const struct lm_hf_config *c, const char *key, long lo, long hi, int *out,
                         bool required) {
    json_t *v = lm_hf_config_get(c, key);
    if (!v) return required ? lm_errorf(LM_ERR_MISSING, "%s: missing key '%s'", c->name, key) : LM_OK;
    if (!json_is_integer(v)) return lm_errorf(LM_ERR_FORMAT, "%s: '%s' is not an integer", c->name, key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return lm_errorf(LM_ERR_FORMAT, "%s: '%s' = %lld is outside [%ld, %ld]", c->name, key,
                         (long long)x, lo, hi);
    *out = (int)x;
    return LM_OK;
}

lm_status lm_hf_config_int(const struct lm_hf_config *c, const char *key, long lo, long hi,
                           int *out) {
    return get_int(c, key, lo, hi, out, true);
}

lm_status lm_hf_config_int_opt(const struct lm_hf_config *c, const char *key, long lo, long hi,
                               int *out) {
    return get_int(c, key, lo, hi, out, false);
}

lm_status lm_hf_config_number_opt(const struct lm_hf_config *c, const char *key, double *out) {
    json_t *v = lm_hf_config_get(c, key);
    if (!v) return LM_OK;
    if (!json_is_number(v)) return lm_errorf(LM_ERR_FORMAT, "%s: '%s' is not a number", c->name, key);
    *out = json_number_value(v);
    return LM_OK;
}

lm_status lm_hf_config_bool_opt(const struct lm_hf_config *c, const char *key, bool *out) {
    json_t *v = lm_hf_config_get(c, key);
    if (!v) return LM_OK;
    if (!json_is_boolean(v)) return lm_errorf(LM_ERR_FORMAT, "%s: '%s' is not true or false", c->name, key);
    *out = json_is_true(v);
    return LM_OK;
}

lm_status lm_hf_config_string_opt(const struct lm_hf_config *c, const char *key, char *out,
                                  size_t cap) {
    json_t *v = lm_hf_config_get(c, key);
    if (!v) return LM_OK;
    if (!json_is_string(v)) return lm_errorf(LM_ERR_FORMAT, "%s: '%s' is not a string", c->name, key);
    size_t n = json_string_length(v);
    if (n + 1 > cap)
        return lm_errorf(LM_ERR_FORMAT, "%s: '%s' is longer than %zu bytes", c->name, key, cap - 1);
    memcpy(out, json_string_value(v), n + 1);
    return LM_OK;
}

static lm_status push_id(const struct lm_hf_config *c, const char *key, json_t *x, int32_t *ids,
                         int *n, int cap) {
    if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX)
        return lm_errorf(LM_ERR_FORMAT, "%s: '%s' holds something other than token ids", c->name, key);
    int32_t id = (int32_t)json_integer_value(x);
    for (int i = 0; i < *n; i++)
        if (ids[i] == id) return LM_OK;
    if (*n >= cap)
        return lm_errorf(LM_ERR_RANGE, "%s: '%s' lists more than %d ids", c->name, key, cap);
    ids[(*n)++] = id;
    return LM_OK;
}

lm_status lm_hf_config_ids_opt(const struct lm_hf_config *c, const char *key, int32_t *ids,
                               int *n, int cap) {
    json_t *v = lm_hf_config_get(c, key);
    if (!v) return LM_OK;
    if (json_is_array(v)) {
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) {
            lm_status rc = push_id(c, key, x, ids, n, cap);
            if (rc) return rc;
        }
        return LM_OK;
    }
    return push_id(c, key, v, ids, n, cap);
}
