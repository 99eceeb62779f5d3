/* gemm.cu: lm_cuda_gemm, y[n, m] (+)= x[n, k] . w[m, k]^T for the batched path: a weight-streaming
 * tensor-core kernel (k_gemm_tc) for up to LM_CUDA_GEMM_TC rows, cuBLAS above that or where the
 * kernel's one-wave plan does not fit. See cuda.h for the contract, docs/perf-notes.md (v20) for
 * why. */
#include <cooperative_groups.h>

#include <mutex>

#include "backend/cuda/common.cuh"
#include "base/env.h"

namespace cg = cooperative_groups;

namespace {

/* k_gemm_tc's block: 4 warps (one warpgroup), BM = 64 or 128 weight rows (16 a warp in each
 * 64-row half), a slice of ks = k / S columns, all of the step's tokens (TT: n rounded up to 16,
 * at most 64). The S blocks of one row tile form a cluster: each sums its slice into float32
 * partials in shared memory (wgmma or mma.sync), then adds up its 1/S of the tile's outputs over
 * the cluster's S partials (distributed shared memory, rank order) and writes them. So an
 * output's arithmetic is fixed by (m, k, S) and the product path: the same bits for a token
 * whatever else the step carries (batch invariance) and whichever BM, and no atomics. (Measured
 * in perf-notes v20: 8 warps splitting the columns were slower at every row count.) */
constexpr int TC_BM = 64, TC_THREADS = 128, TC_MAX_T = 64, TC_DEFAULT_ROWS = 64, TC_MAX_S = 8,
              TC_MAX_KS = 512, TC_CH = 64; /* columns a pipeline chunk: eight 16-byte chunks of a row */
/* The slices start on a 1 KiB boundary: wgmma's 128-byte swizzle repeats every 8 rows of 128
 * bytes, and its descriptors assume the pattern starts aligned (matrix base offset 0). */
constexpr int TC_ALIGN = 1024;

/* Bytes of k_gemm_tc<TT>'s front area over ks columns and bm weight rows: the weight and token
 * slices (bf16 rows of ks swizzled in 16-byte chunks), which the partials [TT][bm + 4] float32
 * reuse, whichever is more; a multiple of 16 (ks is of 64). A norm-link consumer's copy of the
 * sums of squares follows it (tc_ssq_bytes). */
__host__ __device__ constexpr size_t tc_front(int tt, int ks, int bm) {
    return 2 * (size_t)(bm + tt) * ks > 4 * (size_t)tt * (bm + 4) ? 2 * (size_t)(bm + tt) * ks
                                                                  : 4 * (size_t)tt * (bm + 4);
}
/* A norm-link consumer's copy of its rows' sums of squares: [tt][k / 64] float32. */
__host__ __device__ constexpr size_t tc_ssq_bytes(int tt, int k) { return 4 * (size_t)tt * (k / 64); }
/* Bytes of shared memory of k_gemm_tc<TT> without the sums of squares: the front area, and room to
 * start it on a 1 KiB boundary. */
size_t tc_smem(int tt, int ks, int bm = TC_BM) { return tc_front(tt, ks, bm) + TC_ALIGN; }

/* k_gemm_tc's TT for n rows: n rounded up to 16, from 16 to TC_MAX_T. */
int tc_tt(int n) { return std::min(std::max((n + 15) / 16 * 16, 16), TC_MAX_T); }

/* The 16-byte chunk c of row r sits at chunk c ^ (r % 8) of its row, so the 8 rows an ldmatrix
 * reads at one chunk fall on 8 distinct bank groups (rows are ks * 2 bytes, a multiple of 128).
 * The wgmma path keeps each 64-column chunk of the slices as its own tile of 128-byte rows with
 * the same XOR: the 128-byte swizzle of PTX's canonical K-major layouts. */
__device__ __forceinline__ int tc_chunk(int r, int c) { return (c ^ (r & 7)) << 3; }

/* What k_gemm_tc writes: y = the sums, y += the sums (float32 [n, m]), or, w's rows being
 * interleaved gate/up pairs, h = bf16(silu(gate) * up) ([n, m / 2], lm_cuda_swiglu_bf16's
 * arithmetic on the same float32 sums). */
enum { TC_STORE, TC_ADD, TC_SWIGLU };
/* A flag on the mode for the timeline (LM_CUDA_TRACE_SYNC=1): a block's t_mid is when it passed
 * the cluster barrier after writing its partials (k_gemm_tc<..., PUSH>: when its peers' partials had
 * landed), instead of when its last slice of x landed. */
enum { TC_TRACE_SYNC = 8 };
/* k_gemm_tc<..., PUSH = true> (perf-notes v25): the cluster's partials travel as pushes. Each
 * block stores the items of every peer's share into that peer's shared memory (st.async, counted
 * on the peer's mbarrier; its own share into its own memory the same way: TT x BM x 4 bytes, in a
 * buffer past the front area and the sums of squares) and waits on its own mbarrier, instead of
 * the cluster barrier after the partials, reads of its peers' memory, and a last barrier that
 * keeps its memory alive for them (what remains is one cluster barrier arrived at the start and
 * waited on before the first push, for the mbarriers' initialisation); the same values summed in
 * the same order. Only the n real tokens' items travel (perf-notes v28: at batch 1, 1 of TT = 16);
 * the padding tokens' sums are never read. Used at TT = 16 and 32 with 2 or more splits (tc_push):
 * separate instantiations, so the others keep their registers. */
/* Bytes of k_gemm_tc's push buffer: S slots of TT x BM / S floats (each rank's share of the tile). */
__host__ __device__ constexpr size_t tc_push_bytes(int tt, int bm) { return 4 * (size_t)tt * bm; }

/* wgmma (PTX ISA "Asynchronous Warpgroup Level Matrix Multiply-Accumulate", sm_90a only): the
 * compute_90 PTX of this file keeps mma.sync. */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TC_HAVE_WGMMA 1
#else
#define TC_HAVE_WGMMA 0
#endif

/* Makes this thread's generic-proxy writes to shared memory (cp.async) visible to the async proxy
 * that wgmma reads its descriptor operands through. */
__device__ __forceinline__ void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
/* wg_desc, wg_fence, wg_commit, wg_wait0, wg_pin, wgmma_ss: common.cuh. */

/* Writes the 4 sums s of token t, columns col..col+3 (< m, or the row's tail), as `mode` says;
 * with have_pre, pre holds y's 4 values there, read earlier (TC_ADD, m a multiple of 4). Returns
 * the float32 values written to y where m is a multiple of 4 (with the residual for TC_ADD: what
 * a norm-link producer's xn and sums of squares are of); else s. */
__device__ __forceinline__ float4 tc_store(void *__restrict__ y, float4 s, int t, int col, int m, int mode,
                                           bool have_pre, float4 pre) {
    if (mode == TC_SWIGLU) { /* m a multiple of 4: columns col..col+3 are two gate/up pairs */
        const unsigned h2 = (unsigned)f2bf(silu_mul(s.x, s.y)) | (unsigned)f2bf(silu_mul(s.z, s.w)) << 16;
        *reinterpret_cast<unsigned *>(static_cast<uint16_t *>(y) + (size_t)t * (m / 2) + col / 2) = h2;
        return s;
    }
    const bool accumulate = mode == TC_ADD;
    float *dst = static_cast<float *>(y) + (size_t)t * m + col;
    if ((m & 3) == 0) { /* col + 3 < m: m and col are multiples of 4 */
        if (accumulate) {
            const float4 b = have_pre ? pre : *reinterpret_cast<const float4 *>(dst);
            s.x = b.x + s.x, s.y = b.y + s.y, s.z = b.z + s.z, s.w = b.w + s.w;
        }
        *reinterpret_cast<float4 *>(dst) = s;
    } else {
        const float v[4] = {s.x, s.y, s.z, s.w};
        for (int e = 0; e < 4 && col + e < m; e++) dst[e] = accumulate ? dst[e] + v[e] : v[e];
    }
    return s;
}

/* The norm link (cuda.h lm_cuda_norm_link) of a launch, NULL fields unused. */
struct tc_link {
    const float *ssq_in;
    float eps;
    const float *gamma;
    uint16_t *xn;
    float *ssq_out;
};

/* TRACE: the instantiation that writes cudabench's timeline (trace_buf, when not NULL); the others
 * have no trace code at all. Code a launch never runs can still cost: without the trace's the
 * batch-1 step took 557 us against 574 (perf-notes v30, call 4: k_gemm_tc<16, wgmma, 128, push>
 * 45.0 -> 42.0 KiB, 126 -> 120 registers), and 5.6 and 26.6 KiB of wgmma sequences no launch ran
 * cost 1.6% and 6.5% (call 3); not through the bytes alone: ptxas also ordered the code around
 * the products differently in those builds (call 7's SASS). Smaller is not faster by itself:
 * leaner weight copies (31.6 KiB) lost 3% (call 6). */
template <int TT, bool WG, int BM, bool PUSH = false, bool TRACE = false>
__global__ void __launch_bounds__(TC_THREADS) k_gemm_tc(void *__restrict__ y, const uint16_t *__restrict__ x,
                                                        const uint16_t *__restrict__ w, int n, int k, int m,
                                                        int ks, int mode, tc_link link,
                                                        unsigned long long *trace_buf) {
    static_assert(BM == 64 || BM == 128, "a block's weight rows: one or two 64-row halves");
    constexpr int NH = BM / 64, PS = BM + 4; /* halves; partial row stride (floats) */
    unsigned long long *const trace = TRACE ? trace_buf : nullptr;
    const bool mid_sync = TRACE && (mode & TC_TRACE_SYNC);
    mode &= ~TC_TRACE_SYNC;
    constexpr bool wg = WG && TC_HAVE_WGMMA; /* products on wgmma (else mma.sync) */
    const unsigned long long t0 = trace ? gtime() : 0;
    extern __shared__ __align__(128) uint16_t tc_smraw[];
    uint16_t *tc_sm = tc_smraw + ((TC_ALIGN - (smem_u32(tc_smraw) & (TC_ALIGN - 1))) & (TC_ALIGN - 1)) / 2;
    cg::cluster_group cl = cg::this_cluster();
    const int S = gridDim.x, rank = blockIdx.x; /* clusters of (S, 1, 1): the rank is blockIdx.x */
    const int r0 = blockIdx.y * BM, k0 = rank * ks, nch = ks / TC_CH, tid = threadIdx.x;
    uint16_t *ws = tc_sm, *xs = tc_sm + (size_t)BM * ks;
    /* Copies: thread tid moves 16-byte chunk tid % 8 of each 8-chunk group of rows tid / 8 + 16 i. */
    const int c8 = tid & 7, rg = tid >> 3;
    /* Pushes: the barrier that counts the peers' bytes, expected from the start, and this block's
     * arrival on the cluster barrier that tells the peers it is initialised (they wait on it before
     * their first push; by then every block arrived long ago). */
    __shared__ __align__(8) unsigned long long push_bar;
    if constexpr (PUSH) {
        if (tid == 0) {
            /* Only the items of the n real tokens travel (items are token-major: i < n BM / 4): from
             * each of the S ranks, this block's share of them. */
            const int per = TT * (BM / 4) / S, live = min(max(n * (BM / 4) - rank * per, 0), per);
            mbar_init(&push_bar, 1);
            fence_mbar_init_cluster();
            mbar_arrive_expect(&push_bar, (unsigned)(S * live * 16));
        }
        asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
    }

    /* The weights do not depend on the previous kernel: all of the block's slice is in flight
     * before the wait (rows past m read as zeros), one copy group, marked first to leave L2 (read
     * once a step; perf-notes v26). wgmma's A: chunk ch of the columns is a tile of BM rows of 128
     * bytes (see tc_chunk); mma.sync's: rows of ks. */
    const unsigned long long evict_first = l2_evict_first();
#pragma unroll
    for (int i = 0; i < BM / 16; i++) {
        const int r = rg + 16 * i;
        const bool in = r0 + r < m;
        const uint16_t *src = w + (size_t)(in ? r0 + r : 0) * k + k0 + c8 * 8;
        uint16_t *dst = wg ? ws + r * TC_CH + tc_chunk(r, c8) : ws + (size_t)r * ks + tc_chunk(r, c8);
        for (int ch = 0; ch < nch; ch++)
            cp_async16_hint(dst + ch * (wg ? BM * TC_CH : TC_CH), src + ch * TC_CH, !in, evict_first);
    }
    cp_async_commit();
    pdl_trigger();
    /* Item i of the tile: token i / (BM / 4), columns 4 (i % (BM / 4)) .. + 3; this block's share is
     * [rank per, end). A norm-link producer's gamma for this thread's first two items: weights, read
     * before the wait (the epilogue would otherwise wait for them after its sums). */
    constexpr int B4 = BM / 4;
    const int per = TT * B4 / S, end = (rank + 1) * per;
    float4 gpre[2] = {};
    if (link.gamma)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int i = rank * per + tid + h * TC_THREADS, col = r0 + (i % B4) * 4;
            if (i < end && col < m) gpre[h] = __ldg(reinterpret_cast<const float4 *>(link.gamma + col));
        }
    /* A norm-link consumer's copy of the producer's sums of squares ([n][k / 64], 16-byte rows:
     * k a multiple of 256, the host checks), in the first token chunk's copy group, after the
     * front area. */
    const int ng = k / 64;
    float *ssq_sm = reinterpret_cast<float *>(reinterpret_cast<char *>(tc_sm) + tc_front(TT, ks, BM));
    pdl_wait();
    const unsigned long long t1 = trace ? gtime() : 0;
    /* The tokens (rows past n read as zeros): for mma.sync one copy group a chunk of TC_CH
     * columns, whose products start when it lands; for wgmma one group, waited for whole.
     * wgmma's B: chunk ch is a tile of TT rows of 128 bytes; mma.sync's: rows of ks. */
    for (int ch = 0; ch < nch; ch++) {
#pragma unroll
        for (int i = 0; i < TT / 16; i++) {
            const int t = rg + 16 * i;
            const bool in = t < n;
            cp_async16(wg ? xs + ch * (TT * TC_CH) + t * TC_CH + tc_chunk(t, c8)
                          : xs + (size_t)t * ks + ch * TC_CH + tc_chunk(t, c8),
                       x + (size_t)(in ? t : 0) * k + k0 + ch * TC_CH + c8 * 8, !in);
        }
        if (ch == 0 && link.ssq_in)
            for (int i = tid; i < n * (ng / 4); i += TC_THREADS) cp_async16(ssq_sm + i * 4, link.ssq_in + i * 4);
        if (!wg) cp_async_commit();
    }
    if (wg) cp_async_commit();
    /* The residual the first two of this thread's sums add to (TC_ADD), read now so that its
     * trip to memory overlaps the products instead of following the cluster's sums. */
    float4 res[2] = {};
    const bool pre = mode == TC_ADD && (m & 3) == 0;
    if (pre)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int i = rank * per + tid + h * TC_THREADS, t = i / B4, col = r0 + (i % B4) * 4;
            if (i < end && t < n && col < m)
                res[h] = *reinterpret_cast<const float4 *>(static_cast<const float *>(y) + (size_t)t * m + col);
        }

    /* A linked norm's scale of each token's sums (cuda.h lm_cuda_norm_link): the producer's sums
     * of squares of 64-column groups, added in group order, from the copy that landed with the
     * first chunk (not a trip of their own beside the slices: perf-notes v24). On wgmma it runs
     * while the products do (perf-notes v29: +0.2-1.5% at 1-16 rows, near noise; the consumers'
     * longer products were not this sum); on mma.sync after them (those products are the warps'
     * own instructions). */
    __shared__ float rnorm[TT];
    auto norm_scale = [&] {
        if (link.ssq_in && tid < n) {
            float tot = 0.f;
#pragma unroll 8
            for (int g = 0; g < ng; g++) tot += ssq_sm[tid * ng + g];
            rnorm[tid] = 1.0f / sqrtf(tot / (float)k + link.eps);
        }
    };

    /* Warp wid: rows 64 h + wid*16 .. +15 of each half h (the mma's A, row-major = w's rows),
     * every token (B, col-major = x's rows), k in steps of 16. */
    const int wid = tid >> 5, lane = tid & 31;
    float acc[NH][TT / 8][4] = {};
    unsigned long long tx = 0;
    if constexpr (wg) {
        /* The warpgroup's products, A and B read by the tensor cores from shared memory (each
         * once a block, where mma.sync has every warp read all of B), issued back to back once
         * every slice has landed and waited for once, at the end. A wait, proxy fence and barrier
         * a chunk, so that a chunk's products start as it lands (perf-notes v22), cost ~0.25 us a
         * chunk at 1-64 rows, where the slices land together (perf-notes v26, derived from its
         * trace; with the evict-first weights +5.8% at batch 1, +1.7% at 64 rows, derived from
         * its call 9). */
        /* The descriptors' low words (wg_desc_lo); offsets below in 16-byte units. */
        const unsigned ws_lo = wg_desc_lo(smem_u32(ws)), xs_lo = wg_desc_lo(smem_u32(xs));
        cp_async_wait_all();
        fence_proxy_async_smem();
        __syncthreads(); /* every thread's copies have landed */
        if (trace && !mid_sync) tx = gtime();
#pragma unroll
        for (int h = 0; h < NH; h++) wg_pin(acc[h]);
        wg_fence();
        static_assert(TC_CH == 64, "wg_chunk_products takes chunks of 64 columns");
        wg_chunk_products<TT, NH>(acc, ws_lo, xs_lo, nch);
        wg_commit();
        norm_scale(); /* beside the products: its registers and shared memory are not theirs */
        wg_wait0();
#pragma unroll
        for (int h = 0; h < NH; h++) wg_pin(acc[h]);
    } else {
        const int ar = wid * 16 + (lane & 15), ah = lane >> 4;                 /* ldmatrix rows of A */
        const int bt = (lane & 7) + ((lane >> 4) << 3), bh = (lane >> 3) & 1; /* of two n-tiles of B */
        for (int ch = 0; ch < nch; ch++) {
            cp_async_wait_pending(nch - 1 - ch);
            __syncthreads(); /* every thread's copies of the chunk have landed */
            if (trace && !mid_sync && ch == nch - 1) tx = gtime();
#pragma unroll
            for (int s2 = 0; s2 < TC_CH / 16; s2++) {
                const int kk = ch * (TC_CH / 16) + s2;
                unsigned a[NH][4];
#pragma unroll
                for (int h = 0; h < NH; h++)
                    ldsm_x4(a[h], ws + (size_t)(ar + 64 * h) * ks + tc_chunk(ar + 64 * h, 2 * kk + ah));
#pragma unroll
                for (int j = 0; j < TT / 16; j++) {
                    const int t = j * 16 + bt;
                    unsigned b[4];
                    ldsm_x4(b, xs + (size_t)t * ks + tc_chunk(t, 2 * kk + bh));
#pragma unroll
                    for (int h = 0; h < NH; h++) {
                        mma_bf16(acc[h][2 * j], a[h], b[0], b[1]);
                        mma_bf16(acc[h][2 * j + 1], a[h], b[2], b[3]);
                    }
                }
            }
        }
    }
    if constexpr (!wg) norm_scale();
    __syncthreads(); /* the slices are read no more: the partials take their place */
    const unsigned long long t2 = trace ? gtime() : 0;
    float *part = reinterpret_cast<float *>(tc_sm);
#pragma unroll
    for (int h = 0; h < NH; h++) {
        const int row = 64 * h + wid * 16 + (lane >> 2), q = lane & 3;
#pragma unroll
        for (int j = 0; j < TT / 8; j++) {
            const int t = j * 8 + 2 * q;
            part[t * PS + row] = acc[h][j][0];
            part[(t + 1) * PS + row] = acc[h][j][1];
            part[t * PS + row + 8] = acc[h][j][2];
            part[(t + 1) * PS + row + 8] = acc[h][j][3];
        }
    }
    /* Item i's partials from rank q: with pushes, recv[q][i - rank per] (float4; its own share too,
     * pushed to itself: perf-notes v25 call 13); else in rank q's part. */
    const float4 *recv = reinterpret_cast<const float4 *>(reinterpret_cast<const char *>(tc_sm) + tc_front(TT, ks, BM) +
                                                          (link.ssq_in ? tc_ssq_bytes(TT, k) : 0));
    if constexpr (PUSH) {
        __syncthreads(); /* this block's partials written */
        asm volatile("barrier.cluster.wait.aligned;" ::: "memory"); /* every peer's barrier initialised */
        for (int i = tid; i < n * B4; i += TC_THREADS) { /* item i to its owner q, slot [rank][i - q per] */
            const int q = i / per, t = i / B4, c = (i % B4) * 4;
            const float4 v = *reinterpret_cast<const float4 *>(part + t * PS + c);
            st_async16(cluster_addr(recv + rank * per + (i - q * per), (unsigned)q), v,
                       cluster_addr(&push_bar, (unsigned)q));
        }
        mbar_wait(&push_bar, 0);
    } else {
        cl.sync(); /* every partial of the cluster written */
    }
    if (trace && mid_sync) tx = gtime();

    /* This block's share of the tile's TT x BM outputs, 4 at a time, two items a thread at once
     * (all their loads from the cluster's partials issued before the first sum). The sums run in
     * rank order. */
    for (int i0 = rank * per + tid; i0 < end; i0 += 2 * TC_THREADS) {
        float4 v[2][TC_MAX_S];
        bool live[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int i = i0 + h * TC_THREADS, t = i / B4, c = (i % B4) * 4;
            live[h] = i < end && t < n && r0 + c < m;
#pragma unroll
            for (int q = 0; q < TC_MAX_S; q++)
                if (live[h] && q < S)
                    v[h][q] = PUSH ? recv[q * per + (i - rank * per)]
                                   : *reinterpret_cast<const float4 *>(cl.map_shared_rank(part, q) + t * PS + c);
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int i = i0 + h * TC_THREADS, t = i / B4, col = r0 + (i % B4) * 4;
            float4 s = v[h][0];
            if (live[h]) {
#pragma unroll
                for (int q = 1; q < TC_MAX_S; q++)
                    if (q < S) s.x += v[h][q].x, s.y += v[h][q].y, s.z += v[h][q].z, s.w += v[h][q].w;
                if (link.ssq_in) {
                    const float r = rnorm[t];
                    s.x *= r, s.y *= r, s.z *= r, s.w *= r;
                }
                s = tc_store(y, s, t, col, m, mode, pre && i0 == rank * per + tid, res[h]);
            }
            if (!link.gamma) continue;
            /* A producer (TC_STORE or TC_ADD, m a multiple of 64: the host checks): from the values
             * y got, xn and the group's sum of squares. The 16 items of a 64-column group are 16
             * aligned lanes of one warp (per is a multiple of 32), all live or all not, and every
             * lane of the warp reaches the shuffles. */
            float q2 = 0.f;
            if (live[h]) {
                const float4 g = i0 == rank * per + tid ? gpre[h]
                                                        : __ldg(reinterpret_cast<const float4 *>(link.gamma + col));
                *reinterpret_cast<uint2 *>(link.xn + (size_t)t * m + col) =
                    make_uint2(f2bf(g.x * s.x) | (unsigned)f2bf(g.y * s.y) << 16,
                               f2bf(g.z * s.z) | (unsigned)f2bf(g.w * s.w) << 16);
                q2 = s.x * s.x;
                q2 = fmaf(s.y, s.y, q2);
                q2 = fmaf(s.z, s.z, q2);
                q2 = fmaf(s.w, s.w, q2);
            }
#pragma unroll
            for (int o = 8; o >= 1; o >>= 1) q2 += __shfl_xor_sync(0xffffffffu, q2, o);
            if (live[h] && (lane & 15) == 0) link.ssq_out[(size_t)t * (m / 64) + col / 64] = q2;
        }
    }
    /* Leave only when the other blocks have read this block's partials. The arrive is relaxed, which
     * the PTX memory model does not order after this block's reads of its peers: it relies on
     * every value read feeding a store that comes before the arrive in program order (so the read
     * has completed when the warp, issuing in order, reaches the arrive; the SASS keeps that
     * order). A release arrive after the loads and before the stores, which the model does order,
     * cost 13-20% of decode throughput at 8-64 sequences (perf-notes v22, call 11). */
    if constexpr (!PUSH) {
        asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
        asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
    }
    if (trace && tid == 0)
        trace_put(trace, w, k, m, blockIdx.x + gridDim.x * blockIdx.y, t0, t1, t2, tx, sm_id());
}

using tc_kernel = void (*)(void *, const uint16_t *, const uint16_t *, int, int, int, int, int, tc_link,
                           unsigned long long *);

template <int BM, bool TR>
tc_kernel tc_kernel_bm(int tt, bool wg, bool push) {
    switch (tt) {
    case 16:
        if (push) return wg ? k_gemm_tc<16, true, BM, true, TR> : k_gemm_tc<16, false, BM, true, TR>;
        return wg ? k_gemm_tc<16, true, BM, false, TR> : k_gemm_tc<16, false, BM, false, TR>;
    case 32:
        if (push) return wg ? k_gemm_tc<32, true, BM, true, TR> : k_gemm_tc<32, false, BM, true, TR>;
        return wg ? k_gemm_tc<32, true, BM, false, TR> : k_gemm_tc<32, false, BM, false, TR>;
    case 48: return wg ? k_gemm_tc<48, true, BM, false, TR> : k_gemm_tc<48, false, BM, false, TR>;
    default: return wg ? k_gemm_tc<64, true, BM, false, TR> : k_gemm_tc<64, false, BM, false, TR>;
    }
}
/* Whether a launch of TT rows in s splits pushes its partials (k_gemm_tc's PUSH; the context's
 * gemm_push, lm_cuda_ctx_set_gemm_push): TT up to LM_CUDA_GEMM_PUSH_ROWS (32, or 16; v25 call 9:
 * at 32 rows +5-6%; call 11: at 64 rows -9 to -11%, the pushed buffer costing occupancy). A launch
 * without a cluster (s = 1) has no peers, and st.async needs a cluster of more than one block. */
bool tc_push(const lm_cuda_ctx *c, int tt, int s) {
    static const int upto = (int)lm_env_int("LM_CUDA_GEMM_PUSH_ROWS", 32, 16, 32);
    return c->gemm_push && tt <= upto && s > 1;
}
/* The kernel of a launch; trace: the instantiation with the timeline's code (plans and occupancy
 * use the other one, so that a traced step runs the same plan). */
tc_kernel tc_kernel_for(int tt, bool wg, int bm = TC_BM, bool push = false, bool trace = false) {
    if (trace) return bm == 128 ? tc_kernel_bm<128, true>(tt, wg, push) : tc_kernel_bm<64, true>(tt, wg, push);
    return bm == 128 ? tc_kernel_bm<128, false>(tt, wg, push) : tc_kernel_bm<64, false>(tt, wg, push);
}
/* k_gemm_tc's dynamic shared memory for a launch: the front area and its alignment, the norm-link
 * consumer's sums of squares, the pushed partials. */
size_t tc_launch_smem(int tt, int k, int s, int bm, bool consumer, bool push) {
    return tc_smem(tt, k / s, bm) + (consumer ? tc_ssq_bytes(tt, k) : 0) + (push ? tc_push_bytes(tt, bm) : 0);
}

/* Clusters of s blocks of fn (TC_THREADS threads, smem bytes each) the device holds at once
 * (cudaOccupancyMaxActiveClusters: a cluster's blocks share one GPC), cached. */
int tc_clusters(const void *fn, size_t smem, int s) {
    struct entry {
        int device;
        const void *fn;
        size_t smem;
        int s, n;
    };
    static entry cache[256];
    static int n_cache;
    static std::mutex mu;
    int dev = 0;
    cudaGetDevice(&dev);
    {
        std::lock_guard<std::mutex> lock(mu);
        for (int i = 0; i < n_cache; i++)
            if (cache[i].device == dev && cache[i].fn == fn && cache[i].smem == smem && cache[i].s == s)
                return cache[i].n;
    }
    lm_cuda_occupancy(fn, TC_THREADS, smem); /* raises the kernel's shared-memory limit */
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)s, 1);
    cfg.blockDim = dim3(TC_THREADS);
    cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeClusterDimension;
    at.val.clusterDim.x = (unsigned)s, at.val.clusterDim.y = 1, at.val.clusterDim.z = 1;
    cfg.attrs = &at;
    cfg.numAttrs = 1;
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, (tc_kernel)fn, &cfg) != cudaSuccess) {
        cudaGetLastError(); /* this query's error only (not sticky); not cached, so a later call asks again */
        return 0;
    }
    std::lock_guard<std::mutex> lock(mu);
    if (n_cache < 256) cache[n_cache++] = {dev, fn, smem, s, n};
    return n;
}

/* The context's memo (lm_cuda_ctx tc_memo): v for (kind, k, m, x), compute() the first time. */
enum { TC_MEMO_SPLITS, TC_MEMO_BM, TC_MEMO_SPREAD };
template <class F>
int tc_memo(lm_cuda_ctx *c, int kind, int k, int m, int x, F &&compute) {
    for (int i = 0; i < c->n_tc_memo; i++) {
        const auto &e = c->tc_memo[i];
        if (e.kind == kind && e.k == k && e.m == m && e.x == x) return e.v;
    }
    const int v = compute();
    if (c->n_tc_memo < (int)(sizeof c->tc_memo / sizeof c->tc_memo[0])) c->tc_memo[c->n_tc_memo++] = {kind, k, m, x, v};
    return v;
}

} // namespace

/* LM_CUDA_GEMM_TC: default 64 (k_gemm_tc's TT, the most); 0 for cuBLAS at every row count (A/B).
 * perf-notes v20: at 16 rows each of the four layer GEMMs ran faster than cuBLAS alone and beside
 * its neighbours, at 32-64 slower. v22: with the products on wgmma, the cluster's last barrier
 * relaxed and the residual read early, the kernel wins at every row count to 64 (decode at 32 / 48
 * / 64 sequences +40% / +27% / +19% against cuBLAS there, serving at 32 concurrent +13%, at 64
 * +3-7%). */
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
        const int occ = lm_cuda_occupancy((const void *)tc_kernel_for(TC_MAX_T, c->gemm_wgmma), TC_THREADS,
                                          tc_smem(TC_MAX_T, k / s));
        if (blocks > (long)occ * c->sm_count) continue;
        best = s;
        if (blocks * 10 >= (long)c->sm_count * 18) break;
    }
    return best;
}

static lm_status launch_tc(struct lm_cuda_ctx *c, void *y, const uint16_t *x_bf16, const uint16_t *w, int n, int k,
                           int m, int mode, int splits, const lm_cuda_norm_link *nl = nullptr) {
    tc_link link = {};
    if (nl) {
        link = {nl->ssq_in, nl->eps, nl->gamma, nl->xn, nl->ssq_out};
        if (link.gamma && (mode == TC_SWIGLU || m % 64 || !link.xn || !link.ssq_out || ((uintptr_t)link.xn & 7) ||
                           ((uintptr_t)link.gamma & 15)))
            return lm_errorf(LM_ERR_SHAPE,
                             "CUDA gemm_tc: a norm link's producer needs a plain or accumulating product, m %d a "
                             "multiple of 64, xn (8-byte aligned) and ssq_out, and 16-byte aligned weights",
                             m);
        /* a block's reads of x and ssq_in would race with other clusters' writes of xn and ssq_out */
        if (link.gamma && ((const void *)link.xn == (const void *)x_bf16 || link.ssq_out == link.ssq_in))
            return lm_errorf(LM_ERR_SHAPE, "CUDA gemm_tc: a norm link may not write the x or ssq_in it reads");
        /* the consumer copies its rows' sums of squares as 16-byte chunks */
        if (link.ssq_in && (k % 256 || ((uintptr_t)link.ssq_in & 15)))
            return lm_errorf(LM_ERR_SHAPE, "CUDA gemm_tc: a norm link's consumer needs k %d a multiple of 256 and "
                             "ssq_in 16-byte aligned", k);
    }
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
    const int tt = tc_tt(n), ks = k / splits;
    if (tc_smem(tt, ks) > (size_t)c->smem_optin)
        return lm_errorf(LM_ERR_SHAPE, "CUDA gemm_tc: %d splits of k %d need %zu bytes of shared memory a block; "
                         "this device allows %d", splits, k, tc_smem(tt, ks), c->smem_optin);
    /* The block height for this launch's shape, and the kernel's shared-memory limit raised (to the
     * device's maximum: lm_cuda_occupancy), once per shape and settings. */
    const bool push = tc_push(c, tt, splits);
    const int bm = tc_memo(c, TC_MEMO_BM, k, m, splits * 1024 + tt, [&] {
        const int b = lm_cuda_gemm_tc_rows_per_block(c, k, m, splits, n);
        lm_cuda_occupancy((const void *)tc_kernel_for(tt, c->gemm_wgmma, b, push), TC_THREADS,
                          tc_launch_smem(tt, k, splits, b, false, push));
        return b;
    });
    const tc_kernel fn = tc_kernel_for(tt, c->gemm_wgmma, bm, push, c->trace != nullptr);
    size_t smem = tc_launch_smem(tt, k, splits, bm, link.ssq_in, push);
    /* One block a multiprocessor up to the context's gemm_spread_rows (1): the block scheduler
     * otherwise puts two blocks of a launch on one multiprocessor while others stay idle (the
     * trace's co-residency table, perf-notes v32: at batch 1, 91% of q/k/v's 128 blocks and 42-71%
     * of o_proj's 64 shared one), and a shared one's products take ~0.4 us longer. Asking for half
     * the per-block maximum plus 1 KiB keeps a second block off (with the 1 KiB each block reserves,
     * two need more than the 228 KiB an H100/H200 multiprocessor holds); taken where every
     * cluster still fits at once (at Qwen3-0.6B's shapes o_proj only). It also keeps the next
     * kernel's early blocks off those multiprocessors: +1.8% at 1 row, -3% at 4 and 8 (v32), so 1
     * row only. The same kernel and arithmetic: the same bits. */
    const size_t spread_bytes = (size_t)c->smem_optin / 2 + 1024;
    const bool spread = n <= c->gemm_spread_rows && smem < spread_bytes &&
                        tc_memo(c, TC_MEMO_SPREAD, k, m, splits * 1024 + tt, [&] { /* n <= 16: TT 16 */
                            const int fit = tc_clusters((const void *)tc_kernel_for(tt, c->gemm_wgmma, bm, push),
                                                        spread_bytes, splits);
                            return (m + bm - 1) / bm <= fit ? 1 : 0;
                        });
    if (spread) smem = spread_bytes;
    if (c->trace) /* raises the trace kernel's shared-memory limit as the plan did the other's */
        lm_cuda_occupancy((const void *)fn, TC_THREADS,
                          spread ? spread_bytes : tc_launch_smem(tt, k, splits, bm, false, push));
    if (smem > (size_t)c->smem_optin)
        return lm_errorf(LM_ERR_SHAPE, "CUDA gemm_tc: [%d, %d]^T in %d splits at %d rows needs %zu bytes of shared "
                         "memory a block (slices, the norm link's sums of squares, pushed partials); this device "
                         "allows %d", m, k, splits, n, smem, c->smem_optin);
    const dim3 grid((unsigned)splits, (unsigned)((m + bm - 1) / bm));
    static const bool trace_sync = lm_env_flag("LM_CUDA_TRACE_SYNC", false);
    if (c->trace && trace_sync) mode |= TC_TRACE_SYNC;
    LM_CU(lm_launch_cluster(c, grid, dim3(TC_THREADS), smem, splits, fn, y, x_bf16, w, n, k, m, ks, mode, link,
                            c->trace));
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

/* How many clusters of `s` blocks of k_gemm_tc (bm rows, TT = n rounded up to 16, the context's
 * product path) over k / s columns the device can hold at once; 0 when that shape does not fit. */
extern "C" int lm_cuda_gemm_tc_max_clusters(struct lm_cuda_ctx *c, int k, int s, int bm, int n) {
    const int tt = tc_tt(n);
    if (!lm_cuda_gemm_tc_fits(c, k, s) || (bm != 64 && bm != 128) || tc_smem(tt, k / s, bm) > (size_t)c->smem_optin)
        return 0;
    const bool push = tc_push(c, tt, s);
    return tc_clusters((const void *)tc_kernel_for(tt, c->gemm_wgmma, bm, push), tc_launch_smem(tt, k, s, bm, false, push),
                       s);
}

/* The weight rows a block of lm_cuda_gemm_tc takes for n rows of [*, k] x [m, k]^T in s splits:
 * - 128 at up to 16 rows (TT = 16) where 128-row blocks' clusters fit one wave: half the blocks,
 *   each one warpgroup over both halves (perf-notes v29: Qwen3-0.6B decode, tg128 at 1 / 2 / 4 / 8
 *   / 16 sequences +2.8 / +1.0 / -0.5 / +5.3 / -0.4% against LM_CUDA_GEMM_TC_BM=64 in one call;
 *   at 32 and 64 sequences 128 rows lost 2-4%, so those keep the rule below);
 * - else 64, or 128 where 64-row blocks' clusters do not fit one wave (cluster placement, which
 *   the split plan's count of blocks a multiprocessor does not see: Qwen3-0.6B's gate/up at 48-64
 *   rows, 96 clusters of 4 against 92 that fit) and 128-row ones do (perf-notes v22);
 * - the context's gemm_tc_bm when set.
 * It may depend on n: a block's rows are summed by the same instructions in the same order either
 * way, so a row's bits do not depend on it (test_cuda checks). */
extern "C" int lm_cuda_gemm_tc_rows_per_block(struct lm_cuda_ctx *c, int k, int m, int s, int n) {
    const int tt = tc_tt(n);
    if (c->gemm_tc_bm == 64 || c->gemm_tc_bm == 128)
        return c->gemm_tc_bm == 128 && tc_smem(tt, k / s, 128) > (size_t)c->smem_optin ? 64 : c->gemm_tc_bm;
    const int fit128 = lm_cuda_gemm_tc_max_clusters(c, k, s, 128, n);
    const bool fits128 = fit128 > 0 && (m + 127) / 128 <= fit128;
    if (tt == 16 && fits128) return 128;
    const int fit64 = lm_cuda_gemm_tc_max_clusters(c, k, s, 64, n);
    return (m + 63) / 64 <= fit64 || !fits128 ? 64 : 128;
}

/* The splits lm_cuda_gemm runs n rows of [*, k] x [m, k]^T in on k_gemm_tc; 0: cuBLAS. */
static int tc_route(struct lm_cuda_ctx *c, int n, int k, int m) {
    if (n > std::min(c->gemm_tc_rows, TC_MAX_T)) return 0;
    const int s = tc_memo(c, TC_MEMO_SPLITS, k, m, 0, [&] { return lm_cuda_gemm_tc_splits(c, k, m); }),
              f = c->gemm_tc_splits;
    return s && f && lm_cuda_gemm_tc_fits(c, k, f) ? f : s; /* a forced split count where it fits */
}

extern "C" bool lm_cuda_gemm_on_tc(struct lm_cuda_ctx *c, int n, int k, int m) { return tc_route(c, n, k, m) != 0; }
extern "C" bool lm_cuda_gemm_tc_pushes(const struct lm_cuda_ctx *c, int n, int splits) {
    return n >= 1 && n <= TC_MAX_T && tc_push(c, tc_tt(n), splits);
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

extern "C" lm_status lm_cuda_gemm_linked(struct lm_cuda_ctx *c, float *y, const uint16_t *x_bf16, const uint16_t *w,
                                         int n, int k, int m, bool accumulate, const struct lm_cuda_norm_link *link) {
    const int s = n >= 1 && k >= 1 && m >= 1 ? tc_route(c, n, k, m) : 0;
    if (!s)
        return lm_errorf(LM_ERR_SHAPE, "CUDA gemm_linked: [%d, %d] x [%d, %d]^T does not take the tensor-core kernel",
                         n, k, m, k);
    return launch_tc(c, y, x_bf16, w, n, k, m, accumulate ? TC_ADD : TC_STORE, s, link);
}

extern "C" lm_status lm_cuda_gemm_swiglu_linked(struct lm_cuda_ctx *c, uint16_t *h, const uint16_t *x_bf16,
                                                const uint16_t *w, int n, int k, int inter,
                                                const struct lm_cuda_norm_link *link) {
    const int s = n >= 1 && k >= 1 && inter >= 1 && inter % 2 == 0 ? tc_route(c, n, k, 2 * inter) : 0;
    if (!s)
        return lm_errorf(LM_ERR_SHAPE,
                         "CUDA gemm_swiglu_linked: [%d, %d] x [%d, %d]^T does not take the tensor-core kernel", n,
                         k, 2 * inter, k);
    return launch_tc(c, h, x_bf16, w, n, k, 2 * inter, TC_SWIGLU, s, link);
}
