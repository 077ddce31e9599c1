// hooks.h: optional interventions on the forward pass and captures of what it computes,
// for experiments on weights (docs/research.md). A forward_state without hooks (NULL,
// the default) runs the plain pass; each hook costs one branch per layer when unset.
//   interventions: a control vector added to each block's output, attention heads
//     zeroed before o_proj, whole blocks skipped (the identity);
//   captures: the residual stream and the block outputs of single-sequence forwards, and
//     the last query's attention scores at chosen layers.
#ifndef VARENT_HOOKS_H
#define VARENT_HOOKS_H

// Where in a decoder block an activation is read (bit i of forward_hooks.points).
typedef enum {
    HOOK_RESID_PRE = 0,   // the block's input
    HOOK_RESID_MID = 1,   // after the attention residual add
    HOOK_RESID_POST = 2,  // the block's output (the control vector included)
    HOOK_ATTN_OUT = 3,    // o_proj's output, before the add
    HOOK_MLP_OUT = 4,     // down_proj's output, before the add
    HOOK_NPOINTS
} hook_point;

// The names used in files and on the command line ("resid_pre", ...).
const char *hook_point_name(int point);
// The point of a name, or -1.
int hook_point_parse(const char *name);

typedef struct forward_hooks {
    // Interventions (every forward, batches included). NULL: none.
    const float *cvec;            // [n_layers, dim]: added to block l's output where cvec_on[l]
    const unsigned char *cvec_on; // [n_layers]
    const unsigned char *ablate;  // [n_layers, n_heads]: 1 zeroes head h's attention output
    const unsigned char *skip;    // [n_layers]: 1 makes block l the identity (its KV rows unwritten)
    // Captures (single-sequence forwards only: prefill, decode, scoring).
    const unsigned char *act_layers;  // [n_layers]: layers whose points go to on_act; NULL: none
    unsigned points;                  // bit mask of hook_point
    // rows [T, dim] of the chunk's positions pos0.. at one layer and point
    void (*on_act)(void *ud, int layer, int point, const float *x, int T, int pos0);
    const unsigned char *attn_layers; // [n_layers]: layers whose last-query scores go to on_attn
    // scores [n_heads, keys], scaled and pre-softmax, of the last query of the forward
    // call (the last chunk's last row)
    void (*on_attn)(void *ud, int layer, const float *scores, int keys);
    float *attn_buf;                  // [n_heads, ctx] scratch for those scores (owner: the caller)
    void *ud;
} forward_hooks;

#endif
