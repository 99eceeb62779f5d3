/* test_openai.c: the OpenAI surface without a server (src/server/openai.h, records.h,
 * metrics.h): request fields and their errors for both endpoints, per-choice sampling, the
 * response and chunk objects (choices, reasoning_content, logprobs, usage), capabilities,
 * /tokenize and /detokenize on the tiny model (against the tokenizer and the chat template
 * called directly), request records (SHA-256 recomputed here from known vectors and explicit
 * little-endian bytes), and the Prometheus exposition (buckets summed here; `promtool check
 * metrics` when promtool is installed); the "model" check (OpenAI's model_not_found written out),
 * NUL characters in a body, the gate's verdicts on request heads (gate.h) and a streamed chunk's
 * text_offset.
 * LM_LINK: lm_server lm_engine lm_family lm_format lm_text lm_backend lm_base */
#include <jansson.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "family/qwen3/chat_template.h"
#include "server/gate.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "server/records.h"

static const char *jstr(const json_t *j) {
    return json_string_value(j) ? json_string_value(j) : "";
}

struct err_case {
    const char *body;
    const char *param;  /* expected error.param */
    const char *needle; /* in the message */
};

static void check_errors(bool chat, const struct err_case *cases, size_t n) {
    for (size_t i = 0; i < n; i++) {
        struct lm_chat_request r;
        struct lm_api_error e;
        lm_status st =
            chat ? lm_chat_request_parse(cases[i].body, strlen(cases[i].body), &r, &e)
                 : lm_completion_request_parse(cases[i].body, strlen(cases[i].body), &r, &e);
        CHECK(st != LM_OK && e.status == 400 && !strcmp(e.param, cases[i].param) &&
                  strstr(e.message, cases[i].needle),
              "%s: status %d param '%s' message '%s'", cases[i].body, e.status, e.param, e.message);
        CHECK(r.root == NULL && r.prompt_ids == NULL && r.messages == NULL, "nothing left to free");
        lm_chat_request_free(&r);
    }
}

static void test_chat_fields(void) {
    const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"n\":3,"
                       "\"logprobs\":true,\"top_logprobs\":5,"
                       "\"presence_penalty\":0.5,\"frequency_penalty\":-1.25,\"repetition_"
                       "penalty\":1.1,\"min_p\":0.05,"
                       "\"max_completion_tokens\":9,\"seed\":100,\"temperature\":0.7}";
    struct lm_chat_request r;
    struct lm_api_error e;
    lm_status st = lm_chat_request_parse(body, strlen(body), &r, &e);
    CHECK(st == LM_OK, "parse: %s", e.message);
    if (st == LM_OK) {
        CHECK(r.endpoint == LM_API_CHAT && r.n == 3 && r.logprobs && r.top_logprobs == 5 &&
                  r.max_tokens == 9,
              "n, logprobs, max_completion_tokens");
        CHECK(r.presence_penalty == 0.5 && r.frequency_penalty == -1.25 &&
                  fabs(r.repetition_penalty - 1.1) < 1e-12 && fabs(r.min_p - 0.05) < 1e-12,
              "penalties and min_p");
        struct lm_sampling_params p0 = lm_chat_request_sampling(&r, NULL, 0);
        struct lm_sampling_params p2 = lm_chat_request_sampling(&r, NULL, 2);
        CHECK(p0.seeded && p0.seed == 100 && p2.seed == 102,
              "choice i samples with seed + i: %llu %llu", (unsigned long long)p0.seed,
              (unsigned long long)p2.seed);
        CHECK(p0.presence_penalty == 0.5f && p0.frequency_penalty == -1.25f &&
                  p0.repetition_penalty == 1.1f && p0.min_p == 0.05f && p0.logprobs &&
                  p0.top_logprobs == 5 && p0.temperature == 0.7f,
              "sampling params carry the request's");
    }
    lm_chat_request_free(&r);

    /* OpenAI's developer role is the system role; an unknown role names the known ones. */
    const char *dev = "{\"messages\":[{\"role\":\"developer\",\"content\":\"Be brief.\"},"
                      "{\"role\":\"user\",\"content\":\"hi\"}]}";
    st = lm_chat_request_parse(dev, strlen(dev), &r, &e);
    CHECK(st == LM_OK && r.n_messages == 2 && r.messages[0].role == LM_ROLE_SYSTEM &&
              r.messages[1].role == LM_ROLE_USER,
          "developer is system: %s", st ? e.message : "");
    lm_chat_request_free(&r);

    const char *plain = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    st = lm_chat_request_parse(plain, strlen(plain), &r, &e);
    struct lm_sampling_params p = lm_chat_request_sampling(&r, NULL, 0);
    CHECK(st == LM_OK && r.n == 1 && !r.logprobs && r.repetition_penalty == 1 &&
              !lm_sampling_needs_history(&p) && !p.logprobs && p.min_p == 0,
          "defaults are off");
    lm_chat_request_free(&r);

#define MSG "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
    static const struct err_case cases[] = {
        {MSG "\"n\":9}", "n", "at most 8"},
        {MSG "\"n\":0}", "n", "at least 1"},
        {MSG "\"logprobs\":1}", "logprobs", "must be a boolean"},
        {MSG "\"logprobs\":true,\"top_logprobs\":21}", "top_logprobs", "[0, 20]"},
        {MSG "\"top_logprobs\":2}", "top_logprobs", "needs logprobs"},
        {MSG "\"presence_penalty\":2.5}", "presence_penalty", "[-2, 2]"},
        {MSG "\"frequency_penalty\":-3}", "frequency_penalty", "[-2, 2]"},
        {MSG "\"repetition_penalty\":0}", "repetition_penalty", "(0, "},
        {MSG "\"min_p\":1.5}", "min_p", "[0, 1]"},
        {MSG "\"min_p\":\"low\"}", "min_p", "must be a number"},
        {MSG "\"logit_bias\":{\"5\":1}}", "logit_bias", "not supported"},
        {"{\"messages\":[{\"role\":\"critic\",\"content\":\"x\"}]}", "messages[0].role",
         "is not one of system, developer, user, assistant"},
    };
#undef MSG
    check_errors(true, cases, sizeof cases / sizeof cases[0]);
}

static void test_completion_fields(void) {
    struct lm_chat_request r;
    struct lm_api_error e;
    const char *b1 = "{\"model\":\"m\",\"prompt\":\"Once "
                     "upon\",\"logprobs\":3,\"max_tokens\":5,\"stream\":true}";
    lm_status st = lm_completion_request_parse(b1, strlen(b1), &r, &e);
    CHECK(st == LM_OK && r.endpoint == LM_API_COMPLETIONS && r.prompt &&
              !strcmp(r.prompt, "Once upon") && !r.prompt_ids && r.logprobs &&
              r.top_logprobs == 3 && r.max_tokens == 5 && r.stream && !r.messages,
          "string prompt: %s", e.message);
    lm_chat_request_free(&r);
    const char *b2 = "{\"prompt\":[1,2,151643],\"logprobs\":0}";
    st = lm_completion_request_parse(b2, strlen(b2), &r, &e);
    CHECK(st == LM_OK && !r.prompt && r.n_prompt_ids == 3 && r.prompt_ids[2] == 151643 &&
              r.logprobs && r.top_logprobs == 0,
          "ids prompt, logprobs 0 asks for the chosen token only");
    lm_chat_request_free(&r);
    const char *b3 = "{\"prompt\":[\"one\"]}";
    st = lm_completion_request_parse(b3, strlen(b3), &r, &e);
    CHECK(st == LM_OK && r.prompt && !strcmp(r.prompt, "one") && !r.logprobs,
          "a batch of one string");
    lm_chat_request_free(&r);
    const char *b4 = "{\"prompt\":[[5,6]],\"echo\":false,\"suffix\":\"\",\"best_of\":1}";
    st = lm_completion_request_parse(b4, strlen(b4), &r, &e);
    CHECK(st == LM_OK && r.n_prompt_ids == 2 && r.prompt_ids[1] == 6,
          "a batch of one id list; neutral echo/suffix");
    lm_chat_request_free(&r);

    static const struct err_case cases[] = {
        {"{}", "prompt", "prompt is required"},
        {"{\"prompt\":\"\"}", "prompt", "must not be empty"},
        {"{\"prompt\":[]}", "prompt", "must not be empty"},
        {"{\"prompt\":[1,-2]}", "prompt", "prompt[1] must be a token id"},
        {"{\"prompt\":[1,\"a\"]}", "prompt", "prompt[1] must be a token id"},
        {"{\"prompt\":[\"a\",\"b\"]}", "prompt", "one prompt per request"},
        {"{\"prompt\":7}", "prompt", "must be a string or an array"},
        {"{\"prompt\":\"x\",\"echo\":true}", "echo", "echo is not supported"},
        {"{\"prompt\":\"x\",\"suffix\":\"end\"}", "suffix", "suffix is not supported"},
        {"{\"prompt\":\"x\",\"best_of\":3}", "best_of", "best_of"},
        {"{\"prompt\":\"x\",\"logprobs\":21}", "logprobs", "[0, 20]"},
        {"{\"prompt\":\"x\",\"logprobs\":true}", "logprobs", "must be an integer"},
        {"{\"prompt\":\"x\",\"n\":10}", "n", "at most 8"},
        {"{\"prompt\":\"x\",\"tools\":[]}", "tools", "not supported"},
    };
    check_errors(false, cases, sizeof cases / sizeof cases[0]);
}

static json_t *parse_sse_one(const struct lm_buf *b) {
    CHECK(b->len > 8 && !strncmp(b->p, "data: ", 6) && !strcmp(b->p + b->len - 2, "\n\n"),
          "SSE framing");
    return json_loadb(b->p + 6, b->len - 8, 0, NULL);
}

static void test_responses(const struct lm_tokenizer *tok) {
    /* two tokens whose text we know: "Hello" and "!" */
    struct lm_ids ids = {0};
    lm_tokenizer_encode(tok, "Hello!", 6, 0, &ids);
    CHECK(ids.n == 2, "'Hello!' is two tokens (%zu)", ids.n);
    struct lm_token_logprob lp[2] = {{.id = ids.v[0], .logprob = -0.25f, .n_top = 2},
                                     {.id = ids.v[1], .logprob = -INFINITY, .n_top = 0}};
    lp[0].top_id[0] = ids.v[0], lp[0].top_logprob[0] = -0.25f;
    lp[0].top_id[1] = ids.v[1], lp[0].top_logprob[1] = -2.5f;
    struct lm_openai_meta meta = {"chatcmpl-x", 1700000000, "tiny", LM_API_CHAT, tok};
    struct lm_openai_choice ch[2] = {
        {.text = "Hello!",
         .len = 6,
         .reasoning = "why",
         .reasoning_len = 3,
         .finish_reason = "stop",
         .logprobs = lp,
         .n_logprobs = 2},
        {.text = "", .len = 0, .reasoning = "", .reasoning_len = 0, .finish_reason = "length"},
    };
    struct lm_openai_usage u = {10, 7, 4};
    char *s = lm_openai_response(&meta, ch, 2, &u);
    json_t *j = json_loads(s, 0, NULL);
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0),
           *c1 = json_array_get(json_object_get(j, "choices"), 1);
    json_t *m0 = json_object_get(c0, "message"), *m1 = json_object_get(c1, "message");
    CHECK(!strcmp(jstr(json_object_get(j, "object")), "chat.completion") &&
              json_integer_value(json_object_get(c1, "index")) == 1 &&
              !strcmp(jstr(json_object_get(m0, "reasoning_content")), "why") &&
              !strcmp(jstr(json_object_get(m0, "content")), "Hello!") &&
              json_is_null(json_object_get(m1, "reasoning_content")) &&
              json_is_null(json_object_get(c1, "logprobs")) &&
              !strcmp(jstr(json_object_get(c1, "finish_reason")), "length"),
          "chat choices: %s", s);
    json_t *content = json_object_get(json_object_get(c0, "logprobs"), "content");
    json_t *t0 = json_array_get(content, 0), *t1 = json_array_get(content, 1);
    json_t *bytes = json_object_get(t0, "bytes");
    CHECK(json_array_size(content) == 2 && !strcmp(jstr(json_object_get(t0, "token")), "Hello") &&
              json_real_value(json_object_get(t0, "logprob")) == -0.25 &&
              json_array_size(bytes) == 5 && json_integer_value(json_array_get(bytes, 0)) == 'H' &&
              json_array_size(json_object_get(t0, "top_logprobs")) == 2 &&
              !strcmp(jstr(json_object_get(json_array_get(json_object_get(t0, "top_logprobs"), 1),
                                           "token")),
                      "!") &&
              json_real_value(json_object_get(t1, "logprob")) == -9999.0,
          "chat logprobs: %s", s);
    json_t *usage = json_object_get(j, "usage");
    CHECK(json_integer_value(json_object_get(usage, "total_tokens")) == 17 &&
              json_integer_value(json_object_get(json_object_get(usage, "prompt_tokens_details"),
                                                 "cached_tokens")) == 4,
          "usage with cached_tokens");
    json_decref(j);
    free(s);

    /* completions: text_completion with tokens / token_logprobs / top_logprobs / text_offset */
    struct lm_openai_meta cm = {"cmpl-x", 1700000000, "tiny", LM_API_COMPLETIONS, tok};
    struct lm_openai_choice cc = {
        .text = "Hello!", .len = 6, .finish_reason = "length", .logprobs = lp, .n_logprobs = 2};
    struct lm_openai_usage cu = {3, 2, -1};
    s = lm_openai_response(&cm, &cc, 1, &cu);
    j = json_loads(s, 0, NULL);
    c0 = json_array_get(json_object_get(j, "choices"), 0);
    json_t *l = json_object_get(c0, "logprobs");
    json_t *top1 = json_array_get(json_object_get(l, "top_logprobs"), 1);
    CHECK(!strcmp(jstr(json_object_get(j, "object")), "text_completion") &&
              !strcmp(jstr(json_object_get(c0, "text")), "Hello!") &&
              !strcmp(jstr(json_array_get(json_object_get(l, "tokens"), 1)), "!") &&
              json_real_value(json_array_get(json_object_get(l, "token_logprobs"), 0)) == -0.25 &&
              json_integer_value(json_array_get(json_object_get(l, "text_offset"), 1)) == 5 &&
              json_object_size(top1) == 1 &&
              json_real_value(json_object_get(top1, "!")) == -9999.0 &&
              json_object_size(json_array_get(json_object_get(l, "top_logprobs"), 0)) == 2 &&
              !json_object_get(json_object_get(j, "usage"), "prompt_tokens_details"),
          "completion object: %s", s);
    json_decref(j);
    free(s);

    /* chunks */
    struct lm_buf b = {0};
    lm_openai_chunk(&b, &meta,
                    &(struct lm_openai_delta){.index = 2, .reasoning = "r", .reasoning_len = 1},
                    true);
    j = parse_sse_one(&b);
    c0 = json_array_get(json_object_get(j, "choices"), 0);
    json_t *delta = json_object_get(c0, "delta");
    CHECK(j && json_integer_value(json_object_get(c0, "index")) == 2 &&
              !strcmp(jstr(json_object_get(delta, "reasoning_content")), "r") &&
              !json_object_get(delta, "content") && json_is_null(json_object_get(j, "usage")) &&
              json_is_null(json_object_get(c0, "finish_reason")),
          "reasoning chunk: %s", b.p);
    json_decref(j);
    lm_buf_reset(&b);
    lm_openai_chunk(&b, &cm,
                    &(struct lm_openai_delta){.content = "ab", .len = 2, .finish_reason = "stop"},
                    false);
    j = parse_sse_one(&b);
    c0 = json_array_get(json_object_get(j, "choices"), 0);
    CHECK(j && !strcmp(jstr(json_object_get(j, "object")), "text_completion") &&
              !strcmp(jstr(json_object_get(c0, "text")), "ab") &&
              !strcmp(jstr(json_object_get(c0, "finish_reason")), "stop") &&
              !json_object_get(j, "usage"),
          "completion chunk: %s", b.p);
    json_decref(j);
    lm_buf_reset(&b);
    lm_openai_usage_chunk(&b, &cm, &(struct lm_openai_usage){3, 5, 0});
    j = parse_sse_one(&b);
    CHECK(j && json_array_size(json_object_get(j, "choices")) == 0 &&
              json_integer_value(json_object_get(json_object_get(j, "usage"), "total_tokens")) == 8,
          "usage chunk: %s", b.p);
    json_decref(j);
    lm_buf_free(&b);
    lm_ids_free(&ids);
}

static void test_capabilities(void) {
    struct lm_api_error e;
    CHECK(lm_api_check_task(LM_TASK_TEXT_GENERATION | LM_TASK_TEXT_CONVERSATION,
                            LM_TASK_TEXT_CONVERSATION, "m", &e) == LM_OK,
          "both declared");
    lm_status st = lm_api_check_task(LM_TASK_TEXT_GENERATION, lm_api_endpoint_task(LM_API_CHAT),
                                     "base-model", &e);
    CHECK(st != LM_OK && e.status == 400 && e.code && !strcmp(e.code, "model_not_capable") &&
              strstr(e.message, "does not support the task text_conversation") &&
              strstr(e.message, "declares: text_generation"),
          "chat on a generation-only model: %s", e.message);
    st = lm_api_check_task(0, lm_api_endpoint_task(LM_API_COMPLETIONS), "m", &e);
    CHECK(st != LM_OK && strstr(e.message, "text_generation") &&
              strstr(e.message, "declares: none"),
          "%s", e.message);
    char *s = lm_openai_models("tiny", 5, 256, LM_TASK_TEXT_GENERATION | LM_TASK_TEXT_CONVERSATION);
    json_t *j = json_loads(s, 0, NULL);
    json_t *caps = json_object_get(json_array_get(json_object_get(j, "data"), 0), "capabilities");
    CHECK(json_array_size(caps) == 2 && !strcmp(jstr(json_array_get(caps, 0)), "text_generation") &&
              !strcmp(jstr(json_array_get(caps, 1)), "text_conversation"),
          "/v1/models capabilities: %s", s);
    json_decref(j);
    free(s);
    s = lm_openai_models("tiny", 5, 256, LM_TASK_TEXT_GENERATION);
    j = json_loads(s, 0, NULL);
    caps = json_object_get(json_array_get(json_object_get(j, "data"), 0), "capabilities");
    CHECK(json_array_size(caps) == 1, "one capability: %s", s);
    json_decref(j);
    free(s);
}

static void sha_of(const void *p, size_t n, char hex[65]) {
    unsigned char d[32];
    unsigned dn;
    EVP_Digest(p, n, d, &dn, EVP_sha256(), NULL);
    for (int i = 0; i < 32; i++)
        sprintf(hex + 2 * i, "%02x", d[i]);
}

static void test_records(void) {
    char hex[LM_SHA256_HEX_LEN];
    lm_sha256_hex("abc", 3, hex); /* FIPS 180-2 test vector */
    CHECK(!strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
          "sha256(abc) %s", hex);
    lm_sha256_hex("", 0, hex);
    CHECK(!strcmp(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
          "sha256('') %s", hex);
    const int32_t ids[] = {1, 258, -1, 151645};
    const unsigned char le[] = {1, 0, 0, 0, 2, 1, 0, 0, 255, 255, 255, 255, 0x5d, 0x50, 0x02, 0};
    char want[65];
    sha_of(le, sizeof le, want);
    lm_sha256_ids_hex(ids, 4, hex);
    CHECK(!strcmp(hex, want), "ids hash over little-endian int32: %s vs %s", hex, want);

    struct lm_chat_msg msgs[3] = {{LM_ROLE_SYSTEM, "sys", NULL, false},
                                  {LM_ROLE_USER, "q\xc3\xa9", NULL, false},
                                  {LM_ROLE_ASSISTANT, "", "thought", false}};
    struct lm_record r = {.id = "chatcmpl-a",
                          .x_request_id = "a",
                          .conversation_id = NULL,
                          .phase = "profiling",
                          .turn = "1",
                          .model = "tiny",
                          .endpoint = "/v1/chat/completions",
                          .http_status = 200,
                          .t_arrival_ms = 1000.0,
                          .t_scheduled_ms = 1000.25,
                          .t_first_token_ms = 1003.5,
                          .t_finish_ms = 1010.0,
                          .prompt_tokens = 41,
                          .cached_tokens = 32,
                          .completion_tokens = 16,
                          .spec_draft_tokens = 20,
                          .spec_accepted_tokens = 12,
                          .finish_reason = "length",
                          .messages = msgs,
                          .n_messages = 3,
                          .prompt_ids = ids,
                          .n_prompt_ids = 4,
                          .completion_ids = ids + 1,
                          .n_completion_ids = 2,
                          .completion_text = "ab",
                          .completion_text_len = 2};
    char *line = lm_record_json(&r);
    json_t *j = json_loads(line, 0, NULL);
    CHECK(j && !strchr(line, '\n'), "one line of JSON: %s", line);
    static const char *const k_fields[] = {"id",
                                           "x_request_id",
                                           "conversation_id",
                                           "phase",
                                           "turn",
                                           "model",
                                           "endpoint",
                                           "http_status",
                                           "t_arrival_ms",
                                           "t_scheduled_ms",
                                           "t_first_token_ms",
                                           "t_finish_ms",
                                           "queue_ms",
                                           "prefill_ms",
                                           "decode_ms",
                                           "total_ms",
                                           "prompt_tokens",
                                           "cached_tokens",
                                           "completion_tokens",
                                           "spec_draft_tokens",
                                           "spec_accepted_tokens",
                                           "finish_reason",
                                           "roles",
                                           "content_sha256",
                                           "prompt_ids_sha256",
                                           "completion_ids_sha256",
                                           "completion_text_sha256"};
    CHECK(json_object_size(j) == sizeof k_fields / sizeof k_fields[0],
          "exactly the contract's fields (%zu)", json_object_size(j));
    for (size_t i = 0; i < sizeof k_fields / sizeof k_fields[0]; i++)
        CHECK(json_object_get(j, k_fields[i]) != NULL, "field %s", k_fields[i]);
    CHECK(json_is_null(json_object_get(j, "conversation_id")) &&
              json_integer_value(json_object_get(j, "turn")) == 1 &&
              json_integer_value(json_object_get(j, "http_status")) == 200,
          "nulls and ints");
    CHECK(json_integer_value(json_object_get(j, "spec_draft_tokens")) == 20 &&
              json_integer_value(json_object_get(j, "spec_accepted_tokens")) == 12,
          "speculative counts");
    CHECK(fabs(json_number_value(json_object_get(j, "queue_ms")) - 0.25) < 1e-9 &&
              fabs(json_number_value(json_object_get(j, "prefill_ms")) - 3.25) < 1e-9 &&
              fabs(json_number_value(json_object_get(j, "decode_ms")) - 6.5) < 1e-9 &&
              fabs(json_number_value(json_object_get(j, "total_ms")) - 10.0) < 1e-9,
          "derived durations: %s", line);
    json_t *roles = json_object_get(j, "roles"), *hashes = json_object_get(j, "content_sha256");
    sha_of("q\xc3\xa9", 3, want);
    CHECK(json_array_size(roles) == 3 && !strcmp(jstr(json_array_get(roles, 0)), "system") &&
              !strcmp(jstr(json_array_get(roles, 2)), "assistant") &&
              !strcmp(jstr(json_array_get(hashes, 1)), want),
          "roles and per-message hashes");
    CHECK(!strcmp(jstr(json_array_get(hashes, 2)),
                  "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
          "empty content hashes as the empty string");
    lm_sha256_ids_hex(ids, 4, hex);
    CHECK(!strcmp(jstr(json_object_get(j, "prompt_ids_sha256")), hex), "prompt ids hash");
    sha_of("ab", 2, want);
    CHECK(!strcmp(jstr(json_object_get(j, "completion_text_sha256")), want),
          "completion text hash");
    CHECK(!strstr(line, "sys\"") && !strstr(line, "thought"), "no raw text in the record");
    json_decref(j);
    free(line);

    /* an error before anything ran: nulls */
    struct lm_record e = {.id = "chatcmpl-b",
                          .endpoint = "/v1/chat/completions",
                          .http_status = 400,
                          .turn = "x1",
                          .t_arrival_ms = 5,
                          .t_scheduled_ms = -1,
                          .t_first_token_ms = -1,
                          .t_finish_ms = 6,
                          .prompt_tokens = -1,
                          .cached_tokens = -1,
                          .completion_tokens = -1,
                          .spec_draft_tokens = -1,
                          .spec_accepted_tokens = -1};
    line = lm_record_json(&e);
    j = json_loads(line, 0, NULL);
    CHECK(json_is_null(json_object_get(j, "queue_ms")) &&
              json_is_null(json_object_get(j, "prefill_ms")) &&
              json_number_value(json_object_get(j, "total_ms")) == 1 &&
              json_is_null(json_object_get(j, "turn")) &&
              json_is_null(json_object_get(j, "roles")) &&
              json_is_null(json_object_get(j, "prompt_ids_sha256")) &&
              json_is_null(json_object_get(j, "completion_tokens")) &&
              json_is_null(json_object_get(j, "spec_draft_tokens")) &&
              json_is_null(json_object_get(j, "spec_accepted_tokens")),
          "error record: %s", line);
    json_decref(j);
    free(line);

    /* the file: two appends, two lines */
    char path[] = "/tmp/lm_test_records_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    close(fd);
    struct lm_records *rs = NULL;
    CHECK(lm_records_open(path, &rs) == LM_OK, "open records");
    CHECK(lm_records_write(rs, &r) == LM_OK && lm_records_write(rs, &e) == LM_OK, "write records");
    lm_records_close(rs);
    FILE *f = fopen(path, "r");
    int lines = 0;
    char buf[8192];
    while (f && fgets(buf, sizeof buf, f)) {
        json_t *x = json_loads(buf, 0, NULL);
        lines += x != NULL;
        json_decref(x);
    }
    if (f) fclose(f);
    CHECK(lines == 2, "two JSON lines in the file (%d)", lines);
    unlink(path);
    CHECK(lm_records_open("/nonexistent-dir/x.jsonl", &rs) == LM_ERR_IO &&
              strstr(lm_error_message(), "/nonexistent-dir"),
          "unopenable records path: %s", lm_error_message());
}

/* Value of the exposition line that starts with `prefix ` (-1 when absent). */
static double metric(const char *text, const char *prefix) {
    size_t n = strlen(prefix);
    for (const char *p = text; p && *p;) {
        if (!strncmp(p, prefix, n) && p[n] == ' ') return strtod(p + n + 1, NULL);
        p = strchr(p, '\n');
        if (p) p++;
    }
    return -1;
}

static void test_metrics(void) {
    struct lm_metrics *m = lm_metrics_create();
    lm_metrics_count_request(m, "/v1/chat/completions", 200);
    lm_metrics_count_request(m, "/v1/chat/completions", 200);
    lm_metrics_count_request(m, "/v1/chat/completions", 400);
    lm_metrics_observe(m, &(struct lm_metrics_request){.prompt_tokens = 10,
                                                       .completion_tokens = 5,
                                                       .cached_tokens = 4,
                                                       .queue_s = 0.001,
                                                       .ttft_s = 0.03,
                                                       .decode_s = 0.02,
                                                       .latency_s = 0.05});
    lm_metrics_observe(m, &(struct lm_metrics_request){.prompt_tokens = 7,
                                                       .completion_tokens = 1,
                                                       .cached_tokens = 0,
                                                       .queue_s = 0.2,
                                                       .ttft_s = 3.0,
                                                       .decode_s = 0,
                                                       .latency_s = 3.0});
    struct lm_buf out = {0};
    lm_metrics_render(m, &(struct lm_metrics_gauges){2, 3, 10, 5, 90, 7, 20, 12}, &out);
    const char *t = out.p;
    CHECK(metric(t, "lumen_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"}") ==
                  2 &&
              metric(t, "lumen_requests_total{endpoint=\"/v1/chat/completions\",status=\"400\"}") ==
                  1,
          "requests by status");
    CHECK(metric(t, "lumen_prompt_tokens_total") == 17 &&
              metric(t, "lumen_generation_tokens_total") == 6 &&
              metric(t, "lumen_cached_prompt_tokens_total") == 4,
          "token counters");
    CHECK(metric(t, "lumen_time_to_first_token_seconds_bucket{le=\"0.02\"}") == 0 &&
              metric(t, "lumen_time_to_first_token_seconds_bucket{le=\"0.04\"}") == 1 &&
              metric(t, "lumen_time_to_first_token_seconds_bucket{le=\"2.5\"}") == 1 &&
              metric(t, "lumen_time_to_first_token_seconds_bucket{le=\"5\"}") == 2 &&
              metric(t, "lumen_time_to_first_token_seconds_bucket{le=\"+Inf\"}") == 2 &&
              metric(t, "lumen_time_to_first_token_seconds_count") == 2 &&
              fabs(metric(t, "lumen_time_to_first_token_seconds_sum") - 3.03) < 1e-9,
          "TTFT histogram is cumulative");
    /* 5 tokens in 0.02 s of decode: 4 gaps of 0.005; a 1-token request has no gap */
    CHECK(metric(t, "lumen_inter_token_latency_seconds_count") == 4 &&
              metric(t, "lumen_inter_token_latency_seconds_bucket{le=\"0.0025\"}") == 0 &&
              metric(t, "lumen_inter_token_latency_seconds_bucket{le=\"0.005\"}") == 4 &&
              fabs(metric(t, "lumen_inter_token_latency_seconds_sum") - 0.02) < 1e-9,
          "ITL histogram");
    CHECK(metric(t, "lumen_num_requests_running") == 2 &&
              metric(t, "lumen_num_requests_waiting") == 3 &&
              metric(t, "lumen_kv_cache_blocks_used") == 10 &&
              metric(t, "lumen_kv_cache_blocks_cached") == 5 &&
              metric(t, "lumen_kv_cache_blocks_free") == 90,
          "gauges");
    CHECK(metric(t, "lumen_spec_decode_num_drafts_total") == 7 &&
              metric(t, "lumen_spec_decode_num_draft_tokens_total") == 20 &&
              metric(t, "lumen_spec_decode_num_accepted_tokens_total") == 12,
          "speculative decoding counters");
    lm_buf_reset(&out);
    lm_metrics_render(m, &(struct lm_metrics_gauges){0, 0, -1, -1, -1, 0, 0, 0}, &out);
    CHECK(metric(out.p, "lumen_kv_cache_blocks_used") == -1 && !strstr(out.p, "kv_cache"),
          "unknown gauges left out");

    /* promtool, when installed (Debian's prometheus package) */
    if (system("command -v promtool >/dev/null 2>&1") == 0) {
        char path[] = "/tmp/lm_test_metrics_XXXXXX";
        int fd = mkstemp(path);
        lm_buf_reset(&out);
        lm_metrics_render(m, &(struct lm_metrics_gauges){2, 3, 10, 5, 90, 7, 20, 12}, &out);
        CHECK(fd >= 0 && write(fd, out.p, out.len) == (ssize_t)out.len, "write metrics");
        close(fd);
        char cmd[256];
        snprintf(cmd, sizeof cmd, "promtool check metrics < %s 2>&1", path);
        FILE *pp = popen(cmd, "r");
        char msg[4096] = "";
        size_t got = pp ? fread(msg, 1, sizeof msg - 1, pp) : 0;
        msg[got] = 0;
        int rc = pp ? pclose(pp) : -1;
        CHECK(rc == 0 && got == 0, "promtool check metrics: rc %d: %s", rc, msg);
        unlink(path);
    } else {
        fprintf(stderr, "test_openai: promtool not installed; `promtool check metrics` skipped\n");
    }
    lm_buf_free(&out);
    lm_metrics_destroy(m);
}

static void test_tokenize(struct lm_model *m) {
    const struct lm_tokenizer *tok = lm_model_tokenizer(m);
    unsigned tasks = lm_model_tasks(m);
    char *out = NULL;
    struct lm_api_error e;
    const char *text = "Hello world, <|im_start|>user\n\xc3\xa7"
                       "a va?";
    json_t *req = json_pack("{s:s}", "prompt", text);
    char *body = json_dumps(req, JSON_COMPACT);
    lm_status st = lm_openai_tokenize(m, tasks, body, strlen(body), 4096, &out, &e);
    struct lm_ids want = {0};
    lm_tokenizer_encode(tok, text, strlen(text), 0, &want);
    json_t *j = out ? json_loads(out, 0, NULL) : NULL;
    json_t *toks = json_object_get(j, "tokens");
    bool same = json_array_size(toks) == want.n;
    for (size_t i = 0; same && i < want.n; i++)
        same = json_integer_value(json_array_get(toks, i)) == want.v[i];
    CHECK(st == LM_OK && same &&
              json_integer_value(json_object_get(j, "count")) == (json_int_t)want.n &&
              json_integer_value(json_object_get(j, "max_model_len")) == 4096,
          "/tokenize prompt: %s", out ? out : e.message);

    /* /detokenize of those ids gives the text back (special tokens kept) */
    json_t *dreq = json_pack("{s:O}", "tokens", toks);
    char *dbody = json_dumps(dreq, JSON_COMPACT);
    char *dout = NULL;
    st = lm_openai_detokenize(m, dbody, strlen(dbody), &dout, &e);
    json_t *dj = dout ? json_loads(dout, 0, NULL) : NULL;
    CHECK(st == LM_OK && !strcmp(jstr(json_object_get(dj, "prompt")), text), "/detokenize: %s",
          dout ? dout : e.message);
    json_decref(dj);
    json_decref(dreq);
    free(dbody);
    free(dout);
    json_decref(j);
    json_decref(req);
    free(body);
    free(out);
    lm_ids_free(&want);

    /* messages: the chat template + the tokenizer, with and without the generation prompt */
    for (int agp = 0; agp < 2; agp++) {
        struct lm_chat_msg msgs[2] = {{LM_ROLE_SYSTEM, "Be brief.", NULL, false},
                                      {LM_ROLE_USER, "Hi!", NULL, false}};
        struct lm_chat_opts o = {.add_generation_prompt = agp, .enable_thinking = 0};
        struct lm_buf rendered = {0};
        lm_qwen3_render_chat(msgs, 2, &o, &rendered);
        lm_tokenizer_encode(tok, rendered.p, rendered.len, 0, &want);
        char mb[512];
        snprintf(
            mb, sizeof mb,
            "{\"messages\":[{\"role\":\"system\",\"content\":\"Be "
            "brief.\"},{\"role\":\"user\",\"content\":\"Hi!\"}],"
            "\"add_generation_prompt\":%s,\"chat_template_kwargs\":{\"enable_thinking\":false}}",
            agp ? "true" : "false");
        out = NULL;
        st = lm_openai_tokenize(m, tasks, mb, strlen(mb), 4096, &out, &e);
        j = out ? json_loads(out, 0, NULL) : NULL;
        toks = json_object_get(j, "tokens");
        same = json_array_size(toks) == want.n;
        for (size_t i = 0; same && i < want.n; i++)
            same = json_integer_value(json_array_get(toks, i)) == want.v[i];
        CHECK(st == LM_OK && same, "/tokenize messages (add_generation_prompt %d): %s", agp,
              out ? out : e.message);
        json_decref(j);
        free(out);
        lm_ids_free(&want);
        lm_buf_free(&rendered);
    }
    /* a model that does not converse gets 400 for messages */
    const char *mb = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}";
    out = NULL;
    st = lm_openai_tokenize(m, LM_TASK_TEXT_GENERATION, mb, strlen(mb), 4096, &out, &e);
    CHECK(st != LM_OK && e.status == 400 && !strcmp(e.code ? e.code : "", "model_not_capable"),
          "messages need the task");

    static const char *const bad_tok[] = {
        "{}", "{\"prompt\":5}", "{\"prompt\":\"a\",\"messages\":[]}", "[", "{\"messages\":[]}"};
    for (size_t i = 0; i < sizeof bad_tok / sizeof bad_tok[0]; i++) {
        out = NULL;
        st = lm_openai_tokenize(m, tasks, bad_tok[i], strlen(bad_tok[i]), 4096, &out, &e);
        CHECK(st != LM_OK && e.status == 400 && !out, "/tokenize %s: %d", bad_tok[i], e.status);
    }
    static const char *const bad_detok[] = {"{}",
                                            "{\"tokens\":5}",
                                            "{\"tokens\":[1,-1]}",
                                            "{\"tokens\":[1,\"a\"]}",
                                            "{\"tokens\":[151936]}",
                                            "nope"};
    for (size_t i = 0; i < sizeof bad_detok / sizeof bad_detok[0]; i++) {
        out = NULL;
        st = lm_openai_detokenize(m, bad_detok[i], strlen(bad_detok[i]), &out, &e);
        CHECK(st != LM_OK && e.status == 400 && !out, "/detokenize %s: %d %s", bad_detok[i],
              e.status, e.message);
    }

    /* completions prompts: ids are checked against the vocabulary; default max_tokens 16 */
    struct lm_chat_request r;
    const char *cb = "{\"prompt\":[1,2,151936]}";
    lm_completion_request_parse(cb, strlen(cb), &r, &e);
    struct lm_ids ids = {0};
    int mt = 0;
    st = lm_chat_request_prompt(m, &r, 4096, &ids, &mt, NULL, &e);
    CHECK(st != LM_OK && e.status == 400 && strstr(e.message, "prompt[2] is 151936"),
          "id past the vocabulary: %s", e.message);
    lm_chat_request_free(&r);
    lm_ids_free(&ids);
    cb = "{\"prompt\":\"Once upon a time\"}";
    lm_completion_request_parse(cb, strlen(cb), &r, &e);
    st = lm_chat_request_prompt(m, &r, 4096, &ids, &mt, NULL, &e);
    lm_tokenizer_encode(tok, "Once upon a time", 16, 0, &want);
    CHECK(st == LM_OK && mt == 16 && ids.n == want.n &&
              !memcmp(ids.v, want.v, want.n * sizeof *want.v),
          "string prompt tokenized as the tokenizer does, default max_tokens 16 (%d)", mt);
    lm_ids_free(&ids);
    st = lm_chat_request_prompt(m, &r, (int)want.n + 5, &ids, &mt, NULL, &e);
    CHECK(st == LM_OK && mt == 5, "default max_tokens shrinks to the room left: %d", mt);
    lm_chat_request_free(&r);
    lm_ids_free(&ids);
    lm_ids_free(&want);
}

/* The "model" field (lm_api_check_model) and GET /v1/models/{id}'s object: OpenAI's and vLLM's
 * 404 written out here. */
static void test_model_check(void) {
    struct lm_api_error e;
    CHECK(lm_api_check_model("tiny-qwen3", NULL, &e) == LM_OK &&
              lm_api_check_model("tiny-qwen3", "", &e) == LM_OK &&
              lm_api_check_model("tiny-qwen3", "tiny-qwen3", &e) == LM_OK,
          "absent, empty or the served id is accepted");
    CHECK(lm_api_check_model("tiny-qwen3", "gpt-4", &e) != LM_OK && e.status == 404, "gpt-4: 404");
    char *j = lm_openai_error_json(&e);
    CHECK(!strcmp(j,
                  "{\"error\":{\"message\":\"The model `gpt-4` does not exist.\",\"type\":"
                  "\"invalid_request_error\",\"param\":\"model\",\"code\":\"model_not_found\"}}"),
          "model_not_found JSON: %s", j);
    free(j);
    CHECK(lm_api_check_model("tiny-qwen3", "tiny-qwen3.gguf", &e) != LM_OK, "no other spelling");
    j = lm_openai_model("tiny-qwen3", 1700000000, 4096, LM_TASK_TEXT_GENERATION);
    json_t *o = json_loads(j, 0, NULL);
    CHECK(o && !strcmp(jstr(json_object_get(o, "id")), "tiny-qwen3") &&
              !strcmp(jstr(json_object_get(o, "object")), "model") &&
              json_integer_value(json_object_get(o, "max_model_len")) == 4096 &&
              json_array_size(json_object_get(o, "capabilities")) == 1,
          "model object: %s", j);
    json_decref(o);
    free(j);
}

/* A NUL character (\u0000) in any string of a body: 400 naming the field, for both endpoints. */
static void test_nul(void) {
    static const struct {
        bool chat;
        const char *body, *param;
    } cases[] = {
        {true, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}",
         "messages[0].content"},
        {true,
         "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"\\u0000\"}]}"
         "]}",
         "messages[0].content[0].text"},
        {true,
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"ok\",\"a\\u0000\"]}",
         "stop[1]"},
        {true, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"model\":\"m\\u0000\"}",
         "model"},
        {false, "{\"prompt\":\"\\u0000\"}", "prompt"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct lm_chat_request r;
        struct lm_api_error e;
        const char *b = cases[i].body;
        lm_status st = cases[i].chat ? lm_chat_request_parse(b, strlen(b), &r, &e)
                                     : lm_completion_request_parse(b, strlen(b), &r, &e);
        CHECK(st != LM_OK && e.status == 400 && !strcmp(e.param, cases[i].param) &&
                  strstr(e.message, "NUL characters are not allowed") &&
                  !strstr(e.message, "JSON_ALLOW_NUL"),
              "%s: %d '%s' '%s'", b, e.status, e.param, e.message);
        CHECK(r.root == NULL, "nothing left to free");
    }
    struct lm_chat_request r;
    struct lm_api_error e;
    const char *key = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"a\\u0000\":1}";
    CHECK(lm_chat_request_parse(key, strlen(key), &r, &e) != LM_OK && e.status == 400 &&
              strstr(e.message, "NUL characters are not allowed"),
          "NUL in a key: %s", e.message);
}

/* lm_gate_check_head: the verdicts written out here for each kind of head. */
static void test_gate(void) {
    static const struct {
        const char *head;
        int want;
        const char *needle;
    } cases[] = {
        {"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", 0, NULL},
        {"\r\nPOST /v1/completions HTTP/1.0\r\nContent-Length: 12\r\n\r\n{\"prompt\":1}", 0, NULL},
        {"GET /health HTTP/1.1\r\nHost: x\r\n", -1, NULL},
        {"GET /hea", -1, NULL},
        {"GARBAGE\r\n\r\n", 400, "malformed request line \"GARBAGE\""},
        {"GET\r\n", 400, "malformed request line"},
        {"GET  /x HTTP/1.1\r\n\r\n", 400, "malformed request line"},
        {"GET /x HTTP/9.9\r\n\r\n", 505, "HTTP version HTTP/9.9 is not supported"},
        {"GET /x HTTP/1.1\r\nno colon here\r\n\r\n", 400, "malformed header line 1"},
        {"GET /x HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n", 400, "malformed header line 2"},
        {"POST /x HTTP/1.1\r\nContent-Length: 5\r\ncontent-length: 5\r\n\r\n", 400,
         "2 Content-Length headers; send exactly one"},
        {"POST /x HTTP/1.1\r\nContent-Length: abc\r\n\r\n", 400,
         "Content-Length \"abc\" is not a number"},
        {"POST /x HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400, "is not a number"},
        {"POST /x HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n", 413,
         "larger than the server's limit of 8388608 bytes"},
        {"POST /x HTTP/1.1\r\nContent-Length: 8388609\r\n\r\n", 413, "limit of 8388608 bytes"},
        {"POST /x HTTP/1.1\r\nContent-Length: 8388608\r\n\r\n", 0, NULL},
        {"POST /x HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400,
         "both Content-Length and Transfer-Encoding"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char msg[512] = "";
        int v = lm_gate_check_head(cases[i].head, strlen(cases[i].head), 8u << 20, msg, sizeof msg);
        CHECK(v == cases[i].want && (!cases[i].needle || strstr(msg, cases[i].needle)),
              "head %zu: %d '%s'", i, v, msg);
    }
    /* a head that reaches LM_GATE_MAX_HEAD bytes without its end: 431, complete or not */
    size_t n = LM_GATE_MAX_HEAD + 10;
    char *big = malloc(n + 1);
    memcpy(big, "GET / HTTP/1.1\r\nX-Big: ", 23);
    memset(big + 23, 'a', n - 23);
    big[n] = 0;
    char msg[512];
    int v = lm_gate_check_head(big, LM_GATE_MAX_HEAD, 8u << 20, msg, sizeof msg);
    CHECK(v == 431 && strstr(msg, "16384 bytes"), "oversized head: %d %s", v, msg);
    memcpy(big + n - 4, "\r\n\r\n", 4);
    v = lm_gate_check_head(big, n, 8u << 20, msg, sizeof msg);
    CHECK(v == 431, "oversized complete head: %d", v);
    free(big);
    CHECK(!strcmp(lm_gate_reason(431), "Request Header Fields Too Large") &&
              !strcmp(lm_gate_reason(505), "HTTP Version Not Supported"),
          "reason phrases");
}

/* A streamed completions chunk's logprobs.text_offset starts where the chunk's first token
 * starts in the whole completion (delta.text_offset). */
static void test_chunk_offsets(const struct lm_tokenizer *tok) {
    struct lm_openai_meta meta = {"cmpl-1", 1700000000, "m", LM_API_COMPLETIONS, tok};
    struct lm_token_logprob lp[2] = {{.id = 9707, .logprob = -1}, {.id = 11, .logprob = -2}};
    struct lm_buf b = {0};
    lm_openai_chunk(
        &b, &meta,
        &(struct lm_openai_delta){
            .content = "Hello,", .len = 6, .logprobs = lp, .n_logprobs = 2, .text_offset = 7},
        false);
    json_t *j = json_loads(b.p + 6, JSON_DISABLE_EOF_CHECK, NULL);
    json_t *offs = json_object_get(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs"),
        "text_offset");
    CHECK(json_array_size(offs) == 2 && json_integer_value(json_array_get(offs, 0)) == 7 &&
              json_integer_value(json_array_get(offs, 1)) == 12,
          "text_offset from the delta: %s", b.p);
    json_decref(j);
    lm_buf_free(&b);
}

int main(void) {
    test_chat_fields();
    test_completion_fields();
    test_capabilities();
    test_records();
    test_metrics();
    test_model_check();
    test_nul();
    test_gate();
    struct lm_model *m = NULL;
    struct lm_model_open_params p = lm_model_default_open_params();
    p.n_threads = 1;
    lm_status st = lm_model_open(TINY_MODEL, &p, &m);
    CHECK(st == LM_OK, "open the tiny model: %s", lm_error_message());
    if (m) {
        test_responses(lm_model_tokenizer(m));
        test_tokenize(m);
        test_chunk_offsets(lm_model_tokenizer(m));
        lm_model_close(m);
    }
    return check_exit("test_openai");
}
