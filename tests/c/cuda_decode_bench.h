// cuda_decode_bench.h: the kernel benches that predict the decode graph
// (test_cuda_kernels --bench; --bench-quick runs the same code at a tiny shape, which the
// emulated GPU window does). Each op of a decode layer is called as model/forward_cuda.c
// calls it, at a real model's shapes: the qkv matvec with the folded norm, the attention
// with RoPE and the KV store fused, o_proj with the residual add, gate|up with SwiGLU,
// down with the add, and the lm_head. Every layer has weights of its own, and the
// layers together span at least 4x the L2, so weights stream from device memory as in
// a decode step, not from the L2 as a bench that repeats one matrix does. Each op is
// timed in a CUDA graph of its calls over every layer (replayed, events around the
// replays), and so is the whole step; the step against the sum of its ops says what the
// graph's gaps cost. The matvecs and the step are timed again on the deep kernels
// (ctx->mv_deep), lines ending "deep". Include after cuda_harness.h.
#ifndef VARENT_CUDA_DECODE_BENCH_H
#define VARENT_CUDA_DECODE_BENCH_H

#include <cuda_runtime_api.h>

typedef struct {
    const char *name;
    int dim, n_heads, n_kv, head_dim, hid, n_layers, vocab;
} db_shape;

typedef struct {  // one layer's weights and cache, device
    uint16_t *wqkv, *wo, *wgu, *wdown, *k, *v;
    float *attn_norm, *ffn_norm;
} db_layer;

typedef struct {
    db_shape s;
    int n_layers;   // layers allocated: the model's, more when they would fit the L2
    int keys;       // live keys of the cache
    db_layer *L;
    cuda_kv_layer *d_kv;  // [n_layers] records (device)
    cuda_kv_lens *d_lens;
    int *d_pos, *d_rows;
    float *x, *qkv, *att, *hb, *logits, *inv_freq, *rope_tab, *final_norm;
    uint16_t *lm_head;
} db_model;

static uint16_t *db_weights(size_t n) {
    uint16_t *d = dalloc(n * 2);
    OK(cuda_memset(&C, d, 0x3c, n * 2));  // 0x3c3c: a small bf16 value; the contents do not matter
    return d;
}

static size_t db_layer_bytes(const db_shape *s) {
    size_t q = (size_t)s->n_heads * s->head_dim, kv = (size_t)s->n_kv * s->head_dim;
    return 2 * ((q + 2 * kv) * s->dim + s->dim * q + 2 * (size_t)s->hid * s->dim + (size_t)s->dim * s->hid);
}

static void db_open(db_model *m, db_shape s, int keys, long l2_bytes) {
    memset(m, 0, sizeof *m);
    m->s = s;
    m->keys = keys;
    m->n_layers = s.n_layers;
    while ((double)m->n_layers * db_layer_bytes(&s) < 4.0 * l2_bytes) m->n_layers += s.n_layers;
    int q = s.n_heads * s.head_dim, kv = s.n_kv * s.head_dim, D = s.dim;
    m->L = calloc((size_t)m->n_layers, sizeof *m->L);
    cuda_kv_layer *rec = calloc((size_t)m->n_layers, sizeof *rec);
    float *ones = malloc(sizeof(float) * (size_t)D);
    for (int i = 0; i < D; i++) ones[i] = 1.0f;
    for (int l = 0; l < m->n_layers; l++) {
        db_layer *L = &m->L[l];
        L->wqkv = db_weights((size_t)(q + 2 * kv) * D);
        L->wo = db_weights((size_t)D * q);
        L->wgu = db_weights((size_t)2 * s.hid * D);
        L->wdown = db_weights((size_t)D * s.hid);
        L->k = db_weights((size_t)(keys + 1) * kv);
        L->v = db_weights((size_t)(keys + 1) * kv);
        L->attn_norm = dup_up(ones, sizeof(float) * (size_t)D);
        L->ffn_norm = dup_up(ones, sizeof(float) * (size_t)D);
        rec[l] = (cuda_kv_layer){ L->k, L->v, NULL, NULL, L->k, L->v };
    }
    m->d_kv = dup_up(rec, sizeof *rec * (size_t)m->n_layers);
    cuda_kv_lens lens = { keys, keys, NULL, 0 };
    m->d_lens = dup_up(&lens, sizeof lens);
    int pos = keys - 1;
    m->d_pos = dup_up(&pos, sizeof pos);
    m->d_rows = dup_up(&pos, sizeof pos);
    float *inv = malloc(sizeof(float) * (size_t)s.head_dim / 2);
    for (int i = 0; i < s.head_dim / 2; i++) inv[i] = powf(10000.f, -2.f * i / s.head_dim);
    m->inv_freq = dup_up(inv, sizeof(float) * (size_t)s.head_dim / 2);
    m->rope_tab = dalloc(sizeof(float) * (size_t)keys * s.head_dim);  // positions [0, keys): [keys, hd/2, 2]
    OK(cuda_rope_table(&C, m->rope_tab, m->inv_freq, s.head_dim / 2, keys));
    float *x = fvec((size_t)D, 1.f);
    m->x = dup_up(x, sizeof(float) * (size_t)D);
    m->qkv = dalloc(sizeof(float) * (size_t)(q + 2 * kv));
    m->att = dalloc(sizeof(float) * (size_t)q);
    m->hb = dalloc(sizeof(float) * (size_t)2 * s.hid);
    m->logits = dalloc(sizeof(float) * (size_t)s.vocab);
    m->final_norm = dup_up(ones, sizeof(float) * (size_t)D);
    m->lm_head = db_weights((size_t)s.vocab * D);
    attn_shape sh = { s.n_heads, s.n_kv, s.head_dim, 1.f / sqrtf((float)s.head_dim) };
    OK(cuda_reserve_scratch(&C, cuda_attention_rows_scratch_bytes(&C, keys + 1, sh, 1)));
    OK(cuda_reserve_attention(&C, s.n_kv));
    free(rec), free(ones), free(inv), free(x);
}

static void db_close(db_model *m) {
    for (int l = 0; l < m->n_layers; l++) {
        db_layer *L = &m->L[l];
        cuda_free(L->wqkv), cuda_free(L->wo), cuda_free(L->wgu), cuda_free(L->wdown);
        cuda_free(L->k), cuda_free(L->v), cuda_free(L->attn_norm), cuda_free(L->ffn_norm);
    }
    free(m->L);
    cuda_free(m->d_kv), cuda_free(m->d_lens), cuda_free(m->d_pos), cuda_free(m->d_rows), cuda_free(m->inv_freq);
    cuda_free(m->rope_tab);
    cuda_free(m->x), cuda_free(m->qkv), cuda_free(m->att), cuda_free(m->hb), cuda_free(m->logits);
    cuda_free(m->final_norm), cuda_free(m->lm_head);
}

enum { DB_QKV, DB_ATTN, DB_O, DB_GLU, DB_DOWN, DB_LAYER_OPS, DB_HEAD = DB_LAYER_OPS, DB_STEP, DB_N };
static const char *const db_names[DB_N] = { "qkv matvec + norm", "attention + rope + kv", "o_proj + add",
                                            "gate|up + swiglu", "down + add", "lm_head + norm", "whole step" };

// Queues op of layer l as the decode step does (model/forward_cuda.c, decode_layer).
static void db_op(db_model *m, int op, int l) {
    const db_shape *s = &m->s;
    db_layer *L = &m->L[l];
    int q = s->n_heads * s->head_dim, kv = s->n_kv * s->head_dim, D = s->dim;
    cuda_mv_fuse attn_norm = { L->attn_norm, 1e-5f, 0, NULL, NULL }, ffn_norm = { L->ffn_norm, 1e-5f, 0, NULL, NULL };
    cuda_mv_fuse add = { NULL, 0, 1, NULL, NULL }, fin = { m->final_norm, 1e-5f, 0, NULL, NULL };
    attn_shape sh = { s->n_heads, s->n_kv, s->head_dim, 1.f / sqrtf((float)s->head_dim) };
    float *k = m->qkv + q, *v = k + kv;
    cuda_rope_kv rk = { k, v, m->d_pos, m->d_rows, m->rope_tab, NULL, NULL, 1e-5f };
    switch (op) {
    case DB_QKV:
        OK(cuda_matvec_rows_fused(&C, m->qkv, m->x, (wref){ L->wqkv, WT_BF16 }, D, q + 2 * kv, 1, q, q + kv, &attn_norm));
        break;
    case DB_ATTN:
        OK(cuda_attention_decode_rows_rope(&C, m->att, m->qkv, &rk, m->d_kv + l, m->d_lens, 1, m->keys + 1, sh, NULL));
        break;
    case DB_O: OK(cuda_matvec_rows_fused(&C, m->x, m->att, (wref){ L->wo, WT_BF16 }, q, D, 1, D, D, &add)); break;
    case DB_GLU:
        OK(cuda_matvec_glu_rows(&C, m->hb, m->hb, m->x, (wref){ L->wgu, WT_BF16 }, D, s->hid, 1, &ffn_norm));
        break;
    case DB_DOWN: OK(cuda_matvec_rows_fused(&C, m->x, m->hb, (wref){ L->wdown, WT_BF16 }, s->hid, D, 1, D, D, &add)); break;
    case DB_HEAD:
        OK(cuda_matvec_rows_fused(&C, m->logits, m->x, (wref){ m->lm_head, WT_BF16 }, D, s->vocab, 1, s->vocab, s->vocab,
                                  &fin));
        break;
    default: break;
    }
}

// What op queues once: its calls over every layer (the lm_head: once; the step: every
// op of every layer, then the lm_head). Returns the number of calls.
static int db_queue(db_model *m, int op) {
    if (op == DB_HEAD) {
        db_op(m, DB_HEAD, 0);
        return 1;
    }
    int n = 0;
    for (int l = 0; l < m->n_layers; l++)
        for (int o = 0; o < DB_LAYER_OPS; o++)
            if (op == o || op == DB_STEP) {
                db_op(m, o, l);
                n++;
            }
    if (op == DB_STEP) {
        db_op(m, DB_HEAD, 0);
        n++;
    }
    return n;
}

// Microseconds of one db_queue(op), from a graph of it replayed `reps` times.
static double db_time(db_model *m, int op, int reps, int *calls) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(C.stream, cudaStreamCaptureModeThreadLocal));
    *calls = db_queue(m, op);
    CK(cudaStreamEndCapture(C.stream, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphLaunch(ge, C.stream));  // warm-up
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0, C.stream));
    for (int r = 0; r < reps; r++) CK(cudaGraphLaunch(ge, C.stream));
    CK(cudaEventRecord(e1, C.stream));
    OK(cuda_sync(&C));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return 1e3 * ms / reps;
}

// Bytes an op streams per call (weights, and the cache for the attention).
static double db_bytes(const db_model *m, int op) {
    const db_shape *s = &m->s;
    double q = (double)s->n_heads * s->head_dim, kv = (double)s->n_kv * s->head_dim, D = s->dim;
    switch (op) {
    case DB_QKV: return 2 * (q + 2 * kv) * D;
    case DB_ATTN: return 2.0 * 2 * kv * (m->keys + 1);
    case DB_O: return 2 * D * q;
    case DB_GLU: return 2.0 * 2 * s->hid * D;
    case DB_DOWN: return 2.0 * D * s->hid;
    case DB_HEAD: return 2.0 * s->vocab * D;
    default: return 0;
    }
}

static void db_bench(db_shape s, int keys, int reps, long l2_bytes) {
    db_model m;
    db_open(&m, s, keys, l2_bytes);
    printf("BENCH decode graph %s: %d layers of weights (%.0f MiB, %.1fx the L2), %d keys\n", s.name, m.n_layers,
           m.n_layers * db_layer_bytes(&s) / 1048576.0, l2_bytes > 0 ? m.n_layers * db_layer_bytes(&s) / (double)l2_bytes : 0,
           keys);
    double sum = 0;
    for (int op = 0; op < DB_N; op++) {
        int calls = 0;
        double us = db_time(&m, op, reps, &calls), per = us / calls;
        if (op < DB_STEP) {
            double per_step = op == DB_HEAD ? per : per * s.n_layers;
            sum += per_step;
            printf("BENCH decode graph %s %-24s %8.2f us/call  %7.1f GB/s  (%d calls per replay; %.1f us per step)\n",
                   s.name, db_names[op], per, db_bytes(&m, op) / per / 1e3, calls, per_step);
        } else {
            double step = us * s.n_layers / m.n_layers;  // the model's layers, not the rotation's
            printf("BENCH decode graph %s %-24s %8.2f us per step (%d nodes); the ops alone sum to %.2f us: "
                   "%.2f us per node between them\n", s.name, db_names[op], step, s.n_layers * DB_LAYER_OPS + 1, sum,
                   (step - sum) / (s.n_layers * DB_LAYER_OPS + 1));
        }
    }
    // The matvecs and the whole step again on the deep kernels (ctx->mv_deep: the same
    // bits, more loads in flight; docs/cuda.md "The deep matvec"), beside the lines above.
    C.mv_deep = 1;
    for (int op = 0; op < DB_N; op++) {
        if (op == DB_ATTN) continue;
        int calls = 0;
        double us = db_time(&m, op, reps, &calls), per = us / calls;
        if (op < DB_STEP)
            printf("BENCH decode graph %s %-24s %8.2f us/call  %7.1f GB/s  deep\n", s.name, db_names[op], per,
                   db_bytes(&m, op) / per / 1e3);
        else
            printf("BENCH decode graph %s %-24s %8.2f us per step  deep\n", s.name, db_names[op],
                   us * s.n_layers / m.n_layers);
    }
    C.mv_deep = 0;
    db_close(&m);
}

// The shapes of SmolLM2-135M and Llama-3.2-1B at 512 live keys; quick: a tiny one.
static void db_bench_all(int quick) {
    cuda_facts f;
    OK(cuda_device_facts(&C, &f));
    if (quick) {
        db_bench((db_shape){ "tiny", 128, 4, 2, 32, 256, 2, 1000 }, 16, 1, 0);
        return;
    }
    db_bench((db_shape){ "smollm2-135m", 576, 9, 3, 64, 1536, 30, 49152 }, 512, 20, f.l2_bytes);
    db_bench((db_shape){ "llama-3.2-1b", 2048, 32, 8, 64, 8192, 16, 128256 }, 512, 20, f.l2_bytes);
}

#endif
