/* lumen.c: the thin main. Dispatches `lumen <command> ...` to tools/cmd_<command>.c. */
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "base/status.h"
#include "family/model.h"
#include "commands.h"

/* Declarations of the command entry points (defined in tools/cmd_*.c). */
#define LM_CMD(name, summary) int lm_cmd_##name(int argc, char **argv);
#include "commands.def"
#undef LM_CMD

static const struct lm_cmd k_cmds[] = {
#define LM_CMD(name, summary) {#name, lm_cmd_##name, summary},
#include "commands.def"
#undef LM_CMD
};

int lm_cmd_fail(const char *cmd, const char *what) {
    const char *msg = lm_error_message();
    if (what && *what)
        fprintf(stderr, "lumen %s: %s%s%s\n", cmd, what, *msg ? ": " : "", msg);
    else
        fprintf(stderr, "lumen %s: %s\n", cmd, *msg ? msg : "failed");
    return 1;
}

void lm_cmd_stdin_hint(const char *cmd, const char *what) {
    if (isatty(STDIN_FILENO))
        fprintf(stderr, "lumen %s: reading %s from stdin (end it with Ctrl-D)\n", cmd, what);
}

const char *lm_cmd_unexpected(const char *arg) {
    static char msg[256];
    snprintf(msg, sizeof msg, "unexpected argument '%s'", arg);
    return msg;
}

int lm_cmd_usage_error(const char *cmd) {
    fprintf(stderr, "(lumen %s --help lists the options)\n", cmd);
    return 2;
}

bool lm_cmd_device_ok(const char *cmd, const char *value) {
    if (!strcmp(value, "cpu") || !strcmp(value, "cuda")) return true;
    if (!strncmp(value, "cuda:", 5)) {
        const char *n = value + 5;
        size_t digits = strspn(n, "0123456789");
        if (digits && digits <= 4 && !n[digits] && atoi(n) <= 1023) return true;
    }
    fprintf(stderr, "lumen %s: --device takes cpu, cuda or cuda:N (N a GPU index), not '%s'\n", cmd,
            value);
    return false;
}

bool lm_cmd_lacks_tokenizer(const char *model, const char *tok_dir) {
    if (tok_dir || !lm_dir_exists(model)) return false;
    char *path = lm_path_join(model, "tokenizer.json");
    bool lacks = !lm_file_exists(path);
    free(path);
    if (lacks) lm_model_missing_tokenizer(model);
    return lacks;
}

char *lm_cmd_find_rel(const char *rel, bool dir) {
    if (dir ? lm_dir_exists(rel) : lm_file_exists(rel)) return strdup(rel);
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return NULL;
    exe[n] = 0;
    char *d = dirname(exe);
    const char *ups[] = {"..", "."};
    for (size_t i = 0; i < 2; i++) {
        char path[PATH_MAX * 2];
        snprintf(path, sizeof path, "%s/%s/%s", d, ups[i], rel);
        if (dir ? lm_dir_exists(path) : lm_file_exists(path)) return strdup(path);
    }
    return NULL;
}

static void usage(FILE *f) {
    fprintf(f,
            "lumen %s: a native Qwen3 serving runtime\n\n"
            "usage: lumen <command> [options]   (lumen <command> --help, or lumen help <command>,\n"
            "                                    for its options)\n\n"
            "commands:\n",
            LM_VERSION);
    for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++)
        fprintf(f, "  %-12s %s\n", k_cmds[i].name, k_cmds[i].summary);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    char help_flag[] = "--help";
    char *help_argv[] = {argv[0], argc == 3 ? argv[2] : NULL, help_flag, NULL};
    if (!strcmp(argv[1], "help") && argc == 3) { /* lumen help CMD: lumen CMD --help */
        argv = help_argv;
    } else if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) argv[1] = "version";
    for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++)
        if (!strcmp(argv[1], k_cmds[i].name)) {
            /* the command's argv[0], which getopt's own messages start with */
            char prog[64];
            snprintf(prog, sizeof prog, "lumen %s", k_cmds[i].name);
            argv[1] = prog;
            return k_cmds[i].fn(argc - 1, argv + 1);
        }
    fprintf(stderr, "lumen: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
