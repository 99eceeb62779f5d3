/* link-bench.cu: what one link of a decode step's kernel chain costs on one GPU by the launch's
 * shape: blocks, threads, thread-block cluster, dynamic shared memory (docs/perf-notes.md v36).
 * Standalone; build and run on the GPU machine:
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90a -Isrc -o /tmp/link-bench scripts/link-bench.cu
 *   /tmp/link-bench
 *
 * (or `scripts/device-run.sh linkbench`). Each row times back-to-back replays of one CUDA graph
 * (CUDA events around 100 replays, the median of 7) of N kernels with nothing to do, chained by
 * programmatic dependent launch: each lets its dependents launch and then waits
 * (griddepcontrol), as a decode step's kernels do. A kernel in a cluster of more than one block
 * also arrives at the cluster barrier before its wait and waits on it after (k_gemm_tc's pushing
 * form meets its cluster so). Cluster 0 is a launch without the cluster attribute (as lumen
 * launches an unclustered kernel), 1 one with the attribute set to 1. "step" is a batch-1 decode step's shape: 28 layers of q/k/v (128
 * blocks in clusters of 4, 64 KiB), the attention (8 blocks of 256 threads), o_proj (64 in 8,
 * 64 KiB), gate/up (192 in 4, 64 KiB) and down_proj (64 in 8, 96 KiB), 128 threads unless said,
 * then a 132-block lm_head; the variants take one property out of every launch at once. Table 3
 * runs that step with kernels that carry one more of a real kernel's properties each: a 2 KiB
 * parameter block (read after the wait), 255 registers allocated (by code that never runs), or
 * the block's shared memory filled from a 1 GiB buffer by 16-byte cp.async copies issued before
 * its trigger and waited for after its wait, each launch from its own slice (a step's weight
 * copies: v31 measured the real step's chain with its copies at ~362 us). */
#include <algorithm>
#include <cstdio>
#include <vector>

#include "backend/cuda/common.cuh" /* pdl_trigger, pdl_wait, cp_async16 */

#include "bench-check.cuh" /* CK, graph_replay_us */

/* What every kernel here does: let its dependents launch, arrive at its cluster's barrier (a
 * cluster of more than one block), wait for its predecessor, then for its cluster. */
__device__ __forceinline__ void link_meet(int cl) {
    pdl_trigger();
    if (cl > 1) asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
    pdl_wait();
    if (cl > 1) asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
}

__global__ void k_link(int *p, int i, int cl) {
    link_meet(cl);
    if (threadIdx.x == 0 && blockIdx.x == 0) p[0] += i;
}

/* a 2 KiB parameter block */
struct big_param {
    int v[512];
};
__global__ void k_link_param(int *p, int i, int cl, big_param b) {
    link_meet(cl);
    if (threadIdx.x == 0 && blockIdx.x == 0) p[0] += i + b.v[i & 511];
}
/* The registers of a path that never runs (the launch passes never = 0): ptxas allocates 254. */
__global__ void __launch_bounds__(256, 1) k_link_regs(int *p, int i, int cl, int never) {
    link_meet(cl);
    if (never) {
        float a[240];
#pragma unroll
        for (int j = 0; j < 240; j++) a[j] = __int_as_float(p[j + 2]);
#pragma unroll 1
        for (int r = 0; r < never; r++)
#pragma unroll
            for (int j = 0; j < 240; j++) a[j] = fmaf(a[j], a[(j * 7 + 1) % 240], 1.0f);
#pragma unroll
        for (int j = 0; j < 240; j++) p[j + 2] = __float_as_int(a[j]);
    }
    if (threadIdx.x == 0 && blockIdx.x == 0) p[0] += i;
}
/* the block's dynamic shared memory filled from w + the block's slice before the trigger (16-byte
 * cp.async a thread at a time, one group), waited for after the wait */
__global__ void k_link_copy(int *p, int i, int cl, const char *w) {
    extern __shared__ __align__(16) char smc[];
    unsigned bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
    const char *src = w + (size_t)blockIdx.x * bytes;
    for (unsigned o = threadIdx.x * 16; o < bytes; o += blockDim.x * 16) cp_async16(smc + o, src + o);
    cp_async_commit();
    link_meet(cl);
    cp_async_wait_all();
    __syncthreads();
    if (threadIdx.x == 0 && blockIdx.x == 0) p[0] += i + (bytes ? smc[i % bytes] : 0);
}

enum { KIND_PLAIN, KIND_PARAM, KIND_REGS, KIND_COPY };

struct shape {
    int blocks, threads, cluster, smem; /* cluster 0: no attribute; smem: bytes of dynamic shared memory */
};

static cudaStream_t st;
static int *dp;
static char *dw;                             /* KIND_COPY's source */
static const size_t DW_BYTES = (size_t)1 << 30;

static void launch(const shape &s, int i, int kind = KIND_PLAIN, size_t *woff = nullptr) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(s.blocks);
    cfg.blockDim = dim3(s.threads);
    cfg.dynamicSmemBytes = s.smem;
    cfg.stream = st;
    cudaLaunchAttribute at[2];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    at[1].id = cudaLaunchAttributeClusterDimension;
    at[1].val.clusterDim.x = s.cluster, at[1].val.clusterDim.y = 1, at[1].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = s.cluster ? 2 : 1;
    if (kind == KIND_PARAM) {
        big_param b = {};
        CK(cudaLaunchKernelEx(&cfg, k_link_param, dp, i, s.cluster, b));
    } else if (kind == KIND_REGS) {
        CK(cudaLaunchKernelEx(&cfg, k_link_regs, dp, i, s.cluster, 0));
    } else if (kind == KIND_COPY) {
        const size_t need = (size_t)s.blocks * s.smem;
        if (*woff + need > DW_BYTES) *woff = 0;
        CK(cudaLaunchKernelEx(&cfg, k_link_copy, dp, i, s.cluster, (const char *)dw + *woff));
        *woff += need;
    } else {
        CK(cudaLaunchKernelEx(&cfg, k_link, dp, i, s.cluster));
    }
}

/* us a graph replay of the kernels in seq, each of the kind given */
static float time_chain(const std::vector<shape> &seq, int kind = KIND_PLAIN) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    size_t woff = 0;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (size_t i = 0; i < seq.size(); i++) launch(seq[i], (int)i, kind, &woff);
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    const float us = graph_replay_us(ge, st, 100, 10);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return us;
}

enum { ALL = 0, NO_CLUSTER = 1, NO_SMEM = 2, T256 = 4, ONE_SM = 8 };

static std::vector<shape> step(int var) {
    const int K = 1024;
    std::vector<shape> L = {{128, 128, 4, 64 * K}, {8, 256, 0, 16 * K}, {64, 128, 8, 64 * K},
                            {192, 128, 4, 64 * K}, {64, 128, 8, 96 * K}};
    std::vector<shape> seq;
    for (int l = 0; l < 28; l++)
        for (shape s : L) {
            if (var & NO_CLUSTER) s.cluster = 0;
            if (var & NO_SMEM) s.smem = 0;
            if (var & T256) s.threads = 256;
            if ((var & ONE_SM) && s.blocks > 132) s.blocks = 132;
            seq.push_back(s);
        }
    seq.push_back({132, 256, 0, 0});
    return seq;
}

int main() {
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaMalloc(&dp, 4096));
    CK(cudaMalloc(&dw, DW_BYTES));
    CK(cudaMemset(dw, 1, DW_BYTES));
    for (const void *f : {(const void *)k_link, (const void *)k_link_param, (const void *)k_link_regs,
                          (const void *)k_link_copy}) {
        CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
        CK(cudaFuncSetAttribute(f, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    }
    cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, (const void *)k_link_regs));
    const int regs = fa.numRegs;
    const int N = 141, K = 1024;
    printf("Table 1: %d kernels of one shape\n\n", N);
    printf("| blocks | threads | cluster | smem KiB | us a graph | us a link |\n");
    printf("| ---: | ---: | ---: | ---: | ---: | ---: |\n");
    const shape one[] = {
        {132, 256, 0, 0},      {132, 256, 1, 0},      {132, 128, 0, 0},      {8, 256, 0, 0},
        {64, 128, 0, 0},       {128, 128, 0, 0},      {128, 128, 1, 0},      {192, 128, 0, 0},
        {264, 128, 0, 0},      {128, 128, 2, 0},      {128, 128, 4, 0},      {128, 128, 8, 0},
        {128, 128, 0, 64 * K}, {128, 128, 0, 100 * K}, {128, 128, 4, 64 * K}, {64, 128, 8, 64 * K},
        {64, 128, 8, 96 * K},  {192, 128, 4, 64 * K}, {192, 128, 0, 64 * K}, {64, 128, 0, 96 * K}};
    for (const shape &s : one) {
        const float us = time_chain(std::vector<shape>(N, s));
        printf("| %d | %d | %d | %d | %.2f | %.3f |\n", s.blocks, s.threads, s.cluster, s.smem / K, us, us / N);
    }
    printf("\nTable 2: a batch-1 step's %d launches (28 layers of 5, and the lm_head)\n\n", 28 * 5 + 1);
    printf("| launches | us a graph | us a link |\n| --- | ---: | ---: |\n");
    const struct {
        int var;
        const char *name;
    } vars[] = {{ALL, "as the step launches them"},
                {NO_CLUSTER, "no clusters"},
                {NO_SMEM, "no dynamic shared memory"},
                {NO_CLUSTER | NO_SMEM, "neither"},
                {T256, "256 threads a block"},
                {ONE_SM, "at most 132 blocks"}};
    for (const auto &v : vars) {
        const float us = time_chain(step(v.var));
        printf("| %s | %.2f | %.3f |\n", v.name, us, us / (28 * 5 + 1));
    }
    printf("\nTable 3: the step's launches with one more of a real kernel's properties\n\n");
    printf("| kernels | us a graph | us a link |\n| --- | ---: | ---: |\n");
    char regs_name[64];
    snprintf(regs_name, sizeof regs_name, "%d registers allocated (every launch)", regs);
    const struct {
        int kind;
        const char *name;
    } kinds[] = {{KIND_PLAIN, "empty (table 2's first row)"},
                 {KIND_PARAM, "a 2 KiB parameter block"},
                 {KIND_REGS, regs_name},
                 {KIND_COPY, "shared memory filled by copies before the trigger"}};
    for (const auto &k : kinds) {
        const float us = time_chain(step(ALL), k.kind);
        printf("| %s | %.2f | %.3f |\n", k.name, us, us / (28 * 5 + 1));
    }
    return 0;
}
