/* test_safetensors.c: safetensors reading/writing and model-folder validation. Broken files are
 * written into a temporary folder; each must give its LM_ERR_* and a message naming the file,
 * never a crash. Also: sharded checkpoints, config.json variants, the tokenizer requirement.
 * LM_LINK: lm_family lm_format lm_text lm_backend lm_base */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "base/json.h"
#include "check.h"
#include "family/model.h"
#include "format/hf_config.h"
#include "format/safetensors.h"

static char g_dir[256];

static char *tmp_path(const char *name) { return lm_path_join(g_dir, name); }

/* Writes a raw file: 8-byte little-endian length, header text, then `data` bytes. */
static char *write_raw(const char *name, uint64_t hlen, const char *header, const void *data,
                       size_t ndata) {
    struct lm_buf b = {0};
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)(hlen >> (8 * i));
    lm_buf_append(&b, len8, 8);
    lm_buf_puts(&b, header);
    if (ndata) lm_buf_append(&b, data, ndata);
    char *p = tmp_path(name);
    lm_file_write(p, b.p, b.len);
    lm_buf_free(&b);
    return p;
}

static char *write_header(const char *name, const char *header, size_t ndata) {
    unsigned char data[256] = {0};
    return write_raw(name, strlen(header), header, data, ndata);
}

/* Opening `path` fails with `want` and a message that names the file and contains `needle`. */
static void expect_file_error(const char *path, lm_status want, const char *needle) {
    struct lm_safetensors st;
    lm_status rc = lm_st_open_file(&st, path);
    const char *msg = lm_error_message(), *base = strrchr(path, '/') + 1;
    CHECK(rc == want, "%s: status %s, expected %s (%s)", base, lm_status_name(rc),
          lm_status_name(want), msg);
    if (rc == LM_OK) {
        lm_st_close(&st);
        return;
    }
    CHECK(strstr(msg, base) != NULL, "message does not name %s: %s", base, msg);
    CHECK(!needle || strstr(msg, needle), "message lacks '%s': %s", needle, msg);
}

static void test_roundtrip(void) {
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[3] = {0x3f80, 0x4000, 0xc040};
    struct lm_st_write_tensor t[2] = {
        {.name = "a", .dtype = LM_ST_F32, .ndim = 2, .shape = {2, 3}, .data = a},
        {.name = "b.weight", .dtype = LM_ST_BF16, .ndim = 1, .shape = {3}, .data = b},
    };
    char *p = tmp_path("ok.safetensors");
    CHECK(lm_st_write_file(p, t, 2) == LM_OK, "write: %s", lm_error_message());
    struct lm_safetensors st;
    CHECK(lm_st_open_file(&st, p) == LM_OK, "open: %s", lm_error_message());
    CHECK(st.n_tensors == 2, "2 tensors");
    const struct lm_st_tensor *ta = lm_st_find(&st, "a"), *tb = lm_st_find(&st, "b.weight");
    CHECK(ta && ta->dtype == LM_ST_F32 && ta->ndim == 2 && ta->shape[0] == 2 && ta->shape[1] == 3 &&
              memcmp(ta->data, a, sizeof a) == 0,
          "tensor a");
    CHECK(tb && tb->dtype == LM_ST_BF16 && tb->numel == 3 && memcmp(tb->data, b, sizeof b) == 0,
          "tensor b");
    CHECK(lm_st_find(&st, "c") == NULL, "absent tensor");
    const struct lm_st_tensor *got;
    int64_t want[2] = {2, 3}, wrong[2] = {3, 2};
    CHECK(lm_st_get(&st, "a", 2, want, &got) == LM_OK && got == ta, "get a");
    CHECK(lm_st_get(&st, "a", 2, wrong, &got) == LM_ERR_SHAPE, "get a wrong shape");
    CHECK(strstr(lm_error_message(), "ok.safetensors: tensor 'a' has shape [2, 3], expected [3, 2]"),
          "%s", lm_error_message());
    CHECK(lm_st_get(&st, "zz", 1, want, &got) == LM_ERR_MISSING, "get missing");
    CHECK(strstr(lm_error_message(), "ok.safetensors: tensor 'zz' not found"), "%s", lm_error_message());
    /* Data starts 8-byte aligned after the padded header. */
    CHECK(((const unsigned char *)ta->data - st.files[0].data) % 8 == 0, "aligned data");
    lm_st_close(&st);
    lm_st_close(&st); /* a closed struct may be closed again */
    free(p);
}

static void test_broken_files(void) {
    char *p;
    /* Shorter than the length prefix. */
    p = tmp_path("tiny.safetensors");
    lm_file_write(p, "abc", 3);
    expect_file_error(p, LM_ERR_FORMAT, "truncated");
    free(p);
    /* Empty file. */
    p = tmp_path("empty.safetensors");
    lm_file_write(p, "", 0);
    expect_file_error(p, LM_ERR_FORMAT, NULL);
    free(p);
    /* Header length beyond the end of the file. */
    p = write_raw("hlen.safetensors", 1000000, "{}", NULL, 0);
    expect_file_error(p, LM_ERR_FORMAT, "beyond the end");
    free(p);
    p = write_raw("hlen_huge.safetensors", UINT64_MAX, "{}", NULL, 0);
    expect_file_error(p, LM_ERR_FORMAT, "beyond the end");
    free(p);
    /* Bad JSON; not an object. */
    p = write_header("badjson.safetensors", "{\"a\": {\"dtype\": \"F32\",", 0);
    expect_file_error(p, LM_ERR_FORMAT, "JSON");
    free(p);
    p = write_header("array.safetensors", "[1, 2]", 0);
    expect_file_error(p, LM_ERR_FORMAT, "object");
    free(p);
    /* Unknown dtype. */
    p = write_header("dtype.safetensors",
                     "{\"w\": {\"dtype\": \"Q4_K\", \"shape\": [2], \"data_offsets\": [0, 2]}}", 2);
    expect_file_error(p, LM_ERR_FORMAT, "unknown dtype 'Q4_K'");
    free(p);
    /* Size vs shape x dtype. */
    p = write_header("size.safetensors",
                     "{\"w\": {\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [0, 12]}}", 16);
    expect_file_error(p, LM_ERR_FORMAT, "needs 16 bytes");
    free(p);
    /* Data past the end of the file (a truncated download). */
    p = write_header("trunc.safetensors",
                     "{\"w\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}", 10);
    expect_file_error(p, LM_ERR_FORMAT, "truncated");
    free(p);
    /* Overlapping tensors. */
    p = write_header("overlap.safetensors",
                     "{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]},"
                     " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 16]}}",
                     16);
    expect_file_error(p, LM_ERR_FORMAT, "overlap");
    free(p);
    /* end < begin, negative dims, missing fields, bad metadata, too many dims. */
    p = write_header("order.safetensors",
                     "{\"a\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [8, 4]}}", 8);
    expect_file_error(p, LM_ERR_FORMAT, "'a'");
    free(p);
    p = write_header("neg.safetensors",
                     "{\"a\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", 4);
    expect_file_error(p, LM_ERR_FORMAT, "shape[0]");
    free(p);
    p = write_header("nooffsets.safetensors", "{\"a\": {\"dtype\": \"F32\", \"shape\": [1]}}", 4);
    expect_file_error(p, LM_ERR_FORMAT, "data_offsets");
    free(p);
    p = write_header("meta.safetensors", "{\"__metadata__\": 5}", 0);
    expect_file_error(p, LM_ERR_FORMAT, "__metadata__");
    free(p);
    p = write_header("dims.safetensors",
                     "{\"a\": {\"dtype\": \"U8\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 1]}}", 1);
    expect_file_error(p, LM_ERR_FORMAT, "dimensions");
    free(p);
    p = write_header("dup.safetensors",
                     "{\"a\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]},"
                     " \"a\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [1, 2]}}",
                     2);
    expect_file_error(p, LM_ERR_FORMAT, NULL);
    free(p);
    /* A valid file with metadata and an empty tensor. */
    p = write_header("valid.safetensors",
                     "{\"__metadata__\": {\"format\": \"pt\"},"
                     " \"e\": {\"dtype\": \"F32\", \"shape\": [0, 3], \"data_offsets\": [0, 0]},"
                     " \"a\": {\"dtype\": \"I64\", \"shape\": [2], \"data_offsets\": [0, 16]}}",
                     16);
    expect_file_error(p, LM_OK, NULL);
    free(p);
    /* A missing file. */
    p = tmp_path("absent.safetensors");
    expect_file_error(p, LM_ERR_IO, NULL);
    free(p);
}

/* ---- model folders ---- */

static struct lm_safetensors g_tiny;

/* Writes DIR/model.safetensors from the tiny checkpoint with `edit` applied. */
typedef void (*edit_fn)(struct lm_st_write_tensor *t, size_t *n);

static void write_checkpoint(const char *dir, const char *file, edit_fn edit) {
    struct lm_st_write_tensor *t = calloc(g_tiny.n_tensors + 1, sizeof *t);
    size_t n = 0;
    for (size_t i = 0; i < g_tiny.n_tensors; i++) {
        const struct lm_st_tensor *s = &g_tiny.tensors[i];
        t[n].name = s->name;
        t[n].dtype = s->dtype;
        t[n].ndim = s->ndim;
        memcpy(t[n].shape, s->shape, sizeof s->shape);
        t[n].data = s->data;
        n++;
    }
    if (edit) edit(t, &n);
    char *p = lm_path_join(dir, file);
    CHECK(lm_st_write_file(p, t, n) == LM_OK, "write %s: %s", p, lm_error_message());
    free(p);
    free(t);
}

static struct lm_st_write_tensor *find_w(struct lm_st_write_tensor *t, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(t[i].name, name)) return &t[i];
    return NULL;
}

static void edit_shape(struct lm_st_write_tensor *t, size_t *n) {
    struct lm_st_write_tensor *w = find_w(t, *n, "model.layers.1.self_attn.k_proj.weight");
    w->shape[0] = 16, w->shape[1] = 64; /* same bytes, transposed-looking shape */
}
static void edit_missing(struct lm_st_write_tensor *t, size_t *n) {
    struct lm_st_write_tensor *w = find_w(t, *n, "model.layers.2.mlp.up_proj.weight");
    *w = t[--*n];
}
static void edit_dtype(struct lm_st_write_tensor *t, size_t *n) {
    struct lm_st_write_tensor *w = find_w(t, *n, "model.norm.weight");
    w->dtype = LM_ST_I16; /* same size as BF16 */
}
static void edit_untie(struct lm_st_write_tensor *t, size_t *n) {
    /* A separate lm_head that equals the embedding. */
    struct lm_st_write_tensor *e = find_w(t, *n, "model.embed_tokens.weight");
    t[*n] = *e;
    t[*n].name = "lm_head.weight";
    ++*n;
}

/* Makes a model folder DIR/name with a config.json from the tiny one edited by `cfg_edit`
 * (a JSON object merged over it; keys with null are deleted), the given checkpoint, and
 * (when `tokenizer`) a symlink to the tiny tokenizer.json. Returns the folder (caller frees). */
static char *make_model(const char *name, const char *cfg_edit, edit_fn edit, bool tokenizer) {
    char *dir = lm_path_join(g_dir, name);
    mkdir(dir, 0755);
    json_t *cfg;
    lm_json_load_file(TINY_MODEL "/config.json", &cfg);
    if (cfg_edit) {
        json_t *e = json_loads(cfg_edit, 0, NULL);
        const char *k;
        json_t *v;
        json_object_foreach(e, k, v) {
            if (json_is_null(v))
                json_object_del(cfg, k);
            else
                json_object_set(cfg, k, v);
        }
        json_decref(e);
    }
    char *p = lm_path_join(dir, "config.json");
    json_dump_file(cfg, p, JSON_INDENT(2));
    free(p);
    json_decref(cfg);
    write_checkpoint(dir, "model.safetensors", edit);
    if (tokenizer) {
        p = lm_path_join(dir, "tokenizer.json");
        unlink(p);
        CHECK(symlink(LM_SOURCE_DIR "/models/tiny-qwen3/tokenizer.json", p) == 0, "symlink");
        free(p);
    }
    return dir;
}

static void expect_model_error(const char *dir, lm_status want, const char *needle) {
    struct lm_model *m = NULL;
    lm_status rc = lm_model_open(dir, NULL, &m);
    CHECK(rc == want, "%s: status %s, expected %s (%s)", dir, lm_status_name(rc), lm_status_name(want),
          lm_error_message());
    CHECK(strstr(lm_error_message(), needle), "message lacks \"%s\": %s", needle, lm_error_message());
    CHECK(m == NULL, "no model on failure");
    lm_model_close(m);
}

static void last_logits(struct lm_model *m, float *out) {
    int32_t ids[5] = {151644, 872, 198, 3838, 374};
    struct lm_seq *s;
    CHECK(lm_seq_create(m, 5, &s) == LM_OK, "seq");
    CHECK(lm_seq_forward(s, ids, 5, out, false) == LM_OK, "forward: %s", lm_error_message());
    lm_seq_destroy(s);
}

static void test_model_folders(void) {
    CHECK(lm_st_open_file(&g_tiny, TINY_MODEL "/model.safetensors") == LM_OK, "tiny: %s",
          lm_error_message());
    char *d;
    d = make_model("wrong_shape", NULL, edit_shape, true);
    expect_model_error(d, LM_ERR_SHAPE,
                       "model.safetensors: tensor 'model.layers.1.self_attn.k_proj.weight' has shape "
                       "[16, 64], expected [32, 32]");
    free(d);
    d = make_model("missing", NULL, edit_missing, true);
    expect_model_error(d, LM_ERR_MISSING,
                       "model.safetensors: tensor 'model.layers.2.mlp.up_proj.weight' not found");
    free(d);
    d = make_model("wrong_dtype", NULL, edit_dtype, true);
    expect_model_error(d, LM_ERR_SHAPE, "model.safetensors: tensor 'model.norm.weight' has dtype I16");
    free(d);
    d = make_model("llama", "{\"model_type\": \"llama\"}", NULL, true);
    expect_model_error(d, LM_ERR_UNSUPPORTED,
                       "config.json: model_type 'llama' is not supported (supported: qwen3)");
    free(d);
    d = make_model("no_hidden", "{\"hidden_size\": null}", NULL, true);
    expect_model_error(d, LM_ERR_MISSING, "config.json: missing key 'hidden_size'");
    free(d);
    d = make_model("str_layers", "{\"num_hidden_layers\": \"3\"}", NULL, true);
    expect_model_error(d, LM_ERR_FORMAT, "config.json: 'num_hidden_layers' is not an integer");
    free(d);
    d = make_model("yarn", "{\"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 1e6}}",
                   NULL, true);
    expect_model_error(d, LM_ERR_UNSUPPORTED, "'yarn' is not supported");
    free(d);
    d = make_model("no_theta", "{\"rope_parameters\": null}", NULL, true);
    expect_model_error(d, LM_ERR_MISSING, "rope_theta");
    free(d);
    d = make_model("bad_config", NULL, NULL, true);
    {
        char *p = lm_path_join(d, "config.json");
        lm_file_write(p, "{\"model_type\": ", 15);
        free(p);
    }
    expect_model_error(d, LM_ERR_FORMAT, "config.json");
    free(d);
    /* No tokenizer.json: the message says to pass --tokenizer; tokenizer_dir then works. */
    d = make_model("no_tokenizer", NULL, NULL, false);
    expect_model_error(d, LM_ERR_MISSING, "--tokenizer");
    struct lm_model *m = NULL, *ref = NULL;
    struct lm_model_open_params p = lm_model_default_open_params();
    p.tokenizer_dir = TINY_MODEL;
    CHECK(lm_model_open(d, &p, &m) == LM_OK, "open with tokenizer_dir: %s", lm_error_message());
    lm_model_close(m);
    free(d);
    /* A truncated checkpoint in a model folder. */
    d = make_model("truncated", NULL, NULL, true);
    {
        char *f = lm_path_join(d, "model.safetensors");
        CHECK(truncate(f, (off_t)(g_tiny.files[0].size - 1000)) == 0, "truncate");
        free(f);
    }
    expect_model_error(d, LM_ERR_FORMAT, "model.safetensors: truncated");
    free(d);

    CHECK(lm_model_open(TINY_MODEL, NULL, &ref) == LM_OK, "open tiny: %s", lm_error_message());
    int vocab = lm_model_config(ref)->vocab_size;
    float *a = malloc(sizeof(float) * vocab), *b = malloc(sizeof(float) * vocab);
    last_logits(ref, a);

    /* Old-style config (rope_theta at the top, eos list) and an untied lm_head equal to the
     * embedding give the same logits. */
    d = make_model("untied",
                   "{\"tie_word_embeddings\": false, \"rope_parameters\": null, \"rope_theta\": 1000000,"
                   " \"eos_token_id\": [151645, 151643]}",
                   edit_untie, true);
    {
        char *g = lm_path_join(d, "generation_config.json");
        const char *gc = "{\"eos_token_id\": [151645, 151662], \"temperature\": 0.6, \"top_p\": 0.95,"
                         " \"top_k\": 20}";
        lm_file_write(g, gc, strlen(gc));
        free(g);
    }
    CHECK(lm_model_open(d, NULL, &m) == LM_OK, "open untied: %s", lm_error_message());
    if (m) {
        const struct lm_gen_defaults *gd = lm_model_gen_defaults(m);
        CHECK(gd->n_eos == 3 && gd->eos_token_ids[0] == 151645 && gd->eos_token_ids[1] == 151662 &&
                  gd->eos_token_ids[2] == 151643,
              "merged eos ids (%d)", gd->n_eos);
        CHECK(gd->temperature == 0.6f && gd->top_p == 0.95f && gd->top_k == 20, "sampling defaults");
        last_logits(m, b);
        CHECK(memcmp(a, b, sizeof(float) * vocab) == 0, "untied lm_head logits differ");
        lm_model_close(m);
    }
    free(d);

    /* A sharded checkpoint: two shards and an index. */
    d = lm_path_join(g_dir, "sharded");
    mkdir(d, 0755);
    {
        struct lm_st_write_tensor *t = calloc(g_tiny.n_tensors, sizeof *t);
        json_t *wm = json_object();
        size_t n1 = 0, n2 = 0;
        struct lm_st_write_tensor *t2 = calloc(g_tiny.n_tensors, sizeof *t2);
        for (size_t i = 0; i < g_tiny.n_tensors; i++) {
            const struct lm_st_tensor *s = &g_tiny.tensors[i];
            bool first = strstr(s->name, "layers.2.") == NULL;
            struct lm_st_write_tensor *w = first ? &t[n1++] : &t2[n2++];
            w->name = s->name, w->dtype = s->dtype, w->ndim = s->ndim, w->data = s->data;
            memcpy(w->shape, s->shape, sizeof s->shape);
            json_object_set_new(wm, s->name,
                                json_string(first ? "model-00001-of-00002.safetensors"
                                                  : "model-00002-of-00002.safetensors"));
        }
        char *p1 = lm_path_join(d, "model-00001-of-00002.safetensors");
        char *p2 = lm_path_join(d, "model-00002-of-00002.safetensors");
        lm_st_write_file(p1, t, n1);
        lm_st_write_file(p2, t2, n2);
        json_t *idx = json_pack("{s:{s:i}, s:O}", "metadata", "total_size", 0, "weight_map", wm);
        char *ip = lm_path_join(d, "model.safetensors.index.json");
        json_dump_file(idx, ip, 0);
        json_decref(idx);
        char *cp = lm_path_join(d, "config.json"), *tp = lm_path_join(d, "tokenizer.json");
        symlink(LM_SOURCE_DIR "/models/tiny-qwen3/config.json", cp);
        symlink(LM_SOURCE_DIR "/models/tiny-qwen3/tokenizer.json", tp);
        CHECK(lm_model_open(d, NULL, &m) == LM_OK, "open sharded: %s", lm_error_message());
        if (m) {
            last_logits(m, b);
            CHECK(memcmp(a, b, sizeof(float) * vocab) == 0, "sharded logits differ");
            lm_model_close(m);
        }
        struct lm_safetensors st;
        CHECK(lm_st_open_dir(&st, d) == LM_OK && st.n_files == 2 &&
                  st.n_tensors == g_tiny.n_tensors,
              "sharded tensors");
        lm_st_close(&st);
        /* A tensor listed in the index but absent from its shard. */
        json_object_set_new(wm, "model.extra.weight", json_string("model-00002-of-00002.safetensors"));
        idx = json_pack("{s:O}", "weight_map", wm);
        json_dump_file(idx, ip, 0);
        json_decref(idx);
        CHECK(lm_st_open_dir(&st, d) == LM_ERR_MISSING, "extra tensor in the index");
        CHECK(strstr(lm_error_message(), "model.safetensors.index.json: tensor 'model.extra.weight'"),
              "%s", lm_error_message());
        /* A shard that does not exist. */
        json_object_set_new(wm, "model.extra.weight", json_string("model-00003-of-00002.safetensors"));
        idx = json_pack("{s:O}", "weight_map", wm);
        json_dump_file(idx, ip, 0);
        json_decref(idx);
        CHECK(lm_st_open_dir(&st, d) == LM_ERR_MISSING, "missing shard");
        CHECK(strstr(lm_error_message(), "model-00003-of-00002.safetensors"), "%s", lm_error_message());
        json_decref(wm);
        free(p1), free(p2), free(ip), free(cp), free(tp), free(t), free(t2);
    }
    free(d);
    /* A folder with no checkpoint. */
    d = lm_path_join(g_dir, "empty_dir");
    mkdir(d, 0755);
    struct lm_safetensors st;
    CHECK(lm_st_open_dir(&st, d) == LM_ERR_MISSING, "no checkpoint");
    free(d);

    free(a), free(b);
    lm_model_close(ref);
    lm_st_close(&g_tiny);
}

static void test_hf_config(void) {
    char *p = tmp_path("cfg.json");
    const char *j = "{\"a\": 3, \"b\": 2.5, \"c\": true, \"d\": \"x\", \"e\": [1, 2, 2], \"f\": null,"
                    " \"g\": {\"h\": 7}}";
    lm_file_write(p, j, strlen(j));
    free(p);
    struct lm_hf_config c;
    CHECK(lm_hf_config_load(&c, g_dir, "cfg.json") == LM_OK, "load");
    int i = -1;
    double x = -1;
    bool b = false;
    char s[4] = "";
    int32_t ids[4];
    int n = 0;
    CHECK(lm_hf_config_int(&c, "a", 0, 10, &i) == LM_OK && i == 3, "int");
    CHECK(lm_hf_config_int(&c, "a", 4, 10, &i) == LM_ERR_FORMAT, "int range");
    CHECK(lm_hf_config_int(&c, "f", 0, 10, &i) == LM_ERR_MISSING, "null is absent");
    CHECK(lm_hf_config_int(&c, "g.h", 0, 10, &i) == LM_OK && i == 7, "dotted key");
    CHECK(lm_hf_config_int_opt(&c, "zz", 0, 10, &i) == LM_OK && i == 7, "optional keeps value");
    CHECK(lm_hf_config_number_opt(&c, "b", &x) == LM_OK && x == 2.5, "number");
    CHECK(lm_hf_config_bool_opt(&c, "c", &b) == LM_OK && b, "bool");
    CHECK(lm_hf_config_string_opt(&c, "d", s, sizeof s) == LM_OK && !strcmp(s, "x"), "string");
    CHECK(lm_hf_config_ids_opt(&c, "e", ids, &n, 4) == LM_OK && n == 2, "id list deduplicated");
    CHECK(lm_hf_config_ids_opt(&c, "a", ids, &n, 4) == LM_OK && n == 3 && ids[2] == 3, "single id");
    CHECK(lm_hf_config_ids_opt(&c, "d", ids, &n, 4) == LM_ERR_FORMAT, "string is not an id");
    lm_hf_config_free(&c);
    CHECK(lm_hf_config_load(&c, g_dir, "nope.json") == LM_ERR_MISSING, "missing file");
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/lumen_test_safetensors_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_roundtrip();
    test_broken_files();
    test_hf_config();
    test_model_folders();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return check_exit("test_safetensors");
}
