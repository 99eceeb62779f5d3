/* sched.h: the serving engine's scheduler: continuous batching over a paged KV cache with
 * prefix reuse.
 *
 * One engine thread calls lm_sched_step in a loop. Each step:
 *  1. drops sequences whose cancel flag is set (waiting ones never run; running ones stop and
 *     give their KV blocks back), so a cancellation takes effect within one step;
 *  2. admits waiting requests, first come first served (prefix-warming requests first), while
 *     fewer than max_seqs run and the KV pool can hold their prompt: each takes the longest
 *     cached prefix of its prompt from the block index (engine/kv.h) and prefills only the rest;
 *  3. plans one forward step of at most max_batch_tokens tokens: every running sequence that is
 *     decoding contributes its one new token, and sequences still prefilling share what is left
 *     of the budget in admission order (chunked prefill, so a long prompt never stalls the
 *     decodes); a sequence that needs a KV block when none is free takes one from the most
 *     recently admitted sequence, which is preempted (its blocks are released, still cached, and
 *     it is recomputed when readmitted: vLLM's recompute preemption); with speculative decoding
 *     on (params.spec), a decoding sequence also carries up to num_speculative_tokens draft
 *     tokens proposed by n-gram lookup (engine/spec.h), as far as the token budget, its
 *     max_tokens and the free KV blocks allow (drafts never preempt anyone);
 *  4. runs the step as one lm_model_forward, so every weight matrix is read once per step; on a
 *     model that chooses tokens on its device (lm_model_samples_on_device: CUDA), as one
 *     lm_model_forward_sample instead: a sequence that samples in a way the device can (greedy,
 *     temperature, top_k, top_p) takes the device's token (seed: the request's, or one from the
 *     clock; counter: the token's index in the request), whatever it is batched with; the logits
 *     come back too only when some sequence needs them (penalties, min_p, logprobs), for the
 *     host sampler;
 *  5. indexes the blocks that became full, samples each sequence that reached its last token
 *     (per sequence: its own sampling parameters, token history and RNG), streams text through
 *     its emitter (stop strings held back) and finishes sequences at EOS, a stop string or
 *     max_tokens. A sequence with a draft samples its rows in order, as plain decoding would
 *     sample those tokens, and stops at the first token that differs from the draft (that token
 *     is kept: it is the model's own); the K/V of the rejected draft positions is overwritten
 *     later. So speculation changes how many steps a request takes, never its tokens (spec.h).
 *
 * Steps queued ahead (params.queue, on a model that can: lm_model_can_queue, CUDA): a step whose
 * every running sequence decodes one token the device chooses, with nothing waiting and no
 * drafts, is queued (lm_model_queue_sample) rather than waited for. Each later lm_sched_step
 * then queues the next such step first, its tokens the queued step's choices taken on the device,
 * and only then collects the queued step's ids and does step 5 with them, so that the GPU runs a
 * step while the host streams the last one (vLLM's asynchronous scheduling). A sequence that
 * ends at a collected step leaves a row of the step behind it unread (its K/V written past the
 * positions it keeps: never read, nor cached); one that could end by max_tokens, a cancellation,
 * a waiting request, no free KV block for the next position, or more sequences than one device
 * call takes stops the chain: the queued step is collected (a cancelled sequence's token is
 * dropped, as step 1 would) and the same lm_sched_step goes on to plan as above. The tokens are
 * the same either way. A request that arrives while a step is queued behind the running one
 * waits for both before its prefill is planned (time to first token one step longer). When
 * every sequence has ended, lm_sched_step may return 0 with a step still queued (its rows all
 * unread); the next call, lm_sched_cancel_all or lm_sched_destroy collects it. The stats count
 * queued steps as steps (also one whose ids a cancel-all or a failure dropped).
 *
 * Batch invariance: the forward computes every row as it would alone (family/model.h), and
 * sampling is per sequence, so a request's ids do not depend on what runs beside it, on the
 * chunking of its prompt, on the blocks it got or on preemption.
 *
 * Step trace: with LM_STEP_TRACE=FILE in the environment, lm_sched_create opens FILE (truncated;
 * one scheduler a process should trace) and each step appends one line, flushed: the step index,
 * its forward's start (ms, lm_now_ms's clock) and time, the admission + planning time before the
 * forward (ms), the sequences, tokens and draft tokens it ran, how many of the sequences were
 * prefill chunks of more than one token, its output rows, and its longest context (positions). A
 * header line starting with # names the columns. For finding where serving time goes
 * (docs/ENGINE.md): the next line's forward start minus this one's forward end, less the next
 * line's plan_ms, is the sampling, streaming and bookkeeping between the two forwards. A queued
 * step's line (see below) times only its queueing (its plan_ms is 0 when it was queued behind
 * another): the GPU's time and the host's overlap there, and the wait for its ids falls in the
 * next line's gap.
 *
 * Not thread-safe: everything here runs on the engine thread; callbacks are called from
 * lm_sched_step on that thread. */
#ifndef LM_ENGINE_SCHED_H
#define LM_ENGINE_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "engine/generate.h"
#include "engine/kv.h"
#include "engine/spec.h"
#include "family/model.h"

struct lm_sched_params {
    int max_seqs;         /* sequences running at once (default 16) */
    int max_batch_tokens; /* tokens per forward step, decodes plus prefill chunks (default 512);
                             at least max_seqs */
    int n_blocks;         /* KV blocks of LM_KV_BLOCK positions in the pool; must hold max_ctx */
    int max_ctx;          /* positions one sequence may reach (prompt + completion) */
    struct lm_spec_params spec; /* speculative decoding (engine/spec.h); zeroed: off */
    bool queue;           /* queue steady decode steps ahead where the model can (default true;
                             LM_SCHED_QUEUE=0 in the environment turns it off; never with
                             speculative decoding, whose steps carry drafts) */
};
struct lm_sched_params lm_sched_default_params(void); /* n_blocks and max_ctx are 0: set them */

struct lm_sched_req;

/* Callbacks, on the engine thread. on_start: admitted for the first time. on_finish: `result`
 * and `status` are final and the scheduler has let go of the request (the caller may free it
 * from here on). */
typedef void (*lm_sched_event_fn)(struct lm_sched_req *r);

/* One request. The caller owns it and keeps it alive until on_finish. */
struct lm_sched_req {
    /* In: set before lm_sched_submit, read-only afterwards. */
    struct lm_gen_request gen; /* prompt, max_tokens (0: prefill only), sampling, stop strings,
                                  ignore_eos, cancel flag (polled every step); borrowed */
    bool priority;             /* admitted before ordinary requests (prefix warming) */
    lm_gen_text_fn on_text;    /* released text (emit.h); may be NULL; return false cancels */
    lm_sched_event_fn on_start, on_finish; /* may be NULL */
    void *ctx;                             /* for the callbacks */

    /* Out: final at on_finish. */
    struct lm_gen_result result; /* ids, text, finish, token counts, cached_tokens, times (arrival
                                    set by lm_sched_submit unless already set), logprobs; the
                                    caller frees it (lm_gen_result_free) */
    lm_status status;            /* LM_OK (finish says how it ended; LM_FINISH_CANCELLED when the
                                    flag or callback cancelled it) or the error */
    char error[256];             /* message of a non-OK status */

    void *priv; /* the scheduler's */
};

/* Counters for /metrics, logs and tests. */
struct lm_sched_stats {
    int running, waiting;  /* sequences admitted / submitted and not yet admitted */
    int kv_blocks;         /* blocks in the pool */
    int kv_blocks_used;    /* held by running sequences */
    int kv_blocks_cached;  /* held by none but indexed for prefix reuse (evictable) */
    int kv_blocks_free;    /* held by none, not indexed */
    long long steps;       /* forward steps run */
    long long step_tokens; /* tokens run in those steps */
    long long requests;    /* requests finished (any way) */
    long long prompt_tokens, cached_tokens, generated_tokens; /* over finished requests */
    long long preemptions, evictions;
    /* Where the engine thread's time goes (wall clock): */
    double busy_s;           /* inside lm_sched_step steps that ran a forward */
    double forward_s;        /* of which inside the model's forward step */
    long long decode_steps;  /* steps with no prefill chunk (every sequence decodes one token,
                                plus its draft with speculative decoding) */
    long long device_sampled_steps; /* steps whose tokens the device chose alone (only ids came
                                       back; lm_model_forward_sample without logits) */
    long long queued_steps;         /* of which queued ahead (lm_model_queue_sample) */
    /* Speculative decoding (vLLM's spec_decode counters): */
    long long spec_drafts;          /* sequence-steps that verified a draft */
    long long spec_draft_tokens;    /* draft tokens run in those steps (vLLM's num_draft_tokens:
                                       also those a stop or max_tokens left unexamined) */
    long long spec_accepted_tokens; /* of which accepted (each saves a step) */
};

struct lm_sched;

/* A scheduler over `m` with its own KV cache (lm_kv_cache_create). `m` is borrowed and must
 * outlive it. LM_ERR_INVALID for parameters out of range (message names them), LM_ERR_NOMEM. */
lm_status lm_sched_create(struct lm_model *m, const struct lm_sched_params *p,
                          struct lm_sched **out);
/* Frees the scheduler. Requests still inside finish first as cancelled (on_finish is called). */
void lm_sched_destroy(struct lm_sched *s);

/* Queues `r`. LM_ERR_INVALID (empty prompt, negative max_tokens) or LM_ERR_RANGE (prompt +
 * max_tokens beyond max_ctx) with a message; the request is then not taken (no callback). */
lm_status lm_sched_submit(struct lm_sched *s, struct lm_sched_req *r);
/* Runs one step (see above). Returns the number of requests still inside (running + waiting);
 * 0 means idle. Errors of the forward fail the requests of that step (status set), not the
 * scheduler. */
int lm_sched_step(struct lm_sched *s);
/* Cancels everything inside: each request finishes with LM_FINISH_CANCELLED at once. */
void lm_sched_cancel_all(struct lm_sched *s);

void lm_sched_stats(const struct lm_sched *s, struct lm_sched_stats *out);
const struct lm_sched_params *lm_sched_params(const struct lm_sched *s);

#endif
