/* cmd_perf.c: `lumen perf`: prefill and decode throughput of the forward pass, printed as a table
 * like llama-bench's (pp<P>: a P-token prompt in one forward call; tg<N>: N decode steps of one
 * token each, after an untimed prefill of --depth tokens). Each test runs once untimed (warm-up)
 * and then --reps times; the table gives the median and the min-max tokens per second. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "commands.h"
#include "family/model.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: lumen perf --model DIR [--tokenizer DIR] [--threads N] [-p 512] [-n 128]\n"
            "                  [--reps 3] [--depth 0] [--mmap] [--scalar]\n\n"
            "Measures the CPU forward pass like llama-bench and prints a table of tokens per\n"
            "second (median over the repetitions, and the min - max).\n\n"
            "  --model DIR      Hugging Face model folder\n"
            "  --tokenizer DIR  folder with tokenizer.json when the model folder has none\n"
            "  --threads N      CPU threads (default 0: all online cores)\n"
            "  -p, --prompt P   prefill test: one forward call over P tokens (0 skips; default 512)\n"
            "  -n, --gen N      decode test: N forward calls of one token (0 skips; default 128)\n"
            "  -r, --reps R     timed repetitions of each test (default 3)\n"
            "  -d, --depth D    tokens already in the KV cache before each test (default 0); their\n"
            "                   prefill is not timed\n"
            "  --mmap           use weight matrices in place from the file map instead of reading\n"
            "                   them into memory\n"
            "  --scalar         use the plain scalar reference kernels\n"
            "  -h, --help       show this help\n");
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static bool parse_int(const char *s, const char *flag, int lo, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < lo || v > 1 << 24) {
        fprintf(stderr, "lumen perf: %s must be an integer >= %d\n", flag, lo);
        return false;
    }
    *out = (int)v;
    return true;
}

/* Deterministic ids in [1, vocab): xorshift. */
static void fill_ids(int32_t *ids, int n, int vocab, uint64_t seed) {
    for (int i = 0; i < n; i++) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        ids[i] = 1 + (int32_t)(seed % (uint64_t)(vocab - 1));
    }
}

struct result {
    double median, lo, hi;
};

/* Times `reps` runs of the test (plus one warm-up); tokens per second. */
static lm_status run_test(struct lm_seq *s, const int32_t *ids, int depth, int p, int n, int reps,
                          float *logits, struct result *r) {
    double *tps = calloc((size_t)reps, sizeof *tps);
    lm_status st = LM_OK;
    for (int rep = -1; rep < reps && !st; rep++) {
        lm_seq_truncate(s, depth);
        double t0 = now_s();
        if (p) {
            st = lm_seq_forward(s, ids + depth, p, logits, false);
        } else {
            for (int i = 0; i < n && !st; i++) st = lm_seq_forward(s, ids + depth + i, 1, logits, false);
        }
        double dt = now_s() - t0;
        if (rep >= 0) tps[rep] = (p ? p : n) / dt;
    }
    if (!st) {
        qsort(tps, (size_t)reps, sizeof *tps, cmp_double);
        r->lo = tps[0];
        r->hi = tps[reps - 1];
        r->median = reps % 2 ? tps[reps / 2] : 0.5 * (tps[reps / 2 - 1] + tps[reps / 2]);
    }
    free(tps);
    return st;
}

int lm_cmd_perf(int argc, char **argv) {
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"tokenizer", required_argument, 0, 't'},
                                         {"threads", required_argument, 0, 'j'},
                                         {"prompt", required_argument, 0, 'p'},
                                         {"gen", required_argument, 0, 'n'},
                                         {"reps", required_argument, 0, 'r'},
                                         {"depth", required_argument, 0, 'd'},
                                         {"mmap", no_argument, 0, 'M'},
                                         {"scalar", no_argument, 0, 'S'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    struct lm_model_open_params params = lm_model_default_open_params();
    const char *model_dir = NULL;
    int p = 512, n = 128, reps = 3, depth = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "hp:n:r:d:", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model_dir = optarg; break;
        case 't': params.tokenizer_dir = optarg; break;
        case 'j':
            if (!parse_int(optarg, "--threads", 0, &params.n_threads)) return 2;
            break;
        case 'p':
            if (!parse_int(optarg, "-p", 0, &p)) return 2;
            break;
        case 'n':
            if (!parse_int(optarg, "-n", 0, &n)) return 2;
            break;
        case 'r':
            if (!parse_int(optarg, "--reps", 1, &reps)) return 2;
            break;
        case 'd':
            if (!parse_int(optarg, "--depth", 0, &depth)) return 2;
            break;
        case 'M': params.map_weights = true; break;
        case 'S': params.scalar_kernels = true; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc || !model_dir) {
        fprintf(stderr, "lumen perf: %s\n", optind < argc ? "unexpected argument" : "--model DIR is required");
        usage(stderr);
        return 2;
    }
    if (!p && !n) {
        fprintf(stderr, "lumen perf: nothing to measure (-p 0 and -n 0)\n");
        return 2;
    }
    struct lm_model *m;
    double t0 = now_s();
    if (lm_model_open(model_dir, &params, &m)) return lm_cmd_fail("perf", NULL);
    double load_s = now_s() - t0;
    const struct lm_model_config *cfg = lm_model_config(m);
    struct lm_model_info info;
    lm_model_info(m, &info);
    int cap = depth + (p > n ? p : n);
    struct lm_seq *s;
    if (lm_seq_create(m, cap, &s)) {
        int rc = lm_cmd_fail("perf", NULL);
        lm_model_close(m);
        return rc;
    }
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)cap);
    size_t tv = lm_tokenizer_vocab_size(lm_model_tokenizer(m));
    fill_ids(ids, cap, tv && tv < (size_t)cfg->vocab_size ? (int)tv : cfg->vocab_size, 42);
    float *logits = malloc(sizeof(float) * (size_t)cfg->vocab_size);

    printf("model: %s (%s, %d layers, hidden %d, %d/%d heads, head_dim %d, vocab %d, %.1fM params)\n",
           lm_model_name(m), cfg->model_type, cfg->num_hidden_layers, cfg->hidden_size,
           cfg->num_attention_heads, cfg->num_key_value_heads, cfg->head_dim, cfg->vocab_size,
           info.n_params / 1e6);
    printf("weights: %s, %.1f MiB, %s (loaded in %.2f s); kernels: %s\n", info.weight_dtype,
           info.weight_bytes / (1024.0 * 1024.0),
           info.weights_mapped ? "mmap'd in place from the file" : "read into memory", load_s,
           info.kernels);
    lm_status st = LM_OK;
    if (depth) {
        lm_seq_truncate(s, 0);
        st = lm_seq_forward(s, ids, depth, logits, false);
    }
    printf("\n| %-16s | %-5s | %7s | %-14s | %12s | %21s |\n", "model", "dtype", "threads", "test",
           "t/s (median)", "t/s (min - max)");
    printf("| %.16s | ----- | ------: | -------------- | -----------: | --------------------: |\n",
           "----------------");
    const char *name = lm_model_name(m);
    for (int test = 0; test < 2 && !st; test++) {
        int tp = test == 0 ? p : 0, tn = test == 1 ? n : 0;
        if (!tp && !tn) continue;
        struct result r;
        st = run_test(s, ids, depth, tp, tn, reps, logits, &r);
        if (st) break;
        char label[32], range[48];
        if (depth)
            snprintf(label, sizeof label, "%s%d @ d%d", tp ? "pp" : "tg", tp ? tp : tn, depth);
        else
            snprintf(label, sizeof label, "%s%d", tp ? "pp" : "tg", tp ? tp : tn);
        snprintf(range, sizeof range, "%.2f - %.2f", r.lo, r.hi);
        printf("| %-16.16s | %-5s | %7d | %-14s | %12.2f | %21s |\n", name, info.weight_dtype,
               info.n_threads, label, r.median, range);
        fflush(stdout);
    }
    int rc = st ? lm_cmd_fail("perf", NULL) : 0;
    if (!rc) printf("\n%d repetitions after one warm-up; decode timing excludes any prefill\n", reps);
    free(ids);
    free(logits);
    lm_seq_destroy(s);
    lm_model_close(m);
    return rc;
}
