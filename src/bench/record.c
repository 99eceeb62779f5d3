/* record.c: see record.h. */
#include "bench/record.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "bench/digest.h"
#include "bench/prompt.h"
#include "bench/stats.h"
#include "text/tokenizer.h"

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

const char *lm_bench_skip_name(enum lm_bench_skip s) {
    switch (s) {
    case LM_BENCH_SKIP_NONE: return "none";
    case LM_BENCH_SKIP_AFTER_FAILURE: return "after_failure";
    case LM_BENCH_SKIP_LIMIT: return "limit";
    }
    return "?";
}

void lm_bench_record_free(struct lm_bench_record *r) {
    if (!r) return;
    free(r->category);
    free(r->server_id);
    free(r->echoed_request_id);
    json_decref(r->server_record);
    json_decref(r->issues);
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
    long out = r->output_tokens >= 0 ? r->output_tokens
               : r->tokens_counted   ? r->own_output_tokens
                                     : -1;
    if (r->error || !isfinite(r->ttft_ms) || out < 2) return NAN;
    return (r->latency_ms - r->ttft_ms) / (double)(out - 1);
}

/* The tokens credited to each chunk (k[0..n_chunks)): lumen's counts, or 1 per chunk when not
 * counted; when lumen's total disagrees with the server's usage (beyond the stop token), the
 * usage total spread over the chunks in proportion to lumen's counts (largest remainder). */
static void chunk_weights(const struct lm_bench_record *r, int *k) {
    if (!r->tokens_counted) {
        for (size_t i = 0; i < r->n_chunks; i++)
            k[i] = 1;
        return;
    }
    long own = r->own_output_tokens, use = r->output_tokens;
    bool stop = r->finish_reason && !strcmp(r->finish_reason, "stop");
    for (size_t i = 0; i < r->n_chunks; i++)
        k[i] = r->chunks[i].tokens;
    if (use < 0 || own <= 0 || own == use || (stop && own + 1 == use)) return;
    double *frac = malloc(r->n_chunks * sizeof *frac);
    if (!frac) abort();
    long given = 0;
    for (size_t i = 0; i < r->n_chunks; i++) {
        double exact = (double)r->chunks[i].tokens * (double)use / (double)own;
        k[i] = (int)floor(exact);
        frac[i] = exact - k[i];
        given += k[i];
    }
    for (; given < use; given++) { /* the largest remainders get one more */
        size_t best = 0;
        for (size_t i = 1; i < r->n_chunks; i++)
            if (frac[i] > frac[best]) best = i;
        if (frac[best] <= 0) break;
        k[best]++;
        frac[best] = -1;
    }
    free(frac);
}

void lm_bench_record_itl_samples(const struct lm_bench_record *r, struct lm_bench_samples *out) {
    if (r->error || r->n_chunks < 2) return;
    int *k = malloc(r->n_chunks * sizeof *k);
    if (!k) abort();
    chunk_weights(r, k);
    double prev = r->chunks[0].t_ms;
    for (size_t i = 1; i < r->n_chunks; i++) {
        if (k[i] <= 0) continue; /* no token ends here: its time belongs to the next chunk's gap */
        double per = (r->chunks[i].t_ms - prev) / k[i];
        for (int j = 0; j < k[i]; j++)
            lm_bench_samples_push(out, per);
        prev = r->chunks[i].t_ms;
    }
    free(k);
}

double lm_bench_record_ttst_ms(const struct lm_bench_record *r) {
    if (r->error || r->n_chunks == 0) return NAN;
    int *k = malloc(r->n_chunks * sizeof *k);
    if (!k) abort();
    chunk_weights(r, k);
    double t = NAN;
    if (k[0] >= 2) t = r->chunks[0].t_ms;
    for (size_t i = 1; i < r->n_chunks && isnan(t); i++)
        if (k[i] > 0) t = r->chunks[i].t_ms;
    free(k);
    return t;
}

/* Sets chunks[].tokens for one text (content or reasoning): the ids of the whole text, streamed
 * through the detokenizer; a token belongs to the chunk holding its text's last byte. Returns
 * the token count, or -1 when the decoded text differs from the original (the caller then
 * counts chunk by chunk). */
static long count_stream(struct lm_bench_record *r, const struct lm_bench_prompt *p,
                         bool reasoning) {
    const struct lm_buf *text = reasoning ? &r->reasoning : &r->content;
    if (!text->len) return 0;
    struct lm_ids ids = {0};
    lm_tokenizer_encode(p->tok, text->p, text->len, LM_ENCODE_SPECIAL_AS_TEXT, &ids);
    struct lm_detok d;
    lm_detok_init(&d, p->tok, false);
    struct lm_buf out = {0};
    size_t *end = malloc((ids.n ? ids.n : 1) * sizeof *end);
    if (!end) abort();
    for (size_t i = 0; i < ids.n; i++) {
        lm_detok_push(&d, ids.v[i], &out);
        end[i] = out.len;
    }
    lm_detok_flush(&d, &out);
    long n = (long)ids.n;
    if (out.len != text->len || memcmp(out.p, text->p, text->len)) {
        n = -1;
    } else {
        size_t c = 0;
        for (size_t i = 0; i < ids.n; i++) {
            size_t last = end[i] ? end[i] - 1 : 0; /* the token's last byte */
            for (;;) {
                struct lm_bench_chunk *ch = &r->chunks[c];
                size_t off = reasoning ? ch->reasoning_off : ch->content_off;
                size_t len = reasoning ? ch->reasoning_len : ch->content_len;
                if ((len && last < off + len) || c + 1 == r->n_chunks) break;
                c++;
            }
            r->chunks[c].tokens++;
        }
    }
    free(end);
    lm_buf_free(&out);
    lm_ids_free(&ids);
    return n;
}

void lm_bench_record_count_tokens(struct lm_bench_record *r, const struct lm_bench_prompt *p) {
    if (!p || !p->tok) return;
    for (size_t i = 0; i < r->n_chunks; i++)
        r->chunks[i].tokens = 0;
    long a = count_stream(r, p, true), b = a < 0 ? -1 : count_stream(r, p, false);
    if (a < 0 || b < 0) { /* fall back: each slice on its own */
        a = lm_bench_prompt_count(p, r->reasoning.p ? r->reasoning.p : "", r->reasoning.len);
        b = lm_bench_prompt_count(p, r->content.p ? r->content.p : "", r->content.len);
        for (size_t i = 0; i < r->n_chunks; i++) {
            struct lm_bench_chunk *c = &r->chunks[i];
            c->tokens =
                (int)(lm_bench_prompt_count(p, r->reasoning.p + c->reasoning_off,
                                            c->reasoning_len) +
                      lm_bench_prompt_count(p, r->content.p + c->content_off, c->content_len));
        }
    }
    r->own_output_tokens = a + b;
    r->tokens_counted = true;
}

lm_status lm_bench_record_render_prompt(struct lm_bench_record *r, const struct lm_bench_prompt *p,
                                        int enable_thinking) {
    struct lm_ids ids = {0};
    lm_status st = lm_bench_prompt_render_ids(p, r->messages, enable_thinking, &ids);
    if (!st) {
        r->own_input_tokens = (long)ids.n;
        lm_bench_sha256_ids(ids.v, ids.n, r->prompt_ids_sha256);
    }
    lm_ids_free(&ids);
    return st;
}

void lm_bench_record_issue(struct lm_bench_record *r, const char *check, const char *fmt, ...) {
    struct lm_buf b = {0};
    va_list ap;
    va_start(ap, fmt);
    lm_buf_vprintf(&b, fmt, ap);
    va_end(ap);
    if (!r->issues) r->issues = json_array();
    json_array_append_new(r->issues,
                          json_pack("{s:s,s:s}", "check", check, "detail", b.p ? b.p : ""));
    lm_buf_free(&b);
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
    json_t *cached =
        json_object_get(json_object_get(usage, "prompt_tokens_details"), "cached_tokens");
    if (json_is_integer(cached)) r->cached_tokens = (long)json_integer_value(cached);
    json_t *cd = json_object_get(usage, "completion_tokens_details");
    json_t *rt = json_object_get(cd, "reasoning_tokens");
    if (json_is_integer(rt)) r->reasoning_tokens = (long)json_integer_value(rt);
    json_t *acc = json_object_get(cd, "accepted_prediction_tokens");
    json_t *rej = json_object_get(cd, "rejected_prediction_tokens");
    if (json_is_integer(acc) && json_is_integer(rej) &&
        json_integer_value(acc) + json_integer_value(rej) > 0) {
        r->accepted_tokens = (long)json_integer_value(acc);
        r->draft_tokens = (long)(json_integer_value(acc) + json_integer_value(rej));
    }
}

/* llama.cpp's server reports speculative decoding in "timings": draft_n, draft_n_accepted. */
static void take_timings(struct lm_bench_record *r, json_t *timings) {
    json_t *dn = json_object_get(timings, "draft_n");
    json_t *da = json_object_get(timings, "draft_n_accepted");
    if (json_is_integer(dn) && json_is_integer(da) && json_integer_value(dn) > 0) {
        r->draft_tokens = (long)json_integer_value(dn);
        r->accepted_tokens = (long)json_integer_value(da);
    }
}

static void take_id(struct lm_bench_record *r, json_t *o) {
    const char *id = json_string_value(json_object_get(o, "id"));
    if (id && !r->server_id) {
        r->server_id = strdup(id);
        if (!r->server_id) abort();
    }
}

const char *lm_bench_finish_word(const char *fr) {
    return fr && !strcmp(fr, "abort") ? "cancelled" : fr;
}

static void take_finish_reason(struct lm_bench_record *r, json_t *choice) {
    const char *fr =
        lm_bench_finish_word(json_string_value(json_object_get(choice, "finish_reason")));
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
    while (len && (data[len - 1] == ' ' || data[len - 1] == '\n' || data[len - 1] == '\r'))
        len--;
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
    take_id(r, o);
    take_usage(r, json_object_get(o, "usage"));
    take_timings(r, json_object_get(o, "timings"));
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
    take_id(r, o);
    take_usage(r, json_object_get(o, "usage"));
    take_timings(r, json_object_get(o, "timings"));
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
    rec->ttfo_ms = NAN;
    rec->latency_ms = NAN;
    rec->t_last_event_ms = NAN;
    rec->output_tokens = -1;
    rec->input_tokens = -1;
    rec->cached_tokens = -1;
    rec->reasoning_tokens = -1;
    rec->draft_tokens = -1;
    rec->accepted_tokens = -1;
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
    r->ttfo_ms = NAN;
    for (size_t i = 0; i < r->n_chunks; i++)
        if (r->chunks[i].content_len) {
            r->ttfo_ms = r->chunks[i].t_ms;
            break;
        }
    r->latency_ms = isfinite(r->t_last_event_ms) ? r->t_last_event_ms : t_ms;
}

void lm_bench_stream_free(struct lm_bench_stream *s) {
    lm_sse_free(&s->sse);
}
