// info.c: `varent info -m DIR` prints the parsed config, the parameter count and
// the bytes streamed per decoded token.
#include <stdio.h>

#include "host/cli/args.h"
#include "host/cli/commands.h"
#include "host/cli/common.h"
#include "model/model.h"

static const cli_opt info_opts[] = {
    { "-m|--model", "DIR", "model", NULL, "model directory (config.json, *.safetensors)", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};
static const cli_opt *const info_tables[] = { info_opts, NULL };
const cli_spec cli_info_spec = {
    "info", "-m DIR", "Print a model's parsed config, its parameter count and the bytes read per decoded token.",
    NULL, info_tables, NULL, NULL,
};

int cmd_info(int argc, char **argv) {
    args a;
    int rc0 = args_init(&a, &cli_info_spec, argc, argv);
    if (rc0 >= 0) return rc0;
    const char *dir = args_str(&a, "-m", NULL);
    if (args_finish(&a, 0)) return cli_usage_error("info", "%s", a.err);
    if (!dir) return cli_usage_error("info", "missing -m DIR (the model directory)");
    verr err = { { 0 } };
    model m;
    model_path mp;
    if (model_path_resolve(dir, cli_model_progress(), &mp, &err) || model_load(&m, mp.dir, &err))
        return cli_error("info", "%s", err.msg);
    const model_config *c = &m.cfg;
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
    model_free(&m);
    return 0;
}
