/* kern_avx512vnni.c: the avx512 kernels (kern_avx512.c) for CPUs that also have AVX512-VNNI
 * (with VL and BW: Intel Cascade Lake / Ice Lake on, AMD Zen 4 on), chosen at run time by
 * ops_fast.c before plain avx512. The only difference is the int8 dot product of the Q8_0 int8
 * path (ops.h, LM_Q8_0_INT8): one vpdpbusd instead of maddubs + madd + add. Integer sums are
 * exact either way, so every result has the same bits as the other targets'. */
#if defined(__x86_64__)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512vl,avx512bw,avx512vnni,avx2,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512vnni,avx2,fma,f16c")
#endif

#define LM_SIMD_LEVEL LM_SIMD_AVX512
#define LM_SIMD_VNNI 1
#define LM_KERN_TABLE lm_cpu_ops_avx512vnni
#include "backend/cpu/kern_matmul.h"
#include "backend/cpu/kern_ops.h"

#if defined(__clang__)
#pragma clang attribute pop
#endif
#else
typedef int lm_kern_avx512vnni_unused; /* not an x86-64 build: nothing here */
#endif
