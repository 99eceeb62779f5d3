/* test_spec.c: speculative decoding (engine/spec.h) must change how many steps a request takes,
 * never its tokens.
 *
 * Proposer: n-gram prompt lookup on hand-made sequences (longest n-gram first, earliest match as
 * vLLM's proposer,
 * drafts cut at the sequence's end and at max_draft), and the vLLM-style config parser (defaults,
 * errors naming the key). Scheduler (driven directly, tiny model): every request gives the same
 * ids with speculation on as off: greedy, seeded sampling, penalties with logprobs (values too),
 * stop strings, alone and beside others, under KV pressure that preempts; drafts are verified and
 * some are accepted and some rejected (so both paths run); every block comes back. lm_generate
 * (lumen run) gives the same outcome with and without speculation too.
 * LM_LABEL: model
 * LM_LINK: lm_engine lm_family lm_format lm_text lm_backend lm_base */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine/sched.h"
#include "engine/spec.h"
#include "family/model.h"
#include "fixtures.h"

/* ---- the proposer ---- */

/* lm_spec_propose_indexed over t[0..n), its index grown in two pieces (as a sequence's grows). */
static int propose(int nmin, int nmax, int k, const int32_t *t, int n, int max_draft,
                   int32_t *out) {
    struct lm_spec_params p = {k, nmax, nmin, 0};
    struct lm_spec_index x = {0};
    int got = -1;
    if (!lm_spec_index_extend(&x, t, n / 2) && !lm_spec_index_extend(&x, t, n))
        got = lm_spec_propose_indexed(&p, &x, t, n, max_draft, out);
    lm_spec_index_free(&x);
    return got;
}

static bool eq(const int32_t *a, const int32_t *b, int n) {
    return n == 0 || !memcmp(a, b, sizeof *a * (size_t)n);
}

static void test_propose(void) {
    int32_t d[LM_SPEC_MAX_TOKENS];
    /* 1 2 3 4 5 9 9 1 2 3 | suffix "1 2 3" matched at 0 -> 4 5 9 9 */
    const int32_t a[] = {1, 2, 3, 4, 5, 9, 9, 1, 2, 3};
    int n = propose(1, 3, 4, a, 10, 4, d);
    CHECK(n == 4 && eq(d, (int32_t[]){4, 5, 9, 9}, 4), "3-gram: %d drafts", n);
    n = propose(1, 3, 4, a, 10, 2, d);
    CHECK(n == 2 && eq(d, (int32_t[]){4, 5}, 2), "max_draft 2 cuts: %d", n);
    n = propose(1, 3, 2, a, 10, 4, d);
    CHECK(n == 2 && eq(d, (int32_t[]){4, 5}, 2), "num_speculative_tokens 2 cuts: %d", n);
    /* The draft stops at the sequence's end: "9 1 2 3" ... the match of "2 3" at 1 gives 4..;
     * a match near the end gives fewer tokens. */
    const int32_t b[] = {7, 8, 7, 8};
    n = propose(1, 4, 5, b, 4, 5, d); /* "7 8" at 0 -> 7 8 (then the end) */
    CHECK(n == 2 && eq(d, (int32_t[]){7, 8}, 2), "draft cut at the end: %d", n);
    /* Longest n-gram first: "3 4" occurs at 2 (-> 5) and the 1-gram "4" later at 6 (-> 6). */
    const int32_t c[] = {0, 0, 3, 4, 5, 1, 4, 6, 3, 4};
    n = propose(1, 2, 1, c, 10, 1, d);
    CHECK(n == 1 && d[0] == 5, "2-gram beats a later 1-gram: %d %d", n, d[0]);
    n = propose(1, 1, 1, c, 10, 1, d);
    CHECK(n == 1 && d[0] == 5, "1-gram: the earliest match: %d %d", n, d[0]);
    /* prompt_lookup_min 2: no 2-gram match -> nothing, though a 1-gram would match. */
    const int32_t e[] = {5, 1, 2, 5};
    n = propose(2, 3, 4, e, 4, 4, d);
    CHECK(n == 0, "no n-gram of at least 2 matches: %d", n);
    n = propose(1, 3, 4, e, 4, 4, d);
    CHECK(n == 3 && eq(d, (int32_t[]){1, 2, 5}, 3), "the 1-gram matches: %d", n);
    /* Off, tiny inputs. */
    CHECK(propose(1, 3, 0, a, 10, 4, d) == 0, "num_speculative_tokens 0 proposes nothing");
    CHECK(propose(1, 3, 4, a, 1, 4, d) == 0, "one token: nothing to match");
    CHECK(propose(1, 3, 4, a, 10, 0, d) == 0, "max_draft 0");
    /* The earliest match, as vLLM's _find_longest_matched_ngram_and_propose_tokens: "1 2" at 0
     * (-> 3) and at 3 (-> 4). */
    const int32_t f[] = {1, 2, 3, 1, 2, 4, 1, 2};
    n = propose(2, 2, 1, f, 8, 1, d);
    CHECK(n == 1 && d[0] == 3, "the earliest match wins: %d", d[0]);
    /* Repetition: the earliest match has a whole draft after it (the latest would overlap the
     * end and give one period at most). */
    int32_t r7[10], r12[12];
    for (int i = 0; i < 10; i++) r7[i] = 7;
    for (int i = 0; i < 12; i++) r12[i] = 1 + i % 2;
    n = propose(1, 3, 4, r7, 10, 4, d);
    CHECK(n == 4 && eq(d, (int32_t[]){7, 7, 7, 7}, 4), "7 x 10: %d drafts", n);
    n = propose(1, 3, 4, r12, 12, 4, d);
    CHECK(n == 4 && eq(d, (int32_t[]){1, 2, 1, 2}, 4), "(1 2) x 6: %d drafts", n);

    /* A second path: brute force over every (g, j) on random short-alphabet sequences. */
    uint64_t rs = 12345;
    int checked = 0, bad = 0;
    for (int it = 0; it < 2000; it++) {
        int32_t t[64];
        int len = 2 + (int)(rs % 60);
        for (int i = 0; i < len; i++) {
            rs = rs * 6364136223846793005ull + 1442695040888963407ull;
            t[i] = (int32_t)((rs >> 33) % 4);
        }
        int nmin = 1 + (int)((rs >> 20) % 3), nmax = nmin + (int)((rs >> 24) % 3);
        int k = 1 + (int)((rs >> 28) % 6);
        int32_t want[LM_SPEC_MAX_TOKENS];
        int wn = 0;
        for (int g = nmax; g >= nmin && !wn; g--) {
            if (g >= len) continue;
            for (int j = 0; j + g < len; j++) {
                bool m = true;
                for (int i = 0; i < g; i++)
                    m = m && t[j + i] == t[len - g + i];
                if (!m) continue;
                for (int i = 0; i < k && j + g + i < len; i++)
                    want[wn++] = t[j + g + i];
                break;
            }
        }
        n = propose(nmin, nmax, k, t, len, k, d);
        checked++;
        bad += n != wn || !eq(d, want, wn);
    }
    CHECK(bad == 0, "proposer vs brute force: %d of %d differ", bad, checked);
}

static void test_parse(void) {
    struct lm_spec_params p;
    /* vLLM's defaults (config/speculative.py): neither lookup key 5 and 5; one: the other equal. */
    CHECK(lm_spec_parse("{\"method\": \"ngram\", \"num_speculative_tokens\": 5, "
                        "\"prompt_lookup_max\": 4}",
                        &p) == LM_OK &&
              p.num_speculative_tokens == 5 && p.prompt_lookup_max == 4 && p.prompt_lookup_min == 4,
          "vLLM's example: %d %d %d", p.num_speculative_tokens, p.prompt_lookup_max,
          p.prompt_lookup_min);
    CHECK(lm_spec_parse("{\"method\": \"ngram\", \"num_speculative_tokens\": 3}", &p) == LM_OK &&
              p.prompt_lookup_max == 5 && p.prompt_lookup_min == 5 && LM_SPEC_DEFAULT_LOOKUP == 5,
          "defaults 5 and 5");
    CHECK(lm_spec_parse("{\"method\": \"ngram\", \"num_speculative_tokens\": 3, \"prompt_lookup_max\": null, "
                        "\"disable_by_batch_size\": null}",
                        &p) == LM_OK &&
              p.prompt_lookup_max == 5 && p.prompt_lookup_min == 5 && p.disable_by_batch_size == 0,
          "null is unset, as vLLM's None: %d %d", p.prompt_lookup_max, p.prompt_lookup_min);
    CHECK(lm_spec_parse("{\"method\": \"ngram\", \"num_speculative_tokens\": 3, \"prompt_lookup_min\": 2}", &p) == LM_OK &&
              p.prompt_lookup_max == 2 && p.prompt_lookup_min == 2,
          "a lone min sets the max: %d", p.prompt_lookup_max);
    CHECK(lm_spec_parse("{\"method\": \"ngram\", \"num_speculative_tokens\": 3, \"prompt_lookup_max\": 4, "
                        "\"prompt_lookup_min\": 2, \"disable_by_batch_size\": 32}",
                        &p) == LM_OK &&
              p.prompt_lookup_max == 4 && p.prompt_lookup_min == 2 && p.disable_by_batch_size == 32,
          "every key given");
    struct {
        const char *json, *needle;
    } bad[] = {
        {"{\"method\": \"eagle\", \"num_speculative_tokens\": 3}", "method"},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 16}", "num_speculative_tokens"},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": -1}", "num_speculative_tokens"},
        {"{\"method\": \"ngram\", \"prompt_lookup_max\": 3}", "num_speculative_tokens is required"},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 2, \"prompt_lookup_min\": 0}", "prompt_lookup_min"},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 2, \"prompt_lookup_max\": 2, \"prompt_lookup_min\": 3}",
         "prompt_lookup_max"},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 2, \"model\": \"x\"}", "unknown key \"model\""},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 3, \"prompt_lookup_max\": -5}", "prompt_lookup"},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 2, \"prompt_lookup_min\": -1}", "prompt_lookup_min"},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 2, \"num_speculative_tokens\": 3}", "bad JSON"},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 2, \"disable_by_batch_size\": -1}", "disable_by_batch_size"},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": \"2\"}", "must be an integer"},
        {"[1]", "not a JSON object"},
        {"{num_speculative_tokens: 2}", "bad JSON"},
        {"{\"num_speculative_tokens\": 3}", "method is required"},
        {"{\"method\": null, \"num_speculative_tokens\": 3}", "method is required"},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 0}", "num_speculative_tokens: 0 is not in 1..15"},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 3, \"prompt_lookup_max\": 0}",
         "prompt_lookup_max: 0 is not in 1..64"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        lm_status rc = lm_spec_parse(bad[i].json, &p);
        CHECK(rc == LM_ERR_INVALID && strstr(lm_error_message(), bad[i].needle),
              "%s: rc %d, message '%s' should name '%s'", bad[i].json, rc, lm_error_message(),
              bad[i].needle);
    }
}

/* ---- the scheduler ---- */

struct job {
    struct lm_sched_req r;
    bool done;
};

static void on_finish(struct lm_sched_req *r) {
    ((struct job *)r->ctx)->done = true;
}

static void job_init(struct job *j, const int32_t *prompt, size_t n, int max_tokens,
                     struct lm_sampling_params sp) {
    memset(j, 0, sizeof *j);
    j->r.gen = (struct lm_gen_request){
        .prompt = prompt, .n_prompt = n, .max_tokens = max_tokens, .sampling = sp, .ignore_eos = true};
    j->r.on_finish = on_finish;
    j->r.ctx = j;
}

static struct lm_sampling_params greedy(void) {
    return (struct lm_sampling_params){.temperature = 0, .top_p = 1};
}
static struct lm_sampling_params seeded(uint64_t seed) {
    return (struct lm_sampling_params){
        .temperature = 0.8f, .top_p = 0.95f, .top_k = 40, .seed = seed, .seeded = true};
}
static struct lm_sampling_params penalised(uint64_t seed) {
    struct lm_sampling_params p = seeded(seed);
    p.repetition_penalty = 1.1f;
    p.presence_penalty = 0.3f;
    p.logprobs = true;
    p.top_logprobs = 3;
    return p;
}

/* Runs n jobs, the first `together` at once and the rest one every 2 steps, to idle. */
static void run_jobs(struct lm_sched *s, struct job *jobs, int n, int together) {
    int next = 0, steps = 0;
    for (; next < together && next < n; next++)
        CHECK(lm_sched_submit(s, &jobs[next].r) == LM_OK, "submit: %s", lm_error_message());
    while (lm_sched_step(s) > 0 || next < n) {
        if (next < n && ++steps % 2 == 0) {
            CHECK(lm_sched_submit(s, &jobs[next].r) == LM_OK, "submit: %s", lm_error_message());
            next++;
        }
        if (steps > 200000) break;
    }
}

/* One request's outcome, for comparing the two runs. */
struct outcome {
    struct lm_ids ids;
    struct lm_buf text;
    enum lm_finish finish;
    float *lp; /* logprobs, with the top alternatives: [n][1 + 3] */
    int n_lp;
    int accepted, drafted; /* the request's speculative counts (not compared) */
};

static void keep(struct outcome *o, struct job *j) {
    CHECK(j->done && j->r.status == LM_OK, "request finished: status %d (%s)", j->r.status,
          j->r.error);
    o->ids = j->r.result.ids;
    o->text = j->r.result.text;
    o->finish = j->r.result.finish;
    o->accepted = j->r.result.accepted_tokens;
    o->drafted = j->r.result.draft_tokens;
    o->n_lp = (int)j->r.result.logprobs.n;
    o->lp = calloc((size_t)o->n_lp * 4 + 1, sizeof *o->lp);
    for (int i = 0; i < o->n_lp; i++) {
        const struct lm_token_logprob *e = &j->r.result.logprobs.v[i];
        o->lp[i * 4] = e->logprob;
        for (int t = 0; t < 3 && t < e->n_top; t++)
            o->lp[i * 4 + 1 + t] = e->top_logprob[t];
    }
    j->r.result.ids = (struct lm_ids){0};
    j->r.result.text = (struct lm_buf){0};
    lm_gen_result_free(&j->r.result);
}

static void outcome_free(struct outcome *o) {
    lm_ids_free(&o->ids);
    lm_buf_free(&o->text);
    free(o->lp);
}

static bool same_outcome(const struct outcome *a, const struct outcome *b) {
    return a->ids.n == b->ids.n && eq(a->ids.v, b->ids.v, (int)a->ids.n) &&
           a->finish == b->finish && a->text.len == b->text.len &&
           (a->text.len == 0 || !memcmp(a->text.p, b->text.p, a->text.len)) &&
           a->n_lp == b->n_lp && (a->n_lp == 0 || !memcmp(a->lp, b->lp, sizeof(float) * 4 * a->n_lp));
}

#define N_REQ 12

struct req_spec {
    int32_t *prompt;
    size_t n;
    int max_tokens;
    struct lm_sampling_params sp;
    const char *stop[1];
    size_t n_stop;
};

/* Runs every request with the given scheduler parameters: alone one by one, then all together
 * (8 at once, the rest staggered). */
static void run_all(struct lm_model *m, const struct lm_sched_params *p, struct req_spec *rq, int n,
                    struct outcome *alone, struct outcome *batched, struct lm_sched_stats *st) {
    struct lm_sched *s;
    CHECK(lm_sched_create(m, p, &s) == LM_OK, "sched: %s", lm_error_message());
    if (!s) return;
    struct job jobs[N_REQ];
    for (int i = 0; i < n; i++) {
        job_init(&jobs[i], rq[i].prompt, rq[i].n, rq[i].max_tokens, rq[i].sp);
        jobs[i].r.gen.stop = rq[i].stop;
        jobs[i].r.gen.n_stop = rq[i].n_stop;
        run_jobs(s, &jobs[i], 1, 1);
        keep(&alone[i], &jobs[i]);
    }
    for (int i = 0; i < n; i++) {
        job_init(&jobs[i], rq[i].prompt, rq[i].n, rq[i].max_tokens, rq[i].sp);
        jobs[i].r.gen.stop = rq[i].stop;
        jobs[i].r.gen.n_stop = rq[i].n_stop;
    }
    run_jobs(s, jobs, n, 8);
    for (int i = 0; i < n; i++)
        keep(&batched[i], &jobs[i]);
    lm_sched_stats(s, st);
    CHECK(st->kv_blocks_used == 0 && st->running == 0 && st->waiting == 0,
          "idle after the runs: %d blocks used", st->kv_blocks_used);
    lm_sched_destroy(s);
}

/* lm_generate (lumen run) with and without speculation: the same ids, text, logprobs and finish
 * for greedy, seeded and penalised sampling, with a stop string. */
static void test_generate(struct lm_model *m, struct req_spec *rq, int n) {
    struct lm_spec_params sp = {3, 3, 1, 0};
    long long acc = 0, drafted = 0;
    for (int i = 0; i < n; i++) {
        struct lm_seq *seq = NULL;
        CHECK(lm_seq_create(m, (int)rq[i].n + rq[i].max_tokens, &seq) == LM_OK, "lm_seq_create: %s",
              lm_error_message());
        if (!seq) return;
        struct outcome o[2];
        for (int k = 0; k < 2; k++) {
            struct lm_gen_request req = {.prompt = rq[i].prompt, .n_prompt = rq[i].n,
                                         .max_tokens = rq[i].max_tokens, .sampling = rq[i].sp,
                                         .stop = rq[i].stop, .n_stop = rq[i].n_stop,
                                         .ignore_eos = true, .spec = k ? &sp : NULL};
            struct job j;
            memset(&j, 0, sizeof j);
            lm_status rc = lm_generate(m, seq, &req, NULL, NULL, &j.r.result);
            CHECK(rc == LM_OK, "lm_generate %d (%s): %s", i, k ? "speculative" : "plain", lm_error_message());
            j.done = true;
            keep(&o[k], &j);
        }
        CHECK(same_outcome(&o[0], &o[1]), "lm_generate %d: speculative vs plain: %zu vs %zu ids", i,
              o[1].ids.n, o[0].ids.n);
        CHECK(o[0].drafted == 0, "plain lm_generate drafts nothing");
        acc += o[1].accepted;
        drafted += o[1].drafted;
        outcome_free(&o[0]);
        outcome_free(&o[1]);
        lm_seq_destroy(seq);
    }
    CHECK(acc > 0 && drafted > acc, "lm_generate: %lld of %lld draft tokens accepted", acc, drafted);
    fprintf(stderr, "test_spec: lm_generate: %d requests equal with and without speculation; %lld of %lld "
                    "draft tokens accepted\n", n, acc, drafted);
    struct lm_gen_request bad = {.prompt = rq[0].prompt, .n_prompt = rq[0].n, .max_tokens = 4,
                                 .sampling = rq[0].sp, .spec = &(struct lm_spec_params){16, 3, 1, 0}};
    struct lm_gen_result r;
    struct lm_seq *seq = NULL;
    lm_seq_create(m, (int)rq[0].n + 4, &seq);
    CHECK(seq && lm_generate(m, seq, &bad, NULL, NULL, &r) == LM_ERR_INVALID &&
              strstr(lm_error_message(), "num_speculative_tokens"),
          "lm_generate refuses 16 draft tokens: %s", lm_error_message());
    lm_gen_result_free(&r);
    lm_seq_destroy(seq);
}

/* Accounting, alone on a fresh scheduler: a step's tokens are the pending token and its draft,
 * so the tokens run are the prompt, every generated token but the last, and the rejected draft
 * tokens (an accepted one is never run again). A repeated prompt (cached to its last token, so
 * its first token comes from a step with a draft) still gets its first-token time. */
static void test_accounting(struct lm_model *m, const struct lm_sched_params *ps, struct req_spec *rq) {
    static const int which[] = {0, 1, 4, 5};
    for (size_t w = 0; w < sizeof which / sizeof *which; w++) {
        const struct req_spec *r = &rq[which[w]];
        struct lm_sched *s;
        CHECK(lm_sched_create(m, ps, &s) == LM_OK, "sched: %s", lm_error_message());
        if (!s) return;
        struct job j;
        job_init(&j, r->prompt, r->n, r->max_tokens, r->sp);
        run_jobs(s, &j, 1, 1);
        struct lm_sched_stats st;
        lm_sched_stats(s, &st);
        const long long c = j.r.result.completion_tokens;
        const long long want = (long long)r->n + c - 1 + st.spec_draft_tokens - st.spec_accepted_tokens;
        CHECK(j.done && c == r->max_tokens && st.step_tokens == want && st.spec_accepted_tokens > 0,
              "request %d alone: %lld tokens run, expected %zu prompt + %lld - 1 + %lld rejected = %lld",
              which[w], st.step_tokens, r->n, c, st.spec_draft_tokens - st.spec_accepted_tokens, want);
        lm_gen_result_free(&j.r.result);
        for (int rep = 0; rep < 3; rep++) {
            job_init(&j, r->prompt, r->n, 2 + 2 * rep, r->sp);
            CHECK(lm_sched_submit(s, &j.r) == LM_OK, "submit: %s", lm_error_message());
            lm_sched_step(s); /* its first step: the first token, from a step with a draft */
            CHECK(j.r.result.completion_tokens >= 1 && j.r.result.draft_tokens > 0 &&
                      j.r.result.times.first_token_ms > 0,
                  "repeated request %d: after its first step %d tokens, %d drafted, first token at %.3f",
                  which[w], j.r.result.completion_tokens, j.r.result.draft_tokens,
                  j.r.result.times.first_token_ms);
            run_jobs(s, &j, 0, 0);
            const struct lm_gen_times *t = &j.r.result.times;
            CHECK(j.done && t->first_token_ms > 0 && t->first_token_ms >= t->scheduled_ms &&
                      t->finish_ms >= t->first_token_ms && j.r.result.cached_tokens > 0,
                  "repeated request %d (max_tokens %d): first token at %.3f ms, scheduled %.3f, %d cached",
                  which[w], 2 + 2 * rep, t->first_token_ms, t->scheduled_ms, j.r.result.cached_tokens);
            lm_gen_result_free(&j.r.result);
        }
        lm_sched_destroy(s);
    }
}

static void test_sched(struct lm_model *m, struct ref_case *cases, int n_cases) {
    const struct lm_tokenizer *tok = lm_model_tokenizer(m);
    /* Prompts: the reference prompts, and each followed by its own greedy output and the prompt
     * again, so that n-gram lookup finds matches (whether the model then agrees is its call). */
    struct req_spec rq[N_REQ];
    int32_t *owned[N_REQ] = {0};
    struct lm_sched_params p = lm_sched_default_params();
    p.max_seqs = 8;
    p.max_batch_tokens = 64;
    p.max_ctx = 2048;
    p.n_blocks = 8 * 2048 / LM_KV_BLOCK;
    struct lm_sched *s;
    CHECK(lm_sched_create(m, &p, &s) == LM_OK, "sched: %s", lm_error_message());
    if (!s) return;
    for (int i = 0; i < N_REQ; i++) {
        const struct ref_case *c = &cases[i % n_cases];
        struct job j;
        job_init(&j, c->prompt.v, c->prompt.n, 40, greedy());
        run_jobs(s, &j, 1, 1);
        size_t n = c->prompt.n, g = i % 3 ? j.r.result.ids.n : 0;
        int32_t *t = malloc(sizeof *t * (2 * n + g + 1));
        memcpy(t, c->prompt.v, sizeof *t * n);
        memcpy(t + n, j.r.result.ids.v, sizeof *t * g);
        if (g) memcpy(t + n + g, c->prompt.v, sizeof *t * n);
        owned[i] = t;
        rq[i] = (struct req_spec){t, g ? 2 * n + g : n, 48 + 8 * (i % 4), greedy(), {NULL}, 0};
        if (i % 4 == 1) rq[i].sp = seeded(100 + (uint64_t)i);
        if (i % 4 == 2) rq[i].sp = penalised(200 + (uint64_t)i);
        if (i == 7 && tok && j.r.result.text.len > 6) {
            /* A stop string from the middle of the output this prompt's twin produced. */
            static char stop[8];
            memcpy(stop, j.r.result.text.p + j.r.result.text.len / 2, 3);
            stop[3] = 0;
            rq[i].stop[0] = stop;
            rq[i].n_stop = 1;
        }
        lm_gen_result_free(&j.r.result);
    }
    lm_sched_destroy(s);

    test_generate(m, rq, N_REQ);

    struct outcome plain_alone[N_REQ], plain_b[N_REQ], spec_alone[N_REQ], spec_b[N_REQ];
    struct lm_sched_stats st_plain, st_spec;
    run_all(m, &p, rq, N_REQ, plain_alone, plain_b, &st_plain);
    struct lm_sched_params ps = p;
    ps.spec = (struct lm_spec_params){4, 3, 1, 0};
    run_all(m, &ps, rq, N_REQ, spec_alone, spec_b, &st_spec);
    test_accounting(m, &ps, rq);
    fprintf(stderr, "test_spec: accepted / draft tokens a request, alone (prompts %s):",
            "0, 3, 6, 9: a fixture prompt; others: prompt + output + prompt");
    for (int i = 0; i < N_REQ; i++)
        fprintf(stderr, " %d/%d", spec_alone[i].accepted, spec_alone[i].drafted);
    fprintf(stderr, "\n");
    for (int i = 0; i < N_REQ; i++) {
        CHECK(same_outcome(&plain_alone[i], &plain_b[i]), "request %d: plain alone vs batched", i);
        CHECK(same_outcome(&plain_alone[i], &spec_alone[i]),
              "request %d (%s): speculative alone vs plain: %zu vs %zu ids", i,
              i % 4 == 0 ? "greedy" : i % 4 == 1 ? "seeded" : i % 4 == 2 ? "penalties" : "greedy",
              spec_alone[i].ids.n, plain_alone[i].ids.n);
        CHECK(same_outcome(&plain_alone[i], &spec_b[i]), "request %d: speculative batched vs plain",
              i);
    }
    CHECK(st_plain.spec_drafts == 0, "plain runs verify no draft");
    /* disable_by_batch_size 2: no drafts while more than 2 run (the batched run's start), the
     * same outcomes. */
    struct lm_sched_params pd = ps;
    pd.spec.disable_by_batch_size = 2;
    struct outcome dis_alone[N_REQ], dis_b[N_REQ];
    struct lm_sched_stats st_dis;
    run_all(m, &pd, rq, N_REQ, dis_alone, dis_b, &st_dis);
    int dis_bad = 0, dis_alone_d = 0, dis_b_d = 0, spec_b_d = 0;
    for (int i = 0; i < N_REQ; i++) {
        dis_bad += !same_outcome(&plain_alone[i], &dis_alone[i]) || !same_outcome(&plain_alone[i], &dis_b[i]);
        dis_alone_d += dis_alone[i].drafted;
        dis_b_d += dis_b[i].drafted;
        spec_b_d += spec_b[i].drafted;
        outcome_free(&dis_alone[i]);
        outcome_free(&dis_b[i]);
    }
    CHECK(dis_bad == 0 && dis_alone_d > 0 && dis_b_d < spec_b_d,
          "disable_by_batch_size 2: %d outcomes differ; draft tokens alone %d, batched %d (without the "
          "limit %d)", dis_bad, dis_alone_d, dis_b_d, spec_b_d);
    CHECK(st_spec.spec_draft_tokens > st_spec.spec_accepted_tokens &&
              st_spec.spec_accepted_tokens > 0,
          "drafts both accepted and rejected: %lld of %lld", st_spec.spec_accepted_tokens,
          st_spec.spec_draft_tokens);
    CHECK(st_spec.steps < st_plain.steps, "speculation took fewer steps: %lld vs %lld",
          st_spec.steps, st_plain.steps);
    fprintf(stderr,
            "test_spec: %lld drafts, %lld draft tokens, %lld accepted (%.1f%%); steps %lld with "
            "speculation vs %lld without\n",
            st_spec.spec_drafts, st_spec.spec_draft_tokens, st_spec.spec_accepted_tokens,
            100.0 * (double)st_spec.spec_accepted_tokens / (double)(st_spec.spec_draft_tokens + 1),
            st_spec.steps, st_plain.steps);

    /* KV pressure: a pool of barely more than one context; drafts must not break preemption and
     * recompute, and still give the same ids. */
    struct lm_sched_params pp = ps;
    pp.max_ctx = 400;
    pp.n_blocks = 400 / LM_KV_BLOCK + 4;
    pp.max_batch_tokens = 32;
    struct outcome small_alone[N_REQ], small_b[N_REQ];
    struct lm_sched_stats st_small;
    int n_small = 0;
    struct req_spec sr[N_REQ];
    for (int i = 0; i < N_REQ; i++)
        if (rq[i].n + (size_t)rq[i].max_tokens <= 400) sr[n_small++] = rq[i];
    run_all(m, &pp, sr, n_small, small_alone, small_b, &st_small);
    for (int i = 0, k = 0; i < N_REQ; i++) {
        if (rq[i].n + (size_t)rq[i].max_tokens > 400) continue;
        CHECK(same_outcome(&plain_alone[i], &small_alone[k]) &&
                  same_outcome(&plain_alone[i], &small_b[k]),
              "small pool, request %d: speculative ids differ from plain", i);
        outcome_free(&small_alone[k]);
        outcome_free(&small_b[k]);
        k++;
    }
    CHECK(n_small >= 6 && st_small.preemptions > 0 && st_small.spec_accepted_tokens > 0,
          "small pool: %d requests, %lld preemptions, %lld accepted", n_small, st_small.preemptions,
          st_small.spec_accepted_tokens);
    fprintf(stderr, "test_spec: small pool: %lld preemptions, %lld of %lld draft tokens accepted\n",
            st_small.preemptions, st_small.spec_accepted_tokens, st_small.spec_draft_tokens);

    for (int i = 0; i < N_REQ; i++) {
        outcome_free(&plain_alone[i]);
        outcome_free(&plain_b[i]);
        outcome_free(&spec_alone[i]);
        outcome_free(&spec_b[i]);
        free(owned[i]);
    }
}

int main(void) {
    test_propose();
    test_parse();
    struct ref_case *cases;
    int n_cases = ref_cases_load(&cases);
    CHECK(n_cases == 10, "%d reference cases", n_cases);
    struct lm_model *m = open_tiny_model();
    if (!m) return check_exit("test_spec");
    test_sched(m, cases, n_cases);
    lm_model_close(m);
    ref_cases_free(cases, n_cases);
    return check_exit("test_spec");
}
