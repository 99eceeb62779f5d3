/* cmd_build.c: `lumen build`: writes a GGUF bundle of a Hugging Face model folder
 * (family/bundle.h), loadable by `lumen run|serve|perf|logits --model FILE.gguf` and by
 * llama.cpp. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "commands.h"
#include "family/bundle.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: lumen build --model DIR --out FILE.gguf [--dtype bf16|f16|f32|q8_0]\n"
            "                   [--tokenizer DIR]\n\n"
            "Writes a GGUF v3 bundle of a Hugging Face model folder: the hyperparameters,\n"
            "tokenizer, chat template and tensors under the names and metadata keys that\n"
            "llama.cpp's converter uses (architecture qwen3), plus lumen's provenance keys\n"
            "(lumen.version, lumen.source.sha256.<file>). Norm weights are stored as F32.\n\n"
            "  --model DIR      Hugging Face model folder (config.json, *.safetensors,\n"
            "                   tokenizer.json; tokenizer_config.json when present gives the\n"
            "                   special tokens and the chat template the GGUF carries, else\n"
            "                   config.json's ids and no tokenizer.chat_template)\n"
            "  --out FILE       the GGUF file to write (replaced if present)\n"
            "  --dtype T        dtype of the weight matrices (default bf16): bf16 or f32 keep\n"
            "                   bf16/f32 weights bit for bit; f16 rounds to nearest even; q8_0 is\n"
            "                   GGUF's Q8_0 (32 int8 per float16 scale, llama.cpp's rounding);\n"
            "                   a matrix whose rows are not a multiple of 32 is then written f16\n"
            "  --tokenizer DIR  folder with tokenizer.json (and tokenizer_config.json) when the\n"
            "                   model folder has none\n"
            "  -h, --help       show this help\n");
}

int lm_cmd_build(int argc, char **argv) {
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"out", required_argument, 0, 'o'},
                                         {"dtype", required_argument, 0, 'd'},
                                         {"tokenizer", required_argument, 0, 't'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *model = NULL, *out = NULL;
    struct lm_bundle_build_params p = {LM_DTYPE_BF16, NULL};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'o': out = optarg; break;
        case 't': p.tokenizer_dir = optarg; break;
        case 'd':
            if (!strcmp(optarg, "bf16"))
                p.dtype = LM_DTYPE_BF16;
            else if (!strcmp(optarg, "f16"))
                p.dtype = LM_DTYPE_F16;
            else if (!strcmp(optarg, "f32"))
                p.dtype = LM_DTYPE_F32;
            else if (!strcmp(optarg, "q8_0"))
                p.dtype = LM_DTYPE_Q8_0;
            else {
                fprintf(stderr, "lumen build: unknown --dtype '%s' (bf16, f16, f32 or q8_0)\n", optarg);
                return 2;
            }
            break;
        case 'h': usage(stdout); return 0;
        default: return lm_cmd_usage_error("build");
        }
    }
    if (optind < argc || !model || !out) {
        fprintf(stderr, "lumen build: %s\n",
                optind < argc ? lm_cmd_unexpected(argv[optind])
                              : "--model DIR and --out FILE are required");
        return lm_cmd_usage_error("build");
    }
    if (lm_cmd_lacks_tokenizer(model, p.tokenizer_dir)) return lm_cmd_fail("build", NULL);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    struct lm_bundle_build_stats st;
    if (lm_bundle_build(model, out, &p, &st)) return lm_cmd_fail("build", NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    printf("wrote %s: %ld tensors, %s matrices, %.1f MiB of tensor data in %.1f s\n", out, st.n_tensors,
           lm_dtype_name(p.dtype), (double)st.data_bytes / (1024.0 * 1024.0), s);
    if (st.n_fallback_f16)
        printf("note: %d matrices have rows that are not a multiple of 32 and were written as f16\n",
               st.n_fallback_f16);
    return 0;
}
