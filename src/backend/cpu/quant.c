/* quant.c: Q8_0 quantization (see quant.h). Plain loops: weights are quantized once, when a
 * bundle is built; lm_q8_0_quantize_act is the reference of the fast kernels' activation
 * quantizer (kern_matmul.h). */
#include "backend/cpu/quant.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/ops.h"

/* One block of 32 as ggml's quantize_row_q8_0_ref: q[j] = roundf(x[j] / d) with
 * d = max |x| / 127 (0 for a zero block); returns d in float32. */
static float quantize_block(const float *xb, int8_t *q) {
    float amax = 0.0f;
    for (int j = 0; j < LM_Q8_0_BLOCK; j++) {
        float v = fabsf(xb[j]);
        amax = v > amax ? v : amax;
    }
    const float d = amax / 127.0f;
    const float id = d ? 1.0f / d : 0.0f;
    for (int j = 0; j < LM_Q8_0_BLOCK; j++) q[j] = (int8_t)roundf(xb[j] * id);
    return d;
}

void lm_q8_0_quantize_row(const float *x, struct lm_block_q8_0 *y, long n) {
    assert(n % LM_Q8_0_BLOCK == 0);
    for (long b = 0; b < n / LM_Q8_0_BLOCK; b++)
        y[b].d = lm_f32_to_f16(quantize_block(x + b * LM_Q8_0_BLOCK, y[b].qs));
}

void lm_q8_0_quantize_act(const float *x, int8_t *q, float *d, long n) {
    assert(n % LM_Q8_0_BLOCK == 0);
    for (long b = 0; b < n / LM_Q8_0_BLOCK; b++)
        d[b] = quantize_block(x + b * LM_Q8_0_BLOCK, q + b * LM_Q8_0_BLOCK);
}

void lm_q8_0_dequantize_row(const struct lm_block_q8_0 *x, float *y, long n) {
    assert(n % LM_Q8_0_BLOCK == 0);
    for (long b = 0; b < n / LM_Q8_0_BLOCK; b++) {
        uint16_t h;
        memcpy(&h, &x[b].d, 2);
        const float d = lm_f16_to_f32(h);
        for (int j = 0; j < LM_Q8_0_BLOCK; j++) y[b * LM_Q8_0_BLOCK + j] = d * (float)x[b].qs[j];
    }
}
