// progress.h: progress reports on stderr for long commands (model loading, ppl,
// compare, batch runs). On a terminal: one bar redrawn in place (at most 10 times a
// second). Otherwise: plain lines, one per 10% step, so logs stay short.
#ifndef VARENT_PROGRESS_H
#define VARENT_PROGRESS_H

#include <stdio.h>

typedef struct {
    FILE *f;          // stderr
    int tty;          // draw a bar (else lines)
    int quiet;        // print nothing
    char label[64];
    long total, done;
    double t0, last_draw;
    int last_decile;  // last 10% step printed as a line
    int bar_shown;    // a bar is on the current terminal line
} progress;

// Starts a task of `total` units. quiet: print nothing at all.
void progress_start(progress *p, const char *label, long total, int quiet);
// done units so far; detail (may be NULL) is shown after the count, e.g. "ppl 12.3".
void progress_update(progress *p, long done, const char *detail);
// Ends the task with a summary line (NULL: "done in X s").
void progress_finish(progress *p, const char *summary);
// A one-off message line (clears a drawn bar first), e.g. "loading model DIR".
void progress_note(progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
