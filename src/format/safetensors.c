/* safetensors.c: see safetensors.h. */
#include "format/safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/json.h"

static const struct {
    const char *name;
    size_t size;
} k_dtypes[] = {
    [LM_ST_F32] = {"F32", 4},      [LM_ST_F16] = {"F16", 2},       [LM_ST_BF16] = {"BF16", 2},
    [LM_ST_F64] = {"F64", 8},      [LM_ST_I64] = {"I64", 8},       [LM_ST_U64] = {"U64", 8},
    [LM_ST_I32] = {"I32", 4},      [LM_ST_U32] = {"U32", 4},       [LM_ST_I16] = {"I16", 2},
    [LM_ST_U16] = {"U16", 2},      [LM_ST_I8] = {"I8", 1},         [LM_ST_U8] = {"U8", 1},
    [LM_ST_BOOL] = {"BOOL", 1},    [LM_ST_F8_E4M3] = {"F8_E4M3", 1}, [LM_ST_F8_E5M2] = {"F8_E5M2", 1},
};
enum { N_DTYPES = sizeof k_dtypes / sizeof k_dtypes[0] };

/* The reference implementation refuses headers above 100 MB. */
#define MAX_HEADER (100u * 1000u * 1000u)

const char *lm_st_dtype_name(enum lm_st_dtype t) {
    return (unsigned)t < N_DTYPES ? k_dtypes[t].name : "?";
}

size_t lm_st_dtype_size(enum lm_st_dtype t) { return (unsigned)t < N_DTYPES ? k_dtypes[t].size : 0; }

static bool parse_dtype(const char *s, enum lm_st_dtype *out) {
    for (int i = 0; i < N_DTYPES; i++)
        if (!strcmp(s, k_dtypes[i].name)) {
            *out = (enum lm_st_dtype)i;
            return true;
        }
    return false;
}

static void free_tensors(struct lm_st_tensor *t, size_t n) {
    for (size_t i = 0; i < n; i++) free(t[i].name);
    free(t);
}

void lm_st_close(struct lm_safetensors *st) {
    if (!st) return;
    for (int i = 0; i < st->n_files; i++) lm_file_map_close(&st->files[i]);
    free(st->files);
    free_tensors(st->tensors, st->n_tensors);
    memset(st, 0, sizeof *st);
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const struct lm_st_tensor *)a)->name, ((const struct lm_st_tensor *)b)->name);
}

struct span {
    uint64_t begin, end;
    const char *name;
};

static int cmp_span(const void *a, const void *b) {
    const struct span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static void format_shape(const int64_t *shape, int ndim, char *out, size_t cap) {
    size_t o = 0;
    o += (size_t)snprintf(out + o, cap - o, "[");
    for (int i = 0; i < ndim && o < cap; i++)
        o += (size_t)snprintf(out + o, cap - o, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (o < cap) snprintf(out + o, cap - o, "]");
}

/* Parses one tensor entry `v` named `name` of file `path` (data area of `data_size` bytes). */
static lm_status parse_entry(const char *path, const char *name, json_t *v, uint64_t data_size,
                             struct lm_st_tensor *t, uint64_t *begin, uint64_t *end) {
    if (!json_is_object(v))
        return lm_errorf(LM_ERR_FORMAT, "%s: header entry '%s' is not an object", path, name);
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
           *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd))
        return lm_errorf(LM_ERR_FORMAT, "%s: tensor '%s' has no \"dtype\" string", path, name);
    if (!parse_dtype(json_string_value(jd), &t->dtype))
        return lm_errorf(LM_ERR_FORMAT, "%s: tensor '%s' has unknown dtype '%s'", path, name,
                         json_string_value(jd));
    if (!json_is_array(js))
        return lm_errorf(LM_ERR_FORMAT, "%s: tensor '%s' has no \"shape\" array", path, name);
    if (json_array_size(js) > LM_ST_MAX_DIMS)
        return lm_errorf(LM_ERR_FORMAT, "%s: tensor '%s' has %zu dimensions (at most %d)", path,
                         name, json_array_size(js), LM_ST_MAX_DIMS);
    t->ndim = (int)json_array_size(js);
    uint64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        json_t *d = json_array_get(js, (size_t)i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return lm_errorf(LM_ERR_FORMAT, "%s: tensor '%s' shape[%d] is not a non-negative integer",
                             path, name, i);
        uint64_t x = (uint64_t)json_integer_value(d);
        if (x && numel > UINT64_MAX / 16 / x)
            return lm_errorf(LM_ERR_FORMAT, "%s: tensor '%s' shape is too large", path, name);
        numel *= x;
        t->shape[i] = (int64_t)x;
    }
    t->numel = (int64_t)numel;
    if (!json_is_array(jo) || json_array_size(jo) != 2 ||
        !json_is_integer(json_array_get(jo, 0)) || !json_is_integer(json_array_get(jo, 1)) ||
        json_integer_value(json_array_get(jo, 0)) < 0 || json_integer_value(json_array_get(jo, 1)) < 0)
        return lm_errorf(LM_ERR_FORMAT,
                         "%s: tensor '%s' \"data_offsets\" is not a pair of non-negative integers",
                         path, name);
    *begin = (uint64_t)json_integer_value(json_array_get(jo, 0));
    *end = (uint64_t)json_integer_value(json_array_get(jo, 1));
    if (*end < *begin)
        return lm_errorf(LM_ERR_FORMAT, "%s: tensor '%s' data_offsets [%llu, %llu] end before begin",
                         path, name, (unsigned long long)*begin, (unsigned long long)*end);
    uint64_t need = numel * lm_st_dtype_size(t->dtype);
    if (*end - *begin != need) {
        char sh[160];
        format_shape(t->shape, t->ndim, sh, sizeof sh);
        return lm_errorf(LM_ERR_FORMAT,
                         "%s: tensor '%s' (%s %s) needs %llu bytes but data_offsets [%llu, %llu] "
                         "hold %llu",
                         path, name, lm_st_dtype_name(t->dtype), sh, (unsigned long long)need,
                         (unsigned long long)*begin, (unsigned long long)*end,
                         (unsigned long long)(*end - *begin));
    }
    if (*end > data_size)
        return lm_errorf(LM_ERR_FORMAT,
                         "%s: truncated or corrupt: tensor '%s' data ends at byte %llu of the data "
                         "area but the file holds only %llu bytes of data",
                         path, name, (unsigned long long)*end, (unsigned long long)data_size);
    t->nbytes = (size_t)need;
    return LM_OK;
}

/* Parses the file mapped at st->files[fi], appending its tensors to st->tensors. */
static lm_status parse_file(struct lm_safetensors *st, int fi) {
    const struct lm_file_map *m = &st->files[fi];
    const char *path = m->path;
    if (m->size < 8)
        return lm_errorf(LM_ERR_FORMAT, "%s: truncated: %zu bytes, too short for a safetensors header",
                         path, m->size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | m->data[i];
    if (hlen > m->size - 8)
        return lm_errorf(LM_ERR_FORMAT,
                         "%s: header length %llu is beyond the end of the file (%zu bytes): "
                         "truncated or not a safetensors file",
                         path, (unsigned long long)hlen, m->size);
    if (hlen > MAX_HEADER)
        return lm_errorf(LM_ERR_FORMAT, "%s: header length %llu exceeds the 100 MB limit", path,
                         (unsigned long long)hlen);
    if (hlen < 2 || m->data[8] != '{')
        return lm_errorf(LM_ERR_FORMAT, "%s: header is not a JSON object", path);
    json_error_t err;
    json_t *h = json_loadb((const char *)m->data + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &err);
    if (!h)
        return lm_errorf(LM_ERR_FORMAT, "%s: header is not valid JSON (column %d): %s", path,
                         err.column, err.text);
    if (!json_is_object(h)) {
        json_decref(h);
        return lm_errorf(LM_ERR_FORMAT, "%s: header is not a JSON object", path);
    }
    uint64_t data_size = m->size - 8 - hlen;
    const unsigned char *data = m->data + 8 + hlen;
    size_t n_new = json_object_size(h);
    struct lm_st_tensor *grown =
        realloc(st->tensors, (st->n_tensors + n_new + 1) * sizeof *st->tensors);
    struct span *spans = malloc((n_new + 1) * sizeof *spans);
    if (!grown || !spans) {
        if (grown) st->tensors = grown;
        free(spans);
        json_decref(h);
        return lm_errorf(LM_ERR_NOMEM, "%s: out of memory reading the header", path);
    }
    st->tensors = grown;
    size_t n_spans = 0;
    lm_status rc = LM_OK;
    const char *key;
    json_t *v;
    json_object_foreach(h, key, v) {
        if (!strcmp(key, "__metadata__")) {
            if (!json_is_object(v)) {
                rc = lm_errorf(LM_ERR_FORMAT, "%s: \"__metadata__\" is not an object", path);
                break;
            }
            continue;
        }
        struct lm_st_tensor t = {0};
        uint64_t b = 0, e = 0;
        if ((rc = parse_entry(path, key, v, data_size, &t, &b, &e))) break;
        t.name = strdup(key);
        if (!t.name) {
            rc = lm_errorf(LM_ERR_NOMEM, "%s: out of memory", path);
            break;
        }
        t.data = data + b;
        t.file = fi;
        st->tensors[st->n_tensors++] = t;
        st->data_bytes += t.nbytes;
        spans[n_spans++] = (struct span){b, e, st->tensors[st->n_tensors - 1].name};
    }
    if (!rc) {
        qsort(spans, n_spans, sizeof *spans, cmp_span);
        size_t last = 0; /* the span reaching furthest so far */
        for (size_t i = 1; i < n_spans; i++) {
            if (spans[i].begin < spans[last].end && spans[i].end > spans[i].begin) {
                rc = lm_errorf(LM_ERR_FORMAT,
                               "%s: tensors '%s' [%llu, %llu] and '%s' [%llu, %llu] overlap", path,
                               spans[last].name, (unsigned long long)spans[last].begin,
                               (unsigned long long)spans[last].end, spans[i].name,
                               (unsigned long long)spans[i].begin, (unsigned long long)spans[i].end);
                break;
            }
            if (spans[i].end > spans[last].end) last = i;
        }
    }
    free(spans);
    json_decref(h);
    return rc;
}

static lm_status add_file(struct lm_safetensors *st, const char *path) {
    struct lm_file_map *f = realloc(st->files, ((size_t)st->n_files + 1) * sizeof *f);
    if (!f) return lm_errorf(LM_ERR_NOMEM, "%s: out of memory", path);
    st->files = f;
    lm_status rc = lm_file_map_open(&st->files[st->n_files], path);
    if (rc) return rc;
    st->n_files++;
    return parse_file(st, st->n_files - 1);
}

static lm_status finish(struct lm_safetensors *st) {
    if (st->n_tensors) qsort(st->tensors, st->n_tensors, sizeof *st->tensors, cmp_name);
    for (size_t i = 1; i < st->n_tensors; i++)
        if (!strcmp(st->tensors[i].name, st->tensors[i - 1].name))
            return lm_errorf(LM_ERR_FORMAT, "%s: tensor '%s' also appears in %s",
                             st->files[st->tensors[i].file].path, st->tensors[i].name,
                             st->files[st->tensors[i - 1].file].path);
    return LM_OK;
}

lm_status lm_st_open_file(struct lm_safetensors *st, const char *path) {
    memset(st, 0, sizeof *st);
    lm_status rc = add_file(st, path);
    if (!rc) rc = finish(st);
    if (rc) lm_st_close(st);
    return rc;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static lm_status open_index(struct lm_safetensors *st, const char *dir, const char *ipath) {
    json_t *idx;
    lm_status rc = lm_json_load_file(ipath, &idx);
    if (rc) return rc;
    json_t *wm = json_object_get(idx, "weight_map");
    if (!json_is_object(wm) || json_object_size(wm) == 0) {
        json_decref(idx);
        return lm_errorf(LM_ERR_FORMAT, "%s: \"weight_map\" is not a non-empty object", ipath);
    }
    /* The distinct shard names, sorted so the shards open in a stable order. */
    size_t n = 0, cap = json_object_size(wm);
    const char **names = malloc(cap * sizeof *names);
    if (!names) {
        json_decref(idx);
        return lm_errorf(LM_ERR_NOMEM, "%s: out of memory", ipath);
    }
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v) {
        if (!json_is_string(v)) {
            rc = lm_errorf(LM_ERR_FORMAT, "%s: weight_map['%s'] is not a file name", ipath, key);
            break;
        }
        const char *f = json_string_value(v);
        if (strchr(f, '/') || !strcmp(f, "..") || !*f) {
            rc = lm_errorf(LM_ERR_FORMAT, "%s: weight_map['%s'] = '%s' is not a file in the folder",
                           ipath, key, f);
            break;
        }
        names[n++] = f;
    }
    if (!rc) {
        qsort(names, n, sizeof *names, cmp_str);
        for (size_t i = 0; i < n && !rc; i++) {
            if (i && !strcmp(names[i], names[i - 1])) continue;
            char *p = lm_path_join(dir, names[i]);
            if (!lm_file_exists(p))
                rc = lm_errorf(LM_ERR_MISSING, "%s: shard '%s' listed in weight_map is missing",
                               ipath, names[i]);
            else
                rc = add_file(st, p);
            free(p);
        }
    }
    if (!rc) rc = finish(st);
    if (!rc) {
        json_object_foreach(wm, key, v) {
            const struct lm_st_tensor *t = lm_st_find(st, key);
            const char *want = json_string_value(v);
            if (!t) {
                rc = lm_errorf(LM_ERR_MISSING, "%s: tensor '%s' listed in weight_map is not in %s",
                               ipath, key, want);
                break;
            }
            const char *have = st->files[t->file].path, *base = strrchr(have, '/');
            base = base ? base + 1 : have;
            if (strcmp(base, want)) {
                rc = lm_errorf(LM_ERR_FORMAT, "%s: tensor '%s' is listed in %s but found in %s",
                               ipath, key, want, base);
                break;
            }
        }
    }
    free(names);
    json_decref(idx);
    return rc;
}

lm_status lm_st_open_dir(struct lm_safetensors *st, const char *dir) {
    memset(st, 0, sizeof *st);
    char *ipath = lm_path_join(dir, "model.safetensors.index.json");
    char *fpath = lm_path_join(dir, "model.safetensors");
    lm_status rc;
    if (lm_file_exists(ipath))
        rc = open_index(st, dir, ipath);
    else if (lm_file_exists(fpath))
        rc = add_file(st, fpath), rc = rc ? rc : finish(st);
    else
        rc = lm_errorf(LM_ERR_MISSING,
                       "%s: no model.safetensors or model.safetensors.index.json in the folder", dir);
    free(ipath);
    free(fpath);
    if (rc) lm_st_close(st);
    return rc;
}

const struct lm_st_tensor *lm_st_find(const struct lm_safetensors *st, const char *name) {
    size_t lo = 0, hi = st->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(st->tensors[mid].name, name);
        if (!c) return &st->tensors[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const char *lm_st_tensor_path(const struct lm_safetensors *st, const struct lm_st_tensor *t) {
    return st->files[t->file].path;
}

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

lm_status lm_st_get(const struct lm_safetensors *st, const char *name, int ndim,
                    const int64_t *shape, const struct lm_st_tensor **out) {
    *out = NULL;
    const struct lm_st_tensor *t = lm_st_find(st, name);
    if (!t) {
        const char *where = st->n_files == 1 ? base_name(st->files[0].path)
                                             : "model.safetensors.index.json";
        return lm_errorf(LM_ERR_MISSING, "%s: tensor '%s' not found", where, name);
    }
    bool ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        char a[160], b[160];
        format_shape(t->shape, t->ndim, a, sizeof a);
        format_shape(shape, ndim, b, sizeof b);
        return lm_errorf(LM_ERR_SHAPE, "%s: tensor '%s' has shape %s, expected %s",
                         base_name(lm_st_tensor_path(st, t)), name, a, b);
    }
    *out = t;
    return LM_OK;
}

/* ---- writer ---- */

lm_status lm_st_write_file(const char *path, const struct lm_st_write_tensor *t, size_t n) {
    json_t *h = json_object();
    json_t *meta = json_object();
    json_object_set_new(meta, "format", json_string("pt"));
    json_object_set_new(h, "__metadata__", meta);
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_object(), *sh = json_array(), *of = json_array();
        uint64_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++) {
            json_array_append_new(sh, json_integer(t[i].shape[d]));
            numel *= (uint64_t)t[i].shape[d];
        }
        uint64_t nb = numel * lm_st_dtype_size(t[i].dtype);
        json_array_append_new(of, json_integer((json_int_t)off));
        json_array_append_new(of, json_integer((json_int_t)(off + nb)));
        json_object_set_new(e, "dtype", json_string(lm_st_dtype_name(t[i].dtype)));
        json_object_set_new(e, "shape", sh);
        json_object_set_new(e, "data_offsets", of);
        json_object_set_new(h, t[i].name, e);
        off += nb;
    }
    char *hs = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    if (!hs) return lm_errorf(LM_ERR_NOMEM, "%s: cannot serialise the header", path);
    size_t hl = strlen(hs), padded = (hl + 7) / 8 * 8;
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(hs);
        return lm_errorf(LM_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    bool bad = fwrite(len8, 1, 8, f) != 8 || fwrite(hs, 1, hl, f) != hl;
    for (size_t i = hl; i < padded && !bad; i++) bad = fputc(' ', f) == EOF;
    free(hs);
    for (size_t i = 0; i < n && !bad; i++) {
        uint64_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++) numel *= (uint64_t)t[i].shape[d];
        size_t nb = (size_t)(numel * lm_st_dtype_size(t[i].dtype));
        bad = fwrite(t[i].data, 1, nb, f) != nb;
    }
    if (fclose(f) != 0) bad = true;
    if (bad) return lm_errorf(LM_ERR_IO, "%s: write failed", path);
    return LM_OK;
}
