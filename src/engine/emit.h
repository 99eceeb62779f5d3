/* emit.h: the text side of one generated sequence: ids -> released text, with stop strings.
 *
 * Ids go through the streaming detokenizer (special tokens skipped, as vLLM's
 * skip_special_tokens default) into a held-back buffer; what is released is the held text minus
 * its longest suffix that is still a proper prefix of some stop string (the stop-sequence
 * handling of vLLM's and TGI's incremental detokenizers), cut back to whole UTF-8 characters. A
 * stop string found in the held text ends the sequence: the text before it is released and
 * nothing else. Every released piece is complete UTF-8; it is appended to `text` and passed to
 * the callback, so the callback's pieces concatenate to `text`.
 *
 * Shared by lm_generate (one sequence) and the scheduler (many), so a request streams the same
 * text either way. */
#ifndef LM_ENGINE_EMIT_H
#define LM_ENGINE_EMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/status.h"
#include "text/tokenizer.h"

/* Called with each piece of newly released text (complete UTF-8). Return false to cancel. */
typedef bool (*lm_gen_text_fn)(void *ctx, const char *text, size_t len);

struct lm_emitter {
    const char *const *stop; /* borrowed stop strings (empty ones are ignored) */
    size_t n_stop;
    struct lm_detok detok;
    size_t n_tok;           /* ids at or past this have no text (embedding padding) */
    struct lm_buf held;     /* detokenized text not yet released (owned) */
    struct lm_buf *text;    /* released text accumulates here (borrowed) */
    lm_gen_text_fn on_text; /* may be NULL */
    void *ctx;
    bool cancelled; /* the callback returned false */
};

/* `tok`, `stop` and `text` are borrowed for the emitter's life. `tok` may be NULL (a model opened
 * without a tokenizer): then no id has text and nothing is released. */
void lm_emitter_init(struct lm_emitter *e, const struct lm_tokenizer *tok, const char *const *stop,
                     size_t n_stop, struct lm_buf *text, lm_gen_text_fn on_text, void *ctx);
void lm_emitter_free(struct lm_emitter *e); /* accepts a zeroed struct */

/* Feeds one generated id (not an EOS that ends the sequence). *stopped is set when a stop string
 * now appears: the text before it has been released and the sequence must end. Errors from the
 * detokenizer (LM_ERR_INVALID for a negative id). */
lm_status lm_emitter_push(struct lm_emitter *e, int32_t id, bool *stopped);

/* The sequence ended at EOS or its length limit: incomplete bytes become U+FFFD (as a
 * whole-sequence decode gives), then a last stop check, then everything held is released.
 * Returns true when a stop string was found in that last text. */
bool lm_emitter_finish(struct lm_emitter *e);

#endif
