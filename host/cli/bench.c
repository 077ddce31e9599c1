// bench.c: `varent bench -m DIR [-n 256] [--prompt-len 512] [--runs 3]
//                [--sampler standard,entropix] [--profile seed]`.
// Reports medians over runs: prefill tok/s, decode tok/s and ms/token, and the
// achieved bandwidth (weight + KV bytes per token / time) against a measured copy
// bandwidth of the same memory: host memcpy on the CPU, device-to-device copy on a CUDA
// session. On the CPU, the host sampler's time per token under common settings, timed
// on rows of logits the decode produced, as a share of the decode step. Then the full
// decode loop (generate()) under each named sampler, side by side, with its overhead
// over the first one; --temp/--top-k/--top-p/--min-p set the standard sampler's draw
// (default: the profile's T0 and P0), so `--sampler standard --temp 1.0` times the
// decode loop of `varent run --temp 1.0`. --ctx sizes the context as a run would (the
// attention's grid follows the capacity); --probe measures the device alone (facts, the
// read bandwidth of the project's probe kernel, the device copy) without a model.
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/cli/args.h"
#include "host/cli/commands.h"
#include "host/cli/interp_opts.h"
#include "host/cli/ranks.h"
#include "host/cli/common.h"
#include "host/cli/compat.h"
#include "host/decode/generate.h"
#include "host/runtime/session_cuda.h"
#include "host/runtime/devices.h"
#include "host/util/hugemem.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// memcpy bandwidth over a buffer far larger than the caches, counted as read+write.
static double copy_gbs(void) {
    size_t n = (size_t)256 << 20;
    char *a = malloc(n), *b = malloc(n);
    if (!a || !b) return free(a), free(b), 0;
    memset(a, 1, n), memset(b, 2, n);
    double best = 0;
    for (int r = 0; r < 5; r++) {
        double t0 = gen_now();
        memcpy(b, a, n);
        double gbs = 2.0 * n / (gen_now() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    free(a), free(b);
    return best;
}

// The memory decode streams from, and its yardstick.
typedef struct {
    char device[320];     // "cpu (N threads)" or "cuda:0 (NAME, N SMs, X GiB)"
    const char *copy;     // what copy_gbs measured
    double copy_gbs;      // measured copy bandwidth, read + write
    double weight_bytes;  // weight bytes read per decoded token
    double kv_elem;       // bytes per cached K or V element
} bench_mem;

static int bench_mem_of(session *s, bench_mem *b, verr *err) {
    if (!s->cu) {
        snprintf(b->device, sizeof b->device, "cpu (%d threads)", cpu_set_threads(0));
        b->copy = "memcpy", b->copy_gbs = copy_gbs();
        b->weight_bytes = (double)s->m.weight_bytes, b->kv_elem = s->kv.bf16 ? 2 : sizeof(float);
        return 0;
    }
    size_t up = 0;
    if (session_cuda_bench_info(s, b->device, sizeof b->device, &b->copy_gbs, &up, err)) return -1;
    // The upload (16-bit matrices, f32 vectors) holds the whole embedding table; decode
    // reads one row of it unless it is also the lm_head.
    const model_config *c = &s->m.cfg;
    double table = (double)c->vocab_size * c->dim * 2;
    b->copy = "device copy";
    b->weight_bytes = (double)up - (s->m.lm_head.data != s->m.embed.data ? table : 0);
    b->kv_elem = 2;  // bf16 cache
    return 0;
}

// Host waits on the device stream so far (0 on the CPU).
static long device_syncs(const session *s) {
    cuda_step_counts c;
    session_cuda_counts(s, &c);
    return c.syncs;
}

// Tokens done so far, for the progress bar: updated every 32 decoded tokens (the update
// takes a lock and a clock read, nothing the timings notice).
typedef struct {
    progress pg;
    long done;
} bench_progress;

static void bench_tick(bench_progress *bp, long tokens) {
    bp->done += tokens;
    progress_update(&bp->pg, bp->done, NULL);
}

// Seconds this rank spent in collectives so far (tensor parallelism; 0 otherwise).
static double comm_s(const session *s) { return s->fw.comm ? s->fw.comm->sum_s + s->fw.comm->gather_s : 0; }

// One run's figures.
typedef struct {
    double prefill_s, decode_s, decode_comm_s;
    long prefill_syncs, decode_syncs;  // host waits on the device stream (0 on the CPU)
} bench_run;

// The prefill's clock stops once the device has run it and drawn the first token, as
// generate() arms that draw (session_cuda_wait; the armed draw's wait covers it already),
// so the figure is the device's time and the decode clock starts on an idle device.
// wait 0 (VARENT_BENCH_PREFILL_WAIT=0) times it as the bench did before the persist merge
// (ffa2994, the 2026-11-28 windows' baseline), for an A/B against such builds: not armed
// and not waited for, so the figure is the device's run of every chunk but the last
// (each chunk waits for the one before) plus the host's queueing of the last one, and
// the first decode step waits for the rest.
static int bench_prefill(session *s, kv_view *kv, const int *prompt, int prompt_len, int wait, bench_run *r,
                         verr *err) {
    sample_cfg greedy = { 0 };
    long s0 = device_syncs(s);
    double t0 = gen_now();
    int rc = (wait && session_arm_sample(s, &greedy, 1, err)) || session_forward(s, kv, prompt, prompt_len, err) ||
                     (wait && session_cuda_wait(s, err))
                 ? -1
                 : 0;
    r->prefill_s = gen_now() - t0;
    r->prefill_syncs = device_syncs(s) - s0;
    return rc;
}

// One run: prefill prompt_len ids, then decode n tokens greedily, as `varent run --temp 0`
// does: the argmax through session_sample (on the device on CUDA, where the logits then
// stay: lazy_logits), each forward armed to make that draw inside its step as generate()
// arms it (session_arm_sample; VARENT_CUDA_ARM=0 refuses arming, for A/B: the draw then
// launches after the step).
// keep: when not NULL, the logits of the first n_keep decode steps (CPU), for the
// host sampler's cost on real rows.
static int bench_once(session *s, const int *prompt, int prompt_len, int n, int wait, bench_run *r,
                      bench_progress *bp, float *keep, int n_keep, verr *err) {
    s->kv.len = 0;
    kv_view kv = kv_view_of(&s->kv);
    sample_cfg greedy = { 0 };
    sample_out next;
    s->fw.lazy_logits = 1;
    int rc = bench_prefill(s, &kv, prompt, prompt_len, wait, r, err);
    bench_tick(bp, prompt_len);
    double t0 = gen_now(), c0 = comm_s(s);
    long s0 = device_syncs(s);
    size_t V = (size_t)s->m.cfg.vocab_size;
    for (int i = 0; rc == 0 && i < n; i++) {
        if (keep && i < n_keep) memcpy(keep + i * V, s->fw.logits, V * sizeof *keep);
        rc = session_sample(s, &greedy, 1, &next, err) || session_arm_sample(s, &greedy, 1, err) ||
                     session_forward(s, &kv, &next.token, 1, err)
                 ? -1
                 : 0;
        if ((i & 31) == 31) bench_tick(bp, 32);
    }
    r->decode_s = gen_now() - t0;
    r->decode_comm_s = comm_s(s) - c0;
    bench_tick(bp, n & 31);
    r->decode_syncs = device_syncs(s) - s0;
    s->fw.lazy_logits = 0;
    return rc;
}

// Tensor parallelism: the ranks, and rank 0's time in the all-reduces and gathers per
// decoded token (waiting for the other ranks included).
static void print_tp(const session *s, double comm_per_tok, double step) {
    const tp_comm *c = s->fw.comm;
    double kib = 2.0 * s->m.cfg.n_layers * s->m.cfg.dim * 4 / 1024;
    printf("tp          %d ranks over MPI: collectives %.3f ms/token (%.1f%% of a step; 2 all-reduces per layer, "
           "%.1f KiB per token, and the logits gather)\n", c->size, 1e3 * comm_per_tok,
           step > 0 ? 100 * comm_per_tok / step : 0, kib);
}

// What one greedy decode step (sampling included) costs the host, from the last run.
static void print_step_counts(const session *s, long syncs, int n) {
    cuda_step_counts c;
    session_cuda_counts(s, &c);
    printf("decode step %ld kernel launches (%.1f per layer), %ld graph nodes, %.2f host syncs per token\n",
           c.launches, (double)c.launches / s->m.cfg.n_layers, c.graph_nodes, (double)syncs / n);
    char line[512];
    if (cli_tune_line(&c, line, sizeof line)) printf("%s (its timed steps fell in the first run)\n", line);
    if (cli_persist_line(s->decode_persistent, &c, line, sizeof line)) printf("%s (all runs)\n", line);
}

// Decode seconds of one generate() run of n tokens under the named sampler.
// sp: the standard sampler's settings.
// On CUDA, step: the run's last one-row decode step (graph nodes), and in step->captures
// the graphs it captured.
static int bench_sampler(session *s, const char *name, const entropix_config *ex, sampler_params sp, const int *prompt,
                         int plen, int n, double *decode_s, double *syncs, cuda_step_counts *step, verr *err) {
    gen_opts g = { 0 };
    g.max_new = n, g.seed = 42, g.ignore_eos = 1, g.ex = ex, g.sp = sp;
    if (!strcmp(name, "entropix")) g.sampler = GEN_ENTROPIX, g.clarifier = gen_find_clarifier(s);
    else if (!strcmp(name, "standard+metrics")) g.want_metrics = 1;
    else if (strcmp(name, "standard") != 0)
        return verr_set(err, "--sampler: unknown sampler '%s' (use standard, standard+metrics or entropix)", name);
    s->kv.len = 0;
    gen_stats st;
    long s0 = device_syncs(s);
    cuda_step_counts c0;
    session_cuda_counts(s, &c0);
    if (generate(s, prompt, plen, &g, &st, err)) return -1;
    session_cuda_counts(s, step);
    step->captures -= c0.captures;
    *decode_s = st.decode_s / (st.n_gen > 0 ? st.n_gen : 1);
    *syncs = (double)(device_syncs(s) - s0) / (st.n_gen > 0 ? st.n_gen : 1);  // the prompt's step included
    return 0;
}

// --sampler LIST: each sampler's median ms/token and overhead over the first. Runs
// interleave the samplers so drift (clocks, caches) hits them alike.
static int bench_samplers(session *s, const char *list, const char *profile, const sampler_params *given,
                          const int *prompt, int plen, int n, int runs, bench_progress *bp, verr *err) {
    entropix_config ex;
    if (entropix_profile_load(profile, &ex, err)) return -1;
    // The standard sampler: the profile's T0 and P0 unless --temp/--top-k/--top-p/--min-p say otherwise.
    sampler_params sp = { (float)ex.temp, 0, (float)ex.top_p, 0 };
    if (given->temperature >= 0) sp.temperature = given->temperature;
    if (given->top_k >= 0) sp.top_k = given->top_k;
    if (given->top_p >= 0) sp.top_p = given->top_p;
    if (given->min_p >= 0) sp.min_p = given->min_p;
    char buf[256], *save = NULL, *names[8];
    int k = 0;
    snprintf(buf, sizeof buf, "%s", list);
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
        if (k < 8) names[k++] = t;
    double *t = malloc(sizeof(double) * (size_t)(runs * k)), syncs[8] = { 0 };
    cuda_step_counts step[8] = { { 0 } };
    if (!t) return verr_set(err, "out of memory");
    int rc = 0;
    for (int r = 0; rc == 0 && r < runs; r++)
        for (int i = 0; rc == 0 && i < k; i++) {
            rc = bench_sampler(s, names[i], &ex, sp, prompt, plen, n, &t[i * runs + r], &syncs[i], &step[i], err);
            bench_tick(bp, plen + n);
        }
    progress_pause(&bp->pg);
    for (int i = 0; rc == 0 && i < k; i++) {
        double ms = 1e3 * median(t + i * runs, runs), base = 1e3 * median(t, runs);
        printf("sampler     %-16s %.3f ms/token  %+.1f%% vs %s (median of %d, profile %s; standard: temp %g top-k %d "
               "top-p %g min-p %g)", names[i], ms, 100.0 * (ms / base - 1), names[0], runs, profile, sp.temperature,
               sp.top_k, sp.top_p, sp.min_p);
        if (s->cu)  // the step's graph holds its draws when they are armed (model/forward_cuda_arm.c)
            printf(", %.2f host syncs per token, decode step %ld kernel launches, %ld graph nodes, %ld graph captures",
                   syncs[i], step[i].launches, step[i].graph_nodes, step[i].captures);
        printf("\n");
    }
    progress_resume(&bp->pg);
    free(t);
    return rc;
}

// The host sampler's cost per token under common settings, timed on rows of logits
// the decode produced, as a share of the measured decode step (CPU sessions).
static void bench_host_sampler(session *s, const float *rows, int n_rows, double step_ms, const entropix_config *ex) {
    static const char *name[] = { "greedy", "temp 1.0", "temp 0.7 top-p 0.9", "temp 0.8 top-k 40", "temp 1.0 min-p 0.05",
                                  "entropix base" };
    sample_cfg set[6] = { { 0, 0, 1, 0, 0 },     { 1.0f, 0, 1, 0, 0 },     { 0.7f, 0, 0.9f, 0, 0 },
                          { 0.8f, 40, 1, 0, 0 }, { 1.0f, 0, 1, 0.05f, 0 }, { 0, 0, 1, 0, 0 } };
    sampler_params b = entropix_base_params(ex);
    set[5] = (sample_cfg){ b.temperature, b.top_k, b.top_p, b.min_p, 0 };
    size_t V = (size_t)s->m.cfg.vocab_size;
    enum { PASSES = 3 };
    int nt = PASSES * n_rows;
    double *t = malloc(sizeof(double) * (size_t)nt);
    if (!t) return;
    rng r = { 42, 0 };
    for (int c = 0; c < 6; c++) {
        double sum = 0;
        for (int k = 0; k < nt; k++) {
            sample_cfg cfg = set[c];
            sample_out o;
            cfg.u = rng_uniform(&r);
            double t0 = gen_now();
            sampler_sample_n(&s->smp, rows + (k % n_rows) * V, &cfg, 1, &o);
            sum += t[k] = gen_now() - t0;
        }
        double mean = 1e6 * sum / nt, med = 1e6 * median(t, nt);
        printf("sampling    %-20s %8.1f us/token  %5.2f%% of a decoding step (the host sampler's mean; median %.1f us; "
               "%d draws on %d decoded rows)\n", name[c], mean, 100.0 * mean / (1e3 * step_ms), med, nt, n_rows);
    }
    free(t);
}

static const cli_opt bench_opts[] = {
    { "-n|--n-predict|--n-gen", "N", "sampling", "256", "tokens to decode per run", 0 },
    { "-p|--prompt-len|--n-prompt", "N", "prompt", "512", "prompt tokens to prefill per run (random ids)", 0 },
    { "-r|--runs|--repetitions", "N", "output", "3", "runs; the medians are reported", 0 },
    { "--sampler", "LIST", "entropix", "standard,entropix", "samplers to time in the full decode loop (standard, "
      "standard+metrics, entropix), or none", 0 },
    { "--profile", "NAME|FILE", "entropix", "seed", "entropix profile of the sampler runs: a stock name or a profile file NAME.json", 0 },
    { "--temp", "T", "sampling", "the profile's", "the standard sampler's temperature", 0 },
    { "--top-k", "K", "sampling", "0", "the standard sampler's top-k", 0 },
    { "--top-p", "P", "sampling", "the profile's", "the standard sampler's top-p", 0 },
    { "--min-p", "M", "sampling", "0", "the standard sampler's min-p", 0 },
    { "-c|--ctx", "N", "prompt", "--prompt-len + -n + 1", "context capacity (the CLI's default is 4096): decode then "
      "runs with the buffers and attention grid of that capacity", 0 },
    { "--probe", NULL, "output", NULL, "measure the device only, no model: its facts, the read bandwidth of the probe "
      "kernel and the device copy (CUDA)", 0 },
    { "--probe-mb", "N", "output", "1024", "the probe's buffer in MiB (make it several times the L2)", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};
static const cli_opt bench_session_opts[] = {
    { "-m|--model", "DIR", "model", NULL, "model directory (config.json, *.safetensors)", 0 },
    { "--device", "DEV", "performance", "cpu", "cpu or cuda[:N]", 0 },
    { "-t|--threads", "N", "performance", "every CPU", "CPU threads (at most the CPUs this process may use)", 0 },
    { "-b|--batch|--batch-size", "N", "performance", "256", "prompt tokens per forward pass (prefill chunk)", 0 },
    { "--decode-kernel", "graph|persistent|auto", "performance", "graph", "CUDA: decode steps as a graph of kernels, "
      "as one persistent kernel a token (the A/B of docs/cuda.md), or auto: the first steps time both and the rest "
      "take the faster (those steps fall in the first run)", 0 },
    { "--lookahead", "N", "performance", "8", "CUDA: the sampler table's generate() steps queued ahead on the device, tokens "
      "read a few steps behind (docs/cuda.md \"The device decode loop\"; 0: one host round trip per token; at most 8)", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};
static const cli_opt *const bench_tables[] = { bench_session_opts, cli_opts_llama, cli_opts_kv, cli_opts_tp, bench_opts, cli_opts_steer, NULL };
const cli_spec cli_bench_spec = {
    "bench", "-m DIR [-n 256] [--prompt-len 512] [--runs 3] [options]",
    "Measure prefill and decode speed and the memory bandwidth achieved, then the decode loop per sampler.",
    "Greedy decoding from a random prompt; the context is --prompt-len + -n + 1 unless --ctx says more.", bench_tables,
    NULL, NULL,
};

// Where the CPU forward reads its weights from, and how much of that the kernel put in
// huge pages (THP is advice: a machine with it off or fragmented memory gets 4 KiB).
static void print_weights(const model *m) {
    if (!m->placed) {
        printf("weights     read from the file mapping (--mmap)\n");
        return;
    }
    long long huge = huge_resident(m->placed, m->placed_bytes);
    printf("weights     %.1f MiB copied into memory, ", m->placed_bytes / 1048576.0);
    if (huge < 0) printf("huge pages unknown (no /proc/self/smaps)\n");
    else printf("%.0f%% in 2 MiB pages\n", huge >= (long long)m->placed_bytes ? 100.0 : 100.0 * huge / m->placed_bytes);
}

// --probe: the device's facts, the probe kernel's read bandwidth over a buffer of
// probe_mb MiB and the device copy; no model. The GPU window's first stage.
static int bench_probe(const char *device, int probe_mb) {
#ifdef VARENT_CUDA
    device_spec d;
    verr err = { { 0 } };
    if (strcmp(device, "cpu") == 0 || devices_parse(device, &d, &err) != 1 || strcmp(d.name, "cpu") == 0)
        return cli_usage_error("bench", "--probe measures a CUDA device: give --device cuda[:N], not '%s'", device);
    cuda_ctx ctx;
    int dev = strcmp(d.name, "cuda") == 0 ? 0 : atoi(d.name + 5);
    if (cuda_init(&ctx, dev, &err)) return cli_error("bench", "%s", err.msg);
    cuda_facts f;
    double read = 0, copy = 0;
    int checked = 0;
    size_t bytes = (size_t)probe_mb << 20;
    int rc = cuda_device_facts(&ctx, &f) || cuda_read_gbs(&ctx, bytes, 10, &read, &checked) || cuda_copy_gbs(&ctx, &copy);
    if (rc == 0) {
        double peak = 2.0 * f.mem_clock_khz * 1e3 * (f.bus_bits / 8.0) / 1e9;  // HBM: two transfers a clock
        printf("device      cuda:%d (%s, %d SMs, %.1f GiB)\n", dev, f.name, f.n_sm, f.mem_bytes / 1073741824.0);
        printf("facts       L2 %.1f MiB; SM clock %d MHz, memory clock %d MHz (peak); bus %d bits: %.0f GB/s "
               "theoretical; ECC %s; driver %d.%d, runtime %d.%d\n", f.l2_bytes / 1048576.0, f.sm_clock_khz / 1000,
               f.mem_clock_khz / 1000, f.bus_bits, peak, f.ecc ? "on" : "off", f.driver / 1000, f.driver % 1000 / 10,
               f.runtime / 1000, f.runtime % 1000 / 10);
        printf("read        %d MiB (%.1fx the L2): %.4g GB/s (probe kernel, best of 10%s)\n", probe_mb,
               f.l2_bytes > 0 ? (double)bytes / f.l2_bytes : 0, read, checked ? "; sums checked" : "; SUMS WRONG");
        printf("copy        %.1f GB/s (device copy, read + write)\n", copy);
        if (!checked) rc = verr_set(&ctx.err, "the probe kernel's sums were wrong: the device read bad data");
    }
    if (rc) verr_set(&err, "%s", ctx.err.msg);
    cuda_destroy(&ctx);
    return rc ? cli_error("bench", "%s", err.msg) : 0;
#else
    (void)device, (void)probe_mb;
    return cli_error("bench", "--probe needs the CUDA backend: this varent was built without it");
#endif
}

int cmd_bench(int argc, char **argv) {
    args a;
    int rc0 = args_init(&a, &cli_bench_spec, argc, argv);
    if (rc0 >= 0) return rc0;
    session_opts so = { 0 };
    so.model_dir = args_str(&a, "-m", NULL);
    so.device = cli_device(&a);
    so.threads = (int)args_int_range(&a, "-t", 0, 1, cli_cpu_count());
    so.max_batch = (int)args_int_range(&a, "-b", 0, 1, INT_MAX);
    so.kv_bf16 = cli_kv_bf16(&a);
    so.weights_mmap = args_bool(&a, "--mmap", "--no-mmap", 0);
    so.decode_persistent = cli_decode_persistent(&a);
    so.lookahead = cli_lookahead(&a);
    cli_steer_opts(&a, &so.steer);  // what an intervention costs a step (tests/py/test_interp_cuda.py)
    cli_ranks_session(&a, &so);      // mpirun -np N varent bench: N ranks, --tp N
    int n = (int)args_int_range(&a, "-n", 256, 1, 1 << 24), plen = (int)args_int_range(&a, "--prompt-len", 512, 1, 1 << 24);
    int runs = (int)args_int_range(&a, "--runs", 3, 1, 100);
    const char *samplers = args_str(&a, "--sampler", "standard,entropix"), *profile = args_str(&a, "--profile", "seed");
    // The standard sampler's settings (-1: the profile's T0 and P0, no top-k or min-p).
    sampler_params sp = { (float)args_float_range(&a, "--temp", -1, 0, 100), (int)args_int_range(&a, "--top-k", -1, 0, INT_MAX),
                          (float)args_float_range(&a, "--top-p", -1, 0, 1), (float)args_float_range(&a, "--min-p", -1, 0, 1) };
    int ctx = (int)args_int_range(&a, "-c", 0, 1, 1 << 24), probe_only = args_flag(&a, "--probe");
    int probe_mb = (int)args_int_range(&a, "--probe-mb", 1024, 1, 1 << 20);
    if (args_finish(&a, 0)) return cli_usage_error("bench", "%s", a.err);
    if (probe_only) return bench_probe(so.device, probe_mb);
    if (!so.model_dir) return cli_usage_error("bench", "missing -m DIR (the model directory)");
    if (ctx && ctx < plen + n + 1)
        return cli_usage_error("bench", "--ctx %d is too small for --prompt-len %d + -n %d + 1 = %d", ctx, plen, n,
                               plen + n + 1);
    verr err = { { 0 } };
    session s;
    char ctx_name[96];
    so.ctx = ctx ? ctx : plen + n + 1;
    if (ctx) snprintf(ctx_name, sizeof ctx_name, "--ctx: a context of");
    else snprintf(ctx_name, sizeof ctx_name, "--prompt-len %d + -n %d + 1: a context of", plen, n);
    so.ctx_name = ctx_name;
    if (session_open(&s, &so, &err)) return cli_error("bench", "%s", err.msg);
    int *prompt = malloc(sizeof(int) * (size_t)plen);
    double *pf = malloc(sizeof(double) * (size_t)runs), *dc = malloc(sizeof(double) * (size_t)runs);
    double *cm = malloc(sizeof(double) * (size_t)runs);
    int rc = prompt && pf && dc && cm ? 0 : verr_set(&err, "out of memory");
    uint64_t x = 12345;
    for (int i = 0; rc == 0 && i < plen; i++) x = x * 6364136223846793005ull + 1, prompt[i] = (int)((x >> 33) % (uint64_t)s.m.cfg.vocab_size);
    int n_keep = !s.cu && strcmp(samplers, "none") != 0 ? (n < 32 ? n : 32) : 0;
    float *keep = n_keep ? malloc(sizeof(float) * (size_t)n_keep * (size_t)s.m.cfg.vocab_size) : NULL;
    if (n_keep && !keep) rc = verr_set(&err, "out of memory");
    // Tokens of every run: the greedy loop, then each sampler of --sampler.
    int n_samplers = strcmp(samplers, "none") == 0 ? 0 : 1;
    for (const char *c = samplers; n_samplers && *c; c++) n_samplers += *c == ',';
    bench_progress bp = { .done = 0 };
    progress_start(&bp.pg, "bench", (long)runs * (1 + n_samplers) * (plen + n), 0);
    const char *pw = getenv("VARENT_BENCH_PREFILL_WAIT");  // 0: the prefill timed as before (bench_prefill)
    int wait = !(pw && !strcmp(pw, "0"));
    bench_run br = { 0 };
    for (int r = 0; rc == 0 && r < runs; r++) {
        rc = bench_once(&s, prompt, plen, n, wait, &br, &bp, r == runs - 1 ? keep : NULL, n_keep, &err);
        pf[r] = br.prefill_s, dc[r] = br.decode_s, cm[r] = br.decode_comm_s;
    }
    bench_mem mem;
    if (rc == 0) rc = bench_mem_of(&s, &mem, &err);
    if (rc == 0) {
        const model_config *c = &s.m.cfg;
        double p = median(pf, runs), d = median(dc, runs), tps = n / d;
        // Mean KV bytes read per decoded token: positions plen .. plen+n.
        double kv_bytes = (plen + n / 2.0) * 2.0 * c->n_layers * c->n_kv_heads * c->head_dim * mem.kv_elem;
        double gbs = (mem.weight_bytes + kv_bytes) * tps / 1e9, copy = mem.copy_gbs;
        progress_pause(&bp.pg);  // the results never share a line with the bar
        printf("model       %s (%s, %s weights, %.1f M params)\n", so.model_dir, c->arch_name, wtype_name(s.m.embed.type),
               s.m.n_params / 1e6);
        printf("device      %s\n", mem.device);
        printf("context     %d positions (%s)\n", so.ctx, ctx ? "--ctx" : "--prompt-len + -n + 1");
        if (!s.cu) print_weights(&s.m);
        printf("prefill     %d tokens: %.1f tok/s (median of %d", plen, plen / p, runs);
        if (!s.cu) printf(")\n");
        else if (wait) printf("; to the device's finish, %ld host syncs)\n", br.prefill_syncs);
        else printf("; the device not waited for: VARENT_BENCH_PREFILL_WAIT=0)\n");
        printf("decode      %d tokens: %.1f tok/s, %.3f ms/token (median of %d)\n", n, tps, 1e3 / tps, runs);
        printf("bandwidth   %.1f GB/s achieved; %s %.1f GB/s (read+write); ratio %.2f\n", gbs, mem.copy, copy,
               copy > 0 ? gbs / copy : 0);
        if (s.cu) print_step_counts(&s, br.decode_syncs, n);
        if (s.fw.comm) print_tp(&s, median(cm, runs) / n, d / n);
        entropix_config ex;
        if (keep && entropix_profile(profile, &ex, &err) == 0) bench_host_sampler(&s, keep, n_keep, 1e3 * d / n, &ex);
        fflush(stdout);
        progress_resume(&bp.pg);
        if (strcmp(samplers, "none") != 0)
            rc = bench_samplers(&s, samplers, profile, &sp, prompt, plen, n, runs, &bp, &err);
    }
    if (rc == 0) progress_finish(&bp.pg, NULL);
    else progress_stop(&bp.pg);
    free(prompt), free(pf), free(dc), free(cm), free(keep);
    session_close(&s);
    return rc ? cli_error("bench", "%s", err.msg) : 0;
}
