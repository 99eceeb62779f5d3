/* profile.c: see profile.h. */
#include "bench/profile.h"

#include <errno.h>
#include <libgen.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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

/* mkdir -p; `flag` names where the path came from ("--artifact-dir"), for the message. */
static lm_status make_dirs(const char *flag, const char *path) {
    char *p = strdup(path);
    if (!p) abort();
    lm_status st = LM_OK;
    for (char *s = p + 1;; s++) {
        if (*s == '/' || !*s) {
            char c = *s;
            *s = 0;
            if (mkdir(p, 0755) && errno != EEXIST) {
                if (!c) /* the folder itself */
                    st = lm_errorf(LM_ERR_IO, "%s %s: cannot create the folder: %s", flag, path,
                                   strerror(errno));
                else
                    st = lm_errorf(LM_ERR_IO, "%s %s: cannot create the folder %s: %s", flag,
                                   path, p, strerror(errno));
                break;
            }
            *s = c;
            if (!c) break;
        }
    }
    free(p);
    return st;
}

/* Opens `path` for appending (never truncating) and closes it again; removes it when this call
 * made it. 0, or the errno of the failure. */
static int try_write(const char *path) {
    struct stat sb;
    bool existed = stat(path, &sb) == 0;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return errno;
    close(fd);
    if (!existed) unlink(path);
    return 0;
}

/* The checks made before the first request is sent, so that a path that cannot be used fails in
 * a second instead of after the whole benchmark: the --server-records file can be read where it
 * exists already (the --output file is checked by run_one, once the run folder it may lie in
 * exists). lumen serve creates it when it
 * starts, but a server may write it only as requests retire (the join waits for them), so a file
 * not there yet is not an error: only one whose folder does not exist, or that exists and cannot
 * be read. */
static lm_status check_paths(const struct lm_bench_profile_opts *o) {
    if (o->server_records) {
        struct stat sb;
        if (stat(o->server_records, &sb)) {
            char *folder = strdup(o->server_records);
            if (!folder) abort();
            const int missing = errno;
            const bool folder_ok = stat(dirname(folder), &sb) == 0 && S_ISDIR(sb.st_mode);
            free(folder);
            if (folder_ok && missing == ENOENT) return LM_OK; /* not written yet */
            return lm_errorf(LM_ERR_IO,
                             "--server-records %s: cannot read the file: %s (the server's "
                             "--records FILE)",
                             o->server_records, strerror(missing));
        }
        FILE *f = fopen(o->server_records, "r");
        if (!f)
            return lm_errorf(LM_ERR_IO, "--server-records %s: cannot read the file: %s (the server's "
                             "--records FILE)", o->server_records, strerror(errno));
        fclose(f);
        if (S_ISDIR(sb.st_mode))
            return lm_errorf(LM_ERR_IO, "--server-records %s: a folder, not the server's records file",
                             o->server_records);
    }
    return LM_OK;
}

/* Creates a run folder (mkdir -p) and checks that a file can be written in it, before the run.
 * *made: the folder did not exist before (so that a run that never started can remove it). */
static lm_status prepare_dir(const char *flag, const char *dir, bool *made) {
    struct stat sb;
    *made = stat(dir, &sb) != 0;
    lm_status st = make_dirs(flag, dir);
    if (st) return st;
    if (stat(dir, &sb) || !S_ISDIR(sb.st_mode))
        return lm_errorf(LM_ERR_IO, "%s %s: not a folder", flag, dir);
    char *probe = lm_path_join(dir, ".lumen-write-check");
    int e = try_write(probe);
    free(probe);
    if (e)
        return lm_errorf(LM_ERR_IO, "%s %s: cannot write files in the folder: %s", flag, dir,
                         strerror(e));
    return LM_OK;
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

static const char *signal_name(int sig) {
    return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal";
}

/* After a stop: the profiling requests cancelled in flight, and the profiling turns never sent
 * (skipped by the limit: the replay marks the turns behind a cancelled request so too, not as
 * "after_failure"). */
static void count_interrupted(const struct lm_bench_run *run, size_t *n_not_sent, size_t *n_cancelled) {
    *n_not_sent = *n_cancelled = 0;
    for (size_t i = run->n_warmup; i < run->n_records; i++) {
        const struct lm_bench_record *r = &run->records[i];
        if (r->sent && r->cancelled) ++*n_cancelled;
        if (!r->sent && r->skip == LM_BENCH_SKIP_LIMIT) ++*n_not_sent; /* replay's skip_after */
    }
}

static lm_status run_one(struct session *se, const struct lm_bench_profile_opts *o,
                         const struct lm_bench_params *params, const char *dir_given,
                         bool merge_parent, struct lm_bench_profile_result *res) {
    memset(res, 0, sizeof *res);
    res->exit_code = 1;
    struct lm_bench_params p = *params;
    p.prompt = se->have_tok ? &se->tok : se->have_model ? &se->model : NULL;
    p.render = se->render;
    struct lm_bench_run run = {0};
    struct lm_bench_verification v = {0};
    struct lm_buf dirb = {0};
    json_t *sj = NULL, *manifest = NULL, *cov = NULL, *merged = NULL, *vj = NULL;
    json_t *models = NULL, *m_before = NULL, *m_after = NULL;
    char *merged_path = NULL; /* the parent folder's coverage.json, when this run merges into it */
    char *path = NULL;
    size_t n_not_sent = 0, n_cancelled = 0;
    /* The folder before the first request: a path that cannot be written fails now, not after
     * the run. The default folder's name holds the run id and the time of the first measured
     * request, known only after the run: its parent is made and checked now. */
    const char *root = o->runs_root ? o->runs_root : "runs";
    bool made = false;
    lm_status st = dir_given ? prepare_dir("--artifact-dir", dir_given, &made)
                             : prepare_dir("the default --artifact-dir's parent", root, &made);
    if (st) return st;
    if (!dir_given) made = false; /* runs/ stays */
    /* --output, now that the folder it may lie in exists (however its path is spelled) */
    const int oe = o->output_jsonl ? try_write(o->output_jsonl) : 0;
    if (oe) {
        if (made) rmdir(dir_given); /* nothing was written: leave no empty folder behind */
        return lm_errorf(LM_ERR_IO, "--output %s: cannot write the file: %s", o->output_jsonl, strerror(oe));
    }

    models = get_json(p.url, p.api_key, "/v1/models", NULL);
    m_before = metrics_spec(&p);
    if (o->stop) {
        double grace = p.timeout_s > 0 && p.timeout_s < 2.0 ? p.timeout_s : 2.0;
        lm_bench_client_watch_stop(o->stop, grace);
    }
    st = lm_bench_run(&se->ds, &p, &run);
    lm_bench_client_watch_stop(NULL, 0);
    res->interrupted = o->stop ? (int)*o->stop : 0;
    if (st) {
        if (made) rmdir(dir_given); /* nothing was written: leave no empty folder behind */
        goto done;
    }
    m_after = metrics_spec(&p);
    if (res->interrupted) {
        count_interrupted(&run, &n_not_sent, &n_cancelled);
        note(o, "lumen profile: interrupted (%s): no new requests sent, %zu in flight cancelled; "
                "writing what completed (a second signal quits at once)\n",
             signal_name(res->interrupted), n_cancelled);
    }

    if (o->server_records) {
        /* a shorter wait after a stop: the user is waiting, and cancelled requests may retire
         * late or never */
        note(o, "lumen profile: joining with the server's records (%s; up to %.0f s for the last "
                "ones to be written)\n", o->server_records, res->interrupted ? 1.0 : 5.0);
        lm_bench_verify_wait(&run, o->server_records, res->interrupted ? 1.0 : 5.0);
        /* records that cannot be used do not fail the run: it is written, with verification
         * failed and the reason (v.error) */
        lm_bench_verify(&run, &se->ds, o->server_records, se->render, &v);
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
        lm_buf_printf(&dirb, "%s/%s-%s", root, stamp, run.run_id);
    }
    res->dir = lm_buf_take(&dirb);
    if ((st = make_dirs("--artifact-dir", res->dir))) goto done;

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
    if (v.error) json_object_set_new(json_object_get(sj, "verification"), "error", json_string(v.error));
    json_object_set_new(sj, "interrupted", json_boolean(res->interrupted != 0));
    if (res->interrupted)
        json_object_set_new(sj, "interruption",
                            json_pack("{s:s,s:I,s:I,s:s}", "signal", signal_name(res->interrupted),
                                      "cancelled_in_flight", (json_int_t)n_cancelled, "not_sent",
                                      (json_int_t)n_not_sent, "note",
                                      "the run was stopped early: the figures cover the requests "
                                      "that completed; requests cancelled in flight count as "
                                      "connection errors, those never sent are skipped (limit)"));
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
        if (res->interrupted)
            fprintf(mf,
                    "INTERRUPTED (%s): the run was stopped early; the figures cover the requests "
                    "that completed (%zu cancelled in flight, counted as connection errors; %zu "
                    "planned requests not sent)\n\n",
                    signal_name(res->interrupted), n_cancelled, n_not_sent);
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
    res->exit_code = s.n_ok == 0 || (v.available && !v.ok) || v.error ? 1 : 0;
    if (res->interrupted) res->exit_code = 128 + res->interrupted; /* as a shell reports it */
    if (s.n_ok == 0) note(o, "lumen profile: no profiling request succeeded\n");
    if (v.available && !v.ok)
        note(o, "lumen profile: verification FAILED (see %s/verification.json)\n", res->dir);
    if (v.error)
        note(o, "lumen profile: verification FAILED: --server-records %s: %s\n", o->server_records, v.error);
    if (res->interrupted)
        note(o, "lumen profile: interrupted (%s): wrote the %zu profiling requests that completed "
                "to %s\n",
             signal_name(res->interrupted), s.n_ok, res->dir);
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
    lm_status st = check_paths(o);
    if (st) return st;
    struct session se;
    st = session_open(&se, o);
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
    struct session se = {0};
    lm_status st = check_paths(o);
    if (!st) st = session_open(&se, o);
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
    bool made; /* a sweep's folder stays, even empty: it may hold earlier sweeps' runs */
    if (!st) st = prepare_dir("--artifact-dir", dir, &made);
    (void)made;
    json_t *points = json_array();
    int worst = 0, interrupted = 0;
    for (size_t i = 0; i < n && !st && !interrupted; i++) {
        if (o->stop && *o->stop) { /* between two runs: start no other */
            interrupted = (int)*o->stop;
            break;
        }
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
        interrupted = res.interrupted;
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
                /* no SLO: no goodput (null), not 0 */
                json_is_number(json_object_get(sj, "goodput")) ? json_incref(json_object_get(sj, "goodput"))
                                                               : json_null(),
                "request_count",
                (json_int_t)res.n_ok, "verification_ok", res.verification_ok));
        lm_bench_profile_result_free(&res);
    }
    if (!st) {
        char *p = lm_path_join(dir, "sweep.json");
        json_t *doc = json_pack("{s:s,s:O,s:b}", "swept", what, "points", points, "interrupted",
                                interrupted != 0);
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
        if (interrupted)
            fprintf(o->out, "INTERRUPTED (%s): the sweep stopped after %zu of %zu runs (the last "
                            "one cut short)\n",
                    signal_name(interrupted), json_array_size(points), n);
        fflush(o->out);
    }
    json_decref(points);
    session_free(&se);
    *dir_out = dir;
    *exit_code = st ? 1 : interrupted ? 128 + interrupted : worst;
    return st;
}
