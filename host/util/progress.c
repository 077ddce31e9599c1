// progress.c: see progress.h.
#include "host/util/progress.h"

#include <stdarg.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BAR_WIDTH 30

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void progress_start(progress *p, const char *label, long total, int quiet) {
    memset(p, 0, sizeof *p);
    p->f = stderr;
    p->tty = isatty(fileno(stderr));
    p->quiet = quiet;
    snprintf(p->label, sizeof p->label, "%s", label);
    p->total = total > 0 ? total : 1;
    p->t0 = now_s();
    p->last_decile = -1;
    p->last_draw = -1;
}

static void clear_bar(progress *p) {
    if (p->bar_shown) fprintf(p->f, "\r\033[K");
    p->bar_shown = 0;
}

static void draw_bar(progress *p, const char *detail) {
    int fill = (int)(BAR_WIDTH * p->done / p->total);
    char bar[BAR_WIDTH + 1];
    for (int i = 0; i < BAR_WIDTH; i++) bar[i] = i < fill ? '#' : '-';
    bar[BAR_WIDTH] = 0;
    fprintf(p->f, "\r\033[K%s [%s] %3d%% %ld/%ld %.1fs%s%s", p->label, bar, (int)(100 * p->done / p->total), p->done,
            p->total, now_s() - p->t0, detail ? "  " : "", detail ? detail : "");
    fflush(p->f);
    p->bar_shown = 1;
}

void progress_update(progress *p, long done, const char *detail) {
    if (p->quiet) return;
    p->done = done < 0 ? 0 : done > p->total ? p->total : done;
    double t = now_s();
    if (p->tty) {
        if (p->last_draw < 0 || t - p->last_draw >= 0.1 || p->done == p->total) draw_bar(p, detail);
        p->last_draw = t;
        return;
    }
    int decile = (int)(10 * p->done / p->total);
    if (decile == p->last_decile) return;
    p->last_decile = decile;
    fprintf(p->f, "%s: %ld/%ld (%d%%) %.1fs%s%s\n", p->label, p->done, p->total, (int)(100 * p->done / p->total),
            t - p->t0, detail ? " " : "", detail ? detail : "");
    fflush(p->f);
}

void progress_finish(progress *p, const char *summary) {
    if (p->quiet) return;
    clear_bar(p);
    if (summary) fprintf(p->f, "%s: %s\n", p->label, summary);
    else fprintf(p->f, "%s: done in %.1fs\n", p->label, now_s() - p->t0);
    fflush(p->f);
}

void progress_note(progress *p, const char *fmt, ...) {
    if (p->quiet) return;
    clear_bar(p);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(p->f, fmt, ap);
    va_end(ap);
    fputc('\n', p->f);
    fflush(p->f);
}
