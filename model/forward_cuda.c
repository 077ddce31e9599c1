// forward_cuda.c: see forward_cuda.h. The layer sequence mirrors model/forward.c:
//   x = embed(ids); xb = norm(x)
//   per layer: q|k|v = xb @ Wqkv (+ bias), q/k norm (Qwen3), rope, store k,v (bf16),
//              att = attention(q, cache); x += att @ Wo; xb = norm(x)
//              x += down(silu(gate) * up); xb = norm(x) with the next layer's (or the final) weight
//   logits = lm_head(xb of the last token)
// wq/wk/wv and gate/up are concatenated at upload, so a decode step runs one matvec for
// each pair; prefill runs cuBLAS on the row blocks of the same matrices.
// Per-step values (ids, positions, cache rows, KV segment pointers and lengths) live in
// one device block filled from a pinned host twin by the step's first copy: a captured
// T == 1 graph replays with new values and no re-capture.
// With a capture layer, the step ends with the entropix statistics on the device
// (cuda_vocab_stats on the logits, cuda_attn_stats on the captured scores): 8 floats
// come back with the logits; the scores themselves only with fw->copy_scores.
#include "model/forward_cuda.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host/progress.h"

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
int cuda_forward_run(cuda_forward *f, forward_state *fw, kv_view *kv, const int *ids, int T, verr *err) {
    (void)f, (void)fw, (void)kv, (void)ids, (void)T;
    return verr_set(err, NO_CUDA);
}
int cuda_forward_sample(cuda_forward *f, const sample_cfg *cfg, int n, sample_out *out, verr *err) {
    (void)f, (void)cfg, (void)n, (void)out;
    return verr_set(err, NO_CUDA);
}

#else

#include <cuda_runtime_api.h>
#include "kernels/ops_cuda.h"

// A failed CUDA runtime call: name it, with file and line.
#define CK(call)                                                                                 \
    do {                                                                                         \
        cudaError_t e_ = (call);                                                                 \
        if (e_ != cudaSuccess)                                                                   \
            return verr_set(err, "%s failed: %s (%s:%d)", #call, cudaGetErrorString(e_), __FILE__, \
                            __LINE__);                                                           \
    } while (0)
// A failed op: its message (call, file, line) is in f->ctx.err.
#define OP(call)                                                                                 \
    do {                                                                                         \
        if ((call) != 0) return verr_set(err, "%s", f->ctx.err.msg);                             \
    } while (0)

// Device copies of one layer's weights (wref.data are device pointers).
typedef struct {
    wref attn_norm, ffn_norm;  // f32 [dim]
    wref wqkv;                 // [q_dim + 2*kv_dim, dim]: wq rows, then wk, then wv
    wref bqkv;                 // f32 [q_dim + 2*kv_dim]; data NULL without biases
    wref q_norm, k_norm;       // f32 [head_dim]; data NULL unless Qwen3
    wref wo;                   // [dim, q_dim]
    wref w_gu;                 // [2*hidden, dim]: gate rows, then up
    wref w_down;               // [dim, hidden]
} dev_layer;

typedef struct {
    void *arena;               // one cudaMalloc holding every tensor below
    size_t bytes;
    wref embed, final_norm, lm_head;  // lm_head == embed when tied
    const float *inv_freq;     // [head_dim/2]
    dev_layer *layers;         // host array [n_layers] of device refs
} dev_weights;

// The per-step block, same layout on the device and in its pinned host twin.
typedef struct {
    cuda_kv_lens *lens;
    cuda_kv_layer *layers;     // [n_layers]
    int *ids, *pos, *rows;     // [max_T] each
} step_params;

struct cuda_forward {
    cuda_ctx ctx;              // device, stream, cuBLAS handle, scratch
    const model *m;
    dev_weights own;           // uploaded here (arena NULL when borrowed)
    const dev_weights *w;      // &own, or the sharing forward's
    forward_state *fw;         // its logits / attn_scores point at the pinned buffers below
    float *fw_logits, *fw_scores;    // fw's own buffers, put back on close
    float *pin_logits, *pin_scores;  // page-locked [vocab], [n_heads, max_ctx]
    int max_T, max_ctx;
    void *act;                 // activation arena
    float *x, *xb, *y;         // [max_T, dim]
    float *qkv;                // [max_T, q_dim + 2*kv_dim]
    float *att;                // [max_T, q_dim]
    float *hb;                 // [max_T, 2*hidden]
    float *logits;             // [vocab]
    float *scores;             // [n_heads, max_ctx] attention capture
    float *stats;              // [8]: vocab stats of logits {max, lse, H, V}, then attention stats
    float *h_stats;            // pinned [8], their host copy
    void *d_par, *h_par;       // step block: device, pinned host
    size_t par_bytes;
    int par_pending;           // a copy from h_par may still be queued
    int last_keys;             // n_keys of the last chunk
    cudaGraphExec_t graph;     // the T == 1 step
    int graph_cap;             // its capture layer (-1: none)
    void *graph_scratch;       // ctx.scratch it was captured with
    int use_graph;
    sample_cfg *d_cfg;         // [smp_cap] cuda_forward_sample's configurations
    sample_out *d_out;         // [smp_cap] and results
    int smp_cap;
};

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

static step_params par_at(void *base, int n_layers, int max_T) {
    char *p = base;
    step_params s;
    s.lens = (cuda_kv_lens *)p;
    s.layers = (cuda_kv_layer *)(p + 16);
    s.ids = (int *)(p + 16 + (size_t)n_layers * sizeof(cuda_kv_layer));
    s.pos = s.ids + max_T;
    s.rows = s.pos + max_T;
    return s;
}

static size_t par_size(int n_layers, int max_T) {
    return 16 + (size_t)n_layers * sizeof(cuda_kv_layer) + 3 * (size_t)max_T * sizeof(int);
}

// ---- weight upload -----------------------------------------------------------------------
// Two passes over the same layout code: the first (base == NULL) only sums the sizes,
// the second uploads into one arena of that size.
typedef struct {
    cuda_ctx *ctx;
    char *base;                // NULL: sizing pass
    size_t off;
    void *stage;               // pinned staging for converted tensors
    size_t stage_bytes;
    progress *pg;              // upload pass: MiB done (a bar on a terminal)
    size_t done;
    verr *err;
} uploader;

static void up_progress(uploader *u, size_t bytes) {
    u->done += bytes;
    if (u->pg) progress_update(u->pg, (long)(u->done >> 20), NULL);
}

static float widen(const void *p, wtype t, size_t i) {
    if (t == WT_F32) return ((const float *)p)[i];
    if (t == WT_BF16) return bf16_to_f32(((const uint16_t *)p)[i]);
    return f16_to_f32(((const uint16_t *)p)[i]);
}

static void convert(void *dst, wtype dt, const void *src, wtype st, size_t i0, size_t n) {
#pragma omp parallel for if (n > 65536)
    for (size_t j = 0; j < n; j++) {
        float f = widen(src, st, i0 + j);
        if (dt == WT_F32) ((float *)dst)[j] = f;
        else if (dt == WT_BF16) ((uint16_t *)dst)[j] = f32_to_bf16(f);
        else ((uint16_t *)dst)[j] = f32_to_f16(f);
    }
}

// n elements of src (stored type st) into device dst as dt.
static int up_copy(uploader *u, char *dst, wtype dt, const void *src, wtype st, size_t n) {
    size_t esz = wtype_size(dt);
    if (dt == st) {
        if (cuda_upload(u->ctx, dst, src, n * esz)) return verr_set(u->err, "uploading weights: %s", u->ctx->err.msg);
        up_progress(u, n * esz);
        return 0;
    }
    size_t chunk = u->stage_bytes / esz;
    for (size_t i = 0; i < n; i += chunk) {
        size_t k = n - i < chunk ? n - i : chunk;
        convert(u->stage, dt, src, st, i, k);
        if (cuda_upload(u->ctx, dst + i * esz, u->stage, k * esz))
            return verr_set(u->err, "uploading weights: %s", u->ctx->err.msg);
        up_progress(u, k * esz);
    }
    return 0;
}

// out = concat(parts) as type dt, parts[i] holding n[i] elements.
static int up_concat(uploader *u, wref *out, wtype dt, const wref *parts, const size_t *n, int k) {
    size_t total = 0;
    for (int i = 0; i < k; i++) total += n[i];
    size_t off = align256(u->off);
    u->off = off + total * wtype_size(dt);
    out->type = dt;
    out->data = NULL;
    if (!u->base) return 0;
    out->data = u->base + off;
    char *dst = u->base + off;
    for (int i = 0; i < k; i++) {
        if (up_copy(u, dst, dt, parts[i].data, parts[i].type, n[i])) return -1;
        dst += n[i] * wtype_size(dt);
    }
    return 0;
}

// Matrices: f16 stays f16 when every part is f16, everything else becomes bf16.
static wtype mat_type(const wref *parts, int k) {
    for (int i = 0; i < k; i++)
        if (parts[i].type != WT_F16) return WT_BF16;
    return WT_F16;
}

static int up_mat(uploader *u, wref *out, const wref *parts, const size_t *n, int k) {
    return up_concat(u, out, mat_type(parts, k), parts, n, k);
}

static int up_vec(uploader *u, wref *out, const wref *parts, const size_t *n, int k) {
    return up_concat(u, out, WT_F32, parts, n, k);
}

static int up_layer(uploader *u, const model *m, int l, dev_layer *L) {
    const model_config *c = &m->cfg;
    const layer_weights *w = &m->layers[l];
    size_t D = (size_t)c->dim, Q = (size_t)c->n_heads * c->head_dim, KV = (size_t)c->n_kv_heads * c->head_dim;
    size_t H = (size_t)c->hidden_dim, hd = (size_t)c->head_dim;
    wref qkv[3] = { w->wq, w->wk, w->wv }, gu[2] = { w->w_gate, w->w_up };
    size_t n_qkv[3] = { Q * D, KV * D, KV * D }, n_gu[2] = { H * D, H * D }, n_b[3] = { Q, KV, KV };
    size_t nD = D, nQD = D * Q, nDH = D * H;
    if (up_vec(u, &L->attn_norm, &w->attn_norm, &nD, 1) || up_vec(u, &L->ffn_norm, &w->ffn_norm, &nD, 1) ||
        up_mat(u, &L->wqkv, qkv, n_qkv, 3) || up_mat(u, &L->wo, &w->wo, &nQD, 1) ||
        up_mat(u, &L->w_gu, gu, n_gu, 2) || up_mat(u, &L->w_down, &w->w_down, &nDH, 1))
        return -1;
    memset(&L->bqkv, 0, sizeof L->bqkv);
    memset(&L->q_norm, 0, sizeof L->q_norm);
    memset(&L->k_norm, 0, sizeof L->k_norm);
    if (c->attn_bias) {
        wref b[3] = { w->bq, w->bk, w->bv };
        if (up_vec(u, &L->bqkv, b, n_b, 3)) return -1;
    }
    if (c->qk_norm && (up_vec(u, &L->q_norm, &w->q_norm, &hd, 1) || up_vec(u, &L->k_norm, &w->k_norm, &hd, 1)))
        return -1;
    return 0;
}

static int up_model(uploader *u, const model *m, dev_weights *w) {
    const model_config *c = &m->cfg;
    size_t VD = (size_t)c->vocab_size * c->dim, D = (size_t)c->dim, half = (size_t)c->head_dim / 2;
    if (up_mat(u, &w->embed, &m->embed, &VD, 1) || up_vec(u, &w->final_norm, &m->final_norm, &D, 1)) return -1;
    if (m->lm_head.data == m->embed.data) w->lm_head = w->embed;  // tied
    else if (up_mat(u, &w->lm_head, &m->lm_head, &VD, 1)) return -1;
    wref inv = { m->inv_freq, WT_F32 };
    wref dinv;
    if (up_vec(u, &dinv, &inv, &half, 1)) return -1;
    w->inv_freq = dinv.data;
    for (int l = 0; l < c->n_layers; l++)
        if (up_layer(u, m, l, &w->layers[l])) return -1;
    return 0;
}

static int upload_weights(cuda_forward *f, verr *err) {
    const model *m = f->m;
    dev_weights *w = &f->own;
    w->layers = calloc((size_t)m->cfg.n_layers, sizeof *w->layers);
    if (!w->layers) return verr_set(err, "out of memory");
    uploader u = { &f->ctx, NULL, 0, NULL, 0, NULL, 0, err };
    if (up_model(&u, m, w)) return -1;
    w->bytes = u.off;
    void *arena = NULL;
    if (cuda_malloc(&arena, w->bytes, "model weights", err)) {
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        return verr_set(err, "the weights of %s (%.1f MiB in the GPU's formats) do not fit on CUDA device %d: %s",
                        m->dir, w->bytes / 1048576.0, f->ctx.device, msg);
    }
    w->arena = arena;
    // A bar on a terminal for big models; tests and logs stay quiet.
    progress pg;
    int quiet = !isatty(STDERR_FILENO) || w->bytes < ((size_t)256 << 20);
    progress_start(&pg, "upload MiB", (long)(w->bytes >> 20), quiet);
    u = (uploader){ &f->ctx, arena, 0, NULL, (size_t)16 << 20, &pg, 0, err };
    CK(cudaHostAlloc(&u.stage, u.stage_bytes, cudaHostAllocDefault));
    int rc = up_model(&u, m, w);
    cudaFreeHost(u.stage);
    if (rc == 0) progress_finish(&pg, NULL);
    if (rc == 0 && u.off != w->bytes)
        return verr_set(err, "weight upload layout mismatch: %zu vs %zu bytes (%s:%d)", u.off, w->bytes, __FILE__,
                        __LINE__);
    return rc;
}

// ---- activations ---------------------------------------------------------------------------
static int alloc_activations(cuda_forward *f, verr *err) {
    const model_config *c = &f->m->cfg;
    size_t T = (size_t)f->max_T, q_dim = (size_t)c->n_heads * c->head_dim;
    size_t qkv_dim = q_dim + 2 * (size_t)c->n_kv_heads * c->head_dim;
    size_t sizes[10] = { T * c->dim, T * c->dim, T * c->dim, T * qkv_dim, T * q_dim, T * 2 * c->hidden_dim,
                         (size_t)c->vocab_size, (size_t)c->n_heads * f->max_ctx, 8, 0 };
    f->par_bytes = par_size(c->n_layers, f->max_T);
    size_t off[10], total = 0;
    for (int i = 0; i < 10; i++) {
        off[i] = total;
        total = align256(total + (i < 9 ? sizes[i] * sizeof(float) : f->par_bytes));
    }
    if (cuda_malloc(&f->act, total, "activations", err)) {
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        return verr_set(err, "%s (the buffers grow with --batch and --ctx)", msg);
    }
    char *a = f->act;
    f->x = (float *)(a + off[0]), f->xb = (float *)(a + off[1]), f->y = (float *)(a + off[2]);
    f->qkv = (float *)(a + off[3]), f->att = (float *)(a + off[4]), f->hb = (float *)(a + off[5]);
    f->logits = (float *)(a + off[6]), f->scores = (float *)(a + off[7]), f->stats = (float *)(a + off[8]);
    f->d_par = a + off[9];
    CK(cudaHostAlloc(&f->h_par, f->par_bytes, cudaHostAllocDefault));
    memset(f->h_par, 0, f->par_bytes);
    void *hs = NULL;
    CK(cudaHostAlloc(&hs, 8 * sizeof(float), cudaHostAllocDefault));
    f->h_stats = hs;

    // Scratch: bf16 activations of a prefill GEMM, or the decode attention's partials.
    size_t max_in = (size_t)c->dim;
    if (q_dim > max_in) max_in = q_dim;
    if ((size_t)c->hidden_dim > max_in) max_in = (size_t)c->hidden_dim;
    attn_shape sh = { c->n_heads, c->n_kv_heads, c->head_dim, 1.0f / sqrtf((float)c->head_dim) };
    size_t mm = cuda_matmul_scratch_bytes(f->max_T, (int)max_in);
    size_t at = cuda_attention_scratch_bytes(&f->ctx, f->max_ctx, sh);
    if (cuda_reserve_scratch(&f->ctx, mm > at ? mm : at)) return verr_set(err, "%s", f->ctx.err.msg);
    return 0;
}

// Page-locked result buffers take the place of fw's malloc'd ones (put back on close),
// so the per-token copies are direct DMA. (cudaHostRegister on fw's own buffers could
// fail on a page shared with another allocation.) Optional: without them the copies go
// through pageable memory.
static void pin_host(cuda_forward *f) {
    const model_config *c = &f->m->cfg;
    forward_state *fw = f->fw;
    void *pl = NULL, *ps = NULL;
    if (cudaHostAlloc(&pl, (size_t)c->vocab_size * sizeof(float), cudaHostAllocDefault) != cudaSuccess ||
        cudaHostAlloc(&ps, (size_t)c->n_heads * fw->ctx * sizeof(float), cudaHostAllocDefault) != cudaSuccess) {
        if (pl) cudaFreeHost(pl);
        cudaGetLastError();
        return;
    }
    f->fw_logits = fw->logits, f->fw_scores = fw->attn_scores;
    f->pin_logits = fw->logits = pl;
    f->pin_scores = fw->attn_scores = ps;
}

int cuda_forward_open(cuda_forward **out, const model *m, forward_state *fw, int device,
                      const cuda_forward *share, verr *err) {
    *out = NULL;
    const model_config *c = &m->cfg;
    cuda_forward *f = calloc(1, sizeof *f);
    if (!f) return verr_set(err, "out of memory");
    f->m = m, f->fw = fw, f->max_T = fw->max_T, f->max_ctx = fw->ctx, f->use_graph = 1, f->graph_cap = -2;
    if (cuda_init(&f->ctx, device, err)) {
        free(f);
        return -1;
    }
    attn_shape sh = { c->n_heads, c->n_kv_heads, c->head_dim, 1.0f / sqrtf((float)c->head_dim) };
    int rc = 0;
    if (cuda_attention_validate(&f->ctx, sh)) {
        rc = verr_set(err, "%s: this model's attention shape is not supported on CUDA: %s", m->dir, f->ctx.err.msg);
    } else if (share) {
        if (share->ctx.device != device || share->m->cfg.n_layers != c->n_layers)
            rc = verr_set(err, "cuda_forward_open: shared weights are on device %d, not %d", share->ctx.device,
                          device);
        f->w = share->w;
    } else {
        rc = upload_weights(f, err);
        f->w = &f->own;
    }
    if (rc == 0) rc = alloc_activations(f, err);
    if (rc) {
        cuda_forward_close(f);
        return -1;
    }
    pin_host(f);
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
    if (f->graph) cudaGraphExecDestroy(f->graph);
    if (f->pin_logits) {
        f->fw->logits = f->fw_logits, f->fw->attn_scores = f->fw_scores;
        cudaFreeHost(f->pin_logits);
        cudaFreeHost(f->pin_scores);
    }
    if (f->h_par) cudaFreeHost(f->h_par);
    if (f->h_stats) cudaFreeHost(f->h_stats);
    cuda_free(f->d_cfg);
    cuda_free(f->d_out);
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

// ---- the step ----------------------------------------------------------------------------------
// Row block [r0, r0 + rows) of a row-major matrix with `cols` columns (or of a vector: cols 1).
static wref rows_of(wref w, size_t r0, size_t cols) {
    return (wref){ (const char *)w.data + r0 * cols * wtype_size(w.type), w.type };
}

// Fills the host step block for T tokens appended to kv. Mirrors forward.c's kv_span.
static void fill_params(cuda_forward *f, const kv_view *kv, const int *ids, int T) {
    const model_config *c = &f->m->cfg;
    step_params p = par_at(f->h_par, c->n_layers, f->max_T);
    const kv_cache *tr = kv->trunk, *tl = kv->tail, *dst = tl ? tl : tr;
    size_t kv_dim = (size_t)c->n_kv_heads * c->head_dim;
    int n_trunk = tl ? kv->n_trunk : tr->len + T, n_tail = tl ? tl->len + T : 0, pos0 = kv_view_len(kv);
    p.lens->n_trunk = n_trunk;
    p.lens->n_keys = n_trunk + n_tail;
    f->last_keys = n_trunk + n_tail;
    for (int l = 0; l < c->n_layers; l++) {
        cuda_kv_layer *L = &p.layers[l];
        L->k_trunk = (const uint16_t *)tr->dk + (size_t)l * tr->ctx * kv_dim;
        L->v_trunk = (const uint16_t *)tr->dv + (size_t)l * tr->ctx * kv_dim;
        L->k_tail = tl ? (const uint16_t *)tl->dk + (size_t)l * tl->ctx * kv_dim : NULL;
        L->v_tail = tl ? (const uint16_t *)tl->dv + (size_t)l * tl->ctx * kv_dim : NULL;
        L->k_dst = (uint16_t *)dst->dk + (size_t)l * dst->ctx * kv_dim;
        L->v_dst = (uint16_t *)dst->dv + (size_t)l * dst->ctx * kv_dim;
    }
    for (int t = 0; t < T; t++) p.ids[t] = ids[t], p.pos[t] = pos0 + t, p.rows[t] = dst->len + t;
}

// Queues one chunk of T tokens on the stream, starting with the step block's upload.
// T == 1 reads per-step values only on the device, so it can be captured in a graph.
static int enqueue_chunk(cuda_forward *f, int T, int cap, verr *err) {
    const model_config *c = &f->m->cfg;
    const dev_weights *w = f->w;
    cuda_ctx *x = &f->ctx;
    int dim = c->dim, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads, hid = c->hidden_dim;
    int q_dim = nh * hd, kv_dim = nkv * hd, qkv_dim = q_dim + 2 * kv_dim;
    float eps = c->norm_eps;
    attn_shape sh = { nh, nkv, hd, 1.0f / sqrtf((float)hd) };
    step_params dp = par_at(f->d_par, c->n_layers, f->max_T), hp = par_at(f->h_par, c->n_layers, f->max_T);
    CK(cudaMemcpyAsync(f->d_par, f->h_par, f->par_bytes, cudaMemcpyHostToDevice, x->stream));
    OP(cuda_embed(x, f->x, w->embed, dp.ids, T, dim));
    OP(cuda_rmsnorm(x, f->xb, f->x, w->layers[0].attn_norm, T, dim, eps));
    for (int l = 0; l < c->n_layers; l++) {
        const dev_layer *L = &w->layers[l];
        // T == 1: q|k|v adjacent in one matvec output; T > 1: [T,q_dim] [T,kv_dim] [T,kv_dim].
        float *q = f->qkv, *k = q + (size_t)T * q_dim, *v = k + (size_t)T * kv_dim;
        if (T == 1) {
            OP(cuda_matvec(x, q, f->xb, L->wqkv, dim, qkv_dim));
            if (L->bqkv.data) OP(cuda_add_bias(x, q, L->bqkv, 1, qkv_dim));
        } else {
            OP(cuda_matmul(x, q, f->xb, rows_of(L->wqkv, 0, dim), T, dim, q_dim));
            OP(cuda_matmul(x, k, f->xb, rows_of(L->wqkv, q_dim, dim), T, dim, kv_dim));
            OP(cuda_matmul(x, v, f->xb, rows_of(L->wqkv, q_dim + kv_dim, dim), T, dim, kv_dim));
            if (L->bqkv.data) {
                OP(cuda_add_bias(x, q, rows_of(L->bqkv, 0, 1), T, q_dim));
                OP(cuda_add_bias(x, k, rows_of(L->bqkv, q_dim, 1), T, kv_dim));
                OP(cuda_add_bias(x, v, rows_of(L->bqkv, q_dim + kv_dim, 1), T, kv_dim));
            }
        }
        if (L->q_norm.data) {  // Qwen3: RMSNorm over each head's vector, before RoPE
            OP(cuda_rmsnorm(x, q, q, L->q_norm, T * nh, hd, eps));
            OP(cuda_rmsnorm(x, k, k, L->k_norm, T * nkv, hd, eps));
        }
        if (T == 1) {
            OP(cuda_rope(x, q, dp.pos, 1, nh + nkv, hd, w->inv_freq, 0));  // q and k heads are adjacent
        } else {
            OP(cuda_rope(x, q, dp.pos, T, nh, hd, w->inv_freq, 0));
            OP(cuda_rope(x, k, dp.pos, T, nkv, hd, w->inv_freq, 0));
        }
        OP(cuda_kv_store_dev(x, &dp.layers[l], k, v, dp.rows, T, kv_dim));
        float *sc = l == cap ? f->scores : NULL;
        if (T == 1) {
            OP(cuda_attention_decode_dev(x, f->att, q, &dp.layers[l], dp.lens, f->max_ctx, sh, sc));
        } else {
            const cuda_kv_layer *hl = &hp.layers[l];
            kv_span span = { hl->k_trunk, hl->v_trunk, hp.lens->n_trunk, hl->k_tail, hl->v_tail,
                             hp.lens->n_keys - hp.lens->n_trunk };
            OP(cuda_attention(x, f->att, q, span, T, sh, sc));
        }
        OP(cuda_matmul(x, f->y, f->att, L->wo, T, q_dim, dim));
        OP(cuda_rmsnorm_residual(x, f->xb, f->x, f->y, L->ffn_norm, T, dim, eps));
        float *gate = f->hb, *up = f->hb + (size_t)T * hid;  // T == 1: the matvec's second half
        if (T == 1) {
            OP(cuda_matvec(x, gate, f->xb, L->w_gu, dim, 2 * hid));
        } else {
            OP(cuda_matmul(x, gate, f->xb, rows_of(L->w_gu, 0, dim), T, dim, hid));
            OP(cuda_matmul(x, up, f->xb, rows_of(L->w_gu, hid, dim), T, dim, hid));
        }
        OP(cuda_swiglu(x, gate, gate, up, (size_t)T * hid));
        OP(cuda_matmul(x, f->y, gate, L->w_down, T, hid, dim));
        wref next = l + 1 < c->n_layers ? w->layers[l + 1].attn_norm : w->final_norm;
        OP(cuda_rmsnorm_residual(x, f->xb, f->x, f->y, next, T, dim, eps));
    }
    OP(cuda_matvec(x, f->logits, f->xb + (size_t)(T - 1) * dim, w->lm_head, dim, c->vocab_size));
    if (cap >= 0) {  // the metrics of this step; the key count is read from the step block
        OP(cuda_vocab_stats(x, f->stats, f->logits, 1, c->vocab_size));
        OP(cuda_attn_stats(x, f->stats + 4, f->scores, nh, f->max_ctx, dp.lens));
    }
    return 0;
}

// T == 1: replay the captured step; capture it first when there is none for this
// capture layer (or the scratch moved).
static int graph_step(cuda_forward *f, int cap, verr *err) {
    if (!f->graph || f->graph_cap != cap || f->graph_scratch != f->ctx.scratch) {
        if (f->graph) CK(cudaGraphExecDestroy(f->graph));
        f->graph = NULL;
        CK(cudaStreamBeginCapture(f->ctx.stream, cudaStreamCaptureModeThreadLocal));
        int rc = enqueue_chunk(f, 1, cap, err);
        cudaGraph_t g = NULL;
        cudaError_t e = cudaStreamEndCapture(f->ctx.stream, &g);
        if (rc == 0 && e != cudaSuccess)
            rc = verr_set(err, "cudaStreamEndCapture failed: %s (%s:%d)", cudaGetErrorString(e), __FILE__, __LINE__);
        if (rc == 0 && (e = cudaGraphInstantiate(&f->graph, g, 0)) != cudaSuccess) {
            f->graph = NULL;
            rc = verr_set(err, "cudaGraphInstantiate failed: %s (%s:%d)", cudaGetErrorString(e), __FILE__, __LINE__);
        }
        if (g) cudaGraphDestroy(g);
        if (rc) {
            cudaGetLastError();
            return -1;
        }
        f->graph_cap = cap, f->graph_scratch = f->ctx.scratch;
    }
    CK(cudaGraphLaunch(f->graph, f->ctx.stream));
    return 0;
}

// One chunk: wait until the previous step block was consumed, refill it, queue the work.
static int run_chunk(cuda_forward *f, kv_view *kv, const int *ids, int T, int cap, verr *err) {
    if (f->par_pending) {
        CK(cudaStreamSynchronize(f->ctx.stream));
        f->par_pending = 0;
    }
    fill_params(f, kv, ids, T);
    f->par_pending = 1;
    if ((T == 1 && f->use_graph) ? graph_step(f, cap, err) : enqueue_chunk(f, T, cap, err)) return -1;
    kv_cache *dst = kv->tail ? kv->tail : kv->trunk;
    dst->len += T;
    if (!kv->tail) kv->n_trunk = kv->trunk->len;
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
        if (p->cu->device != f->ctx.device || p->n_layers != c->n_layers ||
            p->kv_dim != c->n_kv_heads * c->head_dim)
            return verr_set(err, "the KV cache %s does not belong to this model on CUDA device %d",
                            i ? "tail" : "trunk", f->ctx.device);
    }
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
    if (check_view(f, kv, err)) return -1;
    if (cuda_activate(&f->ctx)) return verr_set(err, "%s", f->ctx.err.msg);
    int cap = fw->attn_layer >= 0 && fw->attn_layer < c->n_layers ? fw->attn_layer : -1;
    fw->dev_stats = 0;
    kv_cache *dst = kv->tail ? kv->tail : kv->trunk;
    int len0 = dst->len, n_trunk0 = kv->n_trunk, rc = 0;
    for (int done = 0; rc == 0 && done < T; done += f->max_T) {
        int n = T - done < f->max_T ? T - done : f->max_T;
        rc = run_chunk(f, kv, ids + done, n, done + n == T ? cap : -1, err);
    }
    if (rc == 0) {
        cudaStream_t st = f->ctx.stream;
        cudaError_t e = cudaMemcpyAsync(fw->logits, f->logits, (size_t)c->vocab_size * sizeof(float),
                                        cudaMemcpyDeviceToHost, st);
        if (e == cudaSuccess && cap >= 0 && fw->copy_scores)
            e = cudaMemcpyAsync(fw->attn_scores, f->scores, (size_t)c->n_heads * f->last_keys * sizeof(float),
                                cudaMemcpyDeviceToHost, st);
        if (e == cudaSuccess && cap >= 0)
            e = cudaMemcpyAsync(f->h_stats, f->stats, 8 * sizeof(float), cudaMemcpyDeviceToHost, st);
        if (e == cudaSuccess) e = cudaStreamSynchronize(st);  // kernel faults surface here
        if (e != cudaSuccess)
            rc = verr_set(err, "CUDA forward pass failed: %s (%s:%d)", cudaGetErrorString(e), __FILE__, __LINE__);
        else f->par_pending = 0;
    }
    if (rc) {  // the cache keeps its length: the rows written past it are never read
        dst->len = len0, kv->n_trunk = n_trunk0;
        return -1;
    }
    if (cap >= 0) {
        fw->attn_keys = f->last_keys;
        memcpy(fw->logit_stats, f->h_stats, sizeof fw->logit_stats);
        memcpy(fw->attn_stats, f->h_stats + 4, sizeof fw->attn_stats);
        fw->dev_stats = 1;
    }
    return 0;
}

// ---- sampling on the device ----------------------------------------------------------------

int cuda_forward_sample(cuda_forward *f, const sample_cfg *cfg, int n, sample_out *out, verr *err) {
    if (n <= 0) return 0;
    OP(cuda_activate(&f->ctx));
    if (n > f->smp_cap) {
        cuda_free(f->d_cfg), cuda_free(f->d_out);
        f->d_cfg = NULL, f->d_out = NULL, f->smp_cap = 0;
        if (cuda_malloc((void **)&f->d_cfg, sizeof *cfg * (size_t)n, "sampling configurations", err) ||
            cuda_malloc((void **)&f->d_out, sizeof *out * (size_t)n, "sampling results", err))
            return -1;
        f->smp_cap = n;
    }
    OP(cuda_upload(&f->ctx, f->d_cfg, cfg, sizeof *cfg * (size_t)n));
    OP(cuda_sample(&f->ctx, f->d_out, f->logits, f->m->cfg.vocab_size, f->d_cfg, n));
    OP(cuda_download(&f->ctx, out, f->d_out, sizeof *out * (size_t)n));
    return 0;
}

#endif
