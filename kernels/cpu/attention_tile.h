// attention_tile.h: the attention kernel body, included by attention.c once per
// instruction set (each under its own `#pragma GCC target`), so one binary carries an
// AVX-512, an AVX2 and a portable build of the same source and picks one at run time.
// The includer defines ATT_V (a GCC vector type of ATT_VW floats), ATT_VI and ATT_VH (the
// same lanes of int and of bf16 bits) and ATT_FN(name).
//
// One call: the rows of a tile (tokens t0..t1 of every head of kv head g, so the heads
// of a GQA group and the tokens of a prefill tile share each K and V load) against keys
// ka..kb, in blocks of ATT_BK keys, with the online softmax: per row the running max m,
// the running sum l and the unnormalised output o. The caller normalises or merges.

static inline ATT_V ATT_FN(vload)(const float *p) {
    ATT_V v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void ATT_FN(vstore)(float *p, ATT_V v) { memcpy(p, &v, sizeof v); }
// A tree of shuffles and adds (a loop over the lanes would be a chain of dependent adds).
static inline float ATT_FN(hsum)(ATT_V v) {
    ATT_VI idx = { 0 };
    for (int w = ATT_VW / 2; w >= 1; w /= 2) {
        for (int i = 0; i < ATT_VW; i++) idx[i] = i ^ w;
        v += __builtin_shuffle(v, idx);
    }
    return v[0];
}

#include "kernels/cpu/vexp.h"

// Key or value row j (trunk, then tail) of a cache whose elements are esize bytes; a
// paged trunk's rows go through its block table. One copy per instruction set, so that
// it inlines into the loops that read a row per key.
static inline const void *ATT_FN(kv_row)(const attn_args *a, const void *trunk, const void *tail, int j, int kv_dim,
                                         size_t esize) {
    if (j >= a->kv.n_trunk) return (const char *)tail + (size_t)(j - a->kv.n_trunk) * kv_dim * esize;
    size_t row = (size_t)j;
    if (a->pg.blocks) {
        int sh = a->pg.shift;
        row = ((size_t)a->pg.blocks[j >> sh] << sh) | (size_t)(j & ((1 << sh) - 1));
    }
    return (const char *)trunk + row * kv_dim * esize;
}

// Head g's slice of key or value row j as floats: an fp32 cache row in place, a bf16 one
// widened into buf (exactly: a bf16 is the top half of the float it stands for).
static const float *ATT_FN(kv_head)(const attn_args *a, const void *trunk, const void *tail, int j, int g, float *buf) {
    int hd = a->s.head_dim;
    size_t esize = a->kv.bf16 ? 2 : 4;
    const char *row = (const char *)ATT_FN(kv_row)(a, trunk, tail, j, a->kv_dim, esize) + (size_t)g * hd * esize;
    if (!a->kv.bf16) return (const float *)row;
    const uint16_t *h = (const uint16_t *)row;
    int i = 0;
    for (; i + ATT_VW <= hd; i += ATT_VW) {
        ATT_VH x;
        memcpy(&x, h + i, sizeof x);
        ATT_VI wide = __builtin_convertvector(x, ATT_VI) << 16;
        ATT_FN(vstore)(buf + i, (ATT_V)wide);
    }
    for (; i < hd; i++) {
        uint32_t u = (uint32_t)h[i] << 16;
        memcpy(buf + i, &u, sizeof u);
    }
    return buf;
}

// Lanes i.. (one element) of a cache row as floats: an fp32 row in place, a bf16 row
// widened in registers. Inlined with a constant bf16, each caller gets one loop per type;
// the scalar tails use explicit fmaf, so both types contract alike and a bf16 cache
// gives an fp32 cache's bits (test_cpu_attention).
static inline __attribute__((always_inline)) ATT_V ATT_FN(rowload)(const void *p, int i, int bf16) {
    if (!bf16) return ATT_FN(vload)((const float *)p + i);
    ATT_VH x;
    memcpy(&x, (const uint16_t *)p + i, sizeof x);
    return (ATT_V)(__builtin_convertvector(x, ATT_VI) << 16);
}
static inline __attribute__((always_inline)) float ATT_FN(rowelem)(const void *p, int i, int bf16) {
    if (!bf16) return ((const float *)p)[i];
    uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#define ATT_RB 4  // rows per register block of P @ V

// o[r][i0 .. i0 + nvec * ATT_VW) = o * corr + sum_j p[j][r] v_j for ATT_RB rows (rows
// past nr repeat the last and are not stored); p[j][r] = pr[j * sj + r * sr]. vp: fp32
// rows, or bf16 rows when bf16.
static inline __attribute__((always_inline)) void ATT_FN(rows_values_block)(float *o, int hd, int r0, int nr, int i0,
                                                                             int nvec, const float *pr, int sj, int sr,
                                                                             int nb, const void *const *vp,
                                                                             const float *corr, int bf16) {
    ATT_V c[ATT_RB][ATT_IV];
    int row[ATT_RB];
    for (int rr = 0; rr < ATT_RB; rr++) {
        row[rr] = r0 + (rr < nr ? rr : nr - 1);
        for (int iv = 0; iv < nvec; iv++)
            c[rr][iv] = ATT_FN(vload)(o + (size_t)row[rr] * hd + i0 + iv * ATT_VW) * corr[row[rr]];
    }
    for (int j = 0; j < nb; j++) {
        ATT_V v[ATT_IV];
        for (int iv = 0; iv < nvec; iv++) v[iv] = ATT_FN(rowload)(vp[j], i0 + iv * ATT_VW, bf16);
        for (int rr = 0; rr < ATT_RB; rr++) {
            float p = pr[(size_t)j * sj + (size_t)row[rr] * sr];
            for (int iv = 0; iv < nvec; iv++) c[rr][iv] += p * v[iv];
        }
    }
    for (int rr = 0; rr < nr; rr++)
        for (int iv = 0; iv < nvec; iv++) ATT_FN(vstore)(o + (size_t)row[rr] * hd + i0 + iv * ATT_VW, c[rr][iv]);
}

// P @ V for n rows, the outputs in register blocks across the key block (o = o * corr +
// P V): each V row is loaded once per ATT_RB rows, each output once per block.
static inline __attribute__((always_inline)) void ATT_FN(rows_values_t)(float *o, int hd, int n, const float *pr,
                                                                         int sj, int sr, int nb,
                                                                         const void *const *vp, const float *corr,
                                                                         int bf16) {
    for (int r0 = 0; r0 < n; r0 += ATT_RB) {
        int nr = n - r0 < ATT_RB ? n - r0 : ATT_RB, i = 0;
        for (; i + ATT_IV * ATT_VW <= hd; i += ATT_IV * ATT_VW)
            ATT_FN(rows_values_block)(o, hd, r0, nr, i, ATT_IV, pr, sj, sr, nb, vp, corr, bf16);
        for (; i + ATT_VW <= hd; i += ATT_VW)
            ATT_FN(rows_values_block)(o, hd, r0, nr, i, 1, pr, sj, sr, nb, vp, corr, bf16);
        for (int r = r0; r < r0 + nr; r++)  // the head_dim tail
            for (int t = i; t < hd; t++) {
                float acc = o[(size_t)r * hd + t] * corr[r];
                for (int j = 0; j < nb; j++)
                    acc = __builtin_fmaf(pr[(size_t)j * sj + (size_t)r * sr], ATT_FN(rowelem)(vp[j], t, bf16), acc);
                o[(size_t)r * hd + t] = acc;
            }
    }
}

// vp: fp32 rows (a prefill tile's widened ones included), or bf16 rows when bf16.
static void ATT_FN(rows_values)(float *o, int hd, int n, const float *pr, int sj, int sr, int nb,
                                const void *const *vp, const float *corr, int bf16) {
    if (bf16) ATT_FN(rows_values_t)(o, hd, n, pr, sj, sr, nb, vp, corr, 1);
    else ATT_FN(rows_values_t)(o, hd, n, pr, sj, sr, nb, vp, corr, 0);
}

// Head g's key or value rows j0..j0+nb: in place (fp32 cache) or widened into wide.
static void ATT_FN(rows_kv)(const attn_args *a, const void *trunk, const void *tail, int g, int j0, int nb,
                            const float **p, float *wide) {
    for (int j = 0; j < nb; j++) p[j] = ATT_FN(kv_head)(a, trunk, tail, j0 + j, g, wide + (size_t)j * a->s.head_dim);
}

// Head g's key or value rows j0..j0+nb in place, in the cache's own type (decode reads
// bf16 rows widened in registers: a widened copy cost more than the bytes it saved).
static void ATT_FN(rows_raw)(const attn_args *a, const void *trunk, const void *tail, int g, int j0, int nb,
                             const void **p) {
    size_t esize = a->kv.bf16 ? 2 : 4, off = (size_t)g * a->s.head_dim * esize;
    for (int j = 0; j < nb; j++)
        p[j] = (const char *)ATT_FN(kv_row)(a, trunk, tail, j0 + j, a->kv_dim, esize) + off;
}

// The shuffles that sum ATT_VW vectors' lanes into one vector (lane k: the sum of vector
// k), in log2(ATT_VW) levels. Before level l each key's partial sums fill P = ATT_VW >> l
// lanes and a vector holds K = ATT_VW / P keys; a level merges vector pairs (2v, 2v+1)
// into one vector of 2K keys of P/2 lanes. lo[l] and hi[l] pick the two halves.
static int ATT_FN(reduce_masks)(ATT_VI *lo, ATT_VI *hi) {
    int levels = 0;
    for (int P = ATT_VW; P > 1; P /= 2, levels++) {
        int K = ATT_VW / P;
        for (int o = 0; o < ATT_VW; o++) {
            int key = o / (P / 2), part = o % (P / 2);
            lo[levels][o] = (key < K ? 0 : ATT_VW) + (key % K) * P + part;
            hi[levels][o] = lo[levels][o] + P / 2;
        }
    }
    return levels;
}

static inline ATT_V ATT_FN(reduce_lanes)(ATT_V *c, const ATT_VI *lo, const ATT_VI *hi, int levels) {
    for (int l = 0, n = ATT_VW; l < levels; l++, n /= 2)
        for (int v = 0; v < n / 2; v++)
            c[v] = __builtin_shuffle(c[2 * v], c[2 * v + 1], lo[l]) + __builtin_shuffle(c[2 * v], c[2 * v + 1], hi[l]);
    return c[0];
}

// Row q against ATT_VW keys k[]: their dot products as one vector, with no horizontal
// sum per key (decode's rows are too few to fill the lanes the other way).
static inline __attribute__((always_inline)) ATT_V ATT_FN(dots_vw)(const float *q, const void *const *k, int hd,
                                                                    const ATT_VI *lo, const ATT_VI *hi, int levels,
                                                                    int bf16) {
    ATT_V c[ATT_VW];
    for (int jj = 0; jj < ATT_VW; jj++) c[jj] = (ATT_V){ 0 };
    int i = 0;
    for (; i + ATT_VW <= hd; i += ATT_VW) {
        ATT_V qv = ATT_FN(vload)(q + i);
        for (int jj = 0; jj < ATT_VW; jj++) c[jj] += qv * ATT_FN(rowload)(k[jj], i, bf16);
    }
    ATT_V d = ATT_FN(reduce_lanes)(c, lo, hi, levels);
    for (; i < hd; i++)
        for (int jj = 0; jj < ATT_VW; jj++) d[jj] = __builtin_fmaf(q[i], ATT_FN(rowelem)(k[jj], i, bf16), d[jj]);
    return d;
}

// Scores of one key block: s[r * ATT_BK + j - j0] = q_r . k_j * scale, -inf past a row's
// causal limit; the last token's rows also go to the capture (raw, as cpu_attention says).
// kp: room for the block's key rows.
static inline __attribute__((always_inline)) void ATT_FN(block_scores_t)(const attn_args *a, const attn_rows *w,
                                                                          int j0, int j1, float *s, const void **kp,
                                                                          int bf16) {
    int hd = a->s.head_dim, nb = j1 - j0;
    ATT_VI lo[8] = { { 0 } }, hi[8] = { { 0 } };
    int levels = ATT_FN(reduce_masks)(lo, hi);
    ATT_FN(rows_raw)(a, a->kv.k_trunk, a->kv.k_tail, w->g, j0, nb, kp);
    for (int r = 0; r < w->n; r++) {
        const float *q = w->q[r];
        float *sr = s + r * ATT_BK;
        int j = 0;
        for (; j + ATT_VW <= nb; j += ATT_VW) {
            ATT_V d = ATT_FN(dots_vw)(q, kp + j, hd, lo, hi, levels, bf16) * a->s.scale;
            ATT_FN(vstore)(sr + j, d);
        }
        for (; j < nb; j++) {
            ATT_V acc = { 0 };
            int i = 0;
            for (; i + ATT_VW <= hd; i += ATT_VW) acc += ATT_FN(vload)(q + i) * ATT_FN(rowload)(kp[j], i, bf16);
            float d = ATT_FN(hsum)(acc);
            for (; i < hd; i++) d = __builtin_fmaf(q[i], ATT_FN(rowelem)(kp[j], i, bf16), d);
            sr[j] = d * a->s.scale;
        }
        if (w->cap[r]) memcpy(w->cap[r] + j0, sr, sizeof(float) * (size_t)nb);
        for (j = w->limit[r] - j0 > 0 ? w->limit[r] - j0 : 0; j < nb; j++) sr[j] = -INFINITY;
    }
}

static void ATT_FN(block_scores)(const attn_args *a, const attn_rows *w, int j0, int j1, float *s, const void **kp) {
    if (a->kv.bf16) ATT_FN(block_scores_t)(a, w, j0, j1, s, kp, 1);
    else ATT_FN(block_scores_t)(a, w, j0, j1, s, kp, 0);
}

// Folds a block's scores s into row r's running max, sum and output scale; s becomes
// the block's probabilities (unnormalised). Returns the factor o_r must be scaled by.
static float ATT_FN(block_softmax)(float *s, int nb, float *m, float *l) {
    float mb = -INFINITY;
    for (int j = 0; j < nb; j++) mb = s[j] > mb ? s[j] : mb;
    float mn = mb > *m ? mb : *m;
    if (mn == -INFINITY) {  // every key so far is masked for this row
        for (int j = 0; j < nb; j++) s[j] = 0;
        return 1;
    }
    float corr = *m == -INFINITY ? 0 : expf(*m - mn), sum = 0;
    int j = 0;
    ATT_V vs = { 0 };
    for (; j + ATT_VW <= nb; j += ATT_VW) {
        ATT_V p = ATT_FN(vexp)(ATT_FN(vload)(s + j) - mn);
        ATT_FN(vstore)(s + j, p);
        vs += p;
    }
    sum = ATT_FN(hsum)(vs);
    for (; j < nb; j++) sum += s[j] = s[j] == -INFINITY ? 0 : expf(s[j] - mn);
    *m = mn, *l = *l * corr + sum;
    return corr;
}

// The tile's rows against keys ka..kb: m, l, o (n x head_dim) start empty and end as
// the online-softmax state. s: scratch of n * ATT_BK floats; o is followed by room for
// a block of widened bf16 keys and one of values (attention.c's scratch).
static void ATT_FN(attn_tile)(const attn_args *a, const attn_rows *w, int ka, int kb, float *m, float *l, float *o,
                              float *s) {
    int hd = a->s.head_dim;
    float corr[ATT_MAX_ROWS];
    const void *kp[ATT_BK], *vp[ATT_BK];
    for (int r = 0; r < w->n; r++) m[r] = -INFINITY, l[r] = 0;
    memset(o, 0, sizeof(float) * (size_t)w->n * hd);
    for (int j0 = ka; j0 < kb; j0 += ATT_BK) {
        int j1 = j0 + ATT_BK < kb ? j0 + ATT_BK : kb;
        ATT_FN(block_scores)(a, w, j0, j1, s, kp);
        for (int r = 0; r < w->n; r++) corr[r] = ATT_FN(block_softmax)(s + r * ATT_BK, j1 - j0, &m[r], &l[r]);
        ATT_FN(rows_raw)(a, a->kv.v_trunk, a->kv.v_tail, w->g, j0, j1 - j0, vp);
        ATT_FN(rows_values)(o, hd, w->n, s, 1, ATT_BK, j1 - j0, vp, corr, a->kv.bf16);
    }
}

// Decode over every kv head at once (w->g < 0: the rows are the token's heads in order,
// w->n / n_kv_heads per kv head): each key block is done group after group, scores,
// softmax and P @ V, so the block's cache rows are read whole (every head's slice of a
// row lies in the same kv_dim-wide row) instead of one head's slice per pass over the
// whole cache, a stride that cost about a third of a decode step at depth 4096.
static void ATT_FN(attn_tile_sweep)(const attn_args *a, const attn_rows *w, int ka, int kb, float *m, float *l,
                                    float *o, float *s) {
    int hd = a->s.head_dim, nk = a->s.n_kv_heads, G = w->n / nk;
    float corr[ATT_MAX_ROWS];
    const void *kp[ATT_BK], *vp[ATT_BK];
    for (int r = 0; r < w->n; r++) m[r] = -INFINITY, l[r] = 0;
    memset(o, 0, sizeof(float) * (size_t)w->n * hd);
    attn_rows sub;  // group g's rows, as attn_tile sees a tile
    for (int j0 = ka; j0 < kb; j0 += ATT_BK) {
        int j1 = j0 + ATT_BK < kb ? j0 + ATT_BK : kb;
        for (int g = 0; g < nk; g++) {
            int r0 = g * G;
            sub.n = G, sub.g = g;
            memcpy(sub.q, w->q + r0, sizeof(*sub.q) * (size_t)G);
            memcpy(sub.cap, w->cap + r0, sizeof(*sub.cap) * (size_t)G);
            memcpy(sub.limit, w->limit + r0, sizeof(*sub.limit) * (size_t)G);
            ATT_FN(block_scores)(a, &sub, j0, j1, s, kp);
            for (int r = 0; r < G; r++) corr[r] = ATT_FN(block_softmax)(s + r * ATT_BK, j1 - j0, &m[r0 + r], &l[r0 + r]);
            ATT_FN(rows_raw)(a, a->kv.v_trunk, a->kv.v_tail, g, j0, j1 - j0, vp);
            ATT_FN(rows_values)(o + (size_t)r0 * hd, hd, G, s, 1, ATT_BK, j1 - j0, vp, corr, a->kv.bf16);
        }
    }
}
