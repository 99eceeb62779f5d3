/* gate.c: see gate.h.
 *
 * One accepting thread polls the listening socket and a wake-up pipe; each accepted connection
 * gets a small detached gate thread, which polls its socket, peeks at what has arrived (the
 * bytes stay in the socket for libmicrohttpd), and decides with lm_gate_check_head. Most
 * clients send a request's head in one segment, so the first peek decides; a head that arrives
 * in pieces is peeked again every 2 ms until it is complete, too large, or the idle timeout
 * passes. */
#include "server/gate.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "base/buf.h"
#include "server/openai.h"

struct lm_gate {
    struct lm_gate_params p;
    int wake[2]; /* written once by lm_gate_stop */
    pthread_t thread;
    atomic_bool stopping;
    atomic_int n_gates; /* gate threads alive */
};

struct gate_conn {
    struct lm_gate *g;
    int fd;
    struct sockaddr_storage addr;
    socklen_t addrlen;
};

/* ---- the head of a request ---------------------------------------------------------------- */

const char *lm_gate_reason(int status) {
    return MHD_get_reason_phrase_for((unsigned)status);
}

/* RFC 9110 5.6.2: the characters of a token (methods, header names). */
static bool tchar(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* `n` bytes of `s` for a message: printable ASCII as is, others as \xNN, at most 40 bytes. */
static void quoted(const char *s, size_t n, char *out, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < n && i < 40 && o + 5 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '\\' && c != '"')
            out[o++] = (char)c;
        else
            o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
    }
    if (n > 40 && o + 4 < cap) o += (size_t)snprintf(out + o, cap - o, "...");
    out[o < cap ? o : cap - 1] = 0;
}

/* The end of the line starting at p (at its LF), or NULL when it has not arrived. */
static const char *line_end(const char *p, const char *end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    return nl;
}

int lm_gate_check_head(const char *buf, size_t len, size_t max_body, char *msg, size_t cap) {
    const char *p = buf, *end = buf + len;
    char q[200];
    while (p < end && (*p == '\r' || *p == '\n'))
        p++; /* RFC 9112 2.2: empty lines first */
    const char *eol = line_end(p, end);
    if (!eol) {
        if (len >= LM_GATE_MAX_HEAD) goto too_large;
        return -1;
    }
    /* request-line = method SP request-target SP HTTP-version */
    const char *line_stop = eol > p && eol[-1] == '\r' ? eol - 1 : eol;
    const char *m = p;
    while (m < line_stop && tchar((unsigned char)*m))
        m++;
    const char *t = m + 1, *te = t;
    while (te < line_stop && (unsigned char)*te > 0x20 && (unsigned char)*te < 0x7f)
        te++;
    const char *v = te + 1;
    if (m == p || m >= line_stop || *m != ' ' || te == t || te >= line_stop || *te != ' ' ||
        line_stop - v != 8 || strncmp(v, "HTTP/", 5) || v[5] < '0' || v[5] > '9' || v[6] != '.' ||
        v[7] < '0' || v[7] > '9') {
        quoted(p, (size_t)(line_stop - p), q, sizeof q);
        snprintf(msg, cap, "malformed request line \"%s\"; expected METHOD SP TARGET SP HTTP/1.1",
                 q);
        return 400;
    }
    if (v[5] != '1') {
        snprintf(msg, cap, "HTTP version %.8s is not supported; use HTTP/1.1 or HTTP/1.0", v);
        return 505;
    }
    /* header fields, up to the empty line */
    int n_cl = 0, line_no = 0;
    bool te_given = false;
    unsigned long long cl = 0;
    bool cl_over = false;
    char cl_text[64] = "";
    for (p = eol + 1;; p = eol + 1) {
        eol = p < end ? line_end(p, end) : NULL;
        if (!eol) {
            if (len >= LM_GATE_MAX_HEAD) goto too_large;
            return -1;
        }
        line_stop = eol > p && eol[-1] == '\r' ? eol - 1 : eol;
        if (line_stop == p) break; /* the end of the head */
        line_no++;
        if ((size_t)(eol + 1 - buf) > LM_GATE_MAX_HEAD) goto too_large;
        const char *n = p;
        while (n < line_stop && tchar((unsigned char)*n))
            n++;
        if (n == p || n >= line_stop || *n != ':') {
            quoted(p, (size_t)(line_stop - p), q, sizeof q);
            snprintf(msg, cap, "malformed header line %d \"%s\"; expected NAME: VALUE", line_no, q);
            return 400;
        }
        const char *val = n + 1, *ve = line_stop;
        while (val < ve && (*val == ' ' || *val == '\t'))
            val++;
        while (ve > val && (ve[-1] == ' ' || ve[-1] == '\t'))
            ve--;
        size_t name_len = (size_t)(n - p);
        if (name_len == 14 && !strncasecmp(p, "Content-Length", 14)) {
            n_cl++;
            quoted(val, (size_t)(ve - val), cl_text, sizeof cl_text);
            bool digits = ve > val;
            cl = 0;
            for (const char *d = val; d < ve; d++) {
                if (*d < '0' || *d > '9') {
                    digits = false;
                    break;
                }
                if (cl > (UINT64_MAX - 9) / 10)
                    cl_over = true;
                else
                    cl = cl * 10 + (unsigned)(*d - '0');
            }
            if (!digits) {
                snprintf(msg, cap, "Content-Length \"%s\" is not a number of bytes", cl_text);
                return 400;
            }
        } else if (name_len == 17 && !strncasecmp(p, "Transfer-Encoding", 17)) {
            te_given = true;
        }
    }
    if (n_cl > 1) {
        snprintf(msg, cap, "the request has %d Content-Length headers; send exactly one", n_cl);
        return 400;
    }
    if (n_cl && te_given) {
        snprintf(msg, cap,
                 "the request has both Content-Length and Transfer-Encoding; send one of them");
        return 400;
    }
    if (n_cl && (cl_over || cl > max_body)) {
        snprintf(msg, cap,
                 "request body of %s bytes is larger than the server's limit of %zu bytes (%.0f "
                 "MiB)",
                 cl_text, max_body, (double)max_body / 1048576.0);
        return 413;
    }
    return 0;
too_large:
    snprintf(msg, cap,
             "the request line and headers are larger than the server's limit of %d bytes",
             LM_GATE_MAX_HEAD);
    return 431;
}

/* ---- the threads -------------------------------------------------------------------------- */

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

/* Answers `status` with OpenAI's error JSON and closes: the response, then our side shut, then
 * what the client still sends read and dropped for a moment (closing with unread bytes would
 * reset the connection and could destroy the answer before the client reads it). */
static void answer_and_close(int fd, int status, const char *message) {
    struct lm_api_error e;
    lm_api_errorf(&e, status, "invalid_request_error", NULL, NULL, "%s", message);
    char *body = lm_openai_error_json(&e);
    struct lm_buf out = {0};
    lm_buf_printf(&out,
                  "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                  "Connection: close\r\n\r\n%s",
                  status, lm_gate_reason(status), strlen(body), body);
    free(body);
    size_t off = 0;
    while (off < out.len) {
        ssize_t w = send(fd, out.p + off, out.len - off, MSG_NOSIGNAL);
        if (w <= 0) break;
        off += (size_t)w;
    }
    lm_buf_free(&out);
    shutdown(fd, SHUT_WR);
    double until = now_ms() + 200;
    char sink[4096];
    for (;;) {
        int left = (int)(until - now_ms());
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, left) <= 0) break;
        if (recv(fd, sink, sizeof sink, MSG_DONTWAIT) <= 0) break;
    }
    close(fd);
}

/* Method and target of a head, as far as they can be read, for the refusal's log line. */
static void request_line(const char *buf, size_t len, char *method, size_t mc, char *target,
                         size_t tc) {
    const char *p = buf, *end = buf + len;
    while (p < end && (*p == '\r' || *p == '\n'))
        p++;
    const char *sp = memchr(p, ' ', (size_t)(end - p));
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    if (!sp || (nl && sp > nl)) {
        snprintf(method, mc, "-");
        snprintf(target, tc, "-");
        return;
    }
    quoted(p, (size_t)(sp - p), method, mc);
    const char *t = sp + 1, *te = t;
    while (te < end && *te != ' ' && *te != '\r' && *te != '\n')
        te++;
    quoted(t, (size_t)(te - t), target, tc);
}

static void *gate_main(void *arg) {
    struct gate_conn *gc = arg;
    struct lm_gate *g = gc->g;
    const int fd = gc->fd;
    double deadline = g->p.idle_timeout_s > 0 ? now_ms() + 1e3 * g->p.idle_timeout_s : 0;
    char *buf = malloc(LM_GATE_MAX_HEAD);
    char msg[512];
    int verdict = -1;
    ssize_t n = 0;
    while (buf && !atomic_load(&g->stopping)) {
        struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
        int pr = poll(&p, 1, n > 0 ? 2 : 50);
        if (pr < 0 && errno != EINTR) break;
        if (pr > 0) {
            ssize_t got = recv(fd, buf, LM_GATE_MAX_HEAD, MSG_PEEK);
            if (got <= 0) break; /* the client left */
            if (got != n) {
                n = got;
                verdict = lm_gate_check_head(buf, (size_t)n, g->p.max_body, msg, sizeof msg);
                if (verdict >= 0) break;
            } else if (p.revents & (POLLRDHUP | POLLHUP)) {
                break; /* an incomplete head, and the client will send no more */
            } else if (n > 0) {
                usleep(2000); /* the same incomplete head: the bytes stay readable */
            }
        }
        if (deadline > 0 && now_ms() > deadline) break; /* idle: close without a word */
    }
    if (verdict == 0) {
        g->p.hand_off(g->p.ctx, fd, (const struct sockaddr *)&gc->addr, gc->addrlen);
    } else if (verdict > 0) {
        char method[64], target[128];
        request_line(buf, (size_t)n, method, sizeof method, target, sizeof target);
        g->p.refused(g->p.ctx, verdict, msg, method, target);
        answer_and_close(fd, verdict, msg);
    } else {
        close(fd);
    }
    free(buf);
    free(gc);
    atomic_fetch_sub(&g->n_gates, 1);
    return NULL;
}

static void *accept_main(void *arg) {
    struct lm_gate *g = arg;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    for (;;) {
        struct pollfd p[2] = {{.fd = g->p.listen_fd, .events = POLLIN},
                              {.fd = g->wake[0], .events = POLLIN}};
        if (poll(p, 2, -1) < 0 && errno != EINTR) break;
        if (p[1].revents || atomic_load(&g->stopping)) break;
        if (!(p[0].revents & POLLIN)) continue;
        struct gate_conn *gc = calloc(1, sizeof *gc);
        if (!gc) {
            usleep(10 * 1000);
            continue;
        }
        gc->g = g;
        gc->addrlen = sizeof gc->addr;
        gc->fd = accept4(g->p.listen_fd, (struct sockaddr *)&gc->addr, &gc->addrlen, SOCK_CLOEXEC);
        if (gc->fd < 0) {
            int e = errno;
            free(gc);
            if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM)
                usleep(10 * 1000); /* out of descriptors: let some close */
            continue;
        }
        if ((unsigned)atomic_load(&g->n_gates) >= g->p.max_gates) {
            g->p.refused(g->p.ctx, 0, "too many connections wait at the gate", "", "");
            close(gc->fd);
            free(gc);
            continue;
        }
        atomic_fetch_add(&g->n_gates, 1);
        pthread_t t;
        if (pthread_create(&t, &attr, gate_main, gc)) {
            atomic_fetch_sub(&g->n_gates, 1);
            close(gc->fd);
            free(gc);
        }
    }
    pthread_attr_destroy(&attr);
    return NULL;
}

lm_status lm_gate_start(const struct lm_gate_params *p, struct lm_gate **out) {
    *out = NULL;
    struct lm_gate *g = calloc(1, sizeof *g);
    if (!g) return lm_errorf(LM_ERR_NOMEM, "out of memory");
    g->p = *p;
    atomic_init(&g->stopping, false);
    atomic_init(&g->n_gates, 0);
    if (pipe2(g->wake, O_CLOEXEC)) {
        int e = errno;
        free(g);
        return lm_errorf(LM_ERR_IO, "cannot make a pipe: %s", strerror(e));
    }
    int rc = pthread_create(&g->thread, NULL, accept_main, g);
    if (rc) {
        close(g->wake[0]);
        close(g->wake[1]);
        free(g);
        return lm_errorf(LM_ERR_NOMEM, "cannot start the accepting thread: %s", strerror(rc));
    }
    *out = g;
    return LM_OK;
}

void lm_gate_stop(struct lm_gate *g) {
    if (!g) return;
    atomic_store(&g->stopping, true);
    ssize_t w = write(g->wake[1], "x", 1);
    (void)w;
    pthread_join(g->thread, NULL);
    close(g->p.listen_fd);
    for (int i = 0; i < 200 && atomic_load(&g->n_gates) > 0; i++)
        usleep(10 * 1000);
    close(g->wake[0]);
    close(g->wake[1]);
    if (atomic_load(&g->n_gates) == 0) free(g); /* else a gate thread still holds it: leak it */
}
