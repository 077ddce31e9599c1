// test_cuda_persist.c: the persistent decode kernel (kernels/cuda/persist.cu, the
// device forward's model/cuda/persist.c) against the graph path and the CPU forward,
// its twin. Per model (the tiny presets of tools/gen_random_checkpoint.py, bf16, which
// between them take every kernel the persistent one runs: the generic and the tiled
// attention split, head_dim 16 to 128, the vector and the scalar matvec, the SwiGLU pair
// and its scalar form, biases, q/k norms, tied and untied heads; and stories260K):
//   - a prompt, then 64 greedy steps, each drawn on the device from an armed draw: the
//     persistent session's tokens equal the graph session's and its logits are the same
//     bits at every step; both within the bf16 cache's tolerance of the CPU forward fed
//     the same tokens;
//   - each plain greedy step is one launch (the kernel: its argmax is the armed draw)
//     and takes no extra host wait;
//   - the grid changes half-way (and is 1 block for one model), and the weight ring
//     shrinks from as large as fits (whole rows) to 8 chunks a warp (rows partly from
//     it), and the staged one-row units of 2048+ inputs go 8 chunks a lane deep
//     (llama-wide-tiny's down rows: the graph session stays at 4, the same bits); in each half, the phases' inputs are staged in shared memory a block at a
//     time (the ring filled a unit ahead, and in the second half also for a warp's
//     first unit only), then read through L2 by every warp: the bits do not move;
//   - the four-blocks-an-SM instance, whose tiled attention stages its key tiles in
//     shared memory (cp.async, two commit groups a tile), over splits of several
//     tiles: the same bits (the head_dim 64 and 128 presets);
//   - with a capture layer the device statistics equal the graph path's;
//   - a step with forward hooks takes the graph path, counted with its reason, and a
//     batch likewise;
//   - the phase trace: a TSV of every phase of every block, stamped in order, with the
//     same bits; none without a path; an unwritable path refused when set.
// On the emulated device the blocks run co-resident as fibers (docs/cuda.md), so a
// missing or early counter wait shows as wrong bits here or as a reported deadlock.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "host/runtime/session.h"
#include "model/forward_cuda.h"
#include "cuda_steps.h"
#include "test_models.h"
#ifdef VARENT_CUDA
#include "kernels/ops_cuda.h"
#endif

static char nm[256];
#define NAME(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)

#ifndef VARENT_CUDA
int main(void) {
    SKIP("cuda_persist", "built without CUDA");
    CHECK_DONE();
}
#else

#define STEPS 64
#define RING_SMALL 512  // the weight ring of the second half: 8 chunks a warp

typedef struct {
    session cpu, g, p;  // the CPU reference, the graph path, the persistent kernel (g's weights)
    kv_view kc, kg, kp;
    int open;           // sessions opened (for the close)
} trio;

static void trio_close(trio *t) {
    if (t->open >= 3) session_close(&t->p);
    if (t->open >= 2) session_close(&t->g);
    if (t->open >= 1) session_close(&t->cpu);
}

static int trio_open(trio *t, const char *dir, int grid, verr *err) {
    memset(t, 0, sizeof *t);
    session_opts oc = { .model_dir = dir, .device = "cpu", .ctx = 128 }, og = oc;
    og.device = "cuda";
    if (session_open(&t->cpu, &oc, err)) return -1;
    t->open = 1;
    if (session_open(&t->g, &og, err)) return -1;
    t->open = 2;
    if (session_open_shared(&t->p, &t->g, 0, err)) return -1;
    t->open = 3;
    cuda_forward_set_decode_kernel(t->p.cu, 1, grid);
    t->kc = kv_view_of(&t->cpu.kv), t->kg = kv_view_of(&t->g.kv), t->kp = kv_view_of(&t->p.kv);
    return 0;
}

// trio_open, or a failed check with the trio closed (-1).
static int trio_start(trio *t, const char *dir, const char *name, int grid, verr *err) {
    if (trio_open(t, dir, grid, err) == 0) return 0;
    CHECK(0, NAME("cuda_persist %s: open", name), "%s", err->msg);
    trio_close(t);
    return -1;
}

// The prompt but its last token (which the first step feeds) into the three sessions.
static int trio_prompt(trio *t, const int *prompt, int n_prompt, verr *err) {
    return session_forward(&t->cpu, &t->kc, prompt, n_prompt - 1, err) ||
           session_forward(&t->g, &t->kg, prompt, n_prompt - 1, err) ||
           session_forward(&t->p, &t->kp, prompt, n_prompt - 1, err);
}

// max |a - b| / max |b| over n logits.
static double rel_err(const float *a, const float *b, int n) {
    double d = 0, r = 0;
    for (int i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        if (!(e <= d)) d = e;  // NaN sticks
        if (fabs((double)b[i]) > r) r = fabs((double)b[i]);
    }
    return r > 0 ? d / r : d;
}

typedef struct {
    int steps, bad_tok, bad_bits, one_launch, extra_syncs, bad_stats;
    int first_bad;  // the first step whose launches or waits were off (-1: none)
    double worst_cpu;
} tally;

// Step j of the run: the three sessions fed token tok; the next token in *next.
static int step(trio *t, int j, int tok, int *next, tally *y, verr *err) {
    int V = t->g.m.cfg.vocab_size, ng = 0, np = 0, cap = j >= 10 && j < 14 ? t->g.m.cfg.n_layers - 1 : -1;
    t->g.fw.attn_layer = t->p.fw.attn_layer = cap;
    cuda_step_counts c0, c1;
    cuda_forward_counts(t->p.cu, &c0);
    if (greedy_step(&t->g, &t->kg, tok, &ng, err) || greedy_step(&t->p, &t->kp, tok, &np, err) ||
        session_forward(&t->cpu, &t->kc, &tok, 1, err))
        return -1;
    cuda_forward_counts(t->p.cu, &c1);
    y->steps++;
    y->bad_tok += ng != np;
    y->bad_bits += memcmp(t->g.fw.logits, t->p.fw.logits, sizeof(float) * (size_t)V) != 0;
    int one = c1.persistent && (cap >= 0 || c1.launches == 1), syncs = c1.syncs - c0.syncs != 1;
    y->one_launch += one;
    y->extra_syncs += syncs;  // the step's one wait (the draw came back with it)
    if ((!one || syncs) && y->first_bad < 0) y->first_bad = j;
    if (cap >= 0)
        y->bad_stats += memcmp(t->g.fw.logit_stats, t->p.fw.logit_stats, sizeof t->g.fw.logit_stats) != 0 ||
                        memcmp(t->g.fw.attn_stats, t->p.fw.attn_stats, sizeof t->g.fw.attn_stats) != 0 ||
                        t->g.fw.attn_keys != t->p.fw.attn_keys;
    double e = rel_err(t->p.fw.logits, t->cpu.fw.logits, V);
    if (!(e <= y->worst_cpu)) y->worst_cpu = e;
    *next = ng;
    return 0;
}

// A forward hook (an activation capture) on the persistent session: that step takes the
// graph path, counted with its reason, and its logits are the graph session's.
static void check_fallbacks(trio *t, const char *name, int tok) {
    verr err = { { 0 } };
    int L = t->g.m.cfg.n_layers, calls = 0, V = t->g.m.cfg.vocab_size;
    unsigned char *layers = calloc((size_t)L, 1);
    layers[0] = 1;
    forward_hooks h;
    memset(&h, 0, sizeof h);
    h.act_layers = layers, h.points = 1u << HOOK_RESID_PRE, h.on_act = count_act, h.ud = &calls;
    cuda_step_counts c0, c1;
    cuda_forward_counts(t->p.cu, &c0);
    t->p.fw.hooks = &h;
    int rc = session_forward(&t->g, &t->kg, &tok, 1, &err) || session_forward(&t->p, &t->kp, &tok, 1, &err);
    t->p.fw.hooks = NULL;
    cuda_forward_counts(t->p.cu, &c1);
    CHECK(rc == 0 && calls == 1 && c1.persist_fallbacks == c0.persist_fallbacks + 1 && !c1.persistent &&
              c1.fallback_why && strstr(c1.fallback_why, "forward hooks") &&
              !memcmp(t->g.fw.logits, t->p.fw.logits, sizeof(float) * (size_t)V),
          NAME("cuda_persist %s: a step with hooks takes the graph path, counted", name),
          "rc %d (%s), %d hook calls, fallbacks %ld -> %ld, why '%s'", rc, err.msg, calls, c0.persist_fallbacks,
          c1.persist_fallbacks, c1.fallback_why ? c1.fallback_why : "");
    free(layers);
    // a batch of rows: the graph path, counted
    float *logits = malloc(sizeof(float) * (size_t)V);
    cuda_forward_counts(t->p.cu, &c0);
    rc = cuda_forward_batch(t->p.cu, &t->p.fw, &t->kp, &tok, 1, logits, NULL, &err);
    cuda_forward_counts(t->p.cu, &c1);
    CHECK(rc == 0 && c1.persist_fallbacks == c0.persist_fallbacks + 1 && c1.fallback_why &&
              strstr(c1.fallback_why, "batch"),
          NAME("cuda_persist %s: a batch takes the graph path, counted", name), "rc %d (%s), why '%s'", rc, err.msg,
          c1.fallback_why ? c1.fallback_why : "");
    free(logits);
}

// The phase trace (model/cuda/persist_trace.c): rows of one traced step.
typedef struct {
    int grid, layers, phases, rows, bad_order, bad_kind, waited;
    char why[160];
} trace_read;

// Reads the TSV at path: its header, then every row in (phase, block) order, each with
// entry <= wait <= exit (wait -1: none) and a block's phases one after the other.
static void read_trace(const char *path, trace_read *r) {
    static const char *kinds[5] = { "qkv", "attention", "o", "gate_up", "down" };
    memset(r, 0, sizeof *r);
    FILE *fp = fopen(path, "r");
    if (!fp) {
        snprintf(r->why, sizeof r->why, "cannot open %.120s", path);
        return;
    }
    char line[256];
    if (!fgets(line, sizeof line, fp) ||
        sscanf(line, "# varent persist-trace 1: grid %d, layers %d, phases %d", &r->grid, &r->layers, &r->phases) != 3 ||
        !fgets(line, sizeof line, fp)) {
        snprintf(r->why, sizeof r->why, "no header");
        fclose(fp);
        return;
    }
    long long *last_exit = calloc((size_t)(r->grid > 0 ? r->grid : 1), sizeof *last_exit);
    int ph, layer, b;
    long long e, w, x;
    char kind[32];
    while (fgets(line, sizeof line, fp) &&
           sscanf(line, "%d\t%d\t%31s\t%d\t%lld\t%lld\t%lld", &ph, &layer, kind, &b, &e, &w, &x) == 7) {
        int want_ph = r->rows / (r->grid > 0 ? r->grid : 1), want_b = r->rows % (r->grid > 0 ? r->grid : 1);
        const char *want = ph == 0 ? "embed" : ph == r->phases - 1 ? "lm_head" : kinds[(ph - 1) % 5];
        r->bad_kind += ph != want_ph || b != want_b || strcmp(kind, want) != 0 ||
                       layer != (ph == 0 || ph == r->phases - 1 ? -1 : (ph - 1) / 5);
        r->bad_order += e > x || (w >= 0 && (w < e || w > x)) || (ph > 0 && e < last_exit[b]);
        r->waited += w >= 0;
        last_exit[b] = x;
        r->rows++;
    }
    free(last_exit);
    fclose(fp);
}

// With a trace path set, two greedy steps: the graph path's bits still, and a TSV of
// every phase of every block; with none, no file; a path that cannot be written is an
// error when it is set.
static void check_trace(trio *t, const char *name, int *tok_io) {
    verr err = { { 0 } };
    char path[600];
    snprintf(path, sizeof path, "%s/cuda_persist/trace-%s.tsv", env_or("TESTTMP", "tests/tmp"), name);
    int V = t->g.m.cfg.vocab_size, L = t->g.m.cfg.n_layers, bad = 0, rc, ng = 0, np = 0, tok = *tok_io;
    cuda_forward_set_decode_kernel(t->p.cu, 1, 3);
    rc = cuda_forward_set_persist_trace(t->p.cu, path, &err);
    for (int j = 0; rc == 0 && j < 2; j++) {
        rc = greedy_step(&t->g, &t->kg, tok, &ng, &err) || greedy_step(&t->p, &t->kp, tok, &np, &err);
        bad += rc == 0 && (ng != np || memcmp(t->g.fw.logits, t->p.fw.logits, sizeof(float) * (size_t)V));
        tok = ng;
    }
    trace_read r;
    read_trace(path, &r);
    CHECK(rc == 0 && bad == 0 && r.grid == 3 && r.layers == L && r.phases == 5 * L + 2 && r.rows == 3 * r.phases &&
              r.bad_kind == 0 && r.bad_order == 0 && r.waited >= 5 * L,
          NAME("cuda_persist %s: the phase trace: every phase of every block stamped in order, the same bits", name),
          "rc %d (%s), %d steps differ; grid %d, layers %d, phases %d, %d rows (%d misplaced, %d out of order, %d "
          "waited) %s", rc, err.msg, bad, r.grid, r.layers, r.phases, r.rows, r.bad_kind, r.bad_order, r.waited,
          r.why);
    remove(path);
    rc = cuda_forward_set_persist_trace(t->p.cu, NULL, &err) || greedy_step(&t->g, &t->kg, tok, &ng, &err) ||
         greedy_step(&t->p, &t->kp, tok, &np, &err);
    FILE *fp = fopen(path, "r");
    CHECK(rc == 0 && !fp && ng == np, NAME("cuda_persist %s: no trace without a path", name), "rc %d (%s), file %s",
          rc, err.msg, fp ? "written" : "absent");
    if (fp) fclose(fp);
    *tok_io = ng;
    snprintf(path, sizeof path, "%s/no-such-dir/trace.tsv", env_or("TESTTMP", "tests/tmp"));
    verr e2 = { { 0 } };
    rc = cuda_forward_set_persist_trace(t->p.cu, path, &e2);
    CHECK(rc != 0 && strstr(e2.msg, "cannot write") && strstr(e2.msg, "no-such-dir/trace.tsv"),
          NAME("cuda_persist %s: a trace path that cannot be written is an error when set", name), "rc %d: %s", rc,
          e2.msg);
}

static void run_model(const char *dir, const char *name, int grid0, int grid1, const int *prompt, int n_prompt) {
    trio t;
    verr err = { { 0 } };
    if (trio_start(&t, dir, name, grid0, &err)) return;
    int rc = trio_prompt(&t, prompt, n_prompt, &err);
    tally y = { 0 };
    y.first_bad = -1;
    int tok = prompt[n_prompt - 1];
    cuda_step_counts c;
    int ring0 = 0, stage0 = 0, stage1 = -1;
    for (int j = 0; rc == 0 && j < STEPS; j++) {
        cuda_forward_counts(t.p.cu, &c);
        if (j == STEPS / 4 || j == 3 * STEPS / 4) {  // inputs read through L2 by every warp, not staged
            stage0 = j == STEPS / 4 ? c.persist_stage : stage0;
            cuda_forward_set_persist_tuning(t.p.cu, 3, 0, 0, 1);
        }
        if (j == STEPS / 2) {  // a new grid, a ring of 8 chunks a warp (most rows partly from it), staged again
            stage1 = c.persist_stage;
            ring0 = c.persist_ring;
            // and deep one-row units (8 chunks a lane in flight: llama-wide-tiny's down rows)
            cuda_forward_ctx(t.p.cu)->mv_deep = 1;
            cuda_forward_set_decode_kernel(t.p.cu, 1, grid1);
            cuda_forward_set_persist_ring(t.p.cu, RING_SMALL);
            cuda_forward_set_persist_tuning(t.p.cu, 3, 0, 1, 1);
        }
        if (j == 5 * STEPS / 8)  // staged, the ring filled for a warp's first unit only
            cuda_forward_set_persist_tuning(t.p.cu, 3, 0, 1, 0);
        rc = step(&t, j, tok, &tok, &y, &err);
    }
    cuda_forward_counts(t.p.cu, &c);
    CHECK(rc == 0 && ring0 >= 2048 && c.persist_ring == RING_SMALL,
          NAME("cuda_persist %s: the weight ring in use (as large as fits, then %d bytes a block)", name, RING_SMALL),
          "rc %d, rings of %d and %d bytes", rc, ring0, c.persist_ring);
    // checked once a setting: the first step, then the changes at a quarter, a half, five
    // eighths and three quarters of the way
    CHECK(rc == 0 && c.persist_checks == 5, NAME("cuda_persist %s: the fit checked once a setting, not a step", name),
          "%ld checks over %d steps", c.persist_checks, STEPS);
    int longest = t.g.m.cfg.hidden_dim;
    CHECK(rc == 0 && stage0 >= longest && stage1 == 0 && c.persist_stage == 0,
          NAME("cuda_persist %s: inputs staged in shared memory (up to %d floats), then not", name, longest),
          "rc %d, staged %d, then %d, then %d floats", rc, stage0, stage1, c.persist_stage);
    CHECK(rc == 0 && y.steps == STEPS && y.bad_tok == 0 && y.bad_bits == 0,
          NAME("cuda_persist %s: %d greedy steps, the graph path's tokens and logits bit for bit (grid %d, then %d)",
               name, STEPS, grid0, grid1),
          "rc %d (%s), %d steps, %d tokens and %d logit rows differ", rc, err.msg, y.steps, y.bad_tok, y.bad_bits);
    CHECK(rc == 0 && y.worst_cpu <= 3e-2, NAME("cuda_persist %s: logits within 3e-2 of the CPU forward", name),
          "worst max|diff|/max|ref| %g", y.worst_cpu);
    CHECK(rc == 0 && y.one_launch == STEPS && y.extra_syncs == 0,
          NAME("cuda_persist %s: every step persistent, plain greedy in one launch and one wait", name),
          "%d of %d steps, %d with more than one wait (first at step %d)", y.one_launch, STEPS, y.extra_syncs,
          y.first_bad);
    CHECK(rc == 0 && y.bad_stats == 0, NAME("cuda_persist %s: capture-layer statistics == the graph path's", name),
          "%d steps differ", y.bad_stats);
    if (rc == 0) check_trace(&t, name, &tok);  // (before the batch below, which feeds the persistent session alone)
    if (rc == 0) check_fallbacks(&t, name, tok);
    trio_close(&t);
}

// The four-blocks-an-SM instance (VARENT_CUDA_PERSIST_BLOCKS=4), whose tiled attention
// stages each key tile in shared memory (128 registers a thread), on splits of 1.25
// key tiles (both devices' att_split_keys, set before the graph path captures its step):
// tiles after the first, partials and their combine. FOUR_STEPS greedy steps, the graph
// path's tokens and logits bit for bit; the first half with the weight ring (which the
// staged tiles lie over), the second without one (the tiles past everything else).
#define FOUR_STEPS 80
static void run_four_blocks(const char *dir, const char *name, int grid, const int *prompt, int n_prompt) {
    trio t;
    verr err = { { 0 } };
    if (trio_start(&t, dir, name, grid, &err)) return;
    int S = 4096 / t.g.m.cfg.head_dim, kps = S + S / 4;  // the tiled kernel's key tile
    cuda_forward_ctx(t.g.cu)->att_split_keys = kps;
    cuda_forward_ctx(t.p.cu)->att_split_keys = kps;
    cuda_forward_set_persist_tuning(t.p.cu, 4, 0, 1, 1);
    int rc = trio_prompt(&t, prompt, n_prompt, &err);
    tally y = { 0 };
    y.first_bad = -1;
    int tok = prompt[n_prompt - 1];
    for (int j = 0; rc == 0 && j < FOUR_STEPS; j++) {
        if (j == FOUR_STEPS / 2) cuda_forward_set_persist_ring(t.p.cu, 0);
        rc = step(&t, j, tok, &tok, &y, &err);
    }
    CHECK(rc == 0 && y.steps == FOUR_STEPS && y.bad_tok == 0 && y.bad_bits == 0 && y.one_launch == FOUR_STEPS &&
              y.worst_cpu <= 3e-2,
          NAME("cuda_persist %s: 4 blocks an SM, splits of %d keys (tiles of %d): %d greedy steps, the graph path's "
               "bits", name, kps, S, FOUR_STEPS),
          "rc %d (%s), %d steps (%d persistent), %d tokens and %d logit rows differ, worst CPU diff %g", rc, err.msg,
          y.steps, y.one_launch, y.bad_tok, y.bad_bits, y.worst_cpu);
    trio_close(&t);
}

// --stress STEPS DIR [GRID]: the GPU window's stress test (tools/persist-stress.sh): the
// persistent kernel against the graph path on the model in DIR over STEPS greedy steps
// (a context of STEPS + 64), the logits bit for bit at every step (no CPU reference:
// too slow at this length). One PASS or FAIL line.
static int stress(int steps, const char *dir, int grid) {
    verr err = { { 0 } };
    session g, p;
    session_opts o = { .model_dir = dir, .device = "cuda", .ctx = steps + 64 };
    if (session_open(&g, &o, &err)) {
        printf("FAIL persist_stress: open %s: %s\n", dir, err.msg);
        return 1;
    }
    if (session_open_shared(&p, &g, 0, &err)) {
        printf("FAIL persist_stress: open a second context: %s\n", err.msg);
        session_close(&g);
        return 1;
    }
    cuda_forward_set_decode_kernel(p.cu, 1, grid);
    kv_view kg = kv_view_of(&g.kv), kp = kv_view_of(&p.kv);
    int V = g.m.cfg.vocab_size, prompt[4] = { 1, 2, 3, 4 }, tok = 5, bad = 0, first_bad = -1, tok_bad = 0, j = 0;
    int rc = session_forward(&g, &kg, prompt, 4, &err) || session_forward(&p, &kp, prompt, 4, &err);
    cuda_step_counts c;
    for (; rc == 0 && j < steps; j++) {
        int ng = 0, np = 0;
        rc = greedy_step(&g, &kg, tok, &ng, &err) || greedy_step(&p, &kp, tok, &np, &err);
        int diff = rc == 0 && memcmp(g.fw.logits, p.fw.logits, sizeof(float) * (size_t)V) != 0;
        if (diff && first_bad < 0) first_bad = j;
        bad += diff, tok_bad += ng != np;
        tok = ng;
    }
    cuda_forward_counts(p.cu, &c);
    int ok = rc == 0 && bad == 0 && tok_bad == 0 && c.persist_steps >= steps;
    printf("%s persist_stress: %s, %d of %d greedy steps, logits differing from the graph path at %d steps (first "
           "%d), tokens at %d; %ld persistent steps, %ld fallbacks%s%s\n", ok ? "PASS" : "FAIL", dir, j, steps, bad,
           first_bad, tok_bad, c.persist_steps, c.persist_fallbacks, rc ? ": " : "", rc ? err.msg : "");
    session_close(&p);
    session_close(&g);
    return ok ? 0 : 1;
}

// argv[1]: only the models whose name contains it; or --stress (above).
int main(int argc, char **argv) {
    if (argc >= 4 && !strcmp(argv[1], "--stress"))
        return stress(atoi(argv[2]), argv[3], argc > 4 ? atoi(argv[4]) : 0);
    const char *only = argc > 1 ? argv[1] : "";
    if (cuda_device_count() == 0) {
        SKIP("cuda_persist", "no CUDA device");
        CHECK_DONE();
    }
    char work[512], dir[600];
    snprintf(work, sizeof work, "%s/cuda_persist", env_or("TESTTMP", "tests/tmp"));
    mkdir(work, 0755);
    static const struct {
        const char *preset;
        int grid0, grid1;
    } models[] = {
        { "llama3-tiny", 5, 1 }, { "llama-mha-untied", 3, 8 }, { "qwen2-tiny", 7, 2 },
        { "qwen3-tiny", 4, 9 },  { "llama-hd64-tiny", 6, 3 },  { "qwen3-hd128-tiny", 2, 5 },
        { "llama-wide-tiny", 3, 6 },
    };
    int prompt[6] = { 1, 403, 407, 261, 378, 22 };
    // under ASan two models: qwen2-tiny (biases) and qwen3-hd128-tiny (q/k norms, the tiled attention)
    int asan = test_under_asan();
    if (asan) printf("NOTE cuda_persist: under ASan qwen2-tiny and qwen3-hd128-tiny only (make test runs all 7)\n");
    for (size_t i = 0; i < sizeof models / sizeof *models; i++) {
        if (!strstr(models[i].preset, only)) continue;
        if (asan && strcmp(models[i].preset, "qwen2-tiny") && strcmp(models[i].preset, "qwen3-hd128-tiny")) continue;
        if (gen_random_model(work, models[i].preset, "bf16", 13, dir, sizeof dir)) {
            CHECK(0, NAME("cuda_persist %s: checkpoint", models[i].preset), "tools/gen_random_checkpoint.py failed");
            continue;
        }
        run_model(dir, models[i].preset, models[i].grid0, models[i].grid1, prompt, 6);
        if (strstr(models[i].preset, "hd")) run_four_blocks(dir, models[i].preset, models[i].grid1, prompt, 6);
    }
    if (!strstr("stories260K", only) || asan) CHECK_DONE();
    if (stories_bf16_dir(dir, sizeof dir) == 0) run_model(dir, "stories260K", 4, 11, prompt, 6);
    else SKIP("cuda_persist stories260K", "could not convert tests/data/stories260K (python3 and varent needed)");
    CHECK_DONE();
}
#endif
