/* test_gguf.c: GGUF bundles (format/gguf.h, family/bundle.h).
 *   - the writer and reader agree on every value type, arrays, tensors and alignment;
 *     lm_gguf_name_from_hf;
 *   - corrupt files are rejected with a message naming the file: every truncation point, bad
 *     magic, unsupported version, impossible counts, unknown value and tensor types, misaligned,
 *     out-of-file and overlapping tensor data, duplicate names, a bad general.alignment; and at
 *     model level a missing key, a missing tensor, a tensor of the wrong shape or type;
 *   - llama.cpp's own conversions of the tiny model (../shared/models/tiny-qwen3-gguf; skipped
 *     when absent): the bf16 file reproduces the transformers reference logits and greedy ids
 *     (tolerance of test_model), its tokenizer encodes the tokenizer fixtures as tokenizer.json
 *     does, the q8_0 file's logits are close to the bf16 ones; `lumen build` writes the same
 *     tokenizer metadata and tensor bytes as llama.cpp's converter (bf16 and q8_0);
 *   - round trip: bundles written by lm_bundle_build at bf16 and f32 give logits bit-identical
 *     to the safetensors folder, f16 within 1e-3; mapped and copied GGUF weights agree.
 * LM_LINK: lm_family lm_format lm_text lm_backend lm_base
 * LM_LABEL: model */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/file.h"
#include "base/json.h"
#include "check.h"
#include "family/bundle.h"
#include "family/model.h"
#include "fixtures.h"
#include "format/gguf.h"

#define SHARED_GGUF LM_SOURCE_DIR "/../shared/models/tiny-qwen3-gguf/"
#define TOL 2e-5

static char g_tmpdir[64];

static char *tmp_path(const char *name) {
    char *p = malloc(strlen(g_tmpdir) + strlen(name) + 2);
    sprintf(p, "%s/%s", g_tmpdir, name);
    return p;
}

/* ---- writer / reader ---- */

static void test_roundtrip_format(void) {
    char *path = tmp_path("rt.gguf");
    for (int pass = 0; pass < 2; pass++) {
        size_t align = pass ? 64 : 0;
        struct lm_gguf_writer w;
        lm_gguf_writer_init(&w, align);
        lm_gguf_put_u32(&w, "a.u32", 4000000000u);
        lm_gguf_put_i32(&w, "a.i32", -7);
        lm_gguf_put_f32(&w, "a.f32", 0.25f);
        lm_gguf_put_bool(&w, "a.bool", true);
        lm_gguf_put_str(&w, "a.str", "h\xc3\xa9llo", 6);
        const char *strs[] = {"x", "", "yz"};
        size_t lens[] = {1, 0, 2};
        lm_gguf_put_str_array(&w, "a.strs", strs, lens, 3);
        int32_t iv[] = {1, -2, 3};
        lm_gguf_put_i32_array(&w, "a.ints", iv, 3);
        float t1[5] = {1, 2, 3, 4, 5};
        uint16_t t2[64];
        for (int i = 0; i < 64; i++) t2[i] = (uint16_t)(i * 31);
        unsigned char t3[34 * 2];
        for (int i = 0; i < 68; i++) t3[i] = (unsigned char)(i * 7);
        int64_t ne1[1] = {5}, ne2[2] = {16, 4}, ne3[2] = {32, 2};
        CHECK(lm_gguf_add_tensor(&w, "t.f32", LM_GGML_F32, 1, ne1) == 20, "size f32");
        CHECK(lm_gguf_add_tensor(&w, "t.bf16", LM_GGML_BF16, 2, ne2) == 128, "size bf16");
        CHECK(lm_gguf_add_tensor(&w, "t.q8", LM_GGML_Q8_0, 2, ne3) == 68, "size q8_0");
        CHECK(lm_gguf_writer_begin(&w, path) == LM_OK, "begin: %s", lm_error_message());
        CHECK(lm_gguf_writer_tensor(&w, t1, 20) == LM_OK, "t1");
        CHECK(lm_gguf_writer_tensor(&w, t2, 100) == LM_OK && lm_gguf_writer_tensor(&w, t2 + 50, 28) == LM_OK,
              "t2 in two parts");
        CHECK(lm_gguf_writer_tensor(&w, t3, 68) == LM_OK, "t3");
        CHECK(lm_gguf_writer_finish(&w) == LM_OK, "finish: %s", lm_error_message());
        lm_gguf_writer_free(&w);

        struct lm_gguf g;
        CHECK(lm_gguf_open(&g, path) == LM_OK, "open: %s", lm_error_message());
        CHECK(g.version == 3 && g.alignment == (align ? align : 32) && g.n_kv == 8 && g.n_tensors == 3,
              "header: v%u align %zu kv %zu t %zu", g.version, g.alignment, g.n_kv, g.n_tensors);
        int64_t v;
        double d;
        bool b = false;
        struct lm_gguf_str s;
        const struct lm_gguf_kv *kv;
        CHECK(lm_gguf_get_int(&g, "a.u32", 0, 5000000000LL, &v) == LM_OK && v == 4000000000LL, "u32");
        CHECK(lm_gguf_get_int(&g, "a.i32", -10, 10, &v) == LM_OK && v == -7, "i32");
        CHECK(lm_gguf_get_int(&g, "a.i32", 0, 10, &v) == LM_ERR_FORMAT && strstr(lm_error_message(), "a.i32"),
              "range: %s", lm_error_message());
        CHECK(lm_gguf_get_number(&g, "a.f32", &d) == LM_OK && d == 0.25, "f32");
        CHECK(lm_gguf_get_number(&g, "a.u32", &d) == LM_OK && d == 4e9, "number from u32");
        CHECK(lm_gguf_get_bool_opt(&g, "a.bool", &b) == LM_OK && b, "bool");
        CHECK(lm_gguf_get_str(&g, "a.str", &s) == LM_OK && s.len == 6 && !memcmp(s.p, "h\xc3\xa9llo", 6), "str");
        CHECK(lm_gguf_get_str(&g, "a.u32", &s) == LM_ERR_FORMAT && strstr(lm_error_message(), "rt.gguf"),
              "wrong type names the file: %s", lm_error_message());
        CHECK(lm_gguf_get_int(&g, "nope", 0, 1, &v) == LM_ERR_MISSING && strstr(lm_error_message(), "'nope'"),
              "missing: %s", lm_error_message());
        v = 42;
        CHECK(lm_gguf_get_int_opt(&g, "nope", 0, 1, &v) == LM_OK && v == 42, "optional absent");
        CHECK(lm_gguf_get_array(&g, "a.strs", LM_GGUF_STRING, &kv) == LM_OK && kv->arr_n == 3 &&
                  kv->strs[0].len == 1 && kv->strs[1].len == 0 && !memcmp(kv->strs[2].p, "yz", 2),
              "string array");
        CHECK(lm_gguf_get_array(&g, "a.ints", LM_GGUF_INT32, &kv) == LM_OK && lm_gguf_array_int(kv, 1) == -2,
              "int array");
        CHECK(lm_gguf_get_array(&g, "a.ints", LM_GGUF_STRING, &kv) == LM_ERR_FORMAT, "array type");
        const struct lm_gguf_tensor *t = lm_gguf_tensor(&g, "t.bf16");
        CHECK(t && t->ndim == 2 && t->ne[0] == 16 && t->ne[1] == 4 && t->type == LM_GGML_BF16 && t->nbytes == 128,
              "tensor info");
        CHECK(t && (uintptr_t)t->data % g.alignment == 0 && !memcmp(t->data, t2, 128), "tensor data");
        t = lm_gguf_tensor(&g, "t.q8");
        CHECK(t && !memcmp(t->data, t3, 68) && (uintptr_t)t->data % g.alignment == 0, "q8 data");
        t = lm_gguf_tensor(&g, "t.f32");
        CHECK(t && !memcmp(t->data, t1, 20), "f32 data");
        CHECK(!lm_gguf_tensor(&g, "t.none"), "absent tensor");
        lm_gguf_close(&g);
    }
    char n[64];
    CHECK(lm_gguf_name_from_hf("model.layers.12.self_attn.q_proj.weight", n, sizeof n) &&
              !strcmp(n, "blk.12.attn_q.weight"), "%s", n);
    CHECK(lm_gguf_name_from_hf("model.layers.0.mlp.down_proj.weight", n, sizeof n) &&
              !strcmp(n, "blk.0.ffn_down.weight"), "%s", n);
    CHECK(lm_gguf_name_from_hf("model.layers.3.post_attention_layernorm.weight", n, sizeof n) &&
              !strcmp(n, "blk.3.ffn_norm.weight"), "%s", n);
    CHECK(lm_gguf_name_from_hf("model.layers.1.self_attn.k_norm.weight", n, sizeof n) &&
              !strcmp(n, "blk.1.attn_k_norm.weight"), "%s", n);
    CHECK(lm_gguf_name_from_hf("model.embed_tokens.weight", n, sizeof n) && !strcmp(n, "token_embd.weight"), "%s", n);
    CHECK(lm_gguf_name_from_hf("lm_head.weight", n, sizeof n) && !strcmp(n, "output.weight"), "%s", n);
    CHECK(lm_gguf_name_from_hf("model.norm.weight", n, sizeof n) && !strcmp(n, "output_norm.weight"), "%s", n);
    CHECK(!lm_gguf_name_from_hf("model.layers.x.mlp.up_proj.weight", n, sizeof n), "bad layer");
    CHECK(!lm_gguf_name_from_hf("model.layers.1.mlp.up_proj.scales", n, sizeof n), "bad suffix");
    CHECK(!lm_gguf_name_from_hf("model.visual.proj.weight", n, sizeof n), "unknown");
    unlink(path);
    free(path);
}

/* ---- corrupt files ---- */

static struct lm_buf g_good; /* a small valid file */

static void write_bytes(const char *path, const void *p, size_t n) {
    CHECK(lm_file_write(path, p, n) == LM_OK, "write %s", path);
}

/* Opens bytes[0..n) as a file; returns the status and checks the message names the file. */
static lm_status open_bytes(const void *p, size_t n, const char *label) {
    char *path = tmp_path("bad.gguf");
    write_bytes(path, p, n);
    struct lm_gguf g;
    lm_status rc = lm_gguf_open(&g, path);
    if (rc) CHECK(strstr(lm_error_message(), "bad.gguf") != NULL, "%s: message names the file: %s", label,
                  lm_error_message());
    else
        lm_gguf_close(&g);
    unlink(path);
    free(path);
    return rc;
}

/* Offset of the tensor table in g_good: after the header and metadata. */
static size_t g_tinfo_off, g_data_off, g_last_end;

static void make_good(void) {
    char *path = tmp_path("good.gguf");
    struct lm_gguf_writer w;
    lm_gguf_writer_init(&w, 0);
    lm_gguf_put_str(&w, "general.architecture", "qwen3", 5);
    const char *strs[] = {"a", "b"};
    size_t lens[] = {1, 1};
    lm_gguf_put_str_array(&w, "x.strs", strs, lens, 2);
    lm_gguf_put_u32(&w, "x.n", 7);
    int64_t ne_a[2] = {8, 2}, ne_b[1] = {4};
    lm_gguf_add_tensor(&w, "a", LM_GGML_F32, 2, ne_a);
    lm_gguf_add_tensor(&w, "b", LM_GGML_F32, 1, ne_b);
    float data[16] = {0};
    lm_gguf_writer_begin(&w, path);
    lm_gguf_writer_tensor(&w, data, 64);
    lm_gguf_writer_tensor(&w, data, 16);
    lm_gguf_writer_finish(&w);
    lm_gguf_writer_free(&w);
    lm_file_read(path, &g_good);
    struct lm_gguf g;
    CHECK(lm_gguf_open(&g, path) == LM_OK, "good file opens: %s", lm_error_message());
    g_data_off = g.data_offset;
    g_last_end = g.data_offset + lm_gguf_tensor(&g, "b")->offset + 16;
    lm_gguf_close(&g);
    /* The tensor table starts at the name length of tensor "a": 8-byte length 1, then 'a'. */
    for (size_t i = 24; i + 9 < g_good.len; i++)
        if (!memcmp(g_good.p + i, "\x01\0\0\0\0\0\0\0a\x02\0\0\0", 13)) {
            g_tinfo_off = i;
            break;
        }
    CHECK(g_tinfo_off > 0, "tensor table found");
    unlink(path);
    free(path);
}

/* A copy of g_good with `n` bytes at `off` replaced. */
static lm_status patched(size_t off, const void *bytes, size_t n, const char *label) {
    char *c = malloc(g_good.len);
    memcpy(c, g_good.p, g_good.len);
    memcpy(c + off, bytes, n);
    lm_status rc = open_bytes(c, g_good.len, label);
    free(c);
    return rc;
}

static void test_corrupt(void) {
    make_good();
    /* Every truncation before the end of the last tensor's data. */
    int bad = 0;
    for (size_t n = 0; n < g_last_end; n++) {
        lm_status rc = open_bytes(g_good.p, n, "truncated");
        if (rc != LM_ERR_FORMAT) {
            bad++;
            if (bad < 4) fprintf(stderr, "truncation at %zu: status %d (%s)\n", n, rc, lm_error_message());
        }
    }
    CHECK(bad == 0, "%d truncation points not rejected as LM_ERR_FORMAT", bad);
    CHECK(open_bytes(g_good.p, 30, "trunc30") == LM_ERR_FORMAT && strstr(lm_error_message(), "truncated"),
          "truncated message: %s", lm_error_message());
    CHECK(open_bytes(g_good.p, g_data_off + 20, "trunc data") == LM_ERR_FORMAT &&
              strstr(lm_error_message(), "past the end"),
          "data message: %s", lm_error_message());
    CHECK(open_bytes(g_good.p, g_good.len, "whole") == LM_OK, "the whole file opens");

    CHECK(patched(0, "GGUX", 4, "magic") == LM_ERR_FORMAT && strstr(lm_error_message(), "not a GGUF"),
          "bad magic: %s", lm_error_message());
    uint32_t v = 1;
    CHECK(patched(4, &v, 4, "v1") == LM_ERR_UNSUPPORTED && strstr(lm_error_message(), "version 1"),
          "version 1: %s", lm_error_message());
    v = 4;
    CHECK(patched(4, &v, 4, "v4") == LM_ERR_UNSUPPORTED, "version 4");
    uint64_t big = 1ull << 40;
    CHECK(patched(16, &big, 8, "nkv") == LM_ERR_FORMAT, "huge key count: %s", lm_error_message());
    CHECK(patched(8, &big, 8, "nt") == LM_ERR_FORMAT, "huge tensor count");
    /* The first key is general.alignment (uint32): 8 + 17 bytes of key, then its type at 24 + 25. */
    uint32_t t = 99;
    CHECK(patched(24 + 8 + 17, &t, 4, "vtype") == LM_ERR_FORMAT && strstr(lm_error_message(), "value type"),
          "unknown value type: %s", lm_error_message());
    uint32_t al = 48;
    CHECK(patched(24 + 8 + 17 + 4, &al, 4, "align") == LM_ERR_FORMAT && strstr(lm_error_message(), "alignment"),
          "bad alignment: %s", lm_error_message());
    /* Tensor "a": name (9 bytes), ndim (4), ne (16), type (4), offset (8). */
    size_t ta = g_tinfo_off, type_off = ta + 9 + 4 + 16, off_off = type_off + 4;
    t = 77;
    CHECK(patched(type_off, &t, 4, "ttype") == LM_ERR_FORMAT && strstr(lm_error_message(), "ggml type"),
          "unknown tensor type: %s", lm_error_message());
    uint64_t o = 8;
    CHECK(patched(off_off, &o, 8, "misaligned") == LM_ERR_FORMAT && strstr(lm_error_message(), "multiple"),
          "misaligned: %s", lm_error_message());
    o = 4096;
    CHECK(patched(off_off, &o, 8, "past end") == LM_ERR_FORMAT && strstr(lm_error_message(), "past the end"),
          "offset past the end: %s", lm_error_message());
    /* Tensor "b" starts right after "a"'s entry: point "a" at b's data (overlap needs a's 64 bytes
     * to cover b's 16: move b to offset 32). */
    size_t tb_off_off = off_off + 8 + 9 + 4 + 8 + 4;
    o = 32;
    CHECK(patched(tb_off_off, &o, 8, "overlap") == LM_ERR_FORMAT && strstr(lm_error_message(), "overlap"),
          "overlap: %s", lm_error_message());
    CHECK(patched(off_off + 8 + 8, "a", 1, "dup") == LM_ERR_FORMAT && strstr(lm_error_message(), "twice"),
          "duplicate tensor: %s", lm_error_message());
    uint32_t nd = 7;
    CHECK(patched(ta + 9, &nd, 4, "ndim") == LM_ERR_FORMAT && strstr(lm_error_message(), "dimensions"),
          "ndim: %s", lm_error_message());
    lm_buf_free(&g_good);
}

/* ---- model-level defects: a copy of a GGUF with one change ---- */

enum edit { DROP_KEY, DROP_TENSOR, RESHAPE_TENSOR, RETYPE_TENSOR };

/* Rewrites `src` to `dst` with `what` (a key or tensor name) dropped or altered. */
static void rewrite(const char *src, const char *dst, enum edit e, const char *what) {
    struct lm_gguf g;
    CHECK(lm_gguf_open(&g, src) == LM_OK, "open %s: %s", src, lm_error_message());
    struct lm_gguf_writer w;
    lm_gguf_writer_init(&w, g.alignment);
    for (size_t i = 0; i < g.n_kv; i++) {
        const struct lm_gguf_kv *kv = &g.kvs[i];
        if (!strcmp(kv->key, "general.alignment") || (e == DROP_KEY && !strcmp(kv->key, what))) continue;
        switch (kv->type) {
        case LM_GGUF_STRING: lm_gguf_put_str(&w, kv->key, kv->v.s.p, kv->v.s.len); break;
        case LM_GGUF_UINT32: lm_gguf_put_u32(&w, kv->key, (uint32_t)kv->v.u); break;
        case LM_GGUF_INT32: lm_gguf_put_i32(&w, kv->key, (int32_t)kv->v.i); break;
        case LM_GGUF_FLOAT32: lm_gguf_put_f32(&w, kv->key, (float)kv->v.f); break;
        case LM_GGUF_BOOL: lm_gguf_put_bool(&w, kv->key, kv->v.u != 0); break;
        case LM_GGUF_ARRAY:
            if (kv->arr_type == LM_GGUF_STRING) {
                const char **s = malloc(sizeof *s * kv->arr_n);
                size_t *l = malloc(sizeof *l * kv->arr_n);
                for (uint64_t j = 0; j < kv->arr_n; j++) s[j] = kv->strs[j].p, l[j] = kv->strs[j].len;
                lm_gguf_put_str_array(&w, kv->key, s, l, kv->arr_n);
                free(s), free(l);
            } else {
                int32_t *a = malloc(sizeof *a * (kv->arr_n ? kv->arr_n : 1));
                for (uint64_t j = 0; j < kv->arr_n; j++) a[j] = (int32_t)lm_gguf_array_int(kv, j);
                lm_gguf_put_i32_array(&w, kv->key, a, kv->arr_n);
                free(a);
            }
            break;
        default: CHECK(0, "rewrite: key %s of type %d", kv->key, kv->type);
        }
    }
    for (size_t i = 0; i < g.n_tensors; i++) {
        const struct lm_gguf_tensor *t = &g.tensors[i];
        if (e == DROP_TENSOR && !strcmp(t->name, what)) continue;
        int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
        uint32_t type = t->type;
        if (!strcmp(t->name, what) && e == RESHAPE_TENSOR) ne[0] /= 2, ne[1] *= 2;
        if (!strcmp(t->name, what) && e == RETYPE_TENSOR) type = LM_GGML_I16; /* same size as BF16 */
        lm_gguf_add_tensor(&w, t->name, type, t->ndim, ne);
    }
    CHECK(lm_gguf_writer_begin(&w, dst) == LM_OK, "begin");
    for (size_t i = 0; i < g.n_tensors; i++) {
        const struct lm_gguf_tensor *t = &g.tensors[i];
        if (e == DROP_TENSOR && !strcmp(t->name, what)) continue;
        lm_gguf_writer_tensor(&w, t->data, t->nbytes);
    }
    CHECK(lm_gguf_writer_finish(&w) == LM_OK, "finish");
    lm_gguf_writer_free(&w);
    lm_gguf_close(&g);
}

static void expect_open_error(const char *path, lm_status want, const char *needle, const char *label) {
    struct lm_model *m = NULL;
    lm_status rc = lm_model_open(path, NULL, &m);
    CHECK(rc == want, "%s: status %d, want %d (%s)", label, rc, want, lm_error_message());
    CHECK(strstr(lm_error_message(), needle) != NULL, "%s: message '%s' lacks '%s'", label, lm_error_message(),
          needle);
    lm_model_close(m);
}

static void test_model_defects(const char *good) {
    char *p = tmp_path("defect.gguf");
    rewrite(good, p, DROP_KEY, "qwen3.block_count");
    expect_open_error(p, LM_ERR_MISSING, "defect.gguf: missing key 'qwen3.block_count'", "missing key");
    rewrite(good, p, DROP_KEY, "tokenizer.ggml.merges");
    expect_open_error(p, LM_ERR_MISSING, "tokenizer.ggml.merges", "missing merges");
    rewrite(good, p, DROP_TENSOR, "blk.1.attn_v.weight");
    expect_open_error(p, LM_ERR_MISSING, "defect.gguf: tensor 'blk.1.attn_v.weight'", "missing tensor");
    rewrite(good, p, RESHAPE_TENSOR, "blk.0.attn_q.weight");
    expect_open_error(p, LM_ERR_SHAPE, "defect.gguf: tensor 'blk.0.attn_q.weight' has extents [16, 128]",
                      "wrong shape");
    rewrite(good, p, RETYPE_TENSOR, "blk.2.ffn_up.weight");
    expect_open_error(p, LM_ERR_SHAPE, "'blk.2.ffn_up.weight' has type I16", "wrong type");
    unlink(p);
    /* A file that is not a GGUF at all. */
    write_bytes(p, "{\"a\": 1}", 8);
    expect_open_error(p, LM_ERR_FORMAT, "not a GGUF file", "json file");
    unlink(p);
    free(p);
}

/* ---- llama.cpp's files and round trips ---- */

/* The HF reference: last logits within TOL and the greedy ids, for every case. */
static void check_reference(struct lm_model *m, const struct ref_case *cs, int n, const char *label) {
    const int vocab = lm_model_config(m)->vocab_size;
    double worst = 0;
    for (int c = 0; c < n; c++) {
        char path[512];
        snprintf(path, sizeof path, REF_DIR "%s", cs[c].last_file);
        struct lm_buf b = {0};
        CHECK(lm_file_read(path, &b) == LM_OK && b.len == (size_t)vocab * 4, "%s", path);
        struct lm_seq *s;
        int np = (int)cs[c].prompt.n;
        float *logits = malloc(sizeof(float) * vocab);
        CHECK(lm_seq_create(m, np + (int)cs[c].greedy.n, &s) == LM_OK, "seq");
        CHECK(lm_seq_forward(s, cs[c].prompt.v, np, logits, false) == LM_OK, "forward: %s", lm_error_message());
        if (b.len == (size_t)vocab * 4) {
            double e = rel_norm(logits, (const float *)b.p, vocab);
            worst = fmax(worst, e);
            CHECK(e <= TOL, "%s %s: last logits ||d||/||ref|| = %.3g", label, cs[c].name, e);
        }
        int bad = -1;
        for (size_t t = 0; t < cs[c].greedy.n; t++) {
            int32_t id = argmax(logits, vocab);
            if (id != cs[c].greedy.v[t] && bad < 0) bad = (int)t;
            if (t + 1 < cs[c].greedy.n) lm_seq_forward(s, &id, 1, logits, false);
        }
        CHECK(bad < 0, "%s %s: greedy id %d differs from the reference", label, cs[c].name, bad);
        lm_seq_destroy(s);
        free(logits);
        lm_buf_free(&b);
    }
    fprintf(stderr, "%s: worst last-logits ||d||/||ref|| = %.3g over %d cases, greedy ids match\n", label, worst, n);
}

/* The tokenizer read from a GGUF encodes the tokenizer fixtures as tokenizer.json does. */
static void check_tokenizer(const struct lm_tokenizer *tok, const char *label) {
    struct lm_buf b = {0};
    CHECK(lm_file_read(TEST_DATA("fixtures/tokenizer/encode_cases.jsonl"), &b) == LM_OK, "encode cases");
    int n = 0, bad = 0;
    for (char *line = b.p; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        json_error_t e;
        json_t *j = json_loads(line, JSON_ALLOW_NUL, &e);
        if (!j) fprintf(stderr, "%s: line %d: %s\n", label, n, e.text);
        if (j) {
            json_t *jt = json_object_get(j, "text"), *jd = json_object_get(j, "decoded");
            const char *text = json_string_value(jt);
            size_t tlen = json_string_length(jt);
            struct lm_ids want = {0}, want_t = {0}, got = {0}, got_t = {0};
            lm_json_to_ids(json_object_get(j, "ids"), "ids", &want);
            lm_json_to_ids(json_object_get(j, "ids_special_as_text"), "ids", &want_t);
            lm_tokenizer_encode(tok, text, tlen, 0, &got);
            lm_tokenizer_encode(tok, text, tlen, LM_ENCODE_SPECIAL_AS_TEXT, &got_t);
            bool ok = got.n == want.n && !memcmp(got.v, want.v, 4 * got.n) && got_t.n == want_t.n &&
                      !memcmp(got_t.v, want_t.v, 4 * got_t.n);
            if (!ok && bad++ < 3) fprintf(stderr, "%s: encode case %d differs\n", label, n);
            struct lm_buf dec = {0};
            lm_tokenizer_decode(tok, want.v, want.n, false, &dec);
            if ((dec.len != json_string_length(jd) || memcmp(dec.p ? dec.p : "", json_string_value(jd), dec.len)) &&
                bad++ < 3)
                fprintf(stderr, "%s: decode case %d differs\n", label, n);
            lm_buf_free(&dec);
            lm_ids_free(&want), lm_ids_free(&want_t), lm_ids_free(&got), lm_ids_free(&got_t);
            json_decref(j);
            n++;
        }
        line = nl ? nl + 1 : NULL;
    }
    lm_buf_free(&b);
    CHECK(n == 56 && bad == 0, "%s: %d of %d tokenizer cases differ", label, bad, n);
}

/* Tensor data of two GGUF files is byte-identical for every tensor of `a`. */
static void check_same_tensors(const char *a, const char *b, const char *label) {
    struct lm_gguf ga, gb;
    CHECK(lm_gguf_open(&ga, a) == LM_OK && lm_gguf_open(&gb, b) == LM_OK, "open: %s", lm_error_message());
    int bad = 0;
    for (size_t i = 0; i < ga.n_tensors; i++) {
        const struct lm_gguf_tensor *x = &ga.tensors[i], *y = lm_gguf_tensor(&gb, x->name);
        if (!y || y->type != x->type || y->nbytes != x->nbytes || memcmp(x->ne, y->ne, sizeof x->ne) ||
            memcmp(x->data, y->data, x->nbytes))
            bad++;
    }
    CHECK(bad == 0 && ga.n_tensors == gb.n_tensors, "%s: %d of %zu tensors differ", label, bad, ga.n_tensors);
    /* The tokenizer metadata too. */
    const char *keys[] = {"tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type"};
    for (int k = 0; k < 3; k++) {
        const struct lm_gguf_kv *x = lm_gguf_kv(&ga, keys[k]), *y = lm_gguf_kv(&gb, keys[k]);
        bool same = x && y && x->arr_n == y->arr_n && x->arr_type == y->arr_type;
        for (uint64_t j = 0; same && j < x->arr_n; j++) {
            if (x->arr_type == LM_GGUF_STRING)
                same = x->strs[j].len == y->strs[j].len && !memcmp(x->strs[j].p, y->strs[j].p, x->strs[j].len);
            else
                same = lm_gguf_array_int(x, j) == lm_gguf_array_int(y, j);
        }
        CHECK(same, "%s: %s differs", label, keys[k]);
    }
    const char *skeys[] = {"tokenizer.chat_template", "tokenizer.ggml.pre", "general.architecture"};
    for (int k = 0; k < 3; k++) {
        struct lm_gguf_str x = {0}, y = {0};
        lm_gguf_get_str(&ga, skeys[k], &x);
        lm_gguf_get_str(&gb, skeys[k], &y);
        CHECK(x.len && x.len == y.len && !memcmp(x.p, y.p, x.len), "%s: %s differs", label, skeys[k]);
    }
    const char *ikeys[] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.bos_token_id",
                           "tokenizer.ggml.padding_token_id", "qwen3.block_count", "qwen3.context_length",
                           "qwen3.attention.head_count_kv", "qwen3.attention.key_length", "general.file_type"};
    for (int k = 0; k < 8; k++) {
        int64_t x = -1, y = -2;
        lm_gguf_get_int(&ga, ikeys[k], 0, 1L << 40, &x);
        lm_gguf_get_int(&gb, ikeys[k], 0, 1L << 40, &y);
        CHECK(x == y, "%s: %s %lld vs %lld", label, ikeys[k], (long long)x, (long long)y);
    }
    lm_gguf_close(&ga);
    lm_gguf_close(&gb);
}

static void test_llama_cpp_files(const struct ref_case *cs, int n) {
    const char *bf16 = SHARED_GGUF "tiny-qwen3-bf16.gguf", *q8 = SHARED_GGUF "tiny-qwen3-q8_0.gguf";
    if (!lm_file_exists(bf16) || !lm_file_exists(q8)) {
        fprintf(stderr, "llama.cpp GGUF files: skipped (%s absent)\n", SHARED_GGUF);
        return;
    }
    struct lm_model *mb = NULL, *mq = NULL, *mt = NULL;
    CHECK(lm_model_open(bf16, NULL, &mb) == LM_OK, "open %s: %s", bf16, lm_error_message());
    CHECK(lm_model_open(q8, NULL, &mq) == LM_OK, "open %s: %s", q8, lm_error_message());
    CHECK(lm_model_open(TINY_MODEL, NULL, &mt) == LM_OK, "open tiny: %s", lm_error_message());
    if (!mb || !mq || !mt) goto done;
    const struct lm_model_config *c = lm_model_config(mb), *ct = lm_model_config(mt);
    CHECK(!strcmp(c->model_type, "qwen3") && c->hidden_size == ct->hidden_size &&
              c->num_hidden_layers == ct->num_hidden_layers && c->num_attention_heads == ct->num_attention_heads &&
              c->num_key_value_heads == ct->num_key_value_heads && c->head_dim == ct->head_dim &&
              c->intermediate_size == ct->intermediate_size && c->vocab_size == ct->vocab_size &&
              c->tie_word_embeddings && c->rope_theta == ct->rope_theta && c->rms_norm_eps == ct->rms_norm_eps &&
              c->max_position_embeddings == ct->max_position_embeddings && c->bos_token_id == ct->bos_token_id,
          "config from GGUF metadata equals config.json's");
    const struct lm_gen_defaults *g = lm_model_gen_defaults(mb);
    CHECK(g->n_eos == 1 && g->eos_token_ids[0] == 151645, "eos from tokenizer.ggml.eos_token_id");
    CHECK(!strcmp(lm_model_name(mb), "tiny-qwen3-bf16"), "name %s", lm_model_name(mb));
    struct lm_model_info info;
    lm_model_info(mq, &info);
    CHECK(!strcmp(info.weight_dtype, "q8_0") && !info.weights_mapped, "q8_0 info: %s", info.weight_dtype);
    check_reference(mb, cs, n, "llama.cpp bf16 GGUF");
    check_tokenizer(lm_model_tokenizer(mb), "GGUF tokenizer");
    /* q8_0 vs bf16: last logits of every case. Stated tolerance (measured below): relative L2
     * distance <= 5%, same top-1 on at least 8 of the 10 cases. */
    const int vocab = c->vocab_size;
    double worst = 0;
    int same_top1 = 0;
    for (int i = 0; i < n; i++) {
        float *a = last_logits(mb, &cs[i].prompt), *b = last_logits(mq, &cs[i].prompt);
        double e = rel_norm(b, a, vocab);
        worst = fmax(worst, e);
        same_top1 += argmax(a, vocab) == argmax(b, vocab);
        CHECK(e <= 0.05, "q8_0 vs bf16 %s: %g", cs[i].name, e);
        free(a), free(b);
    }
    CHECK(same_top1 >= n - 2, "q8_0 top-1 agrees on %d of %d", same_top1, n);
    fprintf(stderr, "llama.cpp q8_0 GGUF vs bf16: worst ||d||/||bf16|| = %.3g, top-1 equal on %d of %d\n",
            worst, same_top1, n);
    /* lumen build writes what llama.cpp's converter wrote. */
    char *ob = tmp_path("b-bf16.gguf"), *oq = tmp_path("b-q8_0.gguf");
    struct lm_bundle_build_params pb = {LM_DTYPE_BF16, NULL}, pq = {LM_DTYPE_Q8_0, NULL};
    CHECK(lm_bundle_build(TINY_MODEL, ob, &pb, NULL) == LM_OK, "build bf16: %s", lm_error_message());
    CHECK(lm_bundle_build(TINY_MODEL, oq, &pq, NULL) == LM_OK, "build q8_0: %s", lm_error_message());
    check_same_tensors(ob, bf16, "lumen build bf16 vs llama.cpp");
    check_same_tensors(oq, q8, "lumen build q8_0 vs llama.cpp");
    unlink(ob), unlink(oq);
    free(ob), free(oq);
done:
    lm_model_close(mb);
    lm_model_close(mq);
    lm_model_close(mt);
}

static void test_build_roundtrip(const struct ref_case *cs, int n) {
    struct lm_model *ref = NULL;
    CHECK(lm_model_open(TINY_MODEL, NULL, &ref) == LM_OK, "open: %s", lm_error_message());
    if (!ref) return;
    const int vocab = lm_model_config(ref)->vocab_size;
    float **want = calloc((size_t)n, sizeof *want);
    for (int i = 0; i < n; i++) want[i] = last_logits(ref, &cs[i].prompt);
    const enum lm_dtype dts[] = {LM_DTYPE_BF16, LM_DTYPE_F32, LM_DTYPE_F16};
    for (int d = 0; d < 3; d++) {
        char name[32];
        snprintf(name, sizeof name, "rt-%s.gguf", lm_dtype_name(dts[d]));
        char *path = tmp_path(name);
        struct lm_bundle_build_params bp = {dts[d], NULL};
        struct lm_bundle_build_stats st;
        CHECK(lm_bundle_build(TINY_MODEL, path, &bp, &st) == LM_OK, "build %s: %s", name, lm_error_message());
        CHECK(st.n_tensors == 35 && st.n_fallback_f16 == 0, "stats");
        struct lm_gguf g;
        CHECK(lm_gguf_open(&g, path) == LM_OK, "reopen");
        struct lm_gguf_str s = {0};
        CHECK(lm_gguf_get_str(&g, "lumen.source.sha256.model.safetensors", &s) == LM_OK && s.len == 64,
              "provenance key");
        CHECK(lm_gguf_get_str(&g, "lumen.version", &s) == LM_OK && s.len == strlen(LM_VERSION) &&
                  !memcmp(s.p, LM_VERSION, s.len), "lumen.version");
        const struct lm_gguf_tensor *nt = lm_gguf_tensor(&g, "blk.0.attn_norm.weight");
        CHECK(nt && nt->type == LM_GGML_F32, "norms stored F32");
        lm_gguf_close(&g);
        if (dts[d] == LM_DTYPE_BF16) test_model_defects(path);
        for (int map = 0; map < 2; map++) {
            struct lm_model_open_params p = lm_model_default_open_params();
            p.map_weights = map;
            struct lm_model *m = NULL;
            CHECK(lm_model_open(path, &p, &m) == LM_OK, "open %s: %s", name, lm_error_message());
            if (!m) continue;
            struct lm_model_info info;
            lm_model_info(m, &info);
            CHECK(info.weights_mapped == (bool)map, "%s mapped=%d", name, map);
            CHECK(!strcmp(info.weight_dtype, lm_dtype_name(dts[d])), "dtype %s", info.weight_dtype);
            double worst = 0;
            int differ = 0;
            for (int i = 0; i < n; i++) {
                float *got = last_logits(m, &cs[i].prompt);
                differ += memcmp(got, want[i], sizeof(float) * vocab) != 0;
                worst = fmax(worst, rel_norm(got, want[i], vocab));
                free(got);
            }
            if (dts[d] == LM_DTYPE_F16)
                CHECK(worst <= 1e-3, "f16 bundle vs safetensors: %g", worst);
            else
                CHECK(differ == 0, "%s bundle (map=%d): %d of %d cases not bit-identical (%g)", name, map,
                      differ, n, worst);
            if (!map) fprintf(stderr, "%s round trip: %d of %d cases differ, worst %.3g\n", name, differ, n, worst);
            lm_model_close(m);
        }
        unlink(path);
        free(path);
    }
    for (int i = 0; i < n; i++) free(want[i]);
    free(want);
    lm_model_close(ref);
}

int main(void) {
    snprintf(g_tmpdir, sizeof g_tmpdir, "/tmp/lumen_test_gguf_XXXXXX");
    if (!mkdtemp(g_tmpdir)) return 1;
    test_roundtrip_format();
    test_corrupt();
    struct ref_case *cs;
    int n = ref_cases_load(&cs);
    CHECK(n == 10, "%d reference cases", n);
    test_build_roundtrip(cs, n);
    test_llama_cpp_files(cs, n);
    ref_cases_free(cs, n);
    rmdir(g_tmpdir);
    return check_exit("test_gguf");
}
