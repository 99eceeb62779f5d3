/* cmd_serve.c: `lumen serve`, the OpenAI-compatible HTTP server (src/server/server.h). */
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "family/model.h"
#include "server/server.h"

static void help(FILE *f) {
    fprintf(f,
            "usage: lumen serve --model DIR [options]\n\n"
            "Serves one model over an OpenAI-compatible HTTP API:\n"
            "  POST /v1/chat/completions   chat completions, streaming (SSE) or not\n"
            "  GET  /v1/models             the served model and its context length\n"
            "  GET  /health                200 {\"status\":\"ok\"} once the model is loaded\n"
            "Requests run one at a time; others wait in a queue. Stop with Ctrl-C (SIGINT) or\n"
            "SIGTERM: queued and running requests are cancelled and the server exits cleanly.\n\n"
            "options:\n"
            "  --model DIR      Hugging Face model folder (config.json, model.safetensors,\n"
            "                   generation_config.json, tokenizer files). Required.\n"
            "  --tokenizer DIR  folder holding tokenizer.json and tokenizer_config.json when the\n"
            "                   model folder has none (default: the model folder)\n"
            "  --host ADDR      address to listen on (default 127.0.0.1; 0.0.0.0 for all)\n"
            "  --port N         TCP port (default 8000; 0 picks a free port, printed at startup)\n"
            "  --threads N      CPU threads for the forward pass (default 0: all online cores)\n"
            "  --ctx-size N     KV-cache capacity in tokens of the one sequence the engine holds;\n"
            "                   prompt + max_tokens must fit in it (default: the smaller of the\n"
            "                   model's max_position_embeddings and 4096)\n"
            "  --max-queue N    requests that may wait behind the running one; more get HTTP 429\n"
            "                   (default 64)\n"
            "  --quiet          do not log one line per request to stderr\n"
            "  -h, --help       show this help\n");
}

static bool parse_int(const char *s, long lo, long hi, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}

int lm_cmd_serve(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},   {"tokenizer", required_argument, 0, 'T'},
        {"host", required_argument, 0, 'H'},    {"port", required_argument, 0, 'p'},
        {"threads", required_argument, 0, 't'}, {"ctx-size", required_argument, 0, 'c'},
        {"max-queue", required_argument, 0, 'q'}, {"quiet", no_argument, 0, 'Q'},
        {"help", no_argument, 0, 'h'},          {0, 0, 0, 0},
    };
    const char *model_dir = NULL, *tok_dir = NULL;
    struct lm_server_params sp = lm_server_default_params();
    int threads = 0, ctx = 0;
    optind = 1;
    opterr = 0; /* we print our own "lumen serve: ..." messages */
    int o;
    while ((o = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (o) {
        case 'm': model_dir = optarg; break;
        case 'T': tok_dir = optarg; break;
        case 'H': sp.host = optarg; break;
        case 'Q': sp.log_requests = false; break;
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

    /* Signals are taken by sigwait below, so block them before any thread starts: every thread
     * inherits the mask, and none is interrupted. SIGPIPE from a vanished client is ignored. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct lm_model_open_params mp = lm_model_default_open_params();
    mp.tokenizer_dir = tok_dir;
    mp.n_threads = threads;
    struct lm_model *m = NULL;
    if (lm_model_open(model_dir, &mp, &m)) return lm_cmd_fail("serve", NULL);
    const struct lm_model_config *cfg = lm_model_config(m);
    if (!(lm_model_tasks(m) & LM_TASK_TEXT_CONVERSATION)) {
        fprintf(stderr, "lumen serve: %s: this model family does not do chat conversations\n", model_dir);
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

    struct lm_server *srv = NULL;
    if (lm_server_start(m, &sp, &srv)) {
        lm_cmd_fail("serve", NULL);
        lm_model_close(m);
        return 1;
    }
    bool v6 = strchr(sp.host, ':') != NULL;
    printf("lumen serve: model %s (%s, %d layers) at http://%s%s%s:%d  ctx-size %d  max-queue %d  "
           "threads %d\n",
           lm_model_name(m), cfg->model_type, cfg->num_hidden_layers, v6 ? "[" : "", sp.host,
           v6 ? "]" : "", lm_server_port(srv), ctx, sp.max_queue, threads);
    fflush(stdout);

    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "lumen serve: %s, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    lm_server_stop(srv);
    lm_model_close(m);
    return 0;
}
