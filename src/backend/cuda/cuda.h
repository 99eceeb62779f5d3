/* cuda.h: the CUDA backend's kernels behind host-callable C wrappers (ops.cu), for NVIDIA GPUs
 * of compute capability 9.0 (H100/H200; the build also embeds portable compute_90 PTX).
 *
 * Built only when CMake finds nvcc (library lm_cuda, macro LM_HAVE_CUDA). Every pointer an op
 * takes is a DEVICE pointer unless its comment says host; ops are queued on the context's
 * stream and return before the GPU has run them (lm_cuda_ctx_sync waits and reports faults).
 * Matrices are bfloat16 (stored as uint16_t, row-major [rows, cols]); activations float32 unless
 * a name ends in _bf16. Launch errors come back as LM_ERR_IO with the CUDA error's text; shapes
 * the kernels cannot take as LM_ERR_SHAPE. The scalar CPU kernels (backend/cpu/ops.h) are the
 * reference each op is tested against (tests/test_cuda.c).
 *
 * Kernels, and the choices that make them fast on an H200 (docs/perf-notes.md has the numbers):
 * - lm_cuda_gemv: y = x . W^T for 1..8 activation rows with the weights streamed once (16-byte
 *   loads, 8 warps a block, each warp 1-4 weight rows, warp-shuffle reductions), an optional
 *   fused RMSNorm of x and a fused epilogue (store, residual add, SwiGLU of interleaved
 *   gate/up rows). Bit-identical per row whatever the number of rows (batch invariance).
 * - lm_cuda_gemm: bf16 x bf16 -> f32 (f32 accumulation) for the batched path (3+ rows): a weight-streaming
 *   tensor-core kernel (wgmma) up to 64 rows (lm_cuda_gemm_tc; LM_CUDA_GEMM_TC), cuBLAS above.
 * - lm_cuda_attention: paged grouped-query attention over a block table of bf16 K/V blocks, one
 *   block per (token, KV head) holding all of that head's query heads, online softmax in f32;
 *   decode and prefill (each token attends to positions 0..pos of its sequence, causal). Small
 *   decode launches use an 8-warp kernel that splits each position's head dims over lanes and
 *   loads the earlier positions' K/V before waiting on the preceding kernel (attn_dec).
 * - lm_cuda_sample: argmax, or temperature / top-k / top-p sampling with the draw on the device
 *   (radix selection over the logits' bits, no sort), so only token ids cross to the host. */
#ifndef LM_BACKEND_CUDA_CUDA_H
#define LM_BACKEND_CUDA_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "base/status.h"

/* ---- device and memory ---- */

struct lm_cuda_device_info {
    char name[128];    /* "NVIDIA H200" */
    int cc_major, cc_minor;
    int sm_count;      /* multiprocessors */
    size_t total_mem;  /* bytes of device memory */
    size_t free_mem;   /* bytes free now */
    int l2_bytes;      /* L2 cache size */
    int smem_optin;    /* bytes of shared memory a block may opt in to (227 KiB on Hopper) */
    int driver, runtime; /* CUDA versions, 1000 * major + 10 * minor */
};

/* Number of usable CUDA devices (0 when there is no driver, no device, or the driver is older
 * than the runtime). Never fails. */
int lm_cuda_device_count(void);
/* Facts about device `dev`. LM_ERR_UNSUPPORTED when it does not exist. */
lm_status lm_cuda_device_info(int dev, struct lm_cuda_device_info *out);

/* cudaMalloc / cudaFree on the current device. LM_ERR_NOMEM with the size in the message. */
lm_status lm_cuda_malloc(void **p, size_t bytes);
void lm_cuda_free(void *p); /* accepts NULL */
/* Synchronous copies (host <-> device) and fill: done when they return, so that a kernel queued
 * after them on any stream sees the bytes (a download does not wait for kernels still running on
 * a context's stream: lm_cuda_ctx_sync first); LM_ERR_IO on failure. */
lm_status lm_cuda_upload(void *dst_dev, const void *src_host, size_t bytes);
lm_status lm_cuda_download(void *dst_host, const void *src_dev, size_t bytes);
lm_status lm_cuda_memset(void *dst_dev, int byte, size_t bytes);

/* ---- contexts ---- */

/* A stream, a cuBLAS handle with its workspace, and scratch for the samplers. One thread uses a
 * context at a time. */
struct lm_cuda_ctx;

struct lm_cuda_ctx_params {
    int device;       /* CUDA device index (default 0) */
    bool pdl;         /* launch with programmatic dependent launch (Hopper): a kernel's blocks
                         start while its predecessor drains and prefetch their weights before
                         waiting on it (default true) */
    int max_rows;     /* rows lm_cuda_sample may take without allocating (default 256) */
    int gemv_rows;    /* weight rows per warp in lm_cuda_gemv: 0 = automatic, or 1, 2, 4 (for
                         experiments; SwiGLU epilogues always use 2) */
    bool attn_dec;    /* fused decode launches of lm_cuda_attention that fit the GPU in one wave
                         (head_dim x group <= 1024) use the 8-warp kernel that loads earlier
                         positions' K/V before waiting on the preceding kernel (default true; false:
                         those launches take the batched path: the decode kernel's 4-warp shape
                         where it fits, else the v6 kernel; docs/perf-notes.md v7, v21) */
};
struct lm_cuda_ctx_params lm_cuda_ctx_default_params(void);

/* Creates a context on params->device (NULL: defaults). LM_ERR_UNSUPPORTED when the device is
 * missing or older than compute capability 9.0, LM_ERR_NOMEM, LM_ERR_IO. Caller destroys. */
lm_status lm_cuda_ctx_create(const struct lm_cuda_ctx_params *params, struct lm_cuda_ctx **out);
void lm_cuda_ctx_destroy(struct lm_cuda_ctx *c); /* accepts NULL */
/* Waits for the queued work; LM_ERR_IO (with the CUDA error) if any of it failed. */
lm_status lm_cuda_ctx_sync(struct lm_cuda_ctx *c);
/* The context's cudaStream_t, as void * so C callers need no CUDA headers. Borrowed. */
void *lm_cuda_ctx_stream(struct lm_cuda_ctx *c);
/* Turns programmatic dependent launch on or off for later launches. */
void lm_cuda_ctx_set_pdl(struct lm_cuda_ctx *c, bool on);
void lm_cuda_ctx_set_gemv_rows(struct lm_cuda_ctx *c, int rows); /* 0, 1, 2 or 4 */
/* lm_cuda_gemv(_q8) launches over at least `rows` weight rows (default 32768, the lm_head:
 * LM_CUDA_GEMV_DYN_ROWS; 0 turns it off) hand out their last quarter of row groups from
 * counters, a warp taking the next group as it finishes one, instead of a fixed share each: the
 * same sums, in the same order, for every row (perf-notes v27). */
void lm_cuda_ctx_set_gemv_dyn_rows(struct lm_cuda_ctx *c, int rows);
int lm_cuda_ctx_gemv_dyn_rows(const struct lm_cuda_ctx *c); /* the bound now (0: off) */
/* GEMV launches this context has queued that dealt out row groups (a launch of at least the bound
 * also needs 4 rounds of the grid's warps and 32 warps; a captured graph's launch counts once). */
long lm_cuda_ctx_gemv_dealt(const struct lm_cuda_ctx *c);
/* Decode launches that fit one wave of it run the 8-warp decode attention (k_attn_dec, v7; on by
 * default, LM_CUDA_ATTN_DEC=0 turns it off for A/B runs: then the 4-warp batched shape or
 * k_attention, as for larger launches; a run of one sequence's tokens needs it). The setter
 * overrides the variable: `lumen cudabench --micro` and `--variants` set it per row. */
void lm_cuda_ctx_set_attn_dec(struct lm_cuda_ctx *c, bool on);
/* The 8-warp decode attention's rounds on the tensor cores (perf-notes v44): a warp's 16 positions
 * a round as mma.sync m16n8k16 products, q.k with q split into bf16 hi + lo parts and p.V with the
 * probabilities rounded to bf16 (k_attn_prefill's arithmetic), for head sizes 32, 64 and 128 and
 * groups of up to 8 query heads, where the output is bf16 (lm_cuda_attn.out_bf16; float32 outputs
 * keep the float32 rounds). On by default; LM_CUDA_ATTN_TC=0 turns it off for A/B runs. Set it
 * before a model captures its step graphs. */
void lm_cuda_ctx_set_attn_tc(struct lm_cuda_ctx *c, bool on);
/* Batched decode's attention: fused launches past one wave of the 8-warp kernel (with or without
 * a work list) whose tokens fit one wave of the decode kernel's 4-warp shape run that shape (on,
 * perf-notes v21); off, or for larger launches, k_attention (v6). Default on; LM_CUDA_ATTN_BATCH=0
 * turns it off for A/B runs. Set it (and attn_dec) before a model captures its step graphs, or
 * drop them after (lm_cuda_qwen3_set_options): a graph keeps the kernel and work-list size it was
 * captured with. */
void lm_cuda_ctx_set_attn_batch(struct lm_cuda_ctx *c, bool on);
bool lm_cuda_ctx_attn_batch(const struct lm_cuda_ctx *c);
/* lm_cuda_gemm runs lm_cuda_gemm_tc up to `rows` rows (0: cuBLAS always; at most 64) in `splits`
 * splits where the shape allows them (0: lm_cuda_gemm_tc_splits' plan; others for benchmarks).
 * A context starts with lm_cuda_gemm_tc_default_rows() (LM_CUDA_GEMM_TC, default 64, read once
 * per process) and LM_CUDA_GEMM_TC_SPLITS (default 0), for A/B measurements. */
void lm_cuda_ctx_set_gemm_tc(struct lm_cuda_ctx *c, int rows, int splits);
/* lm_cuda_gemm_tc's products on wgmma (sm_90a: one read of the token slice a warpgroup, where
 * mma.sync has each warp read all of it; perf-notes v22) or on mma.sync (the compute_90 PTX
 * always is). Same layouts of the sums, so either passes the same tests; the bits may differ
 * between the two. Default on; LM_CUDA_GEMM_WGMMA=0 turns it off, for A/B runs. Set it before a
 * model captures its step graphs. */
void lm_cuda_ctx_set_gemm_wgmma(struct lm_cuda_ctx *c, bool on);
bool lm_cuda_ctx_gemm_wgmma(const struct lm_cuda_ctx *c);
/* Whether lm_cuda_gemm_tc's launches of 1 to 32 rows in 2 or more splits move their cluster's
 * partial sums as pushes into the peers' shared memory counted on an mbarrier (st.async), instead
 * of the cluster barrier after the partials, reads of the peers' memory and a last barrier
 * (perf-notes v25): the same sums in the same order, so the same bits either way. Default on;
 * LM_CUDA_GEMM_PUSH=0 turns it off, LM_CUDA_GEMM_PUSH_ROWS=16 limits it to 16 rows, for A/B runs.
 * Set it before a model captures its step graphs. */
void lm_cuda_ctx_set_gemm_push(struct lm_cuda_ctx *c, bool on);
bool lm_cuda_ctx_gemm_push(const struct lm_cuda_ctx *c);
/* LM_CUDA_GEMM_SPREAD_ROWS (read at context creation; no setter): lm_cuda_gemm_tc's launches of
 * up to that many rows (default 1, 0 to 16; 0 turns it off, for A/B runs) ask for enough shared
 * memory that one block fits a multiprocessor, where all their clusters still fit at once, so that
 * the block scheduler does not put two on some while others idle (perf-notes v32: a shared
 * multiprocessor's products take ~0.4 us longer; tg128 +1.1-2.0%; at 4 and 8 rows -3%, the next
 * kernel's early blocks losing those multiprocessors). The same kernel, so the same bits. */

/* True when a launch of lm_cuda_gemm_tc over n rows in `splits` splits pushes its partials. */
bool lm_cuda_gemm_tc_pushes(const struct lm_cuda_ctx *c, int n, int splits);
/* lm_cuda_gemm_tc's weight rows a block: 64 or 128 to force one (where it fits), 0 (or any other
 * value) for its rule (lm_cuda_gemm_tc_rows_per_block). LM_CUDA_GEMM_TC_BM sets the start value,
 * for A/B runs. */
void lm_cuda_ctx_set_gemm_tc_bm(struct lm_cuda_ctx *c, int bm);
int lm_cuda_ctx_gemm_tc_bm(const struct lm_cuda_ctx *c);
/* Graph capture of the context's stream, for tests: capture_begin starts it (later launches on the
 * context are recorded, not run); capture_replay ends it, instantiates the graph, launches it
 * `replays` times, waits, and destroys it. LM_ERR_IO with CUDA's message on failure. */
lm_status lm_cuda_ctx_capture_begin(struct lm_cuda_ctx *c);
lm_status lm_cuda_ctx_capture_replay(struct lm_cuda_ctx *c, int replays);
int lm_cuda_gemm_tc_default_rows(void);
/* GEMV timeline, for performance work: with a buffer of `capacity` entries (0 frees it), every
 * lm_cuda_gemv, lm_cuda_mlp1 and k_gemm_tc (lm_cuda_gemm's tensor-core kernel) block launched
 * afterwards (graphs captured afterwards too) appends one entry (lm_cuda_mlp1's under its gate/up
 * matrix), the buffer wrapping around; so do the blocks of lm_cuda_gemv_screen at 1-2 rows (under
 * the screen's pointer) and of lm_cuda_argmax_screened (under the bf16 lm_head's). Times are the
 * GPU's %globaltimer in ns (about 1 us resolution on some parts: average over blocks). */
enum { LM_CUDA_TRACE_WORDS = 7 };
/* What an entry's launch was (lm_cuda_trace_entry.kind). */
enum lm_cuda_trace_kind {
    LM_CUDA_TRACE_MATRIX = 0, /* a GEMV, the MLP kernel or k_gemm_tc */
    LM_CUDA_TRACE_SCREEN = 1, /* lm_cuda_gemv_screen: t_mid is when x was staged, t_ready when it
                               * was also quantized */
    LM_CUDA_TRACE_PICK = 2,   /* lm_cuda_argmax_screened: t_mid is when the block's bounds were read
                               * and compared, t_ready when its candidates were known (x staged) */
};
struct lm_cuda_trace_entry {
    uintptr_t weights;          /* the launch's weight pointer: one launch per matrix and step */
    int m, k, block;            /* rows, columns, block (blockIdx.x, + gridDim.x * blockIdx.y for
                                 * k_gemm_tc and the pick) */
    int kind;                   /* enum lm_cuda_trace_kind */
    int sm;                     /* k_gemm_tc, the screen and the pick: the multiprocessor the
                                 * block ran on (%smid); 0 for the GEMV and MLP kernels */
    unsigned long long t_start; /* block began */
    unsigned long long t_waited; /* its wait on the preceding kernel returned */
    unsigned long long t_ready; /* its x was staged (the GEMV kernel records t_waited here);
                                 * k_gemm_tc: its own slice's products were done (before the
                                 * cluster's sums) */
    unsigned long long t_end;   /* it finished */
    unsigned long long t_mid;   /* k_gemm_tc: its last slice of x landed, or, with
                                 * LM_CUDA_TRACE_SYNC=1 in the environment, it passed the cluster
                                 * barrier after writing its partials; the screen and the pick:
                                 * lm_cuda_trace_kind's; 0 for the GEMV kernels */
};
lm_status lm_cuda_ctx_trace(struct lm_cuda_ctx *c, int capacity); /* LM_ERR_NOMEM */
/* Copies the last min(max, recorded) entries, oldest first; *n gets the count. Waits for the
 * stream. */
lm_status lm_cuda_ctx_trace_read(struct lm_cuda_ctx *c, struct lm_cuda_trace_entry *out, int max, int *n);

/* ---- linear layers ---- */

enum lm_cuda_epilogue {
    LM_CUDA_EPI_STORE,  /* y[t, j] = acc */
    LM_CUDA_EPI_ADD,    /* y[t, j] += acc (the residual connection; y may not alias x) */
    LM_CUDA_EPI_SWIGLU, /* W's rows are interleaved gate/up pairs (row 2i = gate_i, 2i+1 = up_i):
                           y[t, i] = silu(acc[t, 2i]) * acc[t, 2i+1]; m must be even */
    LM_CUDA_EPI_ADD_FIX, /* lm_cuda_gemv_q8 without a norm only: y[t, j] += S, S summed in fixed
                            point (lm_cuda_fix_io) over the row's Q8_0 blocks, each block's
                            scaled integer dot product converted on its own: the integer sum
                            lm_cuda_mlp1_q8's blocks make, so that down_proj through the two
                            launches and through the MLP kernel gives the same bits */
};

/* A pending term of the residual stream in fixed point, which lm_cuda_mlp1 leaves behind: the
 * stream's true value is x[j] + add[j] / LM_CUDA_FIX_ONE (add: int64, value * 2^32; range
 * +-2^31, resolution 2^-32). lm_cuda_mlp1's blocks each add their share of a sum with one 64-bit
 * integer atomic, so the total does not depend on the order they land in, as float atomics would
 * (the serving engine's seeded sampling stays reproducible). A partial sum that is NaN, infinite
 * or beyond +-2^31 saturates instead of propagating (a model that diverges there gives wrong,
 * finite values rather than NaN logits). */
#define LM_CUDA_FIX_ONE 4294967296.0
struct lm_cuda_fix_io {
    const int64_t *add; /* NULL, or [n, width] device int64 (rows dense): the pending terms of
                           the residual stream, added (after conversion) where the launch reads
                           it: to x (width k) before the norm and product, or, with
                           LM_CUDA_EPI_ADD or LM_CUDA_EPI_ADD_FIX, to y (width m) before the
                           residual add (y then holds the sums, and add is consumed) */
    int64_t *zero;      /* NULL, or [zero_n] device int64 the launch sets to 0 (an accumulator a
                           later lm_cuda_mlp1 or lm_cuda_mlp1_q8 adds into) after its wait on
                           the predecessor */
    int zero_n;
};

/* acc[t, j] = sum_k xn[t, k] * w[j, k] for t < n, j < m, then the epilogue into y [n, ldy].
 * x: [n, ldx] float32; w: [m, k] bf16 (16-byte aligned, k a multiple of 8: LM_ERR_SHAPE
 * otherwise); 1 <= n (any n: rows are taken 8 at a time, the weights are read once per 8).
 * norm_w: NULL, or [k] float32 RMSNorm weights: then xn = norm_w * (x / sqrt(mean(x^2) + eps))
 * per row, as the CPU rmsnorm (Zhang & Sennrich 2019), else xn = x.
 * Accumulation is float32 in a fixed order per output, independent of n.
 * fix: NULL, or the pending fixed-point residual terms to fold in (the epilogue store or add;
 * LM_ERR_SHAPE otherwise) and an accumulator to clear. */
lm_status lm_cuda_gemv(struct lm_cuda_ctx *c, float *y, int ldy, const float *x, int ldx,
                       const uint16_t *w, int n, int k, int m, const float *norm_w, float eps,
                       enum lm_cuda_epilogue epi, const struct lm_cuda_fix_io *fix);

/* lm_cuda_gemv with Q8_0 weights (GGUF's block format, split for 16-byte loads): wq [m, k] int8
 * quants (16-byte aligned), wd [m, k / 32] float16 scales, weight (j, i) = wd[j, i / 32] *
 * wq[j, i]; k a multiple of 32 (LM_ERR_SHAPE otherwise). Each 16-weight half block's products
 * are summed in order, then scaled into the row's float32 sum (LM_CUDA_EPI_ADD_FIX: each
 * 32-weight block's, into an int64 fixed-point sum): a fixed order per output,
 * independent of n (so one row alone and in a batch give the same bits). Reads 1.0625 bytes a
 * weight against bf16's 2: batch-1 decode of a Q8_0 model (docs/perf-notes.md v11). */
lm_status lm_cuda_gemv_q8(struct lm_cuda_ctx *c, float *y, int ldy, const float *x, int ldx,
                          const int8_t *wq, const uint16_t *wd, int n, int k, int m,
                          const float *norm_w, float eps, enum lm_cuda_epilogue epi,
                          const struct lm_cuda_fix_io *fix);

/* ---- the greedy token from a 6-bit screen of the lm_head (exact; perf-notes v33, v40) ----
 *
 * A greedy decode step needs the argmax of the logits L_j = fl(sum_i w_ji s_i) * inv, not the
 * logits (s = x * norm_w as lm_cuda_gemv stages it, inv = 1 / rms(x), the products summed in
 * lm_cuda_gemv's order). lm_cuda_gemv_screen reads a 6-bit copy of w (0.8125 bytes a weight
 * against bf16's 2: per 32 weights 6-bit quants and a float16 scale) and gives every row an
 * interval that provably holds L_j: L'_j +- R_j, with L'_j the
 * screen's logit over s quantized to two int8 levels per 32 (s', within 0.51 units of s) and
 *   R_j = inv (a_j S + (a_j + b_j) E + 2 rho (a_j + b_j)(S + E) + tiny) + 2^-148,
 * a_j = ||w_j - w'_j||_2, b_j = ||w_j||_2 (lm_cuda_screen_build), S >= ||s||_2, E >= ||s - s'||_2
 * (Cauchy-Schwarz on both differences), rho covering float32 rounding in both sums (over twice
 * the longest chain of roundings times 2^-24) and tiny the absolute error of roundings in the
 * subnormal range, every term rounded up; a row whose sums could overflow in either kernel gets
 * +inf. No row whose upper bound is below the best lower bound T = max_j (L'_j - R_j) can be the
 * argmax; lm_cuda_argmax_screened sums the others exactly, as lm_cuda_gemv would, and takes the
 * largest (the lowest id among equals; NaN and -inf never win): the id lm_cuda_gemv +
 * lm_cuda_sample give, for any weights and activations (NaN or infinite ones make bounds that
 * rule nothing out, so every such row, or every row, is summed). On random rows of 1,024 the
 * bound is ~0.7 standard deviations of the logits, and a few hundred rows are summed exactly
 * (test_cuda's random cases, up to 300,007 rows: at most 918); a trained model's peaked logits
 * leave fewer. */

/* Bytes of the screen of m rows of k (k a multiple of 32): 26 a block of 32 weights (16 of low
 * nibbles, 8 of high bits, a float16 scale, in three planes); 0 for m < 1 or k < 32. */
size_t lm_cuda_screen_bytes(int m, int k);

/* Builds the screen of bf16 rows w [m, k] (k a multiple of 32) into q (lm_cuda_screen_bytes(m,
 * k) bytes, 16-byte aligned; gemv.cu k_screen_build gives the layout): per 32-weight block q =
 * round(w / d) in [-31, 31] with d = amax / 31 rounded up to float16 (no quant clips); ab [m][2]
 * float32 (8-byte aligned): (a_j, b_j) above, summed in double and rounded up. Asynchronous on
 * c's stream. LM_ERR_SHAPE for a bad shape. */
lm_status lm_cuda_screen_build(struct lm_cuda_ctx *c, const uint16_t *w, int m, int k, uint8_t *q, float *ab);

/* Whether lm_cuda_gemv_screen and lm_cuda_argmax_screened take rows of k (a multiple of 32 whose
 * staged activations fit a block's shared memory). */
bool lm_cuda_screen_fits(int k);

/* The screen of n (1 to the context's max_rows) activation rows x [n, ldx] float32 (x_fix: NULL,
 * or [n, k] pending fixed-point terms folded in as lm_cuda_gemv's fix.add does; norm_w NULL, or
 * [k] float32 RMSNorm weights as lm_cuda_gemv): u [n, ldu] gets each row's upper bound L'_j + R_j
 * (rounded up; +inf for a row whose sums could overflow); the best lower bound of each row goes to
 * the context's scratch for the next lm_cuda_argmax_screened, which must follow on the same stream
 * with the same n, x, x_fix, norm_w and eps before another screen. q and ab: a screen built by
 * lm_cuda_screen_build with the same m and k (its planes are laid out by m: a prefix of its rows
 * is not a screen). LM_ERR_SHAPE for a bad shape; a failed launch puts the scratch back. */
lm_status lm_cuda_gemv_screen(struct lm_cuda_ctx *c, float *u, int ldu, const float *x, int ldx, const int64_t *x_fix,
                              const uint8_t *q, const float *ab, int n, int k, int m, const float *norm_w, float eps);

/* ids[r] (r < n) = the greedy choice of row r after lm_cuda_gemv_screen with the same n, x, x_fix,
 * u, norm_w and eps (a logit of NaN or -inf never wins; 0 when none does, as lm_cuda_sample): the bf16 rows w [m, k] (16-byte aligned) the screen was built from are read only
 * for the candidates. n_cand: NULL, or [n] device int32 that each row's count of rows summed
 * exactly is added to (for tests and benchmarks). LM_ERR_SHAPE for a bad shape. */
lm_status lm_cuda_argmax_screened(struct lm_cuda_ctx *c, int32_t *ids, const float *u, int ldu, const float *x,
                                  int ldx, const int64_t *x_fix, const uint16_t *w, int n, int k, int m,
                                  const float *norm_w, float eps, int32_t *n_cand);

/* lm_cuda_gemv_screen then lm_cuda_argmax_screened (the same arguments, the same ids), where one
 * activation row's screen also picks the id (perf-notes v43): each warp keeps the rows whose upper
 * bound was not below the best lower bound it knew when it met them (every lower bound met is
 * published to the row's key as found), sums those still not below it at the end exactly as the
 * pick would, and the last block writes ids[0]; the pick then returns at once, unless a warp met
 * more such rows than it keeps (then the pick decides, as without the screen's). n_cand as
 * lm_cuda_argmax_screened's, counting the rows whichever kernel summed (after an overflow, both
 * kernels' rows). LM_CUDA_SCR_FUSE=0 turns the screen's pick off. LM_ERR_SHAPE for a
 * bad shape. */
lm_status lm_cuda_screen_pick(struct lm_cuda_ctx *c, int32_t *ids, float *u, int ldu, const float *x, int ldx,
                              const int64_t *x_fix, const uint8_t *q, const float *ab, const uint16_t *w, int n,
                              int k, int m, const float *norm_w, float eps, int32_t *n_cand);
/* Whether c's one-row lm_cuda_screen_pick lets the screen pick (LM_CUDA_SCR_FUSE, default on). */
bool lm_cuda_ctx_screen_fuse(const struct lm_cuda_ctx *c);
/* *picked: whether the last one-row lm_cuda_screen_pick's screen wrote the id itself (false when
 * the pick decided after an overflow, or with the screen's pick off). Waits for c's stream (tests). */
lm_status lm_cuda_screen_picked(struct lm_cuda_ctx *c, bool *picked);

/* The MLP of 1 to LM_CUDA_MLP1_MAX_ROWS tokens as one kernel (decode on the GEMV path: one
 * dependency a layer instead of two; each block copies its weights to shared memory before its
 * wait, holding no registers, so that the next kernel's blocks start beside it):
 * acc[t, j] += fix(sum_i wd[j, i] * silu(g_ti) * u_ti) for t < n, j < k, with g_ti = xn_t . wgu[2i] and u_ti = xn_t . wgu[2i + 1] (the interleaved gate/up rows of
 * lm_cuda_gemv's SwiGLU epilogue) and xn_t = norm_w * x_t / rms(x_t) (norm_w NULL: xn = x).
 * x: [n, k] float32 (the residual stream with no pending term: fold one in first through
 * lm_cuda_gemv's fix); wgu: [2 * inter, k] bf16; wd: [k, inter] bf16 (down_proj, row-major);
 * acc: [n, k] int64 in LM_CUDA_FIX_ONE units, which the caller cleared (lm_cuda_fix_io.zero)
 * and later folds into the stream (lm_cuda_fix_io.add).
 * Each of inter / (8 * du) blocks owns 8 * du consecutive units i; gate/up sums run in
 * lm_cuda_gemv's order, so g_ti and u_ti equal its SwiGLU epilogue's bits; down_proj's sums are
 * split over the blocks (split-K) and the blocks' float32 partial sums are added in fixed point:
 * the result equals the two-launch path within float32 rounding of the partial sums, is
 * deterministic, and a row's bits do not depend on n (batch invariance, as lm_cuda_gemv).
 * LM_ERR_SHAPE unless lm_cuda_mlp1_fits and 1 <= n <= LM_CUDA_MLP1_MAX_ROWS. */
enum { LM_CUDA_MLP1_MAX_ROWS = 8 };
lm_status lm_cuda_mlp1(struct lm_cuda_ctx *c, int64_t *acc, const float *x, int n, const uint16_t *wgu,
                       const uint16_t *wd, int k, int inter, const float *norm_w, float eps);
/* Whether lm_cuda_mlp1 takes this shape on c's device: k a multiple of 8, inter = 8 * du * blocks
 * with du in {1, 2, 3, 4, 6, 8} and blocks <= multiprocessors (the smallest such du), and a
 * block's weights (48 * du * k bytes) plus LM_CUDA_MLP1_MAX_ROWS rows of x within 200 KiB of
 * shared memory and the device's per-block limit (Qwen3-0.6B: 3,072 = 8 x 3 x 128, 148 KiB a block at 1 row; 1.7B's 2,048 x 6,144 does not). */
bool lm_cuda_mlp1_fits(const struct lm_cuda_ctx *c, int k, int inter);

/* lm_cuda_mlp1 with Q8_0 weights (lm_cuda_gemv_q8's split layout): wgu_q [2 * inter, k] int8
 * quants and wgu_s [2 * inter, k / 32] float16 scales (16-byte aligned both), wd_q [k, inter]
 * quants (16-byte aligned) and wd_s [k, inter / 32] scales. x * norm_w is quantized per 32 as
 * lm_cuda_gemv_q8 does and the gate/up sums run in its order, so g_ti and u_ti equal its SwiGLU
 * epilogue's bits; the units h_ti are quantized per 32 the same way (as lm_cuda_gemv_q8 over h
 * would), each block's down_proj partial sum is one integer dot product of 32 quants a Q8_0
 * block, scaled and converted to fixed point on its own (as LM_CUDA_EPI_ADD_FIX does; bf16's
 * blocks convert their whole partial sum once), and the blocks' sums meet through 64-bit
 * atomics as in lm_cuda_mlp1: the two-launch MLP with LM_CUDA_EPI_ADD_FIX gives the same bits.
 * The scales must be 2-byte and acc 8-byte aligned. Blocks own
 * whole Q8_0 blocks of units: 32 (du 4) or 64 (du 8), 96 blocks of 32 for Qwen3-0.6B (~105 KiB of
 * shared memory a block at one row, against bf16's 148 KiB over 128 blocks).
 * LM_ERR_SHAPE unless lm_cuda_mlp1_q8_fits and 1 <= n <= LM_CUDA_MLP1_MAX_ROWS. */
lm_status lm_cuda_mlp1_q8(struct lm_cuda_ctx *c, int64_t *acc, const float *x, int n, const int8_t *wgu_q,
                          const uint16_t *wgu_s, const int8_t *wd_q, const uint16_t *wd_s, int k, int inter,
                          const float *norm_w, float eps);
/* Whether lm_cuda_mlp1_q8 takes this shape on c's device: k a multiple of 32 up to 1,024 (a
 * thread holds the scales of 4 down_proj rows), inter = 8 * du * blocks with du 4 or 8 and
 * blocks <= multiprocessors (the smaller du), and within the limits of lm_cuda_mlp1 a block's
 * shared memory: 8 staged rows of x at 5.125 bytes an element (float32, int8 quants, scales),
 * the gate/up rows at 1.0625 bytes a weight and the down_proj columns at 1 (their scales sit in
 * registers). */
bool lm_cuda_mlp1_q8_fits(const struct lm_cuda_ctx *c, int k, int inter);

/* Whether a Q8_0 checkpoint keeps its quants on the device for lm_cuda_gemv_q8: true unless the
 * environment sets LM_CUDA_Q8=0 (or off: base/env.h; then the GEMV reads the bf16 copy, for A/B
 * measurements). Read once per process. */
bool lm_cuda_q8_enabled(void);

/* y[n, m] (+)= x[n, k] . w[m, k]^T: x and w bf16 (device, row-major, x's rows k apart), y float32
 * [n, m], float32 accumulation; accumulate adds into y (the residual). k a multiple of 8. Up to
 * the context's gemm_tc rows (lm_cuda_ctx_set_gemm_tc) where lm_cuda_gemm_tc_splits plans one wave,
 * lm_cuda_gemm_tc with that plan; otherwise cuBLAS (cublasGemmEx). LM_ERR_SHAPE on bad sizes,
 * LM_ERR_IO when the launch fails. */
lm_status lm_cuda_gemm(struct lm_cuda_ctx *c, float *y, const uint16_t *x_bf16, const uint16_t *w,
                       int n, int k, int m, bool accumulate);
/* True when lm_cuda_gemm runs n rows of [*, k] x [m, k]^T on lm_cuda_gemm_tc (else cuBLAS). */
bool lm_cuda_gemm_on_tc(struct lm_cuda_ctx *c, int n, int k, int m);

/* The same product on tensor cores (bf16, float32 accumulators: wgmma m64nNk16 with both operands
 * in shared memory, or mma.sync m16n8k16, lm_cuda_ctx_set_gemm_wgmma) for 1 to 64 rows: blocks of
 * 4 warps over 64 or 128 weight rows (lm_cuda_gemm_tc_rows_per_block) x k / splits columns, each
 * block's weight slice copied to shared
 * memory before it waits for the previous kernel (programmatic dependent launch), the splits of a
 * row tile one thread-block cluster summing their partials in rank order through distributed
 * shared memory. An output's bits depend on (m, k, splits, the product path) only, never on n or
 * the other rows.
 * splits: a power of 2 up to 8, k a multiple of 64 x splits, k / splits <= 512; LM_ERR_SHAPE
 * otherwise. */
lm_status lm_cuda_gemm_tc(struct lm_cuda_ctx *c, float *y, const uint16_t *x_bf16, const uint16_t *w,
                          int n, int k, int m, bool accumulate, int splits);

/* h[n, m / 2] = bf16(silu(g) * u) for the products g, u of x[n, k] with w's interleaved gate/up
 * rows (w [m, k]: row 2i gate i, row 2i + 1 up i), on lm_cuda_gemm_tc's kernel: the SwiGLU of
 * lm_cuda_swiglu_bf16 applied to the same float32 sums, so the same bits as lm_cuda_gemm_tc then
 * lm_cuda_swiglu_bf16, in one launch. m a multiple of 4; the rest as lm_cuda_gemm_tc. */
lm_status lm_cuda_gemm_tc_swiglu(struct lm_cuda_ctx *c, uint16_t *h, const uint16_t *x_bf16, const uint16_t *w,
                                 int n, int k, int m, int splits);

/* h[n, inter] = SwiGLU of x[n_gemm, k] . w[2 inter, k]^T (interleaved gate/up rows) for its first
 * n rows (n <= n_gemm; the rest are computed and not kept: eager steps round their GEMMs' rows up,
 * gemm_rows in qwen3.cu): where lm_cuda_gemm would run lm_cuda_gemm_tc for n_gemm rows,
 * lm_cuda_gemm_tc_swiglu in one launch over n rows; otherwise lm_cuda_gemm over n_gemm rows into gu (float32 [n_gemm,
 * 2 inter], scratch) then lm_cuda_swiglu_bf16 over n. */
lm_status lm_cuda_gemm_swiglu(struct lm_cuda_ctx *c, uint16_t *h, float *gu, const uint16_t *x_bf16,
                              const uint16_t *w, int n, int n_gemm, int k, int inter);

/* An RMSNorm carried between two lm_cuda_gemm_tc launches instead of run as a kernel of its own
 * (perf-notes v23). Qwen3's norm is x_n = gamma * (x * r), r = 1 / sqrt(mean(x^2) + eps) for each
 * row (HF's Qwen3RMSNorm); since r is one number a row, w . x_n = r * (w . bf16(gamma * x)):
 * - the producer (the GEMM whose output y, float32 [n, m], is the next norm's x: o_proj and
 *   down_proj adding into the residual stream) also writes xn = bf16(gamma * y) ([n, m] bf16) and
 *   ssq, the sums of squares of y's rows in groups of 64 columns ([n, m / 64] float32: each
 *   group's 16 four-column items, squares summed x, y, z, w, then over the 16 in an xor tree of
 *   offsets 8, 4, 2, 1), m a multiple of 64;
 * - the consumer (q/k/v, gate/up) reads xn as its x and scales each sum of row t by
 *   r_t = 1 / sqrt((sum of ssq[t, 0 .. k / 64 - 1] in order) / k + eps) before its epilogue; it
 *   copies ssq's rows with its first slice of x, as 16-byte chunks: k a multiple of 256, ssq_in
 *   16-byte aligned.
 * Fixed orders throughout, so a row's bits still depend on nothing but the row. Against the norm
 * kernel (lm_cuda_rmsnorm_bf16 then the product of bf16(gamma * (x * r))) only the rounding point
 * of r moves: the results agree to bf16 rounding, not in bits. Fields left NULL take no part:
 * ssq_in NULL, the launch's x is used as it is; gamma NULL, no xn or ssq is written. */
struct lm_cuda_norm_link {
    const float *ssq_in; /* consumer: [n, k / 64] from the producer, or NULL */
    float eps;           /* consumer: the norm's epsilon */
    const float *gamma;  /* producer: the next norm's weights [m] float32, or NULL */
    uint16_t *xn;        /* producer: bf16(gamma * y) [n, m], 8-byte aligned */
    float *ssq_out;      /* producer: [n, m / 64] */
};
/* lm_cuda_gemm_tc (accumulate: y += ...) and lm_cuda_gemm_tc_swiglu with a norm link, in the splits
 * lm_cuda_gemm would take (LM_ERR_SHAPE where it would not take the kernel: lm_cuda_gemm_on_tc;
 * a producer on the SwiGLU kernel, m not a multiple of 64 for a producer, or k not a multiple of
 * 256 for a consumer, are refused too). */
lm_status lm_cuda_gemm_linked(struct lm_cuda_ctx *c, float *y, const uint16_t *x_bf16, const uint16_t *w, int n,
                              int k, int m, bool accumulate, const struct lm_cuda_norm_link *link);
lm_status lm_cuda_gemm_swiglu_linked(struct lm_cuda_ctx *c, uint16_t *h, const uint16_t *x_bf16, const uint16_t *w,
                                     int n, int k, int inter, const struct lm_cuda_norm_link *link);

/* The splits lm_cuda_gemm uses for a [*, k] x [m, k]^T product on lm_cuda_gemm_tc: the fewest that
 * give about two blocks a multiprocessor in one wave; 0 when no plan fits one wave (cuBLAS then). */
int lm_cuda_gemm_tc_splits(struct lm_cuda_ctx *c, int k, int m);
/* How many clusters of `splits` blocks of that kernel (bm = 64 or 128 weight rows a block, over k /
 * splits columns, for n rows) the device holds at once (cudaOccupancyMaxActiveClusters: a
 * cluster's blocks share one GPC); 0 when that shape does not fit. A launch of more clusters runs
 * in more than one wave. */
int lm_cuda_gemm_tc_max_clusters(struct lm_cuda_ctx *c, int k, int splits, int bm, int n);
/* The weight rows a block takes for n rows of [*, k] x [m, k]^T in `splits` splits: 128 where
 * 64-row blocks' clusters would not fit one wave and 128-row ones do, else 64 (or the context's
 * forced value, lm_cuda_ctx_set_gemm_tc_bm). A row's bits are the same either way. */
int lm_cuda_gemm_tc_rows_per_block(struct lm_cuda_ctx *c, int k, int m, int splits, int n);

/* True when lm_cuda_gemm_tc can take k in `splits` splits on this context's device at any row
 * count (a power of 2 up to 8, k a multiple of 64 x splits, k / splits at most 512, the block's
 * shared memory within the device's limit). A forced split count (lm_cuda_ctx_set_gemm_tc) that
 * does not fit is replaced by the plan. */
bool lm_cuda_gemm_tc_fits(const struct lm_cuda_ctx *c, int k, int splits);

/* y[i, :] = bf16(w * (x[r, :] / sqrt(mean(x[r, :]^2) + eps))) for i < n, r = rows ? rows[i] : i.
 * x: [*, d] float32; w: [d]; y: [n, d] bf16. rows: device int32 [n] or NULL. */
lm_status lm_cuda_rmsnorm_bf16(struct lm_cuda_ctx *c, uint16_t *y, const float *x, const float *w,
                               const int32_t *rows, int n, int d, float eps);

/* y[t, i] = bf16(silu(gu[t, 2i]) * gu[t, 2i+1]) for t < n, i < inter (interleaved gate/up, the
 * layout lm_cuda_gemv's SwiGLU epilogue reads). SwiGLU, Shazeer 2020. */
lm_status lm_cuda_swiglu_bf16(struct lm_cuda_ctx *c, uint16_t *y, const float *gu, int n, int inter);

/* x[t, :] = float32(table[ids'[t], :]) for t < n; table [vocab, d] bf16; ids device int32 [n]
 * (the caller checked them). feed: NULL (ids' = ids), or device int32 [n]: ids'[t] = feed[t] < 0 ?
 * ids[t] : prev[feed[t]], prev a device array of ids an earlier kernel chose (in [0, vocab): the
 * next decode step's tokens taken where the last one left them, lm_cuda_batch.feed). */
lm_status lm_cuda_embed(struct lm_cuda_ctx *c, float *x, const uint16_t *table, const int32_t *ids,
                        const int32_t *feed, const int32_t *prev, int n, int d);

/* The same from a Q8_0 table: x[t, i] = wd[ids'[t], i / 32] * wq[ids'[t], i] (exact in float32);
 * wq [vocab, d] int8, wd [vocab, d / 32] float16, d a multiple of 32. */
lm_status lm_cuda_embed_q8(struct lm_cuda_ctx *c, float *x, const int8_t *wq, const uint16_t *wd,
                           const int32_t *ids, const int32_t *feed, const int32_t *prev, int n, int d);

/* y[i, :] = x[rows[i], :] for i < n, d float32 per row (gathers the rows that need logits);
 * add: NULL, or the rows' pending fixed-point terms ([*, d] int64, lm_cuda_fix_io), folded in as
 * lm_cuda_gemv folds them (so a gathered row has the bits the stream would have). */
lm_status lm_cuda_gather_rows(struct lm_cuda_ctx *c, float *y, const float *x, const int32_t *rows,
                              int n, int d, const int64_t *add);

/* Copies rows [0, n_rows) of KV block src into block dst, in every layer's K and V pool (the
 * prefix cache's copy of a partly matched block). Pools: n_layers x layer_elems bf16 each, a
 * layer [n_blocks][n_kv_heads][block_size][head_dim] (the layout below). One launch on the
 * context's stream, not waited for: later work on the stream sees the copy. LM_ERR_SHAPE when a
 * row is not a multiple of 16 bytes; the caller checks the block ids. */
lm_status lm_cuda_kv_copy_rows(struct lm_cuda_ctx *c, uint16_t *k_pool, uint16_t *v_pool, size_t layer_elems,
                               int n_layers, int n_kv_heads, int block_size, int head_dim, int src, int dst,
                               int n_rows);

/* ---- attention over a paged KV cache ---- */

/* The KV cache of one layer is two pools of bf16 blocks, [n_blocks][n_kv_heads][block_size]
 * [head_dim] for K and the same for V. A sequence's positions live in the blocks its row of the
 * block table names: position p is slot p % block_size of block block_tables[seq][p / block_size]
 * (the layout vLLM's PagedAttention uses, Kwon et al. 2023). */
struct lm_cuda_attn {
    float *qkv;                  /* [n, ld_qkv] per token: q [n_heads * D], k [n_kv * D], v [n_kv * D] */
    int ld_qkv;
    const float *q_norm, *k_norm; /* [D] per-head RMSNorm weights (Qwen3's q_norm / k_norm) */
    const float *inv_freq;       /* [D / 2] RoPE inverse frequencies, float32 as HF computes them */
    float eps;                   /* RMSNorm epsilon */
    float scale;                 /* softmax scale, 1 / sqrt(D) */
    uint16_t *k_cache, *v_cache; /* this layer's pools */
    const int32_t *block_tables; /* [n_seqs, bt_width] block ids */
    int bt_width;
    const int32_t *seq;          /* [n] block-table row of each token */
    const int32_t *pos;          /* [n] position of each token in its sequence */
    int n_heads, n_kv_heads, head_dim, block_size; /* head_dim 16, 32, 64, 128 or 256;
                                                      n_heads / n_kv_heads <= 8 */
    void *out;                   /* [n, n_heads * D] float32, or bf16 when out_bf16 */
    bool out_bf16;
    /* Split-KV decode (flash-decoding; Dao et al. 2023): with n_splits > 1, the small-batch fused
     * decode kernel gives each (token, KV head) up to n_splits blocks, split z taking positions
     * [z * S, (z + 1) * S) with S = split_len rounded up to the kernel's round of positions (as
     * many splits as start inside n_splits x split_len positions; the last split takes the
     * rest), and the last block to finish merges the splits in order. A
     * context of at most S positions gives the same bits as no split. Scratch: split_part float32
     * [n][n_kv_heads][n_splits][G][D + 2] (G = n_heads / n_kv_heads); split_count unsigned
     * [n][n_kv_heads], zero before the first launch and left zero by each. n_splits <= 1 (or NULL
     * scratch): off. */
    int n_splits, split_len;
    float *split_part;
    unsigned *split_count;
    /* Batched decode's work list (a fused launch that lm_cuda_attn_dec_fits refuses; FlashInfer's
     * planned split-KV): NULL, or device int32 [LM_CUDA_WORK_HEAD + LM_CUDA_WORK_ITEM * items]:
     * work[0] the item count, then per item the token t, its first position p0, the end p1, and
     * slot << 16 | z << 8 | nused (split z of the nused that token t's items make, in position
     * order, covering [0, pos[t] + 1); nused 1..min(255, n_splits); slot < 2^15 the scratch row
     * its splits merge through, t for a decode list). The launch then has n + work_blocks blocks
     * a KV head (the planner's bound on the items: lm_cuda_attn_work_blocks), block y taking item
     * y if there is one; split items merge through the scratch as above, with room for n_splits
     * splits a (row, KV head). */
    const int32_t *work;
    int work_blocks;
    /* Runs (speculative decoding's verification): NULL, or [n] per token the number of tokens of
     * its sequence just before it in this launch (0 .. LM_CUDA_DEC_RUN - 1), which must be the
     * rows t - run_prev[t] .. t - 1 at positions pos[t] - run_prev[t] .. pos[t] - 1 of the same
     * block table. A fused launch then treats each token as its own decode: the run's keys and
     * values come from q/k/v (normalised and rotated as their own tokens' blocks do it), not from
     * the cache those blocks are writing, so token t gets the bits of a one-token decode at
     * pos[t] after the earlier ones. Only the decode kernel (lm_cuda_attn_dec_fits) takes runs:
     * another fused launch with run_prev set fails with LM_ERR_IO. Non-fused launches ignore it. */
    const int32_t *run_prev;
    /* Prefill tiles (a non-fused launch with bf16 output; FlashAttention-2, Dao 2023): NULL (one
     * k_attention block a token and KV head), or the device copy of lm_cuda_attn_plan_tiles's
     * list, n_tiles and n_rest its counts. The n_tiles tiles of consecutive tokens of one sequence
     * then run on tensor cores (a block a tile and KV head), the n_rest other tokens on
     * k_attention from the list's items (n_rest of them, split as the planner chose: the
     * launch then needs split_part / split_count with n_splits at least the planner's max_splits,
     * rows for its max_slots). The output is the same attention to within bf16 rounding (q is
     * split into bf16 hi + lo parts, the probabilities are rounded to bf16 for p.V), and a tiled
     * token's bits do not depend on the tile it is in. Only for shapes lm_cuda_attn_tile_tokens
     * accepts; a float32-output launch with tiles fails (LM_ERR_IO). The counts must be the
     * list's own (its headers are read on the device only). */
    const int32_t *tiles;
    int n_tiles, n_rest;
};

#define LM_CUDA_DEC_RUN 8 /* the longest run of one sequence in a fused decode launch */

/* For each token t < n: q and k heads <- RoPE(RMSNorm(head) * w) at position pos[t] (q in place
 * in qkv, rotate-half form as HF's apply_rotary_pos_emb, angle = float32(inv_freq[j] *
 * float32(pos))), and k, v written (bf16) to the cache slot of (seq[t], pos[t]). */
lm_status lm_cuda_qk_norm_rope_store(struct lm_cuda_ctx *c, const struct lm_cuda_attn *a, int n);

/* out[t] = softmax(q_t . K^T * scale) . V over positions 0..pos[t] of sequence seq[t], per query
 * head h on KV head h / (n_heads / n_kv_heads) (GQA, Ainslie et al. 2023). With fused = false,
 * q must already be normalised and rotated and every attended position already in the cache
 * (lm_cuda_qk_norm_rope_store). With fused = true the kernel does that step itself for its own
 * token first: only valid when no two of the n tokens share a sequence (a decode step).
 * With fused = true and programmatic dependent launch on, the kernel may read seq, pos, the block
 * tables and the cached K/V of positions < pos[t] before the preceding kernels on the stream have
 * finished: nothing in the same chain of PDL kernels may write them (in a model step they are
 * written by the host copy before the step's first kernel, and by earlier steps). */
lm_status lm_cuda_attention(struct lm_cuda_ctx *c, const struct lm_cuda_attn *a, int n, bool fused);

/* True when a fused lm_cuda_attention launch of n tokens with these arguments runs the 8-warp
 * decode kernel (ctx option attn_dec, one wave of blocks), the one that takes run_prev. */
bool lm_cuda_attn_dec_fits(const struct lm_cuda_ctx *c, const struct lm_cuda_attn *a, int n);
/* True when a fused launch of n tokens for a's shape runs the decode kernel's batched 4-warp shape
 * (not the 8-warp one: lm_cuda_attn_dec_fits false; ctx attn_batch on, groups of up to 4 query
 * heads, and n x n_kv_heads blocks within one wave of it); else such a launch runs k_attention. */
bool lm_cuda_attn_batch_fits(const struct lm_cuda_ctx *c, const struct lm_cuda_attn *a, int n);

enum { LM_CUDA_WORK_HEAD = 4, LM_CUDA_WORK_ITEM = 4 }; /* lm_cuda_attn.work's int32 header, item */

/* The most tokens a prefill tile holds for a's shape (64 query rows over the group's heads: 64
 * over the group size rounded up to 1, 2, 4 or 8), or 0 when the tensor-core kernel does not
 * serve the shape (head_dim 256, or too little shared memory): such launches take no tiles. */
int lm_cuda_attn_tile_tokens(const struct lm_cuda_ctx *c, const struct lm_cuda_attn *a);

/* How lm_cuda_attn_plan_tiles cuts a launch. */
struct lm_cuda_tile_plan {
    int tile_tokens; /* the most tokens a tile holds (lm_cuda_attn_tile_tokens) */
    int min_tokens;  /* the fewest a tile on the tensor-core kernel holds */
    /* The other tokens' contexts are cut as lm_cuda_attn_plan_work's with these P, min_len and
     * max_splits, when there are at most max_slots of them (the scratch rows); else whole. */
    int P, min_len, max_splits, max_slots;
};

/* Plans a non-fused launch of n tokens (rows of seq/pos, host arrays) into w (host int32, room
 * for 2 * LM_CUDA_WORK_HEAD + LM_CUDA_WORK_ITEM * (n + p->P)): runs of consecutive rows of one
 * sequence at consecutive positions, cut in order into tiles of tile_tokens (the last two of a
 * run sharing its rest evenly when the last alone would hold under min_tokens). Tiles of at
 * least min_tokens are the tensor-core kernel's, the tokens of smaller ones (runs shorter than
 * min_tokens) k_attention's.
 * Writes w[0] the tiles F, w[1] the other items I, then F items (first row, tokens, positions
 * read = the last token's position + 1, 0), the most positions first (ties in row order), then
 * a header (I, 0, 0, 0) and I items in lm_cuda_attn.work's form, the other tokens' contexts in
 * pieces (as lm_cuda_attn_plan_work; slot = the token's index among them), longest first.
 * Returns F and sets *n_rest = I; copy 2 * LM_CUDA_WORK_HEAD + LM_CUDA_WORK_ITEM * (F + I) int32
 * to the device for lm_cuda_attn.tiles. */
int lm_cuda_attn_plan_tiles(int32_t *w, const int32_t *seq, const int32_t *pos, int n,
                            const struct lm_cuda_tile_plan *p, int *n_rest);

/* P for a work-list launch of n tokens (lm_cuda_attn.work_blocks, lm_cuda_attn_plan_work): the
 * blocks of its kernel that are resident at once on the device, over n_kv_heads (at least 1). */
int lm_cuda_attn_work_blocks(const struct lm_cuda_ctx *c, const struct lm_cuda_attn *a, int n);

/* Plans a batched decode step's work list into w (host memory, room for LM_CUDA_WORK_HEAD +
 * LM_CUDA_WORK_ITEM * (n + P) int32) for n tokens at positions pos[] and P blocks a KV head;
 * returns the item count (at most n + P). Each context of L = pos + 1 positions is cut into
 * k = max(1, round(L / sl)) equal pieces (a multiple of 32 positions, the last taking the rest),
 * sl = the largest of min_len, the step's positions over P and the longest context over
 * max_splits (1..255), rounded up to 32; a piece is under 1.5 sl + 32 positions. So a step of
 * even contexts gets one piece a token (a context a little over the mean share stays whole:
 * cutting it costs more than the balance gains), and one long context among short ones is cut
 * until no block holds much more than the mean (the batched step otherwise takes as long as that
 * context's one block). Pieces are listed longest
 * first (ties in token order), so that the long ones start first. Host-only: no device needed. */
int lm_cuda_attn_plan_work(int32_t *w, const int32_t *pos, int n, int P, int min_len, int max_splits);

/* ---- choosing tokens ---- */

/* Per-row sampling parameters, as engine/sampler.h: temperature <= 0 is greedy (argmax, ties to
 * the lowest id, NaN never wins); else logits / temperature, then top_k (keep logits >= the k-th
 * largest, ties kept; 0 = off), then top_p (in order of descending logit, ascending id, keep a
 * token while the probability mass ranked before it is < top_p; at least one; >= 1 = off), then
 * one draw u = lm_cuda_uniform(seed, counter) in [0, 1): the token where the cumulative
 * probability of the kept tokens, in the same rank order, first exceeds u * (their mass). */
struct lm_cuda_sampling {
    float temperature;
    float top_p;
    int32_t top_k;
    uint32_t reserved; /* 0 */
    uint64_t seed;     /* the request's seed */
    uint64_t counter;  /* the index of the token being drawn (so a request's draws do not depend on
                          what it is batched with) */
};

/* The uniform draw the device makes for (seed, counter): splitmix64 finalizer of
 * seed + (counter + 1) * 0x9e3779b97f4a7c15, top 53 bits, as a double in [0, 1). */
double lm_cuda_uniform(uint64_t seed, uint64_t counter);

/* ids[r] = the token chosen from logits row r (r < n_rows; rows ld floats apart, vocab used).
 * params: device array [n_rows] or NULL (all greedy). n_rows <= the context's max_rows. */
lm_status lm_cuda_sample(struct lm_cuda_ctx *c, int32_t *ids, const float *logits, int ld,
                         int n_rows, int vocab, const struct lm_cuda_sampling *params);

/* host[i] = ids[i] for i < n (n >= 1), by a kernel that waits for the stream's previous work
 * (programmatic dependent launch) and stores straight into host: page-locked host memory
 * (cudaMallocHost; unified addressing maps it), device int32 ids. A decode step's ids reach the
 * host this way instead of by a cudaMemcpyAsync, whose copy node at a graph's end cost ~9 us a
 * token at batch 1 on the H200 (perf-notes v35); the stores are visible to the host once an event recorded after
 * this call has completed. Asynchronous on c's stream; LM_ERR_SHAPE for n < 1. */
lm_status lm_cuda_ids_to_host(struct lm_cuda_ctx *c, int32_t *host, const int32_t *ids, int n);

/* ---- measuring ---- */

/* Device-to-device copy bandwidth over `bytes` (at least 64 MiB): the median of `reps` timed
 * cudaMemcpy's after one warm-up, counting bytes read plus bytes written, in bytes per second
 * (the measured ceiling for memory-bound kernels, as METHOD.md asks). */
lm_status lm_cuda_bench_copy(int dev, size_t bytes, int reps, double *bytes_per_s);

#ifdef __cplusplus
}
#endif

#endif
