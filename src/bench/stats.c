/* stats.c: see stats.h. */
#include "bench/stats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* numpy.percentile(x, p) with the default method="linear". */
double lm_bench_percentile_sorted(const double *sorted, size_t n, double p) {
    if (n == 0) return NAN;
    if (p <= 0) return sorted[0];
    if (p >= 100) return sorted[n - 1];
    double r = p / 100.0 * (double)(n - 1);
    size_t lo = (size_t)floor(r), hi = (size_t)ceil(r);
    return sorted[lo] + (sorted[hi] - sorted[lo]) * (r - (double)lo);
}

void lm_bench_stats_compute(const double *v, size_t n, struct lm_bench_stats *out) {
    out->n = 0;
    out->min = out->mean = out->p50 = out->p90 = out->p95 = out->p99 = out->max = out->std = NAN;
    double *s = malloc((n ? n : 1) * sizeof *s);
    if (!s) abort();
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(v[i])) s[m++] = v[i];
    if (m) {
        qsort(s, m, sizeof *s, cmp_double);
        double sum = 0;
        for (size_t i = 0; i < m; i++)
            sum += s[i];
        double mean = sum / (double)m, ss = 0;
        for (size_t i = 0; i < m; i++)
            ss += (s[i] - mean) * (s[i] - mean);
        out->n = m;
        out->min = s[0];
        out->max = s[m - 1];
        out->mean = mean;
        out->std = sqrt(ss / (double)m);
        out->p50 = lm_bench_percentile_sorted(s, m, 50);
        out->p90 = lm_bench_percentile_sorted(s, m, 90);
        out->p95 = lm_bench_percentile_sorted(s, m, 95);
        out->p99 = lm_bench_percentile_sorted(s, m, 99);
    }
    free(s);
}

void lm_bench_samples_push(struct lm_bench_samples *s, double x) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        double *v = realloc(s->v, cap * sizeof *v);
        if (!v) abort();
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = x;
}

void lm_bench_samples_free(struct lm_bench_samples *s) {
    free(s->v);
    memset(s, 0, sizeof *s);
}
