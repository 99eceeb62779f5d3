/* simd.h: the small vector layer of the CPU matmul kernels (internal to backend/cpu).
 *
 * VL lanes of float32 for the build's target: AVX-512F (16 lanes) only when the compiler targets
 * it (-march=native on a CPU that has it), else AVX2+FMA+F16C (8 lanes), else GCC vector
 * extensions (4 lanes: SSE2 on any x86-64, NEON on AArch64, scalars elsewhere). Besides the
 * float operations it widens VL bfloat16, float16 or int8 values to float32. */
#ifndef LM_BACKEND_CPU_SIMD_H
#define LM_BACKEND_CPU_SIMD_H

#include <stdint.h>
#include <string.h>

#include "backend/cpu/ops.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

#if defined(__AVX512F__)
#include <immintrin.h>
#define VL 16
#define SIMD_NAME "avx512"
typedef __m512 vf;
#define V_ZERO() _mm512_setzero_ps()
#define V_SET1(x) _mm512_set1_ps(x)
#define V_LOAD(p) _mm512_loadu_ps(p)
#define V_STORE(p, v) _mm512_storeu_ps(p, v)
#define V_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define V_MUL(a, b) _mm512_mul_ps(a, b)
#define V_HSUM(v) _mm512_reduce_add_ps(v)
#define V_LOAD_BF16(p)                                                                          \
    _mm512_castsi512_ps(                                                                        \
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define V_LOAD_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define V_LOAD_I8(p) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p))))
#define S_F16(h) _cvtsh_ss(h)
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
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
#define V_MUL(a, b) _mm256_mul_ps(a, b)
ALWAYS_INLINE float simd_hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#define V_HSUM(v) simd_hsum256(v)
#define V_LOAD_BF16(p)                                                                          \
    _mm256_castsi256_ps(                                                                        \
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#define V_LOAD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define V_LOAD_I8(p)                                                                            \
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p))))
#define S_F16(h) _cvtsh_ss(h)
#else
#define VL 4
#define SIMD_NAME "generic"
typedef float vf __attribute__((vector_size(VL * 4)));
static inline vf simd_load(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline vf simd_set1(float x) {
    vf v;
    for (int i = 0; i < VL; i++) v[i] = x;
    return v;
}
static inline float simd_hsum(vf v) {
    float s = 0;
    for (int i = 0; i < VL; i++) s += v[i];
    return s;
}
static inline vf simd_bf16(const uint16_t *p) {
    vf v;
    for (int i = 0; i < VL; i++) v[i] = lm_bf16_to_f32(p[i]);
    return v;
}
static inline vf simd_f16(const uint16_t *p) {
    vf v;
    for (int i = 0; i < VL; i++) v[i] = lm_f16_to_f32(p[i]);
    return v;
}
static inline vf simd_i8(const int8_t *p) {
    vf v;
    for (int i = 0; i < VL; i++) v[i] = (float)p[i];
    return v;
}
#define V_ZERO() simd_set1(0.0f)
#define V_SET1(x) simd_set1(x)
#define V_LOAD(p) simd_load(p)
#define V_STORE(p, v) memcpy((p), &(v), sizeof(vf))
#define V_FMA(a, b, c) ((a) * (b) + (c))
#define V_MUL(a, b) ((a) * (b))
#define V_HSUM(v) simd_hsum(v)
#define V_LOAD_BF16(p) simd_bf16((const uint16_t *)(p))
#define V_LOAD_F16(p) simd_f16((const uint16_t *)(p))
#define V_LOAD_I8(p) simd_i8((const int8_t *)(p))
#define S_F16(h) lm_f16_to_f32(h)
#endif

#endif
