// tp.c: tensor parallelism on the CUDA backend (tp.h, docs/distributed.md). Each rank's forward holds its shard (model/shard.c) on its
// own GPU and meets the others in NCCL collectives queued on its stream, so they are
// stream-ordered with the kernels and captured in the decode graph with them:
//   - after o_proj and after down_proj: the partial sums all-reduced, as a
//     reduce-scatter then an all-gather (each element summed once, on one rank, so every
//     rank holds the same bits and draws the same token);
//   - after the lm_head: every rank's vocabulary slice all-gathered and put in place
//     with one pitched copy per rank, so the logits, the device sampler and the vocab
//     statistics see the whole vocabulary;
//   - with a capture layer: every rank's heads' scores all-gathered before the
//     attention statistics, which need all heads (agreement mixes them). A capture row is
//     [n_heads, n_keys] packed, so where rank r's heads go depends on the step's key
//     count: these copies and the statistics run after the step's graph, not in it; the
//     hooks' attention captures (--attn-layers, probes) likewise, before they come back.
// The communicators are non-blocking: joining and every call poll NCCL's state, and waits
// on the stream poll NCCL's asynchronous error, all giving up after --tp-timeout and
// aborting the communicator: a dead or stuck peer is an error on every other rank, not a
// hang.
#include "model/forward_cuda.h"

#ifndef VARENT_CUDA
typedef int cuda_tp_unused;  // nothing to build without CUDA
#else

#include <nccl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "model/cuda/tp.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

// The communicators are non-blocking, so a call may return ncclInProgress: it is done
// when ncclCommGetAsyncError says so. Polls until then, for at most timeout_s seconds (0:
// no limit); ncclInProgress after that is the caller's timeout.
static ncclResult_t settle(ncclComm_t c, ncclResult_t r, double timeout_s) {
    double t0 = now_s();
    for (long spin = 0; r == ncclInProgress; spin++) {
        if (ncclCommGetAsyncError(c, &r) != ncclSuccess) return ncclInternalError;
        if (r != ncclInProgress || (timeout_s > 0 && now_s() - t0 > timeout_s)) break;
        if (spin < 1000) sched_yield();
        else usleep(100);
    }
    return r;
}

// A failed NCCL call: name it, with file and line, and NCCL's own last message.
#define NK(t, call)                                                                                     \
    do {                                                                                                \
        ncclResult_t r_ = settle(cuda_tp_group(t)->comm, (call), (t)->timeout_s);                    \
        if (r_ != ncclSuccess)                                                                          \
            return verr_set(err, "%s failed: %s (%s) (%s:%d)", #call,                                   \
                            r_ == ncclInProgress ? "did not complete within --tp-timeout"              \
                                                 : ncclGetErrorString(r_),                              \
                            ncclGetLastError(cuda_tp_group(t)->comm), __FILE__, __LINE__);               \
    } while (0)

int cuda_tp_id(unsigned char id[128], verr *err) {
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess)
        return verr_set(err, "ncclGetUniqueId failed: %s (%s:%d)", ncclGetErrorString(r), __FILE__, __LINE__);
    _Static_assert(sizeof u == 128, "NCCL's unique id is 128 bytes");
    memcpy(id, &u, sizeof u);
    return 0;
}

// Every rank's share, for the gathers' pitched copies.
static int plan_all(cuda_core *f, dev_tp *t, verr *err) {
    int n = f->m->tp.size;
    t->head0 = malloc(4 * sizeof(int) * (size_t)n);
    if (!t->head0) return verr_set(err, "out of memory");
    t->n_heads = t->head0 + n, t->vocab0 = t->n_heads + n, t->n_vocab = t->vocab0 + n;
    for (int r = 0; r < n; r++) {
        tp_shard s;
        if (tp_shard_plan(&f->m->cfg, r, n, &s, err)) return -1;
        t->head0[r] = s.head0, t->n_heads[r] = s.n_heads, t->vocab0[r] = s.vocab0, t->n_vocab[r] = s.n_vocab;
    }
    return 0;
}

static int alloc_buffers(cuda_core *f, dev_tp *t, verr *err) {
    const tp_shard *s = &f->m->tp;
    size_t R = (size_t)f->rows, logits = R * s->max_vocab, scores = R * s->max_heads * f->max_ctx;
    size_t per = logits > scores ? logits : scores;
    if (cuda_malloc((void **)&t->part_logits, sizeof(float) * logits, "tensor-parallel logits slice", err) ||
        cuda_malloc((void **)&t->part_scores, sizeof(float) * scores, "tensor-parallel attention capture", err) ||
        cuda_malloc((void **)&t->gather, sizeof(float) * per * (size_t)s->size, "tensor-parallel gather", err))
        return -1;
    return 0;
}

int cuda_tp_join(cuda_core *f, dev_tp *t, const unsigned char id[128], double timeout_s, verr *err) {
    const tp_shard *s = &f->m->tp;
    if (s->size < 2) return verr_set(err, "cuda_forward_tp_join: the model is not a tensor-parallel shard");
    if (t->comm) return verr_set(err, "cuda_forward_tp_join: already in a group");
    OP(cuda_activate(&f->ctx));
    if (plan_all(f, t, err) || alloc_buffers(f, t, err)) return -1;
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    // Non-blocking: the join can time out (a rank that never starts), and so can every call.
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t c = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&c, s->size, u, s->rank, &cfg);
    if (c && (r == ncclSuccess || r == ncclInProgress)) r = settle(c, r, timeout_s);
    if (r != ncclSuccess) {
        if (c) ncclCommAbort(c);
        return verr_set(err, "ncclCommInitRankConfig (rank %d of %d on CUDA device %d) failed: %s (%s:%d)", s->rank,
                        s->size, f->ctx.device,
                        r == ncclInProgress ? "the other ranks did not join within --tp-timeout"
                                            : ncclGetErrorString(r),
                        __FILE__, __LINE__);
    }
    t->comm = c, t->rank = s->rank, t->size = s->size, t->timeout_s = timeout_s;
    return 0;
}

int cuda_tp_share(cuda_core *f, dev_tp *t, const dev_tp *lead, const dev_weights *lead_w, verr *err) {
    const tp_shard *s = &f->m->tp;
    dev_tp *g = cuda_tp_group(lead);
    if (!g->comm || g->broken)
        return verr_set(err, "cuda_forward_tp_share: %s", g->broken ? g->why : "the lead forward is not in a group");
    if (t->comm) return verr_set(err, "cuda_forward_tp_share: already in a group");
    if (f->w != lead_w || s->rank != g->rank || s->size != g->size)
        return verr_set(err, "cuda_forward_tp_share: the forward does not share the lead's weights (rank %d of %d)",
                        g->rank, g->size);
    OP(cuda_activate(&f->ctx));
    if (plan_all(f, t, err) || alloc_buffers(f, t, err)) return -1;
    t->comm = g->comm, t->lead = g, t->rank = g->rank, t->size = g->size, t->timeout_s = g->timeout_s;
    return 0;
}

int cuda_tp_sum(cuda_core *f, dev_tp *t, float *y, size_t n, verr *err) {
    size_t size = (size_t)t->size, per = (n + size - 1) / size;  // y holds size * per floats (cuda_tp_pad)
    float *mine = y + (size_t)t->rank * per;
    ncclComm_t c = cuda_tp_group(t)->comm;
    NK(t, ncclReduceScatter(y, mine, per, ncclFloat32, ncclSum, c, f->ctx.stream));
    NK(t, ncclAllGather(mine, y, per, ncclFloat32, c, f->ctx.stream));
    return 0;
}

// Rank r's block of the gather holds count(r) values per row, rows packed; row b of the
// result takes them at first(r) in a row of `width`.
static int place(cuda_core *f, const dev_tp *t, float *out, size_t width, size_t block, const int *first, const int *count,
                 size_t unit, int B, verr *err) {
    for (int r = 0; r < t->size; r++) {
        size_t n = (size_t)count[r] * unit * sizeof(float);
        CK(cudaMemcpy2DAsync(out + (size_t)first[r] * unit, width * sizeof(float), t->gather + (size_t)r * block, n,
                             n, (size_t)B, cudaMemcpyDeviceToDevice, f->ctx.stream));
    }
    return 0;
}

int cuda_tp_logits(cuda_core *f, dev_tp *t, int B, verr *err) {
    size_t block = (size_t)B * f->m->tp.max_vocab;
    NK(t, ncclAllGather(t->part_logits, t->gather, block, ncclFloat32, cuda_tp_group(t)->comm, f->ctx.stream));
    return place(f, t, f->logits, (size_t)f->m->cfg.vocab_size, block, t->vocab0, t->n_vocab, 1, B, err);
}

int cuda_tp_scores(cuda_core *f, dev_tp *t, int B, const cuda_kv_lens *lens, verr *err) {
    size_t mc = (size_t)f->max_ctx, H = (size_t)f->m->cfg.n_heads, block = (size_t)B * f->m->tp.max_heads * mc;
    NK(t, ncclAllGather(t->part_scores, t->gather, block, ncclFloat32, cuda_tp_group(t)->comm, f->ctx.stream));
    for (int b = 0; b < B; b++) {  // row b: [n_heads, n_keys] packed, rank r's heads from head0(r) on
        size_t keys = (size_t)lens[b].n_keys;
        for (int r = 0; r < t->size; r++)
            CK(cudaMemcpyAsync(f->scores + b * H * mc + (size_t)t->head0[r] * keys,
                               t->gather + (size_t)r * block + (size_t)b * t->n_heads[r] * mc,
                               sizeof(float) * t->n_heads[r] * keys, cudaMemcpyDeviceToDevice, f->ctx.stream));
    }
    return 0;
}

int cuda_tp_gather_heads(cuda_core *f, dev_tp *t, float *scores, int keys, verr *err) {
    size_t block = (size_t)f->m->tp.max_heads * keys;  // within the buffer: max_heads <= n_heads
    NK(t, ncclAllGather(scores, t->gather, block, ncclFloat32, cuda_tp_group(t)->comm, f->ctx.stream));
    for (int r = 0; r < t->size; r++)
        CK(cudaMemcpyAsync(scores + (size_t)t->head0[r] * keys, t->gather + (size_t)r * block,
                           sizeof(float) * t->n_heads[r] * keys, cudaMemcpyDeviceToDevice, f->ctx.stream));
    return 0;
}

// The group is broken: abort the communicator (which ends any collective still waiting
// on a peer) and refuse every later call with the reason.
// (A borrower breaks its lead's group: the other contexts' steps fail too.)
static int broken(cuda_core *f, dev_tp *self, verr *err, const char *why) {
    dev_tp *t = cuda_tp_group(self);
    snprintf(t->why, sizeof t->why, "tensor parallelism (rank %d of %d, CUDA device %d): %s", t->rank, t->size,
             f->ctx.device, why);
    if (t->comm) ncclCommAbort(t->comm);
    t->comm = NULL, t->broken = 1;
    if (self->lead) self->comm = NULL, self->broken = 1, memcpy(self->why, t->why, sizeof t->why);
    return verr_set(err, "%s", t->why);
}

int cuda_tp_wait(cuda_core *f, dev_tp *self, verr *err) {
    dev_tp *t = cuda_tp_group(self);
    if (t->broken) return verr_set(err, "%s", t->why);
    if (!t->comm) {
        CK(cudaStreamSynchronize(f->ctx.stream));
        return 0;
    }
    double t0 = now_s();
    char why[400];
    for (long spin = 0;; spin++) {
        cudaError_t e = cudaStreamQuery(f->ctx.stream);
        ncclResult_t a = ncclSuccess, q = ncclCommGetAsyncError(t->comm, &a);
        if (q != ncclSuccess) {
            snprintf(why, sizeof why, "ncclCommGetAsyncError failed: %s (%s:%d)", ncclGetErrorString(q), __FILE__,
                     __LINE__);
            return broken(f, self, err, why);
        }
        if (a != ncclSuccess) {
            snprintf(why, sizeof why, "a collective failed: %s (%s)", ncclGetErrorString(a), ncclGetLastError(t->comm));
            return broken(f, self, err, why);
        }
        if (e == cudaSuccess) return 0;
        if (e != cudaErrorNotReady) {
            snprintf(why, sizeof why, "the stream failed: %s (%s:%d)", cudaGetErrorString(e), __FILE__, __LINE__);
            return broken(f, self, err, why);
        }
        if (t->timeout_s > 0 && now_s() - t0 > t->timeout_s) {
            snprintf(why, sizeof why, "the step waited more than %.0f s for the other ranks (one died or hangs; "
                     "--tp-timeout sets the limit)", t->timeout_s);
            return broken(f, self, err, why);
        }
        if (spin < 1000) sched_yield();
        else usleep(50);
    }
}

void cuda_tp_leave(cuda_core *f, dev_tp *t) {
    if (!t->comm) return;
    cuda_activate(&f->ctx);
    cudaStreamSynchronize(f->ctx.stream);  // teardown: errors are not acted on
    if (!t->lead) ncclCommDestroy(t->comm);  // a borrower's is its lead's
    t->comm = NULL, t->broken = 1;
    snprintf(t->why, sizeof t->why, "tensor parallelism: rank %d has left its group", t->rank);
}

void cuda_tp_free(dev_tp *t) {
    if (t->comm && !t->lead) ncclCommDestroy(t->comm);
    cuda_free(t->part_logits);
    cuda_free(t->part_scores);
    cuda_free(t->gather);
    free(t->head0);
    memset(t, 0, sizeof *t);
}

#endif
