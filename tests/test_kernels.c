/* test_kernels.c: the CPU kernels (backend/cpu/ops.h) and the thread pool.
 * The fast kernels of every vector target this build holds and this CPU runs (avx512bf16,
 * avx512vnni, avx512, avx2, generic or neon: lm_cpu_ops_targets) are checked against the scalar
 * references on random
 * inputs at odd sizes, with 1, 2 and 3 threads; the matmul must give the reference's bits
 * (one fma chain per output, ops.h), on row-major and packed weights. The scalar references are
 * checked against float64 math and known values. The targets that ran are printed, and the run
 * chooses the same one lm_cpu_ops_fast() does. The int8 path of Q8_0 weights (ops.h,
 * LM_Q8_0_INT8): the activation quantizer and the matmul give the reference's bits at odd sizes
 * (k a multiple of 32, odd m and n, every tile shape), row-major and packed. The bf16 path of
 * bfloat16 weights (ops.h, LM_BF16_ACT) likewise, on every target.
 * LM_LINK: lm_backend lm_base */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/quant.h"
#include "base/threadpool.h"
#include "check.h"

#define TEST_RNG_SEED 0x9e3779b97f4a7c15ull
#include "fixtures.h"

/* Weights of dtype t holding values w (rounded to t); `wf` receives the exact widened values. */
static void *make_weights(enum lm_dtype t, const float *w, long n, float *wf) {
    void *p = malloc((size_t)n * lm_dtype_size(t));
    for (long i = 0; i < n; i++) {
        if (t == LM_DTYPE_F32) ((float *)p)[i] = w[i], wf[i] = w[i];
        if (t == LM_DTYPE_BF16)
            ((uint16_t *)p)[i] = lm_f32_to_bf16(w[i]), wf[i] = lm_bf16_to_f32(((uint16_t *)p)[i]);
        if (t == LM_DTYPE_F16)
            ((uint16_t *)p)[i] = lm_f32_to_f16(w[i]), wf[i] = lm_f16_to_f32(((uint16_t *)p)[i]);
    }
    return p;
}

static void test_conversions(const struct lm_cpu_ops *f) {
    /* binary16 -> float32 -> binary16 is the identity for every non-NaN value. */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = lm_f16_to_f32((uint16_t)h);
        if (isnan(f)) {
            bad += ((h >> 10) & 0x1f) != 0x1f || !(h & 0x3ff);
            continue;
        }
        bad += lm_f32_to_f16(f) != h;
    }
    CHECK(bad == 0, "%d binary16 values do not round-trip", bad);
    CHECK(lm_f16_to_f32(0x3c00) == 1.0f, "f16 1.0");
    CHECK(lm_f16_to_f32(0xc000) == -2.0f, "f16 -2.0");
    CHECK(lm_f16_to_f32(0x0001) == ldexpf(1, -24), "smallest f16 subnormal");
    CHECK(lm_f16_to_f32(0x7bff) == 65504.0f, "largest f16");
    CHECK(lm_f32_to_f16(65520.0f) == 0x7c00, "65520 rounds to inf");
    CHECK(lm_f32_to_f16(ldexpf(1, -25)) == 0, "2^-25 ties to even zero");
    CHECK(lm_f32_to_f16(ldexpf(1.5f, -25)) == 1, "1.5 * 2^-25 rounds up");
    CHECK(lm_f32_to_f16(1.0f + ldexpf(1, -11)) == 0x3c00, "tie to even (down)");
    CHECK(lm_f32_to_f16(1.0f + ldexpf(3, -11)) == 0x3c02, "tie to even (up)");
    CHECK(lm_bf16_to_f32(0x3f80) == 1.0f, "bf16 1.0");
    CHECK(lm_f32_to_bf16(1.0f) == 0x3f80, "bf16 of 1.0");
    CHECK(lm_f32_to_bf16(1.0f + ldexpf(1, -8)) == 0x3f80, "bf16 tie to even (down)");
    CHECK(lm_f32_to_bf16(1.0f + ldexpf(3, -8)) == 0x3f82, "bf16 tie to even (up)");
    CHECK(lm_f32_to_bf16(-3.0f) == 0xc040, "bf16 of -3");
    CHECK(isnan(lm_bf16_to_f32(lm_f32_to_bf16(NAN))), "bf16 NaN stays NaN");
    /* The bf16 path's activation rounding (VCVTNE2PS2BF16's: subnormals to a signed zero). */
    CHECK(lm_f32_to_bf16_act(1.0f + ldexpf(3, -8)) == 0x3f82, "bf16 act: ties to even");
    CHECK(lm_f32_to_bf16_act(ldexpf(1, -130)) == 0x0000, "bf16 act: a subnormal is +0");
    CHECK(lm_f32_to_bf16_act(-ldexpf(1, -130)) == 0x8000, "bf16 act: a negative subnormal is -0");
    CHECK(lm_f32_to_bf16_act(ldexpf(1, -126)) == 0x0080, "bf16 act: the smallest normal stays");
    CHECK(isnan(lm_bf16_to_f32(lm_f32_to_bf16_act(NAN))), "bf16 act: NaN stays NaN");
    /* The fast row conversion agrees bit for bit. */
    const struct lm_cpu_ops *s = lm_cpu_ops_scalar();
    uint16_t h[67];
    float a[67], b[67];
    for (int i = 0; i < 67; i++) h[i] = (uint16_t)(i * 977 + 13);
    for (int t = 1; t <= 2; t++) {
        f->convert_row(a, h, (enum lm_dtype)t, 67);
        s->convert_row(b, h, (enum lm_dtype)t, 67);
        CHECK(memcmp(a, b, sizeof a) == 0, "convert_row %s differs", lm_dtype_name((enum lm_dtype)t));
    }
}

/* The matmul of every weight dtype against the scalar reference, on path `bf16` (ops.h,
 * lm_cpu_bf16_path): LM_BF16_F32 checks f32, bf16 and f16 weights on the float32 chain,
 * LM_BF16_ACT bf16 weights on the bf16 path's pair chain (odd k: the last column alone). Each
 * case: the reference against float64 over the widened weights and the activations the path
 * uses (rounded to bf16 on LM_BF16_ACT), then the fast kernels' bits against the reference's
 * (every tile shape and the panels), row-major and packed. */
static void test_matmul(struct lm_pool *pool, const struct lm_cpu_ops *f, enum lm_bf16_path bf16) {
    const struct lm_cpu_ops *s = lm_cpu_ops_scalar();
    const enum lm_bf16_path saved = lm_cpu_bf16_path();
    lm_cpu_set_bf16_path(bf16);
    const bool act = bf16 == LM_BF16_ACT;
    const int ks[] = {37, 8, 1, 16, 64, 130, 131, 1000}, ms[] = {129, 5, 64, 300};
    const int ns[] = {1, 3, 17, 2, 4, 7, 24, 100};
    double worst = 0;
    for (int dt = act ? LM_DTYPE_BF16 : 0; dt < (act ? LM_DTYPE_BF16 + 1 : 3); dt++)
        for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++)
            for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++)
                for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
                    int k = ks[ki], m = ms[mi], n = ns[ni];
                    const char *what = act ? "bf16 act" : lm_dtype_name((enum lm_dtype)dt);
                    float *x = malloc(sizeof(float) * n * k), *w = malloc(sizeof(float) * m * k);
                    float *wf = malloc(sizeof(float) * m * k);
                    float *y1 = malloc(sizeof(float) * n * m), *y2 = malloc(sizeof(float) * n * m);
                    fill(x, (long)n * k, 2.0f);
                    fill(w, (long)m * k, 0.5f);
                    void *wt = make_weights((enum lm_dtype)dt, w, (long)m * k, wf);
                    s->matmul(NULL, y1, x, wt, (enum lm_dtype)dt, n, k, m);
                    memset(y2, 0xff, sizeof(float) * n * m);
                    f->matmul(pool, y2, x, wt, (enum lm_dtype)dt, n, k, m);
                    /* The reference against float64 on the widened weights. */
                    double e64 = 0, mx = 0;
                    for (int i = 0; i < n; i++)
                        for (int j = 0; j < m; j++) {
                            double acc = 0;
                            for (int l = 0; l < k; l++) {
                                const float xl = x[i * k + l];
                                const float xv = act ? lm_bf16_to_f32(lm_f32_to_bf16_act(xl)) : xl;
                                acc += (double)xv * wf[j * k + l];
                            }
                            e64 = fmax(e64, fabs(acc - y1[i * m + j]));
                            mx = fmax(mx, fabs(acc));
                        }
                    CHECK(e64 <= 1e-5 * mx, "scalar %s vs float64: %g (max %g) k=%d m=%d n=%d", what, e64,
                          mx, k, m, n);
                    double e = rel_err(y2, y1, (long)n * m);
                    worst = fmax(worst, e);
                    /* The same chain as the reference: the same bits. */
                    CHECK(!memcmp(y1, y2, sizeof(float) * n * m), "matmul %s %s k=%d m=%d n=%d: not the "
                          "reference's bits (rel err %g)", f->name, what, k, m, n, e);
                    /* Packed weights (the layout weights read into memory get): the same bits. */
                    enum lm_dtype pt = lm_dtype_packed((enum lm_dtype)dt);
                    void *wp = malloc(lm_cpu_packed_bytes((enum lm_dtype)dt, m, k));
                    lm_cpu_pack(wp, wt, (enum lm_dtype)dt, m, k);
                    for (int j = 0; j < m; j += 7) /* element access through the packed layout */
                        CHECK(lm_cpu_weight(wp, pt, k, j, k - 1) == wf[(long)j * k + k - 1],
                              "packed %s element (%d, %d)", lm_dtype_name(pt), j, k - 1);
                    memset(y2, 0xff, sizeof(float) * n * m);
                    f->matmul(pool, y2, x, wp, pt, n, k, m);
                    CHECK(!memcmp(y1, y2, sizeof(float) * n * m), "matmul %s packed %s k=%d m=%d n=%d: not "
                          "the reference's bits (rel err %g)", f->name, what, k, m, n,
                          rel_err(y2, y1, (long)n * m));
                    free(x), free(w), free(wf), free(y1), free(y2), free(wt), free(wp);
                }
    fprintf(stderr, "matmul %s(%s, %d threads): max rel err %.3g\n", act ? "bf16 act " : "",
            f->name, lm_pool_size(pool), worst);
    lm_cpu_set_bf16_path(saved);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
/* One VDPBF16PS lane: acc + the pair (w0, w1) . (x0, x1). */
__attribute__((target("avx512f,avx512bf16"))) static float dpbf16_lane(float acc, float w0, float w1, float x0,
                                                                        float x1) {
    uint32_t wv = (uint32_t)lm_f32_to_bf16(w1) << 16 | lm_f32_to_bf16(w0);
    uint32_t xv = (uint32_t)lm_f32_to_bf16(x1) << 16 | lm_f32_to_bf16(x0);
    __m512 r = _mm512_dpbf16_ps(_mm512_set1_ps(acc), (__m512bh)_mm512_set1_epi32((int)wv),
                                (__m512bh)_mm512_set1_epi32((int)xv));
    return _mm512_cvtss_f32(r);
}
/* What the avx512bf16 target assumes of the instruction (ops.h, LM_BF16_ACT): two roundings, the
 * odd product first. 1 + 2^-24 + 2^-24 gives 1 that way (1 + 2^-23 with one rounding of the
 * sum); 1 + 2^-24 (odd) + 1.5 * 2^-24 (even) gives 1 + 2^-23 (1 + 2^-22 with the even first). */
static void test_dpbf16_semantics(const struct lm_cpu_ops *f) {
    if (strcmp(f->name, "avx512bf16")) return;
    const float u = ldexpf(1, -24);
    float a = dpbf16_lane(1.0f, 1.0f, 1.0f, u, u), b = dpbf16_lane(1.0f, 1.5f, 1.0f, u, u);
    CHECK(a == 1.0f, "VDPBF16PS: 1 + 2^-24 + 2^-24 = %.9g (1: two roundings; 1 + 2^-23: one)", a);
    CHECK(b == 1.0f + ldexpf(1, -23), "VDPBF16PS: odd product first: got 1 + %.3g * 2^-23 (1: odd first, 2: even first)",
          (b - 1.0f) / ldexpf(1, -23));
}
#else
static void test_dpbf16_semantics(const struct lm_cpu_ops *f) { (void)f; }
#endif

/* The int8 Q8_0 path: quantizer and matmul against the scalar references, bit for bit. */
static void test_q8_0_int8(struct lm_pool *pool, const struct lm_cpu_ops *f) {
    const struct lm_cpu_ops *s = lm_cpu_ops_scalar();
    const enum lm_q8_0_path saved = lm_cpu_q8_0_path();
    lm_cpu_set_q8_0_path(LM_Q8_0_INT8);
    /* Quantizer: known values (ties away from zero at d = 1 and d = 2, a zero block), then
     * random blocks: the same bits as the reference. */
    enum { NQ = 32 * 37 };
    float x[NQ], d1[NQ / 32], d2[NQ / 32];
    int8_t q1[NQ], q2[NQ];
    fill(x, NQ, 3.0f);
    for (int i = 0; i < 64; i++) x[i] = 0;
    x[0] = 127, x[1] = 2.5f, x[2] = -2.5f, x[3] = 0.5f, x[4] = -0.5f, x[5] = 1.49f, x[6] = -126.5f;
    x[32] = -254, x[33] = 5, x[34] = -5, x[35] = 3; /* d = 2: 2.5 -> 3, -2.5 -> -3, 1.5 -> 2 */
    for (int i = 64; i < 96; i++) x[i] = 0;
    s->quantize_q8_0_act(x, q1, d1, NQ);
    f->quantize_q8_0_act(x, q2, d2, NQ);
    CHECK(d1[0] == 1.0f && q1[0] == 127 && q1[1] == 3 && q1[2] == -3 && q1[3] == 1 && q1[4] == -1 &&
              q1[5] == 1 && q1[6] == -127,
          "activation quants, d = 1: %g %d %d %d %d %d %d %d", d1[0], q1[0], q1[1], q1[2], q1[3], q1[4], q1[5], q1[6]);
    CHECK(d1[1] == 2.0f && q1[32] == -127 && q1[33] == 3 && q1[34] == -3 && q1[35] == 2,
          "activation quants, d = 2: %g %d %d %d %d", d1[1], q1[32], q1[33], q1[34], q1[35]);
    int nz = 0, big = 0;
    for (int i = 64; i < 96; i++) nz += q1[i] != 0;
    for (int i = 0; i < NQ; i++) big += q1[i] < -127;
    CHECK(d1[2] == 0 && nz == 0 && big == 0, "zero block (d %g, %d nonzero) and |q| <= 127 (%d)", d1[2], nz, big);
    CHECK(!memcmp(q1, q2, sizeof q1) && !memcmp(d1, d2, sizeof d1), "quantize_q8_0_act %s: not the reference's bits",
          f->name);
    /* Matmul at odd sizes over every tile shape (n = 1: groups of 4; n > 1: tiles of up to 4
     * tokens). */
    const int ks[] = {32, 96, 160, 1056}, ms[] = {1, 7, 33, 129}, ns[] = {1, 3, 5, 17, 31};
    for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++)
        for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++)
            for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
                const int k = ks[ki], m = ms[mi], n = ns[ni], nb = k / 32;
                float *xa = malloc(sizeof(float) * n * k), *wf = malloc(sizeof(float) * m * k);
                float *y1 = malloc(sizeof(float) * n * m), *y2 = malloc(sizeof(float) * n * m);
                float *xd = malloc(sizeof(float) * n * nb);
                int8_t *xq = malloc((size_t)n * k);
                struct lm_block_q8_0 *w = malloc(sizeof *w * (size_t)m * nb);
                void *wp = malloc(lm_cpu_packed_bytes(LM_DTYPE_Q8_0, m, k));
                fill(xa, (long)n * k, 2.0f);
                fill(wf, (long)m * k, 0.1f);
                for (int r = 0; r < m; r++) lm_q8_0_quantize_row(wf + (long)r * k, w + (long)r * nb, k);
                lm_cpu_pack(wp, w, LM_DTYPE_Q8_0, m, k);
                s->matmul(NULL, y1, xa, w, LM_DTYPE_Q8_0, n, k, m);
                /* The reference against float64 of the same quantized operands. */
                s->quantize_q8_0_act(xa, xq, xd, (long)n * k);
                double e64 = 0, mx = 0;
                for (int i = 0; i < n; i++)
                    for (int j = 0; j < m; j++) {
                        double acc = 0;
                        for (int b = 0; b < nb; b++)
                            for (int l = 0; l < 32; l++)
                                acc += (double)lm_f16_to_f32(w[j * nb + b].d) * w[j * nb + b].qs[l] *
                                       xd[i * nb + b] * xq[i * k + b * 32 + l];
                        e64 = fmax(e64, fabs(acc - y1[i * m + j]));
                        mx = fmax(mx, fabs(acc));
                    }
                CHECK(e64 <= 1e-5 * mx, "int8 scalar matmul vs float64: %g (max %g) k=%d m=%d n=%d", e64, mx, k, m, n);
                f->matmul(pool, y2, xa, w, LM_DTYPE_Q8_0, n, k, m);
                CHECK(!memcmp(y1, y2, sizeof(float) * n * m), "int8 matmul %s k=%d m=%d n=%d: not the reference's bits",
                      f->name, k, m, n);
                memset(y2, 0xff, sizeof(float) * n * m);
                f->matmul(pool, y2, xa, wp, LM_DTYPE_Q8_0_P16, n, k, m);
                CHECK(!memcmp(y1, y2, sizeof(float) * n * m),
                      "int8 matmul %s packed k=%d m=%d n=%d: not the reference's bits", f->name, k, m, n);
                free(xa), free(wf), free(y1), free(y2), free(xd), free(xq), free(w), free(wp);
            }
    lm_cpu_set_q8_0_path(saved);
}

static void test_rmsnorm(struct lm_pool *pool, const struct lm_cpu_ops *f) {
    const struct lm_cpu_ops *s = lm_cpu_ops_scalar();
    /* Known value: x = [3, 4], w = [1, 2]: rms = sqrt(12.5). */
    float x0[2] = {3, 4}, w0[2] = {1, 2}, y0[2];
    s->rmsnorm(NULL, y0, x0, w0, 1, 2, 0);
    CHECK(fabsf(y0[0] - 3 / sqrtf(12.5f)) < 1e-6f && fabsf(y0[1] - 8 / sqrtf(12.5f)) < 1e-6f,
          "rmsnorm [3,4]: %g %g", y0[0], y0[1]);
    const int ds[] = {37, 16, 1024, 5}, ns[] = {1, 3, 17, 300};
    for (size_t di = 0; di < 4; di++)
        for (size_t ni = 0; ni < 4; ni++) {
            int d = ds[di], n = ns[ni];
            float *x = malloc(sizeof(float) * n * d), *w = malloc(sizeof(float) * d);
            float *y1 = malloc(sizeof(float) * n * d), *y2 = malloc(sizeof(float) * n * d);
            fill(x, (long)n * d, 3), fill(w, d, 1.5f);
            s->rmsnorm(NULL, y1, x, w, n, d, 1e-6f);
            f->rmsnorm(pool, y2, x, w, n, d, 1e-6f);
            CHECK(rel_err(y2, y1, (long)n * d) <= 1e-5, "rmsnorm d=%d n=%d: %g", d, n,
                  rel_err(y2, y1, (long)n * d));
            f->rmsnorm(pool, x, x, w, n, d, 1e-6f); /* in place */
            CHECK(rel_err(x, y1, (long)n * d) <= 1e-5, "rmsnorm in place d=%d n=%d", d, n);
            free(x), free(w), free(y1), free(y2);
        }
}

static void test_rope(struct lm_pool *pool, const struct lm_cpu_ops *f) {
    const struct lm_cpu_ops *s = lm_cpu_ops_scalar();
    const int hds[] = {16, 128, 6, 34}, ns[] = {1, 3, 17, 130}, hs[] = {4, 2, 1, 3};
    for (size_t hi = 0; hi < 4; hi++)
        for (size_t ni = 0; ni < 4; ni++) {
            int hd = hds[hi], n = ns[ni], nh = hs[hi], pos0 = (int)ni * 37;
            float inv[64];
            for (int j = 0; j < hd / 2; j++) inv[j] = 1.0f / powf(10000.0f, (float)(2 * j) / hd);
            long len = (long)n * nh * hd;
            float *x = malloc(sizeof(float) * len), *a = malloc(sizeof(float) * len),
                  *b = malloc(sizeof(float) * len);
            fill(x, len, 1);
            memcpy(a, x, sizeof(float) * len), memcpy(b, x, sizeof(float) * len);
            s->rope(NULL, a, n, nh, hd, pos0, inv);
            f->rope(pool, b, n, nh, hd, pos0, inv);
            CHECK(rel_err(b, a, len) <= 1e-6, "rope hd=%d n=%d: %g", hd, n, rel_err(b, a, len));
            /* A rotation: each (j, j + hd/2) pair keeps its length; position 0 is the identity. */
            double worst = 0;
            for (long r = 0; r < (long)n * nh; r++)
                for (int j = 0; j < hd / 2; j++) {
                    const float *u = x + r * hd, *v = a + r * hd;
                    double l0 = hypot(u[j], u[j + hd / 2]), l1 = hypot(v[j], v[j + hd / 2]);
                    worst = fmax(worst, fabs(l0 - l1));
                }
            CHECK(worst < 1e-5, "rope changes lengths by %g", worst);
            if (pos0 == 0) CHECK(memcmp(a, x, sizeof(float) * nh * hd) == 0, "rope at position 0");
            free(x), free(a), free(b);
        }
    /* Position 1, head_dim 2, inv_freq 1: rotation by 1 radian. */
    float v[2] = {1, 0}, one = 1;
    s->rope(NULL, v, 1, 1, 2, 1, &one);
    CHECK(fabsf(v[0] - cosf(1)) < 1e-7f && fabsf(v[1] - sinf(1)) < 1e-7f, "rope by 1 rad: %g %g",
          v[0], v[1]);
}

static void test_swiglu_softmax(struct lm_pool *pool, const struct lm_cpu_ops *f) {
    const struct lm_cpu_ops *s = lm_cpu_ops_scalar();
    long ns[] = {1, 37, 100000};
    for (int i = 0; i < 3; i++) {
        long n = ns[i];
        float *g = malloc(sizeof(float) * n), *u = malloc(sizeof(float) * n);
        float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
        fill(g, n, 8), fill(u, n, 2);
        s->swiglu(NULL, a, g, u, n);
        f->swiglu(pool, b, g, u, n);
        CHECK(rel_err(b, a, n) <= 1e-6, "swiglu n=%ld", n);
        double e = 0;
        for (long j = 0; j < n; j++) e = fmax(e, fabs(a[j] - g[j] / (1 + exp(-(double)g[j])) * u[j]));
        CHECK(e < 1e-5, "swiglu vs float64: %g", e);
        free(g), free(u), free(a), free(b);
    }
    int sm[] = {1, 7, 37, 1000};
    for (int i = 0; i < 4; i++) {
        int n = sm[i];
        float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
        fill(a, n, 30);
        memcpy(b, a, sizeof(float) * n);
        double mx = -1e30, z = 0;
        for (int j = 0; j < n; j++) mx = fmax(mx, a[j]);
        for (int j = 0; j < n; j++) z += exp(a[j] - mx);
        double e0 = 0;
        for (int j = 0; j < n; j++) e0 = fmax(e0, fabs(exp(a[j] - mx) / z));
        float *ref = malloc(sizeof(float) * n);
        for (int j = 0; j < n; j++) ref[j] = (float)(exp(a[j] - mx) / z);
        s->softmax(a, n);
        f->softmax(b, n);
        CHECK(rel_err(a, ref, n) <= 1e-6, "softmax scalar vs float64 n=%d: %g", n, rel_err(a, ref, n));
        CHECK(rel_err(b, ref, n) <= 1e-6, "softmax fast vs float64 n=%d: %g", n, rel_err(b, ref, n));
        free(a), free(b), free(ref);
    }
}

static void test_attention(struct lm_pool *pool, const struct lm_cpu_ops *f) {
    const struct lm_cpu_ops *s = lm_cpu_ops_scalar();
    struct {
        int n, pos0, nh, nkv, hd;
    } cases[] = {{1, 0, 4, 2, 16}, {3, 5, 4, 2, 16}, {17, 0, 6, 3, 37}, {1, 200, 16, 8, 128},
                 {40, 30, 8, 2, 64}, {5, 2, 2, 2, 9}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int n = cases[c].n, pos0 = cases[c].pos0, nh = cases[c].nh, nkv = cases[c].nkv,
            hd = cases[c].hd, len = pos0 + n, stride = nkv * hd;
        float *q = malloc(sizeof(float) * n * nh * hd), *k = malloc(sizeof(float) * len * stride),
              *v = malloc(sizeof(float) * len * stride);
        float *o1 = malloc(sizeof(float) * n * nh * hd), *o2 = malloc(sizeof(float) * n * nh * hd);
        float *scr = malloc(sizeof(float) * len * lm_pool_size(pool));
        fill(q, (long)n * nh * hd, 2), fill(k, (long)len * stride, 2), fill(v, (long)len * stride, 1);
        float scale = 1.0f / sqrtf((float)hd);
        s->attention(NULL, o1, q, k, v, n, pos0, nh, nkv, hd, stride, scale, scr);
        f->attention(pool, o2, q, k, v, n, pos0, nh, nkv, hd, stride, scale, scr);
        CHECK(rel_err(o2, o1, (long)n * nh * hd) <= 1e-5, "attention case %zu: %g", c,
              rel_err(o2, o1, (long)n * nh * hd));
        /* float64 check of the last query of the last head. */
        int i = n - 1, h = nh - 1, g = h / (nh / nkv);
        double sc[1024], z = 0, mx = -1e30;
        for (int t = 0; t <= pos0 + i; t++) {
            double d = 0;
            for (int j = 0; j < hd; j++) d += (double)q[(i * nh + h) * hd + j] * k[t * stride + g * hd + j];
            sc[t] = d * scale;
            mx = fmax(mx, sc[t]);
        }
        for (int t = 0; t <= pos0 + i; t++) z += (sc[t] = exp(sc[t] - mx));
        double e = 0;
        for (int j = 0; j < hd; j++) {
            double o = 0;
            for (int t = 0; t <= pos0 + i; t++) o += sc[t] / z * v[t * stride + g * hd + j];
            e = fmax(e, fabs(o - o1[(i * nh + h) * hd + j]));
        }
        CHECK(e < 1e-5, "scalar attention vs float64, case %zu: %g", c, e);
        free(q), free(k), free(v), free(o1), free(o2), free(scr);
    }
}

struct count_ctx {
    atomic_int calls;
    atomic_long sum;
};
static void count_fn(void *p, int ith, int nth) {
    struct count_ctx *c = p;
    atomic_fetch_add(&c->calls, 1);
    long b, e;
    lm_pool_split(1003, ith, nth, 4, &b, &e);
    for (long i = b; i < e; i++) atomic_fetch_add(&c->sum, i);
}

static void test_pool(void) {
    for (int nt = 1; nt <= 4; nt++) {
        struct lm_pool *p;
        CHECK(lm_pool_create(nt, &p) == LM_OK, "pool create");
        CHECK(lm_pool_size(p) == nt, "pool size");
        for (int rep = 0; rep < 200; rep++) {
            struct count_ctx c = {0};
            lm_pool_run(p, count_fn, &c);
            if (atomic_load(&c.calls) != nt || atomic_load(&c.sum) != 1003L * 1002 / 2) {
                CHECK(0, "pool of %d: %d calls, sum %ld", nt, atomic_load(&c.calls), atomic_load(&c.sum));
                break;
            }
        }
        lm_pool_destroy(p);
    }
    long b, e;
    lm_pool_split(10, 2, 3, 4, &b, &e);
    CHECK(b == 8 && e == 10, "split tail [%ld, %ld)", b, e);
    lm_pool_split(2, 1, 3, 4, &b, &e);
    CHECK(b == 2 && e == 2, "split empty share [%ld, %ld)", b, e);
}

int main(void) {
    test_pool();
    const struct lm_cpu_ops *best = lm_cpu_ops_fast();
    CHECK(best && best != lm_cpu_ops_scalar(), "lm_cpu_ops_fast");
    int ran = 0, chose = 0;
    char names[64] = "";
    for (const char *const *t = lm_cpu_ops_targets(); *t; t++) {
        const struct lm_cpu_ops *f = lm_cpu_ops_target(*t);
        if (!f) { /* this CPU cannot run it */
            fprintf(stderr, "target %s: not runnable on this CPU, skipped\n", *t);
            continue;
        }
        CHECK(!strcmp(f->name, *t), "target %s has name %s", *t, f->name);
        /* The run-time choice is the first (best) target this CPU runs, unless LM_CPU_KERNELS
         * asks for another. */
        if (!ran && !getenv("LM_CPU_KERNELS")) CHECK(f == best, "best target %s, chosen %s", f->name, best->name);
        chose += f == best;
        ran++;
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", ran > 1 ? ", " : "", f->name);
        test_conversions(f);
        test_dpbf16_semantics(f);
        for (int nt = 1; nt <= 3; nt++) {
            struct lm_pool *pool;
            lm_pool_create(nt, &pool);
            test_matmul(pool, f, LM_BF16_F32);
            test_matmul(pool, f, LM_BF16_ACT);
            test_q8_0_int8(pool, f);
            test_rmsnorm(pool, f);
            test_rope(pool, f);
            test_swiglu_softmax(pool, f);
            test_attention(pool, f);
            lm_pool_destroy(pool);
        }
    }
    CHECK(ran >= 1 && chose == 1, "%d targets ran, the chosen one %d times", ran, chose);
    fprintf(stderr, "fast kernel targets checked: %s (lm_cpu_ops_fast: %s)\n", names, best ? best->name : "?");
    return check_exit("test_kernels");
}
