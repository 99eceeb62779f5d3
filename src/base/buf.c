/* buf.c: see buf.h. */
#include "base/buf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        fprintf(stderr, "lumen: out of memory (%zu bytes)\n", n);
        abort();
    }
    return q;
}

void lm_buf_free(struct lm_buf *b) {
    if (!b) return;
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

void lm_buf_reset(struct lm_buf *b) {
    b->len = 0;
    if (b->p) b->p[0] = 0;
}

void lm_buf_reserve(struct lm_buf *b, size_t extra) {
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap *= 2;
    b->p = xrealloc(b->p, cap);
    b->cap = cap;
}

void lm_buf_append(struct lm_buf *b, const void *data, size_t n) {
    lm_buf_reserve(b, n);
    if (n) memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = 0;
}

void lm_buf_puts(struct lm_buf *b, const char *s) { lm_buf_append(b, s, strlen(s)); }

void lm_buf_putc(struct lm_buf *b, char c) { lm_buf_append(b, &c, 1); }

void lm_buf_vprintf(struct lm_buf *b, const char *fmt, va_list ap) {
    char tmp[256]; /* most pieces fit: one formatting pass */
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap2);
    va_end(ap2);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        lm_buf_append(b, tmp, (size_t)n);
        return;
    }
    lm_buf_reserve(b, (size_t)n);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    b->len += (size_t)n;
}

void lm_buf_printf(struct lm_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    lm_buf_vprintf(b, fmt, ap);
    va_end(ap);
}

char *lm_buf_take(struct lm_buf *b) {
    if (!b->p) lm_buf_reserve(b, 0), b->p[0] = 0;
    char *p = b->p;
    b->p = NULL;
    b->len = b->cap = 0;
    return p;
}

void lm_ids_free(struct lm_ids *ids) {
    if (!ids) return;
    free(ids->v);
    ids->v = NULL;
    ids->n = ids->cap = 0;
}

void lm_ids_push(struct lm_ids *ids, int32_t id) { lm_ids_append(ids, &id, 1); }

void lm_ids_append(struct lm_ids *ids, const int32_t *v, size_t n) {
    if (ids->n + n > ids->cap) {
        size_t cap = ids->cap ? ids->cap : 16;
        while (cap < ids->n + n) cap *= 2;
        ids->v = xrealloc(ids->v, cap * sizeof *ids->v);
        ids->cap = cap;
    }
    if (n) memcpy(ids->v + ids->n, v, n * sizeof *v);
    ids->n += n;
}
