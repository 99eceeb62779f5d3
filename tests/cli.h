/* cli.h: running the built `lumen` CLI the way a user does (through the shell), for the tests of
 * tools/ (tests/test_perf.c, tests/test_cli.c). */
#ifndef LM_TESTS_CLI_H
#define LM_TESTS_CLI_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "base/buf.h"
#include "check.h"

/* Runs `cmd` through the shell with stdout into *out and stderr into *err (both replaced, and
 * NUL-terminated); `dir` is a scratch folder for the stderr file. Returns the exit status (-1
 * when it did not exit). */
static int cli_run(const char *dir, const char *cmd, struct lm_buf *out, struct lm_buf *err) {
    char full[2048], errpath[128], line[4096];
    snprintf(errpath, sizeof errpath, "%s/stderr.txt", dir);
    snprintf(full, sizeof full, "%s 2>'%s'", cmd, errpath);
    lm_buf_reset(out);
    lm_buf_reset(err);
    FILE *p = popen(full, "r");
    if (!p) return -1;
    size_t k;
    while ((k = fread(line, 1, sizeof line, p)) > 0)
        lm_buf_append(out, line, k);
    int status = pclose(p);
    FILE *f = fopen(errpath, "r");
    while (f && (k = fread(line, 1, sizeof line, f)) > 0)
        lm_buf_append(err, line, k);
    if (f) fclose(f);
    lm_buf_puts(out, "");
    lm_buf_puts(err, "");
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The test's exit status (check_exit); its scratch folder `dir` is removed when every check
 * passed, else kept (and named) for a look. */
static int cli_finish(const char *dir, const char *name) {
    char cmd[128];
    if (!g_check_failures) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
    } else {
        fprintf(stderr, "files kept in %s\n", dir);
    }
    return check_exit(name);
}

#endif
