/* kern_ops.h: the SIMD kernels of ops.h, threaded over rows with the pool, as a template
 * included once per vector target after kern_matmul.h (kern_avx512.c, kern_avx2.c,
 * kern_generic.c define LM_SIMD_LEVEL and LM_KERN_TABLE, the name of the function returning this
 * target's table). No include guard: one inclusion per file.
 *
 * matmul: kern_matmul.h (matmul.h gives its paths and the fixed order of operations that makes
 * it batch invariant). attention_paged: the same per-(query, head) arithmetic as attention, with
 * K/V rows found through each sequence's block table. */
#include <assert.h>
#include <math.h>

#include "backend/cpu/quant.h"

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

/* The matmul of every weight dtype: kern_matmul.h (batch invariant; see matmul.h). */
static void f_matmul(struct lm_pool *pool, float *y, const float *x, const void *w,
                     enum lm_dtype wt, int n, int k, int m) {
    mm_matmul(pool, y, x, w, wt, n, k, m);
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

/* Paged attention: the same per-(query, head) arithmetic as attn_task, with K/V rows found
 * through each sequence's block table. Items (row, head) over all sequences are dealt
 * round-robin to the threads. */
struct attn_paged_args {
    float *out;
    const float *q, *k, *v;
    const struct lm_attn_seq *seqs;
    int n_seqs, n_heads, n_kv_heads, head_dim, kv_stride, block_size, max_len;
    float scale;
    float *scratch;
};

static void attn_paged_task(void *p, int ith, int nth) {
    const struct attn_paged_args *a = p;
    const int hd = a->head_dim, group = a->n_heads / a->n_kv_heads, bs = a->block_size;
    float *sc = a->scratch + (long)ith * a->max_len;
    long base = 0; /* first item of the current sequence */
    for (int s = 0; s < a->n_seqs; s++) {
        const struct lm_attn_seq *sq = &a->seqs[s];
        long items = (long)sq->n * a->n_heads;
        long first = ((ith - base) % nth + nth) % nth;
        for (long li = first; li < items; li += nth) {
            int i = (int)(li / a->n_heads), h = (int)(li % a->n_heads), g = h / group;
            int len = sq->pos0 + i + 1;
            long it = base + li;
            const float *qi = a->q + it * hd;
            float *oi = a->out + it * hd;
            const float *kb = a->k + (long)g * hd, *vb = a->v + (long)g * hd;
            for (int t = 0; t < len; t++) {
                long row = (long)sq->blocks[t / bs] * bs + t % bs;
                sc[t] = vdot(qi, kb + row * a->kv_stride, hd) * a->scale;
            }
            f_softmax(sc, len);
            for (int d = 0; d < hd; d++) oi[d] = 0;
            for (int t = 0; t < len; t++) {
                long row = (long)sq->blocks[t / bs] * bs + t % bs;
                vaxpy(oi, sc[t], vb + row * a->kv_stride, hd);
            }
        }
        base += items;
    }
}

static void f_attention_paged(struct lm_pool *pool, float *out, const float *q, const float *k,
                              const float *v, const struct lm_attn_seq *seqs, int n_seqs,
                              int n_heads, int n_kv_heads, int head_dim, int kv_stride,
                              int block_size, float scale, float *scratch) {
    assert(n_heads % n_kv_heads == 0 && block_size > 0);
    long work = 0;
    int max_len = 1;
    for (int s = 0; s < n_seqs; s++) {
        int len = seqs[s].pos0 + seqs[s].n;
        if (len > max_len) max_len = len;
        work += (long)seqs[s].n * n_heads * len * head_dim;
    }
    struct attn_paged_args a = {out,       q,          k,        v,        seqs,
                                n_seqs,    n_heads,    n_kv_heads, head_dim, kv_stride,
                                block_size, max_len,   scale,    scratch};
    if (work < 2 * PAR_MIN_WORK)
        attn_paged_task(&a, 0, 1);
    else
        lm_pool_run(pool, attn_paged_task, &a);
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
    case LM_DTYPE_Q8_0: lm_q8_0_dequantize_row(w, y, n); return;
    default: assert(0 && "convert_row takes row-major dtypes"); return;
    }
}

static const struct lm_cpu_ops k_fast = {
    .name = SIMD_NAME,
    .matmul = f_matmul,
    .rmsnorm = f_rmsnorm,
    .rope = f_rope,
    .swiglu = f_swiglu,
    .softmax = f_softmax,
    .attention = f_attention,
    .attention_paged = f_attention_paged,
    .convert_row = f_convert_row,
    .quantize_q8_0_act = quant_act,
};

const struct lm_cpu_ops *LM_KERN_TABLE(void) { return &k_fast; }
