/* hf_config.h: typed reads of keys from Hugging Face config.json / generation_config.json.
 *
 * The files are plain JSON objects (transformers' PretrainedConfig.to_json_string). Each getter
 * names the file and key in its message: "config.json: missing key 'hidden_size'",
 * "config.json: 'hidden_size' is not an integer". A key whose value is null counts as absent.
 * Which keys a model needs is the model family's business (family/model.c); this layer only
 * knows JSON types. */
#ifndef LM_FORMAT_HF_CONFIG_H
#define LM_FORMAT_HF_CONFIG_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

/* A parsed config file: the JSON object and the name used in messages ("config.json"). */
struct lm_hf_config {
    json_t *root; /* owned reference; a JSON object */
    char *name;   /* owned: the file's base name, for messages */
};

/* Loads DIR/NAME (for example "config.json"). LM_ERR_MISSING when the file does not exist,
 * LM_ERR_IO / LM_ERR_FORMAT when it cannot be read or is not a JSON object. */
lm_status lm_hf_config_load(struct lm_hf_config *c, const char *dir, const char *name);
/* Releases; accepts a zeroed struct. */
void lm_hf_config_free(struct lm_hf_config *c);

/* The value at `key`, or NULL when absent or null. `key` may be a dotted path into nested
 * objects ("rope_parameters.rope_theta"). Borrowed. */
json_t *lm_hf_config_get(const struct lm_hf_config *c, const char *key);

/* Required integer: LM_ERR_MISSING when absent, LM_ERR_FORMAT when not an integer or outside
 * [lo, hi]. */
lm_status lm_hf_config_int(const struct lm_hf_config *c, const char *key, long lo, long hi,
                           int *out);
/* Optional integer: *out keeps its value when the key is absent. */
lm_status lm_hf_config_int_opt(const struct lm_hf_config *c, const char *key, long lo, long hi,
                               int *out);
/* Optional number (integer or real): *out keeps its value when absent. */
lm_status lm_hf_config_number_opt(const struct lm_hf_config *c, const char *key, double *out);
/* Optional boolean: *out keeps its value when absent. */
lm_status lm_hf_config_bool_opt(const struct lm_hf_config *c, const char *key, bool *out);
/* Optional string, copied into out[cap] (NUL-terminated): *out keeps its value when absent.
 * LM_ERR_FORMAT when not a string or longer than cap - 1. */
lm_status lm_hf_config_string_opt(const struct lm_hf_config *c, const char *key, char *out,
                                  size_t cap);
/* Optional id list that may be written as one integer or a list of integers (eos_token_id).
 * Appends to ids[*n..cap) skipping duplicates; LM_ERR_FORMAT for another type or a negative id,
 * LM_ERR_RANGE when more than `cap` distinct ids. */
lm_status lm_hf_config_ids_opt(const struct lm_hf_config *c, const char *key, int32_t *ids,
                               int *n, int cap);

#endif
