/* cmd_template.c: `lumen template` (a JSON array of messages on stdin -> the rendered prompt).
 *
 * The family comes from the model folder's config.json model_type (or a GGUF file's
 * general.architecture; family registry), and the conversation is rendered by that family's chat
 * template, written in C, as run and serve render it. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/file.h"
#include "base/json.h"
#include "commands.h"
#include "family/bundle.h"
#include "family/chat.h"
#include "family/family.h"
#include "format/gguf.h"
#include "format/hf_config.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: lumen template --model DIR|FILE.gguf [--tokenizer DIR] [--no-generation-prompt]\n"
            "                      [--enable-thinking=true|false]\n\n"
            "Reads a conversation from stdin, a JSON array of messages\n"
            "  [{\"role\": \"system\"|\"developer\"|\"user\"|\"assistant\", \"content\": \"...\",\n"
            "    \"reasoning_content\": \"...\"}, ...]\n"
            "where content is a string or a list of {\"type\": \"text\", \"text\": \"...\"} parts\n"
            "(concatenated, as lumen serve does), and prints the prompt the model's chat template\n"
            "renders, exactly, with no newline added. The template is the model family's (from\n"
            "config.json's model_type), byte-exact with transformers' apply_chat_template, and the\n"
            "one run and serve use. Tool messages and tool_calls are rejected.\n\n"
            "  --model PATH              model directory (its config.json names the family) or GGUF\n"
            "                            file (its general.architecture names it)\n"
            "  --tokenizer DIR           accepted for symmetry with the other commands; the template\n"
            "                            needs no tokenizer file (the directory must exist)\n"
            "  --no-generation-prompt    do not append the assistant header (add_generation_prompt\n"
            "                            = false; default true)\n"
            "  --enable-thinking=BOOL    true or false; false appends an empty <think></think>\n"
            "                            block after the generation prompt (default: not given,\n"
            "                            the template's default, which thinks)\n"
            "  -h, --help                show this help\n");
}

int lm_cmd_parse_bool(const char *s) {
    if (!strcmp(s, "true") || !strcmp(s, "1")) return 1;
    if (!strcmp(s, "false") || !strcmp(s, "0")) return 0;
    return -1;
}

/* The chat template of the family that the model names: config.json's model_type in a folder,
 * general.architecture in a GGUF file (as lm_model_open reads them). */
static lm_status find_family(const char *model, const struct lm_family **out) {
    struct lm_hf_config cfg = {0};
    const bool gguf = lm_gguf_is_gguf(model);
    lm_status st;
    if (gguf) {
        struct lm_gguf g;
        if (!(st = lm_gguf_open(&g, model))) {
            st = lm_bundle_gguf_config(&g, &cfg);
            lm_gguf_close(&g);
        }
    } else {
        st = lm_hf_config_load(&cfg, model, "config.json");
    }
    if (st) {
        lm_hf_config_free(&cfg);
        return st;
    }
    const char *where = gguf ? "" : "/config.json";
    const char *key = gguf ? "general.architecture" : "model_type";
    json_t *mt = lm_hf_config_get(&cfg, "model_type");
    if (!json_is_string(mt)) {
        st = lm_errorf(LM_ERR_MISSING, "%s%s: %s is missing or not a string", model, where, key);
    } else if (!(*out = lm_family_find(json_string_value(mt)))) {
        struct lm_buf list = {0};
        lm_family_list(&list);
        st = lm_errorf(LM_ERR_UNSUPPORTED, "%s%s: %s '%s' is not supported (supported: %s)", model,
                       where, key, json_string_value(mt), list.p ? list.p : "");
        lm_buf_free(&list);
    }
    lm_hf_config_free(&cfg);
    return st;
}

/* Converts messages[i].content (a string, a list of text parts, or null/absent = "") into a
 * string owned by the message object. */
static lm_status take_content(json_t *msg, size_t i, const char **out) {
    json_t *c = json_object_get(msg, "content");
    if (!c || json_is_null(c)) {
        *out = "";
        return LM_OK;
    }
    if (json_is_string(c)) {
        *out = json_string_value(c);
        return LM_OK;
    }
    if (!json_is_array(c))
        return lm_errorf(LM_ERR_INVALID, "messages[%zu].content: expected a string or a list of "
                         "text parts", i);
    struct lm_buf text = {0};
    size_t j;
    json_t *part;
    json_array_foreach(c, j, part) {
        json_t *type = json_object_get(part, "type"), *t = json_object_get(part, "text");
        if (!json_is_string(type) || strcmp(json_string_value(type), "text") || !json_is_string(t)) {
            lm_buf_free(&text);
            return lm_errorf(json_is_string(type) && strcmp(json_string_value(type), "text")
                                 ? LM_ERR_UNSUPPORTED : LM_ERR_INVALID,
                             "messages[%zu].content[%zu]: only {\"type\": \"text\", \"text\": "
                             "\"...\"} parts are supported", i, j);
        }
        lm_buf_append(&text, json_string_value(t), json_string_length(t));
    }
    json_t *joined = json_stringn(text.p ? text.p : "", text.len);
    lm_buf_free(&text);
    if (!joined) return lm_errorf(LM_ERR_INVALID, "messages[%zu].content: not valid UTF-8", i);
    json_object_set_new(msg, "content", joined);
    *out = json_string_value(joined);
    return LM_OK;
}

/* Fills msgs[0..n) from the JSON array; strings stay owned by `arr`. */
static lm_status parse_messages(json_t *arr, struct lm_chat_msg *msgs) {
    size_t i;
    json_t *m;
    json_array_foreach(arr, i, m) {
        if (!json_is_object(m)) return lm_errorf(LM_ERR_INVALID, "messages[%zu]: expected an object", i);
        json_t *role = json_object_get(m, "role");
        if (!json_is_string(role) || !lm_chat_role_parse(json_string_value(role), &msgs[i].role))
            return lm_errorf(LM_ERR_INVALID, "messages[%zu]: role must be one of system, developer, "
                             "user, assistant", i);
        lm_status st = take_content(m, i, &msgs[i].content);
        if (st) return st;
        json_t *rc = json_object_get(m, "reasoning_content");
        if (rc && !json_is_null(rc) && !json_is_string(rc))
            return lm_errorf(LM_ERR_INVALID, "messages[%zu].reasoning_content: expected a string", i);
        msgs[i].reasoning_content = json_string_value(rc);
        json_t *tc = json_object_get(m, "tool_calls");
        msgs[i].has_tool_calls = tc && !json_is_null(tc) && !(json_is_array(tc) && !json_array_size(tc));
    }
    return LM_OK;
}

int lm_cmd_template(int argc, char **argv) {
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"tokenizer", required_argument, 0, 't'},
                                         {"no-generation-prompt", no_argument, 0, 'g'},
                                         {"enable-thinking", required_argument, 0, 'e'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *model = NULL, *tokdir = NULL;
    struct lm_chat_opts copts = {.add_generation_prompt = true, .enable_thinking = -1};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 't': tokdir = optarg; break;
        case 'g': copts.add_generation_prompt = false; break;
        case 'e':
            if ((copts.enable_thinking = lm_cmd_parse_bool(optarg)) < 0) {
                fprintf(stderr, "lumen template: --enable-thinking takes true or false, not '%s'\n", optarg);
                return 2;
            }
            break;
        case 'h': usage(stdout); return 0;
        default: return lm_cmd_usage_error("template");
        }
    }
    if (optind < argc || !model) {
        fprintf(stderr, "lumen template: %s\n",
                optind < argc ? lm_cmd_unexpected(argv[optind]) : "--model DIR is required");
        return lm_cmd_usage_error("template");
    }
    if (!lm_dir_exists(model) && !lm_gguf_is_gguf(model)) {
        fprintf(stderr, "lumen template: --model %s: %s\n", model,
                lm_file_exists(model)
                    ? "a file that is not GGUF (expected a model folder or a .gguf file)"
                    : "no such folder or file");
        return 1;
    }
    if (tokdir && !lm_dir_exists(tokdir)) {
        fprintf(stderr, "lumen template: --tokenizer %s: no such directory\n", tokdir);
        return 1;
    }
    const struct lm_family *fam = NULL;
    if (find_family(model, &fam)) return lm_cmd_fail("template", NULL);

    json_t *arr = NULL;
    lm_cmd_stdin_hint("template", "a JSON array of messages");
    if (lm_json_load_file("-", &arr)) return lm_cmd_fail("template", "cannot read the messages");
    int rc = 0;
    struct lm_buf out = {0};
    struct lm_chat_msg *msgs = NULL;
    if (!json_is_array(arr)) {
        fprintf(stderr, "lumen template: stdin: expected a JSON array of messages\n");
        rc = 1;
    } else {
        size_t n = json_array_size(arr);
        msgs = calloc(n ? n : 1, sizeof *msgs);
        if (parse_messages(arr, msgs) || fam->render_chat(msgs, n, &copts, &out)) {
            rc = lm_cmd_fail("template", NULL);
        } else if (fwrite(out.p ? out.p : "", 1, out.len, stdout) != out.len || fflush(stdout)) {
            fprintf(stderr, "lumen template: cannot write stdout\n");
            rc = 1;
        }
    }
    free(msgs);
    lm_buf_free(&out);
    json_decref(arr);
    return rc;
}
