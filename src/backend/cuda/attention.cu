/* attention.cu: q/k RMSNorm + RoPE + paged K/V store, and grouped-query attention over a paged
 * bf16 KV cache (cuda.h lm_cuda_qk_norm_rope_store, lm_cuda_attention). */
#include <algorithm>
#include <type_traits>

#include "backend/cuda/common.cuh"

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

__device__ __forceinline__ size_t kv_offset(const lm_cuda_attn &a, int blk, int g, int slot, int D) {
    return (((size_t)blk * a.n_kv_heads + g) * a.block_size + slot) * D;
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

/* The end of both attention kernels: merges the block's NW warps' softmax states (running max
 * wm, sum wl, weighted V sums wacc) of each of its G query heads and writes out row t, heads
 * g * G .. g * G + G - 1 (float32 or bf16). stride: the block's thread count. */
/* Output element d of query head qh of token t (float32 or bf16, as a.out_bf16). */
__device__ __forceinline__ void attn_store(const lm_cuda_attn &a, int t, int qh, int Q, int D, int d, float o) {
    const size_t oi = (size_t)t * Q + (size_t)qh * D + d;
    if (a.out_bf16)
        static_cast<uint16_t *>(a.out)[oi] = f2bf(o);
    else
        static_cast<float *>(a.out)[oi] = o;
}

/* Each of a block's NW warp partials' factor exp(its max - the head's max) (0 for a warp that met
 * no position: max -inf), into wf, and each head's max into wM: computed once by the first NW x GM
 * threads, then a barrier. Every thread of the block calls it. Each value is what every thread
 * computed for itself before (v43): the same bits, and NW exponentials a block instead of NW a
 * thread. */
template <int NW, int GM>
__device__ __forceinline__ void attn_warp_factors(const float (&wm)[NW][GM], int G, float (&wf)[NW][GM],
                                                  float (&wM)[GM]) {
    if (threadIdx.x < NW * GM) {
        const int w = threadIdx.x / GM, h = threadIdx.x % GM;
        float mx = -INFINITY;
#pragma unroll
        for (int w2 = 0; w2 < NW; w2++) mx = fmaxf(mx, wm[w2][h]);
        wf[w][h] = h < G && wm[w][h] != -INFINITY ? expf(wm[w][h] - mx) : 0.f;
        if (w == 0) wM[h] = mx;
    }
    __syncthreads();
}

/* Head h, dim d of a block's NW warp partials merged (attn_warp_factors' wf): *num the weighted V
 * sum, *den the sum of exponentials, both relative to the head's max, in warp order. */
template <int NW, int GM, int D>
__device__ __forceinline__ void attn_warp_sums(const float (&wf)[NW][GM], const float (&wl)[NW][GM],
                                               const float (&wacc)[NW][GM][D], int h, int d, float *num,
                                               float *den) {
    float nu = 0.f, de = 0.f;
#pragma unroll
    for (int w = 0; w < NW; w++) {
        nu = fmaf(wacc[w][h][d], wf[w][h], nu);
        de = fmaf(wl[w][h], wf[w][h], de);
    }
    *num = nu, *den = de;
}

template <int NW, int GM, int D>
__device__ __forceinline__ void attn_merge_warps(const lm_cuda_attn &a, const float (&wm)[NW][GM],
                                                 const float (&wl)[NW][GM], const float (&wacc)[NW][GM][D],
                                                 int t, int g, int G, int Q, int stride) {
    __shared__ float wf[NW][GM], wM[GM];
    attn_warp_factors(wm, G, wf, wM);
    for (int i = threadIdx.x; i < G * D; i += stride) {
        const int h = i / D, d = i % D;
        float num, den;
        attn_warp_sums(wf, wl, wacc, h, d, &num, &den);
        attn_store(a, t, g * G + h, Q, D, d, num / den);
    }
}

/* The end of a split-KV block (split z of nused > 1 in use of token t's KV head g; scratch row
 * slot, with room for nz splits a (row, KV head)): this block's
 * (max, sum, weighted V sum) per head to the scratch; the last block of the token's KV head to
 * finish merges the splits in order 0 .. nused - 1 (Dao et al. 2023, flash-decoding), so the
 * result does not depend on which block finishes last. stride: the block's thread count. */
template <int NW, int GM, int D>
__device__ __forceinline__ void attn_split_merge(const lm_cuda_attn &a, const float (&wm)[NW][GM],
                                                 const float (&wl)[NW][GM], const float (&wacc)[NW][GM][D],
                                                 int t, int slot, int g, int G, int Q, int z, int nz, int nused,
                                                 int nthreads) {
    const int stride = G * (D + 2);
    float *part = a.split_part + (size_t)(slot * a.n_kv_heads + g) * nz * stride;
    __shared__ float wf[NW][GM], wM[GM];
    attn_warp_factors(wm, G, wf, wM);
    for (int i = threadIdx.x; i < G * D; i += nthreads) {
        const int h = i / D, d = i % D;
        float num, den;
        attn_warp_sums(wf, wl, wacc, h, d, &num, &den);
        float *ps = part + (size_t)z * stride;
        ps[h * D + d] = num;
        if (d == 0) ps[G * D + h] = wM[h], ps[G * D + G + h] = den;
    }
    /* The block's partials are published by thread 0's release after the barrier (cumulative over
     * what the barrier ordered before it: CUTLASS's semaphore arrive), and the last block's reads
     * are ordered after its acquire by the second barrier; a fence.sc by every thread
     * (__threadfence, MEMBAR.SC.GPU in the SASS) before and after was the old form. */
    __syncthreads();
    __shared__ int last;
    if (threadIdx.x == 0) {
        unsigned *cnt = a.split_count + slot * a.n_kv_heads + g, prev;
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(prev) : "l"(cnt) : "memory");
        last = prev == (unsigned)nused - 1;
        if (last) *cnt = 0; /* every other split has arrived: ready for the next launch */
    }
    __syncthreads();
    if (!last) return;
    for (int i = threadIdx.x; i < G * D; i += nthreads) {
        const int h = i / D, d = i % D;
        float M = -INFINITY;
        for (int q = 0; q < nused; q++) M = fmaxf(M, __ldcg(part + (size_t)q * stride + G * D + h));
        float num = 0.f, den = 0.f;
        for (int q = 0; q < nused; q++) {
            const float *ps = part + (size_t)q * stride;
            const float mq = __ldcg(ps + G * D + h);
            const float f = mq == -INFINITY ? 0.f : expf(mq - M);
            num = fmaf(__ldcg(ps + h * D + d), f, num);
            den = fmaf(__ldcg(ps + G * D + G + h), f, den);
        }
        attn_store(a, t, g * G + h, Q, D, d, num / den);
    }
}

/* k_attention's shared memory: the group's rotated queries, a warp's probabilities, and the warps'
 * softmax states for the merge. */
template <int D, int GM>
struct AttSmem {
    __align__(16) float qs[GM][D];
    float ps[ATT_WARPS][GM][32];
    float wm[ATT_WARPS][GM], wl[ATT_WARPS][GM];
    float wacc[ATT_WARPS][GM][D];
};

/* Positions [p0, p1) of token t's context for KV head g (p1 < 0: up to its own position; split z
 * of nused, merged through scratch row slot's a.n_splits splits a KV head; nused 1: the whole
 * context, written out directly), after the wait. */
template <int D, int GM, bool VPRE>
__device__ __forceinline__ void att_range(const lm_cuda_attn &a, int FUSED, AttSmem<D, GM> &sm, int g, int t,
                                          int p0, int p1, int z, int nused, int slot) {
    using S = AttShape<D>;
    constexpr int DPL = S::DPL, LPT = S::LPT;
    constexpr int TPW = S::TPW;
    constexpr int ATT_MAXG = GM;
    auto &qs = sm.qs;
    auto &ps = sm.ps;
    auto &wm = sm.wm;
    auto &wl = sm.wl;
    auto &wacc = sm.wacc;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int G = a.n_heads / a.n_kv_heads, BS = a.block_size;
    const int pos = a.pos[t], L = pos + 1;
    if (p1 < 0) p1 = L;
    const bool own = p1 == L; /* this block holds the new token: it writes its K/V */
    const int seq = a.seq[t];
    const int32_t *bt = a.block_tables + (size_t)seq * a.bt_width;
    const float *row = a.qkv + (size_t)t * a.ld_qkv;
    const int Q = a.n_heads * D, KV = a.n_kv_heads * D;
    /* This warp's first chunk: its block-table lookups, and an L1 prefetch of its K and V rows,
     * issued before the fused phase so that they overlap it (position pos is written below and
     * read after the barrier). */
    const int tok0 = p0 + warp * 32 + lane;
    unsigned off0 = 0;
    if (tok0 < p1) {
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
            else if (own)
                norm_rope_warp<D>(row + Q + g * D, a.k_norm, a.inv_freq, pos, a.eps, nullptr,
                                  a.k_cache + off, lane);
        }
        if (own)
            for (int d = threadIdx.x; d < D; d += blockDim.x) a.v_cache[off + d] = f2bf(row[Q + KV + g * D + d]);
    } else {
        for (int i = threadIdx.x; i < G * D; i += blockDim.x) qs[i / D][i % D] = row[g * G * D + i];
    }
    __syncthreads();

    const int nchunk = (p1 - p0 + 31) >> 5;
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
        const int c0 = p0 + c * 32, tok = c0 + lane;
        float s[ATT_MAXG];
#pragma unroll
        for (int h = 0; h < ATT_MAXG; h++) s[h] = 0.f;
        /* This lane's position: its K row and, at the same offset, its V row. */
        unsigned off = 0; /* elements into this layer's pool (< 2^32: checked at model creation) */
        if (tok < p1) off = c == warp ? off0 : (unsigned)kv_offset(a, bt[tok / BS], g, tok % BS, D);
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
                if (c0 + tt < p1)
                    vraw[j] = *reinterpret_cast<const vraw_t *>(a.v_cache + o + d0);
                else
                    vraw[j] = vraw_t{};
            }
        }
        if (tok < p1) {
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
        const int cn = min(32, p1 - c0);
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
    if (nused == 1)
        attn_merge_warps(a, wm, wl, wacc, t, g, G, Q, (int)blockDim.x);
    else
        attn_split_merge(a, wm, wl, wacc, t, slot, g, G, Q, z, a.n_splits, nused, (int)blockDim.x);
}

/* One block per (KV head, token), or, with a work list (a.work: FUSED decode's, or the tokens a
 * non-fused launch's tiles leave), per (KV head, item) (blocks past the item count return). Phase 0
 * (FUSED): normalise/rotate this token's query heads of the group into shared memory and write
 * its K/V (the block holding the token's position). Then each warp takes chunks of 32 positions:
 * lane = position for q.k (scores for all the group's heads at once), an online-softmax update,
 * then lanes = dims for p.V. Warps' partial (max, sum, acc) are merged at the end, and splits
 * through the scratch (attn_split_merge). GM: the group size rounded up (1, 2, 4 or 8: registers
 * and shared memory scale with it). VPRE: prefetch each chunk's V slices with its K rows (fewer
 * round trips, more registers: for launches too small to fill the GPU). */
template <int D, int GM, bool VPRE>
__global__ void __launch_bounds__(ATT_WARPS * 32) k_attention(const lm_cuda_attn a, int FUSED) {
    __shared__ AttSmem<D, GM> sm;
    const int g = blockIdx.x;
    pdl_trigger(); /* the next kernel may launch now; it waits for this one */
    /* One place calls att_range (inlined: a second copy would cost registers in both). */
    int t = blockIdx.y, p0 = 0, p1 = -1, z = 0, nused = 1, slot = t; /* p1 -1: up to its own position */
    if (a.work) {
        /* Item blockIdx.y of the list, if there is one (the step's inputs, the list among them,
         * were copied before its first kernel, so it can be read before the wait). A non-fused
         * launch's list holds the tokens its tiles leave (lm_cuda_attn_plan_tiles). */
        if ((int)blockIdx.y >= a.work[0]) return;
        const int32_t *w = a.work + LM_CUDA_WORK_HEAD + LM_CUDA_WORK_ITEM * blockIdx.y;
        t = w[0], p0 = w[1], p1 = w[2], z = (w[3] >> 8) & 255, nused = w[3] & 255, slot = w[3] >> 16;
    }
    pdl_wait();
    att_range<D, GM, VPRE>(a, FUSED, sm, g, t, p0, p1, z, nused, slot);
}

/* ---- prefill attention on tensor cores (flash attention) ----
 *
 * FlashAttention-2 (Dao 2023) over the paged cache, for a non-fused launch's tiles of consecutive
 * tokens of one sequence (lm_cuda_attn_plan_tiles). A block takes one tile and one KV head: 64
 * query rows, row r = token r / GM of the tile, query head r % GM of the group (rows past the
 * tile's tokens or the group's heads are computed from a valid row and not stored). It walks the
 * sequence's positions [0, last token's position] in tiles of 64 positions, K and V rows copied
 * into shared memory (cp.async, two stages) from the pages of the block table. Its 8 warps are two
 * groups of 4, group z taking the position tiles of index z, z + 2, ... (absolute: a row's split
 * does not depend on its tile), merged at the end, so that a launch of few tiles (a 512-token
 * chunk: 16 tiles a KV head) still has 8 warps a multiprocessor. In a group each warp owns 16
 * rows: S = Q K^T with mma.sync m16n8k16 (bf16 in, float32 accumulate), the causal
 * mask (position > the row's token position), an online softmax in the log2 domain, then
 * O += P V with P rounded to bf16. q arrives float32 (normalised and rotated by
 * lm_cuda_qk_norm_rope_store) and is split into bf16 hi + lo parts, both multiplied by K, so the
 * scores lose no more than K's own bf16 rounding (scripts/flash-precision.c, this arithmetic on
 * the test's inputs: one part alone gives 4.1e-3 relative error against float64, over the
 * test's 4e-3 bound; hi + lo 2.7e-3, mostly P's and the output's rounding). A row's result depends only on its own inputs and the
 * position tiles (aligned to 0): tiles of positions past a row's own add exact zeros, so a token
 * gets the same bits in any tile of this kernel (tokens the planner leaves to k_attention, runs
 * under its min_tokens, round differently). */

/* Two groups of 4 warps: each group holds all 64 rows and takes every other position tile. */
constexpr int FA_ROWS = 64, FA_COLS = 64, FA_GROUPS = 2, FA_WARPS = 4 * FA_GROUPS;

/* Shared memory of k_attn_prefill<D>: q hi and lo [64][D + 8] bf16, then per group K and V
 * [2 stages][64][D + 8] (the 8-element pad puts the 8 rows of an ldmatrix on distinct banks). */
template <int D>
constexpr size_t fa_smem() {
    return sizeof(uint16_t) * (size_t)FA_ROWS * (D + 8) * (2 + 4 * FA_GROUPS);
}

/* The head sizes k_attn_prefill is built for (D / 16 k-steps of q.k; its registers hold D / 8
 * output n-tiles, too many at 256). */
template <int D>
constexpr bool fa_shape_ok() {
    return D >= 16 && D <= 128;
}

__device__ __forceinline__ unsigned pack_bf2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const unsigned *>(&v);
}

template <int D, int GM>
__global__ void __launch_bounds__(FA_WARPS * 32, 1) k_attn_prefill(const lm_cuda_attn a) {
    constexpr int SD = D + 8, KS = D / 16, NO = D / 8, CH = D / 8, GT = 128; /* NO n-tiles, CH 16-byte chunks */
    extern __shared__ __align__(16) uint16_t fa_sm[];
    const int g = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = (tid >> 5) & 3, grp = tid >> 7;
    const int gid = lane >> 2, tig = lane & 3, gtid = tid & (GT - 1);
    /* This group's stages; the group's own barrier (ids 1 and 2: 0 is __syncthreads). */
    uint16_t *qh = fa_sm, *ql = qh + FA_ROWS * SD;
    uint16_t *ks = ql + FA_ROWS * SD + grp * 4 * FA_COLS * SD, *vs = ks + 2 * FA_COLS * SD;
    auto group_sync = [&] { /* constant ids: a register id makes ptxas reserve all 16 barriers */
        if (grp)
            asm volatile("bar.sync 2, %0;" ::"n"(GT) : "memory");
        else
            asm volatile("bar.sync 1, %0;" ::"n"(GT) : "memory");
    };
    pdl_trigger();
    /* The tile list, seq, pos and block tables are the step's inputs (copied before its first
     * kernel): read before the wait; q and the cache are written by the preceding kernel. */
    const int32_t *tile = a.tiles + LM_CUDA_WORK_HEAD + LM_CUDA_WORK_ITEM * blockIdx.y;
    const int t0 = tile[0], cnt = tile[1];
    const int pos0 = a.pos[t0], kv_end = pos0 + cnt; /* positions [0, kv_end) */
    const int32_t *bt = a.block_tables + (size_t)a.seq[t0] * a.bt_width;
    const int G = a.n_heads / a.n_kv_heads, BS = a.block_size, Q = a.n_heads * D;

    /* K/V rows of positions [kb * 64, kb * 64 + 64) into stage st; past kv_end zeros (so that
     * P = 0 there multiplies zeros, never a stale NaN). */
    auto load_kv = [&](int kb, int st) {
        uint16_t *kd = ks + st * FA_COLS * SD, *vd = vs + st * FA_COLS * SD;
        for (int i = gtid; i < FA_COLS * CH; i += GT) {
            const int r = i / CH, c = i % CH, p = kb * FA_COLS + r;
            const bool in = p < kv_end;
            const size_t off = in ? kv_offset(a, bt[p / BS], g, p % BS, D) + c * 8 : 0;
            cp_async16(kd + r * SD + c * 8, a.k_cache + off, !in);
            cp_async16(vd + r * SD + c * 8, a.v_cache + off, !in);
        }
        cp_async_commit();
    };
    pdl_wait();
    const int nkb = (kv_end + FA_COLS - 1) / FA_COLS, my_n = (nkb - grp + 1) / 2; /* tiles grp, grp + 2, .. */
    if (my_n > 0) load_kv(grp, 0);
    /* q hi / lo into shared memory, then this warp's 16 rows into registers (A fragments). */
    for (int i = tid; i < FA_ROWS * (D / 4); i += FA_WARPS * 32) {
        const int r = i / (D / 4), c = (i % (D / 4)) * 4;
        const int tok = min(r / GM, cnt - 1), h = min(r % GM, G - 1);
        const float4 x = *reinterpret_cast<const float4 *>(a.qkv + (size_t)(t0 + tok) * a.ld_qkv +
                                                          (size_t)(g * G + h) * D + c);
        const float xs[4] = {x.x, x.y, x.z, x.w};
        uint16_t hb[4], lb[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            hb[j] = f2bf(xs[j]);
            lb[j] = f2bf(xs[j] - bf2f(hb[j]));
        }
        *reinterpret_cast<uint2 *>(qh + r * SD + c) = make_uint2(hb[0] | (unsigned)hb[1] << 16, hb[2] | (unsigned)hb[3] << 16);
        *reinterpret_cast<uint2 *>(ql + r * SD + c) = make_uint2(lb[0] | (unsigned)lb[1] << 16, lb[2] | (unsigned)lb[3] << 16);
    }
    __syncthreads();
    unsigned qa[KS][4], qb[KS][4];
    {
        const int r = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, c = (lane >> 4) * 8;
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
            ldsm_x4(qa[kk], qh + r * SD + kk * 16 + c);
            ldsm_x4(qb[kk], ql + r * SD + kk * 16 + c);
        }
    }
    /* This thread's two rows (gid and gid + 8 of the warp's 16) and their token positions. */
    const int ra = warp * 16 + gid, rb = ra + 8;
    const int pa = pos0 + min(ra / GM, cnt - 1), pb = pos0 + min(rb / GM, cnt - 1);
    const int pw = pos0 + min((warp * 16 + 15) / GM, cnt - 1); /* the warp's last row's position */
    const float sl2 = a.scale * 1.4426950408889634f;
    float o[NO][4], ma = -INFINITY, mb = -INFINITY, la = 0.f, lb = 0.f;
#pragma unroll
    for (int n = 0; n < NO; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

    for (int i = 0; i < my_n; i++) {
        const int kb = grp + 2 * i;
        if (i + 1 < my_n) {
            load_kv(kb + 2, (i + 1) & 1);
            cp_async_wait_pending(1);
        } else {
            cp_async_wait_pending(0);
        }
        group_sync();
        const uint16_t *kt = ks + (i & 1) * FA_COLS * SD, *vt = vs + (i & 1) * FA_COLS * SD;
        const int c0 = kb * FA_COLS;
        if (c0 <= pw) { /* else every row of this warp masks the whole tile: it adds exact zeros */
            float s[FA_COLS / 8][4];
#pragma unroll
            for (int j = 0; j < FA_COLS / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
            /* S = (q hi + q lo) K^T: ldmatrix of K rows (positions) gives the col-major B. */
#pragma unroll
            for (int kk = 0; kk < KS; kk++)
#pragma unroll
                for (int j = 0; j < FA_COLS / 8; j += 2) {
                    unsigned b[4];
                    const int mi = lane >> 3;
                    ldsm_x4(b, kt + ((j + (mi >> 1)) * 8 + (lane & 7)) * SD + kk * 16 + (mi & 1) * 8);
                    mma_bf16(s[j], qa[kk], b[0], b[1]);
                    mma_bf16(s[j + 1], qa[kk], b[2], b[3]);
                    mma_bf16(s[j], qb[kk], b[0], b[1]);
                    mma_bf16(s[j + 1], qb[kk], b[2], b[3]);
                }
            /* Mask, scale to log2 units, and the rows' new maxima (a quad of lanes holds a row). */
            float xa = -INFINITY, xb = -INFINITY;
#pragma unroll
            for (int j = 0; j < FA_COLS / 8; j++) {
                const int p = c0 + j * 8 + tig * 2;
                s[j][0] = p <= pa ? s[j][0] * sl2 : -INFINITY;
                s[j][1] = p + 1 <= pa ? s[j][1] * sl2 : -INFINITY;
                s[j][2] = p <= pb ? s[j][2] * sl2 : -INFINITY;
                s[j][3] = p + 1 <= pb ? s[j][3] * sl2 : -INFINITY;
                xa = fmaxf(xa, fmaxf(s[j][0], s[j][1]));
                xb = fmaxf(xb, fmaxf(s[j][2], s[j][3]));
            }
#pragma unroll
            for (int x = 1; x < 4; x <<= 1) {
                xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, x));
                xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, x));
            }
            /* A row's maximum stays -inf while every position it met was masked (group 1's first
             * tiles for early rows): subtract 0 then, so that exp2 gives 0, not NaN. Group 0's
             * first tile holds position 0: its maxima are finite from then on. */
            const float na = fmaxf(ma, xa), nb = fmaxf(mb, xb);
            const float za = na == -INFINITY ? 0.f : na, zb = nb == -INFINITY ? 0.f : nb;
            const float aa = exp2f(ma - za), ab = exp2f(mb - zb);
            ma = na, mb = nb;
            la *= aa, lb *= ab;
#pragma unroll
            for (int n = 0; n < NO; n++) o[n][0] *= aa, o[n][1] *= aa, o[n][2] *= ab, o[n][3] *= ab;
#pragma unroll
            for (int j = 0; j < FA_COLS / 8; j++) {
                s[j][0] = exp2f(s[j][0] - za), s[j][1] = exp2f(s[j][1] - za);
                s[j][2] = exp2f(s[j][2] - zb), s[j][3] = exp2f(s[j][3] - zb);
                la += s[j][0] + s[j][1], lb += s[j][2] + s[j][3];
            }
            /* O += P V: S's accumulator layout is the A fragment of P (two n-tiles a k-step);
             * V rows are positions, so the transposing ldmatrix gives the col-major B. */
#pragma unroll
            for (int kk = 0; kk < FA_COLS / 16; kk++) {
                const unsigned pf[4] = {pack_bf2(s[2 * kk][0], s[2 * kk][1]), pack_bf2(s[2 * kk][2], s[2 * kk][3]),
                                        pack_bf2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                        pack_bf2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
                for (int n = 0; n < NO; n += 2) {
                    unsigned b[4];
                    const int mi = lane >> 3;
                    ldsm_x4_t(b, vt + (kk * 16 + (mi & 1) * 8 + (lane & 7)) * SD + (n + (mi >> 1)) * 8);
                    mma_bf16(o[n], pf, b[0], b[1]);
                    mma_bf16(o[n + 1], pf, b[2], b[3]);
                }
            }
        }
        group_sync(); /* the stage is refilled by the next iteration's copy */
    }
    /* Group 1 hands its state to the same thread of group 0 (same rows, same fragment layout)
     * through its own stages, free now; group 0 merges in group order: a group that met no
     * unmasked position (max -inf, sums 0) adds exact zeros. */
    float *part = reinterpret_cast<float *>(ql + FA_ROWS * SD + 4 * FA_COLS * SD);
    if (grp == 1) {
#pragma unroll
        for (int n = 0; n < NO; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) part[(n * 4 + e) * GT + gtid] = o[n][e];
        part[(NO * 4 + 0) * GT + gtid] = ma, part[(NO * 4 + 1) * GT + gtid] = mb;
        part[(NO * 4 + 2) * GT + gtid] = la, part[(NO * 4 + 3) * GT + gtid] = lb;
    }
    __syncthreads();
    if (grp == 1) return;
    {
        const float ma1 = part[(NO * 4 + 0) * GT + gtid], mb1 = part[(NO * 4 + 1) * GT + gtid];
        const float Ma = fmaxf(ma, ma1), Mb = fmaxf(mb, mb1);
        const float fa0 = exp2f(ma - Ma), fa1 = exp2f(ma1 - Ma), fb0 = exp2f(mb - Mb), fb1 = exp2f(mb1 - Mb);
        la = __fadd_rn(__fmul_rn(la, fa0), __fmul_rn(part[(NO * 4 + 2) * GT + gtid], fa1));
        lb = __fadd_rn(__fmul_rn(lb, fb0), __fmul_rn(part[(NO * 4 + 3) * GT + gtid], fb1));
#pragma unroll
        for (int n = 0; n < NO; n++) {
            o[n][0] = __fadd_rn(__fmul_rn(o[n][0], fa0), __fmul_rn(part[(n * 4 + 0) * GT + gtid], fa1));
            o[n][1] = __fadd_rn(__fmul_rn(o[n][1], fa0), __fmul_rn(part[(n * 4 + 1) * GT + gtid], fa1));
            o[n][2] = __fadd_rn(__fmul_rn(o[n][2], fb0), __fmul_rn(part[(n * 4 + 2) * GT + gtid], fb1));
            o[n][3] = __fadd_rn(__fmul_rn(o[n][3], fb0), __fmul_rn(part[(n * 4 + 3) * GT + gtid], fb1));
        }
    }
    /* The rows' sums over their quads, then out = O / l for the rows that are real. */
#pragma unroll
    for (int x = 1; x < 4; x <<= 1) {
        la += __shfl_xor_sync(0xffffffffu, la, x);
        lb += __shfl_xor_sync(0xffffffffu, lb, x);
    }
    const float ia = 1.0f / la, ib = 1.0f / lb;
    const bool wa = ra / GM < cnt && ra % GM < G, wb = rb / GM < cnt && rb % GM < G;
    uint16_t *out = static_cast<uint16_t *>(a.out);
    uint16_t *oa = out + (size_t)(t0 + ra / GM) * Q + (size_t)(g * G + ra % GM) * D;
    uint16_t *ob = out + (size_t)(t0 + rb / GM) * Q + (size_t)(g * G + rb % GM) * D;
#pragma unroll
    for (int n = 0; n < NO; n++) {
        const int d = n * 8 + tig * 2;
        /* + 0: a -0 sum and the +0 a masked tile's zeros make of it store the same bits */
        if (wa)
            *reinterpret_cast<unsigned *>(oa + d) =
                pack_bf2(__fadd_rn(o[n][0] * ia, 0.f), __fadd_rn(o[n][1] * ia, 0.f));
        if (wb)
            *reinterpret_cast<unsigned *>(ob + d) =
                pack_bf2(__fadd_rn(o[n][2] * ib, 0.f), __fadd_rn(o[n][3] * ib, 0.f));
    }
}

/* ---- decode attention (v7; batched shape v21) ----
 *
 * For launches too small to fill the GPU (decode at batch 1..~60: one block per (KV head, token),
 * 8 to 500 blocks), where k_attention's time is one warp's chain of ~800 dependent instructions.
 * Here a block has 8 warps; each position is shared by LP = D / 16 lanes (16 dims a lane: two
 * 16-byte K loads and two V loads), so a q.k chain is 16 FMAs long plus log2(LP) shuffles; the K
 * and V rows of a round of positions sit in registers. Everything that does not depend on the
 * preceding kernel is done before waiting on it (programmatic dependent launch): the block-table
 * lookups, the K/V loads of the earlier positions (written by earlier steps), and RoPE's sines and
 * cosines. After the wait: this token's q/k norm + RoPE (q to shared memory, k and v to the cache
 * and to shared memory), one barrier, the rounds, one barrier, the merge of the warps.
 * Batched decode past one wave of this shape runs a lighter one (batch_dec: 4 warps, 2 passes a
 * round, 4 blocks a multiprocessor), also from the host's work list. k_attention's lane-a-position
 * K loads touch 32 rows an instruction; here LP lanes share a row, so an instruction touches 4.
 * Where the output is bf16 and D is 32, 64 or 128 the one-wave shape runs its rounds on the tensor
 * cores instead (TC, perf-notes v44): each warp takes 16 positions of a 128-position round, its K
 * rows in registers as mma.sync's A fragments (a permutation of the dims that 16-byte loads give),
 * its V rows copied into shared memory before the wait, q.k against q's bf16 hi and lo parts and
 * p.V with the probabilities rounded to bf16 (k_attn_prefill's arithmetic), an online softmax in
 * log2 units; the warps' partials merge as before. Its cost hardly grows with the positions of a
 * round: at batch 1 the same as the float32 rounds at 32 positions, +2% tok/s at tg128, +4% at 96-127
 * positions (the float32 rounds cost ~0.28 us a layer for each 32 positions past the first).
 */

constexpr int DEC_WARPS = 8, DEC_THREADS = DEC_WARPS * 32;
static_assert(LM_CUDA_DEC_RUN <= 8, "k_attn_dec keeps a run's K/V in 8 shared-memory rows");

/* k_attn_dec's tensor-core rounds (TC): head sizes whose rows split into 4 lanes of whole 16-byte
 * chunks and whose output fits D / 2 registers a lane, groups of up to 8 query heads (the mma's 8
 * columns). */
template <int D, int GM>
__host__ __device__ constexpr bool dec_tc_ok() {
    return (D == 32 || D == 64 || D == 128) && GM <= 8;
}

/* Word i (0..3, a constant after unrolling) of v. */
__device__ __forceinline__ unsigned u4_word(const uint4 &v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/* W warps a block; NPX passes a round (0: by the group size, as v7). The one-wave launch is
 * <DEC_WARPS, 0>; batched decode uses a lighter shape (batch_dec: 4 warps, 2 passes) with several
 * blocks a multiprocessor. */
template <int D, int GM, int W = DEC_WARPS, int NPX = 0>
struct DecShape {
    static constexpr int LP = D / 16;                          /* lanes per position */
    static constexpr int PW = 32 / LP;                         /* positions per warp per pass */
    static constexpr int PP = W * PW;                          /* positions per pass */
    static constexpr int NP = NPX ? NPX : GM <= 2 ? 4 : GM == 4 ? 2 : 1; /* passes a round */
    static constexpr int RP = NP * PP;                         /* positions per round */
};

/* Shared-memory index of element i of a query head: chunk c = i / 8 keeps elements 0-3 at 4c and
 * 4-7 at D/2 + 4c, so lanes reading consecutive chunks' float4s hit consecutive 16-byte slots. */
template <int D>
__device__ __forceinline__ int dec_qslot(int i) {
    return ((i & 4) ? D / 2 : 0) + (i >> 3) * 4 + (i & 3);
}

/* RoPE's cos/sin at position pos for this lane's dims (as norm_rope_warp computes them). */
template <int D>
__device__ __forceinline__ void dec_rope_cs(const float *inv_freq, int pos, int lane, float *c, float *s) {
    constexpr int H = D / 2, PER = (H + 31) / 32;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int j = lane + 32 * i;
        c[i] = 1.f;
        s[i] = 0.f;
        if (j < H) {
            const float ang = __ldg(inv_freq + j) * (float)pos;
            sincosf(ang, &s[i], &c[i]);
        }
    }
}

/* One warp: RoPE(RMSNorm(src) * w) with precomputed cos/sin, to a query head in shared memory
 * (layout dec_qslot; or with q_hi, split into bf16 hi and lo parts at q_hi[i] and q_lo[i], the
 * tensor-core rounds' operands) or to a key row (bf16) in shared memory and, unless k_out is NULL,
 * the cache. */
template <int D>
__device__ __forceinline__ void dec_norm_rope(const float *src, const float *w, const float *c,
                                              const float *s, float eps, int lane, float *q_out,
                                              uint16_t *k_out, uint16_t *k_sm, uint16_t *q_hi = nullptr,
                                              uint16_t *q_lo = nullptr) {
    constexpr int H = D / 2, PER = (H + 31) / 32;
    float x1[PER], x2[PER], w1[PER], w2[PER], ss = 0.f;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int j = lane + 32 * i;
        x1[i] = j < H ? src[j] : 0.f;
        x2[i] = j < H ? src[j + H] : 0.f;
        w1[i] = j < H ? __ldg(w + j) : 0.f;
        w2[i] = j < H ? __ldg(w + j + H) : 0.f;
        ss = fmaf(x1[i], x1[i], ss);
        ss = fmaf(x2[i], x2[i], ss);
    }
    ss = warp_sum(ss);
    const float inv = 1.0f / sqrtf(ss / (float)D + eps);
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int j = lane + 32 * i;
        if (j >= H) continue;
        const float a = w1[i] * (x1[i] * inv), b = w2[i] * (x2[i] * inv);
        const float o1 = a * c[i] - b * s[i], o2 = b * c[i] + a * s[i];
        if (q_hi) {
            const uint16_t h1 = f2bf(o1), h2 = f2bf(o2);
            q_hi[j] = h1, q_hi[j + H] = h2;
            q_lo[j] = f2bf(o1 - bf2f(h1)), q_lo[j + H] = f2bf(o2 - bf2f(h2));
        } else if (q_out) {
            q_out[dec_qslot<D>(j)] = o1;
            q_out[dec_qslot<D>(j + H)] = o2;
        } else {
            const uint16_t u1 = f2bf(o1), u2 = f2bf(o2);
            if (k_out) {
                k_out[j] = u1;
                k_out[j + H] = u2;
            }
            k_sm[j] = u1;
            k_sm[j + H] = u2;
        }
    }
}

/* Halving butterfly over lanes lane ^ O, lane ^ 2 O, .. (< END): N values a lane in v[0, N) become
 * N / 2 sums at each step, the lane with bit O set keeping the upper half. Each sum is own +
 * partner's, as the plain butterfly's (v += shfl_xor(v, O)) is at those values: the same bits, with
 * half the shuffles at each step. */
template <int N, int O, int END>
__device__ __forceinline__ void tr_halve(float *v, int lane) {
    if constexpr (O < END && N >= 2) {
        const bool up = lane & O;
#pragma unroll
        for (int k = 0; k < N / 2; k++) {
            const float lo = v[k], hi = v[N / 2 + k];
            v[k] = (up ? hi : lo) + __shfl_xor_sync(0xffffffffu, up ? lo : hi, O);
        }
        tr_halve<N / 2, O * 2, END>(v, lane);
    }
}

template <int D, int GM, int W, int NPX, bool TC = false>
__global__ void __launch_bounds__(W * 32, NPX == 0 ? 1 : W * NPX * GM <= 16 ? 4 : 2) k_attn_dec(const lm_cuda_attn a) {
    using S = DecShape<D, GM, W, NPX>;
    constexpr int LP = S::LP, PW = S::PW, PP = S::PP, NP = S::NP, RP = S::RP;
    constexpr int PER = (D / 2 + 31) / 32, NT = W * 32;
    static_assert(!TC || (dec_tc_ok<D, GM>() && NPX == 0), "k_attn_dec<TC>: D of 32, 64 or 128, the one-wave shape");
    /* TC: a warp's 16 positions a round on the tensor cores: RT positions a round, the V rows in a
     * tile of shared memory a warp (row stride TSD: the 8 rows of an ldmatrix on distinct banks),
     * which the warps' partials (wacc) reuse at the end. */
    constexpr int TSD = D + 8, RT = 16 * W;
    constexpr size_t WACC_B = sizeof(float) * W * GM * D, VT_B = TC ? sizeof(uint16_t) * W * 16 * TSD : 0;
    __shared__ __align__(16) float qs[GM][D];
    __shared__ __align__(16) uint16_t kn[LM_CUDA_DEC_RUN][D], vn[LM_CUDA_DEC_RUN][D];
    __shared__ float wm[W][GM], wl[W][GM];
    __shared__ __align__(16) unsigned char dec_big[WACC_B > VT_B ? WACC_B : VT_B];
    float(&wacc)[W][GM][D] = *reinterpret_cast<float(*)[W][GM][D]>(dec_big);
    const int g = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int grp = lane / LP, j = lane % LP;
    const int G = a.n_heads / a.n_kv_heads, BS = a.block_size;
    pdl_trigger(); /* the next kernel may launch now; it waits for this one */

    /* Before the wait: the step's inputs (copied before its first kernel, the work list among
     * them), the cache rows of positions < pos0 (written by earlier steps; no kernel of this step
     * writes them), weights. Positions pos0..pos are this step's: the run's earlier tokens are rows
     * t - np .. t - 1, whose K/V this block computes itself from q/k/v (their own blocks write the
     * cache). The block takes positions [p0, p1) of token t: with a work list (batched decode),
     * item blockIdx.y's piece z of nused, merged through scratch row slot (nz = a.n_splits splits
     * a row); else split z of gridDim.z (flash-decoding), of a.split_len positions, the last one
     * up to L, merged through row t. */
    int t = blockIdx.y, z = blockIdx.z, nz = gridDim.z, slot = t, p0 = 0, p1 = -1, nused = 1;
    constexpr bool LIST = NPX != 0; /* the batched shapes take work lists (batch_dec) */
    if (LIST && a.work) {
        if ((int)blockIdx.y >= a.work[0]) return;
        const int32_t *w = a.work + LM_CUDA_WORK_HEAD + LM_CUDA_WORK_ITEM * blockIdx.y;
        t = w[0], p0 = w[1], p1 = w[2], z = (w[3] >> 8) & 255, nused = w[3] & 255, slot = w[3] >> 16;
        nz = a.n_splits;
    }
    const int seq = a.seq[t], pos = a.pos[t], L = pos + 1;
    const int np = a.run_prev ? a.run_prev[t] : 0, pos0 = pos - np;
    if (!(LIST && a.work) && nz > 1) {
        const int SL = a.split_len;
        p0 = z * SL;
        if (p0 >= L) return; /* no position of this token here */
        p1 = z < nz - 1 ? min(L, p0 + SL) : L;
        nused = min(nz, (L + SL - 1) / SL);
    }
    if (p1 < 0) p1 = L;
    const bool own = p1 == L; /* this block holds the new token: it writes its K/V */
    const int lim = min(pos0, p1); /* positions below it come from the cache */
    const int32_t *bt = a.block_tables + (size_t)seq * a.bt_width;
    const size_t off_new = kv_offset(a, bt[pos / BS], g, pos % BS, D);
    uint4 kr[NP][2], vr[NP][2];
    auto load_round = [&](int r0) {
        int blk[NP];
#pragma unroll
        for (int p = 0; p < NP; p++) {
            const int tok = r0 + p * PP + warp * PW + grp;
            blk[p] = tok < lim ? bt[tok / BS] : 0;
        }
#pragma unroll
        for (int p = 0; p < NP; p++) {
            const int tok = r0 + p * PP + warp * PW + grp;
            if (tok < lim) {
                const size_t off = kv_offset(a, blk[p], g, tok % BS, D);
                kr[p][0] = *reinterpret_cast<const uint4 *>(a.k_cache + off + j * 8);
                kr[p][1] = *reinterpret_cast<const uint4 *>(a.k_cache + off + (j + LP) * 8);
                vr[p][0] = *reinterpret_cast<const uint4 *>(a.v_cache + off + j * 8);
                vr[p][1] = *reinterpret_cast<const uint4 *>(a.v_cache + off + (j + LP) * 8);
            } else {
                kr[p][0] = kr[p][1] = vr[p][0] = vr[p][1] = make_uint4(0, 0, 0, 0);
            }
        }
    };
    /* TC: lane (gq, tq) holds K rows gq and gq + 8 of the warp's 16 positions, dims QD tq .. + QD - 1
     * (RC 16-byte chunks each), in registers, and copies the same chunks of their V rows into the
     * warp's tile (zeros past the cached positions). */
    constexpr int QD = D / 4, RC = D / 32;
    const int gq = lane >> 2, tq = lane & 3;
    uint16_t *const vt = reinterpret_cast<uint16_t *>(dec_big) + (TC ? warp * 16 * TSD : 0);
    uint4 kt[2][TC ? RC : 1];
    auto load_tc = [&](int r0) {
        if constexpr (TC) {
            int tk[2], blk[2];
#pragma unroll
            for (int x = 0; x < 2; x++) {
                tk[x] = r0 + 16 * warp + gq + 8 * x;
                blk[x] = tk[x] < lim ? bt[tk[x] / BS] : 0;
            }
#pragma unroll
            for (int x = 0; x < 2; x++) {
                const bool in = tk[x] < lim;
                const size_t off = in ? kv_offset(a, blk[x], g, tk[x] % BS, D) + QD * tq : 0;
#pragma unroll
                for (int i = 0; i < RC; i++) {
                    kt[x][i] = in ? *reinterpret_cast<const uint4 *>(a.k_cache + off + 8 * i) : make_uint4(0, 0, 0, 0);
                    cp_async16(vt + (gq + 8 * x) * TSD + QD * tq + 8 * i, a.v_cache + off + 8 * i, !in);
                }
            }
            cp_async_commit();
        }
    };
    if constexpr (TC)
        load_tc(p0);
    else
        load_round(p0);
    float rc[PER], rs[PER];
    dec_rope_cs<D>(a.inv_freq, pos, lane, rc, rs);
    /* The one-wave shape waits here for its round's K/V (a store that depends on every load; its
     * slot is written again at the end), so that after the wait the q/k/v row's loads do not queue
     * behind them (v43: +0.2 to +0.6% at batch 1). */
    if constexpr (NPX == 0) {
        unsigned sx = 0;
        if constexpr (TC) { /* V's copies waited for, K's loads in the store */
#pragma unroll
            for (int x = 0; x < 2; x++)
#pragma unroll
                for (int i = 0; i < RC; i++) sx ^= kt[x][i].x;
            cp_async_wait_all();
        } else {
#pragma unroll
            for (int p = 0; p < NP; p++) sx ^= kr[p][0].x ^ kr[p][1].x ^ vr[p][0].x ^ vr[p][1].x;
        }
        if (lane == 0) wm[warp][0] = __uint_as_float(sx);
    }

    pdl_wait();
    const float *row = a.qkv + (size_t)t * a.ld_qkv;
    const int Q = a.n_heads * D, KV = a.n_kv_heads * D;
    /* Warps: the G query heads, then the keys of positions pos0 .. pos (the last one is this
     * token's, written to the cache by this block when it holds it); each key row exactly as the
     * block of its own token computes it, so the bits equal a decode of one token at a time. */
    for (int vi = warp; vi <= G + np; vi += W) {
        if (vi < G) {
            if constexpr (TC) /* qs holds the hi parts [GM][D] then the lo parts, bf16 */
                dec_norm_rope<D>(row + (g * G + vi) * D, a.q_norm, rc, rs, a.eps, lane, nullptr, nullptr, nullptr,
                                 reinterpret_cast<uint16_t *>(qs) + vi * D,
                                 reinterpret_cast<uint16_t *>(qs) + (GM + vi) * D);
            else
                dec_norm_rope<D>(row + (g * G + vi) * D, a.q_norm, rc, rs, a.eps, lane, &qs[vi][0], nullptr, nullptr);
        } else if (vi == G + np) {
            if (own)
                dec_norm_rope<D>(row + Q + g * D, a.k_norm, rc, rs, a.eps, lane, nullptr, a.k_cache + off_new, kn[np]);
        } else {
            const int i = vi - G;
            float c2[PER], s2[PER];
            dec_rope_cs<D>(a.inv_freq, pos0 + i, lane, c2, s2);
            dec_norm_rope<D>(a.qkv + (size_t)(t - np + i) * a.ld_qkv + Q + g * D, a.k_norm, c2, s2, a.eps, lane,
                             nullptr, nullptr, kn[i]);
        }
    }
    /* Values: from the highest thread down, so that without a run the last warps (not the ones
     * normalising) do it, as before. */
    for (int idx = NT - 1 - (int)threadIdx.x; idx < (np + 1) * D; idx += NT) {
        const int i = idx / D, d = idx % D;
        if (i == np && !own) continue;
        const uint16_t v = f2bf(a.qkv[(size_t)(t - np + i) * a.ld_qkv + Q + KV + g * D + d]);
        if (i == np) a.v_cache[off_new + d] = v;
        vn[i][d] = v;
    }
    __syncthreads();
    if constexpr (TC) {
        /* q.k: mma m16n8k16, A = the warp's 16 K rows (row-major: positions x dims), B = the query
         * heads (n = head, 2 to 8 of the 8 columns live). The dims a k-step takes are a permutation
         * (the sum does not care): lane (gq, tq)'s A words 2s and 2s + 1 of a row are dims
         * QD tq + 4s + 0..3, so at k-step s index 2 tq + e is dim QD tq + 4s + e and 2 tq + 8 + e is
         * QD tq + 4s + 2 + e, which B takes from the same four values of q: B's words are laid out
         * as A's. q is split into bf16 hi + lo parts (k_attn_prefill's arithmetic: the scores lose no
         * more than K's rounding), written so by the norm above. */
        constexpr int KS = D / 16, NO = D / 8;
        const uint16_t *qhs = reinterpret_cast<const uint16_t *>(qs), *qls = qhs + GM * D;
        uint4 qhv[RC], qlv[RC];
#pragma unroll
        for (int c = 0; c < RC; c++) {
            qhv[c] = qlv[c] = make_uint4(0, 0, 0, 0);
            if (gq < G) {
                qhv[c] = *reinterpret_cast<const uint4 *>(qhs + gq * D + QD * tq + 8 * c);
                qlv[c] = *reinterpret_cast<const uint4 *>(qls + gq * D + QD * tq + 8 * c);
            }
        }
        /* Lane (gq, tq)'s scores: positions gq and gq + 8 of the warp's 16 for heads 2 tq and
         * 2 tq + 1 (the mma's C layout); its running maxima and partial sums of exponentials are
         * for those heads. Its output accumulators o: head gq (rows gq + 8 stay zero), dims
         * 8 n + 2 tq, + 1. */
        float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f, o[NO][4];
        const float sl2 = a.scale * 1.4426950408889634f; /* scores in log2 units (exp2f), as k_attn_prefill */
#pragma unroll
        for (int n = 0; n < NO; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
        for (int r0 = p0; r0 < p1; r0 += RT) { /* positions at p1 and past it are masked */
            if (r0 + 16 * warp >= p1) break;   /* none of this warp's positions left */
            if (r0 != p0) {
                __syncwarp(); /* the last round's tile is read */
                load_tc(r0);
                cp_async_wait_all();
            }
            /* This step's positions (this token's and its run's): K and V from shared memory. */
#pragma unroll
            for (int x = 0; x < 2; x++) {
                const int tok = r0 + 16 * warp + gq + 8 * x, i = tok - pos0;
                if (i >= 0 && i <= np && tok < p1)
#pragma unroll
                    for (int c = 0; c < RC; c++) {
                        kt[x][c] = *reinterpret_cast<const uint4 *>(&kn[i][QD * tq + 8 * c]);
                        *reinterpret_cast<uint4 *>(vt + (gq + 8 * x) * TSD + QD * tq + 8 * c) =
                            *reinterpret_cast<const uint4 *>(&vn[i][QD * tq + 8 * c]);
                    }
            }
            __syncwarp(); /* the tile's rows are in (ldmatrix reads other lanes' chunks) */
            /* Four independent accumulators (hi and lo parts, even and odd k-steps): shorter
             * chains of dependent products. */
            float sc[4][4] = {};
#pragma unroll
            for (int s2 = 0; s2 < KS; s2++) {
                const int w0 = 2 * (s2 & 1);
                const unsigned af[4] = {u4_word(kt[0][s2 / 2], w0), u4_word(kt[1][s2 / 2], w0),
                                        u4_word(kt[0][s2 / 2], w0 + 1), u4_word(kt[1][s2 / 2], w0 + 1)};
                mma_bf16(sc[s2 & 1], af, u4_word(qhv[s2 / 2], w0), u4_word(qhv[s2 / 2], w0 + 1));
                mma_bf16(sc[2 + (s2 & 1)], af, u4_word(qlv[s2 / 2], w0), u4_word(qlv[s2 / 2], w0 + 1));
            }
            const int pa = r0 + 16 * warp + gq, pb = pa + 8;
            float s0 = (sc[0][0] + sc[1][0]) + (sc[2][0] + sc[3][0]);
            float s1 = (sc[0][1] + sc[1][1]) + (sc[2][1] + sc[3][1]);
            float s2v = (sc[0][2] + sc[1][2]) + (sc[2][2] + sc[3][2]);
            float s3 = (sc[0][3] + sc[1][3]) + (sc[2][3] + sc[3][3]);
            s0 = pa < p1 ? s0 * sl2 : -INFINITY;
            s1 = pa < p1 ? s1 * sl2 : -INFINITY;
            s2v = pb < p1 ? s2v * sl2 : -INFINITY;
            s3 = pb < p1 ? s3 * sl2 : -INFINITY;
            float x0 = fmaxf(s0, s2v), x1 = fmaxf(s1, s3);
#pragma unroll
            for (int o2 = 4; o2 < 32; o2 <<= 1) {
                x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, o2));
                x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, o2));
            }
            const float n0 = fmaxf(m0, x0), n1 = fmaxf(m1, x1);
            const float z0 = n0 == -INFINITY ? 0.f : n0, z1 = n1 == -INFINITY ? 0.f : n1; /* as v7 */
            const float al0 = exp2f(m0 - z0), al1 = exp2f(m1 - z1);
            m0 = n0, m1 = n1;
            const float pr0 = exp2f(s0 - z0), pr1 = exp2f(s1 - z1), pr2 = exp2f(s2v - z0), pr3 = exp2f(s3 - z1);
            l0 = fmaf(l0, al0, pr0 + pr2);
            l1 = fmaf(l1, al1, pr1 + pr3);
            /* Head gq's factor from lane gq / 2 (tq' = gq / 2, component gq % 2), and P's A fragment
             * (row gq: positions 2 tq, 2 tq + 1 and those + 8) from lanes 8 tq + gq / 2 and
             * 8 tq + 4 + gq / 2, rounded to bf16 (as k_attn_prefill's P). */
            const bool odd = gq & 1;
            if (r0 != p0) {
                const float f0 = __shfl_sync(0xffffffffu, al0, gq >> 1), f1 = __shfl_sync(0xffffffffu, al1, gq >> 1);
                const float f = odd ? f1 : f0;
#pragma unroll
                for (int n = 0; n < NO; n++) o[n][0] *= f, o[n][1] *= f;
            }
            const int sa = 8 * tq + (gq >> 1), sb = sa + 4;
            const float a00 = __shfl_sync(0xffffffffu, pr0, sa), a01 = __shfl_sync(0xffffffffu, pr1, sa);
            const float b00 = __shfl_sync(0xffffffffu, pr0, sb), b01 = __shfl_sync(0xffffffffu, pr1, sb);
            const float a20 = __shfl_sync(0xffffffffu, pr2, sa), a21 = __shfl_sync(0xffffffffu, pr3, sa);
            const float b20 = __shfl_sync(0xffffffffu, pr2, sb), b21 = __shfl_sync(0xffffffffu, pr3, sb);
            const unsigned pf[4] = {pack_bf2(odd ? a01 : a00, odd ? b01 : b00), 0u,
                                    pack_bf2(odd ? a21 : a20, odd ? b21 : b20), 0u};
            /* O += P V: the tile's rows are positions, so the transposing ldmatrix gives B. */
#pragma unroll
            for (int n = 0; n < NO; n += 2) {
                unsigned b[4];
                const int mi = lane >> 3;
                ldsm_x4_t(b, vt + ((mi & 1) * 8 + (lane & 7)) * TSD + (n + (mi >> 1)) * 8);
                mma_bf16(o[n], pf, b[0], b[1]);
                mma_bf16(o[n + 1], pf, b[2], b[3]);
            }
        }
#pragma unroll
        for (int o2 = 4; o2 < 32; o2 <<= 1) {
            l0 += __shfl_xor_sync(0xffffffffu, l0, o2);
            l1 += __shfl_xor_sync(0xffffffffu, l1, o2);
        }
        __syncthreads(); /* every warp's tile is read: wacc takes their place */
        if (gq < G)
#pragma unroll
            for (int n = 0; n < NO; n++)
                *reinterpret_cast<float2 *>(&wacc[warp][gq][8 * n + 2 * tq]) = make_float2(o[n][0], o[n][1]);
        if (gq == 0) { /* the maxima back in natural units, as the merge takes them */
            constexpr float LN2 = 0.6931471805599453f;
            if (2 * tq < G) wm[warp][2 * tq] = m0 * LN2, wl[warp][2 * tq] = l0;
            if (2 * tq + 1 < G) wm[warp][2 * tq + 1] = m1 * LN2, wl[warp][2 * tq + 1] = l1;
        }
    } else {
        float m[GM], l[GM], acc[GM][16];
    #pragma unroll
        for (int h = 0; h < GM; h++) {
            m[h] = -INFINITY;
            l[h] = 0.f;
    #pragma unroll
            for (int e = 0; e < 16; e++) acc[h][e] = 0.f;
        }
        for (int r0 = p0; r0 < p1; r0 += RP) { /* positions at p1 and past it are masked */
            if (r0 != p0) load_round(r0);
            /* This step's positions (this token's and its run's): their K/V from shared memory. */
    #pragma unroll
            for (int p = 0; p < NP; p++) {
                const int tok = r0 + p * PP + warp * PW + grp, i = tok - pos0;
                if (i >= 0 && i <= np && tok < p1) {
                    kr[p][0] = *reinterpret_cast<const uint4 *>(&kn[i][j * 8]);
                    kr[p][1] = *reinterpret_cast<const uint4 *>(&kn[i][(j + LP) * 8]);
                    vr[p][0] = *reinterpret_cast<const uint4 *>(&vn[i][j * 8]);
                    vr[p][1] = *reinterpret_cast<const uint4 *>(&vn[i][(j + LP) * 8]);
                }
            }
            /* Passes of this round that hold any position < L (the same for the whole block: the
             * loops below stop there, so short contexts skip the empty passes). */
            const int npv = min(NP, (p1 - r0 + PP - 1) / PP);
            /* q.k: each lane's 16 dims, then a sum over the LP lanes of the position. */
            float s[NP][GM];
    #pragma unroll
            for (int h = 0; h < GM; h++) {
                if (h >= G) break;
                const float4 qa0 = *reinterpret_cast<const float4 *>(&qs[h][j * 4]);
                const float4 qb0 = *reinterpret_cast<const float4 *>(&qs[h][D / 2 + j * 4]);
                const float4 qa1 = *reinterpret_cast<const float4 *>(&qs[h][(j + LP) * 4]);
                const float4 qb1 = *reinterpret_cast<const float4 *>(&qs[h][D / 2 + (j + LP) * 4]);
    #pragma unroll
                for (int p = 0; p < NP; p++) {
                    if (p >= npv) break;
                    const uint4 k0 = kr[p][0], k1 = kr[p][1];
                    float x = qa0.x * bf_lo(k0.x);
                    float y = qa1.x * bf_lo(k1.x);
                    x = fmaf(qa0.y, bf_hi(k0.x), x);
                    y = fmaf(qa1.y, bf_hi(k1.x), y);
                    x = fmaf(qa0.z, bf_lo(k0.y), x);
                    y = fmaf(qa1.z, bf_lo(k1.y), y);
                    x = fmaf(qa0.w, bf_hi(k0.y), x);
                    y = fmaf(qa1.w, bf_hi(k1.y), y);
                    x = fmaf(qb0.x, bf_lo(k0.z), x);
                    y = fmaf(qb1.x, bf_lo(k1.z), y);
                    x = fmaf(qb0.y, bf_hi(k0.z), x);
                    y = fmaf(qb1.y, bf_hi(k1.z), y);
                    x = fmaf(qb0.z, bf_lo(k0.w), x);
                    y = fmaf(qb1.z, bf_lo(k1.w), y);
                    x = fmaf(qb0.w, bf_hi(k0.w), x);
                    y = fmaf(qb1.w, bf_hi(k1.w), y);
                    s[p][h] = x + y;
                }
            }
    #pragma unroll
            for (int o = 1; o < LP; o <<= 1)
    #pragma unroll
                for (int p = 0; p < NP; p++) {
                    if (p >= npv) break;
    #pragma unroll
                    for (int h = 0; h < GM; h++)
                        if (h < G) s[p][h] += __shfl_xor_sync(0xffffffffu, s[p][h], o);
                }
            /* Online softmax per warp (the max is warp-wide; l is per position group until the end). */
    #pragma unroll
            for (int h = 0; h < GM; h++) {
                if (h >= G) break;
                float mx = -INFINITY;
    #pragma unroll
                for (int p = 0; p < NP; p++) {
                    if (p >= npv) break;
                    const int tok = r0 + p * PP + warp * PW + grp;
                    s[p][h] = tok < p1 ? s[p][h] * a.scale : -INFINITY;
                    mx = fmaxf(mx, s[p][h]);
                }
    #pragma unroll
                for (int o = LP; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
                const float mn = fmaxf(m[h], mx);
                const float mr = mn == -INFINITY ? 0.f : mn; /* no position yet: keep everything 0 */
                const float alpha = expf(m[h] - mr);
                m[h] = mn;
                l[h] *= alpha;
    #pragma unroll
                for (int e = 0; e < 16; e++) acc[h][e] *= alpha;
    #pragma unroll
                for (int p = 0; p < NP; p++) {
                    if (p >= npv) break;
                    const float pr = expf(s[p][h] - mr);
                    l[h] += pr;
                    const uint4 v0 = vr[p][0], v1 = vr[p][1];
                    acc[h][0] = fmaf(pr, bf_lo(v0.x), acc[h][0]);
                    acc[h][1] = fmaf(pr, bf_hi(v0.x), acc[h][1]);
                    acc[h][2] = fmaf(pr, bf_lo(v0.y), acc[h][2]);
                    acc[h][3] = fmaf(pr, bf_hi(v0.y), acc[h][3]);
                    acc[h][4] = fmaf(pr, bf_lo(v0.z), acc[h][4]);
                    acc[h][5] = fmaf(pr, bf_hi(v0.z), acc[h][5]);
                    acc[h][6] = fmaf(pr, bf_lo(v0.w), acc[h][6]);
                    acc[h][7] = fmaf(pr, bf_hi(v0.w), acc[h][7]);
                    acc[h][8] = fmaf(pr, bf_lo(v1.x), acc[h][8]);
                    acc[h][9] = fmaf(pr, bf_hi(v1.x), acc[h][9]);
                    acc[h][10] = fmaf(pr, bf_lo(v1.y), acc[h][10]);
                    acc[h][11] = fmaf(pr, bf_hi(v1.y), acc[h][11]);
                    acc[h][12] = fmaf(pr, bf_lo(v1.z), acc[h][12]);
                    acc[h][13] = fmaf(pr, bf_hi(v1.z), acc[h][13]);
                    acc[h][14] = fmaf(pr, bf_lo(v1.w), acc[h][14]);
                    acc[h][15] = fmaf(pr, bf_hi(v1.w), acc[h][15]);
                }
            }
        }
        /* Sum the warp's NG position groups (they share the warp's max), halving (tr_halve: 2 (NG - 1)
         * GM 16 / NG shuffles, against 16 GM log2(NG) summing all in every lane; the same bits, v43):
         * lane keeps NK of the NV = 16 GM sums, the flat index h * 16 + e from base, and stores them. */
        constexpr int NG = 32 / LP, NV = GM * 16, NK = NV / (NG > 0 ? NG : 1);
        if constexpr (NG >= 2 && NV % NG == 0 && NK % 4 == 0) {
            float v[NV];
    #pragma unroll
            for (int h = 0; h < GM; h++)
    #pragma unroll
                for (int e = 0; e < 16; e++) v[h * 16 + e] = acc[h][e];
            tr_halve<NV, LP, 32>(v, lane);
            int base = 0;
    #pragma unroll
            for (int o = LP, n = NV; o < 32; o <<= 1, n >>= 1) base += (lane & o) ? n / 2 : 0;
    #pragma unroll
            for (int o = LP; o < 32; o <<= 1)
    #pragma unroll
                for (int h = 0; h < GM; h++) l[h] += __shfl_xor_sync(0xffffffffu, l[h], o);
    #pragma unroll
            for (int k4 = 0; k4 < NK; k4 += 4) {
                const int f = base + k4, h = f >> 4, e = f & 15;
                const int d = e < 8 ? j * 8 + e : (j + LP) * 8 + e - 8;
                if (h < G)
                    *reinterpret_cast<float4 *>(&wacc[warp][h][d]) = make_float4(v[k4], v[k4 + 1], v[k4 + 2], v[k4 + 3]);
            }
            if (lane == 0)
    #pragma unroll
                for (int h = 0; h < GM; h++)
                    if (h < G) wm[warp][h] = m[h], wl[warp][h] = l[h];
        } else { /* every lane sums all, the first group stores */
    #pragma unroll
            for (int o = LP; o < 32; o <<= 1)
    #pragma unroll
                for (int h = 0; h < GM; h++) {
                    if (h >= G) break;
                    l[h] += __shfl_xor_sync(0xffffffffu, l[h], o);
    #pragma unroll
                    for (int e = 0; e < 16; e++) acc[h][e] += __shfl_xor_sync(0xffffffffu, acc[h][e], o);
                }
            if (grp == 0) {
    #pragma unroll
                for (int h = 0; h < GM; h++) {
                    if (h >= G) break;
                    *reinterpret_cast<float4 *>(&wacc[warp][h][j * 8]) = make_float4(acc[h][0], acc[h][1], acc[h][2], acc[h][3]);
                    *reinterpret_cast<float4 *>(&wacc[warp][h][j * 8 + 4]) = make_float4(acc[h][4], acc[h][5], acc[h][6], acc[h][7]);
                    *reinterpret_cast<float4 *>(&wacc[warp][h][(j + LP) * 8]) = make_float4(acc[h][8], acc[h][9], acc[h][10], acc[h][11]);
                    *reinterpret_cast<float4 *>(&wacc[warp][h][(j + LP) * 8 + 4]) = make_float4(acc[h][12], acc[h][13], acc[h][14], acc[h][15]);
                    if (j == 0) {
                        wm[warp][h] = m[h];
                        wl[warp][h] = l[h];
                    }
                }
            }
        }
    }
    __syncthreads(); /* every warp's (max, sum, weighted V sum) written */
    if (nused == 1)
        attn_merge_warps(a, wm, wl, wacc, t, g, G, Q, NT);
    else
        attn_split_merge(a, wm, wl, wacc, t, slot, g, G, Q, z, nz, nused, NT);
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

/* True when a launch of n tokens of fn (threads a block, one block a KV head and token) fits the
 * GPU in one wave. */
static bool one_wave(const lm_cuda_ctx *c, const void *fn, int threads, const lm_cuda_attn &a, int n) {
    return (long)a.n_kv_heads * n <= (long)lm_cuda_occupancy(fn, threads, 0) * c->sm_count;
}

using dec_kernel = void (*)(const lm_cuda_attn);

/* The 8-warp kernel a launch runs: its tensor-core rounds where the context allows them (attn_tc),
 * the shape has them and the output is bf16 (P's bf16 rounding stays under the output's). */
template <int D, int GM>
static dec_kernel dec_one_wave(const lm_cuda_ctx *c, const lm_cuda_attn &a) {
    if constexpr (dec_tc_ok<D, GM>())
        if (c->attn_tc && a.out_bf16) return k_attn_dec<D, GM, DEC_WARPS, 0, true>;
    return k_attn_dec<D, GM, DEC_WARPS, 0>;
}

/* True when a fused launch of n tokens runs k_attn_dec (the 8-warp decode kernel): n tokens' blocks
 * fit one wave of both forms the context could launch, so that the answer does not depend on
 * out_bf16 (the host plans work lists and runs by it before it knows the output's type). */
template <int D, int GM>
static bool dec_fits_g(const lm_cuda_ctx *c, const lm_cuda_attn &a, int n) {
    if constexpr (GM * D <= 1024) {
        if (!c->attn_dec || !one_wave(c, (const void *)k_attn_dec<D, GM, DEC_WARPS, 0>, DEC_THREADS, a, n))
            return false;
        if constexpr (dec_tc_ok<D, GM>())
            if (c->attn_tc && !one_wave(c, (const void *)k_attn_dec<D, GM, DEC_WARPS, 0, true>, DEC_THREADS, a, n))
                return false;
        return true;
    } else {
        return false;
    }
}

/* Batched decode on the decode kernel (v21): a fused launch of n tokens past one wave of the
 * 8-warp kernel (with or without a work list) runs k_attn_dec<D, GM, DEC_BATCH_W, DEC_BATCH_NP>,
 * which holds several blocks a multiprocessor, while its blocks for the n tokens fit the GPU in one
 * wave (ctx attn_batch on, groups of up to 4 query heads); larger launches keep k_attention,
 * whose lighter blocks fit more at once. Returns the kernel, or NULL for k_attention. */
constexpr int DEC_BATCH_W = 4, DEC_BATCH_NP = 2;
template <int D, int GM>
static dec_kernel batch_dec(const lm_cuda_ctx *c, const lm_cuda_attn &a, int n) {
    if constexpr (GM <= 4 && GM * D <= 1024) { /* acc: 16 GM registers a lane */
        const dec_kernel fn = k_attn_dec<D, GM, DEC_BATCH_W, DEC_BATCH_NP>;
        if (c->attn_batch && one_wave(c, (const void *)fn, DEC_BATCH_W * 32, a, n)) return fn;
    }
    return nullptr;
}

/* k_attention prefetches V with K when the launch is too small to fill the GPU (latency-bound:
 * decode at small batch) and the slices fit in registers (D <= 128); otherwise occupancy matters
 * more. */
template <int D>
static bool att_pre(const lm_cuda_ctx *c, const lm_cuda_attn &a, int n) {
    return AttShape<D>::DPL <= 4 && (long)a.n_kv_heads * n <= 4L * c->sm_count;
}

/* The k_attention instantiation a launch of pre_n tokens runs (att_pre). */
template <int D, int GM>
static void (*att_kernel(const lm_cuda_ctx *c, const lm_cuda_attn &a, int pre_n))(const lm_cuda_attn, int) {
    if (att_pre<D>(c, a, pre_n)) return k_attention<D, GM, (AttShape<D>::DPL <= 4)>;
    return k_attention<D, GM, false>;
}

template <int D, int GM>
static cudaError_t launch_attention_g(const lm_cuda_ctx *c, const lm_cuda_attn &a, int n, bool fused) {
    const dim3 grid(a.n_kv_heads, n), block(ATT_WARPS * 32);
    /* Decode launches that fit the GPU in one wave: the 8-warp kernel (v7). */
    if constexpr (GM * D <= 1024)
        if (fused) {
            const dec_kernel fn = dec_one_wave<D, GM>(c, a);
            if (dec_fits_g<D, GM>(c, a, n)) {
                if (a.n_splits <= 1 || !a.split_part || !a.split_count)
                    return lm_launch(c, grid, dim3(DEC_THREADS), 0, fn, a);
                constexpr int RP = DecShape<D, GM>::RP;
                lm_cuda_attn as = a;
                as.split_len = (std::max(1, a.split_len) + RP - 1) / RP * RP; /* at least one round */
                /* Only the blocks whose pieces start inside the n_splits x split_len positions the
                 * caller planned for: rounding a piece up to a round leaves the rest empty (pieces
                 * of 64 in rounds of 128: half the blocks). The same pieces, so the same bits. */
                const long planned = (long)a.n_splits * std::max(1, a.split_len);
                const int nz = (int)std::min<long>(a.n_splits, (planned + as.split_len - 1) / as.split_len);
                return lm_launch(c, dim3(a.n_kv_heads, n, nz), dim3(DEC_THREADS), 0, fn, as);
            }
        }
    /* Runs of one sequence's tokens need k_attn_dec (lm_cuda_attn_dec_fits). */
    if (fused && a.run_prev) return cudaErrorInvalidValue;
    if (fused && a.work && (a.n_splits < 1 || !a.split_part || !a.split_count || a.work_blocks < 1))
        return cudaErrorInvalidValue;
    /* Batched decode on the decode kernel's lighter shape: block (g, y) takes token y, or item y
     * of the work list (n + work_blocks blocks a KV head). */
    if (fused)
        if (const dec_kernel fn = batch_dec<D, GM>(c, a, n))
            return lm_launch(c, dim3(a.n_kv_heads, a.work ? n + a.work_blocks : n), dim3(DEC_BATCH_W * 32), 0, fn, a);
    /* k_attention, y blocks a KV head, prefetching V when a launch of pre_n tokens is small. */
    auto k_att = [&](int y, const lm_cuda_attn &as, int pre_n) {
        return lm_launch(c, dim3(a.n_kv_heads, y), block, 0, att_kernel<D, GM>(c, a, pre_n), as, (int)fused);
    };
    if (!fused && a.tiles) {
        /* Prefill tiles: the flash kernel, then k_attention over the tokens they leave. */
        if constexpr (fa_shape_ok<D>()) {
            if (!a.out_bf16 || a.n_tiles < 0 || a.n_rest < 0 || fa_smem<D>() > (size_t)c->smem_optin)
                return cudaErrorInvalidValue;
            auto fn = k_attn_prefill<D, GM>;
            if (a.n_tiles > 0) {
                lm_cuda_occupancy((const void *)fn, FA_WARPS * 32, fa_smem<D>()); /* raises the limit */
                const cudaError_t e = lm_launch(c, dim3(a.n_kv_heads, a.n_tiles), dim3(FA_WARPS * 32),
                                                fa_smem<D>(), fn, a);
                if (e != cudaSuccess || a.n_rest == 0) return e;
            }
            if (a.n_rest == 0) return cudaSuccess;
            lm_cuda_attn as = a;
            as.work = a.tiles + LM_CUDA_WORK_HEAD + LM_CUDA_WORK_ITEM * a.n_tiles;
            return k_att(a.n_rest, as, a.n_rest);
        } else {
            return cudaErrorInvalidValue;
        }
    }
    /* A fused (decode) launch with a work list: n + work_blocks blocks a KV head, the splits
     * merged through the scratch. Without one, one block a (KV head, token). */
    lm_cuda_attn as = a;
    if (!fused) as.work = NULL;
    return k_att(as.work ? n + a.work_blocks : n, as, n);
}

template <int V>
using int_c = std::integral_constant<int, V>;

template <int D, int GM>
static int work_blocks_g(const lm_cuda_ctx *c, const lm_cuda_attn &a, int n) {
    const void *fn = (const void *)batch_dec<D, GM>(c, a, n);
    const int threads = fn ? DEC_BATCH_W * 32 : ATT_WARPS * 32;
    if (!fn) fn = (const void *)att_kernel<D, GM>(c, a, n);
    const int per_sm = std::max(1, lm_cuda_occupancy(fn, threads, 0));
    return std::max(1, per_sm * c->sm_count / std::max(1, a.n_kv_heads));
}

/* f(D, GM) for the instantiation that serves a's shape (check_attn passed): D the head_dim
 * (16, 32, 64, 128 or 256) and GM the query heads a KV head serves rounded up to 1, 2, 4 or 8,
 * both as int_c. The one place a shape picks its kernels. */
template <class F>
static auto by_shape(const lm_cuda_attn &a, F &&f) {
    const int G = a.n_heads / a.n_kv_heads;
    auto by_g = [&](auto d) {
        if (G <= 1) return f(d, int_c<1>{});
        if (G <= 2) return f(d, int_c<2>{});
        if (G <= 4) return f(d, int_c<4>{});
        return f(d, int_c<8>{});
    };
    switch (a.head_dim) {
    case 16: return by_g(int_c<16>{});
    case 32: return by_g(int_c<32>{});
    case 64: return by_g(int_c<64>{});
    case 128: return by_g(int_c<128>{});
    default: return by_g(int_c<256>{});
    }
}

extern "C" bool lm_cuda_attn_dec_fits(const struct lm_cuda_ctx *c, const struct lm_cuda_attn *a, int n) {
    if (check_attn(a) || n < 1) return false;
    return by_shape(*a, [&](auto d, auto gm) {
        return dec_fits_g<decltype(d)::value, decltype(gm)::value>(c, *a, n);
    });
}

extern "C" bool lm_cuda_attn_batch_fits(const struct lm_cuda_ctx *c, const struct lm_cuda_attn *a, int n) {
    if (check_attn(a) || n < 1) return false;
    return by_shape(*a, [&](auto d, auto gm) {
        constexpr int D = decltype(d)::value, GM = decltype(gm)::value;
        return !dec_fits_g<D, GM>(c, *a, n) && batch_dec<D, GM>(c, *a, n) != nullptr;
    });
}

extern "C" int lm_cuda_attn_work_blocks(const struct lm_cuda_ctx *c, const struct lm_cuda_attn *a, int n) {
    if (check_attn(a) || n < 1) return 1;
    return by_shape(*a, [&](auto d, auto gm) {
        return work_blocks_g<decltype(d)::value, decltype(gm)::value>(c, *a, n);
    });
}

/* The pieces of n contexts (token i: pos[i] + 1 positions) for P resident blocks into items
 * (lm_cuda_attn.work's form, after the header), longest first; token i's items name row rows[i]
 * (i when rows is NULL) and scratch slot i. Returns the count (n to n + P). */
static int plan_pieces(int32_t *items, const int32_t *pos, const int32_t *rows, int n, int P, int min_len,
                       int max_splits) {
    long total = 0;
    int longest = 0;
    for (int i = 0; i < n; i++) {
        total += pos[i] + 1;
        longest = std::max(longest, pos[i] + 1);
    }
    P = std::max(P, 1);
    max_splits = std::min(std::max(max_splits, 1), 255);
    long sl = std::max({(long)min_len, (total + P - 1) / P, (long)(longest + max_splits - 1) / max_splits, 1L});
    sl = (sl + 31) / 32 * 32;
    /* Pieces written in (token, split) order, then sorted longest first, ties in that order: no
     * allocation (this runs every batched decode step). */
    struct piece {
        int32_t t, p0, p1, zn;
    };
    static_assert(sizeof(piece) == sizeof(int32_t) * LM_CUDA_WORK_ITEM, "an item is a piece");
    piece *v = reinterpret_cast<piece *>(items);
    int count = 0;
    for (int i = 0; i < n; i++) {
        const int L = pos[i] + 1;
        /* round(L / sl) pieces, of 0.75 sl to 1.5 sl: a context a little over sl stays whole */
        int k = std::max(1, (int)((L + sl / 2) / sl));
        const int len = ((L + k - 1) / k + 31) / 32 * 32;
        k = (L + len - 1) / len;
        for (int z = 0; z < k; z++)
            v[count++] = {rows ? rows[i] : i, z * len, std::min(L, (z + 1) * len), i << 16 | z << 8 | k};
    }
    std::sort(v, v + count, [](const piece &x, const piece &y) {
        const int lx = x.p1 - x.p0, ly = y.p1 - y.p0;
        return lx != ly ? lx > ly : x.zn != y.zn ? x.zn < y.zn : x.t < y.t;
    });
    return count;
}

extern "C" int lm_cuda_attn_plan_work(int32_t *w, const int32_t *pos, int n, int P, int min_len, int max_splits) {
    const int items = plan_pieces(w + LM_CUDA_WORK_HEAD, pos, NULL, n, P, min_len, max_splits);
    w[0] = items;
    w[1] = w[2] = w[3] = 0;
    return items;
}

extern "C" int lm_cuda_attn_tile_tokens(const struct lm_cuda_ctx *c, const struct lm_cuda_attn *a) {
    if (check_attn(a)) return 0;
    return by_shape(*a, [&](auto d, auto gm) {
        constexpr int D = decltype(d)::value, GM = decltype(gm)::value;
        return fa_shape_ok<D>() && fa_smem<D>() <= (size_t)c->smem_optin ? FA_ROWS / GM : 0;
    });
}

extern "C" int lm_cuda_attn_plan_tiles(int32_t *w, const int32_t *seq, const int32_t *pos, int n,
                                       const struct lm_cuda_tile_plan *p, int *n_rest) {
    const int tile_tokens = std::max(p->tile_tokens, 1), min_tokens = std::max(p->min_tokens, 1);
    /* f(t, c) for each tile: c tokens from row t, one sequence at consecutive positions. A run is
     * cut into tiles of tile_tokens; when that leaves a last tile under min_tokens, the last two
     * share the rest evenly (33 tokens: 17 + 16, not 32 + 1), so that every token of a run of at
     * least min_tokens stays on the tensor-core kernel. */
    auto each_tile = [&](auto &&f) {
        for (int t = 0, run; t < n; t += run) {
            run = 1;
            while (t + run < n && seq[t + run] == seq[t] && pos[t + run] == pos[t] + run) run++;
            const int full = run / tile_tokens, r = run % tile_tokens;
            const bool share = full >= 1 && r > 0 && r < min_tokens && (tile_tokens + r) / 2 >= min_tokens;
            int u = t;
            for (int i = 0; i < full - (share ? 1 : 0); i++, u += tile_tokens) f(u, tile_tokens);
            if (share) {
                const int a = (tile_tokens + r + 1) / 2;
                f(u, a);
                f(u + a, tile_tokens + r - a);
            } else if (r > 0) {
                f(u, r);
            }
        }
    };
    int tiles = 0;
    int32_t *it = w + LM_CUDA_WORK_HEAD;
    each_tile([&](int t, int c) {
        if (c < min_tokens) return;
        int32_t *x = it + LM_CUDA_WORK_ITEM * tiles++;
        x[0] = t, x[1] = c, x[2] = pos[t] + c, x[3] = 0;
    });
    /* The tiles with the most positions first (x[2]: the positions a tile reads), ties in row
     * order: blocks start in list order, so the long ones do not start last and hold up the
     * launch (a 2,048-token chunk's tiles read 64 to 2,048 positions). */
    struct tile {
        int32_t t, c, end, pad;
    };
    static_assert(sizeof(tile) == sizeof(int32_t) * LM_CUDA_WORK_ITEM, "an item is a tile");
    tile *tv = reinterpret_cast<tile *>(it);
    std::sort(tv, tv + tiles,
              [](const tile &x, const tile &y) { return x.end != y.end ? x.end > y.end : x.t < y.t; });
    /* The tokens of smaller tiles (a step's decode tokens beside its chunks): k_attention's work
     * items after their own header, each context cut into pieces as a batched decode step's
     * (plan_pieces: a long one must not hold up the launch) when their scratch rows fit. */
    thread_local std::vector<int32_t> rows, rpos;
    rows.clear(), rpos.clear();
    each_tile([&](int t, int c) {
        if (c >= min_tokens) return;
        for (int i = 0; i < c; i++) rows.push_back(t + i), rpos.push_back(pos[t + i]);
    });
    const int R = (int)rows.size();
    int32_t *rh = it + LM_CUDA_WORK_ITEM * tiles;
    const int splits = R <= p->max_slots ? p->max_splits : 1;
    const int items = plan_pieces(rh + LM_CUDA_WORK_HEAD, rpos.data(), rows.data(), R, p->P, p->min_len, splits);
    rh[0] = items, rh[1] = rh[2] = rh[3] = 0;
    w[0] = tiles, w[1] = items, w[2] = w[3] = 0;
    *n_rest = items;
    return tiles;
}

extern "C" lm_status lm_cuda_attention(struct lm_cuda_ctx *c, const struct lm_cuda_attn *a, int n,
                                       bool fused) {
    lm_status rc = check_attn(a);
    if (rc || n < 1) return rc;
    const cudaError_t e = by_shape(*a, [&](auto d, auto gm) {
        return launch_attention_g<decltype(d)::value, decltype(gm)::value>(c, *a, n, fused);
    });
    LM_CU(e);
    return LM_OK;
}

