/* cmd_detokenize.c: `lumen detokenize` (JSON array of ids on stdin -> text). */
#include <getopt.h>
#include <stdio.h>

#include "base/buf.h"
#include "base/json.h"
#include "commands.h"
#include "text/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: lumen detokenize --model DIR|FILE.gguf [--tokenizer DIR] [--skip-special]\n\n"
            "Reads a JSON array of token ids from stdin and prints the decoded text exactly, with\n"
            "no newline added. Incomplete or invalid UTF-8 becomes U+FFFD, as in Hugging Face\n"
            "tokenizers' decode.\n\n"
            "  --model PATH     model directory (its tokenizer.json is used) or GGUF file (the\n"
            "                   tokenizer in its metadata)\n"
            "  --tokenizer DIR  take tokenizer.json from DIR instead of the model directory\n"
            "                   (then --model may be left out)\n"
            "  --skip-special   drop special tokens (<|im_end|>) from the output\n"
            "  -h, --help       show this help\n");
}

int lm_cmd_detokenize(int argc, char **argv) {
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"tokenizer", required_argument, 0, 't'},
                                         {"skip-special", no_argument, 0, 's'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *model = NULL, *tokdir = NULL;
    bool skip = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 't': tokdir = optarg; break;
        case 's': skip = true; break;
        case 'h': usage(stdout); return 0;
        default: return lm_cmd_usage_error("detokenize");
        }
    }
    if (optind < argc || (!model && !tokdir)) {
        fprintf(stderr, "lumen detokenize: %s\n",
                optind < argc ? lm_cmd_unexpected(argv[optind])
                              : "--model DIR (or --tokenizer DIR) is required");
        return lm_cmd_usage_error("detokenize");
    }
    json_t *arr = NULL;
    lm_cmd_stdin_hint("detokenize", "a JSON array of token ids");
    if (lm_json_load_file("-", &arr))
        return lm_cmd_fail("detokenize", "cannot read the ids on stdin");
    struct lm_ids ids = {0};
    if (lm_json_to_ids(arr, "stdin", &ids)) {
        json_decref(arr);
        return lm_cmd_fail("detokenize", NULL);
    }
    json_decref(arr);
    struct lm_tokenizer *tok;
    if (lm_cmd_load_tokenizer("detokenize", model, tokdir, &tok)) {
        lm_ids_free(&ids);
        return 1;
    }
    struct lm_buf out = {0};
    int rc = 0;
    if (lm_tokenizer_decode(tok, ids.v, ids.n, skip, &out)) {
        rc = lm_cmd_fail("detokenize", NULL);
    } else if (fwrite(out.p ? out.p : "", 1, out.len, stdout) != out.len || fflush(stdout)) {
        fprintf(stderr, "lumen detokenize: cannot write stdout\n");
        rc = 1;
    }
    lm_ids_free(&ids);
    lm_buf_free(&out);
    lm_tokenizer_destroy(tok);
    return rc;
}
