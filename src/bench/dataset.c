/* dataset.c: see dataset.h. */
#include "bench/dataset.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/file.h"
#include "base/json.h"

static char *xstrdup(const char *s) {
    char *d = strdup(s);
    if (!d) abort();
    return d;
}

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (!p) abort();
    return p;
}

static struct lm_bench_conversation *push_conv(struct lm_bench_dataset *ds, size_t *cap) {
    if (ds->n == *cap) {
        *cap = *cap ? *cap * 2 : 64;
        ds->convs = realloc(ds->convs, *cap * sizeof *ds->convs);
        if (!ds->convs) abort();
    }
    struct lm_bench_conversation *c = &ds->convs[ds->n++];
    memset(c, 0, sizeof *c);
    return c;
}

static void conv_free(struct lm_bench_conversation *c) {
    for (size_t i = 0; i < c->n_turns; i++) {
        free(c->turns[i]);
        if (c->answers) free(c->answers[i]);
    }
    free(c->turns);
    free(c->answers);
    free(c->id);
    free(c->category);
    free(c->system);
    memset(c, 0, sizeof *c);
}

/* MT-Bench / Spec-Bench question.jsonl. */
static lm_status load_questions_jsonl(struct lm_bench_dataset *ds, const char *path,
                                      const char *text, size_t len) {
    size_t cap = 0, line_no = 0;
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        line_no++;
        const char *q = p;
        while (q < le && (*q == ' ' || *q == '\t' || *q == '\r')) q++;
        if (q < le) {
            json_error_t e;
            json_t *o = json_loadb(p, (size_t)(le - p), 0, &e);
            if (!o)
                return lm_errorf(LM_ERR_FORMAT, "%s:%zu: invalid JSON at column %d: %s", path,
                                 line_no, e.column, e.text);
            json_t *turns = json_object_get(o, "turns");
            if (!json_is_array(turns) || json_array_size(turns) == 0) {
                json_decref(o);
                return lm_errorf(LM_ERR_FORMAT, "%s:%zu: turns: expected a non-empty array of strings",
                                 path, line_no);
            }
            struct lm_bench_conversation *c = push_conv(ds, &cap);
            size_t nt = json_array_size(turns);
            c->turns = xcalloc(nt, sizeof *c->turns);
            c->answers = xcalloc(nt, sizeof *c->answers);
            for (size_t i = 0; i < nt; i++) {
                json_t *t = json_array_get(turns, i);
                if (!json_is_string(t)) {
                    json_decref(o);
                    return lm_errorf(LM_ERR_FORMAT, "%s:%zu: turns[%zu]: expected a string", path,
                                     line_no, i);
                }
                c->turns[i] = xstrdup(json_string_value(t));
                c->n_turns = i + 1;
            }
            json_t *id = json_object_get(o, "question_id");
            struct lm_buf b = {0};
            if (json_is_integer(id))
                lm_buf_printf(&b, "%lld", (long long)json_integer_value(id));
            else if (json_is_string(id))
                lm_buf_puts(&b, json_string_value(id));
            else
                lm_buf_printf(&b, "line%zu", line_no);
            c->id = lm_buf_take(&b);
            json_t *cat = json_object_get(o, "category");
            if (json_is_string(cat)) c->category = xstrdup(json_string_value(cat));
            json_decref(o);
        }
        p = nl ? nl + 1 : end;
    }
    return LM_OK;
}

/* ShareGPT V3: [{"id": str, "conversations": [{"from": ..., "value": ...}, ...]}, ...]. */
static lm_status load_sharegpt(struct lm_bench_dataset *ds, const char *path, const char *text,
                               size_t len) {
    json_error_t e;
    json_t *root = json_loadb(text, len, 0, &e);
    if (!root)
        return lm_errorf(LM_ERR_FORMAT, "%s: invalid JSON at line %d column %d: %s", path, e.line,
                         e.column, e.text);
    if (!json_is_array(root)) {
        json_decref(root);
        return lm_errorf(LM_ERR_FORMAT, "%s: expected a JSON list of conversations", path);
    }
    size_t cap = 0, i;
    json_t *item;
    lm_status st = LM_OK;
    json_array_foreach(root, i, item) {
        json_t *msgs = json_object_get(item, "conversations");
        if (!json_is_array(msgs)) {
            st = lm_errorf(LM_ERR_FORMAT, "%s: [%zu].conversations: expected a list", path, i);
            break;
        }
        size_t nm = json_array_size(msgs), nh = 0;
        for (size_t k = 0; k < nm; k++) {
            const char *from = json_string_value(json_object_get(json_array_get(msgs, k), "from"));
            if (from && !strcmp(from, "human")) nh++;
        }
        if (nh == 0) continue;
        struct lm_bench_conversation *c = push_conv(ds, &cap);
        c->turns = xcalloc(nh, sizeof *c->turns);
        c->answers = xcalloc(nh, sizeof *c->answers);
        for (size_t k = 0; k < nm && st == LM_OK; k++) {
            json_t *m = json_array_get(msgs, k);
            const char *from = json_string_value(json_object_get(m, "from"));
            const char *value = json_string_value(json_object_get(m, "value"));
            if (!from || !value) {
                st = lm_errorf(LM_ERR_FORMAT,
                               "%s: [%zu].conversations[%zu]: expected string \"from\" and \"value\"",
                               path, i, k);
            } else if (!strcmp(from, "human")) {
                c->turns[c->n_turns++] = xstrdup(value);
            } else if (!strcmp(from, "gpt")) {
                /* an answer before the first human turn belongs to a chunk we do not have */
                if (c->n_turns && !c->answers[c->n_turns - 1])
                    c->answers[c->n_turns - 1] = xstrdup(value);
            } else if (!strcmp(from, "system")) {
                if (!c->system) c->system = xstrdup(value);
            }
        }
        if (st) break;
        const char *id = json_string_value(json_object_get(item, "id"));
        struct lm_buf b = {0};
        if (id)
            lm_buf_puts(&b, id);
        else
            lm_buf_printf(&b, "%zu", i);
        c->id = lm_buf_take(&b);
    }
    json_decref(root);
    return st;
}

const char *lm_bench_dataset_default_path(const char *name) {
    if (!strcmp(name, "mt_bench")) return "data/mt_bench/question.jsonl";
    if (!strcmp(name, "spec_bench")) return "data/spec_bench/question.jsonl";
    if (!strcmp(name, "sharegpt")) return "data/sharegpt/sharegpt_v3_sample1000.json";
    return NULL;
}

lm_status lm_bench_dataset_load(struct lm_bench_dataset *ds, const char *name, const char *path) {
    memset(ds, 0, sizeof *ds);
    if (!lm_bench_dataset_default_path(name))
        return lm_errorf(LM_ERR_UNSUPPORTED,
                         "unknown dataset '%s' (known: mt_bench, spec_bench, sharegpt)", name);
    ds->name = xstrdup(name);
    ds->path = xstrdup(path);
    struct lm_buf text = {0};
    lm_status st = lm_file_read(path, &text);
    if (st) return st;
    if (!strcmp(name, "sharegpt"))
        st = load_sharegpt(ds, path, text.p ? text.p : "", text.len);
    else
        st = load_questions_jsonl(ds, path, text.p ? text.p : "", text.len);
    lm_buf_free(&text);
    if (!st && ds->n == 0) st = lm_errorf(LM_ERR_MISSING, "%s: no conversations", path);
    return st;
}

void lm_bench_dataset_free(struct lm_bench_dataset *ds) {
    if (!ds) return;
    for (size_t i = 0; i < ds->n; i++) conv_free(&ds->convs[i]);
    free(ds->convs);
    free(ds->name);
    free(ds->path);
    memset(ds, 0, sizeof *ds);
}
