// forward_cuda.c: see forward_cuda.h. The layer sequence mirrors model/forward.c:
//   x = embed(ids); xb = norm(x)
//   per layer: q|k|v = xb @ Wqkv (+ bias), q/k norm (Qwen3), rope, store k,v (bf16),
//              att = attention(q, cache); x += att @ Wo; xb = norm(x)
//              x += down(silu(gate) * up); xb = norm(x) with the next layer's (or the final) weight
//   logits = lm_head(xb of the last token)
// wq/wk/wv and gate/up are concatenated at upload, so a decode step runs one matvec for
// each pair; prefill runs cuBLAS on the row blocks of the same matrices.
// A decode step is B rows (B sequences of one token each, B == 1 for plain decode): the
// matvecs read each weight once for up to 8 rows, the attention takes every row's own
// KV segments from its device record. Prefill chunks (T > 1 tokens of one sequence) take
// the GEMM path. Weights and buffers: model/forward_cuda_upload.c.
// Per-step values (ids, positions, cache rows, KV segment pointers and lengths) live in
// one device block filled from a pinned host twin by the step's first copy: a captured
// decode graph (one per B) replays with new values and no re-capture. A one-row step
// armed to draw (model/forward_cuda_arm.c) has a graph of its own that ends with the
// draws and their copies back.
// With a capture layer, the step ends with the entropix statistics on the device
// (cuda_vocab_stats on the logits, cuda_attn_stats on the captured scores): 8 floats
// come back with the logits; the scores themselves only with fw->copy_scores.
#include "model/forward_cuda.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifndef VARENT_CUDA

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
    *out = (cuda_step_counts){ 0, 0, 0, 0 };
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
int cuda_forward_sample(cuda_forward *f, const sample_cfg *cfg, int n, sample_out *out, verr *err) {
    (void)f, (void)cfg, (void)n, (void)out;
    return verr_set(err, NO_CUDA);
}


#else

#include "model/cuda/internal.h"

int cuda_forward_open(cuda_forward **out, const model *m, forward_state *fw, int device,
                      const cuda_forward *share, verr *err) {
    *out = NULL;
    const model_config *c = &m->cfg;
    cuda_forward *f = calloc(1, sizeof *f);
    if (!f) return verr_set(err, "out of memory");
    f->m = m, f->fw = fw, f->max_T = fw->max_T, f->max_ctx = fw->ctx, f->use_graph = 1;
    f->rows = fw->max_T < CUDA_ROWS ? fw->max_T : CUDA_ROWS;
    if (cuda_init(&f->ctx, device, err)) {
        free(f);
        return -1;
    }
    attn_shape sh = { m->tp.n_heads, m->tp.n_kv_heads, c->head_dim, 1.0f / sqrtf((float)c->head_dim) };
    int rc = 0;
    if (cuda_attention_validate(&f->ctx, sh)) {
        rc = verr_set(err, "%s: this model's attention shape is not supported on CUDA: %s", m->dir, f->ctx.err.msg);
    } else if (share) {
        if (share->ctx.device != device || share->m->cfg.n_layers != c->n_layers)
            rc = verr_set(err, "cuda_forward_open: shared weights are on device %d, not %d", share->ctx.device,
                          device);
        f->w = share->w;
    } else {
        rc = cuda_forward_upload(f, err) || cuda_lora_reg_new(f, err);
        f->w = &f->own;
    }
    if (rc == 0) rc = cuda_forward_alloc(f, err);
    if (rc) {
        cuda_forward_close(f);
        return -1;
    }
    cuda_forward_pin_host(f);
    *out = f;
    return 0;
}

void cuda_forward_close(cuda_forward *f) {
    if (!f) return;
    // Teardown: nothing here can be acted on; errors are cleared, not reported.
    if (f->ctx.stream) {
        cudaSetDevice(f->ctx.device);
        cudaStreamSynchronize(f->ctx.stream);
    }
    for (int b = 0; b <= CUDA_ROWS; b++)
        if (f->graphs[b].exec) cudaGraphExecDestroy(f->graphs[b].exec);
    if (f->armed_graph.exec) cudaGraphExecDestroy(f->armed_graph.exec);
    if (f->pin_logits) {
        f->fw->logits = f->fw_logits, f->fw->attn_scores = f->fw_scores;
        cudaFreeHost(f->pin_logits);
        cudaFreeHost(f->pin_scores);
    }
    if (f->h_par) cudaFreeHost(f->h_par);
    if (f->h_stats) cudaFreeHost(f->h_stats);
    cuda_free(f->d_cfg);
    cuda_free(f->d_out);
    cuda_arm_free(f);
    if (f->h_cfg) cudaFreeHost(f->h_cfg);
    if (f->h_out) cudaFreeHost(f->h_out);
    cuda_hooks_free(f);
    cuda_lora_free(f);
    cuda_tp_free(f);
    cuda_free(f->act);
    cuda_free(f->own.arena);
    free(f->own.layers);
    cuda_destroy(&f->ctx);
    cudaGetLastError();
    free(f);
}

struct cuda_ctx *cuda_forward_ctx(cuda_forward *f) { return &f->ctx; }
int cuda_forward_device(const cuda_forward *f) { return f->ctx.device; }
size_t cuda_forward_weight_bytes(const cuda_forward *f) { return f->w->bytes; }
void cuda_forward_set_graphs(cuda_forward *f, int on) { f->use_graph = on; }

void cuda_forward_counts(const cuda_forward *f, cuda_step_counts *out) {
    *out = f->step;
    out->syncs = f->ctx.n_syncs;
    out->captures = f->n_captures;
}

// ---- the step block ------------------------------------------------------------------------
static step_params params(cuda_forward *f, void *base) {
    return cuda_forward_params(base, f->m->cfg.n_layers, f->max_T, f->rows);
}

// Row b's records for T tokens appended to kv. Mirrors forward.c's kv_span.
static void fill_row(cuda_forward *f, step_params p, int b, const kv_view *kv, int T) {
    const model_config *c = &f->m->cfg;
    const kv_cache *tr = kv->trunk, *tl = kv->tail, *dst = tl ? tl : tr;
    size_t kv_dim = (size_t)model_kv_dim(f->m);
    int n_trunk = tl ? kv->n_trunk : tr->len + T, n_tail = tl ? tl->len + T : 0;
    p.lens[b].n_trunk = n_trunk;
    p.lens[b].n_keys = n_trunk + n_tail;
    f->last_keys = n_trunk + n_tail;
    for (int l = 0; l < c->n_layers; l++) {
        cuda_kv_layer *L = &p.layers[(size_t)l * f->rows + b];
        L->k_trunk = (const uint16_t *)tr->dk + (size_t)l * tr->ctx * kv_dim;
        L->v_trunk = (const uint16_t *)tr->dv + (size_t)l * tr->ctx * kv_dim;
        L->k_tail = tl ? (const uint16_t *)tl->dk + (size_t)l * tl->ctx * kv_dim : NULL;
        L->v_tail = tl ? (const uint16_t *)tl->dv + (size_t)l * tl->ctx * kv_dim : NULL;
        L->k_dst = (uint16_t *)dst->dk + (size_t)l * dst->ctx * kv_dim;
        L->v_dst = (uint16_t *)dst->dv + (size_t)l * dst->ctx * kv_dim;
    }
}

// A prefill chunk: T tokens of one sequence, record 0.
static void fill_prefill(cuda_forward *f, const kv_view *kv, const int *ids, int T) {
    step_params p = params(f, f->h_par);
    const kv_cache *dst = kv->tail ? kv->tail : kv->trunk;
    int pos0 = kv_view_len(kv);
    fill_row(f, p, 0, kv, T);
    for (int t = 0; t < T; t++) p.ids[t] = ids[t], p.pos[t] = pos0 + t, p.rows[t] = dst->len + t;
}

// A decode step: one token for each of B views, record b for row b.
static void fill_decode(cuda_forward *f, const kv_view *views, const int *ids, int B) {
    step_params p = params(f, f->h_par);
    for (int b = 0; b < B; b++) {
        const kv_cache *dst = views[b].tail ? views[b].tail : views[b].trunk;
        fill_row(f, p, b, &views[b], 1);
        p.ids[b] = ids[b], p.pos[b] = kv_view_len(&views[b]), p.rows[b] = dst->len;
    }
}

// ---- the step ----------------------------------------------------------------------------------
// Row block [r0, r0 + rows) of a row-major matrix with `cols` columns (or of a vector: cols 1).
static wref rows_of(wref w, size_t r0, size_t cols) {
    return (wref){ (const char *)w.data + r0 * cols * wtype_size(w.type), w.type };
}

// The step's statistics: vocab stats of the B logits rows, attention stats of each row's
// capture (row b's key count read from its record).
static int enqueue_stats(cuda_forward *f, int B, step_params dp, verr *err) {
    const model_config *c = &f->m->cfg;
    OP(cuda_vocab_stats(&f->ctx, f->stats, f->logits, B, c->vocab_size));
    for (int b = 0; b < B; b++)
        OP(cuda_attn_stats(&f->ctx, f->stats + 4 * (size_t)f->rows + 4 * b,
                           f->scores + (size_t)b * c->n_heads * f->max_ctx, c->n_heads, f->max_ctx, dp.lens + b));
    return 0;
}

// Tensor parallelism: the statistics after the step (graph), every rank's heads gathered
// into the capture first (where they go depends on each row's key count, which the host
// knows and a captured graph cannot).
static int enqueue_tp_stats(cuda_forward *f, int B, verr *err) {
    if (cuda_tp_scores(f, B, params(f, f->h_par).lens, err)) return -1;
    return enqueue_stats(f, B, params(f, f->d_par), err);
}

// The attention capture of layer l: the hooks' slot and/or the capture layer's buffer
// (both: the slot, copied into f->scores after the attention).
static float *scores_of(cuda_forward *f, int cap, int hk, int l) {
    float *s = cuda_hooks_scores(f, hk, l);
    return s ? s : l != cap ? NULL : f->tp.comm ? f->tp.part_scores : f->scores;
}

// (Under tensor parallelism the slot holds this rank's heads until the step's end, and
// the capture layer's statistics gather them from part_scores.)
static int share_scores(cuda_forward *f, int cap, int hk, int l, verr *err) {
    float *s = cuda_hooks_scores(f, hk, l);
    int heads = f->tp.comm ? f->m->tp.max_heads : f->m->cfg.n_heads;
    if (s && l == cap)
        CK(cudaMemcpyAsync(f->tp.comm ? f->tp.part_scores : f->scores, s, sizeof(float) * heads * f->max_ctx,
                           cudaMemcpyDeviceToDevice, f->ctx.stream));
    return 0;
}

// A skipped layer on the residual stream x [T, dim]: its captures and control vector.
static int skip_layer(cuda_forward *f, int hk, int l, int T, verr *err) {
    const float *cv = cuda_hooks_cvec(f, l);
    if (cuda_hooks_skipped(f, hk, l, f->x, T, err)) return -1;
    if (cv) OP(cuda_add_bias(&f->ctx, f->x, (wref){ cv, WT_F32 }, T, f->m->cfg.dim));
    return cuda_hooks_point(f, hk, l, HOOK_RESID_POST, f->x, T, err);
}

// Layer l of a prefill chunk of T > 1 tokens: x is the residual stream, xb its norm
// with this layer's attn_norm; leaves xb normed with the next layer's (or the final) weight.
static int prefill_layer(cuda_forward *f, int l, int T, int cap, int hk, verr *err) {
    const model_config *c = &f->m->cfg;
    const dev_weights *w = f->w;
    const dev_layer *L = &w->layers[l];
    cuda_ctx *x = &f->ctx;
    int dim = c->dim, hd = c->head_dim, nh = f->m->tp.n_heads, nkv = f->m->tp.n_kv_heads, hid = f->m->tp.n_ffn;
    int q_dim = nh * hd, kv_dim = nkv * hd;
    float eps = c->norm_eps;
    attn_shape sh = { nh, nkv, hd, 1.0f / sqrtf((float)hd) };
    step_params dp = params(f, f->d_par), hp = params(f, f->h_par);
    wref next = l + 1 < c->n_layers ? w->layers[l + 1].attn_norm : w->final_norm;
    if (cuda_hooks_point(f, hk, l, HOOK_RESID_PRE, f->x, T, err)) return -1;
    if (cuda_hooks_skip(f, l)) {  // the identity: the next layer's norm of the same x
        if (skip_layer(f, hk, l, T, err)) return -1;
        OP(cuda_rmsnorm(x, f->xb, f->x, next, T, dim, eps));
        return 0;
    }
    float *q = f->qkv, *k = q + (size_t)T * q_dim, *v = k + (size_t)T * kv_dim;  // [T,q] [T,kv] [T,kv]
    OP(cuda_matmul(x, q, f->xb, rows_of(L->wqkv, 0, dim), T, dim, q_dim));
    OP(cuda_matmul(x, k, f->xb, rows_of(L->wqkv, q_dim, dim), T, dim, kv_dim));
    OP(cuda_matmul(x, v, f->xb, rows_of(L->wqkv, q_dim + kv_dim, dim), T, dim, kv_dim));
    float *qkv_out[3] = { q, k, v };
    for (int p = LORA_Q; p <= LORA_V; p++)
        if (cuda_lora_on(f, l, (lora_proj)p) && cuda_lora_apply(f, l, (lora_proj)p, qkv_out[p], f->xb, T, 0, err))
            return -1;
    if (L->bqkv.data) {
        OP(cuda_add_bias(x, q, rows_of(L->bqkv, 0, 1), T, q_dim));
        OP(cuda_add_bias(x, k, rows_of(L->bqkv, q_dim, 1), T, kv_dim));
        OP(cuda_add_bias(x, v, rows_of(L->bqkv, q_dim + kv_dim, 1), T, kv_dim));
    }
    if (L->q_norm.data) {  // Qwen3: RMSNorm over each head's vector, before RoPE
        OP(cuda_rmsnorm(x, q, q, L->q_norm, T * nh, hd, eps));
        OP(cuda_rmsnorm(x, k, k, L->k_norm, T * nkv, hd, eps));
    }
    OP(cuda_rope(x, q, dp.pos, T, nh, hd, w->inv_freq, 0));
    OP(cuda_rope(x, k, dp.pos, T, nkv, hd, w->inv_freq, 0));
    const cuda_kv_layer *dl = &dp.layers[(size_t)l * f->rows], *hl = &hp.layers[(size_t)l * f->rows];
    OP(cuda_kv_store_dev(x, dl, k, v, dp.rows, T, kv_dim));
    kv_span span = { hl->k_trunk, hl->v_trunk, hp.lens[0].n_trunk, hl->k_tail, hl->v_tail,
                     hp.lens[0].n_keys - hp.lens[0].n_trunk, 1 };  // the device cache is bf16
    OP(cuda_attention(x, f->att, q, span, T, sh, scores_of(f, cap, hk, l)));
    if (share_scores(f, cap, hk, l, err) || cuda_hooks_ablate(f, l, f->att, T, err)) return -1;
    OP(cuda_matmul(x, f->y, f->att, L->wo, T, q_dim, dim));
    if (cuda_lora_on(f, l, LORA_O) && cuda_lora_apply(f, l, LORA_O, f->y, f->att, T, 0, err)) return -1;
    if (f->tp.comm && cuda_tp_sum(f, f->y, (size_t)T * dim, err)) return -1;  // the ranks' partial sums
    if (cuda_hooks_point(f, hk, l, HOOK_ATTN_OUT, f->y, T, err)) return -1;
    OP(cuda_rmsnorm_residual(x, f->xb, f->x, f->y, L->ffn_norm, T, dim, eps));
    if (cuda_hooks_point(f, hk, l, HOOK_RESID_MID, f->x, T, err)) return -1;
    float *gate = f->hb, *up = f->hb + (size_t)T * hid;
    OP(cuda_matmul(x, gate, f->xb, rows_of(L->w_gu, 0, dim), T, dim, hid));
    OP(cuda_matmul(x, up, f->xb, rows_of(L->w_gu, hid, dim), T, dim, hid));
    if ((cuda_lora_on(f, l, LORA_GATE) && cuda_lora_apply(f, l, LORA_GATE, gate, f->xb, T, 0, err)) ||
        (cuda_lora_on(f, l, LORA_UP) && cuda_lora_apply(f, l, LORA_UP, up, f->xb, T, 0, err)))
        return -1;
    OP(cuda_swiglu(x, gate, gate, up, (size_t)T * hid));
    OP(cuda_matmul(x, f->y, gate, L->w_down, T, hid, dim));
    if (cuda_lora_on(f, l, LORA_DOWN) && cuda_lora_apply(f, l, LORA_DOWN, f->y, gate, T, 0, err)) return -1;
    if (f->tp.comm && cuda_tp_sum(f, f->y, (size_t)T * dim, err)) return -1;
    if (cuda_hooks_point(f, hk, l, HOOK_MLP_OUT, f->y, T, err)) return -1;
    const float *cv = cuda_hooks_cvec(f, l);  // x += (mlp_out + vector), as the decode epilogue adds it
    if (cv) OP(cuda_add_bias(x, f->y, (wref){ cv, WT_F32 }, T, dim));
    OP(cuda_rmsnorm_residual(x, f->xb, f->x, f->y, next, T, dim, eps));
    return cuda_hooks_point(f, hk, l, HOOK_RESID_POST, f->x, T, err);
}

// Queues a prefill chunk of T > 1 tokens (cuBLAS GEMMs, the prefill attention), starting
// with the step block's upload. hk: the HK_* captures of the hooks.
static int enqueue_prefill(cuda_forward *f, int T, int cap, int hk, verr *err) {
    const model_config *c = &f->m->cfg;
    const dev_weights *w = f->w;
    cuda_ctx *x = &f->ctx;
    int dim = c->dim;
    step_params dp = params(f, f->d_par);
    CK(cudaMemcpyAsync(f->d_par, f->h_par, f->par_bytes, cudaMemcpyHostToDevice, x->stream));
    OP(cuda_embed(x, f->x, w->embed, dp.ids, T, dim));
    OP(cuda_rmsnorm(x, f->xb, f->x, w->layers[0].attn_norm, T, dim, c->norm_eps));
    for (int l = 0; l < c->n_layers; l++)
        if (prefill_layer(f, l, T, cap, hk, err)) return -1;
    if (!f->tp.comm) {
        OP(cuda_matvec(x, f->logits, f->xb + (size_t)(T - 1) * dim, w->lm_head, dim, c->vocab_size));
    } else {  // this rank's vocabulary rows, then every rank's
        OP(cuda_matvec(x, f->tp.part_logits, f->xb + (size_t)(T - 1) * dim, w->lm_head, dim, f->m->tp.n_vocab));
        if (cuda_tp_logits(f, 1, err)) return -1;
    }
    if (cap < 0) return 0;
    return f->tp.comm ? enqueue_tp_stats(f, 1, err) : enqueue_stats(f, 1, dp, err);
}

// The decode step's o_proj or down projection of rows in [B, n_in] into the residual
// stream x [B, dim], plus cv (NULL: none) when given: one matvec whose store adds
// (cv as its bias); with point p captured, the product lands in y first, then the adds.
static int decode_project(cuda_forward *f, int hk, int l, int p, const float *in, wref W, int n_in, int B,
                          const float *cv, verr *err) {
    cuda_ctx *x = &f->ctx;
    int dim = f->m->cfg.dim;
    lora_proj lp = p == HOOK_ATTN_OUT ? LORA_O : LORA_DOWN;
    int lo = cuda_lora_on(f, l, lp);  // its delta joins the product (a partial sum under TP)
    int wanted = cuda_hooks_wants(f, hk, l, p);
    if (f->tp.comm && !wanted) {  // rank 0 adds its partial product to the residual stream,
        // the others replace theirs with their partial product: the all-reduce of x is then
        // x + sum_r W_r in_r (+ cv), with no extra launch for the add
        const cuda_mv_fuse store = { NULL, 0.f, f->tp.rank == 0, f->tp.rank == 0 ? cv : NULL };
        OP(cuda_matvec_rows_fused(x, f->x, in, W, n_in, dim, B, dim, dim, &store));
        if (lo && cuda_lora_apply(f, l, lp, f->x, in, B, 1, err)) return -1;
        return cuda_tp_sum(f, f->x, (size_t)B * dim, err);
    }
    if (!wanted) {
        const cuda_mv_fuse residual = { NULL, 0.f, 1, cv };
        OP(cuda_matvec_rows_fused(x, f->x, in, W, n_in, dim, B, dim, dim, &residual));
        return lo ? cuda_lora_apply(f, l, lp, f->x, in, B, 1, err) : 0;
    }
    OP(cuda_matvec_rows(x, f->y, in, W, n_in, dim, B, dim, dim));
    if (lo && cuda_lora_apply(f, l, lp, f->y, in, B, 1, err)) return -1;
    if (f->tp.comm && cuda_tp_sum(f, f->y, (size_t)B * dim, err)) return -1;  // captured: the whole product
    if (cuda_hooks_point(f, hk, l, p, f->y, B, err)) return -1;
    if (cv) OP(cuda_add_bias(x, f->y, (wref){ cv, WT_F32 }, B, dim));  // the fused store's v + bias
    OP(cuda_add(x, f->x, f->y, (size_t)B * dim));                       // and its out += v
    return 0;
}

// LoRA on q, k, v of a decode step: their input is the normed x, which the fused qkv
// matvec never writes, so it is normed here first (xb [B, dim]).
static int decode_lora_qkv(cuda_forward *f, int l, int B, float *q, float *k, float *v, verr *err) {
    if (!cuda_lora_on(f, l, LORA_Q) && !cuda_lora_on(f, l, LORA_K) && !cuda_lora_on(f, l, LORA_V)) return 0;
    const model_config *c = &f->m->cfg;
    OP(cuda_rmsnorm(&f->ctx, f->xb, f->x, f->w->layers[l].attn_norm, B, c->dim, c->norm_eps));
    float *out[3] = { q, k, v };
    for (int p = LORA_Q; p <= LORA_V; p++)
        if (cuda_lora_on(f, l, (lora_proj)p) && cuda_lora_apply(f, l, (lora_proj)p, out[p], f->xb, B, 1, err))
            return -1;
    return 0;
}

// The MLP's first half of a decode step with LoRA on gate or up: the deltas go in before
// the SwiGLU, so the one-launch kernel gives way to norm, gate|up matvec (planar
// [B, hid] twice in hb), the deltas and cuda_swiglu into hb's first half.
static int decode_lora_glu(cuda_forward *f, int l, int B, verr *err) {
    const model_config *c = &f->m->cfg;
    cuda_ctx *x = &f->ctx;
    int dim = c->dim, hid = f->m->tp.n_ffn;
    float *gate = f->hb, *up = f->hb + (size_t)B * hid;
    OP(cuda_rmsnorm(x, f->xb, f->x, f->w->layers[l].ffn_norm, B, dim, c->norm_eps));
    OP(cuda_matvec_rows(x, f->hb, f->xb, f->w->layers[l].w_gu, dim, 2 * hid, B, hid, 2 * hid));
    if ((cuda_lora_on(f, l, LORA_GATE) && cuda_lora_apply(f, l, LORA_GATE, gate, f->xb, B, 1, err)) ||
        (cuda_lora_on(f, l, LORA_UP) && cuda_lora_apply(f, l, LORA_UP, up, f->xb, B, 1, err)))
        return -1;
    OP(cuda_swiglu(x, gate, gate, up, (size_t)B * hid));
    return 0;
}

// Layer l of a decode step of B rows on the residual stream f->x. Every RMSNorm is
// folded into the matvec that reads it, and every residual add into the matvec that
// produces it.
static int decode_layer(cuda_forward *f, int l, int B, int cap, int hk, step_params dp, verr *err) {
    const model_config *c = &f->m->cfg;
    const dev_weights *w = f->w;
    const dev_layer *L = &w->layers[l];
    cuda_ctx *x = &f->ctx;
    int dim = c->dim, hd = c->head_dim, nh = f->m->tp.n_heads, nkv = f->m->tp.n_kv_heads, hid = f->m->tp.n_ffn;
    int q_dim = nh * hd, kv_dim = nkv * hd, qkv_dim = q_dim + 2 * kv_dim;
    float eps = c->norm_eps;
    attn_shape sh = { nh, nkv, hd, 1.0f / sqrtf((float)hd) };
    if (cuda_hooks_point(f, hk, l, HOOK_RESID_PRE, f->x, B, err)) return -1;
    if (cuda_hooks_skip(f, l)) return skip_layer(f, hk, l, B, err);  // nothing else launches
    const cuda_mv_fuse attn_norm = { (const float *)L->attn_norm.data, eps, 0, (const float *)L->bqkv.data };
    const cuda_mv_fuse ffn_norm = { (const float *)L->ffn_norm.data, eps, 0, NULL };
    // One matvec over Wqkv, planar output: q [B, q_dim], k [B, kv_dim], v [B, kv_dim].
    float *q = f->qkv, *k = q + (size_t)B * q_dim, *v = k + (size_t)B * kv_dim;
    OP(cuda_matvec_rows_fused(x, q, f->x, L->wqkv, dim, qkv_dim, B, q_dim, q_dim + kv_dim, &attn_norm));
    if (decode_lora_qkv(f, l, B, q, k, v, err)) return -1;
    const cuda_kv_layer *dl = &dp.layers[(size_t)l * f->rows];
    // Qwen3's per-head q/k RMSNorm, RoPE and the KV store run inside the attention launch.
    const cuda_rope_kv rk = { k, v, dp.pos, dp.rows, w->inv_freq, (const float *)L->q_norm.data,
                              (const float *)L->k_norm.data, eps };
    OP(cuda_attention_decode_rows_rope(x, f->att, q, &rk, dl, dp.lens, B, f->max_ctx, sh,
                                       scores_of(f, cap, hk, l)));
    if (share_scores(f, cap, hk, l, err) || cuda_hooks_ablate(f, l, f->att, B, err) ||
        decode_project(f, hk, l, HOOK_ATTN_OUT, f->att, L->wo, q_dim, B, NULL, err) ||
        cuda_hooks_point(f, hk, l, HOOK_RESID_MID, f->x, B, err))
        return -1;
    float *h = f->hb;  // [B, hid] = silu(gate) * up, one launch (hb holds [B, 2*hid] if it falls back)
    if (cuda_lora_on(f, l, LORA_GATE) || cuda_lora_on(f, l, LORA_UP)) {
        if (decode_lora_glu(f, l, B, err)) return -1;
    } else {
        OP(cuda_matvec_glu_rows(x, h, f->hb, f->x, L->w_gu, dim, hid, B, &ffn_norm));
    }
    if (decode_project(f, hk, l, HOOK_MLP_OUT, h, L->w_down, hid, B, cuda_hooks_cvec(f, l), err)) return -1;
    return cuda_hooks_point(f, hk, l, HOOK_RESID_POST, f->x, B, err);
}

// Queues a decode step of B rows (1 <= B <= f->rows), one token each, every row with its
// own KV records. Reads per-step values only on the device, so it can be captured.
// hk: the HK_* captures of the hooks (single-sequence steps only).
static int enqueue_decode(cuda_forward *f, int B, int cap, int hk, verr *err) {
    const model_config *c = &f->m->cfg;
    const dev_weights *w = f->w;
    cuda_ctx *x = &f->ctx;
    step_params dp = params(f, f->d_par);
    CK(cudaMemcpyAsync(f->d_par, f->h_par, f->par_bytes, cudaMemcpyHostToDevice, x->stream));
    OP(cuda_embed(x, f->x, w->embed, dp.ids, B, c->dim));
    for (int l = 0; l < c->n_layers; l++)
        if (decode_layer(f, l, B, cap, hk, dp, err)) return -1;
    const cuda_mv_fuse final_norm = { (const float *)w->final_norm.data, c->norm_eps, 0, NULL };
    if (!f->tp.comm) {
        OP(cuda_matvec_rows_fused(x, f->logits, f->x, w->lm_head, c->dim, c->vocab_size, B, c->vocab_size,
                                  c->vocab_size, &final_norm));
    } else {  // this rank's vocabulary rows of every row, then every rank's
        int nv = f->m->tp.n_vocab;
        OP(cuda_matvec_rows_fused(x, f->tp.part_logits, f->x, w->lm_head, c->dim, nv, B, nv, nv, &final_norm));
        if (cuda_tp_logits(f, B, err)) return -1;
    }
    return cap >= 0 && !f->tp.comm ? enqueue_stats(f, B, dp, err) : 0;  // under TP after the step
}

// The captured step of slot g no longer matches what this one launches: another capture
// layer, hooks, captures, adapters, scratch, or (armed) kind, draws or buffers.
static int graph_stale(const cuda_forward *f, const graph_slot *g, int cap, int hk, int arm) {
    if (!g->exec || g->cap != cap || g->scratch != f->ctx.scratch || g->hook_gen != f->hk.gen || g->hook_cap != hk ||
        g->lora_gen != f->lora.gen || g->arm != arm)
        return 1;
    return arm && (g->arm_k != f->arm.k || g->arm_gen != f->arm.gen || g->sample_buf != f->ctx.sample_buf);
}

// Captures the decode step of B rows into g (with the armed draws when arm != 0).
static int graph_capture(cuda_forward *f, graph_slot *g, int B, int cap, int hk, int arm, verr *err) {
    if (g->exec) CK(cudaGraphExecDestroy(g->exec));
    g->exec = NULL;
    if (arm && cuda_arm_prepare(f, err)) return -1;  // may grow the sampler's arrays: not while capturing
    CK(cudaStreamBeginCapture(f->ctx.stream, cudaStreamCaptureModeThreadLocal));
    long l0 = f->ctx.n_launches;
    int rc = enqueue_decode(f, B, cap, hk, err);
    if (rc == 0 && arm) rc = cuda_arm_queue(f, err);
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
    f->n_captures++;
    g->cap = cap, g->scratch = f->ctx.scratch, g->hook_gen = f->hk.gen, g->hook_cap = hk, g->lora_gen = f->lora.gen;
    g->arm = arm, g->arm_k = f->arm.k, g->arm_gen = f->arm.gen, g->sample_buf = f->ctx.sample_buf;
    return 0;
}

// Replays the captured decode step of B rows; captures it first when there is none for
// this capture layer, these hooks and captures, or the scratch moved. arm: the ARM_*
// kind of a one-row step whose draws run inside the graph (its own slot, so steps with
// and without draws both replay).
static int graph_decode(cuda_forward *f, int B, int cap, int hk, int arm, verr *err) {
    graph_slot *g = arm ? &f->armed_graph : &f->graphs[B];
    if (graph_stale(f, g, cap, hk, arm) && graph_capture(f, g, B, cap, hk, arm, err)) return -1;
    CK(cudaGraphLaunch(g->exec, f->ctx.stream));
    if (arm) f->arm.ready = -1;  // the draws come back with the step's wait
    if (B == 1) f->step = (cuda_step_counts){ g->launches, g->nodes, 0, 0 };
    return 0;
}

// The host may refill the step block only once the previous step's copy of it ran.
static int wait_params(cuda_forward *f, verr *err) {
    if (f->par_pending) {
        f->ctx.n_syncs++;
        if (cuda_tp_wait(f, err)) return -1;
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
static int run_chunk(cuda_forward *f, kv_view *kv, const int *ids, int T, int cap, int hk, int last, verr *err) {
    if (wait_params(f, err)) return -1;
    int pos0 = kv_view_len(kv);
    if (T == 1) fill_decode(f, kv, ids, 1);
    else fill_prefill(f, kv, ids, T);
    f->par_pending = 1;
    long l0 = f->ctx.n_launches;
    int arm = T == 1 && last && f->use_graph ? cuda_arm_kind(f, cap) : 0;  // else after the step (cuda_arm_enqueue)
    int rc = T > 1 ? enqueue_prefill(f, T, cap, hk, err) : f->use_graph ? graph_decode(f, 1, cap, hk, arm, err)
                                                                         : enqueue_decode(f, 1, cap, hk, err);
    if (rc == 0 && T == 1 && !f->use_graph) f->step = (cuda_step_counts){ f->ctx.n_launches - l0, 0, 0, 0 };
    if (rc == 0 && T == 1 && cap >= 0 && f->tp.comm) rc = enqueue_tp_stats(f, 1, err);
    if (rc || cuda_hooks_deliver(f, hk, T, pos0, f->last_keys, err)) return -1;
    advance(kv, T);
    return 0;
}

// Device caches of this forward's device, shaped for this model.
static int check_view(const cuda_forward *f, const kv_view *kv, verr *err) {
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
    return 0;
}

// A tensor-parallel forward whose group failed stays failed.
static int check_tp(const cuda_forward *f, const forward_state *fw, verr *err) {
    (void)fw;
    if (f->tp.broken) return verr_set(err, "%s", f->tp.why);
    if (f->tp.lead && f->tp.lead->broken) return verr_set(err, "%s", f->tp.lead->why);  // another context's failure
    return 0;
}

static int capture_layer(const cuda_forward *f, const forward_state *fw) {
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
static int fetch(cuda_forward *f, float *logits, int B, int cap, int scores_keys, verr *err) {
    if (!logits && cap < 0 && scores_keys <= 0 && !f->tp.comm && f->arm.ready != -1) return 0;
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
    if (e == cudaSuccess && f->tp.comm) {
        if (cuda_tp_wait(f, err)) return -1;
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
static void row_stats(const cuda_forward *f, int b, float out[8]) {
    memcpy(out, f->h_stats + 4 * b, 4 * sizeof(float));
    memcpy(out + 4, f->h_stats + 4 * (size_t)f->rows + 4 * b, 4 * sizeof(float));
}

static void set_fw_stats(cuda_forward *f, forward_state *fw, int b) {
    float st[8];
    row_stats(f, b, st);
    memcpy(fw->logit_stats, st, sizeof fw->logit_stats);
    memcpy(fw->attn_stats, st + 4, sizeof fw->attn_stats);
    fw->attn_keys = f->last_keys;
    fw->dev_stats = 1;
}

// The CPU forward's check on copied logits (the device keeps no per-layer trace: the
// message says so). Lazy steps are checked at the draw (cuda_forward_sample).
int cuda_nonfinite_err(const cuda_forward *f, int pos, int id, float v, verr *err) {
    return verr_set(err, "non-finite logits at position %d (logit %d is %g) on CUDA device %d (weights of NaN, inf "
                    "or near FLT_MAX? --device cpu names the first non-finite layer)", pos, id, v, f->ctx.device);
}

static int check_finite(const cuda_forward *f, const float *row, int pos, verr *err) {
    for (int i = 0; i < f->m->cfg.vocab_size; i++)
        if (!isfinite(row[i])) return cuda_nonfinite_err(f, pos, i, row[i], err);
    return 0;
}

int cuda_forward_run(cuda_forward *f, forward_state *fw, kv_view *kv, const int *ids, int T, verr *err) {
    const model_config *c = &f->m->cfg;
    if (T <= 0) return verr_set(err, "forward: no tokens to process");
    for (int t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= c->vocab_size)
            return verr_set(err, "token id %d at index %d is out of range (vocab_size %d)", ids[t], t, c->vocab_size);
    if (T > kv_view_room(kv) || kv_view_len(kv) + T > f->max_ctx)
        return verr_set(err, "%d tokens do not fit: %d of the %d-token context are used (raise --ctx)", T,
                        kv_view_len(kv), f->max_ctx);
    if (check_view(f, kv, err) || check_tp(f, fw, err)) return -1;
    if (cuda_activate(&f->ctx)) return verr_set(err, "%s", f->ctx.err.msg);
    if (cuda_hooks_sync(f, fw->hooks, err)) return -1;
    int cap = capture_layer(f, fw), hk = cuda_hooks_captures(f);
    fw->dev_stats = 0;
    kv_cache *dst = kv->tail ? kv->tail : kv->trunk;
    int len0 = dst->len, n_trunk0 = kv->n_trunk, rc = 0;
    for (int done = 0; rc == 0 && done < T; done += f->max_T) {
        int n = T - done < f->max_T ? T - done : f->max_T;
        int last = done + n == T;  // the attention hooks read the forward's last query
        rc = run_chunk(f, kv, ids + done, n, last ? cap : -1, last ? hk : hk & ~HK_ATTN, last, err);
    }
    f->logits_stale = 0, f->logits_valid = 0;
    if (rc == 0) rc = cuda_arm_enqueue(f, cap, err);  // an armed step not drawn in its graph draws here
    f->arm.armed = 0;
    if (rc == 0)
        rc = fetch(f, fw->lazy_logits ? NULL : fw->logits, 1, cap, cap >= 0 && fw->copy_scores ? f->last_keys : 0,
                   err);
    f->arm.ready = rc == 0 && f->arm.ready == -1;
    if (rc) {  // the cache keeps its length: the rows written past it are never read
        dst->len = len0, kv->n_trunk = n_trunk0;
        return -1;
    }
    f->sample_row = 0, f->logits_stale = fw->lazy_logits, f->logits_valid = 1;
    if (cap >= 0) set_fw_stats(f, fw, 0);
    if (!fw->lazy_logits) return check_finite(f, fw->logits, kv_view_len(kv) - 1, err);
    return 0;
}

int cuda_forward_logits(cuda_forward *f, forward_state *fw, verr *err) {
    if (!f->logits_stale) return 0;
    if (!f->logits_valid) return verr_set(err, "no logits: the last forward pass failed");
    OP(cuda_activate(&f->ctx));
    size_t V = (size_t)f->m->cfg.vocab_size;
    OP(cuda_download(&f->ctx, fw->logits, f->logits + (size_t)f->sample_row * V, V * sizeof(float)));
    f->logits_stale = 0;
    return 0;
}

// ---- several sequences -----------------------------------------------------------------------

// Every row's id, room and cache, and no two rows writing to one cache (forward_batch's rules).
static int check_batch(const cuda_forward *f, const kv_view *views, const int *ids, int B, verr *err) {
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
        const kv_cache *d = v->tail ? v->tail : v->trunk;
        for (int a = 0; a < b; a++)
            if ((views[a].tail ? views[a].tail : views[a].trunk) == d)
                return verr_set(err, "cuda_forward_batch: rows %d and %d write to the same KV cache (give each its "
                                     "own tail)", a, b);
    }
    return 0;
}

// Rows [0, B) of one pass (B <= f->rows): queue, fetch, advance the views.
static int run_rows(cuda_forward *f, kv_view *views, const int *ids, int B, int cap, float *logits, float *stats,
                    verr *err) {
    if (wait_params(f, err)) return -1;
    fill_decode(f, views, ids, B);
    f->par_pending = 1;
    int rc = f->use_graph ? graph_decode(f, B, cap, 0, 0, err) : enqueue_decode(f, B, cap, 0, err);
    if (rc == 0 && cap >= 0 && f->tp.comm) rc = enqueue_tp_stats(f, B, err);
    if (rc || fetch(f, logits, B, cap, 0, err)) return -1;
    for (int b = 0; b < B; b++) {
        advance(&views[b], 1);
        if (stats && cap >= 0) row_stats(f, b, stats + 8 * (size_t)b);
    }
    return 0;
}

int cuda_forward_batch(cuda_forward *f, forward_state *fw, kv_view *views, const int *ids, int B, float *logits,
                       float *stats, verr *err) {
    if (check_batch(f, views, ids, B, err) || check_tp(f, fw, err)) return -1;
    if (cuda_activate(&f->ctx)) return verr_set(err, "%s", f->ctx.err.msg);
    if (cuda_hooks_sync(f, fw->hooks, err)) return -1;  // interventions only: batches capture nothing
    int cap = capture_layer(f, fw), *saved = malloc(2 * sizeof(int) * (size_t)B);
    if (!saved) return verr_set(err, "out of memory");
    for (int b = 0; b < B; b++) {
        saved[2 * b] = (views[b].tail ? views[b].tail : views[b].trunk)->len;
        saved[2 * b + 1] = views[b].n_trunk;
    }
    fw->dev_stats = 0, f->logits_stale = 0, f->logits_valid = 0;
    f->arm.armed = f->arm.ready = 0;  // a batch is never armed
    size_t V = (size_t)f->m->cfg.vocab_size;
    int done = 0, n = 0, rc = 0;
    for (; rc == 0 && done < B; done += n) {
        n = B - done < f->rows ? B - done : f->rows;
        rc = run_rows(f, views + done, ids + done, n, cap, logits + done * V, stats ? stats + 8 * (size_t)done : NULL,
                      err);
    }
    if (rc) {  // every row keeps its length, as on the CPU: rows written past it are never read
        for (int b = 0; b < B; b++) {
            (views[b].tail ? views[b].tail : views[b].trunk)->len = saved[2 * b];
            views[b].n_trunk = saved[2 * b + 1];
        }
    } else {  // as forward_batch: fw->logits (and a requested capture) are the last row's
        memmove(fw->logits, logits + (size_t)(B - 1) * V, V * sizeof(float));
        f->sample_row = n - 1, f->logits_valid = 1;
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
