// persist.c: the persistent decode kernel's side of the device forward (internal.h,
// kernels/cuda/persist.cu, docs/cuda.md "The persistent decode kernel"). A one-row
// decode step runs as one cooperative launch when --decode-kernel persistent is chosen
// and the step has nothing the kernel does not build in; otherwise it falls back to the
// graph path, and the fallback is counted with its reason (varent run --stats and bench
// print them). Built in: the plain layer sequence of Llama, Qwen2 (qkv bias) and Qwen3
// (q/k norms), the capture layer's attention scores (its statistics run after it, two
// launches), and an armed greedy draw (the kernel's argmax). Not yet: the forward hooks,
// LoRA adapters, tensor parallelism, batches of several rows (those steps take the
// graph path).
#include "model/forward_cuda.h"

#ifndef VARENT_CUDA
typedef int cuda_persist_unused;  // nothing to build without CUDA
#else

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/cuda/internal.h"

void cuda_persist_free(cuda_forward *d) {
    dev_persist *p = &d->persist;
    cuda_free(p->d_layers);
    cuda_free(p->ctr);
    cuda_free(p->argmax);
    p->d_layers = NULL, p->ctr = NULL, p->argmax = NULL;
    cuda_persist_trace_free(p);
}

// Why the step cannot run persistent (NULL: it can). hk: its hooks' captures.
static const char *blocker(const cuda_forward *d, int hk) {
    if (d->hk.active || hk) return "forward hooks";
    if (d->lora.n) return "LoRA adapters";
    if (d->tp.comm) return "tensor parallelism";
    return NULL;
}

static int fall_back(cuda_forward *d, const char *why) {
    cuda_persist_skip(d, why);
    return 0;
}

void cuda_persist_skip(cuda_forward *d, const char *why) {
    dev_persist *p = &d->persist;
    if (!cuda_tune_wants(d)) return;
    p->fallbacks++;
    size_t n = strlen(why) < sizeof p->why - 1 ? strlen(why) : sizeof p->why - 1;  // (a long message is cut)
    memcpy(p->why, why, n);
    p->why[n] = 0;
}

// The plan of the step now in the step block, without its device buffers.
static cuda_persist_plan plan_of(const cuda_forward *d, int cap) {
    const cuda_core *f = &d->core;
    const model *m = f->m;
    const model_config *c = &m->cfg;
    const dev_weights *w = f->w;
    step_params dp = cuda_core_params(f, f->d_par);
    cuda_persist_plan p;
    memset(&p, 0, sizeof p);
    p.n_layers = c->n_layers, p.dim = c->dim, p.n_heads = c->n_heads, p.n_kv = c->n_kv_heads;
    p.head_dim = c->head_dim, p.hidden = c->hidden_dim, p.vocab = c->vocab_size;
    p.eps = c->norm_eps, p.scale = 1.0f / sqrtf((float)c->head_dim);
    p.wt = (int)w->layers[0].wqkv.type;
    p.embed = w->embed.data, p.lm_head = w->lm_head.data;
    p.final_norm = (const float *)w->final_norm.data, p.rope_tab = f->rope_tab;
    p.layers = d->persist.d_layers;
    p.ids = dp.ids, p.pos = dp.pos, p.rows = dp.rows, p.kv = dp.layers, p.kv_stride = f->rows, p.lens = dp.lens;
    p.x = f->x, p.qkv = f->qkv, p.att = f->att, p.hb = f->hb, p.logits = f->logits;
    p.scores = cap >= 0 ? f->scores : NULL, p.cap = cap;
    p.max_ctx = f->max_ctx;
    p.argmax = d->persist.argmax, p.ctr = d->persist.ctr;
    p.grid = d->persist.grid;
    p.ring = d->persist.ring;
    p.min_blocks = d->persist.min_blocks;
    p.sleep_ns = d->persist.sleep_ns;
    p.stage = d->persist.stage;
    p.ahead = d->persist.ahead;
    return p;
}

// Every matrix of the same 16-bit type (the kernel is instantiated per type).
static int same_type(const dev_weights *w, int n_layers, wtype t) {
    if (w->embed.type != t || w->lm_head.type != t) return 0;
    for (int l = 0; l < n_layers; l++) {
        const dev_layer *L = &w->layers[l];
        if (L->wqkv.type != t || L->wo.type != t || L->w_gu.type != t || L->w_down.type != t) return 0;
    }
    return 1;
}

// The layer records and counters on the device, made at the first persistent step.
static int setup(cuda_forward *d, verr *err) {
    dev_persist *p = &d->persist;
    if (p->d_layers) return 0;
    cuda_core *f = &d->core;
    int n = f->m->cfg.n_layers;
    cuda_persist_layer *h = calloc((size_t)n, sizeof *h);
    if (!h) return verr_set(err, "out of memory");
    for (int l = 0; l < n; l++) {
        const dev_layer *L = &f->w->layers[l];
        h[l] = (cuda_persist_layer){ L->wqkv.data, L->wo.data, L->w_gu.data, L->w_down.data,
                                     (const float *)L->attn_norm.data, (const float *)L->ffn_norm.data,
                                     (const float *)L->bqkv.data, (const float *)L->q_norm.data,
                                     (const float *)L->k_norm.data };
    }
    cuda_persist_plan shape = plan_of(d, -1);
    size_t nc = cuda_persist_counters(&shape);
    int rc = cuda_malloc((void **)&p->d_layers, sizeof *h * (size_t)n, "persistent kernel layers", err) ||
             cuda_malloc((void **)&p->ctr, sizeof *p->ctr * nc, "persistent kernel counters", err) ||
             cuda_malloc((void **)&p->argmax, sizeof *p->argmax, "persistent kernel argmax", err);
    // queued before the step's kernel, without a wait (a pageable copy is read at the call)
    cudaError_t e = cudaSuccess;
    if (rc == 0)
        e = cudaMemcpyAsync(p->d_layers, h, sizeof *h * (size_t)n, cudaMemcpyHostToDevice, f->ctx.stream);
    if (rc == 0 && e == cudaSuccess) e = cudaMemsetAsync(p->ctr, 0, sizeof *p->ctr * nc, f->ctx.stream);
    if (rc == 0 && e == cudaSuccess) e = cudaMemsetAsync(p->argmax, 0, sizeof *p->argmax, f->ctx.stream);
    if (rc == 0 && e != cudaSuccess)
        rc = verr_set(err, "setting up the persistent kernel: %s (%s:%d)", cudaGetErrorString(e), __FILE__, __LINE__);
    free(h);
    if (rc) cuda_persist_free(d);
    return rc ? -1 : 0;
}

// Whether the step can run persistent (1), or falls back with its reason (0); -1 on error.
// *plan: the step's plan when it can.
static int ready(cuda_forward *d, int cap, int hk, cuda_persist_plan *plan, verr *err) {
    dev_persist *p = &d->persist;
    cuda_core *f = &d->core;
    if (!cuda_tune_wants(d)) return 0;
    const char *why = blocker(d, hk);
    if (why) return fall_back(d, why);
    if (!same_type(f->w, f->m->cfg.n_layers, f->w->layers[0].wqkv.type))
        return fall_back(d, "matrices of more than one type");
    if (setup(d, err)) return -1;
    *plan = plan_of(d, cap);
    // the check (an occupancy query, and a shared-memory attribute with the ring) once
    // for each setting: it depends on nothing a step changes but the scratch and the
    // attention's combine counters
    if (p->fit_ok && p->fit_scratch == f->ctx.scratch && p->fit_scratch_bytes == f->ctx.scratch_bytes &&
        p->fit_count == f->ctx.att_count && p->fit_count_n == f->ctx.att_count_n)
        return 1;
    p->fit_ok = 0;
    p->checks++;
    if (cuda_persist_check(&f->ctx, plan, &p->fit)) return fall_back(d, f->ctx.err.msg);
    p->fit_ok = 1;
    p->fit_scratch = f->ctx.scratch;
    p->fit_scratch_bytes = f->ctx.scratch_bytes;
    p->fit_count = f->ctx.att_count;
    p->fit_count_n = f->ctx.att_count_n;
    return 1;
}

// The kernel, then the capture layer's statistics (and the phase trace when asked for).
static int launch(cuda_forward *d, cuda_persist_plan *plan, int cap, verr *err) {
    cuda_core *f = &d->core;
    if (cuda_persist_trace_arm(d, plan, err)) return -1;
    OP(cuda_decode_persistent(&f->ctx, plan, &d->persist.fit));
    if (cap >= 0 && cuda_core_stats(f, 1, cuda_core_params(f, f->d_par), err)) return -1;
    d->persist.steps++;
    return cuda_persist_trace_write(d, plan, err);
}

int cuda_persist_step(cuda_forward *d, int cap, int hk, int *drawn, verr *err) {
    cuda_core *f = &d->core;
    *drawn = 0;
    cuda_persist_plan plan;
    int r = ready(d, cap, hk, &plan, err);
    if (r <= 0) return r;
    int greedy = cuda_arm_greedy(&d->arm, d->tp.comm != NULL);
    plan.draw = greedy ? d->arm.d_out : NULL;
    CK(cudaMemcpyAsync(f->d_par, f->h_par, f->par_bytes, cudaMemcpyHostToDevice, f->ctx.stream));
    if (launch(d, &plan, cap, err)) return -1;
    if (greedy && cuda_arm_drawn(f, &d->arm, err)) return -1;
    *drawn = greedy;
    return 1;
}

int cuda_persist_loop_step(cuda_forward *d, int cap, sample_out *draw, verr *err) {
    cuda_persist_plan plan;
    int r = ready(d, cap, 0, &plan, err);
    if (r <= 0) return r;
    plan.draw = draw;
    return launch(d, &plan, cap, err) ? -1 : 1;
}

#endif
