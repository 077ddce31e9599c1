// outfile.h: every file varent writes goes through here, so that nothing the run did
// not create is truncated, replaced or removed by a failure or an interruption. The
// rules, case by case, are the table in docs/robustness.md ("Output files").
//
// What the path names decides how it is written:
// - a descriptor: /dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N (a link to one
//   of the standard streams too) is written through a duplicate of that descriptor, so
//   an append (`>> log`) stays an append and nothing is renamed or truncated;
// - a device node, FIFO or other non-regular file is opened where it is, without
//   truncation; a FIFO without a reader is waited for (a notice says so), never a
//   silent block; a directory or a socket is an error;
// - a regular file (existing, or to be created) is written whole to NAME.tmp.PID beside
//   it and renamed over it by outfile_finish(OUTFILE_DONE) (a document), or, for
//   records (opts.records: logs, batch results), appended to a new file line by line.
// Links are followed by the kernel (the given path is opened), never resolved by hand,
// and a link the kernel's fs.protected_symlinks rule refuses (in a sticky world-writable
// directory, owned by neither the user nor the directory's owner) is refused whether or
// not the system enables that rule. A link to a regular file is replaced through: the
// temporary file goes beside the file the kernel opened, and the rename checks that the
// name there is still that file.
//
// Existing regular files: a document replaces one on success (opts.refuse_existing:
// only with opts.force); records refuse one unless opts.force (then written as a
// document) or opts.resume (appended to, after dropping a partial last line).
// opts.fresh (the server's captures): the name must be new; it is never followed or
// replaced, even by a name that appears meanwhile.
//
// A run that ends early calls outfile_finish(OUTFILE_PARTIAL) to keep what it finished:
// a file this run created (or a resumed one) keeps it, but a file that existed before
// is never replaced: the partial output goes to a new file, NAME.partial.EXT beside it,
// named in a notice. OUTFILE_DROP removes only what this run created.
//
// A temporary file NAME.tmp.PID whose process no longer runs (killed by SIGKILL) is
// removed by the next run that writes NAME, with a notice.
#ifndef VARENT_OUTFILE_H
#define VARENT_OUTFILE_H

#include <stdio.h>
#include <sys/types.h>

#include "host/util/err.h"

typedef struct {
    int records;     // 1: records appended in place (see above); 0: a document
    int force;       // replace an existing regular file (on success, atomically)
    int resume;      // records: continue an existing regular file
    int can_resume;  // records: the command has --resume (named in the "exists" error)
    int refuse_existing;  // a document: an existing regular file needs force (captures)
    int fresh;       // the name must not exist; never followed or replaced (server captures)
    const char *flag;  // the option that named the path, for messages ("--log"); NULL: none
} outfile_opts;

// How a run ended, for outfile_finish.
typedef enum {
    OUTFILE_DROP = 0,     // failed: remove what this run created
    OUTFILE_DONE = 1,     // finished: the file takes its place
    OUTFILE_PARTIAL = 2,  // interrupted (or failed) after finishing part: keep that part, replace nothing
} outfile_end;

typedef struct {
    FILE *f;
    char path[4096];   // the file the data goes to (a link followed by the kernel)
    char shown[4160];  // "FLAG PATH" or "PATH", as the user gave it, for messages
    char kept[4200];   // after a partial finish: the new file the output went to ("" if none)
    char tmp[4200];    // the temporary file (full path, for the signal cleanup); "" when none
    int dirfd;         // the directory of path (temporary file, rename, removal); -1: none
    const char *base;  // path's last component (points into path)
    const char *tmp_base;  // tmp's last component
    int existed;       // a regular file was there at open: never replaced but on success
    int created;       // this run created path (abort removes it only if unchanged)
    int fresh;         // opts.fresh: the final rename never replaces
    dev_t dev;         // of the file this run created
    ino_t ino;
    int slot;          // signal-cleanup slot of tmp (host/util/interrupt.h); -1: none
} outfile;

// Opens for writing by the rules above; -1 with err naming the path and why.
int outfile_open(outfile *o, const char *path, const outfile_opts *opts, verr *err);
// The checks of outfile_open that need no file opened (no FIFO is opened, nothing is
// created): for a command to fail on a bad output path before it loads a model.
int outfile_check(const char *path, const outfile_opts *opts, verr *err);
// Flushes and fsyncs without closing (a regular file; others only flush): before a
// group of commits, so that every file is whole on disk before the first rename.
int outfile_sync(outfile *o, verr *err);
// Ends the file as the run ended (see outfile_end); -1 with err when a write, sync or
// rename failed (the temporary file is removed then). Safe on a closed or
// zero-initialised outfile (then 0).
int outfile_finish(outfile *o, outfile_end how, verr *err);
// outfile_finish(OUTFILE_DONE), but an unopened outfile is an error.
int outfile_commit(outfile *o, verr *err);
// outfile_finish(OUTFILE_DROP).
void outfile_abort(outfile *o);
// Where the data went: kept after a partial finish that could not use path, else path.
const char *outfile_where(const outfile *o);
// From now on every outfile_open of this process writes to /dev/null (the ranks other
// than 0 of an MPI launch: rank 0 writes the files). Called once, by the CLI.
void outfile_discard_all(void);
// 1 after outfile_discard_all: this process writes nothing, another one writes the files
// (the model cache waits for rank 0's conversion instead of making an empty one).
int outfile_discarding(void);
// Where notices go (waiting for a FIFO's reader, a partial output kept under a new
// name, a stale temporary file removed): set once by the CLI; none by default.
void outfile_set_notice(void (*fn)(const char *msg));
// Writes n bytes as a whole document to path (outfile_open + fwrite + outfile_commit).
int outfile_write_all(const char *path, const void *data, size_t n, verr *err);

#endif
