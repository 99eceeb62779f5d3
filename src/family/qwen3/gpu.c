/* gpu.c: the Qwen3 family on a CUDA device; see gpu.h. */
#include "family/qwen3/gpu.h"

#include <stdlib.h>
#include <string.h>

#ifndef LM_HAVE_CUDA

static lm_status no_cuda(void) {
    return lm_errorf(LM_ERR_UNSUPPORTED, "device cuda: this lumen was built without CUDA "
                                         "(configure with nvcc on the PATH and -DLM_CUDA=ON)");
}
lm_status lm_qwen3_gpu_open(const struct lm_cuda_qwen3_weights *w, int device,
                            struct lm_qwen3_gpu **out) {
    *out = NULL;
    return no_cuda();
}
void lm_qwen3_gpu_close(struct lm_qwen3_gpu *g) {}
lm_status lm_qwen3_gpu_kv_open(struct lm_qwen3_gpu *g, int n_blocks, int max_batch, int max_ctx) {
    return no_cuda();
}
void lm_qwen3_gpu_kv_close(struct lm_qwen3_gpu *g) {}
lm_status lm_qwen3_gpu_kv_copy(struct lm_qwen3_gpu *g, int src, int dst, int n_rows) {
    return no_cuda();
}
lm_status lm_qwen3_gpu_forward(struct lm_qwen3_gpu *g, const struct lm_batch_seq *seqs, int n_seqs,
                               float *logits, const struct lm_device_sampling *sampling,
                               int32_t *ids) {
    return no_cuda();
}
lm_status lm_qwen3_gpu_queue(struct lm_qwen3_gpu *g, const struct lm_batch_seq *seqs, int n_seqs,
                             const struct lm_device_sampling *sampling, const int32_t *feed) {
    return no_cuda();
}
lm_status lm_qwen3_gpu_collect(struct lm_qwen3_gpu *g, int32_t *ids, int *n_ids) { return no_cuda(); }

#else

#include <cuda_runtime_api.h>

#include "backend/cuda/cuda.h"

/* Output rows (and block-table rows) one device call may carry: the device model's max_seqs.
 * Bounds its logits buffer ([rows, vocab] float32: 1024 rows = 622 MB at Qwen3's vocabulary). */
enum { MAX_ROWS = 1024 };

struct lm_qwen3_gpu {
    const struct lm_cuda_qwen3_weights *w; /* borrowed host weights */
    int device;
    struct lm_cuda_qwen3 *cm;              /* NULL until the first cache */
    struct lm_cuda_qwen3_params p;         /* cm's sizes */
    bool kv_open;
    int W;                                 /* block-table width: ceil(max_context / block) */
    /* The host side of one device call, sized at kv_open. */
    int32_t *ids, *pos, *seq, *out, *bt, *chosen, *feed;
    struct lm_cuda_sampling *samp;
};

lm_status lm_qwen3_gpu_open(const struct lm_cuda_qwen3_weights *w, int device,
                            struct lm_qwen3_gpu **out) {
    *out = NULL;
    const struct lm_cuda_qwen3_config *c = &w->cfg;
    const int D = c->head_dim;
    if (D != 16 && D != 32 && D != 64 && D != 128 && D != 256)
        return lm_errorf(LM_ERR_UNSUPPORTED,
                         "config.json: head_dim %d is not supported on CUDA (16, 32, 64, 128 or 256)", D);
    if (c->n_heads / c->n_kv_heads > 8)
        return lm_errorf(LM_ERR_UNSUPPORTED,
                         "config.json: %d query heads per KV head; the CUDA attention takes at most 8",
                         c->n_heads / c->n_kv_heads);
    if (c->hidden % 8 || (c->n_heads * D) % 8 || c->intermediate % 8)
        return lm_errorf(LM_ERR_UNSUPPORTED,
                         "config.json: hidden_size %d, q width %d and intermediate_size %d must be "
                         "multiples of 8 on CUDA", c->hidden, c->n_heads * D, c->intermediate);
    struct lm_qwen3_gpu *g = calloc(1, sizeof *g);
    if (!g) return lm_errorf(LM_ERR_NOMEM, "out of memory");
    g->w = w;
    g->device = device;
    *out = g;
    return LM_OK;
}

/* The CUDA runtime's current device is per thread, and the engine steps on another thread than
 * the one that opened the model: every entry point makes the model's device current first. */
static lm_status use_device(const struct lm_qwen3_gpu *g) {
    cudaError_t e = cudaSetDevice(g->device);
    if (e != cudaSuccess)
        return lm_errorf(LM_ERR_IO, "cuda:%d: cudaSetDevice: %s", g->device, cudaGetErrorString(e));
    return LM_OK;
}

static void free_staging(struct lm_qwen3_gpu *g) {
    free(g->ids), free(g->pos), free(g->seq), free(g->out), free(g->bt), free(g->chosen), free(g->feed);
    free(g->samp);
    g->ids = g->pos = g->seq = g->out = g->bt = g->chosen = g->feed = NULL;
    g->samp = NULL;
}

void lm_qwen3_gpu_close(struct lm_qwen3_gpu *g) {
    if (!g) return;
    if (g->cm) use_device(g);
    lm_cuda_qwen3_destroy(g->cm);
    free_staging(g);
    free(g);
}

lm_status lm_qwen3_gpu_kv_open(struct lm_qwen3_gpu *g, int n_blocks, int max_batch, int max_ctx) {
    lm_status drc = use_device(g);
    if (drc) return drc;
    if (g->kv_open)
        return lm_errorf(LM_ERR_INVALID,
                         "cuda:%d: a KV cache is already open on this model (a CUDA model holds one "
                         "at a time); destroy it first", g->device);
    struct lm_cuda_qwen3_params p = lm_cuda_qwen3_default_params();
    p.device = g->device;
    p.max_tokens = max_batch;
    p.max_seqs = max_batch < MAX_ROWS ? max_batch : MAX_ROWS;
    p.max_context = max_ctx;
    p.block_size = LM_KV_BLOCK;
    p.n_blocks = n_blocks;
    bool fits = g->cm && g->p.n_blocks >= n_blocks && g->p.max_tokens >= p.max_tokens &&
                g->p.max_seqs >= p.max_seqs && g->p.max_context >= max_ctx;
    if (!fits && g->cm) { /* grow to cover both, so that alternating caches upload once more */
        if (g->p.n_blocks > p.n_blocks) p.n_blocks = g->p.n_blocks;
        if (g->p.max_tokens > p.max_tokens) p.max_tokens = g->p.max_tokens;
        if (g->p.max_seqs > p.max_seqs) p.max_seqs = g->p.max_seqs;
        if (g->p.max_context > p.max_context) p.max_context = g->p.max_context;
    }
    if (!fits) {
        lm_cuda_qwen3_destroy(g->cm);
        g->cm = NULL;
        free_staging(g);
        lm_status rc = lm_cuda_qwen3_create(g->w, &p, &g->cm);
        if (rc) return rc;
        g->p = p;
        g->W = (p.max_context + LM_KV_BLOCK - 1) / LM_KV_BLOCK;
        size_t T = (size_t)p.max_tokens, S = (size_t)p.max_seqs;
        g->ids = malloc(sizeof(int32_t) * T);
        g->pos = malloc(sizeof(int32_t) * T);
        g->seq = malloc(sizeof(int32_t) * T);
        g->out = malloc(sizeof(int32_t) * S);
        g->chosen = malloc(sizeof(int32_t) * S);
        g->bt = calloc(S * (size_t)g->W, sizeof(int32_t));
        g->samp = calloc(S, sizeof *g->samp);
        g->feed = malloc(sizeof(int32_t) * T);
        if (!g->ids || !g->pos || !g->seq || !g->out || !g->chosen || !g->bt || !g->samp || !g->feed) {
            lm_cuda_qwen3_destroy(g->cm);
            g->cm = NULL;
            free_staging(g);
            return lm_errorf(LM_ERR_NOMEM, "out of memory for a CUDA step of %d tokens", p.max_tokens);
        }
    }
    g->kv_open = true;
    return LM_OK;
}

void lm_qwen3_gpu_kv_close(struct lm_qwen3_gpu *g) { g->kv_open = false; }

lm_status lm_qwen3_gpu_kv_copy(struct lm_qwen3_gpu *g, int src, int dst, int n_rows) {
    lm_status rc = use_device(g);
    return rc ? rc : lm_cuda_qwen3_kv_copy(g->cm, src, dst, n_rows);
}

/* An output row's device sampling (zero: greedy) from the engine's (NULL: greedy). */
static void put_sampling(struct lm_cuda_sampling *d, const struct lm_device_sampling *from) {
    memset(d, 0, sizeof *d);
    if (!from) return;
    d->temperature = from->temperature;
    d->top_p = from->top_p;
    d->top_k = from->top_k;
    d->seed = from->seed;
    d->counter = from->counter;
}

/* The call being built: nt tokens of ns sequences, no output rows (the first is global row r0). */
struct call {
    int nt, ns, no, r0;
};

/* Runs the call and starts the next. Output rows go to logits/ids at row r0 (a call with none
 * still needs one output on the device: the last token's, thrown away). fed: g->feed holds the
 * call's feeds (lm_cuda_batch.feed); async: queue it (lm_cuda_batch.async; ids are not written). */
static lm_status flush(struct lm_qwen3_gpu *g, struct call *c, float *logits, bool sampled, int32_t *ids,
                       bool fed, bool async) {
    if (c->nt == 0) return LM_OK;
    const size_t V = (size_t)g->w->cfg.vocab;
    bool none = c->no == 0;
    if (none) g->out[0] = c->nt - 1;
    struct lm_cuda_batch b = {
        .n_tokens = c->nt, .ids = g->ids, .pos = g->pos, .seq = g->seq,
        .n_seqs = c->ns, .block_tables = g->bt,
        .n_out = none ? 1 : c->no, .out_tokens = g->out,
        .sampling = sampled && !none ? g->samp : NULL,
        .out_ids = g->chosen,
        .out_logits = logits && !none ? logits + (size_t)c->r0 * V : NULL,
        .feed = fed ? g->feed : NULL,
        .async = async,
    };
    lm_status rc = lm_cuda_qwen3_forward(g->cm, &b);
    if (rc) return rc;
    if (ids && !none && !async) memcpy(ids + c->r0, g->chosen, sizeof(int32_t) * (size_t)c->no);
    c->r0 += c->no;
    c->nt = c->ns = c->no = 0;
    return LM_OK;
}

/* A step as device calls of at most max_seqs sequences and output rows each (lm_qwen3_gpu_forward);
 * feed: NULL, or per sequence the output row of the last call its one token is fed from (-1:
 * none); async: queue the calls (the caller made sure the step is one call). */
static lm_status run_step(struct lm_qwen3_gpu *g, const struct lm_batch_seq *seqs, int n_seqs, float *logits,
                          const struct lm_device_sampling *sampling, int32_t *ids, const int32_t *feed, bool async) {
    if (!g->kv_open) return lm_errorf(LM_ERR_INVALID, "cuda:%d: forward without a KV cache", g->device);
    lm_status drc = use_device(g);
    if (drc) return drc;
    const int S = g->p.max_seqs, W = g->W;
    struct call c = {0, 0, 0, 0};
    for (int s = 0; s < n_seqs; s++) {
        const struct lm_batch_seq *b = &seqs[s];
        const int nb = (b->pos + b->n + LM_KV_BLOCK - 1) / LM_KV_BLOCK;
        for (int done = 0; done < b->n;) {
            /* A piece of this sequence: all of it, unless its output rows overflow the call. */
            bool outputs = b->logits != LM_LOGITS_NONE;
            if (c.ns == S || (outputs && c.no == S)) {
                lm_status rc = flush(g, &c, logits, sampling != NULL, ids, feed != NULL, async);
                if (rc) return rc;
            }
            int take = b->n - done;
            if (b->logits == LM_LOGITS_ALL && take > S - c.no) take = S - c.no;
            int32_t *row = g->bt + (size_t)c.ns * W;
            /* The row's tail (blocks past this step's positions) keeps what an earlier step left
             * there (calloc'd: valid ids or 0): the device reads only the blocks of positions up to
             * each token's own. */
            memcpy(row, b->blocks, sizeof(int32_t) * (size_t)nb);
            const int f = feed ? feed[s] : -1; /* a fed sequence's ids are not read */
            for (int i = done; i < done + take; i++) {
                g->ids[c.nt] = f < 0 ? b->ids[i] : 0;
                g->feed[c.nt] = f;
                g->pos[c.nt] = b->pos + i;
                g->seq[c.nt] = c.ns;
                if (b->logits == LM_LOGITS_ALL || (b->logits == LM_LOGITS_LAST && i == b->n - 1)) {
                    const int r = c.r0 + c.no;
                    g->out[c.no] = c.nt;
                    put_sampling(&g->samp[c.no], sampling ? &sampling[r] : NULL);
                    c.no++;
                }
                c.nt++;
            }
            c.ns++;
            done += take;
        }
    }
    return flush(g, &c, logits, sampling != NULL, ids, feed != NULL, async);
}

lm_status lm_qwen3_gpu_forward(struct lm_qwen3_gpu *g, const struct lm_batch_seq *seqs, int n_seqs,
                               float *logits, const struct lm_device_sampling *sampling,
                               int32_t *ids) {
    return run_step(g, seqs, n_seqs, logits, sampling, ids, NULL, false);
}

lm_status lm_qwen3_gpu_queue(struct lm_qwen3_gpu *g, const struct lm_batch_seq *seqs, int n_seqs,
                             const struct lm_device_sampling *sampling, const int32_t *feed) {
    /* one device call: at most max_seqs sequences, one token and output row each */
    if (g->kv_open && n_seqs > g->p.max_seqs)
        return lm_errorf(LM_ERR_RANGE, "cuda:%d: a queued step of %d sequences (one device call: at most %d)",
                         g->device, n_seqs, g->p.max_seqs);
    for (int s = 0; s < n_seqs; s++)
        if (seqs[s].n != 1 || seqs[s].logits != LM_LOGITS_LAST)
            return lm_errorf(LM_ERR_RANGE, "cuda:%d: queued step: sequence %d has %d tokens (%s logits); a queued "
                             "step decodes one token a sequence, with its last row", g->device, s, seqs[s].n,
                             seqs[s].logits == LM_LOGITS_LAST ? "last" : "not the last");
    return run_step(g, seqs, n_seqs, NULL, sampling, NULL, feed, true);
}

lm_status lm_qwen3_gpu_collect(struct lm_qwen3_gpu *g, int32_t *ids, int *n_ids) {
    if (!g->cm) return lm_errorf(LM_ERR_INVALID, "cuda:%d: collect without a KV cache", g->device);
    lm_status rc = use_device(g);
    return rc ? rc : lm_cuda_qwen3_collect(g->cm, ids, n_ids);
}

#endif
