/* ops_fast.c: the SIMD kernels of ops.h, threaded over rows with the pool.
 *
 * One source serves three targets through a small vector layer (VL lanes of float32):
 * AVX-512F (16 lanes), AVX2+FMA+F16C (8 lanes), or GCC vector extensions (8 lanes, any CPU).
 * The choice is made at compile time from the target flags (-march=native).
 *
 * matmul: each thread owns a range of weight rows (multiples of 4). Tokens are processed in
 * blocks that fit in L2, so a weight row is read from memory once per block of tokens; inside a
 * block a register tile of 4 weight rows x 3 tokens (12 accumulators; 4 x 1 with two k-streams
 * for decode) loads each weight vector once for 3 tokens. Weights are widened to float32 in
 * registers (bf16: zero-extend and shift left 16; f16: vcvtph2ps). */
#include <assert.h>
#include <math.h>

#include "backend/cpu/ops.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#define VL 16
#define TARGET_NAME "avx512"
typedef __m512 vf;
#define V_ZERO() _mm512_setzero_ps()
#define V_SET1(x) _mm512_set1_ps(x)
#define V_LOAD(p) _mm512_loadu_ps(p)
#define V_STORE(p, v) _mm512_storeu_ps(p, v)
#define V_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define V_ADD(a, b) _mm512_add_ps(a, b)
#define V_MUL(a, b) _mm512_mul_ps(a, b)
#define V_MAX(a, b) _mm512_max_ps(a, b)
#define V_HSUM(v) _mm512_reduce_add_ps(v)
#define V_HMAX(v) _mm512_reduce_max_ps(v)
#define V_LOAD_BF16(p)                                                                          \
    _mm512_castsi512_ps(                                                                        \
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define V_LOAD_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define VL 8
#define TARGET_NAME "avx2"
typedef __m256 vf;
#define V_ZERO() _mm256_setzero_ps()
#define V_SET1(x) _mm256_set1_ps(x)
#define V_LOAD(p) _mm256_loadu_ps(p)
#define V_STORE(p, v) _mm256_storeu_ps(p, v)
#define V_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define V_ADD(a, b) _mm256_add_ps(a, b)
#define V_MUL(a, b) _mm256_mul_ps(a, b)
#define V_MAX(a, b) _mm256_max_ps(a, b)
static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline float hmax256(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#define V_HSUM(v) hsum256(v)
#define V_HMAX(v) hmax256(v)
#define V_LOAD_BF16(p)                                                                          \
    _mm256_castsi256_ps(                                                                        \
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#define V_LOAD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#else
#define VL 8
#define TARGET_NAME "generic"
typedef float vf __attribute__((vector_size(VL * 4)));
static inline vf g_load(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline vf g_set1(float x) {
    vf v;
    for (int i = 0; i < VL; i++) v[i] = x;
    return v;
}
static inline float g_hsum(vf v) {
    float s = 0;
    for (int i = 0; i < VL; i++) s += v[i];
    return s;
}
static inline float g_hmax(vf v) {
    float s = v[0];
    for (int i = 1; i < VL; i++) s = v[i] > s ? v[i] : s;
    return s;
}
static inline vf g_max(vf a, vf b) {
    for (int i = 0; i < VL; i++) a[i] = a[i] > b[i] ? a[i] : b[i];
    return a;
}
static inline vf g_bf16(const uint16_t *p) {
    vf v;
    for (int i = 0; i < VL; i++) v[i] = lm_bf16_to_f32(p[i]);
    return v;
}
static inline vf g_f16(const uint16_t *p) {
    vf v;
    for (int i = 0; i < VL; i++) v[i] = lm_f16_to_f32(p[i]);
    return v;
}
#define V_ZERO() g_set1(0.0f)
#define V_SET1(x) g_set1(x)
#define V_LOAD(p) g_load(p)
#define V_STORE(p, v) memcpy((p), &(v), sizeof(vf))
#define V_FMA(a, b, c) ((a) * (b) + (c))
#define V_ADD(a, b) ((a) + (b))
#define V_MUL(a, b) ((a) * (b))
#define V_MAX(a, b) g_max(a, b)
#define V_HSUM(v) g_hsum(v)
#define V_HMAX(v) g_hmax(v)
#define V_LOAD_BF16(p) g_bf16((const uint16_t *)(p))
#define V_LOAD_F16(p) g_f16((const uint16_t *)(p))
#endif


#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* Work below this many multiply-adds runs on the calling thread: waking the pool costs more. */
enum { PAR_MIN_WORK = 1 << 15 };

static float vdot(const float *a, const float *b, int n) {
    vf acc0 = V_ZERO(), acc1 = V_ZERO();
    int i = 0;
    for (; i + 2 * VL <= n; i += 2 * VL) {
        acc0 = V_FMA(V_LOAD(a + i), V_LOAD(b + i), acc0);
        acc1 = V_FMA(V_LOAD(a + i + VL), V_LOAD(b + i + VL), acc1);
    }
    for (; i + VL <= n; i += VL) acc0 = V_FMA(V_LOAD(a + i), V_LOAD(b + i), acc0);
    float s = V_HSUM(V_ADD(acc0, acc1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* y[0..n) += a * x[0..n) */
static void vaxpy(float *y, float a, const float *x, int n) {
    vf va = V_SET1(a);
    int i = 0;
    for (; i + VL <= n; i += VL) {
        vf r = V_FMA(va, V_LOAD(x + i), V_LOAD(y + i));
        V_STORE(y + i, r);
    }
    for (; i < n; i++) y[i] += a * x[i];
}

/* ---- matmul ---- */

/* One register tile: y[t * ldy + r] = dot(x[t], w[r]) for r < R weight rows, t < T tokens.
 * R <= MM_R, T <= MM_T are compile-time constants after inlining; with T == 1 two accumulator
 * sets run over alternate vectors of k to hide the FMA latency. */
#define MM_R 4
#define MM_T 3
#define DEFINE_MM_TILE(SUF, WT, VLOADW, SLOADW)                                                  \
    ALWAYS_INLINE void mm_tile_##SUF(const int R, const int T, float *y, long ldy, const float *x, \
                                     int k, const WT *w) {                                       \
        const int U = T == 1 ? 2 : 1;                                                            \
        vf acc[2][MM_R][MM_T];                                                                   \
        _Pragma("GCC unroll 2") for (int u = 0; u < U; u++)                                      \
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)                                  \
                _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) acc[u][r][t] = V_ZERO();     \
        int l = 0;                                                                               \
        for (; l + U * VL <= k; l += U * VL) {                                                   \
            _Pragma("GCC unroll 2") for (int u = 0; u < U; u++) {                                \
                vf wv[MM_R];                                                                     \
                _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) wv[r] =                      \
                    VLOADW(w + (long)r * k + l + u * VL);                                        \
                _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {                            \
                    vf xv = V_LOAD(x + (long)t * k + l + u * VL);                                \
                    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[u][r][t] =           \
                        V_FMA(wv[r], xv, acc[u][r][t]);                                          \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
        if (U == 2 && l + VL <= k) {                                                             \
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                \
                vf wv = VLOADW(w + (long)r * k + l);                                             \
                acc[0][r][0] = V_FMA(wv, V_LOAD(x + l), acc[0][r][0]);                           \
            }                                                                                    \
            l += VL;                                                                             \
        }                                                                                        \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)                                      \
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {                                \
                vf a = acc[0][r][t];                                                             \
                if (U == 2) a = V_ADD(a, acc[1][r][t]);                                          \
                float s = V_HSUM(a);                                                             \
                for (int j = l; j < k; j++) s += SLOADW(w + (long)r * k + j) * x[(long)t * k + j]; \
                y[(long)t * ldy + r] = s;                                                        \
            }                                                                                    \
    }                                                                                            \
    static void mm_block_##SUF(int R, int T, float *y, long ldy, const float *x, int k,         \
                               const WT *w) {                                                    \
        switch (R * 16 + T) {                                                                    \
        MM_CASES_R(SUF)                                                                          \
        }                                                                                        \
    }

#define MM_CASE(SUF, R, T)                                                                       \
    case R * 16 + T: mm_tile_##SUF(R, T, y, ldy, x, k, w); break;
#define MM_CASES_T(SUF, R) MM_CASE(SUF, R, 1) MM_CASE(SUF, R, 2) MM_CASE(SUF, R, 3)
#define MM_CASES_R(SUF) MM_CASES_T(SUF, 1) MM_CASES_T(SUF, 2) MM_CASES_T(SUF, 3) MM_CASES_T(SUF, 4)

#define S_LOAD_F32P(p) (*(p))
#define S_LOAD_U16BF(p) lm_bf16_to_f32(*(p))
#define S_LOAD_U16F(p) lm_f16_to_f32(*(p))
DEFINE_MM_TILE(f32, float, V_LOAD, S_LOAD_F32P)
DEFINE_MM_TILE(bf16, uint16_t, V_LOAD_BF16, S_LOAD_U16BF)
DEFINE_MM_TILE(f16, uint16_t, V_LOAD_F16, S_LOAD_U16F)

struct mm_args {
    float *y;
    const float *x;
    const void *w;
    enum lm_dtype wt;
    int n, k, m;
    int tblock; /* tokens per block */
};

static void mm_task(void *p, int ith, int nth) {
    const struct mm_args *a = p;
    long r0, r1;
    lm_pool_split(a->m, ith, nth, MM_R, &r0, &r1);
    const int k = a->k;
    for (int t0 = 0; t0 < a->n; t0 += a->tblock) {
        int t1 = t0 + a->tblock < a->n ? t0 + a->tblock : a->n;
        for (long r = r0; r < r1; r += MM_R) {
            int R = r1 - r < MM_R ? (int)(r1 - r) : MM_R;
            for (int t = t0; t < t1; t += MM_T) {
                int T = t1 - t < MM_T ? t1 - t : MM_T;
                float *y = a->y + (long)t * a->m + r;
                const float *x = a->x + (long)t * k;
                switch (a->wt) {
                case LM_DTYPE_F32: mm_block_f32(R, T, y, a->m, x, k, (const float *)a->w + r * k); break;
                case LM_DTYPE_BF16:
                    mm_block_bf16(R, T, y, a->m, x, k, (const uint16_t *)a->w + r * k);
                    break;
                case LM_DTYPE_F16:
                    mm_block_f16(R, T, y, a->m, x, k, (const uint16_t *)a->w + r * k);
                    break;
                }
            }
        }
    }
}

static void f_matmul(struct lm_pool *pool, float *y, const float *x, const void *w,
                     enum lm_dtype wt, int n, int k, int m) {
    /* A block of activations of about 192 KB stays in L2 while the weight rows stream past. */
    int tb = (int)((192 * 1024) / ((long)k * 4));
    tb = tb / MM_T * MM_T;
    if (tb < MM_T) tb = MM_T;
    struct mm_args a = {y, x, w, wt, n, k, m, tb};
    if ((long)n * k * m < PAR_MIN_WORK || m < 8)
        mm_task(&a, 0, 1);
    else
        lm_pool_run(pool, mm_task, &a);
}

/* ---- rmsnorm ---- */

struct rows_args {
    float *y;
    const float *x;
    const float *w;
    int n, d;
    float eps;
};

static void rmsnorm_rows(const struct rows_args *a, long i0, long i1) {
    const int d = a->d;
    for (long i = i0; i < i1; i++) {
        const float *xi = a->x + i * d;
        float *yi = a->y + i * d;
        float inv = 1.0f / sqrtf(vdot(xi, xi, d) / (float)d + a->eps);
        vf vinv = V_SET1(inv);
        int j = 0;
        for (; j + VL <= d; j += VL) {
            vf r = V_MUL(V_LOAD(a->w + j), V_MUL(V_LOAD(xi + j), vinv));
            V_STORE(yi + j, r);
        }
        for (; j < d; j++) yi[j] = a->w[j] * (xi[j] * inv);
    }
}

static void rmsnorm_task(void *p, int ith, int nth) {
    const struct rows_args *a = p;
    long i0, i1;
    lm_pool_split(a->n, ith, nth, 1, &i0, &i1);
    rmsnorm_rows(a, i0, i1);
}

static void f_rmsnorm(struct lm_pool *pool, float *y, const float *x, const float *w, int n, int d,
                      float eps) {
    struct rows_args a = {y, x, w, n, d, eps};
    if ((long)n * d < 4 * PAR_MIN_WORK || n < 2)
        rmsnorm_rows(&a, 0, n);
    else
        lm_pool_run(pool, rmsnorm_task, &a);
}

/* ---- rope ---- */

struct rope_args {
    float *x;
    int n, n_heads, head_dim, pos0;
    const float *inv_freq;
};

static void rope_rows(const struct rope_args *a, long i0, long i1) {
    const int half = a->head_dim / 2;
    float c[256], s[256];
    assert(half <= 256);
    for (long i = i0; i < i1; i++) {
        float pos = (float)(a->pos0 + i);
        for (int j = 0; j < half; j++) {
            float ang = a->inv_freq[j] * pos;
            c[j] = cosf(ang);
            s[j] = sinf(ang);
        }
        for (int h = 0; h < a->n_heads; h++) {
            float *v = a->x + (i * a->n_heads + h) * a->head_dim;
            int j = 0;
            for (; j + VL <= half; j += VL) {
                vf x1 = V_LOAD(v + j), x2 = V_LOAD(v + j + half);
                vf vc = V_LOAD(c + j), vs = V_LOAD(s + j);
                vf o1 = V_FMA(x1, vc, V_MUL(V_SET1(-1.0f), V_MUL(x2, vs)));
                vf o2 = V_FMA(x2, vc, V_MUL(x1, vs));
                V_STORE(v + j, o1);
                V_STORE(v + j + half, o2);
            }
            for (; j < half; j++) {
                float x1 = v[j], x2 = v[j + half];
                v[j] = x1 * c[j] - x2 * s[j];
                v[j + half] = x2 * c[j] + x1 * s[j];
            }
        }
    }
}

static void rope_task(void *p, int ith, int nth) {
    const struct rope_args *a = p;
    long i0, i1;
    lm_pool_split(a->n, ith, nth, 1, &i0, &i1);
    rope_rows(a, i0, i1);
}

static void f_rope(struct lm_pool *pool, float *x, int n, int n_heads, int head_dim, int pos0,
                   const float *inv_freq) {
    struct rope_args a = {x, n, n_heads, head_dim, pos0, inv_freq};
    if ((long)n * n_heads * head_dim < 4 * PAR_MIN_WORK || n < 2)
        rope_rows(&a, 0, n);
    else
        lm_pool_run(pool, rope_task, &a);
}

/* ---- swiglu ---- */

struct swiglu_args {
    float *y;
    const float *gate, *up;
    long n;
};

static void swiglu_range(const struct swiglu_args *a, long i0, long i1) {
    for (long i = i0; i < i1; i++) {
        float g = a->gate[i];
        a->y[i] = g / (1.0f + expf(-g)) * a->up[i];
    }
}

static void swiglu_task(void *p, int ith, int nth) {
    const struct swiglu_args *a = p;
    long i0, i1;
    lm_pool_split(a->n, ith, nth, 16, &i0, &i1);
    swiglu_range(a, i0, i1);
}

static void f_swiglu(struct lm_pool *pool, float *y, const float *gate, const float *up, long n) {
    struct swiglu_args a = {y, gate, up, n};
    if (n < PAR_MIN_WORK / 2)
        swiglu_range(&a, 0, n);
    else
        lm_pool_run(pool, swiglu_task, &a);
}

/* ---- softmax ---- */

static void f_softmax(float *x, int n) {
    int i = 0;
    float mx = -INFINITY;
    if (n >= VL) {
        vf vm = V_LOAD(x);
        for (i = VL; i + VL <= n; i += VL) vm = V_MAX(vm, V_LOAD(x + i));
        mx = V_HMAX(vm);
    }
    for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    float sum = 0;
    for (i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    vf inv = V_SET1(1.0f / sum);
    for (i = 0; i + VL <= n; i += VL) {
        vf r = V_MUL(V_LOAD(x + i), inv);
        V_STORE(x + i, r);
    }
    for (; i < n; i++) x[i] *= 1.0f / sum;
}

/* ---- attention ---- */

struct attn_args {
    float *out;
    const float *q, *k, *v;
    int n, pos0, n_heads, n_kv_heads, head_dim, kv_stride;
    float scale;
    float *scratch;
};

/* Work items are (query, head) pairs, dealt round-robin so that long (late) queries spread. */
static void attn_task(void *p, int ith, int nth) {
    const struct attn_args *a = p;
    const int hd = a->head_dim, group = a->n_heads / a->n_kv_heads;
    float *sc = a->scratch + (long)ith * (a->pos0 + a->n);
    long items = (long)a->n * a->n_heads;
    for (long it = ith; it < items; it += nth) {
        int i = (int)(it / a->n_heads), h = (int)(it % a->n_heads), g = h / group;
        int len = a->pos0 + i + 1;
        const float *qi = a->q + it * hd;
        float *oi = a->out + it * hd;
        const float *kb = a->k + (long)g * hd, *vb = a->v + (long)g * hd;
        for (int t = 0; t < len; t++) sc[t] = vdot(qi, kb + (long)t * a->kv_stride, hd) * a->scale;
        f_softmax(sc, len);
        for (int d = 0; d < hd; d++) oi[d] = 0;
        for (int t = 0; t < len; t++) vaxpy(oi, sc[t], vb + (long)t * a->kv_stride, hd);
    }
}

static void f_attention(struct lm_pool *pool, float *out, const float *q, const float *k,
                        const float *v, int n, int pos0, int n_heads, int n_kv_heads, int head_dim,
                        int kv_stride, float scale, float *scratch) {
    assert(n_heads % n_kv_heads == 0);
    struct attn_args a = {out, q, k, v, n, pos0, n_heads, n_kv_heads, head_dim, kv_stride, scale,
                          scratch};
    long work = (long)n * n_heads * (pos0 + n) * head_dim;
    if (work < 2 * PAR_MIN_WORK)
        attn_task(&a, 0, 1);
    else
        lm_pool_run(pool, attn_task, &a);
}

/* ---- convert ---- */

static void f_convert_row(float *y, const void *w, enum lm_dtype wt, int n) {
    int i = 0;
    switch (wt) {
    case LM_DTYPE_F32: memcpy(y, w, (size_t)n * 4); return;
    case LM_DTYPE_BF16:
        for (; i + VL <= n; i += VL) {
            vf r = V_LOAD_BF16((const uint16_t *)w + i);
            V_STORE(y + i, r);
        }
        for (; i < n; i++) y[i] = lm_bf16_to_f32(((const uint16_t *)w)[i]);
        return;
    case LM_DTYPE_F16:
        for (; i + VL <= n; i += VL) {
            vf r = V_LOAD_F16((const uint16_t *)w + i);
            V_STORE(y + i, r);
        }
        for (; i < n; i++) y[i] = lm_f16_to_f32(((const uint16_t *)w)[i]);
        return;
    }
}

static const struct lm_cpu_ops k_fast = {
    .name = TARGET_NAME,
    .matmul = f_matmul,
    .rmsnorm = f_rmsnorm,
    .rope = f_rope,
    .swiglu = f_swiglu,
    .softmax = f_softmax,
    .attention = f_attention,
    .convert_row = f_convert_row,
};

const struct lm_cpu_ops *lm_cpu_ops_fast(void) { return &k_fast; }
