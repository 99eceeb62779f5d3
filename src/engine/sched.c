/* sched.c: see sched.h.
 *
 * A request becomes a `struct seq`: its tokens (prompt, then the ids generated so far), how many
 * of them have K/V in the cache (n_computed), its block table, and the hash of its last indexed
 * block. Running sequences are kept in arrival order: the planner serves them in that order and
 * preempts from the other end. Everything a sequence allocates is released in finish(). */
#include "engine/sched.h"

#include "base/env.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct seq {
    struct lm_sched_req *r;
    long long arrival; /* submission order: lower runs first and is preempted last */
    int32_t *tokens;   /* [cap_tokens] prompt then generated ids */
    int n_tokens, cap_tokens, n_prompt;
    int n_computed;  /* tokens[0..n_computed) have K/V in the blocks */
    int32_t *blocks; /* [cap_blocks] block table */
    int n_blocks, cap_blocks;
    int n_indexed;  /* blocks[0..n_indexed) are full and indexed (or known duplicates) */
    uint64_t chain; /* chain hash of blocks[n_indexed - 1], LM_KV_ROOT when none */
    struct lm_rng rng;
    uint64_t dev_seed; /* seed of draws made on the device (lm_model_forward_sample) */
    struct lm_emitter em;
    bool started;     /* admitted at least once */
    bool preempt;     /* chosen as a victim during this step's planning */
    bool flush;       /* ended at EOS or length: release the held text */
    int chunk;        /* tokens planned for this step (1 + n_draft for a decoding sequence) */
    int n_draft;      /* draft tokens planned for this step (speculative decoding), held in
                         tokens[n_tokens .. n_tokens + n_draft) past the sequence's end */
    struct lm_spec_index idx; /* tokens[0..n_tokens) indexed for the proposer */
    struct seq *next; /* waiting list */
};

struct lm_sched {
    struct lm_model *m;
    struct lm_sched_params p;
    struct lm_kv_cache *cache;
    struct lm_kv kv;
    struct lm_sampler sampler;
    const struct lm_gen_defaults *gd;
    const struct lm_tokenizer *tok;
    int vocab;
    int max_run;                /* lm_model_max_run: the longest pending token + draft */
    int max_rows;               /* output rows a step can have: max_seqs, or with speculation
                                   min(max_batch_tokens, max_seqs x (1 + num_speculative_tokens)) */
    float *logits;              /* [max_rows, vocab] (pages touched only as rows are used) */
    struct lm_device_sampling *dsamp;  /* [max_rows] the step's rows, when the device samples */
    int32_t *ids;                      /* [max_rows] the ids it chose */
    struct lm_batch_seq *batch; /* [max_seqs] */
    struct seq **plan;          /* [max_seqs] */
    struct seq **running;       /* [max_seqs] in arrival order */
    int n_running;
    struct seq *wait_head; /* priority requests first, then arrival order */
    int n_waiting;
    long long arrivals;
    struct lm_sched_stats st;
    FILE *trace; /* LM_STEP_TRACE: one line a step (sched.h), or NULL */
    /* Steps queued ahead (sched.h): the sequences of the step whose ids are collected next, and
     * of the one queued behind it, each in row order, NULL where a sequence has finished since. */
    bool queue;            /* params.queue, the environment and lm_model_can_queue agree */
    int queue_max;         /* the most sequences a queued step may have (lowered when the model
                              refuses a step as too large for one device call) */
    int n_queued;          /* steps queued and not collected (0-2) */
    struct seq **ahead, **behind; /* [max_seqs] */
    int n_ahead, n_behind;
    int32_t *feed;         /* [max_seqs] */
};

struct lm_sched_params lm_sched_default_params(void) {
    return (struct lm_sched_params){
        .max_seqs = 16, .max_batch_tokens = 512, .n_blocks = 0, .max_ctx = 0, .queue = true};
}

const struct lm_sched_params *lm_sched_params(const struct lm_sched *s) {
    return &s->p;
}

static void copy_rows(void *ctx, int src, int dst, int n) {
    lm_kv_cache_copy(ctx, src, dst, n);
}

lm_status lm_sched_create(struct lm_model *m, const struct lm_sched_params *p,
                          struct lm_sched **out) {
    *out = NULL;
    if (p->max_seqs < 1 || p->max_seqs > 4096)
        return lm_errorf(LM_ERR_INVALID, "max_seqs %d is not in 1..4096", p->max_seqs);
    if (p->max_batch_tokens < p->max_seqs)
        return lm_errorf(LM_ERR_INVALID,
                         "max_batch_tokens %d is below max_seqs %d (every running sequence decodes "
                         "one token a step)",
                         p->max_batch_tokens, p->max_seqs);
    if (p->max_ctx < 1) return lm_errorf(LM_ERR_INVALID, "max_ctx %d is below 1", p->max_ctx);
    lm_status src = lm_spec_check(&p->spec);
    if (src) return src;
    long need = (p->max_ctx + LM_KV_BLOCK - 1) / LM_KV_BLOCK;
    if (p->n_blocks < need)
        return lm_errorf(LM_ERR_INVALID,
                         "a KV cache of %d blocks (%ld tokens) cannot hold one sequence of the "
                         "context size %d",
                         p->n_blocks, (long)p->n_blocks * LM_KV_BLOCK, p->max_ctx);
    struct lm_sched *s = calloc(1, sizeof *s);
    if (!s) return lm_errorf(LM_ERR_NOMEM, "out of memory for the scheduler");
    s->m = m;
    s->p = *p;
    s->gd = lm_model_gen_defaults(m);
    s->tok = lm_model_tokenizer(m);
    s->vocab = lm_model_config(m)->vocab_size;
    lm_status rc = lm_kv_cache_create(m, p->n_blocks, p->max_batch_tokens, p->max_ctx, &s->cache);
    if (rc) {
        free(s);
        return rc;
    }
    if ((rc = lm_kv_init(&s->kv, p->n_blocks, copy_rows, s->cache))) {
        lm_kv_cache_destroy(s->cache);
        free(s);
        return rc;
    }
    lm_sampler_init(&s->sampler, s->vocab);
    const char *trace = getenv("LM_STEP_TRACE");
    if (trace && *trace) {
        s->trace = fopen(trace, "w");
        if (s->trace)
            fprintf(s->trace, "# step forward_start_ms forward_ms plan_ms seqs tokens draft_tokens prefill_chunks "
                              "out_rows longest_context\n");
        else
            fprintf(stderr, "lumen: LM_STEP_TRACE=%s: cannot open it for writing; no step trace\n", trace);
    }
    s->max_run = lm_model_max_run(m);
    long rows = (long)p->max_seqs * (1 + p->spec.num_speculative_tokens);
    s->max_rows = (int)(rows < p->max_batch_tokens ? rows : p->max_batch_tokens);
    if (s->max_rows < p->max_seqs) s->max_rows = p->max_seqs;
    s->logits = malloc(sizeof(float) * (size_t)s->vocab * (size_t)s->max_rows);
    s->batch = calloc((size_t)p->max_seqs, sizeof *s->batch);
    s->plan = calloc((size_t)p->max_seqs, sizeof *s->plan);
    s->running = calloc((size_t)p->max_seqs, sizeof *s->running);
    s->dsamp = calloc((size_t)s->max_rows, sizeof *s->dsamp);
    s->ids = calloc((size_t)s->max_rows, sizeof *s->ids);
    s->ahead = calloc((size_t)p->max_seqs, sizeof *s->ahead);
    s->behind = calloc((size_t)p->max_seqs, sizeof *s->behind);
    s->feed = calloc((size_t)p->max_seqs, sizeof *s->feed);
    /* not with speculative decoding: a queued step carries no drafts, and one behind it none either */
    s->queue = p->queue && p->spec.num_speculative_tokens == 0 && lm_model_can_queue(m) &&
               lm_env_flag("LM_SCHED_QUEUE", true);
    s->queue_max = p->max_seqs;
    if (!s->logits || !s->batch || !s->plan || !s->running || !s->dsamp || !s->ids || !s->ahead || !s->behind ||
        !s->feed) {
        lm_sched_destroy(s);
        return lm_errorf(LM_ERR_NOMEM, "out of memory for the scheduler's logits (%d x %d floats)",
                         s->max_rows, s->vocab);
    }
    *out = s;
    return LM_OK;
}

/* ---- waiting list ---- */

/* Inserts q: at the front (preempted, resumes first), after the priority requests (priority),
 * or at the end. */
static void wait_push(struct lm_sched *s, struct seq *q, bool front) {
    struct seq **pp = &s->wait_head;
    if (!front) {
        if (q->r->priority)
            while (*pp && (*pp)->r->priority)
                pp = &(*pp)->next;
        else
            while (*pp)
                pp = &(*pp)->next;
    }
    q->next = *pp;
    *pp = q;
    s->n_waiting++;
}

static void running_remove(struct lm_sched *s, struct seq *q) {
    int i = 0;
    while (i < s->n_running && s->running[i] != q)
        i++;
    assert(i < s->n_running);
    memmove(s->running + i, s->running + i + 1,
            sizeof *s->running * (size_t)(s->n_running - i - 1));
    s->n_running--;
}

/* Keeps `running` in arrival order. */
static void running_insert(struct lm_sched *s, struct seq *q) {
    int i = s->n_running;
    while (i > 0 && s->running[i - 1]->arrival > q->arrival) {
        s->running[i] = s->running[i - 1];
        i--;
    }
    s->running[i] = q;
    s->n_running++;
}

/* ---- blocks of a sequence ---- */

/* Indexes the blocks that are full and computed. */
static void index_full_blocks(struct lm_sched *s, struct seq *q) {
    while ((q->n_indexed + 1) * LM_KV_BLOCK <= q->n_computed) {
        q->chain = lm_kv_commit(&s->kv, q->blocks[q->n_indexed], q->chain,
                                q->tokens + (size_t)q->n_indexed * LM_KV_BLOCK);
        q->n_indexed++;
    }
}

/* Gives every block back; the partly filled last one is indexed first, so that what was
 * computed stays reusable (a conversation's next turn, a preempted sequence's return). */
static void release_blocks(struct lm_sched *s, struct seq *q) {
    index_full_blocks(s, q);
    int rows = q->n_computed - q->n_indexed * LM_KV_BLOCK;
    if (rows > 0 && q->n_indexed < q->n_blocks)
        lm_kv_commit_partial(&s->kv, q->blocks[q->n_indexed], q->chain,
                             q->tokens + (size_t)q->n_indexed * LM_KV_BLOCK, rows);
    /* The tail first: the cached list then evicts a sequence's end before its prefix. */
    for (int i = q->n_blocks - 1; i >= 0; i--)
        lm_kv_release(&s->kv, q->blocks[i]);
    q->n_blocks = q->n_indexed = 0;
    q->n_computed = 0;
    q->chain = LM_KV_ROOT;
}

/* ---- finishing ---- */

static void seq_free(struct seq *q) {
    lm_emitter_free(&q->em);
    lm_spec_index_free(&q->idx);
    free(q->tokens);
    free(q->blocks);
    free(q);
}

/* Ends q (running or waiting, already unlinked from both lists) and hands it back. */
static void finish(struct lm_sched *s, struct seq *q, enum lm_finish how, lm_status status,
                   const char *error) {
    struct lm_sched_req *r = q->r;
    for (int i = 0; i < s->n_ahead; i++) /* its rows of queued steps go unread */
        if (s->ahead[i] == q) s->ahead[i] = NULL;
    for (int i = 0; i < s->n_behind; i++)
        if (s->behind[i] == q) s->behind[i] = NULL;
    struct lm_gen_result *res = &r->result;
    /* At EOS or the length limit the held text is flushed (a stop string may still end it);
     * after a stop string or a cancellation it is dropped. */
    if (q->flush && lm_emitter_finish(&q->em)) how = LM_FINISH_STOP;
    res->finish = how;
    r->status = status;
    if (status) snprintf(r->error, sizeof r->error, "%s", error ? error : "generation failed");
    release_blocks(s, q);
    double now = lm_now_ms();
    res->times.finish_ms = now;
    if (res->times.scheduled_ms) {
        double first = res->times.first_token_ms ? res->times.first_token_ms : now;
        res->prefill_s = (first - res->times.scheduled_ms) / 1e3;
        res->decode_s = (now - first) / 1e3;
    }
    s->st.requests++;
    s->st.prompt_tokens += q->n_prompt;
    s->st.cached_tokens += res->cached_tokens;
    s->st.generated_tokens += res->completion_tokens;
    seq_free(q);
    if (r->on_finish) r->on_finish(r); /* may free r */
}

static void finish_running(struct lm_sched *s, struct seq *q, enum lm_finish how, lm_status status,
                           const char *error) {
    running_remove(s, q);
    finish(s, q, how, status, error);
}

/* ---- submit ---- */

lm_status lm_sched_submit(struct lm_sched *s, struct lm_sched_req *r) {
    const struct lm_gen_request *g = &r->gen;
    if (g->n_prompt == 0 || !g->prompt) return lm_errorf(LM_ERR_INVALID, "prompt: no tokens");
    if (g->max_tokens < 0)
        return lm_errorf(LM_ERR_INVALID, "max_tokens: %d is negative", g->max_tokens);
    if (g->n_prompt > (size_t)s->p.max_ctx ||
        (size_t)g->max_tokens > (size_t)s->p.max_ctx - g->n_prompt)
        return lm_errorf(LM_ERR_RANGE,
                         "prompt (%zu tokens) + max_tokens (%d) = %zu exceeds the context of %d "
                         "tokens",
                         g->n_prompt, g->max_tokens, g->n_prompt + (size_t)g->max_tokens,
                         s->p.max_ctx);
    for (size_t i = 0; i < g->n_prompt; i++)
        if (g->prompt[i] < 0 || g->prompt[i] >= s->vocab)
            return lm_errorf(LM_ERR_INVALID,
                             "prompt: token id %d at index %zu is outside the "
                             "vocabulary [0, %d)",
                             g->prompt[i], i, s->vocab);
    struct seq *q = calloc(1, sizeof *q);
    if (!q) return lm_errorf(LM_ERR_NOMEM, "out of memory for a sequence");
    q->cap_tokens = (int)g->n_prompt + g->max_tokens + 1;
    q->cap_blocks = (q->cap_tokens + LM_KV_BLOCK - 1) / LM_KV_BLOCK + 1;
    q->tokens = malloc(sizeof *q->tokens * (size_t)q->cap_tokens);
    q->blocks = malloc(sizeof *q->blocks * (size_t)q->cap_blocks);
    if (!q->tokens || !q->blocks) {
        free(q->tokens);
        free(q->blocks);
        free(q);
        return lm_errorf(LM_ERR_NOMEM, "out of memory for a sequence of %zu tokens", g->n_prompt);
    }
    memcpy(q->tokens, g->prompt, sizeof *q->tokens * g->n_prompt);
    q->n_tokens = q->n_prompt = (int)g->n_prompt;
    q->chain = LM_KV_ROOT;
    q->r = r;
    q->arrival = s->arrivals++;
    if (g->sampling.seeded) {
        lm_rng_seed(&q->rng, g->sampling.seed);
        q->dev_seed = g->sampling.seed;
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        q->dev_seed = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^
                      (uint64_t)(uintptr_t)q ^ (uint64_t)q->arrival << 32;
        lm_rng_seed(&q->rng, q->dev_seed);
    }
    double arrival = r->result.times.arrival_ms;
    memset(&r->result, 0, sizeof r->result);
    r->result.times.arrival_ms = arrival ? arrival : lm_now_ms();
    r->result.prompt_tokens = q->n_prompt;
    r->status = LM_OK;
    r->error[0] = 0;
    r->priv = q;
    lm_emitter_init(&q->em, s->tok, g->stop, g->n_stop, &r->result.text, r->on_text, r->ctx);
    wait_push(s, q, false);
    return LM_OK;
}

/* ---- admission ---- */

/* Tokens of q that should come from the cache: all but the last when a token will be sampled
 * (its logits are needed), all of them for a prefill-only request. */
static int match_limit(const struct seq *q) {
    return q->r->gen.max_tokens > 0 ? q->n_tokens - 1 : q->n_tokens;
}

/* True when a running sequence is computing a longer prefix of q's tokens than the index holds
 * now: q waits for it rather than computing the same blocks again (a conversation's next turn
 * arriving while its prefix-warming request runs, or clients sharing a long system prompt). */
static bool should_defer(const struct lm_sched *s, const struct seq *q, int have) {
    for (int i = 0; i < s->n_running; i++) {
        const struct seq *o = s->running[i];
        int n = q->n_tokens < o->n_tokens ? q->n_tokens : o->n_tokens;
        if (n > match_limit(q)) n = match_limit(q);
        int k = 0;
        while (k < n && q->tokens[k] == o->tokens[k])
            k++;
        if (o->r->gen.max_tokens == 0) {
            /* A prefill-only request (prefix warming) indexes everything it computed, its last
             * partial block too, when it ends a few steps from now: wait for all of it. */
            if (k > have) return true;
            continue;
        }
        int will = k / LM_KV_BLOCK * LM_KV_BLOCK; /* whole blocks o will index as it goes */
        if (will >= have + LM_KV_BLOCK && o->n_computed < will) return true;
    }
    return false;
}

static void admit(struct lm_sched *s) {
    struct seq **pp = &s->wait_head;
    while (*pp && s->n_running < s->p.max_seqs) {
        struct seq *q = *pp;
        int limit = match_limit(q);
        int have = lm_kv_probe(&s->kv, q->tokens, limit);
        if (should_defer(s, q, have)) {
            pp = &q->next;
            continue;
        }
        /* Blocks for the whole current token list, plus one to grow into, beyond the shared
         * ones (which may themselves sit in the cached list, hence counted twice: a margin). */
        int total = (q->n_tokens + LM_KV_BLOCK - 1) / LM_KV_BLOCK;
        int shared = have / LM_KV_BLOCK;
        int need = total - shared + (q->r->gen.max_tokens > 0);
        if (lm_kv_available(&s->kv) - shared < need) break; /* first come, first served */
        *pp = q->next;
        q->next = NULL;
        s->n_waiting--;
        int nb = 0;
        q->n_computed = lm_kv_match(&s->kv, q->tokens, limit, q->blocks, &nb, &q->chain);
        q->n_blocks = nb;
        q->n_indexed = q->n_computed / LM_KV_BLOCK;
        running_insert(s, q);
        if (!q->started) {
            q->started = true;
            q->r->result.times.scheduled_ms = lm_now_ms();
            q->r->result.cached_tokens = q->n_computed < q->n_prompt ? q->n_computed : q->n_prompt;
            if (q->r->on_start) q->r->on_start(q->r);
        }
        if (q->n_computed == q->n_tokens) /* prefill only, and all of it cached already */
            finish_running(s, q, LM_FINISH_LENGTH, LM_OK, NULL);
    }
}

/* ---- planning ---- */

/* Takes q's blocks back and puts it at the front of the waiting list (after the step). */
static void preempt(struct lm_sched *s, struct seq *q) {
    release_blocks(s, q);
    q->preempt = true;
    q->r->result.preemptions++;
    s->st.preemptions++;
}

/* The running sequence that came last and is not yet preempted. */
static struct seq *victim(struct lm_sched *s) {
    for (int i = s->n_running - 1; i >= 0; i--)
        if (!s->running[i]->preempt) return s->running[i];
    return NULL;
}

/* Proposes q's draft for this step into tokens[n_tokens ..] (room: cap_tokens holds max_tokens;
 * at most `room` tokens, no more than its max_tokens can still take after this step's own token,
 * and a run the model takes at decode cost: lm_model_max_run). Returns the count. */
static int propose(struct lm_sched *s, struct seq *q, int room) {
    int left = q->r->gen.max_tokens - (q->n_tokens - q->n_prompt) - 1;
    if (room > left) room = left;
    if (room > s->max_run - 1) room = s->max_run - 1;
    if (room <= 0) return 0;
    if (lm_spec_index_extend(&q->idx, q->tokens, q->n_tokens)) return 0; /* no memory: no draft */
    return lm_spec_propose_indexed(&s->p.spec, &q->idx, q->tokens, q->n_tokens, room,
                                   q->tokens + q->n_tokens);
}

/* Gives the planned decoding sequences their drafts, in arrival order, from what the step has
 * left once every pending token and prefill chunk is planned: token budget, output rows, and
 * KV blocks from the free pool only (a draft is a guess: it never evicts a cached prefix or
 * preempts anyone). None in a step of more than disable_by_batch_size sequences. */
static void plan_drafts(struct lm_sched *s, int n_plan, int budget) {
    if (s->p.spec.disable_by_batch_size > 0 && n_plan > s->p.spec.disable_by_batch_size) return;
    int rows = n_plan; /* output rows at most: one a sequence, plus the drafts */
    for (int i = 0; i < n_plan && budget > 0 && rows < s->max_rows; i++) {
        struct seq *q = s->plan[i];
        if (q->n_tokens - q->n_computed != 1) continue; /* prefilling */
        int d = propose(s, q, budget < s->max_rows - rows ? budget : s->max_rows - rows);
        int need = (q->n_computed + 1 + d + LM_KV_BLOCK - 1) / LM_KV_BLOCK;
        while (q->n_blocks < need) {
            int b = lm_kv_alloc_free(&s->kv);
            if (b < 0) break;
            q->blocks[q->n_blocks++] = b;
        }
        if (d > q->n_blocks * LM_KV_BLOCK - q->n_computed - 1)
            d = q->n_blocks * LM_KV_BLOCK - q->n_computed - 1;
        if (d <= 0) continue;
        q->n_draft = d;
        q->chunk += d;
        budget -= d;
        rows += d;
    }
}

/* Plans this step into s->plan; returns the number of sequences in it. */
static int plan_step(struct lm_sched *s) {
    int n_dec = 0;
    for (int i = 0; i < s->n_running; i++)
        n_dec += s->running[i]->n_tokens - s->running[i]->n_computed == 1;
    int budget = s->p.max_batch_tokens - n_dec; /* for prefill chunks, then drafts */
    int n_plan = 0;
    for (int i = 0; i < s->n_running; i++) {
        struct seq *q = s->running[i];
        q->n_draft = 0;
        if (q->preempt) continue;
        int pending = q->n_tokens - q->n_computed;
        assert(pending >= 1);
        int chunk = pending == 1 ? 1 : pending < budget ? pending : budget;
        if (chunk <= 0) continue;
        int want = (q->n_computed + chunk + LM_KV_BLOCK - 1) / LM_KV_BLOCK;
        bool ok = true;
        while (ok && q->n_blocks < want) {
            int b = lm_kv_alloc(&s->kv);
            if (b >= 0) {
                q->blocks[q->n_blocks++] = b;
                continue;
            }
            struct seq *v = victim(s);
            assert(v);
            preempt(s, v);
            if (v == q) ok = false;
        }
        if (!ok) continue;
        if (pending > 1) budget -= chunk;
        q->chunk = chunk;
        s->plan[n_plan++] = q;
    }
    /* Drop victims that were planned before they were chosen (their blocks are gone). */
    int k = 0;
    for (int i = 0; i < n_plan; i++)
        if (!s->plan[i]->preempt) s->plan[k++] = s->plan[i];
    n_plan = k;
    if (s->p.spec.num_speculative_tokens > 0) plan_drafts(s, n_plan, budget);
    /* Victims go back to the front of the waiting list, earliest arrival first. */
    for (int i = s->n_running - 1; i >= 0; i--) {
        struct seq *q = s->running[i];
        if (!q->preempt) continue;
        q->preempt = false;
        running_remove(s, q);
        wait_push(s, q, true);
    }
    return n_plan;
}

/* ---- sampling ---- */

/* True when the device can draw q's tokens itself: greedy, temperature, top_k, top_p; not
 * penalties, min_p or logprobs, which need the logits on the host. */
static bool device_samples(const struct seq *q) {
    const struct lm_sampling_params *p = &q->r->gen.sampling;
    return !lm_sampling_needs_history(p) && p->min_p <= 0 && !p->logprobs && p->top_logprobs == 0;
}

/* q's row of a step whose tokens the device chooses. The draw depends on (seed, index of the
 * token in the request) alone: batch-invariant, and the same after a preemption. */
static struct lm_device_sampling device_params(const struct seq *q) {
    const struct lm_sampling_params *p = &q->r->gen.sampling;
    return (struct lm_device_sampling){.temperature = p->temperature,
                                       .top_p = p->top_p,
                                       .top_k = p->top_k,
                                       .seed = q->dev_seed,
                                       .counter = (uint64_t)(q->n_tokens - q->n_prompt)};
}

static bool accept_token(struct lm_sched *s, struct seq *q, int32_t id,
                         const struct lm_token_logprob *lp);

/* Samples q's next token from the logits `row` with its parameters, history and RNG; fills
 * *lp when the request asks for logprobs. */
static int32_t choose_token(struct lm_sched *s, struct seq *q, const float *row,
                            struct lm_token_logprob *lp) {
    const struct lm_sampling_params *p = &q->r->gen.sampling;
    int n_out = q->n_tokens - q->n_prompt;
    struct lm_token_history hist = {q->tokens, (size_t)q->n_prompt, q->tokens + q->n_prompt,
                                    (size_t)n_out};
    return lm_sample_next(&s->sampler, row, p, &hist, &q->rng, p->logprobs ? lp : NULL);
}

/* Samples q's next token from `row` (or takes `id` the device chose, when row is NULL) and
 * streams it; finishes q when it ends. Returns true when q finished. */
static bool take_token(struct lm_sched *s, struct seq *q, const float *row, int32_t id) {
    struct lm_sched_req *r = q->r;
    if (!row) return accept_token(s, q, id, NULL);
    struct lm_token_logprob lp;
    id = choose_token(s, q, row, &lp);
    return accept_token(s, q, id, r->gen.sampling.logprobs ? &lp : NULL);
}

/* Appends id to q (EOS, stop strings and limits end it); the first one sets the first-token
 * time, whichever step (prefill, decode, verification) chose it. */
static bool accept_token(struct lm_sched *s, struct seq *q, int32_t id,
                         const struct lm_token_logprob *lp) {
    struct lm_sched_req *r = q->r;
    struct lm_gen_result *res = &r->result;
    if (!res->times.first_token_ms) res->times.first_token_ms = lm_now_ms();
    bool eos = false;
    for (int i = 0; i < s->gd->n_eos; i++)
        eos |= id == s->gd->eos_token_ids[i];
    if (eos && !r->gen.ignore_eos) {
        q->flush = true;
        finish_running(s, q, LM_FINISH_STOP, LM_OK, NULL);
        return true;
    }
    q->tokens[q->n_tokens++] = id;
    lm_ids_push(&res->ids, id);
    if (lp) lm_logprob_list_push(&res->logprobs, lp);
    res->completion_tokens++;
    bool stopped = false;
    lm_status rc = lm_emitter_push(&q->em, id, &stopped);
    if (rc) {
        finish_running(s, q, LM_FINISH_NONE, rc, lm_error_message());
        return true;
    }
    if (stopped) {
        finish_running(s, q, LM_FINISH_STOP, LM_OK, NULL);
        return true;
    }
    if (q->em.cancelled) {
        finish_running(s, q, LM_FINISH_CANCELLED, LM_OK, NULL);
        return true;
    }
    if (res->completion_tokens >= r->gen.max_tokens) {
        q->flush = true;
        finish_running(s, q, LM_FINISH_LENGTH, LM_OK, NULL);
        return true;
    }
    return false;
}

/* ---- the step ---- */

/* After a step that ran q's pending token and its n_draft draft tokens (output rows
 * row0..row0 + n_draft): takes the model's token of each row in order, as plain decoding would
 * (sampler state and history as of that token), for as long as each token equals the draft token
 * fed after it (speculative sampling for a one-hot draft: spec.h). The pending token's K/V and
 * those of accepted draft tokens are kept; the rest lie past n_computed and are overwritten
 * later. Returns the rows q had. */
static int verify(struct lm_sched *s, struct seq *q, bool on_device, int row0) {
    const int nd = q->n_draft, rows = nd + 1;
    q->n_computed++; /* the pending token */
    q->n_draft = 0;
    s->st.spec_drafts++;
    struct lm_gen_result *res = &q->r->result;
    /* vLLM's counting: every draft token the step ran, whether or not the sequence got as far as
     * comparing it (a stop or the length limit can end it first). */
    s->st.spec_draft_tokens += nd;
    res->draft_tokens += nd;
    for (int j = 0; j <= nd; j++) {
        const float *row = on_device ? NULL : s->logits + (size_t)(row0 + j) * s->vocab;
        struct lm_token_logprob lp;
        int32_t id = row ? choose_token(s, q, row, &lp) : s->ids[row0 + j];
        /* tokens[n_tokens] is draft token j until accept_token writes the model's token there */
        bool match = j < nd && id == q->tokens[q->n_tokens];
        /* Counted now: taking the token may finish q and free its request. */
        s->st.spec_accepted_tokens += match;
        res->accepted_tokens += match;
        if (accept_token(s, q, id, row && q->r->gen.sampling.logprobs ? &lp : NULL)) return rows;
        if (!match) break;
        q->n_computed++; /* the draft token fed at this position was the model's own */
    }
    index_full_blocks(s, q);
    return rows;
}

static bool cancelled(const struct seq *q) {
    return q->r->gen.cancel && atomic_load(q->r->gen.cancel);
}

/* One line of LM_STEP_TRACE (sched.h) for the step just run. */
static void trace_step(struct lm_sched *s, int n, int tokens, int drafts, int rows, double t0, double tf) {
    int longest = 0, chunks = 0;
    for (int i = 0; i < n; i++) {
        const int end = s->batch[i].pos + s->batch[i].n;
        if (end > longest) longest = end;
        chunks += s->batch[i].n > 1 + s->plan[i]->n_draft; /* more than its pending token + draft (a
                                                               one-token chunk counts as a decode, as in
                                                               decode_steps) */
    }
    fprintf(s->trace, "%lld %.3f %.3f %.3f %d %d %d %d %d %d\n", s->st.steps, tf, lm_now_ms() - tf, tf - t0, n,
            tokens, drafts, chunks, rows, longest);
    fflush(s->trace); /* a line a step even if the process dies */
}

/* ---- steps queued ahead (sched.h) ---- */

/* Collects every queued step and drops its ids (the scheduler is closing, or a step failed). */
static void drain(struct lm_sched *s) {
    while (s->n_queued > 0) {
        s->n_queued--;
        (void)lm_model_collect(s->m, s->cache, s->ids, NULL);
    }
    s->n_ahead = s->n_behind = 0;
}

/* Fails every sequence of the queued steps with the model's error. */
static void fail_queued(struct lm_sched *s) {
    char msg[256];
    snprintf(msg, sizeof msg, "%s", lm_error_message());
    for (int i = 0; i < s->n_ahead; i++)
        if (s->ahead[i]) finish_running(s, s->ahead[i], LM_FINISH_NONE, LM_ERR_IO, msg);
    for (int i = 0; i < s->n_behind; i++)
        if (s->behind[i]) finish_running(s, s->behind[i], LM_FINISH_NONE, LM_ERR_IO, msg);
    drain(s);
}

/* Queues the step after the one in s->ahead: each of its sequences decodes the token that step
 * chooses for it (fed on the device from its row). Only when every running sequence is in it,
 * none is cancelled or could reach max_tokens with that token, nothing waits, and each gets a KV
 * block for the new position from the free pool; else nothing is queued (false). */
static bool queue_behind(struct lm_sched *s) {
    if (s->n_waiting > 0) return false;
    int n = 0;
    for (int i = 0; i < s->n_ahead; i++) {
        struct seq *q = s->ahead[i];
        if (!q) continue;
        const struct lm_gen_result *res = &q->r->result;
        /* after the ahead step's token, room for one more */
        if (cancelled(q) || res->completion_tokens + 2 > q->r->gen.max_tokens) return false;
        s->behind[n] = q;
        s->feed[n++] = i;
    }
    if (n == 0 || n != s->n_running || n > s->queue_max) return false;
    for (int i = 0; i < n; i++) {
        struct seq *q = s->behind[i];
        /* the ahead step computes position n_computed; this one the next */
        const int need = (q->n_computed + 2 + LM_KV_BLOCK - 1) / LM_KV_BLOCK;
        while (q->n_blocks < need) {
            const int b = lm_kv_alloc_free(&s->kv);
            if (b < 0) return false; /* blocks taken so far stay with their sequences */
            q->blocks[q->n_blocks++] = b;
        }
        s->batch[i] = (struct lm_batch_seq){q->tokens, 1, q->n_computed + 1, q->blocks, LM_LOGITS_LAST};
        s->plan[i] = q;
        s->dsamp[i] = device_params(q);
        s->dsamp[i].counter++; /* the token after the ahead step's */
    }
    double tf = lm_now_ms();
    const lm_status rc = lm_model_queue_sample(s->m, s->cache, s->batch, n, s->dsamp, s->feed);
    s->st.forward_s += (lm_now_ms() - tf) / 1e3;
    if (rc == LM_ERR_RANGE) s->queue_max = n - 1; /* more than one device call takes */
    if (rc) return false; /* the ahead step is collected as usual; this call then plans afresh */
    if (s->trace) trace_step(s, n, n, 0, n, tf, tf);
    s->n_behind = n;
    s->n_queued++;
    s->st.steps++;
    s->st.step_tokens += n;
    s->st.decode_steps++;
    s->st.device_sampled_steps++;
    s->st.queued_steps++;
    return true;
}

/* The start of lm_sched_step while a step is queued: queue the next one if it can be, then
 * collect the queued one and take its tokens (step 5). */
static void step_queued(struct lm_sched *s) {
    const double t0 = lm_now_ms();
    queue_behind(s);
    double tf = lm_now_ms();
    lm_status rc = lm_model_collect(s->m, s->cache, s->ids, NULL);
    s->st.forward_s += (lm_now_ms() - tf) / 1e3;
    s->n_queued--;
    if (rc) {
        fail_queued(s);
        return;
    }
    for (int i = 0; i < s->n_ahead; i++) {
        struct seq *q = s->ahead[i];
        if (!q) continue; /* finished since it was queued */
        if (cancelled(q)) { /* as step 1 would have it: no token after the flag is seen */
            finish_running(s, q, LM_FINISH_CANCELLED, LM_OK, NULL);
            continue;
        }
        q->n_computed++;
        index_full_blocks(s, q);
        take_token(s, q, NULL, s->ids[i]);
    }
    /* The step behind (if any) is next. */
    struct seq **t = s->ahead;
    s->ahead = s->behind;
    s->behind = t;
    s->n_ahead = s->n_behind;
    s->n_behind = 0;
    s->st.busy_s += (lm_now_ms() - t0) / 1e3;
}

int lm_sched_step(struct lm_sched *s) {
    /* A queued step: collected now, the next queued behind it if it can be; if not, this call
     * goes on to plan a step as below (every call runs a forward step while there is work). */
    if (s->n_queued > 0) {
        step_queued(s);
        if (s->n_queued > 0) return s->n_running + s->n_waiting;
    }
    /* 1. Cancellations: running sequences stop, waiting ones never run. */
    for (int i = s->n_running - 1; i >= 0; i--)
        if (cancelled(s->running[i]))
            finish_running(s, s->running[i], LM_FINISH_CANCELLED, LM_OK, NULL);
    for (struct seq **pp = &s->wait_head; *pp;) {
        struct seq *q = *pp;
        if (!cancelled(q)) {
            pp = &q->next;
            continue;
        }
        *pp = q->next;
        s->n_waiting--;
        finish(s, q, LM_FINISH_CANCELLED, LM_OK, NULL);
    }

    /* 2. Admission, 3. the plan. */
    double t0 = lm_now_ms();
    admit(s);
    int n = plan_step(s);
    if (n == 0) return s->n_running + s->n_waiting;

    /* 4. One forward over every planned sequence. On a device that samples, it chooses the
     * tokens of every sequence it can draw for (only ids cross to the host); the logits come back
     * too when some sequence needs them (penalties, min_p, logprobs: sampled here), and the
     * others keep their device draws, so a seeded request's tokens do not depend on what it is
     * batched with. Without such a device, logits come back and the sampler runs here. */
    int tokens = 0, rows = 0, drafts = 0;
    const bool dev = lm_model_samples_on_device(s->m);
    bool host_rows = false; /* some sequence samples on the host */
    for (int i = 0; i < n; i++) {
        struct seq *q = s->plan[i];
        bool last = q->n_computed + q->chunk - q->n_draft == q->n_tokens && q->r->gen.max_tokens > 0;
        s->batch[i] = (struct lm_batch_seq){q->tokens + q->n_computed, q->chunk, q->n_computed,
                                            q->blocks,
                                            q->n_draft  ? LM_LOGITS_ALL
                                            : last      ? LM_LOGITS_LAST
                                                        : LM_LOGITS_NONE};
        tokens += q->chunk;
        drafts += q->n_draft;
        if (last) {
            const bool own = dev && device_samples(q);
            host_rows = host_rows || !own;
            /* A draft's rows draw the tokens plain decoding would draw there: the counter is the
             * token's index in the request. A host-sampled sequence's rows get a greedy draw that
             * nothing reads. */
            for (int j = 0; j <= q->n_draft && dev; j++) {
                struct lm_device_sampling d = {0};
                if (own) {
                    d = device_params(q);
                    d.counter += (uint64_t)j;
                }
                s->dsamp[rows + j] = d;
            }
            rows += 1 + q->n_draft;
        }
    }
    double tf = lm_now_ms();
    /* A steady decode step (every running sequence one token, the last of its list, that the
     * device chooses; nothing waiting) is queued, not waited for: the next lm_sched_step queues
     * the one after it and then takes this one's tokens (sched.h). One token a sequence and an
     * output row each (tokens == rows == n, no drafts) is what makes every sequence's row LAST. */
    bool queued = false;
    if (s->queue && dev && !host_rows && drafts == 0 && tokens == n && rows == n && n == s->n_running &&
        n <= s->queue_max && s->n_waiting == 0) {
        const lm_status qrc = lm_model_queue_sample(s->m, s->cache, s->batch, n, s->dsamp, NULL);
        if (qrc == LM_ERR_RANGE) s->queue_max = n - 1; /* waited for below */
        queued = !qrc;
    }
    lm_status rc = queued ? LM_OK
                   : dev  ? lm_model_forward_sample(s->m, s->cache, s->batch, n, s->dsamp, s->ids,
                                                    host_rows ? s->logits : NULL)
                          : lm_model_forward(s->m, s->cache, s->batch, n, s->logits);
    s->st.forward_s += (lm_now_ms() - tf) / 1e3;
    if (s->trace) trace_step(s, n, tokens, drafts, rows, t0, tf);
    s->st.steps++;
    s->st.step_tokens += tokens;
    s->st.decode_steps += tokens - drafts == n; /* no prefill chunk (drafts may ride along) */
    s->st.device_sampled_steps += dev && !host_rows;
    s->st.queued_steps += queued;
    if (queued) { /* its tokens are taken by the next lm_sched_step (step_queued) */
        for (int i = 0; i < n; i++) s->ahead[i] = s->plan[i];
        s->n_ahead = n;
        s->n_queued = 1;
        s->st.busy_s += (lm_now_ms() - t0) / 1e3;
        return s->n_running + s->n_waiting;
    }
    if (rc) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s", lm_error_message());
        for (int i = 0; i < n; i++)
            finish_running(s, s->plan[i], LM_FINISH_NONE, rc, msg);
        return s->n_running + s->n_waiting;
    }

    /* 5. Index what is new, sample, stream, finish. */
    int row = 0;
    for (int i = 0; i < n; i++) {
        struct seq *q = s->plan[i];
        const bool on_device = dev && device_samples(q);
        if (q->n_draft) {
            row += verify(s, q, on_device, row);
            continue;
        }
        bool wants = s->batch[i].logits == LM_LOGITS_LAST;
        q->n_computed += q->chunk;
        index_full_blocks(s, q);
        if (q->n_computed < q->n_tokens) continue; /* prefill goes on next step */
        if (q->r->gen.max_tokens == 0) {
            finish_running(s, q, LM_FINISH_LENGTH, LM_OK, NULL); /* prefill only: done */
            continue;
        }
        assert(wants);
        if (on_device)
            take_token(s, q, NULL, s->ids[row]);
        else
            take_token(s, q, s->logits + (size_t)row * s->vocab, 0);
        row += wants;
    }
    s->st.busy_s += (lm_now_ms() - t0) / 1e3;
    return s->n_running + s->n_waiting;
}

void lm_sched_cancel_all(struct lm_sched *s) {
    drain(s);
    while (s->n_running > 0)
        finish_running(s, s->running[s->n_running - 1], LM_FINISH_CANCELLED, LM_OK, NULL);
    while (s->wait_head) {
        struct seq *q = s->wait_head;
        s->wait_head = q->next;
        s->n_waiting--;
        finish(s, q, LM_FINISH_CANCELLED, LM_OK, NULL);
    }
}

void lm_sched_destroy(struct lm_sched *s) {
    if (!s) return;
    if (s->running) lm_sched_cancel_all(s);
    if (s->cache) drain(s);
    if (s->trace) fclose(s->trace);
    lm_kv_free(&s->kv);
    lm_kv_cache_destroy(s->cache);
    lm_sampler_free(&s->sampler);
    free(s->logits);
    free(s->dsamp);
    free(s->ids);
    free(s->batch);
    free(s->plan);
    free(s->running);
    free(s->ahead);
    free(s->behind);
    free(s->feed);
    free(s);
}

void lm_sched_stats(const struct lm_sched *s, struct lm_sched_stats *out) {
    *out = s->st;
    out->running = s->n_running;
    out->waiting = s->n_waiting;
    out->kv_blocks = s->kv.n_blocks;
    out->kv_blocks_used = lm_kv_used(&s->kv);
    out->kv_blocks_cached = s->kv.n_cached;
    out->kv_blocks_free = s->kv.n_free;
    out->evictions = s->kv.evictions;
}
