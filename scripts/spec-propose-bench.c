/* spec-propose-bench.c: what an n-gram proposal costs the engine thread (perf-notes v16).
 *
 * Build and run from the repository root after a build in build/:
 *   cc -O2 -Isrc scripts/spec-propose-bench.c build/liblm_engine.a build/liblm_base.a -ljansson \
 *      -o /tmp/spec-propose-bench && /tmp/spec-propose-bench
 *
 * For histories of 4k to 32k tokens, 256 proposals (one step of 256 decoding sequences) with
 * lm_spec_propose_indexed (prompt_lookup 4 / 2, 3 draft tokens), against the scan the first
 * version did: for each n-gram size, every earlier position. Three histories: uniform over the
 * 151,936-token vocabulary (the last token rarely recurs: no match), one drawn from 64 values
 * (the last token recurs every ~64 positions, a match of the longest size is rare: the index
 * walks every candidate), and a loop of 37 tokens (greedy output that repeats itself: the
 * earliest candidate matches in full). Prints a table of milliseconds per 256 proposals; the
 * drafts of the two methods must agree. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/spec.h"

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

/* A scan of the whole history (the first version's method): n-gram sizes from max down, the
 * earliest start of each (the indexed proposer's and vLLM's choice). */
static int scan(const struct lm_spec_params *p, const int32_t *t, int n, int k, int32_t *d) {
    for (int g = p->prompt_lookup_max; g >= p->prompt_lookup_min; g--) {
        if (g >= n) continue;
        for (int j = 0; j + g < n; j++) {
            if (t[j] != t[n - g] || memcmp(t + j, t + n - g, sizeof *t * (size_t)g)) continue;
            int m = 0;
            while (m < k && j + g + m < n) d[m] = t[j + g + m], m++;
            return m;
        }
    }
    return 0;
}

int main(void) {
    const struct lm_spec_params p = {3, 4, 2, 0};
    printf("| history | values | scan, ms / 256 | indexed, ms / 256 | drafts agree |\n");
    printf("| ---: | --- | ---: | ---: | --- |\n");
    static const char *const kinds[] = {"151936, uniform", "64, uniform", "a loop of 37 tokens"};
    for (int kind = 0; kind < 3; kind++) {
        for (int n = 4096; n <= 32768; n *= 2) {
            int32_t *t = malloc(sizeof *t * (size_t)n);
            uint64_t r = 88172645463325252ull;
            for (int i = 0; i < n; i++) {
                r ^= r << 13, r ^= r >> 7, r ^= r << 17;
                t[i] = kind == 2 ? (int32_t)((i % 37) * 4099 % 151936)
                                 : (int32_t)(r % (uint64_t)(kind ? 64 : 151936));
            }
            struct lm_spec_index x = {0};
            if (lm_spec_index_extend(&x, t, n)) return 1;
            int32_t a[LM_SPEC_MAX_TOKENS], b[LM_SPEC_MAX_TOKENS];
            int agree = 1, na = 0, nb = 0;
            double t0 = now_ms();
            for (int s = 0; s < 256; s++) na = scan(&p, t, n, 3, a);
            double t1 = now_ms();
            for (int s = 0; s < 256; s++) nb = lm_spec_propose_indexed(&p, &x, t, n, 3, b);
            double t2 = now_ms();
            agree = na == nb && !memcmp(a, b, sizeof *a * (size_t)na);
            printf("| %d | %s | %.3f | %.3f | %s (%d) |\n", n, kinds[kind], t1 - t0, t2 - t1,
                   agree ? "yes" : "NO", na);
            lm_spec_index_free(&x);
            free(t);
            if (!agree) return 1;
        }
    }
    return 0;
}
