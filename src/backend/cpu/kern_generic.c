/* kern_generic.c: the fast kernels with 4-lane GCC vector extensions: NEON on AArch64, SSE2 on
 * any x86-64 (the run-time fallback below AVX2), plain scalars elsewhere. Compiled with the
 * build's own flags. The code is kern_matmul.h and kern_ops.h (shared by every target). */
#define LM_SIMD_LEVEL LM_SIMD_GENERIC
#define LM_KERN_TABLE lm_cpu_ops_generic
#include "backend/cpu/kern_matmul.h"
#include "backend/cpu/kern_ops.h"
