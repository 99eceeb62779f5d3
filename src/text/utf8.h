/* utf8.h: UTF-8 validation with Rust's (and the Unicode Standard's) "maximal subpart" rule for
 * lossy decoding, and GPT-2's ByteLevel byte <-> code point alphabet.
 *
 * Lossy decoding replaces each maximal subpart of an ill-formed sequence with one U+FFFD, as
 * Rust's String::from_utf8_lossy does (Unicode 15, section 3.9, "U+FFFD Substitution of Maximal
 * Subparts"); Hugging Face `tokenizers` decodes byte-level tokens that way. */
#ifndef LM_TEXT_UTF8_H
#define LM_TEXT_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"

/* Classifies the sequence starting at p[0] (n >= 1 bytes available):
 *   > 0  a well-formed character of that many bytes;
 *   0    a well-formed but incomplete prefix that runs to the end of the n bytes;
 *   < 0  ill-formed: -k bytes form the maximal subpart to replace with one U+FFFD (k >= 1). */
int lm_utf8_check(const unsigned char *p, size_t n);

/* Length of the longest prefix of p[0..n) that is well-formed UTF-8 (n when all of it is). */
size_t lm_utf8_valid_prefix(const unsigned char *p, size_t n);

/* Appends p[0..n) to `out` with ill-formed subparts replaced by U+FFFD (EF BF BD). When `final`
 * is false, a well-formed but incomplete character at the very end is not consumed. Returns the
 * number of bytes consumed (n when `final`). */
size_t lm_utf8_lossy(const unsigned char *p, size_t n, bool final, struct lm_buf *out);

/* Decodes one code point from well-formed UTF-8 at p (n bytes available); *len gets its length.
 * Returns -1 (and *len = 1) when the bytes at p are not a well-formed character. */
int32_t lm_utf8_decode(const unsigned char *p, size_t n, int *len);

/* Writes code point `cp` (< 0x110000) as UTF-8 to dst (4 bytes of room); returns the length. */
int lm_utf8_encode(uint32_t cp, unsigned char *dst);

/* GPT-2 bytes_to_unicode (openai/gpt-2 encoder.py): the code point that stands for byte b in
 * the ByteLevel alphabet. Printable Latin-1 bytes map to themselves, the others to 256 + k. */
uint32_t lm_bytelevel_char(unsigned char b);
/* The inverse: the byte that code point `cp` stands for, or -1 if `cp` is not in the alphabet. */
int lm_bytelevel_byte(uint32_t cp);

#endif
