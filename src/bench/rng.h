/* rng.h: the profiler's seeded random draws (conversation order, think times, Poisson arrivals,
 * synthetic prompts). splitmix64 (Steele, Lea, Flood, "Fast splittable pseudorandom number
 * generators", OOPSLA 2014): one 64-bit state word, well mixed, the same sequence on every host. */
#ifndef LM_BENCH_RNG_H
#define LM_BENCH_RNG_H

#include <stdint.h>

/* The next 64 random bits; advances *state. */
uint64_t lm_bench_rng_next(uint64_t *state);
/* Uniform in [0, 1). */
double lm_bench_rng_uniform(uint64_t *state);
/* Normal(mean, std) by Box-Muller (one draw per call; std 0 gives mean). */
double lm_bench_rng_normal(uint64_t *state, double mean, double std);
/* Exponential with the given mean (inter-arrival times of a Poisson process). */
double lm_bench_rng_exponential(uint64_t *state, double mean);

#endif
