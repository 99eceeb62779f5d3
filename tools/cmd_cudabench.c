/* cmd_cudabench.c: `lumen cudabench`: the CUDA backend's speed on a GPU, printed as tables.
 *
 * - the measured ceiling: device-to-device copy bandwidth, and from it the decode floor (bytes a
 *   step reads / bandwidth);
 * - tg<N>: batch-1 decode of N tokens from an empty cache (llama-bench's tg), one token a step;
 * - pp<P>: one forward call over a P-token prompt (llama-bench's pp);
 * - batched decode throughput: B sequences each prefilled with --in random tokens (timed on its
 *   own), then --out decode steps of all B together (llama-batched-bench's S_PP, S_TG and S);
 * - --micro: each linear layer's GEMV kernel against the copy bandwidth, the decode attention
 *   (8-warp and v6 kernels) and the argmax;
 * - --variants: tg<N> with CUDA graphs and programmatic dependent launch on/off, with 1 or 2
 *   weight rows per warp, with the v6 decode attention, with the MLP as two GEMV launches
 *   instead of lm_cuda_mlp1, and batch 2, 4, 8 on the GEMV vs the
 *   cuBLAS path. (The variants that measured slower or within noise, docs/perf-notes.md v4-v8,
 *   were removed after measurement.)
 * - --trace: the GEMV blocks' timeline in a batch-1 decode step (lm_cuda_ctx_trace), with the
 *   lm_head's greedy screen and pick as rows of their own (lm_cuda_trace_entry.kind);
 *   --trace-batches: the same for batched decode steps (the GEMV, MLP and tensor-core GEMM blocks);
 *   after each timeline, the tensor-core GEMM's blocks alone on their multiprocessor against those
 *   sharing it with another block of the same launch (the trace's %smid);
 * - --gemm: the batched path's four layer GEMMs at 16 to 64 rows, lm_cuda_gemm_tc in each split
 *   count the shape allows against cuBLAS.
 * Every figure is the median over --reps timed runs after one warm-up run. Greedy decoding; the
 * timings include the host side of each step (input copy, launch, waiting for the ids). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "commands.h"

#ifdef LM_HAVE_CUDA /* only the CUDA build's options take lists */
/* Parses a comma-separated list of up to cap integers from lo to hi into out; the count, or -1
 * when s is not such a list (an empty item, a non-number, out of range, too many). */
static int parse_list(const char *s, long lo, long hi, int *out, int cap) {
    int n = 0;
    for (const char *p = s;;) {
        char *end = NULL;
        const long v = strtol(p, &end, 10);
        if (end == p || v < lo || v > hi || n == cap || (*end && *end != ',')) return -1;
        out[n++] = (int)v;
        if (!*end) return n;
        p = end + 1;
    }
}
#endif

static void usage(FILE *f) {
    fprintf(f,
            "usage: lumen cudabench --model DIR [--reps 5] [-p 512] [-n 128] [--batches LIST]\n"
            "                       [--in 128] [--out 128] [--micro] [--variants] [--trace]\n"
            "                       [--trace-batches LIST] [--gemm] [--q8] [--device N]\n\n"
            "Measures the CUDA backend on a Qwen3 checkpoint (make one with `lumen synth --shape\n"
            "qwen3-0.6b --out DIR`) and prints tables of tokens per second, medians over the\n"
            "repetitions, next to the bandwidth floor.\n\n"
            "  --model DIR     Hugging Face Qwen3 folder (config.json, model.safetensors)\n"
            "  -r, --reps R    timed repetitions of each test (default 5)\n"
            "  -p, --prompt P  prefill test over a P-token prompt (0 skips; default 512)\n"
            "  -n, --gen N     batch-1 decode test of N steps (0 skips; default 128)\n"
            "  --batches LIST  batch sizes of the throughput test, comma-separated (default\n"
            "                  1,8,32,64,128,256; --batches= skips it)\n"
            "  --in N          prompt tokens per sequence in the throughput test (default 128)\n"
            "  --out N         decode steps in the throughput test (default 128)\n"
            "  --micro         time each linear layer's kernel (1 and 8 rows)\n"
            "  --variants      time tg<N> with graphs / PDL / rows-per-warp / two-launch MLP\n"
            "                  variants (with --q8 also the GEMV over the bf16 copy)\n"
            "  --gemm          time the batched path's four layer GEMMs at 16, 32, 48 and\n"
            "                  64 rows: the tensor-core kernel in each split count, its\n"
            "                  products on wgmma (wg) and on mma.sync (mma), and cuBLAS\n"
            "  --gemm-rows L   the row counts of --gemm, comma-separated (9 to 64)\n"
            "  --trace         timeline of the GEMV and MLP blocks in a batch-1 decode step\n"
            "                  (per matrix, averaged over layers: when blocks start, pass\n"
            "                  their wait on the preceding kernel, have x staged, finish),\n"
            "                  with the lm_head's greedy screen and pick ('screen': wait-x\n"
            "                  x staged, ready x also quantized; 'pick': wait-x its bounds\n"
            "                  read and compared, ready its candidates known)\n"
            "  --trace-batches LIST  the same timeline for a decode step of each batch size\n"
            "                  (2 to 1024, comma-separated; sequences of min(--in, 64)\n"
            "                  tokens): the GEMV and MLP kernels where the step runs them, the\n"
            "                  tensor-core GEMM up to LM_CUDA_GEMM_TC rows (wait-x: when\n"
            "                  its last slice of x landed; with LM_CUDA_TRACE_SYNC=1, when it\n"
            "                  passed the cluster barrier after its partials); cuBLAS\n"
            "                  launches are not traced. After each timeline, the tensor-core\n"
            "                  GEMM's co-residency: the share of blocks that shared their\n"
            "                  multiprocessor with another block of the same launch, and the\n"
            "                  products of blocks alone against sharing\n"
            "  --q8            quantize the matrices to Q8_0 on load (as `lumen build --dtype\n"
            "                  q8_0`): the batch-1..4 GEMV reads int8 quants and scales (about\n"
            "                  half the bytes; int8 activations), batches over 4 keep cuBLAS on a\n"
            "                  bf16 copy\n"
            "  --device N      CUDA device index, N, cuda or cuda:N (default 0)\n"
            "  -h, --help      show this help\n");
}

#ifndef LM_HAVE_CUDA
int lm_cmd_cudabench(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
    fprintf(stderr, "lumen cudabench: this lumen was built without CUDA (configure with nvcc on the "
                    "PATH and -DLM_CUDA=ON)\n");
    return 1;
}
#else

#include "backend/cuda/cuda.h"
#include "backend/cuda/qwen3.h"
#include "base/file.h"
#include "base/status.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static uint64_t g_rng = 42;
static int32_t rand_id(int vocab) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return 1 + (int32_t)(g_rng % (uint64_t)(vocab - 1));
}

struct bench {
    struct lm_cuda_qwen3 *m;
    struct lm_cuda_qwen3_info info;
    int32_t *bt;      /* [max_seqs][W]: sequence i owns blocks i*per .. */
    int per;          /* blocks per sequence */
};

/* Prefill sequences [0, B) with in_len tokens each (ids [B][in_len]), packing as many sequences
 * into one call as max_tokens allows; next[B] gets each one's greedy next id. */
static lm_status prefill(struct bench *b, int B, int in_len, const int32_t *ids, int32_t *next) {
    const int W = b->info.bt_width, T = b->info.max_tokens;
    int per_call = T / in_len;
    if (per_call < 1) return lm_errorf(LM_ERR_RANGE, "prompt of %d tokens exceeds max_tokens %d", in_len, T);
    if (per_call > b->info.max_seqs) per_call = b->info.max_seqs;
    int32_t *pos = malloc(sizeof(int32_t) * T), *seq = malloc(sizeof(int32_t) * T);
    int32_t *out = malloc(sizeof(int32_t) * per_call);
    lm_status rc = LM_OK;
    for (int s0 = 0; s0 < B && !rc; s0 += per_call) {
        const int k = B - s0 < per_call ? B - s0 : per_call;
        for (int j = 0; j < k; j++) {
            for (int p = 0; p < in_len; p++) pos[j * in_len + p] = p, seq[j * in_len + p] = j;
            out[j] = (j + 1) * in_len - 1;
        }
        struct lm_cuda_batch bb = {0};
        bb.n_tokens = k * in_len;
        bb.ids = ids + (size_t)s0 * in_len;
        bb.pos = pos;
        bb.seq = seq;
        bb.n_seqs = k;
        bb.block_tables = b->bt + (size_t)s0 * W;
        bb.n_out = k;
        bb.out_tokens = out;
        bb.out_ids = next + s0;
        rc = lm_cuda_qwen3_forward(b->m, &bb);
    }
    free(pos);
    free(seq);
    free(out);
    return rc;
}

/* `steps` decode steps of sequences [0, B) from position start; ids in/out in next[B]. */
static lm_status decode(struct bench *b, int B, int start, int steps, int32_t *next) {
    const int W = b->info.bt_width;
    int32_t *pos = malloc(sizeof(int32_t) * B), *seq = malloc(sizeof(int32_t) * B);
    int32_t *ids = malloc(sizeof(int32_t) * B);
    for (int i = 0; i < B; i++) seq[i] = i;
    struct lm_cuda_batch bb = {0};
    bb.n_tokens = B;
    bb.ids = ids;
    bb.pos = pos;
    bb.seq = seq;
    bb.n_seqs = B;
    bb.block_tables = b->bt;
    bb.n_out = B;
    bb.out_tokens = seq;
    bb.out_ids = next;
    lm_status rc = LM_OK;
    for (int t = 0; t < steps && !rc; t++) {
        for (int i = 0; i < B; i++) pos[i] = start + t, ids[i] = next[i];
        rc = lm_cuda_qwen3_forward(b->m, &bb);
    }
    (void)W;
    free(pos);
    free(seq);
    free(ids);
    return rc;
}

/* tg<n>: median tokens per second of `reps` runs (one warm-up). */
static lm_status bench_tg(struct bench *b, int n, int reps, double *tps, double *lo, double *hi) {
    double *v = malloc(sizeof(double) * reps);
    lm_status rc = LM_OK;
    for (int r = -1; r < reps && !rc; r++) {
        int32_t next = 1000;
        double t0 = now_s();
        rc = decode(b, 1, 0, n, &next);
        double dt = now_s() - t0;
        if (r >= 0) v[r] = n / dt;
    }
    if (!rc) {
        *tps = median(v, reps);
        *lo = v[0];
        *hi = v[reps - 1];
    }
    free(v);
    return rc;
}

static void row(const char *test, int B, double med, double lo, double hi, double floor_tps) {
    char range[48], pct[16] = "";
    snprintf(range, sizeof range, "%.0f - %.0f", lo, hi);
    if (floor_tps > 0) snprintf(pct, sizeof pct, "%.0f%%", 100.0 * med / floor_tps);
    printf("| %-22s | %4d | %12.0f | %21s | %9.1f | %9s |\n", test, B, med, range,
           B * 1e6 / med, pct);
    fflush(stdout);
}

static int cmp_u64(const void *a, const void *b) {
    unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
    return x < y ? -1 : x > y;
}

/* One launch of the traced step: its blocks' times, in ns from the step's first block start. */
struct launch {
    uintptr_t w;
    int m, k, n;
    int kind; /* enum lm_cuda_trace_kind */
    bool mid; /* its blocks recorded t_mid (k_gemm_tc: the last slice of x landed) */
    double start_min, start_med, wait_med, wait_max, ready_med, ready_max, end_med, end_max, mid_med;
};

static int cmp_launch(const void *a, const void *b) {
    const struct launch *x = a, *y = b;
    return x->start_min < y->start_min ? -1 : x->start_min > y->start_min;
}

/* Median of v[0..c) (sorted in place); -1 when c is 0. */
static double median_u64(unsigned long long *v, int c) {
    if (c == 0) return -1;
    qsort(v, c, sizeof *v, cmp_u64);
    return (double)v[c / 2];
}

/* For the k_gemm_tc launches of trace_step's step (entries first..n, launches L sorted by start):
 * per shape, averaged over its launches, the share of blocks that shared their multiprocessor with
 * another block of the same launch while they ran (%smid equal, start-to-end intervals
 * overlapping), and the median block's products (its last slice of x landed
 * to its own products summed) and wait-to-ready time among the blocks alone on theirs and among
 * those sharing (us). Blocks of the launches before and after it on the same multiprocessor are
 * not counted. */
static void print_coresidency(const struct lm_cuda_trace_entry *e, int first, int n, const struct launch *L, int nl,
                              const char *name) {
    unsigned long long *v[4];
    for (int g = 0; g < 4; g++) v[g] = malloc(sizeof **v * 4096);
    int *idx = malloc(sizeof *idx * 4096);
    bool *counted = calloc((size_t)nl, sizeof *counted);
    if (!idx || !counted || !v[0] || !v[1] || !v[2] || !v[3]) {
        printf("\nco-residency, %s: out of memory\n", name);
        free(counted), free(idx);
        for (int g = 0; g < 4; g++) free(v[g]);
        return;
    }
    printf("\nco-residency, %s (k_gemm_tc launches: blocks alone on their multiprocessor or sharing it with "
           "another block of the same launch; us, medians over blocks, averaged over layers)\n", name);
    printf("| %-12s | %6s | %7s | %14s | %16s | %16s | %18s |\n", "m x k", "blocks", "sharing", "products alone",
           "products sharing", "wait-ready alone", "wait-ready sharing");
    printf("| ------------ | -----: | ------: | -------------: | ---------------: | ---------------: | "
           "-----------------: |\n");
    for (int j = 0; j < nl; j++) {
        if (counted[j] || !L[j].mid) continue;
        double share = 0, sum[4] = {0}, cnt = 0, have[4] = {0};
        for (int q = j; q < nl; q++) {
            if (L[q].m != L[j].m || L[q].k != L[j].k || !L[q].mid) continue;
            counted[q] = true;
            int nb = 0, ns = 0, c[4] = {0};
            for (int i = first; i < n && nb < 4096; i++)
                if (e[i].weights == L[q].w) idx[nb++] = i;
            for (int a = 0; a < nb; a++) {
                const struct lm_cuda_trace_entry *x = &e[idx[a]];
                int sh = 0; /* another block of the launch on its multiprocessor while it ran */
                for (int b2 = 0; b2 < nb && !sh; b2++) {
                    const struct lm_cuda_trace_entry *o = &e[idx[b2]];
                    sh = b2 != a && o->sm == x->sm && o->t_start < x->t_end && x->t_start < o->t_end;
                }
                ns += sh;
                /* products only where x's landing precedes them (not with LM_CUDA_TRACE_SYNC=1,
                 * whose t_mid follows the partials) */
                if (x->t_mid && x->t_mid <= x->t_ready && c[sh] < 4096) v[sh][c[sh]++] = x->t_ready - x->t_mid;
                if (c[2 + sh] < 4096) v[2 + sh][c[2 + sh]++] = x->t_ready - x->t_waited;
            }
            if (!nb) continue;
            share += (double)ns / nb;
            for (int g = 0; g < 4; g++) {
                const double med = median_u64(v[g], c[g]);
                if (med >= 0) sum[g] += med / 1e3, have[g]++;
            }
            cnt++;
        }
        if (!cnt) continue;
        char col[4][16];
        for (int g = 0; g < 4; g++) {
            if (have[g]) snprintf(col[g], sizeof col[g], "%.2f", sum[g] / have[g]);
            else snprintf(col[g], sizeof col[g], "-");
        }
        printf("| %5d x %-4d | %6d | %6.0f%% | %14s | %16s | %16s | %18s |\n", L[j].m, L[j].k, L[j].n,
               100 * share / cnt, col[0], col[1], col[2], col[3]);
    }
    fflush(stdout);
    free(counted), free(idx);
    for (int g = 0; g < 4; g++) free(v[g]);
}

/* Runs a few decode steps of B sequences with the trace on (B = 1: tg steps from an empty cache;
 * B > 1: B sequences of in_len random tokens, then `steps` decode steps of all B) and prints, per
 * matrix shape, the average over the step's launches of each phase (us): the block started before
 * its predecessor's last block ended (lead), waited, then had its inputs (stall after the wait),
 * ran to its end; end-wait: the median block's wait returned this long after the predecessor
 * traced launch's last block ended (for o_proj that includes the attention kernel between them).
 * Traced kernels: the GEMV, the MLP kernel, k_gemm_tc (its "ready" is its products summed and
 * its x-landed column the last slice of x in shared memory), and at 1-2 rows the lm_head's greedy
 * screen and pick (rows of their own by lm_cuda_trace_entry.kind; "x": x staged, the bounds
 * read and compared; "ready": x also quantized, the candidates known). Where k is too large for
 * two rows' staging, a 2-row screen is two launches over one pointer, and the walk back below
 * stops between them. */
static lm_status trace_step(struct bench *b, int B, int steps, int in_len, const char *name) {
    struct lm_cuda_ctx *ctx = lm_cuda_qwen3_ctx(b->m);
    const int cap = 1 << 18;
    lm_status rc0 = lm_cuda_ctx_trace(ctx, cap);
    if (rc0) return rc0;
    lm_cuda_qwen3_drop_graphs(b->m); /* recapture with the trace pointer */
    double med, lo, hi;
    lm_status rc = LM_OK;
    if (B == 1) {
        rc = bench_tg(b, steps, 1, &med, &lo, &hi);
    } else {
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)B * in_len), *next = malloc(sizeof(int32_t) * B);
        for (long j = 0; j < (long)B * in_len; j++) ids[j] = rand_id(b->info.cfg.vocab);
        rc = prefill(b, B, in_len, ids, next);
        if (!rc) rc = decode(b, B, in_len, steps, next);
        free(ids), free(next);
    }
    struct lm_cuda_trace_entry *e = rc ? NULL : malloc(sizeof *e * cap);
    int n = 0;
    if (!rc && !e) rc = lm_errorf(LM_ERR_NOMEM, "trace buffer");
    if (!rc) rc = lm_cuda_ctx_trace_read(ctx, e, cap, &n);
    lm_cuda_ctx_trace(ctx, 0);
    lm_cuda_qwen3_drop_graphs(b->m);
    if (rc) {
        free(e);
        return rc;
    }
    /* The last step: walk back from the end until a (matrix, block) pair repeats (steps do not
     * overlap: the bench waits for each step's ids). */
    int first = n;
    struct launch *L = calloc(512, sizeof *L);
    unsigned char (*seen)[4096] = calloc(512, sizeof *seen); /* blocks of a launch, up to 4,096 */
    int nl = 0;
    for (int i = n - 1; i >= 0; i--) {
        int f = -1;
        for (int j = 0; j < nl && f < 0; j++)
            if (L[j].w == e[i].weights) f = j;
        if (f < 0) {
            if (nl == 512) break;
            f = nl++;
            L[f].w = e[i].weights, L[f].m = e[i].m, L[f].k = e[i].k, L[f].kind = e[i].kind;
        }
        const int blk = e[i].block & 4095;
        if (seen[f][blk]) break;
        seen[f][blk] = 1;
        L[f].n++;
        if (e[i].t_mid) L[f].mid = true;
        first = i;
    }
    free(seen);
    if (nl < 2) {
        printf("\ntimeline, %s: fewer than two traced launches in a step (B = %d runs on kernels the trace "
               "does not cover: cuBLAS above LM_CUDA_GEMM_TC rows)\n",
               name, B);
        free(L), free(e);
        return LM_OK;
    }
    unsigned long long t_base = ~0ull;
    for (int i = first; i < n; i++)
        if (e[i].t_start < t_base) t_base = e[i].t_start;
    unsigned long long *v = malloc(sizeof *v * 4096);
    for (int j = 0; j < nl; j++) {
        double *outs[5][2] = {{&L[j].start_min, &L[j].start_med}, {&L[j].wait_med, &L[j].wait_max},
                              {&L[j].ready_med, &L[j].ready_max}, {&L[j].end_med, &L[j].end_max},
                              {&L[j].mid_med, NULL}};
        for (int q = 0; q < 5; q++) {
            int c = 0;
            for (int i = first; i < n && c < 4096; i++)
                if (e[i].weights == L[j].w) {
                    const unsigned long long t = q == 0   ? e[i].t_start
                                                 : q == 1 ? e[i].t_waited
                                                 : q == 2 ? e[i].t_ready
                                                 : q == 3 ? e[i].t_end
                                                          : (e[i].t_mid ? e[i].t_mid : e[i].t_waited);
                    v[c++] = t - t_base;
                }
            qsort(v, c, sizeof *v, cmp_u64);
            if (q == 0) *outs[q][0] = v[0], *outs[q][1] = v[c / 2];
            else if (q == 4) *outs[q][0] = v[c / 2];
            else *outs[q][0] = v[c / 2], *outs[q][1] = v[c - 1];
        }
    }
    qsort(L, nl, sizeof *L, cmp_launch);
    /* Per shape: average over its launches of (start - previous launch's last end), wait -
     * start, ready - wait, end - ready, and the launch's span (its last end - the previous last end). */
    printf("\ntimeline, %s (one step of %d token%s, %d traced launches; us, medians over blocks, averaged over "
           "layers; 'lead' = first block start before the previous traced launch's last block end)\n",
           name, B, B == 1 ? "" : "s", nl);
    printf("| %-20s | %3s | %6s | %8s | %9s | %9s | %9s | %9s | %9s | %9s |\n", "m x k", "n", "blocks", "lead",
           "start-wait", "end-wait", "wait-x", "wait-ready", "ready-end", "span");
    printf("| -------------------- | --: | -----: | -------: | --------: | --------: | --------: | --------: | "
           "--------: | --------: |\n");
    bool *counted = calloc((size_t)nl, sizeof *counted); /* launches already in a shape's row */
    for (int j = 1; j < nl; j++) {
        if (counted[j]) continue;
        double a[7] = {0}, cnt = 0;
        const int blocks = L[j].n;
        for (int q = j; q < nl; q++) { /* launch 0 has no predecessor in the step: not counted */
            if (L[q].m != L[j].m || L[q].k != L[j].k || L[q].kind != L[j].kind) continue;
            const double prev_end = L[q - 1].end_max;
            a[0] += (prev_end - L[q].start_min) / 1e3;
            a[1] += (L[q].wait_med - L[q].start_med) / 1e3;
            a[2] += (L[q].ready_med - L[q].wait_med) / 1e3;
            a[3] += (L[q].end_med - L[q].ready_med) / 1e3;
            a[4] += (L[q].end_max - prev_end) / 1e3;
            a[5] += (L[q].wait_med - prev_end) / 1e3;
            a[6] += (L[q].mid_med - L[q].wait_med) / 1e3;
            cnt++;
            counted[q] = true;
        }
        char wx[16] = "-", shape[48];
        if (L[j].mid) snprintf(wx, sizeof wx, "%.2f", a[6] / cnt);
        /* the lm_head's screen and pick: x = x staged / the bounds compared, ready = x quantized / the
         * candidates known */
        snprintf(shape, sizeof shape, "%d x %d%s", L[j].m, L[j].k,
                 L[j].kind == LM_CUDA_TRACE_SCREEN ? " screen" : L[j].kind == LM_CUDA_TRACE_PICK ? " pick" : "");
        printf("| %-20s | %3.0f | %6d | %8.2f | %9.2f | %9.2f | %9s | %9.2f | %9.2f | %9.2f |\n", shape, cnt, blocks,
               a[0] / cnt, a[1] / cnt, a[5] / cnt, wx, a[2] / cnt, a[3] / cnt, a[4] / cnt);
    }
    printf("step: first block start to last block end %.1f us\n", (L[nl - 1].end_max - L[0].start_min) / 1e3);
    fflush(stdout);
    print_coresidency(e, first, n, L, nl, name);
    free(counted);
    free(v);
    free(L);
    free(e);
    return LM_OK;
}

int lm_cmd_cudabench(int argc, char **argv) {
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"reps", required_argument, 0, 'r'},
                                         {"prompt", required_argument, 0, 'p'},
                                         {"gen", required_argument, 0, 'n'},
                                         {"batches", required_argument, 0, 'b'},
                                         {"in", required_argument, 0, 'I'},
                                         {"out", required_argument, 0, 'O'},
                                         {"micro", no_argument, 0, 'M'},
                                         {"variants", no_argument, 0, 'V'},
                                         {"trace", no_argument, 0, 'T'},
                                         {"trace-batches", required_argument, 0, 't'},
                                         {"gemm", no_argument, 0, 'G'},
                                         {"gemm-rows", required_argument, 0, 'g'},
                                         {"q8", no_argument, 0, 'Q'},
                                         {"device", required_argument, 0, 'd'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *model = NULL, *batches = "1,8,32,64,128,256";
    int gn[16] = {16, 32, 48, 64}, ngn = 4; /* --gemm's row counts */
    int tbl[16], ntb = 0;                   /* --trace-batches */
    int reps = 5, pp = 512, tg = 128, in_len = 128, out_len = 128, device = 0, c;
    bool micro = false, variants = false, trace = false, q8 = false, gemm = false;
    optind = 1;
    while ((c = getopt_long(argc, argv, "hr:p:n:", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'r': reps = atoi(optarg); break;
        case 'p': pp = atoi(optarg); break;
        case 'n': tg = atoi(optarg); break;
        case 'b': batches = optarg; break;
        case 'I': in_len = atoi(optarg); break;
        case 'O': out_len = atoi(optarg); break;
        case 'M': micro = true; break;
        case 'V': variants = true; break;
        case 'T': trace = true; break;
        case 'G': gemm = true; break;
        case 'g':
            gemm = true;
            if ((ngn = parse_list(optarg, 9, 64, gn, 16)) < 0) {
                fprintf(stderr, "lumen cudabench: --gemm-rows takes up to 16 row counts from 9 to 64, not '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case 't':
            if ((ntb = parse_list(optarg, 2, 1024, tbl, 16)) < 0) {
                fprintf(stderr, "lumen cudabench: --trace-batches takes up to 16 batch sizes from 2 to 1024, not '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case 'Q': q8 = true; break;
        case 'd': { /* N, cuda:N, or cuda (device 0) as run, serve and perf take it */
            const char *dv = !strcmp(optarg, "cuda")            ? "0"
                             : strncmp(optarg, "cuda:", 5) == 0 ? optarg + 5
                                                                : optarg;
            char *end = NULL;
            long v = strtol(dv, &end, 10);
            if (!*dv || *end || v < 0 || v > 1023) {
                fprintf(stderr,
                        "lumen cudabench: --device takes a GPU index N, cuda or cuda:N, not '%s'\n",
                        optarg);
                return 2;
            }
            device = (int)v;
            break;
        }
        case 'h': usage(stdout); return 0;
        default: return lm_cmd_usage_error("cudabench");
        }
    }
    if (optind < argc || !model || reps < 1 || pp < 0 || tg < 0 || in_len < 1 || out_len < 1) {
        fprintf(stderr, "lumen cudabench: %s\n",
                !model             ? "--model DIR is required"
                : optind < argc    ? lm_cmd_unexpected(argv[optind])
                : reps < 1         ? "--reps must be an integer >= 1"
                : pp < 0 || tg < 0 ? "-p and -n must be >= 0"
                                   : "--in and --out must be >= 1");
        return lm_cmd_usage_error("cudabench");
    }
    int blist[32], nb = *batches ? parse_list(batches, 1, 1 << 20, blist, 32) : 0, maxb = 1;
    if (nb < 0) {
        fprintf(stderr, "lumen cudabench: --batches takes up to 32 positive integers, comma-separated, not '%s'\n",
                batches);
        return 2;
    }
    for (int i = 0; i < nb; i++) maxb = blist[i] > maxb ? blist[i] : maxb;
    for (int i = 0; i < ntb; i++) maxb = tbl[i] > maxb ? tbl[i] : maxb;

    char cfg_path[4096];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", model);
    if (!lm_file_exists(cfg_path)) {
        fprintf(stderr, "lumen cudabench: --model %s: no config.json there (a Hugging Face Qwen3 folder is needed)\n",
                model);
        return 1;
    }
    struct lm_cuda_device_info di;
    if (lm_cuda_device_info(device, &di)) return lm_cmd_fail("cudabench", NULL);
    printf("device: %s, compute capability %d.%d, %d SMs, %.1f GiB, L2 %d MiB, driver %d, runtime %d\n",
           di.name, di.cc_major, di.cc_minor, di.sm_count, di.total_mem / 1073741824.0,
           di.l2_bytes >> 20, di.driver, di.runtime);
    double bw = 0;
    if (lm_cuda_bench_copy(device, (size_t)2 << 30, 10, &bw)) return lm_cmd_fail("cudabench", NULL);
    printf("copy bandwidth (device to device, read + write, 2 GiB, median of 10): %.3f TB/s\n", bw / 1e12);

    /* The model, sized for the largest test. */
    struct lm_cuda_qwen3_params p = lm_cuda_qwen3_default_params();
    p.device = device;
    int max_len = in_len + out_len;
    if (tg > max_len) max_len = tg;
    if (pp > max_len) max_len = pp;
    p.max_context = max_len + 16;
    p.max_seqs = maxb > 8 ? maxb : 8;
    p.max_tokens = pp > 2048 ? pp : 2048;
    const int bs = p.block_size, per = (p.max_context + bs - 1) / bs;
    p.n_blocks = per * p.max_seqs;
    p.quantize_q8 = q8;
    struct bench b = {0};
    double t0 = now_s();
    if (lm_cuda_qwen3_open_dir(model, &p, &b.m)) return lm_cmd_fail("cudabench", NULL);
    lm_cuda_qwen3_info(b.m, &b.info);
    const struct lm_cuda_qwen3_config *cf = &b.info.cfg;
    printf("model: %s: %d layers, hidden %d, %d/%d heads, head_dim %d, intermediate %d, vocab %d; "
           "%.3f GB of weights on the device%s (loaded in %.1f s); KV cache bf16, %d blocks of %d\n",
           model, cf->n_layers, cf->hidden, cf->n_heads, cf->n_kv_heads, cf->head_dim, cf->intermediate,
           cf->vocab, b.info.weight_bytes / 1e9,
           q8 ? " (bf16, plus Q8_0 quants and scales the GEMV reads)" : " (bf16)", now_s() - t0,
           b.info.n_blocks, b.info.block_size);
    const double floor_us = b.info.step_bytes / bw * 1e6, floor_tps = 1e6 / floor_us;
    printf("floor: a decode step reads %.3f GB of weights -> %.1f us at %.3f TB/s = %.0f tok/s at batch 1\n",
           b.info.step_bytes / 1e9, floor_us, bw / 1e12, floor_tps);
    if (b.info.lm_screen)
        printf("       (a greedy step of 1-%d sequences reads the lm_head's 6-bit screen instead of its bf16 rows: %.3f "
               "GB -> %.1f us = %.0f tok/s; LM_CUDA_LM_SCREEN=0 reads the whole lm_head)\n",
               p.gemv_max_rows, b.info.screen_step_bytes / 1e9, b.info.screen_step_bytes / bw * 1e6, bw / b.info.screen_step_bytes);
    printf("\n");
    b.per = per;
    b.bt = malloc(sizeof(int32_t) * (size_t)p.max_seqs * b.info.bt_width);
    for (int s = 0; s < p.max_seqs; s++)
        for (int j = 0; j < b.info.bt_width; j++)
            b.bt[(size_t)s * b.info.bt_width + j] = j < per ? s * per + j : 0;

    lm_status st = LM_OK;
    printf("| %-22s | %4s | %12s | %21s | %9s | %9s |\n", "test", "B", "t/s (median)", "t/s (min - max)",
           "us/step", "of floor");
    printf("| ---------------------- | ---: | -----------: | --------------------: | --------: | --------: |\n");
    if (tg) {
        double med, lo, hi;
        char name[32];
        snprintf(name, sizeof name, "tg%d", tg);
        if (!(st = bench_tg(&b, tg, reps, &med, &lo, &hi))) row(name, 1, med, lo, hi, floor_tps);
        /* The same step's GPU time alone (graph replays at the last position): the rest is host. */
        double us;
        if (!st && !lm_cuda_qwen3_bench_step(b.m, 1, reps * 4, &us))
            printf("| %-22s | %4d | %12.0f | %21s | %9.1f | %8.0f%% |\n", "  step on the GPU", 1, 1e6 / us,
                   "(graph replays)", us, 100.0 * (1e6 / us) / floor_tps);
    }
    if (pp && !st) {
        int32_t *ids = malloc(sizeof(int32_t) * pp), next;
        for (int i = 0; i < pp; i++) ids[i] = rand_id(cf->vocab);
        double *v = malloc(sizeof(double) * reps);
        for (int r = -1; r < reps && !st; r++) {
            double ts = now_s();
            st = prefill(&b, 1, pp, ids, &next);
            if (r >= 0) v[r] = pp / (now_s() - ts);
        }
        if (!st) {
            double med = median(v, reps);
            char name[32];
            snprintf(name, sizeof name, "pp%d", pp);
            printf("| %-22s | %4d | %12.0f | %21s | %9.1f | %9s |\n", name, 1, med, "", pp * 1e6 / med, "");
        }
        free(ids);
        free(v);
    }
    /* Batched: prefill B x in_len, then out_len decode steps of all B. */
    if (nb && !st) {
        printf("\nbatched (%d in / %d out per sequence): prefill and decode timed apart; total = all tokens "
               "over both times\n",
               in_len, out_len);
        printf("| %4s | %14s | %14s | %14s | %12s | %12s |\n", "B", "prefill t/s", "decode t/s", "total t/s",
               "ms/step", "GPU ms/step");
        printf("| ---: | -------------: | -------------: | -------------: | -----------: | -----------: |\n");
        for (int i = 0; i < nb && !st; i++) {
            const int B = blist[i];
            int32_t *ids = malloc(sizeof(int32_t) * (size_t)B * in_len), *next = malloc(sizeof(int32_t) * B);
            for (long j = 0; j < (long)B * in_len; j++) ids[j] = rand_id(cf->vocab);
            double *vp = malloc(sizeof(double) * reps), *vd = malloc(sizeof(double) * reps);
            double *vt = malloc(sizeof(double) * reps);
            for (int r = -1; r < reps && !st; r++) {
                double ts = now_s();
                st = prefill(&b, B, in_len, ids, next);
                double tp = now_s() - ts;
                if (!st) st = decode(&b, B, in_len, out_len, next);
                double td = now_s() - ts - tp;
                if (r >= 0) {
                    vp[r] = (double)B * in_len / tp;
                    vd[r] = (double)B * out_len / td;
                    vt[r] = (double)B * (in_len + out_len) / (tp + td);
                }
            }
            if (!st) {
                double md = median(vd, reps), us = 0;
                lm_cuda_qwen3_bench_step(b.m, B, reps, &us);
                printf("| %4d | %14.0f | %14.0f | %14.0f | %12.3f | %12.3f |\n", B, median(vp, reps), md,
                       median(vt, reps), B * 1e3 / md, us / 1e3);
                fflush(stdout);
            }
            free(ids), free(next), free(vp), free(vd), free(vt);
        }
    }
    if (micro && !st) {
        static const char *names[] = {"q/k/v + rmsnorm", "o_proj + residual", "gate/up + swiglu",
                                      "down + residual", "lm_head + norm", "attention (fused)", "argmax"};
        printf("\nGEMV kernels (one launch per layer in a graph; median of %d replays)\n", reps * 4);
        printf("| %-26s | %4s | %9s | %9s | %9s | %9s |\n", "kernel", "rows", "MB", "us", "TB/s", "of copy");
        printf("| -------------------------- | ---: | --------: | --------: | --------: | --------: |\n");
        static const int ns[] = {1, 1, 8};
        for (int w = 0; w < 7 && !st; w++)
            for (int k = 0; k < 3 && !st; k++) {
                double us, bytes;
                /* k == 1: the v6 kernel for attention */
                if (k == 1 && w != 5) continue;
                lm_cuda_ctx_set_attn_dec(lm_cuda_qwen3_ctx(b.m), !(k == 1 && w == 5));
                if (w == 5) { /* attention after a decode step of ns[k] sequences at position tg */
                    int32_t next[8] = {1, 2, 3, 4, 5, 6, 7, 8};
                    if ((st = decode(&b, ns[k], 0, tg ? tg : 128, next))) break;
                }
                if ((st = lm_cuda_qwen3_bench_linear(b.m, w, ns[k], reps * 4, &us, &bytes))) break;
                lm_cuda_ctx_set_attn_dec(lm_cuda_qwen3_ctx(b.m), true);
                char nm[40];
                snprintf(nm, sizeof nm, "%s%s", names[w], k == 1 ? " (v6)" : "");
                if (bytes > 0)
                    printf("| %-26s | %4d | %9.2f | %9.2f | %9.3f | %8.0f%% |\n", nm, ns[k], bytes / 1e6, us,
                           bytes / us / 1e6, 100.0 * bytes / (us * 1e-6) / bw);
                else
                    printf("| %-26s | %4d | %9s | %9.2f | %9s | %9s |\n", nm, ns[k], "", us, "", "");
                fflush(stdout);
            }
    }
    if (gemm && !st) {
        static const char *gnames[] = {"q/k/v", "o_proj + residual", "gate/up", "down + residual"};
        const int gks[] = {cf->hidden, cf->n_heads * cf->head_dim, cf->hidden, cf->intermediate}; /* each k */
        const int gms[] = {(cf->n_heads + 2 * cf->n_kv_heads) * cf->head_dim, cf->hidden, 2 * cf->intermediate,
                           cf->hidden}; /* each m */
        struct lm_cuda_ctx *cx = lm_cuda_qwen3_ctx(b.m);
        const bool wg0 = lm_cuda_ctx_gemm_wgmma(cx); /* restored after each row (LM_CUDA_GEMM_WGMMA) */
        printf("\nbatched-path GEMMs (one launch per layer in a graph; median of %d replays; splits 0: the plan)\n",
               reps * 4);
        printf("| %-18s | %4s | %-8s | %9s | %9s | %9s | %15s |\n", "matrix", "rows", "kernel", "us", "TB/s", "of copy",
               "clusters/fit/rows");
        printf("| ------------------ | ---: | -------- | --------: | --------: | --------: | --------------: |\n");
        for (int w = 0; w < 4 && !st; w++)
            for (int i = 0; i < ngn && !st; i++)
                /* cuBLAS (s -1), then the kernel with the plan's splits (0) and each split count,
                 * its products on wgmma and on mma.sync. */
                for (int si = 0; si < 6 && !st; si++)
                    for (int wg = 1; wg >= (si ? 0 : 1) && !st; wg--) {
                        const int s = (const int[]){-1, 0, 1, 2, 4, 8}[si];
                        if (s > 0 && !lm_cuda_gemm_tc_fits(cx, gks[w], s)) continue;
                        double us, bytes;
                        lm_cuda_ctx_set_gemm_tc(cx, s < 0 ? 0 : 64, s < 0 ? 0 : s);
                        lm_cuda_ctx_set_gemm_wgmma(cx, wg);
                        st = lm_cuda_qwen3_bench_linear(b.m, 7 + w, gn[i], reps * 4, &us, &bytes);
                        /* The launch's clusters (tiles of bm rows) against how many fit at once, and bm. */
                        char kn[16] = "cuBLAS", cl[32] = "-";
                        const int sp = s > 0 ? s : lm_cuda_gemm_tc_splits(cx, gks[w], gms[w]);
                        if (s >= 0 && sp > 0) {
                            const int bm = lm_cuda_gemm_tc_rows_per_block(cx, gks[w], gms[w], sp, gn[i]);
                            snprintf(kn, sizeof kn, "%s s=%d", wg ? "wg" : "mma", s);
                            snprintf(cl, sizeof cl, "%d / %d of %d", (gms[w] + bm - 1) / bm,
                                     lm_cuda_gemm_tc_max_clusters(cx, gks[w], sp, bm, gn[i]), bm);
                        }
                        lm_cuda_ctx_set_gemm_wgmma(cx, wg0);
                        if (st) break;
                        printf("| %-18s | %4d | %-8s | %9.2f | %9.3f | %8.0f%% | %15s |\n", gnames[w], gn[i], kn,
                               us, bytes / us / 1e6, 100.0 * bytes / (us * 1e-6) / bw, cl);
                        fflush(stdout);
                    }
        lm_cuda_ctx_set_gemm_tc(cx, lm_cuda_gemm_tc_default_rows(), 0);
    }
    if (trace && !st && tg) st = trace_step(&b, 1, tg < 16 ? tg : 16, 0, "batch-1 decode");
    for (int i = 0; i < ntb && !st; i++) {
        char nm[48];
        snprintf(nm, sizeof nm, "decode of %d sequences", tbl[i]);
        st = trace_step(&b, tbl[i], 4, in_len < 64 ? in_len : 64, nm);
    }
    if (variants && !st && tg) {
        printf("\nvariants of tg%d (batch 1) and of batch 8\n", tg);
        printf("| %-34s | %12s | %9s | %9s |\n", "variant", "t/s (median)", "us/step", "of floor");
        printf("| ---------------------------------- | -----------: | --------: | --------: |\n");
        struct {
            const char *name;
            bool graphs, pdl;
            int rows;
            bool v6attn;
            bool bf16;  /* with --q8: the GEMV ignores the quants (reads the bf16 copy) */
            bool mlp2;  /* the MLP as two GEMV launches, not lm_cuda_mlp1 */
            bool gemv;  /* the GEMV even where decode would take the tensor-core GEMM (tc_decode) */
        } vs[] = {{"graphs + PDL (default)", true, true, 0, false, false, false, false},
                  {"GEMV, graphs + PDL", true, true, 0, false, false, false, true},
                  {"GEMV, v6 decode attention", true, true, 0, true, false, false, true},
                  {"GEMV, graphs, no PDL", true, false, 0, false, false, false, true},
                  {"GEMV, no graphs, PDL", false, true, 0, false, false, false, true},
                  {"GEMV, no graphs, no PDL", false, false, 0, false, false, false, true},
                  {"GEMV, 1 row/warp", true, true, 1, false, false, false, true},
                  {"GEMV, 2 rows/warp", true, true, 2, false, false, false, true},
                  {"GEMV, MLP as two GEMVs", true, true, 0, false, false, true, true},
                  {"GEMV, bf16 (no quants)", true, true, 0, false, true, false, true},
                  {"graphs + PDL (default, again)", true, true, 0, false, false, false, false}};
        for (size_t i = 0; i < sizeof vs / sizeof vs[0] && !st; i++) {
            if (vs[i].bf16 && !q8) continue;
            lm_cuda_qwen3_set_tc_decode(b.m, !vs[i].gemv);
            lm_cuda_qwen3_set_options(b.m, vs[i].graphs, vs[i].pdl, 8);
            lm_cuda_qwen3_set_q8(b.m, !vs[i].bf16);
            lm_cuda_qwen3_set_mlp1(b.m, !vs[i].mlp2 && lm_cuda_qwen3_default_params().mlp1);
            lm_cuda_ctx_set_gemv_rows(lm_cuda_qwen3_ctx(b.m), vs[i].rows);
            lm_cuda_ctx_set_attn_dec(lm_cuda_qwen3_ctx(b.m), !vs[i].v6attn);
            double med, lo, hi;
            if ((st = bench_tg(&b, tg, reps, &med, &lo, &hi))) break;
            printf("| %-34s | %12.0f | %9.1f | %8.0f%% |\n", vs[i].name, med, 1e6 / med, 100 * med / floor_tps);
            fflush(stdout);
        }
        lm_cuda_ctx_set_gemv_rows(lm_cuda_qwen3_ctx(b.m), 0);
        lm_cuda_ctx_set_attn_dec(lm_cuda_qwen3_ctx(b.m), true);
        lm_cuda_qwen3_set_q8(b.m, true);
        lm_cuda_qwen3_set_mlp1(b.m, lm_cuda_qwen3_default_params().mlp1);
        /* Small batches: GEMV (float32 activations) against the batched path (bf16 activations:
         * the tensor-core GEMM up to 64 rows, cuBLAS above). */
        lm_cuda_qwen3_set_tc_decode(b.m, false);
        static const int smallb[] = {2, 3, 4, 8};
        for (int k = 0; k < 4 && !st; k++)
            for (int g = 0; g < 2 && !st; g++) {
                const int B = smallb[k];
                if (B > maxb) break;
                lm_cuda_qwen3_set_options(b.m, true, true, g ? 0 : 8);
                double *v = malloc(sizeof(double) * reps);
                int32_t next[8];
                for (int r = -1; r < reps && !st; r++) {
                    for (int j = 0; j < B; j++) next[j] = 1000 + j;
                    double ts = now_s();
                    st = decode(&b, B, 0, tg, next);
                    if (r >= 0) v[r] = (double)B * tg / (now_s() - ts);
                }
                if (!st) {
                    char name[64];
                    snprintf(name, sizeof name, "batch %d, %s", B, g ? "batched path" : "GEMV path");
                    double med = median(v, reps);
                    printf("| %-34s | %12.0f | %9.1f | %9s |\n", name, med, B * 1e6 / med, "");
                    fflush(stdout);
                }
                free(v);
            }
        lm_cuda_qwen3_set_options(b.m, true, true, 8);
        lm_cuda_qwen3_set_tc_decode(b.m, true);
    }
    int rc = st ? lm_cmd_fail("cudabench", NULL) : 0;
    if (!rc)
        printf("\n%d repetitions after one warm-up; greedy; host time per step included; batch-1 floor %.0f tok/s\n",
               reps, floor_tps);
    free(b.bt);
    lm_cuda_qwen3_destroy(b.m);
    return rc;
}
#endif
