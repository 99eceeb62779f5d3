/* metrics.c: see metrics.h. */
#include "server/metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BUCKETS 24
#define MAX_SERIES 64

struct histogram {
    const char *name, *help;
    int n_bounds;
    double bounds[MAX_BUCKETS];     /* upper bounds, ascending; +Inf is implicit */
    double counts[MAX_BUCKETS + 1]; /* per bucket (not cumulative); weights may exceed 1 */
    double sum, count;
};

struct series {
    const char *endpoint; /* static */
    int status;
    unsigned long long n;
};

struct lm_metrics {
    pthread_mutex_t mu;
    struct series req[MAX_SERIES];
    int n_req;
    unsigned long long prompt_tokens, generation_tokens, cached_tokens;
    struct histogram ttft, itl, latency, queue;
};

static void hist_init(struct histogram *h, const char *name, const char *help, const double *b,
                      int n) {
    memset(h, 0, sizeof *h);
    h->name = name;
    h->help = help;
    h->n_bounds = n;
    memcpy(h->bounds, b, (size_t)n * sizeof *b);
}

static void hist_observe(struct histogram *h, double v, double weight) {
    if (!(v >= 0) || !(weight > 0)) return;
    int i = 0;
    while (i < h->n_bounds && v > h->bounds[i])
        i++;
    h->counts[i] += weight;
    h->sum += v * weight;
    h->count += weight;
}

struct lm_metrics *lm_metrics_create(void) {
    struct lm_metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    pthread_mutex_init(&m->mu, NULL);
    static const double ttft[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,
                                  0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0};
    static const double itl[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,
                                 0.15,   0.2,   0.3,    0.4,   0.5,  0.75,  1.0,  2.5};
    static const double lat[] = {0.01, 0.025, 0.05, 0.1,  0.3,  0.5,  0.8,  1.0,  1.5,  2.0,
                                 2.5,  5.0,   10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0};
    hist_init(&m->ttft, "lumen_time_to_first_token_seconds",
              "Time from a request's arrival to its first generated token.", ttft,
              sizeof ttft / sizeof *ttft);
    hist_init(&m->itl, "lumen_inter_token_latency_seconds",
              "Time between generated tokens (each request's mean gap, weighted by its gaps).", itl,
              sizeof itl / sizeof *itl);
    hist_init(&m->latency, "lumen_request_latency_seconds",
              "Time from a request's arrival to its retirement.", lat, sizeof lat / sizeof *lat);
    hist_init(&m->queue, "lumen_request_queue_seconds",
              "Time from a request's arrival to its scheduling.", lat, sizeof lat / sizeof *lat);
    return m;
}

void lm_metrics_destroy(struct lm_metrics *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void lm_metrics_count_request(struct lm_metrics *m, const char *endpoint, int status) {
    pthread_mutex_lock(&m->mu);
    int i = 0;
    while (i < m->n_req && !(m->req[i].status == status && !strcmp(m->req[i].endpoint, endpoint)))
        i++;
    if (i == m->n_req && m->n_req < MAX_SERIES)
        m->req[m->n_req++] = (struct series){endpoint, status, 0};
    if (i < m->n_req) m->req[i].n++;
    pthread_mutex_unlock(&m->mu);
}

void lm_metrics_observe(struct lm_metrics *m, const struct lm_metrics_request *r) {
    pthread_mutex_lock(&m->mu);
    if (r->prompt_tokens > 0) m->prompt_tokens += (unsigned long long)r->prompt_tokens;
    if (r->completion_tokens > 0) m->generation_tokens += (unsigned long long)r->completion_tokens;
    if (r->cached_tokens > 0) m->cached_tokens += (unsigned long long)r->cached_tokens;
    hist_observe(&m->queue, r->queue_s, 1);
    hist_observe(&m->ttft, r->ttft_s, 1);
    if (r->completion_tokens > 1 && r->decode_s >= 0)
        hist_observe(&m->itl, r->decode_s / (r->completion_tokens - 1), r->completion_tokens - 1);
    hist_observe(&m->latency, r->latency_s, 1);
    pthread_mutex_unlock(&m->mu);
}

/* A number as Prometheus writes it ("+Inf", integers without a fraction). */
static void put_num(struct lm_buf *out, double v) {
    if (isinf(v))
        lm_buf_puts(out, v > 0 ? "+Inf" : "-Inf");
    else if (v == floor(v) && fabs(v) < 1e15)
        lm_buf_printf(out, "%.0f", v);
    else
        lm_buf_printf(out, "%.9g", v);
}

static void render_hist(struct lm_buf *out, const struct histogram *h) {
    lm_buf_printf(out, "# HELP %s %s\n# TYPE %s histogram\n", h->name, h->help, h->name);
    double cum = 0;
    for (int i = 0; i <= h->n_bounds; i++) {
        cum += h->counts[i];
        lm_buf_printf(out, "%s_bucket{le=\"", h->name);
        put_num(out, i < h->n_bounds ? h->bounds[i] : INFINITY);
        lm_buf_puts(out, "\"} ");
        put_num(out, cum);
        lm_buf_putc(out, '\n');
    }
    lm_buf_printf(out, "%s_sum ", h->name);
    put_num(out, h->sum);
    lm_buf_printf(out, "\n%s_count ", h->name);
    put_num(out, h->count);
    lm_buf_putc(out, '\n');
}

static void counter(struct lm_buf *out, const char *name, const char *help, unsigned long long v) {
    lm_buf_printf(out, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name, v);
}

static void gauge(struct lm_buf *out, const char *name, const char *help, long v) {
    if (v < 0) return;
    lm_buf_printf(out, "# HELP %s %s\n# TYPE %s gauge\n%s %ld\n", name, help, name, name, v);
}

void lm_metrics_render(struct lm_metrics *m, const struct lm_metrics_gauges *g,
                       struct lm_buf *out) {
    pthread_mutex_lock(&m->mu);
    lm_buf_puts(out, "# HELP lumen_requests_total HTTP requests answered, by endpoint and status.\n"
                     "# TYPE lumen_requests_total counter\n");
    for (int i = 0; i < m->n_req; i++)
        lm_buf_printf(out, "lumen_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n",
                      m->req[i].endpoint, m->req[i].status, m->req[i].n);
    counter(out, "lumen_prompt_tokens_total",
            "Prompt tokens of the generation requests that retired.", m->prompt_tokens);
    counter(out, "lumen_generation_tokens_total", "Tokens generated by the requests that retired.",
            m->generation_tokens);
    counter(out, "lumen_cached_prompt_tokens_total", "Prompt tokens served from the prefix cache.",
            m->cached_tokens);
    render_hist(out, &m->ttft);
    render_hist(out, &m->itl);
    render_hist(out, &m->latency);
    render_hist(out, &m->queue);
    pthread_mutex_unlock(&m->mu);
    gauge(out, "lumen_num_requests_running", "Sequences running in the engine.", g->running);
    gauge(out, "lumen_num_requests_waiting", "Requests waiting for the engine.", g->waiting);
    gauge(out, "lumen_kv_cache_blocks_used", "KV-cache blocks held by running sequences.",
          g->kv_blocks_used);
    gauge(out, "lumen_kv_cache_blocks_cached",
          "KV-cache blocks held by no sequence, kept for prefix reuse (evicted on demand).",
          g->kv_blocks_cached);
    gauge(out, "lumen_kv_cache_blocks_free", "KV-cache blocks neither held nor cached.",
          g->kv_blocks_free);
    counter(out, "lumen_spec_decode_num_drafts_total",
            "Speculative decoding: sequence-steps that verified a draft.",
            (unsigned long long)g->spec_drafts);
    counter(out, "lumen_spec_decode_num_draft_tokens_total",
            "Speculative decoding: draft tokens run in verification steps.",
            (unsigned long long)g->spec_draft_tokens);
    counter(out, "lumen_spec_decode_num_accepted_tokens_total",
            "Speculative decoding: draft tokens accepted (each one a forward step saved).",
            (unsigned long long)g->spec_accepted_tokens);
}
