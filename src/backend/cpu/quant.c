/* quant.c: Q8_0 quantization (see quant.h). Plain loops: quantization runs once, when a bundle
 * is built; the kernels dequantize in registers (kern_matmul.h). */
#include "backend/cpu/quant.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/ops.h"

void lm_q8_0_quantize_row(const float *x, struct lm_block_q8_0 *y, long n) {
    assert(n % LM_Q8_0_BLOCK == 0);
    for (long b = 0; b < n / LM_Q8_0_BLOCK; b++) {
        const float *xb = x + b * LM_Q8_0_BLOCK;
        float amax = 0.0f;
        for (int j = 0; j < LM_Q8_0_BLOCK; j++) {
            float v = fabsf(xb[j]);
            amax = v > amax ? v : amax;
        }
        const float d = amax / 127.0f;
        const float id = d ? 1.0f / d : 0.0f;
        y[b].d = lm_f32_to_f16(d);
        for (int j = 0; j < LM_Q8_0_BLOCK; j++) y[b].qs[j] = (int8_t)roundf(xb[j] * id);
    }
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
