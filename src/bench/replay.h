/* replay.h: the profiler's load generator: multi-turn conversations replayed against an
 * OpenAI-compatible server, in the manner of NVIDIA AIPerf's multi-turn mode.
 *
 * Each conversation is a client-side state machine. Turn k sends the history
 *   [system?] user q1, assistant a1, ..., user qk
 * where a1..a(k-1) are the answers this server actually streamed back in the earlier turns (the
 * corpus's own answers are never sent). Between a turn's last byte and the next turn's release
 * the conversation waits its think time: fixed, or drawn per turn from normal(mean, std) clamped
 * at 0 (seeded). When a turn fails, the rest of that conversation is skipped (there is no answer
 * to continue from): those records keep sent == false, skip == after_failure.
 *
 * Load modes:
 *   concurrency (request_rate 0): `concurrency` conversations in flight, one thread and one
 *     kept-alive connection each; a finished conversation's thread starts the next one.
 *   request rate (request_rate > 0): requests are released at the arrival times of a constant
 *     (1/rate apart) or Poisson (exponential gaps, seeded) process. At each arrival the next
 *     request is the turn of a started conversation whose think time has passed (the one ready
 *     longest), else turn 1 of a new conversation; when none is ready or `concurrency` requests
 *     are already in flight, the arrival waits and the wait is counted (n_deferred, max lag).
 * Limits: `conversations` (0: as many as the other limits allow, cycling through the dataset),
 * `request_count` (requests sent) and `duration_s` (no request is released after it; requests
 * in flight finish). Turns cut off by a limit keep sent == false, skip == limit. At least one
 * limit must be set.
 *
 * Warmup runs first and fully drains before the profiling phase starts: turn-1 requests of
 * conversations taken from the end of the dataset (skipping the measured ones while any others
 * remain), either `warmup_requests` of them or as many as `warmup_duration_s` allows, with
 * `warmup_concurrency` in flight. Their records are kept (phase warmup) but excluded from every
 * figure.
 *
 * Requests stream ("stream": true, "stream_options": {"include_usage": true}) to
 * /v1/chat/completions with X-Request-Id "<run_id>-c<conv>-t<turn>" (warmup: "-w<k>-t1"),
 * X-Conversation-Id "<run_id>-c<conv>", X-Lumen-Phase and X-Lumen-Turn (docs/RECORDS.md). */
#ifndef LM_BENCH_REPLAY_H
#define LM_BENCH_REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/status.h"
#include "bench/dataset.h"
#include "bench/record.h"

struct lm_bench_prompt;

enum lm_bench_arrival {
    LM_BENCH_ARRIVAL_CONSTANT, /* "constant": 1/rate apart */
    LM_BENCH_ARRIVAL_POISSON,  /* "poisson": exponential gaps of mean 1/rate, from `seed` */
};

struct lm_bench_params {
    const char *url;      /* server base, "http://127.0.0.1:8080" */
    const char *model;    /* NULL: data[0].id of GET /v1/models */
    const char *api_key;  /* NULL: no Authorization header */
    size_t conversations; /* conversations to profile (cycling through the dataset); 0: no
                             cap (request_count or duration_s must be set) */
    bool conversations_default; /* `conversations` is the default, not the user's: at most the
                                   dataset's selected conversations run (no second pass over
                                   the same ones, whose prompts the server has cached) */
    size_t request_count; /* profiling requests to send at most; 0: no cap */
    double duration_s;    /* release no profiling request after this; 0: no cap */
    int concurrency;      /* concurrency mode: conversations in flight (>= 1); rate mode:
                             requests in flight at most (0: 256) */
    double request_rate;  /* > 0: request-rate mode, requests/s */
    enum lm_bench_arrival arrival;
    size_t warmup_requests;    /* warmup turn-1 requests (count mode) */
    double warmup_duration_s;  /* > 0: warmup for this long instead of a count */
    int warmup_concurrency;    /* warmup requests in flight; 0 = concurrency (1 in rate mode) */
    double think_time_mean_ms; /* wait between a response and the conversation's next turn */
    double think_time_std_ms;  /* 0: fixed; else normal(mean, std) clamped at 0, per turn */
    int max_tokens;            /* max_tokens of every request (a conversation's own, from
                                  synthetic or custom data, wins) */
    double temperature;        /* temperature of every request (0 = greedy) */
    bool ignore_eos;           /* send "ignore_eos": true (vLLM, llama.cpp, lumen extension) */
    bool shuffle;           /* pick conversations in an order drawn from `seed`; else file order */
    uint64_t seed;          /* conversation order, think times, Poisson arrivals */
    double timeout_s;       /* per request; <= 0 for none */
    const char *extra_body; /* a JSON object merged into every request body; NULL for none */
    const struct lm_bench_prompt *prompt; /* optional: counts response tokens per chunk; borrowed */
    const struct lm_bench_prompt *render; /* optional: renders each request's prompt ids (for
                                             verification and the usage comparison); borrowed */
    FILE *progress; /* progress: a bar on a terminal, else plain lines; NULL: silent */
};

/* Defaults: 10 conversations, concurrency 1, 2 warmup requests, no think time, max_tokens 128,
 * temperature 0, timeout 600 s, file order, constant arrivals. url must still be set. */
struct lm_bench_params lm_bench_default_params(void);

struct lm_bench_run {
    char run_id[20];                 /* 8 hex digits, unique per run */
    char *model;                     /* the model name sent; owned */
    char *url;                       /* owned copy of params.url */
    struct lm_bench_params params;   /* a copy; its pointers are borrowed from the caller */
    int enable_thinking;             /* chat_template_kwargs.enable_thinking of extra_body:
                                        -1 not given, 0, 1 */
    struct lm_bench_record *records; /* [n_records]: warmup first, then profiling,
                                        conversation-major in turn order; owned */
    size_t n_records;
    size_t n_warmup;                     /* records[0 .. n_warmup) are warmup */
    size_t n_conversations;              /* profiled conversations (started) */
    double t_begin, t_end;               /* profiling window, CLOCK_MONOTONIC s: the first measured
                                            request sent .. the last measured response ended */
    double unix_begin;                   /* t_begin as Unix time */
    double warmup_t_begin, warmup_t_end; /* the warmup phase (0 when none) */
    size_t n_deferred;                   /* rate mode: arrivals that had to wait */
    double max_lag_ms;                   /* rate mode: the longest such wait */
    const char *limit_hit;               /* "request_count", "duration", "interrupted" (a signal: client.h) or NULL; static */
};

/* Picks n conversations (indices into a dataset of ds_n): file order 0,1,2,... or, when
 * shuffle, the order of a permutation drawn from seed; cycling past the end when n > ds_n. */
void lm_bench_select(size_t ds_n, size_t n, bool shuffle, uint64_t seed, size_t *out);

/* Runs warmup then profiling. Fails (LM_ERR_INVALID for bad params, or the model lookup's error
 * when params.model is NULL) only before any request is sent; request failures are recorded in
 * the run's records. `run` is zeroed first; free with lm_bench_run_free (also after failure). */
lm_status lm_bench_run(const struct lm_bench_dataset *ds, const struct lm_bench_params *params,
                       struct lm_bench_run *run);

void lm_bench_run_free(struct lm_bench_run *run);

#endif
