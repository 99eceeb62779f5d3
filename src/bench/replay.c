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
#include "text/tokenizer.h"

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

/* splitmix64 (Steele, Lea, Flood 2014): a small, well-mixed generator for seeding and draws. */
static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double uniform01(uint64_t *s) { return (double)(splitmix64(s) >> 11) * 0x1.0p-53; }

void lm_bench_select(size_t ds_n, size_t n, bool shuffle, uint64_t seed, size_t *out) {
    size_t *perm = malloc((ds_n ? ds_n : 1) * sizeof *perm);
    if (!perm) abort();
    for (size_t i = 0; i < ds_n; i++) perm[i] = i;
    if (shuffle) { /* Fisher-Yates */
        uint64_t s = seed;
        for (size_t i = ds_n; i > 1; i--) {
            size_t j = (size_t)(splitmix64(&s) % i);
            size_t t = perm[i - 1];
            perm[i - 1] = perm[j];
            perm[j] = t;
        }
    }
    for (size_t i = 0; i < n; i++) out[i] = perm[i % ds_n];
    free(perm);
}

static void sleep_ms(double ms) {
    if (!(ms > 0)) return;
    struct timespec ts = {.tv_sec = (time_t)(ms / 1e3),
                          .tv_nsec = (long)(fmod(ms, 1e3) * 1e6)};
    while (nanosleep(&ts, &ts) && errno == EINTR) {
    }
}

/* One phase (warmup or profiling): the conversations it runs and the threads' shared state. */
struct phase {
    const struct lm_bench_dataset *ds;
    const struct lm_bench_params *p;
    struct lm_bench_run *run;
    const char *label;        /* "warmup" / "profiling" */
    size_t n_convs;
    const size_t *ds_index;   /* [n_convs] dataset conversation of each */
    size_t *first_record;     /* [n_convs] index of its turn-1 record in run->records */
    size_t *n_turns;          /* [n_convs] turns to run */
    json_t *extra;            /* params.extra_body parsed; borrowed */
    pthread_mutex_t mu;
    size_t next;              /* next conversation to start */
    size_t done, total;       /* requests finished / planned (progress) */
    int last_decile;
    size_t printed;           /* done count of the last line printed */
    bool tty;
};

static void progress(struct phase *ph, bool final) {
    FILE *f = ph->p->progress;
    if (!f) return;
    if (ph->tty) {
        fprintf(f, "\r%s: %zu/%zu requests%s", ph->label, ph->done, ph->total, final ? "\n" : "");
    } else { /* a log file: one line per tenth, and the last */
        int decile = ph->total ? (int)(ph->done * 10 / ph->total) : 10;
        if (final ? ph->printed == ph->done : decile == ph->last_decile) return;
        ph->last_decile = decile;
        ph->printed = ph->done;
        fprintf(f, "%s: %zu/%zu requests\n", ph->label, ph->done, ph->total);
    }
    fflush(f);
}

static json_t *message(const char *role, const char *content) {
    return json_pack("{s:s, s:s}", "role", role, "content", content);
}

/* The request body for `messages` (borrowed; the body takes a new reference). */
static char *request_body(const struct phase *ph, json_t *messages) {
    const struct lm_bench_params *p = ph->p;
    json_t *o = json_object();
    json_object_set_new(o, "model", json_string(ph->run->model));
    json_object_set(o, "messages", messages);
    json_object_set_new(o, "stream", json_true());
    json_object_set_new(o, "stream_options", json_pack("{s:b}", "include_usage", 1));
    json_object_set_new(o, "max_tokens", json_integer(p->max_tokens));
    json_object_set_new(o, "temperature", json_real(p->temperature));
    if (p->ignore_eos) json_object_set_new(o, "ignore_eos", json_true());
    if (ph->extra) json_object_update(o, ph->extra);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s) abort();
    return s;
}

/* With --tokenizer: tokens of each chunk's text (content and reasoning), and the output token
 * count when the server sent no usage. */
static void count_tokens(const struct lm_tokenizer *tok, struct lm_bench_record *r) {
    struct lm_ids ids = {0};
    long total = 0;
    for (size_t i = 0; i < r->n_chunks; i++) {
        struct lm_bench_chunk *c = &r->chunks[i];
        ids.n = 0;
        if (c->reasoning_len)
            lm_tokenizer_encode(tok, r->reasoning.p + c->reasoning_off, c->reasoning_len, 0, &ids);
        if (c->content_len)
            lm_tokenizer_encode(tok, r->content.p + c->content_off, c->content_len, 0, &ids);
        c->tokens = (int)ids.n;
        total += (long)ids.n;
    }
    if (r->output_tokens < 0 && !r->error) r->output_tokens = total;
    lm_ids_free(&ids);
}

static void run_conversation(struct phase *ph, struct lm_bench_client *client, size_t ci) {
    const struct lm_bench_params *p = ph->p;
    struct lm_bench_run *run = ph->run;
    const struct lm_bench_conversation *conv = &ph->ds->convs[ph->ds_index[ci]];
    bool warm = run->records[ph->first_record[ci]].phase == LM_BENCH_PHASE_WARMUP;
    uint64_t rng = p->seed ^ (0x5851f42d4c957f2dull * (uint64_t)(ci + 1)) ^ (warm ? 0xabcdull : 0);
    json_t *history = json_array();
    if (conv->system) json_array_append_new(history, message("system", conv->system));
    bool failed = false;
    for (size_t t = 0; t < ph->n_turns[ci]; t++) {
        struct lm_bench_record *rec = &run->records[ph->first_record[ci] + t];
        if (failed) continue; /* skipped: sent stays false */
        json_array_append_new(history, message("user", conv->turns[t]));
        rec->messages = json_deep_copy(history);
        char *body = request_body(ph, rec->messages);
        lm_bench_client_chat(client, body, rec);
        free(body);
        if (p->tokenizer) count_tokens(p->tokenizer, rec);
        pthread_mutex_lock(&ph->mu);
        ph->done++;
        progress(ph, false);
        pthread_mutex_unlock(&ph->mu);
        if (rec->error) {
            failed = true;
            continue;
        }
        json_array_append_new(history, message("assistant", rec->content.p ? rec->content.p : ""));
        if (t + 1 < ph->n_turns[ci]) {
            double ms = p->think_time_mean_ms;
            if (p->think_time_std_ms > 0) { /* Box-Muller */
                double u1 = uniform01(&rng), u2 = uniform01(&rng);
                if (u1 < 1e-300) u1 = 1e-300;
                ms += p->think_time_std_ms * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
            }
            sleep_ms(ms);
        }
    }
    if (failed) {
        pthread_mutex_lock(&ph->mu);
        for (size_t t = 0; t < ph->n_turns[ci]; t++)
            if (!run->records[ph->first_record[ci] + t].sent) ph->done++;
        pthread_mutex_unlock(&ph->mu);
    }
    json_decref(history);
}

struct worker {
    struct phase *ph;
    pthread_t thread;
    lm_status st;
};

static void *worker_main(void *arg) {
    struct worker *w = arg;
    struct phase *ph = w->ph;
    struct lm_bench_client client;
    w->st = lm_bench_client_init(&client, ph->p->url, ph->p->api_key, ph->p->timeout_s);
    if (w->st) {
        lm_bench_client_free(&client);
        return NULL;
    }
    for (;;) {
        pthread_mutex_lock(&ph->mu);
        size_t ci = ph->next < ph->n_convs ? ph->next++ : ph->n_convs;
        pthread_mutex_unlock(&ph->mu);
        if (ci == ph->n_convs) break;
        run_conversation(ph, &client, ci);
    }
    lm_bench_client_free(&client);
    return NULL;
}

/* Sets up the records of a phase's conversations starting at run->records[first]. */
static void init_records(struct phase *ph, enum lm_bench_phase phase, size_t first, char tag) {
    struct lm_bench_run *run = ph->run;
    size_t r = first;
    for (size_t ci = 0; ci < ph->n_convs; ci++) {
        ph->first_record[ci] = r;
        const struct lm_bench_conversation *conv = &ph->ds->convs[ph->ds_index[ci]];
        for (size_t t = 0; t < ph->n_turns[ci]; t++, r++) {
            struct lm_bench_record *rec = &run->records[r];
            struct lm_buf b = {0};
            rec->phase = phase;
            rec->conversation = ci;
            rec->turn = (int)t + 1;
            rec->ttft_ms = rec->latency_ms = rec->t_last_event_ms = NAN;
            rec->output_tokens = rec->input_tokens = -1;
            lm_buf_printf(&b, "%s-%c%zu", run->run_id, tag, ci);
            rec->conversation_id = lm_buf_take(&b);
            lm_buf_printf(&b, "%s-%c%zu-t%zu", run->run_id, tag, ci, t + 1);
            rec->request_id = lm_buf_take(&b);
            rec->dataset_id = strdup(conv->id);
            if (!rec->dataset_id) abort();
        }
    }
    ph->total = r - first;
}

static lm_status run_phase(struct phase *ph, int concurrency) {
    if (ph->n_convs == 0) return LM_OK;
    if ((size_t)concurrency > ph->n_convs) concurrency = (int)ph->n_convs;
    pthread_mutex_init(&ph->mu, NULL);
    ph->last_decile = -1;
    ph->printed = (size_t)-1;
    ph->tty = ph->p->progress && isatty(fileno(ph->p->progress));
    struct worker *w = calloc((size_t)concurrency, sizeof *w);
    if (!w) abort();
    int started = 0;
    lm_status st = LM_OK;
    for (int i = 0; i < concurrency; i++) {
        w[i].ph = ph;
        if (pthread_create(&w[i].thread, NULL, worker_main, &w[i])) {
            st = lm_errorf(LM_ERR_NOMEM, "cannot start load thread %d of %d", i + 1, concurrency);
            break;
        }
        started++;
    }
    for (int i = 0; i < started; i++) {
        pthread_join(w[i].thread, NULL);
        if (w[i].st && !st) st = lm_errorf(w[i].st, "load thread %d: cannot start a client", i);
    }
    progress(ph, true);
    free(w);
    pthread_mutex_destroy(&ph->mu);
    return st;
}

static void make_run_id(char *out, size_t n) {
    uint64_t s = (uint64_t)(lm_bench_unix_now() * 1e9) ^ ((uint64_t)getpid() << 32);
    snprintf(out, n, "%08x", (unsigned)(splitmix64(&s) >> 32));
}

lm_status lm_bench_run(const struct lm_bench_dataset *ds, const struct lm_bench_params *params,
                       struct lm_bench_run *run) {
    memset(run, 0, sizeof *run);
    run->params = *params;
    const struct lm_bench_params *p = &run->params;
    if (!p->url) return lm_errorf(LM_ERR_INVALID, "no server url");
    if (ds->n == 0) return lm_errorf(LM_ERR_INVALID, "%s: no conversations", ds->path);
    if (p->conversations == 0) return lm_errorf(LM_ERR_INVALID, "--conversations must be >= 1");
    if (p->concurrency < 1) return lm_errorf(LM_ERR_INVALID, "--concurrency must be >= 1");
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
    }
    lm_bench_client_global_init();
    make_run_id(run->run_id, sizeof run->run_id);
    run->url = strdup(p->url);
    lm_status st = LM_OK;
    if (p->model) {
        run->model = strdup(p->model);
    } else {
        struct lm_bench_client c;
        st = lm_bench_client_init(&c, p->url, p->api_key, p->timeout_s > 0 ? p->timeout_s : 30);
        if (!st) st = lm_bench_client_first_model(&c, &run->model);
        lm_bench_client_free(&c);
        if (st) {
            json_decref(extra);
            return lm_error_prefix(st, "finding the model (give --model to skip)");
        }
    }

    /* Which conversations: measured ones first, then warmup ones from the end of the dataset. */
    size_t nc = p->conversations, nw = p->warmup_requests;
    size_t *meas = calloc(nc, sizeof *meas), *warm = calloc(nw ? nw : 1, sizeof *warm);
    bool *used = calloc(ds->n, sizeof *used);
    if (!meas || !warm || !used) abort();
    lm_bench_select(ds->n, nc, p->shuffle, p->seed, meas);
    for (size_t i = 0; i < nc; i++) used[meas[i]] = true;
    size_t k = 0;
    for (size_t j = ds->n; j-- > 0 && k < nw;)
        if (!used[j]) warm[k++] = j;
    for (size_t j = 0; k < nw; j++) warm[k++] = ds->n - 1 - j % ds->n; /* too few: reuse */

    size_t n_records = nw;
    for (size_t i = 0; i < nc; i++) n_records += ds->convs[meas[i]].n_turns;
    run->records = calloc(n_records, sizeof *run->records);
    size_t *first = calloc(nc + nw + 1, sizeof *first), *turns = calloc(nc + nw + 1, sizeof *turns);
    if (!run->records || !first || !turns) abort();
    run->n_records = n_records;
    run->n_warmup = nw;
    run->n_conversations = nc;

    struct phase wp = {.ds = ds, .p = p, .run = run, .label = "warmup", .n_convs = nw,
                       .ds_index = warm, .first_record = first, .n_turns = turns, .extra = extra};
    for (size_t i = 0; i < nw; i++) turns[i] = 1;
    init_records(&wp, LM_BENCH_PHASE_WARMUP, 0, 'w');
    struct phase pp = {.ds = ds, .p = p, .run = run, .label = "profiling", .n_convs = nc,
                       .ds_index = meas, .first_record = first + nw, .n_turns = turns + nw,
                       .extra = extra};
    for (size_t i = 0; i < nc; i++) turns[nw + i] = ds->convs[meas[i]].n_turns;
    init_records(&pp, LM_BENCH_PHASE_PROFILING, nw, 'c');

    st = run_phase(&wp, p->warmup_concurrency > 0 ? p->warmup_concurrency : p->concurrency);
    if (!st) st = run_phase(&pp, p->concurrency);

    /* The profiling window: first measured request sent .. last measured response ended. */
    run->t_begin = INFINITY;
    run->t_end = -INFINITY;
    for (size_t i = nw; i < n_records; i++) {
        const struct lm_bench_record *r = &run->records[i];
        if (!r->sent) continue;
        if (r->t_send < run->t_begin) {
            run->t_begin = r->t_send;
            run->unix_begin = r->start_unix;
        }
        if (r->t_end > run->t_end) run->t_end = r->t_end;
    }
    free(meas);
    free(warm);
    free(used);
    free(first);
    free(turns);
    json_decref(extra);
    return st;
}

void lm_bench_run_free(struct lm_bench_run *run) {
    if (!run) return;
    for (size_t i = 0; i < run->n_records; i++) lm_bench_record_free(&run->records[i]);
    free(run->records);
    free(run->model);
    free(run->url);
    memset(run, 0, sizeof *run);
}
