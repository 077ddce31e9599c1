// sched.c: see sched.h. A step: admit what fits, prefill up to one chunk of prompt
// positions (sampling each prompt's first token as its last chunk ends), then feed the
// pending token of every decoding sequence in one batch per adapter set and sample them.
#include <stdlib.h>
#include <string.h>

#include "host/decode/sched_internal.h"
#include "model/forward_cuda.h"

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// The adapters a sequence's passes apply.
static const lora_use *seq_lora(const sched *q, const seq *x, int *n) {
    *n = x->r.lora ? x->r.n_lora : q->s->n_adapters;
    return x->r.lora ? x->r.lora : q->s->lora;
}

// Its adapters as a salt of its prefix keys: keys and values depend on them.
static uint64_t seq_salt(const sched *q, const seq *x) {
    int n;
    const lora_use *u = seq_lora(q, x, &n);
    uint64_t h = 0x51ed270b27f4a1b5ull;
    for (int i = 0; i < n; i++) {
        uint64_t bits;
        memcpy(&bits, &u[i].scale, sizeof bits);
        h = mix64(h ^ (uint64_t)(uintptr_t)u[i].a);
        h = mix64(h ^ bits);
    }
    return h;
}

// ---- opening and closing ---------------------------------------------------------

// The sequences' paged pool: host memory on the CPU, device memory (bf16) on CUDA.
static int open_pool(sched *q, verr *err) {
    session *s = q->s;
    int n_layers = s->m.cfg.n_layers, kv_dim = model_kv_dim(&s->m), bf16 = s->cu ? 1 : s->kv.bf16;
    int block = SCHED_BLOCK;  // a power of two that divides the prefill chunk (prefix blocks lie in one chunk)
    while (q->chunk % block) block /= 2;
    size_t per_block = kv_pool_block_bytes(n_layers, kv_dim, bf16, block);
    long blocks;
    if (q->o.pool_tokens > 0) blocks = (q->o.pool_tokens + block - 1) / block;
    else {
        long mb = q->o.pool_mb > 0 ? q->o.pool_mb : SCHED_DEFAULT_POOL_MB;
        blocks = (long)((double)mb * (1 << 20) / (double)per_block);
        long one_ctx = (s->ctx + block - 1) / block;
        if (q->o.pool_mb <= 0 && blocks < one_ctx) blocks = one_ctx;  // the default holds one whole context
    }
    if (blocks < 1) blocks = 1;
    if (blocks > (1L << 30) / block) return verr_set(err, "KV pool: %ld blocks is too many", blocks);
    int rc = s->cu ? kv_pool_init_cuda(&q->pool, cuda_forward_ctx(s->cu), n_layers, kv_dim, block, (int)blocks, err)
                   : kv_pool_init(&q->pool, n_layers, kv_dim, bf16, block, (int)blocks, err);
    if (rc) return -1;
    q->pooled = 1;
    return 0;
}

int sched_open(sched **out, session *s, const sched_opts *o, verr *err) {
    *out = NULL;
    if (s->m.tp.size > 1 || s->tpl) return verr_set(err, "the scheduler does not run a tensor-parallel model");
    sched *q = calloc(1, sizeof *q);
    if (!q) return verr_set(err, "out of memory");
    q->s = s, q->o = *o, q->layer = -1, q->chunk = s->fw.max_T;
    q->max_rows = o->parallel > 0 ? o->parallel : SCHED_MAX_ROWS;
    size_t rows = (size_t)q->max_rows, vocab = (size_t)s->m.cfg.vocab_size;
    q->run = calloc(rows, sizeof *q->run);
    q->logits = malloc(sizeof(float) * rows * vocab);
    q->m = calloc(rows, sizeof *q->m);
    q->views = calloc(rows, sizeof *q->views);
    q->ids = calloc(rows, sizeof *q->ids);
    q->rows = calloc(rows, sizeof *q->rows);
    q->cfg = calloc(rows, sizeof *q->cfg);
    q->drawn = calloc(rows, sizeof *q->drawn);
    if (!q->run || !q->logits || !q->m || !q->views || !q->ids || !q->rows || !q->cfg || !q->drawn) {
        sched_close(q);
        return verr_set(err, "out of memory for %d scheduler rows", q->max_rows);
    }
    if (open_pool(q, err)) {
        sched_close(q);
        return -1;
    }
    *out = q;
    return 0;
}

static void seq_free(seq *x) {
    free(x->prompt);
    free(x);
}

// Ends x: its resources go back, on_done learns the outcome.
static void finish(sched *q, seq *x, int rc, const char *why) {
    if (x->t_decode > 0) x->st.decode_s = gen_now() - x->t_decode;
    else if (x->t_prefill > 0) x->st.prefill_s = gen_now() - x->t_prefill;
    q->st.generated += x->st.n_gen;
    if (x->ctx_ok) gen_ctx_free(&x->c);
    x->ctx_ok = 0;
    if (x->open) kv_cache_free(&x->kv);  // a paged cache's blocks go back to the pool
    x->open = 0, x->worst = 0;
    if (q->pooled) sched_update_reserve(q, x);
    x->state = -1;
    if (x->r.on_done) x->r.on_done(x->r.ud, rc, &x->st, why ? why : "");
}

// Drops the finished sequences from the running list, keeping the order.
static void compact(sched *q) {
    int k = 0;
    for (int i = 0; i < q->n_run; i++) {
        if (q->run[i]->state < 0) seq_free(q->run[i]);
        else q->run[k++] = q->run[i];
    }
    q->n_run = k;
}

void sched_close(sched *q) {
    if (!q) return;
    for (int i = 0; i < q->n_run; i++) finish(q, q->run[i], -1, "the scheduler was closed");
    compact(q);
    while (q->head) {
        seq *x = q->head;
        q->head = x->next;
        finish(q, x, -1, "the scheduler was closed");
        seq_free(x);
    }
    sched_reuse_free(q);
    if (q->pooled) kv_pool_free(&q->pool);
    metrics_ws_free(&q->ws);
    batch_ws_free(&q->bw);
    free(q->run), free(q->logits), free(q->m), free(q->views), free(q->ids), free(q->rows);
    free(q->cfg), free(q->drawn);
    free(q);
}

// ---- submitting and admitting ------------------------------------------------------

// What generate() would refuse, and what only generate() runs.
static int check_seq(sched *q, const sched_seq *r, verr *err) {
    const session *s = q->s;
    const gen_opts *g = r->g;
    if (r->n_prompt <= 0) return verr_set(err, "empty prompt");
    if (r->n_prompt >= s->ctx)
        return verr_set(err, "the prompt is %d tokens but the context holds %d (raise --ctx, up to %d)", r->n_prompt,
                        s->ctx, s->m.cfg.max_pos);
    if (g->sampler == GEN_ENTROPIX && g->branch_k > 0 && g->branch_b > 0)
        return verr_set(err, "the scheduler does not run LEHV branching (run it one by one)");
    if (g->feed_last) return verr_set(err, "the scheduler does not run captures (run them one by one)");
    if (!(g->ex && (g->sampler == GEN_ENTROPIX || g->want_metrics))) return 0;
    int layer;
    if (gen_capture_layer(s, g, &layer, err)) return -1;
    if (q->layer >= 0 && layer != q->layer)
        return verr_set(err, "the scheduler's sequences read their attention metrics at layer %d, this one at %d",
                        q->layer, layer);
    q->layer = layer;
    return 0;
}

int sched_submit(sched *q, const sched_seq *r, verr *err) {
    if (check_seq(q, r, err)) return -1;
    long most = (long)r->n_prompt + (r->g->max_new > 0 ? r->g->max_new : 0);
    if (most > q->s->ctx) most = q->s->ctx;
    seq *x = calloc(1, sizeof *x);
    if (!x || !(x->prompt = malloc(sizeof(int) * (size_t)r->n_prompt))) {
        free(x);
        return verr_set(err, "out of memory");
    }
    x->r = *r, x->pending = -1;
    memcpy(x->prompt, r->prompt, sizeof(int) * (size_t)r->n_prompt);
    x->st.n_prompt = r->n_prompt;
    x->salt = seq_salt(q, x);
    if (q->pooled) {
        x->worst = kv_pool_blocks_for(&q->pool, (int)most);
        if (x->worst > q->pool.n_blocks) {
            seq_free(x);
            return verr_set(err, "the sequence may hold %ld positions (a %d-token prompt and up to %d new) but the KV "
                            "pool holds %d: raise --kv-pool-mb (or --kv-pool-tokens)", most, r->n_prompt, r->g->max_new,
                            q->pool.n_blocks * q->pool.block);
        }
    }
    if (q->tail) q->tail->next = x;
    else q->head = x;
    q->tail = x;
    q->n_queued++;
    q->st.prompt_tokens += r->n_prompt;
    return 0;
}

// Room for the queue's first sequence now: a free row and, on the CPU, blocks for its
// worst case beyond every running sequence's (entries give theirs up first).
static int fits(sched *q, const seq *x) {
    if (q->n_run >= q->max_rows) return 0;
    if (!q->pooled) return 1;
    while (q->reserved + x->worst > kv_pool_idle(&q->pool) && sched_reuse_evict(q)) {}
    return q->reserved + x->worst <= kv_pool_idle(&q->pool);
}

int sched_has_room(const sched *q) {
    if (q->n_run + q->n_queued >= q->max_rows) return 0;
    return !q->pooled || q->reserved < kv_pool_idle(&q->pool);
}

int sched_pending(const sched *q) { return q->n_run + q->n_queued; }

// The queue's first sequence starts: its decoding state and an empty cache.
static void start(sched *q, seq *x) {
    verr err = { { 0 } };
    q->head = x->next;
    if (!q->head) q->tail = NULL;
    q->n_queued--;
    x->next = NULL;
    q->run[q->n_run++] = x;
    x->state = SEQ_PREFILL;
    session *s = q->s;
    if (gen_ctx_init(&x->c, s, x->r.g, x->prompt, x->r.n_prompt, 1, &err)) return finish(q, x, -1, err.msg);
    x->ctx_ok = 1;
    int rc = q->pooled ? kv_pool_open(&q->pool, &x->kv, s->ctx, &err) : kv_cache_init_like(&x->kv, &s->kv, s->ctx, &err);
    if (rc) return finish(q, x, -1, err.msg);
    x->open = 1;
    if (q->pooled) sched_update_reserve(q, x);
}

static void admit(sched *q) {
    while (q->head && fits(q, q->head)) start(q, q->head);
}

// ---- running --------------------------------------------------------------------

// Whether two adapter lists are the same adapters at the same scales.
static int lora_equal(const lora_use *u, int nu, const lora_use *v, int nv) {
    if (nu != nv) return 0;
    for (int i = 0; i < nu; i++)
        if (u[i].a != v[i].a || u[i].scale != v[i].scale) return 0;
    return 1;
}

// The session applies x's adapters to the next pass (it has its own between steps).
static int use_lora(sched *q, const seq *x, verr *err) {
    int n;
    const lora_use *u = seq_lora(q, x, &n);
    if (lora_equal(u, n, q->lora_u, q->lora_n)) return 0;
    if (session_set_lora(q->s, u, n, err)) return -1;
    q->lora_u = u, q->lora_n = n;
    return 0;
}

// Room in x's cache for n positions (within its reserve: never fails for want of blocks).
static int grow(sched *q, seq *x, int n, verr *err) {
    if (!q->pooled) return 0;
    if (kv_pool_grow(&q->pool, &x->kv, n, err)) return -1;
    sched_update_reserve(q, x);
    return 0;
}

// One step of x from logits row (and its metrics m when it needs them), or from the
// device's draw d (row NULL): its next token, or its end.
static void sample(sched *q, seq *x, const float *row, const token_metrics *m, const sample_out *d) {
    verr err = { { 0 } };
    if (q->o.interrupt && *q->o.interrupt) {
        x->st.interrupted = 1;
        return finish(q, x, 0, NULL);
    }
    x->c.row = row, x->c.row_pos = x->kv.len;
    if (m) x->c.row_m = *m;
    int *toks = NULL, one_tok;
    gen_record *recs = NULL, one;
    int n = 1;
    if (d) {
        gen_ctx_step_drawn(&x->c, d, &one, &one_tok);
        toks = &one_tok, recs = &one;
    } else {
        n = gen_ctx_step(&x->c, x->st.n_gen, &toks, &recs, &one, &one_tok, &err);
    }
    int rc = n < 0 ? -1 : gen_ctx_emit(&x->c, &x->st, toks, recs, n);
    if (rc) return finish(q, x, rc < 0 ? -1 : 0, rc < 0 ? err.msg : NULL);
    if (x->kv.len >= q->s->ctx) {
        x->st.hit_ctx = 1;
        return finish(q, x, 0, NULL);
    }
    x->pending = toks[n - 1];
}

// x's prompt is in its cache (row: the last position's logits, m its metrics).
static void prefilled(sched *q, seq *x, const float *row, const token_metrics *m) {
    double now = gen_now();
    x->st.prefill_s = now - x->t_prefill;
    x->t_decode = now;
    x->state = SEQ_DECODE;
    if (x->r.g->max_new <= 0) return finish(q, x, 0, NULL);
    sample(q, x, row, m, NULL);
}

// The next chunk of x's prompt; returns the positions computed (0 when x ended or all
// of its prompt was found in the caches).
static int prefill_chunk(sched *q, seq *x) {
    verr err = { { 0 } };
    session *s = q->s;
    int total = x->r.n_prompt;
    if (x->fed == 0 && x->t_prefill == 0) {
        x->t_prefill = gen_now();
        const float *row = NULL;
        token_metrics m = { 0 };
        int found = sched_reuse_find(q, x, &row, &m);
        x->fed = x->kv.len;
        q->st.reused_tokens += x->fed;
        if (found == 2) {
            prefilled(q, x, row, &m);
            return 0;
        }
    }
    int n = total - x->fed < q->chunk ? total - x->fed : q->chunk;
    kv_view v = kv_view_of(&x->kv);
    if (grow(q, x, x->fed + n, &err) || use_lora(q, x, &err) || session_forward(s, &v, x->prompt + x->fed, n, &err)) {
        finish(q, x, -1, err.msg);
        return n;
    }
    x->fed += n;
    if (x->fed < total) return n;
    token_metrics m = { 0 };  // with a capture layer for any sequence, also kept for later equal prompts
    int with_m = s->fw.attn_layer >= 0 || x->c.metrics;
    if (with_m && session_metrics(s, &q->ws, &m)) {
        finish(q, x, -1, "out of memory computing metrics");
        return n;
    }
    sched_reuse_keep(q, x, with_m ? &m : NULL);
    prefilled(q, x, s->fw.logits, &m);
    return n;
}

// Prompt positions up to one chunk (a chunk is never cut: it is the unit the prefill
// is computed in), the first admitted prompts first.
static void prefill(sched *q) {
    int budget = q->chunk;
    for (int i = 0; i < q->n_run && budget > 0; i++) {
        seq *x = q->run[i];
        while (budget > 0 && x->state == SEQ_PREFILL) budget -= prefill_chunk(q, x);
    }
}

// Whether x and y run with the same adapters (one batch; each request may hold its own
// copy of the list).
static int same_lora(const sched *q, const seq *x, const seq *y) {
    int nx, ny;
    const lora_use *ux = seq_lora(q, x, &nx), *uy = seq_lora(q, y, &ny);
    return lora_equal(ux, nx, uy, ny);
}

// Whether the device draws the B rows (CUDA): every row's sequence takes plain draws
// from the raw logits, and its metrics come from the device's statistics. Then only the
// tokens cross the bus, not B rows of logits.
static int device_draws(const sched *q, int B, int want_m) {
    if (!session_batch_draws(q->s, B) || (want_m && q->s->fw.attn_layer < 0)) return 0;
    for (int b = 0; b < B; b++)
        if (!gen_ctx_device_draw(&q->rows[b]->c)) return 0;
    return 1;
}

// One batch: rows [0, B) of q->rows, all with the same adapters.
static void decode_rows(sched *q, int B) {
    verr err = { { 0 } };
    session *s = q->s;
    int want_m = 0, ok = 0;
    for (int b = 0; b < B; b++) {
        seq *x = q->rows[b];
        want_m |= x->c.metrics;
        q->views[b] = kv_view_of(&x->kv);
        q->ids[b] = x->pending;
        x->pending = -1;
    }
    int dev = device_draws(q, B, want_m);
    for (int b = 0; dev && b < B; b++) q->cfg[b] = gen_ctx_next_cfg(&q->rows[b]->c);  // each row's own stream
    if (use_lora(q, q->rows[0], &err) == 0) {
        token_metrics *m = want_m ? q->m : NULL;
        ok = dev ? session_forward_batch_draw(s, q->views, q->ids, B, q->cfg, q->drawn, m, &q->bw, &err) == 0
                 : session_forward_batch(s, q->views, q->ids, B, q->logits, m, &q->ws, &q->bw, &err) == 0;
    }
    q->st.steps++, q->st.rows += B;
    q->st.device_draws += dev ? B : 0;
    if (B > q->st.widest) q->st.widest = B;
    size_t vocab = (size_t)s->m.cfg.vocab_size;
    for (int b = 0; b < B; b++) {
        const token_metrics *m = want_m ? &q->m[b] : NULL;
        if (!ok) finish(q, q->rows[b], -1, err.msg);
        else if (dev) sample(q, q->rows[b], NULL, m, &q->drawn[b]);
        else sample(q, q->rows[b], q->logits + b * vocab, m, NULL);
    }
}

// Every decoding sequence's pending token, one batch per adapter set and device step
// (CUDA: at most session_step_rows rows, so each batch is one step whose draws the
// device can make).
static void decode(sched *q) {
    int n = 0, cap = session_step_rows(q->s);
    seq *todo[q->n_run > 0 ? q->n_run : 1];
    for (int i = 0; i < q->n_run; i++)
        if (q->run[i]->state == SEQ_DECODE && q->run[i]->pending >= 0) todo[n++] = q->run[i];
    while (n > 0) {
        int B = 0, k = 0;
        for (int i = 0; i < n; i++) {
            seq *x = todo[i];
            if (!same_lora(q, todo[0], x) || (cap > 0 && B == cap)) {
                todo[k++] = x;
                continue;
            }
            verr err;
            if (grow(q, x, x->kv.len + 1, &err)) finish(q, x, -1, err.msg);
            else q->rows[B++] = x;
        }
        if (B > 0) decode_rows(q, B);
        n = k;
    }
}

// Ctrl-C: everything ends, interrupted, at once.
static void interrupt_all(sched *q) {
    for (int i = 0; i < q->n_run; i++) {
        q->run[i]->st.interrupted = 1;
        finish(q, q->run[i], 0, NULL);
    }
    compact(q);
    while (q->head) {
        seq *x = q->head;
        q->head = x->next;
        q->n_queued--;
        x->st.interrupted = 1;
        finish(q, x, 0, NULL);
        seq_free(x);
    }
    q->tail = NULL;
}

int sched_step(sched *q, verr *err) {
    session *s = q->s;
    (void)err;
    if (q->o.interrupt && *q->o.interrupt) {
        interrupt_all(q);
        return 0;
    }
    s->fw.attn_layer = q->layer;  // every row's capture (the metrics), or none
    s->fw.lazy_logits = 0;
    q->lora_u = s->lora, q->lora_n = s->n_adapters;  // what the session applies between steps
    admit(q);
    prefill(q);
    compact(q);
    decode(q);
    compact(q);
    verr e2;
    if (q->lora_u != s->lora || q->lora_n != s->n_adapters) session_set_lora(s, s->lora, s->n_adapters, &e2);
    return 0;
}

void sched_get_stats(const sched *q, sched_stats *st) {
    *st = q->st;
    st->running = q->n_run, st->queued = q->n_queued;
    if (q->pooled) {
        st->pool_blocks = q->pool.n_blocks, st->block = q->pool.block;
        st->pool_used = q->pool.n_blocks - kv_pool_idle(&q->pool);
        st->evictions = q->pool.evictions;
    }
}

void sched_report(const sched *q, FILE *f) {
    sched_stats st;
    sched_get_stats(q, &st);
    fprintf(f, "scheduler: %ld batches of %.1f rows on average (widest %d), %ld of %ld prompt positions reused", st.steps,
            st.steps ? (double)st.rows / st.steps : 0.0, st.widest, st.reused_tokens, st.prompt_tokens);
    if (st.block) fprintf(f, ", KV pool of %d blocks of %d positions", st.pool_blocks, st.block);
    if (st.device_draws) fprintf(f, ", %ld of %ld rows drawn on the device", st.device_draws, st.rows);
    fputc('\n', f);
}
