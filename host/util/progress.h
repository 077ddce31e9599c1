// progress.h: progress reports on stderr for long commands (model loading, ppl, bench,
// compare, convert, batch runs), each with the elapsed time and an ETA.
//
// On a terminal: one bar redrawn in place, on every update (at most 10 times a second)
// and by a ticker thread at least once a second, so the clock and the ETA move even
// while one unit of work takes long. Otherwise: plain lines, one per 10% step and at
// least one every 5 s, so logs stay short but never go quiet.
//
// Data that goes to stdout while a bar is shown (batch records, result tables) is
// written between progress_pause and progress_resume: the bar is cleared first when
// stdout is the same terminal, so data never shares a line with a bar.
//
// Every progress_start is ended by progress_finish or progress_stop on every path,
// errors included (they stop the ticker thread, which reads the progress struct, often
// a caller's stack frame; a second end does nothing). The CLI checks that none is left
// when a command returns (progress_open_count).
#ifndef VARENT_PROGRESS_H
#define VARENT_PROGRESS_H

#include <pthread.h>
#include <stdio.h>

typedef struct {
    FILE *f;          // stderr
    int tty;          // draw a bar (else lines)
    int out_tty;      // stdout is a terminal too: clear the bar before data
    int quiet;        // print nothing
    char label[64];
    char detail[128];
    long total, done;
    double t_begin, t0, last_draw, last_line;  // t0: the current stage's start
    int last_decile;  // last 10% step printed as a line
    int bar_shown;    // a bar is on the current terminal line
    int open;         // started and not yet finished or stopped
    int running;      // the ticker thread runs
    int stopping;
    pthread_t ticker;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} progress;

// Starts a task of `total` units. quiet: print nothing at all.
void progress_start(progress *p, const char *label, long total, int quiet);
// done units so far; detail (may be NULL) is shown after the count, e.g. "ppl 12.3".
void progress_update(progress *p, long done, const char *detail);
// Switches the bar to another stage of the same task (e.g. "converting" inside
// "load"): a new label and total, the count and the ETA's clock restarted.
void progress_relabel(progress *p, const char *label, long total);
// Ends the task with a summary line (NULL: "done in X s", counted from the start).
void progress_finish(progress *p, const char *summary);
// Ends the task without a line (an error path: its message follows).
void progress_stop(progress *p);
// A one-off message line (clears a drawn bar first), e.g. "loading model DIR".
void progress_note(progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// Around writes to stdout: pause clears the bar (when stdout is the terminal) and
// holds it off until resume.
void progress_pause(progress *p);
void progress_resume(progress *p);
// Tasks started and not yet finished or stopped, in the whole process (quiet ones too).
int progress_open_count(void);
// "ETA 1m05s" style text of seconds (s < 0: "ETA ?").
void progress_eta_text(double s, char *out, size_t n);

#endif
