/* test_model.c: the Qwen3 forward pass against transformers' logits for the tiny checkpoint
 * (tests/data/fixtures/tiny_qwen3_reference: float64 HF eager attention), greedy decoding with
 * the KV cache, one-call vs chunked prefill, fast vs scalar kernels, mapped vs copied weights,
 * and the model/sequence API's error paths.
 * LM_LINK: lm_family lm_format lm_text lm_backend lm_base
 * LM_LABEL: model */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/file.h"
#include "check.h"
#include "family/model.h"
#include "family/qwen3/model.h"
#include "fixtures.h"

#define TOL 2e-5

/* Top 10 of x by value (highest first; ties to the lower id). */
static void top10(const float *x, int n, int32_t *ids) {
    for (int r = 0; r < 10; r++) ids[r] = -1;
    for (int i = 0; i < n; i++) {
        int r = 10;
        while (r > 0 && (ids[r - 1] < 0 || x[i] > x[ids[r - 1]])) r--;
        if (r >= 10) continue;
        memmove(ids + r + 1, ids + r, sizeof *ids * (9 - r));
        ids[r] = i;
    }
}

static double g_worst_topk, g_worst_last;

/* Checks one position's logits row against the reference top 10. */
static void check_topk(const struct ref_case *c, size_t p, const float *row, int vocab) {
    double mx = 0;
    for (int i = 0; i < vocab; i++) mx = fmax(mx, fabs(row[i]));
    double tol = TOL * mx;
    int32_t ours[10];
    top10(row, vocab, ours);
    for (int r = 0; r < 10; r++) {
        int32_t id = c->topk_ids[p][r];
        double ref = c->topk_logits[p][r], err = fabs(row[id] - ref);
        g_worst_topk = fmax(g_worst_topk, err / mx);
        CHECK(err <= tol, "%s pos %zu rank %d id %d: logit %.9g, reference %.9g (tol %.3g)", c->name,
              p, r, id, row[id], ref, tol);
        /* Our ranking: same id, or a tie with the reference logit at that rank. */
        CHECK(fabs(row[ours[r]] - ref) <= tol, "%s pos %zu rank %d: our logit %.9g vs reference %.9g",
              c->name, p, r, row[ours[r]], ref);
        if (ours[r] != id) {
            bool tie = (r > 0 && fabs(c->topk_logits[p][r - 1] - ref) <= 2 * tol) ||
                       (r < 9 && fabs(c->topk_logits[p][r + 1] - ref) <= 2 * tol);
            CHECK(tie, "%s pos %zu rank %d: id %d, reference %d (no tie)", c->name, p, r, ours[r], id);
        }
    }
}

static float *read_last_logits(const struct ref_case *c, int vocab) {
    char path[512];
    snprintf(path, sizeof path, REF_DIR "%s", c->last_file);
    struct lm_buf b = {0};
    if (lm_file_read(path, &b) != LM_OK || b.len != (size_t)vocab * 4) {
        CHECK(0, "%s: cannot read %zu floats", path, (size_t)vocab);
        lm_buf_free(&b);
        return NULL;
    }
    float *x = malloc(b.len);
    memcpy(x, b.p, b.len);
    lm_buf_free(&b);
    return x;
}

/* Every position's top 10, the last logits and the greedy continuation, for one case. */
static void check_case(struct lm_model *m, const struct ref_case *c) {
    const int vocab = lm_model_config(m)->vocab_size, n = (int)c->prompt.n;
    struct lm_seq *s;
    CHECK(lm_seq_create(m, n + (int)c->greedy.n, &s) == LM_OK, "seq create: %s", lm_error_message());
    /* All positions, fed in pieces of at most 64 tokens (bounded logits buffer). */
    const int piece = 64;
    float *logits = malloc(sizeof(float) * (size_t)piece * vocab);
    for (int done = 0; done < n; done += piece) {
        int k = n - done < piece ? n - done : piece;
        lm_status rc = lm_seq_forward(s, c->prompt.v + done, k, logits, true);
        CHECK(rc == LM_OK, "%s forward: %s", c->name, lm_error_message());
        for (int i = 0; i < k; i++) check_topk(c, (size_t)(done + i), logits + (size_t)i * vocab, vocab);
        if (done + k == n) {
            float *ref = read_last_logits(c, vocab);
            if (ref) {
                double e = rel_norm(logits + (size_t)(k - 1) * vocab, ref, vocab);
                g_worst_last = fmax(g_worst_last, e);
                CHECK(e <= TOL, "%s last logits: ||d||/||ref|| = %.3g", c->name, e);
                free(ref);
            }
        }
    }
    /* Greedy with the KV cache: prefill in one call, then one token at a time. */
    lm_seq_truncate(s, 0);
    CHECK(lm_seq_len(s) == 0, "truncate to 0");
    CHECK(lm_seq_forward(s, c->prompt.v, n, logits, false) == LM_OK, "prefill: %s", lm_error_message());
    int bad = -1;
    for (size_t t = 0; t < c->greedy.n; t++) {
        int32_t id = argmax(logits, vocab);
        if (id != c->greedy.v[t] && bad < 0) bad = (int)t;
        if (t + 1 < c->greedy.n) lm_seq_forward(s, &id, 1, logits, false);
    }
    CHECK(bad < 0, "%s: greedy id %d differs from the reference", c->name, bad);
    CHECK(lm_seq_len(s) == n + (int)c->greedy.n - 1, "seq len after greedy");
    free(logits);
    lm_seq_destroy(s);
}

/* Last-position logits of `ids` run through lm_seq_forward in pieces of the given sizes. */
static float *last_logits_chunked(struct lm_model *m, const struct lm_ids *ids, const int *pieces) {
    const int vocab = lm_model_config(m)->vocab_size;
    float *out = malloc(sizeof(float) * vocab);
    struct lm_seq *s;
    lm_seq_create(m, (int)ids->n, &s);
    int done = 0;
    for (int i = 0; done < (int)ids->n; i++) {
        int k = pieces && pieces[i] ? pieces[i] : (int)ids->n - done;
        if (k > (int)ids->n - done) k = (int)ids->n - done;
        CHECK(lm_seq_forward(s, ids->v + done, k, out, false) == LM_OK, "forward: %s",
              lm_error_message());
        done += k;
    }
    lm_seq_destroy(s);
    return out;
}

static void test_errors(struct lm_model *m, const struct ref_case *c) {
    const struct lm_model_config *cfg = lm_model_config(m);
    struct lm_seq *s;
    CHECK(lm_seq_create(m, cfg->max_position_embeddings + 1, &s) == LM_ERR_RANGE, "capacity limit");
    CHECK(lm_seq_create(m, 0, &s) == LM_ERR_INVALID, "capacity 0");
    CHECK(lm_seq_create(m, 8, &s) == LM_OK, "create");
    CHECK(lm_seq_capacity(s) == 8, "capacity");
    float *logits = malloc(sizeof(float) * cfg->vocab_size * 9);
    int32_t ids[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    CHECK(lm_seq_forward(s, ids, 9, logits, false) == LM_ERR_RANGE, "over capacity");
    CHECK(strstr(lm_error_message(), "capacity") != NULL, "message: %s", lm_error_message());
    int32_t bad[2] = {5, cfg->vocab_size};
    CHECK(lm_seq_forward(s, bad, 2, logits, false) == LM_ERR_INVALID, "id outside the vocab");
    CHECK(lm_seq_len(s) == 0, "failed forwards leave the cache alone");
    lm_seq_destroy(s);
    free(logits);

    /* Rewinding the cache and re-running the tail gives the same logits. */
    const int vocab = cfg->vocab_size, n = (int)c->prompt.n;
    float *a = malloc(sizeof(float) * vocab), *b = malloc(sizeof(float) * vocab);
    CHECK(lm_seq_create(m, n, &s) == LM_OK, "create");
    lm_seq_forward(s, c->prompt.v, n, a, false);
    lm_seq_truncate(s, n - 5);
    CHECK(lm_seq_len(s) == n - 5, "truncate");
    lm_seq_forward(s, c->prompt.v + n - 5, 5, b, false);
    CHECK(rel_norm(b, a, vocab) <= 1e-6, "rewind and rerun: %g", rel_norm(b, a, vocab));
    lm_seq_destroy(s);
    free(a), free(b);
}

int main(void) {
    struct ref_case *cases = NULL;
    int n_cases = ref_cases_load(&cases);
    CHECK(n_cases == 10, "%d reference cases", n_cases);

    struct lm_model *m = open_tiny_model();
    if (!m) return check_exit("test_model");
    const struct lm_model_config *cfg = lm_model_config(m);
    CHECK(!strcmp(cfg->model_type, "qwen3") && cfg->hidden_size == 32 && cfg->num_hidden_layers == 3 &&
              cfg->num_attention_heads == 4 && cfg->num_key_value_heads == 2 && cfg->head_dim == 16 &&
              cfg->intermediate_size == 96 && cfg->vocab_size == 151936 && cfg->tie_word_embeddings &&
              cfg->rope_theta == 1e6 && cfg->bos_token_id == 151643 &&
              fabsf(cfg->rms_norm_eps - 1e-6f) < 1e-12f,
          "config values");
    const struct lm_gen_defaults *g = lm_model_gen_defaults(m);
    CHECK(g->n_eos == 1 && g->eos_token_ids[0] == 151645, "eos ids (%d)", g->n_eos);
    CHECK(g->temperature < 0 && g->top_p < 0 && g->top_k < 0, "no sampling defaults");
    CHECK(lm_model_tasks(m) == (LM_TASK_TEXT_GENERATION | LM_TASK_TEXT_CONVERSATION), "tasks");
    CHECK(!strcmp(lm_model_name(m), "tiny-qwen3"), "name %s", lm_model_name(m));
    CHECK(lm_model_tokenizer(m) != NULL, "tokenizer");
    struct lm_model_info info;
    lm_model_info(m, &info);
    CHECK(!strcmp(info.weight_dtype, "bf16") && !info.weights_mapped, "info %s", info.weight_dtype);
    /* embed 151936x32 + 3 layers x (2x32 + 64x32 + 2x32x32 + 2x16 + 32x64 + 3x96x32) + 32 */
    CHECK(info.n_params == 151936L * 32 + 3L * (64 + 2048 + 2048 + 32 + 2048 + 9216) + 32,
          "params %ld", info.n_params);

    for (int i = 0; i < n_cases; i++) check_case(m, &cases[i]);
    fprintf(stderr, "fast kernels (%s, %d threads): worst top-10 |d|/max|logit| = %.3g, "
            "worst last-logits ||d||/||ref|| = %.3g\n",
            info.kernels, info.n_threads, g_worst_topk, g_worst_last);

    /* The longest case: one call vs pieces (the batched path vs the incremental one). */
    const struct ref_case *lc = &cases[0];
    for (int i = 1; i < n_cases; i++)
        if (cases[i].prompt.n > lc->prompt.n) lc = &cases[i];
    int vocab = cfg->vocab_size;
    float *one = last_logits_chunked(m, &lc->prompt, NULL);
    const int pieces[] = {1, 7, 100, 300, 1, 1, 2, 0};
    float *chunked = last_logits_chunked(m, &lc->prompt, pieces);
    int ones[1024];
    for (int i = 0; i < 1024; i++) ones[i] = 1;
    ones[lc->prompt.n > 1023 ? 1023 : lc->prompt.n] = 0;
    float *single = last_logits_chunked(m, &lc->prompt, ones);
    CHECK(rel_norm(chunked, one, vocab) <= 1e-6, "one call vs pieces: %g", rel_norm(chunked, one, vocab));
    CHECK(rel_norm(single, one, vocab) <= 1e-6, "one call vs token by token: %g",
          rel_norm(single, one, vocab));
    test_errors(m, lc);

    /* K/V rounded to bf16 as they enter the cache (lm_qwen3_set_cpu_kv_bf16, the CUDA cache's
     * rounding): the logits move, by about bf16's rounding (2^-9) and not more, and turning it off
     * gives the float32 cache's bits again. */
    CHECK(!lm_qwen3_cpu_kv_bf16(), "K/V rounding to bf16 must be off by default");
    lm_qwen3_set_cpu_kv_bf16(true);
    float *kvb = last_logits_chunked(m, &lc->prompt, NULL);
    lm_qwen3_set_cpu_kv_bf16(false);
    float *kvf = last_logits_chunked(m, &lc->prompt, NULL);
    const double ekv = rel_norm(kvb, one, vocab);
    CHECK(ekv > 0 && ekv < 1e-2, "K/V rounded to bf16: relative change of the logits %g (want > 0, < 1e-2)", ekv);
    CHECK(memcmp(kvf, one, sizeof(float) * vocab) == 0, "K/V rounding off again: the logits differ from before");
    fprintf(stderr, "K/V rounded to bf16: the last logits move by %.3g (relative)\n", ekv);
    free(kvb), free(kvf);

    /* Scalar reference kernels, one thread; and weights mapped in place. */
    struct lm_model *ms, *mm;
    struct lm_model_open_params ps = lm_model_default_open_params(), pm = ps;
    ps.scalar_kernels = true;
    ps.n_threads = 1;
    pm.map_weights = true;
    CHECK(lm_model_open(TINY_MODEL, &ps, &ms) == LM_OK, "open scalar: %s", lm_error_message());
    CHECK(lm_model_open(TINY_MODEL, &pm, &mm) == LM_OK, "open mapped: %s", lm_error_message());
    lm_model_info(mm, &info);
    CHECK(info.weights_mapped, "mapped");
    double worst_scalar = 0;
    for (int i = 0; i < n_cases; i++) {
        float *a = last_logits_chunked(m, &cases[i].prompt, NULL);
        float *b = last_logits_chunked(ms, &cases[i].prompt, NULL);
        float *c = last_logits_chunked(mm, &cases[i].prompt, NULL);
        double e = rel_norm(a, b, vocab);
        worst_scalar = fmax(worst_scalar, e);
        CHECK(e <= 1e-5, "%s: fast vs scalar kernels %g", cases[i].name, e);
        CHECK(memcmp(a, c, sizeof(float) * vocab) == 0, "%s: mapped vs copied weights differ",
              cases[i].name);
        float *ref = read_last_logits(&cases[i], vocab);
        if (ref) CHECK(rel_norm(b, ref, vocab) <= TOL, "%s: scalar vs reference %g", cases[i].name,
                       rel_norm(b, ref, vocab));
        free(a), free(b), free(c), free(ref);
    }
    fprintf(stderr, "fast vs scalar kernels: worst ||d||/||scalar|| = %.3g\n", worst_scalar);
    lm_model_close(ms);
    lm_model_close(mm);

    free(one), free(chunked), free(single);
    lm_model_close(m);
    ref_cases_free(cases, n_cases);
    return check_exit("test_model");
}
