/* layers.cu: the decoder layers of a batch-1 decode step as one persistent kernel
 * (lm_cuda_decode_layers in cuda.h; docs/perf-notes.md v13 for why and what it measured).
 *
 * Why: at batch 1 a layer is a chain of 5 dependent steps (q/k/v, attention, o_proj, gate/up,
 * down). As 5 kernels each step paid ~2 us of boundary on top of streaming its weights, and the
 * weights could only start streaming once the predecessor's blocks had left. Here every block
 * stays resident for the whole step, so the weights of the next phases stream into shared
 * memory while the current phase waits on its dependency, and a dependency is a grid-wide
 * counter (~1 us, scripts/arrow-bench.cu) rather than a kernel boundary.
 *
 * Layout of a block (one a multiprocessor, 288 threads): warps 0-7 compute, warp 8's lane 0
 * copies. Phases are numbered k = 5 l + p (p: 0 q/k/v, 1 attention, 2 o_proj, 3 gate/up, 4 down).
 * Each block finishes phase k by adding 1 to sync[0] (release); a phase that reads another
 * block's output first waits for sync[0] >= G k (acquire), G the grid size. A GEMV phase's rows
 * are split over the blocks in contiguous slices (SwiGLU in gate/up pairs); the copy thread walks
 * the same sequence of slices, cut into pieces of whole rows of at most one slot, and loads each
 * into the next ring slot once the phase that last used the slot has released it. */
#include <stdio.h>

#include "backend/cuda/attn_dec.cuh"

namespace {

constexpr int LS_WARPS = 8, LS_THREADS = LS_WARPS * 32 + 32;
constexpr int LS_SLOTS = 8, LS_SLOT = 24 * 1024, LS_MAXCH = 12; /* ring; x staging up to 12 x 256 */

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint64_t *b, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(b)) : "memory");
}
/* Waits until the phase of parity `parity` of barrier b has completed. */
__device__ __forceinline__ void mbar_wait(uint64_t *b, unsigned parity) {
    unsigned ok = 0;
    while (!ok)
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(ok)
                     : "r"(smem_u32(b)), "r"(parity)
                     : "memory");
}
/* bytes (a multiple of 16) from global src to shared dst, completing on barrier b. */
__device__ __forceinline__ void bulk_load(void *dst, const void *src, unsigned bytes, uint64_t *b) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(b))
                 : "memory");
}
/* The calling thread's earlier cp.async copies arrive on barrier b when they land. */
__device__ __forceinline__ void cp_async_arrive(uint64_t *b) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ unsigned long long gtime() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ unsigned ld_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void red_release(unsigned *p, unsigned v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
/* The barrier of the 8 compute warps (the copy warp never joins it). */
__device__ __forceinline__ void ls_sync() { asm volatile("bar.sync 1, 256;" ::: "memory"); }

/* One GEMV phase of a layer: its matrix, shape, input, output, norm and epilogue. */
struct ls_gemv {
    const uint16_t *w;
    int m, k, unit; /* rows, columns, rows a unit of the split (2: SwiGLU pairs) */
    const float *x, *nw;
    float *y;
    int epi;
};

__host__ __device__ inline ls_gemv ls_phase(const lm_cuda_layers &P, const lm_cuda_layer_w &w, int p) {
    switch (p) {
    case 0: return {w.wqkv, P.qkv_rows, P.hidden, 1, P.x, w.in_ln, P.qkv, LM_CUDA_EPI_STORE};
    case 2: return {w.wo, P.hidden, P.q_dim, 1, P.att, nullptr, P.x, LM_CUDA_EPI_ADD};
    case 3: return {w.wgu, 2 * P.inter, P.hidden, 2, P.x, w.post_ln, P.h, LM_CUDA_EPI_SWIGLU};
    default: return {w.wd, P.hidden, P.inter, 1, P.h, nullptr, P.x, LM_CUDA_EPI_ADD};
    }
}

/* Rows [*r0, *r0 + *n) of a GEMV phase that block b of G owns, and its pieces of *rpp rows. */
__host__ __device__ inline void ls_slice(const ls_gemv &g, int b, int G, int *r0, int *n, int *rpp) {
    const int units = g.m / g.unit;
    const int u0 = (int)((long long)b * units / G), u1 = (int)((long long)(b + 1) * units / G);
    *r0 = u0 * g.unit, *n = (u1 - u0) * g.unit;
    *rpp = LS_SLOT / (2 * g.k);
}

template <int D, int GM>
__global__ void __launch_bounds__(LS_THREADS, 1) k_decode_layers(const lm_cuda_layers P) {
    extern __shared__ __align__(128) unsigned char ls_smem[];
    unsigned char *ring = ls_smem;
    float *xs = reinterpret_cast<float *>(ls_smem + LS_SLOTS * LS_SLOT);
    const float4 *xs4 = reinterpret_cast<const float4 *>(xs);
    __shared__ __align__(8) uint64_t full[LS_SLOTS], empty[LS_SLOTS];
    __shared__ float ss_part[LS_WARPS];
    const int b = blockIdx.x, G = gridDim.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    unsigned *cnt = P.sync;
    const bool cpa = P.copy_mode == 1; /* cp.async by the copy warp's 32 lanes, else bulk copies */
    if (tid == 0) {
        for (int i = 0; i < LS_SLOTS; i++) mbar_init(&full[i], cpa ? 32 : 1), mbar_init(&empty[i], 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (warp == LS_WARPS) { /* the copy thread (bulk) or warp (cp.async) */
        if (lane && !cpa) return;
        unsigned seq = 0;
        const unsigned infl = (unsigned)P.inflight;
        for (int l = 0; l < P.n_layers; l++) {
            const lm_cuda_layer_w w = P.layers[l];
            for (int p = 0; p < 5; p++) {
                if (p == 1) continue;
                const ls_gemv g = ls_phase(P, w, p);
                int r0, n, rpp;
                ls_slice(g, b, G, &r0, &n, &rpp);
                for (int i = 0; i < n; i += rpp, seq++) {
                    const int rows = min(rpp, n - i), slot = (int)(seq % LS_SLOTS);
                    const unsigned use = seq / LS_SLOTS;
                    if (use) mbar_wait(&empty[slot], (use - 1) & 1); /* its last phase is done */
                    if (seq >= infl) { /* at most infl copies in flight */
                        const unsigned o = seq - infl;
                        mbar_wait(&full[o % LS_SLOTS], (o / LS_SLOTS) & 1);
                    }
                    unsigned char *dst = ring + (size_t)slot * LS_SLOT;
                    const unsigned char *src = reinterpret_cast<const unsigned char *>(g.w + (size_t)(r0 + i) * g.k);
                    const unsigned bytes = (unsigned)(rows * 2 * g.k);
                    if (cpa) {
                        for (unsigned o = lane * 16; o < bytes; o += 512)
                            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(dst + o)), "l"(src + o)
                                         : "memory");
                        cp_async_arrive(&full[slot]);
                    } else {
                        bulk_load(dst, src, bytes, &full[slot]);
                    }
                }
            }
        }
        return;
    }

    /* The compute warps. */
    unsigned seq = 0, target = 0; /* next ring piece; sync[0] a phase waits for */
    auto grid_wait = [&](unsigned t) {
        if (tid == 0)
            while (ld_acquire(cnt) < t) {
            }
        ls_sync();
    };
    for (int l = 0; l < P.n_layers; l++) {
        const lm_cuda_layer_w w = P.layers[l];
        for (int p = 0; p < 5; p++, target += G) {
            int np = 0; /* ring pieces this phase used */
            unsigned long long *tr = P.trace ? P.trace + ((size_t)b * 5 * P.n_layers + 5 * l + p) * 4 : nullptr;
            if (tr && tid == 0) tr[0] = gtime(), tr[1] = tr[2] = 0;
            if (p == 1) {
                if (b < P.attn.n_kv_heads) {
                    lm_cuda_attn a = P.attn;
                    a.q_norm = w.q_norm, a.k_norm = w.k_norm, a.k_cache = w.k_cache, a.v_cache = w.v_cache;
                    attn_dec_run<D, GM>(a, b, 0, 0, 1, [&] {
                        grid_wait(target);
                        if (tr && tid == 0) tr[1] = tr[2] = gtime();
                    }, [] { ls_sync(); });
                }
            } else {
                const ls_gemv g = ls_phase(P, w, p);
                int r0, n, rpp;
                ls_slice(g, b, G, &r0, &n, &rpp);
                np = (n + rpp - 1) / rpp;
                const int K = g.k, nch = (K + 255) / 256;
                /* Norm weights before the wait (they never depend on it), as k_gemv. */
                float nwv[LS_MAXCH];
#pragma unroll
                for (int c = 0; c < LS_MAXCH; c++) {
                    const int k = c * 256 + tid;
                    nwv[c] = g.nw && c < nch && k < K ? __ldg(g.nw + k) : 0.f;
                }
                grid_wait(target);
                if (tr && tid == 0) tr[1] = gtime();
                /* Stage x * norm_w (k_gemv's order: squares summed per thread in chunk order, the
                 * warp's xor tree, the 8 warps in order), x read through L2. */
                float v[LS_MAXCH], sq = 0.f;
#pragma unroll
                for (int c = 0; c < LS_MAXCH; c++) {
                    const int k = c * 256 + tid;
                    v[c] = c < nch && k < K ? __ldcg(g.x + k) : 0.f;
                }
#pragma unroll
                for (int c = 0; c < LS_MAXCH; c++)
                    if (c < nch) {
                        const int k = c * 256 + tid;
                        float val = v[c];
                        if (g.nw) {
                            sq = fmaf(val, val, sq);
                            val = __fmul_rn(val, nwv[c]);
                        }
                        xs[gemv_slot<8>(k)] = val;
                    }
                if (g.nw) {
                    const float s = warp_sum(sq);
                    if (lane == 0) ss_part[warp] = s;
                }
                ls_sync();
                float inv = 1.f;
                if (g.nw) {
                    float ss = 0.f;
#pragma unroll
                    for (int i = 0; i < LS_WARPS; i++) ss = __fadd_rn(ss, ss_part[i]);
                    inv = 1.0f / sqrtf(ss / (float)K + P.eps);
                }
                for (int i = 0; i < np; i++) {
                    const unsigned s = seq + i;
                    mbar_wait(&full[s % LS_SLOTS], (s / LS_SLOTS) & 1);
                }
                if (tr && tid == 0) tr[2] = gtime();
                /* Rows (pairs for SwiGLU) strided over the warps; a row's sum in k_gemv's order. */
                auto row_dot = [&](int r) {
                    const int piece = r / rpp;
                    const unsigned char *wr = ring + (size_t)((seq + piece) % LS_SLOTS) * LS_SLOT +
                                              (size_t)(r - piece * rpp) * 2 * K;
                    float acc = 0.f;
                    for (int c = 0; c < nch; c++) {
                        const int k = c * 256 + lane * 8;
                        const uint4 q = k < K ? *reinterpret_cast<const uint4 *>(wr + 2 * k) : make_uint4(0, 0, 0, 0);
                        acc = gemv_dot8(acc, q, xs4[c * 64 + lane], xs4[c * 64 + 32 + lane]);
                    }
                    return __fmul_rn(warp_sum(acc), inv);
                };
                const int u = g.unit;
                for (int r = warp * u; r < n; r += LS_WARPS * u) {
                    const float a0 = row_dot(r), a1 = u == 2 ? row_dot(r + 1) : 0.f;
                    if (lane == 0) {
                        const int j = r0 + r;
                        if (g.epi == LM_CUDA_EPI_ADD)
                            g.y[j] = __fadd_rn(__ldcg(g.y + j), a0);
                        else if (g.epi == LM_CUDA_EPI_SWIGLU)
                            gemv_store<LM_CUDA_EPI_SWIGLU>(g.y, j, g.m, a0, a1, 0);
                        else
                            gemv_store<LM_CUDA_EPI_STORE>(g.y, j, g.m, a0, 0.f, 0);
                    }
                }
            }
            /* Phase done: outputs written and ring pieces read by every compute warp. */
            ls_sync();
            if (tid == 0) {
                if (tr) tr[3] = gtime();
                __threadfence();
                red_release(cnt, 1);
                for (int i = 0; i < np; i++) mbar_arrive(&empty[(seq + i) % LS_SLOTS]);
            }
            seq += np;
        }
    }
    /* Leave the counters at zero for the next launch: the last block to get here knows that
     * every block has passed its last wait. */
    if (tid == 0) {
        __threadfence();
        if (atomicAdd(&P.sync[1], 1u) == (unsigned)G - 1) {
            P.sync[0] = 0;
            P.sync[1] = 0;
            __threadfence();
        }
    }
}

/* Shared memory of the kernel: the ring plus x staged at the widest GEMV input. */
size_t ls_smem_bytes(const lm_cuda_layers &P) {
    const int kmax = std::max({P.hidden, P.q_dim, P.inter});
    return (size_t)LS_SLOTS * LS_SLOT + (size_t)(kmax + 255) / 256 * 256 * sizeof(float);
}

template <int D, int GM>
cudaError_t ls_launch(const lm_cuda_ctx *c, const lm_cuda_layers &P, bool launch, int *fit) {
    auto fn = k_decode_layers<D, GM>;
    const size_t smem = ls_smem_bytes(P);
    *fit = lm_cuda_occupancy((const void *)fn, LS_THREADS, smem);
    if (!launch || *fit < 1) return cudaSuccess;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(c->sm_count);
    cfg.blockDim = dim3(LS_THREADS);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeCooperative; /* every block resident: they wait on each other */
    at[0].val.cooperative = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, fn, P);
}

cudaError_t ls_dispatch(const lm_cuda_ctx *c, const lm_cuda_layers &P, bool launch, int *fit) {
    const int D = P.attn.head_dim, G = P.attn.n_kv_heads > 0 ? P.attn.n_heads / P.attn.n_kv_heads : 0;
    *fit = 0;
    if (D == 16 && G == 2) return ls_launch<16, 2>(c, P, launch, fit);
    if (D == 128 && G == 1) return ls_launch<128, 1>(c, P, launch, fit);
    if (D == 128 && G == 2) return ls_launch<128, 2>(c, P, launch, fit);
    if (D == 128 && G == 4) return ls_launch<128, 4>(c, P, launch, fit);
    return cudaSuccess;
}

} // namespace

extern "C" bool lm_cuda_decode_layers_fits(struct lm_cuda_ctx *c, const struct lm_cuda_layers *L, char *why,
                                           size_t cap) {
    char buf[256];
    buf[0] = 0;
    const lm_cuda_attn &a = L->attn;
    const int G = a.n_kv_heads > 0 ? a.n_heads / a.n_kv_heads : 0;
    const int D = a.head_dim;
    if (!((D == 16 && G == 2) || (D == 128 && (G == 1 || G == 2 || G == 4)) ) || a.n_heads % a.n_kv_heads)
        snprintf(buf, sizeof buf, "head_dim %d with groups of %d query heads (built: 16 x 2, 128 x 1/2/4)", D, G);
    else if (a.n_kv_heads > c->sm_count)
        snprintf(buf, sizeof buf, "%d KV heads over %d multiprocessors", a.n_kv_heads, c->sm_count);
    else if (a.n_splits > 1 || a.out_bf16 || a.out != (void *)L->att)
        snprintf(buf, sizeof buf, "attention must write att in float32, without split-KV");
    else if (L->copy_mode < 0 || L->copy_mode > 1)
        snprintf(buf, sizeof buf, "copy_mode %d (0 bulk, 1 cp.async)", L->copy_mode);
    else if (L->inflight < 1 || L->inflight > LS_SLOTS)
        snprintf(buf, sizeof buf, "inflight %d (1 to %d)", L->inflight, LS_SLOTS);
    else if (std::max({L->hidden, L->q_dim, L->inter}) > LS_MAXCH * 256)
        snprintf(buf, sizeof buf, "a GEMV input of %d elements (at most %d)", std::max({L->hidden, L->q_dim, L->inter}),
                 LS_MAXCH * 256);
    else if (L->hidden % 8 || L->q_dim % 8 || L->inter % 8 || L->qkv_rows < 1)
        snprintf(buf, sizeof buf, "hidden %d, q_dim %d, inter %d: multiples of 8", L->hidden, L->q_dim, L->inter);
    if (!buf[0]) {
        lm_cuda_layer_w w = {};
        for (int p = 0; p < 5 && !buf[0]; p++) {
            if (p == 1) continue;
            const ls_gemv g = ls_phase(*L, w, p);
            int worst = 0;
            for (int b = 0; b < c->sm_count; b++) {
                int r0, n, rpp;
                ls_slice(g, b, c->sm_count, &r0, &n, &rpp);
                if (rpp < 1) {
                    worst = 1 << 30;
                    break;
                }
                worst = std::max(worst, (n + rpp - 1) / rpp);
            }
            if (worst > LS_SLOTS)
                snprintf(buf, sizeof buf, "phase %d: a multiprocessor's slice of the [%d, %d] matrix needs %d ring "
                         "slots of 24 KiB (%d exist)", p, g.m, g.k, worst, LS_SLOTS);
        }
    }
    if (!buf[0]) {
        int fit = 0;
        if (ls_dispatch(c, *L, false, &fit) != cudaSuccess || fit < 1)
            snprintf(buf, sizeof buf, "%zu bytes of shared memory a block do not fit a multiprocessor",
                     ls_smem_bytes(*L));
    }
    if (why && cap) snprintf(why, cap, "%s", buf);
    return !buf[0];
}

extern "C" lm_status lm_cuda_decode_layers(struct lm_cuda_ctx *c, const struct lm_cuda_layers *L) {
    char why[256];
    if (!lm_cuda_decode_layers_fits(c, L, why, sizeof why))
        return lm_errorf(LM_ERR_SHAPE, "CUDA decode layers: %s", why);
    int fit = 0;
    LM_CU(ls_dispatch(c, *L, true, &fit));
    return LM_OK;
}
