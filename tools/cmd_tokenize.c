/* cmd_tokenize.c: `lumen tokenize` (text on stdin -> JSON array of ids) and the tokenizer path
 * helper shared with cmd_detokenize.c. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/buf.h"
#include "base/file.h"
#include "base/json.h"
#include "commands.h"
#include "family/bundle.h"
#include "format/gguf.h"
#include "text/tokenizer.h"

int lm_cmd_load_tokenizer(const char *cmd, const char *model_dir, const char *tok_dir,
                          struct lm_tokenizer **out) {
    if (!tok_dir && lm_gguf_is_gguf(model_dir)) {
        struct lm_gguf g;
        lm_status st = lm_gguf_open(&g, model_dir);
        if (!st) st = lm_bundle_gguf_tokenizer(&g, out);
        lm_gguf_close(&g);
        if (st) return lm_cmd_fail(cmd, "cannot load the tokenizer from the GGUF file");
        return 0;
    }
    char *path = lm_path_join(tok_dir ? tok_dir : model_dir, "tokenizer.json");
    lm_status st;
    if (!tok_dir && !lm_dir_exists(model_dir))
        st = lm_errorf(LM_ERR_MISSING, "%s: not a model folder or a GGUF file", model_dir);
    else if (lm_cmd_lacks_tokenizer(model_dir, tok_dir))
        st = LM_ERR_MISSING;
    else
        st = lm_tokenizer_load(path, out);
    free(path);
    if (st) return lm_cmd_fail(cmd, "cannot load the tokenizer");
    return 0;
}

static void usage(FILE *f) {
    fprintf(
        f, "usage: lumen tokenize --model DIR|FILE.gguf [--tokenizer DIR] [--special-as-text]\n\n"
           "Reads text from stdin (all bytes, nothing trimmed) and prints its token ids as a JSON\n"
           "array followed by a newline, as Hugging Face tokenizers' encode does.\n\n"
           "  --model PATH       model directory (its tokenizer.json is used) or GGUF file (the\n"
           "                     tokenizer in its metadata)\n"
           "  --tokenizer DIR    take tokenizer.json from DIR instead of the model directory\n"
           "                     (then --model may be left out)\n"
           "  --special-as-text  encode special-token strings (<|im_start|>) in the text as plain\n"
           "                     text instead of as their special ids\n"
           "  -h, --help         show this help\n");
}

int lm_cmd_tokenize(int argc, char **argv) {
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"tokenizer", required_argument, 0, 't'},
                                         {"special-as-text", no_argument, 0, 's'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *model = NULL, *tokdir = NULL;
    unsigned flags = 0;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 't': tokdir = optarg; break;
        case 's': flags |= LM_ENCODE_SPECIAL_AS_TEXT; break;
        case 'h': usage(stdout); return 0;
        default: return lm_cmd_usage_error("tokenize");
        }
    }
    if (optind < argc || (!model && !tokdir)) {
        fprintf(stderr, "lumen tokenize: %s\n",
                optind < argc ? lm_cmd_unexpected(argv[optind])
                              : "--model DIR (or --tokenizer DIR) is required");
        return lm_cmd_usage_error("tokenize");
    }
    struct lm_tokenizer *tok;
    if (lm_cmd_load_tokenizer("tokenize", model, tokdir, &tok)) return 1;
    struct lm_buf text = {0}, out = {0};
    struct lm_ids ids = {0};
    int rc = 0;
    lm_cmd_stdin_hint("tokenize", "the text");
    if (lm_file_read("-", &text)) {
        rc = lm_cmd_fail("tokenize", "cannot read stdin");
    } else if (lm_tokenizer_encode(tok, text.p, text.len, flags, &ids)) {
        rc = lm_cmd_fail("tokenize", NULL);
    } else {
        lm_ids_to_json(ids.v, ids.n, &out);
        lm_buf_putc(&out, '\n');
        if (fwrite(out.p, 1, out.len, stdout) != out.len || fflush(stdout)) {
            fprintf(stderr, "lumen tokenize: cannot write stdout\n");
            rc = 1;
        }
    }
    lm_ids_free(&ids);
    lm_buf_free(&text);
    lm_buf_free(&out);
    lm_tokenizer_destroy(tok);
    return rc;
}
