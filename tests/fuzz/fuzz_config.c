// fuzz_config: config.json parsing (model/config.c). The input is written as
// config.json; the part after a "\n#generation_config.json#\n" line, when present,
// becomes generation_config.json. A config that loads must satisfy the invariants
// the model loader relies on.
#include "tests/fuzz/fuzz_util.h"

#include "model/config.h"

#define GEN_SEP "\n#generation_config.json#\n"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *gen;
    size_t gen_len, n = fuzz_split(data, size, GEN_SEP, &gen, &gen_len);
    fuzz_file("config.json", data, n);
    if (gen) fuzz_file("generation_config.json", gen, gen_len);
    else fuzz_remove("generation_config.json");
    model_config c;
    verr err = {{0}};
    if (config_load(&c, fuzz_dir(), &err) != 0) {
        FUZZ_CHECK(err.msg[0]);
        return 0;
    }
    FUZZ_CHECK(c.dim > 0 && c.hidden_dim > 0 && c.n_layers > 0 && c.vocab_size > 0);
    FUZZ_CHECK(c.n_heads > 0 && c.n_kv_heads > 0 && c.n_heads % c.n_kv_heads == 0);
    FUZZ_CHECK(c.head_dim > 0 && c.head_dim % 2 == 0);
    FUZZ_CHECK(c.n_eos >= 0 && c.n_eos <= CONFIG_MAX_EOS);
    if (c.head_dim <= 1 << 16) {
        float *inv = malloc(sizeof(float) * (size_t)(c.head_dim / 2));
        FUZZ_CHECK(inv);
        config_rope_inv_freq(&c, inv);
        free(inv);
    }
    (void)config_arch_label(c.arch);
    return 0;
}
