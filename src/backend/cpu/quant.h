/* quant.h: GGUF/ggml Q8_0 blocks: quantizing float32 rows to them and back.
 *
 * Layout (ggml-common.h block_q8_0, GGUF tensor type 8): a row of k weights (k a multiple of 32)
 * is k/32 blocks of 34 bytes: a float16 scale d, then 32 int8 values q; weight i of a block is
 * d * q[i]. Quantization is ggml's quantize_row_q8_0_ref (the same rounding as llama.cpp's
 * converter, gguf-py quants.py): per block amax = max |x|, d = amax / 127, id = d ? 1/d : 0,
 * q[i] = roundf(x[i] * id) (halves away from zero), and d is stored rounded to float16.
 * Dequantized weights d * q are exact in float32 (an 11-bit by 8-bit product). */
#ifndef LM_BACKEND_CPU_QUANT_H
#define LM_BACKEND_CPU_QUANT_H

#include <stddef.h>
#include <stdint.h>

#define LM_Q8_0_BLOCK 32 /* weights per block */

struct lm_block_q8_0 {
    uint16_t d;                /* float16 scale */
    int8_t qs[LM_Q8_0_BLOCK];  /* quants */
};
#ifdef __cplusplus
static_assert(sizeof(struct lm_block_q8_0) == 34, "Q8_0 blocks are 34 bytes");
#else
_Static_assert(sizeof(struct lm_block_q8_0) == 34, "Q8_0 blocks are 34 bytes");
#endif

/* y[0 .. n/32) = Q8_0 of x[0..n); n a multiple of 32 (assert). ggml quantize_row_q8_0_ref. */
void lm_q8_0_quantize_row(const float *x, struct lm_block_q8_0 *y, long n);
/* y[0..n) = d * q of the n/32 blocks at x (exact). */
void lm_q8_0_dequantize_row(const struct lm_block_q8_0 *x, float *y, long n);

/* Activations for the int8 matmul (ops.h, LM_Q8_0_INT8): x[0..n) (n a multiple of 32, assert;
 * finite values) to q[0..n) int8 and d[0 .. n/32) float32 scales, x[i] ~ d[i/32] * q[i]. Per
 * block the rounding of ggml's quantize_row_q8_0 (ggml/src/ggml-quants.c,
 * quantize_row_q8_0_ref): amax = max |x|, d = amax / 127, id = d ? 1/d : 0,
 * q = roundf(x * id) (halves away from zero, so |q| <= 127), except that d stays float32 (ggml
 * rounds it to float16 for storage; these blocks never leave memory). The reference; the fast
 * kernels' vector version gives the same bits (tests/test_quant.c). */
void lm_q8_0_quantize_act(const float *x, int8_t *q, float *d, long n);

#endif
