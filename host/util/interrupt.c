// interrupt.c: see interrupt.h. The flag is the one piece of process-wide state a
// signal handler can safely touch, so it lives here at the CLI level.
#include "host/util/interrupt.h"

#include <string.h>

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

void interrupt_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND | SA_RESTART;  // one-shot; writes in progress are not cut short
    interrupted = 0;
    sigaction(SIGINT, &sa, NULL);
}

const volatile sig_atomic_t *interrupt_flag(void) { return &interrupted; }

int interrupt_requested(void) { return interrupted != 0; }
