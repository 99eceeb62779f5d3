/* test_batch.c: batching must not change results.
 *
 * Kernels: the fast matmul gives every row the same bits at n = 1..16 as alone (odd k too), and
 * paged attention through a shuffled block table gives the bits of contiguous attention.
 * Model: prefill in one call, in chunks, and token by token give the same last logits, bit for
 * bit, through the paged forward. Scheduler (engine/sched.h, driven directly): every reference
 * prompt alone reproduces transformers' greedy ids; greedy requests give the same ids alone or
 * beside 1 to 15 others (arriving together or staggered, with chunked prefill mixed into the
 * decodes); seeded sampled requests give the same ids alone or batched; a KV pool so small that
 * sequences are preempted and recomputed still gives the same ids; cancellation frees blocks.
 * LM_LABEL: model
 * LM_LINK: lm_engine lm_family lm_format lm_text lm_backend lm_base */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "check.h"
#include "engine/sched.h"
#include "family/model.h"
#include "fixtures.h"

/* ---- kernels ---- */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float frand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) & 0xffffff) / (float)0x1000000 * 2.0f - 1.0f;
}

static void test_matmul_invariance(struct lm_pool *pool) {
    const struct lm_cpu_ops *f = lm_cpu_ops_fast();
    const int shapes[][2] = {{32, 96}, {37, 50}, {64, 7}, {100, 33}, {1024, 64}, {3, 5}};
    for (size_t c = 0; c < sizeof shapes / sizeof *shapes; c++) {
        int k = shapes[c][0], m = shapes[c][1];
        float *x = malloc(sizeof(float) * 16 * k), *wf = malloc(sizeof(float) * m * k);
        uint16_t *wb = malloc(sizeof(uint16_t) * m * k);
        for (int i = 0; i < 16 * k; i++)
            x[i] = frand();
        for (int i = 0; i < m * k; i++) {
            wf[i] = frand();
            wb[i] = lm_f32_to_bf16(wf[i]);
        }
        float *alone = malloc(sizeof(float) * 16 * m), *batch = malloc(sizeof(float) * 16 * m);
        for (int dt = 0; dt < 2; dt++) {
            const void *w = dt ? (const void *)wb : (const void *)wf;
            enum lm_dtype t = dt ? LM_DTYPE_BF16 : LM_DTYPE_F32;
            for (int i = 0; i < 16; i++)
                f->matmul(pool, alone + (size_t)i * m, x + (size_t)i * k, w, t, 1, k, m);
            int bad = 0;
            for (int n = 2; n <= 16; n++) {
                f->matmul(pool, batch, x, w, t, n, k, m);
                if (memcmp(batch, alone, sizeof(float) * n * m)) bad = n;
            }
            CHECK(bad == 0, "matmul k=%d m=%d %s: rows of n=%d differ from n=1", k, m,
                  lm_dtype_name(t), bad);
        }
        free(x), free(wf), free(wb), free(alone), free(batch);
    }
}

static void test_paged_attention(struct lm_pool *pool) {
    const struct lm_cpu_ops *f = lm_cpu_ops_fast(), *sc = lm_cpu_ops_scalar();
    const int nh = 4, nkv = 2, hd = 16, stride = nkv * hd, bs = 16;
    /* Two sequences: A with 37 cached positions and 5 new queries, B with 0 cached and 9 new. */
    const int len_a = 42, len_b = 9, n_blocks = 8;
    float *kc = calloc((size_t)n_blocks * bs * stride, sizeof(float));
    float *vc = calloc((size_t)n_blocks * bs * stride, sizeof(float));
    float *ka = malloc(sizeof(float) * len_a * stride),
          *va = malloc(sizeof(float) * len_a * stride);
    float *kb = malloc(sizeof(float) * len_b * stride),
          *vb = malloc(sizeof(float) * len_b * stride);
    for (int i = 0; i < len_a * stride; i++)
        ka[i] = frand(), va[i] = frand();
    for (int i = 0; i < len_b * stride; i++)
        kb[i] = frand(), vb[i] = frand();
    int32_t ta[3] = {5, 0, 3}, tb[1] = {6}; /* shuffled block tables */
    for (int t = 0; t < len_a; t++) {
        size_t row = (size_t)ta[t / bs] * bs + t % bs;
        memcpy(kc + row * stride, ka + (size_t)t * stride, sizeof(float) * stride);
        memcpy(vc + row * stride, va + (size_t)t * stride, sizeof(float) * stride);
    }
    for (int t = 0; t < len_b; t++) {
        size_t row = (size_t)tb[t / bs] * bs + t % bs;
        memcpy(kc + row * stride, kb + (size_t)t * stride, sizeof(float) * stride);
        memcpy(vc + row * stride, vb + (size_t)t * stride, sizeof(float) * stride);
    }
    const int na = 5, nb = 9, q_dim = nh * hd;
    float *q = malloc(sizeof(float) * (na + nb) * q_dim);
    for (int i = 0; i < (na + nb) * q_dim; i++)
        q[i] = frand();
    float *o_paged = malloc(sizeof(float) * (na + nb) * q_dim),
          *o_ref = malloc(sizeof(float) * (na + nb) * q_dim);
    float *o_scalar = malloc(sizeof(float) * (na + nb) * q_dim);
    float *scr = malloc(sizeof(float) * 64 * 64);
    struct lm_attn_seq seqs[2] = {{na, len_a - na, ta}, {nb, 0, tb}};
    f->attention_paged(pool, o_paged, q, kc, vc, seqs, 2, nh, nkv, hd, stride, bs, 0.25f, scr);
    sc->attention_paged(NULL, o_scalar, q, kc, vc, seqs, 2, nh, nkv, hd, stride, bs, 0.25f, scr);
    /* Contiguous reference: each sequence alone with the fast `attention`. */
    f->attention(pool, o_ref, q, ka, va, na, len_a - na, nh, nkv, hd, stride, 0.25f, scr);
    f->attention(pool, o_ref + (size_t)na * q_dim, q + (size_t)na * q_dim, kb, vb, nb, 0, nh, nkv,
                 hd, stride, 0.25f, scr);
    CHECK(!memcmp(o_paged, o_ref, sizeof(float) * (na + nb) * q_dim),
          "paged attention (shuffled blocks, two sequences) differs from contiguous attention");
    double err = 0, mx = 0;
    for (int i = 0; i < (na + nb) * q_dim; i++) {
        err = fmax(err, fabs(o_paged[i] - o_scalar[i]));
        mx = fmax(mx, fabs(o_scalar[i]));
    }
    CHECK(err <= 1e-5 * mx, "fast vs scalar paged attention: %g", err / mx);
    /* The scalar paged kernel against the scalar contiguous one. */
    sc->attention(NULL, o_ref, q, ka, va, na, len_a - na, nh, nkv, hd, stride, 0.25f, scr);
    sc->attention(NULL, o_ref + (size_t)na * q_dim, q + (size_t)na * q_dim, kb, vb, nb, 0, nh, nkv,
                  hd, stride, 0.25f, scr);
    CHECK(!memcmp(o_scalar, o_ref, sizeof(float) * (na + nb) * q_dim),
          "scalar paged vs scalar contiguous");
    free(kc), free(vc), free(ka), free(va), free(kb), free(vb), free(q), free(o_paged), free(o_ref);
    free(o_scalar), free(scr);
}

/* ---- the model: chunked prefill ---- */

static float *prefill_last(struct lm_model *m, const struct lm_ids *ids, int piece) {
    const int vocab = lm_model_config(m)->vocab_size, n = (int)ids->n;
    float *out = malloc(sizeof(float) * vocab);
    struct lm_kv_cache *kv;
    int nb = (n + LM_KV_BLOCK - 1) / LM_KV_BLOCK;
    CHECK(lm_kv_cache_create(m, nb + 3, 1024, n, &kv) == LM_OK, "kv: %s", lm_error_message());
    int32_t *blocks = malloc(sizeof *blocks * nb);
    for (int i = 0; i < nb; i++)
        blocks[i] = nb + 2 - i; /* reversed: not the identity */
    for (int done = 0; done < n;) {
        int k = n - done < piece ? n - done : piece;
        struct lm_batch_seq b = {ids->v + done, k, done, blocks,
                                 done + k == n ? LM_LOGITS_LAST : LM_LOGITS_NONE};
        CHECK(lm_model_forward(m, kv, &b, 1, out) == LM_OK, "forward: %s", lm_error_message());
        done += k;
    }
    free(blocks);
    lm_kv_cache_destroy(kv);
    return out;
}

static void test_chunked_prefill(struct lm_model *m, const struct ref_case *lc) {
    const int vocab = lm_model_config(m)->vocab_size;
    float *one = prefill_last(m, &lc->prompt, 1024);
    const int pieces[] = {1, 7, 16, 100, 512};
    for (size_t i = 0; i < sizeof pieces / sizeof *pieces; i++) {
        float *c = prefill_last(m, &lc->prompt, pieces[i]);
        CHECK(!memcmp(one, c, sizeof(float) * vocab),
              "prefill in pieces of %d: last logits differ from one call", pieces[i]);
        free(c);
    }
    /* And the same bits through lm_seq (a private cache, chunks of 256). */
    struct lm_seq *s;
    lm_seq_create(m, (int)lc->prompt.n, &s);
    float *seq_logits = malloc(sizeof(float) * vocab);
    lm_seq_forward(s, lc->prompt.v, (int)lc->prompt.n, seq_logits, false);
    CHECK(!memcmp(one, seq_logits, sizeof(float) * vocab), "lm_seq_forward vs one call");
    lm_seq_destroy(s);
    free(seq_logits);
    free(one);
}

/* ---- the scheduler ---- */

struct job {
    struct lm_sched_req r;
    bool done, started;
};

static void on_finish(struct lm_sched_req *r) {
    ((struct job *)r->ctx)->done = true;
}
static void on_start(struct lm_sched_req *r) {
    ((struct job *)r->ctx)->started = true;
}

static void job_init(struct job *j, const struct lm_ids *prompt, int max_tokens,
                     struct lm_sampling_params sp) {
    memset(j, 0, sizeof *j);
    j->r.gen = (struct lm_gen_request){.prompt = prompt->v,
                                       .n_prompt = prompt->n,
                                       .max_tokens = max_tokens,
                                       .sampling = sp,
                                       .ignore_eos = true};
    j->r.on_finish = on_finish;
    j->r.on_start = on_start;
    j->r.ctx = j;
}

static struct lm_sampling_params greedy(void) {
    return (struct lm_sampling_params){.temperature = 0, .top_p = 1};
}
static struct lm_sampling_params seeded(uint64_t seed) {
    return (struct lm_sampling_params){
        .temperature = 0.9f, .top_p = 0.95f, .top_k = 50, .seed = seed, .seeded = true};
}

static void run_until_idle(struct lm_sched *s) {
    for (int i = 0; i < 100000 && lm_sched_step(s) > 0; i++) {
    }
}

/* Runs jobs[0..n): the first `together` submitted at once, the rest one every `stagger` steps. */
static void run_jobs(struct lm_sched *s, struct job *jobs, int n, int together, int stagger) {
    int next = 0;
    for (; next < together && next < n; next++)
        CHECK(lm_sched_submit(s, &jobs[next].r) == LM_OK, "submit: %s", lm_error_message());
    int steps = 0;
    while (lm_sched_step(s) > 0 || next < n) {
        steps++;
        if (next < n && steps % stagger == 0) {
            CHECK(lm_sched_submit(s, &jobs[next].r) == LM_OK, "submit: %s", lm_error_message());
            next++;
        }
        if (steps > 200000) break;
    }
}

static bool same(const struct lm_ids *a, const struct lm_ids *b) {
    return a->n == b->n && (a->n == 0 || !memcmp(a->v, b->v, a->n * sizeof *a->v));
}

static void test_sched(struct lm_model *m, struct ref_case *cases, int n_cases) {
    struct lm_sched_params p = lm_sched_default_params();
    p.max_seqs = 16;
    p.max_batch_tokens = 64; /* long prompts are chunked and mixed with decodes */
    p.max_ctx = 1100;
    p.n_blocks = 16 * 1100 / LM_KV_BLOCK;
    struct lm_sched *s;
    CHECK(lm_sched_create(m, &p, &s) == LM_OK, "sched: %s", lm_error_message());
    if (!s) return;
    const int T = 24;

    /* Alone: transformers' greedy ids, and each request's reference for the batched runs. */
    struct lm_ids alone[10] = {{0}};
    for (int i = 0; i < n_cases; i++) {
        struct job j;
        job_init(&j, &cases[i].prompt, T, greedy());
        lm_sched_submit(s, &j.r);
        run_until_idle(s);
        CHECK(j.done && j.r.status == LM_OK && j.r.result.finish == LM_FINISH_LENGTH,
              "case %d alone", i);
        CHECK(same(&j.r.result.ids, &cases[i].greedy),
              "case %d alone: greedy ids differ from transformers", i);
        alone[i] = j.r.result.ids;
        j.r.result.ids = (struct lm_ids){0};
        lm_gen_result_free(&j.r.result);
    }

    /* Greedy beside 0..15 others: together, then staggered. */
    struct job jobs[16];
    for (int conc = 1; conc <= 16; conc++) {
        for (int stagger = 0; stagger < 2; stagger++) {
            for (int i = 0; i < conc; i++)
                job_init(&jobs[i], &cases[(i * 7 + conc) % n_cases].prompt, T, greedy());
            run_jobs(s, jobs, conc, stagger ? 1 : conc, stagger ? 3 : 1);
            for (int i = 0; i < conc; i++) {
                int c = (i * 7 + conc) % n_cases;
                CHECK(jobs[i].done && same(&jobs[i].r.result.ids, &alone[c]),
                      "greedy case %d beside %d others (%s): ids differ from alone", c, conc - 1,
                      stagger ? "staggered" : "together");
                lm_gen_result_free(&jobs[i].r.result);
            }
        }
    }
    struct lm_sched_stats st;
    lm_sched_stats(s, &st);
    CHECK(st.kv_blocks_used == 0 && st.running == 0 && st.waiting == 0, "idle: %d blocks used",
          st.kv_blocks_used);
    CHECK(st.cached_tokens > 0, "repeated prompts reused the prefix cache: %lld tokens",
          st.cached_tokens);
    fprintf(
        stderr,
        "test_batch: %lld steps, %.1f tokens a step, %lld of %lld prompt tokens from the cache\n",
        st.steps, (double)st.step_tokens / (double)st.steps, st.cached_tokens, st.prompt_tokens);

    /* Seeded sampling: alone vs beside 7 others (greedy and sampled with other seeds). */
    struct lm_ids ref[4] = {{0}};
    for (int i = 0; i < 4; i++) {
        struct job j;
        job_init(&j, &cases[i].prompt, 32, seeded(100 + i));
        lm_sched_submit(s, &j.r);
        run_until_idle(s);
        ref[i] = j.r.result.ids;
        j.r.result.ids = (struct lm_ids){0};
        lm_gen_result_free(&j.r.result);
    }
    for (int i = 0; i < 8; i++)
        job_init(&jobs[i], &cases[(i + 3) % n_cases].prompt, 32,
                 i < 4 ? seeded(100 + (i + 3) % 4) : greedy());
    /* jobs 0..3 use cases 3..6 with seeds of cases (3..6)%4: rebuild them as the reference pairs */
    for (int i = 0; i < 4; i++)
        job_init(&jobs[i], &cases[i].prompt, 32, seeded(100 + i));
    run_jobs(s, jobs, 8, 3, 2);
    for (int i = 0; i < 4; i++) {
        CHECK(same(&jobs[i].r.result.ids, &ref[i]), "seeded case %d: batched ids differ from alone",
              i);
        lm_ids_free(&ref[i]);
    }
    for (int i = 0; i < 8; i++)
        lm_gen_result_free(&jobs[i].r.result);

    /* Cancellation: a running request stops within a step and frees its blocks; a waiting one
     * never runs. */
    atomic_bool flag_a, flag_b;
    atomic_init(&flag_a, false);
    atomic_init(&flag_b, false);
    job_init(&jobs[0], &cases[0].prompt, 500, greedy());
    jobs[0].r.gen.cancel = &flag_a;
    lm_sched_submit(s, &jobs[0].r);
    for (int i = 0; i < 40; i++)
        lm_sched_step(s);
    lm_sched_stats(s, &st);
    CHECK(st.running == 1 && st.kv_blocks_used > 0, "long request running with %d blocks",
          st.kv_blocks_used);
    atomic_store(&flag_a, true);
    lm_sched_step(s);
    lm_sched_stats(s, &st);
    CHECK(jobs[0].done && jobs[0].r.result.finish == LM_FINISH_CANCELLED &&
              st.kv_blocks_used == 0 && st.running == 0,
          "cancelled within one step, blocks freed: done %d, %d blocks used", jobs[0].done,
          st.kv_blocks_used);
    lm_gen_result_free(&jobs[0].r.result);
    job_init(&jobs[1], &cases[1].prompt, 8, greedy());
    jobs[1].r.gen.cancel = &flag_b;
    atomic_store(&flag_b, true);
    lm_sched_submit(s, &jobs[1].r);
    lm_sched_step(s);
    CHECK(jobs[1].done && !jobs[1].started && jobs[1].r.result.completion_tokens == 0 &&
              jobs[1].r.result.finish == LM_FINISH_CANCELLED,
          "a cancelled waiting request never runs");
    lm_gen_result_free(&jobs[1].r.result);

    /* Errors at submit. */
    struct job bad;
    job_init(&bad, &cases[0].prompt, 2000, greedy());
    CHECK(lm_sched_submit(s, &bad.r) == LM_ERR_RANGE, "prompt + max_tokens beyond max_ctx");
    lm_sched_destroy(s);

    /* A pool that holds barely more than one context: sequences get preempted and recomputed,
     * and still produce the ids they produce alone. */
    p.max_seqs = 8;
    p.max_batch_tokens = 48;
    p.max_ctx = 600;
    p.n_blocks = 600 / LM_KV_BLOCK + 6;
    CHECK(lm_sched_create(m, &p, &s) == LM_OK, "small sched: %s", lm_error_message());
    int small[8], n_small = 0;
    for (int i = 0; i < n_cases && n_small < 8; i++)
        if (cases[i].prompt.n + 120 <= 400) small[n_small++] = i;
    struct lm_ids small_ref[8] = {{0}};
    for (int i = 0; i < n_small; i++) { /* alone in the small pool: no pressure */
        job_init(&jobs[i], &cases[small[i]].prompt, 120, i % 2 ? seeded(7 + i) : greedy());
        lm_sched_submit(s, &jobs[i].r);
        run_until_idle(s);
        small_ref[i] = jobs[i].r.result.ids;
        jobs[i].r.result.ids = (struct lm_ids){0};
        lm_gen_result_free(&jobs[i].r.result);
    }
    for (int i = 0; i < 8; i++)
        job_init(&jobs[i], &cases[small[i % n_small]].prompt, 120,
                 i % n_small % 2 ? seeded(7 + i % n_small) : greedy());
    run_jobs(s, jobs, 8, 8, 1);
    lm_sched_stats(s, &st);
    for (int i = 0; i < 8; i++) {
        CHECK(jobs[i].done && same(&jobs[i].r.result.ids, &small_ref[i % n_small]),
              "small pool, request %d: ids differ (preempted %d times)", i,
              jobs[i].r.result.preemptions);
        lm_gen_result_free(&jobs[i].r.result);
    }
    for (int i = 0; i < n_small; i++)
        lm_ids_free(&small_ref[i]);
    CHECK(st.preemptions > 0, "the small pool preempted (%lld)", st.preemptions);
    fprintf(stderr, "test_batch: small pool: %lld preemptions, %lld evictions\n", st.preemptions,
            st.evictions);
    lm_sched_destroy(s);
    for (int i = 0; i < n_cases; i++)
        lm_ids_free(&alone[i]);
}

int main(void) {
    struct lm_pool *pool;
    lm_pool_create(2, &pool);
    test_matmul_invariance(pool);
    test_paged_attention(pool);
    lm_pool_destroy(pool);

    struct ref_case *cases;
    int n_cases = ref_cases_load(&cases);
    CHECK(n_cases == 10, "%d reference cases", n_cases);
    struct lm_model *m = open_tiny_model();
    if (!m) return check_exit("test_batch");
    const struct ref_case *lc = &cases[0];
    for (int i = 1; i < n_cases; i++)
        if (cases[i].prompt.n > lc->prompt.n) lc = &cases[i];
    test_chunked_prefill(m, lc);
    test_sched(m, cases, n_cases);
    lm_model_close(m);
    ref_cases_free(cases, n_cases);
    return check_exit("test_batch");
}
