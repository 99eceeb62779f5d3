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
    lm_status st = status == 429 ? LM_ERR_RANGE : status < 500 ? LM_ERR_INVALID : LM_ERR_UNSUPPORTED;
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

static lm_status get_bool(const json_t *obj, const char *key, const char *param, bool *out,
                          struct lm_api_error *e) {
    json_t *v = field(obj, key);
    if (!v) return LM_OK;
    if (!json_is_boolean(v))
        return bad(e, param, "%s must be a boolean, not %s", param, json_kind(v));
    *out = json_is_true(v);
    return LM_OK;
}

static lm_status get_number(const json_t *obj, const char *key, double lo, double hi,
                            bool lo_open, double *out, struct lm_api_error *e) {
    json_t *v = field(obj, key);
    if (!v) return LM_OK;
    if (!json_is_number(v))
        return bad(e, key, "%s must be a number, not %s", key, json_kind(v));
    double x = json_number_value(v);
    if (!isfinite(x) || (lo_open ? x <= lo : x < lo) || x > hi)
        return bad(e, key, "%s is %g; it must be in %s%g, %g]", key, x, lo_open ? "(" : "[", lo, hi);
    *out = x;
    return LM_OK;
}

static lm_status get_int(const json_t *obj, const char *key, long long lo, long long *out,
                         bool *given, struct lm_api_error *e) {
    json_t *v = field(obj, key);
    if (!v) return LM_OK;
    if (!json_is_integer(v))
        return bad(e, key, "%s must be an integer, not %s", key, json_kind(v));
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
        if (!json_is_object(m)) return bad(e, param, "%s must be an object, not %s", param, json_kind(m));
        struct lm_chat_msg *cm = &r->messages[i];
        json_t *role = json_object_get(m, "role");
        snprintf(param, sizeof param, "messages[%zu].role", i);
        if (!json_is_string(role)) return bad(e, param, "%s must be a string", param);
        if (!lm_chat_role_parse(json_string_value(role), &cm->role))
            return bad(e, param, "%s '%s' is not one of system, user, assistant", param,
                       json_string_value(role));
        if (cm->role == LM_ROLE_TOOL)
            return lm_api_errorf(e, 400, INVALID, NULL, param,
                                 "%s 'tool' is not supported: lumen does not serve tools yet", param);
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
        if (!json_is_string(v)) return bad(e, param, "%s must be a string, not %s", param, json_kind(v));
        if (!json_string_length(v)) return bad(e, param, "%s must not be empty", param);
        r->stop[r->n_stop++] = json_string_value(v);
    }
    return LM_OK;
}

static lm_status parse_fields(struct lm_chat_request *r, struct lm_api_error *e) {
    json_t *root = r->root;
    static const char *const k_tools[] = {"tools", "tool_choice", "functions", "function_call"};
    for (size_t i = 0; i < sizeof k_tools / sizeof k_tools[0]; i++)
        if (field(root, k_tools[i]))
            return lm_api_errorf(e, 400, INVALID, NULL, k_tools[i],
                                 "%s is not supported: lumen does not serve tools yet", k_tools[i]);

    /* Features lumen does not implement yet are refused rather than silently ignored; their
     * neutral values (false, 0, {}, "text") are accepted because SDKs send them. */
    json_t *v;
    if ((v = field(root, "logprobs")) && !json_is_false(v))
        return lm_api_errorf(e, 400, INVALID, NULL, "logprobs", "logprobs is not supported yet");
    if ((v = field(root, "top_logprobs")) && !(json_is_integer(v) && json_integer_value(v) == 0))
        return lm_api_errorf(e, 400, INVALID, NULL, "top_logprobs", "top_logprobs is not supported yet");
    static const char *const k_penalties[] = {"presence_penalty", "frequency_penalty"};
    for (size_t i = 0; i < 2; i++)
        if ((v = field(root, k_penalties[i])) && !(json_is_number(v) && json_number_value(v) == 0))
            return lm_api_errorf(e, 400, INVALID, NULL, k_penalties[i],
                                 "%s is not supported yet (only 0)", k_penalties[i]);
    if ((v = field(root, "repetition_penalty")) && !(json_is_number(v) && json_number_value(v) == 1))
        return lm_api_errorf(e, 400, INVALID, NULL, "repetition_penalty",
                             "repetition_penalty is not supported yet (only 1)");
    if ((v = field(root, "logit_bias")) && !(json_is_object(v) && json_object_size(v) == 0))
        return lm_api_errorf(e, 400, INVALID, NULL, "logit_bias", "logit_bias is not supported yet");
    if ((v = field(root, "response_format"))) {
        json_t *t = json_object_get(v, "type");
        if (!json_is_string(t) || strcmp(json_string_value(t), "text"))
            return lm_api_errorf(e, 400, INVALID, NULL, "response_format",
                                 "response_format is not supported yet (only {\"type\": \"text\"})");
    }

    lm_status st = parse_messages(r, e);
    if (st) return st;

    json_t *model = field(root, "model");
    if (model && !json_is_string(model))
        return bad(e, "model", "model must be a string, not %s", json_kind(model));
    r->model = model ? json_string_value(model) : "";

    long long n = 1;
    if ((st = get_int(root, "n", 1, &n, NULL, e))) return st;
    if (n != 1) return bad(e, "n", "n is %lld; only n = 1 is supported", n);

    long long mt = -1;
    bool given = false;
    if ((st = get_int(root, "max_tokens", 1, &mt, &given, e))) return st;
    if ((st = get_int(root, "max_completion_tokens", 1, &mt, &given, e))) return st;
    if (mt > 1 << 30) mt = 1 << 30;
    r->max_tokens = given ? (int)mt : -1;

    if ((st = get_number(root, "temperature", 0, 2, false, &r->temperature, e))) return st;
    if ((st = get_number(root, "top_p", 0, 1, true, &r->top_p, e))) return st;
    long long k = 0;
    if ((st = get_int(root, "top_k", -1, &k, &r->has_top_k, e))) return st;
    if (k > 1 << 30) k = 1 << 30;
    r->top_k = k < 0 ? 0 : (int)k;

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
            return bad(e, "stream_options", "stream_options must be an object, not %s", json_kind(so));
        if (!r->stream)
            return bad(e, "stream_options", "stream_options is only allowed when stream is true");
        if ((st = get_bool(so, "include_usage", "stream_options.include_usage", &r->include_usage, e)))
            return st;
    }

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

lm_status lm_chat_request_parse(const char *body, size_t len, struct lm_chat_request *req,
                                struct lm_api_error *err) {
    memset(req, 0, sizeof *req);
    req->max_tokens = -1;
    req->temperature = -1;
    req->top_p = -1;
    json_error_t jerr;
    req->root = json_loadb(body ? body : "", len, JSON_REJECT_DUPLICATES, &jerr);
    if (!req->root)
        return bad(err, "", "request body is not valid JSON: %s (line %d, column %d)", jerr.text,
                   jerr.line, jerr.column);
    if (!json_is_object(req->root)) {
        lm_status st = bad(err, "", "request body must be a JSON object, not %s", json_kind(req->root));
        lm_chat_request_free(req);
        return st;
    }
    lm_status st = parse_fields(req, err);
    if (st) {
        lm_chat_request_free(req);
        req->max_tokens = -1;
        req->temperature = -1;
        req->top_p = -1;
    }
    return st;
}

void lm_chat_request_free(struct lm_chat_request *req) {
    if (!req) return;
    free(req->messages);
    json_decref(req->root);
    memset(req, 0, sizeof *req);
}

lm_status lm_chat_request_prompt(const struct lm_model *m, const struct lm_chat_request *req,
                                 int ctx, struct lm_ids *prompt, int *max_tokens,
                                 struct lm_api_error *err) {
    struct lm_buf text = {0};
    lm_status st = lm_model_render_chat(m, req->messages, req->n_messages, &req->chat, &text);
    if (st) {
        lm_buf_free(&text);
        if (st == LM_ERR_NOMEM) return lm_api_errorf(err, 500, "server_error", NULL, NULL, "out of memory");
        return lm_api_errorf(err, 400, INVALID, NULL, "messages", "messages: %s", lm_error_message());
    }
    size_t before = prompt->n;
    st = lm_tokenizer_encode(lm_model_tokenizer(m), text.p ? text.p : "", text.len, 0, prompt);
    lm_buf_free(&text);
    if (st)
        return lm_api_errorf(err, 400, INVALID, NULL, "messages", "messages: %s", lm_error_message());
    long long n = (long long)(prompt->n - before);
    if (req->max_tokens > 0) {
        if (n + req->max_tokens > ctx)
            return lm_api_errorf(err, 400, INVALID, "context_length_exceeded", "messages",
                                 "prompt has %lld tokens and max_tokens is %d; the context holds %d",
                                 n, req->max_tokens, ctx);
        *max_tokens = req->max_tokens;
    } else {
        if (n >= ctx)
            return lm_api_errorf(err, 400, INVALID, "context_length_exceeded", "messages",
                                 "prompt has %lld tokens; the context holds %d, which leaves no "
                                 "room for a completion",
                                 n, ctx);
        *max_tokens = ctx - (int)n;
    }
    return LM_OK;
}

struct lm_sampling_params lm_chat_request_sampling(const struct lm_chat_request *req,
                                                   const struct lm_gen_defaults *d) {
    struct lm_sampling_params p = {.temperature = 0, .top_p = 1, .top_k = 0};
    if (req->temperature >= 0) p.temperature = (float)req->temperature;
    else if (d && d->temperature >= 0) p.temperature = d->temperature;
    if (req->top_p > 0) p.top_p = (float)req->top_p;
    else if (d && d->top_p > 0 && d->top_p <= 1) p.top_p = d->top_p;
    if (req->has_top_k) p.top_k = req->top_k;
    else if (d && d->top_k >= 0) p.top_k = d->top_k;
    p.seeded = req->has_seed;
    p.seed = req->seed;
    return p;
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
        for (size_t k = 1; ok && k < n; k++) ok = (p[i + k] & 0xC0) == 0x80;
        if (ok && n > 1) { /* reject overlong forms, surrogates and values past U+10FFFF */
            unsigned cp = c & (0x7F >> n);
            for (size_t k = 1; k < n; k++) cp = cp << 6 | (p[i + k] & 0x3F);
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

static char *dump(json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s) abort(); /* only on allocation failure, as lm_buf does */
    return s;
}

static json_t *usage_obj(int prompt_tokens, int completion_tokens) {
    return json_pack("{s:i, s:i, s:i}", "prompt_tokens", prompt_tokens, "completion_tokens",
                     completion_tokens, "total_tokens", prompt_tokens + completion_tokens);
}

static json_t *base_obj(const struct lm_openai_meta *meta, const char *object) {
    return json_pack("{s:s, s:s, s:I, s:s}", "id", meta->id, "object", object, "created",
                     (json_int_t)meta->created, "model", meta->model);
}

const char *lm_openai_finish_reason(enum lm_finish f) {
    return f == LM_FINISH_LENGTH ? "length" : "stop";
}

char *lm_openai_chat_completion(const struct lm_openai_meta *meta, const char *text, size_t len,
                                const char *finish_reason, int prompt_tokens,
                                int completion_tokens) {
    json_t *o = base_obj(meta, "chat.completion");
    json_t *msg = json_pack("{s:s, s:o}", "role", "assistant", "content", utf8_string(text, len));
    json_t *choice = json_pack("{s:i, s:o, s:n, s:s}", "index", 0, "message", msg, "logprobs",
                               "finish_reason", finish_reason);
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    json_object_set_new(o, "usage", usage_obj(prompt_tokens, completion_tokens));
    return dump(o);
}

static void sse(struct lm_buf *out, json_t *j) {
    char *s = dump(j);
    lm_buf_puts(out, "data: ");
    lm_buf_puts(out, s);
    lm_buf_puts(out, "\n\n");
    free(s);
}

void lm_openai_chunk(struct lm_buf *out, const struct lm_openai_meta *meta, const char *role,
                     const char *content, size_t len, const char *finish_reason, bool usage_null) {
    json_t *o = base_obj(meta, "chat.completion.chunk");
    json_t *delta = json_object();
    if (role) json_object_set_new(delta, "role", json_string(role));
    if (content) json_object_set_new(delta, "content", utf8_string(content, len));
    json_t *choice = json_pack("{s:i, s:o, s:n, s:o}", "index", 0, "delta", delta, "logprobs",
                               "finish_reason", finish_reason ? json_string(finish_reason) : json_null());
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    if (usage_null) json_object_set_new(o, "usage", json_null());
    sse(out, o);
}

void lm_openai_usage_chunk(struct lm_buf *out, const struct lm_openai_meta *meta,
                           int prompt_tokens, int completion_tokens) {
    json_t *o = base_obj(meta, "chat.completion.chunk");
    json_object_set_new(o, "choices", json_array());
    json_object_set_new(o, "usage", usage_obj(prompt_tokens, completion_tokens));
    sse(out, o);
}

void lm_openai_done(struct lm_buf *out) { lm_buf_puts(out, "data: [DONE]\n\n"); }

char *lm_openai_error_json(const struct lm_api_error *e) {
    json_t *err = json_pack("{s:o, s:s, s:o, s:o}", "message", utf8_string(e->message, strlen(e->message)),
                            "type", e->type ? e->type : INVALID, "param",
                            e->param[0] ? utf8_string(e->param, strlen(e->param)) : json_null(),
                            "code", e->code ? json_string(e->code) : json_null());
    return dump(json_pack("{s:o}", "error", err));
}

char *lm_openai_models(const char *name, long long created, int max_model_len) {
    json_t *m = json_pack("{s:o, s:s, s:I, s:s, s:i}", "id", utf8_string(name, strlen(name)),
                          "object", "model", "created", (json_int_t)created, "owned_by", "lumen",
                          "max_model_len", max_model_len);
    return dump(json_pack("{s:s, s:[o]}", "object", "list", "data", m));
}
