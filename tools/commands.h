/* commands.h: the subcommands of the `lumen` CLI. Each lives in tools/cmd_<name>.c, parses its
 * own flags (getopt_long, with --help), and returns the process exit status: 0 success,
 * 1 runtime failure (message on stderr), 2 usage error. Only tools/ exits or prints usage. */
#ifndef LM_TOOLS_COMMANDS_H
#define LM_TOOLS_COMMANDS_H

typedef int (*lm_cmd_fn)(int argc, char **argv);

struct lm_cmd {
    const char *name;
    lm_cmd_fn fn;
    const char *summary; /* one line for `lumen --help` */
};

/* Prints "lumen <cmd>: <message>" to stderr with the thread's last error and returns 1. */
int lm_cmd_fail(const char *cmd, const char *what);

#endif
