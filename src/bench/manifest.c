/* manifest.c: see manifest.h. */
#include "bench/manifest.h"

#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/file.h"
#include "base/json.h"
#include "bench/digest.h"

#ifndef LM_VERSION
#define LM_VERSION "unknown"
#endif

lm_status lm_bench_write_json(const char *path, json_t *value) {
    if (json_dump_file(value, path, JSON_INDENT(2) | JSON_SORT_KEYS) != 0)
        return lm_errorf(LM_ERR_IO, "%s: cannot write", path);
    return LM_OK;
}

/* First line of a file, trimmed, or "" (buf). */
static void read_line(const char *path, char *buf, size_t n) {
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    if (fgets(buf, (int)n, f)) buf[strcspn(buf, "\r\n")] = 0;
    fclose(f);
}

/* The commit of the git checkout holding `dir` (walking up), or NULL. */
static json_t *git_commit_from(const char *start) {
    char dir[PATH_MAX];
    if (!realpath(start, dir)) return NULL;
    for (;;) {
        char path[PATH_MAX + 32], head[256];
        snprintf(path, sizeof path, "%s/.git/HEAD", dir);
        if (lm_file_exists(path)) {
            read_line(path, head, sizeof head);
            if (!strncmp(head, "ref: ", 5)) {
                char ref[PATH_MAX + 300], sha[128];
                snprintf(ref, sizeof ref, "%s/.git/%s", dir, head + 5);
                read_line(ref, sha, sizeof sha);
                if (!sha[0]) { /* packed refs */
                    snprintf(ref, sizeof ref, "%s/.git/packed-refs", dir);
                    FILE *f = fopen(ref, "r");
                    char line[512];
                    while (f && fgets(line, sizeof line, f)) {
                        line[strcspn(line, "\r\n")] = 0;
                        char *sp = strchr(line, ' ');
                        if (sp && !strcmp(sp + 1, head + 5)) {
                            *sp = 0;
                            snprintf(sha, sizeof sha, "%.127s", line);
                            break;
                        }
                    }
                    if (f) fclose(f);
                }
                return sha[0]
                           ? json_pack("{s:s,s:s,s:s}", "commit", sha, "ref", head + 5, "repo", dir)
                           : NULL;
            }
            return head[0] ? json_pack("{s:s,s:s}", "commit", head, "repo", dir) : NULL;
        }
        char *slash = strrchr(dir, '/');
        if (!slash || slash == dir) return NULL;
        *slash = 0;
    }
}

static json_t *git_commit(void) {
    json_t *g = git_commit_from(".");
    if (g) return g;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return json_null();
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    g = git_commit_from(exe);
    return g ? g : json_null();
}

static json_t *hardware(void) {
    json_t *o = json_object();
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[1024];
    char model[256] = "";
    int logical = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (!strncmp(line, "processor", 9)) logical++;
        if (!model[0] && !strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) {
                c++;
                while (*c == ' ' || *c == '\t')
                    c++;
                c[strcspn(c, "\n")] = 0;
                snprintf(model, sizeof model, "%s", c);
            }
        }
    }
    if (f) fclose(f);
    json_object_set_new(o, "cpu_model", model[0] ? json_string(model) : json_null());
    json_object_set_new(o, "cpu_logical_cores", json_integer(logical));
    json_object_set_new(o, "cpu_online_cores", json_integer(sysconf(_SC_NPROCESSORS_ONLN)));
    f = fopen("/proc/meminfo", "r");
    while (f && fgets(line, sizeof line, f)) {
        long kb;
        if (sscanf(line, "MemTotal: %ld kB", &kb) == 1) {
            json_object_set_new(o, "memory_bytes", json_integer((json_int_t)kb * 1024));
            break;
        }
    }
    if (f) fclose(f);
    json_t *gpus = json_array();
    DIR *d = opendir("/proc/driver/nvidia/gpus");
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char path[PATH_MAX];
        snprintf(path, sizeof path, "/proc/driver/nvidia/gpus/%s/information", de->d_name);
        FILE *g = fopen(path, "r");
        while (g && fgets(line, sizeof line, g)) {
            if (!strncmp(line, "Model:", 6)) {
                char *c = line + 6;
                while (*c == ' ' || *c == '\t')
                    c++;
                c[strcspn(c, "\n")] = 0;
                json_array_append_new(gpus, json_pack("{s:s,s:s}", "bus", de->d_name, "model", c));
            }
        }
        if (g) fclose(g);
    }
    if (d) closedir(d);
    json_object_set_new(o, "gpus", gpus);
    struct utsname u;
    if (!uname(&u))
        json_object_set_new(o, "kernel",
                            json_pack("{s:s,s:s,s:s}", "sysname", u.sysname, "release", u.release,
                                      "machine", u.machine));
    return o;
}

static json_t *file_hash(const char *path) {
    char hex[LM_SHA256_HEX];
    size_t size = 0;
    if (lm_bench_sha256_file(path, hex, &size)) return json_null();
    return json_pack("{s:s,s:s,s:I}", "path", path, "sha256", hex, "bytes", (json_int_t)size);
}

static json_t *model_dir_json(const char *dir) {
    json_t *o = json_object();
    json_object_set_new(o, "dir", json_string(dir));
    char *cj = lm_path_join(dir, "config.json");
    json_t *cfg = NULL;
    if (lm_json_load_file(cj, &cfg)) cfg = json_null();
    json_object_set_new(o, "config", cfg);
    json_t *files = json_array();
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        size_t n = strlen(de->d_name);
        bool want =
            (n > 12 && !strcmp(de->d_name + n - 12, ".safetensors")) ||
            (n > 5 && !strcmp(de->d_name + n - 5, ".gguf")) || !strcmp(de->d_name, "config.json") ||
            !strcmp(de->d_name, "generation_config.json") ||
            !strcmp(de->d_name, "tokenizer.json") || !strcmp(de->d_name, "tokenizer_config.json") ||
            !strcmp(de->d_name, "model.safetensors.index.json");
        if (!want) continue;
        char *p = lm_path_join(dir, de->d_name);
        json_array_append_new(files, file_hash(p));
        free(p);
    }
    if (d) closedir(d);
    json_object_set_new(o, "files", files);
    free(cj);
    return o;
}

json_t *lm_bench_settings_json(const struct lm_bench_run *run) {
    const struct lm_bench_params *p = &run->params;
    json_t *o = json_object();
    json_object_set_new(o, "url", json_string(run->url ? run->url : ""));
    json_object_set_new(o, "model", json_string(run->model ? run->model : ""));
    json_object_set_new(o, "load_mode",
                        json_string(p->request_rate > 0 ? "request_rate" : "concurrency"));
    json_object_set_new(o, "concurrency", json_integer(p->concurrency));
    json_object_set_new(o, "request_rate",
                        p->request_rate > 0 ? json_real(p->request_rate) : json_null());
    json_object_set_new(
        o, "arrival", json_string(p->arrival == LM_BENCH_ARRIVAL_POISSON ? "poisson" : "constant"));
    json_object_set_new(o, "conversations", json_integer((json_int_t)p->conversations));
    json_object_set_new(o, "request_count", json_integer((json_int_t)p->request_count));
    json_object_set_new(o, "benchmark_duration_s", json_real(p->duration_s));
    json_object_set_new(o, "warmup_requests", json_integer((json_int_t)p->warmup_requests));
    json_object_set_new(o, "warmup_duration_s", json_real(p->warmup_duration_s));
    json_object_set_new(o, "warmup_concurrency", json_integer(p->warmup_concurrency));
    json_object_set_new(o, "think_time_mean_ms", json_real(p->think_time_mean_ms));
    json_object_set_new(o, "think_time_std_ms", json_real(p->think_time_std_ms));
    json_object_set_new(o, "max_tokens", json_integer(p->max_tokens));
    json_object_set_new(o, "temperature", json_real(p->temperature));
    json_object_set_new(o, "ignore_eos", json_boolean(p->ignore_eos));
    json_object_set_new(o, "shuffle", json_boolean(p->shuffle));
    json_object_set_new(o, "seed", json_integer((json_int_t)p->seed));
    json_object_set_new(o, "timeout_s", json_real(p->timeout_s));
    json_t *extra = p->extra_body ? json_loads(p->extra_body, 0, NULL) : NULL;
    json_object_set_new(o, "extra_body", extra ? extra : json_null());
    json_object_set_new(o, "run_id", json_string(run->run_id));
    return o;
}

json_t *lm_bench_manifest(const struct lm_bench_run *run, const struct lm_bench_dataset *ds,
                          const struct lm_bench_manifest_info *info) {
    json_t *o = json_object();
    json_object_set_new(o, "lumen_version", json_string(LM_VERSION));
    json_object_set_new(o, "git", git_commit());
    char when[64];
    time_t t = (time_t)run->unix_begin;
    if (!t) t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    json_object_set_new(o, "started_utc", json_string(when));
    json_object_set_new(o, "run_id", json_string(run->run_id));
    json_object_set_new(o, "command_line",
                        info->command_line ? json_string(info->command_line) : json_null());
    json_object_set_new(o, "preset", info->preset ? json_string(info->preset) : json_null());
    json_object_set_new(o, "server",
                        json_pack("{s:s,s:s,s:O}", "url", run->url ? run->url : "", "model",
                                  run->model ? run->model : "", "v1_models",
                                  info->models ? info->models : json_null()));
    if (info->metrics_before || info->metrics_after)
        json_object_set_new(o, "server_metrics_speculative",
                            json_pack("{s:O,s:O}", "before",
                                      info->metrics_before ? info->metrics_before : json_null(),
                                      "after",
                                      info->metrics_after ? info->metrics_after : json_null()));
    json_object_set_new(o, "model_dir",
                        info->model_dir ? model_dir_json(info->model_dir) : json_null());
    if (info->tokenizer_dir) {
        char *tj = lm_dir_exists(info->tokenizer_dir)
                       ? lm_path_join(info->tokenizer_dir, "tokenizer.json")
                       : strdup(info->tokenizer_dir);
        json_object_set_new(o, "tokenizer", file_hash(tj));
        free(tj);
    } else {
        json_object_set_new(o, "tokenizer", json_null());
    }
    json_t *d = json_object();
    json_object_set_new(d, "name", json_string(ds->name ? ds->name : ""));
    json_object_set_new(d, "path", ds->path ? json_string(ds->path) : json_null());
    json_object_set_new(d, "sha256", ds->sha256[0] ? json_string(ds->sha256) : json_null());
    json_object_set_new(d, "bytes", json_integer((json_int_t)ds->file_bytes));
    json_object_set_new(d, "selection", ds->selection ? json_string(ds->selection) : json_null());
    json_object_set_new(d, "considered", json_integer((json_int_t)ds->n_considered));
    json_object_set_new(d, "selected", json_integer((json_int_t)ds->n));
    json_object_set_new(d, "rejected", json_deep_copy(ds->rejected));
    json_object_set_new(d, "ledger",
                        info->ledger_file ? json_string(info->ledger_file) : json_null());
    json_object_set_new(o, "dataset", d);
    json_object_set_new(o, "hardware", hardware());
    json_object_set_new(o, "settings", lm_bench_settings_json(run));
    json_object_set_new(o, "server_records",
                        info->server_records ? json_string(info->server_records) : json_null());
    return o;
}

/* ---- coverage ---- */

static const char *const k_workloads[] = {"sharegpt", "mt_bench", "spec_bench", "synthetic",
                                          "custom"};
static const char *const k_status[] = {"planned", "implemented", "validated", "qualified"};

static int status_rank(const char *s) {
    for (int i = 0; i < 4; i++)
        if (s && !strcmp(s, k_status[i])) return i;
    return 0;
}

json_t *lm_bench_coverage(const struct lm_bench_run *run, const struct lm_bench_dataset *ds,
                          const struct lm_bench_summary *s, const struct lm_bench_verification *v) {
    json_t *o = json_object();
    json_object_set_new(
        o, "definitions",
        json_pack("{s:s,s:s,s:s,s:s}", "planned",
                  "lumen profile can run it, but no run has exercised it", "implemented",
                  "a run exercised it and at least one request succeeded", "validated",
                  "implemented, and verification against the server's records passed", "qualified",
                  "validated, with no failed request, every conversation "
                  "complete, usage agreeing with lumen's token counts, and warmup apart"));
    int rank = 0;
    json_t *evidence = json_array();
    if (s->n_ok > 0) {
        rank = 1;
        json_array_append_new(evidence, json_string("requests succeeded"));
    }
    if (rank == 1 && v && v->available && v->ok) {
        rank = 2;
        json_array_append_new(evidence, json_string("verification passed"));
    }
    bool clean = s->n_failed == 0 && s->n_skipped_failure == 0 && s->out_mismatch == 0 &&
                 s->in_mismatch == 0 && v && v->passed[LM_BENCH_CHECK_WARMUP_APART] > 0 &&
                 v->conversations_broken == 0;
    if (rank == 2 && clean) {
        rank = 3;
        json_array_append_new(evidence, json_string("no failures; usage agrees; warmup apart"));
    }
    bool spec = s->n_spec_reported > 0;
    json_t *cells = json_array();
    for (size_t w = 0; w < sizeof k_workloads / sizeof k_workloads[0]; w++) {
        bool this_one = ds && ds->name && !strcmp(ds->name, k_workloads[w]);
        for (int m = 0; m < 2; m++) {
            bool mode_run = m == 0 ? !spec : spec;
            int r = this_one && mode_run ? rank : 0;
            json_t *c = json_object();
            json_object_set_new(c, "workload", json_string(k_workloads[w]));
            json_object_set_new(c, "model", json_string(run->model ? run->model : ""));
            json_object_set_new(c, "mode", json_string(m == 0 ? "ordinary" : "speculative"));
            json_object_set_new(c, "method",
                                m == 0 ? json_null()
                                       : json_string(spec ? "server-reported" : "unknown"));
            json_object_set_new(c, "status", json_string(k_status[r]));
            json_object_set_new(c, "run_id", r ? json_string(run->run_id) : json_null());
            json_object_set_new(
                c, "evidence",
                r ? json_deep_copy(evidence)
                : this_one && m == 1
                    ? json_pack("[s]", "the server reported no speculative execution")
                    : json_array());
            json_array_append_new(cells, c);
        }
    }
    json_decref(evidence);
    json_object_set_new(o, "cells", cells);
    return o;
}

lm_status lm_bench_coverage_merge(const char *path, json_t *cov, json_t **merged) {
    json_t *base = NULL;
    if (merged) *merged = NULL;
    if (lm_file_exists(path)) {
        lm_status st = lm_json_load_file(path, &base);
        if (st) return st;
    } else {
        base = json_pack("{s:O,s:[]}", "definitions", json_object_get(cov, "definitions"), "cells");
    }
    json_t *cells = json_object_get(base, "cells");
    if (!json_is_array(cells)) {
        json_decref(base);
        return lm_errorf(LM_ERR_FORMAT, "%s: cells: expected an array", path);
    }
    size_t i, j;
    json_t *c, *b;
    json_array_foreach(json_object_get(cov, "cells"), i, c) {
        json_t *found = NULL;
        json_array_foreach(cells, j, b) {
            if (json_equal(json_object_get(b, "workload"), json_object_get(c, "workload")) &&
                json_equal(json_object_get(b, "model"), json_object_get(c, "model")) &&
                json_equal(json_object_get(b, "mode"), json_object_get(c, "mode"))) {
                found = b;
                break;
            }
        }
        if (!found) {
            json_array_append(cells, c);
        } else if (status_rank(json_string_value(json_object_get(c, "status"))) >
                   status_rank(json_string_value(json_object_get(found, "status")))) {
            json_object_update(found, c);
        }
    }
    lm_status st = lm_bench_write_json(path, base);
    if (merged && !st)
        *merged = base;
    else
        json_decref(base);
    return st;
}
