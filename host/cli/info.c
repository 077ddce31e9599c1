// info.c: `varent info -m DIR` prints the parsed config, the parameter count and
// the bytes streamed per decoded token.
#include <stdio.h>

#include "host/cli/args.h"
#include "host/cli/commands.h"
#include "host/cli/common.h"
#include "model/model.h"

static const cli_opt info_opts[] = {
    { "-m|--model", "DIR", "model", NULL, "model directory (config.json, *.safetensors)", 0 },
    { "--tp", "N", "model", NULL, "also print the tensor-parallel plan over N ranks: what each holds and reads "
      "(docs/distributed.md)", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};
static const cli_opt *const info_tables[] = { info_opts, NULL };
const cli_spec cli_info_spec = {
    "info", "-m DIR [--tp N]", "Print a model's parsed config, its parameter count and the bytes read per decoded token.",
    NULL, info_tables, NULL, NULL,
};

static double mib(double bytes) { return bytes / 1048576.0; }

// --tp N: each rank's heads, intermediate columns and vocabulary rows, the bytes it
// reads per token and holds, and what crosses between the ranks per token.
static int print_plan(const model *m, int n, verr *err) {
    const model_config *c = &m->cfg;
    tp_shard s;
    if (tp_shard_plan(c, 0, n, &s, err)) return -1;
    size_t emb = (size_t)c->vocab_size * c->dim * wtype_size(m->embed.type);
    printf("\ntensor parallelism over %d ranks (the embedding table, %.1f MiB, is mapped whole on every rank and read "
           "one row per token)\n", n, mib(emb));
    printf("  rank  query heads   kv heads   intermediate      vocab rows        reads/token   KV/position\n");
    for (int r = 0; r < n; r++) {
        tp_shard_plan(c, r, n, &s, err);
        size_t bytes = model_shard_bytes(m, &s), kv = (size_t)2 * c->n_layers * s.n_kv_heads * c->head_dim * 4;
        printf("  %4d  %5d-%-5d  %4d-%-4d  %6d-%-6d  %7d-%-7d  %8.1f MiB  %7zu B\n", r, s.head0, s.head0 + s.n_heads - 1,
               s.kv_head0, s.kv_head0 + s.n_kv_heads - 1, s.ffn0, s.ffn0 + s.n_ffn - 1, s.vocab0,
               s.vocab0 + s.n_vocab - 1, mib((double)bytes), kv);
    }
    double ar = 2.0 * c->n_layers * c->dim * 4, lg = (double)s.max_vocab * 4 * n;
    printf("per token: 2 all-reduces per layer of %d floats (%.1f KiB in all), a gather of %d x %d logits (%.1f KiB)\n",
           c->dim, ar / 1024, n, s.max_vocab, lg / 1024);
    return 0;
}

int cmd_info(int argc, char **argv) {
    args a;
    int rc0 = args_init(&a, &cli_info_spec, argc, argv);
    if (rc0 >= 0) return rc0;
    const char *dir = args_str(&a, "-m", NULL);
    int tp = (int)args_int_range(&a, "--tp", 0, 1, 4096);
    if (args_finish(&a, 0)) return cli_usage_error("info", "%s", a.err);
    if (!dir) return cli_usage_error("info", "missing -m DIR (the model directory)");
    verr err = { { 0 } };
    model m;
    model_path mp;
    if (model_path_resolve(dir, cli_model_progress(), &mp, &err) || model_load(&m, mp.dir, &err))
        return cli_error("info", "%s", err.msg);
    const model_config *c = &m.cfg;
    tp_shard plan;
    if (tp && tp_shard_plan(c, 0, tp, &plan, &err)) {  // before the block: the error is the answer
        model_free(&m);
        return cli_error("info", "%s", err.msg);
    }
    size_t kv_per_pos = (size_t)2 * c->n_layers * c->n_kv_heads * c->head_dim * sizeof(float);
    printf("model:          %s%s%s\n", dir, mp.gguf ? " -> " : "", mp.gguf ? mp.dir : "");
    printf("architecture:   %s (%s)\n", c->arch_name, config_arch_label(c->arch));
    printf("hidden_size:    %d\nintermediate:   %d\nlayers:         %d\n", c->dim, c->hidden_dim, c->n_layers);
    printf("heads:          %d (kv %d, head_dim %d)\n", c->n_heads, c->n_kv_heads, c->head_dim);
    printf("vocab_size:     %d\nmax_positions:  %d\n", c->vocab_size, c->max_pos);
    printf("rms_norm_eps:   %g\nrope_theta:     %g\n", c->norm_eps, c->rope_theta);
    if (c->rope_llama3)
        printf("rope_scaling:   llama3 (factor %g, low %g, high %g, original %d)\n", c->rope_factor, c->rope_low_freq,
               c->rope_high_freq, c->rope_orig_max_pos);
    else
        printf("rope_scaling:   none\n");
    printf("tied embedding: %s\nq/k/v bias:     %s\nq/k norm:       %s\n", c->tie_embeddings ? "yes" : "no",
           c->attn_bias ? "yes" : "no", c->qk_norm ? "yes" : "no");
    printf("bos:            %d\neos:           ", c->bos_id);
    for (int i = 0; i < c->n_eos; i++) printf(" %d", c->eos_ids[i]);
    printf("\nweights dtype:  %s\n", wtype_name(m.embed.type));
    printf("parameters:     %zu (%.2f M)\n", m.n_params, m.n_params / 1e6);
    printf("bytes/token:    %zu weights (%.1f MiB) + %zu KV per position (fp32 cache)\n", m.weight_bytes,
           m.weight_bytes / 1048576.0, kv_per_pos);
    int rc = tp ? print_plan(&m, tp, &err) : 0;
    model_free(&m);
    return rc ? cli_error("info", "%s", err.msg) : 0;
}
