/* sampler.c: see sampler.h.
 *
 * Penalties (lm_sample_next) follow vLLM's apply_penalties: on a copy of the raw logits, the
 * repetition penalty once per distinct token of prompt + output (divide a positive logit,
 * multiply a non-positive one), then logit -= frequency_penalty * count and logit -=
 * presence_penalty for every distinct output token, in float32. min_p follows HF's
 * MinPLogitsWarper after top_p: a token stays when its probability is >= min_p times the
 * largest (a ratio, so the normalisation does not matter).
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
    memset(s, 0, sizeof *s);
    s->vocab = vocab;
    s->probs = malloc((size_t)vocab * sizeof *s->probs);
    s->index = malloc((size_t)vocab * sizeof *s->index);
    if (!s->probs || !s->index) abort(); /* request-sized scratch, as lm_buf does */
}

void lm_sampler_free(struct lm_sampler *s) {
    if (!s) return;
    free(s->probs);
    free(s->index);
    free(s->work);
    free(s->count);
    free(s->mark);
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

    /* min_p: probs[] are exp((l - max) / T), so the most likely candidate (always kept) has 1
     * and a token's probability relative to it is probs[j] itself. */
    if (p->min_p > 0 && n > 1) {
        int m = 0;
        double kept = 0;
        for (int j = 0; j < n; j++)
            if (s->probs[j] >= p->min_p) {
                s->index[m] = s->index[j];
                kept += s->probs[m] = s->probs[j];
                m++;
            }
        n = m;
        sum = kept;
    }

    double u = lm_rng_uniform(rng) * sum, acc = 0;
    for (int j = 0; j < n; j++) {
        acc += s->probs[j];
        if (u < acc) return s->index[j];
    }
    return s->index[n - 1]; /* u landed in the rounding gap at the very top */
}

/* ---- penalties and logprobs ------------------------------------------------------------- */

bool lm_sampling_needs_history(const struct lm_sampling_params *p) {
    return p->presence_penalty != 0 || p->frequency_penalty != 0 ||
           (p->repetition_penalty > 0 && p->repetition_penalty != 1);
}

/* Writes the penalised logits into s->work (vLLM's apply_penalties). */
static void apply_penalties(struct lm_sampler *s, const float *logits,
                            const struct lm_sampling_params *p, const struct lm_token_history *h) {
    const int V = s->vocab;
    if (!s->work) {
        s->work = malloc((size_t)V * sizeof *s->work);
        s->count = calloc((size_t)V, sizeof *s->count);
        s->mark = calloc((size_t)V, 1);
        if (!s->work || !s->count || !s->mark) abort(); /* request-sized scratch, as lm_buf does */
    }
    memcpy(s->work, logits, (size_t)V * sizeof *s->work);
    float *w = s->work;
    const float rep = p->repetition_penalty;
    if (rep > 0 && rep != 1) {
        const int32_t *seqs[2] = {h->prompt, h->output};
        const size_t ns[2] = {h->n_prompt, h->n_output};
        for (int k = 0; k < 2; k++)
            for (size_t i = 0; i < ns[k]; i++) {
                int32_t id = seqs[k][i];
                if (id < 0 || id >= V || s->mark[id]) continue;
                s->mark[id] = 1;
                w[id] = w[id] > 0 ? w[id] / rep : w[id] * rep;
            }
        for (int k = 0; k < 2; k++) /* leave the marks zero for the next call */
            for (size_t i = 0; i < ns[k]; i++) {
                int32_t id = seqs[k][i];
                if (id >= 0 && id < V) s->mark[id] = 0;
            }
    }
    if (p->frequency_penalty != 0 || p->presence_penalty != 0) {
        for (size_t i = 0; i < h->n_output; i++) {
            int32_t id = h->output[i];
            if (id >= 0 && id < V) s->count[id]++;
        }
        for (size_t i = 0; i < h->n_output; i++) {
            int32_t id = h->output[i];
            if (id < 0 || id >= V || s->count[id] == 0) continue;
            w[id] -= p->frequency_penalty * (float)s->count[id];
            w[id] -= p->presence_penalty;
            s->count[id] = 0; /* once per distinct token; also leaves the counts zero */
        }
    }
}

/* Heap order for the top logprobs: a is worse than b (lower value, or equal and higher id). */
static inline bool worse(float va, int32_t ia, float vb, int32_t ib) {
    return va < vb || (va == vb && ia > ib);
}

void lm_logprobs_of(const float *logits, int vocab, int32_t id, int top, struct lm_token_logprob *lp) {
    assert(vocab > 0 && id >= 0 && id < vocab);
    if (top < 0) top = 0;
    if (top > LM_MAX_TOP_LOGPROBS) top = LM_MAX_TOP_LOGPROBS;
    if (top > vocab) top = vocab;
    float max = -INFINITY;
    for (int i = 0; i < vocab; i++)
        if (logits[i] > max) max = logits[i];
    double sum = 0;
    if (max > -INFINITY)
        for (int i = 0; i < vocab; i++)
            if (logits[i] > -INFINITY) sum += exp((double)logits[i] - (double)max);
    const double lse = max > -INFINITY ? (double)max + log(sum) : 0;

    /* the `top` largest logits in a min-heap (root = the worst kept) */
    float hv[LM_MAX_TOP_LOGPROBS];
    int32_t hi[LM_MAX_TOP_LOGPROBS];
    int h = 0;
    for (int i = 0; i < vocab && top > 0; i++) {
        float v = logits[i];
        if (v != v) continue;
        int j;
        if (h < top) {
            j = h++;
            while (j > 0 && worse(v, i, hv[(j - 1) / 2], hi[(j - 1) / 2])) {
                hv[j] = hv[(j - 1) / 2], hi[j] = hi[(j - 1) / 2];
                j = (j - 1) / 2;
            }
        } else if (worse(hv[0], hi[0], v, i)) {
            j = 0;
            for (;;) {
                int c = 2 * j + 1;
                if (c >= h) break;
                if (c + 1 < h && worse(hv[c + 1], hi[c + 1], hv[c], hi[c])) c++;
                if (!worse(hv[c], hi[c], v, i)) break;
                hv[j] = hv[c], hi[j] = hi[c];
                j = c;
            }
        } else {
            continue;
        }
        hv[j] = v, hi[j] = i;
    }
    /* best first: insertion sort of at most LM_MAX_TOP_LOGPROBS entries */
    for (int k = 1; k < h; k++) {
        float v = hv[k];
        int32_t i = hi[k];
        int j = k;
        while (j > 0 && worse(hv[j - 1], hi[j - 1], v, i)) {
            hv[j] = hv[j - 1], hi[j] = hi[j - 1];
            j--;
        }
        hv[j] = v, hi[j] = i;
    }
    lp->n_top = h;
    for (int k = 0; k < h; k++) {
        lp->top_id[k] = hi[k];
        lp->top_logprob[k] = hv[k] > -INFINITY ? (float)((double)hv[k] - lse) : -INFINITY;
    }
    lp->id = id;
    lp->logprob = logits[id] > -INFINITY ? (float)((double)logits[id] - lse) : -INFINITY;
}

int32_t lm_sample_next(struct lm_sampler *s, const float *logits, const struct lm_sampling_params *p,
                       const struct lm_token_history *h, struct lm_rng *rng,
                       struct lm_token_logprob *lp) {
    const float *l = logits;
    if (h && (h->n_prompt || h->n_output) && lm_sampling_needs_history(p)) {
        apply_penalties(s, logits, p, h);
        l = s->work;
    }
    int32_t id = lm_sample(s, l, p, rng);
    if (lp && p->logprobs) lm_logprobs_of(logits, s->vocab, id, p->top_logprobs, lp);
    return id;
}

void lm_logprob_list_push(struct lm_logprob_list *l, const struct lm_token_logprob *e) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        struct lm_token_logprob *v = realloc(l->v, cap * sizeof *v);
        if (!v) abort(); /* as lm_buf does */
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = *e;
}

void lm_logprob_list_free(struct lm_logprob_list *l) {
    if (!l) return;
    free(l->v);
    memset(l, 0, sizeof *l);
}
