/* record.h: what the profiler keeps about one request, and how a streamed response fills it.
 *
 * A record is filled in two steps. The replay sets who sent what (phase, ids, turn, messages);
 * the client times the request and feeds the response to a struct lm_bench_stream, which
 * interprets OpenAI chat.completion.chunk events (https://platform.openai.com/docs/api-reference/
 * chat-streaming): choices[0].delta.content and delta.reasoning_content (vLLM, llama.cpp; newer
 * vLLM sends delta.reasoning), choices[0].finish_reason, the final chunk's usage
 * (stream_options.include_usage), an {"error": {...}} event, and "data: [DONE]".
 *
 * Metric definitions follow NVIDIA AIPerf (docs/aiperf metrics reference):
 *   TTFT            send -> first chunk whose content or reasoning_content is non-empty
 *                   (a role-only first chunk does not count)
 *   request latency send -> the last event of the stream
 *   ITL             (request latency - TTFT) / (output tokens - 1), per request (AIPerf's
 *                   inter_token_latency); needs output tokens >= 2
 *   chunk gaps      times between successive content-bearing chunks (AIPerf's inter-chunk
 *                   latency); a gap is divided by its chunk's token count when the tokens were
 *                   counted (lumen profile --tokenizer), giving a per-token ITL distribution
 *   output tokens   usage.completion_tokens; input tokens: usage.prompt_tokens */
#ifndef LM_BENCH_RECORD_H
#define LM_BENCH_RECORD_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "base/buf.h"
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

/* One content-bearing chunk of a streamed response. */
struct lm_bench_chunk {
    double t_ms;                          /* arrival, ms after the request was sent */
    size_t content_off, content_len;      /* its slice of record.content (bytes) */
    size_t reasoning_off, reasoning_len;  /* its slice of record.reasoning (bytes) */
    int tokens;                           /* tokens in the slice; 0 = not counted */
};

struct lm_bench_record {
    /* set by the replay */
    enum lm_bench_phase phase;
    size_t conversation;     /* index of the conversation within its phase */
    char *conversation_id;   /* X-Conversation-Id; owned */
    char *dataset_id;        /* the corpus's id of the conversation; owned */
    int turn;                /* 1-based */
    char *request_id;        /* X-Request-Id; owned */
    json_t *messages;        /* the messages array exactly as sent; owned reference */
    bool sent;               /* false for a turn skipped because an earlier turn failed */

    /* set by the client */
    double start_unix;       /* when sent, seconds since the Unix epoch */
    double t_send, t_end;    /* CLOCK_MONOTONIC seconds: sent, last byte of the stream */
    double ttft_ms;          /* NAN when no chunk carried text */
    double latency_ms;       /* request latency */
    struct lm_bench_chunk *chunks; /* [n_chunks] content-bearing chunks, in arrival order; owned */
    size_t n_chunks, cap_chunks;
    size_t n_events;         /* SSE events received, [DONE] included */
    long output_tokens;      /* usage.completion_tokens; -1 when the server sent no usage */
    long input_tokens;       /* usage.prompt_tokens; -1 when absent */
    long http_status;        /* 0 when no response came */
    enum lm_bench_error error;
    char *error_message;     /* owned; NULL when ok */
    char *finish_reason;     /* owned; NULL when none came */
    bool done;               /* "data: [DONE]" arrived */
    double t_last_event_ms;  /* arrival of the last event, ms after sending; NAN before any */
    struct lm_buf content;   /* the response text (delta.content joined) */
    struct lm_buf reasoning; /* delta.reasoning_content joined */
};

/* Releases everything the record owns and zeroes it; accepts a zeroed record. */
void lm_bench_record_free(struct lm_bench_record *r);

/* Records an error (the first one wins) with a printf-style message. */
void lm_bench_record_fail(struct lm_bench_record *r, enum lm_bench_error e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* AIPerf's per-request ITL in ms, or NAN when TTFT is undefined or output_tokens < 2. */
double lm_bench_record_itl_ms(const struct lm_bench_record *r);

/* The gap before chunk i (1 <= i < n_chunks) in ms, divided by chunk i's token count when
 * it was counted (tokens > 0). */
double lm_bench_record_chunk_gap_ms(const struct lm_bench_record *r, size_t i);

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
void lm_bench_stream_free(struct lm_bench_stream *s);

#endif
