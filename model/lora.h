// lora.h: LoRA adapters in PEFT's format (adapter_config.json +
// adapter_model.safetensors), applied unmerged: a projection y = W x becomes
// y = W x + s * c * B (A x) with c = lora_alpha / r (lora_alpha / sqrt(r) with
// use_rslora) and s the user's scale, so the base weights stay mapped read-only and
// the adapters in use can change between requests. A and B stay views into the
// adapter's mmapped file, in their stored dtype.
#ifndef VARENT_LORA_H
#define VARENT_LORA_H

#include "host/formats/safetensors.h"
#include "model/model.h"

// The projections an adapter may target (PEFT target_modules names q_proj ... down_proj).
typedef enum { LORA_Q, LORA_K, LORA_V, LORA_O, LORA_GATE, LORA_UP, LORA_DOWN, LORA_N_PROJ } lora_proj;

typedef struct {
    wref a, b;  // A [r, n_in], B [n_out, r]; a.data NULL: this projection is not adapted
} lora_pair;

typedef struct {
    char dir[4096];
    int r;              // rank (adapter_config.json "r")
    double alpha;       // "lora_alpha"
    int rslora;         // "use_rslora"
    double scaling;     // alpha / r, or alpha / sqrt(r)
    int n_layers;
    lora_pair *w;       // [n_layers * LORA_N_PROJ] (a rank's share under TP: lora_shard)
    lora_pair *whole;   // the same, uncut (== w without TP): a device cuts its own share
    int n_pairs;        // adapted projections
    st_file file;
    long id;            // unique per load: tells a device's uploaded copies apart (model/cuda/lora.c)
    void *tp_owned;     // a tensor-parallel rank's column slices of A (o_proj, down_proj)
} lora_adapter;

// An adapter to load: its PEFT directory and scale.
typedef struct {
    const char *dir;
    float scale;
} lora_spec;

// One adapter in use, with the user's scale (--lora: 1, --lora-scaled DIR S: S).
typedef struct {
    const lora_adapter *a;
    float scale;
} lora_use;

// Reads dir/adapter_config.json and dir/adapter_model.safetensors and checks them
// against m: every tensor must be a lora_A/lora_B of a q/k/v/o/gate/up/down projection
// of a layer of m, with A [r, n_in] and B [n_out, r]. DoRA, modules_to_save, embedding
// or lm_head adapters, bias training, fan_in_fan_out and per-module rank or alpha
// patterns are refused; a tensor of a module PEFT would not have adapted
// (target_modules, exclude_modules, layers_to_transform: model/lora_targets.h) and a
// NaN or infinite value are errors. Errors name the file and the key. On a shard (m->tp.size > 1)
// the pairs are cut like the weights (lora_shard). 0, or -1 with err.
int lora_load(lora_adapter *a, const model *m, const char *dir, verr *err);
void lora_free(lora_adapter *a);
// The coefficient scale * a->scaling must be a float (the forwards take it as one):
// 0, or -1 with err naming the adapter.
int lora_check_scale(const lora_adapter *a, double scale, verr *err);
// Tensor parallelism: cuts a's pairs to rank s's share, as model_shard cuts W. Column-
// split projections (q/k/v, gate/up) keep A whole and view B's rows of the rank's
// outputs; row-split ones (o, down) keep B whole and copy A's columns of the rank's
// inputs, so each rank's B (A_local x_local) is a partial sum the existing all-reduce
// completes (B A x = sum over ranks of B A_r x_r).
int lora_shard(lora_adapter *a, const model_config *c, const tp_shard *s, verr *err);
// The inputs (o, down) or outputs (the others) of projection p that rank s holds:
// [first, first + count).
void lora_shard_range(const model_config *c, const tp_shard *s, lora_proj p, size_t *first, size_t *count);
// The pair of layer l, projection p (a.data NULL when not adapted).
static inline const lora_pair *lora_get(const lora_adapter *a, int l, lora_proj p) {
    return &a->w[(size_t)l * LORA_N_PROJ + p];
}
// Input and output widths of projection p of m.
void lora_proj_dims(const model_config *c, lora_proj p, int *n_in, int *n_out);
const char *lora_proj_name(lora_proj p);  // "q_proj", ...
// The largest rank of the adapters in use (0 when none).
int lora_max_rank(const lora_use *u, int n);

// CPU: y[T, n_out] += sum over u of scale * scaling * B (A x) for projection p of layer
// l, x [T, n_in]. tmp holds T * rank floats, dy T * n_out. Uses with scale 0 are skipped,
// so they leave y bit for bit as it was. rows: each row summed as a row alone
// (cpu_matmul_rows: a decode batch), else cpu_matmul.
void lora_apply(const lora_use *u, int n, int l, lora_proj p, float *y, const float *x, int T, int n_in, int n_out,
                float *tmp, float *dy, int rows);

#endif
