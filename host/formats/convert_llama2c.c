// convert_llama2c.c: convert_llama2c (host/formats/convert.h), behind `varent convert llama2c`.
// Reads Karpathy's llama2.c legacy (v0) fp32 checkpoint and writes a normal HF Llama
// directory. llama2.c rotates adjacent pairs (2i, 2i+1); HF rotates halves (i,
// i + hd/2), so the rows of q_proj and k_proj are permuted within each head.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host/formats/convert.h"
#include "host/formats/model_dir.h"
#include "host/formats/st_write.h"
#include "kernels/ops.h"
#include "tokenizer/llama2c_vocab.h"
#include "host/util/fileio.h"

typedef struct {
    int dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
} l2c_config;

typedef struct {
    const char *path;
    FILE *f;
    long offset;
    int bf16;  // output dtype
    st_writer *w;
    verr *err;
    const convert_progress *prog;  // after each tensor; NULL: none
    long done, total;              // tensors read, and all steps (tensors + the write)
} l2c_reader;

static void l2c_report(l2c_reader *r) {
    if (r->prog && r->prog->fn) r->prog->fn(r->prog->ud, r->done, r->total);
}

// Reads rows*cols floats and adds them as an HF tensor; permute_heads > 0 applies
// the interleaved -> rotate-half row permutation for that many heads.
static int add_tensor(l2c_reader *r, const char *name, int rows, int cols, int permute_heads) {
    size_t n = (size_t)(rows ? rows : 1) * cols;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    int rc = 0;
    if (!x || !y) rc = verr_set(r->err, "out of memory reading %s", name);
    else if (fread(x, sizeof *x, n, r->f) != n)
        rc = verr_set(r->err, "%s: truncated at offset %ld while reading %s (%zu floats)", r->path, r->offset, name, n);
    if (rc == 0 && permute_heads > 0) {
        int hd = rows / permute_heads, half = hd / 2;
        for (int h = 0; h < permute_heads; h++)
            for (int i = 0; i < half; i++)
                for (int j = 0; j < 2; j++)
                    memcpy(y + ((size_t)h * hd + j * half + i) * cols, x + ((size_t)h * hd + 2 * i + j) * cols,
                           (size_t)cols * sizeof *x);
        float *t = x; x = y; y = t;
    }
    if (rc == 0) {
        r->offset += (long)(n * sizeof *x);
        int64_t shape[2] = { rows, cols };
        int nd = rows ? 2 : 1;
        const int64_t *sh = rows ? shape : shape + 1;
        if (r->bf16) {
            uint16_t *b = (uint16_t *)y;  // y is free scratch of the right size
            for (size_t i = 0; i < n; i++) b[i] = f32_to_bf16(x[i]);
            rc = st_writer_add(r->w, name, "BF16", sh, nd, b, n * 2, r->err);
        } else {
            rc = st_writer_add(r->w, name, "F32", sh, nd, x, n * 4, r->err);
        }
    }
    free(x), free(y);
    if (rc == 0) {
        r->done++;
        l2c_report(r);
    }
    return rc;
}

// llama2.c stores each kind of weight for all layers contiguously.
static int add_per_layer(l2c_reader *r, const l2c_config *c, const char *fmt, int rows, int cols, int heads) {
    char name[256];
    for (int l = 0; l < c->n_layers; l++) {
        snprintf(name, sizeof name, fmt, l);
        if (add_tensor(r, name, rows, cols, heads)) return -1;
    }
    return 0;
}

static int read_weights(l2c_reader *r, const l2c_config *c, int shared) {
    int hd = c->dim / c->n_heads, kv_dim = c->n_kv_heads * hd;
    if (add_tensor(r, "model.embed_tokens.weight", c->vocab_size, c->dim, 0) ||
        add_per_layer(r, c, "model.layers.%d.input_layernorm.weight", 0, c->dim, 0) ||
        add_per_layer(r, c, "model.layers.%d.self_attn.q_proj.weight", c->dim, c->dim, c->n_heads) ||
        add_per_layer(r, c, "model.layers.%d.self_attn.k_proj.weight", kv_dim, c->dim, c->n_kv_heads) ||
        add_per_layer(r, c, "model.layers.%d.self_attn.v_proj.weight", kv_dim, c->dim, 0) ||
        add_per_layer(r, c, "model.layers.%d.self_attn.o_proj.weight", c->dim, c->dim, 0) ||
        add_per_layer(r, c, "model.layers.%d.post_attention_layernorm.weight", 0, c->dim, 0) ||
        add_per_layer(r, c, "model.layers.%d.mlp.gate_proj.weight", c->hidden_dim, c->dim, 0) ||
        add_per_layer(r, c, "model.layers.%d.mlp.down_proj.weight", c->dim, c->hidden_dim, 0) ||
        add_per_layer(r, c, "model.layers.%d.mlp.up_proj.weight", c->hidden_dim, c->dim, 0) ||
        add_tensor(r, "model.norm.weight", 0, c->dim, 0))
        return -1;
    // The legacy format stores the RoPE tables (seq_len * hd/2 floats, twice); skip them.
    long skip = (long)c->seq_len * (hd / 2) * 2 * (long)sizeof(float);
    struct stat st = { 0 };  // fseek goes past the end without a word: the size says whether they are all there
    if (fstat(fileno(r->f), &st) != 0 || st.st_size - r->offset < skip || fseek(r->f, skip, SEEK_CUR) != 0)
        return verr_set(r->err, "%s: truncated in the RoPE tables: they span offsets %ld..%ld (seq_len %d x %d "
                        "floats, twice) but the file has %lld bytes", r->path, r->offset, r->offset + skip,
                        c->seq_len, hd / 2, (long long)st.st_size);
    r->offset += skip;
    if (!shared && add_tensor(r, "lm_head.weight", c->vocab_size, c->dim, 0)) return -1;
    int extra = fgetc(r->f);
    if (extra != EOF) return verr_set(r->err, "%s: unexpected data after the weights at offset %ld", r->path, r->offset);
    return 0;
}

// config.json into buf (2 KiB is plenty).
static void config_text(const l2c_config *c, int shared, int bf16, char *buf, size_t cap) {
    snprintf(buf, cap,
             "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n"
             "  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n  \"num_hidden_layers\": %d,\n"
             "  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n  \"vocab_size\": %d,\n"
             "  \"max_position_embeddings\": %d,\n  \"rms_norm_eps\": 1e-05,\n  \"rope_theta\": 10000.0,\n"
             "  \"rope_scaling\": null,\n  \"hidden_act\": \"silu\",\n  \"tie_word_embeddings\": %s,\n"
             "  \"attention_bias\": false,\n  \"bos_token_id\": 1,\n  \"eos_token_id\": 2,\n  \"torch_dtype\": \"%s\"\n}\n",
             c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size, c->seq_len,
             shared ? "true" : "false", bf16 ? "bfloat16" : "float32");
}

// llama2.c's stories end with BOS, which its run.c treats as the stop token.
static const char gen_config[] = "{\n  \"bos_token_id\": 1,\n  \"eos_token_id\": [2, 1]\n}\n";

static int read_header(l2c_reader *r, l2c_config *c, int *shared) {
    int h[7];
    if (fread(h, sizeof(int), 7, r->f) != 7) return verr_set(r->err, "%s: too short for a llama2.c header (28 bytes)", r->path);
    r->offset = 28;
    // a negative vocab_size marks unshared weights; INT_MIN has no positive twin
    long long vocab = h[5] < 0 ? -(long long)h[5] : h[5];
    *c = (l2c_config){ h[0], h[1], h[2], h[3], h[4], vocab > 10000000 ? 0 : (int)vocab, h[6] };
    *shared = h[5] > 0;
    if (c->dim <= 0 || c->hidden_dim <= 0 || c->n_layers <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 ||
        c->vocab_size <= 0 || c->seq_len <= 0 || c->dim % c->n_heads || c->n_heads % c->n_kv_heads ||
        (c->dim / c->n_heads) % 2 || c->dim > 65536 || c->n_layers > 1024 || c->vocab_size > 10000000)
        return verr_set(r->err, "%s: implausible llama2.c header (dim %d, hidden %d, layers %d, heads %d/%d, vocab %d, seq %d)",
                        r->path, h[0], h[1], h[2], h[3], h[4], h[5], h[6]);
    return 0;
}

// Everything is read and built in memory first; only then is anything written
// (host/formats/model_dir.h), so a bad checkpoint or tokenizer leaves OUT as it was.
int convert_llama2c(const char *ckpt, const char *tok, const char *out, int bf16, const convert_progress *prog,
                    verr *err) {
    l2c_reader r = { .path = ckpt, .bf16 = bf16, .err = err, .prog = prog };
    r.f = fileio_fopen_input(ckpt, err);
    if (!r.f) return -1;
    l2c_config c = { 0 };
    int shared = 0, rc = read_header(&r, &c, &shared);
    r.w = rc ? NULL : st_writer_new();
    if (rc == 0 && !r.w) rc = verr_set(err, "out of memory");
    r.total = 2 + 9L * c.n_layers + (shared ? 0 : 1) + 1;  // embed, 9 per layer, norm, lm_head, the write
    if (rc == 0) l2c_report(&r);
    if (rc == 0) rc = read_weights(&r, &c, shared);
    fclose(r.f);
    if (rc == 0) rc = st_writer_meta(r.w, "format", "pt", err);
    char *tok_json = NULL, cfg[2048];
    if (rc == 0) rc = llama2c_vocab_build_json(tok, c.vocab_size, &tok_json, err);
    if (rc == 0) {
        config_text(&c, shared, bf16, cfg, sizeof cfg);
        model_dir_file files[] = { { "config.json", cfg }, { "generation_config.json", gen_config },
                                   { "tokenizer.json", tok_json }, { "tokenizer_config.json", llama2c_vocab_config_json() } };
        rc = model_dir_write(out, files, 4, r.w, err);
    }
    if (rc == 0) {
        r.done = r.total;
        l2c_report(&r);
    }
    free(tok_json);
    if (r.w) st_writer_free(r.w);
    return rc;
}
