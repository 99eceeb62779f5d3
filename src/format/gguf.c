/* gguf.c: see gguf.h. */
#include "format/gguf.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c reads and writes little-endian files on a little-endian host"
#endif

static const struct {
    uint32_t type;
    const char *name;
    int block_elems, block_bytes;
} k_types[] = {
    {LM_GGML_F32, "F32", 1, 4},       {LM_GGML_F16, "F16", 1, 2},       {LM_GGML_Q4_0, "Q4_0", 32, 18},
    {LM_GGML_Q4_1, "Q4_1", 32, 20},   {LM_GGML_Q5_0, "Q5_0", 32, 22},   {LM_GGML_Q5_1, "Q5_1", 32, 24},
    {LM_GGML_Q8_0, "Q8_0", 32, 34},   {LM_GGML_Q8_1, "Q8_1", 32, 36},   {LM_GGML_Q2_K, "Q2_K", 256, 84},
    {LM_GGML_Q3_K, "Q3_K", 256, 110}, {LM_GGML_Q4_K, "Q4_K", 256, 144}, {LM_GGML_Q5_K, "Q5_K", 256, 176},
    {LM_GGML_Q6_K, "Q6_K", 256, 210}, {LM_GGML_Q8_K, "Q8_K", 256, 292}, {LM_GGML_I8, "I8", 1, 1},
    {LM_GGML_I16, "I16", 1, 2},       {LM_GGML_I32, "I32", 1, 4},       {LM_GGML_I64, "I64", 1, 8},
    {LM_GGML_F64, "F64", 1, 8},       {LM_GGML_BF16, "BF16", 1, 2},
};
enum { N_TYPES = sizeof k_types / sizeof k_types[0] };

const char *lm_ggml_type_name(uint32_t type) {
    for (int i = 0; i < N_TYPES; i++)
        if (k_types[i].type == type) return k_types[i].name;
    static _Thread_local char buf[32];
    snprintf(buf, sizeof buf, "type %u", type);
    return buf;
}

bool lm_ggml_type_block(uint32_t type, int *block_elems, int *block_bytes) {
    for (int i = 0; i < N_TYPES; i++)
        if (k_types[i].type == type) {
            *block_elems = k_types[i].block_elems;
            *block_bytes = k_types[i].block_bytes;
            return true;
        }
    return false;
}

static const char *value_type_name(uint32_t t) {
    static const char *const names[] = {"uint8", "int8",   "uint16", "int16", "uint32",
                                        "int32", "float32", "bool",  "string", "array",
                                        "uint64", "int64", "float64"};
    return t < sizeof names / sizeof *names ? names[t] : "unknown";
}

/* Size of a fixed-size value type, 0 for STRING/ARRAY, -1 for an unknown type. */
static int fixed_size(uint32_t t) {
    switch (t) {
    case LM_GGUF_UINT8:
    case LM_GGUF_INT8:
    case LM_GGUF_BOOL: return 1;
    case LM_GGUF_UINT16:
    case LM_GGUF_INT16: return 2;
    case LM_GGUF_UINT32:
    case LM_GGUF_INT32:
    case LM_GGUF_FLOAT32: return 4;
    case LM_GGUF_UINT64:
    case LM_GGUF_INT64:
    case LM_GGUF_FLOAT64: return 8;
    case LM_GGUF_STRING:
    case LM_GGUF_ARRAY: return 0;
    }
    return -1;
}

/* ---- reading ---- */

struct rd {
    const unsigned char *p;
    size_t size, off;
    const char *path;
    const char *where; /* "the header", "the metadata", "the tensor table" */
    char ctx[160];     /* which entry, for messages */
};

static lm_status truncated(const struct rd *r) {
    return lm_errorf(LM_ERR_FORMAT, "%s: truncated in %s%s (file is %zu bytes)", r->path, r->where,
                     r->ctx, r->size);
}

static lm_status need(const struct rd *r, uint64_t n) {
    return n > r->size - r->off ? truncated(r) : LM_OK;
}

static lm_status rd_u32(struct rd *r, uint32_t *v) {
    lm_status rc = need(r, 4);
    if (rc) return rc;
    memcpy(v, r->p + r->off, 4);
    r->off += 4;
    return LM_OK;
}

static lm_status rd_u64(struct rd *r, uint64_t *v) {
    lm_status rc = need(r, 8);
    if (rc) return rc;
    memcpy(v, r->p + r->off, 8);
    r->off += 8;
    return LM_OK;
}

static lm_status rd_str(struct rd *r, struct lm_gguf_str *s) {
    uint64_t n;
    lm_status rc = rd_u64(r, &n);
    if (!rc) rc = need(r, n);
    if (rc) return rc;
    s->p = (const char *)r->p + r->off;
    s->len = (size_t)n;
    r->off += (size_t)n;
    return LM_OK;
}

static char *str_dup(struct lm_gguf_str s) {
    char *c = malloc(s.len + 1);
    if (!c) return NULL;
    memcpy(c, s.p, s.len);
    c[s.len] = 0;
    return c;
}

/* Reads one scalar of fixed-size type t into kv->v. */
static void load_scalar(struct lm_gguf_kv *kv, uint32_t t, const unsigned char *p) {
    switch (t) {
    case LM_GGUF_UINT8: kv->v.u = p[0]; break;
    case LM_GGUF_BOOL: kv->v.u = p[0] != 0; break;
    case LM_GGUF_INT8: kv->v.i = (int8_t)p[0]; break;
    case LM_GGUF_UINT16: { uint16_t x; memcpy(&x, p, 2); kv->v.u = x; break; }
    case LM_GGUF_INT16: { int16_t x; memcpy(&x, p, 2); kv->v.i = x; break; }
    case LM_GGUF_UINT32: { uint32_t x; memcpy(&x, p, 4); kv->v.u = x; break; }
    case LM_GGUF_INT32: { int32_t x; memcpy(&x, p, 4); kv->v.i = x; break; }
    case LM_GGUF_FLOAT32: { float x; memcpy(&x, p, 4); kv->v.f = x; break; }
    case LM_GGUF_UINT64: memcpy(&kv->v.u, p, 8); break;
    case LM_GGUF_INT64: memcpy(&kv->v.i, p, 8); break;
    case LM_GGUF_FLOAT64: memcpy(&kv->v.f, p, 8); break;
    }
}

static lm_status read_value(struct rd *r, struct lm_gguf_kv *kv) {
    lm_status rc;
    uint32_t t;
    if ((rc = rd_u32(r, &t))) return rc;
    int sz = fixed_size(t);
    if (sz < 0)
        return lm_errorf(LM_ERR_FORMAT, "%s: %s has an unknown value type %u", r->path, r->ctx + 1, t);
    kv->type = (enum lm_gguf_type)t;
    if (t == LM_GGUF_STRING) return rd_str(r, &kv->v.s);
    if (t != LM_GGUF_ARRAY) {
        if ((rc = need(r, (uint64_t)sz))) return rc;
        load_scalar(kv, t, r->p + r->off);
        r->off += (size_t)sz;
        return LM_OK;
    }
    uint32_t at;
    uint64_t n;
    if ((rc = rd_u32(r, &at)) || (rc = rd_u64(r, &n))) return rc;
    int esz = fixed_size(at);
    if (esz < 0)
        return lm_errorf(LM_ERR_FORMAT, "%s: %s is an array of unknown value type %u", r->path,
                         r->ctx + 1, at);
    if (at == LM_GGUF_ARRAY)
        return lm_errorf(LM_ERR_UNSUPPORTED, "%s: %s is an array of arrays (not supported)", r->path,
                         r->ctx + 1);
    kv->arr_type = (enum lm_gguf_type)at;
    kv->arr_n = n;
    kv->arr = r->p + r->off;
    if (at != LM_GGUF_STRING) {
        if (n > (r->size - r->off) / (uint64_t)esz) return truncated(r);
        r->off += (size_t)n * (size_t)esz;
        return LM_OK;
    }
    /* Each string takes at least its 8-byte length. */
    if (n > (r->size - r->off) / 8) return truncated(r);
    kv->strs = malloc(sizeof *kv->strs * (size_t)(n ? n : 1));
    if (!kv->strs) return lm_errorf(LM_ERR_NOMEM, "%s: out of memory for %s", r->path, r->ctx + 1);
    for (uint64_t i = 0; i < n; i++)
        if ((rc = rd_str(r, &kv->strs[i]))) return rc;
    return LM_OK;
}

static int cmp_kv_key(const void *a, const void *b, void *ctx) {
    const struct lm_gguf_kv *kvs = ctx;
    return strcmp(kvs[*(const size_t *)a].key, kvs[*(const size_t *)b].key);
}

static int cmp_tensor_name(const void *a, const void *b, void *ctx) {
    const struct lm_gguf_tensor *t = ctx;
    return strcmp(t[*(const size_t *)a].name, t[*(const size_t *)b].name);
}

static int cmp_tensor_offset(const void *a, const void *b, void *ctx) {
    const struct lm_gguf_tensor *t = ctx;
    uint64_t x = t[*(const size_t *)a].offset, y = t[*(const size_t *)b].offset;
    return x < y ? -1 : x > y;
}

void lm_gguf_close(struct lm_gguf *g) {
    if (!g) return;
    for (size_t i = 0; i < g->n_kv; i++) {
        free(g->kvs[i].key);
        free(g->kvs[i].strs);
    }
    free(g->kvs);
    for (size_t i = 0; i < g->n_tensors; i++) free(g->tensors[i].name);
    free(g->tensors);
    free(g->by_name);
    lm_file_map_close(&g->map);
    memset(g, 0, sizeof *g);
}

bool lm_gguf_is_gguf(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char m[4];
    bool ok = fread(m, 1, 4, f) == 4 && !memcmp(m, "GGUF", 4);
    fclose(f);
    return ok;
}

static lm_status parse(struct lm_gguf *g, const char *path) {
    struct rd r = {g->map.data, g->map.size, 0, path, "the header", ""};
    lm_status rc;
    if (r.size < 4 || memcmp(r.p, "GGUF", 4)) {
        char shown[16] = "";
        for (size_t i = 0; i < 4 && i < r.size; i++)
            snprintf(shown + 3 * i, sizeof shown - 3 * i, "%02x ", r.p[i]);
        return lm_errorf(LM_ERR_FORMAT, "%s: not a GGUF file (the first bytes %sare not \"GGUF\")",
                         path, shown);
    }
    r.off = 4;
    uint64_t n_tensors, n_kv;
    if ((rc = rd_u32(&r, &g->version))) return rc;
    if (g->version != 2 && g->version != 3)
        return lm_errorf(LM_ERR_UNSUPPORTED, "%s: GGUF version %u is not supported (2 and 3 are)",
                         path, g->version);
    if ((rc = rd_u64(&r, &n_tensors)) || (rc = rd_u64(&r, &n_kv))) return rc;
    /* A key takes at least 12 bytes (length + type), a tensor at least 24. */
    if (n_kv > (r.size - r.off) / 12 || n_tensors > (r.size - r.off) / 24)
        return lm_errorf(LM_ERR_FORMAT,
                         "%s: header claims %llu keys and %llu tensors, more than a %zu-byte file "
                         "can hold (truncated or corrupt)",
                         path, (unsigned long long)n_kv, (unsigned long long)n_tensors, r.size);

    /* Metadata. */
    r.where = "the metadata";
    g->kvs = calloc((size_t)(n_kv ? n_kv : 1), sizeof *g->kvs);
    if (!g->kvs) return lm_errorf(LM_ERR_NOMEM, "%s: out of memory", path);
    for (uint64_t i = 0; i < n_kv; i++) {
        struct lm_gguf_kv *kv = &g->kvs[i];
        snprintf(r.ctx, sizeof r.ctx, " (key %llu of %llu)", (unsigned long long)i + 1,
                 (unsigned long long)n_kv);
        struct lm_gguf_str key;
        if ((rc = rd_str(&r, &key))) return rc;
        if (!(kv->key = str_dup(key))) return lm_errorf(LM_ERR_NOMEM, "%s: out of memory", path);
        g->n_kv = (size_t)i + 1;
        snprintf(r.ctx, sizeof r.ctx, " (key %llu of %llu, '%.100s')", (unsigned long long)i + 1,
                 (unsigned long long)n_kv, kv->key);
        if ((rc = read_value(&r, kv))) return rc;
    }
    if (n_kv > 1) { /* duplicate keys */
        size_t *idx = malloc(sizeof *idx * (size_t)n_kv);
        if (!idx) return lm_errorf(LM_ERR_NOMEM, "%s: out of memory", path);
        for (size_t i = 0; i < n_kv; i++) idx[i] = i;
        qsort_r(idx, (size_t)n_kv, sizeof *idx, cmp_kv_key, g->kvs);
        for (size_t i = 1; i < n_kv; i++)
            if (!strcmp(g->kvs[idx[i]].key, g->kvs[idx[i - 1]].key)) {
                rc = lm_errorf(LM_ERR_FORMAT, "%s: key '%s' appears twice", path, g->kvs[idx[i]].key);
                break;
            }
        free(idx);
        if (rc) return rc;
    }
    g->alignment = LM_GGUF_DEFAULT_ALIGNMENT;
    const struct lm_gguf_kv *al = lm_gguf_kv(g, "general.alignment");
    if (al) {
        if (al->type != LM_GGUF_UINT32 || al->v.u == 0 || (al->v.u & (al->v.u - 1)) || al->v.u > (1u << 20))
            return lm_errorf(LM_ERR_FORMAT,
                             "%s: general.alignment must be a uint32 power of two (found %s %llu)",
                             path, value_type_name(al->type), (unsigned long long)al->v.u);
        g->alignment = (size_t)al->v.u;
    }

    /* Tensor table. */
    r.where = "the tensor table";
    g->tensors = calloc((size_t)(n_tensors ? n_tensors : 1), sizeof *g->tensors);
    g->by_name = calloc((size_t)(n_tensors ? n_tensors : 1), sizeof *g->by_name);
    if (!g->tensors || !g->by_name) return lm_errorf(LM_ERR_NOMEM, "%s: out of memory", path);
    for (uint64_t i = 0; i < n_tensors; i++) {
        struct lm_gguf_tensor *t = &g->tensors[i];
        snprintf(r.ctx, sizeof r.ctx, " (tensor %llu of %llu)", (unsigned long long)i + 1,
                 (unsigned long long)n_tensors);
        struct lm_gguf_str name;
        uint32_t nd;
        if ((rc = rd_str(&r, &name))) return rc;
        if (!(t->name = str_dup(name))) return lm_errorf(LM_ERR_NOMEM, "%s: out of memory", path);
        g->n_tensors = (size_t)i + 1;
        snprintf(r.ctx, sizeof r.ctx, " (tensor %llu of %llu, '%.100s')", (unsigned long long)i + 1,
                 (unsigned long long)n_tensors, t->name);
        if ((rc = rd_u32(&r, &nd))) return rc;
        if (nd < 1 || nd > LM_GGUF_MAX_DIMS)
            return lm_errorf(LM_ERR_FORMAT, "%s: tensor '%s' has %u dimensions (1 to %d allowed)",
                             path, t->name, nd, LM_GGUF_MAX_DIMS);
        t->ndim = (int)nd;
        for (int d = 0; d < LM_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < nd; d++) {
            uint64_t e;
            if ((rc = rd_u64(&r, &e))) return rc;
            if (e > (1ull << 40))
                return lm_errorf(LM_ERR_FORMAT, "%s: tensor '%s' extent %u is %llu (corrupt)", path,
                                 t->name, d, (unsigned long long)e);
            t->ne[d] = (int64_t)e;
        }
        if ((rc = rd_u32(&r, &t->type)) || (rc = rd_u64(&r, &t->offset))) return rc;
        int be, bb;
        if (!lm_ggml_type_block(t->type, &be, &bb))
            return lm_errorf(LM_ERR_FORMAT, "%s: tensor '%s' has unknown ggml type %u", path, t->name,
                             t->type);
        if (t->ne[0] % be)
            return lm_errorf(LM_ERR_FORMAT,
                             "%s: tensor '%s' of type %s has ne[0] = %lld, not a multiple of its "
                             "block of %d",
                             path, t->name, lm_ggml_type_name(t->type), (long long)t->ne[0], be);
        /* Size, with overflow checks: extents are at most 2^40 each. */
        unsigned __int128 nb = (unsigned __int128)(t->ne[0] / be) * (unsigned)bb;
        for (int d = 1; d < LM_GGUF_MAX_DIMS; d++) nb *= (uint64_t)t->ne[d];
        if (nb > (unsigned __int128)r.size)
            return lm_errorf(LM_ERR_FORMAT, "%s: tensor '%s' needs more bytes than the file holds",
                             path, t->name);
        t->nbytes = (size_t)nb;
        if (t->offset % g->alignment)
            return lm_errorf(LM_ERR_FORMAT, "%s: tensor '%s' offset %llu is not a multiple of the "
                             "alignment %zu", path, t->name, (unsigned long long)t->offset, g->alignment);
        g->by_name[i] = (size_t)i;
    }
    r.ctx[0] = 0;
    size_t data_off = (r.off + g->alignment - 1) / g->alignment * g->alignment;
    if (n_tensors && data_off > r.size) {
        r.where = "the padding before the tensor data";
        return truncated(&r);
    }
    g->data_offset = data_off;
    size_t avail = r.size > data_off ? r.size - data_off : 0;
    for (size_t i = 0; i < g->n_tensors; i++) {
        struct lm_gguf_tensor *t = &g->tensors[i];
        if (t->offset > avail || t->nbytes > avail - t->offset)
            return lm_errorf(LM_ERR_FORMAT,
                             "%s: tensor '%s' data [%llu, %llu) extends past the end of the file "
                             "(%zu bytes of data; truncated?)",
                             path, t->name, (unsigned long long)t->offset,
                             (unsigned long long)(t->offset + t->nbytes), avail);
        t->data = g->map.data + data_off + t->offset;
        g->data_bytes += t->nbytes;
    }
    if (g->n_tensors > 1) {
        qsort_r(g->by_name, g->n_tensors, sizeof *g->by_name, cmp_tensor_name, g->tensors);
        for (size_t i = 1; i < g->n_tensors; i++)
            if (!strcmp(g->tensors[g->by_name[i]].name, g->tensors[g->by_name[i - 1]].name))
                return lm_errorf(LM_ERR_FORMAT, "%s: tensor '%s' appears twice", path,
                                 g->tensors[g->by_name[i]].name);
        size_t *idx = malloc(sizeof *idx * g->n_tensors);
        if (!idx) return lm_errorf(LM_ERR_NOMEM, "%s: out of memory", path);
        for (size_t i = 0; i < g->n_tensors; i++) idx[i] = i;
        qsort_r(idx, g->n_tensors, sizeof *idx, cmp_tensor_offset, g->tensors);
        for (size_t i = 1; i < g->n_tensors && !rc; i++) {
            const struct lm_gguf_tensor *a = &g->tensors[idx[i - 1]], *b = &g->tensors[idx[i]];
            if (a->offset + a->nbytes > b->offset && a->nbytes && b->nbytes)
                rc = lm_errorf(LM_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap", path, a->name,
                               b->name);
        }
        free(idx);
        if (rc) return rc;
    }
    return LM_OK;
}

lm_status lm_gguf_open(struct lm_gguf *g, const char *path) {
    memset(g, 0, sizeof *g);
    lm_status rc = lm_file_map_open(&g->map, path);
    if (rc) return rc;
    if ((rc = parse(g, path))) lm_gguf_close(g);
    return rc;
}

const struct lm_gguf_kv *lm_gguf_kv(const struct lm_gguf *g, const char *key) {
    for (size_t i = 0; i < g->n_kv; i++)
        if (!strcmp(g->kvs[i].key, key)) return &g->kvs[i];
    return NULL;
}

const struct lm_gguf_tensor *lm_gguf_tensor(const struct lm_gguf *g, const char *name) {
    size_t lo = 0, hi = g->n_tensors;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(g->tensors[g->by_name[mid]].name, name);
        if (!c) return &g->tensors[g->by_name[mid]];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static lm_status missing(const struct lm_gguf *g, const char *key) {
    return lm_errorf(LM_ERR_MISSING, "%s: missing key '%s'", base_name(g->map.path), key);
}

static lm_status wrong_type(const struct lm_gguf *g, const struct lm_gguf_kv *kv, const char *want) {
    return lm_errorf(LM_ERR_FORMAT, "%s: key '%s' is %s %s, expected %s", base_name(g->map.path),
                     kv->key, kv->type == LM_GGUF_ARRAY ? "an" : "a", value_type_name(kv->type), want);
}

static bool is_int_type(enum lm_gguf_type t) {
    return t == LM_GGUF_UINT8 || t == LM_GGUF_INT8 || t == LM_GGUF_UINT16 || t == LM_GGUF_INT16 ||
           t == LM_GGUF_UINT32 || t == LM_GGUF_INT32 || t == LM_GGUF_UINT64 || t == LM_GGUF_INT64 ||
           t == LM_GGUF_BOOL;
}
static bool is_signed(enum lm_gguf_type t) {
    return t == LM_GGUF_INT8 || t == LM_GGUF_INT16 || t == LM_GGUF_INT32 || t == LM_GGUF_INT64;
}

lm_status lm_gguf_get_int_opt(const struct lm_gguf *g, const char *key, int64_t lo, int64_t hi,
                              int64_t *out) {
    const struct lm_gguf_kv *kv = lm_gguf_kv(g, key);
    if (!kv) return LM_OK;
    if (!is_int_type(kv->type)) return wrong_type(g, kv, "an integer");
    if (!is_signed(kv->type) && kv->v.u > (uint64_t)INT64_MAX)
        return lm_errorf(LM_ERR_FORMAT, "%s: key '%s' is %llu, outside [%lld, %lld]",
                         base_name(g->map.path), key, (unsigned long long)kv->v.u, (long long)lo,
                         (long long)hi);
    if (kv->v.i < lo || kv->v.i > hi)
        return lm_errorf(LM_ERR_FORMAT, "%s: key '%s' is %lld, outside [%lld, %lld]",
                         base_name(g->map.path), key, (long long)kv->v.i, (long long)lo, (long long)hi);
    *out = kv->v.i;
    return LM_OK;
}

lm_status lm_gguf_get_int(const struct lm_gguf *g, const char *key, int64_t lo, int64_t hi,
                          int64_t *out) {
    if (!lm_gguf_kv(g, key)) return missing(g, key);
    return lm_gguf_get_int_opt(g, key, lo, hi, out);
}

lm_status lm_gguf_get_number_opt(const struct lm_gguf *g, const char *key, double *out) {
    const struct lm_gguf_kv *kv = lm_gguf_kv(g, key);
    if (!kv) return LM_OK;
    if (kv->type == LM_GGUF_FLOAT32 || kv->type == LM_GGUF_FLOAT64)
        *out = kv->v.f;
    else if (is_int_type(kv->type) && kv->type != LM_GGUF_BOOL)
        *out = is_signed(kv->type) ? (double)kv->v.i : (double)kv->v.u;
    else
        return wrong_type(g, kv, "a number");
    return LM_OK;
}

lm_status lm_gguf_get_number(const struct lm_gguf *g, const char *key, double *out) {
    if (!lm_gguf_kv(g, key)) return missing(g, key);
    return lm_gguf_get_number_opt(g, key, out);
}

lm_status lm_gguf_get_bool_opt(const struct lm_gguf *g, const char *key, bool *out) {
    const struct lm_gguf_kv *kv = lm_gguf_kv(g, key);
    if (!kv) return LM_OK;
    if (kv->type != LM_GGUF_BOOL) return wrong_type(g, kv, "a bool");
    *out = kv->v.u != 0;
    return LM_OK;
}

lm_status lm_gguf_get_str_opt(const struct lm_gguf *g, const char *key, struct lm_gguf_str *out) {
    const struct lm_gguf_kv *kv = lm_gguf_kv(g, key);
    if (!kv) return LM_OK;
    if (kv->type != LM_GGUF_STRING) return wrong_type(g, kv, "a string");
    *out = kv->v.s;
    return LM_OK;
}

lm_status lm_gguf_get_str(const struct lm_gguf *g, const char *key, struct lm_gguf_str *out) {
    if (!lm_gguf_kv(g, key)) return missing(g, key);
    return lm_gguf_get_str_opt(g, key, out);
}

lm_status lm_gguf_get_array(const struct lm_gguf *g, const char *key, enum lm_gguf_type type,
                            const struct lm_gguf_kv **out) {
    const struct lm_gguf_kv *kv = lm_gguf_kv(g, key);
    if (!kv) return missing(g, key);
    if (kv->type != LM_GGUF_ARRAY || !(kv->arr_type == type || (is_int_type(type) && is_int_type(kv->arr_type) &&
                                                              kv->arr_type != LM_GGUF_BOOL))) {
        char want[48];
        snprintf(want, sizeof want, "an array of %s", value_type_name(type));
        if (kv->type == LM_GGUF_ARRAY)
            return lm_errorf(LM_ERR_FORMAT, "%s: key '%s' is an array of %s, expected %s",
                             base_name(g->map.path), key, value_type_name(kv->arr_type), want);
        return wrong_type(g, kv, want);
    }
    *out = kv;
    return LM_OK;
}

int64_t lm_gguf_array_int(const struct lm_gguf_kv *kv, uint64_t i) {
    assert(kv->type == LM_GGUF_ARRAY && i < kv->arr_n);
    struct lm_gguf_kv tmp;
    int sz = fixed_size(kv->arr_type);
    assert(sz > 0);
    load_scalar(&tmp, kv->arr_type, kv->arr + (size_t)i * (size_t)sz);
    return is_signed(kv->arr_type) ? tmp.v.i : (int64_t)tmp.v.u;
}

/* ---- names ---- */

bool lm_gguf_name_from_hf(const char *hf, char *out, size_t cap) {
    static const struct {
        const char *hf, *gguf;
    } k_global[] = {{"model.embed_tokens.weight", "token_embd.weight"},
                    {"model.norm.weight", "output_norm.weight"},
                    {"lm_head.weight", "output.weight"}},
      k_layer[] = {{"input_layernorm", "attn_norm"},   {"self_attn.q_proj", "attn_q"},
                   {"self_attn.k_proj", "attn_k"},     {"self_attn.v_proj", "attn_v"},
                   {"self_attn.o_proj", "attn_output"}, {"self_attn.q_norm", "attn_q_norm"},
                   {"self_attn.k_norm", "attn_k_norm"}, {"post_attention_layernorm", "ffn_norm"},
                   {"mlp.gate_proj", "ffn_gate"},      {"mlp.up_proj", "ffn_up"},
                   {"mlp.down_proj", "ffn_down"}};
    for (size_t i = 0; i < sizeof k_global / sizeof *k_global; i++)
        if (!strcmp(hf, k_global[i].hf)) return (size_t)snprintf(out, cap, "%s", k_global[i].gguf) < cap;
    const char *pre = "model.layers.";
    if (strncmp(hf, pre, strlen(pre))) return false;
    const char *p = hf + strlen(pre);
    char *end;
    long layer = strtol(p, &end, 10);
    if (end == p || *end != '.' || layer < 0) return false;
    p = end + 1;
    for (size_t i = 0; i < sizeof k_layer / sizeof *k_layer; i++) {
        size_t n = strlen(k_layer[i].hf);
        if (strncmp(p, k_layer[i].hf, n) || p[n] != '.') continue;
        const char *suffix = p + n + 1;
        if (strcmp(suffix, "weight") && strcmp(suffix, "bias")) return false;
        return (size_t)snprintf(out, cap, "blk.%ld.%s.%s", layer, k_layer[i].gguf, suffix) < cap;
    }
    return false;
}

/* ---- writing ---- */

static void put_u32(struct lm_buf *b, uint32_t v) { lm_buf_append(b, &v, 4); }
static void put_u64(struct lm_buf *b, uint64_t v) { lm_buf_append(b, &v, 8); }
static void put_string(struct lm_buf *b, const char *s, size_t len) {
    put_u64(b, len);
    lm_buf_append(b, s, len);
}

void lm_gguf_writer_init(struct lm_gguf_writer *w, size_t alignment) {
    memset(w, 0, sizeof *w);
    if (!alignment) alignment = LM_GGUF_DEFAULT_ALIGNMENT;
    assert((alignment & (alignment - 1)) == 0);
    w->alignment = alignment;
    lm_gguf_put_u32(w, "general.alignment", (uint32_t)alignment);
}

void lm_gguf_writer_free(struct lm_gguf_writer *w) {
    if (!w) return;
    if (w->file) {
        fclose(w->file);
        if (w->path) remove(w->path);
    }
    for (uint64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    free(w->keys);
    free(w->path);
    free(w->sizes);
    lm_buf_free(&w->meta);
    lm_buf_free(&w->tinfo);
    memset(w, 0, sizeof *w);
}

static void put_key(struct lm_gguf_writer *w, const char *key, enum lm_gguf_type t) {
    for (uint64_t i = 0; i < w->n_kv; i++) assert(strcmp(w->keys[i], key) != 0);
    char **k = realloc(w->keys, sizeof *k * (size_t)(w->n_kv + 1));
    char *c = strdup(key);
    if (!k || !c) abort();
    w->keys = k;
    w->keys[w->n_kv++] = c;
    put_string(&w->meta, key, strlen(key));
    put_u32(&w->meta, t);
}

void lm_gguf_put_u32(struct lm_gguf_writer *w, const char *key, uint32_t v) {
    put_key(w, key, LM_GGUF_UINT32);
    put_u32(&w->meta, v);
}
void lm_gguf_put_i32(struct lm_gguf_writer *w, const char *key, int32_t v) {
    put_key(w, key, LM_GGUF_INT32);
    lm_buf_append(&w->meta, &v, 4);
}
void lm_gguf_put_f32(struct lm_gguf_writer *w, const char *key, float v) {
    put_key(w, key, LM_GGUF_FLOAT32);
    lm_buf_append(&w->meta, &v, 4);
}
void lm_gguf_put_bool(struct lm_gguf_writer *w, const char *key, bool v) {
    put_key(w, key, LM_GGUF_BOOL);
    lm_buf_putc(&w->meta, v ? 1 : 0);
}
void lm_gguf_put_str(struct lm_gguf_writer *w, const char *key, const char *s, size_t len) {
    put_key(w, key, LM_GGUF_STRING);
    put_string(&w->meta, s, len);
}
void lm_gguf_put_str_array(struct lm_gguf_writer *w, const char *key, const char *const *s,
                           const size_t *lens, size_t n) {
    put_key(w, key, LM_GGUF_ARRAY);
    put_u32(&w->meta, LM_GGUF_STRING);
    put_u64(&w->meta, n);
    for (size_t i = 0; i < n; i++) put_string(&w->meta, s[i], lens[i]);
}
void lm_gguf_put_i32_array(struct lm_gguf_writer *w, const char *key, const int32_t *v, size_t n) {
    put_key(w, key, LM_GGUF_ARRAY);
    put_u32(&w->meta, LM_GGUF_INT32);
    put_u64(&w->meta, n);
    lm_buf_append(&w->meta, v, 4 * n);
}

size_t lm_gguf_add_tensor(struct lm_gguf_writer *w, const char *name, uint32_t type, int ndim,
                          const int64_t *ne) {
    int be, bb;
    bool known = lm_ggml_type_block(type, &be, &bb);
    assert(known && ndim >= 1 && ndim <= LM_GGUF_MAX_DIMS && ne[0] % be == 0);
    (void)known;
    size_t nbytes = (size_t)(ne[0] / be) * (size_t)bb;
    for (int d = 1; d < ndim; d++) nbytes *= (size_t)ne[d];
    put_string(&w->tinfo, name, strlen(name));
    put_u32(&w->tinfo, (uint32_t)ndim);
    for (int d = 0; d < ndim; d++) put_u64(&w->tinfo, (uint64_t)ne[d]);
    put_u32(&w->tinfo, type);
    put_u64(&w->tinfo, w->next_offset);
    if (w->n_tensors == w->cap_sizes) {
        w->cap_sizes = w->cap_sizes ? 2 * w->cap_sizes : 64;
        w->sizes = realloc(w->sizes, sizeof *w->sizes * w->cap_sizes);
        if (!w->sizes) abort();
    }
    w->sizes[w->n_tensors++] = nbytes;
    w->next_offset += (nbytes + w->alignment - 1) / w->alignment * w->alignment;
    return nbytes;
}

static lm_status write_bytes(struct lm_gguf_writer *w, const void *p, size_t n) {
    if (n && fwrite(p, 1, n, w->file) != n)
        return lm_errorf(LM_ERR_IO, "%s: write failed: %s", w->path, strerror(errno));
    return LM_OK;
}

static lm_status write_pad(struct lm_gguf_writer *w, uint64_t done) {
    static const unsigned char zeros[4096];
    size_t pad = (size_t)((w->alignment - done % w->alignment) % w->alignment);
    return write_bytes(w, zeros, pad);
}

lm_status lm_gguf_writer_begin(struct lm_gguf_writer *w, const char *path) {
    assert(!w->file);
    free(w->path);
    w->path = strdup(path);
    if (!w->path) abort();
    w->file = fopen(path, "wb");
    if (!w->file) return lm_errorf(LM_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    struct lm_buf h = {0};
    lm_buf_append(&h, "GGUF", 4);
    put_u32(&h, 3);
    put_u64(&h, w->n_tensors);
    put_u64(&h, w->n_kv);
    lm_status rc = write_bytes(w, h.p, h.len);
    if (!rc) rc = write_bytes(w, w->meta.p, w->meta.len);
    if (!rc) rc = write_bytes(w, w->tinfo.p, w->tinfo.len);
    if (!rc) rc = write_pad(w, h.len + w->meta.len + w->tinfo.len);
    lm_buf_free(&h);
    w->written = 0;
    w->part = 0;
    /* Tensors of zero bytes are complete already. */
    while (w->written < w->n_tensors && w->sizes[w->written] == 0) w->written++;
    return rc;
}

lm_status lm_gguf_writer_tensor(struct lm_gguf_writer *w, const void *data, size_t nbytes) {
    assert(w->file && w->written < w->n_tensors && nbytes <= w->sizes[w->written] - w->part);
    lm_status rc = write_bytes(w, data, nbytes);
    w->part += nbytes;
    if (!rc && w->part == w->sizes[w->written]) {
        rc = write_pad(w, w->part);
        w->part = 0;
        w->written++;
        while (w->written < w->n_tensors && w->sizes[w->written] == 0) w->written++;
    }
    return rc;
}

lm_status lm_gguf_writer_finish(struct lm_gguf_writer *w) {
    assert(w->file && w->written == w->n_tensors);
    int bad = ferror(w->file);
    int rc = fclose(w->file);
    w->file = NULL;
    if (bad || rc) {
        remove(w->path);
        return lm_errorf(LM_ERR_IO, "%s: write failed: %s", w->path, strerror(errno));
    }
    return LM_OK;
}
