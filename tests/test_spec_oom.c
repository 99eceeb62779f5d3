/* test_spec_oom.c: lm_spec_index after an allocation fails in the middle of
 * lm_spec_index_extend. The index must stay consistent (every position's previous occurrence
 * earlier than itself), a later call (the scheduler retries at its next step) must finish it,
 * and the proposer must then return what it returns on an index built without the failure.
 * (An index that forgot how far it got re-inserted positions on the retry, made a cycle in the
 * chains, and the proposer never returned.)
 *
 * The failure comes from a malloc of one chosen size, through glibc's __libc_malloc; skipped
 * (77) under AddressSanitizer, which owns malloc.
 * LM_LINK: lm_engine lm_base */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine/spec.h"

#if defined(__SANITIZE_ADDRESS__)
#define LM_SKIP_OOM 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LM_SKIP_OOM 1
#endif
#endif

#ifndef LM_SKIP_OOM
extern void *__libc_malloc(size_t n);
static size_t g_fail_size; /* the next malloc of this many bytes returns NULL */
void *malloc(size_t n) {
    if (g_fail_size && n == g_fail_size) {
        g_fail_size = 0;
        return NULL;
    }
    return __libc_malloc(n);
}

/* Every chain strictly increasing within the indexed positions, and every link to the same
 * token value. */
static bool consistent(const struct lm_spec_index *x, const int32_t *t) {
    for (int i = 0; i < x->n; i++)
        if (x->next[i] >= x->n || (x->next[i] >= 0 && (x->next[i] <= i || t[x->next[i]] != t[i])))
            return false;
    return true;
}
#endif

int main(void) {
#ifdef LM_SKIP_OOM
    return 77;
#else
    enum { N = 301 };
    int32_t t[N];
    for (int i = 0; i < N; i++)
        t[i] = (int32_t)((i * 7) % 200); /* 200 values, then repeats: the table outgrows 256 slots */
    struct lm_spec_params p = {4, 3, 1, 0};

    struct lm_spec_index ref = {0};
    CHECK(lm_spec_index_extend(&ref, t, N) == LM_OK, "reference index");
    int32_t want[LM_SPEC_MAX_TOKENS], got[LM_SPEC_MAX_TOKENS];
    const int wn = lm_spec_propose_indexed(&p, &ref, t, N, 4, want);
    CHECK(wn > 0, "the reference proposes a draft: %d", wn);

    struct lm_spec_index x = {0};
    g_fail_size = 512 * sizeof(int32_t); /* the rehash from 256 to 512 slots */
    lm_status rc = lm_spec_index_extend(&x, t, N);
    CHECK(rc == LM_ERR_NOMEM, "the failed rehash is reported: %d", rc);
    CHECK(x.n > 0 && x.n < N && consistent(&x, t), "indexed up to the failure, consistently: n %d",
          x.n);
    CHECK(lm_spec_propose_indexed(&p, &x, t, N, 4, got) == 0, "a partial index proposes nothing");
    rc = lm_spec_index_extend(&x, t, N);
    CHECK(rc == LM_OK && x.n == N && consistent(&x, t), "the retry finishes it: rc %d, n %d", rc, x.n);
    CHECK(!memcmp(x.next, ref.next, sizeof *x.next * N), "the same chains as without the failure");
    const int gn = lm_spec_propose_indexed(&p, &x, t, N, 4, got);
    CHECK(gn == wn && !memcmp(got, want, sizeof *got * (size_t)wn), "the same draft: %d vs %d", gn, wn);
    lm_spec_index_free(&x);
    lm_spec_index_free(&ref);
    return check_exit("test_spec_oom");
#endif
}
