/* sample.cu: choosing tokens on the device (cuda.h lm_cuda_sample): argmax, and temperature /
 * top-k / top-p sampling by radix selection over the logits' bits. */
#include <limits.h>

#include "backend/cuda/common.cuh"

namespace {

/* ---- choosing tokens ---- */

/* Greedy rows: grid (chunks, rows) of 256 threads; each block reduces its chunk to (max, lowest
 * id), the last block of a row to finish reduces the chunks' results. */
__global__ void __launch_bounds__(256) k_argmax(int32_t *ids, const float *logits, int ld, int V,
                                                int chunk, int nchunks,
                                                const lm_cuda_sampling *params, float2 *part,
                                                unsigned *count) {
    __shared__ float sv[8];
    __shared__ int si[8];
    const int r = blockIdx.y, b = blockIdx.x;
    pdl_trigger(); /* the next kernel may launch now; it waits for this one */
    pdl_wait();
    if (params && params[r].temperature > 0) return;
    const float *row = logits + (size_t)r * ld;
    const int lo = b * chunk, hi = min(V, lo + chunk);
    float bv = -INFINITY;
    int bi = INT_MAX;
#pragma unroll 8
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const float v = row[i];
        if (v > bv) bv = v, bi = i;
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (am_better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    if ((threadIdx.x & 31) == 0) sv[threadIdx.x >> 5] = bv, si[threadIdx.x >> 5] = bi;
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < 8; w++)
            if (am_better(sv[w], si[w], bv, bi)) bv = sv[w], bi = si[w];
    int win;
    if (am_block_final(bv, bi, part, count, r, b, nchunks, &win)) ids[r] = win;
}

constexpr int SMP_THREADS = 1024, SMP_WARPS = SMP_THREADS / 32;

/* Order-preserving map of a float's bits to an unsigned key (larger float, larger key). */
__device__ __forceinline__ uint32_t okey(float v) {
    const uint32_t u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_val(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

struct SmpShared {
    unsigned hcnt[256];
    double hmass[256]; /* float64: float32 bins put draws within rounding of a boundary too often */
    double dred[SMP_WARPS + 1];
    float fred[SMP_WARPS + 1];
    unsigned ured[SMP_WARPS + 1];
    int sel_b;
    double sel_d;
    unsigned sel_u;
};

/* Block-wide reduction of one value a thread: WARP reduces within each warp, then warp 0 reduces
 * the warps' results (padded with ident) through red[SMP_WARPS + 1]; every thread gets it. */
template <typename T, T (*WARP)(T)>
__device__ __forceinline__ T block_reduce(T v, T ident, T *red) {
    v = WARP(v);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        T x = lane < SMP_WARPS ? red[lane] : ident;
        x = WARP(x);
        if (lane == 0) red[SMP_WARPS] = x;
    }
    __syncthreads();
    const T r = red[SMP_WARPS];
    __syncthreads();
    return r;
}
__device__ double block_sum_d(double v, SmpShared &sh) { return block_reduce<double, warp_sum<double>>(v, 0.0, sh.dred); }
__device__ float block_max(float v, SmpShared &sh) { return block_reduce<float, warp_max>(v, -INFINITY, sh.fred); }

/* Exclusive prefix sum of one unsigned per thread (in thread order); *total gets the sum. */
__device__ unsigned block_scan_u(unsigned v, unsigned *total, SmpShared &sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned inc = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned n = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += n;
    }
    if (lane == 31) sh.ured[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        unsigned x = lane < SMP_WARPS ? sh.ured[lane] : 0u, xi = x;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const unsigned n = __shfl_up_sync(0xffffffffu, xi, o);
            if (lane >= o) xi += n;
        }
        if (lane < SMP_WARPS) sh.ured[lane] = xi - x; /* exclusive */
        if (lane == 31) sh.sel_u = xi;
    }
    __syncthreads();
    const unsigned r = sh.ured[warp] + inc - v;
    *total = sh.sel_u;
    __syncthreads();
    return r;
}

__device__ __forceinline__ bool smp_cand(float v, uint32_t lo_key) {
    return v == v && v > -INFINITY && okey(v) >= lo_key;
}

/* Radix selection by probability mass: over candidates (key >= lo_key), in descending key order,
 * the key where the cumulative mass first reaches target (>= target; > when strict). *above gets
 * the mass of the keys above it. */
__device__ void radix_mass(const float *row, int V, uint32_t lo_key, float mx, float inv_t,
                           double target, bool strict, uint32_t *out_key, double *out_above,
                           SmpShared &sh) {
    uint32_t prefix = 0, mask = 0;
    double above = 0.0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += SMP_THREADS) sh.hmass[i] = 0.0;
        __syncthreads();
        for (int i = threadIdx.x; i < V; i += SMP_THREADS) {
            const float v = row[i];
            if (!smp_cand(v, lo_key)) continue;
            const uint32_t k = okey(v);
            if ((k & mask) == prefix)
                atomicAdd(&sh.hmass[(k >> shift) & 255], (double)expf((v - mx) * inv_t));
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            double cum = above;
            int b = 255, last = -1;
            for (; b >= 0; b--) {
                const double h = sh.hmass[b];
                if (h <= 0.0) continue;
                last = b;
                if (strict ? cum + h > target : cum + h >= target) break;
                cum += h;
            }
            if (b < 0) { /* never reached (rounding): the lowest non-empty bin */
                b = last < 0 ? 0 : last;
                if (last >= 0) cum -= sh.hmass[last];
            }
            sh.sel_b = b;
            sh.sel_d = cum;
        }
        __syncthreads();
        prefix |= (uint32_t)sh.sel_b << shift;
        mask |= 255u << shift;
        above = sh.sel_d;
        __syncthreads();
    }
    *out_key = prefix;
    *out_above = above;
}

/* The j-th (0-based, in id order) candidate with exactly this key; *n_ties gets their number. */
__device__ int nth_with_key(const float *row, int V, uint32_t key, unsigned j, unsigned *n_ties,
                            SmpShared &sh) {
    const int span = (V + SMP_THREADS - 1) / SMP_THREADS;
    const int lo = threadIdx.x * span, hi = min(V, lo + span);
    unsigned cnt = 0;
    for (int i = lo; i < hi; i++) {
        const float v = row[i];
        cnt += v == v && okey(v) == key;
    }
    unsigned total;
    const unsigned before = block_scan_u(cnt, &total, sh);
    *n_ties = total;
    if (j >= total) j = total ? total - 1 : 0;
    if (threadIdx.x == 0) sh.sel_b = -1;
    __syncthreads();
    if (j >= before && j < before + cnt) {
        unsigned k = before;
        for (int i = lo; i < hi; i++) {
            const float v = row[i];
            if (v == v && okey(v) == key) {
                if (k == j) {
                    sh.sel_b = i;
                    break;
                }
                k++;
            }
        }
    }
    __syncthreads();
    const int r = sh.sel_b;
    __syncthreads();
    return r;
}

__device__ __forceinline__ uint64_t splitmix_fin(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Sampled rows: one block of 1024 threads per row (greedy rows return at once). */
__global__ void __launch_bounds__(SMP_THREADS) k_sample(int32_t *ids, const float *logits, int ld,
                                                        int V, const lm_cuda_sampling *params) {
    __shared__ SmpShared sh;
    const int r = blockIdx.x;
    pdl_trigger(); /* the next kernel may launch now; it waits for this one */
    pdl_wait();
    const lm_cuda_sampling p = params[r];
    if (!(p.temperature > 0)) return;
    const float *row = logits + (size_t)r * ld;
    const float inv_t = 1.0f / p.temperature;

    /* top_k: the key of the k-th largest logit (radix selection on counts). */
    uint32_t cut = 0;
    if (p.top_k > 0 && p.top_k < V) {
        uint32_t prefix = 0, mask = 0;
        unsigned kk = (unsigned)p.top_k;
        bool found = true;
        for (int shift = 24; shift >= 0 && found; shift -= 8) {
            for (int i = threadIdx.x; i < 256; i += SMP_THREADS) sh.hcnt[i] = 0;
            __syncthreads();
            for (int i = threadIdx.x; i < V; i += SMP_THREADS) {
                const float v = row[i];
                if (v != v) continue;
                const uint32_t k = okey(v);
                if ((k & mask) == prefix) atomicAdd(&sh.hcnt[(k >> shift) & 255], 1u);
            }
            __syncthreads();
            if (threadIdx.x == 0) {
                unsigned cum = 0;
                int b = 255;
                for (; b >= 0; b--) {
                    if (cum + sh.hcnt[b] >= kk) break;
                    cum += sh.hcnt[b];
                }
                sh.sel_b = b;
                sh.sel_u = b >= 0 ? kk - cum : 0;
            }
            __syncthreads();
            if (sh.sel_b < 0) {
                found = false; /* fewer than k values: every one is a candidate */
            } else {
                prefix |= (uint32_t)sh.sel_b << shift;
                mask |= 255u << shift;
                kk = sh.sel_u;
            }
            __syncthreads();
        }
        cut = found ? prefix : 0;
    }

    float mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += SMP_THREADS) {
        const float v = row[i];
        if (smp_cand(v, cut)) mx = fmaxf(mx, v);
    }
    mx = block_max(mx, sh);
    if (mx == -INFINITY) { /* nothing to draw from: argmax of an all -inf/NaN row is 0 */
        if (threadIdx.x == 0) ids[r] = 0;
        return;
    }
    double sum = 0.0;
    for (int i = threadIdx.x; i < V; i += SMP_THREADS) {
        const float v = row[i];
        if (smp_cand(v, cut)) sum += expf((v - mx) * inv_t);
    }
    sum = block_sum_d(sum, sh);

    /* top_p: the last kept key kap, the mass above it, and how many of its ties stay. */
    uint32_t kap = cut;
    double kept = sum;
    unsigned n_keep = UINT_MAX;
    if (p.top_p < 1.0f) {
        const double target = (p.top_p > 0 ? (double)p.top_p : 0.0) * sum;
        double above;
        radix_mass(row, V, cut, mx, inv_t, target, false, &kap, &above, sh);
        const double pk = expf((key_val(kap) - mx) * inv_t);
        double need = ceil((target - above) / pk);
        if (!(need >= 1)) need = 1;
        unsigned n_ties;
        nth_with_key(row, V, kap, 0, &n_ties, sh);
        n_keep = need >= (double)n_ties ? n_ties : (unsigned)need;
        kept = above + n_keep * pk;
    }

    /* The draw, in rank order (descending logit, ascending id). */
    const double u = (double)(splitmix_fin(p.seed + (p.counter + 1) * 0x9e3779b97f4a7c15ull) >> 11) *
                     0x1.0p-53;
    const double target = u * kept;
    uint32_t key;
    double above;
    radix_mass(row, V, kap, mx, inv_t, target, true, &key, &above, sh);
    const double pk = expf((key_val(key) - mx) * inv_t);
    double jd = floor((target - above) / pk);
    if (!(jd >= 0)) jd = 0;
    unsigned j = jd > 4e9 ? 4000000000u : (unsigned)jd;
    if (key == kap && n_keep != UINT_MAX && j >= n_keep) j = n_keep - 1;
    unsigned n_ties;
    const int id = nth_with_key(row, V, key, j, &n_ties, sh);
    if (threadIdx.x == 0) ids[r] = id < 0 ? 0 : id;
}

/* lm_cuda_ids_to_host: one block, strided over the ids, stores to page-locked host memory. */
__global__ void __launch_bounds__(1024) k_ids_to_host(int32_t *host, const int32_t *ids, int n) {
    pdl_trigger();
    pdl_wait();
    for (int i = threadIdx.x; i < n; i += blockDim.x) host[i] = ids[i];
    __threadfence_system(); /* the stores ordered before the grid's completion is signalled */
}

} // namespace

extern "C" lm_status lm_cuda_ids_to_host(struct lm_cuda_ctx *c, int32_t *host, const int32_t *ids, int n) {
    if (n < 1) return lm_errorf(LM_ERR_SHAPE, "CUDA ids to host: %d ids, at least 1 taken", n);
    const unsigned t = (unsigned)std::min(1024, (n + 31) / 32 * 32);
    LM_CU(lm_launch(c, dim3(1), dim3(t), 0, k_ids_to_host, host, ids, n));
    return LM_OK;
}

extern "C" double lm_cuda_uniform(uint64_t seed, uint64_t counter) {
    uint64_t z = seed + (counter + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

extern "C" lm_status lm_cuda_sample(struct lm_cuda_ctx *c, int32_t *ids, const float *logits, int ld,
                                    int n_rows, int vocab, const struct lm_cuda_sampling *params) {
    if (n_rows < 1) return LM_OK;
    if (n_rows > c->max_rows)
        return lm_errorf(LM_ERR_RANGE, "CUDA sample: %d rows exceed the context's max_rows %d", n_rows,
                         c->max_rows);
    int chunk = LM_CUDA_AM_CHUNK;
    if ((vocab + chunk - 1) / chunk > LM_CUDA_AM_MAX_CHUNKS) chunk = (vocab + LM_CUDA_AM_MAX_CHUNKS - 1) / LM_CUDA_AM_MAX_CHUNKS;
    const int nchunks = (vocab + chunk - 1) / chunk;
    LM_CU(lm_launch(c, dim3(nchunks, n_rows), dim3(256), 0, k_argmax, ids, logits, ld, vocab, chunk,
                    nchunks, params, c->am_part, c->am_count));
    if (params) LM_CU(lm_launch(c, dim3(n_rows), dim3(SMP_THREADS), 0, k_sample, ids, logits, ld, vocab, params));
    return LM_OK;
}

