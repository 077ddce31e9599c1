// outfile.h: output files that appear whole or not at all. Writes go to PATH.tmp.PID
// next to PATH; outfile_commit renames it over PATH, outfile_abort removes it, so a
// failed or interrupted command never leaves a partial output file behind.
#ifndef VARENT_OUTFILE_H
#define VARENT_OUTFILE_H

#include <stdio.h>

#include "host/util/err.h"

typedef struct {
    FILE *f;
    char path[4096], tmp[4160];
} outfile;

// Creates the temporary file; -1 with err naming PATH (and why) when it cannot.
int outfile_open(outfile *o, const char *path, verr *err);
// Closes and renames into place; -1 with err when a write or the rename failed
// (the temporary file is removed then).
int outfile_commit(outfile *o, verr *err);
// Closes and removes the temporary file. Safe on a closed or zero-initialised outfile.
void outfile_abort(outfile *o);

#endif
