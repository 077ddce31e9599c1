// absent.c: the public calls of model/forward_cuda.h in a build without CUDA: each
// reports that the build has none, so the CLI and the library link and say so.
#include "model/forward_cuda.h"

#ifdef VARENT_CUDA
typedef int cuda_absent_unused;  // the real ones are in forward.c
#else

#define NO_CUDA "this varent was built without CUDA (rebuild with nvcc on PATH)"
int cuda_forward_open(cuda_forward **out, const model *m, forward_state *fw, int device,
                      const cuda_forward *share, verr *err) {
    (void)m, (void)fw, (void)device, (void)share;
    *out = NULL;
    return verr_set(err, NO_CUDA);
}
void cuda_forward_close(cuda_forward *f) { (void)f; }
struct cuda_ctx *cuda_forward_ctx(cuda_forward *f) { return (void)f, NULL; }
int cuda_forward_device(const cuda_forward *f) { return (void)f, -1; }
size_t cuda_forward_weight_bytes(const cuda_forward *f) { return (void)f, 0; }
void cuda_forward_set_graphs(cuda_forward *f, int on) { (void)f, (void)on; }
void cuda_forward_counts(const cuda_forward *f, cuda_step_counts *out) {
    (void)f;
    *out = (cuda_step_counts){ 0, 0, 0, 0, 0, 0, 0, NULL };
}
void cuda_forward_set_decode_kernel(cuda_forward *f, int persistent, int grid) { (void)f, (void)persistent, (void)grid; }
void cuda_forward_set_persist_ring(cuda_forward *f, int bytes) { (void)f, (void)bytes; }
void cuda_forward_set_persist_tuning(cuda_forward *f, int min_blocks, int sleep_ns, int stage, int ahead) {
    (void)f, (void)min_blocks, (void)sleep_ns, (void)stage, (void)ahead;
}
int cuda_forward_set_persist_trace(cuda_forward *f, const char *path, verr *err) {
    (void)f, (void)path, (void)err;
    return 0;
}
int cuda_forward_run(cuda_forward *f, forward_state *fw, kv_view *kv, const int *ids, int T, verr *err) {
    (void)f, (void)fw, (void)kv, (void)ids, (void)T;
    return verr_set(err, NO_CUDA);
}
int cuda_forward_batch(cuda_forward *f, forward_state *fw, kv_view *views, const int *ids, int B, float *logits,
                       float *stats, verr *err) {
    (void)f, (void)fw, (void)views, (void)ids, (void)B, (void)logits, (void)stats;
    return verr_set(err, NO_CUDA);
}
int cuda_forward_logits(cuda_forward *f, forward_state *fw, verr *err) {
    (void)f, (void)fw;
    return verr_set(err, NO_CUDA);
}
int cuda_forward_wait(cuda_forward *f, verr *err) {
    (void)f;
    return verr_set(err, NO_CUDA);
}
int cuda_forward_sample(cuda_forward *f, const sample_cfg *cfg, int n, sample_out *out, verr *err) {
    (void)f, (void)cfg, (void)n, (void)out;
    return verr_set(err, NO_CUDA);
}
int cuda_forward_sample_rows(cuda_forward *f, const sample_cfg *cfg, int B, sample_out *out, verr *err) {
    (void)f, (void)cfg, (void)B, (void)out;
    return verr_set(err, NO_CUDA);
}
int cuda_forward_rows(const cuda_forward *f) {
    (void)f;
    return 0;
}
int cuda_forward_set_lora(cuda_forward *f, const lora_use *u, int n, verr *err) {
    (void)f, (void)u, (void)n;
    return verr_set(err, NO_CUDA);
}
int cuda_forward_arm_entropix(cuda_forward *f, const struct entropix_config_s *c, const double *u, int k,
                              int prev_token, int clarifier, verr *err) {
    (void)f, (void)c, (void)u, (void)k, (void)prev_token, (void)clarifier;
    return verr_set(err, NO_CUDA);
}
int cuda_forward_arm_sample(cuda_forward *f, const sample_cfg *cfg, int n, verr *err) {
    (void)f, (void)cfg, (void)n;
    return verr_set(err, NO_CUDA);
}
void cuda_forward_set_arming(cuda_forward *f, int on) { (void)f, (void)on; }
void cuda_forward_set_greedy_epilogue(cuda_forward *f, int on) { (void)f, (void)on; }
void cuda_forward_arm_counts(const cuda_forward *f, long *hits, long *misses) {
    (void)f;
    *hits = *misses = 0;
}
int cuda_forward_tp_id(unsigned char id[CUDA_TP_ID_BYTES], verr *err) {
    (void)id;
    return verr_set(err, NO_CUDA);
}
int cuda_forward_tp_join(cuda_forward *f, const unsigned char id[CUDA_TP_ID_BYTES], double timeout_s, verr *err) {
    (void)f, (void)id, (void)timeout_s;
    return verr_set(err, NO_CUDA);
}
int cuda_forward_tp_share(cuda_forward *f, cuda_forward *lead, verr *err) {
    (void)f, (void)lead;
    return verr_set(err, NO_CUDA);
}
void cuda_forward_tp_leave(cuda_forward *f) { (void)f; }

const char *cuda_forward_loop_blocker(const cuda_forward *f, const forward_state *fw) {
    (void)f, (void)fw;
    return NO_CUDA;
}
int cuda_forward_loop_begin(cuda_forward *f, forward_state *fw, kv_view *kv, int token, int greedy, int depth,
                            verr *err) {
    (void)f, (void)fw, (void)kv, (void)token, (void)greedy, (void)depth;
    return verr_set(err, NO_CUDA);
}
int cuda_forward_loop_queue(cuda_forward *f, const sample_cfg *cfg, verr *err) {
    (void)f, (void)cfg;
    return verr_set(err, NO_CUDA);
}
int cuda_forward_loop_read(cuda_forward *f, int j, int ahead, loop_entry *out, verr *err) {
    (void)f, (void)j, (void)ahead, (void)out;
    return verr_set(err, NO_CUDA);
}
int cuda_forward_loop_end(cuda_forward *f, forward_state *fw, kv_view *kv, int kept, verr *err) {
    (void)f, (void)fw, (void)kv, (void)kept;
    return verr_set(err, NO_CUDA);
}
void cuda_forward_loop_counts(const cuda_forward *f, cuda_loop_counts *out) {
    (void)f;
    *out = (cuda_loop_counts){ 0, 0, 0 };
}

#endif
