/* check.h: the minimal test harness shared by tests/test_*.c.
 * CHECK(cond, fmt, ...) records a failure with file:line and continues; main returns
 * check_exit() (0 when nothing failed). LM_SOURCE_DIR / LM_LUMEN_BIN come from CMake. */
#ifndef LM_TESTS_CHECK_H
#define LM_TESTS_CHECK_H

#include <stdio.h>

static int g_check_failures, g_check_count;

#define CHECK(cond, ...)                                                         \
    do {                                                                         \
        g_check_count++;                                                         \
        if (!(cond)) {                                                           \
            g_check_failures++;                                                  \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                        \
            fputc('\n', stderr);                                                 \
        }                                                                        \
    } while (0)

static inline int check_exit(const char *name) {
    fprintf(stderr, "%s: %d checks, %d failed\n", name, g_check_count, g_check_failures);
    return g_check_failures ? 1 : 0;
}

#define TEST_DATA(rel) LM_SOURCE_DIR "/tests/data/" rel
#define TINY_MODEL LM_SOURCE_DIR "/models/tiny-qwen3"

#endif
