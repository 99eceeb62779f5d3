/* chat.h: a conversation as the server hands it to a model family's chat template.
 *
 * Strings are borrowed from the caller for the duration of the render call. */
#ifndef LM_FAMILY_CHAT_H
#define LM_FAMILY_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "base/buf.h"
#include "base/status.h"

enum lm_chat_role {
    LM_ROLE_SYSTEM,
    LM_ROLE_USER,
    LM_ROLE_ASSISTANT,
    LM_ROLE_TOOL, /* parsed so that it can be rejected with a clear message */
};

struct lm_chat_msg {
    enum lm_chat_role role;
    const char *content;           /* UTF-8, NUL-terminated; never NULL ("" when absent) */
    const char *reasoning_content; /* assistant only; NULL when absent */
    bool has_tool_calls;           /* assistant message carried tool_calls: rejected for now */
};

struct lm_chat_opts {
    bool add_generation_prompt; /* append "<|im_start|>assistant\n" */
    int enable_thinking;        /* -1 not given (template default), 0 false, 1 true */
};

/* Parses a message's role as the OpenAI chat API names it: "system", "user", "assistant", "tool",
 * and "developer", which OpenAI's newer models take in place of "system" ("developer messages
 * replace the previous system messages", API reference, Chat Completions) and which Qwen3's
 * template, knowing only "system", renders as one (LM_ROLE_SYSTEM). Case-sensitive; false for
 * anything else or NULL. The server, `lumen template` and the profiler's corpora all parse with
 * it, so the three accept the same messages. */
bool lm_chat_role_parse(const char *s, enum lm_chat_role *out);

#endif
