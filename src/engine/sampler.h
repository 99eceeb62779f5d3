/* sampler.h: turning a logits row into a token id: penalties, greedy, temperature, top_k, top_p,
 * min_p, seed, and the logprobs a client asked for.
 *
 * Each request owns one lm_rng, so a seeded request is deterministic whatever else runs. The
 * order of operations is vLLM's for the penalties (repetition, then frequency and presence, on
 * the raw logits; greedy takes the argmax of the penalised logits) and Hugging Face's
 * LogitsProcessor chain for the rest: temperature, then top_k, then top_p (nucleus, Holtzman et
 * al. 2019), then min_p (Nguyen et al. 2024), then a draw from the softmax.
 *
 * Logprobs are vLLM's default (logprobs_mode "raw_logprobs"): the log-softmax of the model's raw
 * logits, before penalties, temperature and truncation. */
#ifndef LM_ENGINE_SAMPLER_H
#define LM_ENGINE_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A zeroed struct is greedy with every option off, except top_p, which must be set to 1 for
 * "off" (0 keeps only the most likely token). */
struct lm_sampling_params {
    float temperature; /* 0 = greedy (argmax); > 0 divides the logits */
    float top_p;       /* (0, 1]; 1 = off */
    int top_k;         /* 0 = off */
    uint64_t seed;     /* used when `seeded` */
    bool seeded;       /* false: seeded from the clock */

    /* Added for the OpenAI surface; zero = off, so older initialisers keep their meaning. */
    float min_p; /* [0, 1]; 0 = off. Keeps the tokens whose probability (after temperature,
                    top_k, top_p) is >= min_p times the largest one (HF MinPLogitsWarper) */
    float presence_penalty;   /* [-2, 2]; 0 = off. OpenAI: subtracted once from the logit of
                                 every token that occurs in the generated tokens */
    float frequency_penalty;  /* [-2, 2]; 0 = off. OpenAI: subtracted from the logit of every
                                 token times its count in the generated tokens */
    float repetition_penalty; /* > 0; 1 (or 0) = off. HF/vLLM (Keskar et al. 2019): the logit
                                 of every token in the prompt or the generated tokens is divided
                                 by it when positive and multiplied by it when not */
    bool logprobs;            /* report the chosen token's logprob (lm_sample_next's `lp`) */
    int top_logprobs;         /* 0..LM_MAX_TOP_LOGPROBS most likely alternatives as well */
};

/* The most alternatives a request may ask for (OpenAI's top_logprobs limit). */
#define LM_MAX_TOP_LOGPROBS 20

/* True when the parameters need the sequence's token history (any penalty is on). */
bool lm_sampling_needs_history(const struct lm_sampling_params *p);

/* xoshiro256** (Blackman & Vigna 2018). */
struct lm_rng {
    uint64_t s[4];
};
void lm_rng_seed(struct lm_rng *r, uint64_t seed);
uint64_t lm_rng_next(struct lm_rng *r);
double lm_rng_uniform(struct lm_rng *r); /* [0, 1) */

/* Scratch for sampling over `vocab` logits; embed and init once per request or per worker. */
struct lm_sampler {
    int vocab;
    float *probs;   /* [vocab] */
    int32_t *index; /* [vocab] */
    float *work;    /* [vocab] penalised logits; NULL until a penalty is used */
    int32_t *count; /* [vocab] zero between calls; NULL until a penalty is used */
    uint8_t *mark;  /* [vocab] zero between calls; NULL until a penalty is used */
};
void lm_sampler_init(struct lm_sampler *s, int vocab);
void lm_sampler_free(struct lm_sampler *s);

/* Picks the next id from `logits` [vocab] float32 (not modified). Greedy ties go to the lowest id,
 * as torch.argmax does. Penalties need the token history: this applies none (see
 * lm_sample_next); min_p applies. */
int32_t lm_sample(struct lm_sampler *s, const float *logits, const struct lm_sampling_params *p,
                  struct lm_rng *rng);

/* The tokens a sequence has seen, for the penalties. Borrowed for the duration of the call. */
struct lm_token_history {
    const int32_t *prompt; /* [n_prompt] prompt ids */
    size_t n_prompt;
    const int32_t *output; /* [n_output] ids generated so far (EOS excluded) */
    size_t n_output;
};

/* One generated token's logprobs: natural-log probabilities of the raw logits' softmax. */
struct lm_token_logprob {
    int32_t id;      /* the chosen token */
    float logprob;   /* its logprob (-INFINITY when its logit was -inf) */
    int n_top;       /* entries in top_id/top_logprob: min(top_logprobs, vocab) */
    int32_t top_id[LM_MAX_TOP_LOGPROBS]; /* most likely first; ties go to the lower id */
    float top_logprob[LM_MAX_TOP_LOGPROBS];
};

/* The next id of a sequence: lm_sample after the penalties of `p` over `h` (NULL: an empty
 * history), and, when `lp` is non-NULL and p->logprobs is set, the logprobs of the chosen id
 * and of the p->top_logprobs most likely ids (computed from the raw `logits`). With no penalty
 * set it draws exactly what lm_sample draws. Ids in `h` outside [0, vocab) are ignored.
 * Scratch for the penalties ([vocab] floats and counts) is allocated in `s` on first use. */
int32_t lm_sample_next(struct lm_sampler *s, const float *logits, const struct lm_sampling_params *p,
                       const struct lm_token_history *h, struct lm_rng *rng,
                       struct lm_token_logprob *lp);

/* Fills `lp` for `id` from raw `logits` [vocab]: log-softmax, plus the `top` (<=
 * LM_MAX_TOP_LOGPROBS) largest. Used by lm_sample_next; public for tests and the engine. */
void lm_logprobs_of(const float *logits, int vocab, int32_t id, int top, struct lm_token_logprob *lp);

/* A growing array of per-token logprobs (one per generated token), for a request's result.
 * Zero-initialise; lm_logprob_list_free releases it. */
struct lm_logprob_list {
    struct lm_token_logprob *v;
    size_t n, cap;
};
void lm_logprob_list_push(struct lm_logprob_list *l, const struct lm_token_logprob *e);
void lm_logprob_list_free(struct lm_logprob_list *l); /* accepts a zeroed list */

#endif
