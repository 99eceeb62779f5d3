/* prompt.c: see prompt.h. */
#include "bench/prompt.h"

#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "family/family.h"
#include "text/tokenizer.h"

lm_status lm_bench_prompt_open(struct lm_bench_prompt *p, const char *dir) {
    memset(p, 0, sizeof *p);
    p->dir = strdup(dir);
    if (!p->dir) abort();
    bool is_dir = lm_dir_exists(dir);
    char *tj = is_dir ? lm_path_join(dir, "tokenizer.json") : strdup(dir);
    if (!tj) abort();
    lm_status st = lm_tokenizer_load(tj, &p->tok);
    free(tj);
    if (st) return st;
    if (!is_dir) return LM_OK;
    char *cj = lm_path_join(dir, "config.json");
    if (lm_file_exists(cj)) {
        json_t *cfg = NULL;
        st = lm_json_load_file(cj, &cfg);
        if (!st) {
            const char *mt = json_string_value(json_object_get(cfg, "model_type"));
            if (mt) snprintf(p->model_type, sizeof p->model_type, "%s", mt);
            json_t *mpe = json_object_get(cfg, "max_position_embeddings");
            if (json_is_integer(mpe)) p->context_tokens = (long)json_integer_value(mpe);
            p->family = mt ? lm_family_find(mt) : NULL;
        }
        json_decref(cfg);
    }
    free(cj);
    return st;
}

void lm_bench_prompt_free(struct lm_bench_prompt *p) {
    if (!p) return;
    lm_tokenizer_destroy(p->tok);
    free(p->dir);
    memset(p, 0, sizeof *p);
}

bool lm_bench_prompt_can_render(const struct lm_bench_prompt *p) {
    return p && p->tok && p->family && p->family->render_chat;
}

bool lm_bench_content_text(const json_t *content, struct lm_buf *out) {
    if (json_is_string(content)) {
        lm_buf_append(out, json_string_value(content), json_string_length(content));
        return true;
    }
    if (!json_is_array(content)) return false;
    size_t i;
    json_t *part;
    json_array_foreach(content, i, part) {
        json_t *t = json_object_get(part, "text");
        if (json_is_string(t)) lm_buf_append(out, json_string_value(t), json_string_length(t));
    }
    return true;
}

lm_status lm_bench_prompt_render_ids(const struct lm_bench_prompt *p, const json_t *messages,
                                     int enable_thinking, struct lm_ids *ids) {
    if (!lm_bench_prompt_can_render(p))
        return lm_errorf(LM_ERR_UNSUPPORTED, "%s: no chat template (config.json model_type '%s')",
                         p && p->dir ? p->dir : "?", p ? p->model_type : "");
    size_t n = json_array_size(messages);
    struct lm_chat_msg *msgs = calloc(n ? n : 1, sizeof *msgs);
    struct lm_buf *texts = calloc(n ? n : 1, sizeof *texts);
    if (!msgs || !texts) abort();
    lm_status st = LM_OK;
    for (size_t i = 0; i < n && !st; i++) {
        json_t *m = json_array_get(messages, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role || !lm_chat_role_parse(role, &msgs[i].role)) {
            st = lm_errorf(LM_ERR_INVALID, "messages[%zu].role: expected system, developer, user or "
                           "assistant", i);
            break;
        }
        json_t *c = json_object_get(m, "content");
        lm_buf_puts(&texts[i], "");
        if (c && !json_is_null(c) && !lm_bench_content_text(c, &texts[i]))
            st = lm_errorf(LM_ERR_INVALID, "messages[%zu].content: expected a string or text parts",
                           i);
        msgs[i].content = texts[i].p;
        msgs[i].reasoning_content = json_string_value(json_object_get(m, "reasoning_content"));
    }
    struct lm_buf text = {0};
    if (!st) {
        struct lm_chat_opts o = {.add_generation_prompt = true, .enable_thinking = enable_thinking};
        st = p->family->render_chat(msgs, n, &o, &text);
    }
    if (!st) st = lm_tokenizer_encode(p->tok, text.p ? text.p : "", text.len, 0, ids);
    lm_buf_free(&text);
    for (size_t i = 0; i < n; i++)
        lm_buf_free(&texts[i]);
    free(texts);
    free(msgs);
    return st;
}

long lm_bench_prompt_count(const struct lm_bench_prompt *p, const char *text, size_t len) {
    struct lm_ids ids = {0};
    lm_tokenizer_encode(p->tok, text, len, LM_ENCODE_SPECIAL_AS_TEXT, &ids);
    long n = (long)ids.n;
    lm_ids_free(&ids);
    return n;
}
