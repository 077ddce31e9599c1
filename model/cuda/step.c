// step.c: the layers of a device forward step (internal.h), mirroring model/forward.c:
//   x = embed(ids); xb = norm(x)
//   per layer: q|k|v = xb @ Wqkv (+ bias), q/k norm (Qwen3), rope, store k,v (bf16),
//              att = attention(q, cache); x += att @ Wo; xb = norm(x)
//              x += down(silu(gate) * up); xb = norm(x) with the next layer's (or the final) weight
//   logits = lm_head(xb of the last token)
// wq/wk/wv and gate/up are concatenated at upload, so a decode step runs one matvec for
// each pair; prefill runs cuBLAS on the row blocks of the same matrices.
// A decode step is B rows (B sequences of one token each, B == 1 for plain decode): the
// matvecs read each weight tile once per 8 rows (one launch for all), the attention takes every row's own
// KV segments from its device record. Prefill chunks (T > 1 tokens of one sequence) take
// the GEMM path. The hooks' captures and interventions, LoRA's deltas and tensor
// parallelism's collectives join the launches here (hooks.h, lora.h, tp.h).
#include "model/forward_cuda.h"

#ifndef VARENT_CUDA
typedef int cuda_step_unused;  // nothing to build without CUDA
#else

#include <math.h>

#include "model/cuda/internal.h"

// Tensor parallelism: the statistics after the step (graph), every rank's heads gathered
// into the capture first (where they go depends on each row's key count, which the host
// knows and a captured graph cannot).
int cuda_step_tp_stats(cuda_forward *d, int B, verr *err) {
    cuda_core *f = &d->core;
    if (cuda_tp_scores(f, &d->tp, B, cuda_core_params(f, f->h_par).lens, err)) return -1;
    return cuda_core_stats(f, B, cuda_core_params(f, f->d_par), err);
}

// The attention capture of layer l: the hooks' slot and/or the capture layer's buffer
// (both: the slot, copied into f->scores after the attention).
static float *scores_of(cuda_forward *d, int cap, int hk, int l) {
    const cuda_core *f = &d->core;
    float *s = cuda_hooks_scores(f, &d->hk, hk, l);
    return s ? s : l != cap ? NULL : d->tp.comm ? d->tp.part_scores : f->scores;
}

// (Under tensor parallelism the slot holds this rank's heads until the step's end, and
// the capture layer's statistics gather them from part_scores.)
static int share_scores(cuda_forward *d, int cap, int hk, int l, verr *err) {
    cuda_core *f = &d->core;
    float *s = cuda_hooks_scores(f, &d->hk, hk, l);
    int heads = d->tp.comm ? f->m->tp.max_heads : f->m->cfg.n_heads;
    if (s && l == cap)
        CK(cudaMemcpyAsync(d->tp.comm ? d->tp.part_scores : f->scores, s, sizeof(float) * heads * f->max_ctx,
                           cudaMemcpyDeviceToDevice, f->ctx.stream));
    return 0;
}

// A skipped layer on the residual stream x [T, dim]: its captures and control vector.
static int skip_layer(cuda_forward *d, int hk, int l, int T, verr *err) {
    cuda_core *f = &d->core;
    const float *cv = cuda_hooks_cvec(f, &d->hk, l);
    if (cuda_hooks_skipped(f, &d->hk, hk, l, f->x, T, err)) return -1;
    if (cv) OP(cuda_add_bias(&f->ctx, f->x, (wref){ cv, WT_F32 }, T, f->m->cfg.dim));
    return cuda_hooks_point(f, &d->hk, hk, l, HOOK_RESID_POST, f->x, T, err);
}

// Layer l of a prefill chunk of T > 1 tokens: x is the residual stream, xb its norm
// with this layer's attn_norm; leaves xb normed with the next layer's (or the final) weight.
static int prefill_layer(cuda_forward *d, int l, int T, int cap, int hk, verr *err) {
    cuda_core *f = &d->core;
    const model_config *c = &f->m->cfg;
    const dev_weights *w = f->w;
    const dev_layer *L = &w->layers[l];
    cuda_ctx *x = &f->ctx;
    int dim = c->dim, hd = c->head_dim, nh = f->m->tp.n_heads, nkv = f->m->tp.n_kv_heads, hid = f->m->tp.n_ffn;
    int q_dim = nh * hd, kv_dim = nkv * hd;
    float eps = c->norm_eps;
    attn_shape sh = { nh, nkv, hd, 1.0f / sqrtf((float)hd) };
    step_params dp = cuda_core_params(f, f->d_par), hp = cuda_core_params(f, f->h_par);
    wref next = l + 1 < c->n_layers ? w->layers[l + 1].attn_norm : w->final_norm;
    if (cuda_hooks_point(f, &d->hk, hk, l, HOOK_RESID_PRE, f->x, T, err)) return -1;
    if (cuda_hooks_skip(&d->hk, l)) {  // the identity: the next layer's norm of the same x
        if (skip_layer(d, hk, l, T, err)) return -1;
        OP(cuda_rmsnorm(x, f->xb, f->x, next, T, dim, eps));
        return 0;
    }
    float *q = f->qkv, *k = q + (size_t)T * q_dim, *v = k + (size_t)T * kv_dim;  // [T,q] [T,kv] [T,kv]
    float *qkv_out[3] = { q, k, v };
    int qkv_rows[3] = { q_dim, kv_dim, kv_dim };
    OP(cuda_matmul_parts(x, qkv_out, f->xb, L->wqkv, T, dim, qkv_rows, 3));  // xb rounded once
    for (int p = LORA_Q; p <= LORA_V; p++)
        if (cuda_lora_on(f, &d->lora, l, (lora_proj)p) && cuda_lora_apply(f, &d->lora, l, (lora_proj)p, qkv_out[p], f->xb, T, 0, err))
            return -1;
    if (L->bqkv.data) {
        OP(cuda_add_bias(x, q, cuda_rows_of(L->bqkv, 0, 1), T, q_dim));
        OP(cuda_add_bias(x, k, cuda_rows_of(L->bqkv, q_dim, 1), T, kv_dim));
        OP(cuda_add_bias(x, v, cuda_rows_of(L->bqkv, q_dim + kv_dim, 1), T, kv_dim));
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
    kv_pages pg = { hp.lens[0].table, hp.lens[0].shift };             // a paged trunk's table (device)
    OP(cuda_attention_paged(x, f->att, q, span, pg, T, sh, scores_of(d, cap, hk, l)));
    if (share_scores(d, cap, hk, l, err) || cuda_hooks_ablate(f, &d->hk, l, f->att, T, err)) return -1;
    OP(cuda_matmul(x, f->y, f->att, L->wo, T, q_dim, dim));
    if (cuda_lora_on(f, &d->lora, l, LORA_O) && cuda_lora_apply(f, &d->lora, l, LORA_O, f->y, f->att, T, 0, err)) return -1;
    if (d->tp.comm && cuda_tp_sum(f, &d->tp, f->y, (size_t)T * dim, err)) return -1;  // the ranks' partial sums
    if (cuda_hooks_point(f, &d->hk, hk, l, HOOK_ATTN_OUT, f->y, T, err)) return -1;
    OP(cuda_rmsnorm_residual(x, f->xb, f->x, f->y, L->ffn_norm, T, dim, eps));
    if (cuda_hooks_point(f, &d->hk, hk, l, HOOK_RESID_MID, f->x, T, err)) return -1;
    float *gate = f->hb, *up = f->hb + (size_t)T * hid;
    float *gu_out[2] = { gate, up };
    int gu_rows[2] = { hid, hid };
    OP(cuda_matmul_parts(x, gu_out, f->xb, L->w_gu, T, dim, gu_rows, 2));
    if ((cuda_lora_on(f, &d->lora, l, LORA_GATE) && cuda_lora_apply(f, &d->lora, l, LORA_GATE, gate, f->xb, T, 0, err)) ||
        (cuda_lora_on(f, &d->lora, l, LORA_UP) && cuda_lora_apply(f, &d->lora, l, LORA_UP, up, f->xb, T, 0, err)))
        return -1;
    OP(cuda_swiglu(x, gate, gate, up, (size_t)T * hid));
    OP(cuda_matmul(x, f->y, gate, L->w_down, T, hid, dim));
    if (cuda_lora_on(f, &d->lora, l, LORA_DOWN) && cuda_lora_apply(f, &d->lora, l, LORA_DOWN, f->y, gate, T, 0, err)) return -1;
    if (d->tp.comm && cuda_tp_sum(f, &d->tp, f->y, (size_t)T * dim, err)) return -1;
    if (cuda_hooks_point(f, &d->hk, hk, l, HOOK_MLP_OUT, f->y, T, err)) return -1;
    const float *cv = cuda_hooks_cvec(f, &d->hk, l);  // x += (mlp_out + vector), as the decode epilogue adds it
    if (cv) OP(cuda_add_bias(x, f->y, (wref){ cv, WT_F32 }, T, dim));
    OP(cuda_rmsnorm_residual(x, f->xb, f->x, f->y, next, T, dim, eps));
    return cuda_hooks_point(f, &d->hk, hk, l, HOOK_RESID_POST, f->x, T, err);
}

int cuda_step_prefill(cuda_forward *d, int T, int cap, int hk, verr *err) {
    cuda_core *f = &d->core;
    const model_config *c = &f->m->cfg;
    const dev_weights *w = f->w;
    cuda_ctx *x = &f->ctx;
    int dim = c->dim;
    step_params dp = cuda_core_params(f, f->d_par);
    CK(cudaMemcpyAsync(f->d_par, f->h_par, f->par_bytes, cudaMemcpyHostToDevice, x->stream));
    OP(cuda_embed(x, f->x, w->embed, dp.ids, T, dim));
    OP(cuda_rmsnorm(x, f->xb, f->x, w->layers[0].attn_norm, T, dim, c->norm_eps));
    for (int l = 0; l < c->n_layers; l++)
        if (prefill_layer(d, l, T, cap, hk, err)) return -1;
    if (!d->tp.comm) {
        OP(cuda_matvec(x, f->logits, f->xb + (size_t)(T - 1) * dim, w->lm_head, dim, c->vocab_size));
    } else {  // this rank's vocabulary rows, then every rank's
        OP(cuda_matvec(x, d->tp.part_logits, f->xb + (size_t)(T - 1) * dim, w->lm_head, dim, f->m->tp.n_vocab));
        if (cuda_tp_logits(f, &d->tp, 1, err)) return -1;
    }
    if (cap < 0) return 0;
    return d->tp.comm ? cuda_step_tp_stats(d, 1, err) : cuda_core_stats(f, 1, dp, err);
}

// The decode step's o_proj or down projection of rows in [B, n_in] into the residual
// stream x [B, dim], plus cv (NULL: none) when given: one matvec whose store adds
// (cv as its bias); with point p captured, the product lands in y first, then the adds.
static int decode_project(cuda_forward *d, int hk, int l, int p, const float *in, wref W, int n_in, int B,
                          const float *cv, verr *err) {
    cuda_core *f = &d->core;
    cuda_ctx *x = &f->ctx;
    int dim = f->m->cfg.dim;
    lora_proj lp = p == HOOK_ATTN_OUT ? LORA_O : LORA_DOWN;
    int lo = cuda_lora_on(f, &d->lora, l, lp);  // its delta joins the product (a partial sum under TP)
    int wanted = cuda_hooks_wants(&d->hk, hk, l, p);
    if (d->tp.comm && !wanted) {  // rank 0 adds its partial product to the residual stream,
        // the others replace theirs with their partial product: the all-reduce of x is then
        // x + sum_r W_r in_r (+ cv), with no extra launch for the add
        const cuda_mv_fuse store = { NULL, 0.f, d->tp.rank == 0, d->tp.rank == 0 ? cv : NULL, NULL };
        OP(cuda_matvec_rows_fused(x, f->x, in, W, n_in, dim, B, dim, dim, &store));
        if (lo && cuda_lora_apply(f, &d->lora, l, lp, f->x, in, B, 1, err)) return -1;
        return cuda_tp_sum(f, &d->tp, f->x, (size_t)B * dim, err);
    }
    if (!wanted) {
        const cuda_mv_fuse residual = { NULL, 0.f, 1, cv, NULL };
        OP(cuda_matvec_rows_fused(x, f->x, in, W, n_in, dim, B, dim, dim, &residual));
        return lo ? cuda_lora_apply(f, &d->lora, l, lp, f->x, in, B, 1, err) : 0;
    }
    OP(cuda_matvec_rows(x, f->y, in, W, n_in, dim, B, dim, dim));
    if (lo && cuda_lora_apply(f, &d->lora, l, lp, f->y, in, B, 1, err)) return -1;
    if (d->tp.comm && cuda_tp_sum(f, &d->tp, f->y, (size_t)B * dim, err)) return -1;  // captured: the whole product
    if (cuda_hooks_point(f, &d->hk, hk, l, p, f->y, B, err)) return -1;
    if (cv) OP(cuda_add_bias(x, f->y, (wref){ cv, WT_F32 }, B, dim));  // the fused store's v + bias
    OP(cuda_add(x, f->x, f->y, (size_t)B * dim));                       // and its out += v
    return 0;
}

// LoRA on q, k, v of a decode step: their input is the normed x, which the fused qkv
// matvec never writes, so it is normed here first (xb [B, dim]).
static int decode_lora_qkv(cuda_forward *d, int l, int B, float *q, float *k, float *v, verr *err) {
    cuda_core *f = &d->core;
    const dev_lora *L = &d->lora;
    if (!cuda_lora_on(f, L, l, LORA_Q) && !cuda_lora_on(f, L, l, LORA_K) && !cuda_lora_on(f, L, l, LORA_V)) return 0;
    const model_config *c = &f->m->cfg;
    OP(cuda_rmsnorm(&f->ctx, f->xb, f->x, f->w->layers[l].attn_norm, B, c->dim, c->norm_eps));
    float *out[3] = { q, k, v };
    for (int p = LORA_Q; p <= LORA_V; p++)
        if (cuda_lora_on(f, L, l, (lora_proj)p) && cuda_lora_apply(f, L, l, (lora_proj)p, out[p], f->xb, B, 1, err))
            return -1;
    return 0;
}

// The MLP's first half of a decode step with LoRA on gate or up: the deltas go in before
// the SwiGLU, so the one-launch kernel gives way to norm, gate|up matvec (planar
// [B, hid] twice in hb), the deltas and cuda_swiglu into hb's first half.
static int decode_lora_glu(cuda_forward *d, int l, int B, verr *err) {
    cuda_core *f = &d->core;
    const dev_lora *L = &d->lora;
    const model_config *c = &f->m->cfg;
    cuda_ctx *x = &f->ctx;
    int dim = c->dim, hid = f->m->tp.n_ffn;
    float *gate = f->hb, *up = f->hb + (size_t)B * hid;
    OP(cuda_rmsnorm(x, f->xb, f->x, f->w->layers[l].ffn_norm, B, dim, c->norm_eps));
    OP(cuda_matvec_rows(x, f->hb, f->xb, f->w->layers[l].w_gu, dim, 2 * hid, B, hid, 2 * hid));
    if ((cuda_lora_on(f, L, l, LORA_GATE) && cuda_lora_apply(f, L, l, LORA_GATE, gate, f->xb, B, 1, err)) ||
        (cuda_lora_on(f, L, l, LORA_UP) && cuda_lora_apply(f, L, l, LORA_UP, up, f->xb, B, 1, err)))
        return -1;
    OP(cuda_swiglu(x, gate, gate, up, (size_t)B * hid));
    return 0;
}

// Layer l of a decode step of B rows on the residual stream f->x. Every RMSNorm is
// folded into the matvec that reads it, and every residual add into the matvec that
// produces it.
static int decode_layer(cuda_forward *d, int l, int B, int cap, int hk, step_params dp, verr *err) {
    cuda_core *f = &d->core;
    const model_config *c = &f->m->cfg;
    const dev_weights *w = f->w;
    const dev_layer *L = &w->layers[l];
    cuda_ctx *x = &f->ctx;
    int dim = c->dim, hd = c->head_dim, nh = f->m->tp.n_heads, nkv = f->m->tp.n_kv_heads, hid = f->m->tp.n_ffn;
    int q_dim = nh * hd, kv_dim = nkv * hd, qkv_dim = q_dim + 2 * kv_dim;
    float eps = c->norm_eps;
    attn_shape sh = { nh, nkv, hd, 1.0f / sqrtf((float)hd) };
    if (cuda_hooks_point(f, &d->hk, hk, l, HOOK_RESID_PRE, f->x, B, err)) return -1;
    if (cuda_hooks_skip(&d->hk, l)) return skip_layer(d, hk, l, B, err);  // nothing else launches
    const cuda_mv_fuse attn_norm = { (const float *)L->attn_norm.data, eps, 0, (const float *)L->bqkv.data, NULL };
    const cuda_mv_fuse ffn_norm = { (const float *)L->ffn_norm.data, eps, 0, NULL, NULL };
    // One matvec over Wqkv, planar output: q [B, q_dim], k [B, kv_dim], v [B, kv_dim].
    float *q = f->qkv, *k = q + (size_t)B * q_dim, *v = k + (size_t)B * kv_dim;
    OP(cuda_matvec_rows_fused(x, q, f->x, L->wqkv, dim, qkv_dim, B, q_dim, q_dim + kv_dim, &attn_norm));
    if (decode_lora_qkv(d, l, B, q, k, v, err)) return -1;
    const cuda_kv_layer *dl = &dp.layers[(size_t)l * f->rows];
    // Qwen3's per-head q/k RMSNorm, RoPE and the KV store run inside the attention launch.
    const cuda_rope_kv rk = { k, v, dp.pos, dp.rows, f->rope_tab, (const float *)L->q_norm.data,
                              (const float *)L->k_norm.data, eps };
    OP(cuda_attention_decode_rows_rope(x, f->att, q, &rk, dl, dp.lens, B, f->max_ctx, sh,
                                       scores_of(d, cap, hk, l)));
    if (share_scores(d, cap, hk, l, err) || cuda_hooks_ablate(f, &d->hk, l, f->att, B, err) ||
        decode_project(d, hk, l, HOOK_ATTN_OUT, f->att, L->wo, q_dim, B, NULL, err) ||
        cuda_hooks_point(f, &d->hk, hk, l, HOOK_RESID_MID, f->x, B, err))
        return -1;
    float *h = f->hb;  // [B, hid] = silu(gate) * up, one launch (hb holds [B, 2*hid] if it falls back)
    if (cuda_lora_on(f, &d->lora, l, LORA_GATE) || cuda_lora_on(f, &d->lora, l, LORA_UP)) {
        if (decode_lora_glu(d, l, B, err)) return -1;
    } else {
        OP(cuda_matvec_glu_rows(x, h, f->hb, f->x, L->w_gu, dim, hid, B, &ffn_norm));
    }
    if (decode_project(d, hk, l, HOOK_MLP_OUT, h, L->w_down, hid, B, cuda_hooks_cvec(f, &d->hk, l), err)) return -1;
    return cuda_hooks_point(f, &d->hk, hk, l, HOOK_RESID_POST, f->x, B, err);
}

int cuda_step_decode(cuda_forward *d, int B, int cap, int hk, verr *err) {
    cuda_core *f = &d->core;
    const model_config *c = &f->m->cfg;
    const dev_weights *w = f->w;
    cuda_ctx *x = &f->ctx;
    step_params dp = cuda_core_params(f, f->d_par);
    if (!d->loop.on)  // a device loop's steps read the block the device advances (loop.c)
        CK(cudaMemcpyAsync(f->d_par, f->h_par, f->par_bytes, cudaMemcpyHostToDevice, x->stream));
    OP(cuda_embed(x, f->x, w->embed, dp.ids, B, c->dim));
    for (int l = 0; l < c->n_layers; l++)
        if (decode_layer(d, l, B, cap, hk, dp, err)) return -1;
    const cuda_mv_fuse final_norm = { (const float *)w->final_norm.data, c->norm_eps, 0, NULL, NULL };
    if (!d->tp.comm) {
        cuda_mv_fuse head = final_norm;
        head.amax = B == 1 ? d->greedy_amax : NULL;  // an ARM_GREEDY step's draw (forward.c)
        OP(cuda_matvec_rows_fused(x, f->logits, f->x, w->lm_head, c->dim, c->vocab_size, B, c->vocab_size,
                                  c->vocab_size, &head));
    } else {  // this rank's vocabulary rows of every row, then every rank's
        int nv = f->m->tp.n_vocab;
        OP(cuda_matvec_rows_fused(x, d->tp.part_logits, f->x, w->lm_head, c->dim, nv, B, nv, nv, &final_norm));
        if (cuda_tp_logits(f, &d->tp, B, err)) return -1;
    }
    return cap >= 0 && !d->tp.comm ? cuda_core_stats(f, B, dp, err) : 0;  // under TP after the step
}

#endif
