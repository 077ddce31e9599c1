// sched_cases.h: the body of test_sched.c and test_cuda_sched.c: the scheduler (host/decode/sched.h) against generate() one sequence at
// a time, on random checkpoints of the tiny presets (f32 and bf16) and stories260K.
// Each model runs 24 sequences (greedy, stock sampling with metrics, entropix, logit
// bias and penalties, top-k/min-p, a stop id, the context's end; prompts within one
// chunk, across chunks, sharing whole chunks, equal ones, and short ones that decode
// long so more than 8 rows share batches), then the scheduler runs them under several
// settings:
//   - every row at once, 1, 2 and 5 rows, with and without reuse (the first model; the
//     others every row at once);
//   - a pool that holds about one sequence (a full pool queues; idle prefixes are evicted);
// and every sequence must give generate()'s tokens, records (positions, metrics bit for
// bit, quadrants, parameters, scores), statistics and a hash of every step's logits.
// Also: reuse happens where it should (whole prompts, whole chunks), a sequence that
// can never fit is refused with a message, rows never exceed --parallel, Ctrl-C ends
// everything interrupted, and the paged pool's accounting ends where it began.
// test_cuda_sched.c runs the same on the device (the emulated one in make test), where
// the pool is in device memory and each row's cache is read through its block table:
// the batched rows, one row at a time, the reused prefixes and the tiny pool must all
// give generate()'s logits (a contiguous device cache) bit for bit.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "test_models.h"
#include "host/decode/entropix.h"
#include "host/decode/sched.h"

#ifndef SCHED_TEST_DEVICE
#define SCHED_TEST_DEVICE "cpu"
#endif

static char nm[256];
#define NAME(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)

enum { N_SEQ = 24, MAX_GEN = 40, CHUNK = 16, CTX = 112 };

// The emulated device runs a smaller set: the first sequences (through the equal prompts
// 10..12, so whole-prompt reuse copies a partial block on the device), shorter.
#ifdef SCHED_TEST_SMALL
static const int n_seq = 13, gen_cap = 8;
#else
static const int n_seq = N_SEQ, gen_cap = MAX_GEN;
#endif

typedef struct {
    int n, tok[MAX_GEN + 1];
    gen_record rec[MAX_GEN + 1];
    uint64_t lhash[MAX_GEN + 1];
    int n_rec, vocab;
    gen_stats st;
    int rc, done;
    char why[512];
} outcome;

static uint64_t hash_floats(const float *x, int n) {
    uint64_t h = 1469598103934665603ull;
    const unsigned char *b = (const unsigned char *)x;
    for (size_t i = 0; i < sizeof(float) * (size_t)n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static int on_token(void *ud, int id) {
    outcome *o = ud;
    if (o->n <= MAX_GEN) o->tok[o->n++] = id;
    return 0;
}

static int on_record(void *ud, const gen_record *r) {
    outcome *o = ud;
    if (o->n_rec > MAX_GEN) return 0;
    o->rec[o->n_rec] = *r;
    o->rec[o->n_rec].logits = NULL;
    o->lhash[o->n_rec++] = r->logits ? hash_floats(r->logits, o->vocab) : 0;
    return 0;
}

static void on_done(void *ud, int rc, const gen_stats *st, const char *why) {
    outcome *o = ud;
    o->rc = rc, o->st = *st, o->done++;
    snprintf(o->why, sizeof o->why, "%s", why);
}

typedef struct {
    int prompt[CTX], n_prompt;
    gen_opts g;
} job;

// The 24 sequences: prompts from a fixed generator, sharing a 3-chunk prefix (jobs 6..9),
// equal (10, 11 are 6's prompt; 12 is 2's), a long one near the context's end (13), then
// ten short prompts that decode long, so that more than 8 rows share batches.
static void make_jobs(job *jobs, int vocab, const entropix_config *ex, logit_bias *bias) {
    static const int lens[N_SEQ] = { 1, 5, 8, 16, 17, 40, 50, 55, 60, 52, 50, 50, 8, 80, 2, 3, 1, 4, 2, 3, 2, 1, 3, 2 };
    uint64_t z = 12345;
    for (int i = 0; i < N_SEQ; i++) {
        job *j = &jobs[i];
        memset(j, 0, sizeof *j);
        j->n_prompt = lens[i];
        for (int t = 0; t < lens[i]; t++) {
            z = z * 6364136223846793005ull + 1442695040888963407ull;
            j->prompt[t] = 3 + (int)((z >> 33) % (uint64_t)(vocab - 3));
        }
        if (i >= 7 && i <= 9) memcpy(j->prompt, jobs[6].prompt, sizeof(int) * 3 * CHUNK);  // 3 whole chunks
        if (i == 10 || i == 11) memcpy(j->prompt, jobs[6].prompt, sizeof(int) * 50);
        if (i == 12) memcpy(j->prompt, jobs[2].prompt, sizeof(int) * 8);
        gen_opts *g = &j->g;
        g->max_new = i >= 13 ? MAX_GEN : 6 + (i * 7) % 20;
        if (g->max_new > gen_cap) g->max_new = gen_cap;
        g->seed = 1000 + (uint64_t)i;
        g->ex = ex;
        g->clarifier = 7;
        g->need_logits = 1;  // CUDA: the reference's records carry the step's logits too
        switch (i % 6) {
        case 0: g->sp = (sampler_params){ 0, 1, 1, 0 }; break;
        case 1: g->sp = (sampler_params){ 0.9f, 0, 0.95f, 0 }, g->want_metrics = 1; break;
        case 2: g->sampler = GEN_ENTROPIX; break;
        case 3:
            g->sp = (sampler_params){ 1.1f, 0, 1, 0 };
            g->pen = (sampler_penalties){ .repeat = 1.3f, .last_n = -1, .no_repeat_ngram = 2 };
            g->bias = bias, g->n_bias = 2;
            break;
        case 4: g->sp = (sampler_params){ 0.8f, 5, 1, 0.05f }, g->want_metrics = 1; break;
        default:  // OpenAI's penalties in a window of 8 ids
            g->sp = (sampler_params){ 1.5f, 0, 0.9f, 0 };
            g->pen = (sampler_penalties){ .repeat = 1, .presence = 0.5f, .frequency = 0.3f, .last_n = 8 };
            break;
        }
        if (i == 11) g->sp = (sampler_params){ 0.7f, 0, 1, 0 }, g->sampler = GEN_STANDARD;  // 10's prompt, another arm
    }
}

static void bind(gen_opts *g, outcome *o, int vocab) {
    memset(o, 0, sizeof *o);
    o->vocab = vocab;
    g->on_token = on_token, g->ud = o, g->on_record = on_record, g->record_ud = o;
}

// logits 0: the records' logits are not compared (without need_logits a step's logits
// reach the host only where they happen to: the first token's, after the prefill).
static int same_outcome(const outcome *a, const outcome *b, int logits, char *why, size_t len) {
    if (a->rc != b->rc) return snprintf(why, len, "rc %d, want %d (%s)", a->rc, b->rc, a->why), 0;
    if (a->n != b->n || memcmp(a->tok, b->tok, sizeof(int) * (size_t)a->n))
        return snprintf(why, len, "%d tokens, want %d (or other ids)", a->n, b->n), 0;
    if (a->n_rec != b->n_rec) return snprintf(why, len, "%d records, want %d", a->n_rec, b->n_rec), 0;
    for (int i = 0; i < a->n_rec; i++) {
        const gen_record *x = &a->rec[i], *y = &b->rec[i];
        if (x->pos != y->pos || x->token != y->token || memcmp(&x->m, &y->m, sizeof x->m) || x->q != y->q ||
            memcmp(&x->sp, &y->sp, sizeof x->sp) || x->score != y->score)
            return snprintf(why, len, "record %d differs (pos %d/%d, entropy %.17g/%.17g)", i, x->pos, y->pos,
                            x->m.entropy, y->m.entropy), 0;
        if (logits && a->lhash[i] != b->lhash[i]) return snprintf(why, len, "record %d: other logits", i), 0;
    }
    const gen_stats *s = &a->st, *t = &b->st;
    if (s->n_gen != t->n_gen || s->n_prompt != t->n_prompt || s->hit_eos != t->hit_eos || s->hit_ctx != t->hit_ctx ||
        memcmp(s->quadrant_count, t->quadrant_count, sizeof s->quadrant_count) || s->sum_entropy != t->sum_entropy ||
        s->n_metrics != t->n_metrics)
        return snprintf(why, len, "statistics differ (n_gen %d/%d, eos %d/%d, ctx %d/%d)", s->n_gen, t->n_gen, s->hit_eos,
                        t->hit_eos, s->hit_ctx, t->hit_ctx), 0;
    return 1;
}

// generate(), one sequence at a time, on a clean cache.
static int reference(session *s, job *jobs, outcome *ref, verr *err) {
    for (int i = 0; i < n_seq; i++) {
        bind(&jobs[i].g, &ref[i], s->m.cfg.vocab_size);
        kv_cache_truncate(&s->kv, 0);
        ref[i].rc = generate(s, jobs[i].prompt, jobs[i].n_prompt, &jobs[i].g, &ref[i].st, err);
        if (ref[i].rc) return -1;
        ref[i].done = 1;
    }
    return 0;
}

typedef struct {
    int parallel, no_reuse;
    long pool_tokens;
    const char *name;
    int subset;  // the device-draw jobs: no reuse counts, no logits in the records
} setting;

// Runs jobs [0, n_jobs) through a scheduler; checks each against the reference. Returns
// the rows the device drew.
static long run_setting(const char *tag, session *s, job *jobs, const outcome *ref, const setting *cfg, int n_jobs) {
    verr err = { { 0 } };
    sched_opts so = { .parallel = cfg->parallel, .pool_tokens = cfg->pool_tokens, .no_reuse = cfg->no_reuse };
    sched *q;
    if (sched_open(&q, s, &so, &err)) {
        CHECK(0, NAME("%s %s: opens", tag, cfg->name), "%s", err.msg);
        return 0;
    }
    outcome got[N_SEQ];
    int ok = 1, most = 0, steps = 0;
    for (int i = 0; i < n_jobs && ok; i++) {
        bind(&jobs[i].g, &got[i], s->m.cfg.vocab_size);
        sched_seq r = { jobs[i].prompt, jobs[i].n_prompt, &jobs[i].g, NULL, 0, on_done, &got[i] };
        if (sched_submit(q, &r, &err)) ok = 0;
    }
    CHECK(ok, NAME("%s %s: submits", tag, cfg->name), "%s", err.msg);
    while (ok && sched_pending(q) > 0 && steps < 10000) {
        if (sched_step(q, &err)) ok = 0;
        sched_stats st;
        sched_get_stats(q, &st);
        if (st.running > most) most = st.running;
        steps++;
    }
    CHECK(ok && sched_pending(q) == 0, NAME("%s %s: ends", tag, cfg->name), "%s (%d steps)", err.msg, steps);
    int want = cfg->parallel > 0 ? cfg->parallel : n_jobs;
    CHECK(most <= want, NAME("%s %s: at most %d rows", tag, cfg->name, want), "%d ran at once", most);
    sched_stats st;
    sched_get_stats(q, &st);
    if (cfg->parallel == 0 && !cfg->pool_tokens && n_jobs == N_SEQ)  // past the 8 rows of the multi-row matvec
        CHECK(st.widest > 8, NAME("%s %s: batches of more than 8 rows", tag, cfg->name), "widest %d", st.widest);
    int n_same = 0;
    char why[600] = "";
    for (int i = 0; i < n_jobs; i++) {
        char w[512];
        if (got[i].done != 1) {
            if (!why[0]) snprintf(why, sizeof why, "sequence %d ended %d times", i, got[i].done);
        } else if (!same_outcome(&got[i], &ref[i], !cfg->subset, w, sizeof w)) {
            if (!why[0]) snprintf(why, sizeof why, "sequence %d: %s", i, w);
        } else n_same++;
    }
    CHECK(n_same == n_jobs, NAME("%s %s: generate()'s tokens, records%s", tag, cfg->name, cfg->subset ? "" : " and logits"), "%d of %d differ; %s",
          n_jobs - n_same, n_jobs, why);
    sched_get_stats(q, &st);
    if (!cfg->no_reuse && !cfg->subset && st.block) {
        // whole prompts: 10, 11 (6's), 12 (2's); whole chunks: 7..9 share 3 chunks of 6's
        long least = 50 + 50 + 8 + 3 * 3 * CHUNK;
        if (!cfg->pool_tokens)
            CHECK(st.reused_tokens >= least, NAME("%s %s: reuses prompt positions", tag, cfg->name),
                  "%ld reused, want >= %ld", st.reused_tokens, least);
        else  // a pool that small hands idle prefixes out again
            CHECK(st.evictions > 0, NAME("%s %s: evicts idle prefixes", tag, cfg->name), "none evicted");
    }
    if (cfg->no_reuse) CHECK(st.reused_tokens == 0, NAME("%s %s: no reuse", tag, cfg->name), "%ld reused", st.reused_tokens);
    if (st.block) {
        // only idle prefixes and whole-prompt entries hold blocks once everything ended
        CHECK(st.running == 0 && st.queued == 0, NAME("%s %s: empty at the end", tag, cfg->name), "%d running, %d queued",
              st.running, st.queued);
    }
    sched_close(q);
    return st.device_draws;
}

// A sequence whose worst case is larger than the whole pool is refused at once.
static void test_refusals(const char *tag, session *s, job *jobs) {
    verr err = { { 0 } };
    sched_opts so = { .parallel = 2, .pool_tokens = 32 };
    sched *q;
    if (sched_open(&q, s, &so, &err)) return;
    outcome o;
    bind(&jobs[13].g, &o, s->m.cfg.vocab_size);
    sched_seq r = { jobs[13].prompt, jobs[13].n_prompt, &jobs[13].g, NULL, 0, on_done, &o };
    int rc = sched_submit(q, &r, &err);
    CHECK(rc < 0 && strstr(err.msg, "--kv-pool-mb"), NAME("%s: a sequence larger than the pool is refused", tag),
          "rc %d: %s", rc, err.msg);
    int big[CTX + 1] = { 0 };
    sched_seq r2 = { big, CTX, &jobs[0].g, NULL, 0, on_done, &o };
    rc = sched_submit(q, &r2, &err);
    CHECK(rc < 0 && strstr(err.msg, "context"), NAME("%s: a prompt as long as the context is refused", tag), "rc %d: %s",
          rc, err.msg);
    gen_opts g = jobs[2].g;
    g.branch_k = 3, g.branch_b = 4;
    sched_seq r3 = { jobs[2].prompt, jobs[2].n_prompt, &g, NULL, 0, on_done, &o };
    rc = sched_submit(q, &r3, &err);
    CHECK(rc < 0 && strstr(err.msg, "branching"), NAME("%s: LEHV branching is refused", tag), "rc %d: %s", rc, err.msg);
    sched_close(q);
}

// Ctrl-C: the running and the queued sequences all end, interrupted, at the next step.
static void test_interrupt(const char *tag, session *s, job *jobs) {
    verr err = { { 0 } };
    volatile sig_atomic_t flag = 0;
    sched_opts so = { .parallel = 3, .interrupt = &flag };
    sched *q;
    if (sched_open(&q, s, &so, &err)) return;
    outcome o[N_SEQ];
    for (int i = 0; i < n_seq; i++) {
        bind(&jobs[i].g, &o[i], s->m.cfg.vocab_size);
        sched_seq r = { jobs[i].prompt, jobs[i].n_prompt, &jobs[i].g, NULL, 0, on_done, &o[i] };
        sched_submit(q, &r, &err);
    }
    for (int k = 0; k < 3; k++) sched_step(q, &err);
    flag = 1;
    sched_step(q, &err);
    int ended = 0, interrupted = 0;
    for (int i = 0; i < n_seq; i++) ended += o[i].done == 1, interrupted += o[i].st.interrupted;
    CHECK(sched_pending(q) == 0 && ended == n_seq && interrupted > 0,
          NAME("%s: an interrupt ends every sequence", tag), "%d pending, %d ended, %d interrupted", sched_pending(q),
          ended, interrupted);
    sched_close(q);
}

// CUDA: the sequences whose draws the device can make (plain samplers on the raw logits,
// nothing reading them on the host) draw there, row by row over each batch
// (session_forward_batch_draw), and still give generate()'s tokens and records.
static void test_device_draws(const char *tag, session *s, const job *all) {
    static job jobs[N_SEQ];
    static outcome ref[N_SEQ];
    int n = 0;
    verr err = { { 0 } };
    for (int i = 0; i < n_seq; i++) {
        const gen_opts *g = &all[i].g;
        if (g->sampler == GEN_ENTROPIX || g->n_bias > 0 || sampler_penalties_active(&g->pen)) continue;
        jobs[n] = all[i];
        jobs[n].g.need_logits = 0;
        bind(&jobs[n].g, &ref[n], s->m.cfg.vocab_size);
        kv_cache_truncate(&s->kv, 0);
        if (generate(s, jobs[n].prompt, jobs[n].n_prompt, &jobs[n].g, &ref[n].st, &err)) {
            CHECK(0, NAME("%s device draws: reference", tag), "%s", err.msg);
            return;
        }
        ref[n++].done = 1;
    }
    setting all_rows = { 0, 0, 0, "device draws", 1 };
    long drawn = run_setting(tag, s, jobs, ref, &all_rows, n);
    CHECK(drawn > 0, NAME("%s device draws: rows drawn on the device", tag), "%ld of the batches' rows", drawn);
}

static void test_model(const char *tag, const char *dir, const char *device, int first) {
    session s;
    verr err = { { 0 } };
    session_opts so = { .model_dir = dir, .ctx = CTX, .max_batch = CHUNK, .device = device };
    if (session_open(&s, &so, &err)) {
        CHECK(0, NAME("%s opens", tag), "%s", err.msg);
        return;
    }
    entropix_config ex;
    if (entropix_profile("seed", &ex, &err)) {
        CHECK(0, NAME("%s: profile", tag), "%s", err.msg);
        session_close(&s);
        return;
    }
    int vocab = s.m.cfg.vocab_size;
    logit_bias bias[2] = { { 5, 2.5f }, { 9, -1.0f } };
    job jobs[N_SEQ];
    outcome ref[N_SEQ];
    make_jobs(jobs, vocab, &ex, bias);
    // a stop id the first greedy sequence reaches, so some sequences end on it
    bind(&jobs[0].g, &ref[0], vocab);
    kv_cache_truncate(&s.kv, 0);
    if (generate(&s, jobs[0].prompt, jobs[0].n_prompt, &jobs[0].g, &ref[0].st, &err)) {
        CHECK(0, NAME("%s: reference", tag), "%s", err.msg);
        session_close(&s);
        return;
    }
    if (ref[0].n > 3) session_add_stop(&s, ref[0].tok[3]);
    if (reference(&s, jobs, ref, &err)) {
        CHECK(0, NAME("%s: reference with a stop id", tag), "%s", err.msg);
        session_close(&s);
        return;
    }
    int eos = 0, ctx_end = 0;
    for (int i = 0; i < n_seq; i++) eos += ref[i].st.hit_eos, ctx_end += ref[i].st.hit_ctx;
    printf("note: %s: %d sequences end on a stop id, %d at the context's end\n", tag, eos, ctx_end);
    // The tiny pool: about one worst case (job 13: 80 + 40 > 112 positions) and 3 blocks.
    setting settings[] = {
        { 0, 0, 0, "all rows", 0 }, { 1, 0, 0, "1 row", 0 },        { 2, 0, 0, "2 rows", 0 },
        { 5, 1, 0, "5 rows, no reuse", 0 }, { 0, 0, CTX + 48, "tiny pool", 0 },
    };
    for (size_t k = 0; k < sizeof settings / sizeof *settings; k++) {
        if (s.cu && (settings[k].no_reuse || settings[k].parallel == 2))
            continue;  // the emulator is slow: what the CPU covers alike
        // The row settings do not depend on the architecture: the first model runs them
        // all, the others every row at once and the tiny pool (CI runs this under ASan too).
        if (!first && settings[k].parallel != 0) continue;
        run_setting(tag, &s, jobs, ref, &settings[k], n_seq);
    }
    if (s.cu) test_device_draws(tag, &s, jobs);
    test_refusals(tag, &s, jobs);
    test_interrupt(tag, &s, jobs);
    session_close(&s);
}

int main(void) {
    const char *device = SCHED_TEST_DEVICE;
#ifdef SCHED_TEST_NEEDS_DEVICE
    if (!SCHED_TEST_NEEDS_DEVICE()) {
        SKIP("sched on the device", "no CUDA device");
        return 0;
    }
#endif
    char workdir[512];
    snprintf(workdir, sizeof workdir, "%s/sched-XXXXXX", env_or("TESTTMP", "tests/tmp"));
    if (!mkdtemp(workdir)) {
        CHECK(0, "work directory", "mkdtemp %s failed", workdir);
        CHECK_DONE();
    }
    // bf16 weights (the even/odd matvec rows) on Llama and Qwen2 (biases), f32 on Qwen3 (QK norms)
    const char *presets[] = { "llama3-tiny", "qwen3-tiny", "qwen2-tiny" }, *dtypes[] = { "bf16", "f32", "bf16" };
#ifdef SCHED_TEST_SMALL
    const int n_models = 1;
#else
    const int n_models = 3;
#endif
    for (int p = 0; p < n_models; p++) {
        char dir[600], tag[96];
        snprintf(tag, sizeof tag, "%s %s %s", device, presets[p], dtypes[p]);
        if (gen_random_model(workdir, presets[p], dtypes[p], 7, dir, sizeof dir)) {
            CHECK(0, NAME("%s: gen_random_checkpoint.py", tag), "failed (PYTHON=%s)", env_or("PYTHON", "python3"));
            continue;
        }
        test_model(tag, dir, device, p == 0);
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", workdir);
    if (system(cmd) != 0) printf("note: could not remove %s\n", workdir);
    CHECK_DONE();
}
