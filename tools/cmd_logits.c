/* cmd_logits.c: `lumen logits`: the top-k next-token logits at every position of a prompt given
 * as token ids, for comparing against a reference implementation. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/json.h"
#include "commands.h"
#include "family/model.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: lumen logits --model DIR|FILE.gguf [--tokenizer DIR] --top-k K [--threads N] [--scalar]\n\n"
            "Reads a JSON array of prompt token ids on stdin, runs the model over them once, and\n"
            "prints one JSON line per position: {\"ids\":[...],\"logits\":[...]}, the K highest\n"
            "next-token logits at that position sorted highest first (ties: lower id first),\n"
            "floats with 9 significant digits.\n\n"
            "  --model PATH     Hugging Face model folder (config.json, model.safetensors, ...) or a\n"
            "                   GGUF file\n"
            "  --tokenizer DIR  folder with tokenizer.json when the model folder has none (optional:\n"
            "                   logits reads and writes token ids only)\n"
            "  --top-k K        logits per position (1 .. vocab_size)\n"
            "  --threads N      CPU threads (default 0: all online cores)\n"
            "  --scalar         use the plain scalar reference kernels\n"
            "  -h, --help       show this help\n");
}

struct entry {
    float v;
    int32_t id;
};

static int cmp_entry(const void *a, const void *b) {
    const struct entry *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* The k largest of row[0..n) into top[0..k), sorted; `all` is scratch of n entries. */
static void top_k(const float *row, int n, int k, struct entry *top, struct entry *all) {
    if (k > 64) {
        for (int i = 0; i < n; i++) all[i] = (struct entry){row[i], i};
        qsort(all, (size_t)n, sizeof *all, cmp_entry);
        memcpy(top, all, sizeof *top * (size_t)k);
        return;
    }
    int have = 0;
    for (int i = 0; i < n; i++) {
        if (have == k && !(row[i] > top[k - 1].v)) continue;
        int r = have < k ? have++ : k - 1;
        while (r > 0 && row[i] > top[r - 1].v) {
            top[r] = top[r - 1];
            r--;
        }
        top[r] = (struct entry){row[i], i};
    }
}

int lm_cmd_logits(int argc, char **argv) {
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"tokenizer", required_argument, 0, 't'},
                                         {"top-k", required_argument, 0, 'k'},
                                         {"threads", required_argument, 0, 'j'},
                                         {"scalar", no_argument, 0, 's'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    struct lm_model_open_params params = lm_model_default_open_params();
    params.tokenizer_optional = true; /* ids in, ids and logits out */
    const char *model_dir = NULL;
    long k = 0;
    int c;
    char *end;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model_dir = optarg; break;
        case 't': params.tokenizer_dir = optarg; break;
        case 'k':
            k = strtol(optarg, &end, 10);
            if (*end || k < 1) {
                fprintf(stderr, "lumen logits: --top-k must be a positive integer, not '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case 'j':
            params.n_threads = (int)strtol(optarg, &end, 10);
            if (*end || params.n_threads < 0) {
                fprintf(stderr,
                        "lumen logits: --threads must be a non-negative integer, not '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case 's': params.scalar_kernels = true; break;
        case 'h': usage(stdout); return 0;
        default: return lm_cmd_usage_error("logits");
        }
    }
    if (optind < argc || !model_dir || !k) {
        fprintf(stderr, "lumen logits: %s\n",
                optind < argc ? lm_cmd_unexpected(argv[optind])
                : !model_dir  ? "--model DIR is required"
                              : "--top-k K is required");
        return lm_cmd_usage_error("logits");
    }

    json_t *arr = NULL;
    struct lm_ids ids = {0};
    lm_cmd_stdin_hint("logits", "the prompt, a JSON array of token ids,");
    if (lm_json_load_file("-", &arr)) return lm_cmd_fail("logits", "cannot read the prompt");
    lm_status st = lm_json_to_ids(arr, "stdin", &ids);
    json_decref(arr);
    if (st) return lm_cmd_fail("logits", NULL);
    if (ids.n == 0) {
        fprintf(stderr, "lumen logits: the prompt is empty\n");
        return 2;
    }

    struct lm_model *m;
    if (lm_model_open(model_dir, &params, &m)) {
        lm_ids_free(&ids);
        return lm_cmd_fail("logits", NULL);
    }
    const int vocab = lm_model_config(m)->vocab_size;
    if (k > vocab) {
        fprintf(stderr, "lumen logits: --top-k %ld exceeds the model's vocab_size %d\n", (long)k, vocab);
        lm_ids_free(&ids);
        lm_model_close(m);
        return 2;
    }
    struct lm_seq *seq = NULL;
    int rc = 0;
    if (lm_seq_create(m, (int)ids.n, &seq)) {
        rc = lm_cmd_fail("logits", NULL);
        goto done;
    }
    /* Positions in pieces of 64, so the logits buffer stays bounded. */
    enum { PIECE = 64 };
    float *logits = malloc(sizeof(float) * (size_t)PIECE * vocab);
    struct entry *top = malloc(sizeof *top * (size_t)k);
    struct entry *all = k > 64 ? malloc(sizeof *all * (size_t)vocab) : NULL;
    struct lm_buf line = {0};
    for (size_t done = 0; done < ids.n && !rc; done += PIECE) {
        int n = ids.n - done < PIECE ? (int)(ids.n - done) : PIECE;
        if (lm_seq_forward(seq, ids.v + done, n, logits, true)) {
            rc = lm_cmd_fail("logits", NULL);
            break;
        }
        for (int i = 0; i < n; i++) {
            top_k(logits + (size_t)i * vocab, vocab, (int)k, top, all);
            lm_buf_reset(&line);
            lm_buf_puts(&line, "{\"ids\":[");
            for (long r = 0; r < k; r++) lm_buf_printf(&line, r ? ",%d" : "%d", top[r].id);
            lm_buf_puts(&line, "],\"logits\":[");
            for (long r = 0; r < k; r++) lm_buf_printf(&line, r ? ",%.9g" : "%.9g", (double)top[r].v);
            lm_buf_puts(&line, "]}\n");
            if (fwrite(line.p, 1, line.len, stdout) != line.len) {
                fprintf(stderr, "lumen logits: cannot write stdout\n");
                rc = 1;
                break;
            }
        }
    }
    if (!rc && fflush(stdout)) {
        fprintf(stderr, "lumen logits: cannot write stdout\n");
        rc = 1;
    }
    lm_buf_free(&line);
    free(logits);
    free(top);
    free(all);
done:
    lm_seq_destroy(seq);
    lm_model_close(m);
    lm_ids_free(&ids);
    return rc;
}
