// interrupt.h: Ctrl-C for the CLI commands. interrupt_install() sets a SIGINT handler
// that only raises a flag; generation polls it between tokens (gen_opts.interrupt),
// and the command then flushes its output and logs and exits with INTERRUPT_EXIT
// (128 + SIGINT, what a shell reports for a process killed by Ctrl-C). The handler is
// one-shot: a second Ctrl-C kills the process at once.
#ifndef VARENT_INTERRUPT_H
#define VARENT_INTERRUPT_H

#include <signal.h>

#define INTERRUPT_EXIT 130

// Installs the handler (again after a previous interrupt) and clears the flag.
void interrupt_install(void);
// The flag the handler sets; stays valid for the life of the process.
const volatile sig_atomic_t *interrupt_flag(void);
int interrupt_requested(void);

#endif
