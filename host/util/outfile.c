// outfile.c: see outfile.h.
#include "host/util/outfile.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

int outfile_open(outfile *o, const char *path, verr *err) {
    memset(o, 0, sizeof *o);
    if (strlen(path) >= sizeof o->path) return verr_set(err, "%.64s...: output path too long", path);
    snprintf(o->path, sizeof o->path, "%s", path);
    snprintf(o->tmp, sizeof o->tmp, "%s.tmp.%ld", path, (long)getpid());
    o->f = fopen(o->tmp, "wb");
    if (!o->f) return verr_set(err, "%s: cannot create: %s", path, strerror(errno));
    return 0;
}

int outfile_commit(outfile *o, verr *err) {
    if (!o->f) return verr_set(err, "%s: not open", o->path);
    int ok = !ferror(o->f);
    int e = errno;
    ok = fclose(o->f) == 0 && ok;
    if (!ok) e = errno;
    o->f = NULL;
    if (ok && rename(o->tmp, o->path) != 0) ok = 0, e = errno;
    if (!ok) {
        unlink(o->tmp);
        return verr_set(err, "%s: write failed: %s", o->path, strerror(e));
    }
    return 0;
}

void outfile_abort(outfile *o) {
    if (!o->f) return;
    fclose(o->f);
    o->f = NULL;
    unlink(o->tmp);
}
