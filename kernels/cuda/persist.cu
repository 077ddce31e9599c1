// persist.cu: the persistent decode kernel (ops_cuda.h, docs/cuda.md "The persistent
// decode kernel"). One cooperative launch runs a one-row decode step: every block is
// resident for the whole step and takes its share of each phase's work units in turn,
//   embed                     x = embed[id]                        units of 256 elements
//   per layer l:
//     qkv                     q|k|v = Wqkv rmsnorm(x) (+ bias)     rows (1 or 4 a warp)
//     attention               RoPE, KV store, splits, combine      (KV head, split) a block
//     o                       x += Wo att                          rows
//     gate|up                 h = silu(gate) * up, ffn norm folded 2 outputs a warp
//     down                    x += Wdown h                         rows
//   lm_head                   logits = W rmsnorm(x), argmax        rows
// A phase's units wait only for the units they read, through dataflow counters (a
// release add after a unit's stores, an acquire wait before a unit's loads) instead of
// grid barriers: a qkv row counts toward its KV group, and an attention split of that
// group waits for the group's rows only; o waits for every head's combine, gate|up for
// all of x, down for all of h, the next layer's qkv for all of x again. Each unit is
// computed by the graph path's own device functions (matvec.cuh, attention_decode.cuh),
// so the logits are the graph path's bits. While a warp waits for its first unit's
// inputs, that unit's first weight chunks are already in flight (the matvec's loads
// before wait()), and an attention split's first K/V tile (old cache rows); and each
// warp's first unit of a matvec phase copies the first chunks of its weight rows into
// the warp's slice of a shared-memory ring (cp.async, matvec.cuh's mv_ring) before its
// wait, so the next phase's weights stream while the phase before still runs. A vector
// matvec phase is waited for a block at a time where its input fits the block's shared
// memory: one thread polls the counter, and the block copies the input vector there
// once, where its four warps read it (through L2 once per row otherwise, twice the
// weights' bytes for a one-row unit). The last
// block to finish turns the packed argmax into the greedy draw and sets every counter
// back to zero for the next launch. Only what other blocks of the launch wrote is read
// through L2 (ld.global.cg), never the non-coherent path. With plan.trace, thread 0 of
// each block stamps every phase's entry, first wait and exit (model/cuda/persist_trace.c).
#define KERNEL_FRESH_IDS  // common.cuh: k_tid() and friends are not hoisted out of the layer loop
#include "kernels/cuda/attention_decode.cuh"
#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/sync.cuh"

#define PK_THREADS 128  // ATT_THREADS == 32 * MV_WARPS: a block is an attention split or 4 matvec warps
#define PK_CTR_STRIDE 32  // unsigneds between counters: one 128-byte line each, so the warps polling
                         // one counter do not share its line with the adds to another
#define PK_STATIC_SMEM 256  // bytes of static shared memory set aside (the kernel's flags)
static_assert(PK_THREADS == ATT_THREADS && PK_THREADS == 32 * MV_WARPS, "one block shape for every phase");

// What the host works out for the kernel beside the plan.
struct pk_args {
    cuda_persist_plan p;
    int k_qkv, k_o, k_gu, k_down, k_lm;  // MV_SCALAR, MV_VEC or MV_VEC4 (mv_kind: the graph path's choice)
    int q_dim, qkv_dim;            // n_heads * head_dim, and q_dim + 2 * n_kv * head_dim: kernel
                                   // parameters, read where used rather than kept in registers
    int group;                     // n_heads / n_kv (G), likewise
    int n_splits, tile;            // the attention's splits (the grid's), and the generic split kernel's tile
    int kps;                       // keys per live split (split_keys)
    float *part;                   // attention partials (ctx->scratch)
    unsigned *count;               // the attention's combine counters (ctx->att_count)
    int ring_off, ring_cap;        // the weight ring: bytes into the dynamic shared memory, and
                                   // 16-byte chunks a warp (0: none)
    int xs_cap;                    // floats of a phase's input a block stages (0: none); at the
                                   // start of the dynamic shared memory, over the attention's
    unsigned sleep_ns;             // a counter wait's pause between polls (0: none)
    int ahead;                     // a staged phase fills the ring a unit ahead (pk_staged)
    int deep;                      // staged one-row units of 2048+ inputs keep 8 chunks a lane in
                                   // flight (ctx->mv_deep, as the graph path's deep matvec; the
                                   // same bits; the unstaged units stay at 4, for registers)
};

// The dynamic shared memory: the attention's, or a phase's staged input, from the
// start; the weight ring at a.ring_off. The phases find their parts here rather than
// hold pointers across the layer loop (registers the attention phase wants).
__device__ inline float4 *pk_smem() {
    extern __shared__ float4 pk_dyn[];
    return pk_dyn;
}

// This warp's slice of the weight ring (s NULL: none).
__device__ inline mv_ring pk_ring(const pk_args &a) {
    if (!a.ring_cap) return mv_ring{ NULL, 0 };
    uint4 *base = (uint4 *)((char *)pk_smem() + a.ring_off);
    return mv_ring{ base + (size_t)(k_tid() >> 5) * a.ring_cap, a.ring_cap };
}
// A phase's staged input (pk_stage).
__device__ inline float *pk_xs() { return (float *)pk_smem(); }

// Counters: per layer [qkv of each KV group | heads combined | o rows | h outputs | down
// rows], then embedded elements, then finished blocks; PK_CTR_STRIDE apart.
__host__ __device__ inline int pk_per_layer(const cuda_persist_plan &p) { return p.n_kv + 4; }
__device__ inline unsigned *pk_ctr(const cuda_persist_plan &p, int l, int slot) {
    return p.ctr + ((size_t)l * pk_per_layer(p) + slot) * PK_CTR_STRIDE;
}
enum { PK_ATT = 0, PK_O = 1, PK_GLU = 2, PK_DOWN = 3 };  // after the n_kv group counters
__device__ inline unsigned *pk_layer(const cuda_persist_plan &p, int l, int what) {
    return pk_ctr(p, l, p.n_kv + what);
}
__device__ inline unsigned *pk_embed(const cuda_persist_plan &p) { return pk_ctr(p, p.n_layers, 0); }
__device__ inline unsigned *pk_done(const cuda_persist_plan &p) { return pk_ctr(p, p.n_layers, 1); }

// The counter and target of x as layer l's input: the embedding, or layer l-1's down rows.
__device__ inline const unsigned *pk_x_ready(const cuda_persist_plan &p, int l) {
    return l == 0 ? pk_embed(p) : pk_layer(p, l - 1, PK_DOWN);
}

// The phase trace (p.trace; ops_cuda.h cuda_persist_trace_len): thread 0's stamps, each
// only when the plan asks for them. pk_trace_at: a phase's entry (which 0, the block's
// wait slot cleared) or exit (2, with the wait slot's stamp as 1).
__host__ __device__ inline int pk_phases(const cuda_persist_plan &p) { return 5 * p.n_layers + 2; }
// p.trace, read afresh at each use as k_tid() is (the test would otherwise be hoisted out
// of the layer loop and held, or spilled, across every phase).
__device__ __forceinline__ unsigned long long *pk_trace_ptr(const cuda_persist_plan &p) {
#if defined(__CUDA_ARCH__)
    unsigned long long *t;
    asm volatile("mov.b64 %0, %1;" : "=l"(t) : "l"(p.trace));
    return t;
#else
    return p.trace;
#endif
}
__device__ inline unsigned long long *pk_wait_slot(const cuda_persist_plan &p) {
    unsigned long long *t = pk_trace_ptr(p);
    return t ? t + k_bid() : NULL;
}
__device__ void pk_trace_at(const cuda_persist_plan &p, int phase, int which) {
    unsigned long long *t = pk_trace_ptr(p);
    if (!t || k_tid() != 0) return;
    unsigned long long *w = t + k_bid(), *slot = t + (k_grid() + ((unsigned)phase * k_grid() + k_bid()) * 3u);
    if (which == 0) {
        *w = 0;
        slot[0] = globaltimer_ns();
        return;
    }
    slot[1] = *w;
    slot[2] = globaltimer_ns();
}
// After a wait of thread 0 (w: pk_wait_slot, NULL without a trace): the phase's first.
__device__ __forceinline__ void pk_trace_waited(unsigned long long *w) {
    if (w && *w == 0) *w = globaltimer_ns();
}

// A warp's wait before its first unit: lane 0 waits (acquire), the warp follows.
struct warp_waiter {
    const unsigned *ctr;
    unsigned target;
    bool *first;  // true until the warp's first unit has waited
    unsigned sleep_ns;
    unsigned long long *tw;  // the phase trace's wait slot (pk_wait_slot)
    __device__ __forceinline__ void operator()() const {
        if (!*first) return;
        *first = false;
        if ((k_tid() & 31) == 0) wait_counter_gpu(ctr, target, sleep_ns);
        if (k_tid() == 0) pk_trace_waited(tw);
        __syncwarp();
    }
};

// A block's wait: thread 0 waits (acquire), the block follows.
struct block_waiter {
    const unsigned *ctr;
    unsigned target;
    unsigned sleep_ns;
    unsigned long long *tw;  // the phase trace's wait slot (pk_wait_slot)
    __device__ __forceinline__ void operator()() const {
        if (k_tid() == 0) {
            wait_counter_gpu(ctr, target, sleep_ns);
            pk_trace_waited(tw);
        }
        __syncthreads();
    }
};

// A staged phase's wait (pk_stages), before any of the block's units: thread 0 waits
// (acquire), the block follows, and its threads copy src (n floats, n % 8 == 0, written
// by other blocks) into xs, shared, where the block's warps read it. The copies are
// cp.async, all in flight at once and through L2 as __ldcg; their wait also lands each
// warp's ring copies, issued before. No weights are held in registers across it (the
// ring holds what was fetched ahead), so it costs the matvec loops no registers.
__device__ void pk_stage(const cuda_persist_plan &p, const unsigned *ctr, unsigned target, unsigned sleep_ns,
                         const float *src, float *xs, int n) {
    if (k_tid() == 0) {
        wait_counter_gpu(ctr, target, sleep_ns);
        pk_trace_waited(pk_wait_slot(p));
    }
    __syncthreads();
    for (int i = k_tid(); i < n / 4; i += PK_THREADS) cp_async16(xs + 4 * i, src + 4 * i);
    cp_async_wait_all();
    __syncthreads();
}

// The units' wait in a staged phase: done before them (pk_stage).
struct no_wait {
    __device__ __forceinline__ void operator()() const {}
};

// A ring for a warp's first unit of a phase, none for the rest.
__device__ __forceinline__ mv_ring pk_unit_ring(const mv_ring &r, bool first) {
    return first ? r : mv_ring{ NULL, 0 };
}

// The vector kernels' F when the input is staged: read from shared memory, not L2.
template <int F>
struct pk_staged_f {
    static constexpr int value = (F & ~MV_COHERENT) | MV_SHARED_X;
};

// Whether this block has none of a phase's units (a warp's each, in turn over the grid).
__device__ inline bool pk_idle(int units) { return (int)k_bid() * MV_WARPS >= units; }

// Whether a one-row unit of n_in inputs keeps 8 chunks a lane in flight (a.deep).
__device__ inline bool pk_deep(const pk_args &a, int n_in) { return a.deep && n_in >= 32 * 8 * 8; }

// Whether a phase of this kernel and input length stages its input (a block's wait).
__device__ inline bool pk_stages(const pk_args &a, int kind, int n_in) {
    return kind != MV_SCALAR && n_in <= a.xs_cap;
}

// The KV group a row of Wqkv feeds (rows: q of every head, then k, then v).
__device__ inline int pk_group(const cuda_persist_plan &p, int row) {
    int q_dim = p.n_heads * p.head_dim, kv_dim = p.n_kv * p.head_dim;
    if (row < q_dim) return row / p.head_dim / (p.n_heads / p.n_kv);
    row -= q_dim;
    return (row < kv_dim ? row : row - kv_dim) / p.head_dim;
}

// Lane 0 releases a unit's rows row0.. (per of them, up to n_out), which it stored: to
// rel, or (groups) to the qkv counter of the rows' KV group.
__device__ __forceinline__ void pk_release_rows(const pk_args &a, unsigned *rel, bool groups, int row0, int per,
                                                int n_out) {
    unsigned *c = groups ? rel + (size_t)pk_group(a.p, row0) * PK_CTR_STRIDE : rel;
    red_release_gpu(c, (unsigned)min(per, n_out - row0));
}

// Rows [0, n_out) of one matrix over every warp of the grid: unit u is row u (MV_VEC,
// MV_SCALAR) or rows 4u..4u+3 (MV_VEC4), the graph path's kernel's work of one warp.
// wait() comes once a warp, in its first unit (once its first weights are in flight);
// after each unit lane 0, which stored the rows, releases them: to rel, or (groups) to
// the qkv counter of the rows' KV group. The first unit reads through the ring.
template <int WT, int F, typename Wait>
__device__ void pk_matvec_units(const pk_args &a, int kind, const mv_rows &m, const void *w, int n_in, int n_out,
                                unsigned *rel, bool groups, const mv_ring &ring, const Wait &wait) {
    int lane = k_tid() & 31, per = kind == MV_VEC4 ? 4 : 1;
    int gw = k_bid() * MV_WARPS + (k_tid() >> 5), nw = k_grid() * MV_WARPS;
    int units = (n_out + per - 1) / per;
    for (int u = gw; u < units; u += nw) {
        int row0 = u * per;
        mv_ring r = pk_unit_ring(ring, u == gw);
        if (kind == MV_VEC4) mv_vec4_rows<WT, 1, F>(m, w, n_in, n_out, row0, wait, r);
        else if (kind == MV_VEC) mv_vec_row<WT, 1, F>(m, w, n_in, n_out, row0, wait, r);
        else mv_scalar_row<1>(m, w, WT, n_in, n_out, row0, wait);
        if (lane == 0) pk_release_rows(a, rel, groups, row0, per, n_out);
    }
}

// Half i of a warp's ring slice, of `half` chunks (none without a ring).
__device__ __forceinline__ mv_ring pk_half(const mv_ring &r, int i, int half) {
    return r.s ? mv_ring{ r.s + (size_t)i * half, half } : mv_ring{ NULL, 0 };
}

// The first chunks of a unit's ROWS weight rows (chunk offsets rb) into a ring part,
// asynchronously; the unit reads them as a ready ring once they have landed.
template <int WT, int ROWS>
__device__ __forceinline__ mv_ring_ready pk_prefill(const mv_ring &ring, const void *w, const size_t *rb, int n_in) {
    int n = ring_fill<WT>(ring, w, rb, ROWS, n_in / 8);
    return mv_ring_ready{ ring.s, n };
}

// A staged phase (pk_stages): a warp's units u = gw, gw + nw, ... of `units`, each of
// ROWS weight rows of w. Before the block's wait (pk_stage, which lands them) the warp
// copies its first unit's first chunks into its ring slice; after it, while unit k
// runs, unit k+1's go into the other half of the slice (the whole slice is the first
// unit's when the warp has one, or a.ahead is 0), landed before k+1 runs. So the
// weights of the next unit stream while this one computes, not only across the phase
// boundary. Unit has bases(u, rb), its rows' chunk offsets, and run(u, ring): the
// unit, its release, and the packed argmax key it found (0: none). Returns the largest.
template <int WT, int ROWS, typename Unit>
__device__ unsigned long long pk_staged(const pk_args &a, const Unit &unit, int units, const void *w, int n_in,
                                        const unsigned *ready, unsigned target, const float *src) {
    if (pk_idle(units)) return 0;  // no unit in this block: no wait
    mv_ring ring = pk_ring(a);
    int gw = k_bid() * MV_WARPS + (k_tid() >> 5), nw = k_grid() * MV_WARPS;
    bool ahead = a.ahead && gw + nw < units;  // two units or more: two parts
    int half = ahead ? ring.cap / 2 : ring.cap;  // chunks of a part
    int n = 0;  // chunks of each row in a part (the same for every unit)
    size_t rb[4];
    if (gw < units) {
        unit.bases(gw, rb);
        n = pk_prefill<WT, ROWS>(pk_half(ring, 0, half), w, rb, n_in).n;
    }
    pk_stage(a.p, ready, target, a.sleep_ns, src, pk_xs(), n_in);
    unsigned long long best = 0;
    int part = 0;
    for (int u = gw; u < units; u += nw) {
        bool more = ahead && u + nw < units;
        if (more) {  // into the part unit u - nw read, whose values it has used
            unit.bases(u + nw, rb);
            pk_prefill<WT, ROWS>(pk_half(ring, part ^ 1, half), w, rb, n_in);
        }
        // without ahead only the first unit has its chunks in the ring
        mv_ring_ready r = { pk_half(ring, part, half).s, u == gw || ahead ? n : 0 };
        best = max(best, unit.run(u, r));
        if (more) cp_async_wait_all();
        part ^= 1;
    }
    return best;
}

// The staged units of a matvec phase: rows u*ROWS.. of w (MV_VEC: 1, MV_VEC4: 4).
template <int WT, int F, int ROWS>
struct pk_rows_unit {
    const pk_args *a;
    mv_rows m;  // x: the staged input
    const void *w;
    int n_in, n_out;
    unsigned *rel;
    bool groups;
    __device__ __forceinline__ void bases(int u, size_t rb[4]) const {
        if (ROWS == 4) mv_vec4_bases(rb, n_in, n_out, 4 * u);
        else rb[0] = (size_t)u * (n_in / 8);
    }
    __device__ __forceinline__ unsigned long long run(int u, const mv_ring_ready &r) const {
        int row0 = u * ROWS;
        if (ROWS == 4) mv_vec4_rows<WT, 1, F>(m, w, n_in, n_out, row0, no_wait(), r);
        else if (pk_deep(*a, n_in)) mv_vec_row<WT, 1, F, no_wait, mv_ring_ready, 8>(m, w, n_in, n_out, row0, no_wait(), r);
        else mv_vec_row<WT, 1, F>(m, w, n_in, n_out, row0, no_wait(), r);
        if ((k_tid() & 31) == 0) pk_release_rows(*a, rel, groups, row0, ROWS, n_out);
        return 0;
    }
};

// One matvec phase: its units wait for *ready >= target, a block at a time with the
// input (m.x) staged when it fits (pk_stages), else a warp at a time.
template <int WT, int F>
__device__ void pk_matvec(const pk_args &a, int kind, const mv_rows &m, const void *w, int n_in, int n_out,
                          const unsigned *ready, unsigned target, unsigned *rel, bool groups) {
    if (!pk_stages(a, kind, n_in)) {
        bool first = true;
        warp_waiter wait = { ready, target, &first, a.sleep_ns, pk_wait_slot(a.p) };
        pk_matvec_units<WT, F>(a, kind, m, w, n_in, n_out, rel, groups, pk_ring(a), wait);
        return;
    }
    mv_rows ms = m;
    ms.x = pk_xs();
    constexpr int FS = pk_staged_f<F>::value;
    if (kind == MV_VEC4) {
        pk_rows_unit<WT, FS, 4> unit = { &a, ms, w, n_in, n_out, rel, groups };
        pk_staged<WT, 4>(a, unit, (n_out + 3) / 4, w, n_in, ready, target, m.x);
    } else {
        pk_rows_unit<WT, FS, 1> unit = { &a, ms, w, n_in, n_out, rel, groups };
        pk_staged<WT, 1>(a, unit, n_out, w, n_in, ready, target, m.x);
    }
}

// gate|up with SwiGLU: two outputs a warp (the graph path's glu kernel's unit), the
// input staged as pk_matvec's. A matrix the vector kernels cannot take (dim % 8 != 0)
// goes as the graph path's two launches do: gate row j and up row j by the scalar
// kernel into the planar [gate | up] halves of hb, then silu(gate) * up into hb[j], one
// output a warp.
template <int WT, int F, typename Wait>
__device__ void pk_glu_pairs(const pk_args &a, const mv_rows &m, const void *w, unsigned *rel, const mv_ring &ring,
                             const Wait &wait) {
    int lane = k_tid() & 31, hid = a.p.hidden;
    int gw = k_bid() * MV_WARPS + (k_tid() >> 5), nw = k_grid() * MV_WARPS;
    for (int u = gw; u < (hid + 1) / 2; u += nw) {
        mv_glu_pair<WT, 1, F>(m, w, a.p.dim, hid, 2 * u, wait, pk_unit_ring(ring, u == gw));
        if (lane == 0) red_release_gpu(rel, (unsigned)min(2, hid - 2 * u));
    }
}

// The staged units of gate|up: outputs 2u, 2u+1 and their four weight rows.
template <int WT>
struct pk_glu_unit {
    const pk_args *a;
    mv_rows m;  // x: the staged input
    const void *w;
    unsigned *rel;
    __device__ __forceinline__ void bases(int u, size_t rb[4]) const { mv_glu_bases(rb, a->p.dim, a->p.hidden, 2 * u); }
    __device__ __forceinline__ unsigned long long run(int u, const mv_ring_ready &r) const {
        int hid = a->p.hidden;
        mv_glu_pair<WT, 1, MV_NORM | MV_SHARED_X>(m, w, a->p.dim, hid, 2 * u, no_wait(), r);
        if ((k_tid() & 31) == 0) red_release_gpu(rel, (unsigned)min(2, hid - 2 * u));
        return 0;
    }
};

template <int WT>
__device__ void pk_glu(const pk_args &a, const mv_rows &m, const void *w, const unsigned *ready, unsigned *rel) {
    const cuda_persist_plan &p = a.p;
    int lane = k_tid() & 31, hid = p.hidden;
    int gw = k_bid() * MV_WARPS + (k_tid() >> 5), nw = k_grid() * MV_WARPS;
    if (pk_stages(a, a.k_gu, p.dim)) {
        mv_rows ms = m;
        ms.x = pk_xs();
        pk_glu_unit<WT> unit = { &a, ms, w, rel };
        pk_staged<WT, 4>(a, unit, (hid + 1) / 2, w, p.dim, ready, (unsigned)p.dim, m.x);
        return;
    }
    bool first = true;
    warp_waiter wait = { ready, (unsigned)p.dim, &first, a.sleep_ns, pk_wait_slot(p) };
    if (a.k_gu != MV_SCALAR) {
        pk_glu_pairs<WT, MV_NORM | MV_COHERENT>(a, m, w, rel, pk_ring(a), wait);
        return;
    }
    mv_rows gu = m;
    gu.s1 = hid, gu.s2 = 2 * hid;  // planar: gate [hid], then up [hid]
    for (int j = gw; j < hid; j += nw) {
        mv_scalar_row<1>(gu, w, WT, p.dim, 2 * hid, j, wait);
        mv_scalar_row<1>(gu, w, WT, p.dim, 2 * hid, hid + j, wait);
        if (lane == 0) {  // this lane's own two stores
            p.hb[j] = silu_mul(p.hb[j], p.hb[hid + j]);
            red_release_gpu(rel, 1u);
        }
    }
}

// x = the embedding row of the step's token, 256 elements a warp (cuda_embed's values).
__device__ void pk_embed_phase(const cuda_persist_plan &p) {
    int lane = k_tid() & 31, gw = k_bid() * MV_WARPS + (k_tid() >> 5), nw = k_grid() * MV_WARPS;
    size_t row = (size_t)p.ids[0] * p.dim;
    for (int u = gw; u * 256 < p.dim; u += nw) {
        int n = 0;
        for (int e = u * 256 + lane; e < p.dim && e < (u + 1) * 256; e += 32, n++)
            p.x[e] = load_w(p.embed, p.wt, row + e);
        n = warp_sum(n);
        __syncwarp();  // every lane's stores before lane 0's release
        if (lane == 0) {
            __threadfence();
            red_release_gpu(pk_embed(p), (unsigned)n);
        }
    }
}

// Layer l's attention: (KV head, split) units a block, each waiting for its group's qkv
// rows; the block that completes a group's combine releases its G heads.
template <int HD, int MINB>
__device__ void pk_attention(const pk_args &a, int l, float4 *smem4, unsigned *last_s) {
    const cuda_persist_plan &p = a.p;
    const cuda_persist_layer &L = p.layers[l];
    int G = a.group, hd = p.head_dim, q_dim = a.q_dim, kv_dim = p.n_kv * hd;
    // The RoPE fusion's pointers live in shared memory, read where the prologue uses
    // them: held in registers across the units' tile loops, they would be spilled.
    __shared__ rope_fuse rf;
    if (k_tid() == 0) rf = { 1, p.qkv + q_dim, p.qkv + q_dim + kv_dim, p.pos, p.rows, p.rope_tab, L.q_norm, L.k_norm, p.eps };
    __syncthreads();
    cuda_kv_layer kvl = p.kv[(size_t)l * p.kv_stride];
    cuda_kv_lens N = p.lens[0];
    float *scores = l == p.cap ? p.scores : NULL;
    int ns = live_splits(a.n_splits, N.n_keys, a.kps);  // the units the live length needs
    for (int u = k_bid(); u < p.n_kv * ns; u += k_grid()) {
        int kvh = u / ns, split = u - kvh * ns;
        block_waiter wait = { pk_ctr(p, l, kvh), (unsigned)((G + 2) * hd), a.sleep_ns, pk_wait_slot(p) };
        bool combined;
        if constexpr (HD != 0) {
            combined = flash_split<HD, block_waiter, MINB == 4>(a.part, scores, p.qkv, kvl, N, 0, split, kvh,
                                                                a.n_splits, a.kps, p.n_heads, p.n_kv, p.scale, 0,
                                                                a.count, p.att, rf, wait, smem4, last_s);
        } else {
            combined = decode_split(a.part, scores, p.qkv, kvl, N, 0, split, kvh, a.n_splits, a.kps, p.n_heads,
                                    p.n_kv, hd, p.scale, a.tile, 0, a.count, p.att, rf, wait, (float *)smem4, last_s);
        }
        __syncthreads();  // the combine's stores, and the shared memory free for the next unit
        if (combined && k_tid() == 0) {
            __threadfence();
            red_release_gpu(pk_layer(p, l, PK_ATT), (unsigned)G);
        }
    }
}

// The packed argmax key of the rows row0.. (per of them, up to vocab) lane 0 stored.
__device__ __forceinline__ unsigned long long pk_best_of(const cuda_persist_plan &p, int row0, int per) {
    unsigned long long best = 0;
    for (int r = row0; r < row0 + per && r < p.vocab; r++) {
        float v = p.logits[r];  // this lane's own store
        if (v == v) best = max(best, argmax_key(v, r));
    }
    return best;
}

// lm_head rows; lane 0 of each warp keeps its best row and adds it to the packed argmax.
template <int WT, int F, typename Wait>
__device__ void pk_lm_rows(const pk_args &a, const mv_rows &m, const mv_ring &ring, const Wait &wait) {
    const cuda_persist_plan &p = a.p;
    int lane = k_tid() & 31, per = a.k_lm == MV_VEC4 ? 4 : 1;
    int gw = k_bid() * MV_WARPS + (k_tid() >> 5), nw = k_grid() * MV_WARPS;
    unsigned long long best = 0;
    for (int u = gw; u * per < p.vocab; u += nw) {
        int row0 = u * per;
        mv_ring r = pk_unit_ring(ring, u == gw);
        if (a.k_lm == MV_VEC4) mv_vec4_rows<WT, 1, F>(m, p.lm_head, p.dim, p.vocab, row0, wait, r);
        else if (a.k_lm == MV_VEC) mv_vec_row<WT, 1, F>(m, p.lm_head, p.dim, p.vocab, row0, wait, r);
        else mv_scalar_row<1>(m, p.lm_head, WT, p.dim, p.vocab, row0, wait);
        if (lane == 0 && p.argmax) best = max(best, pk_best_of(p, row0, per));
    }
    if (lane == 0 && p.argmax && best) atomicMax(p.argmax, best);
}

// The staged units of the lm_head: rows u*ROWS.. (final norm folded), and their best.
template <int WT, int ROWS>
struct pk_lm_unit {
    const pk_args *a;
    mv_rows m;  // x: the staged input
    __device__ __forceinline__ void bases(int u, size_t rb[4]) const {
        if (ROWS == 4) mv_vec4_bases(rb, a->p.dim, a->p.vocab, 4 * u);
        else rb[0] = (size_t)u * (a->p.dim / 8);
    }
    __device__ __forceinline__ unsigned long long run(int u, const mv_ring_ready &r) const {
        const cuda_persist_plan &p = a->p;
        int row0 = u * ROWS;
        constexpr int F = MV_NORM | MV_SHARED_X;
        if (ROWS == 4) mv_vec4_rows<WT, 1, F>(m, p.lm_head, p.dim, p.vocab, row0, no_wait(), r);
        else mv_vec_row<WT, 1, F>(m, p.lm_head, p.dim, p.vocab, row0, no_wait(), r);
        return (k_tid() & 31) == 0 && p.argmax ? pk_best_of(p, row0, ROWS) : 0ull;
    }
};

template <int WT>
__device__ void pk_lm_head(const pk_args &a) {
    const cuda_persist_plan &p = a.p;
    mv_rows m = { p.logits, p.x, 0, 1, 1, p.vocab, p.vocab, p.final_norm, p.eps, 0, NULL, 1 };
    const unsigned *ready = pk_x_ready(p, p.n_layers);
    if (pk_stages(a, a.k_lm, p.dim)) {
        m.x = pk_xs();
        unsigned long long best;
        if (a.k_lm == MV_VEC4) {
            pk_lm_unit<WT, 4> unit = { &a, m };
            best = pk_staged<WT, 4>(a, unit, (p.vocab + 3) / 4, p.lm_head, p.dim, ready, (unsigned)p.dim, p.x);
        } else {
            pk_lm_unit<WT, 1> unit = { &a, m };
            best = pk_staged<WT, 1>(a, unit, p.vocab, p.lm_head, p.dim, ready, (unsigned)p.dim, p.x);
        }
        if ((k_tid() & 31) == 0 && p.argmax && best) atomicMax(p.argmax, best);
        return;
    }
    bool first = true;
    warp_waiter wait = { ready, (unsigned)p.dim, &first, a.sleep_ns, pk_wait_slot(p) };
    pk_lm_rows<WT, MV_NORM | MV_COHERENT>(a, m, pk_ring(a), wait);
}

// The last block to finish: the greedy draw (as cuda_sample writes it) and every counter
// back to zero for the next launch.
__device__ void pk_finish(const cuda_persist_plan &p) {
    __syncthreads();
    if (k_tid() != 0) return;
    __threadfence();
    if (atomicAdd(pk_done(p), 1u) != k_grid() - 1) return;
    __threadfence();  // every block's argmax and logits, added before its count, are visible
    if (p.draw && p.argmax) {
        unsigned long long key = atomicAdd(p.argmax, 0ull);
        int tok = key ? (int)(0xffffffffu - (unsigned)(key & 0xffffffffu)) : 0;
        sample_out o;
        o.token = tok;
        o.n_kept = 1;
        o.logit = __ldcg(p.logits + tok);
        o.pad_ = 0.f;
        o.entropy = 0.0;
        *p.draw = o;
    }
    size_t n = (size_t)p.n_layers * pk_per_layer(p) + 2;
    for (size_t i = 0; i < n; i++) p.ctr[i * PK_CTR_STRIDE] = 0;
}

// grid: every block co-resident (cooperative launch), block PK_THREADS; MINB blocks an
// SM (__launch_bounds__: 3, the default, leaves 168 registers a thread; 4 leaves 128,
// and the tiled attention then stages its key tiles in shared memory, flash_split's
// STAGED; neither spills inside a loop: docs/cuda.md "Spills").
template <int WT, int HD, int MINB>
__global__ void __launch_bounds__(PK_THREADS, MINB) persist_decode_kernel(pk_args a) {
    __shared__ unsigned last;
    const cuda_persist_plan &p = a.p;
    // The previous launch's argmax is cleared before this block's first release, which
    // every later phase waits for (block 0, warp 0 always has the first embed unit).
    if (k_bid() == 0 && k_tid() == 0 && p.argmax) *p.argmax = 0ull;
    pk_trace_at(p, 0, 0);
    pk_embed_phase(p);
    pk_trace_at(p, 0, 2);
    for (int l = 0; l < p.n_layers; l++) {
        const cuda_persist_layer &L = p.layers[l];
        const unsigned *x_ready = pk_x_ready(p, l);
        mv_rows qkv = { p.qkv, p.x, 0, 1, 1, a.q_dim, a.qkv_dim - p.n_kv * p.head_dim, L.attn_norm, p.eps, 0, L.bqkv, 1 };
        pk_trace_at(p, 1 + 5 * l, 0);
        pk_matvec<WT, MV_NORM | MV_COHERENT>(a, a.k_qkv, qkv, L.wqkv, p.dim, a.qkv_dim, x_ready, (unsigned)p.dim,
                                             pk_ctr(p, l, 0), true);
        pk_trace_at(p, 1 + 5 * l, 2);
        pk_trace_at(p, 2 + 5 * l, 0);
        pk_attention<HD, MINB>(a, l, pk_smem(), &last);
        pk_trace_at(p, 2 + 5 * l, 2);
        mv_rows o = { p.x, p.att, 0, 1, 1, p.dim, p.dim, NULL, 0.f, 1, NULL, 1 };
        pk_trace_at(p, 3 + 5 * l, 0);
        pk_matvec<WT, MV_COHERENT>(a, a.k_o, o, L.wo, a.q_dim, p.dim, pk_layer(p, l, PK_ATT), (unsigned)p.n_heads,
                                   pk_layer(p, l, PK_O), false);
        pk_trace_at(p, 3 + 5 * l, 2);
        mv_rows gu = { p.hb, p.x, 0, 1, 1, p.hidden, p.hidden, L.ffn_norm, p.eps, 0, NULL, 1 };
        pk_trace_at(p, 4 + 5 * l, 0);
        pk_glu<WT>(a, gu, L.w_gu, pk_layer(p, l, PK_O), pk_layer(p, l, PK_GLU));
        pk_trace_at(p, 4 + 5 * l, 2);
        mv_rows down = { p.x, p.hb, 0, 1, 1, p.dim, p.dim, NULL, 0.f, 1, NULL, 1 };
        pk_trace_at(p, 5 + 5 * l, 0);
        pk_matvec<WT, MV_COHERENT>(a, a.k_down, down, L.w_down, p.hidden, p.dim, pk_layer(p, l, PK_GLU),
                                   (unsigned)p.hidden, pk_layer(p, l, PK_DOWN), false);
        pk_trace_at(p, 5 + 5 * l, 2);
    }
    pk_trace_at(p, pk_phases(p) - 1, 0);
    pk_lm_head<WT>(a);
    pk_trace_at(p, pk_phases(p) - 1, 2);
    pk_finish(p);
}

// ---- host -----------------------------------------------------------------------------
extern "C" size_t cuda_persist_counters(const cuda_persist_plan *p) {
    return ((size_t)p->n_layers * pk_per_layer(*p) + 2) * PK_CTR_STRIDE;
}

extern "C" int cuda_persist_trace_phases(const cuda_persist_plan *p) { return pk_phases(*p); }

extern "C" size_t cuda_persist_trace_len(const cuda_persist_plan *p, int grid) {
    return ((size_t)pk_phases(*p) * 3 + 1) * (size_t)grid;
}

typedef void (*pk_kernel)(pk_args);

static int pk_min_blocks(const cuda_persist_plan *p) { return p->min_blocks == 4 ? 4 : 3; }

// The instance for the weight type, head_dim (0: the generic attention split) and blocks
// an SM (p->min_blocks: 4, else 3), and its name (the emulated device's reports).
#define PK_NAMES(WT, MB) "persist_decode_kernel<" WT ", 64, " MB ">", "persist_decode_kernel<" WT ", 128, " MB ">", \
                         "persist_decode_kernel<" WT ", 0, " MB ">"
#define PK_KERNELS(WT, MB) persist_decode_kernel<WT, 64, MB>, persist_decode_kernel<WT, 128, MB>, \
                           persist_decode_kernel<WT, 0, MB>
static pk_kernel pk_pick(const cuda_persist_plan *p, attn_shape s, const char **name) {
    int hd = flash_ok(s) ? s.head_dim : 0;
    static const char *names[12] = { PK_NAMES("WT_BF16", "4"), PK_NAMES("WT_F16", "4"), PK_NAMES("WT_BF16", "3"),
                                     PK_NAMES("WT_F16", "3") };
    static const pk_kernel ks[12] = { PK_KERNELS(WT_BF16, 4), PK_KERNELS(WT_F16, 4), PK_KERNELS(WT_BF16, 3),
                                      PK_KERNELS(WT_F16, 3) };
    int i = (pk_min_blocks(p) == 3 ? 6 : 0) + (p->wt == WT_BF16 ? 0 : 3) + (hd == 64 ? 0 : hd == 128 ? 1 : 2);
    *name = names[i];
    return ks[i];
}

static attn_shape pk_shape(const cuda_persist_plan *p) { return { p->n_heads, p->n_kv, p->head_dim, p->scale }; }

// The attention's dynamic shared memory, rounded up to the ring's 16-byte chunks.
static size_t pk_att_smem(attn_shape s) {
    size_t b = flash_ok(s) ? flash_smem(s.n_heads / s.n_kv_heads, s.head_dim) : decode_smem(s, decode_tile(s));
    return (b + 15) / 16 * 16;
}

// Bytes a block may have of an SM's shared memory at min_blocks blocks an SM (an SM has
// 1 KiB beyond the opt-in a block may ask for, sm_80 and sm_90, and sets 1 KiB aside per
// block), beside the static; never above the opt-in.
static long pk_block_budget(const cuda_ctx *ctx, const cuda_persist_plan *p) {
    long optin = ctx->smem_optin > 0 ? ctx->smem_optin : 48 << 10;
    long b = (optin + 1024) / pk_min_blocks(p) - 1024 - PK_STATIC_SMEM;
    return b < optin - PK_STATIC_SMEM ? b : optin - PK_STATIC_SMEM;
}

// The floats of a phase's input a block stages: the longest input (hidden, for down)
// when it fits the block's share, else the longest but down's; 0 when neither does or
// p->stage is 0. Only a multiple of 8 is staged (the vector kernels' inputs).
static int pk_stage_floats(const cuda_ctx *ctx, const cuda_persist_plan *p) {
    if (!p->stage) return 0;
    int q_dim = p->n_heads * p->head_dim, small = p->dim > q_dim ? p->dim : q_dim;
    int big = small > p->hidden ? small : p->hidden;
    long budget = pk_block_budget(ctx, p);
    if (4L * big <= budget) return big;
    return 4L * small <= budget ? small : 0;
}

// Where the weight ring starts: past the attention's shared memory or the staged input,
// which share the start (a block is in one phase at a time).
static size_t pk_ring_off(attn_shape s, int stage) {
    size_t att = pk_att_smem(s), xs = ((size_t)stage * sizeof(float) + 15) / 16 * 16;
    return att > xs ? att : xs;
}

// The weight ring's bytes a block, a whole number of 16-byte chunks a warp: p->ring when
// set (0: none), else what the block's share leaves past pk_ring_off, in 2 KiB steps;
// never above the opt-in.
static size_t pk_ring_bytes(const cuda_ctx *ctx, const cuda_persist_plan *p, attn_shape s, int stage) {
    long off = (long)pk_ring_off(s, stage), optin = ctx->smem_optin > 0 ? ctx->smem_optin : 48 << 10;
    long want = p->ring;
    if (want < 0) want = (pk_block_budget(ctx, p) - off) / 2048 * 2048;
    if (want > optin - PK_STATIC_SMEM - off) want = optin - PK_STATIC_SMEM - off;
    want = want / (16 * MV_WARPS) * (16 * MV_WARPS);
    return want > 0 ? (size_t)want : 0;
}

// A block's dynamic shared memory: up to the ring's end, or at 4 blocks an SM the tiled
// attention's staged tiles (flash_split's STAGED: 16 KiB past its other parts) where they
// reach further. The tiles may lie over the staged input and the ring: no phase but the
// attention uses shared memory while a block is in it (its first copies go out after
// the block wait that ends the phase before, and the next phase fills the ring after
// its last unit's barrier).
static size_t pk_dyn_smem(const cuda_persist_plan *p, attn_shape s, int stage, size_t ring) {
    size_t end = pk_ring_off(s, stage) + ring;
    if (pk_min_blocks(p) == 4 && flash_ok(s)) {
        size_t st = flash_smem_staged(s.n_heads / s.n_kv_heads, s.head_dim);
        if (st > end) end = st;
    }
    return end;
}

extern "C" int cuda_persist_check(cuda_ctx *ctx, const cuda_persist_plan *p, cuda_persist_fit *fit) {
    attn_shape s = pk_shape(p);
    int q_dim = p->n_heads * p->head_dim;
    CUDA_REQUIRE(ctx, p->wt == WT_BF16 || p->wt == WT_F16, "the weights are not all bf16 or all f16");
    // the norm-folding instances (MV_NORM) of qkv, gate|up and the lm_head read them
    CUDA_REQUIRE(ctx, p->final_norm != NULL, "no final norm weights");
    // four qkv rows a warp must not straddle two KV groups (their counters)
    CUDA_REQUIRE(ctx, p->head_dim % 4 == 0 || mv_kind_rows(ctx, q_dim + 2 * p->n_kv * p->head_dim) != MV_VEC4,
                 "head_dim %d is not a multiple of 4", p->head_dim);
    if (cuda_attention_validate(ctx, s)) return -1;
    int ns = decode_splits(ctx->n_sm, p->max_ctx, s);
    size_t part = (size_t)p->n_heads * ns * (p->head_dim + 2) * sizeof(float);
    CUDA_REQUIRE(ctx, ctx->scratch && ctx->scratch_bytes >= part, "scratch too small for the attention partials");
    CUDA_REQUIRE(ctx, ctx->att_count && ctx->att_count_n >= p->n_kv, "no attention combine counters");
    const char *name;
    pk_kernel k = pk_pick(p, s, &name);
    int stage = pk_stage_floats(ctx, p);
    size_t rb = pk_ring_bytes(ctx, p, s, stage), smem = pk_dyn_smem(p, s, stage, rb);
    if (smem > (48 << 10))  // above the default limit: opted in (the ring)
        CUDA_CHECK(ctx, cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int per_sm = 0;
    CUDA_CHECK(ctx, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, PK_THREADS, smem));
    CUDA_REQUIRE(ctx, per_sm >= 1, "the kernel does not fit an SM (%zu bytes of shared memory)", smem);
    int g = per_sm * (ctx->n_sm > 0 ? ctx->n_sm : 1);
    if (p->grid > 0 && p->grid < g) g = p->grid;
    fit->grid = g;
    fit->ring = (int)rb;
    fit->stage = stage;
    return 0;
}

extern "C" int cuda_decode_persistent(cuda_ctx *ctx, const cuda_persist_plan *p, const cuda_persist_fit *fit) {
    attn_shape s = pk_shape(p);
    pk_args a;
    a.p = *p;
    int q_dim = p->n_heads * p->head_dim, qkv_dim = q_dim + 2 * p->n_kv * p->head_dim;
    // the graph path's kernel of each matrix (weights and buffers are 256-byte aligned,
    // so n_in % 8 decides what mv_kind checks)
    a.q_dim = q_dim;
    a.qkv_dim = qkv_dim;
    a.group = p->n_heads / p->n_kv;
    a.k_qkv = p->dim % 8 ? MV_SCALAR : mv_kind_rows(ctx, qkv_dim);
    a.k_o = q_dim % 8 ? MV_SCALAR : mv_kind_rows(ctx, p->dim);
    a.k_gu = p->dim % 8 ? MV_SCALAR : MV_VEC;
    a.k_down = p->hidden % 8 ? MV_SCALAR : mv_kind_rows(ctx, p->dim);
    a.k_lm = p->dim % 8 ? MV_SCALAR : mv_kind_rows(ctx, p->vocab);
    a.n_splits = decode_splits(ctx->n_sm, p->max_ctx, s);
    a.kps = split_keys(ctx, s);
    a.tile = flash_ok(s) ? 0 : decode_tile(s);
    a.part = (float *)ctx->scratch;
    a.count = ctx->att_count;
    a.ring_off = (int)pk_ring_off(s, fit->stage);
    a.ring_cap = fit->ring / 16 / MV_WARPS;
    a.xs_cap = fit->stage;
    a.ahead = p->ahead != 0;
    a.deep = ctx->mv_deep != 0;
    a.sleep_ns = p->sleep_ns > 0 ? (unsigned)p->sleep_ns : 0u;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeCooperative;
    attr[0].val.cooperative = 1;
    cudaLaunchConfig_t cfg = { dim3(fit->grid), dim3(PK_THREADS), pk_dyn_smem(p, s, fit->stage, (size_t)fit->ring),
                               ctx->stream, attr, 1 };
    const char *name;
    pk_kernel k = pk_pick(p, s, &name);
#ifdef VARENT_EMU_DEVICE
    cudaError_t rc = emu_launch_ex(name, &cfg, k, a);
#else
    cudaError_t rc = cudaLaunchKernelEx(&cfg, k, a);
#endif
    CUDA_CHECK_LAUNCH_RC(ctx, name, rc);
    return 0;
}
