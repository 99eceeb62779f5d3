/* generate.h: one request's decode loop over a model sequence: prefill, sample, stop.
 *
 * Stops at any of the model's EOS ids (not emitted), at max_tokens ("length"), or when a stop
 * string appears in the text ("stop"; the stop string and what follows are not emitted). Text
 * that might still become a stop string is held back and released once it cannot. */
#ifndef LM_ENGINE_GENERATE_H
#define LM_ENGINE_GENERATE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/status.h"
#include "engine/emit.h"
#include "engine/sampler.h"
#include "engine/spec.h"
#include "family/model.h"

enum lm_finish { LM_FINISH_NONE, LM_FINISH_STOP, LM_FINISH_LENGTH, LM_FINISH_CANCELLED };
/* "stop", "length", "cancelled", "" (NONE): the words of lumen's records and logs (the server's
 * --records and log line, the profiler's requests.jsonl: docs/RECORDS.md). */
const char *lm_finish_name(enum lm_finish f);

struct lm_gen_request {
    const int32_t *prompt; /* borrowed prompt ids */
    size_t n_prompt;
    int max_tokens;        /* completion tokens at most (> 0; the scheduler also takes 0: prefill
                              only, to fill the prefix cache) */
    struct lm_sampling_params sampling;
    const char *const *stop; /* borrowed stop strings (may be NULL) */
    size_t n_stop;
    bool ignore_eos;           /* keep going past EOS ids (benchmarks) */
    atomic_bool *cancel;       /* polled every step; NULL = never cancelled */
    const struct lm_spec_params *spec; /* lm_generate only: speculative decoding (engine/spec.h;
                                          borrowed); NULL or num_speculative_tokens 0 = off. The
                                          scheduler ignores it (lm_sched_params.spec) */
};

/* Moments in a request's life, CLOCK_MONOTONIC milliseconds (lm_now_ms); 0 = not reached. */
struct lm_gen_times {
    double arrival_ms;     /* submitted to the engine */
    double scheduled_ms;   /* first admitted to run (its prefill starts) */
    double first_token_ms; /* the first completion token was sampled (prefill done) */
    double finish_ms;      /* finished, failed or cancelled */
};

/* CLOCK_MONOTONIC in milliseconds. */
double lm_now_ms(void);

struct lm_gen_result {
    struct lm_ids ids;    /* completion ids, EOS excluded; caller frees (lm_gen_result_free) */
    struct lm_buf text;   /* full completion text as emitted (stop string excluded) */
    enum lm_finish finish;
    int prompt_tokens;
    int completion_tokens;
    int cached_tokens;    /* prompt tokens whose K/V came from the prefix cache, not computed
                             (the scheduler; lm_generate reports 0) */
    double prefill_s;     /* wall seconds from scheduled to the first token (prompt forward) */
    double decode_s;      /* wall seconds from the first token to the finish */
    struct lm_gen_times times;
    int preemptions;      /* times the scheduler took its KV blocks back (recomputed later) */
    int draft_tokens;     /* speculative decoding (engine/spec.h): draft tokens run for it */
    int accepted_tokens;  /* of which accepted */
    struct lm_logprob_list logprobs; /* one per id of `ids` when sampling.logprobs is set
                                        (sampler.h: raw-logit log-softmax); freed with the result */
};
void lm_gen_result_free(struct lm_gen_result *r);

/* Runs the request on `seq` (which is truncated to empty first). The callback may be NULL. A
 * model opened without a tokenizer generates ids only (no text; stop strings never match).
 * With req->spec on, each step also runs the n-gram draft (engine/spec.h) and keeps the tokens
 * the model agrees with, drawn as plain decoding draws them: the same ids, text and logprobs.
 * LM_ERR_RANGE when prompt + max_tokens exceeds the sequence capacity (message gives numbers);
 * LM_ERR_INVALID for spec parameters out of range. */
lm_status lm_generate(struct lm_model *m, struct lm_seq *seq, const struct lm_gen_request *req,
                      lm_gen_text_fn on_text, void *ctx, struct lm_gen_result *out);

#endif
