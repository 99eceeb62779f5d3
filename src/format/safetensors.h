/* safetensors.h: reading Hugging Face safetensors checkpoints, single-file or sharded.
 *
 * Format (https://huggingface.co/docs/safetensors, reference: huggingface/safetensors
 * safetensors/src/tensor.rs): an unsigned 64-bit little-endian header length N, N bytes of JSON
 * mapping each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative
 * to the end of the header; an optional "__metadata__" object of strings), then the data,
 * row-major and little-endian. A sharded checkpoint has model.safetensors.index.json whose
 * "weight_map" maps each tensor name to its shard file.
 *
 * Everything is validated at open: header length against the file size, the JSON, each dtype,
 * shape and offset pair, sizes against shape x dtype, overlaps, and data past the end of the
 * file (a truncated download). Messages name the file and the tensor. Files are mapped
 * read-only (base/file.h); tensor data pointers point into the maps and stay valid until
 * lm_st_close. */
#ifndef LM_FORMAT_SAFETENSORS_H
#define LM_FORMAT_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/file.h"
#include "base/status.h"

#define LM_ST_MAX_DIMS 8

/* The safetensors dtype names. Only F32, F16 and BF16 are served; the others are recognised so
 * that their sizes can be validated and a lookup can say which dtype it found. */
enum lm_st_dtype {
    LM_ST_F32,
    LM_ST_F16,
    LM_ST_BF16,
    LM_ST_F64,
    LM_ST_I64,
    LM_ST_U64,
    LM_ST_I32,
    LM_ST_U32,
    LM_ST_I16,
    LM_ST_U16,
    LM_ST_I8,
    LM_ST_U8,
    LM_ST_BOOL,
    LM_ST_F8_E4M3,
    LM_ST_F8_E5M2,
};

/* "F32", "BF16", ... as written in the header. */
const char *lm_st_dtype_name(enum lm_st_dtype t);
/* Bytes per element. */
size_t lm_st_dtype_size(enum lm_st_dtype t);

struct lm_st_tensor {
    char *name;                     /* owned */
    enum lm_st_dtype dtype;
    int ndim;                       /* 0..LM_ST_MAX_DIMS */
    int64_t shape[LM_ST_MAX_DIMS];  /* row-major, outermost first */
    int64_t numel;                  /* product of shape */
    const void *data;               /* into the file map; borrowed, valid until lm_st_close */
    size_t nbytes;                  /* numel * dtype size */
    int file;                       /* index into lm_safetensors.files */
};

struct lm_safetensors {
    struct lm_file_map *files;   /* [n_files] maps of the shard files */
    int n_files;
    struct lm_st_tensor *tensors; /* [n_tensors], sorted by name */
    size_t n_tensors;
    size_t data_bytes;            /* sum of tensor sizes */
};

/* Opens one .safetensors file into `st` (zeroed first). LM_ERR_IO when it cannot be read,
 * LM_ERR_FORMAT for any defect in the header or data layout. */
lm_status lm_st_open_file(struct lm_safetensors *st, const char *path);

/* Opens a model folder: DIR/model.safetensors.index.json with its shards when present, else
 * DIR/model.safetensors. LM_ERR_MISSING when neither exists or a tensor listed in the index is
 * absent from its shard; LM_ERR_FORMAT for a defective file or index (duplicate names). */
lm_status lm_st_open_dir(struct lm_safetensors *st, const char *dir);

/* Unmaps the files and frees the table; accepts a zeroed struct. */
void lm_st_close(struct lm_safetensors *st);

/* The tensor called `name`, or NULL. Borrowed. */
const struct lm_st_tensor *lm_st_find(const struct lm_safetensors *st, const char *name);

/* The path of the file that holds `t` (for messages). Borrowed. */
const char *lm_st_tensor_path(const struct lm_safetensors *st, const struct lm_st_tensor *t);

/* Looks up `name` and checks its shape: ndim dims equal to shape[0..ndim). LM_ERR_MISSING
 * ("model.safetensors: tensor 'x' not found") or LM_ERR_SHAPE ("...: tensor 'x' has shape
 * [3, 4], expected [4, 4]"). Dtypes are the caller's to check. */
lm_status lm_st_get(const struct lm_safetensors *st, const char *name, int ndim,
                    const int64_t *shape, const struct lm_st_tensor **out);

/* One tensor to write: name, dtype, shape and `nbytes` bytes of little-endian row-major data. */
struct lm_st_write_tensor {
    const char *name;
    enum lm_st_dtype dtype;
    int ndim;
    int64_t shape[LM_ST_MAX_DIMS];
    const void *data; /* borrowed; nbytes = numel * dtype size */
};

/* Writes a safetensors file with the tensors in the given order (data 8-byte aligned, header
 * padded with spaces as the reference writer does) and an optional {"format": "pt"} metadata.
 * LM_ERR_IO when the file cannot be written. */
lm_status lm_st_write_file(const char *path, const struct lm_st_write_tensor *t, size_t n);

#endif
