// arm.c: steps that draw on the device right after their logits. The
// decode loop arms a step before its forward: for entropix the profile, the sequence's
// last token and the next uniforms of its stream, peeked (right after the statistics the
// device runs entropix_decide's twin, kernels/entropix_core.h, then the draws); for the
// standard sampler the draw's configuration, its peeked uniform included. A one-token
// step queues the draws inside its CUDA graph (model/cuda/forward.c, graph_decode), the
// per-step values in one pinned block its memcpy node reads at each replay, and the
// step's one wait brings them back with the statistics. The host then decides for its
// records as always, and its draw request is answered from the armed draws when its
// parameters and uniforms are the device's to the bit (cuda_arm_take): one graph launch
// and one host round trip per token. Anything else (a clarifier, a LEHV branch, a mismatch) falls
// back to an ordinary draw, so arming never changes a token. The draw requests
// themselves (cuda_sample_draw) are answered here too.
#include "model/forward_cuda.h"

#ifdef VARENT_CUDA

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/cuda/arm.h"

void cuda_arm_free(dev_arm *a) {
    cuda_free(a->d_in), cuda_free(a->d_cfg), cuda_free(a->d_out), cuda_free(a->d_amax);
    a->d_amax = NULL;
    if (a->h_in) cudaFreeHost(a->h_in);
    if (a->h_cfg) cudaFreeHost(a->h_cfg);
    if (a->h_out) cudaFreeHost(a->h_out);
    a->d_in = a->h_in = NULL, a->d_cfg = a->h_cfg = NULL, a->d_out = a->h_out = NULL;
    a->cap = 0, a->in_bytes = 0, a->armed = a->ready = 0;
}

// Offsets in the per-step block: the head, the uniforms [cap], the configurations [cap].
static size_t align16(size_t n) { return (n + 15) & ~(size_t)15; }
static size_t arm_in_u(void) { return align16(sizeof(arm_head)); }
static size_t arm_in_cfg(int cap) { return align16(arm_in_u() + sizeof(double) * (size_t)cap); }

static arm_head *in_head(void *base) { return (arm_head *)base; }
static double *in_u(void *base) { return (double *)((char *)base + arm_in_u()); }
static sample_cfg *in_cfg(void *base, int cap) { return (sample_cfg *)((char *)base + arm_in_cfg(cap)); }

// Room for k draws, on the device and pinned on the host. The buffers move: a graph
// that captured the old ones is captured again (gen).
static int arm_buffers(dev_arm *a, int k, verr *err) {
    cuda_arm_free(a);
    a->gen++;
    size_t in = arm_in_cfg(k) + sizeof(sample_cfg) * (size_t)k;
    if (cuda_malloc(&a->d_in, in, "armed step block", err) ||
        cuda_malloc((void **)&a->d_cfg, sizeof *a->d_cfg * (size_t)k, "armed draws", err) ||
        cuda_malloc((void **)&a->d_out, sizeof *a->d_out * (size_t)k, "armed draws", err))
        return -1;
    CK(cudaHostAlloc(&a->h_in, in, cudaHostAllocDefault));
    CK(cudaHostAlloc((void **)&a->h_cfg, sizeof *a->h_cfg * (size_t)k, cudaHostAllocDefault));
    CK(cudaHostAlloc((void **)&a->h_out, sizeof *a->h_out * (size_t)k, cudaHostAllocDefault));
    memset(a->h_in, 0, in);
    a->cap = k, a->in_bytes = in;
    return 0;
}

// Before the pinned block is rewritten: the copy of it a previous step queued has run
// (normally the previous draw's wait covered it; a step nothing waited for is waited
// for here).
static int arm_begin(cuda_core *f, dev_arm *a, dev_tp *t, int k, verr *err) {
    OP(cuda_activate(&f->ctx));
    if (f->par_pending) {
        f->ctx.n_syncs++;
        if (cuda_tp_wait(f, t, err)) return -1;
        f->par_pending = 0;
    }
    return k > a->cap ? arm_buffers(a, k, err) : 0;
}

int cuda_arm_entropix(cuda_core *f, dev_arm *a, dev_tp *t, const entropix_config *c, const double *u, int k,
                      int prev_token, int clarifier, verr *err) {
    if (k < ex_n_samples(c) || k > ENTROPIX_MAX_SAMPLES)
        return verr_set(err, "cuda_forward_arm_entropix: %d draws for a profile of %d", k, ex_n_samples(c));
    if (a->off) return 0;
    if (arm_begin(f, a, t, k, err)) return -1;
    arm_head *h = in_head(a->h_in);
    h->c = *c, h->tokens[0] = prev_token, h->tokens[1] = clarifier;
    memcpy(in_u(a->h_in), u, sizeof *u * (size_t)k);
    a->armed = ARM_ENTROPIX, a->ready = 0, a->k = k;
    return 0;
}

int cuda_arm_stock(cuda_core *f, dev_arm *a, dev_tp *t, const sample_cfg *cfg, int n, verr *err) {
    if (n < 1 || n > 65535) return verr_set(err, "cuda_forward_arm_sample: %d draws (1..65535)", n);
    if (a->off) return 0;
    if (arm_begin(f, a, t, n, err)) return -1;
    memcpy(in_cfg(a->h_in, a->cap), cfg, sizeof *cfg * (size_t)n);
    a->armed = ARM_STOCK, a->ready = 0, a->k = n;
    return 0;
}

void cuda_arm_set(dev_arm *a, int on) {
    a->off = !on;
    if (!on) a->armed = 0;
}

int cuda_arm_kind(const dev_arm *a, int sharded, int cap) {
    if (!a->armed || sharded) return 0;  // a shard's step: an ordinary draw follows
    return a->armed == ARM_ENTROPIX && cap < 0 ? 0 : a->armed;  // entropix decides from the statistics
}

int cuda_arm_prepare(cuda_core *f, const dev_arm *a, verr *err) {
    OP(cuda_reserve_sample(&f->ctx, f->m->cfg.vocab_size, a->k));
    return 0;
}

int cuda_arm_queue(cuda_core *f, dev_arm *a, verr *err) {
    cudaStream_t st = f->ctx.stream;
    size_t k = (size_t)a->k;
    sample_cfg *cfg = in_cfg(a->d_in, a->cap);  // a stock step's, or the decision's
    CK(cudaMemcpyAsync(a->d_in, a->h_in, a->in_bytes, cudaMemcpyHostToDevice, st));
    if (a->armed == ARM_ENTROPIX) {
        cfg = a->d_cfg;
        arm_head *h = in_head(a->d_in);
        OP(cuda_entropix_arm(&f->ctx, cfg, a->k, f->stats, f->stats + 4 * (size_t)f->rows, &h->c, in_u(a->d_in),
                             h->tokens));
    }
    OP(cuda_sample(&f->ctx, a->d_out, f->logits, f->m->cfg.vocab_size, cfg, a->k));
    CK(cudaMemcpyAsync(a->h_cfg, cfg, sizeof *a->h_cfg * k, cudaMemcpyDeviceToHost, st));
    CK(cudaMemcpyAsync(a->h_out, a->d_out, sizeof *a->h_out * k, cudaMemcpyDeviceToHost, st));
    a->ready = -1;  // queued: the caller's wait makes it 1
    return 0;
}

int cuda_arm_greedy(const dev_arm *a, int sharded) {
    if (cuda_arm_kind(a, sharded, -1) != ARM_STOCK || a->k != 1) return 0;
    return !(in_cfg(a->h_in, a->cap)->temperature > 0);  // cpu_sample's argmax condition
}

void cuda_arm_greedy_cfg(dev_arm *a) {
    memcpy(a->h_cfg, in_cfg(a->h_in, a->cap), sizeof *a->h_cfg);  // what the device drew with
}

int cuda_arm_drawn(cuda_core *f, dev_arm *a, verr *err) {
    cuda_arm_greedy_cfg(a);
    CK(cudaMemcpyAsync(a->h_out, a->d_out, sizeof *a->h_out, cudaMemcpyDeviceToHost, f->ctx.stream));
    a->ready = -1;  // the caller's wait makes it 1
    return 0;
}

int cuda_arm_graph_kind(const dev_arm *a, int sharded, int cap) {
    int kind = cuda_arm_kind(a, sharded, cap);
    return kind == ARM_STOCK && !a->greedy_off && cuda_arm_greedy(a, sharded) ? ARM_GREEDY : kind;
}

int cuda_arm_greedy_prepare(dev_arm *a, verr *err) {
    if (a->d_amax) return 0;
    if (cuda_malloc((void **)&a->d_amax, sizeof *a->d_amax, "greedy argmax", err)) return -1;
    CK(cudaMemset(a->d_amax, 0, sizeof *a->d_amax));  // then every step's finish zeroes it
    return 0;
}

int cuda_arm_greedy_queue(cuda_core *f, dev_arm *a, verr *err) {
    OP(cuda_argmax_finish(&f->ctx, a->d_out, f->logits, a->d_amax));
    return cuda_arm_drawn(f, a, err);
}

int cuda_arm_enqueue(cuda_core *f, dev_arm *a, int sharded, int cap, verr *err) {
    if (a->ready == -1 || !cuda_arm_kind(a, sharded, cap)) return 0;  // queued in the step's graph, or not armed
    return cuda_arm_prepare(f, a, err) || cuda_arm_queue(f, a, err) ? -1 : 0;
}

static int arm_take(dev_arm *a, const sample_cfg *cfg, int n, sample_out *out) {
    if (a->ready != 1) return 0;
    a->ready = 0;  // one step, one take
    if (n > a->k || memcmp(cfg, a->h_cfg, sizeof *cfg * (size_t)n) != 0) {
        a->misses++;
        return 0;
    }
    memcpy(out, a->h_out, sizeof *out * (size_t)n);
    a->hits++;
    return 1;
}

// ---- sampling on the device ----------------------------------------------------------------
// A NaN or +inf maximum (every logit NaN, or an overflow) is drawn as its argmax: refuse
// it as the CPU forward does.
static int check_draws(const cuda_core *f, const sample_out *out, int n, verr *err) {
    for (int i = 0; i < n; i++)
        if (!isfinite(out[i].logit)) return cuda_core_nonfinite(f, f->last_keys - 1, out[i].token, out[i].logit, err);
    return 0;
}

// Room for n configurations and results, on the device and pinned on the host.
void cuda_sampler_free(dev_sampler *s) {
    cuda_free(s->d_cfg), cuda_free(s->d_out);
    if (s->h_cfg) cudaFreeHost(s->h_cfg);
    if (s->h_out) cudaFreeHost(s->h_out);
    s->d_cfg = NULL, s->d_out = NULL, s->h_cfg = NULL, s->h_out = NULL, s->cap = 0;
}

static int sample_buffers(dev_sampler *s, int n, verr *err) {
    cuda_sampler_free(s);
    if (cuda_malloc((void **)&s->d_cfg, sizeof *s->d_cfg * (size_t)n, "sampling configurations", err) ||
        cuda_malloc((void **)&s->d_out, sizeof *s->d_out * (size_t)n, "sampling results", err))
        return -1;
    CK(cudaHostAlloc((void **)&s->h_cfg, sizeof *s->h_cfg * (size_t)n, cudaHostAllocDefault));
    CK(cudaHostAlloc((void **)&s->h_out, sizeof *s->h_out * (size_t)n, cudaHostAllocDefault));
    s->cap = n;
    return 0;
}

// n draws through s's pinned staging: the configurations up, the launch (cfg c from
// row c of logits when ld > 0, else every cfg from the one row), the results back, one
// wait for all three.
static int draw_staged(cuda_core *f, dev_sampler *s, dev_tp *t, const sample_cfg *cfg, int n, const float *logits,
                       size_t ld, sample_out *out, verr *err) {
    if (n > s->cap && sample_buffers(s, n, err)) return -1;
    int V = f->m->cfg.vocab_size;
    cudaStream_t st = f->ctx.stream;
    memcpy(s->h_cfg, cfg, sizeof *cfg * (size_t)n);
    CK(cudaMemcpyAsync(s->d_cfg, s->h_cfg, sizeof *cfg * (size_t)n, cudaMemcpyHostToDevice, st));
    if (ld) OP(cuda_sample_rows(&f->ctx, s->d_out, logits, ld, V, s->d_cfg, n));
    else OP(cuda_sample(&f->ctx, s->d_out, logits, V, s->d_cfg, n));
    CK(cudaMemcpyAsync(s->h_out, s->d_out, sizeof *out * (size_t)n, cudaMemcpyDeviceToHost, st));
    f->ctx.n_syncs++;
    if (cuda_tp_wait(f, t, err)) return -1;
    f->par_pending = 0;  // the wait covered the step block's copy too
    memcpy(out, s->h_out, sizeof *out * (size_t)n);
    return check_draws(f, out, n, err);
}

int cuda_sample_draw(cuda_core *f, dev_sampler *s, dev_arm *a, dev_tp *t, const sample_cfg *cfg, int n,
                     sample_out *out, verr *err) {
    if (n <= 0) return 0;
    OP(cuda_activate(&f->ctx));
    if (!f->logits_valid)
        return verr_set(err, f->logits_overrun ? "no logits to sample: the device decode loop ran past its stop "
                                                 "(use --lookahead 0 to keep them)"
                                               : "no logits to sample: the last forward pass failed");
    if (arm_take(a, cfg, n, out)) return check_draws(f, out, n, err);
    const float *row = f->logits + (size_t)f->sample_row * f->m->cfg.vocab_size;
    return draw_staged(f, s, t, cfg, n, row, 0, out, err);
}

int cuda_sample_rows_draw(cuda_core *f, dev_sampler *s, dev_tp *t, const sample_cfg *cfg, int B, sample_out *out,
                          verr *err) {
    if (B <= 0) return 0;
    OP(cuda_activate(&f->ctx));
    if (!f->logits_valid || f->batch_rows != B)
        return verr_set(err, "cuda_forward_sample_rows: the last forward was not one step of %d rows (%d rows of "
                             "logits on the device)", B, f->logits_valid ? f->batch_rows : 0);
    return draw_staged(f, s, t, cfg, B, f->logits, (size_t)f->m->cfg.vocab_size, out, err);
}

#else
typedef int cuda_arm_unused;  // nothing to build without CUDA
#endif
