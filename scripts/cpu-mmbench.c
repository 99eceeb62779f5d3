/* cpu-mmbench.c: the fast CPU matmul alone (backend/cpu/ops.h), bf16 weights packed as a loaded
 * model's are, float32 chain (LM_BF16_F32) against the bf16 path (LM_BF16_ACT), on Qwen3-0.6B's
 * shapes: GMAC/s for n tokens, T threads (the best of 5 timed rounds after a warm-up round, each
 * round the mean of several calls). A development probe for docs/perf-notes-cpu.md ("bf16
 * activations"). Usage: cpu-mmbench [THREADS] (default 2).
 * Built by scripts/device-prebuild.sh with LM_PREBUILD_MMBENCH=1, or by hand from a build dir:
 *   cc -O2 -Isrc scripts/cpu-mmbench.c BUILD/liblm_backend.a BUILD/liblm_base.a -lm -lpthread */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "backend/cpu/ops.h"
#include "base/threadpool.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const int nt = argc > 1 ? atoi(argv[1]) : 2;
    const int shapes[][2] = {{1024, 3072}, {3072, 1024}, {1024, 4096}};
    const int ns[] = {512, 16, 1};
    struct lm_pool *pool;
    lm_pool_create(nt, &pool);
    const struct lm_cpu_ops *f = lm_cpu_ops_fast();
    printf("kernels %s, %d threads\n", f->name, nt);
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const int k = shapes[si][0], m = shapes[si][1];
        uint16_t *w = malloc(sizeof(uint16_t) * (size_t)m * k);
        for (long i = 0; i < (long)m * k; i++) w[i] = lm_f32_to_bf16((float)((i * 7919) % 2001 - 1000) * 1e-4f);
        void *wp = malloc(lm_cpu_packed_bytes(LM_DTYPE_BF16, m, k));
        lm_cpu_pack(wp, w, LM_DTYPE_BF16, m, k);
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
            const int n = ns[ni];
            float *x = malloc(sizeof(float) * (size_t)n * k), *y = malloc(sizeof(float) * (size_t)n * m);
            for (long i = 0; i < (long)n * k; i++) x[i] = (float)((i * 104729) % 2001 - 1000) * 1e-3f;
            double best[2] = {1e9, 1e9};
            for (int path = 0; path < 2; path++) {
                lm_cpu_set_bf16_path(path ? LM_BF16_ACT : LM_BF16_F32);
                const int calls = n >= 512 ? 2 : n >= 16 ? 20 : 100;
                for (int r = 0; r < 6; r++) {
                    double t0 = now();
                    for (int c = 0; c < calls; c++) f->matmul(pool, y, x, wp, lm_dtype_packed(LM_DTYPE_BF16), n, k, m);
                    double dt = (now() - t0) / calls;
                    if (r && dt < best[path]) best[path] = dt;
                }
            }
            const double macs = (double)n * k * m;
            printf("k %5d m %5d n %4d: f32 %7.1f GMAC/s, bf16 act %7.1f GMAC/s (%.2fx)\n", k, m, n,
                   macs / best[0] * 1e-9, macs / best[1] * 1e-9, best[0] / best[1]);
            free(x), free(y);
        }
        free(w), free(wp);
    }
    lm_pool_destroy(pool);
    return 0;
}
