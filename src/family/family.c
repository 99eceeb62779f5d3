/* family.c: the family registry and the weight store (see family.h). */
#include "family/family.h"

#include <stdlib.h>
#include <string.h>

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

void *lm_weight_store_alloc(struct lm_weight_store *ws, size_t bytes) {
    if (ws->n_allocs == ws->cap_allocs) {
        size_t cap = ws->cap_allocs ? ws->cap_allocs * 2 : 64;
        void **a = realloc(ws->allocs, cap * sizeof *a);
        if (!a) return NULL;
        ws->allocs = a;
        ws->cap_allocs = cap;
    }
    size_t rounded = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (!p) return NULL;
    memset(p, 0, rounded ? rounded : 64);
    ws->allocs[ws->n_allocs++] = p;
    return p;
}

void lm_weight_store_free(struct lm_weight_store *ws) {
    if (!ws) return;
    for (size_t i = 0; i < ws->n_allocs; i++) free(ws->allocs[i]);
    free(ws->allocs);
    memset(ws, 0, sizeof *ws);
}

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* Finds `name` with the given shape and a served dtype. */
static lm_status find(struct lm_weight_store *ws, const char *name, int ndim, const int64_t *shape,
                      const struct lm_st_tensor **t, enum lm_dtype *dt) {
    lm_status rc = lm_st_get(ws->st, name, ndim, shape, t);
    if (rc) return rc;
    switch ((*t)->dtype) {
    case LM_ST_F32: *dt = LM_DTYPE_F32; return LM_OK;
    case LM_ST_F16: *dt = LM_DTYPE_F16; return LM_OK;
    case LM_ST_BF16: *dt = LM_DTYPE_BF16; return LM_OK;
    default:
        return lm_errorf(LM_ERR_SHAPE, "%s: tensor '%s' has dtype %s; lumen serves BF16, F16 and F32",
                         base_name(lm_st_tensor_path(ws->st, *t)), name,
                         lm_st_dtype_name((*t)->dtype));
    }
}

lm_status lm_weight_store_matrix(struct lm_weight_store *ws, const char *name, int rows, int cols,
                                 struct lm_mat *out) {
    const struct lm_st_tensor *t;
    enum lm_dtype dt;
    int64_t shape[2] = {rows, cols};
    lm_status rc = find(ws, name, 2, shape, &t, &dt);
    if (rc) return rc;
    if (ws->n_matrices++ == 0)
        ws->matrix_dtype = dt;
    else if (dt != ws->matrix_dtype)
        ws->mixed_dtypes = true;
    ws->n_params += (long)rows * cols;
    out->dtype = dt;
    out->rows = rows;
    out->cols = cols;
    if (ws->map && (uintptr_t)t->data % lm_dtype_size(dt) == 0) {
        out->data = t->data;
        ws->bytes_mapped += t->nbytes;
        return LM_OK;
    }
    void *p = lm_weight_store_alloc(ws, t->nbytes);
    if (!p)
        return lm_errorf(LM_ERR_NOMEM, "%s: cannot allocate %zu bytes for tensor '%s'",
                         base_name(lm_st_tensor_path(ws->st, t)), t->nbytes, name);
    memcpy(p, t->data, t->nbytes);
    ws->bytes_copied += t->nbytes;
    out->data = p;
    return LM_OK;
}

lm_status lm_weight_store_vector(struct lm_weight_store *ws, const char *name, int n, float **out) {
    const struct lm_st_tensor *t;
    enum lm_dtype dt;
    int64_t shape[1] = {n};
    lm_status rc = find(ws, name, 1, shape, &t, &dt);
    if (rc) return rc;
    float *p = lm_weight_store_alloc(ws, (size_t)n * sizeof(float));
    if (!p)
        return lm_errorf(LM_ERR_NOMEM, "%s: cannot allocate tensor '%s'",
                         base_name(lm_st_tensor_path(ws->st, t)), name);
    /* The file data may be unaligned: go through memcpy. */
    for (int i = 0; i < n; i++) {
        if (dt == LM_DTYPE_F32) {
            memcpy(&p[i], (const char *)t->data + 4 * (size_t)i, 4);
        } else {
            uint16_t h;
            memcpy(&h, (const char *)t->data + 2 * (size_t)i, 2);
            p[i] = dt == LM_DTYPE_BF16 ? lm_bf16_to_f32(h) : lm_f16_to_f32(h);
        }
    }
    ws->bytes_copied += (size_t)n * sizeof(float);
    ws->n_params += n;
    *out = p;
    return LM_OK;
}
