// test_cuda_loop.c: the device decode loop (model/cuda/loop.c, host/decode/devloop.c)
// against generate()'s per-token loop, its reference (the same device steps, one host
// round trip each). Per model (llama3-tiny and qwen3-tiny in bf16, stories260K), three sessions on
// one set of weights: the per-token loop (--lookahead 0), the device loop on the graph
// path and on the persistent kernel (--lookahead 8):
//   - 32 greedy and 32 sampled tokens (metrics on): tokens, records (position, metrics,
//     quadrant, parameters) and statistics equal bit for bit, and the cache as long;
//   - host syncs over the 32-token run are pinned: the prompt's wait, then one wait per
//     4 tokens (half the look-ahead) for the 31 loop tokens: 1 + 8 = 9 (SYNCS);
//   - on llama3-tiny also: a stop id and a stop callback (what a stop
//     string does) inside the look-ahead: the same output and cache length, steps past
//     the stop discarded, and a following turn in the same session gives the per-token
//     loop's tokens and records; penalties make a run take the per-token loop, with the
//     reason in gen_stats.
// Planted once each (and caught): the cache not truncated at the end of a loop (the stop
// checks' cache lengths), the position not advanced by cuda_loop_advance (the twins'
// check and every token comparison).
// And the loop's bookkeeping kernels against their CPU twins (poisoned rings, odd depths).
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "host/decode/generate.h"
#include "host/runtime/session.h"
#include "host/runtime/session_cuda.h"
#include "model/forward_cuda.h"
#include "test_models.h"
#ifdef VARENT_CUDA
#include "kernels/ops_cuda.h"
#endif

static char nm[256];
#define NAME(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)

#ifndef VARENT_CUDA
int main(void) {
    SKIP("cuda_loop", "built without CUDA");
    CHECK_DONE();
}
#else

#define STEPS 32  // 8 look-ahead windows (depth 8, a wait per 4); 64 cost CI twice the time
#define SYNCS (1 + (STEPS - 1 + 3) / 4)
#define MAXT 160

// What one generate() run gave.
typedef struct {
    int rc;
    char msg[1024];
    gen_stats st;
    long syncs;
    int kv_len;
    int n_tok, n_rec, stop_at;  // stop_at > 0: on_token stops at that token (a stop string)
    int tok[MAXT];
    gen_record rec[MAXT];
} outcome;

static int on_token(void *ud, int id) {
    outcome *o = ud;
    if (o->n_tok < MAXT) o->tok[o->n_tok] = id;
    o->n_tok++;
    return o->stop_at > 0 && o->n_tok == o->stop_at;
}

static int on_record(void *ud, const gen_record *r) {
    outcome *o = ud;
    if (o->n_rec < MAXT) {
        o->rec[o->n_rec] = *r;
        o->rec[o->n_rec].logits = NULL;
    }
    o->n_rec++;
    return 0;
}

// generate() on s with look-ahead la from the cache as it is (fresh: keep 0).
static void run(session *s, int la, int fresh, const int *prompt, int n, const gen_opts *base, int stop_at,
                outcome *out) {
    memset(out, 0, sizeof *out);
    if (fresh) s->kv.len = 0;
    s->lookahead = la;
    gen_opts o = *base;
    o.on_token = on_token, o.ud = out, o.on_record = on_record, o.record_ud = out, o.record_stop = 1;
    out->stop_at = stop_at;
    cuda_step_counts c0, c1;
    session_cuda_counts(s, &c0);
    verr err = { { 0 } };
    out->rc = generate(s, prompt, n, &o, &out->st, &err);
    session_cuda_counts(s, &c1);
    snprintf(out->msg, sizeof out->msg, "%s", err.msg);
    out->syncs = c1.syncs - c0.syncs;
    out->kv_len = s->kv.len;
}

// Where a and b differ ("" when they do not).
static const char *differ(const outcome *a, const outcome *b) {
    static char why[256];
    why[0] = 0;
    if (a->rc || b->rc) snprintf(why, sizeof why, "rc %d/%d: %.100s / %.100s", a->rc, b->rc, a->msg, b->msg);
    else if (a->n_tok != b->n_tok || a->n_rec != b->n_rec)
        snprintf(why, sizeof why, "%d/%d tokens, %d/%d records", a->n_tok, b->n_tok, a->n_rec, b->n_rec);
    else if (a->kv_len != b->kv_len) snprintf(why, sizeof why, "cache %d/%d", a->kv_len, b->kv_len);
    else if (a->st.n_gen != b->st.n_gen || a->st.hit_eos != b->st.hit_eos || a->st.hit_ctx != b->st.hit_ctx ||
             memcmp(a->st.quadrant_count, b->st.quadrant_count, sizeof a->st.quadrant_count) ||
             a->st.sum_entropy != b->st.sum_entropy)
        snprintf(why, sizeof why, "statistics: n_gen %d/%d, eos %d/%d", a->st.n_gen, b->st.n_gen, a->st.hit_eos,
                 b->st.hit_eos);
    for (int i = 0; !why[0] && i < a->n_tok && i < MAXT; i++)
        if (a->tok[i] != b->tok[i]) snprintf(why, sizeof why, "token %d: %d/%d", i, a->tok[i], b->tok[i]);
    for (int i = 0; !why[0] && i < a->n_rec && i < MAXT; i++) {
        const gen_record *x = &a->rec[i], *y = &b->rec[i];
        if (x->pos != y->pos || x->token != y->token || x->q != y->q || memcmp(&x->m, &y->m, sizeof x->m) ||
            memcmp(&x->sp, &y->sp, sizeof x->sp) || x->score != y->score)
            snprintf(why, sizeof why, "record %d: pos %d/%d token %d/%d entropy %g/%g", i, x->pos, y->pos, x->token,
                     y->token, x->m.entropy, y->m.entropy);
    }
    return why;
}

typedef struct {
    session s[3];  // the per-token loop, the device loop (graph path), the device loop (persistent)
    int open;
} trio;

static const char *const KIND[3] = { "per-token", "device loop (graph)", "device loop (persistent)" };

static void trio_close(trio *t) {
    for (int i = t->open - 1; i >= 0; i--) session_close(&t->s[i]);
}

static int trio_open(trio *t, const char *dir, verr *err) {
    memset(t, 0, sizeof *t);
    session_opts o = { .model_dir = dir, .device = "cuda", .ctx = 192 };
    if (session_open(&t->s[0], &o, err)) return -1;
    t->open = 1;
    for (; t->open < 3; t->open++)
        if (session_open_shared(&t->s[t->open], &t->s[0], 0, err)) return -1;
    cuda_forward_set_decode_kernel(t->s[2].cu, 1, 3);
    return 0;
}

// The three sessions on one scenario: the per-token loop's outcome in out[0].
static void three(trio *t, int fresh, const int *prompt, int n, const gen_opts *o, int stop_at, outcome *out) {
    for (int i = 0; i < 3; i++) run(&t->s[i], i ? 8 : 0, fresh, prompt, n, o, stop_at, &out[i]);
}

static void check_same(const char *mname, const char *what, const outcome *out) {
    for (int i = 1; i < 3; i++) {
        const char *why = differ(&out[0], &out[i]);
        CHECK(!why[0] && !out[i].st.loop_why && out[0].st.loop_why,
              NAME("cuda_loop %s: %s, %s == the per-token loop (tokens, records, cache)", mname, what, KIND[i]),
              "%s%s", why, out[i].st.loop_why ? out[i].st.loop_why : "");
    }
}

// The first generated token (index >= 5) that did not come before: a stop id there.
static int first_new(const outcome *o, int *at) {
    for (int i = 5; i < o->n_tok && i < MAXT; i++) {
        int seen = 0;
        for (int j = 0; j < i; j++) seen |= o->tok[j] == o->tok[i];
        if (!seen) return *at = i, o->tok[i];
    }
    return -1;
}

// full 0: the STEPS greedy and sampled tokens only.
static void run_model(const char *dir, const char *mname, int full) {
    trio t;
    verr err = { { 0 } };
    if (trio_open(&t, dir, &err)) {
        CHECK(0, NAME("cuda_loop %s: open", mname), "%s", err.msg);
        trio_close(&t);
        return;
    }
    static outcome out[3], next[3];
    entropix_config ex;
    entropix_profile("seed", &ex, &err);
    int prompt[6] = { 1, 403, 407, 261, 378, 22 }, prompt2[3] = { 13, 287, 99 };
    gen_opts g = { .max_new = STEPS, .sp = { 0, 0, 1, 0 }, .seed = 5, .ex = &ex, .want_metrics = 1, .ignore_eos = 1 };
    three(&t, 1, prompt, 6, &g, 0, out);
    check_same(mname, "the greedy tokens", out);
    for (int i = 1; i < 3; i++)
        CHECK(out[i].syncs == SYNCS && out[i].st.loop_steps == STEPS - 1 && out[i].st.loop_discarded == 0,
              NAME("cuda_loop %s: %s, %d greedy tokens in %d host syncs (the prompt's, then 1 per 4 tokens)", mname,
                   KIND[i], STEPS, SYNCS),
              "%ld syncs (per-token loop: %ld), %d steps, %d discarded", out[i].syncs, out[0].syncs,
              out[i].st.loop_steps, out[i].st.loop_discarded);
    gen_opts sm = g;
    sm.sp = (sampler_params){ 0.9f, 40, 0.95f, 0.02f };
    three(&t, 1, prompt, 6, &sm, 0, out);
    check_same(mname, "the sampled tokens", out);
    CHECK(out[1].syncs == SYNCS, NAME("cuda_loop %s: %d sampled tokens in %d host syncs", mname, STEPS, SYNCS), "%ld",
          out[1].syncs);
    int at = -1, stop = first_new(&out[0], &at);
    if (!full) {
        trio_close(&t);
        return;
    }

    // a stop callback (a stop string's end) inside the look-ahead, then a following turn
    three(&t, 1, prompt, 6, &sm, 13, out);
    check_same(mname, "a stop callback at token 13", out);
    CHECK(out[1].st.loop_discarded > 0, NAME("cuda_loop %s: the stop callback's overshoot is discarded", mname),
          "%d steps discarded", out[1].st.loop_discarded);
    three(&t, 0, prompt2, 3, &sm, 0, next);
    check_same(mname, "the turn after a stop callback", next);

    gen_opts pen = sm;  // penalties read a host copy of the logits: the per-token loop
    pen.pen.repeat = 1.3f, pen.pen.last_n = -1;
    pen.max_new = 8;
    run(&t.s[1], 8, 1, prompt, 6, &pen, 0, &out[1]);
    CHECK(out[1].rc == 0 && out[1].st.loop_why && strstr(out[1].st.loop_why, "penalties"),
          NAME("cuda_loop %s: penalties take the per-token loop, with the reason", mname), "rc %d, why '%s'",
          out[1].rc, out[1].st.loop_why ? out[1].st.loop_why : "(none)");

    // a stop id inside the look-ahead (sampled: the greedy tokens of a random model cycle
    // soon), then a following turn
    if (stop < 0) SKIP(NAME("cuda_loop %s: stop id", mname), "no new token after index 5");
    for (int i = 0; stop >= 0 && i < 3; i++) session_add_stop(&t.s[i], stop);
    if (stop >= 0) {
        sm.ignore_eos = 0;
        three(&t, 1, prompt, 6, &sm, 0, out);
        check_same(mname, "a stop id inside the look-ahead", out);
        CHECK(out[0].st.hit_eos && out[0].st.n_gen == at && out[1].st.loop_discarded > 0,
              NAME("cuda_loop %s: the stop id ends at token %d, the overshoot discarded", mname, at),
              "eos %d, %d tokens, %d discarded", out[0].st.hit_eos, out[0].st.n_gen, out[1].st.loop_discarded);
        three(&t, 0, prompt2, 3, &sm, 0, next);
        check_same(mname, "the turn after a stop id", next);
    }
    trio_close(&t);
}

// ---- the bookkeeping kernels against their CPU twins ----
static void kernels(void) {
    cuda_ctx C;
    verr e;
    if (cuda_init(&C, 0, &e)) {
        CHECK(0, "cuda_loop kernels: cuda_init", "%s", e.msg);
        return;
    }
    for (int tail = 0; tail < 2; tail++) {
        const int depth = 3 + 2 * tail, steps = 7;
        loop_state hs = { 0, depth, tail, 0 }, *ds = NULL;
        loop_entry href[8], *dring = NULL, got[8];
        sample_out hd = { 0 }, *dd = NULL;
        float stats[8] = { 1.5f, -2.f, 0.25f, 3.f, 7.f, 8.f, 9.f, 10.f }, *dst = NULL;
        int lens[2] = { 10, 12 }, ids = 4, pos = 11, rows = 3, *dp = NULL;
        cuda_kv_lens *dl = NULL;
        sample_cfg cfgs[8], pick, *dcfgs = NULL, *dpick = NULL, gpick;
        for (int i = 0; i < 8; i++) cfgs[i] = (sample_cfg){ 0.5f + i, i, 0.9f, 0.01f * i, 0.125 * i };
        memset(href, 0xFF, sizeof href);
        int rc = cuda_malloc((void **)&ds, sizeof hs, "t", &e) || cuda_malloc((void **)&dring, sizeof href, "t", &e) ||
                 cuda_malloc((void **)&dd, sizeof hd, "t", &e) || cuda_malloc((void **)&dst, sizeof stats, "t", &e) ||
                 cuda_malloc((void **)&dl, sizeof *dl, "t", &e) || cuda_malloc((void **)&dp, 3 * sizeof(int), "t", &e) ||
                 cuda_malloc((void **)&dcfgs, sizeof cfgs, "t", &e) || cuda_malloc((void **)&dpick, sizeof pick, "t", &e);
        cuda_kv_lens hl = { lens[0], lens[1], NULL, 0 };
        int hp[3] = { ids, pos, rows };
        rc = rc || cuda_upload(&C, ds, &hs, sizeof hs) || cuda_memset(&C, dring, 0xFF, sizeof href) ||
             cuda_upload(&C, dst, stats, sizeof stats) || cuda_upload(&C, dl, &hl, sizeof hl) ||
             cuda_upload(&C, dp, hp, sizeof hp) || cuda_upload(&C, dcfgs, cfgs, sizeof cfgs);
        int bad_pick = 0;
        for (int s = 0; rc == 0 && s < steps; s++) {
            hd = (sample_out){ 100 + 7 * s, 1, 0.5f * s - 1.f, 0.f, 0.0 };
            rc = cuda_upload(&C, dd, &hd, sizeof hd) || cuda_loop_pick(&C, dpick, dcfgs, ds) ||
                 cuda_download(&C, &gpick, dpick, sizeof gpick);
            cpu_loop_pick(&pick, cfgs, &hs);
            bad_pick += memcmp(&pick, &gpick, sizeof pick) != 0;
            // odd steps without statistics (no capture layer)
            const float *v = s & 1 ? NULL : dst, *a = s & 1 ? NULL : dst + 4;
            rc = rc || cuda_loop_advance(&C, ds, dring, dd, v, a, dl, dp, dp + 1, dp + 2);
            cpu_loop_advance(&hs, href, &hd, s & 1 ? NULL : stats, s & 1 ? NULL : stats + 4, lens, &ids, &pos, &rows);
        }
        loop_state gs;
        rc = rc || cuda_download(&C, got, dring, sizeof got) || cuda_download(&C, &gs, ds, sizeof gs) ||
             cuda_download(&C, &hl, dl, sizeof hl) || cuda_download(&C, hp, dp, sizeof hp);
        CHECK(rc == 0 && !memcmp(got, href, sizeof(loop_entry) * depth) && !memcmp(&gs, &hs, sizeof gs) &&
                  hl.n_trunk == lens[0] && hl.n_keys == lens[1] && hp[0] == ids && hp[1] == pos && hp[2] == rows &&
                  !bad_pick,
              NAME("cuda_loop kernels: %d steps on a ring of %d%s == the CPU twins", steps, depth,
                   tail ? " (a tail view)" : ""),
              "rc %d (%s), step %d/%d, lens %d,%d/%d,%d, ids %d/%d pos %d/%d, %d picks differ", rc, C.err.msg,
              gs.step, hs.step, hl.n_trunk, hl.n_keys, lens[0], lens[1], hp[0], ids, hp[1], pos, bad_pick);
        cuda_free(ds), cuda_free(dring), cuda_free(dd), cuda_free(dst), cuda_free(dl), cuda_free(dp);
        cuda_free(dcfgs), cuda_free(dpick);
    }
    cuda_destroy(&C);
}

// argv[1]: only the models whose name contains it ("kernels": only the kernels).
int main(int argc, char **argv) {
    const char *only = argc > 1 ? argv[1] : "";
    if (cuda_device_count() == 0) {
        SKIP("cuda_loop", "no CUDA device");
        CHECK_DONE();
    }
    kernels();
    char work[512], dir[600];
    snprintf(work, sizeof work, "%s/cuda_loop", env_or("TESTTMP", "tests/tmp"));
    mkdir(work, 0755);
    // The loop's bookkeeping does not depend on the architecture: llama3-tiny takes every
    // check, qwen3-tiny (q/k norms) and stories260K (llama2.c) the 32 greedy and sampled
    // tokens; qwen2-tiny's forward is test_cuda_forward's and test_cuda_persist's (the
    // emulated CI time is the limit here).
    static const char *const presets[] = { "llama3-tiny", "qwen3-tiny" };
    int asan = test_under_asan();  // under ASan llama3-tiny only: it takes every check
    if (asan) printf("NOTE cuda_loop: under ASan llama3-tiny only (make test runs all 3 models)\n");
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        if (!strstr(presets[i], only) || (asan && i > 0)) continue;
        if (gen_random_model(work, presets[i], "bf16", 13, dir, sizeof dir)) {
            CHECK(0, NAME("cuda_loop %s: checkpoint", presets[i]), "tools/gen_random_checkpoint.py failed");
            continue;
        }
        run_model(dir, presets[i], i == 0);
    }
    if (!strstr("stories260K", only) || asan) CHECK_DONE();
    if (stories_bf16_dir(dir, sizeof dir) == 0) run_model(dir, "stories260K", 0);  // the stops: llama3-tiny
    else SKIP("cuda_loop stories260K", "could not convert tests/data/stories260K (python3 and varent needed)");
    CHECK_DONE();
}
#endif
