/* cmd_perf.c: `lumen perf`: prefill and decode throughput of the CPU forward pass, printed like
 * llama-bench (pp<P>: a P-token prompt; tg<N>: N decode steps of one token after an untimed
 * prefill of --depth tokens; tg<N> x B: N steps of B sequences decoded together in one batched
 * forward per step). Each test runs once untimed (warm-up) and then --reps times; the table gives
 * the mean ± standard deviation, the median and the min - max tokens per second. Beside each
 * decode figure it prints the weight bandwidth achieved (the bytes of weights one step reads,
 * times steps per second) and that as a share of a read bandwidth measured in the same run: the
 * same number of threads summing a 512 MiB array (huge pages), each thread as 4 streams, sampled
 * just before each decode repetition. When the weights are smaller than the CPU's last-level
 * cache they stay in cache between steps, and a footnote says why that share can exceed 100%.
 * It feeds token ids only, so a model folder without tokenizer.json is measured with ids drawn
 * below config.json's vocab_size. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/cpu/ops.h"
#include "base/threadpool.h"
#include "bench/stats.h"
#include "commands.h"
#include "family/family.h"
#include "family/model.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: lumen perf --model DIR|FILE.gguf [--tokenizer DIR] [-t N] [-p 512] [-n 128]\n"
            "                  [-r 3] [-d 0] [--batch 1] [-o md|json] [--mmap] [--no-bw] [--scalar]\n"
            "                  [--device cpu|cuda|cuda:N] [--no-async-scheduling]\n\n"
            "Measures the CPU forward pass (or a CUDA GPU's, --device) like llama-bench and\n"
            "prints a table of tokens per second (mean ± std over the repetitions, the median\n"
            "and the min - max), the weight bandwidth each decode test achieves, and a read\n"
            "bandwidth measured in the same run (\"%% of read\": above 100%% when the weights fit\n"
            "in the CPU's last-level cache; a footnote then says so).\n\n"
            "  --model PATH      Hugging Face model folder or GGUF file\n"
            "  --tokenizer DIR   folder with tokenizer.json (optional: without one, prompt ids\n"
            "                    are drawn below config.json's vocab_size)\n"
            "  -t, --threads N   CPU threads (default 0: all online cores)\n"
            "  -p, --prompt P    prefill test: one forward over P tokens (0 skips; default 512)\n"
            "  -n, --gen N       decode test: N forward steps of one token (0 skips; default 128)\n"
            "  -r, --reps R      timed repetitions of each test (default 3)\n"
            "  -d, --depth D     tokens already in the KV cache before each test (default 0);\n"
            "                    their prefill is not timed\n"
            "  -b, --batch LIST  batched decode: for each B in the comma-separated list, N steps\n"
            "                    of B sequences at once (one weight read per step); 1 is the plain\n"
            "                    decode test (default: 1)\n"
            "  -o, --output F    md (default: a markdown table) or json\n"
            "  --mmap            use weight matrices in place from the file map (prefaulted and\n"
            "                    locked with mlock where allowed) instead of reading them into\n"
            "                    anonymous memory\n"
            "  --no-bw           skip the read-bandwidth measurement (a GPU run always skips it:\n"
            "                    it reads host memory)\n"
            "  --scalar          use the plain scalar reference kernels\n"
            "                    (the fast CPU kernels are the best vector target of this CPU,\n"
            "                    chosen at run time: avx512bf16, avx512vnni, avx512, avx2,\n"
            "                    generic or neon;\n"
            "                    the table's header names it; LM_CPU_KERNELS=avx2 in the\n"
            "                    environment asks for another; for q8_0 weights the header also\n"
            "                    names the matmul path: int8 (the default: activations quantized\n"
            "                    to Q8_0 blocks, int8 dot products, as llama.cpp) or dequant\n"
            "                    (weights widened to float32, float activations: LM_CPU_Q8_ACT=0\n"
            "                    in the environment; it takes 0/1, off/on, false/true, no/yes);\n"
            "                    for bf16 weights it names the activations' type: f32 (the\n"
            "                    default) or bf16 (LM_CPU_BF16_ACT=1: rounded to bf16 and\n"
            "                    multiplied in pairs, as AVX512-BF16's vdpbf16ps does))\n"
            "  --device D        run on cpu (default), cuda or cuda:N (a GPU: weights and KV cache\n"
            "                    in bf16; pp copies the logits row back to the host as lm_seq does;\n"
            "                    decode (tg, any B) has the GPU choose greedy ids, as lumen serve\n"
            "                    does, so only ids come back; each step's tokens are the ids the\n"
            "                    step before chose, as in generation)\n"
            "  --no-async-scheduling  on a GPU, wait for each decode step's ids before starting\n"
            "                    the next (by default step N + 1 is queued first, its tokens taken\n"
            "                    from step N's on the device, as lumen serve's scheduler runs a\n"
            "                    steady decode: the GPU then does not wait for the host between\n"
            "                    steps; the same flag turns it off in lumen serve)\n"
            "  -h, --help        show this help\n");
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static bool parse_int(const char *s, const char *flag, int lo, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || end == s || v < lo || v > 1 << 24) {
        fprintf(stderr, "lumen perf: %s must be an integer from %d to %d, not '%s'\n", flag, lo, 1 << 24, s);
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

struct stats {
    double mean, std, median, lo, hi;
    double *samples;
    int n;
};

/* The samples' mean, sample standard deviation (n - 1, as llama-bench), median, min and max; the
 * median as the profiler computes its p50 (bench/stats.h: the mean of the two middle samples of an
 * even count). x keeps the order the samples were taken in. */
static void summarize(double *x, int n, struct stats *s) {
    struct lm_bench_stats b;
    lm_bench_stats_compute(x, (size_t)n, &b);
    s->samples = x;
    s->n = n;
    s->mean = b.mean, s->median = b.p50, s->lo = b.min, s->hi = b.max;
    s->std = n > 1 ? b.std * sqrt((double)n / (n - 1)) : 0; /* b.std is the population's */
}

/* ---- read bandwidth ---- */

typedef float v8f __attribute__((vector_size(32)));

struct bw_args {
    const float *p;
    size_t n; /* floats, a multiple of 32 */
    float sums[256];
};

/* Each thread sums its share as 4 streams in lockstep (as a decode step streams 4 groups of
 * weight rows): one sequential stream per core leaves memory bandwidth unused. */
static void bw_task(void *ctx, int ith, int nth) {
    struct bw_args *a = ctx;
    long b, e;
    lm_pool_split((long)(a->n / 32), ith, nth, 4, &b, &e);
    const long part = (e - b) / 4 * 32; /* floats per stream */
    const float *p0 = a->p + b * 32, *p1 = p0 + part, *p2 = p1 + part, *p3 = p2 + part;
    v8f s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, s4 = {0}, s5 = {0}, s6 = {0}, s7 = {0};
    for (long i = 0; i < part; i += 16) {
        s0 += *(const v8f *)(p0 + i);
        s1 += *(const v8f *)(p1 + i);
        s2 += *(const v8f *)(p2 + i);
        s3 += *(const v8f *)(p3 + i);
        s4 += *(const v8f *)(p0 + i + 8);
        s5 += *(const v8f *)(p1 + i + 8);
        s6 += *(const v8f *)(p2 + i + 8);
        s7 += *(const v8f *)(p3 + i + 8);
    }
    v8f s = s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7;
    float t = 0;
    for (int i = 0; i < 8; i++) t += s[i];
    a->sums[ith & 255] = t;
}

/* The read-bandwidth probe: `threads` threads summing a 512 MiB array (huge pages). */
struct bw_probe {
    float *p;
    size_t bytes;
    struct lm_pool *pool;
};

static bool bw_open(struct bw_probe *b, int threads) {
    b->bytes = (size_t)512 << 20;
    b->p = lm_huge_alloc(b->bytes);
    if (!b->p || lm_pool_create(threads, &b->pool)) {
        lm_huge_free(b->p, b->bytes);
        b->p = NULL;
        return false;
    }
    memset(b->p, 0, b->bytes); /* fault every page in */
    return true;
}

static void bw_close(struct bw_probe *b) {
    if (!b->p) return;
    lm_pool_destroy(b->pool);
    lm_huge_free(b->p, b->bytes);
    b->p = NULL;
}

/* One read of the whole array: GB/s (0 when the probe is off). The bytes counted are the ones
 * the threads read (each share rounded down to 4 streams of whole 128-byte steps). */
static double bw_sample(struct bw_probe *b) {
    if (!b->p) return 0;
    struct bw_args a = {b->p, b->bytes / sizeof(float), {0}};
    double t0 = now_s();
    lm_pool_run(b->pool, bw_task, &a);
    return (double)b->bytes / (now_s() - t0) / 1e9;
}

/* ---- tests ---- */

struct row {
    char test[48];
    int batch;       /* sequences decoded together (0: prefill) */
    struct stats tps;
    double gbps;     /* weight bytes read per second (decode) */
    double pct;      /* gbps over the paired read-bandwidth samples, % (mean of the ratios) */
};

/* Prefill (p > 0) or single-sequence decode (n > 0) through lm_seq. */
static lm_status run_seq(struct lm_seq *s, const int32_t *ids, int depth, int p, int n, int reps,
                         float *logits, double *tps, struct bw_probe *bw, double *bws) {
    lm_status st = LM_OK;
    for (int rep = -1; rep < reps && !st; rep++) {
        lm_seq_truncate(s, depth);
        if (n && rep >= 0) bws[rep] = bw_sample(bw); /* paired with this repetition */
        double t0 = now_s();
        if (p) {
            st = lm_seq_forward(s, ids + depth, p, logits, false);
        } else {
            for (int i = 0; i < n && !st; i++) st = lm_seq_forward(s, ids + depth + i, 1, logits, false);
        }
        double dt = now_s() - t0;
        if (rep >= 0) tps[rep] = (p ? p : n) / dt;
    }
    return st;
}

/* B sequences decoding together: n steps of one batched forward each, after an untimed prefill
 * of `depth` tokens per sequence. Tokens come from ids[0, n_ids): the caller passes depth + n, not
 * what -p needs, so that a decode test follows the same tokens whatever -p is (on a GPU the
 * greedy path from the first token sets how many rows the lm_head's screen sums exactly: tg128
 * ran 1.4% slower with -p 512 than with -p 0 before, perf-notes v35; the same since, v36). */
static lm_status run_batch(struct lm_model *m, int B, int depth, int n, int reps, const int32_t *ids,
                           int n_ids, bool queue, double *tps, struct bw_probe *bw, double *bws) {
    const struct lm_model_config *cfg = lm_model_config(m);
    const int ctx = depth + n, nbps = (ctx + LM_KV_BLOCK - 1) / LM_KV_BLOCK;
    const int chunk = depth > 64 ? 64 : B > depth ? B : depth > 0 ? depth : 1;
    struct lm_kv_cache *kv;
    lm_status st = lm_kv_cache_create(m, B * nbps, chunk > B ? chunk : B, ctx, &kv);
    if (st) return st;
    /* On a device that samples, greedy ids come back instead of logits (as lumen serve runs). */
    const bool dev = lm_model_samples_on_device(m);
    const size_t logits_bytes = dev ? 0 : sizeof(float) * (size_t)B * cfg->vocab_size;
    int32_t *blocks = malloc(sizeof *blocks * (size_t)B * nbps);
    struct lm_batch_seq *seqs = calloc((size_t)B, sizeof *seqs);
    float *logits = dev ? NULL : malloc(logits_bytes);
    struct lm_device_sampling *greedy = calloc((size_t)B, sizeof *greedy);
    int32_t *chosen = calloc((size_t)B, sizeof *chosen), *feed = calloc((size_t)B, sizeof *feed);
    for (int b = 0; b < B && feed; b++) feed[b] = b; /* sequence b's token: row b of the step before */
    queue = queue && dev && lm_model_can_queue(m);
    if (!blocks || !seqs || (!dev && !logits) || !greedy || !chosen || !feed)
        st = lm_errorf(LM_ERR_NOMEM, "--batch %d: out of memory for the step's buffers (%.1f GB of logits: %d "
                       "rows of vocab_size %d floats)", B, logits_bytes / 1e9, B, cfg->vocab_size);
    for (int i = 0; i < B * nbps && !st; i++) blocks[i] = i;
    for (int rep = -1; rep < reps && !st; rep++) {
        for (int b = 0; b < B && !st; b++)
            for (int done = 0; done < depth && !st; done += chunk) {
                int c = depth - done < chunk ? depth - done : chunk;
                struct lm_batch_seq one = {ids + (b * 7 + done) % (n_ids - c), c, done,
                                           blocks + b * nbps, LM_LOGITS_NONE};
                st = lm_model_forward(m, kv, &one, 1, NULL);
            }
        if (rep >= 0) bws[rep] = bw_sample(bw);
        double t0 = now_s();
        /* On a device, each step's tokens are the ids the step before chose (the first step's
         * come from the prompt ids), queued on the device (queue) or from the host. */
        for (int step = 0; step < n && !st; step++) {
            for (int b = 0; b < B; b++)
                seqs[b] = (struct lm_batch_seq){dev && step ? chosen + b : ids + (b * 131 + step) % n_ids, 1,
                                                depth + step, blocks + b * nbps, LM_LOGITS_LAST};
            if (queue) {
                st = lm_model_queue_sample(m, kv, seqs, B, greedy, step ? feed : NULL);
                if (st == LM_ERR_RANGE && step == 0) {
                    queue = false; /* more sequences than one device call takes: wait for each step */
                    st = LM_OK;
                } else if (!st && step) {
                    st = lm_model_collect(m, kv, chosen, NULL); /* step - 1's, while step runs */
                }
            }
            if (!queue && !st) {
                st = dev ? lm_model_forward_sample(m, kv, seqs, B, greedy, chosen, NULL)
                         : lm_model_forward(m, kv, seqs, B, logits);
            }
        }
        if (queue && !st) st = lm_model_collect(m, kv, chosen, NULL);
        double dt = now_s() - t0;
        if (rep >= 0) tps[rep] = (double)B * n / dt;
    }
    free(blocks);
    free(seqs);
    free(logits);
    free(greedy);
    free(chosen);
    free(feed);
    lm_kv_cache_destroy(kv);
    return st;
}

/* ---- the markdown table ---- */

/* Columns wide enough for every figure up to 9,999,999.99 tokens/s (GPU batches reach ~100,000):
 * the rows print as each test ends, before the later figures are known. */
#define WIDEST_MEAN_STD "9999999.99 ± 999999.99"
#define WIDEST_MEDIAN "9999999.99"
#define WIDEST_RANGE "9999999.99 - 9999999.99"

enum { N_COLS = 10 };
static const char *const k_headers[N_COLS] = {"model", "dtype", "weights", "threads", "test",
                                              "t/s (mean ± std)", "t/s (median)", "t/s (min - max)",
                                              "weights GB/s", "% of read"};
static const bool k_right[N_COLS] = {false, false, false, true, false, true, true, true, true, true};

/* Columns on screen of a UTF-8 string (one per code point: the table holds no wide characters;
 * printf's widths count bytes, and "±" is two). */
static int text_width(const char *s) {
    int w = 0;
    for (; *s; s++) w += ((unsigned char)*s & 0xC0) != 0x80;
    return w;
}

/* Widens width[i] to fit `cells[i]`. */
static void fit(int *width, const char *const *cells) {
    for (int i = 0; i < N_COLS; i++)
        if (text_width(cells[i]) > width[i]) width[i] = text_width(cells[i]);
}

/* One row, each cell padded to its column's width (a wider cell widens its row only: the
 * markdown stays valid). */
static void md_row(const char *const *cells, const int *width) {
    for (int i = 0; i < N_COLS; i++) {
        int pad = width[i] - text_width(cells[i]);
        pad = pad > 0 ? pad : 0;
        if (k_right[i])
            printf("| %*s%s ", pad, "", cells[i]);
        else
            printf("| %s%*s ", cells[i], pad, "");
    }
    printf("|\n");
}

static void md_rule(const int *width) {
    for (int i = 0; i < N_COLS; i++) {
        printf("| ");
        for (int k = 0; k < width[i] - (k_right[i] ? 1 : 0); k++) putchar('-');
        printf(k_right[i] ? ": " : " ");
    }
    printf("|\n");
}

/* The name of test `B` (0: the prefill test). */
static void test_name(char *out, size_t size, int p, int n, int B, int depth) {
    char d[24] = "";
    if (depth) snprintf(d, sizeof d, " @ d%d", depth);
    if (!B)
        snprintf(out, size, "pp%d%s", p, d);
    else if (B == 1)
        snprintf(out, size, "tg%d%s", n, d);
    else
        snprintf(out, size, "tg%d x B=%d%s", n, B, d);
}

/* The CPU's last-level cache in bytes: the highest level of cpu0's caches in /sys, else glibc's
 * sysconf(_SC_LEVEL3_CACHE_SIZE); 0 when neither knows. */
static size_t llc_bytes(void) {
    size_t best = 0;
    int best_level = 0;
    for (int i = 0; i < 16; i++) {
        char path[96], unit = 0;
        int level = 0;
        size_t size = 0;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        FILE *f = fopen(path, "r");
        if (!f) break;
        if (fscanf(f, "%d", &level) != 1) level = 0;
        fclose(f);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        if (!(f = fopen(path, "r"))) continue;
        if (fscanf(f, "%zu%c", &size, &unit) < 1) size = 0;
        fclose(f);
        size <<= unit == 'K' ? 10 : unit == 'M' ? 20 : unit == 'G' ? 30 : 0;
        if (size && level >= best_level) best = size, best_level = level;
    }
    if (!best) {
        long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
        best = v > 0 ? (size_t)v : 0;
    }
    return best;
}

static void json_stats(const struct stats *s) {
    printf("{\"mean\": %.4f, \"std\": %.4f, \"median\": %.4f, \"min\": %.4f, \"max\": %.4f, \"samples\": [",
           s->mean, s->std, s->median, s->lo, s->hi);
    for (int i = 0; i < s->n; i++) printf(i ? ", %.4f" : "%.4f", s->samples[i]);
    printf("]}");
}

int lm_cmd_perf(int argc, char **argv) {
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"tokenizer", required_argument, 0, 'T'},
                                         {"threads", required_argument, 0, 't'},
                                         {"prompt", required_argument, 0, 'p'},
                                         {"gen", required_argument, 0, 'n'},
                                         {"reps", required_argument, 0, 'r'},
                                         {"depth", required_argument, 0, 'd'},
                                         {"batch", required_argument, 0, 'b'},
                                         {"output", required_argument, 0, 'o'},
                                         {"mmap", no_argument, 0, 'M'},
                                         {"no-bw", no_argument, 0, 'W'},
                                         {"scalar", no_argument, 0, 'S'},
                                         {"device", required_argument, 0, 'D'},
                                         {"no-async-scheduling", no_argument, 0, 'Q'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    struct lm_model_open_params params = lm_model_default_open_params();
    params.tokenizer_optional = true; /* ids only: vocab_size bounds them when there is none */
    const char *model_dir = NULL;
    int p = 512, n = 128, reps = 3, depth = 0, c, batches[16] = {1}, n_batches = 1;
    bool json = false, bw = true, queue = true;
    optind = 1;
    while ((c = getopt_long(argc, argv, "ht:p:n:r:d:b:o:", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model_dir = optarg; break;
        case 'T': params.tokenizer_dir = optarg; break;
        case 't':
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
        case 'b': {
            n_batches = 0; /* at most 16 (rows: pp + 16) */
            const size_t bl = strlen(optarg);
            if (bl && (optarg[0] == ',' || optarg[bl - 1] == ',' || strstr(optarg, ",,"))) {
                fprintf(stderr, "lumen perf: --batch: an empty item in '%s' (expected a list like 1,4,16)\n", optarg);
                return 2;
            }
            char *save = NULL, *copy = strdup(optarg);
            for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                if (n_batches == 16 || !parse_int(tok, "--batch", 1, &batches[n_batches])) {
                    if (n_batches == 16) fprintf(stderr, "lumen perf: at most 16 batch sizes\n");
                    free(copy);
                    return 2;
                }
                n_batches++;
            }
            free(copy);
            if (!n_batches) {
                fprintf(stderr, "lumen perf: --batch needs a list like 1,4,16\n");
                return 2;
            }
            break;
        }
        case 'o':
            if (!strcmp(optarg, "json"))
                json = true;
            else if (strcmp(optarg, "md")) {
                fprintf(stderr, "lumen perf: -o must be md or json, not '%s'\n", optarg);
                return 2;
            }
            break;
        case 'M': params.map_weights = true; break;
        case 'W': bw = false; break;
        case 'S': params.scalar_kernels = true; break;
        case 'D':
            if (!lm_cmd_device_ok("perf", optarg)) return 2;
            params.device = optarg;
            break;
        case 'Q': queue = false; break;
        case 'h': usage(stdout); return 0;
        default: return lm_cmd_usage_error("perf");
        }
    }
    if (optind < argc || !model_dir) {
        fprintf(stderr, "lumen perf: %s\n",
                optind < argc ? lm_cmd_unexpected(argv[optind]) : "--model is required");
        return lm_cmd_usage_error("perf");
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
    const char *residency = !info.weights_mapped ? "read into anonymous memory"
                            : info.weights_locked ? "mmap'd in place, prefaulted and locked (mlock)"
                                                  : "mmap'd in place, prefaulted, NOT locked (mlock "
                                                    "refused: pages may be evicted)";
    const char *wshort = !info.weights_mapped ? "ram" : info.weights_locked ? "mmap+mlock" : "mmap";
    /* Q8_0 and bf16 weights on the CPU: which matmul path (backend/cpu/ops.h, LM_CPU_Q8_ACT,
     * LM_CPU_BF16_ACT). */
    const bool cpu_mm = !params.device || !strcmp(params.device, "cpu");
    const char *q8path = cpu_mm && !strcmp(info.weight_dtype, "q8_0") ? lm_q8_0_path_name(lm_cpu_q8_0_path()) : NULL;
    const char *bf16path = cpu_mm && !strcmp(info.weight_dtype, "bf16") ? lm_bf16_path_name(lm_cpu_bf16_path()) : NULL;

    /* The read-bandwidth probe: 3 samples now, and one before each decode repetition (paired:
     * the machine is shared, so each decode figure is compared with a read made next to it). */
    struct bw_probe probe = {0};
    /* The probe reads host memory: beside a GPU's decode it would compare unlike things. */
    if (strcmp(info.device, "cpu")) bw = false;
    if (bw && !bw_open(&probe, info.n_threads))
        fprintf(stderr, "lumen perf: no memory for the read-bandwidth probe; skipping it\n");
    enum { MAX_ROWS = 17 };
    double *all_bw = calloc((size_t)(3 + reps * MAX_ROWS), sizeof *all_bw);
    int n_bw = 0;
    if (probe.p) {
        bw_sample(&probe); /* warm-up */
        for (int i = 0; i < 3; i++) all_bw[n_bw++] = bw_sample(&probe);
    }

    int cap = depth + (p > n ? p : n);
    struct lm_seq *s;
    if (lm_seq_create(m, cap, &s)) {
        int rc = lm_cmd_fail("perf", NULL);
        lm_model_close(m);
        bw_close(&probe);
        free(all_bw);
        return rc;
    }
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)cap);
    const struct lm_tokenizer *tok = lm_model_tokenizer(m);
    size_t tv = tok ? lm_tokenizer_vocab_size(tok) : 0;
    fill_ids(ids, cap, tv && tv < (size_t)cfg->vocab_size ? (int)tv : cfg->vocab_size, 42);
    float *logits = malloc(sizeof(float) * (size_t)cfg->vocab_size);

    if (!json) {
        printf("model: %s (%s, %s, %d layers, hidden %d, %d/%d heads, head_dim %d, vocab %d, "
               "%.1fM params)\n",
               lm_model_name(m), info.format, cfg->model_type, cfg->num_hidden_layers, cfg->hidden_size,
               cfg->num_attention_heads, cfg->num_key_value_heads, cfg->head_dim, cfg->vocab_size,
               info.n_params / 1e6);
        printf("weights: %s, %.1f MiB, %s (loaded in %.2f s); kernels: %s, %d thread%s%s%s%s%s%s\n",
               info.weight_dtype, info.weight_bytes / (1024.0 * 1024.0), residency, load_s,
               info.kernels, info.n_threads, info.n_threads == 1 ? "" : "s",
               q8path ? "; q8_0 matmul: " : "", q8path ? q8path : "", bf16path ? "; bf16 matmul: " : "",
               bf16path ? bf16path : "", bf16path ? " activations" : "");
        if (!tok) printf("tokenizer: none (no tokenizer.json): prompt ids drawn from 1 to vocab_size - 1\n");
        fflush(stdout);
    }
    lm_status st = LM_OK;
    if (depth) {
        lm_seq_truncate(s, 0);
        st = lm_seq_forward(s, ids, depth, logits, false);
    }
    struct row rows[MAX_ROWS];
    int n_rows = 0;
    /* Column widths: the headers, the strings known now, the widest figures printed later. */
    int width[N_COLS] = {0};
    char threads_s[16];
    snprintf(threads_s, sizeof threads_s, "%d", info.n_threads);
    fit(width, k_headers);
    for (int t = 0; t < 1 + n_batches; t++) {
        char name[64];
        test_name(name, sizeof name, p, n, t ? batches[t - 1] : 0, depth);
        fit(width, (const char *const[N_COLS]){lm_model_name(m), info.weight_dtype, wshort, threads_s, name,
                                               WIDEST_MEAN_STD, WIDEST_MEDIAN, WIDEST_RANGE, "", ""});
    }
    double *samples = calloc((size_t)reps * MAX_ROWS, sizeof *samples);
    double *rep_bw = calloc((size_t)reps, sizeof *rep_bw);
    for (int test = 0; test < 1 + n_batches && !st; test++) {
        struct row *r = &rows[n_rows];
        double *x = samples + (size_t)n_rows * reps;
        if (test == 0) {
            if (!p) continue;
            st = run_seq(s, ids, depth, p, 0, reps, logits, x, &probe, rep_bw);
            r->batch = 0;
        } else {
            if (!n) continue;
            int B = batches[test - 1];
            if (B == 1 && !lm_model_samples_on_device(m)) {
                st = run_seq(s, ids, depth, 0, n, reps, logits, x, &probe, rep_bw);
            } else if (lm_model_samples_on_device(m)) {
                /* A CUDA model holds one KV cache at a time: the sequence's makes way. */
                lm_seq_destroy(s);
                s = NULL;
                st = run_batch(m, B, depth, n, reps, ids, depth + n, queue, x, &probe, rep_bw);
                if (!st) st = lm_seq_create(m, cap, &s);
                if (!st && depth) st = lm_seq_forward(s, ids, depth, logits, false);
            } else {
                st = run_batch(m, B, depth, n, reps, ids, depth + n, queue, x, &probe, rep_bw);
            }
            r->batch = B;
        }
        if (st) break;
        test_name(r->test, sizeof r->test, p, n, r->batch, depth);
        summarize(x, reps, &r->tps);
        r->gbps = r->batch ? (double)info.weight_bytes * r->tps.mean / r->batch / 1e9 : 0;
        r->pct = 0;
        if (r->batch && probe.p) {
            for (int i = 0; i < reps; i++) {
                r->pct += 100.0 * ((double)info.weight_bytes * x[i] / r->batch / 1e9) / rep_bw[i] / reps;
                all_bw[n_bw++] = rep_bw[i];
            }
        }
        n_rows++;
        if (!json) {
            if (n_rows == 1) {
                printf("\n");
                md_row(k_headers, width);
                md_rule(width);
            }
            char ms[64], med[32], range[64], gb[32] = "", pct[32] = "";
            snprintf(ms, sizeof ms, "%.2f ± %.2f", r->tps.mean, r->tps.std);
            snprintf(med, sizeof med, "%.2f", r->tps.median);
            snprintf(range, sizeof range, "%.2f - %.2f", r->tps.lo, r->tps.hi);
            if (r->batch) snprintf(gb, sizeof gb, "%.1f", r->gbps);
            if (r->batch && probe.p) snprintf(pct, sizeof pct, "%.0f%%", r->pct);
            md_row((const char *const[N_COLS]){lm_model_name(m), info.weight_dtype, wshort, threads_s, r->test, ms,
                                               med, range, gb, pct},
                   width);
            fflush(stdout);
        }
    }
    struct stats bwst = {0};
    if (n_bw) summarize(all_bw, n_bw, &bwst);
    int rc = st ? lm_cmd_fail("perf", NULL) : 0;
    /* Weights smaller than the last-level cache stay there between decode steps, so "% of read"
     * compares cache reads with the probe's memory reads (CPU runs only). */
    const bool on_cpu = !strcmp(info.device, "cpu");
    const size_t llc = on_cpu ? llc_bytes() : 0;
    double max_pct = 0;
    for (int i = 0; i < n_rows; i++) max_pct = fmax(max_pct, rows[i].pct);
    if (!rc && !json) {
        if (bwst.n)
            printf("\nread bandwidth (%d thread%s summing 512 MiB, %d samples through the run): "
                   "%.1f ± %.1f GB/s (%.1f - %.1f)\n",
                   info.n_threads, info.n_threads == 1 ? "" : "s", bwst.n, bwst.mean, bwst.std,
                   bwst.lo, bwst.hi);
        printf("%s%d repetition%s after one warm-up; decode timing excludes any prefill. weights GB/s: the\n"
               "%.1f MiB of weights one decode step reads, times steps per second",
               bwst.n ? "" : "\n", reps, reps == 1 ? "" : "s", info.weight_bytes / (1024.0 * 1024.0));
        if (probe.p)
            printf("; %% of read: that over\nthe read bandwidth sampled just before each repetition (mean of the ratios).\n");
        else
            printf(" (no read-bandwidth\nprobe: --no-bw, a GPU run, or no memory for it, so %% of read stays empty).\n");
        if (lm_model_can_queue(m) && n)
            printf("decode on the GPU: %s\n", queue ? "each step queued before the host reads the last one's ids (its "
                                                     "tokens fed on the device; --no-async-scheduling waits instead; a "
                                                     "step of more sequences than one device call takes waits)"
                                                   : "each step waits for the last one's ids (--no-async-scheduling)");
        if (on_cpu && probe.p && max_pct > 0 && llc && info.weight_bytes < llc)
            printf("note: %% of read can exceed 100%% here: the %.1f MiB of weights fit in the %.1f MiB last-level\n"
                   "cache, so decode steps read them from cache while the probe reads 512 MiB from memory.\n",
                   info.weight_bytes / (1024.0 * 1024.0), llc / (1024.0 * 1024.0));
        else if (on_cpu && !llc && max_pct > 100)
            printf("note: %% of read above 100%% means the weights were read from cache, not memory; the\n"
                   "last-level cache size is unknown here (neither sysconf nor /sys gives it).\n");
    }
    if (!rc && json) {
        printf("{\"model\": \"%s\", \"format\": \"%s\", \"model_type\": \"%s\", \"params\": %ld, "
               "\"weight_dtype\": \"%s\", \"weight_bytes\": %zu, \"weights\": \"%s\", \"weights_mapped\": %s, "
               "\"weights_locked\": %s, \"kernels\": \"%s\", \"q8_0_matmul\": %s%s%s, \"bf16_matmul\": %s%s%s, "
               "\"threads\": %d, "
               "\"load_s\": %.3f, \"reps\": %d, \"depth\": %d, \"last_level_cache_bytes\": ",
               lm_model_name(m), info.format, cfg->model_type, info.n_params, info.weight_dtype,
               info.weight_bytes, wshort, info.weights_mapped ? "true" : "false",
               info.weights_locked ? "true" : "false", info.kernels, q8path ? "\"" : "",
               q8path ? q8path : "null", q8path ? "\"" : "", bf16path ? "\"" : "", bf16path ? bf16path : "null",
               bf16path ? "\"" : "", info.n_threads, load_s, reps, depth);
        if (llc)
            printf("%zu", llc);
        else
            printf("null");
        printf(",\n \"read_bandwidth_gbps\": ");
        if (bwst.n)
            json_stats(&bwst);
        else
            printf("null");
        printf(",\n \"results\": [");
        for (int i = 0; i < n_rows; i++) {
            const struct row *r = &rows[i];
            printf("%s\n  {\"test\": \"%s\", \"batch\": %d, \"tokens_per_s\": ", i ? "," : "", r->test, r->batch);
            json_stats(&r->tps);
            if (r->batch) {
                printf(", \"weights_gbps\": %.3f", r->gbps);
                if (probe.p) printf(", \"pct_of_read_bandwidth\": %.2f", r->pct);
            }
            printf("}");
        }
        printf("\n]}\n");
    }
    free(rep_bw);
    free(all_bw);
    bw_close(&probe);
    free(samples);
    free(ids);
    free(logits);
    lm_seq_destroy(s);
    lm_model_close(m);
    return rc;
}
