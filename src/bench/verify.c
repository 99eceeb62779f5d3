/* verify.c: see verify.h. */
#include "bench/verify.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/buf.h"
#include "base/file.h"
#include "bench/client.h"
#include "bench/digest.h"
#include "bench/prompt.h"
#include "text/tokenizer.h"

static const char *const k_check_names[LM_BENCH_CHECK_COUNT] = {
    "joined",
    "identity",
    "roles",
    "user_content",
    "history",
    "prompt_tokens",
    "prompt_ids",
    "completion",
    "completion_ids",
    "server_times",
    "conversations_complete",
    "warmup_apart",
};

const char *lm_bench_check_name(enum lm_bench_check c) {
    return k_check_names[c];
}

void lm_bench_verification_free(struct lm_bench_verification *v) {
    if (!v) return;
    free(v->path);
    free(v->error);
    json_decref(v->issues);
    memset(v, 0, sizeof *v);
}

static void issue(struct lm_bench_verification *v, struct lm_bench_record *r, const char *rid,
                  enum lm_bench_check c, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static void issue(struct lm_bench_verification *v, struct lm_bench_record *r, const char *rid,
                  enum lm_bench_check c, const char *fmt, ...) {
    struct lm_buf b = {0};
    va_list ap;
    va_start(ap, fmt);
    lm_buf_vprintf(&b, fmt, ap);
    va_end(ap);
    json_array_append_new(v->issues,
                          json_pack("{s:s,s:s,s:s}", "request_id", rid ? rid : "", "check",
                                    k_check_names[c], "detail", b.p ? b.p : ""));
    if (r) lm_bench_record_issue(r, k_check_names[c], "%s", b.p ? b.p : "");
    lm_buf_free(&b);
}

static const char *sget(json_t *o, const char *key) {
    return json_string_value(json_object_get(o, key));
}

static double nget(json_t *o, const char *key) {
    json_t *x = json_object_get(o, key);
    return json_is_number(x) ? json_number_value(x) : NAN;
}

static void sha_of(const char *s, size_t n, char hex[LM_SHA256_HEX]) {
    lm_bench_sha256_hex(s, n, hex);
}

/* One check outcome for a request. */
static void tally(struct lm_bench_verification *v, enum lm_bench_check c, int outcome) {
    if (outcome > 0)
        v->passed[c]++;
    else if (outcome < 0)
        v->failed[c]++;
    else
        v->unavailable[c]++;
}

static const char *phase_name(enum lm_bench_phase p) {
    return p == LM_BENCH_PHASE_WARMUP ? "warmup" : "profiling";
}

/* The original strings of a conversation: system (may be NULL) and the user turns. */
static const struct lm_bench_conversation *find_conv(const struct lm_bench_dataset *ds,
                                                     json_t *index, const char *id) {
    if (!ds || !id) return NULL;
    json_t *i = json_object_get(index, id);
    return json_is_integer(i) ? &ds->convs[json_integer_value(i)] : NULL;
}

static void check_request(struct lm_bench_verification *v, struct lm_bench_run *run,
                          const struct lm_bench_dataset *ds, json_t *conv_index, json_t *by_turn,
                          const struct lm_bench_prompt *render, struct lm_bench_record *r) {
    json_t *sr = r->server_record;
    const char *rid = r->request_id;
    char hex[LM_SHA256_HEX];

    /* A request the client gave up on (--timeout-s, or cancelled in flight when the run was
     * interrupted: client.h) ends on the server as the client's disconnect: 499 and "cancelled"
     * (RECORDS.md), noticed after the client stopped its clock. Neither is a disagreement. */
    const bool abandoned = r->error == LM_BENCH_ERR_TIMEOUT || r->cancelled;

    /* identity */
    int ok = 1;
    const char *s;
    if ((s = sget(sr, "conversation_id")) && strcmp(s, r->conversation_id))
        ok = -1, issue(v, r, rid, LM_BENCH_CHECK_IDENTITY, "conversation_id '%s', sent '%s'", s,
                       r->conversation_id);
    if ((s = sget(sr, "phase")) && strcmp(s, phase_name(r->phase)))
        ok = -1,
        issue(v, r, rid, LM_BENCH_CHECK_IDENTITY, "phase '%s', sent '%s'", s, phase_name(r->phase));
    json_t *turn = json_object_get(sr, "turn");
    if (json_is_integer(turn) && json_integer_value(turn) != r->turn - 1)
        ok = -1, issue(v, r, rid, LM_BENCH_CHECK_IDENTITY, "turn %lld, sent %d (0-based)",
                       (long long)json_integer_value(turn), r->turn - 1);
    json_t *hs = json_object_get(sr, "http_status");
    if (json_is_integer(hs) && json_integer_value(hs) != r->http_status &&
        !(abandoned && json_integer_value(hs) == 499))
        ok = -1, issue(v, r, rid, LM_BENCH_CHECK_IDENTITY, "http_status %lld, the client got %ld",
                       (long long)json_integer_value(hs), r->http_status);
    if ((s = sget(sr, "id")) && r->server_id && strcmp(s, r->server_id))
        ok = -1, issue(v, r, rid, LM_BENCH_CHECK_IDENTITY,
                       "id '%s', the stream's chunks carried '%s'", s, r->server_id);
    /* Both sides in lumen's words: "cancelled" on the server, "abort" on the wire (or in an
     * older server's records) are the same end. */
    if ((s = lm_bench_finish_word(sget(sr, "finish_reason"))) && r->finish_reason &&
        strcmp(s, r->finish_reason) && !(abandoned && !strcmp(s, "cancelled")))
        ok = -1, issue(v, r, rid, LM_BENCH_CHECK_IDENTITY,
                       "finish_reason '%s', the client got '%s'", s, r->finish_reason);
    if (!sget(sr, "conversation_id") && !sget(sr, "phase") && !json_is_integer(turn)) ok = 0;
    tally(v, LM_BENCH_CHECK_IDENTITY, ok);

    /* roles */
    json_t *roles = json_object_get(sr, "roles");
    size_t nm = json_array_size(r->messages);
    if (!json_is_array(roles)) {
        tally(v, LM_BENCH_CHECK_ROLES, 0);
    } else {
        ok = json_array_size(roles) == nm ? 1 : -1;
        for (size_t i = 0; i < nm && ok > 0; i++) {
            const char *a = json_string_value(json_array_get(roles, i));
            const char *b = sget(json_array_get(r->messages, i), "role");
            if (!a || !b || strcmp(a, b)) ok = -1;
        }
        if (ok < 0) {
            char *a = json_dumps(roles, JSON_COMPACT);
            issue(v, r, rid, LM_BENCH_CHECK_ROLES,
                  "server roles %s differ from the %zu messages sent", a ? a : "?", nm);
            free(a);
        }
        tally(v, LM_BENCH_CHECK_ROLES, ok);
    }

    /* user_content and history */
    json_t *hashes = json_object_get(sr, "content_sha256");
    const struct lm_bench_conversation *conv = find_conv(ds, conv_index, r->dataset_id);
    int user_ok = json_is_array(hashes) && json_array_size(hashes) == nm ? 1 : 0;
    int hist_ok = user_ok, n_assistant = 0, n_user = 0;
    if (json_is_array(hashes) && json_array_size(hashes) != nm) {
        user_ok = hist_ok = -1;
        issue(v, r, rid, LM_BENCH_CHECK_USER_CONTENT, "%zu content hashes for %zu messages sent",
              json_array_size(hashes), nm);
    }
    for (size_t i = 0; i < nm && user_ok >= 0 && json_is_array(hashes); i++) {
        json_t *m = json_array_get(r->messages, i);
        const char *role = sget(m, "role");
        const char *sent = sget(m, "content");
        const char *got = json_string_value(json_array_get(hashes, i));
        if (!strcmp(role, "assistant")) {
            /* the answer the client received in its earlier turn n_assistant + 1 */
            char key[256];
            snprintf(key, sizeof key, "%s#%d", r->conversation_id, n_assistant + 1);
            n_assistant++;
            json_t *pi = json_object_get(by_turn, key);
            struct lm_bench_record *prev =
                json_is_integer(pi) ? &run->records[json_integer_value(pi)] : NULL;
            if (!prev) {
                hist_ok = -1;
                issue(v, r, rid, LM_BENCH_CHECK_HISTORY, "messages[%zu]: no earlier turn %d", i,
                      n_assistant);
                continue;
            }
            const char *recv = prev->content.p ? prev->content.p : "";
            if (!sent || strcmp(sent, recv)) {
                hist_ok = -1;
                issue(v, r, rid, LM_BENCH_CHECK_HISTORY,
                      "messages[%zu]: the client sent an assistant message that differs from the "
                      "answer it received in turn %d",
                      i, n_assistant);
            }
            sha_of(recv, prev->content.len, hex);
            if (!got) {
                if (hist_ok > 0) hist_ok = 0;
            } else if (strcmp(got, hex)) {
                hist_ok = -1;
                issue(v, r, rid, LM_BENCH_CHECK_HISTORY,
                      "messages[%zu]: the server saw assistant content %.12s..., the client "
                      "received %.12s... in turn %d",
                      i, got, hex, n_assistant);
            }
            const char *prev_text = sget(prev->server_record, "completion_text_sha256");
            if (prev_text && !prev->reasoning.len && strcmp(prev_text, hex)) {
                hist_ok = -1;
                issue(v, r, rid, LM_BENCH_CHECK_HISTORY,
                      "messages[%zu]: turn %d's server record says its completion was %.12s..., "
                      "this request's history carries %.12s...",
                      i, n_assistant, prev_text, hex);
            }
        } else {
            const char *orig = sent;
            if (conv) {
                if (!strcmp(role, "system"))
                    orig = conv->system;
                else if ((size_t)n_user < conv->n_turns)
                    orig = conv->turns[n_user];
            }
            if (!strcmp(role, "user")) n_user++;
            if (!orig || !sent || strcmp(orig, sent)) {
                user_ok = -1;
                issue(v, r, rid, LM_BENCH_CHECK_USER_CONTENT,
                      "messages[%zu]: the client sent a %s string that is not the corpus's", i,
                      role);
                continue;
            }
            sha_of(orig, strlen(orig), hex);
            if (!got) {
                if (user_ok > 0) user_ok = 0;
            } else if (strcmp(got, hex)) {
                user_ok = -1;
                issue(v, r, rid, LM_BENCH_CHECK_USER_CONTENT,
                      "messages[%zu] (%s): the server hashed %.12s..., the original is %.12s...", i,
                      role, got, hex);
            }
        }
    }
    tally(v, LM_BENCH_CHECK_USER_CONTENT, user_ok);
    if (n_assistant || hist_ok < 0) tally(v, LM_BENCH_CHECK_HISTORY, hist_ok);

    /* prompt tokens and ids */
    json_t *pt = json_object_get(sr, "prompt_tokens");
    if (render && !r->prompt_ids_sha256[0] && lm_bench_prompt_can_render(render))
        lm_bench_record_render_prompt(r, render, run->enable_thinking);
    if (!json_is_integer(pt)) {
        tally(v, LM_BENCH_CHECK_PROMPT_TOKENS, 0);
    } else {
        long n = (long)json_integer_value(pt);
        ok = 1;
        if (r->input_tokens >= 0 && n != r->input_tokens)
            ok = -1, issue(v, r, rid, LM_BENCH_CHECK_PROMPT_TOKENS,
                           "server prompt_tokens %ld, usage.prompt_tokens %ld", n, r->input_tokens);
        if (r->prompt_ids_sha256[0] && n != r->own_input_tokens)
            ok = -1,
            issue(v, r, rid, LM_BENCH_CHECK_PROMPT_TOKENS,
                  "server prompt_tokens %ld, the rendered prompt has %ld", n, r->own_input_tokens);
        tally(v, LM_BENCH_CHECK_PROMPT_TOKENS, ok);
    }
    const char *pids = sget(sr, "prompt_ids_sha256");
    if (!r->prompt_ids_sha256[0] || !pids) {
        tally(v, LM_BENCH_CHECK_PROMPT_IDS, 0);
    } else if (strcmp(pids, r->prompt_ids_sha256)) {
        tally(v, LM_BENCH_CHECK_PROMPT_IDS, -1);
        issue(v, r, rid, LM_BENCH_CHECK_PROMPT_IDS,
              "the server's prompt ids hash %.12s..., the client's rendering %.12s...", pids,
              r->prompt_ids_sha256);
    } else {
        tally(v, LM_BENCH_CHECK_PROMPT_IDS, 1);
    }

    /* completion */
    struct lm_buf text = {0};
    lm_buf_append(&text, r->reasoning.p ? r->reasoning.p : "", r->reasoning.len);
    lm_buf_append(&text, r->content.p ? r->content.p : "", r->content.len);
    sha_of(text.p ? text.p : "", text.len, hex);
    /* an abandoned request's text is a prefix of what the server generated before it noticed:
     * the hashes cannot be compared (unavailable, not passed) */
    const char *ct = abandoned ? NULL : sget(sr, "completion_text_sha256");
    json_t *ctok = abandoned ? NULL : json_object_get(sr, "completion_tokens");
    ok = ct ? 1 : 0;
    if (ct && strcmp(ct, hex))
        ok = -1,
        issue(v, r, rid, LM_BENCH_CHECK_COMPLETION,
              "the server's completion text hash %.12s..., the client received %.12s...", ct, hex);
    if (json_is_integer(ctok) && r->output_tokens >= 0 &&
        json_integer_value(ctok) != r->output_tokens)
        ok = -1, issue(v, r, rid, LM_BENCH_CHECK_COMPLETION,
                       "server completion_tokens %lld, usage.completion_tokens %ld",
                       (long long)json_integer_value(ctok), r->output_tokens);
    tally(v, LM_BENCH_CHECK_COMPLETION, ok);
    const char *cids = abandoned ? NULL : sget(sr, "completion_ids_sha256");
    if (cids && render && render->tok) {
        struct lm_ids ids = {0};
        lm_tokenizer_encode(render->tok, text.p ? text.p : "", text.len, LM_ENCODE_SPECIAL_AS_TEXT,
                            &ids);
        lm_bench_sha256_ids(ids.v, ids.n, hex);
        tally(v, LM_BENCH_CHECK_COMPLETION_IDS, strcmp(cids, hex) ? -1 : 1);
        lm_ids_free(&ids);
    } else {
        tally(v, LM_BENCH_CHECK_COMPLETION_IDS, 0);
    }
    lm_buf_free(&text);

    /* server times */
    double ta = nget(sr, "t_arrival_ms"), ts = nget(sr, "t_scheduled_ms"),
           tf = nget(sr, "t_first_token_ms"), te = nget(sr, "t_finish_ms"),
           total = nget(sr, "total_ms"), q = nget(sr, "queue_ms");
    if (!isfinite(ta) || !isfinite(te) || !isfinite(total)) {
        tally(v, LM_BENCH_CHECK_SERVER_TIMES, 0);
    } else {
        const double eps = 1e-3;
        ok = 1;
        if (isfinite(ts) && !(ta <= ts + eps)) ok = -1;
        if (isfinite(tf) && isfinite(ts) && !(ts <= tf + eps)) ok = -1;
        if (isfinite(tf) && !(tf <= te + eps)) ok = -1;
        if (!(ta <= te + eps) || fabs(total - (te - ta)) > 0.01 + 1e-6 * fabs(total)) ok = -1;
        if (isfinite(q) &&
            (q < -eps || (isfinite(ts) && fabs(q - (ts - ta)) > 0.01 + 1e-6 * fabs(q))))
            ok = -1;
        if (ok < 0)
            issue(v, r, rid, LM_BENCH_CHECK_SERVER_TIMES,
                  "server times out of order or inconsistent: arrival %.3f scheduled %.3f first "
                  "%.3f finish %.3f total %.3f queue %.3f",
                  ta, ts, tf, te, total, q);
        if (isfinite(r->latency_ms) && total > r->latency_ms + 1.0 && !abandoned) {
            ok = -1;
            issue(v, r, rid, LM_BENCH_CHECK_SERVER_TIMES,
                  "server total %.3f ms exceeds the client's request latency %.3f ms", total,
                  r->latency_ms);
        }
        tally(v, LM_BENCH_CHECK_SERVER_TIMES, ok);
    }
}

/* A records file that cannot be used: none of its lines are. The joins and the problems found
 * before a malformed line are dropped (no server-side figures or verification_issues from part
 * of a file, no counts from it); v->path and v->error (why) stay. */
static lm_status unusable(struct lm_bench_verification *v, struct lm_bench_run *run, lm_status st) {
    for (size_t i = 0; i < run->n_records; i++) {
        struct lm_bench_record *r = &run->records[i];
        json_decref(r->server_record);
        json_decref(r->issues);
        r->server_record = r->issues = NULL;
    }
    char *path = v->path;
    json_t *issues = v->issues;
    json_array_clear(issues);
    memset(v, 0, sizeof *v);
    v->path = path, v->issues = issues;
    v->warmup_last_finish_ms = v->profiling_first_arrival_ms = NAN;
    v->error = strdup(lm_error_message());
    if (!v->error) abort();
    return st;
}

lm_status lm_bench_verify(struct lm_bench_run *run, const struct lm_bench_dataset *ds,
                          const char *path, const struct lm_bench_prompt *render,
                          struct lm_bench_verification *v) {
    memset(v, 0, sizeof *v);
    v->issues = json_array();
    v->warmup_last_finish_ms = v->profiling_first_arrival_ms = NAN;
    v->path = strdup(path);
    if (!v->path) abort();
    if (!render || !lm_bench_prompt_can_render(render))
        snprintf(v->prompt_ids_note, sizeof v->prompt_ids_note,
                 "no chat template: give --tokenizer or --model-dir (a model folder with "
                 "config.json) to render prompts");
    struct lm_buf text = {0};
    lm_status st = lm_file_read(path, &text);
    if (st) return unusable(v, run, st);
    /* index the client's records */
    json_t *by_rid = json_object(), *by_sid = json_object(), *by_turn = json_object(),
           *conv_index = json_object();
    for (size_t i = 0; i < run->n_records; i++) {
        struct lm_bench_record *r = &run->records[i];
        json_decref(r->server_record);
        r->server_record = NULL;
        json_decref(r->issues);
        r->issues = NULL;
        if (!r->sent) continue;
        json_object_set_new(by_rid, r->request_id, json_integer((json_int_t)i));
        if (r->server_id) json_object_set_new(by_sid, r->server_id, json_integer((json_int_t)i));
        char key[256];
        snprintf(key, sizeof key, "%s#%d", r->conversation_id, r->turn);
        json_object_set_new(by_turn, key, json_integer((json_int_t)i));
    }
    if (ds)
        for (size_t i = 0; i < ds->n; i++)
            json_object_set_new(conv_index, ds->convs[i].id, json_integer((json_int_t)i));
    char prefix[32];
    snprintf(prefix, sizeof prefix, "%s-", run->run_id);
    size_t plen = strlen(prefix);

    /* read and join */
    const char *p = text.p ? text.p : "", *end = p + text.len;
    size_t line_no = 0;
    while (p < end && !st) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        line_no++;
        const char *q = p;
        p = nl ? nl + 1 : end;
        while (q < le && (*q == ' ' || *q == '\t' || *q == '\r'))
            q++;
        if (q == le) continue;
        json_error_t e;
        json_t *o = json_loadb(q, (size_t)(le - q), 0, &e);
        if (!json_is_object(o)) {
            st = lm_errorf(LM_ERR_FORMAT, "%s:%zu: %s", path, line_no,
                           o ? "expected a JSON object" : e.text);
            json_decref(o);
            break;
        }
        v->n_lines++;
        const char *xr = sget(o, "x_request_id");
        json_t *idx = NULL;
        bool ours = false;
        if (xr && !strncmp(xr, prefix, plen)) {
            ours = true;
            idx = json_object_get(by_rid, xr);
        } else if (!xr && sget(o, "id")) {
            idx = json_object_get(by_sid, sget(o, "id"));
            ours = idx != NULL;
        }
        if (!ours) {
            v->n_other++;
        } else {
            v->n_this_run++;
            if (!idx) {
                v->n_unmatched_server++;
                issue(v, NULL, xr ? xr : sget(o, "id"), LM_BENCH_CHECK_JOINED,
                      "server record (%s:%zu) matches no request the client sent", path, line_no);
            } else {
                struct lm_bench_record *r = &run->records[json_integer_value(idx)];
                if (r->server_record) {
                    v->n_duplicate++;
                    issue(v, r, r->request_id, LM_BENCH_CHECK_JOINED,
                          "a second server record (%s:%zu)", path, line_no);
                } else {
                    r->server_record = json_incref(o);
                }
            }
        }
        json_decref(o);
    }
    lm_buf_free(&text);
    if (!st) {
        v->available = true;
        for (size_t i = 0; i < run->n_records; i++) {
            struct lm_bench_record *r = &run->records[i];
            if (!r->sent || !r->http_status)
                continue; /* no answer: nothing for the server to record */
            v->n_client++;
            if (!r->server_record) {
                v->n_unmatched_client++;
                tally(v, LM_BENCH_CHECK_JOINED, -1);
                issue(v, r, r->request_id, LM_BENCH_CHECK_JOINED,
                      "no server record for this request");
                continue;
            }
            v->n_matched++;
            tally(v, LM_BENCH_CHECK_JOINED, 1);
            check_request(v, run, ds, conv_index, by_turn, render, r);
            double ta = nget(r->server_record, "t_arrival_ms"),
                   te = nget(r->server_record, "t_finish_ms");
            if (r->phase == LM_BENCH_PHASE_WARMUP) {
                if (isfinite(te) && !(te <= v->warmup_last_finish_ms))
                    v->warmup_last_finish_ms = te;
            } else if (isfinite(ta) && !(ta >= v->profiling_first_arrival_ms)) {
                v->profiling_first_arrival_ms = ta;
            }
        }
        for (size_t i = 0; i < v->n_unmatched_server + v->n_duplicate; i++)
            tally(v, LM_BENCH_CHECK_JOINED, -1);
        /* conversations (profiling; records are conversation-major) */
        for (size_t i = run->n_warmup; i < run->n_records;) {
            size_t j = i;
            bool limited = false, failed = false, broken = false;
            while (j < run->n_records &&
                   !strcmp(run->records[j].conversation_id, run->records[i].conversation_id)) {
                struct lm_bench_record *r = &run->records[j];
                if (!r->sent) {
                    if (r->skip == LM_BENCH_SKIP_LIMIT)
                        limited = true;
                    else
                        failed = true;
                } else if (r->error) {
                    failed = true;
                    if (r->http_status && !r->server_record) broken = true;
                } else if (!r->server_record) {
                    broken = true;
                }
                j++;
            }
            if (broken) {
                v->conversations_broken++;
                tally(v, LM_BENCH_CHECK_CONVERSATIONS, -1);
                issue(v, NULL, run->records[i].conversation_id, LM_BENCH_CHECK_CONVERSATIONS,
                      "conversation %s: a turn the client sent has no server record",
                      run->records[i].conversation_id);
            } else {
                if (limited)
                    v->conversations_limited++;
                else if (failed)
                    v->conversations_failed++;
                else
                    v->conversations_complete++;
                tally(v, LM_BENCH_CHECK_CONVERSATIONS, 1);
            }
            i = j;
        }
        /* warmup apart */
        if (run->n_warmup == 0 || !isfinite(v->warmup_last_finish_ms) ||
            !isfinite(v->profiling_first_arrival_ms)) {
            tally(v, LM_BENCH_CHECK_WARMUP_APART, v->failed[LM_BENCH_CHECK_IDENTITY] ? -1 : 0);
        } else if (v->warmup_last_finish_ms > v->profiling_first_arrival_ms) {
            tally(v, LM_BENCH_CHECK_WARMUP_APART, -1);
            issue(v, NULL, run->run_id, LM_BENCH_CHECK_WARMUP_APART,
                  "the last warmup request finished at %.3f ms, after the first measured one "
                  "arrived (%.3f ms, server clock)",
                  v->warmup_last_finish_ms, v->profiling_first_arrival_ms);
        } else {
            tally(v, LM_BENCH_CHECK_WARMUP_APART, 1);
        }
        /* a warmup/profiling phase mix-up shows in identity; count it here too */
        for (size_t i = 0; i < run->n_records; i++) {
            const char *ph = sget(run->records[i].server_record, "phase");
            if (ph && strcmp(ph, phase_name(run->records[i].phase))) {
                v->failed[LM_BENCH_CHECK_WARMUP_APART]++;
                break;
            }
        }
        v->ok = v->n_unmatched_client == 0 && v->n_unmatched_server == 0 && v->n_duplicate == 0;
        for (int c = 0; c < LM_BENCH_CHECK_COUNT; c++)
            if (c != LM_BENCH_CHECK_COMPLETION_IDS && v->failed[c]) v->ok = false;
    }
    json_decref(by_rid);
    json_decref(by_sid);
    json_decref(by_turn);
    json_decref(conv_index);
    return st ? unusable(v, run, st) : LM_OK;
}

size_t lm_bench_verify_wait(const struct lm_bench_run *run, const char *path, double timeout_s) {
    size_t want = 0;
    for (size_t i = 0; i < run->n_records; i++)
        want += run->records[i].sent && run->records[i].http_status;
    char prefix[32];
    snprintf(prefix, sizeof prefix, "%s-", run->run_id);
    size_t have = 0;
    for (int tries = 0;; tries++) {
        struct lm_buf text = {0};
        have = 0;
        if (!lm_file_read(path, &text) && text.p) {
            for (char *line = text.p; line && *line;) {
                char *nl = strchr(line, '\n');
                if (nl) *nl = 0;
                json_t *o = json_loads(line, 0, NULL);
                const char *xr = sget(o, "x_request_id");
                if (xr && !strncmp(xr, prefix, strlen(prefix))) have++;
                json_decref(o);
                line = nl ? nl + 1 : NULL;
            }
        }
        lm_buf_free(&text);
        if (have >= want || tries * 0.05 >= timeout_s) break;
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return have;
}

void lm_bench_verification_print(FILE *f, const struct lm_bench_verification *v) {
    if (v->error) {
        fprintf(f, "Verification: FAILED (the server records could not be used: %s)\n", v->error);
        return;
    }
    if (!v->available) {
        fprintf(f, "Verification: unavailable (the server's request records were not given: run "
                   "the server with --records FILE and pass --server-records FILE; "
                   "docs/RECORDS.md)\n");
        return;
    }
    /* The verdict, then what it rests on: the requests joined, and the informational check
     * (completion_ids: the server's ids against lumen's re-encoding of the text received, which
     * differ whenever the text does not re-encode to the ids generated, as random weights often
     * give) said in words, so that a passing run does not read as a failure. */
    size_t info = v->failed[LM_BENCH_CHECK_COMPLETION_IDS];
    fprintf(f, "Verification against %s: %s (%zu of %zu answered requests joined", v->path,
            v->ok ? "PASSED" : "FAILED", v->n_matched, v->n_client);
    if (info)
        fprintf(f,
                "; %zu informational mismatch%s: completion ids, where the server's ids differ "
                "from lumen's re-encoding of the text received, which is not a failure",
                info, info == 1 ? "" : "es");
    fprintf(f, ")\n");
    fprintf(f,
            "  %zu server records (%zu of this run, %zu of others ignored); %zu of %zu answered "
            "requests joined; %zu requests without a record, %zu records without a request, %zu "
            "duplicates\n",
            v->n_lines, v->n_this_run, v->n_other, v->n_matched, v->n_client, v->n_unmatched_client,
            v->n_unmatched_server, v->n_duplicate);
    fprintf(f, "  %-24s %8s %8s %12s\n", "check", "passed", "failed", "unavailable");
    for (int c = 0; c < LM_BENCH_CHECK_COUNT; c++)
        fprintf(f, "  %-24s %8zu %8zu %12zu%s\n", k_check_names[c], v->passed[c], v->failed[c],
                v->unavailable[c], c == LM_BENCH_CHECK_COMPLETION_IDS ? "  (informational)" : "");
    fprintf(f,
            "  conversations: %zu complete, %zu cut by a limit, %zu cut by a failure, %zu broken\n",
            v->conversations_complete, v->conversations_limited, v->conversations_failed,
            v->conversations_broken);
    if (v->prompt_ids_note[0]) fprintf(f, "  prompt_ids: %s\n", v->prompt_ids_note);
    size_t n = json_array_size(v->issues);
    for (size_t i = 0; i < n && i < 10; i++) {
        json_t *e = json_array_get(v->issues, i);
        fprintf(f, "  %s [%s] %s\n", sget(e, "request_id"), sget(e, "check"), sget(e, "detail"));
    }
    if (n > 10) fprintf(f, "  ... %zu more issues in verification.json\n", n - 10);
}

json_t *lm_bench_verification_json(const struct lm_bench_verification *v) {
    json_t *o = json_object();
    json_object_set_new(o, "available", json_boolean(v->available));
    if (v->error) { /* not "unavailable": the user gave the records, and they could not be used */
        json_object_set_new(o, "ok", json_false());
        json_object_set_new(o, "server_records", json_string(v->path));
        json_object_set_new(o, "error", json_string(v->error));
        json_object_set_new(o, "note", json_string("verification failed: the server records could "
                                                   "not be read (see error)"));
        return o;
    }
    if (!v->available) {
        json_object_set_new(o, "note",
                            json_string("verification unavailable: no server records "
                                        "(--server-records); docs/RECORDS.md"));
        return o;
    }
    json_object_set_new(o, "ok", json_boolean(v->ok));
    json_object_set_new(o, "server_records", json_string(v->path));
    json_object_set_new(o, "records_in_file", json_integer((json_int_t)v->n_lines));
    json_object_set_new(o, "records_of_this_run", json_integer((json_int_t)v->n_this_run));
    json_object_set_new(o, "records_of_others", json_integer((json_int_t)v->n_other));
    json_object_set_new(o, "requests_answered", json_integer((json_int_t)v->n_client));
    json_object_set_new(o, "joined", json_integer((json_int_t)v->n_matched));
    json_object_set_new(o, "requests_without_record",
                        json_integer((json_int_t)v->n_unmatched_client));
    json_object_set_new(o, "records_without_request",
                        json_integer((json_int_t)v->n_unmatched_server));
    json_object_set_new(o, "duplicate_records", json_integer((json_int_t)v->n_duplicate));
    json_t *checks = json_object();
    for (int c = 0; c < LM_BENCH_CHECK_COUNT; c++)
        json_object_set_new(checks, k_check_names[c],
                            json_pack("{s:I,s:I,s:I}", "passed", (json_int_t)v->passed[c], "failed",
                                      (json_int_t)v->failed[c], "unavailable",
                                      (json_int_t)v->unavailable[c]));
    json_object_set_new(o, "checks", checks);
    json_object_set_new(o, "conversations",
                        json_pack("{s:I,s:I,s:I,s:I}", "complete",
                                  (json_int_t)v->conversations_complete, "cut_by_limit",
                                  (json_int_t)v->conversations_limited, "cut_by_failure",
                                  (json_int_t)v->conversations_failed, "broken",
                                  (json_int_t)v->conversations_broken));
    json_object_set_new(o, "warmup_last_finish_ms",
                        isfinite(v->warmup_last_finish_ms) ? json_real(v->warmup_last_finish_ms)
                                                           : json_null());
    json_object_set_new(o, "profiling_first_arrival_ms",
                        isfinite(v->profiling_first_arrival_ms)
                            ? json_real(v->profiling_first_arrival_ms)
                            : json_null());
    if (v->prompt_ids_note[0])
        json_object_set_new(o, "prompt_ids_note", json_string(v->prompt_ids_note));
    json_object_set(o, "issues", v->issues);
    return o;
}
