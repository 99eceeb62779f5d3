/* bench-check.cuh: CK(call) for the standalone CUDA bench scripts (arrow-bench, wgmma-bench,
 * icache-bench, copy-node-bench, link-bench): a failed runtime call prints where and why, and
 * exits 1; graph_replay_us times a graph's replays. Included by a relative path, so each script
 * still builds with one nvcc command. */
#pragma once
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

/* The median over 7 rounds of the us one replay of ge takes on st, each round `replays` replays
 * back to back between two CUDA events, after `warm` untimed replays. */
static inline float graph_replay_us(cudaGraphExec_t ge, cudaStream_t st, int replays, int warm) {
    for (int i = 0; i < warm; i++) CK(cudaGraphLaunch(ge, st));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> v;
    for (int r = 0; r < 7; r++) {
        CK(cudaEventRecord(a, st));
        for (int i = 0; i < replays; i++) CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        v.push_back(ms * 1000 / replays);
    }
    std::sort(v.begin(), v.end());
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return v[3];
}
