// plot_log.h: the per-token series `varent plot` draws, read from a JSONL log:
//   - `--metrics-out` lines (docs/entropix.md): one token each, with entropy,
//     varentropy and the quadrant;
//   - agents logs (`varent agents --log`): "step" events are tokens (entropy of the chosen
//     proposal; varentropy and quadrant when the record carries them; a lookahead
//     step's "tokens" array counts as that many tokens for rollbacks), "rollback" and
//     "critic" events are markers; the steps whose tokens a rollback removed are flagged.
// Other events ("done", unknown ones) are ignored; blank lines are skipped.
#ifndef VARENT_PLOT_LOG_H
#define VARENT_PLOT_LOG_H

#include "host/util/err.h"

typedef struct {
    int pos, token;
    char *text;              // the token's text ("" when the log has none)
    double entropy;          // bits
    double varentropy;       // bits^2; NAN when the log has none
    int quadrant;            // entropix_quadrant, or -1 when unknown
    int n_tok;               // tokens it stands for (an agents lookahead step commits several)
    int discarded;           // removed by a later rollback
    int line;                // line in the log
} plot_token;

typedef enum { EV_ROLLBACK, EV_CRITIC } plot_event_kind;

typedef struct {
    plot_event_kind kind;
    int at;                  // tokens before the event (the marker goes between at-1 and at)
    int from_pos, to_pos, removed;  // rollback
    int bad;                 // critic verdict BAD
    char action[16];         // critic action: none | rollback | accept
} plot_event;

typedef struct {
    plot_token *tok;
    int n, cap;
    plot_event *ev;
    int n_ev, cap_ev;
    int n_varentropy;        // tokens with a varentropy
    int agents;              // 1: the log had agents step events
} plot_log;

// Reads the log; -1 with err naming the file, line and field on malformed input, or
// when it holds no tokens.
int plot_log_read(plot_log *l, const char *path, verr *err);
void plot_log_free(plot_log *l);

#endif
