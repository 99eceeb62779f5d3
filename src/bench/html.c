/* html.c: see html.h. */
#include "bench/html.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/file.h"
#include "bench/stats.h"

static const char *const k_colors[] = {"#4e79a7", "#f28e2b", "#e15759",
                                       "#59a14f", "#b07aa1", "#76b7b2"};

static void esc(struct lm_buf *b, const char *s) {
    for (; s && *s; s++) {
        switch (*s) {
        case '<': lm_buf_puts(b, "&lt;"); break;
        case '>': lm_buf_puts(b, "&gt;"); break;
        case '&': lm_buf_puts(b, "&amp;"); break;
        case '"': lm_buf_puts(b, "&quot;"); break;
        default: lm_buf_putc(b, *s);
        }
    }
}

static void num(struct lm_buf *b, double v) {
    if (!isfinite(v))
        lm_buf_puts(b, "n/a");
    else if (fabs(v) >= 1000)
        lm_buf_printf(b, "%.0f", v);
    else if (fabs(v) >= 10)
        lm_buf_printf(b, "%.1f", v);
    else
        lm_buf_printf(b, "%.3g", v);
}

/* ---- charts ---- */

struct chart {
    struct lm_buf *b;
    int w, h, ml, mr, mt, mb;
    double x0, x1, y0, y1;
};

static double cx(const struct chart *c, double x) {
    return c->ml + (x - c->x0) / (c->x1 - c->x0) * (c->w - c->ml - c->mr);
}
static double cy(const struct chart *c, double y) {
    return c->h - c->mb - (y - c->y0) / (c->y1 - c->y0) * (c->h - c->mt - c->mb);
}

/* A "nice" tick step for ~n ticks over [lo, hi]. */
static double tick_step(double lo, double hi, int n) {
    double range = hi - lo;
    if (!(range > 0)) return 1;
    double raw = range / n, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
}

static void tick_label(struct lm_buf *b, double v, double step) {
    if (step >= 1 || v == 0)
        lm_buf_printf(b, "%.0f", v);
    else if (step >= 0.1)
        lm_buf_printf(b, "%.1f", v);
    else if (step >= 0.01)
        lm_buf_printf(b, "%.2f", v);
    else
        lm_buf_printf(b, "%.3g", v);
}

/* Sets the ranges (rounded out to ticks) and draws the frame, grid, ticks and labels. */
static void chart_begin_x(struct chart *c, struct lm_buf *b, const char *title, const char *xlabel,
                          const char *ylabel, double x0, double x1, double y0, double y1,
                          bool xticks) {
    c->b = b;
    c->w = 560, c->h = 300, c->ml = 64, c->mr = 16, c->mt = 40, c->mb = 46;
    if (!(x1 > x0)) x1 = x0 + 1;
    if (!(y1 > y0)) y1 = y0 + 1;
    double xs = tick_step(x0, x1, 6), ys = tick_step(y0, y1, 5);
    c->x0 = floor(x0 / xs) * xs, c->x1 = ceil(x1 / xs) * xs;
    c->y0 = floor(y0 / ys) * ys, c->y1 = ceil(y1 / ys) * ys;
    lm_buf_printf(
        b,
        "<svg class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" "
        "height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"11\">\n",
        c->w, c->h, c->w, c->h);
    lm_buf_puts(b, "<text x=\"8\" y=\"16\" font-size=\"13\" font-weight=\"bold\">");
    esc(b, title);
    lm_buf_puts(b, "</text>\n");
    for (double y = c->y0; y <= c->y1 + ys * 1e-6; y += ys) {
        lm_buf_printf(b, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#e3e3e3\"/>",
                      c->ml, c->w - c->mr, cy(c, y), cy(c, y));
        lm_buf_printf(b, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">", c->ml - 4, cy(c, y) + 4);
        tick_label(b, y, ys);
        lm_buf_puts(b, "</text>\n");
    }
    for (double x = c->x0; xticks && x <= c->x1 + xs * 1e-6; x += xs) {
        lm_buf_printf(b, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" stroke=\"#999\"/>",
                      cx(c, x), cx(c, x), c->h - c->mb, c->h - c->mb + 4);
        lm_buf_printf(b, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">", cx(c, x),
                      c->h - c->mb + 16);
        tick_label(b, x, xs);
        lm_buf_puts(b, "</text>\n");
    }
    lm_buf_printf(
        b, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#999\"/>\n",
        c->ml, c->mt, c->w - c->ml - c->mr, c->h - c->mt - c->mb);
    lm_buf_printf(b, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">",
                  (c->ml + c->w - c->mr) / 2.0, c->h - 8);
    esc(b, xlabel);
    lm_buf_printf(
        b, "</text>\n<text transform=\"translate(14,%.1f) rotate(-90)\" text-anchor=\"middle\">",
        (c->mt + c->h - c->mb) / 2.0);
    esc(b, ylabel);
    lm_buf_puts(b, "</text>\n");
}

static void chart_begin(struct chart *c, struct lm_buf *b, const char *title, const char *xlabel,
                        const char *ylabel, double x0, double x1, double y0, double y1) {
    chart_begin_x(c, b, title, xlabel, ylabel, x0, x1, y0, y1, true);
}

static void chart_end(struct chart *c) {
    lm_buf_puts(c->b, "</svg>\n");
}

/* Legend entries in a row above the plot area. */
static void legend(struct chart *c, int i, const char *name, const char *color) {
    double x = c->ml + 130 * i, y = 32;
    lm_buf_printf(c->b,
                  "<rect x=\"%.1f\" y=\"%.1f\" width=\"10\" height=\"10\" fill=\"%s\"/>"
                  "<text x=\"%.1f\" y=\"%.1f\">",
                  x, y - 9, color, x + 14, y);
    esc(c->b, name);
    lm_buf_puts(c->b, "</text>\n");
}

static void vline(struct chart *c, double x, const char *color, const char *label) {
    if (!isfinite(x)) return;
    lm_buf_printf(c->b,
                  "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" stroke=\"%s\" "
                  "stroke-dasharray=\"4,3\"/><text x=\"%.1f\" y=\"%d\" fill=\"%s\">%s</text>\n",
                  cx(c, x), cx(c, x), c->mt, c->h - c->mb, color, cx(c, x) + 3, c->mt + 12, color,
                  label);
}

/* A histogram of v[0..n) with p50 and p95 marks. */
static void histogram(struct lm_buf *b, const char *title, const char *xlabel, const double *v,
                      size_t n, const struct lm_bench_stats *st, const char *color) {
    if (st->n == 0) {
        lm_buf_puts(b, "<p class=\"na\">");
        esc(b, title);
        lm_buf_puts(b, ": no samples</p>\n");
        return;
    }
    int nb = (int)ceil(sqrt((double)st->n));
    if (nb < 5) nb = 5;
    if (nb > 30) nb = 30;
    double lo = st->min, hi = st->max;
    if (hi - lo < 1e-9) lo -= 0.5, hi += 0.5;
    double width = (hi - lo) / nb;
    size_t *cnt = calloc((size_t)nb, sizeof *cnt);
    if (!cnt) abort();
    size_t top = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(v[i])) continue;
        int k = (int)((v[i] - lo) / width);
        if (k >= nb) k = nb - 1;
        if (k < 0) k = 0;
        if (++cnt[k] > top) top = cnt[k];
    }
    struct chart c;
    chart_begin(&c, b, title, xlabel, "requests", lo, hi, 0, (double)top);
    for (int k = 0; k < nb; k++) {
        if (!cnt[k]) continue;
        double x0 = cx(&c, lo + k * width), x1 = cx(&c, lo + (k + 1) * width);
        lm_buf_printf(b,
                      "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\">"
                      "<title>%.4g..%.4g: %zu</title></rect>\n",
                      x0 + 0.5, cy(&c, (double)cnt[k]), x1 - x0 - 1 > 1 ? x1 - x0 - 1 : 1,
                      cy(&c, 0) - cy(&c, (double)cnt[k]), color, lo + k * width,
                      lo + (k + 1) * width, cnt[k]);
    }
    vline(&c, st->p50, "#333", "p50");
    vline(&c, st->p95, "#c00", "p95");
    chart_end(&c);
    free(cnt);
}

static void polyline(struct chart *c, const double *x, const double *y, size_t n, const char *color,
                     bool points) {
    lm_buf_printf(c->b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"",
                  color);
    for (size_t i = 0; i < n; i++)
        if (isfinite(x[i]) && isfinite(y[i]))
            lm_buf_printf(c->b, "%.1f,%.1f ", cx(c, x[i]), cy(c, y[i]));
    lm_buf_puts(c->b, "\"/>\n");
    if (points)
        for (size_t i = 0; i < n; i++)
            if (isfinite(x[i]) && isfinite(y[i]))
                lm_buf_printf(c->b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>",
                              cx(c, x[i]), cy(c, y[i]), color);
}

static bool ok_rec(const struct lm_bench_record *r) {
    return r->phase == LM_BENCH_PHASE_PROFILING && r->sent && !r->error;
}

/* Output tokens/s and requests in flight over the profiling window. */
static void timeline(struct lm_buf *b, const struct lm_bench_run *run) {
    double t0 = run->t_begin, t1 = run->t_end;
    if (!(t1 > t0)) return;
    enum { NB = 40 };
    double w = (t1 - t0) / NB, tok[NB] = {0}, xs[NB], inflight[NB] = {0};
    for (size_t i = run->n_warmup; i < run->n_records; i++) {
        const struct lm_bench_record *r = &run->records[i];
        if (!r->sent) continue;
        /* time-weighted requests in flight per bucket */
        for (int k = 0; k < NB; k++) {
            double a = t0 + k * w, e = a + w;
            double ov = fmin(e, r->t_end) - fmax(a, r->t_send);
            if (ov > 0) inflight[k] += ov / w;
        }
        if (!ok_rec(r)) continue;
        double counted = 0;
        for (size_t c = 0; c < r->n_chunks; c++)
            counted += r->tokens_counted ? r->chunks[c].tokens : 1;
        double scale =
            r->output_tokens >= 0 && counted > 0 ? (double)r->output_tokens / counted : 1;
        for (size_t c = 0; c < r->n_chunks; c++) {
            double t = r->t_send + r->chunks[c].t_ms / 1e3;
            int k = (int)((t - t0) / w);
            if (k >= NB) k = NB - 1;
            if (k < 0) k = 0;
            tok[k] += (r->tokens_counted ? r->chunks[c].tokens : 1) * scale;
        }
    }
    double top = 0, itop = 0;
    for (int k = 0; k < NB; k++) {
        xs[k] = (k + 0.5) * w;
        tok[k] /= w;
        if (tok[k] > top) top = tok[k];
        if (inflight[k] > itop) itop = inflight[k];
    }
    struct chart c;
    chart_begin(&c, b, "Output token throughput over the profiling window",
                "seconds since the first measured request", "output tokens/s", 0, t1 - t0, 0, top);
    polyline(&c, xs, tok, NB, k_colors[0], false);
    chart_end(&c);
    chart_begin(&c, b, "Requests in flight (time-weighted mean per bucket)",
                "seconds since the first measured request", "requests", 0, t1 - t0, 0, itop);
    polyline(&c, xs, inflight, NB, k_colors[1], false);
    chart_end(&c);
}

/* Grouped bars: for each turn row, one bar per series (values [row][k]). */
static void turn_bars(struct lm_buf *b, const struct lm_bench_summary *s, const char *title,
                      const char *const *names, int ns,
                      double (*value)(const struct lm_bench_turn_summary *, int)) {
    double top = 0;
    for (int i = 0; i < s->n_turn_rows; i++)
        for (int k = 0; k < ns; k++) {
            double v = value(&s->turns[i], k);
            if (isfinite(v) && v > top) top = v;
        }
    struct chart c;
    chart_begin_x(&c, b, title, "turn", "ms", 0.5, s->n_turn_rows + 0.5, 0, top, false);
    c.x0 = 0.5, c.x1 = s->n_turn_rows + 0.5;
    for (int i = 0; i < s->n_turn_rows; i++)
        lm_buf_printf(b, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%d%s</text>\n",
                      cx(&c, i + 1), c.h - c.mb + 16, s->turns[i].turn,
                      i == LM_BENCH_MAX_TURN_ROWS - 1 ? "+" : "");
    double gw = (cx(&c, 1.5) - cx(&c, 0.5)) * 0.8, bw = gw / ns;
    for (int i = 0; i < s->n_turn_rows; i++) {
        double left = cx(&c, i + 1) - gw / 2;
        for (int k = 0; k < ns; k++) {
            double v = value(&s->turns[i], k);
            if (!isfinite(v)) continue;
            lm_buf_printf(b,
                          "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\">"
                          "<title>turn %d %s: %.3f ms</title></rect>\n",
                          left + k * bw, cy(&c, v), bw - 1, cy(&c, 0) - cy(&c, v), k_colors[k],
                          s->turns[i].turn, names[k], v);
        }
    }
    for (int k = 0; k < ns; k++)
        legend(&c, k, names[k], k_colors[k]);
    chart_end(&c);
}

static double ttft_series(const struct lm_bench_turn_summary *t, int k) {
    return k == 0 ? t->ttft_ms.p50 : k == 1 ? t->ttft_ms.p95 : t->ttfo_ms.p50;
}

static double latency_series(const struct lm_bench_turn_summary *t, int k) {
    return k == 0 ? t->latency_ms.p50 : t->latency_ms.p95;
}

static double itl_series(const struct lm_bench_turn_summary *t, int k) {
    return k == 0 ? t->itl_ms.p50 : t->itl_ms.p95;
}

static void per_turn_chart(struct lm_buf *b, const struct lm_bench_summary *s) {
    if (s->n_turn_rows == 0) return;
    const char *tn[] = {"TTFT p50", "TTFT p95", "TTFO p50"};
    const char *ln[] = {"latency p50", "latency p95"};
    const char *in[] = {"ITL p50", "ITL p95"};
    turn_bars(b, s, "Per turn: time to first token", tn, 3, ttft_series);
    turn_bars(b, s, "Per turn: request latency", ln, 2, latency_series);
    turn_bars(b, s, "Per turn: inter token latency (AIPerf's, a value a request)", in, 2, itl_series);
}

/* ---- tables ---- */

static void th_row(struct lm_buf *b, const char *const *cols, int n) {
    lm_buf_puts(b, "<tr>");
    for (int i = 0; i < n; i++) {
        lm_buf_puts(b, "<th>");
        esc(b, cols[i]);
        lm_buf_puts(b, "</th>");
    }
    lm_buf_puts(b, "</tr>\n");
}

static void stats_tr(struct lm_buf *b, const char *name, const char *unit,
                     const struct lm_bench_stats *st) {
    lm_buf_puts(b, "<tr><td>");
    esc(b, name);
    lm_buf_printf(b, " (%s)</td>", unit);
    double v[] = {st->min, st->mean, st->std, st->p50, st->p90, st->p95, st->p99, st->max};
    for (int i = 0; i < 8; i++) {
        lm_buf_puts(b, "<td>");
        num(b, v[i]);
        lm_buf_puts(b, "</td>");
    }
    lm_buf_printf(b, "<td>%zu</td></tr>\n", st->n);
}

static void kv(struct lm_buf *b, const char *k, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void kv(struct lm_buf *b, const char *k, const char *fmt, ...) {
    lm_buf_puts(b, "<tr><th>");
    esc(b, k);
    lm_buf_puts(b, "</th><td>");
    struct lm_buf v = {0};
    va_list ap;
    va_start(ap, fmt);
    lm_buf_vprintf(&v, fmt, ap);
    va_end(ap);
    esc(b, v.p ? v.p : "");
    lm_buf_free(&v);
    lm_buf_puts(b, "</td></tr>\n");
}

static void coverage_table(struct lm_buf *b, json_t *cov) {
    json_t *cells = json_object_get(cov, "cells");
    if (!json_is_array(cells)) return;
    lm_buf_puts(b,
                "<h2>Coverage matrix (workload &times; model &times; runtime mode)</h2>\n<table>");
    const char *cols[] = {"workload", "model", "mode", "status", "run", "evidence"};
    th_row(b, cols, 6);
    size_t i;
    json_t *c;
    json_array_foreach(cells, i, c) {
        const char *st = json_string_value(json_object_get(c, "status"));
        lm_buf_puts(b, "<tr>");
        const char *keys[] = {"workload", "model", "mode"};
        for (int k = 0; k < 3; k++) {
            lm_buf_puts(b, "<td>");
            esc(b, json_string_value(json_object_get(c, keys[k])));
            lm_buf_puts(b, "</td>");
        }
        lm_buf_printf(b, "<td class=\"st-%s\">", st ? st : "");
        esc(b, st);
        lm_buf_puts(b, "</td><td>");
        esc(b, json_string_value(json_object_get(c, "run_id")));
        lm_buf_puts(b, "</td><td>");
        char *ev = json_dumps(json_object_get(c, "evidence"), JSON_COMPACT | JSON_ENCODE_ANY);
        esc(b, ev);
        free(ev);
        lm_buf_puts(b, "</td></tr>\n");
    }
    lm_buf_puts(b, "</table>\n");
}

static const char k_css[] =
    "<style>body{font-family:sans-serif;margin:24px;color:#222;max-width:1200px}"
    "table{border-collapse:collapse;margin:8px 0 16px}td,th{border:1px solid #ccc;padding:3px 8px;"
    "text-align:right;font-size:13px}th{background:#f3f3f3}td:first-child,th:first-child{text-"
    "align:left}"
    ".charts{display:flex;flex-wrap:wrap;gap:12px}.chart{border:1px solid #ddd}"
    ".ok{color:#1a7f37;font-weight:bold}.bad{color:#c00;font-weight:bold}.na{color:#777}"
    ".st-qualified{background:#c8e6c9}.st-validated{background:#e3f2fd}.st-implemented{background:#"
    "fff8e1}"
    ".st-planned{color:#777}pre{background:#f7f7f7;padding:8px;overflow:auto;font-size:12px}</"
    "style>\n";

lm_status lm_bench_write_html(const char *path, const struct lm_bench_run *run,
                              const struct lm_bench_summary *s,
                              const struct lm_bench_verification *v,
                              const struct lm_bench_dataset *ds, json_t *manifest,
                              json_t *coverage) {
    struct lm_buf b = {0};
    const struct lm_bench_params *p = &run->params;
    lm_buf_puts(&b, "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>lumen profile ");
    esc(&b, run->run_id);
    lm_buf_puts(&b, "</title>\n");
    lm_buf_puts(&b, k_css);
    lm_buf_puts(&b, "</head><body>\n<h1>lumen profile: run ");
    esc(&b, run->run_id);
    lm_buf_puts(&b, "</h1>\n<table>\n");
    kv(&b, "model", "%s", run->model ? run->model : "");
    kv(&b, "server", "%s", run->url ? run->url : "");
    kv(&b, "dataset", "%s (%zu of %zu conversations selected)%s%s", ds ? ds->name : "?",
       ds ? ds->n : 0, ds ? ds->n_considered : 0, ds && ds->sha256[0] ? ", sha256 " : "",
       ds && ds->sha256[0] ? ds->sha256 : "");
    if (p->request_rate > 0)
        kv(&b, "load", "request rate %g/s (%s), at most %d in flight", p->request_rate,
           p->arrival == LM_BENCH_ARRIVAL_POISSON ? "poisson" : "constant",
           p->concurrency > 0 ? p->concurrency : 256);
    else
        kv(&b, "load", "concurrency %d", p->concurrency);
    kv(&b, "requests", "%zu conversations, %zu requests sent, %zu warmup requests (excluded)",
       run->n_conversations, s->n_requests, s->n_warmup);
    kv(&b, "generation", "max_tokens %d, temperature %g%s, think time %g ms (std %g)",
       p->max_tokens, p->temperature, p->ignore_eos ? ", ignore_eos" : "", p->think_time_mean_ms,
       p->think_time_std_ms);
    kv(&b, "runtime mode", "%s",
       s->n_spec_reported ? "speculative decoding (reported by the server)"
                          : "ordinary generation (the server reported no speculative counters; "
                            "acceptance metrics unavailable)");
    lm_buf_puts(&b, "<tr><th>verification</th><td>");
    if (v && v->error) {
        lm_buf_puts(&b, "<span class=\"bad\">FAILED</span>: the server records could not be used: ");
        esc(&b, v->error);
    } else if (!v || !v->available)
        lm_buf_puts(&b,
                    "<span class=\"na\">unavailable: no server records (docs/RECORDS.md)</span>");
    else
        lm_buf_printf(&b, "<span class=\"%s\">%s</span> (%zu of %zu requests joined)",
                      v->ok ? "ok" : "bad", v->ok ? "passed" : "FAILED", v->n_matched, v->n_client);
    lm_buf_puts(&b, "</td></tr>\n</table>\n");

    /* metrics */
    lm_buf_puts(&b, "<h2>Metrics (profiling phase, successful requests)</h2>\n<table>");
    const char *cols[] = {"metric", "min", "avg", "std", "p50", "p90", "p95", "p99", "max", "n"};
    th_row(&b, cols, 10);
    for (int m = LM_BENCH_M_TTFT; m <= LM_BENCH_M_THINK; m++) {
        if (m == LM_BENCH_M_THINK && s->m[m].n == 0) continue;
        const struct lm_bench_metric_info *mi = lm_bench_metric_info((enum lm_bench_metric)m);
        stats_tr(&b, mi->label, mi->unit, &s->m[m]);
    }
    lm_buf_puts(&b, "</table>\n<table>");
    lm_buf_puts(&b, "<tr><th>benchmark duration (s)</th><td>");
    num(&b, s->window_s);
    lm_buf_puts(&b, "</td></tr><tr><th>request throughput (requests/s)</th><td>");
    num(&b, s->request_throughput);
    lm_buf_puts(&b, "</td></tr><tr><th>output token throughput (tokens/s)</th><td>");
    num(&b, s->output_token_throughput);
    lm_buf_puts(&b, "</td></tr>");
    if (s->slo_set) {
        lm_buf_puts(&b, "<tr><th>goodput (requests/s)</th><td>");
        num(&b, s->goodput);
        lm_buf_printf(&b, " (%zu of %zu meet the SLOs)</td></tr>", s->n_good, s->n_ok);
    }
    lm_buf_printf(&b,
                  "<tr><th>requests</th><td>%zu ok, %zu failed, %zu skipped after a failure, "
                  "%zu not sent (limit)</td></tr>",
                  s->n_ok, s->n_failed, s->n_skipped_failure, s->n_skipped_limit);
    lm_buf_puts(&b, "<tr><th>errors</th><td>");
    if (!s->n_failed) lm_buf_puts(&b, "none");
    for (int e = 1; e < LM_BENCH_ERR_COUNT; e++)
        if (s->errors[e])
            lm_buf_printf(&b, "%s: %zu ", lm_bench_error_name((enum lm_bench_error)e),
                          s->errors[e]);
    lm_buf_puts(&b, "</td></tr>");
    lm_buf_printf(&b,
                  "<tr><th>output tokens: usage vs lumen's tokenizer</th><td>%zu equal, %zu one "
                  "more (stop token), <span class=\"%s\">%zu mismatch</span> of %zu</td></tr>",
                  s->out_match, s->out_eos, s->out_mismatch ? "bad" : "", s->out_mismatch,
                  s->out_compared);
    if (s->in_compared)
        lm_buf_printf(&b,
                      "<tr><th>input tokens: usage vs rendered prompt</th><td>%zu equal, <span "
                      "class=\"%s\">%zu mismatch</span> of %zu</td></tr>",
                      s->in_match, s->in_mismatch ? "bad" : "", s->in_mismatch, s->in_compared);
    if (s->n_cached_reported)
        lm_buf_printf(&b, "<tr><th>prefix cache</th><td>%ld of %ld prompt tokens cached</td></tr>",
                      s->cached_tokens_total, s->prompt_tokens_total);
    lm_buf_puts(&b, "</table>\n");

    /* plots */
    lm_buf_puts(&b, "<h2>Distributions and throughput</h2>\n<div class=\"charts\">\n");
    struct lm_bench_samples lat = {0}, ttft = {0};
    for (size_t i = run->n_warmup; i < run->n_records; i++) {
        const struct lm_bench_record *r = &run->records[i];
        if (!ok_rec(r)) continue;
        lm_bench_samples_push(&lat, r->latency_ms);
        lm_bench_samples_push(&ttft, r->ttft_ms);
    }
    histogram(&b, "Request latency", "ms", lat.v, lat.n, &s->m[LM_BENCH_M_LATENCY], k_colors[0]);
    histogram(&b, "Time to first token", "ms", ttft.v, ttft.n, &s->m[LM_BENCH_M_TTFT], k_colors[1]);
    lm_bench_samples_free(&lat);
    lm_bench_samples_free(&ttft);
    timeline(&b, run);
    per_turn_chart(&b, s);
    lm_buf_puts(&b, "</div>\n");

    /* per turn */
    lm_buf_puts(&b, "<h2>Per turn</h2>\n<table>");
    const char *tc[] = {"turn",    "requests",  "TTFT p50",       "TTFT p95",    "TTFO p50",
                        "ITL p50", "ITL p95",   "latency p50",    "latency p95", "ISL p50",
                        "OSL p50", "alone (s)", "tokens/s alone", "tokens alone"};
    th_row(&b, tc, 14);
    for (int i = 0; i < s->n_turn_rows; i++) {
        const struct lm_bench_turn_summary *t = &s->turns[i];
        lm_buf_printf(&b, "<tr><td>%d%s</td><td>%zu</td>", t->turn,
                      i == LM_BENCH_MAX_TURN_ROWS - 1 ? "+" : "", t->n_ok);
        double vals[] = {t->ttft_ms.p50,
                         t->ttft_ms.p95,
                         t->ttfo_ms.p50,
                         t->itl_ms.p50,
                         t->itl_ms.p95,
                         t->latency_ms.p50,
                         t->latency_ms.p95,
                         t->isl.p50,
                         t->osl.p50,
                         t->alone_s,
                         t->output_token_throughput};
        for (int k = 0; k < 11; k++) {
            lm_buf_puts(&b, "<td>");
            num(&b, vals[k]);
            lm_buf_puts(&b, "</td>");
        }
        lm_buf_printf(&b, "<td>%.0f%%</td></tr>\n",
                      t->tokens > 0 ? 100.0 * t->alone_tokens / t->tokens : 0.0);
    }
    lm_buf_puts(
        &b, "</table>\n<p>tokens/s alone: the turn's output tokens that arrived while only "
            "that turn's requests were in flight, divided by that time; \"tokens alone\" is the "
            "share of the turn's tokens this covers.</p>\n");

    if (s->server_side) {
        lm_buf_puts(&b, "<h2>Server-side time (from the server's records)</h2>\n<table>");
        th_row(&b, cols, 10);
        for (int m = LM_BENCH_M_S_QUEUE; m <= LM_BENCH_M_S_ACCEPT; m++) {
            if (m == LM_BENCH_M_S_ACCEPT && s->m[m].n == 0) continue; /* no drafts */
            const struct lm_bench_metric_info *mi = lm_bench_metric_info((enum lm_bench_metric)m);
            stats_tr(&b, mi->label, mi->unit, &s->m[m]);
        }
        stats_tr(&b, "Client request latency, for reference", "ms", &s->m[LM_BENCH_M_LATENCY]);
        lm_buf_puts(&b, "</table>\n");
    }

    if (v && v->available) {
        lm_buf_puts(&b, "<h2>Verification</h2>\n<table>");
        const char *vc[] = {"check", "passed", "failed", "unavailable"};
        th_row(&b, vc, 4);
        for (int c = 0; c < LM_BENCH_CHECK_COUNT; c++)
            lm_buf_printf(&b, "<tr><td>%s</td><td>%zu</td><td%s>%zu</td><td>%zu</td></tr>\n",
                          lm_bench_check_name((enum lm_bench_check)c), v->passed[c],
                          v->failed[c] ? " class=\"bad\"" : "", v->failed[c], v->unavailable[c]);
        lm_buf_puts(&b, "</table>\n");
        size_t n = json_array_size(v->issues);
        if (n) {
            lm_buf_puts(&b, "<table><tr><th>request</th><th>check</th><th>detail</th></tr>");
            for (size_t i = 0; i < n && i < 50; i++) {
                json_t *e = json_array_get(v->issues, i);
                lm_buf_puts(&b, "<tr><td>");
                esc(&b, json_string_value(json_object_get(e, "request_id")));
                lm_buf_puts(&b, "</td><td>");
                esc(&b, json_string_value(json_object_get(e, "check")));
                lm_buf_puts(&b, "</td><td>");
                esc(&b, json_string_value(json_object_get(e, "detail")));
                lm_buf_puts(&b, "</td></tr>\n");
            }
            lm_buf_puts(&b, "</table>\n");
        }
    }

    if (ds) {
        lm_buf_puts(&b, "<h2>Dataset selection</h2>\n<p>");
        esc(&b, ds->selection ? ds->selection : "");
        lm_buf_printf(&b,
                      "</p>\n<table><tr><th>considered</th><td>%zu</td></tr><tr><th>selected</"
                      "th><td>%zu</td></tr>",
                      ds->n_considered, ds->n);
        const char *reason;
        json_t *cnt;
        json_object_foreach(ds->rejected, reason, cnt) {
            lm_buf_puts(&b, "<tr><th>rejected: ");
            esc(&b, reason);
            lm_buf_printf(&b, "</th><td>%lld</td></tr>", (long long)json_integer_value(cnt));
        }
        lm_buf_puts(&b, "</table>\n");
    }
    if (coverage) coverage_table(&b, coverage);
    if (manifest) {
        lm_buf_puts(&b, "<h2>Manifest</h2>\n<pre>");
        char *m = json_dumps(manifest, JSON_INDENT(2) | JSON_SORT_KEYS);
        esc(&b, m);
        free(m);
        lm_buf_puts(&b, "</pre>\n");
    }
    lm_buf_puts(&b,
                "<p class=\"na\">Metric names and definitions follow NVIDIA AIPerf. ITL per "
                "token divides each chunk's gap by its token count (lumen's tokenizer); ITL per "
                "request is AIPerf's (latency - TTFT) / (output tokens - 1). Percentiles "
                "interpolate linearly (numpy's default).</p>\n</body></html>\n");
    lm_status st = lm_file_write(path, b.p, b.len);
    lm_buf_free(&b);
    return st;
}

const char *const lm_bench_sweep_metrics[LM_BENCH_SWEEP_METRICS] = {"output_token_throughput",
                                                                    "request_throughput",
                                                                    "ttft_p50",
                                                                    "ttft_p95",
                                                                    "itl_p50",
                                                                    "latency_p50",
                                                                    "latency_p95"};

double lm_bench_sweep_metric(json_t *pt, int k) {
    json_t *v = json_object_get(pt, lm_bench_sweep_metrics[k]);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

lm_status lm_bench_write_sweep_html(const char *path, json_t *points, const char *what,
                                    const char *title) {
    struct lm_buf b = {0};
    lm_buf_puts(&b, "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>");
    esc(&b, title);
    lm_buf_puts(&b, "</title>\n");
    lm_buf_puts(&b, k_css);
    lm_buf_puts(&b, "</head><body>\n<h1>");
    esc(&b, title);
    lm_buf_puts(&b, "</h1>\n");
    size_t n = json_array_size(points);
    double *x = calloc(n + 1, sizeof *x), *y50 = calloc(n + 1, sizeof *y50),
           *y95 = calloc(n + 1, sizeof *y95), *t50 = calloc(n + 1, sizeof *t50);
    if (!x || !y50 || !y95 || !t50) abort();
    double xmax = 0, ymax = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *pt = json_array_get(points, i);
        x[i] = json_number_value(json_object_get(pt, "output_token_throughput"));
        y50[i] = json_number_value(json_object_get(pt, "latency_p50"));
        y95[i] = json_number_value(json_object_get(pt, "latency_p95"));
        t50[i] = json_number_value(json_object_get(pt, "ttft_p50"));
        if (isfinite(x[i]) && x[i] > xmax) xmax = x[i];
        if (isfinite(y95[i]) && y95[i] > ymax) ymax = y95[i];
    }
    lm_buf_puts(&b, "<div class=\"charts\">\n");
    struct chart c;
    chart_begin(&c, &b, "Throughput versus latency", "output token throughput (tokens/s)", "ms", 0,
                xmax, 0, ymax);
    polyline(&c, x, y50, n, k_colors[0], true);
    polyline(&c, x, y95, n, k_colors[2], true);
    polyline(&c, x, t50, n, k_colors[1], true);
    for (size_t i = 0; i < n; i++) {
        const char *label = json_string_value(json_object_get(json_array_get(points, i), "label"));
        if (isfinite(x[i]) && isfinite(y95[i]))
            lm_buf_printf(&b, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\">", cx(&c, x[i]) + 4,
                          cy(&c, y95[i]) - 4),
                esc(&b, label), lm_buf_puts(&b, "</text>\n");
    }
    legend(&c, 0, "request latency p50", k_colors[0]);
    legend(&c, 1, "request latency p95", k_colors[2]);
    legend(&c, 2, "TTFT p50", k_colors[1]);
    chart_end(&c);
    lm_buf_puts(&b, "</div>\n<table>");
    const char *cols[] = {what,      "output tokens/s", "requests/s",  "TTFT p50", "TTFT p95",
                          "ITL p50", "latency p50",     "latency p95", "run"};
    th_row(&b, cols, 9);
    for (size_t i = 0; i < n; i++) {
        json_t *pt = json_array_get(points, i);
        lm_buf_puts(&b, "<tr><td>");
        esc(&b, json_string_value(json_object_get(pt, "label")));
        lm_buf_puts(&b, "</td>");
        for (int k = 0; k < LM_BENCH_SWEEP_METRICS; k++) {
            lm_buf_puts(&b, "<td>");
            num(&b, lm_bench_sweep_metric(pt, k));
            lm_buf_puts(&b, "</td>");
        }
        const char *dir = json_string_value(json_object_get(pt, "dir"));
        lm_buf_puts(&b, "<td><a href=\"");
        esc(&b, dir);
        lm_buf_puts(&b, "/report.html\">");
        esc(&b, dir);
        lm_buf_puts(&b, "</a></td></tr>\n");
    }
    lm_buf_puts(&b, "</table>\n</body></html>\n");
    free(x);
    free(y50);
    free(y95);
    free(t50);
    lm_status st = lm_file_write(path, b.p, b.len);
    lm_buf_free(&b);
    return st;
}
