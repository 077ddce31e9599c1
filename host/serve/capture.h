// capture.h: `serve --dump-acts DIR` and `--dump-attn DIR` (docs/server.md, "Captures"):
// each finished choice's activations (attention weights) in one safetensors file in DIR,
// named by the response's id and a random part (cmpl-ID-R.safetensors;
// cmpl-ID-R.cI.safetensors for choice I of a request with several choices), written when
// the choice ends (FILE.tmp.PID renamed into place, never over an existing name, no link
// followed) and named in the choice's "capture" member. At most --dump-max-files choices
// are captured per server run; later ones say so in that member. A choice that fails,
// is cancelled or is cut by a shutdown leaves no file and is not counted.
#ifndef VARENT_SERVE_CAPTURE_H
#define VARENT_SERVE_CAPTURE_H

#include "host/serve/internal.h"

typedef struct {
    int active;        // the server dumps: this choice has a "capture" member
    int reserved;      // one of --dump-max-files is this choice's
    probe *pr;         // this choice's probe (files and statistics); NULL: none
    char name[128];    // the file name in each DIR
    char acts[4200], attn[4200];
    char note[512];    // the member (",\"capture\":{...}"), once known
    int *gen, n_gen, cap_gen, oom;  // the generated ids (serve_cap_push)
} serve_cap;

// Whether the server writes capture files.
int serve_cap_dumps(const server_opts *o);
// Before choice index of j runs on ss (after its prompt scoring): its probe when the
// server dumps; over the limit, the statistics alone (--attn-layers, --logit-lens).
int serve_cap_open(server *s, const server_job *j, int index, session *ss, serve_cap *c, verr *err);
// Each generated id, in order (the files' "ids" after the prompt's).
void serve_cap_push(serve_cap *c, int id);
// After it: keep writes the files (ids: the prompt, then the generated ids) and sets the
// note; a write that fails is reported in the note (the choice itself stands).
void serve_cap_close(server *s, serve_cap *c, int keep, const int *prompt, int n_prompt);

#endif
