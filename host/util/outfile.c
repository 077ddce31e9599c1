// outfile.c: see outfile.h. The cases, in order: a descriptor by name, a name that does
// not exist, a link, what the kernel opened (a regular file or not).
#define _GNU_SOURCE  // renameat2
#include "host/util/outfile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "host/util/interrupt.h"

#define FIFO_POLL_NS 50000000L  // how often a FIFO without a reader is tried again
#define PARTIAL_TRIES 100       // NAME.partial.EXT, NAME.partial-2.EXT, ...

// Set once by the CLI: the ranks other than 0 of an MPI launch compute everything rank
// 0 does but must not write the same files (docs/distributed.md); where notices go.
static int discard_all;
static void (*notice_fn)(const char *msg);

void outfile_discard_all(void) { discard_all = 1; }

int outfile_discarding(void) { return discard_all; }

void outfile_set_notice(void (*fn)(const char *msg)) { notice_fn = fn; }

static void notice(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void notice(const char *fmt, ...) {
    if (!notice_fn) return;
    char buf[9000];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    notice_fn(buf);
}

static int fail(const outfile *o, verr *err, const char *what, int e) {
    return verr_set(err, "%s: %s: %s", o->shown, what, strerror(e));
}

static int exists_error(const char *shown, const outfile_opts *opts, verr *err) {
    return verr_set(err, "%s: already exists; --force replaces it%s", shown,
                    opts->records && opts->can_resume ? ", --resume continues it" : "");
}

// An existing regular file that these options do not let the run touch.
static int refuses_existing(const outfile_opts *opts) {
    if (opts->force) return 0;
    return opts->records ? !opts->resume : opts->refuse_existing;
}

// ---- what a path names -------------------------------------------------------------

// The descriptor a path names by itself (/dev/stdout, /dev/fd/N, /proc/self/fd/N, the
// same under /proc/thread-self or /proc/PID for this process), or -1. Opening such a
// name would open the file behind the descriptor afresh, at offset 0 and without the
// O_APPEND of a shell's `>>`.
static int named_fd(const char *path) {
    static const char *const std[] = { "/dev/stdin", "/dev/stdout", "/dev/stderr" };
    for (int i = 0; i < 3; i++)
        if (!strcmp(path, std[i])) return i;
    char self[64];
    snprintf(self, sizeof self, "/proc/%ld/fd/", (long)getpid());
    const char *dirs[] = { "/dev/fd/", "/proc/self/fd/", "/proc/thread-self/fd/", self };
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
        size_t n = strlen(dirs[i]);
        if (strncmp(path, dirs[i], n) != 0) continue;
        char *end;
        errno = 0;
        long fd = strtol(path + n, &end, 10);
        if (end != path + n && !*end && !errno && fd >= 0 && fd <= INT_MAX && path[n] != '-' && path[n] != '+')
            return (int)fd;
    }
    return -1;
}

// The standard stream (0, 1, 2) that is the regular file st, or -1: a link to
// /dev/stdout is written through the descriptor, as /dev/stdout itself is.
static int std_stream_of(const struct stat *st) {
    for (int fd = 0; fd < 3; fd++) {
        struct stat s;
        if (fstat(fd, &s) == 0 && S_ISREG(s.st_mode) && s.st_dev == st->st_dev && s.st_ino == st->st_ino) return fd;
    }
    return -1;
}

// The kernel's fs.protected_symlinks rule for the link lst at path: in a sticky
// world-writable directory, a link is followed only by its owner or when the directory's
// owner owns it. Applied whether or not the system enables the rule.
static int link_refused(const char *path, const struct stat *lst) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
    struct stat d;
    if (stat(dir, &d) != 0) return 0;  // the open that follows reports it
    if (!(d.st_mode & S_ISVTX) || !(d.st_mode & S_IWOTH)) return 0;
    return lst->st_uid != geteuid() && lst->st_uid != d.st_uid;
}

static int link_error(const outfile *o, verr *err) {
    return verr_set(err, "%s: a symbolic link in a sticky world-writable directory, owned by neither you nor the "
                    "directory's owner: not followed (the kernel's fs.protected_symlinks rule)", o->shown);
}

// ---- the directory of a regular file -------------------------------------------------

// Opens path's directory as o->dirfd and points o->base at its last component.
static int open_dir(outfile *o, verr *err) {
    char dir[4096];
    char *slash = strrchr(o->path, '/');
    o->base = slash ? slash + 1 : o->path;
    if (!*o->base) return fail(o, err, "cannot create", EISDIR);
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == o->path) snprintf(dir, sizeof dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - o->path), o->path);
    o->dirfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    return o->dirfd < 0 ? fail(o, err, "cannot create", errno) : 0;
}

// The regular file the kernel opened as fd (st): o->path becomes where it lies (for a
// link, from /proc/self/fd), and the name there must still be that file.
static int locate(outfile *o, int fd, int is_link, const struct stat *st, verr *err) {
    if (is_link) {
        char proc[64];
        snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(proc, o->path, sizeof o->path - 1);
        if (n <= 0 || n >= (ssize_t)sizeof o->path - 1 || o->path[0] != '/')
            return fail(o, err, "cannot tell where the link leads (is /proc mounted?)", n < 0 ? errno : ENAMETOOLONG);
        o->path[n] = 0;
    }
    if (open_dir(o, err)) return -1;
    struct stat at;
    if (fstatat(o->dirfd, o->base, &at, AT_SYMLINK_NOFOLLOW) != 0 || at.st_dev != st->st_dev || at.st_ino != st->st_ino)
        return verr_set(err, "%s: %s changed while it was being opened", o->shown, o->path);
    return 0;
}

// ---- temporary files -------------------------------------------------------------------

// The PID of a temporary file of o's target (NAME.tmp.PID), or -1 for another name.
static long temp_pid(const outfile *o, const char *name) {
    size_t n = strlen(o->base);
    if (strncmp(name, o->base, n) != 0 || strncmp(name + n, ".tmp.", 5) != 0) return -1;
    const char *d = name + n + 5;
    char *end;
    long pid = *d >= '1' && *d <= '9' ? strtol(d, &end, 10) : -1;
    return pid > 0 && !*end && pid <= INT_MAX ? pid : -1;
}

// A temporary file whose writer no longer runs (SIGKILL, a power cut): this process's own
// PID counts only when this process does not track the name (a PID used again).
static int stale(const outfile *o, const char *name, long pid) {
    if (pid != (long)getpid()) return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
    char full[4400];
    snprintf(full, sizeof full, "%.*s%s", (int)(o->base - o->path), o->path, name);
    return !interrupt_tracked(full);
}

// Removes the stale temporary files of o's target (regular files of this user only),
// each with a notice.
static void remove_stale(const outfile *o) {
    int fd = openat(o->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0) close(fd);
        return;  // an unreadable directory: nothing is removed
    }
    for (struct dirent *e; (e = readdir(d));) {
        long pid = temp_pid(o, e->d_name);
        struct stat st;
        if (pid < 0 || !stale(o, e->d_name, pid)) continue;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        if (!S_ISREG(st.st_mode) || st.st_uid != geteuid()) continue;  // not a file of this user's
        if (unlinkat(dirfd(d), e->d_name, 0) == 0)
            notice("%s: removed %.*s%s, the temporary file of process %ld, which was killed before it finished",
                   o->shown, (int)(o->base - o->path), o->path, e->d_name, pid);
    }
    closedir(d);
}

// NAME.tmp.PID beside the target, created exclusively (a link there is not followed);
// keeps the mode of a file it will replace.
static int open_temp(outfile *o, const struct stat *existing, verr *err) {
    if (!o->fresh) remove_stale(o);
    if (snprintf(o->tmp, sizeof o->tmp, "%s.tmp.%ld", o->path, (long)getpid()) >= (int)sizeof o->tmp)
        return o->tmp[0] = 0, fail(o, err, "cannot create", ENAMETOOLONG);
    o->tmp_base = o->tmp + (o->base - o->path);
    int fd = openat(o->dirfd, o->tmp_base, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0) {
        int e = errno;
        char shown[4300];
        snprintf(shown, sizeof shown, "%.4200s", o->tmp);
        o->tmp[0] = 0;
        return verr_set(err, "%s: cannot create %s: %s", o->shown, shown, strerror(e));
    }
    o->slot = interrupt_track(o->tmp);
    if (existing) (void)fchmod(fd, existing->st_mode & 07777);
    if (!(o->f = fdopen(fd, "wb"))) {
        int e = errno;
        close(fd);
        return fail(o, err, "cannot create", e);
    }
    return 0;
}

// ---- opening -----------------------------------------------------------------------------

// Written where it is: a device node, a FIFO, a descriptor.
static int in_place(outfile *o, int fd, verr *err) {
    if (fd < 0) return fail(o, err, "cannot open for writing", errno);
    if (!(o->f = fdopen(fd, "wb"))) {
        int e = errno;
        close(fd);
        return fail(o, err, "cannot open for writing", e);
    }
    return 0;
}

static int open_descriptor(outfile *o, int n, verr *err) {
    int fd = fcntl(n, F_DUPFD_CLOEXEC, 3);
    if (fd < 0 && errno == EBADF) return verr_set(err, "%s: descriptor %d is not open", o->shown, n);
    return in_place(o, fd, err);
}

// Opens the given path (the kernel follows links) without blocking on a FIFO: one
// without a reader is tried again until a reader comes (a notice says so) or Ctrl-C.
static int open_given(const outfile *o, int flags) {
    for (int noticed = 0;;) {
        int fd = open(o->path, flags | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0666);
        struct stat st;
        if (fd >= 0 || errno != ENXIO || stat(o->path, &st) != 0 || !S_ISFIFO(st.st_mode)) {
            if (fd >= 0) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
            return fd;
        }
        if (interrupt_requested()) return errno = EINTR, -1;
        if (!noticed++) notice("%s: waiting for a reader (a FIFO)", o->shown);
        struct timespec ts = { 0, FIFO_POLL_NS };
        nanosleep(&ts, NULL);
    }
}

// Records appended to an existing file (fd, read-write); a last line without its newline
// (a run killed mid-record) is dropped first.
static int open_resume(outfile *o, int fd, const struct stat *st, verr *err) {
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

// A name that does not exist: records are created there exclusively, a document is
// written to a temporary file and renamed there.
static int open_new(outfile *o, const outfile_opts *opts, verr *err) {
    if (open_dir(o, err)) return -1;
    if (!opts->records) return open_temp(o, NULL, err);
    int fd = openat(o->dirfd, o->base, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    struct stat st;
    if (fd < 0) return fail(o, err, "cannot create", errno);
    if (fstat(fd, &st) == 0) o->dev = st.st_dev, o->ino = st.st_ino;
    o->created = 1;
    return in_place(o, fd, err);
}

// A link whose target does not exist: the kernel creates the target through it (an
// empty file, this run's own); records go into it, a document replaces it at the end.
static int open_dangling(outfile *o, const outfile_opts *opts, verr *err) {
    int fd = open(o->path, O_WRONLY | O_CREAT | O_NOCTTY | O_CLOEXEC, 0666);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        int e = errno;
        if (fd >= 0) close(fd);
        return fail(o, err, "cannot create the file the link names", e);
    }
    if (!S_ISREG(st.st_mode)) return in_place(o, fd, err);  // something else appeared there
    o->created = 1, o->dev = st.st_dev, o->ino = st.st_ino;
    if (locate(o, fd, 1, &st, err)) return close(fd), -1;
    if (opts->records) return in_place(o, fd, err);
    close(fd);
    return open_temp(o, NULL, err);
}

// What the kernel opened at the given path (a link followed), by its kind.
static int open_existing(outfile *o, const outfile_opts *opts, int is_link, verr *err) {
    int resume = opts->records && opts->resume && !opts->force;
    int fd = open_given(o, resume ? O_RDWR : O_WRONLY);
    if (fd < 0 && errno == ENOENT && is_link) return open_dangling(o, opts, err);
    if (fd < 0 && errno == EINTR) return verr_set(err, "%s: interrupted while waiting for a reader", o->shown);
    if (fd < 0) return fail(o, err, "cannot open for writing", errno);
    struct stat st;
    if (fstat(fd, &st) != 0) return close(fd), fail(o, err, "cannot open for writing", errno);
    if (!S_ISREG(st.st_mode)) return in_place(o, fd, err);
    int std = is_link ? std_stream_of(&st) : -1;
    if (std >= 0) return close(fd), open_descriptor(o, std, err);
    if (refuses_existing(opts)) return close(fd), exists_error(o->shown, opts, err);
    if (resume) return open_resume(o, fd, &st, err);
    int rc = locate(o, fd, is_link, &st, err);
    close(fd);
    o->existed = 1;
    return rc ? rc : open_temp(o, &st, err);
}

// Removes the file this run created at path, if it is still that file.
static void remove_created(outfile *o) {
    struct stat st;
    if (!o->created || o->dirfd < 0 || fstatat(o->dirfd, o->base, &st, AT_SYMLINK_NOFOLLOW) != 0) return;
    if (st.st_dev == o->dev && st.st_ino == o->ino) unlinkat(o->dirfd, o->base, 0);
}

// Removes the temporary file and what this run created, untracks, closes: after a failed
// open (o->f may be NULL) and a dropped or failed finish.
static void undo_open(outfile *o) {
    if (o->f) fclose(o->f);
    o->f = NULL;
    if (o->tmp[0] && o->dirfd >= 0) unlinkat(o->dirfd, o->tmp_base, 0);
    remove_created(o);
    interrupt_untrack(o->slot);
    o->slot = -1, o->tmp[0] = 0, o->created = 0;
    if (o->dirfd >= 0) close(o->dirfd);
    o->dirfd = -1;
}

// A closed outfile for path, named in messages as the user gave it; -1 for an empty path.
static int reset(outfile *o, const char *path, const outfile_opts *opts, verr *err) {
    memset(o, 0, sizeof *o);
    o->dirfd = -1, o->slot = -1, o->fresh = opts->fresh;
    if (opts->flag) snprintf(o->shown, sizeof o->shown, "%s %.4096s", opts->flag, path);
    else snprintf(o->shown, sizeof o->shown, "%.4096s", path);
    return *path ? 0 : verr_set(err, "%s: empty output path", opts->flag ? opts->flag : "output");
}

int outfile_open(outfile *o, const char *path, const outfile_opts *opts, verr *err) {
    static const outfile_opts document = { 0 };
    if (!opts) opts = &document;
    if (reset(o, path, opts, err)) return -1;
    if (snprintf(o->path, sizeof o->path, "%s", path) >= (int)sizeof o->path)
        return fail(o, err, "cannot write", ENAMETOOLONG);
    int rc;
    struct stat lst;
    if (discard_all) {
        rc = in_place(o, open("/dev/null", O_WRONLY | O_CLOEXEC), err);
    } else if (named_fd(path) >= 0) {
        rc = opts->fresh ? fail(o, err, "cannot create", EEXIST) : open_descriptor(o, named_fd(path), err);
    } else if (lstat(path, &lst) != 0) {
        rc = errno == ENOENT ? open_new(o, opts, err) : fail(o, err, "cannot write", errno);
    } else if (opts->fresh) {
        rc = fail(o, err, "cannot create", EEXIST);
    } else if (S_ISLNK(lst.st_mode) && link_refused(path, &lst)) {
        rc = link_error(o, err);
    } else if (S_ISDIR(lst.st_mode) || S_ISSOCK(lst.st_mode)) {
        rc = fail(o, err, "cannot create", S_ISDIR(lst.st_mode) ? EISDIR : ENXIO);
    } else if (refuses_existing(opts) && stat(path, &lst) == 0 && S_ISREG(lst.st_mode)) {
        rc = exists_error(o->shown, opts, err);  // before any open: the same answer as outfile_check
    } else {
        rc = open_existing(o, opts, S_ISLNK(lst.st_mode), err);
    }
    if (rc) undo_open(o);
    return rc;
}

int outfile_check(const char *path, const outfile_opts *opts, verr *err) {
    static const outfile_opts document = { 0 };
    if (!opts) opts = &document;
    outfile o;
    if (reset(&o, path, opts, err)) return -1;
    if (discard_all) return 0;
    int fd = named_fd(path);
    if (fd >= 0) return fcntl(fd, F_GETFD) < 0 ? verr_set(err, "%s: descriptor %d is not open", o.shown, fd) : 0;
    struct stat lst, st;
    if (lstat(path, &lst) != 0) {
        if (errno != ENOENT) return fail(&o, err, "cannot write", errno);
        snprintf(o.path, sizeof o.path, "%s", path);
        int rc = open_dir(&o, err);  // the directory it would go to, writable
        if (rc == 0 && faccessat(o.dirfd, ".", W_OK | X_OK, AT_EACCESS) != 0) rc = fail(&o, err, "cannot create", errno);
        if (o.dirfd >= 0) close(o.dirfd);
        return rc;
    }
    if (opts->fresh) return fail(&o, err, "cannot create", EEXIST);
    if (S_ISLNK(lst.st_mode) && link_refused(path, &lst)) return link_error(&o, err);
    if (stat(path, &st) != 0) return 0;  // a dangling link: its target is created
    if (S_ISDIR(st.st_mode) || S_ISSOCK(st.st_mode))
        return fail(&o, err, "cannot create", S_ISDIR(st.st_mode) ? EISDIR : ENXIO);
    if (!S_ISREG(st.st_mode)) return 0;
    if (refuses_existing(opts)) return exists_error(o.shown, opts, err);
    return faccessat(AT_FDCWD, path, W_OK, AT_EACCESS) != 0 ? fail(&o, err, "cannot open for writing", errno) : 0;
}

// ---- finishing -----------------------------------------------------------------------------

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

// rename without replacing anything at to: renameat2's RENAME_NOREPLACE, or link and
// unlink where the file system lacks it. -1 with errno (EEXIST: to exists).
static int rename_new(int dirfd, const char *from, const char *to) {
    if (renameat2(dirfd, from, dirfd, to, RENAME_NOREPLACE) == 0) return 0;
    if (errno != EINVAL && errno != ENOSYS) return -1;
    if (linkat(dirfd, from, dirfd, to, 0) != 0) return -1;
    unlinkat(dirfd, from, 0);
    return 0;
}

// The k-th name for a partial output beside path: NAME.partial.EXT, NAME.partial-K.EXT.
static void partial_name(const outfile *o, int k, char *out, size_t cap) {
    const char *dot = strrchr(o->base, '.');
    if (!dot || dot == o->base) dot = o->base + strlen(o->base);
    char n[16] = "";
    if (k > 1) snprintf(n, sizeof n, "-%d", k);
    snprintf(out, cap, "%.*s.partial%s%s", (int)(dot - o->path), o->path, n, dot);
}

// A partial output of a target that existed before: to a new name, with a notice.
static int keep_partial(outfile *o, verr *err) {
    int e = EEXIST;
    for (int k = 1; k <= PARTIAL_TRIES && e == EEXIST; k++) {
        partial_name(o, k, o->kept, sizeof o->kept);
        if (rename_new(o->dirfd, o->tmp_base, o->kept + (o->base - o->path)) == 0) {
            notice("%s: the run did not finish, so %s is left as it was; the partial output is in %s", o->shown, o->path,
                   o->kept);
            return 0;
        }
        e = errno;
    }
    o->kept[0] = 0;
    return verr_set(err, "%s: the run did not finish, and its partial output could not be kept beside it: %s", o->shown,
                    strerror(e));
}

// The temporary file into place: on success over the target; a partial output only where
// nothing the run did not create is replaced.
static int place(outfile *o, outfile_end how, verr *err) {
    if (how == OUTFILE_PARTIAL && o->existed) return keep_partial(o, err);
    int r = o->fresh || (how == OUTFILE_PARTIAL && !o->created) ? rename_new(o->dirfd, o->tmp_base, o->base)
                                                                 : renameat(o->dirfd, o->tmp_base, o->dirfd, o->base);
    if (r == 0) return 0;
    if (errno == EEXIST && !o->fresh) return keep_partial(o, err);  // a file appeared there meanwhile
    return fail(o, err, "cannot rename the finished file into place", errno);
}

int outfile_finish(outfile *o, outfile_end how, verr *err) {
    if (!o->f) return 0;  // never opened (a zero-initialised outfile too), or finished
    if (how == OUTFILE_DROP) return undo_open(o), 0;
    int e = sync_file(o->f);
    if (fclose(o->f) != 0 && !e) e = errno ? errno : EIO;
    o->f = NULL;
    int rc = e ? verr_set(err, "%s: write failed: %s", o->shown, strerror(e)) : o->tmp[0] ? place(o, how, err) : 0;
    if (rc && o->tmp[0]) return undo_open(o), -1;  // a records file keeps its whole lines
    o->tmp[0] = 0, o->created = 0;
    undo_open(o);
    return rc;
}

int outfile_commit(outfile *o, verr *err) {
    if (!o->f) return verr_set(err, "%s: not open", o->shown);
    return outfile_finish(o, OUTFILE_DONE, err);
}

void outfile_abort(outfile *o) { outfile_finish(o, OUTFILE_DROP, NULL); }

const char *outfile_where(const outfile *o) { return o->kept[0] ? o->kept : o->path; }

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
