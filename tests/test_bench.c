/* test_bench.c: the profiler's parts that need no server: SSE parsing of bytes split anywhere,
 * chat.completion.chunk interpretation (TTFT, usage, errors), percentiles against hand-computed
 * values (numpy's linear method), MT-Bench loading, conversation selection, the summary's
 * counting and throughput, and the JSONL writer.
 * LM_LINK: lm_bench lm_text lm_base */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/file.h"
#include "bench/dataset.h"
#include "bench/record.h"
#include "bench/replay.h"
#include "bench/report.h"
#include "bench/sse.h"
#include "bench/stats.h"
#include "check.h"

static bool near(double a, double b) { return fabs(a - b) <= 1e-9 * (1 + fabs(b)); }

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
    for (int i = 0; i < 4; i++) lm_sse_feed(&p, parts[i], strlen(parts[i]), collect, &e);
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
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"hmm\"},\"finish_reason\":null}]}\r\n\r\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"finish_reason\":null}]}\n\n"
    ": keep-alive\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\", w\\u00f6rld\"},\"finish_reason\":null}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n"
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":17,\"completion_tokens\":3,\"total_tokens\":20}}\n\n"
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
    CHECK(r->output_tokens == 3 && r->input_tokens == 17, "%s: usage %ld %ld", how, r->output_tokens,
          r->input_tokens);
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
    for (size_t i = 0; i < n; i++) lm_bench_stream_feed(&s, k_stream + i, 1, (double)i);
    lm_bench_stream_finish(&s, (double)n + 5);
    lm_bench_stream_free(&s);
    check_stream_record(&r, "bytewise", event_end("hmm"));
    CHECK(near(r.latency_ms, (double)n - 1), "latency %g want %zu", r.latency_ms, n - 1);
    CHECK(near(r.chunks[1].t_ms, event_end("Hello")) && near(r.chunks[2].t_ms, event_end("rld")),
          "chunk times %g %g", r.chunks[1].t_ms, r.chunks[2].t_ms);
    /* AIPerf ITL: (latency - TTFT) / (3 - 1) */
    CHECK(near(lm_bench_record_itl_ms(&r), (r.latency_ms - r.ttft_ms) / 2), "itl");
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

    /* a role-only stream has no TTFT */
    feed_all(&r, "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"},\"finish_reason\":\"stop\"}]}"
                 "\n\ndata: [DONE]\n\n");
    CHECK(!r.error && isnan(r.ttft_ms) && r.n_chunks == 0, "empty answer");
    CHECK(isnan(lm_bench_record_itl_ms(&r)), "no ITL without output");
    lm_bench_record_free(&r);

    /* a server that ignored "stream" */
    r.output_tokens = r.input_tokens = -1;
    const char *full = "{\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":\"hi\"},"
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

static void test_mt_bench(void) {
    struct lm_bench_dataset ds;
    lm_status st = lm_bench_dataset_load(&ds, "mt_bench", LM_SOURCE_DIR "/data/mt_bench/question.jsonl");
    CHECK(st == LM_OK, "load: %s", lm_error_message());
    CHECK(ds.n == 80, "%zu conversations", ds.n);
    size_t two = 0, writing = 0;
    for (size_t i = 0; i < ds.n; i++) {
        two += ds.convs[i].n_turns == 2 && ds.convs[i].turns[1][0];
        writing += ds.convs[i].category && !strcmp(ds.convs[i].category, "writing");
    }
    CHECK(two == 80 && writing == 10, "two-turn %zu, writing %zu", two, writing);
    if (ds.n == 80) {
        CHECK(!strcmp(ds.convs[0].id, "81") && !strcmp(ds.convs[79].id, "160"), "ids %s %s",
              ds.convs[0].id, ds.convs[79].id);
        CHECK(!strncmp(ds.convs[0].turns[0], "Compose an engaging travel blog post", 36) &&
                  !strcmp(ds.convs[0].turns[1],
                          "Rewrite your previous response. Start every sentence with the letter A."),
              "question 81");
        CHECK(!ds.convs[0].answers[0] && !ds.convs[0].system, "no answers or system prompt");
    }
    lm_bench_dataset_free(&ds);

    st = lm_bench_dataset_load(&ds, "nope", "x");
    CHECK(st == LM_ERR_UNSUPPORTED && strstr(lm_error_message(), "nope"), "unknown name");
    lm_bench_dataset_free(&ds);

    char path[] = "/tmp/lm_test_bench_XXXXXX";
    int fd = mkstemp(path);
    const char *bad = "{\"question_id\": 1, \"turns\": [\"a\"]}\n\n{\"question_id\": 2, \"turns\": [3]}\n";
    CHECK(fd >= 0 && write(fd, bad, strlen(bad)) == (ssize_t)strlen(bad), "tmp");
    close(fd);
    st = lm_bench_dataset_load(&ds, "mt_bench", path);
    CHECK(st == LM_ERR_FORMAT && strstr(lm_error_message(), ":3: turns[0]"), "bad line: %s",
          lm_error_message());
    lm_bench_dataset_free(&ds);

    const char *sg = "[{\"id\":\"a\",\"conversations\":[{\"from\":\"gpt\",\"value\":\"orphan\"},"
                     "{\"from\":\"human\",\"value\":\"q1\"},{\"from\":\"gpt\",\"value\":\"a1\"},"
                     "{\"from\":\"human\",\"value\":\"q2\"}]},"
                     "{\"id\":\"b\",\"conversations\":[{\"from\":\"gpt\",\"value\":\"only\"}]}]";
    CHECK(lm_file_write(path, sg, strlen(sg)) == LM_OK, "tmp");
    st = lm_bench_dataset_load(&ds, "sharegpt", path);
    CHECK(st == LM_OK && ds.n == 1 && ds.convs[0].n_turns == 2 &&
              !strcmp(ds.convs[0].turns[1], "q2") && !strcmp(ds.convs[0].answers[0], "a1") &&
              !ds.convs[0].answers[1],
          "sharegpt: %s", lm_error_message());
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

/* ---- summary and JSONL over a hand-made run ---- */

static void fake_record(struct lm_bench_record *r, enum lm_bench_phase ph, int conv, int turn,
                        double send, double ttft, double lat, long out, long in, long status) {
    char buf[64];
    r->phase = ph;
    r->conversation = (size_t)conv;
    r->turn = turn;
    snprintf(buf, sizeof buf, "run-c%d", conv);
    r->conversation_id = strdup(buf);
    snprintf(buf, sizeof buf, "run-c%d-t%d", conv, turn);
    r->request_id = strdup(buf);
    r->dataset_id = strdup("81");
    r->messages = json_pack("[{s:s,s:s}]", "role", "user", "content", "q");
    r->sent = true;
    r->start_unix = 1.7e9 + send;
    r->t_send = send;
    r->t_end = send + lat / 1e3;
    r->ttft_ms = ttft;
    r->latency_ms = lat;
    r->output_tokens = out;
    r->input_tokens = in;
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
    r[5].phase = LM_BENCH_PHASE_PROFILING; /* turn 2 of conversation 2: skipped */
    r[5].turn = 2;
    run.t_begin = 10.0;
    run.t_end = 10.2 + 0.230;
    struct lm_bench_summary s;
    lm_bench_summarize(&run, &s);
    CHECK(s.n_requests == 4 && s.n_ok == 3 && s.n_failed == 1 && s.n_skipped == 1,
          "counts %zu %zu %zu %zu", s.n_requests, s.n_ok, s.n_failed, s.n_skipped);
    CHECK(s.errors[LM_BENCH_ERR_HTTP_5XX] == 1, "errors by type");
    CHECK(s.ttft_ms.n == 3 && near(s.ttft_ms.p50, 20) && near(s.ttft_ms.max, 30),
          "ttft excludes warmup and failures: max %g", s.ttft_ms.max);
    /* ITL: (110-10)/10 = 10, (230-30)/20 = 10; one output token -> no ITL */
    CHECK(s.itl_ms.n == 2 && near(s.itl_ms.mean, 10), "itl n %zu mean %g", s.itl_ms.n, s.itl_ms.mean);
    CHECK(near(s.window_s, 0.43) && near(s.request_throughput, 3 / 0.43) &&
              near(s.output_token_throughput, 33 / 0.43),
          "throughput %g %g", s.request_throughput, s.output_token_throughput);
    CHECK(s.n_turn_rows == 2 && s.turns[0].n_ok == 2 && s.turns[1].n_ok == 1 &&
              near(s.turns[0].latency_ms.p50, 115) && near(s.turns[1].ttft_ms.p95, 30),
          "per turn");

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
        if (lines == 0)
            CHECK(str_is(o, "phase", "warmup"), "warmup phase");
        if (lines == 4) {
            CHECK(str_is(o, "error_type", "http_5xx") &&
                      json_is_null(json_object_get(o, "ttft_ms")) &&
                      json_is_null(json_object_get(o, "output_tokens")),
                  "failed record");
        }
        if (lines == 1)
            CHECK(json_real_value(json_object_get(o, "request_latency_ms")) == 110 &&
                      str_is(o, "response_text", "answer") && str_is(o, "phase", "profiling") &&
                      json_array_size(json_object_get(o, "messages")) == 1 &&
                      str_is(o, "request_id", "run-c0-t1"),
                  "profiling record");
        json_decref(o);
    }
    CHECK(lines == 5, "%d lines (the skipped turn is not a request)", lines);
    lm_buf_free(&text);
    unlink(path);

    FILE *f = tmpfile();
    lm_bench_report_print(f, &run, &s);
    rewind(f);
    char out[8192];
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = 0;
    fclose(f);
    CHECK(strstr(out, "Time to First Token (ms)") && strstr(out, "Request Throughput") &&
              strstr(out, "http_5xx: 1") && strstr(out, "turn 2"),
          "report:\n%s", out);
    lm_bench_run_free(&run);
}

int main(void) {
    test_sse_framing();
    test_stream_split();
    test_stream_errors();
    test_stats();
    test_mt_bench();
    test_select();
    test_summary_and_jsonl();
    return check_exit("test_bench");
}
