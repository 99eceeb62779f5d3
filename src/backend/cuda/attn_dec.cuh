/* attn_dec.cuh: pieces of the attention kernels that attention.cu and layers.cu share: the
 * paged K/V offset, the output store and warp merge, and the body of the small-batch decode
 * kernel (attn_dec_run; docs/perf-notes.md v7, v10, v13). Internal to src/backend/cuda. */
#ifndef LM_BACKEND_CUDA_ATTN_DEC_CUH
#define LM_BACKEND_CUDA_ATTN_DEC_CUH

#include "backend/cuda/common.cuh"

namespace {

__device__ __forceinline__ size_t kv_offset(const lm_cuda_attn &a, int blk, int g, int slot, int D) {
    return (((size_t)blk * a.n_kv_heads + g) * a.block_size + slot) * D;
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

/* Head h, dim d of a block's NW warp partials merged: *M the max, *num the weighted V sum, *den
 * the sum of exponentials, both relative to *M (each warp's scaled by exp(its max - M), in warp
 * order). */
template <int NW, int GM, int D>
__device__ __forceinline__ void attn_warp_sums(const float (&wm)[NW][GM], const float (&wl)[NW][GM],
                                               const float (&wacc)[NW][GM][D], int h, int d, float *M,
                                               float *num, float *den) {
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < NW; w++) mx = fmaxf(mx, wm[w][h]);
    float nu = 0.f, de = 0.f;
#pragma unroll
    for (int w = 0; w < NW; w++) {
        const float f = wm[w][h] == -INFINITY ? 0.f : expf(wm[w][h] - mx);
        nu = fmaf(wacc[w][h][d], f, nu);
        de = fmaf(wl[w][h], f, de);
    }
    *M = mx, *num = nu, *den = de;
}

template <int NW, int GM, int D>
__device__ __forceinline__ void attn_merge_warps(const lm_cuda_attn &a, const float (&wm)[NW][GM],
                                                 const float (&wl)[NW][GM], const float (&wacc)[NW][GM][D],
                                                 int t, int g, int G, int Q, int stride) {
    for (int i = threadIdx.x; i < G * D; i += stride) {
        const int h = i / D, d = i % D;
        float M, num, den;
        attn_warp_sums(wm, wl, wacc, h, d, &M, &num, &den);
        attn_store(a, t, g * G + h, Q, D, d, num / den);
    }
}

/* ---- decode attention at small batch (v7) ----
 *
 * For launches too small to fill the GPU (decode at batch 1..~60: one block per (KV head, token),
 * 8 to 500 blocks), where k_attention's time is one warp's chain of ~800 dependent instructions.
 * Here a block has 8 warps; each position is shared by LP = D / 16 lanes (16 dims a lane: two
 * 16-byte K loads and two V loads), so a q.k chain is 16 FMAs long plus log2(LP) shuffles; the K
 * and V rows of a round of positions sit in registers. Everything that does not depend on the
 * preceding kernel is done before waiting on it (programmatic dependent launch): the block-table
 * lookups, the K/V loads of the earlier positions (written by earlier steps), and RoPE's sines and
 * cosines. After the wait: this token's q/k norm + RoPE (q to shared memory, k and v to the cache
 * and to shared memory), one barrier, the rounds, one barrier, the merge of the warps. */

constexpr int DEC_WARPS = 8, DEC_THREADS = DEC_WARPS * 32;

template <int D, int GM>
struct DecShape {
    static constexpr int LP = D / 16;                          /* lanes per position */
    static constexpr int PW = 32 / LP;                         /* positions per warp per pass */
    static constexpr int PP = DEC_WARPS * PW;                  /* positions per pass */
    static constexpr int NP = GM <= 2 ? 4 : GM == 4 ? 2 : 1; /* passes a round */
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
 * (layout dec_qslot) or to a key row (bf16) in the cache and in shared memory. */
template <int D>
__device__ __forceinline__ void dec_norm_rope(const float *src, const float *w, const float *c,
                                              const float *s, float eps, int lane, float *q_out,
                                              uint16_t *k_out, uint16_t *k_sm) {
    constexpr int H = D / 2, PER = (H + 31) / 32;
    float x1[PER], x2[PER], w1[PER], w2[PER], ss = 0.f;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int j = lane + 32 * i;
        x1[i] = j < H ? __ldcg(src + j) : 0.f;
        x2[i] = j < H ? __ldcg(src + j + H) : 0.f;
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
        if (q_out) {
            q_out[dec_qslot<D>(j)] = o1;
            q_out[dec_qslot<D>(j + H)] = o2;
        } else {
            const uint16_t u1 = f2bf(o1), u2 = f2bf(o2);
            k_out[j] = u1;
            k_out[j + H] = u2;
            k_sm[j] = u1;
            k_sm[j + H] = u2;
        }
    }
}

/* The body of the decode kernel for (KV head g, token t), split z of nz (nz = 1: no split), run by
 * 256 threads (DEC_THREADS) of a block. wait() runs between the loads that do not depend on this
 * step's q/k/v (block tables, earlier positions' K/V, RoPE's sines) and the first read of them
 * (k_attn_dec: griddepcontrol.wait); sync() is the barrier of those 256 threads (k_attn_dec:
 * __syncthreads; the layer-stack kernel of layers.cu: a named barrier that leaves out its copy
 * warp). This step's q/k/v are read through L2 (.cg): in the layer-stack kernel another block
 * wrote them in the same launch. */
template <int D, int GM, class Wait, class Sync>
__device__ __forceinline__ void attn_dec_run(const lm_cuda_attn &a, int g, int t, int z, int nz, Wait &&wait,
                                             Sync &&sync) {
    using S = DecShape<D, GM>;
    constexpr int LP = S::LP, PW = S::PW, PP = S::PP, NP = S::NP, RP = S::RP;
    constexpr int PER = (D / 2 + 31) / 32;
    __shared__ __align__(16) float qs[GM][D];
    __shared__ __align__(16) uint16_t kn[D], vn[D];
    __shared__ float wm[DEC_WARPS][GM], wl[DEC_WARPS][GM];
    __shared__ __align__(16) float wacc[DEC_WARPS][GM][D];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int grp = lane / LP, j = lane % LP;
    const int G = a.n_heads / a.n_kv_heads, BS = a.block_size;

    /* Before the wait: the step's inputs (copied before its first kernel), the cache rows of
     * positions < pos (written by earlier steps; no kernel of this step writes them), weights. */
    const int seq = a.seq[t], pos = a.pos[t], L = pos + 1;
    /* Split-KV (flash-decoding): block z of nz takes positions [p0, p1), the last one up to L. */
    const int SL = a.split_len;
    const int p0 = nz > 1 ? z * SL : 0, p1 = nz > 1 && z < nz - 1 ? min(L, p0 + SL) : L;
    if (p0 >= L) return; /* no position of this token here */
    const int nused = nz > 1 ? min(nz, (L + SL - 1) / SL) : 1;
    const bool own = pos >= p0; /* this block holds the new token: it writes its K/V */
    const int32_t *bt = a.block_tables + (size_t)seq * a.bt_width;
    const size_t off_new = kv_offset(a, bt[pos / BS], g, pos % BS, D);
    uint4 kr[NP][2], vr[NP][2];
    auto load_round = [&](int r0) {
        int blk[NP];
#pragma unroll
        for (int p = 0; p < NP; p++) {
            const int tok = r0 + p * PP + warp * PW + grp;
            blk[p] = tok < pos ? bt[tok / BS] : 0;
        }
#pragma unroll
        for (int p = 0; p < NP; p++) {
            const int tok = r0 + p * PP + warp * PW + grp;
            if (tok < pos) {
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
    load_round(p0);
    float rc[PER], rs[PER];
    dec_rope_cs<D>(a.inv_freq, pos, lane, rc, rs);

    wait();
    const float *row = a.qkv + (size_t)t * a.ld_qkv;
    const int Q = a.n_heads * D, KV = a.n_kv_heads * D;
    for (int vi = warp; vi <= G; vi += DEC_WARPS) {
        if (vi < G)
            dec_norm_rope<D>(row + (g * G + vi) * D, a.q_norm, rc, rs, a.eps, lane, &qs[vi][0], nullptr, nullptr);
        else if (own)
            dec_norm_rope<D>(row + Q + g * D, a.k_norm, rc, rs, a.eps, lane, nullptr, a.k_cache + off_new, kn);
    }
    if (own && (int)threadIdx.x >= DEC_THREADS - D) {
        const int d = threadIdx.x - (DEC_THREADS - D);
        const uint16_t v = f2bf(__ldcg(row + Q + KV + g * D + d));
        a.v_cache[off_new + d] = v;
        vn[d] = v;
    }
    sync();

    float m[GM], l[GM], acc[GM][16];
#pragma unroll
    for (int h = 0; h < GM; h++) {
        m[h] = -INFINITY;
        l[h] = 0.f;
#pragma unroll
        for (int e = 0; e < 16; e++) acc[h][e] = 0.f;
    }
    for (int r0 = p0; r0 < p1; r0 += RP) { /* SL is a multiple of RP: rounds end at p1 */
        if (r0 != p0) load_round(r0);
        /* This token's own position: its K/V from shared memory. */
#pragma unroll
        for (int p = 0; p < NP; p++) {
            if (r0 + p * PP + warp * PW + grp == pos) {
                kr[p][0] = *reinterpret_cast<const uint4 *>(&kn[j * 8]);
                kr[p][1] = *reinterpret_cast<const uint4 *>(&kn[(j + LP) * 8]);
                vr[p][0] = *reinterpret_cast<const uint4 *>(&vn[j * 8]);
                vr[p][1] = *reinterpret_cast<const uint4 *>(&vn[(j + LP) * 8]);
            }
        }
        /* Passes of this round that hold any position < L (the same for the whole block: the
         * loops below stop there, so short contexts skip the empty passes). */
        const int npv = min(NP, (L - r0 + PP - 1) / PP);
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
                s[p][h] = tok < L ? s[p][h] * a.scale : -INFINITY;
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
    /* Sum the warp's position groups (they share the warp's max). */
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
    sync();
    if (nused == 1) {
        attn_merge_warps(a, wm, wl, wacc, t, g, G, Q, DEC_THREADS);
        return;
    }
    /* Split: this block's (max, sum, weighted V sum) per head to the scratch; the last block of
     * the token's KV head to finish merges the splits in order 0 .. nused - 1 (Dao et al. 2023,
     * flash-decoding), so the result does not depend on which block finishes last. */
    const int stride = G * (D + 2);
    float *part = a.split_part + (size_t)(t * a.n_kv_heads + g) * nz * stride;
    for (int i = threadIdx.x; i < G * D; i += DEC_THREADS) {
        const int h = i / D, d = i % D;
        float M, num, den;
        attn_warp_sums(wm, wl, wacc, h, d, &M, &num, &den);
        float *ps = part + (size_t)z * stride;
        ps[h * D + d] = num;
        if (d == 0) ps[G * D + h] = M, ps[G * D + G + h] = den;
    }
    __threadfence();
    sync();
    __shared__ int last;
    if (threadIdx.x == 0) {
        unsigned *cnt = a.split_count + t * a.n_kv_heads + g;
        last = atomicAdd(cnt, 1u) == (unsigned)nused - 1;
        if (last) *cnt = 0; /* every other split has arrived: ready for the next launch */
    }
    sync();
    if (!last) return;
    __threadfence();
    for (int i = threadIdx.x; i < G * D; i += DEC_THREADS) {
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

} // namespace

#endif
