/* gemv.cu: lm_cuda_gemv (batch 1..8 linear layers, float32 activations, bf16 weights streamed
 * once). See cuda.h for the contracts, docs/perf-notes.md for why. */
#include <limits.h>

#include <type_traits>

#include "backend/cuda/common.cuh"

namespace {

/* ---- GEMV ---- */

constexpr int GEMV_WARPS = 8, GEMV_THREADS = GEMV_WARPS * 32;

/* Weight formats of k_gemv: bf16 rows, or Q8_0 (int8 quants [m, k] plus one float16 scale per
 * 32 weights, [m, k / 32]: GGUF's Q8_0 blocks split into two arrays) with the activations
 * quantized to int8 per 32-element block (dp4a integer dot products, as the CPU's LM_Q8_0_INT8
 * path and llama.cpp's MMVQ; v11 measured converting each weight to float instead slower than
 * the bf16 copy). A lane loads 16 bytes of a row at a time: EL = 8 bf16 or 16 int8 weights; a
 * warp covers a chunk of CH = 32 * EL. */
enum { GEMV_BF16, GEMV_Q8 };
template <int F> struct gemv_fmt {
    static constexpr int EL = F == GEMV_BF16 ? 8 : 16, CH = 32 * EL;
};

/* Shared-memory slot of element k of an activation row: within each chunk of 32 * EL elements,
 * lane l's EL elements (l*EL .. l*EL+EL-1) sit as EL/4 float4s, at 4*l, 128 + 4*l, ..., so a
 * warp's float4 reads are contiguous and conflict-free. (EL = 8: the v1 layout.) */
template <int EL>
__device__ __forceinline__ int gemv_slot(int k) {
    constexpr int CH = 32 * EL;
    const int e = k % CH;
    return (k - e) + ((e >> 2) % (EL / 4)) * 128 + (e / EL) * 4 + (e & 3);
}

/* The pending fixed-point term of the residual stream (lm_cuda_fix_io, device side). */
struct gemv_fix {
    const long long *add;
    long long *zero;
    int zero_n;
};

/* k_screen's extra inputs and output (lm_cuda_gemv_screen). */
struct gemv_scr {
    const float2 *ab; /* [m] (a_j, b_j): ||w_j - w'_j||_2 and ||w_j||_2, rounded up (lm_cuda_screen_build) */
    int *lmax;        /* [T] ordered keys (scr_key) of each activation row's best lower bound */
    float rho;        /* the rounding terms' coefficient (screen_rho) */
    float tiny;       /* the rounding terms' absolute part (screen_rho): partial sums that are
                         subnormal round by up to 2^-150 a step, not relatively */
    /* k_screen<..., FU = true> (one activation row): the bf16 rows, the id out, the state, the
     * count of rows summed exactly (NULL: not counted) */
    const uint16_t *w16;
    int32_t *ids;
    lm_cuda_scr_fuse *fuse;
    int32_t *n_cand;
};

/* An order-preserving map of a float (not NaN) to a signed int, for atomicMax, and back
 * (scr_key(-inf) is LM_CUDA_SCR_KEY_NEG_INF). */
__device__ __forceinline__ int scr_key(float f) {
    const int i = __float_as_int(f);
    return i >= 0 ? i : i ^ 0x7fffffff;
}
__device__ __forceinline__ float scr_unkey(int k) { return __int_as_float(k >= 0 ? k : k ^ 0x7fffffff); }

/* A greedy (logit, id) as one 64-bit key whose unsigned order is the greedy order (am_better: the
 * larger logit, then the lower id; -0 as +0). v is not NaN. */
__device__ __forceinline__ unsigned long long scr_pick_key(float v, int j) {
    const unsigned u = (unsigned)scr_key(v + 0.f) ^ 0x80000000u;
    return (unsigned long long)u << 32 | (0xffffffffu - (unsigned)j);
}

/* Residual element j of a row plus the pending fixed-point term (add: NULL, or the row's),
 * read through L2: both are a predecessor's output. */
__device__ __forceinline__ float gemv_resid(const float *row, int j, const long long *add) {
    const float v = __ldcg(row + j);
    return add ? fix_add(v, __ldcg(add + j)) : v;
}

/* silu(g) * u with every operation rounded explicitly (SwiGLU, Shazeer 2020). */
__device__ __forceinline__ float swiglu_rn(float g, float u) {
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

/* Output j of a row: store, residual add, or SwiGLU of the pair (v, v_next) when r is even.
 * Explicitly rounded operations, so that no instantiation contracts them differently. */
template <int EPI>
__device__ __forceinline__ void gemv_store(float *yrow, int j, int M, float v, float v_next, int r,
                                           const long long *add) {
    if (EPI == LM_CUDA_EPI_STORE) {
        if (j < M) yrow[j] = v;
    } else if (EPI == LM_CUDA_EPI_ADD) {
        if (j < M) yrow[j] = __fadd_rn(gemv_resid(yrow, j, add), v);
    } else if ((r & 1) == 0 && j + 1 < M) {
        yrow[j >> 1] = swiglu_rn(v, v_next);
    }
}

/* a + the products of 8 bf16 weights q (elements e .. e + 7) with xa (e .. e + 3) and xb (e + 4 ..
 * e + 7), fused in element order */
__device__ __forceinline__ float bf16_fma8(float a, uint4 q, float4 xa, float4 xb) {
    a = fmaf(bf_lo(q.x), xa.x, a);
    a = fmaf(bf_hi(q.x), xa.y, a);
    a = fmaf(bf_lo(q.y), xa.z, a);
    a = fmaf(bf_hi(q.y), xa.w, a);
    a = fmaf(bf_lo(q.z), xb.x, a);
    a = fmaf(bf_hi(q.z), xb.y, a);
    a = fmaf(bf_lo(q.w), xb.z, a);
    return fmaf(bf_hi(q.w), xb.w, a);
}

/* acc[t][r] += the products of a lane's 8 bf16 weights of row r (q[r], elements c * 256 + lane * 8
 * .. + 7) with staged row t (xs: T rows of Kp floats at gemv_slot<8>), in element order: the
 * one summation order of every bf16 row sum (k_gemv, k_mlp1). */
template <int T, int R>
__device__ __forceinline__ void gemv_chunk_bf16(float (&acc)[T][R], const uint4 (&q)[R], const float4 *xs,
                                                int c, int Kp, int lane) {
    float4 xa[T], xb[T];
#pragma unroll
    for (int t = 0; t < T; t++) {
        xa[t] = xs[(t * Kp >> 2) + c * 64 + lane];
        xb[t] = xs[(t * Kp >> 2) + c * 64 + 32 + lane];
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < T; t++) acc[t][r] = bf16_fma8(acc[t][r], q[r], xa[t], xb[t]);
}

/* Row j of bf16 rows w (K of them, 16-byte aligned) times one staged row xs (x * norm_w at
 * gemv_slot<EL>: k_screen_pick's staging at EL 8, k_screen's at 16), summed as k_gemv sums a bf16
 * row (gemv_chunk_bf16's order, chunk by chunk, then warp_sum), times inv: the full lm_head's
 * logit, bit for bit. A group of up to 8 chunks' loads is issued before their sums. */
template <int EL>
__device__ __forceinline__ float gemv_row_bf16(const uint16_t *__restrict__ w, int j, int K, const float *xs,
                                               float inv, int lane) {
    constexpr int G = 8;
    const int nch = (K + 255) / 256;
    const float4 *x4 = reinterpret_cast<const float4 *>(xs);
    float a = 0.f;
    for (int c0 = 0; c0 < nch; c0 += G) {
        uint4 q[G];
#pragma unroll
        for (int c = 0; c < G; c++) {
            const int kk = (c0 + c) * 256 + lane * 8;
            q[c] = c0 + c < nch && kk < K ? ld_stream16(w + (size_t)j * K + kk) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int c = 0; c < G; c++) {
            if (c0 + c >= nch) break;
            const int kk = (c0 + c) * 256 + lane * 8;
            a = bf16_fma8(a, q[c], x4[gemv_slot<EL>(kk) >> 2], x4[gemv_slot<EL>(kk + 4) >> 2]);
        }
    }
    return __fmul_rn(warp_sum(a), inv);
}

/* ggml's Q8_0 scale of a block whose largest magnitude is amax (backend/cpu/quant.h
 * lm_q8_0_quantize_act): d = amax / 127; its quants are roundf(v * id) with id = 1 / d (0 for an
 * all-zero block). */
__device__ __forceinline__ float q8_scale(float amax, float *id) {
    const float d = __fdiv_rn(amax, 127.0f);
    *id = d != 0.f ? __fdiv_rn(1.0f, d) : 0.f;
    return d;
}
__device__ __forceinline__ int q8_round(float v, float id) { return (int)roundf(__fmul_rn(v, id)); }
__device__ __forceinline__ uint32_t q8_pack4(float a, float b, float c, float d, float id) {
    return (uint32_t)(q8_round(a, id) & 255) | (uint32_t)(q8_round(b, id) & 255) << 8 |
           (uint32_t)(q8_round(c, id) & 255) << 16 | (uint32_t)(q8_round(d, id) & 255) << 24;
}
/* s + the integer dot product of 16 int8 quants a and b (exact). */
__device__ __forceinline__ int dot16(uint4 a, uint4 b, int s) {
    s = __dp4a((int)a.x, (int)b.x, s);
    s = __dp4a((int)a.y, (int)b.y, s);
    s = __dp4a((int)a.z, (int)b.z, s);
    return __dp4a((int)a.w, (int)b.w, s);
}

/* The 16 staged elements of lane slot l of (row, chunk) tc (gemv_slot<16>; zeros unless in) into
 * v, and the largest magnitude of its 32-element block (the slot and its neighbour l ^ 1). */
__device__ __forceinline__ float gemv_slot_load(float4 (&v)[4], int tc, int l, bool in) {
    extern __shared__ float4 gemv_smem[];
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        v[i] = in ? gemv_smem[tc * 128 + i * 32 + l] : make_float4(0.f, 0.f, 0.f, 0.f);
        amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v[i].x), fabsf(v[i].y)), fmaxf(fabsf(v[i].z), fabsf(v[i].w))));
    }
    return fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
}

/* Calls f(v, tc, l, in, amax) for every lane slot of T staged rows (gemv_slot_load's values), a
 * thread a slot, whole warps at a time; no barrier. */
template <int T, class F>
__device__ __forceinline__ void gemv_for_slots(int nch, F &&f) {
    const int slots = T * nch * 32;
    for (int s0 = 0; s0 < slots; s0 += GEMV_THREADS) {
        const int si = s0 + threadIdx.x, tc = si >> 5, l = si & 31;
        const bool in = si < slots;
        float4 v[4];
        const float amax = gemv_slot_load(v, tc, l, in);
        f(v, tc, l, in, amax);
    }
}

/* GEMV_Q8: T staged rows (x * norm_w, gemv_slot<16> in gemv_smem) quantized to int8 per
 * 32-element block with ggml's rounding and float32 scales (q8_scale). One thread a lane slot of
 * 16 elements; the two slots of a block share their amax through one shuffle. xq: [T][nch][32
 * lanes] uint4 (a lane's 16 quants of a chunk), xd: [T][nch][16] scales. Slots come in whole
 * warps (32 a chunk). Ends with a block barrier. */
template <int T>
__device__ __forceinline__ void gemv_quant_x(uint4 *xq, float *xd, int nch) {
    gemv_for_slots<T>(nch, [&](const float4(&v)[4], int tc, int l, bool in, float amax) {
        if (in) {
            float id;
            const float d = q8_scale(amax, &id);
            uint32_t wq[4];
#pragma unroll
            for (int i = 0; i < 4; i++) wq[i] = q8_pack4(v[i].x, v[i].y, v[i].z, v[i].w, id);
            xq[tc * 32 + l] = make_uint4(wq[0], wq[1], wq[2], wq[3]);
            if (!(l & 1)) xd[tc * 16 + (l >> 1)] = d;
        }
    });
    __syncthreads();
}

/* k_screen: T staged rows (x * norm_w, gemv_slot<16>) quantized per 32-element block b to
 * integers P = round(s / u_b) with the unit u_b = (amax_b / 127, rounded up) / 254, so |P| <=
 * 32,259, split as P = 254 hi + lo with hi, lo in [-127, 127] (two int8 quants: xh, xl [T][nch][32
 * lanes] uint4; xu [T][nch][16] the units). P rounds s times 1 / u (both rounded to nearest: a
 * relative error under 2^-23 of s / u <= 32,259, 0.004 u), so s' = u P is within 0.51 u of s.
 * Also, per row t: s2[t] >= ||s||_2 and e2[t] >= ||s - s'||_2, each summed with upward rounding (a
 * block whose unit is below 2^-100 or not finite keeps P = 0 and counts all of s as error; part:
 * [T * nch][2] scratch). Ends with a block barrier. */
template <int T>
__device__ __forceinline__ void gemv_quant_screen(uint4 *xh, uint4 *xl, float *xu, float2 *part, int nch,
                                                  float (&s2)[T], float (&e2)[T], int *psum) {
    gemv_for_slots<T>(nch, [&](const float4(&v)[4], int tc, int l, bool in, float amax) {
        int ps = 0; /* the block's sum of P (psum) */
        float sq = 0.f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            sq = __fmaf_ru(v[i].x, v[i].x, sq);
            sq = __fmaf_ru(v[i].y, v[i].y, sq);
            sq = __fmaf_ru(v[i].z, v[i].z, sq);
            sq = __fmaf_ru(v[i].w, v[i].w, sq);
        }
        const float u = __fdiv_rn(__fdiv_ru(amax, 127.0f), 254.0f), ru = __frcp_rn(u);
        /* else P = 0 and the error is s itself; from 2^-100 up d_w u (d_w >= 2^-24) is no subnormal */
        const bool ok = u >= 0x1p-100f && u <= 3.0e38f && ru < INFINITY;
        float err = ok ? __fmul_ru(__fmul_ru(0.51f, u), __fmul_ru(0.51f, u)) * 16.0f : sq;
        if (in) {
            uint32_t hw[4], lw[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float e4[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
                uint32_t h = 0, lo = 0;
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int P = ok ? __float2int_rn(__fmul_rn(e4[e], ru)) : 0;
                    ps += P;
                    const int hi = P >= 0 ? (P + 127) / 254 : -((127 - P) / 254);
                    h |= (uint32_t)(hi & 255) << (8 * e);
                    lo |= (uint32_t)((P - 254 * hi) & 255) << (8 * e);
                }
                hw[i] = h, lw[i] = lo;
            }
            xh[tc * 32 + l] = make_uint4(hw[0], hw[1], hw[2], hw[3]);
            xl[tc * 32 + l] = make_uint4(lw[0], lw[1], lw[2], lw[3]);
            if (!(l & 1)) xu[tc * 16 + (l >> 1)] = u;
        }
        ps += __shfl_xor_sync(0xffffffffu, ps, 1); /* a warp is all in or all out (whole warps) */
        if (in && !(l & 1)) psum[tc * 16 + (l >> 1)] = ps;
        /* a whole warp is one (row, chunk): its sums, rounded up, to part[tc] */
#pragma unroll
        for (int o = 16; o; o >>= 1) {
            sq = __fadd_ru(sq, __shfl_xor_sync(0xffffffffu, sq, o));
            err = __fadd_ru(err, __shfl_xor_sync(0xffffffffu, err, o));
        }
        if (in && l == 0) part[tc] = make_float2(sq, err);
    });
    __syncthreads();
#pragma unroll
    for (int t = 0; t < T; t++) {
        float a = 0.f, b = 0.f;
        for (int c = 0; c < nch; c++) {
            const float2 p = part[t * nch + c];
            a = __fadd_ru(a, p.x), b = __fadd_ru(b, p.y);
        }
        s2[t] = __fsqrt_ru(a), e2[t] = __fsqrt_ru(b);
    }
}

/* A Q8_0 block's scaled integer dot product d * s in fixed point (lm_cuda_fix_io), rounded the one
 * way LM_CUDA_EPI_ADD_FIX and lm_cuda_mlp1_q8 both round it. */
__device__ __forceinline__ long long q8_fix(float d, int s) {
    return __float2ll_rn(__fmul_rn(__fmul_rn(d, __int2float_rn(s)), (float)LM_CUDA_FIX_ONE));
}

/* acc[t][r] += row r's half block in this lane's slot of chunk c (q[r]: 16 int8 quants, sc[r]:
 * their float16 scale) times staged row t's quants (xq, xd of gemv_quant_x): the integer dot
 * product (exact), then scaled into the float32 sum: the one order of every Q8_0 row sum
 * (k_gemv, k_mlp1). FX (LM_CUDA_EPI_ADD_FIX, acc int64): lanes 2i and 2i + 1 (one Q8_0 block)
 * join their dot products, and the even lane adds the block's in fixed point (q8_fix). */
template <int T, int R, bool FX, typename A>
__device__ __forceinline__ void gemv_chunk_q8(A (&acc)[T][R], const uint4 (&q)[R], const uint16_t (&sc)[R],
                                              const uint4 *xq, const float *xd, int c, int nch, int lane) {
    uint4 xv[T];
    float dx[T];
#pragma unroll
    for (int t = 0; t < T; t++) {
        xv[t] = xq[(t * nch + c) * 32 + lane];
        dx[t] = xd[(t * nch + c) * 16 + (lane >> 1)];
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        const float dw = __half2float(__ushort_as_half(sc[r]));
#pragma unroll
        for (int t = 0; t < T; t++) {
            int sdot = dot16(q[r], xv[t], 0);
            if constexpr (FX) {
                sdot += __shfl_xor_sync(0xffffffffu, sdot, 1);
                if (!(lane & 1)) acc[t][r] += q8_fix(__fmul_rn(dw, dx[t]), sdot);
            } else {
                acc[t][r] = fmaf(__fmul_rn(dw, dx[t]), __int2float_rn(sdot), acc[t][r]);
            }
        }
    }
}

/* The norm weights a thread multiplies its staged elements by (k = u * 256 + tid, the first NWP
 * chunks), into registers before the wait: they never depend on the predecessor, and a load into
 * a register does not stall the thread before its wait (v7's shared-memory stores did). Chunks
 * beyond NWP (hidden sizes over 1,024) load after the wait. */
template <int NWP>
__device__ __forceinline__ void gemv_norm_prefetch(float (&nwv)[NWP], const float *__restrict__ nw, int K) {
#pragma unroll
    for (int u = 0; u < NWP; u++) {
        const int k = u * 256 + threadIdx.x;
        nwv[u] = nw && k < K ? __ldg(nw + k) : 0.f;
    }
}

/* Stages T rows of x * norm_w (xadd: their pending fixed-point terms [T, K], or NULL; rows from
 * nrows on as zeros) in shared memory
 * at gemv_slot<EL> (the RMSNorm's 1/rms is applied to the sums at the end), each thread summing
 * the squares of its elements of x as it goes (in chunk order; then the warp's xor tree into
 * ss_part, then the 8 warps in order in gemv_inv: one order for every T, so 1 and n rows give the
 * same bits); ends with a block barrier. Element k = c * 256 + tid of each row: SU chunks of every
 * row are loaded into registers before any is stored, so the whole staging costs one L2 round trip
 * per SU chunks (x is a plain pointer the compiler must assume may alias shared memory: without
 * the explicit batch it would not move a load above the previous store). x is read through L2
 * (.cg), never the non-coherent path: under PDL this kernel runs while its predecessor writes x. */
template <int T, int EL, int NWP>
__device__ __forceinline__ void gemv_stage(float *xs, const float *x, int ldx, int K, int Kp,
                                           const float *__restrict__ nw, const float (&nwv)[NWP],
                                           const long long *xadd, float (&sq)[T],
                                           float (&ss_part)[T][GEMV_WARPS], int nrows) {
    constexpr int SU = T == 1 ? 16 : T <= 4 ? 8 : 4;
    const int n256 = Kp >> 8, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int t = 0; t < T; t++) sq[t] = 0.f;
    for (int c0 = 0; c0 < n256; c0 += SU) {
        float v[T][SU];
#pragma unroll
        for (int t = 0; t < T; t++)
#pragma unroll
            for (int u = 0; u < SU; u++) {
                const int k = (c0 + u) * 256 + threadIdx.x;
                v[t][u] = k >= K || t >= nrows ? 0.f
                          : xadd ? gemv_resid(x + (size_t)t * ldx, k, xadd + (size_t)t * K)
                                 : __ldcg(x + (size_t)t * ldx + k);
            }
#pragma unroll
        for (int t = 0; t < T; t++)
#pragma unroll
            for (int u = 0; u < SU; u++)
                if (c0 + u < n256) {
                    const int k = (c0 + u) * 256 + threadIdx.x;
                    float val = v[t][u];
                    if (nw) {
                        sq[t] = fmaf(val, val, sq[t]);
                        const float nk = c0 == 0 && u < NWP ? nwv[u < NWP ? u : 0] : (k < K ? __ldg(nw + k) : 0.f);
                        val = __fmul_rn(val, nk);
                    }
                    xs[t * Kp + gemv_slot<EL>(k)] = val;
                }
    }
    if (nw)
#pragma unroll
        for (int t = 0; t < T; t++) {
            const float w = warp_sum(sq[t]);
            if (lane == 0) ss_part[t][warp] = w;
        }
    __syncthreads();
}

/* 1 / rms of each staged row (1 without a norm), from gemv_stage's per-warp sums in warp order. */
template <int T>
__device__ __forceinline__ void gemv_inv(float (&inv)[T], const float (&ss_part)[T][GEMV_WARPS], int K,
                                         const float *nw, float eps) {
#pragma unroll
    for (int t = 0; t < T; t++) {
        inv[t] = 1.f;
        if (nw) {
            float ss = 0.f;
#pragma unroll
            for (int w = 0; w < GEMV_WARPS; w++) ss = __fadd_rn(ss, ss_part[t][w]);
            inv[t] = 1.0f / sqrtf(ss / (float)K + eps);
        }
    }
}

/* log2 of N rounded up to a power of 2 (N <= 32) */
template <int N>
__device__ constexpr int scr_log2() {
    return N <= 1 ? 0 : N <= 2 ? 1 : N <= 4 ? 2 : N <= 8 ? 3 : N <= 16 ? 4 : 5;
}

/* The most sums a warp of k_screen reduces and scatters (scr_reduce); more (2 or more activation
 * rows at 8 screen rows a warp, 3 or more at 4) take a warp_sum each, as 12 to 32 values held at
 * once spill to local memory. */
constexpr int SCR_SCATTER = 8;

/* k_screen: the warp's sums of its NV = T * R lane partials (acc), reduced and scattered: NV
 * padded to P = 2^L values, each step halves the values a lane holds (the lane whose offset bit
 * is set keeps the upper half) and adds its partner's, then the last 5 - L offsets sum the one
 * left: lane l returns the full sum of value l >> (5 - L) (P - 1 + 5 - L shuffles against warp_sum's
 * 5 NV; any order is good for the screen, whose bound covers 32-deep float32 rounding). */
template <int NV, int T, int R>
__device__ __forceinline__ float scr_reduce(const float (&acc)[T][R], int lane) {
    constexpr int L = scr_log2<NV>(), P = 1 << L;
    float v[P];
#pragma unroll
    for (int i = 0; i < P; i++) v[i] = i < NV ? acc[i / R][i % R] : 0.f;
#pragma unroll
    for (int n = P, o = 16; n > 1; n >>= 1, o >>= 1) {
        const bool hi = lane & o;
#pragma unroll
        for (int i = 0; i < n / 2; i++) {
            const float send = hi ? v[i] : v[i + n / 2], keep = hi ? v[i + n / 2] : v[i];
            v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
        }
    }
#pragma unroll
    for (int o = 16 >> L; o; o >>= 1) v[0] += __shfl_xor_sync(0xffffffffu, v[0], o);
    return v[0];
}

/* The row groups a warp of k_gemv or k_screen takes: strided over the whole grid. With dyn
 * (lm_cuda_ctx's gemv_dyn_rows), only the groups before dyn_from (gemv_deal_from: the first three
 * quarters of the rounds); the rest are dealt out in LM_CUDA_GEMV_CLASSES interleaved classes,
 * group dyn_from + j + C i being counter j's ticket i (the counters a 128-byte line each: one line
 * took every atomic to one L2 slice, 8 counters there made the lm_head 8 us slower, perf-notes
 * v27), and a warp of class j takes its next ticket as it starts a group, so that warps whose
 * memory came slower (a late start, a busier path) take fewer (perf-notes v27: the lm_head's last
 * block ended ~12 us after its median one). Each row's sums are the same whoever takes it. */
struct gemv_deal {
    unsigned *dyn;
    int dyn_from, end, stride, cls; /* every class has a warp when stride >= the classes */
    unsigned ticket;
    bool take;
    __device__ gemv_deal(unsigned *d, int from, int n_rg)
        : dyn(d), dyn_from(from), end(n_rg), stride(gridDim.x * GEMV_WARPS),
          cls((blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5)) % LM_CUDA_GEMV_CLASSES), ticket(0), take(false) {}
    /* As a warp starts group rg: the next one, the next round's, or a ticket whose atomic is
     * issued now and read at the end of this group by next() (its trip overlaps the weights'). */
    __device__ int start(int rg, int lane) {
        const int next = rg + stride;
        ticket = 0;
        take = dyn && next >= dyn_from;
        if (take && lane == 0) ticket = atomicAdd(dyn + cls * LM_CUDA_GEMV_CTR_STRIDE, 1u);
        return next;
    }
    __device__ int next(int next) const {
        if (!take) return next;
        const long long g = dyn_from + cls + (long long)LM_CUDA_GEMV_CLASSES * __shfl_sync(0xffffffffu, ticket, 0);
        return g < end ? (int)g : end;
    }
    /* The last block out puts the counters back to zero for the next launch (every warp's last
     * ticket was past the end before its block got here). */
    __device__ void finish() const {
        if (!dyn) return;
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            if (atomicAdd(dyn + LM_CUDA_GEMV_CLASSES * LM_CUDA_GEMV_CTR_STRIDE, 1u) == gridDim.x - 1) {
                for (int j = 0; j <= LM_CUDA_GEMV_CLASSES; j++) dyn[j * LM_CUDA_GEMV_CTR_STRIDE] = 0;
                __threadfence();
            }
        }
    }
};

/* T activation rows, R weight rows per warp, U chunks (of CH weights a warp, 512 bytes) loaded
 * per batch; F: the format (gemv_fmt): w is bf16, or int8 quants with ws their float16 scales. */
template <int T, int R, int U, int EPI, int F>
__global__ void __launch_bounds__(GEMV_THREADS, 2)
    k_gemv(float *y, int ldy, const float *x, int ldx, const void *__restrict__ w,
           const uint16_t *__restrict__ ws, int K, int M, const float *__restrict__ nw, float eps,
           gemv_fix fix, unsigned *dyn, int dyn_from, unsigned long long *trace) {
    static_assert(EPI != LM_CUDA_EPI_SWIGLU || R % 2 == 0, "SwiGLU needs row pairs");
    constexpr bool Q8 = F == GEMV_Q8, FX = EPI == LM_CUDA_EPI_ADD_FIX,
                   ADDY = EPI == LM_CUDA_EPI_ADD || FX;
    static_assert(!FX || Q8, "the fixed-point sum is over Q8_0 blocks");
    constexpr int EL = gemv_fmt<F>::EL, CH = gemv_fmt<F>::CH;
    extern __shared__ float4 gemv_smem[];
    float *xs = reinterpret_cast<float *>(gemv_smem);
    __shared__ float ss_part[T][GEMV_WARPS]; /* each warp's share of a row's sum of squares */
    const int nch = (K + CH - 1) / CH, Kp = nch * CH;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n_rg = (M + R - 1) / R;
    int rg = blockIdx.x * GEMV_WARPS + warp; /* this warp's row groups (gemv_deal) */
    gemv_deal deal(dyn, dyn_from, n_rg);
    uint4 wv[U][R];
    uint16_t sc[Q8 ? U : 1][Q8 ? R : 1]; /* Q8: the scale of each loaded half block */
    auto load = [&](int g, int c0) {
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++) {
                const int j = g * R + r, k = (c0 + u) * CH + lane * EL;
                const bool in = j < M && k < K;
                if constexpr (Q8) {
                    wv[u][r] = in ? ld_stream16((const int8_t *)w + (size_t)j * K + k) : make_uint4(0, 0, 0, 0);
                    sc[u][r] = in ? __ldg(ws + (size_t)j * (K >> 5) + (k >> 5)) : (uint16_t)0;
                } else {
                    wv[u][r] = in ? ld_stream16((const uint16_t *)w + (size_t)j * K + k) : make_uint4(0, 0, 0, 0);
                }
            }
    };
    /* The weights never depend on the previous kernel: start streaming them before waiting. */
    const unsigned long long t0 = trace ? gtime() : 0;
    if (rg < n_rg) load(rg, 0);
    constexpr int NWP = 4;
    float nwv[NWP];
    gemv_norm_prefetch(nwv, nw, K);
    float sq[T];
    pdl_wait();
    const unsigned long long t1 = trace ? gtime() : 0;
    if (fix.zero && blockIdx.x == 0)
        for (int i = threadIdx.x; i < fix.zero_n; i += GEMV_THREADS) fix.zero[i] = 0;
    /* The residual this lane adds to in its first row group, read in the same round trip as x
     * (not after the sums). Lane t * R + r owns output (t, row r of the group). */
    float yold = 0.f;
    if (ADDY && rg < n_rg && lane < T * R) {
        const int j = rg * R + lane % R;
        if (j < M) yold = gemv_resid(y + (size_t)(lane / R) * ldy, j, fix.add ? fix.add + (size_t)(lane / R) * M : NULL);
    }
    gemv_stage<T, EL>(xs, x, ldx, K, Kp, nw, nwv, ADDY ? NULL : fix.add, sq, ss_part, T);
    uint4 *xq = reinterpret_cast<uint4 *>(xs + T * Kp);
    float *xd = reinterpret_cast<float *>(reinterpret_cast<char *>(xq) + (size_t)T * Kp);
    if constexpr (Q8)
        gemv_quant_x<T>(xq, xd, nch);
    pdl_trigger(); /* the next kernel may start streaming its weights */
    const unsigned long long t2 = trace ? gtime() : 0;
    float inv[T];
    gemv_inv(inv, ss_part, K, nw, eps);

    bool have = rg < n_rg, first = true;
    for (int next; rg < n_rg; rg = deal.next(next)) {
        next = deal.start(rg, lane);
        float acc[T][R];
        long long accf[FX ? T : 1][FX ? R : 1]; /* LM_CUDA_EPI_ADD_FIX: the sums in fixed point */
#pragma unroll
        for (int t = 0; t < T; t++)
#pragma unroll
            for (int r = 0; r < R; r++) {
                acc[t][r] = 0.f;
                if constexpr (FX) accf[t][r] = 0;
            }
        for (int c0 = 0; c0 < nch; c0 += U) {
            if (!have) load(rg, c0);
            have = false;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = c0 + u;
                if (c >= nch) continue;
                if constexpr (FX) {
                    gemv_chunk_q8<T, R, true>(accf, wv[u], sc[u], xq, xd, c, nch, lane);
                } else if constexpr (Q8) {
                    gemv_chunk_q8<T, R, false>(acc, wv[u], sc[u], xq, xd, c, nch, lane);
                } else {
                    gemv_chunk_bf16<T, R>(acc, wv[u], gemv_smem, c, Kp, lane);
                }
            }
        }
        const int j0 = rg * R;
#pragma unroll
        for (int t = 0; t < T; t++)
#pragma unroll
            for (int r = 0; r < R; r++) {
                if constexpr (FX)
                    accf[t][r] = warp_sum(accf[t][r]);
                else
                    acc[t][r] = __fmul_rn(warp_sum(acc[t][r]), inv[t]);
            }
#pragma unroll
        for (int t = 0; t < T; t++)
#pragma unroll
            for (int r = 0; r < R; r++)
                if (lane == t * R + r) {
                    if constexpr (FX) {
                        if (j0 + r < M) {
                            const float yo = first ? yold : gemv_resid(y + (size_t)t * ldy, j0 + r,
                                                                       fix.add ? fix.add + (size_t)t * M : NULL);
                            y[(size_t)t * ldy + j0 + r] = fix_add(yo, accf[t][r]);
                        }
                    } else if (EPI == LM_CUDA_EPI_ADD && first) {
                        if (j0 + r < M) y[(size_t)t * ldy + j0 + r] = __fadd_rn(yold, acc[t][r]);
                    } else {
                        gemv_store<EPI>(y + (size_t)t * ldy, j0 + r, M, acc[t][r], acc[t][(r + 1) % R], r,
                                         fix.add ? fix.add + (size_t)t * M : NULL);
                    }
                }
        first = false;
    }
    deal.finish();
    if (trace && threadIdx.x == 0) trace_put(trace, w, K, M, blockIdx.x, t0, t1, t2);
}

template <int T, int R>
constexpr int gemv_u() {
    return T == 1 ? (R == 1 ? 12 : R == 2 ? 8 : 4) : T <= 2 ? 4 : 2;
}

/* Dynamic shared memory of k_gemv in format F: T float32 activation rows of k rounded up to whole
 * chunks; GEMV_Q8 adds their int8 quants and a float32 scale per 32. */
template <int F>
__host__ __device__ size_t gemv_smem_bytes(int T, int k) {
    constexpr int ch = gemv_fmt<F>::CH;
    const size_t kp = (size_t)(k + ch - 1) / ch * ch;
    return (size_t)T * kp * sizeof(float) + (F == GEMV_Q8 ? (size_t)T * (kp + kp / 32 * sizeof(float)) : 0);
}

/* The weights of one launch: bf16 rows (ws NULL), or Q8_0 quants and scales. */
struct gemv_w {
    const void *w;
    const uint16_t *ws;
};

/* ---- the decode MLP as one kernel (lm_cuda_mlp1, lm_cuda_mlp1_q8) ---- */

/* Q8_0: the down_proj rows a thread of k_mlp1 owns (4 at most, 256 apart, rotated per block),
 * whose scales it holds in registers: hidden sizes up to 4 x 256. */
constexpr int MLP1_Q8_ROWS = 4;

/* Dynamic shared memory of k_mlp1 in format F: T staged rows of x (gemv_smem_bytes), then the
 * block's gate/up rows [2 * NJ, k] and down_proj columns [k, NJ] (bf16, or Q8_0 quants), then for
 * Q8_0 the gate/up rows' float16 scales [2 * NJ, k / 32]. */
template <int F>
size_t mlp1_smem_bytes(int T, int du, int k) {
    const size_t nj = 8 * (size_t)du, wb = F == GEMV_Q8 ? 1 : 2;
    return gemv_smem_bytes<F>(T, k) + 3 * nj * (size_t)k * wb + (F == GEMV_Q8 ? 2 * nj * (size_t)(k / 32) * 2 : 0);
}

/* T activation rows (rows from n on are zeros that nothing reads). Block b owns the NJ = 8 * DU
 * intermediate units i in [b * NJ, (b + 1) * NJ): its 2 * NJ consecutive rows of the interleaved
 * gate/up matrix and NJ columns of down_proj, copied into shared memory (cp.async, no
 * registers held): the gate/up rows before the wait, so that they stream while the preceding
 * o_proj finishes and the next kernel's blocks still fit beside this one; down_proj's columns
 * with them at 4 and 8 rows, after x is staged at 1 and 2 (late_down, perf-notes v17). Then warp w sums rows 2 * DU * w ..
 * 2 * DU * w + 2 * DU - 1 in k_gemv's order for format F (the same bits as its SwiGLU epilogue),
 * and thread t the down_proj rows t, t + 256, ... (rotated per block) over the block's units in
 * unit order, converts each activation row's sum to fixed point (Q8_0: the units quantized per
 * 32 as k_gemv quantizes its input, one integer dot product a block of 32, each block's product
 * converted on its own: q8_fix, as LM_CUDA_EPI_ADD_FIX) and adds it to acc with one 64-bit atomic:
 * integer addition, so the total does not depend on the order the blocks' atomics land in, nor
 * (every row's sums being its own) on T. Q8_0 scales: wgu_s [2 * I, K / 32], wd_s [K, I / 32]. */
template <int T, int DU, int F>
__global__ void __launch_bounds__(GEMV_THREADS, 1)
    k_mlp1(long long *acc, const float *x, int n, const void *__restrict__ wgu, const uint16_t *__restrict__ wgu_s,
           const void *__restrict__ wd, const uint16_t *__restrict__ wd_s, int K, int I,
           const float *__restrict__ nw, float eps, unsigned long long *trace) {
    constexpr bool Q8 = F == GEMV_Q8;
    /* At 1 and 2 rows, down_proj's columns are copied only after x is staged (v17): the copies
     * issued before the wait hold the block back from its wait (their issue stalls once the
     * memory pipeline is full), and gate/up's rows, needed first, land sooner without them. At 4
     * and 8 rows the gate/up products take long enough that the early copies cost nothing: -3%
     * at 4 rows when late. */
    constexpr bool late_down = T <= 2;
    constexpr int R = 2 * DU, NJ = 8 * DU, EL = gemv_fmt<F>::EL, CH = gemv_fmt<F>::CH, WB = Q8 ? 1 : 2;
    constexpr int NB = Q8 ? NJ / 32 : 1; /* Q8_0 blocks in a down_proj row's NJ columns */
    constexpr int PR = NJ * WB / 16;     /* 16-byte pieces of them */
    static_assert(!Q8 || NJ % 32 == 0, "Q8_0 units come in whole blocks of 32");
    extern __shared__ float4 gemv_smem[];
    __shared__ float ss_part[T][GEMV_WARPS];
    __shared__ float hs[T][NJ];
    [[maybe_unused]] __shared__ __align__(16) int8_t hq[Q8 ? T : 1][Q8 ? NJ : 16];
    [[maybe_unused]] __shared__ float hd[Q8 ? T : 1][NB];
    const int nch = (K + CH - 1) / CH, Kp = nch * CH, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int i0 = blockIdx.x * NJ;
    /* Thread t's j-th down_proj row is (t + 256 j + rot) % K, rot = 64 x the block's index: blocks
     * that finish together then add into different L2 lines (one order for all made the 128
     * blocks' atomics meet 16 lines at a time; v15: +2% at batch 2 and 4, +0.5% at 1) */
    const int rot = (int)(((long long)blockIdx.x * 64) % K);
    auto rrow = [&](int j) { return j + rot < K ? j + rot : j + rot - K; };
    float *xs = reinterpret_cast<float *>(gemv_smem);
    uint4 *xq = reinterpret_cast<uint4 *>(xs + T * Kp); /* Q8_0: x's quants and scales */
    float *xd = reinterpret_cast<float *>(reinterpret_cast<char *>(xq) + (size_t)T * Kp);
    char *wg = reinterpret_cast<char *>(gemv_smem) + gemv_smem_bytes<F>(T, K); /* [2 * NJ][K] */
    char *wdn = wg + (size_t)2 * NJ * K * WB;                                  /* [K][NJ] */
    const uint16_t *gsc = reinterpret_cast<const uint16_t *>(wdn + (size_t)K * NJ * WB);
    const unsigned long long t0 = trace ? gtime() : 0;
    auto copy_down = [&] {
        for (int i = threadIdx.x; i < K * PR; i += GEMV_THREADS) {
            const int row = i / PR, d = i % PR;
            cp_async16(wdn + ((size_t)row * NJ * WB + d * 16),
                       static_cast<const char *>(wd) + ((size_t)row * I + i0) * WB + d * 16);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    {
        const char *g = static_cast<const char *>(wgu) + (size_t)2 * i0 * K * WB; /* contiguous rows */
        for (int i = threadIdx.x; i < 2 * NJ * K * WB / 16; i += GEMV_THREADS) cp_async16(wg + i * 16, g + i * 16);
        if constexpr (Q8) {
            const char *s = reinterpret_cast<const char *>(wgu_s + (size_t)2 * i0 * (K / 32));
            for (int i = threadIdx.x; i < 2 * NJ * (K / 32) * 2 / 16; i += GEMV_THREADS)
                cp_async16((char *)gsc + i * 16, s + i * 16);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
        if constexpr (!late_down) copy_down();
    }
    /* Q8_0: this thread's down_proj scales (2 bytes each, strided: no cp.async) into registers */
    [[maybe_unused]] uint16_t dsc[Q8 ? MLP1_Q8_ROWS : 1][NB];
    if constexpr (Q8) {
#pragma unroll
        for (int i = 0; i < MLP1_Q8_ROWS; i++) {
            const int row = threadIdx.x + i * GEMV_THREADS;
#pragma unroll
            for (int d = 0; d < NB; d++)
                dsc[i][d] = row < K ? __ldg(wd_s + (size_t)rrow(row) * (I / 32) + i0 / 32 + d) : 0;
        }
    }
    pdl_trigger(); /* the next kernel's blocks may start (and stream their weights) beside these */
    constexpr int NWP = 4;
    float nwv[NWP], sq[T], inv[T];
    gemv_norm_prefetch(nwv, nw, K);
    pdl_wait();
    const unsigned long long t1 = trace ? gtime() : 0;
    gemv_stage<T, EL>(xs, x, K, K, Kp, nw, nwv, NULL, sq, ss_part, n);
    if constexpr (Q8) gemv_quant_x<T>(xq, xd, nch);
    gemv_inv(inv, ss_part, K, nw, eps);
    if constexpr (late_down) copy_down();
    asm volatile("cp.async.wait_group 1;" ::: "memory"); /* gate/up's rows (the older group) landed */
    __syncthreads();
    const unsigned long long t2 = trace ? gtime() : 0;
    float a[T][R];
#pragma unroll
    for (int t = 0; t < T; t++)
#pragma unroll
        for (int r = 0; r < R; r++) a[t][r] = 0.f;
    for (int c = 0; c < nch; c++) {
        const int k0 = c * CH + lane * EL;
        if constexpr (Q8) {
            /* a slot past k adds dw * dx * 0 with dw = 0, as k_gemv's zero loads do */
            uint4 q[R];
            uint16_t sc[R];
#pragma unroll
            for (int r = 0; r < R; r++) {
                const int row = warp * R + r;
                q[r] = k0 < K ? *reinterpret_cast<const uint4 *>(wg + (size_t)row * K + k0) : make_uint4(0, 0, 0, 0);
                sc[r] = k0 < K ? gsc[(size_t)row * (K / 32) + (k0 >> 5)] : (uint16_t)0;
            }
            gemv_chunk_q8<T, R, false>(a, q, sc, xq, xd, c, nch, lane);
        } else {
            if (k0 >= K) break; /* a lane's 8 weights are all in or all out */
            uint4 q[R];
#pragma unroll
            for (int r = 0; r < R; r++)
                q[r] = *reinterpret_cast<const uint4 *>(wg + ((size_t)(warp * R + r) * K + k0) * 2);
            gemv_chunk_bf16<T, R>(a, q, gemv_smem, c, Kp, lane);
        }
    }
#pragma unroll
    for (int t = 0; t < T; t++)
#pragma unroll
        for (int r = 0; r < R; r++) a[t][r] = __fmul_rn(warp_sum(a[t][r]), inv[t]);
    if (lane == 0)
#pragma unroll
        for (int t = 0; t < T; t++)
#pragma unroll
            for (int i = 0; i < DU; i++) hs[t][warp * DU + i] = swiglu_rn(a[t][2 * i], a[t][2 * i + 1]);
    cp_async_wait_all(); /* down_proj's columns landed */
    __syncthreads();
    if constexpr (Q8) { /* warp t quantizes row t's units per 32, as gemv_quant_x does */
        if (warp < T) {
#pragma unroll
            for (int d = 0; d < NB; d++) {
                const float v = hs[warp][d * 32 + lane];
                float id;
                const float s = q8_scale(warp_max(fabsf(v)), &id);
                hq[warp][d * 32 + lane] = (int8_t)q8_round(v, id);
                if (lane == 0) hd[warp][d] = s;
            }
        }
        __syncthreads();
    }
    unsigned long long *acc_u = reinterpret_cast<unsigned long long *>(acc);
    auto add = [&](int row, const long long (&v)[T]) {
#pragma unroll
        for (int t = 0; t < T; t++)
            if (t < n) atomicAdd(acc_u + (size_t)t * K + row, (unsigned long long)v[t]);
    };
    if constexpr (Q8) {
#pragma unroll
        for (int i = 0; i < MLP1_Q8_ROWS; i++) {
            const int j = threadIdx.x + i * GEMV_THREADS;
            if (j >= K) break;
            const int row = rrow(j);
            long long v[T]; /* each block's product in fixed point, as LM_CUDA_EPI_ADD_FIX sums them */
#pragma unroll
            for (int t = 0; t < T; t++) v[t] = 0;
#pragma unroll
            for (int d = 0; d < NB; d++) {
                const uint4 w0 = *reinterpret_cast<const uint4 *>(wdn + (size_t)row * NJ + d * 32);
                const uint4 w1 = *reinterpret_cast<const uint4 *>(wdn + (size_t)row * NJ + d * 32 + 16);
                const float dw = __half2float(__ushort_as_half(dsc[i][d]));
#pragma unroll
                for (int t = 0; t < T; t++) {
                    const uint4 h0 = *reinterpret_cast<const uint4 *>(&hq[t][d * 32]);
                    const uint4 h1 = *reinterpret_cast<const uint4 *>(&hq[t][d * 32 + 16]);
                    v[t] += q8_fix(__fmul_rn(dw, hd[t][d]), dot16(w1, h1, dot16(w0, h0, 0)));
                }
            }
            add(row, v);
        }
    } else {
        const uint16_t *wdb = reinterpret_cast<const uint16_t *>(wdn);
        for (int j = threadIdx.x; j < K; j += GEMV_THREADS) {
            const int row = rrow(j);
            float v[T];
#pragma unroll
            for (int t = 0; t < T; t++) v[t] = 0.f;
#pragma unroll
            for (int d = 0; d < DU; d++) {
                const uint4 w = *reinterpret_cast<const uint4 *>(wdb + row * NJ + d * 8);
                const float f[8] = {bf_lo(w.x), bf_hi(w.x), bf_lo(w.y), bf_hi(w.y),
                                    bf_lo(w.z), bf_hi(w.z), bf_lo(w.w), bf_hi(w.w)};
#pragma unroll
                for (int e = 0; e < 8; e++)
#pragma unroll
                    for (int t = 0; t < T; t++) v[t] = fmaf(f[e], hs[t][d * 8 + e], v[t]);
            }
            long long vf[T];
#pragma unroll
            for (int t = 0; t < T; t++) vf[t] = __float2ll_rn(__fmul_rn(v[t], (float)LM_CUDA_FIX_ONE));
            add(row, vf);
        }
    }
    if (trace && threadIdx.x == 0) trace_put(trace, wgu, K, 2 * I, blockIdx.x, t0, t1, t2);
}

/* DU of k_mlp1 in format F for this shape on c's device: the smallest built one (Q8_0: whole
 * blocks of 32 units) whose grid (inter / (8 * DU) blocks) fits one block a multiprocessor and
 * whose shared memory (at the most rows) fits a block (200 KiB, and the device's opt-in limit less
 * the static 4 KiB), or 0. */
template <int F>
int mlp1_du(const lm_cuda_ctx *c, int k, int inter) {
    if (k < 8 || k % 8 || inter < 8) return 0;
    if (F == GEMV_Q8 && (k % 32 || k > MLP1_Q8_ROWS * GEMV_THREADS)) return 0;
    const size_t limit = std::min<size_t>(200 * 1024, c->smem_optin > 4096 ? (size_t)c->smem_optin - 4096 : 0);
    static const int dus[] = {1, 2, 3, 4, 6, 8};
    for (int du : dus) {
        if (F == GEMV_Q8 && du % 4) continue;
        if (inter % (8 * du) == 0 && inter / (8 * du) <= c->sm_count)
            return mlp1_smem_bytes<F>(LM_CUDA_MLP1_MAX_ROWS, du, k) <= limit ? du : 0;
    }
    return 0;
}

template <int DU, int F>
cudaError_t launch_mlp1(const lm_cuda_ctx *c, long long *acc, const float *x, int n, gemv_w gu, gemv_w dn,
                        int k, int inter, const float *nw, float eps) {
    static_assert(LM_CUDA_MLP1_MAX_ROWS == 8, "k_mlp1 is built for 1, 2, 4 and 8 rows");
    auto fn = n <= 1 ? k_mlp1<1, DU, F> : n <= 2 ? k_mlp1<2, DU, F> : n <= 4 ? k_mlp1<4, DU, F> : k_mlp1<8, DU, F>;
    const size_t smem = mlp1_smem_bytes<F>(n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : 8, DU, k);
    lm_cuda_occupancy((const void *)fn, GEMV_THREADS, smem); /* raises the shared-memory limit */
    return lm_launch(c, dim3(inter / (8 * DU)), dim3(GEMV_THREADS), smem, fn, acc, x, n, gu.w, gu.ws, dn.w,
                     dn.ws, k, inter, nw, eps, c->trace);
}

/* Both formats' entry (cuda.h lm_cuda_mlp1, lm_cuda_mlp1_q8). */
template <int F>
lm_status mlp1_run(lm_cuda_ctx *c, int64_t *acc, const float *x, int n, gemv_w gu, gemv_w dn, int k,
                   int inter, const float *norm_w, float eps) {
    const int du = mlp1_du<F>(c, k, inter);
    const bool q8 = F == GEMV_Q8;
    const bool aligned = !((uintptr_t)gu.w & 15) && !((uintptr_t)dn.w & 15) && !((uintptr_t)acc & 7) &&
                         (!q8 || (!((uintptr_t)gu.ws & 15) && !((uintptr_t)dn.ws & 1)));
    if (!du || n < 1 || n > LM_CUDA_MLP1_MAX_ROWS || !aligned)
        return lm_errorf(LM_ERR_SHAPE,
                         "CUDA mlp1%s: %d rows, hidden %d, intermediate %d: needs 1 to %d rows, a hidden "
                         "size a multiple of %s, an intermediate size of 8 x du x at most %d blocks "
                         "(du %s) whose weights fit a block's shared memory, 16-byte aligned weights%s "
                         "and an 8-byte aligned accumulator",
                         q8 ? " (Q8_0)" : "", n, k, inter, LM_CUDA_MLP1_MAX_ROWS,
                         q8 ? "32 up to 1,024" : "8", c->sm_count, q8 ? "4 or 8" : "1, 2, 3, 4, 6 or 8",
                         q8 ? ", 16-byte aligned gate/up scales, 2-byte aligned down_proj scales" : "");
    long long *a = (long long *)acc;
    cudaError_t e;
    if constexpr (F == GEMV_Q8) {
        e = du == 4 ? launch_mlp1<4, F>(c, a, x, n, gu, dn, k, inter, norm_w, eps)
                    : launch_mlp1<8, F>(c, a, x, n, gu, dn, k, inter, norm_w, eps);
    } else {
        switch (du) {
        case 1: e = launch_mlp1<1, F>(c, a, x, n, gu, dn, k, inter, norm_w, eps); break;
        case 2: e = launch_mlp1<2, F>(c, a, x, n, gu, dn, k, inter, norm_w, eps); break;
        case 3: e = launch_mlp1<3, F>(c, a, x, n, gu, dn, k, inter, norm_w, eps); break;
        case 4: e = launch_mlp1<4, F>(c, a, x, n, gu, dn, k, inter, norm_w, eps); break;
        case 6: e = launch_mlp1<6, F>(c, a, x, n, gu, dn, k, inter, norm_w, eps); break;
        default: e = launch_mlp1<8, F>(c, a, x, n, gu, dn, k, inter, norm_w, eps); break;
        }
    }
    return e == cudaSuccess ? LM_OK : lm_cuda_fail(e, "mlp1 launch");
}

/* The first row group k_gemv deals out from counters for a launch of `grid` blocks over n_rg row
 * groups (perf-notes v27): the first group of the last quarter of its rounds; n_rg (none) when the
 * launch is under the context's gemv_dyn_rows, has fewer than 4 rounds to balance, or has fewer
 * warps than counter classes (a class without a warp would leave its groups undone). */
static int gemv_deal_from(const lm_cuda_ctx *c, int m, int n_rg, int grid) {
    const int stride = grid * GEMV_WARPS, rounds = n_rg / stride;
    if (c->gemv_dyn_rows <= 0 || m < c->gemv_dyn_rows || rounds < 4 || stride < LM_CUDA_GEMV_CLASSES) return n_rg;
    return rounds * 3 / 4 * stride;
}

/* The launch of kernel fn (k_gemv, k_screen) over m rows in groups of R: its grid (a warp a row
 * group, at most the blocks that fit at once), and the counters and first dealt group of its row
 * dealing (gemv_deal; dyn NULL: none). */
struct gemv_plan {
    int grid, dyn_from;
    unsigned *dyn;
};
static gemv_plan gemv_plan_for(const lm_cuda_ctx *c, const void *fn, size_t smem, int m, int R) {
    const int n_rg = (m + R - 1) / R;
    const int need = (n_rg + GEMV_WARPS - 1) / GEMV_WARPS;
    const int cap = lm_cuda_occupancy(fn, GEMV_THREADS, smem) * c->sm_count;
    gemv_plan p;
    p.grid = need < cap ? need : cap;
    p.dyn_from = gemv_deal_from(c, m, n_rg, p.grid);
    p.dyn = p.dyn_from < n_rg ? c->gemv_ctr : nullptr;
    if (p.dyn) c->gemv_dealt++;
    return p;
}

template <int T, int R, int U, int EPI, int F>
cudaError_t launch_gemv_u(const lm_cuda_ctx *c, float *y, int ldy, const float *x, int ldx,
                          gemv_w w, int k, int m, const float *nw, float eps, gemv_fix fix) {
    auto fn = k_gemv<T, R, U, EPI, F>;
    const size_t smem = gemv_smem_bytes<F>(T, k);
    const gemv_plan p = gemv_plan_for(c, (const void *)fn, smem, m, R);
    return lm_launch(c, dim3(p.grid), dim3(GEMV_THREADS), smem, fn, y, ldy, x, ldx, w.w, w.ws, k, m, nw,
                     eps, fix, p.dyn, p.dyn_from, c->trace);
}

template <int T, int R, int EPI, int F>
cudaError_t launch_gemv(const lm_cuda_ctx *c, float *y, int ldy, const float *x, int ldx, gemv_w w,
                        int k, int m, const float *nw, float eps, gemv_fix fix) {
    return launch_gemv_u<T, R, gemv_u<T, R>(), EPI, F>(c, y, ldy, x, ldx, w, k, m, nw, eps, fix);
}

template <int T, int EPI, int F>
cudaError_t gemv_rows_dispatch(const lm_cuda_ctx *c, int R, float *y, int ldy, const float *x,
                               int ldx, gemv_w w, int k, int m, const float *nw, float eps, gemv_fix fix) {
    if constexpr (EPI == LM_CUDA_EPI_SWIGLU) {
        if constexpr (T == 1)
            if (R == 4) return launch_gemv<T, 4, EPI, F>(c, y, ldy, x, ldx, w, k, m, nw, eps, fix);
        return launch_gemv<T, 2, EPI, F>(c, y, ldy, x, ldx, w, k, m, nw, eps, fix);
    } else {
        if constexpr (T == 1)
            if (R == 4) return launch_gemv<T, 4, EPI, F>(c, y, ldy, x, ldx, w, k, m, nw, eps, fix);
        if (R == 1) return launch_gemv<T, 1, EPI, F>(c, y, ldy, x, ldx, w, k, m, nw, eps, fix);
        return launch_gemv<T, 2, EPI, F>(c, y, ldy, x, ldx, w, k, m, nw, eps, fix);
    }
}

/* go(std::integral_constant<int, T>) for the launch's T activation rows, 1 to 8 (more: 8). */
template <class G>
cudaError_t by_act_rows(int T, G &&go) {
    using std::integral_constant;
    switch (T) {
    case 1: return go(integral_constant<int, 1>{});
    case 2: return go(integral_constant<int, 2>{});
    case 3: return go(integral_constant<int, 3>{});
    case 4: return go(integral_constant<int, 4>{});
    case 5: return go(integral_constant<int, 5>{});
    case 6: return go(integral_constant<int, 6>{});
    case 7: return go(integral_constant<int, 7>{});
    default: return go(integral_constant<int, 8>{});
    }
}

template <int EPI, int F>
cudaError_t gemv_dispatch(const lm_cuda_ctx *c, int T, int R, float *y, int ldy, const float *x,
                          int ldx, gemv_w w, int k, int m, const float *nw, float eps, gemv_fix fix) {
    return by_act_rows(T, [&](auto t) {
        return gemv_rows_dispatch<decltype(t)::value, EPI, F>(c, R, y, ldy, x, ldx, w, k, m, nw, eps, fix);
    });
}

/* Both formats' entry: rows 8 at a time (fewer when k needs more shared memory). */
template <int F>
lm_status gemv_run(struct lm_cuda_ctx *c, float *y, int ldy, const float *x, int ldx, gemv_w w, int n,
                   int k, int m, const float *norm_w, float eps, enum lm_cuda_epilogue epi,
                   const lm_cuda_fix_io *fio) {
    if (epi == LM_CUDA_EPI_SWIGLU && m % 2)
        return lm_errorf(LM_ERR_SHAPE, "CUDA gemv: SwiGLU needs an even number of rows, not %d", m);
    if (epi == LM_CUDA_EPI_ADD_FIX && (F != GEMV_Q8 || norm_w))
        return lm_errorf(LM_ERR_SHAPE, "CUDA gemv: the fixed-point residual add sums Q8_0 blocks: "
                         "lm_cuda_gemv_q8 without a norm only");
    gemv_fix fix = {NULL, NULL, 0};
    if (fio) {
        if (fio->add && epi == LM_CUDA_EPI_SWIGLU)
            return lm_errorf(LM_ERR_SHAPE, "CUDA gemv: a pending fixed-point residual needs a store "
                             "or add epilogue, not SwiGLU");
        if (fio->zero_n < 0 || (fio->zero_n && !fio->zero))
            return lm_errorf(LM_ERR_SHAPE, "CUDA gemv: zero_n = %d without a buffer", fio->zero_n);
        fix = gemv_fix{(const long long *)fio->add, (long long *)fio->zero, fio->zero_n};
    }
    /* Rows per warp: 2 when that still gives every multiprocessor a block, else 1 (v1 measured 1
     * best at batch 1 for every matrix of Qwen3-0.6B). */
    int R = c->gemv_rows;
    if (!R) R = m >= 2 * GEMV_WARPS * c->sm_count ? 2 : 1;
    /* Q8_0 rows are half the bytes: 4 rows a warp where that still gives every multiprocessor a
     * block keeps as many bytes in flight a warp as bf16's 2 (v11: at 2 rows, gate/up and the
     * lm_head, whose warps loop over several row groups, were slower than bf16). */
    if (F == GEMV_Q8 && !c->gemv_rows && m >= 4 * GEMV_WARPS * c->sm_count) R = 4;
    /* Activation rows per launch: at most 8, and few enough for 200 KiB of shared memory. */
    int per = (int)(200 * 1024 / gemv_smem_bytes<F>(1, k));
    if (per < 1) return lm_errorf(LM_ERR_SHAPE, "CUDA gemv: k = %d is too large", k);
    if (per > 8) per = 8;
    for (int t0 = 0; t0 < n; t0 += per) {
        const int T = n - t0 < per ? n - t0 : per;
        const float *xt = x + (size_t)t0 * ldx;
        float *yt = y + (size_t)t0 * ldy;
        gemv_fix ft = fix; /* the pending terms of these rows: [n, k] for x, [n, m] for y */
        if (ft.add) ft.add += (size_t)t0 * (epi == LM_CUDA_EPI_ADD || epi == LM_CUDA_EPI_ADD_FIX ? m : k);
        cudaError_t e;
        switch (epi) {
        case LM_CUDA_EPI_STORE:
            e = gemv_dispatch<LM_CUDA_EPI_STORE, F>(c, T, R, yt, ldy, xt, ldx, w, k, m, norm_w, eps, ft);
            break;
        case LM_CUDA_EPI_ADD:
            e = gemv_dispatch<LM_CUDA_EPI_ADD, F>(c, T, R, yt, ldy, xt, ldx, w, k, m, norm_w, eps, ft);
            break;
        case LM_CUDA_EPI_ADD_FIX:
            if constexpr (F == GEMV_Q8)
                e = gemv_dispatch<LM_CUDA_EPI_ADD_FIX, F>(c, T, R, yt, ldy, xt, ldx, w, k, m, norm_w, eps, ft);
            else
                e = cudaErrorInvalidValue; /* refused above */
            break;
        default:
            e = gemv_dispatch<LM_CUDA_EPI_SWIGLU, F>(c, T, R, yt, ldy, xt, ldx, w, k, m, norm_w, eps, ft);
            break;
        }
        if (e != cudaSuccess) return lm_cuda_fail(e, "gemv launch");
        fix.zero = NULL, fix.zero_n = 0;
    }
    return LM_OK;
}

/* ---- the exact greedy choice from a 6-bit screen of the lm_head (lm_cuda_gemv_screen) ---- */

/* The screen's layout (lm_cuda_screen_build): three planes over the m rows of nb = k / 32 blocks,
 * 26 bytes a 32-weight block: the low nibbles [m][nb] uint4, the high bits [m][nb] uint2, the
 * scales [m][nb] float16 (perf-notes v40: 8-row groups stored together, one stream a warp instead
 * of three, were 0.3% slower at batch 1 and ~2% at 2-4). Block b of row j holds q = round(w / d)
 * in [-31, 31] with d its amax / 31 rounded up to float16, offset to u = q + 32 in 1..63: nibble
 * word i byte e = (u[8i + e] & 15) | (u[8i + 4 + e] & 15) << 4, high word h byte e bits 2s, 2s + 1 =
 * u[16h + 4s + e] >> 4. */
constexpr int SCR_BLOCK_BYTES = 26;

/* Byte offsets of row j's block b in a screen of m rows of nb blocks: its nibbles, high bits, scale. */
struct scr_at {
    size_t n, h, s;
};
__device__ __forceinline__ scr_at scr_offsets(int m, int nb, int j, int b) {
    const size_t o = (size_t)j * nb + b, plane = (size_t)m * nb;
    return {o * 16, plane * 16 + o * 8, plane * 24 + o * 2};
}

/* Builds the screen of bf16 rows w [m, k]: one warp a row, lane i the 32-weight blocks i, i + 32,
 * ...: d = amax / 31 rounded up to float16 (so no quant clips), q = round(w / d) (0 where d is 0);
 * ab[j] = (||w_j - q d||_2, ||w_j||_2), summed in double and rounded up. A block holding NaN or
 * infinity gives a NaN or infinite a_j or b_j: the screen then never rules that row out. */
__global__ void __launch_bounds__(GEMV_THREADS) k_screen_build(const uint16_t *__restrict__ w, int m, int k,
                                                               uint8_t *q, float2 *ab) {
    const int lane = threadIdx.x & 31, j = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (j >= m) return;
    const int nb = k / 32;
    double e2 = 0.0, b2 = 0.0;
    for (int b = lane; b < nb; b += 32) {
        const uint16_t *src = w + (size_t)j * k + b * 32;
        float v[32], amax = 0.f;
#pragma unroll
        for (int i = 0; i < 32; i++) {
            v[i] = bf2f(src[i]);
            amax = fmaxf(amax, fabsf(v[i]));
        }
        const __half dh = __float2half_ru(__fdiv_ru(amax, 31.0f));
        const float d = __half2float(dh);
        int u[32];
#pragma unroll
        for (int i = 0; i < 32; i++) {
            int qi = d > 0.f ? __float2int_rn(__fdiv_rn(v[i], d)) : 0;
            qi = qi > 31 ? 31 : qi < -31 ? -31 : qi;
            u[i] = qi + 32;
            const double err = (double)v[i] - (double)qi * (double)d;
            e2 += err * err;
            b2 += (double)v[i] * (double)v[i];
        }
        uint32_t n[4] = {0, 0, 0, 0}, h[2] = {0, 0};
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                n[i] |= (uint32_t)((u[8 * i + e] & 15) | (u[8 * i + 4 + e] & 15) << 4) << (8 * e);
#pragma unroll
        for (int hh = 0; hh < 2; hh++)
#pragma unroll
            for (int s4 = 0; s4 < 4; s4++)
#pragma unroll
                for (int e = 0; e < 4; e++) h[hh] |= (uint32_t)(u[16 * hh + 4 * s4 + e] >> 4) << (8 * e + 2 * s4);
        const scr_at at = scr_offsets(m, nb, j, b);
        *reinterpret_cast<uint4 *>(q + at.n) = make_uint4(n[0], n[1], n[2], n[3]);
        *reinterpret_cast<uint2 *>(q + at.h) = make_uint2(h[0], h[1]);
        *reinterpret_cast<uint16_t *>(q + at.s) = __half_as_ushort(dh);
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        e2 += __shfl_xor_sync(0xffffffffu, e2, o);
        b2 += __shfl_xor_sync(0xffffffffu, b2, o);
    }
    if (lane == 0)
        ab[j] = make_float2(__fmul_ru(__double2float_ru(sqrt(e2)), 1.000001f),
                            __fmul_ru(__double2float_ru(sqrt(b2)), 1.000001f));
}

/* Weights 4g .. 4g + 3 (g < 8) of a screen block as 4 offset bytes u (1..63), from its nibble and
 * high-bit words. */
__device__ __forceinline__ uint32_t scr_group(const uint4 &n, const uint2 &h, int g) {
    const uint32_t nw = g < 2 ? n.x : g < 4 ? n.y : g < 6 ? n.z : n.w, hw = g < 4 ? h.x : h.y;
    const uint32_t lo = (g & 1 ? nw >> 4 : nw) & 0x0F0F0F0Fu;
    const int s4 = g & 3;
    const uint32_t hi = (s4 == 0 ? hw << 4 : s4 == 1 ? hw << 2 : s4 == 2 ? hw : hw >> 2) & 0x30303030u;
    return lo | hi;
}

/* Staged activation row t's block b (gemv_quant_screen's layout: uint4s i0, i0 + 1 of xh and xl,
 * gemv_slot<16>'s two half blocks; its unit; 32 x its sum of P). */
struct scr_act {
    uint32_t h[8], l[8];
    float u;
    int pc;
};
__device__ __forceinline__ scr_act scr_act_at(const uint4 *xh, const uint4 *xl, const float *xu, const int *psum,
                                              int nch, int t, int b) {
    const int i0 = (t * nch + (b >> 4)) * 32 + 2 * (b & 15);
    const uint4 h0 = xh[i0], h1 = xh[i0 + 1], l0 = xl[i0], l1 = xl[i0 + 1];
    return {{h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w},
            {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w},
            xu[t * nch * 16 + b],
            32 * psum[t * nch * 16 + b]};
}

/* A block's integer sums against staged block a, 4 offset bytes u4 (scr_group's group g) at a
 * time: dh += u4 . hi, dl += u4 . lo. */
__device__ __forceinline__ void scr_dot(int u4, const scr_act &a, int g, int &dh, int &dl) {
    dh = __dp4a(u4, (int)a.h[g], dh);
    dl = __dp4a(u4, (int)a.l[g], dl);
}

/* acc + d_w u_b (q . P) from a block's sums (scr_dot over its 8 groups) and scale sc: 254 dh + dl -
 * 32 sum(P) = q . P, exact (|.| < 2^27), then one float32 rounding for the conversion, one for d_w
 * u_b and one for the fma (screen_rho's chain). */
__device__ __forceinline__ float scr_acc(float acc, int dh, int dl, const scr_act &a, uint16_t sc) {
    return fmaf(__fmul_rn(__half2float(__ushort_as_half(sc)), a.u), __int2float_rn(254 * dh + dl - a.pc), acc);
}

/* k_screen's staging chunk: x staged as the Q8_0 GEMV's (gemv_slot<16>, 512 elements a chunk), so
 * that gemv_quant_screen takes its slots as gemv_quant_x does. */
constexpr int SCR_CH = gemv_fmt<GEMV_Q8>::CH;

/* Dynamic shared memory of k_screen for T rows of k: the float32 staging (chunks of SCR_CH), two
 * int8 quants an element, a float32 unit and an int32 quant sum a block, two float32 partial
 * norms a chunk (gemv_quant_screen). */
static size_t screen_smem_bytes(int T, int k) {
    const size_t kp = (size_t)(k + SCR_CH - 1) / SCR_CH * SCR_CH;
    return (size_t)T * (kp * sizeof(float) + 2 * kp + kp / 32 * (sizeof(float) + sizeof(int)) + kp / SCR_CH * sizeof(float2));
}

/* The screen's upper bounds of T activation rows (lm_cuda_gemv_screen), R screen rows a warp, the
 * row groups dealt as k_gemv's (gemv_deal). x * norm_w is staged as
 * k_gemv's (gemv_stage, gemv_slot<16>) and quantized to two int8 levels a 32-block
 * (gemv_quant_screen: P = 254 hi + lo, with its unit and its block sums of P); a lane takes one
 * whole block of each of its R rows a chunk of 1,024 weights, and its integer dot product with a
 * staged row is 254 (u . hi) + (u . lo) - 32 sum(P) = q . P, exact (|.| < 2^27), times the block's
 * scale and unit into the lane's float32 sum. The warp's T * R sums are reduced and scattered
 * (scr_reduce) and the first lane of each bounds its row: U = L' + R_j rounded up is stored (+inf
 * where the sums could overflow), L' - R_j rounded down kept for the row's best lower bound, which
 * the block's warps meet into lmax by atomicMax (scr_key).
 * FU (one activation row, lm_cuda_screen_pick; perf-notes v43): the screen picks the id too. Each
 * warp publishes its lower bounds to lmax as it finds them (an atomicMax when one beats the best it
 * knows, else a read of lmax, folded in at its next group), keeps the rows whose upper bound is not
 * below what it knows (SCR_FCAP of them), and at its end sums those still not below it exactly
 * (gemv_row_bf16: the pick's bits); the blocks' bests meet in one 64-bit atomicMax (scr_pick_key),
 * and the last block writes the id, resets lmax and sets done, so that k_screen_pick returns at
 * once. A warp that met more rows than it keeps leaves the choice to k_screen_pick (ovf). */
constexpr int SCR_FCAP = 32; /* the candidates a warp of the one-row screen keeps (k_screen FU) */

template <int T, int R, bool TRACE, bool FU>
__global__ void __launch_bounds__(GEMV_THREADS, 2)
    k_screen(float *y, int ldy, const float *x, int ldx, const uint8_t *__restrict__ q, int K, int M,
             const float *__restrict__ nw, float eps, const long long *x_fix, unsigned *dyn, int dyn_from,
             gemv_scr scr, unsigned long long *trace) {
    const unsigned long long t0 = TRACE ? gtime() : 0;
    extern __shared__ float4 gemv_smem[];
    float *xs = reinterpret_cast<float *>(gemv_smem);
    __shared__ float ss_part[T][GEMV_WARPS];
    const int nch = (K + SCR_CH - 1) / SCR_CH, Kp = nch * SCR_CH, nb = K >> 5, nc = (nb + 31) >> 5;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n_rg = (M + R - 1) / R;
    int rg = blockIdx.x * GEMV_WARPS + warp;
    gemv_deal deal(dyn, dyn_from, n_rg);
    uint4 wn[R];
    uint2 wh[R];
    uint16_t sc[R];
    auto load = [&](int g, int c) {
        const int b = c * 32 + lane;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int j = g * R + r;
            const bool in = j < M && b < nb;
            const scr_at at = scr_offsets(M, nb, j, b);
            wn[r] = in ? ld_stream16(q + at.n) : make_uint4(0, 0, 0, 0);
            wh[r] = in ? ld_stream8(q + at.h) : make_uint2(0, 0);
            sc[r] = in ? __ldg(reinterpret_cast<const uint16_t *>(q + at.s)) : (uint16_t)0;
        }
    };
    /* the (a_j, b_j) of the row whose sum lane l holds in group g (scr_reduce: value l >>
     * SCR_SHIFT, row (l >> SCR_SHIFT) % R) */
    constexpr int SCR_SHIFT = T * R <= SCR_SCATTER ? 5 - scr_log2<T * R>() : 0;
    auto load_ab = [&](int g) {
        float2 v = make_float2(0.f, 0.f);
        const int idx = lane >> SCR_SHIFT;
        if (idx < T * R && g * R + idx % R < M) v = __ldg(scr.ab + g * R + idx % R);
        return v;
    };
    static_assert(!FU || T == 1, "the screen picks its own id for one activation row");
    /* FU: each warp's best lower bound known so far (its own, and the row's as last read: a read
     * or the atomicMax that publishes its own, issued at a group and folded in at the next), and
     * the rows whose upper bound was not below it when found (at most SCR_FCAP kept) */
    float kn = -INFINITY;
    int gpend = LM_CUDA_SCR_KEY_NEG_INF, fcn = 0;
    __shared__ int fc_j[FU ? GEMV_WARPS : 1][FU ? SCR_FCAP : 1];
    __shared__ float fc_u[FU ? GEMV_WARPS : 1][FU ? SCR_FCAP : 1];
    /* The screen never depends on the previous kernel: start streaming it before waiting. */
    if (rg < n_rg) load(rg, 0);
    float2 abv = load_ab(rg);
    float lbest = -INFINITY; /* the best lower bound of this lane's row */
    constexpr int NWP = 4;
    float nwv[NWP];
    gemv_norm_prefetch(nwv, nw, K);
    float sq[T];
    pdl_wait();
    /* FU: clear the flag the last pick read (it ended before the previous kernel did); the last
     * block sets it after every block's count, this one's among them */
    if constexpr (FU)
        if (blockIdx.x == 0 && threadIdx.x == 0) scr.fuse->done = 0;
    const unsigned long long t1 = TRACE ? gtime() : 0;
    gemv_stage<T, 16>(xs, x, ldx, K, Kp, nw, nwv, x_fix, sq, ss_part, T);
    const unsigned long long tx = TRACE ? gtime() : 0;
    uint4 *xq = reinterpret_cast<uint4 *>(xs + T * Kp);
    uint4 *xl = reinterpret_cast<uint4 *>(reinterpret_cast<char *>(xq) + (size_t)T * Kp);
    float *xu = reinterpret_cast<float *>(reinterpret_cast<char *>(xl) + (size_t)T * Kp);
    int *psum = reinterpret_cast<int *>(xu + T * Kp / 32);
    float2 *part = reinterpret_cast<float2 *>(psum + T * Kp / 32);
    float s2[T], e2[T];
    gemv_quant_screen<T>(xq, xl, xu, part, nch, s2, e2, psum);
    const unsigned long long t2 = TRACE ? gtime() : 0;
    pdl_trigger(); /* the next kernel may launch now */
    float inv[T];
    gemv_inv(inv, ss_part, K, nw, eps);

    bool first = true; /* the first group's first chunk came before the wait */
    for (int next; rg < n_rg; rg = deal.next(next)) {
        next = deal.start(rg, lane);
        if (!first) abv = load_ab(rg);
        float acc[T][R];
#pragma unroll
        for (int t = 0; t < T; t++)
#pragma unroll
            for (int r = 0; r < R; r++) acc[t][r] = 0.f;
        for (int c = 0; c < nc; c++) {
            if (!first || c) load(rg, c);
            const int b = c * 32 + lane;
            if (b >= nb) continue;
            if constexpr (T <= 2) { /* every row's activations held, each block unpacked in turn */
                scr_act a[T];
#pragma unroll
                for (int t = 0; t < T; t++) a[t] = scr_act_at(xq, xl, xu, psum, nch, t, b);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    int dh[T], dl[T];
#pragma unroll
                    for (int t = 0; t < T; t++) dh[t] = 0, dl[t] = 0;
#pragma unroll
                    for (int g = 0; g < 8; g++) {
                        const int u4 = (int)scr_group(wn[r], wh[r], g);
#pragma unroll
                        for (int t = 0; t < T; t++) scr_dot(u4, a[t], g, dh[t], dl[t]);
                    }
#pragma unroll
                    for (int t = 0; t < T; t++) acc[t][r] = scr_acc(acc[t][r], dh[t], dl[t], a[t], sc[r]);
                }
            } else { /* 3 or more rows: the blocks unpacked once, then each row's activations in
                      * turn (every row's at once spill) */
                uint32_t u[R][8];
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int g = 0; g < 8; g++) u[r][g] = scr_group(wn[r], wh[r], g);
#pragma unroll
                for (int t = 0; t < T; t++) {
                    const scr_act a = scr_act_at(xq, xl, xu, psum, nch, t, b);
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        int dh = 0, dl = 0;
#pragma unroll
                        for (int g = 0; g < 8; g++) scr_dot((int)u[r][g], a, g, dh, dl);
                        acc[t][r] = scr_acc(acc[t][r], dh, dl, a, sc[r]);
                    }
                }
            }
        }
        /* The T * R sums reduced and scattered over the warp: lane l holds value l >> SCR_SHIFT,
         * and the first lane of each group bounds its row (cuda.h lm_cuda_gemv_screen: |L' - L| <=
         * R_j). */
        const int j0 = rg * R;
        float sum = 0.f;
        if constexpr (T * R <= SCR_SCATTER) {
            sum = scr_reduce<T * R>(acc, lane);
        } else { /* every lane gets every sum; lane l keeps value l */
#pragma unroll
            for (int i = 0; i < T * R; i++) {
                const float v = warp_sum(acc[i / R][i % R]);
                if (lane == i) sum = v;
            }
        }
        const int idx = lane >> SCR_SHIFT, t = idx / R, r = idx % R;
        float invt = inv[0], s2t = s2[0], e2t = e2[0];
#pragma unroll
        for (int tt = 1; tt < T; tt++)
            if (t == tt) invt = inv[tt], s2t = s2[tt], e2t = e2[tt];
        const float a = abv.x, ab = __fadd_ru(abv.x, abv.y), se = __fadd_ru(s2t, e2t);
        const float d = __fadd_ru(__fadd_ru(__fadd_ru(__fmul_ru(a, s2t), __fmul_ru(ab, e2t)),
                                            __fmul_ru(__fmul_ru(2.0f * scr.rho, ab), se)),
                                  scr.tiny);
        const float rj = __fadd_ru(__fmul_ru(d, invt), 0x1p-148f), lj = __fmul_rn(sum, invt);
        /* a row whose sums could overflow in either kernel (a magnitude bound past 2^125, or NaN)
         * is never ruled out: U = +inf */
        const bool wide = !(__fmul_ru(__fmul_ru(ab, se), invt) < 0x1p+125f);
        const bool has = idx < T * R && !(lane & ((1 << SCR_SHIFT) - 1)) && j0 + r < M;
        const float uj = wide ? INFINITY : __fadd_ru(lj, rj), lo = has && !wide ? __fadd_rd(lj, -rj) : -INFINITY;
        if (has) y[(size_t)t * ldy + j0 + r] = uj;
        if constexpr (!FU) {
            lbest = fmaxf(lbest, lo);
        } else {
            kn = fmaxf(kn, scr_unkey(__shfl_sync(0xffffffffu, gpend, 0)));
            const float gb = warp_max(lo);
            if (lane == 0) gpend = gb > kn ? atomicMax(scr.lmax, scr_key(gb)) : __ldcg(scr.lmax);
            kn = fmaxf(kn, gb);
            const bool cand = has && !(uj < kn);
            const unsigned bal = __ballot_sync(0xffffffffu, cand);
            if (cand) {
                const int pos = fcn + __popc(bal & ((1u << lane) - 1));
                if (pos < SCR_FCAP) fc_j[warp][pos] = j0 + r, fc_u[warp][pos] = uj;
            }
            fcn += __popc(bal);
        }
        first = false;
    }
    if constexpr (!FU) {
        /* each row's best lower bound over the block, into its key */
        __shared__ float lb[GEMV_WARPS][T];
#pragma unroll
        for (int t = 0; t < T; t++) {
            const float v = warp_max((lane >> SCR_SHIFT) / R == t ? lbest : -INFINITY);
            if (lane == 0) lb[warp][t] = v;
        }
        __syncthreads();
        if (threadIdx.x < T) {
            float v = -INFINITY;
            for (int w2 = 0; w2 < GEMV_WARPS; w2++) v = fmaxf(v, lb[w2][threadIdx.x]);
            if (v > -INFINITY) atomicMax(scr.lmax + threadIdx.x, scr_key(v));
        }
    } else {
        /* Every lower bound this warp met is in the row's key (published, or below what was), so
         * kn <= the final best lower bound: a kept row below kn is no candidate, and every
         * candidate (upper bound not below the final one) was kept unless the warp overflowed.
         * The warp sums its candidates exactly, the block's best goes to the state's key, and the
         * last block writes the id (or, after an overflow, leaves the row to k_screen_pick). */
        kn = fmaxf(kn, scr_unkey(__shfl_sync(0xffffffffu, gpend, 0)));
        __syncwarp();
        float bv = -INFINITY;
        int bi = INT_MAX, summed = 0;
        for (int e = 0; e < min(fcn, SCR_FCAP); e++) {
            if (fc_u[warp][e] < kn) continue;
            const int j = fc_j[warp][e];
            const float v = gemv_row_bf16<16>(scr.w16, j, K, xs, inv[0], lane);
            summed++;
            if (v > -INFINITY && am_better(v, j, bv, bi)) bv = v, bi = j;
        }
        __shared__ float fsv[GEMV_WARPS];
        __shared__ int fsi[GEMV_WARPS], fsn[GEMV_WARPS], fso[GEMV_WARPS];
        if (lane == 0) fsv[warp] = bv, fsi[warp] = bi, fsn[warp] = summed, fso[warp] = fcn > SCR_FCAP;
        __syncthreads();
        if (threadIdx.x == 0) {
            int ovf = fso[0], nsum = fsn[0];
            for (int w2 = 1; w2 < GEMV_WARPS; w2++) {
                if (am_better(fsv[w2], fsi[w2], bv, bi)) bv = fsv[w2], bi = fsi[w2];
                ovf |= fso[w2], nsum += fsn[w2];
            }
            lm_cuda_scr_fuse *st = scr.fuse;
            if (bv > -INFINITY) atomicMax(&st->best, scr_pick_key(bv, bi));
            if (ovf) atomicOr(&st->ovf, 1);
            if (scr.n_cand && nsum) atomicAdd(scr.n_cand, nsum);
            __threadfence();
            if (atomicAdd(&st->count, 1u) == gridDim.x - 1) {
                __threadfence();
                const unsigned long long key = __ldcg(&st->best);
                if (!__ldcg(&st->ovf)) {
                    scr.ids[0] = key ? (int)(0xffffffffu - (unsigned)(key & 0xffffffffu)) : 0;
                    scr.lmax[0] = LM_CUDA_SCR_KEY_NEG_INF;
                    st->done = 1;
                }
                st->best = 0, st->count = 0, st->ovf = 0;
            }
        }
    }
    deal.finish();
    if (TRACE && threadIdx.x == 0)
        trace_put(trace, q, K, M, blockIdx.x, t0, t1, t2, tx, sm_id(), LM_CUDA_TRACE_SCREEN);
}

/* Candidates a block of k_screen_pick holds before it sums its whole range exactly instead, and
 * the upper bounds a thread reads into registers before staging x (a block's first 2,048). */
constexpr int PICK_CAP = 512, PICK_REG = 8;

/* Grid (blocks, rows) of GEMV_THREADS: block b of row r takes rows [b * chunk, (b + 1) * chunk) of
 * the vocabulary. Its candidates are the rows whose upper bound u is not below the row's best lower
 * bound T (lmax[r]; every row when T is not finite): the true argmax is among them. Each candidate's
 * logit is summed as k_gemv sums a bf16 row (x * norm_w staged by gemv_stage, gemv_chunk_bf16 in
 * chunk order, warp_sum, times 1 / rms from gemv_inv): the bits the full lm_head GEMV gives it.
 * x_fix: NULL, or [rows, K] the pending fixed-point terms gemv_stage folds in, as k_gemv's.
 * The blocks' best (value, lowest id) meet as in k_argmax; the last block of a row writes ids[r]
 * and resets lmax[r] to -inf and count[r] to 0. n_cand: NULL, or [rows] += the candidates summed.
 * done: NULL, or the one-row screen's flag: set, the screen wrote the id and the kernel returns. */
template <bool TRACE>
__global__ void __launch_bounds__(GEMV_THREADS) k_screen_pick(int32_t *ids, const float *u, int ldu, const float *x,
                                                              int ldx, const long long *x_fix,
                                                              const uint16_t *__restrict__ w, int K, int M,
                                                              int chunk, const float *__restrict__ nw, float eps,
                                                              int *lmax, float2 *part, unsigned *count,
                                                              int32_t *n_cand, const int *done,
                                                              unsigned long long *trace) {
    const unsigned long long t0 = TRACE ? gtime() : 0;
    extern __shared__ float4 gemv_smem[];
    float *xs = reinterpret_cast<float *>(gemv_smem);
    __shared__ float ss_part[1][GEMV_WARPS];
    __shared__ int cand[PICK_CAP];
    __shared__ int ncand;
    __shared__ float sv[GEMV_WARPS];
    __shared__ int si[GEMV_WARPS];
    const int r = blockIdx.y, b = blockIdx.x, nb = gridDim.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nch = (K + 255) / 256, Kp = nch * 256;
    constexpr int NWP = 4;
    float nwv[NWP];
    gemv_norm_prefetch(nwv, nw, K);
    pdl_trigger(); /* the next kernel may launch now; it waits for this one */
    pdl_wait();
    if (done && __ldcg(done)) return; /* the one-row screen picked the id itself */
    const unsigned long long t1 = TRACE ? gtime() : 0;
    if (threadIdx.x == 0) ncand = 0;
    /* T and the first PICK_REG upper bounds a thread in one L2 trip; the candidates among them
     * fetched into L2 (prefetch) while x is staged */
    const int lo = b * chunk, hi = min(M, lo + chunk);
    const float *ur = u + (size_t)r * ldu;
    float uv[PICK_REG];
#pragma unroll
    for (int i = 0; i < PICK_REG; i++) {
        const int j = lo + (int)threadIdx.x + i * GEMV_THREADS;
        uv[i] = j < hi ? __ldcg(ur + j) : 0.f;
    }
    const float T = scr_unkey(__ldcg(lmax + r));
    const bool all = !(T > -INFINITY && T < INFINITY);
    unsigned flags = 0;
#pragma unroll
    for (int i = 0; i < PICK_REG; i++) {
        const int j = lo + (int)threadIdx.x + i * GEMV_THREADS;
        if (j < hi && (all || !(uv[i] < T))) {
            flags |= 1u << i;
            if (!all)
                for (int b2 = 0; b2 < K * 2; b2 += 128)
                    asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)(w + (size_t)j * K) + b2));
        }
    }
    const unsigned long long tu = TRACE ? gtime() : 0; /* the bounds' trip done (flags used them) */
    float sq[1];
    gemv_stage<1, 8>(xs, x + (size_t)r * ldx, ldx, K, Kp, nw, nwv, x_fix ? x_fix + (size_t)r * K : NULL, sq, ss_part,
                     1);
    float inv[1];
    gemv_inv(inv, ss_part, K, nw, eps);
    auto add = [&](int j) {
        const int at = atomicAdd(&ncand, 1);
        if (at < PICK_CAP) cand[at] = j;
    };
#pragma unroll
    for (int i = 0; i < PICK_REG; i++)
        if (flags >> i & 1) add(lo + (int)threadIdx.x + i * GEMV_THREADS);
    for (int j = lo + (int)threadIdx.x + PICK_REG * GEMV_THREADS; j < hi; j += GEMV_THREADS)
        if (all || !(__ldcg(ur + j) < T)) add(j);
    __syncthreads();
    const unsigned long long t2 = TRACE ? gtime() : 0;
    const int nc = ncand;
    const bool whole = nc > PICK_CAP; /* too many: every row of the range, exactly */
    const int n_rows = whole ? hi - lo : nc;
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int i = warp; i < n_rows; i += GEMV_WARPS) {
        const int j = whole ? lo + i : cand[i];
        const float v = gemv_row_bf16<8>(w, j, K, xs, inv[0], lane);
        if (v > -INFINITY && am_better(v, j, bv, bi)) bv = v, bi = j; /* as k_argmax: -inf never wins */
    }
    if (lane == 0) sv[warp] = bv, si[warp] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w2 = 1; w2 < GEMV_WARPS; w2++)
            if (am_better(sv[w2], si[w2], bv, bi)) bv = sv[w2], bi = si[w2];
        if (n_cand) atomicAdd(n_cand + r, n_rows);
    }
    int win;
    if (am_block_final(bv, bi, part, count, r, b, nb, &win)) {
        ids[r] = win;
        lmax[r] = LM_CUDA_SCR_KEY_NEG_INF;
    }
    if (TRACE && threadIdx.x == 0)
        trace_put(trace, w, K, M, b + nb * r, t0, t1, t2, tu, sm_id(), LM_CUDA_TRACE_PICK);
}

} // namespace

extern "C" lm_status lm_cuda_gemv(struct lm_cuda_ctx *c, float *y, int ldy, const float *x, int ldx,
                                  const uint16_t *w, int n, int k, int m, const float *norm_w,
                                  float eps, enum lm_cuda_epilogue epi, const struct lm_cuda_fix_io *fix) {
    if (n < 1 || k < 8 || m < 1 || k % 8 || ((uintptr_t)w & 15))
        return lm_errorf(LM_ERR_SHAPE,
                         "CUDA gemv: [%d, %d] x [%d, %d]^T: k must be a positive multiple of 8 and "
                         "the weights 16-byte aligned",
                         n, k, m, k);
    return gemv_run<GEMV_BF16>(c, y, ldy, x, ldx, gemv_w{w, NULL}, n, k, m, norm_w, eps, epi, fix);
}

extern "C" lm_status lm_cuda_gemv_q8(struct lm_cuda_ctx *c, float *y, int ldy, const float *x, int ldx,
                                     const int8_t *wq, const uint16_t *wd, int n, int k, int m,
                                     const float *norm_w, float eps, enum lm_cuda_epilogue epi,
                                     const struct lm_cuda_fix_io *fix) {
    if (n < 1 || k < 32 || m < 1 || k % 32 || ((uintptr_t)wq & 15) || ((uintptr_t)wd & 1))
        return lm_errorf(LM_ERR_SHAPE,
                         "CUDA gemv (Q8_0): [%d, %d] x [%d, %d]^T: k must be a positive multiple of "
                         "32 (whole Q8_0 blocks), the quants 16-byte and the scales 2-byte aligned",
                         n, k, m, k);
    return gemv_run<GEMV_Q8>(c, y, ldy, x, ldx, gemv_w{wq, wd}, n, k, m, norm_w, eps, epi, fix);
}

extern "C" size_t lm_cuda_screen_bytes(int m, int k) {
    return m < 1 || k < 32 ? 0 : (size_t)m * SCR_BLOCK_BYTES * (k / 32);
}

extern "C" lm_status lm_cuda_screen_build(struct lm_cuda_ctx *c, const uint16_t *w, int m, int k, uint8_t *q,
                                         float *ab) {
    if (m < 1 || k < 32 || k % 32 || ((uintptr_t)q & 15) || ((uintptr_t)ab & 7) || ((uintptr_t)w & 1))
        return lm_errorf(LM_ERR_SHAPE, "CUDA screen build: [%d, %d]: k must be a positive multiple of 32, the "
                         "screen 16-byte and ab 8-byte aligned", m, k);
    LM_CU(lm_launch(c, dim3((unsigned)((m + GEMV_WARPS - 1) / GEMV_WARPS)), dim3(GEMV_THREADS), 0, k_screen_build, w,
                    m, k, q, reinterpret_cast<float2 *>(ab)));
    return LM_OK;
}

/* With the context's trace on, 1-2 activation rows run the TRACE instantiation (the timeline's
 * batch-1 and -2 steps); more rows are not traced. */
template <int T, int R>
cudaError_t launch_screen(const lm_cuda_ctx *c, float *u, int ldu, const float *x, int ldx, const uint8_t *q, int k,
                          int m, const float *nw, float eps, const long long *xf, gemv_scr scr) {
    constexpr bool CAN_TRACE = T <= 2;
    auto fn = CAN_TRACE && c->trace ? k_screen<T, R, CAN_TRACE, false> : k_screen<T, R, false, false>;
    if constexpr (T == 1)
        if (scr.ids) fn = c->trace ? k_screen<T, R, true, true> : k_screen<T, R, false, true>;
    const size_t smem = screen_smem_bytes(T, k);
    const gemv_plan p = gemv_plan_for(c, (const void *)fn, smem, m, R);
    return lm_launch(c, dim3(p.grid), dim3(GEMV_THREADS), smem, fn, u, ldu, x, ldx, q, k, m, nw, eps, xf, p.dyn,
                     p.dyn_from, scr, c->trace);
}

/* The rounding terms of the screen's bound for k. rho: (the longest chain of roundings a logit's
 * sum takes, in either kernel: a lane's k_gemv chunks of 256 give Kp / 32 products, its warp_sum
 * 5 more; the screen's fewer: 3 a chunk of 1,024 and 5) + 16, times twice the unit roundoff
 * 2^-24. tiny: where partial sums are subnormal a rounding errs by up to 2^-150 whatever their
 * size: (Kp + 48) x 2^-149 covers every rounding of both sums (Kp + 31 a sum at most). */
static float screen_rho(int k) { return (float)(((k + 255) / 256 * 8 + 16) * 0x1p-23); }
static float screen_tiny(int k) { return ldexpf((float)((k + 255) / 256 * 256 + 48), -149); }

extern "C" bool lm_cuda_screen_fits(int k) {
    return k >= 32 && k % 32 == 0 && screen_smem_bytes(1, k) <= 200 * 1024 && gemv_smem_bytes<GEMV_BF16>(1, k) <= 200 * 1024;
}

/* lm_cuda_gemv_screen, and with ids and w (one activation row, the context's mode on) the
 * screen that also picks the id (k_screen FU), leaving the pick only an overflow. */
static lm_status screen_launch(struct lm_cuda_ctx *c, float *u, int ldu, const float *x, int ldx,
                               const int64_t *x_fix, const uint8_t *q, const float *ab, int n, int k, int m,
                               const float *norm_w, float eps, int32_t *ids, const uint16_t *w, int32_t *n_cand) {
    if (n < 1 || n > c->max_rows || !lm_cuda_screen_fits(k) || m < 1 || ((uintptr_t)q & 15) || ((uintptr_t)ab & 7))
        return lm_errorf(LM_ERR_SHAPE,
                         "CUDA gemv screen: [%d, %d] x [%d, %d]^T: rows 1 to the context's max_rows %d, k a "
                         "positive multiple of 32 whose staging fits 200 KiB (lm_cuda_screen_fits), the screen "
                         "16-byte and ab 8-byte aligned",
                         n, k, m, k, c->max_rows);
    const int per = (int)std::min<size_t>(8, 200 * 1024 / screen_smem_bytes(1, k));
    /* Screen rows a warp: 8 for 1-2 activation rows, 4 for more (perf-notes v40: at one row 8 ran
     * the lm_head of Qwen3-0.6B in 39.8 us, and 4 and 6 were slower in tg128; 3-4 rows were
     * slower at 2) */
    for (int t0 = 0; t0 < n; t0 += per) {
        const int T = std::min(per, n - t0);
        const bool fu = ids && n == 1;
        const gemv_scr scr = {reinterpret_cast<const float2 *>(ab), c->scr_max + t0, screen_rho(k), screen_tiny(k),
                              fu ? w : NULL, fu ? ids : NULL, c->scr_fuse, fu ? n_cand : NULL};
        float *ut = u + (size_t)t0 * ldu;
        const float *xt = x + (size_t)t0 * ldx;
        /* the pending fixed-point terms fold into x as it is staged (gemv_stage), as the bf16 GEMV's */
        const long long *xf = x_fix ? (const long long *)x_fix + (size_t)t0 * k : NULL;
        const cudaError_t e = by_act_rows(T, [&](auto t) {
            constexpr int TT = decltype(t)::value;
            return launch_screen<TT, TT <= 2 ? 8 : 4>(c, ut, ldu, xt, ldx, q, k, m, norm_w, eps, xf, scr);
        });
        if (e != cudaSuccess) {
            lm_cuda_screen_reset(c); /* an earlier launch's bounds would outlive it */
            return lm_cuda_fail(e, "gemv screen launch");
        }
    }
    return LM_OK;
}

extern "C" lm_status lm_cuda_gemv_screen(struct lm_cuda_ctx *c, float *u, int ldu, const float *x, int ldx,
                                        const int64_t *x_fix, const uint8_t *q, const float *ab, int n, int k, int m,
                                        const float *norm_w, float eps) {
    return screen_launch(c, u, ldu, x, ldx, x_fix, q, ab, n, k, m, norm_w, eps, NULL, NULL, NULL);
}

/* lm_cuda_argmax_screened; done: NULL, or the one-row screen's flag (the pick returns when set). */
static lm_status pick_launch(struct lm_cuda_ctx *c, int32_t *ids, const float *u, int ldu, const float *x, int ldx,
                             const int64_t *x_fix, const uint16_t *w, int n, int k, int m, const float *norm_w,
                             float eps, int32_t *n_cand, const int *done) {
    const size_t smem = gemv_smem_bytes<GEMV_BF16>(1, k);
    if (n < 1 || n > c->max_rows || k < 8 || k % 8 || m < 1 || smem > 200 * 1024 || ((uintptr_t)w & 15)) {
        lm_cuda_screen_reset(c);
        return lm_errorf(LM_ERR_SHAPE,
                         "CUDA screened argmax: %d rows of [%d, %d]: rows 1 to the context's max_rows %d, k a "
                         "positive multiple of 8 whose staging fits 200 KiB, the weights 16-byte aligned",
                         n, m, k, c->max_rows);
    }
    const int nb = std::min((int)LM_CUDA_AM_MAX_CHUNKS, (m + 255) / 256), chunk = (m + nb - 1) / nb;
    auto fn = c->trace ? k_screen_pick<true> : k_screen_pick<false>;
    lm_cuda_occupancy((const void *)fn, GEMV_THREADS, smem); /* raises the shared-memory limit */
    const cudaError_t e =
        lm_launch(c, dim3((unsigned)nb, (unsigned)n), dim3(GEMV_THREADS), smem, fn, ids, u, ldu, x, ldx,
                  (const long long *)x_fix, w, k, m, chunk, norm_w, eps, c->scr_max, c->am_part, c->am_count, n_cand,
                  done, c->trace);
    if (e != cudaSuccess) {
        lm_cuda_screen_reset(c);
        return lm_cuda_fail(e, "screened argmax launch");
    }
    return LM_OK;
}

extern "C" lm_status lm_cuda_argmax_screened(struct lm_cuda_ctx *c, int32_t *ids, const float *u, int ldu,
                                            const float *x, int ldx, const int64_t *x_fix, const uint16_t *w, int n,
                                            int k, int m, const float *norm_w, float eps, int32_t *n_cand) {
    return pick_launch(c, ids, u, ldu, x, ldx, x_fix, w, n, k, m, norm_w, eps, n_cand, NULL);
}

extern "C" lm_status lm_cuda_screen_pick(struct lm_cuda_ctx *c, int32_t *ids, float *u, int ldu, const float *x,
                                        int ldx, const int64_t *x_fix, const uint8_t *q, const float *ab,
                                        const uint16_t *w, int n, int k, int m, const float *norm_w, float eps,
                                        int32_t *n_cand) {
    if ((uintptr_t)w & 15) /* checked before the screen, which reads them when it picks */
        return lm_errorf(LM_ERR_SHAPE, "CUDA screen pick: the bf16 rows must be 16-byte aligned");
    const bool fu = n == 1 && c->scr_fuse_on;
    const lm_status rc = screen_launch(c, u, ldu, x, ldx, x_fix, q, ab, n, k, m, norm_w, eps, fu ? ids : NULL, w, n_cand);
    if (rc) return rc;
    return pick_launch(c, ids, u, ldu, x, ldx, x_fix, w, n, k, m, norm_w, eps, n_cand, fu ? &c->scr_fuse->done : NULL);
}

extern "C" bool lm_cuda_ctx_screen_fuse(const struct lm_cuda_ctx *c) { return c->scr_fuse_on; }

extern "C" lm_status lm_cuda_screen_picked(struct lm_cuda_ctx *c, bool *picked) {
    int done = 0;
    LM_CU(cudaStreamSynchronize(c->stream));
    LM_CU(cudaMemcpy(&done, &c->scr_fuse->done, sizeof done, cudaMemcpyDeviceToHost));
    *picked = done != 0;
    return LM_OK;
}

extern "C" bool lm_cuda_mlp1_fits(const struct lm_cuda_ctx *c, int k, int inter) {
    return mlp1_du<GEMV_BF16>(c, k, inter) > 0;
}

extern "C" bool lm_cuda_mlp1_q8_fits(const struct lm_cuda_ctx *c, int k, int inter) {
    return mlp1_du<GEMV_Q8>(c, k, inter) > 0;
}

extern "C" lm_status lm_cuda_mlp1(struct lm_cuda_ctx *c, int64_t *acc, const float *x, int n,
                                  const uint16_t *wgu, const uint16_t *wd, int k, int inter,
                                  const float *norm_w, float eps) {
    return mlp1_run<GEMV_BF16>(c, acc, x, n, gemv_w{wgu, NULL}, gemv_w{wd, NULL}, k, inter, norm_w, eps);
}

extern "C" lm_status lm_cuda_mlp1_q8(struct lm_cuda_ctx *c, int64_t *acc, const float *x, int n,
                                     const int8_t *wgu_q, const uint16_t *wgu_s, const int8_t *wd_q,
                                     const uint16_t *wd_s, int k, int inter, const float *norm_w, float eps) {
    return mlp1_run<GEMV_Q8>(c, acc, x, n, gemv_w{wgu_q, wgu_s}, gemv_w{wd_q, wd_s}, k, inter, norm_w, eps);
}

extern "C" lm_status lm_cuda_ctx_trace(struct lm_cuda_ctx *c, int capacity) {
    if (c->trace) cudaFree(c->trace), c->trace = NULL;
    if (capacity <= 0) return LM_OK;
    const size_t words = 2 + (size_t)capacity * LM_CUDA_TRACE_WORDS;
    LM_CU(cudaMalloc(&c->trace, words * 8));
    unsigned long long head[2] = {0, (unsigned long long)capacity};
    LM_CU(cudaMemset(c->trace, 0, words * 8));
    LM_CU(cudaMemcpy(c->trace, head, sizeof head, cudaMemcpyHostToDevice));
    LM_CU(cudaStreamSynchronize(cudaStreamLegacy)); /* see lm_cuda_upload */
    return LM_OK;
}

extern "C" lm_status lm_cuda_ctx_trace_read(struct lm_cuda_ctx *c, struct lm_cuda_trace_entry *out, int max,
                                            int *n) {
    *n = 0;
    if (!c->trace) return LM_OK;
    LM_CU(cudaStreamSynchronize(c->stream));
    unsigned long long head[2];
    LM_CU(cudaMemcpy(head, c->trace, sizeof head, cudaMemcpyDeviceToHost));
    const unsigned long long cap = head[1], count = head[0];
    const unsigned long long have = count < cap ? count : cap;
    std::vector<unsigned long long> all((size_t)cap * LM_CUDA_TRACE_WORDS);
    LM_CU(cudaMemcpy(all.data(), c->trace + 2, all.size() * 8, cudaMemcpyDeviceToHost));
    const unsigned long long take = have < (unsigned long long)max ? have : (unsigned long long)max;
    for (unsigned long long i = 0; i < take; i++) { /* the last `take` entries, oldest first */
        const unsigned long long *e = &all[(size_t)((count - take + i) % cap) * LM_CUDA_TRACE_WORDS];
        lm_cuda_trace_entry &o = out[i];
        o.weights = (uintptr_t)e[0];
        o.m = (int)(e[1] >> 32), o.k = (int)(e[1] & 0xffffffffu), o.block = (int)(e[2] & 0xfffffu);
        o.sm = (int)((e[2] >> 20) & 0xfffu);
        o.t_start = e[3], o.t_waited = e[4], o.t_ready = e[5], o.t_end = e[6];
        const unsigned long long mid = (e[2] >> 32) & 0x0fffffffull;
        o.t_mid = mid ? e[3] + mid : 0;
        o.kind = (int)(e[2] >> 60);
    }
    *n = (int)take;
    return LM_OK;
}


