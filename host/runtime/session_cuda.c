// session_cuda.c: see session_cuda.h.
#include "host/runtime/session_cuda.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward_cuda.h"

#ifdef VARENT_CUDA
#include "kernels/ops_cuda.h"
#include "host/util/parse.h"
#endif

int session_cuda_parse(const char *dev, int *index, verr *err) {
    *index = -1;
#ifndef VARENT_CUDA
    return verr_set(err, "--device %s: this varent was built without CUDA (rebuild with nvcc on PATH)", dev);
#else
    long v = 0;
    if (dev[4] == ':') {
        const char *p = dev + 5;
        char *end = NULL;
        errno = 0;
        v = isdigit((unsigned char)*p) ? strtol(p, &end, 10) : -1;
        if (v < 0 || errno || *end || v > 1 << 20)
            return verr_set(err, "--device %s: expected cuda or cuda:N with N a device index", dev);
    }
    int n = cuda_device_count();
    if (n == 0) return verr_set(err, "--device %s: no CUDA device found on this machine (use --device cpu)", dev);
    if (v >= n)
        return verr_set(err, "--device %s: CUDA device %ld does not exist (%d device%s found: cuda:0 .. cuda:%d)", dev,
                        v, n, n == 1 ? "" : "s", n - 1);
    *index = (int)v;
    return 0;
#endif
}

int session_cuda_devices(void) {
#ifdef VARENT_CUDA
    return cuda_device_count();
#else
    return 0;
#endif
}

// An integer environment variable in [lo, hi]: 1 and *v when set, 0 when unset or empty,
// -1 (err says which and what it takes) when not such a number.
static int env_int(const char *name, long lo, long hi, const char *what, long *v, verr *err) {
    const char *e = getenv(name);
    if (!e || !*e) return 0;
    const char *end = parse_index(e, hi, v);  // digits only: no sign, no spaces
    if (!end || *end || *v < lo) return verr_set(err, "%s=%s: %s, %ld to %ld", name, e, what, lo, hi);
    return 1;
}

// The persistent kernel (--decode-kernel persistent: on) and its settings (docs/cuda.md),
// for the emulated device and the GPU window's A/B: its grid (VARENT_CUDA_PERSIST_GRID
// blocks; 0 or unset: as many as the device holds; the emulated device's fibers want
// few), weight ring (VARENT_CUDA_PERSIST_RING KiB a block; 0: none; unset: as many as
// fit), blocks an SM (VARENT_CUDA_PERSIST_BLOCKS 3 or 4), the pause between counter
// polls (VARENT_CUDA_PERSIST_SLEEP ns), the staging of a phase's input in shared
// memory (VARENT_CUDA_PERSIST_STAGE 0: never; 1, the default: where it fits) and the
// ring filled a unit ahead in a staged phase (VARENT_CUDA_PERSIST_AHEAD 0: the first
// unit only; 1, the default), and its phase trace (VARENT_CUDA_PERSIST_TRACE=path: each
// persistent step's stamps written there, the last step's kept).
static int persist_env(session *s, int on, verr *err) {
    long grid = 0, kib = -1, blocks = 3, ns = 0, stage = 1, ahead = 1;
    int r = 0;
    if (env_int("VARENT_CUDA_PERSIST_GRID", 0, 1L << 20, "blocks (0: as many as fit)", &grid, err) < 0 ||
        (r = env_int("VARENT_CUDA_PERSIST_RING", 0, 227, "KiB of shared memory a block (0: no ring)", &kib, err)) < 0 ||
        env_int("VARENT_CUDA_PERSIST_BLOCKS", 3, 4, "blocks an SM", &blocks, err) < 0 ||
        env_int("VARENT_CUDA_PERSIST_SLEEP", 0, 100000, "ns between counter polls", &ns, err) < 0 ||
        env_int("VARENT_CUDA_PERSIST_STAGE", 0, 1, "stage inputs in shared memory (0: no, 1: yes)", &stage, err) < 0 ||
        env_int("VARENT_CUDA_PERSIST_AHEAD", 0, 1, "fill the ring a unit ahead (0: no, 1: yes)", &ahead, err) < 0)
        return -1;
    cuda_forward_set_decode_kernel(s->cu, on, (int)grid);
    cuda_forward_set_persist_ring(s->cu, r ? (int)kib * 1024 : -1);
    cuda_forward_set_persist_tuning(s->cu, (int)blocks, (int)ns, (int)stage, (int)ahead);
    return cuda_forward_set_persist_trace(s->cu, getenv("VARENT_CUDA_PERSIST_TRACE"), err);
}

int session_cuda_open(session *s, int device, const session *base, verr *err) {
    if (cuda_forward_open(&s->cu, &s->m, &s->fw, device, base ? base->cu : NULL, err)) return -1;
    const char *g = getenv("VARENT_CUDA_GRAPHS");
    if (g && !strcmp(g, "0")) cuda_forward_set_graphs(s->cu, 0);
    const char *a = getenv("VARENT_CUDA_ARM");
    if (a && !strcmp(a, "0")) cuda_forward_set_arming(s->cu, 0);
    const char *ge = getenv("VARENT_CUDA_GREEDY_EPILOGUE");
    if (ge && !strcmp(ge, "0")) cuda_forward_set_greedy_epilogue(s->cu, 0);
    int persistent = base ? base->decode_persistent : s->decode_persistent;
    if (persist_env(s, persistent, err)) return -1;
    s->decode_persistent = persistent;
    const model_config *c = &s->m.cfg;
    if (kv_cache_init_cuda(&s->kv, cuda_forward_ctx(s->cu), c->n_layers, s->ctx, model_kv_dim(&s->m), err)) return -1;
    // a second context on a tensor-parallel shard: in the base's group, on its communicator
    return base && base->m.tp.size > 1 ? cuda_forward_tp_share(s->cu, base->cu, err) : 0;
}

void session_cuda_close(session *s) {
    if (!s->cu) return;
    kv_cache_free(&s->kv);  // device buffers, while the context is alive
    cuda_forward_close(s->cu);
    s->cu = NULL;
}

int session_cuda_bench_info(session *s, char *buf, size_t n, double *copy_gbs, size_t *weight_bytes, verr *err) {
    if (!s->cu) return verr_set(err, "not a CUDA session");
#ifdef VARENT_CUDA
    struct cuda_ctx *ctx = cuda_forward_ctx(s->cu);
    char desc[256];
    if (cuda_activate(ctx) || cuda_describe(ctx, desc, sizeof desc) || cuda_copy_gbs(ctx, copy_gbs))
        return verr_set(err, "%s", ctx->err.msg);
    snprintf(buf, n, "cuda:%d (%s)", ctx->device, desc);
    *weight_bytes = cuda_forward_weight_bytes(s->cu);
    return 0;
#else
    (void)buf, (void)n, (void)copy_gbs, (void)weight_bytes;
    return verr_set(err, "built without CUDA");
#endif
}

void session_cuda_counts(const session *s, cuda_step_counts *out) {
    if (!s->cu) {
        *out = (cuda_step_counts){ 0 };
        return;
    }
    cuda_forward_counts(s->cu, out);
}

int session_cuda_wait(session *s, verr *err) { return s->cu ? cuda_forward_wait(s->cu, err) : 0; }

int session_cuda_sample(session *s, const sample_cfg *cfg, int n, sample_out *out, verr *err) {
    if (!s->cu) return verr_set(err, "not a CUDA session");
    return cuda_forward_sample(s->cu, cfg, n, out, err);
}
