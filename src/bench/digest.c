/* digest.c: see digest.h. */
#include "bench/digest.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void lm_bench_sha256_init(struct lm_bench_sha256 *h) {
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    if (!c || EVP_DigestInit_ex(c, EVP_sha256(), NULL) != 1) abort();
    h->ctx = c;
}

void lm_bench_sha256_update(struct lm_bench_sha256 *h, const void *data, size_t n) {
    if (n && EVP_DigestUpdate((EVP_MD_CTX *)h->ctx, data, n) != 1) abort();
}

void lm_bench_sha256_final(struct lm_bench_sha256 *h, char hex[LM_SHA256_HEX]) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (EVP_DigestFinal_ex((EVP_MD_CTX *)h->ctx, md, &len) != 1 || len != 32) abort();
    EVP_MD_CTX_free((EVP_MD_CTX *)h->ctx);
    h->ctx = NULL;
    static const char digits[] = "0123456789abcdef";
    for (unsigned i = 0; i < 32; i++) {
        hex[2 * i] = digits[md[i] >> 4];
        hex[2 * i + 1] = digits[md[i] & 15];
    }
    hex[64] = 0;
}

void lm_bench_sha256_hex(const void *data, size_t n, char hex[LM_SHA256_HEX]) {
    struct lm_bench_sha256 h;
    lm_bench_sha256_init(&h);
    lm_bench_sha256_update(&h, data, n);
    lm_bench_sha256_final(&h, hex);
}

void lm_bench_sha256_ids(const int32_t *ids, size_t n, char hex[LM_SHA256_HEX]) {
    struct lm_bench_sha256 h;
    lm_bench_sha256_init(&h);
    unsigned char b[4 * 256];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)ids[i];
        b[k++] = (unsigned char)v;
        b[k++] = (unsigned char)(v >> 8);
        b[k++] = (unsigned char)(v >> 16);
        b[k++] = (unsigned char)(v >> 24);
        if (k == sizeof b) {
            lm_bench_sha256_update(&h, b, k);
            k = 0;
        }
    }
    lm_bench_sha256_update(&h, b, k);
    lm_bench_sha256_final(&h, hex);
}

lm_status lm_bench_sha256_file(const char *path, char hex[LM_SHA256_HEX], size_t *size_out) {
    FILE *f = fopen(path, "rb");
    if (!f) return lm_errorf(LM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct lm_bench_sha256 h;
    lm_bench_sha256_init(&h);
    unsigned char *buf = malloc(1 << 20);
    if (!buf) abort();
    size_t n, total = 0;
    while ((n = fread(buf, 1, 1 << 20, f)) > 0) {
        lm_bench_sha256_update(&h, buf, n);
        total += n;
    }
    int bad = ferror(f);
    fclose(f);
    free(buf);
    lm_bench_sha256_final(&h, hex);
    if (bad) return lm_errorf(LM_ERR_IO, "%s: read error", path);
    if (size_out) *size_out = total;
    return LM_OK;
}
