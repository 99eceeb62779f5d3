/* dataset.c: see dataset.h. */
#include "bench/dataset.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/file.h"
#include "bench/prompt.h"
#include "bench/rng.h"
#include "family/chat.h"
#include "text/tokenizer.h"

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

struct lm_bench_dataset_opts lm_bench_dataset_default_opts(void) {
    return (struct lm_bench_dataset_opts){
        .turns = 2,
        .max_tokens = 128,
        .enable_thinking = -1,
        .synthetic_conversations = 100,
        .synthetic_turns = 1,
        .isl_mean = 128,
    };
}

static struct lm_bench_conversation *push_conv(struct lm_bench_dataset *ds, size_t *cap) {
    if (ds->n == *cap) {
        *cap = *cap ? *cap * 2 : 64;
        ds->convs = realloc(ds->convs, *cap * sizeof *ds->convs);
        if (!ds->convs) abort();
    }
    struct lm_bench_conversation *c = &ds->convs[ds->n++];
    memset(c, 0, sizeof *c);
    c->history_tokens = -1;
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

/* One ledger entry; returns it (borrowed) for extra fields. */
static json_t *ledger_add(struct lm_bench_dataset *ds, size_t index, const char *id,
                          const char *reason) {
    json_t *e = json_object();
    json_object_set_new(e, "index", json_integer((json_int_t)index));
    json_object_set_new(e, "id", json_string(id ? id : ""));
    json_object_set_new(e, "status", json_string(reason ? "rejected" : "selected"));
    json_object_set_new(e, "reason", reason ? json_string(reason) : json_null());
    json_array_append_new(ds->ledger, e);
    if (reason) {
        json_t *c = json_object_get(ds->rejected, reason);
        json_object_set_new(ds->rejected, reason, json_integer(c ? json_integer_value(c) + 1 : 1));
    }
    return e;
}

/* Does a comma-separated list hold `word`? */
static bool in_list(const char *list, const char *word) {
    if (!word) return false;
    size_t n = strlen(word);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, word, n)) return true;
        if (!e) break;
        p = e + 1;
    }
    return false;
}

/* Spec-Bench's task of a question: its first 80 are MT-Bench's. */
static const char *spec_task(const char *category) {
    static const char *mt[] = {"writing", "roleplay",   "reasoning", "math",
                               "coding",  "extraction", "stem",      "humanities"};
    for (size_t i = 0; i < sizeof mt / sizeof mt[0]; i++)
        if (category && !strcmp(category, mt[i])) return "mt_bench";
    return category;
}

/* MT-Bench / Spec-Bench question.jsonl, and custom JSONL. */
static lm_status load_jsonl(struct lm_bench_dataset *ds, const struct lm_bench_dataset_opts *o,
                            const char *text, size_t len) {
    const char *path = ds->path;
    bool custom = !strcmp(o->name, "custom");
    size_t cap = 0, line_no = 0;
    const char *p = text, *end = text + len;
    lm_status st = LM_OK;
    while (p < end && !st) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        line_no++;
        const char *q = p;
        while (q < le && (*q == ' ' || *q == '\t' || *q == '\r'))
            q++;
        p = nl ? nl + 1 : end;
        if (q == le) continue;
        json_error_t e;
        json_t *obj = json_loadb(q, (size_t)(le - q), 0, &e);
        if (!obj)
            return lm_errorf(LM_ERR_FORMAT, "%s:%zu: invalid JSON at column %d: %s", path, line_no,
                             e.column, e.text);
        size_t index = ds->n_considered++;
        struct lm_buf idb = {0};
        json_t *id = json_object_get(obj, custom ? "id" : "question_id");
        if (json_is_integer(id))
            lm_buf_printf(&idb, "%lld", (long long)json_integer_value(id));
        else if (json_is_string(id))
            lm_buf_puts(&idb, json_string_value(id));
        else
            lm_buf_printf(&idb, "line%zu", line_no);
        const char *cat = json_string_value(json_object_get(obj, "category"));
        json_t *turns = json_object_get(obj, "turns");
        json_t *msgs = custom ? json_object_get(obj, "messages") : NULL;
        /* AIPerf's single-turn custom line, {"text": "..."}: one user turn */
        const char *single = custom && !json_is_array(msgs) && !json_is_array(turns)
                                 ? json_string_value(json_object_get(obj, "text"))
                                 : NULL;
        size_t nt = single ? 1 : 0;
        if (json_is_array(msgs)) {
            size_t k;
            json_t *m;
            json_array_foreach(msgs, k, m) {
                const char *role = json_string_value(json_object_get(m, "role"));
                if (role && !strcmp(role, "user")) nt++;
            }
        } else if (json_is_array(turns)) {
            nt = json_array_size(turns);
        }
        if (nt == 0) {
            st = lm_errorf(LM_ERR_FORMAT, "%s:%zu: %s", path, line_no,
                           custom ? "expected \"turns\" or \"messages\" (a non-empty array, with a user "
                                    "message) or \"text\" (a string)"
                                  : "turns: expected a non-empty array");
        } else if (o->categories && *o->categories && !in_list(o->categories, cat) &&
                   !in_list(o->categories, spec_task(cat))) {
            json_t *le_ = ledger_add(ds, index, idb.p, "category");
            json_object_set_new(le_, "category", cat ? json_string(cat) : json_null());
        } else {
            struct lm_bench_conversation *c = push_conv(ds, &cap);
            c->turns = xcalloc(nt, sizeof *c->turns);
            c->answers = xcalloc(nt, sizeof *c->answers);
            c->id = xstrdup(idb.p ? idb.p : "");
            if (cat) c->category = xstrdup(cat);
            if (json_is_array(msgs)) {
                size_t k;
                json_t *m;
                json_array_foreach(msgs, k, m) {
                    const char *role = json_string_value(json_object_get(m, "role"));
                    const char *content = json_string_value(json_object_get(m, "content"));
                    if (!role || !content) {
                        st = lm_errorf(LM_ERR_FORMAT,
                                       "%s:%zu: messages[%zu]: expected string role and content",
                                       path, line_no, k);
                        break;
                    }
                    /* the roles a request takes (the server's: "developer" is "system") */
                    enum lm_chat_role rl;
                    const bool known = lm_chat_role_parse(role, &rl);
                    if (known && rl == LM_ROLE_USER) {
                        c->turns[c->n_turns++] = xstrdup(content);
                    } else if (known && rl == LM_ROLE_ASSISTANT) {
                        if (c->n_turns && !c->answers[c->n_turns - 1])
                            c->answers[c->n_turns - 1] = xstrdup(content);
                    } else if (known && rl == LM_ROLE_SYSTEM) {
                        if (!c->system) c->system = xstrdup(content);
                    } else {
                        st = lm_errorf(LM_ERR_FORMAT,
                                       "%s:%zu: messages[%zu].role: '%s' is not "
                                       "system, developer, user or assistant",
                                       path, line_no, k, role);
                        break;
                    }
                }
            } else if (single) {
                c->turns[c->n_turns++] = xstrdup(single);
            } else {
                for (size_t i = 0; i < nt; i++) {
                    json_t *t = json_array_get(turns, i);
                    if (!json_is_string(t)) {
                        st = lm_errorf(LM_ERR_FORMAT, "%s:%zu: turns[%zu]: expected a string", path,
                                       line_no, i);
                        break;
                    }
                    c->turns[c->n_turns++] = xstrdup(json_string_value(t));
                }
            }
            const char *sys = json_string_value(json_object_get(obj, "system"));
            if (sys && !c->system) c->system = xstrdup(sys);
            json_t *mt = json_object_get(obj, "max_tokens");
            if (json_is_integer(mt)) c->max_tokens = (int)json_integer_value(mt);
            if (!st && c->n_turns == 0)
                st = lm_errorf(LM_ERR_FORMAT, "%s:%zu: no user turn", path, line_no);
            json_t *le_ = ledger_add(ds, index, c->id, NULL);
            json_object_set_new(le_, "turns", json_integer((json_int_t)c->n_turns));
            if (cat) json_object_set_new(le_, "category", json_string(cat));
        }
        lm_buf_free(&idb);
        json_decref(obj);
    }
    return st;
}

static bool blank(const char *s) {
    for (; *s; s++)
        if (!isspace((unsigned char)*s)) return false;
    return true;
}

/* ShareGPT V3 with selection (see dataset.h). */
static lm_status load_sharegpt(struct lm_bench_dataset *ds, const struct lm_bench_dataset_opts *o,
                               const char *text, size_t len) {
    const char *path = ds->path;
    json_error_t e;
    json_t *root = json_loadb(text, len, 0, &e);
    if (!root)
        return lm_errorf(LM_ERR_FORMAT, "%s: invalid JSON at line %d column %d: %s", path, e.line,
                         e.column, e.text);
    if (!json_is_array(root)) {
        json_decref(root);
        return lm_errorf(LM_ERR_FORMAT, "%s: expected a JSON list of conversations", path);
    }
    long context = o->context_tokens > 0           ? o->context_tokens
                   : o->prompt->context_tokens > 0 ? o->prompt->context_tokens
                                                   : 4096;
    int want = o->turns;
    struct lm_buf sel = {0};
    if (want)
        lm_buf_printf(&sel,
                      "sharegpt: conversations whose messages alternate human, gpt, human, "
                      "... for %d human turns, none empty, whose rendered history (corpus "
                      "answers) plus answer headroom (max_tokens %d) fits %ld tokens",
                      want, o->max_tokens, context);
    else
        lm_buf_printf(&sel,
                      "sharegpt: conversations with all their alternating human turns, none "
                      "empty, whose rendered history (corpus answers) plus answer headroom "
                      "(max_tokens %d) fits %ld tokens",
                      o->max_tokens, context);
    ds->selection = lm_buf_take(&sel);
    size_t cap = 0, i;
    json_t *item;
    lm_status st = LM_OK;
    struct lm_ids ids = {0};
    json_array_foreach(root, i, item) {
        ds->n_considered++;
        json_t *msgs = json_object_get(item, "conversations");
        const char *idv = json_string_value(json_object_get(item, "id"));
        char idbuf[32];
        if (!idv) snprintf(idbuf, sizeof idbuf, "%zu", i), idv = idbuf;
        if (!json_is_array(msgs)) {
            st = lm_errorf(LM_ERR_FORMAT, "%s: [%zu].conversations: expected a list", path, i);
            break;
        }
        size_t nm = json_array_size(msgs), k = 0;
        const char *system = NULL;
        for (size_t j = 0; j < nm; j++) {
            json_t *m = json_array_get(msgs, j);
            if (!json_is_string(json_object_get(m, "from")) ||
                !json_is_string(json_object_get(m, "value"))) {
                st = lm_errorf(
                    LM_ERR_FORMAT,
                    "%s: [%zu].conversations[%zu]: expected string \"from\" and \"value\"", path, i,
                    j);
                break;
            }
        }
        if (st) break;
        const char *from0 =
            nm ? json_string_value(json_object_get(json_array_get(msgs, 0), "from")) : "";
        if (!strcmp(from0, "system")) {
            system = json_string_value(json_object_get(json_array_get(msgs, 0), "value"));
            k = 1;
        }
        /* the alternating prefix: human at even offsets from k, gpt at odd ones */
        size_t n_human = 0, last = k; /* messages k .. last-1 alternate */
        bool empty = false;
        for (size_t j = k; j < nm; j++) {
            json_t *m = json_array_get(msgs, j);
            const char *from = json_string_value(json_object_get(m, "from"));
            bool human_slot = (j - k) % 2 == 0;
            if (strcmp(from, human_slot ? "human" : "gpt")) break;
            if (human_slot) n_human++;
            if (blank(json_string_value(json_object_get(m, "value")))) empty = true;
            last = j + 1;
            if (want && human_slot && n_human == (size_t)want) break;
        }
        if (last > k && (last - k) % 2 == 0) last--; /* end on a human turn */
        const char *reason = NULL;
        const char *first =
            k < nm ? json_string_value(json_object_get(json_array_get(msgs, k), "from")) : "";
        if (strcmp(first, "human"))
            reason = k < nm && !strcmp(first, "gpt") ? "starts_with_gpt" : "too_few_turns";
        else if (want ? n_human < (size_t)want : n_human < 1)
            reason = "too_few_turns";
        else if (empty)
            reason = "empty_turn";
        json_t *entry = NULL;
        if (reason) {
            entry = ledger_add(ds, i, idv, reason);
            json_object_set_new(entry, "human_turns_alternating",
                                json_integer((json_int_t)n_human));
            continue;
        }
        /* the history the last turn sends, with the corpus answers, and the headroom */
        json_t *hist = json_array();
        if (system)
            json_array_append_new(hist,
                                  json_pack("{s:s,s:s}", "role", "system", "content", system));
        long headroom = o->max_tokens;
        for (size_t j = k; j < last; j++) {
            json_t *m = json_array_get(msgs, j);
            const char *v = json_string_value(json_object_get(m, "value"));
            bool human = (j - k) % 2 == 0;
            json_array_append_new(
                hist, json_pack("{s:s,s:s}", "role", human ? "user" : "assistant", "content", v));
            if (!human) {
                long t = lm_bench_prompt_count(o->prompt, v, strlen(v));
                if (t < o->max_tokens) headroom += o->max_tokens - t;
            }
        }
        ids.n = 0;
        st = lm_bench_prompt_render_ids(o->prompt, hist, o->enable_thinking, &ids);
        json_decref(hist);
        if (st) {
            st = lm_error_prefix(st, "%s: [%zu]", path, i);
            break;
        }
        long need = (long)ids.n + headroom;
        bool fits = need <= context;
        entry = ledger_add(ds, i, idv, fits ? NULL : "too_long");
        json_object_set_new(entry, "human_turns", json_integer((json_int_t)n_human));
        json_object_set_new(entry, "history_tokens", json_integer((json_int_t)ids.n));
        json_object_set_new(entry, "headroom_tokens", json_integer(headroom));
        json_object_set_new(entry, "needed_tokens", json_integer(need));
        json_object_set_new(entry, "context_tokens", json_integer(context));
        if (!fits) continue;
        struct lm_bench_conversation *c = push_conv(ds, &cap);
        c->id = xstrdup(idv);
        c->history_tokens = (long)ids.n;
        if (system) c->system = xstrdup(system);
        c->turns = xcalloc(n_human, sizeof *c->turns);
        c->answers = xcalloc(n_human, sizeof *c->answers);
        for (size_t j = k; j < last; j++) {
            const char *v = json_string_value(json_object_get(json_array_get(msgs, j), "value"));
            if ((j - k) % 2 == 0)
                c->turns[c->n_turns++] = xstrdup(v);
            else
                c->answers[c->n_turns - 1] = xstrdup(v);
        }
    }
    lm_ids_free(&ids);
    json_decref(root);
    return st;
}

/* Synthetic prompts from the vocabulary (see dataset.h). */
static lm_status make_synthetic(struct lm_bench_dataset *ds,
                                const struct lm_bench_dataset_opts *o) {
    const struct lm_tokenizer *tok = o->prompt->tok;
    size_t nv = lm_tokenizer_vocab_size(tok);
    int32_t *words = malloc(nv * sizeof *words);
    if (!words) abort();
    size_t nw = 0;
    struct lm_buf b = {0};
    struct lm_ids ids = {0};
    for (size_t id = 0; id < nv; id++) {
        if (lm_tokenizer_is_special(tok, (int32_t)id)) continue;
        lm_buf_reset(&b);
        int32_t i32 = (int32_t)id;
        if (lm_tokenizer_decode(tok, &i32, 1, true, &b) || b.len < 4 || b.p[0] != ' ') continue;
        bool ok = true;
        for (size_t k = 1; k < b.len && ok; k++)
            ok = b.p[k] >= 'a' && b.p[k] <= 'z';
        if (!ok) continue;
        /* keep only words that encode back to this one id (BPE cannot reach every vocab entry) */
        ids.n = 0;
        lm_tokenizer_encode(tok, b.p, b.len, LM_ENCODE_SPECIAL_AS_TEXT, &ids);
        if (ids.n == 1 && ids.v[0] == (int32_t)id) words[nw++] = (int32_t)id;
    }
    lm_ids_free(&ids);
    if (nw < 16) {
        free(words);
        lm_buf_free(&b);
        return lm_errorf(LM_ERR_INVALID, "%s: the vocabulary has only %zu plain-word tokens",
                         o->prompt->dir, nw);
    }
    struct lm_buf sel = {0};
    lm_buf_printf(&sel,
                  "synthetic: %zu conversations x %d turns, input tokens ~ normal(%g, %g), "
                  "output tokens ~ normal(%g, %g), words from %zu vocabulary tokens, seed %llu",
                  o->synthetic_conversations, o->synthetic_turns, o->isl_mean, o->isl_std,
                  o->osl_mean, o->osl_std, nw, (unsigned long long)o->seed);
    ds->selection = lm_buf_take(&sel);
    uint64_t rng = o->seed ^ 0x73796e7468657469ull;
    size_t cap = 0;
    for (size_t ci = 0; ci < o->synthetic_conversations; ci++) {
        struct lm_bench_conversation *c = push_conv(ds, &cap);
        char id[32];
        snprintf(id, sizeof id, "synthetic-%zu", ci);
        c->id = xstrdup(id);
        int nt = o->synthetic_turns > 0 ? o->synthetic_turns : 1;
        c->turns = xcalloc((size_t)nt, sizeof *c->turns);
        c->answers = xcalloc((size_t)nt, sizeof *c->answers);
        for (int t = 0; t < nt; t++) {
            long n = lround(lm_bench_rng_normal(&rng, o->isl_mean, o->isl_std));
            if (n < 1) n = 1;
            lm_buf_reset(&b);
            for (long k = 0; k < n; k++) {
                int32_t w = words[lm_bench_rng_next(&rng) % nw];
                lm_tokenizer_decode(tok, &w, 1, true, &b);
            }
            c->turns[c->n_turns++] = xstrdup(b.p); /* " word word ...": one token per word */
        }
        if (o->osl_mean > 0) {
            long m = lround(lm_bench_rng_normal(&rng, o->osl_mean, o->osl_std));
            c->max_tokens = m < 1 ? 1 : (int)m;
        }
        ds->n_considered++;
        json_t *e = ledger_add(ds, ci, id, NULL);
        json_object_set_new(e, "turns", json_integer(nt));
        if (c->max_tokens) json_object_set_new(e, "max_tokens", json_integer(c->max_tokens));
    }
    free(words);
    lm_buf_free(&b);
    return LM_OK;
}

const char *lm_bench_dataset_default_path(const char *name) {
    if (!strcmp(name, "mt_bench")) return "data/mt_bench/question.jsonl";
    if (!strcmp(name, "spec_bench")) return "data/spec_bench/question.jsonl";
    if (!strcmp(name, "sharegpt")) return "data/sharegpt/sharegpt_v3_sample1000.json";
    if (!strcmp(name, "synthetic") || !strcmp(name, "custom")) return NULL;
    return "";
}

lm_status lm_bench_dataset_open(struct lm_bench_dataset *ds,
                                const struct lm_bench_dataset_opts *o) {
    memset(ds, 0, sizeof *ds);
    const char *def = lm_bench_dataset_default_path(o->name);
    if (def && !*def)
        return lm_errorf(LM_ERR_UNSUPPORTED,
                         "unknown dataset '%s' (known: mt_bench, spec_bench, sharegpt, synthetic, "
                         "custom)",
                         o->name);
    ds->name = xstrdup(o->name);
    ds->ledger = json_array();
    ds->rejected = json_object();
    bool synthetic = !strcmp(o->name, "synthetic");
    if ((synthetic || !strcmp(o->name, "sharegpt")) && (!o->prompt || !o->prompt->tok))
        return lm_errorf(LM_ERR_INVALID, "dataset %s needs the model's tokenizer (--tokenizer)",
                         o->name);
    if (synthetic) {
        lm_status st = make_synthetic(ds, o);
        if (!st && ds->n == 0) st = lm_errorf(LM_ERR_MISSING, "synthetic: no conversations");
        return st;
    }
    if (!o->path) return lm_errorf(LM_ERR_INVALID, "dataset %s: no file given", o->name);
    ds->path = xstrdup(o->path);
    if (!strcmp(o->name, "sharegpt") && !lm_bench_prompt_can_render(o->prompt))
        return lm_errorf(LM_ERR_INVALID,
                         "dataset sharegpt: %s has no chat template to count histories with (its "
                         "config.json must name a known model_type)",
                         o->prompt->dir);
    lm_status st = lm_bench_sha256_file(o->path, ds->sha256, &ds->file_bytes);
    if (st) return st;
    struct lm_buf text = {0};
    st = lm_file_read(o->path, &text);
    if (st) return st;
    if (!strcmp(o->name, "sharegpt")) {
        st = load_sharegpt(ds, o, text.p ? text.p : "", text.len);
    } else {
        st = load_jsonl(ds, o, text.p ? text.p : "", text.len);
        struct lm_buf sel = {0};
        lm_buf_printf(&sel, "%s: every conversation in file order%s%s", o->name,
                      o->categories && *o->categories ? ", categories/tasks " : "",
                      o->categories && *o->categories ? o->categories : "");
        ds->selection = lm_buf_take(&sel);
    }
    lm_buf_free(&text);
    if (!st && ds->n == 0 && ds->n_considered == 0 && o->path) {
        st = lm_errorf(LM_ERR_MISSING, "%s: no conversation in the file (no non-blank line)", o->path);
    } else if (!st && ds->n == 0) {
        char *r = json_dumps(ds->rejected, JSON_COMPACT);
        st = lm_errorf(LM_ERR_MISSING, "%s: no conversation selected out of %zu (rejected: %s)",
                       o->path, ds->n_considered, r ? r : "{}");
        free(r);
    }
    return st;
}

lm_status lm_bench_dataset_load(struct lm_bench_dataset *ds, const char *name, const char *path) {
    struct lm_bench_dataset_opts o = lm_bench_dataset_default_opts();
    o.name = name;
    o.path = path;
    return lm_bench_dataset_open(ds, &o);
}

lm_status lm_bench_dataset_write_ledger(const struct lm_bench_dataset *ds, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return lm_errorf(LM_ERR_IO, "%s: cannot create: %m", path);
    size_t i;
    json_t *e;
    json_array_foreach(ds->ledger, i, e) {
        char *line = json_dumps(e, JSON_COMPACT);
        if (line) fprintf(f, "%s\n", line);
        free(line);
    }
    if (fclose(f)) return lm_errorf(LM_ERR_IO, "%s: write failed: %m", path);
    return LM_OK;
}

void lm_bench_dataset_free(struct lm_bench_dataset *ds) {
    if (!ds) return;
    for (size_t i = 0; i < ds->n; i++)
        conv_free(&ds->convs[i]);
    free(ds->convs);
    free(ds->name);
    free(ds->path);
    free(ds->selection);
    json_decref(ds->ledger);
    json_decref(ds->rejected);
    memset(ds, 0, sizeof *ds);
}
