// upload.h: a model's weights on the device (model/cuda/core.h's dev_weights): matrices
// in bf16 (f16 when stored so; f32 rounded to bf16), norms and biases widened to f32,
// wq|wk|wv and gate|up concatenated, a shard's share under tensor parallelism.
#ifndef VARENT_CUDA_UPLOAD_H
#define VARENT_CUDA_UPLOAD_H

#include "model/cuda/core.h"

// Uploads m's weights into w (one arena; a progress bar on a terminal for big models).
int cuda_weights_upload(cuda_ctx *ctx, const model *m, dev_weights *w, verr *err);
void cuda_weights_free(dev_weights *w);

#endif
