/* test_profile_metrics.c: the profiler end to end against a scripted SSE server with controlled
 * timing, running in a thread of this test (raw sockets, one thread per connection), which also
 * writes request records by the contract of docs/RECORDS.md.
 *
 * Script: warmup requests answer at once with usage.completion_tokens 999 (so a leak into any
 * figure shows); turn 1 sends a role-only chunk at once, "Hello" at 100 ms, " big world" (two
 * tokens) 60 ms later and "!" 30 ms after that; turn 2 sends a role-only chunk, reasoning at
 * 40 ms and the answer 80 ms later. Checked: TTFT skips the role-only chunk (100 / 40 ms), TTFO
 * waits for the answer (120 ms), ITL per token divides the two-token chunk (30 ms per token,
 * against 60 ms between chunks), per-turn rows, no warmup leakage, measured think gaps, the
 * usage-vs-tokenizer comparison (one more for the stop token), verification passing, then
 * failing on a tampered history and on a missing record (exit code 1), "verification
 * unavailable" without records, a request-count limit, request-rate mode, and a sweep with its
 * throughput-versus-latency report.
 *
 * Timing: the script's sleeps are floors (a figure measured from the client's send can only be
 * later than its sleeps), so those are asserted as lower bounds; upper bounds allow SLACK_MS of
 * scheduling delay, which a saturated 2-core machine (ctest -j2 beside the server tests) needs.
 * What tight upper bounds used to catch is asserted exactly from requests.jsonl instead: the
 * two-token chunk's gap split into two equal per-token samples, each request's samples summing
 * to its first-to-last chunk time, and TTFO never before TTFT.
 * LM_LINK: lm_bench */
#include <arpa/inet.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <openssl/sha.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/file.h"
#include "bench/profile.h"
#include "check.h"

/* ---- the scripted server ---- */

static int g_listen = -1, g_port;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_records[256];
static atomic_int g_tamper, g_drop, g_requests;

static double mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void hex_of(const void *p, size_t n, char out[65]) {
    unsigned char md[32];
    SHA256(p, n, md);
    for (int i = 0; i < 32; i++)
        sprintf(out + 2 * i, "%02x", md[i]);
}

static void send_all(int fd, const char *s, size_t n) {
    while (n) {
        ssize_t k = send(fd, s, n, MSG_NOSIGNAL);
        if (k <= 0) return;
        s += k, n -= (size_t)k;
    }
}

static void event(int fd, const char *id, const char *delta_json, const char *finish) {
    char buf[1024];
    snprintf(buf, sizeof buf,
             "data: {\"id\":\"%s\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,"
             "\"delta\":%s,\"finish_reason\":%s}]}\n\n",
             id, delta_json, finish ? finish : "null");
    send_all(fd, buf, strlen(buf));
}

/* The value of header `name` in the raw request head, copied to out. */
static void header(const char *head, const char *name, char *out, size_t n) {
    out[0] = 0;
    size_t nl = strlen(name);
    for (const char *p = head; (p = strchr(p, '\n'));) {
        p++;
        if (!strncasecmp(p, name, nl) && p[nl] == ':') {
            const char *v = p + nl + 1;
            while (*v == ' ')
                v++;
            size_t len = strcspn(v, "\r\n");
            snprintf(out, n, "%.*s", (int)(len < n - 1 ? len : n - 1), v);
            return;
        }
    }
}

static void *serve_conn(void *arg) {
    int fd = (int)(intptr_t)arg;
    struct lm_buf in = {0};
    char buf[65536];
    char *body = NULL;
    size_t need = 0;
    for (;;) {
        ssize_t k = recv(fd, buf, sizeof buf, 0);
        if (k <= 0) break;
        lm_buf_append(&in, buf, (size_t)k);
        char *e = strstr(in.p, "\r\n\r\n");
        if (e && !body) {
            char cl[32];
            *e = 0;
            header(in.p, "Content-Length", cl, sizeof cl);
            *e = '\r';
            need = (size_t)(e + 4 - in.p) + (size_t)atol(cl);
            body = e + 4;
        }
        if (body && in.len >= need) break;
    }
    if (!in.p || !body) {
        close(fd);
        lm_buf_free(&in);
        return NULL;
    }
    double t_arrival = mono_ms();
    body = strstr(in.p, "\r\n\r\n") + 4;
    body[-4] = 0;
    const char *head = in.p;
    if (!strncmp(head, "GET /v1/models", 14)) {
        const char *r =
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
            "{\"object\":\"list\",\"data\":[{\"id\":\"scripted\",\"object\":\"model\"}]}";
        send_all(fd, r, strlen(r));
    } else if (strncmp(head, "POST /v1/chat/completions", 25)) {
        const char *r = "HTTP/1.1 404 Not Found\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
        send_all(fd, r, strlen(r));
    } else {
        char rid[128], cid[128], phase[32], turn_s[16];
        header(head, "X-Request-Id", rid, sizeof rid);
        header(head, "X-Conversation-Id", cid, sizeof cid);
        header(head, "X-Lumen-Phase", phase, sizeof phase);
        header(head, "X-Lumen-Turn", turn_s, sizeof turn_s);
        int turn = atoi(turn_s);
        int n = atomic_fetch_add(&g_requests, 1);
        char id[64];
        snprintf(id, sizeof id, "chatcmpl-s%d", n);
        json_t *req = json_loads(body, 0, NULL);
        json_t *msgs = json_object_get(req, "messages");
        char resp[512];
        snprintf(resp, sizeof resp,
                 "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                 "Connection: close\r\nX-Request-Id: %s\r\n\r\n",
                 rid);
        send_all(fd, resp, strlen(resp));
        bool warm = !strcmp(phase, "warmup");
        double t_first = 0;
        const char *reasoning = "", *content;
        int completion_tokens, prompt_tokens = 7 + 10 * turn;
        const char *finish;
        event(fd, id, "{\"role\":\"assistant\",\"content\":\"\"}", NULL);
        if (warm) {
            content = "warm";
            t_first = mono_ms();
            event(fd, id, "{\"content\":\"warm\"}", "\"length\"");
            completion_tokens = 999;
            finish = "length";
        } else if (turn == 0) {
            sleep_ms(100);
            t_first = mono_ms();
            event(fd, id, "{\"content\":\"Hello\"}", NULL);
            sleep_ms(60);
            event(fd, id, "{\"content\":\" big world\"}", NULL);
            sleep_ms(30);
            event(fd, id, "{\"content\":\"!\"}", "\"length\"");
            content = "Hello big world!";
            completion_tokens = 4;
            finish = "length";
        } else {
            sleep_ms(40);
            t_first = mono_ms();
            event(fd, id, "{\"reasoning_content\":\"Let me think\"}", NULL);
            sleep_ms(80);
            event(fd, id, "{\"content\":\"Sure\"}", "\"stop\"");
            reasoning = "Let me think";
            content = "Sure";
            completion_tokens = 5; /* 4 of text and the stop token */
            finish = "stop";
        }
        char usage[256];
        snprintf(usage, sizeof usage,
                 "data: {\"id\":\"%s\",\"choices\":[],\"usage\":{\"prompt_tokens\":%d,"
                 "\"completion_tokens\":%d,\"total_tokens\":%d}}\n\ndata: [DONE]\n\n",
                 id, prompt_tokens, completion_tokens, prompt_tokens + completion_tokens);
        /* Finished before the last bytes go out, as lumen serve stamps its engine's finish
         * before the response: stamped after the send, a descheduled script thread could
         * record a total longer than the client's measured latency (verification then fails). */
        double t_finish = mono_ms();
        send_all(fd, usage, strlen(usage));
        /* the record */
        json_t *roles = json_array(), *hashes = json_array();
        size_t i;
        json_t *m;
        char hex[65];
        bool tamper = atomic_load(&g_tamper) && strstr(cid, "-c1") && turn == 1;
        json_array_foreach(msgs, i, m) {
            const char *role = json_string_value(json_object_get(m, "role"));
            const char *c = json_string_value(json_object_get(m, "content"));
            json_array_append_new(roles, json_string(role));
            struct lm_buf t = {0};
            lm_buf_puts(&t, c ? c : "");
            if (tamper && !strcmp(role, "assistant")) lm_buf_puts(&t, " (edited)");
            hex_of(t.p ? t.p : "", t.len, hex);
            lm_buf_free(&t);
            json_array_append_new(hashes, json_string(hex));
        }
        struct lm_buf text = {0};
        lm_buf_puts(&text, reasoning);
        lm_buf_puts(&text, content);
        hex_of(text.p, text.len, hex);
        lm_buf_free(&text);
        json_t *rec = json_pack(
            "{s:s,s:s,s:s,s:s,s:i,s:s,s:s,s:i,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:i,s:i,s:i,s:s,s:o,"
            "s:o,s:n,s:n,s:s}",
            "id", id, "x_request_id", rid, "conversation_id", cid, "phase", phase, "turn", turn,
            "model", "scripted", "endpoint", "/v1/chat/completions", "http_status", 200,
            "t_arrival_ms", t_arrival, "t_scheduled_ms", t_arrival, "t_first_token_ms", t_first,
            "t_finish_ms", t_finish, "queue_ms", 0.0, "prefill_ms", t_first - t_arrival,
            "decode_ms", t_finish - t_first, "total_ms", t_finish - t_arrival, "prompt_tokens",
            prompt_tokens, "cached_tokens", 0, "completion_tokens", completion_tokens,
            "finish_reason", finish, "roles", roles, "content_sha256", hashes, "prompt_ids_sha256",
            "completion_ids_sha256", "completion_text_sha256", hex);
        char *line = json_dumps(rec, JSON_COMPACT);
        bool drop = atomic_load(&g_drop) && strstr(rid, "-c0-t2");
        pthread_mutex_lock(&g_mu);
        FILE *f = g_records[0] && !drop ? fopen(g_records, "a") : NULL;
        if (f) {
            fprintf(f, "%s\n", line);
            fclose(f);
        }
        pthread_mutex_unlock(&g_mu);
        free(line);
        json_decref(rec);
        json_decref(req);
    }
    shutdown(fd, SHUT_WR);
    close(fd);
    lm_buf_free(&in);
    return NULL;
}

static void *accept_loop(void *arg) {
    for (;;) {
        int fd = accept(g_listen, NULL, NULL);
        if (fd < 0) return NULL;
        pthread_t t;
        pthread_create(&t, NULL, serve_conn, (void *)(intptr_t)fd);
        pthread_detach(t);
    }
}

static bool start_scripted_server(void) {
    g_listen = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (g_listen < 0 || bind(g_listen, (struct sockaddr *)&a, sizeof a) || listen(g_listen, 64) ||
        getsockname(g_listen, (struct sockaddr *)&a, &len))
        return false;
    g_port = ntohs(a.sin_port);
    pthread_t t;
    pthread_create(&t, NULL, accept_loop, NULL);
    pthread_detach(t);
    return true;
}

/* ---- helpers ---- */

static char g_dir[64];
static char g_url[64];

static struct lm_bench_profile_opts base_opts(const char *sub, bool records) {
    struct lm_bench_profile_opts o = {0};
    o.params = lm_bench_default_params();
    o.params.url = g_url;
    o.params.conversations = 3;
    o.params.warmup_requests = 2;
    o.params.think_time_mean_ms = 20;
    o.params.max_tokens = 16;
    o.data = lm_bench_dataset_default_opts();
    o.data.name = "mt_bench";
    o.data.path = LM_SOURCE_DIR "/data/mt_bench/question.jsonl";
    o.tokenizer_dir = TINY_MODEL;
    static char dir[8][160];
    static int k;
    char *d = dir[k++ % 8];
    snprintf(d, 160, "%s/%s", g_dir, sub);
    o.artifact_dir = d;
    if (records) {
        snprintf(g_records, sizeof g_records, "%s/%s.records.jsonl", g_dir, sub);
        unlink(g_records);
        o.server_records = g_records;
    } else {
        g_records[0] = 0;
    }
    o.command_line = "test_profile_metrics";
    return o;
}

static double metric(json_t *summary, const char *name, const char *stat) {
    json_t *v = json_object_get(json_object_get(json_object_get(summary, "metrics"), name), stat);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static bool in(double v, double lo, double hi) {
    return v >= lo && v <= hi;
}

/* Scheduling delay allowed above a figure's nominal value (see the header). */
#define SLACK_MS 750.0

static bool near_ms(double a, double b) {
    return fabs(a - b) < 1e-3;
}

/* The run folder's requests.jsonl as an array (an empty one when absent). */
static json_t *load_requests(const char *dir) {
    json_t *all = json_array();
    char p[256];
    snprintf(p, sizeof p, "%s/requests.jsonl", dir);
    FILE *f = fopen(p, "r");
    char *line = NULL;
    size_t cap = 0;
    while (f && getline(&line, &cap, f) > 0) {
        json_t *o = json_loads(line, 0, NULL);
        if (o) json_array_append_new(all, o);
    }
    free(line);
    if (f) fclose(f);
    return all;
}

static json_t *load(const char *dir, const char *name) {
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return json_load_file(p, 0, NULL);
}

static void test_clean_run(void) {
    struct lm_bench_profile_opts o = base_opts("clean", true);
    struct lm_bench_profile_result res;
    FILE *out = tmpfile();
    o.out = out;
    lm_status st = lm_bench_profile(&o, &res);
    CHECK(st == LM_OK, "profile: %s", lm_error_message());
    CHECK(res.exit_code == 0 && res.verification_available && res.verification_ok,
          "exit %d, verification %d/%d", res.exit_code, res.verification_available,
          res.verification_ok);
    json_t *s = res.summary;
    const char *u_rt = json_string_value(json_object_get(json_object_get(s, "units"), "request_throughput")),
               *u_ot = json_string_value(json_object_get(json_object_get(s, "units"), "output_token_throughput"));
    CHECK(u_rt && !strcmp(u_rt, "requests/s") && u_ot && !strcmp(u_ot, "tokens/s"), "summary.json: the scalars' units");
    CHECK(json_integer_value(json_object_get(s, "request_count")) == 6 &&
              json_integer_value(json_object_get(s, "warmup_requests")) == 2,
          "6 measured requests, 2 warmup");
    /* TTFT: turn 1 at 100 ms, turn 2 at 40 ms; the role-only chunk never counts; no warmup
     * leak (warmup answers at ~0 ms with 999 tokens) */
    double ttft_min = metric(s, "time_to_first_token", "min"),
           ttft_max = metric(s, "time_to_first_token", "max");
    CHECK(in(ttft_min, 38, 40 + SLACK_MS) && in(ttft_max, 98, 100 + SLACK_MS), "TTFT %g..%g",
          ttft_min, ttft_max);
    CHECK(metric(s, "output_sequence_length", "max") < 999 &&
              metric(s, "output_sequence_length", "min") == 4,
          "OSL %g..%g: warmup excluded", metric(s, "output_sequence_length", "min"),
          metric(s, "output_sequence_length", "max"));
    /* ITL per token: 30 ms (the 60 ms gap before the two-token chunk is divided by 2); the
     * chunk gaps themselves are 30, 60 and 80 ms. A late read can shorten one gap by what it
     * adds to the one before, so only the exact split below is tight. */
    double itl50 = metric(s, "inter_token_latency_per_token", "p50");
    CHECK(in(itl50, 10, 30 + SLACK_MS), "ITL per token p50 %g", itl50);
    /* inter_token_latency is AIPerf's: one value a request (checked against its formula per
     * request below), so its count is the 6 measured requests, not the tokens */
    CHECK(json_integer_value(json_object_get(json_object_get(json_object_get(s, "metrics"), "inter_token_latency"),
                                             "count")) == 6,
          "inter_token_latency: one value a request (AIPerf)");
    CHECK(in(metric(s, "inter_chunk_latency", "max"), 58, 80 + SLACK_MS), "ICL max %g",
          metric(s, "inter_chunk_latency", "max"));
    json_t *reqs = load_requests(res.dir);
    int turn1 = 0;
    size_t ri;
    json_t *rq;
    json_array_foreach(reqs, ri, rq) {
        if (strcmp(json_string_value(json_object_get(rq, "phase")), "profiling") ||
            json_integer_value(json_object_get(rq, "turn")) != 1)
            continue;
        turn1++;
        json_t *tk = json_object_get(rq, "chunk_tokens"),
               *tm = json_object_get(rq, "chunk_times_ms"), *itl = json_object_get(rq, "itl_ms");
        double t[3], x[3];
        for (int k = 0; k < 3; k++) {
            t[k] = json_number_value(json_array_get(tm, (size_t)k));
            x[k] = json_number_value(json_array_get(itl, (size_t)k));
        }
        CHECK(json_array_size(tk) == 3 && json_integer_value(json_array_get(tk, 0)) == 1 &&
                  json_integer_value(json_array_get(tk, 1)) == 2 &&
                  json_integer_value(json_array_get(tk, 2)) == 1 && json_array_size(tm) == 3 &&
                  json_array_size(itl) == 3,
              "turn 1: chunks of 1, 2 and 1 tokens, 3 per-token ITL samples");
        CHECK(near_ms(x[0], x[1]) && near_ms(2 * x[0], t[1] - t[0]) && near_ms(x[2], t[2] - t[1]),
              "turn 1: the two-token chunk's %.3f ms gap split in two (%.3f, %.3f), then %.3f (gap "
              "%.3f)",
              t[1] - t[0], x[0], x[1], x[2], t[2] - t[1]);
        const double lat = json_number_value(json_object_get(rq, "request_latency_ms")),
                     ttft = json_number_value(json_object_get(rq, "ttft_ms")),
                     out_tokens = (double)json_integer_value(json_object_get(rq, "output_tokens"));
        CHECK(out_tokens >= 2 && fabs(json_number_value(json_object_get(rq, "inter_token_latency_ms")) -
                                      (lat - ttft) / (out_tokens - 1)) < 1e-9,
              "turn 1: inter_token_latency_ms %.3f is AIPerf's (latency %.3f - TTFT %.3f) / (%g - 1)",
              json_number_value(json_object_get(rq, "inter_token_latency_ms")), lat, ttft, out_tokens);
        CHECK(json_number_value(json_object_get(rq, "ttfo_ms")) >=
                      json_number_value(json_object_get(rq, "ttft_ms")) &&
                  json_number_value(json_object_get(rq, "request_latency_ms")) >= 190,
              "turn 1: TTFO not before TTFT, latency at least the 190 ms the script sleeps");
    }
    CHECK(turn1 == 3, "3 measured turn-1 requests in requests.jsonl, %d", turn1);
    json_decref(reqs);
    CHECK(in(metric(s, "think_time_measured", "min"), 19, 20 + SLACK_MS) &&
              json_integer_value(json_object_get(
                  json_object_get(json_object_get(s, "metrics"), "think_time_measured"),
                  "count")) == 3,
          "think gaps measured");
    /* per turn */
    json_t *pt = json_object_get(s, "per_turn");
    json_t *t1 = json_array_get(pt, 0), *t2 = json_array_get(pt, 1);
    double t1ttft =
        json_number_value(json_object_get(json_object_get(t1, "time_to_first_token"), "p50"));
    double t2ttft =
        json_number_value(json_object_get(json_object_get(t2, "time_to_first_token"), "p50"));
    double t2ttfo = json_number_value(
        json_object_get(json_object_get(t2, "time_to_first_output_token"), "p50"));
    double t1itl =
        json_number_value(json_object_get(json_object_get(t1, "inter_token_latency"), "p50"));
    CHECK(json_array_size(pt) == 2 &&
              json_integer_value(json_object_get(t1, "request_count")) == 3 &&
              json_integer_value(json_object_get(t2, "request_count")) == 3,
          "per-turn rows");
    CHECK(in(t1ttft, 98, 100 + SLACK_MS) && in(t2ttft, 38, 40 + SLACK_MS) &&
              in(t2ttfo, 118, 120 + SLACK_MS) && t2ttfo >= t2ttft && in(t1itl, 10, 30 + SLACK_MS),
          "per turn: TTFT %g / %g, TTFO %g, ITL %g", t1ttft, t2ttft, t2ttfo, t1itl);
    /* at concurrency 1 every request is alone: turn 1's tokens/s = 12 tokens / its summed latency
     */
    double alone = json_number_value(json_object_get(t1, "alone_s"));
    double tps = json_number_value(json_object_get(t1, "output_token_throughput_alone"));
    CHECK(in(alone, 0.57, 0.57 + 3 * SLACK_MS / 1e3) && in(tps * alone, 11.9, 12.1),
          "turn 1 alone %g s, %g tok/s", alone, tps);
    /* usage vs lumen's tokenizer: turn 1 equal (4), turn 2 one more (the stop token) */
    json_t *uc = json_object_get(s, "usage_check");
    CHECK(json_integer_value(json_object_get(uc, "output_equal")) == 3 &&
              json_integer_value(json_object_get(uc, "output_plus_stop_token")) == 3 &&
              json_integer_value(json_object_get(uc, "output_mismatch")) == 0,
          "usage check");
    /* server-side time */
    CHECK(in(metric(s, "server_total_time", "p50"), 100, 190 + SLACK_MS), "server total %g",
          metric(s, "server_total_time", "p50"));
    /* the folder */
    const char *files[] = {"requests.jsonl", "summary.json",    "summary.csv",
                           "summary.txt",    "report.html",     "manifest.json",
                           "coverage.json",  "selection.jsonl", "verification.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char p[256];
        snprintf(p, sizeof p, "%s/%s", res.dir, files[i]);
        CHECK(lm_file_exists(p), "%s", p);
    }
    struct lm_buf html = {0};
    char p[256];
    snprintf(p, sizeof p, "%s/report.html", res.dir);
    lm_file_read(p, &html);
    int svgs = 0;
    for (const char *q = html.p; q && (q = strstr(q, "<svg")); q++)
        svgs++;
    CHECK(svgs >= 5 && !strstr(html.p, "<script") && !strstr(html.p, "<link") &&
              strstr(html.p, "Per turn"),
          "report.html: %d inline SVG plots, self-contained", svgs);
    lm_buf_free(&html);
    json_t *man = load(res.dir, "manifest.json");
    CHECK(man && json_is_object(json_object_get(json_object_get(man, "server"), "v1_models")) &&
              !strcmp(json_string_value(json_object_get(json_object_get(man, "dataset"), "sha256")),
                      "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7") &&
              json_integer_value(
                  json_object_get(json_object_get(man, "hardware"), "cpu_logical_cores")) > 0,
          "manifest");
    json_decref(man);
    json_t *cov = load(res.dir, "coverage.json");
    bool qualified = false;
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(cov, "cells"), i, c) {
        const char *w = json_string_value(json_object_get(c, "workload"));
        const char *m = json_string_value(json_object_get(c, "mode"));
        const char *stt = json_string_value(json_object_get(c, "status"));
        if (!strcmp(w, "mt_bench") && !strcmp(m, "ordinary")) qualified = !strcmp(stt, "qualified");
        if (!strcmp(m, "speculative")) CHECK(!strcmp(stt, "planned"), "speculative stays planned");
    }
    CHECK(qualified, "mt_bench x ordinary is qualified");
    json_decref(cov);
    rewind(out);
    char text[32768];
    text[fread(text, 1, sizeof text - 1, out)] = 0;
    fclose(out);
    CHECK(strstr(text, "Verification against") && strstr(text, "PASSED") &&
              strstr(text, "ordinary generation"),
          "summary text:\n%s", text);
    lm_bench_profile_result_free(&res);
}

static void test_tampered_and_missing(void) {
    struct lm_bench_profile_opts o = base_opts("tampered", true);
    struct lm_bench_profile_result res;
    atomic_store(&g_tamper, 1);
    lm_status st = lm_bench_profile(&o, &res);
    atomic_store(&g_tamper, 0);
    CHECK(st == LM_OK && res.exit_code == 1 && res.verification_available && !res.verification_ok,
          "tampered history: exit %d", res.exit_code);
    json_t *v = res.dir ? load(res.dir, "verification.json") : NULL;
    CHECK(json_integer_value(json_object_get(
              json_object_get(json_object_get(v, "checks"), "history"), "failed")) == 1,
          "history check failed once");
    json_decref(v);
    lm_bench_profile_result_free(&res);

    o = base_opts("missing", true);
    atomic_store(&g_drop, 1);
    st = lm_bench_profile(&o, &res);
    atomic_store(&g_drop, 0);
    CHECK(st == LM_OK && res.exit_code == 1 && !res.verification_ok, "missing record: exit %d",
          res.exit_code);
    v = res.dir ? load(res.dir, "verification.json") : NULL;
    CHECK(json_integer_value(json_object_get(v, "requests_without_record")) == 1,
          "one request without a record");
    json_decref(v);
    lm_bench_profile_result_free(&res);
}

static void test_no_records_and_limits(void) {
    struct lm_bench_profile_opts o = base_opts("norecords", false);
    o.params.conversations = 0;
    o.params.request_count = 3;
    o.params.warmup_requests = 0;
    struct lm_bench_profile_result res;
    FILE *out = tmpfile();
    o.out = out;
    lm_status st = lm_bench_profile(&o, &res);
    CHECK(st == LM_OK && res.exit_code == 0 && !res.verification_available, "no records: exit %d",
          res.exit_code);
    json_t *s = res.summary;
    CHECK(json_integer_value(json_object_get(s, "requests_sent")) == 3 &&
              json_integer_value(json_object_get(s, "skipped_by_limit")) == 1 &&
              !strcmp(json_string_value(json_object_get(s, "limit_hit")), "request_count"),
          "request-count limit: sent %lld, limited %lld",
          (long long)json_integer_value(json_object_get(s, "requests_sent")),
          (long long)json_integer_value(json_object_get(s, "skipped_by_limit")));
    rewind(out);
    char text[32768];
    text[fread(text, 1, sizeof text - 1, out)] = 0;
    fclose(out);
    CHECK(strstr(text, "Verification: unavailable"), "says verification unavailable");
    lm_bench_profile_result_free(&res);

    /* warmup by duration, profiling by duration */
    o = base_opts("duration", false);
    o.params.conversations = 0;
    o.params.duration_s = 0.5;
    o.params.warmup_requests = 0;
    o.params.warmup_duration_s = 0.2;
    o.params.concurrency = 2;
    double t0 = mono_ms();
    st = lm_bench_profile(&o, &res);
    double took = mono_ms() - t0;
    s = res.summary;
    CHECK(st == LM_OK && res.exit_code == 0 &&
              !strcmp(json_string_value(json_object_get(s, "limit_hit")), "duration") &&
              json_integer_value(json_object_get(s, "warmup_requests")) >= 2 && took < 8000,
          "duration limits: warmup %lld requests, took %.0f ms",
          (long long)json_integer_value(json_object_get(s, "warmup_requests")), took);
    /* no request released after 0.5 s: the measured requests' send times span at most that
     * (plus a quarter second for a sender preempted between its deadline check and its send) */
    json_t *reqs = res.dir ? load_requests(res.dir) : json_array();
    double first = INFINITY, last = -INFINITY;
    size_t ri;
    json_t *rq;
    json_array_foreach(reqs, ri, rq) {
        if (strcmp(json_string_value(json_object_get(rq, "phase")), "profiling") ||
            !json_is_true(json_object_get(rq, "sent")))
            continue;
        double t = json_number_value(json_object_get(rq, "start_time"));
        first = fmin(first, t);
        last = fmax(last, t);
    }
    json_decref(reqs);
    CHECK(isfinite(first) && last - first <= 0.75, "measured requests sent over %g s (limit 0.5 s)",
          last - first);
    CHECK(json_number_value(json_object_get(s, "benchmark_duration_s")) <
              0.5 + 0.19 + SLACK_MS / 1e3,
          "the window ends with the last request (window %g s)",
          json_number_value(json_object_get(s, "benchmark_duration_s")));
    lm_bench_profile_result_free(&res);

    /* request-rate mode, Poisson arrivals */
    o = base_opts("rate", true);
    o.params.request_rate = 20;
    o.params.arrival = LM_BENCH_ARRIVAL_POISSON;
    o.params.seed = 3;
    o.params.concurrency = 0;
    o.params.conversations = 3;
    st = lm_bench_profile(&o, &res);
    CHECK(st == LM_OK && res.exit_code == 0 && res.n_ok == 6 && res.verification_ok,
          "rate mode: exit %d, %zu ok", res.exit_code, res.n_ok);
    lm_bench_profile_result_free(&res);
}

static void test_sweep(void) {
    struct lm_bench_profile_opts o = base_opts("sweep", false);
    o.params.conversations = 2;
    o.params.warmup_requests = 1;
    o.params.think_time_mean_ms = 0;
    double values[] = {1, 2};
    char *dir = NULL;
    int rc = -1;
    lm_status st = lm_bench_sweep(&o, "concurrency", values, 2, &dir, &rc);
    CHECK(st == LM_OK && rc == 0, "sweep: %s", lm_error_message());
    json_t *sw = dir ? load(dir, "sweep.json") : NULL;
    json_t *pts = json_object_get(sw, "points");
    CHECK(json_array_size(pts) == 2 && json_number_value(json_object_get(
                                           json_array_get(pts, 0), "output_token_throughput")) > 0,
          "two sweep points");
    char p[256];
    snprintf(p, sizeof p, "%s/sweep.html", dir ? dir : "");
    struct lm_buf html = {0};
    lm_file_read(p, &html);
    CHECK(html.p && strstr(html.p, "<svg") && strstr(html.p, "polyline"),
          "sweep.html draws the curve");
    snprintf(p, sizeof p, "%s/concurrency-2/report.html", dir ? dir : "");
    CHECK(lm_file_exists(p), "%s", p);
    lm_buf_free(&html);
    json_decref(sw);
    free(dir);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/lm_test_profile_metrics_XXXXXX");
    CHECK(mkdtemp(g_dir) != NULL, "mkdtemp");
    CHECK(start_scripted_server(), "scripted server");
    snprintf(g_url, sizeof g_url, "http://127.0.0.1:%d", g_port);
    test_clean_run();
    test_tampered_and_missing();
    test_no_records_and_limits();
    test_sweep();
    if (!g_check_failures) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
        if (system(cmd)) fprintf(stderr, "could not remove %s\n", g_dir);
    } else {
        fprintf(stderr, "files kept in %s\n", g_dir);
    }
    return check_exit("test_profile_metrics");
}
