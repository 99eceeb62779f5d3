/* sse.c: see sse.h. */
#include "bench/sse.h"

#include <string.h>

void lm_sse_init(struct lm_sse_parser *p) {
    memset(p, 0, sizeof *p);
}

void lm_sse_free(struct lm_sse_parser *p) {
    lm_buf_free(&p->line);
    lm_buf_free(&p->data);
    memset(p, 0, sizeof *p);
}

static int dispatch(struct lm_sse_parser *p, lm_sse_event_fn fn, void *ctx) {
    if (!p->has_data) return 0;
    p->has_data = false;
    int rc = fn(ctx, p->data.p ? p->data.p : "", p->data.len);
    lm_buf_reset(&p->data);
    return rc;
}

/* One complete line (without its terminator). */
static int process_line(struct lm_sse_parser *p, lm_sse_event_fn fn, void *ctx) {
    const char *s = p->line.p ? p->line.p : "";
    size_t n = p->line.len;
    int rc = 0;
    if (n == 0) {
        rc = dispatch(p, fn, ctx);
    } else if (s[0] != ':') {
        const char *colon = memchr(s, ':', n);
        size_t name_len = colon ? (size_t)(colon - s) : n;
        const char *value = colon ? colon + 1 : s + n;
        size_t value_len = (size_t)(s + n - value);
        if (value_len && value[0] == ' ') value++, value_len--;
        if (name_len == 4 && !memcmp(s, "data", 4)) {
            if (p->has_data) lm_buf_putc(&p->data, '\n');
            lm_buf_append(&p->data, value, value_len);
            p->has_data = true;
        } /* event, id, retry and unknown fields are ignored */
    }
    lm_buf_reset(&p->line);
    return rc;
}

int lm_sse_feed(struct lm_sse_parser *p, const char *bytes, size_t n, lm_sse_event_fn fn,
                void *ctx) {
    size_t i = 0;
    while (i < n) {
        char c = bytes[i];
        if (p->last_cr) {
            p->last_cr = false;
            if (c == '\n') { /* the second half of a "\r\n" */
                i++;
                continue;
            }
        }
        if (c == '\r' || c == '\n') {
            p->last_cr = c == '\r';
            i++;
            int rc = process_line(p, fn, ctx);
            if (rc) return rc;
            continue;
        }
        /* Copy the run of ordinary bytes up to the next line end in one go. */
        size_t j = i;
        while (j < n && bytes[j] != '\r' && bytes[j] != '\n')
            j++;
        lm_buf_append(&p->line, bytes + i, j - i);
        i = j;
    }
    return 0;
}

int lm_sse_finish(struct lm_sse_parser *p, lm_sse_event_fn fn, void *ctx) {
    int rc = 0;
    if (p->line.len) rc = process_line(p, fn, ctx);
    if (!rc) rc = dispatch(p, fn, ctx);
    return rc;
}
