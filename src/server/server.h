/* server.h: `lumen serve`, an OpenAI-compatible HTTP server over one loaded model.
 *
 * Routes: POST /v1/chat/completions and POST /v1/completions (streaming and not), GET
 * /v1/models (with each model's capabilities) and /v1/models/{id}, POST /tokenize and
 * /detokenize (vLLM's), GET
 * /metrics (Prometheus), GET /health. A generation route runs only when the model's family
 * declares its task (text_conversation, text_generation); otherwise 400.
 * Transport: libmicrohttpd (http.c); request logic: openai.h; engine and queue: worker.h;
 * request records: records.h; metrics: metrics.h. Requests wait in a bounded queue (429 beyond
 * it). A client that disconnects cancels its request. Every error the server answers itself is
 * OpenAI's error JSON (openai.h), transport errors of a connection's first request included
 * (gate.h says which, and the one gap: later requests of a keep-alive connection). A request's
 * "model" must name the served model when given (404 otherwise). */
#ifndef LM_SERVER_SERVER_H
#define LM_SERVER_SERVER_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"
#include "engine/spec.h"
#include "family/model.h"

struct lm_server_params {
    const char *host;  /* address to bind, numeric or a name; default "127.0.0.1" */
    int port;          /* TCP port; 0 = any free port (see lm_server_port); default 8000 */
    int ctx_size;      /* KV capacity (positions) of the engine's sequence; > 0 */
    int max_queue;     /* requests that may wait behind the running one; default 64 */
    size_t max_body;   /* largest request body in bytes (413 beyond); default 8 MiB */
    bool log_requests; /* one line per request on stderr; default true */
    /* Engine limits (worker.h); 0 = the engine's default. */
    int max_seqs;              /* requests running at once (continuous batching); default 16 */
    int max_batch_tokens;      /* tokens per forward step, decodes + prefill chunks; default 512 */
    long kv_tokens;            /* KV cache size in tokens; default ctx_size * max_seqs, capped at
                                  a quarter of the available memory */
    double shutdown_timeout_s; /* stop lets in-flight requests finish this long; default 10 (a
                                  negative value: cancel at once) */
    struct lm_spec_params spec; /* speculative decoding (engine/spec.h); zeroed (default): off */
    bool no_async_scheduling;   /* wait for each engine step's ids before the next step; default
                                   false: a steady decode is queued a step ahead where the model
                                   can (CUDA; engine/sched.h, params.queue) */
    const char *records_path; /* append one JSONL record per generation request (records.h);
                                 NULL (default): none */
    bool reasoning;    /* split chat output into reasoning_content and content with the family's
                          reasoning parser, when it has one; default true */
    /* Connections (libmicrohttpd, one thread each). */
    int timeout_keep_alive_s;    /* seconds; a connection idle this long (no byte received or sent:
                                    between requests, or a client that stops sending its
                                    request) is closed; default 5, as uvicorn's
                                    --timeout-keep-alive. A request being answered is never
                                    idle: generation and streaming keep their connection. 0 =
                                    the default; negative = never */
    int max_connections;         /* open connections at most; more are closed at accept with a
                                    log line (at most one each 10 s); default 1024, lowered to
                                    what the open-files limit (ulimit -n, raised to its hard
                                    limit at start) allows */
};
struct lm_server_params lm_server_default_params(void); /* ctx_size is 0: the caller sets it */

struct lm_server;

/* Binds, starts the engine thread and the HTTP threads, and returns at once. `m` is borrowed and
 * must outlive the server. LM_ERR_IO when the address cannot be bound (message names it and
 * errno) or the records file cannot be opened; errors from lm_seq_create (LM_ERR_RANGE, LM_ERR_NOMEM). *out is caller-owned
 * (lm_server_stop). */
lm_status lm_server_start(struct lm_model *m, const struct lm_server_params *p,
                          struct lm_server **out);
/* The bound port (useful with port 0). */
int lm_server_port(const struct lm_server *s);
/* Stops accepting, lets in-flight requests finish for up to shutdown_timeout_s, then cancels
 * the rest (a waiting client gets 503; a stream ends with finish_reason "abort", then [DONE]),
 * waits up to 5 s for the last responses to be written, joins all threads and frees the server.
 * Accepts NULL. */
void lm_server_stop(struct lm_server *s);

#endif
