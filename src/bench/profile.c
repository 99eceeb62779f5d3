/* profile.c: see profile.h. */
#include "bench/profile.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "base/buf.h"
#include "base/file.h"
#include "bench/client.h"
#include "bench/html.h"
#include "bench/manifest.h"
#include "bench/prompt.h"
#include "bench/verify.h"

void lm_bench_profile_result_free(struct lm_bench_profile_result *r) {
    if (!r) return;
    free(r->dir);
    json_decref(r->summary);
    memset(r, 0, sizeof *r);
}

/* mkdir -p */
static lm_status make_dirs(const char *path) {
    char *p = strdup(path);
    if (!p) abort();
    lm_status st = LM_OK;
    for (char *s = p + 1;; s++) {
        if (*s == '/' || !*s) {
            char c = *s;
            *s = 0;
            if (mkdir(p, 0755) && errno != EEXIST) {
                st = lm_errorf(LM_ERR_IO, "%s: cannot create the folder: %s", p, strerror(errno));
                break;
            }
            *s = c;
            if (!c) break;
        }
    }
    free(p);
    return st;
}

static char *in_dir(const char *dir, const char *name) {
    return lm_path_join(dir, name);
}

/* Loaded once per run or sweep. */
struct session {
    struct lm_bench_prompt tok, model;
    bool have_tok, have_model;
    const struct lm_bench_prompt *render;
    struct lm_bench_dataset ds;
};

static void session_free(struct session *s) {
    lm_bench_prompt_free(&s->tok);
    lm_bench_prompt_free(&s->model);
    lm_bench_dataset_free(&s->ds);
}

static lm_status session_open(struct session *s, const struct lm_bench_profile_opts *o) {
    memset(s, 0, sizeof *s);
    lm_status st = LM_OK;
    if (o->tokenizer_dir) {
        st = lm_bench_prompt_open(&s->tok, o->tokenizer_dir);
        if (st) return lm_error_prefix(st, "--tokenizer %s", o->tokenizer_dir);
        s->have_tok = true;
    }
    if (o->model_dir) {
        st = lm_bench_prompt_open(&s->model, o->model_dir);
        if (st) return lm_error_prefix(st, "--model-dir %s", o->model_dir);
        s->have_model = true;
    }
    if (s->have_model && lm_bench_prompt_can_render(&s->model))
        s->render = &s->model;
    else if (s->have_tok && o->render_with_tokenizer && lm_bench_prompt_can_render(&s->tok))
        s->render = &s->tok;
    struct lm_bench_dataset_opts d = o->data;
    d.prompt = s->have_model ? &s->model : s->have_tok ? &s->tok : NULL;
    d.max_tokens = o->params.max_tokens;
    st = lm_bench_dataset_open(&s->ds, &d);
    if (st) return lm_error_prefix(st, "dataset %s", d.name);
    return LM_OK;
}

/* True when `name` ends with `suffix`, or with `suffix` + "_total". */
static bool name_ends(const char *name, const char *suffix) {
    size_t n = strlen(name), k = strlen(suffix);
    if (n >= k + 6 && !strcmp(name + n - 6, "_total")) n -= 6;
    return n >= k && !strncmp(name + n - k, suffix, k);
}

/* Speculative counters in a Prometheus text body. Token counters first: the samples whose
 * metric name ends in "draft_tokens" (drafted) or "accepted_tokens" (accepted), optionally
 * with "_total" (vLLM's spec_decode_num_draft_tokens / _num_accepted_tokens, lumen's
 * lumen_spec_decode_*); only when a body has none of those, the sums of the samples whose name
 * holds "draft" or "accept" (other servers). A name such as spec_decode_num_drafts (steps, not
 * tokens) or ..._accepted_tokens_per_pos (a breakdown) then does not count twice. Returns
 * {"drafted": x, "accepted": y, "lines": [...]} or NULL when there is none. */
static json_t *spec_counters(const char *text) {
    if (!text) return NULL;
    double drafted = 0, accepted = 0;
    bool any = false;
    json_t *lines = json_array();
    for (int tier = 0; tier < 2 && !any; tier++) {
        for (const char *p = text; *p;) {
            const char *e = strchr(p, '\n');
            size_t len = e ? (size_t)(e - p) : strlen(p);
            if (len && p[0] != '#' && len < 512) {
                char line[512];
                memcpy(line, p, len);
                line[len] = 0;
                char *sp = strrchr(line, ' ');
                size_t name_len = strcspn(line, "{ ");
                char name[256];
                snprintf(name, sizeof name, "%.*s", (int)(name_len < 255 ? name_len : 255), line);
                bool is_acc = tier == 0 ? name_ends(name, "accepted_tokens")
                                        : strstr(name, "accept") != NULL;
                bool is_draft = !is_acc && (tier == 0 ? name_ends(name, "draft_tokens")
                                                      : strstr(name, "draft") != NULL);
                if (sp && (is_acc || is_draft) && !strstr(name, "_bucket") &&
                    !strstr(name, "_sum") && !strstr(name, "_count") && !strstr(name, "_created")) {
                    double v = strtod(sp + 1, NULL);
                    if (isfinite(v)) {
                        if (is_acc)
                            accepted += v;
                        else
                            drafted += v;
                        any = true;
                        json_array_append_new(lines, json_string(line));
                    }
                }
            }
            p = e ? e + 1 : p + len;
        }
    }
    if (!any) {
        json_decref(lines);
        return NULL;
    }
    return json_pack("{s:f,s:f,s:o}", "drafted", drafted, "accepted", accepted, "lines", lines);
}

static json_t *get_json(const char *url, const char *api_key, const char *path,
                        struct lm_buf *raw) {
    struct lm_bench_client c;
    json_t *o = NULL;
    if (!lm_bench_client_init(&c, url, api_key, 10)) {
        long status = 0;
        struct lm_buf body = {0};
        if (!lm_bench_client_get(&c, path, &body, &status) && status == 200) {
            if (raw)
                lm_buf_append(raw, body.p ? body.p : "", body.len);
            else
                o = json_loadb(body.p ? body.p : "", body.len, 0, NULL);
        }
        lm_buf_free(&body);
    }
    lm_bench_client_free(&c);
    return o;
}

static json_t *metrics_spec(const struct lm_bench_params *p) {
    struct lm_buf raw = {0};
    get_json(p->url, p->api_key, "/metrics", &raw);
    json_t *o = spec_counters(raw.p);
    lm_buf_free(&raw);
    return o;
}

static void note(const struct lm_bench_profile_opts *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void note(const struct lm_bench_profile_opts *o, const char *fmt, ...) {
    if (!o->log) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(o->log, fmt, ap);
    va_end(ap);
    fflush(o->log);
}

static lm_status run_one(struct session *se, const struct lm_bench_profile_opts *o,
                         const struct lm_bench_params *params, const char *dir_given,
                         bool merge_parent, struct lm_bench_profile_result *res) {
    memset(res, 0, sizeof *res);
    res->exit_code = 1;
    struct lm_bench_params p = *params;
    p.prompt = se->have_tok ? &se->tok : se->have_model ? &se->model : NULL;
    p.render = se->render;
    json_t *models = get_json(p.url, p.api_key, "/v1/models", NULL);
    json_t *m_before = metrics_spec(&p);
    struct lm_bench_run run;
    lm_status st = lm_bench_run(&se->ds, &p, &run);
    json_t *m_after = st ? NULL : metrics_spec(&p);
    struct lm_bench_verification v = {0};
    struct lm_buf dirb = {0};
    json_t *sj = NULL, *manifest = NULL, *cov = NULL, *merged = NULL, *vj = NULL;
    char *merged_path = NULL; /* the parent folder's coverage.json, when this run merges into it */
    char *path = NULL;
    if (st) goto done;

    if (o->server_records) {
        lm_bench_verify_wait(&run, o->server_records, 5.0);
        st = lm_bench_verify(&run, &se->ds, o->server_records, se->render, &v);
        if (st) {
            st = lm_error_prefix(st, "--server-records");
            goto done;
        }
    }
    struct lm_bench_summary s;
    lm_bench_summarize(&run, &o->slo, &s);
    /* speculative counters from /metrics, when usage carried none */
    if (!s.n_spec_reported && m_before && m_after) {
        double d = json_number_value(json_object_get(m_after, "drafted")) -
                   json_number_value(json_object_get(m_before, "drafted"));
        double a = json_number_value(json_object_get(m_after, "accepted")) -
                   json_number_value(json_object_get(m_before, "accepted"));
        if (d > 0) {
            s.n_spec_reported = s.n_ok;
            s.draft_tokens_total = (long)d;
            s.accepted_tokens_total = (long)a;
        }
    }

    /* the folder */
    if (dir_given) {
        lm_buf_puts(&dirb, dir_given);
    } else {
        char stamp[32];
        time_t t = (time_t)run.unix_begin;
        if (!t) t = time(NULL);
        struct tm tm;
        gmtime_r(&t, &tm);
        strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
        lm_buf_printf(&dirb, "%s/%s-%s", o->runs_root ? o->runs_root : "runs", stamp, run.run_id);
    }
    res->dir = lm_buf_take(&dirb);
    if ((st = make_dirs(res->dir))) goto done;

#define WRITE(name, call)                                                                          \
    do {                                                                                           \
        free(path);                                                                                \
        path = in_dir(res->dir, name);                                                             \
        if ((st = (call))) goto done;                                                              \
    } while (0)

    WRITE("requests.jsonl", lm_bench_write_jsonl(path, &run));
    if (o->output_jsonl && (st = lm_bench_write_jsonl(o->output_jsonl, &run))) goto done;
    sj = lm_bench_summary_json(&run, &s);
    json_object_set_new(sj, "settings", lm_bench_settings_json(&run));
    json_object_set_new(sj, "dataset",
                        json_pack("{s:s,s:I,s:I,s:O}", "name", se->ds.name, "considered",
                                  (json_int_t)se->ds.n_considered, "selected", (json_int_t)se->ds.n,
                                  "rejected", se->ds.rejected));
    json_object_set_new(sj, "verification",
                        json_pack("{s:b,s:b}", "available", v.available, "ok", v.ok));
    WRITE("summary.json", lm_bench_write_json(path, sj));
    WRITE("summary.csv", lm_bench_write_summary_csv(path, &run, &s));
    vj = lm_bench_verification_json(&v);
    WRITE("verification.json", lm_bench_write_json(path, vj));
    WRITE("selection.jsonl", lm_bench_dataset_write_ledger(&se->ds, path));
    struct lm_bench_manifest_info mi = {
        .command_line = o->command_line,
        .preset = o->preset,
        .tokenizer_dir = o->tokenizer_dir,
        .model_dir = o->model_dir,
        .server_records = o->server_records,
        .ledger_file = "selection.jsonl",
        .models = models,
        .metrics_before = m_before,
        .metrics_after = m_after,
    };
    manifest = lm_bench_manifest(&run, &se->ds, &mi);
    WRITE("manifest.json", lm_bench_write_json(path, manifest));
    cov = lm_bench_coverage(&run, &se->ds, &s, &v);
    WRITE("coverage.json", lm_bench_write_json(path, cov));
    if (merge_parent) {
        char *parent = strdup(res->dir);
        char *slash = strrchr(parent, '/');
        if (slash)
            *slash = 0;
        else
            strcpy(parent, ".");
        merged_path = lm_path_join(parent, "coverage.json");
        if (lm_bench_coverage_merge(merged_path, cov, &merged))
            note(o, "lumen profile: note: %s: %s (the run's own coverage.json is written)\n", merged_path,
                 lm_error_message());
        free(parent);
    }
    WRITE("report.html",
          lm_bench_write_html(path, &run, &s, &v, &se->ds, manifest, merged ? merged : cov));

    /* the text summary */
    {
        struct lm_buf txt = {0};
        FILE *mf = open_memstream(&txt.p, &txt.cap);
        if (!mf) abort();
        lm_bench_report_print(mf, &run, &s);
        fprintf(mf, "\n");
        lm_bench_verification_print(mf, &v);
        if (run.n_conversations > se->ds.n)
            fprintf(mf, "Dataset: %s, %zu of %zu conversations selected, %zu conversations ran (the "
                        "selection cycled, %.1f passes: later passes reuse the server's prefix cache)",
                    se->ds.name, se->ds.n, se->ds.n_considered, run.n_conversations,
                    (double)run.n_conversations / (double)se->ds.n);
        else
            fprintf(mf, "Dataset: %s, %zu of %zu conversations selected, %zu of them ran", se->ds.name,
                    se->ds.n, se->ds.n_considered, run.n_conversations);
        const char *reason;
        json_t *cnt;
        bool first = true;
        json_object_foreach(se->ds.rejected, reason, cnt) {
            fprintf(mf, "%s%s %lld", first ? " (rejected: " : ", ", reason,
                    (long long)json_integer_value(cnt));
            first = false;
        }
        fprintf(mf, "%s\n", first ? "" : ")");
        fprintf(mf,
                "Run folder: %s (report.html, summary.txt, summary.json, summary.csv, requests.jsonl, "
                "manifest.json, coverage.json, selection.jsonl, verification.json)\n",
                res->dir);
        if (merged) fprintf(mf, "Coverage of every run beside it merged into %s\n", merged_path);
        fclose(mf);
        txt.len = strlen(txt.p);
        free(path);
        path = in_dir(res->dir, "summary.txt");
        if ((st = lm_file_write(path, txt.p, txt.len))) {
            free(txt.p);
            goto done;
        }
        if (o->out) {
            fwrite(txt.p, 1, txt.len, o->out);
            fflush(o->out);
        }
        free(txt.p);
    }
    res->summary = json_incref(sj);
    res->n_ok = s.n_ok;
    res->verification_available = v.available;
    res->verification_ok = v.ok;
    res->exit_code = s.n_ok == 0 || (v.available && !v.ok) ? 1 : 0;
    if (s.n_ok == 0) note(o, "lumen profile: no profiling request succeeded\n");
    if (v.available && !v.ok)
        note(o, "lumen profile: verification FAILED (see %s/verification.json)\n", res->dir);
#undef WRITE
done:
    free(path);
    json_decref(sj);
    json_decref(vj);
    json_decref(manifest);
    json_decref(cov);
    json_decref(merged);
    free(merged_path);
    json_decref(models);
    json_decref(m_before);
    json_decref(m_after);
    lm_bench_verification_free(&v);
    lm_bench_run_free(&run);
    return st;
}

lm_status lm_bench_profile(const struct lm_bench_profile_opts *o,
                           struct lm_bench_profile_result *res) {
    memset(res, 0, sizeof *res);
    res->exit_code = 1;
    struct session se;
    lm_status st = session_open(&se, o);
    if (!st) st = run_one(&se, o, &o->params, o->artifact_dir, o->artifact_dir == NULL, res);
    session_free(&se);
    return st;
}

static double stat_of(json_t *summary, const char *metric, const char *key) {
    json_t *v = json_object_get(json_object_get(json_object_get(summary, "metrics"), metric), key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static json_t *num_or_null(double v) {
    return isfinite(v) ? json_real(v) : json_null();
}

lm_status lm_bench_sweep(const struct lm_bench_profile_opts *o, const char *what,
                         const double *values, size_t n, char **dir_out, int *exit_code) {
    *dir_out = NULL;
    *exit_code = 1;
    bool rate = !strcmp(what, "request_rate");
    if (!rate && strcmp(what, "concurrency"))
        return lm_errorf(LM_ERR_INVALID, "sweep: '%s' is not concurrency or request_rate", what);
    struct session se;
    lm_status st = session_open(&se, o);
    struct lm_buf dirb = {0};
    if (o->artifact_dir) {
        lm_buf_puts(&dirb, o->artifact_dir);
    } else {
        char stamp[32];
        time_t t = time(NULL);
        struct tm tm;
        gmtime_r(&t, &tm);
        strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
        lm_buf_printf(&dirb, "%s/%s-sweep-%s", o->runs_root ? o->runs_root : "runs", stamp, what);
    }
    char *dir = lm_buf_take(&dirb);
    if (!st) st = make_dirs(dir);
    json_t *points = json_array();
    int worst = 0;
    for (size_t i = 0; i < n && !st; i++) {
        struct lm_bench_params p = o->params;
        char label[64], sub[64];
        if (rate) {
            p.request_rate = values[i];
            snprintf(label, sizeof label, "%g/s", values[i]);
            snprintf(sub, sizeof sub, "request_rate-%g", values[i]);
        } else {
            p.concurrency = (int)values[i];
            snprintf(label, sizeof label, "%d", (int)values[i]);
            snprintf(sub, sizeof sub, "concurrency-%d", (int)values[i]);
        }
        if (o->params.progress) { /* progress: silent under --quiet (notes and failures still print) */
            fprintf(o->params.progress, "lumen profile sweep: %s %s\n", what, label);
            fflush(o->params.progress);
        }
        char *rd = lm_path_join(dir, sub);
        struct lm_bench_profile_result res;
        struct lm_bench_profile_opts quiet = *o; /* each run's tables go to its summary.txt */
        quiet.out = NULL;
        st = run_one(&se, &quiet, &p, rd, true, &res);
        free(rd);
        if (st) break;
        if (res.exit_code > worst) worst = res.exit_code;
        json_t *sj = res.summary;
        json_array_append_new(
            points,
            json_pack(
                "{s:s,s:f,s:s,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:I,s:b}", "label", label, "value",
                values[i], "dir", sub, "output_token_throughput",
                num_or_null(json_number_value(json_object_get(sj, "output_token_throughput"))),
                "request_throughput",
                num_or_null(json_number_value(json_object_get(sj, "request_throughput"))),
                "ttft_p50", num_or_null(stat_of(sj, "time_to_first_token", "p50")), "ttft_p95",
                num_or_null(stat_of(sj, "time_to_first_token", "p95")), "itl_p50",
                num_or_null(stat_of(sj, "inter_token_latency", "p50")), "latency_p50",
                num_or_null(stat_of(sj, "request_latency", "p50")), "latency_p95",
                num_or_null(stat_of(sj, "request_latency", "p95")), "goodput",
                num_or_null(json_number_value(json_object_get(sj, "goodput"))), "request_count",
                (json_int_t)res.n_ok, "verification_ok", res.verification_ok));
        lm_bench_profile_result_free(&res);
    }
    if (!st) {
        char *p = lm_path_join(dir, "sweep.json");
        json_t *doc = json_pack("{s:s,s:O}", "swept", what, "points", points);
        st = lm_bench_write_json(p, doc);
        json_decref(doc);
        free(p);
    }
    if (!st) {
        char *p = lm_path_join(dir, "sweep.csv");
        FILE *f = fopen(p, "w");
        if (!f) {
            st = lm_errorf(LM_ERR_IO, "%s: cannot create", p);
        } else {
            fprintf(f,
                    "%s,output_token_throughput,request_throughput,ttft_p50,ttft_p95,itl_p50,"
                    "latency_p50,latency_p95,request_count,dir\n",
                    what);
            size_t i;
            json_t *pt;
            json_array_foreach(points, i, pt) {
                fprintf(f, "%g", json_number_value(json_object_get(pt, "value")));
                for (int k = 0; k < LM_BENCH_SWEEP_METRICS; k++) {
                    double v = lm_bench_sweep_metric(pt, k);
                    if (isnan(v))
                        fprintf(f, ",");
                    else
                        fprintf(f, ",%.6g", v);
                }
                fprintf(f, ",%lld,%s\n",
                        (long long)json_integer_value(json_object_get(pt, "request_count")),
                        json_string_value(json_object_get(pt, "dir")));
            }
            fclose(f);
        }
        free(p);
    }
    if (!st) {
        char *p = lm_path_join(dir, "sweep.html");
        char title[128];
        snprintf(title, sizeof title, "lumen profile sweep over %s", what);
        st = lm_bench_write_sweep_html(p, points, what, title);
        free(p);
    }
    if (!st && o->out) {
        fprintf(o->out,
                "\nSweep over %s (%s/sweep.html)\n%-12s %14s %12s %10s %10s %10s %12s %12s\n", what,
                dir, what, "output tok/s", "requests/s", "TTFT p50", "TTFT p95", "ITL p50",
                "latency p50", "latency p95");
        size_t i;
        json_t *pt;
        json_array_foreach(points, i, pt) {
            fprintf(o->out, "%-12s", json_string_value(json_object_get(pt, "label")));
            const int w[LM_BENCH_SWEEP_METRICS] = {14, 12, 10, 10, 10, 12, 12};
            for (int k = 0; k < LM_BENCH_SWEEP_METRICS; k++) {
                double v = lm_bench_sweep_metric(pt, k);
                if (isnan(v))
                    fprintf(o->out, " %*s", w[k], "n/a");
                else
                    fprintf(o->out, " %*.2f", w[k], v);
            }
            fprintf(o->out, "\n");
        }
        fflush(o->out);
    }
    json_decref(points);
    session_free(&se);
    *dir_out = dir;
    *exit_code = st ? 1 : worst;
    return st;
}
