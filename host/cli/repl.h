// repl.h: the line reader of interactive commands (`varent chat`).
//
// On a terminal, with libedit compiled in (Debian's libedit-dev; make probes for it):
// emacs-style line editing, history (Up/Down, kept in $XDG_STATE_HOME/varent/
// chat_history, else ~/.local/state/varent/chat_history, unless VARENT_HISTORY names
// another file or is empty), bracketed paste (a pasted block with newlines is one
// message), and Ctrl-C read as a key rather than a signal. Without libedit, or when
// stdin is not a terminal: plain lines (getline), a Ctrl-C at the prompt interrupts the
// read.
//
// Everywhere: a line ending in '\' continues on the next line (the message keeps the
// newline, not the backslash).
#ifndef VARENT_REPL_H
#define VARENT_REPL_H

typedef struct repl repl;

typedef enum {
    REPL_LINE,       // a message (possibly several lines)
    REPL_EOF,        // Ctrl-D at an empty prompt, or end of input
    REPL_INTERRUPT,  // Ctrl-C at the prompt (what was typed is dropped; *out is "" when
                     // the prompt was empty)
} repl_status;

// NULL only when out of memory.
repl *repl_open(void);
// Saves the history and restores the terminal.
void repl_close(repl *r);
// stdin is a terminal (prompts, banners and confirmations are for people).
int repl_tty(const repl *r);
// Line editing and history are on.
int repl_editing(const repl *r);
// Reads one message: prompt, then cont_prompt for continuation lines. *out (no final
// newline) stays valid until the next call.
repl_status repl_read(repl *r, const char *prompt, const char *cont_prompt, const char **out);
// One line answering a question (not added to the history).
repl_status repl_ask(repl *r, const char *question, const char **out);
// Adds a message to the history (the caller decides which lines count).
void repl_history_add(repl *r, const char *line);

#endif
