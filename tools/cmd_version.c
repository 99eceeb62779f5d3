/* cmd_version.c: `lumen version`. */
#include <stdio.h>
#include <string.h>

int lm_cmd_version(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: lumen version\n\nPrints the lumen version.\n");
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "lumen version: unexpected argument '%s'\n", argv[1]);
        return 2;
    }
    printf("lumen %s\n", LM_VERSION);
    return 0;
}
