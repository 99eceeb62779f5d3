/* test_reasoning.c: the Qwen3 reasoning parser (family/qwen3/reasoning.c) through the family
 * registry: crafted outputs under the three prompt endings of the chat template, compared with
 * an independent whole-text reference written from the rules; then every one fed in pieces (every
 * 2-way cut, and random many-way cuts) must give the same reasoning and content.
 * LM_LINK: lm_engine lm_family lm_format lm_text lm_backend lm_base */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine/sampler.h"
#include "family/chat.h"
#include "family/family.h"
#include "family/qwen3/chat_template.h"

/* The reference: the rules of reasoning.c applied to the whole text with string searches. */
static void reference(int mode, const char *text, struct lm_buf *reasoning,
                      struct lm_buf *content) {
    /* mode 0: prompt ends with "<|im_start|>assistant\n"; 1: inside an open <think>; 2: closed */
    size_t n = strlen(text);
    if (mode == 2) {
        lm_buf_append(content, text, n);
        return;
    }
    const char *start = text;
    if (mode == 0) {
        if (strncmp(text, "<think>", 7)) {
            lm_buf_append(content, text, n);
            return;
        }
        start = text + 7;
    }
    const char *end = strstr(start, "</think>");
    const char *r0 = start, *r1 = end ? end : text + n;
    while (r0 < r1 && *r0 == '\n')
        r0++;
    while (r1 > r0 && r1[-1] == '\n')
        r1--;
    lm_buf_append(reasoning, r0, (size_t)(r1 - r0));
    if (end) {
        const char *c = end + 8;
        while (*c == '\n')
            c++;
        lm_buf_puts(content, c);
    }
}

static void render(int mode, struct lm_buf *prompt) {
    struct lm_chat_msg m[1] = {{.role = LM_ROLE_USER, .content = "hi"}};
    struct lm_chat_opts o = {.add_generation_prompt = true, .enable_thinking = mode == 2 ? 0 : -1};
    CHECK(lm_qwen3_render_chat(m, 1, &o, prompt) == LM_OK, "render");
    if (mode == 1) lm_buf_puts(prompt, "<think>\n"); /* a pre-filled open block */
}

/* Feeds `text` cut at the sorted offsets cuts[0..n_cuts). */
static void run_pieces(const struct lm_reasoning_ops *ops, const struct lm_buf *prompt,
                       const char *text, const size_t *cuts, int n_cuts, struct lm_buf *reasoning,
                       struct lm_buf *content) {
    struct lm_reasoning r;
    lm_reasoning_init(&r, ops, prompt->p, prompt->len);
    size_t at = 0, len = strlen(text);
    for (int i = 0; i <= n_cuts; i++) {
        size_t to = i < n_cuts ? cuts[i] : len;
        lm_reasoning_push(&r, text + at, to - at, reasoning, content);
        at = to;
    }
    lm_reasoning_end(&r, reasoning, content);
    lm_reasoning_free(&r);
    if (!reasoning->p) lm_buf_puts(reasoning, "");
    if (!content->p) lm_buf_puts(content, "");
}

int main(void) {
    const struct lm_family *fam = lm_family_find("qwen3");
    CHECK(fam && fam->reasoning, "qwen3 declares a reasoning parser");
    if (!fam || !fam->reasoning) return check_exit("test_reasoning");
    const struct lm_reasoning_ops *ops = fam->reasoning;

    static const char *const texts[] = {
        "<think>\nLet me think.\n</think>\n\nThe answer.",
        "<think>\n\n</think>\n\nX",
        "<think>\nalpha\n\nbeta\n</think>\n\n\nfirst\n\nsecond\n",
        "Hello <think>x</think> there",
        "<thinking>not a tag",
        "<thi",
        "<think>",
        "<think>\nabc\n\n</thi",
        "<think>\nabc\n\n",
        "<think>a</think>b</think>c",
        "<think>\n\xc3\xa7\xc3\xa9 \xf0\x9f\x98\x80\n</thi "
        "nk>\n</think>\n\n\xe6\x97\xa5\xe6\x9c\xac",
        "reason only\n</think>\n\nans",
        "",
        "\n\n",
        "</think>",
        "a\n</t\n</think>b",
    };
    /* hand-written expectations for a few (mode 0) besides the reference */
    struct {
        const char *text, *reasoning, *content;
    } hand[] = {
        {"<think>\nLet me think.\n</think>\n\nThe answer.", "Let me think.", "The answer."},
        {"<think>\n\n</think>\n\nX", "", "X"},
        {"Hello <think>x</think> there", "", "Hello <think>x</think> there"},
        {"<think>a</think>b</think>c", "a", "b</think>c"},
        {"<think>\nabc\n\n</thi", "abc\n\n</thi", ""},
        {"<thi", "", "<thi"},
    };
    struct lm_buf prompts[3] = {{0}};
    for (int mode = 0; mode < 3; mode++)
        render(mode, &prompts[mode]);
    CHECK(strstr(prompts[2].p, "<think>\n\n</think>\n\n") != NULL,
          "enable_thinking=false renders a closed block");

    for (size_t h = 0; h < sizeof hand / sizeof hand[0]; h++) {
        struct lm_buf r = {0}, c = {0};
        run_pieces(ops, &prompts[0], hand[h].text, NULL, 0, &r, &c);
        CHECK(!strcmp(r.p, hand[h].reasoning) && !strcmp(c.p, hand[h].content),
              "'%s': reasoning '%s' content '%s'", hand[h].text, r.p, c.p);
        lm_buf_free(&r);
        lm_buf_free(&c);
    }

    struct lm_rng rng;
    lm_rng_seed(&rng, 7);
    for (int mode = 0; mode < 3; mode++) {
        for (size_t t = 0; t < sizeof texts / sizeof texts[0]; t++) {
            const char *text = texts[t];
            size_t len = strlen(text);
            struct lm_buf wr = {0}, wc = {0};
            reference(mode, text, &wr, &wc);
            if (!wr.p) lm_buf_puts(&wr, "");
            if (!wc.p) lm_buf_puts(&wc, "");
            struct lm_buf r = {0}, c = {0};
            run_pieces(ops, &prompts[mode], text, NULL, 0, &r, &c);
            CHECK(!strcmp(r.p, wr.p) && !strcmp(c.p, wc.p),
                  "mode %d '%s': whole gives '%s' | '%s', want '%s' | '%s'", mode, text, r.p, c.p,
                  wr.p, wc.p);
            lm_buf_free(&r);
            lm_buf_free(&c);
            int bad = 0;
            for (size_t cut = 1; cut < len; cut++) { /* every 2-way cut */
                struct lm_buf r2 = {0}, c2 = {0};
                run_pieces(ops, &prompts[mode], text, &cut, 1, &r2, &c2);
                if (strcmp(r2.p, wr.p) || strcmp(c2.p, wc.p)) bad++;
                lm_buf_free(&r2);
                lm_buf_free(&c2);
            }
            CHECK(bad == 0, "mode %d '%s': %d two-piece cuts differ", mode, text, bad);
            bad = 0;
            for (int trial = 0; trial < 50 && len > 1;
                 trial++) { /* random many-way cuts, bytewise */
                size_t cuts[16];
                int nc = 0;
                for (size_t at = 0; nc < 16;) {
                    at += 1 + lm_rng_next(&rng) % 3;
                    if (at >= len) break;
                    cuts[nc++] = at;
                }
                struct lm_buf r2 = {0}, c2 = {0};
                run_pieces(ops, &prompts[mode], text, cuts, nc, &r2, &c2);
                if (strcmp(r2.p, wr.p) || strcmp(c2.p, wc.p)) bad++;
                lm_buf_free(&r2);
                lm_buf_free(&c2);
            }
            CHECK(bad == 0, "mode %d '%s': %d random cuts differ", mode, text, bad);
            lm_buf_free(&wr);
            lm_buf_free(&wc);
        }
    }

    /* A prompt whose last assistant turn is finished (no generation prompt) starts fresh. */
    {
        struct lm_chat_msg m[2] = {
            {.role = LM_ROLE_USER, .content = "hi"},
            {.role = LM_ROLE_ASSISTANT, .content = "<think>\nr\n</think>\n\nok"}};
        struct lm_chat_opts o = {.add_generation_prompt = false, .enable_thinking = -1};
        struct lm_buf p = {0};
        CHECK(lm_qwen3_render_chat(m, 2, &o, &p) == LM_OK, "render finished turn");
        struct lm_buf r = {0}, c = {0};
        run_pieces(ops, &p, "<think>\nx\n</think>\n\ny", NULL, 0, &r, &c);
        CHECK(!strcmp(r.p, "x") && !strcmp(c.p, "y"), "after a finished turn: '%s' | '%s'", r.p,
              c.p);
        lm_buf_free(&r);
        lm_buf_free(&c);
        lm_buf_free(&p);
    }
    for (int mode = 0; mode < 3; mode++)
        lm_buf_free(&prompts[mode]);
    return check_exit("test_reasoning");
}
