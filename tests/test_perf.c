/* test_perf.c: `lumen perf` as a user runs it (the built CLI, through popen).
 *
 * Checked: a model folder without tokenizer.json is measured (prompt ids drawn below config.json's
 * vocab_size; md and json), while --tokenizer naming a folder without one is still an error that
 * names the file; the markdown table keeps every '|' of every line in the header's columns
 * (counted on screen: "±" is one column, two bytes) and its rule row has a cell per column; the
 * "% of read" footnote is printed exactly when the weights are smaller than the last-level cache
 * the json reports; the json's median is the middle of its samples (3 and 4 repetitions); a GGUF
 * file (q8_0, built here) still runs, and LM_CPU_Q8_ACT picks its matmul
 * path from 0/1, off/on, false/true, no/yes in any case, while another value keeps the default
 * (int8) after one warning that names the variable and the value. Also `lumen logits` (ids only)
 * on the folder without a tokenizer, and its --top-k limit.
 * LM_LABEL: model */
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/buf.h"
#include "check.h"
#include "cli.h"

static char g_dir[64];

static int run(const char *cmd, struct lm_buf *out, struct lm_buf *err) {
    return cli_run(g_dir, cmd, out, err);
}

/* The screen columns of the '|' characters of one line (UTF-8: one column per code point);
 * returns how many, at most `max`. */
static int bars(const char *line, const char *end, int *cols, int max) {
    int n = 0, col = 0;
    for (const char *c = line; c < end; c++) {
        if (((unsigned char)*c & 0xC0) == 0x80) continue;
        if (*c == '|' && n < max) cols[n++] = col;
        col++;
    }
    return n;
}

/* Every line of the markdown table in `text` has its bars where the header has them. */
static void check_table(const char *text, const char *what) {
    int head[32], n_head = -1, rows = 0;
    const char *rule = NULL;
    for (const char *l = text; *l;) {
        const char *e = strchr(l, '\n');
        if (!e) e = l + strlen(l);
        if (*l == '|') {
            int cols[32], n = bars(l, e, cols, 32);
            if (n_head < 0) {
                n_head = n;
                memcpy(head, cols, sizeof cols);
            } else {
                if (!rule) rule = l;
                rows++;
                bool same = n == n_head;
                for (int i = 0; same && i < n; i++)
                    same = cols[i] == head[i];
                CHECK(same, "%s: a table line's bars are not under the header's: %.*s", what,
                      (int)(e - l), l);
            }
        }
        l = *e ? e + 1 : e;
    }
    CHECK(n_head == 11 && rows >= 2, "%s: a table of 10 columns with rows (%d bars, %d lines)", what,
          n_head, rows);
    /* the rule row: a cell of dashes per column, right-aligned columns end with ':' */
    CHECK(rule && !strncmp(rule, "| -", 3) && strstr(rule, "-: |"), "%s: the rule row", what);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/lm_test_perf_XXXXXX");
    if (!mkdtemp(g_dir)) {
        fprintf(stderr, "mkdtemp failed\n");
        return 1;
    }
    char cmd[1024];
    struct lm_buf out = {0}, err = {0};

    /* A model folder without tokenizer files. */
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s/notok' && cp '%s/config.json' '%s/model.safetensors' '%s/notok/'", g_dir,
             TINY_MODEL, TINY_MODEL, g_dir);
    CHECK(system(cmd) == 0, "%s", cmd);
    snprintf(cmd, sizeof cmd,
             "'%s' perf --model '%s/notok' -t 1 -p 16 -n 4 -r 2 -b 1,3 -d 2 --no-bw", LM_LUMEN_BIN,
             g_dir);
    int rc = run(cmd, &out, &err);
    CHECK(rc == 0 && strstr(out.p, "tokenizer: none"), "perf without tokenizer.json: rc %d\n%s%s",
          rc, out.p, err.p);
    check_table(out.p, "no tokenizer, --no-bw");
    CHECK(strstr(out.p, "| tg4 x B=3 @ d2 "), "the batched row names its test:\n%s", out.p);

    snprintf(cmd, sizeof cmd,
             "'%s' perf --model '%s/notok' -t 1 -p 8 -n 0 -r 1 --no-bw --tokenizer '%s'",
             LM_LUMEN_BIN, g_dir, g_dir);
    rc = run(cmd, &out, &err);
    CHECK(rc != 0 && strstr(err.p, "tokenizer.json: file not found"),
          "--tokenizer without the file: rc %d, %s", rc, err.p);

    /* With the read-bandwidth probe: json then md, and the footnote against the json's cache. */
    snprintf(cmd, sizeof cmd, "'%s' perf --model '%s/notok' -t 1 -p 8 -n 4 -r 1 -o json",
             LM_LUMEN_BIN, g_dir);
    rc = run(cmd, &out, &err);
    json_error_t je;
    json_t *j = rc == 0 ? json_loads(out.p, 0, &je) : NULL;
    CHECK(j && json_array_size(json_object_get(j, "results")) == 2, "perf -o json: rc %d, %s\n%s",
          rc, j ? "" : je.text, out.p);
    json_t *llc = json_object_get(j, "last_level_cache_bytes");
    const json_int_t weights = json_integer_value(json_object_get(j, "weight_bytes"));
    CHECK(weights > 0 && (json_is_null(llc) || json_integer_value(llc) > 0),
          "weight_bytes, last_level_cache_bytes");
    if (access("/sys/devices/system/cpu/cpu0/cache/index0/size", R_OK) == 0)
        CHECK(json_is_integer(llc), "/sys names cpu0's caches, yet last_level_cache_bytes is null");
    snprintf(cmd, sizeof cmd, "'%s' perf --model '%s/notok' -t 1 -p 8 -n 4 -r 1 -o md",
             LM_LUMEN_BIN, g_dir);
    rc = run(cmd, &out, &err);
    CHECK(rc == 0 && strstr(out.p, "% of read"), "perf -o md: rc %d\n%s%s", rc, out.p, err.p);
    check_table(out.p, "-o md");
    const bool fits = json_is_integer(llc) && weights < json_integer_value(llc);
    CHECK(fits == (strstr(out.p, "note: % of read can exceed 100%") != NULL),
          "the cache footnote is printed exactly when the %lld bytes of weights fit in the "
          "%lld-byte cache:\n%s",
          (long long)weights, (long long)json_integer_value(llc), out.p);
    json_decref(j);

    /* The median: the middle sample of an odd count, the mean of the two middle ones of an even
     * count (computed here from the json's samples, which keep the order they were taken in). */
    for (int reps = 3; reps <= 4; reps++) {
        snprintf(cmd, sizeof cmd, "'%s' perf --model '%s/notok' -t 1 -p 8 -n 2 -r %d --no-bw -o json",
                 LM_LUMEN_BIN, g_dir, reps);
        rc = run(cmd, &out, &err);
        j = rc == 0 ? json_loads(out.p, 0, &je) : NULL;
        CHECK(j != NULL, "perf -r %d -o json: rc %d\n%s", reps, rc, err.p);
        json_t *res = json_object_get(j, "results");
        for (size_t i = 0; i < json_array_size(res); i++) {
            json_t *t = json_object_get(json_array_get(res, i), "tokens_per_s");
            json_t *smp = json_object_get(t, "samples");
            double v[4];
            const int n = (int)json_array_size(smp);
            CHECK(n == reps, "-r %d: %d samples", reps, n);
            if (n != reps) continue;
            for (int k = 0; k < n; k++) v[k] = json_real_value(json_array_get(smp, k));
            for (int a = 0; a < n; a++) /* sort */
                for (int b = a + 1; b < n; b++)
                    if (v[b] < v[a]) {
                        const double tmp = v[a];
                        v[a] = v[b], v[b] = tmp;
                    }
            const double want = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
            const double got = json_real_value(json_object_get(t, "median"));
            CHECK(fabs(got - want) <= 1e-3 * fabs(want) + 1e-3, "-r %d: median %.4f, the samples' %.4f", reps,
                  got, want);
        }
        json_decref(j);
    }

    /* A q8_0 GGUF (tokenizer inside) and LM_CPU_Q8_ACT. */
    snprintf(cmd, sizeof cmd, "'%s' build --model '%s' --out '%s/q8.gguf' --dtype q8_0 >/dev/null",
             LM_LUMEN_BIN, TINY_MODEL, g_dir);
    CHECK(system(cmd) == 0, "%s", cmd);
    static const struct {
        const char *value, *path;
        bool warns;
    } k_cases[] = {{"", "int8", false},         {"0", "dequant", false},  {"off", "dequant", false},
                   {"FALSE", "dequant", false}, {"No", "dequant", false}, {"1", "int8", false},
                   {"On", "int8", false},       {"true", "int8", false},  {"off-ish", "int8", true},
                   {"2", "int8", true}};
    for (size_t i = 0; i < sizeof k_cases / sizeof *k_cases; i++) {
        snprintf(cmd, sizeof cmd,
                 "LM_CPU_Q8_ACT='%s' '%s' perf --model '%s/q8.gguf' -t 1 -p 8 -n 2 -r 1 --no-bw",
                 k_cases[i].value, LM_LUMEN_BIN, g_dir);
        rc = run(cmd, &out, &err);
        char want[64];
        snprintf(want, sizeof want, "q8_0 matmul: %s\n", k_cases[i].path);
        CHECK(rc == 0 && strstr(out.p, want), "LM_CPU_Q8_ACT='%s': rc %d, want '%s'\n%s%s",
              k_cases[i].value, rc, k_cases[i].path, out.p, err.p);
        char warning[128];
        snprintf(warning, sizeof warning, "LM_CPU_Q8_ACT=%s is not a switch value",
                 k_cases[i].value);
        const char *w = strstr(err.p, warning);
        CHECK(k_cases[i].warns ? w && !strstr(w + 1, warning) && strstr(err.p, "0/1, off/on")
                               : !strstr(err.p, "LM_CPU_Q8_ACT"),
              "LM_CPU_Q8_ACT='%s': %s one warning, stderr:\n%s", k_cases[i].value,
              k_cases[i].warns ? "wants" : "wants no", err.p);
        if (i == 0) check_table(out.p, "gguf q8_0");
    }

    /* `lumen logits` reads and writes ids only: the folder without a tokenizer runs, and a --top-k
     * above vocab_size is refused with the limit named (it used to be cut to vocab_size). */
    snprintf(cmd, sizeof cmd, "echo '[1,2,3]' | '%s' logits --model '%s/notok' --top-k 2 --threads 1", LM_LUMEN_BIN, g_dir);
    rc = run(cmd, &out, &err);
    CHECK(rc == 0 && strstr(out.p, "{\"ids\":[") && strstr(strstr(out.p, "{\"ids\":[") + 1, "{\"ids\":["),
          "logits without a tokenizer: rc %d\n%s%s", rc, out.p, err.p);
    snprintf(cmd, sizeof cmd, "echo '[1,2,3]' | '%s' logits --model '%s/notok' --top-k 999999 --threads 1", LM_LUMEN_BIN,
             g_dir);
    rc = run(cmd, &out, &err);
    CHECK(rc == 2 && strstr(err.p, "--top-k 999999 exceeds the model's vocab_size 151936"),
          "logits --top-k above vocab_size: rc %d, stderr:\n%s", rc, err.p);

    lm_buf_free(&out);
    lm_buf_free(&err);
    return cli_finish(g_dir, "test_perf");
}
