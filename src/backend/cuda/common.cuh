/* common.cuh: what the CUDA backend's .cu files share: the context struct, error checks and the
 * launch helper (programmatic dependent launch). Internal to src/backend/cuda. */
#ifndef LM_BACKEND_CUDA_COMMON_CUH
#define LM_BACKEND_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <utility>

#include "backend/cuda/cuda.h"

/* Records "CUDA: <what>: <error>" and returns LM_ERR_IO (LM_ERR_NOMEM for allocations). */
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
    int max_rows;        /* sampler scratch capacity */
    float2 *am_part;     /* [max_rows][AM_CHUNKS] argmax partials (value, id bits) */
    unsigned *am_count;  /* [max_rows] blocks done, reset by the last one */
};

/* Launches kernel k on the context's stream, with the programmatic-stream-serialization
 * attribute when c->pdl (kernels then call pdl_wait() before touching a predecessor's output). */
template <typename... KArgs, typename... Args>
static inline cudaError_t lm_launch(const lm_cuda_ctx *c, dim3 grid, dim3 block, size_t smem,
                                    void (*k)(KArgs...), Args &&...args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = c->pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, k, std::forward<Args>(args)...);
}

/* Waits until the predecessor grid has completed and its writes are visible (a no-op when the
 * kernel was launched without the PDL attribute). Every kernel calls it before reading or
 * writing anything a predecessor touches, so dependencies stay transitive. */
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
/* Lets the next kernel's blocks launch (they still wait in pdl_wait for this grid to finish). */
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

#endif
