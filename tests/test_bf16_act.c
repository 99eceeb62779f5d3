/* test_bf16_act.c: the bf16 path of bfloat16 weights (backend/cpu/ops.h, LM_BF16_ACT:
 * activations rounded to bfloat16, VDPBF16PS's pair chain; LM_CPU_BF16_ACT=1), on the tiny
 * model (bf16 weights) against the float32 chain (LM_BF16_F32, the default, the path that
 * matches transformers' float32 reference):
 *   - accuracy: top-1 agreement and mean KL divergence over every position of the reference
 *     prompts, within stated bounds (the cost of the activations' 8-bit mantissa);
 *   - the fast kernels against the scalar reference on the whole model (short prompts);
 *   - batch invariance on the model: a prompt run in one call and one token a call gives the
 *     same last logits, bit for bit.
 * The kernels' bits on every target are test_kernels' (test_bf16_act there).
 * LM_LINK: lm_family lm_format lm_text lm_backend lm_base
 * LM_LABEL: model */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "check.h"
#include "family/model.h"

#define TEST_RNG_SEED 0x6a09e667f3bcc908ull
#include "fixtures.h"

/* Stated bounds on the tiny model (measured: see the run's stderr line and
 * docs/perf-notes-cpu.md, "bf16 activations"). */
enum { PIECE = 64 };
static const double k_top1_min = 0.97, k_mean_kl_max = 2e-4;

/* Logits of every position of ids under path p, PIECE tokens a call. */
static float *all_logits(struct lm_model *m, const struct lm_ids *ids, enum lm_bf16_path p, int piece) {
    const int vocab = lm_model_config(m)->vocab_size;
    float *out = malloc(sizeof(float) * (size_t)vocab * ids->n);
    struct lm_seq *s;
    lm_cpu_set_bf16_path(p);
    CHECK(lm_seq_create(m, (int)ids->n, &s) == LM_OK, "seq: %s", lm_error_message());
    for (int done = 0; done < (int)ids->n; done += piece) {
        int k = (int)ids->n - done < piece ? (int)ids->n - done : piece;
        CHECK(lm_seq_forward(s, ids->v + done, k, out + (size_t)done * vocab, true) == LM_OK, "forward: %s",
              lm_error_message());
    }
    lm_seq_destroy(s);
    return out;
}

int main(void) {
    struct lm_model *m = open_tiny_model(), *ms = NULL;
    struct lm_model_open_params ps = lm_model_default_open_params();
    ps.scalar_kernels = true;
    ps.n_threads = 1;
    CHECK(lm_model_open(TINY_MODEL, &ps, &ms) == LM_OK, "open scalar: %s", lm_error_message());
    if (!m || !ms) return check_exit("test_bf16_act");
    struct lm_model_info info;
    lm_model_info(m, &info);
    CHECK(!strcmp(info.weight_dtype, "bf16"), "tiny model weights %s (the test needs bf16)", info.weight_dtype);
    struct ref_case *cases;
    const int np = ref_cases_load(&cases), vocab = lm_model_config(m)->vocab_size;
    CHECK(np == 10, "%d prompts", np);
    long pos = 0, agree = 0;
    double kl_sum = 0, kl_max = 0, worst_scalar = 0;
    int invariant = 0, tried = 0;
    for (int c = 0; c < np; c++) {
        const struct lm_ids *ids = &cases[c].prompt;
        float *a = all_logits(m, ids, LM_BF16_F32, PIECE), *b = all_logits(m, ids, LM_BF16_ACT, PIECE);
        for (size_t i = 0; i < ids->n; i++) {
            const float *ra = a + i * vocab, *rb = b + i * vocab;
            agree += argmax(ra, vocab) == argmax(rb, vocab);
            double kv = kl(ra, rb, vocab);
            kl_sum += kv;
            kl_max = fmax(kl_max, kv);
            pos++;
        }
        const float *last = b + (ids->n - 1) * vocab;
        if (ids->n <= 100) { /* the scalar kernels and one token a call are slow: short prompts */
            float *sc = all_logits(ms, ids, LM_BF16_ACT, PIECE), *one = all_logits(m, ids, LM_BF16_ACT, 1);
            double e = rel_err(last, sc + (ids->n - 1) * vocab, vocab);
            worst_scalar = fmax(worst_scalar, e);
            CHECK(e <= 1e-4, "%s: bf16 path fast vs scalar kernels: %g", cases[c].name, e);
            tried++;
            invariant += !memcmp(last, one + (ids->n - 1) * vocab, sizeof(float) * vocab);
            free(sc), free(one);
        }
        free(a), free(b);
    }
    ref_cases_free(cases, np);
    const double top1 = (double)agree / (double)pos, mean_kl = kl_sum / (double)pos;
    fprintf(stderr,
            "tiny model, bf16 weights, bf16 activations vs float32 over %ld positions: top-1 agreement "
            "%.4f, mean KL %.3g nats (max %.3g); fast vs scalar kernels %.3g; %d of %d prompts the same "
            "bits one token a call (kernels: %s)\n",
            pos, top1, mean_kl, kl_max, worst_scalar, invariant, tried, lm_cpu_ops_fast()->name);
    CHECK(top1 >= k_top1_min, "top-1 agreement %.4f < %.2f", top1, k_top1_min);
    CHECK(mean_kl <= k_mean_kl_max, "mean KL %.3g > %.3g", mean_kl, k_mean_kl_max);
    CHECK(tried > 0 && invariant == tried, "batch invariance: %d of %d prompts", invariant, tried);
    lm_model_close(m);
    lm_model_close(ms);
    return check_exit("test_bf16_act");
}
