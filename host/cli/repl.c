// repl.c: see repl.h. The libedit parts are compiled only with VARENT_LIBEDIT (the
// Makefile sets it when libedit-dev is installed).
#include "host/cli/repl.h"
#include "host/cli/ranks.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host/util/interrupt.h"

#ifdef VARENT_LIBEDIT
#include <histedit.h>
#endif

struct repl {
    int tty;
    char *msg;  // the message being assembled
    size_t len, cap;
    char *line;  // getline's buffer
    size_t line_cap;
#ifdef VARENT_LIBEDIT
    EditLine *el;
    History *hist;
    char hist_path[4096];  // "": not kept between runs
    const char *prompt;
    int ctrl_c;        // the editor read a Ctrl-C
    int ctrl_c_text;   // ... with text on the line
    int pasted;        // the line ended inside a multi-line paste
    char *paste_mid;   // its lines between the first and the last (NULL: none)
    char *paste_tail;  // its last line, pushed into the next edit
#endif
};

static int append(repl *r, const char *s, size_t n) {
    if (r->len + n + 1 > r->cap) {
        size_t cap = (r->len + n + 1) * 2;
        char *p = realloc(r->msg, cap);
        if (!p) return -1;
        r->msg = p, r->cap = cap;
    }
    memcpy(r->msg + r->len, s, n);
    r->len += n;
    r->msg[r->len] = 0;
    return 0;
}

static size_t chomp(const char *s, size_t n) {
    while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == '\r')) n--;
    return n;
}

// ---- plain lines --------------------------------------------------------------------

static repl_status plain_line(repl *r, const char *prompt, const char **line, size_t *n) {
    if (r->tty) {
        fputs(prompt, stdout), fflush(stdout);
        interrupt_install_eintr();  // a Ctrl-C ends the read at once
    }
    ssize_t k = getline(&r->line, &r->line_cap, stdin);
    int intr = r->tty && interrupt_requested();
    if (r->tty) interrupt_install();
    if (intr) {
        clearerr(stdin);
        fputs("\n", stdout);
        return REPL_INTERRUPT;
    }
    if (k < 0) return REPL_EOF;
    *line = r->line, *n = chomp(r->line, (size_t)k);
    return REPL_LINE;
}

// ---- libedit ------------------------------------------------------------------------

#ifdef VARENT_LIBEDIT
static char *prompt_of(EditLine *el) {
    repl *r;
    el_get(el, EL_CLIENTDATA, &r);
    return (char *)r->prompt;
}

static unsigned char on_ctrl_c(EditLine *el, int ch) {
    repl *r;
    el_get(el, EL_CLIENTDATA, &r);
    const LineInfo *li = el_line(el);
    r->ctrl_c = 1;
    r->ctrl_c_text = li->lastchar > li->buffer;
    return CC_EOF;
}

// The text of a bracketed paste, up to ESC [ 201 ~, with CR and CRLF made LF.
static char *read_paste(EditLine *el) {
    static const char end[] = "\033[201~";
    size_t n = 0, cap = 256, m = strlen(end);
    char *s = malloc(cap), c;
    while (s && el_getc(el, &c) == 1) {
        if (n + 2 > cap) {
            char *p = realloc(s, cap *= 2);
            if (!p) return free(s), NULL;
            s = p;
        }
        s[n++] = c;
        if (n >= m && !memcmp(s + n - m, end, m)) {
            n -= m;
            break;
        }
    }
    if (!s) return NULL;
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\r' && i + 1 < n && s[i + 1] == '\n') continue;
        s[w++] = s[i] == '\r' ? '\n' : s[i];
    }
    s[w] = 0;
    return s;
}

// A paste without newlines is typed in; with newlines its first line ends this edit,
// the middle lines are shown and kept, and the last line is editable on the next.
static unsigned char on_paste(EditLine *el, int ch) {
    repl *r;
    el_get(el, EL_CLIENTDATA, &r);
    char *s = read_paste(el);
    if (!s) return CC_REFRESH_BEEP;
    char *first = strchr(s, '\n'), *last = strrchr(s, '\n');
    if (!first) {
        el_insertstr(el, s);
        free(s);
        return CC_REFRESH;
    }
    *first = 0;
    if (s[0]) el_insertstr(el, s);
    *last = 0;
    r->paste_mid = first != last ? strdup(first + 1) : NULL;
    r->paste_tail = strdup(last + 1);
    r->pasted = 1;
    free(s);
    return CC_NEWLINE;
}

static void history_path(repl *r) {
    const char *env = getenv("VARENT_HISTORY"), *state = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
    r->hist_path[0] = 0;
    if (env) {
        snprintf(r->hist_path, sizeof r->hist_path, "%s", env);
        return;
    }
    char dir[4000];
    if (state && state[0] == '/') snprintf(dir, sizeof dir, "%s/varent", state);
    else if (home && home[0]) snprintf(dir, sizeof dir, "%s/.local/state/varent", home);
    else return;
    for (char *p = dir + 1; *p; p++)  // mkdir -p; a failure only loses the history
        if (*p == '/') *p = 0, mkdir(dir, 0700), *p = '/';
    mkdir(dir, 0700);
    snprintf(r->hist_path, sizeof r->hist_path, "%s/chat_history", dir);
}

static int edit_open(repl *r) {
    HistEvent ev;
    r->el = el_init("varent", stdin, stdout, stderr);
    r->hist = history_init();
    if (!r->el || !r->hist) return -1;
    history(r->hist, &ev, H_SETSIZE, 1000);
    history(r->hist, &ev, H_SETUNIQUE, 1);
    history_path(r);
    if (r->hist_path[0]) history(r->hist, &ev, H_LOAD, r->hist_path);
    el_set(r->el, EL_CLIENTDATA, r);
    el_set(r->el, EL_EDITOR, "emacs");
    el_set(r->el, EL_SIGNAL, 1);
    el_set(r->el, EL_PROMPT, prompt_of);
    el_set(r->el, EL_HIST, history, r->hist);
    el_set(r->el, EL_SETTY, "-d", "-isig", NULL);  // Ctrl-C is a key while editing
    el_set(r->el, EL_ADDFN, "varent-interrupt", "drop the line", on_ctrl_c);
    el_set(r->el, EL_BIND, "^C", "varent-interrupt", NULL);
    el_set(r->el, EL_ADDFN, "varent-paste", "bracketed paste", on_paste);
    el_set(r->el, EL_BIND, "\\e[200~", "varent-paste", NULL);
    el_source(r->el, NULL);  // ~/.editrc
    return 0;
}

static void edit_close(repl *r) {
    if (r->hist && r->hist_path[0]) {  // written beside and renamed: a crash never truncates it
        HistEvent ev;
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s.tmp.%ld", r->hist_path, (long)getpid());
        if (history(r->hist, &ev, H_SAVE, tmp) < 0 || rename(tmp, r->hist_path) != 0) unlink(tmp);
    }
    if (r->el) el_end(r->el);
    if (r->hist) history_end(r->hist);
    free(r->paste_mid), free(r->paste_tail);
}

static repl_status edit_line(repl *r, const char *prompt, const char **line, size_t *n) {
    r->prompt = prompt;
    r->ctrl_c = r->ctrl_c_text = r->pasted = 0;
    free(r->paste_mid);
    r->paste_mid = NULL;
    if (r->paste_tail) {
        el_push(r->el, r->paste_tail);
        free(r->paste_tail);
        r->paste_tail = NULL;
    }
    fputs("\033[?2004h", stdout), fflush(stdout);  // bracketed paste on only while editing
    int k = 0;
    const char *s = el_gets(r->el, &k);
    fputs("\033[?2004l", stdout), fflush(stdout);
    if (r->ctrl_c) {
        fputs("^C\n", stdout), fflush(stdout);
        return REPL_INTERRUPT;
    }
    if (!s || k <= 0) return REPL_EOF;
    *line = s, *n = chomp(s, (size_t)k);
    // A paste's first line ends the edit before libedit draws it or moves on (no Enter
    // was typed): it is drawn here, after the prompt already on the screen.
    if (r->pasted) printf("%.*s\n", (int)*n, s), fflush(stdout);
    return REPL_LINE;
}
#endif

// ---- one message --------------------------------------------------------------------

static int dropped_text(const repl *r) {
#ifdef VARENT_LIBEDIT
    return r->ctrl_c_text;
#else
    return 0;
#endif
}

static repl_status read_line(repl *r, const char *prompt, const char **line, size_t *n, int *pasted) {
    *pasted = 0;
#ifdef VARENT_LIBEDIT
    if (r->el) {
        repl_status st = edit_line(r, prompt, line, n);
        *pasted = st == REPL_LINE && r->pasted;
        return st;
    }
#endif
    return plain_line(r, prompt, line, n);
}

// The middle lines of a paste: shown as continuation lines and kept.
static int take_paste_mid(repl *r, const char *cont) {
#ifdef VARENT_LIBEDIT
    if (!r->paste_mid) return 0;
    for (const char *p = r->paste_mid; p;) {
        const char *nl = strchr(p, '\n');
        size_t k = nl ? (size_t)(nl - p) : strlen(p);
        printf("%s%.*s\n", cont, (int)k, p);
        p = nl ? nl + 1 : NULL;
    }
    fflush(stdout);
    return append(r, r->paste_mid, strlen(r->paste_mid)) || append(r, "\n", 1);
#else
    return 0;
#endif
}

static repl_status read_message(repl *r, const char *prompt, const char *cont_prompt, const char **out) {
    r->len = 0;
    if (append(r, "", 0)) return REPL_EOF;
    for (const char *p = prompt;; p = cont_prompt) {
        const char *line;
        size_t n;
        int pasted;
        repl_status st = read_line(r, p, &line, &n, &pasted);
        if (st == REPL_INTERRUPT) {
            *out = r->len > 0 || dropped_text(r) ? "(dropped)" : "";
            r->len = 0;
            return st;
        }
        if (st == REPL_EOF) {
            if (r->len == 0) return st;
            break;  // end of input inside a continued message: send what there is
        }
        int more = pasted || (n > 0 && line[n - 1] == '\\');
        if (!pasted && more) n--;
        if (append(r, line, n) || (more && append(r, "\n", 1)) || (pasted && take_paste_mid(r, cont_prompt)))
            return REPL_EOF;
        if (!more) break;
    }
    *out = r->msg;
    return REPL_LINE;
}

static repl_status ask(repl *r, const char *question, const char **out) {
    const char *line;
    size_t n;
    int pasted;
    repl_status st = read_line(r, question, &line, &n, &pasted);
    if (st != REPL_LINE) return st;
    r->len = 0;
    if (append(r, line, n)) return REPL_EOF;
    *out = r->msg;
    return st;
}

// Under mpirun the terminal is rank 0's: it reads, and every rank gets its status and
// text (host/cli/ranks.h), so all of them run the same turn.
static repl_status shared(repl *r, repl_status st, const char **out) {
    tp_mpi *w = cli_ranks_world();
    if (!w || tp_mpi_size(w) < 2) return st;
    char *text = st != REPL_EOF && *out ? strdup(*out) : NULL;
    long len = text ? (long)strlen(text) : 0;
    int status = (int)st;
    if (cli_ranks_share(&text, &len, &status)) return REPL_EOF;
    r->len = 0;
    if (text && append(r, text, (size_t)len)) status = REPL_EOF;
    free(text);
    *out = r->msg;
    return (repl_status)status;
}

static int reads_here(void) { return !cli_ranks_world() || tp_mpi_rank(cli_ranks_world()) == 0; }

repl_status repl_read(repl *r, const char *prompt, const char *cont_prompt, const char **out) {
    *out = NULL;
    repl_status st = reads_here() ? read_message(r, prompt, cont_prompt, out) : REPL_EOF;
    return shared(r, st, out);
}

repl_status repl_ask(repl *r, const char *question, const char **out) {
    *out = NULL;
    repl_status st = reads_here() ? ask(r, question, out) : REPL_EOF;
    return shared(r, st, out);
}

void repl_history_add(repl *r, const char *line) {
#ifdef VARENT_LIBEDIT
    HistEvent ev;
    if (r->hist && line[0]) history(r->hist, &ev, H_ENTER, line);
#endif
}

repl *repl_open(void) {
    repl *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->tty = isatty(0) && isatty(1);
#ifdef VARENT_LIBEDIT
    if (r->tty && edit_open(r)) {  // no editor: plain lines still work
        if (r->el) el_end(r->el);
        if (r->hist) history_end(r->hist);
        r->el = NULL, r->hist = NULL;
    }
#endif
    return r;
}

void repl_close(repl *r) {
    if (!r) return;
#ifdef VARENT_LIBEDIT
    edit_close(r);
#endif
    free(r->msg), free(r->line), free(r);
}

int repl_tty(const repl *r) { return r->tty; }

int repl_editing(const repl *r) {
#ifdef VARENT_LIBEDIT
    return r->el != NULL;
#else
    return 0;
#endif
}
