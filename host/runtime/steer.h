// steer.h: interventions on a session's forward pass, given before the model loads
// and resolved against it (docs/research.md):
//   control vectors in llama.cpp's GGUF format (general.architecture "controlvector",
//     controlvector.layer_count, F32 tensors direction.<il>): direction.il is added to
//     the output of block il (0-based; llama.cpp never steers block 0), scaled, and
//     several files sum; --control-vector-layer-range A B keeps blocks A..B;
//   head ablation (zero head H's attention output at layer L before o_proj);
//   layer skipping (block L becomes the identity).
#ifndef VARENT_STEER_H
#define VARENT_STEER_H

#include "model/hooks.h"
#include "model/model.h"

#define STEER_MAX 64  // files, heads or layers per list

typedef struct {
    const char *cvec_path[STEER_MAX];
    float cvec_scale[STEER_MAX];
    int n_cvec;
    int range_start, range_end;  // range_given 0: every block
    int range_given;
    int ablate[STEER_MAX][2];    // (layer, head)
    int n_ablate;
    int skip[STEER_MAX];
    int n_skip;
} steer_spec;

typedef struct {
    float *cvec;               // [n_layers, dim], the scaled sum of every file
    unsigned char *cvec_on;    // [n_layers]
    unsigned char *ablate;     // [n_layers, n_heads]; NULL without --ablate-head
    unsigned char *skip;       // [n_layers]; NULL without --skip-layer
    forward_hooks hooks;       // the interventions as forward hooks
} steer;

// 1 when the spec asks for anything.
int steer_spec_active(const steer_spec *sp);
// Loads and checks every file and index against m: errors name the file and key (a
// missing key, a tensor that is not F32 [dim], a layer out of range) or the flag.
int steer_open(steer *st, const steer_spec *sp, const model *m, verr *err);
void steer_free(steer *st);
// Adds scale * every direction of the control vector file path into sum [n_layers, dim]
// and marks the layers it steers in on [n_layers] (either may be NULL: only checks).
int steer_load_cvec(const char *path, const model_config *c, float scale, float *sum, unsigned char *on, verr *err);

#endif
