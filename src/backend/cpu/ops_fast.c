/* ops_fast.c: run-time choice of the fast kernels (ops.h, lm_cpu_ops_fast).
 *
 * The kernels are compiled once per vector target (kern_avx512vnni.c, kern_avx512.c,
 * kern_avx2.c, kern_generic.c, each with its own target flags), so one binary carries them all;
 * the first call asks the CPU (cpuid through __builtin_cpu_supports, which also checks that the
 * OS saves the AVX / AVX-512 registers) and keeps the best target it can run:
 * avx512bf16 > avx512vnni > avx512 > avx2 > generic (neon on AArch64).
 * LM_CPU_KERNELS=avx512bf16|avx512vnni|avx512|avx2|generic|neon in the environment (any case)
 * asks for one; a target this build lacks or this CPU cannot run is passed over for the best
 * one, and ->name says which ran; either case, and a name that is no target of this build (a
 * typo), is reported once on stderr.
 * Also the process's Q8_0 path (ops.h, lm_cpu_q8_0_path: LM_CPU_Q8_ACT, an on/off switch read
 * through base/env.h: 0/off/false/no asks for the dequantize path), and its bf16 path (ops.h,
 * lm_cpu_bf16_path: LM_CPU_BF16_ACT, default off). */
#include <ctype.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "base/env.h"

static const struct lm_cpu_ops *g_fast;
static pthread_once_t g_fast_once = PTHREAD_ONCE_INIT;

const char *const *lm_cpu_ops_targets(void) {
#if defined(__x86_64__)
    static const char *const names[] = {"avx512bf16", "avx512vnni", "avx512", "avx2", "generic", NULL};
#elif defined(__aarch64__) && defined(__ARM_NEON)
    static const char *const names[] = {"neon", NULL};
#else
    static const char *const names[] = {"generic", NULL};
#endif
    return names;
}

const struct lm_cpu_ops *lm_cpu_ops_target(const char *name) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (!strcmp(name, "avx512bf16"))
        return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vnni") &&
                       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
                       __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") &&
                       __builtin_cpu_supports("fma")
                   ? lm_cpu_ops_avx512bf16()
                   : NULL;
    if (!strcmp(name, "avx512vnni"))
        return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
                       __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512f") &&
                       __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
                   ? lm_cpu_ops_avx512vnni()
                   : NULL;
    if (!strcmp(name, "avx512"))
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") &&
                       __builtin_cpu_supports("fma")
                   ? lm_cpu_ops_avx512()
                   : NULL;
    /* F16C has no __builtin_cpu_supports name in GCC 12; every AVX2 CPU made has it (Intel
     * Haswell, AMD Excavator/Zen on). */
    if (!strcmp(name, "avx2"))
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? lm_cpu_ops_avx2() : NULL;
#endif
    const struct lm_cpu_ops *g = lm_cpu_ops_generic();
    return !strcmp(name, g->name) ? g : NULL;
}

static void choose(void) {
    const char *env = getenv("LM_CPU_KERNELS");
    char want[32] = ""; /* the value in lower case: AVX2 means avx2 */
    for (size_t i = 0; env && env[i] && i + 1 < sizeof want; i++) want[i] = (char)tolower((unsigned char)env[i]);
    bool known = false;
    if (*want) {
        for (const char *const *t = lm_cpu_ops_targets(); *t; t++) known |= !strcmp(want, *t);
        if (!known) {
            fprintf(stderr, "lumen: LM_CPU_KERNELS=%s is not a kernel target of this build (", env);
            for (const char *const *t = lm_cpu_ops_targets(); *t; t++)
                fprintf(stderr, "%s%s", t == lm_cpu_ops_targets() ? "" : ", ", *t);
            fprintf(stderr, "); using the best one this CPU runs\n");
        }
        g_fast = lm_cpu_ops_target(want);
    }
    for (const char *const *t = lm_cpu_ops_targets(); !g_fast && *t; t++) g_fast = lm_cpu_ops_target(*t);
    if (known && strcmp(want, g_fast->name))
        fprintf(stderr, "lumen: LM_CPU_KERNELS=%s: this CPU cannot run that target; using %s\n", env, g_fast->name);
}

/* The matmul paths of the process (ops.h: Q8_0 from LM_CPU_Q8_ACT, bf16 from LM_CPU_BF16_ACT):
 * -1 until the first call to either reads both switches, once (the first calls may come from
 * every pool thread at once: one warning for a bad value). A path set before that
 * (lm_cpu_set_*_path) stays. */
static atomic_int g_q8_0_path = -1, g_bf16_path = -1;
static pthread_once_t g_paths_once = PTHREAD_ONCE_INIT;

static void read_paths_env(void) {
    const int q8 = lm_env_flag("LM_CPU_Q8_ACT", true) ? LM_Q8_0_INT8 : LM_Q8_0_DEQUANT;
    const int bf16 = lm_env_flag("LM_CPU_BF16_ACT", false) ? LM_BF16_ACT : LM_BF16_F32;
    int expected = -1;
    atomic_compare_exchange_strong(&g_q8_0_path, &expected, q8);
    expected = -1;
    atomic_compare_exchange_strong(&g_bf16_path, &expected, bf16);
}

static int path_of(atomic_int *p) {
    int v = atomic_load_explicit(p, memory_order_relaxed);
    if (v < 0) {
        pthread_once(&g_paths_once, read_paths_env);
        v = atomic_load(p);
    }
    return v;
}

enum lm_q8_0_path lm_cpu_q8_0_path(void) { return (enum lm_q8_0_path)path_of(&g_q8_0_path); }
void lm_cpu_set_q8_0_path(enum lm_q8_0_path p) { atomic_store(&g_q8_0_path, (int)p); }
const char *lm_q8_0_path_name(enum lm_q8_0_path p) { return p == LM_Q8_0_INT8 ? "int8" : "dequant"; }

enum lm_bf16_path lm_cpu_bf16_path(void) { return (enum lm_bf16_path)path_of(&g_bf16_path); }
void lm_cpu_set_bf16_path(enum lm_bf16_path p) { atomic_store(&g_bf16_path, (int)p); }
const char *lm_bf16_path_name(enum lm_bf16_path p) { return p == LM_BF16_ACT ? "bf16" : "f32"; }

const struct lm_cpu_ops *lm_cpu_ops_fast(void) {
    pthread_once(&g_fast_once, choose);
    return g_fast;
}
