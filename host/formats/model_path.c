// model_path.c: see model_path.h.
#include "host/formats/model_path.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "host/formats/convert.h"
#include "host/formats/dequant.h"
#include "host/formats/gguf.h"
#include "host/util/outfile.h"
#include "host/util/sha256.h"

#define TAKES "-m takes a Hugging Face model directory (config.json, *.safetensors, tokenizer.json) or a .gguf file"

static int mkdir_p(char *path, verr *err) {
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p) continue;
        char c = *p;
        *p = 0;
        int bad = mkdir(path, 0755) != 0 && errno != EEXIST;
        *p = c;
        if (bad) return verr_set(err, "cannot create the model cache directory %s: %s", path, strerror(errno));
        if (!c) return 0;
    }
}

int model_path_cache_root(char *out, size_t n, verr *err) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int k;
    if (xdg && xdg[0] == '/') k = snprintf(out, n, "%s/varent/gguf", xdg);  // the spec ignores relative paths
    else if (home && home[0]) k = snprintf(out, n, "%s/.cache/varent/gguf", home);
    else return verr_set(err, "no cache directory for converted GGUF files: set XDG_CACHE_HOME or HOME");
    if (k < 0 || (size_t)k >= n) return verr_set(err, "the cache directory path is too long");
    return mkdir_p(out, err);
}

// ---- what a path that is not a usable model is -------------------------------------

static const char *file_kind(const unsigned char *b, ssize_t n) {
    if (n >= 4 && !memcmp(b, "lmgg", 4)) return "an old GGML file (llama.cpp's format before GGUF)";
    if (n >= 4 && (!memcmp(b, "tjgg", 4) || !memcmp(b, "fmgg", 4) || !memcmp(b, "algg", 4)))
        return "an old GGJT/GGMF file (llama.cpp's format before GGUF)";
    if (n >= 4 && !memcmp(b, "PK\3\4", 4)) return "a zip archive (a PyTorch checkpoint?)";
    if (n >= 9 && b[8] == '{') return "a safetensors file: pass the directory that holds it and its config.json";
    if (n >= 1 && (b[0] == '{' || b[0] == '[')) return "a JSON file: pass the directory that holds it";
    return "neither a model directory nor a GGUF file";
}

// A directory without config.json that holds a .gguf names it in the message.
static int dir_without_config(const char *dir, verr *err) {
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len > 5 && !strcmp(e->d_name + len - 5, ".gguf")) {
            verr_set(err, "%s: a directory without config.json; it holds a GGUF file: use -m %s%s%s", dir, dir,
                     dir[strlen(dir) - 1] == '/' ? "" : "/", e->d_name);
            closedir(d);
            return -1;
        }
    }
    if (d) closedir(d);
    return verr_set(err, "%s: cannot open config.json: a directory without it is not a model directory (%s)", dir, TAKES);
}

// ---- the cache ----------------------------------------------------------------------

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

// Removes a flat directory (a conversion's temporary directory) and its files.
static void remove_flat_dir(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[4400];
    while (d && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    if (d) closedir(d);
    rmdir(dir);
}

// <sha>.tmp.<pid>/ of conversions whose process is gone.
static void remove_stale(const char *root, const char *sha) {
    DIR *d = opendir(root);
    struct dirent *e;
    char pre[80], p[4400];
    snprintf(pre, sizeof pre, "%s.tmp.", sha);
    while (d && (e = readdir(d))) {
        if (strncmp(e->d_name, pre, strlen(pre)) != 0) continue;
        long pid = strtol(e->d_name + strlen(pre), NULL, 10);
        if (pid > 0 && (kill((pid_t)pid, 0) == 0 || errno == EPERM)) continue;  // still converting
        snprintf(p, sizeof p, "%s/%s", root, e->d_name);
        remove_flat_dir(p);
    }
    if (d) closedir(d);
}

// The index entry of a file: the hash of what identifies this version of it.
static void index_key(const char *real, const struct stat *st, char key[65]) {
    char id[PATH_MAX + 128];
    int n = snprintf(id, sizeof id, "%s\n%llu %llu %lld %lld.%09ld", real, (unsigned long long)st->st_dev,
                     (unsigned long long)st->st_ino, (long long)st->st_size, (long long)st->st_mtim.tv_sec,
                     st->st_mtim.tv_nsec);
    sha256_ctx c;
    sha256_init(&c);
    sha256_update(&c, id, (size_t)n);
    sha256_hex(&c, key);
}

static int index_read(const char *root, const char *key, char sha[65]) {
    char p[4400];
    snprintf(p, sizeof p, "%s/index/%s", root, key);
    FILE *f = fopen(p, "r");
    if (!f) return 0;
    int ok = fscanf(f, "%64[0-9a-f]", sha) == 1 && strlen(sha) == 64;
    fclose(f);
    return ok;
}

// Best effort: a missing index entry only costs a re-hash.
static void index_write(const char *root, const char *key, const char *sha) {
    char dir[4200], p[4400], line[80];
    snprintf(dir, sizeof dir, "%s/index", root);
    mkdir(dir, 0755);
    snprintf(p, sizeof p, "%s/%s", dir, key);
    int n = snprintf(line, sizeof line, "%s\n", sha);
    verr err;
    (void)outfile_write_all(p, line, (size_t)n, &err);
}

typedef struct {
    const model_path_progress *prog;
    long total_mib;
} hash_report;

static void on_hash_chunk(void *ud, long long done) {
    hash_report *h = ud;
    h->prog->fn(h->prog->ud, "hashing", (long)(done >> 20), h->total_mib);
}

static void on_convert(void *ud, long done, long total) {
    const model_path_progress *prog = ud;
    prog->fn(prog->ud, "converting", done, total);
}

// f32 when every tensor is F32 (nothing to gain from bf16 but loss), else bf16.
static int all_f32(const char *path, int *f32, verr *err) {
    gguf_file *g = gguf_open(path, err);
    if (!g) return -1;
    *f32 = g->n_tensors > 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) *f32 &= g->tensors[i].type == GGML_F32;
    gguf_close(g);
    return 0;
}

static int convert_into(const char *gguf, const char *root, const char *sha, const model_path_progress *prog,
                        model_path *out, verr *err) {
    int f32;
    if (all_f32(gguf, &f32, err)) return -1;
    remove_stale(root, sha);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s/%s.tmp.%ld", root, sha, (long)getpid());
    convert_progress cp = { prog && prog->fn ? on_convert : NULL, (void *)prog };
    convert_summary sum = { 0 };
    if (convert_gguf(gguf, tmp, f32, &cp, &sum, err)) {
        remove_flat_dir(tmp);
        return -1;
    }
    if (rename(tmp, out->dir) != 0) {
        int e = errno;
        remove_flat_dir(tmp);
        char cfg[4400];  // another process finished first: its copy is as good
        snprintf(cfg, sizeof cfg, "%s/config.json", out->dir);
        if (!is_file(cfg)) return verr_set(err, "%s: cannot move the converted model into place: %s", out->dir, strerror(e));
    }
    out->converted = 1;
    return 0;
}

#define RESOLVE_WAIT 1  // resolve_locked: another process writes the entry; ask again

// The cache entry of a GGUF: from the index, else hashed, then converted when absent. A
// process whose writes are discarded (an MPI rank other than 0) converts nothing: its
// files would go to /dev/null and leave an empty entry that the others take for done.
// It waits for rank 0's entry instead (RESOLVE_WAIT), hashing nothing meanwhile.
static int resolve_locked(const char *arg, const struct stat *st, const model_path_progress *prog, const char *root,
                          const char *key, model_path *out, verr *err) {
    char sha[65], cfg[4400];
    if (!index_read(root, key, sha)) {
        if (outfile_discarding()) return RESOLVE_WAIT;
        hash_report h = { prog, (long)(st->st_size >> 20) };
        if (sha256_file(arg, sha, prog && prog->fn ? on_hash_chunk : NULL, &h, err)) return -1;
    }
    out->gguf = 1;
    snprintf(out->dir, sizeof out->dir, "%s/%s", root, sha);
    snprintf(cfg, sizeof cfg, "%s/config.json", out->dir);
    if (!is_file(cfg)) {
        if (outfile_discarding()) return RESOLVE_WAIT;
        verr why = { { 0 } };
        if (convert_into(arg, root, sha, prog, out, &why)) return verr_set(err, "-m %s: %s", arg, why.msg);
    }
    index_write(root, key, sha);
    return 0;
}

// An exclusive lock on this version of the file for the time of its resolution, so that
// processes resolving it at once (the ranks of an MPI launch, parallel runs) hash and
// convert it once: the others wait and then find it in the index. -1: no lock (a
// filesystem without flock): they each resolve it, as before.
static int lock_key(const char *root, const char *key) {
    char p[4200];
    snprintf(p, sizeof p, "%s/index/%s.lock", root, key);
    char dir[4000];
    snprintf(dir, sizeof dir, "%s/index", root);
    mkdir(dir, 0755);
    int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0 && flock(fd, LOCK_EX) != 0) close(fd), fd = -1;
    return fd;
}

static int resolve_gguf(const char *arg, const struct stat *st, const model_path_progress *prog, model_path *out,
                        verr *err) {
    char root[3900], real[PATH_MAX], key[65];
    if (model_path_cache_root(root, sizeof root, err)) return -1;
    if (!realpath(arg, real)) return verr_set(err, "%s: %s", arg, strerror(errno));
    index_key(real, st, key);
    for (;;) {
        int lock = lock_key(root, key);
        int rc = resolve_locked(arg, st, prog, root, key, out, err);
        if (lock >= 0) close(lock);  // closing releases the lock
        if (rc != RESOLVE_WAIT) return rc;
        // rank 0 hashes and converts it; if it fails, the launch ends this process too
        struct timespec ts = { 0, 100000000L };
        nanosleep(&ts, NULL);
    }
}

static int resolve(const char *arg, const model_path_progress *prog, model_path *out, verr *err) {
    struct stat st;
    if (!arg || !arg[0]) return verr_set(err, "empty model path (%s)", TAKES);
    if (stat(arg, &st) != 0)
        return errno == ENOENT ? verr_set(err, "%s: does not exist (%s)", arg, TAKES)
                               : verr_set(err, "%s: %s (%s)", arg, strerror(errno), TAKES);
    if (S_ISDIR(st.st_mode)) {
        char cfg[4400];
        snprintf(cfg, sizeof cfg, "%s/config.json", arg);
        if (access(cfg, F_OK) != 0) return dir_without_config(arg, err);
        if (snprintf(out->dir, sizeof out->dir, "%s", arg) >= (int)sizeof out->dir) return verr_set(err, "%s: path too long", arg);
        return 0;
    }
    if (!S_ISREG(st.st_mode)) return verr_set(err, "%s: not a regular file or directory (%s)", arg, TAKES);
    unsigned char head[16];
    int fd = open(arg, O_RDONLY | O_NONBLOCK);
    if (fd < 0) return verr_set(err, "%s: cannot open: %s", arg, strerror(errno));
    ssize_t n = read(fd, head, sizeof head);
    close(fd);
    if (n < 0) return verr_set(err, "%s: cannot read: %s", arg, strerror(errno));
    if (n >= 4 && !memcmp(head, "GGUF", 4)) return resolve_gguf(arg, &st, prog, out, err);
    return verr_set(err, "%s: %s (%s)", arg, file_kind(head, n), TAKES);
}

int model_path_resolve(const char *arg, const model_path_progress *prog, model_path *out, verr *err) {
    memset(out, 0, sizeof *out);
    int rc = resolve(arg, prog, out, err);
    if (prog && prog->fn) prog->fn(prog->ud, NULL, 0, 0);  // over, on every path: a bar drawn for a stage ends
    return rc;
}

// ---- the tokenizer of a GGUF ---------------------------------------------------------

static int is_gguf_file(const char *path) {
    struct stat st;
    unsigned char head[4];
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return 0;
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) return 0;
    ssize_t n = read(fd, head, sizeof head);
    close(fd);
    return n == 4 && !memcmp(head, "GGUF", 4);
}

int model_path_tokenizer(const char *arg, char *out, size_t n, int *tmp, verr *err) {
    *tmp = 0;
    if (!is_gguf_file(arg)) {
        if (snprintf(out, n, "%s", arg) >= (int)n) return verr_set(err, "%s: path too long", arg);
        return 0;
    }
    const char *t = getenv("TMPDIR");
    if (snprintf(out, n, "%s/varent-tokenizer-XXXXXX", t && t[0] ? t : "/tmp") >= (int)n || !mkdtemp(out))
        return verr_set(err, "%s: cannot make a temporary directory for its tokenizer: %s", arg, strerror(errno));
    *tmp = 1;
    verr why = { { 0 } };
    int r = convert_gguf_tokenizer(arg, out, &why);
    if (r == 1) return 0;
    model_path_tokenizer_done(out, 1);
    *tmp = 0;
    if (r == 0) return verr_set(err, "%s: the GGUF has no byte-level BPE vocabulary (tokenizer.ggml.model gpt2), so no "
                                     "tokenizer", arg);
    return verr_set(err, "-m %s: %s", arg, why.msg);
}

void model_path_tokenizer_done(const char *dir, int tmp) {
    if (tmp) remove_flat_dir(dir);
}
