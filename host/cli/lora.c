// lora.c: `varent lora merge BASE ADAPTER OUT [--scale S]`: a PEFT LoRA adapter folded
// into a base model, written as a new HF directory (model/lora_merge.h).
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/cli/args.h"
#include "host/cli/commands.h"
#include "model/lora_merge.h"

static int fail(const char *msg) { return cli_error("lora merge", "%s", msg); }

static const cli_opt merge_opts[] = {
    { "--scale", "S", "model", "1", "the adapter's update times S", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};
static const cli_opt *const merge_tables[] = { merge_opts, NULL };
static const cli_spec merge_spec = {
    "lora merge", "BASE_DIR ADAPTER_DIR OUT_DIR [--scale S]",
    "Fold a PEFT LoRA adapter into a base model, written as a new HF model directory.", "Docs: docs/research.md.",
    merge_tables, NULL, NULL,
};
static const cli_opt *const no_tables[] = { NULL };
static const cli_spec *const lora_subs[] = { &merge_spec, NULL };
const cli_spec cli_lora_spec = {
    "lora", "merge ...", "LoRA adapters: merge one into a model (run, chat, serve, ... apply them with --lora).", NULL,
    no_tables, NULL, lora_subs,
};

// The same directory under two names would have the merge replace its own input.
static int same_dir(const char *a, const char *b) {
    char ra[PATH_MAX], rb[PATH_MAX];
    return realpath(a, ra) && realpath(b, rb) && !strcmp(ra, rb);
}

static int lora_merge_cmd(int argc, char **argv) {
    args a;
    int rc0 = args_init(&a, &merge_spec, argc, argv);
    if (rc0 >= 0) return rc0;
    double scale = args_float_range(&a, "--scale", 1.0, -1e30, 1e30);
    if (args_finish(&a, 3)) return cli_usage_error("lora merge", "%s", a.err);
    const char *base = args_pos(&a, 0), *adapter = args_pos(&a, 1), *out = args_pos(&a, 2);
    if (!out) return cli_usage_error("lora merge", "need BASE_DIR, ADAPTER_DIR and OUT_DIR");
    if (same_dir(base, out) || same_dir(adapter, out))
        return cli_usage_error("lora merge", "OUT_DIR must be a new directory, not the base model or the adapter");
    lora_spec spec = { adapter, (float)scale };
    verr err = { { 0 } };
    if (lora_merge(base, &spec, 1, out, &err)) return fail(err.msg);
    fprintf(stderr, "varent lora merge: merged %s (scale %g) into %s, written to %s\n", adapter, scale, base, out);
    return 0;
}

int cmd_lora(int argc, char **argv) {
    if (argc >= 1 && !strcmp(argv[0], "merge")) return lora_merge_cmd(argc - 1, argv + 1);
    args a;
    int rc0 = args_init(&a, &cli_lora_spec, argc, argv);  // --help; anything else is a usage error
    if (rc0 >= 0) return rc0;
    return argc ? cli_usage_error("lora", "unknown subcommand '%s' (varent lora merge ...)", argv[0])
                : cli_usage_error("lora", "missing subcommand: varent lora merge BASE_DIR ADAPTER_DIR OUT_DIR");
}
