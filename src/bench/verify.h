/* verify.h: joins the client's request records to the server's (docs/RECORDS.md) and checks that
 * every response belongs to the request and the history that were sent.
 *
 * Checks (docs/RECORDS.md gives the exact rules): joined, identity, roles, user_content,
 * history, prompt_tokens, prompt_ids, completion, completion_ids (informational),
 * server_times, conversations_complete, warmup_apart. Each is counted passed / failed per
 * request (or per conversation, or once for the run); a check that lacks its inputs (no
 * template for prompt_ids, a null field in the server's record) is counted unavailable.
 * Issues are attached to the client records (record.issues) and listed in the result. */
#ifndef LM_BENCH_VERIFY_H
#define LM_BENCH_VERIFY_H

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>

#include "base/status.h"
#include "bench/dataset.h"
#include "bench/replay.h"

struct lm_bench_prompt;

enum lm_bench_check {
    LM_BENCH_CHECK_JOINED,
    LM_BENCH_CHECK_IDENTITY,
    LM_BENCH_CHECK_ROLES,
    LM_BENCH_CHECK_USER_CONTENT,
    LM_BENCH_CHECK_HISTORY,
    LM_BENCH_CHECK_PROMPT_TOKENS,
    LM_BENCH_CHECK_PROMPT_IDS,
    LM_BENCH_CHECK_COMPLETION,
    LM_BENCH_CHECK_COMPLETION_IDS, /* informational */
    LM_BENCH_CHECK_SERVER_TIMES,
    LM_BENCH_CHECK_CONVERSATIONS,
    LM_BENCH_CHECK_WARMUP_APART,
    LM_BENCH_CHECK_COUNT,
};

const char *lm_bench_check_name(enum lm_bench_check c);

struct lm_bench_verification {
    bool available;    /* server records were given and read */
    char *path;        /* the records file; owned */
    size_t n_lines;    /* records in the file */
    size_t n_this_run; /* records whose x_request_id carries this run's id */
    size_t n_other;    /* records of other runs or clients, ignored */
    size_t n_client;   /* client requests that got an HTTP answer (joinable) */
    size_t n_matched;
    size_t n_unmatched_client; /* sent and answered, but no server record */
    size_t n_unmatched_server; /* a server record of this run that no request explains */
    size_t n_duplicate;        /* a second server record for one request */
    size_t passed[LM_BENCH_CHECK_COUNT], failed[LM_BENCH_CHECK_COUNT],
        unavailable[LM_BENCH_CHECK_COUNT];
    size_t conversations_complete, conversations_limited, conversations_failed,
        conversations_broken; /* broken: a sent turn without its server record */
    double warmup_last_finish_ms, profiling_first_arrival_ms; /* server clock; NAN when none */
    char prompt_ids_note[160]; /* why prompt_ids is unavailable, or "" */
    json_t *issues;            /* [{"request_id", "check", "detail"}]; owned */
    bool ok;                   /* available and nothing failed */
    char *error; /* records given but unusable (unreadable, a line not a JSON object): why, as
                  * lm_bench_verify's status said it; owned. NULL otherwise. Not available, not
                  * ok: print, JSON and the HTML report say FAILED with this reason. */
};

/* Reads `server_records` (JSONL; LM_ERR_IO / LM_ERR_FORMAT "path:line: ..." when it cannot be
 * read or a line is not a JSON object, the message kept in out->error too, out->available false),
 * joins and checks. `render` (may be NULL) renders prompts for prompt_ids; `ds` gives the
 * corpus's original user strings. Failed checks are not a status: out->ok says. `out` is zeroed
 * first; free with lm_bench_verification_free (also after an error). */
lm_status lm_bench_verify(struct lm_bench_run *run, const struct lm_bench_dataset *ds,
                          const char *server_records, const struct lm_bench_prompt *render,
                          struct lm_bench_verification *out);

void lm_bench_verification_free(struct lm_bench_verification *v);

/* Waits up to timeout_s for `server_records` to hold a record for every request of the run that
 * got an HTTP answer (a server writes a record when the request retires, which can be just
 * after the client read its last byte). Returns how many of them it found (counting lines whose
 * x_request_id carries the run's id). */
size_t lm_bench_verify_wait(const struct lm_bench_run *run, const char *server_records,
                            double timeout_s);

/* Prints the verification table; with v->available false, "verification unavailable" and why. */
void lm_bench_verification_print(FILE *f, const struct lm_bench_verification *v);

/* The result as JSON (new reference): {"available", "ok", "server_records", counts, "checks":
 * {name: {"passed", "failed", "unavailable"}}, "issues": [...]} */
json_t *lm_bench_verification_json(const struct lm_bench_verification *v);

#endif
