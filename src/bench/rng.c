/* rng.c: see rng.h. */
#include "bench/rng.h"

#include <math.h>

uint64_t lm_bench_rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double lm_bench_rng_uniform(uint64_t *s) {
    return (double)(lm_bench_rng_next(s) >> 11) * 0x1.0p-53;
}

double lm_bench_rng_normal(uint64_t *s, double mean, double std) {
    if (!(std > 0)) return mean;
    double u1 = lm_bench_rng_uniform(s), u2 = lm_bench_rng_uniform(s);
    if (u1 < 1e-300) u1 = 1e-300;
    return mean + std * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

double lm_bench_rng_exponential(uint64_t *s, double mean) {
    double u = lm_bench_rng_uniform(s);
    return -mean * log1p(-u);
}
