/* bench-check.cuh: CK(call) for the standalone CUDA bench scripts (arrow-bench, wgmma-bench,
 * icache-bench): a failed runtime call prints where and why, and exits 1. Included by a relative
 * path, so each script still builds with one nvcc command. */
#pragma once
#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)
