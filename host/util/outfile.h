// outfile.h: every file varent writes goes through here, so that nothing the run did
// not create is truncated, replaced or removed by a failure or an interruption
// (docs/robustness.md, "Output files").
//
// The path is resolved first: a symlink is followed to the file it names (the link
// itself stays); a device node or a FIFO is written in place, opened without
// truncation, and never renamed or removed; a directory is an error.
//
// A document (the default) is written whole to PATH.tmp.PID beside its target, synced,
// and renamed over the target by outfile_commit: a regular file already there is
// replaced only then, and a failure or a signal leaves it as it was and removes only
// the temporary file.
//
// Records (opts.records: logs, batch results) are appended to the target itself, each
// flushed by the caller as it is finished, so an interruption keeps the finished
// records. A new file is created exclusively (and removed by outfile_abort, being the
// run's own); an existing regular file is an error unless opts.force (then it is
// written as a document) or opts.resume (appended to, after dropping a partial last
// line left by a killed run).
#ifndef VARENT_OUTFILE_H
#define VARENT_OUTFILE_H

#include <stdio.h>
#include <sys/types.h>

#include "host/util/err.h"

typedef struct {
    int records;     // 1: records appended in place (see above); 0: a document
    int force;       // records: replace an existing regular file (on commit, atomically)
    int resume;      // records: continue an existing regular file
    int can_resume;  // records: the command has --resume (named in the "exists" error)
    const char *flag;  // the option that named the path, for messages ("--log"); NULL: none
} outfile_opts;

typedef struct {
    FILE *f;
    char path[4096];   // the file the data ends up in (a symlink followed)
    char tmp[4200];    // the temporary file; "" when writing in place
    char shown[4160];  // "FLAG PATH" or "PATH", as the user gave it, for messages
    int created;       // records: this run created path
    dev_t dev;         // of the file this run created (abort removes it only if unchanged)
    ino_t ino;
    int slot;          // signal-cleanup slot of tmp (host/util/interrupt.h); -1: none
} outfile;

// Opens for writing by the rules above; -1 with err naming the path and why.
int outfile_open(outfile *o, const char *path, const outfile_opts *opts, verr *err);
// Flushes and fsyncs without closing (a regular file; others only flush): before a
// group of commits, so that every file is whole on disk before the first rename.
int outfile_sync(outfile *o, verr *err);
// A document: flush, fsync, rename into place. Records: flush, fsync, close (or rename,
// with force). -1 with err when a write failed; the temporary file is removed then.
int outfile_commit(outfile *o, verr *err);
// Closes without committing: removes the temporary file, or a records file this run
// created. Safe on a closed or zero-initialised outfile.
void outfile_abort(outfile *o);
// From now on every outfile_open of this process writes to /dev/null (the ranks other
// than 0 of an MPI launch: rank 0 writes the files). Called once, by the CLI.
void outfile_discard_all(void);
// Writes n bytes as a whole document to path (outfile_open + fwrite + outfile_commit).
int outfile_write_all(const char *path, const void *data, size_t n, verr *err);

#endif
