/* report.h: the profiler's summary (AIPerf's metrics and names) and its per-request JSONL.
 *
 * Figures come from the profiling phase's successful requests only; warmup requests, failed
 * requests and skipped turns are excluded (failed and skipped ones are counted). Throughputs are
 * over the profiling window, from the first measured request's send to the last measured
 * response's end, think time included: request throughput = successful requests / window,
 * output token throughput = their output tokens / window. Per-turn rows report latency metrics
 * only: each turn's requests are spread over the whole window, overlapping the other turns', so
 * a per-turn throughput would have no meaningful denominator. */
#ifndef LM_BENCH_REPORT_H
#define LM_BENCH_REPORT_H

#include <stdbool.h>
#include <stdio.h>

#include "base/status.h"
#include "bench/replay.h"
#include "bench/stats.h"

#define LM_BENCH_MAX_TURN_ROWS 8 /* per-turn rows; later turns are folded into the last row */

struct lm_bench_turn_summary {
    int turn;                     /* 1-based; the last row holds turns >= turn when folded */
    size_t n_ok;                  /* successful requests of this turn */
    struct lm_bench_stats ttft_ms, itl_ms, latency_ms;
};

struct lm_bench_summary {
    struct lm_bench_stats ttft_ms;        /* time to first token */
    struct lm_bench_stats itl_ms;         /* AIPerf ITL: (latency - TTFT) / (OSL - 1) */
    struct lm_bench_stats chunk_gap_ms;   /* gaps between content chunks (per token with
                                             --tokenizer): AIPerf's inter-chunk latency */
    struct lm_bench_stats latency_ms;     /* request latency */
    struct lm_bench_stats output_tokens;  /* output sequence length */
    struct lm_bench_stats input_tokens;   /* input sequence length */
    size_t n_requests;                    /* profiling requests sent */
    size_t n_ok, n_failed, n_skipped;     /* n_skipped: turns never sent after a failure */
    size_t n_no_usage;                    /* successful requests without usage in the stream */
    size_t errors[LM_BENCH_ERR_COUNT];    /* failed requests by type */
    double window_s;                      /* profiling window */
    double request_throughput;            /* successful requests / s */
    double output_token_throughput;       /* output tokens / s */
    int n_turn_rows;
    struct lm_bench_turn_summary turns[LM_BENCH_MAX_TURN_ROWS];
    bool tokens_counted;                  /* chunk gaps were divided by counted tokens */
};

/* Computes the summary of a finished run. */
void lm_bench_summarize(const struct lm_bench_run *run, struct lm_bench_summary *s);

/* Prints the summary tables (see lumen profile --help for the layout). */
void lm_bench_report_print(FILE *f, const struct lm_bench_run *run, const struct lm_bench_summary *s);

/* Writes one JSON object per sent request (warmup and profiling) to `path`:
 * phase, conversation_id, conversation_index, dataset_id, turn, request_id, start_time (Unix s),
 * ttft_ms, request_latency_ms, inter_token_latency_ms (AIPerf's per-request ITL), itl_ms (the
 * per-chunk gaps, divided by chunk tokens when counted), chunk_times_ms, chunk_tokens (when
 * counted), output_tokens, input_tokens, http_status, error_type, error_message, finish_reason,
 * messages (exactly as sent), response_text, reasoning_text. Unknown numbers are null.
 * LM_ERR_IO naming the path on failure. */
lm_status lm_bench_write_jsonl(const char *path, const struct lm_bench_run *run);

#endif
