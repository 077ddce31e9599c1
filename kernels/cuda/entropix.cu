// entropix.cu: the entropix decision on the device (kernels/entropix_core.h), so a
// decode step can decide and draw right after its statistics and bring the token back
// with them in one host round trip (model/forward_cuda.c, "armed" steps). Compiled with
// -fmad=false (the Makefile): the host compiles the same code without contractions, so
// both make the same parameters to the bit.
#include "kernels/entropix_core.h"
#include "kernels/cuda/common.cuh"

// One thread: the metrics from the step's statistics (logit stats {max, lse, H, V} of
// row 0, attention stats {entropy, varentropy, agreement, interaction}, as the host's
// metrics_from_stats reads them), the decision, and k draw configurations: the step's
// draws first (ex_draws), then argmax draws that only fill the launch. tokens: {the
// sequence's last token, the clarifier}, in device memory so a graph replays with the
// step's own.
__global__ void entropix_arm_kernel(sample_cfg *cfg, int k, const float *logit_stats, const float *attn_stats,
                                    const entropix_config *c, const double *u, const int *tokens) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    int prev_token = tokens[0], clarifier = tokens[1];
    double x[M_COUNT];
    x[M_ENT] = logit_stats[2], x[M_VENT] = logit_stats[3], x[M_AENT] = attn_stats[0];
    x[M_AVENT] = attn_stats[1], x[M_AGREE] = attn_stats[2], x[M_INTER] = attn_stats[3];
    entropix_step st = ex_decide(c, x, prev_token, clarifier);
    int n = ex_draws(&st, u, cfg);
    for (int i = n; i < k; i++) cfg[i] = sample_cfg{ 0.f, 1, 1.f, 0.f, 0.0 };
}

extern "C" int cuda_entropix_arm(cuda_ctx *ctx, sample_cfg *cfg, int k, const float *logit_stats,
                                 const float *attn_stats, const entropix_config *c, const double *u,
                                 const int *tokens) {
    CUDA_REQUIRE(ctx, k >= 1 && k <= ENTROPIX_MAX_SAMPLES, "cuda_entropix_arm: %d draws (1..%d)", k,
                 ENTROPIX_MAX_SAMPLES);
    entropix_arm_kernel<<<1, 32, 0, ctx->stream>>>(cfg, k, logit_stats, attn_stats, c, u, tokens);
    CUDA_CHECK_LAUNCH(ctx, "entropix_arm_kernel");
    return 0;
}
