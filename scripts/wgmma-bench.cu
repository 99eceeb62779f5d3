/* wgmma-bench.cu: what the tensor cores take for a block's products at batch 1, by operand shape
 * (perf-notes v27). Standalone: nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Isrc -Iscripts -o /tmp/wgmma-bench
 * scripts/wgmma-bench.cu && /tmp/wgmma-bench
 *
 * Each block holds 32 KiB of weights (bf16, K-major, 128-byte swizzle) times --tiles and 64 rows
 * of tokens in shared memory and issues the wgmma that multiply them, back to back, waited for
 * once (k_gemm_tc's sequence); the table gives the median block's time from the first issue to
 * the wait's return, with 1, 2 or 3 blocks a multiprocessor started together:
 * - A16: the weights as A (64 rows x 256 columns a tile), 16 tokens as B: 16 x m64n16k16 a tile
 *   (what k_gemm_tc<16> runs at 1-16 rows);
 * - Bn: the tokens as A (64 rows, from shared memory), the weights as B, n rows (n = 64, 128,
 *   256) x 32768 / n columns: 16 / 8 / 4 x m64nNk16 a tile;
 * - Rn: Bn with A from registers.
 * Table 2: A16 after what k_gemm_tc does before its products. Table 3: k_gemm_tc's chunk loop with
 * its count at run time against compile time.
 * Table 4: the products of table 3 with the weights' A fragments in registers (wgmma RS, and
 * mma.sync), 16 and 8 tokens.
 * Then a bits check: the same weights and tokens through A16 and B64 (D transposed), SS and RS,
 * and table 4's forms: are the float32 sums the same bits? */
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <vector>
#include <algorithm>

#include <cuda_runtime.h>

#include "backend/cuda/common.cuh" /* smem_u32, gtime, wg_desc, wg_chunk_products, wg_fence, wg_commit, wg_wait0, wg_pin, wgmma_ss */

#include "bench-check.cuh" /* CK */

#include "wgmma-bench-gen.cuh"

/* Element (r, k) of a K-major operand of `rows` rows in 64-column tiles (128-byte swizzle). */
__host__ __device__ inline int sw(int r, int k, int rows) {
    return (k / 64) * rows * 64 + r * 64 + ((((k % 64) / 8) ^ (r % 8)) * 8) + k % 8;
}

enum { M_A16, M_B64, M_B128, M_B256, M_R64, M_R128, M_R256, N_MODES };
static const char *k_names[N_MODES] = {"A16", "B64", "B128", "B256", "R64", "R128", "R256"};

constexpr int WT = 16384; /* weight elements a tile (32 KiB) */

/* One burst of products over `tiles` weight tiles; returns the accumulator sum (kept live). */
template <int MODE>
__device__ float burst(const uint16_t *ws, const uint16_t *xs, int tiles, const unsigned (&areg)[4]) {
    constexpr int N = MODE == M_A16 ? 16 : (MODE == M_B64 || MODE == M_R64) ? 64 : (MODE == M_B128 || MODE == M_R128) ? 128 : 256;
    constexpr int KS = MODE == M_A16 ? 256 : WT / N; /* columns a tile */
    float d[N / 8][4] = {};
    wg_pin(d);
    wg_fence();
    const unsigned wa = smem_u32(ws), xa = smem_u32(xs);
    for (int t = 0; t < tiles; t++) {
#pragma unroll
        for (int s = 0; s < KS / 16; s++) {
            const unsigned koff = (unsigned)((s / 4) * 64 * 2 * (MODE == M_A16 ? 64 : N) + (s % 4) * 32);
            if constexpr (MODE == M_A16) {
                /* A: weights (64 rows, tile of KS = 256: 4 chunks of 64 rows x 64); B: 16 tokens */
                const unsigned xoff = (unsigned)((s / 4) * 64 * 2 * 16 + (s % 4) * 32);
                wgmma_ss<16>(d, wg_desc(wa + t * WT * 2 + koff), wg_desc(xa + xoff));
            } else if constexpr (MODE == M_B64 || MODE == M_B128 || MODE == M_B256) {
                const unsigned xoff = (unsigned)((s / 4) * 64 * 2 * 64 + (s % 4) * 32);
                wgmma_ss<N>(d, wg_desc(xa + xoff), wg_desc(wa + t * WT * 2 + koff));
            } else {
                wgmma_rs<N>(d, areg, wg_desc(wa + t * WT * 2 + koff));
            }
        }
    }
    wg_commit();
    wg_wait0();
    wg_pin(d);
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < N / 8; j++) s += d[j][0] + d[j][1] + d[j][2] + d[j][3];
    return s;
}

/* Both bench kernels' start: n bf16 values of the block's shared memory set (finite, the block's
 * own), made visible to the tensor cores, then every block waits for globaltimer `start`. */
__device__ __forceinline__ void bench_start(uint16_t *sm, int n, unsigned long long start) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) sm[i] = (uint16_t)(0x3c00 + (i * 7 + blockIdx.x) % 64);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    while (gtime() < start) {
    }
}

/* Every block waits for globaltimer `start`, then runs `reps` bursts, timing each. Before each
 * burst, `prep` (table 2): 0 nothing; 1 a proxy fence (fence.proxy.async.shared::cta) and a barrier;
 * 2 the block's weights and tokens copied again from `src` (cp.async by every thread, as k_gemm_tc
 * stages them), waited for, the proxy fence and a barrier: what k_gemm_tc does before its products. */
template <int MODE>
__global__ void __launch_bounds__(128) k_bench(int tiles, int reps, unsigned long long start, float *sink,
                                              unsigned long long *times, int prep = 0,
                                              const uint16_t *src = nullptr) {
    extern __shared__ __align__(1024) uint16_t sm[];
    uint16_t *ws = sm, *xs = sm + (size_t)tiles * WT;
    const unsigned areg[4] = {0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u};
    bench_start(sm, tiles * WT + 64 * 256, start);
    float acc = 0.f;
    for (int r = 0; r < reps; r++) {
        if (prep == 2) {
            const int n16 = (tiles * WT + 64 * 256) / 8; /* 16-byte chunks */
            for (int i = threadIdx.x; i < n16; i += 128)
                cp_async16(sm + (size_t)i * 8, src + ((size_t)blockIdx.x * n16 + i) * 8);
            cp_async_wait_all();
        }
        if (prep) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();
        const unsigned long long t0 = gtime();
        acc += burst<MODE>(ws, xs, tiles, areg);
        const unsigned long long t1 = gtime();
        if (threadIdx.x == 0) times[(size_t)blockIdx.x * reps + r] = t1 - t0;
    }
    if (acc == 12345.f) sink[blockIdx.x] = acc;
}

__global__ void k_now(unsigned long long *t) { *t = gtime(); }

/* `launches` launches of a bench kernel over `blocks` blocks, each started by launch(start, sink,
 * times) with a globaltimer start 300 us ahead; a block records `reps` burst times (ns) at
 * times[block * reps + r]. Returns the median over launches 2.. of the median block's first burst
 * (what a GEMM after its wait sees). */
template <class Launch>
static double first_burst_median(int blocks, int reps, int launches, Launch &&launch) {
    float *sink;
    unsigned long long *times, *now;
    CK(cudaMalloc(&sink, sizeof(float) * blocks));
    CK(cudaMalloc(&times, sizeof(unsigned long long) * blocks * reps));
    CK(cudaMalloc(&now, 8));
    std::vector<double> med;
    for (int l = 0; l < launches; l++) {
        k_now<<<1, 1>>>(now);
        unsigned long long t;
        CK(cudaMemcpy(&t, now, 8, cudaMemcpyDeviceToHost));
        launch(t + 300000, sink, times);
        CK(cudaGetLastError());
        std::vector<unsigned long long> h((size_t)blocks * reps);
        CK(cudaMemcpy(h.data(), times, 8 * h.size(), cudaMemcpyDeviceToHost));
        if (l == 0) continue; /* the first launch warms up */
        std::vector<double> first;
        for (int b = 0; b < blocks; b++) first.push_back((double)h[(size_t)b * reps]);
        std::sort(first.begin(), first.end());
        med.push_back(first[first.size() / 2]);
    }
    std::sort(med.begin(), med.end());
    CK(cudaFree(sink));
    CK(cudaFree(times));
    CK(cudaFree(now));
    return med[med.size() / 2];
}

template <int MODE>
static double run(int bps, int tiles, int reps, int sms, int prep = 0) {
    const int blocks = sms * bps;
    const size_t per = (size_t)tiles * WT + 64 * 256, smem = per * 2;
    CK(cudaFuncSetAttribute(k_bench<MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    uint16_t *src = nullptr; /* prep 2's source: each block its own copy of the operands */
    CK(cudaMalloc(&src, 2 * per * blocks));
    CK(cudaMemset(src, 0x3c, 2 * per * blocks)); /* bf16 1.0x: finite */
    const double us =
        first_burst_median(blocks, reps, 6, [&](unsigned long long start, float *sink, unsigned long long *times) {
            k_bench<MODE><<<blocks, 128, smem>>>(tiles, reps, start, sink, times, prep, src);
        });
    CK(cudaFree(src));
    return us;
}

/* Table 3 (perf-notes v30): k_gemm_tc's products (wg_chunk_products, the kernel's own code), NH
 * 64-row halves x 4 chunks of 64 columns x 4 k-steps, with the chunk count known at run time (a
 * loop: ptxas injects a warpgroup.arrive at its head, its info C7519, and waits for each
 * iteration's last wgmma before the next) or at compile time (one straight sequence). v30's rows
 * were taken before the descriptors became base + offset (perf-notes v31). */
template <int CNCH, int NH>
__global__ void __launch_bounds__(128) k_chunks(float *sink, unsigned long long *times, int nch_rt,
                                               unsigned long long start) {
    extern __shared__ __align__(1024) uint16_t sm[];
    constexpr int WN = 4 * 64 * 64 * NH; /* 4 chunks x 64 NH rows x 64 columns */
    bench_start(sm, WN + 4 * 16 * 64, start);
    const unsigned long long t0 = gtime();
    float d[NH][2][4] = {};
#pragma unroll
    for (int h = 0; h < NH; h++) wg_pin(d[h]);
    wg_fence();
    wg_chunk_products<16, NH, CNCH>(d, wg_desc_lo(smem_u32(sm)), wg_desc_lo(smem_u32(sm + WN)), nch_rt);
    wg_commit();
    wg_wait0();
    float s = 0.f;
#pragma unroll
    for (int h = 0; h < NH; h++) {
        wg_pin(d[h]);
#pragma unroll
        for (int j = 0; j < 2; j++) s += d[h][j][0] + d[h][j][1] + d[h][j][2] + d[h][j][3];
    }
    const unsigned long long t1 = gtime();
    if (threadIdx.x == 0) times[blockIdx.x] = t1 - t0;
    if (s == 12345.f) sink[blockIdx.x] = s;
}

template <int CNCH, int NH>
static double run_chunks(int bps, int sms) {
    const int blocks = bps * sms;
    const size_t smem = (size_t)(4 * 64 * 64 * NH + 4 * 16 * 64) * 2;
    CK(cudaFuncSetAttribute(k_chunks<CNCH, NH>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    return first_burst_median(blocks, 1, 8, [&](unsigned long long start, float *sink, unsigned long long *times) {
        k_chunks<CNCH, NH><<<blocks, 128, smem>>>(sink, times, 4, start);
    });
}

/* Table 4 (perf-notes v32): the weights as A from registers. The products of table 3's straight
 * rows (NH 64-row halves x 4 chunks x 4 k-steps of 16) with each thread's A fragments (m64k16, PTX
 * ISA "Register Fragments": rows 16 wid + lane/4 (+8) of the half, columns 2 (lane%4) (+1, +8, +9)
 * of the k-step) loaded from the tile into registers before the clock starts, as a GEMM could load
 * them before its wait; the blocks of a multiprocessor start together. FORM 0: wgmma SS (table 3's
 * straight row, N tokens); 1: wgmma RS; 2: mma.sync m16n8k16 with the same A registers and B
 * fragments read from the token tile after the clock starts (N = 8). In the bench mma.sync from
 * registers took 0.35 us at two blocks a multiprocessor against 0.86 for SS; inside k_gemm_tc the
 * same form (branch exp/rf) saved ~0.1 us of a GEMM's products and lost 15% of the step. */
template <int NH, int N, int FORM>
__global__ void __launch_bounds__(128) k_regs(float *sink, unsigned long long *times, unsigned long long start) {
    extern __shared__ __align__(1024) uint16_t sm[];
    constexpr int WN = 4 * 64 * 64 * NH;
    const uint16_t *xs = sm + WN;
    bench_start(sm, WN + 4 * N * 64, 0); /* the clock's start waited for after the loads below */
    const int wid = threadIdx.x / 32, lane = threadIdx.x % 32;
    unsigned a[NH][16][4];
    auto pair = [&](int r, int c) { return *reinterpret_cast<const unsigned *>(sm + sw(r, c, 64 * NH)); };
#pragma unroll
    for (int h = 0; h < NH; h++)
#pragma unroll
        for (int s = 0; s < 16; s++) {
            const int r = 64 * h + 16 * wid + lane / 4, c = 16 * s + 2 * (lane % 4);
            a[h][s][0] = pair(r, c);
            a[h][s][1] = pair(r + 8, c);
            a[h][s][2] = pair(r, c + 8);
            a[h][s][3] = pair(r + 8, c + 8);
        }
#pragma unroll
    for (int h = 0; h < NH; h++) /* loaded before the clock: pinned ahead of its volatile reads */
#pragma unroll
        for (int s = 0; s < 16; s++)
#pragma unroll
            for (int e = 0; e < 4; e++) asm volatile("" : "+r"(a[h][s][e]));
    __syncthreads();
    while (gtime() < start) { /* the blocks of a multiprocessor start their products together */
    }
    const unsigned long long t0 = gtime();
    float d[NH][N / 8][4] = {};
    if constexpr (FORM == 2) {
        static_assert(N == 8, "mma.sync: one n-tile");
#pragma unroll
        for (int s = 0; s < 16; s++) {
            const int t = lane / 4, c = 16 * s + 2 * (lane % 4);
            const unsigned b0 = *reinterpret_cast<const unsigned *>(xs + sw(t, c, N));
            const unsigned b1 = *reinterpret_cast<const unsigned *>(xs + sw(t, c + 8, N));
#pragma unroll
            for (int h = 0; h < NH; h++) mma_bf16(d[h][0], a[h][s], b0, b1);
        }
    } else {
#pragma unroll
        for (int h = 0; h < NH; h++) wg_pin(d[h]);
        wg_fence();
        const unsigned ws_lo = wg_desc_lo(smem_u32(sm)), xs_lo = wg_desc_lo(smem_u32(xs));
        if constexpr (FORM == 0) { /* k_gemm_tc's own sequence, as table 3's straight rows */
            wg_chunk_products<N, NH, 4>(d, ws_lo, xs_lo, 4);
        } else { /* the same order (chunk, k-step, half) with A from registers */
#pragma unroll
            for (int s = 0; s < 16; s++) {
                const unsigned long long b = wg_desc_of(xs_lo + (unsigned)((s / 4) * (N * 128 / 16) + (s % 4) * 2));
#pragma unroll
                for (int h = 0; h < NH; h++) wgmma_rs<N>(d[h], a[h][s], b);
            }
        }
        wg_commit();
        wg_wait0();
#pragma unroll
        for (int h = 0; h < NH; h++) wg_pin(d[h]);
    }
    float sum = 0.f;
#pragma unroll
    for (int h = 0; h < NH; h++)
#pragma unroll
        for (int j = 0; j < N / 8; j++) sum += d[h][j][0] + d[h][j][1] + d[h][j][2] + d[h][j][3];
    const unsigned long long t1 = gtime();
    if (threadIdx.x == 0) times[blockIdx.x] = t1 - t0;
    /* every A register kept live to the end, as a kernel's would be until its products */
    unsigned ax = 0;
#pragma unroll
    for (int h = 0; h < NH; h++)
#pragma unroll
        for (int s = 0; s < 16; s++) ax ^= a[h][s][0] ^ a[h][s][1] ^ a[h][s][2] ^ a[h][s][3];
    if (sum == 12345.f || ax == 0x9e3779b9u) sink[blockIdx.x] = sum + (float)ax;
}

/* -1 when bps blocks do not fit a multiprocessor at once (registers: they would not start
 * together). */
template <int NH, int N, int FORM>
static double run_regs(int bps, int sms) {
    const int blocks = bps * sms;
    const size_t smem = (size_t)(4 * 64 * 64 * NH + 4 * N * 64) * 2;
    CK(cudaFuncSetAttribute(k_regs<NH, N, FORM>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int fit = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, k_regs<NH, N, FORM>, 128, smem));
    if (fit < bps) return -1;
    return first_burst_median(blocks, 1, 8, [&](unsigned long long start, float *sink, unsigned long long *times) {
        k_regs<NH, N, FORM><<<blocks, 128, smem>>>(sink, times, start);
    });
}

/* Bits check: weights W [64][64], tokens X [16][64] (random bf16); P = A16 (D[r][t]) over one
 * 64-column tile; Q = B64 SS with X padded to 64 rows (D[t][r]); QR = B64 RS. */
__global__ void k_bits(const uint16_t *W, const uint16_t *X, float *P, float *Q, float *QR, float *PR) {
    __shared__ __align__(1024) uint16_t ws[64 * 64];
    __shared__ __align__(1024) uint16_t xs16[16 * 64];
    __shared__ __align__(1024) uint16_t xs64[64 * 64];
    __shared__ __align__(1024) uint16_t xs8[8 * 64];
    const int tid = threadIdx.x, wid = tid / 32, lane = tid % 32;
    for (int i = tid; i < 64 * 64; i += 128) {
        const int r = i / 64, k = i % 64;
        ws[sw(r, k, 64)] = W[i];
        xs64[sw(r, k, 64)] = r < 16 ? X[r * 64 + k] : 0;
        if (r < 16) xs16[sw(r, k, 16)] = X[i];
        if (r < 8) xs8[sw(r, k, 8)] = X[i];
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    float p[2][4] = {}, q[8][4] = {}, qr[8][4] = {};
    wg_pin(p);
    wg_pin(q);
    wg_pin(qr);
    wg_fence();
    for (int s = 0; s < 4; s++) {
        wgmma_ss<16>(p, wg_desc(smem_u32(ws) + s * 32), wg_desc(smem_u32(xs16) + s * 32));
        wgmma_ss<64>(q, wg_desc(smem_u32(xs64) + s * 32), wg_desc(smem_u32(ws) + s * 32));
    }
    wg_commit();
    wg_wait0();
    /* A fragment of X (m64k16, row-major A: rows 16 wid + lane/4 (+8), columns 2 (lane%4) (+1, +8, +9)) */
    for (int s = 0; s < 4; s++) {
        unsigned a[4];
        const int r = 16 * wid + lane / 4, c = s * 16 + 2 * (lane % 4);
        auto x2 = [&](int rr, int cc) -> unsigned {
            const unsigned lo = rr < 16 ? X[rr * 64 + cc] : 0, hi = rr < 16 ? X[rr * 64 + cc + 1] : 0;
            return lo | hi << 16;
        };
        a[0] = x2(r, c);
        a[1] = x2(r + 8, c);
        a[2] = x2(r, c + 8);
        a[3] = x2(r + 8, c + 8);
        wg_pin(qr);
        wg_fence();
        wgmma_rs<64>(qr, a, wg_desc(smem_u32(ws) + s * 32));
        wg_commit();
        wg_wait0();
    }
    /* Table 4's forms: the weights' A fragment from registers, 16 and 8 tokens, and mma.sync */
    float pr[2][4] = {}, p8[1][4] = {}, p8r[1][4] = {}, pm[4] = {};
    for (int s = 0; s < 4; s++) {
        unsigned a[4];
        const int r = 16 * wid + lane / 4, c = s * 16 + 2 * (lane % 4);
        auto w2 = [&](int rr, int cc) { return *reinterpret_cast<const unsigned *>(ws + sw(rr, cc, 64)); };
        a[0] = w2(r, c);
        a[1] = w2(r + 8, c);
        a[2] = w2(r, c + 8);
        a[3] = w2(r + 8, c + 8);
        wg_pin(pr);
        wg_pin(p8);
        wg_pin(p8r);
        wg_fence();
        wgmma_rs<16>(pr, a, wg_desc(smem_u32(xs16) + s * 32));
        wgmma_ss<8>(p8, wg_desc(smem_u32(ws) + s * 32), wg_desc(smem_u32(xs8) + s * 32));
        wgmma_rs<8>(p8r, a, wg_desc(smem_u32(xs8) + s * 32));
        wg_commit();
        wg_wait0();
        const int t = lane / 4;
        mma_bf16(pm, a, *reinterpret_cast<const unsigned *>(xs8 + sw(t, c, 8)),
                 *reinterpret_cast<const unsigned *>(xs8 + sw(t, c + 8, 8)));
    }
    wg_pin(pr);
    wg_pin(p8);
    wg_pin(p8r);
    wg_pin(p);
    wg_pin(q);
    wg_pin(qr);
    /* accumulator fragment: row 16 wid + lane/4 (+8), column 8 j + 2 (lane%4) (+1) */
    const int row = 16 * wid + lane / 4, c0 = 2 * (lane % 4);
    for (int j = 0; j < 2; j++) {
        P[row * 16 + 8 * j + c0] = p[j][0];
        P[row * 16 + 8 * j + c0 + 1] = p[j][1];
        P[(row + 8) * 16 + 8 * j + c0] = p[j][2];
        P[(row + 8) * 16 + 8 * j + c0 + 1] = p[j][3];
    }
    /* PR [4][64][16]: A16 RS, n8 SS, n8 RS, mma.sync (tokens 8-15 of the n8 forms not written, not read) */
    for (int j = 0; j < 2; j++) {
        float *o = PR;
        o[row * 16 + 8 * j + c0] = pr[j][0];
        o[row * 16 + 8 * j + c0 + 1] = pr[j][1];
        o[(row + 8) * 16 + 8 * j + c0] = pr[j][2];
        o[(row + 8) * 16 + 8 * j + c0 + 1] = pr[j][3];
    }
    {
        const float *src[3] = {p8[0], p8r[0], pm};
        for (int f = 0; f < 3; f++) {
            float *o = PR + (f + 1) * 64 * 16;
            o[row * 16 + c0] = src[f][0];
            o[row * 16 + c0 + 1] = src[f][1];
            o[(row + 8) * 16 + c0] = src[f][2];
            o[(row + 8) * 16 + c0 + 1] = src[f][3];
        }
    }
    for (int j = 0; j < 8; j++) {
        Q[row * 64 + 8 * j + c0] = q[j][0];
        Q[row * 64 + 8 * j + c0 + 1] = q[j][1];
        Q[(row + 8) * 64 + 8 * j + c0] = q[j][2];
        Q[(row + 8) * 64 + 8 * j + c0 + 1] = q[j][3];
        QR[row * 64 + 8 * j + c0] = qr[j][0];
        QR[row * 64 + 8 * j + c0 + 1] = qr[j][1];
        QR[(row + 8) * 64 + 8 * j + c0] = qr[j][2];
        QR[(row + 8) * 64 + 8 * j + c0 + 1] = qr[j][3];
    }
}

static uint16_t bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

int main(int argc, char **argv) {
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    printf("wgmma-bench: %d multiprocessors; us from the first wgmma issued to the wait's return, median block "
           "(median of 5 launches), first burst of each block\n\n",
           sms);
    printf("| mode | instr a 32 KiB tile | tiles | 1 block / SM | 2 | 3 |\n| --- | ---: | ---: | ---: | ---: | ---: |\n");
    for (int tiles : {1, 2}) {
        auto row = [&](int mode, auto fn) {
            const int ni = mode == M_A16 ? 16 : (mode == M_B64 || mode == M_R64) ? 16 : (mode == M_B128 || mode == M_R128) ? 8 : 4;
            printf("| %s | %d | %d", k_names[mode], ni, tiles);
            for (int bps = 1; bps <= 3; bps++) {
                if ((size_t)bps * ((size_t)tiles * WT + 64 * 256) * 2 > 227 * 1024) {
                    printf(" | -");
                    continue;
                }
                printf(" | %.3f", fn(bps) / 1e3);
            }
            printf(" |\n");
            fflush(stdout);
        };
        row(M_A16, [&](int b) { return run<M_A16>(b, tiles, 4, sms); });
        row(M_B64, [&](int b) { return run<M_B64>(b, tiles, 4, sms); });
        row(M_B128, [&](int b) { return run<M_B128>(b, tiles, 4, sms); });
        row(M_B256, [&](int b) { return run<M_B256>(b, tiles, 4, sms); });
        row(M_R64, [&](int b) { return run<M_R64>(b, tiles, 4, sms); });
        row(M_R128, [&](int b) { return run<M_R128>(b, tiles, 4, sms); });
        row(M_R256, [&](int b) { return run<M_R256>(b, tiles, 4, sms); });
    }

    /* Table 2: A16's burst after what k_gemm_tc does before its products (perf-notes v29). */
    printf("\n| A16, 1 tile, before the burst | 1 block / SM | 2 | 3 |\n| --- | ---: | ---: | ---: |\n");
    const char *preps[3] = {"nothing (table 1)", "a proxy fence", "cp.async of the operands, wait, proxy fence"};
    for (int prep = 0; prep < 3; prep++) {
        printf("| %s", preps[prep]);
        for (int bps = 1; bps <= 3; bps++) printf(" | %.3f", run<M_A16>(bps, 1, 4, sms, prep) / 1e3);
        printf(" |\n");
        fflush(stdout);
    }

    /* Table 3: the chunk count at run time or compile time (k_gemm_tc's form, perf-notes v30). */
    printf("\n| k_gemm_tc's products: 4 chunks x 4 k-steps, chunk count | halves | wgmma | 1 block / SM | 2 | 3 |\n"
           "| --- | ---: | ---: | ---: | ---: | ---: |\n");
    auto row3 = [&](const char *name, int nh, auto fn) {
        printf("| %s | %d | %d", name, nh, 16 * nh);
        for (int bps = 1; bps <= 3; bps++) printf(" | %.3f", fn(bps) / 1e3);
        printf(" |\n");
        fflush(stdout);
    };
    row3("at run time (a loop)", 1, [&](int b) { return run_chunks<0, 1>(b, sms); });
    row3("at compile time (straight)", 1, [&](int b) { return run_chunks<4, 1>(b, sms); });
    row3("at run time (a loop)", 2, [&](int b) { return run_chunks<0, 2>(b, sms); });
    row3("at compile time (straight)", 2, [&](int b) { return run_chunks<4, 2>(b, sms); });

    /* Table 4: the weights as A from registers (k_regs). */
    printf("\n| products: 4 chunks x 4 k-steps, halves, N tokens | A | instr | 1 block / SM | 2 | 3 |\n"
           "| --- | --- | ---: | ---: | ---: | ---: |\n");
    auto row4 = [&](const char *name, int nh, int n, int ni, auto fn) {
        printf("| %d %s, N = %d | %s | %d", nh, nh == 1 ? "half" : "halves", n, name, ni);
        for (int bps = 1; bps <= 3; bps++) {
            const double t = fn(bps);
            if (t < 0) printf(" | -");
            else printf(" | %.3f", t / 1e3);
        }
        printf(" |\n");
        fflush(stdout);
    };
    row4("wgmma, shared memory", 1, 16, 16, [&](int b) { return run_regs<1, 16, 0>(b, sms); });
    row4("wgmma, registers", 1, 16, 16, [&](int b) { return run_regs<1, 16, 1>(b, sms); });
    row4("wgmma, shared memory", 2, 16, 32, [&](int b) { return run_regs<2, 16, 0>(b, sms); });
    row4("wgmma, registers", 2, 16, 32, [&](int b) { return run_regs<2, 16, 1>(b, sms); });
    row4("wgmma, shared memory", 2, 8, 32, [&](int b) { return run_regs<2, 8, 0>(b, sms); });
    row4("wgmma, registers", 2, 8, 32, [&](int b) { return run_regs<2, 8, 1>(b, sms); });
    row4("mma.sync m16n8k16, registers", 2, 8, 128, [&](int b) { return run_regs<2, 8, 2>(b, sms); });

    /* bits */
    std::vector<uint16_t> W(64 * 64), X(16 * 64);
    srand(7);
    auto rnd = [] { return (float)rand() / RAND_MAX * 2.f - 1.f; };
    for (auto &v : W) v = bf(rnd() * 0.1f);
    for (auto &v : X) v = bf(rnd() * 3.f);
    uint16_t *dW, *dX;
    float *dP, *dQ, *dQR;
    CK(cudaMalloc(&dW, 2 * W.size()));
    CK(cudaMalloc(&dX, 2 * X.size()));
    CK(cudaMalloc(&dP, 4 * 64 * 16));
    CK(cudaMalloc(&dQ, 4 * 64 * 64));
    CK(cudaMalloc(&dQR, 4 * 64 * 64));
    float *dPR;
    CK(cudaMalloc(&dPR, 4 * 4 * 64 * 16));
    CK(cudaMemcpy(dW, W.data(), 2 * W.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dX, X.data(), 2 * X.size(), cudaMemcpyHostToDevice));
    k_bits<<<1, 128>>>(dW, dX, dP, dQ, dQR, dPR);
    CK(cudaDeviceSynchronize());
    std::vector<float> P(64 * 16), Q(64 * 64), QR(64 * 64);
    CK(cudaMemcpy(P.data(), dP, 4 * P.size(), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(Q.data(), dQ, 4 * Q.size(), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(QR.data(), dQR, 4 * QR.size(), cudaMemcpyDeviceToHost));
    std::vector<float> PR(4 * 64 * 16);
    CK(cudaMemcpy(PR.data(), dPR, 4 * PR.size(), cudaMemcpyDeviceToHost));
    int dform[4] = {};
    int diff = 0, diffr = 0, bad = 0;
    double maxref = 0;
    for (int r = 0; r < 64; r++)
        for (int t = 0; t < 16; t++) {
            double ref = 0;
            for (int k = 0; k < 64; k++) {
                uint32_t a = (uint32_t)W[r * 64 + k] << 16, b = (uint32_t)X[t * 64 + k] << 16;
                float fa, fb;
                memcpy(&fa, &a, 4);
                memcpy(&fb, &b, 4);
                ref += (double)fa * fb;
            }
            const float p = P[r * 16 + t], q = Q[t * 64 + r], qr = QR[t * 64 + r];
            if (fabs(p - ref) > 1e-3 * (1 + fabs(ref))) bad++;
            maxref = std::max(maxref, fabs(p - ref));
            diff += memcmp(&p, &q, 4) != 0;
            diffr += memcmp(&p, &qr, 4) != 0;
            for (int f = 0; f < 4; f++)
                if (f == 0 || t < 8) dform[f] += memcmp(&p, &PR[f * 64 * 16 + r * 16 + t], 4) != 0;
        }
    printf("\nbits: A16 against float64: %d of 1024 off (max |err| %.2e); B64 SS %d of 1024 differ from A16, B64 RS %d\n",
           bad, maxref, diff, diffr);
    printf("bits, weights as A from registers (table 4): A16 RS %d of 1024 differ from A16; N = 8 (512 sums): SS %d, RS %d, "
           "mma.sync %d\n",
           dform[0], dform[1], dform[2], dform[3]);
    return 0;
}
