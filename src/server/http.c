/* http.c: the HTTP transport of `lumen serve`, on libmicrohttpd (MHD).
 *
 * Threading: MHD runs one thread per connection (MHD_USE_THREAD_PER_CONNECTION) plus its
 * listening thread. We chose this over MHD's internal thread pool with suspend/resume because a
 * suspended connection is not polled by MHD, so a client that disconnects while its request waits
 * in the queue or generates would go unnoticed until the first write; with a thread per
 * connection, the thread that waits for its jobs can watch its own socket (poll + MSG_PEEK every
 * 25 ms) and cancel them when the peer hangs up, which frees a queued request before it ever
 * runs and stops a running one within one decode step. The connection count is bounded
 * (--max-connections, and idle connections close after --timeout-keep-alive), so a thread each
 * is cheap. The connection threads and the engine meet only at the worker's queue (worker.h).
 *
 * Connections: the gate (gate.h) accepts them, answers the transport errors libmicrohttpd would
 * answer in HTML with our error JSON, and hands the rest to MHD (MHD_add_connection). MHD's idle
 * timer only sees bytes moving, so it is switched off while a generation request waits on the
 * engine (queue, prefill, the gaps of a stream) and back on in on_completed. GET routes answer
 * in the access handler's second call: an answer queued in the first call makes MHD close the
 * connection. At shutdown, the server waits (up to 5 s) for the answers in flight to be written,
 * a cut stream's last chunks and terminator included, before MHD closes the connections.
 *
 * A generation request (POST /v1/chat/completions, /v1/completions) is a `struct call`: the
 * access handler collects the body (413 past max_body), checks that the model declares the
 * endpoint's task (400 otherwise), parses and validates it (openai.c; 400 with OpenAI's error
 * JSON), renders and tokenizes the prompt on the connection thread (the tokenizer is
 * thread-safe), checks the context, and submits one job per choice (`n`; 429 when the queue is
 * full). A non-streaming request waits for its jobs and answers one JSON object; a streaming
 * request answers a chunked text/event-stream whose content reader turns the text the engine
 * releases into chunks. Chat output goes through the family's reasoning parser (family.h), when
 * it has one, into reasoning_content and content; streamed and non-streamed answers run the same
 * parser, so they agree. The call is reference-counted (connection + stream); when the last side
 * lets go, it writes its request record (records.h) and its metrics (metrics.h), and frees its
 * jobs. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "family/family.h"
#include "server/gate.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "server/records.h"
#include "server/server.h"
#include "server/worker.h"

#define WAIT_MS 25      /* how often a waiting connection checks that its client is still there */
#define WAIT_MULTI_MS 2 /* the wait on one job when a request has several choices */

struct lm_server {
    struct lm_model *model; /* borrowed */
    struct lm_worker *worker;
    struct MHD_Daemon *daemon;
    struct lm_gate *gate; /* accepts connections and hands them to `daemon` */
    int port;
    int ctx;
    size_t max_body;
    bool log;
    long long created; /* start time, Unix seconds */
    const char *model_name;
    unsigned tasks;                           /* enum lm_task bits the family declares */
    const struct lm_reasoning_ops *reasoning; /* NULL: chat output is all content */
    struct lm_records *records;               /* NULL without --records */
    bool spec;                                /* speculative decoding is on (records) */
    struct lm_metrics *metrics;
    uint64_t id_seed;
    atomic_ullong id_counter;
    atomic_int active;           /* HTTP requests between their headers and on_completed */
    unsigned max_connections;    /* MHD's connection limit (after the open-files limit) */
    unsigned timeout_s;          /* idle timeout of a connection, seconds; 0 = none */
    atomic_llong limit_logged_s; /* when the connection-limit line was last logged (monotonic s) */
};

enum route {
    ROUTE_NONE,
    ROUTE_CHAT,
    ROUTE_COMPLETIONS,
    ROUTE_TOKENIZE,
    ROUTE_DETOKENIZE,
    ROUTE_MODELS,
    ROUTE_MODEL, /* GET /v1/models/{id} */
    ROUTE_HEALTH,
    ROUTE_METRICS,
};

static const struct {
    const char *path;
    enum route route;
    bool post; /* POST with a JSON body; else GET/HEAD */
} k_routes[] = {
    {"/v1/chat/completions", ROUTE_CHAT, true}, {"/v1/completions", ROUTE_COMPLETIONS, true},
    {"/tokenize", ROUTE_TOKENIZE, true},         {"/detokenize", ROUTE_DETOKENIZE, true},
    {"/v1/models", ROUTE_MODELS, false},         {"/health", ROUTE_HEALTH, false},
    {"/metrics", ROUTE_METRICS, false},
};
#define N_ROUTES (sizeof k_routes / sizeof k_routes[0])

#define MODEL_PREFIX "/v1/models/"

static const char *route_path(enum route r) {
    if (r == ROUTE_MODEL) return MODEL_PREFIX "{id}";
    for (size_t i = 0; i < N_ROUTES; i++)
        if (k_routes[i].route == r) return k_routes[i].path;
    return "other";
}

/* The route of a request path (no query), ROUTE_NONE for an unknown one. */
static enum route route_of(const char *url) {
    for (size_t i = 0; i < N_ROUTES; i++)
        if (!strcmp(url, k_routes[i].path)) return k_routes[i].route;
    if (!strncmp(url, MODEL_PREFIX, strlen(MODEL_PREFIX)) && url[strlen(MODEL_PREFIX)]) return ROUTE_MODEL;
    return ROUTE_NONE;
}

static bool route_post(enum route r) {
    for (size_t i = 0; i < N_ROUTES; i++)
        if (k_routes[i].route == r) return k_routes[i].post;
    return false;
}

/* One choice of a generation request. */
struct choice {
    struct lm_job *job;           /* our reference; NULL until created */
    struct lm_buf incoming;       /* streamed text taken from the job, not yet sent */
    struct lm_buf content;        /* what was sent (or is to be sent) as content / text */
    struct lm_buf reasoning;      /* ... as reasoning_content */
    struct lm_reasoning parser;   /* when the call splits reasoning */
    bool role_sent, finished;
    double t_done_ms;             /* when the connection saw the job finish */
    struct lm_logprob_list lp_in; /* streamed logprobs taken from the job, not yet sent */
    size_t lp_sent;               /* logprobs entries sent (a prefix of result.logprobs) */
    size_t lp_offset;             /* completions: text bytes of the tokens sent (text_offset) */
};

/* A generation request, shared by the connection and its stream. */
struct call {
    atomic_int refs;
    struct lm_server *srv;
    enum lm_api_endpoint ep;
    char id[128];      /* "chatcmpl-<rid>" / "cmpl-<rid>" */
    char *hdr_rid;     /* the headers as received (for the record), owned; NULL when absent */
    char *hdr_conv, *hdr_phase, *hdr_turn;
    double t_arrival_ms;
    int status;        /* the HTTP status answered (499: the client went away first) */
    bool split;        /* reasoning parser on */
    bool stream, include_usage;
    struct lm_buf rendered; /* the rendered chat prompt (for the reasoning parser) */
    struct lm_openai_meta meta;
    int n;             /* choices with a job */
    struct choice ch[LM_OPENAI_MAX_N];
};

/* One HTTP request, from its headers to on_completed. Owned by MHD's per-request pointer. */
struct conn {
    struct lm_server *srv;
    enum route route;
    int fd; /* the client's socket, watched while waiting */
    struct timespec t0;
    char method[16];
    char path[128];
    char rid[80];  /* X-Request-Id, echoed or generated */
    char conv[80]; /* X-Conversation-Id, for the log; "" when absent */
    char *hdr_rid, *hdr_conv, *hdr_phase, *hdr_turn; /* as received; owned until a call takes them */
    struct lm_buf body;
    bool too_large;
    bool timeout_off; /* the connection's idle timeout is off while it is answered */
    int status;      /* the HTTP status answered (499: the client went away first) */
    char error[512]; /* the error message answered, for the log */
    struct call *call; /* our reference, for generation routes */
};

/* A streaming response's state, owned by the MHD response (freed in stream_free). */
struct stream {
    struct call *call; /* its own reference */
    struct lm_buf out; /* SSE bytes not yet handed to MHD, from `off` */
    size_t off;
    bool finished;
    int fd;
};

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static double seconds_since(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) * 1e-9;
}

/* True when the client closed its side or the socket failed. A client may pipeline a next
 * request (readable bytes): that is not a hang-up. */
static bool peer_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLERR | POLLHUP | POLLRDHUP | POLLNVAL)) return true;
    if (p.revents & POLLIN) {
        char c;
        ssize_t r = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (r == 0) return true;
        if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
    }
    return false;
}

static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* A client id is echoed when it is short and made of safe characters; otherwise we make one. */
static bool id_ok(const char *s) {
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > 64) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.' || c == ':'))
            return false;
    }
    return true;
}

static char *dup_header(struct MHD_Connection *c, const char *name) {
    const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, name);
    if (!v) return NULL;
    char *s = strdup(v);
    if (!s) abort(); /* as lm_buf does */
    return s;
}

/* ---- calls -------------------------------------------------------------------------------- */

static struct call *call_create(struct conn *k, enum lm_api_endpoint ep) {
    struct call *c = calloc(1, sizeof *c);
    if (!c) abort();
    atomic_init(&c->refs, 1);
    c->srv = k->srv;
    c->ep = ep;
    snprintf(c->id, sizeof c->id, "%s-%s", ep == LM_API_CHAT ? "chatcmpl" : "cmpl", k->rid);
    c->hdr_rid = k->hdr_rid, k->hdr_rid = NULL;
    c->hdr_conv = k->hdr_conv, k->hdr_conv = NULL;
    c->hdr_phase = k->hdr_phase, k->hdr_phase = NULL;
    c->hdr_turn = k->hdr_turn, k->hdr_turn = NULL;
    c->t_arrival_ms = now_ms();
    c->meta = (struct lm_openai_meta){c->id, (long long)time(NULL), k->srv->model_name, ep,
                                      lm_model_tokenizer(k->srv->model)};
    return c;
}

static void call_retain(struct call *c) { atomic_fetch_add(&c->refs, 1); }

static void cancel_all(struct call *c) {
    for (int i = 0; i < c->n; i++)
        if (c->ch[i].job) lm_job_cancel(c->ch[i].job);
}

/* Engine times of a job, in CLOCK_MONOTONIC ms (-1: unknown), from the scheduler's result
 * (worker.h: result.times, result.cached_tokens). */
struct job_times {
    double scheduled_ms, first_token_ms, finish_ms;
    int cached_tokens;
};

static struct job_times job_times(const struct call *c, const struct choice *ch) {
    struct job_times t = {-1, -1, -1, 0};
    const struct lm_job *j = ch->job;
    (void)c;
    if (!j || lm_job_wait((struct lm_job *)j, 0, NULL) != LM_JOB_DONE) return t;
    const struct lm_gen_times *g = &j->result.times;
    if (g->scheduled_ms > 0) t.scheduled_ms = g->scheduled_ms;
    if (g->first_token_ms > 0) t.first_token_ms = g->first_token_ms;
    if (g->finish_ms > 0) t.finish_ms = g->finish_ms;
    else if (ch->t_done_ms > 0) t.finish_ms = ch->t_done_ms;
    t.cached_tokens = j->result.cached_tokens;
    return t;
}

static bool job_ok(const struct choice *ch) {
    return ch->job && ch->finished && ch->job->state == LM_JOB_DONE && ch->job->status == LM_OK;
}

/* The record and the metrics of a call that retires. */
static void call_finish(struct call *c) {
    struct lm_server *srv = c->srv;
    struct lm_record rec = {.id = c->id,
                            .x_request_id = c->hdr_rid,
                            .conversation_id = c->hdr_conv,
                            .phase = c->hdr_phase,
                            .turn = c->hdr_turn,
                            .model = srv->model_name,
                            .endpoint = lm_api_endpoint_path(c->ep),
                            .http_status = c->status,
                            .t_arrival_ms = c->t_arrival_ms,
                            .t_scheduled_ms = -1,
                            .t_first_token_ms = -1,
                            .t_finish_ms = now_ms(),
                            .prompt_tokens = -1,
                            .cached_tokens = -1,
                            .completion_tokens = -1,
                            .spec_draft_tokens = -1,
                            .spec_accepted_tokens = -1};
    struct lm_buf text = {0};
    struct lm_metrics_request mr = {.queue_s = -1, .ttft_s = -1, .decode_s = -1, .latency_s = -1};
    const struct choice *c0 = &c->ch[0];
    const struct lm_job *j0 = c0->job;
    if (j0 && j0->req.root) {
        if (c->ep == LM_API_CHAT) {
            rec.messages = j0->req.messages;
            rec.n_messages = j0->req.n_messages;
        }
    }
    if (j0 && j0->prompt.n) {
        rec.prompt_ids = j0->prompt.v;
        rec.n_prompt_ids = j0->prompt.n;
        rec.prompt_tokens = (int)j0->prompt.n;
    }
    bool all_ok = c->n > 0;
    for (int i = 0; i < c->n; i++) all_ok &= job_ok(&c->ch[i]);
    if (c->n > 0) {
        /* times: the earliest scheduling and first token, the latest finish over the choices */
        double sched = -1, first = -1, fin = -1;
        int completion = 0, cached = 0, drafted = 0, accepted = 0;
        for (int i = 0; i < c->n; i++) {
            struct job_times t = job_times(c, &c->ch[i]);
            if (t.scheduled_ms >= 0 && (sched < 0 || t.scheduled_ms < sched)) sched = t.scheduled_ms;
            if (t.first_token_ms >= 0 && (first < 0 || t.first_token_ms < first)) first = t.first_token_ms;
            if (t.finish_ms > fin) fin = t.finish_ms;
            if (i == 0) cached = t.cached_tokens;
            if (c->ch[i].job && c->ch[i].job->state == LM_JOB_DONE) {
                completion += c->ch[i].job->result.completion_tokens;
                drafted += c->ch[i].job->result.draft_tokens;
                accepted += c->ch[i].job->result.accepted_tokens;
            }
        }
        rec.t_scheduled_ms = sched;
        rec.t_first_token_ms = first;
        if (fin >= 0) rec.t_finish_ms = fin > rec.t_finish_ms ? rec.t_finish_ms : fin;
        if (rec.t_first_token_ms > rec.t_finish_ms) rec.t_first_token_ms = rec.t_finish_ms;
        if (sched >= 0) {
            rec.completion_tokens = completion;
            rec.cached_tokens = cached;
            if (srv->spec) rec.spec_draft_tokens = drafted, rec.spec_accepted_tokens = accepted;
        }
    }
    if (all_ok) {
        rec.finish_reason = lm_openai_finish_reason(j0->result.finish);
        static const int32_t k_no_ids[1];
        rec.completion_ids = j0->result.ids.v ? j0->result.ids.v : k_no_ids;
        rec.n_completion_ids = j0->result.ids.n;
        lm_buf_append(&text, c0->reasoning.p, c0->reasoning.len);
        lm_buf_append(&text, c0->content.p, c0->content.len);
        rec.completion_text = text.p ? text.p : "";
        rec.completion_text_len = text.len;
    } else if (j0 && j0->state == LM_JOB_DONE && j0->status == LM_ERR_CANCELLED) {
        rec.finish_reason = lm_finish_name(LM_FINISH_CANCELLED); /* docs/RECORDS.md */
    }
    if (srv->records && (lm_records_write(srv->records, &rec)) && srv->log)
        fprintf(stderr, "lumen serve: %s\n", lm_error_message());
    lm_buf_free(&text);

    if (rec.t_scheduled_ms >= 0) {
        mr.prompt_tokens = rec.prompt_tokens;
        mr.completion_tokens = rec.completion_tokens;
        mr.cached_tokens = rec.cached_tokens;
        mr.queue_s = (rec.t_scheduled_ms - rec.t_arrival_ms) * 1e-3;
        if (rec.t_first_token_ms >= 0) {
            mr.ttft_s = (rec.t_first_token_ms - rec.t_arrival_ms) * 1e-3;
            mr.decode_s = (rec.t_finish_ms - rec.t_first_token_ms) * 1e-3;
        }
        mr.latency_s = (rec.t_finish_ms - rec.t_arrival_ms) * 1e-3;
        lm_metrics_observe(srv->metrics, &mr);
    }
}

static void call_release(struct call *c) {
    if (!c || atomic_fetch_sub(&c->refs, 1) != 1) return;
    if (c->status) call_finish(c);
    for (int i = 0; i < LM_OPENAI_MAX_N; i++) {
        struct choice *ch = &c->ch[i];
        lm_job_release(ch->job);
        lm_buf_free(&ch->incoming);
        lm_buf_free(&ch->content);
        lm_buf_free(&ch->reasoning);
        lm_reasoning_free(&ch->parser);
        lm_logprob_list_free(&ch->lp_in);
    }
    lm_buf_free(&c->rendered);
    free(c->hdr_rid);
    free(c->hdr_conv);
    free(c->hdr_phase);
    free(c->hdr_turn);
    free(c);
}

/* ---- logging ------------------------------------------------------------------------------ */

static void log_line(struct conn *k) {
    if (!k->srv->log) return;
    char tokens[128] = "";
    struct call *c = k->call;
    if (c && c->n > 0) {
        struct lm_job *j0 = c->ch[0].job;
        int completion = 0;
        bool ok = true, cancelled = false, stopping = false;
        /* A cancelled job stops within one engine step: wait a little for its count. */
        double deadline = now_ms() + 1000;
        for (int i = 0; i < c->n; i++) {
            struct lm_job *j = c->ch[i].job;
            enum lm_job_state st;
            while ((st = lm_job_wait(j, 0, NULL)) != LM_JOB_DONE && atomic_load(&j->cancel) &&
                   now_ms() < deadline)
                lm_job_wait(j, 20, NULL);
            if (st != LM_JOB_DONE) {
                stopping = true;
                ok = false;
                continue;
            }
            completion += j->result.completion_tokens; /* as far as it got when not OK */
            ok &= j->status == LM_OK;
            cancelled |= j->status == LM_ERR_CANCELLED;
        }
        const char *finish = ok          ? lm_openai_finish_reason(j0->result.finish)
                             : cancelled || stopping ? lm_finish_name(LM_FINISH_CANCELLED)
                                                     : "error";
        int l = snprintf(tokens, sizeof tokens, " prompt=%d completion=%s%d finish=%s", (int)j0->prompt.n,
                         stopping ? ">=" : "", completion, finish);
        if (c->n > 1 && l > 0 && (size_t)l < sizeof tokens)
            snprintf(tokens + l, sizeof tokens - (size_t)l, " n=%d", c->n);
    }
    fprintf(stderr, "lumen serve: %s %s id=%s%s%s status=%d%s %.3fs%s%s%s\n", k->method, k->path, k->rid,
            k->conv[0] ? " conv=" : "", k->conv, k->status, tokens, seconds_since(&k->t0), k->error[0] ? " error=\"" : "",
            k->error, k->error[0] ? "\"" : "");
}

/* ---- responses ---------------------------------------------------------------------------- */

/* Queues `body` (malloc'd; MHD frees it) with `status` and `type`. */
static enum MHD_Result respond(struct MHD_Connection *c, struct conn *k, int status, const char *type,
                               char *body) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    MHD_add_response_header(r, "X-Request-Id", k->rid);
    if (status == 405) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, route_post(k->route) ? "POST" : "GET, HEAD");
    /* 429: the queue is full now; a place frees when a running request finishes (RFC 9110 10.2.3) */
    if (status == 429) MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    k->status = status;
    if (k->call) k->call->status = status;
    return ret;
}

static enum MHD_Result respond_json(struct MHD_Connection *c, struct conn *k, int status, char *json) {
    return respond(c, k, status, "application/json", json);
}

static enum MHD_Result respond_error(struct MHD_Connection *c, struct conn *k,
                                     const struct lm_api_error *e) {
    snprintf(k->error, sizeof k->error, "%s", e->message);
    return respond_json(c, k, e->status, lm_openai_error_json(e));
}

static enum MHD_Result respond_errorf(struct MHD_Connection *c, struct conn *k, int status,
                                      const char *type, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static enum MHD_Result respond_errorf(struct MHD_Connection *c, struct conn *k, int status,
                                      const char *type, const char *code, const char *fmt, ...) {
    struct lm_api_error e;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    lm_api_errorf(&e, status, type, code, NULL, "%s", msg);
    return respond_error(c, k, &e);
}

/* The error a finished job ended with, as an API error. */
static void job_error(const struct lm_job *j, struct lm_api_error *e) {
    if (j->status == LM_ERR_CANCELLED)
        lm_api_errorf(e, 503, "server_error", NULL, NULL, "%s", j->error ? j->error : "cancelled");
    else if (j->status == LM_ERR_RANGE || j->status == LM_ERR_INVALID)
        lm_api_errorf(e, 400, "invalid_request_error", NULL, NULL, "%s", j->error ? j->error : "invalid request");
    else
        lm_api_errorf(e, 500, "server_error", NULL, NULL, "generation failed: %s", j->error ? j->error : "");
}

/* 413 for a body above the server's limit (k->too_large). */
static enum MHD_Result respond_too_large(struct MHD_Connection *c, struct conn *k) {
    return respond_errorf(c, k, 413, "invalid_request_error", NULL,
                          "request body is larger than the server's limit of %zu bytes (%.0f MiB)",
                          k->srv->max_body, (double)k->srv->max_body / 1048576.0);
}

/* ---- choices: text to content / reasoning ------------------------------------------------- */

/* Splits `len` bytes of new text of choice `ch` (or, with text NULL, the end of its text) into
 * reasoning and content, appending them to `r` and `cc` and to what the choice has sent. */
static void split_text(struct call *c, struct choice *ch, const char *text, size_t len, struct lm_buf *r,
                       struct lm_buf *cc) {
    if (c->split) {
        if (text) lm_reasoning_push(&ch->parser, text, len, r, cc);
        else lm_reasoning_end(&ch->parser, r, cc);
    } else if (text) {
        lm_buf_append(cc, text, len);
    }
    lm_buf_append(&ch->reasoning, r->p, r->len);
    lm_buf_append(&ch->content, cc->p, cc->len);
}

static const struct lm_token_logprob *choice_logprobs(const struct choice *ch, size_t *n) {
    const struct lm_job *j = ch->job;
    *n = 0;
    if (!j->gen.sampling.logprobs) return NULL;
    *n = j->result.logprobs.n;
    static const struct lm_token_logprob k_none; /* a non-NULL pointer for an empty list */
    return j->result.logprobs.v ? j->result.logprobs.v : &k_none;
}

/* ---- streaming ---------------------------------------------------------------------------- */

static void stream_free(void *cls) {
    struct stream *s = cls;
    call_release(s->call);
    lm_buf_free(&s->out);
    free(s);
}

/* The logprobs entries [from, from + n) of choice `ch` go into delta `d` (NULL when n is 0, or
 * when the request asked for none); advances what the choice has sent. */
static void attach_logprobs(struct call *c, struct choice *ch, const struct lm_token_logprob *v, size_t n,
                            struct lm_openai_delta *d) {
    if (!ch->job->gen.sampling.logprobs || n == 0) return;
    d->logprobs = v;
    d->n_logprobs = n;
    d->text_offset = ch->lp_offset;
    struct lm_buf t = {0};
    for (size_t i = 0; i < n; i++) { /* text_offset of the next chunk: the bytes of these tokens */
        lm_buf_reset(&t);
        if (c->meta.tok) lm_tokenizer_decode(c->meta.tok, &v[i].id, 1, false, &t);
        ch->lp_offset += t.len;
    }
    lm_buf_free(&t);
    ch->lp_sent += n;
}

/* Chunks for new text (text != NULL) or the end of choice i's text (text == NULL). The logprobs
 * taken with the text (lp_in) go with the first chunk that carries text; text the reasoning
 * parser holds back keeps them for a later chunk. */
static void emit_text(struct stream *s, int i, const char *text, size_t len) {
    struct call *c = s->call;
    struct choice *ch = &c->ch[i];
    bool usage_null = c->include_usage;
    if (c->ep == LM_API_CHAT && !ch->role_sent) {
        lm_openai_chunk(&s->out, &c->meta, &(struct lm_openai_delta){.index = i, .role = "assistant", .content = ""},
                        usage_null);
        ch->role_sent = true;
    }
    struct lm_buf r = {0}, cc = {0};
    split_text(c, ch, text, len, &r, &cc);
    if (r.len) {
        struct lm_openai_delta d = {.index = i, .reasoning = r.p, .reasoning_len = r.len};
        attach_logprobs(c, ch, ch->lp_in.v, ch->lp_in.n, &d);
        ch->lp_in.n = 0;
        lm_openai_chunk(&s->out, &c->meta, &d, usage_null);
    }
    if (cc.len) {
        struct lm_openai_delta d = {.index = i, .content = cc.p, .len = cc.len};
        attach_logprobs(c, ch, ch->lp_in.v, ch->lp_in.n, &d);
        ch->lp_in.n = 0;
        lm_openai_chunk(&s->out, &c->meta, &d, usage_null);
    }
    lm_buf_free(&r);
    lm_buf_free(&cc);
}

/* The end of choice i: held-back text, then the finish chunk with the logprobs not sent yet (the
 * tail of the job's result). `finish_reason` overrides the job's (NULL: the job's). */
static void emit_finish(struct stream *s, int i, const char *finish_reason) {
    struct call *c = s->call;
    struct choice *ch = &c->ch[i];
    emit_text(s, i, NULL, 0);
    struct lm_openai_delta d = {
        .index = i, .finish_reason = finish_reason ? finish_reason : lm_openai_finish_reason(ch->job->result.finish)};
    const struct lm_logprob_list *all = &ch->job->result.logprobs;
    if (all->n > ch->lp_sent) attach_logprobs(c, ch, all->v + ch->lp_sent, all->n - ch->lp_sent, &d);
    ch->lp_in.n = 0;
    lm_openai_chunk(&s->out, &c->meta, &d, c->include_usage);
    ch->finished = true;
}

/* Fills s->out with the next events, waiting for the engine as needed. Returns false when the
 * client has gone (the jobs are then cancelled). */
static bool stream_produce(struct stream *s) {
    struct call *c = s->call;
    lm_buf_reset(&s->out);
    s->off = 0;
    for (;;) {
        bool progress = false, all_done = true;
        for (int i = 0; i < c->n; i++) {
            struct choice *ch = &c->ch[i];
            if (ch->finished) continue;
            enum lm_job_state st = lm_job_take(ch->job, 0, &ch->incoming, &ch->lp_in);
            if (ch->incoming.len) {
                emit_text(s, i, ch->incoming.p, ch->incoming.len);
                lm_buf_reset(&ch->incoming);
                progress = true;
            }
            if (st != LM_JOB_DONE) {
                all_done = false;
                continue;
            }
            ch->t_done_ms = now_ms();
            if (ch->job->status == LM_ERR_CANCELLED) {
                /* Shutdown (or the end of its drain) cancelled the job after the headers went
                 * out: end the choice properly, with vLLM's finish_reason for an aborted request,
                 * so that the stream still ends with [DONE] and the chunked terminator. */
                emit_finish(s, i, "abort");
                progress = true;
                continue;
            }
            if (ch->job->status != LM_OK) { /* an engine error after the headers went out */
                ch->finished = true;
                cancel_all(c);
                struct lm_api_error e;
                job_error(ch->job, &e);
                char *json = lm_openai_error_json(&e);
                lm_buf_printf(&s->out, "data: %s\n\n", json);
                free(json);
                lm_openai_done(&s->out);
                s->finished = true;
                return true;
            }
            emit_finish(s, i, NULL);
            progress = true;
        }
        if (all_done) {
            if (c->include_usage) {
                struct lm_openai_usage u = {(int)c->ch[0].job->prompt.n, 0, 0};
                for (int i = 0; i < c->n; i++) u.completion_tokens += c->ch[i].job->result.completion_tokens;
                u.cached_tokens = job_times(c, &c->ch[0]).cached_tokens;
                lm_openai_usage_chunk(&s->out, &c->meta, &u);
            }
            lm_openai_done(&s->out);
            s->finished = true;
            return true;
        }
        if (progress) return true;
        for (int i = 0; i < c->n; i++)
            if (!c->ch[i].finished) { /* wait on the first unfinished choice */
                lm_job_take(c->ch[i].job, c->n == 1 ? WAIT_MS : WAIT_MULTI_MS, &c->ch[i].incoming, &c->ch[i].lp_in);
                break;
            }
        if (peer_gone(s->fd)) {
            cancel_all(c);
            c->status = 499;
            return false;
        }
    }
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    struct stream *s = cls;
    (void)pos;
    if (s->off >= s->out.len) {
        if (s->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        if (!stream_produce(s)) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = s->out.len - s->off;
    if (n > max) n = max;
    memcpy(buf, s->out.p + s->off, n);
    s->off += n;
    return (ssize_t)n;
}

/* ---- generation routes -------------------------------------------------------------------- */

static lm_status parse_request(enum lm_api_endpoint ep, const struct lm_buf *body, struct lm_chat_request *req,
                               struct lm_api_error *err) {
    return ep == LM_API_CHAT ? lm_chat_request_parse(body->p, body->len, req, err)
                             : lm_completion_request_parse(body->p, body->len, req, err);
}

static enum MHD_Result handle_generate(struct MHD_Connection *mc, struct conn *k) {
    struct lm_server *srv = k->srv;
    enum lm_api_endpoint ep = k->route == ROUTE_CHAT ? LM_API_CHAT : LM_API_COMPLETIONS;
    struct call *c = call_create(k, ep);
    k->call = c;
    /* The body is in: from here until the answer is sent the connection waits on the engine (a
     * queue, a long prefill, the gaps of a stream), which is not idleness. MHD's idle timer only
     * sees bytes sent, so it is off for the request and back on in on_completed. */
    if (srv->timeout_s) {
        MHD_set_connection_option(mc, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
        k->timeout_off = true;
    }
    if (k->too_large)
        return respond_too_large(mc, k);
    struct lm_api_error err;
    if (lm_api_check_task(srv->tasks, lm_api_endpoint_task(ep), srv->model_name, &err))
        return respond_error(mc, k, &err);

    /* choice 0: parse, render, tokenize, check the context */
    struct choice *c0 = &c->ch[0];
    c0->job = lm_job_create(srv->worker);
    c->n = 0; /* no job is submitted yet */
    struct lm_job *j0 = c0->job;
    if (parse_request(ep, &k->body, &j0->req, &err)) return respond_error(mc, k, &err);
    if (lm_api_check_model(srv->model_name, j0->req.model, &err)) return respond_error(mc, k, &err);
    int max_tokens = 0;
    if (lm_chat_request_prompt(srv->model, &j0->req, srv->ctx, &j0->prompt, &max_tokens, &c->rendered, &err))
        return respond_error(mc, k, &err);
    const int n = j0->req.n;
    c->stream = j0->req.stream;
    c->include_usage = j0->req.include_usage;
    c->split = ep == LM_API_CHAT && srv->reasoning;
    const struct lm_gen_defaults *defaults = lm_model_gen_defaults(srv->model);

    /* one job per choice, each with its own copy of the request (stop strings live in it) */
    for (int i = 0; i < n; i++) {
        struct choice *ch = &c->ch[i];
        if (i > 0) {
            ch->job = lm_job_create(srv->worker);
            if (parse_request(ep, &k->body, &ch->job->req, &err)) return respond_error(mc, k, &err);
            lm_ids_append(&ch->job->prompt, j0->prompt.v, j0->prompt.n);
        }
        struct lm_job *j = ch->job;
        j->stream = c->stream;
        j->gen.prompt = j->prompt.v;
        j->gen.n_prompt = j->prompt.n;
        j->gen.max_tokens = max_tokens;
        j->gen.sampling = lm_chat_request_sampling(&j->req, defaults, i);
        j->gen.stop = j->req.n_stop ? j->req.stop : NULL;
        j->gen.n_stop = j->req.n_stop;
        j->gen.ignore_eos = j->req.ignore_eos;
        ch->t_done_ms = -1;
        if (c->split) lm_reasoning_init(&ch->parser, srv->reasoning, c->rendered.p, c->rendered.len);
    }
    lm_buf_free(&k->body);

    /* all n choices are queued together or none is: each takes one place of the queue */
    struct lm_job *jobs[LM_OPENAI_MAX_N];
    for (int i = 0; i < n; i++) jobs[i] = c->ch[i].job;
    lm_status st = lm_worker_submit_all(jobs, n);
    if (st == LM_ERR_RANGE)
        return respond_errorf(mc, k, 429, "rate_limit_exceeded", "queue_full", "%s", lm_error_message());
    if (st == LM_ERR_INVALID) {
        lm_api_errorf(&err, 400, "invalid_request_error", NULL, "n", "%s", lm_error_message());
        return respond_error(mc, k, &err);
    }
    if (st) return respond_errorf(mc, k, 503, "server_error", NULL, "%s", lm_error_message());
    c->n = n;

    if (c->stream) {
        struct stream *s = calloc(1, sizeof *s);
        if (!s) return MHD_NO;
        call_retain(c);
        s->call = c;
        s->fd = k->fd;
        struct MHD_Response *r =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, s, stream_free);
        if (!r) {
            stream_free(s);
            return MHD_NO;
        }
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
        MHD_add_response_header(r, "X-Request-Id", k->rid);
        enum MHD_Result ret = MHD_queue_response(mc, MHD_HTTP_OK, r);
        MHD_destroy_response(r);
        k->status = c->status = 200;
        return ret;
    }

    for (int i = 0; i < n; i++) {
        struct choice *ch = &c->ch[i];
        while (lm_job_wait(ch->job, WAIT_MS, NULL) != LM_JOB_DONE) {
            if (peer_gone(k->fd)) {
                cancel_all(c);
                k->status = c->status = 499;
                return MHD_NO; /* close the connection; on_completed frees the request */
            }
        }
        ch->t_done_ms = now_ms();
        ch->finished = true;
    }
    for (int i = 0; i < n; i++)
        if (c->ch[i].job->status) {
            job_error(c->ch[i].job, &err);
            return respond_error(mc, k, &err);
        }
    struct lm_openai_choice out[LM_OPENAI_MAX_N];
    struct lm_openai_usage u = {(int)j0->prompt.n, 0, job_times(c, c0).cached_tokens};
    for (int i = 0; i < n; i++) {
        struct choice *ch = &c->ch[i];
        const struct lm_gen_result *res = &ch->job->result;
        struct lm_buf r = {0}, cc = {0};
        split_text(c, ch, res->text.p ? res->text.p : "", res->text.len, &r, &cc);
        lm_buf_reset(&r);
        lm_buf_reset(&cc);
        split_text(c, ch, NULL, 0, &r, &cc);
        lm_buf_free(&r);
        lm_buf_free(&cc);
        out[i] = (struct lm_openai_choice){
            .text = ch->content.p ? ch->content.p : "",
            .len = ch->content.len,
            .reasoning = c->split ? (ch->reasoning.p ? ch->reasoning.p : "") : NULL,
            .reasoning_len = ch->reasoning.len,
            .finish_reason = lm_openai_finish_reason(res->finish),
        };
        out[i].logprobs = choice_logprobs(ch, &out[i].n_logprobs);
        u.completion_tokens += res->completion_tokens;
    }
    return respond_json(mc, k, 200, lm_openai_response(&c->meta, out, (size_t)n, &u));
}

/* ---- other routes ------------------------------------------------------------------------- */

static enum MHD_Result handle_post(struct MHD_Connection *mc, struct conn *k) {
    struct lm_server *srv = k->srv;
    if (k->route == ROUTE_CHAT || k->route == ROUTE_COMPLETIONS) return handle_generate(mc, k);
    if (k->too_large)
        return respond_too_large(mc, k);
    struct lm_api_error err;
    char *json = NULL;
    lm_status st = k->route == ROUTE_TOKENIZE
                       ? lm_openai_tokenize(srv->model, srv->tasks, k->body.p, k->body.len, srv->ctx, &json, &err)
                       : lm_openai_detokenize(srv->model, k->body.p, k->body.len, &json, &err);
    if (st) return respond_error(mc, k, &err);
    return respond_json(mc, k, 200, json);
}

static enum MHD_Result handle_metrics(struct MHD_Connection *mc, struct conn *k) {
    struct lm_server *srv = k->srv;
    struct lm_worker_stats ws;
    lm_worker_stats(srv->worker, &ws);
    struct lm_metrics_gauges g = {.running = ws.running,
                                  .waiting = ws.waiting,
                                  .kv_blocks_used = ws.engine.kv_blocks_used,
                                  .kv_blocks_cached = ws.engine.kv_blocks_cached,
                                  .kv_blocks_free = ws.engine.kv_blocks_free,
                                  .spec_drafts = ws.engine.spec_drafts,
                                  .spec_draft_tokens = ws.engine.spec_draft_tokens,
                                  .spec_accepted_tokens = ws.engine.spec_accepted_tokens};
    struct lm_buf out = {0};
    lm_metrics_render(srv->metrics, &g, &out);
    return respond(mc, k, 200, "text/plain; version=0.0.4; charset=utf-8", lm_buf_take(&out));
}

/* GET /v1/models, /v1/models/{id}, /health, /metrics. */
static enum MHD_Result handle_get(struct MHD_Connection *c, struct conn *k, const char *url) {
    struct lm_server *srv = k->srv;
    if (k->route == ROUTE_MODELS) {
        char *js = lm_openai_models(srv->model_name, srv->created, srv->ctx, srv->tasks);
        /* Where the model runs: "device": "cpu" or "cuda:N" (lumen serve --device). */
        struct lm_model_info mi;
        lm_model_info(srv->model, &mi);
        json_t *j = js ? json_loads(js, 0, NULL) : NULL;
        json_t *d0 = json_array_get(json_object_get(j, "data"), 0);
        char *with = d0 && !json_object_set_new(d0, "device", json_string(mi.device))
                         ? json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
        if (with) free(js);
        return respond_json(c, k, 200, with ? with : js);
    }
    if (k->route == ROUTE_MODEL) {
        const char *id = url + strlen(MODEL_PREFIX);
        struct lm_api_error e;
        if (lm_api_check_model(srv->model_name, id, &e)) return respond_error(c, k, &e);
        char *js = lm_openai_model(srv->model_name, srv->created, srv->ctx, srv->tasks);
        struct lm_model_info mi; /* "device" as in the /v1/models list */
        lm_model_info(srv->model, &mi);
        json_t *j = json_loads(js, 0, NULL);
        char *with = j && !json_object_set_new(j, "device", json_string(mi.device)) ? json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
        if (with) free(js);
        return respond_json(c, k, 200, with ? with : js);
    }
    if (k->route == ROUTE_HEALTH) return respond_json(c, k, 200, strdup("{\"status\":\"ok\"}"));
    if (k->route == ROUTE_METRICS) return handle_metrics(c, k);
    return respond_errorf(c, k, 404, "invalid_request_error", NULL, "unknown path %s", url);
}

static enum MHD_Result count_content_length(void *cls, enum MHD_ValueKind kind, const char *key,
                                            const char *value) {
    (void)kind;
    (void)value;
    if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) ++*(int *)cls;
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
    struct lm_server *srv = cls;
    struct conn *k = *con_cls;
    (void)version;
    if (!k) { /* headers are in; the body (if any) comes in the next calls */
        k = calloc(1, sizeof *k);
        if (!k) return MHD_NO;
        *con_cls = k;
        atomic_fetch_add(&srv->active, 1);
        k->srv = srv;
        k->fd = -1;
        clock_gettime(CLOCK_MONOTONIC, &k->t0);
        snprintf(k->method, sizeof k->method, "%s", method);
        snprintf(k->path, sizeof k->path, "%s", url);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (ci) k->fd = ci->connect_fd;
        k->hdr_rid = dup_header(c, "X-Request-Id");
        k->hdr_conv = dup_header(c, "X-Conversation-Id");
        k->hdr_phase = dup_header(c, "X-Lumen-Phase");
        k->hdr_turn = dup_header(c, "X-Lumen-Turn");
        if (id_ok(k->hdr_rid)) snprintf(k->rid, sizeof k->rid, "%s", k->hdr_rid);
        else
            snprintf(k->rid, sizeof k->rid, "%016llx",
                     (unsigned long long)splitmix64(srv->id_seed + atomic_fetch_add(&srv->id_counter, 1)));
        if (k->hdr_conv) {
            snprintf(k->conv, sizeof k->conv, "%s", k->hdr_conv);
            for (char *p = k->conv; *p; p++) /* keep the log one line */
                if ((unsigned char)*p < 0x20 || *p == ' ') *p = '_';
        }

        k->route = route_of(url);
        if (k->route == ROUTE_NONE)
            return respond_errorf(c, k, 404, "invalid_request_error", NULL,
                                  "unknown path %s %s; lumen serves POST /v1/chat/completions, POST "
                                  "/v1/completions, POST /tokenize, POST /detokenize, GET /v1/models, "
                                  "GET /v1/models/{id}, GET /metrics and GET /health",
                                  method, url);
        /* Two Content-Length headers make the body's end ambiguous (request smuggling, RFC 9112
         * 6.3): refuse them before reading a byte of the body. */
        int n_cl = 0;
        MHD_get_connection_values(c, MHD_HEADER_KIND, count_content_length, &n_cl);
        if (n_cl > 1)
            return respond_errorf(c, k, 400, "invalid_request_error", NULL,
                                  "the request has %d Content-Length headers; send exactly one", n_cl);
        bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
        if (route_post(k->route) && strcmp(method, "POST"))
            return respond_errorf(c, k, 405, "invalid_request_error", NULL,
                                  "method %s is not allowed on %s; use POST", method, url);
        if (!route_post(k->route) && !get)
            return respond_errorf(c, k, 405, "invalid_request_error", NULL,
                                  "method %s is not allowed on %s; use GET", method, url);
        /* GET routes answer in the next call: MHD 0.9.75 closes a connection whose answer is
         * queued in this first call, before the request was read to its end. */
        if (!route_post(k->route)) return MHD_YES;

        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > srv->max_body) {
            k->too_large = true;
            return handle_post(c, k); /* 413 (and a record for a generation route) */
        }
        return MHD_YES;
    }
    if (*upload_size) { /* a piece of the body */
        if (!k->too_large && k->body.len + *upload_size > k->srv->max_body) {
            k->too_large = true; /* keep reading and dropping it, then answer 413 */
            lm_buf_free(&k->body);
        }
        if (!k->too_large) lm_buf_append(&k->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (k->status) return MHD_YES; /* already answered */
    if (!route_post(k->route)) return handle_get(c, k, url);
    return handle_post(c, k);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    struct lm_server *srv = cls;
    struct conn *k = *con_cls;
    if (!k) return;
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && (k->status == 200 || k->status == 0)) k->status = 499;
    if (k->call) {
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) cancel_all(k->call);
        if (k->call->status == 499) k->status = 499;
        k->call->status = k->status;
    }
    if (k->timeout_off) /* idle again: the timer restarts now (MHD resets it when set from 0) */
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, srv->timeout_s);
    lm_metrics_count_request(srv->metrics, route_path(k->route), k->status);
    log_line(k);
    call_release(k->call);
    lm_buf_free(&k->body);
    free(k->hdr_rid);
    free(k->hdr_conv);
    free(k->hdr_phase);
    free(k->hdr_turn);
    free(k);
    *con_cls = NULL;
    atomic_fetch_sub(&srv->active, 1);
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

struct lm_server_params lm_server_default_params(void) {
    return (struct lm_server_params){.host = "127.0.0.1",
                                     .port = 8000,
                                     .ctx_size = 0,
                                     .max_queue = 64,
                                     .max_body = 8u << 20,
                                     .log_requests = true,
                                     .records_path = NULL,
                                     .reasoning = true,
                                     .timeout_keep_alive_s = 5,
                                     .max_connections = 1024};
}

/* libmicrohttpd's own messages. The one that matters to an operator, the connection limit, is
 * rewritten and logged at most once every 10 s (a flood of connections would flood the log);
 * the others (a client that resets its connection, a malformed request) are client noise. */
static void log_limit(struct lm_server *s, const char *why) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    long long last = atomic_load(&s->limit_logged_s);
    if (last && t.tv_sec - last < 10) return;
    if (!atomic_compare_exchange_strong(&s->limit_logged_s, &last, (long long)t.tv_sec)) return;
    fprintf(stderr,
            "lumen serve: connection limit reached (%s; --max-connections %u): new connections are "
            "closed at once until some close (idle ones close after --timeout-keep-alive)\n",
            why, s->max_connections);
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)ap;
    if (strstr(fmt, "connection limit")) log_limit(cls, "all connections are taken");
}

/* A connection the gate let through goes to MHD (which closes it when it cannot take it, e.g.
 * at the connection limit, and logs that through mhd_log). */
static void gate_hand_off(void *ctx, int fd, const struct sockaddr *addr, socklen_t addrlen) {
    struct lm_server *s = ctx;
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    MHD_add_connection(s->daemon, fd, addr, addrlen);
}

/* A connection the gate answered itself (status > 0), or closed for too many waiting (0). */
static void gate_refused(void *ctx, int status, const char *msg, const char *method, const char *target) {
    struct lm_server *s = ctx;
    if (status == 0) {
        log_limit(s, "too many connections wait for their first request");
        return;
    }
    /* counted under its endpoint when the request line named one (a 413 for a body over the
     * limit on POST /v1/chat/completions is that endpoint's), else under "other" */
    char path[256];
    snprintf(path, sizeof path, "%.*s", (int)strcspn(target, "?"), target);
    lm_metrics_count_request(s->metrics, route_path(route_of(path)), status);
    if (s->log)
        fprintf(stderr, "lumen serve: %s %s status=%d error=\"%s\"\n", *method ? method : "-", *target ? target : "-",
                status, msg);
}

/* The connection limit the open-files limit allows: raises the soft RLIMIT_NOFILE to the hard
 * one, and keeps 64 descriptors for the model's files, the listening socket and the records. */
static unsigned connection_limit(int want, bool log) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl)) return (unsigned)want;
    if (rl.rlim_cur < rl.rlim_max) {
        struct rlimit up = {rl.rlim_max, rl.rlim_max};
        if (rl.rlim_max == RLIM_INFINITY) up.rlim_cur = up.rlim_max = 1u << 20;
        if (!setrlimit(RLIMIT_NOFILE, &up)) rl = up;
    }
    unsigned n = (unsigned)want;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < (rlim_t)want + 64) {
        n = rl.rlim_cur > 128 ? (unsigned)(rl.rlim_cur - 64) : 64;
        if (log)
            fprintf(stderr,
                    "lumen serve: --max-connections lowered from %d to %u: the process may open "
                    "%llu files (ulimit -n)\n",
                    want, n, (unsigned long long)rl.rlim_cur);
    }
    return n;
}

/* Binds and listens ourselves (rather than letting MHD do it) so that a failure names the
 * address and errno, and so that any address family getaddrinfo knows works. */
static lm_status listen_on(const char *host, int port, int *fd_out, int *port_out) {
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    int rc = getaddrinfo(host, ps, &hints, &ai);
    if (rc) return lm_errorf(LM_ERR_IO, "cannot resolve --host %s: %s", host, gai_strerror(rc));
    int err = 0, fd = -1;
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 256) == 0) break;
        err = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0) return lm_errorf(LM_ERR_IO, "cannot listen on %s:%d: %s", host, port, strerror(err));
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    *port_out = port;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
        *port_out = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                             : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    *fd_out = fd;
    return LM_OK;
}

static void server_free(struct lm_server *s) {
    lm_records_close(s->records);
    lm_metrics_destroy(s->metrics);
    free(s);
}

lm_status lm_server_start(struct lm_model *m, const struct lm_server_params *p,
                          struct lm_server **out) {
    *out = NULL;
    if (p->ctx_size <= 0 || p->max_queue < 0 || p->port < 0 || p->port > 65535)
        return lm_errorf(LM_ERR_INVALID, "server parameters out of range");
    struct lm_server *s = calloc(1, sizeof *s);
    if (!s) return lm_errorf(LM_ERR_NOMEM, "out of memory");
    s->model = m;
    s->ctx = p->ctx_size;
    s->spec = p->spec.num_speculative_tokens > 0;
    s->max_body = p->max_body;
    s->log = p->log_requests;
    s->created = (long long)time(NULL);
    s->model_name = lm_model_name(m);
    s->tasks = lm_model_tasks(m);
    /* the server asks the model's family for its reasoning parser; it never tests the name */
    const struct lm_family *fam = lm_family_find(lm_model_config(m)->model_type);
    s->reasoning = p->reasoning && fam ? fam->reasoning : NULL;
    s->metrics = lm_metrics_create();
    if (!s->metrics) {
        free(s);
        return lm_errorf(LM_ERR_NOMEM, "out of memory");
    }
    lm_status st;
    if (p->records_path && (st = lm_records_open(p->records_path, &s->records))) {
        server_free(s);
        return st;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    s->id_seed = splitmix64((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)getpid());
    atomic_init(&s->id_counter, 0);
    atomic_init(&s->active, 0);
    atomic_init(&s->limit_logged_s, 0);

    int fd = -1;
    st = listen_on(p->host ? p->host : "127.0.0.1", p->port, &fd, &s->port);
    if (st) {
        server_free(s);
        return st;
    }
    struct lm_worker_params wp = lm_worker_params_from_server(p);
    st = lm_worker_start(m, &wp, &s->worker);
    if (st) {
        close(fd);
        server_free(s);
        return st;
    }
    s->max_connections = connection_limit(p->max_connections > 0 ? p->max_connections : 1024, p->log_requests);
    unsigned timeout = p->timeout_keep_alive_s > 0 ? (unsigned)p->timeout_keep_alive_s
                       : p->timeout_keep_alive_s < 0 ? 0u
                                                     : 5u;
    s->timeout_s = timeout;
    /* MHD gets its connections from the gate (gate.h), which accepts on `fd`. */
    s->daemon = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ITC |
                                     MHD_USE_ERROR_LOG | MHD_USE_NO_LISTEN_SOCKET,
                                 0, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                                 MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                                 MHD_OPTION_CONNECTION_LIMIT, s->max_connections,
                                 MHD_OPTION_CONNECTION_TIMEOUT, timeout,
                                 MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(4 * LM_GATE_MAX_HEAD), MHD_OPTION_END);
    if (!s->daemon) {
        int port = s->port;
        close(fd);
        lm_worker_destroy(s->worker);
        server_free(s);
        return lm_errorf(LM_ERR_IO, "libmicrohttpd could not start on port %d", port);
    }
    struct lm_gate_params gp = {.listen_fd = fd,
                                .max_body = s->max_body,
                                .idle_timeout_s = (int)timeout,
                                .max_gates = s->max_connections,
                                .hand_off = gate_hand_off,
                                .refused = gate_refused,
                                .ctx = s};
    st = lm_gate_start(&gp, &s->gate);
    if (st) {
        close(fd);
        MHD_stop_daemon(s->daemon);
        lm_worker_destroy(s->worker);
        server_free(s);
        return st;
    }
    *out = s;
    return LM_OK;
}

int lm_server_port(const struct lm_server *s) { return s->port; }

void lm_server_stop(struct lm_server *s) {
    if (!s) return;
    lm_gate_stop(s->gate); /* no new connections */
    lm_worker_shutdown(s->worker); /* waiting connections wake up with 503 / end of stream */
    /* Let the answers of the cancelled requests go out (a stream's final chunks, [DONE] and the
     * chunked terminator) before MHD closes every connection. */
    for (int i = 0; i < 500 && atomic_load(&s->active) > 0; i++) usleep(10 * 1000);
    MHD_stop_daemon(s->daemon); /* closes idle connections and joins their threads */
    lm_worker_destroy(s->worker);
    server_free(s);
}
