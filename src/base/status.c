/* status.c: see status.h. */
#include "base/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char g_msg[2048];

lm_status lm_errorf(lm_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_msg, sizeof g_msg, fmt, ap);
    va_end(ap);
    return st;
}

lm_status lm_error_prefix(lm_status st, const char *fmt, ...) {
    char prefix[512], old[sizeof g_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, g_msg, sizeof old);
    size_t n = strlen(prefix);
    if (n > sizeof g_msg - 3) n = sizeof g_msg - 3;
    memcpy(g_msg, prefix, n);
    memcpy(g_msg + n, ": ", 2);
    size_t m = strnlen(old, sizeof g_msg - n - 3);
    memcpy(g_msg + n + 2, old, m);
    g_msg[n + 2 + m] = 0;
    return st;
}

const char *lm_error_message(void) { return g_msg; }

const char *lm_status_name(lm_status st) {
    switch (st) {
    case LM_OK: return "ok";
    case LM_ERR_IO: return "io";
    case LM_ERR_FORMAT: return "format";
    case LM_ERR_SHAPE: return "shape";
    case LM_ERR_MISSING: return "missing";
    case LM_ERR_UNSUPPORTED: return "unsupported";
    case LM_ERR_INVALID: return "invalid";
    case LM_ERR_RANGE: return "range";
    case LM_ERR_NOMEM: return "nomem";
    case LM_ERR_CANCELLED: return "cancelled";
    }
    return "unknown";
}
