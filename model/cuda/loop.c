// loop.c: the device decode loop (model/forward_cuda.h, docs/cuda.md "The device decode
// loop"). The host queues one-row decode steps ahead; each feeds the token its
// predecessor drew, read from the step block on the device, which the step's last launch
// (cuda_loop_advance) moves one position on: the token, position, cache row and key
// counts. Each step ends by copying the ring (a few entries of token, logit and the 8
// statistics) to pinned memory and recording an event; the host reads the ring a few
// steps behind, waiting on one event per several steps, and when a stop lands inside
// the look-ahead it keeps only the steps the per-token loop would have run: the cache's
// length goes back, and the rows written past it are never read. The greedy draw is the
// lm_head's argmax epilogue (or the persistent kernel's argmax); a stock draw is
// cuda_sample with a configuration the host wrote ahead into a ring of its own (the
// uniform it peeks from its stream), picked on the device by the step's first launch.
#include "model/forward_cuda.h"

#ifndef VARENT_CUDA
typedef int cuda_loop_unused;  // absent.c has the calls of a build without CUDA
#else

#include <math.h>
#include <string.h>

#include "model/cuda/internal.h"

void cuda_loop_free(cuda_forward *d) {
    dev_loop *L = &d->loop;
    cuda_free(L->d_state);
    if (L->h_ring) cudaFreeHost(L->h_ring);
    if (L->h_cfgs) cudaFreeHost(L->h_cfgs);
    for (int i = 0; i < L->n_ev; i++) cudaEventDestroy(L->ev[i]);
    L->d_state = NULL, L->h_ring = NULL, L->h_cfgs = NULL, L->n_ev = 0;
}

// The loop's buffers, made at its first start: one device block (state, ring,
// configurations, the step's configuration and draw), the pinned rings and the events.
static int setup(cuda_forward *d, verr *err) {
    dev_loop *L = &d->loop;
    if (L->d_state) return 0;
    size_t n = CUDA_LOOP_DEPTH;
    size_t bytes = 64 + sizeof(loop_entry) * n + sizeof(sample_cfg) * (n + 1) + sizeof(sample_out);
    if (cuda_malloc((void **)&L->d_state, bytes, "device decode loop", err)) return -1;
    char *p = (char *)L->d_state + 64;
    L->d_ring = (loop_entry *)p;
    L->d_cfgs = (sample_cfg *)(p + sizeof(loop_entry) * n);
    L->d_cfg = L->d_cfgs + n;
    L->d_draw = (sample_out *)(L->d_cfg + 1);
    CK(cudaHostAlloc((void **)&L->h_ring, sizeof(loop_entry) * n, cudaHostAllocDefault));
    CK(cudaHostAlloc((void **)&L->h_cfgs, sizeof(sample_cfg) * n, cudaHostAllocDefault));
    memset(L->h_ring, 0, sizeof(loop_entry) * n);
    memset(L->h_cfgs, 0, sizeof(sample_cfg) * n);
    for (; L->n_ev < CUDA_LOOP_DEPTH; L->n_ev++)
        CK(cudaEventCreateWithFlags(&L->ev[L->n_ev], cudaEventDisableTiming));
    return 0;
}

const char *cuda_forward_loop_blocker(const cuda_forward *d, const forward_state *fw) {
    if (fw->hooks) return "forward hooks (captures and interventions reach the host every token)";
    if (d->tp.comm) return "tensor parallelism";
    if (fw->copy_scores) return "attention scores copied back every token";
    return NULL;
}

int cuda_forward_loop_begin(cuda_forward *d, forward_state *fw, kv_view *kv, int token, int greedy, int depth,
                            verr *err) {
    cuda_core *f = &d->core;
    dev_loop *L = &d->loop;
    const char *why = cuda_forward_loop_blocker(d, fw);
    if (why) return verr_set(err, "the device decode loop cannot run with %s", why);
    if (L->on) return verr_set(err, "cuda_forward_loop_begin: a loop is already running");
    if (depth < 1 || depth > CUDA_LOOP_DEPTH)
        return verr_set(err, "the decode look-ahead is %d steps: 1..%d", depth, CUDA_LOOP_DEPTH);
    if (token < 0 || token >= f->m->cfg.vocab_size)
        return verr_set(err, "token id %d is out of range (vocab_size %d)", token, f->m->cfg.vocab_size);
    if (kv_view_room(kv) < 1 || kv_view_len(kv) + 1 > f->max_ctx)
        return verr_set(err, "1 token does not fit: %d of the %d-token context are used", kv_view_len(kv), f->max_ctx);
    if (!kv->trunk->dk || (kv->tail && !kv->tail->dk))
        return verr_set(err, "the device decode loop needs device KV caches");
    OP(cuda_activate(&f->ctx));
    if (cuda_forward_wait(d, err) || cuda_hooks_sync(f, &d->hk, NULL, err) || setup(d, err)) return -1;
    // without the lm_head's epilogue a greedy step draws through cuda_sample at temperature 0
    L->greedy = greedy && !d->arm.greedy_off;
    if (L->greedy && cuda_arm_greedy_prepare(&d->arm, err)) return -1;
    L->depth = depth;
    L->cap = fw->attn_layer >= 0 && fw->attn_layer < f->m->cfg.n_layers ? fw->attn_layer : -1;
    cuda_core_fill_decode(f, kv, &token, 1);
    loop_state st0 = { 0, depth, kv->tail != NULL, 0 };
    CK(cudaMemcpyAsync(f->d_par, f->h_par, f->par_bytes, cudaMemcpyHostToDevice, f->ctx.stream));
    CK(cudaMemcpyAsync(L->d_state, &st0, sizeof st0, cudaMemcpyHostToDevice, f->ctx.stream));  // staged now
    f->par_pending = 1;
    L->dst = kv->tail ? kv->tail : kv->trunk;
    L->len0 = L->dst->len, L->n_trunk0 = kv->n_trunk;
    L->queued = L->known = L->read = 0;
    L->on = 1;
    L->runs++;
    d->arm.armed = 0, d->arm.ready = 0;  // the loop draws itself
    fw->dev_stats = 0, f->logits_stale = 0, f->logits_valid = 0, f->logits_overrun = 0, f->batch_rows = 0;
    return 0;
}

int cuda_loop_head(cuda_forward *d, verr *err) {
    cuda_core *f = &d->core;
    dev_loop *L = &d->loop;
    if (L->greedy) return 0;
    size_t n = sizeof(sample_cfg) * CUDA_LOOP_DEPTH;  // all slots: a graph's copy has fixed addresses
    CK(cudaMemcpyAsync(L->d_cfgs, L->h_cfgs, n, cudaMemcpyHostToDevice, f->ctx.stream));
    OP(cuda_loop_pick(&f->ctx, L->d_cfg, L->d_cfgs, L->d_state));
    return 0;
}

// The draw (unless made: the persistent kernel's argmax), the bookkeeping, the ring back.
static int tail(cuda_forward *d, int drawn, verr *err) {
    cuda_core *f = &d->core;
    dev_loop *L = &d->loop;
    if (!drawn && L->greedy) OP(cuda_argmax_finish(&f->ctx, L->d_draw, f->logits, d->arm.d_amax));
    if (!drawn && !L->greedy) OP(cuda_sample(&f->ctx, L->d_draw, f->logits, f->m->cfg.vocab_size, L->d_cfg, 1));
    step_params dp = cuda_core_params(f, f->d_par);
    const float *vs = L->cap >= 0 ? f->stats : NULL, *as = L->cap >= 0 ? f->stats + 4 * (size_t)f->rows : NULL;
    OP(cuda_loop_advance(&f->ctx, L->d_state, L->d_ring, L->d_draw, vs, as, dp.lens, dp.ids, dp.pos, dp.rows));
    CK(cudaMemcpyAsync(L->h_ring, L->d_ring, sizeof(loop_entry) * CUDA_LOOP_DEPTH, cudaMemcpyDeviceToHost,
                       f->ctx.stream));
    return 0;
}

int cuda_loop_tail(cuda_forward *d, verr *err) { return tail(d, 0, err); }

// One step on the persistent kernel when it takes it (1), else 0; -1 on error.
static int persistent_step(cuda_forward *d, verr *err) {
    dev_loop *L = &d->loop;
    if (!cuda_tune_wants(d)) return 0;
    if (cuda_loop_head(d, err)) return -1;  // (a fallback's graph picks again: the same configuration)
    int r = cuda_persist_loop_step(d, L->cap, L->greedy ? L->d_draw : NULL, err);
    if (r <= 0) return r;
    return tail(d, L->greedy, err) ? -1 : 1;
}

// One step launched kernel by kernel (graphs off).
static int plain_step(cuda_forward *d, verr *err) {
    dev_loop *L = &d->loop;
    if (cuda_loop_head(d, err)) return -1;
    d->greedy_amax = L->greedy ? d->arm.d_amax : NULL;
    int rc = cuda_step_decode(d, 1, L->cap, 0, err);
    d->greedy_amax = NULL;
    return rc ? -1 : tail(d, 0, err);
}

int cuda_forward_loop_queue(cuda_forward *d, const sample_cfg *cfg, verr *err) {
    cuda_core *f = &d->core;
    dev_loop *L = &d->loop;
    if (!L->on) return verr_set(err, "cuda_forward_loop_queue: no loop is running");
    int j = L->queued, slot = j % L->depth;
    if (j >= L->read + L->depth)
        return verr_set(err, "cuda_forward_loop_queue: step %d would overwrite ring slot %d before step %d is read", j,
                        slot, j - L->depth);
    if (L->len0 + j + 1 > L->dst->ctx || f->last_keys + j > f->max_ctx)
        return verr_set(err, "cuda_forward_loop_queue: step %d does not fit in the context", j);
    const sample_cfg greedy_cfg = { 0.f, 0, 1.f, 0.f, 0.0 };
    if (!L->greedy) L->h_cfgs[slot] = cfg ? *cfg : greedy_cfg;
    OP(cuda_activate(&f->ctx));
    if (cuda_tune_begin(d, err)) return -1;
    int r = persistent_step(d, err);
    if (r < 0) return -1;
    if (r == 0) {
        int kind = L->greedy ? ARM_LOOP_GREEDY : ARM_LOOP_STOCK;
        if (d->use_graph ? cuda_graph_decode(d, 1, L->cap, 0, kind, err) : plain_step(d, err)) return -1;
    }
    if (cuda_tune_end(d, r, err)) return -1;
    CK(cudaEventRecord(L->ev[slot], f->ctx.stream));
    L->queued++;
    L->steps++;
    return 0;
}

int cuda_forward_loop_read(cuda_forward *d, int j, int ahead, loop_entry *out, verr *err) {
    cuda_core *f = &d->core;
    dev_loop *L = &d->loop;
    if (!L->on || j < 0 || j >= L->queued || L->queued - j > L->depth)
        return verr_set(err, "cuda_forward_loop_read: step %d is not in the ring (%d queued, %d slots)", j, L->queued,
                        L->depth);
    if (j >= L->known) {  // one wait covers this step and up to ahead - 1 after it
        int t = j + (ahead > 1 ? ahead : 1) - 1;
        if (t > L->queued - 1) t = L->queued - 1;
        OP(cuda_activate(&f->ctx));
        f->ctx.n_syncs++;
        cudaError_t e = cudaEventSynchronize(L->ev[t % L->depth]);
        if (e != cudaSuccess)
            return verr_set(err, "CUDA forward pass failed: %s (%s:%d)", cudaGetErrorString(e), __FILE__, __LINE__);
        L->known = t + 1;
    }
    *out = L->h_ring[j % L->depth];
    if (L->read < j + 1) L->read = j + 1;
    if (out->token < 0 || out->token >= f->m->cfg.vocab_size)
        return verr_set(err, "the device decode loop drew token %d at step %d (vocab_size %d)", out->token, j,
                        f->m->cfg.vocab_size);
    if (!isfinite(out->logit)) return cuda_core_nonfinite(f, out->pos - 1, out->token, out->logit, err);
    return 0;
}

int cuda_forward_loop_end(cuda_forward *d, forward_state *fw, kv_view *kv, int kept, verr *err) {
    cuda_core *f = &d->core;
    dev_loop *L = &d->loop;
    if (!L->on) return 0;
    L->on = 0;
    int rc = 0;
    if (kept < 0 || kept > L->queued) {
        rc = verr_set(err, "cuda_forward_loop_end: %d steps kept of %d queued", kept, L->queued);
        kept = 0;
    }
    if (L->queued > L->known) {  // the steps past the last wait (the look-ahead, or a stop's overshoot)
        f->ctx.n_syncs++;
        cudaError_t e = cudaStreamSynchronize(f->ctx.stream);
        if (e != cudaSuccess && rc == 0)
            rc = verr_set(err, "CUDA forward pass failed: %s (%s:%d)", cudaGetErrorString(e), __FILE__, __LINE__);
    }
    f->par_pending = 0;
    // the steps the per-token loop would have run; the rows past them are never read
    L->dst->len = L->len0 + kept;
    kv->n_trunk = kv->tail ? L->n_trunk0 : kv->trunk->len;
    L->discarded += L->queued - kept;
    f->last_keys = kv_view_len(kv);
    if (rc == 0 && kept > 0 && L->cap >= 0) {  // the last kept step's statistics, as its forward leaves them
        const loop_entry *e = &L->h_ring[(kept - 1) % L->depth];
        memcpy(fw->logit_stats, e->stats, sizeof fw->logit_stats);
        memcpy(fw->attn_stats, e->stats + 4, sizeof fw->attn_stats);
        fw->attn_keys = e->pos;
        fw->dev_stats = 1;
    }
    // the device's logits are the last queued step's: the last kept one's only without overshoot
    f->sample_row = 0;
    f->logits_valid = rc == 0 && kept > 0 && kept == L->queued;
    f->logits_overrun = rc == 0 && kept > 0 && kept < L->queued;
    f->logits_stale = f->logits_valid;
    return rc;
}

void cuda_forward_loop_counts(const cuda_forward *d, cuda_loop_counts *out) {
    *out = (cuda_loop_counts){ d->loop.runs, d->loop.steps, d->loop.discarded };
}

#endif
