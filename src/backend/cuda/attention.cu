/* attention.cu: q/k RMSNorm + RoPE + paged K/V store, and grouped-query attention over a paged
 * bf16 KV cache (cuda.h lm_cuda_qk_norm_rope_store, lm_cuda_attention). */
#include <type_traits>

#include "backend/cuda/attn_dec.cuh"

namespace {

/* ---- attention ---- */

constexpr int ATT_WARPS = 4, ATT_MAXG = 8; /* largest group */

/* How a warp splits a head of D dims when it multiplies probabilities by V rows: DPL dims per
 * lane, LPT lanes per token, TPW tokens side by side. */
template <int D>
struct AttShape {
    static constexpr int DPL = D >= 64 ? D / 32 : 2;
    static constexpr int LPT = D / DPL;
    static constexpr int TPW = 32 / LPT;
};

/* One warp: dst = RoPE(RMSNorm(src) * w) at position pos for one head of D dims, to float32
 * dst_f or bf16 dst_b. Reads all of src before writing, so dst_f may be src. */
template <int D>
__device__ __forceinline__ void norm_rope_warp(const float *src, const float *w, const float *inv_freq,
                                               int pos, float eps, float *dst_f, uint16_t *dst_b,
                                               int lane) {
    constexpr int H = D / 2, PER = (H + 31) / 32;
    float x1[PER], x2[PER], ss = 0.f;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int j = lane + 32 * i;
        x1[i] = j < H ? src[j] : 0.f;
        x2[i] = j < H ? src[j + H] : 0.f;
        ss = fmaf(x1[i], x1[i], ss);
        ss = fmaf(x2[i], x2[i], ss);
    }
    ss = warp_sum(ss);
    const float inv = 1.0f / sqrtf(ss / (float)D + eps);
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int j = lane + 32 * i;
        if (j >= H) continue;
        const float a = w[j] * (x1[i] * inv), b = w[j + H] * (x2[i] * inv);
        const float ang = inv_freq[j] * (float)pos;
        float s, c;
        sincosf(ang, &s, &c);
        const float o1 = a * c - b * s, o2 = b * c + a * s;
        if (dst_f) {
            dst_f[j] = o1;
            dst_f[j + H] = o2;
        } else {
            dst_b[j] = f2bf(o1);
            dst_b[j + H] = f2bf(o2);
        }
    }
}


/* One block of 128 threads per token; a warp per head vector. */
template <int D>
__global__ void __launch_bounds__(128) k_qk_norm_rope_store(const lm_cuda_attn a) {
    const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    pdl_trigger(); /* the next kernel may launch now; it waits for this one */
    pdl_wait();
    const int seq = a.seq[t], pos = a.pos[t];
    const int blk = a.block_tables[(size_t)seq * a.bt_width + pos / a.block_size];
    const int slot = pos % a.block_size;
    float *row = a.qkv + (size_t)t * a.ld_qkv;
    const int Q = a.n_heads * D, KV = a.n_kv_heads * D;
    for (int vi = warp; vi < a.n_heads + a.n_kv_heads; vi += 4) {
        if (vi < a.n_heads) {
            norm_rope_warp<D>(row + vi * D, a.q_norm, a.inv_freq, pos, a.eps, row + vi * D, nullptr, lane);
        } else {
            const int g = vi - a.n_heads;
            norm_rope_warp<D>(row + Q + g * D, a.k_norm, a.inv_freq, pos, a.eps, nullptr,
                              a.k_cache + kv_offset(a, blk, g, slot, D), lane);
        }
    }
    for (int i = threadIdx.x; i < KV; i += blockDim.x)
        a.v_cache[kv_offset(a, blk, i / D, slot, D) + i % D] = f2bf(row[Q + KV + i]);
}


/* One block per (KV head, token). Phase 0 (FUSED): normalise/rotate this token's query heads of
 * the group into shared memory and write its K/V. Then each warp takes chunks of 32 positions:
 * lane = position for q.k (scores for all the group's heads at once), an online-softmax update,
 * then lanes = dims for p.V. Warps' partial (max, sum, acc) are merged at the end. */
/* GM: the group size rounded up (1, 2, 4 or 8: registers and shared memory scale with it). VPRE:
 * prefetch each chunk's V slices with its K rows (fewer round trips, more registers: for launches
 * too small to fill the GPU). FUSED: this kernel normalises/rotates/stores its own token first. */
template <int D, int GM, bool VPRE>
__global__ void __launch_bounds__(ATT_WARPS * 32) k_attention(const lm_cuda_attn a, int FUSED) {
    using S = AttShape<D>;
    constexpr int DPL = S::DPL, LPT = S::LPT;
    constexpr int TPW = S::TPW;
    constexpr int ATT_MAXG = GM;
    __shared__ __align__(16) float qs[ATT_MAXG][D];
    __shared__ float ps[ATT_WARPS][ATT_MAXG][32];
    __shared__ float wm[ATT_WARPS][ATT_MAXG], wl[ATT_WARPS][ATT_MAXG];
    __shared__ float wacc[ATT_WARPS][ATT_MAXG][D];
    const int g = blockIdx.x, t = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int G = a.n_heads / a.n_kv_heads, BS = a.block_size;
    pdl_trigger(); /* the next kernel may launch now; it waits for this one */
    pdl_wait();
    const int seq = a.seq[t], pos = a.pos[t];
    const int32_t *bt = a.block_tables + (size_t)seq * a.bt_width;
    const float *row = a.qkv + (size_t)t * a.ld_qkv;
    const int Q = a.n_heads * D, KV = a.n_kv_heads * D;
    const int L = pos + 1;
    /* This warp's first chunk: its block-table lookups, and an L1 prefetch of its K and V rows,
     * issued before the fused phase so that they overlap it (position pos is written below and
     * read after the barrier). */
    const int tok0 = warp * 32 + lane;
    unsigned off0 = 0;
    if (tok0 < L) {
        off0 = (unsigned)kv_offset(a, bt[tok0 / BS], g, tok0 % BS, D);
        if (tok0 < pos) {
            const char *kp = reinterpret_cast<const char *>(a.k_cache + off0);
            const char *vp = reinterpret_cast<const char *>(a.v_cache + off0);
#pragma unroll
            for (int b = 0; b < D * 2; b += 128) {
                asm volatile("prefetch.global.L1 [%0];" ::"l"(kp + b));
                asm volatile("prefetch.global.L1 [%0];" ::"l"(vp + b));
            }
        }
    }
    if (FUSED) {
        const size_t off = kv_offset(a, bt[pos / BS], g, pos % BS, D);
        for (int vi = warp; vi <= G; vi += ATT_WARPS) {
            if (vi < G)
                norm_rope_warp<D>(row + (g * G + vi) * D, a.q_norm, a.inv_freq, pos, a.eps, &qs[vi][0],
                                  nullptr, lane);
            else
                norm_rope_warp<D>(row + Q + g * D, a.k_norm, a.inv_freq, pos, a.eps, nullptr,
                                  a.k_cache + off, lane);
        }
        for (int d = threadIdx.x; d < D; d += blockDim.x) a.v_cache[off + d] = f2bf(row[Q + KV + g * D + d]);
    } else {
        for (int i = threadIdx.x; i < G * D; i += blockDim.x) qs[i / D][i % D] = row[g * G * D + i];
    }
    __syncthreads();

    const int nchunk = (L + 31) >> 5;
    float m[ATT_MAXG], l[ATT_MAXG], acc[ATT_MAXG][DPL];
#pragma unroll
    for (int h = 0; h < ATT_MAXG; h++) {
        m[h] = -INFINITY;
        l[h] = 0.f;
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[h][i] = 0.f;
    }
    const int gi = lane / LPT, d0 = (lane % LPT) * DPL;
    for (int c = warp; c < nchunk; c += ATT_WARPS) {
        const int tok = c * 32 + lane;
        float s[ATT_MAXG];
#pragma unroll
        for (int h = 0; h < ATT_MAXG; h++) s[h] = 0.f;
        /* This lane's position: its K row and, at the same offset, its V row. */
        unsigned off = 0; /* elements into this layer's pool (< 2^32: checked at model creation) */
        if (tok < L) off = c == warp ? off0 : (unsigned)kv_offset(a, bt[tok / BS], g, tok % BS, D);
        /* The V slices this lane needs for p.V, loaded now (raw bf16) so that their latency
         * overlaps the q.k loads: a chunk then costs two round trips (block table, K and V). */
        constexpr int NV = 32 / TPW;
        using vraw_t = typename std::conditional<DPL == 2, uint32_t, uint2>::type;
        vraw_t vraw[VPRE ? NV : 1];
        if (VPRE) {
#pragma unroll
            for (int j = 0; j < NV; j++) {
                const int tt = j * TPW + gi;
                const unsigned o = __shfl_sync(0xffffffffu, off, tt);
                if (c * 32 + tt < L)
                    vraw[j] = *reinterpret_cast<const vraw_t *>(a.v_cache + o + d0);
                else
                    vraw[j] = vraw_t{};
            }
        }
        if (tok < L) {
            const uint16_t *kr = a.k_cache + off;
            /* Two partial sums per head (even and odd 8-element groups) halve the FMA chain. */
            float s2[ATT_MAXG];
#pragma unroll
            for (int h = 0; h < ATT_MAXG; h++) s2[h] = 0.f;
#pragma unroll
            for (int d8 = 0; d8 < D / 8; d8++) {
                const uint4 kv = *reinterpret_cast<const uint4 *>(kr + d8 * 8);
                const float k0 = bf_lo(kv.x), k1 = bf_hi(kv.x), k2 = bf_lo(kv.y), k3 = bf_hi(kv.y);
                const float k4 = bf_lo(kv.z), k5 = bf_hi(kv.z), k6 = bf_lo(kv.w), k7 = bf_hi(kv.w);
#pragma unroll
                for (int h = 0; h < ATT_MAXG; h++) {
                    if (h >= G) break;
                    const float4 qa = *reinterpret_cast<const float4 *>(&qs[h][d8 * 8]);
                    const float4 qb = *reinterpret_cast<const float4 *>(&qs[h][d8 * 8 + 4]);
                    float v = (d8 & 1) ? s2[h] : s[h];
                    v = fmaf(qa.x, k0, v);
                    v = fmaf(qa.y, k1, v);
                    v = fmaf(qa.z, k2, v);
                    v = fmaf(qa.w, k3, v);
                    v = fmaf(qb.x, k4, v);
                    v = fmaf(qb.y, k5, v);
                    v = fmaf(qb.z, k6, v);
                    v = fmaf(qb.w, k7, v);
                    if (d8 & 1)
                        s2[h] = v;
                    else
                        s[h] = v;
                }
            }
#pragma unroll
            for (int h = 0; h < ATT_MAXG; h++) s[h] = (s[h] + s2[h]) * a.scale;
        } else {
#pragma unroll
            for (int h = 0; h < ATT_MAXG; h++) s[h] = -INFINITY;
        }
#pragma unroll
        for (int h = 0; h < ATT_MAXG; h++) {
            if (h >= G) break;
            const float mn = fmaxf(m[h], warp_max(s[h]));
            const float alpha = expf(m[h] - mn);
            const float p = expf(s[h] - mn);
            l[h] = l[h] * alpha + warp_sum(p);
            m[h] = mn;
#pragma unroll
            for (int i = 0; i < DPL; i++) acc[h][i] *= alpha;
            ps[warp][h][lane] = p;
        }
        __syncwarp();
        /* p.V: lanes are dims; the V row offsets come from the lanes that own the positions, and
         * PB rows are loaded before any is used (no dependent loads in the loop). */
        const int cn = min(32, L - c * 32);
        if (VPRE) {
#pragma unroll
            for (int j = 0; j < NV; j++) {
                const int tt = j * TPW + gi;
                if (tt >= cn) continue;
                float v[DPL];
                if constexpr (DPL == 2) {
                    v[0] = bf_lo(vraw[j]);
                    v[1] = bf_hi(vraw[j]);
                } else if constexpr (DPL == 4) {
                    v[0] = bf_lo(vraw[j].x);
                    v[1] = bf_hi(vraw[j].x);
                    v[2] = bf_lo(vraw[j].y);
                    v[3] = bf_hi(vraw[j].y);
                }
#pragma unroll
                for (int h = 0; h < ATT_MAXG; h++) {
                    if (h >= G) break;
                    const float p = ps[warp][h][tt];
#pragma unroll
                    for (int i = 0; i < DPL; i++) acc[h][i] = fmaf(p, v[i], acc[h][i]);
                }
            }
        }
        constexpr int PB = 8;
#pragma unroll
        for (int base = 0; base < (VPRE ? 0 : 32); base += TPW * PB) {
            float v[PB][DPL];
#pragma unroll
            for (int j = 0; j < PB; j++) {
                const int tt = base + j * TPW + gi;
                const unsigned o = __shfl_sync(0xffffffffu, off, tt & 31);
                const uint16_t *vr = a.v_cache + o + d0;
                if (tt < cn) {
                    if (DPL == 2) {
                        const uint32_t q = *reinterpret_cast<const uint32_t *>(vr);
                        v[j][0] = bf_lo(q);
                        v[j][1 % DPL] = bf_hi(q);
                    } else if (DPL == 4) {
                        const uint2 q = *reinterpret_cast<const uint2 *>(vr);
                        v[j][0] = bf_lo(q.x);
                        v[j][1] = bf_hi(q.x);
                        v[j][2 % DPL] = bf_lo(q.y);
                        v[j][3 % DPL] = bf_hi(q.y);
                    } else {
#pragma unroll
                        for (int i = 0; i < DPL; i += 8) {
                            const uint4 q = *reinterpret_cast<const uint4 *>(vr + i);
                            v[j][i] = bf_lo(q.x);
                            v[j][(i + 1) % DPL] = bf_hi(q.x);
                            v[j][(i + 2) % DPL] = bf_lo(q.y);
                            v[j][(i + 3) % DPL] = bf_hi(q.y);
                            v[j][(i + 4) % DPL] = bf_lo(q.z);
                            v[j][(i + 5) % DPL] = bf_hi(q.z);
                            v[j][(i + 6) % DPL] = bf_lo(q.w);
                            v[j][(i + 7) % DPL] = bf_hi(q.w);
                        }
                    }
                } else {
#pragma unroll
                    for (int i = 0; i < DPL; i++) v[j][i] = 0.f;
                }
            }
#pragma unroll
            for (int j = 0; j < PB; j++) {
                const int tt = base + j * TPW + gi;
                if (tt >= cn) continue;
#pragma unroll
                for (int h = 0; h < ATT_MAXG; h++) {
                    if (h >= G) break;
                    const float p = ps[warp][h][tt];
#pragma unroll
                    for (int i = 0; i < DPL; i++) acc[h][i] = fmaf(p, v[j][i], acc[h][i]);
                }
            }
        }
        __syncwarp();
    }
    /* Merge the token groups of the warp (same max and sum: both are warp-wide). */
#pragma unroll
    for (int o = LPT; o < 32; o <<= 1)
#pragma unroll
        for (int h = 0; h < ATT_MAXG; h++)
#pragma unroll
            for (int i = 0; i < DPL; i++) acc[h][i] += __shfl_xor_sync(0xffffffffu, acc[h][i], o);
    if (lane < LPT) {
#pragma unroll
        for (int h = 0; h < ATT_MAXG; h++) {
            if (h >= G) break;
#pragma unroll
            for (int i = 0; i < DPL; i++) wacc[warp][h][d0 + i] = acc[h][i];
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int h = 0; h < ATT_MAXG; h++) {
            if (h >= G) break;
            wm[warp][h] = m[h];
            wl[warp][h] = l[h];
        }
    }
    __syncthreads();
    attn_merge_warps(a, wm, wl, wacc, t, g, G, Q, (int)blockDim.x);
}

/* Decode attention at small batch: one block per (KV head, token, split). */
template <int D, int GM>
__global__ void __launch_bounds__(DEC_THREADS, 1) k_attn_dec(const lm_cuda_attn a) {
    pdl_trigger(); /* the next kernel may launch now; it waits for this one */
    attn_dec_run<D, GM>(a, blockIdx.x, blockIdx.y, blockIdx.z, gridDim.z, [] { pdl_wait(); },
                        [] { __syncthreads(); });
}

} // namespace

static lm_status check_attn(const struct lm_cuda_attn *a) {
    const int D = a->head_dim;
    if (D != 16 && D != 32 && D != 64 && D != 128 && D != 256)
        return lm_errorf(LM_ERR_SHAPE, "CUDA attention: head_dim %d is not 16, 32, 64, 128 or 256", D);
    if (a->n_kv_heads < 1 || a->n_heads % a->n_kv_heads || a->n_heads / a->n_kv_heads > ATT_MAXG)
        return lm_errorf(LM_ERR_SHAPE,
                         "CUDA attention: %d query heads over %d KV heads (groups of 1 to %d)",
                         a->n_heads, a->n_kv_heads, ATT_MAXG);
    if (a->block_size < 1) return lm_errorf(LM_ERR_SHAPE, "CUDA attention: block size %d", a->block_size);
    return LM_OK;
}

extern "C" lm_status lm_cuda_qk_norm_rope_store(struct lm_cuda_ctx *c, const struct lm_cuda_attn *a,
                                                int n) {
    lm_status rc = check_attn(a);
    if (rc || n < 1) return rc;
    cudaError_t e;
    switch (a->head_dim) {
    case 16: e = lm_launch(c, dim3(n), dim3(128), 0, k_qk_norm_rope_store<16>, *a); break;
    case 32: e = lm_launch(c, dim3(n), dim3(128), 0, k_qk_norm_rope_store<32>, *a); break;
    case 64: e = lm_launch(c, dim3(n), dim3(128), 0, k_qk_norm_rope_store<64>, *a); break;
    case 128: e = lm_launch(c, dim3(n), dim3(128), 0, k_qk_norm_rope_store<128>, *a); break;
    default: e = lm_launch(c, dim3(n), dim3(128), 0, k_qk_norm_rope_store<256>, *a); break;
    }
    LM_CU(e);
    return LM_OK;
}

template <int D, int GM>
static cudaError_t launch_attention_g(const lm_cuda_ctx *c, const lm_cuda_attn &a, int n, bool fused) {
    const dim3 grid(a.n_kv_heads, n), block(ATT_WARPS * 32);
    /* Decode launches that fit the GPU in one wave: the 8-warp kernel (v7). */
    if constexpr (GM * D <= 1024)
        if (fused && c->attn_dec) {
            auto fn = k_attn_dec<D, GM>;
            if ((long)a.n_kv_heads * n <= (long)lm_cuda_occupancy((const void *)fn, DEC_THREADS, 0) * c->sm_count) {
                if (a.n_splits <= 1 || !a.split_part || !a.split_count)
                    return lm_launch(c, grid, dim3(DEC_THREADS), 0, fn, a);
                constexpr int RP = DecShape<D, GM>::RP;
                lm_cuda_attn as = a;
                as.split_len = (a.split_len < 1 ? 1 : a.split_len + RP - 1) / RP * RP;
                return lm_launch(c, dim3(a.n_kv_heads, n, a.n_splits), dim3(DEC_THREADS), 0, fn, as);
            }
        }
    /* V prefetch when the launch is too small to fill the GPU (latency-bound: decode at small
     * batch) and the slices fit in registers (D <= 128); otherwise occupancy matters more. */
    constexpr bool can_pre = AttShape<D>::DPL <= 4;
    if (can_pre && (long)a.n_kv_heads * n <= 4L * c->sm_count)
        return lm_launch(c, grid, block, 0, k_attention<D, GM, can_pre>, a, (int)fused);
    return lm_launch(c, grid, block, 0, k_attention<D, GM, false>, a, (int)fused);
}

template <int D>
static cudaError_t launch_attention(const lm_cuda_ctx *c, const lm_cuda_attn &a, int n, bool fused) {
    const int G = a.n_heads / a.n_kv_heads;
    if (G <= 1) return launch_attention_g<D, 1>(c, a, n, fused);
    if (G <= 2) return launch_attention_g<D, 2>(c, a, n, fused);
    if (G <= 4) return launch_attention_g<D, 4>(c, a, n, fused);
    return launch_attention_g<D, 8>(c, a, n, fused);
}

extern "C" lm_status lm_cuda_attention(struct lm_cuda_ctx *c, const struct lm_cuda_attn *a, int n,
                                       bool fused) {
    lm_status rc = check_attn(a);
    if (rc || n < 1) return rc;
    cudaError_t e;
    switch (a->head_dim) {
    case 16: e = launch_attention<16>(c, *a, n, fused); break;
    case 32: e = launch_attention<32>(c, *a, n, fused); break;
    case 64: e = launch_attention<64>(c, *a, n, fused); break;
    case 128: e = launch_attention<128>(c, *a, n, fused); break;
    default: e = launch_attention<256>(c, *a, n, fused); break;
    }
    LM_CU(e);
    return LM_OK;
}

