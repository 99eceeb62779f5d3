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

    lm_ids_free(&ids);
    lm_ids_free(&got);
    lm_buf_free(&b);
    return check_exit("test_base");
}
