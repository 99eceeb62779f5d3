/* generate.c: see generate.h.
 *
 * The loop: prefill the prompt (last-position logits only), then sample, stop-check, stream and
 * forward one token at a time. Text goes through the streaming detokenizer (special tokens
 * skipped, as vLLM's skip_special_tokens default) into a held-back buffer; what is released is
 * the held text minus its longest suffix that is still a proper prefix of some stop string
 * (the stop-sequence handling of vLLM's and TGI's incremental detokenizers). A stop string
 * found in the held text ends the request: the text before it is released and nothing else.
 * Every released piece is complete UTF-8 and is appended to result.text as it is passed to the
 * callback, so the callback's pieces concatenate to result.text. */
#include "engine/generate.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *lm_finish_name(enum lm_finish f) {
    switch (f) {
    case LM_FINISH_STOP: return "stop";
    case LM_FINISH_LENGTH: return "length";
    case LM_FINISH_CANCELLED: return "cancelled";
    case LM_FINISH_NONE: break;
    }
    return "";
}

void lm_gen_result_free(struct lm_gen_result *r) {
    if (!r) return;
    lm_ids_free(&r->ids);
    lm_buf_free(&r->text);
    memset(r, 0, sizeof *r);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* State of the text side of one request. */
struct stream {
    const struct lm_gen_request *req;
    lm_gen_text_fn on_text;
    void *ctx;
    struct lm_buf held;       /* detokenized text not yet released */
    struct lm_gen_result *out;
    bool cancelled;           /* the callback returned false */
};

/* Releases held[0..n) to the result and the callback, and drops it from `held`. */
static void release(struct stream *st, size_t n) {
    if (n == 0) return;
    lm_buf_append(&st->out->text, st->held.p, n);
    if (st->on_text && !st->cancelled && !st->on_text(st->ctx, st->held.p, n)) st->cancelled = true;
    memmove(st->held.p, st->held.p + n, st->held.len - n);
    st->held.len -= n;
    st->held.p[st->held.len] = 0;
}

/* Offset of the earliest stop string in `held`, or -1. */
static long find_stop(const struct stream *st) {
    long best = -1;
    for (size_t i = 0; i < st->req->n_stop; i++) {
        const char *s = st->req->stop[i];
        size_t n = s ? strlen(s) : 0;
        if (n == 0 || st->held.len < n) continue;
        const char *hit = memmem(st->held.p, st->held.len, s, n);
        if (hit && (best < 0 || hit - st->held.p < best)) best = hit - st->held.p;
    }
    return best;
}

/* Length of the longest suffix of `held` that is a proper prefix of some stop string. */
static size_t partial_stop(const struct stream *st) {
    size_t keep = 0;
    for (size_t i = 0; i < st->req->n_stop; i++) {
        const char *s = st->req->stop[i];
        size_t n = s ? strlen(s) : 0;
        size_t k = n - (n > 0); /* proper prefix: at most n - 1 bytes */
        if (k > st->held.len) k = st->held.len;
        for (; k > keep; k--)
            if (!memcmp(st->held.p + st->held.len - k, s, k)) {
                keep = k;
                break;
            }
    }
    return keep;
}

/* After new text arrived in `held`: returns true when a stop string ended the request. */
static bool pump(struct stream *st) {
    long stop = find_stop(st);
    if (stop >= 0) {
        release(st, (size_t)stop);
        return true;
    }
    size_t n = st->held.len - partial_stop(st);
    while (n > 0 && ((unsigned char)st->held.p[n] & 0xC0) == 0x80) n--; /* whole characters */
    release(st, n);
    return false;
}

lm_status lm_generate(struct lm_model *m, struct lm_seq *seq, const struct lm_gen_request *req,
                      lm_gen_text_fn on_text, void *ctx, struct lm_gen_result *out) {
    memset(out, 0, sizeof *out);
    out->prompt_tokens = (int)req->n_prompt;
    if (req->n_prompt == 0) return lm_errorf(LM_ERR_INVALID, "prompt: no tokens");
    if (req->max_tokens <= 0)
        return lm_errorf(LM_ERR_INVALID, "max_tokens: %d is not positive", req->max_tokens);
    const int cap = lm_seq_capacity(seq);
    if (req->n_prompt > (size_t)cap || (size_t)req->max_tokens > (size_t)cap - req->n_prompt)
        return lm_errorf(LM_ERR_RANGE,
                         "prompt (%zu tokens) + max_tokens (%d) = %zu exceeds the context of "
                         "%d tokens",
                         req->n_prompt, req->max_tokens, req->n_prompt + (size_t)req->max_tokens, cap);

    const struct lm_gen_defaults *gd = lm_model_gen_defaults(m);
    const int vocab = lm_model_config(m)->vocab_size;
    float *logits = malloc((size_t)vocab * sizeof *logits);
    if (!logits) return lm_errorf(LM_ERR_NOMEM, "logits: cannot allocate %d floats", vocab);
    struct lm_sampler sampler;
    lm_sampler_init(&sampler, vocab);
    struct lm_rng rng;
    if (req->sampling.seeded) {
        lm_rng_seed(&rng, req->sampling.seed);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        lm_rng_seed(&rng, (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^
                              (uint64_t)(uintptr_t)out);
    }
    struct lm_detok detok;
    lm_detok_init(&detok, lm_model_tokenizer(m), true);
    const size_t n_tok = lm_tokenizer_vocab_size(lm_model_tokenizer(m));
    struct stream st = {.req = req, .on_text = on_text, .ctx = ctx, .out = out};

    bool stop_string = false;
    lm_seq_truncate(seq, 0);
    double t0 = now_s();
    lm_status rc = lm_seq_forward(seq, req->prompt, (int)req->n_prompt, logits, false);
    double t1 = now_s();
    out->prefill_s = t1 - t0;

    while (rc == LM_OK) {
        if (req->cancel && atomic_load(req->cancel)) {
            out->finish = LM_FINISH_CANCELLED;
            break;
        }
        int32_t id = lm_sample(&sampler, logits, &req->sampling, &rng);
        bool eos = false;
        for (int i = 0; i < gd->n_eos; i++) eos |= id == gd->eos_token_ids[i];
        if (eos && !req->ignore_eos) {
            out->finish = LM_FINISH_STOP;
            break;
        }
        lm_ids_push(&out->ids, id);
        out->completion_tokens++;
        /* An id with no token (the embedding's padding past the tokenizer's vocabulary) has no
         * text, as HF's decode skips ids it cannot map; the model can still sample one. */
        if (id < (int32_t)n_tok && (rc = lm_detok_push(&detok, id, &st.held))) break;
        if (pump(&st)) {
            out->finish = LM_FINISH_STOP;
            stop_string = true;
            break;
        }
        if (st.cancelled) {
            out->finish = LM_FINISH_CANCELLED;
            break;
        }
        if (out->completion_tokens == req->max_tokens) {
            out->finish = LM_FINISH_LENGTH;
            break;
        }
        rc = lm_seq_forward(seq, &id, 1, logits, false);
    }
    out->decode_s = now_s() - t1;

    /* End of stream at EOS or max_tokens: incomplete bytes become U+FFFD (as a whole-sequence
     * decode gives), then a last stop check, then everything held is released. After a stop
     * string or a cancellation the held text is dropped. */
    if (rc == LM_OK && !stop_string && out->finish != LM_FINISH_CANCELLED) {
        lm_detok_flush(&detok, &st.held);
        long stop = find_stop(&st);
        if (stop >= 0) out->finish = LM_FINISH_STOP;
        release(&st, stop >= 0 ? (size_t)stop : st.held.len);
    }
    lm_buf_free(&st.held);
    lm_sampler_free(&sampler);
    free(logits);
    return rc;
}
