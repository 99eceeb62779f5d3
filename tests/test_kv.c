/* test_kv.c: the KV block manager (engine/kv.h) on its own: allocation and release counts,
 * prefix matching along the hash chain, token-level reuse of a last block through the copy hook,
 * LRU eviction order, and that equal blocks under different prefixes never match.
 * LM_LINK: lm_engine lm_family lm_format lm_text lm_backend lm_base */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine/kv.h"

struct copies {
    int n, src[64], dst[64], rows[64];
};

static void record_copy(void *ctx, int src, int dst, int n) {
    struct copies *c = ctx;
    if (c->n < 64) {
        c->src[c->n] = src;
        c->dst[c->n] = dst;
        c->rows[c->n] = n;
    }
    c->n++;
}

/* Gives a "sequence" blocks for ids[0..n), indexing full blocks and the partial tail as the
 * scheduler does, then releases them. Returns the hash of the last full block. */
static void run_seq(struct lm_kv *kv, const int32_t *ids, int n) {
    int32_t blocks[64];
    int nb = 0;
    uint64_t chain;
    int have = lm_kv_match(kv, ids, n, blocks, &nb, &chain);
    int indexed = have / LM_KV_BLOCK;
    while (nb * LM_KV_BLOCK < n)
        blocks[nb++] = lm_kv_alloc(kv);
    while ((indexed + 1) * LM_KV_BLOCK <= n) {
        chain = lm_kv_commit(kv, blocks[indexed], chain, ids + indexed * LM_KV_BLOCK);
        indexed++;
    }
    if (n % LM_KV_BLOCK)
        lm_kv_commit_partial(kv, blocks[indexed], chain, ids + indexed * LM_KV_BLOCK,
                             n % LM_KV_BLOCK);
    for (int i = nb - 1; i >= 0; i--)
        lm_kv_release(kv, blocks[i]);
}

int main(void) {
    struct copies cp = {0};
    struct lm_kv kv;
    CHECK(lm_kv_init(&kv, 8, record_copy, &cp) == LM_OK, "init");
    CHECK(lm_kv_available(&kv) == 8 && lm_kv_used(&kv) == 0, "fresh pool");

    /* Allocation order and counts. */
    int a = lm_kv_alloc(&kv), b = lm_kv_alloc(&kv);
    CHECK(a == 0 && b == 1, "fresh blocks in order: %d %d", a, b);
    CHECK(lm_kv_used(&kv) == 2 && lm_kv_available(&kv) == 6, "used 2");
    lm_kv_release(&kv, b);
    lm_kv_release(&kv, a);
    CHECK(lm_kv_used(&kv) == 0 && kv.n_free == 8 && kv.n_cached == 0, "unindexed blocks go free");

    /* A 40-token sequence: 2 full blocks indexed, 8 tokens of a partial one. */
    int32_t ids[80];
    for (int i = 0; i < 80; i++)
        ids[i] = 1000 + i;
    run_seq(&kv, ids, 40);
    CHECK(kv.n_cached == 3 && kv.n_free == 5, "3 cached after the sequence: %d cached %d free",
          kv.n_cached, kv.n_free);
    CHECK(lm_kv_probe(&kv, ids, 40) == 40, "probe covers 40: %d", lm_kv_probe(&kv, ids, 40));
    CHECK(lm_kv_probe(&kv, ids, 39) == 39, "probe with a limit of 39");
    CHECK(lm_kv_probe(&kv, ids, 20) == 20, "probe of a prefix ending inside block 1");

    /* Matching 39 of them: the two full blocks shared, 7 rows of the partial copied. */
    int32_t blocks[8];
    int nb = 0;
    uint64_t chain;
    cp.n = 0;
    int got = lm_kv_match(&kv, ids, 39, blocks, &nb, &chain);
    CHECK(got == 39 && nb == 3, "match 39: %d tokens in %d blocks", got, nb);
    CHECK(kv.b[blocks[0]].ref == 1 && kv.b[blocks[1]].ref == 1, "full blocks held");
    CHECK(cp.n == 1 && cp.rows[0] == 7 && cp.dst[0] == blocks[2] && kv.b[blocks[2]].n_tokens == 0,
          "partial block copied (7 rows) into a private block");
    CHECK(chain == kv.b[blocks[1]].hash, "chain is the second block's hash");
    for (int i = nb - 1; i >= 0; i--)
        lm_kv_release(&kv, blocks[i]);

    /* A different first block with the same second block: nothing matches (hash chain). */
    int32_t other[40];
    memcpy(other, ids, sizeof other);
    other[3] = 7;
    CHECK(lm_kv_probe(&kv, other, 40) == 3, "diverging at token 3: %d",
          lm_kv_probe(&kv, other, 40));
    cp.n = 0;
    got = lm_kv_match(&kv, other, 40, blocks, &nb, &chain);
    CHECK(got == 3 && nb == 1 && cp.n == 1 && cp.rows[0] == 3 && chain == LM_KV_ROOT,
          "token-level reuse of 3 rows of block 0: %d in %d", got, nb);
    for (int i = nb - 1; i >= 0; i--)
        lm_kv_release(&kv, blocks[i]);

    /* Eviction: fill the pool with a new 8-block sequence; the least recent cached go first. */
    int32_t fresh[128];
    for (int i = 0; i < 128; i++)
        fresh[i] = 5000 + i;
    int held[8], n_held = 0;
    for (int i = 0; i < 8; i++) {
        int x = lm_kv_alloc(&kv);
        CHECK(x >= 0, "allocation %d of a full pool with cached blocks", i);
        held[n_held++] = x;
    }
    CHECK(lm_kv_alloc(&kv) == -1, "pool exhausted when every block is held");
    CHECK(kv.evictions == 3 && kv.n_cached == 0, "3 cached blocks evicted: %lld", kv.evictions);
    CHECK(lm_kv_probe(&kv, ids, 40) == 0, "evicted prefix no longer matches");
    for (int i = 0; i < n_held; i++)
        lm_kv_release(&kv, held[i]);
    CHECK(kv.n_free == 8, "all free again");

    /* LRU order: sequence A then B are cached; allocating 6 blocks evicts A's first. */
    run_seq(&kv, ids, 32);   /* A: 2 blocks */
    run_seq(&kv, fresh, 32); /* B: 2 blocks */
    CHECK(kv.n_cached == 4, "A and B cached");
    /* lm_kv_alloc_free takes the 4 free blocks and then stops: it never evicts. */
    long long ev0 = kv.evictions;
    int f[5];
    for (int i = 0; i < 5; i++)
        f[i] = lm_kv_alloc_free(&kv);
    CHECK(f[0] >= 0 && f[1] >= 0 && f[2] >= 0 && f[3] >= 0 && f[4] == -1 && kv.evictions == ev0 &&
              kv.n_cached == 4,
          "alloc_free: %d %d %d %d %d, %lld evictions, %d cached", f[0], f[1], f[2], f[3], f[4],
          kv.evictions - ev0, kv.n_cached);
    for (int i = 0; i < 4; i++)
        lm_kv_release(&kv, f[i]);
    for (int i = 0; i < 5; i++)
        held[i] = lm_kv_alloc(&kv); /* 4 free + 1 evicted: A's tail */
    CHECK(lm_kv_probe(&kv, ids, 32) == 16 && lm_kv_probe(&kv, fresh, 32) == 32,
          "A's tail block evicted first (A %d, B %d)", lm_kv_probe(&kv, ids, 32),
          lm_kv_probe(&kv, fresh, 32));
    for (int i = 0; i < 5; i++)
        lm_kv_release(&kv, held[i]);

    /* Sharing: two holders of one block; it stays used until both release. */
    got = lm_kv_match(&kv, fresh, 32, blocks, &nb, &chain);
    int32_t blocks2[8];
    int nb2;
    got = lm_kv_match(&kv, fresh, 32, blocks2, &nb2, &chain);
    CHECK(got == 32 && nb2 == 2 && blocks2[0] == blocks[0] && kv.b[blocks[0]].ref == 2,
          "shared twice");
    CHECK(lm_kv_used(&kv) == 2, "two blocks used");
    for (int i = 0; i < 2; i++)
        lm_kv_release(&kv, blocks[i]);
    CHECK(lm_kv_used(&kv) == 2, "still held by the second");
    for (int i = 0; i < 2; i++)
        lm_kv_release(&kv, blocks2[i]);
    CHECK(lm_kv_used(&kv) == 0 && lm_kv_available(&kv) == 8, "all released");

    /* Committing a duplicate full block leaves the second copy private (freed on release). */
    int x = lm_kv_alloc(&kv);
    uint64_t h = lm_kv_commit(&kv, x, LM_KV_ROOT, fresh);
    CHECK(h == lm_kv_hash(LM_KV_ROOT, fresh, LM_KV_BLOCK) && kv.b[x].n_tokens == 0,
          "duplicate stays private");
    int free_before = kv.n_free;
    lm_kv_release(&kv, x);
    CHECK(kv.n_free == free_before + 1, "duplicate freed");

    /* Without a copy hook there is no token-level reuse. */
    struct lm_kv plain;
    lm_kv_init(&plain, 4, NULL, NULL);
    run_seq(&plain, ids, 20);
    CHECK(lm_kv_probe(&plain, ids, 20) == 16, "no partial reuse without a copy hook: %d",
          lm_kv_probe(&plain, ids, 20));
    lm_kv_free(&plain);
    lm_kv_free(&kv);
    return check_exit("test_kv");
}
