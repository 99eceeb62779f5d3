/* lumen.c: the thin main. Dispatches `lumen <command> ...` to tools/cmd_<command>.c. */
#include <stdio.h>
#include <string.h>

#include "base/status.h"
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

static void usage(FILE *f) {
    fprintf(f,
            "lumen %s: a native Qwen3 serving runtime\n\n"
            "usage: lumen <command> [options]   (lumen <command> --help for its options)\n\n"
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
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) argv[1] = "version";
    for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++)
        if (!strcmp(argv[1], k_cmds[i].name)) return k_cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "lumen: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
