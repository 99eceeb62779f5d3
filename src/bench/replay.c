/* replay.c: see replay.h. */
#include "bench/replay.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/buf.h"
#include "bench/client.h"
#include "bench/prompt.h"
#include "bench/rng.h"

struct lm_bench_params lm_bench_default_params(void) {
    return (struct lm_bench_params){
        .conversations = 10,
        .concurrency = 1,
        .warmup_requests = 2,
        .max_tokens = 128,
        .temperature = 0.0,
        .timeout_s = 600.0,
    };
}

void lm_bench_select(size_t ds_n, size_t n, bool shuffle, uint64_t seed, size_t *out) {
    size_t *perm = malloc((ds_n ? ds_n : 1) * sizeof *perm);
    if (!perm) abort();
    for (size_t i = 0; i < ds_n; i++)
        perm[i] = i;
    if (shuffle) { /* Fisher-Yates */
        uint64_t s = seed;
        for (size_t i = ds_n; i > 1; i--) {
            size_t j = (size_t)(lm_bench_rng_next(&s) % i);
            size_t t = perm[i - 1];
            perm[i - 1] = perm[j];
            perm[j] = t;
        }
    }
    for (size_t i = 0; i < n; i++)
        out[i] = perm[i % ds_n];
    free(perm);
}

static double now_s(void);

/* Sleeps ms milliseconds, in slices of at most 100 ms so that an interrupted run (client.h)
 * does not wait out a long think time or a slow rate's next release. */
static void sleep_ms(double ms) {
    const double end = now_s() + ms / 1e3;
    for (double left = ms; left > 0 && !lm_bench_client_stopping(); left = (end - now_s()) * 1e3) {
        const double slice = left < 100 ? left : 100;
        struct timespec ts = {.tv_sec = (time_t)(slice / 1e3), .tv_nsec = (long)(fmod(slice, 1e3) * 1e6)};
        while (nanosleep(&ts, &ts) && errno == EINTR) {
        }
    }
}

/* A conversation in flight: its records, its history, where it is. */
struct conv {
    size_t k; /* index within the phase */
    const struct lm_bench_conversation *c;
    struct lm_bench_record *recs; /* [n_turns] owned until the run takes them */
    size_t n_turns;
    json_t *history;
    size_t next;     /* the next turn to send */
    double ready_at; /* rate mode: when the next turn may go (CLOCK_MONOTONIC s) */
    bool busy, done;
    uint64_t rng; /* think-time draws */
};

struct phase {
    const struct lm_bench_dataset *ds;
    const struct lm_bench_params *p;
    struct lm_bench_run *run;
    json_t *extra;     /* params.extra_body parsed; borrowed */
    const char *label; /* "warmup" / "profiling" */
    enum lm_bench_phase phase;
    char tag;            /* 'w' / 'c' in ids */
    const size_t *order; /* dataset indices, cycled */
    size_t n_order;
    size_t max_convs;   /* 0: no cap */
    size_t turns_cap;   /* 0: all turns */
    size_t request_cap; /* 0: no cap */
    double deadline;    /* CLOCK_MONOTONIC s; INFINITY for none */
    int workers;
    bool rate; /* request-rate mode */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct conv **convs;
    size_t n_convs, cap_convs;
    size_t sent, finished, failed;
    bool stop;
    const char *limit;
    /* rate mode */
    struct conv **queue;
    size_t q_head, q_len;
    bool closing;
    int in_flight;
    /* progress */
    size_t planned; /* requests planned; 0 when unknown */
    double t_start, last_print;
    int last_decile;
    bool tty;
};

static double now_s(void) {
    return lm_bench_now();
}

/* ---- progress: a bar on a terminal, plain lines otherwise ---- */

static void progress(struct phase *ph, bool final) {
    FILE *f = ph->p->progress;
    if (!f) return;
    double t = now_s(), el = t - ph->t_start;
    double frac = ph->planned              ? (double)ph->finished / (double)ph->planned
                  : isfinite(ph->deadline) ? el / (ph->deadline - ph->t_start)
                                           : NAN;
    if (frac > 1) frac = 1;
    double rate = el > 0 ? (double)ph->finished / el : 0;
    if (ph->tty) {
        if (!final && t - ph->last_print < 0.1) return;
        ph->last_print = t;
        char bar[31];
        int fill = isfinite(frac) ? (int)(frac * 30 + 0.5) : 0;
        for (int i = 0; i < 30; i++)
            bar[i] = i < fill ? '#' : '.';
        bar[30] = 0;
        fprintf(f, "\r%-9s [%s] %zu", ph->label, bar, ph->finished);
        if (ph->planned) fprintf(f, "/%zu", ph->planned);
        fprintf(f, " requests, %zu failed, %.2f req/s, %.0f s  %s", ph->failed, rate, el,
                final ? "\n" : "");
    } else { /* a log: one line per tenth (or per 10 s when the total is unknown), and the last */
        int decile = isfinite(frac) ? (int)(frac * 10) : (int)(el / 10);
        if (!final && decile == ph->last_decile) return;
        if (final && ph->last_decile == 1000) return;
        ph->last_decile = final ? 1000 : decile;
        fprintf(f, "%s: %zu", ph->label, ph->finished);
        if (ph->planned) fprintf(f, "/%zu", ph->planned);
        fprintf(f, " requests, %zu failed, %.2f req/s, %.1f s%s\n", ph->failed, rate, el,
                final ? " (done)" : "");
    }
    fflush(f);
}

/* ---- conversations ---- */

static json_t *message(const char *role, const char *content) {
    return json_pack("{s:s, s:s}", "role", role, "content", content);
}

/* Whether the phase must release nothing more: a signal (client.h), the request cap or the
 * deadline; sets ph->stop and ph->limit the first time. Lock held. */
static bool limit_reached(struct phase *ph) {
    if (ph->stop) return true;
    if (lm_bench_client_stopping())
        ph->limit = "interrupted";
    else if (ph->request_cap && ph->sent >= ph->request_cap)
        ph->limit = "request_count";
    else if (now_s() >= ph->deadline)
        ph->limit = "duration";
    else
        return false;
    ph->stop = true;
    return true;
}

/* Whether a request may be released now; counts it. Lock held. */
static bool may_send(struct phase *ph) {
    if (limit_reached(ph)) return false;
    ph->sent++;
    return true;
}

/* Starts the next conversation and reserves its first request; NULL when a limit says no.
 * Lock held. */
static struct conv *start_conv(struct phase *ph) {
    if (ph->stop || (ph->max_convs && ph->n_convs >= ph->max_convs)) return NULL;
    if (!may_send(ph)) return NULL;
    struct lm_bench_run *run = ph->run;
    struct conv *cv = calloc(1, sizeof *cv);
    if (!cv) abort();
    cv->k = ph->n_convs;
    cv->c = &ph->ds->convs[ph->order[cv->k % ph->n_order]];
    cv->n_turns = cv->c->n_turns;
    if (ph->turns_cap && cv->n_turns > ph->turns_cap) cv->n_turns = ph->turns_cap;
    cv->recs = calloc(cv->n_turns, sizeof *cv->recs);
    if (!cv->recs) abort();
    cv->history = json_array();
    if (cv->c->system) json_array_append_new(cv->history, message("system", cv->c->system));
    cv->rng = ph->p->seed ^ (0x5851f42d4c957f2dull * (uint64_t)(cv->k + 1)) ^
              (ph->phase == LM_BENCH_PHASE_WARMUP ? 0xabcdull : 0);
    for (size_t t = 0; t < cv->n_turns; t++) {
        struct lm_bench_record *rec = &cv->recs[t];
        struct lm_buf b = {0};
        rec->phase = ph->phase;
        rec->conversation = cv->k;
        rec->turn = (int)t + 1;
        rec->n_turns = (int)cv->n_turns;
        rec->ttft_ms = rec->ttfo_ms = rec->latency_ms = rec->t_last_event_ms = rec->think_ms = NAN;
        rec->output_tokens = rec->input_tokens = rec->cached_tokens = rec->reasoning_tokens = -1;
        rec->draft_tokens = rec->accepted_tokens = rec->own_output_tokens = -1;
        rec->own_input_tokens = -1;
        rec->max_tokens = cv->c->max_tokens > 0 ? cv->c->max_tokens : ph->p->max_tokens;
        lm_buf_printf(&b, "%s-%c%zu", run->run_id, ph->tag, cv->k);
        rec->conversation_id = lm_buf_take(&b);
        lm_buf_printf(&b, "%s-%c%zu-t%zu", run->run_id, ph->tag, cv->k, t + 1);
        rec->request_id = lm_buf_take(&b);
        rec->dataset_id = strdup(cv->c->id);
        if (!rec->dataset_id) abort();
        if (cv->c->category && !(rec->category = strdup(cv->c->category))) abort();
    }
    if (ph->n_convs == ph->cap_convs) {
        ph->cap_convs = ph->cap_convs ? ph->cap_convs * 2 : 64;
        ph->convs = realloc(ph->convs, ph->cap_convs * sizeof *ph->convs);
        if (!ph->convs) abort();
    }
    ph->convs[ph->n_convs++] = cv;
    return cv;
}

static void mark_rest(struct conv *cv, size_t from, enum lm_bench_skip why) {
    for (size_t t = from; t < cv->n_turns; t++)
        if (!cv->recs[t].sent && !cv->recs[t].skip) cv->recs[t].skip = why;
}

/* Why the turns after a failed one are not sent: the failure, or the stop that cancelled it. */
static enum lm_bench_skip skip_after(const struct lm_bench_record *failed) {
    return failed->cancelled ? LM_BENCH_SKIP_LIMIT : LM_BENCH_SKIP_AFTER_FAILURE;
}

static double draw_think(const struct lm_bench_params *p, uint64_t *rng) {
    double ms = lm_bench_rng_normal(rng, p->think_time_mean_ms, p->think_time_std_ms);
    return ms > 0 ? ms : 0;
}

/* The request body for `messages` (borrowed; the body takes a new reference). */
static char *request_body(const struct phase *ph, json_t *messages, int max_tokens) {
    const struct lm_bench_params *p = ph->p;
    json_t *o = json_object();
    json_object_set_new(o, "model", json_string(ph->run->model));
    json_object_set(o, "messages", messages);
    json_object_set_new(o, "stream", json_true());
    json_object_set_new(o, "stream_options", json_pack("{s:b}", "include_usage", 1));
    json_object_set_new(o, "max_tokens", json_integer(max_tokens));
    json_object_set_new(o, "temperature", json_real(p->temperature));
    if (p->ignore_eos) json_object_set_new(o, "ignore_eos", json_true());
    if (ph->extra) json_object_update(o, ph->extra);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s) abort();
    return s;
}

/* Sends turn t of a conversation (no lock held). Returns false when it failed. */
static bool send_turn(struct phase *ph, struct lm_bench_client *client, struct conv *cv, size_t t) {
    const struct lm_bench_params *p = ph->p;
    struct lm_bench_record *rec = &cv->recs[t];
    json_array_append_new(cv->history, message("user", cv->c->turns[t]));
    rec->messages = json_deep_copy(cv->history);
    char *body = request_body(ph, rec->messages, rec->max_tokens);
    lm_bench_client_chat(client, body, rec);
    free(body);
    if (t > 0 && cv->recs[t - 1].sent) rec->think_ms = (rec->t_send - cv->recs[t - 1].t_end) * 1e3;
    if (p->prompt) lm_bench_record_count_tokens(rec, p->prompt);
    if (p->render) lm_bench_record_render_prompt(rec, p->render, ph->run->enable_thinking);
    if (rec->error) return false;
    json_array_append_new(cv->history, message("assistant", rec->content.p ? rec->content.p : ""));
    return true;
}

static void finished_one(struct phase *ph, const struct lm_bench_record *rec) {
    ph->finished++;
    if (rec->error) ph->failed++;
    progress(ph, false);
}

/* ---- concurrency mode: one conversation per thread at a time ---- */

static void run_conversation(struct phase *ph, struct lm_bench_client *client, struct conv *cv) {
    for (size_t t = 0; t < cv->n_turns; t++) {
        struct lm_bench_record *rec = &cv->recs[t];
        if (t > 0) {
            rec->think_planned_ms = draw_think(ph->p, &cv->rng);
            sleep_ms(rec->think_planned_ms);
            pthread_mutex_lock(&ph->mu);
            bool ok = may_send(ph);
            pthread_mutex_unlock(&ph->mu);
            if (!ok) {
                mark_rest(cv, t, LM_BENCH_SKIP_LIMIT);
                break;
            }
        }
        rec->t_scheduled = now_s();
        bool ok = send_turn(ph, client, cv, t);
        pthread_mutex_lock(&ph->mu);
        finished_one(ph, rec);
        pthread_mutex_unlock(&ph->mu);
        if (!ok) {
            mark_rest(cv, t + 1, skip_after(rec));
            break;
        }
    }
    cv->done = true;
}

struct worker {
    struct phase *ph;
    pthread_t thread;
    lm_status st;
};

static void *conc_worker(void *arg) {
    struct worker *w = arg;
    struct phase *ph = w->ph;
    struct lm_bench_client client;
    w->st = lm_bench_client_init(&client, ph->p->url, ph->p->api_key, ph->p->timeout_s);
    for (;;) {
        pthread_mutex_lock(&ph->mu);
        struct conv *cv = w->st ? NULL : start_conv(ph);
        pthread_mutex_unlock(&ph->mu);
        if (!cv) break;
        run_conversation(ph, &client, cv);
    }
    lm_bench_client_free(&client);
    return NULL;
}

/* ---- request-rate mode: a dispatcher releases requests to a pool ---- */

static void *rate_worker(void *arg) {
    struct worker *w = arg;
    struct phase *ph = w->ph;
    struct lm_bench_client client;
    w->st = lm_bench_client_init(&client, ph->p->url, ph->p->api_key, ph->p->timeout_s);
    pthread_mutex_lock(&ph->mu);
    for (;;) {
        while (!ph->q_len && !ph->closing)
            pthread_cond_wait(&ph->cv, &ph->mu);
        if (!ph->q_len) break;
        struct conv *cv = ph->queue[ph->q_head];
        ph->q_head = (ph->q_head + 1) % (size_t)ph->workers;
        ph->q_len--;
        pthread_mutex_unlock(&ph->mu);
        size_t t = cv->next;
        bool ok = send_turn(ph, &client, cv, t);
        pthread_mutex_lock(&ph->mu);
        finished_one(ph, &cv->recs[t]);
        ph->in_flight--;
        cv->busy = false;
        cv->next++;
        if (!ok) {
            mark_rest(cv, cv->next, skip_after(&cv->recs[t]));
            cv->done = true;
        } else if (cv->next == cv->n_turns) {
            cv->done = true;
        } else {
            double ms = draw_think(ph->p, &cv->rng);
            cv->recs[cv->next].think_planned_ms = ms;
            cv->ready_at = now_s() + ms / 1e3;
        }
        pthread_cond_broadcast(&ph->cv);
    }
    pthread_mutex_unlock(&ph->mu);
    lm_bench_client_free(&client);
    return NULL;
}

static void wait_until(struct phase *ph, double t) {
    if (!isfinite(t)) t = now_s() + 0.1; /* on a signal, or after 100 ms (below) */
    /* the condition variable runs on CLOCK_REALTIME: convert; at most 100 ms, so that the
     * dispatcher sees an interrupted run's stop (the caller's loop looks again) */
    double rel = t - now_s();
    if (rel <= 0) return;
    if (rel > 0.1) rel = 0.1;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double abs_s = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + rel;
    ts.tv_sec = (time_t)abs_s;
    ts.tv_nsec = (long)((abs_s - (double)ts.tv_sec) * 1e9);
    pthread_cond_timedwait(&ph->cv, &ph->mu, &ts);
}

/* Lock held. The next request to release at `t`, or NULL with *wait_for set to when to look
 * again (INFINITY: on a signal), or NULL with *wait_for NAN when nothing is left. */
static struct conv *pick(struct phase *ph, double *wait_for) {
    struct conv *best = NULL;
    double earliest = INFINITY;
    bool pending = false;
    double t = now_s();
    for (size_t i = 0; i < ph->n_convs; i++) {
        struct conv *cv = ph->convs[i];
        if (cv->done) continue;
        pending = true;
        if (cv->busy) continue;
        if (cv->ready_at <= t && (!best || cv->ready_at < best->ready_at)) best = cv;
        if (cv->ready_at > t && cv->ready_at < earliest) earliest = cv->ready_at;
    }
    if (ph->in_flight >= ph->workers) {
        *wait_for = INFINITY;
        return NULL;
    }
    if (best) {
        if (!may_send(ph)) best = NULL;
        *wait_for = NAN;
        return best;
    }
    struct conv *cv = start_conv(ph);
    if (cv) return cv;
    /* start_conv stops short of may_send once the conversations are all started: an interrupt
     * or the deadline must still end the wait for the pending ones' next turns (else it waits
     * out their think time, or spins on a deadline already past) */
    if (limit_reached(ph) || !pending) {
        *wait_for = NAN;
        return NULL;
    }
    *wait_for = earliest < ph->deadline ? earliest : ph->deadline;
    return NULL;
}

static lm_status run_rate(struct phase *ph) {
    struct worker *w = calloc((size_t)ph->workers, sizeof *w);
    ph->queue = calloc((size_t)ph->workers, sizeof *ph->queue);
    if (!w || !ph->queue) abort();
    lm_status st = LM_OK;
    int started = 0;
    for (int i = 0; i < ph->workers; i++) {
        w[i].ph = ph;
        if (pthread_create(&w[i].thread, NULL, rate_worker, &w[i])) {
            st = lm_errorf(LM_ERR_NOMEM, "cannot start load thread %d of %d", i + 1, ph->workers);
            break;
        }
        started++;
    }
    if (started < ph->workers) ph->workers = started;
    uint64_t rng = ph->p->seed ^ 0x706f6973736f6eull;
    double mean_gap = 1.0 / ph->p->request_rate;
    double next = now_s();
    pthread_mutex_lock(&ph->mu);
    while (!st && started) {
        double d = (next < ph->deadline ? next : ph->deadline) - now_s();
        if (d > 0) {
            pthread_mutex_unlock(&ph->mu);
            sleep_ms(d * 1e3);
            pthread_mutex_lock(&ph->mu);
        }
        struct conv *cv = NULL;
        bool waited = false;
        for (;;) {
            double wait_for;
            cv = pick(ph, &wait_for);
            if (cv || isnan(wait_for) || ph->stop) break;
            waited = true;
            wait_until(ph, wait_for);
        }
        if (!cv) break;
        if (waited) {
            double lag = (now_s() - next) * 1e3;
            ph->run->n_deferred++;
            if (lag > ph->run->max_lag_ms) ph->run->max_lag_ms = lag;
        }
        cv->recs[cv->next].t_scheduled = next;
        cv->busy = true;
        ph->in_flight++;
        ph->queue[(ph->q_head + ph->q_len) % (size_t)ph->workers] = cv;
        ph->q_len++;
        pthread_cond_broadcast(&ph->cv);
        next += ph->p->arrival == LM_BENCH_ARRIVAL_POISSON
                    ? lm_bench_rng_exponential(&rng, mean_gap)
                    : mean_gap;
    }
    ph->closing = true;
    pthread_cond_broadcast(&ph->cv);
    pthread_mutex_unlock(&ph->mu);
    for (int i = 0; i < started; i++) {
        pthread_join(w[i].thread, NULL);
        if (w[i].st && !st) st = lm_errorf(w[i].st, "load thread %d: cannot start a client", i);
    }
    free(w);
    free(ph->queue);
    ph->queue = NULL;
    return st;
}

static lm_status run_conc(struct phase *ph) {
    struct worker *w = calloc((size_t)ph->workers, sizeof *w);
    if (!w) abort();
    int started = 0;
    lm_status st = LM_OK;
    for (int i = 0; i < ph->workers; i++) {
        w[i].ph = ph;
        if (pthread_create(&w[i].thread, NULL, conc_worker, &w[i])) {
            st = lm_errorf(LM_ERR_NOMEM, "cannot start load thread %d of %d", i + 1, ph->workers);
            break;
        }
        started++;
    }
    for (int i = 0; i < started; i++) {
        pthread_join(w[i].thread, NULL);
        if (w[i].st && !st) st = lm_errorf(w[i].st, "load thread %d: cannot start a client", i);
    }
    free(w);
    return st;
}

/* Runs a phase; its conversations' records are appended to *recs (grown). */
static lm_status run_phase(struct phase *ph, struct lm_bench_record **recs, size_t *n_recs) {
    pthread_mutex_init(&ph->mu, NULL);
    pthread_cond_init(&ph->cv, NULL);
    ph->last_decile = -1;
    ph->tty = ph->p->progress && isatty(fileno(ph->p->progress));
    ph->t_start = now_s();
    if (ph->planned == 0 && ph->max_convs) {
        for (size_t k = 0; k < ph->max_convs; k++) {
            size_t nt = ph->ds->convs[ph->order[k % ph->n_order]].n_turns;
            ph->planned += ph->turns_cap && nt > ph->turns_cap ? ph->turns_cap : nt;
        }
        if (ph->request_cap && ph->planned > ph->request_cap) ph->planned = ph->request_cap;
    } else if (!ph->planned) {
        ph->planned = ph->request_cap;
    }
    lm_status st = ph->rate ? run_rate(ph) : run_conc(ph);
    pthread_mutex_lock(&ph->mu);
    progress(ph, true);
    pthread_mutex_unlock(&ph->mu);
    size_t total = *n_recs;
    for (size_t i = 0; i < ph->n_convs; i++)
        total += ph->convs[i]->n_turns;
    *recs = realloc(*recs, (total ? total : 1) * sizeof **recs);
    if (!*recs) abort();
    for (size_t i = 0; i < ph->n_convs; i++) {
        struct conv *cv = ph->convs[i];
        mark_rest(cv, cv->next, LM_BENCH_SKIP_LIMIT); /* rate mode: turns never released */
        memcpy(*recs + *n_recs, cv->recs, cv->n_turns * sizeof *cv->recs);
        *n_recs += cv->n_turns;
        free(cv->recs);
        json_decref(cv->history);
        free(cv);
    }
    free(ph->convs);
    ph->convs = NULL;
    pthread_cond_destroy(&ph->cv);
    pthread_mutex_destroy(&ph->mu);
    return st;
}

static void make_run_id(char *out, size_t n) {
    uint64_t s = (uint64_t)(lm_bench_unix_now() * 1e9) ^ ((uint64_t)getpid() << 32);
    snprintf(out, n, "%08x", (unsigned)(lm_bench_rng_next(&s) >> 32));
}

lm_status lm_bench_run(const struct lm_bench_dataset *ds, const struct lm_bench_params *params,
                       struct lm_bench_run *run) {
    memset(run, 0, sizeof *run);
    run->params = *params;
    run->enable_thinking = -1;
    const struct lm_bench_params *p = &run->params;
    if (!p->url) return lm_errorf(LM_ERR_INVALID, "no server url");
    if (ds->n == 0)
        return lm_errorf(LM_ERR_INVALID, "%s: no conversations", ds->path ? ds->path : ds->name);
    if (!p->conversations && !p->request_count && !(p->duration_s > 0))
        return lm_errorf(LM_ERR_INVALID,
                         "set --conversations, --request-count or --benchmark-duration");
    if (p->request_rate <= 0 && p->concurrency < 1)
        return lm_errorf(LM_ERR_INVALID, "--concurrency must be >= 1");
    if (p->request_rate < 0 || p->concurrency < 0)
        return lm_errorf(LM_ERR_INVALID, "--request-rate and --concurrency must be >= 0");
    if (p->max_tokens < 1) return lm_errorf(LM_ERR_INVALID, "--max-tokens must be >= 1");
    if (p->think_time_mean_ms < 0 || p->think_time_std_ms < 0)
        return lm_errorf(LM_ERR_INVALID, "think times must be >= 0 ms");
    json_t *extra = NULL;
    if (p->extra_body) {
        json_error_t e;
        extra = json_loads(p->extra_body, 0, &e);
        if (!json_is_object(extra)) {
            json_decref(extra);
            return lm_errorf(LM_ERR_INVALID, "--extra-body: expected a JSON object (%s)",
                             extra ? "not an object" : e.text);
        }
        json_t *et =
            json_object_get(json_object_get(extra, "chat_template_kwargs"), "enable_thinking");
        if (json_is_boolean(et)) run->enable_thinking = json_is_true(et);
    }
    lm_bench_client_global_init();
    make_run_id(run->run_id, sizeof run->run_id);
    run->url = strdup(p->url);
    struct lm_bench_client c;
    lm_status st =
        lm_bench_client_init(&c, p->url, p->api_key, p->timeout_s > 0 ? p->timeout_s : 30);
    if (!st && p->model) {
        run->model = strdup(p->model);
    } else if (!st) {
        st = lm_bench_client_first_model(&c, &run->model);
        if (st) st = lm_error_prefix(st, "finding the model (give --model to skip)");
    }
    lm_bench_client_free(&c);
    if (st) {
        json_decref(extra);
        return st;
    }

    /* Which conversations: measured ones in file or seeded order; warmup ones from the end of the
     * dataset, skipping the measured ones while others remain. */
    size_t *order = calloc(ds->n, sizeof *order), *warm = calloc(ds->n, sizeof *warm);
    bool *used = calloc(ds->n, sizeof *used);
    if (!order || !warm || !used) abort();
    lm_bench_select(ds->n, ds->n, p->shuffle, p->seed, order);
    const size_t n_convs = p->conversations_default && p->conversations > ds->n ? ds->n : p->conversations;
    size_t n_used = n_convs && n_convs < ds->n ? n_convs : ds->n;
    for (size_t i = 0; i < n_used; i++)
        used[order[i]] = true;
    size_t nw = 0;
    for (size_t j = ds->n; j-- > 0;)
        if (!used[j]) warm[nw++] = j;
    bool warm_on = p->warmup_duration_s > 0 || p->warmup_requests > 0;
    if (nw == 0) {
        for (size_t j = ds->n; j-- > 0;)
            warm[nw++] = j;
        /* the warmup then replays measured conversations' first turns, which the server's prefix
         * cache keeps: say so, as their TTFT will show it */
        if (warm_on && p->progress)
            fprintf(p->progress,
                    "lumen profile: note: all %zu conversations of the dataset are measured, so the "
                    "warmup reuses some of them: their measured first turns may find the server's "
                    "prefix cache warm (measure fewer with --conversations to keep them apart)\n",
                    ds->n);
    }

    struct lm_bench_record *recs = NULL;
    size_t n_recs = 0;
    struct phase wp = {
        .ds = ds,
        .p = p,
        .run = run,
        .extra = extra,
        .label = "warmup",
        .phase = LM_BENCH_PHASE_WARMUP,
        .tag = 'w',
        .order = warm,
        .n_order = nw,
        .max_convs = p->warmup_duration_s > 0 ? 0 : p->warmup_requests,
        .turns_cap = 1,
        .deadline = INFINITY,
        .workers = p->warmup_concurrency > 0 ? p->warmup_concurrency
                   : p->request_rate > 0     ? 1
                                             : p->concurrency,
    };
    if (warm_on) {
        if (p->warmup_duration_s > 0) wp.deadline = now_s() + p->warmup_duration_s;
        run->warmup_t_begin = now_s();
        st = run_phase(&wp, &recs, &n_recs);
        run->warmup_t_end = now_s();
    }
    run->n_warmup = n_recs;
    struct phase pp = {
        .ds = ds,
        .p = p,
        .run = run,
        .extra = extra,
        .label = "profiling",
        .phase = LM_BENCH_PHASE_PROFILING,
        .tag = 'c',
        .order = order,
        .n_order = ds->n,
        .max_convs = n_convs,
        .request_cap = p->request_count,
        .deadline = INFINITY,
        .rate = p->request_rate > 0,
        .workers =
            p->request_rate > 0 ? (p->concurrency > 0 ? p->concurrency : 256) : p->concurrency,
    };
    if (!st) {
        if (p->duration_s > 0) pp.deadline = now_s() + p->duration_s;
        st = run_phase(&pp, &recs, &n_recs);
        run->n_conversations = pp.n_convs;
        run->limit_hit = pp.limit;
    }
    run->records = recs;
    run->n_records = n_recs;

    /* The profiling window: first measured request sent .. last measured response ended. */
    run->t_begin = INFINITY;
    run->t_end = -INFINITY;
    for (size_t i = run->n_warmup; i < n_recs; i++) {
        const struct lm_bench_record *r = &recs[i];
        if (!r->sent) continue;
        if (r->t_send < run->t_begin) {
            run->t_begin = r->t_send;
            run->unix_begin = r->start_unix;
        }
        if (r->t_end > run->t_end) run->t_end = r->t_end;
    }
    free(order);
    free(warm);
    free(used);
    json_decref(extra);
    return st;
}

void lm_bench_run_free(struct lm_bench_run *run) {
    if (!run) return;
    for (size_t i = 0; i < run->n_records; i++)
        lm_bench_record_free(&run->records[i]);
    free(run->records);
    free(run->model);
    free(run->url);
    memset(run, 0, sizeof *run);
}
