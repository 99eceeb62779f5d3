/* report.c: see report.h. */
#include "bench/report.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"

static bool ok(const struct lm_bench_record *r) {
    return r->phase == LM_BENCH_PHASE_PROFILING && r->sent && !r->error;
}

void lm_bench_summarize(const struct lm_bench_run *run, struct lm_bench_summary *s) {
    memset(s, 0, sizeof *s);
    struct lm_bench_samples ttft = {0}, itl = {0}, gap = {0}, lat = {0}, osl = {0}, isl = {0};
    int max_turn = 0;
    double out_tokens = 0;
    for (size_t i = run->n_warmup; i < run->n_records; i++) {
        const struct lm_bench_record *r = &run->records[i];
        if (!r->sent) {
            s->n_skipped++;
            continue;
        }
        s->n_requests++;
        if (r->error) {
            s->n_failed++;
            s->errors[r->error]++;
            continue;
        }
        s->n_ok++;
        if (r->turn > max_turn) max_turn = r->turn;
        lm_bench_samples_push(&ttft, r->ttft_ms);
        lm_bench_samples_push(&itl, lm_bench_record_itl_ms(r));
        lm_bench_samples_push(&lat, r->latency_ms);
        for (size_t c = 1; c < r->n_chunks; c++) {
            lm_bench_samples_push(&gap, lm_bench_record_chunk_gap_ms(r, c));
            if (r->chunks[c].tokens > 0) s->tokens_counted = true;
        }
        if (r->output_tokens >= 0) {
            lm_bench_samples_push(&osl, (double)r->output_tokens);
            out_tokens += (double)r->output_tokens;
        } else {
            s->n_no_usage++;
        }
        if (r->input_tokens >= 0) lm_bench_samples_push(&isl, (double)r->input_tokens);
    }
    lm_bench_stats_compute(ttft.v, ttft.n, &s->ttft_ms);
    lm_bench_stats_compute(itl.v, itl.n, &s->itl_ms);
    lm_bench_stats_compute(gap.v, gap.n, &s->chunk_gap_ms);
    lm_bench_stats_compute(lat.v, lat.n, &s->latency_ms);
    lm_bench_stats_compute(osl.v, osl.n, &s->output_tokens);
    lm_bench_stats_compute(isl.v, isl.n, &s->input_tokens);
    s->window_s = run->t_end > run->t_begin ? run->t_end - run->t_begin : NAN;
    s->request_throughput = s->window_s > 0 ? (double)s->n_ok / s->window_s : NAN;
    s->output_token_throughput = s->window_s > 0 && osl.n ? out_tokens / s->window_s : NAN;

    s->n_turn_rows = max_turn < LM_BENCH_MAX_TURN_ROWS ? max_turn : LM_BENCH_MAX_TURN_ROWS;
    for (int row = 0; row < s->n_turn_rows; row++) {
        struct lm_bench_turn_summary *t = &s->turns[row];
        bool last = row == LM_BENCH_MAX_TURN_ROWS - 1;
        t->turn = row + 1;
        ttft.n = itl.n = lat.n = 0;
        for (size_t i = run->n_warmup; i < run->n_records; i++) {
            const struct lm_bench_record *r = &run->records[i];
            if (!ok(r) || (last ? r->turn < t->turn : r->turn != t->turn)) continue;
            t->n_ok++;
            lm_bench_samples_push(&ttft, r->ttft_ms);
            lm_bench_samples_push(&itl, lm_bench_record_itl_ms(r));
            lm_bench_samples_push(&lat, r->latency_ms);
        }
        lm_bench_stats_compute(ttft.v, ttft.n, &t->ttft_ms);
        lm_bench_stats_compute(itl.v, itl.n, &t->itl_ms);
        lm_bench_stats_compute(lat.v, lat.n, &t->latency_ms);
    }
    lm_bench_samples_free(&ttft);
    lm_bench_samples_free(&itl);
    lm_bench_samples_free(&gap);
    lm_bench_samples_free(&lat);
    lm_bench_samples_free(&osl);
    lm_bench_samples_free(&isl);
}

static void cell(FILE *f, int width, double v) {
    if (isfinite(v))
        fprintf(f, " %*.2f", width, v);
    else
        fprintf(f, " %*s", width, "n/a");
}

static void stats_row(FILE *f, const char *name, const struct lm_bench_stats *st) {
    fprintf(f, "%-34s", name);
    const double v[] = {st->min, st->mean, st->p50, st->p90, st->p95, st->p99, st->max};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) cell(f, 10, v[i]);
    fprintf(f, " %6zu\n", st->n);
}

void lm_bench_report_print(FILE *f, const struct lm_bench_run *run, const struct lm_bench_summary *s) {
    const struct lm_bench_params *p = &run->params;
    fprintf(f, "lumen profile: run %s, model %s, %s\n", run->run_id, run->model, run->url);
    fprintf(f,
            "%zu conversations (%zu requests), concurrency %d, %zu warmup requests, max_tokens %d, "
            "temperature %g%s, think time %g ms",
            run->n_conversations, s->n_requests + s->n_skipped, p->concurrency, run->n_warmup,
            p->max_tokens, p->temperature, p->ignore_eos ? ", ignore_eos" : "",
            p->think_time_mean_ms);
    if (p->think_time_std_ms > 0) fprintf(f, " (std %g ms)", p->think_time_std_ms);
    fprintf(f, "\n\n");

    fprintf(f, "%-34s %10s %10s %10s %10s %10s %10s %10s %6s\n", "Metric", "min", "mean", "p50",
            "p90", "p95", "p99", "max", "n");
    stats_row(f, "Time to First Token (ms)", &s->ttft_ms);
    stats_row(f, "Inter Token Latency (ms)", &s->itl_ms);
    stats_row(f, s->tokens_counted ? "Inter Chunk Latency per token (ms)" : "Inter Chunk Latency (ms)",
              &s->chunk_gap_ms);
    stats_row(f, "Request Latency (ms)", &s->latency_ms);
    stats_row(f, "Output Sequence Length (tokens)", &s->output_tokens);
    stats_row(f, "Input Sequence Length (tokens)", &s->input_tokens);
    fprintf(f, "\n");
    fprintf(f, "%-34s", "Profiling Window (s)");
    cell(f, 10, s->window_s);
    fprintf(f, "\n%-34s", "Request Throughput (requests/s)");
    cell(f, 10, s->request_throughput);
    fprintf(f, "\n%-34s", "Output Token Throughput (tokens/s)");
    cell(f, 10, s->output_token_throughput);
    fprintf(f, "\n%-34s %zu ok, %zu failed, %zu skipped\n", "Requests", s->n_ok, s->n_failed,
            s->n_skipped);
    fprintf(f, "%-34s", "Errors");
    if (!s->n_failed) fprintf(f, " none");
    for (int e = 1; e < LM_BENCH_ERR_COUNT; e++)
        if (s->errors[e]) fprintf(f, " %s: %zu", lm_bench_error_name((enum lm_bench_error)e), s->errors[e]);
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
    if (s->n_no_usage)
        fprintf(f, "note: %zu responses carried no usage (stream_options.include_usage); their "
                   "output tokens are unknown (give --tokenizer to count them)\n",
                s->n_no_usage);

    fprintf(f, "\n%-14s %8s %10s %10s %10s %10s %12s %12s\n", "Per turn (ms)", "requests",
            "TTFT p50", "TTFT p95", "ITL p50", "ITL p95", "Latency p50", "Latency p95");
    for (int i = 0; i < s->n_turn_rows; i++) {
        const struct lm_bench_turn_summary *t = &s->turns[i];
        char name[32];
        bool folded = i == LM_BENCH_MAX_TURN_ROWS - 1;
        snprintf(name, sizeof name, folded ? "turn %d+" : "turn %d", t->turn);
        fprintf(f, "%-14s %8zu", name, t->n_ok);
        cell(f, 10, t->ttft_ms.p50);
        cell(f, 10, t->ttft_ms.p95);
        cell(f, 10, t->itl_ms.p50);
        cell(f, 10, t->itl_ms.p95);
        cell(f, 12, t->latency_ms.p50);
        cell(f, 12, t->latency_ms.p95);
        fprintf(f, "\n");
    }
    fprintf(f,
            "Per-turn throughput is not reported: each turn's requests are spread over the whole "
            "window and overlap the other turns'.\n"
            "ITL = (request latency - TTFT) / (output tokens - 1) per request, as AIPerf defines "
            "it. Percentiles interpolate linearly (numpy's default).\n");
}

static json_t *num_or_null(double v) { return isfinite(v) ? json_real(v) : json_null(); }
static json_t *int_or_null(long v) { return v >= 0 ? json_integer(v) : json_null(); }

lm_status lm_bench_write_jsonl(const char *path, const struct lm_bench_run *run) {
    FILE *f = fopen(path, "w");
    if (!f) return lm_errorf(LM_ERR_IO, "%s: cannot create: %m", path);
    for (size_t i = 0; i < run->n_records; i++) {
        const struct lm_bench_record *r = &run->records[i];
        if (!r->sent) continue;
        json_t *gaps = json_array(), *times = json_array(), *tokens = NULL;
        for (size_t c = 0; c < r->n_chunks; c++) {
            json_array_append_new(times, json_real(r->chunks[c].t_ms));
            if (c) json_array_append_new(gaps, json_real(lm_bench_record_chunk_gap_ms(r, c)));
            if (r->chunks[c].tokens > 0) {
                if (!tokens) tokens = json_array();
            }
        }
        if (tokens)
            for (size_t c = 0; c < r->n_chunks; c++)
                json_array_append_new(tokens, json_integer(r->chunks[c].tokens));
        json_t *o = json_object();
        json_object_set_new(o, "phase", json_string(r->phase == LM_BENCH_PHASE_WARMUP ? "warmup"
                                                                                    : "profiling"));
        json_object_set_new(o, "conversation_id", json_string(r->conversation_id));
        json_object_set_new(o, "conversation_index", json_integer((json_int_t)r->conversation));
        json_object_set_new(o, "dataset_id", json_string(r->dataset_id));
        json_object_set_new(o, "turn", json_integer(r->turn));
        json_object_set_new(o, "request_id", json_string(r->request_id));
        json_object_set_new(o, "start_time", json_real(r->start_unix));
        json_object_set_new(o, "ttft_ms", num_or_null(r->ttft_ms));
        json_object_set_new(o, "request_latency_ms", num_or_null(r->latency_ms));
        json_object_set_new(o, "inter_token_latency_ms", num_or_null(lm_bench_record_itl_ms(r)));
        json_object_set_new(o, "itl_ms", gaps);
        json_object_set_new(o, "chunk_times_ms", times);
        if (tokens) json_object_set_new(o, "chunk_tokens", tokens);
        json_object_set_new(o, "output_tokens", int_or_null(r->output_tokens));
        json_object_set_new(o, "input_tokens", int_or_null(r->input_tokens));
        json_object_set_new(o, "http_status", json_integer(r->http_status));
        json_object_set_new(o, "error_type", r->error ? json_string(lm_bench_error_name(r->error))
                                                      : json_null());
        json_object_set_new(o, "error_message",
                            r->error_message ? json_string(r->error_message) : json_null());
        json_object_set_new(o, "finish_reason",
                            r->finish_reason ? json_string(r->finish_reason) : json_null());
        json_object_set(o, "messages", r->messages ? r->messages : json_null());
        json_object_set_new(o, "response_text",
                            json_stringn(r->content.p ? r->content.p : "", r->content.len));
        json_object_set_new(o, "reasoning_text",
                            json_stringn(r->reasoning.p ? r->reasoning.p : "", r->reasoning.len));
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
