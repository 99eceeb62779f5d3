/* test_sampler.c: RNG reference values, greedy, seeded reproducibility, the softmax
 * distribution of draws, top_k and top_p nucleus membership against a naive full sort; the
 * penalties against a hand computation of vLLM's formulas, min_p's distribution, and logprobs
 * against a double-precision log-softmax and a full sort.
 * LM_LINK: lm_engine lm_base */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine/sampler.h"

/* Independent reference: xoshiro256** seeded by splitmix64, written in Python with
 * arbitrary-precision ints (first five outputs for seeds 0 and 42). */
static const uint64_t k_ref0[5] = {0x99ec5f36cb75f2b4ull, 0xbf6e1f784956452aull, 0x1a5f849d4933e6e0ull,
                                   0x6aa594f1262d2d2cull, 0xbba5ad4a1f842e59ull};
static const uint64_t k_ref42[5] = {0x15780b2e0c2ec716ull, 0x6104d9866d113a7eull, 0xae17533239e499a1ull,
                                    0xecb8ad4703b360a1ull, 0xfde6dc7fe2ec5e64ull};

static void test_rng(void) {
    struct lm_rng r;
    lm_rng_seed(&r, 0);
    for (int i = 0; i < 5; i++) {
        uint64_t x = lm_rng_next(&r);
        CHECK(x == k_ref0[i], "seed 0 output %d: %016llx", i, (unsigned long long)x);
    }
    lm_rng_seed(&r, 42);
    for (int i = 0; i < 5; i++) {
        uint64_t x = lm_rng_next(&r);
        CHECK(x == k_ref42[i], "seed 42 output %d: %016llx", i, (unsigned long long)x);
    }
    double lo = 1, hi = 0, mean = 0;
    for (int i = 0; i < 100000; i++) {
        double u = lm_rng_uniform(&r);
        lo = u < lo ? u : lo, hi = u > hi ? u : hi, mean += u;
    }
    mean /= 100000;
    CHECK(lo >= 0 && hi < 1 && lo < 1e-3 && hi > 1 - 1e-3, "uniform range [%g, %g]", lo, hi);
    CHECK(fabs(mean - 0.5) < 0.005, "uniform mean %g", mean);
}

static float randn(struct lm_rng *r) {
    double u1 = lm_rng_uniform(r) + 1e-12, u2 = lm_rng_uniform(r);
    return (float)(sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
}

static void test_greedy(void) {
    enum { V = 1000 };
    float logits[V];
    struct lm_rng r;
    lm_rng_seed(&r, 7);
    struct lm_sampler s = {0};
    lm_sampler_init(&s, V);
    struct lm_sampling_params greedy = {.temperature = 0, .top_p = 1};
    struct lm_sampling_params k1 = {.temperature = 1.3f, .top_p = 1, .top_k = 1};
    for (int t = 0; t < 50; t++) {
        for (int i = 0; i < V; i++) logits[i] = randn(&r) * 3;
        int best = 0;
        for (int i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        CHECK(lm_sample(&s, logits, &greedy, &r) == best, "greedy = argmax (trial %d)", t);
        CHECK(lm_sample(&s, logits, &k1, &r) == best, "top_k=1 = argmax (trial %d)", t);
        struct lm_sampling_params k1p = {.temperature = 0.5f, .top_p = 0.9f, .top_k = 1};
        CHECK(lm_sample(&s, logits, &k1p, &r) == best, "top_k=1 with top_p = argmax (trial %d)", t);
    }
    for (int i = 0; i < V; i++) logits[i] = -1;
    logits[500] = logits[37] = logits[900] = 4;
    CHECK(lm_sample(&s, logits, &greedy, &r) == 37, "greedy ties go to the lowest id");
    lm_sampler_free(&s);
}

static void test_seeded(void) {
    enum { V = 5000, N = 200 };
    float *logits = malloc(V * sizeof *logits);
    struct lm_rng r;
    lm_rng_seed(&r, 3);
    for (int i = 0; i < V; i++) logits[i] = randn(&r) * 2;
    struct lm_sampler s = {0};
    lm_sampler_init(&s, V);
    struct lm_sampling_params p = {.temperature = 0.8f, .top_p = 0.95f, .top_k = 50};
    int32_t a[N], b[N], c[N];
    struct lm_rng r1, r2, r3;
    lm_rng_seed(&r1, 1234);
    lm_rng_seed(&r2, 1234);
    lm_rng_seed(&r3, 1235);
    for (int i = 0; i < N; i++) a[i] = lm_sample(&s, logits, &p, &r1);
    for (int i = 0; i < N; i++) b[i] = lm_sample(&s, logits, &p, &r2);
    for (int i = 0; i < N; i++) c[i] = lm_sample(&s, logits, &p, &r3);
    CHECK(!memcmp(a, b, sizeof a), "same seed, same draws");
    CHECK(memcmp(a, c, sizeof a) != 0, "different seed, different draws");
    lm_sampler_free(&s);
    free(logits);
}

/* Draws `n` times and returns the largest |frequency - want| over the vocabulary. */
static double max_freq_err(const float *logits, int V, const struct lm_sampling_params *p,
                           const double *want, int n, uint64_t seed) {
    struct lm_sampler s = {0};
    lm_sampler_init(&s, V);
    struct lm_rng r;
    lm_rng_seed(&r, seed);
    int *count = calloc((size_t)V, sizeof *count);
    for (int i = 0; i < n; i++) count[lm_sample(&s, logits, p, &r)]++;
    double err = 0;
    for (int i = 0; i < V; i++) {
        double e = fabs((double)count[i] / n - want[i]);
        if (e > err) err = e;
    }
    free(count);
    lm_sampler_free(&s);
    return err;
}

/* want[i] = softmax(logits / T) restricted to keep[i], renormalised. */
static void softmax_over(const float *logits, int V, double T, const bool *keep, double *want) {
    double sum = 0;
    for (int i = 0; i < V; i++) sum += want[i] = keep[i] ? exp(logits[i] / T) : 0;
    for (int i = 0; i < V; i++) want[i] /= sum;
}

static void test_distribution(void) {
    enum { V = 6, N = 400000 };
    /* With 400k draws one frequency has standard deviation <= 0.0008; allow 0.004 (5 sigma). */
    const float logits[V] = {1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 2.0f};
    double want[V];
    bool all[V] = {1, 1, 1, 1, 1, 1};
    softmax_over(logits, V, 0.7, all, want);
    struct lm_sampling_params p = {.temperature = 0.7f, .top_p = 1};
    double err = max_freq_err(logits, V, &p, want, N, 11);
    CHECK(err < 0.004, "softmax(T=0.7) frequencies off by %g", err);

    softmax_over(logits, V, 1.0, all, want);
    p.temperature = 1;
    err = max_freq_err(logits, V, &p, want, N, 12);
    CHECK(err < 0.004, "softmax(T=1) frequencies off by %g", err);

    /* top_k=2: the 2nd largest logit is 2.0, held by ids 1 and 5; Hugging Face keeps ties, so
     * ids 4, 1 and 5 remain. */
    bool k2[V] = {0, 1, 0, 0, 1, 1};
    softmax_over(logits, V, 1.0, k2, want);
    p.top_k = 2;
    err = max_freq_err(logits, V, &p, want, N, 13);
    CHECK(err < 0.004, "top_k=2 frequencies off by %g", err);

    /* top_p on probabilities 0.5, 0.3, 0.15, 0.05: top_p 0.85 keeps the first three (mass
     * ahead of the third is 0.8 < 0.85, ahead of the fourth 0.95); 0.75 keeps two; 0.4 keeps one. */
    const float lp[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    double w4[4];
    struct lm_sampling_params q = {.temperature = 1, .top_p = 0.85f};
    bool keep3[4] = {1, 1, 1, 0}, keep2[4] = {1, 1, 0, 0}, keep1[4] = {1, 0, 0, 0};
    softmax_over(lp, 4, 1.0, keep3, w4);
    err = max_freq_err(lp, 4, &q, w4, N, 14);
    CHECK(err < 0.004, "top_p=0.85 frequencies off by %g (the 4th must never appear)", err);
    q.top_p = 0.75f;
    softmax_over(lp, 4, 1.0, keep2, w4);
    err = max_freq_err(lp, 4, &q, w4, N, 15);
    CHECK(err < 0.004, "top_p=0.75 frequencies off by %g", err);
    q.top_p = 0.4f;
    softmax_over(lp, 4, 1.0, keep1, w4);
    err = max_freq_err(lp, 4, &q, w4, 1000, 16);
    CHECK(err == 0, "top_p=0.4 keeps only the top token");
}

/* Index sort by descending logit, ascending id: the naive nucleus used as the second path. */
static const float *g_sort_logits;
static int cmp_desc(const void *a, const void *b) {
    int ia = *(const int *)a, ib = *(const int *)b;
    float la = g_sort_logits[ia], lb = g_sort_logits[ib];
    if (la != lb) return la > lb ? -1 : 1;
    return ia - ib;
}

/* Marks the nucleus of softmax(logits / T) for top_p by a full sort. Returns its size. */
static int naive_nucleus(const float *logits, int V, double T, double top_p, bool *in) {
    int *order = malloc((size_t)V * sizeof *order);
    for (int i = 0; i < V; i++) order[i] = i, in[i] = false;
    g_sort_logits = logits;
    qsort(order, (size_t)V, sizeof *order, cmp_desc);
    double sum = 0, mx = logits[order[0]];
    for (int i = 0; i < V; i++) sum += exp((logits[i] - mx) / T);
    double before = 0;
    int n = 0;
    for (int j = 0; j < V; j++) {
        if (j > 0 && before >= top_p * sum) break;
        in[order[j]] = true;
        before += exp((logits[order[j]] - mx) / T);
        n++;
    }
    free(order);
    return n;
}

/* One top_p run: every draw must fall inside the naive nucleus; returns the largest drawn id
 * whose logit equals `floor_logit` (-1 if none) and sets *cut to the largest such id inside it. */
static int nucleus_run(const float *logits, int V, double top_p, int n_draws, uint64_t seed,
                       float floor_logit, int *n_in, int *cut) {
    bool *in = malloc((size_t)V);
    *n_in = naive_nucleus(logits, V, 1.0, top_p, in);
    *cut = -1;
    for (int i = 0; i < V; i++)
        if (in[i] && logits[i] == floor_logit) *cut = i;
    struct lm_sampler s = {0};
    lm_sampler_init(&s, V);
    struct lm_sampling_params p = {.temperature = 1, .top_p = (float)top_p};
    struct lm_rng r;
    lm_rng_seed(&r, seed);
    int outside = 0, max_floor_id = -1;
    for (int i = 0; i < n_draws; i++) {
        int32_t id = lm_sample(&s, logits, &p, &r);
        if (!in[id]) outside++;
        if (logits[id] == floor_logit && id > max_floor_id) max_floor_id = id;
    }
    CHECK(outside == 0, "V=%d top_p=%g: %d draws outside the nucleus of %d", V, top_p, outside, *n_in);
    lm_sampler_free(&s);
    free(in);
    return max_floor_id;
}

static void test_nucleus_large(void) {
    /* Ten peaked tokens scattered over a flat floor of equal logits. */
    int n_in, cut, top;
    /* Real vocabulary size, peaks holding ~94% of the mass: top_p 0.5 must stay inside the peaks
     * (the histogram prefilter drops the 151,926 floor tokens before sorting). */
    enum { V1 = 151936 };
    float *l1 = malloc(V1 * sizeof *l1);
    for (int i = 0; i < V1; i++) l1[i] = 0;
    for (int k = 0; k < 10; k++) l1[(k * 15013 + 777) % V1] = 12.0f + 0.1f * k;
    top = nucleus_run(l1, V1, 0.5, 1000, 100, 0.0f, &n_in, &cut);
    CHECK(n_in < 10 && top < 0 && cut < 0, "top_p=0.5 stays within the peaks (%d, %d)", n_in, top);
    free(l1);

    /* Peaks holding ~70%: top_p 0.9 cuts inside the run of equal floor logits, where the
     * ranking is by ascending id. Floor draws must approach the cut but never pass it. */
    enum { V2 = 20000 };
    float *l2 = malloc(V2 * sizeof *l2);
    for (int i = 0; i < V2; i++) l2[i] = 0;
    for (int k = 0; k < 10; k++) l2[(k * 1999 + 77) % V2] = 8.0f + 0.1f * k;
    top = nucleus_run(l2, V2, 0.9, 1000, 101, 0.0f, &n_in, &cut);
    CHECK(n_in > 1000 && n_in < V2 - 1000, "top_p=0.9 cuts inside the floor (%d)", n_in);
    CHECK(top > cut * 9 / 10 && top <= cut, "top_p=0.9: floor draws reach id %d of cut %d", top, cut);
    free(l2);
}

/* Penalties: the penalised logits (s.work) against the formulas written out here. */
static void test_penalties(void) {
    enum { V = 40 };
    float logits[V];
    struct lm_rng r;
    lm_rng_seed(&r, 11);
    for (int i = 0; i < V; i++) logits[i] = fmaxf(-4.0f, fminf(4.0f, randn(&r) * 2));
    logits[7] = 5.0f;  /* the raw argmax, repeated in the output: penalties should move it */
    logits[3] = -1.5f; /* negative and in the prompt */
    logits[20] = 4.9f; /* the runner-up, never seen */
    const int32_t prompt[] = {3, 3, 10, 7, 39};
    const int32_t output[] = {7, 7, 12, 7, 3};
    struct lm_token_history h = {prompt, 5, output, 5};
    struct lm_sampling_params p = {.temperature = 0, .top_p = 1, .repetition_penalty = 1.3f,
                                   .frequency_penalty = 0.5f, .presence_penalty = 0.25f};
    struct lm_sampler s;
    lm_sampler_init(&s, V);
    CHECK(lm_sampling_needs_history(&p), "penalties need the history");
    int32_t id = lm_sample_next(&s, logits, &p, &h, &r, NULL);
    float want[V];
    int count[V] = {0};
    bool seen[V] = {false};
    for (int i = 0; i < 5; i++) seen[prompt[i]] = seen[output[i]] = true, count[output[i]]++;
    int best = 0;
    double err = 0;
    for (int i = 0; i < V; i++) {
        float w = logits[i];
        if (seen[i]) w = w > 0 ? w / 1.3f : w * 1.3f;
        if (count[i]) {
            w -= 0.5f * (float)count[i];
            w -= 0.25f;
        }
        want[i] = w;
        if (want[i] > want[best]) best = i;
        double e = fabs((double)s.work[i] - (double)want[i]);
        if (e > err) err = e;
    }
    CHECK(err == 0, "penalised logits differ from the formulas by %g", err);
    CHECK(want[7] < want[20] && id == best && best == 20, "greedy takes the penalised argmax: %d (want %d)", id, best);
    CHECK(fabsf(want[3] - (-1.5f * 1.3f - 0.5f - 0.25f)) < 1e-6f, "a negative logit is multiplied: %g", want[3]);
    CHECK(fabsf(want[7] - (5.0f / 1.3f - 1.5f - 0.25f)) < 1e-6f, "a positive logit is divided: %g", want[7]);
    CHECK(fabsf(want[10] - logits[10] / 1.3f) < 1e-6f || fabsf(want[10] - logits[10] * 1.3f) < 1e-6f,
          "prompt-only tokens get only the repetition penalty");
    /* the scratch is clean for the next call: same call, same result */
    float first[V];
    memcpy(first, s.work, sizeof first);
    lm_sample_next(&s, logits, &p, &h, &r, NULL);
    CHECK(!memcmp(first, s.work, sizeof first), "second call gives the same penalised logits");
    /* frequency/presence only on the output: a prompt-only history changes nothing */
    struct lm_sampling_params fp = {.temperature = 0, .top_p = 1, .frequency_penalty = 2, .presence_penalty = 2};
    struct lm_token_history ph = {prompt, 5, NULL, 0};
    lm_sample_next(&s, logits, &fp, &ph, &r, NULL);
    CHECK(!memcmp(s.work, logits, sizeof logits), "frequency/presence ignore the prompt");
    /* no penalty: exactly lm_sample's draws */
    struct lm_sampling_params q = {.temperature = 0.9f, .top_p = 0.9f, .top_k = 20};
    struct lm_rng r1, r2;
    lm_rng_seed(&r1, 5);
    lm_rng_seed(&r2, 5);
    int same = 0;
    for (int t = 0; t < 200; t++) same += lm_sample_next(&s, logits, &q, &h, &r1, NULL) == lm_sample(&s, logits, &q, &r2);
    CHECK(same == 200, "without penalties lm_sample_next draws as lm_sample (%d/200)", same);
    lm_sampler_free(&s);
}

static void test_min_p(void) {
    enum { V = 6, N = 400000 };
    const float logits[V] = {2.0f, 1.5f, 0.1f, -0.4f, 1.0f, -3.0f};
    const double T = 0.8, min_p = 0.25;
    bool keep[V];
    for (int i = 0; i < V; i++) keep[i] = exp((logits[i] - 2.0) / T) >= min_p;
    CHECK(keep[0] && keep[1] && keep[4] && !keep[2] && !keep[3] && !keep[5], "the hand-picked min_p set");
    double want[V];
    softmax_over(logits, V, T, keep, want);
    struct lm_sampling_params p = {.temperature = (float)T, .top_p = 1, .min_p = (float)min_p};
    double err = max_freq_err(logits, V, &p, want, N, 99);
    CHECK(err < 0.004, "min_p draw frequencies off by %g", err);
}

static int g_cmp_lp_n;
static const float *g_cmp_lp;
static int cmp_lp(const void *a, const void *b) {
    int ia = *(const int *)a, ib = *(const int *)b;
    if (g_cmp_lp[ia] != g_cmp_lp[ib]) return g_cmp_lp[ia] > g_cmp_lp[ib] ? -1 : 1;
    return ia - ib;
}

static void test_logprobs(void) {
    enum { V = 3000 };
    float *logits = malloc(V * sizeof *logits);
    int *order = malloc(V * sizeof *order);
    struct lm_rng r;
    lm_rng_seed(&r, 21);
    for (int i = 0; i < V; i++) logits[i] = randn(&r) * 3;
    logits[5] = -INFINITY;
    logits[100] = logits[200] = logits[300] = 12; /* a three-way tie at the top */
    double max = 12, sum = 0;
    for (int i = 0; i < V; i++)
        if (logits[i] > -INFINITY) sum += exp(logits[i] - max);
    double lse = max + log(sum);
    for (int i = 0; i < V; i++) order[i] = i;
    g_cmp_lp = logits;
    g_cmp_lp_n = V;
    qsort(order, V, sizeof *order, cmp_lp);
    struct lm_token_logprob lp;
    lm_logprobs_of(logits, V, 42, 20, &lp);
    CHECK(lp.id == 42 && fabs(lp.logprob - (logits[42] - lse)) < 1e-5, "logprob of id 42: %g want %g", lp.logprob,
          logits[42] - lse);
    CHECK(lp.n_top == 20, "20 alternatives");
    int bad = 0;
    for (int k = 0; k < lp.n_top; k++)
        bad += lp.top_id[k] != order[k] || fabs(lp.top_logprob[k] - (logits[order[k]] - lse)) > 1e-5;
    CHECK(bad == 0 && lp.top_id[0] == 100 && lp.top_id[1] == 200 && lp.top_id[2] == 300,
          "top 20 = a full sort (ties by lower id): %d differ", bad);
    lm_logprobs_of(logits, V, 5, 0, &lp);
    CHECK(lp.n_top == 0 && isinf(lp.logprob) && lp.logprob < 0, "masked token: -inf, no alternatives");
    /* through lm_sample_next: the chosen id's logprob of the raw logits, penalties or not */
    struct lm_sampler s;
    lm_sampler_init(&s, V);
    struct lm_sampling_params p = {.temperature = 0, .top_p = 1, .logprobs = true, .top_logprobs = 3,
                                   .repetition_penalty = 2.0f};
    const int32_t hist[] = {100, 200};
    struct lm_token_history h = {hist, 2, NULL, 0};
    int32_t id = lm_sample_next(&s, logits, &p, &h, &r, &lp);
    CHECK(id == 300 && lp.id == 300 && fabs(lp.logprob - (12 - lse)) < 1e-5 && lp.n_top == 3 && lp.top_id[0] == 100,
          "logprobs are of the raw logits (id %d, lp %g, top0 %d)", id, lp.logprob, lp.top_id[0]);
    lm_sampler_free(&s);
    struct lm_logprob_list l = {0};
    for (int i = 0; i < 40; i++) lm_logprob_list_push(&l, &lp);
    CHECK(l.n == 40 && l.v[39].id == 300, "logprob list");
    lm_logprob_list_free(&l);
    free(order);
    free(logits);
}

int main(void) {
    test_penalties();
    test_min_p();
    test_logprobs();
    test_rng();
    test_greedy();
    test_seeded();
    test_distribution();
    test_nucleus_large();
    return check_exit("test_sampler");
}
