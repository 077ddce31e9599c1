// attention.c: causal grouped-query attention over a kv_span (trunk + tail), as
// blocked products with the online softmax (flash attention's order of work):
//   - a work item is a tile of rows, (token, head) pairs that share one kv head: the
//     heads of a GQA group and up to ATT_MAX_ROWS / group tokens of a prefill, so each
//     K and V row is read once per tile and used by every row of it;
//   - keys go by blocks of ATT_BK: scores, then a vectorised exp, then P @ V;
//   - decode (one token tile) splits the keys across threads as well, each split keeping
//     its own max and sum, merged at the end (flash decoding), so two threads share even
//     three kv heads; a token's heads that fit one tile go through each key block
//     together, kv head after kv head (attn_tile_sweep), so the cache is read row by row.
// The kernel body (attention_tile.h, and attention_rows.h for prefill tiles) is compiled for AVX-512, AVX2 and portably, and
// cpu_isa_active() picks one. cpu_attn_stats: the entropix statistics of the last
// query's scores (the twin of cuda_attn_stats).
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"

#define ATT_BK 64        // keys per block: its scores stay in L1 with the rows' outputs
#define ATT_MAX_ROWS 32  // rows of a tile
#define ATT_MIN_SPLIT 256  // fewest keys worth a split of their own

// What one call reads: the keys and values (a paged trunk's rows go through pg's block
// table: attention_tile.h's kv_row), the geometry.
typedef struct {
    kv_span kv;
    attn_shape s;
    int kv_dim;
    kv_pages pg;
} attn_args;


// A tile's rows: each row's query, capture (NULL: none) and causal limit (its keys are
// 0..limit-1); g: the kv head they share.
typedef struct {
    const float *q[ATT_MAX_ROWS];
    float *cap[ATT_MAX_ROWS];
    int limit[ATT_MAX_ROWS];
    int n, g;
} attn_rows;

typedef int attn_vi16 __attribute__((vector_size(64)));
typedef float attn_vf16 __attribute__((vector_size(64)));
typedef int attn_vi8 __attribute__((vector_size(32)));
typedef float attn_vf8 __attribute__((vector_size(32)));
typedef int attn_vi4 __attribute__((vector_size(16)));
typedef float attn_vf4 __attribute__((vector_size(16)));
typedef unsigned short attn_vh16 __attribute__((vector_size(32)));  // bf16 lanes, widened to the float vectors
typedef unsigned short attn_vh8 __attribute__((vector_size(16)));
typedef unsigned short attn_vh4 __attribute__((vector_size(8)));

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4")
#define ATT_V attn_vf16
#define ATT_VI attn_vi16
#define ATT_VH attn_vh16
#define ATT_VW 16
#define ATT_FN(name) name##_avx512
#define ATT_IV 4
#include "kernels/cpu/attention_tile.h"
#include "kernels/cpu/attention_rows.h"
#undef ATT_V
#undef ATT_VI
#undef ATT_VH
#undef ATT_VW
#undef ATT_FN
#undef ATT_IV
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v3")
#define ATT_V attn_vf8
#define ATT_VI attn_vi8
#define ATT_VH attn_vh8
#define ATT_VW 8
#define ATT_FN(name) name##_avx2
#define ATT_IV 2
#include "kernels/cpu/attention_tile.h"
#include "kernels/cpu/attention_rows.h"
#undef ATT_V
#undef ATT_VI
#undef ATT_VH
#undef ATT_VW
#undef ATT_FN
#undef ATT_IV
#pragma GCC pop_options
#endif
// The portable build: 16-byte vectors, which every x86-64 (SSE2) and aarch64 (NEON) has.
#define ATT_V attn_vf4
#define ATT_VI attn_vi4
#define ATT_VH attn_vh4
#define ATT_VW 4
#define ATT_FN(name) name##_generic
#define ATT_IV 2
#include "kernels/cpu/attention_tile.h"
#include "kernels/cpu/attention_rows.h"

typedef void attn_tile_fn(const attn_args *a, const attn_rows *w, int ka, int kb, float *m, float *l, float *o,
                          float *s);

static attn_tile_fn *attn_pick(void) {
#if defined(__x86_64__)
    cpu_isa isa = cpu_isa_active();
    if (isa >= CPU_ISA_AVX512) return attn_run_tile_avx512;
    if (isa == CPU_ISA_AVX2) return attn_run_tile_avx2;
#endif
    return attn_run_tile_generic;
}

// How the rows and keys are cut into jobs. sweep: one token whose heads all fit a tile,
// every job a key range of all of them (attn_tile_sweep).
typedef struct {
    int T, total, hc, nt, head_chunks, token_tiles, splits, jobs, sweep;
} attn_plan;

static attn_plan attn_make_plan(int T, int total, attn_shape s) {
    attn_plan p = { .T = T, .total = total };
    if (T == 1 && s.n_heads <= ATT_MAX_ROWS && s.n_kv_heads > 1) {
        int want = 2 * omp_get_max_threads();
        p.sweep = 1, p.hc = s.n_heads, p.nt = 1, p.head_chunks = 1, p.token_tiles = 1;
        p.splits = want < total / ATT_MIN_SPLIT ? want : total / ATT_MIN_SPLIT;
        if (p.splits < 1) p.splits = 1;
        p.jobs = p.splits;
        return p;
    }
    int G = s.n_heads / s.n_kv_heads;
    p.hc = G < ATT_MAX_ROWS ? G : ATT_MAX_ROWS;
    p.nt = ATT_MAX_ROWS / p.hc;
    p.head_chunks = (G + p.hc - 1) / p.hc;
    p.token_tiles = (T + p.nt - 1) / p.nt;
    int base = s.n_kv_heads * p.head_chunks * p.token_tiles, want = 4 * omp_get_max_threads();
    p.splits = 1;
    if (p.token_tiles == 1 && base < want) {  // decode: split the keys too
        p.splits = (want + base - 1) / base;
        if (p.splits > total / ATT_MIN_SPLIT) p.splits = total / ATT_MIN_SPLIT;
        if (p.splits < 1) p.splits = 1;
    }
    p.jobs = base * p.splits;
    return p;
}

// Job j's rows (tile of tokens x heads of one kv head) and its key range [*ka, *kb).
static void attn_job_rows(const attn_plan *p, attn_shape s, const float *q, float *last_scores, int job, attn_rows *w,
                          int *ka, int *kb) {
    int split = job % p->splits, tile = job / p->splits;
    if (p->sweep) {  // every head of the one token
        w->n = s.n_heads, w->g = -1;
        for (int h = 0; h < s.n_heads; h++) {
            w->q[h] = q + (size_t)h * s.head_dim;
            w->cap[h] = last_scores ? last_scores + (size_t)h * p->total : NULL;
            w->limit[h] = p->total;
        }
        int per = (p->total + p->splits - 1) / p->splits;
        *ka = split * per, *kb = *ka + per < p->total ? *ka + per : p->total;
        return;
    }
    int tt = tile % p->token_tiles, hcix = tile / p->token_tiles % p->head_chunks;
    int g = tile / p->token_tiles / p->head_chunks, G = s.n_heads / s.n_kv_heads;
    int t0 = tt * p->nt, t1 = t0 + p->nt < p->T ? t0 + p->nt : p->T;
    int h0 = g * G + hcix * p->hc, h1 = h0 + p->hc < (g + 1) * G ? h0 + p->hc : (g + 1) * G;
    w->n = 0, w->g = g;
    for (int t = t0; t < t1; t++)
        for (int h = h0; h < h1; h++, w->n++) {
            w->q[w->n] = q + ((size_t)t * s.n_heads + h) * s.head_dim;
            w->cap[w->n] = last_scores && t == p->T - 1 ? last_scores + (size_t)h * p->total : NULL;
            w->limit[w->n] = p->total - p->T + t + 1;
        }
    int keys = p->total - p->T + t1, per = (keys + p->splits - 1) / p->splits;  // the tile's last row sees them all
    *ka = split * per, *kb = *ka + per < keys ? *ka + per : keys;
}

// Row i of job's tile: where its output goes.
static float *attn_out_row(float *out, const attn_plan *p, attn_shape s, const attn_rows *w, const float *q, int i) {
    return out + (w->q[i] - q);
}

// Merges the splits of each tile's rows: part holds, per job, [n][2 + hd] (m, l, o).
static void attn_merge(float *out, const float *q, const attn_plan *p, attn_shape s, const float *part) {
    size_t stride = (size_t)ATT_MAX_ROWS * (2 + s.head_dim);
#pragma omp parallel for schedule(static) if (p->jobs > 4)
    for (int tile = 0; tile < p->jobs / p->splits; tile++) {
        attn_rows w;
        int ka, kb;
        attn_job_rows(p, s, q, NULL, tile * p->splits, &w, &ka, &kb);
        for (int r = 0; r < w.n; r++) {
            float M = -INFINITY, L = 0, *o = attn_out_row(out, p, s, &w, q, r);
            for (int k = 0; k < p->splits; k++) {
                float m = part[(tile * p->splits + k) * stride + (size_t)r * (2 + s.head_dim)];
                M = m > M ? m : M;
            }
            memset(o, 0, sizeof(float) * (size_t)s.head_dim);
            for (int k = 0; k < p->splits; k++) {
                const float *e = part + (tile * p->splits + k) * stride + (size_t)r * (2 + s.head_dim);
                float f = e[0] == -INFINITY ? 0 : expf(e[0] - M);
                L += e[1] * f;
                for (int i = 0; i < s.head_dim; i++) o[i] += e[2 + i] * f;
            }
            for (int i = 0; i < s.head_dim; i++) o[i] /= L;
        }
    }
}

// One job: its tile against its keys, normalised into out (one split) or kept in part.
static void attn_run_job(float *out, const float *q, const attn_args *a, const attn_plan *p, float *last_scores,
                         attn_tile_fn *tile_fn, int job, float *scratch, float *part) {
    attn_rows w;
    int ka, kb, hd = a->s.head_dim;
    attn_job_rows(p, a->s, q, last_scores, job, &w, &ka, &kb);
    float *m = scratch, *l = m + ATT_MAX_ROWS, *s = l + ATT_MAX_ROWS, *o = s + ATT_MAX_ROWS * ATT_BK;
    tile_fn(a, &w, ka, kb, m, l, o, s);  // o is followed by a head_dim row for widened bf16 keys and values
    for (int r = 0; r < w.n; r++) {
        if (part) {
            float *e = part + (size_t)job * ATT_MAX_ROWS * (2 + hd) + (size_t)r * (2 + hd);
            e[0] = m[r], e[1] = l[r];
            memcpy(e + 2, o + (size_t)r * hd, sizeof(float) * (size_t)hd);
            continue;
        }
        float *dst = attn_out_row(out, p, a->s, &w, q, r), inv = 1.0f / l[r];
        for (int i = 0; i < hd; i++) dst[i] = o[(size_t)r * hd + i] * inv;
    }
}

// A plan without key splits (no memory for their partials): one job per tile.
static void attn_unsplit(attn_plan *p, attn_shape s) {
    p->splits = 1;
    p->jobs = p->sweep ? 1 : s.n_kv_heads * p->head_chunks * p->token_tiles;
}

// Whether a call of this much work (query rows x heads x keys x head_dim, summed over
// rows) opens a parallel region: below it the fork costs more than the jobs.
static int attn_parallel_work(long work) { return work > 16384; }

void cpu_attention(float *out, const float *q, kv_span kv, int T, attn_shape s, float *last_scores) {
    cpu_attention_paged(out, q, kv, (kv_pages){ NULL, 0 }, T, s, last_scores);
}

void cpu_attention_paged(float *out, const float *q, kv_span kv, kv_pages pg, int T, attn_shape s,
                         float *last_scores) {
    int total = kv.n_trunk + kv.n_tail;
    attn_args a = { kv, s, s.n_kv_heads * s.head_dim, pg };
    attn_plan p = attn_make_plan(T, total, s);
    attn_tile_fn *tile_fn = attn_pick();
    float *part = p.splits > 1 ? malloc(sizeof(float) * (size_t)p.jobs * ATT_MAX_ROWS * (2 + s.head_dim)) : NULL;
    if (!part) attn_unsplit(&p, s);
    // m, l, the block's scores, the rows' outputs, then q^T and a block of widened bf16 K
    // and V rows (attention_rows.h; the per-row path uses one widened row of it)
    size_t scratch_floats = 2 * ATT_MAX_ROWS + ATT_MAX_ROWS * ATT_BK + (size_t)(2 * ATT_MAX_ROWS + 2 * ATT_BK) * s.head_dim;
#pragma omp parallel if (p.jobs > 1 && attn_parallel_work((long)T * s.n_heads * total * s.head_dim))
    {
        float *scratch = malloc(sizeof(float) * scratch_floats);
#pragma omp for schedule(dynamic, 1)
        for (int job = 0; job < p.jobs; job++)
            if (scratch) attn_run_job(out, q, &a, &p, last_scores, tile_fn, job, scratch, part);
        free(scratch);
    }
    if (part) attn_merge(out, q, &p, s, part);
    free(part);
}

// B decode rows of B sequences, one query each: row b is cpu_attention_paged(out + b *
// q_dim, q + b * q_dim, kv[b], pg[b], 1, s, last_scores[b]) bit for bit (the same plan and
// jobs per row), but every row's jobs share one parallel region. A row's short context is
// one job, which cpu_attention_paged runs on the calling thread alone; here the rows'
// jobs spread over the team.
void cpu_attention_rows(float *out, const float *q, const kv_span *kv, const kv_pages *pg, int B, attn_shape s,
                        float *const *last_scores) {
    size_t q_dim = (size_t)s.n_heads * s.head_dim, stride = (size_t)ATT_MAX_ROWS * (2 + s.head_dim);
    attn_plan *p = malloc(sizeof *p * (size_t)B);
    attn_args *a = malloc(sizeof *a * (size_t)B);
    int *first = malloc(sizeof(int) * ((size_t)B + 1));
    size_t *part_at = malloc(sizeof(size_t) * (size_t)B);
    if (!p || !a || !first || !part_at) {  // no memory: row by row
        free(p), free(a), free(first), free(part_at);
        for (int b = 0; b < B; b++)
            cpu_attention_paged(out + b * q_dim, q + b * q_dim, kv[b], pg[b], 1, s, last_scores ? last_scores[b] : NULL);
        return;
    }
    size_t parts = 0;
    long work = 0;
    for (int b = 0; b < B; b++) {
        int total = kv[b].n_trunk + kv[b].n_tail;
        a[b] = (attn_args){ kv[b], s, s.n_kv_heads * s.head_dim, pg[b] };
        p[b] = attn_make_plan(1, total, s);
        if (p[b].splits > 1) parts += (size_t)p[b].jobs * stride;
        work += (long)s.n_heads * total * s.head_dim;
    }
    float *part = parts ? malloc(sizeof(float) * parts) : NULL;
    first[0] = 0;
    parts = 0;
    for (int b = 0; b < B; b++) {
        if (!part && p[b].splits > 1) attn_unsplit(&p[b], s);  // no memory for partials, as cpu_attention_paged
        part_at[b] = parts;
        if (p[b].splits > 1) parts += (size_t)p[b].jobs * stride;
        first[b + 1] = first[b] + p[b].jobs;
    }
    attn_tile_fn *tile_fn = attn_pick();
    size_t scratch_floats = 2 * ATT_MAX_ROWS + ATT_MAX_ROWS * ATT_BK + (size_t)(2 * ATT_MAX_ROWS + 2 * ATT_BK) * s.head_dim;
#pragma omp parallel if (first[B] > 1 && attn_parallel_work(work))
    {
        float *scratch = malloc(sizeof(float) * scratch_floats);
#pragma omp for schedule(dynamic, 1)
        for (int job = 0; job < first[B]; job++) {
            int b = 0;
            while (first[b + 1] <= job) b++;
            float *rp = p[b].splits > 1 ? part + part_at[b] : NULL;
            if (scratch)
                attn_run_job(out + b * q_dim, q + b * q_dim, &a[b], &p[b], last_scores ? last_scores[b] : NULL, tile_fn,
                             job - first[b], scratch, rp);
        }
        free(scratch);
    }
    for (int b = 0; part && b < B; b++)
        if (p[b].splits > 1) attn_merge(out + b * q_dim, q + b * q_dim, &p[b], s, part + part_at[b]);
    free(part), free(p), free(a), free(first), free(part_at);
}

// ---- entropix attention statistics -------------------------------------------------------
// Natural-log partition function of x[n] (max-shifted), in double.
static double log_sum_exp(const float *x, int n) {
    double mx = x[0], s = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > mx) mx = x[i];
    for (int i = 0; i < n; i++) s += exp((double)x[i] - mx);
    return mx + log(s);
}

// ws: mean probability per key [n_keys], then per-head lse and entropy [n_heads] each.
void cpu_attn_stats(double out4[4], const float *scores, int n_heads, int n_keys, double *ws) {
    out4[0] = out4[1] = out4[2] = out4[3] = 0;
    if (n_keys <= 0 || n_heads <= 0) return;
    double *mean = ws, *lse = mean + n_keys, *ent = lse + n_heads, inter = 0;
    for (int j = 0; j < n_keys; j++) mean[j] = 0;
    for (int h = 0; h < n_heads; h++) {
        const float *s = scores + (size_t)h * n_keys;
        lse[h] = log_sum_exp(s, n_keys);
        double e = 0;
        for (int j = 0; j < n_keys; j++) {
            double a = exp((double)s[j] - lse[h]);
            double ac = a < 1e-10 ? 1e-10 : a > 1 ? 1 : a;  // entropix's clip inside the log
            e -= a * log2(ac);
            mean[j] += a / n_heads;
            inter += fabs((double)s[j]);
        }
        ent[h] = e;
    }
    double em = 0, ev = 0, agree = 0;
    for (int h = 0; h < n_heads; h++) em += ent[h] / n_heads;
    for (int h = 0; h < n_heads; h++) ev += (ent[h] - em) * (ent[h] - em) / n_heads;
    for (int h = 0; h < n_heads; h++) {
        const float *s = scores + (size_t)h * n_keys;
        for (int j = 0; j < n_keys; j++) agree += fabs(exp((double)s[j] - lse[h]) - mean[j]);
    }
    double cells = (double)n_heads * n_keys;
    out4[0] = em, out4[1] = ev, out4[2] = agree / cells, out4[3] = inter / cells;
}
