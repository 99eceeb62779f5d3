/* gate.h: accepting connections, and a first look at the head of each connection's first
 * request before libmicrohttpd takes the connection.
 *
 * libmicrohttpd 0.9.75 answers some malformed requests itself, before any callback of ours runs,
 * with an HTML body and, for a bad or huge Content-Length, with its status line written twice:
 * a request line it cannot parse (it closes without a word), an HTTP version other than 1.x
 * (505), a header block too large for its memory pool (431), a Content-Length that is not a
 * number or overflows (400, 413). It offers no hook to change those answers. So the server
 * accepts connections itself: a gate thread per new connection peeks (MSG_PEEK, nothing is
 * consumed) at the head of the first request, answers these errors with OpenAI's error JSON
 * (and "Connection: close"), and hands every other connection to libmicrohttpd
 * (MHD_add_connection), which then reads the request from the first byte. The gate also refuses
 * two Content-Length headers (RFC 9112 6.3: request smuggling), Content-Length together with
 * Transfer-Encoding, and a declared body above the server's limit (413).
 *
 * Limits: only the first request of a connection passes the gate; the later requests of a
 * keep-alive connection are parsed by libmicrohttpd alone, so their transport errors, and a
 * malformed chunked body, still get its HTML answers. */
#ifndef LM_SERVER_GATE_H
#define LM_SERVER_GATE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

#include "base/status.h"

#define LM_GATE_MAX_HEAD 16384 /* bytes of a request line plus headers (431 beyond) */

/* The verdict on the head of a request: the first `len` bytes received (`len` may stop short of
 * the blank line that ends the head). Returns 0 when the head is complete and acceptable, -1
 * when more bytes are needed to decide, or the HTTP status to answer (400, 413, 431, 505) with
 * a message for a person in `msg` (e.g. "the request has 2 Content-Length headers; send exactly
 * one"). `max_body`: the largest body allowed (413 beyond, the message names the limit). A head
 * of LM_GATE_MAX_HEAD bytes without its end is 431. Pure; tested without sockets. */
int lm_gate_check_head(const char *buf, size_t len, size_t max_body, char *msg, size_t cap);

/* The HTTP reason phrase of a status ("Bad Request"), libmicrohttpd's; "Unknown" for others. */
const char *lm_gate_reason(int status);

struct lm_gate_params {
    int listen_fd;      /* a listening socket, owned by the gate from lm_gate_start on */
    size_t max_body;    /* the server's body limit (413) */
    int idle_timeout_s; /* a new connection that sends no complete head in this long is
                           closed; <= 0: no limit */
    unsigned max_gates; /* connections waiting at the gate at most; more are closed at once */
    /* Hands a checked connection on; takes `fd` (closes it on failure). */
    void (*hand_off)(void *ctx, int fd, const struct sockaddr *addr, socklen_t addrlen);
    /* A refused connection: the status answered, the message, the request line's method and
     * target as far as they were read ("" when unknown); 0 = too many waiting at the gate. */
    void (*refused)(void *ctx, int status, const char *msg, const char *method, const char *target);
    void *ctx;
};

struct lm_gate;

/* Starts the accepting thread. LM_ERR_NOMEM / LM_ERR_IO when a thread or pipe cannot be made. */
lm_status lm_gate_start(const struct lm_gate_params *p, struct lm_gate **out);
/* Stops accepting (closes the listening socket), lets the gate threads end (they answer nothing
 * more and close their connections), waits for them for up to 2 s, frees. Accepts NULL. */
void lm_gate_stop(struct lm_gate *g);

#endif
