// forward_cuda_arm.c: entropix steps that decide and draw on the device. The decode
// loop arms a step before its forward (the profile, the sequence's last token and the
// next uniforms of its stream, peeked); right after the statistics the device runs
// entropix_decide's twin (kernels/entropix_core.h) and the draws, and the step's one
// wait brings them back with the statistics. The host then decides for its records as
// always, and its draw request is answered from the armed draws when its parameters
// and uniforms are the device's to the bit (cuda_arm_take): one host round trip per
// token instead of two. Anything else (a clarifier, a LEHV branch, a mismatch) falls
// back to an ordinary draw, so arming never changes a token.
#include "model/forward_cuda.h"

#ifdef VARENT_CUDA

#include <stdlib.h>
#include <string.h>

#include "kernels/entropix_core.h"
#include "model/forward_cuda_internal.h"

void cuda_arm_free(cuda_forward *f) {
    dev_arm *a = &f->arm;
    cuda_free(a->d_c), cuda_free(a->d_u), cuda_free(a->d_cfg), cuda_free(a->d_out);
    if (a->h_c) cudaFreeHost(a->h_c);
    if (a->h_u) cudaFreeHost(a->h_u);
    if (a->h_cfg) cudaFreeHost(a->h_cfg);
    if (a->h_out) cudaFreeHost(a->h_out);
    memset(a, 0, sizeof *a);
}

// Room for k draws, on the device and pinned on the host.
static int arm_buffers(cuda_forward *f, int k, verr *err) {
    long hits = f->arm.hits, misses = f->arm.misses;
    cuda_arm_free(f);
    dev_arm *a = &f->arm;
    a->hits = hits, a->misses = misses;
    if (cuda_malloc((void **)&a->d_c, sizeof *a->d_c, "entropix profile", err) ||
        cuda_malloc((void **)&a->d_u, sizeof *a->d_u * (size_t)k, "entropix uniforms", err) ||
        cuda_malloc((void **)&a->d_cfg, sizeof *a->d_cfg * (size_t)k, "entropix draws", err) ||
        cuda_malloc((void **)&a->d_out, sizeof *a->d_out * (size_t)k, "entropix draws", err))
        return -1;
    CK(cudaHostAlloc((void **)&a->h_c, sizeof *a->h_c, cudaHostAllocDefault));
    CK(cudaHostAlloc((void **)&a->h_u, sizeof *a->h_u * (size_t)k, cudaHostAllocDefault));
    CK(cudaHostAlloc((void **)&a->h_cfg, sizeof *a->h_cfg * (size_t)k, cudaHostAllocDefault));
    CK(cudaHostAlloc((void **)&a->h_out, sizeof *a->h_out * (size_t)k, cudaHostAllocDefault));
    a->cap = k;
    return 0;
}

int cuda_forward_arm_entropix(cuda_forward *f, const entropix_config *c, const double *u, int k, int prev_token,
                              int clarifier, verr *err) {
    if (k < ex_n_samples(c) || k > ENTROPIX_MAX_SAMPLES)
        return verr_set(err, "cuda_forward_arm_entropix: %d draws for a profile of %d", k, ex_n_samples(c));
    OP(cuda_activate(&f->ctx));
    if (k > f->arm.cap && arm_buffers(f, k, err)) return -1;
    dev_arm *a = &f->arm;
    cudaStream_t st = f->ctx.stream;
    // The last step's wait covered the previous copies out of the pinned buffers.
    *a->h_c = *c;
    memcpy(a->h_u, u, sizeof *u * (size_t)k);
    CK(cudaMemcpyAsync(a->d_c, a->h_c, sizeof *a->h_c, cudaMemcpyHostToDevice, st));
    CK(cudaMemcpyAsync(a->d_u, a->h_u, sizeof *u * (size_t)k, cudaMemcpyHostToDevice, st));
    a->armed = 1, a->ready = 0, a->k = k, a->prev_token = prev_token, a->clarifier = clarifier;
    return 0;
}

int cuda_arm_enqueue(cuda_forward *f, int cap, verr *err) {
    dev_arm *a = &f->arm;
    if (!a->armed) return 0;
    a->armed = 0;
    if (cap < 0 || f->tp.comm) return 0;  // no statistics here, or a shard's: an ordinary draw follows
    cudaStream_t st = f->ctx.stream;
    OP(cuda_entropix_arm(&f->ctx, a->d_cfg, a->k, f->stats, f->stats + 4 * (size_t)f->rows, a->d_c, a->d_u,
                         a->prev_token, a->clarifier));
    OP(cuda_sample(&f->ctx, a->d_out, f->logits, f->m->cfg.vocab_size, a->d_cfg, a->k));
    CK(cudaMemcpyAsync(a->h_cfg, a->d_cfg, sizeof *a->h_cfg * (size_t)a->k, cudaMemcpyDeviceToHost, st));
    CK(cudaMemcpyAsync(a->h_out, a->d_out, sizeof *a->h_out * (size_t)a->k, cudaMemcpyDeviceToHost, st));
    a->ready = -1;  // queued: the caller's wait makes it 1
    return 0;
}

int cuda_arm_take(cuda_forward *f, const sample_cfg *cfg, int n, sample_out *out) {
    dev_arm *a = &f->arm;
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

void cuda_forward_arm_counts(const cuda_forward *f, long *hits, long *misses) {
    *hits = f->arm.hits, *misses = f->arm.misses;
}

#else

int cuda_forward_arm_entropix(cuda_forward *f, const struct entropix_config_s *c, const double *u, int k,
                              int prev_token, int clarifier, verr *err) {
    (void)f, (void)c, (void)u, (void)k, (void)prev_token, (void)clarifier;
    return verr_set(err, "this varent was built without CUDA (rebuild with nvcc on PATH)");
}

void cuda_forward_arm_counts(const cuda_forward *f, long *hits, long *misses) {
    (void)f;
    *hits = *misses = 0;
}

#endif
