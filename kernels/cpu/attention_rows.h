// attention_rows.h: the prefill body of the attention kernel, included by attention.c
// after attention_tile.h once per instruction set, with the same macros plus ATT_IV (the
// vectors of head_dim one register block holds: as many as the ISA's registers allow).
//
// A tile with at least ATT_VW rows (a prefill tile: tokens x the heads of a GQA group)
// puts its rows across the vector lanes instead of head_dim, so no step needs a
// horizontal sum:
//   - scores as a small GEMM, s^T[j][r] = sum_i k_j[i] * q^T[i][r], q^T made once per
//     tile, four keys and two row vectors per register block;
//   - the online softmax of ATT_VW rows as one vector (running max, sum and the scale);
//   - P @ V with four rows x ATT_IV vectors of head_dim in registers across the block.
// Padded rows (past w->n, up to a whole vector) have no keys and are never stored.
// Smaller tiles (decode: one token's heads) keep attention_tile.h's per-row path.

#define ATT_JB 4  // keys per register block of the scores

static inline ATT_V ATT_FN(vmax)(ATT_V a, ATT_V b) {
    ATT_VI gt = a > b;
    return (ATT_V)(((ATT_VI)a & gt) | ((ATT_VI)b & ~gt));
}

// (keep ? v : -inf) lane-wise.
static inline ATT_V ATT_FN(vmask)(ATT_V v, ATT_VI keep) {
    ATT_V ninf = (ATT_V){ 0 } - INFINITY;
    return (ATT_V)(((ATT_VI)v & keep) | ((ATT_VI)ninf & ~keep));
}

// q^T of the tile: qt[i * ATT_MAX_ROWS + r]; the padded rows up to np are zeros.
static void ATT_FN(rows_qt)(const attn_rows *w, int hd, int np, float *qt) {
    for (int i = 0; i < hd; i++) {
        float *d = qt + (size_t)i * ATT_MAX_ROWS;
        for (int r = 0; r < w->n; r++) d[r] = w->q[r][i];
        for (int r = w->n; r < np; r++) d[r] = 0;
    }
}

// Scores of ATT_JB keys k[] against row vectors v0 and v1 of q^T (v1 == v0: one vector),
// into st[j * ATT_MAX_ROWS + r], scaled.
static void ATT_FN(rows_scores_block)(const float *qt, int hd, const float *const *k, int nj, int v0, int v1, float scale,
                                      float *st) {
    ATT_V c0[ATT_JB], c1[ATT_JB];
    for (int jj = 0; jj < ATT_JB; jj++) c0[jj] = c1[jj] = (ATT_V){ 0 };
    for (int i = 0; i < hd; i++) {
        ATT_V q0 = ATT_FN(vload)(qt + (size_t)i * ATT_MAX_ROWS + v0 * ATT_VW);
        ATT_V q1 = ATT_FN(vload)(qt + (size_t)i * ATT_MAX_ROWS + v1 * ATT_VW);
        for (int jj = 0; jj < ATT_JB; jj++) {
            float kj = k[jj][i];
            c0[jj] += q0 * kj;
            c1[jj] += q1 * kj;
        }
    }
    for (int jj = 0; jj < nj; jj++) {
        ATT_FN(vstore)(st + (size_t)jj * ATT_MAX_ROWS + v0 * ATT_VW, c0[jj] * scale);
        ATT_FN(vstore)(st + (size_t)jj * ATT_MAX_ROWS + v1 * ATT_VW, c1[jj] * scale);
    }
}

// The block's raw scores s^T for nv row vectors; the last token's rows also go to the
// capture (raw, as cpu_attention says). The causal mask is the softmax's.
static void ATT_FN(rows_scores)(const attn_args *a, const attn_rows *w, int nv, const float *qt, const float **kp,
                                int j0, int nb, float *st) {
    for (int j = 0; j < nb; j += ATT_JB) {
        int nj = nb - j < ATT_JB ? nb - j : ATT_JB;
        const float *k[ATT_JB];
        for (int jj = 0; jj < ATT_JB; jj++) k[jj] = kp[j + (jj < nj ? jj : nj - 1)];  // repeats are dropped
        for (int v = 0; v < nv; v += 2) {
            int v1 = v + 1 < nv ? v + 1 : v;
            ATT_FN(rows_scores_block)(qt, a->s.head_dim, k, nj, v, v1, a->s.scale, st + (size_t)j * ATT_MAX_ROWS);
        }
    }
    for (int r = 0; r < w->n; r++)
        if (w->cap[r])
            for (int j = 0; j < nb; j++) w->cap[r][j0 + j] = st[(size_t)j * ATT_MAX_ROWS + r];
}

// Masks the block's scores (key j0 + j is visible to row r below limit[r]), folds them
// into the rows' running max m and sum l, and turns them into probabilities. corr: the
// factor each row's output must be scaled by. A row with no key yet keeps m = -inf and
// l = 0 (its probabilities are 0, since every score is -inf).
static void ATT_FN(rows_softmax)(const int *limit, int nv, int j0, int nb, float *st, float *m, float *l, float *corr) {
    for (int v = 0; v < nv; v++) {
        ATT_VI lim;
        for (int r = 0; r < ATT_VW; r++) lim[r] = limit[v * ATT_VW + r];
        ATT_V mb = (ATT_V){ 0 } - INFINITY;
        for (int j = 0; j < nb; j++) {
            float *p = st + (size_t)j * ATT_MAX_ROWS + v * ATT_VW;
            ATT_V s = ATT_FN(vmask)(ATT_FN(vload)(p), lim > j0 + j);
            ATT_FN(vstore)(p, s);
            mb = ATT_FN(vmax)(mb, s);
        }
        ATT_V mo = ATT_FN(vload)(m + v * ATT_VW), mn = ATT_FN(vmax)(mo, mb);
        ATT_VI none = mn == (ATT_V){ 0 } - INFINITY;
        ATT_V base = (ATT_V)((ATT_VI)mn & ~none);  // 0 where no key is visible yet: exp(-inf) = 0
        ATT_V sum = { 0 };
        for (int j = 0; j < nb; j++) {
            float *p = st + (size_t)j * ATT_MAX_ROWS + v * ATT_VW;
            ATT_V e = ATT_FN(vexp)(ATT_FN(vload)(p) - base);
            ATT_FN(vstore)(p, e);
            sum += e;
        }
        ATT_V c = ATT_FN(vexp)(mo - base);
        ATT_FN(vstore)(m + v * ATT_VW, mn);
        ATT_FN(vstore)(l + v * ATT_VW, ATT_FN(vload)(l + v * ATT_VW) * c + sum);
        ATT_FN(vstore)(corr + v * ATT_VW, c);
    }
}

// The tile's rows against keys ka..kb, rows across the lanes (same contract as
// attn_tile). o is followed by room for q^T and a block of widened K and V rows
// (attention.c: ATT_EXTRA).
static void ATT_FN(attn_tile_rows)(const attn_args *a, const attn_rows *w, int ka, int kb, float *m, float *l, float *o,
                                   float *st) {
    int hd = a->s.head_dim, nv = (w->n + ATT_VW - 1) / ATT_VW;
    float *qt = o + (size_t)ATT_MAX_ROWS * hd, *wk = qt + (size_t)ATT_MAX_ROWS * hd, *wv = wk + (size_t)ATT_BK * hd;
    float corr[ATT_MAX_ROWS];
    int limit[ATT_MAX_ROWS];
    const float *kp[ATT_BK], *vp[ATT_BK];
    for (int r = 0; r < ATT_MAX_ROWS; r++) {
        m[r] = -INFINITY, l[r] = 0;
        limit[r] = r < w->n ? w->limit[r] : 0;
    }
    memset(o, 0, sizeof(float) * (size_t)w->n * hd);
    ATT_FN(rows_qt)(w, hd, nv * ATT_VW, qt);
    for (int j0 = ka; j0 < kb; j0 += ATT_BK) {
        int nb = kb - j0 < ATT_BK ? kb - j0 : ATT_BK;
        ATT_FN(rows_kv)(a, a->kv.k_trunk, a->kv.k_tail, w->g, j0, nb, kp, wk);
        ATT_FN(rows_scores)(a, w, nv, qt, kp, j0, nb, st);
        ATT_FN(rows_softmax)(limit, nv, j0, nb, st, m, l, corr);
        ATT_FN(rows_kv)(a, a->kv.v_trunk, a->kv.v_tail, w->g, j0, nb, vp, wv);
        ATT_FN(rows_values)(o, hd, w->n, st, ATT_MAX_ROWS, 1, nb, (const void *const *)vp, corr, 0);  // widened
    }
}

// The tile body for this ISA: rows across the lanes when they fill a vector.
static void ATT_FN(attn_run_tile)(const attn_args *a, const attn_rows *w, int ka, int kb, float *m, float *l, float *o,
                                  float *s) {
    if (w->g < 0) ATT_FN(attn_tile_sweep)(a, w, ka, kb, m, l, o, s);
    else if (w->n >= ATT_VW) ATT_FN(attn_tile_rows)(a, w, ka, kb, m, l, o, s);
    else ATT_FN(attn_tile)(a, w, ka, kb, m, l, o, s);
}

#undef ATT_JB
#undef ATT_RB
