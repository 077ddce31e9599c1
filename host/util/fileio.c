// fileio.c: see fileio.h.
#include "host/util/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *file_kind(mode_t m) {
    return S_ISFIFO(m) ? "a FIFO" : S_ISDIR(m) ? "a directory" : S_ISCHR(m) ? "a character device"
         : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "not a file";
}

static int not_regular(const char *path, mode_t m, verr *err) {
    return verr_set(err, "%s: is %s, not a regular file (inputs are read from regular files; use - for stdin "
                    "where a stream is meant)", path, file_kind(m));
}

int fileio_open_input(const char *path, verr *err) {
    struct stat sb;
    if (stat(path, &sb) != 0) return verr_set(err, "%s: cannot open: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode)) return not_regular(path, sb.st_mode, err);
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return verr_set(err, "%s: cannot open: %s", path, strerror(errno));
    int flags = fcntl(fd, F_GETFL);
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        return S_ISREG(sb.st_mode) ? verr_set(err, "%s: cannot open: %s", path, strerror(e))
                                   : not_regular(path, sb.st_mode, err);
    }
    return fd;
}

FILE *fileio_fopen_input(const char *path, verr *err) {
    int fd = fileio_open_input(path, err);
    if (fd < 0) return NULL;
    FILE *fp = fdopen(fd, "rb");
    if (!fp) {
        verr_set(err, "%s: cannot open: %s", path, strerror(errno));
        close(fd);
    }
    return fp;
}

char *fileio_read_stream(FILE *fp, const char *what, size_t *len, verr *err) {
    size_t n = 0, cap = 4096;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, fp);
        n += got;
        if (got == 0) break;
    }
    if (!buf) {
        verr_set(err, "%s: out of memory", what);
        return NULL;
    }
    if (ferror(fp)) {
        free(buf);
        verr_set(err, "%s: read error: %s", what, strerror(errno));
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

char *fileio_read_all(const char *path, verr *err) {
    FILE *fp = strcmp(path, "-") ? fileio_fopen_input(path, err) : stdin;
    if (!fp) return NULL;
    size_t n = 0;
    char *buf = fileio_read_stream(fp, path, &n, err);
    if (fp != stdin) fclose(fp);
    size_t text = buf ? strlen(buf) : n;
    if (text < n) {  // every reader takes it as a C string: the rest would be lost, silently
        int line = 1;
        for (size_t i = 0; i < text; i++) line += buf[i] == '\n';
        verr_set(err, "%s: holds a NUL byte at line %d (byte %zu): not a text file", path, line, text);
        free(buf);
        return NULL;
    }
    return buf;
}
