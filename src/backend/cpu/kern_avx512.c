/* kern_avx512.c: the fast kernels for AVX-512F (16 float32 lanes; with AVX2, FMA and F16C, which
 * every AVX-512 CPU has), compiled for that target whatever the build's -march, and chosen at run
 * time by ops_fast.c when the CPU and the OS support it. The code is kern_matmul.h and
 * kern_ops.h (shared by every target). CPUs with VNNI run kern_avx512vnni.c instead (the int8
 * Q8_0 path's exact integer dot products in one instruction), and those that also have
 * AVX512-BF16 kern_avx512bf16.c (the bf16 path's pair chain in one instruction); here that chain
 * is two FMAs a pair, with the same bits (ops.h, LM_BF16_ACT). */
#if defined(__x86_64__)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx512f,avx2,fma,f16c")
#endif

#define LM_SIMD_LEVEL LM_SIMD_AVX512
#define LM_KERN_TABLE lm_cpu_ops_avx512
#include "backend/cpu/kern_matmul.h"
#include "backend/cpu/kern_ops.h"

#if defined(__clang__)
#pragma clang attribute pop
#endif
#else
typedef int lm_kern_avx512_unused; /* not an x86-64 build: nothing here */
#endif
