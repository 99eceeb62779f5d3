/* sse.h: an incremental parser for Server-Sent Events (text/event-stream).
 *
 * Follows the WHATWG HTML "server-sent events" parsing rules: lines end in "\n", "\r\n" or "\r"
 * (a "\r\n" split across two feeds counts once); a line starting with ':' is a comment; a field
 * line is "name: value" (one optional space after the colon is dropped); several "data" lines
 * of one event are joined with "\n"; an empty line dispatches the event. Only the "data" field is
 * delivered (the profiler needs nothing else). Bytes may arrive split at any position, as they do
 * from a socket. Unlike the spec, lm_sse_finish also delivers an event whose closing empty line
 * never came (a server that closes right after its last "data:" line), so no data is lost. */
#ifndef LM_BENCH_SSE_H
#define LM_BENCH_SSE_H

#include <stdbool.h>
#include <stddef.h>

#include "base/buf.h"

/* Called once per event with its data (NUL-terminated, `len` bytes, borrowed for the call).
 * Returns 0 to continue, nonzero to stop parsing (lm_sse_feed then returns that value). */
typedef int (*lm_sse_event_fn)(void *ctx, const char *data, size_t len);

struct lm_sse_parser {
    struct lm_buf line; /* the current line, not yet terminated */
    struct lm_buf data; /* the current event's data */
    bool has_data;      /* a data field was seen since the last dispatch */
    bool last_cr;       /* the previous byte was "\r" (a following "\n" is part of it) */
};

/* Zero-initialising is equivalent. */
void lm_sse_init(struct lm_sse_parser *p);
void lm_sse_free(struct lm_sse_parser *p);

/* Parses n bytes; calls fn for each event completed by them. Returns 0, or the first nonzero
 * value fn returned (parsing stops there; the parser must not be fed again). */
int lm_sse_feed(struct lm_sse_parser *p, const char *bytes, size_t n, lm_sse_event_fn fn,
                void *ctx);

/* End of stream: completes a pending line and delivers a pending event. Returns as lm_sse_feed. */
int lm_sse_finish(struct lm_sse_parser *p, lm_sse_event_fn fn, void *ctx);

#endif
