/* cmd_profile.c: `lumen profile`, a load generator and latency profiler for OpenAI-compatible
 * chat servers in the manner of NVIDIA AIPerf (src/bench/). */
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "base/status.h"
#include "bench/dataset.h"
#include "bench/replay.h"
#include "bench/report.h"
#include "commands.h"
#include "text/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f,
"usage: lumen profile --url URL [options]\n"
"\n"
"Replays multi-turn conversations against an OpenAI-compatible server (lumen serve,\n"
"llama.cpp's llama-server, vLLM, ...) and reports AIPerf's latency and throughput metrics.\n"
"Turn k of a conversation sends the user turns 1..k with the answers the server actually\n"
"gave to turns 1..k-1 in between (a corpus's own answers are never sent). Requests stream\n"
"(stream_options.include_usage) to /v1/chat/completions with X-Request-Id and\n"
"X-Conversation-Id headers. Progress goes to stderr, the summary to stdout.\n"
"\n"
"options:\n"
"  --url URL                  server base URL, e.g. http://127.0.0.1:8080 (required)\n"
"  --dataset NAME             mt_bench (default; 80 two-turn questions), spec_bench, sharegpt\n"
"  --dataset-path FILE        the dataset file (default: data/mt_bench/question.jsonl etc.,\n"
"                             looked up in the current directory, then next to the lumen binary)\n"
"  --conversations N          conversations to profile (default 10); they cycle through the\n"
"                             dataset when N exceeds it\n"
"  --concurrency C            conversations in flight at once (default 1)\n"
"  --warmup-requests W        turn-1 requests of conversations from the end of the dataset,\n"
"                             sent and drained before profiling and left out of every figure\n"
"                             (default 2; written to --output with phase \"warmup\")\n"
"  --warmup-concurrency C     warmup requests in flight (default: --concurrency)\n"
"  --think-time-ms MS         wait between a response and the conversation's next request\n"
"                             (default 0)\n"
"  --think-time-mean-ms MS    same as --think-time-ms; with --think-time-std-ms the wait is\n"
"  --think-time-std-ms MS     drawn per turn from normal(mean, std), clamped at 0\n"
"  --max-tokens N             max_tokens of each request (default 128)\n"
"  --temperature T            temperature of each request (default 0 = greedy)\n"
"  --ignore-eos               send \"ignore_eos\": true, so every answer runs to --max-tokens\n"
"  --model NAME               model name to send (default: the first id of GET /v1/models)\n"
"  --api-key KEY              sent as \"Authorization: Bearer KEY\" (default: $OPENAI_API_KEY)\n"
"  --seed S                   pick the conversations in an order drawn from S (default: file\n"
"                             order); also seeds the think-time draws\n"
"  --timeout-s S              per-request timeout in seconds (default 600); a request that\n"
"                             runs past it counts as a \"timeout\" error\n"
"  --extra-body JSON          a JSON object merged into every request body, e.g.\n"
"                             '{\"chat_template_kwargs\":{\"enable_thinking\":false}}'\n"
"  --output FILE.jsonl        one JSON line per request: phase, conversation_id, turn,\n"
"                             request_id, start_time (Unix s), ttft_ms, request_latency_ms,\n"
"                             inter_token_latency_ms, itl_ms (per-chunk gaps), output_tokens,\n"
"                             input_tokens, http_status, error_type, error_message,\n"
"                             finish_reason, messages (as sent), response_text\n"
"  --tokenizer DIR            count each chunk's tokens with lumen's tokenizer\n"
"                             (DIR/tokenizer.json), so chunk gaps become per-token latencies\n"
"                             and output tokens are known even without usage\n"
"  --quiet                    no progress on stderr\n"
"  --help                     this text\n"
"\n"
"metrics (AIPerf's definitions, over the profiling phase's successful requests):\n"
"  Time to First Token   send -> first chunk with non-empty content or reasoning_content\n"
"  Inter Token Latency   (request latency - TTFT) / (output tokens - 1), per request\n"
"  Inter Chunk Latency   gaps between successive content chunks (per token with --tokenizer)\n"
"  Request Latency       send -> end of the stream\n"
"  Output/Input Sequence Length   usage.completion_tokens / usage.prompt_tokens\n"
"  Request / Output Token Throughput   successful requests / output tokens over the profiling\n"
"                        window (first measured send -> last measured response end, think\n"
"                        time included)\n"
"  Each metric shows min, mean, p50, p90, p95, p99, max (percentiles by linear interpolation,\n"
"  as numpy computes them); then errors by type (http_4xx, http_5xx, http_other, timeout,\n"
"  connection, parse, stream_error) and a per-turn table of latency percentiles.\n"
"\n"
"exit status: 0 when at least one profiling request succeeded, 1 otherwise or on a runtime\n"
"failure, 2 on a usage error.\n");
}

enum {
    OPT_URL = 256, OPT_DATASET, OPT_DATASET_PATH, OPT_CONVERSATIONS, OPT_CONCURRENCY, OPT_WARMUP,
    OPT_WARMUP_CONC, OPT_THINK, OPT_THINK_MEAN, OPT_THINK_STD, OPT_MAX_TOKENS, OPT_TEMPERATURE,
    OPT_IGNORE_EOS, OPT_MODEL, OPT_API_KEY, OPT_SEED, OPT_TIMEOUT, OPT_EXTRA, OPT_OUTPUT,
    OPT_TOKENIZER, OPT_QUIET, OPT_HELP,
};

static int bad_arg(const char *flag, const char *value) {
    fprintf(stderr, "lumen profile: %s %s: not a valid value (see lumen profile --help)\n", flag,
            value);
    return 2;
}

static bool parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

static bool parse_double(const char *s, double lo, double hi, double *out) {
    char *end;
    double v = strtod(s, &end);
    if (!*s || *end || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

/* The default file of a dataset: relative to the current directory, then next to the binary
 * (build/lumen -> build/../data/...). Returns a malloc'd path or NULL. */
static char *find_dataset(const char *rel) {
    if (lm_file_exists(rel)) return strdup(rel);
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return NULL;
    exe[n] = 0;
    char *dir = dirname(exe);
    const char *ups[] = {"..", "."};
    for (size_t i = 0; i < 2; i++) {
        char path[PATH_MAX * 2];
        snprintf(path, sizeof path, "%s/%s/%s", dir, ups[i], rel);
        if (lm_file_exists(path)) return strdup(path);
    }
    return NULL;
}

int lm_cmd_profile(int argc, char **argv) {
    static const struct option opts[] = {
        {"url", required_argument, 0, OPT_URL},
        {"dataset", required_argument, 0, OPT_DATASET},
        {"dataset-path", required_argument, 0, OPT_DATASET_PATH},
        {"conversations", required_argument, 0, OPT_CONVERSATIONS},
        {"concurrency", required_argument, 0, OPT_CONCURRENCY},
        {"warmup-requests", required_argument, 0, OPT_WARMUP},
        {"warmup-concurrency", required_argument, 0, OPT_WARMUP_CONC},
        {"think-time-ms", required_argument, 0, OPT_THINK},
        {"think-time-mean-ms", required_argument, 0, OPT_THINK_MEAN},
        {"think-time-std-ms", required_argument, 0, OPT_THINK_STD},
        {"max-tokens", required_argument, 0, OPT_MAX_TOKENS},
        {"temperature", required_argument, 0, OPT_TEMPERATURE},
        {"ignore-eos", no_argument, 0, OPT_IGNORE_EOS},
        {"model", required_argument, 0, OPT_MODEL},
        {"api-key", required_argument, 0, OPT_API_KEY},
        {"seed", required_argument, 0, OPT_SEED},
        {"timeout-s", required_argument, 0, OPT_TIMEOUT},
        {"extra-body", required_argument, 0, OPT_EXTRA},
        {"output", required_argument, 0, OPT_OUTPUT},
        {"tokenizer", required_argument, 0, OPT_TOKENIZER},
        {"quiet", no_argument, 0, OPT_QUIET},
        {"help", no_argument, 0, OPT_HELP},
        {0, 0, 0, 0},
    };
    struct lm_bench_params p = lm_bench_default_params();
    p.progress = stderr;
    p.api_key = getenv("OPENAI_API_KEY");
    const char *dataset = "mt_bench", *dataset_path = NULL, *output = NULL, *tokenizer_dir = NULL;
    long l;
    double d;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case OPT_URL: p.url = optarg; break;
        case OPT_DATASET: dataset = optarg; break;
        case OPT_DATASET_PATH: dataset_path = optarg; break;
        case OPT_CONVERSATIONS:
            if (!parse_long(optarg, 1, 10000000, &l)) return bad_arg("--conversations", optarg);
            p.conversations = (size_t)l;
            break;
        case OPT_CONCURRENCY:
            if (!parse_long(optarg, 1, 4096, &l)) return bad_arg("--concurrency", optarg);
            p.concurrency = (int)l;
            break;
        case OPT_WARMUP:
            if (!parse_long(optarg, 0, 1000000, &l)) return bad_arg("--warmup-requests", optarg);
            p.warmup_requests = (size_t)l;
            break;
        case OPT_WARMUP_CONC:
            if (!parse_long(optarg, 1, 4096, &l)) return bad_arg("--warmup-concurrency", optarg);
            p.warmup_concurrency = (int)l;
            break;
        case OPT_THINK:
        case OPT_THINK_MEAN:
            if (!parse_double(optarg, 0, 1e9, &d))
                return bad_arg(c == OPT_THINK ? "--think-time-ms" : "--think-time-mean-ms", optarg);
            p.think_time_mean_ms = d;
            break;
        case OPT_THINK_STD:
            if (!parse_double(optarg, 0, 1e9, &d)) return bad_arg("--think-time-std-ms", optarg);
            p.think_time_std_ms = d;
            break;
        case OPT_MAX_TOKENS:
            if (!parse_long(optarg, 1, 10000000, &l)) return bad_arg("--max-tokens", optarg);
            p.max_tokens = (int)l;
            break;
        case OPT_TEMPERATURE:
            if (!parse_double(optarg, 0, 100, &d)) return bad_arg("--temperature", optarg);
            p.temperature = d;
            break;
        case OPT_IGNORE_EOS: p.ignore_eos = true; break;
        case OPT_MODEL: p.model = optarg; break;
        case OPT_API_KEY: p.api_key = optarg; break;
        case OPT_SEED: {
            char *end;
            unsigned long long s = strtoull(optarg, &end, 10);
            if (!*optarg || *end) return bad_arg("--seed", optarg);
            p.seed = (uint64_t)s;
            p.shuffle = true;
            break;
        }
        case OPT_TIMEOUT:
            if (!parse_double(optarg, 0.001, 1e7, &d)) return bad_arg("--timeout-s", optarg);
            p.timeout_s = d;
            break;
        case OPT_EXTRA: p.extra_body = optarg; break;
        case OPT_OUTPUT: output = optarg; break;
        case OPT_TOKENIZER: tokenizer_dir = optarg; break;
        case OPT_QUIET: p.progress = NULL; break;
        case 'h':
        case OPT_HELP: usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "lumen profile: unexpected argument '%s' (see lumen profile --help)\n",
                argv[optind]);
        return 2;
    }
    if (!p.url) {
        fprintf(stderr, "lumen profile: --url is required (see lumen profile --help)\n");
        return 2;
    }
    const char *rel = lm_bench_dataset_default_path(dataset);
    if (!rel) {
        fprintf(stderr, "lumen profile: --dataset %s: unknown (known: mt_bench, spec_bench, sharegpt)\n",
                dataset);
        return 2;
    }
    char *path = dataset_path ? strdup(dataset_path) : find_dataset(rel);
    if (!path) {
        fprintf(stderr,
                "lumen profile: --dataset %s: %s not found in the current directory or next to "
                "the lumen binary; give --dataset-path\n",
                dataset, rel);
        return 1;
    }

    int rc = 1;
    struct lm_bench_dataset ds = {0};
    struct lm_bench_run run = {0};
    struct lm_tokenizer *tok = NULL;
    lm_status st = lm_bench_dataset_load(&ds, dataset, path);
    if (st) {
        lm_cmd_fail("profile", "loading the dataset");
        goto done;
    }
    if (tokenizer_dir) {
        char *tj = lm_dir_exists(tokenizer_dir) ? lm_path_join(tokenizer_dir, "tokenizer.json")
                                                : strdup(tokenizer_dir);
        st = lm_tokenizer_load(tj, &tok);
        free(tj);
        if (st) {
            lm_cmd_fail("profile", "--tokenizer");
            goto done;
        }
        p.tokenizer = tok;
    }
    if (p.progress)
        fprintf(p.progress, "lumen profile: %s (%zu conversations from %s), %s\n", dataset, ds.n,
                path, p.url);
    st = lm_bench_run(&ds, &p, &run);
    if (st) {
        lm_cmd_fail("profile", NULL);
        goto done;
    }
    struct lm_bench_summary s;
    lm_bench_summarize(&run, &s);
    if (output) {
        st = lm_bench_write_jsonl(output, &run);
        if (st) {
            lm_cmd_fail("profile", "--output");
            goto done;
        }
    }
    lm_bench_report_print(stdout, &run, &s);
    if (output) printf("Per-request records: %s\n", output);
    fflush(stdout);
    if (s.n_ok == 0) {
        fprintf(stderr, "lumen profile: no profiling request succeeded\n");
        goto done;
    }
    rc = 0;
done:
    lm_bench_run_free(&run);
    lm_bench_dataset_free(&ds);
    lm_tokenizer_destroy(tok);
    free(path);
    return rc;
}
