/* pack.c: the packed weight layout (ops.h, lm_cpu_pack) and element access for every layout.
 *
 * A group of 16 rows is stored column by column, so that one load of a column gives 16 rows'
 * elements: the matmul's register tiles hold 16 rows of one token per 2 (AVX2) vectors and
 * stream the group front to back. The order of the 16 rows inside a column is the identity,
 * except for bfloat16, where the 32-bit slot i holds rows i (low half) and 8 + i (high half):
 * `slot << 16` widens rows 0-7 and `slot & 0xffff0000` rows 8-15, two cheap integer operations
 * instead of two shuffles (AVX2: two registers; AVX-512: one more insert; generic: four). The
 * layout is the same for every vector target, so weights packed once serve whichever target
 * runs (ops_fast.c chooses at run time). */
#include <assert.h>
#include <string.h>

#include "backend/cpu/matmul.h"
#include "backend/cpu/quant.h"

#define GROUP LM_MM_GROUP
#define Q8_GROUP_BLOCK_BYTES (GROUP * (2 + LM_Q8_0_BLOCK)) /* 16 scales + 32 x 16 quants */

int lm_cpu_bf16_slot(int j) { return j < 8 ? 2 * j : 2 * (j - 8) + 1; }

enum lm_dtype lm_dtype_unpacked(enum lm_dtype t) {
    switch (t) {
    case LM_DTYPE_F32_P16: return LM_DTYPE_F32;
    case LM_DTYPE_F16_P16: return LM_DTYPE_F16;
    case LM_DTYPE_BF16_P16: return LM_DTYPE_BF16;
    case LM_DTYPE_Q8_0_P16: return LM_DTYPE_Q8_0;
    default: return t;
    }
}

enum lm_dtype lm_dtype_packed(enum lm_dtype t) {
    switch (t) {
    case LM_DTYPE_F32: return LM_DTYPE_F32_P16;
    case LM_DTYPE_F16: return LM_DTYPE_F16_P16;
    case LM_DTYPE_BF16: return LM_DTYPE_BF16_P16;
    case LM_DTYPE_Q8_0: return LM_DTYPE_Q8_0_P16;
    default: return t;
    }
}

int lm_dtype_is_packed(enum lm_dtype t) { return lm_dtype_unpacked(t) != t; }

size_t lm_cpu_packed_bytes(enum lm_dtype t, int m, int k) {
    size_t groups = (size_t)(m + GROUP - 1) / GROUP;
    return groups * GROUP * lm_dtype_row_bytes(lm_dtype_unpacked(t), k);
}

/* Bytes of one packed group of k columns. */
static size_t group_bytes(enum lm_dtype base, int k) { return GROUP * lm_dtype_row_bytes(base, k); }

void lm_cpu_pack(void *dst, const void *src, enum lm_dtype t, int m, int k) {
    assert(!lm_dtype_is_packed(t));
    const size_t gb = group_bytes(t, k), rb = lm_dtype_row_bytes(t, k);
    const int groups = (m + GROUP - 1) / GROUP;
    memset(dst, 0, (size_t)groups * gb);
    for (int g = 0; g < groups; g++) {
        unsigned char *gd = (unsigned char *)dst + (size_t)g * gb;
        for (int j = 0; j < GROUP && g * GROUP + j < m; j++) {
            const unsigned char *row = (const unsigned char *)src + (size_t)(g * GROUP + j) * rb;
            switch (t) {
            case LM_DTYPE_F32:
                for (int l = 0; l < k; l++) memcpy(gd + ((size_t)l * GROUP + j) * 4, row + (size_t)l * 4, 4);
                break;
            case LM_DTYPE_F16:
                for (int l = 0; l < k; l++) memcpy(gd + ((size_t)l * GROUP + j) * 2, row + (size_t)l * 2, 2);
                break;
            case LM_DTYPE_BF16: {
                const int s = lm_cpu_bf16_slot(j);
                for (int l = 0; l < k; l++) memcpy(gd + ((size_t)l * GROUP + s) * 2, row + (size_t)l * 2, 2);
                break;
            }
            case LM_DTYPE_Q8_0: {
                const struct lm_block_q8_0 *b = (const struct lm_block_q8_0 *)row;
                for (int q = 0; q < k / LM_Q8_0_BLOCK; q++) {
                    unsigned char *bd = gd + (size_t)q * Q8_GROUP_BLOCK_BYTES;
                    memcpy(bd + 2 * j, &b[q].d, 2);
                    for (int i = 0; i < LM_Q8_0_BLOCK; i++)
                        bd[2 * GROUP + lm_cpu_q8_0_slot(j, i)] = (unsigned char)b[q].qs[i];
                }
                break;
            }
            default: assert(0);
            }
        }
    }
}

float lm_cpu_weight(const void *w, enum lm_dtype t, int k, long r, long l) {
    if (!lm_dtype_is_packed(t)) {
        switch (t) {
        case LM_DTYPE_F32: return ((const float *)w)[r * k + l];
        case LM_DTYPE_F16: return lm_f16_to_f32(((const uint16_t *)w)[r * k + l]);
        case LM_DTYPE_BF16: return lm_bf16_to_f32(((const uint16_t *)w)[r * k + l]);
        case LM_DTYPE_Q8_0: {
            const struct lm_block_q8_0 *b =
                (const struct lm_block_q8_0 *)w + r * (k / LM_Q8_0_BLOCK) + l / LM_Q8_0_BLOCK;
            return lm_f16_to_f32(b->d) * (float)b->qs[l % LM_Q8_0_BLOCK];
        }
        default: assert(0); return 0;
        }
    }
    const enum lm_dtype base = lm_dtype_unpacked(t);
    const unsigned char *g = (const unsigned char *)w + (size_t)(r / GROUP) * group_bytes(base, k);
    const int j = (int)(r % GROUP);
    switch (base) {
    case LM_DTYPE_F32: {
        float f;
        memcpy(&f, g + ((size_t)l * GROUP + j) * 4, 4);
        return f;
    }
    case LM_DTYPE_F16:
    case LM_DTYPE_BF16: {
        uint16_t h;
        int s = base == LM_DTYPE_BF16 ? lm_cpu_bf16_slot(j) : j;
        memcpy(&h, g + ((size_t)l * GROUP + s) * 2, 2);
        return base == LM_DTYPE_BF16 ? lm_bf16_to_f32(h) : lm_f16_to_f32(h);
    }
    case LM_DTYPE_Q8_0: {
        const unsigned char *b = g + (size_t)(l / LM_Q8_0_BLOCK) * Q8_GROUP_BLOCK_BYTES;
        uint16_t d;
        memcpy(&d, b + 2 * j, 2);
        return lm_f16_to_f32(d) * (float)(int8_t)b[2 * GROUP + lm_cpu_q8_0_slot(j, (int)(l % LM_Q8_0_BLOCK))];
    }
    default: assert(0); return 0;
    }
}

float lm_cpu_q8_0_block(const void *w, enum lm_dtype t, int k, long r, long b, int8_t *q) {
    assert(lm_dtype_unpacked(t) == LM_DTYPE_Q8_0);
    uint16_t d;
    if (!lm_dtype_is_packed(t)) {
        const struct lm_block_q8_0 *blk = (const struct lm_block_q8_0 *)w + r * (k / LM_Q8_0_BLOCK) + b;
        memcpy(&d, &blk->d, 2);
        memcpy(q, blk->qs, LM_Q8_0_BLOCK);
        return lm_f16_to_f32(d);
    }
    const unsigned char *g = (const unsigned char *)w + (size_t)(r / GROUP) * group_bytes(LM_DTYPE_Q8_0, k);
    const unsigned char *bp = g + (size_t)b * Q8_GROUP_BLOCK_BYTES;
    const int j = (int)(r % GROUP);
    memcpy(&d, bp + 2 * j, 2);
    for (int c = 0; c < LM_Q8_0_BLOCK; c++) q[c] = (int8_t)bp[2 * GROUP + lm_cpu_q8_0_slot(j, c)];
    return lm_f16_to_f32(d);
}

void lm_cpu_matrix_row(float *y, const void *w, enum lm_dtype t, int k, long row) {
    if (!lm_dtype_is_packed(t)) {
        lm_cpu_ops_scalar()->convert_row(y, (const char *)w + (size_t)row * lm_dtype_row_bytes(t, k), t, k);
        return;
    }
    for (int l = 0; l < k; l++) y[l] = lm_cpu_weight(w, t, k, row, l);
}
