/* icache-bench.cu: does the code another kernel runs between two launches of a kernel slow the
 * second one down (perf-notes v29)? Standalone:
 *   nvcc -O3 -std=c++17 -arch=sm_90a -Isrc -o /tmp/icache-bench scripts/icache-bench.cu && /tmp/icache-bench
 *
 * A probe kernel runs P straight-line FFMA instructions (16 bytes of code each, eight independent
 * chains, so issue and not latency bounds them) in every warp of one block a multiprocessor and
 * records, per block, the %globaltimer time from its first to its last instruction. Launches
 * alternate in one CUDA graph: probe, other, probe, other, ...; "other" is a kernel of the same
 * shape running E FFMA instructions of its own code (E = 0: an empty kernel). If the probe's time
 * grows with E while the probe's own work stays the same, the other kernel's code evicted the
 * probe's from the multiprocessor's instruction caches, and the probe refetched it from L2.
 * The table: the probe's median block time (us, the median over its launches) by probe size and E. */
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>

#include <cuda_runtime.h>

#include "backend/cuda/common.cuh" /* gtime */
#include "bench-check.cuh"         /* CK */

/* N FFMAs over 8 chains; SALT makes each instantiation's constants (and so its code) its own. */
template <int N, int SALT>
__device__ __forceinline__ float body(float a) {
    float x[8];
#pragma unroll
    for (int c = 0; c < 8; c++) x[c] = a + (float)c;
#pragma unroll
    for (int i = 0; i < N; i++) x[i & 7] = fmaf(x[i & 7], 1.0f + (float)(SALT * 131 + i % 97) * 1e-7f, 0.25f);
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < 8; c++) s += x[c];
    return s;
}

/* The probe: times its body per block (thread 0's clock after a barrier on both sides). */
template <int N>
__global__ void __launch_bounds__(128) k_probe(float a, float *sink, unsigned long long *times, int launch) {
    __syncthreads();
    const unsigned long long t0 = gtime();
    const float s = body<N, 1>(a + threadIdx.x);
    __syncthreads();
    const unsigned long long t1 = gtime();
    if (s == 12345.f) sink[threadIdx.x] = s;
    if (threadIdx.x == 0) times[(size_t)launch * gridDim.x + blockIdx.x] = t1 - t0;
}

template <int E>
__global__ void __launch_bounds__(128) k_other(float a, float *sink) {
    if constexpr (E > 0) {
        const float s = body<E, 2>(a + threadIdx.x);
        if (s == 12345.f) sink[threadIdx.x] = s;
    }
}

template <int P, int E>
static double run(int sms, float *sink, unsigned long long *times) {
    constexpr int L = 40; /* probe launches in the graph */
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < L; i++) {
        k_probe<P><<<sms, 128, 0, st>>>(1.0f, sink, times, i);
        k_other<E><<<sms, 128, 0, st>>>(2.0f, sink);
    }
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    std::vector<double> meds;
    for (int rep = 0; rep < 3; rep++) {
        CK(cudaGraphLaunch(ge, st));
        CK(cudaStreamSynchronize(st));
        std::vector<unsigned long long> h((size_t)L * sms);
        CK(cudaMemcpy(h.data(), times, 8 * h.size(), cudaMemcpyDeviceToHost));
        for (int i = 2; i < L; i++) { /* the first launches warm up */
            std::vector<unsigned long long> b(h.begin() + (size_t)i * sms, h.begin() + (size_t)(i + 1) * sms);
            std::sort(b.begin(), b.end());
            meds.push_back((double)b[b.size() / 2]);
        }
    }
    std::sort(meds.begin(), meds.end());
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    CK(cudaStreamDestroy(st));
    return meds[meds.size() / 2] / 1e3;
}

template <int P>
static void row(int sms, float *sink, unsigned long long *times) {
    printf("| %d KiB | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |\n", P * 16 / 1024, run<P, 0>(sms, sink, times),
           run<P, 1024>(sms, sink, times), run<P, 2048>(sms, sink, times), run<P, 4096>(sms, sink, times),
           run<P, 6144>(sms, sink, times), run<P, 8192>(sms, sink, times), run<P, 12288>(sms, sink, times));
    fflush(stdout);
}

int main() {
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    float *sink;
    unsigned long long *times;
    CK(cudaMalloc(&sink, 4096));
    CK(cudaMalloc(&times, sizeof(unsigned long long) * 64 * sms));
    printf("icache-bench: %d blocks of 4 warps (one a multiprocessor); the probe's median block time, us, "
           "between launches of another kernel running E KiB of its own straight-line code\n\n",
           sms);
    printf("| probe code | E = 0 | 16 KiB | 32 | 64 | 96 | 128 | 192 |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    row<512>(sms, sink, times);
    row<1024>(sms, sink, times);
    row<2048>(sms, sink, times);
    row<4096>(sms, sink, times);
    return 0;
}
