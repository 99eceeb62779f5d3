/* test_profile.c: `lumen profile` end to end against `lumen serve` on the tiny model.
 *
 * Starts the server on a free port, replays 3 MT-Bench conversations (1 warmup request) with
 * --output, and checks the JSONL against the corpus and against itself: 6 profiling records and
 * 1 warmup record; each turn-2 request carried MT-Bench's turn-1 question, the turn-1 answer
 * the server actually streamed for that conversation id, and MT-Bench's turn-2 question; every
 * request has TTFT <= latency and output tokens > 0; turn 2's prompt is longer than turn 1's;
 * the summary on stdout names every metric, and verification against the server's own request
 * records (lumen serve --records) passes with the prompt_ids check. Then the two other corpora: the
 * qwen3-conversations preset (6 selected ShareGPT conversations, 2 turns each) and a Spec-Bench
 * subset (category qa), each checked through its run folder (summary.json, selection.jsonl,
 * report.html), and `lumen profile sweep` over concurrency 1,2; the manifests record the
 * command line as typed. The server is killed at the end (and dies with this process if the test
 * crashes).
 * Before that, against a slow stand-in server written here (no model): output paths that cannot
 * be used fail before any request is sent; a records file that is not JSONL still writes the run,
 * with verification failed; and SIGINT in the middle of a run stops it within a few seconds,
 * exits 130 and writes the run folder from the requests that completed, marked interrupted.
 * LM_LABEL: server */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/buf.h"
#include "check.h"

static pid_t g_server = -1;

static void stop_server(void) {
    if (g_server <= 0) return;
    kill(g_server, SIGTERM);
    for (int i = 0; i < 100; i++) { /* up to 10 s for a clean exit */
        if (waitpid(g_server, NULL, WNOHANG) == g_server) {
            g_server = -1;
            return;
        }
        usleep(100000);
    }
    kill(g_server, SIGKILL);
    waitpid(g_server, NULL, 0);
    g_server = -1;
}

static pid_t g_fake = -1; /* the stand-in server of test_paths and test_interrupt */

static void on_signal(int sig) {
    if (g_server > 0) kill(g_server, SIGKILL);
    if (g_fake > 0) kill(g_fake, SIGKILL);
    signal(sig, SIG_DFL);
    raise(sig);
}

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) ||
        getsockname(fd, (struct sockaddr *)&a, &len))
        return -1;
    close(fd);
    return ntohs(a.sin_port);
}

static size_t discard(char *p, size_t s, size_t n, void *ud) {
    return s * n;
}

static long http_get_status(const char *url) {
    CURL *h = curl_easy_init();
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 2000L);
    long status = 0;
    if (curl_easy_perform(h) == CURLE_OK) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(h);
    return status;
}

static void print_file(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        fwrite(buf, 1, n, stderr);
    fclose(f);
}

/* Starts `lumen serve` and waits up to 120 s for /health; false (with the log shown) if not. */
static char g_records[256];

/* spec: a --speculative-config for the server, or NULL. */
static bool start_server(int port, const char *log, const char *spec) {
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", port);
    g_server = fork();
    if (g_server == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (!freopen(log, "w", stdout) || dup2(fileno(stdout), 2) < 0) _exit(127);
        if (spec)
            execl(LM_LUMEN_BIN, LM_LUMEN_BIN, "serve", "--model", TINY_MODEL, "--port", port_s,
                  "--records", g_records, "--speculative-config", spec, (char *)NULL);
        else
            execl(LM_LUMEN_BIN, LM_LUMEN_BIN, "serve", "--model", TINY_MODEL, "--port", port_s,
                  "--records", g_records, (char *)NULL);
        _exit(127);
    }
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/health", port);
    for (int i = 0; i < 1200; i++) {
        if (http_get_status(url) == 200) return true;
        int status;
        if (waitpid(g_server, &status, WNOHANG) == g_server) {
            g_server = -1;
            fprintf(stderr, "lumen serve exited (status %d) before /health answered; its log:\n",
                    status);
            print_file(log);
            return false;
        }
        usleep(100000);
    }
    fprintf(stderr, "lumen serve did not answer /health within 120 s; its log:\n");
    print_file(log);
    return false;
}

static const char *str(json_t *o, const char *key) {
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

/* messages[i].content of a record, and its role in *role. */
static const char *msg(json_t *rec, size_t i, const char **role) {
    json_t *m = json_array_get(json_object_get(rec, "messages"), i);
    *role = str(m, "role");
    return str(m, "content");
}

static size_t append(char *p, size_t s, size_t n, void *ud) {
    lm_buf_append(ud, p, s * n);
    return s * n;
}

/* The value of a sample `name` (no labels) in the server's /metrics, or -1. */
static double scrape_metric(int port, const char *name) {
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/metrics", port);
    struct lm_buf b = {0};
    CURL *h = curl_easy_init();
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, append);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 5000L);
    double v = -1;
    if (curl_easy_perform(h) == CURLE_OK && b.p) {
        size_t n = strlen(name);
        for (const char *q = b.p; (q = strstr(q, name)); q += n)
            if ((q == b.p || q[-1] == '\n') && q[n] == ' ') {
                v = strtod(q + n + 1, NULL);
                break;
            }
    }
    curl_easy_cleanup(h);
    lm_buf_free(&b);
    return v;
}

/* A server with speculative decoding: the profile's summary reports its acceptance, and the
 * counts are the server's own token counters (not its draft-step counter added in). */
static void test_speculative(const char *dir) {
    char log[256], sdir[256], cmd[2048];
    snprintf(log, sizeof log, "%s/server_spec.log", dir);
    snprintf(sdir, sizeof sdir, "%s/spec", dir);
    int port = free_port();
    if (port <= 0 || !start_server(port, log, "{\"method\":\"ngram\",\"num_speculative_tokens\":3,"
                                                "\"prompt_lookup_min\":1}")) {
        CHECK(false, "lumen serve --speculative-config did not come up");
        stop_server();
        return;
    }
    snprintf(cmd, sizeof cmd,
             "cd '%s' && '%s' profile --url http://127.0.0.1:%d --dataset spec_bench --category qa "
             "--conversations 3 --max-tokens 24 --warmup-requests 0 --artifact-dir '%s' --quiet "
             "--server-records '%s' > '%s/spec.txt'",
             LM_SOURCE_DIR, LM_LUMEN_BIN, port, sdir, g_records, dir);
    int rc = system(cmd);
    CHECK(rc == 0, "lumen profile against a speculating server exited with %d", rc);
    double drafted = scrape_metric(port, "lumen_spec_decode_num_draft_tokens_total");
    double accepted = scrape_metric(port, "lumen_spec_decode_num_accepted_tokens_total");
    double drafts = scrape_metric(port, "lumen_spec_decode_num_drafts_total");
    stop_server();
    char path[512];
    snprintf(path, sizeof path, "%s/summary.json", sdir);
    json_t *sj = json_load_file(path, 0, NULL);
    json_t *sp = json_object_get(sj, "speculative");
    CHECK(!strcmp(str(sp, "mode"), "speculative") && drafted > 0 && accepted > 0 && drafts > 0 &&
              json_integer_value(json_object_get(sp, "draft_tokens")) == (json_int_t)drafted &&
              json_integer_value(json_object_get(sp, "accepted_tokens")) == (json_int_t)accepted,
          "speculative run: summary %s, %lld of %lld; the server's counters: %g of %g (%g drafts)",
          str(sp, "mode"), (long long)json_integer_value(json_object_get(sp, "accepted_tokens")),
          (long long)json_integer_value(json_object_get(sp, "draft_tokens")), accepted, drafted,
          drafts);
    /* Per request, from the joined records: accepted / drafted of each request that drafted,
     * against the same ratios read from the server's records file directly. */
    const char *run_id = str(sj, "run_id");
    json_t *acc = json_object_get(json_object_get(sj, "metrics"), "server_draft_acceptance");
    double lo = INFINITY, hi = -INFINITY;
    long n = 0;
    FILE *rf = fopen(g_records, "r");
    char line[8192];
    while (rf && fgets(line, sizeof line, rf)) {
        json_t *rec = json_loads(line, 0, NULL);
        const char *id = str(rec, "x_request_id");
        json_t *d = json_object_get(rec, "spec_draft_tokens"), *a = json_object_get(rec, "spec_accepted_tokens");
        if (*run_id && !strncmp(id, run_id, strlen(run_id)) && json_is_integer(d) && json_integer_value(d) > 0) {
            const double pct = 100.0 * (double)json_integer_value(a) / (double)json_integer_value(d);
            lo = pct < lo ? pct : lo;
            hi = pct > hi ? pct : hi;
            n++;
        }
        json_decref(rec);
    }
    if (rf) fclose(rf);
    CHECK(n > 0 && json_integer_value(json_object_get(acc, "count")) == n &&
              json_number_value(json_object_get(acc, "min")) == lo &&
              json_number_value(json_object_get(acc, "max")) == hi && lo >= 0 && hi <= 100,
          "per-request acceptance: %lld requests, %g..%g; from the records file: %ld, %g..%g",
          (long long)json_integer_value(json_object_get(acc, "count")),
          json_number_value(json_object_get(acc, "min")), json_number_value(json_object_get(acc, "max")), n, lo,
          hi);
    snprintf(path, sizeof path, "%s/spec.txt", dir);
    FILE *tf = fopen(path, "r");
    bool row = false;
    while (tf && fgets(line, sizeof line, tf)) row = row || strstr(line, "Server Draft Acceptance per Request (%)");
    if (tf) fclose(tf);
    CHECK(row, "the text summary has the per-request acceptance row");
    json_decref(sj);
}


/* ---- a slow stand-in server: GET /v1/models, and chat completions that stream ---- */

static bool write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k <= 0) return false;
        p += k, n -= (size_t)k;
    }
    return true;
}

static void fake_reply(int fd, const char *status, const char *ctype, const char *body) {
    char head[256];
    snprintf(head, sizeof head,
             "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
             status, ctype, strlen(body));
    if (write_all(fd, head, strlen(head))) write_all(fd, body, strlen(body));
}

/* One connection, one request: reads the head and the body (answering Expect: 100-continue),
 * then answers. A chat completion streams 4 content chunks 150 ms apart, then the finish, the
 * usage and [DONE], and appends one byte to `done` (so the test can count finished answers). */
static void fake_conn(int fd, const char *done) {
    char buf[1 << 16];
    size_t n = 0;
    char *end = NULL;
    while (!end && n < sizeof buf - 1) {
        ssize_t k = read(fd, buf + n, sizeof buf - 1 - n);
        if (k <= 0) return;
        n += (size_t)k;
        buf[n] = 0;
        end = strstr(buf, "\r\n\r\n");
    }
    if (!end) return;
    size_t head = (size_t)(end + 4 - buf), len = 0;
    for (char *l = buf; l && l < end; l = strstr(l, "\r\n") ? strstr(l, "\r\n") + 2 : NULL) {
        if (!strncasecmp(l, "content-length:", 15)) len = strtoul(l + 15, NULL, 10);
        if (!strncasecmp(l, "expect: 100-continue", 20))
            write_all(fd, "HTTP/1.1 100 Continue\r\n\r\n", 25);
    }
    size_t have = n - head;
    while (have < len) {
        ssize_t k = read(fd, buf, sizeof buf);
        if (k <= 0) return;
        have += (size_t)k;
    }
    if (!strncmp(buf, "GET /v1/models", 14)) {
        fake_reply(fd, "200 OK", "application/json", "{\"object\":\"list\",\"data\":[{\"id\":\"fake\"}]}");
        return;
    }
    if (strncmp(buf, "POST /v1/chat/completions", 25)) {
        fake_reply(fd, "404 Not Found", "text/plain", "not here");
        return;
    }
    static const char k_head[] =
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n";
    if (!write_all(fd, k_head, sizeof k_head - 1)) return;
    /* slow (40 chunks, 6 s: past the client's 2 s grace after a stop) once the answers counted
     * in `done` reach the number in `done`.slow, when that file exists (test_interrupt) */
    char slow_path[300];
    snprintf(slow_path, sizeof slow_path, "%s.slow", done);
    FILE *sf = fopen(slow_path, "r");
    long slow_from = -1;
    if (sf) {
        if (fscanf(sf, "%ld", &slow_from) != 1) slow_from = -1;
        fclose(sf);
    }
    struct stat dsb;
    const long answered = stat(done, &dsb) ? 0 : (long)dsb.st_size;
    const int chunks = slow_from >= 0 && answered >= slow_from ? 40 : 4;
    if (chunks > 4) { /* a slow answer has begun: `done`.inflight grows (test_interrupt waits for it) */
        char inflight[300];
        snprintf(inflight, sizeof inflight, "%s.inflight", done);
        int ff = open(inflight, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (ff >= 0) {
            write_all(ff, "x", 1);
            close(ff);
        }
    }
    for (int i = 0; i < chunks; i++) {
        usleep(150000);
        static const char k_chunk[] =
            "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"model\":\"fake\",\"choices\":"
            "[{\"index\":0,\"delta\":{\"content\":\"word \"},\"finish_reason\":null}]}\n\n";
        if (!write_all(fd, k_chunk, sizeof k_chunk - 1)) return;
    }
    static const char k_tail[] =
        "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"model\":\"fake\",\"choices\":"
        "[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n"
        "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"model\":\"fake\",\"choices\":[],"
        "\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":4,\"total_tokens\":14}}\n\n"
        "data: [DONE]\n\n";
    if (!write_all(fd, k_tail, sizeof k_tail - 1)) return;
    int df = open(done, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (df >= 0) {
        write_all(df, "x", 1);
        close(df);
    }
}

/* Starts the stand-in on a free port (a process per connection); returns the port, or -1. */
static int start_fake(const char *done) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 64) ||
        getsockname(fd, (struct sockaddr *)&a, &len))
        return -1;
    g_fake = fork();
    if (g_fake == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        signal(SIGCHLD, SIG_IGN); /* no zombies */
        for (;;) {
            int c = accept(fd, NULL, NULL);
            if (c < 0) continue;
            if (fork() == 0) {
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                close(fd);
                fake_conn(c, done);
                close(c);
                _exit(0);
            }
            close(c);
        }
    }
    close(fd);
    return g_fake > 0 ? ntohs(a.sin_port) : -1;
}

static void stop_fake(void) {
    if (g_fake <= 0) return;
    kill(g_fake, SIGKILL);
    waitpid(g_fake, NULL, 0);
    g_fake = -1;
}

static long file_size(const char *path) {
    struct stat sb;
    return stat(path, &sb) ? 0 : (long)sb.st_size;
}

static char *read_text(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return strdup("");
    static char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return strdup(buf);
}

/* Paths that cannot be used fail at once, naming the flag and the path, with nothing sent; a
 * records file that is not JSONL still gets the run written, with verification failed. */
static void test_paths(const char *dir, int port, const char *done) {
    char file[256], bad[256], cmd[2048], err[256];
    snprintf(file, sizeof file, "%s/a_file", dir);
    snprintf(bad, sizeof bad, "%s/bad_records.jsonl", dir);
    snprintf(err, sizeof err, "%s/paths.err", dir);
    FILE *f = fopen(file, "w");
    if (f) fclose(f);
    f = fopen(bad, "w");
    if (f) {
        fputs("this is not JSON\n", f);
        fclose(f);
    }
    char a[640], b[640], c[640];
    snprintf(a, sizeof a, "--artifact-dir %s/x", file);
    snprintf(b, sizeof b, "--output %s/x.jsonl --artifact-dir %s/out_bad", file, dir);
    /* a records file not there yet is fine (a server may create it late); one in a folder that
     * does not exist is not */
    snprintf(c, sizeof c, "--server-records %s/no_folder/none.jsonl --artifact-dir %s/rec_bad", dir, dir);
    const struct {
        const char *args, *want;
    } k_cases[] = {{a, "--artifact-dir"}, {b, "--output"}, {c, "--server-records"},
                   {"--artifact-dir /proc/lumen_no_such_dir", "--artifact-dir /proc/lumen_no_such_dir"}};
    for (size_t i = 0; i < sizeof k_cases / sizeof *k_cases; i++) {
        long before = file_size(done);
        snprintf(cmd, sizeof cmd,
                 "'%s' profile --url http://127.0.0.1:%d --model fake --dataset mt_bench "
                 "--dataset-path '%s/data/mt_bench/question.jsonl' --conversations 1 "
                 "--warmup-requests 0 --quiet %s > /dev/null 2> '%s'",
                 LM_LUMEN_BIN, port, LM_SOURCE_DIR, k_cases[i].args, err);
        int rc = system(cmd);
        char *e = read_text(err);
        CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 1 && strstr(e, k_cases[i].want) &&
                  !strchr(strchr(e, '\n') ? strchr(e, '\n') + 1 : "", '\n'),
              "%s: exit %d, want 1 and one line naming %s: %s", k_cases[i].args, rc,
              k_cases[i].want, e);
        free(e);
        usleep(200000);
        CHECK(file_size(done) == before, "%s: a request was answered before the path check failed",
              k_cases[i].args);
    }
    char path[512];
    snprintf(path, sizeof path, "%s/out_bad", dir);
    CHECK(access(path, F_OK) != 0, "%s: left behind by a run that never started", path);

    /* not JSONL: the run is written, verification failed with the reason */
    snprintf(cmd, sizeof cmd,
             "'%s' profile --url http://127.0.0.1:%d --model fake --dataset mt_bench "
             "--dataset-path '%s/data/mt_bench/question.jsonl' --conversations 1 "
             "--warmup-requests 0 --quiet --server-records '%s' --artifact-dir '%s/bad_rec' "
             "> '%s/bad_rec.txt' 2> '%s'",
             LM_LUMEN_BIN, port, LM_SOURCE_DIR, bad, dir, dir, err);
    int rc = system(cmd);
    CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 1, "records not JSONL: exit %d, want 1", rc);
    snprintf(path, sizeof path, "%s/bad_rec/summary.json", dir);
    json_t *sj = json_load_file(path, 0, NULL);
    json_t *ver = json_object_get(sj, "verification");
    CHECK(sj && json_integer_value(json_object_get(sj, "request_count")) == 2 &&
              json_is_false(json_object_get(ver, "ok")) &&
              json_is_string(json_object_get(ver, "error")),
          "records not JSONL: summary.json with 2 requests and verification failed with a reason");
    json_decref(sj);
    snprintf(path, sizeof path, "%s/bad_rec.txt", dir);
    char *txt = read_text(path);
    CHECK(strstr(txt, "Verification: FAILED (the server records could not be used"),
          "records not JSONL: summary.txt says why verification failed:\n%s", txt);
    free(txt);
    snprintf(path, sizeof path, "%s/bad_rec/report.html", dir);
    txt = read_text(path);
    CHECK(txt && strstr(txt, "FAILED</span>: the server records could not be used") && !strstr(txt, "unavailable: no server"),
          "records not JSONL: report.html says verification FAILED, not unavailable");
    free(txt);
}

/* SIGINT in the middle of a run of 30 two-turn conversations (each answer takes ~0.6 s): once
 * 3 answers finished, the run stops within a few seconds, exits 130, and its folder holds the
 * summary of what completed, marked interrupted. */
static void test_interrupt(const char *dir, int port, const char *done) {
    char out[256], err[256], rd[256], url[64], dpath[256];
    snprintf(out, sizeof out, "%s/int.txt", dir);
    snprintf(err, sizeof err, "%s/int.err", dir);
    snprintf(rd, sizeof rd, "%s/interrupted", dir);
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    snprintf(dpath, sizeof dpath, "%s/data/mt_bench/question.jsonl", LM_SOURCE_DIR);
    long before = file_size(done);
    /* the answers after the third are slow: the stop finds one in flight and cancels it */
    char slow[300];
    snprintf(slow, sizeof slow, "%s.slow", done);
    FILE *sf = fopen(slow, "w");
    CHECK(sf != NULL, "%s", slow);
    if (sf) fprintf(sf, "%ld\n", before + 3), fclose(sf);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        signal(SIGINT, SIG_DFL);
        if (!freopen(out, "w", stdout) || !freopen(err, "w", stderr)) _exit(127);
        execl(LM_LUMEN_BIN, LM_LUMEN_BIN, "profile", "--url", url, "--model", "fake",
              "--dataset", "mt_bench", "--dataset-path", dpath, "--conversations", "30",
              "--concurrency", "2", "--warmup-requests", "0", "--artifact-dir", rd,
              (char *)NULL);
        _exit(127);
    }
    CHECK(pid > 0, "fork");
    if (pid <= 0) return;
    for (int i = 0; i < 300 && file_size(done) < before + 3; i++) /* up to 30 s */
        usleep(100000);
    CHECK(file_size(done) >= before + 3, "3 answers before the interrupt");
    /* and a slow answer under way (not the instant between an answer and the next request) */
    char inflight[300];
    snprintf(inflight, sizeof inflight, "%s.inflight", done);
    for (int i = 0; i < 100 && file_size(inflight) < 1; i++) /* up to 10 s */
        usleep(20000);
    CHECK(file_size(inflight) >= 1, "a slow answer in flight before the interrupt");
    double t0 = 0, t1 = 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    t0 = (double)ts.tv_sec + ts.tv_nsec * 1e-9;
    kill(pid, SIGINT);
    int status = 0;
    bool ended = false;
    for (int i = 0; i < 150 && !ended; i++) { /* up to 15 s */
        ended = waitpid(pid, &status, WNOHANG) == pid;
        if (!ended) usleep(100000);
    }
    clock_gettime(CLOCK_MONOTONIC, &ts);
    t1 = (double)ts.tv_sec + ts.tv_nsec * 1e-9;
    if (!ended) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    char *e = read_text(err);
    CHECK(ended && WIFEXITED(status) && WEXITSTATUS(status) == 130,
          "interrupted run: ended %d, status %d, want exit 130; stderr:\n%s", ended, status, e);
    CHECK(t1 - t0 < 6, "interrupted run took %.1f s to end", t1 - t0);
    CHECK(strstr(e, "interrupted (SIGINT)"), "stderr notes the interrupt:\n%s", e);
    free(e);
    char path[512];
    snprintf(path, sizeof path, "%s/summary.json", rd);
    json_t *sj = json_load_file(path, 0, NULL);
    json_int_t n = json_integer_value(json_object_get(sj, "request_count"));
    const char *sig =
        json_string_value(json_object_get(json_object_get(sj, "interruption"), "signal"));
    CHECK(sj && json_is_true(json_object_get(sj, "interrupted")) && sig && !strcmp(sig, "SIGINT"),
          "%s: marked interrupted by SIGINT", path);
    CHECK(n >= 3 && n < 60, "interrupted run: %lld requests in the summary, want 3..59",
          (long long)n);
    const json_int_t not_sent =
        json_integer_value(json_object_get(json_object_get(sj, "interruption"), "not_sent"));
    const json_int_t cancelled =
        json_integer_value(json_object_get(json_object_get(sj, "interruption"), "cancelled_in_flight"));
    CHECK(cancelled >= 1, "interrupted run: %lld requests cancelled in flight, want 1 or more", (long long)cancelled);
    unlink(slow);
    unlink(inflight);
    json_decref(sj);
    snprintf(path, sizeof path, "%s/requests.jsonl", rd);
    CHECK(access(path, R_OK) == 0, "%s", path);
    /* every planned turn the stop kept from being sent is skipped by the limit, also the second
     * turn of a conversation whose first was cancelled in flight: nothing failed */
    char *lines = read_text(path);
    json_int_t n_limit = 0, n_after_failure = 0, n_unsent = 0;
    for (char *ln = lines ? strtok(lines, "\n") : NULL; ln; ln = strtok(NULL, "\n")) {
        json_t *rec = json_loads(ln, 0, NULL);
        const char *why = json_string_value(json_object_get(rec, "skip_reason"));
        const char *ph = json_string_value(json_object_get(rec, "phase"));
        if (json_is_false(json_object_get(rec, "sent")) && ph && !strcmp(ph, "profiling")) {
            n_unsent++;
            if (why && !strcmp(why, "limit")) n_limit++;
        }
        if (why && !strcmp(why, "after_failure")) n_after_failure++;
        json_decref(rec);
    }
    free(lines);
    CHECK(n_unsent > 0 && n_limit == n_unsent && n_after_failure == 0 && not_sent == n_limit,
          "interrupted run: %lld unsent profiling turns, %lld of them 'limit', %lld 'after_failure' (want "
          "0), summary's not_sent %lld",
          (long long)n_unsent, (long long)n_limit, (long long)n_after_failure, (long long)not_sent);
    char *txt = read_text(out);
    CHECK(strstr(txt, "INTERRUPTED (SIGINT)"), "stdout marks the run interrupted:\n%s", txt);
    free(txt);
}

int main(void) {
    signal(SIGSEGV, on_signal);
    signal(SIGABRT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    curl_global_init(CURL_GLOBAL_DEFAULT);

    /* MT-Bench, read here independently of src/bench: question_id -> turns */
    json_t *mt = json_object();
    FILE *qf = fopen(LM_SOURCE_DIR "/data/mt_bench/question.jsonl", "r");
    CHECK(qf != NULL, "data/mt_bench/question.jsonl");
    char line[65536];
    while (qf && fgets(line, sizeof line, qf)) {
        json_t *q = json_loads(line, 0, NULL);
        if (!q) continue;
        char id[32];
        snprintf(id, sizeof id, "%lld",
                 (long long)json_integer_value(json_object_get(q, "question_id")));
        json_object_set(mt, id, json_object_get(q, "turns"));
        json_decref(q);
    }
    if (qf) fclose(qf);
    CHECK(json_object_size(mt) == 80, "MT-Bench has %zu questions", json_object_size(mt));

    char dir[] = "/tmp/lm_test_profile_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char log[256], out_jsonl[256], out_txt[256];
    snprintf(log, sizeof log, "%s/server.log", dir);
    snprintf(out_jsonl, sizeof out_jsonl, "%s/profile.jsonl", dir);
    snprintf(out_txt, sizeof out_txt, "%s/summary.txt", dir);
    snprintf(g_records, sizeof g_records, "%s/server_records.jsonl", dir);

    char done[256];
    snprintf(done, sizeof done, "%s/fake_done", dir);
    int fport = start_fake(done);
    CHECK(fport > 0, "the stand-in server");
    if (fport > 0) {
        test_paths(dir, fport, done);
        test_interrupt(dir, fport, done);
    }
    stop_fake();

    int port = free_port();
    CHECK(port > 0, "free port");
    if (port <= 0 || !start_server(port, log, NULL)) {
        CHECK(false, "lumen serve did not come up");
        stop_server();
        return check_exit("test_profile");
    }

    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "'%s' profile --url http://127.0.0.1:%d --dataset mt_bench --dataset-path "
             "'%s/data/mt_bench/question.jsonl' --conversations 3 --concurrency 2 "
             "--warmup-requests 1 --max-tokens 12 --think-time-ms 20 --output '%s' "
             "--tokenizer '%s' --server-records '%s' --artifact-dir '%s/mt_bench' > '%s'",
             LM_LUMEN_BIN, port, LM_SOURCE_DIR, out_jsonl, TINY_MODEL, g_records, dir, out_txt);
    int rc = system(cmd);
    CHECK(rc == 0, "lumen profile exited with %d", rc);

    /* ShareGPT through the preset, and a Spec-Bench subset */
    char sg_dir[256], sb_dir[256];
    snprintf(sg_dir, sizeof sg_dir, "%s/sharegpt", dir);
    snprintf(sb_dir, sizeof sb_dir, "%s/spec_bench", dir);
    snprintf(cmd, sizeof cmd,
             "cd '%s' && '%s' profile --url http://127.0.0.1:%d --preset qwen3-conversations "
             "--artifact-dir '%s' --quiet > '%s/sharegpt.txt'",
             LM_SOURCE_DIR, LM_LUMEN_BIN, port, sg_dir, dir);
    rc = system(cmd);
    CHECK(rc == 0, "lumen profile --preset qwen3-conversations exited with %d", rc);
    /* its --output inside the --artifact-dir the run creates, the path spelled another way */
    snprintf(cmd, sizeof cmd,
             "cd '%s' && '%s' profile --url http://127.0.0.1:%d --dataset spec_bench --category qa "
             "--conversations 3 --max-tokens 8 --artifact-dir '%s' --output '%s/./spec_bench/out.jsonl' "
             "--quiet > '%s/spec_bench.txt'",
             LM_SOURCE_DIR, LM_LUMEN_BIN, port, sb_dir, dir, dir);
    rc = system(cmd);
    CHECK(rc == 0, "lumen profile --dataset spec_bench exited with %d", rc);
    char sb_out[300];
    snprintf(sb_out, sizeof sb_out, "%s/out.jsonl", sb_dir);
    CHECK(file_size(sb_out) > 0, "%s: --output inside the run folder, spelled with ./, not written", sb_out);
    char sw_dir[256];
    snprintf(sw_dir, sizeof sw_dir, "%s/sweep", dir);
    snprintf(cmd, sizeof cmd,
             "cd '%s' && '%s' profile sweep --url http://127.0.0.1:%d --concurrency 1,2 "
             "--conversations 1 --warmup-requests 0 --max-tokens 4 --artifact-dir '%s' --quiet "
             ">/dev/null",
             LM_SOURCE_DIR, LM_LUMEN_BIN, port, sw_dir);
    rc = system(cmd);
    CHECK(rc == 0, "lumen profile sweep exited with %d", rc);
    stop_server();
    test_speculative(dir);
    char path[512];
    snprintf(path, sizeof path, "%s/summary.json", sg_dir);
    json_t *sg = json_load_file(path, 0, NULL);
    json_t *sgt = json_object_get(sg, "per_turn");
    CHECK(json_integer_value(json_object_get(sg, "request_count")) == 12 &&
              json_integer_value(json_object_get(sg, "warmup_requests")) == 2 &&
              json_array_size(sgt) == 2 &&
              json_integer_value(json_object_get(json_array_get(sgt, 1), "request_count")) == 6,
          "preset: 6 conversations x 2 turns, 2 warmup requests");
    json_t *set = json_object_get(sg, "settings");
    CHECK(json_integer_value(json_object_get(set, "max_tokens")) == 16 &&
              json_real_value(json_object_get(set, "think_time_mean_ms")) == 50 &&
              json_integer_value(json_object_get(set, "concurrency")) == 1,
          "preset settings");
    CHECK(json_number_value(json_object_get(
              json_object_get(json_object_get(sg, "metrics"), "think_time_measured"), "min")) >= 50,
          "measured think gaps >= 50 ms");
    CHECK(json_integer_value(json_object_get(json_object_get(sg, "dataset"), "considered")) == 1000,
          "sharegpt ledger covers 1000 conversations");
    json_decref(sg);
    snprintf(path, sizeof path, "%s/selection.jsonl", sg_dir);
    FILE *lf = fopen(path, "r");
    int ledger_lines = 0;
    while (lf && fgets(line, sizeof line, lf))
        ledger_lines++;
    if (lf) fclose(lf);
    CHECK(ledger_lines == 1000, "selection ledger: %d lines", ledger_lines);
    snprintf(path, sizeof path, "%s/summary.json", sb_dir);
    json_t *sb = json_load_file(path, 0, NULL);
    CHECK(json_integer_value(json_object_get(sb, "request_count")) == 3 &&
              json_integer_value(json_object_get(json_object_get(sb, "dataset"), "selected")) == 80,
          "spec_bench qa: 3 single-turn requests of 80 selected");
    CHECK(!strcmp(json_string_value(
                      json_object_get(json_object_get(sb, "speculative"), "acceptance_rate")),
                  "unavailable"),
          "spec_bench run: acceptance unavailable (ordinary generation)");
    json_decref(sb);
    snprintf(path, sizeof path, "%s/report.html", sb_dir);
    CHECK(access(path, R_OK) == 0, "%s", path);
    /* the manifest's command line is the one typed (lumen's CLI renames argv[0]) */
    static const struct {
        const char *dir, *want;
    } k_lines[] = {{"spec_bench", "lumen profile --url http://127.0.0.1:"},
                   {"sweep/concurrency-2", "lumen profile sweep --url http://127.0.0.1:"}};
    for (size_t i = 0; i < sizeof k_lines / sizeof *k_lines; i++) {
        snprintf(path, sizeof path, "%s/%s/manifest.json", dir, k_lines[i].dir);
        json_t *man = json_load_file(path, 0, NULL);
        const char *cl = json_string_value(json_object_get(man, "command_line"));
        CHECK(cl && !strncmp(cl, k_lines[i].want, strlen(k_lines[i].want)),
              "%s: command_line '%s', want '%s...'", path, cl ? cl : "(none)", k_lines[i].want);
        json_decref(man);
    }

    /* the summary */
    FILE *f = fopen(out_txt, "r");
    char summary[16384] = {0};
    if (f) {
        summary[fread(summary, 1, sizeof summary - 1, f)] = 0;
        fclose(f);
    }
    const char *names[] = {"Time to First Token (ms)",
                           "Inter Token Latency (ms)",
                           "Request Latency (ms)",
                           "Output Sequence Length (tokens)",
                           "Input Sequence Length (tokens)",
                           "Request Throughput (requests/s)",
                           "Output Token Throughput (tokens/s)",
                           "p50",
                           "p99",
                           "turn 1",
                           "turn 2"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        CHECK(strstr(summary, names[i]), "summary lacks '%s':\n%s", names[i], summary);
    CHECK(strstr(summary, "6 ok, 0 failed"), "summary counts:\n%s", summary);
    /* verification against lumen serve's own request records (docs/RECORDS.md) */
    CHECK(strstr(summary, "Verification against") && strstr(summary, "PASSED") &&
              strstr(summary, "Input tokens: usage vs rendered prompt       6 equal"),
          "verification against the server's records:\n%s", summary);
    /* the verdict says what it rests on; nothing shouts MISMATCH on a passing run; the dataset
     * line says how many conversations ran, not only how many were selected */
    CHECK(strstr(summary, ": PASSED (7 of 7 answered requests joined") &&
              !strstr(summary, "MISMATCH"),
          "verification line:\n%s", summary);
    CHECK(strstr(summary, "Dataset: mt_bench, 80 of 80 conversations selected, 3 of them ran"),
          "dataset line:\n%s", summary);

    /* the records */
    json_t *recs = json_array();
    f = fopen(out_jsonl, "r");
    CHECK(f != NULL, "%s", out_jsonl);
    while (f && fgets(line, sizeof line, f)) {
        json_error_t e;
        json_t *r = json_loads(line, 0, &e);
        CHECK(r != NULL, "JSONL line: %s", e.text);
        if (r) json_array_append_new(recs, r);
    }
    if (f) fclose(f);
    size_t n_warm = 0, n_prof = 0, i;
    json_t *r, *turn1 = json_object(), *ids = json_object();
    json_array_foreach(recs, i, r) {
        const char *rid = str(r, "request_id");
        CHECK(*rid && !json_object_get(ids, rid), "request id '%s' unique", rid);
        json_object_set_new(ids, rid, json_true());
        double ttft = json_number_value(json_object_get(r, "ttft_ms"));
        double lat = json_number_value(json_object_get(r, "request_latency_ms"));
        json_int_t out = json_integer_value(json_object_get(r, "output_tokens"));
        CHECK(json_is_null(json_object_get(r, "error_type")) &&
                  json_integer_value(json_object_get(r, "http_status")) == 200,
              "%s: error %s", rid, str(r, "error_message"));
        CHECK(json_is_number(json_object_get(r, "ttft_ms")) && ttft > 0 && ttft <= lat,
              "%s: ttft %g latency %g", rid, ttft, lat);
        CHECK(out > 0 && out <= 12, "%s: output_tokens %lld", rid, (long long)out);
        CHECK(json_real_value(json_object_get(r, "start_time")) > 1.6e9, "%s: start_time", rid);
        if (!strcmp(str(r, "phase"), "warmup")) {
            n_warm++;
            CHECK(json_integer_value(json_object_get(r, "turn")) == 1,
                  "warmup is a turn-1 request");
            CHECK(!strcmp(str(r, "dataset_id"), "160"), "warmup from the end of the dataset: %s",
                  str(r, "dataset_id"));
            continue;
        }
        CHECK(!strcmp(str(r, "phase"), "profiling"), "%s: phase %s", rid, str(r, "phase"));
        n_prof++;
        if (json_integer_value(json_object_get(r, "turn")) == 1)
            json_object_set(turn1, str(r, "conversation_id"), r);
    }
    CHECK(n_warm == 1 && n_prof == 6, "%zu warmup and %zu profiling records", n_warm, n_prof);
    CHECK(json_object_size(turn1) == 3, "%zu turn-1 records", json_object_size(turn1));

    size_t n_turn2 = 0;
    json_array_foreach(recs, i, r) {
        if (strcmp(str(r, "phase"), "profiling") ||
            json_integer_value(json_object_get(r, "turn")) != 2)
            continue;
        n_turn2++;
        const char *cid = str(r, "conversation_id"), *rid = str(r, "request_id"), *role;
        json_t *t1 = json_object_get(turn1, cid);
        json_t *q = json_object_get(mt, str(r, "dataset_id"));
        CHECK(t1 && q, "%s: turn 1 of %s / question %s", rid, cid, str(r, "dataset_id"));
        if (!t1 || !q) continue;
        CHECK(json_array_size(json_object_get(r, "messages")) == 3, "%s: 3 messages", rid);
        const char *m0 = msg(r, 0, &role);
        CHECK(!strcmp(role, "user") && !strcmp(m0, json_string_value(json_array_get(q, 0))),
              "%s: messages[0] is MT-Bench turn 1", rid);
        const char *m1 = msg(r, 1, &role);
        CHECK(!strcmp(role, "assistant") && *m1 && !strcmp(m1, str(t1, "response_text")),
              "%s: messages[1] '%s' is the turn-1 answer received '%s'", rid, m1,
              str(t1, "response_text"));
        const char *m2 = msg(r, 2, &role);
        CHECK(!strcmp(role, "user") && !strcmp(m2, json_string_value(json_array_get(q, 1))),
              "%s: messages[2] is MT-Bench turn 2", rid);
        const char *t1m0 = msg(t1, 0, &role);
        CHECK(json_array_size(json_object_get(t1, "messages")) == 1 && !strcmp(t1m0, m0),
              "%s: turn 1 sent only the first question", rid);
        CHECK(json_integer_value(json_object_get(r, "input_tokens")) >
                  json_integer_value(json_object_get(t1, "input_tokens")) +
                      json_integer_value(json_object_get(t1, "output_tokens")),
              "%s: turn 2's prompt holds turn 1's prompt and answer", rid);
    }
    CHECK(n_turn2 == 3, "%zu turn-2 records", n_turn2);
    /* file order: the profiled conversations are MT-Bench 81, 82, 83 */
    const char *want[] = {"81", "82", "83"};
    for (int k = 0; k < 3; k++) {
        bool found = false;
        json_array_foreach(recs, i, r) found |= !strcmp(str(r, "dataset_id"), want[k]);
        CHECK(found, "question %s profiled", want[k]);
    }

    json_decref(recs);
    json_decref(turn1);
    json_decref(ids);
    json_decref(mt);
    if (!g_check_failures) { /* keep the files for a look when something failed */
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
    } else {
        fprintf(stderr, "files kept in %s\n", dir);
    }
    curl_global_cleanup();
    return check_exit("test_profile");
}
