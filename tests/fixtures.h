/* fixtures.h: helpers shared by tests/test_*.c (beside check.h).
 *   - only where TEST_RNG_SEED is defined before this is included: frand/fill, a xorshift64
 *     generator (uniform in [-1, 1)) starting from that seed, and rel_err (max |a - b| / max |b|);
 *   - argmax, rel_norm (||a - ref|| / ||ref||), kl (KL divergence of two logit rows' softmaxes)
 *     and last_logits (one forward pass of the model);
 *   - the reference cases of the tiny checkpoint (REF_DIR "cases.jsonl": transformers, float64):
 *     ref_cases_load / ref_cases_free; open_tiny_model.
 * Every function is static inline: a test links only the libraries of what it calls. */
#ifndef LM_TESTS_FIXTURES_H
#define LM_TESTS_FIXTURES_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/file.h"
#include "base/json.h"
#include "check.h"
#include "family/model.h"

/* ---- random inputs ---- */

#ifdef TEST_RNG_SEED
static uint64_t g_rng = TEST_RNG_SEED;

static inline float frand(void) { /* uniform in [-1, 1) */
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (float)((g_rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static inline void fill(float *x, long n, float scale) {
    for (long i = 0; i < n; i++)
        x[i] = frand() * scale;
}

/* max |a - b| / max |b| over n values (INFINITY where a difference is NaN). */
static inline double rel_err(const float *a, const float *b, long n) {
    double num = 0, den = 0;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > num || isnan(d)) num = isnan(d) ? INFINITY : d;
        if (fabs(b[i]) > den) den = fabs(b[i]);
    }
    return den ? num / den : num;
}
#endif

/* ---- logits ---- */

static inline int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* ||a - ref|| / ||ref|| over n values. */
static inline double rel_norm(const float *a, const float *ref, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / den);
}

/* KL(p || q) of the softmaxes of two logit rows, in nats. */
static inline double kl(const float *p, const float *q, int n) {
    double mp = -INFINITY, mq = -INFINITY, sp = 0, sq = 0, k = 0;
    for (int i = 0; i < n; i++) mp = fmax(mp, p[i]), mq = fmax(mq, q[i]);
    for (int i = 0; i < n; i++) sp += exp(p[i] - mp), sq += exp(q[i] - mq);
    for (int i = 0; i < n; i++) {
        double lp = p[i] - mp - log(sp), lq = q[i] - mq - log(sq);
        k += exp(lp) * (lp - lq);
    }
    return k;
}

/* The last position's logits of `ids` in one forward call (caller frees). */
static inline float *last_logits(struct lm_model *m, const struct lm_ids *ids) {
    float *out = malloc(sizeof(float) * (size_t)lm_model_config(m)->vocab_size);
    struct lm_seq *s;
    CHECK(lm_seq_create(m, (int)ids->n, &s) == LM_OK, "seq: %s", lm_error_message());
    CHECK(lm_seq_forward(s, ids->v, (int)ids->n, out, false) == LM_OK, "forward: %s",
          lm_error_message());
    lm_seq_destroy(s);
    return out;
}

/* ---- the tiny checkpoint and its reference cases ---- */

#define REF_DIR TEST_DATA("fixtures/tiny_qwen3_reference/")

/* One line of REF_DIR "cases.jsonl". */
struct ref_case {
    char name[64];
    char last_file[128]; /* last_logits_file: float32 [vocab] under REF_DIR */
    struct lm_ids prompt, greedy;
    int32_t (*topk_ids)[10]; /* [prompt.n][10] */
    double (*topk_logits)[10];
    double margin[64]; /* greedy_top1_margin */
    size_t n_margin;
};

/* Reads every case into *out (ref_cases_free frees it); returns how many. CHECKs the read. */
static inline int ref_cases_load(struct ref_case **out) {
    struct lm_buf b = {0};
    *out = NULL;
    lm_status st = lm_file_read(REF_DIR "cases.jsonl", &b);
    CHECK(st == LM_OK, "cases: %s", lm_error_message());
    if (st != LM_OK) return 0;
    int n = 0;
    char *save = NULL;
    for (char *line = strtok_r(b.p, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        json_t *j = json_loads(line, 0, NULL);
        if (!j) continue;
        *out = realloc(*out, sizeof **out * (size_t)(n + 1));
        struct ref_case *c = &(*out)[n++];
        memset(c, 0, sizeof *c);
        snprintf(c->name, sizeof c->name, "%s", json_string_value(json_object_get(j, "name")));
        snprintf(c->last_file, sizeof c->last_file, "%s",
                 json_string_value(json_object_get(j, "last_logits_file")));
        lm_json_to_ids(json_object_get(j, "prompt_ids"), "prompt_ids", &c->prompt);
        lm_json_to_ids(json_object_get(j, "greedy_ids"), "greedy_ids", &c->greedy);
        json_t *ti = json_object_get(j, "topk_ids"), *tl = json_object_get(j, "topk_logits");
        c->topk_ids = calloc(c->prompt.n, sizeof *c->topk_ids);
        c->topk_logits = calloc(c->prompt.n, sizeof *c->topk_logits);
        for (size_t p = 0; p < c->prompt.n; p++)
            for (int r = 0; r < 10; r++) {
                json_t *id = json_array_get(json_array_get(ti, p), r);
                c->topk_ids[p][r] = (int32_t)json_integer_value(id);
                c->topk_logits[p][r] = json_number_value(json_array_get(json_array_get(tl, p), r));
            }
        json_t *mg = json_object_get(j, "greedy_top1_margin");
        for (size_t i = 0; i < json_array_size(mg) && i < 64; i++)
            c->margin[c->n_margin++] = json_number_value(json_array_get(mg, i));
        json_decref(j);
    }
    lm_buf_free(&b);
    return n;
}

static inline void ref_cases_free(struct ref_case *cs, int n) {
    for (int i = 0; i < n; i++) {
        lm_ids_free(&cs[i].prompt);
        lm_ids_free(&cs[i].greedy);
        free(cs[i].topk_ids);
        free(cs[i].topk_logits);
    }
    free(cs);
}

/* Opens TINY_MODEL with the default parameters; CHECKs it. NULL on failure. */
static inline struct lm_model *open_tiny_model(void) {
    struct lm_model *m = NULL;
    struct lm_model_open_params p = lm_model_default_open_params();
    lm_status rc = lm_model_open(TINY_MODEL, &p, &m);
    CHECK(rc == LM_OK, "open: %s", lm_error_message());
    return rc == LM_OK ? m : NULL;
}

#endif
