/* emit.c: see emit.h. */
#include "engine/emit.h"

#include <string.h>

void lm_emitter_init(struct lm_emitter *e, const struct lm_tokenizer *tok, const char *const *stop,
                     size_t n_stop, struct lm_buf *text, lm_gen_text_fn on_text, void *ctx) {
    memset(e, 0, sizeof *e);
    e->stop = stop;
    e->n_stop = stop ? n_stop : 0;
    lm_detok_init(&e->detok, tok, true);
    e->n_tok = tok ? lm_tokenizer_vocab_size(tok) : 0; /* no tokenizer: no id has text */
    e->text = text;
    e->on_text = on_text;
    e->ctx = ctx;
}

void lm_emitter_free(struct lm_emitter *e) {
    if (!e) return;
    lm_buf_free(&e->held);
}

/* Releases held[0..n) to the text and the callback, and drops it from `held`. */
static void release(struct lm_emitter *e, size_t n) {
    if (n == 0) return;
    lm_buf_append(e->text, e->held.p, n);
    if (e->on_text && !e->cancelled && !e->on_text(e->ctx, e->held.p, n)) e->cancelled = true;
    memmove(e->held.p, e->held.p + n, e->held.len - n);
    e->held.len -= n;
    e->held.p[e->held.len] = 0;
}

/* Offset of the earliest stop string in `held`, or -1. */
static long find_stop(const struct lm_emitter *e) {
    long best = -1;
    for (size_t i = 0; i < e->n_stop; i++) {
        const char *s = e->stop[i];
        size_t n = s ? strlen(s) : 0;
        if (n == 0 || e->held.len < n) continue;
        const char *hit = memmem(e->held.p, e->held.len, s, n);
        if (hit && (best < 0 || hit - e->held.p < best)) best = hit - e->held.p;
    }
    return best;
}

/* Length of the longest suffix of `held` that is a proper prefix of some stop string. */
static size_t partial_stop(const struct lm_emitter *e) {
    size_t keep = 0;
    for (size_t i = 0; i < e->n_stop; i++) {
        const char *s = e->stop[i];
        size_t n = s ? strlen(s) : 0;
        size_t k = n - (n > 0); /* proper prefix: at most n - 1 bytes */
        if (k > e->held.len) k = e->held.len;
        for (; k > keep; k--)
            if (!memcmp(e->held.p + e->held.len - k, s, k)) {
                keep = k;
                break;
            }
    }
    return keep;
}

lm_status lm_emitter_push(struct lm_emitter *e, int32_t id, bool *stopped) {
    *stopped = false;
    /* An id with no token (the embedding's padding past the tokenizer's vocabulary) has no
     * text, as HF's decode skips ids it cannot map; the model can still sample one. */
    if (id < (int32_t)e->n_tok) {
        lm_status rc = lm_detok_push(&e->detok, id, &e->held);
        if (rc) return rc;
    }
    long stop = find_stop(e);
    if (stop >= 0) {
        release(e, (size_t)stop);
        *stopped = true;
        return LM_OK;
    }
    size_t n = e->held.len - partial_stop(e);
    while (n > 0 && ((unsigned char)e->held.p[n] & 0xC0) == 0x80)
        n--; /* whole characters */
    release(e, n);
    return LM_OK;
}

bool lm_emitter_finish(struct lm_emitter *e) {
    lm_detok_flush(&e->detok, &e->held);
    long stop = find_stop(e);
    release(e, stop >= 0 ? (size_t)stop : e->held.len);
    return stop >= 0;
}
