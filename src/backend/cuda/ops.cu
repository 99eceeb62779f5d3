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
#include <type_traits>
#include <vector>

#include "backend/cuda/common.cuh"
#include "base/env.h"

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
        return lm_errorf(LM_ERR_UNSUPPORTED, "CUDA: no device %d (%d found: no GPU, no driver, or CUDA_VISIBLE_DEVICES "
                                                   "hides it)", dev, lm_cuda_device_count());
    cudaDeviceProp p;
    LM_CU(cudaGetDeviceProperties(&p, dev));
    snprintf(out->name, sizeof out->name, "%.127s", p.name);
    out->cc_major = p.major;
    out->cc_minor = p.minor;
    out->sm_count = p.multiProcessorCount;
    out->total_mem = p.totalGlobalMem;
    out->l2_bytes = p.l2CacheSize;
    out->smem_optin = (int)p.sharedMemPerBlockOptin;
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

/* cudaMemcpy from pageable memory may return before its DMA lands, and cudaMemset is asynchronous;
 * both run on the legacy stream, which a context's non-blocking stream does not wait for. So a
 * kernel queued right after could read the old bytes (test_cuda's attention test saw queries
 * rotated twice). Waiting for the legacy stream makes them synchronous as cuda.h promises. */
extern "C" lm_status lm_cuda_upload(void *dst, const void *src, size_t bytes) {
    LM_CU(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    LM_CU(cudaStreamSynchronize(cudaStreamLegacy));
    return LM_OK;
}

extern "C" lm_status lm_cuda_download(void *dst, const void *src, size_t bytes) {
    LM_CU(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
    return LM_OK;
}

extern "C" lm_status lm_cuda_memset(void *dst, int byte, size_t bytes) {
    LM_CU(cudaMemset(dst, byte, bytes));
    LM_CU(cudaStreamSynchronize(cudaStreamLegacy));
    return LM_OK;
}

/* ---- contexts ---- */

extern "C" struct lm_cuda_ctx_params lm_cuda_ctx_default_params(void) {
    struct lm_cuda_ctx_params p;
    memset(&p, 0, sizeof p);
    p.device = 0;
    p.pdl = true;
    p.max_rows = 256;
    p.gemv_rows = 0;
    p.attn_dec = true;      /* v7 */
    return p;
}

extern "C" void lm_cuda_ctx_destroy(struct lm_cuda_ctx *c) {
    if (!c) return;
    if (c->stream) cudaStreamSynchronize(c->stream);
    if (c->blas) cublasDestroy(c->blas);
    cudaFree(c->blas_ws);
    cudaFree(c->am_part);
    cudaFree(c->am_count);
    cudaFree(c->scr_max);
    cudaFree(c->scr_fuse);
    cudaFree(c->gemv_ctr);
    cudaFree(c->trace);
    if (c->stream) cudaStreamDestroy(c->stream);
    delete c;
}

/* The screen's per-row best lower bounds at -inf (common.cuh LM_CUDA_SCR_KEY_NEG_INF). */
static cudaError_t screen_fill(lm_cuda_ctx *c) {
    const std::vector<int> neg((size_t)c->max_rows, LM_CUDA_SCR_KEY_NEG_INF);
    const cudaError_t e = cudaMemcpy(c->scr_max, neg.data(), sizeof(int) * c->max_rows, cudaMemcpyHostToDevice);
    const lm_cuda_scr_fuse zero = {};
    return e == cudaSuccess ? cudaMemcpy(c->scr_fuse, &zero, sizeof zero, cudaMemcpyHostToDevice) : e;
}

void lm_cuda_screen_reset(lm_cuda_ctx *c) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(c->stream, &st) != cudaSuccess || st != cudaStreamCaptureStatusNone) return;
    cudaStreamSynchronize(c->stream);
    screen_fill(c);
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
    c->smem_optin = info.smem_optin;
    c->attn_dec = p.attn_dec && lm_env_flag("LM_CUDA_ATTN_DEC", true);
    c->attn_batch = lm_env_flag("LM_CUDA_ATTN_BATCH", true);
    c->attn_tc = lm_env_flag("LM_CUDA_ATTN_TC", true);
    c->gemm_tc_rows = lm_cuda_gemm_tc_default_rows();
    c->gemm_tc_splits = (int)lm_env_int("LM_CUDA_GEMM_TC_SPLITS", 0, 0, 8);
    c->gemm_wgmma = lm_env_flag("LM_CUDA_GEMM_WGMMA", true);
    c->gemm_push = lm_env_flag("LM_CUDA_GEMM_PUSH", true);
    c->gemm_spread_rows = (int)lm_env_int("LM_CUDA_GEMM_SPREAD_ROWS", 1, 0, 16);
    c->gemm_tc_bm = (int)lm_env_int("LM_CUDA_GEMM_TC_BM", 0, 0, 128);
    if (c->gemm_tc_bm != 0 && c->gemm_tc_bm != 64 && c->gemm_tc_bm != 128) {
        fprintf(stderr, "lumen: LM_CUDA_GEMM_TC_BM=%d is not 0, 64 or 128; using 0 (the rule)\n", c->gemm_tc_bm);
        c->gemm_tc_bm = 0;
    }
    c->gemv_dyn_rows = (int)lm_env_int("LM_CUDA_GEMV_DYN_ROWS", 32768, 0, 1 << 30);
    c->max_rows = p.max_rows > 0 ? p.max_rows : 1;
    cudaError_t e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    const size_t ws_bytes = 32u << 20;
    if (e == cudaSuccess) e = cudaMalloc(&c->blas_ws, ws_bytes);
    if (e == cudaSuccess) e = cudaMalloc(&c->am_part, sizeof(float2) * c->max_rows * LM_CUDA_AM_MAX_CHUNKS);
    if (e == cudaSuccess) e = cudaMalloc(&c->am_count, sizeof(unsigned) * c->max_rows);
    if (e == cudaSuccess) e = cudaMemset(c->am_count, 0, sizeof(unsigned) * c->max_rows);
    if (e == cudaSuccess) e = cudaMalloc(&c->scr_max, sizeof(int) * c->max_rows);
    if (e == cudaSuccess) e = cudaMalloc(&c->scr_fuse, sizeof(lm_cuda_scr_fuse));
    if (e == cudaSuccess) e = screen_fill(c);
    c->scr_fuse_on = lm_env_flag("LM_CUDA_SCR_FUSE", true);
    const size_t ctr_bytes = sizeof(unsigned) * (LM_CUDA_GEMV_CLASSES + 1) * LM_CUDA_GEMV_CTR_STRIDE;
    if (e == cudaSuccess) e = cudaMalloc(&c->gemv_ctr, ctr_bytes);
    if (e == cudaSuccess) e = cudaMemset(c->gemv_ctr, 0, ctr_bytes);
    if (e == cudaSuccess) e = cudaStreamSynchronize(cudaStreamLegacy); /* see lm_cuda_upload */
    if (e != cudaSuccess) {
        rc = lm_cuda_fail(e, "context setup");
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
extern "C" void lm_cuda_ctx_set_gemv_dyn_rows(struct lm_cuda_ctx *c, int rows) { c->gemv_dyn_rows = rows > 0 ? rows : 0; }
extern "C" int lm_cuda_ctx_gemv_dyn_rows(const struct lm_cuda_ctx *c) { return c->gemv_dyn_rows; }
extern "C" long lm_cuda_ctx_gemv_dealt(const struct lm_cuda_ctx *c) { return c->gemv_dealt; }
extern "C" void lm_cuda_ctx_set_attn_dec(struct lm_cuda_ctx *c, bool on) { c->attn_dec = on; }
extern "C" void lm_cuda_ctx_set_attn_tc(struct lm_cuda_ctx *c, bool on) { c->attn_tc = on; }
extern "C" void lm_cuda_ctx_set_attn_batch(struct lm_cuda_ctx *c, bool on) { c->attn_batch = on; }
extern "C" bool lm_cuda_ctx_attn_batch(const struct lm_cuda_ctx *c) { return c->attn_batch; }
extern "C" void lm_cuda_ctx_set_gemm_tc(struct lm_cuda_ctx *c, int rows, int splits) {
    c->gemm_tc_rows = rows;
    c->gemm_tc_splits = splits;
    c->n_tc_memo = 0;
}
extern "C" void lm_cuda_ctx_set_gemm_wgmma(struct lm_cuda_ctx *c, bool on) {
    c->gemm_wgmma = on;
    c->n_tc_memo = 0;
}
extern "C" bool lm_cuda_ctx_gemm_wgmma(const struct lm_cuda_ctx *c) { return c->gemm_wgmma; }
extern "C" void lm_cuda_ctx_set_gemm_push(struct lm_cuda_ctx *c, bool on) {
    c->gemm_push = on;
    c->n_tc_memo = 0;
}
extern "C" bool lm_cuda_ctx_gemm_push(const struct lm_cuda_ctx *c) { return c->gemm_push; }
extern "C" void lm_cuda_ctx_set_gemm_tc_bm(struct lm_cuda_ctx *c, int bm) {
    c->gemm_tc_bm = bm == 64 || bm == 128 ? bm : 0;
    c->n_tc_memo = 0;
}
extern "C" int lm_cuda_ctx_gemm_tc_bm(const struct lm_cuda_ctx *c) { return c->gemm_tc_bm; }
extern "C" lm_status lm_cuda_ctx_capture_begin(struct lm_cuda_ctx *c) {
    LM_CU(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
    return LM_OK;
}
extern "C" lm_status lm_cuda_ctx_capture_replay(struct lm_cuda_ctx *c, int replays) {
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    if (e == cudaSuccess) e = cudaGraphInstantiate(&ge, g, 0);
    for (int i = 0; i < replays && e == cudaSuccess; i++) e = cudaGraphLaunch(ge, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    if (ge) cudaGraphExecDestroy(ge);
    if (g) cudaGraphDestroy(g);
    return e == cudaSuccess ? LM_OK : lm_cuda_fail(e, "graph capture and replay");
}
extern "C" void lm_cuda_ctx_set_gemv_rows(struct lm_cuda_ctx *c, int rows) {
    c->gemv_rows = (rows == 1 || rows == 2 || rows == 4) ? rows : 0;
}

namespace {

/* ---- row kernels ---- */

/* Token t's id: ids[t], or the one an earlier kernel left at prev[feed[t]] (lm_cuda_embed). */
__device__ __forceinline__ int embed_id(const int32_t *ids, const int32_t *feed, const int32_t *prev, int t) {
    const int f = feed ? feed[t] : -1;
    return f < 0 ? ids[t] : prev[f];
}

__global__ void k_embed(float *x, const uint16_t *__restrict__ table, const int32_t *ids, const int32_t *feed,
                        const int32_t *prev, int d) {
    pdl_trigger(); /* the next kernel may launch now; it waits for this one */
    pdl_wait();
    const uint16_t *row = table + (size_t)embed_id(ids, feed, prev, blockIdx.x) * d;
    float *o = x + (size_t)blockIdx.x * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) o[i] = bf2f(row[i]);
}

__global__ void k_embed_q8(float *x, const int8_t *__restrict__ wq, const uint16_t *__restrict__ wd,
                           const int32_t *ids, const int32_t *feed, const int32_t *prev, int d) {
    pdl_trigger();
    pdl_wait();
    const size_t r = (size_t)embed_id(ids, feed, prev, blockIdx.x);
    float *o = x + (size_t)blockIdx.x * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x)
        o[i] = __fmul_rn(__half2float(__ushort_as_half(wd[r * (d >> 5) + (i >> 5)])), (float)wq[r * d + i]);
}

__global__ void k_gather(float *y, const float *x, const int32_t *rows, int d, const long long *add) {
    pdl_trigger(); /* the next kernel may launch now; it waits for this one */
    pdl_wait();
    const float *src = x + (size_t)rows[blockIdx.x] * d;
    const long long *a = add ? add + (size_t)rows[blockIdx.x] * d : NULL;
    float *o = y + (size_t)blockIdx.x * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) o[i] = a ? fix_add(src[i], a[i]) : src[i];
}

/* One block (256 threads) per row. */
__global__ void k_rmsnorm_bf16(uint16_t *y, const float *x, const float *__restrict__ w,
                               const int32_t *rows, int d, float eps) {
    __shared__ float red[8];
    pdl_trigger(); /* the next kernel may launch now; it waits for this one */
    pdl_wait();
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

/* k_rmsnorm_bf16 for rows of d = 4 v floats, v <= RN_THREADS * RN_MAXV (16-byte aligned x and w,
 * 8-byte aligned y): the weights are loaded before the wait (they do not depend on the preceding
 * kernel) and the row stays in registers, so after the wait a block makes one pass over global
 * memory (v21). */
constexpr int RN_THREADS = 256, RN_MAXV = 8;
__global__ void __launch_bounds__(RN_THREADS) k_rmsnorm_bf16_v4(uint16_t *y, const float *x, const float *__restrict__ w,
                                                                const int32_t *rows, int d, float eps) {
    __shared__ float red[RN_THREADS / 32];
    pdl_trigger(); /* the next kernel may launch now; it waits for this one */
    const int nv = d >> 2;
    float4 wv[RN_MAXV], xv[RN_MAXV];
#pragma unroll
    for (int v = 0; v < RN_MAXV; v++) {
        const int i = threadIdx.x + v * RN_THREADS;
        if (i < nv) wv[v] = __ldg(reinterpret_cast<const float4 *>(w) + i);
    }
    pdl_wait();
    const int r = rows ? rows[blockIdx.x] : blockIdx.x;
    const float4 *xi = reinterpret_cast<const float4 *>(x + (size_t)r * d);
    float s = 0.f;
#pragma unroll
    for (int v = 0; v < RN_MAXV; v++) {
        const int i = threadIdx.x + v * RN_THREADS;
        if (i < nv) xv[v] = xi[i];
    }
#pragma unroll
    for (int v = 0; v < RN_MAXV; v++) {
        const int i = threadIdx.x + v * RN_THREADS;
        if (i >= nv) break;
        s = fmaf(xv[v].x, xv[v].x, s);
        s = fmaf(xv[v].y, xv[v].y, s);
        s = fmaf(xv[v].z, xv[v].z, s);
        s = fmaf(xv[v].w, xv[v].w, s);
    }
    s = warp_sum(s);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
    __syncthreads();
    float tot = 0.f;
#pragma unroll
    for (int i = 0; i < RN_THREADS / 32; i++) tot += red[i];
    const float inv = 1.0f / sqrtf(tot / (float)d + eps);
    uint2 *yi = reinterpret_cast<uint2 *>(y + (size_t)blockIdx.x * d);
#pragma unroll
    for (int v = 0; v < RN_MAXV; v++) {
        const int i = threadIdx.x + v * RN_THREADS;
        if (i >= nv) break;
        const float4 a = xv[v], b = wv[v];
        yi[i] = make_uint2(f2bf(b.x * (a.x * inv)) | (unsigned)f2bf(b.y * (a.y * inv)) << 16,
                           f2bf(b.z * (a.z * inv)) | (unsigned)f2bf(b.w * (a.w * inv)) << 16);
    }
}

__global__ void k_swiglu_bf16(uint16_t *y, const float *gu, long n) {
    pdl_trigger(); /* the next kernel may launch now; it waits for this one */
    pdl_wait();
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        y[i] = f2bf(silu_mul(gu[2 * i], gu[2 * i + 1]));
}

} // namespace

/* ---- launch helpers ---- */

int lm_cuda_occupancy(const void *fn, int threads, size_t smem) {
    struct entry {
        const void *fn;
        size_t smem;
        int blocks;
    };
    static entry cache[512];
    static const void *raised[256]; /* kernels whose dynamic shared-memory limit is at the maximum */
    static int n_cache, n_raised;
    static std::mutex mu;
    std::lock_guard<std::mutex> lock(mu);
    for (int i = 0; i < n_cache; i++)
        if (cache[i].fn == fn && cache[i].smem == smem) return cache[i].blocks;
    /* The limit is per kernel, not per size: raise it once to the device's maximum (setting it to
     * each size in turn would lower it below a size launched earlier). */
    bool up = false;
    for (int i = 0; i < n_raised && !up; i++) up = raised[i] == fn;
    if (!up) {
        int dev = 0, optin = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
        cudaFuncAttributes fa;
        size_t stat = cudaFuncGetAttributes(&fa, fn) == cudaSuccess ? fa.sharedSizeBytes : 0;
        if (optin > (int)stat) cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, optin - (int)stat);
        cudaGetLastError();
        if (n_raised < 256) raised[n_raised++] = fn;
    }
    int nb = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, fn, threads, smem) != cudaSuccess || nb < 1) {
        cudaGetLastError();
        nb = 1;
    }
    if (n_cache < 512) cache[n_cache++] = {fn, smem, nb};
    return nb;
}

/* ---- wrappers ---- */

extern "C" lm_status lm_cuda_rmsnorm_bf16(struct lm_cuda_ctx *c, uint16_t *y, const float *x,
                                          const float *w, const int32_t *rows, int n, int d,
                                          float eps) {
    if (n < 1) return LM_OK;
    if (d % 4 == 0 && d / 4 <= RN_THREADS * RN_MAXV && ((uintptr_t)x | (uintptr_t)w) % 16 == 0 &&
        (uintptr_t)y % 8 == 0) {
        LM_CU(lm_launch(c, dim3(n), dim3(RN_THREADS), 0, k_rmsnorm_bf16_v4, y, x, w, rows, d, eps));
        return LM_OK;
    }
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
                                   const int32_t *ids, const int32_t *feed, const int32_t *prev, int n,
                                   int d) {
    if (n < 1) return LM_OK;
    LM_CU(lm_launch(c, dim3(n), dim3(256), 0, k_embed, x, table, ids, feed, prev, d));
    return LM_OK;
}

extern "C" lm_status lm_cuda_embed_q8(struct lm_cuda_ctx *c, float *x, const int8_t *wq,
                                      const uint16_t *wd, const int32_t *ids, const int32_t *feed,
                                      const int32_t *prev, int n, int d) {
    if (d % 32) return lm_errorf(LM_ERR_SHAPE, "CUDA embed (Q8_0): row width %d is not whole blocks of 32", d);
    if (n < 1) return LM_OK;
    LM_CU(lm_launch(c, dim3(n), dim3(256), 0, k_embed_q8, x, wq, wd, ids, feed, prev, d));
    return LM_OK;
}

extern "C" lm_status lm_cuda_gather_rows(struct lm_cuda_ctx *c, float *y, const float *x,
                                         const int32_t *rows, int n, int d, const int64_t *add) {
    if (n < 1) return LM_OK;
    LM_CU(lm_launch(c, dim3(n), dim3(256), 0, k_gather, y, x, rows, d, (const long long *)add));
    return LM_OK;
}

/* One block per (layer, pool, KV head): n16 16-byte pieces of the block's first rows. */
__global__ void k_kv_copy_rows(uint16_t *k_pool, uint16_t *v_pool, size_t layer_elems, size_t blk_elems,
                               size_t head_elems, int src, int dst, int n16) {
    pdl_wait();
    const int l = blockIdx.x, h = blockIdx.y >> 1;
    uint16_t *base = ((blockIdx.y & 1) ? v_pool : k_pool) + (size_t)l * layer_elems + (size_t)h * head_elems;
    const uint4 *from = reinterpret_cast<const uint4 *>(base + (size_t)src * blk_elems);
    uint4 *to = reinterpret_cast<uint4 *>(base + (size_t)dst * blk_elems);
    for (int i = threadIdx.x; i < n16; i += blockDim.x) to[i] = from[i];
}

extern "C" lm_status lm_cuda_kv_copy_rows(struct lm_cuda_ctx *c, uint16_t *k_pool, uint16_t *v_pool,
                                          size_t layer_elems, int n_layers, int n_kv_heads, int block_size,
                                          int head_dim, int src, int dst, int n_rows) {
    if (n_rows <= 0 || src == dst) return LM_OK;
    const size_t head_elems = (size_t)block_size * head_dim, blk_elems = (size_t)n_kv_heads * head_elems;
    if ((size_t)n_rows * head_dim * 2 % 16 || head_elems * 2 % 16)
        return lm_errorf(LM_ERR_SHAPE, "CUDA KV copy: rows of %d bf16 are not in 16-byte pieces", head_dim);
    const int n16 = (int)((size_t)n_rows * head_dim * 2 / 16);
    LM_CU(lm_launch(c, dim3(n_layers, 2 * n_kv_heads), dim3(128), 0, k_kv_copy_rows, k_pool, v_pool, layer_elems,
                    blk_elems, head_elems, src, dst, n16));
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
    if (!rc && cudaMemset(a, 1, bytes) != cudaSuccess) rc = lm_cuda_fail(cudaGetLastError(), "bench_copy setup");
    float ms = 0;
    if (!rc)
        rc = lm_time_median(0, reps, "bench_copy", [&] { cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice); }, &ms);
    if (!rc) *bytes_per_s = 2.0 * (double)bytes / (ms * 1e-3);
    lm_cuda_free(a);
    lm_cuda_free(b);
    return rc;
}
