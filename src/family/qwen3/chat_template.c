/* chat_template.c: the official Qwen3 Jinja chat template, transcribed to C.
 *
 * The template (Qwen/Qwen3-0.6B tokenizer_config.json "chat_template"), without its tools branch:
 *
 *   1. messages[0] with role system is rendered first as <|im_start|>system\n...<|im_end|>\n.
 *   2. last_query_index = index of the last user message whose content is not wrapped in
 *      <tool_response>...</tool_response>; len-1 when there is none.
 *   3. For each message: user, and system other than messages[0], render as
 *      <|im_start|>ROLE\nCONTENT<|im_end|>\n (a later system message stays in place).
 *      An assistant message: reasoning = reasoning_content when given (content kept whole);
 *      otherwise, when content holds "</think>", content = text after the last "</think>" with
 *      leading "\n" stripped and reasoning = text before the first "</think>", right-stripped of
 *      "\n", after its last "<think>", left-stripped of "\n". If its index is after
 *      last_query_index and it is the last message or has non-empty reasoning, it renders as
 *      <|im_start|>assistant\n<think>\nREASONING.strip("\n")\n</think>\n\nCONTENT.lstrip("\n");
 *      otherwise <|im_start|>assistant\nCONTENT. Then <|im_end|>\n.
 *   4. add_generation_prompt appends <|im_start|>assistant\n, and enable_thinking == false then
 *      appends <think>\n\n</think>\n\n.
 *
 * reasoning_content on a non-assistant message is ignored, as the template ignores it.
 * Strings are handled as byte slices {p, n}; Python's str.split/strip on "\n" and ASCII tags are
 * byte operations on UTF-8 as well. */
#include "family/qwen3/chat_template.h"

#include <string.h>

struct slice {
    const char *p;
    size_t n;
};

static struct slice slice_of(const char *s) { return (struct slice){s, strlen(s)}; }

static struct slice lstrip_nl(struct slice s) {
    while (s.n && s.p[0] == '\n') s.p++, s.n--;
    return s;
}

static struct slice rstrip_nl(struct slice s) {
    while (s.n && s.p[s.n - 1] == '\n') s.n--;
    return s;
}

/* First occurrence of `needle` in `s`, or NULL. */
static const char *find_first(struct slice s, const char *needle) {
    size_t m = strlen(needle);
    if (m > s.n) return NULL;
    for (size_t i = 0; i + m <= s.n; i++)
        if (!memcmp(s.p + i, needle, m)) return s.p + i;
    return NULL;
}

/* Last occurrence of `needle` in `s`, or NULL. */
static const char *find_last(struct slice s, const char *needle) {
    size_t m = strlen(needle);
    if (m > s.n) return NULL;
    for (size_t i = s.n - m + 1; i-- > 0;)
        if (!memcmp(s.p + i, needle, m)) return s.p + i;
    return NULL;
}

static bool starts_with(struct slice s, const char *prefix) {
    size_t m = strlen(prefix);
    return s.n >= m && !memcmp(s.p, prefix, m);
}

static bool ends_with(struct slice s, const char *suffix) {
    size_t m = strlen(suffix);
    return s.n >= m && !memcmp(s.p + s.n - m, suffix, m);
}

static void put(struct lm_buf *out, struct slice s) { lm_buf_append(out, s.p, s.n); }

static const char *role_name(enum lm_chat_role r) {
    switch (r) {
    case LM_ROLE_SYSTEM: return "system";
    case LM_ROLE_USER: return "user";
    case LM_ROLE_ASSISTANT: return "assistant";
    case LM_ROLE_TOOL: return "tool";
    }
    return "?";
}

/* Renders one assistant message (template step 3). */
static void render_assistant(const struct lm_chat_msg *m, bool after_last_query, bool last,
                             struct lm_buf *out) {
    struct slice content = slice_of(m->content);
    struct slice reasoning = {"", 0};
    if (m->reasoning_content) {
        reasoning = slice_of(m->reasoning_content);
    } else {
        const char *last_end = find_last(content, "</think>");
        if (last_end) {
            const char *first_end = find_first(content, "</think>");
            struct slice before = {content.p, (size_t)(first_end - content.p)};
            before = rstrip_nl(before);
            const char *open = find_last(before, "<think>");
            if (open) {
                size_t skip = (size_t)(open - before.p) + strlen("<think>");
                before.p += skip, before.n -= skip;
            }
            reasoning = lstrip_nl(before);
            const char *after = last_end + strlen("</think>");
            content = lstrip_nl((struct slice){after, (size_t)(content.p + content.n - after)});
        }
    }
    lm_buf_puts(out, "<|im_start|>assistant\n");
    if (after_last_query && (last || reasoning.n)) {
        lm_buf_puts(out, "<think>\n");
        put(out, rstrip_nl(lstrip_nl(reasoning)));
        lm_buf_puts(out, "\n</think>\n\n");
        put(out, lstrip_nl(content));
    } else {
        put(out, content);
    }
    lm_buf_puts(out, "<|im_end|>\n");
}

lm_status lm_qwen3_render_chat(const struct lm_chat_msg *msgs, size_t n,
                               const struct lm_chat_opts *opts, struct lm_buf *out) {
    if (n == 0) return lm_errorf(LM_ERR_INVALID, "messages: the conversation has no message");
    for (size_t i = 0; i < n; i++) {
        if (msgs[i].role == LM_ROLE_TOOL)
            return lm_errorf(LM_ERR_UNSUPPORTED, "messages[%zu]: role 'tool' is not supported yet", i);
        if (msgs[i].has_tool_calls)
            return lm_errorf(LM_ERR_UNSUPPORTED, "messages[%zu]: tool_calls are not supported yet", i);
    }

    if (msgs[0].role == LM_ROLE_SYSTEM) {
        lm_buf_puts(out, "<|im_start|>system\n");
        lm_buf_puts(out, msgs[0].content);
        lm_buf_puts(out, "<|im_end|>\n");
    }

    size_t last_query = n - 1;
    for (size_t i = n; i-- > 0;) {
        struct slice c = slice_of(msgs[i].content);
        if (msgs[i].role == LM_ROLE_USER &&
            !(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
            last_query = i;
            break;
        }
    }

    for (size_t i = 0; i < n; i++) {
        const struct lm_chat_msg *m = &msgs[i];
        if (m->role == LM_ROLE_USER || (m->role == LM_ROLE_SYSTEM && i > 0)) {
            lm_buf_printf(out, "<|im_start|>%s\n", role_name(m->role));
            lm_buf_puts(out, m->content);
            lm_buf_puts(out, "<|im_end|>\n");
        } else if (m->role == LM_ROLE_ASSISTANT) {
            render_assistant(m, i > last_query, i == n - 1, out);
        }
    }

    if (opts->add_generation_prompt) {
        lm_buf_puts(out, "<|im_start|>assistant\n");
        if (opts->enable_thinking == 0) lm_buf_puts(out, "<think>\n\n</think>\n\n");
    }
    return LM_OK;
}
