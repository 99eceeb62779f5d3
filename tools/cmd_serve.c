/* cmd_serve.c: `lumen serve`, the OpenAI-compatible HTTP server (src/server/server.h). */
#include <getopt.h>
#include <stdint.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>

#include "commands.h"
#include "family/model.h"
#include "server/server.h"

static void help(FILE *f) {
    fprintf(f,
            "usage: lumen serve --model DIR [options]\n\n"
            "Serves one model over an OpenAI-compatible HTTP API:\n"
            "  POST /v1/chat/completions   chat completions, streaming (SSE) or not (needs the\n"
            "                              model's text_conversation task)\n"
            "  POST /v1/completions        completions of a prompt string or token ids (needs\n"
            "                              the text_generation task)\n"
            "  POST /tokenize              {\"prompt\": str} or {\"messages\": [...]} -> token ids\n"
            "  POST /detokenize            {\"tokens\": [...]} -> {\"prompt\": text}\n"
            "  GET  /v1/models             the served model, its context length and capabilities\n"
            "  GET  /v1/models/{id}        that model alone (404 for another id)\n"
            "  GET  /metrics               Prometheus metrics (requests, tokens, TTFT, ITL, latency)\n"
            "  GET  /health                200 {\"status\":\"ok\"} once the model is loaded\n"
            "Supported request fields include n (up to 8), logprobs/top_logprobs, presence_penalty,\n"
            "frequency_penalty, repetition_penalty, min_p, top_k, seed, stop, max_completion_tokens,\n"
            "stream_options.include_usage and chat_template_kwargs.enable_thinking. Chat output is\n"
            "split into reasoning_content and content by the model family's reasoning parser.\n"
            "\"model\" may be left out; when given it must be the id /v1/models lists (the folder's\n"
            "name, or the .gguf file's without the extension), else 404 model_not_found.\n"
            "Requests run together (continuous batching: every running request decodes one token\n"
            "in each batched forward step, long prompts are prefilled in chunks between them) and\n"
            "reuse the KV cache of any earlier prompt or conversation turn they start with. Stop\n"
            "with Ctrl-C (SIGINT) or SIGTERM: the server stops accepting, lets in-flight requests\n"
            "finish for up to --shutdown-timeout-s, cancels the rest and exits 0.\n\n"
            "options:\n"
            "  --model PATH     Hugging Face model folder (config.json, model.safetensors,\n"
            "                   generation_config.json, tokenizer files) or a GGUF file (its\n"
            "                   metadata carries the tokenizer and chat template). Required.\n"
            "  --tokenizer DIR  folder holding tokenizer.json when the model folder has none\n"
            "                   (default: the model folder; tokenizer_config.json is not needed)\n"
            "  --host ADDR      address to listen on (default 127.0.0.1; 0.0.0.0 for all)\n"
            "  --port N         TCP port (default 8000; 0 picks a free port, printed at startup)\n"
            "  --threads N      CPU threads for the forward pass (default 0: all online cores)\n"
            "  --device D       where the forward pass runs: cpu (default), cuda or cuda:N. On CUDA\n"
            "                   the weights go to the GPU as bf16, the KV cache is GPU memory (bf16),\n"
            "                   and tokens of requests without penalties, min_p or logprobs are\n"
            "                   chosen on the GPU (a seeded request is reproducible on that device\n"
            "                   but draws differently from the CPU sampler). On CUDA --max-seqs\n"
            "                   defaults to 256 and --max-batch-tokens to 2048\n"
            "  --ctx-size N     context of one request in tokens: prompt + max_tokens must fit in\n"
            "                   it (default: the smaller of the model's max_position_embeddings\n"
            "                   and 4096). Without max_tokens a chat request may run to the end\n"
            "                   of the context (as in vLLM); a /v1/completions request gets 16\n"
            "                   tokens\n"
            "  --max-seqs N     requests running at once in the batch (default 16; 256 on CUDA)\n"
            "  --max-queue N    requests that may wait beyond the --max-seqs running ones; more get\n"
            "                   HTTP 429 with Retry-After (default 64). Each of a request's n\n"
            "                   choices takes one place of --max-seqs + --max-queue\n"
            "  --max-batch-tokens N  tokens per forward step: one per decoding request plus prefill\n"
            "                   chunks (default 512, on CUDA 2048; at least --max-seqs)\n"
            "  --kv-size SIZE   KV cache (shared by all requests, blocks of 16 tokens): MiB, or with\n"
            "                   a suffix: 512M, 2G, or 32768t for tokens (default: --ctx-size x\n"
            "                   --max-seqs tokens, capped at a quarter of the available memory, or\n"
            "                   on CUDA at 80%% of the GPU memory the weights leave free; at least\n"
            "                   one --ctx-size)\n"
            "  --shutdown-timeout-s S  on SIGTERM/SIGINT, how long in-flight requests may run on\n"
            "                   before they are cancelled (default 10; 0 cancels at once); a\n"
            "                   cancelled stream ends with finish_reason \"abort\" and [DONE]\n"
            "                   (vLLM's word; records and the log say \"cancelled\")\n"
            "  --timeout-keep-alive S  close a connection idle for S seconds: between requests, or\n"
            "                   a client that stops sending its request (default 5, as uvicorn;\n"
            "                   0: never). A request being answered is never idle\n"
            "  --max-connections N  open connections at most (default 1024, lowered to what\n"
            "                   ulimit -n allows); beyond it new connections are closed at once,\n"
            "                   with a log line\n"
            "  --speculative-config JSON  speculative decoding, as vLLM's option: e.g.\n"
            "                   '{\"method\": \"ngram\", \"num_speculative_tokens\": 4}'. Each step, a\n"
            "                   decoding request also runs up to num_speculative_tokens (1..15; on\n"
            "                   CUDA at most 7 are used, 3 is the batch-1 sweet spot) tokens proposed\n"
            "                   by n-gram prompt lookup: the tokens that followed the earliest earlier\n"
            "                   occurrence of its last prompt_lookup_max down to prompt_lookup_min\n"
            "                   tokens, in its prompt and output (vLLM's defaults: 5 and 5; one given\n"
            "                   sets the other). The model keeps those it agrees with, drawn as plain\n"
            "                   decoding draws them: the same output (on CUDA bit for bit in steps\n"
            "                   of up to 4 tokens, else as batching: to bf16 near ties), in fewer\n"
            "                   steps where text repeats. \"disable_by_batch_size\": N drafts nothing\n"
            "                   in a step of more than N requests (default: off)\n"
            "  --no-async-scheduling  wait for each engine step's tokens before the next step.\n"
            "                   By default (on CUDA) a steady decode, every running request\n"
            "                   decoding and none waiting, queues each step before the host takes\n"
            "                   the last one's tokens, as vLLM's --async-scheduling: the same\n"
            "                   tokens, more throughput and shorter ITL; a request arriving then\n"
            "                   waits one step longer for its first token. Off with\n"
            "                   --speculative-config\n"
            "  --records FILE   append one JSON line per generation request to FILE: ids, headers\n"
            "                   (X-Request-Id, X-Conversation-Id, X-Lumen-Phase, X-Lumen-Turn),\n"
            "                   engine times, token counts and SHA-256 digests of the contents,\n"
            "                   never raw text (the contract is docs/RECORDS.md)\n"
            "  --no-reasoning   do not split chat output into reasoning_content and content:\n"
            "                   everything the model writes, <think> block included, is content\n"
            "  --quiet          do not log one line per request to stderr\n"
            "  -h, --help       show this help\n");
}

/* SIGINT and SIGTERM are taken by this thread from the start (sigwait): one that arrives while
 * the model loads or the server starts exits at once; once the server runs, the signal goes to
 * the main thread (pthread_join), which shuts the server down. */
static pthread_mutex_t g_sig_mu = PTHREAD_MUTEX_INITIALIZER;
static bool g_serving;

static void *signal_watch(void *arg) {
    int sig = 0;
    sigwait((const sigset_t *)arg, &sig);
    pthread_mutex_lock(&g_sig_mu);
    bool serving = g_serving;
    pthread_mutex_unlock(&g_sig_mu);
    if (!serving) {
        fprintf(stderr, "lumen serve: %s before the server started, exiting\n",
                sig == SIGINT ? "SIGINT" : "SIGTERM");
        _exit(0);
    }
    return (void *)(intptr_t)sig;
}

static bool parse_int(const char *s, long lo, long hi, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}

/* --kv-size SIZE: MiB by default, or with a suffix: M/MiB, G/GiB, or t/tokens. Sets *bytes or
 * *tokens (the other 0); false when SIZE is not a positive size. */
static bool parse_kv_size(const char *s, double *bytes, double *tokens) {
    char *end;
    double v = strtod(s, &end);
    *bytes = *tokens = 0;
    if (end == s || !(v > 0) || v > 1e15) return false;
    if (!strcmp(end, "t") || !strcmp(end, "tokens"))
        *tokens = v;
    else if (!*end || !strcmp(end, "M") || !strcmp(end, "MiB"))
        *bytes = v * 1048576.0;
    else if (!strcmp(end, "G") || !strcmp(end, "GiB"))
        *bytes = v * 1073741824.0;
    else
        return false;
    return true;
}

static void bad_kv_size(const char *s) {
    fprintf(stderr,
            "lumen serve: --kv-size must be a positive size such as 2048 (MiB), 2G or "
            "65536t, not '%s'\n",
            s);
}

int lm_cmd_serve(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},   {"tokenizer", required_argument, 0, 'T'},
        {"host", required_argument, 0, 'H'},    {"port", required_argument, 0, 'p'},
        {"threads", required_argument, 0, 't'}, {"ctx-size", required_argument, 0, 'c'},
        {"max-queue", required_argument, 0, 'q'}, {"quiet", no_argument, 0, 'Q'},
        {"records", required_argument, 0, 'R'}, {"no-reasoning", no_argument, 0, 'N'},
        {"max-seqs", required_argument, 0, 'S'}, {"max-batch-tokens", required_argument, 0, 'B'},
        {"kv-size", required_argument, 0, 'K'}, {"shutdown-timeout-s", required_argument, 0, 'D'},
        {"device", required_argument, 0, 'd'},
        {"timeout-keep-alive", required_argument, 0, 'A'}, {"max-connections", required_argument, 0, 'C'},
        {"speculative-config", required_argument, 0, 'X'},
        {"no-async-scheduling", no_argument, 0, 'Y'},
        {"help", no_argument, 0, 'h'},          {0, 0, 0, 0},
    };
    const char *model_dir = NULL, *tok_dir = NULL;
    struct lm_server_params sp = lm_server_default_params();
    int threads = 0, ctx = 0;
    const char *kv_size = NULL, *device = NULL;
    double kv_bytes = 0, kv_tokens = 0; /* --kv-size, one of the two */
    optind = 1;
    opterr = 0; /* we print our own "lumen serve: ..." messages */
    int o;
    while ((o = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (o) {
        case 'm': model_dir = optarg; break;
        case 'T': tok_dir = optarg; break;
        case 'H': sp.host = optarg; break;
        case 'Q': sp.log_requests = false; break;
        case 'R': sp.records_path = optarg; break;
        case 'N': sp.reasoning = false; break;
        case 'p':
            if (!parse_int(optarg, 0, 65535, &sp.port)) {
                fprintf(stderr, "lumen serve: --port must be 0..65535, not '%s'\n", optarg);
                return 2;
            }
            break;
        case 't':
            if (!parse_int(optarg, 0, 4096, &threads)) {
                fprintf(stderr, "lumen serve: --threads must be 0..4096, not '%s'\n", optarg);
                return 2;
            }
            break;
        case 'c':
            if (!parse_int(optarg, 1, INT_MAX, &ctx)) {
                fprintf(stderr, "lumen serve: --ctx-size must be a positive integer, not '%s'\n", optarg);
                return 2;
            }
            break;
        case 'q':
            if (!parse_int(optarg, 0, 1 << 20, &sp.max_queue)) {
                fprintf(stderr, "lumen serve: --max-queue must be 0..1048576, not '%s'\n", optarg);
                return 2;
            }
            break;
        case 'S':
            if (!parse_int(optarg, 1, 4096, &sp.max_seqs)) {
                fprintf(stderr, "lumen serve: --max-seqs must be 1..4096, not '%s'\n", optarg);
                return 2;
            }
            break;
        case 'B':
            if (!parse_int(optarg, 1, 1 << 20, &sp.max_batch_tokens)) {
                fprintf(stderr, "lumen serve: --max-batch-tokens must be 1..1048576, not '%s'\n", optarg);
                return 2;
            }
            break;
        case 'K': /* checked here, converted to tokens once the model is open */
            if (!parse_kv_size(optarg, &kv_bytes, &kv_tokens)) {
                bad_kv_size(optarg);
                return 2;
            }
            kv_size = optarg;
            break;
        case 'Y': sp.no_async_scheduling = true; break;
        case 'X':
            if (lm_spec_parse(optarg, &sp.spec)) {
                fprintf(stderr, "lumen serve: %s\n", lm_error_message()); /* "speculative config: ..." */
                return 2;
            }
            break;
        case 'd':
            if (!lm_cmd_device_ok("serve", optarg)) return 2;
            device = optarg;
            break;
        case 'A':
            if (!parse_int(optarg, 0, 86400, &sp.timeout_keep_alive_s)) {
                fprintf(stderr, "lumen serve: --timeout-keep-alive must be 0..86400 seconds, not '%s'\n", optarg);
                return 2;
            }
            if (sp.timeout_keep_alive_s == 0) sp.timeout_keep_alive_s = -1; /* never (params: < 0) */
            break;
        case 'C':
            if (!parse_int(optarg, 1, 1 << 20, &sp.max_connections)) {
                fprintf(stderr, "lumen serve: --max-connections must be 1..1048576, not '%s'\n", optarg);
                return 2;
            }
            break;
        case 'D': {
            char *end;
            sp.shutdown_timeout_s = strtod(optarg, &end);
            if (!*optarg || *end || !(sp.shutdown_timeout_s >= 0 && sp.shutdown_timeout_s <= 86400)) {
                fprintf(stderr, "lumen serve: --shutdown-timeout-s must be 0..86400 seconds, not '%s'\n", optarg);
                return 2;
            }
            if (sp.shutdown_timeout_s == 0) sp.shutdown_timeout_s = -1; /* 0 in the params: default */
            break;
        }
        case 'h': help(stdout); return 0;
        case ':':
            fprintf(stderr, "lumen serve: %s needs a value (see lumen serve --help)\n", argv[optind - 1]);
            return 2;
        default:
            fprintf(stderr, "lumen serve: unknown option '%s' (see lumen serve --help)\n", argv[optind - 1]);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "lumen serve: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!model_dir) {
        fprintf(stderr, "lumen serve: --model DIR is required (see lumen serve --help)\n");
        return 2;
    }

    /* Signals are taken by sigwait in signal_watch, so block them before any thread starts:
     * every thread inherits the mask, and none is interrupted. SIGPIPE from a vanished client is
     * ignored. */
    static sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    pthread_t watcher;
    if (pthread_create(&watcher, NULL, signal_watch, &sigs)) {
        fprintf(stderr, "lumen serve: cannot start the signal thread\n");
        return 1;
    }

    struct lm_model_open_params mp = lm_model_default_open_params();
    mp.tokenizer_dir = tok_dir;
    mp.n_threads = threads;
    mp.device = device;
    struct lm_model *m = NULL;
    if (lm_model_open(model_dir, &mp, &m)) return lm_cmd_fail("serve", NULL);
    const struct lm_model_config *cfg = lm_model_config(m);
    if (!(lm_model_tasks(m) & (LM_TASK_TEXT_CONVERSATION | LM_TASK_TEXT_GENERATION))) {
        fprintf(stderr, "lumen serve: %s: this model family declares no task lumen serves\n", model_dir);
        lm_model_close(m);
        return 1;
    }
    int max_pos = cfg->max_position_embeddings;
    if (!ctx) ctx = max_pos > 0 && max_pos < 4096 ? max_pos : 4096;
    if (max_pos > 0 && ctx > max_pos) {
        fprintf(stderr, "lumen serve: --ctx-size %d exceeds the model's max_position_embeddings %d\n",
                ctx, max_pos);
        lm_model_close(m);
        return 2;
    }
    sp.ctx_size = ctx;
    struct lm_model_info info;
    lm_model_info(m, &info);
    if (info.device_memory_free) { /* CUDA: a GPU wants larger batches than the CPU defaults */
        if (!sp.max_seqs) sp.max_seqs = 256;
        if (!sp.max_batch_tokens) sp.max_batch_tokens = sp.max_seqs > 2048 ? sp.max_seqs : 2048;
    }
    if (!kv_size && info.device_memory_free) {
        /* CUDA: the default (ctx-size x max-seqs) capped at 80% of what the weights and the
         * step's activations and logits (2 GiB allowed) leave free on the GPU. */
        double room = ((double)info.device_memory_free - (double)info.device_weight_bytes -
                       2.0 * 1073741824.0) * 0.8;
        double per = (double)lm_model_kv_bytes_per_token(m);
        long want = (long)ctx * (sp.max_seqs > 0 ? sp.max_seqs : 16);
        long cap = room > 0 ? (long)(room / per) : 0;
        sp.kv_tokens = want < cap ? want : cap;
        if (sp.kv_tokens < ctx) sp.kv_tokens = ctx; /* the KV allocation says when it cannot */
    }
    if (kv_size) {
        double per = (double)lm_model_kv_bytes_per_token(m);
        double tokens = kv_tokens ? kv_tokens : kv_bytes / per;
        if (!(tokens >= 1) || tokens > 1e12) {
            bad_kv_size(kv_size);
            lm_model_close(m);
            return 2;
        }
        double ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
        if (info.device_memory_free) /* CUDA: what the weights leave of the GPU's free memory */
            ram = (double)info.device_memory_free - (double)info.device_weight_bytes;
        if (tokens * per > ram || tokens > 1e9) {
            fprintf(stderr, "lumen serve: --kv-size %s is %.0f MiB (%.0f tokens); %s has "
                            "%.0f MiB of memory%s\n", kv_size, tokens * per / 1048576.0, tokens,
                    info.device_memory_free ? info.device : "this machine", ram / 1048576.0,
                    info.device_memory_free ? " free beside the weights" : "");
            lm_model_close(m);
            return 2;
        }
        sp.kv_tokens = (long)tokens;
        if (sp.kv_tokens < ctx) {
            fprintf(stderr, "lumen serve: --kv-size %s holds %ld tokens, less than one request of "
                            "--ctx-size %d\n", kv_size, sp.kv_tokens, ctx);
            lm_model_close(m);
            return 2;
        }
    }

    struct lm_server *srv = NULL;
    if (lm_server_start(m, &sp, &srv)) {
        lm_cmd_fail("serve", NULL);
        lm_model_close(m);
        return 1;
    }
    bool v6 = strchr(sp.host, ':') != NULL;
    char dev[200] = "cpu";
    if (info.device_memory_free) snprintf(dev, sizeof dev, "%s (%s)", info.device, info.device_name);
    printf("lumen serve: model %s (%s, %d layers) at http://%s%s%s:%d  device %s  ctx-size %d  "
           "max-queue %d  threads %d%s%s\n",
           lm_model_name(m), cfg->model_type, cfg->num_hidden_layers, v6 ? "[" : "", sp.host,
           v6 ? "]" : "", lm_server_port(srv), dev, ctx, sp.max_queue, info.n_threads,
           sp.records_path ? "  records " : "", sp.records_path ? sp.records_path : "");
    fflush(stdout);

    pthread_mutex_lock(&g_sig_mu);
    g_serving = true;
    pthread_mutex_unlock(&g_sig_mu);
    void *got = NULL;
    pthread_join(watcher, &got);
    int sig = (int)(intptr_t)got;
    fprintf(stderr, "lumen serve: %s, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    lm_server_stop(srv);
    lm_model_close(m);
    return 0;
}
