/* matmul.c: the fast matmul of every weight dtype (see matmul.h for the paths and the fixed
 * order of operations that makes them batch invariant). */
#include "backend/cpu/matmul.h"

#include <assert.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

#include "backend/cpu/quant.h"
#include "backend/cpu/simd.h"

/* Work below this many multiply-adds runs on the calling thread: waking the pool costs more. */
enum { PAR_MIN_WORK = 1 << 15 };
/* Rows a thread widens into its float32 panel at a time (panel path). */
enum { PANEL_ROWS = 16 };
#ifndef MM_PR
#define MM_PR 3
#endif

const char *lm_cpu_simd_name(void) { return SIMD_NAME; }

/* ---- register tiles, weights widened as they stream ----
 *
 * tile_<dtype>(R, T, ...): y[t * ldy + r] = dot(x[t * ldx ..], w[r * ldw ..]) for r < R rows and
 * t < T tokens, each (r, t) in the fixed order of matmul.h. R and T are compile-time constants
 * after inlining (R <= 8 with T = 1, R <= 4 with T <= 3): at most 12 accumulators plus the
 * loads fit AVX2's 16 registers. */

#define S_LOAD_F32(p) (*(p))
#define S_LOAD_BF16(p) lm_bf16_to_f32(*(p))
#define S_LOAD_F16(p) lm_f16_to_f32(*(p))

#define DEFINE_TILE(SUF, WT, WLOAD, SLOAD)                                                       \
    ALWAYS_INLINE void tile_##SUF(const int R, const int T, float *y, long ldy, const float *x,   \
                                  long ldx, int k, const WT *w, long ldw) {                      \
        vf acc[8][3];                                                                            \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)                                      \
            _Pragma("GCC unroll 3") for (int t = 0; t < T; t++) acc[r][t] = V_ZERO();            \
        int l = 0;                                                                               \
        for (; l + VL <= k; l += VL) {                                                           \
            vf xv[3];                                                                            \
            _Pragma("GCC unroll 3") for (int t = 0; t < T; t++) xv[t] = V_LOAD(x + t * ldx + l); \
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                \
                vf wv = WLOAD(w + r * ldw + l);                                                  \
                _Pragma("GCC unroll 3") for (int t = 0; t < T; t++) acc[r][t] =                  \
                    V_FMA(wv, xv[t], acc[r][t]);                                                 \
            }                                                                                    \
        }                                                                                        \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)                                      \
            _Pragma("GCC unroll 3") for (int t = 0; t < T; t++) {                                \
                float s = V_HSUM(acc[r][t]);                                                     \
                for (int j = l; j < k; j++) s += SLOAD(w + r * ldw + j) * x[t * ldx + j];        \
                y[t * ldy + r] = s;                                                              \
            }                                                                                    \
    }

DEFINE_TILE(f32, float, V_LOAD, S_LOAD_F32)
DEFINE_TILE(bf16, uint16_t, V_LOAD_BF16, S_LOAD_BF16)
DEFINE_TILE(f16, uint16_t, V_LOAD_F16, S_LOAD_F16)

/* Q8_0: w is R rows of ldw blocks; the scale of each block is widened once per row and the
 * quants of each VL-chunk become d * q (exact) before the same fma as the other dtypes. */
ALWAYS_INLINE void tile_q8_0(const int R, const int T, float *y, long ldy, const float *x,
                             long ldx, int k, const struct lm_block_q8_0 *w, long ldw) {
    vf acc[8][3];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 3") for (int t = 0; t < T; t++) acc[r][t] = V_ZERO();
    const int nb = k / LM_Q8_0_BLOCK;
    for (int b = 0; b < nb; b++) {
        float d[8];
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) d[r] = S_F16(w[r * ldw + b].d);
        const float *xb = x + (long)b * LM_Q8_0_BLOCK;
        _Pragma("GCC unroll 8") for (int c = 0; c < LM_Q8_0_BLOCK; c += VL) {
            vf xv[3];
            _Pragma("GCC unroll 3") for (int t = 0; t < T; t++) xv[t] = V_LOAD(xb + t * ldx + c);
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
                vf wv = V_MUL(V_LOAD_I8(w[r * ldw + b].qs + c), V_SET1(d[r]));
                _Pragma("GCC unroll 3") for (int t = 0; t < T; t++) acc[r][t] =
                    V_FMA(wv, xv[t], acc[r][t]);
            }
        }
    }
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 3") for (int t = 0; t < T; t++) y[t * ldy + r] = V_HSUM(acc[r][t]);
}

/* Dispatch of a runtime (R, T) to the constant-shape tiles. */
#define TILE_CASE(SUF, R, T)                                                                     \
    case R * 4 + T: tile_##SUF(R, T, y, ldy, x, ldx, k, w, ldw); break;
#define DEFINE_TILE_SWITCH(SUF, WT)                                                              \
    static void tiles_##SUF(int R, int T, float *y, long ldy, const float *x, long ldx, int k,  \
                            const WT *w, long ldw) {                                             \
        switch (R * 4 + T) {                                                                     \
            TILE_CASE(SUF, 1, 1) TILE_CASE(SUF, 2, 1) TILE_CASE(SUF, 3, 1) TILE_CASE(SUF, 4, 1)  \
            TILE_CASE(SUF, 5, 1) TILE_CASE(SUF, 6, 1) TILE_CASE(SUF, 7, 1) TILE_CASE(SUF, 8, 1)  \
            TILE_CASE(SUF, 1, 2) TILE_CASE(SUF, 2, 2) TILE_CASE(SUF, 3, 2) TILE_CASE(SUF, 4, 2)  \
            TILE_CASE(SUF, 1, 3) TILE_CASE(SUF, 2, 3) TILE_CASE(SUF, 3, 3) TILE_CASE(SUF, 4, 3)  \
        default: assert(0 && "tile shape");                                                      \
        }                                                                                        \
    }
DEFINE_TILE_SWITCH(f32, float)
DEFINE_TILE_SWITCH(bf16, uint16_t)
DEFINE_TILE_SWITCH(f16, uint16_t)
DEFINE_TILE_SWITCH(q8_0, struct lm_block_q8_0)

/* Tiles of rows [r, r + R) for tokens [t, t + T) of the weights in their stored dtype. */
static void tiles_any(enum lm_dtype wt, int R, int T, float *y, int m, const float *x, int k,
                      const void *w, long r, int t) {
    float *yt = y + (long)t * m + r;
    const float *xt = x + (long)t * k;
    switch (wt) {
    case LM_DTYPE_F32: tiles_f32(R, T, yt, m, xt, k, k, (const float *)w + r * k, k); break;
    case LM_DTYPE_BF16: tiles_bf16(R, T, yt, m, xt, k, k, (const uint16_t *)w + r * k, k); break;
    case LM_DTYPE_F16: tiles_f16(R, T, yt, m, xt, k, k, (const uint16_t *)w + r * k, k); break;
    case LM_DTYPE_Q8_0: {
        const long nb = k / LM_Q8_0_BLOCK;
        tiles_q8_0(R, T, yt, m, xt, k, k, (const struct lm_block_q8_0 *)w + r * nb, nb);
        break;
    }
    }
}

/* ---- panels: rows widened to float32 once ---- */

/* dst[R, k] = float32 of rows [r0, r0 + R) (exact widening / dequantization). */
static void widen_rows(float *dst, const void *w, enum lm_dtype wt, long r0, int R, int k) {
    for (int r = 0; r < R; r++) {
        float *o = dst + (long)r * k;
        int l = 0;
        switch (wt) {
        case LM_DTYPE_F32: memcpy(o, (const float *)w + (r0 + r) * k, sizeof(float) * (size_t)k); break;
        case LM_DTYPE_BF16: {
            const uint16_t *s = (const uint16_t *)w + (r0 + r) * k;
            for (; l + VL <= k; l += VL) {
                vf v = V_LOAD_BF16(s + l);
                V_STORE(o + l, v);
            }
            for (; l < k; l++) o[l] = S_LOAD_BF16(s + l);
            break;
        }
        case LM_DTYPE_F16: {
            const uint16_t *s = (const uint16_t *)w + (r0 + r) * k;
            for (; l + VL <= k; l += VL) {
                vf v = V_LOAD_F16(s + l);
                V_STORE(o + l, v);
            }
            for (; l < k; l++) o[l] = S_LOAD_F16(s + l);
            break;
        }
        case LM_DTYPE_Q8_0: {
            const long nb = k / LM_Q8_0_BLOCK;
            const struct lm_block_q8_0 *s = (const struct lm_block_q8_0 *)w + (r0 + r) * nb;
            for (long b = 0; b < nb; b++) {
                vf d = V_SET1(S_F16(s[b].d));
                for (int c = 0; c < LM_Q8_0_BLOCK; c += VL) {
                    vf v = V_MUL(V_LOAD_I8(s[b].qs + c), d);
                    V_STORE(o + b * LM_Q8_0_BLOCK + c, v);
                }
            }
            break;
        }
        }
    }
}

/* ---- driver ---- */

struct mm_args {
    float *y;
    const float *x;
    const void *w;
    enum lm_dtype wt;
    int n, k, m;
    float *scratch; /* NULL: streaming tiles only; else nth panels of PANEL_ROWS * k floats */
};

static void mm_task(void *p, int ith, int nth) {
    const struct mm_args *a = p;
    const int n = a->n, k = a->k, m = a->m;
    long r0, r1;
    lm_pool_split(m, ith, nth, a->scratch ? PANEL_ROWS : 8, &r0, &r1);
    if (!a->scratch) {
        if (n == 1) {
            for (long r = r0; r < r1; r += 8)
                tiles_any(a->wt, r1 - r < 8 ? (int)(r1 - r) : 8, 1, a->y, m, a->x, k, a->w, r, 0);
            return;
        }
        for (long r = r0; r < r1; r += 4) {
            int R = r1 - r < 4 ? (int)(r1 - r) : 4;
            for (int t = 0; t < n; t += 3)
                tiles_any(a->wt, R, n - t < 3 ? n - t : 3, a->y, m, a->x, k, a->w, r, t);
        }
        return;
    }
    float *panel = a->scratch + (size_t)ith * PANEL_ROWS * (size_t)k;
    for (long p0 = r0; p0 < r1; p0 += PANEL_ROWS) {
        int P = r1 - p0 < PANEL_ROWS ? (int)(r1 - p0) : PANEL_ROWS;
        const float *pw;
        if (a->wt == LM_DTYPE_F32) {
            pw = (const float *)a->w + p0 * k;
        } else {
            widen_rows(panel, a->w, a->wt, p0, P, k);
            pw = panel;
        }
        for (int t = 0; t < n; t += 3) {
            int T = n - t < 3 ? n - t : 3;
            for (int r = 0; r < P; r += MM_PR)
                tiles_f32(P - r < MM_PR ? P - r : MM_PR, T, a->y + (long)t * m + p0 + r, m,
                          a->x + (long)t * k, k, k, pw + (long)r * k, k);
        }
    }
}

/* The calling thread's scratch, grown on demand and freed when the thread exits. */
struct scratch {
    float *p;
    size_t floats;
};
static pthread_key_t g_scratch_key;
static pthread_once_t g_scratch_once = PTHREAD_ONCE_INIT;
static void scratch_destroy(void *s) {
    struct scratch *sc = s;
    free(sc->p);
    free(sc);
}
static void scratch_key_init(void) { pthread_key_create(&g_scratch_key, scratch_destroy); }

static float *scratch_get(size_t floats) {
    pthread_once(&g_scratch_once, scratch_key_init);
    struct scratch *s = pthread_getspecific(g_scratch_key);
    if (!s) {
        if (!(s = calloc(1, sizeof *s))) return NULL;
        if (pthread_setspecific(g_scratch_key, s)) {
            free(s);
            return NULL;
        }
    }
    if (s->floats < floats) {
        free(s->p);
        size_t bytes = (floats * sizeof(float) + 63) / 64 * 64;
        s->p = aligned_alloc(64, bytes);
        s->floats = s->p ? floats : 0;
    }
    return s->p;
}

void lm_cpu_matmul_fast(struct lm_pool *pool, float *y, const float *x, const void *w,
                        enum lm_dtype wt, int n, int k, int m) {
    assert(wt != LM_DTYPE_Q8_0 || k % LM_Q8_0_BLOCK == 0);
    struct mm_args a = {y, x, w, wt, n, k, m, NULL};
    bool par = (long)n * k * m >= PAR_MIN_WORK && m >= 16;
    int nth = par ? lm_pool_size(pool) : 1;
    if (n >= LM_MM_PANEL_MIN) a.scratch = scratch_get((size_t)nth * PANEL_ROWS * (size_t)k);
    if (par)
        lm_pool_run(pool, mm_task, &a);
    else
        mm_task(&a, 0, 1);
}
