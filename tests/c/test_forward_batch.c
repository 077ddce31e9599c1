// test_forward_batch.c: forward_batch / session_forward_batch (B sequences, one token
// each, one pass) against the per-row forward() they replace, and LEHV branching
// (branch_run, now one batch per step) against a sequential re-implementation here.
// Models: random checkpoints of every tiny preset of tools/gen_random_checkpoint.py, in
// f32 and bf16, and stories260K from tests/data (converted with $VARENT). Per model:
//   - 5 rows at different positions (tails holding 0..3 tokens, one row appending to the
//     trunk): logits, the capture layer's scores and key counts, the stored keys/values
//     and the lengths equal each row's own forward(), bit for bit (cpu_matmul sums each
//     of up to 8 rows exactly as a single row, bf16 included);
//   - session_forward_batch over 6 rows (chunks of max_T = 5 and 1): logits and the
//     entropix metrics equal forward() + metrics_logits / metrics_attention per row;
//   - bad input leaves every cache untouched: two rows on one tail, two rows appending
//     to the trunk, ids out of range, a full tail, B > max_T, B = 0.
// Branching (f32 models): candidates, every branch's tokens, metrics and mean entropy,
// the winner and the committed keys equal a step-major sequential reference, with a
// stop id that ends a branch early, and with penalties.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "test_models.h"
#include "host/decode/branch.h"
#include "host/runtime/session.h"

static char nm[256];
#define NAME(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

// ---- models ------------------------------------------------------------------------------
// Everything goes to a fresh directory under $TESTTMP (removed at the end): tests/tmp
// is shared with other test programs.
static char workdir[512];

static int gen_model(const char *preset, const char *dtype, char *dir, size_t n) {
    return gen_random_model(workdir, preset, dtype, 11, dir, n);
}

// stories260K converted to f32 safetensors; NULL when not possible.
static const char *stories_dir(void) {
    static char dir[600];
    const char *varent = getenv("VARENT");
    snprintf(dir, sizeof dir, "%s/stories260K", workdir);
    char probe[700], cmd[2400];
    snprintf(probe, sizeof probe, "%s/config.json", dir);
    if (!varent || !exists("tests/data/stories260K/stories260K.bin.xz")) return NULL;
    snprintf(cmd, sizeof cmd,
             "%s -c \"import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))\" "
             "tests/data/stories260K/stories260K.bin.xz '%s/stories260K.bin' && "
             "'%s' convert llama2c '%s/stories260K.bin' tests/data/stories260K/tok512.bin '%s' --dtype f32 >/dev/null",
             env_or("PYTHON", "python3"), workdir, varent, workdir, dir);
    return system(cmd) == 0 && exists(probe) ? dir : NULL;
}

static int open_model(session *s, const char *dir, verr *err) {
    session_opts o = { .model_dir = dir, .ctx = 64, .max_batch = 5 };
    return session_open(s, &o, err);
}

// ---- comparisons -------------------------------------------------------------------------
static float max_abs(const float *x, long n) {
    float m = 0;
    for (long i = 0; i < n; i++) m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
    return m;
}

// Bitwise when exact, else within 1e-5 of the largest magnitude plus 1e-5 relative.
static int same(const float *got, const float *ref, long n, int exact) {
    if (exact) return memcmp(got, ref, sizeof(float) * (size_t)n) == 0;
    return check_close(got, ref, n, 1e-5f * max_abs(ref, n), 1e-5f) < 0;
}

static int near_d(double a, double b, int exact) { return exact ? a == b : fabs(a - b) <= 1e-4 * (1 + fabs(b)); }

// ---- per-row reference -------------------------------------------------------------------
enum { R = 6, TAIL = 8 };

typedef struct {
    float *logits;  // [R, vocab]
    float *scores;  // [R, n_heads, ctx]
    int keys[R];
    float *k, *v;   // [R, n_layers, kv_dim] the keys/values each row stored
} refs;

static kv_cache *target(kv_view *v) { return v->tail ? v->tail : v->trunk; }

// Each row alone through forward(), then rolled back: what a batch must reproduce.
static int reference(session *s, kv_view *views, const int *ids, int B, refs *r, verr *err) {
    const model_config *c = &s->m.cfg;
    size_t V = (size_t)c->vocab_size, per = (size_t)c->n_heads * s->fw.ctx, kvd = (size_t)c->n_kv_heads * c->head_dim;
    for (int b = 0; b < B; b++) {
        kv_cache *t = target(&views[b]);
        int at = t->len;
        if (forward(&s->fw, &views[b], &ids[b], 1, err)) return -1;
        memcpy(r->logits + b * V, s->fw.logits, V * sizeof(float));
        memcpy(r->scores + b * per, s->fw.attn_scores, per * sizeof(float));
        r->keys[b] = s->fw.attn_keys;
        for (int l = 0; l < c->n_layers; l++) {
            memcpy(r->k + ((size_t)b * c->n_layers + l) * kvd, (float *)kv_cache_k(t, l) + at * kvd, kvd * sizeof(float));
            memcpy(r->v + ((size_t)b * c->n_layers + l) * kvd, (float *)kv_cache_v(t, l) + at * kvd, kvd * sizeof(float));
        }
        kv_cache_truncate(t, at);
        if (!views[b].tail) views[b].n_trunk = at;
    }
    return 0;
}

// The rows' stored keys/values, scores and lengths after a batch, against the reference.
static void compare_state(const char *tag, session *s, kv_view *views, int B, const int *len0, const refs *r,
                          const float *scores, const int *keys, int exact) {
    const model_config *c = &s->m.cfg;
    size_t per = (size_t)c->n_heads * s->fw.ctx, kvd = (size_t)c->n_kv_heads * c->head_dim;
    int kv_ok = 1, len_ok = 1, sc_ok = 1;
    for (int b = 0; b < B; b++) {
        kv_cache *t = target(&views[b]);
        len_ok = len_ok && t->len == len0[b] + 1 && (views[b].tail || views[b].n_trunk == t->len);
        for (int l = 0; l < c->n_layers; l++) {
            size_t at = (size_t)len0[b] * kvd, o = ((size_t)b * c->n_layers + l) * kvd;
            kv_ok = kv_ok && same((float *)kv_cache_k(t, l) + at, r->k + o, (long)kvd, exact) &&
                    same((float *)kv_cache_v(t, l) + at, r->v + o, (long)kvd, exact);
        }
        if (scores)
            sc_ok = sc_ok && keys[b] == r->keys[b] &&
                    same(scores + b * per, r->scores + b * per, (long)c->n_heads * keys[b], exact);
    }
    CHECK(len_ok, NAME("%s: lengths advance by one per row", tag), "a row's length is off");
    CHECK(kv_ok, NAME("%s: stored keys/values equal forward()", tag), "a row's k/v differ");
    if (scores) CHECK(sc_ok, NAME("%s: captured scores equal forward()", tag), "a row's capture differs");
}

// ---- bad input -----------------------------------------------------------------------------
typedef struct {
    float *data;  // every cache's k and v, concatenated
    int lens[R + 1];
} snapshot;

static size_t cache_floats(const kv_cache *c) { return (size_t)c->n_layers * c->ctx * c->kv_dim; }

static void snap(snapshot *p, kv_cache *trunk, kv_cache *tails, int n) {
    size_t off = 0;
    for (int i = 0; i <= n; i++) {
        kv_cache *c = i == n ? trunk : &tails[i];
        memcpy(p->data + off, c->k, cache_floats(c) * sizeof(float)), off += cache_floats(c);
        memcpy(p->data + off, c->v, cache_floats(c) * sizeof(float)), off += cache_floats(c);
        p->lens[i] = c->len;
    }
}

static int unchanged(const snapshot *p, kv_cache *trunk, kv_cache *tails, int n) {
    size_t off = 0;
    for (int i = 0; i <= n; i++) {
        kv_cache *c = i == n ? trunk : &tails[i];
        if (c->len != p->lens[i] || memcmp(p->data + off, c->k, cache_floats(c) * sizeof(float)) ||
            memcmp(p->data + off + cache_floats(c), c->v, cache_floats(c) * sizeof(float)))
            return 0;
        off += 2 * cache_floats(c);
    }
    return 1;
}

static void bad(const char *tag, const char *what, session *s, kv_view *views, const int *ids, int B, const char *want,
                kv_cache *tails, snapshot *before, float *out) {
    verr err = { { 0 } };
    snap(before, &s->kv, tails, R);
    int rc = forward_batch(&s->fw, views, ids, B, out, NULL, NULL, &err);
    CHECK(rc == -1 && strstr(err.msg, want) && unchanged(before, &s->kv, tails, R),
          NAME("%s: %s is refused, caches untouched", tag, what), "rc %d, '%s' (wanted '%s')", rc, err.msg, want);
}

static void test_bad_input(const char *tag, session *s, kv_cache *tails, float *out) {
    const model_config *c = &s->m.cfg;
    size_t total = cache_floats(&s->kv) * 2;
    for (int i = 0; i < R; i++) total += cache_floats(&tails[i]) * 2;
    snapshot before = { .data = malloc(total * sizeof(float)) };
    if (!before.data) return;
    int ids[R + 1] = { 3, 4, 5, 6, 7, 8, 9 };
    kv_view v[R + 1];
    for (int i = 0; i < R; i++) v[i] = (kv_view){ &s->kv, s->kv.len, &tails[i] };
    kv_view dup[3] = { v[0], v[1], v[0] };
    bad(tag, "two rows on one tail", s, dup, ids, 3, "rows 0 and 2 write to the same KV cache", tails, &before, out);
    kv_view trunk2[2] = { kv_view_of(&s->kv), kv_view_of(&s->kv) };
    bad(tag, "two rows appending to the trunk", s, trunk2, ids, 2, "rows 0 and 1", tails, &before, out);
    int hi[2] = { 3, c->vocab_size }, lo[2] = { -1, 3 };
    bad(tag, "an id past the vocab", s, v, hi, 2, "out of range", tails, &before, out);
    bad(tag, "a negative id", s, v, lo, 2, "out of range", tails, &before, out);
    int saved = tails[1].len;
    tails[1].len = tails[1].ctx;  // full (the contents do not matter: nothing may be written)
    bad(tag, "a full tail", s, v, ids, 3, "row 1 does not fit", tails, &before, out);
    tails[1].len = saved;
    bad(tag, "B > max_T", s, v, ids, R, "6 rows, want 1..5", tails, &before, out);
    bad(tag, "B = 0", s, v, ids, 0, "0 rows", tails, &before, out);
    free(before.data);
}

// ---- rows against forward() ----------------------------------------------------------------
static void test_rows(const char *tag, session *s, int exact) {
    const model_config *c = &s->m.cfg;
    verr err = { { 0 } };
    int V = c->vocab_size;
    size_t per = (size_t)c->n_heads * s->fw.ctx, kvd = (size_t)c->n_kv_heads * c->head_dim;
    kv_cache tails[R];
    memset(tails, 0, sizeof tails);
    refs r = { .logits = malloc(sizeof(float) * R * V), .scores = malloc(sizeof(float) * R * per),
               .k = malloc(sizeof(float) * R * c->n_layers * kvd), .v = malloc(sizeof(float) * R * c->n_layers * kvd) };
    float *out = malloc(sizeof(float) * R * V), *scores = malloc(sizeof(float) * R * per);
    token_metrics m[R];
    metrics_ws ws = { 0 };
    batch_ws bw = { 0 };
    int ok = r.logits && r.scores && r.k && r.v && out && scores;
    for (int i = 0; ok && i < R; i++) ok = kv_cache_init(&tails[i], c->n_layers, TAIL, (int)kvd, &err) == 0;
    if (!ok) {
        CHECK(0, NAME("%s: setup", tag), "out of memory or %s", err.msg);
        goto done;
    }
    s->fw.attn_layer = c->n_layers - 1;
    int prompt[6] = { 1, 7 % V, 42, 99, 5, 300 % V };
    kv_cache_truncate(&s->kv, 0);
    kv_view tv = kv_view_of(&s->kv);
    if (forward(&s->fw, &tv, prompt, 6, &err)) {
        CHECK(0, NAME("%s: prompt", tag), "%s", err.msg);
        goto done;
    }
    // Rows 0..3 on tails holding 3, 0, 2, 1 tokens (positions 9, 6, 8, 7), row 4 on the trunk.
    kv_view views[R];
    int pre[R - 1] = { 3, 0, 2, 1, 0 };
    for (int b = 0; b < R - 1; b++) {
        views[b] = (kv_view){ &s->kv, s->kv.len, &tails[b] };
        int p[3] = { (b * 13 + 3) % V, (b * 17 + 8) % V, (b * 5 + 21) % V };
        if (pre[b] && forward(&s->fw, &views[b], p, pre[b], &err)) CHECK(0, NAME("%s: tails", tag), "%s", err.msg);
    }
    views[4] = kv_view_of(&s->kv);
    int ids[R] = { 11 % V, 250 % V, 3, V - 1, 0, 77 % V }, len0[R];

    // step 1: forward_batch over 5 rows (a 4-row matmul tile plus one row)
    int keys[R];
    if (reference(s, views, ids, R - 1, &r, &err)) CHECK(0, NAME("%s: reference", tag), "%s", err.msg);
    for (int b = 0; b < R - 1; b++) len0[b] = target(&views[b])->len;
    int rc = forward_batch(&s->fw, views, ids, R - 1, out, scores, keys, &err);
    CHECK(rc == 0, NAME("%s: forward_batch runs", tag), "%s", err.msg);
    int lg_ok = 1;
    for (int b = 0; b < R - 1; b++) lg_ok = lg_ok && same(out + (size_t)b * V, r.logits + (size_t)b * V, V, exact);
    CHECK(lg_ok, NAME("%s: 5 rows' logits equal forward() per row", tag), "a row differs");
    char sub[160];
    snprintf(sub, sizeof sub, "%s: 5 rows", tag);
    compare_state(sub, s, views, R - 1, len0, &r, scores, keys, exact);

    // step 2: session_forward_batch over 6 rows (row 5 joins on its own empty tail):
    // forward_batch chunks of 5 and 1, logits and metrics per row
    views[5] = (kv_view){ &s->kv, s->kv.len, &tails[5] };
    for (int b = 0; b < R; b++) ids[b] = (ids[b] * 7 + 5) % V;
    if (reference(s, views, ids, R, &r, &err)) CHECK(0, NAME("%s: reference 2", tag), "%s", err.msg);
    for (int b = 0; b < R; b++) len0[b] = target(&views[b])->len;
    rc = session_forward_batch(s, views, ids, R, out, m, &ws, &bw, &err);
    CHECK(rc == 0, NAME("%s: session_forward_batch runs", tag), "%s", err.msg);
    int mt_ok = 1;
    lg_ok = 1;
    for (int b = 0; b < R; b++) {
        token_metrics want;
        metrics_logits(&ws, r.logits + (size_t)b * V, V, &want);
        metrics_attention(&ws, r.scores + b * per, c->n_heads, r.keys[b], &want);
        lg_ok = lg_ok && same(out + (size_t)b * V, r.logits + (size_t)b * V, V, exact);
        mt_ok = mt_ok && near_d(m[b].entropy, want.entropy, exact) && near_d(m[b].varentropy, want.varentropy, exact) &&
                near_d(m[b].log_z, want.log_z, exact) && near_d(m[b].attn_entropy, want.attn_entropy, exact) &&
                near_d(m[b].attn_varentropy, want.attn_varentropy, exact) &&
                near_d(m[b].agreement, want.agreement, exact) &&
                near_d(m[b].interaction_strength, want.interaction_strength, exact) && want.attn_entropy > 0;
    }
    CHECK(lg_ok, NAME("%s: session batch of 6 (max_T 5): logits equal forward()", tag), "a row differs");
    CHECK(mt_ok, NAME("%s: session batch of 6: metrics equal forward() + metrics", tag), "a row's metrics differ");
    snprintf(sub, sizeof sub, "%s: session batch of 6", tag);
    compare_state(sub, s, views, R, len0, &r, NULL, NULL, exact);

    test_bad_input(tag, s, tails, out);
done:
    for (int i = 0; i < R; i++) kv_cache_free(&tails[i]);
    free(r.logits), free(r.scores), free(r.k), free(r.v), free(out), free(scores);
    metrics_ws_free(&ws);
    batch_ws_free(&bw);
}

// ---- branching ----------------------------------------------------------------------------
enum { BK = 4, BB = 5 };

typedef struct {
    int tok[BK][BB + 1], len[BK];
    double h[BK][BB + 1], mean[BK];
    int winner;
    kv_cache tails[BK];
} branch_ref;

// branch_run's promise, one branch row at a time through forward() on s (its own
// tails): candidates from root's LEHV distribution, then step-major draws (step j of
// each live branch in order), penalties per branch (history plus the branch's first j
// tokens), a stop id ending a branch, the lowest mean entropy winning (ties: earlier).
static int branch_reference(session *s, const float *root, rng r, sampler_params lehv, sampler_params base,
                            const branch_penalty *pen, branch_ref *o, verr *err) {
    const model_config *c = &s->m.cfg;
    int V = c->vocab_size, live[BK], cand[BK], rc = 0;
    metrics_ws ws = { 0 };
    float *work = malloc(sizeof(float) * V);
    if (!work) return verr_set(err, "out of memory");
    sampler_distribution(&s->smp, root, lehv);
    int k = sampler_draw_distinct(&s->smp, &r, BK, cand);
    for (int i = 0; i < k; i++) o->tok[i][0] = cand[i], o->len[i] = 1, live[i] = 1, o->tails[i].len = 0, o->mean[i] = 0;
    for (int j = 1; j <= BB && rc == 0; j++)
        for (int i = 0; i < k && rc == 0; i++) {
            if (!live[i]) continue;
            kv_view v = { &s->kv, s->kv.len, &o->tails[i] };
            if ((rc = forward(&s->fw, &v, &o->tok[i][j - 1], 1, err))) break;
            token_metrics m;
            metrics_logits(&ws, s->fw.logits, V, &m);
            metrics_attention(&ws, s->fw.attn_scores, c->n_heads, s->fw.attn_keys, &m);
            o->h[i][j] = m.entropy;
            o->mean[i] += m.entropy;
            const float *lg = s->fw.logits;
            if (pen) {
                memcpy(pen->hist + pen->n_hist, o->tok[i], sizeof(int) * j);
                memcpy(work, lg, sizeof(float) * V);
                sampler_penalize(work, V, pen->hist, pen->n_hist + j, pen->pen, pen->count);
                lg = work;
            }
            o->tok[i][j] = sampler_sample(&s->smp, lg, base, &r);
            o->len[i] = j + 1;
            if (session_is_stop(s, o->tok[i][j])) live[i] = 0;
        }
    o->winner = 0;
    for (int i = 0; i < k; i++) {
        o->mean[i] = o->len[i] > 1 ? o->mean[i] / (o->len[i] - 1) : 0;
        if (o->mean[i] < o->mean[o->winner]) o->winner = i;
    }
    free(work);
    metrics_ws_free(&ws);
    return rc ? -1 : k;
}

static void compare_branches(const char *tag, session *s, const branch_set *bs, int w, const branch_ref *o, int k,
                             int n_prompt) {
    int tok_ok = 1, h_ok = 1, early = 0;
    for (int i = 0; i < k; i++) {
        const int *t = bs->tok + (size_t)i * (BB + 1);
        const gen_record *rec = bs->rec + (size_t)i * (BB + 1);
        tok_ok = tok_ok && bs->len[i] == o->len[i] && !memcmp(t, o->tok[i], sizeof(int) * o->len[i]);
        for (int j = 1; j < o->len[i]; j++) h_ok = h_ok && rec[j].m.entropy == o->h[i][j] && rec[j].q == Q_BRANCH;
        h_ok = h_ok && bs->mean_h[i] == o->mean[i];
        early += o->len[i] < BB + 1;
    }
    CHECK(tok_ok, NAME("%s: every branch's tokens equal the step-major reference", tag), "tokens differ");
    CHECK(h_ok, NAME("%s: every step's entropy and the means equal the reference", tag), "entropies differ");
    CHECK(w == o->winner, NAME("%s: the lowest mean entropy wins", tag), "winner %d, reference %d", w, o->winner);
    // The commit: the winner's fed tokens' keys/values appended to the trunk.
    const kv_cache *tl = &o->tails[o->winner];
    int fed = o->len[o->winner] - 1, kv_ok = s->kv.len == n_prompt + fed;
    size_t kvd = (size_t)tl->kv_dim;
    for (int l = 0; kv_ok && l < tl->n_layers; l++)
        kv_ok = !memcmp((float *)kv_cache_k(&s->kv, l) + n_prompt * kvd, kv_cache_k(tl, l), fed * kvd * sizeof(float)) &&
                !memcmp((float *)kv_cache_v(&s->kv, l) + n_prompt * kvd, kv_cache_v(tl, l), fed * kvd * sizeof(float));
    CHECK(kv_ok, NAME("%s: the winner's tail is committed to the trunk", tag), "kv len %d, want %d + %d", s->kv.len,
          n_prompt, fed);
    if (!strstr(tag, "penalty")) CHECK(early > 0, NAME("%s: a stop id ends a branch early", tag), "no branch stopped");
}

// Branching on an f32 model: the batched branch_run on s, the reference on a second
// context s2 (shared weights), from the same prompt, root logits and seed.
static void test_branch(const char *tag, const char *dir) {
    session s, s2;
    verr err = { { 0 } };
    if (open_model(&s, dir, &err)) {
        CHECK(0, NAME("%s: branch model opens", tag), "%s", err.msg);
        return;
    }
    if (session_open_shared(&s2, &s, 0, &err)) {
        CHECK(0, NAME("%s: second context", tag), "%s", err.msg);
        session_close(&s);
        return;
    }
    const model_config *c = &s.m.cfg;
    int V = c->vocab_size, prompt[5] = { 1, 9 % V, 33 % V, 4, 60 % V }, n_prompt = 5, k = 0;
    branch_ref o;
    branch_set bs;
    memset(&o, 0, sizeof o);
    memset(&bs, 0, sizeof bs);
    float *root = malloc(sizeof(float) * V), *work = malloc(sizeof(float) * V);
    int *seen = calloc((size_t)V, sizeof *seen);
    int *hist = malloc(sizeof(int) * (n_prompt + BB + 1));
    metrics_ws ws = { 0 };
    int ok = root && work && seen && hist && branch_init(&bs, &s.m, BK, BB, &err) == 0;
    for (int i = 0; ok && i < BK; i++)
        ok = kv_cache_init(&o.tails[i], c->n_layers, BB + 1, c->n_kv_heads * c->head_dim, &err) == 0;
    kv_view v1 = kv_view_of(&s.kv), v2 = kv_view_of(&s2.kv);
    ok = ok && forward(&s.fw, &v1, prompt, n_prompt, &err) == 0 && forward(&s2.fw, &v2, prompt, n_prompt, &err) == 0;
    if (!ok) {
        CHECK(0, NAME("%s: branch setup", tag), "%s", err.msg);
        goto done;
    }
    memcpy(root, s.fw.logits, sizeof(float) * V);
    memcpy(hist, prompt, sizeof prompt);
    s.fw.attn_layer = s2.fw.attn_layer = c->n_layers - 1;
    sampler_params lehv = { 1.3f, 30, 1, 0 }, base = { 1.0f, 0, 1, 0 };
    sampler_penalties rep = { .repeat = 1.5f, .last_n = -1 };
    branch_penalty pen = { hist, n_prompt, &rep, work, seen, NULL, 0 };
    // the first reference picks a stop id: branch 1's second draw
    if (branch_reference(&s2, root, (rng){ 77, 0 }, lehv, base, NULL, &o, &err) < 0) goto done;
    session_add_stop(&s, o.tok[1][2]);
    session_add_stop(&s2, o.tok[1][2]);
    for (int variant = 0; variant < 2; variant++) {
        const branch_penalty *p = variant ? &pen : NULL;
        char vtag[160];
        snprintf(vtag, sizeof vtag, "%s branch %dx%d, stop%s", tag, BK, BB, variant ? ", repeat penalty" : "");
        k = branch_reference(&s2, root, (rng){ 77, 0 }, lehv, base, p, &o, &err);
        kv_cache_truncate(&s.kv, n_prompt);
        sampler_distribution(&s.smp, root, lehv);
        gen_record rec0 = { .pos = n_prompt, .q = Q_LEHV, .sp = lehv };
        rng r = { 77, 0 };
        int w = k < 0 ? -1 : branch_run(&bs, &s, &rec0, base, BB, &ws, &r, p, &err);
        CHECK(w >= 0 && k == BK, NAME("%s: runs", vtag), "w %d k %d: %s", w, k, err.msg);
        if (w < 0 || k < 0) break;
        int distinct = 1;
        for (int i = 0; i < k; i++)
            for (int j = 0; j < i; j++) distinct = distinct && bs.tok[i * (BB + 1)] != bs.tok[j * (BB + 1)];
        CHECK(distinct, NAME("%s: distinct candidates", vtag), "a candidate repeats");
        compare_branches(vtag, &s, &bs, w, &o, k, n_prompt);
    }
done:
    for (int i = 0; i < BK; i++) kv_cache_free(&o.tails[i]);
    branch_free(&bs);
    metrics_ws_free(&ws);
    free(root), free(work), free(seen), free(hist);
    session_close(&s2);
    session_close(&s);
}

static void test_model(const char *tag, const char *dir, int f32) {
    session s;
    verr err = { { 0 } };
    if (open_model(&s, dir, &err)) {
        CHECK(0, NAME("%s opens", tag), "%s", err.msg);
        return;
    }
    test_rows(tag, &s, 1);  // batches of <= 8 rows sum each row as alone, bf16 too
    session_close(&s);
    if (f32) test_branch(tag, dir);
}

int main(void) {
    snprintf(workdir, sizeof workdir, "%s/fb-XXXXXX", env_or("TESTTMP", "tests/tmp"));
    if (!mkdtemp(workdir)) {
        CHECK(0, "work directory", "mkdtemp %s failed", workdir);
        CHECK_DONE();
    }
    const char *presets[] = { "llama3-tiny", "llama-mha-untied", "qwen2-tiny", "qwen3-tiny" };
    for (int p = 0; p < 4; p++)
        for (int f32 = 1; f32 >= 0; f32--) {
            char dir[600], tag[64];
            snprintf(tag, sizeof tag, "%s %s", presets[p], f32 ? "f32" : "bf16");
            if (gen_model(presets[p], f32 ? "f32" : "bf16", dir, sizeof dir)) {
                CHECK(0, NAME("%s: gen_random_checkpoint.py", tag), "failed (PYTHON=%s)", env_or("PYTHON", "python3"));
                continue;
            }
            test_model(tag, dir, f32);
        }
    const char *st = stories_dir();
    if (st) test_model("stories260K", st, 1);
    else SKIP("stories260K", "tests/data/stories260K or $VARENT missing");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", workdir);
    if (system(cmd) != 0) printf("note: could not remove %s\n", workdir);
    CHECK_DONE();
}
