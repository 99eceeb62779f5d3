/* family.c: the family registry and the weight store (see family.h). */
#include "family/family.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "family/qwen3/family.h"

static const struct lm_family *const k_families[] = {
    &lm_family_qwen3,
};
enum { N_FAMILIES = sizeof k_families / sizeof k_families[0] };

const struct lm_family *lm_family_find(const char *model_type) {
    for (int i = 0; i < N_FAMILIES; i++)
        if (!strcmp(k_families[i]->model_type, model_type)) return k_families[i];
    return NULL;
}

void lm_family_list(struct lm_buf *out) {
    for (int i = 0; i < N_FAMILIES; i++) {
        if (i) lm_buf_puts(out, ", ");
        lm_buf_puts(out, k_families[i]->model_type);
    }
}

/* ---- weight store ---- */

void *lm_huge_alloc(size_t bytes) {
    if (!bytes) bytes = 1;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    if (bytes >= (2u << 20)) madvise(p, bytes, MADV_HUGEPAGE);
#endif
    return p;
}

void lm_huge_free(void *p, size_t bytes) {
    if (p) munmap(p, bytes ? bytes : 1);
}

void *lm_weight_store_alloc(struct lm_weight_store *ws, size_t bytes) {
    size_t rounded = (bytes + 63) / 64 * 64;
    if (!rounded) rounded = 64;
    /* The arena holds every copy: the checkpoint's bytes, float32 growth of the vectors and the
     * alignment slack. Pages never touched cost nothing. */
    if (!ws->arena && (ws->st || ws->gguf)) {
        size_t data_bytes = ws->st ? ws->st->data_bytes : ws->gguf->data_bytes;
        size_t n_tensors = ws->st ? ws->st->n_tensors : ws->gguf->n_tensors;
        size_t want = 2 * data_bytes + 64 * (n_tensors + 64) + (4u << 20);
        ws->arena = lm_huge_alloc(want);
        if (ws->arena) ws->arena_size = want;
    }
    if (ws->arena && ws->arena_size - ws->arena_used >= rounded) {
        void *p = ws->arena + ws->arena_used;
        ws->arena_used += rounded;
        return p;
    }
    if (ws->n_allocs == ws->cap_allocs) {
        size_t cap = ws->cap_allocs ? ws->cap_allocs * 2 : 64;
        void **a = realloc(ws->allocs, cap * sizeof *a);
        if (!a) return NULL;
        ws->allocs = a;
        ws->cap_allocs = cap;
    }
    void *p = aligned_alloc(64, rounded);
    if (!p) return NULL;
    memset(p, 0, rounded);
    ws->allocs[ws->n_allocs++] = p;
    return p;
}

void lm_weight_store_free(struct lm_weight_store *ws) {
    if (!ws) return;
    for (size_t i = 0; i < ws->n_allocs; i++) free(ws->allocs[i]);
    free(ws->allocs);
    lm_huge_free(ws->arena, ws->arena_size);
    memset(ws, 0, sizeof *ws);
}

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* A tensor found in the store's source. */
struct found {
    const void *data; /* into the file map; may be unaligned */
    size_t nbytes;
    enum lm_dtype dt;
    const char *file; /* base name, for messages */
};

static void format_dims(char *out, size_t cap, int ndim, const int64_t *d) {
    size_t o = (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < ndim && o < cap; i++)
        o += (size_t)snprintf(out + o, cap - o, i ? ", %lld" : "%lld", (long long)d[i]);
    if (o < cap) snprintf(out + o, cap - o, "]");
}

/* Finds GGUF tensor for the Hugging Face name `name` with shape[ndim] (outermost first, so the
 * GGUF extents are the reverse) and a served type. */
static lm_status find_gguf(const struct lm_gguf *g, const char *name, int ndim, const int64_t *shape,
                           bool allow_q8, struct found *f) {
    const char *file = base_name(g->map.path);
    char gname[160];
    if (!lm_gguf_name_from_hf(name, gname, sizeof gname))
        return lm_errorf(LM_ERR_MISSING, "%s: no GGUF name for tensor '%s'", file, name);
    const struct lm_gguf_tensor *t = lm_gguf_tensor(g, gname);
    if (!t) return lm_errorf(LM_ERR_MISSING, "%s: tensor '%s' (%s) not found", file, gname, name);
    bool ok = t->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++) ok = t->ne[d] == shape[ndim - 1 - d];
    if (!ok) {
        int64_t want[LM_GGUF_MAX_DIMS];
        for (int d = 0; d < ndim && d < LM_GGUF_MAX_DIMS; d++) want[d] = shape[ndim - 1 - d];
        char a[96], b[96];
        format_dims(a, sizeof a, t->ndim, t->ne);
        format_dims(b, sizeof b, ndim, want);
        return lm_errorf(LM_ERR_SHAPE, "%s: tensor '%s' has extents %s, expected %s (ne0 first)",
                         file, gname, a, b);
    }
    switch (t->type) {
    case LM_GGML_F32: f->dt = LM_DTYPE_F32; break;
    case LM_GGML_F16: f->dt = LM_DTYPE_F16; break;
    case LM_GGML_BF16: f->dt = LM_DTYPE_BF16; break;
    case LM_GGML_Q8_0:
        if (allow_q8) {
            f->dt = LM_DTYPE_Q8_0;
            break;
        }
        /* fall through */
    default:
        return lm_errorf(LM_ERR_SHAPE, "%s: tensor '%s' has type %s; lumen serves %s", file, gname,
                         lm_ggml_type_name(t->type),
                         allow_q8 ? "F32, F16, BF16 and Q8_0" : "F32, F16 and BF16 here (a vector)");
    }
    f->data = t->data;
    f->nbytes = t->nbytes;
    f->file = file;
    return LM_OK;
}

/* Finds `name` with the given shape and a served dtype (Q8_0 for matrices of a GGUF). */
static lm_status find(struct lm_weight_store *ws, const char *name, int ndim, const int64_t *shape,
                      bool allow_q8, struct found *f) {
    if (ws->gguf) return find_gguf(ws->gguf, name, ndim, shape, allow_q8, f);
    const struct lm_st_tensor *t;
    lm_status rc = lm_st_get(ws->st, name, ndim, shape, &t);
    if (rc) return rc;
    f->file = base_name(lm_st_tensor_path(ws->st, t));
    switch (t->dtype) {
    case LM_ST_F32: f->dt = LM_DTYPE_F32; break;
    case LM_ST_F16: f->dt = LM_DTYPE_F16; break;
    case LM_ST_BF16: f->dt = LM_DTYPE_BF16; break;
    default:
        return lm_errorf(LM_ERR_SHAPE, "%s: tensor '%s' has dtype %s; lumen serves BF16, F16 and F32",
                         f->file, name, lm_st_dtype_name(t->dtype));
    }
    f->data = t->data;
    f->nbytes = t->nbytes;
    return LM_OK;
}

bool lm_weight_store_has(const struct lm_weight_store *ws, const char *name) {
    if (ws->gguf) {
        char gname[160];
        return lm_gguf_name_from_hf(name, gname, sizeof gname) && lm_gguf_tensor(ws->gguf, gname);
    }
    return ws->st && lm_st_find(ws->st, name) != NULL;
}

/* Keeps a mapped range resident: prefault it, then lock it where RLIMIT_MEMLOCK allows. */
static bool keep_resident(const void *data, size_t nbytes) {
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t b = (uintptr_t)data / (uintptr_t)page * (uintptr_t)page;
    size_t len = (size_t)((uintptr_t)data + nbytes - b);
#ifdef MADV_WILLNEED
    madvise((void *)b, len, MADV_WILLNEED);
#endif
    return mlock((const void *)b, len) == 0;
}

lm_status lm_weight_store_matrix(struct lm_weight_store *ws, const char *name, int rows, int cols,
                                 struct lm_mat *out) {
    struct found f;
    int64_t shape[2] = {rows, cols};
    lm_status rc = find(ws, name, 2, shape, true, &f);
    if (rc) return rc;
    if (ws->n_matrices++ == 0)
        ws->matrix_dtype = f.dt;
    else if (f.dt != ws->matrix_dtype)
        ws->mixed_dtypes = true;
    ws->n_params += (long)rows * cols;
    out->dtype = f.dt;
    out->rows = rows;
    out->cols = cols;
    size_t align = f.dt == LM_DTYPE_F32 ? 4 : 2; /* Q8_0 blocks hold a uint16 scale */
    if (ws->map && (uintptr_t)f.data % align == 0) {
        if (ws->bytes_mapped == 0) ws->locked = true;
        ws->locked = keep_resident(f.data, f.nbytes) && ws->locked;
        out->data = f.data;
        ws->bytes_mapped += f.nbytes;
        return LM_OK;
    }
    /* Copied into anonymous memory in the kernels' packed layout (ops.h, lm_cpu_pack). */
    size_t bytes = lm_cpu_packed_bytes(f.dt, rows, cols);
    void *p = lm_weight_store_alloc(ws, bytes);
    if (!p)
        return lm_errorf(LM_ERR_NOMEM, "%s: cannot allocate %zu bytes for tensor '%s'", f.file,
                         bytes, name);
    lm_cpu_pack(p, f.data, f.dt, rows, cols);
    ws->bytes_copied += bytes;
    out->dtype = lm_dtype_packed(f.dt);
    out->data = p;
    return LM_OK;
}

lm_status lm_weight_store_vector(struct lm_weight_store *ws, const char *name, int n, float **out) {
    struct found f;
    int64_t shape[1] = {n};
    lm_status rc = find(ws, name, 1, shape, false, &f);
    if (rc) return rc;
    float *p = lm_weight_store_alloc(ws, (size_t)n * sizeof(float));
    if (!p) return lm_errorf(LM_ERR_NOMEM, "%s: cannot allocate tensor '%s'", f.file, name);
    /* The file data may be unaligned: go through memcpy. */
    for (int i = 0; i < n; i++) {
        if (f.dt == LM_DTYPE_F32) {
            memcpy(&p[i], (const char *)f.data + 4 * (size_t)i, 4);
        } else {
            uint16_t h;
            memcpy(&h, (const char *)f.data + 2 * (size_t)i, 2);
            p[i] = f.dt == LM_DTYPE_BF16 ? lm_bf16_to_f32(h) : lm_f16_to_f32(h);
        }
    }
    ws->bytes_copied += (size_t)n * sizeof(float);
    ws->n_params += n;
    *out = p;
    return LM_OK;
}
