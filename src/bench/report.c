/* report.c: see report.h. */
#include "bench/report.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"

static const struct lm_bench_metric_info k_metrics[LM_BENCH_M_COUNT] = {
    [LM_BENCH_M_TTFT] = {"time_to_first_token", "Time to First Token", "ms"},
    [LM_BENCH_M_TTST] = {"time_to_second_token", "Time to Second Token", "ms"},
    [LM_BENCH_M_TTFO] = {"time_to_first_output_token", "Time to First Output Token", "ms"},
    [LM_BENCH_M_ITL_TOKEN] = {"inter_token_latency_per_token", "Inter Token Latency per Token", "ms"},
    [LM_BENCH_M_ITL] = {"inter_token_latency", "Inter Token Latency", "ms"},
    [LM_BENCH_M_ICL] = {"inter_chunk_latency", "Inter Chunk Latency", "ms"},
    [LM_BENCH_M_LATENCY] = {"request_latency", "Request Latency", "ms"},
    [LM_BENCH_M_OTPU] = {"output_token_throughput_per_user", "Output Token Throughput Per User",
                         "tokens/s"},
    [LM_BENCH_M_OSL] = {"output_sequence_length", "Output Sequence Length", "tokens"},
    [LM_BENCH_M_ISL] = {"input_sequence_length", "Input Sequence Length", "tokens"},
    [LM_BENCH_M_THINK] = {"think_time_measured", "Think Time (measured)", "ms"},
    [LM_BENCH_M_S_QUEUE] = {"server_queue_time", "Server Queue Time", "ms"},
    [LM_BENCH_M_S_PREFILL] = {"server_prefill_time", "Server Prefill Time", "ms"},
    [LM_BENCH_M_S_DECODE] = {"server_decode_time", "Server Decode Time", "ms"},
    [LM_BENCH_M_S_TOTAL] = {"server_total_time", "Server Total Time", "ms"},
    [LM_BENCH_M_S_ACCEPT] = {"server_draft_acceptance", "Server Draft Acceptance per Request", "%"},
};

const struct lm_bench_metric_info *lm_bench_metric_info(enum lm_bench_metric m) {
    return &k_metrics[m];
}

static bool ok(const struct lm_bench_record *r) {
    return r->phase == LM_BENCH_PHASE_PROFILING && r->sent && !r->error;
}

/* Output tokens of a successful record: usage, else lumen's count, else its chunks. */
static double record_tokens(const struct lm_bench_record *r) {
    if (r->output_tokens >= 0) return (double)r->output_tokens;
    if (r->tokens_counted) return (double)r->own_output_tokens;
    return (double)r->n_chunks;
}

/* A number of the request's server record (NAN when absent or null). */
static double server_num(const struct lm_bench_record *r, const char *key) {
    json_t *v = json_object_get(r->server_record, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

/* Per-turn throughput over the time a turn holds the server alone (see report.h). */
struct edge {
    double t;
    int turn_row, delta;
};

static int cmp_edge(const void *a, const void *b) {
    const struct edge *x = a, *y = b;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    return x->delta - y->delta; /* ends before starts at the same instant */
}

struct seg {
    double a, b;
    int row; /* the row holding the server alone */
};

static int row_of(int turn, int n_rows) {
    return turn - 1 < n_rows ? turn - 1 : n_rows - 1;
}

static void turn_alone(const struct lm_bench_run *run, struct lm_bench_summary *s) {
    int nr = s->n_turn_rows;
    if (nr == 0) return;
    size_t n = 0;
    for (size_t i = run->n_warmup; i < run->n_records; i++)
        n += run->records[i].sent;
    struct edge *e = calloc(2 * n + 1, sizeof *e);
    struct seg *seg = calloc(2 * n + 1, sizeof *seg);
    if (!e || !seg) abort();
    size_t ne = 0, ns = 0;
    for (size_t i = run->n_warmup; i < run->n_records; i++) {
        const struct lm_bench_record *r = &run->records[i];
        if (!r->sent) continue;
        int row = row_of(r->turn, nr);
        e[ne++] = (struct edge){r->t_send, row, +1};
        e[ne++] = (struct edge){r->t_end, row, -1};
    }
    qsort(e, ne, sizeof *e, cmp_edge);
    int active[LM_BENCH_MAX_TURN_ROWS] = {0}, total = 0;
    for (size_t i = 0; i < ne; i++) {
        active[e[i].turn_row] += e[i].delta;
        total += e[i].delta;
        if (i + 1 < ne && e[i + 1].t > e[i].t && total > 0) {
            for (int k = 0; k < nr; k++)
                if (active[k] == total) {
                    if (ns && seg[ns - 1].row == k && seg[ns - 1].b == e[i].t)
                        seg[ns - 1].b = e[i + 1].t;
                    else
                        seg[ns++] = (struct seg){e[i].t, e[i + 1].t, k};
                    s->turns[k].alone_s += e[i + 1].t - e[i].t;
                }
        }
    }
    for (size_t i = run->n_warmup; i < run->n_records; i++) {
        const struct lm_bench_record *r = &run->records[i];
        if (!ok(r)) continue;
        int row = row_of(r->turn, nr);
        double per_chunk_scale = 1;
        double counted = 0;
        for (size_t c = 0; c < r->n_chunks; c++)
            counted += r->tokens_counted ? r->chunks[c].tokens : 1;
        double tokens = record_tokens(r);
        if (counted > 0) per_chunk_scale = tokens / counted; /* spread usage over the chunks */
        s->turns[row].tokens += tokens;
        for (size_t c = 0; c < r->n_chunks; c++) {
            double t = r->t_send + r->chunks[c].t_ms / 1e3;
            double k = (r->tokens_counted ? r->chunks[c].tokens : 1) * per_chunk_scale;
            /* binary search: the last segment starting at or before t */
            size_t lo = 0, hi = ns;
            while (lo < hi) {
                size_t mid = (lo + hi) / 2;
                if (seg[mid].a <= t)
                    lo = mid + 1;
                else
                    hi = mid;
            }
            if (lo > 0 && seg[lo - 1].row == row && t <= seg[lo - 1].b)
                s->turns[row].alone_tokens += k;
        }
    }
    for (int k = 0; k < nr; k++) {
        struct lm_bench_turn_summary *t = &s->turns[k];
        t->output_token_throughput = t->alone_s > 0 ? t->alone_tokens / t->alone_s : NAN;
    }
    free(e);
    free(seg);
}

void lm_bench_summarize(const struct lm_bench_run *run, const struct lm_bench_slo *slo,
                        struct lm_bench_summary *s) {
    memset(s, 0, sizeof *s);
    if (slo) s->slo = *slo;
    s->slo_set = s->slo.ttft_ms > 0 || s->slo.itl_ms > 0 || s->slo.latency_ms > 0;
    struct lm_bench_samples v[LM_BENCH_M_COUNT];
    memset(v, 0, sizeof v);
    int max_turn = 0;
    for (size_t i = 0; i < run->n_warmup; i++) {
        s->n_warmup += run->records[i].sent;
        s->n_warmup_ok += run->records[i].sent && !run->records[i].error;
    }
    for (size_t i = run->n_warmup; i < run->n_records; i++) {
        const struct lm_bench_record *r = &run->records[i];
        if (!r->sent) {
            if (r->skip == LM_BENCH_SKIP_LIMIT)
                s->n_skipped_limit++;
            else
                s->n_skipped_failure++;
            continue;
        }
        s->n_requests++;
        if (r->server_record) s->server_side = true;
        if (r->error) {
            s->n_failed++;
            s->errors[r->error]++;
            continue;
        }
        s->n_ok++;
        if (r->turn > max_turn) max_turn = r->turn;
        double itl_req = lm_bench_record_itl_ms(r);
        lm_bench_samples_push(&v[LM_BENCH_M_TTFT], r->ttft_ms);
        lm_bench_samples_push(&v[LM_BENCH_M_TTST], lm_bench_record_ttst_ms(r));
        lm_bench_samples_push(&v[LM_BENCH_M_TTFO], r->ttfo_ms);
        lm_bench_record_itl_samples(r, &v[LM_BENCH_M_ITL_TOKEN]);
        lm_bench_samples_push(&v[LM_BENCH_M_ITL], itl_req);
        for (size_t c = 1; c < r->n_chunks; c++)
            lm_bench_samples_push(&v[LM_BENCH_M_ICL], r->chunks[c].t_ms - r->chunks[c - 1].t_ms);
        lm_bench_samples_push(&v[LM_BENCH_M_LATENCY], r->latency_ms);
        lm_bench_samples_push(&v[LM_BENCH_M_OTPU], itl_req > 0 ? 1000.0 / itl_req : NAN);
        if (r->tokens_counted) s->tokens_counted = true;
        if (r->output_tokens >= 0) {
            lm_bench_samples_push(&v[LM_BENCH_M_OSL], (double)r->output_tokens);
        } else {
            s->n_no_usage++;
        }
        s->total_output_tokens += record_tokens(r);
        if (r->input_tokens >= 0)
            lm_bench_samples_push(&v[LM_BENCH_M_ISL], (double)r->input_tokens);
        if (r->turn > 1) lm_bench_samples_push(&v[LM_BENCH_M_THINK], r->think_ms);
        if (r->server_record) {
            lm_bench_samples_push(&v[LM_BENCH_M_S_QUEUE], server_num(r, "queue_ms"));
            lm_bench_samples_push(&v[LM_BENCH_M_S_PREFILL], server_num(r, "prefill_ms"));
            lm_bench_samples_push(&v[LM_BENCH_M_S_DECODE], server_num(r, "decode_ms"));
            lm_bench_samples_push(&v[LM_BENCH_M_S_TOTAL], server_num(r, "total_ms"));
            const double drafted = server_num(r, "spec_draft_tokens");
            if (drafted > 0) /* null or absent without speculative decoding: NAN */
                lm_bench_samples_push(&v[LM_BENCH_M_S_ACCEPT],
                                      100.0 * server_num(r, "spec_accepted_tokens") / drafted);
        }
        /* goodput */
        bool good = true;
        if (s->slo.ttft_ms > 0) good &= isfinite(r->ttft_ms) && r->ttft_ms <= s->slo.ttft_ms;
        if (s->slo.itl_ms > 0) good &= isfinite(itl_req) && itl_req <= s->slo.itl_ms;
        if (s->slo.latency_ms > 0) good &= r->latency_ms <= s->slo.latency_ms;
        s->n_good += good;
        /* the server's usage against lumen's counts */
        if (r->output_tokens >= 0 && r->tokens_counted) {
            s->out_compared++;
            if (r->output_tokens == r->own_output_tokens) {
                s->out_match++;
            } else if (r->output_tokens == r->own_output_tokens + 1 && r->finish_reason &&
                       !strcmp(r->finish_reason, "stop")) {
                s->out_eos++;
            } else {
                if (!s->out_mismatch)
                    snprintf(s->out_mismatch_example, sizeof s->out_mismatch_example,
                             "%s: usage.completion_tokens %ld, lumen counts %ld", r->request_id,
                             r->output_tokens, r->own_output_tokens);
                s->out_mismatch++;
                if ((r->content.len && memmem(r->content.p, r->content.len, "\xef\xbf\xbd", 3)) ||
                    (r->reasoning.len &&
                     memmem(r->reasoning.p, r->reasoning.len, "\xef\xbf\xbd", 3)))
                    s->out_mismatch_fffd++;
            }
        }
        if (r->input_tokens >= 0 && r->prompt_ids_sha256[0]) {
            s->in_compared++;
            if (r->input_tokens == r->own_input_tokens) {
                s->in_match++;
            } else {
                if (!s->in_mismatch)
                    snprintf(s->in_mismatch_example, sizeof s->in_mismatch_example,
                             "%s: usage.prompt_tokens %ld, rendered prompt %ld", r->request_id,
                             r->input_tokens, r->own_input_tokens);
                s->in_mismatch++;
            }
        }
        if (r->cached_tokens >= 0 && r->input_tokens >= 0) {
            s->n_cached_reported++;
            s->cached_tokens_total += r->cached_tokens;
            s->prompt_tokens_total += r->input_tokens;
        }
        if (r->draft_tokens > 0) {
            s->n_spec_reported++;
            s->draft_tokens_total += r->draft_tokens;
            s->accepted_tokens_total += r->accepted_tokens;
        }
    }
    for (int m = 0; m < LM_BENCH_M_COUNT; m++)
        lm_bench_stats_compute(v[m].v, v[m].n, &s->m[m]);
    s->window_s = run->t_end > run->t_begin ? run->t_end - run->t_begin : NAN;
    s->request_throughput = s->window_s > 0 ? (double)s->n_ok / s->window_s : NAN;
    s->output_token_throughput =
        s->window_s > 0 && s->n_ok ? s->total_output_tokens / s->window_s : NAN;
    s->goodput = s->slo_set && s->window_s > 0 ? (double)s->n_good / s->window_s : NAN;

    s->n_turn_rows = max_turn < LM_BENCH_MAX_TURN_ROWS ? max_turn : LM_BENCH_MAX_TURN_ROWS;
    for (int row = 0; row < s->n_turn_rows; row++) {
        struct lm_bench_turn_summary *t = &s->turns[row];
        bool last = row == LM_BENCH_MAX_TURN_ROWS - 1;
        t->turn = row + 1;
        struct lm_bench_samples a = {0}, b = {0}, c = {0}, d = {0}, e = {0}, f = {0};
        for (size_t i = run->n_warmup; i < run->n_records; i++) {
            const struct lm_bench_record *r = &run->records[i];
            if (!ok(r) || (last ? r->turn < t->turn : r->turn != t->turn)) continue;
            t->n_ok++;
            lm_bench_samples_push(&a, r->ttft_ms);
            lm_bench_samples_push(&b, r->ttfo_ms);
            lm_bench_samples_push(&c, lm_bench_record_itl_ms(r)); /* AIPerf's, a value a request */
            lm_bench_samples_push(&d, r->latency_ms);
            if (r->input_tokens >= 0) lm_bench_samples_push(&e, (double)r->input_tokens);
            if (r->output_tokens >= 0) lm_bench_samples_push(&f, (double)r->output_tokens);
        }
        lm_bench_stats_compute(a.v, a.n, &t->ttft_ms);
        lm_bench_stats_compute(b.v, b.n, &t->ttfo_ms);
        lm_bench_stats_compute(c.v, c.n, &t->itl_ms);
        lm_bench_stats_compute(d.v, d.n, &t->latency_ms);
        lm_bench_stats_compute(e.v, e.n, &t->isl);
        lm_bench_stats_compute(f.v, f.n, &t->osl);
        lm_bench_samples_free(&a);
        lm_bench_samples_free(&b);
        lm_bench_samples_free(&c);
        lm_bench_samples_free(&d);
        lm_bench_samples_free(&e);
        lm_bench_samples_free(&f);
    }
    turn_alone(run, s);
    for (int m = 0; m < LM_BENCH_M_COUNT; m++)
        lm_bench_samples_free(&v[m]);
}

/* ---- text ---- */

static void cell(FILE *f, int width, double v) {
    if (isfinite(v))
        fprintf(f, " %*.2f", width, v);
    else
        fprintf(f, " %*s", width, "n/a");
}

static void stats_row(FILE *f, const char *name, const struct lm_bench_stats *st) {
    fprintf(f, "%-44s", name);
    const double v[] = {st->min, st->mean, st->std, st->p50, st->p90, st->p95, st->p99, st->max};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        cell(f, 9, v[i]);
    fprintf(f, " %6zu\n", st->n);
}

static void scalar(FILE *f, const char *name, double v) {
    fprintf(f, "%-44s", name);
    cell(f, 9, v);
    fprintf(f, "\n");
}

void lm_bench_report_print(FILE *f, const struct lm_bench_run *run,
                           const struct lm_bench_summary *s) {
    const struct lm_bench_params *p = &run->params;
    fprintf(f, "lumen profile: run %s, model %s, %s\n", run->run_id, run->model, run->url);
    if (p->request_rate > 0)
        fprintf(f, "load: request rate %g/s (%s arrivals), at most %d in flight", p->request_rate,
                p->arrival == LM_BENCH_ARRIVAL_POISSON ? "poisson" : "constant",
                p->concurrency > 0 ? p->concurrency : 256);
    else
        fprintf(f, "load: concurrency %d", p->concurrency);
    fprintf(f,
            "; %zu conversations (%zu requests sent), %zu warmup requests; max_tokens %d, "
            "temperature %g%s; think time %g ms",
            run->n_conversations, s->n_requests, s->n_warmup, p->max_tokens, p->temperature,
            p->ignore_eos ? ", ignore_eos" : "", p->think_time_mean_ms);
    if (p->think_time_std_ms > 0) fprintf(f, " (std %g ms)", p->think_time_std_ms);
    if (run->limit_hit && !strcmp(run->limit_hit, "interrupted"))
        fprintf(f, "; stopped by a signal");
    else if (run->limit_hit)
        fprintf(f, "; stopped by the %s limit", run->limit_hit);
    fprintf(f, "\n\n");

    fprintf(f, "%-44s %9s %9s %9s %9s %9s %9s %9s %9s %6s\n", "Metric", "min", "avg", "std", "p50",
            "p90", "p95", "p99", "max", "n");
    for (int m = LM_BENCH_M_TTFT; m <= LM_BENCH_M_THINK; m++) {
        if (m == LM_BENCH_M_THINK && s->m[m].n == 0) continue;
        char name[80];
        snprintf(name, sizeof name, "%s (%s)", k_metrics[m].label, k_metrics[m].unit);
        stats_row(f, name, &s->m[m]);
    }
    fprintf(f, "\n");
    fprintf(f, "%-44s", "Profiling Window (s)");
    cell(f, 9, s->window_s);
    fprintf(f,
            "   first measured send -> last measured byte; throughputs include the think gaps\n");
    scalar(f, "Request Throughput (requests/s)", s->request_throughput);
    scalar(f, "Output Token Throughput (tokens/s)", s->output_token_throughput);
    if (s->slo_set) {
        char slo[160] = "";
        int n = 0;
        if (s->slo.ttft_ms > 0)
            n += snprintf(slo + n, sizeof slo - (size_t)n, " TTFT<=%gms", s->slo.ttft_ms);
        if (s->slo.itl_ms > 0)
            n += snprintf(slo + n, sizeof slo - (size_t)n, " ITL<=%gms", s->slo.itl_ms);
        if (s->slo.latency_ms > 0)
            snprintf(slo + n, sizeof slo - (size_t)n, " latency<=%gms", s->slo.latency_ms);
        fprintf(f, "%-44s", "Goodput (requests/s)");
        cell(f, 9, s->goodput);
        fprintf(f, "   %zu of %zu requests meet%s\n", s->n_good, s->n_ok, slo);
    }
    fprintf(f, "%-44s %zu ok, %zu failed, %zu skipped after a failure, %zu not sent (limit)\n",
            "Requests", s->n_ok, s->n_failed, s->n_skipped_failure, s->n_skipped_limit);
    fprintf(f, "%-44s %zu sent, %zu ok (excluded from every figure)\n", "Warmup requests",
            s->n_warmup, s->n_warmup_ok);
    fprintf(f, "%-44s", "Errors");
    if (!s->n_failed) fprintf(f, " none");
    for (int e = 1; e < LM_BENCH_ERR_COUNT; e++)
        if (s->errors[e])
            fprintf(f, " %s: %zu", lm_bench_error_name((enum lm_bench_error)e), s->errors[e]);
    fprintf(f, "\n");
    if (s->n_failed) { /* the first message of each type, so a person can act on it */
        for (int e = 1; e < LM_BENCH_ERR_COUNT; e++) {
            if (!s->errors[e]) continue;
            for (size_t i = run->n_warmup; i < run->n_records; i++) {
                const struct lm_bench_record *r = &run->records[i];
                if (r->sent && (int)r->error == e) {
                    fprintf(f, "  %s (%s): %s\n", lm_bench_error_name(r->error), r->request_id,
                            r->error_message ? r->error_message : "");
                    break;
                }
            }
        }
    }
    if (p->request_rate > 0)
        fprintf(f, "%-44s %zu arrivals waited (longest %.1f ms)\n", "Schedule", run->n_deferred,
                run->max_lag_ms);
    if (s->n_no_usage)
        fprintf(f,
                "note: %zu responses carried no usage (stream_options.include_usage); their "
                "output tokens are lumen's own count\n",
                s->n_no_usage);

    /* usage against lumen's own counts */
    if (s->out_compared)
        fprintf(f, "%-44s %zu equal, %zu one more (the stop token), %zu differ of %zu%s%s\n",
                "Output tokens: usage vs lumen's tokenizer", s->out_match, s->out_eos,
                s->out_mismatch, s->out_compared, s->out_mismatch ? "; first: " : "",
                s->out_mismatch ? s->out_mismatch_example : "");
    else
        fprintf(f, "%-44s not compared (no usage, or no tokenizer)\n",
                "Output tokens: usage vs lumen's tokenizer");
    if (s->out_mismatch)
        fprintf(
            f,
            "  (lumen re-encodes the text it received: a difference is a server that miscounts, or "
            "text that does not re-encode to the ids generated, as random weights often give; "
            "%zu of the %zu hold U+FFFD replacement characters)\n",
            s->out_mismatch_fffd, s->out_mismatch);
    if (s->in_compared)
        fprintf(f, "%-44s %zu equal, %zu differ of %zu%s%s\n",
                "Input tokens: usage vs rendered prompt", s->in_match, s->in_mismatch,
                s->in_compared, s->in_mismatch ? "; first: " : "",
                s->in_mismatch ? s->in_mismatch_example : "");
    if (s->n_cached_reported)
        fprintf(f, "%-44s %ld of %ld prompt tokens (%.1f%%) over %zu requests\n",
                "Prefix cache (usage cached_tokens)", s->cached_tokens_total,
                s->prompt_tokens_total,
                s->prompt_tokens_total
                    ? 100.0 * (double)s->cached_tokens_total / (double)s->prompt_tokens_total
                    : 0.0,
                s->n_cached_reported);
    if (s->n_spec_reported)
        fprintf(f,
                "%-44s speculative decoding reported by the server: %ld of %ld drafted tokens "
                "accepted (%.1f%%) over %zu requests\n",
                "Runtime mode", s->accepted_tokens_total, s->draft_tokens_total,
                100.0 * (double)s->accepted_tokens_total / (double)s->draft_tokens_total,
                s->n_spec_reported);
    else
        fprintf(f,
                "%-44s ordinary generation (the server reported no speculative-decoding "
                "counters; acceptance: unavailable)\n",
                "Runtime mode");

    if (s->server_side) {
        fprintf(f, "\nServer-side time (from the server's records; not mixed with the client's "
                   "figures)\n");
        for (int m = LM_BENCH_M_S_QUEUE; m <= LM_BENCH_M_S_ACCEPT; m++) {
            if (m == LM_BENCH_M_S_ACCEPT && s->m[m].n == 0) continue; /* no drafts */
            char name[80];
            snprintf(name, sizeof name, "%s (%s)", k_metrics[m].label, k_metrics[m].unit);
            stats_row(f, name, &s->m[m]);
        }
        stats_row(f, "Client Request Latency (ms), for reference", &s->m[LM_BENCH_M_LATENCY]);
    }

    fprintf(f, "\n%-10s %8s %9s %9s %9s %9s %9s %9s %9s %9s %11s\n", "Per turn", "requests",
            "TTFT p50", "TTFT p95", "TTFO p50", "ITL p50", "ITL p95", "Lat p50", "Lat p95",
            "ISL p50", "tok/s alone");
    for (int i = 0; i < s->n_turn_rows; i++) {
        const struct lm_bench_turn_summary *t = &s->turns[i];
        char name[32];
        bool folded = i == LM_BENCH_MAX_TURN_ROWS - 1;
        snprintf(name, sizeof name, folded ? "turn %d+" : "turn %d", t->turn);
        fprintf(f, "%-10s %8zu", name, t->n_ok);
        cell(f, 9, t->ttft_ms.p50);
        cell(f, 9, t->ttft_ms.p95);
        cell(f, 9, t->ttfo_ms.p50);
        cell(f, 9, t->itl_ms.p50);
        cell(f, 9, t->itl_ms.p95);
        cell(f, 9, t->latency_ms.p50);
        cell(f, 9, t->latency_ms.p95);
        cell(f, 9, t->isl.p50);
        cell(f, 11, t->output_token_throughput);
        if (t->tokens > 0 && t->alone_s > 0)
            fprintf(f, "  (alone %.2f s, %.0f%% of its tokens)", t->alone_s,
                    100.0 * t->alone_tokens / t->tokens);
        fprintf(f, "\n");
    }
    fprintf(
        f,
        "tok/s alone: the turn's output tokens that arrived while only that turn's requests were "
        "in flight, over that time.\n"
        "ITL per token divides each chunk's gap by its token count (lumen's tokenizer); ITL per "
        "request is AIPerf's (latency - TTFT) / (output tokens - 1). Percentiles interpolate "
        "linearly (numpy's default); std is the population std.\n");
}

/* ---- JSON and CSV ---- */

static json_t *num_or_null(double v) {
    return isfinite(v) ? json_real(v) : json_null();
}
static json_t *int_or_null(long v) {
    return v >= 0 ? json_integer(v) : json_null();
}

static json_t *stats_json(const struct lm_bench_stats *st, const char *unit) {
    return json_pack("{s:s,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:I}", "unit", unit, "avg",
                     num_or_null(st->mean), "min", num_or_null(st->min), "max",
                     num_or_null(st->max), "std", num_or_null(st->std), "p50", num_or_null(st->p50),
                     "p90", num_or_null(st->p90), "p95", num_or_null(st->p95), "p99",
                     num_or_null(st->p99), "count", (json_int_t)st->n);
}

json_t *lm_bench_summary_json(const struct lm_bench_run *run, const struct lm_bench_summary *s) {
    json_t *o = json_object();
    json_object_set_new(o, "run_id", json_string(run->run_id));
    json_object_set_new(o, "model", json_string(run->model ? run->model : ""));
    json_object_set_new(o, "url", json_string(run->url ? run->url : ""));
    json_t *m = json_object();
    for (int i = 0; i < LM_BENCH_M_COUNT; i++) {
        if (i >= LM_BENCH_M_S_QUEUE && !s->server_side) continue;
        json_object_set_new(m, k_metrics[i].tag, stats_json(&s->m[i], k_metrics[i].unit));
    }
    json_object_set_new(o, "metrics", m);
    json_object_set_new(o, "benchmark_duration_s", num_or_null(s->window_s));
    json_object_set_new(o, "request_throughput", num_or_null(s->request_throughput));
    json_object_set_new(o, "output_token_throughput", num_or_null(s->output_token_throughput));
    json_object_set_new(o, "total_output_tokens", json_real(s->total_output_tokens));
    /* the scalars' units (the metrics carry theirs in their own objects) */
    json_object_set_new(o, "units",
                        json_pack("{s:s,s:s,s:s,s:s,s:s}", "benchmark_duration_s", "s", "request_throughput",
                                  "requests/s", "output_token_throughput", "tokens/s", "goodput",
                                  "requests/s", "total_output_tokens", "tokens"));
    json_object_set_new(o, "request_count", json_integer((json_int_t)s->n_ok));
    json_object_set_new(o, "error_request_count", json_integer((json_int_t)s->n_failed));
    json_object_set_new(o, "requests_sent", json_integer((json_int_t)s->n_requests));
    json_object_set_new(o, "skipped_after_failure", json_integer((json_int_t)s->n_skipped_failure));
    json_object_set_new(o, "skipped_by_limit", json_integer((json_int_t)s->n_skipped_limit));
    json_object_set_new(o, "warmup_requests", json_integer((json_int_t)s->n_warmup));
    json_object_set_new(o, "warmup_ok", json_integer((json_int_t)s->n_warmup_ok));
    json_object_set_new(o, "conversations", json_integer((json_int_t)run->n_conversations));
    json_object_set_new(o, "limit_hit", run->limit_hit ? json_string(run->limit_hit) : json_null());
    if (s->slo_set) {
        json_object_set_new(o, "goodput", num_or_null(s->goodput));
        json_object_set_new(o, "good_request_count", json_integer((json_int_t)s->n_good));
        json_object_set_new(
            o, "slo",
            json_pack("{s:o,s:o,s:o}", "time_to_first_token_ms",
                      num_or_null(s->slo.ttft_ms > 0 ? s->slo.ttft_ms : NAN),
                      "inter_token_latency_ms",
                      num_or_null(s->slo.itl_ms > 0 ? s->slo.itl_ms : NAN), "request_latency_ms",
                      num_or_null(s->slo.latency_ms > 0 ? s->slo.latency_ms : NAN)));
    }
    json_t *errs = json_object();
    for (int e = 1; e < LM_BENCH_ERR_COUNT; e++)
        if (s->errors[e])
            json_object_set_new(errs, lm_bench_error_name((enum lm_bench_error)e),
                                json_integer((json_int_t)s->errors[e]));
    json_object_set_new(o, "errors", errs);
    json_object_set_new(
        o, "usage_check",
        json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "output_compared", (json_int_t)s->out_compared,
                  "output_equal", (json_int_t)s->out_match, "output_plus_stop_token",
                  (json_int_t)s->out_eos, "output_mismatch", (json_int_t)s->out_mismatch,
                  "input_compared", (json_int_t)s->in_compared, "input_equal",
                  (json_int_t)s->in_match, "input_mismatch", (json_int_t)s->in_mismatch));
    json_object_set_new(json_object_get(o, "usage_check"), "output_mismatch_with_replacement_chars",
                        json_integer((json_int_t)s->out_mismatch_fffd));
    if (s->n_cached_reported)
        json_object_set_new(o, "prefix_cache",
                            json_pack("{s:I,s:I,s:I}", "requests", (json_int_t)s->n_cached_reported,
                                      "cached_tokens", (json_int_t)s->cached_tokens_total,
                                      "prompt_tokens", (json_int_t)s->prompt_tokens_total));
    json_t *spec = json_object();
    if (s->n_spec_reported) {
        json_object_set_new(spec, "mode", json_string("speculative"));
        json_object_set_new(spec, "draft_tokens", json_integer(s->draft_tokens_total));
        json_object_set_new(spec, "accepted_tokens", json_integer(s->accepted_tokens_total));
        json_object_set_new(
            spec, "acceptance_rate",
            json_real((double)s->accepted_tokens_total / (double)s->draft_tokens_total));
    } else {
        json_object_set_new(spec, "mode", json_string("ordinary"));
        json_object_set_new(spec, "acceptance_rate", json_string("unavailable"));
    }
    json_object_set_new(o, "speculative", spec);
    json_t *turns = json_array();
    for (int i = 0; i < s->n_turn_rows; i++) {
        const struct lm_bench_turn_summary *t = &s->turns[i];
        json_t *row = json_object();
        json_object_set_new(row, "turn", json_integer(t->turn));
        json_object_set_new(row, "folded", json_boolean(i == LM_BENCH_MAX_TURN_ROWS - 1));
        json_object_set_new(row, "request_count", json_integer((json_int_t)t->n_ok));
        json_object_set_new(row, "time_to_first_token", stats_json(&t->ttft_ms, "ms"));
        json_object_set_new(row, "time_to_first_output_token", stats_json(&t->ttfo_ms, "ms"));
        json_object_set_new(row, "inter_token_latency", stats_json(&t->itl_ms, "ms"));
        json_object_set_new(row, "request_latency", stats_json(&t->latency_ms, "ms"));
        json_object_set_new(row, "input_sequence_length", stats_json(&t->isl, "tokens"));
        json_object_set_new(row, "output_sequence_length", stats_json(&t->osl, "tokens"));
        json_object_set_new(row, "alone_s", json_real(t->alone_s));
        json_object_set_new(row, "alone_tokens", json_real(t->alone_tokens));
        json_object_set_new(row, "tokens", json_real(t->tokens));
        json_object_set_new(row, "output_token_throughput_alone",
                            num_or_null(t->output_token_throughput));
        json_array_append_new(turns, row);
    }
    json_object_set_new(o, "per_turn", turns);
    return o;
}

static void csv_num(FILE *f, double v) {
    if (isfinite(v))
        fprintf(f, ",%.6g", v);
    else
        fprintf(f, ",");
}

lm_status lm_bench_write_summary_csv(const char *path, const struct lm_bench_run *run,
                                     const struct lm_bench_summary *s) {
    FILE *f = fopen(path, "w");
    if (!f) return lm_errorf(LM_ERR_IO, "%s: cannot create: %m", path);
    fprintf(f, "metric,unit,avg,min,max,std,p50,p90,p95,p99,count\n");
    for (int i = 0; i < LM_BENCH_M_COUNT; i++) {
        if (i >= LM_BENCH_M_S_QUEUE && !s->server_side) continue;
        const struct lm_bench_stats *st = &s->m[i];
        fprintf(f, "%s,%s", k_metrics[i].tag, k_metrics[i].unit);
        csv_num(f, st->mean);
        csv_num(f, st->min);
        csv_num(f, st->max);
        csv_num(f, st->std);
        csv_num(f, st->p50);
        csv_num(f, st->p90);
        csv_num(f, st->p95);
        csv_num(f, st->p99);
        fprintf(f, ",%zu\n", st->n);
    }
    fprintf(f, "\nmetric,unit,value\n");
    fprintf(f, "benchmark_duration_s,s");
    csv_num(f, s->window_s);
    fprintf(f, "\nrequest_throughput,requests/s");
    csv_num(f, s->request_throughput);
    fprintf(f, "\noutput_token_throughput,tokens/s");
    csv_num(f, s->output_token_throughput);
    if (s->slo_set) {
        fprintf(f, "\ngoodput,requests/s");
        csv_num(f, s->goodput);
    }
    fprintf(f, "\nrequest_count,requests,%zu\nerror_request_count,requests,%zu\nwarmup_requests,requests,%zu\n",
            s->n_ok, s->n_failed, s->n_warmup);
    fprintf(f, "\nturn,request_count,ttft_p50,ttft_p95,ttfo_p50,itl_p50,itl_p95,latency_p50,"
               "latency_p95,isl_p50,alone_s,output_token_throughput_alone\n");
    for (int i = 0; i < s->n_turn_rows; i++) {
        const struct lm_bench_turn_summary *t = &s->turns[i];
        fprintf(f, "%d%s,%zu", t->turn, i == LM_BENCH_MAX_TURN_ROWS - 1 ? "+" : "", t->n_ok);
        csv_num(f, t->ttft_ms.p50);
        csv_num(f, t->ttft_ms.p95);
        csv_num(f, t->ttfo_ms.p50);
        csv_num(f, t->itl_ms.p50);
        csv_num(f, t->itl_ms.p95);
        csv_num(f, t->latency_ms.p50);
        csv_num(f, t->latency_ms.p95);
        csv_num(f, t->isl.p50);
        csv_num(f, t->alone_s);
        csv_num(f, t->output_token_throughput);
        fprintf(f, "\n");
    }
    (void)run;
    if (fclose(f)) return lm_errorf(LM_ERR_IO, "%s: write failed: %m", path);
    return LM_OK;
}

lm_status lm_bench_write_jsonl(const char *path, const struct lm_bench_run *run) {
    FILE *f = fopen(path, "w");
    if (!f) return lm_errorf(LM_ERR_IO, "%s: cannot create: %m", path);
    for (size_t i = 0; i < run->n_records; i++) {
        const struct lm_bench_record *r = &run->records[i];
        json_t *o = json_object();
        json_object_set_new(
            o, "phase", json_string(r->phase == LM_BENCH_PHASE_WARMUP ? "warmup" : "profiling"));
        json_object_set_new(o, "conversation_id",
                            json_string(r->conversation_id ? r->conversation_id : ""));
        json_object_set_new(o, "conversation_index", json_integer((json_int_t)r->conversation));
        json_object_set_new(o, "dataset_id", json_string(r->dataset_id ? r->dataset_id : ""));
        json_object_set_new(o, "category", r->category ? json_string(r->category) : json_null());
        json_object_set_new(o, "turn", json_integer(r->turn));
        json_object_set_new(o, "turns", json_integer(r->n_turns));
        json_object_set_new(o, "request_id", json_string(r->request_id ? r->request_id : ""));
        json_object_set_new(o, "sent", json_boolean(r->sent));
        json_object_set_new(o, "skip_reason",
                            r->sent ? json_null() : json_string(lm_bench_skip_name(r->skip)));
        if (!r->sent) {
            char *line = json_dumps(o, JSON_COMPACT);
            json_decref(o);
            if (line) fprintf(f, "%s\n", line);
            free(line);
            continue;
        }
        json_t *itl = json_array(), *times = json_array(), *tokens = NULL;
        struct lm_bench_samples is = {0};
        lm_bench_record_itl_samples(r, &is);
        for (size_t k = 0; k < is.n; k++)
            json_array_append_new(itl, json_real(is.v[k]));
        lm_bench_samples_free(&is);
        for (size_t c = 0; c < r->n_chunks; c++)
            json_array_append_new(times, json_real(r->chunks[c].t_ms));
        if (r->tokens_counted) {
            tokens = json_array();
            for (size_t c = 0; c < r->n_chunks; c++)
                json_array_append_new(tokens, json_integer(r->chunks[c].tokens));
        }
        json_object_set_new(o, "start_time", json_real(r->start_unix));
        json_object_set_new(o, "scheduled_offset_ms",
                            r->t_scheduled > 0 ? json_real((r->t_send - r->t_scheduled) * 1e3)
                                               : json_null());
        json_object_set_new(o, "think_time_ms", num_or_null(r->think_ms));
        json_object_set_new(o, "think_time_planned_ms", json_real(r->think_planned_ms));
        json_object_set_new(o, "ttft_ms", num_or_null(r->ttft_ms));
        json_object_set_new(o, "ttst_ms", num_or_null(lm_bench_record_ttst_ms(r)));
        json_object_set_new(o, "ttfo_ms", num_or_null(r->ttfo_ms));
        json_object_set_new(o, "request_latency_ms", num_or_null(r->latency_ms));
        json_object_set_new(o, "inter_token_latency_ms", num_or_null(lm_bench_record_itl_ms(r)));
        json_object_set_new(o, "itl_ms", itl);
        json_object_set_new(o, "chunk_times_ms", times);
        if (tokens) json_object_set_new(o, "chunk_tokens", tokens);
        json_object_set_new(o, "output_tokens", int_or_null(r->output_tokens));
        json_object_set_new(o, "input_tokens", int_or_null(r->input_tokens));
        json_object_set_new(o, "cached_tokens", int_or_null(r->cached_tokens));
        json_object_set_new(o, "reasoning_tokens", int_or_null(r->reasoning_tokens));
        json_object_set_new(o, "own_output_tokens",
                            r->tokens_counted ? json_integer(r->own_output_tokens) : json_null());
        json_object_set_new(o, "own_input_tokens",
                            r->prompt_ids_sha256[0] ? json_integer(r->own_input_tokens)
                                                    : json_null());
        json_object_set_new(o, "prompt_ids_sha256",
                            r->prompt_ids_sha256[0] ? json_string(r->prompt_ids_sha256)
                                                    : json_null());
        if (r->draft_tokens > 0) {
            json_object_set_new(o, "draft_tokens", json_integer(r->draft_tokens));
            json_object_set_new(o, "accepted_tokens", json_integer(r->accepted_tokens));
        }
        json_object_set_new(o, "max_tokens", json_integer(r->max_tokens));
        json_object_set_new(o, "http_status", json_integer(r->http_status));
        json_object_set_new(o, "error_type",
                            r->error ? json_string(lm_bench_error_name(r->error)) : json_null());
        json_object_set_new(o, "error_message",
                            r->error_message ? json_string(r->error_message) : json_null());
        json_object_set_new(o, "finish_reason",
                            r->finish_reason ? json_string(r->finish_reason) : json_null());
        json_object_set_new(o, "server_id", r->server_id ? json_string(r->server_id) : json_null());
        json_object_set_new(o, "echoed_request_id",
                            r->echoed_request_id ? json_string(r->echoed_request_id) : json_null());
        json_object_set(o, "messages", r->messages ? r->messages : json_null());
        json_object_set_new(o, "response_text",
                            json_stringn(r->content.p ? r->content.p : "", r->content.len));
        json_object_set_new(o, "reasoning_text",
                            json_stringn(r->reasoning.p ? r->reasoning.p : "", r->reasoning.len));
        if (r->server_record) json_object_set(o, "server_record", r->server_record);
        if (r->issues) json_object_set(o, "verification_issues", r->issues);
        char *line = json_dumps(o, JSON_COMPACT);
        json_decref(o);
        if (!line) {
            fclose(f);
            return lm_errorf(LM_ERR_IO, "%s: record %zu cannot be encoded as JSON", path, i);
        }
        fputs(line, f);
        fputc('\n', f);
        free(line);
    }
    if (fclose(f)) return lm_errorf(LM_ERR_IO, "%s: write failed: %m", path);
    return LM_OK;
}
