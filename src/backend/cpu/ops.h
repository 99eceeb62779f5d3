/* ops.h: the CPU kernels behind one ops table: matmul, RMSNorm, RoPE, SwiGLU, softmax,
 * attention, row conversion, and the Q8_0 activation quantizer of the int8 matmul path.
 *
 * Two tables implement the same contract: lm_cpu_ops_scalar() holds plain single-threaded loops
 * that read like the math (the reference the tests compare against), lm_cpu_ops_fast() the SIMD
 * versions, threaded over rows with a base/threadpool.h pool and returning only when every thread
 * is done (the barrier between ops). The fast kernels are compiled for several vector targets in
 * one binary (AVX-512F, also with VNNI; AVX2+FMA+F16C; GCC vector extensions: NEON on AArch64,
 * SSE2 on older x86-64) and the best one the CPU runs is chosen at run time (cpuid);
 * lm_cpu_ops_fast()->name says which. Every target's matmul gives the scalar reference's bits.
 *
 * Activations are float32, row-major. Weights may be float32, float16 or bfloat16 and are
 * widened to float32 on the fly, or Q8_0 blocks (see the matmul's contract). All pointers are borrowed for the duration of the call; output
 * rows must not alias input rows unless a kernel says it works in place. A NULL pool runs on
 * the calling thread. Kernels never allocate. */
#ifndef LM_BACKEND_CPU_OPS_H
#define LM_BACKEND_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/threadpool.h"

/* Element type of a weight matrix. */
enum lm_dtype {
    LM_DTYPE_F32,
    LM_DTYPE_F16,  /* IEEE 754 binary16 */
    LM_DTYPE_BF16, /* bfloat16: the top 16 bits of a float32 */
    LM_DTYPE_Q8_0, /* GGUF/ggml Q8_0: blocks of 32 weights, a float16 scale d then 32 int8 q,
                      weight = d * q (backend/cpu/quant.h); rows are whole blocks (k % 32 == 0) */
    /* The same four element types with the rows packed by 16 (lm_cpu_pack): the layout the fast
     * matmul streams fastest, made when weights are copied into memory. Packing only moves
     * values: a matmul gives the same bits on packed and row-major weights. */
    LM_DTYPE_F32_P16,
    LM_DTYPE_F16_P16,
    LM_DTYPE_BF16_P16,
    LM_DTYPE_Q8_0_P16,
};

/* "f32", "f16", "bf16", "q8_0" (packed variants: the same names). */
const char *lm_dtype_name(enum lm_dtype t);
/* Bytes per element: 4 or 2; for a block type (Q8_0), 0 (use lm_dtype_row_bytes). */
size_t lm_dtype_size(enum lm_dtype t);
/* Bytes of a row of n elements (n a multiple of the block for block types); packed variants:
 * the row's share of its group. */
size_t lm_dtype_row_bytes(enum lm_dtype t, long n);
/* The element type without the packing (LM_DTYPE_BF16_P16 -> LM_DTYPE_BF16). */
enum lm_dtype lm_dtype_unpacked(enum lm_dtype t);
/* True for the _P16 variants. */
int lm_dtype_is_packed(enum lm_dtype t);

/* Packed weights. A matrix [m, k] of element type t (not packed) becomes ceil(m/16) groups of
 * 16 rows (the last zero-padded), each group stored column by column: for each l < k the 16
 * rows' elements (Q8_0: for each block of 32 columns, the 16 rows' float16 scales, then for each
 * of the block's 8 runs of 4 columns, the 16 rows' 4 int8 quants, row j's at bytes 4j..4j+3: the
 * operand layout of 4-wide int8 dot products, maddubs+madd or VNNI dpbusd). Within a column
 * the row order is the fast kernels' (backend/cpu/kern_matmul.h). lm_cpu_packed_bytes: the
 * size; lm_cpu_pack writes it from row-major `src` (dst and src do not overlap); the result has
 * dtype lm_dtype_packed(t). */
size_t lm_cpu_packed_bytes(enum lm_dtype t, int m, int k);
void lm_cpu_pack(void *dst, const void *src, enum lm_dtype t, int m, int k);
enum lm_dtype lm_dtype_packed(enum lm_dtype t);
/* y[0..k) = float32 of row `row` of a matrix of k columns of dtype t (row-major or packed): an
 * embedding lookup. */
void lm_cpu_matrix_row(float *y, const void *w, enum lm_dtype t, int k, long row);

/* Exact widening of a bfloat16. */
static inline float lm_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* Exact widening of a binary16 (subnormals, inf and NaN included). */
float lm_f16_to_f32(uint16_t h);
/* Rounds to nearest even (NaN stays NaN), as torch's float32 -> bfloat16 cast does. */
uint16_t lm_f32_to_bf16(float f);
/* The activation rounding of the bf16 path (lm_cpu_bf16_path, LM_BF16_ACT): to nearest even
 * like lm_f32_to_bf16, but float32 subnormals become a zero of their sign and NaN a quiet NaN,
 * as Intel's VCVTNE2PS2BF16 does (DAZ, RNE, MXCSR not consulted: Intel SDM vol. 2). */
uint16_t lm_f32_to_bf16_act(float f);
/* Rounds to nearest even with overflow to inf, as the F16C instruction does. */
uint16_t lm_f32_to_f16(float f);

/* One sequence's share of a batched, paged attention call (lm_cpu_ops.attention_paged). */
struct lm_attn_seq {
    int n;                 /* its query rows: consecutive in q and out, after the previous
                              sequence's rows */
    int pos0;              /* position of its first query; query i attends to 0..pos0+i */
    const int32_t *blocks; /* block table: position t is row blocks[t / block_size] *
                              block_size + t % block_size of the K and V arrays; borrowed */
};

struct lm_cpu_ops {
    const char *name; /* "scalar", "avx512bf16", "avx512vnni", "avx512", "avx2", "generic", "neon" */

    /* y[n, m] = x[n, k] . w[m, k]^T (a torch Linear without bias: y = x @ w.T).
     * x: float32 rows of k; w: m rows of k elements of dtype wt (row-major or packed); y:
     * float32 rows of m. Each y[t, r] is one float32 multiply-add chain over l = 0..k-1 in
     * order, acc = fma(w[r, l], x[t, l], acc) from 0, with w widened exactly (the scalar
     * reference computes the same chain with fmaf, so on FMA hardware both give the same bits).
     * Q8_0 and bfloat16 weights have a second chain each, chosen per process (lm_cpu_q8_0_path,
     * lm_cpu_bf16_path below), with the same guarantees. The fast version splits the m weight
     * rows over the pool and tiles tokens so that each weight row is read once per block of
     * tokens. Batch invariance (the engine's batching
     * relies on it): row i of y depends only on row i of x and on w, bit for bit, whatever n
     * and the other rows are (tests/test_batch.c checks n = 1..16 against n = 1). */
    void (*matmul)(struct lm_pool *pool, float *y, const float *x, const void *w,
                   enum lm_dtype wt, int n, int k, int m);

    /* y[i, :] = x[i, :] / sqrt(mean(x[i, :]^2) + eps) * w for each of n rows of d (float32).
     * In place (y == x) is allowed. RMSNorm, Zhang & Sennrich 2019; as HF's Qwen3RMSNorm. */
    void (*rmsnorm)(struct lm_pool *pool, float *y, const float *x, const float *w, int n, int d,
                    float eps);

    /* Rotary position embedding in place, rotate-half form (HF apply_rotary_pos_emb):
     * x: [n, n_heads, head_dim]; token i is at position pos0 + i; for j < head_dim/2 with
     * a = float32(inv_freq[j] * float32(pos)): (x[j], x[j+h]) <- (x[j] cos a - x[j+h] sin a,
     * x[j+h] cos a + x[j] sin a), h = head_dim/2. inv_freq: [head_dim/2]. RoFormer, Su et al. 2021.
     * head_dim is even and at most 512. */
    void (*rope)(struct lm_pool *pool, float *x, int n, int n_heads, int head_dim, int pos0,
                 const float *inv_freq);

    /* y[i] = silu(gate[i]) * up[i] for i < n, silu(g) = g / (1 + exp(-g)). y may alias gate.
     * SwiGLU, Shazeer 2020. */
    void (*swiglu)(struct lm_pool *pool, float *y, const float *gate, const float *up, long n);

    /* x[0..n) <- softmax(x) in place (max-subtracted, float32). */
    void (*softmax)(float *x, int n);

    /* Causal grouped-query attention of n new queries over a KV cache.
     * q: [n, n_heads * head_dim] (after RoPE); k, v: cache rows [pos0 + n, kv_stride] float32
     * where row t holds the n_kv_heads heads of position t at offsets g * head_dim; query i is at
     * position pos0 + i and attends to positions 0..pos0+i; query head h uses KV head
     * h / (n_heads / n_kv_heads). out: [n, n_heads * head_dim] = softmax(q.k^T * scale) . v.
     * scratch: lm_pool_size(pool) * (pos0 + n) floats. Vaswani et al. 2017; GQA, Ainslie 2023. */
    void (*attention)(struct lm_pool *pool, float *out, const float *q, const float *k,
                      const float *v, int n, int pos0, int n_heads, int n_kv_heads, int head_dim,
                      int kv_stride, float scale, float *scratch);

    /* Causal grouped-query attention of several sequences' new queries over a paged KV cache
     * (vLLM's PagedAttention layout, Kwon et al. 2023). q: [sum of n, n_heads * head_dim];
     * k, v: cache rows [*, kv_stride] float32, row r holding the n_kv_heads heads of one
     * position at offsets g * head_dim; each sequence finds its positions through its block
     * table (struct lm_attn_seq). out: like q. scratch: lm_pool_size(pool) * max(pos0 + n)
     * floats. Batch invariance: each (query, head) is computed with exactly the operations of
     * `attention` over the same positions, whatever the other sequences and the block layout,
     * so a sequence gets the same bits alone or batched (tests/test_batch.c). */
    void (*attention_paged)(struct lm_pool *pool, float *out, const float *q, const float *k,
                            const float *v, const struct lm_attn_seq *seqs, int n_seqs,
                            int n_heads, int n_kv_heads, int head_dim, int kv_stride,
                            int block_size, float scale, float *scratch);

    /* y[0..n) = float32(w[0..n)) of dtype wt (an embedding row). */
    void (*convert_row)(float *y, const void *w, enum lm_dtype wt, int n);

    /* The activation quantizer of the int8 Q8_0 path (lm_q8_0_path): x[0..n) float32 (n a
     * multiple of 32) to q[0..n) int8 and d[0 .. n/32) float32 block scales, the bits of
     * lm_q8_0_quantize_act (quant.h; ggml's quantize_row_q8_0 rounding, float32 scales). The
     * matmul calls it itself; exposed for the tests. */
    void (*quantize_q8_0_act)(const float *x, int8_t *q, float *d, long n);
};

/* How every matmul of this process (scalar reference and fast kernels alike) multiplies Q8_0
 * weights (LM_DTYPE_Q8_0 and its packed variant; other dtypes are unaffected):
 *   LM_Q8_0_DEQUANT: weights dequantized exactly (d * q) and the float32 chain of
 *     lm_cpu_ops.matmul; the activations stay float32;
 *   LM_Q8_0_INT8: the activations are quantized too, per row and per block of 32 like the
 *     weights (lm_q8_0_quantize_act, quant.h: ggml's quantize_row_q8_0 rounding with a float32
 *     scale), and each block is an exact int32 dot product of int8s (llama.cpp's
 *     ggml_vec_dot_q8_0_q8_0: maddubs/madd on AVX2). Then y[t, r] is the chain
 *     acc = fma((float)isum(r, t, b), dw(r, b) * dx(t, b), acc) over the blocks b = 0..k/32-1 in
 *     order from 0 (dw: the weight block's float16 scale widened; dx: the activation block's
 *     float32 scale; the product rounded to float32 first), the same bits on every target and in
 *     the scalar reference, and batch invariant as before (each activation row is quantized on
 *     its own). The accuracy cost is the 8-bit rounding of the activations (docs/perf-notes-cpu.md,
 *     "Q8_0").
 * The default is LM_Q8_0_INT8 (faster: docs/perf-notes-cpu.md); LM_CPU_Q8_ACT=0 (or off,
 * false, no) in the environment at the first call asks for LM_Q8_0_DEQUANT (1, on, true, yes:
 * LM_Q8_0_INT8); another value keeps the default after a warning on stderr (base/env.h). */
enum lm_q8_0_path {
    LM_Q8_0_DEQUANT = 0,
    LM_Q8_0_INT8 = 1,
};
/* The current path (the environment's choice until lm_cpu_set_q8_0_path). */
enum lm_q8_0_path lm_cpu_q8_0_path(void);
/* Sets the path for every later matmul call of the process. For tests and benchmarks that
 * compare the two; a sequence whose steps ran under different paths is not batch invariant. */
void lm_cpu_set_q8_0_path(enum lm_q8_0_path p);
/* "dequant" or "int8". */
const char *lm_q8_0_path_name(enum lm_q8_0_path p);

/* How every matmul of this process multiplies bfloat16 weights (LM_DTYPE_BF16 and its packed
 * variant; other dtypes are unaffected):
 *   LM_BF16_F32: the float32 chain of lm_cpu_ops.matmul, activations kept float32 (every
 *     target gives the scalar reference's bits);
 *   LM_BF16_ACT: the activations are rounded to bfloat16 first (x' = lm_f32_to_bf16_act(x), per
 *     element), and each y[t, r] is the chain of AVX512-BF16's VDPBF16PS over column pairs:
 *     for p = 0 .. k/2 - 1 in order, acc = fma(w[r, 2p+1], x'[t, 2p+1], acc), then
 *     acc = fma(w[r, 2p], x'[t, 2p], acc) (the odd column first, each step one rounding: Intel
 *     SDM, VDPBF16PS; the products of two bfloat16s are exact in float32); an odd k ends with
 *     acc = fma(w[r, k-1], x'[t, k-1], acc). CPUs with AVX512-BF16 (Intel Cooper Lake and
 *     Sapphire Rapids on, AMD Zen 4 on) run it as one instruction per 32 products (target
 *     "avx512bf16"; the float32 FMA takes 16); every other target computes the same
 *     chain with FMAs, so the bits agree across targets and with the scalar reference, and the
 *     path stays batch invariant. One caveat: VDPBF16PS also flushes subnormal weights and
 *     sums to zero (DAZ/FTZ), which the FMA targets do not; only values under 1.2e-38 can tell
 *     them apart. This is llama.cpp's arithmetic for bf16 weights on such CPUs (its vec_dot
 *     type for GGML_TYPE_BF16 is bf16). The accuracy cost is the 8-bit mantissa of the
 *     activations (docs/perf-notes-cpu.md, "bf16 activations").
 * The default is LM_BF16_F32 on every CPU: on the one AVX512-BF16 CPU measured (an Intel
 * Sapphire Rapids Xeon), VDPBF16PS ran the bf16 path's prefill matmuls at 0.76-0.91x the
 * float32 FMAs' speed (docs/perf-notes-cpu.md, "bf16 activations"); AMD Zen 4/5, whose
 * VDPBF16PS is listed at the FMA's rate (so twice its products), are not measured.
 * LM_CPU_BF16_ACT=1 (or 0; base/env.h spellings) in the environment at the first call
 * chooses. */
enum lm_bf16_path {
    LM_BF16_F32 = 0,
    LM_BF16_ACT = 1,
};
/* The current path (the environment's choice until lm_cpu_set_bf16_path). */
enum lm_bf16_path lm_cpu_bf16_path(void);
/* Sets the path for every later matmul call of the process (tests and benchmarks). */
void lm_cpu_set_bf16_path(enum lm_bf16_path p);
/* "f32" or "bf16" (the activations' type). */
const char *lm_bf16_path_name(enum lm_bf16_path p);

/* The plain reference kernels (single-threaded; the pool argument is ignored). */
const struct lm_cpu_ops *lm_cpu_ops_scalar(void);
/* The fast kernels of the best vector target this CPU runs, chosen at the first call (cpuid)
 * and the same for the life of the process: "avx512bf16" (AVX-512 with VNNI and BF16: the bf16
 * path's dot products in one instruction), "avx512vnni" (AVX-512 with VNNI: only the int8
 * Q8_0 dot product differs), "avx512", "avx2", "generic" (x86-64 without AVX2) or "neon"
 * (AArch64). The environment variable LM_CPU_KERNELS names a target to prefer (one
 * this CPU cannot run is passed over: check ->name; a name that is no target of this build is
 * passed over after a warning on stderr). Never NULL. */
const struct lm_cpu_ops *lm_cpu_ops_fast(void);
/* The fast kernels of one target by name (as ->name), or NULL when this build lacks it or this
 * CPU cannot run it. For tests and benchmarks that compare targets. */
const struct lm_cpu_ops *lm_cpu_ops_target(const char *name);
/* The targets this build holds, best first, NULL-terminated (static storage). */
const char *const *lm_cpu_ops_targets(void);

#endif
