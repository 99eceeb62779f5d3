/* gguf.h: reading and writing GGUF files (the ggml/llama.cpp model bundle format).
 *
 * Format (GGUF v3, ggml's docs/gguf.md and gguf-py/gguf/constants.py are the reference), all
 * little-endian:
 *   header:   magic "GGUF", uint32 version (2 or 3 read, 3 written), uint64 tensor count,
 *             uint64 metadata key/value count;
 *   metadata: each a string key, a uint32 value type (enum lm_gguf_type) and the value; a string
 *             is a uint64 byte length and the bytes (no NUL); an array is a uint32 element type,
 *             a uint64 count and the elements (arrays of arrays are allowed by the spec, not by
 *             this reader);
 *   tensors:  each a string name, a uint32 dimension count (1..4), that many uint64 extents with
 *             the innermost (contiguous) first ("ne0"), a uint32 ggml type (enum lm_ggml_type) and
 *             a uint64 offset into the data section, a multiple of the alignment;
 *   data:     starts at the first multiple of the alignment (general.alignment, uint32, default
 *             32) after the tensor table.
 * A matrix of `rows` rows of `cols` elements is stored with ne = [cols, rows].
 *
 * Everything is validated at open: magic, version, counts against the file size, every string
 * and array length, value types, tensor names (unique), dimensions, types, offsets (aligned,
 * inside the file, not overlapping). Messages name the file and the key or tensor. The file is
 * mapped read-only (base/file.h): string values and tensor data point into the map and stay
 * valid until lm_gguf_close. */
#ifndef LM_FORMAT_GGUF_H
#define LM_FORMAT_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/file.h"
#include "base/status.h"

#define LM_GGUF_MAX_DIMS 4
#define LM_GGUF_DEFAULT_ALIGNMENT 32

/* Metadata value types (gguf.md, GGUFValueType). */
enum lm_gguf_type {
    LM_GGUF_UINT8 = 0,
    LM_GGUF_INT8 = 1,
    LM_GGUF_UINT16 = 2,
    LM_GGUF_INT16 = 3,
    LM_GGUF_UINT32 = 4,
    LM_GGUF_INT32 = 5,
    LM_GGUF_FLOAT32 = 6,
    LM_GGUF_BOOL = 7,
    LM_GGUF_STRING = 8,
    LM_GGUF_ARRAY = 9,
    LM_GGUF_UINT64 = 10,
    LM_GGUF_INT64 = 11,
    LM_GGUF_FLOAT64 = 12,
};

/* Tensor element types (ggml.h enum ggml_type); the ones lumen serves, plus the sizes of the
 * common others so that files holding them still validate and errors can name them. */
enum lm_ggml_type {
    LM_GGML_F32 = 0,
    LM_GGML_F16 = 1,
    LM_GGML_Q4_0 = 2,
    LM_GGML_Q4_1 = 3,
    LM_GGML_Q5_0 = 6,
    LM_GGML_Q5_1 = 7,
    LM_GGML_Q8_0 = 8, /* blocks of 32: float16 scale d, then 32 int8 q; x = d * q */
    LM_GGML_Q8_1 = 9,
    LM_GGML_Q2_K = 10,
    LM_GGML_Q3_K = 11,
    LM_GGML_Q4_K = 12,
    LM_GGML_Q5_K = 13,
    LM_GGML_Q6_K = 14,
    LM_GGML_Q8_K = 15,
    LM_GGML_I8 = 24,
    LM_GGML_I16 = 25,
    LM_GGML_I32 = 26,
    LM_GGML_I64 = 27,
    LM_GGML_F64 = 28,
    LM_GGML_BF16 = 30,
};

/* "F32", "Q8_0", "BF16", ... ("type N" for an unknown one; static). */
const char *lm_ggml_type_name(uint32_t type);
/* Elements per block and bytes per block; false for a type this reader does not know. */
bool lm_ggml_type_block(uint32_t type, int *block_elems, int *block_bytes);

/* A string inside the map (not NUL-terminated). */
struct lm_gguf_str {
    const char *p;
    size_t len;
};

struct lm_gguf_kv {
    char *key;              /* owned, NUL-terminated */
    enum lm_gguf_type type;
    union {
        uint64_t u;         /* UINT8/16/32/64, BOOL (0 or 1) */
        int64_t i;          /* INT8/16/32/64 */
        double f;           /* FLOAT32/64 */
        struct lm_gguf_str s; /* STRING */
    } v;
    /* ARRAY: element type, count, and the elements: `arr` points at the first element in the
     * map (fixed-size types, unaligned: read with memcpy or the accessors), `strs` holds the
     * strings of a string array (owned). */
    enum lm_gguf_type arr_type;
    uint64_t arr_n;
    const unsigned char *arr;
    struct lm_gguf_str *strs;
};

struct lm_gguf_tensor {
    char *name;                         /* owned */
    int ndim;                           /* 1..LM_GGUF_MAX_DIMS */
    int64_t ne[LM_GGUF_MAX_DIMS];       /* extents, innermost first; unused ones are 1 */
    uint32_t type;                      /* enum lm_ggml_type */
    uint64_t offset;                    /* into the data section */
    const void *data;                   /* into the map; valid until lm_gguf_close */
    size_t nbytes;
};

struct lm_gguf {
    struct lm_file_map map;
    uint32_t version;
    size_t alignment;                  /* general.alignment or 32 */
    struct lm_gguf_kv *kvs;            /* [n_kv] in file order */
    size_t n_kv;
    struct lm_gguf_tensor *tensors;    /* [n_tensors] in file order */
    size_t n_tensors;
    size_t *by_name;                   /* [n_tensors] indices sorted by name */
    size_t data_offset;                /* file offset of the data section */
    size_t data_bytes;                 /* sum of tensor sizes */
};

/* Opens and validates `path` into `g` (zeroed first). LM_ERR_IO when it cannot be read,
 * LM_ERR_FORMAT for any defect ("FILE: not a GGUF file (magic ...)", "FILE: truncated in the
 * metadata (key 12 of 26)", "FILE: tensor 'x' data [a, b) extends past the end of the file"),
 * LM_ERR_UNSUPPORTED for a version other than 2 or 3. */
lm_status lm_gguf_open(struct lm_gguf *g, const char *path);
/* Unmaps and frees; accepts a zeroed struct. */
void lm_gguf_close(struct lm_gguf *g);
/* True when the file at `path` starts with the GGUF magic (no other check). */
bool lm_gguf_is_gguf(const char *path);

/* The key/value `key`, or NULL. Borrowed. */
const struct lm_gguf_kv *lm_gguf_kv(const struct lm_gguf *g, const char *key);
/* The tensor `name`, or NULL. Borrowed. */
const struct lm_gguf_tensor *lm_gguf_tensor(const struct lm_gguf *g, const char *name);

/* Typed reads. Each names the file and key in its message. `_opt` variants leave *out alone
 * and return LM_OK when the key is absent; the others return LM_ERR_MISSING.
 * int: any integer type (and BOOL), checked against [lo, hi] (LM_ERR_FORMAT outside);
 * number: any integer or float type; bool: BOOL; str: STRING (a view into the map). */
lm_status lm_gguf_get_int(const struct lm_gguf *g, const char *key, int64_t lo, int64_t hi,
                          int64_t *out);
lm_status lm_gguf_get_int_opt(const struct lm_gguf *g, const char *key, int64_t lo, int64_t hi,
                              int64_t *out);
lm_status lm_gguf_get_number(const struct lm_gguf *g, const char *key, double *out);
lm_status lm_gguf_get_number_opt(const struct lm_gguf *g, const char *key, double *out);
lm_status lm_gguf_get_bool_opt(const struct lm_gguf *g, const char *key, bool *out);
lm_status lm_gguf_get_str(const struct lm_gguf *g, const char *key, struct lm_gguf_str *out);
lm_status lm_gguf_get_str_opt(const struct lm_gguf *g, const char *key, struct lm_gguf_str *out);
/* An array of `type` elements (LM_ERR_MISSING / LM_ERR_FORMAT otherwise). */
lm_status lm_gguf_get_array(const struct lm_gguf *g, const char *key, enum lm_gguf_type type,
                            const struct lm_gguf_kv **out);
/* Element i of an integer array (any integer element type) as int64. */
int64_t lm_gguf_array_int(const struct lm_gguf_kv *kv, uint64_t i);

/* The llama.cpp name of a Hugging Face tensor name of a llama-style decoder (llama.cpp's
 * gguf-py tensor_mapping.py): model.embed_tokens.weight -> token_embd.weight, model.norm.weight
 * -> output_norm.weight, lm_head.weight -> output.weight, and model.layers.N.<part>.{weight,bias}
 * -> blk.N.<name>.{weight,bias} for input_layernorm (attn_norm), self_attn.{q,k,v,o}_proj
 * (attn_q, attn_k, attn_v, attn_output), self_attn.{q,k}_norm (attn_q_norm, attn_k_norm),
 * post_attention_layernorm (ffn_norm), mlp.{gate,up,down}_proj (ffn_gate, ffn_up, ffn_down).
 * Writes it to out[cap]; false for a name outside that list. */
bool lm_gguf_name_from_hf(const char *hf, char *out, size_t cap);

/* ---- writing ----
 *
 * A writer collects the metadata and the tensor table in memory, then streams the file:
 * lm_gguf_writer_begin writes the header, metadata and tensor table (offsets follow from the
 * sizes), then lm_gguf_writer_tensor writes each tensor's bytes in the order they were added,
 * and lm_gguf_writer_finish closes the file. Keys are written in the order they are set; setting
 * a key twice is a programmer error (assert). Only one file is written at a time per writer. */
struct lm_gguf_writer {
    struct lm_buf meta;          /* serialized metadata */
    uint64_t n_kv;
    char **keys;                 /* [n_kv] owned copies, to catch duplicates */
    struct lm_buf tinfo;         /* serialized tensor table */
    uint64_t n_tensors;
    size_t *sizes;               /* [n_tensors] byte sizes */
    size_t cap_sizes;
    size_t alignment;
    uint64_t next_offset;        /* data offset of the next added tensor */
    /* streaming state */
    void *file;                  /* FILE * */
    char *path;
    uint64_t written;            /* tensors completely written */
    size_t part;                 /* bytes written of the current tensor */
};

/* A writer with alignment `alignment` (a power of two; 0 means 32). general.alignment is
 * written when it differs from 32. */
void lm_gguf_writer_init(struct lm_gguf_writer *w, size_t alignment);
/* Frees; closes and removes a half-written file. Accepts a zeroed struct. */
void lm_gguf_writer_free(struct lm_gguf_writer *w);

void lm_gguf_put_u32(struct lm_gguf_writer *w, const char *key, uint32_t v);
void lm_gguf_put_i32(struct lm_gguf_writer *w, const char *key, int32_t v);
void lm_gguf_put_f32(struct lm_gguf_writer *w, const char *key, float v);
void lm_gguf_put_bool(struct lm_gguf_writer *w, const char *key, bool v);
void lm_gguf_put_str(struct lm_gguf_writer *w, const char *key, const char *s, size_t len);
/* Arrays. Strings: n entries with their lengths; int32: n values. */
void lm_gguf_put_str_array(struct lm_gguf_writer *w, const char *key, const char *const *s,
                           const size_t *lens, size_t n);
void lm_gguf_put_i32_array(struct lm_gguf_writer *w, const char *key, const int32_t *v, size_t n);

/* Adds a tensor of ggml `type` with extents ne[0..ndim) (innermost first). The extent ne[0]
 * must be a multiple of the type's block. Returns its data size in bytes. */
size_t lm_gguf_add_tensor(struct lm_gguf_writer *w, const char *name, uint32_t type, int ndim,
                          const int64_t *ne);
/* Writes the header, metadata and tensor table to `path`. LM_ERR_IO. */
lm_status lm_gguf_writer_begin(struct lm_gguf_writer *w, const char *path);
/* Writes the next `nbytes` bytes of tensor data, tensors in the order they were added; a tensor
 * may come in several parts (never more bytes than it has left: assert), and the padding follows
 * when it is complete. LM_ERR_IO. */
lm_status lm_gguf_writer_tensor(struct lm_gguf_writer *w, const void *data, size_t nbytes);
/* Checks that every tensor was written and closes the file. LM_ERR_IO. */
lm_status lm_gguf_writer_finish(struct lm_gguf_writer *w);

#endif
