// progress.c: see progress.h.
#include "host/util/progress.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BAR_WIDTH 24
#define TICK_S 1.0        // terminal: the ticker redraws at least this often
#define LINE_EVERY_S 5.0  // piped: a line at least this often

// Tasks started and not yet ended, for progress_open_count: a check on the callers
// (a ticker outliving its task reads a dead stack frame), not state the bars share.
static atomic_int n_open;

int progress_open_count(void) { return atomic_load(&n_open); }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void progress_eta_text(double s, char *out, size_t n) {
    if (s < 0) snprintf(out, n, "ETA ?");
    else if (s < 60) snprintf(out, n, "ETA %ds", (int)(s + 0.5));
    else if (s < 3600) snprintf(out, n, "ETA %dm%02ds", (int)s / 60, (int)s % 60);
    else snprintf(out, n, "ETA %dh%02dm", (int)(s / 3600), (int)s % 3600 / 60);
}

// Remaining seconds from the rate so far; -1 before the first unit.
static double eta_s(const progress *p, double t) {
    if (p->done <= 0) return -1;
    return (t - p->t0) * (double)(p->total - p->done) / (double)p->done;
}

static void clear_bar(progress *p) {
    if (p->bar_shown) fprintf(p->f, "\r\033[K"), fflush(p->f);
    p->bar_shown = 0;
}

static void draw_bar(progress *p, double t) {
    int fill = (int)(BAR_WIDTH * p->done / p->total);
    char bar[BAR_WIDTH + 1], eta[32];
    for (int i = 0; i < BAR_WIDTH; i++) bar[i] = i < fill ? '#' : '-';
    bar[BAR_WIDTH] = 0;
    progress_eta_text(eta_s(p, t), eta, sizeof eta);
    fprintf(p->f, "\r\033[K%s [%s] %3d%% %ld/%ld %.1fs %s%s%s", p->label, bar, (int)(100 * p->done / p->total),
            p->done, p->total, t - p->t0, eta, p->detail[0] ? "  " : "", p->detail);
    fflush(p->f);
    p->bar_shown = 1;
    p->last_draw = t;
}

static void print_line(progress *p, double t) {
    char eta[32];
    progress_eta_text(eta_s(p, t), eta, sizeof eta);
    fprintf(p->f, "%s: %ld/%ld (%d%%) %.1fs %s%s%s\n", p->label, p->done, p->total, (int)(100 * p->done / p->total),
            t - p->t0, eta, p->detail[0] ? " " : "", p->detail);
    fflush(p->f);
    p->last_line = t;
}

static void *tick(void *arg) {
    progress *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->stopping) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)(TICK_S * 0.5e9);  // wake twice per tick: redraws land within TICK_S
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        int rc = pthread_cond_timedwait(&p->cv, &p->mu, &ts);
        if (p->stopping || rc != ETIMEDOUT) continue;
        double t = now_s();
        if (p->tty && t - p->last_draw >= TICK_S) draw_bar(p, t);
        else if (!p->tty && t - p->last_line >= LINE_EVERY_S) print_line(p, t);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

void progress_start(progress *p, const char *label, long total, int quiet) {
    memset(p, 0, sizeof *p);
    p->f = stderr;
    p->tty = isatty(fileno(stderr));
    p->out_tty = p->tty && isatty(fileno(stdout));
    p->quiet = quiet;
    snprintf(p->label, sizeof p->label, "%s", label);
    p->total = total > 0 ? total : 1;
    p->t_begin = p->t0 = p->last_line = now_s();
    p->last_decile = 0;
    p->last_draw = -1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->open = 1;
    atomic_fetch_add(&n_open, 1);
    if (!quiet) p->running = pthread_create(&p->ticker, NULL, tick, p) == 0;
}

void progress_update(progress *p, long done, const char *detail) {
    if (p->quiet) return;
    pthread_mutex_lock(&p->mu);
    p->done = done < 0 ? 0 : done > p->total ? p->total : done;
    snprintf(p->detail, sizeof p->detail, "%s", detail ? detail : "");
    double t = now_s();
    if (p->tty) {
        if (p->last_draw < 0 || t - p->last_draw >= 0.1 || p->done == p->total) draw_bar(p, t);
    } else {
        int decile = (int)(10 * p->done / p->total);  // a line per 10% step
        if (decile != p->last_decile || t - p->last_line >= LINE_EVERY_S) {
            print_line(p, t);
            p->last_decile = decile;
        }
    }
    pthread_mutex_unlock(&p->mu);
}

void progress_relabel(progress *p, const char *label, long total) {
    pthread_mutex_lock(&p->mu);
    snprintf(p->label, sizeof p->label, "%s", label);
    p->total = total > 0 ? total : 1;
    p->done = 0, p->last_decile = 0, p->detail[0] = 0;
    p->t0 = now_s();
    pthread_mutex_unlock(&p->mu);
}

// Stops the ticker and clears the bar; the caller holds nothing. 0 when the task had
// already ended (a second finish or stop does nothing).
static int end(progress *p) {
    if (!p->open) return 0;
    p->open = 0;
    atomic_fetch_sub(&n_open, 1);
    if (p->running) {
        pthread_mutex_lock(&p->mu);
        p->stopping = 1;
        pthread_cond_signal(&p->cv);
        pthread_mutex_unlock(&p->mu);
        pthread_join(p->ticker, NULL);
        p->running = 0;
    }
    if (!p->quiet) clear_bar(p);
    return 1;
}

void progress_finish(progress *p, const char *summary) {
    if (!end(p) || p->quiet) return;
    if (summary) fprintf(p->f, "%s: %s\n", p->label, summary);
    else fprintf(p->f, "%s: done in %.1fs\n", p->label, now_s() - p->t_begin);
    fflush(p->f);
}

void progress_stop(progress *p) { end(p); }

void progress_note(progress *p, const char *fmt, ...) {
    if (p->quiet) return;
    pthread_mutex_lock(&p->mu);
    clear_bar(p);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(p->f, fmt, ap);
    va_end(ap);
    fputc('\n', p->f);
    fflush(p->f);
    pthread_mutex_unlock(&p->mu);
}

void progress_pause(progress *p) {
    if (p->quiet) return;
    pthread_mutex_lock(&p->mu);
    if (p->out_tty) clear_bar(p);
}

void progress_resume(progress *p) {
    if (p->quiet) return;
    fflush(stdout);
    pthread_mutex_unlock(&p->mu);
}
