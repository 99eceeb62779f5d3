/* metrics.h: the server's Prometheus metrics, GET /metrics in the text exposition format 0.0.4.
 *
 * Counters and histograms are updated as each request retires; gauges (running and waiting
 * sequences, KV blocks) are read from the engine when /metrics is scraped. Names follow
 * Prometheus conventions (lumen_ prefix, base units, _total counters) and the quantities
 * vLLM exports (vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds,
 * vllm:e2e_request_latency_seconds, vllm:num_requests_running/waiting, ...):
 *   lumen_requests_total{endpoint,status}      counter: HTTP requests answered, by status
 *   lumen_prompt_tokens_total                  counter: prompt tokens of generation requests
 *   lumen_generation_tokens_total              counter: generated tokens
 *   lumen_cached_prompt_tokens_total           counter: prompt tokens served from the prefix cache
 *   lumen_time_to_first_token_seconds          histogram: arrival to first generated token
 *   lumen_inter_token_latency_seconds          histogram: gap between generated tokens
 *   lumen_request_latency_seconds              histogram: arrival to retirement
 *   lumen_request_queue_seconds                histogram: arrival to scheduling
 *   lumen_num_requests_running / _waiting      gauges
 *   lumen_kv_cache_blocks_used / _cached / _free  gauges: KV blocks held by running sequences,
 *                                              kept only for prefix reuse (evictable), unused
 * Thread-safe. */
#ifndef LM_SERVER_METRICS_H
#define LM_SERVER_METRICS_H

#include <stdbool.h>

#include "base/buf.h"

struct lm_metrics;

/* NULL only when out of memory. Caller-owned (lm_metrics_destroy, which accepts NULL). */
struct lm_metrics *lm_metrics_create(void);
void lm_metrics_destroy(struct lm_metrics *m);

/* One HTTP request answered: `endpoint` is a route ("/v1/chat/completions", "other", ...; a
 * static string), `status` its HTTP status (499: the client went away first). */
void lm_metrics_count_request(struct lm_metrics *m, const char *endpoint, int status);

/* A generation request that retired. Times in seconds; a negative time is not observed. */
struct lm_metrics_request {
    int prompt_tokens, completion_tokens, cached_tokens;
    double queue_s;   /* arrival to scheduling */
    double ttft_s;    /* arrival to the first generated token */
    double decode_s;  /* first to last generated token: the inter-token latency histogram gets
                         completion_tokens - 1 observations of decode_s / (completion_tokens - 1)
                         (each request's mean gap, weighted by its gaps) */
    double latency_s; /* arrival to retirement */
};
void lm_metrics_observe(struct lm_metrics *m, const struct lm_metrics_request *r);

/* The engine's state at scrape time; a negative value leaves that gauge out. */
struct lm_metrics_gauges {
    int running, waiting;
    long kv_blocks_used;   /* held by running sequences */
    long kv_blocks_cached; /* held by no sequence, kept for prefix reuse (evictable) */
    long kv_blocks_free;   /* neither */
    /* Speculative decoding, counters since start (vLLM's spec_decode_num_drafts,
     * spec_decode_num_draft_tokens, spec_decode_num_accepted_tokens; all 0 when it is off). */
    long long spec_drafts;          /* sequence-steps that verified a draft */
    long long spec_draft_tokens;    /* draft tokens run in verification steps */
    long long spec_accepted_tokens; /* of which accepted */
};

/* Appends the exposition text (HELP and TYPE for every family) to `out`. */
void lm_metrics_render(struct lm_metrics *m, const struct lm_metrics_gauges *g, struct lm_buf *out);

#endif
