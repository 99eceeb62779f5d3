/* buf.h: growable byte buffers and int32 id vectors.
 *
 * struct lm_buf holds bytes (always NUL-terminated after any append, so `p` can be used as a C
 * string when the content has no NUL). struct lm_ids holds token ids. Both are embedded by the
 * caller: zero-initialise (or lm_*_init), append, then lm_*_free. The storage is owned by the
 * struct; pointers into it are invalidated by the next append. Allocation failure aborts: these
 * buffers hold request-sized data, and the process cannot continue without memory for them. */
#ifndef LM_BASE_BUF_H
#define LM_BASE_BUF_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

struct lm_buf {
    char *p;    /* bytes, NUL-terminated; NULL while empty and never grown */
    size_t len; /* bytes used, not counting the terminating NUL */
    size_t cap; /* bytes allocated */
};

void lm_buf_free(struct lm_buf *b);           /* releases storage; accepts a zeroed buffer */
void lm_buf_reset(struct lm_buf *b);          /* len = 0, keeps storage */
void lm_buf_reserve(struct lm_buf *b, size_t extra);
void lm_buf_append(struct lm_buf *b, const void *data, size_t n);
void lm_buf_puts(struct lm_buf *b, const char *s);
void lm_buf_putc(struct lm_buf *b, char c);
void lm_buf_printf(struct lm_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void lm_buf_vprintf(struct lm_buf *b, const char *fmt, va_list ap);
/* Hands the storage to the caller (caller frees with free()) and zeroes the buffer. Never NULL. */
char *lm_buf_take(struct lm_buf *b);

struct lm_ids {
    int32_t *v; /* token ids */
    size_t n;   /* ids used */
    size_t cap; /* ids allocated */
};

void lm_ids_free(struct lm_ids *ids);
void lm_ids_push(struct lm_ids *ids, int32_t id);
void lm_ids_append(struct lm_ids *ids, const int32_t *v, size_t n);

#endif
