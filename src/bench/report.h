/* report.h: the profiler's summary (AIPerf's metrics and names), its text table, and its
 * exports: per-request JSONL, summary JSON and CSV.
 *
 * Figures come from the profiling phase's successful requests only; warmup requests, failed
 * requests and skipped turns are excluded (failed and skipped ones are counted). Throughputs are
 * over the profiling window, from the first measured request's send to the last measured
 * response's end, think time included: request_throughput = successful requests / window,
 * output_token_throughput = their output tokens / window, goodput = successful requests that
 * meet every SLO given / window.
 *
 * Per turn: latency metrics over that turn's requests. Per-turn output token throughput is
 * defined over the time that turn holds alone: the union of the instants when at least one
 * request of turn k and no request of any other turn is in flight (send .. last byte). Its
 * value is the turn-k tokens whose chunks arrived inside that time, divided by that time; the
 * share of turn k's tokens that arrived there is given with it (its coverage). When turn k never
 * holds the server alone the throughput is n/a. At concurrency 1 every request is alone, so the
 * figure is tokens / the turn's summed latencies.
 *
 * Server-side time (queue, prefill, decode, total, from the joined server records, verify.h)
 * is summarized in its own rows and never mixed with the client's figures. */
#ifndef LM_BENCH_REPORT_H
#define LM_BENCH_REPORT_H

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>

#include "base/status.h"
#include "bench/replay.h"
#include "bench/stats.h"

/* Metrics with a distribution. Tags are AIPerf's (profile_export_aiperf.json) where AIPerf has
 * the metric. */
enum lm_bench_metric {
    LM_BENCH_M_TTFT,        /* time_to_first_token, ms */
    LM_BENCH_M_TTST,        /* time_to_second_token, ms */
    LM_BENCH_M_TTFO,        /* time_to_first_output_token, ms (first answer token after the
                               reasoning) */
    LM_BENCH_M_ITL_TOKEN,   /* inter_token_latency_per_token, ms: a sample a token (record.h) */
    LM_BENCH_M_ITL,         /* inter_token_latency, ms: AIPerf's, a value a request,
                               (latency - TTFT) / (output tokens - 1) */
    LM_BENCH_M_ICL,         /* inter_chunk_latency, ms */
    LM_BENCH_M_LATENCY,     /* request_latency, ms */
    LM_BENCH_M_OTPU,        /* output_token_throughput_per_user, tokens/s: 1000 / ITL per
                               request */
    LM_BENCH_M_OSL,         /* output_sequence_length, tokens (usage) */
    LM_BENCH_M_ISL,         /* input_sequence_length, tokens (usage) */
    LM_BENCH_M_THINK,       /* think_time_measured, ms: previous turn's end -> this send */
    LM_BENCH_M_S_QUEUE,     /* server_queue_time, ms (server records) */
    LM_BENCH_M_S_PREFILL,   /* server_prefill_time, ms */
    LM_BENCH_M_S_DECODE,    /* server_decode_time, ms */
    LM_BENCH_M_S_TOTAL,     /* server_total_time, ms */
    LM_BENCH_M_S_ACCEPT,    /* server_draft_acceptance, %: of a request's draft tokens, those
                               accepted (records' spec_accepted_tokens / spec_draft_tokens; only
                               requests that ran drafts, under speculative decoding) */
    LM_BENCH_M_COUNT,
};

struct lm_bench_metric_info {
    const char *tag;   /* "time_to_first_token" */
    const char *label; /* "Time to First Token" */
    const char *unit;  /* "ms", "tokens", "tokens/s" */
};
const struct lm_bench_metric_info *lm_bench_metric_info(enum lm_bench_metric m);

/* Service level objectives for goodput (AIPerf --goodput); <= 0: not set. A request missing a
 * constrained metric (no TTFT, fewer than 2 output tokens for ITL) does not meet it. */
struct lm_bench_slo {
    double ttft_ms, itl_ms, latency_ms;
};

#define LM_BENCH_MAX_TURN_ROWS 8 /* per-turn rows; later turns are folded into the last row */

struct lm_bench_turn_summary {
    int turn;    /* 1-based; the last row holds turns >= turn when folded */
    size_t n_ok; /* successful requests of this turn */
    struct lm_bench_stats ttft_ms, ttfo_ms, itl_ms, latency_ms, isl, osl; /* itl_ms: AIPerf's, a value
                                                                              a request */
    double alone_s;                 /* time this turn held the server alone (see above) */
    double alone_tokens;            /* its tokens that arrived in that time */
    double tokens;                  /* all its tokens (usage, else lumen's count, else chunks) */
    double output_token_throughput; /* alone_tokens / alone_s; NAN when alone_s == 0 */
};

struct lm_bench_summary {
    struct lm_bench_stats m[LM_BENCH_M_COUNT];
    size_t n_requests; /* profiling requests sent */
    size_t n_ok, n_failed;
    size_t n_skipped_failure, n_skipped_limit; /* turns never sent, and why */
    size_t n_no_usage;                         /* successful requests without usage in the stream */
    size_t errors[LM_BENCH_ERR_COUNT];         /* failed requests by type */
    size_t n_warmup, n_warmup_ok;              /* warmup requests sent / successful */
    double window_s;                           /* profiling window */
    double request_throughput;                 /* successful requests / s */
    double output_token_throughput;            /* output tokens / s */
    double total_output_tokens;
    struct lm_bench_slo slo;
    bool slo_set;
    size_t n_good;  /* successful requests meeting every SLO */
    double goodput; /* n_good / window (requests/s); NAN without SLOs */
    /* the server's usage against lumen's own counts */
    size_t out_compared, out_match, out_eos, out_mismatch; /* completion tokens: equal, one more
                                                (the stop token, finish_reason "stop"), other */
    size_t in_compared, in_match, in_mismatch; /* prompt tokens vs the rendered prompt */
    size_t out_mismatch_fffd;                  /* mismatches whose text holds U+FFFD (invalid UTF-8
                                                  replaced: such text cannot re-encode to the ids) */
    char out_mismatch_example[160], in_mismatch_example[160]; /* first of each, for the report */
    long prompt_tokens_total, cached_tokens_total; /* where usage reported cached_tokens */
    size_t n_cached_reported;
    /* speculative decoding: only what the server reported (usage, timings) */
    size_t n_spec_reported;
    long draft_tokens_total, accepted_tokens_total;
    bool tokens_counted; /* ITL divides chunks by lumen's token counts */
    bool server_side;    /* server records were joined */
    int n_turn_rows;
    struct lm_bench_turn_summary turns[LM_BENCH_MAX_TURN_ROWS];
};

/* Computes the summary of a finished run (after lm_bench_verify when server records are used).
 * slo may be NULL. */
void lm_bench_summarize(const struct lm_bench_run *run, const struct lm_bench_slo *slo,
                        struct lm_bench_summary *s);

/* Prints the summary tables. */
void lm_bench_report_print(FILE *f, const struct lm_bench_run *run,
                           const struct lm_bench_summary *s);

/* The summary as JSON: {"run_id", "model", "url", "settings", "window_s", "metrics": {tag:
 * {"unit", "avg", "min", "max", "std", "p50", "p90", "p95", "p99", "count"}}, "request_throughput",
 * ..., "per_turn": [...], "errors": {...}, "usage_check": {...}, "speculative": {...}}.
 * New reference. */
json_t *lm_bench_summary_json(const struct lm_bench_run *run, const struct lm_bench_summary *s);

/* Writes the summary as CSV: the metric table (metric,unit,avg,min,max,std,p50,p90,p95,p99,count),
 * a blank line, scalar rows (metric,value), a blank line, the per-turn table. LM_ERR_IO. */
lm_status lm_bench_write_summary_csv(const char *path, const struct lm_bench_run *run,
                                     const struct lm_bench_summary *s);

/* Writes one JSON object per request, sent or skipped (warmup and profiling): phase,
 * conversation_id, conversation_index, dataset_id, category, turn (1-based), turns, request_id,
 * sent, skip_reason, start_time (Unix s), scheduled_offset_ms, think_time_ms (measured),
 * think_time_planned_ms, ttft_ms, ttst_ms, ttfo_ms, request_latency_ms, inter_token_latency_ms
 * (AIPerf per request), itl_ms (per token samples), chunk_times_ms, chunk_tokens (when counted),
 * output_tokens, input_tokens, cached_tokens, reasoning_tokens, own_output_tokens,
 * own_input_tokens, prompt_ids_sha256, max_tokens, http_status, error_type, error_message,
 * finish_reason, server_id, echoed_request_id, messages (exactly as sent), response_text,
 * reasoning_text, server_record (joined), verification_issues. Unknown numbers are null.
 * LM_ERR_IO naming the path on failure. */
lm_status lm_bench_write_jsonl(const char *path, const struct lm_bench_run *run);

#endif
