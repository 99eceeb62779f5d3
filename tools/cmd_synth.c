/* cmd_synth.c: `lumen synth`: writes a Hugging Face layout Qwen3 checkpoint of a real model's
 * shape with deterministic random weights (for benchmarks: real Qwen3 weights cannot be
 * downloaded here). Matrices ~ N(0, 0.02^2) (transformers' initializer_range), norm weights
 * ~ 1 + N(0, 0.02^2); the tokenizer files are copied from a folder that has them. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/cpu/ops.h"
#include "base/buf.h"
#include "base/file.h"
#include "commands.h"
#include "format/safetensors.h"

struct shape {
    const char *name;
    int hidden, inter, layers, heads, kv_heads, head_dim, vocab;
    bool tied;
};

/* From the config.json files of Qwen/Qwen3-0.6B, -1.7B, -4B and -8B. */
static const struct shape k_shapes[] = {
    {"qwen3-0.6b", 1024, 3072, 28, 16, 8, 128, 151936, true},
    {"qwen3-1.7b", 2048, 6144, 28, 16, 8, 128, 151936, true},
    {"qwen3-4b", 2560, 9728, 36, 32, 8, 128, 151936, true},
    {"qwen3-8b", 4096, 12288, 36, 32, 8, 128, 151936, false},
};

static void usage(FILE *f) {
    fprintf(f,
            "usage: lumen synth --shape qwen3-0.6b|qwen3-1.7b|qwen3-4b|qwen3-8b --out DIR\n"
            "                   [--dtype bf16|f16|f32] [--seed N] [--tokenizer DIR]\n\n"
            "Writes a Qwen3 checkpoint in Hugging Face layout (config.json, generation_config.json,\n"
            "model.safetensors, tokenizer.json, tokenizer_config.json) with the real model's shape\n"
            "and deterministic random weights: matrices ~ N(0, 0.02^2), norm weights ~ 1 + N(0,\n"
            "0.02^2). The same seed gives the same bytes. For benchmarks (`lumen perf`), not text.\n\n"
            "  --shape S       qwen3-0.6b (28 layers, hidden 1024, 16/8 heads, head_dim 128,\n"
            "                  intermediate 3072, vocab 151936, tied), qwen3-1.7b (hidden 2048,\n"
            "                  intermediate 6144, otherwise the same), qwen3-4b (36 layers, hidden\n"
            "                  2560, 32/8 heads, intermediate 9728, tied) or qwen3-8b (36 layers,\n"
            "                  hidden 4096, 32/8 heads, intermediate 12288, separate lm_head); the\n"
            "                  whole checkpoint is held in memory while it is written (8b: 16 GB\n"
            "                  at bf16)\n"
            "  --out DIR       folder to write (created if absent; files in it are replaced)\n"
            "  --dtype T       weight dtype: bf16 (default), f16 or f32\n"
            "  --seed N        random seed (default 0)\n"
            "  --tokenizer DIR folder to copy tokenizer.json and tokenizer_config.json from\n"
            "                  (default models/tiny-qwen3, from the current folder or next to the\n"
            "                  lumen binary: build/lumen in a checkout)\n"
            "  -h, --help      show this help\n");
}

/* splitmix64, for seeding per tensor. */
static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Fills `n` elements of dtype t with mean + std * N(0, 1) (Box-Muller). */
static void fill_normal(void *out, enum lm_dtype t, size_t n, float mean, float std, uint64_t seed) {
    uint64_t s = seed;
    for (size_t i = 0; i < n; i += 2) {
        double u1 = ((splitmix(&s) >> 11) + 1) * (1.0 / 9007199254740993.0); /* (0, 1] */
        double u2 = (splitmix(&s) >> 11) * (1.0 / 9007199254740992.0);
        float r = sqrtf(-2.0f * logf((float)u1)), a = (float)(6.283185307179586 * u2);
        float v[2] = {mean + std * r * cosf(a), mean + std * r * sinf(a)};
        for (size_t j = 0; j < 2 && i + j < n; j++) {
            if (t == LM_DTYPE_F32)
                ((float *)out)[i + j] = v[j];
            else if (t == LM_DTYPE_BF16)
                ((uint16_t *)out)[i + j] = lm_f32_to_bf16(v[j]);
            else
                ((uint16_t *)out)[i + j] = lm_f32_to_f16(v[j]);
        }
    }
}

static lm_status copy_file(const char *from_dir, const char *to_dir, const char *name) {
    char *a = lm_path_join(from_dir, name), *b = lm_path_join(to_dir, name);
    struct lm_buf buf = {0};
    lm_status st = lm_file_read(a, &buf);
    if (!st) st = lm_file_write(b, buf.p, buf.len);
    lm_buf_free(&buf);
    free(a);
    free(b);
    return st;
}

static lm_status write_text(const char *dir, const char *name, const char *text) {
    char *p = lm_path_join(dir, name);
    lm_status st = lm_file_write(p, text, strlen(text));
    free(p);
    return st;
}

int lm_cmd_synth(int argc, char **argv) {
    static const struct option opts[] = {{"shape", required_argument, 0, 's'},
                                         {"out", required_argument, 0, 'o'},
                                         {"dtype", required_argument, 0, 'd'},
                                         {"seed", required_argument, 0, 'r'},
                                         {"tokenizer", required_argument, 0, 't'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const struct shape *sh = NULL;
    const char *out = NULL, *tok_dir = NULL;
    enum lm_dtype dt = LM_DTYPE_BF16;
    uint64_t seed = 0;
    int c;
    char *end;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 's':
            for (size_t i = 0; i < sizeof k_shapes / sizeof *k_shapes; i++)
                if (!strcmp(optarg, k_shapes[i].name)) sh = &k_shapes[i];
            if (!sh) {
                fprintf(stderr, "lumen synth: unknown --shape '%s' (qwen3-0.6b, qwen3-1.7b, qwen3-4b or "
                        "qwen3-8b)\n", optarg);
                return 2;
            }
            break;
        case 'o': out = optarg; break;
        case 'd':
            if (!strcmp(optarg, "bf16"))
                dt = LM_DTYPE_BF16;
            else if (!strcmp(optarg, "f16"))
                dt = LM_DTYPE_F16;
            else if (!strcmp(optarg, "f32"))
                dt = LM_DTYPE_F32;
            else {
                fprintf(stderr, "lumen synth: --dtype must be bf16, f16 or f32, not '%s'%s\n",
                        optarg,
                        strcmp(optarg, "q8_0") ? "" : " (for q8_0: lumen build --dtype q8_0)");
                return 2;
            }
            break;
        case 'r':
            seed = strtoull(optarg, &end, 10);
            if (*end) {
                fprintf(stderr, "lumen synth: --seed must be a non-negative integer, not '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case 't': tok_dir = optarg; break;
        case 'h': usage(stdout); return 0;
        default: return lm_cmd_usage_error("synth");
        }
    }
    if (optind < argc || !sh || !out) {
        fprintf(stderr, "lumen synth: %s\n",
                optind < argc ? lm_cmd_unexpected(argv[optind])
                : !sh         ? "--shape is required"
                              : "--out DIR is required");
        return lm_cmd_usage_error("synth");
    }
    /* The default: the checkout's tiny model, from the current folder or next to the binary. */
    char tok_buf[4096];
    if (!tok_dir) {
        char *found = lm_cmd_find_rel("models/tiny-qwen3", true);
        snprintf(tok_buf, sizeof tok_buf, "%s", found ? found : "models/tiny-qwen3");
        free(found);
        tok_dir = tok_buf;
    }
    char *tj = lm_path_join(tok_dir, "tokenizer.json");
    bool have_tok = lm_file_exists(tj);
    free(tj);
    if (!have_tok) {
        fprintf(stderr, "lumen synth: %s has no tokenizer.json; pass --tokenizer DIR\n", tok_dir);
        return 2;
    }
    if (mkdir(out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "lumen synth: cannot create %s: %s\n", out, strerror(errno));
        return 1;
    }

    /* The tensors, in the order transformers writes them (sorted by name). */
    const int H = sh->hidden, I = sh->inter, Q = sh->heads * sh->head_dim,
              KV = sh->kv_heads * sh->head_dim, D = sh->head_dim;
    size_t cap = 16 + (size_t)sh->layers * 11, n = 0;
    struct lm_st_write_tensor *t = calloc(cap, sizeof *t);
    char **names = calloc(cap, sizeof *names);
    const enum lm_st_dtype sdt = dt == LM_DTYPE_BF16 ? LM_ST_BF16 : dt == LM_DTYPE_F16 ? LM_ST_F16 : LM_ST_F32;
#define ADD(rows, cols, ...)                                                                     \
    do {                                                                                         \
        char nm[128];                                                                            \
        snprintf(nm, sizeof nm, __VA_ARGS__);                                                    \
        names[n] = strdup(nm);                                                                   \
        t[n] = (struct lm_st_write_tensor){.name = names[n], .dtype = sdt,                       \
                                           .ndim = (cols) ? 2 : 1, .shape = {rows, cols}};       \
        n++;                                                                                     \
    } while (0)
    if (!sh->tied) ADD(sh->vocab, H, "lm_head.weight");
    ADD(sh->vocab, H, "model.embed_tokens.weight");
    for (int l = 0; l < sh->layers; l++) {
        ADD(H, 0, "model.layers.%d.input_layernorm.weight", l);
        ADD(H, I, "model.layers.%d.mlp.down_proj.weight", l);
        ADD(I, H, "model.layers.%d.mlp.gate_proj.weight", l);
        ADD(I, H, "model.layers.%d.mlp.up_proj.weight", l);
        ADD(H, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        ADD(D, 0, "model.layers.%d.self_attn.k_norm.weight", l);
        ADD(KV, H, "model.layers.%d.self_attn.k_proj.weight", l);
        ADD(H, Q, "model.layers.%d.self_attn.o_proj.weight", l);
        ADD(D, 0, "model.layers.%d.self_attn.q_norm.weight", l);
        ADD(Q, H, "model.layers.%d.self_attn.q_proj.weight", l);
        ADD(KV, H, "model.layers.%d.self_attn.v_proj.weight", l);
    }
    ADD(H, 0, "model.norm.weight");
#undef ADD
    int rc = 0;
    size_t total = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        size_t numel = (size_t)t[i].shape[0] * (t[i].ndim == 2 ? (size_t)t[i].shape[1] : 1);
        void *data = malloc(numel * lm_dtype_size(dt));
        if (!data) {
            fprintf(stderr, "lumen synth: out of memory\n");
            rc = 1;
            break;
        }
        uint64_t s = seed * 1000003u + i;
        bool norm = t[i].ndim == 1;
        fill_normal(data, dt, numel, norm ? 1.0f : 0.0f, 0.02f, splitmix(&s));
        t[i].data = data;
        total += numel * lm_dtype_size(dt);
    }
    char *path = lm_path_join(out, "model.safetensors");
    if (!rc && lm_st_write_file(path, t, n)) rc = lm_cmd_fail("synth", NULL);
    free(path);
    for (size_t i = 0; i < n; i++) {
        free((void *)t[i].data);
        free(names[i]);
    }
    free(t);
    free(names);
    if (rc) return rc;

    char cfg[2048];
    snprintf(cfg, sizeof cfg,
             "{\n  \"architectures\": [\"Qwen3ForCausalLM\"],\n  \"attention_bias\": false,\n"
             "  \"attention_dropout\": 0.0,\n  \"bos_token_id\": 151643,\n  \"eos_token_id\": 151645,\n"
             "  \"head_dim\": %d,\n  \"hidden_act\": \"silu\",\n  \"hidden_size\": %d,\n"
             "  \"initializer_range\": 0.02,\n  \"intermediate_size\": %d,\n"
             "  \"max_position_embeddings\": 40960,\n  \"max_window_layers\": %d,\n"
             "  \"model_type\": \"qwen3\",\n  \"num_attention_heads\": %d,\n"
             "  \"num_hidden_layers\": %d,\n  \"num_key_value_heads\": %d,\n"
             "  \"rms_norm_eps\": 1e-06,\n  \"rope_scaling\": null,\n  \"rope_theta\": 1000000,\n"
             "  \"sliding_window\": null,\n  \"tie_word_embeddings\": %s,\n"
             "  \"torch_dtype\": \"%s\",\n  \"use_cache\": true,\n  \"use_sliding_window\": false,\n"
             "  \"vocab_size\": %d,\n  \"lumen_synthetic\": {\"shape\": \"%s\", \"seed\": %llu}\n}\n",
             D, H, I, sh->layers, sh->heads, sh->layers, sh->kv_heads, sh->tied ? "true" : "false",
             dt == LM_DTYPE_BF16 ? "bfloat16" : dt == LM_DTYPE_F16 ? "float16" : "float32", sh->vocab,
             sh->name, (unsigned long long)seed);
    const char *gen = "{\n  \"bos_token_id\": 151643,\n  \"do_sample\": true,\n"
                      "  \"eos_token_id\": [151645, 151643],\n  \"pad_token_id\": 151643,\n"
                      "  \"temperature\": 0.6,\n  \"top_k\": 20,\n  \"top_p\": 0.95\n}\n";
    if (write_text(out, "config.json", cfg) || write_text(out, "generation_config.json", gen) ||
        copy_file(tok_dir, out, "tokenizer.json") || copy_file(tok_dir, out, "tokenizer_config.json"))
        return lm_cmd_fail("synth", NULL);
    printf("wrote %s: %s, %s, %.1f MiB of weights, seed %llu\n", out, sh->name, lm_dtype_name(dt),
           total / (1024.0 * 1024.0), (unsigned long long)seed);
    return 0;
}
