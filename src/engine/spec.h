/* spec.h: speculative decoding: the draft proposer (n-gram prompt lookup) and its settings.
 *
 * Speculative decoding (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
 * Decoding"; Chen et al. 2023, "Accelerating Large Language Model Decoding with Speculative
 * Sampling") runs a sequence's last token plus k proposed ("draft") tokens through the model in
 * one forward step and keeps the longest prefix of the draft the model agrees with, plus one
 * token of its own: 1 to k + 1 tokens a step for the weight reads of one.
 *
 * The proposer here is n-gram prompt lookup (Saxena 2023, "Prompt Lookup Decoding"; vLLM's
 * speculative method "ngram"): find the earliest occurrence of the sequence's last n tokens (n
 * from prompt_lookup_max down to prompt_lookup_min) earlier in its own prompt and output, and
 * propose the tokens that followed it. It needs no second model, so it works on any checkpoint,
 * and pays where the output repeats its input (summaries, code edits, retrieval answers, quoted
 * text, multi-turn chat that echoes earlier turns).
 *
 * Verification (engine/sched.c) is exact. A proposal is a single token d (a one-hot draft
 * distribution q), and speculative sampling's rule for it (accept d with probability
 * min(1, p(d) / q(d)) = p(d); on rejection draw from norm(max(0, p - q)), which is p without d)
 * is the same as drawing the token from the model's p as plain decoding would and accepting d
 * when the draw equals it. The scheduler does exactly that, with the draw plain decoding would
 * make for that token (the same RNG state, or on the device the same (seed, token index)), so a
 * request's tokens are the same with speculation on or off, greedy or sampled, as long as the
 * forward gives a row the same logits in a multi-token step as alone (family/model.h's batch
 * invariance). */
#ifndef LM_ENGINE_SPEC_H
#define LM_ENGINE_SPEC_H

#include <stdint.h>

#include "base/status.h"

#define LM_SPEC_MAX_TOKENS 15 /* the most draft tokens a step may verify per sequence */

/* vLLM's speculative_config keys (method "ngram"). A zeroed struct is "off". */
struct lm_spec_params {
    int num_speculative_tokens; /* draft tokens proposed per step, 0 (off) .. LM_SPEC_MAX_TOKENS */
    int prompt_lookup_max;      /* longest n-gram matched, >= prompt_lookup_min */
    int prompt_lookup_min;      /* shortest n-gram matched, >= 1 */
    int disable_by_batch_size;  /* no drafts in a step of more than this many sequences (vLLM's
                                   key; where verification rows cost more than they save);
                                   0 = never disabled */
};

/* Defaults when a key is not given, vLLM's rules: neither lookup key: both 5; one of them: the
 * other takes its value. */
#define LM_SPEC_DEFAULT_LOOKUP 5

/* Checks p (off is valid). LM_ERR_INVALID naming the key and its range. */
lm_status lm_spec_check(const struct lm_spec_params *p);

/* Parses a vLLM-style speculative config, e.g. {"method": "ngram", "num_speculative_tokens": 4,
 * "prompt_lookup_max": 4, "prompt_lookup_min": 2, "disable_by_batch_size": 32}, into *out
 * (missing lookup keys as above; a key set to null counts as missing, as vLLM's None).
 * LM_ERR_INVALID names the key: malformed JSON, a duplicated key, a missing method or one other
 * than "ngram" (lumen has no draft-model method), num_speculative_tokens missing or outside
 * 1..LM_SPEC_MAX_TOKENS (vLLM requires it positive: leave the config out for no speculation), an
 * unknown key, a value out of range. */
lm_status lm_spec_parse(const char *json, struct lm_spec_params *out);

/* An index of a growing token history (vocabulary ids, >= 0) for lm_spec_propose_indexed: for
 * each position, the next position holding the same token (a chain per token value, earliest
 * first, through a hash table of the values seen), so a proposal visits only the earlier
 * occurrences of the last token, not the whole history. Zero-initialise; owned,
 * lm_spec_index_free releases it. */
struct lm_spec_index {
    int32_t *next; /* [cap] next position with the same token, -1 for none yet */
    int n, cap;    /* positions indexed */
    int32_t *key, *first, *last; /* [hcap] open addressing: token value (-1 empty) -> its earliest
                                    and latest position */
    int hcap, hn;
};

/* Indexes tokens[index->n .. n) (the history only grows; tokens[0 .. index->n) must be what was
 * indexed before). LM_ERR_NOMEM, with index->n at the positions indexed so far: the index stays
 * consistent, and a later call goes on from there. */
lm_status lm_spec_index_extend(struct lm_spec_index *x, const int32_t *tokens, int n);
void lm_spec_index_free(struct lm_spec_index *x); /* accepts a zeroed struct */

/* Proposes up to min(max_draft, num_speculative_tokens) tokens to follow tokens[0..n), which x
 * must index exactly: for n-gram sizes g = prompt_lookup_max down to prompt_lookup_min (and
 * g < n), the earliest start j < n - g with tokens[j..j+g) == tokens[n-g..n) gives
 * draft[i] = tokens[j + g + i] for i < max_draft while j + g + i < n (vLLM's ngram proposer:
 * the longest match, the earliest among equals). Returns the number written (0: no match).
 * tokens are borrowed; draft may point just past them (tokens + n). Time proportional to the
 * earlier occurrences of tokens[n - 1] at most (the walk stops at the first match of
 * prompt_lookup_max tokens), not to n. */
int lm_spec_propose_indexed(const struct lm_spec_params *p, const struct lm_spec_index *x,
                            const int32_t *tokens, int n, int max_draft, int32_t *draft);

#endif
