/* json.h: small helpers over jansson (https://jansson.readthedocs.io) for files and id arrays. */
#ifndef LM_BASE_JSON_H
#define LM_BASE_JSON_H

#include <jansson.h>

#include "base/buf.h"
#include "base/status.h"

/* Parses the JSON file at `path` ("-" for stdin). On LM_ERR_IO/LM_ERR_FORMAT the message names
 * the file, line and column. *out is a new reference (caller json_decref's). */
lm_status lm_json_load_file(const char *path, json_t **out);

/* Converts a JSON array of integers to ids (appended to `out`). LM_ERR_INVALID names `what` and
 * the first bad index. */
lm_status lm_json_to_ids(const json_t *arr, const char *what, struct lm_ids *out);

/* Appends `[1,2,3]` to `out`. */
void lm_ids_to_json(const int32_t *ids, size_t n, struct lm_buf *out);

#endif
