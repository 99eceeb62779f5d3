/* reasoning.c: the Qwen3 reasoning parser.
 *
 * Qwen3 thinks inside <think> ... </think> (two added, non-special tokens, so they appear in
 * the detokenized text) and answers after it. The chat template (chat_template.c) decides where
 * a completion starts:
 *   - The prompt ends with "<|im_start|>assistant\n" (thinking on, the default): the model
 *     opens the block itself. If the output begins with "<think>", what follows is reasoning
 *     up to "</think>", and the rest is content; output that does not begin with "<think>" is
 *     all content.
 *   - The prompt's last assistant turn holds an open "<think>" (a template or a client that
 *     pre-fills it): the output starts as reasoning.
 *   - The prompt's last assistant turn holds a closed block (enable_thinking=false renders
 *     "<think>\n\n</think>\n\n"): everything is content, even a later "<think>".
 * The tags themselves are dropped. Reasoning is stripped of leading and trailing "\n" and
 * content of the "\n" that follow "</think>", which is exactly what the template does when the
 * turn comes back as history (reasoning_content.strip("\n"), content.lstrip("\n")), so a client
 * that sends back reasoning_content and content renders the same prompt as the canonical turn.
 * (vLLM's qwen3 parser keeps these newlines.)
 *
 * Streaming: bytes that may be the start of "<think>" (at the start), or trailing "\n" plus a
 * proper prefix of "</think>" (inside reasoning), are held back until the next piece decides
 * them, so the output does not depend on how the text was cut. */
#include "family/qwen3/reasoning.h"

#include <string.h>

enum {
    Q_START,          /* nothing seen: the output may open with <think> */
    Q_REASONING_LEAD, /* inside reasoning, dropping its leading "\n" */
    Q_REASONING,      /* inside reasoning */
    Q_CONTENT_LEAD,   /* after </think>, dropping the "\n" that follow it */
    Q_CONTENT,        /* everything else is content */
};

static const char k_open[] = "<think>";
static const char k_close[] = "</think>";
#define OPEN_LEN (sizeof k_open - 1)
#define CLOSE_LEN (sizeof k_close - 1)

/* Last occurrence of `needle` in p[0..n), or NULL. */
static const char *find_last(const char *p, size_t n, const char *needle) {
    size_t m = strlen(needle);
    if (m > n) return NULL;
    for (size_t i = n - m + 1; i-- > 0;)
        if (!memcmp(p + i, needle, m)) return p + i;
    return NULL;
}

static void begin(struct lm_reasoning *r, const char *prompt, size_t len) {
    r->state = Q_START;
    lm_buf_reset(&r->held);
    const char *hdr = find_last(prompt, len, "<|im_start|>assistant\n");
    if (!hdr) return;
    const char *tail = hdr + strlen("<|im_start|>assistant\n");
    size_t n = (size_t)(prompt + len - tail);
    if (find_last(tail, n, "<|im_end|>")) return; /* a finished turn: not where output starts */
    const char *open = find_last(tail, n, k_open);
    const char *close = find_last(tail, n, k_close);
    if (open && (!close || close < open))
        r->state = Q_REASONING_LEAD;
    else if (close)
        r->state = Q_CONTENT;
}

/* Length of the longest suffix of p[0..n) that is a proper prefix of `tag`. */
static size_t partial_tag(const char *p, size_t n, const char *tag, size_t tag_len) {
    size_t k = tag_len - 1 < n ? tag_len - 1 : n;
    for (; k > 0; k--)
        if (!memcmp(p + n - k, tag, k)) return k;
    return 0;
}

/* Runs the state machine over r->held, leaving in it only what must wait. */
static void run(struct lm_reasoning *r, struct lm_buf *reasoning, struct lm_buf *content) {
    const char *p = r->held.p;
    size_t n = r->held.len, i = 0;
    while (i < n) {
        switch (r->state) {
        case Q_START: {
            size_t have = n - i < OPEN_LEN ? n - i : OPEN_LEN;
            if (memcmp(p + i, k_open, have)) {
                r->state = Q_CONTENT;
            } else if (have == OPEN_LEN) {
                i += OPEN_LEN;
                r->state = Q_REASONING_LEAD;
            } else {
                goto hold; /* a proper prefix of <think> so far */
            }
            break;
        }
        case Q_REASONING_LEAD:
        case Q_CONTENT_LEAD:
            while (i < n && p[i] == '\n')
                i++;
            if (i < n) r->state = r->state == Q_REASONING_LEAD ? Q_REASONING : Q_CONTENT;
            break;
        case Q_REASONING: {
            const char *end = memmem(p + i, n - i, k_close, CLOSE_LEN);
            size_t upto; /* reasoning bytes decided: p[i..upto) */
            if (end) {
                upto = (size_t)(end - p);
                size_t cut = upto;
                while (cut > i && p[cut - 1] == '\n')
                    cut--; /* reasoning.rstrip("\n") */
                lm_buf_append(reasoning, p + i, cut - i);
                i = upto + CLOSE_LEN;
                r->state = Q_CONTENT_LEAD;
                break;
            }
            upto = n - partial_tag(p + i, n - i, k_close, CLOSE_LEN);
            while (upto > i && p[upto - 1] == '\n')
                upto--; /* may precede </think> */
            lm_buf_append(reasoning, p + i, upto - i);
            i = upto;
            goto hold;
        }
        case Q_CONTENT:
            lm_buf_append(content, p + i, n - i);
            i = n;
            break;
        }
    }
hold:
    memmove(r->held.p, r->held.p + i, n - i);
    r->held.len = n - i;
    r->held.p[r->held.len] = 0;
}

static void push(struct lm_reasoning *r, const char *text, size_t len, struct lm_buf *reasoning,
                 struct lm_buf *content) {
    lm_buf_append(&r->held, text, len);
    run(r, reasoning, content);
}

static void end(struct lm_reasoning *r, struct lm_buf *reasoning, struct lm_buf *content) {
    const char *p = r->held.p;
    size_t n = r->held.len;
    if (n) {
        if (r->state == Q_START) { /* a proper prefix of <think>: not a tag */
            lm_buf_append(content, p, n);
        } else if (r->state == Q_REASONING) { /* "\n"s and a partial </think>: not a tag */
            while (n > 0 && p[n - 1] == '\n')
                n--;
            lm_buf_append(reasoning, p, n);
        }
    }
    lm_buf_reset(&r->held);
}

const struct lm_reasoning_ops lm_qwen3_reasoning = {.begin = begin, .push = push, .end = end};
