/* gemm.cu: lm_cuda_gemm, y[n, m] (+)= x[n, k] . w[m, k]^T for the batched path: a weight-streaming
 * tensor-core kernel (k_gemm_tc) for up to LM_CUDA_GEMM_TC rows, cuBLAS above that or where the
 * kernel's one-wave plan does not fit. See cuda.h for the contract, docs/perf-notes.md (v20) for
 * why. */
#include <cooperative_groups.h>

#include "backend/cuda/common.cuh"
#include "base/env.h"

namespace cg = cooperative_groups;

namespace {

/* k_gemm_tc's block: 4 warps, 64 weight rows (16 a warp), a slice of ks = k / S columns, all of
 * the step's tokens (TT: n rounded up to 16, at most 64). The S blocks of one row tile form a
 * cluster: each sums its slice into float32 partials in shared memory, then adds up its 1/S of
 * the tile's outputs over the cluster's S partials (distributed shared memory, rank order) and
 * writes them. So an output's arithmetic is fixed by (m, k, S): the same bits for a token whatever
 * else the step carries (batch invariance), and no atomics. (Measured in perf-notes v20: 8 warps
 * splitting the columns were slower at every row count.) */
constexpr int TC_BM = 64, TC_THREADS = 128, TC_MAX_T = 64, TC_DEFAULT_ROWS = 16, TC_MAX_S = 8,
              TC_MAX_KS = 512, TC_CH = 64; /* columns a pipeline chunk: eight 16-byte chunks of a row */
constexpr int TC_PS = TC_BM + 4; /* partial row stride (floats): a warp's stores hit 32 banks */

/* Bytes of shared memory of k_gemm_tc<TT> over ks columns: the weight and token slices, bf16
 * rows of ks swizzled in 16-byte chunks; the partials [TT][TC_PS] reuse them. */
size_t tc_smem(int tt, int ks) {
    return std::max(sizeof(uint16_t) * (size_t)(TC_BM + tt) * ks, sizeof(float) * (size_t)tt * TC_PS);
}

/* The 16-byte chunk c of row r sits at chunk c ^ (r % 8) of its row, so the 8 rows an ldmatrix
 * reads at one chunk fall on 8 distinct bank groups (rows are ks * 2 bytes, a multiple of 128). */
__device__ __forceinline__ int tc_chunk(int r, int c) { return (c ^ (r & 7)) << 3; }

/* What k_gemm_tc writes: y = the sums, y += the sums (float32 [n, m]), or, w's rows being
 * interleaved gate/up pairs, h = bf16(silu(gate) * up) ([n, m / 2], lm_cuda_swiglu_bf16's
 * arithmetic on the same float32 sums). */
enum { TC_STORE, TC_ADD, TC_SWIGLU };

template <int TT>
__global__ void __launch_bounds__(TC_THREADS) k_gemm_tc(void *__restrict__ y, const uint16_t *__restrict__ x,
                                                        const uint16_t *__restrict__ w, int n, int k, int m,
                                                        int ks, int mode) {
    extern __shared__ __align__(128) uint16_t tc_sm[];
    cg::cluster_group cl = cg::this_cluster();
    const int S = gridDim.x, rank = blockIdx.x; /* clusters of (S, 1, 1): the rank is blockIdx.x */
    const int r0 = blockIdx.y * TC_BM, k0 = rank * ks, nch = ks / TC_CH, tid = threadIdx.x;
    uint16_t *ws = tc_sm, *xs = tc_sm + (size_t)TC_BM * ks;
    /* Copies: thread tid moves 16-byte chunk tid % 8 of each 8-chunk group of rows tid / 8 + 16 i. */
    const int c8 = tid & 7, rg = tid >> 3;

    /* The weights do not depend on the previous kernel: all of the block's slice is in flight
     * before the wait (rows past m read as zeros), one copy group. */
#pragma unroll
    for (int i = 0; i < TC_BM / 16; i++) {
        const int r = rg + 16 * i;
        const bool in = r0 + r < m;
        const uint16_t *src = w + (size_t)(in ? r0 + r : 0) * k + k0 + c8 * 8;
        uint16_t *dst = ws + (size_t)r * ks + tc_chunk(r, c8);
        for (int ch = 0; ch < nch; ch++) cp_async16(dst + ch * TC_CH, src + ch * TC_CH, !in);
    }
    cp_async_commit();
    pdl_trigger();
    pdl_wait();
    /* The tokens (rows past n read as zeros), one copy group a chunk of TC_CH columns, so the
     * products of a chunk start when it lands. */
    for (int ch = 0; ch < nch; ch++) {
#pragma unroll
        for (int i = 0; i < TT / 16; i++) {
            const int t = rg + 16 * i;
            const bool in = t < n;
            cp_async16(xs + (size_t)t * ks + ch * TC_CH + tc_chunk(t, c8),
                       x + (size_t)(in ? t : 0) * k + k0 + ch * TC_CH + c8 * 8, !in);
        }
        cp_async_commit();
    }

    /* Warp wid: rows wid*16 .. +15 (the mma's A, row-major = w's rows), every token (B, col-major
     * = x's rows), k in steps of 16. */
    const int wid = tid >> 5, lane = tid & 31;
    const int ar = wid * 16 + (lane & 15), ah = lane >> 4;                 /* ldmatrix rows of A */
    const int bt = (lane & 7) + ((lane >> 4) << 3), bh = (lane >> 3) & 1; /* of two n-tiles of B */
    const uint16_t *arow = ws + (size_t)ar * ks;
    float acc[TT / 8][4] = {};
    for (int ch = 0; ch < nch; ch++) {
        cp_async_wait_pending(nch - 1 - ch);
        __syncthreads(); /* every thread's copies of the chunk have landed */
#pragma unroll
        for (int s2 = 0; s2 < TC_CH / 16; s2++) {
            const int kk = ch * (TC_CH / 16) + s2;
            unsigned a[4];
            ldsm_x4(a, arow + tc_chunk(ar, 2 * kk + ah));
#pragma unroll
            for (int j = 0; j < TT / 16; j++) {
                const int t = j * 16 + bt;
                unsigned b[4];
                ldsm_x4(b, xs + (size_t)t * ks + tc_chunk(t, 2 * kk + bh));
                mma_bf16(acc[2 * j], a, b[0], b[1]);
                mma_bf16(acc[2 * j + 1], a, b[2], b[3]);
            }
        }
    }
    __syncthreads(); /* the slices are read no more: the partials take their place */
    float *part = reinterpret_cast<float *>(tc_sm);
    {
        const int row = wid * 16 + (lane >> 2), q = lane & 3;
#pragma unroll
        for (int j = 0; j < TT / 8; j++) {
            const int t = j * 8 + 2 * q;
            part[t * TC_PS + row] = acc[j][0];
            part[(t + 1) * TC_PS + row] = acc[j][1];
            part[t * TC_PS + row + 8] = acc[j][2];
            part[(t + 1) * TC_PS + row + 8] = acc[j][3];
        }
    }
    cl.sync(); /* every partial of the cluster written */

    /* This block's share of the tile's TT x 64 outputs, 4 at a time. */
    const int per = TT * (TC_BM / 4) / S;
    for (int i = rank * per + tid; i < (rank + 1) * per; i += TC_THREADS) {
        const int t = i >> 4, c = (i & 15) * 4, col = r0 + c;
        if (t >= n || col >= m) continue;
        float4 s = *reinterpret_cast<const float4 *>(cl.map_shared_rank(part, 0) + t * TC_PS + c);
        for (int q = 1; q < S; q++) {
            const float4 v = *reinterpret_cast<const float4 *>(cl.map_shared_rank(part, q) + t * TC_PS + c);
            s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
        }
        if (mode == TC_SWIGLU) { /* m a multiple of 4: columns col..col+3 are two gate/up pairs */
            const unsigned h2 = (unsigned)f2bf(silu_mul(s.x, s.y)) | (unsigned)f2bf(silu_mul(s.z, s.w)) << 16;
            *reinterpret_cast<unsigned *>(static_cast<uint16_t *>(y) + (size_t)t * (m / 2) + col / 2) = h2;
            continue;
        }
        const bool accumulate = mode == TC_ADD;
        float *dst = static_cast<float *>(y) + (size_t)t * m + col;
        if ((m & 3) == 0) { /* col + 3 < m: m and col are multiples of 4 */
            if (accumulate) {
                const float4 b = *reinterpret_cast<const float4 *>(dst);
                s.x = b.x + s.x, s.y = b.y + s.y, s.z = b.z + s.z, s.w = b.w + s.w;
            }
            *reinterpret_cast<float4 *>(dst) = s;
        } else {
            const float v[4] = {s.x, s.y, s.z, s.w};
            for (int e = 0; e < 4 && col + e < m; e++) dst[e] = accumulate ? dst[e] + v[e] : v[e];
        }
    }
    cl.sync(); /* the other blocks have read this block's partials */
}

using tc_kernel = void (*)(void *, const uint16_t *, const uint16_t *, int, int, int, int, int);

tc_kernel tc_kernel_for(int tt) {
    switch (tt) {
    case 16: return k_gemm_tc<16>;
    case 32: return k_gemm_tc<32>;
    case 48: return k_gemm_tc<48>;
    default: return k_gemm_tc<64>;
    }
}

} // namespace

/* LM_CUDA_GEMM_TC: default 16, at most 64 (k_gemm_tc's TT); 0 for cuBLAS at every row count (A/B).
 * perf-notes v20: at 16 rows each of the four layer GEMMs runs faster than cuBLAS alone (19.7
 * against 24.7 us a layer) and beside its neighbours (decode at 8 and 16 sequences +30% and +27%,
 * serving at 16 concurrent +8%); at 32 rows alone it ties cuBLAS, and serving at 32 concurrent
 * lost 5% (lumen perf's 32 sequences gained 6%); at 64 rows it is slower (each block re-reads from
 * L2, after its wait, about as many token bytes as the weight bytes it streams). */
extern "C" int lm_cuda_gemm_tc_default_rows(void) {
    static const int r = (int)lm_env_int("LM_CUDA_GEMM_TC", TC_DEFAULT_ROWS, 0, TC_MAX_T);
    return r;
}

/* True when k_gemm_tc can take k in `s` splits on this device at any row count: s a power of 2 up
 * to TC_MAX_S, k a multiple of 64 s, k / s at most TC_MAX_KS and within the shared memory a block
 * may have at TT = 64. */
extern "C" bool lm_cuda_gemm_tc_fits(const struct lm_cuda_ctx *c, int k, int s) {
    return s >= 1 && s <= TC_MAX_S && !(s & (s - 1)) && k % (64 * s) == 0 && k / s <= TC_MAX_KS &&
           tc_smem(TC_MAX_T, k / s) <= (size_t)c->smem_optin;
}

extern "C" int lm_cuda_gemm_tc_splits(struct lm_cuda_ctx *c, int k, int m) {
    if (k < 64 || m < 1) return 0;
    const int tiles = (m + TC_BM - 1) / TC_BM;
    /* The fewest splits that give about two blocks a multiprocessor in one wave (planned for the
     * largest TT, so that the split, and so the bits, do not depend on n); else the one-wave plan
     * with the most blocks; 0 when none fits one wave (the lm_head: cuBLAS streams it better). */
    int best = 0;
    for (int s = 1; s <= TC_MAX_S; s *= 2) {
        if (!lm_cuda_gemm_tc_fits(c, k, s)) continue;
        const long blocks = (long)tiles * s;
        const int occ = lm_cuda_occupancy((const void *)k_gemm_tc<TC_MAX_T>, TC_THREADS, tc_smem(TC_MAX_T, k / s));
        if (blocks > (long)occ * c->sm_count) continue;
        best = s;
        if (blocks * 10 >= (long)c->sm_count * 18) break;
    }
    return best;
}

static lm_status launch_tc(struct lm_cuda_ctx *c, void *y, const uint16_t *x_bf16, const uint16_t *w, int n, int k,
                           int m, int mode, int splits) {
    if (n < 1 || n > TC_MAX_T || m < 1 || splits < 1 || splits > TC_MAX_S || (splits & (splits - 1)) ||
        k % (64 * splits) || k / splits > TC_MAX_KS || (mode == TC_SWIGLU && m % 4) ||
        (m + TC_BM - 1) / TC_BM > 65535)
        return lm_errorf(LM_ERR_SHAPE,
                         "CUDA gemm_tc: [%d, %d] x [%d, %d]^T in %d splits: rows 1 to %d, splits a power of 2 "
                         "to %d, k a multiple of 64 x splits with k / splits at most %d (SwiGLU: m a multiple "
                         "of 4), m at most 65535 x %d",
                         n, k, m, k, splits, TC_MAX_T, TC_MAX_S, TC_MAX_KS, TC_BM);
    if (((uintptr_t)y | (uintptr_t)x_bf16 | (uintptr_t)w) & 15)
        return lm_errorf(LM_ERR_SHAPE, "CUDA gemm_tc: x, w and y must be 16-byte aligned");
    const int tt = (n + 15) / 16 * 16, ks = k / splits;
    if (tc_smem(tt, ks) > (size_t)c->smem_optin)
        return lm_errorf(LM_ERR_SHAPE, "CUDA gemm_tc: %d splits of k %d need %zu bytes of shared memory a block; "
                         "this device allows %d", splits, k, tc_smem(tt, ks), c->smem_optin);
    const tc_kernel fn = tc_kernel_for(tt);
    const size_t smem = tc_smem(tt, ks);
    lm_cuda_occupancy((const void *)fn, TC_THREADS, smem); /* raises the kernel's shared-memory limit */
    const dim3 grid((unsigned)splits, (unsigned)((m + TC_BM - 1) / TC_BM));
    LM_CU(lm_launch_cluster(c, grid, dim3(TC_THREADS), smem, splits, fn, y, x_bf16, w, n, k, m, ks, mode));
    return LM_OK;
}

extern "C" lm_status lm_cuda_gemm_tc(struct lm_cuda_ctx *c, float *y, const uint16_t *x_bf16, const uint16_t *w,
                                     int n, int k, int m, bool accumulate, int splits) {
    return launch_tc(c, y, x_bf16, w, n, k, m, accumulate ? TC_ADD : TC_STORE, splits);
}

extern "C" lm_status lm_cuda_gemm_tc_swiglu(struct lm_cuda_ctx *c, uint16_t *h, const uint16_t *x_bf16,
                                            const uint16_t *w, int n, int k, int m, int splits) {
    return launch_tc(c, h, x_bf16, w, n, k, m, TC_SWIGLU, splits);
}

/* The splits lm_cuda_gemm runs n rows of [*, k] x [m, k]^T in on k_gemm_tc; 0: cuBLAS. */
static int tc_route(struct lm_cuda_ctx *c, int n, int k, int m) {
    if (n > std::min(c->gemm_tc_rows, TC_MAX_T)) return 0;
    const int s = lm_cuda_gemm_tc_splits(c, k, m), f = c->gemm_tc_splits;
    return s && f && lm_cuda_gemm_tc_fits(c, k, f) ? f : s; /* a forced split count where it fits */
}

extern "C" lm_status lm_cuda_gemm(struct lm_cuda_ctx *c, float *y, const uint16_t *x_bf16,
                                  const uint16_t *w, int n, int k, int m, bool accumulate) {
    if (n < 1 || k < 1 || m < 1 || k % 8)
        return lm_errorf(LM_ERR_SHAPE, "CUDA gemm: [%d, %d] x [%d, %d]^T: k must be a multiple of 8",
                         n, k, m, k);
    if (const int s = tc_route(c, n, k, m))
        return launch_tc(c, y, x_bf16, w, n, k, m, accumulate ? TC_ADD : TC_STORE, s);
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    /* Column-major view: Y^T[m, n] = W[m, k] . X^T[k, n]; W is stored as W^T in column major. */
    cublasStatus_t s = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, w, CUDA_R_16BF,
                                    k, x_bf16, CUDA_R_16BF, k, &beta, y, CUDA_R_32F, m,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS)
        return lm_errorf(LM_ERR_IO, "cuBLAS: gemm [%d, %d] x [%d, %d]^T: %s", n, k, m, k,
                         cublasGetStatusString(s));
    return LM_OK;
}

extern "C" lm_status lm_cuda_gemm_swiglu(struct lm_cuda_ctx *c, uint16_t *h, float *gu, const uint16_t *x_bf16,
                                         const uint16_t *w, int n, int n_gemm, int k, int inter) {
    if (n < 1 || n > n_gemm || k < 1 || inter < 1 || k % 8)
        return lm_errorf(LM_ERR_SHAPE,
                         "CUDA gemm_swiglu: %d of [%d, %d] x [%d, %d]^T: 1 to %d rows, k a multiple of 8", n,
                         n_gemm, k, 2 * inter, k, n_gemm);
    /* Routed on n_gemm, as the step's other GEMMs are; the kernel then needs only the n rows. */
    const int s = inter % 2 ? 0 : tc_route(c, n_gemm, k, 2 * inter);
    if (s) return launch_tc(c, h, x_bf16, w, n, k, 2 * inter, TC_SWIGLU, s);
    const lm_status rc = lm_cuda_gemm(c, gu, x_bf16, w, n_gemm, k, 2 * inter, false);
    return rc ? rc : lm_cuda_swiglu_bf16(c, h, gu, n, inter);
}
