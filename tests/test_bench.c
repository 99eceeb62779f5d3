/* test_bench.c: the profiler's parts that need no server: SSE parsing of bytes split anywhere,
 * chat.completion.chunk interpretation (TTFT, TTFO, usage, errors), percentiles against
 * hand-computed values (numpy's linear method), SHA-256 against FIPS 180-4's vectors, the
 * datasets (MT-Bench, Spec-Bench categories, ShareGPT selection and its ledger, synthetic
 * lengths, custom JSONL), conversation selection, per-token ITL with multi-token chunks, the
 * summary's counting, throughput, goodput and per-turn "alone" throughput, the JSONL writer,
 * and verification against hand-written server records (a tampered history, a missing record,
 * overlapping warmup, another run's records, the prompt-ids hash of a fixture conversation).
 * LM_LINK: lm_bench */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/file.h"
#include <openssl/sha.h>

#include "bench/client.h"
#include "bench/dataset.h"
#include "bench/digest.h"
#include "bench/prompt.h"
#include "bench/record.h"
#include "bench/replay.h"
#include "bench/report.h"
#include "bench/sse.h"
#include "bench/stats.h"
#include "bench/verify.h"
#include "check.h"

static bool near(double a, double b) {
    return fabs(a - b) <= 1e-9 * (1 + fabs(b));
}

/* ---- SSE framing ---- */

struct events {
    int n;
    char data[8][64];
};

static int collect(void *ctx, const char *data, size_t len) {
    struct events *e = ctx;
    if (e->n < 8) snprintf(e->data[e->n], sizeof e->data[0], "%.*s", (int)len, data);
    e->n++;
    return 0;
}

static void test_sse_framing(void) {
    /* "\r\n" split across feeds counts once; two data lines join with "\n"; comments and other
     * fields are ignored; "\r" alone ends a line; the last event has no closing blank line. */
    const char *parts[] = {": comment\r\ndata: a\r", "\ndata:b\r\n", "\r\nevent: x\nid: 7\ndata: c",
                           "\r\rdata: last"};
    struct lm_sse_parser p;
    lm_sse_init(&p);
    struct events e = {0};
    for (int i = 0; i < 4; i++)
        lm_sse_feed(&p, parts[i], strlen(parts[i]), collect, &e);
    CHECK(e.n == 2, "events before finish: %d", e.n);
    lm_sse_finish(&p, collect, &e);
    CHECK(e.n == 3, "events after finish: %d", e.n);
    CHECK(!strcmp(e.data[0], "a\nb"), "event 0 '%s'", e.data[0]);
    CHECK(!strcmp(e.data[1], "c"), "event 1 '%s'", e.data[1]);
    CHECK(!strcmp(e.data[2], "last"), "event 2 '%s'", e.data[2]);
    lm_sse_free(&p);
}

/* ---- a whole streamed chat response, split at every position ---- */

static const char *k_stream =
    "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,"
    "\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n"
    "data: "
    "{\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"hmm\"},\"finish_reason\":null}]}"
    "\r\n\r\n"
    "data: "
    "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"finish_reason\":null}]}\n\n"
    ": keep-alive\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\", "
    "w\\u00f6rld\"},\"finish_reason\":null}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n"
    "data: "
    "{\"choices\":[],\"usage\":{\"prompt_tokens\":17,\"completion_tokens\":3,\"total_tokens\":20}}"
    "\n\n"
    "data: [DONE]\n\n";

/* Offset just after the blank line that ends the event containing `needle`. */
static double event_end(const char *needle) {
    const char *p = strstr(k_stream, needle);
    const char *a = strstr(p, "\n\n"), *b = strstr(p, "\r\n\r\n");
    if (b && (!a || b < a)) return (double)(b - k_stream) + 2; /* the second "\r" ends the event */
    return (double)(a - k_stream) + 1;
}

static void check_stream_record(const struct lm_bench_record *r, const char *how, double ttft) {
    CHECK(r->error == LM_BENCH_ERR_NONE, "%s: error %s %s", how, lm_bench_error_name(r->error),
          r->error_message ? r->error_message : "");
    CHECK(r->n_chunks == 3, "%s: %zu content chunks (the role-only chunk must not count)", how,
          r->n_chunks);
    CHECK(r->content.p && !strcmp(r->content.p, "Hello, w\xc3\xb6rld"), "%s: content '%s'", how,
          r->content.p ? r->content.p : "");
    CHECK(r->reasoning.p && !strcmp(r->reasoning.p, "hmm"), "%s: reasoning", how);
    CHECK(r->output_tokens == 3 && r->input_tokens == 17, "%s: usage %ld %ld", how,
          r->output_tokens, r->input_tokens);
    CHECK(r->finish_reason && !strcmp(r->finish_reason, "length"), "%s: finish_reason", how);
    CHECK(r->done && r->n_events == 7, "%s: done %d events %zu", how, r->done, r->n_events);
    if (isfinite(ttft)) CHECK(near(r->ttft_ms, ttft), "%s: ttft %g want %g", how, r->ttft_ms, ttft);
}

static void test_stream_split(void) {
    size_t n = strlen(k_stream);
    /* byte by byte, with t_ms = the byte's offset: TTFT is the offset that completes the first
     * event with text (the reasoning chunk), latency the offset that completes [DONE] */
    struct lm_bench_record r = {0};
    struct lm_bench_stream s;
    lm_bench_stream_init(&s, &r);
    for (size_t i = 0; i < n; i++)
        lm_bench_stream_feed(&s, k_stream + i, 1, (double)i);
    lm_bench_stream_finish(&s, (double)n + 5);
    lm_bench_stream_free(&s);
    check_stream_record(&r, "bytewise", event_end("hmm"));
    CHECK(near(r.latency_ms, (double)n - 1), "latency %g want %zu", r.latency_ms, n - 1);
    CHECK(near(r.chunks[1].t_ms, event_end("Hello")) && near(r.chunks[2].t_ms, event_end("rld")),
          "chunk times %g %g", r.chunks[1].t_ms, r.chunks[2].t_ms);
    /* AIPerf ITL: (latency - TTFT) / (3 - 1) */
    CHECK(near(lm_bench_record_itl_ms(&r), (r.latency_ms - r.ttft_ms) / 2), "itl");
    CHECK(near(r.ttfo_ms, event_end("Hello")),
          "TTFO %g: the first content chunk, after the reasoning", r.ttfo_ms);
    CHECK(r.server_id && !strcmp(r.server_id, "x"), "server id from the chunks");
    CHECK(near(lm_bench_record_chunk_gap_ms(&r, 2), r.chunks[2].t_ms - r.chunks[1].t_ms), "gap");
    r.chunks[2].tokens = 4;
    CHECK(near(lm_bench_record_chunk_gap_ms(&r, 2), (r.chunks[2].t_ms - r.chunks[1].t_ms) / 4),
          "gap per token");
    lm_bench_record_free(&r);

    /* every two-piece split */
    int bad = 0;
    for (size_t cut = 0; cut <= n; cut++) {
        struct lm_bench_record q = {0};
        lm_bench_stream_init(&s, &q);
        lm_bench_stream_feed(&s, k_stream, cut, 1);
        lm_bench_stream_feed(&s, k_stream + cut, n - cut, 2);
        lm_bench_stream_finish(&s, 3);
        lm_bench_stream_free(&s);
        int before = g_check_failures;
        char how[32];
        snprintf(how, sizeof how, "cut %zu", cut);
        check_stream_record(&q, how, NAN);
        bad += g_check_failures != before;
        lm_bench_record_free(&q);
        if (bad > 3) break;
    }
}

static void feed_all(struct lm_bench_record *r, const char *text) {
    struct lm_bench_stream s;
    lm_bench_stream_init(&s, r);
    lm_bench_stream_feed(&s, text, strlen(text), 1);
    lm_bench_stream_finish(&s, 2);
    lm_bench_stream_free(&s);
}

static void test_stream_errors(void) {
    struct lm_bench_record r = {0};
    feed_all(&r, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {not json\n\n");
    CHECK(r.error == LM_BENCH_ERR_PARSE && strstr(r.error_message, "event 2"), "parse: %s",
          r.error_message ? r.error_message : "(none)");
    lm_bench_record_free(&r);

    feed_all(&r, "data: {\"error\":{\"message\":\"KV cache full\",\"type\":\"server_error\"}}\n\n"
                 "data: [DONE]\n\n");
    CHECK(r.error == LM_BENCH_ERR_STREAM && !strcmp(r.error_message, "KV cache full"),
          "stream error: %s", r.error_message ? r.error_message : "(none)");
    lm_bench_record_free(&r);

    /* cut short: no finish_reason, no [DONE] */
    feed_all(&r, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n");
    CHECK(r.error == LM_BENCH_ERR_PARSE && strstr(r.error_message, "[DONE]"), "cut short: %s",
          r.error_message ? r.error_message : "(none)");
    lm_bench_record_free(&r);

    /* a stream the server cut (shutdown): vLLM's wire word "abort" is recorded in lumen's */
    feed_all(&r,
             "data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":\"abort\"}]}\n\n"
             "data: [DONE]\n\n");
    CHECK(!r.error && r.finish_reason && !strcmp(r.finish_reason, "cancelled"),
          "abort read as cancelled: %s", r.finish_reason ? r.finish_reason : "(none)");
    lm_bench_record_free(&r);
    CHECK(!strcmp(lm_bench_finish_word("abort"), "cancelled") &&
              !strcmp(lm_bench_finish_word("cancelled"), "cancelled") &&
              !strcmp(lm_bench_finish_word("stop"), "stop") &&
              !strcmp(lm_bench_finish_word("length"), "length") && !lm_bench_finish_word(NULL),
          "lm_bench_finish_word");

    /* a role-only stream has no TTFT */
    feed_all(&r,
             "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"},\"finish_reason\":\"stop\"}]}"
             "\n\ndata: [DONE]\n\n");
    CHECK(!r.error && isnan(r.ttft_ms) && r.n_chunks == 0, "empty answer");
    CHECK(isnan(lm_bench_record_itl_ms(&r)), "no ITL without output");
    lm_bench_record_free(&r);

    /* a server that ignored "stream" */
    r.output_tokens = r.input_tokens = -1;
    const char *full =
        "{\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":\"hi\"},"
        "\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1}}";
    lm_bench_record_full_response(&r, full, strlen(full), 9);
    CHECK(!r.error && r.n_chunks == 1 && !strcmp(r.content.p, "hi") && r.output_tokens == 1,
          "full response");
    lm_bench_record_free(&r);
}

/* ---- statistics ---- */

static void test_stats(void) {
    /* numpy.percentile([1, 2, 3, 4], [50, 90, 95, 99]) = [2.5, 3.7, 3.85, 3.97] */
    double a[] = {4, NAN, 1, 3, 2};
    struct lm_bench_stats s;
    lm_bench_stats_compute(a, 5, &s);
    CHECK(s.n == 4, "n %zu (NAN skipped)", s.n);
    CHECK(near(s.p50, 2.5) && near(s.p90, 3.7) && near(s.p95, 3.85) && near(s.p99, 3.97),
          "p50 %g p90 %g p95 %g p99 %g", s.p50, s.p90, s.p95, s.p99);
    CHECK(near(s.min, 1) && near(s.max, 4) && near(s.mean, 2.5), "min/mean/max");
    CHECK(near(s.std, sqrt(1.25)), "std %g", s.std);
    CHECK(a[0] == 4 && a[2] == 1, "input untouched");
    /* numpy.percentile([15, 20, 35, 40, 50], 40) = 29, 90 -> 46 */
    double b[] = {50, 15, 40, 20, 35};
    double sorted[] = {15, 20, 35, 40, 50};
    CHECK(near(lm_bench_percentile_sorted(sorted, 5, 40), 29.0), "p40");
    lm_bench_stats_compute(b, 5, &s);
    CHECK(near(s.p90, 46.0) && near(s.p50, 35.0) && near(s.p99, 49.6), "p90 %g p99 %g", s.p90,
          s.p99);
    double one = 7;
    lm_bench_stats_compute(&one, 1, &s);
    CHECK(s.n == 1 && s.p99 == 7 && s.min == 7 && s.std == 0, "single sample");
    lm_bench_stats_compute(NULL, 0, &s);
    CHECK(s.n == 0 && isnan(s.p50), "empty sample");
}

/* ---- datasets ---- */

/* ---- SHA-256 ---- */

static void test_digest(void) {
    char hex[LM_SHA256_HEX];
    lm_bench_sha256_hex("abc", 3, hex); /* FIPS 180-4 example */
    CHECK(!strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
          "abc: %s", hex);
    lm_bench_sha256_hex(NULL, 0, hex);
    CHECK(!strcmp(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
          "empty: %s", hex);
    int32_t ids[] = {1, -2, 151645};
    unsigned char le[] = {1, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff, 0x5d, 0x50, 0x02, 0x00};
    char want[LM_SHA256_HEX];
    lm_bench_sha256_hex(le, sizeof le, want);
    lm_bench_sha256_ids(ids, 3, hex);
    CHECK(!strcmp(hex, want), "ids as little-endian int32");
    size_t size = 0;
    CHECK(lm_bench_sha256_file(LM_SOURCE_DIR "/data/mt_bench/question.jsonl", hex, &size) ==
                  LM_OK &&
              !strcmp(hex, "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7") &&
              size == 48929,
          "MT-Bench file hash (data/SOURCES.md): %s", hex);
}

/* ---- datasets ---- */

static struct lm_bench_prompt g_prompt;

static void write_file(const char *path, const char *text) {
    CHECK(lm_file_write(path, text, strlen(text)) == LM_OK, "write %s", path);
}

static const char *ledger_reason(const struct lm_bench_dataset *ds, const char *id) {
    size_t i;
    json_t *e;
    json_array_foreach(ds->ledger, i, e) {
        if (!strcmp(json_string_value(json_object_get(e, "id")), id)) {
            const char *r = json_string_value(json_object_get(e, "reason"));
            return r ? r : "selected";
        }
    }
    return "absent";
}

static void test_datasets(void) {
    struct lm_bench_dataset ds;
    lm_status st =
        lm_bench_dataset_load(&ds, "mt_bench", LM_SOURCE_DIR "/data/mt_bench/question.jsonl");
    CHECK(st == LM_OK, "load: %s", lm_error_message());
    CHECK(ds.n == 80 && ds.n_considered == 80 && json_array_size(ds.ledger) == 80,
          "%zu conversations", ds.n);
    CHECK(!strcmp(ds.sha256, "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7"),
          "sha256");
    size_t two = 0, writing = 0;
    for (size_t i = 0; i < ds.n; i++) {
        two += ds.convs[i].n_turns == 2 && ds.convs[i].turns[1][0];
        writing += ds.convs[i].category && !strcmp(ds.convs[i].category, "writing");
    }
    CHECK(two == 80 && writing == 10, "two-turn %zu, writing %zu", two, writing);
    if (ds.n == 80) {
        CHECK(!strcmp(ds.convs[0].id, "81") && !strcmp(ds.convs[79].id, "160"), "ids %s %s",
              ds.convs[0].id, ds.convs[79].id);
        CHECK(
            !strncmp(ds.convs[0].turns[0], "Compose an engaging travel blog post", 36) &&
                !strcmp(ds.convs[0].turns[1],
                        "Rewrite your previous response. Start every sentence with the letter A."),
            "question 81");
        CHECK(!ds.convs[0].answers[0] && !ds.convs[0].system, "no answers or system prompt");
    }
    lm_bench_dataset_free(&ds);

    st = lm_bench_dataset_load(&ds, "nope", "x");
    CHECK(st == LM_ERR_UNSUPPORTED && strstr(lm_error_message(), "nope"), "unknown name");
    lm_bench_dataset_free(&ds);

    /* Spec-Bench: 480 questions; a task filter (mt_bench = its first 80) and a category filter */
    struct lm_bench_dataset_opts o = lm_bench_dataset_default_opts();
    o.name = "spec_bench";
    o.path = LM_SOURCE_DIR "/data/spec_bench/question.jsonl";
    st = lm_bench_dataset_open(&ds, &o);
    size_t two_turn = 0;
    for (size_t i = 0; i < ds.n; i++)
        two_turn += ds.convs[i].n_turns == 2;
    CHECK(st == LM_OK && ds.n == 480 && two_turn == 80, "spec_bench %zu, two-turn %zu", ds.n,
          two_turn);
    CHECK(!strcmp(ds.sha256, "4b6d33e79484f9841c487ee87d1cf6aa8c6066f61d5d482ff09e5a007fafdf04"),
          "sha256");
    lm_bench_dataset_free(&ds);
    o.categories = "qa,mt_bench";
    st = lm_bench_dataset_open(&ds, &o);
    CHECK(st == LM_OK && ds.n == 160 && ds.n_considered == 480 &&
              json_integer_value(json_object_get(ds.rejected, "category")) == 320,
          "qa + mt_bench: %zu", ds.n);
    lm_bench_dataset_free(&ds);
    o.categories = "writing";
    st = lm_bench_dataset_open(&ds, &o);
    CHECK(st == LM_OK && ds.n == 10 && !strcmp(ds.convs[0].category, "writing"), "writing: %zu",
          ds.n);
    lm_bench_dataset_free(&ds);

    char path[] = "/tmp/lm_test_bench_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    write_file(
        path, "{\"question_id\": 1, \"turns\": [\"a\"]}\n\n{\"question_id\": 2, \"turns\": [3]}\n");
    st = lm_bench_dataset_load(&ds, "mt_bench", path);
    CHECK(st == LM_ERR_FORMAT && strstr(lm_error_message(), ":3: turns[0]"), "bad line: %s",
          lm_error_message());
    lm_bench_dataset_free(&ds);

    /* ShareGPT selection: one conversation per ledger reason, and the budget */
    const char *sg =
        "[{\"id\":\"gpt-first\",\"conversations\":[{\"from\":\"gpt\",\"value\":\"orphan\"},"
        "{\"from\":\"human\",\"value\":\"q1\"},{\"from\":\"gpt\",\"value\":\"a1\"},{\"from\":"
        "\"human\",\"value\":\"q2\"}]},"
        "{\"id\":\"one-turn\",\"conversations\":[{\"from\":\"human\",\"value\":\"q1\"},{\"from\":"
        "\"gpt\",\"value\":\"a1\"}]},"
        "{\"id\":\"empty\",\"conversations\":[{\"from\":\"human\",\"value\":\"q1\"},{\"from\":"
        "\"gpt\",\"value\":\" \"},"
        "{\"from\":\"human\",\"value\":\"q2\"}]},"
        "{\"id\":\"ok\",\"conversations\":[{\"from\":\"system\",\"value\":\"Be "
        "brief.\"},{\"from\":\"human\",\"value\":\"Hello there\"},"
        "{\"from\":\"gpt\",\"value\":\"Hi! How can I help?\"},{\"from\":\"human\",\"value\":\"Tell "
        "me a joke\"},"
        "{\"from\":\"gpt\",\"value\":\"never sent\"},{\"from\":\"human\",\"value\":\"third\"}]},"
        "{\"id\":\"long\",\"conversations\":[{\"from\":\"human\",\"value\":\"word word word word "
        "word word word word "
        "word word word word word word word word word word word word word word word word word word "
        "word word word "
        "word word word word word word word word word word word word word word word word word word "
        "word\"},"
        "{\"from\":\"gpt\",\"value\":\"a\"},{\"from\":\"human\",\"value\":\"q\"}]}]";
    write_file(path, sg);
    o = lm_bench_dataset_default_opts();
    o.name = "sharegpt";
    o.path = path;
    st = lm_bench_dataset_open(&ds, &o);
    CHECK(st == LM_ERR_INVALID && strstr(lm_error_message(), "tokenizer"),
          "sharegpt needs a tokenizer");
    lm_bench_dataset_free(&ds);
    o.prompt = &g_prompt;
    o.max_tokens = 16;
    o.context_tokens = 80;
    st = lm_bench_dataset_open(&ds, &o);
    CHECK(st == LM_OK && ds.n == 1 && ds.n_considered == 5, "sharegpt: %s, %zu selected",
          lm_error_message(), ds.n);
    CHECK(!strcmp(ledger_reason(&ds, "gpt-first"), "starts_with_gpt") &&
              !strcmp(ledger_reason(&ds, "one-turn"), "too_few_turns") &&
              !strcmp(ledger_reason(&ds, "empty"), "empty_turn") &&
              !strcmp(ledger_reason(&ds, "ok"), "selected") &&
              !strcmp(ledger_reason(&ds, "long"), "too_long"),
          "ledger reasons: %s %s %s %s %s", ledger_reason(&ds, "gpt-first"),
          ledger_reason(&ds, "one-turn"), ledger_reason(&ds, "empty"), ledger_reason(&ds, "ok"),
          ledger_reason(&ds, "long"));
    if (ds.n == 1) {
        const struct lm_bench_conversation *c = &ds.convs[0];
        CHECK(c->n_turns == 2 && !strcmp(c->turns[0], "Hello there") &&
                  !strcmp(c->turns[1], "Tell me a joke") &&
                  !strcmp(c->answers[0], "Hi! How can I help?") && c->system &&
                  !strcmp(c->system, "Be brief."),
              "selected conversation: the first two human turns");
        /* the budget: the rendered history, counted here from the template's known shape
         * (<|im_start|> role \n content <|im_end|> \n per message: 5 tokens around the content,
         * plus 3 for the generation prompt) */
        long want = 3;
        const char *parts[] = {"system",    "Be brief.",           "user", "Hello there",
                               "assistant", "Hi! How can I help?", "user", "Tell me a joke"};
        for (int k = 0; k < 8; k += 2)
            want += 5 + lm_bench_prompt_count(&g_prompt, parts[k + 1], strlen(parts[k + 1]));
        CHECK(c->history_tokens == want, "history tokens %ld, want %ld", c->history_tokens, want);
        /* headroom: 16 for the last answer + (16 - tokens of the corpus answer) */
        json_t *e = json_array_get(ds.ledger, 3);
        long ans = lm_bench_prompt_count(&g_prompt, "Hi! How can I help?", 19);
        CHECK(json_integer_value(json_object_get(e, "headroom_tokens")) == 16 + 16 - ans &&
                  json_integer_value(json_object_get(e, "needed_tokens")) == want + 32 - ans,
              "headroom");
    }
    lm_bench_dataset_free(&ds);
    o.turns = 0; /* all alternating turns: "ok" has 3 */
    o.context_tokens = 4096;
    st = lm_bench_dataset_open(&ds, &o);
    bool three = false;
    for (size_t i = 0; i < ds.n; i++)
        three |= !strcmp(ds.convs[i].id, "ok") && ds.convs[i].n_turns == 3;
    CHECK(st == LM_OK && three && !strcmp(ledger_reason(&ds, "one-turn"), "selected"), "turns 0");
    lm_bench_dataset_free(&ds);

    /* the real ShareGPT file: the preset's rule */
    o = lm_bench_dataset_default_opts();
    o.name = "sharegpt";
    o.path = LM_SOURCE_DIR "/data/sharegpt/sharegpt_v3_sample1000.json";
    o.prompt = &g_prompt;
    o.max_tokens = 16;
    o.context_tokens = 256;
    st = lm_bench_dataset_open(&ds, &o);
    json_int_t gptfirst = json_integer_value(json_object_get(ds.rejected, "starts_with_gpt"));
    CHECK(st == LM_OK && ds.n_considered == 1000 && json_array_size(ds.ledger) == 1000 && ds.n >= 6,
          "sharegpt: %s, %zu selected", lm_error_message(), ds.n);
    /* data/SOURCES.md: 661 start with a human message; 339 do not (all but 2 start with gpt) */
    CHECK(gptfirst >= 330 && gptfirst <= 339, "starts_with_gpt %lld", (long long)gptfirst);
    for (size_t i = 0; i < ds.n; i++)
        CHECK(ds.convs[i].n_turns == 2 && ds.convs[i].history_tokens + 16 <= 256, "fits");
    size_t k_;
    json_t *e_;
    json_array_foreach(ds.ledger, k_, e_) {
        json_t *need = json_object_get(e_, "needed_tokens");
        bool sel = !strcmp(json_string_value(json_object_get(e_, "status")), "selected");
        if (need)
            CHECK(sel == (json_integer_value(need) <= 256), "budget decision of %s",
                  json_string_value(json_object_get(e_, "id")));
    }
    lm_bench_dataset_free(&ds);

    /* synthetic: exact token lengths, from a seed */
    o = lm_bench_dataset_default_opts();
    o.name = "synthetic";
    o.prompt = &g_prompt;
    o.synthetic_conversations = 5;
    o.synthetic_turns = 2;
    o.isl_mean = 40;
    o.isl_std = 10;
    o.osl_mean = 20;
    o.seed = 7;
    st = lm_bench_dataset_open(&ds, &o);
    CHECK(st == LM_OK && ds.n == 5 && ds.convs[0].n_turns == 2, "synthetic: %s",
          lm_error_message());
    struct lm_bench_dataset ds2;
    lm_bench_dataset_open(&ds2, &o);
    for (size_t i = 0; i < ds.n && i < ds2.n; i++) {
        CHECK(!strcmp(ds.convs[i].turns[0], ds2.convs[i].turns[0]), "same seed, same prompt");
        CHECK(ds.convs[i].max_tokens >= 1, "max_tokens drawn");
        /* every word (" word") is one token: the count equals the word count */
        size_t words = 0;
        for (const char *q = ds.convs[i].turns[0]; *q; q++)
            words += *q == ' ';
        long n =
            lm_bench_prompt_count(&g_prompt, ds.convs[i].turns[0], strlen(ds.convs[i].turns[0]));
        CHECK((size_t)n == words, "synthetic %zu: %ld tokens for %zu words", i, n, words);
    }
    lm_bench_dataset_free(&ds2);
    lm_bench_dataset_free(&ds);

    /* custom JSONL: turns, or messages */
    write_file(
        path,
        "{\"id\":\"a\",\"turns\":[\"x\",\"y\"],\"max_tokens\":7}\n"
        "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":"
        "\"u1\"},"
        "{\"role\":\"assistant\",\"content\":\"a1\"},{\"role\":\"user\",\"content\":\"u2\"}]}\n"
        "{\"messages\":[{\"role\":\"developer\",\"content\":\"d\"},{\"role\":\"user\",\"content\":\"u\"}]}\n"
        "{\"text\":\"one turn\"}\n");
    o = lm_bench_dataset_default_opts();
    o.name = "custom";
    o.path = path;
    st = lm_bench_dataset_open(&ds, &o);
    CHECK(st == LM_OK && ds.n == 4 && ds.convs[0].max_tokens == 7 && ds.convs[1].n_turns == 2 &&
              !strcmp(ds.convs[1].system, "s") && !strcmp(ds.convs[1].answers[0], "a1") &&
              !strcmp(ds.convs[1].turns[1], "u2"),
          "custom: %s", lm_error_message());
    /* OpenAI's "developer" message is the system prompt, as the server takes it */
    CHECK(st == LM_OK && ds.n == 4 && ds.convs[2].system && !strcmp(ds.convs[2].system, "d") &&
              ds.convs[2].n_turns == 1,
          "custom: a developer message as the system prompt");
    /* AIPerf's single-turn line {"text": ...} */
    CHECK(st == LM_OK && ds.n == 4 && ds.convs[3].n_turns == 1 && !strcmp(ds.convs[3].turns[0], "one turn"),
          "custom: AIPerf's {\"text\": ...} line as one turn");
    lm_bench_dataset_free(&ds);
    /* an unknown role names the roles accepted */
    write_file(path, "{\"messages\":[{\"role\":\"critic\",\"content\":\"c\"},{\"role\":\"user\",\"content\":\"u\"}]}\n");
    st = lm_bench_dataset_open(&ds, &o);
    CHECK(st != LM_OK && strstr(lm_error_message(), "'critic' is not system, developer, user or assistant"),
          "custom: unknown role: %s", lm_error_message());
    lm_bench_dataset_free(&ds); /* also after a failure (dataset.h) */
    /* an empty file says so */
    write_file(path, "\n");
    st = lm_bench_dataset_open(&ds, &o);
    CHECK(st == LM_ERR_MISSING && strstr(lm_error_message(), "no conversation in the file"),
          "custom: empty file: %s", lm_error_message());
    lm_bench_dataset_free(&ds);
    unlink(path);
}

static void test_select(void) {
    size_t a[12], b[12], c[12];
    lm_bench_select(5, 7, false, 0, a);
    CHECK(a[0] == 0 && a[4] == 4 && a[5] == 0 && a[6] == 1, "file order, cycling");
    lm_bench_select(80, 12, true, 42, b);
    lm_bench_select(80, 12, true, 42, c);
    CHECK(!memcmp(b, c, sizeof b), "same seed, same order");
    bool seen[80] = {0}, dup = false, in_order = true;
    for (int i = 0; i < 12; i++) {
        dup |= seen[b[i]];
        seen[b[i]] = true;
        in_order &= b[i] == (size_t)i;
    }
    CHECK(!dup && !in_order, "a shuffled permutation");
    lm_bench_select(80, 12, true, 43, c);
    CHECK(memcmp(b, c, sizeof b), "another seed, another order");
}

/* ---- per-token ITL: multi-token chunks ---- */

static void test_itl_per_token(void) {
    /* chunks at 100 ms ("Hello", 1 token), 160 ms (" big world", 2 tokens), 190 ms ("!", 1) */
    struct lm_bench_record r = {0};
    const char *s = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n";
    struct lm_bench_stream st;
    lm_bench_stream_init(&st, &r);
    lm_bench_stream_feed(&st, s, strlen(s), 5);
    s = "data: {\"choices\":[{\"delta\":{\"content\":\"Hello\"}}]}\n\n";
    lm_bench_stream_feed(&st, s, strlen(s), 100);
    s = "data: {\"choices\":[{\"delta\":{\"content\":\" big world\"}}]}\n\n";
    lm_bench_stream_feed(&st, s, strlen(s), 160);
    s = "data: {\"choices\":[{\"delta\":{\"content\":\"!\"},\"finish_reason\":\"length\"}]}\n\n"
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\n\ndata: "
        "[DONE]\n\n";
    lm_bench_stream_feed(&st, s, strlen(s), 190);
    lm_bench_stream_finish(&st, 191);
    lm_bench_stream_free(&st);
    CHECK(near(r.ttft_ms, 100), "TTFT skips the role-only chunk: %g", r.ttft_ms);
    lm_bench_record_count_tokens(&r, &g_prompt);
    CHECK(r.tokens_counted && r.own_output_tokens == 4 && r.chunks[0].tokens == 1 &&
              r.chunks[1].tokens == 2 && r.chunks[2].tokens == 1,
          "chunk tokens %d %d %d, total %ld", r.chunks[0].tokens, r.chunks[1].tokens,
          r.chunks[2].tokens, r.own_output_tokens);
    struct lm_bench_samples v = {0};
    lm_bench_record_itl_samples(&r, &v);
    CHECK(v.n == 3 && near(v.v[0], 30) && near(v.v[1], 30) && near(v.v[2], 30),
          "per token: %zu samples %g %g %g", v.n, v.n > 0 ? v.v[0] : NAN, v.n > 1 ? v.v[1] : NAN,
          v.n > 2 ? v.v[2] : NAN);
    CHECK(near(lm_bench_record_itl_ms(&r), (190 - 100) / 3.0), "AIPerf ITL per request");
    CHECK(near(lm_bench_record_ttst_ms(&r), 160), "TTST %g", lm_bench_record_ttst_ms(&r));
    /* a server whose usage disagrees (2 tokens, lumen counts 4 = 1 + 2 + 1): usage's total is
     * spread in proportion, largest remainder first: 1, 1, 0 */
    r.output_tokens = 2;
    v.n = 0;
    lm_bench_record_itl_samples(&r, &v);
    CHECK(v.n == 1 && near(v.v[0], 60), "usage-weighted: %zu samples, first %g", v.n,
          v.n ? v.v[0] : NAN);
    lm_bench_samples_free(&v);
    lm_bench_record_free(&r);
}

/* ---- summary and JSONL over a hand-made run ---- */

static void fake_record(struct lm_bench_record *r, enum lm_bench_phase ph, int conv, int turn,
                        double send, double ttft, double lat, long out, long in, long status) {
    char buf[64];
    r->phase = ph;
    r->conversation = (size_t)conv;
    r->turn = turn;
    r->n_turns = 2;
    snprintf(buf, sizeof buf, "run-%c%d", ph == LM_BENCH_PHASE_WARMUP ? 'w' : 'c', conv);
    r->conversation_id = strdup(buf);
    snprintf(buf, sizeof buf, "run-%c%d-t%d", ph == LM_BENCH_PHASE_WARMUP ? 'w' : 'c', conv, turn);
    r->request_id = strdup(buf);
    r->dataset_id = strdup("81");
    r->messages = json_pack("[{s:s,s:s}]", "role", "user", "content", "q");
    r->sent = true;
    r->start_unix = 1.7e9 + send;
    r->t_send = send;
    r->t_end = send + lat / 1e3;
    r->ttft_ms = ttft;
    r->ttfo_ms = ttft;
    r->think_ms = NAN;
    r->latency_ms = lat;
    r->output_tokens = out;
    r->input_tokens = in;
    r->cached_tokens = r->reasoning_tokens = r->draft_tokens = r->accepted_tokens = -1;
    r->http_status = status;
    if (status != 200) lm_bench_record_fail(r, LM_BENCH_ERR_HTTP_5XX, "HTTP %ld: busy", status);
    lm_buf_puts(&r->content, status == 200 ? "answer" : "");
}

static bool str_is(json_t *o, const char *key, const char *want) {
    const char *v = json_string_value(json_object_get(o, key));
    return v && !strcmp(v, want);
}

static void test_summary_and_jsonl(void) {
    struct lm_bench_run run = {0};
    run.n_records = 6;
    run.n_warmup = 1;
    run.n_conversations = 3;
    run.records = calloc(6, sizeof *run.records);
    run.model = strdup("m");
    run.url = strdup("http://x");
    run.params = lm_bench_default_params();
    struct lm_bench_record *r = run.records;
    fake_record(&r[0], LM_BENCH_PHASE_WARMUP, 0, 1, 0.0, 1000, 5000, 99, 99, 200);
    fake_record(&r[1], LM_BENCH_PHASE_PROFILING, 0, 1, 10.0, 10, 110, 11, 20, 200);
    fake_record(&r[2], LM_BENCH_PHASE_PROFILING, 0, 2, 10.2, 30, 230, 21, 60, 200);
    fake_record(&r[3], LM_BENCH_PHASE_PROFILING, 1, 1, 10.1, 20, 120, 1, 22, 200);
    fake_record(&r[4], LM_BENCH_PHASE_PROFILING, 2, 1, 10.0, NAN, 50, -1, -1, 503);
    r[2].think_ms = 90;                    /* 10.110 -> 10.200 */
    r[5].phase = LM_BENCH_PHASE_PROFILING; /* turn 2 of conversation 2: skipped */
    r[5].turn = 2;
    r[5].skip = LM_BENCH_SKIP_AFTER_FAILURE;
    r[5].conversation_id = strdup("run-c2");
    r[5].request_id = strdup("run-c2-t2");
    run.t_begin = 10.0;
    run.t_end = 10.2 + 0.230;
    struct lm_bench_slo slo = {.ttft_ms = 25};
    struct lm_bench_summary s;
    lm_bench_summarize(&run, &slo, &s);
    CHECK(s.n_requests == 4 && s.n_ok == 3 && s.n_failed == 1 && s.n_skipped_failure == 1,
          "counts %zu %zu %zu %zu", s.n_requests, s.n_ok, s.n_failed, s.n_skipped_failure);
    CHECK(s.n_warmup == 1 && s.n_warmup_ok == 1, "warmup counted apart");
    CHECK(s.errors[LM_BENCH_ERR_HTTP_5XX] == 1, "errors by type");
    const struct lm_bench_stats *ttft = &s.m[LM_BENCH_M_TTFT];
    CHECK(ttft->n == 3 && near(ttft->p50, 20) && near(ttft->max, 30),
          "ttft excludes warmup and failures: max %g", ttft->max);
    CHECK(near(ttft->std, sqrt(200.0 / 3)), "std %g", ttft->std);
    /* ITL per request: (110-10)/10 = 10, (230-30)/20 = 10; one output token -> no ITL */
    CHECK(s.m[LM_BENCH_M_ITL].n == 2 && near(s.m[LM_BENCH_M_ITL].mean, 10), "itl");
    CHECK(s.m[LM_BENCH_M_THINK].n == 1 && near(s.m[LM_BENCH_M_THINK].p50, 90),
          "measured think gap");
    CHECK(near(s.window_s, 0.43) && near(s.request_throughput, 3 / 0.43) &&
              near(s.output_token_throughput, 33 / 0.43),
          "throughput %g %g", s.request_throughput, s.output_token_throughput);
    /* goodput: TTFT <= 25 ms holds for 10 and 20, not 30 */
    CHECK(s.n_good == 2 && near(s.goodput, 2 / 0.43), "goodput %zu %g", s.n_good, s.goodput);
    CHECK(s.n_turn_rows == 2 && s.turns[0].n_ok == 2 && s.turns[1].n_ok == 1 &&
              near(s.turns[0].latency_ms.p50, 115) && near(s.turns[1].ttft_ms.p95, 30),
          "per turn");
    /* alone: turn-1 requests are in flight over 10.000-10.220, the turn-2 one over 10.200-10.430:
     * turn 1 alone for 0.200 s, turn 2 for 0.210 s */
    CHECK(near(s.turns[0].alone_s, 0.2) && near(s.turns[1].alone_s, 0.21), "alone %g %g",
          s.turns[0].alone_s, s.turns[1].alone_s);

    char path[] = "/tmp/lm_test_bench_jsonl_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    CHECK(lm_bench_write_jsonl(path, &run) == LM_OK, "write: %s", lm_error_message());
    struct lm_buf text = {0};
    lm_file_read(path, &text);
    int lines = 0;
    for (char *line = strtok(text.p, "\n"); line; line = strtok(NULL, "\n"), lines++) {
        json_t *o = json_loads(line, 0, NULL);
        CHECK(json_is_object(o), "line %d is JSON", lines);
        if (lines == 0) CHECK(str_is(o, "phase", "warmup"), "warmup phase");
        if (lines == 4)
            CHECK(str_is(o, "error_type", "http_5xx") &&
                      json_is_null(json_object_get(o, "ttft_ms")) &&
                      json_is_null(json_object_get(o, "output_tokens")),
                  "failed record");
        if (lines == 5)
            CHECK(json_is_false(json_object_get(o, "sent")) &&
                      str_is(o, "skip_reason", "after_failure"),
                  "skipped record");
        if (lines == 1)
            CHECK(json_real_value(json_object_get(o, "request_latency_ms")) == 110 &&
                      str_is(o, "response_text", "answer") && str_is(o, "phase", "profiling") &&
                      json_array_size(json_object_get(o, "messages")) == 1 &&
                      str_is(o, "request_id", "run-c0-t1"),
                  "profiling record");
        json_decref(o);
    }
    CHECK(lines == 6, "%d lines (skipped turns included, marked)", lines);
    lm_buf_free(&text);
    unlink(path);

    json_t *sj = lm_bench_summary_json(&run, &s);
    json_t *m = json_object_get(json_object_get(sj, "metrics"), "time_to_first_token");
    CHECK(near(json_real_value(json_object_get(m, "p50")), 20) &&
              json_integer_value(json_object_get(m, "count")) == 3 &&
              near(json_real_value(json_object_get(sj, "goodput")), 2 / 0.43),
          "summary JSON with AIPerf names");
    CHECK(str_is(json_object_get(sj, "speculative"), "acceptance_rate", "unavailable") &&
              str_is(json_object_get(sj, "speculative"), "mode", "ordinary"),
          "no speculative counters: unavailable, never zero");
    json_decref(sj);

    FILE *f = tmpfile();
    lm_bench_report_print(f, &run, &s);
    rewind(f);
    char out[16384];
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = 0;
    fclose(f);
    CHECK(strstr(out, "Time to First Token (ms)") && strstr(out, "Request Throughput") &&
              strstr(out, "http_5xx: 1") && strstr(out, "turn 2") && strstr(out, "Goodput") &&
              strstr(out, "ordinary generation"),
          "report:\n%s", out);
    lm_bench_run_free(&run);
}

/* ---- verification against hand-written server records ---- */

static void hex_of(const void *p, size_t n, char out[65]) {
    unsigned char md[32];
    SHA256(p, n, md); /* OpenSSL's one-shot, independent of digest.c's EVP path */
    for (int i = 0; i < 32; i++)
        sprintf(out + 2 * i, "%02x", md[i]);
}

/* A run of one warmup request and two 2-turn conversations; the messages of conversation 0 turn
 * 2 are the fixture "user, assistant, user" conversation (tests/data/fixtures/chat_template,
 * case 2), whose rendered ids the fixture gives. */
static json_t *g_fixture;

static void make_verify_run(struct lm_bench_run *run, struct lm_bench_dataset *ds) {
    memset(run, 0, sizeof *run);
    memset(ds, 0, sizeof *ds);
    snprintf(run->run_id, sizeof run->run_id, "abcd1234");
    run->model = strdup("m");
    run->url = strdup("http://x");
    run->params = lm_bench_default_params();
    run->enable_thinking = -1;
    run->n_records = 5;
    run->n_warmup = 1;
    run->records = calloc(5, sizeof *run->records);
    json_t *fm = json_object_get(g_fixture, "messages");
    const char *u1 = json_string_value(json_object_get(json_array_get(fm, 0), "content"));
    const char *a1 = json_string_value(json_object_get(json_array_get(fm, 1), "content"));
    const char *u2 = json_string_value(json_object_get(json_array_get(fm, 2), "content"));
    /* the dataset: conversation "c0" = (u1, u2), "c1" = ("x1", "x2"), warmup "w" = ("wq") */
    ds->n = 3;
    ds->convs = calloc(3, sizeof *ds->convs);
    const char *ids[] = {"c0", "c1", "w"};
    const char *turns[3][2] = {{u1, u2}, {"x1", "x2"}, {"wq", NULL}};
    for (int i = 0; i < 3; i++) {
        ds->convs[i].id = strdup(ids[i]);
        ds->convs[i].n_turns = turns[i][1] ? 2 : 1;
        ds->convs[i].turns = calloc(2, sizeof(char *));
        for (size_t t = 0; t < ds->convs[i].n_turns; t++)
            ds->convs[i].turns[t] = strdup(turns[i][t]);
    }
    struct {
        enum lm_bench_phase ph;
        const char *cid, *rid, *ds_id;
        int turn;
        json_t *msgs;
        const char *answer;
        double send;
    } spec[5] = {
        {LM_BENCH_PHASE_WARMUP, "abcd1234-w0", "abcd1234-w0-t1", "w", 1,
         json_pack("[{s:s,s:s}]", "role", "user", "content", "wq"), "warm", 1.0},
        {LM_BENCH_PHASE_PROFILING, "abcd1234-c0", "abcd1234-c0-t1", "c0", 1,
         json_pack("[{s:s,s:s}]", "role", "user", "content", u1), a1, 2.0},
        {LM_BENCH_PHASE_PROFILING, "abcd1234-c0", "abcd1234-c0-t2", "c0", 2, json_deep_copy(fm),
         "fine", 2.2},
        {LM_BENCH_PHASE_PROFILING, "abcd1234-c1", "abcd1234-c1-t1", "c1", 1,
         json_pack("[{s:s,s:s}]", "role", "user", "content", "x1"), "y1", 2.0},
        {LM_BENCH_PHASE_PROFILING, "abcd1234-c1", "abcd1234-c1-t2", "c1", 2,
         json_pack("[{s:s,s:s},{s:s,s:s},{s:s,s:s}]", "role", "user", "content", "x1", "role",
                   "assistant", "content", "y1", "role", "user", "content", "x2"),
         "y2", 2.3},
    };
    for (int i = 0; i < 5; i++) {
        struct lm_bench_record *r = &run->records[i];
        r->phase = spec[i].ph;
        r->conversation_id = strdup(spec[i].cid);
        r->request_id = strdup(spec[i].rid);
        r->dataset_id = strdup(spec[i].ds_id);
        r->turn = spec[i].turn;
        r->n_turns = 2;
        r->messages = spec[i].msgs;
        r->sent = true;
        r->t_send = spec[i].send;
        r->t_end = spec[i].send + 0.1;
        r->latency_ms = 100;
        r->ttft_ms = r->ttfo_ms = 10;
        r->http_status = 200;
        r->output_tokens = 2;
        r->input_tokens = -1;
        r->cached_tokens = r->reasoning_tokens = r->draft_tokens = r->accepted_tokens = -1;
        char sid[32];
        snprintf(sid, sizeof sid, "chatcmpl-%d", i);
        r->server_id = strdup(sid);
        r->finish_reason = strdup("length");
        lm_buf_puts(&r->content, spec[i].answer);
    }
    run->t_begin = 2.0;
    run->t_end = 2.4;
}

/* The server record the contract asks for, computed here from the client record. */
static json_t *server_record_for(const struct lm_bench_record *r, double t_arrival) {
    json_t *roles = json_array(), *hashes = json_array();
    size_t i;
    json_t *m;
    char hex[65];
    json_array_foreach(r->messages, i, m) {
        json_array_append_new(roles, json_string(json_string_value(json_object_get(m, "role"))));
        const char *c = json_string_value(json_object_get(m, "content"));
        hex_of(c, strlen(c), hex);
        json_array_append_new(hashes, json_string(hex));
    }
    char text[65];
    hex_of(r->content.p, r->content.len, text);
    return json_pack(
        "{s:s,s:s,s:s,s:s,s:i,s:s,s:s,s:i,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:n,s:i,s:i,"
        "s:s,s:o,s:o,s:n,s:n,s:s}",
        "id", r->server_id, "x_request_id", r->request_id, "conversation_id", r->conversation_id,
        "phase", r->phase == LM_BENCH_PHASE_WARMUP ? "warmup" : "profiling", "turn", r->turn - 1,
        "model", "m", "endpoint", "/v1/chat/completions", "http_status", 200, "t_arrival_ms",
        t_arrival, "t_scheduled_ms", t_arrival + 1, "t_first_token_ms", t_arrival + 5,
        "t_finish_ms", t_arrival + 50, "queue_ms", 1.0, "prefill_ms", 4.0, "decode_ms", 45.0,
        "total_ms", 50.0, "prompt_tokens", "cached_tokens", 0, "completion_tokens", 2,
        "finish_reason", "length", "roles", roles, "content_sha256", hashes, "prompt_ids_sha256",
        "completion_ids_sha256", "completion_text_sha256", text);
}

static void write_records(const char *path, json_t *recs) {
    FILE *f = fopen(path, "w");
    size_t i;
    json_t *o;
    json_array_foreach(recs, i, o) {
        char *s = json_dumps(o, JSON_COMPACT);
        fprintf(f, "%s\n", s);
        free(s);
    }
    fclose(f);
}

static void test_verify(void) {
    json_error_t e;
    FILE *ff = fopen(TEST_DATA("fixtures/chat_template/qwen3_cases.jsonl"), "r");
    char line[16384];
    for (int i = 0; ff && i < 3 && fgets(line, sizeof line, ff); i++)
        if (i == 2) g_fixture = json_loads(line, 0, &e);
    if (ff) fclose(ff);
    CHECK(g_fixture && json_array_size(json_object_get(g_fixture, "messages")) == 3,
          "fixture case 2");
    if (!g_fixture) return;

    struct lm_bench_run run;
    struct lm_bench_dataset ds;
    make_verify_run(&run, &ds);
    char path[] = "/tmp/lm_test_verify_XXXXXX";
    int fd = mkstemp(path);
    close(fd);

    /* all good, plus one record of another run that must be ignored */
    json_t *recs = json_array();
    double arrival[] = {1000, 2000, 2200, 2001, 2300};
    for (int i = 0; i < 5; i++)
        json_array_append_new(recs, server_record_for(&run.records[i], arrival[i]));
    json_t *other = json_deep_copy(json_array_get(recs, 1));
    json_object_set_new(other, "x_request_id", json_string("ffff0000-c0-t1"));
    json_array_append_new(recs, other);
    /* prompt ids of conversation 0 turn 2: the fixture's ids, hashed here */
    json_t *fids = json_object_get(g_fixture, "ids");
    size_t nid = json_array_size(fids);
    unsigned char *le = calloc(nid, 4);
    for (size_t i = 0; i < nid; i++) {
        uint32_t v = (uint32_t)json_integer_value(json_array_get(fids, i));
        le[4 * i] = v & 255, le[4 * i + 1] = (v >> 8) & 255, le[4 * i + 2] = (v >> 16) & 255,
               le[4 * i + 3] = v >> 24;
    }
    char pids[65];
    hex_of(le, 4 * nid, pids);
    free(le);
    json_object_set_new(json_array_get(recs, 2), "prompt_ids_sha256", json_string(pids));
    json_object_set_new(json_array_get(recs, 2), "prompt_tokens", json_integer((json_int_t)nid));
    write_records(path, recs);

    struct lm_bench_verification v;
    lm_status st = lm_bench_verify(&run, &ds, path, &g_prompt, &v);
    CHECK(st == LM_OK && v.available, "verify: %s", lm_error_message());
    if (!v.ok) lm_bench_verification_print(stderr, &v);
    CHECK(v.ok && v.n_matched == 5 && v.n_other == 1 && v.n_this_run == 5,
          "clean run passes: matched %zu other %zu", v.n_matched, v.n_other);
    CHECK(v.passed[LM_BENCH_CHECK_HISTORY] == 2 && v.passed[LM_BENCH_CHECK_USER_CONTENT] == 5 &&
              v.passed[LM_BENCH_CHECK_WARMUP_APART] == 1 &&
              v.passed[LM_BENCH_CHECK_CONVERSATIONS] == 2,
          "checks passed: history %zu user %zu warmup %zu conv %zu",
          v.passed[LM_BENCH_CHECK_HISTORY], v.passed[LM_BENCH_CHECK_USER_CONTENT],
          v.passed[LM_BENCH_CHECK_WARMUP_APART], v.passed[LM_BENCH_CHECK_CONVERSATIONS]);
    CHECK(v.passed[LM_BENCH_CHECK_PROMPT_IDS] == 1 && v.unavailable[LM_BENCH_CHECK_PROMPT_IDS] == 4,
          "prompt ids: the fixture's rendering matches (passed %zu, unavailable %zu)",
          v.passed[LM_BENCH_CHECK_PROMPT_IDS], v.unavailable[LM_BENCH_CHECK_PROMPT_IDS]);
    CHECK(run.records[2].own_input_tokens == (long)nid &&
              !strcmp(run.records[2].prompt_ids_sha256, pids),
          "client rendering of the fixture conversation");
    lm_bench_verification_free(&v);

    /* without a template: prompt_ids unavailable, with a note */
    for (int i = 0; i < 5; i++)
        run.records[i].prompt_ids_sha256[0] = 0;
    lm_bench_verify(&run, &ds, path, NULL, &v);
    CHECK(v.ok && v.passed[LM_BENCH_CHECK_PROMPT_IDS] == 0 && v.prompt_ids_note[0],
          "no template: skipped with a note");
    lm_bench_verification_free(&v);

    /* a tampered history: the server saw a different answer for conversation 1's turn 1 */
    json_t *t = json_deep_copy(recs);
    char hex[65];
    hex_of("y1 (edited)", 11, hex);
    json_array_set_new(json_object_get(json_array_get(t, 4), "content_sha256"), 1,
                       json_string(hex));
    write_records(path, t);
    json_decref(t);
    lm_bench_verify(&run, &ds, path, &g_prompt, &v);
    CHECK(!v.ok && v.failed[LM_BENCH_CHECK_HISTORY] == 1 && run.records[4].issues &&
              json_array_size(v.issues) >= 1,
          "tampered history caught (failed %zu)", v.failed[LM_BENCH_CHECK_HISTORY]);
    lm_bench_verification_free(&v);

    /* a tampered prompt-ids hash */
    t = json_deep_copy(recs);
    json_object_set_new(json_array_get(t, 2), "prompt_ids_sha256", json_string(hex));
    write_records(path, t);
    json_decref(t);
    lm_bench_verify(&run, &ds, path, &g_prompt, &v);
    CHECK(!v.ok && v.failed[LM_BENCH_CHECK_PROMPT_IDS] == 1, "prompt ids mismatch caught");
    lm_bench_verification_free(&v);

    /* a missing record: conversation 1 turn 2 */
    t = json_deep_copy(recs);
    json_array_remove(t, 4);
    write_records(path, t);
    json_decref(t);
    lm_bench_verify(&run, &ds, path, &g_prompt, &v);
    CHECK(!v.ok && v.n_unmatched_client == 1 && v.conversations_broken == 1 &&
              v.failed[LM_BENCH_CHECK_CONVERSATIONS] == 1,
          "missing record caught: unmatched %zu broken %zu", v.n_unmatched_client,
          v.conversations_broken);
    lm_bench_verification_free(&v);

    /* a record no request explains, and a completion that differs */
    t = json_deep_copy(recs);
    json_t *extra = json_deep_copy(json_array_get(t, 1));
    json_object_set_new(extra, "x_request_id", json_string("abcd1234-c9-t1"));
    json_array_append_new(t, extra);
    json_object_set_new(json_array_get(t, 3), "completion_text_sha256", json_string(hex));
    write_records(path, t);
    json_decref(t);
    lm_bench_verify(&run, &ds, path, &g_prompt, &v);
    CHECK(!v.ok && v.n_unmatched_server == 1 && v.failed[LM_BENCH_CHECK_COMPLETION] == 1,
          "unexplained record and completion mismatch caught");
    lm_bench_verification_free(&v);

    /* warmup still running when measurement began (server clock) */
    t = json_deep_copy(recs);
    json_object_set_new(json_array_get(t, 0), "t_finish_ms", json_real(2100));
    json_object_set_new(json_array_get(t, 0), "total_ms", json_real(1100));
    json_object_set_new(json_array_get(t, 0), "decode_ms", json_real(1095));
    write_records(path, t);
    json_decref(t);
    lm_bench_verify(&run, &ds, path, &g_prompt, &v);
    CHECK(!v.ok && v.failed[LM_BENCH_CHECK_WARMUP_APART] == 1, "warmup overlap caught");
    lm_bench_verification_free(&v);

    /* a warmup request recorded as measured */
    t = json_deep_copy(recs);
    json_object_set_new(json_array_get(t, 0), "phase", json_string("profiling"));
    write_records(path, t);
    json_decref(t);
    lm_bench_verify(&run, &ds, path, &g_prompt, &v);
    CHECK(!v.ok && v.failed[LM_BENCH_CHECK_IDENTITY] == 1, "phase mix-up caught");
    lm_bench_verification_free(&v);

    /* finish_reason: a request the server cut is "cancelled" on both sides (the client recorded
     * the wire's "abort" as "cancelled"); an older server's "abort" is read the same; a
     * different end is an identity failure */
    free(run.records[3].finish_reason);
    run.records[3].finish_reason = strdup("cancelled");
    static const char *const k_server_fr[] = {"cancelled", "abort", "stop"};
    for (int i = 0; i < 3; i++) {
        t = json_deep_copy(recs);
        json_object_set_new(json_array_get(t, 3), "finish_reason", json_string(k_server_fr[i]));
        write_records(path, t);
        json_decref(t);
        lm_bench_verify(&run, &ds, path, &g_prompt, &v);
        if (i < 2)
            CHECK(v.ok && v.failed[LM_BENCH_CHECK_IDENTITY] == 0 &&
                      v.passed[LM_BENCH_CHECK_IDENTITY] == 5,
                  "server finish_reason '%s' against the client's cancelled: accepted",
                  k_server_fr[i]);
        else
            CHECK(!v.ok && v.failed[LM_BENCH_CHECK_IDENTITY] == 1 && run.records[3].issues,
                  "server finish_reason 'stop' against the client's cancelled: caught");
        lm_bench_verification_free(&v);
    }
    free(run.records[3].finish_reason);
    run.records[3].finish_reason = strdup("length");

    /* a request the client gave up on (--timeout-s) after 20 ms: the server ends it as the
     * client's disconnect (499, "cancelled") and its total outlasts the client's clock; neither
     * is a disagreement, and its (partial) text is not compared. The same server record against a
     * request the client did not abandon is caught. */
    {
        struct lm_bench_record *r3 = &run.records[3];
        const double lat0 = r3->latency_ms;
        char *fr0 = r3->finish_reason;
        t = json_deep_copy(recs);
        json_object_set_new(json_array_get(t, 3), "http_status", json_integer(499));
        json_object_set_new(json_array_get(t, 3), "finish_reason", json_string("cancelled"));
        write_records(path, t);
        json_decref(t);
        r3->latency_ms = 20, r3->finish_reason = NULL;
        /* timed out, or cancelled in flight by an interrupted run (client.h) */
        for (int kind = 0; kind < 2; kind++) {
            r3->error = kind ? LM_BENCH_ERR_CONNECTION : LM_BENCH_ERR_TIMEOUT;
            r3->error_message = kind ? strdup(LM_BENCH_CLIENT_CANCELLED " after 2.0 s more") : NULL;
            r3->cancelled = kind;
            lm_bench_verify(&run, &ds, path, &g_prompt, &v);
            if (!v.ok) lm_bench_verification_print(stderr, &v);
            CHECK(v.ok && v.failed[LM_BENCH_CHECK_IDENTITY] == 0 && v.failed[LM_BENCH_CHECK_SERVER_TIMES] == 0 &&
                      v.failed[LM_BENCH_CHECK_COMPLETION] == 0 && v.unavailable[LM_BENCH_CHECK_COMPLETION] >= 1,
                  "a %s request's 499 / cancelled / longer server total accepted, its text not compared",
                  kind ? "cancelled" : "timed-out");
            lm_bench_verification_free(&v);
            free(r3->error_message);
            r3->error_message = NULL;
        }
        r3->error = LM_BENCH_ERR_NONE, r3->cancelled = false;
        lm_bench_verify(&run, &ds, path, &g_prompt, &v);
        CHECK(!v.ok && v.failed[LM_BENCH_CHECK_IDENTITY] == 1 && v.failed[LM_BENCH_CHECK_SERVER_TIMES] == 1,
              "the same record against a request the client did not abandon: caught (identity %zu, times %zu)",
              v.failed[LM_BENCH_CHECK_IDENTITY], v.failed[LM_BENCH_CHECK_SERVER_TIMES]);
        lm_bench_verification_free(&v);
        r3->latency_ms = lat0, r3->finish_reason = fr0;
    }

    /* the summary shows server-side time beside (not mixed with) the client's */
    write_records(path, recs);
    lm_bench_verify(&run, &ds, path, &g_prompt, &v);
    struct lm_bench_summary s;
    lm_bench_summarize(&run, NULL, &s);
    CHECK(s.server_side && s.m[LM_BENCH_M_S_TOTAL].n == 4 &&
              near(s.m[LM_BENCH_M_S_TOTAL].p50, 50) && near(s.m[LM_BENCH_M_LATENCY].p50, 100),
          "server-side rows");
    lm_bench_verification_free(&v);

    /* a malformed records file: the run's good records and a duplicate of the first (a problem
     * found), then a line that is not JSON. Nothing of it is used (the joins and problems found
     * before the bad line are dropped), and the reason is kept. */
    write_records(path, recs);
    {
        FILE *f = fopen(path, "a");
        char *dup = json_dumps(json_array_get(recs, 0), JSON_COMPACT);
        fprintf(f, "%s\nnot json\n", dup);
        free(dup);
        fclose(f);
    }
    const size_t bad_line = json_array_size(recs) + 2;
    st = lm_bench_verify(&run, &ds, path, NULL, &v);
    char want[32];
    snprintf(want, sizeof want, ":%zu:", bad_line);
    bool joined = false, flagged = false;
    for (size_t i = 0; i < run.n_records; i++) {
        joined |= run.records[i].server_record != NULL;
        flagged |= run.records[i].issues != NULL;
    }
    CHECK(st == LM_ERR_FORMAT && strstr(lm_error_message(), want) && v.error && strstr(v.error, want) &&
              !v.available && !v.ok && !joined && !flagged && json_array_size(v.issues) == 0 &&
              v.n_duplicate == 0 && v.n_lines == 0,
          "malformed at line %zu: %s (error %s, available %d, joins left %d, record issues left %d, issues %zu, "
          "duplicates %zu, lines %zu)",
          bad_line, lm_error_message(), v.error ? v.error : "(none)", v.available, joined, flagged,
          json_array_size(v.issues), v.n_duplicate, v.n_lines);
    lm_bench_summarize(&run, NULL, &s);
    CHECK(!s.server_side, "malformed: no server-side figures from part of the file");
    {
        char *txt = NULL;
        size_t len = 0;
        FILE *mf = open_memstream(&txt, &len);
        lm_bench_verification_print(mf, &v);
        fclose(mf);
        json_t *vj = lm_bench_verification_json(&v);
        const char *je = json_string_value(json_object_get(vj, "error"));
        CHECK(strstr(txt, "Verification: FAILED (the server records could not be used: ") && strstr(txt, want) &&
                  json_is_false(json_object_get(vj, "ok")) && je && strstr(je, want),
              "malformed: printed and in JSON as FAILED with the reason: %s", txt);
        json_decref(vj);
        free(txt);
    }
    lm_bench_verification_free(&v);

    /* an unreadable one */
    char missing[300];
    snprintf(missing, sizeof missing, "%s.missing", path);
    st = lm_bench_verify(&run, &ds, missing, NULL, &v);
    CHECK(st == LM_ERR_IO && v.error && strstr(v.error, missing) && !v.available, "missing records: %s",
          v.error ? v.error : "(none)");
    lm_bench_verification_free(&v);

    json_decref(recs);
    unlink(path);
    lm_bench_run_free(&run);
    lm_bench_dataset_free(&ds);
    json_decref(g_fixture);
}

int main(void) {
    lm_status st = lm_bench_prompt_open(&g_prompt, TINY_MODEL);
    CHECK(st == LM_OK && lm_bench_prompt_can_render(&g_prompt), "tokenizer: %s",
          lm_error_message());
    test_sse_framing();
    test_stream_split();
    test_stream_errors();
    test_stats();
    test_digest();
    test_datasets();
    test_select();
    test_itl_per_token();
    test_summary_and_jsonl();
    test_verify();
    lm_bench_prompt_free(&g_prompt);
    return check_exit("test_bench");
}
