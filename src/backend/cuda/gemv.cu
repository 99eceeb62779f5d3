/* gemv.cu: lm_cuda_gemv (batch 1..8 linear layers, float32 activations, bf16 weights streamed
 * once) and lm_cuda_gemm (cuBLAS). See cuda.h for the contracts, docs/perf-notes.md for why. */
#include "backend/cuda/common.cuh"

namespace {

/* 16 bytes of weights that are read once: skip L1. */
__device__ __forceinline__ uint4 ld_stream16(const void *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

/* ---- GEMV ---- */

constexpr int GEMV_WARPS = 8, GEMV_THREADS = GEMV_WARPS * 32;

/* Shared-memory slot of element k of an activation row: within each 256-element chunk, lane l's
 * 8 elements (l*8 .. l*8+7) sit as two float4s, at 4*l and 128 + 4*l, so a warp's float4 reads
 * are contiguous and conflict-free. */
__device__ __forceinline__ int gemv_slot(int k) {
    int e = k & 255;
    return (k & ~255) + ((e >> 2) & 1) * 128 + (e >> 3) * 4 + (e & 3);
}

/* Row groups of this warp: pf = 0, strided over the whole grid; pf = 1, a contiguous range per
 * block, whose weights the block asks L2 to prefetch on entry (one bulk prefetch per 16 KiB)
 * before triggering the next kernel's launch: consecutive kernels' weight streams then overlap. */
template <int R>
__device__ __forceinline__ void gemv_rows_of_block(const uint16_t *w, int K, int M, int n_rg, int pf,
                                                   int *rg, int *stride, int *end) {
    const int warp = threadIdx.x >> 5;
    if (pf) {
        const int per = (n_rg + gridDim.x - 1) / gridDim.x;
        const int rg0 = blockIdx.x * per;
        *end = min(n_rg, rg0 + per);
        *rg = rg0 + warp;
        *stride = GEMV_WARPS;
        if (rg0 < *end) {
            const char *base = reinterpret_cast<const char *>(w + (size_t)rg0 * R * K);
            const size_t bytes = (size_t)(min(M, *end * R) - rg0 * R) * K * 2;
            for (size_t o = (size_t)threadIdx.x * 16384; o < bytes; o += (size_t)GEMV_THREADS * 16384) {
                const unsigned n = (unsigned)(bytes - o < 16384 ? bytes - o : 16384);
                asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base + o), "r"(n) : "memory");
            }
        }
        pdl_trigger();
    } else {
        *rg = blockIdx.x * GEMV_WARPS + warp;
        *stride = gridDim.x * GEMV_WARPS;
        *end = n_rg;
    }
}

/* Sum of squares of a lane's 8 elements of a chunk, in element order (shared by both kernels). */
__device__ __forceinline__ float gemv_ss8(float4 a, float4 b, float s) {
    s = fmaf(a.x, a.x, s);
    s = fmaf(a.y, a.y, s);
    s = fmaf(a.z, a.z, s);
    s = fmaf(a.w, a.w, s);
    s = fmaf(b.x, b.x, s);
    s = fmaf(b.y, b.y, s);
    s = fmaf(b.z, b.z, s);
    return fmaf(b.w, b.w, s);
}
__device__ __forceinline__ float4 gemv_mul4(float4 a, float4 b) {
    return make_float4(__fmul_rn(a.x, b.x), __fmul_rn(a.y, b.y), __fmul_rn(a.z, b.z), __fmul_rn(a.w, b.w));
}

/* Output j of a row: store, residual add, or SwiGLU of the pair (v, v_next) when r is even.
 * Explicitly rounded operations, so that no instantiation contracts them differently. */
template <int EPI>
__device__ __forceinline__ void gemv_store(float *yrow, int j, int M, float v, float v_next, int r) {
    if (EPI == LM_CUDA_EPI_STORE) {
        if (j < M) yrow[j] = v;
    } else if (EPI == LM_CUDA_EPI_ADD) {
        if (j < M) yrow[j] = __fadd_rn(yrow[j], v);
    } else if ((r & 1) == 0 && j + 1 < M) {
        yrow[j >> 1] = __fmul_rn(__fdiv_rn(v, __fadd_rn(1.0f, expf(-v))), v_next);
    }
}

/* T activation rows, R weight rows per warp, U 256-element chunks loaded per batch. */
template <int T, int R, int U, int EPI>
__global__ void __launch_bounds__(GEMV_THREADS, 2)
    k_gemv(float *y, int ldy, const float *x, int ldx, const uint16_t *__restrict__ w, int K, int M,
           const float *__restrict__ nw, float eps, int pf) {
    static_assert(EPI != LM_CUDA_EPI_SWIGLU || R % 2 == 0, "SwiGLU needs row pairs");
    extern __shared__ float4 gemv_smem[];
    float *xs = reinterpret_cast<float *>(gemv_smem);
    __shared__ float inv_s[T];
    const int nch = (K + 255) >> 8, Kp = nch << 8;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n_rg = (M + R - 1) / R;
    int rg, stride, end;
    gemv_rows_of_block<R>(w, K, M, n_rg, pf, &rg, &stride, &end);
    uint4 wv[U][R];
    auto load = [&](int g, int c0) {
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++) {
                const int j = g * R + r, k = (c0 + u) * 256 + lane * 8;
                wv[u][r] = (j < M && k < K) ? ld_stream16(w + (size_t)j * K + k) : make_uint4(0, 0, 0, 0);
            }
    };
    /* The weights never depend on the previous kernel: start streaming them before waiting. (v7
     * also staged the norm weights into shared memory here: slower, docs/perf-notes.md v7.) */
    if (rg < end) load(rg, 0);

    /* Stage x * norm_w in shared memory (the RMSNorm's 1/rms is applied to the sums at the end).
     * Element k = c * 256 + tid of each row: SU chunks of every row are loaded into registers
     * before any is stored, so the whole staging costs one L2 round trip per SU chunks (x is a
     * plain pointer the compiler must assume may alias shared memory: without the explicit
     * batch it would not move a load above the previous store). x is read through L2 (.cg),
     * never the non-coherent path: under PDL this kernel runs while its predecessor writes x. */
    constexpr int SU = T == 1 ? 16 : T <= 4 ? 8 : 4;
    pdl_wait();
    /* The residual this lane adds to in its first row group, read in the same round trip as x
     * (not after the sums). Lane t * R + r owns output (t, row r of the group). */
    float yold = 0.f;
    if (EPI == LM_CUDA_EPI_ADD && rg < end && lane < T * R) {
        const int j = rg * R + lane % R;
        if (j < M) yold = __ldcg(y + (size_t)(lane / R) * ldy + j);
    }
    for (int c0 = 0; c0 < nch; c0 += SU) {
        float v[T][SU];
#pragma unroll
        for (int t = 0; t < T; t++)
#pragma unroll
            for (int u = 0; u < SU; u++) {
                const int k = (c0 + u) * 256 + threadIdx.x;
                v[t][u] = k < K ? __ldcg(x + (size_t)t * ldx + k) : 0.f; /* L2: x is fresh */
            }
#pragma unroll
        for (int t = 0; t < T; t++)
#pragma unroll
            for (int u = 0; u < SU; u++)
                if (c0 + u < nch) xs[t * Kp + gemv_slot((c0 + u) * 256 + threadIdx.x)] = v[t][u];
    }
    __syncthreads();
    if (nw) {
        /* Warp t normalises row t: sum of squares in the order k_gemv1 uses (lane-major, 8
         * elements a lane a chunk, then the xor tree), so 1 and n rows give the same bits. */
        for (int t = warp; t < T; t += GEMV_WARPS) {
            float4 *row = gemv_smem + (t * Kp >> 2);
            float sq = 0.f;
            for (int c = 0; c < nch; c++) {
                const float4 a = row[c * 64 + lane], b = row[c * 64 + 32 + lane];
                sq = gemv_ss8(a, b, sq);
            }
            sq = warp_sum(sq);
            if (lane == 0) inv_s[t] = 1.0f / sqrtf(sq / (float)K + eps);
#pragma unroll 4
            for (int c = 0; c < nch; c++) {
                const int k = c * 256 + lane * 8;
                if (k >= K) continue;
                const float4 na = __ldg(reinterpret_cast<const float4 *>(nw + k));
                const float4 nb = __ldg(reinterpret_cast<const float4 *>(nw + k + 4));
                row[c * 64 + lane] = gemv_mul4(row[c * 64 + lane], na);
                row[c * 64 + 32 + lane] = gemv_mul4(row[c * 64 + 32 + lane], nb);
            }
        }
        __syncthreads();
    }
    if (!pf) pdl_trigger(); /* the next kernel may start streaming its weights */
    float inv[T];
#pragma unroll
    for (int t = 0; t < T; t++) inv[t] = nw ? inv_s[t] : 1.f;

    bool have = rg < end, first = true;
    for (; rg < end; rg += stride) {
        float acc[T][R];
#pragma unroll
        for (int t = 0; t < T; t++)
#pragma unroll
            for (int r = 0; r < R; r++) acc[t][r] = 0.f;
        for (int c0 = 0; c0 < nch; c0 += U) {
            if (!have) load(rg, c0);
            have = false;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = c0 + u;
                if (c < nch) {
                    float4 xa[T], xb[T];
#pragma unroll
                    for (int t = 0; t < T; t++) {
                        xa[t] = gemv_smem[(t * Kp >> 2) + c * 64 + lane];
                        xb[t] = gemv_smem[(t * Kp >> 2) + c * 64 + 32 + lane];
                    }
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        const uint4 q = wv[u][r];
                        const float f0 = bf_lo(q.x), f1 = bf_hi(q.x), f2 = bf_lo(q.y), f3 = bf_hi(q.y);
                        const float f4 = bf_lo(q.z), f5 = bf_hi(q.z), f6 = bf_lo(q.w), f7 = bf_hi(q.w);
#pragma unroll
                        for (int t = 0; t < T; t++) {
                            float a = acc[t][r];
                            a = fmaf(f0, xa[t].x, a);
                            a = fmaf(f1, xa[t].y, a);
                            a = fmaf(f2, xa[t].z, a);
                            a = fmaf(f3, xa[t].w, a);
                            a = fmaf(f4, xb[t].x, a);
                            a = fmaf(f5, xb[t].y, a);
                            a = fmaf(f6, xb[t].z, a);
                            a = fmaf(f7, xb[t].w, a);
                            acc[t][r] = a;
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int t = 0; t < T; t++)
#pragma unroll
            for (int r = 0; r < R; r++) acc[t][r] = __fmul_rn(warp_sum(acc[t][r]), inv[t]);
        const int j0 = rg * R;
#pragma unroll
        for (int t = 0; t < T; t++)
#pragma unroll
            for (int r = 0; r < R; r++)
                if (lane == t * R + r) {
                    if (EPI == LM_CUDA_EPI_ADD && first) {
                        if (j0 + r < M) y[(size_t)t * ldy + j0 + r] = __fadd_rn(yold, acc[t][r]);
                    } else {
                        gemv_store<EPI>(y + (size_t)t * ldy, j0 + r, M, acc[t][r], acc[t][(r + 1) % R], r);
                    }
                }
        first = false;
    }
}

/* Batch 1 with x in registers (no shared memory, no block barrier): each warp loads the 8
 * elements a chunk its lanes need, normalises them itself (the whole row is in the warp), and
 * computes its row groups. NC: chunks held (K <= NC * 256). Same arithmetic order as k_gemv, so
 * a row's result does not depend on which kernel ran it. */
template <int R, int EPI, int NC>
__global__ void __launch_bounds__(GEMV_THREADS, 2)
    k_gemv1(float *y, const float *x, const uint16_t *__restrict__ w, int K, int M,
            const float *__restrict__ nw, float eps, int pf) {
    static_assert(EPI != LM_CUDA_EPI_SWIGLU || R % 2 == 0, "SwiGLU needs row pairs");
    const int nch = (K + 255) >> 8;
    const int lane = threadIdx.x & 31;
    const int n_rg = (M + R - 1) / R;
    int rg, stride, end;
    gemv_rows_of_block<R>(w, K, M, n_rg, pf, &rg, &stride, &end);
    uint4 wv[NC][R];
    auto load = [&](int g) {
#pragma unroll
        for (int c = 0; c < NC; c++)
#pragma unroll
            for (int r = 0; r < R; r++) {
                const int j = g * R + r, k = c * 256 + lane * 8;
                wv[c][r] = (j < M && k < K) ? ld_stream16(w + (size_t)j * K + k) : make_uint4(0, 0, 0, 0);
            }
    };
    if (rg < end) load(rg);
    float4 na[NC], nb[NC];
#pragma unroll
    for (int c = 0; c < NC; c++) {
        const int k = c * 256 + lane * 8;
        const bool ok = nw && k < K;
        na[c] = ok ? __ldg(reinterpret_cast<const float4 *>(nw + k)) : make_float4(1.f, 1.f, 1.f, 1.f);
        nb[c] = ok ? __ldg(reinterpret_cast<const float4 *>(nw + k + 4)) : make_float4(1.f, 1.f, 1.f, 1.f);
    }
    pdl_wait();
    float4 xa[NC], xb[NC];
#pragma unroll
    for (int c = 0; c < NC; c++) {
        const int k = c * 256 + lane * 8;
        xa[c] = k < K ? __ldcg(reinterpret_cast<const float4 *>(x + k)) : make_float4(0.f, 0.f, 0.f, 0.f);
        xb[c] = k < K ? __ldcg(reinterpret_cast<const float4 *>(x + k + 4)) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float inv = 1.f;
    if (nw) {
        float sq = 0.f;
#pragma unroll
        for (int c = 0; c < NC; c++)
            if (c < nch) sq = gemv_ss8(xa[c], xb[c], sq);
        sq = warp_sum(sq);
        inv = 1.0f / sqrtf(sq / (float)K + eps);
#pragma unroll
        for (int c = 0; c < NC; c++) {
            xa[c] = gemv_mul4(xa[c], na[c]);
            xb[c] = gemv_mul4(xb[c], nb[c]);
        }
    }
    if (!pf) pdl_trigger();
    bool have = rg < end;
    for (; rg < end; rg += stride) {
        if (!have) load(rg);
        have = false;
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] = 0.f;
#pragma unroll
        for (int c = 0; c < NC; c++) {
            if (c >= nch) break;
#pragma unroll
            for (int r = 0; r < R; r++) {
                const uint4 q = wv[c][r];
                float a = acc[r];
                a = fmaf(bf_lo(q.x), xa[c].x, a);
                a = fmaf(bf_hi(q.x), xa[c].y, a);
                a = fmaf(bf_lo(q.y), xa[c].z, a);
                a = fmaf(bf_hi(q.y), xa[c].w, a);
                a = fmaf(bf_lo(q.z), xb[c].x, a);
                a = fmaf(bf_hi(q.z), xb[c].y, a);
                a = fmaf(bf_lo(q.w), xb[c].z, a);
                a = fmaf(bf_hi(q.w), xb[c].w, a);
                acc[r] = a;
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] = __fmul_rn(warp_sum(acc[r]), inv);
        const int j0 = rg * R;
#pragma unroll
        for (int r = 0; r < R; r++)
            if (lane == r) gemv_store<EPI>(y, j0 + r, M, acc[r], acc[(r + 1) % R], r);
    }
}

/* Chunks of 256 weights a lane loads before using any: enough bytes in flight per SM even when a
 * small matrix gives each SM only one block (o_proj, down_proj at batch 1). */
template <int T, int R>
constexpr int gemv_u() {
    return T == 1 ? (R == 1 ? 12 : R == 2 ? 8 : 4) : T <= 2 ? 4 : 2;
}

/* Dynamic shared memory of k_gemv: T activation rows. */
inline size_t gemv_smem_bytes(int T, int k) { return (size_t)T * ((k + 255) / 256) * 256 * sizeof(float); }

template <int T, int R, int U, int EPI>
cudaError_t launch_gemv_u(const lm_cuda_ctx *c, float *y, int ldy, const float *x, int ldx,
                          const uint16_t *w, int k, int m, const float *nw, float eps) {
    auto fn = k_gemv<T, R, U, EPI>;
    const size_t smem = gemv_smem_bytes(T, k);
    const int n_rg = (m + R - 1) / R;
    const int need = (n_rg + GEMV_WARPS - 1) / GEMV_WARPS;
    /* Prefetch mode for matrices that fit L2 several times over: one block per SM, so the next
     * kernel's blocks fit beside this one's and stream their weights early. */
    const int pf = c->gemv_prefetch && (size_t)m * k * 2 <= ((size_t)24 << 20);
    const int cap = pf ? c->sm_count : lm_cuda_occupancy((const void *)fn, GEMV_THREADS, smem) * c->sm_count;
    if (pf) lm_cuda_occupancy((const void *)fn, GEMV_THREADS, smem); /* sets the smem limit */
    const int grid = need < cap ? need : cap;
    return lm_launch(c, dim3(grid), dim3(GEMV_THREADS), smem, fn, y, ldy, x, ldx, w, k, m, nw, eps, pf);
}

template <int T, int R, int EPI>
cudaError_t launch_gemv(const lm_cuda_ctx *c, float *y, int ldy, const float *x, int ldx,
                        const uint16_t *w, int k, int m, const float *nw, float eps) {
    return launch_gemv_u<T, R, gemv_u<T, R>(), EPI>(c, y, ldy, x, ldx, w, k, m, nw, eps);
}

template <int R, int EPI, int NC>
cudaError_t launch_gemv1(const lm_cuda_ctx *c, float *y, const float *x, const uint16_t *w, int k, int m,
                         const float *nw, float eps) {
    auto fn = k_gemv1<R, EPI, NC>;
    const int n_rg = (m + R - 1) / R;
    const int need = (n_rg + GEMV_WARPS - 1) / GEMV_WARPS;
    const int pf = c->gemv_prefetch && (size_t)m * k * 2 <= ((size_t)24 << 20);
    const int cap = (pf ? 1 : lm_cuda_occupancy((const void *)fn, GEMV_THREADS, 0)) * c->sm_count;
    const int grid = need < cap ? need : cap;
    return lm_launch(c, dim3(grid), dim3(GEMV_THREADS), 0, fn, y, x, w, k, m, nw, eps, pf);
}

/* Batch 1 in registers when the row fits: K <= 1024 (with or without a norm), or K <= 2048 without
 * a norm and one row a warp. Returns cudaErrorNotSupported when it does not apply. */
template <int EPI>
cudaError_t gemv1_dispatch(const lm_cuda_ctx *c, int R, float *y, const float *x, const uint16_t *w, int k,
                           int m, const float *nw, float eps) {
    const int nch = (k + 255) / 256;
    if constexpr (EPI == LM_CUDA_EPI_SWIGLU) {
        if (nch <= 4) return launch_gemv1<2, EPI, 4>(c, y, x, w, k, m, nw, eps);
    } else {
        if (nch <= 4 && R == 2) return launch_gemv1<2, EPI, 4>(c, y, x, w, k, m, nw, eps);
        if (nch <= 4 && R == 1) return launch_gemv1<1, EPI, 4>(c, y, x, w, k, m, nw, eps);
        if (nch <= 8 && R == 1 && !nw) return launch_gemv1<1, EPI, 8>(c, y, x, w, k, m, nw, eps);
    }
    return cudaErrorNotSupported;
}

/* One pass at batch 1 (v7, option gemv_one_pass, off: slower in the step): the fewest weight rows
 * per warp (1, 2 or 4; SwiGLU 2 or 4) whose register batch holds a warp's whole rows (U >= the
 * row's chunks) and for which the resident blocks cover every row, so that every weight load is
 * issued before the wait on the preceding kernel. cudaErrorNotSupported when no shape does
 * (lm_head). */
template <int R, int U, int EPI>
cudaError_t gemv_try_one_pass(const lm_cuda_ctx *c, float *y, const float *x, const uint16_t *w, int k,
                              int m, const float *nw, float eps) {
    if ((k + 255) / 256 > U) return cudaErrorNotSupported;
    const int blocks = ((m + R - 1) / R + GEMV_WARPS - 1) / GEMV_WARPS;
    const int occ = lm_cuda_occupancy((const void *)k_gemv<1, R, U, EPI>, GEMV_THREADS, gemv_smem_bytes(1, k));
    if (blocks > occ * c->sm_count) return cudaErrorNotSupported;
    return launch_gemv_u<1, R, U, EPI>(c, y, 0, x, 0, w, k, m, nw, eps);
}

template <int EPI>
cudaError_t gemv_one_pass(const lm_cuda_ctx *c, float *y, const float *x, const uint16_t *w, int k, int m,
                          const float *nw, float eps) {
    /* v7a also tried smaller register batches built for 3-5 blocks an SM (q/k/v at 1 row a warp in
     * 512 blocks, gate/up at 2 in 384): slower (more blocks each staging x); now only the v6
     * shapes, so in Qwen3-0.6B this moves gate/up alone, from 2 rows a warp to 4. */
    cudaError_t e = cudaErrorNotSupported;
    if constexpr (EPI != LM_CUDA_EPI_SWIGLU) {
        e = gemv_try_one_pass<1, gemv_u<1, 1>(), EPI>(c, y, x, w, k, m, nw, eps);
        if (e != cudaErrorNotSupported) return e;
    }
    e = gemv_try_one_pass<2, gemv_u<1, 2>(), EPI>(c, y, x, w, k, m, nw, eps);
    if (e != cudaErrorNotSupported) return e;
    return gemv_try_one_pass<4, gemv_u<1, 4>(), EPI>(c, y, x, w, k, m, nw, eps);
}

template <int T, int EPI>
cudaError_t gemv_rows_dispatch(const lm_cuda_ctx *c, int R, float *y, int ldy, const float *x,
                               int ldx, const uint16_t *w, int k, int m, const float *nw, float eps) {
    if constexpr (EPI == LM_CUDA_EPI_SWIGLU) {
        if constexpr (T == 1)
            if (R == 4) return launch_gemv<T, 4, EPI>(c, y, ldy, x, ldx, w, k, m, nw, eps);
        return launch_gemv<T, 2, EPI>(c, y, ldy, x, ldx, w, k, m, nw, eps);
    } else {
        if constexpr (T == 1)
            if (R == 4) return launch_gemv<T, 4, EPI>(c, y, ldy, x, ldx, w, k, m, nw, eps);
        if (R == 1) return launch_gemv<T, 1, EPI>(c, y, ldy, x, ldx, w, k, m, nw, eps);
        return launch_gemv<T, 2, EPI>(c, y, ldy, x, ldx, w, k, m, nw, eps);
    }
}

template <int EPI>
cudaError_t gemv_dispatch(const lm_cuda_ctx *c, int T, int R, float *y, int ldy, const float *x,
                          int ldx, const uint16_t *w, int k, int m, const float *nw, float eps) {
    switch (T) {
    case 1: return gemv_rows_dispatch<1, EPI>(c, R, y, ldy, x, ldx, w, k, m, nw, eps);
    case 2: return gemv_rows_dispatch<2, EPI>(c, R, y, ldy, x, ldx, w, k, m, nw, eps);
    case 3: return gemv_rows_dispatch<3, EPI>(c, R, y, ldy, x, ldx, w, k, m, nw, eps);
    case 4: return gemv_rows_dispatch<4, EPI>(c, R, y, ldy, x, ldx, w, k, m, nw, eps);
    case 5: return gemv_rows_dispatch<5, EPI>(c, R, y, ldy, x, ldx, w, k, m, nw, eps);
    case 6: return gemv_rows_dispatch<6, EPI>(c, R, y, ldy, x, ldx, w, k, m, nw, eps);
    case 7: return gemv_rows_dispatch<7, EPI>(c, R, y, ldy, x, ldx, w, k, m, nw, eps);
    default: return gemv_rows_dispatch<8, EPI>(c, R, y, ldy, x, ldx, w, k, m, nw, eps);
    }
}

/* ---- batch-1 layer tail as one persistent kernel (v8, option layer_fused) ---- */

/* Grid-wide barrier, split in two so that a block's arrival goes out before it floods the memory
 * system with the next phase's weight loads (v8b; v8a's sense-reversing barrier took ~5 dependent
 * L2 round trips, queued behind those loads). bar: a 64-bit arrival counter that only grows
 * (never wraps in practice), a multiple of gridDim.x between launches; every block of the grid
 * must be resident. grid_arrive returns (in thread 0) the count that means "all arrived";
 * grid_wait spins on it. Writes before the arrival are visible to L2 (.cg) reads after the wait. */
__device__ __forceinline__ unsigned long long grid_arrive(unsigned long long *bar) {
    __syncthreads();
    unsigned long long target = 0;
    if (threadIdx.x == 0) {
        __threadfence();
        const unsigned long long old = atomicAdd(bar, 1ull);
        target = (old / gridDim.x + 1) * gridDim.x;
    }
    return target;
}
__device__ __forceinline__ void grid_wait(const unsigned long long *bar, unsigned long long target) {
    if (threadIdx.x == 0) {
        unsigned long long v;
        do {
            asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(bar) : "memory");
        } while (v < target);
        __threadfence();
    }
    __syncthreads();
}

/* The first U chunks of this warp's first row group of a phase (grid-strided row groups, as
 * k_gemv with pf = 0): issued before the barrier that precedes the phase. */
template <int R, int U>
__device__ __forceinline__ void fused_load(uint4 (&wv)[U][R], const uint16_t *w, int K, int M, int g, int c0) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int j = g * R + r, k = (c0 + u) * 256 + lane * 8;
            wv[u][r] = (j < M && k < K) ? ld_stream16(w + (size_t)j * K + k) : make_uint4(0, 0, 0, 0);
        }
}

/* One GEMV phase at batch 1: k_gemv<1, R, U, EPI>'s body (staging, normalisation pass, per-row
 * sums and epilogue in the same order, so every output has the same bits as lm_cuda_gemv's),
 * with the first weight batch already in wv (have). xs: the block's shared staging row. */
template <int R, int U, int EPI>
__device__ __forceinline__ void fused_phase(uint4 (&wv)[U][R], bool have, float *y, const float *x,
                                            const uint16_t *w, int K, int M, const float *nw, float eps,
                                            float4 *xs4, float *inv_s) {
    float *xs = reinterpret_cast<float *>(xs4);
    const int nch = (K + 255) >> 8;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n_rg = (M + R - 1) / R;
    int rg = blockIdx.x * GEMV_WARPS + warp;
    const int stride = gridDim.x * GEMV_WARPS;
    float yold = 0.f;
    if (EPI == LM_CUDA_EPI_ADD && rg < n_rg && lane < R) {
        const int j = rg * R + lane;
        if (j < M) yold = __ldcg(y + j);
    }
    constexpr int SU = 16;
    for (int c0 = 0; c0 < nch; c0 += SU) {
        float v[SU];
#pragma unroll
        for (int u = 0; u < SU; u++) {
            const int k = (c0 + u) * 256 + threadIdx.x;
            v[u] = k < K ? __ldcg(x + k) : 0.f;
        }
#pragma unroll
        for (int u = 0; u < SU; u++)
            if (c0 + u < nch) xs[gemv_slot((c0 + u) * 256 + threadIdx.x)] = v[u];
    }
    __syncthreads();
    if (nw) {
        if (warp == 0) {
            float sq = 0.f;
            for (int c = 0; c < nch; c++) sq = gemv_ss8(xs4[c * 64 + lane], xs4[c * 64 + 32 + lane], sq);
            sq = warp_sum(sq);
            if (lane == 0) inv_s[0] = 1.0f / sqrtf(sq / (float)K + eps);
#pragma unroll 4
            for (int c = 0; c < nch; c++) {
                const int k = c * 256 + lane * 8;
                if (k >= K) continue;
                const float4 na = __ldg(reinterpret_cast<const float4 *>(nw + k));
                const float4 nb = __ldg(reinterpret_cast<const float4 *>(nw + k + 4));
                xs4[c * 64 + lane] = gemv_mul4(xs4[c * 64 + lane], na);
                xs4[c * 64 + 32 + lane] = gemv_mul4(xs4[c * 64 + 32 + lane], nb);
            }
        }
        __syncthreads();
    }
    const float inv = nw ? inv_s[0] : 1.f;
    bool first = true;
    for (; rg < n_rg; rg += stride) {
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] = 0.f;
        for (int c0 = 0; c0 < nch; c0 += U) {
            if (!have) fused_load<R, U>(wv, w, K, M, rg, c0);
            have = false;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = c0 + u;
                if (c < nch) {
                    const float4 xa = xs4[c * 64 + lane], xb = xs4[c * 64 + 32 + lane];
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        const uint4 q = wv[u][r];
                        float a = acc[r];
                        a = fmaf(bf_lo(q.x), xa.x, a);
                        a = fmaf(bf_hi(q.x), xa.y, a);
                        a = fmaf(bf_lo(q.y), xa.z, a);
                        a = fmaf(bf_hi(q.y), xa.w, a);
                        a = fmaf(bf_lo(q.z), xb.x, a);
                        a = fmaf(bf_hi(q.z), xb.y, a);
                        a = fmaf(bf_lo(q.w), xb.z, a);
                        a = fmaf(bf_hi(q.w), xb.w, a);
                        acc[r] = a;
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] = __fmul_rn(warp_sum(acc[r]), inv);
        const int j0 = rg * R;
#pragma unroll
        for (int r = 0; r < R; r++)
            if (lane == r) {
                if (EPI == LM_CUDA_EPI_ADD) {
                    if (j0 + r < M) y[j0 + r] = __fadd_rn(first ? yold : __ldcg(y + j0 + r), acc[r]);
                } else {
                    gemv_store<EPI>(y, j0 + r, M, acc[r], acc[(r + 1) % R], r);
                }
            }
        first = false;
    }
}

/* Register batches of the four phases: o_proj 1 row a warp (8 chunks at K = 2048), gate/up and
 * q/k/v 2 rows (4 chunks at K = 1024), down 1 row (12 chunks at K = 3072). */
constexpr int FU_O = 8, FU_GU = 4, FU_D = 12, FU_QKV = 4;

__global__ void __launch_bounds__(GEMV_THREADS, 2) k_layer_fused(lm_cuda_layer_fused_args a, unsigned long long *bar) {
    extern __shared__ float4 fused_smem[];
    __shared__ float inv_s[1];
    const int warp = threadIdx.x >> 5;
    const int g0 = blockIdx.x * GEMV_WARPS + warp;
    /* Phase 1: x += att . Wo^T. Its weights before the wait on the attention kernel. */
    {
        uint4 wv[FU_O][1];
        const bool have = g0 < a.H;
        if (have) fused_load<1, FU_O>(wv, a.wo, a.Q, a.H, g0, 0);
        pdl_wait();
        fused_phase<1, FU_O, LM_CUDA_EPI_ADD>(wv, have, a.x, a.att, a.wo, a.Q, a.H, NULL, 0.f, fused_smem, inv_s);
    }
    /* Phase 2: h = SwiGLU(RMSNorm(x) . Wgu^T). */
    {
        uint4 wv[FU_GU][2];
        const bool have = g0 < a.I;
        const unsigned long long t = grid_arrive(bar);
        if (have) fused_load<2, FU_GU>(wv, a.wgu, a.H, 2 * a.I, g0, 0);
        grid_wait(bar, t);
        fused_phase<2, FU_GU, LM_CUDA_EPI_SWIGLU>(wv, have, a.h, a.x, a.wgu, a.H, 2 * a.I, a.post_ln, a.eps,
                                                   fused_smem, inv_s);
    }
    /* Phase 3: x += h . Wd^T. */
    {
        uint4 wv[FU_D][1];
        const bool have = g0 < a.H;
        const unsigned long long t = grid_arrive(bar);
        if (have) fused_load<1, FU_D>(wv, a.wd, a.I, a.H, g0, 0);
        grid_wait(bar, t);
        if (!a.wqkv) pdl_trigger(); /* every block is resident: the next kernel may start */
        fused_phase<1, FU_D, LM_CUDA_EPI_ADD>(wv, have, a.x, a.h, a.wd, a.I, a.H, NULL, 0.f, fused_smem, inv_s);
    }
    /* Phase 4 (not after the last layer): qkv = RMSNorm(x) . Wqkv^T of the next layer. */
    if (a.wqkv) {
        uint4 wv[FU_QKV][2];
        const int n_rg = (a.QKV + 1) / 2;
        const bool have = g0 < n_rg;
        const unsigned long long t = grid_arrive(bar);
        if (have) fused_load<2, FU_QKV>(wv, a.wqkv, a.H, a.QKV, g0, 0);
        grid_wait(bar, t);
        pdl_trigger();
        fused_phase<2, FU_QKV, LM_CUDA_EPI_STORE>(wv, have, a.qkv, a.x, a.wqkv, a.H, a.QKV, a.in_ln, a.eps,
                                                   fused_smem, inv_s);
    }
}

} // namespace

extern "C" lm_status lm_cuda_gemv(struct lm_cuda_ctx *c, float *y, int ldy, const float *x, int ldx,
                                  const uint16_t *w, int n, int k, int m, const float *norm_w,
                                  float eps, enum lm_cuda_epilogue epi) {
    if (n < 1 || k < 8 || m < 1 || k % 8 || ((uintptr_t)w & 15))
        return lm_errorf(LM_ERR_SHAPE,
                         "CUDA gemv: [%d, %d] x [%d, %d]^T: k must be a positive multiple of 8 and "
                         "the weights 16-byte aligned",
                         n, k, m, k);
    if (epi == LM_CUDA_EPI_SWIGLU && m % 2)
        return lm_errorf(LM_ERR_SHAPE, "CUDA gemv: SwiGLU needs an even number of rows, not %d", m);
    /* Rows per warp: 2 when that still gives every multiprocessor a block, else 1 (v1 measured 1
     * best at batch 1 for every matrix of Qwen3-0.6B). */
    int R = c->gemv_rows;
    if (!R) R = m >= 2 * GEMV_WARPS * c->sm_count ? 2 : 1;
    /* Activation rows per launch: at most 8, and few enough for 200 KiB of shared memory. */
    const int kp = (k + 255) / 256 * 256;
    int per = 200 * 1024 / (kp * 4);
    if (per < 1) return lm_errorf(LM_ERR_SHAPE, "CUDA gemv: k = %d is too large", k);
    if (per > 8) per = 8;
    for (int t0 = 0; t0 < n; t0 += per) {
        const int T = n - t0 < per ? n - t0 : per;
        const float *xt = x + (size_t)t0 * ldx;
        float *yt = y + (size_t)t0 * ldy;
        cudaError_t e = cudaErrorNotSupported;
        if (T == 1 && c->gemv_regx && !((uintptr_t)xt & 15) && !((uintptr_t)norm_w & 15)) {
            switch (epi) {
            case LM_CUDA_EPI_STORE: e = gemv1_dispatch<LM_CUDA_EPI_STORE>(c, R, yt, xt, w, k, m, norm_w, eps); break;
            case LM_CUDA_EPI_ADD: e = gemv1_dispatch<LM_CUDA_EPI_ADD>(c, R, yt, xt, w, k, m, norm_w, eps); break;
            default: e = gemv1_dispatch<LM_CUDA_EPI_SWIGLU>(c, R, yt, xt, w, k, m, norm_w, eps); break;
            }
            if (e != cudaErrorNotSupported) {
                if (e != cudaSuccess) return lm_cuda_fail(e, "gemv launch");
                continue;
            }
        }
        if (n == 1 && !c->gemv_rows && c->gemv_one_pass) {
            switch (epi) {
            case LM_CUDA_EPI_STORE: e = gemv_one_pass<LM_CUDA_EPI_STORE>(c, yt, xt, w, k, m, norm_w, eps); break;
            case LM_CUDA_EPI_ADD: e = gemv_one_pass<LM_CUDA_EPI_ADD>(c, yt, xt, w, k, m, norm_w, eps); break;
            default: e = gemv_one_pass<LM_CUDA_EPI_SWIGLU>(c, yt, xt, w, k, m, norm_w, eps); break;
            }
            if (e != cudaErrorNotSupported) {
                if (e != cudaSuccess) return lm_cuda_fail(e, "gemv launch");
                continue;
            }
        }
        switch (epi) {
        case LM_CUDA_EPI_STORE:
            e = gemv_dispatch<LM_CUDA_EPI_STORE>(c, T, R, yt, ldy, xt, ldx, w, k, m, norm_w, eps);
            break;
        case LM_CUDA_EPI_ADD:
            e = gemv_dispatch<LM_CUDA_EPI_ADD>(c, T, R, yt, ldy, xt, ldx, w, k, m, norm_w, eps);
            break;
        default:
            e = gemv_dispatch<LM_CUDA_EPI_SWIGLU>(c, T, R, yt, ldy, xt, ldx, w, k, m, norm_w, eps);
            break;
        }
        if (e != cudaSuccess) return lm_cuda_fail(e, "gemv launch");
    }
    return LM_OK;
}

extern "C" lm_status lm_cuda_gemm(struct lm_cuda_ctx *c, float *y, const uint16_t *x_bf16,
                                  const uint16_t *w, int n, int k, int m, bool accumulate) {
    if (n < 1 || k < 1 || m < 1 || k % 8)
        return lm_errorf(LM_ERR_SHAPE, "CUDA gemm: [%d, %d] x [%d, %d]^T: k must be a multiple of 8",
                         n, k, m, k);
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


extern "C" lm_status lm_cuda_layer_fused(struct lm_cuda_ctx *c, const struct lm_cuda_layer_fused_args *a) {
    const int kmax = a->Q > a->I ? (a->Q > a->H ? a->Q : a->H) : (a->I > a->H ? a->I : a->H);
    if (a->H < 8 || a->Q < 8 || a->I < 8 || a->H % 8 || a->Q % 8 || a->I % 8 || kmax > 4096 ||
        (a->wqkv && (a->QKV < 2 || a->QKV % 2)) || ((uintptr_t)a->wo & 15) || ((uintptr_t)a->wgu & 15) ||
        ((uintptr_t)a->wd & 15) || ((uintptr_t)a->wqkv & 15))
        return lm_errorf(LM_ERR_SHAPE,
                         "CUDA layer_fused: hidden %d, q width %d, intermediate %d and q/k/v rows %d must be "
                         "multiples of 8 (q/k/v: of 2), at most 4096, with 16-byte aligned weights",
                         a->H, a->Q, a->I, a->QKV);
    const size_t smem = (size_t)(kmax + 255) / 256 * 256 * sizeof(float);
    const int occ = lm_cuda_occupancy((const void *)k_layer_fused, GEMV_THREADS, smem);
    if (occ < 1) return lm_errorf(LM_ERR_UNSUPPORTED, "CUDA layer_fused: the kernel does not fit a multiprocessor");
    /* Every block must be resident at once (grid barriers): at most the occupancy, and 2 an SM
     * (more blocks only add staging work, docs/perf-notes.md v7). */
    const int per = c->layer_fused_blocks == 1 ? 1 : 2;
    const int grid = (occ < per ? occ : per) * c->sm_count;
    cudaError_t e = lm_launch(c, dim3(grid), dim3(GEMV_THREADS), smem, k_layer_fused, *a, c->grid_bar);
    if (e != cudaSuccess) return lm_cuda_fail(e, "layer_fused launch");
    return LM_OK;
}
