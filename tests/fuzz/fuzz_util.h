// fuzz_util.h: helpers shared by the libFuzzer targets in tests/fuzz/. The loaders
// under test take paths, so each input is written to a per-process scratch
// directory (on /dev/shm when there is one) before the loader opens it.
// FUZZ_CHECK traps on a broken invariant, which libFuzzer reports as a crash.
#ifndef VARENT_FUZZ_UTIL_H
#define VARENT_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FUZZ_CHECK(cond)                                                     \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond); \
            __builtin_trap();                                                \
        }                                                                    \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char fuzz_dir_[256];

static inline void fuzz_cleanup_(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fuzz_dir_);
    if (fuzz_dir_[0] && system(cmd) != 0) fprintf(stderr, "fuzz: could not remove %s\n", fuzz_dir_);
}

// The scratch directory, created on first use and removed at exit.
static inline const char *fuzz_dir(void) {
    if (!fuzz_dir_[0]) {
        const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        snprintf(fuzz_dir_, sizeof fuzz_dir_, "%s/varent-fuzz-%d", base, (int)getpid());
        if (mkdir(fuzz_dir_, 0700) != 0) {
            perror(fuzz_dir_);
            abort();
        }
        atexit(fuzz_cleanup_);
    }
    return fuzz_dir_;
}

// Writes bytes to NAME in the scratch directory; returns the path (static storage,
// one slot per call site is enough: each target writes a handful of names).
static inline const char *fuzz_file(const char *name, const void *data, size_t size) {
    static char paths[8][512];
    static int next;
    char *path = paths[next++ % 8];
    snprintf(path, 512, "%s/%s", fuzz_dir(), name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) {
        perror(path);
        abort();
    }
    return path;
}

static inline void fuzz_remove(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", fuzz_dir(), name);
    unlink(path);
}

// Splits [data, data+size) at the first occurrence of sep: *tail (or NULL) is what follows.
static inline size_t fuzz_split(const uint8_t *data, size_t size, const char *sep, const uint8_t **tail, size_t *tail_len) {
    size_t n = strlen(sep);
    for (size_t i = 0; i + n <= size; i++) {
        if (memcmp(data + i, sep, n) == 0) {
            *tail = data + i + n;
            *tail_len = size - i - n;
            return i;
        }
    }
    *tail = NULL;
    *tail_len = 0;
    return size;
}

#endif
