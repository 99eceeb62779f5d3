/* replay.h: the profiler's load generator: multi-turn conversations replayed against an
 * OpenAI-compatible server, in the manner of NVIDIA AIPerf's multi-turn mode.
 *
 * Each conversation is a client-side state machine. Turn k sends the history
 *   [system?] user q1, assistant a1, ..., user qk
 * where a1..a(k-1) are the answers this server actually streamed back in the earlier turns (the
 * corpus's own answers are never sent). Between a turn's last byte and the next turn's request
 * the conversation waits its think time. `concurrency` conversations are in flight at once (one
 * thread and one kept-alive connection each); a finished conversation's thread starts the next.
 * When a turn fails, the rest of that conversation is skipped (there is no answer to continue
 * from): those records keep sent == false.
 *
 * Warmup runs first and fully drains before the profiling phase starts: `warmup_requests` turn-1
 * requests of conversations taken from the end of the dataset (skipping the measured ones while
 * any others remain). Their records are kept (phase warmup) but excluded from every figure.
 *
 * Requests stream ("stream": true, "stream_options": {"include_usage": true}) to
 * /v1/chat/completions with X-Request-Id "<run_id>-c<conv>-t<turn>" (warmup: "-w<k>-t1") and
 * X-Conversation-Id "<run_id>-c<conv>". */
#ifndef LM_BENCH_REPLAY_H
#define LM_BENCH_REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/status.h"
#include "bench/dataset.h"
#include "bench/record.h"

struct lm_tokenizer;

struct lm_bench_params {
    const char *url;            /* server base, "http://127.0.0.1:8080" */
    const char *model;          /* NULL: data[0].id of GET /v1/models */
    const char *api_key;        /* NULL: no Authorization header */
    size_t conversations;       /* conversations to profile (cycles through the dataset) */
    int concurrency;            /* conversations in flight, >= 1 */
    size_t warmup_requests;     /* warmup turn-1 requests before profiling */
    int warmup_concurrency;     /* warmup requests in flight; 0 = concurrency */
    double think_time_mean_ms;  /* wait between a response and the conversation's next request */
    double think_time_std_ms;   /* 0: fixed; else normal(mean, std) clamped at 0, drawn per turn */
    int max_tokens;             /* max_tokens of every request */
    double temperature;         /* temperature of every request (0 = greedy) */
    bool ignore_eos;            /* send "ignore_eos": true (vLLM, llama.cpp, lumen extension) */
    bool shuffle;               /* pick conversations in an order drawn from `seed`; else file order */
    uint64_t seed;              /* for the conversation order and the think-time draws */
    double timeout_s;           /* per request; <= 0 for none */
    const char *extra_body;     /* a JSON object merged into every request body; NULL for none */
    const struct lm_tokenizer *tokenizer; /* optional: counts tokens per chunk; borrowed */
    FILE *progress;             /* progress lines ("profiling: 12/16 requests"); NULL: silent */
};

/* Defaults: 10 conversations, concurrency 1, 2 warmup requests, no think time, max_tokens 128,
 * temperature 0, timeout 600 s, file order. url must still be set. */
struct lm_bench_params lm_bench_default_params(void);

struct lm_bench_run {
    char run_id[20];                   /* 8 hex digits, unique per run */
    char *model;                       /* the model name sent; owned */
    char *url;                         /* owned copy of params.url */
    struct lm_bench_params params;     /* a copy; its pointers are borrowed from the caller */
    struct lm_bench_record *records;   /* [n_records]: warmup first, then profiling,
                                          conversation-major in turn order; owned */
    size_t n_records;
    size_t n_warmup;                   /* records[0 .. n_warmup) are warmup */
    size_t n_conversations;            /* profiled conversations */
    double t_begin, t_end;             /* profiling window, CLOCK_MONOTONIC s: the first measured
                                          request sent .. the last measured response ended */
    double unix_begin;                 /* t_begin as Unix time */
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
