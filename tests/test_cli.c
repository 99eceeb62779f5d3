/* test_cli.c: the `lumen` CLI's shared behaviour, as a user runs it (the built binary, through
 * popen).
 *
 * Checked: `lumen run --ids` on a model folder without tokenizer.json generates the reference
 * greedy ids (transformers, tests/data/fixtures/tiny_qwen3_reference) and says on stderr that text
 * needs a tokenizer, while run with a text prompt, tokenize and build on that folder are errors
 * naming tokenizer.json and --tokenizer. A --device value other than cpu, cuda or cuda:N is a
 * usage error (exit 2, before the model loads) of run, perf and serve alike, naming the flag, the
 * value and the accepted values, and `--device cpu` is accepted. Usage errors start with
 * "lumen <command>:" (getopt's too) and name a left-over argument; `lumen help run` is
 * `lumen run --help`. `lumen template` takes a GGUF file and renders as on the folder. A command
 * reading stdin from a terminal says so. Every command's --help names each of its long options,
 * and every --flag the docs give after `lumen <command>`.
 * LM_LABEL: model */
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/file.h"
#include "check.h"
#include "cli.h"

static char g_dir[64];

static int run(const char *cmd, struct lm_buf *out, struct lm_buf *err) {
    return cli_run(g_dir, cmd, out, err);
}

/* `lumen run --ids` without a tokenizer: the first reference case's greedy ids. */
static void run_ids_without_tokenizer(struct lm_buf *out, struct lm_buf *err) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s/notok' && cp '%s/config.json' '%s/generation_config.json' "
             "'%s/model.safetensors' '%s/notok/'",
             g_dir, TINY_MODEL, TINY_MODEL, TINY_MODEL, g_dir);
    CHECK(system(cmd) == 0, "%s", cmd);

    json_error_t je;
    FILE *f = fopen(TEST_DATA("fixtures/tiny_qwen3_reference/cases.jsonl"), "r");
    json_t *c = f ? json_loadf(f, JSON_DISABLE_EOF_CHECK, &je) : NULL;
    if (f) fclose(f);
    json_t *prompt = json_object_get(c, "prompt_ids"), *greedy = json_object_get(c, "greedy_ids");
    CHECK(json_array_size(prompt) && json_array_size(greedy), "the first reference case");
    char *prompt_s = json_dumps(prompt, JSON_COMPACT), *greedy_s = json_dumps(greedy, JSON_COMPACT);
    if (!prompt_s || !greedy_s) goto done;

    snprintf(
        cmd, sizeof cmd,
        "echo '%s' | '%s' run --model '%s/notok' --ids --greedy --ignore-eos -n %zu --threads 1",
        prompt_s, LM_LUMEN_BIN, g_dir, json_array_size(greedy));
    int rc = run(cmd, out, err);
    CHECK(rc == 0 && !strncmp(out->p, greedy_s, strlen(greedy_s)) &&
              !strcmp(out->p + strlen(greedy_s), "\n"),
          "run --ids without tokenizer.json: rc %d, want %s\nstdout: %s\nstderr: %s", rc, greedy_s,
          out->p, err->p);
    CHECK(strstr(err->p, "has no tokenizer.json") && strstr(err->p, "--tokenizer DIR"),
          "run --ids without tokenizer.json says that text needs one: %s", err->p);

    snprintf(cmd, sizeof cmd, "'%s' run --model '%s/notok' -n 2 --threads 1 Hi", LM_LUMEN_BIN,
             g_dir);
    rc = run(cmd, out, err);
    CHECK(rc == 1 && strstr(err->p, "no tokenizer.json") && strstr(err->p, "with --ids"),
          "run with a text prompt and no tokenizer.json: rc %d, stderr: %s", rc, err->p);
    snprintf(cmd, sizeof cmd, "printf Hi | '%s' tokenize --model '%s/notok'", LM_LUMEN_BIN, g_dir);
    rc = run(cmd, out, err);
    CHECK(rc == 1 && strstr(err->p, "has no tokenizer.json; pass --tokenizer DIR"),
          "tokenize without tokenizer.json: rc %d, stderr: %s", rc, err->p);
    snprintf(cmd, sizeof cmd, "'%s' build --model '%s/notok' --out '%s/notok.gguf'", LM_LUMEN_BIN,
             g_dir, g_dir);
    rc = run(cmd, out, err);
    CHECK(rc == 1 && strstr(err->p, "has no tokenizer.json; pass --tokenizer DIR"),
          "build without tokenizer.json: rc %d, stderr: %s", rc, err->p);
done:
    free(prompt_s);
    free(greedy_s);
    json_decref(c);
}

/* A bad --device is a usage error of every command that takes one. */
static void bad_device(struct lm_buf *out, struct lm_buf *err) {
    static const char *const k_cmds[] = {"run", "perf", "serve"};
    static const char *const k_values[] = {"tpu", "cuda:", "cuda:x", "cuda:99999", "CPU"};
    char cmd[1024];
    for (size_t i = 0; i < sizeof k_cmds / sizeof *k_cmds; i++)
        for (size_t j = 0; j < sizeof k_values / sizeof *k_values; j++) {
            snprintf(cmd, sizeof cmd, "'%s' %s --model '%s' --device '%s' </dev/null", LM_LUMEN_BIN,
                     k_cmds[i], TINY_MODEL, k_values[j]);
            int rc = run(cmd, out, err);
            char want[256];
            snprintf(want, sizeof want,
                     "lumen %s: --device takes cpu, cuda or cuda:N (N a GPU index), not '%s'\n",
                     k_cmds[i], k_values[j]);
            CHECK(rc == 2 && !strcmp(err->p, want), "%s --device %s: rc %d, stderr: %s", k_cmds[i],
                  k_values[j], rc, err->p);
        }
    snprintf(cmd, sizeof cmd,
             "echo '[1,2]' | '%s' run --model '%s' --device cpu --ids -n 1 --threads 1",
             LM_LUMEN_BIN, TINY_MODEL);
    int rc = run(cmd, out, err);
    CHECK(rc == 0 && out->p[0] == '[', "run --device cpu: rc %d, stderr: %s", rc, err->p);
}

/* `lumen template` on a GGUF (built here) renders what it renders on the model folder. */
static void template_gguf(struct lm_buf *out, struct lm_buf *err) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' build --model '%s' --out '%s/tiny.gguf' >/dev/null",
             LM_LUMEN_BIN, TINY_MODEL, g_dir);
    CHECK(system(cmd) == 0, "%s", cmd);
    const char *msgs =
        "[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Hi\"}]";
    snprintf(cmd, sizeof cmd, "echo '%s' | '%s' template --model '%s' --enable-thinking=false",
             msgs, LM_LUMEN_BIN, TINY_MODEL);
    int rc = run(cmd, out, err);
    CHECK(rc == 0 && strstr(out->p, "<|im_start|>system\nBe brief.<|im_end|>"),
          "template on the folder: rc %d, stderr: %s", rc, err->p);
    char *folder = strdup(out->p);
    /* a "developer" message renders as the "system" one, as the server takes it; an unknown role
     * is refused with the roles that are accepted */
    snprintf(cmd, sizeof cmd,
             "echo '[{\"role\":\"developer\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Hi\"}]'"
             " | '%s' template --model '%s' --enable-thinking=false",
             LM_LUMEN_BIN, TINY_MODEL);
    rc = run(cmd, out, err);
    CHECK(rc == 0 && !strcmp(out->p, folder), "template with a developer message: rc %d, stderr: %s\nstdout: %s",
          rc, err->p, out->p);
    snprintf(cmd, sizeof cmd, "echo '[{\"role\":\"critic\",\"content\":\"x\"}]' | '%s' template --model '%s'",
             LM_LUMEN_BIN, TINY_MODEL);
    rc = run(cmd, out, err);
    CHECK(rc == 1 && strstr(err->p, "messages[0]: role must be one of system, developer, user, assistant"),
          "template with an unknown role: rc %d, stderr: %s", rc, err->p);
    snprintf(cmd, sizeof cmd,
             "echo '%s' | '%s' template --model '%s/tiny.gguf' --enable-thinking=false", msgs,
             LM_LUMEN_BIN, g_dir);
    rc = run(cmd, out, err);
    CHECK(rc == 0 && !strcmp(out->p, folder),
          "template on the GGUF: rc %d, stderr: %s\nstdout: %s\nwant: %s", rc, err->p, out->p,
          folder);
    /* a folder without tokenizer_config.json builds too (special ids from config.json, no
     * tokenizer.chat_template), and its GGUF renders the same */
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s/notc' && for f in config.json generation_config.json model.safetensors tokenizer.json; "
             "do ln -sf '%s'/$f '%s/notc/'; done && '%s' build --model '%s/notc' --out '%s/notc.gguf'",
             g_dir, TINY_MODEL, g_dir, LM_LUMEN_BIN, g_dir, g_dir);
    rc = run(cmd, out, err);
    CHECK(rc == 0, "build without tokenizer_config.json: rc %d, stderr: %s", rc, err->p);
    snprintf(cmd, sizeof cmd,
             "echo '%s' | '%s' template --model '%s/notc.gguf' --enable-thinking=false", msgs,
             LM_LUMEN_BIN, g_dir);
    rc = run(cmd, out, err);
    CHECK(rc == 0 && !strcmp(out->p, folder),
          "template on a GGUF built without tokenizer_config.json: rc %d, stderr: %s\nstdout: %s", rc, err->p,
          out->p);
    free(folder);
    snprintf(cmd, sizeof cmd, "echo '[]' | '%s' template --model '%s/config.json'", LM_LUMEN_BIN,
             TINY_MODEL);
    rc = run(cmd, out, err);
    CHECK(rc == 1 && strstr(err->p, "a file that is not GGUF"),
          "template on config.json: rc %d, stderr: %s", rc, err->p);
}

/* A command that reads stdin from a terminal says so (else it looks hung); through a pipe it
 * says nothing. The terminal is util-linux's `script`, when there is one. */
static void stdin_hint(struct lm_buf *out, struct lm_buf *err) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "printf Hi | '%s' tokenize --model '%s'", LM_LUMEN_BIN, TINY_MODEL);
    int rc = run(cmd, out, err);
    CHECK(rc == 0 && !*err->p, "tokenize through a pipe: rc %d, stderr: %s", rc, err->p);
    if (system("script -qec true /dev/null </dev/null >/dev/null 2>&1")) {
        fprintf(stderr, "test_cli: no util-linux script: the terminal case is not checked\n");
        return;
    }
    snprintf(cmd, sizeof cmd, "script -qec \"'%s' tokenize --model '%s'\" /dev/null </dev/null",
             LM_LUMEN_BIN, TINY_MODEL);
    rc = run(cmd, out, err);
    CHECK(rc == 0 &&
              strstr(out->p, "lumen tokenize: reading the text from stdin (end it with Ctrl-D)"),
          "tokenize from a terminal: rc %d, output: %s", rc, out->p);
}

/* Each command of tools/commands.def with its --help text (filled by help_lists_options). */
static struct {
    char name[32];
    char *help;
} g_cmds[32];
static int g_n_cmds;

/* Every long option of every command (the getopt tables in tools/cmd_<name>.c, names from
 * tools/commands.def) is in that command's --help, and --help exits 0. */
static void help_lists_options(struct lm_buf *out, struct lm_buf *err) {
    struct lm_buf def = {0}, src = {0};
    CHECK(!lm_file_read(LM_SOURCE_DIR "/tools/commands.def", &def), "tools/commands.def");
    for (const char *d = def.p ? strstr(def.p, "\nLM_CMD(") : NULL; d && g_n_cmds < 32;
         d = strstr(d + 1, "\nLM_CMD(")) {
        char *name = g_cmds[g_n_cmds].name, path[512], cmd[1024], want[80];
        if (sscanf(d, "\nLM_CMD(%31[a-z_],", name) != 1) continue;
        snprintf(path, sizeof path, "%s/tools/cmd_%s.c", LM_SOURCE_DIR, name);
        lm_buf_reset(&src);
        CHECK(!lm_file_read(path, &src), "%s", path);
        snprintf(cmd, sizeof cmd, "'%s' %s --help", LM_LUMEN_BIN, name);
        int rc = run(cmd, out, err);
        CHECK(rc == 0 && strstr(out->p, "lumen"), "lumen %s --help: rc %d, stderr: %s", name, rc,
              err->p);
        g_cmds[g_n_cmds++].help = strdup(out->p);
        int n_opts = 0;
        for (const char *o = src.p ? strstr(src.p, "{\"") : NULL; o; o = strstr(o + 1, "{\"")) {
            char opt[64], kind[32];
            if (sscanf(o, "{\"%63[a-z0-9-]\", %31[a-z_]", opt, kind) != 2 ||
                !strstr(kind, "_argument"))
                continue;
            n_opts++;
            snprintf(want, sizeof want, "--%s", opt);
            CHECK(strstr(out->p, want), "lumen %s --help does not mention %s", name, want);
        }
        CHECK(n_opts > 0 || !strcmp(name, "version"), "no getopt table found in %s", path);
    }
    CHECK(g_n_cmds >= 12, "commands.def lists %d commands", g_n_cmds);
    lm_buf_free(&def);
    lm_buf_free(&src);
}

/* Every --flag that README.md and docs/ give after `lumen <command>` (up to the end of the code
 * span, table cell or line) is in that command's --help. */
static void docs_use_real_flags(void) {
    static const char *const k_docs[] = {"README.md", "docs/ARCHITECTURE.md", "docs/ENGINE.md",
                                         "docs/RECORDS.md"};
    int n_seen = 0;
    for (size_t f = 0; f < sizeof k_docs / sizeof *k_docs; f++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", LM_SOURCE_DIR, k_docs[f]);
        struct lm_buf doc = {0};
        CHECK(!lm_file_read(path, &doc), "%s", path);
        for (const char *l = doc.p ? strstr(doc.p, "lumen ") : NULL; l;
             l = strstr(l + 1, "lumen ")) {
            const char *c = l + 6;
            size_t n = strspn(c, "abcdefghijklmnopqrstuvwxyz");
            const char *help = NULL;
            for (int i = 0; i < g_n_cmds; i++)
                if (strlen(g_cmds[i].name) == n && !strncmp(c, g_cmds[i].name, n) && c[n] == ' ')
                    help = g_cmds[i].help;
            if (!help) continue;
            const size_t span = strcspn(c + n, "`|\n");
            for (const char *o = c + n; o < c + n + span; o++) {
                if (strncmp(o, " --", 3) && strncmp(o, "[--", 3)) continue;
                char flag[64], want[80];
                if (sscanf(o + 1, "--%63[a-z0-9-]", flag) != 1) continue;
                n_seen++;
                snprintf(want, sizeof want, "--%s", flag);
                CHECK(strstr(help, want), "%s: `lumen %.*s ... %s`: not in lumen %.*s --help",
                      k_docs[f], (int)n, c, want, (int)n, c);
            }
        }
        lm_buf_free(&doc);
    }
    CHECK(n_seen > 20, "only %d flags found after `lumen <command>` in the docs", n_seen);
}

/* Usage errors name what is wrong with the command's own name first, and exit 2: a left-over
 * argument is quoted, and getopt's messages start with "lumen <command>", not argv[0]. */
static void usage_errors(struct lm_buf *out, struct lm_buf *err) {
    static const struct {
        const char *cmd;
        bool model; /* --model <the tiny model> after the command */
        const char *rest, *want;
    } k_cases[] = {
        {"perf", true, "extra", "lumen perf: unexpected argument 'extra'\n"},
        {"tokenize", true, "a b", "lumen tokenize: unexpected argument 'a'\n"},
        {"run", true, "--ids x",
         "lumen run: --ids reads the prompt from stdin; unexpected argument 'x'\n"},
        {"version", false, "extra", "lumen version: unexpected argument 'extra'\n"},
        {"run", true, "--bogus", "lumen run: unrecognized option '--bogus'\n"},
        {"perf", false, "--bogus", "lumen perf: unrecognized option '--bogus'\n"},
        {"synth", false, "--bogus", "lumen synth: unrecognized option '--bogus'\n"},
        {"build", false, "", "lumen build: --model DIR and --out FILE are required\n"},
        {"run", false, "", "lumen run: --model DIR is required\n"},
        {"profile", false, "sweep --bogus", "lumen profile sweep: unrecognized option '--bogus'\n"},
        {"profile", false, "--url", "lumen profile: option '--url' requires an argument\n"},
        /* a list is sweep's: a single run says so */
        {"profile", false, "--url http://127.0.0.1:9 --concurrency 1,2",
         "lumen profile: --concurrency 1,2: a single run takes one value; `lumen profile sweep` takes a list"},
        {"profile", false, "--url foo://bar", "lumen profile: --url foo://bar: expected http://HOST:PORT"},
        {"profile", false, "--url http://127.0.0.1:9 --extra-body notjson",
         "lumen profile: --extra-body: expected a JSON object"},
        {"profile", false, "--url http://127.0.0.1:9 --warmup-requests 1 --warmup-duration 1",
         "lumen profile: --warmup-requests and --warmup-duration: give one"},
        {"profile", false, "--url http://127.0.0.1:9 --request-rate 1,2",
         "lumen profile: --request-rate 1,2: a single run takes one value; `lumen profile sweep` takes a list"},
        /* a bad --kv-size is refused before the model loads (no such model here) */
        {"serve", false, "--model /nonexistent --kv-size 2X",
         "lumen serve: --kv-size must be a positive size such as 2048 (MiB), 2G or 65536t, not "
         "'2X'\n"},
        {"serve", false,
         "--model /nonexistent --speculative-config '{\"method\":\"eagle\",\"num_speculative_tokens\":3}'",
         "lumen serve: speculative config: method must be \"ngram\""},
        {"serve", false,
         "--model /nonexistent --speculative-config '{\"method\":\"ngram\",\"num_speculative_tokens\":99}'",
         "lumen serve: speculative config: num_speculative_tokens: 99 is not in 1..15\n"},
        {"run", false, "--model /nonexistent --speculative-config '{\"num_speculative_tokens\":3}'",
         "lumen run: speculative config: method is required (\"ngram\")\n"},
    };
    char cmd[1024];
    for (size_t i = 0; i < sizeof k_cases / sizeof *k_cases; i++) {
        snprintf(cmd, sizeof cmd, "'%s' %s %s%s%s %s </dev/null", LM_LUMEN_BIN, k_cases[i].cmd,
                 k_cases[i].model ? "--model '" : "", k_cases[i].model ? TINY_MODEL : "",
                 k_cases[i].model ? "'" : "", k_cases[i].rest);
        int rc = run(cmd, out, err);
        CHECK(rc == 2 && !strncmp(err->p, k_cases[i].want, strlen(k_cases[i].want)),
              "lumen %s %s: rc %d, stderr starts: %.200s", k_cases[i].cmd, k_cases[i].rest, rc,
              err->p);
        /* a usage error is one line (and a pointer to --help), not the error buried above the
         * whole usage (profile's is 100 lines) */
        CHECK(!strstr(err->p, "usage:"), "lumen %s %s: the usage follows the error: %.300s",
              k_cases[i].cmd, k_cases[i].rest, err->p);
        if (strstr(k_cases[i].want, "unrecognized option") || strstr(k_cases[i].want, "required\n")) {
            char help[64];
            snprintf(help, sizeof help, "lumen %s --help", k_cases[i].cmd);
            CHECK(strstr(err->p, help) != NULL, "lumen %s %s: no pointer to --help: %.300s",
                  k_cases[i].cmd, k_cases[i].rest, err->p);
        }
    }
    /* lumen help CMD is lumen CMD --help */
    snprintf(cmd, sizeof cmd, "'%s' help run", LM_LUMEN_BIN);
    int rc = run(cmd, out, err);
    CHECK(rc == 0 && !strncmp(out->p, "usage: lumen run ", 17),
          "lumen help run: rc %d, stdout: %.100s", rc, out->p);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/lm_test_cli_XXXXXX");
    if (!mkdtemp(g_dir)) {
        fprintf(stderr, "mkdtemp failed\n");
        return 1;
    }
    struct lm_buf out = {0}, err = {0};
    run_ids_without_tokenizer(&out, &err);
    bad_device(&out, &err);
    usage_errors(&out, &err);
    template_gguf(&out, &err);
    stdin_hint(&out, &err);
    help_lists_options(&out, &err);
    docs_use_real_flags();
    for (int i = 0; i < g_n_cmds; i++)
        free(g_cmds[i].help);
    lm_buf_free(&out);
    lm_buf_free(&err);
    return cli_finish(g_dir, "test_cli");
}
