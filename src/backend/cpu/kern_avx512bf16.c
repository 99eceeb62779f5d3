/* kern_avx512bf16.c: the avx512vnni kernels (kern_avx512vnni.c) for CPUs that also have
 * AVX512-BF16 (Intel Cooper Lake and Sapphire Rapids on, AMD Zen 4 on), chosen at run time by
 * ops_fast.c before avx512vnni. The only difference is the bf16 path of bfloat16 weights (ops.h,
 * LM_BF16_ACT, off unless LM_CPU_BF16_ACT=1): its pair chain runs as VDPBF16PS, 32 products an
 * instruction (kern_matmul.h, LM_SIMD_BF16); every other result has the other targets' bits. */
#if defined(__x86_64__)
#if defined(__clang__)
#pragma clang attribute push(                                                                    \
    __attribute__((target("avx512f,avx512vl,avx512bw,avx512vnni,avx512bf16,avx2,fma,f16c"))),    \
    apply_to = function)
#else
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512vnni,avx512bf16,avx2,fma,f16c")
#endif

#define LM_SIMD_LEVEL LM_SIMD_AVX512
#define LM_SIMD_VNNI 1
#define LM_SIMD_BF16 1
#define LM_KERN_TABLE lm_cpu_ops_avx512bf16
#include "backend/cpu/kern_matmul.h"
#include "backend/cpu/kern_ops.h"

#if defined(__clang__)
#pragma clang attribute pop
#endif
#else
typedef int lm_kern_avx512bf16_unused; /* not an x86-64 build: nothing here */
#endif
