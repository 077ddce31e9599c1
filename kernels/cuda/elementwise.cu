// elementwise.cu: embedding lookup, residual add, bias, SwiGLU, rotary embedding and
// the bf16 KV-cache store. All memory-bound; one thread per element (or pair).
#include "kernels/cuda/common.cuh"

// ---- embed: out[T, dim] = table[ids[t], :] ---------------------------------------
// grid (cdiv(dim, 256), T)
__global__ void embed_kernel(float *out, const void *table, int wt, const int *ids, int dim) {
    int t = blockIdx.y;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= dim) return;
    size_t row = (size_t)ids[t];
    out[(size_t)t * dim + i] = load_w(table, wt, row * dim + i);
}

extern "C" int cuda_embed(cuda_ctx *ctx, float *out, wref table, const int *ids, int T, int dim) {
    CUDA_REQUIRE(ctx, T >= 0 && T <= 65535 && dim > 0, "cuda_embed: bad shape T=%d dim=%d", T, dim);
    if (T == 0) return 0;
    dim3 grid(cdiv_u(dim, 256), T);
    embed_kernel<<<grid, 256, 0, ctx->stream>>>(out, table.data, (int)table.type, ids, dim);
    CUDA_CHECK_LAUNCH(ctx, "embed_kernel");
    return 0;
}

// ---- add: x[n] += y[n] -------------------------------------------------------------
__global__ void add_kernel(float *x, const float *y, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

extern "C" int cuda_add(cuda_ctx *ctx, float *x, const float *y, size_t n) {
    if (n == 0) return 0;
    add_kernel<<<cdiv_u(n, 256), 256, 0, ctx->stream>>>(x, y, n);
    CUDA_CHECK_LAUNCH(ctx, "add_kernel");
    return 0;
}

// ---- add_scaled: x[n] += s * y[n] (LoRA deltas) ------------------------------------
__global__ void add_scaled_kernel(float *x, const float *y, float s, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __fadd_rn(x[i], __fmul_rn(s, y[i]));
}

extern "C" int cuda_add_scaled(cuda_ctx *ctx, float *x, const float *y, float s, size_t n) {
    if (n == 0) return 0;
    add_scaled_kernel<<<cdiv_u(n, 256), 256, 0, ctx->stream>>>(x, y, s, n);
    CUDA_CHECK_LAUNCH(ctx, "add_scaled_kernel");
    return 0;
}

// ---- add_bias: x[T, n] += b[n] ----------------------------------------------------
__global__ void add_bias_kernel(float *x, const void *b, int bt, int n, size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) x[i] += load_w(b, bt, i % (size_t)n);
}

extern "C" int cuda_add_bias(cuda_ctx *ctx, float *x, wref b, int T, int n) {
    CUDA_REQUIRE(ctx, T >= 0 && n > 0, "cuda_add_bias: bad shape T=%d n=%d", T, n);
    size_t total = (size_t)T * n;
    if (total == 0) return 0;
    add_bias_kernel<<<cdiv_u(total, 256), 256, 0, ctx->stream>>>(x, b.data, (int)b.type, n, total);
    CUDA_CHECK_LAUNCH(ctx, "add_bias_kernel");
    return 0;
}

// ---- swiglu: out[n] = silu(gate[n]) * up[n] ----------------------------------------
__global__ void swiglu_kernel(float *out, const float *gate, const float *up, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = silu_mul(gate[i], up[i]);
}

extern "C" int cuda_swiglu(cuda_ctx *ctx, float *out, const float *gate, const float *up, size_t n) {
    if (n == 0) return 0;
    swiglu_kernel<<<cdiv_u(n, 256), 256, 0, ctx->stream>>>(out, gate, up, n);
    CUDA_CHECK_LAUNCH(ctx, "swiglu_kernel");
    return 0;
}

// ---- rope: in place on x[T, n_heads, head_dim] --------------------------------------
// One thread per rotated pair: T * n_heads * head_dim/2 threads.
// interleaved=0 (HF rotate-half): pair (i, i + hd/2); 1: pair (2i, 2i+1). Both use
// angle pos[t] * inv_freq[i], computed in fp32 like the CPU twin.
__global__ void rope_kernel(float *x, const int *pos, int n_heads, int head_dim,
                            const float *inv_freq, int interleaved, size_t n_pairs) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n_pairs) return;
    int half = head_dim / 2;
    int i = (int)(idx % half);
    size_t th = idx / half;            // t * n_heads + h
    int t = (int)(th / n_heads);
    float *hx = x + th * head_dim;
    float ang = (float)pos[t] * inv_freq[i];
    float s, c;
    sincosf(ang, &s, &c);
    int a = interleaved ? 2 * i : i;
    int b = interleaved ? 2 * i + 1 : i + half;
    float y0, y1;
    rope_rotate(hx[a], hx[b], s, c, y0, y1);
    hx[a] = y0;
    hx[b] = y1;
}

extern "C" int cuda_rope(cuda_ctx *ctx, float *x, const int *pos, int T, int n_heads, int head_dim,
                         const float *inv_freq, int interleaved) {
    CUDA_REQUIRE(ctx, T >= 0 && n_heads > 0 && head_dim > 0 && head_dim % 2 == 0,
                 "cuda_rope: bad shape T=%d n_heads=%d head_dim=%d", T, n_heads, head_dim);
    size_t n_pairs = (size_t)T * n_heads * (head_dim / 2);
    if (n_pairs == 0) return 0;
    rope_kernel<<<cdiv_u(n_pairs, 256), 256, 0, ctx->stream>>>(x, pos, n_heads, head_dim, inv_freq,
                                                               interleaved, n_pairs);
    CUDA_CHECK_LAUNCH(ctx, "rope_kernel");
    return 0;
}

// ---- rope table: (cos, sin) of p * inv_freq[i], [n_pos, half] --------------------------
// The angle and sincosf are rope_kernel's, so the decode kernels that read the table
// rotate with cuda_rope's bits.
__global__ void rope_table_kernel(float2 *tab, const float *inv_freq, int half, size_t n) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n) return;
    int i = (int)(idx % half);
    float ang = (float)(int)(idx / half) * inv_freq[i];
    float s, c;
    sincosf(ang, &s, &c);
    tab[idx] = make_float2(c, s);
}

extern "C" int cuda_rope_table(cuda_ctx *ctx, float *tab, const float *inv_freq, int half, int n_pos) {
    CUDA_REQUIRE(ctx, half > 0 && n_pos >= 0, "cuda_rope_table: bad shape half=%d n_pos=%d", half, n_pos);
    CUDA_REQUIRE(ctx, tab && inv_freq, "cuda_rope_table: no table or inv_freq");
    CUDA_REQUIRE(ctx, is_aligned(tab, 8), "cuda_rope_table: the table is not 8-byte aligned");
    size_t n = (size_t)n_pos * half;
    if (n == 0) return 0;
    rope_table_kernel<<<cdiv_u(n, 256), 256, 0, ctx->stream>>>((float2 *)tab, inv_freq, half, n);
    CUDA_CHECK_LAUNCH(ctx, "rope_table_kernel");
    return 0;
}

// ---- kv_store: bf16 cache rows pos[t] <- fp32 k[t], v[t] ------------------------------
// grid (cdiv(kv_dim, 256), T). With L set, the cache buffers come from the device record
// L[t * L_step] (L_step 0: one record for every token; 1: one per row, batched decode).
__global__ void kv_store_kernel(uint16_t *kc, uint16_t *vc, const cuda_kv_layer *L, int L_step, const float *k,
                                const float *v, const int *pos, int kv_dim) {
    int t = blockIdx.y;
    if (L) {
        kc = (uint16_t *)L[t * L_step].k_dst;
        vc = (uint16_t *)L[t * L_step].v_dst;
    }
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= kv_dim) return;
    size_t dst = (size_t)pos[t] * kv_dim + i, src = (size_t)t * kv_dim + i;
    kc[dst] = f32_to_bf16_bits(k[src]);
    vc[dst] = f32_to_bf16_bits(v[src]);
}

static int kv_store_launch(cuda_ctx *ctx, void *k_cache, void *v_cache, const cuda_kv_layer *L, int L_step,
                           const float *k, const float *v, const int *pos, int T, int kv_dim) {
    CUDA_REQUIRE(ctx, T >= 0 && T <= 65535 && kv_dim > 0, "cuda_kv_store: bad shape T=%d kv_dim=%d",
                 T, kv_dim);
    if (T == 0) return 0;
    dim3 grid(cdiv_u(kv_dim, 256), T);
    kv_store_kernel<<<grid, 256, 0, ctx->stream>>>((uint16_t *)k_cache, (uint16_t *)v_cache, L, L_step, k, v,
                                                   pos, kv_dim);
    CUDA_CHECK_LAUNCH(ctx, "kv_store_kernel");
    return 0;
}

extern "C" int cuda_kv_store(cuda_ctx *ctx, void *k_cache, void *v_cache, const float *k,
                             const float *v, const int *pos, int T, int kv_dim) {
    return kv_store_launch(ctx, k_cache, v_cache, NULL, 0, k, v, pos, T, kv_dim);
}

extern "C" int cuda_kv_store_dev(cuda_ctx *ctx, const cuda_kv_layer *d_layer, const float *k,
                                 const float *v, const int *rows, int T, int kv_dim) {
    CUDA_REQUIRE(ctx, d_layer != NULL, "cuda_kv_store_dev: no device record");
    return kv_store_launch(ctx, NULL, NULL, d_layer, 0, k, v, rows, T, kv_dim);
}

extern "C" int cuda_kv_store_rows(cuda_ctx *ctx, const cuda_kv_layer *d_layers, const float *k, const float *v,
                                  const int *rows, int B, int kv_dim) {
    CUDA_REQUIRE(ctx, d_layers != NULL, "cuda_kv_store_rows: no device records");
    return kv_store_launch(ctx, NULL, NULL, d_layers, 1, k, v, rows, B, kv_dim);
}

// ---- (q/k norm +) rope + kv_store for a decode step: one launch ----------------------
// grid (cdiv(n_heads + n_kv, 8), B), 8 warps per block: one warp per head of a row. A q
// warp rotates its head in place; a k warp rotates its head and stores it as bf16 at
// cache row rows[b] of record L[b], then stores the same head of v. With qn/kn (Qwen3)
// the head is first RMS-normalised with those weights (sum of squares over the warp).
// Per element the math is rope_kernel's: without norms, the same bits as cuda_rope on
// q and k, then cuda_kv_store_rows. k is not written back (the attention reads the cache).
#define RKV_WARPS 8
__global__ void rope_kv_store_kernel(float *q, const float *k, const float *v, const int *pos, const int *rows,
                                     const cuda_kv_layer *L, int n_heads, int n_kv, int hd, const float *tab,
                                     const float *qn, const float *kn, float eps) {
    int b = blockIdx.y, lane = threadIdx.x & 31, half = hd / 2, kv_dim = n_kv * hd;
    int h = blockIdx.x * RKV_WARPS + (threadIdx.x >> 5);
    if (h >= n_heads + n_kv) return;  // whole warp
    bool is_q = h < n_heads;
    int hk = h - n_heads;
    const float *src = is_q ? q + ((size_t)b * n_heads + h) * hd : k + (size_t)b * kv_dim + (size_t)hk * hd;
    const float *nw = is_q ? qn : kn;
    float inv = nw ? head_inv_rms(src, hd, eps) : 1.f;
    size_t dst = (size_t)rows[b] * kv_dim + (size_t)hk * hd;
    for (int j = lane; j < half; j += 32) {
        float y0, y1;
        rope_head_pair(src, j, half, inv, nw, pos[b], tab, y0, y1);
        if (is_q) {
            float *hx = q + ((size_t)b * n_heads + h) * hd;
            hx[j] = y0;
            hx[j + half] = y1;
        } else {
            uint16_t *kc = (uint16_t *)L[b].k_dst + dst;
            kc[j] = f32_to_bf16_bits(y0);
            kc[j + half] = f32_to_bf16_bits(y1);
        }
    }
    if (is_q) return;
    const float *vs = v + (size_t)b * kv_dim + (size_t)hk * hd;
    uint16_t *vc = (uint16_t *)L[b].v_dst + dst;
    for (int j = lane; j < hd; j += 32) vc[j] = f32_to_bf16_bits(vs[j]);
}

extern "C" int cuda_rope_kv_store_rows(cuda_ctx *ctx, float *q, const float *k, const float *v, const int *pos,
                                       const int *rows, const cuda_kv_layer *d_layers, int B, int n_heads, int n_kv,
                                       int head_dim, const float *rope_tab, const float *q_norm, const float *k_norm,
                                       float eps) {
    CUDA_REQUIRE(ctx, B >= 1 && B <= 65535 && n_heads > 0 && n_kv > 0 && head_dim > 0 && head_dim % 2 == 0,
                 "cuda_rope_kv_store_rows: bad shape B=%d n_heads=%d n_kv=%d head_dim=%d", B, n_heads, n_kv,
                 head_dim);
    CUDA_REQUIRE(ctx, d_layers != NULL, "cuda_rope_kv_store_rows: no device records");
    CUDA_REQUIRE(ctx, rope_tab != NULL && is_aligned(rope_tab, 8), "cuda_rope_kv_store_rows: no 8-byte aligned RoPE table");
    CUDA_REQUIRE(ctx, !q_norm == !k_norm, "cuda_rope_kv_store_rows: q_norm and k_norm go together");
    dim3 grid(cdiv_u(n_heads + n_kv, RKV_WARPS), B);
    rope_kv_store_kernel<<<grid, 32 * RKV_WARPS, 0, ctx->stream>>>(q, k, v, pos, rows, d_layers, n_heads, n_kv,
                                                                  head_dim, rope_tab, q_norm, k_norm, eps);
    CUDA_CHECK_LAUNCH(ctx, "rope_kv_store_kernel");
    return 0;
}
