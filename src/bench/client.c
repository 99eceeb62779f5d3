/* client.c: see client.h. */
#include "bench/client.h"

#include <curl/curl.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "base/buf.h"

#define ERROR_BODY_MAX 4096 /* bytes of a non-200 body kept for the message */

double lm_bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double lm_bench_unix_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static pthread_once_t g_curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
}
void lm_bench_client_global_init(void) {
    pthread_once(&g_curl_once, curl_init_once);
}

/* Set before the run's threads start and cleared after they joined, so plain globals suffice. */
static const volatile sig_atomic_t *g_stop;
static double g_stop_grace_s;

void lm_bench_client_watch_stop(const volatile sig_atomic_t *stop, double grace_s) {
    g_stop = stop;
    g_stop_grace_s = grace_s;
}

bool lm_bench_client_stopping(void) {
    return g_stop && *g_stop;
}

lm_status lm_bench_client_init(struct lm_bench_client *c, const char *url, const char *api_key,
                               double timeout_s) {
    memset(c, 0, sizeof *c);
    if (strncmp(url, "http://", 7) && strncmp(url, "https://", 8))
        return lm_errorf(LM_ERR_INVALID, "--url %s: expected http://host:port", url);
    lm_bench_client_global_init();
    size_t n = strlen(url);
    while (n && url[n - 1] == '/')
        n--;
    if (n >= 3 && !memcmp(url + n - 3, "/v1", 3)) n -= 3;
    while (n && url[n - 1] == '/')
        n--;
    c->base_url = strndup(url, n);
    if (api_key && *api_key) c->api_key = strdup(api_key);
    c->timeout_s = timeout_s;
    c->curl = curl_easy_init();
    if (!c->base_url || !c->curl) return lm_errorf(LM_ERR_NOMEM, "cannot start a libcurl handle");
    return LM_OK;
}

void lm_bench_client_free(struct lm_bench_client *c) {
    if (!c) return;
    if (c->curl) curl_easy_cleanup(c->curl);
    free(c->base_url);
    free(c->api_key);
    memset(c, 0, sizeof *c);
}

/* Options shared by every request of a client. */
static void set_common(struct lm_bench_client *c, const char *path, struct lm_buf *url) {
    CURL *h = c->curl;
    curl_easy_reset(h);
    lm_buf_reset(url);
    lm_buf_printf(url, "%s%s", c->base_url, path);
    curl_easy_setopt(h, CURLOPT_URL, url->p);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L); /* threads: no SIGALRM for DNS timeouts */
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    if (c->timeout_s > 0) curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(c->timeout_s * 1000.0));
}

static struct curl_slist *add_header(struct curl_slist *l, const char *name, const char *value) {
    struct lm_buf b = {0};
    lm_buf_printf(&b, "%s: %s", name, value);
    struct curl_slist *r = curl_slist_append(l, b.p);
    lm_buf_free(&b);
    if (!r) abort();
    return r;
}

/* Adds "Authorization: Bearer KEY" when the client has an API key. */
static struct curl_slist *add_auth(const struct lm_bench_client *c, struct curl_slist *l) {
    if (!c->api_key) return l;
    struct lm_buf b = {0};
    lm_buf_printf(&b, "Bearer %s", c->api_key);
    l = add_header(l, "Authorization", b.p);
    lm_buf_free(&b);
    return l;
}

static size_t collect_body(char *p, size_t size, size_t n, void *ud) {
    lm_buf_append(ud, p, size * n);
    return size * n;
}

/* GET base_url + path into body; url gets the full URL (for messages), status the HTTP status. */
static lm_status get(struct lm_bench_client *c, const char *path, struct lm_buf *url,
                     struct lm_buf *body, long *status) {
    set_common(c, path, url);
    struct curl_slist *hdr = add_auth(c, NULL);
    curl_easy_setopt(c->curl, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(c->curl, CURLOPT_WRITEFUNCTION, collect_body);
    curl_easy_setopt(c->curl, CURLOPT_WRITEDATA, body);
    CURLcode rc = curl_easy_perform(c->curl);
    *status = 0;
    curl_easy_getinfo(c->curl, CURLINFO_RESPONSE_CODE, status);
    curl_slist_free_all(hdr);
    return rc == CURLE_OK ? LM_OK
                          : lm_errorf(LM_ERR_IO, "GET %s: %s", url->p, curl_easy_strerror(rc));
}

lm_status lm_bench_client_get(struct lm_bench_client *c, const char *path, struct lm_buf *body,
                              long *status) {
    struct lm_buf url = {0};
    lm_status st = get(c, path, &url, body, status);
    lm_buf_free(&url);
    return st;
}

lm_status lm_bench_client_first_model(struct lm_bench_client *c, char **id) {
    *id = NULL;
    struct lm_buf url = {0}, body = {0};
    long status = 0;
    lm_status st = get(c, "/v1/models", &url, &body, &status);
    if (!st && status != 200) {
        st = lm_errorf(LM_ERR_IO, "GET %s: HTTP %ld: %.200s", url.p, status, body.p ? body.p : "");
    } else if (!st) {
        json_error_t e;
        json_t *o = json_loadb(body.p ? body.p : "", body.len, 0, &e);
        json_t *data = json_object_get(o, "data");
        if (!json_is_array(data)) {
            st = lm_errorf(LM_ERR_FORMAT, "GET %s: expected {\"data\": [{\"id\": ...}]}", url.p);
        } else {
            const char *s = json_string_value(json_object_get(json_array_get(data, 0), "id"));
            if (!s)
                st = lm_errorf(LM_ERR_MISSING, "GET %s: the server lists no model (data[0].id)",
                               url.p);
            else if (!(*id = strdup(s)))
                abort();
        }
        json_decref(o);
    }
    lm_buf_free(&url);
    lm_buf_free(&body);
    return st;
}

enum body_kind { BODY_UNKNOWN, BODY_SSE, BODY_JSON, BODY_ERROR };

struct chat_ctx {
    CURL *curl;
    char *echoed_id; /* X-Request-Id of the response; owned */
    struct lm_bench_record *rec;
    struct lm_bench_stream stream;
    enum body_kind kind;
    struct lm_buf body; /* a non-SSE body (JSON answer or error text) */
    double t_stop_seen; /* when this transfer first saw the stop flag; 0: not yet */
    bool cancelled;     /* aborted because of it */
};

/* libcurl's progress callback: also called about once a second while nothing arrives, which is
 * what lets a stop reach a request that waits on a slow server. Non-zero aborts the transfer. */
static int on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow) {
    (void)dltotal, (void)dlnow, (void)ultotal, (void)ulnow;
    struct chat_ctx *x = ud;
    if (!lm_bench_client_stopping()) return 0;
    double t = lm_bench_now();
    if (x->t_stop_seen == 0) x->t_stop_seen = t;
    if (t - x->t_stop_seen < g_stop_grace_s) return 0;
    x->cancelled = true;
    return 1;
}

static size_t on_data(char *p, size_t size, size_t n, void *ud) {
    struct chat_ctx *x = ud;
    size_t len = size * n;
    double t_ms = (lm_bench_now() - x->rec->t_send) * 1e3;
    if (x->kind == BODY_UNKNOWN) {
        long status = 0;
        char *ctype = NULL;
        curl_easy_getinfo(x->curl, CURLINFO_RESPONSE_CODE, &status);
        curl_easy_getinfo(x->curl, CURLINFO_CONTENT_TYPE, &ctype);
        x->rec->http_status = status;
        if (status != 200)
            x->kind = BODY_ERROR;
        else if (ctype && !strncasecmp(ctype, "application/json", 16))
            x->kind = BODY_JSON;
        else
            x->kind = BODY_SSE;
    }
    if (x->kind == BODY_SSE) {
        lm_bench_stream_feed(&x->stream, p, len, t_ms);
    } else if (x->kind == BODY_JSON || x->body.len < ERROR_BODY_MAX) {
        lm_buf_append(&x->body, p, len);
    }
    return len;
}

/* Response headers: keeps X-Request-Id. */
static size_t on_header(char *p, size_t size, size_t n, void *ud) {
    struct chat_ctx *x = ud;
    size_t len = size * n;
    static const char name[] = "x-request-id:";
    if (len > sizeof name - 1 && !strncasecmp(p, name, sizeof name - 1)) {
        const char *v = p + sizeof name - 1, *e = p + len;
        while (v < e && (*v == ' ' || *v == '\t'))
            v++;
        while (e > v && (e[-1] == '\r' || e[-1] == '\n' || e[-1] == ' '))
            e--;
        free(x->echoed_id);
        x->echoed_id = strndup(v, (size_t)(e - v));
    }
    return len;
}

static enum lm_bench_error curl_error_kind(CURLcode rc) {
    return rc == CURLE_OPERATION_TIMEDOUT ? LM_BENCH_ERR_TIMEOUT : LM_BENCH_ERR_CONNECTION;
}

/* The message of an error body: error.message of an OpenAI error object, else the text. */
static void fail_http(struct lm_bench_record *rec, const struct lm_buf *body) {
    long s = rec->http_status;
    enum lm_bench_error e = s >= 400 && s < 500   ? LM_BENCH_ERR_HTTP_4XX
                            : s >= 500 && s < 600 ? LM_BENCH_ERR_HTTP_5XX
                                                  : LM_BENCH_ERR_HTTP_OTHER;
    json_t *o = json_loadb(body->p ? body->p : "", body->len, 0, NULL);
    json_t *err = json_object_get(o, "error");
    const char *msg = json_string_value(json_object_get(err, "message"));
    if (!msg) msg = json_string_value(err);
    if (msg)
        lm_bench_record_fail(rec, e, "HTTP %ld: %s", s, msg);
    else
        lm_bench_record_fail(rec, e, "HTTP %ld: %.300s", s, body->p ? body->p : "");
    json_decref(o);
}

void lm_bench_client_chat(struct lm_bench_client *c, const char *body,
                          struct lm_bench_record *rec) {
    struct lm_buf url = {0};
    set_common(c, "/v1/chat/completions", &url);
    struct curl_slist *hdr = NULL;
    hdr = add_header(hdr, "Content-Type", "application/json");
    hdr = add_header(hdr, "Accept", "text/event-stream");
    hdr = add_header(hdr, "X-Request-Id", rec->request_id);
    hdr = add_header(hdr, "X-Conversation-Id", rec->conversation_id);
    hdr = add_header(hdr, "X-Lumen-Phase",
                     rec->phase == LM_BENCH_PHASE_WARMUP ? "warmup" : "profiling");
    char turn[24];
    snprintf(turn, sizeof turn, "%d", rec->turn - 1);
    hdr = add_header(hdr, "X-Lumen-Turn", turn);
    hdr = add_auth(c, hdr);
    struct chat_ctx x = {.curl = c->curl, .rec = rec};
    lm_bench_stream_init(&x.stream, rec);
    curl_easy_setopt(c->curl, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(c->curl, CURLOPT_POST, 1L);
    curl_easy_setopt(c->curl, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c->curl, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    curl_easy_setopt(c->curl, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c->curl, CURLOPT_WRITEDATA, &x);
    curl_easy_setopt(c->curl, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c->curl, CURLOPT_HEADERDATA, &x);
    curl_easy_setopt(c->curl, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(c->curl, CURLOPT_XFERINFODATA, &x);
    curl_easy_setopt(c->curl, CURLOPT_NOPROGRESS, 0L);

    rec->sent = true;
    rec->start_unix = lm_bench_unix_now();
    rec->t_send = lm_bench_now();
    CURLcode rc = curl_easy_perform(c->curl);
    rec->t_end = lm_bench_now();
    double t_ms = (rec->t_end - rec->t_send) * 1e3;
    if (!rec->http_status) curl_easy_getinfo(c->curl, CURLINFO_RESPONSE_CODE, &rec->http_status);

    if (rc == CURLE_ABORTED_BY_CALLBACK && x.cancelled) {
        rec->cancelled = true;
        lm_bench_record_fail(rec, LM_BENCH_ERR_CONNECTION,
                             "%s after %.1f s more for the response (%s)", LM_BENCH_CLIENT_CANCELLED,
                             g_stop_grace_s, url.p);
    } else if (rc != CURLE_OK) {
        lm_bench_record_fail(rec, curl_error_kind(rc), "%s: %s", url.p, curl_easy_strerror(rc));
    } else if (rec->http_status != 200) {
        fail_http(rec, &x.body);
    } else if (x.kind == BODY_JSON) {
        lm_bench_record_full_response(rec, x.body.p ? x.body.p : "", x.body.len, t_ms);
    }
    lm_bench_stream_finish(&x.stream, t_ms);
    if (!isfinite(rec->latency_ms)) rec->latency_ms = t_ms;
    free(rec->echoed_request_id);
    rec->echoed_request_id = x.echoed_id;
    lm_bench_stream_free(&x.stream);
    lm_buf_free(&x.body);
    lm_buf_free(&url);
    curl_slist_free_all(hdr);
}
