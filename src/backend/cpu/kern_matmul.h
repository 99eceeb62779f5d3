/* kern_matmul.h: the fast matmul of every weight dtype and layout, as a template included once
 * per vector target (kern_avx512bf16.c, kern_avx512vnni.c, kern_avx512.c, kern_avx2.c,
 * kern_generic.c define LM_SIMD_LEVEL, and LM_SIMD_VNNI / LM_SIMD_BF16 where they apply). No
 * include guard: one inclusion per file.
 *
 * Every y[t, r] is the chain acc = fma(w[r, l], x[t, l], acc), l = 0..k-1 in order, in one lane
 * of a vector register: the kernels vectorize across 16 rows of a packed group (ops.h,
 * lm_cpu_pack), never across l, so the order cannot depend on the tile, the batch, the thread
 * or the vector target (batch invariance), and equals the scalar reference's fmaf chain.
 *
 * Paths:
 *   streaming tiles (n < LM_MM_PANEL_MIN tokens on packed weights: decode, small batches): 4
 *     groups x 1 token (Q8_0: 3), 2 groups x 2 tokens, or one group x up to 6 tokens at a time
 *     (a batch: every token over a group before the next, the group from L1/L2 after the first
 *     pass); each column of 16 weights is loaded once, widened in registers (bf16: a shift and
 *     a mask) and used by every token of the tile, so each weight comes from memory once a call;
 *   panels (n >= LM_MM_PANEL_MIN, or row-major weights mapped from a file): a thread widens one
 *     group into a float32 panel [k][16] (L2-resident; row-major weights are transposed 8 x 8 on
 *     the way under AVX2), then an outer-product tile of 6 tokens x 16 rows (12 accumulators,
 *     the BLIS shape) runs over every token: per column 2 loads, 6 broadcasts, 12 FMAs;
 *   bf16 weights on the bf16 path (ops.h, LM_BF16_ACT): the activations are rounded to bfloat16
 *     once per call; the tiles and panels above then take the columns in pairs, the odd one
 *     first (P = 1), or, with AVX512-BF16 (LM_SIMD_BF16), interleave each pair of columns with
 *     one vpermw and take 32 products a VDPBF16PS (tile_bfd for decode and batches, bf16 panels
 *     of interleaved pairs and 12-token tiles for prefill: mkd_tile);
 *   Q8_0 on the int8 path (ops.h, LM_Q8_0_INT8; any n): the activations are quantized once per
 *     call (quant_act), then tiles of 4 groups x 1 token or 1 group x QI_T tokens take int8 dot
 *     products of 4 columns per lane (tile_q8i); row-major Q8_0 goes row by row (one token) or
 *     packs each group into the thread's buffer first (batches). */
#include <assert.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "backend/cpu/matmul.h"
#include "backend/cpu/quant.h"
#include "backend/cpu/simd.h"

#define G LM_MM_GROUP                           /* rows per group */
#define NV (G / VL)                             /* vectors per column of a group */
#define QGB (G * (2 + LM_Q8_0_BLOCK))           /* bytes of a packed Q8_0 group block */
#if NV > 2
#define MK_T 3 /* 4-lane vectors: 16 registers hold 3 tokens x 4 vectors */
#else
#define MK_T 6
#endif

#ifndef MM_CHUNKS
#define MM_CHUNKS 8 /* chunks of groups per thread, taken dynamically (mm_task) */
#endif
#ifndef MM_BATCH_NG
#define MM_BATCH_NG 1 /* groups per tile of a batch (3 <= n < LM_MM_PANEL_MIN tokens) */
#endif
#ifndef MM_BATCH_T
#define MM_BATCH_T MK_T /* tokens per tile of a batch */
#endif

#ifndef RM_PREFETCH
#define RM_PREFETCH 512 /* bytes ahead in each row of a row-major decode */
#endif
#ifndef MM_XBLOCK
#define MM_XBLOCK (1 << 30) /* bytes of activations per token block of the panel path */
#endif

/* Work below this many multiply-adds runs on the calling thread: waking the pool costs more. */
enum { MM_PAR_MIN_WORK = 1 << 15 };
/* Activations below this many values are quantized on the calling thread (int8 path). */
enum { MM_QA_PAR_MIN = 1 << 16 };

/* ---- column loads of packed groups: 16 rows of column l as NV vectors in row order ---- */

ALWAYS_INLINE void col_f32(vf *o, const float *g, long l) {
    _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) o[v] = V_LOAD(g + l * G + v * VL);
}
ALWAYS_INLINE void col_f16(vf *o, const uint16_t *g, long l) {
    _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) o[v] = V_LOAD_F16(g + l * G + v * VL);
}
ALWAYS_INLINE void col_bf16(vf *o, const uint16_t *g, long l) {
    /* 32-bit slot i holds rows i (low half) and 8 + i (high half) on every target (pack.c):
     * `slot << 16` widens rows 0-7, `slot & 0xffff0000` rows 8-15. */
#if defined(SIMD_AVX2)
    __m256i v = _mm256_loadu_si256((const __m256i *)(g + l * G));
    o[0] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    o[1] = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
#elif defined(SIMD_AVX512)
    __m256i v = _mm256_loadu_si256((const __m256i *)(g + l * G));
    __m256i lo = _mm256_slli_epi32(v, 16), hi = _mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u));
    o[0] = _mm512_castsi512_ps(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
#else
    vu a, b;
    memcpy(&a, g + l * G, sizeof a);     /* slots 0-3: rows 0-3 and 8-11 */
    memcpy(&b, g + l * G + 8, sizeof b); /* slots 4-7: rows 4-7 and 12-15 */
    const vu mask = {0xffff0000u, 0xffff0000u, 0xffff0000u, 0xffff0000u};
    o[0] = (vf)(a << 16), o[1] = (vf)(b << 16), o[2] = (vf)(a & mask), o[3] = (vf)(b & mask);
#endif
}

/* ---- streaming tiles on packed weights ----
 *
 * tile_<dtype>(NG, T, ...): rows of NG consecutive groups (group stride gs elements or bytes)
 * for T tokens; y[t * ldy + i * 16 + j] for the group's valid rows (`valid` rows in the last
 * group). */

ALWAYS_INLINE void store_group(float *y, const vf *acc, int valid) {
    if (valid >= G) {
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) V_STORE(y + v * VL, acc[v]);
        return;
    }
    float tmp[G];
    for (int v = 0; v < NV; v++) V_STORE(tmp + v * VL, acc[v]);
    memcpy(y, tmp, sizeof(float) * (size_t)valid);
}

#define DEFINE_TILE(SUF, WT, COL)                                                                \
    ALWAYS_INLINE void tile_##SUF(const int NG, const int T, float *y, long ldy, const float *x, \
                                  long ldx, int k, const WT *w, long gs, int valid, const int P) { \
        vf acc[4][6][NV];                                                                        \
        _Pragma("GCC unroll 4") for (int i = 0; i < NG; i++)                                     \
            _Pragma("GCC unroll 6") for (int t = 0; t < T; t++)                                  \
                _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[i][t][v] = V_ZERO();    \
        for (long l2 = 0; l2 < k; l2 += P ? 2 : 1) {                                             \
        for (int s = 0; s < (P ? 2 : 1); s++) { /* constant trip count: unrolled */              \
            const long l = P ? l2 + 1 - s : l2; /* pair order: the odd column first */            \
            if (l >= k) continue;                /* an odd k's last column: alone */              \
            if (NG == 1) { /* many tokens: broadcast each as it is used (registers) */           \
                vf c[NV];                                                                        \
                COL(c, w, l);                                                                    \
                _Pragma("GCC unroll 6") for (int t = 0; t < T; t++) {                            \
                    vf xb = V_SET1(x[t * ldx + l]);                                              \
                    _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[0][t][v] =          \
                        V_FMA(c[v], xb, acc[0][t][v]);                                           \
                }                                                                                \
                continue;                                                                        \
            }                                                                                    \
            vf xb[3];                                                                            \
            _Pragma("GCC unroll 3") for (int t = 0; t < T && t < 3; t++) xb[t] =                 \
                V_SET1(x[t * ldx + l]);                                                          \
            _Pragma("GCC unroll 4") for (int i = 0; i < NG; i++) {                               \
                vf c[NV];                                                                        \
                COL(c, w + i * gs, l);                                                           \
                _Pragma("GCC unroll 3") for (int t = 0; t < T && t < 3; t++)                     \
                    _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[i][t][v] =          \
                        V_FMA(c[v], xb[t], acc[i][t][v]);                                        \
            }                                                                                    \
        }                                                                                        \
        }                                                                                        \
        _Pragma("GCC unroll 4") for (int i = 0; i < NG; i++)                                     \
            _Pragma("GCC unroll 6") for (int t = 0; t < T; t++)                                  \
                store_group(y + t * ldy + i * G, acc[i][t], i == NG - 1 ? valid : G);           \
    }

DEFINE_TILE(f32, float, col_f32)
DEFINE_TILE(f16, uint16_t, col_f16)
DEFINE_TILE(bf16, uint16_t, col_bf16)

/* Column c4 (< 4) of a run of 4 packed Q8_0 columns (ops.h: row j's 4 quants at bytes 4j..4j+3
 * of `p`): the 16 rows' int8 widened to float32 (not scaled), NV vectors in row order. */
ALWAYS_INLINE void col_q8(vf *o, const unsigned char *p, const int c4) {
#if defined(SIMD_AVX2)
    _Pragma("GCC unroll 2") for (int v = 0; v < 2; v++) {
        __m256i r = _mm256_loadu_si256((const __m256i *)(p + 32 * v));
        o[v] = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(r, 24 - 8 * c4), 24));
    }
#elif defined(SIMD_AVX512)
    __m512i r = _mm512_loadu_si512((const void *)p);
    o[0] = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(r, 24 - 8 * c4), 24));
#else
    _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) {
        const int8_t *q = (const int8_t *)p + 16 * v + c4;
        vf t = {(float)q[0], (float)q[4], (float)q[8], (float)q[12]};
        o[v] = t;
    }
#endif
}

/* Q8_0: per block of 32 columns the groups' 16 scales are widened once; column l's weights are
 * then q * d (exact) before the same fma. */
ALWAYS_INLINE void tile_q8_0(const int NG, const int T, float *y, long ldy, const float *x,
                             long ldx, int k, const unsigned char *w, long gs, int valid, const int P) {
    (void)P; /* no pair order for Q8_0 */
    vf acc[4][6][NV];
    _Pragma("GCC unroll 4") for (int i = 0; i < NG; i++)
        _Pragma("GCC unroll 6") for (int t = 0; t < T; t++)
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[i][t][v] = V_ZERO();
    for (int b = 0; b < k / LM_Q8_0_BLOCK; b++) {
        vf d[4][NV];
        _Pragma("GCC unroll 4") for (int i = 0; i < NG; i++)
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)
                d[i][v] = V_LOAD_F16((const uint16_t *)(w + i * gs + (long)b * QGB) + v * VL);
        for (int q4 = 0; q4 < LM_Q8_0_BLOCK; q4 += 4) _Pragma("GCC unroll 4") for (int c4 = 0; c4 < 4; c4++) {
            const long l = (long)b * LM_Q8_0_BLOCK + q4 + c4;
            if (NG == 1) { /* many tokens: broadcast each as it is used (registers) */
                vf c[NV];
                col_q8(c, w + (long)b * QGB + 2 * G + q4 * G, c4);
                _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) c[v] = V_MUL(c[v], d[0][v]);
                _Pragma("GCC unroll 6") for (int t = 0; t < T; t++) {
                    vf xb = V_SET1(x[t * ldx + l]);
                    _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[0][t][v] = V_FMA(c[v], xb, acc[0][t][v]);
                }
                continue;
            }
            vf xb[3];
            _Pragma("GCC unroll 3") for (int t = 0; t < T && t < 3; t++) xb[t] = V_SET1(x[t * ldx + l]);
            _Pragma("GCC unroll 4") for (int i = 0; i < NG; i++) {
                vf c[NV];
                col_q8(c, w + i * gs + (long)b * QGB + 2 * G + q4 * G, c4);
                _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) {
                    c[v] = V_MUL(c[v], d[i][v]);
                    _Pragma("GCC unroll 3") for (int t = 0; t < T && t < 3; t++) acc[i][t][v] =
                        V_FMA(c[v], xb[t], acc[i][t][v]);
                }
            }
        }
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < NG; i++)
        _Pragma("GCC unroll 6") for (int t = 0; t < T; t++)
            store_group(y + t * ldy + i * G, acc[i][t], i == NG - 1 ? valid : G);
}

#define TILE_CASE(SUF, NG, T, P)                                                                 \
    case NG * 8 + T: tile_##SUF(NG, T, y, ldy, x, ldx, k, w, gs, valid, P); break;
#if MK_T > 3
#define TILE_CASES_WIDE(SUF, P) TILE_CASE(SUF, 1, 4, P) TILE_CASE(SUF, 1, 5, P) TILE_CASE(SUF, 1, 6, P)
#else
#define TILE_CASES_WIDE(SUF, P)
#endif
/* NAME: every tile shape of tile_<SUF>, with the pair order P (0 or 1: the bf16 path). */
#define DEFINE_TILE_SWITCH(NAME, SUF, WT, P)                                                     \
    static void NAME(int NG, int T, float *y, long ldy, const float *x, long ldx, int k,         \
                     const WT *w, long gs, int valid) {                                          \
        switch (NG * 8 + T) {                                                                    \
            TILE_CASE(SUF, 1, 1, P) TILE_CASE(SUF, 2, 1, P) TILE_CASE(SUF, 3, 1, P)               \
            TILE_CASE(SUF, 4, 1, P) TILE_CASE(SUF, 1, 2, P) TILE_CASE(SUF, 2, 2, P)               \
            TILE_CASE(SUF, 1, 3, P) TILE_CASE(SUF, 2, 3, P) TILE_CASES_WIDE(SUF, P)               \
        default: assert(0 && "tile shape");                                                      \
        }                                                                                        \
    }
DEFINE_TILE_SWITCH(tiles_f32, f32, float, 0)
DEFINE_TILE_SWITCH(tiles_f16, f16, uint16_t, 0)
DEFINE_TILE_SWITCH(tiles_bf16, bf16, uint16_t, 0)
DEFINE_TILE_SWITCH(tiles_bf16p, bf16, uint16_t, 1)
DEFINE_TILE_SWITCH(tiles_q8_0, q8_0, unsigned char, 0)

/* ---- Q8_0 weights x Q8_0 activations: the int8 path (ops.h, LM_Q8_0_INT8) ----
 *
 * Per block of 32 columns each (row, token) gets an exact int32 dot product; the kernels
 * vectorize it across rows (a run of 4 packed columns of 16 rows is 64 bytes, row j's 4 quants
 * at 4j: one 4-wide dot per row and lane), and then fold it into the float32 chain
 * acc = fma((float)isum, dw * dx, acc) in block order, as the scalar reference does. */

#if defined(SIMD_AVX2) || defined(SIMD_AVX512)
typedef __m256i vi; /* 8 rows' int32 sums */
#define NVI 2       /* vi per 16 rows */
#ifndef QI_T
#define QI_T 4 /* tokens per tile of a batch */
#endif
/* 4 activation quants broadcast to every lane. */
ALWAYS_INLINE vi qi_x4(const int8_t *x) {
    int32_t v;
    memcpy(&v, x, 4);
    return _mm256_set1_epi32(v);
}
/* 8 rows x 4 quants of weights, and their magnitudes (maddubs wants one unsigned operand). */
struct qi_w {
    __m256i w, aw;
};
ALWAYS_INLINE struct qi_w qi_load(const unsigned char *p) {
    struct qi_w r;
    r.w = _mm256_loadu_si256((const __m256i *)p);
    r.aw = _mm256_abs_epi8(r.w);
    return r;
}
/* acc + each row's 4-wide dot: |w| * (x with w's sign) in pairs (maddubs: at most
 * 2 * 128 * 127 < 2^15, |x| <= 127, so never saturated), pairs of pairs (madd with ones). As
 * ggml's mul_sum_i8_pairs; with VNNI one vpdpbusd (ggml's AVX512VNNI path). */
ALWAYS_INLINE vi qi_dot(vi acc, struct qi_w w, vi x4) {
#ifdef LM_SIMD_VNNI /* the 4 products and the sum in one instruction (no int16 stage) */
    acc = _mm256_dpbusd_epi32(acc, w.aw, _mm256_sign_epi8(x4, w.w));
#else
    __m256i p = _mm256_maddubs_epi16(w.aw, _mm256_sign_epi8(x4, w.w));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
#endif
    /* Keep the block's sums one chain in a register: GCC reassociates them into a tree whose
     * partial sums spill (measured: 28 -> 36 GMAC/s one token, 31 -> 44 four tokens). */
    __asm__("" : "+x"(acc));
    return acc;
}
ALWAYS_INLINE vi qi_zero(void) { return _mm256_setzero_si256(); }
/* The 16 rows' sums as NV float32 vectors (exact: |isum| <= 32 * 128 * 127 < 2^24). */
ALWAYS_INLINE void qi_float(vf *o, const vi *s) {
#if defined(SIMD_AVX2)
    o[0] = _mm256_cvtepi32_ps(s[0]), o[1] = _mm256_cvtepi32_ps(s[1]);
#else
    o[0] = _mm512_cvtepi32_ps(_mm512_inserti64x4(_mm512_castsi256_si512(s[0]), s[1], 1));
#endif
}
ALWAYS_INLINE float hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
/* lm_q8_0_quantize_act (quant.h), 32 values a block: the same operations in the same IEEE
 * rounding (max, d = amax / 127, id = 1 / d, x * id), and roundf's halves away from zero as
 * trunc(v) + (|v - trunc(v)| >= 0.5 ? copysign(1, v) : 0) (v - trunc(v) is exact), so the
 * same bits. */
static void quant_act(const float *x, int8_t *q, float *d, long n) {
    const __m256 sign = _mm256_set1_ps(-0.0f), half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    for (long b = 0; b < n / LM_Q8_0_BLOCK; b++) {
        __m256 v[4];
        for (int i = 0; i < 4; i++) v[i] = _mm256_loadu_ps(x + b * LM_Q8_0_BLOCK + 8 * i);
        __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                  _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
        const float amax = hmax8(mx), db = amax / 127.0f, id = db ? 1.0f / db : 0.0f;
        d[b] = db;
        __m256i r[4];
        for (int i = 0; i < 4; i++) {
            __m256 s = _mm256_mul_ps(v[i], _mm256_set1_ps(id));
            __m256 t = _mm256_round_ps(s, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            __m256 up = _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_sub_ps(s, t)), half, _CMP_GE_OQ);
            __m256 adj = _mm256_and_ps(up, _mm256_or_ps(_mm256_and_ps(sign, s), one));
            r[i] = _mm256_cvttps_epi32(_mm256_add_ps(t, adj));
        }
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(q + b * LM_Q8_0_BLOCK), p);
    }
}
#else
typedef int32_t vi __attribute__((vector_size(16))); /* 4 rows' int32 sums */
#define NVI 4
#define QI_T 2
ALWAYS_INLINE vi qi_x4(const int8_t *x) {
    vi v = {x[0], x[1], x[2], x[3]};
    return v;
}
/* 4 rows x 4 quants as 4 columns of 4 rows. */
struct qi_w {
    vi c[4];
};
ALWAYS_INLINE struct qi_w qi_load(const unsigned char *p) {
    const int8_t *q = (const int8_t *)p;
    struct qi_w r;
    for (int c = 0; c < 4; c++) {
        vi v = {q[c], q[4 + c], q[8 + c], q[12 + c]};
        r.c[c] = v;
    }
    return r;
}
ALWAYS_INLINE vi qi_dot(vi acc, struct qi_w w, vi x4) {
    for (int c = 0; c < 4; c++) {
        vi xb = {x4[c], x4[c], x4[c], x4[c]};
        acc += w.c[c] * xb;
    }
    return acc;
}
ALWAYS_INLINE vi qi_zero(void) {
    vi z = {0, 0, 0, 0};
    return z;
}
ALWAYS_INLINE void qi_float(vf *o, const vi *s) {
    for (int v = 0; v < NVI; v++) o[v] = __builtin_convertvector(s[v], vf);
}
static void quant_act(const float *x, int8_t *q, float *d, long n) { lm_q8_0_quantize_act(x, q, d, n); }
#endif

/* NG groups (stride gs bytes) x T tokens of packed Q8_0 weights against quantized activations:
 * token t's quants at xq + t * ldx, its block scales at xd + t * (ldx / 32); y as tile_*. */
ALWAYS_INLINE void tile_q8i(const int NG, const int T, float *y, long ldy, const int8_t *xq,
                            const float *xd, long ldx, int k, const unsigned char *w, long gs,
                            int valid) {
    vf acc[4][QI_T][NV];
    _Pragma("GCC unroll 4") for (int i = 0; i < NG; i++)
        _Pragma("GCC unroll 6") for (int t = 0; t < T; t++)
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[i][t][v] = V_ZERO();
    const long ldd = ldx / LM_Q8_0_BLOCK;
    for (int b = 0; b < k / LM_Q8_0_BLOCK; b++) {
        vi s[4][QI_T][NVI];
        _Pragma("GCC unroll 4") for (int i = 0; i < NG; i++)
            _Pragma("GCC unroll 6") for (int t = 0; t < T; t++)
                _Pragma("GCC unroll 4") for (int v = 0; v < NVI; v++) s[i][t][v] = qi_zero();
        _Pragma("GCC unroll 8") for (int q4 = 0; q4 < LM_Q8_0_BLOCK; q4 += 4) {
            vi x4[QI_T];
            _Pragma("GCC unroll 6") for (int t = 0; t < T; t++) x4[t] = qi_x4(xq + t * ldx + (long)b * LM_Q8_0_BLOCK + q4);
            _Pragma("GCC unroll 4") for (int i = 0; i < NG; i++)
                _Pragma("GCC unroll 4") for (int v = 0; v < NVI; v++) {
                    struct qi_w wv = qi_load(w + i * gs + (long)b * QGB + 2 * G + q4 * G + v * (4 * G / NVI));
                    _Pragma("GCC unroll 6") for (int t = 0; t < T; t++) s[i][t][v] = qi_dot(s[i][t][v], wv, x4[t]);
                }
        }
        _Pragma("GCC unroll 4") for (int i = 0; i < NG; i++) {
            vf dw[NV];
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)
                dw[v] = V_LOAD_F16((const uint16_t *)(w + i * gs + (long)b * QGB) + v * VL);
            _Pragma("GCC unroll 6") for (int t = 0; t < T; t++) {
                vf f[NV], dx = V_SET1(xd[t * ldd + b]);
                qi_float(f, s[i][t]);
                _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[i][t][v] =
                    V_FMA(f[v], V_MUL(dw[v], dx), acc[i][t][v]);
            }
        }
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < NG; i++)
        _Pragma("GCC unroll 6") for (int t = 0; t < T; t++)
            store_group(y + t * ldy + i * G, acc[i][t], i == NG - 1 ? valid : G);
}

#define TILE_Q8I_CASE(NG, T)                                                                     \
    case NG * 8 + T: tile_q8i(NG, T, y, ldy, xq, xd, ldx, k, w, gs, valid); break;
static void tiles_q8i(int NG, int T, float *y, long ldy, const int8_t *xq, const float *xd, long ldx,
                      int k, const unsigned char *w, long gs, int valid) {
    switch (NG * 8 + T) {
        TILE_Q8I_CASE(1, 1) TILE_Q8I_CASE(2, 1) TILE_Q8I_CASE(3, 1) TILE_Q8I_CASE(4, 1)
        TILE_Q8I_CASE(1, 2)
#if QI_T > 2
        TILE_Q8I_CASE(1, 3)
#endif
#if QI_T > 3
        TILE_Q8I_CASE(1, 4)
#endif
#if QI_T > 4
        TILE_Q8I_CASE(1, 5) TILE_Q8I_CASE(1, 6)
#endif
    default: assert(0 && "tile shape");
    }
}

/* The int32 dot product of 32 int8 weights and 32 int8 activations (exact in any order). */
ALWAYS_INLINE int32_t dot32_i8(const int8_t *w, const int8_t *x) {
#if defined(SIMD_AVX2) || defined(SIMD_AVX512)
    struct qi_w wv = qi_load((const unsigned char *)w);
    __m256i s = qi_dot(qi_zero(), wv, _mm256_loadu_si256((const __m256i *)x));
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
    return _mm_cvtsi128_si32(h);
#else
    int32_t isum = 0;
    for (int l = 0; l < LM_Q8_0_BLOCK; l++) isum += (int32_t)w[l] * (int32_t)x[l];
    return isum;
#endif
}

/* Rows [r0, r1) of row-major Q8_0 weights (a mapped file) on the int8 path, every token: one
 * row and token at a time, the blocks in the reference's order. */
static void rows_q8i(float *y, int m, const int8_t *xq, const float *xd, int n, int k,
                     const struct lm_block_q8_0 *w, long r0, long r1) {
    const int nb = k / LM_Q8_0_BLOCK;
    for (long r = r0; r < r1; r++)
        for (int t = 0; t < n; t++) {
            const struct lm_block_q8_0 *wb = w + r * nb;
            const int8_t *xt = xq + (long)t * k;
            float acc = 0;
            for (int b = 0; b < nb; b++)
                acc = fmaf((float)dot32_i8(wb[b].qs, xt + b * LM_Q8_0_BLOCK), S_F16(wb[b].d) * xd[(long)t * nb + b], acc);
            y[(long)t * m + r] = acc;
        }
}

/* Groups [g, g + NG) of packed weights for tokens [t, t + T); P: the bf16 path's pair order
 * (x then holds the activations rounded to bfloat16). */
static void tiles_packed(enum lm_dtype wt, int NG, int T, float *y, int m, const float *x, int k,
                         const void *w, long g, int t, int P) {
    const enum lm_dtype base = lm_dtype_unpacked(wt);
    const size_t gb = G * lm_dtype_row_bytes(base, k); /* bytes per group */
    const int valid = m - (int)(g + NG - 1) * G < G ? m - (int)(g + NG - 1) * G : G;
    float *yt = y + (long)t * m + g * G;
    const float *xt = x + (long)t * k;
    const unsigned char *wg = (const unsigned char *)w + (size_t)g * gb;
    switch (base) {
    case LM_DTYPE_F32: tiles_f32(NG, T, yt, m, xt, k, k, (const float *)wg, (long)(gb / 4), valid); break;
    case LM_DTYPE_F16: tiles_f16(NG, T, yt, m, xt, k, k, (const uint16_t *)wg, (long)(gb / 2), valid); break;
    case LM_DTYPE_BF16:
        (P ? tiles_bf16p : tiles_bf16)(NG, T, yt, m, xt, k, k, (const uint16_t *)wg, (long)(gb / 2), valid);
        break;
    case LM_DTYPE_Q8_0: tiles_q8_0(NG, T, yt, m, xt, k, k, wg, (long)gb, valid); break;
    default: assert(0);
    }
}

/* ---- panels ---- */

#ifdef SIMD_AVX2
/* Columns c[0..8) of the 8 x 8 block whose rows are r[0..8). */
ALWAYS_INLINE void transpose8(__m256 *c, const __m256 *r) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    c[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    c[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    c[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    c[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    c[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    c[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    c[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    c[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}
#endif

/* VL elements of row-major row `row` from column l (exact widening; Q8_0: l % VL == 0). */
ALWAYS_INLINE vf row_chunk(const void *w, enum lm_dtype t, int k, long row, long l) {
    switch (t) {
    case LM_DTYPE_F32: return V_LOAD((const float *)w + row * k + l);
    case LM_DTYPE_F16: return V_LOAD_F16((const uint16_t *)w + row * k + l);
    case LM_DTYPE_BF16: return V_LOAD_BF16((const uint16_t *)w + row * k + l);
    default: {
        const struct lm_block_q8_0 *b =
            (const struct lm_block_q8_0 *)w + row * (k / LM_Q8_0_BLOCK) + l / LM_Q8_0_BLOCK;
        return V_MUL(V_LOAD_I8(b->qs + l % LM_Q8_0_BLOCK), V_SET1(S_F16(b->d)));
    }
    }
}

/* pan[k][16] = float32 of the rows of group g (rows past m are zero). */
static void widen_group(float *pan, const void *w, enum lm_dtype wt, long g, int m, int k) {
    const enum lm_dtype base = lm_dtype_unpacked(wt);
    if (lm_dtype_is_packed(wt)) {
        const unsigned char *gp = (const unsigned char *)w + (size_t)g * G * lm_dtype_row_bytes(base, k);
        vf c[NV];
        switch (base) {
        case LM_DTYPE_F16:
            for (long l = 0; l < k; l++) {
                col_f16(c, (const uint16_t *)gp, l);
                for (int v = 0; v < NV; v++) V_STORE(pan + l * G + v * VL, c[v]);
            }
            break;
        case LM_DTYPE_BF16:
            for (long l = 0; l < k; l++) {
                col_bf16(c, (const uint16_t *)gp, l);
                for (int v = 0; v < NV; v++) V_STORE(pan + l * G + v * VL, c[v]);
            }
            break;
        case LM_DTYPE_Q8_0:
            for (int b = 0; b < k / LM_Q8_0_BLOCK; b++) {
                const unsigned char *bp = gp + (size_t)b * QGB;
                vf d[NV];
                for (int v = 0; v < NV; v++) d[v] = V_LOAD_F16((const uint16_t *)bp + v * VL);
                for (int q4 = 0; q4 < LM_Q8_0_BLOCK; q4 += 4)
                    _Pragma("GCC unroll 4") for (int c4 = 0; c4 < 4; c4++) {
                        vf e[NV];
                        col_q8(e, bp + 2 * G + q4 * G, c4);
                        for (int v = 0; v < NV; v++) {
                            e[v] = V_MUL(e[v], d[v]);
                            V_STORE(pan + ((long)b * LM_Q8_0_BLOCK + q4 + c4) * G + v * VL, e[v]);
                        }
                    }
            }
            break;
        default: assert(0);
        }
        return;
    }
    /* Row-major: transpose while widening. */
    const long r0 = g * G;
    long l = 0;
#ifdef SIMD_AVX2
    if (r0 + G <= m) {
        for (; l + 8 <= k; l += 8)
            for (int h = 0; h < 2; h++) {
                __m256 r[8], c[8];
                for (int j = 0; j < 8; j++) r[j] = row_chunk(w, base, k, r0 + h * 8 + j, l);
                transpose8(c, r);
                for (int i = 0; i < 8; i++) _mm256_storeu_ps(pan + (l + i) * G + h * 8, c[i]);
            }
    }
#endif
    for (int j = 0; j < G; j++)
        for (long c = l; c < k; c++) pan[c * G + j] = r0 + j < m ? lm_cpu_weight(w, base, k, r0 + j, c) : 0.0f;
}

#ifdef SIMD_AVX2
/* Row-major weights, one token: groups [g, g + NG) (NG <= 2) transposed 8 x 8 in registers as
 * they stream, then the same per-row chain as every other path (decode from a mapped file).
 * 32 columns a visit: a whole 64-byte line of every bf16/f16 row (a Q8_0 block). */
ALWAYS_INLINE void rm_tile_t1_dt(const enum lm_dtype t, int NG, float *y, const float *x, int k,
                                 const void *w, long g, int m) {
    __m256 acc[2][2] = {{_mm256_setzero_ps(), _mm256_setzero_ps()}, {_mm256_setzero_ps(), _mm256_setzero_ps()}};
    const size_t rb = lm_dtype_row_bytes(t, k), eb = lm_dtype_row_bytes(t, 32); /* bytes per 32 */
    long l = 0;
    for (; l + 32 <= k; l += 32) {
        for (int j = 0; j < NG * G; j++)
            __builtin_prefetch((const char *)w + (size_t)(g * G + j) * rb + (size_t)l / 32 * eb + RM_PREFETCH, 0, 3);
        for (int gi = 0; gi < NG; gi++)
            for (int h = 0; h < 2; h++)
                _Pragma("GCC unroll 4") for (int sub = 0; sub < 4; sub++) {
                    __m256 r[8], c[8];
                    _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++)
                        r[j] = row_chunk(w, t, k, (g + gi) * G + h * 8 + j, l + 8 * sub);
                    transpose8(c, r);
                    _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++)
                        acc[gi][h] = _mm256_fmadd_ps(c[i], _mm256_set1_ps(x[l + 8 * sub + i]), acc[gi][h]);
                }
    }
    for (; l < k; l++)
        for (int gi = 0; gi < NG; gi++)
            for (int h = 0; h < 2; h++) {
                float col[8];
                for (int j = 0; j < 8; j++) col[j] = lm_cpu_weight(w, t, k, (g + gi) * G + h * 8 + j, l);
                acc[gi][h] = _mm256_fmadd_ps(_mm256_loadu_ps(col), _mm256_set1_ps(x[l]), acc[gi][h]);
            }
    for (int gi = 0; gi < NG; gi++) {
        int valid = m - (int)(g + gi) * G < G ? m - (int)(g + gi) * G : G;
        store_group(y + (g + gi) * G, acc[gi], valid);
    }
}

static void rm_tile_t1(int NG, float *y, const float *x, int k, const void *w, enum lm_dtype t,
                       long g, int m) {
    switch (t) {
    case LM_DTYPE_F32: rm_tile_t1_dt(LM_DTYPE_F32, NG, y, x, k, w, g, m); break;
    case LM_DTYPE_F16: rm_tile_t1_dt(LM_DTYPE_F16, NG, y, x, k, w, g, m); break;
    case LM_DTYPE_BF16: rm_tile_t1_dt(LM_DTYPE_BF16, NG, y, x, k, w, g, m); break;
    case LM_DTYPE_Q8_0: rm_tile_t1_dt(LM_DTYPE_Q8_0, NG, y, x, k, w, g, m); break;
    default: assert(0);
    }
}
#endif

/* The outer-product tile: y[t][16 rows] for T <= MK_T tokens over the panel; P: the bf16
 * path's pair order. */
ALWAYS_INLINE void mk_tile(const int T, float *y, long ldy, const float *x, long ldx, int k,
                           const float *pan, int valid, const int P) {
    vf acc[MK_T][NV];
    _Pragma("GCC unroll 6") for (int t = 0; t < T; t++)
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[t][v] = V_ZERO();
    for (long l2 = 0; l2 < k; l2 += P ? 2 : 1) {
    for (int s = 0; s < (P ? 2 : 1); s++) { /* constant trip count: unrolled */
        const long l = P ? l2 + 1 - s : l2;
        if (l >= k) continue;
        vf c[NV];
        col_f32(c, pan, l);
        _Pragma("GCC unroll 6") for (int t = 0; t < T; t++) {
            vf xb = V_SET1(x[t * ldx + l]);
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[t][v] = V_FMA(c[v], xb, acc[t][v]);
        }
    }
    }
    _Pragma("GCC unroll 6") for (int t = 0; t < T; t++) store_group(y + t * ldy, acc[t], valid);
}

#define MK_CASE(T, P) case T: mk_tile(T, y, ldy, x, ldx, k, pan, valid, P); break;
#if MK_T > 3
#define MK_CASES(P) MK_CASE(1, P) MK_CASE(2, P) MK_CASE(3, P) MK_CASE(4, P) MK_CASE(5, P) MK_CASE(6, P)
#else
#define MK_CASES(P) MK_CASE(1, P) MK_CASE(2, P) MK_CASE(3, P)
#endif
static void mk_tiles(int T, float *y, long ldy, const float *x, long ldx, int k, const float *pan,
                     int valid, int P) {
    if (P) {
        switch (T) {
            MK_CASES(1)
        default: assert(0);
        }
        return;
    }
    switch (T) {
        MK_CASES(0)
    default: assert(0);
    }
}

/* ---- the bf16 path on AVX512-BF16 (ops.h, LM_BF16_ACT): VDPBF16PS ----
 *
 * Activations are rounded to bfloat16 rows once per call ([n][ldxb] uint16, pairs as dwords).
 * Two packed columns 2p and 2p + 1 of a group are 64 contiguous bytes (each column 16 rows in
 * the slot order of col_bf16: element e is row e / 2 for even e, 8 + e / 2 for odd e); one
 * vpermw interleaves them so that 32-bit lane j holds (w[2p], w[2p+1]) of row bf_row(j), and
 * VDPBF16PS then adds that row's odd product and then its even product to lane j, the chain of
 * ops.h. The lanes go back to row order once, before the odd last column (a plain FMA) and the
 * store. */
#ifdef LM_SIMD_BF16
#define MKD_T 12 /* tokens per panel tile: 12 accumulators hide VDPBF16PS's latency */

/* Row held by 32-bit lane j after the interleave. */
static inline int bf_row(int j) { return (j & 1) ? 8 + j / 2 : j / 2; }

ALWAYS_INLINE __m512i bf_pair_idx(void) { /* result element 2j <- element j, 2j + 1 <- 16 + j */
    return _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                            22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
}
ALWAYS_INLINE __m512i bf_row_idx(void) { /* row r <- lane 2r (r < 8), lane 2(r - 8) + 1 */
    return _mm512_set_epi32(15, 13, 11, 9, 7, 5, 3, 1, 14, 12, 10, 8, 6, 4, 2, 0);
}
/* Columns 2p, 2p + 1 of a packed bf16 group, interleaved. */
ALWAYS_INLINE __m512bh bf_pair(const uint16_t *g, long p, __m512i idx) {
    return (__m512bh)_mm512_permutexvar_epi16(idx, _mm512_loadu_si512((const void *)(g + 2 * p * G)));
}
/* Activation pair p of a bfloat16 row, in every lane. */
ALWAYS_INLINE __m512bh bf_x2(const uint16_t *xb, long p) {
    int32_t v;
    memcpy(&v, xb + 2 * p, 4);
    return (__m512bh)_mm512_set1_epi32(v);
}
/* Lanes back to row order, the odd last column (w16: its 16 rows widened, row order; x: the
 * token's rounded activation), stored. */
ALWAYS_INLINE void bf_finish(float *y, __m512 acc, int k, __m512 w16, const uint16_t *xb, int valid) {
    vf a = _mm512_permutexvar_ps(bf_row_idx(), acc);
    if (k & 1) a = V_FMA(w16, V_SET1(lm_bf16_to_f32(xb[k - 1])), a);
    store_group(y, &a, valid);
}

/* Streaming tile: NG groups (stride gs elements) x T tokens of packed bf16 weights. */
ALWAYS_INLINE void tile_bfd(const int NG, const int T, float *y, long ldy, const uint16_t *xb, long ldxb,
                            int k, const uint16_t *w, long gs, int valid) {
    const __m512i idx = bf_pair_idx();
    __m512 acc[4][6];
    _Pragma("GCC unroll 4") for (int i = 0; i < NG; i++)
        _Pragma("GCC unroll 6") for (int t = 0; t < T; t++) acc[i][t] = V_ZERO();
    for (long p = 0; p < k / 2; p++) {
        if (NG == 1) {
            __m512bh c = bf_pair(w, p, idx);
            _Pragma("GCC unroll 6") for (int t = 0; t < T; t++) acc[0][t] =
                _mm512_dpbf16_ps(acc[0][t], c, bf_x2(xb + t * ldxb, p));
            continue;
        }
        __m512bh xv[3];
        _Pragma("GCC unroll 3") for (int t = 0; t < T && t < 3; t++) xv[t] = bf_x2(xb + t * ldxb, p);
        _Pragma("GCC unroll 4") for (int i = 0; i < NG; i++) {
            __m512bh c = bf_pair(w + i * gs, p, idx);
            _Pragma("GCC unroll 3") for (int t = 0; t < T && t < 3; t++) acc[i][t] =
                _mm512_dpbf16_ps(acc[i][t], c, xv[t]);
        }
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < NG; i++) {
        vf tail = V_ZERO();
        if (k & 1) col_bf16(&tail, w + i * gs, k - 1);
        _Pragma("GCC unroll 6") for (int t = 0; t < T; t++)
            bf_finish(y + t * ldy + i * G, acc[i][t], k, tail, xb + t * ldxb, i == NG - 1 ? valid : G);
    }
}

#define TILE_BFD_CASE(NG, T)                                                                     \
    case NG * 8 + T: tile_bfd(NG, T, y, ldy, xb, ldxb, k, w, gs, valid); break;
static void tiles_bfd(int NG, int T, float *y, long ldy, const uint16_t *xb, long ldxb, int k,
                      const uint16_t *w, long gs, int valid) {
    switch (NG * 8 + T) {
        TILE_BFD_CASE(1, 1) TILE_BFD_CASE(2, 1) TILE_BFD_CASE(3, 1) TILE_BFD_CASE(4, 1)
        TILE_BFD_CASE(1, 2) TILE_BFD_CASE(2, 2) TILE_BFD_CASE(1, 3) TILE_BFD_CASE(2, 3)
        TILE_BFD_CASE(1, 4) TILE_BFD_CASE(1, 5) TILE_BFD_CASE(1, 6)
    default: assert(0 && "tile shape");
    }
}

/* Bytes of one thread's panel: k / 2 interleaved column pairs of 16 rows, then the odd last
 * column as 16 float32 (row order). */
static inline size_t bfd_panel_bytes(int k) { return (size_t)(k / 2) * 64 + 64; }

/* The panel of group g: from packed weights (interleaved as bf_pair does) or row-major ones
 * (lane j of pair p: the dword (w[r][2p], w[r][2p + 1]) of row r = bf_row(j); rows past m zero). */
static void bfd_panel(uint16_t *pan, const void *w, enum lm_dtype wt, long g, int m, int k) {
    float *tail = (float *)(pan + (size_t)(k / 2) * 32);
    if (lm_dtype_is_packed(wt)) {
        const uint16_t *gp = (const uint16_t *)w + (size_t)g * G * (size_t)k;
        const __m512i idx = bf_pair_idx();
        for (long p = 0; p < k / 2; p++) _mm512_storeu_si512((void *)(pan + p * 32), (__m512i)bf_pair(gp, p, idx));
        if (k & 1) {
            vf c;
            col_bf16(&c, gp, k - 1);
            V_STORE(tail, c);
        }
        return;
    }
    const uint16_t *wr = (const uint16_t *)w;
    for (int j = 0; j < G; j++) {
        const long r = g * G + bf_row(j);
        for (long p = 0; p < k / 2; p++) {
            pan[p * 32 + 2 * j] = r < m ? wr[r * k + 2 * p] : 0;
            pan[p * 32 + 2 * j + 1] = r < m ? wr[r * k + 2 * p + 1] : 0;
        }
    }
    for (int j = 0; j < G; j++) tail[j] = (k & 1) && g * G + j < m ? lm_bf16_to_f32(wr[(g * G + j) * k + k - 1]) : 0.0f;
}

/* A block of MKD_T tokens' rounded activations packed for the panel tile: pair p of token t
 * at xpk[p * MKD_T + t], so one step reads one cache line, not MKD_T rows. */
static void bf_pack_row(const uint16_t *xb, uint32_t *xpk, long t, int k) {
    uint32_t *dst = xpk + (t / MKD_T) * (long)(k / 2) * MKD_T + t % MKD_T;
    for (long p = 0; p < k / 2; p++) memcpy(dst + p * MKD_T, xb + 2 * p, 4);
}

/* The panel tile: y[t][16 rows] for T <= MKD_T tokens (xpk: their packed block; xb: their rows,
 * for an odd k's last column). */
ALWAYS_INLINE void mkd_tile(const int T, float *y, long ldy, const uint32_t *xpk, const uint16_t *xb, long ldxb,
                            int k, const uint16_t *pan, int valid) {
    __m512 acc[MKD_T];
    _Pragma("GCC unroll 12") for (int t = 0; t < T; t++) acc[t] = V_ZERO();
    for (long p = 0; p < k / 2; p++) {
        __m512bh c = (__m512bh)_mm512_loadu_si512((const void *)(pan + p * 32));
        _Pragma("GCC unroll 12") for (int t = 0; t < T; t++) acc[t] =
            _mm512_dpbf16_ps(acc[t], c, (__m512bh)_mm512_set1_epi32((int)xpk[p * MKD_T + t]));
    }
    const vf tail = V_LOAD((const float *)(pan + (size_t)(k / 2) * 32));
    _Pragma("GCC unroll 12") for (int t = 0; t < T; t++) bf_finish(y + t * ldy, acc[t], k, tail, xb + t * ldxb, valid);
}

#define MKD_CASE(T) case T: mkd_tile(T, y, ldy, xpk, xb, ldxb, k, pan, valid); break;
static void mkd_tiles(int T, float *y, long ldy, const uint32_t *xpk, const uint16_t *xb, long ldxb, int k,
                      const uint16_t *pan, int valid) {
    switch (T) {
        MKD_CASE(1) MKD_CASE(2) MKD_CASE(3) MKD_CASE(4) MKD_CASE(5) MKD_CASE(6)
        MKD_CASE(7) MKD_CASE(8) MKD_CASE(9) MKD_CASE(10) MKD_CASE(11) MKD_CASE(12)
    default: assert(0);
    }
}

/* Row x[0..k) rounded to bfloat16 (lm_f32_to_bf16_act: VCVTNE2PS2BF16's rounding). */
static void bf_round_row(const float *x, uint16_t *xb, int k) {
    int l = 0;
    for (; l + 32 <= k; l += 32)
        _mm512_storeu_si512((void *)(xb + l),
                            (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + l + 16), _mm512_loadu_ps(x + l)));
    for (; l < k; l++) xb[l] = lm_f32_to_bf16_act(x[l]);
}
#else
/* Row x[0..k) rounded to bfloat16 and widened back (the FMA targets' bf16 path). */
static void bf_round_row(const float *x, float *xr, int k) {
    for (int l = 0; l < k; l++) xr[l] = lm_bf16_to_f32(lm_f32_to_bf16_act(x[l]));
}
#endif

/* ---- driver ---- */

struct mm_args {
    float *y;
    const float *x;
    const void *w;
    enum lm_dtype wt;
    int n, k, m;
    bool panels;    /* the panel path */
    float *scratch; /* panels: one [k][16] panel per thread (int8 path: one packed group) */
    const int8_t *xq; /* the int8 path (Q8_0 weights): x quantized, [n][k] */
    const float *xd;  /* and its block scales, [n][k / 32] */
    int pairs;        /* the bf16 path on FMAs: x holds bfloat16 values, pair order */
    const uint16_t *xb; /* the bf16 path on VDPBF16PS: x rounded, [n][ldxb] */
    long ldxb;
    const uint32_t *xpk; /* and (panels) packed in blocks of MKD_T tokens (bf_pack_row) */
    long chunk;     /* groups a thread takes at a time */
    atomic_long next; /* the first group nobody has taken */
};

/* Groups [g0, g1) on thread ith. */
static void mm_range(const struct mm_args *a, int ith, long g0, long g1) {
    const int n = a->n, k = a->k, m = a->m;
    if (a->xq) { /* Q8_0 weights, int8 path */
        const long gs = G * (long)lm_dtype_row_bytes(LM_DTYPE_Q8_0, k);
        const bool packed = lm_dtype_is_packed(a->wt);
        if (!packed && n == 1) { /* decode from a mapped file: row by row */
            rows_q8i(a->y, m, a->xq, a->xd, n, k, a->w, g0 * G, g1 * G < m ? g1 * G : m);
            return;
        }
        const int ng = n == 1 ? 4 : 1, tt = n == 1 ? 1 : QI_T;
        for (long g = g0; g < g1; g += ng) {
            const int NG = g1 - g < ng ? (int)(g1 - g) : ng;
            const int valid = m - (int)(g + NG - 1) * G < G ? m - (int)(g + NG - 1) * G : G;
            const unsigned char *wg = (const unsigned char *)a->w + g * gs;
            if (!packed) { /* a batch from a mapped file: this group packed into the thread's panel */
                unsigned char *pan = (unsigned char *)a->scratch + (size_t)ith * (size_t)gs;
                lm_cpu_pack(pan, wg, LM_DTYPE_Q8_0, valid, k);
                wg = pan;
            }
            for (int t = 0; t < n; t += tt)
                tiles_q8i(NG, n - t < tt ? n - t : tt, a->y + (long)t * m + g * G, m, a->xq + (long)t * k,
                          a->xd + (long)t * (k / LM_Q8_0_BLOCK), k, k, wg, gs, valid);
        }
        return;
    }
#ifdef LM_SIMD_BF16
    if (a->xb) { /* bf16 weights, bf16 path: VDPBF16PS */
        const long gs = G * (long)k;
        if (!a->panels) {
            const int ng = n == 1 ? 4 : n == 2 ? 2 : 1, tt = n <= 2 ? n : 6;
            for (long g = g0; g < g1; g += ng) {
                const int NG = g1 - g < ng ? (int)(g1 - g) : ng;
                const int valid = m - (int)(g + NG - 1) * G < G ? m - (int)(g + NG - 1) * G : G;
                for (int t = 0; t < n; t += tt)
                    tiles_bfd(NG, n - t < tt ? n - t : tt, a->y + (long)t * m + g * G, m, a->xb + t * a->ldxb,
                              a->ldxb, k, (const uint16_t *)a->w + g * gs, gs, valid);
            }
            return;
        }
        uint16_t *pan = (uint16_t *)((char *)a->scratch + (size_t)ith * bfd_panel_bytes(k));
        for (long g = g0; g < g1; g++) {
            const int valid = m - (int)g * G < G ? m - (int)g * G : G;
            bfd_panel(pan, a->w, a->wt, g, m, k);
            for (int t = 0; t < n; t += MKD_T)
                mkd_tiles(n - t < MKD_T ? n - t : MKD_T, a->y + (long)t * m + g * G, m,
                          a->xpk + (long)t * (k / 2), a->xb + t * a->ldxb, a->ldxb, k, pan, valid);
        }
        return;
    }
#endif
#ifdef SIMD_AVX2
    if (n == 1 && !lm_dtype_is_packed(a->wt) && !a->pairs) {
        /* Whole groups only: rows past m would be read from outside the matrix. */
        long full = m / G < g1 ? m / G : g1, g = g0;
        for (; g < full; g += full - g < 2 ? 1 : 2) rm_tile_t1(full - g < 2 ? 1 : 2, a->y, a->x, k, a->w, a->wt, g, m);
        if (g < g1) { /* the partial last group through a panel */
            float *pan = a->scratch + (size_t)ith * G * (size_t)k;
            widen_group(pan, a->w, a->wt, g, m, k);
            mk_tiles(1, a->y + g * G, m, a->x, k, k, pan, m - (int)g * G, 0);
        }
        return;
    }
#endif
    if (!a->panels) {
        if (n <= 2) { /* several groups at once: enough independent chains for one token */
            const int ng = n == 1 ? (lm_dtype_unpacked(a->wt) == LM_DTYPE_Q8_0 ? 3 : 4) : 2;
            for (long g = g0; g < g1; g += ng)
                tiles_packed(a->wt, g1 - g < ng ? (int)(g1 - g) : ng, n, a->y, m, a->x, k, a->w, g, 0, a->pairs);
            return;
        }
        /* A batch: MM_BATCH_NG groups at a time, every token over them in tiles of up to
         * MM_BATCH_T tokens; the groups come from memory once and from L1/L2 for the later
         * tiles. */
        for (long g = g0; g < g1; g += MM_BATCH_NG) {
            const int ng = g1 - g < MM_BATCH_NG ? (int)(g1 - g) : MM_BATCH_NG;
            for (int t = 0; t < n; t += MM_BATCH_T)
                tiles_packed(a->wt, ng, n - t < MM_BATCH_T ? n - t : MM_BATCH_T, a->y, m, a->x, k, a->w, g, t,
                             a->pairs);
        }
        return;
    }
    float *pan = a->scratch + (size_t)ith * G * (size_t)k;
    const size_t gb = G * lm_dtype_row_bytes(LM_DTYPE_F32, k);
    /* Tokens in blocks whose activations stay in L2 beside a panel; a panel is widened once per
     * block of tokens. */
    int tb = (int)(MM_XBLOCK / ((long)k * 4)) / MK_T * MK_T;
    if (tb < MK_T) tb = MK_T;
    for (int t0 = 0; t0 < n; t0 += tb) {
        const int t1 = n - t0 < tb ? n : t0 + tb;
        for (long g = g0; g < g1; g++) {
            const int valid = m - (int)g * G < G ? m - (int)g * G : G;
            const float *pw;
            if (a->wt == LM_DTYPE_F32_P16) {
                pw = (const float *)((const unsigned char *)a->w + (size_t)g * gb);
            } else {
                widen_group(pan, a->w, a->wt, g, m, k);
                pw = pan;
            }
            for (int t = t0; t < t1; t += MK_T)
                mk_tiles(t1 - t < MK_T ? t1 - t : MK_T, a->y + (long)t * m + g * G, m, a->x + (long)t * k, k,
                         k, pw, valid, a->pairs);
        }
    }
}

/* Threads take chunks of groups from a shared counter until none are left, rather than one
 * fixed share each: on a shared machine a thread that loses its core for a while no longer
 * holds every other thread at the barrier (the others take its chunks). Which thread computes
 * a row changes nothing in its bits (one chain per output). */
static void mm_task(void *p, int ith, int nth) {
    struct mm_args *a = p;
    const long groups = (a->m + G - 1) / G;
    (void)nth;
    for (;;) {
        long g0 = atomic_fetch_add_explicit(&a->next, a->chunk, memory_order_relaxed);
        if (g0 >= groups) return;
        mm_range(a, ith, g0, g0 + a->chunk < groups ? g0 + a->chunk : groups);
    }
}

/* Rows of x quantized for the int8 path, split over the pool. */
struct qa_args {
    const float *x;
    int8_t *xq;
    float *xd;
    int n, k;
};
static void qa_task(void *p, int ith, int nth) {
    const struct qa_args *a = p;
    long i0, i1;
    lm_pool_split(a->n, ith, nth, 1, &i0, &i1);
    for (long i = i0; i < i1; i++)
        quant_act(a->x + i * a->k, a->xq + i * a->k, a->xd + i * (a->k / LM_Q8_0_BLOCK), a->k);
}

/* Rows of x rounded for the bf16 path (bf_round_row), split over the pool. */
struct br_args {
    const float *x;
    void *xr;   /* [n][ldr] of uint16 (VDPBF16PS) or float32 (FMA targets) */
    long ldr;
    int n, k;
    uint32_t *xpk; /* VDPBF16PS panels: also packed by blocks of tokens (bf_pack_row), or NULL */
};
static void br_task(void *p, int ith, int nth) {
    const struct br_args *a = p;
    long i0, i1;
    lm_pool_split(a->n, ith, nth, 1, &i0, &i1);
#ifdef LM_SIMD_BF16
    for (long i = i0; i < i1; i++) {
        bf_round_row(a->x + i * a->k, (uint16_t *)a->xr + i * a->ldr, a->k);
        if (a->xpk) bf_pack_row((uint16_t *)a->xr + i * a->ldr, a->xpk, i, a->k);
    }
#else
    for (long i = i0; i < i1; i++) bf_round_row(a->x + i * a->k, (float *)a->xr + i * a->ldr, a->k);
#endif
}

static void mm_run(struct lm_pool *pool, struct mm_args *a, bool par) {
    if (par)
        lm_pool_run(pool, mm_task, a);
    else
        mm_task(a, 0, 1);
}

/* The bf16 path's inputs (ops.h, LM_BF16_ACT): a->x rounded to bfloat16 once, into the calling
 * thread's scratch (VDPBF16PS: bf16 rows, and for panels the same packed by token blocks; FMA
 * targets: float32 rows of the rounded values, taken in pair order), the panels after it. False
 * when out of memory. */
static bool bf16_prepare(struct lm_pool *pool, struct mm_args *a, bool par, int nth) {
    const int n = a->n, k = a->k;
#ifdef LM_SIMD_BF16
    const long ldr = (k + 1) / 2 * 2;
    const size_t rbytes = ((size_t)n * (size_t)ldr * 2 + 63) / 64 * 64;
    const size_t blocks = (size_t)(n + MKD_T - 1) / MKD_T; /* token blocks of the packed copy */
    const size_t kbytes = a->panels ? blocks * MKD_T * (size_t)(k / 2) * 4 : 0;
    const size_t xbytes = rbytes + (kbytes + 63) / 64 * 64;
    const size_t pbytes = a->panels ? (size_t)nth * bfd_panel_bytes(k) : 0;
#else
    const long ldr = k;
    const size_t xbytes = ((size_t)n * (size_t)k * 4 + 63) / 64 * 64;
    const size_t pbytes = a->panels ? (size_t)nth * G * (size_t)k * 4 : 0;
#endif
    char *buf = (char *)lm_cpu_scratch((xbytes + pbytes + 3) / 4);
    if (!buf) return false;
    struct br_args r = {a->x, buf, ldr, n, k, NULL};
#ifdef LM_SIMD_BF16
    if (a->panels) r.xpk = (uint32_t *)(buf + rbytes);
#endif
    if (par && (long)n * k >= MM_QA_PAR_MIN)
        lm_pool_run(pool, br_task, &r);
    else
        br_task(&r, 0, 1);
#ifdef LM_SIMD_BF16
    a->xb = (const uint16_t *)buf, a->ldxb = ldr, a->xpk = r.xpk;
#else
    a->x = (const float *)buf, a->pairs = 1;
#endif
    a->scratch = (float *)(buf + xbytes);
    return true;
}

static void mm_matmul(struct lm_pool *pool, float *y, const float *x, const void *w,
                        enum lm_dtype wt, int n, int k, int m) {
    assert(lm_dtype_unpacked(wt) != LM_DTYPE_Q8_0 || k % LM_Q8_0_BLOCK == 0);
    struct mm_args a = {.y = y, .x = x, .w = w, .wt = wt, .n = n, .k = k, .m = m};
    bool par = (long)n * k * m >= MM_PAR_MIN_WORK && m > G;
    int nth = par ? lm_pool_size(pool) : 1;
    if (lm_dtype_unpacked(wt) == LM_DTYPE_Q8_0 && lm_cpu_q8_0_path() == LM_Q8_0_INT8) {
        /* The int8 path: quantize x once ([n][k] int8, then [n][k/32] float scales in the
         * calling thread's scratch), then every thread's tiles read it. */
        const size_t qbytes = ((size_t)n * k + 63) / 64 * 64;
        const size_t dbytes = ((size_t)n * (k / LM_Q8_0_BLOCK) * 4 + 63) / 64 * 64;
        /* Row-major weights in a batch: one packed group per thread after the activations. */
        const size_t pbytes = lm_dtype_is_packed(wt) || n == 1 ? 0 : (size_t)nth * G * lm_dtype_row_bytes(wt, k);
        char *buf = (char *)lm_cpu_scratch((qbytes + dbytes + pbytes + 3) / 4);
        if (!buf) {
            lm_cpu_ops_scalar()->matmul(NULL, y, x, w, wt, n, k, m);
            return;
        }
        struct qa_args q = {x, (int8_t *)buf, (float *)(buf + qbytes), n, k};
        a.scratch = (float *)(buf + qbytes + dbytes);
        if (par && (long)n * k >= MM_QA_PAR_MIN) /* prefill; a small batch is quicker here */
            lm_pool_run(pool, qa_task, &q);
        else
            qa_task(&q, 0, 1);
        a.xq = q.xq, a.xd = q.xd;
        const long groups = (m + G - 1) / G;
        long chunk = (groups + (long)nth * MM_CHUNKS - 1) / ((long)nth * MM_CHUNKS);
        if (n == 1) chunk = (chunk + 3) / 4 * 4; /* whole 4-group tiles */
        a.chunk = chunk < 1 ? 1 : chunk;
        atomic_init(&a.next, 0);
        mm_run(pool, &a, par);
        return;
    }
    a.panels = n >= LM_MM_PANEL_MIN || !lm_dtype_is_packed(wt);
    /* About MM_CHUNKS chunks a thread; streaming tiles want whole 4-group tiles (12 groups:
     * also whole 3-group Q8_0 tiles and 2-group pairs). */
    const long groups = (m + G - 1) / G;
    long chunk = (groups + (long)nth * MM_CHUNKS - 1) / ((long)nth * MM_CHUNKS);
    if (!a.panels) chunk = (chunk + 11) / 12 * 12;
    a.chunk = chunk < 1 ? 1 : chunk;
    atomic_init(&a.next, 0);
    bool ok = true;
    if (lm_dtype_unpacked(wt) == LM_DTYPE_BF16 && lm_cpu_bf16_path() == LM_BF16_ACT)
        ok = bf16_prepare(pool, &a, par, nth);
    else if (a.panels && wt != LM_DTYPE_F32_P16)
        ok = (a.scratch = lm_cpu_scratch((size_t)nth * G * (size_t)k)) != NULL;
    if (!ok) { /* no memory for panels: the scalar reference still gives the bits */
        lm_cpu_ops_scalar()->matmul(NULL, y, x, w, wt, n, k, m);
        return;
    }
    mm_run(pool, &a, par);
}
