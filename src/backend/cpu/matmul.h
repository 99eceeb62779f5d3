/* matmul.h: the fast CPU matmul behind lm_cpu_ops_fast()->matmul, and the other declarations
 * the fast kernels share (internal to backend/cpu).
 *
 * y[n, m] = x[n, k] . w[m, k]^T for weights of any enum lm_dtype (row-major or packed),
 * threaded over groups of 16 weight rows with the pool. Contract as lm_cpu_ops.matmul (ops.h),
 * including batch invariance: every y[t, r] is the one chain acc = fma(w'[r, l], x[t, l], acc)
 * over l = 0..k-1 in order from 0, where w' is the weight's exact float32 value (bf16/f16
 * widened, Q8_0 dequantized: d * q is exact in float32), whatever n is and whichever path, tile
 * or thread computes it; the kernels vectorize across rows, never across l. Q8_0 weights on the
 * int8 path (ops.h, lm_cpu_q8_0_path) follow that path's chain over blocks instead, and bf16
 * weights on the bf16 path (lm_cpu_bf16_path) the chain over column pairs of VDPBF16PS, with the
 * same guarantees.
 * Paths (all giving those bits; kern_matmul.h has the details):
 *   n < LM_MM_PANEL_MIN tokens on packed weights (decode, batched decode): weights widened in
 *     registers as they stream, register tiles of up to 4 groups x 1 token or 1 group x 6
 *     tokens, each weight read from memory once per call;
 *   n >= LM_MM_PANEL_MIN (prefill), or row-major weights mapped from a file: each thread widens
 *     a group of 16 rows into a float32 panel (L2-resident) and runs an outer-product tile of 6
 *     tokens x 16 rows over every token (row-major weights, one token: transposed 8 x 8 in
 *     registers instead).
 * The code is kern_matmul.h, compiled once per vector target (kern_avx512bf16.c,
 * kern_avx512vnni.c, kern_avx512.c, kern_avx2.c, kern_generic.c); ops_fast.c picks one at run
 * time. Every target gives the same bits.
 * Scratch: the calling thread keeps one buffer (lm_cpu_scratch); the steady state allocates
 * nothing. */
#ifndef LM_BACKEND_CPU_MATMUL_H
#define LM_BACKEND_CPU_MATMUL_H

#include "backend/cpu/ops.h"

#define LM_MM_PANEL_MIN 24 /* tokens from which packed weights go through float32 panels */
#define LM_MM_GROUP 16 /* rows per packed group (ops.h, lm_cpu_pack) */

/* The slot of row j (< 16) inside a packed bfloat16 column (pack.c). */
int lm_cpu_bf16_slot(int j);
/* Element (r, l) of a [*, k] matrix of dtype t, row-major or packed, widened exactly (the
 * scalar reference's access). */
float lm_cpu_weight(const void *w, enum lm_dtype t, int k, long r, long l);

/* Block b (< k/32) of row r of Q8_0 weights (t: LM_DTYPE_Q8_0, row-major or packed):
 * q[0..32) = its int8 quants; returns its float16 scale widened (the int8 matmul reference). */
float lm_cpu_q8_0_block(const void *w, enum lm_dtype t, int k, long r, long b, int8_t *q);
/* Byte offset of quant (row j < 16, column c < 32) in a packed Q8_0 group block after its 16
 * scales (ops.h: runs of 4 columns, row j's 4 quants at 4j). */
static inline int lm_cpu_q8_0_slot(int j, int c) { return (c / 4) * 4 * LM_MM_GROUP + 4 * j + c % 4; }

/* The calling thread's scratch of at least `floats` float32, 64-byte aligned: grown when a larger
 * request comes, kept for the next call, freed when the thread exits. NULL when out of memory.
 * Valid until this thread's next call. */
float *lm_cpu_scratch(size_t floats);

/* The kernel table of each vector target (kern_<target>.c). avx2 and avx512 exist only in
 * x86-64 builds and may be called only on CPUs with those features (ops_fast.c checks). */
const struct lm_cpu_ops *lm_cpu_ops_generic(void);
#if defined(__x86_64__)
const struct lm_cpu_ops *lm_cpu_ops_avx2(void);
const struct lm_cpu_ops *lm_cpu_ops_avx512(void);
const struct lm_cpu_ops *lm_cpu_ops_avx512vnni(void);
const struct lm_cpu_ops *lm_cpu_ops_avx512bf16(void);
#endif

#endif
