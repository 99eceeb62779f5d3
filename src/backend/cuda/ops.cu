/* ops.cu: the CUDA kernels of cuda.h and their launch wrappers. See cuda.h for the contracts;
 * this file says how. Every kernel calls pdl_wait() before it reads or writes anything another
 * kernel touches (see common.cuh). */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "backend/cuda/common.cuh"

lm_status lm_cuda_fail(cudaError_t e, const char *what) {
    cudaGetLastError(); /* clear a sticky launch error so later calls report their own */
    return lm_errorf(e == cudaErrorMemoryAllocation ? LM_ERR_NOMEM : LM_ERR_IO, "CUDA: %s: %s", what,
                     cudaGetErrorString(e));
}

/* ---- device and memory ---- */

extern "C" int lm_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" lm_status lm_cuda_device_info(int dev, struct lm_cuda_device_info *out) {
    memset(out, 0, sizeof *out);
    if (dev < 0 || dev >= lm_cuda_device_count())
        return lm_errorf(LM_ERR_UNSUPPORTED, "CUDA: no device %d (%d found)", dev, lm_cuda_device_count());
    cudaDeviceProp p;
    LM_CU(cudaGetDeviceProperties(&p, dev));
    snprintf(out->name, sizeof out->name, "%.127s", p.name);
    out->cc_major = p.major;
    out->cc_minor = p.minor;
    out->sm_count = p.multiProcessorCount;
    out->total_mem = p.totalGlobalMem;
    out->l2_bytes = p.l2CacheSize;
    LM_CU(cudaDriverGetVersion(&out->driver));
    LM_CU(cudaRuntimeGetVersion(&out->runtime));
    int cur = 0;
    LM_CU(cudaGetDevice(&cur));
    LM_CU(cudaSetDevice(dev));
    size_t fr = 0, tot = 0;
    cudaError_t e = cudaMemGetInfo(&fr, &tot);
    cudaSetDevice(cur);
    if (e != cudaSuccess) return lm_cuda_fail(e, "cudaMemGetInfo");
    out->free_mem = fr;
    return LM_OK;
}

extern "C" lm_status lm_cuda_malloc(void **p, size_t bytes) {
    *p = NULL;
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        cudaGetLastError();
        *p = NULL;
        return lm_errorf(LM_ERR_NOMEM, "CUDA: cannot allocate %.1f MiB of device memory: %s",
                         bytes / 1048576.0, cudaGetErrorString(e));
    }
    return LM_OK;
}

extern "C" void lm_cuda_free(void *p) {
    if (p) cudaFree(p);
}

extern "C" lm_status lm_cuda_upload(void *dst, const void *src, size_t bytes) {
    LM_CU(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    return LM_OK;
}

extern "C" lm_status lm_cuda_download(void *dst, const void *src, size_t bytes) {
    LM_CU(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
    return LM_OK;
}

extern "C" lm_status lm_cuda_memset(void *dst, int byte, size_t bytes) {
    LM_CU(cudaMemset(dst, byte, bytes));
    return LM_OK;
}

/* ---- contexts ---- */

enum { AM_CHUNK = 8192, AM_MAX_CHUNKS = 64 };

extern "C" struct lm_cuda_ctx_params lm_cuda_ctx_default_params(void) {
    struct lm_cuda_ctx_params p;
    memset(&p, 0, sizeof p);
    p.device = 0;
    p.pdl = true;
    p.max_rows = 256;
    p.gemv_rows = 0;
    p.pdl_early = true;
    return p;
}

extern "C" void lm_cuda_ctx_destroy(struct lm_cuda_ctx *c) {
    if (!c) return;
    if (c->stream) cudaStreamSynchronize(c->stream);
    if (c->blas) cublasDestroy(c->blas);
    cudaFree(c->blas_ws);
    cudaFree(c->am_part);
    cudaFree(c->am_count);
    if (c->stream) cudaStreamDestroy(c->stream);
    delete c;
}

extern "C" lm_status lm_cuda_ctx_create(const struct lm_cuda_ctx_params *params,
                                        struct lm_cuda_ctx **out) {
    *out = NULL;
    struct lm_cuda_ctx_params p = params ? *params : lm_cuda_ctx_default_params();
    struct lm_cuda_device_info info;
    lm_status rc = lm_cuda_device_info(p.device, &info);
    if (rc) return rc;
    if (info.cc_major < 9)
        return lm_errorf(LM_ERR_UNSUPPORTED,
                         "CUDA: device %d (%s) has compute capability %d.%d; this build needs 9.0 "
                         "(Hopper) or newer",
                         p.device, info.name, info.cc_major, info.cc_minor);
    LM_CU(cudaSetDevice(p.device));
    lm_cuda_ctx *c = new lm_cuda_ctx();
    memset(c, 0, sizeof *c);
    c->device = p.device;
    c->sm_count = info.sm_count;
    c->pdl = p.pdl;
    c->gemv_rows = p.gemv_rows;
    c->max_rows = p.max_rows > 0 ? p.max_rows : 1;
    cudaError_t e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    const size_t ws_bytes = 32u << 20;
    if (e == cudaSuccess) e = cudaMalloc(&c->blas_ws, ws_bytes);
    if (e == cudaSuccess) e = cudaMalloc(&c->am_part, sizeof(float2) * c->max_rows * AM_MAX_CHUNKS);
    if (e == cudaSuccess) e = cudaMalloc(&c->am_count, sizeof(unsigned) * c->max_rows);
    if (e == cudaSuccess) e = cudaMemset(c->am_count, 0, sizeof(unsigned) * c->max_rows);
    if (e != cudaSuccess) {
        rc = lm_cuda_fail(e, "context setup");
        lm_cuda_ctx_destroy(c);
        return rc;
    }
    if ((rc = lm_cuda_set_early_trigger(p.pdl_early))) {
        lm_cuda_ctx_destroy(c);
        return rc;
    }
    cublasStatus_t bs = cublasCreate(&c->blas);
    if (bs == CUBLAS_STATUS_SUCCESS) bs = cublasSetStream(c->blas, c->stream);
    if (bs == CUBLAS_STATUS_SUCCESS) bs = cublasSetWorkspace(c->blas, c->blas_ws, ws_bytes);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        if (bs != CUBLAS_STATUS_SUCCESS && c->blas == NULL) c->blas = NULL;
        lm_cuda_ctx_destroy(c);
        return lm_errorf(LM_ERR_IO, "cuBLAS: setup failed: %s", cublasGetStatusString(bs));
    }
    *out = c;
    return LM_OK;
}

extern "C" lm_status lm_cuda_ctx_sync(struct lm_cuda_ctx *c) {
    LM_CU(cudaStreamSynchronize(c->stream));
    LM_CU(cudaGetLastError());
    return LM_OK;
}

extern "C" void *lm_cuda_ctx_stream(struct lm_cuda_ctx *c) { return (void *)c->stream; }
extern "C" void lm_cuda_ctx_set_pdl(struct lm_cuda_ctx *c, bool on) { c->pdl = on; }
extern "C" void lm_cuda_ctx_set_gemv_rows(struct lm_cuda_ctx *c, int rows) {
    c->gemv_rows = (rows == 1 || rows == 2 || rows == 4) ? rows : 0;
}

/* ---- small device helpers ---- */

/* 1: kernels let their successor launch as soon as they start (its blocks then prefetch their
 * weights while this one runs); 0: GEMVs trigger after staging their input, others at exit. */
__constant__ int c_pdl_early;

/* Kernel entry: the early trigger (when on), then wait for the predecessor. */
__device__ __forceinline__ void pdl_start() {
    if (c_pdl_early) pdl_trigger();
    pdl_wait();
}

extern "C" lm_status lm_cuda_set_early_trigger(bool on) {
    const int v = on ? 1 : 0;
    LM_CU(cudaMemcpyToSymbol(c_pdl_early, &v, sizeof v));
    return LM_OK;
}

namespace {

__device__ __forceinline__ float bf2f(uint16_t v) { return __uint_as_float((uint32_t)v << 16); }
__device__ __forceinline__ float bf_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }
__device__ __forceinline__ uint16_t f2bf(float f) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

/* 16 bytes of weights that are read once: skip L1. */
__device__ __forceinline__ uint4 ld_stream16(const void *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

/* ---- GEMV ---- */

constexpr int GEMV_WARPS = 8, GEMV_THREADS = GEMV_WARPS * 32;

/* Shared-memory slot of element k of an activation row: within each 256-element chunk, lane l's
 * 8 elements (l*8 .. l*8+7) sit as two float4s, at 4*l and 128 + 4*l, so a warp's float4 reads
 * are contiguous and conflict-free. */
__device__ __forceinline__ int gemv_slot(int k) {
    int e = k & 255;
    return (k & ~255) + ((e >> 2) & 1) * 128 + (e >> 3) * 4 + (e & 3);
}

/* T activation rows, R weight rows per warp, U 256-element chunks loaded per batch. */
template <int T, int R, int U, int EPI>
__global__ void __launch_bounds__(GEMV_THREADS)
    k_gemv(float *y, int ldy, const float *x, int ldx, const uint16_t *__restrict__ w, int K, int M,
           const float *__restrict__ nw, float eps) {
    static_assert(EPI != LM_CUDA_EPI_SWIGLU || R % 2 == 0, "SwiGLU needs row pairs");
    extern __shared__ float4 gemv_smem[];
    float *xs = reinterpret_cast<float *>(gemv_smem);
    __shared__ float inv_s[T];
    const int nch = (K + 255) >> 8, Kp = nch << 8;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n_rg = (M + R - 1) / R;
    const int stride = gridDim.x * GEMV_WARPS;
    int rg = blockIdx.x * GEMV_WARPS + warp;

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
    /* The weights never depend on the previous kernel: start streaming them before waiting. */
    if (rg < n_rg) load(rg, 0);
    if (c_pdl_early) pdl_trigger();
    pdl_wait();

    /* Stage x in shared memory: every load independent (a strided loop the compiler cannot
     * batch costs one L2 round trip per iteration). */
    const int total = T * Kp;
#pragma unroll 4
    for (int i = threadIdx.x; i < total; i += GEMV_THREADS) {
        const int t = i / Kp, k = i - t * Kp;
        xs[t * Kp + gemv_slot(k)] = k < K ? x[(size_t)t * ldx + k] : 0.f;
    }
    __syncthreads();
    if (nw) {
        /* Warp t sums row t's squares (the padding is zero), then every thread scales. */
        for (int t = warp; t < T; t += GEMV_WARPS) {
            float s = 0.f;
            for (int i = lane; i < Kp; i += 32) s = fmaf(xs[t * Kp + i], xs[t * Kp + i], s);
            s = warp_sum(s);
            if (lane == 0) inv_s[t] = 1.0f / sqrtf(s / (float)K + eps);
        }
        __syncthreads();
#pragma unroll 4
        for (int i = threadIdx.x; i < total; i += GEMV_THREADS) {
            const int t = i / Kp, k = i - t * Kp;
            if (k < K) {
                const int sl = t * Kp + gemv_slot(k);
                xs[sl] = nw[k] * (xs[sl] * inv_s[t]);
            }
        }
        __syncthreads();
    }
    if (!c_pdl_early) pdl_trigger();

    bool have = rg < n_rg;
    for (; rg < n_rg; rg += stride) {
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
            for (int r = 0; r < R; r++) acc[t][r] = warp_sum(acc[t][r]);
        const int j0 = rg * R;
#pragma unroll
        for (int t = 0; t < T; t++)
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (lane != t * R + r) continue;
                const int j = j0 + r;
                if (EPI == LM_CUDA_EPI_STORE) {
                    if (j < M) y[(size_t)t * ldy + j] = acc[t][r];
                } else if (EPI == LM_CUDA_EPI_ADD) {
                    if (j < M) y[(size_t)t * ldy + j] += acc[t][r];
                } else if ((r & 1) == 0 && j + 1 < M) {
                    y[(size_t)t * ldy + (j >> 1)] = silu_mul(acc[t][r], acc[t][(r + 1) % R]);
                }
            }
    }
}

/* ---- row kernels ---- */

__global__ void k_embed(float *x, const uint16_t *__restrict__ table, const int32_t *ids, int d) {
    pdl_start();
    const uint16_t *row = table + (size_t)ids[blockIdx.x] * d;
    float *o = x + (size_t)blockIdx.x * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) o[i] = bf2f(row[i]);
}

__global__ void k_gather(float *y, const float *x, const int32_t *rows, int d) {
    pdl_start();
    const float *src = x + (size_t)rows[blockIdx.x] * d;
    float *o = y + (size_t)blockIdx.x * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) o[i] = src[i];
}

/* One block (256 threads) per row. */
__global__ void k_rmsnorm_bf16(uint16_t *y, const float *x, const float *__restrict__ w,
                               const int32_t *rows, int d, float eps) {
    __shared__ float red[8];
    pdl_start();
    const int r = rows ? rows[blockIdx.x] : blockIdx.x;
    const float *xi = x + (size_t)r * d;
    float s = 0.f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) s = fmaf(xi[i], xi[i], s);
    s = warp_sum(s);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
    __syncthreads();
    float tot = 0.f;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) tot += red[i];
    const float inv = 1.0f / sqrtf(tot / (float)d + eps);
    uint16_t *yi = y + (size_t)blockIdx.x * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) yi[i] = f2bf(w[i] * (xi[i] * inv));
}

__global__ void k_swiglu_bf16(uint16_t *y, const float *gu, long n) {
    pdl_start();
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        y[i] = f2bf(silu_mul(gu[2 * i], gu[2 * i + 1]));
}

/* ---- attention ---- */

constexpr int ATT_WARPS = 4, ATT_MAXG = 8;

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
    pdl_start();
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
template <int D, bool FUSED, bool OBF>
__global__ void __launch_bounds__(ATT_WARPS * 32) k_attention(const lm_cuda_attn a) {
    using S = AttShape<D>;
    constexpr int DPL = S::DPL, LPT = S::LPT;
    constexpr int TPW = S::TPW;
    __shared__ __align__(16) float qs[ATT_MAXG][D];
    __shared__ float ps[ATT_WARPS][ATT_MAXG][32];
    __shared__ float wm[ATT_WARPS][ATT_MAXG], wl[ATT_WARPS][ATT_MAXG];
    __shared__ float wacc[ATT_WARPS][ATT_MAXG][D];
    const int g = blockIdx.x, t = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int G = a.n_heads / a.n_kv_heads, BS = a.block_size;
    pdl_start();
    const int seq = a.seq[t], pos = a.pos[t];
    const int32_t *bt = a.block_tables + (size_t)seq * a.bt_width;
    const float *row = a.qkv + (size_t)t * a.ld_qkv;
    const int Q = a.n_heads * D, KV = a.n_kv_heads * D;
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

    const int L = pos + 1, nchunk = (L + 31) >> 5;
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
        unsigned long long off = 0;
        if (tok < L) {
            off = kv_offset(a, bt[tok / BS], g, tok % BS, D);
            const uint16_t *kr = a.k_cache + off;
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
                    float v = s[h];
                    v = fmaf(qa.x, k0, v);
                    v = fmaf(qa.y, k1, v);
                    v = fmaf(qa.z, k2, v);
                    v = fmaf(qa.w, k3, v);
                    v = fmaf(qb.x, k4, v);
                    v = fmaf(qb.y, k5, v);
                    v = fmaf(qb.z, k6, v);
                    v = fmaf(qb.w, k7, v);
                    s[h] = v;
                }
            }
#pragma unroll
            for (int h = 0; h < ATT_MAXG; h++) s[h] *= a.scale;
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
        constexpr int PB = 8;
#pragma unroll
        for (int base = 0; base < 32; base += TPW * PB) {
            float v[PB][DPL];
#pragma unroll
            for (int j = 0; j < PB; j++) {
                const int tt = base + j * TPW + gi;
                const unsigned long long o = __shfl_sync(0xffffffffu, off, tt & 31);
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
    for (int i = threadIdx.x; i < G * D; i += blockDim.x) {
        const int h = i / D, d = i % D;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, wm[w][h]);
        float num = 0.f, den = 0.f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++) {
            const float f = wm[w][h] == -INFINITY ? 0.f : expf(wm[w][h] - M);
            num = fmaf(wacc[w][h][d], f, num);
            den = fmaf(wl[w][h], f, den);
        }
        const float o = num / den;
        const size_t oi = (size_t)t * Q + (size_t)(g * G + h) * D + d;
        if (OBF)
            static_cast<uint16_t *>(a.out)[oi] = f2bf(o);
        else
            static_cast<float *>(a.out)[oi] = o;
    }
}

/* ---- choosing tokens ---- */

__device__ __forceinline__ bool am_better(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

/* Greedy rows: grid (chunks, rows) of 256 threads; each block reduces its chunk to (max, lowest
 * id), the last block of a row to finish reduces the chunks' results. */
__global__ void __launch_bounds__(256) k_argmax(int32_t *ids, const float *logits, int ld, int V,
                                                int chunk, int nchunks,
                                                const lm_cuda_sampling *params, float2 *part,
                                                unsigned *count) {
    __shared__ float sv[8];
    __shared__ int si[8];
    const int r = blockIdx.y, b = blockIdx.x;
    pdl_start();
    if (params && params[r].temperature > 0) return;
    const float *row = logits + (size_t)r * ld;
    const int lo = b * chunk, hi = min(V, lo + chunk);
    float bv = -INFINITY;
    int bi = INT_MAX;
#pragma unroll 8
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const float v = row[i];
        if (v > bv) bv = v, bi = i;
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (am_better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    if ((threadIdx.x & 31) == 0) sv[threadIdx.x >> 5] = bv, si[threadIdx.x >> 5] = bi;
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (int w = 1; w < 8; w++)
        if (am_better(sv[w], si[w], bv, bi)) bv = sv[w], bi = si[w];
    part[(size_t)r * nchunks + b] = make_float2(bv, __int_as_float(bi));
    __threadfence();
    if (atomicAdd(&count[r], 1u) != (unsigned)nchunks - 1) return;
    __threadfence();
    bv = -INFINITY, bi = INT_MAX;
    for (int i = 0; i < nchunks; i++) {
        const float2 p = __ldcg(&part[(size_t)r * nchunks + i]);
        const int pi = __float_as_int(p.y);
        if (am_better(p.x, pi, bv, bi)) bv = p.x, bi = pi;
    }
    ids[r] = bi == INT_MAX ? 0 : bi;
    count[r] = 0;
}

constexpr int SMP_THREADS = 1024, SMP_WARPS = SMP_THREADS / 32;

/* Order-preserving map of a float's bits to an unsigned key (larger float, larger key). */
__device__ __forceinline__ uint32_t okey(float v) {
    const uint32_t u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_val(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

struct SmpShared {
    unsigned hcnt[256];
    float hmass[256];
    double dred[SMP_WARPS + 1];
    float fred[SMP_WARPS + 1];
    unsigned ured[SMP_WARPS + 1];
    int sel_b;
    double sel_d;
    unsigned sel_u;
};

__device__ double block_sum_d(double v, SmpShared &sh) {
    v = warp_sum_d(v);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) sh.dred[warp] = v;
    __syncthreads();
    if (warp == 0) {
        double x = lane < SMP_WARPS ? sh.dred[lane] : 0.0;
        x = warp_sum_d(x);
        if (lane == 0) sh.dred[SMP_WARPS] = x;
    }
    __syncthreads();
    const double r = sh.dred[SMP_WARPS];
    __syncthreads();
    return r;
}

__device__ float block_max(float v, SmpShared &sh) {
    v = warp_max(v);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) sh.fred[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float x = lane < SMP_WARPS ? sh.fred[lane] : -INFINITY;
        x = warp_max(x);
        if (lane == 0) sh.fred[SMP_WARPS] = x;
    }
    __syncthreads();
    const float r = sh.fred[SMP_WARPS];
    __syncthreads();
    return r;
}

/* Exclusive prefix sum of one unsigned per thread (in thread order); *total gets the sum. */
__device__ unsigned block_scan_u(unsigned v, unsigned *total, SmpShared &sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned inc = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned n = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += n;
    }
    if (lane == 31) sh.ured[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        unsigned x = lane < SMP_WARPS ? sh.ured[lane] : 0u, xi = x;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const unsigned n = __shfl_up_sync(0xffffffffu, xi, o);
            if (lane >= o) xi += n;
        }
        if (lane < SMP_WARPS) sh.ured[lane] = xi - x; /* exclusive */
        if (lane == 31) sh.sel_u = xi;
    }
    __syncthreads();
    const unsigned r = sh.ured[warp] + inc - v;
    *total = sh.sel_u;
    __syncthreads();
    return r;
}

__device__ __forceinline__ bool smp_cand(float v, uint32_t lo_key) {
    return v == v && v > -INFINITY && okey(v) >= lo_key;
}

/* Radix selection by probability mass: over candidates (key >= lo_key), in descending key order,
 * the key where the cumulative mass first reaches target (>= target; > when strict). *above gets
 * the mass of the keys above it. */
__device__ void radix_mass(const float *row, int V, uint32_t lo_key, float mx, float inv_t,
                           double target, bool strict, uint32_t *out_key, double *out_above,
                           SmpShared &sh) {
    uint32_t prefix = 0, mask = 0;
    double above = 0.0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += SMP_THREADS) sh.hmass[i] = 0.f;
        __syncthreads();
        for (int i = threadIdx.x; i < V; i += SMP_THREADS) {
            const float v = row[i];
            if (!smp_cand(v, lo_key)) continue;
            const uint32_t k = okey(v);
            if ((k & mask) == prefix) atomicAdd(&sh.hmass[(k >> shift) & 255], expf((v - mx) * inv_t));
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            double cum = above;
            int b = 255, last = -1;
            for (; b >= 0; b--) {
                const float h = sh.hmass[b];
                if (h <= 0.f) continue;
                last = b;
                if (strict ? cum + h > target : cum + h >= target) break;
                cum += h;
            }
            if (b < 0) { /* never reached (rounding): the lowest non-empty bin */
                b = last < 0 ? 0 : last;
                if (last >= 0) cum -= sh.hmass[last];
            }
            sh.sel_b = b;
            sh.sel_d = cum;
        }
        __syncthreads();
        prefix |= (uint32_t)sh.sel_b << shift;
        mask |= 255u << shift;
        above = sh.sel_d;
        __syncthreads();
    }
    *out_key = prefix;
    *out_above = above;
}

/* The j-th (0-based, in id order) candidate with exactly this key; *n_ties gets their number. */
__device__ int nth_with_key(const float *row, int V, uint32_t key, unsigned j, unsigned *n_ties,
                            SmpShared &sh) {
    const int span = (V + SMP_THREADS - 1) / SMP_THREADS;
    const int lo = threadIdx.x * span, hi = min(V, lo + span);
    unsigned cnt = 0;
    for (int i = lo; i < hi; i++) {
        const float v = row[i];
        cnt += v == v && okey(v) == key;
    }
    unsigned total;
    const unsigned before = block_scan_u(cnt, &total, sh);
    *n_ties = total;
    if (j >= total) j = total ? total - 1 : 0;
    if (threadIdx.x == 0) sh.sel_b = -1;
    __syncthreads();
    if (j >= before && j < before + cnt) {
        unsigned k = before;
        for (int i = lo; i < hi; i++) {
            const float v = row[i];
            if (v == v && okey(v) == key) {
                if (k == j) {
                    sh.sel_b = i;
                    break;
                }
                k++;
            }
        }
    }
    __syncthreads();
    const int r = sh.sel_b;
    __syncthreads();
    return r;
}

__device__ __forceinline__ uint64_t splitmix_fin(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Sampled rows: one block of 1024 threads per row (greedy rows return at once). */
__global__ void __launch_bounds__(SMP_THREADS) k_sample(int32_t *ids, const float *logits, int ld,
                                                        int V, const lm_cuda_sampling *params) {
    __shared__ SmpShared sh;
    const int r = blockIdx.x;
    pdl_start();
    const lm_cuda_sampling p = params[r];
    if (!(p.temperature > 0)) return;
    const float *row = logits + (size_t)r * ld;
    const float inv_t = 1.0f / p.temperature;

    /* top_k: the key of the k-th largest logit (radix selection on counts). */
    uint32_t cut = 0;
    if (p.top_k > 0 && p.top_k < V) {
        uint32_t prefix = 0, mask = 0;
        unsigned kk = (unsigned)p.top_k;
        bool found = true;
        for (int shift = 24; shift >= 0 && found; shift -= 8) {
            for (int i = threadIdx.x; i < 256; i += SMP_THREADS) sh.hcnt[i] = 0;
            __syncthreads();
            for (int i = threadIdx.x; i < V; i += SMP_THREADS) {
                const float v = row[i];
                if (v != v) continue;
                const uint32_t k = okey(v);
                if ((k & mask) == prefix) atomicAdd(&sh.hcnt[(k >> shift) & 255], 1u);
            }
            __syncthreads();
            if (threadIdx.x == 0) {
                unsigned cum = 0;
                int b = 255;
                for (; b >= 0; b--) {
                    if (cum + sh.hcnt[b] >= kk) break;
                    cum += sh.hcnt[b];
                }
                sh.sel_b = b;
                sh.sel_u = b >= 0 ? kk - cum : 0;
            }
            __syncthreads();
            if (sh.sel_b < 0) {
                found = false; /* fewer than k values: every one is a candidate */
            } else {
                prefix |= (uint32_t)sh.sel_b << shift;
                mask |= 255u << shift;
                kk = sh.sel_u;
            }
            __syncthreads();
        }
        cut = found ? prefix : 0;
    }

    float mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += SMP_THREADS) {
        const float v = row[i];
        if (smp_cand(v, cut)) mx = fmaxf(mx, v);
    }
    mx = block_max(mx, sh);
    if (mx == -INFINITY) { /* nothing to draw from: argmax of an all -inf/NaN row is 0 */
        if (threadIdx.x == 0) ids[r] = 0;
        return;
    }
    double sum = 0.0;
    for (int i = threadIdx.x; i < V; i += SMP_THREADS) {
        const float v = row[i];
        if (smp_cand(v, cut)) sum += expf((v - mx) * inv_t);
    }
    sum = block_sum_d(sum, sh);

    /* top_p: the last kept key kap, the mass above it, and how many of its ties stay. */
    uint32_t kap = cut;
    double kept = sum;
    unsigned n_keep = UINT_MAX;
    if (p.top_p < 1.0f) {
        const double target = (p.top_p > 0 ? (double)p.top_p : 0.0) * sum;
        double above;
        radix_mass(row, V, cut, mx, inv_t, target, false, &kap, &above, sh);
        const double pk = expf((key_val(kap) - mx) * inv_t);
        double need = ceil((target - above) / pk);
        if (!(need >= 1)) need = 1;
        unsigned n_ties;
        nth_with_key(row, V, kap, 0, &n_ties, sh);
        n_keep = need >= (double)n_ties ? n_ties : (unsigned)need;
        kept = above + n_keep * pk;
    }

    /* The draw, in rank order (descending logit, ascending id). */
    const double u = (double)(splitmix_fin(p.seed + (p.counter + 1) * 0x9e3779b97f4a7c15ull) >> 11) *
                     0x1.0p-53;
    const double target = u * kept;
    uint32_t key;
    double above;
    radix_mass(row, V, kap, mx, inv_t, target, true, &key, &above, sh);
    const double pk = expf((key_val(key) - mx) * inv_t);
    double jd = floor((target - above) / pk);
    if (!(jd >= 0)) jd = 0;
    unsigned j = jd > 4e9 ? 4000000000u : (unsigned)jd;
    if (key == kap && n_keep != UINT_MAX && j >= n_keep) j = n_keep - 1;
    unsigned n_ties;
    const int id = nth_with_key(row, V, key, j, &n_ties, sh);
    if (threadIdx.x == 0) ids[r] = id < 0 ? 0 : id;
}

/* ---- launch helpers ---- */

/* Blocks of `fn` resident per multiprocessor with `smem` dynamic bytes (cached). */
int occupancy(const void *fn, int threads, size_t smem) {
    struct entry {
        const void *fn;
        size_t smem;
        int blocks;
    };
    static entry cache[256];
    static int n_cache;
    static std::mutex mu;
    std::lock_guard<std::mutex> lock(mu);
    for (int i = 0; i < n_cache; i++)
        if (cache[i].fn == fn && cache[i].smem == smem) return cache[i].blocks;
    int nb = 0;
    if (smem > 48 * 1024) cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, fn, threads, smem) != cudaSuccess || nb < 1) {
        cudaGetLastError();
        nb = 1;
    }
    if (n_cache < 256) cache[n_cache++] = {fn, smem, nb};
    return nb;
}

template <int T, int R, int EPI>
cudaError_t launch_gemv(const lm_cuda_ctx *c, float *y, int ldy, const float *x, int ldx,
                        const uint16_t *w, int k, int m, const float *nw, float eps) {
    /* Chunks of 256 weights a lane loads before using any: enough bytes in flight per SM even
     * when a small matrix gives each SM only one block (o_proj, down_proj at batch 1). */
    constexpr int U = (T == 1 && R <= 2) ? 8 : T <= 2 ? 4 : 2;
    auto fn = k_gemv<T, R, U, EPI>;
    const int nch = (k + 255) / 256;
    const size_t smem = (size_t)T * nch * 256 * sizeof(float);
    const int n_rg = (m + R - 1) / R;
    const int need = (n_rg + GEMV_WARPS - 1) / GEMV_WARPS;
    const int cap = occupancy((const void *)fn, GEMV_THREADS, smem) * c->sm_count;
    const int grid = need < cap ? need : cap;
    return lm_launch(c, dim3(grid), dim3(GEMV_THREADS), smem, fn, y, ldy, x, ldx, w, k, m, nw, eps);
}

template <int T, int EPI>
cudaError_t gemv_rows_dispatch(const lm_cuda_ctx *c, int R, float *y, int ldy, const float *x,
                               int ldx, const uint16_t *w, int k, int m, const float *nw, float eps) {
    if constexpr (EPI == LM_CUDA_EPI_SWIGLU) {
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

} // namespace

/* ---- wrappers ---- */

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
    /* Rows per warp: 2 when that still gives every multiprocessor a block, else 1. */
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
        cudaError_t e;
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

extern "C" lm_status lm_cuda_rmsnorm_bf16(struct lm_cuda_ctx *c, uint16_t *y, const float *x,
                                          const float *w, const int32_t *rows, int n, int d,
                                          float eps) {
    if (n < 1) return LM_OK;
    LM_CU(lm_launch(c, dim3(n), dim3(256), 0, k_rmsnorm_bf16, y, x, w, rows, d, eps));
    return LM_OK;
}

extern "C" lm_status lm_cuda_swiglu_bf16(struct lm_cuda_ctx *c, uint16_t *y, const float *gu, int n,
                                         int inter) {
    const long total = (long)n * inter;
    if (total < 1) return LM_OK;
    long blocks = (total + 255) / 256;
    if (blocks > 8L * c->sm_count * 8) blocks = 8L * c->sm_count * 8;
    LM_CU(lm_launch(c, dim3((unsigned)blocks), dim3(256), 0, k_swiglu_bf16, y, gu, total));
    return LM_OK;
}

extern "C" lm_status lm_cuda_embed(struct lm_cuda_ctx *c, float *x, const uint16_t *table,
                                   const int32_t *ids, int n, int d) {
    if (n < 1) return LM_OK;
    LM_CU(lm_launch(c, dim3(n), dim3(256), 0, k_embed, x, table, ids, d));
    return LM_OK;
}

extern "C" lm_status lm_cuda_gather_rows(struct lm_cuda_ctx *c, float *y, const float *x,
                                         const int32_t *rows, int n, int d) {
    if (n < 1) return LM_OK;
    LM_CU(lm_launch(c, dim3(n), dim3(256), 0, k_gather, y, x, rows, d));
    return LM_OK;
}

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

template <int D>
static cudaError_t launch_attention(const lm_cuda_ctx *c, const lm_cuda_attn &a, int n, bool fused) {
    const dim3 grid(a.n_kv_heads, n), block(ATT_WARPS * 32);
    if (fused)
        return a.out_bf16 ? lm_launch(c, grid, block, 0, k_attention<D, true, true>, a)
                          : lm_launch(c, grid, block, 0, k_attention<D, true, false>, a);
    return a.out_bf16 ? lm_launch(c, grid, block, 0, k_attention<D, false, true>, a)
                      : lm_launch(c, grid, block, 0, k_attention<D, false, false>, a);
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

extern "C" double lm_cuda_uniform(uint64_t seed, uint64_t counter) {
    uint64_t z = seed + (counter + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

extern "C" lm_status lm_cuda_sample(struct lm_cuda_ctx *c, int32_t *ids, const float *logits, int ld,
                                    int n_rows, int vocab, const struct lm_cuda_sampling *params) {
    if (n_rows < 1) return LM_OK;
    if (n_rows > c->max_rows)
        return lm_errorf(LM_ERR_RANGE, "CUDA sample: %d rows exceed the context's max_rows %d", n_rows,
                         c->max_rows);
    int chunk = AM_CHUNK;
    if ((vocab + chunk - 1) / chunk > AM_MAX_CHUNKS) chunk = (vocab + AM_MAX_CHUNKS - 1) / AM_MAX_CHUNKS;
    const int nchunks = (vocab + chunk - 1) / chunk;
    LM_CU(lm_launch(c, dim3(nchunks, n_rows), dim3(256), 0, k_argmax, ids, logits, ld, vocab, chunk,
                    nchunks, params, c->am_part, c->am_count));
    if (params) LM_CU(lm_launch(c, dim3(n_rows), dim3(SMP_THREADS), 0, k_sample, ids, logits, ld, vocab, params));
    return LM_OK;
}

extern "C" lm_status lm_cuda_bench_copy(int dev, size_t bytes, int reps, double *bytes_per_s) {
    *bytes_per_s = 0;
    if (bytes < (64u << 20)) bytes = 64u << 20;
    if (reps < 1) reps = 1;
    LM_CU(cudaSetDevice(dev));
    void *a = NULL, *b = NULL;
    lm_status rc = lm_cuda_malloc(&a, bytes);
    if (!rc) rc = lm_cuda_malloc(&b, bytes);
    cudaEvent_t e0 = NULL, e1 = NULL;
    std::vector<float> ms;
    if (!rc && (cudaMemset(a, 1, bytes) != cudaSuccess || cudaEventCreate(&e0) != cudaSuccess ||
                cudaEventCreate(&e1) != cudaSuccess))
        rc = lm_cuda_fail(cudaGetLastError(), "bench_copy setup");
    for (int i = -1; i < reps && !rc; i++) {
        cudaEventRecord(e0);
        cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
        cudaEventRecord(e1);
        cudaError_t e = cudaEventSynchronize(e1);
        if (e != cudaSuccess) rc = lm_cuda_fail(e, "bench_copy");
        float t = 0;
        cudaEventElapsedTime(&t, e0, e1);
        if (i >= 0) ms.push_back(t);
    }
    if (!rc) {
        std::sort(ms.begin(), ms.end());
        *bytes_per_s = 2.0 * (double)bytes / (ms[ms.size() / 2] * 1e-3);
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    lm_cuda_free(a);
    lm_cuda_free(b);
    return rc;
}
