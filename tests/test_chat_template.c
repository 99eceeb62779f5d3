/* test_chat_template.c: the Qwen3 chat template in C against transformers' apply_chat_template.
 *
 * Every case of tests/data/fixtures/chat_template/qwen3_cases.jsonl must render byte-exact, and
 * its `rendered` string must encode (special tokens matched) to its `ids` with the tokenizer.
 * The extra cases below cover template branches the fixtures do not reach (thinking kept after
 * the last user query, reasoning_content, tool_response users); their expected strings were
 * rendered from the official template text with jinja2 3.1.6 configured as transformers does
 * (trim_blocks, lstrip_blocks, loopcontrols), a setup that reproduces all 15 fixtures.
 * LM_LINK: lm_family lm_text lm_base */
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/file.h"
#include "base/json.h"
#include "check.h"
#include "family/chat.h"
#include "family/qwen3/chat_template.h"
#include "text/tokenizer.h"

struct extra_case {
    const char *name;
    size_t n;
    bool add_generation_prompt;
    int enable_thinking;
    struct lm_chat_msg msgs[6];
    const char *rendered;
};

static const struct extra_case k_extra[] = {
    {"last_assistant_after_query_thinking", 2, false, -1,
     {{LM_ROLE_USER, "q", NULL, false}, {LM_ROLE_ASSISTANT, "<think>\n\nr1\n\n</think>\n\n\nans", NULL, false}},
     "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nr1\n</think>\n\nans<|im_end|>\n"},
    {"last_assistant_plain_after_query", 2, false, -1,
     {{LM_ROLE_USER, "q", NULL, false}, {LM_ROLE_ASSISTANT, "\nplain", NULL, false}},
     "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nplain<|im_end|>\n"},
    {"assistant_reasoning_field_last", 2, false, -1,
     {{LM_ROLE_USER, "q", NULL, false}, {LM_ROLE_ASSISTANT, "\n\nA", "\n\nwhy\n", false}},
     "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nwhy\n</think>\n\nA<|im_end|>\n"},
    {"assistant_reasoning_field_keeps_content", 2, true, -1,
     {{LM_ROLE_USER, "q", NULL, false}, {LM_ROLE_ASSISTANT, "<think>x</think>A", "", false}},
     "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n<think>x</think>A<|im_end|>\n<|im_start|>assistant\n"},
    {"two_assistants_after_query", 4, true, 0,
     {{LM_ROLE_USER, "q", NULL, false}, {LM_ROLE_ASSISTANT, "<think>t1</think>a1", NULL, false}, {LM_ROLE_ASSISTANT, "a2 no think", NULL, false}, {LM_ROLE_ASSISTANT, "a3", NULL, false}},
     "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nt1\n</think>\n\na1<|im_end|>\n<|im_start|>assistant\na2 no think<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\na3<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"},
    {"middle_assistant_empty_reasoning", 3, true, -1,
     {{LM_ROLE_USER, "q", NULL, false}, {LM_ROLE_ASSISTANT, "<think></think>a1", NULL, false}, {LM_ROLE_ASSISTANT, "a2", NULL, false}},
     "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\na2<|im_end|>\n<|im_start|>assistant\n"},
    {"tool_response_user_not_a_query", 4, true, -1,
     {{LM_ROLE_USER, "q", NULL, false}, {LM_ROLE_ASSISTANT, "<think>plan</think>call", NULL, false}, {LM_ROLE_USER, "<tool_response>\n42\n</tool_response>", NULL, false}, {LM_ROLE_ASSISTANT, "<think>got it</think>done", NULL, false}},
     "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nplan\n</think>\n\ncall<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\ngot it\n</think>\n\ndone<|im_end|>\n<|im_start|>assistant\n"},
    {"no_user_at_all", 2, true, 1,
     {{LM_ROLE_SYSTEM, "s", NULL, false}, {LM_ROLE_ASSISTANT, "<think>r</think>a", NULL, false}},
     "<|im_start|>system\ns<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n<|im_start|>assistant\n"},
    {"think_without_open_tag", 2, false, -1,
     {{LM_ROLE_USER, "q", NULL, false}, {LM_ROLE_ASSISTANT, "abc\n</think>\n\nz", NULL, false}},
     "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nabc\n</think>\n\nz<|im_end|>\n"},
    {"system_only_no_prompt", 1, false, 0,
     {{LM_ROLE_SYSTEM, "only", NULL, false}},
     "<|im_start|>system\nonly<|im_end|>\n"},
    {"first_is_assistant", 2, true, -1,
     {{LM_ROLE_ASSISTANT, "hello", NULL, false}, {LM_ROLE_USER, "u", NULL, false}},
     "<|im_start|>assistant\nhello<|im_end|>\n<|im_start|>user\nu<|im_end|>\n<|im_start|>assistant\n"},
};

/* Reports the first byte where `got` and `want` differ. */
static void check_same(const char *name, const char *got, size_t got_len, const char *want) {
    size_t want_len = strlen(want), i = 0;
    while (i < got_len && i < want_len && got[i] == want[i]) i++;
    CHECK(got_len == want_len && i == want_len, "%s: differs at byte %zu (got len %zu, want %zu)\n"
          "  got:  %.60s\n  want: %.60s", name, i, got_len, want_len, got + (i < got_len ? i : got_len),
          want + (i < want_len ? i : want_len));
}

static void test_fixtures(const struct lm_tokenizer *tok) {
    struct lm_buf file = {0};
    lm_status st = lm_file_read(TEST_DATA("fixtures/chat_template/qwen3_cases.jsonl"), &file);
    CHECK(st == LM_OK, "read fixtures: %s", lm_error_message());
    if (st) return;
    int n_cases = 0;
    char *save = NULL;
    for (char *line = strtok_r(file.p, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        json_error_t e;
        json_t *c = json_loads(line, 0, &e);
        CHECK(c != NULL, "fixture line %d: %s", n_cases + 1, e.text);
        if (!c) continue;
        const char *name = json_string_value(json_object_get(c, "name"));
        json_t *jm = json_object_get(c, "messages");
        size_t n = json_array_size(jm);
        struct lm_chat_msg *msgs = calloc(n ? n : 1, sizeof *msgs);
        for (size_t i = 0; i < n; i++) {
            json_t *m = json_array_get(jm, i);
            bool ok = lm_chat_role_parse(json_string_value(json_object_get(m, "role")), &msgs[i].role);
            CHECK(ok, "%s: messages[%zu] role", name, i);
            msgs[i].content = json_string_value(json_object_get(m, "content"));
            msgs[i].reasoning_content = json_string_value(json_object_get(m, "reasoning_content"));
        }
        json_t *et = json_object_get(c, "enable_thinking");
        struct lm_chat_opts opts = {
            .add_generation_prompt = json_is_true(json_object_get(c, "add_generation_prompt")),
            .enable_thinking = json_is_boolean(et) ? json_is_true(et) : -1,
        };
        struct lm_buf out = {0};
        st = lm_qwen3_render_chat(msgs, n, &opts, &out);
        CHECK(st == LM_OK, "%s: %s", name, lm_error_message());
        const char *want = json_string_value(json_object_get(c, "rendered"));
        check_same(name, out.p ? out.p : "", out.len, want);

        struct lm_ids want_ids = {0}, got_ids = {0};
        lm_json_to_ids(json_object_get(c, "ids"), "ids", &want_ids);
        lm_tokenizer_encode(tok, out.p ? out.p : "", out.len, 0, &got_ids);
        bool same = got_ids.n == want_ids.n && want_ids.n > 0 &&
                    !memcmp(got_ids.v, want_ids.v, want_ids.n * sizeof *want_ids.v);
        CHECK(same, "%s: ids differ (got %zu ids, want %zu)", name, got_ids.n, want_ids.n);
        lm_ids_free(&want_ids);
        lm_ids_free(&got_ids);
        lm_buf_free(&out);
        free(msgs);
        json_decref(c);
        n_cases++;
    }
    CHECK(n_cases == 15, "fixture cases: %d", n_cases);
    lm_buf_free(&file);
}

static void test_extra(void) {
    for (size_t k = 0; k < sizeof k_extra / sizeof k_extra[0]; k++) {
        const struct extra_case *c = &k_extra[k];
        struct lm_chat_opts opts = {c->add_generation_prompt, c->enable_thinking};
        struct lm_buf out = {0};
        lm_status st = lm_qwen3_render_chat(c->msgs, c->n, &opts, &out);
        CHECK(st == LM_OK, "%s: %s", c->name, lm_error_message());
        check_same(c->name, out.p ? out.p : "", out.len, c->rendered);
        lm_buf_free(&out);
    }
}

static void test_errors(void) {
    struct lm_chat_opts opts = {true, -1};
    struct lm_buf out = {0};
    struct lm_chat_msg msgs[4] = {
        {LM_ROLE_SYSTEM, "s", NULL, false},
        {LM_ROLE_USER, "u", NULL, false},
        {LM_ROLE_ASSISTANT, "", NULL, false},
        {LM_ROLE_TOOL, "42", NULL, false},
    };
    lm_status st = lm_qwen3_render_chat(msgs, 4, &opts, &out);
    CHECK(st == LM_ERR_UNSUPPORTED, "tool role: %s", lm_status_name(st));
    CHECK(!strcmp(lm_error_message(), "messages[3]: role 'tool' is not supported yet"), "message: %s",
          lm_error_message());
    msgs[2].has_tool_calls = true;
    st = lm_qwen3_render_chat(msgs, 3, &opts, &out);
    CHECK(st == LM_ERR_UNSUPPORTED && strstr(lm_error_message(), "messages[2]") &&
          strstr(lm_error_message(), "tool_calls"), "tool calls: %s", lm_error_message());
    st = lm_qwen3_render_chat(msgs, 0, &opts, &out);
    CHECK(st == LM_ERR_INVALID, "empty conversation: %s", lm_status_name(st));
    CHECK(out.len == 0, "nothing rendered on error, got %zu bytes", out.len);
    lm_buf_free(&out);

    enum lm_chat_role r = LM_ROLE_SYSTEM;
    CHECK(lm_chat_role_parse("assistant", &r) && r == LM_ROLE_ASSISTANT, "parse assistant");
    CHECK(lm_chat_role_parse("tool", &r) && r == LM_ROLE_TOOL, "parse tool");
    CHECK(!lm_chat_role_parse("User", &r) && !lm_chat_role_parse("Developer", &r) &&
          !lm_chat_role_parse(NULL, &r), "unknown roles rejected");
    /* OpenAI's "developer" is "system" (server, lumen template, profiler corpora) */
    r = LM_ROLE_USER;
    CHECK(lm_chat_role_parse("developer", &r) && r == LM_ROLE_SYSTEM, "role developer -> system");
    CHECK(lm_chat_role_parse("user", &r) && r == LM_ROLE_USER, "role user");
}

int main(void) {
    struct lm_tokenizer *tok = NULL;
    lm_status st = lm_tokenizer_load(TINY_MODEL "/tokenizer.json", &tok);
    CHECK(st == LM_OK, "tokenizer: %s", lm_error_message());
    if (tok) test_fixtures(tok);
    test_extra();
    test_errors();
    lm_tokenizer_destroy(tok);
    return check_exit("test_chat_template");
}
