/* digest.h: SHA-256 (FIPS 180-4) through OpenSSL libcrypto's EVP interface, as lowercase hex.
 *
 * The profiler hashes dataset files (for the run manifest), message contents, rendered prompt
 * ids and completions (for the join with the server's request records, docs/RECORDS.md). Ids
 * are hashed as their little-endian int32 bytes, so a hash computed on any host matches. */
#ifndef LM_BENCH_DIGEST_H
#define LM_BENCH_DIGEST_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#define LM_SHA256_HEX 65 /* 64 hex digits and a NUL */

/* hex = SHA-256 of data[0..n) (n may be 0; data may then be NULL). */
void lm_bench_sha256_hex(const void *data, size_t n, char hex[LM_SHA256_HEX]);

/* hex = SHA-256 of ids[0..n) as little-endian int32 bytes. */
void lm_bench_sha256_ids(const int32_t *ids, size_t n, char hex[LM_SHA256_HEX]);

/* hex = SHA-256 of the file at `path`, read in blocks (any size); *size_out (may be NULL) gets
 * its byte count. LM_ERR_IO naming the path when it cannot be read. */
lm_status lm_bench_sha256_file(const char *path, char hex[LM_SHA256_HEX], size_t *size_out);

/* An incremental hash: init, update any number of times, final (which frees it). */
struct lm_bench_sha256 {
    void *ctx; /* EVP_MD_CTX */
};
void lm_bench_sha256_init(struct lm_bench_sha256 *h);
void lm_bench_sha256_update(struct lm_bench_sha256 *h, const void *data, size_t n);
void lm_bench_sha256_final(struct lm_bench_sha256 *h, char hex[LM_SHA256_HEX]);

#endif
