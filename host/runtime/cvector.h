// cvector.h: control vectors from contrasting prompts, as llama.cpp's cvector-generator
// makes them, in its GGUF format (host/runtime/steer.h reads it back). For each pair of
// prompts (positive, negative; ids padded to one length by the caller) the block outputs
// of both run through the model, and every position's difference positive - negative
// at block l (rows that are all zero, like the shared BOS, dropped) is one sample of
// layer l. mean: the samples' mean, scaled to unit length. pca: the leading eigenvector
// of the samples' uncentred second moment (power iteration), signed to agree with the
// mean. The direction of block l is saved as direction.(l+1), as llama.cpp does (its
// reader adds direction.il to the output of block il), for blocks 0..n_layers-2.
#ifndef VARENT_CVECTOR_H
#define VARENT_CVECTOR_H

#include "host/runtime/session.h"

typedef enum { CVEC_MEAN = 0, CVEC_PCA = 1 } cvec_method;

// dirs [n_layers - 1, dim] receives the unit directions of blocks 0..n_layers-2 (zeros
// for a layer without samples). pos[i] and neg[i] hold n[i] ids each. CPU sessions.
int cvec_train(session *s, int **pos, int **neg, const int *n, int n_pairs, cvec_method method, float *dirs,
               verr *err);
// The GGUF file: general.architecture "controlvector", controlvector.model_hint,
// controlvector.layer_count, direction.1 .. direction.(n_layers-1). Atomic.
int cvec_save(const char *path, const model_config *c, const char *model_hint, const float *dirs, verr *err);

#endif
