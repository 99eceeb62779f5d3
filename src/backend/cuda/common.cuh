/* common.cuh: what the CUDA backend's .cu files share: the context struct, error checks, the
 * launch helper (programmatic dependent launch) and small device helpers. Internal to
 * src/backend/cuda. */
#ifndef LM_BACKEND_CUDA_COMMON_CUH
#define LM_BACKEND_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "backend/cuda/cuda.h"

/* Records "CUDA: <what>: <error>" and returns LM_ERR_IO (LM_ERR_NOMEM for allocations). ops.cu. */
lm_status lm_cuda_fail(cudaError_t e, const char *what);

#define LM_CU(call)                                                                               \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) return lm_cuda_fail(e_, #call);                                    \
    } while (0)

struct lm_cuda_ctx {
    int device;
    int sm_count;
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_ws;       /* cuBLAS workspace (set explicitly so graph capture never allocates) */
    bool pdl;
    int gemv_rows;       /* 0 = automatic */
    int smem_optin;      /* bytes of shared memory a block may opt in to (the device's limit) */
    unsigned long long *trace; /* GEMV timeline buffer (lm_cuda_ctx_trace) or NULL */
    bool attn_dec;       /* small decode launches use the 8-warp attention kernel (attention.cu) */
    bool attn_batch;     /* batched decode launches of one wave use the decode kernel (attention.cu batch_dec) */
    bool attn_tc;        /* the 8-warp decode kernel's rounds on the tensor cores where the output is
                            bf16 (attention.cu dec_one_wave) */
    int gemm_tc_rows;    /* lm_cuda_gemm: k_gemm_tc up to this many rows (gemm.cu; 0: cuBLAS) */
    int gemm_tc_splits;  /* its splits (0: lm_cuda_gemm_tc_splits' plan), for benchmarks */
    bool gemm_wgmma;     /* k_gemm_tc's products on wgmma where the device code has it (gemm.cu) */
    int gemm_tc_bm;      /* k_gemm_tc's weight rows a block: 64 or 128 forced, 0 its rule (gemm.cu) */
    bool gemm_push;      /* k_gemm_tc pushes its cluster's partials at 32 rows and fewer (gemm.cu tc_push) */
    int gemm_spread_rows; /* k_gemm_tc one block a multiprocessor up to this many rows, where its
                             clusters fit (gemm.cu launch_tc) */
    /* gemm.cu's memo of k_gemm_tc's plans under this context's settings, so that an eager step's
     * GEMMs do not redo the occupancy lookups each launch: (kind, k, m, x) -> v; emptied by the
     * settings' setters. */
    struct {
        int kind, k, m, x, v;
    } tc_memo[64];
    int n_tc_memo;
    int max_rows;        /* sampler scratch capacity */
    int gemv_dyn_rows;   /* k_gemv hands out its last row groups from counters from this many
                          * weight rows up (the lm_head; 0: off; gemv.cu, perf-notes v27) */
    unsigned *gemv_ctr;  /* those counters and the blocks done, LM_CUDA_GEMV_CLASSES + 1 of them, one
                          * a 128-byte line (LM_CUDA_GEMV_CTR_STRIDE words apart), zero between
                          * launches (the last block resets them) */
    mutable long gemv_dealt; /* launches queued that dealt out row groups (lm_cuda_ctx_gemv_dealt) */
    float2 *am_part;     /* [max_rows][LM_CUDA_AM_MAX_CHUNKS] argmax partials (value, id bits) */
    unsigned *am_count;  /* [max_rows] blocks done, reset by the last one */
    int *scr_max;        /* [max_rows] lm_cuda_gemv_screen's best lower bound of each row, as an
                          * ordered key (-inf between launches: lm_cuda_argmax_screened resets it) */
    struct lm_cuda_scr_fuse *scr_fuse; /* the one-row screen's own pick (lm_cuda_screen_pick) */
    bool scr_fuse_on;    /* LM_CUDA_SCR_FUSE (default 1): the one-row screen picks its own id */
};

/* The state of a one-row screen that picks its own greedy id (gemv.cu k_screen<..., FU>):
 * zero between launches but for done, which the screen clears as it starts and sets when it
 * wrote the id (the pick that follows then returns at once). */
struct lm_cuda_scr_fuse {
    unsigned long long best; /* the best (logit, lowest id) key summed exactly so far */
    unsigned count;          /* blocks done */
    int ovf;                 /* a warp held more candidates than it keeps: the pick decides */
    int done;
};

enum { LM_CUDA_AM_CHUNK = 2048, LM_CUDA_AM_MAX_CHUNKS = 128, LM_CUDA_GEMV_CLASSES = 32, LM_CUDA_GEMV_CTR_STRIDE = 32 };
/* scr_max's value between launches: gemv.cu's order-preserving key of -inf (0xff800000 ^ 0x7fffffff). */
constexpr int LM_CUDA_SCR_KEY_NEG_INF = (int)(0xff800000u ^ 0x7fffffffu);
/* After an lm_cuda_gemv_screen whose lm_cuda_argmax_screened will not run (a failed launch):
 * waits for the stream (unless it is capturing a graph, which then ran nothing) and puts scr_max
 * back to -inf, as the argmax would have; a later screen would otherwise start from a stale bound.
 * ops.cu. */
void lm_cuda_screen_reset(lm_cuda_ctx *c);

/* Launches kernel k on the context's stream, with the programmatic-stream-serialization
 * attribute when c->pdl (kernels then call pdl_wait() before touching a predecessor's output). */
/* lm_launch with thread-block clusters of `cluster` blocks along x (gridDim.x a multiple of it;
 * 1: no cluster attribute). Clusters: CUDA C++ Programming Guide, "Thread Block Clusters". */
template <typename... KArgs, typename... Args>
static inline cudaError_t lm_launch_cluster(const lm_cuda_ctx *c, dim3 grid, dim3 block, size_t smem,
                                            int cluster, void (*k)(KArgs...), Args &&...args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cudaLaunchAttribute at[2];
    unsigned na = 0;
    if (c->pdl) {
        at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[na++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster > 1) {
        at[na].id = cudaLaunchAttributeClusterDimension;
        at[na].val.clusterDim.x = (unsigned)cluster;
        at[na].val.clusterDim.y = 1;
        at[na++].val.clusterDim.z = 1;
    }
    cfg.attrs = at;
    cfg.numAttrs = na;
    return cudaLaunchKernelEx(&cfg, k, std::forward<Args>(args)...);
}

template <typename... KArgs, typename... Args>
static inline cudaError_t lm_launch(const lm_cuda_ctx *c, dim3 grid, dim3 block, size_t smem,
                                    void (*k)(KArgs...), Args &&...args) {
    return lm_launch_cluster(c, grid, block, smem, 1, k, std::forward<Args>(args)...);
}

/* Blocks of `fn` resident per multiprocessor with `smem` dynamic bytes of shared memory (cached;
 * also raises the kernel's dynamic shared-memory limit to smem). ops.cu. */
int lm_cuda_occupancy(const void *fn, int threads, size_t smem);

/* The bench functions' timer: reps runs of run() after one untimed warm-up, each between two
 * events recorded on stream s (0: the legacy default stream); *ms gets the median in milliseconds.
 * what names a CUDA failure. */
template <class F>
static lm_status lm_time_median(cudaStream_t s, int reps, const char *what, F &&run, float *ms) {
    *ms = 0;
    cudaEvent_t e0 = NULL, e1 = NULL;
    cudaError_t e = cudaEventCreate(&e0);
    if (e == cudaSuccess) e = cudaEventCreate(&e1);
    lm_status rc = e == cudaSuccess ? LM_OK : lm_cuda_fail(e, what);
    std::vector<float> v;
    for (int i = -1; i < reps && !rc; i++) {
        cudaEventRecord(e0, s);
        run();
        cudaEventRecord(e1, s);
        if ((e = cudaEventSynchronize(e1)) != cudaSuccess) rc = lm_cuda_fail(e, what);
        float t = 0;
        cudaEventElapsedTime(&t, e0, e1);
        if (i >= 0) v.push_back(t);
    }
    if (!rc && !v.empty()) {
        std::sort(v.begin(), v.end());
        *ms = v[v.size() / 2];
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    return rc;
}

/* ---- device helpers ---- */

/* Waits until the predecessor grid has completed and its writes are visible (a no-op when the
 * kernel was launched without the PDL attribute). Every kernel calls it before reading or
 * writing anything a predecessor touches, so dependencies stay transitive. Data a predecessor
 * writes is read with plain or L2 (.cg) loads, never through the non-coherent read-only path:
 * a PDL kernel is already running while its predecessor writes. */
static __device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
/* Lets the next kernel's blocks launch (they still wait in pdl_wait for this grid to finish). */
static __device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* 16 bytes of weights that are read once: skip L1 (the non-coherent path: never for data a
 * kernel of the same chain writes). */
static __device__ __forceinline__ uint4 ld_stream16(const void *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}
/* 8 bytes of the same (the 6-bit screen's high bits). */
static __device__ __forceinline__ uint2 ld_stream8(const void *p) {
    uint2 r;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
    return r;
}
static __device__ __forceinline__ float bf2f(uint16_t v) { return __uint_as_float((uint32_t)v << 16); }
static __device__ __forceinline__ float bf_lo(uint32_t v) { return __uint_as_float(v << 16); }
static __device__ __forceinline__ float bf_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }
/* A shared-memory pointer as the 32-bit address PTX's shared-space instructions take. */
static __device__ __forceinline__ unsigned smem_u32(const void *p) {
    return (unsigned)__cvta_generic_to_shared(p);
}
/* wgmma (sm_90a) helpers, used by gemm.cu and scripts/wgmma-bench.cu.
 * A shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format") for a K-major operand in
 * the 128-byte swizzle: rows of 64 bf16 (128 bytes) with 16-byte chunk c of row r at c ^ (r % 8),
 * 8-row groups 1,024 bytes apart (the stride byte offset; the leading one is unused), the
 * pattern starting 1 KiB-aligned. A k-step of 16 columns inside the row is 32 bytes on addr.
 * The descriptor as two words: the low one holds the start address in 16-byte units (bits 0-13)
 * and the leading byte offset (bits 16-29), the high one the stride and the swizzle, the same for
 * every descriptor here. A loop over the operands of one pattern adds its offsets, in 16-byte
 * units, to the low word of the base (wg_desc_lo(addr) + off / 16 == wg_desc_lo(addr + off) while
 * addr + off stays in the 256 KiB shared window, which every shared address does): one add a
 * descriptor, where building each from its address took ptxas ~7 dependent uniform instructions
 * (ncu's source page; the step's time did not move: perf-notes v31). */
static __device__ __forceinline__ unsigned wg_desc_lo(unsigned addr) { return ((addr & 0x3FFFF) >> 4) | 1u << 16; }
static __device__ __forceinline__ unsigned long long wg_desc_of(unsigned lo) {
    return (unsigned long long)lo | (unsigned long long)((1024 >> 4) | 1u << 30) << 32;
}
static __device__ __forceinline__ unsigned long long wg_desc(unsigned addr) { return wg_desc_of(wg_desc_lo(addr)); }
static __device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
static __device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
static __device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
/* Pins the accumulators to their registers around the asynchronous products (as CUTLASS's
 * warpgroup_fence_operand does), so the compiler cannot move them while a wgmma owns them. */
template <int NT>
static __device__ __forceinline__ void wg_pin(float (&d)[NT][4]) {
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int q = 0; q < 4; q++) asm volatile("" : "+f"(d[j][q])::"memory");
}

/* d[64 x N] += a[64 x 16] b[16 x N], both from shared memory (descriptors, K-major: a's rows and
 * b's columns are the weight rows and tokens, k contiguous); d in the layout of N / 8 mma.m16n8
 * accumulators (d[j] = n-tile j; warp w of the warpgroup rows 16 w .. 16 w + 15). */
template <int N>
static __device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], unsigned long long a, unsigned long long b);
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDA_ARCH__) /* wgmma: sm_90a only (other device targets keep mma.sync) */
/* The four accumulators of n-tile j as asm outputs (the instruction names every accumulator
 * register, so each shape's list is written out). */
#define WG_D(j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
template <>
__device__ __forceinline__ void wgmma_ss<16>(float (&d)[2][4], unsigned long long a, unsigned long long b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, 1, 1, 1, 0, 0;"
                 : WG_D(0), WG_D(1)
                 : "l"(a), "l"(b));
}
template <>
__device__ __forceinline__ void wgmma_ss<32>(float (&d)[4][4], unsigned long long a, unsigned long long b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, 1, 1, 1, 0, 0;"
                 : WG_D(0), WG_D(1), WG_D(2), WG_D(3)
                 : "l"(a), "l"(b));
}
template <>
__device__ __forceinline__ void wgmma_ss<48>(float (&d)[6][4], unsigned long long a, unsigned long long b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}, %24, %25, 1, 1, 1, 0, 0;"
                 : WG_D(0), WG_D(1), WG_D(2), WG_D(3), WG_D(4), WG_D(5)
                 : "l"(a), "l"(b));
}
template <>
__device__ __forceinline__ void wgmma_ss<64>(float (&d)[8][4], unsigned long long a, unsigned long long b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, 1, 1, 1, 0, 0;"
                 : WG_D(0), WG_D(1), WG_D(2), WG_D(3), WG_D(4), WG_D(5), WG_D(6), WG_D(7)
                 : "l"(a), "l"(b));
}
#undef WG_D
#endif
/* k_gemm_tc's products (and wgmma-bench's table 3, which times exactly this code): acc[h] += the
 * NH 64-row halves of the block's weight tile times its TT tokens, over nch chunks of 64 columns,
 * each chunk a tile of 128-byte rows in the layout wg_desc describes (weights: chunk ch at
 * ch * 64 NH rows, half h 64 rows further; tokens: chunk ch at ch * TT rows), 4 k-steps of 16 a
 * chunk. ws_lo and xs_lo are the tiles' wg_desc_lo. CNCH > 0: nch known at compile time, one
 * straight sequence; 0: a loop over nch (ptxas then injects a warpgroup.arrive at its head and
 * waits for each iteration's last wgmma: perf-notes v30's wgmma-bench table 3). */
template <int TT, int NH, int CNCH = 0>
static __device__ __forceinline__ void wg_chunk_products(float (&acc)[NH][TT / 8][4], unsigned ws_lo, unsigned xs_lo,
                                                         int nch) {
    auto chunk = [&](int ch) {
#pragma unroll
        for (int s2 = 0; s2 < 4; s2++) {
            const unsigned long long b = wg_desc_of(xs_lo + (unsigned)(ch * (TT * 128 / 16) + s2 * 2));
#pragma unroll
            for (int h = 0; h < NH; h++) /* half h: 64 rows of 128 bytes further */
                wgmma_ss<TT>(acc[h], wg_desc_of(ws_lo + (unsigned)(ch * (NH * 64 * 128 / 16) + h * (64 * 128 / 16) + s2 * 2)), b);
        }
    };
    if constexpr (CNCH > 0) {
#pragma unroll
        for (int ch = 0; ch < CNCH; ch++) chunk(ch);
    } else {
        for (int ch = 0; ch < nch; ch++) chunk(ch);
    }
}
/* 16 bytes global -> shared through L2 without a register (cp.async, sm_80+); with zfill, the
 * 16 bytes are zeros and src is not read. */
static __device__ __forceinline__ void cp_async16(void *dst, const void *src, bool zfill = false) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(zfill ? 0 : 16)
                 : "memory");
}
/* An L2 cache policy (PTX ISA "createpolicy") under which the lines a load brings in are the
 * first to be evicted: for weights, read once a step, so that they do not push out what the
 * step's kernels share through L2 (activations, partial sums, the KV cache). */
static __device__ __forceinline__ unsigned long long l2_evict_first() {
    unsigned long long pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    return pol;
}
/* cp_async16 with an L2 cache policy (l2_evict_first). */
static __device__ __forceinline__ void cp_async16_hint(void *dst, const void *src, bool zfill, unsigned long long pol) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(zfill ? 0 : 16), "l"(pol)
                 : "memory");
}
static __device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
/* Closes this thread's current group of cp.async copies. */
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
/* Waits until at most n of this thread's copy groups are pending (cp.async.wait_group takes an
 * immediate: n from 0 to 7, larger n waiting as 7; a constant n compiles to the one instruction). */
static __device__ __forceinline__ void cp_async_wait_pending(int n) {
    switch (n) {
    case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
    case 3: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
    case 4: asm volatile("cp.async.wait_group 4;" ::: "memory"); break;
    case 5: asm volatile("cp.async.wait_group 5;" ::: "memory"); break;
    case 6: asm volatile("cp.async.wait_group 6;" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 7;" ::: "memory"); break;
    }
}

/* ---- thread-block clusters: pushes into a peer's shared memory (PTX ISA "mbarrier", "st.async",
 * "mapa"; sm_90). A block's mbarrier counts the bytes its peers' st.async stores bring; the
 * owner waits on it locally instead of a cluster-wide barrier. ---- */
static __device__ __forceinline__ void mbar_init(void *bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
/* Makes this thread's mbarrier.init visible to the cluster's later (relaxed-barrier-ordered) uses. */
static __device__ __forceinline__ void fence_mbar_init_cluster() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
/* One arrival on the barrier, with `bytes` more expected from complete_tx operations. */
static __device__ __forceinline__ void mbar_arrive_expect(void *bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
                 : "memory");
}
/* Waits until the barrier's phase `parity` has completed, acquiring at cluster scope: the bytes it
 * counted, stored by the cluster's other blocks (st.async's complete_tx releases at cluster
 * scope), are visible. */
static __device__ __forceinline__ void mbar_wait(void *bar, unsigned parity) {
    unsigned done;
    do {
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done)
                     : "r"(smem_u32(bar)), "r"(parity)
                     : "memory");
    } while (!done);
}
/* The shared::cluster address of this block's shared-memory address p in the block of rank r. */
static __device__ __forceinline__ unsigned cluster_addr(const void *p, unsigned r) {
    unsigned a;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(smem_u32(p)), "r"(r));
    return a;
}
/* 16 bytes into a block's shared memory (cluster addresses), counted on that block's mbarrier.
 * PTX: only in a cluster of more than one block. k_gemm_tc also pushes into its own block this
 * way, which st.async's text allows (red.async's forbids it; perf-notes v25 call 13: reading the
 * own share locally instead measured 5% slower). */
static __device__ __forceinline__ void st_async16(unsigned addr, float4 v, unsigned bar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(addr),
                 "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(bar)
                 : "memory");
}

/* ldmatrix .x4: four 8 x 8 b16 matrices from shared memory; lane l gives the address of row l % 8
 * of matrix l / 8 (PTX ISA, ldmatrix); .trans transposes each. */
static __device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
static __device__ __forceinline__ void ldsm_x4_t(unsigned (&r)[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
/* c += a b (mma.sync m16n8k16, PTX ISA "Warp-level matrix fragment" layouts): a 16 x 16 bf16 (row), b 16 x 8 bf16 (col), c 16 x 8 float32. Not volatile: registers
 * only, so the compiler may interleave independent products. */
static __device__ __forceinline__ void mma_bf16(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
static __device__ __forceinline__ uint16_t f2bf(float f) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

/* The warp's xor-tree sum of v (float, double or int64: one order for every lane count). */
template <typename V>
static __device__ __forceinline__ V warp_sum(V v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
/* The greedy order of (logit, id) pairs: the larger logit, then the lower id (NaN never wins). */
static __device__ __forceinline__ bool am_better(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}
/* The end of a greedy choice over the nb blocks of row r (k_argmax, k_screen_pick), called by
 * every thread of a block, thread 0 holding the block's best (bv, bi): it goes to part[r * nb + b];
 * the last block to arrive reduces all nb in warp 0 and returns true in its thread 0 with *win the
 * winner (0 when no value won: all NaN), count[r] set back to 0. */
static __device__ __forceinline__ bool am_block_final(float bv, int bi, float2 *part, unsigned *count, int r, int b,
                                                      int nb, int *win) {
    __shared__ int last;
    if (threadIdx.x == 0) {
        part[(size_t)r * nb + b] = make_float2(bv, __int_as_float(bi));
        __threadfence();
        last = atomicAdd(&count[r], 1u) == (unsigned)nb - 1;
    }
    __syncthreads();
    if (!last || threadIdx.x >= 32) return false;
    __threadfence();
    bv = -INFINITY, bi = 0x7fffffff;
    for (int i = threadIdx.x; i < nb; i += 32) {
        const float2 p = __ldcg(&part[(size_t)r * nb + i]);
        const int pi = __float_as_int(p.y);
        if (am_better(p.x, pi, bv, bi)) bv = p.x, bi = pi;
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (am_better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    *win = bi == 0x7fffffff ? 0 : bi;
    if (threadIdx.x == 0) count[r] = 0;
    return threadIdx.x == 0;
}
static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* v + a pending fixed-point term a (lm_cuda_fix_io: a / LM_CUDA_FIX_ONE), rounded the one way
 * every kernel that folds one in rounds it. */
static __device__ __forceinline__ float fix_add(float v, long long a) {
    return __fadd_rn(v, __fmul_rn(__ll2float_rn(a), (float)(1.0 / LM_CUDA_FIX_ONE)));
}

static __device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

/* ---- timeline trace (lm_cuda_ctx_trace): per block, when it started, when its wait on the
 * predecessor returned, when its inputs were ready, when it finished (%globaltimer, ns) ---- */
static __device__ __forceinline__ unsigned long long gtime() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
/* The multiprocessor this thread runs on (PTX %smid). */
static __device__ __forceinline__ unsigned sm_id() {
    unsigned r;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
    return r;
}
/* Appends one entry for block `block` (< 2^20) of the launch over weights w (thread 0 of a
 * block): trace[0] counts entries, trace[1] is the capacity; t_end is now; t_mid (0: none) an
 * optional time between t1 and t2, kept as its offset from t0 (28 bits of ns) beside the block;
 * sm (sm_id(), < 2^12; 0 where a kernel does not record it) in the block word's top 12 bits;
 * kind (enum lm_cuda_trace_kind, < 16) in the entry word's top 4 bits. */
static __device__ __forceinline__ void trace_put(unsigned long long *trace, const void *w, int K, int M,
                                                 unsigned block, unsigned long long t0, unsigned long long t1,
                                                 unsigned long long t2, unsigned long long t_mid = 0,
                                                 unsigned sm = 0, unsigned kind = LM_CUDA_TRACE_MATRIX) {
    const unsigned long long t3 = gtime();
    const unsigned long long i = atomicAdd(trace, 1ull) % trace[1];
    unsigned long long *e = trace + 2 + i * LM_CUDA_TRACE_WORDS;
    e[0] = (unsigned long long)(uintptr_t)w;
    e[1] = ((unsigned long long)(unsigned)M << 32) | (unsigned)K;
    e[2] = (unsigned long long)(kind & 15u) << 60 | (t_mid > t0 ? (t_mid - t0) & 0x0fffffffull : 0) << 32 |
           (block | sm << 20);
    e[3] = t0, e[4] = t1, e[5] = t2, e[6] = t3;
}

#endif
