/* client.h: the profiler's HTTP client for OpenAI-compatible servers, over libcurl.
 *
 * One client is one connection (kept alive between requests) used by one thread at a time.
 * lm_bench_client_global_init must run once before clients are used from several threads
 * (curl_global_init is not thread-safe). Works with any server that speaks the OpenAI chat API:
 * lumen serve, llama.cpp's llama-server, vLLM, SGLang. */
#ifndef LM_BENCH_CLIENT_H
#define LM_BENCH_CLIENT_H

#include <signal.h>

#include "base/buf.h"
#include "base/status.h"
#include "bench/record.h"

struct lm_bench_client {
    void *curl;       /* CURL easy handle */
    char *base_url;   /* "http://host:port", without a trailing "/" or "/v1"; owned */
    char *api_key;    /* sent as "Authorization: Bearer ..."; owned; NULL for none */
    double timeout_s; /* per request, whole transfer; <= 0 for none */
};

/* Initialises libcurl once per process (thread-safe through pthread_once). */
void lm_bench_client_global_init(void);

/* `url` is the server's base ("http://127.0.0.1:8080"; a trailing "/v1" is accepted). api_key
 * may be NULL. LM_ERR_INVALID when the url is not http(s); LM_ERR_NOMEM when curl cannot start.
 * Free with lm_bench_client_free (also after a failure). */
lm_status lm_bench_client_init(struct lm_bench_client *c, const char *url, const char *api_key,
                               double timeout_s);
void lm_bench_client_free(struct lm_bench_client *c);

/* GET /v1/models and return data[0].id in *id (caller frees). LM_ERR_IO naming the url and the
 * curl or HTTP error when the server cannot be reached or answers != 200; LM_ERR_FORMAT when the
 * body is not a model list; LM_ERR_MISSING when the list is empty. */
lm_status lm_bench_client_first_model(struct lm_bench_client *c, char **id);

/* GET `path` ("/v1/models", "/metrics"); the body is appended to `body`, the HTTP status set in
 * *status (0 when no answer). LM_ERR_IO naming the url when the server cannot be reached (an
 * HTTP error status is not a failure here). */
lm_status lm_bench_client_get(struct lm_bench_client *c, const char *path, struct lm_buf *body,
                              long *status);

/* POSTs `body` (a chat.completions request, JSON) to /v1/chat/completions with the identity
 * headers of docs/RECORDS.md: X-Request-Id (rec->request_id), X-Conversation-Id
 * (rec->conversation_id), X-Lumen-Phase ("warmup" or "profiling") and X-Lumen-Turn (rec->turn
 * - 1, 0-based); fills rec's timing, response and error fields, and echoed_request_id from the
 * response's X-Request-Id header. Never fails as a call: every failure is recorded in rec
 * (rec->error, rec->error_message), so that the run goes on and the report counts it. */
void lm_bench_client_chat(struct lm_bench_client *c, const char *body, struct lm_bench_record *rec);

/* Stopping a run early (lumen profile on SIGINT/SIGTERM). Once *stop is non-zero, the replay
 * releases nothing more (its limits see lm_bench_client_stopping: replay.c), and a request in
 * flight may finish for grace_s more seconds (measured from when its transfer saw the flag, which
 * libcurl checks at least about once a second), then is aborted and failed with
 * LM_BENCH_ERR_CONNECTION and a message that starts with LM_BENCH_CLIENT_CANCELLED.
 * Process-wide, because the replay makes its clients itself: set it before the run starts and
 * clear it (NULL) after; `stop` is borrowed until then. */
#define LM_BENCH_CLIENT_CANCELLED "cancelled: the run was interrupted"
void lm_bench_client_watch_stop(const volatile sig_atomic_t *stop, double grace_s);
/* True once the watched flag is set: the replay then releases nothing more and cuts its sleeps
 * and waits short (replay.c). */
bool lm_bench_client_stopping(void);

/* Seconds on CLOCK_MONOTONIC / CLOCK_REALTIME. */
double lm_bench_now(void);
double lm_bench_unix_now(void);

#endif
