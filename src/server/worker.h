/* worker.h: the engine thread and the queue in front of it.
 *
 * One engine thread runs the continuous-batching scheduler (engine/sched.h): every step, all
 * running requests decode one token in one batched forward pass, new requests join between
 * steps, long prompts are prefilled in chunks, and the paged KV cache reuses the longest cached
 * prefix of every prompt. Network threads and the engine meet only here: a job is created and
 * filled on a network thread, submitted (bounded: max_seqs running plus max_queue waiting, 429
 * beyond), and the network thread then waits on the job for released text and completion.
 * Everything a job shares between the two sides is guarded by the worker's one mutex; the job
 * is reference-counted (creator + engine) and freed, with the request's memory, when the last
 * side lets go.
 *
 * Cancellation: lm_job_cancel sets the job's cancel flag. A job not yet handed to the engine
 * leaves the queue at once; one waiting inside the scheduler is dropped at its next step without
 * running; a running one stops within one step and its KV blocks go back to the pool.
 *
 * Multi-turn reuse: Qwen3's template drops an earlier turn's <think> block, so the prompt of a
 * conversation's next turn differs from what the model generated right after the turn's
 * "<|im_start|>assistant\n". When a chat job ends, the engine renders the conversation plus the
 * generated text as the next request will render it (the family's own template, with a
 * placeholder user turn that is cut off), tokenizes it, and queues a prefill-only request of
 * those tokens with priority, so the canonical form's blocks are cached when turn 2 arrives
 * (a turn 2 that arrives while that prefill runs waits for it rather than computing it twice).
 *
 * Shutdown: lm_worker_shutdown stops taking jobs, lets queued and running jobs finish for up to
 * shutdown_timeout_s, then cancels what is left ("server is shutting down") and joins. */
#ifndef LM_SERVER_WORKER_H
#define LM_SERVER_WORKER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "base/buf.h"
#include "base/status.h"
#include "engine/generate.h"
#include "engine/sched.h"
#include "family/model.h"
#include "server/openai.h"
#include "server/server.h"

enum lm_job_state {
    LM_JOB_NEW,     /* created, not submitted */
    LM_JOB_QUEUED,  /* submitted, waiting to be admitted */
    LM_JOB_RUNNING, /* admitted: prefilling or decoding */
    LM_JOB_DONE,    /* finished, failed or cancelled; result/status final */
};

struct lm_worker;

struct lm_job {
    /* Filled by the creator before lm_worker_submit; read-only afterwards. Owned by the job. */
    struct lm_chat_request req; /* the parsed request (owns the stop strings). When it holds
                                   chat messages (n_messages > 0), the finished turn's canonical
                                   form is cached for the conversation's next turn. */
    struct lm_ids prompt;       /* prompt ids */
    struct lm_gen_request gen;  /* points into req and prompt; gen.cancel = &cancel */
    bool stream;                /* release text to `pending` as it is generated */

    atomic_bool cancel; /* set by lm_job_cancel; polled by the engine every step */

    /* Guarded by the worker mutex; final (readable without the lock) once state is DONE. */
    enum lm_job_state state;
    struct lm_buf pending; /* streamed text released but not yet taken by lm_job_wait */
    struct lm_logprob_list pending_logprobs; /* streamed with logprobs: the entries of the
                                                tokens generated up to the last released text,
                                                not yet taken by lm_job_take */
    struct lm_gen_result result;             /* valid when DONE: ids, text, finish, prompt_tokens,
                                                completion_tokens, cached_tokens (prompt tokens reused from
                                                the prefix cache: usage.prompt_tokens_details.cached_tokens),
                                                logprobs, preemptions; times (CLOCK_MONOTONIC ms, lm_now_ms:
                                                arrival = submit, scheduled = admitted, first_token, finish;
                                                0 when not reached, e.g. scheduled for a job cancelled in the
                                                queue); prefill_s = first_token - scheduled, decode_s =
                                                finish - first_token. Also filled (status not OK) for a job
                                                that failed or was cancelled, as far as it got. */
    lm_status status; /* LM_OK, LM_ERR_CANCELLED (client gone, shutdown) or the error */
    char *error;      /* message for a non-OK status; owned */

    /* Private to worker.c. */
    struct lm_worker *w;
    pthread_cond_t cond;
    int refs;
    struct lm_job *next;
    struct lm_sched_req sr;   /* the engine's view of the job */
    int reusable;             /* later chat turn: prompt tokens its canonical history covers */
    size_t logprobs_released; /* engine thread: entries of sr.result.logprobs already copied to
                                 pending_logprobs */
    bool wake_queued;         /* guarded by the mutex: on the worker's wake list (holding a ref) */
    struct lm_job *wake_next;
};

/* Engine limits. */
struct lm_worker_params {
    int ctx_size;              /* positions one request may reach (prompt + max_tokens); > 0 */
    int max_queue;             /* requests that may wait beyond the max_seqs running (default 64) */
    int max_seqs;              /* requests running at once (default 16) */
    int max_batch_tokens;      /* tokens per forward step: decodes + prefill chunks (default 512) */
    long kv_tokens;            /* KV cache size in tokens (rounded up to blocks of 16); 0 =
                                  default: ctx_size * max_seqs, capped at a quarter of the
                                  memory available, and never below ctx_size */
    double shutdown_timeout_s; /* how long shutdown lets in-flight requests finish (default 10) */
    bool warm_next_turn;       /* cache each chat turn's canonical form (default true) */
    struct lm_spec_params spec; /* speculative decoding (engine/spec.h); zeroed (default): off */
    bool queue_steps;           /* queue steady decode steps a step ahead (engine/sched.h,
                                   params.queue; default true) */
    bool log_summary;          /* at shutdown, one line on stderr: requests, prefix-cache hit
                                  rates, steps, preemptions (default false) */
};
struct lm_worker_params lm_worker_default_params(void); /* ctx_size is 0: the caller sets it */

/* The engine parameters a server's parameters ask for (server.h). */
struct lm_worker_params lm_worker_params_from_server(const struct lm_server_params *p);

/* Creates the engine thread with the scheduler and its KV cache. `m` is borrowed and must
 * outlive the worker. LM_ERR_INVALID for limits out of range (message names the flag's value),
 * errors of lm_sched_create (LM_ERR_NOMEM). */
lm_status lm_worker_start(struct lm_model *m, const struct lm_worker_params *p,
                          struct lm_worker **out);
/* lm_worker_start with the default parameters and these two. */
lm_status lm_worker_create(struct lm_model *m, int ctx_size, int max_queue, struct lm_worker **out);
/* Stops taking jobs (lm_worker_submit answers LM_ERR_CANCELLED), lets queued and running jobs
 * finish for up to shutdown_timeout_s, then cancels the rest (LM_ERR_CANCELLED, "server is
 * shutting down") and joins the engine thread. Waiters wake up. Idempotent. */
void lm_worker_shutdown(struct lm_worker *w);
/* Shuts down (if not yet) and frees. Every job must have been released first. */
void lm_worker_destroy(struct lm_worker *w);

/* Counts for logs and tests: jobs waiting (submitted, not admitted), and whether any runs. */
void lm_worker_load(struct lm_worker *w, int *waiting, bool *running);

/* Engine state for /metrics, logs and tests: a snapshot taken after the engine's last step. */
struct lm_worker_stats {
    int running;                  /* requests admitted and not finished (prefix warming excluded) */
    int waiting;                  /* requests submitted and not yet admitted */
    struct lm_sched_stats engine; /* the scheduler's counters (prefix warming included):
                                     kv_blocks, kv_blocks_used (held by running sequences),
                                     kv_blocks_cached (reusable prefixes no sequence holds,
                                     evicted on demand), kv_blocks_free, steps, step_tokens,
                                     preemptions, evictions */
    long long requests;           /* client requests finished (any way) */
    long long prompt_tokens, cached_tokens, completion_tokens; /* of those requests */
    long long later_turn_requests; /* chat requests with an assistant turn in them */
    long long later_turn_prompt_tokens, later_turn_cached_tokens;
    long long later_turn_reusable_tokens; /* of their prompt tokens, those of the history in
                                             canonical form (all a prefix cache can give) */
    long long later_turn_history_cached;  /* of those, the ones found in the cache: per request
                                             min(cached, reusable), so never above reusable */
    long long warm_requests, warm_tokens; /* canonical-form prefills and the tokens they ran */
};
void lm_worker_stats(struct lm_worker *w, struct lm_worker_stats *out);

/* A new job with one reference (the caller's), state NEW. Never NULL (aborts on OOM). */
struct lm_job *lm_job_create(struct lm_worker *w);
/* Takes one more reference (for example for a streaming response that outlives the request). */
void lm_job_retain(struct lm_job *j);
/* Drops the caller's reference; the last reference frees the job and its request memory. */
void lm_job_release(struct lm_job *j);

/* Queues `j` (state NEW, gen filled). LM_ERR_RANGE when max_seqs + max_queue jobs are already
 * inside (answer 429); LM_ERR_CANCELLED when the worker is shutting down (answer 503). */
lm_status lm_worker_submit(struct lm_job *j);
/* Queues the n jobs of one request (its `n` choices) all or none: each job takes one of the
 * max_seqs + max_queue places. LM_ERR_RANGE when fewer than n places are free now (answer 429);
 * LM_ERR_INVALID when n is above max_seqs + max_queue, so the request could never fit (answer
 * 400; the message names n and both flags); LM_ERR_CANCELLED when shutting down (503). */
lm_status lm_worker_submit_all(struct lm_job *const *jobs, int n);

/* Waits up to `timeout_ms` for released text or completion. Moves released text to `text` (when
 * non-NULL) and returns the job's state at that moment. Logprobs released with the text are
 * dropped when text is taken (use lm_job_take to have them). */
enum lm_job_state lm_job_wait(struct lm_job *j, int timeout_ms, struct lm_buf *text);
/* lm_job_wait that also moves the logprobs entries released with the text (one per generated
 * token up to the last text release; appended to `logprobs` when non-NULL). A streamed choice
 * sends them with the chunk of that text; the entries not yet released by the time the job is
 * DONE are the tail of result.logprobs. */
enum lm_job_state lm_job_take(struct lm_job *j, int timeout_ms, struct lm_buf *text,
                              struct lm_logprob_list *logprobs);

/* The client went away: sets the cancel flag; a queued job never runs, a running one stops
 * within one step. */
void lm_job_cancel(struct lm_job *j);

#endif
