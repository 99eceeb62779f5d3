/* file.h: whole-file reads, read-only file maps, and path helpers.
 *
 * lm_file_map maps a file read-only (MAP_PRIVATE). Weight loaders that keep pointers into the map
 * must keep the struct alive for as long as the pointers are used. */
#ifndef LM_BASE_FILE_H
#define LM_BASE_FILE_H

#include <stdbool.h>
#include <stddef.h>

#include "base/buf.h"
#include "base/status.h"

struct lm_file_map {
    const unsigned char *data; /* the file's bytes, or NULL for an empty file */
    size_t size;               /* bytes */
    char *path;                /* owned copy of the path, for messages */
};

/* Maps `path` read-only. LM_ERR_IO (message names the path and errno) when it cannot. */
lm_status lm_file_map_open(struct lm_file_map *m, const char *path);
/* Unmaps; accepts a zeroed struct. */
void lm_file_map_close(struct lm_file_map *m);

/* Reads a whole file (or "-" for stdin) into `out` (appended). LM_ERR_IO on failure. */
lm_status lm_file_read(const char *path, struct lm_buf *out);

/* Writes `n` bytes to `path`, replacing it. LM_ERR_IO on failure. */
lm_status lm_file_write(const char *path, const void *data, size_t n);

bool lm_file_exists(const char *path);
bool lm_dir_exists(const char *path);

/* Returns "dir/name" in a malloc'd string (caller frees). */
char *lm_path_join(const char *dir, const char *name);

#endif
