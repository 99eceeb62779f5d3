/* stats.h: summary statistics of a sample, as the profiler reports them.
 *
 * Percentiles use linear interpolation between closest ranks, which is numpy.percentile's
 * default (method="linear"): for sorted x[0..n-1] and p in [0,100], rank r = p/100 * (n-1) and
 * the value is x[floor(r)] + (x[ceil(r)] - x[floor(r)]) * (r - floor(r)). AIPerf reports its
 * percentiles with numpy, so the numbers compare directly. */
#ifndef LM_BENCH_STATS_H
#define LM_BENCH_STATS_H

#include <stddef.h>

struct lm_bench_stats {
    size_t n; /* samples; 0 means every field below is NAN */
    double min, mean, p50, p90, p95, p99, max;
    double std; /* population standard deviation (numpy.std's default) */
};

/* Percentile p (0..100) of `sorted` (ascending, n > 0) by linear interpolation. */
double lm_bench_percentile_sorted(const double *sorted, size_t n, double p);

/* Computes the statistics of v[0..n-1] (NAN entries are skipped; v is not modified).
 * With no finite sample, out->n == 0 and the other fields are NAN. */
void lm_bench_stats_compute(const double *v, size_t n, struct lm_bench_stats *out);

/* A growable array of doubles, for collecting samples. Zero-initialise; free with
 * lm_bench_samples_free. Allocation failure aborts (as lm_buf does). */
struct lm_bench_samples {
    double *v;
    size_t n, cap;
};

void lm_bench_samples_push(struct lm_bench_samples *s, double x);
void lm_bench_samples_free(struct lm_bench_samples *s);

#endif
