/* kv.h: the engine's KV block manager: which blocks of the model's paged cache
 * (family/model.h, struct lm_kv_cache) each sequence holds, prefix reuse, and eviction.
 *
 * Bookkeeping only: the K/V rows live in the model's cache; this file decides who owns which
 * block. The scheme is vLLM's automatic prefix caching (block hashes) with SGLang's token-level
 * reuse of a last, partial block:
 * - A block holds LM_KV_BLOCK positions. A sequence's block i covers positions
 *   [16 i, 16 i + 16).
 * - When a block of a sequence is full and computed, it is indexed by a hash chain:
 *   hash(parent, tokens) where parent is the hash of the block before it (LM_KV_ROOT for the
 *   first), so equal hashes mean equal whole prefixes. The tokens and the parent hash are kept
 *   and compared on lookup, so a hash collision cannot hand out wrong K/V.
 * - When a sequence ends, its last, partly filled block is indexed too (with its token count),
 *   as long as nobody writes it again.
 * - A new sequence takes the longest indexed prefix of its tokens: whole blocks are shared
 *   (reference-counted, read-only); then, at token granularity, the longest common prefix with
 *   any indexed child of the last matched block is copied into a fresh private block. Only
 *   whole, never-again-written blocks are shared, so no copy-on-write is needed.
 * - A block that no sequence holds stays indexed ("cached") until it is needed: allocation takes
 *   never-indexed free blocks first, then evicts the least recently released cached block.
 *
 * Not thread-safe: the engine thread owns it. */
#ifndef LM_ENGINE_KV_H
#define LM_ENGINE_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "family/model.h"

#define LM_KV_ROOT 0x6c756d656e4b5621ull /* parent hash of a sequence's first block */

struct lm_kv_block {
    uint64_t hash;               /* chain hash (indexed blocks) */
    uint64_t parent;             /* the previous block's chain hash, or LM_KV_ROOT */
    int32_t tokens[LM_KV_BLOCK]; /* the ids of its positions (indexed blocks) */
    int n_tokens;                /* 0: not indexed; LM_KV_BLOCK: an indexed full block;
                                    1..15: an indexed partial block (the end of a sequence) */
    int ref;                     /* sequences holding it */
    int lru_prev, lru_next;      /* the cached list (ref 0, indexed), least recent first */
    int hash_next;               /* next block in its hash bucket (full blocks) */
    int child_next;              /* next block in its parent's bucket (full and partial) */
};

/* Copies the first n rows of block src into block dst (lm_kv_cache_copy, or a test double). */
typedef void (*lm_kv_copy_fn)(void *ctx, int src, int dst, int n_rows);

struct lm_kv {
    int n_blocks;
    struct lm_kv_block *b; /* [n_blocks] */
    int *free;             /* stack of blocks neither held nor indexed */
    int n_free;
    int lru_head, lru_tail, n_cached; /* held by none, indexed: evictable, oldest first */
    int *hash_bucket;                 /* [mask + 1] heads of full-block hash chains, -1 empty */
    int *child_bucket;                /* [mask + 1] heads of parent-hash chains, -1 empty */
    uint64_t mask;
    lm_kv_copy_fn copy;
    void *copy_ctx;
    long long evictions; /* cached blocks taken for new data */
};

/* Sets up `n_blocks` free blocks. `copy` (may be NULL: no partial-block reuse) copies K/V rows
 * between blocks. LM_ERR_NOMEM. Free with lm_kv_free (accepts a zeroed struct). */
lm_status lm_kv_init(struct lm_kv *kv, int n_blocks, lm_kv_copy_fn copy, void *copy_ctx);
void lm_kv_free(struct lm_kv *kv);

/* Blocks that lm_kv_alloc can hand out now: free plus cached. */
int lm_kv_available(const struct lm_kv *kv);
/* Blocks held by at least one sequence. */
int lm_kv_used(const struct lm_kv *kv);

/* A block for new data, held once (ref 1) and not indexed: a free block, else the least recently
 * released cached block (dropped from the index). -1 when every block is held. */
int lm_kv_alloc(struct lm_kv *kv);
/* A block from the free stack only (never evicting a cached one), held once; -1 when none is
 * free. For speculative drafts, which must not cost anyone a cached prefix. */
int lm_kv_alloc_free(struct lm_kv *kv);
/* Drops one hold. At zero an indexed block joins the cached list (most recent end); any other
 * block becomes free. */
void lm_kv_release(struct lm_kv *kv, int block);

/* The chain hash of a block of n tokens after a block of hash `parent`. */
uint64_t lm_kv_hash(uint64_t parent, const int32_t *tokens, int n);

/* Longest reusable prefix of ids[0..limit): whole indexed blocks along the hash chain, then the
 * longest common prefix with an indexed child of the last one (copied into a new private block
 * when `copy` is set and a block can be had). blocks[] receives the blocks (room for
 * ceil(limit / LM_KV_BLOCK)): the shared ones (each held once more) and possibly the private
 * copy. *chain gets the hash of the last whole shared block (LM_KV_ROOT when none). Returns the
 * positions covered: the K/V of ids[0..return) are in blocks[]. */
int lm_kv_match(struct lm_kv *kv, const int32_t *ids, int limit, int32_t *blocks, int *n_blocks,
                uint64_t *chain);
/* The positions lm_kv_match would cover, without taking anything. */
int lm_kv_probe(const struct lm_kv *kv, const int32_t *ids, int limit);

/* Indexes `block` (held by the caller, its LM_KV_BLOCK rows computed from `tokens`) as the
 * child of `parent`. Returns its chain hash. When an equal block is already indexed this one
 * stays private (it is freed on release). */
uint64_t lm_kv_commit(struct lm_kv *kv, int block, uint64_t parent, const int32_t *tokens);
/* Indexes the last, partial block of a sequence that is ending: n (1..15) rows computed from
 * `tokens`. The caller releases it next and never writes it again. */
void lm_kv_commit_partial(struct lm_kv *kv, int block, uint64_t parent, const int32_t *tokens,
                          int n);

#endif
