/* test_base.c: buffers, id vectors, status messages, JSON id arrays, environment switches.
 * LM_LINK: lm_base */
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/env.h"
#include "base/json.h"
#include "base/status.h"
#include "check.h"

int main(void) {
    struct lm_buf b = {0};
    for (int i = 0; i < 1000; i++) lm_buf_printf(&b, "%d,", i);
    CHECK(b.len == 3890, "len %zu", b.len);
    CHECK(!strncmp(b.p, "0,1,2,", 6) && !strcmp(b.p + b.len - 4, "999,"), "content");
    lm_buf_free(&b);

    struct lm_ids ids = {0};
    for (int i = 0; i < 100; i++) lm_ids_push(&ids, i * 7);
    CHECK(ids.n == 100 && ids.v[99] == 693, "ids");
    lm_buf_reset(&b);
    lm_ids_to_json(ids.v, 3, &b);
    CHECK(!strcmp(b.p, "[0,7,14]"), "json ids %s", b.p);
    json_t *arr = json_loads("[1, 2, \"x\"]", 0, NULL);
    struct lm_ids got = {0};
    lm_status st = lm_json_to_ids(arr, "prompt", &got);
    CHECK(st == LM_ERR_INVALID && strstr(lm_error_message(), "prompt[2]"), "bad id message: %s",
          lm_error_message());
    json_decref(arr);

    lm_errorf(LM_ERR_IO, "inner %d", 5);
    lm_error_prefix(LM_ERR_IO, "outer");
    CHECK(!strcmp(lm_error_message(), "outer: inner 5"), "prefix: %s", lm_error_message());

    /* Environment switches: one spelling for every LM_* on/off variable (base/env.h). */
    static const char *const on[] = {"1", "on", "ON", "true", "True", "yes", "YES"};
    static const char *const off[] = {"0", "off", "Off", "false", "FALSE", "no", "No"};
    static const char *const bad[] = {"", "2", "of", "enable", " 1", "1 ", "-1", "y"};
    for (size_t i = 0; i < sizeof on / sizeof *on; i++) CHECK(lm_env_flag_parse(on[i]) == 1, "'%s' is on", on[i]);
    for (size_t i = 0; i < sizeof off / sizeof *off; i++)
        CHECK(lm_env_flag_parse(off[i]) == 0, "'%s' is off", off[i]);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(lm_env_flag_parse(bad[i]) == -1, "'%s' is not a switch value", bad[i]);
    CHECK(lm_env_flag_parse(NULL) == -1, "NULL");
    unsetenv("LM_TEST_SWITCH");
    CHECK(lm_env_flag("LM_TEST_SWITCH", true) && !lm_env_flag("LM_TEST_SWITCH", false), "unset keeps the default");
    setenv("LM_TEST_SWITCH", "off", 1);
    CHECK(!lm_env_flag("LM_TEST_SWITCH", true), "off turns a default-on switch off");
    setenv("LM_TEST_SWITCH", "Yes", 1);
    CHECK(lm_env_flag("LM_TEST_SWITCH", false), "Yes turns a default-off switch on");
    setenv("LM_TEST_SWITCH", "false-ish", 1); /* warns on stderr */
    CHECK(lm_env_flag("LM_TEST_SWITCH", true) && !lm_env_flag("LM_TEST_SWITCH", false),
          "an unknown value keeps the default (not 'on')");
    unsetenv("LM_TEST_SWITCH");

    /* Integer settings (LM_CUDA_FLASH_MIN, ...): a typo keeps the default, never reads as 0. */
    long x = -7;
    CHECK(lm_env_int_parse("12", 0, 100, &x) && x == 12, "12 in [0, 100]: %ld", x);
    CHECK(lm_env_int_parse("0", 0, 100, &x) && x == 0, "0 in [0, 100]");
    CHECK(lm_env_int_parse("-3", -5, 5, &x) && x == -3, "-3 in [-5, 5]");
    static const char *const bad_int[] = {"", "four", "4x", " 4", "4 ", "101", "-1", "0x10", "1e2", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad_int / sizeof *bad_int; i++) {
        x = -7;
        CHECK(!lm_env_int_parse(bad_int[i], 0, 100, &x) && x == -7, "'%s' is not a whole number in [0, 100]",
              bad_int[i]);
    }
    CHECK(!lm_env_int_parse(NULL, 0, 100, &x), "NULL");
    unsetenv("LM_TEST_INT");
    CHECK(lm_env_int("LM_TEST_INT", 4, 0, 64) == 4, "unset keeps the default");
    setenv("LM_TEST_INT", "0", 1);
    CHECK(lm_env_int("LM_TEST_INT", 4, 0, 64) == 0, "0 is a value (it turns a feature off)");
    setenv("LM_TEST_INT", "four", 1); /* warns on stderr */
    CHECK(lm_env_int("LM_TEST_INT", 4, 0, 64) == 4, "a typo keeps the default (atoi would read 0)");
    setenv("LM_TEST_INT", "65", 1); /* warns on stderr */
    CHECK(lm_env_int("LM_TEST_INT", 4, 0, 64) == 4, "out of range keeps the default");
    unsetenv("LM_TEST_INT");

    lm_ids_free(&ids);
    lm_ids_free(&got);
    lm_buf_free(&b);
    return check_exit("test_base");
}
