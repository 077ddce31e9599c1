// model_dir.h: writes a converted model directory (config.json, model.safetensors,
// tokenizer files). Everything is built in memory by the caller; every file is then
// written to its temporary file (host/util/outfile.h), and only when all of them were
// written and synced are they renamed into place. A failure before that changes
// nothing in DIR (a directory this call created is removed again).
#ifndef VARENT_MODEL_DIR_H
#define VARENT_MODEL_DIR_H

#include "host/formats/st_write.h"
#include "host/util/err.h"

typedef struct {
    const char *name;  // file name inside the directory
    const char *text;  // its contents (NUL-terminated); NULL: not written
} model_dir_file;

// Writes files[0..n) and, when w is not NULL, model.safetensors into dir.
int model_dir_write(const char *dir, const model_dir_file *files, int n, st_writer *w, verr *err);

#endif
