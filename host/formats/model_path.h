// model_path.h: what a -m argument names, resolved to a model directory. Every command
// that loads a model goes through model_path_resolve (session_open, `varent info`).
//
// A directory is used as it is. A GGUF file is converted once by the GGUF converter
// (host/formats/convert.h) into a cache directory named by the SHA-256 of its bytes:
// $XDG_CACHE_HOME/varent/gguf/<sha256>/ (else ~/.cache/varent/gguf/<sha256>/); its
// tokenizer and chat template come from the GGUF's metadata. The conversion writes
// <sha256>.tmp.<pid>/ and renames it into place, so a killed conversion never leaves a
// half cache (a later run removes the stale temporary directory). Weights stay f32 when
// every tensor of the GGUF is F32, else bf16. A small index (by path, inode, size and
// mtime) spares re-hashing a file that has not changed. Anything else is an error that
// says what the path is and what -m takes.
#ifndef VARENT_MODEL_PATH_H
#define VARENT_MODEL_PATH_H

#include "host/util/err.h"

typedef struct {
    char dir[4096];  // the model directory to load
    int gguf;        // 1: dir is the cache of a GGUF file
    int converted;   // 1: this call converted the GGUF (its first use)
} model_path;

// Progress of the first use of a GGUF: stage "hashing" (done/total in MiB) and then
// "converting" (in tensors). fn may draw; resolution prints nothing itself. Every
// resolution ends with a call with stage NULL (success or not), which ends any bar.
typedef struct {
    void (*fn)(void *ud, const char *stage, long done, long total);
    void *ud;
} model_path_progress;

// Resolves arg (a -m value) into out. prog may be NULL. -1 with err naming arg.
int model_path_resolve(const char *arg, const model_path_progress *prog, model_path *out, verr *err);
// The tokenizer of the tokenizer commands (tokenize, detokenize, template): arg as it is
// (a directory, a tokenizer.json or a template file), or, for a GGUF file, a temporary
// directory with the tokenizer.json and tokenizer_config.json its metadata makes (no
// tensor is read; *tmp = 1: remove it with model_path_tokenizer_done). -1 with err.
int model_path_tokenizer(const char *arg, char *out, size_t n, int *tmp, verr *err);
void model_path_tokenizer_done(const char *dir, int tmp);
// The cache root of converted GGUFs, created when absent. -1 with err.
int model_path_cache_root(char *out, size_t n, verr *err);

#endif
