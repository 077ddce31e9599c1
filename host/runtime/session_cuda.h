// session_cuda.h: the CUDA side of a session, called from host/runtime/session.c: parsing
// --device cuda[:N], opening the device forward (weights uploaded once; a shared
// session borrows its base's) with a device KV cache, and closing them.
#ifndef VARENT_SESSION_CUDA_H
#define VARENT_SESSION_CUDA_H

#include "host/runtime/session.h"
#include "model/forward_cuda.h"

// "cuda" -> 0, "cuda:N" -> N, checked against the devices present. Without VARENT_CUDA,
// or without a GPU, a clear error.
int session_cuda_parse(const char *dev, int *index, verr *err);
// CUDA devices present (0 without CUDA or a GPU).
int session_cuda_devices(void);
// After forward_init(&s->fw): s->cu on GPU `device` (sharing base's weights when base
// is given) and s->kv on the device. VARENT_CUDA_GRAPHS=0 in the environment turns
// the decode-step CUDA graph off; VARENT_CUDA_ARM=0 turns arming off (every draw then
// launches on its own after the step: the same tokens, a second wait per token).
int session_cuda_open(session *s, int device, const session *base, verr *err);
// Frees s->kv and s->cu (no-op on a CPU session). Before forward_free(&s->fw).
void session_cuda_close(session *s);
// session_sample on the device: the configurations up, one cuda_sample launch on the
// last logits, the results down.
int session_cuda_sample(session *s, const sample_cfg *cfg, int n, sample_out *out, verr *err);
// For `varent bench` on a CUDA session: "cuda:0 (NAME, N SMs, X GiB)" into buf, the
// device-to-device copy bandwidth (GB/s, read + write) and the bytes of the weights as
// uploaded (bf16 where the checkpoint was f32). -1 with err on a CPU session.
int session_cuda_bench_info(session *s, char *buf, size_t n, double *copy_gbs, size_t *weight_bytes, verr *err);
// The last one-row decode step's kernel launches and graph nodes, and the host waits
// on the stream so far. Zeros on a CPU session.
void session_cuda_counts(const session *s, cuda_step_counts *out);
// Waits until the device has run every step queued so far (session_forward may return
// with its step still queued: lazy logits). Nothing on a CPU session.
int session_cuda_wait(session *s, verr *err);

#endif
