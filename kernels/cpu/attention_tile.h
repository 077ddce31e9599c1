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
    ATT_VI idx;
    for (int w = ATT_VW / 2; w >= 1; w /= 2) {
        for (int i = 0; i < ATT_VW; i++) idx[i] = i ^ w;
        v += __builtin_shuffle(v, idx);
    }
    return v[0];
}

// e^x lane-wise for x <= 0: |rel err| < 3e-7 down to -87, 0 below (and at -inf).
// Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, then the degree-6 Taylor polynomial.
static inline ATT_V ATT_FN(vexp)(ATT_V x) {
    ATT_VI under = x < -87.0f;  // lanes of -1 where the result is 0
    ATT_V xc = (ATT_V)(((ATT_VI)x & ~under) | ((ATT_VI)((ATT_V){ 0 } - 87.0f) & under));
    ATT_VI ni = __builtin_convertvector(xc * 1.44269504f - 0.5f, ATT_VI);  // round: x <= 0
    ATT_V n = __builtin_convertvector(ni, ATT_V);
    ATT_V r = xc - n * 0.693145752f - n * 1.42860677e-6f;
    ATT_V p = (ATT_V){ 0 } + 1.0f / 720;
    p = p * r + 1.0f / 120, p = p * r + 1.0f / 24, p = p * r + 1.0f / 6, p = p * r + 0.5f;
    p = p * r + 1.0f, p = p * r + 1.0f;
    ATT_VI scale = (ni + 127) << 23;  // 2^n as float bits
    return (ATT_V)((ATT_VI)(p * (ATT_V)scale) & ~under);
}

// Head g's slice of key or value row j as floats: an fp32 cache row in place, a bf16 one
// widened into buf (exactly: a bf16 is the top half of the float it stands for).
static const float *ATT_FN(kv_head)(const attn_args *a, const void *trunk, const void *tail, int j, int g, float *buf) {
    int hd = a->s.head_dim;
    size_t esize = a->kv.bf16 ? 2 : 4;
    const char *row = (const char *)attn_kv_row(trunk, tail, a->kv.n_trunk, j, a->kv_dim, esize) + (size_t)g * hd * esize;
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

// Scores of one key block: s[r * ATT_BK + j - j0] = q_r . k_j * scale, -inf past a row's
// causal limit; the last token's rows also go to the capture (raw, as cpu_attention says).
static void ATT_FN(block_scores)(const attn_args *a, const attn_rows *w, int j0, int j1, float *s, float *buf) {
    int hd = a->s.head_dim;
    for (int j = j0; j < j1; j++) {
        const float *k = ATT_FN(kv_head)(a, a->kv.k_trunk, a->kv.k_tail, j, w->g, buf);
        for (int r = 0; r < w->n; r++) {
            const float *q = w->q[r];
            ATT_V acc = { 0 };
            int i = 0;
            for (; i + ATT_VW <= hd; i += ATT_VW) acc += ATT_FN(vload)(q + i) * ATT_FN(vload)(k + i);
            float d = ATT_FN(hsum)(acc);
            for (; i < hd; i++) d += q[i] * k[i];
            d *= a->s.scale;
            if (w->cap[r]) w->cap[r][j] = d;
            s[r * ATT_BK + j - j0] = j < w->limit[r] ? d : -INFINITY;
        }
    }
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

// o_r = o_r * corr_r + sum_j p[r][j] v_j over the block: each V row is loaded once for
// all the tile's rows.
static void ATT_FN(block_values)(const attn_args *a, const attn_rows *w, int j0, int j1, const float *p,
                                 const float *corr, float *o, float *buf) {
    int hd = a->s.head_dim;
    for (int r = 0; r < w->n; r++)
        if (corr[r] != 1)
            for (int i = 0; i < hd; i++) o[(size_t)r * hd + i] *= corr[r];
    for (int j = j0; j < j1; j++) {
        const float *v = ATT_FN(kv_head)(a, a->kv.v_trunk, a->kv.v_tail, j, w->g, buf);
        for (int r = 0; r < w->n; r++) {
            float pj = p[r * ATT_BK + j - j0];
            if (pj == 0) continue;
            float *orow = o + (size_t)r * hd;
            int i = 0;
            for (; i + ATT_VW <= hd; i += ATT_VW) ATT_FN(vstore)(orow + i, ATT_FN(vload)(orow + i) + pj * ATT_FN(vload)(v + i));
            for (; i < hd; i++) orow[i] += pj * v[i];
        }
    }
}

// The tile's rows against keys ka..kb: m, l, o (n x head_dim) start empty and end as
// the online-softmax state. s: scratch of n * ATT_BK floats; o is followed by room for
// one more head_dim row (a widened bf16 key or value).
static void ATT_FN(attn_tile)(const attn_args *a, const attn_rows *w, int ka, int kb, float *m, float *l, float *o,
                              float *s) {
    float corr[ATT_MAX_ROWS], *buf = o + (size_t)ATT_MAX_ROWS * a->s.head_dim;
    for (int r = 0; r < w->n; r++) m[r] = -INFINITY, l[r] = 0;
    memset(o, 0, sizeof(float) * (size_t)w->n * a->s.head_dim);
    for (int j0 = ka; j0 < kb; j0 += ATT_BK) {
        int j1 = j0 + ATT_BK < kb ? j0 + ATT_BK : kb;
        ATT_FN(block_scores)(a, w, j0, j1, s, buf);
        for (int r = 0; r < w->n; r++) corr[r] = ATT_FN(block_softmax)(s + r * ATT_BK, j1 - j0, &m[r], &l[r]);
        ATT_FN(block_values)(a, w, j0, j1, s, corr, o, buf);
    }
}
