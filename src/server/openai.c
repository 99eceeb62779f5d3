/* openai.c: see openai.h. */
#include "server/openai.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INVALID "invalid_request_error"

lm_status lm_api_errorf(struct lm_api_error *e, int status, const char *type, const char *code,
                        const char *param, const char *fmt, ...) {
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    lm_status st = status == 429  ? LM_ERR_RANGE
                   : status < 500 ? LM_ERR_INVALID
                                  : LM_ERR_UNSUPPORTED;
    return lm_errorf(st, "%s", e->message);
}

/* ---- parsing ---------------------------------------------------------------------------- */

/* JSON null and absence are the same for every optional field, as in OpenAI's API. */
static json_t *field(const json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return json_is_null(v) ? NULL : v;
}

static const char *json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

static lm_status bad(struct lm_api_error *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static lm_status bad(struct lm_api_error *e, const char *param, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return lm_api_errorf(e, 400, INVALID, NULL, param, "%s", msg);
}

/* The first string in `v` (a value at `path`) that holds a NUL character: its path written to
 * `out` ("messages[0].content"), true when one was found. */
static bool find_nul(const json_t *v, const char *path, char *out, size_t cap) {
    char sub[160];
    if (json_is_string(v)) {
        if (memchr(json_string_value(v), 0, json_string_length(v))) {
            snprintf(out, cap, "%s", path);
            return true;
        }
    } else if (json_is_array(v)) {
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) {
            snprintf(sub, sizeof sub, "%s[%zu]", path, i);
            if (find_nul(x, sub, out, cap)) return true;
        }
    } else if (json_is_object(v)) {
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)v, k, x) {
            snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", k);
            if (find_nul(x, sub, out, cap)) return true;
        }
    }
    return false;
}

/* Parses a request body: a JSON text (duplicate keys refused) whose strings hold no NUL
 * character. On error returns LM_ERR_INVALID with `err` filled (400) and *out NULL. */
static lm_status load_body(const char *body, size_t len, json_t **out, struct lm_api_error *err) {
    json_error_t jerr;
    *out = json_loadb(body ? body : "", len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
    if (!*out) {
        if (strstr(jerr.text, "NUL"))
            return bad(err, "",
                       "request body: an object key holds a NUL character (\\u0000); NUL "
                       "characters are not allowed (line %d, column %d)",
                       jerr.line, jerr.column);
        return bad(err, "", "request body is not valid JSON: %s (line %d, column %d)", jerr.text,
                   jerr.line, jerr.column);
    }
    char path[96];
    if (find_nul(*out, "", path, sizeof path)) {
        json_decref(*out);
        *out = NULL;
        return bad(err, path, "%s holds a NUL character (\\u0000); NUL characters are not allowed",
                   path[0] ? path : "the request body");
    }
    return LM_OK;
}

static lm_status get_bool(const json_t *obj, const char *key, const char *param, bool *out,
                          struct lm_api_error *e) {
    json_t *v = field(obj, key);
    if (!v) return LM_OK;
    if (!json_is_boolean(v))
        return bad(e, param, "%s must be a boolean, not %s", param, json_kind(v));
    *out = json_is_true(v);
    return LM_OK;
}

static lm_status get_number(const json_t *obj, const char *key, double lo, double hi, bool lo_open,
                            double *out, struct lm_api_error *e) {
    json_t *v = field(obj, key);
    if (!v) return LM_OK;
    if (!json_is_number(v)) return bad(e, key, "%s must be a number, not %s", key, json_kind(v));
    double x = json_number_value(v);
    if (!isfinite(x) || (lo_open ? x <= lo : x < lo) || x > hi)
        return bad(e, key, "%s is %g; it must be in %s%g, %g]", key, x, lo_open ? "(" : "[", lo,
                   hi);
    *out = x;
    return LM_OK;
}

static lm_status get_int(const json_t *obj, const char *key, long long lo, long long *out,
                         bool *given, struct lm_api_error *e) {
    json_t *v = field(obj, key);
    if (!v) return LM_OK;
    if (!json_is_integer(v)) return bad(e, key, "%s must be an integer, not %s", key, json_kind(v));
    long long x = json_integer_value(v);
    if (x < lo) return bad(e, key, "%s is %lld; it must be at least %lld", key, x, lo);
    *out = x;
    if (given) *given = true;
    return LM_OK;
}

/* Concatenates a list of text parts into one string, stored back into the message object so that
 * `root` owns it. (vLLM joins parts with "\n"; OpenAI's documentation only says the parts form the
 * message; we concatenate them as they are.) */
static lm_status parse_content(json_t *msg, size_t i, bool required, const char **out,
                               struct lm_api_error *e) {
    char param[96];
    snprintf(param, sizeof param, "messages[%zu].content", i);
    json_t *c = field(msg, "content");
    if (!c) {
        if (required) return bad(e, param, "%s is required", param);
        *out = "";
        return LM_OK;
    }
    if (json_is_string(c)) {
        *out = json_string_value(c);
        return LM_OK;
    }
    if (!json_is_array(c))
        return bad(e, param, "%s must be a string or a list of text parts, not %s", param,
                   json_kind(c));
    struct lm_buf text = {0};
    size_t j;
    json_t *part;
    json_array_foreach(c, j, part) {
        char pp[128];
        snprintf(pp, sizeof pp, "%s[%zu]", param, j);
        json_t *type = json_object_get(part, "type");
        if (!json_is_object(part) || !json_is_string(type)) {
            lm_buf_free(&text);
            return bad(e, pp, "%s must be an object {\"type\": \"text\", \"text\": ...}", pp);
        }
        if (strcmp(json_string_value(type), "text")) {
            lm_buf_free(&text);
            return lm_api_errorf(e, 400, INVALID, NULL, pp,
                                 "%s.type '%s' is not supported; only text parts are", pp,
                                 json_string_value(type));
        }
        json_t *t = json_object_get(part, "text");
        if (!json_is_string(t)) {
            lm_buf_free(&text);
            return bad(e, pp, "%s.text must be a string", pp);
        }
        lm_buf_append(&text, json_string_value(t), json_string_length(t));
    }
    json_t *joined = json_stringn(text.p ? text.p : "", text.len);
    lm_buf_free(&text);
    if (!joined) return bad(e, param, "%s is not valid UTF-8", param);
    json_object_set_new(msg, "content", joined); /* frees the parts array */
    *out = json_string_value(joined);
    return LM_OK;
}

static lm_status parse_messages(struct lm_chat_request *r, struct lm_api_error *e) {
    json_t *msgs = json_object_get(r->root, "messages");
    if (!msgs || json_is_null(msgs)) return bad(e, "messages", "messages is required");
    if (!json_is_array(msgs))
        return bad(e, "messages", "messages must be an array of messages, not %s", json_kind(msgs));
    size_t n = json_array_size(msgs);
    if (n == 0) return bad(e, "messages", "messages must not be empty");
    if (n > LM_OPENAI_MAX_MESSAGES)
        return bad(e, "messages", "messages holds %zu entries; at most %d are accepted", n,
                   LM_OPENAI_MAX_MESSAGES);
    r->messages = calloc(n, sizeof *r->messages);
    if (!r->messages) return lm_api_errorf(e, 500, "server_error", NULL, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(msgs, i);
        char param[96];
        snprintf(param, sizeof param, "messages[%zu]", i);
        if (!json_is_object(m))
            return bad(e, param, "%s must be an object, not %s", param, json_kind(m));
        struct lm_chat_msg *cm = &r->messages[i];
        json_t *role = json_object_get(m, "role");
        snprintf(param, sizeof param, "messages[%zu].role", i);
        if (!json_is_string(role)) return bad(e, param, "%s must be a string", param);
        /* "developer" is taken as "system" (lm_chat_role_parse) */
        if (!lm_chat_role_parse(json_string_value(role), &cm->role))
            return bad(e, param, "%s '%s' is not one of system, developer, user, assistant", param,
                       json_string_value(role));
        if (cm->role == LM_ROLE_TOOL)
            return lm_api_errorf(e, 400, INVALID, NULL, param,
                                 "%s 'tool' is not supported: lumen does not serve tools yet",
                                 param);
        json_t *tc = field(m, "tool_calls");
        if (tc && !(json_is_array(tc) && json_array_size(tc) == 0)) {
            snprintf(param, sizeof param, "messages[%zu].tool_calls", i);
            return lm_api_errorf(e, 400, INVALID, NULL, param,
                                 "%s is not supported: lumen does not serve tools yet", param);
        }
        if (field(m, "function_call")) {
            snprintf(param, sizeof param, "messages[%zu].function_call", i);
            return lm_api_errorf(e, 400, INVALID, NULL, param,
                                 "%s is not supported: lumen does not serve tools yet", param);
        }
        lm_status st = parse_content(m, i, cm->role != LM_ROLE_ASSISTANT, &cm->content, e);
        if (st) return st;
        if (cm->role == LM_ROLE_ASSISTANT) {
            json_t *rc = field(m, "reasoning_content");
            if (rc && !json_is_string(rc)) {
                snprintf(param, sizeof param, "messages[%zu].reasoning_content", i);
                return bad(e, param, "%s must be a string, not %s", param, json_kind(rc));
            }
            cm->reasoning_content = rc ? json_string_value(rc) : NULL;
        }
    }
    r->n_messages = n;
    return LM_OK;
}

static lm_status parse_stop(struct lm_chat_request *r, struct lm_api_error *e) {
    json_t *s = field(r->root, "stop");
    if (!s) return LM_OK;
    if (json_is_string(s)) {
        if (!json_string_length(s)) return bad(e, "stop", "stop must not be an empty string");
        r->stop[r->n_stop++] = json_string_value(s);
        return LM_OK;
    }
    if (!json_is_array(s))
        return bad(e, "stop", "stop must be a string or an array of strings, not %s", json_kind(s));
    if (json_array_size(s) > LM_OPENAI_MAX_STOP)
        return bad(e, "stop", "stop holds %zu strings; at most %d are accepted", json_array_size(s),
                   LM_OPENAI_MAX_STOP);
    size_t i;
    json_t *v;
    json_array_foreach(s, i, v) {
        char param[32];
        snprintf(param, sizeof param, "stop[%zu]", i);
        if (!json_is_string(v))
            return bad(e, param, "%s must be a string, not %s", param, json_kind(v));
        if (!json_string_length(v)) return bad(e, param, "%s must not be empty", param);
        r->stop[r->n_stop++] = json_string_value(v);
    }
    return LM_OK;
}

static lm_status refuse_tools(const json_t *root, struct lm_api_error *e) {
    static const char *const k_tools[] = {"tools", "tool_choice", "functions", "function_call"};
    for (size_t i = 0; i < sizeof k_tools / sizeof k_tools[0]; i++)
        if (field(root, k_tools[i]))
            return lm_api_errorf(e, 400, INVALID, NULL, k_tools[i],
                                 "%s is not supported: lumen does not serve tools yet", k_tools[i]);
    return LM_OK;
}

/* Fields both endpoints share. */
static lm_status parse_common(struct lm_chat_request *r, struct lm_api_error *e) {
    json_t *root = r->root;
    lm_status st;
    json_t *v;
    /* Features lumen does not implement are refused rather than silently ignored; their neutral
     * values ({}) are accepted because SDKs send them. */
    if ((v = field(root, "logit_bias")) && !(json_is_object(v) && json_object_size(v) == 0))
        return lm_api_errorf(e, 400, INVALID, NULL, "logit_bias",
                             "logit_bias is not supported yet");

    json_t *model = field(root, "model");
    if (model && !json_is_string(model))
        return bad(e, "model", "model must be a string, not %s", json_kind(model));
    r->model = model ? json_string_value(model) : "";

    long long n = 1;
    if ((st = get_int(root, "n", 1, &n, NULL, e))) return st;
    if (n > LM_OPENAI_MAX_N)
        return bad(e, "n", "n is %lld; at most %d choices are supported", n, LM_OPENAI_MAX_N);
    r->n = (int)n;

    long long mt = -1;
    bool given = false;
    if ((st = get_int(root, "max_tokens", 1, &mt, &given, e))) return st;
    r->max_tokens_field = "max_tokens";
    bool given_mct = false;
    if ((st = get_int(root, "max_completion_tokens", 1, &mt, &given_mct, e))) return st;
    if (given_mct) r->max_tokens_field = "max_completion_tokens";
    given = given || given_mct;
    if (mt > 1 << 30) mt = 1 << 30;
    r->max_tokens = given ? (int)mt : -1;

    if ((st = get_number(root, "temperature", 0, 2, false, &r->temperature, e))) return st;
    if ((st = get_number(root, "top_p", 0, 1, true, &r->top_p, e))) return st;
    long long k = 0;
    if ((st = get_int(root, "top_k", -1, &k, &r->has_top_k, e))) return st;
    if (k > 1 << 30) k = 1 << 30;
    r->top_k = k < 0 ? 0 : (int)k;
    if ((st = get_number(root, "min_p", 0, 1, false, &r->min_p, e))) return st;
    if ((st = get_number(root, "presence_penalty", -2, 2, false, &r->presence_penalty, e)))
        return st;
    if ((st = get_number(root, "frequency_penalty", -2, 2, false, &r->frequency_penalty, e)))
        return st;
    if ((st = get_number(root, "repetition_penalty", 0, 1e6, true, &r->repetition_penalty, e)))
        return st;

    json_t *seed = field(root, "seed");
    if (seed) {
        if (!json_is_integer(seed))
            return bad(e, "seed", "seed must be an integer, not %s", json_kind(seed));
        r->seed = (uint64_t)json_integer_value(seed);
        r->has_seed = true;
    }

    if ((st = parse_stop(r, e))) return st;
    if ((st = get_bool(root, "stream", "stream", &r->stream, e))) return st;
    if ((st = get_bool(root, "ignore_eos", "ignore_eos", &r->ignore_eos, e))) return st;

    json_t *so = field(root, "stream_options");
    if (so) {
        if (!json_is_object(so))
            return bad(e, "stream_options", "stream_options must be an object, not %s",
                       json_kind(so));
        if (!r->stream)
            return bad(e, "stream_options", "stream_options is only allowed when stream is true");
        if ((st = get_bool(so, "include_usage", "stream_options.include_usage", &r->include_usage,
                           e)))
            return st;
    }
    return LM_OK;
}

static lm_status parse_chat_fields(struct lm_chat_request *r, struct lm_api_error *e) {
    json_t *root = r->root;
    lm_status st = refuse_tools(root, e);
    if (st) return st;
    json_t *v;
    if ((v = field(root, "response_format"))) {
        json_t *t = json_object_get(v, "type");
        if (!json_is_string(t) || strcmp(json_string_value(t), "text"))
            return lm_api_errorf(
                e, 400, INVALID, NULL, "response_format",
                "response_format is not supported yet (only {\"type\": \"text\"})");
    }
    if ((st = parse_messages(r, e))) return st;
    if ((st = parse_common(r, e))) return st;

    if ((st = get_bool(root, "logprobs", "logprobs", &r->logprobs, e))) return st;
    long long tl = 0;
    bool tl_given = false;
    if ((st = get_int(root, "top_logprobs", 0, &tl, &tl_given, e))) return st;
    if (tl > LM_MAX_TOP_LOGPROBS)
        return bad(e, "top_logprobs", "top_logprobs is %lld; it must be in [0, %d]", tl,
                   LM_MAX_TOP_LOGPROBS);
    if (tl > 0 && !r->logprobs)
        return bad(e, "top_logprobs", "top_logprobs needs logprobs set to true");
    r->top_logprobs = (int)tl;

    r->chat.add_generation_prompt = true;
    r->chat.enable_thinking = -1;
    json_t *kw = field(root, "chat_template_kwargs");
    if (kw) {
        if (!json_is_object(kw))
            return bad(e, "chat_template_kwargs", "chat_template_kwargs must be an object, not %s",
                       json_kind(kw));
        json_t *et = field(kw, "enable_thinking");
        if (et) {
            if (!json_is_boolean(et))
                return bad(e, "chat_template_kwargs.enable_thinking",
                           "chat_template_kwargs.enable_thinking must be a boolean, not %s",
                           json_kind(et));
            r->chat.enable_thinking = json_is_true(et) ? 1 : 0;
        }
    }
    return LM_OK;
}

/* A prompt of token ids: a non-empty array of integers in [0, 2^31). */
static lm_status parse_ids(const json_t *a, const char *param, struct lm_chat_request *r,
                           struct lm_api_error *e) {
    size_t n = json_array_size(a);
    if (n == 0) return bad(e, param, "%s must not be empty", param);
    r->prompt_ids = malloc(n * sizeof *r->prompt_ids);
    if (!r->prompt_ids) return lm_api_errorf(e, 500, "server_error", NULL, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return bad(e, param, "%s[%zu] must be a token id (a non-negative integer), not %s",
                       param, i, json_is_integer(v) ? "a negative number" : json_kind(v));
        r->prompt_ids[i] = (int32_t)json_integer_value(v);
    }
    r->n_prompt_ids = n;
    return LM_OK;
}

static lm_status parse_completion_fields(struct lm_chat_request *r, struct lm_api_error *e) {
    json_t *root = r->root;
    lm_status st = refuse_tools(root, e);
    if (st) return st;
    json_t *p = field(root, "prompt");
    if (!p) return bad(e, "prompt", "prompt is required");
    if (json_is_array(p) && json_array_size(p) >= 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0)))) {
        if (json_array_size(p) > 1)
            return bad(e, "prompt", "prompt holds %zu prompts; lumen takes one prompt per request",
                       json_array_size(p));
        p = json_array_get(p, 0); /* a batch of one */
    }
    if (json_is_string(p)) {
        if (!json_string_length(p)) return bad(e, "prompt", "prompt must not be empty");
        r->prompt = json_string_value(p);
    } else if (json_is_array(p)) {
        if ((st = parse_ids(p, "prompt", r, e))) return st;
    } else {
        return bad(e, "prompt", "prompt must be a string or an array of token ids, not %s",
                   json_kind(p));
    }
    if ((st = parse_common(r, e))) return st;

    json_t *v;
    if ((v = field(root, "echo")) && !json_is_false(v))
        return lm_api_errorf(e, 400, INVALID, NULL, "echo", "echo is not supported");
    if ((v = field(root, "suffix")) && !(json_is_string(v) && json_string_length(v) == 0))
        return lm_api_errorf(e, 400, INVALID, NULL, "suffix", "suffix is not supported");
    if ((v = field(root, "best_of")) && !(json_is_integer(v) && json_integer_value(v) == 1))
        return lm_api_errorf(e, 400, INVALID, NULL, "best_of", "best_of is not supported (only 1)");
    long long lp = -1;
    if ((st = get_int(root, "logprobs", 0, &lp, &r->logprobs, e))) return st;
    if (lp > LM_MAX_TOP_LOGPROBS)
        return bad(e, "logprobs", "logprobs is %lld; it must be in [0, %d]", lp,
                   LM_MAX_TOP_LOGPROBS);
    r->top_logprobs = r->logprobs ? (int)lp : 0;
    return LM_OK;
}

static lm_status parse_body(const char *body, size_t len, enum lm_api_endpoint ep,
                            struct lm_chat_request *req, struct lm_api_error *err) {
    memset(req, 0, sizeof *req);
    req->endpoint = ep;
    req->max_tokens = -1;
    req->temperature = -1;
    req->top_p = -1;
    req->repetition_penalty = 1;
    req->n = 1;
    lm_status st = load_body(body, len, &req->root, err);
    if (!st && !json_is_object(req->root))
        st = bad(err, "", "request body must be a JSON object, not %s", json_kind(req->root));
    else if (!st)
        st = ep == LM_API_CHAT ? parse_chat_fields(req, err) : parse_completion_fields(req, err);
    if (st) lm_chat_request_free(req);
    return st;
}

lm_status lm_chat_request_parse(const char *body, size_t len, struct lm_chat_request *req,
                                struct lm_api_error *err) {
    return parse_body(body, len, LM_API_CHAT, req, err);
}

lm_status lm_completion_request_parse(const char *body, size_t len, struct lm_chat_request *req,
                                      struct lm_api_error *err) {
    return parse_body(body, len, LM_API_COMPLETIONS, req, err);
}

void lm_chat_request_free(struct lm_chat_request *req) {
    if (!req) return;
    free(req->messages);
    free(req->prompt_ids);
    json_decref(req->root);
    memset(req, 0, sizeof *req);
}

const char *lm_api_endpoint_path(enum lm_api_endpoint e) {
    return e == LM_API_COMPLETIONS ? "/v1/completions" : "/v1/chat/completions";
}

/* Tokenizes the prompt of `req` into `prompt` (see lm_chat_request_prompt). */
static lm_status prompt_ids(const struct lm_model *m, const struct lm_chat_request *req,
                            struct lm_ids *prompt, struct lm_buf *rendered,
                            struct lm_api_error *err) {
    if (req->endpoint == LM_API_COMPLETIONS && req->prompt_ids) {
        int vocab = lm_model_config(m)->vocab_size;
        for (size_t i = 0; i < req->n_prompt_ids; i++)
            if (req->prompt_ids[i] >= vocab)
                return lm_api_errorf(
                    err, 400, INVALID, NULL, "prompt",
                    "prompt[%zu] is %d; token ids must be below the vocabulary size %d", i,
                    req->prompt_ids[i], vocab);
        lm_ids_append(prompt, req->prompt_ids, req->n_prompt_ids);
        return LM_OK;
    }
    const char *param = req->endpoint == LM_API_CHAT ? "messages" : "prompt";
    struct lm_buf text = {0};
    if (req->endpoint == LM_API_CHAT) {
        lm_status st = lm_model_render_chat(m, req->messages, req->n_messages, &req->chat, &text);
        if (st) {
            lm_buf_free(&text);
            if (st == LM_ERR_NOMEM)
                return lm_api_errorf(err, 500, "server_error", NULL, NULL, "out of memory");
            return lm_api_errorf(err, 400, INVALID, NULL, param, "messages: %s",
                                 lm_error_message());
        }
    } else {
        lm_buf_puts(&text, req->prompt);
    }
    lm_status st =
        lm_tokenizer_encode(lm_model_tokenizer(m), text.p ? text.p : "", text.len, 0, prompt);
    if (!st && rendered) lm_buf_append(rendered, text.p ? text.p : "", text.len);
    lm_buf_free(&text);
    if (st)
        return lm_api_errorf(err, 400, INVALID, NULL, param, "%s: %s", param, lm_error_message());
    return LM_OK;
}

lm_status lm_chat_request_prompt(const struct lm_model *m, const struct lm_chat_request *req,
                                 int ctx, struct lm_ids *prompt, int *max_tokens,
                                 struct lm_buf *rendered, struct lm_api_error *err) {
    size_t before = prompt->n;
    lm_status st = prompt_ids(m, req, prompt, rendered, err);
    if (st) return st;
    const char *param = req->endpoint == LM_API_CHAT ? "messages" : "prompt";
    long long n = (long long)(prompt->n - before);
    const char *mtf = req->max_tokens_field ? req->max_tokens_field : "max_tokens";
    if (req->max_tokens > 0) {
        if (n + req->max_tokens > ctx)
            return lm_api_errorf(
                err, 400, INVALID, "context_length_exceeded", n < ctx ? mtf : param,
                "prompt has %lld tokens and %s is %d; the context holds %d", n, mtf, req->max_tokens,
                ctx);
        *max_tokens = req->max_tokens;
    } else {
        if (n >= ctx)
            return lm_api_errorf(err, 400, INVALID, "context_length_exceeded", param,
                                 "prompt has %lld tokens; the context holds %d, which leaves no "
                                 "room for a completion",
                                 n, ctx);
        *max_tokens = ctx - (int)n;
        if (req->endpoint == LM_API_COMPLETIONS &&
            *max_tokens > LM_OPENAI_COMPLETIONS_DEFAULT_MAX_TOKENS)
            *max_tokens = LM_OPENAI_COMPLETIONS_DEFAULT_MAX_TOKENS;
    }
    return LM_OK;
}

struct lm_sampling_params lm_chat_request_sampling(const struct lm_chat_request *req,
                                                   const struct lm_gen_defaults *d, int choice) {
    struct lm_sampling_params p = {.temperature = 0, .top_p = 1, .top_k = 0};
    if (req->temperature >= 0)
        p.temperature = (float)req->temperature;
    else if (d && d->temperature >= 0)
        p.temperature = d->temperature;
    if (req->top_p > 0)
        p.top_p = (float)req->top_p;
    else if (d && d->top_p > 0 && d->top_p <= 1)
        p.top_p = d->top_p;
    if (req->has_top_k)
        p.top_k = req->top_k;
    else if (d && d->top_k >= 0)
        p.top_k = d->top_k;
    p.seeded = req->has_seed;
    p.seed = req->seed + (uint64_t)(choice > 0 ? choice : 0);
    p.min_p = (float)req->min_p;
    p.presence_penalty = (float)req->presence_penalty;
    p.frequency_penalty = (float)req->frequency_penalty;
    p.repetition_penalty = (float)req->repetition_penalty;
    p.logprobs = req->logprobs;
    p.top_logprobs = req->top_logprobs;
    return p;
}

/* ---- capabilities ------------------------------------------------------------------------- */

unsigned lm_api_endpoint_task(enum lm_api_endpoint e) {
    return e == LM_API_COMPLETIONS ? LM_TASK_TEXT_GENERATION : LM_TASK_TEXT_CONVERSATION;
}

const char *lm_task_name(unsigned task) {
    switch (task) {
    case LM_TASK_TEXT_GENERATION: return "text_generation";
    case LM_TASK_TEXT_CONVERSATION: return "text_conversation";
    }
    return NULL;
}

static json_t *task_list(unsigned tasks) {
    json_t *a = json_array();
    for (unsigned b = 1; b; b <<= 1)
        if ((tasks & b) && lm_task_name(b)) json_array_append_new(a, json_string(lm_task_name(b)));
    return a;
}

lm_status lm_api_check_task(unsigned tasks, unsigned need, const char *model,
                            struct lm_api_error *err) {
    if ((tasks & need) == need) return LM_OK;
    struct lm_buf has = {0};
    for (unsigned b = 1; b; b <<= 1)
        if ((tasks & b) && lm_task_name(b))
            lm_buf_printf(&has, "%s%s", has.len ? ", " : "", lm_task_name(b));
    lm_status st =
        lm_api_errorf(err, 400, INVALID, "model_not_capable", "model",
                      "model %s does not support the task %s (it declares: %s)", model,
                      lm_task_name(need) ? lm_task_name(need) : "?", has.len ? has.p : "none");
    lm_buf_free(&has);
    return st;
}

/* ---- responses -------------------------------------------------------------------------- */

/* A JSON string from bytes that should be UTF-8; invalid sequences become U+FFFD. */
static json_t *utf8_string(const char *s, size_t len) {
    json_t *j = json_stringn(s ? s : "", s ? len : 0);
    if (j) return j;
    struct lm_buf b = {0};
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        unsigned c = p[i];
        size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = n > 0 && i + n <= len;
        for (size_t k = 1; ok && k < n; k++)
            ok = (p[i + k] & 0xC0) == 0x80;
        if (ok && n > 1) { /* reject overlong forms, surrogates and values past U+10FFFF */
            unsigned cp = c & (0x7F >> n);
            for (size_t k = 1; k < n; k++)
                cp = cp << 6 | (p[i + k] & 0x3F);
            static const unsigned k_min[5] = {0, 0, 0x80, 0x800, 0x10000};
            ok = cp >= k_min[n] && cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF);
        }
        if (ok) {
            lm_buf_append(&b, p + i, n);
            i += n;
        } else {
            lm_buf_append(&b, "\xEF\xBF\xBD", 3);
            i++;
        }
    }
    j = json_stringn(b.p ? b.p : "", b.len);
    lm_buf_free(&b);
    return j ? j : json_string("");
}

/* Compact JSON; reals (logprobs, float32 values) with 9 significant digits, which round-trip a
 * float32. */
static char *dump(json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9));
    json_decref(j);
    if (!s) abort(); /* only on allocation failure, as lm_buf does */
    return s;
}

static json_t *usage_obj(const struct lm_openai_usage *u) {
    json_t *o =
        json_pack("{s:i, s:i, s:i}", "prompt_tokens", u->prompt_tokens, "completion_tokens",
                  u->completion_tokens, "total_tokens", u->prompt_tokens + u->completion_tokens);
    if (u->cached_tokens >= 0)
        json_object_set_new(o, "prompt_tokens_details",
                            json_pack("{s:i}", "cached_tokens", u->cached_tokens));
    return o;
}

static bool is_chat(const struct lm_openai_meta *meta) {
    return meta->endpoint == LM_API_CHAT;
}

static json_t *base_obj(const struct lm_openai_meta *meta, bool chunk) {
    const char *object =
        is_chat(meta) ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
    return json_pack("{s:s, s:s, s:I, s:s}", "id", meta->id, "object", object, "created",
                     (json_int_t)meta->created, "model", meta->model);
}

const char *lm_openai_finish_reason(enum lm_finish f) {
    return f == LM_FINISH_LENGTH ? "length" : "stop";
}

/* A logprob as JSON: -inf (a masked token) becomes -9999.0, as OpenAI and vLLM report it. */
static json_t *logprob_num(float lp) {
    return json_real(lp > -9999.0f ? (double)lp : -9999.0);
}

/* The text of one token (special tokens spelled out), lossy UTF-8 as vLLM's decode gives it. */
static void token_text(const struct lm_openai_meta *meta, int32_t id, struct lm_buf *out) {
    lm_buf_reset(out);
    if (meta->tok) lm_tokenizer_decode(meta->tok, &id, 1, false, out);
    if (!out->p) lm_buf_puts(out, "");
}

static json_t *bytes_array(const struct lm_buf *b) {
    json_t *a = json_array();
    for (size_t i = 0; i < b->len; i++)
        json_array_append_new(a, json_integer((unsigned char)b->p[i]));
    return a;
}

/* Chat: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}. */
static json_t *chat_logprobs(const struct lm_openai_meta *meta, const struct lm_token_logprob *lp,
                             size_t n) {
    json_t *content = json_array();
    struct lm_buf t = {0};
    for (size_t i = 0; i < n; i++) {
        token_text(meta, lp[i].id, &t);
        json_t *top = json_array();
        for (int k = 0; k < lp[i].n_top; k++) {
            struct lm_buf tt = {0};
            token_text(meta, lp[i].top_id[k], &tt);
            json_array_append_new(
                top, json_pack("{s:o, s:o, s:o}", "token", utf8_string(tt.p, tt.len), "logprob",
                               logprob_num(lp[i].top_logprob[k]), "bytes", bytes_array(&tt)));
            lm_buf_free(&tt);
        }
        json_array_append_new(content,
                              json_pack("{s:o, s:o, s:o, s:o}", "token", utf8_string(t.p, t.len),
                                        "logprob", logprob_num(lp[i].logprob), "bytes",
                                        bytes_array(&t), "top_logprobs", top));
    }
    lm_buf_free(&t);
    return json_pack("{s:o}", "content", content);
}

/* Completions: {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}; the
 * sampled token is always in its top_logprobs entry (up to logprobs + 1 entries, as OpenAI). */
static json_t *completion_logprobs(const struct lm_openai_meta *meta,
                                   const struct lm_token_logprob *lp, size_t n, size_t offset0) {
    json_t *tokens = json_array(), *values = json_array(), *tops = json_array(),
           *offs = json_array();
    struct lm_buf t = {0}, tt = {0};
    size_t off = offset0;
    for (size_t i = 0; i < n; i++) {
        token_text(meta, lp[i].id, &t);
        json_array_append_new(tokens, utf8_string(t.p, t.len));
        json_array_append_new(values, logprob_num(lp[i].logprob));
        json_array_append_new(offs, json_integer((json_int_t)off));
        off += t.len;
        json_t *top = json_object();
        for (int k = 0; k < lp[i].n_top; k++) {
            token_text(meta, lp[i].top_id[k], &tt);
            json_object_set_new(top, tt.p, logprob_num(lp[i].top_logprob[k]));
        }
        if (!json_object_get(top, t.p)) json_object_set_new(top, t.p, logprob_num(lp[i].logprob));
        json_array_append_new(tops, top);
    }
    lm_buf_free(&t);
    lm_buf_free(&tt);
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", values,
                     "top_logprobs", tops, "text_offset", offs);
}

static json_t *logprobs_obj(const struct lm_openai_meta *meta, const struct lm_token_logprob *lp,
                            size_t n, size_t offset0) {
    if (!lp) return json_null();
    return is_chat(meta) ? chat_logprobs(meta, lp, n) : completion_logprobs(meta, lp, n, offset0);
}

char *lm_openai_response(const struct lm_openai_meta *meta, const struct lm_openai_choice *choices,
                         size_t n, const struct lm_openai_usage *usage) {
    json_t *o = base_obj(meta, false);
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) {
        const struct lm_openai_choice *c = &choices[i];
        json_t *choice;
        if (is_chat(meta)) {
            json_t *msg = json_pack("{s:s, s:o}", "role", "assistant", "content",
                                    utf8_string(c->text, c->len));
            if (c->reasoning)
                json_object_set_new(msg, "reasoning_content",
                                    c->reasoning_len ? utf8_string(c->reasoning, c->reasoning_len)
                                                     : json_null());
            choice = json_pack("{s:i, s:o, s:o, s:s}", "index", (int)i, "message", msg, "logprobs",
                               logprobs_obj(meta, c->logprobs, c->n_logprobs, 0), "finish_reason",
                               c->finish_reason);
        } else {
            choice = json_pack("{s:i, s:o, s:o, s:s}", "index", (int)i, "text",
                               utf8_string(c->text, c->len), "logprobs",
                               logprobs_obj(meta, c->logprobs, c->n_logprobs, 0), "finish_reason",
                               c->finish_reason);
        }
        json_array_append_new(arr, choice);
    }
    json_object_set_new(o, "choices", arr);
    json_object_set_new(o, "usage", usage_obj(usage));
    return dump(o);
}

static void sse(struct lm_buf *out, json_t *j) {
    char *s = dump(j);
    lm_buf_puts(out, "data: ");
    lm_buf_puts(out, s);
    lm_buf_puts(out, "\n\n");
    free(s);
}

void lm_openai_chunk(struct lm_buf *out, const struct lm_openai_meta *meta,
                     const struct lm_openai_delta *d, bool usage_null) {
    json_t *o = base_obj(meta, true);
    json_t *choice;
    json_t *fr = d->finish_reason ? json_string(d->finish_reason) : json_null();
    if (is_chat(meta)) {
        json_t *delta = json_object();
        if (d->role) json_object_set_new(delta, "role", json_string(d->role));
        if (d->content) json_object_set_new(delta, "content", utf8_string(d->content, d->len));
        if (d->reasoning)
            json_object_set_new(delta, "reasoning_content",
                                utf8_string(d->reasoning, d->reasoning_len));
        choice = json_pack("{s:i, s:o, s:o, s:o}", "index", d->index, "delta", delta, "logprobs",
                           logprobs_obj(meta, d->logprobs, d->n_logprobs, 0), "finish_reason", fr);
    } else {
        choice = json_pack(
            "{s:i, s:o, s:o, s:o}", "index", d->index, "text",
            utf8_string(d->content ? d->content : "", d->content ? d->len : 0), "logprobs",
            logprobs_obj(meta, d->logprobs, d->n_logprobs, d->text_offset), "finish_reason", fr);
    }
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    if (usage_null) json_object_set_new(o, "usage", json_null());
    sse(out, o);
}

void lm_openai_usage_chunk(struct lm_buf *out, const struct lm_openai_meta *meta,
                           const struct lm_openai_usage *usage) {
    json_t *o = base_obj(meta, true);
    json_object_set_new(o, "choices", json_array());
    json_object_set_new(o, "usage", usage_obj(usage));
    sse(out, o);
}

void lm_openai_done(struct lm_buf *out) {
    lm_buf_puts(out, "data: [DONE]\n\n");
}

char *lm_openai_error_json(const struct lm_api_error *e) {
    json_t *err =
        json_pack("{s:o, s:s, s:o, s:o}", "message", utf8_string(e->message, strlen(e->message)),
                  "type", e->type ? e->type : INVALID, "param",
                  e->param[0] ? utf8_string(e->param, strlen(e->param)) : json_null(), "code",
                  e->code ? json_string(e->code) : json_null());
    return dump(json_pack("{s:o}", "error", err));
}

static json_t *model_obj(const char *name, long long created, int max_model_len, unsigned tasks) {
    return json_pack("{s:o, s:s, s:I, s:s, s:i, s:o}", "id", utf8_string(name, strlen(name)),
                     "object", "model", "created", (json_int_t)created, "owned_by", "lumen",
                     "max_model_len", max_model_len, "capabilities", task_list(tasks));
}

char *lm_openai_models(const char *name, long long created, int max_model_len, unsigned tasks) {
    return dump(json_pack("{s:s, s:[o]}", "object", "list", "data",
                          model_obj(name, created, max_model_len, tasks)));
}

char *lm_openai_model(const char *name, long long created, int max_model_len, unsigned tasks) {
    return dump(model_obj(name, created, max_model_len, tasks));
}

lm_status lm_api_check_model(const char *served, const char *requested, struct lm_api_error *err) {
    if (!requested || !*requested || !strcmp(requested, served)) return LM_OK;
    return lm_api_errorf(err, 404, INVALID, "model_not_found", "model",
                         "The model `%s` does not exist.", requested);
}

/* The optional "model" of a /tokenize or /detokenize body (vLLM checks it as for generation). */
static lm_status check_body_model(const struct lm_model *m, const json_t *root,
                                  struct lm_api_error *err) {
    json_t *model = field(root, "model");
    if (!model) return LM_OK;
    if (!json_is_string(model))
        return bad(err, "model", "model must be a string, not %s", json_kind(model));
    return lm_api_check_model(lm_model_name(m), json_string_value(model), err);
}

/* ---- /tokenize and /detokenize ------------------------------------------------------------ */

lm_status lm_openai_tokenize(const struct lm_model *m, unsigned tasks, const char *body, size_t len,
                             int ctx, char **out, struct lm_api_error *err) {
    *out = NULL;
    json_t *root;
    lm_status lst = load_body(body, len, &root, err);
    if (lst) return lst;
    lm_status st = LM_OK;
    struct lm_ids ids = {0};
    struct lm_chat_request req = {0};
    json_t *prompt = field(root, "prompt"), *msgs = field(root, "messages");
    if (!json_is_object(root)) {
        st = bad(err, "", "request body must be a JSON object, not %s", json_kind(root));
    } else if ((st = check_body_model(m, root, err))) { /* 400 or 404: err is filled */
    } else if (prompt && msgs) {
        st = bad(err, "messages", "give either prompt or messages, not both");
    } else if (prompt) {
        bool special = true; /* add_special_tokens: Qwen3's tokenizer adds none either way */
        if (!json_is_string(prompt))
            st = bad(err, "prompt", "prompt must be a string, not %s", json_kind(prompt));
        else if (!(st =
                       get_bool(root, "add_special_tokens", "add_special_tokens", &special, err)) &&
                 lm_tokenizer_encode(lm_model_tokenizer(m), json_string_value(prompt),
                                     json_string_length(prompt), 0, &ids))
            st = bad(err, "prompt", "prompt: %s", lm_error_message());
    } else if (msgs) {
        if (!(st = lm_api_check_task(tasks, LM_TASK_TEXT_CONVERSATION, lm_model_name(m), err)) &&
            !(st = lm_chat_request_parse(body, len, &req, err))) {
            bool agp = true;
            if (!(st = get_bool(root, "add_generation_prompt", "add_generation_prompt", &agp,
                                err))) {
                req.chat.add_generation_prompt = agp;
                int ignored;
                st = lm_chat_request_prompt(m, &req, INT32_MAX, &ids, &ignored, NULL, err);
            }
        }
    } else {
        st = bad(err, "prompt", "give prompt (a string) or messages (a conversation)");
    }
    if (!st) {
        json_t *t = json_array();
        for (size_t i = 0; i < ids.n; i++)
            json_array_append_new(t, json_integer(ids.v[i]));
        *out = dump(
            json_pack("{s:i, s:i, s:o}", "count", (int)ids.n, "max_model_len", ctx, "tokens", t));
    }
    lm_chat_request_free(&req);
    lm_ids_free(&ids);
    json_decref(root);
    return st;
}

lm_status lm_openai_detokenize(const struct lm_model *m, const char *body, size_t len, char **out,
                               struct lm_api_error *err) {
    *out = NULL;
    json_t *root;
    lm_status lst = load_body(body, len, &root, err);
    if (lst) return lst;
    lm_status st = LM_OK;
    json_t *tokens = json_is_object(root) ? field(root, "tokens") : NULL;
    struct lm_ids ids = {0};
    int vocab = lm_model_config(m)->vocab_size;
    if (!json_is_object(root)) {
        st = bad(err, "", "request body must be a JSON object, not %s", json_kind(root));
    } else if ((st = check_body_model(m, root, err))) { /* 400 or 404: err is filled */
    } else if (!tokens) {
        st = bad(err, "tokens", "tokens is required");
    } else if (!json_is_array(tokens)) {
        st = bad(err, "tokens", "tokens must be an array of token ids, not %s", json_kind(tokens));
    } else {
        size_t i;
        json_t *v;
        json_array_foreach(tokens, i, v) {
            char param[32];
            snprintf(param, sizeof param, "tokens[%zu]", i);
            if (!json_is_integer(v)) {
                st = bad(err, param, "%s must be an integer, not %s", param, json_kind(v));
                break;
            }
            json_int_t id = json_integer_value(v);
            if (id < 0 || id >= vocab) {
                st = bad(err, param, "%s is %lld; token ids are in [0, %d)", param, (long long)id,
                         vocab);
                break;
            }
            lm_ids_push(&ids, (int32_t)id);
        }
    }
    if (!st) {
        struct lm_buf text = {0};
        if (lm_tokenizer_decode(lm_model_tokenizer(m), ids.v, ids.n, false, &text))
            st = bad(err, "tokens", "tokens: %s", lm_error_message());
        else
            *out = dump(json_pack("{s:o}", "prompt", utf8_string(text.p, text.len)));
        lm_buf_free(&text);
    }
    lm_ids_free(&ids);
    json_decref(root);
    return st;
}
