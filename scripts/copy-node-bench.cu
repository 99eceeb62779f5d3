/* copy-node-bench.cu: what a decode graph's copy nodes cost on one GPU (docs/perf-notes.md v35).
 * Standalone; build and run on the GPU machine:
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90a -Isrc -o /tmp/copy-node-bench scripts/copy-node-bench.cu
 *   /tmp/copy-node-bench
 *
 * Each row times back-to-back replays of one CUDA graph (CUDA events around 200 replays, the
 * median of 7) holding N empty kernels of 132 blocks chained by programmatic dependent launch
 * (each triggers its dependents and waits, as a decode step's kernels do), with the step's input
 * copy at its start and its output copy at its end in one of three forms: none; a copy node
 * (cudaMemcpyAsync captured: 1 KiB host -> device, 4 bytes device -> host, both page-locked);
 * or a one-block kernel that reads or stores the page-locked host memory itself. Two steps in one
 * graph (2N kernels) give what the graph's boundary costs beside a link. */
#include <algorithm>
#include <cstdio>
#include <vector>

#include "backend/cuda/common.cuh" /* pdl_trigger, pdl_wait */

#include "bench-check.cuh" /* CK, graph_replay_us */

__device__ __forceinline__ void pdl_link() {
    pdl_trigger();
    pdl_wait();
}
/* a step's kernel with nothing to do after its wait */
__global__ void k_link(int *p, int i) {
    pdl_link();
    if (threadIdx.x == 0 && blockIdx.x == 0) p[0] += i;
}
/* the ids to page-locked host memory (lumen's lm_cuda_ids_to_host) */
__global__ void k_out(int *host, const int *src, int n) {
    pdl_link();
    if ((int)threadIdx.x < n) host[threadIdx.x] = src[threadIdx.x];
}
/* the inputs read from page-locked host memory (every later kernel waits for the PCIe read) */
__global__ void k_in(int4 *dst, const int4 *host, int n) {
    pdl_link();
    if ((int)threadIdx.x < n) dst[threadIdx.x] = host[threadIdx.x];
}

static cudaStream_t st;

/* k on `blocks` blocks of 256 threads, launched as a programmatic dependent of the last */
template <typename K, typename... A>
static void pdl(K k, int blocks, A... a) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(256);
    cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, k, a...));
}

int main() {
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    int *d, *hp;
    char *din, *hin;
    CK(cudaMalloc(&d, 4096));
    CK(cudaMalloc(&din, 1 << 16));
    CK(cudaMallocHost(&hp, 4096));
    CK(cudaMallocHost(&hin, 1 << 16));
    static const char *form[] = {"none", "copy node", "kernel"};
    printf("| kernels a step | steps a graph | inputs | ids | us a graph | us a step |\n");
    printf("| ---: | ---: | --- | --- | ---: | ---: |\n");
    for (int n : {1, 8, 141})
        for (int steps : {1, 2})
            for (int in = 0; in < 3; in++)
                for (int out = 0; out < 3; out++) {
                    if (steps == 2 && (n != 141 || in == 1 || out == 1)) continue;
                    cudaGraph_t g;
                    cudaGraphExec_t ge;
                    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
                    for (int s = 0; s < steps; s++) {
                        if (in == 1 && s == 0) CK(cudaMemcpyAsync(din, hin, 1024, cudaMemcpyHostToDevice, st));
                        if (in == 2) pdl(k_in, 1, (int4 *)din, (const int4 *)hin, 64);
                        for (int i = 0; i < n; i++) pdl(k_link, 132, d, i);
                        if (out == 1) CK(cudaMemcpyAsync(hp + s, d, 4, cudaMemcpyDeviceToHost, st));
                        if (out == 2) pdl(k_out, 1, hp + s, (const int *)d, 1);
                    }
                    CK(cudaStreamEndCapture(st, &g));
                    CK(cudaGraphInstantiate(&ge, g, 0));
                    const float us = graph_replay_us(ge, st, 200, 20);
                    printf("| %d | %d | %s | %s | %.2f | %.2f |\n", n, steps, form[in], form[out], us, us / steps);
                    CK(cudaGraphExecDestroy(ge));
                    CK(cudaGraphDestroy(g));
                }
    return 0;
}
