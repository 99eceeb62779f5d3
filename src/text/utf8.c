/* utf8.c: see utf8.h. */
#include "text/utf8.h"

#include <string.h>

int lm_utf8_check(const unsigned char *p, size_t n) {
    unsigned b0 = p[0];
    if (b0 < 0x80) return 1;
    int need;
    unsigned lo = 0x80, hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        need = 1;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        need = 2;
        if (b0 == 0xE0) lo = 0xA0;
        if (b0 == 0xED) hi = 0x9F; /* no surrogates */
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        need = 3;
        if (b0 == 0xF0) lo = 0x90;
        if (b0 == 0xF4) hi = 0x8F; /* nothing above U+10FFFF */
    } else {
        return -1; /* a continuation byte, C0, C1 or F5..FF */
    }
    for (int j = 1; j <= need; j++) {
        if ((size_t)j >= n) return 0;
        unsigned b = p[j];
        if (j > 1) lo = 0x80, hi = 0xBF;
        if (b < lo || b > hi) return -j;
    }
    return need + 1;
}

size_t lm_utf8_valid_prefix(const unsigned char *p, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        int r = lm_utf8_check(p + i, n - i);
        if (r <= 0) break;
        i += (size_t)r;
    }
    return i;
}

size_t lm_utf8_lossy(const unsigned char *p, size_t n, bool final, struct lm_buf *out) {
    static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    size_t i = 0;
    while (i < n) {
        size_t ok = lm_utf8_valid_prefix(p + i, n - i);
        if (ok) lm_buf_append(out, p + i, ok);
        i += ok;
        if (i == n) break;
        int r = lm_utf8_check(p + i, n - i);
        if (r == 0) { /* incomplete at the end */
            if (!final) return i;
            lm_buf_append(out, fffd, 3);
            return n;
        }
        lm_buf_append(out, fffd, 3);
        i += (size_t)-r;
    }
    return n;
}

int32_t lm_utf8_decode(const unsigned char *p, size_t n, int *len) {
    int r = lm_utf8_check(p, n);
    if (r <= 0) {
        *len = 1;
        return -1;
    }
    *len = r;
    switch (r) {
    case 1: return p[0];
    case 2: return ((int32_t)(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
    case 3: return ((int32_t)(p[0] & 0x0F) << 12) | ((int32_t)(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    default:
        return ((int32_t)(p[0] & 0x07) << 18) | ((int32_t)(p[1] & 0x3F) << 12) |
               ((int32_t)(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
    }
}

int lm_utf8_encode(uint32_t cp, unsigned char *d) {
    if (cp < 0x80) {
        d[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        d[0] = (unsigned char)(0xC0 | (cp >> 6));
        d[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        d[0] = (unsigned char)(0xE0 | (cp >> 12));
        d[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        d[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    d[0] = (unsigned char)(0xF0 | (cp >> 18));
    d[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    d[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    d[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Bytes that stand for themselves: '!'..'~', 0xA1..0xAC, 0xAE..0xFF. The other 68 bytes take
 * 256, 257, ... in increasing byte order. */
static bool self_mapped(unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
}

uint32_t lm_bytelevel_char(unsigned char b) {
    if (self_mapped(b)) return b;
    unsigned k = 0;
    for (unsigned x = 0; x < b; x++)
        k += !self_mapped(x);
    return 256 + k;
}

int lm_bytelevel_byte(uint32_t cp) {
    if (cp < 256) return self_mapped(cp) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1;
    /* The 68 bytes that are not self-mapped, in increasing order: 0x00-0x20, 0x7F-0xA0, 0xAD. */
    unsigned k = cp - 256;
    if (k <= 0x20) return (int)k;
    if (k <= 0x20 + 34) return (int)(0x7F + k - 0x21);
    return 0xAD;
}
