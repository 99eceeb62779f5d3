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
 * parameter block (read after the wait), ~255 registers allocated (by code that never runs; the table prints ptxas' count), or
 * the block's shared memory filled from a 1 GiB buffer by 16-byte cp.async copies issued before
 * its trigger and waited for after its wait, each launch from its own slice (a step's weight
 * copies: v31 measured the real step's chain with its copies at ~362 us). Table 4 (perf-notes
 * v37) gives the step's kernels a link's data (k_link_io): 512 bytes a block read after the wait
 * from what the predecessor stored (a GEMM's x), 512 bytes stored before the exit (its outputs),
 * each alone, both, and both beside the weight copies. */
#include <algorithm>
#include <cstdio>
#include <cstdlib>
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
/* Issues the copies that fill the block's dynamic shared memory smc from w + the block's slice
 * (16-byte cp.async a thread at a time, one group); returns its size in bytes. */
__device__ unsigned fill_smem(char *smc, const char *w) {
    unsigned bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
    const char *src = w + (size_t)blockIdx.x * bytes;
    for (unsigned o = threadIdx.x * 16; o < bytes; o += blockDim.x * 16) cp_async16(smc + o, src + o);
    cp_async_commit();
    return bytes;
}

/* the block's dynamic shared memory filled (fill_smem) before the trigger, waited for after the wait */
__global__ void k_link_copy(int *p, int i, int cl, const char *w) {
    extern __shared__ __align__(16) char smc[];
    const unsigned bytes = fill_smem(smc, w);
    link_meet(cl);
    cp_async_wait_all();
    __syncthreads();
    if (threadIdx.x == 0 && blockIdx.x == 0) p[0] += i + (bytes ? smc[i % bytes] : 0);
}

/* A link's data (table 4): after its wait a block reads 512 bytes its predecessor's block of the
 * same index (modulo the predecessor's blocks) stored (LOAD: one trip through L2, as a GEMM stages
 * its x), and/or stores 512 bytes of its own before it exits (STORE: as a GEMM's epilogue stores
 * its outputs), the stores depending on the loads where it does both; with COPY as well, the
 * weight copies of KIND_COPY before the trigger. io: [launch][block][32] uint4 slots. */
enum { IO_LOAD = 1, IO_STORE = 2, IO_COPY = 4 };
/* io's shape: a slot row for each launch of a step (STEP_LAUNCHES), IO_BLOCKS blocks a launch at
 * most (the host checks), 32 uint4 (512 bytes) a block */
constexpr int STEP_LAUNCHES = 28 * 5 + 1, IO_BLOCKS = 264;
__device__ __forceinline__ uint4 *io_slot(uint4 *io, int launch, int block) {
    return io + ((size_t)launch * IO_BLOCKS + block) * 32 + threadIdx.x;
}
__global__ void k_link_io(int *p, int i, int cl, uint4 *io, int prev_blocks, int flags, const char *w) {
    extern __shared__ __align__(16) char smc[];
    const unsigned bytes = flags & IO_COPY ? fill_smem(smc, w) : 0;
    link_meet(cl);
    uint4 v = make_uint4(i, blockIdx.x, 0, 0);
    if ((flags & IO_LOAD) && threadIdx.x < 32 && i > 0) {
        const uint4 u = *io_slot(io, i - 1, blockIdx.x % prev_blocks);
        v.z = u.x + u.y, v.w = u.z ^ u.w;
    }
    if (flags & IO_COPY) {
        cp_async_wait_all();
        __syncthreads();
        v.w += bytes ? (unsigned char)smc[(threadIdx.x * 16) % bytes] : 0;
    }
    if ((flags & IO_STORE) && threadIdx.x < 32) *io_slot(io, i, blockIdx.x) = v;
    else if (v.z == 0xFFFFFFFFu && v.w == 7u) p[1] = 1; /* keeps the loads */
}

enum { KIND_PLAIN, KIND_PARAM, KIND_REGS, KIND_COPY, KIND_IO = 16 /* + IO_* flags */ };

struct shape {
    int blocks, threads, cluster, smem; /* cluster 0: no attribute; smem: bytes of dynamic shared memory */
};

static cudaStream_t st;
static int *dp;
static char *dw;                             /* KIND_COPY's source */
static uint4 *dio;                           /* k_link_io's slots (io_slot) */
static int prev_blocks = 1;                  /* the last launch's blocks (k_link_io's loads) */
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
    /* the copying kernels' source: this launch's own slice of dw, from the start again when it ends */
    auto next_slice = [&] {
        const size_t need = (size_t)s.blocks * s.smem;
        if (*woff + need > DW_BYTES) *woff = 0;
        char *src = dw + *woff;
        *woff += need;
        return src;
    };
    if (kind == KIND_PARAM) {
        big_param b = {};
        CK(cudaLaunchKernelEx(&cfg, k_link_param, dp, i, s.cluster, b));
    } else if (kind == KIND_REGS) {
        CK(cudaLaunchKernelEx(&cfg, k_link_regs, dp, i, s.cluster, 0));
    } else if (kind >= KIND_IO) {
        const int flags = kind - KIND_IO;
        if (i >= STEP_LAUNCHES || s.blocks > IO_BLOCKS) {
            fprintf(stderr, "link-bench: launch %d of %d blocks is past k_link_io's slots (%d launches of %d)\n", i,
                    s.blocks, STEP_LAUNCHES, IO_BLOCKS);
            exit(1);
        }
        CK(cudaLaunchKernelEx(&cfg, k_link_io, dp, i, s.cluster, dio, prev_blocks, flags,
                              (const char *)(flags & IO_COPY ? next_slice() : dw)));
    } else if (kind == KIND_COPY) {
        CK(cudaLaunchKernelEx(&cfg, k_link_copy, dp, i, s.cluster, (const char *)next_slice()));
    } else {
        CK(cudaLaunchKernelEx(&cfg, k_link, dp, i, s.cluster));
    }
    prev_blocks = s.blocks;
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
    if ((int)seq.size() != STEP_LAUNCHES) { /* the tables divide by STEP_LAUNCHES; io has that many rows */
        fprintf(stderr, "link-bench: the step has %zu launches, STEP_LAUNCHES says %d\n", seq.size(), STEP_LAUNCHES);
        exit(1);
    }
    return seq;
}

int main() {
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaMalloc(&dp, 4096));
    CK(cudaMalloc(&dw, DW_BYTES));
    CK(cudaMemset(dw, 1, DW_BYTES));
    const size_t io_bytes = (size_t)STEP_LAUNCHES * IO_BLOCKS * 512;
    CK(cudaMalloc(&dio, io_bytes));
    CK(cudaMemset(dio, 0, io_bytes));
    for (const void *f : {(const void *)k_link, (const void *)k_link_param, (const void *)k_link_regs,
                          (const void *)k_link_copy, (const void *)k_link_io}) {
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
    printf("\nTable 2: a batch-1 step's %d launches (28 layers of 5, and the lm_head)\n\n", STEP_LAUNCHES);
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
        printf("| %s | %.2f | %.3f |\n", v.name, us, us / STEP_LAUNCHES);
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
        printf("| %s | %.2f | %.3f |\n", k.name, us, us / STEP_LAUNCHES);
    }
    printf("\nTable 4: the step's launches with a link's data: 512 bytes a block read from the predecessor's "
           "stores after the wait, 512 bytes stored before the exit\n\n");
    printf("| kernels | us a graph | us a link |\n| --- | ---: | ---: |\n");
    const struct {
        int flags;
        const char *name;
    } ios[] = {{0, "neither (k_link_io)"},
               {IO_STORE, "stores"},
               {IO_LOAD, "loads"},
               {IO_LOAD | IO_STORE, "loads, then stores of what they read"},
               {IO_COPY, "the weight copies (table 3's last row, k_link_io)"},
               {IO_COPY | IO_LOAD | IO_STORE, "the weight copies, loads and stores"}};
    for (const auto &k : ios) {
        const float us = time_chain(step(ALL), KIND_IO + k.flags);
        printf("| %s | %.2f | %.3f |\n", k.name, us, us / STEP_LAUNCHES);
    }
    return 0;
}
