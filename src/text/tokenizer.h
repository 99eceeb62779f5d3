/* tokenizer.h: byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json.
 *
 * Pipeline (Hugging Face `tokenizers`, the reference): added tokens are matched in the raw text
 * first (longest match; special and non-special added tokens alike, unless
 * LM_ENCODE_SPECIAL_AS_TEXT asks to treat special ones as text); each remaining span is NFC
 * normalised (utf8proc), split by the pre-tokenizer's Split regex (PCRE2 with JIT), mapped to
 * the ByteLevel alphabet, and merged by BPE rank. Decoding maps ids back to bytes.
 *
 * A tokenizer is immutable after load and safe to use from many threads at once. */
#ifndef LM_TEXT_TOKENIZER_H
#define LM_TEXT_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/status.h"

struct lm_tokenizer;

/* Loads tokenizer.json at `path`. *out is caller-owned (lm_tokenizer_destroy).
 * LM_ERR_IO / LM_ERR_FORMAT / LM_ERR_UNSUPPORTED with a message naming the file and field. */
lm_status lm_tokenizer_load(const char *path, struct lm_tokenizer **out);
void lm_tokenizer_destroy(struct lm_tokenizer *tok);

enum lm_encode_flags {
    LM_ENCODE_SPECIAL_AS_TEXT = 1, /* special-token strings in the text are encoded as plain text */
};

/* Encodes `len` bytes of UTF-8 `text`; ids are appended to `out`. Invalid UTF-8 is encoded
 * byte-wise like HF does after lossy conversion. Returns LM_OK. */
lm_status lm_tokenizer_encode(const struct lm_tokenizer *tok, const char *text, size_t len,
                              unsigned flags, struct lm_ids *out);

/* Decodes ids to UTF-8 text appended to `out`; incomplete or invalid UTF-8 sequences become
 * U+FFFD as in HF's lossy decode. skip_special drops special added tokens.
 * LM_ERR_INVALID when an id is outside the vocabulary. */
lm_status lm_tokenizer_decode(const struct lm_tokenizer *tok, const int32_t *ids, size_t n,
                              bool skip_special, struct lm_buf *out);

/* Number of ids (base vocabulary plus added tokens): max id + 1. */
size_t lm_tokenizer_vocab_size(const struct lm_tokenizer *tok);
/* The id of an exact token string (for example "<|im_end|>"), or -1. */
int32_t lm_tokenizer_token_id(const struct lm_tokenizer *tok, const char *token);
/* True when `id` is a special added token ("special": true in tokenizer.json). */
bool lm_tokenizer_is_special(const struct lm_tokenizer *tok, int32_t id);

/* Streaming detokenizer: feed ids one at a time, receive only complete UTF-8 characters.
 * Bytes of a character that spans several tokens are held back until the character completes.
 * The tokenizer is borrowed and must outlive the stream. */
struct lm_detok {
    const struct lm_tokenizer *tok;
    bool skip_special;
    unsigned char pending[8]; /* bytes of an incomplete UTF-8 character */
    size_t n_pending;
};

void lm_detok_init(struct lm_detok *d, const struct lm_tokenizer *tok, bool skip_special);
/* Appends the text that `id` completes to `out` (possibly nothing). LM_ERR_INVALID on a bad id. */
lm_status lm_detok_push(struct lm_detok *d, int32_t id, struct lm_buf *out);
/* At end of stream: appends U+FFFD for any held-back incomplete bytes, as HF's decode would. */
void lm_detok_flush(struct lm_detok *d, struct lm_buf *out);

#endif
