// forward.c: the device forward's public calls (model/forward_cuda.h): open and close,
// a forward call (prefill chunks, then a decode step), a batch of decode rows, the
// waits and copies back, and the CUDA graphs decode steps replay. The layers of a step
// are in step.c; the parts they combine in core.h, tp.h, lora.h, hooks.h and arm.h.
// Per-step values (ids, positions, cache rows, KV segment pointers and lengths) live in
// one device block filled from a pinned host twin by the step's first copy: a captured
// decode graph (one per B) replays with new values and no re-capture. A one-row step
// armed to draw (arm.c) has a graph of its own that ends with the draws and their
// copies back. With a capture layer, the step ends with the entropix statistics on the
// device (cuda_vocab_stats on the logits, cuda_attn_stats on the captured scores): 8
// floats come back with the logits; the scores themselves only with fw->copy_scores.
#include "model/forward_cuda.h"

#ifndef VARENT_CUDA
typedef int cuda_forward_unused;  // absent.c has the calls of a build without CUDA
#else

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/cuda/internal.h"
#include "model/cuda/upload.h"

int cuda_forward_open(cuda_forward **out, const model *m, forward_state *fw, int device,
                      const cuda_forward *share, verr *err) {
    *out = NULL;
    const model_config *c = &m->cfg;
    cuda_forward *d = calloc(1, sizeof *d);
    if (!d) return verr_set(err, "out of memory");
    cuda_core *f = &d->core;
    d->use_graph = 1;
    d->persist.ring = -1;  // the weight ring as large as fits
    d->persist.stage = 1;  // each phase's input staged where it fits
    d->persist.ahead = 1;  // and the ring filled a unit ahead
    if (cuda_core_init(f, m, fw, device, err)) {
        free(d);
        return -1;
    }
    attn_shape sh = { m->tp.n_heads, m->tp.n_kv_heads, c->head_dim, 1.0f / sqrtf((float)c->head_dim) };
    int rc = 0;
    if (cuda_attention_validate(&f->ctx, sh)) {
        rc = verr_set(err, "%s: this model's attention shape is not supported on CUDA: %s", m->dir, f->ctx.err.msg);
    } else if (share) {
        if (share->core.ctx.device != device || share->core.m->cfg.n_layers != c->n_layers)
            rc = verr_set(err, "cuda_forward_open: shared weights are on device %d, not %d", share->core.ctx.device,
                          device);
        f->w = share->core.w;
        d->lora.reg = share->lora.reg;
    } else {
        rc = cuda_weights_upload(&f->ctx, m, &d->own, err) || cuda_lora_reg_new(&d->own_lora, err);
        f->w = &d->own;
        d->lora.reg = d->own_lora;
    }
    if (rc == 0) rc = cuda_core_alloc(f, err);
    if (rc) {
        cuda_forward_close(d);
        return -1;
    }
    cuda_core_pin_host(f);
    *out = d;
    return 0;
}

void cuda_forward_close(cuda_forward *d) {
    if (!d) return;
    cuda_core *f = &d->core;
    // Teardown: nothing here can be acted on; errors are cleared, not reported.
    cuda_core_quiesce(f);
    for (int b = 0; b <= CUDA_ROWS; b++)
        if (d->graphs[b].exec) cudaGraphExecDestroy(d->graphs[b].exec);
    if (d->armed_graph.exec) cudaGraphExecDestroy(d->armed_graph.exec);
    if (d->greedy_graph.exec) cudaGraphExecDestroy(d->greedy_graph.exec);
    if (d->loop_graph.exec) cudaGraphExecDestroy(d->loop_graph.exec);
    cuda_loop_free(d);
    cuda_sampler_free(&d->smp);
    cuda_arm_free(&d->arm);
    cuda_hooks_free(&d->hk);
    cuda_lora_free(&d->lora);
    cuda_lora_reg_free(d->own_lora);
    cuda_tp_free(&d->tp);
    cuda_persist_free(d);
    cuda_tune_free(&d->persist.tune);
    cuda_weights_free(&d->own);
    cuda_core_free(f);
    free(d);
}

struct cuda_ctx *cuda_forward_ctx(cuda_forward *d) { return &d->core.ctx; }
int cuda_forward_device(const cuda_forward *d) { return d->core.ctx.device; }
size_t cuda_forward_weight_bytes(const cuda_forward *d) { return d->core.w->bytes; }
void cuda_forward_set_graphs(cuda_forward *d, int on) { d->use_graph = on; }

void cuda_forward_counts(const cuda_forward *d, cuda_step_counts *out) {
    *out = d->step;
    out->syncs = d->core.ctx.n_syncs;
    out->captures = d->n_captures;
    out->persist_steps = d->persist.steps;
    out->persist_fallbacks = d->persist.fallbacks;
    out->fallback_why = d->persist.fallbacks ? d->persist.why : NULL;
    out->persist_ring = d->persist.fit.ring;
    out->persist_stage = d->persist.fit.stage;
    out->persist_checks = d->persist.checks;
    const dev_tune *t = &d->persist.tune;
    out->tune = d->persist.on == 2 ? (t->decided ? 2 : 1) : 0;
    out->tune_pick = t->pick;
    out->tune_ms[0] = t->med[0];
    out->tune_ms[1] = t->med[1];
    out->tune_why = t->decided && t->why[0] ? t->why : NULL;
}

void cuda_forward_set_decode_kernel(cuda_forward *d, int persistent, int grid) {
    d->persist.on = persistent == 1 || persistent == 2 ? persistent : 0;
    cuda_tune_reset(&d->persist.tune);
    d->persist.grid = grid > 0 ? grid : 0;
    d->persist.fit_ok = 0;
}

void cuda_forward_set_persist_ring(cuda_forward *d, int bytes) {
    d->persist.ring = bytes < 0 ? -1 : bytes;
    d->persist.fit_ok = 0;
}

void cuda_forward_set_persist_tuning(cuda_forward *d, int min_blocks, int sleep_ns, int stage, int ahead) {
    d->persist.min_blocks = min_blocks == 4 ? 4 : 3;
    d->persist.sleep_ns = sleep_ns > 0 ? sleep_ns : 0;
    d->persist.stage = stage != 0;
    d->persist.ahead = ahead != 0;
    d->persist.fit_ok = 0;
}

// ---- the parts' public calls -------------------------------------------------------------------
int cuda_forward_set_lora(cuda_forward *d, const lora_use *u, int n, verr *err) {
    return cuda_lora_set(&d->core, &d->lora, u, n, err);
}

int cuda_forward_sample(cuda_forward *d, const sample_cfg *cfg, int n, sample_out *out, verr *err) {
    return cuda_sample_draw(&d->core, &d->smp, &d->arm, &d->tp, cfg, n, out, err);
}

int cuda_forward_sample_rows(cuda_forward *d, const sample_cfg *cfg, int B, sample_out *out, verr *err) {
    if (d->tp.comm) return verr_set(err, "cuda_forward_sample_rows: not under tensor parallelism");
    return cuda_sample_rows_draw(&d->core, &d->smp, &d->tp, cfg, B, out, err);
}

int cuda_forward_rows(const cuda_forward *d) { return d->core.rows; }

int cuda_forward_arm_entropix(cuda_forward *d, const struct entropix_config_s *c, const double *u, int k,
                              int prev_token, int clarifier, verr *err) {
    return cuda_arm_entropix(&d->core, &d->arm, &d->tp, c, u, k, prev_token, clarifier, err);
}

int cuda_forward_arm_sample(cuda_forward *d, const sample_cfg *cfg, int n, verr *err) {
    return cuda_arm_stock(&d->core, &d->arm, &d->tp, cfg, n, err);
}

void cuda_forward_set_arming(cuda_forward *d, int on) { cuda_arm_set(&d->arm, on); }
void cuda_forward_set_greedy_epilogue(cuda_forward *d, int on) { d->arm.greedy_off = !on; }

void cuda_forward_arm_counts(const cuda_forward *d, long *hits, long *misses) {
    *hits = d->arm.hits, *misses = d->arm.misses;
}

int cuda_forward_tp_id(unsigned char id[CUDA_TP_ID_BYTES], verr *err) { return cuda_tp_id(id, err); }

int cuda_forward_tp_join(cuda_forward *d, const unsigned char id[CUDA_TP_ID_BYTES], double timeout_s, verr *err) {
    return cuda_tp_join(&d->core, &d->tp, id, timeout_s, err);
}

int cuda_forward_tp_share(cuda_forward *d, cuda_forward *lead, verr *err) {
    return cuda_tp_share(&d->core, &d->tp, &lead->tp, lead->core.w, err);
}

void cuda_forward_tp_leave(cuda_forward *d) {
    if (d) cuda_tp_leave(&d->core, &d->tp);
}

// ---- decode graphs -----------------------------------------------------------------------------
// The captured step of slot g no longer matches what this one launches: another capture
// layer, hooks, captures, adapters, scratch, or (armed) kind, draws or buffers.
static int graph_stale(const cuda_forward *d, const graph_slot *g, int cap, int hk, int arm) {
    const cuda_core *f = &d->core;
    if (!g->exec || g->cap != cap || g->scratch != f->ctx.scratch || g->hook_gen != d->hk.gen || g->hook_cap != hk ||
        g->lora_gen != d->lora.gen || g->arm != arm)
        return 1;
    return arm && (g->arm_k != d->arm.k || g->arm_gen != d->arm.gen || g->sample_buf != f->ctx.sample_buf);
}

// Captures the decode step of B rows into g (with the armed draws when arm != 0).
static int graph_capture(cuda_forward *d, graph_slot *g, int B, int cap, int hk, int arm, verr *err) {
    cuda_core *f = &d->core;
    if (g->exec) CK(cudaGraphExecDestroy(g->exec));
    g->exec = NULL;
    // may grow the sampler's arrays, or allocate the argmax: not while capturing
    int greedy = arm == ARM_GREEDY || arm == ARM_LOOP_GREEDY, loop = arm >= ARM_LOOP_GREEDY;
    if (greedy ? cuda_arm_greedy_prepare(&d->arm, err) : arm && !loop && cuda_arm_prepare(f, &d->arm, err))
        return -1;
    CK(cudaStreamBeginCapture(f->ctx.stream, cudaStreamCaptureModeThreadLocal));
    long l0 = f->ctx.n_launches;
    d->greedy_amax = greedy ? d->arm.d_amax : NULL;  // the lm_head's argmax epilogue
    int rc = loop ? cuda_loop_head(d, err) : 0;
    if (rc == 0) rc = cuda_step_decode(d, B, cap, hk, err);
    d->greedy_amax = NULL;
    if (rc == 0 && loop) rc = cuda_loop_tail(d, err);
    else if (rc == 0 && arm) rc = arm == ARM_GREEDY ? cuda_arm_greedy_queue(f, &d->arm, err) : cuda_arm_queue(f, &d->arm, err);
    g->launches = f->ctx.n_launches - l0;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(f->ctx.stream, &graph);
    if (rc == 0 && e != cudaSuccess)
        rc = verr_set(err, "cudaStreamEndCapture failed: %s (%s:%d)", cudaGetErrorString(e), __FILE__, __LINE__);
    if (rc == 0 && (e = cudaGraphInstantiate(&g->exec, graph, 0)) != cudaSuccess) {
        g->exec = NULL;
        rc = verr_set(err, "cudaGraphInstantiate failed: %s (%s:%d)", cudaGetErrorString(e), __FILE__, __LINE__);
    }
    size_t nodes = 0;
    if (rc == 0 && (e = cudaGraphGetNodes(graph, NULL, &nodes)) != cudaSuccess)
        rc = verr_set(err, "cudaGraphGetNodes failed: %s (%s:%d)", cudaGetErrorString(e), __FILE__, __LINE__);
    g->nodes = (long)nodes;
    if (graph) cudaGraphDestroy(graph);
    if (rc) {
        cudaGetLastError();
        return -1;
    }
    d->n_captures++;
    g->cap = cap, g->scratch = f->ctx.scratch, g->hook_gen = d->hk.gen, g->hook_cap = hk, g->lora_gen = d->lora.gen;
    g->arm = arm, g->arm_k = d->arm.k, g->arm_gen = d->arm.gen, g->sample_buf = f->ctx.sample_buf;
    return 0;
}

// Replays the captured decode step of B rows; captures it first when there is none for
// this capture layer, these hooks and captures, or the scratch moved. arm: the ARM_*
// kind of a one-row step whose draws run inside the graph (its own slot, so steps with
// and without draws both replay).
// (A loop step's kind, ARM_LOOP_*, has its own slot too and leaves the armed draws be.)
int cuda_graph_decode(cuda_forward *d, int B, int cap, int hk, int arm, verr *err) {
    cuda_core *f = &d->core;
    graph_slot *g = arm >= ARM_LOOP_GREEDY ? &d->loop_graph
                    : arm == ARM_GREEDY  ? &d->greedy_graph
                    : arm                ? &d->armed_graph
                                         : &d->graphs[B];
    if (graph_stale(d, g, cap, hk, arm) && graph_capture(d, g, B, cap, hk, arm, err)) return -1;
    CK(cudaGraphLaunch(g->exec, f->ctx.stream));
    if (arm == ARM_GREEDY) cuda_arm_greedy_cfg(&d->arm);  // the host's record of what the replay draws with
    if (arm && arm < ARM_LOOP_GREEDY) d->arm.ready = -1;  // the draws come back with the step's wait
    if (B == 1) d->step = (cuda_step_counts){ .launches = g->launches, .graph_nodes = g->nodes };
    return 0;
}

// The host may refill the step block only once the previous step's copy of it ran.
static int wait_params(cuda_forward *d, verr *err) {
    cuda_core *f = &d->core;
    if (f->par_pending) {
        f->ctx.n_syncs++;
        if (cuda_tp_wait(f, &d->tp, err)) return -1;
        f->par_pending = 0;
    }
    return 0;
}

static void advance(kv_view *kv, int T) {
    kv_cache *dst = kv->tail ? kv->tail : kv->trunk;
    dst->len += T;
    if (!kv->tail) kv->n_trunk = kv->trunk->len;
}

// One prefill chunk (T > 1) or a one-token step of one sequence; hk: the HK_* captures
// of the hooks, handed over before it returns. last: the forward's last chunk (an armed
// one-token step draws inside its graph).
static int run_chunk(cuda_forward *d, kv_view *kv, const int *ids, int T, int cap, int hk, int last, verr *err) {
    cuda_core *f = &d->core;
    if (wait_params(d, err) || cuda_core_tables(f, kv, 1, err)) return -1;
    int pos0 = kv_view_len(kv);
    if (T == 1) cuda_core_fill_decode(f, kv, ids, 1);
    else cuda_core_fill_prefill(f, kv, ids, T);
    f->par_pending = 1;
    long l0 = f->ctx.n_launches;
    if (T == 1 && cuda_tune_begin(d, err)) return -1;
    int drawn = 0, persistent = 0;
    if (T == 1 && kv->trunk->table) cuda_persist_skip(d, "a paged KV cache (the scheduler's pool)");
    else if (T == 1) persistent = cuda_persist_step(d, cap, hk, &drawn, err);
    if (persistent < 0) return -1;
    // an armed step's draws go in its graph, else after the step (cuda_arm_enqueue)
    int arm = !persistent && T == 1 && last && d->use_graph ? cuda_arm_graph_kind(&d->arm, d->tp.comm != NULL, cap) : 0;
    int rc = persistent ? 0
             : T > 1    ? cuda_step_prefill(d, T, cap, hk, err)
             : d->use_graph ? cuda_graph_decode(d, 1, cap, hk, arm, err)
                            : cuda_step_decode(d, 1, cap, hk, err);
    if (rc == 0 && T == 1 && (persistent || !d->use_graph))
        d->step = (cuda_step_counts){ .launches = f->ctx.n_launches - l0, .persistent = persistent };
    if (rc == 0 && T == 1 && cap >= 0 && d->tp.comm) rc = cuda_step_tp_stats(d, 1, err);
    if (rc == 0 && T == 1) rc = cuda_tune_end(d, persistent, err);
    if (rc || cuda_hooks_deliver(f, &d->hk, &d->tp, hk, T, pos0, f->last_keys, err)) return -1;
    advance(kv, T);
    return 0;
}

// Device caches of this forward's device, shaped for this model.
static int check_view(const cuda_core *f, const kv_view *kv, verr *err) {
    const model_config *c = &f->m->cfg;
    const kv_cache *parts[2] = { kv->trunk, kv->tail };
    for (int i = 0; i < 2; i++) {
        const kv_cache *p = parts[i];
        if (!p) continue;
        if (!p->dk || !p->cu)
            return verr_set(err, "the KV cache %s is in host memory, but the session runs on CUDA device %d "
                                 "(allocate it with kv_cache_init_like)", i ? "tail" : "trunk", f->ctx.device);
        if (p->cu->device != f->ctx.device || p->n_layers != c->n_layers || p->kv_dim != model_kv_dim(f->m))
            return verr_set(err, "the KV cache %s does not belong to this model on CUDA device %d",
                            i ? "tail" : "trunk", f->ctx.device);
    }
    if (kv->trunk->table && kv->tail)  // a pool's sequence is read as one paged trunk
        return verr_set(err, "a paged KV cache (the scheduler's pool) takes no tail on CUDA device %d", f->ctx.device);
    if (kv->tail && kv->tail->table)
        return verr_set(err, "a paged KV cache (the scheduler's pool) cannot be a tail on CUDA device %d", f->ctx.device);
    return 0;
}

// A tensor-parallel forward whose group failed stays failed.
static int check_tp(const cuda_forward *d, verr *err) {
    if (d->tp.broken) return verr_set(err, "%s", d->tp.why);
    if (d->tp.lead && d->tp.lead->broken) return verr_set(err, "%s", d->tp.lead->why);  // another context's failure
    return 0;
}

static int capture_layer(const cuda_core *f, const forward_state *fw) {
    return fw->attn_layer >= 0 && fw->attn_layer < f->m->cfg.n_layers ? fw->attn_layer : -1;
}

// Queues the copies of rows [0, B) of the logits (into host `logits`; NULL: they stay
// on the device) and of the statistics (into h_stats), then waits: kernel faults
// surface here. When nothing comes back it does not wait: the step stays queued
// (par_pending) and the next wait covers it, the draw's in a decode loop, so a plain
// step costs one host sync (kernel faults then surface there). An armed step's draws
// (queued by then: its graph's copies, or cuda_arm_enqueue's) come back with this wait.
// Under tensor parallelism every step waits: the ranks' streams must all reach the
// step's collectives (on the emulated device a stream runs only when waited on), and a
// peer's failure surfaces in the step that met it.
static int fetch(cuda_forward *d, float *logits, int B, int cap, int scores_keys, verr *err) {
    cuda_core *f = &d->core;
    if (!logits && cap < 0 && scores_keys <= 0 && !d->tp.comm && d->arm.ready != -1) return 0;
    const model_config *c = &f->m->cfg;
    cudaStream_t st = f->ctx.stream;
    cudaError_t e = cudaSuccess;
    if (logits)
        e = cudaMemcpyAsync(logits, f->logits, (size_t)B * c->vocab_size * sizeof(float), cudaMemcpyDeviceToHost,
                            st);
    if (e == cudaSuccess && scores_keys > 0)
        e = cudaMemcpyAsync(f->fw->attn_scores, f->scores, (size_t)c->n_heads * scores_keys * sizeof(float),
                            cudaMemcpyDeviceToHost, st);
    if (e == cudaSuccess && cap >= 0)
        e = cudaMemcpyAsync(f->h_stats, f->stats, 8 * (size_t)f->rows * sizeof(float), cudaMemcpyDeviceToHost, st);
    f->ctx.n_syncs++;
    if (e == cudaSuccess && d->tp.comm) {
        if (cuda_tp_wait(f, &d->tp, err)) return -1;
    } else if (e == cudaSuccess) {
        e = cudaStreamSynchronize(st);
    }
    if (e != cudaSuccess)
        return verr_set(err, "CUDA forward pass failed: %s (%s:%d)", cudaGetErrorString(e), __FILE__, __LINE__);
    f->par_pending = 0;
    return 0;
}

// Row b's 8 statistics of the last fetch: {max, lse, H, V, attn_entropy, attn_varentropy,
// agreement, interaction_strength}.
static void row_stats(const cuda_core *f, int b, float out[8]) {
    memcpy(out, f->h_stats + 4 * b, 4 * sizeof(float));
    memcpy(out + 4, f->h_stats + 4 * (size_t)f->rows + 4 * b, 4 * sizeof(float));
}

static void set_fw_stats(const cuda_core *f, forward_state *fw, int b) {
    float st[8];
    row_stats(f, b, st);
    memcpy(fw->logit_stats, st, sizeof fw->logit_stats);
    memcpy(fw->attn_stats, st + 4, sizeof fw->attn_stats);
    fw->attn_keys = f->last_keys;
    fw->dev_stats = 1;
}

// The CPU forward's check on copied logits. Lazy steps are checked at the draw
// (cuda_sample_draw).
static int check_finite(const cuda_core *f, const float *row, int pos, verr *err) {
    for (int i = 0; i < f->m->cfg.vocab_size; i++)
        if (!isfinite(row[i])) return cuda_core_nonfinite(f, pos, i, row[i], err);
    return 0;
}

int cuda_forward_run(cuda_forward *d, forward_state *fw, kv_view *kv, const int *ids, int T, verr *err) {
    cuda_core *f = &d->core;
    const model_config *c = &f->m->cfg;
    if (T <= 0) return verr_set(err, "forward: no tokens to process");
    for (int t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= c->vocab_size)
            return verr_set(err, "token id %d at index %d is out of range (vocab_size %d)", ids[t], t, c->vocab_size);
    if (T > kv_view_room(kv) || kv_view_len(kv) + T > f->max_ctx)
        return verr_set(err, "%d tokens do not fit: %d of the %d-token context are used (raise --ctx)", T,
                        kv_view_len(kv), f->max_ctx);
    if (check_view(f, kv, err) || check_tp(d, err)) return -1;
    if (cuda_activate(&f->ctx)) return verr_set(err, "%s", f->ctx.err.msg);
    if (cuda_hooks_sync(f, &d->hk, fw->hooks, err)) return -1;
    int cap = capture_layer(f, fw), hk = cuda_hooks_captures(&d->hk);
    fw->dev_stats = 0;
    kv_cache *dst = kv->tail ? kv->tail : kv->trunk;
    int len0 = dst->len, n_trunk0 = kv->n_trunk, rc = 0;
    for (int done = 0; rc == 0 && done < T; done += f->max_T) {
        int n = T - done < f->max_T ? T - done : f->max_T;
        int last = done + n == T;  // the attention hooks read the forward's last query
        rc = run_chunk(d, kv, ids + done, n, last ? cap : -1, last ? hk : hk & ~HK_ATTN, last, err);
    }
    f->logits_stale = 0, f->logits_valid = 0, f->logits_overrun = 0, f->batch_rows = 0;
    if (rc == 0) rc = cuda_arm_enqueue(f, &d->arm, d->tp.comm != NULL, cap, err);  // an armed step not drawn in its graph draws here
    d->arm.armed = 0;
    if (rc == 0)
        rc = fetch(d, fw->lazy_logits ? NULL : fw->logits, 1, cap, cap >= 0 && fw->copy_scores ? f->last_keys : 0,
                   err);
    d->arm.ready = rc == 0 && d->arm.ready == -1;
    if (rc) {  // the cache keeps its length: the rows written past it are never read
        dst->len = len0, kv->n_trunk = n_trunk0;
        return -1;
    }
    f->sample_row = 0, f->logits_stale = fw->lazy_logits, f->logits_valid = 1;
    if (cap >= 0) set_fw_stats(f, fw, 0);
    if (!fw->lazy_logits) return check_finite(f, fw->logits, kv_view_len(kv) - 1, err);
    return 0;
}

int cuda_forward_logits(cuda_forward *d, forward_state *fw, verr *err) {
    cuda_core *f = &d->core;
    if (!f->logits_stale) return 0;
    if (!f->logits_valid)
        return verr_set(err, f->logits_overrun ? "no logits: the device decode loop ran past its stop and the device "
                                                 "holds a discarded step's (use --lookahead 0 to keep them)"
                                               : "no logits: the last forward pass failed");
    OP(cuda_activate(&f->ctx));
    size_t V = (size_t)f->m->cfg.vocab_size;
    OP(cuda_download(&f->ctx, fw->logits, f->logits + (size_t)f->sample_row * V, V * sizeof(float)));
    f->logits_stale = 0;
    return 0;
}

int cuda_forward_wait(cuda_forward *d, verr *err) {
    cuda_core *f = &d->core;
    OP(cuda_activate(&f->ctx));
    return wait_params(d, err);
}

// ---- several sequences -----------------------------------------------------------------------

// Every row's id, room and cache, and no two rows writing to one cache (forward_batch's rules).
static int check_batch(const cuda_core *f, const kv_view *views, const int *ids, int B, verr *err) {
    const model_config *c = &f->m->cfg;
    if (B < 1) return verr_set(err, "cuda_forward_batch: %d rows, want at least 1", B);
    for (int b = 0; b < B; b++) {
        const kv_view *v = &views[b];
        if (ids[b] < 0 || ids[b] >= c->vocab_size)
            return verr_set(err, "token id %d of row %d is out of range (vocab_size %d)", ids[b], b, c->vocab_size);
        if (kv_view_room(v) < 1 || kv_view_len(v) + 1 > f->max_ctx)
            return verr_set(err, "cuda_forward_batch: row %d does not fit: %d of the %d-token context are used, "
                                 "%d free in its cache", b, kv_view_len(v), f->max_ctx, kv_view_room(v));
        if (check_view(f, v, err)) return -1;
        const kv_cache *dst = v->tail ? v->tail : v->trunk;
        for (int a = 0; a < b; a++)
            if ((views[a].tail ? views[a].tail : views[a].trunk) == dst)
                return verr_set(err, "cuda_forward_batch: rows %d and %d write to the same KV cache (give each its "
                                     "own tail)", a, b);
    }
    return 0;
}

// The rows a captured step of B live rows launches: B up to one matvec tile, then the
// row bucket (multiples of 16), so any batch replays one of at most 8 + rows / 16
// graphs; the rows past B are padding (cuda_core_fill_pad).
static int step_rows(const cuda_core *f, int B) {
    int nb = B <= CUDA_MATVEC_ROWS ? B : cuda_row_bucket(B);
    return nb < f->rows ? nb : f->rows;
}

// Rows [0, B) of one step (B <= f->rows): queue, fetch, advance the views.
static int run_rows(cuda_forward *d, kv_view *views, const int *ids, int B, int cap, float *logits, float *stats,
                    verr *err) {
    cuda_core *f = &d->core;
    if (wait_params(d, err) || cuda_core_tables(f, views, B, err)) return -1;
    cuda_core_fill_decode(f, views, ids, B);
    int nb = d->use_graph ? step_rows(f, B) : B;  // without graphs nothing is gained by padding
    cuda_core_fill_pad(f, B, nb);
    f->par_pending = 1;
    cuda_persist_skip(d, "a batch of rows");
    int rc = d->use_graph ? cuda_graph_decode(d, nb, cap, 0, 0, err) : cuda_step_decode(d, nb, cap, 0, err);
    if (rc == 0 && cap >= 0 && d->tp.comm) rc = cuda_step_tp_stats(d, B, err);
    if (rc || fetch(d, logits, B, cap, 0, err)) return -1;
    for (int b = 0; b < B; b++) {
        advance(&views[b], 1);
        if (stats && cap >= 0) row_stats(f, b, stats + 8 * (size_t)b);
    }
    return 0;
}

int cuda_forward_batch(cuda_forward *d, forward_state *fw, kv_view *views, const int *ids, int B, float *logits,
                       float *stats, verr *err) {
    cuda_core *f = &d->core;
    if (check_batch(f, views, ids, B, err) || check_tp(d, err)) return -1;
    if (cuda_activate(&f->ctx)) return verr_set(err, "%s", f->ctx.err.msg);
    if (cuda_hooks_sync(f, &d->hk, fw->hooks, err)) return -1;  // interventions only: batches capture nothing
    int cap = capture_layer(f, fw), *saved = malloc(2 * sizeof(int) * (size_t)B);
    if (!saved) return verr_set(err, "out of memory");
    for (int b = 0; b < B; b++) {
        saved[2 * b] = (views[b].tail ? views[b].tail : views[b].trunk)->len;
        saved[2 * b + 1] = views[b].n_trunk;
    }
    fw->dev_stats = 0, f->logits_stale = 0, f->logits_valid = 0, f->logits_overrun = 0, f->batch_rows = 0;
    d->arm.armed = d->arm.ready = 0;  // a batch is never armed
    size_t V = (size_t)f->m->cfg.vocab_size;
    int done = 0, n = 0, rc = 0;
    for (; rc == 0 && done < B; done += n) {
        n = B - done < f->rows ? B - done : f->rows;
        rc = run_rows(d, views + done, ids + done, n, cap, logits + done * V, stats ? stats + 8 * (size_t)done : NULL,
                      err);
    }
    if (rc) {  // every row keeps its length, as on the CPU: rows written past it are never read
        for (int b = 0; b < B; b++) {
            (views[b].tail ? views[b].tail : views[b].trunk)->len = saved[2 * b];
            views[b].n_trunk = saved[2 * b + 1];
        }
    } else {  // as forward_batch: fw->logits (and a requested capture) are the last row's
        if (logits) memmove(fw->logits, logits + (size_t)(B - 1) * V, V * sizeof(float));
        f->sample_row = n - 1, f->logits_valid = 1, f->logits_stale = !logits;  // (no logits: they stay on the device)
        f->batch_rows = B <= f->rows ? B : 0;
        if (cap >= 0) set_fw_stats(f, fw, n - 1);
        if (cap >= 0 && fw->copy_scores) {
            const model_config *c = &f->m->cfg;
            const float *sc = f->scores + (size_t)(n - 1) * c->n_heads * f->max_ctx;
            if (cuda_download(&f->ctx, fw->attn_scores, sc, (size_t)c->n_heads * f->last_keys * sizeof(float)))
                rc = verr_set(err, "%s", f->ctx.err.msg);
        }
    }
    free(saved);
    return rc;
}

#endif
