// loop.c: the CPU twins of the device decode loop's bookkeeping (kernels/cuda/loop.cu):
// what one step leaves in the ring and in the step block, written out plainly.
#include <string.h>

#include "kernels/ops.h"

void cpu_loop_advance(loop_state *st, loop_entry *ring, const sample_out *draw, const float *vstats,
                      const float *astats, int lens[2], int *ids, int *pos, int *rows) {
    loop_entry e;
    memset(&e, 0, sizeof e);
    e.token = draw->token;
    e.logit = draw->logit;
    e.pos = pos[0] + 1;
    if (vstats) memcpy(e.stats, vstats, 4 * sizeof(float));
    if (astats) memcpy(e.stats + 4, astats, 4 * sizeof(float));
    ring[st->step % st->depth] = e;
    ids[0] = draw->token;
    pos[0] += 1;
    rows[0] += 1;
    if (!st->tail) lens[0] += 1;
    lens[1] += 1;
    st->step += 1;
}

void cpu_loop_pick(sample_cfg *out, const sample_cfg *cfgs, const loop_state *st) {
    *out = cfgs[st->step % st->depth];
}
