// lora.h: LoRA adapters (model/lora.h) applied unmerged on the device: the uses with a
// non-zero scale, their device pairs and scratch, and the registry of adapters uploaded
// to a device, which the forward that uploaded the weights holds and every forward
// sharing them reads.
#ifndef VARENT_CUDA_LORA_H
#define VARENT_CUDA_LORA_H

#include "model/cuda/core.h"
#include "model/lora.h"

struct dev_lora_reg;

typedef struct {
    const struct dev_adapter *d;
    float coef;                // scale * lora_alpha / r (or / sqrt(r))
} dev_lora_use;

// n == 0: the base model's launches.
typedef struct {
    struct dev_lora_reg *reg;  // the registry of the weights this forward reads
    long gen;                  // bumped when the uses, their coefficients or the scratch change
    dev_lora_use *use;         // [n]
    int n;
    unsigned char *on;         // [n_layers * LORA_N_PROJ]: some use adapts the projection
    float *tmp, *dy;           // device [max_T, rank], [max_T, widest projection output]
    int rank;
} dev_lora;

int cuda_lora_reg_new(struct dev_lora_reg **out, verr *err);
void cuda_lora_reg_free(struct dev_lora_reg *g);
// The adapters of u[n] (scale 0 left out) in place of the previous set, uploaded to the
// registry at their first use.
int cuda_lora_set(cuda_core *f, dev_lora *L, const lora_use *u, int n, verr *err);
// Some adapter in use adapts projection p of layer l.
static inline int cuda_lora_on(const cuda_core *f, const dev_lora *L, int l, lora_proj p) {
    (void)f;
    return L->n && L->on[(size_t)l * LORA_N_PROJ + p];
}
// y[T, n_out] += coef * B (A x) over the uses, x [T, n_in] (this share's widths). decode:
// T rows of one token (the matvec rows kernels, graph-friendly); else a prefill chunk.
int cuda_lora_apply(cuda_core *f, const dev_lora *L, int l, lora_proj p, float *y, const float *x, int T, int decode,
                    verr *err);
// The uses and scratch (not the registry).
void cuda_lora_free(dev_lora *L);

#endif
