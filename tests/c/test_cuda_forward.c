// test_cuda_forward.c: the CUDA forward pass against the CPU forward (the reference) on
// random checkpoints this test writes itself, with the shapes of the tiny presets of
// tools/gen_random_checkpoint.py: Llama GQA with llama3 RoPE scaling and tied
// embeddings, Llama MHA untied, Qwen2 with q/k/v biases and head_dim 28, Qwen3 with
// q/k norms; each stored in bf16 and in f32. Per checkpoint:
//   - a 37-token prefill (chunks of 16 on the GPU) and 16 decode steps, the same ids fed
//     to both backends: logits and the attention capture within bf16 tolerance;
//   - the decode CUDA graph against the same kernels launched one by one;
//   - a second context on the same weights (session_open_shared);
//   - rollback (kv_cache_truncate) and re-decode: the same logits again;
//   - a branch on a private KV tail, its commit, and the step after it;
//   - (bf16 checkpoints, and stories260K when it can be converted) the entropix metrics
//     computed on the device against the host formulas and the CPU session (run_metrics).
// Device selection errors are checked on every machine; the rest needs a GPU and
// prints "SKIP cuda_forward: no CUDA device" without one.
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "host/decode/entropix.h"
#include "host/runtime/session.h"
#include "host/formats/st_write.h"
#include "model/forward_cuda.h"
#include "test_models.h"
#ifdef VARENT_CUDA
#include "kernels/ops_cuda.h"
#endif

static char nm[256];
#define NAME(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)

// Device strings that must fail, on any machine, with the right message.
static void test_device_errors(void) {
    // Malformed indices are refused first; then a build or machine without CUDA.
    const char *why_cuda, *bad_index;
#ifndef VARENT_CUDA
    why_cuda = bad_index = "built without CUDA";
#else
    why_cuda = cuda_device_count() == 0 ? "no CUDA device" : NULL;
    bad_index = "expected cuda or cuda:N";
#endif
    struct { const char *dev, *want; } cases[] = {
        { "tpu", "unknown device" },
        { "cudax", "unknown device" },
        { "cuda:x", bad_index },
        { "cuda:", bad_index },
        { "cuda:-1", bad_index },
        { "cuda:1x", bad_index },
        { "cuda:99", why_cuda ? why_cuda : "does not exist" },
        { "cuda", why_cuda },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        if (!cases[i].want) continue;  // "cuda" opens fine with a GPU
        session s;
        verr err = { { 0 } };
        session_opts o = { .model_dir = "/nonexistent-model-dir", .device = cases[i].dev };
        int rc = session_open(&s, &o, &err);
        CHECK(rc != 0 && strstr(err.msg, cases[i].want), NAME("--device %s is refused", cases[i].dev),
              "rc %d, message '%s', wanted '%s'", rc, err.msg, cases[i].want);
        if (rc == 0) session_close(&s);
    }
}

#ifndef VARENT_CUDA
int main(void) {
    test_device_errors();
    SKIP("cuda_forward", "built without CUDA");
    CHECK_DONE();
}
#else

// ---- random checkpoints --------------------------------------------------------------------
typedef struct {
    const char *name, *arch;
    int dim, hidden, layers, heads, kv, hd, vocab, max_pos, tied, llama3, bias, qk_norm;
    double theta, eps;
} spec;

static const spec SPECS[] = {
    { "llama3-tiny", "LlamaForCausalLM", 128, 344, 2, 4, 2, 32, 1000, 512, 1, 1, 0, 0, 1e4, 1e-5 },
    { "llama-mha-untied", "LlamaForCausalLM", 96, 200, 3, 6, 6, 16, 997, 256, 0, 0, 0, 0, 1e4, 1e-5 },
    { "qwen2-tiny", "Qwen2ForCausalLM", 112, 300, 2, 4, 2, 28, 1100, 512, 1, 0, 1, 0, 1e6, 1e-6 },
    { "qwen3-tiny", "Qwen3ForCausalLM", 96, 264, 2, 4, 2, 32, 1003, 512, 1, 0, 0, 1, 1e6, 1e-6 },
};

static uint64_t rstate = 0x2545f4914f6cdd1dull;
static double urand(void) {  // uniform in [-1, 1)
    rstate ^= rstate << 13, rstate ^= rstate >> 7, rstate ^= rstate << 17;
    return (double)(rstate >> 11) / 4503599627370496.0 - 1.0;
}

// Adds a tensor of n values: center + uniform noise of standard deviation std.
static int add(st_writer *w, int bf16, const char *name, int64_t rows, int64_t cols, double center, double std,
               verr *err) {
    size_t n = (size_t)(rows ? rows : 1) * (size_t)cols;
    void *buf = malloc(n * (bf16 ? 2 : 4));
    if (!buf) return verr_set(err, "out of memory");
    for (size_t i = 0; i < n; i++) {
        float v = (float)(center + std * sqrt(3.0) * urand());
        if (bf16) ((uint16_t *)buf)[i] = f32_to_bf16(v);
        else ((float *)buf)[i] = v;
    }
    int64_t shape[2] = { rows, cols };
    int rc = rows ? st_writer_add(w, name, bf16 ? "BF16" : "F32", shape, 2, buf, n * (bf16 ? 2 : 4), err)
                  : st_writer_add(w, name, bf16 ? "BF16" : "F32", shape + 1, 1, buf, n * (bf16 ? 2 : 4), err);
    free(buf);
    return rc;
}

static int write_config(const spec *p, const char *dir, verr *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return verr_set(err, "%s: %s", path, strerror(errno));
    fprintf(f,
            "{\"architectures\": [\"%s\"], \"hidden_size\": %d, \"intermediate_size\": %d, "
            "\"num_hidden_layers\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": %d, "
            "\"head_dim\": %d, \"vocab_size\": %d, \"max_position_embeddings\": %d, \"rms_norm_eps\": %g, "
            "\"rope_theta\": %g, \"tie_word_embeddings\": %s, \"bos_token_id\": 1, \"eos_token_id\": 2, "
            "\"rope_scaling\": %s}\n",
            p->arch, p->dim, p->hidden, p->layers, p->heads, p->kv, p->hd, p->vocab, p->max_pos, p->eps, p->theta,
            p->tied ? "true" : "false",
            p->llama3 ? "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
                        "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 64}"
                      : "null");
    return fclose(f) == 0 ? 0 : verr_set(err, "%s: write failed", path);
}

// The tensors model.c expects, scaled like gen_random_checkpoint.py.
static int write_model(const spec *p, int bf16, const char *dir, verr *err) {
    if (write_config(p, dir, err)) return -1;
    st_writer *w = st_writer_new();
    if (!w) return verr_set(err, "out of memory");
    double D = p->dim, head_std = 2.5 / sqrt(D);
    int64_t Q = (int64_t)p->heads * p->hd, KV = (int64_t)p->kv * p->hd;
    int rc = add(w, bf16, "model.embed_tokens.weight", p->vocab, p->dim, 0, p->tied ? head_std : 1.0, err) ||
             add(w, bf16, "model.norm.weight", 0, p->dim, 1, 0.1, err) ||
             (!p->tied && add(w, bf16, "lm_head.weight", p->vocab, p->dim, 0, head_std, err));
    for (int l = 0; rc == 0 && l < p->layers; l++) {
        char n[128];
#define T(suffix, rows, cols, c, s) (snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix), add(w, bf16, n, rows, cols, c, s, err))
        rc = T("input_layernorm.weight", 0, p->dim, 1, 0.1) || T("post_attention_layernorm.weight", 0, p->dim, 1, 0.1) ||
             T("self_attn.q_proj.weight", Q, p->dim, 0, 1.3 / sqrt(D)) ||
             T("self_attn.k_proj.weight", KV, p->dim, 0, 1.3 / sqrt(D)) ||
             T("self_attn.v_proj.weight", KV, p->dim, 0, 1.0 / sqrt(D)) ||
             T("self_attn.o_proj.weight", p->dim, Q, 0, 1.0 / sqrt((double)Q)) ||
             T("mlp.gate_proj.weight", p->hidden, p->dim, 0, 1.0 / sqrt(D)) ||
             T("mlp.up_proj.weight", p->hidden, p->dim, 0, 1.0 / sqrt(D)) ||
             T("mlp.down_proj.weight", p->dim, p->hidden, 0, 1.0 / sqrt((double)p->hidden));
        if (rc == 0 && p->bias)
            rc = T("self_attn.q_proj.bias", 0, Q, 0, 0.3) || T("self_attn.k_proj.bias", 0, KV, 0, 0.5) ||
                 T("self_attn.v_proj.bias", 0, KV, 0, 0.1);
        if (rc == 0 && p->qk_norm)
            rc = T("self_attn.q_norm.weight", 0, p->hd, 1.2, 0.2) || T("self_attn.k_norm.weight", 0, p->hd, 1.2, 0.2);
#undef T
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (rc == 0) rc = st_writer_save(w, path, err);
    st_writer_free(w);
    return rc ? -1 : 0;
}

static void remove_model(const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    rmdir(dir);
}

// ---- comparisons ----------------------------------------------------------------------------
// ||got - ref|| / ||ref|| (2-norms, in double).
static double rel_l2(const float *got, const float *ref, long n) {
    double d = 0, r = 0;
    for (long i = 0; i < n; i++) {
        double e = (double)got[i] - ref[i];
        d += e * e, r += (double)ref[i] * ref[i];
    }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

typedef struct {
    const char *tag;     // model name and dtype
    double tol;          // logits, relative 2-norm
    int vocab, heads;
    double worst;        // largest logits error seen
    int fails;
} cmp_ctx;

// GPU session logits (and capture) against the CPU session's, after the same step.
static void compare(cmp_ctx *c, const char *what, const session *gpu, const session *cpu) {
    double e = rel_l2(gpu->fw.logits, cpu->fw.logits, c->vocab);
    if (e > c->worst || e != e) c->worst = e;
    if (!(e <= c->tol)) {
        if (c->fails++ < 3) printf("FAIL cuda_forward %s %s: logits rel err %.3g > %.3g\n", c->tag, what, e, c->tol);
        check_failures++;
        return;
    }
    if (cpu->fw.attn_layer < 0) return;
    if (gpu->fw.attn_keys != cpu->fw.attn_keys) {
        if (c->fails++ < 3)
            printf("FAIL cuda_forward %s %s: attn_keys %d vs %d\n", c->tag, what, gpu->fw.attn_keys, cpu->fw.attn_keys);
        check_failures++;
        return;
    }
    double es = rel_l2(gpu->fw.attn_scores, cpu->fw.attn_scores, (long)c->heads * cpu->fw.attn_keys);
    if (!(es <= 2e-2)) {
        if (c->fails++ < 3) printf("FAIL cuda_forward %s %s: attention scores rel err %.3g\n", c->tag, what, es);
        check_failures++;
    }
}

static int feed(session *s, kv_view *kv, const int *ids, int n, const char *who, verr *err) {
    if (session_forward(s, kv, ids, n, err) == 0) return 0;
    printf("FAIL cuda_forward: %s forward: %s\n", who, err->msg);
    check_failures++;
    return -1;
}

#define P_LEN 37
#define N_DEC 16

static void run_metrics(const char *dir, const char *tag, const char *text, int n_dec, int layer);

// What run_checkpoint draws from the generator for an f32 checkpoint (its weights and
// prompt), without running it: the later checkpoints keep the weights make test gives them.
static void draw_checkpoint(const spec *p, const char *root) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/cudafw-%s-drawn-%d", root, p->name, (int)getpid());
    verr err = { { 0 } };
    if (mkdir(dir, 0755) == 0 || errno == EEXIST) write_model(p, 0, dir, &err);
    remove_model(dir);
    for (int i = 0; i < P_LEN; i++) urand();
}

static void run_checkpoint(const spec *p, int bf16, const char *root) {
    char dir[4096], tag[96];
    snprintf(tag, sizeof tag, "%s %s", p->name, bf16 ? "bf16" : "f32");
    snprintf(dir, sizeof dir, "%s/cudafw-%s-%s-%d", root, p->name, bf16 ? "bf16" : "f32", (int)getpid());
    verr err = { { 0 } };
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        printf("FAIL cuda_forward %s: mkdir %s: %s\n", tag, dir, strerror(errno));
        check_failures++;
        return;
    }
    if (write_model(p, bf16, dir, &err)) {
        printf("FAIL cuda_forward %s: writing the checkpoint: %s\n", tag, err.msg);
        check_failures++;
        remove_model(dir);
        return;
    }
    session cpu, gpu, eager, shared;
    session_opts oc = { .model_dir = dir, .device = "cpu" }, og = { .model_dir = dir, .device = "cuda", .max_batch = 16 };
    int n_open = 0;
    if (session_open(&cpu, &oc, &err) == 0 && ++n_open && session_open(&gpu, &og, &err) == 0 && ++n_open &&
        session_open(&eager, &og, &err) == 0 && ++n_open && session_open_shared(&shared, &gpu, 0, &err) == 0)
        ++n_open;
    CHECK(n_open == 4, NAME("cuda_forward %s: sessions open", tag), "%s", err.msg);
    if (n_open < 4) goto out;
    cuda_forward_set_graphs(eager.cu, 0);
    int layer = p->layers > 2 ? 1 : p->layers - 1;  // a middle layer where there is one
    session *all[4] = { &cpu, &gpu, &eager, &shared };
    for (int i = 0; i < 4; i++) all[i]->fw.attn_layer = layer;
    gpu.fw.copy_scores = 1;  // compare() reads the capture; by default only the metrics come back

    int ids[P_LEN + N_DEC];
    for (int i = 0; i < P_LEN; i++) ids[i] = (int)((urand() * 0.5 + 0.5) * p->vocab) % p->vocab;
    kv_view kc = kv_view_of(&cpu.kv), kg = kv_view_of(&gpu.kv), ke = kv_view_of(&eager.kv), ks = kv_view_of(&shared.kv);
    cmp_ctx c = { tag, bf16 ? 1e-2 : 2e-2, p->vocab, p->heads, 0, 0 };
    float *dec = malloc(sizeof(float) * (size_t)p->vocab * N_DEC);  // GPU logits per decode step
    if (!dec) goto out;
    if (feed(&cpu, &kc, ids, P_LEN, "cpu", &err) || feed(&gpu, &kg, ids, P_LEN, "cuda", &err) ||
        feed(&eager, &ke, ids, P_LEN, "cuda eager", &err) || feed(&shared, &ks, ids, P_LEN, "cuda shared", &err))
        goto out_free;
    compare(&c, "prefill", &gpu, &cpu);
    double ge = 0, se = 0;
    for (int j = 0; j < N_DEC; j++) {
        int t = ids[P_LEN + j] = argmax(cpu.fw.logits, p->vocab);
        if (feed(&cpu, &kc, &t, 1, "cpu", &err) || feed(&gpu, &kg, &t, 1, "cuda", &err) ||
            feed(&eager, &ke, &t, 1, "cuda eager", &err) || feed(&shared, &ks, &t, 1, "cuda shared", &err))
            goto out_free;
        compare(&c, NAME("decode step %d", j), &gpu, &cpu);
        memcpy(dec + (size_t)j * p->vocab, gpu.fw.logits, sizeof(float) * (size_t)p->vocab);
        double e1 = rel_l2(eager.fw.logits, gpu.fw.logits, p->vocab), e2 = rel_l2(shared.fw.logits, gpu.fw.logits, p->vocab);
        if (e1 > ge || e1 != e1) ge = e1;
        if (e2 > se || e2 != e2) se = e2;
    }
    CHECK(c.fails == 0, NAME("cuda_forward %s: prefill + %d decode steps match the CPU", tag, N_DEC),
          "worst logits rel err %.3g", c.worst);
    printf("# %s: worst logits rel err vs cpu %.3g (tolerance %.3g)\n", tag, c.worst, c.tol);
    CHECK(ge <= 1e-6, NAME("cuda_forward %s: graph replay == eager launches", tag), "rel err %.3g", ge);
    CHECK(se <= 1e-6, NAME("cuda_forward %s: shared-weights context == its base", tag), "rel err %.3g", se);

    // Rollback: drop the last 12 positions and decode the same ids again.
    int keep = P_LEN + 4;
    kv_cache_truncate(&cpu.kv, keep);
    kv_cache_truncate(&gpu.kv, keep);
    kc = kv_view_of(&cpu.kv), kg = kv_view_of(&gpu.kv);
    double re = 0;
    int fails0 = c.fails;
    for (int j = 4; j < N_DEC; j++) {
        int t = ids[P_LEN + j];
        if (feed(&cpu, &kc, &t, 1, "cpu", &err) || feed(&gpu, &kg, &t, 1, "cuda", &err)) goto out_free;
        compare(&c, NAME("after rollback, step %d", j), &gpu, &cpu);
        double e = rel_l2(gpu.fw.logits, dec + (size_t)j * p->vocab, p->vocab);
        if (e > re || e != e) re = e;
    }
    CHECK(c.fails == fails0 && re <= 1e-6, NAME("cuda_forward %s: rollback and re-decode", tag),
          "vs first decode %.3g, vs cpu worst %.3g", re, c.worst);

    // Branch: 4 tokens on a private tail over the shared trunk, commit 3, feed the 4th.
    kv_cache tc, tg;
    int br[4] = { 5 % p->vocab, 77 % p->vocab, 300 % p->vocab, 11 % p->vocab };
    if (kv_cache_init_like(&tc, &cpu.kv, 8, &err) || kv_cache_init_like(&tg, &gpu.kv, 8, &err)) {
        printf("FAIL cuda_forward %s: tails: %s\n", tag, err.msg);
        check_failures++;
        goto out_free;
    }
    CHECK(tg.dk != NULL && tg.k == NULL, NAME("cuda_forward %s: tail allocated on the device", tag), "host tail");
    kv_view bc = { &cpu.kv, cpu.kv.len, &tc }, bg = { &gpu.kv, gpu.kv.len, &tg };
    fails0 = c.fails;
    int trunk_len = gpu.kv.len, ok = 1;
    for (int j = 0; j < 4 && ok; j++) {
        ok = !feed(&cpu, &bc, &br[j], 1, "cpu", &err) && !feed(&gpu, &bg, &br[j], 1, "cuda", &err);
        if (ok) compare(&c, NAME("branch step %d", j), &gpu, &cpu);
    }
    float *last = ok ? malloc(sizeof(float) * (size_t)p->vocab) : NULL;
    if (last) memcpy(last, gpu.fw.logits, sizeof(float) * (size_t)p->vocab);
    CHECK(ok && gpu.kv.len == trunk_len && tg.len == 4, NAME("cuda_forward %s: branch leaves the trunk alone", tag),
          "trunk %d -> %d, tail %d", trunk_len, gpu.kv.len, tg.len);
    if (ok && (kv_cache_commit(&cpu.kv, &tc, 3, &err) || kv_cache_commit(&gpu.kv, &tg, 3, &err))) {
        printf("FAIL cuda_forward %s: commit: %s\n", tag, err.msg);
        check_failures++;
        ok = 0;
    }
    if (ok) {
        kc = kv_view_of(&cpu.kv), kg = kv_view_of(&gpu.kv);
        ok = !feed(&cpu, &kc, &br[3], 1, "cpu", &err) && !feed(&gpu, &kg, &br[3], 1, "cuda", &err);
    }
    if (ok) {
        compare(&c, "after commit", &gpu, &cpu);
        double e = last ? rel_l2(gpu.fw.logits, last, p->vocab) : 1;
        CHECK(c.fails == fails0 && e <= 1e-5, NAME("cuda_forward %s: branch tail, commit, next step", tag),
              "committed trunk vs tail logits %.3g", e);
    }
    free(last);
    kv_cache_free(&tc);
    kv_cache_free(&tg);
out_free:
    free(dec);
out:
    if (n_open >= 4) session_close(&shared);  // before its base
    if (n_open >= 3) session_close(&eager);
    if (n_open >= 2) session_close(&gpu);
    if (n_open >= 1) session_close(&cpu);
    if (bf16 && n_open == 4)  // f32 checkpoints: the GPU rounds the weights to bf16 too
        run_metrics(dir, tag, NULL, N_DEC, p->layers > 2 ? 1 : p->layers - 1);
    remove_model(dir);
}

// ---- entropix metrics computed on the device -------------------------------------------------
// session_metrics on CUDA reads the 8 floats the forward computed on the device. Checks per
// step: (1) they equal the host formulas (metrics_logits / metrics_attention) applied to
// the same step's logits and scores copied back (copy_scores), within 1e-3 relative and
// small absolute floors: this isolates the device statistics; (2) graph replay equals
// eager launches, and a session without copy_scores never receives the scores; (3) they
// are within the bf16 bound below of the CPU session's; (4) entropix_decide picks the
// same quadrant on both under the seed, jax and frog profiles unless a metric lies
// within that bound of a threshold.
// The bound: the GPU keeps the KV cache in bf16 and rounds prefill activations to bf16,
// which moves the metrics by up to ~3% (logit entropies, stories260K) and ~7% (attention
// varentropy) in a numpy simulation of exactly that rounding on these checkpoints
// (tests/reference/ref_model.py with bf16 K/V); XB_ABS + 10% is ~3x those differences.
static const char *MNAME[M_COUNT] = { "entropy", "varentropy", "attn_entropy", "attn_varentropy", "agreement",
                                      "interaction_strength" };
static const double XB_ABS[M_COUNT] = { 0.1, 0.2, 0.02, 0.03, 5e-4, 0.02 };
static const double SAME_ABS[M_COUNT] = { 1e-4, 1e-4, 1e-5, 1e-6, 1e-8, 1e-6 };
static const char *PROFILES[3] = { "seed", "jax", "frog" };

static void mvec(const token_metrics *m, double v[M_COUNT]) {
    v[M_ENT] = m->entropy, v[M_VENT] = m->varentropy, v[M_AENT] = m->attn_entropy;
    v[M_AVENT] = m->attn_varentropy, v[M_AGREE] = m->agreement, v[M_INTER] = m->interaction_strength;
}
static double xb_tol(int i, double ref) { return XB_ABS[i] + 0.1 * fabs(ref); }

typedef struct {
    const char *tag;
    entropix_config prof[3];
    int steps, compared[3];            // quadrant comparisons made (away from thresholds)
    double worst_same, worst_cross;    // largest |difference| / bound seen
    int fails;
    float sentinel;                    // fills the scores buffer that must stay untouched
} met_ctx;

static void met_fail(met_ctx *c, const char *what, const char *fmt, double a, double b, const char *m) {
    if (c->fails++ < 5) {
        printf("FAIL cuda_metrics %s %s: ", c->tag, what);
        printf(fmt, m, a, b);
        printf("\n");
    }
    check_failures++;
}

// Quadrants differ only near a threshold: some metric within its bound of a finite box edge.
static int near_threshold(const entropix_config *p, const double v[M_COUNT]) {
    for (int q = 0; q < ENTROPIX_N_BOXES; q++)
        for (int i = 0; i < M_COUNT; i++) {
            double e[2] = { p->box[q].lo[i], p->box[q].hi[i] };
            for (int k = 0; k < 2; k++)
                if (isfinite(e[k]) && fabs(v[i] - e[k]) <= xb_tol(i, v[i])) return 1;
        }
    return 0;
}

// One step's checks; cpu, gpu (graph, copy_scores) and eager (no graph, no copy) were fed the same.
static void met_step(met_ctx *c, const char *what, const session *cpu, const session *gpu, const session *eager,
                     metrics_ws *ws) {
    token_metrics mc, mg, me, mh;
    int vocab = gpu->m.cfg.vocab_size, heads = gpu->m.cfg.n_heads, keys = gpu->fw.attn_keys;
    if (session_metrics(cpu, ws, &mc) || session_metrics(gpu, ws, &mg) || session_metrics(eager, ws, &me) ||
        metrics_logits(ws, gpu->fw.logits, vocab, &mh) ||
        metrics_attention(ws, gpu->fw.attn_scores, heads, keys, &mh)) {
        met_fail(c, what, "%s %g %g", 0, 0, "out of memory");
        return;
    }
    c->steps++;
    if (!gpu->fw.dev_stats || !eager->fw.dev_stats || cpu->fw.dev_stats)
        met_fail(c, what, "%s: gpu %g eager %g (want 1, 1; cpu 0)", gpu->fw.dev_stats, eager->fw.dev_stats, "dev_stats");
    double vc[M_COUNT], vg[M_COUNT], ve[M_COUNT], vh[M_COUNT];
    mvec(&mc, vc), mvec(&mg, vg), mvec(&me, ve), mvec(&mh, vh);
    for (int i = 0; i < M_COUNT; i++) {
        double same = SAME_ABS[i] + 1e-3 * fabs(vh[i]), d = fabs(vg[i] - vh[i]);
        if (d / same > c->worst_same || d != d) c->worst_same = d / same;
        if (!(d <= same)) met_fail(c, what, "%s: device %.9g, host on the device's data %.9g", vg[i], vh[i], MNAME[i]);
        if (!(fabs(ve[i] - vg[i]) <= 1e-9 + 1e-6 * fabs(vg[i])))
            met_fail(c, what, "%s: eager %.9g, graph %.9g", ve[i], vg[i], MNAME[i]);
        double x = fabs(vg[i] - vc[i]) / xb_tol(i, vc[i]);
        if (x > c->worst_cross || x != x) c->worst_cross = x;
        if (!(x <= 1)) met_fail(c, what, "%s: cuda %.6g, cpu %.6g (beyond the bf16 bound)", vg[i], vc[i], MNAME[i]);
    }
    if (!(fabs(mg.log_z - mh.log_z) <= 1e-4 + 1e-5 * fabs(mh.log_z)))
        met_fail(c, what, "%s: device %.9g, host %.9g", mg.log_z, mh.log_z, "log_z");
    long bad = -1;
    for (long i = 0; i < (long)heads * keys && bad < 0; i++)
        if (memcmp(&eager->fw.attn_scores[i], &c->sentinel, sizeof(float))) bad = i;
    if (bad >= 0) met_fail(c, what, "%s: element %g of %g was written", bad, (double)heads * keys, "scores copied without copy_scores");
    for (int p = 0; p < 3; p++) {
        entropix_quadrant qc = entropix_decide(&c->prof[p], &mc, -1, -1).q;
        entropix_quadrant qg = entropix_decide(&c->prof[p], &mg, -1, -1).q;
        if (near_threshold(&c->prof[p], vc)) continue;
        c->compared[p]++;
        if (qc != qg) {
            char m[96];
            snprintf(m, sizeof m, "profile %s: cuda %s, cpu %s", PROFILES[p], entropix_quadrant_name(qg),
                     entropix_quadrant_name(qc));
            met_fail(c, what, "%s (entropy %g, varentropy %g)", vc[M_ENT], vc[M_VENT], m);
        }
    }
}

// Feeds ids to the three sessions through their views.
static int met_feed(session *s[3], kv_view *kv[3], const int *ids, int n, verr *err) {
    for (int i = 0; i < 3; i++)
        if (session_forward(s[i], kv[i], ids, n, err)) {
            printf("FAIL cuda_metrics: %s forward: %s\n", i ? "cuda" : "cpu", err->msg);
            check_failures++;
            return -1;
        }
    return 0;
}

// Prefill (text through the model's tokenizer, or P_LEN random ids), n_dec greedy decode
// steps, then 3 steps on a private KV tail (a branch), metrics checked after each.
static void run_metrics(const char *dir, const char *tag, const char *text, int n_dec, int layer) {
    session cpu, gpu, eager;
    session_opts oc = { .model_dir = dir, .device = "cpu" }, og = { .model_dir = dir, .device = "cuda", .max_batch = 16 };
    verr err = { { 0 } };
    int n_open = 0;
    if (session_open(&cpu, &oc, &err) == 0 && ++n_open && session_open(&gpu, &og, &err) == 0 && ++n_open &&
        session_open(&eager, &og, &err) == 0)
        ++n_open;
    CHECK(n_open == 3, NAME("cuda_metrics %s: sessions open", tag), "%s", err.msg);
    met_ctx c = { .tag = tag, .sentinel = -12345.5f };
    for (int p = 0; p < 3 && n_open == 3; p++)
        if (entropix_profile(PROFILES[p], &c.prof[p], &err)) {
            printf("FAIL cuda_metrics: profile %s: %s\n", PROFILES[p], err.msg);
            check_failures++;
            n_open = -n_open;
        }
    if (n_open != 3) goto out;
    cuda_forward_set_graphs(eager.cu, 0);
    session *all[3] = { &cpu, &gpu, &eager };
    for (int i = 0; i < 3; i++) all[i]->fw.attn_layer = layer;
    gpu.fw.copy_scores = 1;
    for (long i = 0; i < (long)cpu.m.cfg.n_heads * eager.fw.ctx; i++) eager.fw.attn_scores[i] = c.sentinel;
    int *ids = NULL, n = P_LEN, vocab = cpu.m.cfg.vocab_size;
    if (text) n = session_encode_prompt(&cpu, text, &ids, &err);
    else if ((ids = malloc(sizeof(int) * P_LEN)))
        for (int i = 0; i < P_LEN; i++) ids[i] = (int)((urand() * 0.5 + 0.5) * vocab) % vocab;
    metrics_ws ws = { 0 };
    kv_view kc = kv_view_of(&cpu.kv), kg = kv_view_of(&gpu.kv), ke = kv_view_of(&eager.kv);
    kv_view *views[3] = { &kc, &kg, &ke };
    if (n <= 0 || !ids || met_feed(all, views, ids, n, &err)) goto out_free;
    met_step(&c, "prefill", &cpu, &gpu, &eager, &ws);
    for (int j = 0; j < n_dec; j++) {
        int t = argmax(cpu.fw.logits, vocab);
        if (met_feed(all, views, &t, 1, &err)) goto out_free;
        met_step(&c, NAME("decode step %d", j), &cpu, &gpu, &eager, &ws);
    }
    kv_cache tails[3] = { { 0 } };
    int nt = 0;
    while (nt < 3 && kv_cache_init_like(&tails[nt], &all[nt]->kv, 4, &err) == 0) nt++;
    CHECK(nt == 3, NAME("cuda_metrics %s: branch tails", tag), "%s", err.msg);
    kv_view bc = { &cpu.kv, cpu.kv.len, &tails[0] }, bg = { &gpu.kv, gpu.kv.len, &tails[1] },
            be = { &eager.kv, eager.kv.len, &tails[2] };
    kv_view *bviews[3] = { &bc, &bg, &be };
    for (int j = 0; j < 3 && nt == 3; j++) {
        int t = (7 + 131 * j) % vocab;
        if (met_feed(all, bviews, &t, 1, &err)) break;
        met_step(&c, NAME("branch step %d", j), &cpu, &gpu, &eager, &ws);
    }
    for (int i = 0; i < nt; i++) kv_cache_free(&tails[i]);
    CHECK(c.fails == 0 && c.steps == n_dec + 4,
          NAME("cuda_metrics %s: %d steps: device stats == host formulas, graph == eager, within the bf16 bound "
               "of the cpu, same quadrants", tag, c.steps),
          "%d failures", c.fails);
    printf("# %s: metrics worst |device - host| / bound %.3g, worst |cuda - cpu| / bf16 bound %.3g; quadrants "
           "compared away from thresholds: seed %d, jax %d, frog %d of %d steps\n", tag, c.worst_same,
           c.worst_cross, c.compared[0], c.compared[1], c.compared[2], c.steps);
out_free:
    free(ids);
    metrics_ws_free(&ws);
out:
    if (n_open < 0) n_open = -n_open;
    if (n_open >= 3) session_close(&eager);
    if (n_open >= 2) session_close(&gpu);
    if (n_open >= 1) session_close(&cpu);
}

// Armed stock draws (model/cuda/arm.c) on a lazy decode loop: every other step
// armed (temperature 1.0, then 0.7 with top-p 0.9), each armed draw taken without a
// launch equals an ordinary draw of the same configuration on the same logits, bit for
// bit; after the first two steps the alternation replays both graphs without capturing
// again, and growing the sampler's arrays (ctx->sample_buf moves) captures the armed
// graph once more.
static int armed_step(session *s, kv_view *kv, int tok, int j, int arm, sample_out out[2], verr *err) {
    double u = j * 0.6180339887;
    sample_cfg cfg = { j % 4 < 2 ? 1.0f : 0.7f, 0, j % 4 < 2 ? 1.0f : 0.9f, 0, u - (int)u };
    if ((arm && session_arm_sample(s, &cfg, 1, err)) || session_forward(s, kv, &tok, 1, err)) return -1;
    return session_sample(s, &cfg, 1, &out[0], err) || session_sample(s, &cfg, 1, &out[1], err) ? -1 : 0;
}

static void run_armed(const char *dir) {
    session g;
    session_opts og = { .model_dir = dir, .device = "cuda" };
    verr err = { { 0 } };
    if (session_open(&g, &og, &err)) {
        CHECK(0, "cuda_armed: session open", "%s", err.msg);
        return;
    }
    g.fw.lazy_logits = 1;
    kv_view kv = kv_view_of(&g.kv);
    int prompt[5] = { 1, 403, 407, 261, 378 }, tok = 0, bad = 0, rc = session_forward(&g, &kv, prompt, 5, &err);
    long h0, m0, h1, m1, caps[3];
    cuda_step_counts c;
    cuda_forward_arm_counts(g.cu, &h0, &m0);
    sample_out out[2];
    for (int j = 0; rc == 0 && j < 20; j++) {
        if (j == 2 || j == 16) cuda_forward_counts(g.cu, &c), caps[j == 16] = c.captures;
        // the forward reserved 16 configurations: 64 moves the sampler's arrays
        if (j == 16 && cuda_reserve_sample(cuda_forward_ctx(g.cu), g.m.cfg.vocab_size, 64)) rc = -1;
        if (rc == 0) rc = armed_step(&g, &kv, tok, j, j % 2 == 0, out, &err);
        bad += rc == 0 && memcmp(&out[0], &out[1], sizeof out[0]) != 0;
        tok = out[0].token;
    }
    cuda_forward_counts(g.cu, &c), caps[2] = c.captures;
    cuda_forward_arm_counts(g.cu, &h1, &m1);
    CHECK(rc == 0 && bad == 0 && h1 - h0 == 10 && m1 == m0, "cuda_armed: armed stock draws == ordinary draws",
          "rc %d (%s), %d of 20 differ, %ld armed hits (want 10), %ld misses", rc, rc ? err.msg : "", bad, h1 - h0,
          m1 - m0);
    CHECK(rc == 0 && caps[1] == caps[0] && caps[2] == caps[1] + 1, "cuda_armed: alternating steps replay both graphs",
          "captures %ld after step 2, %ld after step 16, %ld after the sampler's arrays moved", caps[0], caps[1], caps[2]);
    session_close(&g);
}

// Armed greedy draws (the lm_head's argmax epilogue, ARM_GREEDY in model/cuda/arm.h)
// among armed stochastic ones and unarmed greedy steps: each armed greedy draw equals an
// ordinary cuda_sample draw on the same logits, bit for bit (token, logit, kept, entropy),
// over 24 steps whose graphs alternate; the greedy graph has one launch more than the
// unarmed step (the finish) where cuda_sample's draws add three.
static void run_armed_greedy(const char *dir) {
    session g;
    session_opts og = { .model_dir = dir, .device = "cuda" };
    verr err = { { 0 } };
    if (session_open(&g, &og, &err)) {
        CHECK(0, "cuda_armed_greedy: session open", "%s", err.msg);
        return;
    }
    g.fw.lazy_logits = 1;
    kv_view kv = kv_view_of(&g.kv);
    int prompt[5] = { 1, 403, 407, 261, 378 }, tok = 0, bad = 0, rc = session_forward(&g, &kv, prompt, 5, &err);
    long h0, m0, h1, m1, launches[3] = { 0, 0, 0 };
    cuda_forward_arm_counts(g.cu, &h0, &m0);
    sample_out out[2];
    for (int j = 0; rc == 0 && j < 24; j++) {
        int kind = j % 3;  // 0: armed greedy, 1: armed temperature 1, 2: greedy, not armed
        double u = j * 0.6180339887;
        sample_cfg cfg = { kind == 1 ? 1.0f : 0.f, 0, 1.0f, 0, kind == 1 ? u - (int)u : 0 };
        if ((kind < 2 && session_arm_sample(&g, &cfg, 1, &err)) || session_forward(&g, &kv, &tok, 1, &err) ||
            session_sample(&g, &cfg, 1, &out[0], &err) || session_sample(&g, &cfg, 1, &out[1], &err))
            rc = -1;
        cuda_step_counts c;
        cuda_forward_counts(g.cu, &c);
        launches[kind] = c.launches;
        bad += rc == 0 && memcmp(&out[0], &out[1], sizeof out[0]) != 0;
        tok = out[0].token;
    }
    cuda_forward_arm_counts(g.cu, &h1, &m1);
    CHECK(rc == 0 && bad == 0 && h1 - h0 == 16 && m1 == m0, "cuda_armed_greedy: armed greedy draws == ordinary draws",
          "rc %d (%s), %d of 24 differ, %ld armed hits (want 16), %ld misses", rc, rc ? err.msg : "", bad, h1 - h0,
          m1 - m0);
    CHECK(launches[0] == launches[2] + 1 && launches[1] == launches[2] + 3,
          "cuda_armed_greedy: the epilogue's step has one launch more, cuda_sample's three",
          "greedy armed %ld, stochastic armed %ld, unarmed %ld", launches[0], launches[1], launches[2]);
    session_close(&g);
}

// A KV cache too large for any GPU: the message has the bytes and suggests --ctx.
static void test_oom_message(void) {
    cuda_ctx ctx;
    verr err = { { 0 } };
    if (cuda_init(&ctx, 0, &err)) {
        printf("FAIL cuda_init: %s\n", err.msg);
        check_failures++;
        return;
    }
    kv_cache kv;
    int rc = kv_cache_init_cuda(&kv, &ctx, 64, 1 << 24, 8192, &err);  // 2 x 16 TiB
    CHECK(rc != 0 && strstr(err.msg, "free") && strstr(err.msg, "--ctx") && strstr(err.msg, "bytes"),
          "device KV cache out of memory names the bytes and --ctx", "rc %d: %s", rc, err.msg);
    if (rc == 0) kv_cache_free(&kv);
    cuda_destroy(&ctx);
}

int main(void) {
    test_device_errors();
    if (cuda_device_count() == 0) {
        SKIP("cuda_forward", "no CUDA device");
        CHECK_DONE();
    }
    const char *root = getenv("TESTTMP");
    if (!root || !*root) root = "/tmp";
    test_oom_message();
    // under ASan bf16 weights only: f32 weights change the kernels, not the host code
    int asan = test_under_asan();
    if (asan) printf("NOTE cuda_forward: under ASan the bf16 checkpoints only (make test runs both)\n");
    for (size_t i = 0; i < sizeof SPECS / sizeof *SPECS; i++)
        for (int bf16 = 1; bf16 >= 0; bf16--) {
            if (asan && !bf16) draw_checkpoint(&SPECS[i], root);
            else run_checkpoint(&SPECS[i], bf16, root);
        }
    char sdir[4096];
    if (stories_bf16_dir(sdir, sizeof sdir) == 0) {
        run_metrics(sdir, "stories260K bf16", "Once upon a time, there was a", 24, 4);
        run_armed(sdir);
        run_armed_greedy(sdir);
    } else {
        SKIP("cuda_metrics stories260K", "could not convert tests/data/stories260K (python3 and varent needed)");
    }
    CHECK_DONE();
}
#endif
