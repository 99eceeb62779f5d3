/* kv.c: see kv.h. Two hash tables share one bucket count (a power of two at least twice the
 * block count): full blocks by their chain hash, and all indexed blocks by their parent hash
 * (for the token-level match of a last block). Both chain through fields of the blocks. */
#include "engine/kv.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

uint64_t lm_kv_hash(uint64_t parent, const int32_t *tokens, int n) {
    uint64_t h = mix64(parent ^ 0x9e3779b97f4a7c15ull);
    for (int i = 0; i < n; i++)
        h = mix64(h ^ ((uint64_t)(uint32_t)tokens[i] + 0x100000000ull * (uint64_t)(i + 1)));
    return mix64(h ^ (uint64_t)n);
}

lm_status lm_kv_init(struct lm_kv *kv, int n_blocks, lm_kv_copy_fn copy, void *copy_ctx) {
    memset(kv, 0, sizeof *kv);
    assert(n_blocks > 0);
    uint64_t buckets = 16;
    while (buckets < 2 * (uint64_t)n_blocks)
        buckets *= 2;
    kv->b = calloc((size_t)n_blocks, sizeof *kv->b);
    kv->free = malloc(sizeof *kv->free * (size_t)n_blocks);
    kv->hash_bucket = malloc(sizeof *kv->hash_bucket * buckets);
    kv->child_bucket = malloc(sizeof *kv->child_bucket * buckets);
    if (!kv->b || !kv->free || !kv->hash_bucket || !kv->child_bucket) {
        lm_kv_free(kv);
        return lm_errorf(LM_ERR_NOMEM, "out of memory for the bookkeeping of %d KV blocks",
                         n_blocks);
    }
    kv->n_blocks = n_blocks;
    kv->mask = buckets - 1;
    for (uint64_t i = 0; i < buckets; i++)
        kv->hash_bucket[i] = kv->child_bucket[i] = -1;
    /* Block 0 on top of the stack: a fresh pool hands out 0, 1, 2, ... */
    for (int i = 0; i < n_blocks; i++) {
        kv->free[i] = n_blocks - 1 - i;
        kv->b[i].lru_prev = kv->b[i].lru_next = kv->b[i].hash_next = kv->b[i].child_next = -1;
    }
    kv->n_free = n_blocks;
    kv->lru_head = kv->lru_tail = -1;
    kv->copy = copy;
    kv->copy_ctx = copy_ctx;
    return LM_OK;
}

void lm_kv_free(struct lm_kv *kv) {
    if (!kv) return;
    free(kv->b);
    free(kv->free);
    free(kv->hash_bucket);
    free(kv->child_bucket);
    memset(kv, 0, sizeof *kv);
}

int lm_kv_available(const struct lm_kv *kv) {
    return kv->n_free + kv->n_cached;
}
int lm_kv_used(const struct lm_kv *kv) {
    return kv->n_blocks - kv->n_free - kv->n_cached;
}

/* ---- the cached (LRU) list ---- */

static void lru_remove(struct lm_kv *kv, int i) {
    struct lm_kv_block *b = &kv->b[i];
    if (b->lru_prev >= 0)
        kv->b[b->lru_prev].lru_next = b->lru_next;
    else
        kv->lru_head = b->lru_next;
    if (b->lru_next >= 0)
        kv->b[b->lru_next].lru_prev = b->lru_prev;
    else
        kv->lru_tail = b->lru_prev;
    b->lru_prev = b->lru_next = -1;
    kv->n_cached--;
}

static void lru_push(struct lm_kv *kv, int i) {
    struct lm_kv_block *b = &kv->b[i];
    b->lru_prev = kv->lru_tail;
    b->lru_next = -1;
    if (kv->lru_tail >= 0)
        kv->b[kv->lru_tail].lru_next = i;
    else
        kv->lru_head = i;
    kv->lru_tail = i;
    kv->n_cached++;
}

/* ---- the index ---- */

static void unlink_chain(struct lm_kv *kv, int *head, int i, bool by_hash) {
    int *pp = head;
    while (*pp >= 0 && *pp != i)
        pp = by_hash ? &kv->b[*pp].hash_next : &kv->b[*pp].child_next;
    assert(*pp == i);
    *pp = by_hash ? kv->b[i].hash_next : kv->b[i].child_next;
    if (by_hash)
        kv->b[i].hash_next = -1;
    else
        kv->b[i].child_next = -1;
}

static void unindex(struct lm_kv *kv, int i) {
    struct lm_kv_block *b = &kv->b[i];
    if (b->n_tokens == LM_KV_BLOCK) unlink_chain(kv, &kv->hash_bucket[b->hash & kv->mask], i, true);
    unlink_chain(kv, &kv->child_bucket[b->parent & kv->mask], i, false);
    b->n_tokens = 0;
}

/* The indexed full block with this parent and these tokens, or -1. */
static int find_full(const struct lm_kv *kv, uint64_t parent, const int32_t *tokens) {
    uint64_t h = lm_kv_hash(parent, tokens, LM_KV_BLOCK);
    for (int i = kv->hash_bucket[h & kv->mask]; i >= 0; i = kv->b[i].hash_next) {
        const struct lm_kv_block *b = &kv->b[i];
        if (b->hash == h && b->parent == parent && b->n_tokens == LM_KV_BLOCK &&
            !memcmp(b->tokens, tokens, sizeof b->tokens))
            return i;
    }
    return -1;
}

/* The indexed child of `parent` sharing the longest token prefix with ids[0..n) (n <=
 * LM_KV_BLOCK); *len gets that prefix length. -1 when none shares a token. */
static int find_child(const struct lm_kv *kv, uint64_t parent, const int32_t *ids, int n,
                      int *len) {
    int best = -1, best_len = 0;
    for (int i = kv->child_bucket[parent & kv->mask]; i >= 0; i = kv->b[i].child_next) {
        const struct lm_kv_block *b = &kv->b[i];
        if (b->parent != parent) continue;
        int m = b->n_tokens < n ? b->n_tokens : n, k = 0;
        while (k < m && b->tokens[k] == ids[k])
            k++;
        if (k > best_len) {
            best = i;
            best_len = k;
        }
    }
    *len = best_len;
    return best;
}

static void hold(struct lm_kv *kv, int i) {
    if (kv->b[i].ref++ == 0) lru_remove(kv, i);
}

int lm_kv_alloc_free(struct lm_kv *kv) {
    if (kv->n_free == 0) return -1;
    int i = kv->free[--kv->n_free];
    assert(kv->b[i].ref == 0 && kv->b[i].n_tokens == 0);
    kv->b[i].ref = 1;
    return i;
}

int lm_kv_alloc(struct lm_kv *kv) {
    if (kv->n_free > 0 || kv->lru_head < 0) return lm_kv_alloc_free(kv);
    int i = kv->lru_head;
    lru_remove(kv, i);
    unindex(kv, i);
    kv->evictions++;
    assert(kv->b[i].ref == 0 && kv->b[i].n_tokens == 0);
    kv->b[i].ref = 1;
    return i;
}

void lm_kv_release(struct lm_kv *kv, int i) {
    struct lm_kv_block *b = &kv->b[i];
    assert(b->ref > 0);
    if (--b->ref > 0) return;
    if (b->n_tokens > 0)
        lru_push(kv, i);
    else
        kv->free[kv->n_free++] = i;
}

uint64_t lm_kv_commit(struct lm_kv *kv, int i, uint64_t parent, const int32_t *tokens) {
    struct lm_kv_block *b = &kv->b[i];
    assert(b->ref > 0);
    uint64_t h = lm_kv_hash(parent, tokens, LM_KV_BLOCK);
    if (b->n_tokens > 0 || find_full(kv, parent, tokens) >= 0) return h; /* already known */
    b->hash = h;
    b->parent = parent;
    memcpy(b->tokens, tokens, sizeof b->tokens);
    b->n_tokens = LM_KV_BLOCK;
    b->hash_next = kv->hash_bucket[h & kv->mask];
    kv->hash_bucket[h & kv->mask] = i;
    b->child_next = kv->child_bucket[parent & kv->mask];
    kv->child_bucket[parent & kv->mask] = i;
    return h;
}

void lm_kv_commit_partial(struct lm_kv *kv, int i, uint64_t parent, const int32_t *tokens, int n) {
    struct lm_kv_block *b = &kv->b[i];
    assert(b->ref > 0 && n > 0 && n < LM_KV_BLOCK);
    if (b->n_tokens > 0) return;
    /* An indexed child that already covers these tokens makes this one redundant. */
    int len = 0;
    if (find_child(kv, parent, tokens, n, &len) >= 0 && len == n) return;
    b->hash = lm_kv_hash(parent, tokens, n);
    b->parent = parent;
    memcpy(b->tokens, tokens, sizeof *tokens * (size_t)n);
    b->n_tokens = n;
    b->child_next = kv->child_bucket[parent & kv->mask];
    kv->child_bucket[parent & kv->mask] = i;
}

int lm_kv_probe(const struct lm_kv *kv, const int32_t *ids, int limit) {
    uint64_t parent = LM_KV_ROOT;
    int pos = 0;
    while (pos + LM_KV_BLOCK <= limit) {
        int i = find_full(kv, parent, ids + pos);
        if (i < 0) break;
        parent = kv->b[i].hash;
        pos += LM_KV_BLOCK;
    }
    if (pos < limit && kv->copy) {
        int len = 0, rest = limit - pos < LM_KV_BLOCK ? limit - pos : LM_KV_BLOCK;
        if (find_child(kv, parent, ids + pos, rest, &len) >= 0) pos += len;
    }
    return pos;
}

int lm_kv_match(struct lm_kv *kv, const int32_t *ids, int limit, int32_t *blocks, int *n_blocks,
                uint64_t *chain) {
    uint64_t parent = LM_KV_ROOT;
    int pos = 0, nb = 0;
    while (pos + LM_KV_BLOCK <= limit) {
        int i = find_full(kv, parent, ids + pos);
        if (i < 0) break;
        hold(kv, i);
        blocks[nb++] = i;
        parent = kv->b[i].hash;
        pos += LM_KV_BLOCK;
    }
    *chain = parent;
    if (pos < limit && kv->copy) {
        int len = 0, rest = limit - pos < LM_KV_BLOCK ? limit - pos : LM_KV_BLOCK;
        int src = find_child(kv, parent, ids + pos, rest, &len);
        if (src >= 0) {
            hold(kv, src); /* so that the allocation cannot evict it */
            int dst = lm_kv_alloc(kv);
            if (dst >= 0) {
                kv->copy(kv->copy_ctx, src, dst, len);
                blocks[nb++] = dst;
                pos += len;
            }
            lm_kv_release(kv, src); /* back to the cached list, as most recently used */
        }
    }
    *n_blocks = nb;
    return pos;
}
