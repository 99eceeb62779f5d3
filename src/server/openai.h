/* openai.h: the OpenAI Chat Completions and (legacy) Completions APIs as C structs, without
 * sockets, plus vLLM's /tokenize and /detokenize and the capabilities of /v1/models.
 *
 * Parsing and validation turn a request body into struct lm_chat_request, or into an
 * struct lm_api_error that says which field is wrong (OpenAI's error object). Response builders
 * turn results into the JSON of a chat.completion / text_completion, the SSE chunks of a stream,
 * /v1/models and errors. The HTTP transport (http.c) and the engine (worker.h) only move these
 * around, so the logic here is unit-tested without a server (tests/test_openai.c).
 *
 * References: https://platform.openai.com/docs/api-reference/chat and .../completions (fields,
 * objects, errors, streaming with stream_options.include_usage, logprobs); vLLM's OpenAI server
 * for the extensions top_k, min_p, repetition_penalty, ignore_eos, chat_template_kwargs,
 * reasoning_content, /tokenize and /detokenize. */
#ifndef LM_SERVER_OPENAI_H
#define LM_SERVER_OPENAI_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/status.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "family/chat.h"
#include "family/model.h"

#define LM_OPENAI_MAX_MESSAGES 64
#define LM_OPENAI_MAX_STOP 4
#define LM_OPENAI_MAX_N 8 /* choices per request (`n`) */
#define LM_OPENAI_COMPLETIONS_DEFAULT_MAX_TOKENS                                                   \
    16 /* OpenAI's and vLLM's default for /v1/completions */

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

/* Which API a request came through. */
enum lm_api_endpoint {
    LM_API_CHAT,        /* POST /v1/chat/completions: task text_conversation */
    LM_API_COMPLETIONS, /* POST /v1/completions: task text_generation */
};
const char *lm_api_endpoint_path(enum lm_api_endpoint e); /* "/v1/chat/completions", ... */

/* A validated /v1/chat/completions or /v1/completions request. All strings are borrowed from
 * `root`, which the struct owns (lm_chat_request_free). Fields the client did not give keep the
 * "not given" values. */
struct lm_chat_request {
    json_t *root; /* the parsed body; owns every string below */
    enum lm_api_endpoint endpoint;

    /* chat only */
    struct lm_chat_msg *messages; /* [n_messages], malloc'd; content parts already concatenated */
    size_t n_messages;            /* 1..LM_OPENAI_MAX_MESSAGES */
    struct lm_chat_opts chat;     /* add_generation_prompt = true; enable_thinking -1/0/1 from
                                     chat_template_kwargs.enable_thinking */

    /* completions only: the prompt is a string, or token ids */
    const char *prompt;  /* non-empty UTF-8; NULL when ids were given */
    int32_t *prompt_ids; /* [n_prompt_ids] malloc'd when the prompt is an array of ids */
    size_t n_prompt_ids;

    const char *model;  /* "" when absent; the server checks it (lm_api_check_model) */
    int n;              /* choices: 1..LM_OPENAI_MAX_N */
    int max_tokens;     /* max_completion_tokens, else max_tokens; -1 not given */
    const char *max_tokens_field; /* the field it came from (static), for error messages */
    double temperature; /* [0, 2]; -1 not given */
    double top_p;       /* (0, 1]; -1 not given */
    int top_k;          /* >= 0 (0 = off; -1 from the client means off); valid when has_top_k */
    bool has_top_k;
    double min_p;              /* [0, 1]; 0 = off */
    double presence_penalty;   /* [-2, 2]; 0 = off */
    double frequency_penalty;  /* [-2, 2]; 0 = off */
    double repetition_penalty; /* > 0; 1 = off */
    bool logprobs;             /* chat: logprobs true; completions: logprobs given (an integer) */
    int top_logprobs; /* chat: top_logprobs 0..20; completions: the logprobs integer 0..20 */
    uint64_t seed;    /* valid when has_seed (negative seeds are cast) */
    bool has_seed;
    const char *stop[LM_OPENAI_MAX_STOP]; /* non-empty stop strings */
    size_t n_stop;
    bool stream;
    bool include_usage; /* stream_options.include_usage */
    bool ignore_eos;    /* vLLM extension */
};

/* Parses and validates `len` bytes of a /v1/chat/completions body. On error returns
 * LM_ERR_INVALID or LM_ERR_UNSUPPORTED with `err` filled (status 400, param naming the field) and
 * `req` left empty; on success `req` must be released with lm_chat_request_free. Checks: JSON
 * object; messages an array of 1..64 objects with role system|user|assistant and content a
 * string or a list of {"type":"text","text":...} parts (non-text parts, role tool, tool_calls,
 * function_call rejected); tools/tool_choice/functions/function_call absent; n 1..8; ranges of
 * temperature, top_p, top_k, min_p, the penalties, max_tokens; logprobs a boolean and
 * top_logprobs 0..20 (only with logprobs true); stop a string or up to 4 strings;
 * stream_options only with stream. A string holding a NUL character ("\u0000") is refused, with
 * its path as param ("messages[0].content"). Unknown fields are ignored, as OpenAI-compatible
 * servers do. */
lm_status lm_chat_request_parse(const char *body, size_t len, struct lm_chat_request *req,
                                struct lm_api_error *err);
/* The same for a /v1/completions body: prompt a non-empty string or a non-empty array of token
 * ids (an array holding one such prompt is accepted; several prompts are refused); logprobs an
 * integer 0..20; echo true, a non-empty suffix and best_of > 1 refused (400). */
lm_status lm_completion_request_parse(const char *body, size_t len, struct lm_chat_request *req,
                                      struct lm_api_error *err);
void lm_chat_request_free(struct lm_chat_request *req); /* accepts a zeroed struct */

/* The prompt's token ids, appended to `prompt`. Chat: renders the conversation with the model's
 * chat template (the rendered text is appended to `rendered` when non-NULL) and tokenizes it
 * (special-token strings matched, the Hugging Face default). Completions: tokenizes the prompt
 * string the same way, or copies the ids (each must be in [0, vocab_size): 400 otherwise). Then
 * checks the context: prompt + max_tokens must fit `ctx` positions. *max_tokens is the request's
 * max_tokens, else (chat) ctx - prompt or (completions) min(16, ctx - prompt). Errors (400): a
 * conversation the template rejects, or "prompt has 4100 tokens and max_tokens is 256; the
 * context holds 4096" (code context_length_exceeded). */
lm_status lm_chat_request_prompt(const struct lm_model *m, const struct lm_chat_request *req,
                                 int ctx, struct lm_ids *prompt, int *max_tokens,
                                 struct lm_buf *rendered, struct lm_api_error *err);

/* Sampling parameters: the request's values, else the model's generation_config defaults
 * (negative = unset), else greedy (temperature 0, top_p 1, top_k 0); the penalties, min_p and
 * logprobs from the request. `choice` (0..n-1) offsets a given seed, so each of n choices is its
 * own reproducible sequence (seed + choice). */
struct lm_sampling_params lm_chat_request_sampling(const struct lm_chat_request *req,
                                                   const struct lm_gen_defaults *defaults,
                                                   int choice);

/* The task an endpoint needs ("text_conversation" for chat, "text_generation" for completions),
 * and the check the server dispatches on: 400 (code "model_not_capable") when `tasks` (enum
 * lm_task bits the model's family declares) lacks it, with a message listing what the model
 * can do. */
unsigned lm_api_endpoint_task(enum lm_api_endpoint e);
lm_status lm_api_check_task(unsigned tasks, unsigned need, const char *model,
                            struct lm_api_error *err);
/* "text_generation" / "text_conversation" for one enum lm_task bit, NULL for an unknown bit. */
const char *lm_task_name(unsigned task);

/* What every response object repeats. Strings and the tokenizer are borrowed. */
struct lm_openai_meta {
    const char *id;                 /* "chatcmpl-<request id>" / "cmpl-<request id>" */
    long long created;              /* Unix seconds */
    const char *model;              /* the served model's name */
    enum lm_api_endpoint endpoint;  /* chat.completion(.chunk) or text_completion objects */
    const struct lm_tokenizer *tok; /* spells the tokens of logprobs; may be NULL without them */
};

/* "stop" or "length" for a finished completion (cancelled maps to "stop"). */
const char *lm_openai_finish_reason(enum lm_finish f);

/* Token counts of a response. prompt_tokens counts the prompt once whatever n is;
 * completion_tokens sums the choices. cached_tokens < 0 leaves out prompt_tokens_details. */
struct lm_openai_usage {
    int prompt_tokens;
    int completion_tokens;
    int cached_tokens;
};

/* One choice of a response. Text is UTF-8 (invalid bytes are replaced by U+FFFD). */
struct lm_openai_choice {
    const char *text; /* chat: message.content; completions: text */
    size_t len;
    const char *reasoning;     /* chat: message.reasoning_content; NULL = no reasoning split */
    size_t reasoning_len;      /* (a split that found no reasoning gives JSON null) */
    const char *finish_reason; /* "stop", "length" */
    const struct lm_token_logprob *logprobs; /* [n_logprobs]; NULL = "logprobs": null */
    size_t n_logprobs;
};

/* A chat.completion or text_completion object with choices[0..n). Returns a malloc'd JSON
 * string (caller frees). */
char *lm_openai_response(const struct lm_openai_meta *meta, const struct lm_openai_choice *choices,
                         size_t n, const struct lm_openai_usage *usage);

/* One streamed choice update. */
struct lm_openai_delta {
    int index;           /* choice index */
    const char *role;    /* "assistant" on a chat choice's first chunk, else NULL */
    const char *content; /* chat: delta.content, completions: text; NULL = absent ("" for
                            completions) */
    size_t len;
    const char *reasoning; /* chat: delta.reasoning_content; NULL = absent */
    size_t reasoning_len;
    const struct lm_token_logprob *logprobs; /* tokens of this chunk; NULL = "logprobs": null */
    size_t n_logprobs;
    size_t text_offset;        /* completions: where this chunk's first token starts in the choice's
                                  text (logprobs.text_offset counts from the start of the completion) */
    const char *finish_reason; /* NULL = JSON null */
};

/* Appends one SSE event "data: {chunk}\n\n" to `out`: a chat.completion.chunk or a
 * text_completion. usage_null adds "usage": null (OpenAI does so on every chunk when
 * include_usage is set). */
void lm_openai_chunk(struct lm_buf *out, const struct lm_openai_meta *meta,
                     const struct lm_openai_delta *d, bool usage_null);
/* Appends the usage chunk: "choices": [] and "usage": {...}. */
void lm_openai_usage_chunk(struct lm_buf *out, const struct lm_openai_meta *meta,
                           const struct lm_openai_usage *usage);
/* Appends "data: [DONE]\n\n". */
void lm_openai_done(struct lm_buf *out);

/* {"error":{...}} for `e`. Returns a malloc'd JSON string (caller frees). */
char *lm_openai_error_json(const struct lm_api_error *e);

/* GET /v1/models: one model with owned_by "lumen", max_model_len and "capabilities", the task
 * names of `tasks` (enum lm_task bits). Malloc'd, caller frees. */
char *lm_openai_models(const char *name, long long created, int max_model_len, unsigned tasks);
/* GET /v1/models/{id}: the same model object alone. Malloc'd, caller frees. */
char *lm_openai_model(const char *name, long long created, int max_model_len, unsigned tasks);

/* The "model" a request names, against the served model's id `served` (lm_model_name: the
 * folder's base name, or the .gguf file's name without the extension). OK when `requested` is
 * NULL or "" (the field is optional, as in vLLM: the served model answers) or equals `served`;
 * otherwise 404, as OpenAI and vLLM answer: {"message": "The model `gpt-4` does not exist.",
 * "type": "invalid_request_error", "param": "model", "code": "model_not_found"}. */
lm_status lm_api_check_model(const char *served, const char *requested, struct lm_api_error *err);

/* POST /tokenize (vLLM): {"prompt": str, "add_special_tokens"?} or {"messages": [...],
 * "add_generation_prompt"? (default true), "chat_template_kwargs"?} ->
 * {"count": n, "max_model_len": ctx, "tokens": [...]}. Messages need the text_conversation task
 * (`tasks`). An optional "model" must name the served model (lm_api_check_model: 404). Strings
 * holding a NUL character are refused here as in every body. Returns a malloc'd JSON string in
 * *out, or an error (400, 404) in `err`. */
lm_status lm_openai_tokenize(const struct lm_model *m, unsigned tasks, const char *body, size_t len,
                             int ctx, char **out, struct lm_api_error *err);
/* POST /detokenize (vLLM): {"tokens": [ids]} -> {"prompt": text} (special tokens kept, as
 * vLLM's decode does). Ids outside [0, vocab_size) are a 400; "model" as for /tokenize. */
lm_status lm_openai_detokenize(const struct lm_model *m, const char *body, size_t len, char **out,
                               struct lm_api_error *err);

#endif
