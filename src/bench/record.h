/* record.h: what the profiler keeps about one request, and how a streamed response fills it.
 *
 * A record is filled in two steps. The replay sets who sent what (phase, ids, turn, messages);
 * the client times the request and feeds the response to a struct lm_bench_stream, which
 * interprets OpenAI chat.completion.chunk events (https://platform.openai.com/docs/api-reference/
 * chat-streaming): choices[0].delta.content and delta.reasoning_content (vLLM, llama.cpp; newer
 * vLLM sends delta.reasoning), choices[0].finish_reason, the final chunk's usage
 * (stream_options.include_usage), an {"error": {...}} event, and "data: [DONE]".
 *
 * Metric definitions follow NVIDIA AIPerf (docs/aiperf metrics reference), with its names:
 *   time_to_first_token (TTFT)  send -> first chunk whose content or reasoning_content is
 *                   non-empty (a role-only first chunk does not count)
 *   time_to_first_output_token (TTFO)  send -> first chunk with non-empty content, i.e. the
 *                   first answer token after the reasoning (equals TTFT without reasoning)
 *   request_latency send -> the last event of the stream
 *   inter_token_latency (ITL): AIPerf's, one value a request: (request latency - TTFT) /
 *                   (output tokens - 1); needs output tokens >= 2 (lm_bench_record_itl_ms)
 *   inter_token_latency_per_token: each chunk after the first contributes k samples of
 *                   gap / k, where gap is the time since the previous chunk that carried tokens
 *                   and k its token count by lumen's tokenizer (lm_bench_record_count_tokens;
 *                   1 per chunk when not counted). When lumen's count of the whole response
 *                   disagrees with the server's usage (beyond one stop token), usage's total is
 *                   spread over the chunks in proportion to lumen's counts (largest remainder):
 *                   text that does not re-encode to the generated ids must not inflate k. The
 *                   first chunk's extra tokens arrived with the first token and are part of
 *                   TTFT, not ITL.
 *   inter_chunk_latency  gaps between successive content-bearing chunks, undivided
 *   output tokens   usage.completion_tokens (the server's count); input tokens:
 *                   usage.prompt_tokens. lumen's own counts are kept beside them. */
#ifndef LM_BENCH_RECORD_H
#define LM_BENCH_RECORD_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "base/buf.h"
#include "base/status.h"
#include "bench/sse.h"

enum lm_bench_phase {
    LM_BENCH_PHASE_WARMUP,
    LM_BENCH_PHASE_PROFILING,
};

/* Why a request failed. Names (lm_bench_error_name) are what the report and the JSONL show. */
enum lm_bench_error {
    LM_BENCH_ERR_NONE = 0,
    LM_BENCH_ERR_HTTP_4XX,   /* "http_4xx": the server answered 400..499 */
    LM_BENCH_ERR_HTTP_5XX,   /* "http_5xx": 500..599 */
    LM_BENCH_ERR_HTTP_OTHER, /* "http_other": any other status than 200 */
    LM_BENCH_ERR_TIMEOUT,    /* "timeout": --timeout-s passed before the stream ended */
    LM_BENCH_ERR_CONNECTION, /* "connection": refused, reset, closed early, DNS, ... */
    LM_BENCH_ERR_PARSE,      /* "parse": an event was not JSON, or the stream was cut short */
    LM_BENCH_ERR_STREAM,     /* "stream_error": the server sent {"error": ...} inside the stream */
    LM_BENCH_ERR_COUNT,
};

const char *lm_bench_error_name(enum lm_bench_error e);

/* Why a planned request was not sent. */
enum lm_bench_skip {
    LM_BENCH_SKIP_NONE = 0,
    LM_BENCH_SKIP_AFTER_FAILURE, /* "after_failure": an earlier turn of its conversation failed */
    LM_BENCH_SKIP_LIMIT,         /* "limit": --request-count or --benchmark-duration was reached,
                                  * or the run was stopped (a turn whose predecessor the stop
                                  * cancelled in flight, lm_bench_record.cancelled) */
};

const char *lm_bench_skip_name(enum lm_bench_skip s);

/* One content-bearing chunk of a streamed response. */
struct lm_bench_chunk {
    double t_ms;                         /* arrival, ms after the request was sent */
    size_t content_off, content_len;     /* its slice of record.content (bytes) */
    size_t reasoning_off, reasoning_len; /* its slice of record.reasoning (bytes) */
    int tokens;                          /* tokens in the slice by lumen's tokenizer (0 when
                                            not counted, or when the slice holds no token end) */
};

struct lm_bench_record {
    /* set by the replay */
    enum lm_bench_phase phase;
    size_t conversation;   /* index of the conversation within its phase */
    char *conversation_id; /* X-Conversation-Id; owned */
    char *dataset_id;      /* the corpus's id of the conversation; owned */
    char *category;        /* the corpus's category; owned; NULL when none */
    int turn;              /* 1-based (X-Lumen-Turn sends turn - 1) */
    int n_turns;           /* turns planned for its conversation */
    char *request_id;      /* X-Request-Id; owned */
    json_t *messages;      /* the messages array exactly as sent; owned reference */
    int max_tokens;        /* max_tokens as sent */
    bool sent;             /* false: skipped (see skip) */
    enum lm_bench_skip skip;
    double t_scheduled;      /* CLOCK_MONOTONIC s when the load mode released it (rate mode: its
                                arrival time; concurrency mode: when its slot or think time
                                ended); 0 when not sent */
    double think_planned_ms; /* think time drawn before this turn; 0 for turn 1 */
    double think_ms;         /* measured: previous turn's last byte -> this send; NAN for turn 1 */

    /* set by the client */
    double start_unix;             /* when sent, seconds since the Unix epoch */
    double t_send, t_end;          /* CLOCK_MONOTONIC seconds: sent, last byte of the stream */
    double ttft_ms;                /* NAN when no chunk carried text */
    double ttfo_ms;                /* first chunk with non-empty content; NAN when none */
    double latency_ms;             /* request latency */
    struct lm_bench_chunk *chunks; /* [n_chunks] content-bearing chunks, in arrival order; owned */
    size_t n_chunks, cap_chunks;
    size_t n_events;       /* SSE events received, [DONE] included */
    long output_tokens;    /* usage.completion_tokens; -1 when the server sent no usage */
    long input_tokens;     /* usage.prompt_tokens; -1 when absent */
    long cached_tokens;    /* usage.prompt_tokens_details.cached_tokens; -1 when absent */
    long reasoning_tokens; /* usage.completion_tokens_details.reasoning_tokens; -1 absent */
    long draft_tokens;     /* speculative drafts: llama.cpp timings.draft_n, or usage.
                              completion_tokens_details.accepted + rejected_prediction_tokens;
                              -1 when the server reported none */
    long accepted_tokens;  /* timings.draft_n_accepted / accepted_prediction_tokens; -1 */
    long http_status;      /* 0 when no response came */
    enum lm_bench_error error;
    char *error_message;     /* owned; NULL when ok */
    bool cancelled;          /* failed by the client in flight when the run was stopped
                                (lm_bench_client_watch_stop; its message starts with
                                LM_BENCH_CLIENT_CANCELLED) */
    char *finish_reason;     /* owned; NULL when none came; in lumen's words
                                (lm_bench_finish_word): "abort" arrives as "cancelled" */
    char *server_id;         /* the chunks' "id" (the server's completion id); owned; NULL */
    char *echoed_request_id; /* the response's X-Request-Id header; owned; NULL when absent */
    bool done;               /* "data: [DONE]" arrived */
    double t_last_event_ms;  /* arrival of the last event, ms after sending; NAN before any */
    struct lm_buf content;   /* the response text (delta.content joined) */
    struct lm_buf reasoning; /* delta.reasoning_content joined */

    /* lumen's own counts (lm_bench_record_count_tokens, lm_bench_record_render_prompt) */
    bool tokens_counted;        /* chunks[].tokens are set */
    long own_output_tokens;     /* tokens of reasoning + content by lumen's tokenizer; -1 */
    long own_input_tokens;      /* tokens of the rendered prompt; -1 when not rendered */
    char prompt_ids_sha256[65]; /* of the rendered prompt ids; "" when not rendered */

    /* verification (verify.h) */
    json_t *server_record; /* the joined server record; owned reference; NULL when none */
    json_t *issues;        /* array of {"check", "detail"}; owned; NULL when none */
};

/* Releases everything the record owns and zeroes it; accepts a zeroed record. */
void lm_bench_record_free(struct lm_bench_record *r);

/* Records an error (the first one wins) with a printf-style message. */
void lm_bench_record_fail(struct lm_bench_record *r, enum lm_bench_error e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* AIPerf's per-request ITL in ms, or NAN when TTFT is undefined or output_tokens < 2 (the
 * output tokens are the server's usage, else lumen's own count). */
double lm_bench_record_itl_ms(const struct lm_bench_record *r);

/* The gap before chunk i (1 <= i < n_chunks) in ms, divided by chunk i's token count when
 * it was counted (tokens > 0). */
double lm_bench_record_chunk_gap_ms(const struct lm_bench_record *r, size_t i);

/* Appends the record's per-token ITL samples (ms; see the definition above) to `out`
 * (struct lm_bench_samples *, stats.h). Nothing for a failed request. */
struct lm_bench_samples;
void lm_bench_record_itl_samples(const struct lm_bench_record *r, struct lm_bench_samples *out);

/* Time to second token (AIPerf time_to_second_token): TTFT when the first chunk carried two or
 * more counted tokens, else the next token-bearing chunk's time; NAN when there is none. */
double lm_bench_record_ttst_ms(const struct lm_bench_record *r);

/* Counts the response's tokens with lumen's tokenizer: own_output_tokens = tokens of the whole
 * reasoning text plus the whole content text; each chunk gets the tokens whose last byte falls
 * in its slice (found by streaming the ids back through the detokenizer); when the decoded text
 * does not reproduce the response byte for byte, each chunk's slice is counted on its own. */
struct lm_bench_prompt;
void lm_bench_record_count_tokens(struct lm_bench_record *r, const struct lm_bench_prompt *p);

/* Renders the record's messages with the chat template (lm_bench_prompt_render_ids) and sets
 * own_input_tokens and prompt_ids_sha256. Returns the render's status (nothing set on error). */
lm_status lm_bench_record_render_prompt(struct lm_bench_record *r, const struct lm_bench_prompt *p,
                                        int enable_thinking);

/* Adds a verification issue {"check": check, "detail": printf(...)} to the record. */
void lm_bench_record_issue(struct lm_bench_record *r, const char *check, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Interprets one SSE event's data (a chat.completion.chunk, an error object, or "[DONE]")
 * arriving t_ms after the request was sent. Malformed JSON records LM_BENCH_ERR_PARSE. Events
 * after an error are ignored. */
void lm_bench_record_event(struct lm_bench_record *r, const char *data, size_t len, double t_ms);

/* Interprets a whole non-streamed chat.completion body (a server that ignored "stream") as one
 * chunk arriving at t_ms. */
void lm_bench_record_full_response(struct lm_bench_record *r, const char *body, size_t len,
                                   double t_ms);

/* A response stream: SSE parsing plus interpretation into a record (borrowed). */
struct lm_bench_stream {
    struct lm_sse_parser sse;
    struct lm_bench_record *rec;
    double t_ms; /* arrival time of the bytes being fed */
};

void lm_bench_stream_init(struct lm_bench_stream *s, struct lm_bench_record *rec);
/* Feeds bytes that arrived t_ms after the request was sent. */
void lm_bench_stream_feed(struct lm_bench_stream *s, const char *bytes, size_t n, double t_ms);
/* End of the body at t_ms: delivers a pending event, computes TTFT and request latency, and
 * records LM_BENCH_ERR_PARSE when the stream ended with neither a finish_reason nor [DONE]. */
void lm_bench_stream_finish(struct lm_bench_stream *s, double t_ms);

/* How a request ended, in the words of lumen's records (the server's --records, the profiler's
 * requests.jsonl, the server's log): "stop", "length", or "cancelled" for a request the server
 * cut before its end (a client gone, a shutdown). A stream the server cuts ends on the wire with
 * finish_reason "abort" (vLLM's value, which lumen serve sends too): that, and "abort" in server
 * records written by older versions, is read as "cancelled". Any other value is returned as it
 * is (`fr` itself; NULL for NULL). */
const char *lm_bench_finish_word(const char *fr);
void lm_bench_stream_free(struct lm_bench_stream *s);

#endif
