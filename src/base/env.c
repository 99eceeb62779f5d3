/* env.c: on/off switches and integer settings read from the environment (env.h). */
#include "base/env.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

int lm_env_flag_parse(const char *s) {
    static const char *const on[] = {"1", "on", "true", "yes"}, *const off[] = {"0", "off", "false",
                                                                                "no"};
    if (!s) return -1;
    for (size_t i = 0; i < sizeof on / sizeof *on; i++) {
        if (!strcasecmp(s, on[i])) return 1;
        if (!strcasecmp(s, off[i])) return 0;
    }
    return -1;
}

bool lm_env_flag(const char *name, bool dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    int f = lm_env_flag_parse(v);
    if (f >= 0) return f;
    fprintf(stderr,
            "lumen: %s=%s is not a switch value (accepted: " LM_ENV_FLAG_VALUES
            "); using the default (%s)\n",
            name, v, dflt ? "on" : "off");
    return dflt;
}

bool lm_env_int_parse(const char *s, long lo, long hi, long *out) {
    if (!s || !*s || !((*s >= '0' && *s <= '9') || *s == '-' || *s == '+')) return false;
    char *end = NULL;
    errno = 0;
    const long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

long lm_env_int(const char *name, long dflt, long lo, long hi) {
    const char *v = getenv(name);
    long x = dflt;
    if (!v || !*v || lm_env_int_parse(v, lo, hi, &x)) return x;
    fprintf(stderr, "lumen: %s=%s is not a whole number from %ld to %ld; using the default (%ld)\n", name, v, lo,
            hi, dflt);
    return dflt;
}
