/* generate.c: see generate.h.
 *
 * The loop: prefill the prompt (last-position logits only), then sample, stop-check, stream and
 * forward one token at a time. The text side (detokenizer, stop strings held back until they
 * cannot match) is the emitter of emit.h, which the scheduler uses as well. */
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
    lm_logprob_list_free(&r->logprobs);
    memset(r, 0, sizeof *r);
}

double lm_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + 1e-6 * (double)ts.tv_nsec;
}

lm_status lm_generate(struct lm_model *m, struct lm_seq *seq, const struct lm_gen_request *req,
                      lm_gen_text_fn on_text, void *ctx, struct lm_gen_result *out) {
    memset(out, 0, sizeof *out);
    out->times.arrival_ms = lm_now_ms();
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

    const struct lm_spec_params *spec =
        req->spec && req->spec->num_speculative_tokens > 0 ? req->spec : NULL;
    if (spec) {
        lm_status sc = lm_spec_check(spec);
        if (sc) return sc;
    }
    const struct lm_gen_defaults *gd = lm_model_gen_defaults(m);
    const int vocab = lm_model_config(m)->vocab_size;
    const int rows = 1 + (spec ? spec->num_speculative_tokens : 0);
    float *logits = malloc((size_t)vocab * (size_t)rows * sizeof *logits);
    /* Speculation: the prompt and the ids so far, contiguous, for the proposer. */
    int32_t *hist_ids = spec ? malloc(sizeof(int32_t) * (req->n_prompt + (size_t)req->max_tokens)) : NULL;
    if (!logits || (spec && !hist_ids)) {
        free(logits);
        free(hist_ids);
        return lm_errorf(LM_ERR_NOMEM, "logits: cannot allocate %d x %d floats", rows, vocab);
    }
    if (spec) memcpy(hist_ids, req->prompt, sizeof(int32_t) * req->n_prompt);
    int32_t feed[1 + LM_SPEC_MAX_TOKENS];
    struct lm_spec_index idx = {0}; /* hist_ids indexed for the proposer */
    int n_draft = 0, row = 0; /* the draft the last step verified; the logits row to sample */
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
    struct lm_emitter em;
    lm_emitter_init(&em, lm_model_tokenizer(m), req->stop, req->n_stop, &out->text, on_text, ctx);

    bool stop_string = false;
    lm_seq_truncate(seq, 0);
    out->times.scheduled_ms = lm_now_ms();
    lm_status rc = lm_seq_forward(seq, req->prompt, (int)req->n_prompt, logits, false);

    while (rc == LM_OK) {
        if (req->cancel && atomic_load(req->cancel)) {
            out->finish = LM_FINISH_CANCELLED;
            break;
        }
        /* penalties see the prompt and the ids so far; logprobs come from the raw logits */
        struct lm_token_history hist = {req->prompt, req->n_prompt, out->ids.v, out->ids.n};
        struct lm_token_logprob lp;
        int32_t id = lm_sample_next(&sampler, logits + (size_t)row * vocab, &req->sampling, &hist,
                                    &rng, req->sampling.logprobs ? &lp : NULL);
        /* The draft token fed after this row was the model's own: its K/V and the next row's
         * logits stand. Counted before the checks below end the loop. */
        const bool match = row < n_draft && id == feed[1 + row];
        out->accepted_tokens += match;
        if (!out->times.first_token_ms) out->times.first_token_ms = lm_now_ms();
        bool eos = false;
        for (int i = 0; i < gd->n_eos; i++) eos |= id == gd->eos_token_ids[i];
        if (eos && !req->ignore_eos) {
            out->finish = LM_FINISH_STOP;
            break;
        }
        lm_ids_push(&out->ids, id);
        if (req->sampling.logprobs) lm_logprob_list_push(&out->logprobs, &lp);
        out->completion_tokens++;
        if (hist_ids) hist_ids[req->n_prompt + (size_t)out->completion_tokens - 1] = id;
        if ((rc = lm_emitter_push(&em, id, &stop_string))) break;
        if (stop_string) {
            out->finish = LM_FINISH_STOP;
            break;
        }
        if (em.cancelled) {
            out->finish = LM_FINISH_CANCELLED;
            break;
        }
        if (out->completion_tokens == req->max_tokens) {
            out->finish = LM_FINISH_LENGTH;
            break;
        }
        if (match) {
            row++;
            continue;
        }
        feed[0] = id;
        int nd = 0;
        if (spec) {
            /* Drop the K/V of the rejected draft positions (past the last accepted one), then
             * propose the next draft after everything generated so far. */
            lm_seq_truncate(seq, (int)req->n_prompt + out->completion_tokens - 1);
            int room = req->max_tokens - out->completion_tokens - 1;
            int cap_left = lm_seq_capacity(seq) - lm_seq_len(seq) - 1;
            const int n_hist = (int)req->n_prompt + out->completion_tokens;
            if (room > lm_model_max_run(m) - 1) room = lm_model_max_run(m) - 1;
            if (!lm_spec_index_extend(&idx, hist_ids, n_hist))
                nd = lm_spec_propose_indexed(spec, &idx, hist_ids, n_hist,
                                             room < cap_left ? room : cap_left, feed + 1);
            out->draft_tokens += nd;
        }
        n_draft = nd;
        row = 0;
        rc = lm_seq_forward(seq, feed, 1 + nd, logits, nd > 0);
    }
    out->times.finish_ms = lm_now_ms();
    if (!out->times.first_token_ms) out->times.first_token_ms = out->times.finish_ms;
    out->prefill_s = (out->times.first_token_ms - out->times.scheduled_ms) / 1e3;
    out->decode_s = (out->times.finish_ms - out->times.first_token_ms) / 1e3;

    /* End of stream at EOS or max_tokens: flush and release what is held. After a stop string
     * or a cancellation the held text is dropped. */
    if (rc == LM_OK && !stop_string && out->finish != LM_FINISH_CANCELLED && lm_emitter_finish(&em))
        out->finish = LM_FINISH_STOP;
    lm_emitter_free(&em);
    lm_sampler_free(&sampler);
    free(logits);
    free(hist_ids);
    lm_spec_index_free(&idx);
    return rc;
}
