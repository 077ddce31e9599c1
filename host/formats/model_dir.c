// model_dir.c: see model_dir.h.
#include "host/formats/model_dir.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host/util/outfile.h"

#define MODEL_DIR_MAX 8

// Creates dir when absent (*created = 1); an existing non-directory is an error.
static int make_dir(const char *dir, int *created, verr *err) {
    struct stat st;
    *created = 0;
    if (stat(dir, &st) == 0) return S_ISDIR(st.st_mode) ? 0 : verr_set(err, "%s: exists and is not a directory", dir);
    if (mkdir(dir, 0755) != 0) return verr_set(err, "%s: cannot create directory: %s", dir, strerror(errno));
    *created = 1;
    return 0;
}

static int write_one(outfile *o, const char *dir, const char *name, const char *text, st_writer *w, verr *err) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path) return verr_set(err, "%s: path too long", dir);
    if (outfile_open(o, path, NULL, err)) return -1;
    if (w) return st_writer_write(w, o->f, path, err);
    size_t n = strlen(text);
    if (fwrite(text, 1, n, o->f) != n) return verr_set(err, "%s: write failed: %s", path, strerror(errno));
    return 0;
}

int model_dir_write(const char *dir, const model_dir_file *files, int n, st_writer *w, verr *err) {
    if (n + 1 > MODEL_DIR_MAX) return verr_set(err, "model_dir_write: %d files is too many", n);
    int created, rc = make_dir(dir, &created, err), opened = 0;
    outfile out[MODEL_DIR_MAX];
    memset(out, 0, sizeof out);
    if (rc == 0 && w) rc = write_one(&out[opened++], dir, "model.safetensors", NULL, w, err);
    for (int i = 0; rc == 0 && i < n; i++)
        if (files[i].text) rc = write_one(&out[opened++], dir, files[i].name, files[i].text, NULL, err);
    // every file is whole on disk before the first rename
    for (int i = 0; rc == 0 && i < opened; i++) rc = outfile_sync(&out[i], err);
    for (int i = 0; rc == 0 && i < opened; i++) rc = outfile_commit(&out[i], err);
    for (int i = 0; i < opened; i++) outfile_abort(&out[i]);
    if (rc && created) rmdir(dir);  // only succeeds when nothing of ours is left in it
    return rc;
}
