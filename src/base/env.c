/* env.c: on/off switches read from the environment (env.h). */
#include "base/env.h"

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
