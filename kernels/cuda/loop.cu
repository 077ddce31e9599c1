// loop.cu: the device decode loop's bookkeeping (model/cuda/loop.c), one thread each:
// after a step's draw, its ring entry and the next step's token, position, cache row and
// key counts (the step block then needs no copy from the host); before a sampled step,
// its configuration from the ring the host fills ahead. Twins: kernels/cpu/loop.c.
#include "kernels/cuda/common.cuh"

__global__ void loop_advance_kernel(loop_state *st, loop_entry *ring, const sample_out *draw, const float *vstats,
                                    const float *astats, cuda_kv_lens *lens, int *ids, int *pos, int *rows) {
    loop_entry e;
    e.token = draw->token;
    e.logit = draw->logit;
    e.pos = pos[0] + 1;
    for (int i = 0; i < 4; i++) {
        e.stats[i] = vstats ? vstats[i] : 0.f;
        e.stats[4 + i] = astats ? astats[i] : 0.f;
    }
    e.pad_ = 0;
    ring[st->step % st->depth] = e;
    ids[0] = draw->token;
    pos[0] += 1;
    rows[0] += 1;
    if (!st->tail) lens[0].n_trunk += 1;
    lens[0].n_keys += 1;
    st->step += 1;
}

extern "C" int cuda_loop_advance(cuda_ctx *ctx, loop_state *st, loop_entry *ring, const sample_out *draw,
                                 const float *vstats, const float *astats, cuda_kv_lens *lens, int *ids, int *pos,
                                 int *rows) {
    CUDA_REQUIRE(ctx, st && ring && draw && lens && ids && pos && rows, "cuda_loop_advance: NULL buffer");
    loop_advance_kernel<<<1, 1, 0, ctx->stream>>>(st, ring, draw, vstats, astats, lens, ids, pos, rows);
    CUDA_CHECK_LAUNCH(ctx, "loop_advance_kernel");
    return 0;
}

__global__ void loop_pick_kernel(sample_cfg *out, const sample_cfg *cfgs, const loop_state *st) {
    *out = cfgs[st->step % st->depth];
}

extern "C" int cuda_loop_pick(cuda_ctx *ctx, sample_cfg *out, const sample_cfg *cfgs, const loop_state *st) {
    CUDA_REQUIRE(ctx, out && cfgs && st, "cuda_loop_pick: NULL buffer");
    loop_pick_kernel<<<1, 1, 0, ctx->stream>>>(out, cfgs, st);
    CUDA_CHECK_LAUNCH(ctx, "loop_pick_kernel");
    return 0;
}
