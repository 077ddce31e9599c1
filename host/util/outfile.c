// outfile.c: see outfile.h.
#include "host/util/outfile.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host/util/interrupt.h"

#define MAX_LINKS 40  // as the kernel's ELOOP limit

static int fail(outfile *o, verr *err, const char *what, int e) {
    return verr_set(err, "%s: %s: %s", o->shown, what, strerror(e));
}

// Follows symlinks from path to the file they name (which need not exist yet); the
// result goes to out. -1 with errno on a loop or a name too long.
static int resolve(const char *path, char *out, size_t cap) {
    char cur[4096], link[4096];
    if (snprintf(cur, sizeof cur, "%s", path) >= (int)sizeof cur) return errno = ENAMETOOLONG, -1;
    for (int hops = 0; hops <= MAX_LINKS; hops++) {
        struct stat st;
        if (lstat(cur, &st) != 0 || !S_ISLNK(st.st_mode)) {
            if (snprintf(out, cap, "%s", cur) >= (int)cap) return errno = ENAMETOOLONG, -1;
            return 0;
        }
        ssize_t n = readlink(cur, link, sizeof link - 1);
        if (n < 0) return -1;
        link[n] = 0;
        if (link[0] == '/') {
            memcpy(cur, link, (size_t)n + 1);
            continue;
        }
        // relative: against the directory of the link
        char *slash = strrchr(cur, '/');
        size_t dir = slash ? (size_t)(slash - cur) + 1 : 0;
        if (dir + (size_t)n + 1 > sizeof cur) return errno = ENAMETOOLONG, -1;
        memcpy(cur + dir, link, (size_t)n + 1);
    }
    return errno = ELOOP, -1;
}

// A device node, FIFO or socket: opened for writing where it is, never truncated.
static int open_in_place(outfile *o, verr *err) {
    int fd = open(o->path, O_WRONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) return fail(o, err, "cannot open for writing", errno);
    o->f = fdopen(fd, "wb");
    if (!o->f) {
        int e = errno;
        close(fd);
        return fail(o, err, "cannot open for writing", e);
    }
    return 0;
}

// PATH.tmp.PID beside the target, created exclusively; keeps the mode of a file it
// will replace.
static int open_temp(outfile *o, const struct stat *existing, verr *err) {
    if (snprintf(o->tmp, sizeof o->tmp, "%s.tmp.%ld", o->path, (long)getpid()) >= (int)sizeof o->tmp)
        return fail(o, err, "cannot create", ENAMETOOLONG);
    int fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) {
        int e = errno;
        o->tmp[0] = 0;
        return fail(o, err, "cannot create", e);
    }
    o->slot = interrupt_track(o->tmp);
    if (existing) (void)fchmod(fd, existing->st_mode & 07777);
    o->f = fdopen(fd, "wb");
    if (!o->f) {
        int e = errno;
        close(fd);
        outfile_abort(o);
        return fail(o, err, "cannot create", e);
    }
    return 0;
}

// Records in a new file: created exclusively at the target.
static int open_new_records(outfile *o, verr *err) {
    int fd = open(o->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) return fail(o, err, "cannot create", errno);
    struct stat st;
    if (fstat(fd, &st) == 0) {
        o->dev = st.st_dev;
        o->ino = st.st_ino;
    }
    o->created = 1;
    o->f = fdopen(fd, "wb");
    if (!o->f) {
        int e = errno;
        close(fd);
        unlink(o->path);
        o->created = 0;
        return fail(o, err, "cannot create", e);
    }
    return 0;
}

// Records appended to an existing file; a last line without its newline (a run killed
// mid-record) is dropped first.
static int open_resume(outfile *o, const struct stat *st, verr *err) {
    int fd = open(o->path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return fail(o, err, "cannot open to resume", errno);
    off_t end = st->st_size;
    char c;
    while (end > 0 && pread(fd, &c, 1, end - 1) == 1 && c != '\n') end--;
    if (end != st->st_size && ftruncate(fd, end) != 0) {
        int e = errno;
        close(fd);
        return fail(o, err, "cannot drop the partial last record", e);
    }
    if (lseek(fd, 0, SEEK_END) < 0 || !(o->f = fdopen(fd, "ab"))) {
        int e = errno;
        close(fd);
        return fail(o, err, "cannot open to resume", e);
    }
    return 0;
}

// Set once by the CLI of an MPI launch on ranks other than 0, which compute everything
// rank 0 does but must not write the same files (docs/distributed.md).
static int discard_all;

void outfile_discard_all(void) { discard_all = 1; }

int outfile_open(outfile *o, const char *path, const outfile_opts *opts, verr *err) {
    static const outfile_opts document = { 0 };
    if (!opts) opts = &document;
    memset(o, 0, sizeof *o);
    o->slot = -1;
    if (opts->flag) snprintf(o->shown, sizeof o->shown, "%s %.4096s", opts->flag, path);
    else snprintf(o->shown, sizeof o->shown, "%.4096s", path);
    if (!*path) return verr_set(err, "%s: empty output path", opts->flag ? opts->flag : "output");
    if (discard_all) {
        snprintf(o->path, sizeof o->path, "/dev/null");
        return open_in_place(o, err);
    }
    if (resolve(path, o->path, sizeof o->path) != 0) return fail(o, err, "cannot resolve", errno);
    struct stat st;
    if (stat(o->path, &st) != 0) {
        if (errno != ENOENT) return fail(o, err, "cannot write", errno);
        return opts->records ? open_new_records(o, err) : open_temp(o, NULL, err);
    }
    if (S_ISDIR(st.st_mode)) return fail(o, err, "cannot create", EISDIR);
    if (!S_ISREG(st.st_mode)) return open_in_place(o, err);
    if (!opts->records || opts->force) return open_temp(o, &st, err);
    if (opts->resume) return open_resume(o, &st, err);
    return verr_set(err, "%s: already exists; --force replaces it%s", o->shown,
                    opts->can_resume ? ", --resume continues it" : "");
}

static void forget_temp(outfile *o) {
    interrupt_untrack(o->slot);
    o->slot = -1;
    o->tmp[0] = 0;
}

// fflush + fsync; 0 or an errno.
static int sync_file(FILE *f) {
    if (fflush(f) != 0) return errno ? errno : EIO;
    if (ferror(f)) return EIO;
    struct stat st;
    // fsync only what can be synced: a regular file (a pipe or a tty answers EINVAL)
    if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) && fsync(fileno(f)) != 0) return errno;
    return 0;
}

int outfile_sync(outfile *o, verr *err) {
    if (!o->f) return verr_set(err, "%s: not open", o->shown);
    int e = sync_file(o->f);
    return e ? verr_set(err, "%s: write failed: %s", o->shown, strerror(e)) : 0;
}

int outfile_commit(outfile *o, verr *err) {
    if (!o->f) return verr_set(err, "%s: not open", o->shown);
    int e = sync_file(o->f);
    int ok = e == 0;
    if (fclose(o->f) != 0 && ok) {
        ok = 0;
        e = errno;
    }
    o->f = NULL;
    if (ok && o->tmp[0] && rename(o->tmp, o->path) != 0) {
        ok = 0;
        e = errno;
    }
    if (!ok) {
        if (o->tmp[0]) unlink(o->tmp);
        forget_temp(o);
        return verr_set(err, "%s: write failed: %s", o->shown, strerror(e));
    }
    forget_temp(o);
    o->created = 0;
    return 0;
}

void outfile_abort(outfile *o) {
    if (!o->f) return;
    fclose(o->f);
    o->f = NULL;
    if (o->tmp[0]) unlink(o->tmp);
    forget_temp(o);
    struct stat st;
    // a records file of this run's own, if nobody replaced it meanwhile
    if (o->created && lstat(o->path, &st) == 0 && st.st_dev == o->dev && st.st_ino == o->ino) unlink(o->path);
    o->created = 0;
}

int outfile_write_all(const char *path, const void *data, size_t n, verr *err) {
    outfile o;
    if (outfile_open(&o, path, NULL, err)) return -1;
    if (n && fwrite(data, 1, n, o.f) != n) {
        int e = errno;
        outfile_abort(&o);
        return verr_set(err, "%s: write failed: %s", path, strerror(e));
    }
    return outfile_commit(&o, err);
}
