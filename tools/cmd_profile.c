/* cmd_profile.c: `lumen profile`, a load generator and latency profiler for OpenAI-compatible
 * chat servers in the manner of NVIDIA AIPerf (src/bench/), and `lumen profile sweep`. */
#include <getopt.h>
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/file.h"
#include "base/status.h"
#include "bench/dataset.h"
#include "bench/profile.h"
#include "commands.h"

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: lumen profile --url URL [options]\n"
        "       lumen profile sweep --url URL (--concurrency C1,C2,... | --request-rate R1,R2,...) "
        "[options]\n"
        "\n"
        "Replays multi-turn conversations against an OpenAI-compatible server (lumen serve,\n"
        "llama.cpp's llama-server, vLLM, ...) and reports AIPerf's metrics. Turn k of a "
        "conversation\n"
        "sends the user turns 1..k with the answers the server actually gave to turns 1..k-1 in\n"
        "between (a corpus's own answers are never sent). Requests stream (include_usage) to\n"
        "/v1/chat/completions with the headers X-Request-Id, X-Conversation-Id, X-Lumen-Phase and\n"
        "X-Lumen-Turn (docs/RECORDS.md). Everything lands in one run folder (--artifact-dir):\n"
        "requests.jsonl, summary.json/.csv/.txt, report.html (plots), manifest.json, "
        "coverage.json,\n"
        "selection.jsonl, verification.json. A run in the default --artifact-dir also merges its\n"
        "coverage into runs/coverage.json (every run's matrix there; a sweep's runs into the sweep\n"
        "folder's). Progress goes to stderr, the summary to stdout.\n"
        "`sweep` runs once per listed concurrency or rate, each in its own sub-folder, and draws "
        "the\n"
        "throughput-versus-latency curve (sweep.html, sweep.json, sweep.csv).\n"
        "\n"
        "server:\n"
        "  --url URL                  server base URL, e.g. http://127.0.0.1:8080 (required)\n"
        "  --model NAME               model name to send (default: the first id of GET "
        "/v1/models)\n"
        "  --api-key KEY              sent as \"Authorization: Bearer KEY\" (default: "
        "$OPENAI_API_KEY)\n"
        "\n"
        "dataset:\n"
        "  --dataset NAME             mt_bench (default; 80 two-turn questions), spec_bench (480\n"
        "                             questions, 1-2 turns), sharegpt (real multi-turn chats, "
        "selected\n"
        "                             to fit the context), synthetic (prompts drawn from the\n"
        "                             vocabulary), custom (a JSONL of conversations, "
        "--dataset-path)\n"
        "  --dataset-path FILE        the dataset file (default: data/<name>/..., looked up in "
        "the\n"
        "                             current directory, then next to the lumen binary). custom:\n"
        "                             one conversation a line, {\"turns\": [\"...\", ...]},\n"
        "                             AIPerf's single-turn {\"text\": \"...\"}, or\n"
        "                             {\"messages\": [{\"role\": \"user\", \"content\": "
        "\"...\"}, ...]}\n"
        "                             (assistant messages are never sent; \"developer\" is taken\n"
        "                             as \"system\"), with optional \"id\",\n"
        "                             \"category\", \"system\" and \"max_tokens\"\n"
        "  --category LIST            mt_bench/spec_bench: keep these categories or Spec-Bench "
        "tasks\n"
        "                             (comma-separated: writing,qa,translation,mt_bench,...)\n"
        "  --turns N                  sharegpt: human turns per conversation (default 2: human, "
        "gpt,\n"
        "                             human); 0 takes all alternating turns\n"
        "  --context-tokens N         sharegpt: the context budget (default: the tokenizer "
        "folder's\n"
        "                             config.json max_position_embeddings, else 4096). The whole\n"
        "                             rendered history plus room for the live answers must fit.\n"
        "  --synthetic-conversations N, --synthetic-turns N   synthetic: how many, turns each "
        "(100, 1)\n"
        "  --isl-mean N, --isl-std N  synthetic: input tokens per user turn ~ normal (default 128, "
        "0)\n"
        "  --osl-mean N, --osl-std N  synthetic: max_tokens per conversation ~ normal (default: "
        "the\n"
        "                             run's --max-tokens); use with --ignore-eos for exact "
        "lengths\n"
        "  --tokenizer DIR            the model's tokenizer folder (tokenizer.json, config.json): "
        "counts\n"
        "                             every chunk's tokens (ITL per token, the usage check), "
        "selects\n"
        "                             ShareGPT, builds synthetic prompts; given explicitly, it "
        "also\n"
        "                             renders prompts for verification's prompt_ids check "
        "(default:\n"
        "                             models/tiny-qwen3, which has the real Qwen3 tokenizer)\n"
        "  --model-dir DIR            the served model's folder: renders prompts for the "
        "prompt_ids\n"
        "                             check, and its config and checkpoint hashes go to the "
        "manifest\n"
        "\n"
        "load:\n"
        "  --conversations N          conversations to profile (default 10, at most the ones\n"
        "                             selected, or unbounded when --request-count or\n"
        "                             --benchmark-duration is given); a larger N cycles through\n"
        "                             the selection (later passes meet the server's prefix cache)\n"
        "  --request-count N          send at most N profiling requests\n"
        "  --benchmark-duration S     release no profiling request after S seconds (in-flight "
        "ones\n"
        "                             finish)\n"
        "  --concurrency C            conversations in flight (default 1); with --request-rate, "
        "the\n"
        "                             most requests in flight (default 256)\n"
        "  --request-rate R           request-rate mode: release requests at R per second (a "
        "started\n"
        "                             conversation's next turn, once its think time passed, else a "
        "new\n"
        "                             conversation)\n"
        "  --arrival KIND             constant (default) or poisson (exponential gaps from "
        "--seed)\n"
        "  --warmup-requests W        warmup turn-1 requests, from the end of the dataset, sent "
        "and\n"
        "                             drained before profiling, excluded from every figure "
        "(default 2;\n"
        "                             --warmup-request-count, AIPerf's name, is the same)\n"
        "  --warmup-duration S        warm up for S seconds instead of a count\n"
        "  --warmup-concurrency C     warmup requests in flight (default: --concurrency; 1 with a "
        "rate)\n"
        "  --think-time-ms MS         wait between a response and the conversation's next turn\n"
        "  --think-time-mean-ms MS    same; with --think-time-std-ms the wait is drawn per turn "
        "from\n"
        "  --think-time-std-ms MS     normal(mean, std), clamped at 0, seeded by --seed\n"
        "  --seed S                   pick conversations in an order drawn from S (default: file\n"
        "                             order); also seeds think times, Poisson arrivals, synthetic "
        "data\n"
        "  --timeout-s S              per-request timeout (default 600); past it: a \"timeout\" "
        "error\n"
        "\n"
        "requests:\n"
        "  --max-tokens N             max_tokens of each request (default 128)\n"
        "  --temperature T            temperature of each request (default 0 = greedy)\n"
        "  --ignore-eos               send \"ignore_eos\": true, so answers run to max_tokens\n"
        "  --extra-body JSON          a JSON object merged into every request body, e.g.\n"
        "                             '{\"chat_template_kwargs\":{\"enable_thinking\":false}}'\n"
        "\n"
        "report:\n"
        "  --slo-ttft-ms MS, --slo-itl-ms MS, --slo-latency-ms MS   goodput counts requests whose "
        "TTFT,\n"
        "                             ITL (per request) and request latency meet all the SLOs "
        "given\n"
        "  --server-records FILE      the server's request records (lumen serve --records FILE); "
        "joins\n"
        "                             them to the client's and verifies every request "
        "(docs/RECORDS.md),\n"
        "                             and reports the server-side times (and, when the server\n"
        "                             speculates, each request's draft acceptance). Without it:\n"
        "                             \"verification unavailable\".\n"
        "  --artifact-dir DIR         the run folder (default runs/<UTC time>-<run id>)\n"
        "  --output FILE.jsonl        also write the per-request JSONL here\n"
        "  --preset NAME              qwen3-conversations: the reference pilot (ShareGPT, 6\n"
        "                             conversations whose human/gpt/human history fits 256 tokens, "
        "2\n"
        "                             turns, 50 ms think time, concurrency 1, greedy, max_tokens "
        "16, 2\n"
        "                             warmup requests); later flags override it\n"
        "  --quiet                    no progress on stderr\n"
        "  --help                     this text\n"
        "\n"
        "metrics (AIPerf's names, over the profiling phase's successful requests; min, avg, std,\n"
        "p50, p90, p95, p99, max):\n"
        "  time_to_first_token        send -> first chunk with non-empty content or "
        "reasoning_content\n"
        "  time_to_first_output_token send -> first content chunk (the answer, after any "
        "reasoning)\n"
        "  time_to_second_token       send -> the chunk that brings the second token\n"
        "  inter_token_latency        AIPerf's, a value a request: (latency - TTFT) / (output\n"
        "                             tokens - 1)\n"
        "  inter_token_latency_per_token   a sample a token: each chunk's gap divided by its\n"
        "                             token count\n"
        "  inter_chunk_latency, request_latency, output_token_throughput_per_user,\n"
        "  output/input_sequence_length (usage), think_time_measured; request_throughput,\n"
        "  output_token_throughput and goodput over the profiling window (think time included);\n"
        "  errors by type; per turn; server-side queue/prefill/decode/total times (server "
        "records).\n"
        "\n"
        "interrupting: the first Ctrl-C (SIGINT) or SIGTERM stops the run: no new request is\n"
        "sent, requests in flight get min(--timeout-s, 2 s) to finish and are then cancelled, and\n"
        "the summary and run folder are written from the requests that completed, marked\n"
        "interrupted (\"interrupted\": true in summary.json, a line in summary.txt); a sweep\n"
        "starts no further run. A second signal quits at once (nothing more is written).\n"
        "\n"
        "exit status: 0 when at least one profiling request succeeded and verification (if any)\n"
        "passed; 1 otherwise or on a runtime failure (including an --artifact-dir or --output that\n"
        "cannot be written, or --server-records that cannot be read, found before any request is\n"
        "sent); 2 on a usage error; 130 when interrupted by SIGINT (143 by SIGTERM).\n");
}

/* The first SIGINT or SIGTERM asks the run to stop and still write what completed (profile.h);
 * the handler then gives both signals back their default action, so that a second one of
 * either ends the process at once. It only records the first signal (sigaction is
 * async-signal-safe): the run's threads look at the flag. */
static volatile sig_atomic_t g_stop;
static const int k_stop_sigs[2] = {SIGINT, SIGTERM};
static volatile sig_atomic_t g_caught[2]; /* the handler is installed for k_stop_sigs[i] */

static void on_stop(int sig) {
    if (!g_stop) g_stop = sig;
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (int i = 0; i < 2; i++)
        if (g_caught[i]) sigaction(k_stop_sigs[i], &dfl, NULL);
}

static void catch_stop(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGINT);
    sigaddset(&sa.sa_mask, SIGTERM);
    sa.sa_flags = SA_RESTART;
    for (int i = 0; i < 2; i++) {
        struct sigaction old;
        /* a signal ignored when we started (nohup, a shell's background job) stays ignored */
        if (sigaction(k_stop_sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN) continue;
        g_caught[i] = 1;
        sigaction(k_stop_sigs[i], &sa, NULL);
    }
}

enum {
    OPT_URL = 256,
    OPT_DATASET,
    OPT_DATASET_PATH,
    OPT_CATEGORY,
    OPT_TURNS,
    OPT_CONTEXT,
    OPT_SYN_CONV,
    OPT_SYN_TURNS,
    OPT_ISL_MEAN,
    OPT_ISL_STD,
    OPT_OSL_MEAN,
    OPT_OSL_STD,
    OPT_CONVERSATIONS,
    OPT_REQUEST_COUNT,
    OPT_DURATION,
    OPT_CONCURRENCY,
    OPT_RATE,
    OPT_ARRIVAL,
    OPT_WARMUP,
    OPT_WARMUP_DURATION,
    OPT_WARMUP_CONC,
    OPT_THINK,
    OPT_THINK_MEAN,
    OPT_THINK_STD,
    OPT_MAX_TOKENS,
    OPT_TEMPERATURE,
    OPT_IGNORE_EOS,
    OPT_MODEL,
    OPT_API_KEY,
    OPT_SEED,
    OPT_TIMEOUT,
    OPT_EXTRA,
    OPT_OUTPUT,
    OPT_TOKENIZER,
    OPT_MODEL_DIR,
    OPT_SLO_TTFT,
    OPT_SLO_ITL,
    OPT_SLO_LATENCY,
    OPT_SERVER_RECORDS,
    OPT_ARTIFACT_DIR,
    OPT_PRESET,
    OPT_QUIET,
    OPT_HELP,
};

static const struct option k_opts[] = {
    {"url", required_argument, 0, OPT_URL},
    {"dataset", required_argument, 0, OPT_DATASET},
    {"dataset-path", required_argument, 0, OPT_DATASET_PATH},
    {"category", required_argument, 0, OPT_CATEGORY},
    {"turns", required_argument, 0, OPT_TURNS},
    {"context-tokens", required_argument, 0, OPT_CONTEXT},
    {"synthetic-conversations", required_argument, 0, OPT_SYN_CONV},
    {"synthetic-turns", required_argument, 0, OPT_SYN_TURNS},
    {"isl-mean", required_argument, 0, OPT_ISL_MEAN},
    {"isl-std", required_argument, 0, OPT_ISL_STD},
    {"osl-mean", required_argument, 0, OPT_OSL_MEAN},
    {"osl-std", required_argument, 0, OPT_OSL_STD},
    {"conversations", required_argument, 0, OPT_CONVERSATIONS},
    {"request-count", required_argument, 0, OPT_REQUEST_COUNT},
    {"benchmark-duration", required_argument, 0, OPT_DURATION},
    {"concurrency", required_argument, 0, OPT_CONCURRENCY},
    {"request-rate", required_argument, 0, OPT_RATE},
    {"arrival", required_argument, 0, OPT_ARRIVAL},
    {"warmup-requests", required_argument, 0, OPT_WARMUP},
    {"warmup-request-count", required_argument, 0, OPT_WARMUP},
    {"warmup-duration", required_argument, 0, OPT_WARMUP_DURATION},
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
    {"model-dir", required_argument, 0, OPT_MODEL_DIR},
    {"slo-ttft-ms", required_argument, 0, OPT_SLO_TTFT},
    {"slo-itl-ms", required_argument, 0, OPT_SLO_ITL},
    {"slo-latency-ms", required_argument, 0, OPT_SLO_LATENCY},
    {"server-records", required_argument, 0, OPT_SERVER_RECORDS},
    {"artifact-dir", required_argument, 0, OPT_ARTIFACT_DIR},
    {"preset", required_argument, 0, OPT_PRESET},
    {"quiet", no_argument, 0, OPT_QUIET},
    {"help", no_argument, 0, OPT_HELP},
    {0, 0, 0, 0},
};

static int bad_arg(const char *flag, const char *value) {
    fprintf(stderr, "lumen profile: %s %s: not a valid value (see lumen profile --help)\n", flag,
            value);
    return 2;
}

/* A list given to a single run: one value there, a list only for `sweep`. */
static int bad_list(const char *flag, const char *value) {
    fprintf(stderr, "lumen profile: %s %s: a single run takes one value; `lumen profile sweep` takes a "
            "list (one run per value)\n", flag, value);
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

/* A comma-separated list of numbers in [lo, hi]; returns the count, 0 when malformed. */
static size_t parse_list(const char *s, double lo, double hi, double *out, size_t max) {
    size_t n = 0;
    char *copy = strdup(s), *save = NULL;
    if (!copy) abort();
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n == max || !parse_double(t, lo, hi, &out[n])) {
            n = 0;
            break;
        }
        n++;
    }
    free(copy);
    return n;
}

/* The command line for the manifest: "lumen profile [sweep] ARGS...", shell-quoted. */
static char *command_line(bool sweep, int argc, char **argv) {
    struct lm_buf b = {0};
    lm_buf_puts(&b, sweep ? "lumen profile sweep" : "lumen profile");
    for (int i = 1; i < argc; i++) { /* argv[0] is the command's name */
        lm_buf_putc(&b, ' ');
        const char *a = argv[i];
        if (*a && !a[strcspn(a, " \t\n'\"\\$`!*?&;|<>(){}[]")]) {
            lm_buf_puts(&b, a);
            continue;
        }
        lm_buf_putc(&b, '\'');
        for (; *a; a++) {
            if (*a == '\'')
                lm_buf_puts(&b, "'\\''");
            else
                lm_buf_putc(&b, *a);
        }
        lm_buf_putc(&b, '\'');
    }
    return lm_buf_take(&b);
}

static void apply_preset(struct lm_bench_profile_opts *o) {
    /* qwen3-conversations: the reference pilot workload */
    o->data.name = "sharegpt";
    o->data.turns = 2;
    o->data.context_tokens = 256;
    o->params.conversations = 6;
    o->params.think_time_mean_ms = 50;
    o->params.think_time_std_ms = 0;
    o->params.concurrency = 1;
    o->params.temperature = 0;
    o->params.max_tokens = 16;
    o->params.warmup_requests = 2;
    o->params.warmup_concurrency = 1;
    o->params.shuffle = false;
}

int lm_cmd_profile(int argc, char **argv) {
    bool sweep = argc > 1 && !strcmp(argv[1], "sweep");
    if (sweep) {
        argc--, argv++;
        argv[0] = "lumen profile sweep"; /* getopt's messages start with it */
    }
    struct lm_bench_profile_opts o = {0};
    o.params = lm_bench_default_params();
    o.params.progress = stderr;
    o.params.api_key = getenv("OPENAI_API_KEY");
    o.data = lm_bench_dataset_default_opts();
    o.data.name = "mt_bench";
    o.out = stdout;
    o.log = stderr;
    const char *dataset_path = NULL, *tokenizer = NULL, *conc_list = NULL, *rate_list = NULL;
    bool conversations_given = false, concurrency_given = false;
    /* options that apply to one dataset or mode only, to say so when they do not */
    bool turns_given = false, isl_given = false, arrival_given = false, warmup_given = false;
    long l;
    double d;
    int c;

    /* the preset first, so that later flags override it */
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", k_opts, NULL)) != -1)
        if (c == OPT_PRESET) {
            if (strcmp(optarg, "qwen3-conversations")) {
                fprintf(stderr,
                        "lumen profile: --preset %s: unknown (known: qwen3-conversations)\n",
                        optarg);
                return 2;
            }
            o.preset = "qwen3-conversations";
            apply_preset(&o);
            conversations_given = true;
        }
    opterr = 1;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", k_opts, NULL)) != -1) {
        switch (c) {
        case OPT_URL: o.params.url = optarg; break;
        case OPT_DATASET: o.data.name = optarg; break;
        case OPT_DATASET_PATH: dataset_path = optarg; break;
        case OPT_CATEGORY: o.data.categories = optarg; break;
        case OPT_TURNS:
            if (!parse_long(optarg, 0, 1000, &l)) return bad_arg("--turns", optarg);
            o.data.turns = (int)l;
            turns_given = true;
            break;
        case OPT_CONTEXT:
            if (!parse_long(optarg, 1, 100000000, &l)) return bad_arg("--context-tokens", optarg);
            o.data.context_tokens = l;
            break;
        case OPT_SYN_CONV:
            if (!parse_long(optarg, 1, 10000000, &l))
                return bad_arg("--synthetic-conversations", optarg);
            o.data.synthetic_conversations = (size_t)l;
            break;
        case OPT_SYN_TURNS:
            if (!parse_long(optarg, 1, 1000, &l)) return bad_arg("--synthetic-turns", optarg);
            o.data.synthetic_turns = (int)l;
            break;
        case OPT_ISL_MEAN:
            isl_given = true;
            if (!parse_double(optarg, 1, 1e7, &o.data.isl_mean))
                return bad_arg("--isl-mean", optarg);
            break;
        case OPT_ISL_STD:
            isl_given = true;
            if (!parse_double(optarg, 0, 1e7, &o.data.isl_std)) return bad_arg("--isl-std", optarg);
            break;
        case OPT_OSL_MEAN:
            if (!parse_double(optarg, 1, 1e7, &o.data.osl_mean))
                return bad_arg("--osl-mean", optarg);
            break;
        case OPT_OSL_STD:
            if (!parse_double(optarg, 0, 1e7, &o.data.osl_std)) return bad_arg("--osl-std", optarg);
            break;
        case OPT_CONVERSATIONS:
            if (!parse_long(optarg, 1, 10000000, &l)) return bad_arg("--conversations", optarg);
            o.params.conversations = (size_t)l;
            conversations_given = true;
            break;
        case OPT_REQUEST_COUNT:
            if (!parse_long(optarg, 1, 100000000, &l)) return bad_arg("--request-count", optarg);
            o.params.request_count = (size_t)l;
            break;
        case OPT_DURATION:
            if (!parse_double(optarg, 0.001, 1e7, &o.params.duration_s))
                return bad_arg("--benchmark-duration", optarg);
            break;
        case OPT_CONCURRENCY:
            concurrency_given = true;
            if (sweep && strchr(optarg, ',')) {
                conc_list = optarg;
                break;
            }
            if (sweep) conc_list = optarg;
            if (!sweep && strchr(optarg, ',')) return bad_list("--concurrency", optarg);
            if (!parse_long(optarg, 1, 4096, &l)) return bad_arg("--concurrency", optarg);
            o.params.concurrency = (int)l;
            break;
        case OPT_RATE:
            if (sweep) {
                rate_list = optarg;
                break;
            }
            if (strchr(optarg, ',')) return bad_list("--request-rate", optarg);
            if (!parse_double(optarg, 1e-6, 1e7, &o.params.request_rate))
                return bad_arg("--request-rate", optarg);
            break;
        case OPT_ARRIVAL:
            arrival_given = true;
            if (!strcmp(optarg, "constant"))
                o.params.arrival = LM_BENCH_ARRIVAL_CONSTANT;
            else if (!strcmp(optarg, "poisson"))
                o.params.arrival = LM_BENCH_ARRIVAL_POISSON;
            else
                return bad_arg("--arrival", optarg);
            break;
        case OPT_WARMUP:
            if (!parse_long(optarg, 0, 1000000, &l)) return bad_arg("--warmup-requests", optarg);
            o.params.warmup_requests = (size_t)l;
            warmup_given = true;
            break;
        case OPT_WARMUP_DURATION:
            if (!parse_double(optarg, 0, 1e7, &o.params.warmup_duration_s))
                return bad_arg("--warmup-duration", optarg);
            break;
        case OPT_WARMUP_CONC:
            if (!parse_long(optarg, 1, 4096, &l)) return bad_arg("--warmup-concurrency", optarg);
            o.params.warmup_concurrency = (int)l;
            break;
        case OPT_THINK:
        case OPT_THINK_MEAN:
            if (!parse_double(optarg, 0, 1e9, &d))
                return bad_arg(c == OPT_THINK ? "--think-time-ms" : "--think-time-mean-ms", optarg);
            o.params.think_time_mean_ms = d;
            break;
        case OPT_THINK_STD:
            if (!parse_double(optarg, 0, 1e9, &o.params.think_time_std_ms))
                return bad_arg("--think-time-std-ms", optarg);
            break;
        case OPT_MAX_TOKENS:
            if (!parse_long(optarg, 1, 10000000, &l)) return bad_arg("--max-tokens", optarg);
            o.params.max_tokens = (int)l;
            break;
        case OPT_TEMPERATURE:
            if (!parse_double(optarg, 0, 100, &o.params.temperature))
                return bad_arg("--temperature", optarg);
            break;
        case OPT_IGNORE_EOS: o.params.ignore_eos = true; break;
        case OPT_MODEL: o.params.model = optarg; break;
        case OPT_API_KEY: o.params.api_key = optarg; break;
        case OPT_SEED: {
            char *end;
            unsigned long long s = strtoull(optarg, &end, 10);
            if (!*optarg || *end) return bad_arg("--seed", optarg);
            o.params.seed = o.data.seed = (uint64_t)s;
            o.params.shuffle = true;
            break;
        }
        case OPT_TIMEOUT:
            if (!parse_double(optarg, 0.001, 1e7, &o.params.timeout_s))
                return bad_arg("--timeout-s", optarg);
            break;
        case OPT_EXTRA: o.params.extra_body = optarg; break;
        case OPT_OUTPUT: o.output_jsonl = optarg; break;
        case OPT_TOKENIZER: tokenizer = optarg; break;
        case OPT_MODEL_DIR: o.model_dir = optarg; break;
        case OPT_SLO_TTFT:
            if (!parse_double(optarg, 0.000001, 1e9, &o.slo.ttft_ms))
                return bad_arg("--slo-ttft-ms", optarg);
            break;
        case OPT_SLO_ITL:
            if (!parse_double(optarg, 0.000001, 1e9, &o.slo.itl_ms))
                return bad_arg("--slo-itl-ms", optarg);
            break;
        case OPT_SLO_LATENCY:
            if (!parse_double(optarg, 0.000001, 1e9, &o.slo.latency_ms))
                return bad_arg("--slo-latency-ms", optarg);
            break;
        case OPT_SERVER_RECORDS: o.server_records = optarg; break;
        case OPT_ARTIFACT_DIR: o.artifact_dir = optarg; break;
        case OPT_PRESET: break; /* applied above */
        case OPT_QUIET: o.params.progress = NULL; break;
        case 'h':
        case OPT_HELP: usage(stdout); return 0;
        default: /* getopt named the option; the 100 lines of usage would bury that */
            fprintf(stderr, "(lumen profile --help lists the options)\n");
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "lumen profile: unexpected argument '%s' (see lumen profile --help)\n",
                argv[optind]);
        return 2;
    }
    if (!o.params.url) {
        fprintf(stderr, "lumen profile: --url is required (see lumen profile --help)\n");
        return 2;
    }
    if (strncmp(o.params.url, "http://", 7) && strncmp(o.params.url, "https://", 8)) {
        fprintf(stderr, "lumen profile: --url %s: expected http://HOST:PORT or https://HOST (see lumen "
                        "profile --help)\n", o.params.url);
        return 2;
    }
    if (o.params.extra_body) {
        json_error_t je;
        json_t *x = json_loads(o.params.extra_body, 0, &je);
        const bool parsed = x != NULL, object = json_is_object(x);
        json_decref(x);
        if (!object) {
            fprintf(stderr, "lumen profile: --extra-body: expected a JSON object, e.g. '{\"top_k\": 20}'%s%s\n",
                    parsed ? "" : ": ", parsed ? "" : je.text);
            return 2;
        }
    }
    if (warmup_given && o.params.warmup_duration_s > 0) {
        fprintf(stderr, "lumen profile: --warmup-requests and --warmup-duration: give one (see lumen "
                        "profile --help)\n");
        return 2;
    }
    /* options this run does not use: say so rather than ignore them */
    if (turns_given && o.data.name && strcmp(o.data.name, "sharegpt"))
        fprintf(stderr, "lumen profile: note: --turns applies to sharegpt; --dataset %s keeps its "
                        "conversations' own turns\n", o.data.name);
    if (isl_given && o.data.name && strcmp(o.data.name, "synthetic"))
        fprintf(stderr, "lumen profile: note: --isl-mean/--isl-std apply to --dataset synthetic; %s "
                        "keeps its prompts\n", o.data.name);
    if (arrival_given && !(o.params.request_rate > 0) && !rate_list)
        fprintf(stderr, "lumen profile: note: --arrival applies with --request-rate; concurrency mode "
                        "sends as requests finish\n");
    if (conversations_given && o.params.request_count)
        fprintf(stderr, "lumen profile: note: --conversations and --request-count both cap the run: it "
                        "ends at whichever is reached first\n");
    if (!conversations_given && (o.params.request_count || o.params.duration_s > 0))
        o.params.conversations = 0;
    o.params.conversations_default = !conversations_given;
    if ((o.params.request_rate > 0 || rate_list) && !concurrency_given)
        o.params.concurrency = 0; /* 256 */
    if (o.data.name && !strcmp(o.data.name, "synthetic") && o.data.osl_mean > 0 &&
        !o.params.ignore_eos)
        fprintf(stderr, "lumen profile: note: synthetic output lengths are max_tokens caps; add "
                        "--ignore-eos for exact lengths\n");
    const char *rel = lm_bench_dataset_default_path(o.data.name);
    if (rel && !*rel) {
        fprintf(stderr,
                "lumen profile: --dataset %s: unknown (known: mt_bench, spec_bench, sharegpt, "
                "synthetic, custom)\n",
                o.data.name);
        return 2;
    }
    if (!strcmp(o.data.name, "custom") && !dataset_path) {
        fprintf(stderr, "lumen profile: --dataset custom needs --dataset-path FILE.jsonl\n");
        return 2;
    }
    char *path = dataset_path ? strdup(dataset_path) : rel ? lm_cmd_find_rel(rel, false) : NULL;
    if (rel && !path) {
        fprintf(stderr,
                "lumen profile: --dataset %s: %s not found in the current directory or next "
                "to the lumen binary; give --dataset-path\n",
                o.data.name, rel);
        return 1;
    }
    o.data.path = path;
    char *tok = tokenizer ? strdup(tokenizer) : lm_cmd_find_rel("models/tiny-qwen3", true);
    o.tokenizer_dir = tok;
    o.render_with_tokenizer = tokenizer != NULL;
    if (!tok)
        fprintf(stderr, "lumen profile: note: no tokenizer (models/tiny-qwen3 not found; give "
                        "--tokenizer DIR): tokens are not counted\n");
    char *cmd = command_line(sweep, argc, argv);
    o.command_line = cmd;
    if (o.params.progress)
        fprintf(o.params.progress, "lumen profile: %s%s%s, %s\n", o.data.name, path ? " from " : "",
                path ? path : "", o.params.url);

    int rc = 1;
    g_stop = 0;
    o.stop = &g_stop;
    catch_stop();
    if (sweep) {
        double values[64];
        size_t n = 0;
        const char *what = rate_list ? "request_rate" : "concurrency";
        if (rate_list)
            n = parse_list(rate_list, 1e-6, 1e7, values, 64);
        else if (conc_list)
            n = parse_list(conc_list, 1, 4096, values, 64);
        if (!n || (rate_list && conc_list && strchr(conc_list, ','))) {
            fprintf(stderr, "lumen profile sweep: give --concurrency C1,C2,... or --request-rate "
                            "R1,R2,...%s (see lumen profile --help)\n",
                    rate_list && conc_list && strchr(conc_list, ',') ? ", not both lists" : "");
            rc = 2;
        } else {
            char *dir = NULL;
            if (lm_bench_sweep(&o, what, values, n, &dir, &rc))
                rc = lm_cmd_fail("profile", "sweep");
            free(dir);
        }
    } else {
        struct lm_bench_profile_result res;
        if (lm_bench_profile(&o, &res))
            rc = lm_cmd_fail("profile", NULL);
        else
            rc = res.exit_code;
        lm_bench_profile_result_free(&res);
    }
    free(cmd);
    free(tok);
    free(path);
    return rc;
}
