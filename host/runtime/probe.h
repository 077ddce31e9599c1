// probe.h: captures of a session's forward passes for experiments on weights
// (docs/research.md), installed as forward hooks (model/hooks.h) next to the session's
// interventions:
//   --dump-acts FILE: one [T, dim] F32 tensor "layers.L.POINT" per chosen layer and
//     point, a row per position fed (prompt and generated), in the order fed, with
//     "positions" [T] (I32: where each row sits; a chat turn that re-feeds a position
//     repeats it) and "ids" [T] when given;
//   --attn-layers: each forward's last-query attention entropy and varentropy (bits)
//     per layer and head, for the metrics JSONL (entropix's AttnStats, in bits);
//   --dump-attn FILE: those last-query probabilities, "layers.L.attn" [S, n_heads, K]
//     (row s: the query at positions[s], keys beyond it 0) and "positions" [S];
//   --logit-lens: the final norm and lm_head on every layer's resid_post of the last
//     position: entropy (bits) and the top-5 tokens per layer.
// Files are written whole at probe_close (rows spool to disk meanwhile), atomically,
// through host/util/outfile.h (an existing file needs spec.force).
#ifndef VARENT_PROBE_H
#define VARENT_PROBE_H

#include <stdio.h>

#include "host/runtime/session.h"

typedef struct {
    const char *acts_path;    // --dump-acts
    const char *dump_layers;  // "all" (default) or a list: 0,3,5-7
    const char *dump_points;  // comma-separated hook point names (default resid_post)
    const char *attn_layers;  // --attn-layers "all" or a list; NULL: none
    const char *attn_path;    // --dump-attn (layers: --attn-layers, default all)
    int logit_lens;
    int force;  // replace existing capture files (--force); without, an existing file is an error
    int fresh;  // the files must be new names, never followed or replaced (the server's)
} probe_spec;

typedef struct probe probe;

int probe_spec_active(const probe_spec *sp);
// Resolves the lists against s's model, opens the output files (created only at
// probe_close) and installs the hooks on s. On CUDA the device copies the captured rows
// back once per forward call and the callbacks below run on the host as on the CPU; the
// logit lens runs on the host (the final norm and lm_head of the mapped weights).
int probe_open(probe **out, const probe_spec *sp, session *s, verr *err);
// A capture that failed during a forward (a full spool disk): -1 with its message.
int probe_check(const probe *p, verr *err);
// Paused, the hooks drop what the forwards hand over (the last statistics stay): forwards
// outside the captured sequence (agents' lookahead branches). NULL: nothing.
void probe_pause(probe *p, int paused);
// Rows --dump-acts captured so far (0 without it).
long probe_rows(const probe *p);
// The last forward's attention statistics and logit lens as JSON members, each written
// with a leading comma (",\"attn_layers\":[...]"); nothing when neither was asked for.
int probe_json(probe *p, FILE *f);
// An I32 tensor [n] added to each capture file (--dump-acts and --dump-attn), written at
// probe_close: what the rows stand for beyond "ids" and "positions" (ppl's "text_pos").
int probe_add_i32(probe *p, const char *name, const int *v, int n, verr *err);
// Restores s's hooks; keep (an outfile_end: OUTFILE_DONE, or OUTFILE_PARTIAL for a run
// that stopped early) writes the files (with "ids", the first T of ids[n_ids], when they
// cover the T positions captured); OUTFILE_DROP (0) leaves nothing behind.
int probe_close(probe *p, int keep, const int *ids, int n_ids, verr *err);

#endif
