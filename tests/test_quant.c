/* test_quant.c: Q8_0 weights (backend/cpu/quant.h) and their matmul.
 *   - quantization: ggml's rounding (halves away from zero), zero blocks, the float16 scale,
 *     the reconstruction bound; dequantization is exact;
 *   - the fast Q8_0 matmul of every vector target this build holds and this CPU runs
 *     (lm_cpu_ops_targets) against the scalar reference at odd sizes (every path: streaming
 *     tiles for n < 24, float32 panels from n = 24), 1 and 2 threads: the same bits; and its
 *     batch invariance (rows of n = 2..30 equal n = 1 bit for bit), also for f16/bf16/f32
 *     weights, row-major and packed;
 *   - the tiny model with Q8_0 weights (a GGUF written by lm_bundle_build) against the same
 *     model in bf16: top-1 agreement and mean KL divergence over every position of the
 *     reference prompts, and fast vs scalar kernels on the Q8_0 model.
 * The matmul tests and the model run under both Q8_0 paths (ops.h, lm_q8_0_path): weights
 * dequantized (the accuracy cost of the weights alone) and int8 (activations quantized too).
 * LM_LINK: lm_family lm_format lm_text lm_backend lm_base
 * LM_LABEL: model */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cpu/ops.h"
#include "backend/cpu/quant.h"
#include "check.h"
#include "family/bundle.h"
#include "family/model.h"

#define TEST_RNG_SEED 0x2545f4914f6cdd1dull
#include "fixtures.h"

static void test_quantize(void) {
    struct lm_block_q8_0 b[3];
    float x[96], y[96];
    /* Block 0: amax 127 makes d = 1 and id = 1 exactly: ties round away from zero. */
    for (int i = 0; i < 32; i++) x[i] = 0;
    x[0] = 127, x[1] = 2.5f, x[2] = -2.5f, x[3] = 0.5f, x[4] = -0.5f, x[5] = 1.49f, x[6] = -127;
    /* Block 1: all zeros. Block 2: random. */
    for (int i = 32; i < 64; i++) x[i] = 0;
    for (int i = 64; i < 96; i++) x[i] = frand() * 3.0f;
    lm_q8_0_quantize_row(x, b, 96);
    CHECK(lm_f16_to_f32(b[0].d) == 1.0f, "d of a block with amax 127: %g", lm_f16_to_f32(b[0].d));
    CHECK(b[0].qs[0] == 127 && b[0].qs[1] == 3 && b[0].qs[2] == -3 && b[0].qs[3] == 1 &&
              b[0].qs[4] == -1 && b[0].qs[5] == 1 && b[0].qs[6] == -127,
          "roundf ties away from zero: %d %d %d %d %d %d %d", b[0].qs[0], b[0].qs[1], b[0].qs[2],
          b[0].qs[3], b[0].qs[4], b[0].qs[5], b[0].qs[6]);
    int nz = 0;
    for (int i = 0; i < 32; i++) nz += b[1].qs[i] != 0;
    CHECK(b[1].d == 0 && nz == 0, "zero block: d %u, %d nonzero quants", b[1].d, nz);
    /* Block 2: the largest magnitude maps to +-127; reconstruction within half a step of the
     * float32 scale plus the float16 rounding of the scale. */
    float amax = 0;
    int imax = 64;
    for (int i = 64; i < 96; i++)
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]), imax = i;
    CHECK(abs(b[2].qs[imax - 64]) == 127, "amax element quantizes to +-127 (%d)", b[2].qs[imax - 64]);
    lm_q8_0_dequantize_row(b, y, 96);
    float d32 = amax / 127.0f, d16 = lm_f16_to_f32(b[2].d);
    CHECK(fabsf(d16 - d32) <= d32 * 0x1p-11f, "scale %g rounded to float16 %g", d32, d16);
    double worst = 0;
    for (int i = 64; i < 96; i++) {
        CHECK(y[i] == d16 * (float)b[2].qs[i - 64], "dequantized value is d * q exactly");
        worst = fmax(worst, fabs(y[i] - x[i]));
    }
    CHECK(worst <= 0.5 * d32 * 1.0001 + 127 * fabs(d16 - d32), "reconstruction error %g, step %g", worst, d32);
    for (int i = 0; i < 32; i++) CHECK(y[i] == (float)b[0].qs[i], "block 0 dequantized");
    /* convert_row: fast and scalar agree bit for bit. */
    float a1[96], a2[96];
    lm_cpu_ops_fast()->convert_row(a1, b, LM_DTYPE_Q8_0, 96);
    lm_cpu_ops_scalar()->convert_row(a2, b, LM_DTYPE_Q8_0, 96);
    CHECK(memcmp(a1, a2, sizeof a1) == 0 && memcmp(a1, y, sizeof a1) == 0, "convert_row q8_0");
    CHECK(lm_dtype_row_bytes(LM_DTYPE_Q8_0, 1024) == 32 * 34, "row bytes");
    CHECK(!strcmp(lm_dtype_name(LM_DTYPE_Q8_0), "q8_0"), "name");
}

/* Fast vs scalar at odd sizes, for Q8_0 (and the f16/bf16 panel path at odd k). */
static void test_matmul(struct lm_pool *pool, const struct lm_cpu_ops *f) {
    const struct lm_cpu_ops *s = lm_cpu_ops_scalar();
    const int ks[] = {32, 96, 160, 1024, 2080}, ms[] = {1, 5, 33, 129, 300};
    const int ns[] = {1, 2, 3, 4, 5, 17, 100};
    double worst = 0;
    for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++)
        for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++)
            for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
                int k = ks[ki], m = ms[mi], n = ns[ni];
                float *x = malloc(sizeof(float) * n * k), *wf = malloc(sizeof(float) * m * k);
                float *y1 = malloc(sizeof(float) * n * m), *y2 = malloc(sizeof(float) * n * m);
                struct lm_block_q8_0 *w = malloc(sizeof *w * (size_t)m * (k / 32));
                for (long i = 0; i < (long)n * k; i++) x[i] = frand() * 2;
                for (long i = 0; i < (long)m * k; i++) wf[i] = frand() * 0.1f;
                for (int r = 0; r < m; r++) lm_q8_0_quantize_row(wf + (long)r * k, w + (long)r * (k / 32), k);
                void *wp = malloc(lm_cpu_packed_bytes(LM_DTYPE_Q8_0, m, k));
                lm_cpu_pack(wp, w, LM_DTYPE_Q8_0, m, k);
                s->matmul(NULL, y1, x, w, LM_DTYPE_Q8_0, n, k, m);
                for (int packed = 0; packed < 2; packed++) {
                    memset(y2, 0xff, sizeof(float) * n * m);
                    f->matmul(pool, y2, x, packed ? wp : w, packed ? LM_DTYPE_Q8_0_P16 : LM_DTYPE_Q8_0, n, k, m);
                    double e = rel_err(y2, y1, (long)n * m);
                    worst = fmax(worst, e);
                    CHECK(e <= 1e-5, "q8_0 matmul k=%d m=%d n=%d: rel err %g", k, m, n, e);
                    /* Both compute the same chain (ops.h): the same bits. */
                    CHECK(memcmp(y1, y2, sizeof(float) * n * m) == 0,
                          "q8_0 %s %s%s k=%d m=%d n=%d: fast != scalar bits", f->name,
                          lm_q8_0_path_name(lm_cpu_q8_0_path()), packed ? " packed" : "", k, m, n);
                }
                free(x), free(wf), free(y1), free(y2), free(w), free(wp);
            }
    fprintf(stderr, "q8_0 matmul (%s, %s path, %d threads): max rel err vs scalar %.3g\n", f->name,
            lm_q8_0_path_name(lm_cpu_q8_0_path()), lm_pool_size(pool), worst);
}

/* Rows of a batch equal the same rows alone, bit for bit, up to n = 30 (past the panel
 * threshold LM_MM_PANEL_MIN), for Q8_0 and F16 weights, row-major and packed (F32/BF16
 * row-major are in test_batch). */
static void test_invariance(struct lm_pool *pool, const struct lm_cpu_ops *f) {
    const int shapes[][2] = {{32, 96}, {64, 7}, {96, 33}, {1024, 64}, {160, 5}};
    enum { NMAX = 30 };
    for (size_t c = 0; c < sizeof shapes / sizeof *shapes; c++) {
        int k = shapes[c][0], m = shapes[c][1];
        float *x = malloc(sizeof(float) * NMAX * k), *wf = malloc(sizeof(float) * m * k);
        struct lm_block_q8_0 *wq = malloc(sizeof *wq * (size_t)m * (k / 32));
        uint16_t *wh = malloc(sizeof(uint16_t) * (size_t)m * k), *wb = malloc(sizeof(uint16_t) * (size_t)m * k);
        for (int i = 0; i < NMAX * k; i++) x[i] = frand();
        for (int i = 0; i < m * k; i++) wf[i] = frand(), wh[i] = lm_f32_to_f16(wf[i]), wb[i] = lm_f32_to_bf16(wf[i]);
        for (int r = 0; r < m; r++) lm_q8_0_quantize_row(wf + (long)r * k, wq + (long)r * (k / 32), k);
        float *alone = malloc(sizeof(float) * NMAX * m), *batch = malloc(sizeof(float) * NMAX * m);
        const enum lm_dtype dts[] = {LM_DTYPE_Q8_0, LM_DTYPE_F16, LM_DTYPE_BF16, LM_DTYPE_F32};
        for (int dt = 0; dt < 4; dt++)
            for (int packed = 0; packed < 2; packed++) {
                enum lm_dtype t = dts[dt];
                const void *w = t == LM_DTYPE_Q8_0 ? (const void *)wq : t == LM_DTYPE_F16 ? (const void *)wh
                                : t == LM_DTYPE_BF16 ? (const void *)wb : (const void *)wf;
                void *wp = NULL;
                if (packed) {
                    wp = malloc(lm_cpu_packed_bytes(t, m, k));
                    lm_cpu_pack(wp, w, t, m, k);
                    w = wp;
                    t = lm_dtype_packed(t);
                }
                for (int i = 0; i < NMAX; i++) f->matmul(pool, alone + (size_t)i * m, x + (size_t)i * k, w, t, 1, k, m);
                int bad = 0;
                for (int n = 2; n <= NMAX; n++) {
                    f->matmul(pool, batch, x, w, t, n, k, m);
                    if (memcmp(batch, alone, sizeof(float) * n * m)) bad = n;
                }
                CHECK(bad == 0, "%s matmul k=%d m=%d %s%s: rows of n=%d differ from n=1", f->name, k, m,
                      lm_dtype_name(t), packed ? " packed" : "", bad);
                /* Packed and row-major weights give the same bits. */
                if (packed) {
                    float *rm = malloc(sizeof(float) * NMAX * m);
                    f->matmul(pool, rm, x, dt == 0 ? (const void *)wq : dt == 1 ? (const void *)wh
                                                   : dt == 2 ? (const void *)wb : (const void *)wf,
                              dts[dt], NMAX, k, m);
                    CHECK(!memcmp(rm, batch, sizeof(float) * NMAX * m), "%s: packed vs row-major differ",
                          lm_dtype_name(t));
                    free(rm);
                }
                free(wp);
            }
        free(x), free(wf), free(wq), free(wh), free(wb), free(alone), free(batch);
    }
}

/* ---- the tiny model at Q8_0 ---- */

/* Stated tolerances of the tiny model at Q8_0 against bf16, per path (measured: dequant 0.972,
 * mean KL 1.35e-3, max 7.2e-3; int8 0.954, mean KL 2.27e-3, max 9.0e-3 nats). */
static const struct {
    double top1_min, mean_kl_max;
} k_tolerance[2] = {
    [LM_Q8_0_DEQUANT] = {0.95, 2.5e-3},
    [LM_Q8_0_INT8] = {0.93, 3.5e-3},
};

static void test_tiny_model(enum lm_q8_0_path qpath) {
    lm_cpu_set_q8_0_path(qpath);
    char path[] = "/tmp/lumen_test_quant_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd < 0) return;
    close(fd);
    struct lm_bundle_build_params bp = {LM_DTYPE_Q8_0, NULL};
    lm_status rc = lm_bundle_build(TINY_MODEL, path, &bp, NULL);
    CHECK(rc == LM_OK, "build q8_0: %s", lm_error_message());
    struct lm_model *mb = NULL, *mq = NULL, *ms = NULL;
    struct lm_model_open_params p = lm_model_default_open_params(), ps = p;
    ps.scalar_kernels = true;
    ps.n_threads = 1;
    CHECK(lm_model_open(TINY_MODEL, &p, &mb) == LM_OK, "open bf16: %s", lm_error_message());
    CHECK(lm_model_open(path, &p, &mq) == LM_OK, "open q8_0: %s", lm_error_message());
    CHECK(lm_model_open(path, &ps, &ms) == LM_OK, "open q8_0 scalar: %s", lm_error_message());
    if (mb && mq && ms) {
        struct lm_model_info info;
        lm_model_info(mq, &info);
        CHECK(!strcmp(info.weight_dtype, "q8_0"), "weight dtype %s", info.weight_dtype);
        struct ref_case *cases;
        int np = ref_cases_load(&cases);
        CHECK(np == 10, "%d prompts", np);
        const int vocab = lm_model_config(mb)->vocab_size;
        long pos = 0, agree = 0;
        double kl_sum = 0, kl_max = 0, worst_scalar = 0;
        enum { PIECE = 64 };
        float *a = malloc(sizeof(float) * PIECE * vocab), *b = malloc(sizeof(float) * PIECE * vocab);
        for (int c = 0; c < np; c++) {
            const struct lm_ids *ids = &cases[c].prompt;
            struct lm_seq *sa, *sb;
            CHECK(lm_seq_create(mb, (int)ids->n, &sa) == LM_OK && lm_seq_create(mq, (int)ids->n, &sb) == LM_OK,
                  "seq: %s", lm_error_message());
            for (int done = 0; done < (int)ids->n; done += PIECE) {
                int k = (int)ids->n - done < PIECE ? (int)ids->n - done : PIECE;
                CHECK(lm_seq_forward(sa, ids->v + done, k, a, true) == LM_OK &&
                          lm_seq_forward(sb, ids->v + done, k, b, true) == LM_OK,
                      "forward: %s", lm_error_message());
                for (int i = 0; i < k; i++) {
                    const float *ra = a + (size_t)i * vocab, *rb = b + (size_t)i * vocab;
                    agree += argmax(ra, vocab) == argmax(rb, vocab);
                    double kv = kl(ra, rb, vocab);
                    kl_sum += kv;
                    kl_max = fmax(kl_max, kv);
                    pos++;
                }
            }
            lm_seq_destroy(sa);
            lm_seq_destroy(sb);
            if (ids->n <= 100) { /* the scalar kernels are slow: short prompts only */
                float *f = last_logits(mq, ids), *sc = last_logits(ms, ids);
                double e = rel_err(f, sc, vocab);
                worst_scalar = fmax(worst_scalar, e);
                CHECK(e <= 1e-4, "q8_0 fast vs scalar kernels: %g", e);
                free(f), free(sc);
            }
        }
        free(a), free(b);
        ref_cases_free(cases, np);
        double top1 = (double)agree / (double)pos, mean_kl = kl_sum / (double)pos;
        fprintf(stderr,
                "tiny model q8_0 (%s path) vs bf16 over %ld positions: top-1 agreement %.4f, mean KL "
                "%.3g nats (max %.3g); q8_0 fast vs scalar kernels %.3g\n",
                lm_q8_0_path_name(qpath), pos, top1, mean_kl, kl_max, worst_scalar);
        CHECK(top1 >= k_tolerance[qpath].top1_min, "%s path: top-1 agreement %.4f", lm_q8_0_path_name(qpath), top1);
        CHECK(mean_kl <= k_tolerance[qpath].mean_kl_max, "%s path: mean KL %.3g", lm_q8_0_path_name(qpath), mean_kl);
    }
    lm_model_close(mb);
    lm_model_close(mq);
    lm_model_close(ms);
    unlink(path);
}

int main(void) {
    test_quantize();
    struct lm_pool *pool;
    for (const char *const *name = lm_cpu_ops_targets(); *name; name++) {
        const struct lm_cpu_ops *f = lm_cpu_ops_target(*name);
        if (!f) {
            fprintf(stderr, "q8_0 matmul: target %s not runnable on this CPU\n", *name);
            continue;
        }
        for (int t = 1; t <= 2; t++) {
            lm_pool_create(t, &pool);
            for (int path = LM_Q8_0_DEQUANT; path <= LM_Q8_0_INT8; path++) {
                lm_cpu_set_q8_0_path((enum lm_q8_0_path)path);
                test_matmul(pool, f);
                test_invariance(pool, f);
            }
            lm_pool_destroy(pool);
        }
    }
    test_tiny_model(LM_Q8_0_DEQUANT);
    test_tiny_model(LM_Q8_0_INT8);
    return check_exit("test_quant");
}
