/* chat_template.h: the Qwen3 chat template (ChatML with thinking), written in C.
 *
 * Reference: the Jinja template in Qwen/Qwen3-0.6B's tokenizer_config.json, as rendered by
 * transformers' apply_chat_template; fixtures in tests/data/fixtures/chat_template. */
#ifndef LM_FAMILY_QWEN3_CHAT_TEMPLATE_H
#define LM_FAMILY_QWEN3_CHAT_TEMPLATE_H

#include <stddef.h>

#include "base/buf.h"
#include "base/status.h"
#include "family/chat.h"

/* Renders `msgs` (n >= 1) into `out` (appended), byte-exact with the official template.
 * LM_ERR_UNSUPPORTED for tool messages or tool calls (tools are not served yet);
 * LM_ERR_INVALID when there is no message at all. */
lm_status lm_qwen3_render_chat(const struct lm_chat_msg *msgs, size_t n,
                               const struct lm_chat_opts *opts, struct lm_buf *out);

#endif
