// interrupt.c: see interrupt.h. The flag and the table of temporary files are the
// process-wide state a signal handler may touch, so they live here, used by the CLI
// only (library code never installs handlers).
#include "host/util/interrupt.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t interrupted;

// A slot is written (path, then used = 1) only by the thread that owns the file; the
// handler reads only slots whose used flag is set.
static char tracked[INTERRUPT_MAX_TRACKED][4200];
static volatile sig_atomic_t used[INTERRUPT_MAX_TRACKED];

static const int cleanup_signals[] = { SIGTERM, SIGHUP, SIGQUIT, SIGPIPE };

// Removes the tracked files, then dies of sig as if nothing had caught it.
static void cleanup_and_die(int sig) {
    for (int i = 0; i < INTERRUPT_MAX_TRACKED; i++)
        if (used[i]) unlink(tracked[i]);
    signal(sig, SIG_DFL);
    sigset_t set;  // the handler runs with sig blocked: let the re-raised one through
    sigemptyset(&set);
    sigaddset(&set, sig);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
    raise(sig);
    _exit(128 + sig);  // not reached
}

static void on_sigint(int sig) {
    if (interrupted) cleanup_and_die(sig);  // the second Ctrl-C
    interrupted = 1;
}

// keep_ignored: a signal the process was started ignoring (nohup, a background job)
// stays ignored.
static void install(int sig, void (*fn)(int), int flags, int keep_ignored) {
    struct sigaction old, sa;
    if (keep_ignored && sigaction(sig, NULL, &old) == 0 && old.sa_handler == SIG_IGN) return;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = flags;
    sigaction(sig, &sa, NULL);
}

void interrupt_install(void) {
    interrupted = 0;
    install(SIGINT, on_sigint, SA_RESTART, 0);  // writes in progress are not cut short
}

void interrupt_install_eintr(void) {
    interrupted = 0;
    install(SIGINT, on_sigint, 0, 0);
}

const volatile sig_atomic_t *interrupt_flag(void) { return &interrupted; }

int interrupt_requested(void) { return interrupted != 0; }

// SIGINT is the one way to stop a command, whatever it inherited: a shell runs a
// script's background jobs with SIGINT ignored, and `kill -INT` must still stop them
// (every command alike, those with a handler of their own and those without). The
// others keep an inherited SIG_IGN (nohup's SIGHUP).
void interrupt_cleanup_install(void) {
    for (size_t i = 0; i < sizeof cleanup_signals / sizeof *cleanup_signals; i++)
        install(cleanup_signals[i], cleanup_and_die, 0, 1);
    install(SIGINT, cleanup_and_die, 0, 0);
}

int interrupt_track(const char *path) {
    if (strlen(path) >= sizeof tracked[0]) return -1;
    for (int i = 0; i < INTERRUPT_MAX_TRACKED; i++) {
        if (used[i]) continue;
        snprintf(tracked[i], sizeof tracked[i], "%s", path);
        used[i] = 1;
        return i;
    }
    return -1;
}

void interrupt_untrack(int slot) {
    if (slot >= 0 && slot < INTERRUPT_MAX_TRACKED) used[slot] = 0;
}

int interrupt_tracked(const char *path) {
    for (int i = 0; i < INTERRUPT_MAX_TRACKED; i++)
        if (used[i] && !strcmp(tracked[i], path)) return 1;
    return 0;
}
