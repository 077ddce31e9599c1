// replay_main.c: a main() for the fuzz targets without libFuzzer, so the normal
// (and sanitizer) builds can replay seeds and saved crash inputs through them.
// usage: fuzz_T FILE_OR_DIR...   (directories: every regular file in them)
// Prints "replayed N inputs"; a failing input crashes the process (as under libFuzzer).
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int replay_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            uint8_t *g = realloc(buf, cap *= 2);
            if (!g) free(buf);
            buf = g;
        }
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "%s: out of memory\n", path);
        return -1;
    }
    // An exact-size copy, so a read past the end is caught by AddressSanitizer.
    uint8_t *exact = malloc(n ? n : 1);
    if (exact) memcpy(exact, buf, n);
    free(buf);
    if (!exact) return -1;
    if (getenv("REPLAY_VERBOSE")) fprintf(stderr, "replay %s\n", path);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// Every regular file in dir, in name order (a stable replay order).
static int replay_dir(const char *dir, int *count) {
    DIR *d = opendir(dir);
    if (!d) {
        perror(dir);
        return -1;
    }
    char **names = NULL;
    size_t n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char **g = realloc(names, (n + 1) * sizeof *names);
        if (!g) break;
        names = g;
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_str);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (names[i] && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
            if (replay_file(path) == 0) (*count)++;
            else rc = -1;
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv) {
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    int count = 0, rc = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            perror(argv[i]);
            rc = 1;
        } else if (S_ISDIR(st.st_mode)) {
            if (replay_dir(argv[i], &count)) rc = 1;
        } else if (replay_file(argv[i]) == 0) {
            count++;
        } else {
            rc = 1;
        }
    }
    printf("replayed %d inputs\n", count);
    return rc;
}
