/* records.c: see records.h. */
#include "server/records.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void to_hex(const unsigned char *d, unsigned n, char *hex) {
    static const char k[] = "0123456789abcdef";
    for (unsigned i = 0; i < n; i++) {
        hex[2 * i] = k[d[i] >> 4];
        hex[2 * i + 1] = k[d[i] & 15];
    }
    hex[2 * n] = 0;
}

void lm_sha256_hex(const void *data, size_t n, char hex[LM_SHA256_HEX_LEN]) {
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned dn = 0;
    if (!EVP_Digest(n ? data : "", n, d, &dn, EVP_sha256(), NULL)) abort(); /* only on OOM */
    to_hex(d, dn, hex);
}

void lm_sha256_ids_hex(const int32_t *ids, size_t n, char hex[LM_SHA256_HEX_LEN]) {
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx || !EVP_DigestInit_ex(ctx, EVP_sha256(), NULL)) abort();
    unsigned char buf[4096];
    size_t used = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)ids[i];
        buf[used++] = (unsigned char)v;
        buf[used++] = (unsigned char)(v >> 8);
        buf[used++] = (unsigned char)(v >> 16);
        buf[used++] = (unsigned char)(v >> 24);
        if (used == sizeof buf) {
            EVP_DigestUpdate(ctx, buf, used);
            used = 0;
        }
    }
    EVP_DigestUpdate(ctx, buf, used);
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned dn = 0;
    EVP_DigestFinal_ex(ctx, d, &dn);
    EVP_MD_CTX_free(ctx);
    to_hex(d, dn, hex);
}

static json_t *str_or_null(const char *s) {
    if (!s) return json_null();
    json_t *j = json_string(s);
    return j ? j : json_null(); /* not UTF-8: header bytes we cannot write as JSON */
}

static json_t *ms_or_null(double ms) {
    return ms >= 0 ? json_real(ms) : json_null();
}
static json_t *diff_or_null(double a, double b) {
    return a >= 0 && b >= 0 ? json_real(a - b) : json_null();
}
static json_t *int_or_null(int v) {
    return v >= 0 ? json_integer(v) : json_null();
}

static const char *role_name(enum lm_chat_role r) {
    switch (r) {
    case LM_ROLE_SYSTEM: return "system";
    case LM_ROLE_USER: return "user";
    case LM_ROLE_ASSISTANT: return "assistant";
    case LM_ROLE_TOOL: return "tool";
    }
    return "?";
}

/* X-Lumen-Turn as an integer: optional spaces, an optional sign and digits only. */
static json_t *turn_json(const char *s) {
    if (!s) return json_null();
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    while (*end == ' ')
        end++;
    if (end == s || *end || errno) return json_null();
    return json_integer(v);
}

char *lm_record_json(const struct lm_record *r) {
    char hex[LM_SHA256_HEX_LEN];
    json_t *o = json_object();
    json_object_set_new(o, "id", str_or_null(r->id));
    json_object_set_new(o, "x_request_id", str_or_null(r->x_request_id));
    json_object_set_new(o, "conversation_id", str_or_null(r->conversation_id));
    json_object_set_new(o, "phase", str_or_null(r->phase));
    json_object_set_new(o, "turn", turn_json(r->turn));
    json_object_set_new(o, "model", str_or_null(r->model));
    json_object_set_new(o, "endpoint", str_or_null(r->endpoint));
    json_object_set_new(o, "http_status", json_integer(r->http_status));
    json_object_set_new(o, "t_arrival_ms", ms_or_null(r->t_arrival_ms));
    json_object_set_new(o, "t_scheduled_ms", ms_or_null(r->t_scheduled_ms));
    json_object_set_new(o, "t_first_token_ms", ms_or_null(r->t_first_token_ms));
    json_object_set_new(o, "t_finish_ms", ms_or_null(r->t_finish_ms));
    json_object_set_new(o, "queue_ms", diff_or_null(r->t_scheduled_ms, r->t_arrival_ms));
    json_object_set_new(o, "prefill_ms", diff_or_null(r->t_first_token_ms, r->t_scheduled_ms));
    json_object_set_new(o, "decode_ms", diff_or_null(r->t_finish_ms, r->t_first_token_ms));
    json_object_set_new(o, "total_ms", diff_or_null(r->t_finish_ms, r->t_arrival_ms));
    json_object_set_new(o, "prompt_tokens", int_or_null(r->prompt_tokens));
    json_object_set_new(o, "cached_tokens", int_or_null(r->cached_tokens));
    json_object_set_new(o, "completion_tokens", int_or_null(r->completion_tokens));
    json_object_set_new(o, "spec_draft_tokens", int_or_null(r->spec_draft_tokens));
    json_object_set_new(o, "spec_accepted_tokens", int_or_null(r->spec_accepted_tokens));
    json_object_set_new(o, "finish_reason", str_or_null(r->finish_reason));
    if (r->messages) {
        json_t *roles = json_array(), *hashes = json_array();
        for (size_t i = 0; i < r->n_messages; i++) {
            const char *c = r->messages[i].content ? r->messages[i].content : "";
            json_array_append_new(roles, json_string(role_name(r->messages[i].role)));
            lm_sha256_hex(c, strlen(c), hex);
            json_array_append_new(hashes, json_string(hex));
        }
        json_object_set_new(o, "roles", roles);
        json_object_set_new(o, "content_sha256", hashes);
    } else {
        json_object_set_new(o, "roles", json_null());
        json_object_set_new(o, "content_sha256", json_null());
    }
    if (r->prompt_ids) lm_sha256_ids_hex(r->prompt_ids, r->n_prompt_ids, hex);
    json_object_set_new(o, "prompt_ids_sha256", r->prompt_ids ? json_string(hex) : json_null());
    if (r->completion_ids) lm_sha256_ids_hex(r->completion_ids, r->n_completion_ids, hex);
    json_object_set_new(o, "completion_ids_sha256",
                        r->completion_ids ? json_string(hex) : json_null());
    if (r->completion_text) lm_sha256_hex(r->completion_text, r->completion_text_len, hex);
    json_object_set_new(o, "completion_text_sha256",
                        r->completion_text ? json_string(hex) : json_null());
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
    json_decref(o);
    if (!s) abort(); /* only on allocation failure */
    return s;
}

struct lm_records {
    int fd;
    char *path;
    pthread_mutex_t mu;
};

lm_status lm_records_open(const char *path, struct lm_records **out) {
    *out = NULL;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0)
        return lm_errorf(LM_ERR_IO, "--records %s: cannot open for appending: %s", path,
                         strerror(errno));
    struct lm_records *rs = calloc(1, sizeof *rs);
    if (!rs || !(rs->path = strdup(path))) {
        free(rs);
        close(fd);
        return lm_errorf(LM_ERR_NOMEM, "out of memory");
    }
    rs->fd = fd;
    pthread_mutex_init(&rs->mu, NULL);
    *out = rs;
    return LM_OK;
}

lm_status lm_records_write(struct lm_records *rs, const struct lm_record *r) {
    char *line = lm_record_json(r);
    size_t n = strlen(line);
    char *buf = realloc(line, n + 2); /* room for the newline */
    if (!buf) abort();
    buf[n] = '\n';
    buf[n + 1] = 0;
    pthread_mutex_lock(&rs->mu);
    size_t off = 0;
    lm_status st = LM_OK;
    while (off < n + 1) {
        ssize_t w = write(rs->fd, buf + off, n + 1 - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            st = lm_errorf(LM_ERR_IO, "--records %s: write failed: %s", rs->path, strerror(errno));
            break;
        }
        off += (size_t)w;
    }
    pthread_mutex_unlock(&rs->mu);
    free(buf);
    return st;
}

void lm_records_close(struct lm_records *rs) {
    if (!rs) return;
    close(rs->fd);
    pthread_mutex_destroy(&rs->mu);
    free(rs->path);
    free(rs);
}
