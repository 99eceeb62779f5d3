/* tokenizer.h: byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json.
 *
 * Pipeline (Hugging Face `tokenizers`, the reference): added tokens are matched in the raw text
 * first (leftmost-longest; special and non-special added tokens alike, unless
 * LM_ENCODE_SPECIAL_AS_TEXT asks to treat special ones as text); each remaining span is NFC
 * normalised (utf8proc), searched for the added tokens marked "normalized", split by the
 * pre-tokenizer's Split regex (PCRE2 with JIT), and merged by BPE rank over the bytes (each
 * byte starts as its ByteLevel single-character token). Decoding maps ids back to bytes.
 * Checked identical to HF tokenizers 0.23.2 on the fixtures and on 10,956 ShareGPT/Spec-Bench/
 * random-Unicode texts.
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

/* Loads tokenizer.json at `path` (the Hugging Face `tokenizers` serialization). *out is
 * caller-owned (lm_tokenizer_destroy). Supported: model BPE (vocab, merges as "a b" strings or
 * [a, b] pairs, ignore_merges, unk_token/fuse_unk); added_tokens with special, lstrip, rstrip,
 * normalized and single_word honoured as HF does; normalizer null, NFC, or a Sequence of NFC;
 * pre_tokenizer a Split (Regex or String pattern, behavior Isolated, invert false), a ByteLevel
 * (add_prefix_space false), or a Sequence of Splits ending in ByteLevel; decoder ByteLevel;
 * post_processor null or ByteLevel. Built through lm_tokenizer_create. Added tokens keep the
 * ids written in the file (HF re-derives them, which gives the same ids for any file HF wrote).
 * Errors: LM_ERR_IO (cannot read; names the path), LM_ERR_FORMAT (bad JSON, or a field of the
 * wrong type: "PATH: model.merges[17] is not a pair of strings"), LM_ERR_UNSUPPORTED (a type or
 * option lumen does not implement, naming the field: "PATH: normalizer.type NFKD is not
 * supported"). */
lm_status lm_tokenizer_load(const char *path, struct lm_tokenizer **out);
void lm_tokenizer_destroy(struct lm_tokenizer *tok); /* accepts NULL */

/* Kinds of ids, for lm_tokenizer_parts. GGUF's tokenizer.ggml.token_type maps onto them:
 * NORMAL(1) -> LM_TOKEN_NORMAL, CONTROL(3) -> LM_TOKEN_SPECIAL, USER_DEFINED(4) -> LM_TOKEN_ADDED,
 * UNUSED(5) -> LM_TOKEN_UNUSED. */
enum lm_token_kind {
    LM_TOKEN_NORMAL = 0,  /* base BPE vocabulary, spelled in the ByteLevel alphabet ("Ġhello") */
    LM_TOKEN_SPECIAL = 1, /* added token, "special": true (<|im_end|>); skip_special drops it */
    LM_TOKEN_ADDED = 2,   /* added token, "special": false (<think>); always matched and decoded */
    LM_TOKEN_UNUSED = 3,  /* an id with no token (vocabulary padding): never produced by encode;
                             decoding it yields nothing, as in HF */
};

/* Matching options of an added token (tokenizer.json added_tokens[i] flags, HF AddedToken). */
enum lm_added_flags {
    LM_ADDED_LSTRIP = 1,      /* the match swallows whitespace on its left */
    LM_ADDED_RSTRIP = 2,      /* the match swallows whitespace on its right */
    LM_ADDED_SINGLE_WORD = 4, /* matched only when not inside a word (no alphanumeric neighbour) */
    LM_ADDED_NORMALIZED = 8,  /* matched in the NFC-normalized text instead of the raw text */
};

/* Everything a byte-level BPE tokenizer is made of, independent of the file it came from
 * (tokenizer.json, or GGUF's tokenizer.ggml.* keys). All pointers are borrowed for the duration
 * of lm_tokenizer_create only; the tokenizer copies what it keeps. */
struct lm_tokenizer_parts {
    /* Names the origin in error messages ("DIR/tokenizer.json", a GGUF path). */
    const char *source;
    /* Field names used in messages about tokens and merges ("model.vocab", "model.merges",
     * "tokenizer.ggml.merges"); NULL gives "tokens" and "merges". */
    const char *tokens_field, *merges_field;
    /* Ids are 0 .. n_tokens-1. tokens[id]: a NUL-terminated UTF-8 string; NORMAL tokens are
     * spelled in the ByteLevel alphabet ("Ġhello"), added tokens as their literal content; a
     * NULL entry is an UNUSED id. */
    size_t n_tokens;
    const char *const *tokens;
    /* [n_tokens] enum lm_token_kind, or NULL for all NORMAL. */
    const uint8_t *kinds;
    /* [n_tokens] enum lm_added_flags (read for added tokens only), or NULL for none. */
    const uint8_t *added_flags;
    /* BPE merges, rank = index (lower ranks merge first). Either merges: [n_merges] "left right"
     * with exactly one space (tokenizer.json's old form, GGUF's tokenizer.ggml.merges), or
     * merge_pairs: [2 * n_merges] left0, right0, left1, ... (for tokens that hold spaces). */
    size_t n_merges;
    const char *const *merges;
    const char *const *merge_pairs;
    /* NFC-normalize (utf8proc) the text between raw-matched added tokens. */
    bool nfc;
    /* Pre-tokenizer: Split steps with behavior Isolated, applied in order; patterns in the
     * Oniguruma syntax of tokenizer.json, compiled with PCRE2 (UTF, UCP, JIT). None: each span
     * between added tokens is one word. */
    size_t n_split_regexes;
    const char *const *split_regexes;
    /* HF BPE ignore_merges: a whole word found in the vocabulary is one id, unmerged. */
    bool ignore_merges;
    /* A NORMAL token standing for bytes that have no single-byte token, or NULL: such bytes are
     * dropped, as HF's BPE does without unk_token. fuse_unk: a run of them gives one. */
    const char *unk_token;
    bool fuse_unk;
};

/* The Split regex of Qwen2/Qwen2.5/Qwen3 tokenizer.json (GGUF tokenizer.ggml.pre "qwen2"). */
#define LM_TOKENIZER_REGEX_QWEN2                                                                   \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"                            \
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* The GPT-2 regex that HF's ByteLevel pre-tokenizer applies when use_regex is true. */
#define LM_TOKENIZER_REGEX_GPT2                                                                    \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

/* The Split regex for a GGUF tokenizer.ggml.pre name ("qwen2", "gpt2"), or NULL if unknown.
 * Borrowed, static. */
const char *lm_tokenizer_pre_regex(const char *gguf_pre);

/* Builds a tokenizer from parts. *out is caller-owned (lm_tokenizer_destroy). A zeroed struct
 * plus tokens/merges is a valid start: no NFC, no pre-tokenizer split, no unk.
 * Errors (message "<source>: <field>[i] ..."): LM_ERR_FORMAT when a merge is not two tokens
 * separated by one space, names a token not in the vocabulary, or yields a token not in the
 * vocabulary (as HF's BPE builder does); when a token string is not valid UTF-8; when
 * unk_token is not a NORMAL token. LM_ERR_UNSUPPORTED when a regex does not compile (message
 * has PCRE2's reason and offset). Duplicate strings keep their first id for lookups.
 * lm_tokenizer_load is implemented through this; a GGUF loader fills the same struct from
 * tokenizer.ggml.{tokens,token_type,merges,pre} (regex: lm_tokenizer_pre_regex). */
lm_status lm_tokenizer_create(const struct lm_tokenizer_parts *parts, struct lm_tokenizer **out);

enum lm_encode_flags {
    LM_ENCODE_SPECIAL_AS_TEXT = 1, /* special-token strings in the text are encoded as plain text */
};

/* Encodes `len` bytes of UTF-8 `text`; ids are appended to `out`. Ill-formed UTF-8 is first
 * replaced by U+FFFD (lossy conversion, as a caller of HF would have to do to get a string).
 * Safe to call from many threads at once. Returns LM_OK; LM_ERR_RANGE only if PCRE2 reports a
 * resource limit on a pathological input (message says so). */
lm_status lm_tokenizer_encode(const struct lm_tokenizer *tok, const char *text, size_t len,
                              unsigned flags, struct lm_ids *out);

/* Decodes ids to UTF-8 text appended to `out`; incomplete or invalid UTF-8 sequences become
 * U+FFFD as in HF's lossy decode (String::from_utf8_lossy: one U+FFFD per maximal subpart).
 * Every token, added ones included, goes through the ByteLevel byte map when all its chars are
 * in that alphabet, as HF's ByteLevel decoder does. skip_special drops special added tokens.
 * Ids with no token (UNUSED, or >= the vocabulary size: models pad their embedding) decode to
 * nothing, as HF drops them. LM_ERR_INVALID (and `out` untouched) for a negative id. */
lm_status lm_tokenizer_decode(const struct lm_tokenizer *tok, const int32_t *ids, size_t n,
                              bool skip_special, struct lm_buf *out);

/* Number of ids (base vocabulary plus added tokens): max id + 1 (151669 for Qwen3, whose
 * models pad the embedding to 151936: ids from 151669 up decode to nothing). */
size_t lm_tokenizer_vocab_size(const struct lm_tokenizer *tok);
/* The id of an exact token string (for example "<|im_end|>", or "Ġhello" for a base token), or
 * -1. Added tokens are looked up first, as HF's token_to_id does. */
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
/* Appends the text that `id` completes to `out` (possibly nothing). LM_ERR_INVALID for a
 * negative id; an id with no token yields nothing. */
lm_status lm_detok_push(struct lm_detok *d, int32_t id, struct lm_buf *out);
/* At end of stream: appends U+FFFD for any held-back incomplete bytes, as HF's decode would.
 * The stream can then be reused. Everything pushed plus flush equals lm_tokenizer_decode of the
 * whole sequence (ill-formed bytes become U+FFFD as soon as they are known to be ill-formed). */
void lm_detok_flush(struct lm_detok *d, struct lm_buf *out);

#endif
