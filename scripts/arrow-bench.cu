/* arrow-bench.cu: what a dependency ("arrow") between two phases of a batch-1 decode step costs on
 * one GPU, alone and beside a weight stream (docs/perf-notes.md v13). Standalone; build and run on
 * the GPU machine:
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90a -Isrc -o /tmp/arrow-bench scripts/arrow-bench.cu
 *   /tmp/arrow-bench
 *
 * (or `scripts/device-run.sh arrow`). It prints six tables:
 *   1. stream: DRAM read bandwidth of G blocks (one a multiprocessor), each streaming with
 *      16-byte register loads (8 warps, U loads a lane in flight), bulk copies into a ring of
 *      S shared-memory stages of 16 KiB (cp.async.bulk + mbarrier, one thread) or cp.async;
 *   2. chase: latency of one dependent load that hits L2 (a pointer chase, one thread), while the
 *      other multiprocessors stream with a given number of bytes in flight;
 *   3. barrier: one all-to-all dependency among every multiprocessor (each block's thread 0 adds
 *      to a counter with release semantics and spins with acquire loads until all have), plus
 *      the read of a value another block wrote before it, alone and beside the stream;
 *   4. cluster: the hardware cluster barrier (barrier.cluster) and a distributed-shared-memory
 *      read, for clusters of 8 and 16 blocks, and how many such clusters fit at once;
 *   5. staging: a GEMV's dependency as it meets it: weight loads issued, the dependency, the
 *      activations staged into shared memory through L2 or by one bulk copy, the weights used;
 *   6. chain: the same round as 112 separate kernels in one CUDA graph (programmatic dependent
 *      launch), the dependency met by griddepcontrol.wait or by a counter, the next kernel let
 *      launch after staging or at the start (perf-notes v17);
 *   7. after the wait: the %globaltimer's step, and inside table 6's chain (launched at the
 *      predecessor's start) when each warp's griddepcontrol.wait returns after the predecessor's
 *      last block ended, how far apart a block's warps return, and what staging x then takes
 *      (perf-notes v28).
 * Times come from %globaltimer (ns) over many repetitions (table 6: CUDA events over 20 graph
 * replays, median). An argument 1, 2 or 3 limits tables 1-3 to that stream kind (register loads,
 * bulk copies, cp.async); 6 prints table 6 alone, 7 table 7 alone. */
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <tuple>
#include <vector>

#include "backend/cuda/common.cuh" /* ld_stream16 (the GEMV's weight load), gtime, smem_u32, mbar_* */

#include "bench-check.cuh" /* CK */

__device__ __forceinline__ unsigned ld_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void red_release(unsigned *p, unsigned v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void bulk_load(void *dst, const void *src, unsigned bytes, uint64_t *b) {
    mbar_arrive_expect(b, bytes);
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(b))
                 : "memory");
}

constexpr int THREADS = 256, STAGE = 16384, MAXU = 16, MAXS = 12;

struct Stream {
    const uint8_t *buf;
    size_t size;     /* bytes, a multiple of 1 MiB */
    int kind;        /* 0: none, 1: register loads, 2: bulk copies, 3: cp.async (16 bytes a thread) */
    int depth;       /* U (16-byte loads a lane in flight) or S (16 KiB stages) */
    const volatile int *stop; /* stream until this is set (or for `bytes` when NULL) */
    size_t bytes;    /* bytes a block streams when stop is NULL */
    unsigned long long *stats; /* [0] bytes, [1] min start, [2] max end */
};

/* One block's stream: its warps (register loads) or its thread 0 (bulk copies), until stop or
 * the block's byte budget. Warp w of block b reads chunks (i * nwarps + gw) of 512 * U bytes. */
__device__ void run_stream(const Stream &s, int sb, int nsb, uint8_t *smem, uint64_t *bars, int first_warp) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned long long t0 = gtime(), n = 0;
    if (s.kind == 1 && warp >= first_warp) {
        const int nw = (THREADS / 32 - first_warp), gw = sb * nw + (warp - first_warp), NW = nsb * nw;
        const int U = s.depth;
        uint32_t acc = 0;
        const size_t per = s.bytes / nw;
        for (size_t i = 0;; i++) {
            if (s.stop ? (i % 4 == 0 && *s.stop) : n >= per) break;
            uint4 v[MAXU];
            const size_t base = ((i * NW + gw) * (size_t)U * 512) % s.size;
#pragma unroll
            for (int u = 0; u < MAXU; u++)
                if (u < U) v[u] = ld_stream16(s.buf + (base + u * 512 + lane * 16) % s.size);
#pragma unroll
            for (int u = 0; u < MAXU; u++)
                if (u < U) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
            n += (size_t)U * 512;
        }
        if (acc == 0x12345678u) smem[0] = 1; /* keep the loads */
        n = lane == 0 ? n : 0;
    } else if (s.kind == 2 && threadIdx.x == first_warp * 32) {
        const int S = s.depth;
        for (int i = 0; i < S; i++) mbar_init(&bars[i], 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        const size_t per = s.bytes;
        size_t issued = 0, k = 0;
        auto src = [&](size_t c) { return s.buf + ((c * nsb + sb) * (size_t)STAGE) % s.size; };
        for (int i = 0; i < S; i++) bulk_load(smem + (size_t)i * STAGE, src(k++), STAGE, &bars[i]), issued += STAGE;
        for (size_t c = 0;; c++) {
            const int i = (int)(c % S);
            mbar_wait(&bars[i], (unsigned)((c / S) & 1));
            n += STAGE;
            if (s.stop ? (*s.stop != 0) : issued >= per) {
                for (size_t d = c + 1; d < k; d++) mbar_wait(&bars[d % S], (unsigned)((d / S) & 1)), n += STAGE;
                break;
            }
            bulk_load(smem + (size_t)i * STAGE, src(k++), STAGE, &bars[i]);
            issued += STAGE;
        }
    } else if (s.kind == 3 && warp >= first_warp) {
        /* cp.async.cg 16 bytes a thread into a ring of S stages of 16 KiB, one commit group a
         * stage; each thread waits for its own oldest group (cp.async.wait_group S - 1). */
        const int S = s.depth, nt = (THREADS - first_warp * 32), tid = threadIdx.x - first_warp * 32;
        const size_t per = s.bytes;
        auto src = [&](size_t c) { return s.buf + ((c * nsb + sb) * (size_t)STAGE) % s.size; };
        size_t k = 0, done = 0;
        auto issue = [&](int slot) {
            const uint8_t *g = src(k++);
            for (int o = tid * 16; o < STAGE; o += nt * 16)
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(smem + (size_t)slot * STAGE + o)), "l"(g + o)
                             : "memory");
            asm volatile("cp.async.commit_group;" ::: "memory");
        };
        for (int i = 0; i < S; i++) issue(i);
        for (size_t c = 0;; c++) {
            switch (S) { /* the oldest group has landed */
            case 1: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
            case 2: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
            case 4: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
            case 8: asm volatile("cp.async.wait_group 7;" ::: "memory"); break;
            default: asm volatile("cp.async.wait_group 11;" ::: "memory"); break;
            }
            done += STAGE;
            if (s.stop ? (c % 4 == 0 && *s.stop != 0) : done >= per) break;
            issue((int)(c % S));
        }
        asm volatile("cp.async.wait_group 0;" ::: "memory");
        n = tid == 0 ? done : 0;
    } else {
        return;
    }
    const unsigned long long t1 = gtime();
    atomicAdd(&s.stats[0], n);
    atomicMin(&s.stats[1], t0);
    atomicMax(&s.stats[2], t1);
}

/* Table 1: every block streams s.bytes. */
__global__ void __launch_bounds__(THREADS, 1) k_stream(Stream s) {
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ uint64_t bars[MAXS];
    run_stream(s, blockIdx.x, gridDim.x, smem, bars, 0);
}

/* Table 2: block 0's thread 0 chases `hops` pointers (after a warm pass and a 20 us settle),
 * the other blocks stream until it is done. */
__global__ void __launch_bounds__(THREADS, 1) k_chase(Stream s, const unsigned *chain, int hops, int *stop,
                                                      unsigned long long *out) {
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ uint64_t bars[MAXS];
    if (blockIdx.x > 0) {
        run_stream(s, blockIdx.x - 1, gridDim.x - 1, smem, bars, 0);
        return;
    }
    if (threadIdx.x) return;
    unsigned p = 0;
    for (int i = 0; i < hops; i++) p = __ldcg(chain + p); /* warm */
    const unsigned long long w = gtime();
    while (gtime() - w < 20000) {
    }
    const unsigned long long t0 = gtime();
    for (int i = 0; i < hops; i++) p = __ldcg(chain + p);
    const unsigned long long t1 = gtime();
    out[0] = t1 - t0;
    out[1] = p;
    __threadfence();
    *(volatile int *)stop = 1;
}

/* Table 3: `rounds` all-to-all dependencies among all blocks; warps 1.. stream beside them. */
__global__ void __launch_bounds__(THREADS, 1) k_barrier(Stream s, unsigned *cnt, unsigned *data, int rounds,
                                                        int with_data, unsigned long long *out) {
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ uint64_t bars[MAXS];
    __shared__ volatile int done;
    if (threadIdx.x == 0) done = 0;
    __syncthreads();
    if (threadIdx.x >= 32) {
        Stream t = s;
        t.stop = &done;
        run_stream(t, blockIdx.x, gridDim.x, smem, bars, 1);
        return;
    }
    if (threadIdx.x == 0) {
        const unsigned G = gridDim.x;
        unsigned sink = 0;
        const unsigned long long w = gtime();
        while (gtime() - w < 20000) {
        }
        /* One untimed round lines every block up. */
        red_release(cnt, 1);
        while (ld_acquire(cnt) < G) {
        }
        const unsigned long long t0 = gtime();
        for (int r = 1; r <= rounds; r++) {
            if (with_data) data[blockIdx.x * 32] = r; /* this block's output of the phase */
            red_release(cnt, 1);
            while (ld_acquire(cnt) < (unsigned)(r + 1) * G) {
            }
            if (with_data) sink += __ldcg(data + ((blockIdx.x + 1) % G) * 32); /* a peer's output */
        }
        const unsigned long long t1 = gtime();
        if (blockIdx.x == 0) out[0] = t1 - t0, out[1] = sink;
        done = 1;
    }
}

/* Table 4: `rounds` cluster barriers, and `rounds` dependent reads of a peer block's shared memory. */
__global__ void __launch_bounds__(THREADS, 1) k_cluster(int rounds, unsigned long long *out) {
    __shared__ unsigned slot[32];
    if (threadIdx.x < 32) slot[threadIdx.x] = threadIdx.x == 0 ? 0 : threadIdx.x;
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    unsigned rank, size;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(size));
    const unsigned long long t0 = gtime();
    for (int r = 0; r < rounds; r++)
        asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    const unsigned long long t1 = gtime();
    unsigned p = 0;
    if (threadIdx.x == 0) {
        uint32_t peer;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(peer) : "r"(smem_u32(slot)), "r"((rank + 1) % size));
        for (int r = 0; r < rounds; r++) {
            unsigned v;
            asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(peer + 4 * (p & 31)) : "memory");
            p = v + (v == 0); /* slot 0 holds 0: go to 1; slot i holds i: stay (a dependent chain) */
        }
    }
    const unsigned long long t2 = gtime();
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    if (blockIdx.x == 0 && threadIdx.x == 0) out[0] = t1 - t0, out[1] = t2 - t1, out[2] = p;
}

/* Table 5: a GEMV step's dependency as k_gemv meets it: each round every warp issues U 16-byte
 * weight loads a lane (the next matrix's first batch), the block waits on the all-to-all counter,
 * stages `xb` bytes of activations (written by another block before the round) into shared
 * memory, by every thread through L2 (mode 0), by one bulk copy (mode 1) or not (2), then uses the
 * weights. Per round: barrier + staging + the weights' arrival. */
__global__ void __launch_bounds__(THREADS, 1) k_stage(const uint8_t *wbuf, size_t wsize, int U, unsigned *cnt,
                                                      float *x, int xb, int mode, int rounds, int pf,
                                                      unsigned long long *out) {
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ uint64_t bar;
    __shared__ unsigned sink;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, G = gridDim.x;
    if (threadIdx.x == 0) {
        mbar_init(&bar, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        sink = 0;
    }
    __syncthreads();
    float *xs = reinterpret_cast<float *>(smem);
    const int gw = blockIdx.x * 8 + warp, NW = G * 8, nx = xb / 4;
    uint32_t acc = 0;
    unsigned long long t0 = 0;
    for (int r = 0; r <= rounds; r++) {
        if (r == 1) t0 = gtime(); /* round 0 lines the blocks up */
        uint4 v[MAXU];
        const size_t base = (((size_t)r * NW + gw) * (size_t)U * 512) % wsize;
        if (pf) { /* the next round's weights into L2 (one prefetch a 128-byte line) */
            const size_t nb = (((size_t)(r + 1) * NW + gw) * (size_t)U * 512) % wsize;
            for (int i = lane; i < U * 4; i += 32)
                asm volatile("prefetch.global.L2 [%0];" ::"l"(wbuf + (nb + (size_t)i * 128) % wsize));
        }
#pragma unroll
        for (int u = 0; u < MAXU; u++)
            if (u < U) v[u] = ld_stream16(wbuf + (base + u * 512 + lane * 16) % wsize);
        /* this block's share of the activations the next round reads */
        if (threadIdx.x < 32) x[(blockIdx.x * 32 + threadIdx.x) % nx] = (float)r;
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            red_release(cnt, 1);
            while (ld_acquire(cnt) < (unsigned)(r + 1) * G) {
            }
        }
        __syncthreads();
        if (mode == 0) {
            for (int i = threadIdx.x; i < nx; i += THREADS) xs[i] = __ldcg(x + i);
        } else if (mode == 1 && threadIdx.x == 0) {
            asm volatile("fence.proxy.async.global;" ::: "memory");
            bulk_load(xs, x, (unsigned)xb, &bar);
            mbar_wait(&bar, (unsigned)(r & 1));
        }
        __syncthreads();
#pragma unroll
        for (int u = 0; u < MAXU; u++)
            if (u < U) acc ^= v[u].x ^ v[u].w;
        if (threadIdx.x == 0) sink += __float_as_uint(xs[r % nx]);
    }
    const unsigned long long t1 = gtime();
    if (acc == 0x12345678u) sink += 1;
    if (blockIdx.x == 0 && threadIdx.x == 0) out[0] = t1 - t0, out[1] = sink;
}


/* Table 6: a chain of kernels, as the decode step's GEMVs meet their predecessors: each kernel's
 * warps issue U 16-byte weight loads a lane, the block waits for its predecessor (mode 0:
 * griddepcontrol.wait, i.e. the previous grid completed and flushed; mode 1: a counter the
 * previous kernel's blocks add to with release semantics after their writes, spun on with acquire
 * loads by thread 0; mode 2: as 1, but the next kernel is let launch at this one's start; mode 3:
 * as 0, launched at the predecessor's start), stages 4 KiB of activations the previous kernel
 * wrote through L2, uses the weights and writes its own share of the activations. Modes 0 and 1
 * let their dependents launch after staging.
 * Table 7 runs the same chain in mode 3 with the recorder (REC; table 6 runs the instantiation
 * without it, so that no timing code it never runs sits in its kernel: perf-notes v30): blocks of
 * kernels [T7_FIRST, T7_FIRST + T7_N) write rec[k][block][]: 0-7 each warp's %globaltimer as its
 * wait returned (lane 0), 8 when the block had staged x and passed the barrier after it, 9 its end
 * (thread 0, after its writes), 10 its start. */
constexpr int T7_FIRST = 40, T7_N = 16, T7_W = 11;
template <bool REC>
__global__ void __launch_bounds__(THREADS, 2) k_link(const uint8_t *wbuf, size_t wsize, int U, unsigned *ctr,
                                                      int link, const float *xin, float *xout, int mode,
                                                      unsigned long long *rec_buf) {
    __shared__ float xs[1024];
    unsigned long long *const rec = REC ? rec_buf : nullptr;
    const unsigned long long t_start = rec ? gtime() : 0;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, G = gridDim.x;
    const int gw = blockIdx.x * 8 + warp, NW = G * 8;
    if (mode == 2 || mode == 3) pdl_trigger();
    uint4 v[MAXU];
    const size_t base = (((size_t)link * NW + gw) * (size_t)U * 512) % wsize;
#pragma unroll
    for (int u = 0; u < MAXU; u++)
        if (u < U) v[u] = ld_stream16(wbuf + (base + u * 512 + lane * 16) % wsize);
    if (mode == 0 || mode == 3) {
        pdl_wait();
    } else if (link > 0) {
        if (threadIdx.x == 0)
            while (ld_acquire(ctr + link - 1) < (unsigned)G) {
            }
        __syncthreads();
    }
    const bool rc = rec && link >= T7_FIRST && link < T7_FIRST + T7_N;
    unsigned long long *r = rc ? rec + ((size_t)(link - T7_FIRST) * G + blockIdx.x) * T7_W : nullptr;
    if (rc && lane == 0) r[warp] = gtime();
    for (int i = threadIdx.x; i < 1024; i += THREADS) xs[i] = __ldcg(xin + i);
    __syncthreads();
    if (rc && threadIdx.x == 0) r[8] = gtime();
    if (mode < 2) pdl_trigger();
    uint32_t acc = 0;
#pragma unroll
    for (int u = 0; u < MAXU; u++)
        if (u < U) acc ^= v[u].x ^ v[u].w;
    /* this block's share of the next kernel's activations (1024 floats over G blocks) */
    const int per = (1024 + G - 1) / G;
    if (threadIdx.x < per && blockIdx.x * per + threadIdx.x < 1024)
        xout[blockIdx.x * per + threadIdx.x] = xs[(threadIdx.x + link) & 1023] + (acc == 0x12345678u ? 1.f : 0.f);
    if (mode == 1 || mode == 2) {
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            red_release(ctr + link, 1);
        }
    }
    if (rc) {
        __syncthreads();
        if (threadIdx.x == 0) r[9] = gtime(), r[10] = t_start;
    }
}
__global__ void k_link_reset(unsigned *ctr, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) ctr[i] = 0;
}

/* The %globaltimer's step: one thread reads it n times; out[0] the smallest nonzero difference of
 * two reads, out[1] the distinct values seen, out[2] the span (ns). */
__global__ void k_timer(int n, unsigned long long *out) {
    unsigned long long prev = gtime(), first = prev, dmin = ~0ull, distinct = 1;
    for (int i = 0; i < n; i++) {
        const unsigned long long t = gtime();
        if (t != prev) {
            dmin = t - prev < dmin ? t - prev : dmin;
            distinct++;
        }
        prev = t;
    }
    out[0] = dmin, out[1] = distinct, out[2] = prev - first;
}

static int g_sms;

static Stream make_stream(const uint8_t *buf, size_t size, int kind, int depth, unsigned long long *stats) {
    Stream s{};
    s.buf = buf, s.size = size, s.kind = kind, s.depth = depth, s.stats = stats;
    return s;
}
static void reset_stats(unsigned long long *st) {
    unsigned long long h[3] = {0, ~0ull, 0};
    CK(cudaMemcpy(st, h, sizeof h, cudaMemcpyHostToDevice));
}
static double stats_gbs(unsigned long long *st) {
    unsigned long long h[3];
    CK(cudaMemcpy(h, st, sizeof h, cudaMemcpyDeviceToHost));
    return h[2] > h[1] ? (double)h[0] / (double)(h[2] - h[1]) : 0; /* bytes/ns = GB/s */
}
static const char *kind_name(int k) { return k == 0 ? "none" : k == 1 ? "reg" : k == 2 ? "bulk" : "cp.async"; }
static double inflight_mb(int kind, int depth, int blocks, int warps) {
    if (kind == 1) return (double)blocks * warps * 32 * 16 * depth / 1e6;
    if (kind >= 2) return (double)blocks * depth * STAGE / 1e6;
    return 0;
}

/* Tables 6 and 7: L launches of `kernel` (G blocks of THREADS) captured as one graph on st, each
 * under programmatic dependent launch unless pdl is false; args(l) gives launch l's arguments as a
 * tuple, after() queues what follows them in the graph. */
template <class K, class A, class After>
static cudaGraphExec_t capture_chain(cudaStream_t st, int L, int G, bool pdl, K kernel, A &&args, After &&after) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int l = 0; l < L; l++) {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.gridDim = dim3(G), cfg.blockDim = dim3(THREADS), cfg.stream = st;
        cfg.attrs = at, cfg.numAttrs = pdl ? 1 : 0;
        std::apply([&](auto... a) { CK(cudaLaunchKernelEx(&cfg, kernel, a...)); }, args(l));
    }
    after();
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphDestroy(g)); /* the executable graph keeps what it needs */
    return ge;
}

/* Table 6 (see k_link<false>). */
static void chain_table(uint8_t *buf, size_t BUF) {
    /* 6. kernel chains */
    printf("\n6. chain: %d kernels in one graph, each U weight loads a lane, the dependency, 4 KiB staged (us a kernel)\n", 112);
    printf("| blocks | U | griddepcontrol.wait | counter | counter, launched at the predecessor's start | griddepcontrol.wait, launched at the predecessor's start | no PDL |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    {
        const int L = 112;
        unsigned *ctr;
        float *xa;
        CK(cudaMalloc(&ctr, L * 4));
        CK(cudaMemset(ctr, 0, L * 4));
        CK(cudaMalloc(&xa, (size_t)(L + 1) * 4096));
        CK(cudaMemset(xa, 0, (size_t)(L + 1) * 4096));
        cudaStream_t st6;
        CK(cudaStreamCreateWithFlags(&st6, cudaStreamNonBlocking));
        for (int G : {g_sms, 2 * g_sms})
            for (int U : {4, 8, 12, 16}) {
                double us[5];
                for (int mode = 0; mode < 5; mode++) {
                    const int km = mode == 4 ? 0 : mode;
                    cudaGraphExec_t ge = capture_chain(
                        st6, L, G, mode != 4, k_link<false>,
                        [&](int l) {
                            return std::make_tuple((const uint8_t *)buf, BUF, U, ctr, l,
                                                   (const float *)(xa + (size_t)l * 1024), xa + (size_t)(l + 1) * 1024, km,
                                                   (unsigned long long *)nullptr);
                        },
                        [&] { k_link_reset<<<1, 128, 0, st6>>>(ctr, L); });
                    std::vector<float> t;
                    cudaEvent_t e0, e1;
                    CK(cudaEventCreate(&e0));
                    CK(cudaEventCreate(&e1));
                    for (int r = 0; r < 23; r++) {
                        CK(cudaEventRecord(e0, st6));
                        CK(cudaGraphLaunch(ge, st6));
                        CK(cudaEventRecord(e1, st6));
                        CK(cudaEventSynchronize(e1));
                        float ms;
                        CK(cudaEventElapsedTime(&ms, e0, e1));
                        if (r >= 3) t.push_back(ms);
                    }
                    std::sort(t.begin(), t.end());
                    us[mode] = t[t.size() / 2] * 1e3 / L;
                    CK(cudaGraphExecDestroy(ge));
                }
                printf("| %d | %d | %.2f | %.2f | %.2f | %.2f | %.2f |\n", G, U, us[0], us[1], us[2], us[3], us[4]);
            }
    }
}

/* Table 7 (see k_link<true>: mode 3 with its recorder). */
static void after_wait_table(uint8_t *buf, size_t BUF) {
    unsigned long long *tm, th[3];
    CK(cudaMalloc(&tm, 24));
    k_timer<<<1, 1>>>(100000, tm);
    CK(cudaMemcpy(th, tm, 24, cudaMemcpyDeviceToHost));
    printf("\n7. after the wait: %%globaltimer steps by at least %llu ns (%llu distinct values in %.1f us of reads)\n",
           th[0], th[1], th[2] / 1e3);
    printf("   a chain of 112 kernels as table 6 (griddepcontrol.wait, launched at the predecessor's start); kernels %d-%d "
           "timed per block, us: medians over blocks, means over kernels\n", T7_FIRST, T7_FIRST + T7_N - 1);
    printf("| blocks | U | end-wait (median warp) | warps' skew in a block | first warp's return to x staged | staged to block end | "
           "predecessor's last block to this kernel's median end |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    const int L = 112;
    float *xa;
    CK(cudaMalloc(&xa, (size_t)(L + 1) * 4096));
    CK(cudaMemset(xa, 0, (size_t)(L + 1) * 4096));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (int G : {g_sms, 2 * g_sms})
        for (int U : {0, 8}) {
            unsigned long long *rec;
            const size_t nrec = (size_t)T7_N * G * T7_W;
            CK(cudaMalloc(&rec, nrec * 8));
            cudaGraphExec_t ge = capture_chain(
                st, L, G, true, k_link<true>,
                [&](int l) {
                    return std::make_tuple((const uint8_t *)buf, BUF, U, (unsigned *)nullptr, l,
                                           (const float *)(xa + (size_t)l * 1024), xa + (size_t)(l + 1) * 1024, 3, rec);
                },
                [] {});
            std::vector<double> sum(5, 0.0);
            int n = 0;
            for (int rep = 0; rep < 8; rep++) {
                CK(cudaGraphLaunch(ge, st));
                CK(cudaStreamSynchronize(st));
                if (rep < 3) continue; /* warm-up */
                std::vector<unsigned long long> h(nrec);
                CK(cudaMemcpy(h.data(), rec, nrec * 8, cudaMemcpyDeviceToHost));
                for (int k = 1; k < T7_N; k++) {
                    unsigned long long prev_end = 0;
                    for (int b = 0; b < G; b++) prev_end = std::max(prev_end, h[((size_t)(k - 1) * G + b) * T7_W + 9]);
                    std::vector<double> ew, sk, st2, se, en;
                    for (int b = 0; b < G; b++) {
                        const unsigned long long *r = &h[((size_t)k * G + b) * T7_W];
                        std::vector<unsigned long long> w(r, r + 8);
                        std::sort(w.begin(), w.end());
                        ew.push_back(((double)w[4] - (double)prev_end) / 1e3);
                        sk.push_back((double)(w[7] - w[0]) / 1e3);
                        st2.push_back(((double)r[8] - (double)w[0]) / 1e3);
                        se.push_back(((double)r[9] - (double)r[8]) / 1e3);
                        en.push_back(((double)r[9] - (double)prev_end) / 1e3);
                    }
                    auto med = [](std::vector<double> &v) {
                        std::sort(v.begin(), v.end());
                        return v[v.size() / 2];
                    };
                    sum[0] += med(ew), sum[1] += med(sk), sum[2] += med(st2), sum[3] += med(se), sum[4] += med(en);
                    n++;
                }
            }
            printf("| %d | %d | %.2f | %.2f | %.2f | %.2f | %.2f |\n", G, U, sum[0] / n, sum[1] / n, sum[2] / n, sum[3] / n,
                   sum[4] / n);
            CK(cudaGraphExecDestroy(ge));
            CK(cudaFree(rec));
        }
}

int main(int argc, char **argv) {
    const int only = argc > 1 ? atoi(argv[1]) : 0; /* a stream kind alone (1-3), or all */
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    g_sms = prop.multiProcessorCount;
    printf("arrow-bench: %s, %d SMs, L2 %d MiB\n", prop.name, g_sms, prop.l2CacheSize >> 20);
    const size_t BUF = (size_t)2 << 30;
    uint8_t *buf;
    CK(cudaMalloc(&buf, BUF));
    CK(cudaMemset(buf, 1, BUF));
    if (only == 6) { /* table 6 alone */
        chain_table(buf, BUF);
        return 0;
    }
    if (only == 7) { /* table 7 alone */
        after_wait_table(buf, BUF);
        return 0;
    }
    unsigned long long *st, *out;
    CK(cudaMalloc(&st, 64));
    CK(cudaMalloc(&out, 64));
    int *stop;
    CK(cudaMalloc(&stop, 4));
    const int SMEM = MAXS * STAGE; /* 192 KiB: one block a multiprocessor */
    for (auto fn : {(const void *)k_stream, (const void *)k_chase, (const void *)k_barrier})
        CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));

    /* 1. stream bandwidth */
    printf("\n1. stream: DRAM read bandwidth (G blocks, one a multiprocessor)\n");
    printf("| kind | depth | G | in flight MB | GB/s total | GB/s a block |\n| --- | ---: | ---: | ---: | ---: | ---: |\n");
    const int Gs[] = {1, 8, 33, 66, 132};
    const int regU[] = {4, 16}, bulkS[] = {2, 4, 8, 12};
    for (int kind = 1; kind <= 3; kind++)
        for (int di = 0; di < (kind == 1 ? 2 : 4); di++)
            for (int G : Gs) {
                if (G > g_sms) continue;
                const int depth = kind == 1 ? regU[di] : bulkS[di];
            if (only && kind != only) continue;
                Stream s = make_stream(buf, BUF, kind, depth, st);
                s.bytes = (size_t)(G == 1 ? 64 : 24) << 20;
                k_stream<<<G, THREADS, SMEM>>>(s); /* warm */
                CK(cudaDeviceSynchronize());
                reset_stats(st);
                k_stream<<<G, THREADS, SMEM>>>(s);
                CK(cudaDeviceSynchronize());
                const double gbs = stats_gbs(st);
                printf("| %s | %d | %d | %.2f | %.0f | %.1f |\n", kind_name(kind), depth, G,
                       inflight_mb(kind, depth, G, 8), gbs, gbs / G);
            }

    /* 2. chase latency beside a stream */
    printf("\n2. chase: one dependent load (ns), the other %d multiprocessors streaming\n", g_sms - 1);
    printf("| stream | depth | in flight MB | stream GB/s | L2 hit ns |\n| --- | ---: | ---: | ---: | ---: |\n");
    const int NL2 = 1024, HOPS = 2000; /* the warm pass covers the whole cycle: every hop hits L2 */
    unsigned *chain_l2;
    {
        /* A random cycle over the NL2 nodes, 128 bytes (32 words) apart; node 0 is on it. */
        std::vector<unsigned> perm(NL2), h((size_t)NL2 * 32, 0);
        for (int i = 0; i < NL2; i++) perm[i] = i;
        srand(7);
        for (int i = NL2 - 1; i > 0; i--) std::swap(perm[i], perm[rand() % (i + 1)]);
        for (int i = 0; i < NL2; i++) h[(size_t)perm[i] * 32] = perm[(i + 1) % NL2] * 32;
        CK(cudaMalloc(&chain_l2, h.size() * 4));
        CK(cudaMemcpy(chain_l2, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    }
    struct { int kind, depth; } mix[] = {{0, 0}, {1, 1}, {1, 2}, {1, 4}, {1, 8}, {1, 16}, {2, 1}, {2, 2}, {2, 4}, {2, 8}, {2, 12},
                                     {3, 1}, {3, 2}, {3, 4}, {3, 8}, {3, 12}};
    for (auto m : mix) {
        if (only && m.kind && m.kind != only) continue;
        Stream s = make_stream(buf, BUF, m.kind, m.depth, st);
        s.stop = stop;
        CK(cudaMemset(stop, 0, 4));
        reset_stats(st);
        k_chase<<<g_sms, THREADS, SMEM>>>(s, chain_l2, HOPS, stop, out);
        CK(cudaDeviceSynchronize());
        unsigned long long h[2];
        CK(cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost));
        const double gbs = stats_gbs(st);
        printf("| %s | %d | %.2f | %.0f | %.0f |\n", kind_name(m.kind), m.depth,
               inflight_mb(m.kind, m.depth, g_sms - 1, 8), gbs, (double)h[0] / HOPS);
    }

    /* 3. all-to-all dependency */
    printf("\n3. barrier: one all-to-all dependency among %d blocks (us a round), warps 1-7 streaming\n", g_sms);
    printf("| stream | depth | in flight MB | stream GB/s | counter only | + a peer's value |\n| --- | ---: | ---: | ---: | ---: | ---: |\n");
    unsigned *cnt, *data;
    CK(cudaMalloc(&cnt, 4));
    CK(cudaMalloc(&data, (size_t)g_sms * 128));
    const int ROUNDS = 2000;
    for (auto m : mix) {
        if (only && m.kind && m.kind != only) continue;
        double us[2] = {0, 0}, gbs = 0;
        for (int wd = 0; wd < 2; wd++) {
            Stream s = make_stream(buf, BUF, m.kind, m.depth, st);
            CK(cudaMemset(cnt, 0, 4));
            reset_stats(st);
            k_barrier<<<g_sms, THREADS, SMEM>>>(s, cnt, data, ROUNDS, wd, out);
            CK(cudaDeviceSynchronize());
            unsigned long long h[1];
            CK(cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost));
            us[wd] = (double)h[0] / ROUNDS / 1e3;
            if (wd == 0) gbs = stats_gbs(st);
        }
        printf("| %s | %d | %.2f | %.0f | %.2f | %.2f |\n", kind_name(m.kind), m.depth,
               inflight_mb(m.kind, m.depth, g_sms, 7), gbs, us[0], us[1]);
    }

    /* 4. clusters */
    printf("\n4. cluster: hardware barrier and distributed shared memory (one block of %d threads a multiprocessor)\n", THREADS);
    printf("| cluster size | clusters that fit | blocks | barrier us | DSMEM dependent read ns |\n| ---: | ---: | ---: | ---: | ---: |\n");
    CK(cudaFuncSetAttribute((const void *)k_cluster, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    CK(cudaFuncSetAttribute((const void *)k_cluster, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    for (int cs : {2, 4, 8, 16}) {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = cs, at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
        cfg.blockDim = dim3(THREADS);
        cfg.dynamicSmemBytes = SMEM;
        cfg.attrs = at, cfg.numAttrs = 1;
        cfg.gridDim = dim3(cs);
        int fit = 0;
        cudaError_t e = cudaOccupancyMaxActiveClusters(&fit, (const void *)k_cluster, &cfg);
        if (e != cudaSuccess) {
            printf("| %d | (%s) | - | - | - |\n", cs, cudaGetErrorString(e));
            cudaGetLastError();
            continue;
        }
        cfg.gridDim = dim3(fit * cs);
        const int R = 5000;
        e = cudaLaunchKernelEx(&cfg, k_cluster, R, out);
        if (e == cudaSuccess) e = cudaDeviceSynchronize();
        if (e != cudaSuccess) {
            printf("| %d | %d | %d | (%s) | - |\n", cs, fit, fit * cs, cudaGetErrorString(e));
            cudaGetLastError();
            continue;
        }
        unsigned long long h[2];
        CK(cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost));
        printf("| %d | %d | %d | %.3f | %.0f |\n", cs, fit, fit * cs, (double)h[0] / R / 1e3, (double)h[1] / R);
    }
    /* 5. staging after the dependency */
    printf("\n5. staging: a round = U weight loads a lane issued, the all-to-all dependency, x staged, the weights used (us a round)\n");
    printf("| U | next round's weights prefetched to L2 | none | 4 KiB through L2 | 4 KiB bulk | 12 KiB through L2 | 12 KiB bulk |\n| ---: | --- | ---: | ---: | ---: | ---: | ---: |\n");
    CK(cudaFuncSetAttribute((const void *)k_stage, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    float *xact;
    CK(cudaMalloc(&xact, 12288));
    CK(cudaMemset(xact, 0, 12288));
    for (int pf = 0; pf < 2; pf++)
    for (int U : {0, 4, 8, 12}) {
        if (pf && !U) continue;
        double us[5];
        const int xbs[5] = {128, 4096, 4096, 12288, 12288}, modes[5] = {2, 0, 1, 0, 1};
        for (int i = 0; i < 5; i++) {
            CK(cudaMemset(cnt, 0, 4));
            const int R = 1000;
            k_stage<<<g_sms, THREADS, SMEM>>>(buf, BUF, U, cnt, xact, xbs[i], modes[i], R, pf, out);
            CK(cudaDeviceSynchronize());
            unsigned long long h[1];
            CK(cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost));
            us[i] = (double)h[0] / R / 1e3;
        }
        printf("| %d | %s | %.2f | %.2f | %.2f | %.2f | %.2f |\n", U, pf ? "yes" : "no", us[0], us[1], us[2], us[3], us[4]);
    }
        chain_table(buf, BUF);
    after_wait_table(buf, BUF);
    return 0;
}
