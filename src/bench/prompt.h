/* prompt.h: the model's own view of a conversation, for the profiler: its tokenizer, and its
 * family's chat template, read from a model folder without loading any weight.
 *
 * The folder must hold tokenizer.json; config.json (optional) names model_type, which picks the
 * family's chat template (family.h), and max_position_embeddings, the context size. Without a
 * known model_type only plain text can be counted (lm_bench_prompt_count); rendering a
 * conversation then fails with LM_ERR_UNSUPPORTED.
 *
 * Uses: ShareGPT selection counts whole rendered histories against the context budget; the
 * synthetic dataset draws prompts from the vocabulary; the report compares the server's usage
 * with lumen's own count; verification renders each request's messages to the prompt ids the
 * server should have seen (docs/RECORDS.md, prompt_ids_sha256). */
#ifndef LM_BENCH_PROMPT_H
#define LM_BENCH_PROMPT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "base/buf.h"
#include "base/status.h"

struct lm_tokenizer;
struct lm_family;

struct lm_bench_prompt {
    struct lm_tokenizer *tok;       /* owned */
    const struct lm_family *family; /* NULL when config.json is absent or names no known family */
    char *dir;                      /* the folder; owned */
    char model_type[32];            /* "" when unknown */
    long context_tokens;            /* config.json max_position_embeddings; 0 when unknown */
};

/* Opens `dir` (or a tokenizer.json path, which gives no template). LM_ERR_IO / LM_ERR_FORMAT
 * naming the file when tokenizer.json cannot be read or config.json is malformed. Free with
 * lm_bench_prompt_free (also after a failure). */
lm_status lm_bench_prompt_open(struct lm_bench_prompt *p, const char *dir);
void lm_bench_prompt_free(struct lm_bench_prompt *p);

/* True when conversations can be rendered (a family's template is known). */
bool lm_bench_prompt_can_render(const struct lm_bench_prompt *p);

/* Renders `messages` (a JSON array of {"role", "content"}; content a string, or an array of
 * {"type":"text","text":...} parts, joined) with add_generation_prompt, as a server does for
 * /v1/chat/completions, and appends the prompt's ids to `ids` (special-token strings matched as
 * special tokens). enable_thinking: -1 template default, 0 or 1 (chat_template_kwargs).
 * LM_ERR_UNSUPPORTED without a template; LM_ERR_INVALID naming messages[i] for a bad message. */
lm_status lm_bench_prompt_render_ids(const struct lm_bench_prompt *p, const json_t *messages,
                                     int enable_thinking, struct lm_ids *ids);

/* Tokens of plain `text` (len bytes), special-token strings counted as text. */
long lm_bench_prompt_count(const struct lm_bench_prompt *p, const char *text, size_t len);

/* The text of a message's content: a string, or the text parts of an array joined (appended to
 * out). Returns false when content is neither. */
bool lm_bench_content_text(const json_t *content, struct lm_buf *out);

#endif
