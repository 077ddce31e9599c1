// interrupt.h: signals for the CLI commands.
//
// Ctrl-C: interrupt_install() sets a SIGINT handler that only raises a flag; generation
// polls it between tokens (gen_opts.interrupt), and the command then flushes its
// output and logs and exits with INTERRUPT_EXIT (128 + SIGINT, what a shell reports
// for a process killed by Ctrl-C). A second Ctrl-C ends the process at once.
//
// Temporary files: interrupt_cleanup_install() (once, in main) makes SIGTERM, SIGHUP,
// SIGQUIT, SIGPIPE and a Ctrl-C that ends the process remove the temporary files
// registered with interrupt_track (host/util/outfile.c's PATH.tmp.PID) before the
// process dies of that signal, so no signal leaves a partial file behind.
#ifndef VARENT_INTERRUPT_H
#define VARENT_INTERRUPT_H

#include <signal.h>

#define INTERRUPT_EXIT 130
#define INTERRUPT_MAX_TRACKED 32

// Installs the handler (again after a previous interrupt) and clears the flag.
void interrupt_install(void);
// The same, but a Ctrl-C also makes a blocking read fail with EINTR (a prompt waiting
// on a plain read learns of it at once).
void interrupt_install_eintr(void);
// The flag the handler sets; stays valid for the life of the process.
const volatile sig_atomic_t *interrupt_flag(void);
int interrupt_requested(void);

// Installs the cleanup handlers for the signals above (SIGINT too, until a command
// calls interrupt_install). Signals the process was started ignoring stay ignored,
// except SIGINT: it stops every command, however it was started.
void interrupt_cleanup_install(void);
// Registers a file to remove if a signal ends the process: a slot, or -1 when all
// INTERRUPT_MAX_TRACKED slots are taken (the file then is not removed on a signal).
int interrupt_track(const char *path);
// Forgets a slot (after the file was renamed or removed). -1 is ignored.
void interrupt_untrack(int slot);
// Whether this process tracks path (its own temporary file, not a stale one).
int interrupt_tracked(const char *path);

#endif
