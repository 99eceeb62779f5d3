/* openai.h: the OpenAI Chat Completions API as C structs, without sockets.
 *
 * Parsing and validation turn a request body into struct lm_chat_request, or into an
 * struct lm_api_error that says which field is wrong (OpenAI's error object). Response builders
 * turn results into the JSON of a chat.completion, the SSE chunks of a chat.completion.chunk
 * stream, /v1/models and errors. The HTTP transport (http.c) and the engine thread (worker.c)
 * only move these around, so the logic here is unit-tested without a server, and a later
 * /v1/completions route or batching scheduler can reuse it.
 *
 * References: https://platform.openai.com/docs/api-reference/chat (fields, objects, errors,
 * streaming with stream_options.include_usage); vLLM's OpenAI server for the extensions top_k,
 * ignore_eos and chat_template_kwargs. */
#ifndef LM_SERVER_OPENAI_H
#define LM_SERVER_OPENAI_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/status.h"
#include "engine/generate.h"
#include "family/chat.h"
#include "family/model.h"

#define LM_OPENAI_MAX_MESSAGES 64
#define LM_OPENAI_MAX_STOP 4

/* An error as OpenAI reports it: {"error":{"message","type","param","code"}} with an HTTP status.
 * A client mistake is always 4xx. */
struct lm_api_error {
    int status;        /* HTTP status: 400, 404, 405, 413, 429, 500, 503 */
    const char *type;  /* static: "invalid_request_error", "rate_limit_exceeded", "server_error" */
    const char *code;  /* static code such as "context_length_exceeded", or NULL (JSON null) */
    char param[96];    /* the offending field ("messages[1].content"), "" for JSON null */
    char message[512]; /* what is wrong, for a person */
};

/* Fills `e` (printf-style message) and returns LM_ERR_INVALID for 4xx, LM_ERR_RANGE for 429 and
 * LM_ERR_UNSUPPORTED otherwise, after recording the message with lm_errorf. `param`/`code` may be
 * NULL. */
lm_status lm_api_errorf(struct lm_api_error *e, int status, const char *type, const char *code,
                        const char *param, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* A validated /v1/chat/completions request. All strings are borrowed from `root`, which the struct
 * owns (lm_chat_request_free). Fields the client did not give keep the "not given" values. */
struct lm_chat_request {
    json_t *root;                   /* the parsed body; owns every string below */
    struct lm_chat_msg *messages;   /* [n_messages], malloc'd; content parts already concatenated */
    size_t n_messages;              /* 1..LM_OPENAI_MAX_MESSAGES */
    struct lm_chat_opts chat;       /* add_generation_prompt = true; enable_thinking -1/0/1 from
                                       chat_template_kwargs.enable_thinking */
    const char *model;              /* "" when absent; any value is accepted */
    int max_tokens;                 /* max_completion_tokens, else max_tokens; -1 not given */
    double temperature;             /* [0, 2]; -1 not given */
    double top_p;                   /* (0, 1]; -1 not given */
    int top_k;                      /* >= 0 (0 = off; -1 from the client means off); valid when has_top_k */
    bool has_top_k;
    uint64_t seed;                  /* valid when has_seed (negative seeds are cast) */
    bool has_seed;
    const char *stop[LM_OPENAI_MAX_STOP]; /* non-empty stop strings */
    size_t n_stop;
    bool stream;
    bool include_usage;             /* stream_options.include_usage */
    bool ignore_eos;                /* vLLM extension */
};

/* Parses and validates `len` bytes of a request body. On error returns LM_ERR_INVALID or
 * LM_ERR_UNSUPPORTED with `err` filled (status 400, param naming the field) and `req` left empty;
 * on success `req` must be released with lm_chat_request_free. Checks: JSON object; messages an
 * array of 1..64 objects with role system|user|assistant and content a string or a list of
 * {"type":"text","text":...} parts (non-text parts, role tool, tool_calls, function_call
 * rejected); tools/tool_choice/functions/function_call absent; n == 1; ranges of temperature,
 * top_p, top_k, max_tokens; stop a string or up to 4 strings; stream_options only with stream.
 * Unknown fields are ignored, as OpenAI-compatible servers do. */
lm_status lm_chat_request_parse(const char *body, size_t len, struct lm_chat_request *req,
                                struct lm_api_error *err);
void lm_chat_request_free(struct lm_chat_request *req); /* accepts a zeroed struct */

/* Renders the conversation with the model's chat template and tokenizes it (special-token
 * strings matched, the Hugging Face default); ids are appended to `prompt`. Then checks the
 * context: prompt + max_tokens must fit `ctx` positions. *max_tokens is the request's
 * max_tokens, or ctx - prompt when it gave none. Errors (400): a conversation the template
 * rejects, or "prompt has 4100 tokens and max_tokens is 256; the context holds 4096"
 * (code context_length_exceeded). */
lm_status lm_chat_request_prompt(const struct lm_model *m, const struct lm_chat_request *req,
                                 int ctx, struct lm_ids *prompt, int *max_tokens,
                                 struct lm_api_error *err);

/* Sampling parameters: the request's values, else the model's generation_config defaults
 * (negative = unset), else greedy (temperature 0, top_p 1, top_k 0). */
struct lm_sampling_params lm_chat_request_sampling(const struct lm_chat_request *req,
                                                   const struct lm_gen_defaults *defaults);

/* What every response object repeats. Strings borrowed. */
struct lm_openai_meta {
    const char *id;    /* "chatcmpl-<request id>" */
    long long created; /* Unix seconds */
    const char *model; /* the served model's name */
};

/* "stop" or "length" for a finished completion (cancelled maps to "stop"). */
const char *lm_openai_finish_reason(enum lm_finish f);

/* A chat.completion object. Returns a malloc'd JSON string (caller frees). `text` is UTF-8
 * (invalid bytes are replaced by U+FFFD). */
char *lm_openai_chat_completion(const struct lm_openai_meta *meta, const char *text, size_t len,
                                const char *finish_reason, int prompt_tokens,
                                int completion_tokens);

/* Appends one SSE event "data: {chat.completion.chunk}\n\n" to `out`. The delta holds
 * `role` when non-NULL and `content` when non-NULL; finish_reason is JSON null when NULL.
 * usage_null adds "usage": null (OpenAI does so on every chunk when include_usage is set). */
void lm_openai_chunk(struct lm_buf *out, const struct lm_openai_meta *meta, const char *role,
                     const char *content, size_t len, const char *finish_reason, bool usage_null);
/* Appends the usage chunk: "choices": [] and "usage": {...}. */
void lm_openai_usage_chunk(struct lm_buf *out, const struct lm_openai_meta *meta,
                           int prompt_tokens, int completion_tokens);
/* Appends "data: [DONE]\n\n". */
void lm_openai_done(struct lm_buf *out);

/* {"error":{...}} for `e`. Returns a malloc'd JSON string (caller frees). */
char *lm_openai_error_json(const struct lm_api_error *e);

/* GET /v1/models: one model with owned_by "lumen" and max_model_len. Malloc'd, caller frees. */
char *lm_openai_models(const char *name, long long created, int max_model_len);

#endif
