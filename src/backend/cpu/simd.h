/* simd.h: the small vector layer of the fast CPU kernels (internal to backend/cpu).
 *
 * VL lanes of float32 for one vector target, chosen by LM_SIMD_LEVEL, which the including file
 * defines before including it (kern_avx512.c, kern_avx2.c, kern_generic.c: one object file per
 * target, the best one picked at run time by ops_fast.c):
 *   LM_SIMD_AVX512  AVX-512F (16 lanes; the file is compiled with #pragma GCC target; with
 *                   LM_SIMD_VNNI also defined, the int8 dot products use AVX512-VNNI);
 *   LM_SIMD_AVX2    AVX2 + FMA + F16C (8 lanes; likewise);
 *   LM_SIMD_GENERIC GCC vector extensions of 4 lanes: NEON on AArch64 (vfmaq_f32), SSE2 on any
 *                   x86-64, scalars elsewhere.
 * Every target's V_FMA is a fused multiply-add (one rounding), as the scalar reference's fmaf,
 * so each target's matmul gives the reference's bits (ops.h). Besides the float operations it
 * widens VL bfloat16, float16 or int8 values to float32 exactly. */
#ifndef LM_BACKEND_CPU_SIMD_H
#define LM_BACKEND_CPU_SIMD_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend/cpu/ops.h"

#define LM_SIMD_GENERIC 1
#define LM_SIMD_AVX2 2
#define LM_SIMD_AVX512 3

#ifndef LM_SIMD_LEVEL
#error "define LM_SIMD_LEVEL (LM_SIMD_GENERIC, LM_SIMD_AVX2 or LM_SIMD_AVX512) before simd.h"
#endif

#define ALWAYS_INLINE static inline __attribute__((always_inline))

#if LM_SIMD_LEVEL == LM_SIMD_AVX512
#include <immintrin.h>
#define VL 16
#if defined(LM_SIMD_BF16)
#define SIMD_NAME "avx512bf16" /* kern_avx512bf16.c: avx512vnni, with vdpbf16ps on the bf16 path */
#elif defined(LM_SIMD_VNNI)
#define SIMD_NAME "avx512vnni" /* kern_avx512vnni.c: the same, with vpdpbusd int8 dot products */
#else
#define SIMD_NAME "avx512"
#endif
#define SIMD_AVX512 1
typedef __m512 vf;
#define V_ZERO() _mm512_setzero_ps()
#define V_SET1(x) _mm512_set1_ps(x)
#define V_LOAD(p) _mm512_loadu_ps(p)
#define V_STORE(p, v) _mm512_storeu_ps(p, v)
#define V_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define V_ADD(a, b) _mm512_add_ps(a, b)
#define V_MUL(a, b) _mm512_mul_ps(a, b)
#define V_MAX(a, b) _mm512_max_ps(a, b)
#define V_HSUM(v) _mm512_reduce_add_ps(v)
#define V_HMAX(v) _mm512_reduce_max_ps(v)
#define V_LOAD_BF16(p)                                                                          \
    _mm512_castsi512_ps(                                                                        \
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define V_LOAD_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define V_LOAD_I8(p) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p))))
#define S_F16(h) _cvtsh_ss(h)

#elif LM_SIMD_LEVEL == LM_SIMD_AVX2
#include <immintrin.h>
#define VL 8
#define SIMD_NAME "avx2"
#define SIMD_AVX2 1
typedef __m256 vf;
#define V_ZERO() _mm256_setzero_ps()
#define V_SET1(x) _mm256_set1_ps(x)
#define V_LOAD(p) _mm256_loadu_ps(p)
#define V_STORE(p, v) _mm256_storeu_ps(p, v)
#define V_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define V_ADD(a, b) _mm256_add_ps(a, b)
#define V_MUL(a, b) _mm256_mul_ps(a, b)
#define V_MAX(a, b) _mm256_max_ps(a, b)
ALWAYS_INLINE float simd_hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
ALWAYS_INLINE float simd_hmax256(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#define V_HSUM(v) simd_hsum256(v)
#define V_HMAX(v) simd_hmax256(v)
#define V_LOAD_BF16(p)                                                                          \
    _mm256_castsi256_ps(                                                                        \
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#define V_LOAD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define V_LOAD_I8(p)                                                                            \
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p))))
#define S_F16(h) _cvtsh_ss(h)

#elif LM_SIMD_LEVEL == LM_SIMD_GENERIC
#define VL 4
#define SIMD_GENERIC 1
typedef float vf __attribute__((vector_size(VL * 4)));
typedef uint32_t vu __attribute__((vector_size(VL * 4)));
#if defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define SIMD_NAME "neon"
ALWAYS_INLINE vf simd_fma(vf a, vf b, vf c) {
    return (vf)vfmaq_f32((float32x4_t)c, (float32x4_t)a, (float32x4_t)b);
}
#else
#define SIMD_NAME "generic"
/* Lane by lane fmaf: fused (the reference's rounding) on every CPU; without FMA hardware this
 * is libm's exact software fma, slow but only for CPUs older than AVX2 (2013). */
ALWAYS_INLINE vf simd_fma(vf a, vf b, vf c) {
    vf r = c;
    for (int i = 0; i < VL; i++) r[i] = fmaf(a[i], b[i], c[i]);
    return r;
}
#endif
ALWAYS_INLINE vf simd_load(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}
ALWAYS_INLINE vf simd_set1(float x) {
    vf v = {x, x, x, x};
    return v;
}
ALWAYS_INLINE float simd_hsum(vf v) {
    float s = 0;
    for (int i = 0; i < VL; i++) s += v[i];
    return s;
}
ALWAYS_INLINE float simd_hmax(vf v) {
    float s = v[0];
    for (int i = 1; i < VL; i++) s = v[i] > s ? v[i] : s;
    return s;
}
ALWAYS_INLINE vf simd_max(vf a, vf b) {
    vf r = a;
    for (int i = 0; i < VL; i++) r[i] = a[i] > b[i] ? a[i] : b[i];
    return r;
}
/* Widening builds the vector from an initializer, never lane by lane into an uninitialized
 * one (GCC 12 warned "'v' may be used uninitialized" on that form). */
ALWAYS_INLINE vf simd_bf16(const uint16_t *p) {
    vu u = {(uint32_t)p[0] << 16, (uint32_t)p[1] << 16, (uint32_t)p[2] << 16, (uint32_t)p[3] << 16};
    return (vf)u;
}
ALWAYS_INLINE vf simd_f16(const uint16_t *p) {
    vf v = {lm_f16_to_f32(p[0]), lm_f16_to_f32(p[1]), lm_f16_to_f32(p[2]), lm_f16_to_f32(p[3])};
    return v;
}
ALWAYS_INLINE vf simd_i8(const int8_t *p) {
    vf v = {(float)p[0], (float)p[1], (float)p[2], (float)p[3]};
    return v;
}
#define V_ZERO() simd_set1(0.0f)
#define V_SET1(x) simd_set1(x)
#define V_LOAD(p) simd_load(p)
#define V_STORE(p, v) memcpy((p), &(v), sizeof(vf))
#define V_FMA(a, b, c) simd_fma(a, b, c)
#define V_ADD(a, b) ((a) + (b))
#define V_MUL(a, b) ((a) * (b))
#define V_MAX(a, b) simd_max(a, b)
#define V_HSUM(v) simd_hsum(v)
#define V_HMAX(v) simd_hmax(v)
#define V_LOAD_BF16(p) simd_bf16((const uint16_t *)(p))
#define V_LOAD_F16(p) simd_f16((const uint16_t *)(p))
#define V_LOAD_I8(p) simd_i8((const int8_t *)(p))
#define S_F16(h) lm_f16_to_f32(h)

#else
#error "unknown LM_SIMD_LEVEL"
#endif

#endif
