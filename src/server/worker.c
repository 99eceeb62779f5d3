/* worker.c: see worker.h.
 *
 * The engine thread loops: hand the jobs queued by network threads to the scheduler (under the
 * worker mutex), then run one scheduler step without the mutex. The scheduler's callbacks run on
 * the engine thread during the step and take the mutex themselves to publish text, state and
 * results to the waiting network threads; a stream's waiter is woken once a step, after it (one
 * wake-up a token, mid-step, made the waiters contend with the engine for the mutex between
 * steps). Prefix-warming requests (a finished chat turn's
 * canonical form) belong to the engine thread alone: made in a job's on_finish, queued to the
 * scheduler after the step, freed in their own on_finish. */
#include "server/worker.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* A prefill-only request that caches a finished turn's canonical form. */
struct warm {
    struct lm_sched_req sr;
    struct lm_ids ids;
    struct lm_worker *w;
    struct warm *next;
};

struct lm_worker {
    struct lm_model *model; /* borrowed */
    struct lm_worker_params p;
    struct lm_sched *sched; /* used only by the engine thread */
    pthread_mutex_t mu;
    pthread_cond_t cv;          /* the engine waits here for work */
    struct lm_job *head, *tail; /* submitted, not yet handed to the scheduler */
    int n_queued;               /* jobs in that list */
    int n_inside;               /* jobs handed to the scheduler and not finished */
    int n_running;              /* of those, admitted */
    bool stopping, joined, cancelled_all;
    double deadline_ms; /* when stopping: in-flight jobs are cancelled after this */
    pthread_t thread;
    struct lm_worker_stats stats; /* guarded by mu */
    struct lm_job *wake;          /* guarded by mu: jobs given text since the last wake_flush */

    /* Engine thread only. */
    int n_warm;                /* warm requests inside the scheduler */
    struct warm *warm_pending; /* made during a step, submitted after it */
};

struct lm_worker_params lm_worker_default_params(void) {
    return (struct lm_worker_params){.ctx_size = 0,
                                     .max_queue = 64,
                                     .max_seqs = 16,
                                     .max_batch_tokens = 512,
                                     .kv_tokens = 0,
                                     .shutdown_timeout_s = 10,
                                     .warm_next_turn = true,
                                     .queue_steps = true};
}

struct lm_worker_params lm_worker_params_from_server(const struct lm_server_params *sp) {
    struct lm_worker_params p = lm_worker_default_params();
    p.ctx_size = sp->ctx_size;
    p.max_queue = sp->max_queue;
    if (sp->max_seqs > 0) p.max_seqs = sp->max_seqs;
    if (sp->max_batch_tokens > 0) p.max_batch_tokens = sp->max_batch_tokens;
    if (sp->kv_tokens > 0) p.kv_tokens = sp->kv_tokens;
    p.spec = sp->spec;
    p.queue_steps = !sp->no_async_scheduling;
    p.log_summary = sp->log_requests;
    if (sp->shutdown_timeout_s > 0)
        p.shutdown_timeout_s = sp->shutdown_timeout_s;
    else if (sp->shutdown_timeout_s < 0)
        p.shutdown_timeout_s = 0;
    return p;
}

/* ---- jobs ---- */

static void job_free(struct lm_job *j) {
    lm_chat_request_free(&j->req);
    lm_ids_free(&j->prompt);
    lm_buf_free(&j->pending);
    lm_logprob_list_free(&j->pending_logprobs);
    lm_gen_result_free(&j->result);
    free(j->error);
    pthread_cond_destroy(&j->cond);
    free(j);
}

/* Frees a list of jobs linked by next (each one's last ref dropped), without the mutex. */
static void free_jobs(struct lm_job *j) {
    while (j) {
        struct lm_job *n = j->next;
        job_free(j);
        j = n;
    }
}

/* Called with the mutex held; returns true when the caller must free the job after unlocking. */
static bool unref_locked(struct lm_job *j) {
    assert(j->refs > 0);
    return --j->refs == 0;
}

static void finish_locked(struct lm_job *j, lm_status st, const char *msg) {
    j->state = LM_JOB_DONE;
    j->status = st;
    if (st && !j->error) j->error = strdup(msg ? msg : "");
    pthread_cond_broadcast(&j->cond);
}

/* ---- the scheduler's callbacks for a job (engine thread) ---- */

static bool job_on_text(void *ctx, const char *text, size_t len) {
    struct lm_job *j = ctx;
    if (j->stream && len) {
        pthread_mutex_lock(&j->w->mu);
        lm_buf_append(&j->pending, text, len);
        /* The logprobs of every token generated so far go with this text (the scheduler pushes
         * a token's entry before its text is released; text held back for a stop string or an
         * incomplete character goes with a later release, and its entries with this one). */
        const struct lm_logprob_list *l = &j->sr.result.logprobs;
        if (j->gen.sampling.logprobs && l->n > j->logprobs_released) {
            for (size_t i = j->logprobs_released; i < l->n; i++)
                lm_logprob_list_push(&j->pending_logprobs, &l->v[i]);
            j->logprobs_released = l->n;
        }
        /* The waiter is woken after the step (wake_flush); the list holds a ref meanwhile. */
        if (!j->wake_queued) {
            j->wake_queued = true;
            j->refs++;
            j->wake_next = j->w->wake;
            j->w->wake = j;
        }
        pthread_mutex_unlock(&j->w->mu);
    }
    return !atomic_load(&j->cancel);
}

static void job_on_start(struct lm_sched_req *r) {
    struct lm_job *j = r->ctx;
    pthread_mutex_lock(&j->w->mu);
    j->state = LM_JOB_RUNNING;
    j->w->n_running++;
    pthread_mutex_unlock(&j->w->mu);
}

static void warm_submit_later(struct lm_worker *w, const struct lm_job *j, const char *answer);

static void job_on_finish(struct lm_sched_req *r) {
    struct lm_job *j = r->ctx;
    struct lm_worker *w = j->w;
    lm_status st = r->status;
    bool ok = st == LM_OK && r->result.finish != LM_FINISH_CANCELLED;
    pthread_mutex_lock(&w->mu);
    bool stopping = w->stopping;
    pthread_mutex_unlock(&w->mu);
    if (ok && w->p.warm_next_turn && !stopping)
        warm_submit_later(w, j, r->result.text.p ? r->result.text.p : "");
    bool later_turn = false;
    for (size_t i = 0; i < j->req.n_messages; i++)
        later_turn |= j->req.messages[i].role == LM_ROLE_ASSISTANT;

    pthread_mutex_lock(&w->mu);
    j->result = r->result; /* moved: the scheduler is done with it */
    memset(&r->result, 0, sizeof r->result);
    char msg[300];
    if (st)
        snprintf(msg, sizeof msg, "%s", r->error);
    else if (j->result.finish == LM_FINISH_CANCELLED) {
        st = LM_ERR_CANCELLED; /* by the client (flag) or by the end of the shutdown drain */
        snprintf(msg, sizeof msg, "%s",
                 atomic_load(&j->cancel) ? "the client went away" : "server is shutting down");
    }
    finish_locked(j, st, st ? msg : NULL);
    if (j->result.times.scheduled_ms) w->n_running--;
    w->n_inside--;
    struct lm_worker_stats *s = &w->stats;
    s->requests++;
    s->prompt_tokens += j->result.prompt_tokens;
    s->cached_tokens += j->result.cached_tokens;
    s->completion_tokens += j->result.completion_tokens;
    if (later_turn) {
        s->later_turn_requests++;
        s->later_turn_prompt_tokens += j->result.prompt_tokens;
        s->later_turn_cached_tokens += j->result.cached_tokens;
        if (j->reusable >= 0) {
            s->later_turn_reusable_tokens += j->reusable;
            s->later_turn_history_cached +=
                j->result.cached_tokens < j->reusable ? j->result.cached_tokens : j->reusable;
        }
    }
    bool last = unref_locked(j);
    pthread_mutex_unlock(&w->mu);
    if (last) job_free(j);
}

/* Wakes the waiters of the jobs given text since the last call (after a step, a cancel-all or the
 * scheduler's destruction: whatever ran the callbacks) and drops the list's refs. The broadcasts
 * are made without the mutex, so that a woken waiter takes it at once instead of blocking on the
 * engine (the list's refs keep the jobs alive until then). */
static void wake_flush(struct lm_worker *w) {
    pthread_mutex_lock(&w->mu);
    struct lm_job *list = w->wake;
    w->wake = NULL;
    pthread_mutex_unlock(&w->mu);
    if (!list) return;
    /* Only the engine thread queues (job_on_text) and flushes, so the list is ours until the
     * flags are cleared below. */
    for (struct lm_job *j = list; j; j = j->wake_next) pthread_cond_broadcast(&j->cond);
    struct lm_job *to_free = NULL;
    pthread_mutex_lock(&w->mu);
    for (struct lm_job *j = list, *n; j; j = n) {
        n = j->wake_next;
        j->wake_next = NULL;
        j->wake_queued = false;
        if (unref_locked(j)) {
            j->next = to_free;
            to_free = j;
        }
    }
    pthread_mutex_unlock(&w->mu);
    free_jobs(to_free);
}

/* ---- the canonical form of a finished chat turn ---- */

static void warm_on_finish(struct lm_sched_req *r) {
    struct warm *wm = r->ctx;
    struct lm_worker *w = wm->w;
    w->n_warm--;
    pthread_mutex_lock(&w->mu);
    w->stats.warm_requests++;
    w->stats.warm_tokens += r->result.prompt_tokens - r->result.cached_tokens;
    pthread_mutex_unlock(&w->mu);
    lm_gen_result_free(&r->result);
    lm_ids_free(&wm->ids);
    free(wm);
}

/* Tokens of the conversation msgs[0..n) as the next request renders them up to its next user
 * turn. The family's template decides the form (Qwen3 drops an answer's <think> block and the
 * generation prompt's empty one); we render with two different placeholder user turns, keep
 * the common prefix, tokenize it, and cut after its last special token, so that nothing depends
 * on how the placeholder would have been tokenized. */
static void canonical_prefix(const struct lm_model *m, const struct lm_chat_msg *msgs, size_t n,
                             const struct lm_chat_opts *chat, struct lm_ids *out) {
    struct lm_chat_msg *v = malloc(sizeof *v * (n + 1));
    if (!v) return;
    memcpy(v, msgs, sizeof *v * n);
    struct lm_chat_opts opts = *chat;
    opts.add_generation_prompt = false;
    struct lm_buf a = {0}, b = {0};
    v[n] = (struct lm_chat_msg){.role = LM_ROLE_USER, .content = "a"};
    lm_status st = lm_model_render_chat(m, v, n + 1, &opts, &a);
    v[n].content = "b";
    if (!st) st = lm_model_render_chat(m, v, n + 1, &opts, &b);
    if (!st) {
        size_t len = 0;
        while (len < a.len && len < b.len && a.p[len] == b.p[len])
            len++;
        const struct lm_tokenizer *tok = lm_model_tokenizer(m);
        if (!lm_tokenizer_encode(tok, a.p, len, 0, out)) {
            size_t keep = out->n;
            while (keep > 0 && !lm_tokenizer_is_special(tok, out->v[keep - 1]))
                keep--;
            out->n = keep;
        } else {
            out->n = 0;
        }
    }
    lm_buf_free(&a);
    lm_buf_free(&b);
    free(v);
}

/* The canonical form of the finished turn of `j`: its conversation plus `answer`. */
static void canonical_ids(struct lm_worker *w, const struct lm_job *j, const char *answer,
                          struct lm_ids *out) {
    size_t n = j->req.n_messages;
    if (n == 0 || j->req.messages[n - 1].role == LM_ROLE_ASSISTANT) return;
    struct lm_chat_msg *v = malloc(sizeof *v * (n + 1));
    if (!v) return;
    memcpy(v, j->req.messages, sizeof *v * n);
    v[n] = (struct lm_chat_msg){.role = LM_ROLE_ASSISTANT, .content = answer};
    canonical_prefix(w->model, v, n + 1, &j->req.chat, out);
    free(v);
}

static void warm_submit_later(struct lm_worker *w, const struct lm_job *j, const char *answer) {
    struct warm *wm = calloc(1, sizeof *wm);
    if (!wm) return;
    canonical_ids(w, j, answer, &wm->ids);
    if (wm->ids.n == 0 || wm->ids.n > (size_t)w->p.ctx_size) {
        lm_ids_free(&wm->ids);
        free(wm);
        return;
    }
    wm->w = w;
    wm->sr.gen = (struct lm_gen_request){.prompt = wm->ids.v,
                                         .n_prompt = wm->ids.n,
                                         .max_tokens = 0,
                                         .sampling = {.temperature = 0, .top_p = 1}};
    wm->sr.priority = true;
    wm->sr.on_finish = warm_on_finish;
    wm->sr.ctx = wm;
    wm->next = w->warm_pending;
    w->warm_pending = wm;
}

static void warm_flush(struct lm_worker *w) {
    while (w->warm_pending) {
        struct warm *wm = w->warm_pending;
        w->warm_pending = wm->next;
        if (lm_sched_submit(w->sched, &wm->sr) == LM_OK) {
            w->n_warm++;
        } else {
            lm_ids_free(&wm->ids);
            free(wm);
        }
    }
}

/* ---- the engine thread ---- */

static void *engine_main(void *arg) {
    struct lm_worker *w = arg;
    long long steps = 0;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        /* Hand the queued jobs to the scheduler (it calls nothing back from submit). */
        struct lm_job *to_free = NULL;
        while (w->head) {
            struct lm_job *j = w->head;
            w->head = j->next;
            if (!w->head) w->tail = NULL;
            j->next = NULL;
            w->n_queued--;
            w->n_inside++;
            lm_status st = lm_sched_submit(w->sched, &j->sr);
            if (st) {
                w->n_inside--;
                finish_locked(j, st, lm_error_message());
                if (unref_locked(j)) {
                    j->next = to_free;
                    to_free = j;
                }
            }
        }
        if (to_free) {
            pthread_mutex_unlock(&w->mu);
            free_jobs(to_free);
            pthread_mutex_lock(&w->mu);
            continue;
        }
        if (w->stopping && !w->cancelled_all &&
            (lm_now_ms() >= w->deadline_ms || (w->n_inside == 0 && w->n_warm > 0))) {
            /* The drain is over (or only prefix warming is left): cancel what remains. */
            w->cancelled_all = true;
            pthread_mutex_unlock(&w->mu);
            lm_sched_cancel_all(w->sched);
            wake_flush(w);
            pthread_mutex_lock(&w->mu);
            continue;
        }
        if (w->n_inside == 0 && w->n_warm == 0) {
            if (w->stopping) break;
            pthread_cond_wait(&w->cv, &w->mu);
            continue;
        }
        pthread_mutex_unlock(&w->mu);

        lm_sched_step(w->sched);
        wake_flush(w);
        warm_flush(w);
        struct lm_sched_stats st;
        lm_sched_stats(w->sched, &st);

        pthread_mutex_lock(&w->mu);
        w->stats.engine = st;
        if (st.steps == steps && !w->head) {
            /* Nothing could run (a request waits for another's prefix or for KV room): do not
             * spin; a submit or cancel wakes us at once. */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 1000000;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&w->cv, &w->mu, &ts);
        }
        steps = st.steps;
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* ---- lifecycle ---- */

/* Bytes of memory available (MemAvailable), or 0 when unknown. */
static size_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %zu kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}

lm_status lm_worker_start(struct lm_model *m, const struct lm_worker_params *pp,
                          struct lm_worker **out) {
    *out = NULL;
    struct lm_worker_params p = *pp;
    if (p.ctx_size < 1) return lm_errorf(LM_ERR_INVALID, "context size %d is below 1", p.ctx_size);
    if (p.max_queue < 0)
        return lm_errorf(LM_ERR_INVALID, "--max-queue %d is negative", p.max_queue);
    if (p.max_seqs < 1) return lm_errorf(LM_ERR_INVALID, "--max-seqs %d is below 1", p.max_seqs);
    if (p.max_batch_tokens < p.max_seqs)
        return lm_errorf(
            LM_ERR_INVALID,
            "--max-batch-tokens %d is below --max-seqs %d (each running request decodes "
            "one token a step)",
            p.max_batch_tokens, p.max_seqs);
    long kv = p.kv_tokens;
    if (kv <= 0) {
        kv = (long)p.ctx_size * p.max_seqs;
        size_t avail = mem_available();
        size_t per = lm_model_kv_bytes_per_token(m);
        if (avail && per && (size_t)kv > avail / 4 / per) kv = (long)(avail / 4 / per);
        if (kv < p.ctx_size) kv = p.ctx_size;
    } else if (kv < p.ctx_size) {
        return lm_errorf(LM_ERR_INVALID,
                         "--kv-size of %ld tokens cannot hold one request of the context size %d; "
                         "raise --kv-size or lower --ctx-size",
                         kv, p.ctx_size);
    }
    struct lm_sched_params sp = {.max_seqs = p.max_seqs,
                                 .max_batch_tokens = p.max_batch_tokens,
                                 .n_blocks = (int)((kv + LM_KV_BLOCK - 1) / LM_KV_BLOCK),
                                 .max_ctx = p.ctx_size,
                                 .spec = p.spec,
                                 .queue = p.queue_steps}; /* steady decode steps queued ahead (sched.h) */
    struct lm_worker *w = calloc(1, sizeof *w);
    if (!w) return lm_errorf(LM_ERR_NOMEM, "out of memory");
    w->model = m;
    w->p = p;
    lm_status st = lm_sched_create(m, &sp, &w->sched);
    if (st) {
        free(w);
        return st;
    }
    lm_sched_stats(w->sched, &w->stats.engine);
    if (p.log_summary)
        fprintf(stderr,
                "lumen serve: engine: max-seqs %d, max-batch-tokens %d, max-queue %d, KV cache %d "
                "tokens (%d blocks of %d, %.1f MiB)\n",
                p.max_seqs, p.max_batch_tokens, p.max_queue, sp.n_blocks * LM_KV_BLOCK, sp.n_blocks,
                LM_KV_BLOCK,
                (double)sp.n_blocks * LM_KV_BLOCK * (double)lm_model_kv_bytes_per_token(m) /
                    1048576.0);
    if (p.log_summary && p.spec.num_speculative_tokens > 0)
        fprintf(stderr,
                "lumen serve: speculative decoding: ngram, num_speculative_tokens %d, "
                "prompt_lookup_max %d, prompt_lookup_min %d, disable_by_batch_size %d%s\n",
                p.spec.num_speculative_tokens, p.spec.prompt_lookup_max, p.spec.prompt_lookup_min,
                p.spec.disable_by_batch_size, p.spec.disable_by_batch_size ? "" : " (never)");
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    int rc = pthread_create(&w->thread, NULL, engine_main, w);
    if (rc) {
        lm_sched_destroy(w->sched);
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        free(w);
        return lm_errorf(LM_ERR_NOMEM, "cannot start the engine thread: %s", strerror(rc));
    }
    *out = w;
    return LM_OK;
}

lm_status lm_worker_create(struct lm_model *m, int ctx_size, int max_queue,
                           struct lm_worker **out) {
    struct lm_worker_params p = lm_worker_default_params();
    p.ctx_size = ctx_size;
    p.max_queue = max_queue;
    return lm_worker_start(m, &p, out);
}

void lm_worker_shutdown(struct lm_worker *w) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    if (w->joined || w->stopping) { /* done, or another thread is shutting it down */
        pthread_mutex_unlock(&w->mu);
        return;
    }
    w->stopping = true;
    w->deadline_ms =
        lm_now_ms() + 1e3 * (w->p.shutdown_timeout_s > 0 ? w->p.shutdown_timeout_s : 0);
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_mutex_lock(&w->mu);
    w->joined = true;
    struct lm_worker_stats st = w->stats;
    pthread_mutex_unlock(&w->mu);
    if (w->p.log_summary) {
        const struct lm_sched_stats *e = &st.engine;
        fprintf(
            stderr,
            "lumen serve: engine: %lld requests, %lld prompt tokens, %lld (%.1f%%) from the prefix "
            "cache; later turns: %lld requests, %lld of %lld prompt tokens (%.1f%%) from the "
            "cache, "
            "%.1f%% of the %lld their history holds; "
            "%lld canonical-turn prefills (%lld tokens); %lld steps, %.1f tokens a step; %lld "
            "preemptions, %lld evictions; %lld decode-only steps, %lld with tokens chosen on the "
            "device, %lld queued ahead; engine busy %.2f s, %.2f s of it in the forward step\n",
            st.requests, st.prompt_tokens, st.cached_tokens,
            st.prompt_tokens ? 100.0 * (double)st.cached_tokens / (double)st.prompt_tokens : 0.0,
            st.later_turn_requests, st.later_turn_cached_tokens, st.later_turn_prompt_tokens,
            st.later_turn_prompt_tokens
                ? 100.0 * (double)st.later_turn_cached_tokens / (double)st.later_turn_prompt_tokens
                : 0.0,
            st.later_turn_reusable_tokens ? 100.0 * (double)st.later_turn_history_cached /
                                                (double)st.later_turn_reusable_tokens
                                          : 0.0,
            st.later_turn_reusable_tokens, st.warm_requests, st.warm_tokens, e->steps,
            e->steps ? (double)e->step_tokens / (double)e->steps : 0.0, e->preemptions,
            e->evictions, e->decode_steps, e->device_sampled_steps, e->queued_steps, e->busy_s, e->forward_s);
        if (e->spec_drafts)
            fprintf(stderr,
                    "lumen serve: speculative decoding: %lld drafts, %lld draft tokens, %lld "
                    "accepted (%.1f%%), %.2f tokens a draft step\n",
                    e->spec_drafts, e->spec_draft_tokens, e->spec_accepted_tokens,
                    e->spec_draft_tokens
                        ? 100.0 * (double)e->spec_accepted_tokens / (double)e->spec_draft_tokens
                        : 0.0,
                    1.0 + (double)e->spec_accepted_tokens / (double)e->spec_drafts);
    }
}

void lm_worker_destroy(struct lm_worker *w) {
    if (!w) return;
    lm_worker_shutdown(w);
    lm_sched_destroy(w->sched);
    wake_flush(w); /* text the destruction's cancellations released */
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

void lm_worker_load(struct lm_worker *w, int *waiting, bool *running) {
    pthread_mutex_lock(&w->mu);
    if (waiting) *waiting = w->n_queued + w->n_inside - w->n_running;
    if (running) *running = w->n_running > 0;
    pthread_mutex_unlock(&w->mu);
}

void lm_worker_stats(struct lm_worker *w, struct lm_worker_stats *out) {
    pthread_mutex_lock(&w->mu);
    *out = w->stats;
    out->running = w->n_running;
    out->waiting = w->n_queued + w->n_inside - w->n_running;
    pthread_mutex_unlock(&w->mu);
}

struct lm_job *lm_job_create(struct lm_worker *w) {
    struct lm_job *j = calloc(1, sizeof *j);
    if (!j) abort();
    j->w = w;
    j->refs = 1;
    j->state = LM_JOB_NEW;
    atomic_init(&j->cancel, false);
    j->gen.cancel = &j->cancel;
    pthread_cond_init(&j->cond, NULL);
    return j;
}

void lm_job_retain(struct lm_job *j) {
    pthread_mutex_lock(&j->w->mu);
    j->refs++;
    pthread_mutex_unlock(&j->w->mu);
}

void lm_job_release(struct lm_job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->w->mu);
    bool last = unref_locked(j);
    pthread_mutex_unlock(&j->w->mu);
    if (last) job_free(j);
}

/* Fills the scheduler's view of `j` and its later-turn statistics (no lock needed: the job is
 * not shared yet). */
static void prepare(struct lm_job *j) {
    struct lm_worker *w = j->w;
    assert(j->state == LM_JOB_NEW && j->gen.max_tokens > 0);
    j->gen.cancel = &j->cancel;
    j->sr = (struct lm_sched_req){.gen = j->gen,
                                  .on_text = job_on_text,
                                  .on_start = job_on_start,
                                  .on_finish = job_on_finish,
                                  .ctx = j};
    /* A later turn of a conversation (the request ends with a user turn after an assistant
     * one): the prompt tokens a cache could hold, its history in canonical form, for the
     * hit-rate statistics. */
    j->reusable = -1;
    size_t n = j->req.n_messages;
    bool later = false;
    for (size_t i = 0; i + 1 < n; i++)
        later |= j->req.messages[i].role == LM_ROLE_ASSISTANT;
    if (later && j->req.messages[n - 1].role == LM_ROLE_USER) {
        struct lm_ids hist = {0};
        canonical_prefix(w->model, j->req.messages, n - 1, &j->req.chat, &hist);
        size_t k = 0;
        while (k < hist.n && k < j->prompt.n && hist.v[k] == j->prompt.v[k])
            k++;
        j->reusable = (int)(k < j->prompt.n ? k : j->prompt.n - 1);
        lm_ids_free(&hist);
    }
}

lm_status lm_worker_submit(struct lm_job *j) {
    return lm_worker_submit_all(&j, 1);
}

lm_status lm_worker_submit_all(struct lm_job *const *jobs, int n) {
    assert(n >= 1);
    struct lm_worker *w = jobs[0]->w;
    for (int i = 0; i < n; i++)
        prepare(jobs[i]);
    pthread_mutex_lock(&w->mu);
    lm_status st = LM_OK;
    int places = w->p.max_seqs + w->p.max_queue;
    if (w->stopping) {
        st = lm_errorf(LM_ERR_CANCELLED, "server is shutting down");
    } else if (n > places) {
        st = lm_errorf(LM_ERR_INVALID,
                       "n is %d; each choice takes a place of --max-seqs %d plus --max-queue %d, "
                       "so this server holds at most %d choices of one request",
                       n, w->p.max_seqs, w->p.max_queue, places);
    } else if (w->n_queued + w->n_inside + n > places) {
        st = lm_errorf(LM_ERR_RANGE,
                       "the queue is full: %d sequences are running and %d waiting, and this "
                       "request needs %d (--max-seqs %d, --max-queue %d; each of n choices "
                       "counts)",
                       w->n_running, w->n_queued + w->n_inside - w->n_running, n, w->p.max_seqs,
                       w->p.max_queue);
    } else {
        double now = lm_now_ms();
        for (int i = 0; i < n; i++) {
            struct lm_job *j = jobs[i];
            j->refs++;
            j->state = LM_JOB_QUEUED;
            j->sr.result.times.arrival_ms = now;
            if (w->tail)
                w->tail->next = j;
            else
                w->head = j;
            w->tail = j;
            w->n_queued++;
        }
        pthread_cond_signal(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return st;
}

enum lm_job_state lm_job_wait(struct lm_job *j, int timeout_ms, struct lm_buf *text) {
    return lm_job_take(j, timeout_ms, text, NULL);
}

enum lm_job_state lm_job_take(struct lm_job *j, int timeout_ms, struct lm_buf *text,
                              struct lm_logprob_list *logprobs) {
    struct lm_worker *w = j->w;
    pthread_mutex_lock(&w->mu);
    if (j->pending.len == 0 && j->state != LM_JOB_DONE && timeout_ms > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += timeout_ms / 1000;
        ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&j->cond, &w->mu, &ts);
    }
    if (j->pending.len) {
        if (text) lm_buf_append(text, j->pending.p, j->pending.len);
        lm_buf_reset(&j->pending);
        for (size_t i = 0; logprobs && i < j->pending_logprobs.n; i++)
            lm_logprob_list_push(logprobs, &j->pending_logprobs.v[i]);
        j->pending_logprobs.n = 0;
    }
    enum lm_job_state s = j->state;
    pthread_mutex_unlock(&w->mu);
    return s;
}

void lm_job_cancel(struct lm_job *j) {
    struct lm_worker *w = j->w;
    atomic_store(&j->cancel, true);
    pthread_mutex_lock(&w->mu);
    bool last = false;
    if (j->state == LM_JOB_QUEUED) {
        /* Still in our queue (not yet handed to the scheduler): take it out now. */
        struct lm_job **pp = &w->head, *prev = NULL;
        while (*pp && *pp != j) {
            prev = *pp;
            pp = &(*pp)->next;
        }
        if (*pp) {
            *pp = j->next;
            if (w->tail == j) w->tail = prev;
            j->next = NULL;
            w->n_queued--;
            j->result.times.arrival_ms = j->sr.result.times.arrival_ms;
            j->result.times.finish_ms = lm_now_ms();
            j->result.prompt_tokens = (int)j->prompt.n;
            finish_locked(j, LM_ERR_CANCELLED, "the client went away");
            w->stats.requests++;
            last = unref_locked(j); /* the queue's reference */
        }
    }
    pthread_cond_signal(&w->cv); /* the scheduler drops it at its next step */
    pthread_mutex_unlock(&w->mu);
    assert(!last); /* the caller still holds its own reference */
    (void)last;
}
