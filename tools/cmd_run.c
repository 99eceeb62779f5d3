/* cmd_run.c: `lumen run`: one generation on the CPU from the command line.
 *
 * With --ids the prompt is a JSON array of token ids and the output the generated ids; otherwise
 * the prompt is one user message rendered with the model's chat template and the reply is
 * printed as it is produced. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/file.h"
#include "base/json.h"
#include "commands.h"
#include "engine/generate.h"
#include "family/model.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: lumen run --model DIR|FILE.gguf [--tokenizer DIR] [--ids] [-n N] [--greedy]\n"
            "                 [--temperature T] [--top-p P] [--top-k K] [--seed S] [--threads N]\n"
            "                 [--device cpu|cuda|cuda:N] [--speculative-config JSON]\n"
            "                 [--enable-thinking=true|false] [--ignore-eos] [--verbose] [MESSAGE...]\n\n"
            "Generates a completion on the CPU (or a CUDA GPU with --device).\n"
            "Without --ids: the user message is MESSAGE (the remaining arguments joined by spaces)\n"
            "or else stdin (one trailing newline removed); it is rendered with the model's chat\n"
            "template (generation prompt added) and the reply text is printed as it is produced,\n"
            "followed by a newline.\n"
            "With --ids: stdin holds the prompt as a JSON array of token ids, and the generated ids\n"
            "are printed as a JSON array (EOS not included); no tokenizer is needed.\n"
            "Generation stops at an EOS id of the model (generation_config.json), or after N tokens.\n\n"
            "  --model PATH           model directory (config.json, model.safetensors, ...) or a\n"
            "                         GGUF file (lumen build, or llama.cpp's converter)\n"
            "  --tokenizer DIR        take tokenizer.json from DIR (optional with --ids;\n"
            "                         tokenizer_config.json is not needed)\n"
            "  --ids                  prompt and output as JSON arrays of token ids\n"
            "  -n, --max-tokens N     generate at most N tokens (default 256)\n"
            "  --greedy               argmax decoding (the same as --temperature 0)\n"
            "  --temperature T        sampling temperature, >= 0 (0 = greedy)\n"
            "  --top-p P              nucleus sampling, in (0, 1] (1 = off)\n"
            "  --top-k K              keep the K most likely tokens, >= 0 (0 = off)\n"
            "  --seed S               seed of the sampler's random numbers (default: from the clock)\n"
            "  --threads N            CPU threads for the forward pass (default: all cores)\n"
            "  --device D             where the forward pass runs: cpu (default), cuda or cuda:N\n"
            "                         (weights and KV cache on the GPU in bf16; the logits come\n"
            "                         back and the same sampler runs on the host)\n"
            "  --enable-thinking=BOOL true or false: false renders an empty <think></think> block\n"
            "                         so that the model answers directly (default: template's)\n"
            "  --ignore-eos           keep generating past EOS ids, up to N tokens\n"
            "  --speculative-config JSON  speculative decoding, as vLLM's option, e.g.\n"
            "                         '{\"method\": \"ngram\", \"num_speculative_tokens\": 3}': each\n"
            "                         step also runs up to that many tokens found by n-gram lookup\n"
            "                         in the prompt and output (prompt_lookup_max down to\n"
            "                         prompt_lookup_min, vLLM's defaults 5 and 5) and keeps those\n"
            "                         the model agrees with; the same output as without, on CUDA\n"
            "                         up to bf16 near ties beyond 4 tokens a step (default: off)\n"
            "  -v, --verbose          print token counts, timings and the finish reason to stderr\n"
            "  -h, --help             show this help\n\n"
            "Sampling: a flag sets its own value; a value not given comes from the model's\n"
            "generation_config.json; if that sets no temperature, decoding is greedy unless\n"
            "--top-p or --top-k is given (then the temperature is 1). Order: temperature, top_k,\n"
            "top_p, then a draw, as in Hugging Face transformers.\n");
}

static atomic_bool g_interrupted;
static void on_sigint(int sig) {
    (void)sig;
    atomic_store(&g_interrupted, true);
}

static bool print_piece(void *ctx, const char *text, size_t len) {
    (void)ctx;
    return fwrite(text, 1, len, stdout) == len && fflush(stdout) == 0;
}

static bool parse_num(const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

struct run_args {
    const char *model, *tokdir, *device;
    bool ids_mode, ignore_eos, verbose;
    int max_tokens, threads, enable_thinking;
    double temperature, top_p, top_k; /* < 0: not given */
    bool seeded;
    uint64_t seed;
    struct lm_spec_params spec; /* --speculative-config; zeroed: off */
};

/* Fills the sampling parameters from the flags and the model's generation defaults. */
static struct lm_sampling_params sampling_of(const struct run_args *a, const struct lm_gen_defaults *gd) {
    struct lm_sampling_params p = {.temperature = 0, .top_p = 1, .top_k = 0, .seed = a->seed,
                                   .seeded = a->seeded};
    p.top_p = a->top_p >= 0 ? (float)a->top_p : gd->top_p >= 0 ? gd->top_p : 1.0f;
    p.top_k = a->top_k >= 0 ? (int)a->top_k : gd->top_k >= 0 ? gd->top_k : 0;
    if (a->temperature >= 0) p.temperature = (float)a->temperature;
    else if (gd->temperature >= 0) p.temperature = gd->temperature;
    else p.temperature = (a->top_p >= 0 || a->top_k >= 0) ? 1.0f : 0.0f;
    return p;
}

/* Builds the prompt ids: from stdin JSON (--ids) or by rendering the user message. */
static int build_prompt(const struct run_args *a, struct lm_model *m, int argc, char **argv,
                        struct lm_ids *prompt) {
    struct lm_buf in = {0};
    int rc = 0;
    if (a->ids_mode) {
        json_t *arr = NULL;
        lm_cmd_stdin_hint("run", "the prompt, a JSON array of token ids,");
        if (lm_json_load_file("-", &arr)) return lm_cmd_fail("run", "cannot read the prompt ids");
        if (lm_json_to_ids(arr, "stdin", prompt)) rc = lm_cmd_fail("run", NULL);
        json_decref(arr);
        return rc;
    }
    if (optind < argc) {
        for (int i = optind; i < argc; i++) {
            if (i > optind) lm_buf_putc(&in, ' ');
            lm_buf_puts(&in, argv[i]);
        }
    } else {
        lm_cmd_stdin_hint("run", "the message");
        if (lm_file_read("-", &in)) return lm_cmd_fail("run", "cannot read stdin");
        if (in.len && in.p[in.len - 1] == '\n') in.p[--in.len] = 0;
        if (in.len && in.p[in.len - 1] == '\r') in.p[--in.len] = 0;
    }
    struct lm_chat_msg msg = {.role = LM_ROLE_USER, .content = in.p ? in.p : ""};
    struct lm_chat_opts opts = {.add_generation_prompt = true, .enable_thinking = a->enable_thinking};
    struct lm_buf text = {0};
    if (lm_model_render_chat(m, &msg, 1, &opts, &text) ||
        lm_tokenizer_encode(lm_model_tokenizer(m), text.p ? text.p : "", text.len, 0, prompt))
        rc = lm_cmd_fail("run", NULL);
    lm_buf_free(&text);
    lm_buf_free(&in);
    return rc;
}

int lm_cmd_run(int argc, char **argv) {
    enum { O_TOKENIZER = 256, O_IDS, O_GREEDY, O_TEMP, O_TOPP, O_TOPK, O_SEED, O_THREADS, O_THINK,
           O_IGNORE_EOS, O_DEVICE, O_SPEC };
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"tokenizer", required_argument, 0, O_TOKENIZER},
                                         {"ids", no_argument, 0, O_IDS},
                                         {"max-tokens", required_argument, 0, 'n'},
                                         {"greedy", no_argument, 0, O_GREEDY},
                                         {"temperature", required_argument, 0, O_TEMP},
                                         {"top-p", required_argument, 0, O_TOPP},
                                         {"top-k", required_argument, 0, O_TOPK},
                                         {"seed", required_argument, 0, O_SEED},
                                         {"threads", required_argument, 0, O_THREADS},
                                         {"enable-thinking", required_argument, 0, O_THINK},
                                         {"ignore-eos", no_argument, 0, O_IGNORE_EOS},
                                         {"device", required_argument, 0, O_DEVICE},
                                         {"speculative-config", required_argument, 0, O_SPEC},
                                         {"verbose", no_argument, 0, 'v'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    struct run_args a = {.max_tokens = 256, .enable_thinking = -1, .temperature = -1, .top_p = -1,
                         .top_k = -1};
    int c;
    double v;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:n:vh", opts, NULL)) != -1) {
        const char *bad = NULL;
        switch (c) {
        case 'm': a.model = optarg; break;
        case O_TOKENIZER: a.tokdir = optarg; break;
        case O_IDS: a.ids_mode = true; break;
        case 'n':
            if (!parse_num(optarg, 1, 1 << 30, &v) || v != (int)v) bad = "-n takes a positive integer";
            else a.max_tokens = (int)v;
            break;
        case O_GREEDY: a.temperature = 0; break;
        case O_TEMP:
            if (!parse_num(optarg, 0, 100, &a.temperature)) bad = "--temperature takes a number >= 0";
            break;
        case O_TOPP:
            if (!parse_num(optarg, 0, 1, &a.top_p) || a.top_p == 0) bad = "--top-p takes a number in (0, 1]";
            break;
        case O_TOPK:
            if (!parse_num(optarg, 0, 1 << 30, &a.top_k) || a.top_k != (int)a.top_k)
                bad = "--top-k takes an integer >= 0";
            break;
        case O_SEED: {
            char *end;
            errno = 0;
            a.seed = strtoull(optarg, &end, 0);
            if (errno || end == optarg || *end || *optarg == '-') bad = "--seed takes an integer >= 0";
            a.seeded = true;
            break;
        }
        case O_THREADS:
            if (!parse_num(optarg, 0, 4096, &v) || v != (int)v) bad = "--threads takes an integer >= 0";
            else a.threads = (int)v;
            break;
        case O_THINK:
            if ((a.enable_thinking = lm_cmd_parse_bool(optarg)) < 0)
                bad = "--enable-thinking takes true or false";
            break;
        case O_IGNORE_EOS: a.ignore_eos = true; break;
        case O_DEVICE:
            if (!lm_cmd_device_ok("run", optarg)) return 2;
            a.device = optarg;
            break;
        case O_SPEC:
            if (lm_spec_parse(optarg, &a.spec)) {
                fprintf(stderr, "lumen run: %s\n", lm_error_message()); /* "speculative config: ..." */
                return 2;
            }
            break;
        case 'v': a.verbose = true; break;
        case 'h': usage(stdout); return 0;
        default: return lm_cmd_usage_error("run");
        }
        if (bad) {
            fprintf(stderr, "lumen run: %s, not '%s'\n", bad, optarg);
            return 2;
        }
    }
    if (!a.model || (a.ids_mode && optind < argc)) {
        fprintf(stderr, "lumen run: %s%s\n", !a.model ? "--model DIR is required"
                                                      : "--ids reads the prompt from stdin; ",
                a.model ? lm_cmd_unexpected(argv[optind]) : "");
        return lm_cmd_usage_error("run");
    }

    struct lm_model_open_params op = lm_model_default_open_params();
    op.tokenizer_dir = a.tokdir;
    op.n_threads = a.threads;
    op.device = a.device;
    op.tokenizer_optional = a.ids_mode; /* ids in, ids out */
    struct lm_model *m = NULL;
    if (lm_model_open(a.model, &op, &m)) {
        int rc = lm_cmd_fail("run", "cannot open the model");
        if (!a.ids_mode && lm_cmd_lacks_tokenizer(a.model, a.tokdir))
            fprintf(stderr, "lumen run: (with --ids it takes prompt ids and needs no tokenizer)\n");
        return rc;
    }
    if (!lm_model_tokenizer(m))
        fprintf(stderr, "lumen run: %s has no tokenizer.json: ids only (a text prompt and reply "
                "need one: --tokenizer DIR)\n", a.model);

    struct lm_ids prompt = {0};
    struct lm_seq *seq = NULL;
    struct lm_gen_result res = {0};
    int rc = build_prompt(&a, m, argc, argv, &prompt);
    if (rc == 0 && prompt.n == 0) {
        fprintf(stderr, "lumen run: the prompt is empty\n");
        rc = 1;
    }
    if (rc == 0) {
        long need = (long)prompt.n + a.max_tokens;
        int limit = lm_model_config(m)->max_position_embeddings;
        if (limit > 0 && need > limit) {
            fprintf(stderr, "lumen run: prompt (%zu tokens) + -n %d = %ld exceeds the model's "
                    "context of %d tokens (max_position_embeddings)\n", prompt.n, a.max_tokens, need, limit);
            rc = 1;
        } else if (lm_seq_create(m, (int)need, &seq)) {
            rc = lm_cmd_fail("run", "cannot allocate the KV cache");
        }
    }
    if (rc == 0) {
        struct sigaction sa = {.sa_handler = on_sigint}, old;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, &old);
        struct lm_gen_request req = {.prompt = prompt.v, .n_prompt = prompt.n,
                                     .max_tokens = a.max_tokens,
                                     .sampling = sampling_of(&a, lm_model_gen_defaults(m)),
                                     .ignore_eos = a.ignore_eos, .cancel = &g_interrupted,
                                     .spec = &a.spec};
        lm_status st = lm_generate(m, seq, &req, a.ids_mode ? NULL : print_piece, NULL, &res);
        sigaction(SIGINT, &old, NULL);
        if (st) {
            if (!a.ids_mode) putchar('\n');
            rc = lm_cmd_fail("run", "generation failed");
        } else {
            struct lm_buf out = {0};
            if (a.ids_mode) lm_ids_to_json(res.ids.v, res.ids.n, &out);
            lm_buf_putc(&out, '\n');
            if (fwrite(out.p, 1, out.len, stdout) != out.len || fflush(stdout)) {
                fprintf(stderr, "lumen run: cannot write stdout\n");
                rc = 1;
            }
            lm_buf_free(&out);
            if (a.verbose) {
                const struct lm_sampling_params *sp = &req.sampling;
                fprintf(stderr,
                        "lumen run: prompt %d tokens, prefill %.3f s (%.1f tok/s); completion %d "
                        "tokens, decode %.3f s (%.1f tok/s); finish %s; temperature %g top_p %g "
                        "top_k %d\n",
                        res.prompt_tokens, res.prefill_s,
                        res.prefill_s > 0 ? res.prompt_tokens / res.prefill_s : 0,
                        res.completion_tokens, res.decode_s,
                        res.decode_s > 0 ? res.completion_tokens / res.decode_s : 0,
                        lm_finish_name(res.finish), sp->temperature, sp->top_p, sp->top_k);
                if (a.spec.num_speculative_tokens > 0)
                    fprintf(stderr, "lumen run: speculative decoding: %d of %d draft tokens accepted\n",
                            res.accepted_tokens, res.draft_tokens);
            }
            if (res.finish == LM_FINISH_CANCELLED) {
                fprintf(stderr, "lumen run: interrupted\n");
                rc = 1;
            }
        }
    }
    lm_gen_result_free(&res);
    lm_ids_free(&prompt);
    lm_seq_destroy(seq);
    lm_model_close(m);
    return rc;
}
