/* commands.h: the subcommands of the `lumen` CLI. Each lives in tools/cmd_<name>.c, parses its
 * own flags (getopt_long, with --help), and returns the process exit status: 0 success,
 * 1 runtime failure (message on stderr), 2 usage error. Only tools/ exits or prints usage. */
#ifndef LM_TOOLS_COMMANDS_H
#define LM_TOOLS_COMMANDS_H

#include <stdbool.h>

typedef int (*lm_cmd_fn)(int argc, char **argv);

struct lm_cmd {
    const char *name;
    lm_cmd_fn fn;
    const char *summary; /* one line for `lumen --help` */
};

/* Prints "lumen <cmd>: <message>" to stderr with the thread's last error and returns 1. */
int lm_cmd_fail(const char *cmd, const char *what);
/* After getopt's own line about a bad option ("lumen <cmd>: unrecognized option ..."): points
 * to --help on stderr instead of burying that line under the whole usage; returns 2. */
int lm_cmd_usage_error(const char *cmd);
/* When stdin is a terminal, says on stderr that the command now reads `what` from it (so that a
 * command waiting for input does not look hung). */
void lm_cmd_stdin_hint(const char *cmd, const char *what);
/* "unexpected argument '<arg>'", for a command's usage error about a left-over argument.
 * Valid until the next call. */
const char *lm_cmd_unexpected(const char *arg);
/* Checks a --device value: cpu, cuda or cuda:N (N a GPU index, 0..1023), what
 * lm_model_open_params.device takes. Another value is a usage error: prints "lumen <cmd>:
 * --device takes cpu, cuda or cuda:N ..., not '<value>'" to stderr and returns false (the caller
 * exits with 2). Whether the device exists is lm_model_open's to say. */
bool lm_cmd_device_ok(const char *cmd, const char *value);
/* True when no --tokenizer was given (`tok_dir` NULL) and `model` is a folder without
 * tokenizer.json; then the thread's error is lm_model_open's (lm_model_missing_tokenizer), for
 * lm_cmd_fail. */
bool lm_cmd_lacks_tokenizer(const char *model, const char *tok_dir);
/* Parses "true"/"false" (also 1/0), as --enable-thinking takes them. Returns -1 when neither.
 * (cmd_template.c) */
int lm_cmd_parse_bool(const char *s);
struct lm_tokenizer;
/* Loads DIR/tokenizer.json (DIR = --tokenizer if given, else --model), or, when --model is a
 * GGUF file and no --tokenizer is given, the tokenizer in its tokenizer.ggml.* metadata. Returns
 * 0, or 1 after lm_cmd_fail's line. (cmd_tokenize.c) */
int lm_cmd_load_tokenizer(const char *cmd, const char *model_dir, const char *tok_dir,
                          struct lm_tokenizer **out);
/* The path of `rel` (a folder when dir, else a file): as given when it exists from the current
 * folder, else next to the lumen binary or one folder up (build/lumen in a checkout); NULL when
 * none exists. Caller frees. */
char *lm_cmd_find_rel(const char *rel, bool dir);

#endif
