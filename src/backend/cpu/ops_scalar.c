/* ops_scalar.c: the plain reference kernels of ops.h, and the dtype helpers. Each loop reads
 * like the formula it implements; the fast kernels (kern_ops.h, kern_matmul.h) are tested against these. */
#include <assert.h>
#include <math.h>
#include <stdlib.h>

#include "backend/cpu/ops.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/quant.h"

const char *lm_dtype_name(enum lm_dtype t) {
    switch (lm_dtype_unpacked(t)) {
    case LM_DTYPE_F32: return "f32";
    case LM_DTYPE_F16: return "f16";
    case LM_DTYPE_BF16: return "bf16";
    case LM_DTYPE_Q8_0: return "q8_0";
    default: return "?";
    }
}

size_t lm_dtype_size(enum lm_dtype t) {
    t = lm_dtype_unpacked(t);
    return t == LM_DTYPE_F32 ? 4 : t == LM_DTYPE_Q8_0 ? 0 : 2;
}

size_t lm_dtype_row_bytes(enum lm_dtype t, long n) {
    t = lm_dtype_unpacked(t);
    if (t == LM_DTYPE_Q8_0) return (size_t)(n / LM_Q8_0_BLOCK) * sizeof(struct lm_block_q8_0);
    return (size_t)n * lm_dtype_size(t);
}

float lm_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man ? 0x400000u | man << 13 : 0); /* inf; NaN quietened as F16C does */
    } else if (exp) {
        u = sign | (exp + 112) << 23 | man << 13;
    } else if (man) { /* subnormal: normalise */
        int e = -1;
        do {
            e++;
            man <<= 1;
        } while (!(man & 0x400));
        u = sign | (uint32_t)(112 - e) << 23 | (man & 0x3ff) << 13;
    } else {
        u = sign;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t lm_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(u >> 16 | 0x40); /* quiet NaN */
    u += 0x7fffu + (u >> 16 & 1);
    return (uint16_t)(u >> 16);
}

uint16_t lm_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = u >> 16 & 0x8000, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds to >= 65536: inf */
    if (a < 0x38800000u) {                                   /* below 2^-14: subnormal or zero */
        if (a < 0x33000000u) return (uint16_t)sign;          /* below half the smallest subnormal */
        /* value = man * 2^(e - 150); in units of the smallest subnormal 2^-24: man >> (126 - e) */
        uint32_t man = (a & 0x7fffff) | 0x800000, shift = 126 - (a >> 23);
        uint32_t q = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = a - 0x38000000u; /* rebias exponent 127 -> 15 */
    r += 0xfffu + (r >> 13 & 1);
    return (uint16_t)(sign | r >> 13);
}

uint16_t lm_f32_to_bf16_act(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0) return (uint16_t)(u >> 16 & 0x8000); /* zero or subnormal */
    return lm_f32_to_bf16(f);
}

/* bfloat16 weights on the bf16 path (ops.h, LM_BF16_ACT): activations rounded to bfloat16, then
 * VDPBF16PS's chain over column pairs (the odd column first), an odd last column alone. */
static void s_matmul_bf16_act(float *y, const float *x, const void *w, enum lm_dtype wt, int n, int k,
                              int m) {
    float *xr = malloc(sizeof(float) * (size_t)k);
    assert(xr);
    for (int i = 0; i < n; i++) {
        for (int l = 0; l < k; l++) xr[l] = lm_bf16_to_f32(lm_f32_to_bf16_act(x[(size_t)i * k + l]));
        for (int j = 0; j < m; j++) {
            float acc = 0;
            int l = 0;
            for (; l + 1 < k; l += 2) {
                acc = fmaf(lm_cpu_weight(w, wt, k, j, l + 1), xr[l + 1], acc);
                acc = fmaf(lm_cpu_weight(w, wt, k, j, l), xr[l], acc);
            }
            if (l < k) acc = fmaf(lm_cpu_weight(w, wt, k, j, l), xr[l], acc);
            y[(size_t)i * m + j] = acc;
        }
    }
    free(xr);
}

/* Q8_0 weights on the int8 path (ops.h, LM_Q8_0_INT8): per block an exact integer dot product
 * of the weight's and the quantized activation's int8s, then
 * acc = fma((float)isum, dw * dx, acc) over the blocks in order. */
static void s_matmul_q8_0_int8(float *y, const float *x, const void *w, enum lm_dtype wt, int n,
                               int k, int m) {
    const int nb = k / LM_Q8_0_BLOCK;
    int8_t *xq = malloc((size_t)k);
    float *dx = malloc(sizeof(float) * (size_t)nb);
    assert(xq && dx);
    for (int i = 0; i < n; i++) {
        lm_q8_0_quantize_act(x + (size_t)i * k, xq, dx, k); /* row i, once */
        for (int j = 0; j < m; j++) {
            float acc = 0;
            for (int b = 0; b < nb; b++) {
                int8_t wq[LM_Q8_0_BLOCK];
                const float dw = lm_cpu_q8_0_block(w, wt, k, j, b, wq);
                int32_t isum = 0;
                for (int l = 0; l < LM_Q8_0_BLOCK; l++) isum += (int32_t)wq[l] * (int32_t)xq[b * LM_Q8_0_BLOCK + l];
                acc = fmaf((float)isum, dw * dx[b], acc);
            }
            y[(size_t)i * m + j] = acc;
        }
    }
    free(xq);
    free(dx);
}

/* The reference chain of ops.h: acc = fma(w[j, l], x[i, l], acc) for l in order. */
static void s_matmul(struct lm_pool *pool, float *y, const float *x, const void *w,
                     enum lm_dtype wt, int n, int k, int m) {
    if (lm_dtype_unpacked(wt) == LM_DTYPE_Q8_0 && lm_cpu_q8_0_path() == LM_Q8_0_INT8) {
        s_matmul_q8_0_int8(y, x, w, wt, n, k, m);
        return;
    }
    if (lm_dtype_unpacked(wt) == LM_DTYPE_BF16 && lm_cpu_bf16_path() == LM_BF16_ACT) {
        s_matmul_bf16_act(y, x, w, wt, n, k, m);
        return;
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++) {
            float acc = 0;
            for (int l = 0; l < k; l++) acc = fmaf(lm_cpu_weight(w, wt, k, j, l), x[(size_t)i * k + l], acc);
            y[(size_t)i * m + j] = acc;
        }
}

static void s_rmsnorm(struct lm_pool *pool, float *y, const float *x, const float *w, int n, int d,
                      float eps) {
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * d;
        float *yi = y + (size_t)i * d;
        float ss = 0;
        for (int j = 0; j < d; j++) ss += xi[j] * xi[j];
        float inv = 1.0f / sqrtf(ss / (float)d + eps);
        for (int j = 0; j < d; j++) yi[j] = w[j] * (xi[j] * inv);
    }
}

static void s_rope(struct lm_pool *pool, float *x, int n, int n_heads, int head_dim, int pos0,
                   const float *inv_freq) {
    int half = head_dim / 2;
    for (int i = 0; i < n; i++)
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((size_t)i * n_heads + h) * head_dim;
            for (int j = 0; j < half; j++) {
                float a = inv_freq[j] * (float)(pos0 + i);
                float c = cosf(a), s = sinf(a);
                float x1 = v[j], x2 = v[j + half];
                v[j] = x1 * c - x2 * s;
                v[j + half] = x2 * c + x1 * s;
            }
        }
}

static void s_swiglu(struct lm_pool *pool, float *y, const float *gate, const float *up, long n) {
    for (long i = 0; i < n; i++) {
        float g = gate[i];
        y[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

static void s_softmax(float *x, int n) {
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    float sum = 0;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    for (int i = 0; i < n; i++) x[i] /= sum;
}

static void s_attention(struct lm_pool *pool, float *out, const float *q, const float *k,
                        const float *v, int n, int pos0, int n_heads, int n_kv_heads, int head_dim,
                        int kv_stride, float scale, float *scratch) {
    assert(n_heads % n_kv_heads == 0);
    int group = n_heads / n_kv_heads;
    for (int i = 0; i < n; i++)
        for (int h = 0; h < n_heads; h++) {
            const float *qi = q + ((size_t)i * n_heads + h) * head_dim;
            float *oi = out + ((size_t)i * n_heads + h) * head_dim;
            int g = h / group, len = pos0 + i + 1;
            for (int t = 0; t < len; t++) {
                const float *kt = k + (size_t)t * kv_stride + (size_t)g * head_dim;
                float dot = 0;
                for (int d = 0; d < head_dim; d++) dot += qi[d] * kt[d];
                scratch[t] = dot * scale;
            }
            s_softmax(scratch, len);
            for (int d = 0; d < head_dim; d++) oi[d] = 0;
            for (int t = 0; t < len; t++) {
                const float *vt = v + (size_t)t * kv_stride + (size_t)g * head_dim;
                for (int d = 0; d < head_dim; d++) oi[d] += scratch[t] * vt[d];
            }
        }
}

static void s_attention_paged(struct lm_pool *pool, float *out, const float *q, const float *k,
                              const float *v, const struct lm_attn_seq *seqs, int n_seqs,
                              int n_heads, int n_kv_heads, int head_dim, int kv_stride,
                              int block_size, float scale, float *scratch) {
    assert(n_heads % n_kv_heads == 0 && block_size > 0);
    int group = n_heads / n_kv_heads;
    long row0 = 0; /* first query row of the current sequence */
    for (int s = 0; s < n_seqs; s++) {
        const struct lm_attn_seq *sq = &seqs[s];
        for (int i = 0; i < sq->n; i++)
            for (int h = 0; h < n_heads; h++) {
                const float *qi = q + ((size_t)(row0 + i) * n_heads + h) * head_dim;
                float *oi = out + ((size_t)(row0 + i) * n_heads + h) * head_dim;
                int g = h / group, len = sq->pos0 + i + 1;
                for (int t = 0; t < len; t++) {
                    size_t row = (size_t)sq->blocks[t / block_size] * block_size + t % block_size;
                    const float *kt = k + row * kv_stride + (size_t)g * head_dim;
                    float dot = 0;
                    for (int d = 0; d < head_dim; d++) dot += qi[d] * kt[d];
                    scratch[t] = dot * scale;
                }
                s_softmax(scratch, len);
                for (int d = 0; d < head_dim; d++) oi[d] = 0;
                for (int t = 0; t < len; t++) {
                    size_t row = (size_t)sq->blocks[t / block_size] * block_size + t % block_size;
                    const float *vt = v + row * kv_stride + (size_t)g * head_dim;
                    for (int d = 0; d < head_dim; d++) oi[d] += scratch[t] * vt[d];
                }
            }
        row0 += sq->n;
    }
}

static void s_convert_row(float *y, const void *w, enum lm_dtype wt, int n) {
    assert(!lm_dtype_is_packed(wt));
    for (int i = 0; i < n; i++) y[i] = lm_cpu_weight(w, wt, n, 0, i);
}

static const struct lm_cpu_ops k_scalar = {
    .name = "scalar",
    .matmul = s_matmul,
    .rmsnorm = s_rmsnorm,
    .rope = s_rope,
    .swiglu = s_swiglu,
    .softmax = s_softmax,
    .attention = s_attention,
    .attention_paged = s_attention_paged,
    .convert_row = s_convert_row,
    .quantize_q8_0_act = lm_q8_0_quantize_act,
};

const struct lm_cpu_ops *lm_cpu_ops_scalar(void) { return &k_scalar; }
