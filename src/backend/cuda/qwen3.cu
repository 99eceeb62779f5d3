/* qwen3.cu: the Qwen3 model on a CUDA device; see qwen3.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/qwen3.h"
#include "base/env.h"

#define LM_TRY(call)                                                                              \
    do {                                                                                          \
        lm_status rc_ = (call);                                                                   \
        if (rc_) return rc_;                                                                      \
    } while (0)

namespace {

/* A weight matrix on the device: bf16 rows (cuBLAS, and the GEMV unless q is set), and for a
 * Q8_0 checkpoint also its quants and scales, which the batch-1..gemv_max_rows GEMV reads instead
 * (lm_cuda_gemv_q8: half the bytes; docs/perf-notes.md v11). */
struct dmat {
    uint16_t *bf;
    int8_t *q;   /* [rows, cols] int8, or NULL */
    uint16_t *s; /* [rows, cols / 32] float16 scales */
};

struct layer_dev {
    float *in_ln, *post_ln, *q_norm, *k_norm; /* float32 vectors */
    dmat wqkv;                                /* [Q + 2 KV, H] */
    dmat wo;                                  /* [H, Q] */
    dmat wgu;                                 /* [2 I, H], rows gate_0, up_0, gate_1, up_1, ... */
    dmat wd;                                  /* [H, I] */
};

/* Byte offsets of one call's inputs in the staging buffers: ids, pos, seq, out_tokens, block
 * tables (int32), the sampling rows (8-byte aligned), then a batched decode step's attention work
 * list (lm_cuda_attn.work: room for nt + wb items, wb >= 1 the most blocks a KV head it can have)
 * or a prefill step's tiles (lm_cuda_attn.tiles: two headers and at most nt + wb items, in room
 * for one item more). */
struct layout {
    size_t ids, pos, seq, run, feed, out, bt, samp, work, total;
};

layout make_layout(int nt, int no, int ns, int W, int wb) {
    layout L;
    L.ids = 0;
    L.pos = L.ids + 4 * (size_t)nt;
    L.seq = L.pos + 4 * (size_t)nt;
    L.run = L.seq + 4 * (size_t)nt; /* lm_cuda_attn.run_prev of a decode step */
    L.feed = L.run + 4 * (size_t)nt; /* lm_cuda_batch.feed, -1 where none */
    L.out = L.feed + 4 * (size_t)nt;
    L.bt = L.out + 4 * (size_t)no;
    L.samp = (L.bt + 4 * (size_t)ns * W + 15) / 16 * 16;
    L.work = L.samp + sizeof(lm_cuda_sampling) * (size_t)no;
    L.total = L.work + 4 * (LM_CUDA_WORK_HEAD + LM_CUDA_WORK_ITEM * ((size_t)nt + wb + 1));
    return L;
}

struct graph_slot {
    cudaGraphExec_t exec;
};

/* Split-KV decode: contexts up to split_min_ctx() positions run one block per (token, KV head);
 * longer ones, in class k (up to split_min_ctx() << k positions), split into at most SPLIT_MAX
 * pieces of at least split_min() positions (rounded up to a round of the decode kernel, 128
 * positions at head_dim 128) while the blocks fit one wave, so that batch-1 decode at 4,096
 * positions uses 128 blocks instead of 8 (docs/perf-notes.md v10). From 128 positions, not 512
 * (perf-notes v27): one block a KV head loads a round of 128 positions before its wait and each
 * further round after it, a dependent trip, so 129-512 positions ran 2-4 of them (tg512 at batch 1
 * 1,275 -> 1,486 tok/s). LM_CUDA_SPLIT_MIN_CTX and LM_CUDA_SPLIT_MIN move them, to compare. */
constexpr int SPLIT_MAX = 16;
static int split_min_ctx() {
    static const int n = (int)lm_env_int("LM_CUDA_SPLIT_MIN_CTX", 128, 16, 1 << 20);
    return n;
}
static int split_min() {
    static const int n = (int)lm_env_int("LM_CUDA_SPLIT_MIN", 64, 16, 1 << 20);
    return n;
}

} // namespace

struct lm_cuda_qwen3 {
    lm_cuda_qwen3_config cfg;
    lm_cuda_qwen3_params p;
    lm_cuda_ctx *ctx;
    int H, Q, KV, D, I, V, NL, QKV, W, MO;
    std::vector<void *> allocs;
    std::vector<layer_dev> layers;
    dmat embed, lm_head;
    uint8_t *screen;  /* the lm_head's 6-bit screen (lm_cuda_screen_build; NULL: none) */
    float *screen_ab; /* [V][2] its rows' (a_j, b_j) */
    long screened_steps; /* forward calls that chose from the screen (lm_cuda_qwen3_info) */
    bool q8_use; /* the GEMV reads a Q8_0 checkpoint's quants (lm_cuda_qwen3_set_q8; default true) */
    bool mlp_q8; /* some layer's gate/up or down_proj has Q8_0 quants */
    bool mlp1_fits; /* lm_cuda_mlp1_fits(hidden, intermediate) */
    bool mlp1_q8_fits; /* lm_cuda_mlp1_q8_fits(hidden, intermediate), and every layer's gate/up and
                          down_proj have Q8_0 quants */
    int64_t *fix_acc; /* [NL][LM_CUDA_MLP1_MAX_ROWS][H] the MLP kernel's fixed-point residual
                         terms (lm_cuda_mlp1, lm_cuda_mlp1_q8) */
    float *norm, *inv_freq;
    uint16_t *k_pool, *v_pool;
    size_t layer_elems; /* elements of one layer's K (or V) pool */
    size_t weight_bytes, step_bytes;
    /* activations */
    float *x, *qkv, *att, *gu, *h, *xo, *logits;
    uint16_t *xb, *attb, *hb;
    float *ssq; /* [rows][H / 64] the norm link's sums of squares (lm_cuda_norm_link), NULL (no link)
                 * when H is not a multiple of 256, which its consumers need */
    int32_t *ids_dev; /* [2][MO] the chosen ids: a call of parity p writes row p and feeds from
                         the other (lm_cuda_batch.feed), so that a step captured after its eager
                         run still reads the previous call's choices */
    int par;          /* the next call's parity: it alternates call by call */
    int prev_no;      /* outputs of the previous call (0: none; feeds refer to them) */
    /* steps queued (lm_cuda_batch.async) and not yet collected, oldest first: parity, outputs */
    int n_pend, pend_par[2], pend_no[2];
    cudaEvent_t done[2]; /* recorded after each parity's last step */
    /* split-KV decode attention (lm_cuda_attn.n_splits): scratch for MO tokens x SPLIT_MAX */
    float *split_part;
    unsigned *split_count;
    int n_classes; /* context classes of the decode graphs: <= split_min_ctx() positions, twice that, ... */
    int work_max;  /* the most blocks a KV head a work-list attention launch has (make_layout) */
    /* staging */
    char *in_dev, *in_host; /* [2][in_cap] each, a parity each (a queued step's copy may not
                               have run when the next call fills its inputs, nor the step read them) */
    char *in_cur;           /* in_dev's row of this call's step, or the last call's (the kernels' inputs) */
    cudaStream_t in_stream; /* the inputs' copies (in_copy; NULL: on the context's stream) */
    cudaEvent_t copied[2];  /* a parity's input copy done (done[par]: its last step done, so the
                               next copy may overwrite its inputs) */
    int32_t *ids_host;      /* [2][MO] */
    size_t in_cap;
    int gemv_plain;  /* a decode step without runs takes the GEMV up to this many tokens (forward) */
    bool tc_decode;  /* decode steps take the tensor-core GEMM from one token (tc_decode_rule) */
    bool tc_decode_off; /* lm_cuda_qwen3_set_tc_decode(false) */
    std::vector<graph_slot> graphs; /* [(((((class * (MO + 16) + bucket) * 2 + sampling) * 2 + work list) * 2 + GEMV)
                                       * 2 + screen) * 2 + parity] */
    cudaGraphExec_t last_exec; /* the graph the last decode step replayed (lm_cuda_qwen3_bench_step) */
    int last_rows;             /* its bucket */
    char device_name[128];
};

static lm_cuda_attn attn_shape(const lm_cuda_qwen3 *m);

static lm_status dev_alloc(lm_cuda_qwen3 *m, void **p, size_t bytes) {
    LM_TRY(lm_cuda_malloc(p, bytes));
    m->allocs.push_back(*p);
    return LM_OK;
}

template <typename T>
static lm_status dev_alloc_t(lm_cuda_qwen3 *m, T **p, size_t n) {
    void *q;
    LM_TRY(dev_alloc(m, &q, n * sizeof(T)));
    *p = (T *)q;
    return LM_OK;
}

/* Rows [row0, row0 + src.rows) of the bf16 matrix dst (stride `cols`, every `step`-th row from
 * row `row0` when interleaving) from a host matrix of any dtype. */
static void to_bf16_rows(uint16_t *dst, const lm_cuda_matrix &src, int row0, int step) {
    const size_t cols = (size_t)src.cols;
    for (int r = 0; r < src.rows; r++) {
        uint16_t *o = dst + (size_t)(row0 + (size_t)r * step) * cols;
        const char *in = (const char *)src.data + (size_t)r * lm_dtype_row_bytes(src.dtype, (long)cols);
        switch (src.dtype) {
        case LM_DTYPE_BF16: memcpy(o, in, cols * 2); break;
        case LM_DTYPE_F16:
            for (size_t c = 0; c < cols; c++) o[c] = lm_f32_to_bf16(lm_f16_to_f32(((const uint16_t *)in)[c]));
            break;
        case LM_DTYPE_F32:
            for (size_t c = 0; c < cols; c++) o[c] = lm_f32_to_bf16(((const float *)in)[c]);
            break;
        case LM_DTYPE_Q8_0: /* blocks of a float16 scale and 32 int8 (backend/cpu/quant.h) */
            for (size_t c = 0; c < cols; c += 32) {
                const unsigned char *blk = (const unsigned char *)in + c / 32 * 34;
                uint16_t dh;
                memcpy(&dh, blk, 2);
                const float d = lm_f16_to_f32(dh);
                for (int i = 0; i < 32; i++) o[c + i] = lm_f32_to_bf16(d * (float)(int8_t)blk[2 + i]);
            }
            break;
        default: /* packed CPU layouts: refused by upload_matrix */
            break;
        }
    }
}

/* Rows of the Q8_0 matrix src into quants q [*, cols] and scales s [*, cols / 32], at rows row0,
 * row0 + step, ... (the same row order as to_bf16_rows). */
static void to_q8_rows(int8_t *q, uint16_t *s, const lm_cuda_matrix &src, int row0, int step) {
    const size_t cols = (size_t)src.cols, nb = cols / 32;
    for (int r = 0; r < src.rows; r++) {
        const size_t o = (size_t)row0 + (size_t)r * step;
        const unsigned char *in = (const unsigned char *)src.data + (size_t)r * lm_dtype_row_bytes(src.dtype, (long)cols);
        for (size_t b = 0; b < nb; b++) {
            memcpy(s + o * nb + b, in + b * 34, 2);
            memcpy(q + o * cols + b * 32, in + b * 34 + 2, 32);
        }
    }
}

/* Uploads the matrices `parts` stacked (interleave = false) or row-interleaved (true): as bf16,
 * and when every part is Q8_0 (unless LM_CUDA_Q8=0: lm_cuda_q8_enabled), also as quants and
 * scales. */
static lm_status upload_matrix(lm_cuda_qwen3 *m, dmat *out, const lm_cuda_matrix *parts, int n,
                               bool interleave, const char *name) {
    const int cols = parts[0].cols;
    int rows = 0;
    for (int i = 0; i < n; i++) {
        if (parts[i].dtype != LM_DTYPE_F32 && parts[i].dtype != LM_DTYPE_F16 &&
            parts[i].dtype != LM_DTYPE_BF16 && parts[i].dtype != LM_DTYPE_Q8_0)
            return lm_errorf(LM_ERR_UNSUPPORTED, "CUDA qwen3: %s: a packed CPU weight layout; pass "
                             "row-major f32, f16, bf16 or q8_0", name);
        if (parts[i].dtype == LM_DTYPE_Q8_0 && parts[i].cols % 32)
            return lm_errorf(LM_ERR_SHAPE, "CUDA qwen3: %s: Q8_0 rows of %d weights (not whole blocks)",
                             name, parts[i].cols);
        if (parts[i].cols != cols || !parts[i].data || (interleave && parts[i].rows != parts[0].rows))
            return lm_errorf(LM_ERR_SHAPE, "CUDA qwen3: %s: parts of mismatched shapes", name);
        rows += parts[i].rows;
    }
    const size_t bytes = (size_t)rows * cols * 2;
    uint16_t *host = (uint16_t *)malloc(bytes);
    if (!host) return lm_errorf(LM_ERR_NOMEM, "CUDA qwen3: %s: out of host memory", name);
    int row0 = 0;
    for (int i = 0; i < n; i++) {
        to_bf16_rows(host, parts[i], interleave ? i : row0, interleave ? n : 1);
        row0 += parts[i].rows;
    }
    lm_status rc = dev_alloc_t(m, &out->bf, (size_t)rows * cols);
    if (!rc) rc = lm_cuda_upload(out->bf, host, bytes);
    free(host);
    if (!rc) m->weight_bytes += bytes;
    out->q = NULL, out->s = NULL;
    bool all_q8 = lm_cuda_q8_enabled();
    for (int i = 0; i < n; i++) all_q8 = all_q8 && parts[i].dtype == LM_DTYPE_Q8_0;
    if (rc || !all_q8) return rc;
    const size_t qb = (size_t)rows * cols, sb = (size_t)rows * (cols / 32) * 2;
    int8_t *hq = (int8_t *)malloc(qb);
    uint16_t *hs = (uint16_t *)malloc(sb);
    if (!hq || !hs) rc = lm_errorf(LM_ERR_NOMEM, "CUDA qwen3: %s: out of host memory", name);
    row0 = 0;
    for (int i = 0; i < n && !rc; i++) {
        to_q8_rows(hq, hs, parts[i], interleave ? i : row0, interleave ? n : 1);
        row0 += parts[i].rows;
    }
    if (!rc) rc = dev_alloc_t(m, &out->q, qb);
    if (!rc) rc = lm_cuda_upload(out->q, hq, qb);
    if (!rc) rc = dev_alloc_t(m, &out->s, sb / 2);
    if (!rc) rc = lm_cuda_upload(out->s, hs, sb);
    free(hq), free(hs);
    if (!rc) m->weight_bytes += qb + sb;
    return rc;
}

/* Bytes one batch-1 GEMV over W ([rows, cols]) reads. */
static size_t gemv_bytes(const dmat &w, size_t rows, size_t cols) {
    return w.q ? rows * cols + rows * (cols / 32) * 2 : rows * cols * 2;
}

static lm_status upload_vec(lm_cuda_qwen3 *m, float **out, const float *v, int n, const char *name) {
    if (!v) return lm_errorf(LM_ERR_MISSING, "CUDA qwen3: %s is missing", name);
    LM_TRY(dev_alloc_t(m, out, (size_t)n));
    return lm_cuda_upload(*out, v, sizeof(float) * (size_t)n);
}

extern "C" bool lm_cuda_q8_enabled(void) {
    static const bool on = lm_env_flag("LM_CUDA_Q8", true); /* read (and warned about) once */
    return on;
}

extern "C" struct lm_cuda_qwen3_params lm_cuda_qwen3_default_params(void) {
    lm_cuda_qwen3_params p;
    memset(&p, 0, sizeof p);
    p.device = 0;
    p.max_tokens = 2048;
    p.max_seqs = 256;
    p.max_context = 4096;
    p.block_size = 16;
    p.n_blocks = 0;
    p.kv_mib = 4096;
    p.graphs = true;
    p.pdl = true;
    /* v3: cuBLAS won at 8 rows, the GEMV at 1, 2 and (barely) 4. Since v20 the tensor-core GEMM beats
     * the GEMV at 3 and 4 rows, so plain decode steps leave the GEMV above 2 tokens (gemv_plain,
     * LM_CUDA_GEMV_PLAIN_ROWS); steps carrying speculative runs keep it up to 4, as a verified row
     * must get the bits of one token a step (test_cuda_engine's verify check). LM_CUDA_GEMV_MAX_ROWS
     * (0-8) sets the 4, for A/B measurements. Since v23 decode steps leave the GEMV altogether
     * where tc_decode_rule holds (bf16 Qwen3-0.6B); the rule above serves the rest. */
    static const int gemv_rows = (int)lm_env_int("LM_CUDA_GEMV_MAX_ROWS", 4, 0, 8);
    p.gemv_max_rows = gemv_rows;
    static const bool mlp1 = lm_env_flag("LM_CUDA_MLP1", true); /* read (and warned about) once */
    p.mlp1 = mlp1;
    static const bool norm_link = lm_env_flag("LM_CUDA_NORM_LINK", true);
    p.norm_link = norm_link;
    static const bool lm_screen = lm_env_flag("LM_CUDA_LM_SCREEN", true);
    p.lm_screen = lm_screen;
    return p;
}

/* LM_CUDA_GEMV_PLAIN_ROWS: -1 when unset (the rules below), else 0-8, read once. */
static int gemv_plain_env() {
    static const int plain = (int)lm_env_int("LM_CUDA_GEMV_PLAIN_ROWS", -1, -1, 8);
    return plain;
}

/* True when all four layer GEMMs of a step of n rows take the tensor-core kernel. */
static bool gemms_on_tc(const lm_cuda_qwen3 *m, int n) {
    lm_cuda_ctx *c = m->ctx;
    return m->I % 2 == 0 && lm_cuda_gemm_on_tc(c, n, m->H, m->QKV) && lm_cuda_gemm_on_tc(c, n, m->Q, m->H) &&
           lm_cuda_gemm_on_tc(c, n, m->H, 2 * m->I) && lm_cuda_gemm_on_tc(c, n, m->I, m->H);
}

/* Whether decode steps (plain, or carrying speculative runs) take the tensor-core GEMM with the
 * norm link from one token instead of the GEMV (perf-notes v23: tg128 1,355 -> 1,426 tok/s,
 * batch 2 2,537 -> 2,819): where the model's four layer GEMMs take the kernel at every step the
 * GEMV would otherwise serve (1 to LM_CUDA_DEC_RUN rows, runs included), the link is on, and the
 * GEMV would read bf16 rows (a Q8_0 checkpoint's quants halve the GEMV's bytes; it keeps the
 * GEMV). The kernel's rows do not depend on the step's other rows, so a run's rows get the same
 * layer outputs as one token a step. Off with LM_CUDA_GEMV_PLAIN_ROWS set (0-8: the old rule) or
 * lm_cuda_qwen3_set_tc_decode(false). */
static bool tc_decode_rule(const lm_cuda_qwen3 *m) {
    const bool gemv_q8 = m->q8_use && (m->layers[0].wqkv.q || m->mlp_q8);
    if (gemv_plain_env() >= 0 || m->tc_decode_off || !m->ssq || !m->p.norm_link || gemv_q8) return false;
    return gemms_on_tc(m, 1) && gemms_on_tc(m, std::min(LM_CUDA_DEC_RUN, m->MO));
}

/* Whether a step of `rows` rows runs its linear layers on the GEMV path (else the batched path):
 * a decode step where tc_decode holds and the kernel takes its rows, never (v23); otherwise up to
 * gemv_max_rows tokens when the step carries runs of one sequence's tokens (speculative
 * verification: each row must get the bits of one token a step, which the GEMV's rows give) or
 * is not a decode step, and a plain decode step only up to gemv_plain tokens (2), the tensor-core
 * GEMM being faster at 3 and 4 (perf-notes v20). */
static bool step_on_gemv(const lm_cuda_qwen3 *m, int rows, bool decode, bool runs) {
    if (decode && m->tc_decode && gemms_on_tc(m, rows)) return false;
    return rows <= (decode && !runs ? m->gemv_plain : m->p.gemv_max_rows);
}

static void drop_graphs(lm_cuda_qwen3 *m) {
    for (auto &g : m->graphs)
        if (g.exec) cudaGraphExecDestroy(g.exec), g.exec = NULL;
    m->last_exec = NULL;
    m->last_rows = 0;
}

extern "C" void lm_cuda_qwen3_destroy(struct lm_cuda_qwen3 *m) {
    if (!m) return;
    if (m->ctx) cudaStreamSynchronize(m->ctx->stream);
    drop_graphs(m);
    for (void *p : m->allocs) cudaFree(p);
    if (m->in_host) cudaFreeHost(m->in_host);
    if (m->ids_host) cudaFreeHost(m->ids_host);
    for (cudaEvent_t e : m->done)
        if (e) cudaEventDestroy(e);
    for (cudaEvent_t e : m->copied)
        if (e) cudaEventDestroy(e);
    if (m->in_stream) cudaStreamDestroy(m->in_stream);
    lm_cuda_ctx_destroy(m->ctx);
    delete m;
}

static lm_status check_matrix(const lm_cuda_matrix &x, int rows, int cols, const char *what, int l) {
    if (!x.data) return lm_errorf(LM_ERR_MISSING, "CUDA qwen3: layer %d %s is missing", l, what);
    if (x.rows != rows || x.cols != cols)
        return lm_errorf(LM_ERR_SHAPE, "CUDA qwen3: layer %d %s is [%d, %d], expected [%d, %d]", l, what,
                         x.rows, x.cols, rows, cols);
    return LM_OK;
}

static lm_status create(lm_cuda_qwen3 *m, const lm_cuda_qwen3_weights *w) {
    const lm_cuda_qwen3_config &c = w->cfg;
    lm_cuda_qwen3_params &p = m->p;
    m->cfg = c;
    m->H = c.hidden;
    m->D = c.head_dim;
    m->Q = c.n_heads * c.head_dim;
    m->KV = c.n_kv_heads * c.head_dim;
    m->I = c.intermediate;
    m->V = c.vocab;
    m->NL = c.n_layers;
    m->QKV = m->Q + 2 * m->KV;
    const int D = m->D;
    if (D != 16 && D != 32 && D != 64 && D != 128 && D != 256)
        return lm_errorf(LM_ERR_UNSUPPORTED, "CUDA qwen3: head_dim %d is not 16, 32, 64, 128 or 256", D);
    if (c.n_kv_heads < 1 || c.n_heads % c.n_kv_heads || c.n_heads / c.n_kv_heads > 8)
        return lm_errorf(LM_ERR_UNSUPPORTED, "CUDA qwen3: %d query heads over %d KV heads", c.n_heads,
                         c.n_kv_heads);
    if (m->H % 8 || m->Q % 8 || m->I % 8)
        return lm_errorf(LM_ERR_UNSUPPORTED,
                         "CUDA qwen3: hidden %d, q width %d and intermediate %d must be multiples of 8",
                         m->H, m->Q, m->I);
    if (p.max_tokens < 1 || p.max_seqs < 1 || p.max_context < 1 || p.block_size < 1)
        return lm_errorf(LM_ERR_INVALID, "CUDA qwen3: max_tokens, max_seqs, max_context and block_size "
                                         "must be positive");
    if (p.gemv_max_rows > 8) p.gemv_max_rows = 8;
    if (p.gemv_max_rows < 0) p.gemv_max_rows = 0;
    m->gemv_plain = std::min(gemv_plain_env() >= 0 ? gemv_plain_env() : 2, p.gemv_max_rows);
    m->W = (p.max_context + p.block_size - 1) / p.block_size;
    m->MO = p.max_seqs;

    lm_cuda_ctx_params cp = lm_cuda_ctx_default_params();
    cp.device = p.device;
    cp.pdl = p.pdl;
    cp.max_rows = m->MO > 8 ? m->MO : 8;
    LM_TRY(lm_cuda_ctx_create(&cp, &m->ctx));
    struct lm_cuda_device_info info;
    LM_TRY(lm_cuda_device_info(p.device, &info));
    snprintf(m->device_name, sizeof m->device_name, "%s", info.name);

    /* Weights. */
    /* Q8_0 checkpoints keep their quants for the GEMV (upload_matrix: whole blocks, and unless
     * LM_CUDA_Q8=0, which reads the bf16 copy instead, for A/B measurements). */
    m->q8_use = true;
    if (!w->embed_tokens.data || w->embed_tokens.rows != c.vocab || w->embed_tokens.cols != c.hidden)
        return lm_errorf(LM_ERR_SHAPE, "CUDA qwen3: embed_tokens must be [%d, %d]", c.vocab, c.hidden);
    LM_TRY(upload_matrix(m, &m->embed, &w->embed_tokens, 1, false, "embed_tokens"));
    if (!w->lm_head.data || w->lm_head.data == w->embed_tokens.data) {
        m->lm_head = m->embed;
    } else {
        if (w->lm_head.rows != c.vocab || w->lm_head.cols != c.hidden)
            return lm_errorf(LM_ERR_SHAPE, "CUDA qwen3: lm_head must be [%d, %d]", c.vocab, c.hidden);
        LM_TRY(upload_matrix(m, &m->lm_head, &w->lm_head, 1, false, "lm_head"));
    }
    LM_TRY(upload_vec(m, &m->norm, w->norm, m->H, "norm"));
    /* The lm_head's screen for greedy steps (params.lm_screen): over bf16 rows only (a Q8_0
     * checkpoint's lm_head GEMV already reads its quants). */
    if (p.lm_screen && m->lm_head.bf && !m->lm_head.q && lm_cuda_screen_fits(m->H)) {
        LM_TRY(dev_alloc_t(m, &m->screen, lm_cuda_screen_bytes(m->V, m->H)));
        LM_TRY(dev_alloc_t(m, &m->screen_ab, (size_t)m->V * 2));
        LM_TRY(lm_cuda_screen_build(m->ctx, m->lm_head.bf, m->V, m->H, m->screen, m->screen_ab));
    }
    m->layers.resize(m->NL);
    for (int l = 0; l < m->NL; l++) {
        const lm_cuda_qwen3_layer_weights &L = w->layers[l];
        layer_dev &d = m->layers[l];
        LM_TRY(check_matrix(L.q_proj, m->Q, m->H, "q_proj", l));
        LM_TRY(check_matrix(L.k_proj, m->KV, m->H, "k_proj", l));
        LM_TRY(check_matrix(L.v_proj, m->KV, m->H, "v_proj", l));
        LM_TRY(check_matrix(L.o_proj, m->H, m->Q, "o_proj", l));
        LM_TRY(check_matrix(L.gate_proj, m->I, m->H, "gate_proj", l));
        LM_TRY(check_matrix(L.up_proj, m->I, m->H, "up_proj", l));
        LM_TRY(check_matrix(L.down_proj, m->H, m->I, "down_proj", l));
        const lm_cuda_matrix qkv[3] = {L.q_proj, L.k_proj, L.v_proj};
        const lm_cuda_matrix gu[2] = {L.gate_proj, L.up_proj};
        LM_TRY(upload_matrix(m, &d.wqkv, qkv, 3, false, "q/k/v_proj"));
        LM_TRY(upload_matrix(m, &d.wo, &L.o_proj, 1, false, "o_proj"));
        LM_TRY(upload_matrix(m, &d.wgu, gu, 2, true, "gate/up_proj"));
        LM_TRY(upload_matrix(m, &d.wd, &L.down_proj, 1, false, "down_proj"));
        LM_TRY(upload_vec(m, &d.in_ln, L.input_layernorm, m->H, "input_layernorm"));
        LM_TRY(upload_vec(m, &d.post_ln, L.post_attention_layernorm, m->H, "post_attention_layernorm"));
        LM_TRY(upload_vec(m, &d.q_norm, L.q_norm, D, "q_norm"));
        LM_TRY(upload_vec(m, &d.k_norm, L.k_norm, D, "k_norm"));
    }
    m->step_bytes = gemv_bytes(m->lm_head, m->V, m->H) + 2 * (size_t)m->H;
    for (const layer_dev &d : m->layers)
        m->step_bytes += gemv_bytes(d.wqkv, m->QKV, m->H) + gemv_bytes(d.wo, m->H, m->Q) +
                         gemv_bytes(d.wgu, 2 * (size_t)m->I, m->H) + gemv_bytes(d.wd, m->H, m->I);
    /* RoPE inverse frequencies, float32 as transformers computes them (see model.c). */
    {
        std::vector<float> inv(D / 2);
        for (int i = 0; i < D / 2; i++) {
            const float e = (float)(2 * i) / (float)D;
            const float pw = (float)pow((double)(float)c.rope_theta, (double)e);
            inv[i] = 1.0f / pw;
        }
        LM_TRY(upload_vec(m, &m->inv_freq, inv.data(), D / 2, "inv_freq"));
    }

    /* KV pool: the caller's blocks plus one scratch block for padding rows. */
    const size_t per_block = (size_t)m->NL * 2 * c.n_kv_heads * p.block_size * D * 2;
    if (p.n_blocks <= 0) {
        const long n = (long)((size_t)(p.kv_mib > 0 ? p.kv_mib : 4096) * 1048576 / per_block);
        p.n_blocks = n < 1 ? 1 : (n > (1L << 30) ? (1 << 30) : (int)n);
    }
    m->layer_elems = (size_t)(p.n_blocks + 1) * c.n_kv_heads * p.block_size * D;
    if (m->layer_elems >= ((size_t)1 << 32))
        return lm_errorf(LM_ERR_RANGE, "CUDA qwen3: %d KV blocks are more than the attention kernel "
                         "addresses (2^32 elements a layer)", p.n_blocks);
    LM_TRY(dev_alloc_t(m, &m->k_pool, m->layer_elems * m->NL));
    LM_TRY(dev_alloc_t(m, &m->v_pool, m->layer_elems * m->NL));
    LM_TRY(lm_cuda_memset(m->k_pool, 0, m->layer_elems * m->NL * 2));
    LM_TRY(lm_cuda_memset(m->v_pool, 0, m->layer_elems * m->NL * 2));

    /* Activations for max_tokens rows (logits for max_seqs rows). */
    const size_t T = (size_t)p.max_tokens, MO = (size_t)m->MO, R = T > MO ? T : MO;
    LM_TRY(dev_alloc_t(m, &m->x, T * m->H));
    const size_t fix_elems = (size_t)m->NL * LM_CUDA_MLP1_MAX_ROWS * m->H;
    LM_TRY(dev_alloc_t(m, &m->fix_acc, fix_elems));
    LM_TRY(lm_cuda_memset(m->fix_acc, 0, sizeof(int64_t) * fix_elems));
    m->mlp1_fits = lm_cuda_mlp1_fits(m->ctx, m->H, m->I);
    m->mlp1_q8_fits = lm_cuda_mlp1_q8_fits(m->ctx, m->H, m->I);
    for (const layer_dev &d : m->layers) {
        m->mlp_q8 = m->mlp_q8 || d.wgu.q || d.wd.q;
        m->mlp1_q8_fits = m->mlp1_q8_fits && d.wgu.q && d.wd.q;
    }
    LM_TRY(dev_alloc_t(m, &m->xb, R * m->H));
    if (m->H % 256 == 0) LM_TRY(dev_alloc_t(m, &m->ssq, R * (m->H / 64)));
    m->tc_decode = tc_decode_rule(m);
    LM_TRY(dev_alloc_t(m, &m->qkv, T * m->QKV));
    LM_TRY(dev_alloc_t(m, &m->att, T * m->Q));
    LM_TRY(dev_alloc_t(m, &m->attb, T * m->Q));
    LM_TRY(dev_alloc_t(m, &m->gu, T * 2 * m->I));
    LM_TRY(dev_alloc_t(m, &m->h, T * m->I));
    LM_TRY(dev_alloc_t(m, &m->hb, T * m->I));
    LM_TRY(dev_alloc_t(m, &m->xo, MO * m->H));
    LM_TRY(dev_alloc_t(m, &m->logits, MO * m->V));
    LM_TRY(dev_alloc_t(m, &m->ids_dev, 2 * MO));
    for (cudaEvent_t &e : m->done) LM_CU(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));

    /* Staging: sized for the largest eager call and the largest graph bucket. */
    {
        /* P depends on which kernel a launch of n tokens runs (lm_cuda_attn_work_blocks): the most
         * over every n a step can have (once, at creation; the occupancies are cached). */
        const lm_cuda_attn shape = attn_shape(m);
        m->work_max = 1;
        for (int n = 1; n <= m->MO; n++)
            m->work_max = std::max(m->work_max, lm_cuda_attn_work_blocks(m->ctx, &shape, n));
    }
    const layout a = make_layout(p.max_tokens, m->MO, m->MO, m->W, m->work_max);
    const layout b = make_layout(m->MO, m->MO, m->MO, m->W, m->work_max);
    m->in_cap = a.total > b.total ? a.total : b.total;
    LM_TRY(dev_alloc(m, (void **)&m->in_dev, 2 * m->in_cap));
    m->in_cur = m->in_dev;
    /* LM_CUDA_IN_STREAM=0: the inputs copied on the context's stream, in the graph (before v35) */
    static const bool in_stream = lm_env_flag("LM_CUDA_IN_STREAM", true);
    if (in_stream) {
        LM_CU(cudaStreamCreateWithFlags(&m->in_stream, cudaStreamNonBlocking));
        for (cudaEvent_t &e : m->copied) LM_CU(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    LM_CU(cudaMallocHost((void **)&m->in_host, 2 * m->in_cap));
    LM_CU(cudaMallocHost((void **)&m->ids_host, sizeof(int32_t) * 2 * MO));
    const int G = m->cfg.n_heads / m->cfg.n_kv_heads;
    LM_TRY(dev_alloc_t(m, &m->split_part, MO * m->cfg.n_kv_heads * SPLIT_MAX * G * (m->D + 2)));
    LM_TRY(dev_alloc_t(m, &m->split_count, MO * m->cfg.n_kv_heads));
    LM_TRY(lm_cuda_memset(m->split_count, 0, sizeof(unsigned) * MO * m->cfg.n_kv_heads));
    m->n_classes = 1;
    /* LM_CUDA_SPLIT_KV=0 (or off) in the environment turns split-KV decode off (for A/B
     * measurements; base/env.h spellings). */
    static const bool split_kv = lm_env_flag("LM_CUDA_SPLIT_KV", true);
    if (split_kv)
        while ((split_min_ctx() << (m->n_classes - 1)) < p.max_context) m->n_classes++;
    m->graphs.assign((size_t)(m->MO + 16) * 32 * m->n_classes, graph_slot{NULL});
    return lm_cuda_ctx_sync(m->ctx);
}

static int gemm_bucket();
static int gemm_rows(int n, int cap);

/* The batched path's layer GEMM `which` (LG_QKV; LG_O, o_proj + residual; LG_GU, gate/up without
 * SwiGLU; LG_DOWN, down_proj + residual) of layer w over n rows, on the buffers a step uses: the
 * one place that names them for the forward pass, the warm-up and the benchmark. */
enum { LG_QKV, LG_O, LG_GU, LG_DOWN };
static lm_status layer_gemm(lm_cuda_qwen3 *m, const layer_dev &w, int which, int n) {
    lm_cuda_ctx *c = m->ctx;
    switch (which) {
    case LG_QKV: return lm_cuda_gemm(c, m->qkv, m->xb, w.wqkv.bf, n, m->H, m->QKV, false);
    case LG_O: return lm_cuda_gemm(c, m->x, m->attb, w.wo.bf, n, m->Q, m->H, true);
    case LG_GU: return lm_cuda_gemm(c, m->gu, m->xb, w.wgu.bf, n, m->H, 2 * m->I, false);
    default: return lm_cuda_gemm(c, m->x, m->hb, w.wd.bf, n, m->I, m->H, true);
    }
}

/* cuBLAS chooses a kernel for each GEMM shape when it first sees it, and may load the kernel then
 * (milliseconds a shape: serving's first prefill step of each row bucket took 13-21 ms instead of
 * 5-10, perf-notes v19). Runs every shape an eager step can reach once now: the four layer GEMMs
 * (layer 0's weights) and the lm_head at each bucketed row count above the GEMV's. The inputs
 * are whatever the buffers hold and the outputs are scratch (the next step writes its rows). */
static lm_status warm_gemms(lm_cuda_qwen3 *m) {
    lm_cuda_ctx *c = m->ctx;
    const int T = m->p.max_tokens, H = m->H;
    const layer_dev &w = m->layers[0];
    if (gemm_bucket() <= 1 || !w.wqkv.bf || !m->lm_head.bf || T <= m->p.gemv_max_rows) return LM_OK;
    int head_rows = 0; /* the lm_head's last warmed row count (its rows stop at MO) */
    for (int r = gemm_rows(m->p.gemv_max_rows + 1, T);; r = gemm_rows(r + 1, T)) {
        for (int g = LG_QKV; g <= LG_DOWN; g++) LM_TRY(layer_gemm(m, w, g, r));
        const int hr = gemm_rows(r, m->MO);
        if (hr > head_rows) LM_TRY(lm_cuda_gemm(c, m->logits, m->xb, m->lm_head.bf, hr, H, m->V, false));
        head_rows = std::max(head_rows, hr);
        if (r >= T) break;
    }
    return lm_cuda_ctx_sync(c);
}

extern "C" lm_status lm_cuda_qwen3_create(const struct lm_cuda_qwen3_weights *w,
                                          const struct lm_cuda_qwen3_params *params,
                                          struct lm_cuda_qwen3 **out) {
    *out = NULL;
    lm_cuda_qwen3 *m = new lm_cuda_qwen3();
    m->p = params ? *params : lm_cuda_qwen3_default_params();
    lm_status rc = create(m, w);
    if (!rc) rc = warm_gemms(m);
    if (rc) {
        lm_cuda_qwen3_destroy(m);
        return rc;
    }
    *out = m;
    return LM_OK;
}

/* lm_cuda_qwen3_info.mlp1_min_rows. Over Q8_0 quants the MLP kernel runs from 2 tokens a step:
 * at 1 the two launches measured faster (docs/perf-notes.md v15), and their down_proj
 * (LM_CUDA_EPI_ADD_FIX) sums as the kernel does, so a row's bits do not depend on the step's size. */
static int mlp1_min_rows(const lm_cuda_qwen3 *m) {
    int r = 0;
    if (m->p.mlp1) r = m->q8_use && m->mlp_q8 ? (m->mlp1_q8_fits ? 2 : 0) : (m->mlp1_fits ? 1 : 0);
    return r <= m->p.gemv_max_rows ? r : 0;
}

extern "C" void lm_cuda_qwen3_info(const struct lm_cuda_qwen3 *m, struct lm_cuda_qwen3_info *out) {
    memset(out, 0, sizeof *out);
    out->cfg = m->cfg;
    snprintf(out->device, sizeof out->device, "%s", m->device_name);
    out->n_blocks = m->p.n_blocks;
    out->block_size = m->p.block_size;
    out->bt_width = m->W;
    out->max_tokens = m->p.max_tokens;
    out->max_seqs = m->p.max_seqs;
    out->weight_bytes = m->weight_bytes;
    out->step_bytes = m->step_bytes;
    out->kv_bytes_per_block = (size_t)m->NL * 2 * m->cfg.n_kv_heads * m->p.block_size * m->D * 2;
    out->mlp1_min_rows = mlp1_min_rows(m);
    out->tc_decode = m->tc_decode;
    out->lm_screen = m->p.lm_screen && m->screen;
    out->screened_steps = m->screened_steps;
    const size_t VH = (size_t)m->V * m->H;
    out->screen_step_bytes = out->lm_screen ? m->step_bytes - 2 * VH + lm_cuda_screen_bytes(m->V, m->H) + (size_t)m->V * 8 : 0;
}

extern "C" void lm_cuda_qwen3_set_options(struct lm_cuda_qwen3 *m, bool graphs, bool pdl,
                                          int gemv_max_rows) {
    cudaStreamSynchronize(m->ctx->stream);
    drop_graphs(m);
    m->p.graphs = graphs;
    m->p.pdl = pdl;
    m->ctx->pdl = pdl;
    m->p.gemv_max_rows = gemv_max_rows < 0 ? 0 : gemv_max_rows > 8 ? 8 : gemv_max_rows;
    m->gemv_plain = m->p.gemv_max_rows; /* an explicit setting holds for every step */
}

extern "C" void lm_cuda_qwen3_set_tc_decode(struct lm_cuda_qwen3 *m, bool on) {
    cudaStreamSynchronize(m->ctx->stream);
    drop_graphs(m);
    m->tc_decode_off = !on;
    m->tc_decode = tc_decode_rule(m);
}

extern "C" void lm_cuda_qwen3_drop_graphs(struct lm_cuda_qwen3 *m) {
    cudaStreamSynchronize(m->ctx->stream);
    drop_graphs(m);
}

extern "C" void lm_cuda_qwen3_set_mlp1(struct lm_cuda_qwen3 *m, bool on) {
    cudaStreamSynchronize(m->ctx->stream);
    drop_graphs(m);
    m->p.mlp1 = on;
}

extern "C" void lm_cuda_qwen3_set_norm_link(struct lm_cuda_qwen3 *m, bool on) {
    cudaStreamSynchronize(m->ctx->stream);
    drop_graphs(m);
    m->p.norm_link = on;
    m->tc_decode = tc_decode_rule(m);
}

extern "C" void lm_cuda_qwen3_set_lm_screen(struct lm_cuda_qwen3 *m, bool on) {
    cudaStreamSynchronize(m->ctx->stream);
    drop_graphs(m);
    m->p.lm_screen = on;
}

extern "C" void lm_cuda_qwen3_set_q8(struct lm_cuda_qwen3 *m, bool on) {
    cudaStreamSynchronize(m->ctx->stream);
    drop_graphs(m);
    m->q8_use = on;
    m->tc_decode = tc_decode_rule(m);
}

/* ---- the forward pass ---- */

/* lm_cuda_gemv over W's Q8_0 quants when it has them, else over its bf16 rows. */
static lm_status gemv_any(const lm_cuda_qwen3 *m, lm_cuda_ctx *c, float *y, int ldy, const float *x, int ldx,
                          const dmat &w, int n, int k, int rows, const float *nw, float eps,
                          lm_cuda_epilogue epi, const lm_cuda_fix_io *fix = NULL) {
    return w.q && m->q8_use ? lm_cuda_gemv_q8(c, y, ldy, x, ldx, w.q, w.s, n, k, rows, nw, eps, epi, fix)
               : lm_cuda_gemv(c, y, ldy, x, ldx, w.bf, n, k, rows, nw, eps, epi, fix);
}

/* The model's attention shape (heads, head_dim, block size); everything else zero. */
static lm_cuda_attn attn_shape(const lm_cuda_qwen3 *m) {
    lm_cuda_attn a;
    memset(&a, 0, sizeof a);
    a.n_heads = m->cfg.n_heads;
    a.n_kv_heads = m->cfg.n_kv_heads;
    a.head_dim = m->D;
    a.block_size = m->p.block_size;
    return a;
}

/* The fewest positions a piece of a batched decode step's work list has (lm_cuda_attn_plan_work);
 * LM_CUDA_SPLIT_BATCH=N sets it, 0 turning the work list off (one block a token and KV head),
 * for A/B measurements. */
static int split_batch_len() {
    static const int n = (int)lm_env_int("LM_CUDA_SPLIT_BATCH", 256, 0, 1 << 20);
    return n;
}

/* The fewest tokens a prefill tile runs on the tensor-core attention with (lm_cuda_attn_plan_tiles;
 * fewer go to k_attention, a block a token: a tile's 64 query rows cost the same however few
 * are real). LM_CUDA_FLASH_MIN=N sets it, 0 turning the tiles off, for A/B measurements. */
static int flash_min_tokens() {
    static const int n = (int)lm_env_int("LM_CUDA_FLASH_MIN", 4, 0, 64);
    return n;
}

/* Rows a cuBLAS GEMM of an eager (non-graph) step runs for n rows: n rounded up to a multiple of
 * LM_CUDA_GEMM_BUCKET (default 64; 0 or 1: n itself), at most cap (the buffers' rows). cuBLAS
 * picks its kernel per shape and a shape it has not seen costs a heuristic query: serving's
 * prefill steps have a new token count almost every step, and 112 such queries a step cost
 * milliseconds (perf-notes v19). The extra rows read stale activations and write rows nothing
 * reads (each output row depends on its input row only). */
static int gemm_bucket() {
    static const int b = (int)lm_env_int("LM_CUDA_GEMM_BUCKET", 64, 0, 4096);
    return b;
}

static int gemm_rows(int n, int cap) {
    const int b = gemm_bucket();
    if (b <= 1) return n;
    return std::min(cap, (n + b - 1) / b * b);
}

/* True when a decode step of n tokens runs its attention from a work list: the batched kernel
 * (the decode kernel does not fit n), on unless LM_CUDA_SPLIT_BATCH=0. */
static bool work_list(const lm_cuda_qwen3 *m, bool decode, int n) {
    if (!decode || split_batch_len() <= 0) return false;
    const lm_cuda_attn shape = attn_shape(m);
    return !lm_cuda_attn_dec_fits(m->ctx, &shape, n);
}

/* The lists a step's attention reads from its inputs' work area (layout::work): a batched decode
 * step's work list (lm_cuda_attn_plan_work), or a prefill step's tiles (lm_cuda_attn_plan_tiles). */
struct attn_lists {
    bool work = false;
    int n_tiles = 0, n_rest = 0; /* tiles: n_tiles + n_rest > 0 */
    bool tiles() const { return n_tiles + n_rest > 0; }
};

/* The attention arguments of a step whose inputs sit in in_cur at layout L (per layer, the
 * caller sets q_norm, k_norm and the pools). */
static lm_cuda_attn make_attn(const lm_cuda_qwen3 *m, const layout &L, bool out_f32, int cls, int n,
                              bool decode, const attn_lists &lists) {
    lm_cuda_attn a = attn_shape(m);
    a.qkv = m->qkv;
    a.ld_qkv = m->QKV;
    a.inv_freq = m->inv_freq;
    a.eps = m->cfg.rms_norm_eps;
    a.scale = 1.0f / sqrtf((float)m->D);
    a.block_tables = (const int32_t *)(m->in_cur + L.bt);
    a.bt_width = m->W;
    a.seq = (const int32_t *)(m->in_cur + L.seq);
    a.pos = (const int32_t *)(m->in_cur + L.pos);
    a.out = out_f32 ? (void *)m->att : (void *)m->attb;
    a.out_bf16 = !out_f32;
    /* Contexts of up to split_min_ctx() << cls positions, n tokens: at most one wave of the decode
     * kernel's blocks (one a multiprocessor): each extra wave would repeat the blocks' fixed
     * latency (v10: 16 splits at 16 sequences were 16-24% slower than none). */
    const int waves = m->ctx->sm_count / std::max(1, n * m->cfg.n_kv_heads);
    const int cap = split_min_ctx() << cls;
    const bool dec = decode && lm_cuda_attn_dec_fits(m->ctx, &a, n);
    if (cls > 0 && dec && waves > 1) {
        a.n_splits = std::max(1, std::min({SPLIT_MAX, cap / split_min(), waves})); /* 1: unsplit */
        a.split_len = (cap + a.n_splits - 1) / a.n_splits;
    } else if (lists.work) {
        /* Batched decode: the work list the host planned for this step (lm_cuda_attn_plan_work). */
        a.n_splits = SPLIT_MAX;
        a.work = (const int32_t *)(m->in_cur + L.work);
        a.work_blocks = lm_cuda_attn_work_blocks(m->ctx, &a, n);
    } else if (lists.tiles()) {
        /* Prefill: the tiles, and the other tokens' pieces merging through the scratch (rows:
         * their index among them, < MO). */
        a.n_splits = SPLIT_MAX;
        a.tiles = (const int32_t *)(m->in_cur + L.work);
        a.n_tiles = lists.n_tiles;
        a.n_rest = lists.n_rest;
    }
    if (a.n_splits > 1) {
        a.split_part = m->split_part;
        a.split_count = m->split_count;
    }
    /* A decode step on the decode kernel takes runs of a sequence's tokens (verification of
     * speculative drafts); the host fills L.run (zeros for a plain decode step). */
    if (dec) a.run_prev = (const int32_t *)(m->in_cur + L.run);
    return a;
}

/* The context class of a decode step whose longest context is max_len positions. */
static int ctx_class(const lm_cuda_qwen3 *m, int max_len) {
    int k = 0;
    while (k + 1 < m->n_classes && (split_min_ctx() << k) < max_len) k++;
    return k;
}

static void set_layer(const lm_cuda_qwen3 *m, lm_cuda_attn *a, int l) {
    a->q_norm = m->layers[l].q_norm;
    a->k_norm = m->layers[l].k_norm;
    a->k_cache = m->k_pool + (size_t)l * m->layer_elems;
    a->v_cache = m->v_pool + (size_t)l * m->layer_elems;
}

/* The step's inputs (bytes of h, in_host's row par) into in_cur (in_dev's row par). On in_stream
 * (default), after the last step of the same parity is done (done[par]), and the context's stream
 * waits for the copy: a queued step's copy runs while the step before it does, off the GPU's path
 * (a copy node at a graph's start: 2.4 us a graph in scripts/copy-node-bench.cu, 1.3 us a token
 * at batch 1 on the H200, perf-notes v35). Else on the context's stream (inside a capture: the
 * graph's first node). */
static lm_status in_copy(lm_cuda_qwen3 *m, const char *h, size_t bytes, int par) {
    cudaStream_t s = m->ctx->stream;
    if (!m->in_stream) {
        const cudaError_t e = cudaMemcpyAsync(m->in_cur, h, bytes, cudaMemcpyHostToDevice, s);
        return e == cudaSuccess ? LM_OK : lm_cuda_fail(e, "input copy");
    }
    LM_CU(cudaStreamWaitEvent(m->in_stream, m->done[par], 0));
    LM_CU(cudaMemcpyAsync(m->in_cur, h, bytes, cudaMemcpyHostToDevice, m->in_stream));
    LM_CU(cudaEventRecord(m->copied[par], m->in_stream));
    LM_CU(cudaStreamWaitEvent(s, m->copied[par], 0));
    return LM_OK;
}

/* The step's n chosen ids (ids_dev's row par) into ids_host: by lm_cuda_ids_to_host's kernel
 * (default), or by a copy (LM_CUDA_IDS_KERNEL=0, as before v35: the copy node at a graph's end
 * cost ~9 us a token at batch 1 on the H200, perf-notes v35). */
static lm_status ids_to_host(const lm_cuda_qwen3 *m, int32_t *ids_host, int par, int n) {
    static const bool kernel = lm_env_flag("LM_CUDA_IDS_KERNEL", true);
    const int32_t *src = m->ids_dev + (size_t)par * m->MO;
    if (kernel) return lm_cuda_ids_to_host(m->ctx, ids_host, src, n);
    const cudaError_t e = cudaMemcpyAsync(ids_host, src, sizeof(int32_t) * n, cudaMemcpyDeviceToHost, m->ctx->stream);
    return e == cudaSuccess ? LM_OK : lm_cuda_fail(e, "output copy");
}

/* Queues the whole step for nt tokens whose inputs sit in in_cur at layout L. */
static lm_status run_forward(lm_cuda_qwen3 *m, int nt, int no, const layout &L, bool decode,
                             bool out_identity, bool sampling, int cls, const attn_lists &lists, bool gemv,
                             bool screen) {
    lm_cuda_ctx *c = m->ctx;
    const int H = m->H, Q = m->Q, I = m->I, V = m->V, QKV = m->QKV;
    const float eps = m->cfg.rms_norm_eps;
    const int32_t *ids = (const int32_t *)(m->in_cur + L.ids);
    const int32_t *out_rows = (const int32_t *)(m->in_cur + L.out);
    const lm_cuda_sampling *samp = sampling ? (const lm_cuda_sampling *)(m->in_cur + L.samp) : NULL;

    /* The first kernel follows a copy or the last step, not a kernel of this one: launch it plainly. */
    const bool pdl = c->pdl;
    c->pdl = false;
    const int32_t *feed = (const int32_t *)(m->in_cur + L.feed), *prev = m->ids_dev + (size_t)(1 - m->par) * m->MO;
    int32_t *ids_out = m->ids_dev + (size_t)m->par * m->MO;
    lm_status rc = m->embed.q && m->q8_use ? lm_cuda_embed_q8(c, m->x, m->embed.q, m->embed.s, ids, feed, prev, nt, H)
                              : lm_cuda_embed(c, m->x, m->embed.bf, ids, feed, prev, nt, H);
    c->pdl = pdl;
    if (rc) return rc;

    /* On the GEMV path, each layer's MLP is one kernel (lm_cuda_mlp1 or lm_cuda_mlp1_q8; over Q8_0
     * quants from 2 tokens: mlp1_min_rows), which leaves layer l's
     * down_proj output in fix_acc[l] for the next kernels to fold in: the next q/k/v (which also
     * clears fix_acc[l + 1]) and o_proj (which writes the sums back to x), or the gather and the
     * lm_head: every step on this path folds them the same way, so a row's bits do not depend on
     * what else the step carries. */
    const bool mlp_q8 = m->q8_use && m->mlp_q8; /* the MLP GEMVs read Q8_0 quants */
    const int mlp1_from = mlp1_min_rows(m);
    const bool mlp1 = gemv && mlp1_from && nt >= mlp1_from;
    auto acc_of = [&](int l) { return m->fix_acc + (size_t)l * LM_CUDA_MLP1_MAX_ROWS * H; };
    lm_cuda_attn a = make_attn(m, L, gemv, decode ? cls : 0, nt, decode, lists);
    /* The batched path's GEMM rows: a decode step's are its own (a graph's bucket, or nt with
     * graphs off); a step with prefill chunks rounds them up for cuBLAS (gemm_rows) unless the
     * tensor-core kernel takes all four layer GEMMs: it has no per-shape choice to amortise, and
     * rows past nt would only cost it copies and products. */
    const bool tc4 = gemms_on_tc(m, nt);
    const int gm = decode || tc4 ? nt : gemm_rows(nt, m->p.max_tokens);
    /* The batched path's norms carried by the GEMMs around them (lm_cuda_norm_link, perf-notes
     * v23) where all four layer GEMMs take the tensor-core kernel (so over the step's own rows): o_proj
     * and down_proj write the next norm's input and sums of squares, gate/up and the next q/k/v
     * scale by it; layer 0's q/k/v (after the embedding) and the final norm keep the norm kernel. */
    const bool link = !gemv && m->ssq && m->p.norm_link && tc4;
    const lm_cuda_norm_link consume = {m->ssq, eps, NULL, NULL, NULL};
    for (int l = 0; l < m->NL; l++) {
        const layer_dev &w = m->layers[l];
        set_layer(m, &a, l);
        /* q/k/v folds in layer l - 1's sums and clears layer l's accumulator; o_proj folds them too */
        const lm_cuda_fix_io fq = {l ? acc_of(l - 1) : NULL, acc_of(l), nt * H}, fo = {fq.add, NULL, 0};
        if (gemv) {
            LM_TRY(gemv_any(m, c, m->qkv, QKV, m->x, H, w.wqkv, nt, H, QKV, w.in_ln, eps, LM_CUDA_EPI_STORE,
                            mlp1 ? &fq : NULL));
        } else if (link && l) {
            LM_TRY(lm_cuda_gemm_linked(c, m->qkv, m->xb, w.wqkv.bf, nt, H, QKV, false, &consume));
        } else {
            LM_TRY(lm_cuda_rmsnorm_bf16(c, m->xb, m->x, w.in_ln, NULL, nt, H, eps));
            LM_TRY(layer_gemm(m, w, LG_QKV, gm));
        }
        if (decode) {
            LM_TRY(lm_cuda_attention(c, &a, nt, true));
        } else {
            LM_TRY(lm_cuda_qk_norm_rope_store(c, &a, nt));
            LM_TRY(lm_cuda_attention(c, &a, nt, false));
        }
        if (gemv)
            LM_TRY(gemv_any(m, c, m->x, H, m->att, Q, w.wo, nt, Q, H, NULL, 0, LM_CUDA_EPI_ADD,
                            mlp1 && l ? &fo : NULL));
        if (mlp1) {
            LM_TRY(mlp_q8 ? lm_cuda_mlp1_q8(c, acc_of(l), m->x, nt, w.wgu.q, w.wgu.s, w.wd.q, w.wd.s, H, I,
                                            w.post_ln, eps)
                          : lm_cuda_mlp1(c, acc_of(l), m->x, nt, w.wgu.bf, w.wd.bf, H, I, w.post_ln, eps));
        } else if (gemv) {
            LM_TRY(gemv_any(m, c, m->h, I, m->x, H, w.wgu, nt, H, 2 * I, w.post_ln, eps, LM_CUDA_EPI_SWIGLU));
            /* a step below mlp1_from whose larger steps run the kernel: sum down_proj as it does */
            LM_TRY(gemv_any(m, c, m->x, H, m->h, I, w.wd, nt, I, H, NULL, 0,
                            mlp1_from > 1 ? LM_CUDA_EPI_ADD_FIX : LM_CUDA_EPI_ADD));
        } else if (link) {
            const lm_cuda_norm_link post = {NULL, 0.f, w.post_ln, m->xb, m->ssq};
            const lm_cuda_norm_link next = {NULL, 0.f, l + 1 < m->NL ? m->layers[l + 1].in_ln : NULL, m->xb, m->ssq};
            LM_TRY(lm_cuda_gemm_linked(c, m->x, m->attb, w.wo.bf, nt, Q, H, true, &post));
            LM_TRY(lm_cuda_gemm_swiglu_linked(c, m->hb, m->xb, w.wgu.bf, nt, H, I, &consume));
            LM_TRY(lm_cuda_gemm_linked(c, m->x, m->hb, w.wd.bf, nt, I, H, true, &next));
        } else {
            LM_TRY(layer_gemm(m, w, LG_O, gm));
            LM_TRY(lm_cuda_rmsnorm_bf16(c, m->xb, m->x, w.post_ln, NULL, nt, H, eps));
            LM_TRY(lm_cuda_gemm_swiglu(c, m->hb, m->gu, m->xb, w.wgu.bf, nt, gm, H, I));
            LM_TRY(layer_gemm(m, w, LG_DOWN, gm));
        }
    }
    const float *src = m->x;
    if (!out_identity) {
        LM_TRY(lm_cuda_gather_rows(c, m->xo, m->x, out_rows, no, H, mlp1 ? acc_of(m->NL - 1) : NULL));
        src = m->xo;
    }
    if (no <= m->p.gemv_max_rows) {
        const bool pending = mlp1 && out_identity; /* else the gather folded them */
        /* A greedy step whose logits nobody reads: the screen's exact choice (lm_cuda_gemv_screen;
         * lm_cuda_qwen3_forward decided it) */
        if (screen) {
            const int64_t *xf = pending ? acc_of(m->NL - 1) : NULL;
            return lm_cuda_screen_pick(c, ids_out, m->logits, V, src, H, xf, m->screen, m->screen_ab, m->lm_head.bf,
                                       no, H, V, m->norm, eps, NULL);
        }
        const lm_cuda_fix_io ff = {pending ? acc_of(m->NL - 1) : NULL, NULL, 0};
        LM_TRY(gemv_any(m, c, m->logits, V, src, H, m->lm_head, no, H, V, m->norm, eps, LM_CUDA_EPI_STORE,
                        pending ? &ff : NULL));
    } else {
        LM_TRY(lm_cuda_rmsnorm_bf16(c, m->xb, src, m->norm, NULL, no, H, eps));
        LM_TRY(lm_cuda_gemm(c, m->logits, m->xb, m->lm_head.bf, decode ? no : gemm_rows(no, m->MO), H, V, false));
    }
    return lm_cuda_sample(c, ids_out, m->logits, V, no, V, samp);
}

static int bucket_of(const lm_cuda_qwen3 *m, int n) {
    if (n <= 8) return n;
    int b = (n + 15) / 16 * 16;
    return b > m->MO ? m->MO : b;
}

/* A step that failed after its input copy was queued: both streams drained (errors ignored: rc
 * is the one reported), so that the next call of this parity neither rewrites the inputs nor
 * copies over them while the failed step's work may still run. */
static lm_status fail_rc(const lm_cuda_qwen3 *m, lm_status rc) {
    cudaStreamSynchronize(m->ctx->stream);
    if (m->in_stream) cudaStreamSynchronize(m->in_stream);
    cudaGetLastError();
    return rc;
}

extern "C" lm_status lm_cuda_qwen3_forward(struct lm_cuda_qwen3 *m, const struct lm_cuda_batch *b) {
    const lm_cuda_qwen3_params &p = m->p;
    const int nt = b->n_tokens, ns = b->n_seqs, no = b->n_out, W = m->W, BS = p.block_size;
    if (nt < 1 || nt > p.max_tokens)
        return lm_errorf(LM_ERR_RANGE, "CUDA forward: %d tokens (1 to max_tokens %d)", nt, p.max_tokens);
    if (ns < 1 || ns > p.max_seqs)
        return lm_errorf(LM_ERR_RANGE, "CUDA forward: %d sequences (1 to max_seqs %d)", ns, p.max_seqs);
    if (no < 1 || no > nt || no > m->MO)
        return lm_errorf(LM_ERR_RANGE, "CUDA forward: %d outputs (1 to min(tokens %d, max_seqs %d))",
                         no, nt, m->MO);
    if (m->n_pend > (b->async ? 1 : 0))
        return lm_errorf(LM_ERR_INVALID, "CUDA forward: %d queued step%s not collected (a %s step may have %s: "
                         "lm_cuda_qwen3_collect)", m->n_pend, m->n_pend == 1 ? "" : "s",
                         b->async ? "queued" : "plain", b->async ? "one" : "none");
    if (b->async && b->out_logits)
        return lm_errorf(LM_ERR_INVALID, "CUDA forward: a queued step returns no logits (out_logits must be NULL)");
    /* Validate ids, positions, sequences, outputs and the blocks each sequence uses. */
    std::vector<int> max_pos(ns, -1);
    int max_len = 0; /* the longest context of the step: its decode graphs' class */
    for (int i = 0; i < nt; i++) {
        const int f = b->feed ? b->feed[i] : -1;
        if (f >= m->prev_no || f < -1)
            return lm_errorf(LM_ERR_INVALID, "CUDA forward: token %d: feed %d is outside [-1, %d) (the previous "
                             "call's outputs)", i, f, m->prev_no);
        if (f < 0 && (b->ids[i] < 0 || b->ids[i] >= m->V))
            return lm_errorf(LM_ERR_INVALID, "CUDA forward: token %d: id %d is outside [0, %d)", i,
                             b->ids[i], m->V);
        if (b->pos[i] < 0 || b->pos[i] >= p.max_context)
            return lm_errorf(LM_ERR_RANGE, "CUDA forward: token %d: position %d is outside [0, %d)", i,
                             b->pos[i], p.max_context);
        if (b->seq[i] < 0 || b->seq[i] >= ns)
            return lm_errorf(LM_ERR_INVALID, "CUDA forward: token %d: sequence %d is outside [0, %d)", i,
                             b->seq[i], ns);
        if (b->pos[i] > max_pos[b->seq[i]]) max_pos[b->seq[i]] = b->pos[i];
        max_len = std::max(max_len, b->pos[i] + 1);
    }
    for (int s = 0; s < ns; s++)
        for (int j = 0; j <= max_pos[s] / BS && max_pos[s] >= 0; j++) {
            const int blk = b->block_tables[(size_t)s * W + j];
            if (blk < 0 || blk >= p.n_blocks)
                return lm_errorf(LM_ERR_INVALID,
                                 "CUDA forward: sequence %d: block_tables[%d] = %d is outside [0, %d)", s,
                                 j, blk, p.n_blocks);
        }
    bool out_identity = no == nt, any_sampling = false;
    for (int i = 0; i < no; i++) {
        if (b->out_tokens[i] < 0 || b->out_tokens[i] >= nt)
            return lm_errorf(LM_ERR_INVALID, "CUDA forward: out_tokens[%d] = %d is outside [0, %d)", i,
                             b->out_tokens[i], nt);
        out_identity = out_identity && b->out_tokens[i] == i;
        if (b->sampling && b->sampling[i].temperature > 0) any_sampling = true;
    }
    /* A decode step: every token its own output, each sequence's tokens one run of consecutive
     * positions (a plain decode step: runs of 1; speculative verification: the pending token
     * and its drafts), runs longer than 1 only where the decode attention kernel takes them. */
    bool decode = out_identity, runs = false;
    std::vector<int32_t> prev(nt, 0);
    if (decode) {
        std::vector<char> seen(ns, 0);
        for (int i = 0; i < nt && decode; i++) {
            if (i > 0 && b->seq[i] == b->seq[i - 1]) {
                prev[i] = prev[i - 1] + 1;
                decode = b->pos[i] == b->pos[i - 1] + 1 && prev[i] < LM_CUDA_DEC_RUN;
                runs = true;
            } else {
                decode = !seen[b->seq[i]];
                seen[b->seq[i]] = 1;
            }
        }
    }
    lm_cuda_ctx *c = m->ctx;
    if (decode && runs) {
        const int n_dec = p.graphs && nt <= m->MO ? bucket_of(m, nt) : nt;
        const lm_cuda_attn shape = attn_shape(m);
        decode = lm_cuda_attn_dec_fits(c, &shape, n_dec);
    }

    const int cls = decode ? ctx_class(m, max_len) : 0;
    const bool use_graph = decode && p.graphs && nt <= m->MO;
    const int rows = use_graph ? bucket_of(m, nt) : nt;
    const bool gemv = step_on_gemv(m, rows, decode, runs);
    const int nso = use_graph ? rows : ns, noo = use_graph ? rows : no;
    const layout L = make_layout(rows, noo, nso, W, m->work_max);
    const int par = m->par;
    char *h = m->in_host + (size_t)par * m->in_cap;
    m->in_cur = m->in_dev + (size_t)par * m->in_cap;
    int32_t *const ids_host = m->ids_host + (size_t)par * m->MO;
    int32_t *ids = (int32_t *)(h + L.ids), *pos = (int32_t *)(h + L.pos), *seq = (int32_t *)(h + L.seq);
    int32_t *run = (int32_t *)(h + L.run), *feed = (int32_t *)(h + L.feed);
    int32_t *out = (int32_t *)(h + L.out), *bt = (int32_t *)(h + L.bt);
    lm_cuda_sampling *samp = (lm_cuda_sampling *)(h + L.samp);
    if (use_graph) {
        for (int i = 0; i < rows; i++) {
            const bool real = i < nt;
            feed[i] = real && b->feed ? b->feed[i] : -1;
            ids[i] = real && feed[i] < 0 ? b->ids[i] : 0;
            pos[i] = real ? b->pos[i] : 0;
            seq[i] = i; /* a row of its own (a run's rows hold copies of its sequence's table) */
            run[i] = real ? prev[i] : 0;
            out[i] = i;
            if (real) {
                memcpy(bt + (size_t)i * W, b->block_tables + (size_t)b->seq[i] * W, sizeof(int32_t) * W);
            } else {
                for (int j = 0; j < W; j++) bt[(size_t)i * W + j] = p.n_blocks; /* the scratch block */
            }
            memset(&samp[i], 0, sizeof samp[i]);
            if (real && b->sampling) samp[i] = b->sampling[i];
        }
    } else {
        for (int i = 0; i < nt; i++) {
            feed[i] = b->feed ? b->feed[i] : -1;
            ids[i] = feed[i] < 0 ? b->ids[i] : 0;
        }
        memcpy(pos, b->pos, sizeof(int32_t) * nt);
        memcpy(seq, b->seq, sizeof(int32_t) * nt);
        memcpy(run, prev.data(), sizeof(int32_t) * nt);
        memcpy(out, b->out_tokens, sizeof(int32_t) * no);
        memcpy(bt, b->block_tables, sizeof(int32_t) * (size_t)ns * W);
        for (int i = 0; i < no; i++) {
            memset(&samp[i], 0, sizeof samp[i]);
            if (b->sampling) samp[i] = b->sampling[i];
        }
    }
    /* A batched decode step whose plan cuts some context runs its attention from the list; one
     * whose contexts are even enough to stay whole keeps one block a token (a graph of its own). */
    const int n_att = use_graph ? rows : nt; /* the attention's tokens (make_attn's n) */
    attn_lists lists;
    if (work_list(m, decode, n_att)) {
        const lm_cuda_attn shape = attn_shape(m);
        const int P = lm_cuda_attn_work_blocks(c, &shape, n_att);
        if (P > m->work_max) /* the layout holds n + work_max items */
            return lm_errorf(LM_ERR_RANGE, "CUDA forward: work list of %d blocks a KV head over the %d "
                             "the staging holds", P, m->work_max);
        lists.work = lm_cuda_attn_plan_work((int32_t *)(h + L.work), pos, n_att, P, split_batch_len(), SPLIT_MAX) >
                     n_att;
    }

    /* A prefill step on the batched path (bf16 attention output): tiles of its runs of one
     * sequence's tokens for the tensor-core attention (LM_CUDA_FLASH_MIN, flash_min_tokens). */
    if (!decode && !gemv && flash_min_tokens() > 0) {
        const lm_cuda_attn shape = attn_shape(m);
        const int tt = lm_cuda_attn_tile_tokens(c, &shape);
        /* The tokens beside the tiles (decodes riding with a chunk) cut as a decode step's, so
         * that a long context among them does not hold the launch up; P for all nt tokens, which
         * only sizes the pieces (the planner holds at most nt + P items: make_layout's room). */
        const lm_cuda_tile_plan tp = {tt, flash_min_tokens(), std::min(m->work_max, lm_cuda_attn_work_blocks(c, &shape, nt)),
                                      split_batch_len() > 0 ? split_batch_len() : 1 << 30, SPLIT_MAX, m->MO};
        if (tt > 0) lists.n_tiles = lm_cuda_attn_plan_tiles((int32_t *)(h + L.work), seq, pos, nt, &tp, &lists.n_rest);
    }

    /* The inputs the step's first copy takes: the work area only when the step has a list (a
     * decode list's whole room: a graph replays the copy it captured, whatever the item count of
     * the step that replays it; a prefill step's list is copied exactly, never captured). */
    const size_t in_bytes =
        lists.work ? L.total
             : lists.tiles() ? L.work + sizeof(int32_t) * (2 * LM_CUDA_WORK_HEAD +
                                                            LM_CUDA_WORK_ITEM * (size_t)(lists.n_tiles + lists.n_rest))
                             : L.work;

    /* The lm_head's screen for a greedy step of up to gemv_max_rows outputs that wants no logits
     * (params.lm_screen, where the screen was built); a graph key of its own. */
    const bool screen = m->p.lm_screen && m->screen && !b->out_logits && !any_sampling && noo <= m->p.gemv_max_rows;
    const size_t slot =
        ((((((size_t)cls * (m->MO + 16) + rows) * 2 + any_sampling) * 2 + lists.work) * 2 + gemv) * 2 + screen) * 2 +
        par; /* the graph's: its key (graphs) */
    /* Queues the step (its input copy, the graph or the kernels, its ids to the host, its event),
     * or waits for it when it is not async. */
    auto issue = [&]() -> lm_status {
        lm_status rc = LM_OK;
        if (use_graph) {
            graph_slot &g = m->graphs[slot];
            const bool fresh = !g.exec; /* its inputs are copied for the eager run */
            if (fresh) {
                /* First use of this bucket: run it eagerly (warms the kernels' launch caches and
                 * checks the step), then capture it; replaying the step is harmless (same writes).
                 */
                LM_TRY(in_copy(m, h, in_bytes, par));
                LM_TRY(run_forward(m, rows, rows, L, true, true, any_sampling, cls, lists, gemv,
                                   screen));
                LM_TRY(lm_cuda_ctx_sync(c));
                cudaGraph_t graph = NULL;
                LM_CU(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
                if (!m->in_stream) rc = in_copy(m, h, in_bytes, par);
                if (!rc)
                    rc = run_forward(m, rows, rows, L, true, true, any_sampling, cls, lists, gemv,
                                     screen);
                if (!rc) rc = ids_to_host(m, ids_host, par, rows);
                cudaError_t e2 = cudaStreamEndCapture(c->stream, &graph);
                if (!rc && e2 != cudaSuccess) rc = lm_cuda_fail(e2, "cudaStreamEndCapture");
                if (!rc) {
                    const cudaError_t e = cudaGraphInstantiate(&g.exec, graph, 0);
                    if (e != cudaSuccess) {
                        g.exec = NULL;
                        rc = lm_cuda_fail(e, "cudaGraphInstantiate");
                    }
                }
                if (graph) cudaGraphDestroy(graph);
                if (rc) return rc;
            }
            if (m->in_stream && !fresh) LM_TRY(in_copy(m, h, in_bytes, par));
            LM_CU(cudaGraphLaunch(g.exec, c->stream));
            m->last_exec = g.exec;
            m->last_rows = rows;
        } else {
            LM_TRY(in_copy(m, h, in_bytes, par));
            LM_TRY(run_forward(m, nt, no, L, decode, out_identity, any_sampling, cls, lists, gemv,
                               screen));
            LM_TRY(ids_to_host(m, ids_host, par, no));
        }
        if (b->out_logits)
            LM_CU(cudaMemcpyAsync(b->out_logits, m->logits, sizeof(float) * (size_t)no * m->V,
                                  cudaMemcpyDeviceToHost, c->stream));
        LM_CU(cudaEventRecord(m->done[par], c->stream)); /* for collect, and for in_copy 2 calls on */
        if (!b->async) LM_TRY(lm_cuda_ctx_sync(c));
        return LM_OK;
    };
    const lm_status rc = issue();
    if (rc) return fail_rc(m, rc);
    m->screened_steps += screen;
    m->par = 1 - par;
    m->prev_no = no;
    if (!b->async) {
        memcpy(b->out_ids, ids_host, sizeof(int32_t) * no);
        return LM_OK;
    }
    m->pend_par[m->n_pend] = par;
    m->pend_no[m->n_pend] = no;
    m->n_pend++;
    return LM_OK;
}

extern "C" lm_status lm_cuda_qwen3_collect(struct lm_cuda_qwen3 *m, int32_t *out_ids, int *n_out) {
    if (m->n_pend == 0) return lm_errorf(LM_ERR_INVALID, "CUDA collect: no queued step");
    const int par = m->pend_par[0], no = m->pend_no[0];
    m->n_pend--;
    m->pend_par[0] = m->pend_par[1];
    m->pend_no[0] = m->pend_no[1];
    const cudaError_t e = cudaEventSynchronize(m->done[par]);
    if (e != cudaSuccess) {
        m->n_pend = 0; /* what was queued after it failed with it */
        m->prev_no = 0;
        return lm_cuda_fail(e, "queued step");
    }
    memcpy(out_ids, m->ids_host + (size_t)par * m->MO, sizeof(int32_t) * no);
    if (n_out) *n_out = no;
    return LM_OK;
}

extern "C" struct lm_cuda_ctx *lm_cuda_qwen3_ctx(struct lm_cuda_qwen3 *m) { return m->ctx; }

/* One launch of linear layer `what` of layer l (see lm_cuda_qwen3_bench_linear). */
static lm_status bench_one(lm_cuda_qwen3 *m, int what, int l, int n) {
    lm_cuda_ctx *c = m->ctx;
    const layer_dev &w = m->layers[l];
    const float eps = m->cfg.rms_norm_eps;
    switch (what) {
    case 0: return gemv_any(m, c, m->qkv, m->QKV, m->x, m->H, w.wqkv, n, m->H, m->QKV, w.in_ln, eps, LM_CUDA_EPI_STORE);
    case 1: return gemv_any(m, c, m->x, m->H, m->att, m->Q, w.wo, n, m->Q, m->H, NULL, 0, LM_CUDA_EPI_ADD);
    case 2: return gemv_any(m, c, m->h, m->I, m->x, m->H, w.wgu, n, m->H, 2 * m->I, w.post_ln, eps, LM_CUDA_EPI_SWIGLU);
    case 3: return gemv_any(m, c, m->x, m->H, m->h, m->I, w.wd, n, m->I, m->H, NULL, 0, LM_CUDA_EPI_ADD);
    case 4: return gemv_any(m, c, m->logits, m->V, m->x, m->H, m->lm_head, n, m->H, m->V, m->norm, eps, LM_CUDA_EPI_STORE);
    case 5: { /* fused decode attention over the last decode step's inputs (bucket n) */
        const int rows = bucket_of(m, n);
        lm_cuda_attn a = make_attn(m, make_layout(rows, rows, rows, m->W, m->work_max),
                                   step_on_gemv(m, rows, true, false), 0, rows, true, attn_lists());
        set_layer(m, &a, l);
        return lm_cuda_attention(c, &a, rows, true);
    }
    case 6: return lm_cuda_sample(c, m->ids_dev, m->logits, m->V, n, m->V, NULL);
    default: return layer_gemm(m, w, LG_QKV + (what - 7), n); /* 7-10 */
    }
}

extern "C" lm_status lm_cuda_qwen3_bench_linear(struct lm_cuda_qwen3 *m, int what, int n, int reps,
                                                double *us, double *bytes) {
    lm_cuda_ctx *c = m->ctx;
    const int gemm = what >= 7 && what <= 10;
    if (what < 0 || what > 10 || n < 1 || n > (gemm ? 64 : 8) || n > m->p.max_tokens ||
        (gemm && !m->layers[0].wqkv.bf))
        return lm_errorf(LM_ERR_RANGE, "bench_linear: what = %d, n = %d", what, n);
    const size_t rows[5] = {(size_t)m->QKV, (size_t)m->H, 2 * (size_t)m->I, (size_t)m->H, (size_t)m->V};
    const size_t cols[5] = {(size_t)m->H, (size_t)m->Q, (size_t)m->H, (size_t)m->I, (size_t)m->H};
    const dmat *wm[5] = {&m->layers[0].wqkv, &m->layers[0].wo, &m->layers[0].wgu, &m->layers[0].wd, &m->lm_head};
    const int wi = gemm ? what - 7 : what;
    *bytes = gemm ? 2.0 * rows[wi] * cols[wi] : what <= 4 ? (double)gemv_bytes(*wm[wi], rows[wi], cols[wi]) : 0;
    const int launches = what >= 4 && what <= 6 ? 8 : m->NL;
    /* Inputs must be finite: fill the activations the kernels read with small values. */
    if (what <= 4 || gemm) {
        if (gemm) {
            LM_CU(cudaMemsetAsync(m->xb, 0, sizeof(uint16_t) * (size_t)n * m->H, c->stream));
            LM_CU(cudaMemsetAsync(m->attb, 0, sizeof(uint16_t) * (size_t)n * m->Q, c->stream));
            LM_CU(cudaMemsetAsync(m->hb, 0, sizeof(uint16_t) * (size_t)n * m->I, c->stream));
        }
        LM_CU(cudaMemsetAsync(m->x, 0, sizeof(float) * (size_t)n * m->H, c->stream));
        LM_CU(cudaMemsetAsync(m->att, 0, sizeof(float) * (size_t)n * m->Q, c->stream));
        LM_CU(cudaMemsetAsync(m->h, 0, sizeof(float) * (size_t)n * m->I, c->stream));
    }
    for (int l = 0; l < launches; l++) LM_TRY(bench_one(m, what, what == 4 || what == 6 ? 0 : l % m->NL, n)); /* warm */
    LM_TRY(lm_cuda_ctx_sync(c));
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    LM_CU(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
    lm_status rc = LM_OK;
    for (int l = 0; l < launches && !rc; l++) rc = bench_one(m, what, what == 4 || what == 6 ? 0 : l % m->NL, n);
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    if (!rc && e != cudaSuccess) rc = lm_cuda_fail(e, "capture");
    if (!rc && (e = cudaGraphInstantiate(&ge, g, 0)) != cudaSuccess) rc = lm_cuda_fail(e, "instantiate");
    float ms = 0;
    if (!rc) rc = lm_time_median(c->stream, reps, "bench replay", [&] { cudaGraphLaunch(ge, c->stream); }, &ms);
    if (!rc) *us = ms * 1e3 / launches;
    if (ge) cudaGraphExecDestroy(ge);
    if (g) cudaGraphDestroy(g);
    return rc;
}

extern "C" lm_status lm_cuda_qwen3_bench_step(struct lm_cuda_qwen3 *m, int n, int reps, double *us) {
    lm_cuda_ctx *c = m->ctx;
    const int rows = n >= 1 && n <= m->MO ? bucket_of(m, n) : 0;
    if (!rows || !m->last_exec || m->last_rows != rows)
        return lm_errorf(LM_ERR_INVALID, "bench_step: the last decode step was not a graph of %d sequences", n);
    cudaGraphExec_t ge = m->last_exec;
    float ms = 0;
    const lm_status rc = lm_time_median(c->stream, reps, "bench_step replay", [&] {
        for (int k = 0; k < 10; k++) cudaGraphLaunch(ge, c->stream);
    }, &ms);
    if (!rc) *us = (ms / 10) * 1e3; /* per step: 10 replays a timed run */
    return rc;
}

/* ---- KV block copy (prefix reuse; appended for the serving engine, family/qwen3/cuda.c) ---- */

extern "C" lm_status lm_cuda_qwen3_kv_copy(struct lm_cuda_qwen3 *m, int src, int dst, int n_rows) {
    const int BS = m->p.block_size, nkv = m->cfg.n_kv_heads, D = m->D;
    if (src < 0 || src >= m->p.n_blocks || dst < 0 || dst >= m->p.n_blocks)
        return lm_errorf(LM_ERR_INVALID, "CUDA KV copy: block %d -> %d outside [0, %d)", src, dst,
                         m->p.n_blocks);
    if (n_rows < 0 || n_rows > BS)
        return lm_errorf(LM_ERR_INVALID, "CUDA KV copy: %d rows (0 to %d)", n_rows, BS);
    if (n_rows == 0 || src == dst) return LM_OK;
    /* Queued on the context's stream before the next step, a plain launch (no kernel to overlap). */
    lm_cuda_ctx *c = m->ctx;
    const bool pdl = c->pdl;
    c->pdl = false;
    const lm_status rc = lm_cuda_kv_copy_rows(c, m->k_pool, m->v_pool, m->layer_elems, m->NL, nkv, BS, D, src,
                                              dst, n_rows);
    c->pdl = pdl;
    return rc;
}
