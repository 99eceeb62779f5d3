/* sampler.c: see sampler.h.
 *
 * Sampling follows Hugging Face transformers' LogitsProcessor chain for do_sample=True:
 * TemperatureLogitsWarper (logits / T), TopKLogitsWarper (keep logits >= the k-th largest, so
 * ties at the boundary stay), TopPLogitsWarper (sort ascending, drop tokens whose cumulative
 * probability is <= 1 - top_p, keep at least one), then a draw from the softmax of what is left.
 * In descending order the nucleus rule reads: token j stays while the probability mass of the
 * tokens ranked before it is < top_p. Ties in rank go to the lower id.
 *
 * Speed: top_k uses a size-k min-heap (O(V log k)). top_p without top_k would need a full sort
 * of the vocabulary; instead a histogram of log-probabilities finds the one bin where the
 * cumulative mass passes top_p, and only that bin's tokens are sorted (see lm_sample). The kept set
 * can differ from a full sort only for a token whose preceding mass is within 1e-9 (relative)
 * of top_p, far below the float32 rounding of the reference. */
#include "engine/sampler.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* splitmix64 (Steele, Lea & Flood 2014), the seeding generator Vigna recommends for xoshiro. */
static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void lm_rng_seed(struct lm_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t lm_rng_next(struct lm_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double lm_rng_uniform(struct lm_rng *r) { return (double)(lm_rng_next(r) >> 11) * 0x1.0p-53; }

void lm_sampler_init(struct lm_sampler *s, int vocab) {
    assert(vocab > 0);
    s->vocab = vocab;
    s->probs = malloc((size_t)vocab * sizeof *s->probs);
    s->index = malloc((size_t)vocab * sizeof *s->index);
    if (!s->probs || !s->index) abort(); /* request-sized scratch, as lm_buf does */
}

void lm_sampler_free(struct lm_sampler *s) {
    if (!s) return;
    free(s->probs);
    free(s->index);
    memset(s, 0, sizeof *s);
}

static int32_t argmax(const float *x, int n) {
    int32_t best = 0;
    float bv = -INFINITY;
    for (int i = 0; i < n; i++)
        if (x[i] > bv) bv = x[i], best = i; /* strict: the lowest id wins ties; NaN never wins */
    return best;
}

/* The k-th largest of x[0..n) (k <= n), ignoring NaN, using heap[k] as scratch (a min-heap). */
static float kth_largest(const float *x, int n, int k, float *heap) {
    int h = 0;
    for (int i = 0; i < n; i++) {
        float v = x[i];
        if (v != v) continue;
        if (h < k) { /* sift up */
            int j = h++;
            while (j > 0 && heap[(j - 1) / 2] > v) heap[j] = heap[(j - 1) / 2], j = (j - 1) / 2;
            heap[j] = v;
        } else if (v > heap[0]) { /* replace the root, sift down */
            int j = 0;
            for (;;) {
                int c = 2 * j + 1;
                if (c >= h) break;
                if (c + 1 < h && heap[c + 1] < heap[c]) c++;
                if (heap[c] >= v) break;
                heap[j] = heap[c], j = c;
            }
            heap[j] = v;
        }
    }
    return h ? heap[0] : -INFINITY;
}

/* Descending logit, then ascending id. */
static int by_logit_desc(const void *a, const void *b, void *ctx) {
    const float *l = ctx;
    int32_t ia = *(const int32_t *)a, ib = *(const int32_t *)b;
    if (l[ia] > l[ib]) return -1;
    if (l[ia] < l[ib]) return 1;
    return (ia > ib) - (ia < ib);
}

#define N_BINS 256
#define BIN_WIDTH 0.125 /* bins of log-probability (natural log) below the maximum */

/* The histogram bin of logit v, given the maximum and 1/T: floor((max - v) / T / BIN_WIDTH). */
static inline int bin_of(float v, float max, float inv_t) {
    float b = (max - v) * inv_t * (float)(1.0 / BIN_WIDTH);
    return b < N_BINS - 1 ? (int)b : N_BINS - 1;
}

int32_t lm_sample(struct lm_sampler *s, const float *logits, const struct lm_sampling_params *p,
                  struct lm_rng *rng) {
    const int V = s->vocab;
    if (!(p->temperature > 0)) return argmax(logits, V);
    const float inv_t = 1.0f / p->temperature;

    /* top_k: the candidates are the logits >= the k-th largest (Hugging Face keeps ties). */
    float cut = -INFINITY;
    if (p->top_k > 0 && p->top_k < V) cut = kth_largest(logits, V, p->top_k, s->probs);
    int n = 0;
    float max = -INFINITY;
    for (int i = 0; i < V; i++) {
        float v = logits[i];
        if (v >= cut && v > -INFINITY) { /* also drops NaN and masked (-inf) logits */
            s->index[n++] = i;
            if (v > max) max = v;
        }
    }
    if (n == 0) return argmax(logits, V); /* every logit -inf or NaN: nothing to draw from */

    /* Unnormalised probabilities exp((l - max) / T), scaled so the largest is 1. */
    double sum = 0;
    for (int j = 0; j < n; j++) sum += s->probs[j] = expf((logits[s->index[j]] - max) * inv_t);

    if (p->top_p < 1.0f && n > 1) {
        const double target = (p->top_p > 0 ? p->top_p : 0) * sum;
        int n_upper = 0; /* index[0, n_upper): certainly in the nucleus, left unsorted */
        int n_rank = n;  /* index[n_upper, n_upper + n_rank): to be ranked by sorting */
        if (n > 1024) {
            /* Histogram of log-probability below the maximum; `last` is the first bin where the
             * cumulative mass passes top_p. Tokens of earlier bins are ranked ahead of less than
             * top_p of the mass, so they are in; tokens of later bins are ranked after more than
             * top_p, so they are out; only the tokens of bin `last` need ranking. */
            double mass[N_BINS] = {0};
            for (int j = 0; j < n; j++) mass[bin_of(logits[s->index[j]], max, inv_t)] += s->probs[j];
            double acc = 0;
            int last = N_BINS - 1;
            for (int b = 0; b < N_BINS - 1; b++) {
                acc += mass[b];
                if (acc > target * (1 + 1e-9)) {
                    last = b;
                    break;
                }
            }
            int u = 0, e;
            for (int j = 0; j < n; j++) /* partition: earlier bins first ... */
                if (bin_of(logits[s->index[j]], max, inv_t) < last) {
                    int32_t t = s->index[u];
                    s->index[u++] = s->index[j], s->index[j] = t;
                }
            e = u;
            for (int j = u; j < n; j++) /* ... then bin `last`; the rest is dropped */
                if (bin_of(logits[s->index[j]], max, inv_t) == last) {
                    int32_t t = s->index[e];
                    s->index[e++] = s->index[j], s->index[j] = t;
                }
            n_upper = u;
            n_rank = e - u;
        }
        qsort_r(s->index + n_upper, (size_t)n_rank, sizeof *s->index, by_logit_desc, (void *)logits);
        double before = 0; /* mass of the tokens ranked ahead of j */
        for (int j = 0; j < n_upper; j++) before += s->probs[j] = expf((logits[s->index[j]] - max) * inv_t);
        int keep = n_upper;
        for (int j = n_upper; j < n_upper + n_rank; j++) {
            if (j > 0 && before >= target) break;
            before += s->probs[j] = expf((logits[s->index[j]] - max) * inv_t);
            keep++;
        }
        n = keep;
        sum = before;
    }

    double u = lm_rng_uniform(rng) * sum, acc = 0;
    for (int j = 0; j < n; j++) {
        acc += s->probs[j];
        if (u < acc) return s->index[j];
    }
    return s->index[n - 1]; /* u landed in the rounding gap at the very top */
}
