/* record.c: see record.h. */
#include "bench/record.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

const char *lm_bench_error_name(enum lm_bench_error e) {
    switch (e) {
    case LM_BENCH_ERR_NONE: return "none";
    case LM_BENCH_ERR_HTTP_4XX: return "http_4xx";
    case LM_BENCH_ERR_HTTP_5XX: return "http_5xx";
    case LM_BENCH_ERR_HTTP_OTHER: return "http_other";
    case LM_BENCH_ERR_TIMEOUT: return "timeout";
    case LM_BENCH_ERR_CONNECTION: return "connection";
    case LM_BENCH_ERR_PARSE: return "parse";
    case LM_BENCH_ERR_STREAM: return "stream_error";
    case LM_BENCH_ERR_COUNT: break;
    }
    return "?";
}

void lm_bench_record_free(struct lm_bench_record *r) {
    if (!r) return;
    free(r->conversation_id);
    free(r->dataset_id);
    free(r->request_id);
    json_decref(r->messages);
    free(r->chunks);
    free(r->error_message);
    free(r->finish_reason);
    lm_buf_free(&r->content);
    lm_buf_free(&r->reasoning);
    memset(r, 0, sizeof *r);
}

void lm_bench_record_fail(struct lm_bench_record *r, enum lm_bench_error e, const char *fmt, ...) {
    if (r->error) return;
    r->error = e;
    struct lm_buf b = {0};
    va_list ap;
    va_start(ap, fmt);
    lm_buf_vprintf(&b, fmt, ap);
    va_end(ap);
    r->error_message = lm_buf_take(&b);
}

double lm_bench_record_itl_ms(const struct lm_bench_record *r) {
    if (r->error || !isfinite(r->ttft_ms) || r->output_tokens < 2) return NAN;
    return (r->latency_ms - r->ttft_ms) / (double)(r->output_tokens - 1);
}

double lm_bench_record_chunk_gap_ms(const struct lm_bench_record *r, size_t i) {
    double gap = r->chunks[i].t_ms - r->chunks[i - 1].t_ms;
    return r->chunks[i].tokens > 0 ? gap / r->chunks[i].tokens : gap;
}

static void push_chunk(struct lm_bench_record *r, double t_ms, const char *content, size_t clen,
                       const char *reasoning, size_t rlen) {
    if (r->n_chunks == r->cap_chunks) {
        r->cap_chunks = r->cap_chunks ? r->cap_chunks * 2 : 64;
        r->chunks = realloc(r->chunks, r->cap_chunks * sizeof *r->chunks);
        if (!r->chunks) abort();
    }
    struct lm_bench_chunk *c = &r->chunks[r->n_chunks++];
    c->t_ms = t_ms;
    c->content_off = r->content.len;
    c->content_len = clen;
    c->reasoning_off = r->reasoning.len;
    c->reasoning_len = rlen;
    c->tokens = 0;
    lm_buf_append(&r->content, content, clen);
    lm_buf_append(&r->reasoning, reasoning, rlen);
}

static void take_usage(struct lm_bench_record *r, json_t *usage) {
    if (!json_is_object(usage)) return;
    json_t *ct = json_object_get(usage, "completion_tokens");
    json_t *pt = json_object_get(usage, "prompt_tokens");
    if (json_is_integer(ct)) r->output_tokens = (long)json_integer_value(ct);
    if (json_is_integer(pt)) r->input_tokens = (long)json_integer_value(pt);
}

static void take_finish_reason(struct lm_bench_record *r, json_t *choice) {
    const char *fr = json_string_value(json_object_get(choice, "finish_reason"));
    if (fr) {
        free(r->finish_reason);
        r->finish_reason = strdup(fr);
        if (!r->finish_reason) abort();
    }
}

static const char *string_or_empty(json_t *o, const char *key, size_t *len) {
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v)) {
        *len = 0;
        return "";
    }
    *len = json_string_length(v);
    return json_string_value(v);
}

/* The text of an {"error": ...} object: error.message, or the whole value. */
static void fail_with_error_object(struct lm_bench_record *r, json_t *err) {
    const char *msg = json_string_value(json_object_get(err, "message"));
    if (!msg) msg = json_string_value(err);
    if (msg) {
        lm_bench_record_fail(r, LM_BENCH_ERR_STREAM, "%s", msg);
    } else {
        char *s = json_dumps(err, JSON_COMPACT);
        lm_bench_record_fail(r, LM_BENCH_ERR_STREAM, "%s", s ? s : "error");
        free(s);
    }
}

void lm_bench_record_event(struct lm_bench_record *r, const char *data, size_t len, double t_ms) {
    r->n_events++;
    r->t_last_event_ms = t_ms;
    if (r->error) return;
    while (len && (data[len - 1] == ' ' || data[len - 1] == '\n' || data[len - 1] == '\r')) len--;
    if (len == 6 && !memcmp(data, "[DONE]", 6)) {
        r->done = true;
        return;
    }
    if (r->done) return; /* nothing follows [DONE] */
    json_error_t e;
    json_t *o = json_loadb(data, len, JSON_ALLOW_NUL, &e);
    if (!o) {
        lm_bench_record_fail(r, LM_BENCH_ERR_PARSE, "event %zu: invalid JSON at column %d: %s",
                             r->n_events, e.column, e.text);
        return;
    }
    if (!json_is_object(o)) {
        lm_bench_record_fail(r, LM_BENCH_ERR_PARSE, "event %zu: expected a JSON object",
                             r->n_events);
        json_decref(o);
        return;
    }
    json_t *err = json_object_get(o, "error");
    if (err && !json_is_null(err)) {
        fail_with_error_object(r, err);
        json_decref(o);
        return;
    }
    json_t *choices = json_object_get(o, "choices");
    json_t *choice = json_is_array(choices) ? json_array_get(choices, 0) : NULL;
    if (json_is_object(choice)) {
        json_t *delta = json_object_get(choice, "delta");
        size_t clen = 0, rlen = 0;
        const char *content = string_or_empty(delta, "content", &clen);
        const char *reasoning = string_or_empty(delta, "reasoning_content", &rlen);
        if (!rlen) reasoning = string_or_empty(delta, "reasoning", &rlen);
        if (clen || rlen) push_chunk(r, t_ms, content, clen, reasoning, rlen);
        take_finish_reason(r, choice);
    }
    take_usage(r, json_object_get(o, "usage"));
    json_decref(o);
}

void lm_bench_record_full_response(struct lm_bench_record *r, const char *body, size_t len,
                                   double t_ms) {
    r->n_events++;
    r->t_last_event_ms = t_ms;
    json_error_t e;
    json_t *o = json_loadb(body, len, 0, &e);
    if (!json_is_object(o)) {
        lm_bench_record_fail(r, LM_BENCH_ERR_PARSE, "response body: invalid JSON at column %d: %s",
                             e.column, o ? "expected an object" : e.text);
        json_decref(o);
        return;
    }
    json_t *err = json_object_get(o, "error");
    if (err && !json_is_null(err)) {
        fail_with_error_object(r, err);
        json_decref(o);
        return;
    }
    json_t *choice = json_array_get(json_object_get(o, "choices"), 0);
    json_t *msg = json_object_get(choice, "message");
    size_t clen = 0, rlen = 0;
    const char *content = string_or_empty(msg, "content", &clen);
    const char *reasoning = string_or_empty(msg, "reasoning_content", &rlen);
    if (clen || rlen) push_chunk(r, t_ms, content, clen, reasoning, rlen);
    take_finish_reason(r, choice);
    take_usage(r, json_object_get(o, "usage"));
    r->done = true;
    json_decref(o);
}

static int on_event(void *ctx, const char *data, size_t len) {
    struct lm_bench_stream *s = ctx;
    lm_bench_record_event(s->rec, data, len, s->t_ms);
    return 0;
}

void lm_bench_stream_init(struct lm_bench_stream *s, struct lm_bench_record *rec) {
    lm_sse_init(&s->sse);
    s->rec = rec;
    s->t_ms = 0;
    rec->ttft_ms = NAN;
    rec->latency_ms = NAN;
    rec->t_last_event_ms = NAN;
    rec->output_tokens = -1;
    rec->input_tokens = -1;
}

void lm_bench_stream_feed(struct lm_bench_stream *s, const char *bytes, size_t n, double t_ms) {
    s->t_ms = t_ms;
    lm_sse_feed(&s->sse, bytes, n, on_event, s);
}

void lm_bench_stream_finish(struct lm_bench_stream *s, double t_ms) {
    struct lm_bench_record *r = s->rec;
    s->t_ms = t_ms;
    lm_sse_finish(&s->sse, on_event, s);
    if (!r->error && !r->done && !r->finish_reason)
        lm_bench_record_fail(r, LM_BENCH_ERR_PARSE,
                             "the stream ended after %zu events with neither a finish_reason nor "
                             "data: [DONE]",
                             r->n_events);
    r->ttft_ms = r->n_chunks ? r->chunks[0].t_ms : NAN;
    r->latency_ms = isfinite(r->t_last_event_ms) ? r->t_last_event_ms : t_ms;
}

void lm_bench_stream_free(struct lm_bench_stream *s) { lm_sse_free(&s->sse); }
