// devloop.h: generate()'s decode loop on the device (model/forward_cuda.h's
// cuda_forward_loop_*, docs/cuda.md "The device decode loop"): after the first
// generated token, the steps feed their own draws on the device and the host reads the
// tokens a few steps behind, with the same tokens, records, statistics and cache as the
// per-token loop of generate().
#ifndef VARENT_DEVLOOP_H
#define VARENT_DEVLOOP_H

#include "host/decode/gen_step.h"

// Why this run takes the per-token loop (NULL: the device loop can run it): something
// the host needs every token, or no CUDA session, or --lookahead 0.
const char *gen_devloop_blocker(const gen_ctx *c);
// The rest of the run from the emitted token tok (not yet fed; the context has room),
// as generate()'s loop would run it: its stop ids, callbacks, max_new, full context and
// interrupt, the cache left as long as the steps that loop would have run.
int gen_devloop_run(gen_ctx *c, gen_stats *st, int tok, verr *err);

#endif
