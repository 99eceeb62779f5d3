/* sampler.h: turning a logits row into a token id: greedy, temperature, top_k, top_p, seed.
 *
 * Each request owns one lm_rng, so a seeded request is deterministic whatever else runs. The
 * order of operations follows Hugging Face's LogitsProcessor chain: temperature, then top_k,
 * then top_p (nucleus, Holtzman et al. 2019), then a draw from the softmax. */
#ifndef LM_ENGINE_SAMPLER_H
#define LM_ENGINE_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct lm_sampling_params {
    float temperature; /* 0 = greedy (argmax); > 0 divides the logits */
    float top_p;       /* (0, 1]; 1 = off */
    int top_k;         /* 0 = off */
    uint64_t seed;     /* used when `seeded` */
    bool seeded;       /* false: seeded from the clock */
};

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
};
void lm_sampler_init(struct lm_sampler *s, int vocab);
void lm_sampler_free(struct lm_sampler *s);

/* Picks the next id from `logits` [vocab] float32 (not modified). Greedy ties go to the lowest id,
 * as torch.argmax does. */
int32_t lm_sample(struct lm_sampler *s, const float *logits, const struct lm_sampling_params *p,
                  struct lm_rng *rng);

#endif
