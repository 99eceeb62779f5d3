/* kern_avx2.c: the fast kernels for AVX2 + FMA + F16C (x86-64 from Haswell / Zen 1 on), compiled
 * for that target whatever the build's -march, and chosen at run time by ops_fast.c when the CPU
 * has those features. The code is kern_matmul.h and kern_ops.h (shared by every target). */
#if defined(__x86_64__) || defined(__i386__)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif

#define LM_SIMD_LEVEL LM_SIMD_AVX2
#define LM_KERN_TABLE lm_cpu_ops_avx2
#include "backend/cpu/kern_matmul.h"
#include "backend/cpu/kern_ops.h"

#if defined(__clang__)
#pragma clang attribute pop
#endif
#else
typedef int lm_kern_avx2_unused; /* not an x86 build: nothing here (ISO C wants a declaration) */
#endif
