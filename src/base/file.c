/* file.c: see file.h. */
#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

lm_status lm_file_map_open(struct lm_file_map *m, const char *path) {
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return lm_errorf(LM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return lm_errorf(LM_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return lm_errorf(LM_ERR_IO, "%s: not a regular file", path);
    }
    m->size = (size_t)st.st_size;
    if (m->size) {
        void *p = mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return lm_errorf(LM_ERR_IO, "%s: cannot map %zu bytes: %s", path, m->size, strerror(e));
        }
        m->data = p;
    }
    close(fd);
    m->path = strdup(path);
    return LM_OK;
}

void lm_file_map_close(struct lm_file_map *m) {
    if (!m) return;
    if (m->data) munmap((void *)m->data, m->size);
    free(m->path);
    memset(m, 0, sizeof *m);
}

lm_status lm_file_read(const char *path, struct lm_buf *out) {
    bool is_stdin = strcmp(path, "-") == 0;
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    if (!f) return lm_errorf(LM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) lm_buf_append(out, chunk, n);
    int err = ferror(f);
    if (!is_stdin) fclose(f);
    if (err) return lm_errorf(LM_ERR_IO, "%s: read error", path);
    if (!out->p) lm_buf_reserve(out, 0), out->p[0] = 0;
    return LM_OK;
}

lm_status lm_file_write(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return lm_errorf(LM_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    size_t w = fwrite(data, 1, n, f);
    int bad = (w != n) | (fclose(f) != 0);
    if (bad) return lm_errorf(LM_ERR_IO, "%s: write failed", path);
    return LM_OK;
}

bool lm_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

bool lm_dir_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

char *lm_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) abort();
    memcpy(p, dir, a);
    size_t o = a;
    if (a && dir[a - 1] != '/') p[o++] = '/';
    memcpy(p + o, name, b + 1);
    return p;
}
