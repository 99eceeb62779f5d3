/* json.c: see json.h. */
#include "base/json.h"

#include "base/file.h"

lm_status lm_json_load_file(const char *path, json_t **out) {
    struct lm_buf b = {0};
    lm_status st = lm_file_read(path, &b);
    if (st) return st;
    json_error_t e;
    *out = json_loadb(b.p, b.len, JSON_ALLOW_NUL, &e);
    lm_buf_free(&b);
    if (!*out)
        return lm_errorf(LM_ERR_FORMAT, "%s: invalid JSON at line %d column %d: %s",
                         path, e.line, e.column, e.text);
    return LM_OK;
}

lm_status lm_json_to_ids(const json_t *arr, const char *what, struct lm_ids *out) {
    if (!json_is_array(arr)) return lm_errorf(LM_ERR_INVALID, "%s: expected an array of token ids", what);
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v) {
        if (!json_is_integer(v))
            return lm_errorf(LM_ERR_INVALID, "%s[%zu]: expected an integer token id", what, i);
        json_int_t x = json_integer_value(v);
        if (x < 0 || x > INT32_MAX)
            return lm_errorf(LM_ERR_INVALID, "%s[%zu]: token id %lld out of range", what, i, (long long)x);
        lm_ids_push(out, (int32_t)x);
    }
    return LM_OK;
}

void lm_ids_to_json(const int32_t *ids, size_t n, struct lm_buf *out) {
    lm_buf_putc(out, '[');
    for (size_t i = 0; i < n; i++) lm_buf_printf(out, i ? ",%d" : "%d", ids[i]);
    lm_buf_putc(out, ']');
}
