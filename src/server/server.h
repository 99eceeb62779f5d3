/* server.h: `lumen serve`, an OpenAI-compatible HTTP server over one loaded model.
 *
 * Routes: POST /v1/chat/completions (streaming and not), GET /v1/models, GET /health.
 * Transport: libmicrohttpd (http.c); request logic: openai.h; engine thread and queue: worker.h.
 * Requests run one at a time on the engine thread; others wait in a bounded queue (429 beyond
 * it). A client that disconnects cancels its request. */
#ifndef LM_SERVER_SERVER_H
#define LM_SERVER_SERVER_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"
#include "family/model.h"

struct lm_server_params {
    const char *host;  /* address to bind, numeric or a name; default "127.0.0.1" */
    int port;          /* TCP port; 0 = any free port (see lm_server_port); default 8000 */
    int ctx_size;      /* KV capacity (positions) of the engine's sequence; > 0 */
    int max_queue;     /* requests that may wait behind the running one; default 64 */
    size_t max_body;   /* largest request body in bytes (413 beyond); default 8 MiB */
    bool log_requests; /* one line per request on stderr; default true */
};
struct lm_server_params lm_server_default_params(void); /* ctx_size is 0: the caller sets it */

struct lm_server;

/* Binds, starts the engine thread and the HTTP threads, and returns at once. `m` is borrowed and
 * must outlive the server. LM_ERR_IO when the address cannot be bound (message names it and
 * errno); errors from lm_seq_create (LM_ERR_RANGE, LM_ERR_NOMEM). *out is caller-owned
 * (lm_server_stop). */
lm_status lm_server_start(struct lm_model *m, const struct lm_server_params *p,
                          struct lm_server **out);
/* The bound port (useful with port 0). */
int lm_server_port(const struct lm_server *s);
/* Stops accepting, cancels queued and running requests (their clients get 503 or the end of the
 * stream), joins all threads and frees the server. Accepts NULL. */
void lm_server_stop(struct lm_server *s);

#endif
