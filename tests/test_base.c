/* test_base.c: buffers, id vectors, status messages, JSON id arrays.
 * LM_LINK: lm_base */
#include <string.h>

#include "base/buf.h"
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

    lm_ids_free(&ids);
    lm_ids_free(&got);
    lm_buf_free(&b);
    return check_exit("test_base");
}
