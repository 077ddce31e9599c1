// lora.c: `varent lora merge BASE ADAPTER OUT [--scale S]`: a PEFT LoRA adapter folded
// into a base model, written as a new HF directory (model/lora_merge.h).
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/cli/args.h"
#include "host/cli/commands.h"
#include "model/lora_merge.h"

static const char usage[] = "usage: varent lora merge BASE_DIR ADAPTER_DIR OUT_DIR [--scale S]";

static int fail(const char *msg) {
    fprintf(stderr, "varent lora: %s\n", msg);
    return 1;
}

// The same directory under two names would have the merge replace its own input.
static int same_dir(const char *a, const char *b) {
    char ra[PATH_MAX], rb[PATH_MAX];
    return realpath(a, ra) && realpath(b, rb) && !strcmp(ra, rb);
}

static int lora_merge_cmd(int argc, char **argv) {
    args a;
    args_init(&a, argc, argv);
    double scale = args_float(&a, "--scale", 1.0);
    if (args_finish(&a, 3)) return fail(a.err);
    const char *base = args_pos(&a, 0), *adapter = args_pos(&a, 1), *out = args_pos(&a, 2);
    if (!out) return fail(usage);
    if (!isfinite(scale)) return fail("--scale must be a finite number");
    if (same_dir(base, out) || same_dir(adapter, out))
        return fail("OUT_DIR must be a new directory, not the base model or the adapter");
    lora_spec spec = { adapter, (float)scale };
    verr err = { { 0 } };
    if (lora_merge(base, &spec, 1, out, &err)) return fail(err.msg);
    fprintf(stderr, "varent lora: merged %s (scale %g) into %s, written to %s\n", adapter, scale, base, out);
    return 0;
}

int cmd_lora(int argc, char **argv) {
    if (argc >= 1 && !strcmp(argv[0], "merge")) return lora_merge_cmd(argc - 1, argv + 1);
    fprintf(stderr, "varent lora: %s%s%s\n%s\n", argc ? "unknown subcommand '" : "missing subcommand",
            argc ? argv[0] : "", argc ? "'" : "", usage);
    return 1;
}
