/* http.c: the HTTP transport of `lumen serve`, on libmicrohttpd (MHD).
 *
 * Threading: MHD runs one thread per connection (MHD_USE_THREAD_PER_CONNECTION) plus its
 * listening thread. We chose this over MHD's internal thread pool with suspend/resume because a
 * suspended connection is not polled by MHD, so a client that disconnects while its request waits
 * in the queue or generates would go unnoticed until the first write; with a thread per
 * connection, the thread that waits for its job can watch its own socket (poll + MSG_PEEK every
 * 25 ms) and cancel the job when the peer hangs up, which frees a queued request before it ever
 * runs and stops a running one within one decode step. The connection count is small (the
 * queue is bounded by --max-queue), so a thread each is cheap. The connection threads and the
 * engine thread meet only at the worker's queue (worker.h).
 *
 * Per request: the access handler collects the body (413 past max_body), parses and validates it
 * (openai.c; 400 with OpenAI's error JSON), renders and tokenizes the prompt on the connection
 * thread (the tokenizer is thread-safe), checks the context, and submits a job (429 when the
 * queue is full). A non-streaming request then waits for the job and answers one JSON object; a
 * streaming request answers with a chunked text/event-stream whose content reader turns the
 * text the engine releases into chat.completion.chunk events. Everything a request allocated is
 * freed in on_completed (the connection side) and when the job's last reference goes. */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/openai.h"
#include "server/server.h"
#include "server/worker.h"

#define WAIT_MS 25 /* how often a waiting connection checks that its client is still there */

struct lm_server {
    struct lm_model *model; /* borrowed */
    struct lm_worker *worker;
    struct MHD_Daemon *daemon;
    int port;
    int ctx;
    size_t max_body;
    bool log;
    long long created; /* start time, Unix seconds */
    const char *model_name;
    uint64_t id_seed;
    atomic_ullong id_counter;
};

enum route { ROUTE_NONE, ROUTE_CHAT, ROUTE_MODELS, ROUTE_HEALTH };

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
    struct lm_buf body;
    bool too_large;
    int status;        /* the HTTP status answered (499: the client went away first) */
    char error[512];   /* the error message answered, for the log */
    struct lm_job *job; /* our reference, NULL until a job exists */
    bool stream;
};

/* A streaming response's state, owned by the MHD response (freed in stream_free). */
struct stream {
    struct lm_job *job; /* its own reference */
    struct lm_buf out;  /* SSE bytes not yet handed to MHD, from `off` */
    size_t off;
    struct lm_buf text; /* released text being turned into a chunk */
    bool role_sent, finished, include_usage;
    int fd;
    char id[112];
    struct lm_openai_meta meta;
};

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

static void log_line(struct conn *k, enum MHD_RequestTerminationCode toe) {
    if (!k->srv->log) return;
    int prompt = -1, completion = -1;
    const char *finish = "";
    if (k->job) {
        enum lm_job_state st = lm_job_wait(k->job, 0, NULL);
        if (st != LM_JOB_NEW) prompt = (int)k->job->prompt.n;
        if (st == LM_JOB_DONE && k->job->status == LM_OK) {
            completion = k->job->result.completion_tokens;
            finish = lm_openai_finish_reason(k->job->result.finish);
        } else if (st == LM_JOB_DONE && k->job->status == LM_ERR_CANCELLED) {
            finish = "cancelled";
        }
    }
    int status = k->status;
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && (status == 200 || status == 0)) status = 499;
    char tokens[64] = "";
    if (prompt >= 0 && completion >= 0)
        snprintf(tokens, sizeof tokens, " prompt=%d completion=%d finish=%s", prompt, completion, finish);
    else if (prompt >= 0)
        snprintf(tokens, sizeof tokens, " prompt=%d completion=- finish=%s", prompt,
                 *finish ? finish : "cancelled");
    fprintf(stderr, "lumen serve: %s %s id=%s%s%s status=%d%s %.3fs%s%s%s\n", k->method, k->path,
            k->rid, k->conv[0] ? " conv=" : "", k->conv, status, tokens, seconds_since(&k->t0),
            k->error[0] ? " error=\"" : "", k->error, k->error[0] ? "\"" : "");
}

/* ---- responses ---------------------------------------------------------------------------- */

/* Queues `json` (malloc'd; MHD frees it) with `status`. */
static enum MHD_Result respond_json(struct MHD_Connection *c, struct conn *k, int status,
                                    char *json) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(json), json, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(json);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    MHD_add_response_header(r, "X-Request-Id", k->rid);
    if (status == 405)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, k->route == ROUTE_CHAT ? "POST" : "GET, HEAD");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    k->status = status;
    return ret;
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

/* ---- streaming ---------------------------------------------------------------------------- */

static void stream_free(void *cls) {
    struct stream *s = cls;
    lm_job_release(s->job);
    lm_buf_free(&s->out);
    lm_buf_free(&s->text);
    free(s);
}

/* Fills s->out with the next events, waiting for the engine as needed. Returns false when the
 * client has gone (the job is then cancelled). */
static bool stream_produce(struct stream *s) {
    lm_buf_reset(&s->out);
    s->off = 0;
    bool usage_null = s->include_usage;
    for (;;) {
        enum lm_job_state st = lm_job_wait(s->job, WAIT_MS, &s->text);
        if (s->text.len) {
            if (!s->role_sent) {
                lm_openai_chunk(&s->out, &s->meta, "assistant", "", 0, NULL, usage_null);
                s->role_sent = true;
            }
            lm_openai_chunk(&s->out, &s->meta, NULL, s->text.p, s->text.len, NULL, usage_null);
            lm_buf_reset(&s->text);
            return true;
        }
        if (st == LM_JOB_DONE) {
            struct lm_job *j = s->job;
            if (j->status == LM_OK) {
                if (!s->role_sent)
                    lm_openai_chunk(&s->out, &s->meta, "assistant", "", 0, NULL, usage_null);
                lm_openai_chunk(&s->out, &s->meta, NULL, NULL, 0,
                                lm_openai_finish_reason(j->result.finish), usage_null);
                if (s->include_usage)
                    lm_openai_usage_chunk(&s->out, &s->meta, j->result.prompt_tokens,
                                          j->result.completion_tokens);
            } else { /* shutdown or an engine error after the headers went out */
                struct lm_api_error e;
                lm_api_errorf(&e, j->status == LM_ERR_CANCELLED ? 503 : 500, "server_error", NULL,
                              NULL, "%s", j->error ? j->error : "generation failed");
                char *json = lm_openai_error_json(&e);
                lm_buf_printf(&s->out, "data: %s\n\n", json);
                free(json);
            }
            lm_openai_done(&s->out);
            s->role_sent = true;
            s->finished = true;
            return true;
        }
        if (peer_gone(s->fd)) {
            lm_job_cancel(s->job);
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

/* ---- routes ------------------------------------------------------------------------------- */

static enum MHD_Result handle_chat(struct MHD_Connection *c, struct conn *k) {
    struct lm_server *srv = k->srv;
    if (k->too_large)
        return respond_errorf(c, k, 413, "invalid_request_error", NULL,
                              "request body is larger than %zu bytes", srv->max_body);

    struct lm_api_error err;
    struct lm_job *j = lm_job_create(srv->worker);
    k->job = j;
    if (lm_chat_request_parse(k->body.p, k->body.len, &j->req, &err)) return respond_error(c, k, &err);
    lm_buf_free(&k->body);

    int max_tokens = 0;
    if (lm_chat_request_prompt(srv->model, &j->req, srv->ctx, &j->prompt, &max_tokens, &err))
        return respond_error(c, k, &err);
    j->stream = k->stream = j->req.stream;
    j->gen.prompt = j->prompt.v;
    j->gen.n_prompt = j->prompt.n;
    j->gen.max_tokens = max_tokens;
    j->gen.sampling = lm_chat_request_sampling(&j->req, lm_model_gen_defaults(srv->model));
    j->gen.stop = j->req.n_stop ? j->req.stop : NULL;
    j->gen.n_stop = j->req.n_stop;
    j->gen.ignore_eos = j->req.ignore_eos;

    lm_status st = lm_worker_submit(j);
    if (st == LM_ERR_RANGE)
        return respond_errorf(c, k, 429, "rate_limit_exceeded", "queue_full", "%s", lm_error_message());
    if (st) return respond_errorf(c, k, 503, "server_error", NULL, "%s", lm_error_message());

    char id[112];
    snprintf(id, sizeof id, "chatcmpl-%s", k->rid);

    if (j->stream) {
        struct stream *s = calloc(1, sizeof *s);
        if (!s) return MHD_NO;
        lm_job_retain(j);
        s->job = j;
        s->fd = k->fd;
        s->include_usage = j->req.include_usage;
        snprintf(s->id, sizeof s->id, "%s", id);
        s->meta = (struct lm_openai_meta){s->id, (long long)time(NULL), srv->model_name};
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
        enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
        MHD_destroy_response(r);
        k->status = 200;
        return ret;
    }

    for (;;) {
        enum lm_job_state js = lm_job_wait(j, WAIT_MS, NULL);
        if (js == LM_JOB_DONE) break;
        if (peer_gone(k->fd)) {
            lm_job_cancel(j);
            k->status = 499;
            return MHD_NO; /* close the connection; on_completed frees the request */
        }
    }
    if (j->status == LM_ERR_CANCELLED)
        return respond_errorf(c, k, 503, "server_error", NULL, "%s", j->error ? j->error : "cancelled");
    if (j->status == LM_ERR_RANGE || j->status == LM_ERR_INVALID)
        return respond_errorf(c, k, 400, "invalid_request_error", NULL, "%s", j->error);
    if (j->status)
        return respond_errorf(c, k, 500, "server_error", NULL, "generation failed: %s", j->error);
    struct lm_openai_meta meta = {id, (long long)time(NULL), srv->model_name};
    const struct lm_gen_result *res = &j->result;
    return respond_json(c, k, 200,
                        lm_openai_chat_completion(&meta, res->text.p, res->text.len,
                                                  lm_openai_finish_reason(res->finish),
                                                  res->prompt_tokens, res->completion_tokens));
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
        k->srv = srv;
        k->fd = -1;
        clock_gettime(CLOCK_MONOTONIC, &k->t0);
        snprintf(k->method, sizeof k->method, "%s", method);
        snprintf(k->path, sizeof k->path, "%s", url);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (ci) k->fd = ci->connect_fd;
        const char *rid = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Request-Id");
        if (id_ok(rid)) snprintf(k->rid, sizeof k->rid, "%s", rid);
        else
            snprintf(k->rid, sizeof k->rid, "%016llx",
                     (unsigned long long)splitmix64(srv->id_seed + atomic_fetch_add(&srv->id_counter, 1)));
        const char *conv = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Conversation-Id");
        if (conv) {
            snprintf(k->conv, sizeof k->conv, "%s", conv);
            for (char *p = k->conv; *p; p++) /* keep the log one line */
                if ((unsigned char)*p < 0x20 || *p == ' ') *p = '_';
        }

        bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
        if (!strcmp(url, "/v1/chat/completions")) k->route = ROUTE_CHAT;
        else if (!strcmp(url, "/v1/models")) k->route = ROUTE_MODELS;
        else if (!strcmp(url, "/health")) k->route = ROUTE_HEALTH;
        else
            return respond_errorf(c, k, 404, "invalid_request_error", NULL,
                                  "unknown path %s %s; lumen serves POST /v1/chat/completions, "
                                  "GET /v1/models and GET /health",
                                  method, url);
        if (k->route == ROUTE_CHAT && strcmp(method, "POST"))
            return respond_errorf(c, k, 405, "invalid_request_error", NULL,
                                  "method %s is not allowed on %s; use POST", method, url);
        if (k->route != ROUTE_CHAT && !get)
            return respond_errorf(c, k, 405, "invalid_request_error", NULL,
                                  "method %s is not allowed on %s; use GET", method, url);
        if (k->route == ROUTE_MODELS)
            return respond_json(c, k, 200, lm_openai_models(srv->model_name, srv->created, srv->ctx));
        if (k->route == ROUTE_HEALTH) return respond_json(c, k, 200, strdup("{\"status\":\"ok\"}"));

        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > srv->max_body)
            return respond_errorf(c, k, 413, "invalid_request_error", NULL,
                                  "request body is larger than %zu bytes", srv->max_body);
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
    return handle_chat(c, k);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)c;
    struct conn *k = *con_cls;
    if (!k) return;
    if (k->job && toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) lm_job_cancel(k->job);
    log_line(k, toe);
    lm_job_release(k->job);
    lm_buf_free(&k->body);
    free(k);
    *con_cls = NULL;
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

struct lm_server_params lm_server_default_params(void) {
    return (struct lm_server_params){.host = "127.0.0.1",
                                     .port = 8000,
                                     .ctx_size = 0,
                                     .max_queue = 64,
                                     .max_body = 8u << 20,
                                     .log_requests = true};
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

lm_status lm_server_start(struct lm_model *m, const struct lm_server_params *p,
                          struct lm_server **out) {
    *out = NULL;
    if (p->ctx_size <= 0 || p->max_queue < 0 || p->port < 0 || p->port > 65535)
        return lm_errorf(LM_ERR_INVALID, "server parameters out of range");
    struct lm_server *s = calloc(1, sizeof *s);
    if (!s) return lm_errorf(LM_ERR_NOMEM, "out of memory");
    s->model = m;
    s->ctx = p->ctx_size;
    s->max_body = p->max_body;
    s->log = p->log_requests;
    s->created = (long long)time(NULL);
    s->model_name = lm_model_name(m);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    s->id_seed = splitmix64((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)getpid());
    atomic_init(&s->id_counter, 0);

    int fd = -1;
    lm_status st = listen_on(p->host ? p->host : "127.0.0.1", p->port, &fd, &s->port);
    if (st) {
        free(s);
        return st;
    }
    st = lm_worker_create(m, p->ctx_size, p->max_queue, &s->worker);
    if (st) {
        close(fd);
        free(s);
        return st;
    }
    s->daemon = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ITC,
                                 0, NULL, NULL, on_request, s, MHD_OPTION_LISTEN_SOCKET, fd,
                                 MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                                 MHD_OPTION_CONNECTION_LIMIT, (unsigned)1024, MHD_OPTION_END);
    if (!s->daemon) {
        int port = s->port;
        close(fd);
        lm_worker_destroy(s->worker);
        free(s);
        return lm_errorf(LM_ERR_IO, "libmicrohttpd could not start on port %d", port);
    }
    *out = s;
    return LM_OK;
}

int lm_server_port(const struct lm_server *s) { return s->port; }

void lm_server_stop(struct lm_server *s) {
    if (!s) return;
    int lfd = MHD_quiesce_daemon(s->daemon); /* no new connections */
    if (lfd >= 0) close(lfd);
    lm_worker_shutdown(s->worker); /* waiting connections wake up with 503 / end of stream */
    MHD_stop_daemon(s->daemon);    /* closes idle connections and joins their threads */
    lm_worker_destroy(s->worker);
    free(s);
}
