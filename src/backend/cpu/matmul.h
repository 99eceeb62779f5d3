/* matmul.h: the fast CPU matmul behind lm_cpu_ops_fast()->matmul (internal to backend/cpu).
 *
 * y[n, m] = x[n, k] . w[m, k]^T for weights of any enum lm_dtype, threaded over the m weight
 * rows with the pool. Contract as lm_cpu_ops.matmul (ops.h), including batch invariance: every
 * y[t, r] is one dot product computed in one fixed order, whatever n is and whichever path,
 * tile or thread computes it:
 *   acc = 0 (VL float32 lanes); for each VL-wide chunk c of k in order:
 *   acc = fma(w'[c], x[c], acc); s = horizontal sum of acc; then s += w'[j] * x[j] for the
 *   tail j in order; where w' is the weight's exact float32 value (bf16/f16 widened, Q8_0
 *   dequantized: d * q is exact in float32).
 * Paths (all giving those bits):
 *   n < LM_MM_PANEL_MIN tokens (decode, small batches): weights widened in registers as they
 *     stream, a tile of up to 8 rows x 1 token or 4 rows x 3 tokens per pass, so each weight row
 *     is read from memory once per call;
 *   n >= LM_MM_PANEL_MIN (prefill, batched decode): each thread widens a panel of rows into
 *     float32 scratch once (L2-resident), then runs a 4-row x 3-token float32 register tile over
 *     every token: the conversion is paid once per call, not once per token.
 * Scratch: the calling thread keeps one buffer (grown when a larger matmul comes, freed at
 * thread exit); the steady state allocates nothing. */
#ifndef LM_BACKEND_CPU_MATMUL_H
#define LM_BACKEND_CPU_MATMUL_H

#include "backend/cpu/ops.h"

#define LM_MM_PANEL_MIN 4
#define LM_MM_GROUP 16 /* rows per packed group (ops.h, lm_cpu_pack) */

/* The slot of row j (< 16) inside a packed bfloat16 column (pack.c). */
int lm_cpu_bf16_slot(int j);
/* Element (r, l) of a [*, k] matrix of dtype t, row-major or packed, widened exactly (the
 * scalar reference's access). */
float lm_cpu_weight(const void *w, enum lm_dtype t, int k, long r, long l);

void lm_cpu_matmul_fast(struct lm_pool *pool, float *y, const float *x, const void *w,
                        enum lm_dtype wt, int n, int k, int m);

/* The vector target of the fast kernels: "avx512", "avx2" or "generic". */
const char *lm_cpu_simd_name(void);

#endif
