/* records.h: request records, `lumen serve --records FILE` (the contract is docs/RECORDS.md).
 *
 * One JSON object per line (JSONL) per request answered on a generation endpoint, appended when
 * the request retires. Never raw text: message contents, prompt ids, completion ids and the
 * completion text appear only as SHA-256 digests (lowercase hex), computed with OpenSSL's EVP.
 * The profiler (`lumen profile --server-records`) joins its own records to these. */
#ifndef LM_SERVER_RECORDS_H
#define LM_SERVER_RECORDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "family/chat.h"

#define LM_SHA256_HEX_LEN 65 /* 64 hex digits and a NUL */

/* SHA-256 of n bytes, as lowercase hex. */
void lm_sha256_hex(const void *data, size_t n, char hex[LM_SHA256_HEX_LEN]);
/* SHA-256 of token ids written as little-endian int32 bytes (docs/RECORDS.md). */
void lm_sha256_ids_hex(const int32_t *ids, size_t n, char hex[LM_SHA256_HEX_LEN]);

/* One request's record. Strings are borrowed for the duration of lm_record_json; NULL (or a
 * negative number) is written as JSON null. */
struct lm_record {
    const char *id;              /* the completion id of the response and its chunks */
    const char *x_request_id;    /* the X-Request-Id header as received */
    const char *conversation_id; /* X-Conversation-Id */
    const char *phase;           /* X-Lumen-Phase */
    const char *turn;            /* X-Lumen-Turn as received; written as an int (null unless one) */
    const char *model;
    const char *endpoint; /* "/v1/chat/completions", "/v1/completions" */
    int http_status;
    double t_arrival_ms, t_scheduled_ms, t_first_token_ms, t_finish_ms; /* CLOCK_MONOTONIC ms */
    int prompt_tokens, cached_tokens, completion_tokens;                /* < 0: null */
    int spec_draft_tokens, spec_accepted_tokens; /* speculative decoding, over the choices
                                                    (engine/spec.h); < 0: null (it is off) */
    const char *finish_reason; /* "stop", "length", "cancelled" (lm_finish_name: never the
                                  wire's "abort"; docs/RECORDS.md), NULL for an error */
    /* the conversation (chat): roles and per-message content SHA-256; n_messages 0 and
     * messages NULL write null for both (a completions request, or a body that did not parse) */
    const struct lm_chat_msg *messages;
    size_t n_messages;
    const int32_t *prompt_ids; /* NULL: null */
    size_t n_prompt_ids;
    const int32_t *completion_ids; /* NULL: null */
    size_t n_completion_ids;
    const char
        *completion_text; /* reasoning_content bytes then content bytes, as sent; NULL: null */
    size_t completion_text_len;
};

/* The record as one line of JSON without the newline. Derived fields: queue_ms =
 * t_scheduled - t_arrival, prefill_ms = t_first_token - t_scheduled, decode_ms = t_finish -
 * t_first_token, total_ms = t_finish - t_arrival (null when a term is). Malloc'd, caller frees. */
char *lm_record_json(const struct lm_record *r);

struct lm_records;

/* Opens `path` for appending (created 0644 when missing). LM_ERR_IO names the path and errno.
 * *out is caller-owned (lm_records_close). */
lm_status lm_records_open(const char *path, struct lm_records **out);
/* Appends one line (one write(2) on an O_APPEND descriptor, so lines of concurrent writers do
 * not interleave). Thread-safe. LM_ERR_IO when the write fails (the message names the path). */
lm_status lm_records_write(struct lm_records *rs, const struct lm_record *r);
void lm_records_close(struct lm_records *rs); /* accepts NULL */

#endif
